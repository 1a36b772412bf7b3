"""A step's checks on the device in one kernel (twin: device_checks' torch functions slots, rows, accepted, segments
and poisoned, its reference, with triton_tables.checked_tables for the tree): a captured verify or commit then adds one
launch to its kernels', where the torch twins take some forty small ones.

A program per block of 32 nodes of sequence b: its slot checked against the pool and every other live slot, its
buffer row against the buffer and every other row, its accepted node against the tree, the packing's offsets against
B segments of T, its tree (as an engine hands it over, unvalidated) read whole for a node whose parent is not an
earlier node; then, for its block's nodes, the tree's tables written (triton_tables.block_tables, as checked_tables
writes them) and its gates' inputs a, b [32, HV] copied out, NaN if any check failed (a padded row's, slot -1, only
for its buffer row). Every program makes the sequence's checks itself, so none waits on another; the first writes
them out.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import triton_tables
from ddsim.gpu_backend.launch import launch


@triton.jit
def _index(idx, i, o, mo, N):
    """(sequence i's entry of idx [B] as int64, whether it lies in 0..N-1, whether another sequence (o where mo) has
    the same entry): the slots' and the buffer rows' check."""
    x = tl.load(idx + i).to(tl.int64)
    others = tl.load(idx + o, mask=mo, other=-1).to(tl.int64)
    return x, (x >= 0) & (x < N), tl.sum(((others == x) & mo).to(tl.int32), 0) > 0


@triton.jit
def _step_checks_kernel(slots, slots_out, N_POOL, tree, src, anc, paths, tree_bad, depths, rows, rows_out, N_BUF, acc,
                        acc_out, cu, a, a_out, b, b_out, bad_out, B, T, HV, A_SB, A_ST, A_SH, B_SB, B_ST, B_SH,
                        TREE: tl.constexpr, CHAIN: tl.constexpr, FLAGS: tl.constexpr, ROWS: tl.constexpr,
                        ACC: tl.constexpr,
                        CU: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr, BH: tl.constexpr, BT: tl.constexpr,
                        TP: tl.constexpr, LOG: tl.constexpr, BC: tl.constexpr):
    # slots [B] int32/int64 -> slots_out [B] int32 (outside the pool: -1); tree [B, T] int32/int64 (node 0 the root,
    # its entry not read) -> src [B, T] int64, anc [B, T, T] int8, paths [B, T, T] int32, tree_bad [B, NP] int32,
    # depths [B, NP] int32 (as triton_tables.checked_tables writes them; CHAIN instead: a chain's src, anc and paths,
    # by formula; FLAGS instead: tree_bad read, as checked_tables wrote it, and no tree);
    # rows [B] -> rows_out [B] int32 (clamped into the buffer); acc [B] ->
    # acc_out [B] int64 (outside the tree: 0); cu [B + 1]; a, b [B, T, HV] (strided) -> a_out, b_out [B, T, HV]
    # contiguous; bad_out [B] int32. Program (p, i): nodes p BN .. p BN + BN - 1 of sequence i. TP = 2^LOG >= T: the
    # tree in registers; BC: its walks' columns a chunk (triton_tables.walk_sizes).
    p = tl.program_id(0)
    i = tl.program_id(1)
    o = tl.arange(0, BB)
    mo = (o < B) & (o != i)  # every other sequence
    s, inside, shared = _index(slots, i, o, mo, N_POOL)
    live = s != -1
    bad = live & (~inside | shared)
    i64 = i.to(tl.int64)
    t = p * BN + tl.arange(0, BN)
    if TREE:  # the tree read once into registers: its flags (this block's and the whole tree's), walks and depths
        raw, par = triton_tables.tree_vector(tree + i64 * T, T, True, TP)
        wrong = triton_tables.wrong_entries(raw, T, TP)
        mine = wrong & (tl.arange(0, TP) // BN == p)
        tl.store(tree_bad + i64 * tl.num_programs(0) + p, (tl.sum(mine.to(tl.int32), 0) > 0).to(tl.int32))
        bad = bad | (live & (tl.sum(wrong.to(tl.int32), 0) > 0))
        depth = triton_tables.block_tables(par, triton_tables.tree_depths(par, LOG), src + i64 * T, anc + i64 * T * T,
                                           anc, paths + i64 * T * T, anc, t, T, T, 1, True, True, False, True, False,
                                           BN, BC)
        tl.store(depths + i64 * tl.num_programs(0) + p, tl.max(depth, 0))
    if CHAIN:
        triton_tables.chain_tables(src + i64 * T, anc + i64 * T * T, paths + i64 * T * T, t, T, BN, 32)
    if FLAGS:
        NP = tl.num_programs(0)
        for f0 in range(0, NP, BN):
            of = f0 + tl.arange(0, BN)
            flags = tl.load(tree_bad + i64 * NP + of, mask=of < NP, other=0)
            bad = bad | (live & (tl.sum(flags, 0) > 0))
    if ACC:
        c = tl.load(acc + i).to(tl.int64)
        ok = (c >= 0) & (c < T)
        bad = bad | (live & ~ok)
    if CU:
        oc = tl.arange(0, BB)
        mc = oc <= B
        off = tl.load(cu + oc, mask=mc, other=0).to(tl.int64)
        wrong_cu = tl.sum(((off != oc.to(tl.int64) * T) & mc).to(tl.int32), 0) > 0
        bad = bad | (live & wrong_cu)
    if ROWS:
        r, rin, rshared = _index(rows, i, o, mo, N_BUF)
        bad = bad | ~rin | rshared
    if p == 0:
        tl.store(slots_out + i, tl.where(inside, s, -1).to(tl.int32))
        if ACC:
            tl.store(acc_out + i, tl.where(ok, c, 0))
        if ROWS:
            tl.store(rows_out + i, tl.minimum(tl.maximum(r, 0), N_BUF - 1).to(tl.int32))
        tl.store(bad_out + i, bad.to(tl.int32))
    h = tl.arange(0, BH)
    tt = tl.arange(0, BT)
    for t0 in range(0, BN, BT):  # [BT, BH] tiles of this block's nodes: a row's loads at once, not node by node
        tn = p * BN + t0 + tt
        m = (tn < T)[:, None] & (h < HV)[None, :]
        av = tl.load(a + i64 * A_SB + tn[:, None] * A_ST + h[None, :] * A_SH, mask=m)
        bv = tl.load(b + i64 * B_SB + tn[:, None] * B_ST + h[None, :] * B_SH, mask=m)
        out = (i64 * T + tn[:, None]) * HV + h[None, :]
        tl.store(a_out + out, tl.where(bad, float("nan"), av.to(tl.float32)).to(a_out.dtype.element_ty), mask=m)
        tl.store(b_out + out, tl.where(bad, float("nan"), bv.to(tl.float32)).to(b_out.dtype.element_ty), mask=m)


# The step kernel's warps: one program per 32 nodes of a sequence, latency-bound; benchmarks set it
# (profile_captured.py --step-warps). On an H100 (RESULTS.md) building a raw tree's tables, device us a launch at
# 1 x 16: 1 warp 3.6, 2 2.7, 4 2.4, 8 2.5 with the walk in registers (bf5fc5c); at 8 x 65 4 warps 6.8 against 5.3 at
# 8 (e885ff3, 128 columns a chunk). With the walk through memory (30bcb07): 1 warp 5.3 / 9.9 at 1 x 16 / 8 x 65, 2
# 3.9, 4 3.6 / 5.0, 8 3.3 / 4.6.
STEP_WARPS = 8


def step_checks(*, slots: torch.Tensor, N: int, a: torch.Tensor, b: torch.Tensor, tree: torch.Tensor | None = None,
                chain: bool = False, tree_bad: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                N_buf: int = 0, accepted: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                names: dict | None = None):
    """(slots int32 [B], rows int32 [B] or None, accepted int64 [B] or None, a, b [B, T, HV] contiguous, bad int32
    [B], tables) of a step's raw inputs, checked on the device in one launch (device_checks' torch functions are its
    twin): slots [B] of a pool of N rows (-1 padding), a, b [B, T, HV] the gates' inputs, tree [B, T] int32 or int64
    as an engine hands it over (node 0 each tree's root), or chain (the flattened recurrence's chains), or instead
    tree_bad [B, blocks(T)] int32 (checked_tables' flags of trees whose tables are built), rows [B] of a buffer of
    N_buf rows, accepted [B] node indices, cu_seqlens [B + 1] offsets. tables: None without a tree or chain, else
    (src [B, T] int64, anc [B, T, T] int8, paths [B, T, T] int32, bad and depths [B, blocks(T)] int32, or None for
    both for a chain), as triton_tables.checked_tables writes them. An index tensor of another shape or dtype is
    refused in one line, named as ``names`` maps these arguments' names (a caller's own), else as here."""
    B, T, HV = a.shape
    dev = a.device
    # the index tensors as the kernel reads them, element i at offset i: a strided view (an engine's slots taken as
    # every other entry of a wider table) copied first, or its program would read another sequence's entry
    slots, tree, tree_bad, rows, accepted, cu_seqlens = (
        x if x is None else x.contiguous() for x in (slots, tree, tree_bad, rows, accepted, cu_seqlens))
    tensors = [x for x in (slots, b, tree, tree_bad, rows, accepted, cu_seqlens) if x is not None]
    C.check_device(a, *tensors)
    if tuple(b.shape) != (B, T, HV):
        raise ValueError(f"step_checks: b: expected a's shape [B, T, HV] = {(B, T, HV)}, got {tuple(b.shape)}")
    if (tree is not None) + chain + (tree_bad is not None) > 1:
        raise ValueError("step_checks: one of a tree as read, a chain, or a tree's flags")
    # every index tensor's shape and dtype (the host's to check, a capture's too): one read past its end would be
    # another tensor's memory taken as a sequence's slot, row, node or offset
    for name, x, shape, dtypes in (("slots", slots, (B,), (torch.int32, torch.int64)),
                                   ("tree", tree, (B, T), (torch.int32, torch.int64)),
                                   ("tree_bad", tree_bad, (B, triton_tables.blocks(T)), (torch.int32,)),
                                   ("rows", rows, (B,), (torch.int32, torch.int64)),
                                   ("accepted", accepted, (B,), (torch.int32, torch.int64)),
                                   ("cu_seqlens", cu_seqlens, (B + 1,), (torch.int32, torch.int64))):
        if x is not None and (tuple(x.shape) != shape or x.dtype not in dtypes):
            kinds = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(f"{(names or {}).get(name, 'step_checks: ' + name)}: expected {kinds} {list(shape)}, "
                             f"got {x.dtype} {tuple(x.shape)}")
    slots_out = torch.empty(B, dtype=torch.int32, device=dev)
    rows_out = torch.empty(B, dtype=torch.int32, device=dev) if rows is not None else None
    acc_out = torch.empty(B, dtype=torch.int64, device=dev) if accepted is not None else None
    a_out, b_out = torch.empty(B, T, HV, dtype=a.dtype, device=dev), torch.empty(B, T, HV, dtype=b.dtype, device=dev)
    bad = torch.empty(B, dtype=torch.int32, device=dev)
    NP = triton_tables.blocks(T)
    tables = triton_tables.batch_tables(B, T, dev, flags=not chain) if tree is not None or chain else None
    src, anc, paths, flags, depths = tables if tables is not None else (bad, bad, bad, None, None)
    flags = flags if flags is not None else tree_bad if tree_bad is not None else bad
    BH = C.next_pow2(HV, 1)
    launch(_step_checks_kernel, (NP, B), slots=slots, slots_out=slots_out, N_POOL=N,
           tree=tree if tree is not None else slots, src=src, anc=anc, paths=paths, tree_bad=flags,
           depths=depths if depths is not None else bad,
           rows=rows if rows is not None else slots, rows_out=rows_out if rows is not None else slots_out,
           N_BUF=max(N_buf, 1), acc=accepted if accepted is not None else slots,
           acc_out=acc_out if accepted is not None else bad, cu=cu_seqlens if cu_seqlens is not None else slots, a=a,
           a_out=a_out, b=b, b_out=b_out, bad_out=bad, B=B, T=T, HV=HV, A_SB=a.stride(0), A_ST=a.stride(1),
           A_SH=a.stride(2), B_SB=b.stride(0), B_ST=b.stride(1), B_SH=b.stride(2), TREE=tree is not None,
           CHAIN=bool(chain), FLAGS=tree_bad is not None, ROWS=rows is not None, ACC=accepted is not None,
           CU=cu_seqlens is not None, BB=C.next_pow2(B + 1, 2), BN=triton_tables.BN, BH=BH,
           BT=max(1, min(triton_tables.BN, 4096 // BH)), num_warps=STEP_WARPS, **triton_tables.walk_sizes(T, T))
    return slots_out, rows_out, acc_out, a_out, b_out, bad, tables
