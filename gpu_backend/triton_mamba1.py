"""Triton kernels for Mamba1 (selective scan) tree verification and commit, and their launchers (twins:
oracle.mamba1_tree_verify, oracle.mamba1_tree_commit; reference beside them: torch_mamba1).

recurrent   one program per (sequence, tile of BI channels) keeps the tile's state S [BI, N] in registers and steps
            over the nodes in index order: dt = softplus(dt + dt_bias) per channel, S_t = exp(dt A) * S_src +
            (dt x) B^T, y_t = S_t C_t + D x_t. mode "leaky": S carries from node t-1 (the flattened path), per-node
            states optional. mode "exact": parent-indexed, each node reloads its parent's state from the per-node
            state buffer, so those states are always written.
commit      the state after the accepted root path (triton_commit's design): the committed state read once, the
            path's steps, the result written once into a new [B, I, N].
The committed state [B, I, N] fp32 is read, never written; inputs bf16 / fp16 / fp32.
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
def _channel_tile(A, dt_bias, I: tl.constexpr, N: tl.constexpr, BI: tl.constexpr, BN: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    """This program's tile of BI channels: offsets, masks, the tile's offsets inside one [I, N] state, A [BI, BN] and
    dt_bias [BI] in fp32."""
    o_i = tl.program_id(0) * BI + tl.arange(0, BI)
    o_n = tl.arange(0, BN)
    mi, mn = o_i < I, o_n < N
    m = mi[:, None] & mn[None, :]
    tile = o_i[:, None] * N + o_n[None, :]  # [BI, BN]
    b_A = tl.load(A + tile, mask=m, other=0.0).to(tl.float32)
    bias = tl.load(dt_bias + o_i, mask=mi, other=0.0).to(tl.float32) if HAS_BIAS else tl.zeros([BI], tl.float32)
    return o_i, o_n, mi, mn, m, tile, b_A, bias


@triton.jit
def _scan_step(S, x, dt, Bm, row, o_i, o_n, mi, mn, b_A, bias, I: tl.constexpr, N: tl.constexpr,
               SOFTPLUS: tl.constexpr):
    """Node row's step on S [BI, BN]: dt = softplus(dt + dt_bias) per channel, S <- exp(dt A) S + (dt x) B^T.
    Returns the new S and the node's x [BI]."""
    b_x = tl.load(x + row * I + o_i, mask=mi, other=0.0).to(tl.float32)
    d = tl.load(dt + row * I + o_i, mask=mi, other=0.0).to(tl.float32) + bias
    if SOFTPLUS:
        d = h.softplus(d)
    b_B = tl.load(Bm + row * N + o_n, mask=mn, other=0.0).to(tl.float32)
    return tl.exp(d[:, None] * b_A) * S + (d * b_x)[:, None] * b_B[None, :], b_x


@triton.jit
def _mamba1_recurrent_kernel(
    x, dt, A, Bm, Cm, D, dt_bias,  # [B,T,I] x2, [I,N], [B,T,N] x2, [I] (or a dummy) x2
    src,  # [B, T] int32: source node of each node's state (-1: the committed state)
    state,  # [B, I, N] fp32 committed states
    y, snap,  # [B, T, I] out; [B, T, I, N] fp32 per-node states (or a dummy)
    T,
    I: tl.constexpr, N: tl.constexpr, BI: tl.constexpr, BN: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    PARENT_INDEXED: tl.constexpr, STORE_STATES: tl.constexpr,
):
    i_b = tl.program_id(1)
    o_i, o_n, mi, mn, m, tile, b_A, bias = _channel_tile(A, dt_bias, I, N, BI, BN, HAS_BIAS)
    b_D = tl.load(D + o_i, mask=mi, other=0.0).to(tl.float32) if HAS_D else tl.zeros([BI], tl.float32)
    s0 = tl.load(state + i_b.to(tl.int64) * I * N + tile, mask=m, other=0.0)
    S = s0
    for t in range(0, T):
        row = i_b * T + t
        if PARENT_INDEXED:
            p = tl.load(src + row)
            sp = tl.load(snap + (i_b * T + tl.maximum(p, 0)).to(tl.int64) * I * N + tile, mask=m, other=0.0)
            S = tl.where(p >= 0, sp, s0)  # the root reads the committed state
        S, b_x = _scan_step(S, x, dt, Bm, row, o_i, o_n, mi, mn, b_A, bias, I, N, SOFTPLUS)
        b_C = tl.load(Cm + row * N + o_n, mask=mn, other=0.0).to(tl.float32)
        b_y = tl.sum(S * b_C[None, :], 1) + b_D * b_x
        tl.store(y + row * I + o_i, b_y.to(y.dtype.element_ty), mask=mi)
        if STORE_STATES:
            tl.store(snap + row.to(tl.int64) * I * N + tile, S, mask=m)
            if PARENT_INDEXED:
                tl.debug_barrier()  # the next node may read this state through other threads


def mamba1_tree_verify(x, dt, A, B, C_, *, D=None, dt_bias=None, dt_softplus=True, parents, initial_state,
                       mode="exact", output_states=False, block_i: int = 64, num_warps: int = 4,
                       poison: bool | None = None):
    """x [B, T, I]; dt [B, T, I] raw; A [I, N]; B, C_ [B, T, N]; D, dt_bias [I] or None; parents [B, T] or a TreePlan;
    initial_state [B, I, N] fp32 (read, never written). Returns y [B, T, I] in x's dtype and, with output_states, the
    state after each node [B, T, I, N] fp32."""
    launch, result = plan_recurrent(x, dt, A, B, C_, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, parents=parents,
                                    initial_state=initial_state, mode=mode, output_states=output_states,
                                    block_i=block_i, num_warps=num_warps, poison=poison)
    launch()
    return result


