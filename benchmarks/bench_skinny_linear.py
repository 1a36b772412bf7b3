"""A verify's projections at Qwen3.6-27B shapes: cuBLAS (F.linear; --blas picks cuBLAS or cuBLASLt) beside a
few-row Triton kernel (below) over a sweep of its launch configurations, each timed from a CUDA graph over enough
copies of the weight that no copy is in L2 (what a verify's pass over 64 layers sees).

The Triton kernel: y = x W^T for x [M, K] with M up to 64 (a tree's nodes), W [N, K]. Each program owns BN output
columns and one of ``split`` equal slices of K; it streams its BN weight rows in BK-wide blocks and sums the
products of the M rows (padded to BM) in fp32; with several slices a second kernel adds the fp32 partials in slice
order (no atomics) and rounds.

    python3 benchmarks/bench_skinny_linear.py --rows 17,65 [--commit C]

Prints per shape and row count: cuBLAS's time and read rate, the best configuration's, and its largest error
against a float64 product in units of bf16's rounding of the largest output; then the 27B verify's projections summed."""
from __future__ import annotations

import itertools
import platform
import sys

import torch
import triton
import triton.language as tl

from ddsim.bench.bench import cuda_header
from ddsim.cli import _budgets, _Parser


@triton.jit
def _linear_kernel(x, w, y, M, N, K, K_SLICE, x_s0, w_s0, y_s0, y_s1,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    # x [M, K], w [N, K] (last dims contiguous); y [SPLIT, M, N] fp32 partials, or [M, N] (y_s1 = 0) rounded.
    # This program: columns pid(0) * BN .. + BN, the K slice pid(1) * K_SLICE .. + K_SLICE (a multiple of BK).
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * K_SLICE
    rows = tl.arange(0, BM)
    ks = tl.arange(0, BK)
    mr = rows < M
    mc = cols < N
    xp = x + rows[:, None].to(tl.int64) * x_s0 + (k0 + ks)[None, :]
    wp = w + cols[:, None].to(tl.int64) * w_s0 + (k0 + ks)[None, :]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kk in tl.range(0, K_SLICE, BK, num_stages=STAGES):
        mk = (k0 + kk + ks) < K
        xb = tl.load(xp + kk, mask=mr[:, None] & mk[None, :], other=0.0)
        wb = tl.load(wp + kk, mask=mc[:, None] & mk[None, :], other=0.0)
        acc += tl.dot(xb, tl.trans(wb))
    yp = y + tl.program_id(1).to(tl.int64) * y_s1 + rows[:, None] * y_s0 + cols[None, :]
    tl.store(yp, acc.to(y.dtype.element_ty), mask=mr[:, None] & mc[None, :])


@triton.jit
def _sum_slices_kernel(part, y, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    # part [SPLIT, M * N] fp32, summed in slice order -> y [M * N] (contiguous)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < MN
    acc = tl.load(part + offs, mask=m, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(part + s * MN + offs, mask=m, other=0.0)
    tl.store(y + offs, acc.to(y.dtype.element_ty), mask=m)


def skinny_linear(x: torch.Tensor, w: torch.Tensor, *, BN: int = 64, BK: int = 128, split: int = 1,
                  stages: int = 4, warps: int = 4) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype (M <= 128; last dims contiguous)."""
    M, K = x.shape
    N = w.shape[0]
    BM = max(16, triton.next_power_of_2(M))
    k_slice = triton.cdiv(triton.cdiv(K, split), BK) * BK
    split = triton.cdiv(K, k_slice)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(N, BN), split)
    if split == 1:
        _linear_kernel[grid](x, w, y, M, N, K, k_slice, x.stride(0), w.stride(0), y.stride(0), 0,
                             BM=BM, BN=BN, BK=BK, STAGES=stages, num_warps=warps)
        return y
    part = torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    _linear_kernel[grid](x, w, part, M, N, K, k_slice, x.stride(0), w.stride(0), N, M * N,
                         BM=BM, BN=BN, BK=BK, STAGES=stages, num_warps=warps)
    _sum_slices_kernel[(triton.cdiv(M * N, 1024),)](part, y, M * N, SPLIT=split, BLOCK=1024)
    return y


# (name, N, K, per-model count) at Qwen3.6-27B: 48 GDN layers, 16 attention layers, 64 MLPs, the LM head
SHAPES = [
    ("mlp.gate", 17408, 5120, 64), ("mlp.up", 17408, 5120, 64), ("mlp.down", 5120, 17408, 64),
    ("gdn.qkv", 10240, 5120, 48), ("gdn.z", 6144, 5120, 48), ("gdn.out", 5120, 6144, 48),
    ("attn.q", 6144, 5120, 16), ("attn.gate", 6144, 5120, 16), ("attn.kv", 1024, 5120, 32),
    ("attn.o", 5120, 6144, 16), ("lm_head", 248320, 5120, 1),
]
# the same weights concatenated along N, one product each: a layer's MLP gate and up, GDN's in-projections
# (qkv, z, a, b), attention's (q, gate, k, v)
FUSED = [("mlp.gate+up", 34816, 5120, 64), ("gdn.in", 16480, 5120, 48), ("attn.in", 14336, 5120, 16)]
CONFIGS = [dict(BN=bn, BK=bk, split=s, stages=st, warps=wp)
           for bn, bk, s, st, wp in itertools.product((32, 64, 128), (128, 256, 512), (1, 2, 4, 8), (3, 4, 6), (4, 8))
           if not (wp == 8 and bn == 32) and bn * bk <= 32768]


def graph_time(fn, reps: int = 20) -> float:
    """ms per replay of a graph of fn()"""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    ap = _Parser(prog="bench_skinny_linear", description=__doc__.splitlines()[0])  # bad input: one line, exit 2
    ap.add_argument("--rows", type=_budgets, default=[17, 65], help="row counts (a tree's nodes), comma-separated")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--cublas-only", action="store_true", help="time F.linear alone")
    ap.add_argument("--fused", action="store_true", help="the concatenated in-projections too")
    ap.add_argument("--blas", default="", help="torch.backends.cuda.preferred_blas_library (cublas, cublaslt)")
    args = ap.parse_args()
    rows = args.rows
    only = set(args.shapes.split(",")) - {""}
    if only - {name for name, *_ in SHAPES + FUSED}:
        ap.error(f"--shapes: unknown {', '.join(sorted(only - {name for name, *_ in SHAPES + FUSED}))}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_skinny_linear: needs a CUDA device")
    dev = torch.device("cuda")
    print(cuda_header(args.commit) + f" | {platform.node()}")
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    totals = {}
    for name, N, K, count in SHAPES + (FUSED if args.fused else []):
        if only and name not in only:
            continue
        nbytes = N * K * 2
        copies = max(1, -(-400_000_000 // nbytes))
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
        for M in rows:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ref = (x.double() @ ws[0].double().T)

            def err(y):  # the largest error in units of bf16's rounding of the largest output
                return float((y.double() - ref).abs().max() / (ref.abs().max() * torch.finfo(torch.bfloat16).eps))

            t_cublas = graph_time(lambda: [torch.nn.functional.linear(x, w) for w in ws]) / copies
            e_cublas = err(torch.nn.functional.linear(x, ws[0]))
            best = None
            for cfg in ([] if args.cublas_only else CONFIGS):
                try:
                    y = skinny_linear(x, ws[0], **cfg)
                    torch.cuda.synchronize()
                    t = graph_time(lambda: [skinny_linear(x, w, **cfg) for w in ws]) / copies
                except Exception as e:  # noqa: BLE001 - a configuration the device refuses (shared memory)
                    print(f"  {name} M={M} {cfg}: {type(e).__name__}", file=sys.stderr)
                    continue
                if best is None or t < best[0]:
                    best = (t, cfg, err(y))
            t, cfg, e = best or (float("inf"), None, float("nan"))
            print(f"{name:10s} N={N:6d} K={K:5d} M={M:3d} | cuBLAS {t_cublas * 1e3:8.1f} us "
                  f"{nbytes / t_cublas / 1e9:5.2f} TB/s err {e_cublas:.2f} | triton {t * 1e3:8.1f} us "
                  f"{nbytes / t / 1e9:5.2f} TB/s err {e:.2f} {cfg}", flush=True)
            if name in dict((f[0], 0) for f in SHAPES):
                c, tt = totals.get(M, (0.0, 0.0))
                totals[M] = (c + count * t_cublas, tt + count * min(t, t_cublas))
        ws = None
        torch.cuda.empty_cache()
    for M, (c, t) in totals.items():
        print(f"rows {M}: projections summed over the model: cuBLAS {c:.2f} ms, best of both {t:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
