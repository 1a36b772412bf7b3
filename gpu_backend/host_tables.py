"""A tree plan's index tables built on the host in numpy: the twins of checks.conv_sources, checks.ancestor_mask and
checks.root_paths_of, which build them with torch ops. On a few dozen nodes each torch op costs microseconds of dispatch, and a CUDA-graph
verify builds its tree's tables on the host every step (ddsim.model.graphs.StaticPlan): about 1.3 ms of a 27B
verify's 1.1-1.8 ms host part on an H200's host, under the profiler; these take a sixth to a quarter of the torch
builders' time on a 2-core CPU (benchmarks/host_tables.py). TreePlan takes them for parents on the CPU; on a GPU the
torch ops build the tables in place. Each returns the same integers as its twin (tests/test_host_tables.py).
one_tree and path_conv_sources build one tree's exact-mode tables in one pass over its nodes, what a graph's
StaticPlan refills every step (about half the batch builders' time there); tested against the batch builders."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def conv_sources(src: np.ndarray, W: int) -> np.ndarray:
    """int64 [B, T, W]: checks.conv_sources of source parents src [B, T] (-1 at a root), each node's conv inputs as
    indices into cat(window [W-1], nodes [T]), oldest first; past the root the chain continues into the window."""
    B, T = src.shape
    rows = np.arange(B)[:, None]
    cur = np.broadcast_to(np.arange(T), (B, T)).copy()  # the node at the current lag, or < 0 past the root
    over = np.zeros((B, T), dtype=np.int64)  # steps taken past the root
    cols = [cur + (W - 1)]
    for _ in range(1, W):
        inside = cur >= 0
        nxt = np.where(inside, src[rows, np.maximum(cur, 0)], cur)
        over = np.where(inside & (nxt >= 0), over, over + 1)
        cur = np.where(inside, nxt, cur)
        cols.append(np.where(cur >= 0, cur + (W - 1), (W - 1) - over))
    return np.stack(cols[::-1], axis=-1)


def ancestor_mask(src: np.ndarray) -> tuple[np.ndarray, int]:
    """(int8 [B, T, T] ancestor-or-self mask, max depth): checks.ancestor_mask of source parents src [B, T]."""
    B, T = src.shape
    mask = np.zeros((B, T, T), dtype=np.int8)
    cur = np.broadcast_to(np.arange(T), (B, T)).copy()
    b, t = np.indices((B, T))
    depth = 0
    while True:
        live = cur >= 0
        if not live.any():
            break
        mask[b[live], t[live], cur[live]] = 1
        cur = np.where(live, src[b[:, :1], np.maximum(cur, 0)], cur)
        depth += 1
    return mask, depth - 1


def root_paths(mask: np.ndarray, depth: int) -> np.ndarray:
    """int32 [B, T, depth + 1]: checks.root_paths_of an ancestor-or-self mask [B, T, T] of that max depth: each
    node's ancestors-or-self in node order (root first), -1 padded."""
    T = mask.shape[-1]
    idx = np.arange(T)
    first = np.sort(np.where(mask != 0, idx, idx + T), axis=-1)[..., : depth + 1]  # ancestors sort first
    return np.where(first < T, first, -1).astype(np.int32)


def one_tree(parents: Sequence[int], width: int) -> tuple[np.ndarray, int, np.ndarray]:
    """The exact-mode tables of one validated tree (node 0 the root, every parent an earlier node) in one pass
    over its nodes, for a graph's verify that refills them every step (ddsim.model.graphs.StaticPlan): (int8
    [T, T] ancestor-or-self mask, max depth, int32 [T, width] root paths, root first, padded with -1 to
    ``width`` >= depth + 1). Each equals its batch builder's (ancestor_mask, root_paths of the parents;
    tests/test_host_tables.py)."""
    T = len(parents)
    paths: list[tuple[int, ...]] = [()] * T
    for t, p in enumerate(parents):
        paths[t] = paths[p] + (t,) if p >= 0 else (t,)
    lens = np.fromiter((len(x) for x in paths), np.int64, T)  # depth + 1
    depth = int(lens.max()) - 1
    if width < depth + 1:
        raise ValueError(f"width: {width} columns hold no path of depth {depth}")
    flat = np.fromiter((n for x in paths for n in x), np.int64, int(lens.sum()))  # every path, root first
    rows = np.repeat(np.arange(T), lens)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
    table = np.full((T, width), -1, np.int32)
    table[rows, cols] = flat
    mask = np.zeros((T, T), np.int8)
    mask[rows, flat] = 1
    return mask, depth, table


def path_conv_sources(paths: np.ndarray, W: int) -> np.ndarray:
    """int32 [T, W]: conv_sources of one tree's parents from its root paths [T, width] (one_tree's, -1 padded):
    lag l's input is the path's entry at depth - l, or past the root the window's (W - 1) - (l - depth)."""
    pos = ((paths >= 0).sum(1) - 1)[:, None] - np.arange(W - 1, -1, -1)[None, :]  # [T, W], oldest first
    node = np.take_along_axis(paths, np.maximum(pos, 0), 1)
    return np.where(pos >= 0, node + (W - 1), (W - 1) + pos).astype(np.int32)
