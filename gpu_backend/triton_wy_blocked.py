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

That one kernel (design "chunked") walks the chunks in sequence inside every V tile's program, so
it redoes the whole solve per V tile and runs one program per (V tile, head). Design "split" (the
default past 65 nodes) is the blocked form of triton_wy_split: the value-independent half once per
head, in parallel over the chunks, then the rest per (V tile, chunk). With N = -L, P = M o D o (Q K^T) scale
and Y = P (I - N)^-1, so that O = diag(A) Q S_r scale + Ve (V - diag(A) K S_r) with Ve = Y diag(beta)
(the one-block derivation; here every matrix is block lower triangular over the chunks):

    diag    grid (chunks, B * HV): G_c (stored) and W_cc = (I - N_cc)^-1 by doubling (stored).
    solve   grid (chunks, B * HV): row chunk i, from Y = P + Y N, right to left over j = i..0:
              Y_ij = (P_ij + sum_{j < l <= i} Y_il N_lj) W_jj,   and  Y_il N_lj = -Ve_il M_lj
            (N_lj = -diag(beta_l) M_lj, M_lj = D o (K_l K_j^T) on ancestors); stores Ve_ij.
    apply   grid (V tiles, B * HV, chunks): S_r, then for row chunk i
              O_i = diag(A_i) Q_i S_r scale + sum_{j <= i} Ve_ij (V_j - diag(A_j) K_j S_r).
    fold    (an option) the solve also forms Qe_i = diag(A_i) Q_i scale - sum_j Ve_ij diag(A_j) K_j
            per head, so that the apply's O_i = Qe_i S_r + sum_j Ve_ij V_j (as triton_wy_split's
            fold design for one block).
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
from ddsim.gpu_backend.triton_wy_split import _dot_exact_rhs, _exact_mode, _gram, _raw_block


@triton.jit(**C.ROUNDS_AS_VALUE)
def _gdn_wy_blocked_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self (chain mask for leaky)
    state, state_idx, o,
    Gs, Us,  # scratch: [B, T, HV] fp32 path log-decays, [B, T, HV, V] fp32 WY vectors
    T, scale, NSTEP,
    depths,  # DEPTHS: [B, NPD] int32 each tree's depth per block (a device plan's): h.tree_depth
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr, STATE_VK: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
    DEPTHS: tl.constexpr = False, NPD: tl.constexpr = 1,
):
    i_v, i_b, i_hv, i_h = h.head_coords(H, HV)
    depth = h.tree_depth(depths, i_b, NPD, DEPTHS)
    o_t = tl.arange(0, BT)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    # ---- the root, recurrently: S_r and o_0
    s0 = h.wy_root(q, k, v, g, beta, state, state_idx, o, i_b, i_h, i_hv, T, scale, o_k, o_v, mk, mv, neg_A, bias,
                   H, HV, K, V, FUSED, L2NORM, STATE_VK, QS, KS, VS)
    n = T - 1  # draft nodes, at rows 1..T-1
    NSTEP = h.solve_rounds(NSTEP, depth, DEPTHS, 0)
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
                                               H, HV, K, V, FUSED, L2NORM, QS, KS, VS)
        b_qs = b_q * scale
        G = tl.load(Gs + rows * HV + i_hv, mask=mc, other=0.0)
        A = tl.exp(G)
        R = b_beta[:, None] * (b_v - A[:, None] * tl.dot(b_k, s0, input_precision=PRECISION))
        O = A[:, None] * tl.dot(b_qs, s0, input_precision=PRECISION)
        for j0 in range(0, c0, BT):  # earlier chunks: their U is final
            rj = j0 + o_t
            mj = rj < n
            rows_j = (i_b * T + 1 + rj).to(tl.int64)
            k_j = h.load_rows(k, rows_j[:, None], i_h, o_k[None, :], mj[:, None] & mk[None, :], H, K, L2NORM, 1, KS)
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
        # the last step squares a power of -L it does not use. Taken out of the loop as _gdn_wy_kernel's solve takes
        # it (the first step before the loop), the kernel compiled by Triton 3.6 for the H200 gave wrong outputs
        # (test_wy_verifies_trees_beyond_one_block_chunk_by_chunk, 131 nodes, leaky: max abs 1.27 against a bound of
        # 1.2e-4) where the interpreter's matched the oracle: kept so
        U = R
        for _ in range(0, NSTEP):  # U <- (I + N) U, N <- N @ N: U = sum_n (-L)^n R
            U = U + tl.dot(NL, U, input_precision=PRECISION)
            NL = tl.dot(NL, NL, input_precision=PRECISION)
        tl.store(Us + (rows[:, None] * HV + i_hv) * V + o_v[None, :], U, mask=mc[:, None] & mv[None, :])
        O += tl.dot(D * tl.dot(b_qs, tl.trans(b_k), input_precision=PRECISION), U, input_precision=PRECISION)
        tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], O.to(o.dtype.element_ty),
                 mask=mc[:, None] & mv[None, :])
        tl.debug_barrier()  # this chunk's U is read back (through other threads) by the next chunks


