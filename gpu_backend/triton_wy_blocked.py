"""The tree-masked WY form for GDN trees larger than one block (budgets 128, 256, ...): exact, no
per-node states. Twin: oracle.gdn_tree_verify; the one-block kernel is triton_gdn._gdn_wy_kernel.

The draft nodes 1..T-1 (a forest under the root, whose state S_r one recurrent step gives) are cut
in node order into chunks of BT rows; a node's strict ancestors lie in its own chunk or earlier
ones. With G_t the sum of g over t's ancestors-or-self below the root and A_t = exp(G_t), the WY
system (I + L) U = diag(beta) (V - diag(A) K S_r), L[t, j] = beta_t (A_t / A_j) k_t.k_j (j a strict
ancestor), is solved chunk by chunk (block forward substitution):

    R_c = diag(beta_c) (V_c - diag(A_c) K_c S_r) - sum_{c' < c} L[c, c'] U_c'
    U_c = (I + L[c, c])^-1 R_c            (the nilpotent product, as in the one-block kernel)
    O_c = diag(A_c) Q_c S_r + sum_{c' <= c} (M o D o Q_c K_c'^T) U_c'

U (a vector per node and value column, not a state) goes to a scratch buffer [B, T, HV, V] that each
program writes and reads back only in its own V tile. A prologue loop writes G per node the same
way (mask-row sums). Exponents are taken on ancestor entries only (elsewhere exp(0)).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import checks
from ddsim.gpu_backend import triton_helpers as h
from ddsim.gpu_backend.launch import bind


@triton.jit
def _gdn_wy_blocked_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self (chain mask for leaky)
    state, state_idx, o,
    Gs, Us,  # scratch: [B, T, HV] fp32 path log-decays, [B, T, HV, V] fp32 WY vectors
    T, scale, NSTEP,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr, STATE_VK: tl.constexpr,
):
    i_v, i_b, i_hv, i_h = h.head_coords(H, HV)
    o_t = tl.arange(0, BT)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    # ---- the root, recurrently: S_r and o_0
    s0 = h.wy_root(q, k, v, g, beta, state, state_idx, o, i_b, i_h, i_hv, T, scale, o_k, o_v, mk, mv, neg_A, bias,
                   H, HV, K, V, FUSED, L2NORM, STATE_VK)
    n = T - 1  # draft nodes, at rows 1..T-1
    # ---- prologue: G per draft node, chunk by chunk (mask-row sums over the chunks up to its own)
    for c0 in range(0, n, BT):
        rc = c0 + o_t
        mc = rc < n
        acc = tl.zeros([BT], dtype=tl.float32)
        for j0 in range(0, c0 + BT, BT):
            rj = j0 + o_t
            mj = rj < n
            gj, _ = h.gates(g, beta, (i_b * T + 1 + rj).to(tl.int64) * HV + i_hv, mj, neg_A, bias, FUSED, True)
            anc = tl.load(mask + (i_b * T + 1 + rc[:, None]).to(tl.int64) * T + 1 + rj[None, :],
                          mask=mc[:, None] & mj[None, :], other=0) != 0
            acc += tl.sum(tl.where(anc, tl.where(mj, gj, 0.0)[None, :], 0.0), 1)
        tl.store(Gs + (i_b * T + 1 + rc).to(tl.int64) * HV + i_hv, acc, mask=mc)
    tl.debug_barrier()
    # ---- chunk by chunk: U_c by block forward substitution, then O_c
    for c0 in range(0, n, BT):
        rc = c0 + o_t
        mc = rc < n
        rows = (i_b * T + 1 + rc).to(tl.int64)
        b_q, b_k, b_v, b_g, b_beta = h.wy_rows(q, k, v, g, beta, rows, mc, i_h, i_hv, o_k, o_v, mk, mv, neg_A, bias,
                                               H, HV, K, V, FUSED, L2NORM)
        b_qs = b_q * scale
        G = tl.load(Gs + rows * HV + i_hv, mask=mc, other=0.0)
        A = tl.exp(G)
        R = b_beta[:, None] * (b_v - A[:, None] * tl.dot(b_k, s0, input_precision=PRECISION))
        O = A[:, None] * tl.dot(b_qs, s0, input_precision=PRECISION)
        for j0 in range(0, c0, BT):  # earlier chunks: their U is final
            rj = j0 + o_t
            mj = rj < n
            rows_j = (i_b * T + 1 + rj).to(tl.int64)
            k_j = h.load_rows(k, rows_j[:, None], i_h, o_k[None, :], mj[:, None] & mk[None, :], H, K, L2NORM, 1)
            u_j = tl.load(Us + (rows_j[:, None] * HV + i_hv) * V + o_v[None, :], mask=mj[:, None] & mv[None, :],
                          other=0.0)
            G_j = tl.load(Gs + rows_j * HV + i_hv, mask=mj, other=0.0)
            anc = tl.load(mask + rows[:, None] * T + 1 + rj[None, :], mask=mc[:, None] & mj[None, :], other=0) != 0
            D = tl.where(anc, tl.exp(tl.where(anc, G[:, None] - G_j[None, :], 0.0)), 0.0)
            R -= tl.dot(b_beta[:, None] * D * tl.dot(b_k, tl.trans(k_j), input_precision=PRECISION), u_j,
                        input_precision=PRECISION)
            O += tl.dot(D * tl.dot(b_qs, tl.trans(k_j), input_precision=PRECISION), u_j, input_precision=PRECISION)
        # the diagonal block
        anc = tl.load(mask + rows[:, None] * T + 1 + rc[None, :], mask=mc[:, None] & mc[None, :], other=0) != 0
        D = tl.where(anc, tl.exp(tl.where(anc, G[:, None] - G[None, :], 0.0)), 0.0)
        strict = anc & (o_t[:, None] != o_t[None, :])
        NL = tl.where(strict, -b_beta[:, None] * D * tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION), 0.0)
        U = R
        for _ in range(0, NSTEP):  # U <- (I + N) U, N <- N @ N: U = sum_n (-L)^n R
            U = U + tl.dot(NL, U, input_precision=PRECISION)
            NL = tl.dot(NL, NL, input_precision=PRECISION)
        tl.store(Us + (rows[:, None] * HV + i_hv) * V + o_v[None, :], U, mask=mc[:, None] & mv[None, :])
        O += tl.dot(D * tl.dot(b_qs, tl.trans(b_k), input_precision=PRECISION), U, input_precision=PRECISION)
        tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], O.to(o.dtype.element_ty),
                 mask=mc[:, None] & mv[None, :])
        tl.debug_barrier()  # this chunk's U is read back (through other threads) by the next chunks


def plan_wy_blocked(q, k, v, g=None, beta=None, *, parents, initial_state, mode="exact", scale=None,
                    use_qk_l2norm=True, output_states=False, state_indices=None, a=None, b=None, A_log=None,
                    dt_bias=None, block_t: int = 64, block_v: int = 32, num_warps: int = 8, precision: str = "tf32x3",
                    poison: bool | None = None):
    """Validate, build the ancestor mask and allocate once; returns (launch, o). Any tree size."""
    from ddsim.gpu_backend.triton_gdn import _prep
    if output_states:
        raise ValueError("output_states: the WY kernel writes no per-node states; use the recurrent kernel")
    if precision not in ("ieee", "tf32", "tf32x3"):
        raise ValueError(f"precision: expected ieee, tf32 or tf32x3, got {precision!r}")
    B, T, H, HV, K, V, src, idx, (g_, b_, al, db, fused) = _prep(
        q, k, v, g, beta, a, b, A_log, dt_bias, parents, initial_state, state_indices, mode)
    scale = K ** -0.5 if scale is None else float(scale)
    mask, depth = parents.ancestors(mode) if isinstance(parents, checks.TreePlan) else C.ancestor_mask(src)
    nstep = max(0, math.ceil(math.log2(max(depth, 1))))
    o = C.alloc((B, T, HV, V), v.dtype, v.device, poison)
    Gs = torch.empty(B, T, HV, dtype=torch.float32, device=v.device)
    Us = torch.empty(B, T, HV, V, dtype=torch.float32, device=v.device)
    BT, BK, BV = block_t, max(16, C.next_pow2(K, 1)), min(block_v, max(16, C.next_pow2(V, 1)))
    grid = (C.cdiv(V, BV), B * HV)
    kw = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g_, beta=b_, A_log=al, dt_bias=db, mask=mask,
              state=initial_state, state_idx=idx, o=o, Gs=Gs, Us=Us, T=T, scale=scale, NSTEP=nstep, H=H, HV=HV, K=K,
              V=V, BT=BT, BK=BK, BV=BV, FUSED=fused, L2NORM=use_qk_l2norm, PRECISION=precision,
              STATE_VK=C.state_vk(initial_state), num_warps=num_warps)
    return bind(_gdn_wy_blocked_kernel, grid, kw), o
