"""Devices named on the command line: ``auto``, ``cpu`` or ``cuda[:N]``, checked before any work (CUDA
present, the index existing); for engine kernels on the CPU, Triton's interpreter set up first."""
from __future__ import annotations

import os

import torch

from ddsim.errors import InputError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError(f"--device: {name} requested but no CUDA device is available")
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"--device: {name} does not exist ({torch.cuda.device_count()} CUDA devices)")
        return dev
    raise InputError(f"--device: expected cpu, cuda[:N] or auto, got {name!r}")


def prepare_engine_device(device: str) -> str:
    """The device an engine kernel runs on, as a string: 'cpu' runs Triton kernels in Triton's
    interpreter (set before triton is imported); 'auto' is cuda where there is one."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        from ddsim.engines.triton_interpret import interpreter_turned_off, prepare
        off = interpreter_turned_off()
        if off is not None:  # the engine's kernels would be compiled for a GPU and fail on every CPU tensor
            raise InputError(f"--device cpu: an engine's Triton kernels run on the CPU only in Triton's interpreter, and "
                             f"TRITON_INTERPRET={off!r} turns it off (unset it, or set it to 1)")
        prepare()
        return "cpu"
    if device.startswith("cuda"):
        return str(resolve_device(device))
    raise InputError(f"--device: expected auto, cpu or cuda[:N], got {device!r}")


def audit_allocator() -> None:
    """PyTorch's CUDA allocator for an audit: expandable segments, unless PYTORCH_CUDA_ALLOC_CONF says otherwise (set
    before the allocator's first use). A full-size audit holds the model, a tree's per-node states and the oracle's
    batches within a few GiB of an H200's memory, and with fixed segments its oracle ran out with 23 GiB reserved
    but unallocated (RESULTS.md, 2026-12-03)."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
