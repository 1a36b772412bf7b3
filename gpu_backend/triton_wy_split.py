"""The tree-masked WY form in two kernels: the value-independent half once per (sequence, value
head), the rest once per V tile. Same mathematics as ``triton_gdn._gdn_wy_kernel`` (its docstring
and the README derive it; twin: oracle.gdn_tree_verify); the one-kernel form recomputes K.K^T,
Q.K^T and the triangular solve in every V tile of a head.

solve   grid (B * HV,): for the draft block (nodes 1..T-1, at most 64) builds the path decays
        A_t = exp(G_t), the strictly-lower N = -L and the inverse of (I + L) by doubling,
          W = (I - N)^-1 = (I + N)(I + N^2)(I + N^4)...   (N nilpotent below the tree depth),
        and P = M o D o (Q K^T) scale, and stores W, P [BT, BT] and A [BT] (fp32 scratch).
        (A solve by 16-row block forward substitution was tried and measured slower at every shape:
        RESULTS.md; the code is in the history at 21a9c3b.)
        K.K^T and Q.K^T take the raw 16-bit q, k into one MMA (products exact in fp32) and divide
        by the l2 norms after the product; fp32 inputs use three-pass tf32 (tf32x3) like the rest.
apply   grid (V tiles, B * HV): the root's recurrent step S_r (as the one-kernel form), then
          U = W diag(beta) (V - diag(A) K S_r),   O = diag(A) Q S_r scale + P U.

The solve costs 2 (rounds - 1) products of [BT, BT] per head instead of 2 rounds per V tile.

fold    (plan_wy_split's fold) the per-head kernel also turns W, P, the gates and K into the output's weights
        on S_r and on v (Qe [BT, K], Ve [BT, BT]): O = Qe S_r + Ve V, two products per V tile.
root    (fold_root, bf16x3's default) the root's recurrent step is folded into those weights too (Qe', the
        weights c of v_0, and q_0', c_0 for the root's own output), so the per-V-tile kernel multiplies the
        committed state S itself: O = Qe' S + Ve V + c v_0^T (derivation in _fold_weights).
head    (plan_wy_split's head) one program per head makes those weights and applies them to every V tile
        itself (_gdn_wy_fold_head_kernel): one launch, and no scratch written by one grid and read back by the
        next.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import checks
from ddsim.gpu_backend import triton_helpers as h
from ddsim.gpu_backend.launch import bind

try:  # grid dependency control (programmatic dependent launch), Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: pdl is refused by plan_wy_split
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _raw_block(ptr, rows, m, head, o_k, mk, NH: tl.constexpr, D: tl.constexpr, L2NORM: tl.constexpr,
               RS: tl.constexpr):
    """Rows [BT, BK] of q or k [B*T, NH, D] (row r at r * RS) in their own dtype (16-bit inputs stay 16-bit: one exact
    MMA per product, half the shared memory) and their l2 norms [BT] (ones without L2NORM)."""
    x = h.raw_rows(ptr, rows[:, None], head, o_k[None, :], m[:, None] & mk[None, :], NH, D, RS)
    if L2NORM:
        r = tl.sqrt(tl.sum(x.to(tl.float32) * x.to(tl.float32), 1) + 1e-6)
    else:
        r = tl.full([x.shape[0]], 1.0, tl.float32)
    return x, r


@triton.jit
def _gram(a, b, ra, rb, RAW16: tl.constexpr, PRECISION: tl.constexpr):
    """a b^T [Ra, Rb] in fp32, each entry divided by ra_i rb_j (the rows' l2 norms, or ones): multiplied by
    their reciprocals, Ra + Rb divisions instead of Ra Rb (a tenth of the fold kernel's instructions, compiled
    for sm_90). RAW16: a, b are 16-bit (products exact in fp32: one MMA); else fp32 in ``PRECISION``."""
    if RAW16:
        ab = tl.dot(a, tl.trans(b))
    else:
        ab = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision=PRECISION)
    return ab * (1.0 / ra)[:, None] * (1.0 / rb)[None, :]


@triton.jit
def _solve_prologue(q, k, g, beta, A_log, dt_bias, mask, i_bh, T, H: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, FUSED: tl.constexpr, L2NORM: tl.constexpr,
                    RAW16: tl.constexpr, PRECISION: tl.constexpr, QS: tl.constexpr, KS: tl.constexpr):
    """What both per-head kernels start from, for the draft block of (sequence, value head) i_bh: the
    offsets o_t [BT], o_k [BK]; the raw q, k rows [BT, BK] (kept 16-bit: registers) and their l2 norms
    rq, rk [BT]; beta [BT]; the path log-decays G [BT]; D = A_t / A_j on ancestors-or-self and the
    mask anc [BT, BT]; N = -L [BT, BT]. _prologue_reads, then _prologue_values: a kernel with reads of its own
    issues them between the two."""
    reads = _prologue_reads(q, k, g, beta, A_log, dt_bias, mask, i_bh, T, H, HV, K, BT, BK, FUSED, QS, KS)
    return _prologue_values(reads, FUSED, L2NORM, RAW16, PRECISION)


@triton.jit
def _prologue_reads(q, k, g, beta, A_log, dt_bias, mask, i_bh, T, H: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, FUSED: tl.constexpr, QS: tl.constexpr,
                    KS: tl.constexpr):
    """_solve_prologue's reads, all issued before its first reduction (the norms' products: a barrier, after which a
    read waits a memory round trip of its own; the gates and the mask were read after it, compiled for sm_90)."""
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    mt = o_t < T - 1
    b0 = (i_b * T + 1).to(tl.int64)  # the first draft row: a 64-bit scalar base, 32-bit offsets from it
    m2 = mt[:, None] & (o_k < K)[None, :]
    # both rows loaded before either norm (this order is the compiled kernel the H200 figures are of;
    # _raw_block's load-then-norm per operand compiles to more spills under a register cap)
    if QS == H * K and KS == H * K:  # contiguous rows (_common.rows_of): one set of offsets for both
        qk = (b0 * H + i_h) * K
        qk_tile = o_t[:, None] * (H * K) + o_k[None, :]
        b_k = tl.load(k + qk + qk_tile, mask=m2, other=0.0)
        b_q = tl.load(q + qk + qk_tile, mask=m2, other=0.0)
    else:  # views of a fused projection's rows: each its own row stride
        b_k = tl.load(k + b0 * KS + i_h * K + (o_t[:, None] * KS + o_k[None, :]), mask=m2, other=0.0)
        b_q = tl.load(q + b0 * QS + i_h * K + (o_t[:, None] * QS + o_k[None, :]), mask=m2, other=0.0)
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    gb = b0 * HV + i_hv
    raw_g, raw_b = h.raw_gates(g + gb, beta + gb, o_t * HV, mt, True)
    anc = tl.load(mask + b0 * T + 1 + (o_t[:, None] * T + o_t[None, :]), mask=mt[:, None] & mt[None, :], other=0) != 0
    return o_t, o_k, mt, b_q, b_k, neg_A, bias, raw_g, raw_b, anc


@triton.jit
def _prologue_values(reads, FUSED: tl.constexpr, L2NORM: tl.constexpr, RAW16: tl.constexpr,
                     PRECISION: tl.constexpr):
    """_solve_prologue's values from _prologue_reads' tuple."""
    o_t, o_k, mt, b_q, b_k, neg_A, bias, raw_g, raw_b, anc = reads
    BT: tl.constexpr = o_t.shape[0]
    if L2NORM and RAW16:  # the squared norms from the diagonals of exact MMAs (fp32 sums of exact products, as
        # tl.sum's; K K^T is _gram's below, made once): no fp32 copy of the rows, no reduction across 128 columns
        eye = o_t[:, None] == o_t[None, :]
        rk = tl.sqrt(tl.sum(tl.where(eye, tl.dot(b_k, tl.trans(b_k)), 0.0), 1) + 1e-6)
        rq = tl.sqrt(tl.sum(tl.where(eye, tl.dot(b_q, tl.trans(b_q)), 0.0), 1) + 1e-6)
    elif L2NORM:
        rk = tl.sqrt(tl.sum(b_k.to(tl.float32) * b_k.to(tl.float32), 1) + 1e-6)
        rq = tl.sqrt(tl.sum(b_q.to(tl.float32) * b_q.to(tl.float32), 1) + 1e-6)
    else:
        rk = tl.full([BT], 1.0, tl.float32)
        rq = tl.full([BT], 1.0, tl.float32)
    b_g, b_beta = h.gate_values(raw_g, raw_b, neg_A, bias, FUSED)
    b_g = tl.where(mt, b_g, 0.0)
    b_beta = tl.where(mt, b_beta, 0.0)
    G = tl.sum(tl.where(anc, b_g[None, :], 0.0), 1)  # [BT] log-decay along each path below the root
    D = tl.where(anc, tl.exp(G[:, None] - G[None, :]), 0.0)  # A_t / A_j on ancestors-or-self
    strict = anc & (o_t[:, None] != o_t[None, :])
    N = tl.where(strict, -b_beta[:, None] * D * _gram(b_k, b_k, rk, rk, RAW16, PRECISION), 0.0)  # -L
    return o_t, o_k, b_q, b_k, rq, rk, b_beta, G, D, anc, N


@triton.jit(**C.ROUNDS_AS_VALUE)
def _gdn_wy_solve_kernel(
    q, k, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self of the mode's source parents
    W, P, Ad,  # out: [B, HV, BT, BT] x2 fp32, [B, HV, BT] fp32
    T, scale, NSTEP,
    depths,  # DEPTHS: [B, NPD] int32 each tree's depth per block (a device plan's): h.tree_depth
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, RAW16: tl.constexpr, PRECISION: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr,  # q's and k's row strides (_common.rows_of)
    DEPTHS: tl.constexpr = False, NPD: tl.constexpr = 1,
):
    i_bh = tl.program_id(0)
    depth = h.tree_depth(depths, i_bh // HV, NPD, DEPTHS)
    o_t, o_k, b_q, b_k, rq, rk, b_beta, G, D, anc, N = _solve_prologue(
        q, k, g, beta, A_log, dt_bias, mask, i_bh, T, H, HV, K, BT, BK, FUSED, L2NORM, RAW16, PRECISION, QS, KS)
    Pm = tl.where(anc, D * _gram(b_q, b_k, rq, rk, RAW16, PRECISION), 0.0) * scale
    NSTEP = h.solve_rounds(NSTEP, depth, DEPTHS, 0)
    base = i_bh.to(tl.int64) * BT * BT
    tl.store(P + base + o_t[:, None] * BT + o_t[None, :], Pm)
    tl.store(Ad + i_bh.to(tl.int64) * BT + o_t, tl.exp(G))
    X = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0) + N  # W = (I - N)^-1 = (I + N)(I + N^2)(I + N^4)...
    for _ in range(1, NSTEP):  # X <- (I + N^(2^r)) X
        N = tl.dot(N, N, input_precision=PRECISION)
        X = X + tl.dot(N, X, input_precision=PRECISION)
    tl.store(W + base + o_t[:, None] * BT + o_t[None, :], X)


@triton.jit
def _gdn_wy_apply_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    W, P, Ad,  # from the solve kernel
    state, state_idx, o,
    T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr, STATE_VK: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
):
    i_b, i_h, i_hv, o_t, o_k, o_v, mk, mv, _, _, s0, mt, rows, b_q, b_k, b_v, _, b_beta = h.wy_tile(
        q, k, v, g, beta, A_log, dt_bias, state, state_idx, o, T, scale, H, HV, K, V, BT, BK, BV, FUSED, L2NORM,
        STATE_VK, QS, KS, VS)
    b_v = b_v.to(tl.float32)
    i_bh = i_b * HV + i_hv
    base = i_bh.to(tl.int64) * BT * BT
    Wm = tl.load(W + base + o_t[:, None] * BT + o_t[None, :])
    Pm = tl.load(P + base + o_t[:, None] * BT + o_t[None, :])
    A = tl.load(Ad + i_bh.to(tl.int64) * BT + o_t)
    R = b_beta[:, None] * (b_v - A[:, None] * tl.dot(b_k, s0, input_precision=PRECISION))
    U = tl.dot(Wm, R, input_precision=PRECISION)
    b_o = A[:, None] * tl.dot(b_q * scale, s0, input_precision=PRECISION) + tl.dot(Pm, U, input_precision=PRECISION)
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=mt[:, None] & mv[None, :])


@triton.jit
def _tf32_hi(x):
    """x rounded to the nearest tf32 (10-bit mantissa; x - hi is exact in fp32, at most 2^-11 |x|)."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _dot_exact_rhs(a, b, acc, EXACT: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a b for a [M, R] fp32 and b [R, N] in its own dtype, to fp32-level precision (EXACT 3: to bf16x3's). EXACT 1: b
    is 16-bit, exact in tf32, so two tf32 MMAs (a's tf32 head and its remainder) replace tf32x3's
    three; EXACT 2: b is bf16, and a is split into three bf16 parts (8 + 8 + 8 significant bits) for
    three bf16 MMAs at twice tf32's rate; EXACT 3: the same in two parts (16 bits, about 2^-17: the
    precision of Triton's bf16x3 beside it, for a bf16 output); EXACT 0: ``PRECISION`` on fp32 operands.
    The MMAs accumulate onto acc, smallest part first (one accumulator live)."""
    if EXACT == 2:
        a1 = a.to(tl.bfloat16)
        r1 = a - a1.to(tl.float32)
        a2 = r1.to(tl.bfloat16)
        a3 = (r1 - a2.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(a1, b, tl.dot(a2, b, tl.dot(a3, b, acc)))
    elif EXACT == 3:
        a1 = a.to(tl.bfloat16)
        return tl.dot(a1, b, tl.dot((a - a1.to(tl.float32)).to(tl.bfloat16), b, acc))
    elif EXACT == 1:
        bf = b.to(tl.float32)
        hi = _tf32_hi(a)
        return tl.dot(hi, bf, tl.dot(a - hi, bf, acc, input_precision="tf32"), input_precision="tf32")
    else:
        return tl.dot(a, b.to(tl.float32), acc, input_precision=PRECISION)


@triton.jit
def _fold_weights(q, k, g, beta, A_log, dt_bias, mask, i_bh, T, scale, NSTEP, depth, DEPTHS: tl.constexpr,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  FUSED: tl.constexpr, L2NORM: tl.constexpr, RAW16: tl.constexpr, EXACT: tl.constexpr,
                  PRECISION: tl.constexpr, ROOT: tl.constexpr,
                  QS: tl.constexpr, KS: tl.constexpr):
    """The output's weights of head i_bh's draft block: (o_t [BT], o_k [BK], Qe [BT, BK], Ve [BT, BT], c [BT],
    q_0' [BK], c_0), with O = Qe S_r + Ve V, or with ROOT O = Qe' S + Ve V + c v_0^T and o_0 = S^T q_0' + c_0 v_0
    (S the committed state; without ROOT c, q_0', c_0 are zeros). NSTEP doubling rounds, or with DEPTHS the sequence's
    own from its tree's depth (h.tree_depth's, read by the caller with its first reads)."""
    # O = diag(A) Q S_r scale + P W diag(beta) (V - diag(A) K S_r) = Qe S_r + Ve V with Y = P W:
    #   Qe = diag(A scale / rq) Q_raw - Y diag(beta A / rk) K_raw,   Ve = Y diag(beta)
    # ROOT: the root's step S_r = a S + k_0 u^T, u = beta_0 (v_0 - a S^T k_0) (a = exp(g_0), S the committed
    # state) folded in too, so that the per-V-tile kernel multiplies S itself and takes no recurrent step:
    #   Qe S_r = Qe' S + c v_0^T,   Qe' = a (Qe - c k_0^T),   c = beta_0 Qe k_0,
    #   o_0 = S_r^T q_0 scale = S^T q_0' + c_0 v_0,   q_0' = a (q_0 scale - c_0 k_0),   c_0 = beta_0 k_0.q_0 scale
    # every read first, before the first reduction: one memory round trip (read after the doubling chain, the
    # root's took three more, compiled for sm_90); the root's before the block's, as a barrier (the ancestor mask's
    # layout conversion) follows the block's last read at once
    if ROOT:
        i_b, i_hv = i_bh // HV, i_bh % HV
        r0 = (i_b * T).to(tl.int64)
        o_k0 = tl.arange(0, BK)
        raw_q0 = h.raw_rows(q, r0, i_hv // (HV // H), o_k0, o_k0 < K, H, K, QS)
        raw_k0 = h.raw_rows(k, r0, i_hv // (HV // H), o_k0, o_k0 < K, H, K, KS)
        raw_g0, raw_b0 = h.raw_gates(g, beta, r0 * HV + i_hv, 0, False)
    reads = _prologue_reads(q, k, g, beta, A_log, dt_bias, mask, i_bh, T, H, HV, K, BT, BK, FUSED, QS, KS)
    o_t, o_k, b_q, b_k, rq, rk, b_beta, G, D, anc, N = _prologue_values(reads, FUSED, L2NORM, RAW16, PRECISION)
    A = tl.exp(G)
    Y = tl.where(anc, D * _gram(b_q, b_k, rq, rk, RAW16, PRECISION), 0.0) * scale  # P
    # Y = P (I + N)(I + N^2)(I + N^4)... = P W. A round's two products read the same N, so they issue
    # together: the chain is NSTEP products deep (squaring first, then multiplying, made it 2 NSTEP - 1
    # and measured slower: RESULTS.md)
    NSTEP = h.solve_rounds(NSTEP, depth, DEPTHS, 0)
    for _ in range(1, NSTEP):
        N2 = tl.dot(N, N, input_precision=PRECISION)
        Y = tl.dot(Y, N, Y, input_precision=PRECISION)
        N = N2
    Y = tl.dot(Y, N, Y, input_precision=PRECISION)
    Z = Y * (b_beta * A / rk)[None, :]
    # Z in two bf16 parts (EXACT 3) where bf16x3 would take three: Y carries the doubling chain's bf16x3 error
    # (about 2^-16) already, and the output is bf16
    Qm = _dot_exact_rhs(-Z, b_k, (A * scale / rq)[:, None] * b_q.to(tl.float32), 3 if EXACT == 2 else EXACT,
                        PRECISION)
    if ROOT:
        q0 = h.normed(raw_q0, L2NORM, 0)  # [BK] fp32
        k0 = h.normed(raw_k0, L2NORM, 0)
        neg_A, bias = reads[5], reads[6]  # _prologue_reads' gate parameters (read once, with the block's)
        g0, beta0 = h.gate_values(raw_g0, raw_b0, neg_A, bias, FUSED)
        a0 = tl.exp(g0)
        c = beta0 * tl.sum(Qm * k0[None, :], 1)  # [BT]
        Qm = a0 * (Qm - c[:, None] * k0[None, :])
        q0 = q0 * scale
        c0 = beta0 * tl.sum(k0 * q0, 0)
        q0 = a0 * (q0 - c0 * k0)
    else:
        c = tl.zeros([BT], tl.float32)
        q0 = tl.zeros([BK], tl.float32)
        c0 = 0.0
    return o_t, o_k, Qm, Y * b_beta[None, :], c, q0, c0


@triton.jit(**C.ROUNDS_AS_VALUE)
def _gdn_wy_fold_kernel(
    q, k, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self of the mode's source parents
    Qe, Ve,  # out: [B, HV, BT, BK] fp32 (the output's weights on S_r, or with ROOT on S), [B, HV, BT, BT] fp32 (on v)
    Cv, Q0, C0,  # out (ROOT): [B, HV, BT], [B, HV, BK], [B, HV] fp32: the weights of v_0 and of the root's o_0
    ready,  # PDL 1: [B * HV] int32, zeroed before each launch, set to 1 once this head's Qe, Ve are written
    T, scale, NSTEP,
    depths,  # DEPTHS: [B, NPD] int32 each tree's depth per block (a device plan's): h.tree_depth
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, RAW16: tl.constexpr, EXACT: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr, ROOT: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr,  # q's and k's row strides (_common.rows_of)
    DEPTHS: tl.constexpr = False, NPD: tl.constexpr = 1,
):
    if PDL:  # the apply kernel may start its independent prologue now (it waits before reading Qe, Ve)
        gdc_launch_dependents()
    i_bh = tl.program_id(0)
    depth = h.tree_depth(depths, i_bh // HV, NPD, DEPTHS)
    o_t, o_k, Qm, Vm, c, q0, c0 = _fold_weights(q, k, g, beta, A_log, dt_bias, mask, i_bh, T, scale, NSTEP, depth,
                                                DEPTHS, H, HV, K, BT, BK, FUSED, L2NORM, RAW16, EXACT, PRECISION, ROOT,
                                                QS, KS)
    base = i_bh.to(tl.int64) * BT
    if ROOT:
        tl.store(Cv + base + o_t, c)
        tl.store(Q0 + i_bh.to(tl.int64) * BK + o_k, q0)
        tl.store(C0 + i_bh, c0)
    tl.store(Qe + (base + o_t[:, None]) * BK + o_k[None, :], Qm)
    tl.store(Ve + (base + o_t[:, None]) * BT + o_t[None, :], Vm)
    if PDL == 1:  # every thread's stores done (barrier), then published at GPU scope (release is cumulative)
        tl.debug_barrier()
        tl.atomic_xchg(ready + i_bh, 1, sem="release", scope="gpu")


@triton.jit
def _root_tile_v(v, r0, tile, o_v, mt, mv):
    """One V tile's v of the draft rows [BT, BV] (in v's dtype) and of the root, v_0 [BV] (fp32): r0 the root's
    row of v at this head (a 64-bit scalar), tile the draft rows' 32-bit offsets from it (_draft_tile)."""
    b_v = tl.load(v + r0 + tile, mask=mt[:, None] & mv[None, :], other=0.0)
    v0 = tl.load(v + r0 + o_v, mask=mv, other=0.0).to(tl.float32)
    return b_v, v0


@triton.jit
def _store_root_tile(o, acc, o0, r0, tile, o_v, mt, mv):
    """One V tile's outputs in o's dtype: the draft rows' O [BT, BV] and the root's o_0 [BV] (_root_tile_v's
    addresses)."""
    tl.store(o + r0 + tile, acc.to(o.dtype.element_ty), mask=mt[:, None] & mv[None, :])
    tl.store(o + r0 + o_v, o0.to(o.dtype.element_ty), mask=mv)


@triton.jit
def _draft_tile(i_b, i_hv, T, o_t, o_v, HV: tl.constexpr, V: tl.constexpr):
    """The root's row of v and o at head i_hv (a 64-bit scalar) and the draft rows' 32-bit offsets [BT, BV] from
    it: no 64-bit offset tensor stays live across the products (at 255 registers the head kernel's spilled, and
    its loads waited on their reloads: Nsight Compute, RESULTS.md)."""
    return (i_b * T).to(tl.int64) * (HV * V) + i_hv * V, (o_t[:, None] + 1) * (HV * V) + o_v[None, :]


@triton.jit
def _v_tile(r0, tile, i_b, i_hv, T, o_t, o_v, HV: tl.constexpr, V: tl.constexpr, VS: tl.constexpr):
    """_draft_tile's addresses (r0, tile: o's, and v's where its rows are contiguous) for v, whose row r lies at
    r * VS (_common.rows_of): o's own where VS is HV * V, else made from VS."""
    if VS == HV * V:
        return r0, tile
    return (i_b * T).to(tl.int64) * VS + i_hv * V, (o_t[:, None] + 1) * VS + o_v[None, :]


@triton.jit(**C.ROUNDS_AS_VALUE)
def _gdn_wy_fold_head_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self of the mode's source parents
    state, state_idx, o,
    T, scale, NSTEP,
    depths,  # DEPTHS: [B, NPD] int32 each tree's depth per block (a device plan's): h.tree_depth
    NWHOLE,  # MIXED: the heads with a program of their own (the first NWHOLE); the rest take a program a V tile
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, FUSED: tl.constexpr, L2NORM: tl.constexpr, RAW16: tl.constexpr, EXACT: tl.constexpr,
    PRECISION: tl.constexpr, STATE_VK: tl.constexpr, SPLIT_V: tl.constexpr, MIXED: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
    DEPTHS: tl.constexpr = False, NPD: tl.constexpr = 1,
):
    # The folded form with the root's step folded in (fold_root) in one program per head: the weights stay in
    # the program (registers) and it applies them to each V tile of the committed state S itself,
    #   O = Qe' S + Ve V + c v_0^T,   o_0 = S^T q_0' + c_0 v_0,
    # so no scratch is written and read back by a second grid, and there is one launch. (Passing the weights
    # through global memory inside the program measured slower: RESULTS.md.)
    # SPLIT_V: a program per (head, V tile) (grid B HV V / BV), each making the weights and applying them to its
    # own V tile (a tile called directly: one loop over runtime bounds for both forms compiled to more spills
    # offline, 448 B against 96).
    # MIXED: the first NWHOLE programs a head each, then a program per (head, V tile) for the rest, one loop over
    # runtime bounds (HEAD_MIXED: compiled for sm_90 at 8 x 65, 8 B spilled; 448 B before the reads were
    # issued first)
    pid = tl.program_id(0)
    NT: tl.constexpr = (V + BV - 1) // BV
    if MIXED:
        tail = pid >= NWHOLE
        i_bh = tl.where(tail, NWHOLE + (pid - NWHOLE) // NT, pid)
        t0 = tl.where(tail, ((pid - NWHOLE) % NT) * BV, 0)  # the program's V columns t0..t1
        t1 = tl.where(tail, t0 + BV, V)
    else:
        i_bh = pid // NT if SPLIT_V else pid
    i_b, i_hv = i_bh // HV, i_bh % HV
    depth = h.tree_depth(depths, i_b, NPD, DEPTHS)
    slot, live = h.pool_slot(state_idx, i_b)  # read with the weights' reads (after them, the state's read waited two
    # trips); a padded row (slot -1) reads a zero state
    o_t, o_k, Qm, Vm, c, q0, c0 = _fold_weights(q, k, g, beta, A_log, dt_bias, mask, i_bh, T, scale, NSTEP, depth,
                                                DEPTHS, H, HV, K, BT, BK, FUSED, L2NORM, RAW16, EXACT, PRECISION, True,
                                                QS, KS)
    if MIXED:
        for vt in range(t0, t1, BV):
            _head_tile(v, state, o, Qm, Vm, c, q0, c0, slot, live, i_b, i_hv, vt, T, o_t, o_k, HV, K, V, BV, EXACT,
                       PRECISION, STATE_VK, VS)
    elif SPLIT_V:
        _head_tile(v, state, o, Qm, Vm, c, q0, c0, slot, live, i_b, i_hv, (pid % NT) * BV, T, o_t, o_k, HV, K, V, BV,
                   EXACT, PRECISION, STATE_VK, VS)
    else:
        for vt in range(0, V, BV):
            _head_tile(v, state, o, Qm, Vm, c, q0, c0, slot, live, i_b, i_hv, vt, T, o_t, o_k, HV, K, V, BV, EXACT,
                       PRECISION, STATE_VK, VS)


@triton.jit
def _head_tile(v, state, o, Qm, Vm, c, q0, c0, slot, live, i_b, i_hv, vt, T, o_t, o_k, HV: tl.constexpr, K: tl.constexpr,
               V: tl.constexpr, BV: tl.constexpr, EXACT: tl.constexpr, PRECISION: tl.constexpr,
               STATE_VK: tl.constexpr, VS: tl.constexpr):
    """The head kernel's V tile at columns vt..vt+BV: O = Qe' S + Ve V + c v_0^T and o_0 = S^T q_0' + c_0 v_0,
    stored (the addresses made here, 32-bit past scalar bases: _draft_tile). The product Ve V first: Triton moves
    v into shared memory for it (a barrier) as soon as v arrives, and the state's read follows, a round trip of its
    own. (Qe' S first, o_0 stored before either product, read v, v_0 and the state in one round, but spilled and
    measured no faster on the H200: RESULTS.md.)"""
    mt = o_t < T - 1
    o_v = vt + tl.arange(0, BV)
    mv = o_v < V
    r0, tile = _draft_tile(i_b, i_hv, T, o_t, o_v, HV, V)
    rv, tv = _v_tile(r0, tile, i_b, i_hv, T, o_t, o_v, HV, V, VS)
    b_v, v0 = _root_tile_v(v, rv, tv, o_v, mt, mv)  # [BT, BV], [BV]
    S = tl.load(h.state_ptrs32(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)  # [BK, BV]; a padded row's zero
    # Ve V with Ve in two bf16 parts (EXACT 3) where bf16x3 would take three: Qe' S beside it is Triton's
    # bf16x3, about 2^-16, and the output bf16; one MMA and a third of Ve's registers fewer a tile
    acc = tl.dot(Qm, S, _dot_exact_rhs(Vm, b_v, c[:, None] * v0[None, :], 3 if EXACT == 2 else EXACT, PRECISION),
                 input_precision=PRECISION)  # [BT, BV]
    _store_root_tile(o, acc, c0 * v0 + tl.sum(q0[:, None] * S, 0), r0, tile, o_v, mt, mv)


@triton.jit
def _wait_for_fold(ready, i_bh, PDL: tl.constexpr):
    """PDL 1: spin until head i_bh's fold program has published its weights (its ready flag, acquired); PDL 2:
    wait for the whole fold grid to finish, its writes visible (griddepcontrol.wait: no flags, no memset)."""
    if PDL == 1:
        while tl.atomic_add(ready + i_bh, 0, sem="acquire", scope="gpu") == 0:
            pass
    elif PDL == 2:
        gdc_wait()


@triton.jit
def _from_fold(ptrs, PDL: tl.constexpr):
    """A load of what the fold kernel wrote: with PDL by a grid still running, so read past L1 (.cg)."""
    if PDL:
        return tl.load(ptrs, cache_modifier=".cg")
    else:
        return tl.load(ptrs)


@triton.jit
def _gdn_wy_fold_apply_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    Qe, Ve, ready,  # from the fold kernel
    state, state_idx, o,
    T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, EXACT: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr, STATE_VK: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
):
    # Launched with programmatic dependent launch (PDL), this grid starts once every fold program has
    # started, and each program waits for its own head's fold program only (its ready flag), not for
    # the whole fold grid: the heads the fold's first wave finished are applied while its last wave
    # runs. (No deadlock: every fold program is resident or done before any program here starts.)
    # Everything before the wait overlaps the fold kernel: nothing there reads what it writes.
    i_b, i_h, i_hv, o_t, o_k, o_v, mk, mv, neg_A, bias, s0, mt, rows, _, _, b_v, _, _ = h.wy_tile(
        q, k, v, g, beta, A_log, dt_bias, state, state_idx, o, T, scale, H, HV, K, V, BT, BK, BV, FUSED, L2NORM,
        STATE_VK, QS, KS, VS)  # b_v [BT, BV] in v's dtype
    i_bh = i_b * HV + i_hv
    base = i_bh.to(tl.int64) * BT
    _wait_for_fold(ready, i_bh, PDL)
    Qm = _from_fold(Qe + (base + o_t[:, None]) * BK + o_k[None, :], PDL)
    Vm = _from_fold(Ve + (base + o_t[:, None]) * BT + o_t[None, :], PDL)
    b_o = tl.dot(Qm, s0, _dot_exact_rhs(Vm, b_v, tl.zeros([BT, BV], tl.float32), EXACT, PRECISION),
                 input_precision=PRECISION)
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=mt[:, None] & mv[None, :])


