"""Triton kernels for Kimi Delta Attention (KDA) tree verification and commit, and their launchers (twins:
oracle.kda_tree_verify, oracle.kda_tree_commit; reference beside them: torch_kda).

recurrent   one program per (sequence, head, V tile) keeps S [K, BV] in registers and steps over the nodes in index
            order: S_t = Diag(exp(g_t)) S_src then the delta rule with beta_t (k_t, q_t L2-normed in the kernel, q
            scaled by K^-1/2), o_t = S_t^T q_t. mode "leaky": S carries from node t-1 (the flattened path), per-node
            states optional. mode "exact": parent-indexed, each node reloads its parent's state from the per-node
            state buffer, so those states are always written.
wy          mode "exact" without per-node states (the serving verify): the WY form with the decay per key channel.
            Along node t's root path, with Gamma_t the path's summed log decay (a vector over K) and the decay-free
            state S^_t = Diag(exp(-Gamma_t)) S_t, the delta rule reads with k_t exp(Gamma_t) and writes with
            k_t exp(-Gamma_t): S^_t = S^_p + (k_t / gamma_t) u_t^T, so
              u_t = beta_t (v_t - S0^T (gamma_t k_t) - sum_{j strict ancestor} (k_t . k_j exp(Gamma_t - Gamma_j)) u_j)
              o_t = S0^T (gamma_t q_t) + sum_{j ancestor or t} (q_t . k_j exp(Gamma_t - Gamma_j)) u_j.
            One program per (sequence, head, V tile) solves the u_t node by node in index order (every ancestor
            comes first), reading each node's root path in chunks of BD from the last ancestor back (the decays
            exp(Gamma_t - Gamma_j) <= 1 as suffix sums: no exp(-Gamma) is ever formed, so nothing overflows), the
            u_j of the ancestors from a [B, T, H, V] fp32 scratch it writes itself: no per-node state.
commit      the state after the accepted root path (triton_commit's design): the committed state read once, the
            path's steps, the result written once into a new [B, H, K, V].
The step is GDN's (triton_helpers.delta_step) with the decay a vector over the key rows instead of one scalar. The
committed state [B, H, K, V] fp32 is read, never written; inputs bf16 / fp16 / fp32.
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
def _kda_recurrent_kernel(
    q, k, v, g, beta,  # [B,T,H,K] x2, [B,T,H,V], [B,T,H,K] log decay per key channel, [B,T,H]
    src,  # [B, T] int32: source node of each node's state (-1: the committed state)
    state,  # [B, H, K, V] fp32 committed states
    o, snap,  # [B, T, H, V] out; [B, T, H, K, V] fp32 per-node states (or a dummy)
    T, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PARENT_INDEXED: tl.constexpr, STORE_STATES: tl.constexpr,
):
    i_v, i_b, i_h, _ = h.head_coords(H, H)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    mkv = mk[:, None] & mv[None, :]
    s0 = tl.load(h.state_ptrs(state, i_b, i_h, o_k, o_v, H, K, V, False), mask=mkv, other=0.0)
    S = s0
    for t in range(0, T):
        row = i_b * T + t
        if PARENT_INDEXED:
            S = h.source_state(snap, src, row, i_b * T, s0, i_h, o_k, o_v, mkv, H, K, V, False)
        b_q = h.load_rows(q, row, i_h, o_k, mk, H, K, True, 0, H * K)
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, True, 0, H * K)
        b_v = h.load_rows(v, row, i_h, o_v, mv, H, V, False, 0, H * V)
        b_g = tl.load(g + (row * H + i_h) * K + o_k, mask=mk, other=0.0).to(tl.float32)  # [BK]
        b_beta = tl.load(beta + row * H + i_h).to(tl.float32)
        S = h.delta_step(S, b_k, b_v, b_g[:, None], b_beta)  # the decay per key row
        b_o = tl.sum(S * (b_q * scale)[:, None], 0)
        tl.store(o + (row * H + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)
        if STORE_STATES:
            h.store_state(snap, row, S, i_h, o_k, o_v, mkv, H, K, V, PARENT_INDEXED, False)


@triton.jit
def _kda_wy_kernel(
    q, k, v, g, beta,  # [B,T,H,K] x2, [B,T,H,V], [B,T,H,K] log decay per key channel, [B,T,H]
    paths,  # [B, T, DMAX] int32: each node's root path (root first, the node last, -1 padded)
    state,  # [B, H, K, V] fp32 committed states
    o, u_buf,  # [B, T, H, V] out; [B, T, H, V] fp32 scratch: each node's u (its V tile written by this program)
    T, DMAX, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr,
):
    i_v, i_b, i_h, _ = h.head_coords(H, H)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    S0 = tl.load(h.state_ptrs(state, i_b, i_h, o_k, o_v, H, K, V, False), mask=mk[:, None] & mv[None, :], other=0.0)
    o_d = tl.arange(0, BD)
    n_chunks = tl.cdiv(DMAX, BD)
    for t in range(0, T):
        row = i_b * T + t
        b_q = h.load_rows(q, row, i_h, o_k, mk, H, K, True, 0, H * K) * scale  # [BK]
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, True, 0, H * K)
        b_v = h.load_rows(v, row, i_h, o_v, mv, H, V, False, 0, H * V)  # [BV]
        b_beta = tl.load(beta + row * H + i_h).to(tl.float32)
        acc_k = tl.zeros([BV], dtype=tl.float32)  # sum_j (k_t . k_j e_j) u_j over strict ancestors
        acc_q = tl.zeros([BV], dtype=tl.float32)  # sum_j (q_t . k_j e_j) u_j
        run = tl.zeros([BK], dtype=tl.float32)  # the log decay of the path after the current chunk
        for c in range(0, n_chunks):
            anc, valid, strict = h.path_chunk(paths, row, t, c, n_chunks, DMAX, o_d, BD)  # [BD] the last chunk first
            arow = i_b * T + tl.maximum(anc, 0)
            md = valid[:, None] & mk[None, :]
            Ga = tl.load(g + (arow[:, None] * H + i_h) * K + o_k[None, :], mask=md, other=0.0).to(tl.float32)
            tot = tl.sum(Ga, 0)
            after = run[None, :] + tot[None, :] - tl.cumsum(Ga, 0)  # [BD, BK] Gamma_t - Gamma_j (<= 0)
            run += tot
            Ka = h.load_rows(k, arow[:, None], i_h, o_k[None, :], md, H, K, True, 1, H * K)  # [BD, BK] l2-normed
            KE = tl.where(strict[:, None] & mk[None, :], Ka * tl.exp(after), 0.0)
            Ua = tl.load(u_buf + (arow[:, None] * H + i_h) * V + o_v[None, :], mask=strict[:, None] & mv[None, :],
                         other=0.0)  # [BD, BV]
            acc_k += tl.sum(tl.sum(KE * b_k[None, :], 1)[:, None] * Ua, 0)
            acc_q += tl.sum(tl.sum(KE * b_q[None, :], 1)[:, None] * Ua, 0)
        gam = tl.exp(run)  # the path's decay per key channel, Gamma_t = run
        u = b_beta * (b_v - tl.sum(S0 * (b_k * gam)[:, None], 0) - acc_k)
        b_o = tl.sum(S0 * (b_q * gam)[:, None], 0) + acc_q + tl.sum(b_q * b_k) * u
        tl.store(u_buf + (row * H + i_h) * V + o_v, u, mask=mv)
        tl.store(o + (row * H + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)
        tl.debug_barrier()  # a later node reads this u through other threads


DESIGNS = ("auto", "recurrent", "wy")
# "auto" takes the WY form from this many (sequence, head) programs on: below it the parent-indexed recurrence's
# V tiles fill the GPU better (H200, Kimi Linear's heads: 52.7 us against 75.3 at 1 x 17, 32 programs; from 8 x 65,
# 256 programs, the WY form at 0.79x its time; benchmarks/bench_kda_designs.py)
WY_FROM_PROGRAMS = 128


def kda_tree_verify(q, k, v, g, beta, *, parents, initial_state, mode="exact", output_states=False,
                    design: str = "auto", block_v: int | None = None, num_warps: int = 4, poison: bool | None = None):
    """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K]; beta [B, T, H]; parents [B, T] or a TreePlan; initial_state
    [B, H, K, V] fp32 (read, never written). Returns o [B, T, H, V] in v's dtype and, with output_states, the state
    after each node [B, T, H, K, V] fp32. The WY form applies to mode "exact" without per-node states; elsewhere every
    design runs the recurrence. design "wy": the WY form wherever it applies; "recurrent": never; "auto": where it
    applies and the batch has at least WY_FROM_PROGRAMS (sequence, head) pairs."""
    if design not in DESIGNS:
        raise ValueError(f"design: expected one of {DESIGNS}, got {design!r}")
    programs = q.shape[0] * q.shape[2] if q.dim() == 4 else 0  # (a malformed q is refused by the plan's checks)
    wy = mode == "exact" and not output_states and (design == "wy" or design == "auto" and programs >= WY_FROM_PROGRAMS)
    if wy:
        launch, result = plan_wy(q, k, v, g, beta, parents=parents, initial_state=initial_state,
                                 block_v=block_v or 128, num_warps=num_warps, poison=poison)
    else:
        launch, result = plan_recurrent(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode=mode,
                                        output_states=output_states, block_v=block_v or 32, num_warps=num_warps,
                                        poison=poison)
    launch()
    return result


def _check(q, k, v, g, beta, initial_state):
    """The shapes (B, T, H, K, V), the state fp32, every tensor on one device that Triton can launch on."""
    B, T, H, K, V = checks.check_kda(q, k, v, g, beta, initial_state)
    checks.fp32_state(initial_state, "KDA")
    C.check_device(k)  # a device Triton launches on (check_kda put every tensor on k's)
    return B, T, H, K, V


def plan_wy(q, k, v, g, beta, *, parents, initial_state, block_v: int = 128, block_d: int | None = None,
            num_warps: int = 4, poison: bool | None = None):
    """The exact verify in the WY form: validate, take the root paths (a TreePlan's cached table, else one built
    here) and allocate once; returns (launch, o). block_d: root-path positions read per chunk (default 8 for trees
    up to 8 deep, else 16; the H200 sweep's best at DDTree's depths of 3-5)."""
    B, T, H, K, V = _check(q, k, v, g, beta, initial_state)
    paths = checks.root_paths(parents, B, T, q.device)  # [B, T, DMAX]
    block_d = block_d or (8 if paths.shape[2] <= 8 else 16)
    o = C.alloc((B, T, H, V), v.dtype, v.device, poison)
    u_buf = C.alloc((B, T, H, V), torch.float32, v.device, poison)
    BK, BV = C.next_pow2(K, 1), min(block_v, C.next_pow2(V, 1))
    kw = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g.contiguous(), beta=beta.contiguous(),
              paths=paths, state=initial_state.contiguous(), o=o, u_buf=u_buf, T=T, DMAX=paths.shape[2],
              scale=K ** -0.5, H=H, K=K, V=V, BK=BK, BV=BV, BD=block_d, num_warps=num_warps)
    return bind(_kda_wy_kernel, (C.cdiv(V, BV), B * H), kw), o


def plan_recurrent(q, k, v, g, beta, *, parents, initial_state, mode="exact", output_states=False,
                   block_v: int = 32, num_warps: int = 4, poison: bool | None = None):
    """Validate and allocate once; returns (launch, result): launch() runs the kernel alone (what a benchmark
    times)."""
    B, T, H, K, V = _check(q, k, v, g, beta, initial_state)
    src = checks.source_parents(parents, B, T, q.device, mode)
    parent_indexed = mode == "exact"
    store = output_states or parent_indexed
    o = C.alloc((B, T, H, V), v.dtype, v.device, poison)
    snap = C.alloc((B, T, H, K, V), torch.float32, v.device, poison) if store else checks.constant("dummy", 1, v.device)
    BK, BV = C.next_pow2(K, 1), min(block_v, C.next_pow2(V, 1))
    grid = (C.cdiv(V, BV), B * H)
    kw = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g.contiguous(), beta=beta.contiguous(),
              src=src.to(torch.int32).contiguous(), state=initial_state.contiguous(), o=o, snap=snap, T=T,
              scale=K ** -0.5, H=H, K=K, V=V, BK=BK, BV=BV, PARENT_INDEXED=parent_indexed, STORE_STATES=store,
              num_warps=num_warps, **C.ONE_ARITHMETIC)
    return bind(_kda_recurrent_kernel, grid, kw), ((o, snap) if output_states else o)



@triton.jit
def _kda_commit_kernel(
    k, v, g, beta,  # [B,T,H,K], [B,T,H,V], [B,T,H,K], [B,T,H]
    paths, acc,  # [B, TP, DMAX] int32 root paths (root first, -1 padded); [B] int64: each sequence's row
    state, out,  # [B, H, K, V] fp32: the committed states (read), the new ones (written)
    T, TP, DMAX,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_v, i_b, i_h, _ = h.head_coords(H, H)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    mkv = mk[:, None] & mv[None, :]
    S = tl.load(h.state_ptrs(state, i_b, i_h, o_k, o_v, H, K, V, False), mask=mkv, other=0.0)
    path = paths + (i_b * TP + tl.load(acc + i_b)) * DMAX  # the accepted node's root path
    for d in range(0, DMAX):
        n = tl.load(path + d)
        row = (i_b * T + tl.maximum(n, 0)).to(tl.int64)
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, True, 0, H * K)
        b_v = h.load_rows(v, row, i_h, o_v, mv, H, V, False, 0, H * V)
        b_g = tl.load(g + (row * H + i_h) * K + o_k, mask=mk, other=0.0).to(tl.float32)
        b_beta = tl.load(beta + row * H + i_h).to(tl.float32)
        S = tl.where(n >= 0, h.delta_step(S, b_k, b_v, b_g[:, None], b_beta), S)
    tl.store(h.state_ptrs(out, i_b, i_h, o_k, o_v, H, K, V, False), S, mask=mkv)


def kda_tree_commit(k, v, g, beta, *, parents, accepted, initial_state, block_v: int = 32, num_warps: int = 4,
                    poison: bool | None = None):
    """State after root..accepted[b]: a new [B, H, K, V] fp32 tensor (the committed state untouched)."""
    launch, out = plan_commit(k, v, g, beta, parents=parents, accepted=accepted, initial_state=initial_state,
                              block_v=block_v, num_warps=num_warps, poison=poison)
    launch()
    return out


def plan_commit(k, v, g, beta, *, parents, accepted, initial_state, block_v: int = 32, num_warps: int = 4,
                poison: bool | None = None):
    """Validate, build the paths and allocate once; returns (launch, out)."""
    B, T, H, K, V = _check(None, k, v, g, beta, initial_state)
    paths, rows = checked_accepted_paths(parents, accepted, B, T, k.device)
    out = C.alloc((B, H, K, V), torch.float32, k.device, poison)
    BK, BV = C.next_pow2(K, 1), min(block_v, C.next_pow2(V, 1))
    kw = dict(k=k.contiguous(), v=v.contiguous(), g=g.contiguous(), beta=beta.contiguous(), paths=paths, acc=rows,
              state=initial_state.contiguous(), out=out, T=T, TP=paths.shape[1], DMAX=paths.shape[2], H=H, K=K, V=V,
              BK=BK, BV=BV, num_warps=num_warps)
    return bind(_kda_commit_kernel, (C.cdiv(V, BV), B * H), kw), out
