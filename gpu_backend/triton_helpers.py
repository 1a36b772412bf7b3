"""@triton.jit building blocks shared by the GDN verify and commit kernels: program coordinates,
row loads with the in-kernel q/k l2-norm, the gates (given, or fused from a, b, A_log, dt_bias),
the committed state of a pool slot, a parent-indexed node's source state and a chunk of a node's root path (also
KDA's and lightning attention's), one gated delta-rule step, and the pieces the WY kernels start
from: the root's recurrent step, a block of draft rows, and the whole per-V-tile prologue (wy_tile). Loads and
arithmetic come apart where a kernel should issue all of its reads before its first reduction (normed, raw_gates /
gate_values, root_reads / root_step, wy_reads / wy_values): Triton puts a barrier at each reduction, and a read
issued after one waits a memory round trip of its own. Reference: the per-node step of oracle.gdn (float64), which
the property suites compare every kernel against.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softplus(x):
    # a NaN stays NaN, as torch's softplus keeps it (the plain minimum would return 20: a finite gate)
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0, propagate_nan=tl.PropagateNan.ALL))))


@triton.jit
def head_coords(H: tl.constexpr, HV: tl.constexpr):
    """Grid (V tiles, B * HV): (V tile, sequence, value head, its key head HV/H-grouped)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_hv = i_bh % HV
    return i_v, i_bh // HV, i_hv, i_hv // (HV // H)


@triton.jit
def kv_tile(i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets and masks of the key rows [BK] and of V tile i_v's columns [BV] of a state."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    return o_k, o_v, o_k < K, o_v < V


@triton.jit
def load_rows(ptr, rows, head, cols, m, NH: tl.constexpr, D: tl.constexpr, L2NORM: tl.constexpr,
              AXIS: tl.constexpr, RS: tl.constexpr):
    """fp32 values of ptr [B*T, NH, D] (row r at r * RS: _common.rows_of) at (rows, head, cols): a vector (AXIS 0) for
    a scalar row, a block [R, C] (AXIS 1) for rows [R, 1] and cols [1, C]; with L2NORM each row is divided by its l2
    norm."""
    return normed(raw_rows(ptr, rows, head, cols, m, NH, D, RS), L2NORM, AXIS)


@triton.jit
def raw_rows(ptr, rows, head, cols, m, NH: tl.constexpr, D: tl.constexpr, RS: tl.constexpr):
    """load_rows' read alone: ptr [B*T, NH, D] at (rows, head, cols) in its own dtype (no conversion, no norm). Row r
    lies at r * RS: NH * D where the rows are contiguous (the offset computed as it always was), wider where they are
    views of a fused projection's rows (_common.rows_of)."""
    if RS == NH * D:
        return tl.load(ptr + (rows * NH + head) * D + cols, mask=m, other=0.0)
    return tl.load(ptr + rows * RS + head * D + cols, mask=m, other=0.0)


@triton.jit
def normed(x, L2NORM: tl.constexpr, AXIS: tl.constexpr):
    """load_rows' arithmetic on rows already loaded (in their own dtype): fp32, each row divided by its l2 norm
    with L2NORM. Loading first and norming later lets a kernel issue all of its reads before the first reduction
    (a reduction is a barrier, and a read issued after one waits a memory round trip of its own)."""
    x = x.to(tl.float32)
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=AXIS, keep_dims=True) + 1e-6)
    return x


@triton.jit
def gate_params(A_log, dt_bias, i_hv, FUSED: tl.constexpr):
    """(-exp(A_log), dt_bias) of one value head for fused gates; zeros otherwise (unused)."""
    if FUSED:
        neg_A = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
        bias = tl.load(dt_bias + i_hv).to(tl.float32)
    else:
        neg_A = 0.0
        bias = 0.0
    return neg_A, bias


@triton.jit
def gates(g, beta, offs, m, neg_A, bias, FUSED: tl.constexpr, MASKED: tl.constexpr):
    """(log-decay g, beta) at offs of the [B*T, HV] gate inputs (masked by m when MASKED). FUSED:
    g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) from the raw projections a (in g),
    b (in beta)."""
    raw_g, raw_b = raw_gates(g, beta, offs, m, MASKED)
    return gate_values(raw_g, raw_b, neg_A, bias, FUSED)