@triton.jit
def _gdn_wy_fold_root_apply_kernel(
    v, Qe, Ve, Cv, Q0, C0, ready,  # v [B*T, HV, V]; the rest from the fold kernel with ROOT
    state, state_idx, o,
    T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
    EXACT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr, STATE_VK: tl.constexpr,
    VS: tl.constexpr,  # v's row stride (_common.rows_of)
):
    # The per-V-tile half with the root's step folded into the weights (the fold kernel's ROOT):
    #   O = Qe' S + Ve V + c v_0^T,   o_0 = S^T q_0' + c_0 v_0,
    # S the committed state [K, BV], read in BKC-row chunks (no recurrent step needs it whole; the H200's
    # fastest chunk was all of K: RESULTS.md).
    i_v, i_b, i_hv, _ = h.head_coords(H, HV)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < V
    mt = o_t < T - 1
    r0, tile = _draft_tile(i_b, i_hv, T, o_t, o_v, HV, V)
    rv, tv = _v_tile(r0, tile, i_b, i_hv, T, o_t, o_v, HV, V, VS)
    b_v, v0 = _root_tile_v(v, rv, tv, o_v, mt, mv)
    slot, live = h.pool_slot(state_idx, i_b)  # a padded row (slot -1) reads a zero state
    i_bh = i_b * HV + i_hv
    base = i_bh.to(tl.int64) * BT
    if BKC >= BK:
        # all of K in one chunk: S [BK, BV] read before the wait, so that under PDL the state's read (the
        # kernel's bytes) overlaps the fold grid's arithmetic; nothing read here is written by it
        o_k = tl.arange(0, BK)
        S = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                    mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)
        _wait_for_fold(ready, i_bh, PDL)
        Vm = _from_fold(Ve + (base + o_t[:, None]) * BT + o_t[None, :], PDL)
        c = _from_fold(Cv + base + o_t, PDL)
        c0 = _from_fold(C0 + i_bh, PDL)
        Qc = _from_fold(Qe + (base + o_t[:, None]) * BK + o_k[None, :], PDL)
        q0 = _from_fold(Q0 + i_bh.to(tl.int64) * BK + o_k, PDL)
        acc = tl.dot(Qc, S, _dot_exact_rhs(Vm, b_v, c[:, None] * v0[None, :], EXACT, PRECISION),
                     input_precision=PRECISION)
        o0 = c0 * v0 + tl.sum(q0[:, None] * S, 0)
    else:
        _wait_for_fold(ready, i_bh, PDL)
        Vm = _from_fold(Ve + (base + o_t[:, None]) * BT + o_t[None, :], PDL)
        c = _from_fold(Cv + base + o_t, PDL)
        c0 = _from_fold(C0 + i_bh, PDL)
        acc = _dot_exact_rhs(Vm, b_v, c[:, None] * v0[None, :], EXACT, PRECISION)
        o0 = c0 * v0
        for kc in range(0, BK, BKC):
            o_k = kc + tl.arange(0, BKC)
            S = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                        mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)
            Qc = _from_fold(Qe + (base + o_t[:, None]) * BK + o_k[None, :], PDL)
            q0 = _from_fold(Q0 + i_bh.to(tl.int64) * BK + o_k, PDL)
            acc = tl.dot(Qc, S, acc, input_precision=PRECISION)
            o0 += tl.sum(q0[:, None] * S, 0)
    _store_root_tile(o, acc, o0, r0, tile, o_v, mt, mv)


