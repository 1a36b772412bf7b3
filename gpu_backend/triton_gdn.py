"""Triton kernels for Gated DeltaNet tree verification, and their launchers.

Two designs (twin: oracle.gdn_tree_verify):

recurrent   serial: one program per (sequence, value head, V tile) keeps S [K, BV] in registers and steps
            over the nodes in index order. mode "leaky": S carries from node i-1 (flattened, the
            hybrid-unsafe path), per-node states optional. mode "exact": parent-indexed, each node
            reloads its parent's state from the per-node snapshot buffer (the snapshot design
            serving stacks use for EAGLE top-k > 1), so snapshots are always written.
            paths: one program per (node, value head, V tile) steps along the node's root path from the
            committed state in registers (the same steps in the same order), per-node states optional;
            design "auto" takes it in exact mode for small batches (plan_recurrent, paths_design).
wy          the tree-masked WY form (derived in the README, Contracts): reads the committed state once, writes no
            per-node state. With G_t the sum of g over ancestors-or-self and A_t = exp(G_t):
              (I + L) U = diag(beta) (V - diag(A) K S0),  L[t, j] = beta_t (A_t / A_j) k_t.k_j, j strict ancestor
              O = diag(A) Q S0 + (M o D o Q K^T) U,         D[t, j] = A_t / A_j,  M ancestor-or-self
            L is nilpotent (L^n = 0 beyond the tree depth), so (I + L)^-1 = prod_m (I + (-L)^(2^m))
            over ceil(log2(depth + 1)) factors: a few matrix products instead of T sequential steps.
            mode "leaky" uses the chain mask (every earlier node an ancestor). The value-independent
            half once per head: triton_wy_split (in two kernels, or with the weights applied by the
            program that made them: design "head", design "auto"'s choice for a batch with bf16
            inputs); above 65 nodes, over 64-row chunks: triton_wy_blocked.
Both: q/k l2-norm in kernel, grouped heads (value head j reads key head j // (HV/H)), fp32 state,
bf16/fp16/fp32 inputs, gates from (g, beta) or fused from (a, b, A_log, dt_bias), the committed
state read from a pool slot (state_indices) and never written.
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
def _gdn_recurrent_kernel(
    q, k, v, g, beta, A_log, dt_bias,  # [B,T,H,K] x2, [B,T,HV,V], [B,T,HV] x2 (or a, b), [HV] x2
    src,  # [B, T] int32 or int64, its nodes contiguous, sequence b's at src + b * SRC_B: each node's source of
    # state (-1: the committed state)
    state, state_idx,  # pool [N, HV, K, V] fp32; [B] int32 slots
    o, snap,  # [B, T, HV, V] out; [B, T, HV, K, V] fp32 per-node states (or a dummy), or with ROWS the caller's
    # [N, TS, HV, K, V] (with SNAP_VK the transpose of a contiguous [N, TS, HV, V, K]: SGLang's intermediate buffer)
    snap_rows,  # [B] int32 with ROWS: sequence b's nodes at snap[snap_rows[b], :T]
    T, TS, SRC_B, scale,  # TS: snap's nodes a row (T without ROWS); SRC_B: src's batch stride (0: one row for all)
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    PARENT_INDEXED: tl.constexpr, STORE_STATES: tl.constexpr, FUSED: tl.constexpr, L2NORM: tl.constexpr,
    STATE_VK: tl.constexpr,  # the pool is the transpose of a contiguous [N, HV, V, K] one (h.state_ptrs)
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
    ROWS: tl.constexpr = False, SNAP_VK: tl.constexpr = False,
):
    i_v, i_b, i_hv, i_h = h.head_coords(H, HV)
    if ROWS:
        seq0 = tl.load(snap_rows + i_b) * TS  # the row of the sequence's first node in snap
    else:
        seq0 = i_b * T
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    mkv = mk[:, None] & mv[None, :]
    slot, live = h.pool_slot(state_idx, i_b)  # a padded row (slot -1) starts from a zero state
    s0 = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                 mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)
    S = s0
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    for t in range(0, T):
        row = i_b * T + t  # int32 offsets inside the loop (the flattened kernel is latency-bound)
        if PARENT_INDEXED:  # the root reads the committed state
            S = h.source_state(snap, src + i_b * SRC_B, t, seq0, s0, i_hv, o_k, o_v, mkv, HV, K, V, SNAP_VK)
        b_q = h.load_rows(q, row, i_h, o_k, mk, H, K, L2NORM, 0, QS)
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, L2NORM, 0, KS)
        b_v = h.load_rows(v, row, i_hv, o_v, mv, HV, V, False, 0, VS)
        b_g, b_beta = h.gates(g, beta, row * HV + i_hv, 0, neg_A, bias, FUSED, False)
        S = h.delta_step(S, b_k, b_v, b_g, b_beta)
        b_o = tl.sum(S * (b_q * scale)[:, None], 0)
        tl.store(o + (row * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)
        if STORE_STATES:
            h.store_state(snap, seq0 + t, S, i_hv, o_k, o_v, mkv, HV, K, V, PARENT_INDEXED, SNAP_VK)


@triton.jit
def _gdn_paths_kernel(
    q, k, v, g, beta, A_log, dt_bias,  # as _gdn_recurrent_kernel's
    paths,  # [B, T, DMAX] int32: each node's source path (root first, the node last, -1 padded)
    state, state_idx,  # pool [N, HV, K, V] fp32; [B] int32 slots
    o, snap, snap_rows,  # as _gdn_recurrent_kernel's
    T, TS, DMAX, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr,
    STORE_STATES: tl.constexpr, FUSED: tl.constexpr, L2NORM: tl.constexpr, STATE_VK: tl.constexpr,
    ROWS: tl.constexpr, SNAP_VK: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
):
    """Grid (B * HV * T, V tiles): the program of node t of (sequence, value head) steps S [K, BV] from the
    committed state along t's path in registers, _gdn_recurrent_kernel's steps in its order (at one warp, its state
    read as the serial kernel's is, the same bits; at more warps the key rows' partial sums may meet in another
    order), and writes o_t and, with STORE_STATES, S_t; no state is read back, so no program waits on
    another."""
    pid = tl.program_id(0)  # the nodes of one (sequence, head) are neighbours: their committed tile is read once
    i_v = tl.program_id(1)
    i_bh = pid // T
    t = pid % T
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_h = i_hv // (HV // H)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    mkv = mk[:, None] & mv[None, :]
    slot, live = h.pool_slot(state_idx, i_b)  # a padded row (slot -1) starts from a zero state
    S = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    path = paths + (i_b * T + t) * DMAX
    o_d = tl.arange(0, BD)
    steps = tl.sum((tl.load(path + o_d, mask=o_d < DMAX, other=-1) >= 0).to(tl.int32), 0)  # t's depth + 1
    for d in range(0, steps):
        row = i_b * T + tl.load(path + d)
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, L2NORM, 0, KS)
        b_v = h.load_rows(v, row, i_hv, o_v, mv, HV, V, False, 0, VS)
        b_g, b_beta = h.gates(g, beta, row * HV + i_hv, 0, neg_A, bias, FUSED, False)
        S = h.delta_step(S, b_k, b_v, b_g, b_beta)
    row = i_b * T + t
    b_q = h.load_rows(q, row, i_h, o_k, mk, H, K, L2NORM, 0, QS)
    b_o = tl.sum(S * (b_q * scale)[:, None], 0)
    tl.store(o + (row * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)
    if STORE_STATES:
        if ROWS:
            seq0 = tl.load(snap_rows + i_b) * TS
        else:
            seq0 = i_b * T
        h.store_state(snap, seq0 + t, S, i_hv, o_k, o_v, mkv, HV, K, V, False, SNAP_VK)


@triton.jit
def _apart(x):
    # x itself, through an identity Triton cannot see into: a sum of two products' results would otherwise be folded
    # into one product accumulating onto the other (one chain of MMAs where two can run side by side)
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit(**C.ROUNDS_AS_VALUE)
def _gdn_wy_kernel(
    q, k, v, g, beta, A_log, dt_bias,
    mask,  # [B, T, T] int8 ancestor-or-self (chain mask for leaky)
    state, state_idx, o,
    T, scale, NSTEP,  # NSTEP = ceil(log2(max depth + 1)) doubling steps of the triangular solve
    depths,  # DEPTHS: [B, NPD] int32 each tree's depth per block of 32 nodes (a device plan's): its own rounds
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr, STATE_VK: tl.constexpr,
    QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr,  # q's, k's, v's row strides (_common.rows_of)
    ROOT: tl.constexpr = 0, RAW16: tl.constexpr = False, HOLD: tl.constexpr = False, ROWNORM: tl.constexpr = False,
    CHAINS: tl.constexpr = False, DEPTHS: tl.constexpr = False, NPD: tl.constexpr = 1,
):
    # ROOT 0: the root (node 0) is every node's ancestor: one recurrent step gives its state S_r, and the
    # draft nodes 1..T-1 (a forest under the root) form one block of BT >= T-1 rows on top of S_r.
    # ROOT 1 and 2 (T <= BT, FUSED_ROOT): the root is row 0 of the block, on top of the committed state S0, so no
    # recurrent step and no reduction precede the products. 1: the solve's doubling steps count the root
    # (NSTEP covers chains one node longer); 2: the root's column of L is eliminated first (U += -L[:, 0] u_0, a
    # rank-one update), so NSTEP is the draft nodes' as for ROOT 0.
    # RAW16 (bf16 q and k, compiled: the interpreter's bf16 products are wrong): the products by q and k take them
    # as read, their l2 norms applied to the products (plan_wy's note).
    if ROOT == 0:
        # the ancestor mask is read with wy_tile's reads, after them and before any reduction
        reads = h.wy_reads(q, k, v, g, beta, A_log, dt_bias, state, state_idx, T, H, HV, K, V, BT, BK, BV, FUSED,
                           STATE_VK, QS, KS, VS)
        i_b, o_t = reads[0], reads[3]  # wy_reads' sequence and node offsets
        depth = h.tree_depth(depths, i_b, NPD, DEPTHS)
        mt = o_t < T - 1
        anc = tl.load(mask + (i_b * T + 1 + o_t[:, None]).to(tl.int64) * T + 1 + o_t[None, :],
                      mask=mt[:, None] & mt[None, :], other=0) != 0
        i_b, i_h, i_hv, o_t, o_k, o_v, mk, mv, _, _, s0, mt, rows, b_q, b_k, b_v, b_g, b_beta = h.wy_values(
            reads, o, scale, HV, V, FUSED, L2NORM)
        draft = reads[-1]  # the draft rows as read (draft_reads')
    else:
        _, i_b, i_hv, i_h, o_t, o_k, o_v, mk, mv, neg_A, bias = h.block_coords(A_log, dt_bias, H, HV, K, V, BT, BK, BV,
                                                                              FUSED)
        mt = o_t < T
        rows = (i_b * T + o_t).to(tl.int64)
        depth = h.tree_depth(depths, i_b, NPD, DEPTHS)  # read first (a scalar)
        slot, live = h.pool_slot(state_idx, i_b)  # read through the table even where it is the identity (no state_indices):
        # the state's read waits for it, so q and k, first used, arrive sooner (RESULTS.md: 5.3 us of device time
        # against 5.5 with the state at row i_b, 1 x 16, 4 warps, the rows' norms as read)
        # the state last: Triton moves it into shared memory for the products as soon as it is read (a barrier),
        # and a read after it would wait a round trip of its own. ptxas puts the first uses of the mask, the gates and
        # the slot among these reads, so some reads wait a round trip for them; a barrier after the reads (the slot's
        # and the state's after it) sends 13 of them before any wait, but took 0.5 us more device time (RESULTS.md).
        # Where the state's read goes out is close to the best of those measured (benchmarks/fused_variants.py at
        # 98ad0a4, device time at 1 x 16 against 5.2 us): issued once the rows' norms, K K^T's column norms or -L's
        # root column were made 6.1-6.2; unmasked by 32-bit offsets (56 fewer instructions, issued sooner) 5.7-5.8;
        # the whole form on its transposes (the state the products' first operand) 5.6-5.8. Read by a tensor descriptor
        # (TMA: faster alone, 3.5 us against 4.3 for the state's read by itself, benchmarks/state_reads.py, but Triton
        # waits for the copy where it is issued) 6.0-6.1, q and k so too 7.2; its rows, or its head in two halves,
        # prefetched into L2 in bulk first 5.9 / 5.7-5.8 (fused_variants.py at 6d83e0f); the head prefetched in bulk
        # once the slot arrives and the tile read once -L's root column is made 5.2-5.3, once K K^T's column norms are
        # 5.8-5.9 (575971a). The descriptor's copy waited for at the state's use and read straight into the products'
        # operand layout (no pass through registers and back), which Triton cannot state, took 5.0 with the kernel's
        # TTGIR edited so (benchmarks/fused_tma_late.py at cc89f9a): a Gluon port could serve that 0.2 us
        draft = h.draft_reads(q, k, v, g, beta, rows, mt, i_h, i_hv, o_k, o_v, mk, mv, H, HV, K, V, QS, KS, VS)
        anc = tl.load(mask + (i_b * T + o_t[:, None]).to(tl.int64) * T + o_t[None, :],
                      mask=mt[:, None] & mt[None, :], other=0) != 0
        s0 = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                     mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)  # a padded row: zero
        b_q, b_k, b_v, b_g, b_beta = h.draft_values(draft, mt, neg_A, bias, FUSED, L2NORM)
    b_v = b_v.to(tl.float32)
    G = tl.sum(tl.where(anc, b_g[None, :], 0.0), 1)  # [BT] log-decay along each path (below the root for ROOT 0)
    D = tl.where(anc, tl.exp(G[:, None] - G[None, :]), 0.0)  # A_t / A_j on ancestors-or-self
    if RAW16:
        # q, k [BT, BK] bf16 as read (draft_reads'), the l2 norms applied to the products' rows and columns: their
        # products are exact (one MMA each, bf16x3 took three) and the state's take two (its bf16 head and remainder,
        # about 2^-17 as bf16x3's); no fp32 copy of q and k goes through shared memory. Each passes through a select
        # (an identity: the reads are masked alike) placed after the kernel's last read: Triton stores a product's
        # 16-bit operand into shared memory, and loads it back (a barrier), right where the operand is made, so q and
        # k used as loaded put a barrier before the reads after them (three rounds of reads at 1 x 16 and 1 x 17,
        # compiled for sm_90, where the select leaves one)
        mqk = mt[:, None] & mk[None, :]
        q_raw, k_raw = tl.where(mqk, draft[0], 0.0), tl.where(mqk, draft[1], 0.0)
        KK = tl.dot(k_raw, tl.trans(k_raw))  # [BT, BT] fp32
        if L2NORM:  # the norms from the diagonals of exact products (fp32 sums, as tl.sum's), reduced in the products'
            # own layout, along rows for rows and along columns for columns (a norm moved between layouts is a barrier)
            eye = o_t[:, None] == o_t[None, :]
            ik_col = 1.0 / tl.sqrt(tl.sum(tl.where(eye, KK, 0.0), 0) + 1e-6)
            if ROWNORM:  # the rows' norms summed from the rows as read, in their own layout
                k32, q32 = k_raw.to(tl.float32), q_raw.to(tl.float32)
                ik = 1.0 / tl.sqrt(tl.sum(k32 * k32, 1) + 1e-6)
                iq = scale / tl.sqrt(tl.sum(q32 * q32, 1) + 1e-6)
            else:
                ik = 1.0 / tl.sqrt(tl.sum(tl.where(eye, KK, 0.0), 1) + 1e-6)
                iq = scale / tl.sqrt(tl.sum(tl.where(eye, tl.dot(q_raw, tl.trans(q_raw)), 0.0), 1) + 1e-6)
        else:
            ik = tl.full([BT], 1.0, tl.float32)
            ik_col = ik
            iq = tl.full([BT], scale, tl.float32)
        if ROWNORM:  # the rows' norms left out of the products: applied through beta, A and the output's rows
            KK = KK * ik_col[None, :]
            QK = tl.dot(q_raw, tl.trans(k_raw)) * ik_col[None, :]  # K^T's columns normed, Q's rows not
        else:
            KK = KK * ik[:, None] * ik_col[None, :]
            QK = tl.dot(q_raw, tl.trans(k_raw)) * iq[:, None] * ik_col[None, :]  # Qs K^T
    else:
        b_qs = b_q * scale
        KK = tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION)
        QK = tl.dot(b_qs, tl.trans(b_k), input_precision=PRECISION)
    # -L through D (0 off the ancestors): the mask stays in the layout it was read in (no conversion waits for it)
    A = tl.exp(G)
    if RAW16 and ROWNORM:  # the rows' norms in -L's rows, in U's row factor and in the output's (through D's rows)
        NL = tl.where(o_t[:, None] != o_t[None, :], -(b_beta * ik)[:, None] * D * KK, 0.0)
        A_k, A_q = A * ik, A * iq
        D = D * iq[:, None]
    else:
        NL = tl.where(o_t[:, None] != o_t[None, :], -b_beta[:, None] * D * KK, 0.0)
        A_k, A_q = A, A
    if ROOT == 2:  # row 0 of U will be the root's u_0 (L's row 0 is empty); its column of -L, c, is taken out of the
        # solve and applied to U first: U += c u_0
        first = o_t == 0
        c = tl.sum(tl.where(first[None, :], NL, 0.0), 1)  # [BT]
        NL = tl.where(first[None, :], 0.0, NL)
        if HOLD:  # s0 * 1 once c is made (x - x + 1: 1 for finite x, NaN after a NaN; c's rows lie in every warp, so
            # its sum takes no barrier): Triton moves the state into shared memory as soon as it is read (a barrier
            # that waits for it), so without a use that waits on c the state-free products wait for the state
            s0 = s0 * (tl.sum(c - c, 0) + 1.0)
    if RAW16:
        # the head and remainder made by conversions. Split by the bits instead (the top 16 bits, an integer add
        # rounding the head), it took the same device time at 1 x 16 and its outputs lay further from the oracle
        # (RESULTS.md). In tf32 (the head the top 19 bits, no conversions) 0.05% of outputs were off the rounded
        # oracle against 0.26%, but it took 6.2 us against 5.2 (twice the MMAs, its operands read from shared memory
        # without ldmatrix: benchmarks/fused_variants.py at 98ad0a4)
        s_hi = s0.to(tl.bfloat16)
        s_lo = (s0 - s_hi.to(tl.float32)).to(tl.bfloat16)
        if CHAINS:  # the head's and the remainder's products accumulated apart (two chains of MMAs, not one)
            KS = _apart(tl.dot(k_raw, s_hi)) + _apart(tl.dot(k_raw, s_lo))  # K S0 [BT, BV], its rows' norms not applied
            QS = _apart(tl.dot(q_raw, s_hi)) + _apart(tl.dot(q_raw, s_lo))
        else:
            KS = tl.dot(k_raw, s_hi, tl.dot(k_raw, s_lo))
            QS = tl.dot(q_raw, s_hi, tl.dot(q_raw, s_lo))
        if not ROWNORM:  # else the rows' norms are in U's and the output's row factors
            KS = KS * ik[:, None]
            QS = QS * iq[:, None]
    else:
        KS = tl.dot(b_k, s0, input_precision=PRECISION)
        QS = tl.dot(b_qs, s0, input_precision=PRECISION)
    U = b_beta[:, None] * (b_v - A_k[:, None] * KS)  # right-hand side
    if ROOT == 2:
        u0 = tl.sum(tl.where(first[:, None], U, 0.0), 0)  # [BV]
        U = U + c[:, None] * u0[None, :]
    # U <- (I + N^(2^r)) U for r < NSTEP: U = sum_n (-L)^n RHS. The first step outside the loop, so that the last
    # step squares nothing it does not use (N^(2^NSTEP) is 0). Under capture (a DevicePlan) each sequence's own, from
    # the depth the step kernel wrote (DEPTHS, read with the first reads, counted here): 5.5 us of device time at 1 x 16
    # against 6.6 with T - 1's rounds and 5.2 planned at the trees' depth, 2 (H100, RESULTS.md, 90026bd); counted
    # where it was read, 5.9; the rounds unrolled, each behind a test of the count, 5.5 as the loop (removed).
    # Counted from the ancestor mask instead (its deepest row, a reduction before the loop) the form took 6.6 us
    # against 6.2 with T - 1's (aed51b2): not kept
    NSTEP = h.solve_rounds(NSTEP, depth, DEPTHS, 1 if ROOT == 1 else 0)
    if NSTEP > 0:
        U = U + tl.dot(NL, U, input_precision=PRECISION)
    for _ in range(1, NSTEP):
        NL = tl.dot(NL, NL, input_precision=PRECISION)
        U = U + tl.dot(NL, U, input_precision=PRECISION)
    b_o = A_q[:, None] * QS + tl.dot(D * QK, U, input_precision=PRECISION)
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=mt[:, None] & mv[None, :])


# Whether the one-kernel form puts the root in its block where the whole tree fits one (T <= BT; design auto takes
# the form for one sequence of up to 16 nodes, a 16-row block), where the root's own step takes a reduction before
# the products: 0, the root's recurrent step first;
# 1 or 2, _gdn_wy_kernel's ROOT. On the H200 at 1 x 16 (RESULTS.md, bench_wy_root.py): 2 (the root's column
# eliminated first) 9.7 us alone and 6.0 a layer in a graph of 48, against 9.9 / 6.6 root first (4 warps) and 11.4 /
# 7.5 root first at 8 warps, the default before; 1 (the solve one doubling step longer at DDTree's depth 2) 10.9 / 6.7.
# The one-kernel form over a 16-row block with the root first takes 4 warps (root first: 9.9 against 11.4 us at
# 1 x 16; 6.6 against 7.4 us device time at 1 x 17 with RAW16), with the root in it 8 before its state's use was held
# and its rows' norms taken as read (with RAW16 9.7 / 6.2 us device time at 1 x 16 against 10.1 / 7.0 with 4), 4 since
# (FUSED_WARPS' note), larger blocks 8.
# A form 3 that used the state only after the value-independent half (the solve on -L alone, with or without the
# output's weights folded) measured slower (6.9-7.6 us device time against 2's 6.1-6.4 at 1 x 16) and was removed: its
# longer chain of products and barriers cost more than the state's read it hid (FUSED_HOLD, which hides the read
# behind the state-free products alone, gains 0.1-0.4 us; RESULTS.md). Measured again with the later defaults (q and
# k as read, their rows' norms as read, 4 warps; benchmarks/fused_variants.py at 0cfc0d2), the form with the output's
# weights folded (O = P S0 + Y, P = diag(a_q) Q - W diag(beta a_k) K, Y = W diag(beta) V) took 5.7-5.8 us of device time
# with the state's use held until P was made, 6.7 held on -L's root column and 6.6 not held, against 5.2, and 0.41% of
# its outputs were off the rounded oracle against 0.26%. On an H100 (benchmarks/fused_fold_late.py at 99dbc1d, its
# products by k and v two MMAs each) the fold held on P took 5.57 against the form's 5.87 (5.66 and 0.33% off with P
# S0's remainder by remainder), and with the state read only once P was made, prefetched into L2 or not, 7.1-7.6, by
# TMA waited for at its use 6.1: not run on the H200, where #36's bound is measured, and not taken. Written in Gluon
# (benchmarks/gluon_fold.py: the state copied by TMA once its slot arrives, waited for at P S0) it took 6.5 on an H100,
# 4.5 with the state never read.
FUSED_ROOT = 2
# Whether the one-kernel form takes bf16 q and k as read into its products (RAW16; benchmarks turn it off to time
# the l2-normed fp32 rows in bf16x3, the form before, in place). On the H200 (RESULTS.md, bench_wy_root.py) it took
# the same time within the runs' spread (1 x 16, root in the block, 8 warps: 9.7 / 6.2 us device time against 9.7 /
# 6.0) and its bf16 outputs are nearer the oracle's: 0.26% of them off the float64 oracle rounded to bf16 against 0.42%.
FUSED_RAW16 = True
# Whether the one-kernel form with the root in its block (FUSED_ROOT 2) holds its state's use until its state-free
# products (-L, the root's column, the norms, Q K^T) are made (HOLD), so that the state's read overlaps them rather
# than holding them up; the solve, on the right-hand side the state makes, follows as before. Compiled for sm_90 at 1 x 16
# (8 warps, 64-wide V tiles) the same 28 barriers and 62 MMAs, every read issued first, the state first used after
# 18-19 barriers and 16 MMAs where without it before the first barrier; 177 registers against 144. On the H200
# (RESULTS.md, bench_wy_root.py --hold 0,1) 0.1-0.4 us less device time in each of the six pairs timed, 0.2-0.7 us
# less alone in five (1 x 16, 8 warps, 64-wide: 8.6 / 5.8 against 8.9 / 6.0 us, and 8.2 / 5.8 against 8.4 / 6.0 in
# a second invocation; 1 x 9: 8.7 / 5.8 against 9.3 / 5.9), the outputs bit-equal; graphed within the spread. At 4
# warps with the rows' norms as read (the defaults since 872d4a0) 5.2-5.3 us of device time at 1 x 16 against 5.8-5.9.
FUSED_HOLD = True
# Whether the one-kernel form with q and k as read (RAW16) sums its rows' norms of q and k from the rows as read, in
# their load layout (a warp's own rows), and applies them through beta (-L's rows), A (U's and Q S0's row factors)
# and D's rows (the output's products), where otherwise they come from the diagonals of K K^T and Q Q^T, two
# cross-warp reductions and a product (ROWNORM; its columns' norms come from K K^T's diagonal either way). Compiled
# for sm_90 at 1 x 16 (8 warps) 30 barriers and 60 MMAs against 32 and 68, the state first used after 14-15 barriers
# against 18-19. On the H200 (RESULTS.md, bench_wy_root.py --rownorm --rounds) at 1 x 16 with 4 warps 5.3 us of device
# time through a pool's slots and 5.5-5.6 by sequence, against 5.8-6.0 with the diagonals' norms, in each of three
# rounds in one process, and 5.2-5.6 against 5.8-6.0 in the kernel table's script; at 8 warps 5.6-5.8 against 5.8
# (one table run at f89c626 had read 6.0 at 4 warps); root first (1 x 17) 6.5 against 6.4 (6.8 against 6.6 before):
# taken with the root in the block only.
FUSED_ROWNORM = True
# Whether the one-kernel form with q and k as read accumulates its state's products by the state's bf16 head and
# remainder apart, two chains of MMAs each as long as K's steps, where Triton folds their sum into one chain twice as
# long (CHAINS; kept apart by an identity Triton cannot see into, _apart). On the H200 (bench_wy_root.py --chains)
# 5.8 us device time against 5.9 at 1 x 16, 6.5 against 6.6 root first at 1 x 17: within the spread, off.
FUSED_CHAINS = False
# The one-kernel form's warps where plan_wy is given none (None: 4 for a 16-row block, 8 for larger ones); benchmarks
# set it (bench_engine_api.py --fused-warps). With the root in the block and its rows' norms as read 4 warps took
# 5.3 us of device time at 1 x 16 against 5.6-5.8 at 8; without the norms as read 5.8-5.9 either way (RESULTS.md).
# Through engine_api (a pool in SGLang's layout, the gates fused) the form took 5.8 us at 8 warps with the norms from
# the diagonals against 6.2 at 4 and 6.3 at 4 with the norms as read, in four runs: with the root in the block a pool
# in that layout keeps 8 warps and the diagonals' norms (plan_wy).
FUSED_WARPS = None
# Whether the one-kernel form's launch with the root in its block, bf16 inputs and at most 16 nodes is the Gluon fold
# (gluon_gdn: its state copied by cp.async and waited for at its use, every read issued before any is used), where
# the GPU compiles it, rather than _gdn_wy_kernel, on host and device plans; benchmarks turn it off to time the Triton
# form in place. On an H100 at 1 x 16 (benchmarks/gluon_served.py, RESULTS.md) 5.1-5.2 us of device time against the
# Triton form's 5.8-5.9, through engine_api 5.2-5.3 against 6.1-6.3, replayed from a graph of 48 layers 4.95-5.27 a
# layer against 5.34-5.71, its outputs 0.40-0.45% off the float64 oracle
# rounded to bf16 against 0.26%; not yet run on an H200. GLUON_VK: with a pool in SGLang's layout too.
FUSED_GLUON = True
GLUON_VK = True
# Whether a device plan's WY solves (a captured call's tree, its tables built by the step kernel) take each sequence's
# doubling rounds from the depths the kernel wrote (triton_helpers.solve_rounds), or the bound's, T - 1's: the same
# bits (the extra rounds multiply by zero powers of the solve's matrix); benchmarks set it to time both.
DEVICE_ROUNDS = True


def device_rounds(parents, mode: str, dummy: torch.Tensor) -> dict:
    """The WY kernels' depths, NPD and DEPTHS: a device plan's trees' own depths per block (its host depth is a bound,
    T - 1), so that each sequence's rounds are counted in the kernel (DEVICE_ROUNDS); else none (``dummy`` an
    unread pointer) and the launch's NSTEP."""
    depths = parents.depth_table(mode) if isinstance(parents, checks.TreePlan) and DEVICE_ROUNDS else None
    if depths is None:
        return dict(depths=dummy, NPD=1, DEPTHS=False)
    return dict(depths=depths, NPD=depths.shape[1], DEPTHS=True)