@triton.jit
def _chunk_rows(i_b, c, T, BT: tl.constexpr):
    """Chunk c's draft rows: their flat rows [BT] (int64, nodes 1 + c BT ...) and validity [BT]."""
    r = c * BT + tl.arange(0, BT)
    return (i_b * T + 1 + r).to(tl.int64), r < T - 1


@triton.jit
def _chunk_nodes(c, BT: tl.constexpr):
    """Chunk c's draft nodes within their tree [BT] (int32: 1 + c BT ...; valid where _chunk_rows says)."""
    return 1 + c * BT + tl.arange(0, BT)


@triton.jit
def _path_decay(mask_b, nodes_a, ma, nodes_b, mb, G_a, G_b, T, STRICT: tl.constexpr):
    """D [BTa, BTb] = exp(G_t - G_s) where s (nodes_b) is an ancestor-or-self (STRICT: a strict ancestor) of t
    (nodes_a) in the tree's mask [T, T] at mask_b (its sequence's, a 64-bit scalar base; the nodes' 32-bit offsets
    from it: a flat row's modulo T in int64 took a division routine per entry); 0 elsewhere."""
    anc = tl.load(mask_b + nodes_a[:, None] * T + nodes_b[None, :], mask=ma[:, None] & mb[None, :], other=0) != 0
    if STRICT:
        anc = anc & (nodes_a[:, None] != nodes_b[None, :])
    return tl.where(anc, tl.exp(tl.where(anc, G_a[:, None] - G_b[None, :], 0.0)), 0.0)


@triton.jit(**C.ROUNDS_AS_VALUE)
def _gdn_wy_blocked_diag_kernel(
    k, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self
    Gs, Wd,  # out: [B * HV, NP] fp32 path log-decays, [B * HV, NC, BT, BT] fp32 (I - N_cc)^-1
    T, NSTEP, NP, NC,
    depths,  # DEPTHS: [B, NPD] int32 each tree's depth per block (a device plan's): h.tree_depth
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, RAW16: tl.constexpr, PRECISION: tl.constexpr,
    KS: tl.constexpr,  # k's row stride (_common.rows_of)
    DEPTHS: tl.constexpr = False, NPD: tl.constexpr = 1,
):
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    depth = h.tree_depth(depths, i_b, NPD, DEPTHS)
    i_h = i_hv // (HV // H)
    o_t, o_k = tl.arange(0, BT), tl.arange(0, BK)
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    rows, mc = _chunk_rows(i_b, i_c, T, BT)
    mask_b = mask + i_b.to(tl.int64) * T * T
    nodes = _chunk_nodes(i_c, BT)
    G = tl.zeros([BT], dtype=tl.float32)  # mask-row sums of g over the chunks up to this one
    for j in range(0, i_c + 1):
        rows_j, mj = _chunk_rows(i_b, j, T, BT)
        nodes_j = _chunk_nodes(j, BT)
        g_j, _ = h.gates(g, beta, rows_j * HV + i_hv, mj, neg_A, bias, FUSED, True)
        anc = tl.load(mask_b + nodes[:, None] * T + nodes_j[None, :], mask=mc[:, None] & mj[None, :], other=0) != 0
        G += tl.sum(tl.where(anc, tl.where(mj, g_j, 0.0)[None, :], 0.0), 1)
    tl.store(Gs + i_bh.to(tl.int64) * NP + i_c * BT + o_t, G)
    b_k, rk = _raw_block(k, rows, mc, i_h, o_k, o_k < K, H, K, L2NORM, KS)
    _, b_beta = h.gates(g, beta, rows * HV + i_hv, mc, neg_A, bias, FUSED, True)
    D = _path_decay(mask_b, nodes, mc, nodes, mc, G, G, T, True)
    N = -tl.where(mc, b_beta, 0.0)[:, None] * D * _gram(b_k, b_k, rk, rk, RAW16, PRECISION)
    # (I - N)^-1 = (I + N)(I + N^2)(I + N^4)...: square, then multiply (the rounds paired as in
    # triton_wy_split's fold kernel measured no faster here, with 15 more registers: RESULTS.md)
    X = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0) + N
    NSTEP = h.solve_rounds(NSTEP, depth, DEPTHS, 0)
    for _r in range(1, NSTEP):
        N = tl.dot(N, N, input_precision=PRECISION)
        X = X + tl.dot(N, X, input_precision=PRECISION)
    tl.store(Wd + ((i_bh.to(tl.int64) * NC + i_c) * BT + o_t[:, None]) * BT + o_t[None, :], X)