# The folded form's defaults by dot precision: the apply kernel's V tile, the register caps of the
# (per-head, per-V-tile) kernels (None for Triton's choice) and whether the root's step is folded into the
# weights (fold_root); the H200 sweeps' choices at 8 x 65 and 32 x 65 (benchmarks/bench_wy_fold.py,
# RESULTS.md). With tf32x3 products a 168 cap lets an SM hold three 4-warp programs of 32-wide tiles (212
# registers uncapped: two); with bf16x3 ones 64-wide tiles uncapped measured fastest at both shapes (80.7 /
# 234.4 us against 83.2 / 253.2), and the root folded in with all of K in one chunk 76.5 / 223.5 against
# 81.1 / 235.4 (fold_root was not measured with tf32x3). The per-head kernel spills under any cap (255
# registers uncapped), so it has none. Other precisions take tf32x3's.
FOLD_DEFAULTS = {"tf32x3": (32, (None, 168), False), "bf16x3": (64, (None, None), True)}
# The one-program folded form (head): its V tile and the stages Triton pipelines its V-tile loop's loads over, the
# H200 sweep's choice at 1 x 16 to 32 x 65 (benchmarks/bench_wy_head.py, RESULTS.md; 32-wide tiles faulted there
# with an illegal address under Triton 3.6 at 8 x 65, which compute-sanitizer places in a shared-memory read Triton
# laid out for the product Ve V: refused, see plan_wy_split)
HEAD_BLOCK_V, HEAD_STAGES = 64, 1
# Whether the head kernel runs a program per (head, V tile), each making the weights itself, instead of a program
# per head: None, _head_split's choice from the SMs; False, True. A program per head leaves most SMs idle for one
# sequence (19.5 against 26.7 us at 1 x 65 on the H200) and two (22.0 against 27.1 at 2 x 65), while a batch split
# took 38.2 against 31.8 at 4 x 65 and 26% longer at 32 x 65 (RESULTS.md).
HEAD_SPLIT_V = None
# Whether a batch whose heads design auto leaves whole (_head_split) splits its last, partial wave's heads along V
# when their programs fit in one wave (_head_mixed), in the same grid: 46.7 against 53.6 us at 8 x 65 on the H200
# (RESULTS.md; 8 B spilled). Shapes it does not split (1 x 65 splits every head, 32 x 65's last wave would
# take two) launch as before
HEAD_MIXED = True
# Head programs an SM holds at once: the head kernel compiles to 255 registers at 4 warps (kernel_registers.py), two
# programs' worth of the 64 K a Hopper or Blackwell SM has
HEAD_PROGRAMS_PER_SM = 2


