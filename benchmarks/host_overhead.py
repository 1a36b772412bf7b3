"""Host overhead of the public GDN tree functions on CUDA: wall time per call of
gdn_tree_verify / gdn_tree_commit through the public function with raw parents (validated and
tables rebuilt every call, as before TreePlan), with a TreePlan built once (what the model does:
one plan per tree, shared by every layer), and the kernel launch alone (plan_wy / plan_commit's
launch). Qwen3.6-27B GDN shapes (from the preset), bf16 inputs, DDTree trees (top-k 8, depth 15).

Each figure is the wall time of n back-to-back calls / n, synchronised at the end: the rate a
layer loop could sustain, i.e. max(host time, device time) per call.

    python benchmarks/host_overhead.py [--commit SHA] [--n 200]
"""
import argparse
import time

import torch

import ddsim.gpu_backend as gb
from ddsim.bench import ddtree_batch, kernel_inputs
from ddsim.gpu_backend.triton_commit import plan_commit
from ddsim.gpu_backend.triton_gdn import plan_wy


def per_call(fn, n):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--n", type=int, default=200)
    a = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.get_device_name()} | torch {torch.__version__} | commit {a.commit}")
    print("| sequences x nodes | verify: raw parents (us) | verify: TreePlan (us) | verify: kernel alone (us) | "
          "commit: raw parents (us) | commit: TreePlan (us) | commit: kernel alone (us) |")
    print("|---|---|---|---|---|---|---|")
    for B, T in ((1, 17), (1, 65), (8, 65), (32, 65)):
        _, parents = ddtree_batch(B, T)
        parents = parents.cuda()
        inp = kernel_inputs(B, T)
        qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        s0 = inp["initial_state"]
        plan = gb.TreePlan(parents)
        acc = torch.full((B,), T - 1, dtype=torch.long, device="cuda")
        raw_v = per_call(lambda: gb.gdn_tree_verify(**qkv, parents=parents, initial_state=s0), a.n)
        plan_v = per_call(lambda: gb.gdn_tree_verify(**qkv, parents=plan, initial_state=s0), a.n)
        launch, _ = plan_wy(**qkv, parents=plan, initial_state=s0, poison=False)
        kern_v = per_call(launch, a.n)
        cargs = (inp["k"], inp["v"], inp["g"], inp["beta"])
        raw_c = per_call(lambda: gb.gdn_tree_commit(*cargs, parents=parents, accepted=acc, initial_state=s0), a.n)
        plan_c = per_call(lambda: gb.gdn_tree_commit(*cargs, parents=plan, accepted=acc, initial_state=s0), a.n)
        launch_c, _ = plan_commit(*cargs, parents=plan, accepted=acc, initial_state=s0, poison=False)
        kern_c = per_call(launch_c, a.n)
        print(f"| {B} x {T} | {raw_v:.1f} | {plan_v:.1f} | {kern_v:.1f} | {raw_c:.1f} | {plan_c:.1f} | {kern_c:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