@triton.jit
def _gdn_wy_blocked_solve_kernel(
    q, k, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self
    Gs, Wd,  # from the diag kernel
    Ve,  # out: [B * HV, NP, NP] fp32, the lower chunk blocks of Y diag(beta)
    Qe,  # out (FOLD): [B * HV, NP, BK] fp32, the output's weights on S_r
    T, scale, NP, NC,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, RAW16: tl.constexpr, EXACT: tl.constexpr, PRECISION: tl.constexpr,
    FOLD: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr,  # q's and k's row strides (_common.rows_of)
):
    # FOLD: Qe_i = diag(A_i) Q_i scale - sum_{j <= i} Ve_ij diag(A_j) K_j, so that the apply kernel's
    # O_i = Qe_i S_r + sum_{j <= i} Ve_ij V_j takes one product by S_r instead of i + 2
    i_i, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_t, o_k = tl.arange(0, BT), tl.arange(0, BK)
    mk = o_k < K
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    gbase = i_bh.to(tl.int64) * NP
    vbase = i_bh.to(tl.int64) * NP * NP
    rows_i, mi = _chunk_rows(i_b, i_i, T, BT)
    mask_b = mask + i_b.to(tl.int64) * T * T
    nodes_i = _chunk_nodes(i_i, BT)
    G_i = tl.load(Gs + gbase + i_i * BT + o_t)
    if FOLD:
        b_q, rq = _raw_block(q, rows_i, mi, i_h, o_k, mk, H, K, L2NORM, QS)
        Qacc = (tl.exp(G_i) * scale / rq)[:, None] * b_q.to(tl.float32)
    for jj in range(0, i_i + 1):  # right to left: Y_il for l > j is stored before chunk j needs it
        j = i_i - jj
        rows_j, mj = _chunk_rows(i_b, j, T, BT)
        b_q, rq = _raw_block(q, rows_i, mi, i_h, o_k, mk, H, K, L2NORM, QS)  # loaded again (cached): fewer live registers
        k_j, rk_j = _raw_block(k, rows_j, mj, i_h, o_k, mk, H, K, L2NORM, KS)
        G_j = tl.load(Gs + gbase + j * BT + o_t)
        nodes_j = _chunk_nodes(j, BT)
        X = _path_decay(mask_b, nodes_i, mi, nodes_j, mj, G_i, G_j, T, False) * _gram(b_q, k_j, rq, rk_j, RAW16,
                                                                                 PRECISION) * scale
        for l in range(j + 1, i_i + 1):  # X -= Ve_il M_lj
            rows_l, ml = _chunk_rows(i_b, l, T, BT)
            k_l, rk_l = _raw_block(k, rows_l, ml, i_h, o_k, mk, H, K, L2NORM, KS)
            G_l = tl.load(Gs + gbase + l * BT + o_t)
            nodes_l = _chunk_nodes(l, BT)
            M = _path_decay(mask_b, nodes_l, ml, nodes_j, mj, G_l, G_j, T, False) * _gram(k_l, k_j, rk_l, rk_j, RAW16,
                                                                                     PRECISION)
            Ve_il = tl.load(Ve + vbase + (i_i * BT + o_t[:, None]) * NP + l * BT + o_t[None, :])
            X -= tl.dot(Ve_il, M, input_precision=PRECISION)
        W = tl.load(Wd + ((i_bh.to(tl.int64) * NC + j) * BT + o_t[:, None]) * BT + o_t[None, :])
        _, beta_j = h.gates(g, beta, rows_j * HV + i_hv, mj, neg_A, bias, FUSED, True)
        Y = tl.dot(X, W, input_precision=PRECISION) * tl.where(mj, beta_j, 0.0)[None, :]
        tl.store(Ve + vbase + (i_i * BT + o_t[:, None]) * NP + j * BT + o_t[None, :], Y)
        if FOLD:
            Qacc = _dot_exact_rhs(-Y * (tl.exp(G_j) / rk_j)[None, :], k_j, Qacc, EXACT, PRECISION)
        tl.debug_barrier()  # read back (through other threads) by the chunks to its left
    if FOLD:
        tl.store(Qe + (i_bh.to(tl.int64) * NP + i_i * BT + o_t[:, None]) * BK + o_k[None, :], Qacc)


