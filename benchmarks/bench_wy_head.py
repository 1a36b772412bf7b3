"""The folded WY form in one program per head (design "head": the weights applied by the program that made them,
one launch, no scratch read back by a second grid) beside the two-kernel folded form (design "fold") and the
defaults of design "auto", kernels alone, at the shapes of issue #36; a sweep of the head kernel's V tile
(triton_wy_split.HEAD_BLOCK_V), warps and pipelining stages (HEAD_STAGES), each configuration in its own process.

Variants measured with this script and since removed (results/2026-12-02-h200-bench-wy-head-e8d3cb1.txt): the
weights passed through global memory inside the program (written, a barrier, read back per V tile: 77.4 / 223.9
us against 62.5 / 171.5 at 8 x 65 / 32 x 65). 32-wide V tiles faulted (an illegal address) at 8 x 65 under Triton
3.6 in three of four configurations; the fourth ran, slower.

    python benchmarks/bench_wy_head.py [--commit SHA] [--shapes 1x16,1x65,8x65,32x65] [--caps 168,128] [--variants]

--caps times only the default configuration and the same with each register cap (maxnreg): at 255 registers an
SM holds two programs, at 168 three, at 128 four. --variants times only the default configuration with a program per
head, with one per (head, V tile), and as design auto chooses between them (HEAD_SPLIT_V False, True, None), each
without the last, partial wave's heads split along V, then auto's choice with it (HEAD_MIXED, the default).
Measured with it and removed: the state prefetched into L2 before the weights are made, slower at 8 x 65 and 32 x 65
(results/2026-12-03-h200-bench-wy-head-variants-5951805.txt); the last, partial wave's heads split in a second launch
overlapped by programmatic dependent launch, 80.4 us at 8 x 65 against 56.5 (-tail-pdl-uncommitted.txt); each V
tile's reads in one round (HEAD_TILE_READS), 55.6 against 54.1 us a program per head at 8 x 65
(-variants-d4a9a5d.txt).
"""
import argparse
import json
import subprocess
import sys

import torch

from ddsim.bench.bench import (
    copy_bandwidth,
    cuda_header,
    ddtree_batch,
    kernel_bytes,
    kernel_inputs,
    parse_shapes,
    timed_resources,
)
from ddsim.gpu_backend import triton_wy_split as ws
from ddsim.gpu_backend.triton_gdn import plan_wy

HEAD = ([dict(block_v=bv, solve_warps=4, stages=ns, maxnreg=None) for bv in (64, 128) for ns in (1, 2)]
        + [dict(block_v=64, solve_warps=8, stages=1, maxnreg=None), dict(block_v=64, solve_warps=4, stages=1, maxnreg=168)])


def timed(launch):
    ms, kernels = timed_resources(launch)
    return ms, "; ".join(f"{c['regs']} regs, {c['spills']} spilled, {c['shared']} B shared" for c in kernels)


def head_plan(common, c):
    """plan_wy's head design at configuration c (the module settings it reads at plan time, restored after)."""
    c = dict(c)
    old = ws.HEAD_BLOCK_V, ws.HEAD_STAGES, ws.MAXNREG, ws.HEAD_SPLIT_V, ws.HEAD_MIXED
    ws.HEAD_BLOCK_V, ws.HEAD_STAGES = c.pop("block_v"), c.pop("stages")
    ws.HEAD_SPLIT_V = c.pop("split_v", None)
    ws.HEAD_MIXED = c.pop("mixed", False)
    cap = c.pop("maxnreg")
    ws.MAXNREG = (cap, None) if cap else None
    try:
        return plan_wy(**common, mode="exact", design="head", **c)
    finally:
        ws.HEAD_BLOCK_V, ws.HEAD_STAGES, ws.MAXNREG, ws.HEAD_SPLIT_V, ws.HEAD_MIXED = old


