"""Triton kernels for lightning-attention (MiniMax) tree verification and commit, and their launchers (twins:
oracle.lightning_tree_verify, oracle.lightning_tree_commit; reference beside them: torch_lightning).

recurrent   one program per (sequence, head, V tile) keeps S [K, BV] in registers and steps over the nodes in index
            order: S_t = lambda_h S_src + k_t v_t^T, o_t = S_t^T q_t (no normalisation, no scale: MiniMax's linear
            attention). mode "leaky": S carries from node t-1 (the flattened path), per-node states optional.
            mode "exact": parent-indexed, each node reloads its parent's state from the per-node state buffer, so
            those states are always written.
masked      mode "exact" without per-node states: there is no delta rule, so along node t's root path (t at depth
            d_t) the state is S_t = lambda^(d_t + 1) S0 + sum_{j on the path} lambda^(d_t - d_j) k_j v_j^T and
              o_t = lambda^(d_t + 1) S0^T q_t + sum_{j on the path} lambda^(d_t - d_j) (q_t . k_j) v_j,
            tree-masked decayed linear attention. One program per (sequence, head, V tile) computes every node from
            its root path alone (no node waits for another), reading the path in chunks of BD from the node back
            (the powers lambda^(d_t - d_j) <= 1 from suffix counts: nothing overflows); no per-node state is written.
commit      the state after the accepted root path (triton_commit's design): the committed state read once, the
            path's steps, the result written once into a new [B, H, K, V].
The committed state [B, H, K, V] fp32 is read, never written; inputs bf16 / fp16 / fp32; the decay [H] is read in
fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import checks
from ddsim.gpu_backend import triton_helpers as h
from ddsim.gpu_backend.launch import bind
from ddsim.gpu_backend.triton_commit import checked_accepted_paths


@triton.jit
def _lightning_step(S, b_k, b_v, lam):
    """S [BK, BV] <- lambda S + k v^T."""
    return lam * S + b_k[:, None] * b_v[None, :]


@triton.jit
def _lightning_recurrent_kernel(
    q, k, v, decay,  # [B, T, H, K] x2, [B, T, H, V], [H] lambda per head
    src,  # [B, T] int32: source node of each node's state (-1: the committed state)
    state,  # [B, H, K, V] fp32 committed states
    o, snap,  # [B, T, H, V] out; [B, T, H, K, V] fp32 per-node states (or a dummy)
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PARENT_INDEXED: tl.constexpr, STORE_STATES: tl.constexpr,
):
    i_v, i_b, i_h, _ = h.head_coords(H, H)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    mkv = mk[:, None] & mv[None, :]
    lam = tl.load(decay + i_h).to(tl.float32)
    s0 = tl.load(h.state_ptrs(state, i_b, i_h, o_k, o_v, H, K, V, False), mask=mkv, other=0.0)
    S = s0
    for t in range(0, T):
        row = i_b * T + t
        if PARENT_INDEXED:
            S = h.source_state(snap, src, row, i_b * T, s0, i_h, o_k, o_v, mkv, H, K, V, False)
        b_q = h.load_rows(q, row, i_h, o_k, mk, H, K, False, 0, H * K)
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, False, 0, H * K)
        b_v = h.load_rows(v, row, i_h, o_v, mv, H, V, False, 0, H * V)
        S = _lightning_step(S, b_k, b_v, lam)
        b_o = tl.sum(S * b_q[:, None], 0)
        tl.store(o + (row * H + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)
        if STORE_STATES:
            h.store_state(snap, row, S, i_h, o_k, o_v, mkv, H, K, V, PARENT_INDEXED, False)


@triton.jit
def _lightning_masked_kernel(
    q, k, v, decay,  # [B, T, H, K] x2, [B, T, H, V], [H] lambda per head
    paths,  # [B, T, DMAX] int32: each node's root path (root first, the node last, -1 padded)
    state,  # [B, H, K, V] fp32 committed states
    o,  # [B, T, H, V] out
    T, DMAX,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr,
):
    i_v, i_b, i_h, _ = h.head_coords(H, H)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    ln_lam = tl.log(tl.load(decay + i_h).to(tl.float32))
    S0 = tl.load(h.state_ptrs(state, i_b, i_h, o_k, o_v, H, K, V, False), mask=mk[:, None] & mv[None, :], other=0.0)
    o_d = tl.arange(0, BD)
    n_chunks = tl.cdiv(DMAX, BD)
    for t in range(0, T):
        row = i_b * T + t
        b_q = h.load_rows(q, row, i_h, o_k, mk, H, K, False, 0, H * K)  # [BK]
        acc = tl.zeros([BV], dtype=tl.float32)  # sum_j lambda^(d_t - d_j) (q_t . k_j) v_j
        run = 0.0  # path entries after the current chunk
        for c in range(0, n_chunks):
            anc, valid, _strict = h.path_chunk(paths, row, t, c, n_chunks, DMAX, o_d, BD)  # [BD] the last chunk first
            cnt = tl.sum(valid.to(tl.float32), 0)
            after = run + cnt - tl.cumsum(valid.to(tl.float32), 0)  # [BD] d_t - d_j on the path
            run += cnt
            arow = i_b * T + tl.maximum(anc, 0)
            Ka = h.load_rows(k, arow[:, None], i_h, o_k[None, :], valid[:, None] & mk[None, :], H, K, False, 1, H * K)
            Va = h.load_rows(v, arow[:, None], i_h, o_v[None, :], valid[:, None] & mv[None, :], H, V, False, 1, H * V)
            w = tl.where(valid, tl.exp(after * ln_lam) * tl.sum(Ka * b_q[None, :], 1), 0.0)  # [BD]
            acc += tl.sum(w[:, None] * Va, 0)
        b_o = tl.exp(run * ln_lam) * tl.sum(S0 * b_q[:, None], 0) + acc  # run = d_t + 1
        tl.store(o + (row * H + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)


DESIGNS = ("auto", "recurrent", "masked")


def lightning_tree_verify(q, k, v, *, decay, parents, initial_state, mode="exact", output_states=False,
                          design: str = "auto", block_v: int = 32, num_warps: int = 4, poison: bool | None = None):
    """q, k [B, T, H, K]; v [B, T, H, V]; decay [H]; parents [B, T] or a TreePlan; initial_state [B, H, K, V] fp32
    (read, never written). Returns o [B, T, H, V] in q's dtype and, with output_states, the state after each node
    [B, T, H, K, V] fp32. The masked form applies to mode "exact" without per-node states; elsewhere every design
    runs the recurrence. design "auto" = "masked": the masked form wherever it applies (the recurrence would write
    every node's state, B T H K V fp32: 2.2 GB at 8 x 65 of MiniMax's heads); "recurrent": never."""
    if design not in DESIGNS:
        raise ValueError(f"design: expected one of {DESIGNS}, got {design!r}")
    if design != "recurrent" and mode == "exact" and not output_states:
        launch, result = plan_masked(q, k, v, decay=decay, parents=parents, initial_state=initial_state,
                                     block_v=block_v, num_warps=num_warps, poison=poison)
    else:
        launch, result = plan_recurrent(q, k, v, decay=decay, parents=parents, initial_state=initial_state, mode=mode,
                                        output_states=output_states, block_v=block_v, num_warps=num_warps,
                                        poison=poison)
    launch()
    return result


def plan_masked(q, k, v, *, decay, parents, initial_state, block_v: int = 32, block_d: int | None = None,
                num_warps: int = 4, poison: bool | None = None):
    """The exact verify in the masked form: validate, take the root paths (a TreePlan's cached table, else one
    built here) and allocate once; returns (launch, o). block_d: root-path positions read per chunk (default 8 for
    trees up to 8 deep, else 16)."""
    B, T, H, K, V = _check(q, k, v, decay, initial_state)
    paths = checks.root_paths(parents, B, T, q.device)  # [B, T, DMAX]
    block_d = block_d or (8 if paths.shape[2] <= 8 else 16)
    o = C.alloc((B, T, H, V), q.dtype, q.device, poison)
    BK, BV = C.next_pow2(K, 1), min(block_v, C.next_pow2(V, 1))
    kw = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), decay=decay.contiguous(), paths=paths,
              state=initial_state.contiguous(), o=o, T=T, DMAX=paths.shape[2], H=H, K=K, V=V, BK=BK, BV=BV,
              BD=block_d, num_warps=num_warps)
    return bind(_lightning_masked_kernel, (C.cdiv(V, BV), B * H), kw), o


def _check(q, k, v, decay, initial_state):
    """The shapes (B, T, H, K, V), the state fp32, every tensor on one device that Triton can launch on."""
    B, T, H, K, V = checks.check_lightning(q, k, v, decay, initial_state)
    checks.fp32_state(initial_state, "lightning")
    C.check_device(k)  # a device Triton launches on (check_lightning put every tensor on k's)
    return B, T, H, K, V


def plan_recurrent(q, k, v, *, decay, parents, initial_state, mode="exact", output_states=False,
                   block_v: int = 32, num_warps: int = 4, poison: bool | None = None):
    """Validate and allocate once; returns (launch, result): launch() runs the kernel alone (what a benchmark
    times)."""
    B, T, H, K, V = _check(q, k, v, decay, initial_state)
    src = checks.source_parents(parents, B, T, q.device, mode)
    parent_indexed = mode == "exact"
    store = output_states or parent_indexed
    o = C.alloc((B, T, H, V), q.dtype, q.device, poison)
    snap = C.alloc((B, T, H, K, V), torch.float32, q.device, poison) if store else checks.constant("dummy", 1, q.device)
    BK, BV = C.next_pow2(K, 1), min(block_v, C.next_pow2(V, 1))
    kw = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), decay=decay.contiguous(),
              src=src.to(torch.int32).contiguous(), state=initial_state.contiguous(), o=o, snap=snap, T=T, H=H, K=K,
              V=V, BK=BK, BV=BV, PARENT_INDEXED=parent_indexed, STORE_STATES=store, num_warps=num_warps,
              **C.ONE_ARITHMETIC)
    return bind(_lightning_recurrent_kernel, (C.cdiv(V, BV), B * H), kw), ((o, snap) if output_states else o)


@triton.jit
def _lightning_commit_kernel(
    k, v, decay,  # [B, T, H, K], [B, T, H, V], [H]
    paths, acc,  # [B, TP, DMAX] int32 root paths (root first, -1 padded); [B] int64: each sequence's row
    state, out,  # [B, H, K, V] fp32: the committed states (read), the new ones (written)
    T, TP, DMAX,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_v, i_b, i_h, _ = h.head_coords(H, H)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    mkv = mk[:, None] & mv[None, :]
    lam = tl.load(decay + i_h).to(tl.float32)
    S = tl.load(h.state_ptrs(state, i_b, i_h, o_k, o_v, H, K, V, False), mask=mkv, other=0.0)
    path = paths + (i_b * TP + tl.load(acc + i_b)) * DMAX  # the accepted node's root path
    for d in range(0, DMAX):
        n = tl.load(path + d)
        row = (i_b * T + tl.maximum(n, 0)).to(tl.int64)
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, False, 0, H * K)
        b_v = h.load_rows(v, row, i_h, o_v, mv, H, V, False, 0, H * V)
        S = tl.where(n >= 0, _lightning_step(S, b_k, b_v, lam), S)
    tl.store(h.state_ptrs(out, i_b, i_h, o_k, o_v, H, K, V, False), S, mask=mkv)


def lightning_tree_commit(k, v, *, decay, parents, accepted, initial_state, block_v: int = 32, num_warps: int = 4,
                          poison: bool | None = None):
    """State after root..accepted[b]: a new [B, H, K, V] fp32 tensor (the committed state untouched)."""
    launch, out = plan_commit(k, v, decay=decay, parents=parents, accepted=accepted, initial_state=initial_state,
                              block_v=block_v, num_warps=num_warps, poison=poison)
    launch()
    return out


def plan_commit(k, v, *, decay, parents, accepted, initial_state, block_v: int = 32, num_warps: int = 4,
                poison: bool | None = None):
    """Validate, build the paths and allocate once; returns (launch, out)."""
    B, T, H, K, V = _check(None, k, v, decay, initial_state)
    paths, rows = checked_accepted_paths(parents, accepted, B, T, k.device)
    out = C.alloc((B, H, K, V), torch.float32, k.device, poison)
    BK, BV = C.next_pow2(K, 1), min(block_v, C.next_pow2(V, 1))
    kw = dict(k=k.contiguous(), v=v.contiguous(), decay=decay.contiguous(), paths=paths, acc=rows,
              state=initial_state.contiguous(), out=out, T=T, TP=paths.shape[1], DMAX=paths.shape[2], H=H, K=K, V=V,
              BK=BK, BV=BV, num_warps=num_warps)
    return bind(_lightning_commit_kernel, (C.cdiv(V, BV), B * H), kw), out