def _head_split(heads: int, tiles: int, slots: int) -> bool:
    """Whether the head kernel splits ``heads`` (sequence, value head) pairs into a program per V tile (``tiles``
    of them): when the split programs fit in one wave of the ``slots`` the GPU holds at once. Past that, a split
    head makes its weights once a tile for nothing: whole heads, but for the last, partial wave's (HEAD_MIXED,
    _head_mixed)."""
    return heads * tiles <= slots


def _head_mixed(heads: int, tiles: int, slots: int) -> int:
    """How many of ``heads`` keep a program of their own when the last, partial wave's heads are split along V
    (HEAD_MIXED): all but that wave's, when their ``tiles`` programs a head fit in one wave of the ``slots``; else
    all (splitting them would add a wave)."""
    tail = heads % slots
    return heads - tail if tail * tiles <= slots else heads


_SMS: dict = {}


def _slots(device) -> int:
    """Head programs ``device`` holds at once (HEAD_PROGRAMS_PER_SM a multiprocessor; Triton's interpreter: an
    H200's 132, so that it plans what the device would)."""
    if device.type != "cuda":
        return 132 * HEAD_PROGRAMS_PER_SM
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i] * HEAD_PROGRAMS_PER_SM


MAXNREG = None  # a (per-head, per-V-tile) pair here overrides FOLD_DEFAULTS' caps (the benchmarks set it)


