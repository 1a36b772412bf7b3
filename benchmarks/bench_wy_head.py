"""The folded WY form in one program per head (design "head": the weights applied by the program that made them,
one launch, no scratch read back by a second grid) beside the two-kernel folded form (design "fold") and the
defaults of design "auto", kernels alone, at the shapes of issue #36; a sweep of the head kernel's V tile, warps,
pipelining stages, register cap and whether its weights go through global memory (L2) or stay in registers.

    python benchmarks/bench_wy_head.py [--commit SHA] [--shapes 1x16,1x65,8x65,32x65]
"""
import argparse

import torch

from ddsim.bench.bench import copy_bandwidth, cuda_header, ddtree_batch, kernel_bytes, kernel_inputs, parse_shapes
from ddsim.gpu_backend import triton_wy_split as ws
from ddsim.gpu_backend.triton_gdn import plan_wy

HEAD = [dict(block_v=bv, solve_warps=nw, stages=ns, scratch=scr, maxnreg=None)
        for scr in (False, True) for bv in (32, 64, 128) for nw in (4, 8) for ns in (1, 2)]


def timed(launch):
    from triton.testing import do_bench

    from ddsim.gpu_backend import launch as L
    before = set(L._COMPILED)
    ms = do_bench(launch, warmup=10, rep=50, return_mode="median")
    notes = [f"{getattr(L._COMPILED[k], 'n_regs', '?')} regs, {getattr(L._COMPILED[k], 'n_spills', '?')} spilled, "
             f"{getattr(L._COMPILED[k].metadata, 'shared', '?')} B shared" for k in set(L._COMPILED) - before]
    return ms, "; ".join(notes)


def head_plan(common, c):
    c = dict(c)
    old = ws.HEAD_SCRATCH, dict(ws.HEAD_OPTIONS), ws.MAXNREG
    ws.HEAD_SCRATCH = c.pop("scratch")
    ws.HEAD_OPTIONS.clear()
    ws.HEAD_OPTIONS["num_stages"] = c.pop("stages")
    cap = c.pop("maxnreg")
    ws.MAXNREG = (cap, None) if cap else None
    try:
        return plan_wy(**common, mode="exact", design="head", **c)
    finally:
        ws.HEAD_SCRATCH, ws.MAXNREG = old[0], old[2]
        ws.HEAD_OPTIONS.clear()
        ws.HEAD_OPTIONS.update(old[1])


def run_shape(B, T, bw):
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device="cuda")
    common = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], parents=parents.to("cuda"),
                  initial_state=inp["initial_state"], poison=False)
    floor = kernel_bytes(B, T)["wy"] / bw * 1e6
    ref = None
    rows = []
    for name, plan in (("auto", lambda: plan_wy(**common, mode="exact")),
                       ("fold (two kernels)", lambda: plan_wy(**common, mode="exact", design="fold"))):
        launch, o = plan()
        ms, notes = timed(launch)
        ref = o.clone() if name == "auto" else ref
        rows.append((name, ms * 1e3, "", notes))
        print(f"# {B}x{T} {name}: {ms * 1e3:.1f} us ({notes})", flush=True)
    best = None
    for c in HEAD:
        try:
            launch, o = head_plan(common, c)
            ms, notes = timed(launch)
        except Exception as e:  # out of resources: skipped, said so
            print(f"# {B}x{T} head {c}: skipped ({type(e).__name__}: {str(e)[:80]})", flush=True)
            continue
        off = (o.float() - ref.float()).abs().max().item()
        print(f"# {B}x{T} head {c}: {ms * 1e3:.1f} us ({notes}); max |o - auto's o| {off:.2e}", flush=True)
        if best is None or ms < best[0]:
            best = (ms, c, notes)
    if best:
        rows.append(("head (one kernel), best", best[0] * 1e3, best[1], best[2]))
    print(f"| {B}x{T} | memory floor {floor:.1f} us |")
    for name, us, c, notes in rows:
        print(f"| {B}x{T} | {name} | {us:.1f} | {c} | {notes} |", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x16,1x65,8x65,32x65")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_head: needs a CUDA device")
    print(cuda_header(a.commit))
    bw = copy_bandwidth("cuda")
    for B, T in shapes:
        run_shape(B, T, bw)