def plan_recurrent(x, dt, A, B, C_, *, D=None, dt_bias=None, dt_softplus=True, parents, initial_state, mode="exact",
                   output_states=False, block_i: int = 64, num_warps: int = 4, poison: bool | None = None):
    """Validate and allocate once; returns (launch, result): launch() runs the kernel alone (what a benchmark
    times)."""
    Bn, T, I, N = checks.check_mamba1(x, dt, A, B, C_, D, dt_bias, initial_state)
    checks.fp32_state(initial_state, "Mamba1")
    C.check_device(x)  # a device Triton launches on (check_mamba1 put every tensor on x's)
    src = checks.source_parents(parents, Bn, T, x.device, mode)
    parent_indexed = mode == "exact"
    store = output_states or parent_indexed
    y = C.alloc((Bn, T, I), x.dtype, x.device, poison)
    snap = C.alloc((Bn, T, I, N), torch.float32, x.device, poison) if store else checks.constant("dummy", 1, x.device)
    dummy = checks.constant("dummy", 1, x.device)
    BI, BN = min(block_i, C.next_pow2(I, 1)), C.next_pow2(N, 1)
    kw = dict(x=x.contiguous(), dt=dt.contiguous(), A=A.contiguous(), Bm=B.contiguous(), Cm=C_.contiguous(),
              D=dummy if D is None else D.contiguous(), dt_bias=dummy if dt_bias is None else dt_bias.contiguous(),
              src=src.to(torch.int32).contiguous(), state=initial_state.contiguous(), y=y, snap=snap, T=T, I=I, N=N,
              BI=BI, BN=BN, HAS_D=D is not None, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
              PARENT_INDEXED=parent_indexed, STORE_STATES=store, num_warps=num_warps, **C.ONE_ARITHMETIC)
    return bind(_mamba1_recurrent_kernel, (C.cdiv(I, BI), Bn), kw), ((y, snap) if output_states else y)


@triton.jit
def _mamba1_commit_kernel(
    x, dt, A, Bm, dt_bias,  # [B,T,I] x2, [I,N], [B,T,N], [I] (or a dummy)
    paths, acc,  # [B, TP, DMAX] int32 root paths (root first, -1 padded); [B] int64: each sequence's row
    state, out,  # [B, I, N] fp32: the committed states (read), the new ones (written)
    T, TP, DMAX,
    I: tl.constexpr, N: tl.constexpr, BI: tl.constexpr, BN: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
):
    i_b = tl.program_id(1)
    o_i, o_n, mi, mn, m, tile, b_A, bias = _channel_tile(A, dt_bias, I, N, BI, BN, HAS_BIAS)
    S = tl.load(state + i_b.to(tl.int64) * I * N + tile, mask=m, other=0.0)
    path = paths + (i_b * TP + tl.load(acc + i_b)) * DMAX  # the accepted node's root path
    for d in range(0, DMAX):
        n = tl.load(path + d)
        row = i_b * T + tl.maximum(n, 0)
        S = tl.where(n >= 0, _scan_step(S, x, dt, Bm, row, o_i, o_n, mi, mn, b_A, bias, I, N, SOFTPLUS)[0], S)
    tl.store(out + i_b.to(tl.int64) * I * N + tile, S, mask=m)


def mamba1_tree_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, parents, accepted, initial_state,
                       block_i: int = 64, num_warps: int = 4, poison: bool | None = None):
    """State after root..accepted[b]: a new [B, I, N] fp32 tensor (the committed state untouched)."""
    launch, out = plan_commit(x, dt, A, B, dt_bias=dt_bias, dt_softplus=dt_softplus, parents=parents, accepted=accepted,
                              initial_state=initial_state, block_i=block_i, num_warps=num_warps, poison=poison)
    launch()
    return out


def plan_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, parents, accepted, initial_state, block_i: int = 64,
                num_warps: int = 4, poison: bool | None = None):
    """Validate, build the paths and allocate once; returns (launch, out)."""
    Bn, T, I, N = checks.check_mamba1(x, dt, A, B, None, None, dt_bias, initial_state)
    checks.fp32_state(initial_state, "Mamba1")
    C.check_device(x)
    paths, rows = checked_accepted_paths(parents, accepted, Bn, T, x.device)
    out = C.alloc((Bn, I, N), torch.float32, x.device, poison)
    dummy = checks.constant("dummy", 1, x.device)
    BI, BN = min(block_i, C.next_pow2(I, 1)), C.next_pow2(N, 1)
    kw = dict(x=x.contiguous(), dt=dt.contiguous(), A=A.contiguous(), Bm=B.contiguous(),
              dt_bias=dummy if dt_bias is None else dt_bias.contiguous(), paths=paths, acc=rows,
              state=initial_state.contiguous(), out=out, T=T, TP=paths.shape[1], DMAX=paths.shape[2], I=I, N=N, BI=BI,
              BN=BN, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus), num_warps=num_warps)
    return bind(_mamba1_commit_kernel, (C.cdiv(I, BI), Bn), kw), out
