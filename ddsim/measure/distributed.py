"""Audits sharded over processes with PyTorch's own distributed stack (launched by torchrun):

    torchrun --nproc-per-node N -m ddsim.cli audit [audit options]

Each rank holds a model copy (on CUDA, the GPU of its LOCAL_RANK), audits the prompts i with
i % N == rank, and rank 0 gathers every prompt's records and assembles the one report.json in prompt
order, exactly as one process would (leak tables are pooled in the same order), so the report
equals the single-process report for the same seed apart from its time stamp, environment and
wall-clock figures. Backends: gloo on the CPU, NCCL on CUDA. Without torchrun (no WORLD_SIZE, or 1)
nothing here touches torch.distributed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ddsim.errors import InputError


def _to_cpu(x):
    """Records with any tensor moved to the CPU, for gather_object."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    return x


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int
    distributed: bool

    @classmethod
    def single(cls) -> "Shard":
        return cls(0, 1, False)

    @classmethod
    def from_env(cls, device: str) -> "Shard":
        """The shard torchrun launched this process as (WORLD_SIZE, RANK, LOCAL_RANK), its process
        group initialised; one process without torchrun."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls.single()
        import torch.distributed as dist
        cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        if cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if local >= torch.cuda.device_count():
                raise InputError(f"torchrun: LOCAL_RANK {local} but {torch.cuda.device_count()} CUDA devices")
            torch.cuda.set_device(local)  # "cuda" now means this rank's GPU
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), True)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def run(self, fn, n: int):
        """[fn(0), ..., fn(n-1)] on rank 0 (None on the others), each i computed on rank i % world.
        An error on any rank fails rank 0 too, after every rank has reported (no rank waits forever)."""
        return self.run_group(lambda idx: [fn(i) for i in idx], n)

    def run_group(self, fn, n: int):
        """``run`` for a function of a whole share: fn([i, ...]) -> [result of i, ...] is called once
        with this rank's indices (i % world == rank), so its items can be computed together."""
        if not self.distributed:
            return fn(list(range(n)))
        import torch.distributed as dist
        mine, err = {}, None
        try:
            idx = list(range(self.rank, n, self.world))
            for i, r in zip(idx, fn(idx), strict=True):
                mine[i] = _to_cpu(r)
        except InputError as e:
            err = ("input", str(e))
        except Exception as e:  # reported to rank 0, then raised here as well
            err = ("internal", f"rank {self.rank}: {type(e).__name__}: {e}")
        gathered = [None] * self.world if self.is_main else None
        dist.gather_object((mine, err), gathered, dst=0)
        if err is not None:
            raise (InputError if err[0] == "input" else RuntimeError)(err[1])
        if not self.is_main:
            return None
        errors = [e for _, e in gathered if e is not None]
        if errors:
            kind, msg = errors[0]
            raise (InputError if kind == "input" else RuntimeError)(msg)
        merged = {}
        for part, _ in gathered:
            merged.update(part)
        return [merged[i] for i in range(n)]

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist
            dist.destroy_process_group()
