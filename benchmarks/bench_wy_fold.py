"""The folded WY form's two kernels, alone and together, over a wider configuration sweep than
bench_gdn_kernels.py (issue #13: <= 100 us at 8 x 65, <= 350 us at 32 x 65 on the H200):

- the per-head (fold) kernel with each doubling round's two products paired (both read the same N)
  or in sequence (square, then multiply), by warps and register cap;
- the per-V-tile kernel holding the root state whole (BV x K in registers) or streaming it over K in
  chunks (the root step as a rank-1 update; loads pipelined over ``stages``);
- the two together from the best configurations of each, with and without programmatic dependent
  launch;
then each variant's error against the float64 oracle (fp32 and bf16 inputs).

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

SOLVE = [dict(solve_warps=sw) for sw in (4, 8)]
WARPS = (4, 8)  # --apply-warps narrows this (a faulting configuration poisons the process's CUDA context)


def tile_cfgs():
    return [dict(block_v=bv, num_warps=nw) for bv in (32, 64, 128) for nw in WARPS]


def stream_cfgs():
    return [dict(block_v=bv, num_warps=nw, stream_k=sk, stages=st)
            for bv in (64, 128) for nw in WARPS for sk in (32, 64) for st in (1, 2, 3)] + [
            dict(block_v=32, num_warps=nw, stream_k=32, stages=2) for nw in WARPS]


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


class Paired:
    """Sets ws.PAIRED_SOLVE for the plans made inside (the kernel reads it as a constexpr at plan time)."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.was, ws.PAIRED_SOLVE = ws.PAIRED_SOLVE, self.on

    def __exit__(self, *exc):
        ws.PAIRED_SOLVE = self.was


def planner(common, part=None, paired=True):
    def plan(c):
        with Paired(paired):
            launch, o = plan_wy(**common, mode="exact", design="fold", **c)
        return (launch.parts[part] if part is not None else launch), o
    return plan


def best(rows, name):
    hits = [r for r in rows if r["kernel"] == name]
    return hits[0]["config"] if hits else None


def shape_rows(B, T, bw, rate, device="cuda", timer=None):
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device=device)
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], parents=parents.to(device),
                  initial_state=inp["initial_state"], poison=False)
    nbytes, flops = kernel_bytes(B, T), kernel_flops(B, T)
    kw = dict(progress=lambda r: print(f"# {B}x{T} {r['kernel']}: {r['us']:.1f} us {r['config']}", flush=True),
              flops=flops, flop_rate=rate, timer=timer or resources)
    cases = {"fold kernel, rounds paired": ("wy", SOLVE, planner(common, 0, True)),
             "fold kernel, rounds in sequence": ("wy", SOLVE, planner(common, 0, False)),
             "apply kernel, state held whole": ("wy", tile_cfgs(), planner(common, 1)),
             "apply kernel, state streamed": ("wy", stream_cfgs(), planner(common, 1))}
    rows = sweep(B, T, cases, nbytes, bw, **kw)
    solve = {r["kernel"]: r for r in rows if r["kernel"].startswith("fold kernel")}
    if not solve:
        return rows
    fastest = min(solve, key=lambda n: solve[n]["us"])
    s, paired = solve[fastest]["config"], fastest.endswith("paired")
    whole = {}
    for name, part in (("state held whole", "apply kernel, state held whole"),
                       ("state streamed", "apply kernel, state streamed")):
        a = best(rows, part)
        if a is None:
            continue
        rounds = "paired" if paired else "in sequence"
        whole[f"fold + apply, {name} (rounds {rounds})"] = ("wy", [dict(a, **s)], planner(common, None, paired))
        whole[f"fold + apply, {name} (rounds {rounds}), PDL"] = ("wy", [dict(a, **s, pdl=True)],
                                                                planner(common, None, paired))
    return rows + sweep(B, T, whole, nbytes, bw, **kw)


def accuracy(device="cuda", B=2, T=65, H=4, HV=8, K=128, V=128, seed=1):
    _, parents = ddtree_batch(B, T, seed=seed)
    lines = ["| inputs | variant | mode | relative error vs oracle (Frobenius) |", "|---|---|---|---|"]
    variants = {"state held whole": {}, "state streamed by 32": dict(stream_k=32, stages=2),
                "state streamed by 64": dict(stream_k=64, stages=3)}
    for dtype in (torch.float32, torch.bfloat16):
        inp = kernel_inputs(B, T, H=H, HV=HV, K=K, V=V, dtype=dtype, device=device, seed=seed)
        qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        for mode in ("exact", "leaky"):
            ref = oracle.gdn_tree_verify(**{k: x.cpu() for k, x in qkv.items()}, parents=parents,
                                         initial_state=inp["initial_state"].cpu(), mode=mode)
            if dtype != torch.float32:
                lines.append(f"| bf16 | (oracle rounded to bf16) | {mode} | {rel_error(ref.to(dtype), ref):.2e} |")
            for paired in (True, False):
                for name, kw in variants.items():
                    with Paired(paired):
                        o = gdn_tree_verify_wy(**qkv, parents=parents.to(device), initial_state=inp["initial_state"],
                                               mode=mode, design="fold", **kw)
                    lines.append(f"| {str(dtype).replace('torch.', '')} | rounds {'paired' if paired else 'in sequence'}"
                                 f", {name} | {mode} | {rel_error(o.cpu(), ref):.2e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="8x65,32x65,1x65")
    ap.add_argument("--apply-warps", default="4,8", help="num_warps of the per-V-tile kernel to sweep")
    ap.add_argument("--skip-accuracy", action="store_true")
    a = ap.parse_args()
    WARPS = tuple(int(w) for w in a.apply_warps.split(","))
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
