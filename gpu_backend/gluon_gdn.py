"""The one-kernel WY form folded into its output's weights, in Gluon (Triton's lower-level language): the kernel
design "fused" launches for a tree of at most 16 nodes with the root in its block and bf16 q and k, on a GPU that
compiles it (Ampere or later), where triton_gdn._gdn_wy_kernel (its reference, the same mathematics unfolded) is
launched otherwise.

Why a second language: at one sequence of 16 nodes the form waits on its reads after the timer's flush (issue #36's
bound, 8 us at 1 x 16, RESULTS.md). Two things Triton's language cannot state bring it 0.7 us (13%) of device time
under the Triton form on an H100 (benchmarks/gluon_fold.py):
  - the state's tile copied into shared memory asynchronously (cp.async) once its slot arrives, and waited for only
    where P S0 needs it, read from there straight into the product's operand layout;
  - every read issued before any is used: without that ptxas sums the path gates, or the rows' norms, before some
    reads, which then go out a round trip late, beside the state's copy, and queue behind it. Three barriers among
    the reads (q, k, v's; beta's; the gates', the mask's and the gate parameters'; then the slot's) keep ptxas from
    moving a read between groups, and every read's first use is tied to the slot's value, the last read (a zero made
    from it added), so that no use can go before it. Compiled for sm_90, no read goes out after a use in any way the
    kernel reads its inputs (tests/test_gluon_gdn.py; the two barriers alone, as benchmarks/gluon_fold.py has them,
    left 4-7 late with fused gates or rows past the tree).
P S0's three products accumulate in three chains, not one three times as deep.

The fold (per value head and V tile; D [BT, BT] = A_t / A_j on ancestors-or-self, rows' norms as read, -L = N with
the root's column c taken out, ROOT 2 of the Triton form):
  X = (D o Q K^T) prod_r (I + N^(2^r)),  W = X (I + c e_0^T)
  P = diag(A_q) Q - W diag(beta A_k) K,  Y = W diag(beta) V,  O = P S0 + Y
Products: K K^T and Q K^T exact (bf16 operands as read), the others' fp32 side split into bf16 head and remainder
(bf16x3, or two MMAs against raw bf16 k, v), all mma.sync (mma_v2: Ampere's instruction, which Hopper and Blackwell
run too). Its bf16 outputs hold the Triton form's bar at full size, at most 1.01x the error of rounding the float64
oracle to bf16 (properties/test_gluon_fold.py); 0.40% of them are off the rounded oracle at 1 x 16, against the Triton
form's 0.26% (RESULTS.md).

What it takes (``serves``): B sequences of T <= 16 nodes (a 16-row block, the root row 0), bf16 q, k, v, K 64 or
128 and V a multiple of 64, the gates given or fused (A_log, dt_bias), a state pool read through its slot table
(a padded slot, -1, reads a zero state) contiguous or in SGLang's layout (STATE_VK), q, k, v rows strided as
_common.rows_of gives them, with or without the l2 norms, exact or leaky (the mask), the solve's rounds the plan's or,
on a device plan (a captured call's), each sequence's own from its depth (DEPTHS). Not: fp32 or fp16 inputs, other
tiles or warps.
"""
from __future__ import annotations

import functools

import torch

from ddsim.gpu_backend import _common as C

try:  # Gluon ships with Triton 3.5 and later; its Ampere module gives cp.async and mma.sync
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
except ImportError:  # an older Triton: the Triton form serves every tree
    gluon = None

