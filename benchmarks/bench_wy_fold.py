"""The folded WY form's two kernels, alone and together, over a wider configuration sweep than
bench_gdn_kernels.py (issue #13: <= 100 us at 8 x 65, <= 350 us at 32 x 65 on the H200). Side by
side in one run, each variant of the code the module flags of gpu_backend.triton_wy_split select:

- PAIRED_SOLVE: each doubling round's two products read the same N (paired) or square N first
  and then multiply by it (in sequence);
- LEAN: the raw q, k loaded again after the solve instead of held in registers through it, and
  the partial products of each fp32-level product accumulated by the MMAs themselves (one
  accumulator) instead of apart and summed (the registers and spills each compiled kernel needs are
  printed);

then the two kernels together from the best configurations of each, with and without programmatic
dependent launch, and each variant's error against the float64 oracle (fp32 and bf16 inputs).
(A second kernel that streamed the root state over K in chunks was measured slower, 62 / 219 us
against 55 / 182 at 8 x 65 / 32 x 65, and removed: results/2026-11-30-h200-bench-wy-fold-w4-d6b9890.txt.)

    python benchmarks/bench_wy_fold.py [--commit SHA] [--shapes 8x65,32x65]
"""
import argparse
import platform
import time

import torch
import triton

from ddsim import oracle
from ddsim.bench import copy_bandwidth, ddtree_batch, fp32_tensor_rate, kernel_bytes, kernel_flops, kernel_inputs, sweep, table_lines
from ddsim.compare import rel_error
from ddsim.gpu_backend import triton_wy_split as ws
from ddsim.gpu_backend.triton_gdn import gdn_tree_verify_wy, plan_wy

SOLVE = [dict(solve_warps=sw, maxnreg=r) for sw in (4, 8) for r in (None, 168)]
APPLY = [dict(block_v=bv, num_warps=nw, maxnreg=r) for bv in (32, 64, 128) for nw in (4, 8) for r in (None, 168)]
VARIANTS = {f"rounds {'paired' if p else 'in sequence'}, {'lean' if lean else 'not lean'}": dict(paired=p, lean=lean)
            for p in (True, False) for lean in (True, False)}


class Flags:
    """Sets ws.PAIRED_SOLVE, ws.LEAN and ws.MAXNREG for the plans made inside (read at plan time)."""

    def __init__(self, paired: bool, lean: bool, maxnreg=(None, None)):
        self.new = (paired, lean, maxnreg)

    def __enter__(self):
        self.old = (ws.PAIRED_SOLVE, ws.LEAN, ws.MAXNREG)
        ws.PAIRED_SOLVE, ws.LEAN, ws.MAXNREG = self.new

    def __exit__(self, *exc):
        ws.PAIRED_SOLVE, ws.LEAN, ws.MAXNREG = self.old


def planner(common, part, flags):
    """plan(config) of the fold design under ``flags``; a config's "maxnreg" caps the kernel ``part``
    (both kernels' caps, a pair, when part is None)."""
    def plan(c):
        c = dict(c)
        cap = c.pop("maxnreg", None)
        caps = cap if part is None else tuple(cap if i == part else None for i in range(2))
        with Flags(**flags, maxnreg=caps or (None, None)):
            launch, o = plan_wy(**common, mode="exact", design="fold", **c)
        return (launch.parts[part] if part is not None else launch), o
    return plan


def resources(launch_fn):
    """Time launch_fn (triton's do_bench, median ms) and print the registers, spills and shared memory
    of each kernel it compiled (what bounds how many programs an SM holds)."""
    from triton.testing import do_bench

    from ddsim.gpu_backend import launch as L
    before = set(L._COMPILED)
    ms = do_bench(launch_fn, warmup=10, rep=50, return_mode="median")
    for key in sorted(set(L._COMPILED) - before, key=str):
        ck, name = L._COMPILED[key], L._PARAMS[key[0]][3].__name__
        print(f"#   {name} {key[2]}: {getattr(ck, 'n_regs', '?')} registers, {getattr(ck, 'n_spills', '?')} spilled, "
              f"{getattr(ck.metadata, 'shared', '?')} B shared", flush=True)
    return ms