def root_fits_block(T: int) -> bool:
    """Whether a tree of T nodes fits the one-kernel form's block of its T - 1 draft nodes with its root too (where
    FUSED_ROOT applies): T - 1 is not a power of two of at least 16."""
    return T <= C.next_pow2(T - 1)


WY_MAX_NODES = 65  # the root + one block of at most 64 draft nodes (a 128-row block exceeds shared memory in
# tf32x3); larger trees go to triton_wy_blocked (the same form over 64-row chunks, block back-substitution)


def gdn_tree_verify_recurrent(*args, **kwargs):
    """Recurrent Triton path. mode "leaky" (flattened) or "exact" (parent-indexed: snapshots are
    written and read back). Returns o [B, T, HV, V] (v's dtype) and, with output_states, the per-node
    states [B, T, HV, K, V] fp32; with states_out (plan_recurrent's), (o, states_out) with the node
    states written there."""
    launch, result = plan_recurrent(*args, **kwargs)
    launch()
    return result


def plan_recurrent(q, k, v, g=None, beta=None, *, parents, initial_state, mode="exact", scale=None,
                   use_qk_l2norm=True, output_states=False, state_indices=None, a=None, b=None,
                   A_log=None, dt_bias=None, states_out=None, states_rows=None, block_v: int | None = None,
                   num_warps: int | None = None, poison: bool | None = None, design: str = "auto"):
    """Validate and allocate once; returns (launch, result): launch() runs the kernel alone (what
    the benchmarks time). poison=False skips the NaN fill of fresh outputs. design "serial": a program
    per (sequence, head, V tile) steps over the nodes in index order (exact: each node's parent's state
    read back from the per-node states, which are then always written); "paths": a program per node
    steps along the node's root path from the committed state (_gdn_paths_kernel: the same steps, the same
    bits at one warp, per-node states only where asked for); "auto": paths_design's choice.
    block_v, num_warps: the V tile and the warps of a program (None: 16 and 1 for serial, 32 and 2 for paths, the
    H200's best: benchmarks/bench_node_states.py, RESULTS.md). states_out: the caller's
    fp32 [N, TS, HV, K, V] (TS >= T; or the transpose of a contiguous [N, TS, HV, V, K], SGLang's
    intermediate buffer) into which sequence b's node states go, at row states_rows[b] (distinct, in
    0..N-1; None: row b, N >= B), in place of a fresh [B, T, HV, K, V]: no other row or node is
    written. The result is then (o, states_out)."""
    B, T, H, HV, K, V, src, idx, (g_, b_, al, db, fused) = C.prep_gdn(
        q, k, v, g, beta, a, b, A_log, dt_bias, parents, initial_state, state_indices, mode)
    scale = K ** -0.5 if scale is None else float(scale)
    if design not in ("auto", "serial", "paths"):
        raise ValueError(f"design: expected 'auto', 'serial' or 'paths', got {design!r}")
    paths = design == "paths" or (design == "auto" and paths_design(B, HV, V, mode)
                                  and getattr(parents, "serves_paths", True))
    parent_indexed = mode == "exact" and not paths
    rows = states_out is not None
    if rows:
        snap_vk = checks.node_states_vk(states_out, T, HV, K, V, q.device)
        snap_rows = checks.node_state_rows(states_out, states_rows, B)
        output_states = True
    elif states_rows is not None:
        raise ValueError("states_rows: given without states_out")
    store = output_states or parent_indexed
    if paths and B * HV * T >= 2**31:
        raise ValueError(f"design 'paths': {B} x {HV} x {T} programs exceed the grid")
    o = C.alloc((B, T, HV, V), v.dtype, v.device, poison)
    if rows:
        snap = states_out
    elif store:
        snap = C.alloc((B, T, HV, K, V), torch.float32, v.device, poison)
    else:
        snap = checks.constant("dummy", 1, v.device)
    BK, BV = C.next_pow2(K, 1), min(block_v or (32 if paths else 16), C.next_pow2(V, 1))
    num_warps = num_warps or (2 if paths else 1)
    kw = dict(**C.qkv_rows(q, k, v), g=g_, beta=b_, A_log=al, dt_bias=db,
              state=initial_state, state_idx=idx, o=o, snap=snap, snap_rows=snap_rows if rows else idx, T=T,
              TS=states_out.shape[1] if rows else T, scale=scale, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV,
              STORE_STATES=store, FUSED=fused, L2NORM=use_qk_l2norm, STATE_VK=C.state_vk(initial_state), ROWS=rows,
              SNAP_VK=rows and snap_vk, num_warps=num_warps)
    result = (o, snap) if output_states else o
    if paths:
        # [B, T, DMAX]: a plan's cached table, else made from the sources prep_gdn checked (not validated again)
        table = (parents.root_paths(mode) if isinstance(parents, checks.TreePlan)
                 else checks.root_paths_of(*checks.ancestor_mask(src)))
        kw.update(paths=table, DMAX=table.shape[2], BD=C.next_pow2(table.shape[2], 1))
        return bind(_gdn_paths_kernel, (B * HV * T, C.cdiv(V, BV)), kw), result
    # the sources as the plan caches them (int64; leaky's one row for every sequence, batch stride 0): no table made
    # per call, so a call on a TreePlan is replayed (fastcall)
    src = src if src.stride(-1) == 1 else src.contiguous()
    kw.update(src=src, SRC_B=src.stride(0), PARENT_INDEXED=parent_indexed)
    return bind(_gdn_recurrent_kernel, (C.cdiv(V, BV), B * HV), kw), result