BT_GLUON = 16  # the block's rows: trees of at most 16 nodes, the root row 0
BV_GLUON = 64  # the V tile (two 32-wide halves, each its own products and store)
WARPS_GLUON = 4


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this Triton has Gluon with what the kernel uses (cp.async, mma.sync, barriers by either name)."""
    return gluon is not None and hasattr(gl, "NVMMADistributedLayout") and (hasattr(gl, "barrier") or
                                                                            hasattr(gl, "thread_barrier"))


def serves(*, q: torch.Tensor, v: torch.Tensor, T: int, K: int, V: int, root: int, raw16: bool,
           block_v: int | None, num_warps: int | None) -> bool:
    """Whether the one-kernel form's launch (triton_gdn.plan_wy's, design "fused") is this kernel's: a block of 16
    rows with the root in it (root 2), bf16 q, k (taken as read: raw16, triton_gdn.FUSED_RAW16) and v, no other V
    tile or warps asked for, K 64 or 128, V a multiple of 64, compiled (not Triton's interpreter)
    for a GPU of compute capability 8.0 or later (a CPU tensor: compiled for a target named elsewhere,
    tests/gpu_compile.py)."""
    if not (available() and not C.interpreting() and root == 2 and raw16 and v.dtype == torch.bfloat16):
        return False
    if T > BT_GLUON or K not in (64, 128) or V % BV_GLUON or block_v not in (None, BV_GLUON):
        return False
    if num_warps not in (None, WARPS_GLUON):
        return False
    return not q.is_cuda or torch.cuda.get_device_capability(q.device) >= (8, 0)


def kernel_args(kw: dict) -> tuple[dict, tuple]:
    """(keyword arguments, grid) of the Gluon fold from the Triton form's (triton_gdn.plan_wy's kw: the same inputs,
    outputs and options)."""
    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "mask", "state", "state_idx", "o", "T", "scale", "NSTEP",
             "depths", "H", "HV", "K", "V", "FUSED", "L2NORM", "STATE_VK", "QS", "KS", "VS", "DEPTHS", "NPD")
    args = {n: kw[n] for n in names}
    args.update(BT=BT_GLUON, BV=BV_GLUON, FULL=kw["T"] == BT_GLUON, num_warps=WARPS_GLUON)
    return args, (kw["V"] // BV_GLUON, kw["o"].shape[0] * kw["HV"])


if gluon is not None:
    if hasattr(gl, "barrier"):  # a barrier across the program's threads: Triton 3.9's name, or 3.5-3.6's
        @gluon.jit
        def _thread_barrier():
            gl.barrier()
    else:
        @gluon.jit
        def _thread_barrier():
            gl.thread_barrier()

    if hasattr(async_copy, "async_load"):  # cp.async of a block of pointers into shared memory: 3.9's name, 3.5-3.6's
        @gluon.jit
        def _cp_async(smem, ptrs, m):
            async_copy.async_load(smem, ptrs, mask=m)
    else:
        @gluon.jit
        def _cp_async(smem, ptrs, m):
            async_copy.async_copy_global_to_shared(smem, ptrs, mask=m)

    @gluon.jit
    def _split(x, layout: gl.constexpr):
        # x fp32 as its bf16 head and remainder, each in ``layout``
        hi = x.to(gl.bfloat16)
        lo = (x - hi.to(gl.float32)).to(gl.bfloat16)
        return gl.convert_layout(hi, layout), gl.convert_layout(lo, layout)

    @gluon.jit
    def _dot3(a, b, acc, A_OP: gl.constexpr, B_OP: gl.constexpr):
        # acc + a b for fp32 a, b (bf16x3: head by head, head by remainder, remainder by head)
        a_hi, a_lo = _split(a, A_OP)
        b_hi, b_lo = _split(b, B_OP)
        return mma_v2(a_hi, b_hi, mma_v2(a_hi, b_lo, mma_v2(a_lo, b_hi, acc)))

    @gluon.jit
    def _dot2(a, b16, acc, A_OP: gl.constexpr):
        # acc + a b for fp32 a and bf16 b (exact): a's head and remainder, two MMAs
        a_hi, a_lo = _split(a, A_OP)
        return mma_v2(a_hi, b16, mma_v2(a_lo, b16, acc))

    @gluon.jit
    def _load(ptrs, m, FULL: gl.constexpr):
        # ptrs' values, those off m zero; FULL (every row a node: T == BT) unmasked, without the masks' instructions
        if FULL:
            return gl.load(ptrs)
        return gl.load(ptrs, mask=m, other=0)

    @gluon.jit
    def _out_half(p_hi, p_lo, s, Y, ptrs, m, FULL: gl.constexpr):
        # P S0 + Y stored [BT, BV / 2]: the state's half tile s [K, BV / 2] fp32 (in the products' operand layout)
        # split into its bf16 head and remainder, its three products accumulated apart (three chains of K / 16 MMAs,
        # where one would be 3 K / 16 deep) and summed
        s_hi = s.to(gl.bfloat16)
        s_lo = (s - s_hi.to(gl.float32)).to(gl.bfloat16)
        zero = gl.zeros_like(Y)
        b_o = mma_v2(p_hi, s_hi, Y) + (mma_v2(p_hi, s_lo, zero) + mma_v2(p_lo, s_hi, zero))
        if FULL:
            gl.store(ptrs, b_o.to(gl.bfloat16))
        else:
            gl.store(ptrs, b_o.to(gl.bfloat16), mask=m)

    @gluon.jit
    def _softplus(x):
        # torch's softplus (threshold 20), a NaN kept NaN (a minimum would make it 20: a finite gate)
        return gl.where(x != x, x, gl.where(x > 20.0, x, gl.log(1.0 + gl.exp(gl.minimum(x, 20.0)))))

    @gluon.jit
    def _fold(q_raw, k_raw, k_t, b_v0, b_v1, b_beta, beta_col, g_col, anc, scale, NSTEP, L2NORM: gl.constexpr,
              BT: gl.constexpr, K: gl.constexpr, HB: gl.constexpr, MMA: gl.constexpr, A_OP: gl.constexpr,
              B_OP: gl.constexpr):
        # (P's bf16 head and remainder in A_OP, Y's two halves [BT, HB] in MMA) of the fold on one value head's rows:
        # q, k [BT, K] bf16 as read (k^T [K, BT] too), v's halves [BT, HB] bf16, beta by rows and by columns, g by
        # columns, the ancestor-or-self mask [BT, BT], the root row 0 (the served kernel's and
        # benchmarks/gluon_fold.py's)
        ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
        COLS: gl.constexpr = gl.SliceLayout(0, MMA)
        rows = gl.arange(0, BT, layout=ROWS)
        cols = gl.arange(0, BT, layout=COLS)
        # gates along each path: G [BT], D [BT, BT] = A_t / A_j on ancestors-or-self
        G = gl.sum(gl.where(anc, g_col[None, :], 0.0), 1)
        G_col = gl.convert_layout(G, COLS)
        D = gl.where(anc, gl.exp(G[:, None] - G_col[None, :]), 0.0)
        A = gl.exp(G)

        # K K^T, Q K^T (exact); the norms: columns' from K K^T's diagonal, rows' from the rows as read
        zero_tt = gl.zeros([BT, BT], gl.float32, MMA)
        kT_op = gl.convert_layout(k_t, B_OP)
        KK = mma_v2(gl.convert_layout(k_raw, A_OP), kT_op, zero_tt)
        QK = mma_v2(gl.convert_layout(q_raw, A_OP), kT_op, zero_tt)
        q32 = q_raw.to(gl.float32)
        if L2NORM:
            eye = rows[:, None] == cols[None, :]
            ik_col = 1.0 / gl.sqrt(gl.sum(gl.where(eye, KK, 0.0), 0) + 1e-6)
            k32 = k_raw.to(gl.float32)
            ik = gl.convert_layout(1.0 / gl.sqrt(gl.sum(k32 * k32, 1) + 1e-6), ROWS)
            iq = gl.convert_layout(scale / gl.sqrt(gl.sum(q32 * q32, 1) + 1e-6), ROWS)
            KK = KK * ik_col[None, :]
            QK = QK * ik_col[None, :]
        else:
            ik = gl.full([BT], 1.0, gl.float32, ROWS)
            iq = gl.full([BT], 1.0, gl.float32, ROWS) * scale

        # -L through D, the root's column c taken out; the rows' norms in -L's rows, A_k, A_q and D's rows
        NL = gl.where(rows[:, None] != cols[None, :], -(b_beta * ik)[:, None] * D * KK, 0.0)
        A_k = A * ik
        A_q = A * iq
        D = D * iq[:, None]
        first = cols == 0
        c = gl.sum(gl.where(first[None, :], NL, 0.0), 1)  # [BT] rows
        NL = gl.where(first[None, :], 0.0, NL)

        # the fold: X = (D o Q K^T) prod_r (I + N^(2^r)), W = X (I + c e_0^T), P = diag(A_q) Q - W diag(beta A_k) K,
        # Y = W diag(beta) V (the first doubling step outside the loop: the last squares nothing it does not use)
        X = D * QK
        if NSTEP > 0:
            X = _dot3(X, NL, X, A_OP, B_OP)
        for _ in range(1, NSTEP):
            NL = _dot3(NL, NL, zero_tt, A_OP, B_OP)
            X = _dot3(X, NL, X, A_OP, B_OP)
        c_col = gl.convert_layout(c, COLS)
        W = X + gl.where(first[None, :], gl.sum(X * c_col[None, :], 1)[:, None], 0.0)
        Ak_col = gl.convert_layout(A_k, COLS)
        k_op = gl.convert_layout(k_raw, B_OP)  # [BT, K] as the right operand
        Pk = _dot2(W * (beta_col * Ak_col)[None, :], k_op, gl.zeros([BT, K], gl.float32, MMA), A_OP)
        P = A_q[:, None] * gl.convert_layout(q32, MMA) - Pk
        Wb = W * beta_col[None, :]
        Y0 = _dot2(Wb, gl.convert_layout(b_v0, B_OP), gl.zeros([BT, HB], gl.float32, MMA), A_OP)
        Y1 = _dot2(Wb, gl.convert_layout(b_v1, B_OP), gl.zeros([BT, HB], gl.float32, MMA), A_OP)
        p_hi, p_lo = _split(P, A_OP)
        return p_hi, p_lo, Y0, Y1

    @gluon.jit(**C.ROUNDS_AS_VALUE)
    def _gdn_fold_kernel(q, k, v, g, beta, A_log, dt_bias,
                         mask,  # [B, T, T] int8 ancestor-or-self (the chain mask for leaky)
                         state, state_idx, o,  # pool [N, HV, K, V] fp32 (or SGLang's [N, HV, V, K]), slots [B], o [B, T, HV, V]
                         T, scale, NSTEP,  # NSTEP = ceil(log2(depth)) doubling steps: the draft nodes' chains
                         depths,  # DEPTHS: [B, NPD] int32 each tree's depth per block of 32 nodes (a device plan's)
                         H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                         BT: gl.constexpr, BV: gl.constexpr, FUSED: gl.constexpr, L2NORM: gl.constexpr,
                         STATE_VK: gl.constexpr, QS: gl.constexpr, KS: gl.constexpr, VS: gl.constexpr,
                         FULL: gl.constexpr, DEPTHS: gl.constexpr, NPD: gl.constexpr):
        # a program per (V tile, sequence x value head); the tree's nodes are rows 0..T-1 of a BT-row block, the root
        # row 0 on top of the committed state S0
        i_v = gl.program_id(0)
        i_bh = gl.program_id(1)
        i_b = i_bh // HV
        i_hv = i_bh % HV
        i_h = i_hv // (HV // H)
        num_warps: gl.constexpr = gl.num_warps()
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps],
                                                      instr_shape=[16, 8])
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        ROWS: gl.constexpr = gl.SliceLayout(1, MMA)  # [BT] a value per row
        COLS: gl.constexpr = gl.SliceLayout(0, MMA)  # [BT] / [BV] a value per column
        LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [BT, K] bf16, 16 bytes a thread
        LDT: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, num_warps], [0, 1])  # [K, BT]: k^T read by columns
        HB: gl.constexpr = BV // 2

        # q, k [BT, K] as read (k^T [K, BT] too) and v [BT, BV] in the tile's two halves, rows past T zero
        r_ld = gl.arange(0, BT, layout=gl.SliceLayout(1, LD))
        c_ld = gl.arange(0, K, layout=gl.SliceLayout(0, LD))
        row_ld = (i_b * T + r_ld).to(gl.int64)
        m_ld = (r_ld < T)[:, None] & (c_ld < K)[None, :]
        q_raw = _load(q + row_ld[:, None] * QS + i_h * K + c_ld[None, :], m_ld, FULL)
        k_raw = _load(k + row_ld[:, None] * KS + i_h * K + c_ld[None, :], m_ld, FULL)
        r_t = gl.arange(0, K, layout=gl.SliceLayout(1, LDT))
        c_t = gl.arange(0, BT, layout=gl.SliceLayout(0, LDT))
        row_t = (i_b * T + c_t).to(gl.int64)
        k_t = _load(k + row_t[None, :] * KS + i_h * K + r_t[:, None], (r_t < K)[:, None] & (c_t < T)[None, :], FULL)
        rows = gl.arange(0, BT, layout=ROWS)
        cols = gl.arange(0, BT, layout=COLS)
        mr = rows < T
        mc = cols < T
        row_o = (i_b * T + rows).to(gl.int64)
        col_o = (i_b * T + cols).to(gl.int64)
        o_v0 = i_v * BV + gl.arange(0, HB, layout=COLS)
        o_v1 = o_v0 + HB
        m_v = mr[:, None] & (o_v0 < V)[None, :]
        b_v0 = _load(v + row_o[:, None] * VS + i_hv * V + o_v0[None, :], m_v, FULL)  # [BT, HB] bf16
        b_v1 = _load(v + row_o[:, None] * VS + i_hv * V + o_v1[None, :], m_v, FULL)
        # a barrier after q, k, v's reads, one after beta's and one before the slot's: without them ptxas puts the
        # path gates' sums (which wait for the gates and the mask) before some of q, k, v's reads, and those go out a
        # round trip late, beside the state's copy (compiled for sm_90); a read cannot cross a barrier
        # (benchmarks/gluon_fold.py's FENCE)
        _thread_barrier()
        raw_b = _load(beta + row_o * HV + i_hv, mr, FULL).to(gl.float32)
        raw_b_col = _load(beta + col_o * HV + i_hv, mc, FULL).to(gl.float32)
        _thread_barrier()
        raw_g = _load(g + col_o * HV + i_hv, mc, FULL).to(gl.float32)
        anc = _load(mask + row_o[:, None] * T + cols[None, :], mr[:, None] & mc[None, :], FULL)
        if FUSED:  # the value head's gate parameters, read last (read first, ptxas puts exp(A_log) among the reads):
            # g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
            raw_A = gl.load(A_log + i_hv)
            bias = gl.load(dt_bias + i_hv).to(gl.float32)
        if DEPTHS:  # a device plan's tree (a captured call's): this sequence's own depth, its rounds counted below
            depth = gl.load(depths + i_b * NPD)
            for j in gl.static_range(1, NPD):
                depth = gl.maximum(depth, gl.load(depths + i_b * NPD + j))
        # the slot last, behind a third barrier (the state's address waits for it; a padded sequence, -1, reads a
        # zero state), and every read's first use tied to it by a zero made from it: no use can then go before the
        # last read
        _thread_barrier()
        slot_raw = gl.load(state_idx + i_b)
        live = slot_raw >= 0
        slot = gl.maximum(slot_raw, 0).to(gl.int64)
        zf = slot_raw.to(gl.float32)
        zero = zf - zf
        z16 = zero.to(gl.bfloat16)
        q_raw = q_raw + z16
        k_raw = k_raw + z16
        k_t = k_t + z16
        b_v0 = b_v0 + z16
        b_v1 = b_v1 + z16
        raw_b = raw_b + zero
        raw_b_col = raw_b_col + zero
        raw_g = raw_g + zero
        anc = anc.to(gl.float32) + zero != 0
        if FUSED:
            raw_A = raw_A.to(gl.float32) + zero
            bias = bias + zero
        if DEPTHS:  # ceil(log2(depth)) doubling rounds (triton_helpers.solve_rounds' count, the root in the block)
            depth = (depth.to(gl.float32) + zero).to(gl.int32)
            NSTEP = depth * 0
            for r in gl.static_range(16):
                NSTEP += (depth > (1 << r)).to(gl.int32)

        # the state's tile [K, BV] copied into shared memory by cp.async (16 bytes a thread a copy, the pool's rows
        # contiguous in either layout), waited for where P S0 needs it
        if STATE_VK:  # SGLang's [N, HV, V, K]: K contiguous, so the tile is stored K-major
            CP: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, num_warps], [0, 1])
            S_SH: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0, 1])
        else:
            CP: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [num_warps, 1], [1, 0])
            S_SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        s_smem = gl.allocate_shared_memory(gl.float32, [K, BV], S_SH)
        r_cp = gl.arange(0, K, layout=gl.SliceLayout(1, CP))
        c_cp = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, CP))
        if STATE_VK:
            s_ptrs = state + ((slot * HV + i_hv) * V + c_cp[None, :]) * K + r_cp[:, None]
        else:
            s_ptrs = state + ((slot * HV + i_hv) * K + r_cp[:, None]) * V + c_cp[None, :]
        m_cp = (r_cp < gl.where(live, K, 0))[:, None] & (c_cp < V)[None, :]
        _cp_async(s_smem, s_ptrs, m_cp)
        async_copy.commit_group()

        # the gates: beta, and g along each path, G [BT] and D [BT, BT] = A_t / A_j on ancestors-or-self
        if FUSED:
            neg_A = -gl.exp(raw_A.to(gl.float32))
            b_beta = gl.where(mr, 1.0 / (1.0 + gl.exp(-raw_b)), 0.0)
            beta_col = gl.where(mc, 1.0 / (1.0 + gl.exp(-raw_b_col)), 0.0)
            g_col = gl.where(mc, neg_A * _softplus(raw_g + bias), 0.0)
        else:
            b_beta = raw_b
            beta_col = raw_b_col
            g_col = raw_g
        p_hi, p_lo, Y0, Y1 = _fold(q_raw, k_raw, k_t, b_v0, b_v1, b_beta, beta_col, g_col, anc, scale, NSTEP, L2NORM,
                                   BT, K, HB, MMA, A_OP, B_OP)

        # the state: this thread's copies, then every thread's; read from shared memory into the operand layout
        async_copy.wait_group(0)
        _thread_barrier()
        s0 = s_smem.slice(0, HB, dim=1).load(B_OP)  # [K, HB] fp32
        s1 = s_smem.slice(HB, HB, dim=1).load(B_OP)
        o_ptrs = o + (row_o[:, None] * HV + i_hv) * V
        _out_half(p_hi, p_lo, s0, Y0, o_ptrs + o_v0[None, :], m_v, FULL)
        _out_half(p_hi, p_lo, s1, Y1, o_ptrs + o_v1[None, :], m_v, FULL)