@triton.jit
def _gdn_wy_blocked_apply_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    Gs, Ve, Qe,  # from the diag and solve kernels (Qe: FOLD only)
    state, state_idx, o,
    T, scale, NP,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr, STATE_VK: tl.constexpr, FOLD: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
):
    i_v, i_b, i_hv, i_h = h.head_coords(H, HV)
    i_i = tl.program_id(2)
    o_t = tl.arange(0, BT)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    # every chunk's program stores the root's output o_0 too: the same bits (same inputs, same code)
    s0 = h.wy_root(q, k, v, g, beta, state, state_idx, o, i_b, i_h, i_hv, T, scale, o_k, o_v, mk, mv, neg_A, bias,
                   H, HV, K, V, FUSED, L2NORM, STATE_VK, QS, KS, VS)
    i_bh = i_b * HV + i_hv
    gbase = i_bh.to(tl.int64) * NP
    rows_i, mi = _chunk_rows(i_b, i_i, T, BT)
    if FOLD:
        Qm = tl.load(Qe + (i_bh.to(tl.int64) * NP + i_i * BT + o_t[:, None]) * BK + o_k[None, :])
        O = tl.dot(Qm, s0, input_precision=PRECISION)
    else:
        b_q = h.load_rows(q, rows_i[:, None], i_h, o_k[None, :], mi[:, None] & mk[None, :], H, K, L2NORM, 1, QS)
        A_i = tl.exp(tl.load(Gs + gbase + i_i * BT + o_t))
        O = A_i[:, None] * tl.dot(b_q * scale, s0, input_precision=PRECISION)
    for j in range(0, i_i + 1):
        rows_j, mj = _chunk_rows(i_b, j, T, BT)
        R = h.load_rows(v, rows_j[:, None], i_hv, o_v[None, :], mj[:, None] & mv[None, :], HV, V, False, 1, VS)
        if not FOLD:  # R_j = V_j - diag(A_j) K_j S_r [BT, BV]
            k_j = h.load_rows(k, rows_j[:, None], i_h, o_k[None, :], mj[:, None] & mk[None, :], H, K, L2NORM, 1, KS)
            A_j = tl.exp(tl.load(Gs + gbase + j * BT + o_t))
            R = R - A_j[:, None] * tl.dot(k_j, s0, input_precision=PRECISION)
        Ve_ij = tl.load(Ve + (i_bh.to(tl.int64) * NP + i_i * BT + o_t[:, None]) * NP + j * BT + o_t[None, :])
        O += tl.dot(Ve_ij, R, input_precision=PRECISION)
    tl.store(o + (rows_i[:, None] * HV + i_hv) * V + o_v[None, :], O.to(o.dtype.element_ty),
             mask=mi[:, None] & mv[None, :])