# design "auto" takes paths where the serial kernel would have at most this many programs of 32 columns
# (B * HV * V / 32): at Qwen3.6-27B's GDN shapes on the H200 (benchmarks/RESULTS.md, both at their defaults, device
# time) paths took 28 against 38 us at 1 x 16 and 108 against 148 at 1 x 65, within 6% either way at two to four
# sequences, 14% more at 8 x 16 and 8 x 65 (194 against 170, 810 against 714), where the serial programs fill the GPU
PATHS_MAX_SERIAL_PROGRAMS = 768


def paths_design(B: int, HV: int, V: int, mode: str) -> bool:
    """Whether plan_recurrent's design "auto" takes "paths" for B trees over HV value heads of V columns in
    ``mode``: in exact mode (leaky's paths are every earlier node: T^2 / 2 steps) where the serial kernel's programs
    would not fill the GPU (PATHS_MAX_SERIAL_PROGRAMS)."""
    return mode == "exact" and B * HV * C.cdiv(V, 32) <= PATHS_MAX_SERIAL_PROGRAMS


def gdn_tree_verify_wy(*args, **kwargs):
    """Tree-masked WY Triton path: no per-node states (output_states is refused). Products of fp32
    operands run as tf32x3 for fp32 inputs (three tf32 MMAs: fp32-level error, measured 3.8e-7 vs the
    oracle on an H200, against 2.3e-7 with plain fp32 'ieee' dots at 12-18x the time; single-pass
    'tf32' does not hold the fp32 tolerance) and as bf16x3 for 16-bit inputs (three bf16 MMAs: the
    bf16 output equals the oracle rounded to bf16 but for a few entries in a thousand, 1.3-1.4x
    faster). The default configurations are the H200 sweeps' choices (plan_wy)."""
    launch, result = plan_wy(*args, **kwargs)
    launch()
    return result


