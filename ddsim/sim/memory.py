"""GPU memory beside the loop: the footprint of one block of work (its peak allocation over what was
allocated before it), measured by resetting CUDA's peak statistic for the block, and the process's peak
across those resets, which a caller that reads torch.cuda.max_memory_allocated would otherwise lose."""
from __future__ import annotations

import contextlib

import torch

_EARLIER: dict = {}  # device -> the highest peak CUDA's statistic held before a block reset it


def _key(device) -> int:
    d = torch.device(device)
    return torch.cuda.current_device() if d.index is None else d.index


@contextlib.contextmanager
def footprint(device):
    """``with footprint(device) as fp:`` on a CUDA device sets fp["before"] (bytes allocated when the
    block began) and, after it, fp["peak"] (the most allocated during it) and fp["bytes"] (peak - before).
    CUDA's peak statistic is reset for the block; peak_allocated still reports the process's peak."""
    k = _key(device)
    _EARLIER[k] = max(_EARLIER.get(k, 0), torch.cuda.max_memory_allocated(k))
    torch.cuda.reset_peak_memory_stats(k)
    fp = {"before": torch.cuda.memory_allocated(k)}
    yield fp
    fp["peak"] = torch.cuda.max_memory_allocated(k)
    fp["bytes"] = fp["peak"] - fp["before"]


def peak_allocated(device) -> int:
    """The most bytes allocated on a CUDA device since reset_peak (or the process began), across the
    resets of ``footprint``."""
    k = _key(device)
    return max(_EARLIER.get(k, 0), torch.cuda.max_memory_allocated(k))


def reset_peak(device) -> None:
    """Start peak_allocated's window anew (CUDA's peak statistic and the peaks footprint kept)."""
    k = _key(device)
    _EARLIER.pop(k, None)
    torch.cuda.reset_peak_memory_stats(k)
