"""The layers' elementwise glue in one kernel each, where PyTorch launches three to twelve: RMSNorm (with
the residual add before it), an attention head's q/k norm with its (partial) RoPE, the GDN output's gated
RMSNorm, a gated activation (SwiGLU, GeGLU, a sigmoid-gated output) and the GDN gates. Each reproduces its
twin in torch_ops (rms_norm, rms_norm_rope, gated_rms_norm, gated_act, gdn_gates) rounding for rounding:
every intermediate PyTorch rounds to the activations' dtype is rounded here too, so the two differ only in
the order of the fp32 sum of squares and in the last bits of exp, erf and sigmoid.

Rows are read through a row stride (the last dim contiguous), so a column slice of a wider GEMM output
(the GDN's [a | b] projection) is read in place.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend.launch import launch


@triton.jit
def _rms(x, D, eps):
    """x [BR, BD] fp32 (zeros past D) -> x / sqrt(mean(x^2) + eps) row by row."""
    return x / tl.sqrt(tl.sum(x * x, 1) / D + eps)[:, None]


@triton.jit
def _rms_norm_kernel(x, res, w, out, h_out, R, D, x_stride, res_stride, eps,
                     BR: tl.constexpr, BD: tl.constexpr, ADD: tl.constexpr):
    # rows [BR] of x [R, D] (or of h = x + res, stored to h_out, with ADD): out = round(round(rms(h)) w), the
    # inner rounding to h's dtype, the outer to out's (the promotion of h's and w's dtypes, as PyTorch's product)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    m = (rows < R)[:, None] & (cols < D)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    h = tl.load(x + r64 * x_stride + cols[None, :], mask=m, other=0.0)
    if ADD:
        h = (h.to(tl.float32) + tl.load(res + r64 * res_stride + cols[None, :], mask=m, other=0.0).to(tl.float32))
        h = h.to(h_out.dtype.element_ty)
        tl.store(h_out + r64 * D + cols[None, :], h, mask=m)
    y = _rms(h.to(tl.float32), D, eps).to(x.dtype.element_ty).to(tl.float32)  # rounded to h's dtype
    wv = tl.load(w + cols, mask=cols < D, other=0.0).to(tl.float32)
    tl.store(out + r64 * D + cols[None, :], (y * wv[None, :]).to(out.dtype.element_ty), mask=m)


@triton.jit
def _rms_norm_rope_kernel(x, w, cos, sin, out, R, D, HN, ROT, x_s0, x_s1, eps, BR: tl.constexpr, BD: tl.constexpr):
    # rows [BR] of x [n, HN, D] (R = n * HN heads of D, row r at (r // HN) x_s0 + (r % HN) x_s1: a view of a wider
    # projection is read in place): y = round(round(rms(x)) w), then its first ROT dims rotated at row r's position
    # r // HN (cos, sin [n, ROT]; rotate-half): round(round(y cos) + round(y' sin)), y' the partner half
    # (-y[j + ROT/2] for j < ROT/2, y[j - ROT/2] above); out [R, D] contiguous
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mr = rows < R
    m = mr[:, None] & (cols < D)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    # a row's (token, head) by 32-bit division (rows < R < 2^31), the addresses in 64 bits
    xr = x + (rows // HN).to(tl.int64)[:, None] * x_s0 + (rows % HN).to(tl.int64)[:, None] * x_s1
    xv = tl.load(xr + cols[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.sqrt(tl.sum(xv * xv, 1) / D + eps)[:, None]
    half = ROT // 2
    pc = tl.where(cols < half, cols + half, cols - half)  # the partner column of a rotated one
    rot = (cols < ROT)[None, :]
    xp = tl.load(xr + pc[None, :], mask=m & rot, other=0.0).to(tl.float32)
    wv = tl.load(w + cols, mask=cols < D, other=0.0).to(tl.float32)
    wp = tl.load(w + pc, mask=cols < ROT, other=0.0).to(tl.float32)
    y = ((xv / s).to(x.dtype.element_ty).to(tl.float32) * wv[None, :]).to(out.dtype.element_ty).to(tl.float32)
    yp = ((xp / s).to(x.dtype.element_ty).to(tl.float32) * wp[None, :]).to(out.dtype.element_ty).to(tl.float32)
    yp = tl.where((cols < half)[None, :], -yp, yp)
    pos = (rows // HN).to(tl.int64)[:, None]
    c = tl.load(cos + pos * ROT + cols[None, :], mask=mr[:, None] & rot, other=0.0).to(tl.float32)
    sn = tl.load(sin + pos * ROT + cols[None, :], mask=mr[:, None] & rot, other=0.0).to(tl.float32)
    a = (y * c).to(out.dtype.element_ty).to(tl.float32)
    b = (yp * sn).to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + r64 * D + cols[None, :], tl.where(rot, a + b, y).to(out.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_norm_kernel(x, z, w, out, R, D, HD, x_stride, z_stride, eps, BR: tl.constexpr, BD: tl.constexpr):
    # rows [BR] of x [R, D] (R = N * heads, each head's D normed): out = round(round(round(rms(x)) w) round(silu(z)))
    # z [N, heads * D] with row stride z_stride (HD = heads, rows r -> (r // HD, r % HD))
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    m = (rows < R)[:, None] & (cols < D)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    y = _rms(tl.load(x + r64 * x_stride + cols[None, :], mask=m, other=0.0).to(tl.float32), D, eps)
    y = y.to(out.dtype.element_ty).to(tl.float32)
    wv = tl.load(w + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = (y * wv[None, :]).to(out.dtype.element_ty).to(tl.float32)
    zo = (rows // HD).to(tl.int64)[:, None] * z_stride + (rows % HD).to(tl.int64)[:, None] * D + cols[None, :]
    zv = tl.load(z + zo, mask=m, other=0.0).to(tl.float32)
    s = (zv * tl.sigmoid(zv)).to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + r64 * D + cols[None, :], (y * s).to(out.dtype.element_ty), mask=m)


@triton.jit
def _gated_act_kernel(gate, up, out, I, g_stride, BLOCK: tl.constexpr, ACT: tl.constexpr):
    # out = round(round(act(gate)) up) over rows of I (up and out contiguous; gate's rows at g_stride: a view of a
    # wider projection is read in place). Grid (rows, column blocks): a row's base is one 64-bit product a program,
    # where a flat index split into row and column took a 64-bit division an element
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    gv = tl.load(gate + row * g_stride + c, mask=m, other=0.0).to(tl.float32)
    if ACT == 1:  # the exact (erf) GELU, F.gelu's default
        a = 0.5 * gv * (1.0 + tl.math.erf(gv * 0.7071067811865476))
    elif ACT == 2:  # a sigmoid gate (gated attention's output)
        a = tl.sigmoid(gv)
    else:
        a = gv * tl.sigmoid(gv)
    a = a.to(out.dtype.element_ty).to(tl.float32)
    o = row * I + c
    tl.store(out + o, (a * tl.load(up + o, mask=m, other=0.0).to(tl.float32)).to(out.dtype.element_ty), mask=m)


@triton.jit
def _softplus(x, LIBDEVICE: tl.constexpr):
    """F.softplus (threshold 20): log1p(exp(x)) to fp32 precision, x past 20. Compiled: libdevice's log1pf (a
    plain log(1 + e) loses the digits of a small e, and the GPU's fast log is not accurate near 1); in the
    interpreter (which has no libdevice) log(u) e / (u - 1) with u = 1 + e, exact to rounding with numpy's log."""
    e = tl.exp(tl.minimum(x, 20.0, propagate_nan=tl.PropagateNan.ALL))  # a NaN stays NaN, as in torch
    if LIBDEVICE:
        lp = libdevice.log1p(e)
    else:
        u = 1.0 + e
        lp = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def _gdn_gates_kernel(a, b, A, dt_bias, g, beta, R, HV, a_stride, b_stride, beta_scale, BR: tl.constexpr,
                      BH: tl.constexpr, LIBDEVICE: tl.constexpr):
    # g = A softplus(a + dt_bias), beta = sigmoid(b) beta_scale, rows [BR] of [R, HV] (a, b raw, read strided)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BH)
    m = (rows < R)[:, None] & (cols < HV)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    av = tl.load(a + r64 * a_stride + cols[None, :], mask=m, other=0.0).to(tl.float32)
    bv = tl.load(b + r64 * b_stride + cols[None, :], mask=m, other=0.0).to(tl.float32)
    Av = tl.load(A + cols, mask=cols < HV, other=0.0)
    bias = tl.load(dt_bias + cols, mask=cols < HV, other=0.0)
    tl.store(g + r64 * HV + cols[None, :], Av[None, :] * _softplus(av + bias[None, :], LIBDEVICE), mask=m)
    tl.store(beta + r64 * HV + cols[None, :], tl.sigmoid(bv) * beta_scale, mask=m)