def plan_wy_split(q, k, v, g_, b_, al, db, *, fused, mask, nstep, state, idx, scale, T, B, H, HV, K, V,
                  use_qk_l2norm, precision, poison, block_v=None, num_warps=4, solve_warps=4, fold=False,
                  exact16="bf16x3", pdl=False, fold_root=None, block_k=None, head=False, rounds):
    """Launch plan of both kernels for checked inputs (called by triton_gdn.plan_wy): (launch, o).
    fold: the solve kernel folds W, P, the gates and K into the output's weights on S_r and on v
    (Qe [BT, K], Ve [BT, BT]), so the apply kernel does two products instead of four. pdl (fold
    only; compiled kernels on Hopper or later): the apply kernel is launched with programmatic
    dependent launch and runs its root step and loads while the fold kernel finishes, each program waiting on its
    head's ready flag (True) or for the whole fold grid ("grid"; _pdl). fold_root (fold only;
    None: FOLD_DEFAULTS' choice for the precision): the fold kernel folds the root's step in too (ROOT), and
    the per-V-tile kernel (_gdn_wy_fold_root_apply_kernel) multiplies the committed state itself, in
    block_k-row chunks of K (None: all of K). head (fold only): one program per head computes the weights with the
    root folded in and applies them to every V tile itself (_gdn_wy_fold_head_kernel: one launch, no scratch);
    it takes no pdl, fold_root=False, block_k or block_v (its V tile is HEAD_BLOCK_V). rounds: the solves' depths,
    NPD and DEPTHS (triton_gdn.device_rounds: each sequence's rounds from a device plan's depths, or nstep's)."""
    if head and (not fold or pdl or fold_root is False or block_k is not None or block_v is not None):
        raise ValueError("head: the one-program folded form takes fold=True and no pdl, fold_root=False, block_k or "
                         "block_v")
    if block_k is not None and (block_k < 16 or block_k & (block_k - 1)):
        raise ValueError(f"block_k: expected a power of two >= 16, got {block_k}")
    o = C.alloc((B, T, HV, V), v.dtype, v.device, poison)
    BT, BK = C.next_pow2(T - 1), max(16, C.next_pow2(K, 1))
    fold_bv, caps, root = FOLD_DEFAULTS.get(precision, FOLD_DEFAULTS["tf32x3"])
    caps = caps if MAXNREG is None else MAXNREG
    BV = C.v_tile(HEAD_BLOCK_V if head else block_v or (fold_bv if fold else 32), V, BT)
    # Triton's interpreter multiplies bf16 tiles as raw bits (fp16 is right): there bf16 takes the fp32 path
    raw16 = k.dtype == q.dtype and (q.dtype == torch.float16 or (q.dtype == torch.bfloat16 and not C.interpreting()))
    rows = C.qkv_rows(q, k, v)  # q, k, v as given where their rows are, else contiguous copies, and their row strides
    qc, kc, vc = rows["q"], rows["k"], rows["v"]
    qks, strides = dict(QS=rows["QS"], KS=rows["KS"]), dict(QS=rows["QS"], KS=rows["KS"], VS=rows["VS"])
    if fold:  # (head among them)
        exact = _exact_mode(q, k, v, exact16, C.interpreting())
        if head:
            return _plan_head(dict(q=qc, k=kc, v=vc, g=g_, beta=b_, A_log=al, dt_bias=db, mask=mask, **strides,
                                   state=state, state_idx=idx, o=o, T=T, scale=scale, NSTEP=nstep, H=H, HV=HV, K=K,
                                   V=V, BT=BT, BK=BK, BV=BV, FUSED=fused, L2NORM=use_qk_l2norm, RAW16=raw16,
                                   EXACT=exact, PRECISION=precision, STATE_VK=C.state_vk(state), **rounds,
                                   num_warps=solve_warps, num_stages=HEAD_STAGES), B * HV, caps[0], v.device), o
        return _plan_fold(qc, kc, vc, g_, b_, al, db, strides=strides, fused=fused, mask=mask, nstep=nstep, state=state, idx=idx,
                          scale=scale, T=T, B=B, H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, raw16=raw16,
                          exact=exact, use_qk_l2norm=use_qk_l2norm, precision=precision, o=o, num_warps=num_warps,
                          solve_warps=solve_warps, pdl=_pdl(pdl), caps=caps,
                          root=root if fold_root is None else bool(fold_root), BKC=min(block_k or BK, BK),
                          rounds=rounds)
    Wm = C.scratch((B, HV, BT, BT), torch.float32, v.device)
    Pm = C.scratch(Wm.shape, torch.float32, v.device)
    Ad = C.scratch((B, HV, BT), torch.float32, v.device)
    solve = dict(q=qc, k=kc, g=g_, beta=b_, A_log=al, dt_bias=db, mask=mask, W=Wm, P=Pm, Ad=Ad, T=T, scale=scale,
                 NSTEP=nstep, **rounds, H=H, HV=HV, K=K, BT=BT, BK=BK, FUSED=fused, L2NORM=use_qk_l2norm,
                 RAW16=raw16, PRECISION=precision, num_warps=solve_warps, **qks)
    apply = dict(q=qc, k=kc, v=vc, **strides, g=g_, beta=b_, A_log=al, dt_bias=db, W=Wm, P=Pm, Ad=Ad, state=state,
                 state_idx=idx, o=o, T=T, scale=scale, H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, FUSED=fused,
                 L2NORM=use_qk_l2norm, PRECISION=precision, STATE_VK=C.state_vk(state), num_warps=num_warps)
    return _in_order(bind(_gdn_wy_solve_kernel, (B * HV,), solve),
                     bind(_gdn_wy_apply_kernel, (C.cdiv(V, BV), B * HV), apply)), o


