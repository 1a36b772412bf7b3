"""Trees' exact-mode index tables built on the device from their parents, in one kernel (twin:
host_tables.one_tree and host_tables.path_conv_sources, which a graph's StaticPlan otherwise builds on the host and
copies in every step): the ancestor-or-self mask (int8, and bool for attention), the root paths (root first, -1
padded), the conv source table and the source parents. A captured verify then copies only the parents.

A program per block of 32 nodes of one tree walks each of its nodes up to the root twice: first to count its depth,
then to write, at j steps up, its ancestor into the mask row, the path (column depth - j) and the conv table (lag j,
column W - 1 - j; past the root the window's W - 1 - (j - depth)). Every output row belongs to one node, so to one
program, which clears its rows first (a barrier between: the clearing stores land before the scattered ones).

``checked_tables`` takes a batch of trees as an engine hands them over, unvalidated (a CUDA graph cannot stop to check
them on the host): node 0 is each tree's root whatever its entry, and a node whose parent is not an earlier node is
read as the previous node's child, so every walk ends at the root within the tree; the tree is flagged in ``bad``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend.launch import launch


@triton.jit
def _parent(parents, cur, on, CHECK: tl.constexpr):
    """[BN] int64: the parents of nodes cur (-1 where ``on`` is off). CHECK: as checked_tables reads an unvalidated
    tree, node 0 the root whatever its entry, another node's parent outside 0..node-1 read as node - 1."""
    p = tl.load(parents + tl.maximum(cur, 0), mask=on, other=-1).to(tl.int64)
    if CHECK:
        p = tl.where(on & (cur > 0), tl.where((p >= 0) & (p < cur), p, cur - 1), -1)
    return p


@triton.jit
def wrong_parents(parents, t, mt):
    """[BN] bool: which of one tree's nodes t (where mt) have an entry that is not an earlier node (the root's, node
    0, is not read): what checked_tables flags."""
    raw = tl.load(parents + t, mask=mt & (t > 0), other=0).to(tl.int64)
    return mt & (t > 0) & ((raw < 0) | (raw >= t))


