"""The GDN WY kernel past one block (budgets 128 and 256: 129 and 257 nodes) on CUDA at Qwen3.6-27B
GDN shapes: the three-kernel split form (the default past 64 draft nodes: unfolded for one sequence,
folded for a batch) and the one-kernel chunked form it replaced, each over a small configuration
sweep; the split form's three kernels alone; the flattened / parent-indexed recurrent kernels and the
commit beside them, against the memory and FLOP floors (ddsim.bench.bench); then every design's accuracy
against the float64 oracle.

    python benchmarks/bench_wy_blocked.py [--commit SHA] [--shapes 1x129,8x129,1x257,8x257] [--block-t 64,32]
                                          [--precisions tf32x3] [--skip-chunked] [--skip-table]
                                          [--block-v 64,32,16] [--skip-accuracy]
"""
import argparse

import torch

from ddsim.bench import bench
from ddsim.bench.bench import (
    copy_bandwidth,
    cuda_header,
    fp32_tensor_rate,
    kernel_accuracy,
    kernel_table,
    parse_shapes,
    sweep,
    table_lines,
)
from ddsim.gpu_backend import _common
from ddsim.gpu_backend.triton_wy_blocked import plan_wy_blocked


def split_configs(block_vs=(64, 32, 16)):
    return [dict(block_v=bv, num_warps=nw, solve_warps=sw) for bv in block_vs for nw in (4, 8) for sw in (4, 8)]


SPLIT = split_configs()


def tiles(ap, flag: str, text: str) -> tuple:
    """The comma-separated powers of two >= 16 given to ``flag``; else argparse's one line and exit 2."""
    try:
        got = tuple(int(x) for x in text.split(","))
    except ValueError:
        got = ()
    if not got or any(n < 16 or n & (n - 1) for n in got):
        ap.error(f"{flag} {text!r}: expected powers of two >= 16, comma separated")
    return got
CHUNKED = [dict(block_v=bv, num_warps=nw) for bv, nw in ((32, 8), (32, 4), (16, 4))]
PARTS = ("diag", "solve", "apply")


def blocked_rows(B, T, bw, rate, progress, block_ts=(64,), chunked=True, precisions=()):
    """The split form (unfolded, folded, each kernel alone) at each chunk height in block_ts (32: twice
    the chunks, products an eighth the size), unfolded and folded at each dot precision in precisions
    too, and the chunked form it replaced."""
    _, parents = bench.ddtree_batch(B, T)
    inp = bench.kernel_inputs(B, T, device="cuda")
    common = dict(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents.cuda(),
                  initial_state=inp["initial_state"], poison=False, mode="exact")

    def plan(design, part=None, **kw):
        def p(c):
            launch, o = plan_wy_blocked(**common, design=design, **kw, **c)
            return (launch.parts[part] if part is not None else launch), o
        return p
    cases = {}
    for bt in block_ts:
        at = "" if bt == 64 else f", {bt}-row chunks"
        cases[f"wy split, unfolded{at} (3 kernels)"] = ("wy", SPLIT, plan("split", fold=False, block_t=bt))
        cases[f"wy split, folded{at} (3 kernels)"] = ("wy", SPLIT, plan("split", fold=True, block_t=bt))
        for i, part in enumerate(PARTS):
            cases[f"wy split{at}: {part} kernel alone"] = ("wy", SPLIT, plan("split", i, fold=False, block_t=bt))
    for prec in precisions:
        cases[f"wy split, unfolded, {prec} (3 kernels)"] = ("wy", SPLIT, plan("split", fold=False, precision=prec))
        cases[f"wy split, folded, {prec} (3 kernels)"] = ("wy", SPLIT, plan("split", fold=True, precision=prec))
    if chunked:
        cases["wy chunked (1 kernel, before)"] = ("wy", CHUNKED, plan("chunked"))
    return sweep(B, T, cases, bench.kernel_bytes(B, T), bw, progress=progress, flops=bench.kernel_flops(B, T),
                 flop_rate=rate)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x129,8x129,1x257,8x257")
    ap.add_argument("--block-t", default="64")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--precisions", default="", help="dot precisions to time beside the default, e.g. tf32x3")
    ap.add_argument("--skip-chunked", action="store_true", help="leave out the one-kernel chunked form (slow)")
    ap.add_argument("--block-v", default="64,32,16", help="the split form's V tiles to sweep")
    ap.add_argument("--skip-table", action="store_true",
                    help="leave out the recurrent kernels' table (flattened, parent-indexed, commit)")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    block_ts, block_vs = tiles(ap, "--block-t", a.block_t), tiles(ap, "--block-v", a.block_v)
    try:
        precisions = tuple(p for p in a.precisions.split(",") if p)
        for p in precisions:
            _common.check_precision(p)
    except ValueError:
        ap.error(f"--precisions {a.precisions!r}: expected dot precisions ({', '.join(_common.DOT_PRECISIONS)})")
    SPLIT[:] = split_configs(block_vs)
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_blocked: needs a CUDA device")
    print(cuda_header(a.commit), flush=True)
    bw, rate = copy_bandwidth("cuda"), fp32_tensor_rate("cuda", "bf16x3")  # bf16 inputs' default
    print(f"# floors: copy bandwidth {bw / 1e9:.0f} GB/s" + (f", bf16x3 products at {rate / 1e12:.0f} TFLOP/s" if rate else ""))

    def progress(r):
        print(f"# {r['B']}x{r['T']} {r['kernel']}: {r['us']:.1f} us {r['config']}", flush=True)
    rows = []
    for B, T in shapes:
        rows += blocked_rows(B, T, bw, rate, progress, block_ts, not a.skip_chunked, precisions)
    print("\n".join(table_lines(rows)), flush=True)
    if not a.skip_table:
        table, _ = kernel_table(shapes=shapes, precisions=(), only=["leaky", "exact parent-indexed", "commit"],
                                progress=progress)
        print(table, flush=True)
    if not a.skip_accuracy:
        print(kernel_accuracy(T=129), flush=True)
        print(kernel_accuracy(B=1, T=257), flush=True)
