"""The folded WY form's two kernels, alone and together, over a wider configuration sweep than
bench_gdn_kernels.py (issue #13: <= 100 us at 8 x 65, <= 350 us at 32 x 65 on the H200): value
tile, warps and a register cap (gpu_backend.triton_wy_split.MAXNREG) for each kernel, with the root's
step folded into the weights (fold_root, the per-V-tile kernel's K chunk swept) and without, printing the
registers, spills and shared memory of each compiled kernel (what bounds how many programs an SM
holds); then the two together at the best configuration of each and at the defaults, with and
without programmatic dependent launch, and their error against the float64 oracle.

Variants measured with this script and since removed (results/2026-11-30-h200-bench-wy-fold-*.txt,
2026-12-02-h200-bench-wy-fold-halves-e0fabf5.txt): the per-head kernel in two halves of the block (two
[32, 32] doubling chains, Y_21 = (P_21 + Y_22 N_21) W_11: a third of the products, 45.7 us against 41.6 at
8 x 65, e0fabf5);
a second kernel that streamed the root state over K in chunks (62 / 219 us against 55 / 182 at
8 x 65 / 32 x 65, d6b9890); the doubling rounds in sequence (square, then multiply) rather than
paired, and the raw q, k loaded again after the solve (bfc0150).

    python benchmarks/bench_wy_fold.py [--commit SHA] [--shapes 8x65,32x65] [--cases-only] [--skip-accuracy]
"""
import argparse

import torch

from ddsim import oracle
from ddsim.bench.bench import (
    copy_bandwidth,
    cuda_header,
    ddtree_batch,
    fp32_tensor_rate,
    kernel_bytes,
    kernel_flops,
    kernel_inputs,
    off_rounded,
    parse_shapes,
    sweep,
    table_lines,
    timed_resources,
)
from ddsim.gpu_backend import triton_wy_split as ws
from ddsim.gpu_backend.triton_gdn import gdn_tree_verify_wy, plan_wy
from ddsim.measure.compare import rel_error

SOLVE = [dict(solve_warps=sw, maxnreg=r) for sw in (4, 8) for r in (None, 168)]
ROOT = [dict(fold_root=True, block_v=bv, block_k=bk, num_warps=nw, maxnreg=None)
        for bv in (32, 64, 128) for bk in (32, 64, 128) for nw in (4, 8)]


class Caps:
    """Sets ws.MAXNREG for the plans made inside (read at plan time)."""

    def __init__(self, caps):
        self.new = caps

    def __enter__(self):
        self.old, ws.MAXNREG = ws.MAXNREG, self.new

    def __exit__(self, *exc):
        ws.MAXNREG = self.old


def planner(common, part):
    """plan(config) of the fold design; a config's "maxnreg" caps the kernel ``part`` (0: per head,
    1: per V tile; both, a pair, when part is None); without one, the module's defaults."""
    def plan(c):
        c = dict(c)
        caps = c.pop("maxnreg", ws.MAXNREG if part is None else None)
        if part is not None:
            caps = tuple(caps if i == part else None for i in range(2))
        with Caps(caps):
            launch, o = plan_wy(**common, mode="exact", design="fold", **c)
        return (launch.parts[part] if part is not None else launch), o
    return plan


def resources(launch_fn):
    """Time launch_fn (triton's do_bench, median ms) and print the registers, spills and shared memory
    of each kernel it compiled."""
    ms, kernels = timed_resources(launch_fn)
    for c in kernels:
        print(f"#   {c['name']} {c['config']}: {c['regs']} registers, {c['spills']} spilled, {c['shared']} B shared",
              flush=True)
    return ms


