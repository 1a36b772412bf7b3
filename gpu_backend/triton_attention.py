"""Tree attention in one kernel: the tree's queries over the committed KV prefix and their ancestors' keys, where
PyTorch's SDPA (torch_ops.tree_attention, its twin) takes a dozen launches a layer: the prefix and the tree's K and
V concatenated, their heads repeated for grouped queries, the mask widened and made additive, and the math path's
fp32 copies, GEMMs and softmax.

One program per (query head, block of BT tree rows) streams the prefix's and then the tree's keys and values in
blocks of BN, reading each in place through its strides (grouped queries read their key-value head), with an online
softmax in fp32 (the running row maximum and sum, the output rescaled as the maximum grows). The scores Q K^T take
the 16-bit inputs' exact products summed in fp32 (fp32 inputs: IEEE fp32 products); the probabilities times V are
summed in fp32 from tf32x3 products (fp32 to about 2^-22). So it computes what the twin computes in fp32, summed
in another order, and rounds once to the queries' dtype: the two differ by a rounding flip on a small share of the
outputs.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import checks
from ddsim.gpu_backend.launch import launch


@triton.jit
def _attend_block(acc, m_i, l_i, qv, kp, vp, mp, cols, n, mr, k_stride, v_stride, scale, dims, HD,
                  MASKED: tl.constexpr, QK_PREC: tl.constexpr):
    # one block of BN keys (rows cols < n of kp, vp [n, HD] with row strides): the scores of qv [BT, BD] against
    # them, masked (with MASKED: by mp [BT rows, n cols], nonzero visible), folded into the running softmax
    mc = cols < n
    md = dims < HD
    kb = tl.load(kp + cols[:, None] * k_stride + dims[None, :], mask=mc[:, None] & md[None, :], other=0.0)
    s = tl.dot(qv, tl.trans(kb.to(qv.dtype)), input_precision=QK_PREC) * scale  # [BT, BN] fp32
    vis = mr[:, None] & mc[None, :]
    if MASKED:
        vis = vis & (tl.load(mp + cols[None, :], mask=vis, other=0) != 0)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # m_i starts finite: a row with nothing visible yet keeps p = 0
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    vb = tl.load(vp + cols[:, None] * v_stride + dims[None, :], mask=mc[:, None] & md[None, :], other=0.0)
    vb = vb.to(qv.dtype).to(tl.float32)  # the twin rounds the prefix to the queries' dtype first
    acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="tf32x3")
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _tree_attention_kernel(q, k, v, pk, pv, mask, prows, out, T, P, G, HD, q_s0, q_s1, k_s0, k_s1, v_s0, v_s1,
                           pk_s0, pk_s1, pv_s0, pv_s1, m_s0, o_s0, o_s1, scale,
                           MASK_PREFIX: tl.constexpr, PREFIX_ROWS: tl.constexpr, QK_PREC: tl.constexpr,
                           BT: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    # q [T, heads, HD], k, v [T, kv heads, HD], pk, pv [P, kv heads, HD] (last dims contiguous), mask [T, T] or,
    # with MASK_PREFIX, [T, P + T] (row stride m_s0, nonzero visible; without it every prefix row is visible);
    # out [T, heads, HD]. Query head h reads key-value head h // G. PREFIX_ROWS: prows [1] (integer, on the device)
    # is how many prefix rows are read at all (clamped to [0, P]; the rows past it are not visible): a
    # fixed-capacity prefix's committed length, so that its unused rows cost no loop steps.
    h = tl.program_id(0)
    kvh = h // G
    rows = tl.program_id(1) * BT + tl.arange(0, BT)
    mr = rows < T
    dims = tl.arange(0, BD)
    md = dims < HD
    qv = tl.load(q + rows[:, None] * q_s0 + h * q_s1 + dims[None, :], mask=mr[:, None] & md[None, :], other=0.0)
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    m_i = tl.full([BT], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BT], dtype=tl.float32)
    mrow = mask + rows[:, None].to(tl.int64) * m_s0
    n_pre = P
    if PREFIX_ROWS:
        n_pre = tl.minimum(tl.maximum(tl.load(prows).to(tl.int32), 0), P)
    for start in range(0, n_pre, BN):
        cols = start + tl.arange(0, BN)
        acc, m_i, l_i = _attend_block(acc, m_i, l_i, qv, pk + kvh * pk_s1, pv + kvh * pv_s1, mrow, cols, n_pre, mr,
                                      pk_s0, pv_s0, scale, dims, HD, MASK_PREFIX, QK_PREC)
    tree_mask = mrow
    if MASK_PREFIX:  # the tree's columns follow the prefix's
        tree_mask = mrow + P
    for start in range(0, T, BN):
        cols = start + tl.arange(0, BN)
        acc, m_i, l_i = _attend_block(acc, m_i, l_i, qv, k + kvh * k_s1, v + kvh * v_s1, tree_mask, cols, T, mr,
                                      k_s0, v_s0, scale, dims, HD, True, QK_PREC)
    o = acc / tl.where(mr, l_i, 1.0)[:, None]  # (a row with nothing visible: 0 / 0, NaN, as the twin's)
    tl.store(out + rows[:, None] * o_s0 + h * o_s1 + dims[None, :], o.to(out.dtype.element_ty),
             mask=mr[:, None] & md[None, :])


def _heads(x, name: str):
    """x [n, heads, hd] with its last dim contiguous (a view of a wider projection is read in place)."""
    if x.dim() != 3 or (x.shape[-1] > 1 and x.stride(-1) != 1):
        raise ValueError(f"{name}: expected [n, heads, head_dim] with a contiguous last dim, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    return x


def tree_attention_triton(q, k, v, *, prefix_k, prefix_v, ancestor_mask, scale=None, prefix_rows=None):
    """Twin of torch_ops.tree_attention: q [T, nh, hd]; k, v [T, nkv, hd]; prefix_k, prefix_v [P, nkv, hd];
    ancestor_mask [T, T] (every prefix row attended) or [T, P + T], bool; prefix_rows (None, or an integer tensor of
    one element on q's device): the prefix rows before it are the only ones read, the rest not visible (clamped to
    [0, P]); -> [T, nh, hd] in q's dtype."""
    checks.check_prefix_rows(prefix_rows)
    C.check_device(q, k, v, prefix_k, prefix_v, ancestor_mask, prefix_rows)
    for name, x in (("q", q), ("k", k), ("v", v), ("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        _heads(x, name)
    T, nh, hd = q.shape
    P, nkv = prefix_k.shape[0], k.shape[1]
    if k.shape != (T, nkv, hd) or v.shape != k.shape or prefix_k.shape != (P, nkv, hd) or prefix_v.shape != (P, nkv, hd) \
            or nkv == 0 or nh % nkv:
        raise ValueError(f"k, v, prefix_k, prefix_v: expected [{T}, nkv, {hd}] twice and [P, nkv, {hd}] twice with nkv "
                         f"dividing {nh}, got {tuple(k.shape)}, {tuple(v.shape)}, {tuple(prefix_k.shape)}, "
                         f"{tuple(prefix_v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"q, k, v: expected one of float32, float16, bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    checks.check_ancestor_mask(ancestor_mask, T, P)
    if ancestor_mask.stride(-1) != 1:
        raise ValueError(f"ancestor_mask: expected contiguous rows, got strides {tuple(ancestor_mask.stride())}")
    mask_prefix = tuple(ancestor_mask.shape) == (T, P + T) and P > 0
    out = C.alloc((T, nh, hd), q.dtype, q.device)
    BT = max(16, min(32, C.next_pow2(T)))
    BD = max(16, C.next_pow2(hd))
    BN = 32 if BD <= 128 else 16
    mask8 = ancestor_mask.view(torch.uint8)
    launch(_tree_attention_kernel, (nh, C.cdiv(T, BT)), q=q, k=k, v=v, pk=prefix_k, pv=prefix_v,
           mask=mask8, prows=mask8 if prefix_rows is None else prefix_rows,  # (an unused pointer without it)
           out=out, T=T, P=P, G=nh // nkv, HD=hd, q_s0=q.stride(0),
           q_s1=q.stride(1), k_s0=k.stride(0), k_s1=k.stride(1), v_s0=v.stride(0), v_s1=v.stride(1),
           pk_s0=prefix_k.stride(0), pk_s1=prefix_k.stride(1), pv_s0=prefix_v.stride(0), pv_s1=prefix_v.stride(1),
           m_s0=ancestor_mask.stride(0), o_s0=out.stride(0), o_s1=out.stride(1),
           scale=float(scale) if scale is not None else 1.0 / math.sqrt(hd), MASK_PREFIX=mask_prefix,
           PREFIX_ROWS=prefix_rows is not None, QK_PREC="ieee" if q.dtype == torch.float32 else "tf32", BT=BT, BN=BN,
           BD=BD, num_warps=4)
    return out
