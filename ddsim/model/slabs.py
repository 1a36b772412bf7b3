"""Per-layer tensors of one shape held in one allocation (a slab, [n, ...], each layer's tensor a view of a row).

A state's layers are values: a commit copies them out of a graph's buffers and the next verify copies them back in.
Copied layer by layer, that is a kernel launch from the host per layer and per tensor (at Qwen3.6-27B a commit made
about 160: 48 recurrent states, 48 conv windows, 16 layers' keys and values gathered and concatenated), which is
most of a graphed commit's time on a slow host. Grouped into slabs, a copy is one launch per group of like layers,
and a state whose layers are already a slab's rows is copied from the slab itself.
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch

# whether like layers share slabs (False: a slab per layer, the layer-by-layer copies). On: on the H200 at Qwen3.6-27B's
# layers a graphed commit took 0.97 ms against 2.94 and a committed state's copy into the graph's buffers 0.43 against
# 2.20 (benchmarks/commit_copies.py, RESULTS.md); tested bit for bit the layer-by-layer copies (tests/test_slabs.py),
# with a commit's operators as many at 8 layers as at 32.
GROUPED = True


def grouped(layers, key: Callable[[int], Hashable]) -> list[list[int]]:
    """``layers`` grouped by ``key(layer)`` (device, dtype, shape: what may share a slab), each group in layer order,
    the groups in the order of their first layer (without GROUPED: each layer alone)."""
    if not GROUPED:
        return [[i] for i in layers]
    groups: dict = {}
    for i in layers:
        groups.setdefault(key(i), []).append(i)
    return list(groups.values())


def like(x: torch.Tensor) -> tuple:
    """The key of a tensor that may share a slab with others: device, dtype and shape."""
    return x.device, x.dtype, tuple(x.shape)


def slab_of(xs: list[torch.Tensor]) -> torch.Tensor | None:
    """A [len(xs), ...] view of the memory xs lie in where they are consecutive contiguous rows of one allocation,
    in order (a slab's ``unbind(0)``), else None."""
    x0 = xs[0]
    if not x0.is_contiguous():
        return None
    row, store = x0.numel() * x0.element_size(), x0.untyped_storage().data_ptr()
    for j, x in enumerate(xs):
        if (x.shape != x0.shape or x.dtype != x0.dtype or x.device != x0.device or not x.is_contiguous()
                or x.untyped_storage().data_ptr() != store or x.data_ptr() != x0.data_ptr() + j * row):
            return None
    return x0.as_strided((len(xs), *x0.shape), (x0.numel(), *x0.stride()), x0.storage_offset())


def stacked(xs: list[torch.Tensor]) -> torch.Tensor:
    """xs as one [len(xs), ...] tensor: their slab itself where they are its rows (no copy), else a stack (a copy)."""
    s = slab_of(xs)
    return s if s is not None else torch.stack(xs)


def pack(xs: list, *, copy: bool = False) -> list[tuple[list[int], torch.Tensor]]:
    """The layers' tensors of ``xs`` (None where a layer has none) as slabs: [(layers, [n, ...] slab)] per group of
    like tensors: a copy (one stack a group) where ``copy`` asks or the group is not one slab's rows already."""
    layers = [i for i, x in enumerate(xs) if x is not None]
    take = (lambda ys: torch.stack(ys)) if copy else stacked
    return [(g, take([xs[i] for i in g])) for g in grouped(layers, lambda i: like(xs[i]))]


def unpack(packed: list[tuple[list[int], torch.Tensor]], n: int, *, copy: bool) -> list:
    """``pack``'s inverse: a list of n layers, each packed layer a row of its slab (of a copy of it, one launch a
    group, with ``copy``), None elsewhere."""
    out = [None] * n
    for g, slab in packed:
        for i, x in zip(g, (slab.clone() if copy else slab).unbind(0)):
            out[i] = x
    return out


def copied(xs: list) -> list:
    """The layers' tensors of ``xs`` (None where a layer has none) copied: like layers into one new slab each (one
    stack a group), every layer a row of it."""
    return unpack(pack(xs, copy=True), len(xs), copy=False)


def load(dst: list, src: list, *, rows: int | None = None) -> None:
    """Copy each layer of ``src`` into ``dst``'s tensor of that layer (its first ``rows`` rows; None: all of it; None
    where dst has no tensor): one copy per group of ``dst`` slabs whose ``src`` layers are one slab too, else one per
    layer."""
    layers = [i for i, x in enumerate(dst) if x is not None]
    for g in grouped(layers, lambda i: like(dst[i])):
        to, frm = slab_of([dst[i] for i in g]), slab_of([src[i] for i in g])
        if to is not None and frm is not None:
            (to if rows is None else to[:, :rows]).copy_(frm, non_blocking=True)
        else:
            for i in g:
                (dst[i] if rows is None else dst[i][:rows]).copy_(src[i], non_blocking=True)


def zeros(n: int, layers, shape: Callable[[int], tuple], *, dtype, device: Callable[[int], torch.device]) -> list:
    """Zeroed buffers for ``layers`` in a list of n layers (None elsewhere), like layers (device, shape) rows of one
    slab each."""
    out = [None] * n
    for g in grouped(layers, lambda i: (device(i), tuple(shape(i)))):
        for i, x in zip(g, torch.zeros((len(g), *shape(g[0])), dtype=dtype, device=device(g[0])).unbind(0)):
            out[i] = x
    return out