# Dot precisions the chunked form refuses: with bf16x3 products its compiled kernel is wrong on the H200
# under Triton 3.6 at 64-row chunks (B = 2, T = 131, K = V = 128: 8.5e-2 relative to the oracle against
# tf32x3's 1.65e-3, compute-sanitizer clean; in a pytest process it faulted with an illegal memory
# access), while its 16-row-chunk hypothesis properties pass. benchmarks/repro_chunked_bf16x3.py empties
# this to reproduce it (RESULTS.md). The form is kept only as the split form's "before".
CHUNKED_REFUSES = ("bf16x3",)


def auto_folds(B: int, precision: str) -> bool:
    """Whether the split form past one block folds when not told (fold=None): for a batch with tf32x3 products;
    with bf16x3 the unfolded form measured faster (RESULTS.md)."""
    return B > 1 and precision != "bf16x3"


def block_v_cap(precision: str, design: str = "split") -> int:
    """The widest apply V tile compiled and measured past one block: 64 for the split form with bf16x3 products,
    else 32 (tf32x3 and the chunked form were not measured with 64). plan_wy caps a block_v it is given here."""
    return 64 if design == "split" and precision == "bf16x3" else 32


def auto_block_v(B: int, precision: str, design: str = "split") -> int:
    """The apply kernel's V tile when not told: block_v_cap's for a batch (64 with bf16x3 products on the H200:
    188.9 / 534.4 us at 8 x 129 / 8 x 257 against 209.2 / 586.3 with 32: RESULTS.md), 32 for one sequence (64 was
    not measured there)."""
    return block_v_cap(precision, design) if B > 1 else 32


