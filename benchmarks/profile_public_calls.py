"""Where the host time of the public GDN functions goes on the machine that runs them: cProfile over
n back-to-back calls of ``gdn_tree_verify`` (with a TreePlan, as the model calls it) and of
``gdn_tree_commit`` (a TreePlan and checked accepted indices) at one sequence of 17 nodes, Qwen3.6-27B
GDN shapes, bf16 inputs; the top functions by own time. benchmarks/host_overhead.py times the same
calls beside the kernel alone and SGLang's public function.

    python benchmarks/profile_public_calls.py [--n 2000] [--top 25] [--commit SHA]
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

import ddsim.gpu_backend as gb
from ddsim.bench.bench import cuda_header, ddtree_batch, kernel_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    print(cuda_header(a.commit))
    B, T = 1, 17
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T)
    qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    s0 = inp["initial_state"]
    plan = gb.TreePlan(parents.cuda())
    acc = gb.checked_accepted(torch.full((B,), T - 1, dtype=torch.long, device="cuda"), B, T, "cuda")
    calls = {"verify": lambda: gb.gdn_tree_verify(**qkv, parents=plan, initial_state=s0),
             "commit": lambda: gb.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], parents=plan,
                                                  accepted=acc, initial_state=s0)}
    for name, fn in calls.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(a.n):
            fn()
        torch.cuda.synchronize()
        print(f"\n## {name}: {(time.perf_counter() - t) / a.n * 1e6:.1f} us per call ({B} x {T}), unprofiled")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.n):
            fn()
        torch.cuda.synchronize()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