@triton.jit
def raw_gates(g, beta, offs, m, MASKED: tl.constexpr):
    """The gate inputs at offs, fp32, before gate_values (gates' reads alone)."""
    if MASKED:
        raw_g = tl.load(g + offs, mask=m, other=0.0).to(tl.float32)
        raw_b = tl.load(beta + offs, mask=m, other=0.0).to(tl.float32)
    else:
        raw_g = tl.load(g + offs).to(tl.float32)
        raw_b = tl.load(beta + offs).to(tl.float32)
    return raw_g, raw_b


@triton.jit
def gate_values(raw_g, raw_b, neg_A, bias, FUSED: tl.constexpr):
    """gates' arithmetic on raw_gates' values."""
    if FUSED:
        b_g = neg_A * softplus(raw_g + bias)
        b_beta = tl.sigmoid(raw_b)
    else:
        b_g = raw_g
        b_beta = raw_b
    return b_g, b_beta


@triton.jit
def pool_slot(state_idx, i_b):
    """(slot, live): sequence i_b's pool slot and whether it has one. An engine pads a CUDA-graph batch with slot -1
    (SGLang's PAD_SLOT_ID): such a row reads a zero state (its loads masked off by ``live``, its address slot 0's)
    and its commit writes nothing."""
    slot = tl.load(state_idx + i_b)
    return tl.maximum(slot, 0), slot >= 0


@triton.jit
def tree_depth(depths, i_b, NPD: tl.constexpr, DEPTHS: tl.constexpr):
    """Sequence i_b's tree depth with DEPTHS: the deepest of row i_b of depths [B, NPD] int32 (each block of 32 nodes'
    deepest node's, as a device plan's kernel wrote them: device_checks.DevicePlan.depth_table), its NPD scalar reads
    unrolled (they go out together); else 0, nothing read. Read it with a kernel's first reads and count its rounds
    (solve_rounds) where they start: counted right after the read, the one-kernel form took 5.9 us of device time at
    1 x 16 against 5.5 (H100, two leases, RESULTS.md)."""
    d = 0
    if DEPTHS:
        d = tl.load(depths + i_b * NPD)
        for j in tl.static_range(1, NPD):
            d = tl.maximum(d, tl.load(depths + i_b * NPD + j))
    return d


@triton.jit
def solve_rounds(NSTEP, d, DEPTHS: tl.constexpr, EXTRA: tl.constexpr):
    """The doubling rounds of a sequence's triangular solve: NSTEP (the launch's, from the plan's deepest tree), or
    with DEPTHS its own tree's, ceil(log2(d + EXTRA)), d its depth (tree_depth's). No reduction: one before the
    solve (the rounds counted from the ancestor mask) took 0.3 us more device time than a bound's rounds at 1 x 16
    (benchmarks/RESULTS.md)."""
    n = NSTEP
    if DEPTHS:
        d = d + EXTRA
        n = d * 0
        for r in tl.static_range(16):  # the powers of two below d: ceil(log2(d)) rounds, d < 2^16
            n += (d > (1 << r)).to(tl.int32)
    return n


@triton.jit
def live_rows(o_k, K, live):
    """[BK] bool: the state's key rows o_k to read, those below K, none for a padded row (``live`` False). Made by a
    comparison with a block, not as ``block & scalar``, which Triton's interpreter turns into int64 (a mask its
    loads refuse)."""
    return o_k < tl.where(live, K, 0)