AUTO_HEAD = True  # whether design auto may take head (benchmarks turn it off to time the two-kernel forms in place)
# whether design auto takes head for one sequence past 17 nodes too (a program per head and V tile:
# triton_wy_split.HEAD_SPLIT_V) with bf16x3 products, where it took split before (RESULTS.md: 18.6 against 29.1 us
# at 1 x 65 alone, 15.0 against 24.6 a layer in a graph of 48)
AUTO_HEAD_ONE = True


def auto_design(B: int, T: int, precision: str, *, pdl: bool | str = False, block_k: int | None = None,
                fold_root: bool | None = None, block_v: int | None = None) -> str:
    """The form design "auto" launches for B trees of T nodes with ``precision`` products (plan_wy's rule; the
    benchmarks' tables name it from here): "fused", "split", "fold" or "head" up to one block ("fused" for one
    sequence up to 17 nodes; "head" with bf16x3 products, split along V where the split programs fit in one wave,
    triton_wy_split._head_split; where an option only the two-kernel forms take is given, with other products, or
    with AUTO_HEAD (AUTO_HEAD_ONE for one sequence) off, "fold" for a batch and "split" for one sequence); past one
    block "split, folded" or "split, unfolded" (triton_wy_blocked.auto_folds)."""
    if T > WY_MAX_NODES:
        from ddsim.gpu_backend.triton_wy_blocked import auto_folds
        return "split, folded" if auto_folds(B, precision) else "split, unfolded"
    two = (pdl or block_k is not None or fold_root is False or block_v is not None or precision != "bf16x3"
           or not AUTO_HEAD)
    if B == 1:
        return "fused" if T <= 17 else ("head" if AUTO_HEAD_ONE and not two else "split")
    return "fold" if two else "head"