@triton.jit
def block_tables(parents, src, anc, mask, paths, conv, t, T, WIDTH, W,
                 SRC: tl.constexpr, ANC: tl.constexpr, MASK: tl.constexpr, PATHS: tl.constexpr, CONV: tl.constexpr,
                 CHECK: tl.constexpr, BN: tl.constexpr, BC: tl.constexpr):
    """One tree's tables for its nodes t [BN] (those below T), every pointer at that tree's: parents [T]; src [T]
    int64; anc, mask [T, T] int8 / uint8; paths [T, WIDTH] int32; conv [T, W] int32; each written where its flag is
    set. The calling program owns these nodes' rows: it clears them, then writes them (a barrier between: its own
    stores only, so no other program's order matters). Returns the nodes' depths [BN] int32 (the root's 0; -1 past
    T)."""
    mt = t < T
    cols = tl.arange(0, BC)
    for c0 in range(0, T, BC):  # clear the mask rows and the paths
        m = mt[:, None] & (c0 + cols < T)[None, :]
        off = t[:, None] * T + c0 + cols[None, :]
        if ANC:
            tl.store(anc + off, tl.zeros([BN, BC], tl.int8), mask=m)
        if MASK:
            tl.store(mask + off, tl.zeros([BN, BC], tl.uint8), mask=m)
    if PATHS:
        for c0 in range(0, WIDTH, BC):
            m = mt[:, None] & (c0 + cols < WIDTH)[None, :]
            tl.store(paths + t[:, None] * WIDTH + c0 + cols[None, :], tl.full([BN, BC], -1, tl.int32), mask=m)
    tl.debug_barrier()
    if SRC:
        tl.store(src + t, _parent(parents, t.to(tl.int64), mt, CHECK), mask=mt)
    # One walk up from every node at once, for as many steps as the block's deepest node takes (not WIDTH): step j
    # reaches each node's ancestor j steps up, written into its mask row, its path leaf first (column j, turned
    # root first below) and its conv window (lag j)
    depth = tl.full([BN], -1, tl.int32)
    cur = tl.where(mt, t, -1).to(tl.int64)
    one = tl.full([BN], 1, tl.int8)
    j = tl.full((), 0, tl.int32)  # the step
    while (j < WIDTH) & (tl.max(cur, 0) >= 0):  # (a deeper tree than the caller checked: WIDTH steps)
        on = cur >= 0
        if ANC:
            tl.store(anc + t * T + cur, one, mask=on)
        if MASK:
            tl.store(mask + t * T + cur, one.to(tl.uint8), mask=on)
        if PATHS:
            tl.store(paths + t * WIDTH + j, cur.to(tl.int32), mask=on)
        if CONV:
            tl.store(conv + t * W + (W - 1 - j), (cur + (W - 1)).to(tl.int32),
                     mask=on & (tl.zeros([BN], tl.int32) + j < W))
        depth += on.to(tl.int32)
        cur = _parent(parents, cur, on, CHECK)
        j += 1
    if PATHS:  # each path's first depth + 1 columns reversed in place: root first. Column c and depth - c (c the
        # smaller) are one element's to swap, so no two elements touch one entry; the walk's stores land first
        tl.debug_barrier()
        for c0 in range(0, (tl.max(depth, 0) + 2) // 2, BC):
            c = c0 + cols
            d = depth[:, None] - c[None, :]
            m = mt[:, None] & (c[None, :] < d)
            lo = tl.load(paths + t[:, None] * WIDTH + c[None, :], mask=m)
            hi = tl.load(paths + t[:, None] * WIDTH + d, mask=m)
            tl.store(paths + t[:, None] * WIDTH + c[None, :], hi, mask=m)
            tl.store(paths + t[:, None] * WIDTH + d, lo, mask=m)
    if CONV:  # lags past the root: the window's own positions
        for jj in range(0, W):
            tl.store(conv + t * W + (W - 1 - jj), ((W - 1) - (jj - depth)).to(tl.int32), mask=mt & (jj > depth))
    return depth


@triton.jit
def chain_tables(src, anc, paths, t, T, BN: tl.constexpr, BC: tl.constexpr):
    """A chain's tables (every node the previous one's child: the flattened recurrence's) for its nodes t [BN] (those
    below T), by formula, every pointer at that chain's: src [T] int64 (t - 1), anc [T, T] int8 (c <= t), paths
    [T, T] int32 (c where c <= t, else -1): what block_tables writes for the chain, without its walk."""
    mt = t < T
    tl.store(src + t, (t - 1).to(tl.int64), mask=mt)
    cols = tl.arange(0, BC)
    for c0 in range(0, T, BC):
        c = c0 + cols
        m = mt[:, None] & (c < T)[None, :]
        on = c[None, :] <= t[:, None]
        tl.store(anc + t[:, None] * T + c[None, :], on.to(tl.int8), mask=m)
        tl.store(paths + t[:, None] * T + c[None, :], tl.where(on, c[None, :], -1).to(tl.int32), mask=m)


@triton.jit
def _tree_tables_kernel(parents, src, anc, mask, paths, conv, bad, depths, T, WIDTH, W,
                        SRC: tl.constexpr, ANC: tl.constexpr, MASK: tl.constexpr, PATHS: tl.constexpr,
                        CONV: tl.constexpr, CHECK: tl.constexpr, DEPTHS: tl.constexpr, BN: tl.constexpr,
                        BC: tl.constexpr):
    # Tree b = program_id(1) of a batch, each table's rows side by side: parents [B, T] (any integers; without CHECK
    # int64, validated: -1 at the root, each parent an earlier node); src [B, T] int64; anc, mask [B, T, T] int8 /
    # uint8; paths [B, T, WIDTH] int32; conv [B, T, W] int32; bad [B, programs along axis 0] int32 (CHECK: 1 where
    # the program's nodes include one whose parent is not an earlier node, else 0); depths [B, programs along axis 0]
    # int32 (DEPTHS: the deepest of the program's nodes' depths). Program p owns nodes p BN .. p BN + BN - 1 of its
    # tree (block_tables).
    i_b = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0) * BN + tl.arange(0, BN)
    if CHECK:
        wrong = wrong_parents(parents + i_b * T, t, t < T)
        tl.store(bad + i_b * tl.num_programs(0) + tl.program_id(0), (tl.sum(wrong.to(tl.int32), 0) > 0).to(tl.int32))
    depth = block_tables(parents + i_b * T, src + i_b * T, anc + i_b * T * T, mask + i_b * T * T,
                         paths + i_b * T * WIDTH, conv + i_b * T * W, t, T, WIDTH, W, SRC, ANC, MASK, PATHS, CONV,
                         CHECK, BN, BC)
    if DEPTHS:
        tl.store(depths + i_b * tl.num_programs(0) + tl.program_id(0), tl.max(depth, 0))


def tree_tables(parents: torch.Tensor, *, width: int, src=None, anc=None, mask=None, paths=None, conv=None) -> None:
    """Fills the tables given, on parents' device, from one tree's parents [T] (int64, validated: -1 at the root
    only, each parent an earlier node; trees at most ``width`` - 1 deep): src [T] int64 (the parents), anc [T, T]
    int8 and mask [T, T] bool (ancestor-or-self), paths [T, width] int32 (root first, -1 padded), conv [T, W] int32
    (host_tables.path_conv_sources' table). No host sync: a CUDA graph captures it."""
    T = parents.numel()
    if parents.dtype != torch.int64 or T < 1 or width < 1:
        raise ValueError(f"parents: expected int64 [T] and width >= 1, got {parents.dtype} {tuple(parents.shape)}, "
                         f"{width}")
    W = conv.numel() // T if conv is not None else 1
    want = dict(src=(torch.int64, T), anc=(torch.int8, T * T), mask=(torch.bool, T * T), paths=(torch.int32, T * width),
                conv=(torch.int32, T * W))
    given = {k: v for k, v in dict(src=src, anc=anc, mask=mask, paths=paths, conv=conv).items() if v is not None}
    for k, v in given.items():
        if (v.dtype, v.numel()) != want[k] or not v.is_contiguous() or (k == "conv" and W < 1):
            raise ValueError(f"{k}: expected a contiguous {want[k][0]} table of {want[k][1]} entries, got {v.dtype} "
                             f"{tuple(v.shape)}")
    C.check_device(parents, *given.values())
    _launch(parents.reshape(1, T), width, W, src=src, anc=anc, mask=mask, paths=paths, conv=conv, bad=None)