def two_kernel_rows(B, T):
    """Design auto and the two-kernel folded form at one shape: [(name, us, notes)]."""
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device="cuda")
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], parents=parents.to("cuda"),
                  initial_state=inp["initial_state"], poison=False)
    rows = []
    for name, kw in (("auto", {}), ("fold (two kernels)", dict(design="fold"))):
        launch, _ = plan_wy(**common, mode="exact", **kw)
        ms, notes = timed(launch)
        rows.append((name, ms * 1e3, notes))
        print(f"# {B}x{T} {name}: {ms * 1e3:.1f} us ({notes})", flush=True)
    return rows


def head_rows(shapes, configs):
    """The head kernel's sweep, each configuration in its own process over every shape (one that faults takes no
    other down): {shape: (us, config, notes)}, the best at each shape."""
    best = {}
    spec = ",".join(f"{B}x{T}" for B, T in shapes)
    for c in configs:
        r = subprocess.run([sys.executable, __file__, "--one", json.dumps(c), "--shapes", spec],
                           capture_output=True, text=True)
        got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        for g in got:
            (B, T), (ms, notes, off) = g["shape"], g["result"]
            print(f"# {B}x{T} head {c}: {ms * 1e3:.1f} us ({notes}); max |o - auto's o| {off:.2e}", flush=True)
            if (B, T) not in best or ms * 1e3 < best[(B, T)][0]:
                best[(B, T)] = (ms * 1e3, c, notes)
        if r.returncode:
            print(f"# head {c}: failed after {len(got)} shapes (exit {r.returncode}: "
                  f"{(r.stderr.strip().splitlines() or ['?'])[-1][:100]})", flush=True)
    return best


def one(B, T, c):
    """One head configuration at one shape (run in a child process): its median ms, compile notes and the largest
    difference from design auto's output, one JSON line."""
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device="cuda")
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], parents=parents.to("cuda"),
                  initial_state=inp["initial_state"], poison=False)
    launch, ref = plan_wy(**common, mode="exact")
    launch()
    launch, o = head_plan(common, c)
    ms, notes = timed(launch)
    print(json.dumps({"shape": [B, T], "result": [ms, notes, (o.float() - ref.float()).abs().max().item()]}),
          flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x16,1x65,8x65,32x65")
    ap.add_argument("--caps", help="the default configuration and these register caps only (comma separated)")
    ap.add_argument("--variants", action="store_true",
                    help="the default configuration per head / per (head, V tile) / as design auto chooses, and "
                         "with HEAD_MIXED")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    try:
        caps = [int(x) for x in a.caps.split(",")] if a.caps else None
    except ValueError:
        ap.error(f"--caps {a.caps!r}: expected register counts, comma separated")
    configs = HEAD if caps is None else [dict(HEAD[0], maxnreg=cap) for cap in (None, *caps)]
    if a.variants:
        configs = [dict(HEAD[0], split_v=sv) for sv in (False, True, None)] + [dict(HEAD[0], split_v=None, mixed=True)]
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_head: needs a CUDA device")
    if a.one:
        for B, T in shapes:
            one(B, T, json.loads(a.one))
        raise SystemExit(0)
    print(cuda_header(a.commit))
    bw = copy_bandwidth("cuda")
    rows = {(B, T): two_kernel_rows(B, T) for B, T in shapes}
    best = head_rows(shapes, configs)
    print("| B x T | memory floor | form | us | configuration | registers |")
    print("|---|---|---|---|---|---|")
    for B, T in shapes:
        floor = kernel_bytes(B, T)["wy"] / bw * 1e6
        for name, us, notes in rows[(B, T)]:
            print(f"| {B}x{T} | {floor:.1f} | {name} | {us:.1f} | | {notes} |")
        if (B, T) in best:
            us, c, notes = best[(B, T)]
            print(f"| {B}x{T} | {floor:.1f} | head (one kernel), best | {us:.1f} | {c} | {notes} |", flush=True)