def _plan_head(kw: dict, heads: int, cap, device):
    """The head kernel's launch: a program per head, or per (head, V tile) (HEAD_SPLIT_V, _head_split), or with
    HEAD_MIXED the last, partial wave's heads a program per V tile (_head_mixed)."""
    tiles, slots = C.cdiv(kw["V"], kw["BV"]), _slots(device)
    split = _head_split(heads, tiles, slots) if HEAD_SPLIT_V is None else bool(HEAD_SPLIT_V)
    if cap:
        kw["maxnreg"] = cap
    whole = _head_mixed(heads, tiles, slots) if HEAD_MIXED and HEAD_SPLIT_V is None and not split else heads
    if whole < heads:  # the first `whole` heads a program each, then a program per (head, V tile)
        return bind(_gdn_wy_fold_head_kernel, (whole + (heads - whole) * tiles,),
                    dict(kw, NWHOLE=whole, SPLIT_V=False, MIXED=True))
    return bind(_gdn_wy_fold_head_kernel, (heads * tiles if split else heads,),
                dict(kw, NWHOLE=0, SPLIT_V=split, MIXED=False))


def _in_order(first, second):
    """One launcher of the per-head kernel, then the per-V-tile one; ``.parts`` holds each alone
    (the benchmarks time them apart)."""
    def launch():
        first()
        second()
    launch.parts = (first, second)
    return launch


