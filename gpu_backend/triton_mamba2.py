"""Triton kernels for Mamba2 tree verification and commit, and their launchers.
Twins: oracle.mamba2_tree_verify, oracle.mamba2_tree_commit (float64, one node at a time).

recurrent   one program per (sequence, head, P tile) keeps S [BP, N] in registers and steps over
            the nodes in index order. "leaky": S carries from node i-1 (flattened, the
            hybrid-unsafe path). "exact": parent-indexed, each node reloads its parent's state from
            the per-node snapshot buffer (so snapshots are always written).
ssd         the tree-masked SSD (accumulated-decay) form: no per-node states. With
            dA_t = dt_t A, G_t = sum of dA over t's ancestors-or-self (including the root),
              y_i = exp(G_i) C_i S0^T + sum_{j anc-or-self of i} (C_i . B_j) exp(G_i - G_j) dt_j x_j + D x_i
            a masked linear attention with decays; the committed state is read once. Two launches:
            a prologue writes dt (softplus, dt_bias, limits) and G per node and head; the main
            kernel tiles rows in blocks of BI and loops over the column blocks up to its own (an
            ancestor always has a smaller index), so any tree size is exact. "leaky" uses the chain
            mask (every earlier node an ancestor): the flattened scan.
commit      replays the recurrence along the accepted root path only, from the pool slot, and
            writes the slot (in place) or a new tensor.
All: fp32 state [slots, H, P, N] addressed by state_indices, bf16/fp16/fp32 inputs, grouped B/C
(head h reads group h // (H / G)), dt_bias, softplus and dt_limit in kernel, D skip.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as Cm
from ddsim.gpu_backend import checks
from ddsim.gpu_backend import triton_helpers as h
from ddsim.gpu_backend.launch import bind


@triton.jit
def _dt_step(dt, dt_bias, offs, m, i_h, LO, HI, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
             CLAMP: tl.constexpr, MASKED: tl.constexpr):
    """Discretisation steps at offs of dt [B*T, H] (masked by m when MASKED):
    clamp(softplus(dt + dt_bias), LO, HI)."""
    if MASKED:
        d = tl.load(dt + offs, mask=m, other=0.0).to(tl.float32)
    else:
        d = tl.load(dt + offs).to(tl.float32)
    if HAS_BIAS:
        d = d + tl.load(dt_bias + i_h).to(tl.float32)
    if SOFTPLUS:
        d = h.softplus(d)
    if CLAMP:
        # a NaN stays NaN, as torch's clamp keeps it
        d = tl.minimum(tl.maximum(d, LO, propagate_nan=tl.PropagateNan.ALL), HI, propagate_nan=tl.PropagateNan.ALL)
    return d


@triton.jit
def _ssm_step(S, b_x, b_B, d, a):
    """S [BP, BN] <- exp(d a) S + d x B^T."""
    return S * tl.exp(d * a) + (d * b_x)[:, None] * b_B[None, :]


@triton.jit
def _head_tile(H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, BP: tl.constexpr,
               BN: tl.constexpr):
    """Grid (P tiles, B * H): (sequence, head, its B/C group, P offsets [BP], N offsets [BN], their masks)."""
    i_p = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_p = i_p * BP + tl.arange(0, BP)
    o_n = tl.arange(0, BN)
    return i_b, i_h, i_h // (H // G), o_p, o_n, o_p < P, o_n < N


@triton.jit
def _state_ptrs(base, row, i_h, o_p, o_n, H: tl.constexpr, P: tl.constexpr, N: tl.constexpr):
    """Pointers [BP, BN] to head i_h's state in row ``row`` (an int64 pool slot or node row) of
    base [rows, H, P, N]."""
    return base + ((row * H + i_h) * P + o_p[:, None]) * N + o_n[None, :]


@triton.jit
def _mamba2_recurrent_kernel(
    x, dt, A, Bm, Cm, D, dt_bias,  # [B,T,H,P], [B,T,H], [H], [B,T,G,N] x2, [H], [H]
    src,  # [B, T] int32 source node of each node's state (-1: the committed state)
    state, state_idx,  # pool [slots, H, P, N] fp32; [B] int32
    y, snap,  # [B, T, H, P] out; [B, T, H, P, N] fp32 per-node states (or a dummy)
    T, LO, HI,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    PARENT_INDEXED: tl.constexpr, STORE_STATES: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr,
):
    i_b, i_h, i_g, o_p, o_n, mp, mn = _head_tile(H, G, P, N, BP, BN)
    mpn = mp[:, None] & mn[None, :]
    slot = tl.load(state_idx + i_b).to(tl.int64)
    s0 = tl.load(_state_ptrs(state, slot, i_h, o_p, o_n, H, P, N), mask=mpn, other=0.0)
    S = s0
    a = tl.load(A + i_h).to(tl.float32)
    dsk = tl.load(D + i_h).to(tl.float32) if HAS_D else 0.0
    for t in range(0, T):
        row = (i_b * T + t).to(tl.int64)
        if PARENT_INDEXED:
            pa = tl.load(src + row)
            prow = (i_b * T + tl.maximum(pa, 0)).to(tl.int64)
            sp = tl.load(_state_ptrs(snap, prow, i_h, o_p, o_n, H, P, N), mask=mpn, other=0.0)
            S = tl.where(pa >= 0, sp, s0)  # the root reads the committed state
        b_x = tl.load(x + (row * H + i_h) * P + o_p, mask=mp, other=0.0).to(tl.float32)
        b_B = tl.load(Bm + (row * G + i_g) * N + o_n, mask=mn, other=0.0).to(tl.float32)
        b_C = tl.load(Cm + (row * G + i_g) * N + o_n, mask=mn, other=0.0).to(tl.float32)
        d = _dt_step(dt, dt_bias, row * H + i_h, 0, i_h, LO, HI, HAS_BIAS, SOFTPLUS, CLAMP, False)
        S = _ssm_step(S, b_x, b_B, d, a)
        b_y = tl.sum(S * b_C[None, :], 1) + dsk * b_x
        tl.store(y + (row * H + i_h) * P + o_p, b_y.to(y.dtype.element_ty), mask=mp)
        if STORE_STATES:
            tl.store(_state_ptrs(snap, row, i_h, o_p, o_n, H, P, N), S, mask=mpn)
            if PARENT_INDEXED:
                tl.debug_barrier()  # the next node may read this snapshot through other threads


@triton.jit
def _mamba2_ssd_prologue(
    dt, A, dt_bias, mask,  # [B,T,H], [H], [H], [B,T,T] int8 ancestor-or-self
    dt_out, G_out,  # [B, T, H] fp32 each
    T, LO, HI,
    H: tl.constexpr, BI: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr,
):
    """Per (sequence, head): dt_t, and G_t = sum of dt_j A over j ancestor-or-self of t."""
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    a = tl.load(A + i_h).to(tl.float32)
    o = tl.arange(0, BI)
    for i0 in range(0, T, BI):
        ri = i0 + o
        mi = ri < T
        acc = tl.zeros([BI], dtype=tl.float32)
        for j0 in range(0, i0 + BI, BI):
            rj = j0 + o
            mj = rj < T
            dj = _dt_step(dt, dt_bias, (i_b * T + rj).to(tl.int64) * H + i_h, mj, i_h, LO, HI, HAS_BIAS, SOFTPLUS,
                          CLAMP, True)
            anc = tl.load(mask + (i_b * T + ri[:, None]).to(tl.int64) * T + rj[None, :],
                          mask=mi[:, None] & mj[None, :], other=0) != 0
            acc += tl.sum(tl.where(anc, (dj * a)[None, :], 0.0), 1)
        di = _dt_step(dt, dt_bias, (i_b * T + ri).to(tl.int64) * H + i_h, mi, i_h, LO, HI, HAS_BIAS, SOFTPLUS, CLAMP,
                      True)
        offs = (i_b * T + ri).to(tl.int64) * H + i_h
        tl.store(dt_out + offs, di, mask=mi)
        tl.store(G_out + offs, acc, mask=mi)


@triton.jit
def _mamba2_ssd_kernel(
    x, Bm, Cm, D, dtp, Gp, mask,  # [B,T,H,P], [B,T,G,N] x2, [H], [B,T,H] x2 fp32, [B,T,T] int8
    state, state_idx, y,
    T,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
    BI: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, HAS_D: tl.constexpr, PRECISION: tl.constexpr,
):
    i_p = tl.program_id(0)
    i_i = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // (H // G)
    o = tl.arange(0, BI)
    ri = i_i * BI + o
    mi = ri < T
    o_p = i_p * BP + tl.arange(0, BP)
    o_n = tl.arange(0, BN)
    mp, mn = o_p < P, o_n < N
    rows_i = (i_b * T + ri).to(tl.int64)
    c_i = tl.load(Cm + (rows_i[:, None] * G + i_g) * N + o_n[None, :], mask=mi[:, None] & mn[None, :],
                  other=0.0).to(tl.float32)  # [BI, BN]
    g_i = tl.load(Gp + rows_i * H + i_h, mask=mi, other=0.0)  # [BI]
    slot = tl.load(state_idx + i_b).to(tl.int64)
    s0 = tl.load(_state_ptrs(state, slot, i_h, o_p, o_n, H, P, N), mask=mp[:, None] & mn[None, :],
                 other=0.0)  # [BP, BN]
    acc = tl.exp(g_i)[:, None] * tl.dot(c_i, tl.trans(s0), input_precision=PRECISION)  # [BI, BP]
    for j0 in range(0, (i_i + 1) * BI, BI):
        rj = j0 + o
        mj = rj < T
        rows_j = (i_b * T + rj).to(tl.int64)
        b_j = tl.load(Bm + (rows_j[:, None] * G + i_g) * N + o_n[None, :], mask=mj[:, None] & mn[None, :],
                      other=0.0).to(tl.float32)  # [BJ, BN]
        x_j = tl.load(x + (rows_j[:, None] * H + i_h) * P + o_p[None, :], mask=mj[:, None] & mp[None, :],
                      other=0.0).to(tl.float32)  # [BJ, BP]
        g_j = tl.load(Gp + rows_j * H + i_h, mask=mj, other=0.0)
        d_j = tl.load(dtp + rows_j * H + i_h, mask=mj, other=0.0)
        anc = tl.load(mask + rows_i[:, None] * T + rj[None, :], mask=mi[:, None] & mj[None, :], other=0) != 0
        # exp only where j is an ancestor (elsewhere exp(0)): a non-ancestor's difference may be any size
        w = tl.where(anc, tl.exp(tl.where(anc, g_i[:, None] - g_j[None, :], 0.0)) * d_j[None, :], 0.0)
        scores = tl.dot(c_i, tl.trans(b_j), input_precision=PRECISION) * w  # [BI, BJ]
        acc += tl.dot(scores, x_j, input_precision=PRECISION)
    if HAS_D:
        x_i = tl.load(x + (rows_i[:, None] * H + i_h) * P + o_p[None, :], mask=mi[:, None] & mp[None, :],
                      other=0.0).to(tl.float32)
        acc += tl.load(D + i_h).to(tl.float32) * x_i
    tl.store(y + (rows_i[:, None] * H + i_h) * P + o_p[None, :], acc.to(y.dtype.element_ty),
             mask=mi[:, None] & mp[None, :])


@triton.jit
def _mamba2_commit_kernel(
    x, dt, A, Bm, dt_bias,
    paths, acc,  # [B, TP, DMAX] int32 root paths (root first, -1 padded); [B] int64: each sequence's row
    state, state_idx, out, out_idx,
    T, TP, DMAX, LO, HI,
    H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr,
):
    i_b, i_h, i_g, o_p, o_n, mp, mn = _head_tile(H, G, P, N, BP, BN)
    mpn = mp[:, None] & mn[None, :]
    slot = tl.load(state_idx + i_b).to(tl.int64)
    S = tl.load(_state_ptrs(state, slot, i_h, o_p, o_n, H, P, N), mask=mpn, other=0.0)
    a = tl.load(A + i_h).to(tl.float32)
    path = paths + (i_b * TP + tl.load(acc + i_b)) * DMAX  # the accepted node's root path
    for k in range(0, DMAX):
        n = tl.load(path + k)
        row = (i_b * T + tl.maximum(n, 0)).to(tl.int64)
        b_x = tl.load(x + (row * H + i_h) * P + o_p, mask=mp, other=0.0).to(tl.float32)
        b_B = tl.load(Bm + (row * G + i_g) * N + o_n, mask=mn, other=0.0).to(tl.float32)
        d = _dt_step(dt, dt_bias, row * H + i_h, 0, i_h, LO, HI, HAS_BIAS, SOFTPLUS, CLAMP, False)
        S = tl.where(n >= 0, _ssm_step(S, b_x, b_B, d, a), S)
    tl.debug_barrier()  # every read of the old state is done before the (possibly in-place) write
    oslot = tl.load(out_idx + i_b).to(tl.int64)
    tl.store(_state_ptrs(out, oslot, i_h, o_p, o_n, H, P, N), S, mask=mpn)


def _prep(x, dt, A, B, C, D, dt_bias, dt_limit, initial_state, state_indices):
    Bn, T, H, P, G, N = checks.check_mamba2(x, dt, A, B, C, D, dt_bias, dt_limit)
    Cm.check_device(x, dt, A, B, C, initial_state)
    if initial_state.dtype != torch.float32 or not initial_state.is_contiguous():
        layout = "" if initial_state.is_contiguous() else f"a non-contiguous (strides {initial_state.stride()}) "
        raise ValueError(f"initial_state: expected a contiguous float32 pool, got {layout}{initial_state.dtype}")
    idx = checks.check_mamba2_state(initial_state, state_indices, Bn, H, P, N)
    lo, hi = (float(v) for v in dt_limit)
    dummy = checks.constant("dummy", 1, x.device)
    common = dict(A=A.contiguous(), dt_bias=dummy if dt_bias is None else dt_bias.contiguous(), LO=lo,
                  HI=min(hi, 3.0e38), HAS_BIAS=dt_bias is not None, CLAMP=lo > 0.0 or hi < math.inf)
    return (Bn, T, H, P, G, N), idx, common, dummy


def mamba2_tree_verify_recurrent(*args, **kwargs):
    """Recurrent Triton path. Returns y [B, T, H, P] (x's dtype) and, with output_states, the
    per-node states [B, T, H, P, N] fp32."""
    launch, result = plan_recurrent(*args, **kwargs)
    launch()
    return result


def plan_recurrent(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf), parents,
                   initial_state, state_indices=None, mode="exact", output_states=False, block_p: int = 32,
                   num_warps: int = 4, poison: bool | None = None):
    """Validate and allocate once; returns (launch, result)."""
    (Bn, T, H, P, G, N), idx, common, dummy = _prep(x, dt, A, B, C, D, dt_bias, dt_limit, initial_state,
                                                    state_indices)
    src = checks.source_parents(parents, Bn, T, x.device, mode)
    parent_indexed = mode == "exact"
    store = output_states or parent_indexed
    y = Cm.alloc((Bn, T, H, P), x.dtype, x.device, poison)
    snap = Cm.alloc((Bn, T, H, P, N), torch.float32, x.device, poison) if store else dummy
    BP, BN = min(block_p, Cm.next_pow2(P, 1)), Cm.next_pow2(N, 1)
    kw = dict(x=x.contiguous(), dt=dt.contiguous(), Bm=B.contiguous(), Cm=C.contiguous(),
              D=dummy if D is None else D.contiguous(), src=src.to(torch.int32).contiguous(), state=initial_state,
              state_idx=idx, y=y, snap=snap, T=T, H=H, G=G, P=P, N=N, BP=BP, BN=BN, PARENT_INDEXED=parent_indexed,
              STORE_STATES=store, HAS_D=D is not None, SOFTPLUS=bool(dt_softplus), num_warps=num_warps, **common)
    grid = (Cm.cdiv(P, BP), Bn * H)
    return bind(_mamba2_recurrent_kernel, grid, kw), ((y, snap) if output_states else y)


def mamba2_tree_verify_ssd(*args, **kwargs):
    """Tree-masked SSD Triton path: no per-node states (output_states is refused). Any tree size."""
    launch, y = plan_ssd(*args, **kwargs)
    launch()
    return y


def plan_ssd(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf), parents,
             initial_state, state_indices=None, mode="exact", output_states=False, block_i: int = 32,
             block_p: int = 64, num_warps: int = 4, precision: str = "tf32x3", poison: bool | None = None):
    """Validate, build the ancestor mask and allocate once; returns (launch, y)."""
    if output_states:
        raise ValueError("output_states: the SSD kernel writes no per-node states; use the recurrent kernel")
    if precision not in ("ieee", "tf32", "tf32x3"):
        raise ValueError(f"precision: expected ieee, tf32 or tf32x3, got {precision!r}")
    (Bn, T, H, P, G, N), idx, common, dummy = _prep(x, dt, A, B, C, D, dt_bias, dt_limit, initial_state,
                                                    state_indices)
    checks.check_mode(mode)
    if isinstance(parents, checks.TreePlan):
        checks.check_parents(parents, Bn, T, x.device)
        mask, _ = parents.ancestors(mode)
    else:
        mask, _ = checks.ancestor_mask(checks.source_parents(parents, Bn, T, x.device, mode))
    y = Cm.alloc((Bn, T, H, P), x.dtype, x.device, poison)
    dtp = torch.empty(Bn, T, H, device=x.device, dtype=torch.float32)
    Gp = torch.empty(Bn, T, H, device=x.device, dtype=torch.float32)
    # (P's tile at least 32 wide at a 64-row block: _common.MIN_V_TILE_64; block_i 64 at 8 warps with a 16-wide tile
    # compiles for sm_90 to the N = 8 wgmma layouts of the GDN launch that read past its shared memory; this kernel
    # ran clean so on an H100: a precaution)
    BI, BP, BN = block_i, Cm.v_tile(block_p, P, block_i), max(16, Cm.next_pow2(N, 1))
    pro = dict(dt=dt.contiguous(), A=common["A"], dt_bias=common["dt_bias"], mask=mask, dt_out=dtp, G_out=Gp, T=T,
               LO=common["LO"], HI=common["HI"], H=H, BI=BI, HAS_BIAS=common["HAS_BIAS"], SOFTPLUS=bool(dt_softplus),
               CLAMP=common["CLAMP"])
    kw = dict(x=x.contiguous(), Bm=B.contiguous(), Cm=C.contiguous(), D=dummy if D is None else D.contiguous(),
              dtp=dtp, Gp=Gp, mask=mask, state=initial_state, state_idx=idx, y=y, T=T, H=H, G=G, P=P, N=N, BI=BI,
              BP=BP, BN=BN, HAS_D=D is not None, PRECISION=precision, num_warps=num_warps)
    grid = (Cm.cdiv(P, BP), Cm.cdiv(T, BI), Bn * H)

    prologue, ssd = bind(_mamba2_ssd_prologue, (Bn * H,), pro), bind(_mamba2_ssd_kernel, grid, kw)

    def launch():
        prologue()
        ssd()
    return launch, y


def mamba2_tree_commit_triton(*args, **kwargs):
    """State after root..accepted[b]; inplace=True writes the pool slots and returns the pool."""
    launch, out = plan_commit(*args, **kwargs)
    launch()
    return out


def plan_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf), parents, accepted,
                initial_state, state_indices=None, inplace=False, block_p: int = 32, num_warps: int = 4,
                poison: bool | None = None):
    """Validate, build the accepted paths and allocate once; returns (launch, out)."""
    from ddsim.gpu_backend.triton_commit import checked_accepted_paths
    (Bn, T, H, P, G, N), idx, common, _ = _prep(x, dt, A, B, None, None, dt_bias, dt_limit, initial_state,
                                                state_indices)
    paths, rows = checked_accepted_paths(parents, accepted, Bn, T, x.device)
    if inplace:
        out, out_idx = initial_state, idx
    else:
        out = Cm.alloc((Bn, H, P, N), torch.float32, x.device, poison)
        out_idx = checks.constant("slots", Bn, x.device)
    BP, BN = min(block_p, Cm.next_pow2(P, 1)), Cm.next_pow2(N, 1)
    kw = dict(x=x.contiguous(), dt=dt.contiguous(), Bm=B.contiguous(), paths=paths, acc=rows, state=initial_state,
              state_idx=idx, out=out, out_idx=out_idx, T=T, TP=paths.shape[1], DMAX=paths.shape[2], H=H, G=G, P=P, N=N, BP=BP, BN=BN,
              SOFTPLUS=bool(dt_softplus), num_warps=num_warps, **common)
    return bind(_mamba2_commit_kernel, (Cm.cdiv(P, BP), Bn * H), kw), out
