"""Wall-time accounting: the audit's phases and the parts of a generation's step, added up in a dict
that benchmarks/audit_full_size.py prints."""
from __future__ import annotations

import contextlib
import time

import torch


@contextlib.contextmanager
def timed(timings: dict | None, name: str, device: torch.device):
    """``with timed(timings, name, device):`` adds the block's wall seconds to timings[name]; on a GPU
    the device is synchronised before and after, so the kernels the block queued are its own.
    Nothing is measured (and nothing synchronised) when timings is None."""
    if timings is None:
        yield
        return
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda d: None)
    sync(device)
    t = time.perf_counter()
    yield
    sync(device)
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - t