def _plan_fold(qc, kc, v, g_, b_, al, db, *, strides, fused, mask, nstep, state, idx, scale, T, B, H, HV, K, V, BT, BK, BV,
               raw16, exact, use_qk_l2norm, precision, o, num_warps, solve_warps, pdl, caps, root, BKC, rounds):
    Qe = C.scratch((B, HV, BT, BK), torch.float32, v.device)
    Ve = C.scratch((B, HV, BT, BT), torch.float32, v.device)
    if root:
        Cv, Q0, C0 = (C.scratch(shape, torch.float32, v.device) for shape in ((B, HV, BT), (B, HV, BK), (B, HV)))
    else:  # unused pointers
        Cv = Q0 = C0 = checks.constant("dummy", 1, v.device, torch.float32)
    # the per-head ready flags (pdl 1 only; otherwise an unused pointer: no allocation, no memset per call)
    ready = (C.scratch((B * HV,), torch.int32, v.device) if pdl == 1 else
             checks.constant("dummy", 1, v.device, torch.int32))
    fold = dict(q=qc, k=kc, g=g_, beta=b_, A_log=al, dt_bias=db, mask=mask, Qe=Qe, Ve=Ve, Cv=Cv, Q0=Q0, C0=C0,
                ready=ready, T=T, scale=scale, NSTEP=nstep, **rounds, H=H, HV=HV, K=K, BT=BT, BK=BK, FUSED=fused,
                L2NORM=use_qk_l2norm, RAW16=raw16, EXACT=exact, PRECISION=precision, PDL=pdl, ROOT=root,
                num_warps=solve_warps, QS=strides["QS"], KS=strides["KS"])
    if root:
        apply = dict(v=v, VS=strides["VS"], Qe=Qe, Ve=Ve, Cv=Cv, Q0=Q0, C0=C0, ready=ready, state=state, state_idx=idx, o=o,
                     T=T, H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, BKC=BKC, EXACT=exact, PRECISION=precision, PDL=pdl,
                     STATE_VK=C.state_vk(state), num_warps=num_warps)
    else:
        apply = dict(q=qc, k=kc, v=v, **strides, g=g_, beta=b_, A_log=al, dt_bias=db, Qe=Qe, Ve=Ve, ready=ready,
                     state=state, state_idx=idx, o=o, T=T, scale=scale, H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV,
                     FUSED=fused, L2NORM=use_qk_l2norm, EXACT=exact, PRECISION=precision, PDL=pdl,
                     STATE_VK=C.state_vk(state), num_warps=num_warps)
    if pdl:
        apply["launch_pdl"] = True
    for kw, cap in zip((fold, apply), caps):
        if cap:
            kw["maxnreg"] = cap
    first = bind(_gdn_wy_fold_kernel, (B * HV,), fold)
    if pdl == 1:  # the flags are zeroed before every launch (a CUDA graph captures the memset too)
        fold_alone = first

        def first():
            ready.zero_()
            fold_alone()
    second = _gdn_wy_fold_root_apply_kernel if root else _gdn_wy_fold_apply_kernel
    launch = _in_order(first, bind(second, (C.cdiv(V, BV), B * HV), apply))
    # what the second kernel reads from the first (the PDL test poisons it)
    launch.scratch = (Qe, Ve) + ((Cv, Q0, C0) if root else ())
    return launch, o