def plan_wy_blocked(q, k, v, g=None, beta=None, *, parents, initial_state, mode="exact", scale=None,
                    use_qk_l2norm=True, output_states=False, state_indices=None, a=None, b=None, A_log=None,
                    dt_bias=None, block_t: int = 64, block_v: int | None = None, num_warps: int = 4, solve_warps: int = 4,
                    precision: str | None = None, poison: bool | None = None, design: str = "split",
                    fold: bool | None = False, num_stages: int = 1):
    """Validate, build the ancestor mask and allocate once; returns (launch, o). Any tree size.
    design "split": three kernels (diag, solve per head and chunk; apply per V tile and chunk);
    fold: the solve kernel also forms Qe, and the apply multiplies S_r once per chunk instead of
    i + 2 times; None: fold for a batch with tf32x3 products only (on the H200, RESULTS.md: with tf32x3
    5-7% faster at 8 sequences, 2-5% slower at one; with bf16x3 0.1-5% slower at 8 x 257 / 8 x 129
    and 8% slower at one sequence). Scratch: B HV NP^2 fp32 for Ve (NP: the nodes rounded up to chunks;
    25 MB at 8 x 129). "chunked": the one kernel that walks the chunks in every V tile (num_warps 8
    was its choice). num_stages: Triton's software pipelining of the chunk loops (its default, 3,
    asks for more shared memory than an H200 SM has in the solve kernel). block_v: the apply kernel's V tile (None:
    auto_block_v)."""
    if design not in ("split", "chunked"):
        raise ValueError(f"design: expected 'split' or 'chunked' past one block, got {design!r}")
    if output_states:
        raise ValueError("output_states: the WY kernel writes no per-node states; use the recurrent kernel")
    C.check_precision(precision)
    if design == "chunked" and precision in CHUNKED_REFUSES:
        raise ValueError(f"precision: {precision} is refused for the chunked form (its kernel compiled with it gave "
                         f"wrong outputs on the H200 under Triton 3.6 at 131 nodes: RESULTS.md); use tf32x3")
    B, T, H, HV, K, V, src, idx, (g_, b_, al, db, fused) = C.prep_gdn(
        q, k, v, g, beta, a, b, A_log, dt_bias, parents, initial_state, state_indices, mode)
    # (the chunked form, kept as the "before" of the split form, stays at tf32x3 for every dtype)
    precision = C.dot_precision(precision or ("tf32x3" if design == "chunked" else None), q, k, v)
    if fold is None:
        fold = auto_folds(B, precision)
    scale = K ** -0.5 if scale is None else float(scale)
    mask, depth = parents.ancestors(mode) if isinstance(parents, checks.TreePlan) else checks.ancestor_mask(src)
    nstep = max(0, math.ceil(math.log2(max(depth, 1))))
    from ddsim.gpu_backend.triton_gdn import device_rounds  # (triton_gdn imports this module)
    rounds = device_rounds(parents, mode, mask)  # a device plan's: each sequence's rounds counted in the kernels
    o = C.alloc((B, T, HV, V), v.dtype, v.device, poison)
    if block_v is None:
        block_v = auto_block_v(B, precision, design)
    BT, BK, BV = block_t, max(16, C.next_pow2(K, 1)), C.v_tile(block_v, V, block_t)
    rows = C.qkv_rows(q, k, v)  # q, k, v as given where their rows are, else contiguous copies, and their row strides
    qc, kc, vc = rows["q"], rows["k"], rows["v"]
    QS, KS, VS = rows["QS"], rows["KS"], rows["VS"]
    gates = dict(g=g_, beta=b_, A_log=al, dt_bias=db)
    shapes = dict(H=H, HV=HV, K=K, BT=BT, BK=BK, FUSED=fused, L2NORM=use_qk_l2norm, PRECISION=precision)
    if design == "chunked":
        Gs = C.scratch((B, T, HV), torch.float32, v.device)
        Us = C.scratch((B, T, HV, V), torch.float32, v.device)
        kw = dict(q=qc, k=kc, v=vc, **gates, mask=mask, state=initial_state, state_idx=idx, o=o, Gs=Gs, Us=Us, T=T,
                  scale=scale, NSTEP=nstep, **rounds, **shapes, V=V, BV=BV, STATE_VK=C.state_vk(initial_state),
                  QS=QS, KS=KS, VS=VS, num_warps=num_warps)
        return bind(_gdn_wy_blocked_kernel, (C.cdiv(V, BV), B * HV), kw), o
    NC = max(1, C.cdiv(T - 1, BT))  # chunks (one, empty, for a root alone: the apply stores o_0)
    NP = NC * BT
    Gs = C.scratch((B * HV, NP), torch.float32, v.device)
    Wd = C.scratch((B * HV, NC, BT, BT), torch.float32, v.device)
    Ve = C.scratch((B * HV, NP, NP), torch.float32, v.device)  # lower chunk blocks only
    Qe = (C.scratch((B * HV, NP, BK), torch.float32, v.device) if fold else
          checks.constant("dummy", 1, v.device, torch.float32))
    opts = dict(num_stages=num_stages)
    # q, k stay 16-bit in the per-head kernels' products by k (as triton_wy_split's; not in the
    # interpreter, whose bf16 tl.dot multiplies raw bits)
    raw16 = k.dtype == q.dtype and (q.dtype == torch.float16 or (q.dtype == torch.bfloat16 and not C.interpreting()))
    diag = dict(k=kc, **gates, mask=mask, Gs=Gs, Wd=Wd, T=T, NSTEP=nstep, **rounds, NP=NP, NC=NC, **shapes, RAW16=raw16,
                KS=KS, num_warps=solve_warps, **opts)
    solve = dict(q=qc, k=kc, **gates, mask=mask, Gs=Gs, Wd=Wd, Ve=Ve, Qe=Qe, T=T, scale=scale, NP=NP, NC=NC, **shapes,
                 RAW16=raw16, EXACT=_exact_mode(q, k, q, "bf16x3", C.interpreting()), FOLD=fold, QS=QS, KS=KS,
                 num_warps=solve_warps, **opts)
    apply = dict(q=qc, k=kc, v=vc, **gates, Gs=Gs, Ve=Ve, Qe=Qe, state=initial_state, state_idx=idx, o=o, T=T,
                 scale=scale, NP=NP, **shapes, V=V, BV=BV, STATE_VK=C.state_vk(initial_state), FOLD=fold,
                 QS=QS, KS=KS, VS=VS, num_warps=num_warps, **opts)
    parts = (bind(_gdn_wy_blocked_diag_kernel, (NC, B * HV), diag),
             bind(_gdn_wy_blocked_solve_kernel, (NC, B * HV), solve),
             bind(_gdn_wy_blocked_apply_kernel, (C.cdiv(V, BV), B * HV, NC), apply))

    def launch():
        for part in parts:
            part()
    launch.parts = parts  # each kernel alone (the benchmarks time them apart)
    launch.scratch = (Gs, Wd, Ve) + ((Qe,) if fold else ())
    return launch, o