def shape_rows(B, T, bw, rate, device="cuda", timer=None):
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device=device)
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], parents=parents.to(device),
                  initial_state=inp["initial_state"], poison=False)
    nbytes, flops = kernel_bytes(B, T), kernel_flops(B, T)
    kw = dict(progress=lambda r: print(f"# {B}x{T} {r['kernel']}: {r['us']:.1f} us {r['config']}", flush=True),
              flops=flops, flop_rate=rate, timer=timer or resources)
    cases = {f"fold kernel, {name}": ("wy", SOLVE, planner(common, 0, f)) for name, f in VARIANTS.items()}
    for lean in (True, False):
        cases[f"apply kernel, {'lean' if lean else 'not lean'}"] = ("wy", APPLY, planner(common, 1, dict(
            paired=True, lean=lean)))
    rows = sweep(B, T, cases, nbytes, bw, **kw)
    got = {r["kernel"]: r for r in rows}
    whole = {}
    for name, f in VARIANTS.items():
        s, a = got.get(f"fold kernel, {name}"), got.get(f"apply kernel, {'lean' if f['lean'] else 'not lean'}")
        if s and a:
            sc, ac = dict(s["config"]), dict(a["config"])
            caps = (sc.pop("maxnreg"), ac.pop("maxnreg"))
            c = dict(ac, **sc, maxnreg=caps)
            whole[f"fold + apply, {name}"] = ("wy", [c], planner(common, None, f))
            whole[f"fold + apply, {name}, PDL"] = ("wy", [dict(c, pdl=True)], planner(common, None, f))
    return rows + sweep(B, T, whole, nbytes, bw, **kw)


def accuracy(device="cuda", B=2, T=65, H=4, HV=8, K=128, V=128, seed=1):
    _, parents = ddtree_batch(B, T, seed=seed)
    lines = ["| inputs | variant | mode | relative error vs oracle (Frobenius) |", "|---|---|---|---|"]
    for dtype in (torch.float32, torch.bfloat16):
        inp = kernel_inputs(B, T, H=H, HV=HV, K=K, V=V, dtype=dtype, device=device, seed=seed)
        qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        for mode in ("exact", "leaky"):
            ref = oracle.gdn_tree_verify(**{k: x.cpu() for k, x in qkv.items()}, parents=parents,
                                         initial_state=inp["initial_state"].cpu(), mode=mode)
            if dtype != torch.float32:
                lines.append(f"| bf16 | (oracle rounded to bf16) | {mode} | {rel_error(ref.to(dtype), ref):.2e} |")
            for name, f in VARIANTS.items():
                with Flags(**f):
                    o = gdn_tree_verify_wy(**qkv, parents=parents.to(device), initial_state=inp["initial_state"],
                                           mode=mode, design="fold")
                lines.append(f"| {str(dtype).replace('torch.', '')} | {name} | {mode} | {rel_error(o.cpu(), ref):.2e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="8x65,32x65,1x65")
    ap.add_argument("--skip-accuracy", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_fold: needs a CUDA device")
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    print(f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.get_device_name()} | torch {torch.__version__} | "
          f"triton {triton.__version__} | python {platform.python_version()} | commit {a.commit}")
    bw, rate = copy_bandwidth("cuda"), fp32_tensor_rate("cuda")
    rows = []
    for B, T in shapes:
        rows += shape_rows(B, T, bw, rate)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s" + (f"; FLOP floor at {rate / 1e12:.0f} TFLOP/s" if rate else ""))
    print("\n".join(table_lines(rows)))
    if not a.skip_accuracy:
        print()
        print(accuracy())
