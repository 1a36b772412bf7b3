"""The sha256 of a model's tensors as generated (a preset's random weights, 50 GB at full size): what
a report records as the audited weights when no checkpoint was read. Each tensor's bytes are hashed
in 64 MiB pieces by a pool of threads (hashlib lets go of the interpreter lock); a GPU tensor's pieces
come through a pinned host buffer and a CUDA stream of each thread's own, so copies and hashing
overlap across threads (a pageable copy per piece made the full-size digest take ~40 s on an H200)."""
from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

PIECE = 64 << 20  # bytes hashed at a time


class _Staging(threading.local):
    """One pinned host buffer and one CUDA stream per thread and device, made on first use."""

    def get(self, device: torch.device):
        have = self.__dict__.setdefault("by_device", {})
        if device not in have:
            have[device] = (torch.empty(PIECE, dtype=torch.uint8, pin_memory=True), torch.cuda.Stream(device))
        return have[device]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """t's bytes in memory order, [nbytes] uint8 (a copy only where t is not contiguous)."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)


def tensor_sha256(t: torch.Tensor, staging: _Staging | None = None) -> str:
    """sha256 of t's bytes (C order), wherever t lives."""
    h = hashlib.sha256()
    data = _bytes(t)
    if not data.is_cuda:
        for i in range(0, data.numel(), PIECE):
            h.update(memoryview(data[i:i + PIECE].numpy()))
        return h.hexdigest()
    buf, stream = (staging or _Staging()).get(data.device)
    with torch.cuda.stream(stream):
        for i in range(0, data.numel(), PIECE):
            n = min(PIECE, data.numel() - i)
            buf[:n].copy_(data[i:i + n], non_blocking=True)
            stream.synchronize()
            h.update(memoryview(buf[:n].numpy()))
    return h.hexdigest()


def tensors_sha256(weights: dict[str, torch.Tensor], *, threads: int = 16) -> str:
    """sha256 of the lines "name:dtype:shape:sha256 of the tensor's bytes", in name order."""
    names = sorted(weights)
    for device in {weights[n].device for n in names if weights[n].is_cuda}:
        torch.cuda.synchronize(device)  # the side streams read what each device's default stream wrote
    staging = _Staging()
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(names)))) as pool:
        digests = list(pool.map(lambda n: tensor_sha256(weights[n], staging), names))
    h = hashlib.sha256()
    for name, d in zip(names, digests):
        t = weights[name]
        h.update(f"{name}:{str(t.dtype).removeprefix('torch.')}:{tuple(t.shape)}:{d}\n".encode())
    return h.hexdigest()