def _pdl(asked) -> int:
    """The fold kernels' programmatic dependent launch (the kernels' PDL): 0 none; 1 (pdl True) each apply program
    waits on its head's ready flag (zeroed by a memset before each launch); 2 (pdl "grid") each waits for the whole
    fold grid (griddepcontrol.wait). 0 unless asked, compiled (the interpreter runs programs one after another) and
    on a GPU that has it (compute capability 9+)."""
    if asked not in (False, True, "grid"):
        raise ValueError(f"pdl: expected False, True or 'grid', got {asked!r}")
    if not asked or C.interpreting():
        return 0
    if gdc_launch_dependents is None:
        raise ValueError("pdl: this Triton has no grid dependency control (triton.language.extra.cuda)")
    if torch.cuda.get_device_capability()[0] < 9:
        return 0
    return 2 if asked == "grid" else 1


def _exact_mode(q, k, v, exact16: str, interpreting: bool) -> int:
    """_dot_exact_rhs's EXACT for the fold kernels' products by raw k and v: 2 (bf16x3) for bf16
    inputs when ``exact16`` asks for it (not in the interpreter, whose bf16 tl.dot is wrong), 1 (two
    tf32 passes) for other 16-bit inputs, 0 for fp32 (tf32x3)."""
    dtypes = {q.dtype, k.dtype, v.dtype}
    if dtypes == {torch.bfloat16} and exact16 == "bf16x3" and not interpreting:
        return 2
    return 1 if dtypes <= {torch.float16, torch.bfloat16} else 0