def shape_rows(B, T, bw, rate, device="cuda", timer=None, cases_only=False):
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device=device)
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], parents=parents.to(device),
                  initial_state=inp["initial_state"], poison=False)
    nbytes, flops = kernel_bytes(B, T), kernel_flops(B, T)
    kw = dict(progress=lambda r: print(f"# {B}x{T} {r['kernel']}: {r['us']:.1f} us {r['config']}", flush=True),
              flops=flops, flop_rate=rate, timer=timer or resources)
    # each kernel alone: the per-head kernel with and without the root's step folded in (fold_root), the
    # per-V-tile kernel taking the root's step at its former default and multiplying S itself over its sweep
    rows = [] if cases_only else sweep(B, T, {
        "fold kernel (per head)": ("wy", [dict(c, fold_root=False) for c in SOLVE], planner(common, 0)),
        "fold kernel with the root folded in (per head)": ("wy", [dict(c, fold_root=True) for c in SOLVE],
                                                           planner(common, 0)),
        "apply kernel (per V tile)": ("wy", [dict(fold_root=False, block_v=64, num_warps=4, maxnreg=None)],
                                       planner(common, 1)),
        "apply kernel of the folded root (per V tile)": ("wy", ROOT, planner(common, 1))}, nbytes, bw, **kw)
    got = {r["kernel"]: dict(r["config"]) for r in rows}
    # the tf32x3, register-cap and 32-wide-tile cases of the runs before: results/2026-11-30-h200-bench-wy-fold-*.txt
    cases = {"fold + apply, defaults": ("wy", [{}], planner(common, None)),
             "fold + apply, defaults, PDL": ("wy", [dict(pdl=True)], planner(common, None)),
             "fold + apply, root step per V tile (the default before)": ("wy", [dict(fold_root=False)],
                                                                         planner(common, None)),
             "fold + apply, root step per V tile, PDL": ("wy", [dict(fold_root=False, pdl=True)], planner(common, None))}
    if len(got) == 4:
        s, a = got["fold kernel with the root folded in (per head)"], got["apply kernel of the folded root (per V tile)"]
        caps = (s.pop("maxnreg"), a.pop("maxnreg"))
        c = dict(a, **s, maxnreg=caps)
        cases["fold + apply, root folded, best of each"] = ("wy", [c], planner(common, None))
        cases["fold + apply, root folded, best of each, PDL"] = ("wy", [dict(c, pdl=True)], planner(common, None))
    return rows + sweep(B, T, cases, nbytes, bw, **kw)


def accuracy(device="cuda", B=2, T=65, H=4, HV=8, K=128, V=128, seed=1):
    _, parents = ddtree_batch(B, T, seed=seed)
    lines = ["| inputs | mode | dot precision | form | fold: relative error vs oracle (Frobenius) | "
             "oracle rounded to the inputs' dtype | outputs off the rounded oracle (%) |", "|---|---|---|---|---|---|---|"]
    for dtype in (torch.float32, torch.bfloat16):
        inp = kernel_inputs(B, T, H=H, HV=HV, K=K, V=V, dtype=dtype, device=device, seed=seed)
        qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        for mode in ("exact", "leaky"):
            ref = oracle.gdn_tree_verify(**{k: x.cpu() for k, x in qkv.items()}, parents=parents,
                                         initial_state=inp["initial_state"].cpu(), mode=mode)
            for prec, root in ((None, False), (None, True), ("tf32x3", True), ("bf16x3", True), ("tf32", True)):
                o = gdn_tree_verify_wy(**qkv, parents=parents.to(device), initial_state=inp["initial_state"],
                                       mode=mode, design="fold", precision=prec, fold_root=root)
                lines.append(f"| {str(dtype).replace('torch.', '')} | {mode} | {prec or 'default'} | "
                             f"{'root folded' if root else 'root step per V tile'} | "
                             f"{rel_error(o.cpu(), ref):.2e} | "
                             f"{rel_error(ref.to(dtype), ref) if dtype != torch.float32 else 0.0:.2e} | "
                             f"{100 * off_rounded(o, ref) if dtype != torch.float32 else float('nan'):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="8x65,32x65,1x65")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--cases-only", action="store_true", help="leave out each kernel's own sweep")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_fold: needs a CUDA device")
    print(cuda_header(a.commit))
    bw, rate = copy_bandwidth("cuda"), fp32_tensor_rate("cuda", "bf16x3")  # bf16 inputs' default
    rows = []
    for B, T in shapes:
        rows += shape_rows(B, T, bw, rate, cases_only=a.cases_only)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s" + (f"; FLOP floor at {rate / 1e12:.0f} TFLOP/s (bf16x3)" if rate else ""))
    print("\n".join(table_lines(rows)))
    if not a.skip_accuracy:
        print()
        print(accuracy())
