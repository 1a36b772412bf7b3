"""Triton depthwise causal conv1d over a tree (tree-aware "exact" or flattened "leaky"), width W,
optional SiLU. Twin: oracle.tree_causal_conv1d.

The launcher turns parents into a [B, T, W] table of input sources (each node's inputs, oldest
first, as indices into cat(committed window, block inputs)); one program per (sequence, node,
channel block) gathers its W inputs and writes the output and, optionally, its window.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import checks
from ddsim.gpu_backend.launch import launch


@triton.jit
def _tree_conv_kernel(x, weight, bias, src, window, win_idx, out, win_out, T, C, S1, S2, P1, P2,
                      W: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                      STORE_WIN: tl.constexpr, SPLIT: tl.constexpr):
    i_c = tl.program_id(0)
    i_bt = tl.program_id(1)
    i_b = i_bt // T
    o_c = i_c * BC + tl.arange(0, BC)
    mc = o_c < C
    slot = tl.load(win_idx + i_b).to(tl.int64)
    acc = tl.zeros([BC], dtype=tl.float32)
    for w in tl.static_range(0, W):
        j = tl.load(src + i_bt * W + w)
        from_win = tl.load(window + (slot * C + o_c) * (W - 1) + tl.minimum(j, W - 2), mask=mc & (W > 1), other=0.0)
        from_x = tl.load(x + (i_b * T + tl.maximum(j - (W - 1), 0)).to(tl.int64) * C + o_c, mask=mc, other=0.0)
        val = tl.where(j < W - 1, from_win.to(tl.float32), from_x.to(tl.float32))
        acc += val * tl.load(weight + o_c * W + w, mask=mc, other=0.0).to(tl.float32)
        if STORE_WIN:
            if w > 0:
                tl.store(win_out + (i_bt.to(tl.int64) * C + o_c) * (W - 1) + (w - 1),
                         val.to(win_out.dtype.element_ty), mask=mc)
    if HAS_BIAS:
        acc += tl.load(bias + o_c, mask=mc, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    if SPLIT:  # three channel groups [0, S1), [S1, S1 + S2), the rest, each stored [B*T, c_i] from P0 = 0, P1, P2
        r = i_bt.to(tl.int64)
        S3 = C - S1 - S2
        dst = tl.where(o_c < S1, r * S1 + o_c,
                       tl.where(o_c < S1 + S2, P1 + r * S2 + (o_c - S1), P2 + r * S3 + (o_c - S1 - S2)))
        tl.store(out + dst, acc.to(out.dtype.element_ty), mask=mc)
    else:
        tl.store(out + i_bt.to(tl.int64) * C + o_c, acc.to(out.dtype.element_ty), mask=mc)


def tree_causal_conv1d_triton(x, *, weight, bias=None, parents, initial_window, mode="exact", activation="silu",
                              output_windows=False, state_indices=None, split=None, block_c: int = 128):
    """x [B, T, C]; weight [C, W]; bias [C] or None; initial_window [B, C, W-1] (or a pool
    [N, C, W-1] with state_indices [B]). Returns out [B, T, C] (x's dtype) and, with
    output_windows, each node's window after it [B, T, C, W-1]. split (c1, c2, c3), summing to C: out as
    its three channel groups [B, T, c_i], each contiguous (one buffer, the groups one after another)."""
    B, T, Cn, W, src = checks.check_conv(x, weight, initial_window, parents, mode, activation, pooled=True, bias=bias)
    C.check_device(x, weight, initial_window)
    if W < 2:
        raise ValueError(f"weight: width {W} < 2 has no window")
    table = checks.conv_table(parents, src, W, mode)
    idx = C.window_slots(initial_window, state_indices, B)
    s1, s2 = (int(split[0]), int(split[1])) if split else (0, 0)
    ends = [0, B * T * s1, B * T * (s1 + s2), B * T * Cn]  # the groups' offsets in the one buffer, with split
    out = C.alloc((B * T * Cn,) if split else (B, T, Cn), x.dtype, x.device)
    win_out = (C.alloc((B, T, Cn, W - 1), x.dtype, x.device) if output_windows
               else checks.constant("dummy", 1, x.device, x.dtype))
    BC = min(block_c, C.next_pow2(Cn, 1))
    launch(_tree_conv_kernel, (C.cdiv(Cn, BC), B * T),
           x=x.contiguous(), weight=weight.contiguous(), bias=bias.contiguous() if bias is not None else weight,
           src=table,
           window=initial_window.contiguous(), win_idx=idx, out=out, win_out=win_out, T=T, C=Cn,
           S1=s1, S2=s2, P1=ends[1], P2=ends[2], W=W, BC=BC,
           HAS_BIAS=bias is not None, SILU=activation == "silu", STORE_WIN=output_windows, SPLIT=split is not None)
    if split:
        out = tuple(out[a:b].view(B, T, c) for a, b, c in zip(ends, ends[1:], split))
    return (out, win_out) if output_windows else out