def plan_wy(q, k, v, g=None, beta=None, *, parents, initial_state, mode="exact", scale=None,
            use_qk_l2norm=True, output_states=False, state_indices=None, a=None, b=None,
            A_log=None, dt_bias=None, block_v: int | None = None, num_warps: int | None = None,
            precision: str | None = None, poison: bool | None = None, design: str = "auto", solve_warps: int = 4,
            exact16: str = "bf16x3", pdl: bool | str = False, fold_root: bool | None = None,
            block_k: int | None = None):
    """Validate, build the ancestor mask and allocate once; returns (launch, o). design "fused": one
    kernel; "split": the value-independent half once per head (triton_wy_split); "fold": the same with
    W, P, the gates and K folded into the output's weights, so the per-V-tile kernel does two products
    instead of four; "head": the folded weights (the root's step folded in) applied to every V tile by the
    program per head that made them, one kernel; "auto" takes what measured fastest on the H200
    (benchmarks/RESULTS.md, bf16 inputs): for one sequence fused up to 17 nodes (up to 16, with bf16 inputs where the
    GPU compiles it, the Gluon fold: gluon_gdn, FUSED_GLUON; the Triton form's figures follow: 9.0 us at 1x16, 5.4 of device time,
    the root in the block, 4 warps, bf16 q, k into the products as read, their rows' norms from the rows as read and
    the state's use held behind its state-free products: FUSED_ROOT, FUSED_RAW16, FUSED_ROWNORM, FUSED_HOLD; 8 warps
    and the norms from the products' diagonals with a pool in SGLang's layout, 5.8 us of device time through engine_api
    against 6.3; head 10.8-14.9), else head
    with bf16x3 products, a program per head and V tile
    (18.6 us against split's 29.1 alone at 1x65, 15.0 against 24.6 a layer in a graph of 48; a program per head
    had taken 26.1 alone but the graphed 27B verify 0.3-0.4 ms longer in place), split with other products; for
    a batch head with bf16x3 products (47.3 / 147.3 us at 8x65 / 32x65 now, the last wave's heads split along
    V at 8x65: triton_wy_split.HEAD_MIXED; 61.6 / 171.2 against fold's 71.3 /
    220.5 when it was chosen), fold where pdl, block_k, block_v or fold_root=False is given (options of the
    two-kernel forms only) or with other products (head not measured). A batch whose head programs split along V
    fit in one wave of the GPU takes them so too (22.0 us at 2x65 against 27.1). block_v
    / num_warps / solve_warps default to each design's sweep choice (triton_wy_split.FOLD_DEFAULTS for
    fold; at a block of 64 rows or more a V tile is at least 32 wide, _common.MIN_V_TILE_64; past one block a
    block_v given is capped at 64 for the split form with bf16x3 products, else 32, what was compiled and
    measured there); precision: the input_precision of
    the products of fp32 operands (None: bf16x3 for 16-bit inputs, tf32x3 for fp32: _common.dot_precision;
    the products by raw 16-bit q, k are single exact MMAs whatever it is); exact16: how the fold kernels
    multiply by the raw 16-bit k and v ("bf16x3", the default, or "tf32x2"); pdl: launch the folded
    form's second kernel with programmatic dependent launch (Hopper or later; ignored by the others), its programs
    waiting on their head's ready flag (True) or for the whole first grid ("grid": no flags to zero);
    fold_root / block_k: whether the folded form folds the root's recurrent step into its weights too, so
    that its second kernel multiplies the committed state directly (None: triton_wy_split.FOLD_DEFAULTS,
    yes for bf16x3 products), and that kernel's K chunk (None: all of K).
    Past 65 nodes (triton_wy_blocked): "fused" is the one-kernel chunked form, "split" / "fold" (and "head") the
    three-kernel split form unfolded / folded, "auto" the split form, folded for a batch with tf32x3
    products (triton_wy_blocked.plan_wy_blocked's fold=None)."""
    if design not in ("auto", "fused", "split", "fold", "head"):
        raise ValueError(f"design: expected 'auto', 'fused', 'split', 'fold' or 'head', got {design!r}")
    if output_states:
        raise ValueError("output_states: the WY kernel writes no per-node states; use the recurrent kernel")
    C.check_precision(precision)
    if exact16 not in ("bf16x3", "tf32x2"):
        raise ValueError(f"exact16: expected 'bf16x3' or 'tf32x2', got {exact16!r}")
    if q.dim() == 4 and q.shape[1] > WY_MAX_NODES:  # more draft nodes than one block: triton_wy_blocked
        from ddsim.gpu_backend.triton_wy_blocked import block_v_cap, plan_wy_blocked
        # (which validates the inputs itself: once per call). "fused": the one-kernel chunked form; otherwise
        # the three-kernel split form, folded for "fold", unfolded for "split", and as "auto" its own choice
        chunked = design == "fused"
        # a V tile asked for is capped at what was compiled and measured there
        cap = block_v_cap(C.dot_precision(precision, q, k, v), "chunked" if chunked else "split")
        return plan_wy_blocked(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode=mode, scale=scale,
                               use_qk_l2norm=use_qk_l2norm, state_indices=state_indices, a=a, b=b, A_log=A_log,
                               dt_bias=dt_bias, precision=precision, poison=poison,
                               block_v=None if block_v is None else min(block_v, cap),
                               num_warps=num_warps or (8 if chunked else 4), solve_warps=solve_warps,
                               design="chunked" if chunked else "split",
                               fold={"fold": True, "head": True, "split": False}.get(design))
    B, T, H, HV, K, V, src, idx, (g_, b_, al, db, fused) = C.prep_gdn(
        q, k, v, g, beta, a, b, A_log, dt_bias, parents, initial_state, state_indices, mode)
    precision = C.dot_precision(precision, q, k, v)
    scale = K ** -0.5 if scale is None else float(scale)
    mask, depth = parents.ancestors(mode) if isinstance(parents, checks.TreePlan) else checks.ancestor_mask(src)
    nstep = max(0, math.ceil(math.log2(max(depth, 1))))  # strict-ancestor chains below the root: depth - 1
    rounds = device_rounds(parents, mode, mask)
    if design == "auto":
        design = auto_design(B, T, precision, pdl=pdl, block_k=block_k, fold_root=fold_root, block_v=block_v)
    if design in ("split", "fold", "head"):
        num_warps = num_warps or 4
        from ddsim.gpu_backend.triton_wy_split import plan_wy_split
        return plan_wy_split(q, k, v, g_, b_, al, db, fused=fused, mask=mask, nstep=nstep, state=initial_state,
                             idx=idx, scale=scale, T=T, B=B, H=H, HV=HV, K=K, V=V, use_qk_l2norm=use_qk_l2norm,
                             precision=precision, poison=poison, block_v=block_v, num_warps=num_warps,
                             solve_warps=solve_warps, fold=design in ("fold", "head"), exact16=exact16, pdl=pdl,
                             fold_root=fold_root, block_k=block_k, head=design == "head", rounds=rounds)
    o = C.alloc((B, T, HV, V), v.dtype, v.device, poison)
    BT, BK = C.next_pow2(T - 1), max(16, C.next_pow2(K, 1))
    root = FUSED_ROOT if root_fits_block(T) else 0
    vk = C.state_vk(initial_state)
    # with the root in the block, a pool in SGLang's layout (vk) keeps the form's defaults of before the rows' norms as
    # read: 8 warps, the norms from the diagonals (FUSED_WARPS' note)
    sglang_layout = root != 0 and vk
    asked_v, asked_warps = block_v, num_warps or FUSED_WARPS
    # 4 warps for a 16-row block, 8 for larger blocks (FUSED_WARPS' and FUSED_ROOT's notes)
    block_v, num_warps = block_v or 64, num_warps or FUSED_WARPS or (4 if BT == 16 and not sglang_layout else 8)
    BV = C.v_tile(block_v, V, BT)  # (at least 32 at a 64-row block: C.MIN_V_TILE_64)
    raw16 = FUSED_RAW16 and q.dtype == k.dtype == torch.bfloat16 and not C.interpreting()
    if root == 1:  # the root's chain is one node longer: powers of -L up to the depth
        nstep = math.ceil(math.log2(depth + 1))
    grid = (C.cdiv(V, BV), B * HV)
    kw = dict(**C.qkv_rows(q, k, v), g=g_, beta=b_, A_log=al, dt_bias=db, mask=mask,
              state=initial_state, state_idx=idx, o=o, T=T, scale=scale, NSTEP=nstep, H=H, HV=HV, K=K, V=V,
              BT=BT, BK=BK, BV=BV, FUSED=fused, L2NORM=use_qk_l2norm, PRECISION=precision,
              STATE_VK=vk, ROOT=root, RAW16=raw16, HOLD=FUSED_HOLD and root == 2,
              ROWNORM=FUSED_ROWNORM and raw16 and root != 0 and not vk, CHAINS=FUSED_CHAINS and raw16,
              **rounds, num_warps=num_warps)
    if FUSED_GLUON and raw16 and (GLUON_VK or not vk):  # (raw16: compiled, not interpreted; Gluon imported here, not
        # by every CPU run: 0.1 s)
        from ddsim.gpu_backend import gluon_gdn
        if gluon_gdn.serves(q=q, v=v, T=T, K=K, V=V, root=root, raw16=raw16, block_v=asked_v, num_warps=asked_warps):
            gkw, ggrid = gluon_gdn.kernel_args(kw)
            return bind(gluon_gdn._gdn_fold_kernel, ggrid, gkw), o
    return bind(_gdn_wy_kernel, grid, kw), o