@triton.jit
def state_ptrs(state, slot, i_hv, o_k, o_v, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, VK: tl.constexpr):
    """Pointers [BK, BV] to the (K, V) entries of a state pool [N, HV, K, V] at (slot, i_hv): stored
    so (contiguous), or with VK as the transpose of a contiguous [N, HV, V, K] pool (SGLang's layout,
    read and written in place without a transposing copy)."""
    if VK:
        return state + ((slot.to(tl.int64) * HV + i_hv) * V + o_v[None, :]) * K + o_k[:, None]
    return state + ((slot.to(tl.int64) * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :]


@triton.jit
def state_ptrs32(state, slot, i_hv, o_k, o_v, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, VK: tl.constexpr):
    """state_ptrs' pointers as a 64-bit scalar base plus 32-bit offsets [BK, BV]: no 64-bit offset tensor live (the
    head kernel's spills: RESULTS.md). The other kernels keep state_ptrs' form: offline, this one gave the commit
    kernel 167 registers against 128, and no kernel but the head kernel fewer spills."""
    base = state + (slot.to(tl.int64) * HV + i_hv) * (K * V)
    if VK:
        return base + (o_v[None, :] * K + o_k[:, None])
    return base + (o_k[:, None] * V + o_v[None, :])


@triton.jit
def source_state(snap, src, row, seq_row0, s0, i_h, o_k, o_v, mkv, H: tl.constexpr, K: tl.constexpr,
                 V: tl.constexpr, VK: tl.constexpr):
    """The state a parent-indexed node starts from, [BK, BV]: its parent's from the per-node states snap
    [R, H, K, V] (src[row] the parent, seq_row0 the row of the sequence's first node; with VK snap is the transpose of
    a contiguous [R, H, V, K], as state_ptrs), the committed s0 for the root."""
    p = tl.load(src + row)
    sp = tl.load(state_ptrs(snap, seq_row0 + tl.maximum(p, 0), i_h, o_k, o_v, H, K, V, VK), mask=mkv, other=0.0)
    return tl.where(p >= 0, sp, s0)


@triton.jit
def store_state(snap, row, S, i_h, o_k, o_v, mkv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                PARENT_INDEXED: tl.constexpr, VK: tl.constexpr):
    """Node row's state S [BK, BV] into the per-node states snap [R, H, K, V] (source_state's other half; VK as
    there); where a later node starts from it (PARENT_INDEXED), a barrier: it may be read back through other
    threads."""
    tl.store(state_ptrs(snap, row, i_h, o_k, o_v, H, K, V, VK), S, mask=mkv)
    if PARENT_INDEXED:
        tl.debug_barrier()


@triton.jit
def path_chunk(paths, row, t, c, n_chunks, DMAX, o_d, BD: tl.constexpr):
    """Chunk c of node t's root path read from the node back (chunk 0 the last): the path positions' nodes [BD]
    (-1 where the path has none), which of them are on it, and which are strict ancestors (not t itself)."""
    d = (n_chunks - 1 - c) * BD + o_d
    anc = tl.load(paths + row * DMAX + d, mask=d < DMAX, other=-1)
    valid = anc >= 0
    return anc, valid, valid & (anc != t)


@triton.jit
def delta_step(S, b_k, b_v, b_g, b_beta):
    """One gated delta-rule step on S [BK, BV]: S <- exp(g) S + k (beta (v - (exp(g) S)^T k))^T."""
    S = S * tl.exp(b_g)
    u = b_beta * (b_v - tl.sum(S * b_k[:, None], 0))  # [BV]
    return S + b_k[:, None] * u[None, :]


@triton.jit
def wy_root(q, k, v, g, beta, state, state_idx, o, i_b, i_h, i_hv, T, scale, o_k, o_v, mk, mv, neg_A, bias,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, FUSED: tl.constexpr,
            L2NORM: tl.constexpr, STATE_VK: tl.constexpr, QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr):
    """The root (node 0, every node's ancestor) of sequence i_b, recurrently: stores its output o_0
    [BV] and returns its state S_r [BK, BV], the state the draft nodes build on."""
    r0 = (i_b * T).to(tl.int64)
    q0, k0, v0, raw_g0, raw_b0, s0 = root_reads(q, k, v, g, beta, state, state_idx, r0, i_b, i_h, i_hv, o_k, o_v,
                                                 mk, mv, H, HV, K, V, STATE_VK, QS, KS, VS)
    return root_step(q0, k0, v0, raw_g0, raw_b0, s0, o, r0, i_hv, scale, o_v, mv, neg_A, bias, HV, V, FUSED, L2NORM)


@triton.jit
def root_reads(q, k, v, g, beta, state, state_idx, r0, i_b, i_h, i_hv, o_k, o_v, mk, mv, H: tl.constexpr,
               HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, STATE_VK: tl.constexpr, QS: tl.constexpr,
               KS: tl.constexpr, VS: tl.constexpr):
    """wy_root's reads, issued together (the state's after its pool slot's: two round trips in all): the root's
    q, k [BK] and v [BV] rows in their own dtype, its raw gates, and the committed state tile [BK, BV]."""
    slot, live = pool_slot(state_idx, i_b)
    q0 = raw_rows(q, r0, i_h, o_k, mk, H, K, QS)
    k0 = raw_rows(k, r0, i_h, o_k, mk, H, K, KS)
    v0 = raw_rows(v, r0, i_hv, o_v, mv, HV, V, VS)
    raw_g0, raw_b0 = raw_gates(g, beta, r0 * HV + i_hv, 0, False)
    s0 = tl.load(state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                 mask=live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)
    return q0, k0, v0, raw_g0, raw_b0, s0


@triton.jit
def root_step(q0, k0, v0, raw_g0, raw_b0, s0, o, r0, i_hv, scale, o_v, mv, neg_A, bias, HV: tl.constexpr,
              V: tl.constexpr, FUSED: tl.constexpr, L2NORM: tl.constexpr):
    """wy_root's arithmetic on root_reads' values: S_r, with o_0 stored."""
    q0 = normed(q0, L2NORM, 0)
    k0 = normed(k0, L2NORM, 0)
    g0, beta0 = gate_values(raw_g0, raw_b0, neg_A, bias, FUSED)
    s0 = delta_step(s0, k0, v0.to(tl.float32), g0, beta0)
    tl.store(o + (r0 * HV + i_hv) * V + o_v, tl.sum(s0 * (q0 * scale)[:, None], 0).to(o.dtype.element_ty), mask=mv)
    return s0


@triton.jit
def wy_tile(q, k, v, g, beta, A_log, dt_bias, state, state_idx, o, T, scale, H: tl.constexpr, HV: tl.constexpr,
            K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
            FUSED: tl.constexpr, L2NORM: tl.constexpr, STATE_VK: tl.constexpr, QS: tl.constexpr, KS: tl.constexpr,
            VS: tl.constexpr):
    """What every per-V-tile WY kernel (grid (V tiles, B * HV)) starts from: its coordinates
    (sequence i_b, key head i_h, value head i_hv), the offsets o_t [BT], o_k [BK], o_v [BV] with
    masks mk, mv, the root's state S_r [BK, BV] (wy_root's, which stores o_0), the draft rows: mask mt [BT] and
    rows [BT] (int64) of nodes 1..T-1, and wy_rows' values of them (q, k [BT, BK] l2-normed, v [BT, BV] in v's own
    dtype, g, beta [BT]; a kernel that uses none of them reads none: unused loads are dropped). wy_reads, then
    wy_values: a kernel with reads of its own issues them between the two."""
    reads = wy_reads(q, k, v, g, beta, A_log, dt_bias, state, state_idx, T, H, HV, K, V, BT, BK, BV, FUSED, STATE_VK,
                     QS, KS, VS)
    return wy_values(reads, o, scale, HV, V, FUSED, L2NORM)


@triton.jit
def block_coords(A_log, dt_bias, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FUSED: tl.constexpr):
    """A WY block program's place: (V tile, sequence, value head, key head), the block's row offsets [BT], the key
    and value offsets and masks (kv_tile's), and the fused gates' parameters of its value head (gate_params')."""
    i_v, i_b, i_hv, i_h = head_coords(H, HV)
    o_t = tl.arange(0, BT)
    o_k, o_v, mk, mv = kv_tile(i_v, K, V, BK, BV)
    neg_A, bias = gate_params(A_log, dt_bias, i_hv, FUSED)
    return i_v, i_b, i_hv, i_h, o_t, o_k, o_v, mk, mv, neg_A, bias


@triton.jit
def wy_reads(q, k, v, g, beta, A_log, dt_bias, state, state_idx, T, H: tl.constexpr, HV: tl.constexpr,
             K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
             FUSED: tl.constexpr, STATE_VK: tl.constexpr, QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr):
    """wy_tile's reads, every one issued before any arithmetic that reduces (a reduction is a barrier, and a read
    issued after one waits a memory round trip of its own): one round trip, and a second for the state behind its
    pool slot, where reading the root, then the rows, took five in the one-kernel form at 1 x 16 (compiled for
    sm_90). A tuple for wy_values."""
    _, i_b, i_hv, i_h, o_t, o_k, o_v, mk, mv, neg_A, bias = block_coords(A_log, dt_bias, H, HV, K, V, BT, BK, BV, FUSED)
    r0 = (i_b * T).to(tl.int64)
    mt = o_t < T - 1
    rows = (i_b * T + 1 + o_t).to(tl.int64)
    q0, k0, v0, raw_g0, raw_b0, s0 = root_reads(q, k, v, g, beta, state, state_idx, r0, i_b, i_h, i_hv, o_k, o_v,
                                                 mk, mv, H, HV, K, V, STATE_VK, QS, KS, VS)
    return (i_b, i_h, i_hv, o_t, o_k, o_v, mk, mv, neg_A, bias, r0, mt, rows, q0, k0, v0, raw_g0, raw_b0, s0,
            draft_reads(q, k, v, g, beta, rows, mt, i_h, i_hv, o_k, o_v, mk, mv, H, HV, K, V, QS, KS, VS))


@triton.jit
def wy_values(reads, o, scale, HV: tl.constexpr, V: tl.constexpr, FUSED: tl.constexpr, L2NORM: tl.constexpr):
    """wy_tile's values from wy_reads' tuple (the root's step taken, o_0 stored)."""
    i_b, i_h, i_hv, o_t, o_k, o_v, mk, mv, neg_A, bias, r0, mt, rows, q0, k0, v0, raw_g0, raw_b0, s0, draft = reads
    s0 = root_step(q0, k0, v0, raw_g0, raw_b0, s0, o, r0, i_hv, scale, o_v, mv, neg_A, bias, HV, V, FUSED, L2NORM)
    b_q, b_k, b_v, b_g, b_beta = draft_values(draft, mt, neg_A, bias, FUSED, L2NORM)
    return i_b, i_h, i_hv, o_t, o_k, o_v, mk, mv, neg_A, bias, s0, mt, rows, b_q, b_k, b_v, b_g, b_beta


@triton.jit
def wy_rows(q, k, v, g, beta, rows, mt, i_h, i_hv, o_k, o_v, mk, mv, neg_A, bias,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, FUSED: tl.constexpr,
            L2NORM: tl.constexpr, QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr):
    """A block of draft rows (rows [BT], valid where mt): q, k [BT, BK] (l2-normed), v [BT, BV] (fp32) and
    the gates g, beta [BT] (0 on padding rows). draft_reads, then draft_values."""
    b_q, b_k, b_v, b_g, b_beta = draft_values(
        draft_reads(q, k, v, g, beta, rows, mt, i_h, i_hv, o_k, o_v, mk, mv, H, HV, K, V, QS, KS, VS), mt, neg_A, bias,
        FUSED, L2NORM)
    return b_q, b_k, b_v.to(tl.float32), b_g, b_beta


@triton.jit
def draft_reads(q, k, v, g, beta, rows, mt, i_h, i_hv, o_k, o_v, mk, mv, H: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, QS: tl.constexpr, KS: tl.constexpr, VS: tl.constexpr):
    """wy_rows' reads alone: q, k [BT, BK] and v [BT, BV] of the draft rows in their own dtype, and their raw
    gates [BT]. A tuple for draft_values."""
    mqk = mt[:, None] & mk[None, :]
    b_q = raw_rows(q, rows[:, None], i_h, o_k[None, :], mqk, H, K, QS)
    b_k = raw_rows(k, rows[:, None], i_h, o_k[None, :], mqk, H, K, KS)
    b_v = raw_rows(v, rows[:, None], i_hv, o_v[None, :], mt[:, None] & mv[None, :], HV, V, VS)
    raw_g, raw_b = raw_gates(g, beta, rows * HV + i_hv, mt, True)
    return b_q, b_k, b_v, raw_g, raw_b


@triton.jit
def draft_values(reads, mt, neg_A, bias, FUSED: tl.constexpr, L2NORM: tl.constexpr):
    """wy_rows' arithmetic on draft_reads' tuple: q, k l2-normed (fp32), v as read, g, beta (0 on padding rows)."""
    b_q, b_k, b_v, raw_g, raw_b = reads
    b_g, b_beta = gate_values(raw_g, raw_b, neg_A, bias, FUSED)
    return normed(b_q, L2NORM, 1), normed(b_k, L2NORM, 1), b_v, tl.where(mt, b_g, 0.0), tl.where(mt, b_beta, 0.0)