def _rows(x: torch.Tensor, name: str) -> tuple[torch.Tensor, int]:
    """x [..., D] as rows [R, D] with its row stride (the last dim contiguous; copied only where the rows
    cannot be addressed by one stride)."""
    if x.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous, got strides {tuple(x.stride())}")
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    return x2, x2.stride(0)


def _block_rows(D: int, budget: int = 4096) -> tuple[int, int]:
    """(rows per program, padded width) for rows of D elements: about ``budget`` elements a program."""
    BD = C.next_pow2(D, 16)
    return max(1, min(64, budget // BD)), BD


def rms_norm_triton(x, weight, *, eps: float, residual=None):
    """Twin of torch_ops.rms_norm: x [..., D] -> normed [..., D] in the promotion of x's and weight's dtypes
    (with residual [..., D] of x's dtype: (normed x + residual, x + residual))."""
    C.check_device(x, weight, residual)
    D = x.shape[-1]
    if weight.shape != (D,):
        raise ValueError(f"weight: expected [{D}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual: expected {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
    x2, xs = _rows(x, "x")
    R = x2.shape[0]
    out = C.alloc(x.shape, torch.promote_types(x.dtype, weight.dtype), x.device)
    h = C.alloc(x.shape, x.dtype, x.device) if residual is not None else out
    r2, rs = _rows(residual, "residual") if residual is not None else (x2, xs)
    BR, BD = _block_rows(D)
    launch(_rms_norm_kernel, (C.cdiv(R, BR),), x=x2, res=r2, w=weight, out=out, h_out=h, R=R, D=D, x_stride=xs,
           res_stride=rs, eps=float(eps), BR=BR, BD=BD, ADD=residual is not None, num_warps=4 if BD <= 2048 else 8)
    return (out, h) if residual is not None else out


def rms_norm_rope_triton(x, weight, cos, sin, *, eps: float):
    """Twin of torch_ops.rms_norm_rope: x [n, heads, D] (the last dim contiguous; rows and heads read through their
    strides) -> its heads normed (weight [D]) and their first ROT dims rotated by cos, sin [n, ROT] (rotate-half),
    in x's dtype."""
    C.check_device(x, weight, cos, sin)
    n, HN, D = x.shape
    ROT = cos.shape[-1]
    if not x.dtype == weight.dtype == cos.dtype == sin.dtype or weight.shape != (D,):
        raise ValueError(f"x, weight, cos, sin: expected one dtype and weight [{D}], got {x.dtype}, {weight.dtype} "
                         f"{tuple(weight.shape)}, {cos.dtype}, {sin.dtype}")
    if cos.shape != (n, ROT) or sin.shape != (n, ROT) or ROT % 2 or not 0 < ROT <= D:
        raise ValueError(f"cos, sin: expected [{n}, ROT] with ROT even and <= {D}, got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")
    if x.stride(-1) != 1:
        raise ValueError(f"x: the last dim must be contiguous, got strides {tuple(x.stride())}")
    out = C.alloc(x.shape, x.dtype, x.device)
    BR, BD = _block_rows(D)
    launch(_rms_norm_rope_kernel, (C.cdiv(n * HN, BR),), x=x, w=weight, cos=cos.contiguous(), sin=sin.contiguous(),
           out=out, R=n * HN, D=D, HN=HN, ROT=ROT, x_s0=x.stride(0), x_s1=x.stride(1), eps=float(eps), BR=BR, BD=BD)
    return out


def gated_rms_norm_triton(x, weight, gate, *, eps: float):
    """Twin of torch_ops.gated_rms_norm: x [N, heads, D], gate [N, heads * D] (rows may be strided)
    -> [N, heads, D] in x's dtype."""
    C.check_device(x, weight, gate)
    N, HD, D = x.shape
    if not x.dtype == weight.dtype == gate.dtype or weight.shape != (D,):
        raise ValueError(f"x, weight, gate: expected one dtype and weight [{D}], got {x.dtype}, {weight.dtype} "
                         f"{tuple(weight.shape)}, {gate.dtype}")
    x2, xs = _rows(x, "x")
    if gate.dim() != 2 or gate.shape != (N, HD * D) or gate.stride(1) != 1:
        raise ValueError(f"gate: expected [{N}, {HD * D}] with contiguous rows, got {tuple(gate.shape)}")
    out = C.alloc(x.shape, x.dtype, x.device)
    BR, BD = _block_rows(D)
    launch(_gated_rms_norm_kernel, (C.cdiv(N * HD, BR),), x=x2, z=gate, w=weight, out=out, R=N * HD, D=D, HD=HD,
           x_stride=xs, z_stride=gate.stride(0), eps=float(eps), BR=BR, BD=BD)
    return out


def gated_act_triton(gate, up, *, act: str):
    """Twin of torch_ops.gated_act: act(gate) * up, both [..., I], in gate's dtype (gate's rows read through their
    stride where its last dim is contiguous: a view of a wider projection; otherwise copied)."""
    C.check_device(gate, up)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate, up: expected one shape and dtype, got {tuple(gate.shape)} {gate.dtype}, "
                         f"{tuple(up.shape)} {up.dtype}")
    I = max(gate.shape[-1], 1) if gate.dim() else 1
    # rows [R, I] at one stride (_rows: a view where they take one, else a copy); a strided last dim copied first
    g, gs = _rows(gate if gate.dim() and gate.stride(-1) == 1 else gate.reshape(-1, I).contiguous(), "gate")
    u = up.contiguous()
    out = C.alloc(gate.shape, gate.dtype, gate.device)
    R, BLOCK = u.numel() // I, min(1024, C.next_pow2(I))
    if R:
        launch(_gated_act_kernel, (R, C.cdiv(I, BLOCK)), gate=g, up=u, out=out, I=I, g_stride=gs, BLOCK=BLOCK,
               ACT={"silu": 0, "gelu": 1, "sigmoid": 2}[act])
    return out


def gdn_gates_triton(a, b, *, A, dt_bias, beta_scale: float = 1.0):
    """Twin of torch_ops.gdn_gates: a, b [N, HV] raw (rows may be strided); A = -exp(A_log), dt_bias
    [HV] fp32 -> (g, beta) [N, HV] fp32."""
    C.check_device(a, b, A, dt_bias)
    N, HV = a.shape
    a2, as_ = _rows(a, "a")
    b2, bs = _rows(b, "b")
    g = C.alloc((N, HV), torch.float32, a.device)
    beta = C.alloc((N, HV), torch.float32, a.device)
    BR, BH = _block_rows(HV, budget=2048)
    launch(_gdn_gates_kernel, (C.cdiv(N, BR),), a=a2, b=b2, A=A.contiguous(), dt_bias=dt_bias.contiguous(), g=g,
           beta=beta, R=N, HV=HV, a_stride=as_, b_stride=bs, beta_scale=float(beta_scale), BR=BR, BH=BH,
           LIBDEVICE=not C.interpreting())
    return g, beta
