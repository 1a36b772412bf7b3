"""Trees' exact-mode index tables built on the device from their parents, in one kernel (twin:
host_tables.one_tree and host_tables.path_conv_sources, which a graph's StaticPlan otherwise builds on the host and
copies in every step): the ancestor-or-self mask (int8, and bool for attention), the root paths (root first, -1
padded), the conv source table and the source parents. A captured verify then copies only the parents.

A program per block of 32 nodes of one tree reads the whole tree's parents once into registers, counts every
node's depth by pointer jumping (register gathers, until every jump is the root or past it), then walks its nodes up
to the root at once, in registers: at j steps up, each node's ancestor sets its mask column, its path's column
depth - j (root first) and its conv window's lag j (past the root the window's own positions). Each output row
belongs to one node, so to one program, which writes the whole row (zeros and -1 padding too) in one store per chunk
of columns: no clearing pass, no barrier between stores, no reversal read back from memory.

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
def tree_vector(parents, T, CHECK: tl.constexpr, TP: tl.constexpr):
    """One tree's parents [T] (any integers), read once into registers: (raw [TP] int64, the entries as read, -1 at
    the root and past T; par [TP] int32, the parents its tables follow: -1 at the root and past T; CHECK: as
    checked_tables reads an unvalidated tree, node 0 the root whatever its entry, another node's parent outside
    0..node-1 read as node - 1)."""
    o = tl.arange(0, TP)
    on = (o > 0) & (o < T)
    raw = tl.load(parents + o, mask=on, other=-1).to(tl.int64)
    if CHECK:
        raw_par = tl.where(on, tl.where((raw >= 0) & (raw < o), raw, o - 1), -1)
    else:  # a validated tree's (a parent past the registers' TP would be a gather out of range: clamped)
        raw_par = tl.minimum(raw, TP - 1)
    return raw, raw_par.to(tl.int32)


@triton.jit
def wrong_entries(raw, T, TP: tl.constexpr):
    """[TP] bool: which of one tree's entries raw (tree_vector's) are not an earlier node (the root's, node 0, is not
    read): what checked_tables flags."""
    o = tl.arange(0, TP)
    return (o > 0) & (o < T) & ((raw < 0) | (raw >= o))


@triton.jit
def _up(x, cur):
    """[BN]: x [TP] at nodes cur (-1 where cur is): one step up a tree whose parents x is, in registers."""
    return tl.where(cur >= 0, tl.gather(x, tl.minimum(tl.maximum(cur, 0), x.shape[0] - 1), 0), -1)


@triton.jit
def tree_depths(par, LOG: tl.constexpr):
    """[TP] int32: every node's depth (the root's 0; 0 past T) of a tree whose parents par [TP] (tree_vector's) are,
    by pointer jumping: after round r each node's jump is its ancestor 2^r steps up (-1 past the root), its distance
    the steps to it (the depth once the jump is the root or past it). The rounds stop once every jump is the root or
    -1: ceil(log2(depth)) of them for a tree that deep (1 for DDTree's trees of depth 2, 2 for depth 3 or 4; a round
    more, on a jump to the root, would add the root's distance, 0), LOG = log2(TP) at most (a chain of TP nodes).
    Stopping at -1 instead took one round more at depth 2: the step kernel 2.64 us against 2.57 at 1 x 16 (H100,
    RESULTS.md)."""
    jump = par
    dist = (par >= 0).to(tl.int32)
    r = tl.full((), 0, tl.int32)
    while (r < LOG) & (tl.max(jump, 0) > 0):
        on = jump >= 0
        at = tl.maximum(jump, 0)
        dist = dist + tl.where(on, tl.gather(dist, at, 0), 0)
        jump = tl.where(on, tl.gather(jump, at, 0), -1)
        r += 1
    return dist


@triton.jit
def block_tables(par, depth_all, src, anc, mask, paths, conv, t, T, WIDTH, W,
                 SRC: tl.constexpr, ANC: tl.constexpr, MASK: tl.constexpr, PATHS: tl.constexpr, CONV: tl.constexpr,
                 BN: tl.constexpr, BC: tl.constexpr):
    """One tree's tables for its nodes t [BN] (those below T), from its parents par and depths depth_all [TP] in
    registers (tree_vector, tree_depths), every pointer at that tree's: src [T] int64; anc, mask [T, T] int8 /
    uint8; paths [T, WIDTH] int32; conv [T, W] int32; each written where its flag is set, every entry of the nodes'
    rows (no clearing first). Returns the nodes' depths [BN] int32 (-1 past T).

    A walk up from every node at once, in registers: step j reaches each node's ancestor j steps up, which sets
    its mask column and its path's column depth - j (root first). Columns go BC at a time; a chunk's walk stops
    where it can reach none of its columns (an ancestor's index, and depth, is below the node's)."""
    mt = t < T
    depth = tl.where(mt, tl.gather(depth_all, tl.where(mt, t, 0), 0), -1)
    if SRC:
        tl.store(src + t, _up(par, tl.where(mt, t, -1)).to(tl.int64), mask=mt)
    start = tl.where(mt, t, -1)
    d_max = tl.max(depth, 0)
    t_max = tl.max(tl.where(mt, t, 0), 0)
    cols = tl.arange(0, BC)
    NC = tl.maximum(T if ANC or MASK else 0, WIDTH if PATHS else 0)
    for c0 in range(0, NC, BC):
        c = c0 + cols
        on_anc = tl.zeros([BN, BC], tl.int1)
        path = tl.full([BN, BC], -1, tl.int32)
        cur = start
        for j in range(0, tl.minimum(d_max, t_max - c0) + 1):  # (none where t_max < c0)
            on_anc = on_anc | (c[None, :] == cur[:, None])
            path = tl.where(c[None, :] == (depth - j)[:, None], cur[:, None], path)
            cur = _up(par, cur)
        off = t[:, None] * T + c[None, :]
        m = mt[:, None] & (c < T)[None, :]
        if ANC:
            tl.store(anc + off, on_anc.to(tl.int8), mask=m)
        if MASK:
            tl.store(mask + off, on_anc.to(tl.uint8), mask=m)
        if PATHS:
            tl.store(paths + t[:, None] * WIDTH + c[None, :], path, mask=mt[:, None] & (c < WIDTH)[None, :])
    if CONV:  # lag j: the ancestor j steps up, past the root the window's own positions
        cur = start
        for j in range(0, W):
            tl.store(conv + t * W + (W - 1 - j), tl.where(cur >= 0, cur + (W - 1), (W - 1) - (j - depth)), mask=mt)
            cur = _up(par, cur)
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
                        BC: tl.constexpr, TP: tl.constexpr, LOG: tl.constexpr):
    # Tree b = program_id(1) of a batch, each table's rows side by side: parents [B, T] (any integers; without CHECK
    # int64, validated: -1 at the root, each parent an earlier node); src [B, T] int64; anc, mask [B, T, T] int8 /
    # uint8; paths [B, T, WIDTH] int32; conv [B, T, W] int32; bad [B, programs along axis 0] int32 (CHECK: 1 where
    # the program's nodes include one whose parent is not an earlier node, else 0); depths [B, programs along axis 0]
    # int32 (DEPTHS: the deepest of the program's nodes' depths). Program p owns nodes p BN .. p BN + BN - 1 of its
    # tree (block_tables); TP = 2^LOG >= T, the tree in registers.
    i_b = tl.program_id(1).to(tl.int64)
    p = tl.program_id(0)
    t = p * BN + tl.arange(0, BN)
    raw, par = tree_vector(parents + i_b * T, T, CHECK, TP)
    if CHECK:
        wrong = wrong_entries(raw, T, TP) & (tl.arange(0, TP) // BN == p)
        tl.store(bad + i_b * tl.num_programs(0) + p, (tl.sum(wrong.to(tl.int32), 0) > 0).to(tl.int32))
    depth = block_tables(par, tree_depths(par, LOG), src + i_b * T, anc + i_b * T * T, mask + i_b * T * T,
                         paths + i_b * T * WIDTH, conv + i_b * T * W, t, T, WIDTH, W, SRC, ANC, MASK, PATHS, CONV,
                         BN, BC)
    if DEPTHS:
        tl.store(depths + i_b * tl.num_programs(0) + p, tl.max(depth, 0))


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
           CONV=conv is not None, CHECK=bad is not None, DEPTHS=depths is not None, BN=BN, num_warps=4,
           **walk_sizes(T, width))


# the most columns a chunk of the walk takes (a walk step's work is the chunk's [32, BC] entries; a chunk's walk ends
# where its columns are out of reach). The step kernel on a raw tree, device us a launch on an H200 (RESULTS.md, one
# lease): 8 x 65 4.24-4.26 at 32 (64: 4.30, 16: 4.48, 128: 5.30), against 4.62-4.63 with the walk in memory (before
# 69cdf4d)
MAX_CHUNK = 32


def walk_sizes(T: int, width: int) -> dict:
    """block_tables' sizes for trees of T nodes and paths ``width`` wide: TP = 2^LOG >= T (the tree in registers)
    and BC, the columns of a chunk."""
    TP = C.next_pow2(T, 1)
    return dict(TP=TP, LOG=TP.bit_length() - 1, BC=min(C.next_pow2(max(T, width), 1), MAX_CHUNK))


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