BN = 32  # nodes a program


def blocks(T: int) -> int:
    """The programs over one tree of T nodes (checked_tables' flags a tree)."""
    return C.cdiv(T, BN)


def _launch(parents, width: int, W: int, *, src, anc, mask, paths, conv, bad, depths=None) -> None:
    """The kernel over parents [B, T], its tables' flags from those given (bad given: CHECK)."""
    B, T = parents.shape
    dummy = parents
    launch(_tree_tables_kernel, (blocks(T), B), parents=parents, src=src if src is not None else dummy,
           anc=anc if anc is not None else dummy, mask=mask.view(torch.uint8) if mask is not None else dummy,
           paths=paths if paths is not None else dummy, conv=conv if conv is not None else dummy,
           bad=bad if bad is not None else dummy, depths=depths if depths is not None else dummy, T=T, WIDTH=width,
           W=W, SRC=src is not None, ANC=anc is not None, MASK=mask is not None, PATHS=paths is not None,
           CONV=conv is not None, CHECK=bad is not None, DEPTHS=depths is not None, BN=BN, BC=32, num_warps=4)


def batch_tables(B: int, T: int, device, flags: bool = True) -> tuple:
    """Fresh (src [B, T] int64, anc [B, T, T] int8, paths [B, T, T] int32, bad [B, blocks(T)] int32 and depths
    [B, blocks(T)] int32, or None for both without ``flags``): the tables checked_tables, and the step kernel
    (triton_checks.step_checks), write."""
    def block_table():
        return torch.empty(B, blocks(T), dtype=torch.int32, device=device) if flags else None
    return (torch.empty(B, T, dtype=torch.int64, device=device), torch.empty(B, T, T, dtype=torch.int8, device=device),
            torch.empty(B, T, T, dtype=torch.int32, device=device), block_table(), block_table())


def checked_tables(parents: torch.Tensor, *, src: torch.Tensor, anc: torch.Tensor, paths: torch.Tensor,
                   bad: torch.Tensor, depths: torch.Tensor | None = None) -> None:
    """A batch of unvalidated trees' exact tables, with no host sync (a CUDA graph captures it): parents [B, T]
    int32 or int64 as an engine hands them over (node 0 each tree's root, its entry not read) -> src [B, T] int64
    (the parents read, -1 at the root), anc [B, T, T] int8 (ancestor-or-self), paths [B, T, T] int32 (root first, -1
    padded: any tree of T nodes fits), bad [B, cdiv(T, 32)] int32 (its blocks of 32 nodes: 1 where one has a
    parent that is not an earlier node, else 0; ``blocks(T)`` columns), and where given depths [B, cdiv(T, 32)] int32
    (each block's deepest node's depth, the root's 0: the WY kernels' doubling rounds, triton_helpers.tree_depth).
    Such a node is read as the previous node's child, so the tables (the depths too) are a tree's and every walk ends
    at the root; the caller fails that sequence closed."""
    if parents.dim() != 2 or parents.dtype not in (torch.int32, torch.int64) or parents.shape[1] < 1:
        raise ValueError(f"parents: expected int32 or int64 [B, T >= 1], got {parents.dtype} {tuple(parents.shape)}")
    B, T = parents.shape
    want = dict(src=(torch.int64, (B, T)), anc=(torch.int8, (B, T, T)), paths=(torch.int32, (B, T, T)),
                bad=(torch.int32, (B, blocks(T))), depths=(torch.int32, (B, blocks(T))))
    given = {k: v for k, v in dict(src=src, anc=anc, paths=paths, bad=bad, depths=depths).items()
             if v is not None or k != "depths"}
    for k, v in given.items():
        if (v.dtype, tuple(v.shape)) != want[k] or not v.is_contiguous():
            raise ValueError(f"{k}: expected a contiguous {want[k][0]} {list(want[k][1])}, got {v.dtype} "
                             f"{tuple(v.shape)}")
    C.check_device(parents, *given.values())
    _launch(parents.contiguous(), T, 1, src=src, anc=anc, mask=None, paths=paths, conv=None, bad=bad, depths=depths)
