"""Host overhead of the public GDN tree functions on CUDA: wall time per call of
gdn_tree_verify / gdn_tree_commit through the public function with raw parents (validated and
tables rebuilt every call, as before TreePlan), with a TreePlan built once (what the model does:
one plan per tree, shared by every layer; after the first call of a signature the call is replayed
in C++, gpu_backend.fastcall), the same through the Python path (a plan that keeps no recipe:
fastcall.python_path), and the kernel launch alone (plan_wy / plan_commit's
launch), both as ddsim launches (gpu_backend.launch: the compiled kernel called directly) and through
Triton's per-call dispatch (kernel[grid](...)); the commit with raw accepted indices (validated with
a sync per call) and with checked ones (validated once per step, as the model passes them).
Qwen3.6-27B GDN shapes (from the preset), bf16 inputs, DDTree trees (top-k 8, depth 15).

Where SGLang's GDN kernel module is importable (the .engines folder `make test` fills: SGLang
0.5.23's module with the test fixture's shims, so no PDL), its public function is timed side by side
in its target-verify call (fused gates, [HV, V, K] pool, retrieve_parent_token, per-node intermediate
states, disable_state_update), with its inputs prepared once, as a serving stack holds them.

Each figure is the wall time of n back-to-back calls / n, synchronised at the end: the rate a
layer loop could sustain, i.e. max(host time, device time) per call.

    python benchmarks/host_overhead.py [--commit SHA] [--n 200]
"""
import argparse
import time

import torch

import ddsim.gpu_backend as gb
from ddsim.bench.bench import cuda_header, ddtree_batch, kernel_inputs
from ddsim.gpu_backend import fastcall
from ddsim.gpu_backend import launch as launches
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
    print(cuda_header(a.commit))
    try:
        from ddsim.engines.sglang import _kernel
        sglang_fn = _kernel()[0]
    except ValueError:
        sglang_fn = None
    fastcall.ext()
    print(f"# fastcall: {fastcall.status()}")
    print("| sequences x nodes | verify: raw parents (us) | verify: TreePlan (us) | verify: TreePlan, Python path (us) | "
          "verify: kernel alone (us) | verify: kernel alone, Triton dispatch (us) | verify: TreePlan, Triton dispatch (us) | "
          "commit: raw parents (us) | commit: TreePlan (us) | commit: TreePlan, checked accepted (us) | "
          "commit: checked accepted, Python path (us) | commit: kernel alone (us) | SGLang target verify (us) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
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
        with fastcall.python_path():
            py_plan = gb.TreePlan(parents)
            py_v = per_call(lambda: gb.gdn_tree_verify(**qkv, parents=py_plan, initial_state=s0), a.n)
        launch, _ = plan_wy(**qkv, parents=plan, initial_state=s0, poison=False)
        kern_v = per_call(launch, a.n)
        launches.DIRECT = False
        launch, _ = plan_wy(**qkv, parents=plan, initial_state=s0, poison=False)
        kern_v_triton = per_call(launch, a.n)
        plan_v_triton = per_call(lambda: gb.gdn_tree_verify(**qkv, parents=plan, initial_state=s0), a.n)
        launches.DIRECT = True
        cargs = (inp["k"], inp["v"], inp["g"], inp["beta"])
        raw_c = per_call(lambda: gb.gdn_tree_commit(*cargs, parents=parents, accepted=acc, initial_state=s0), a.n)
        plan_c = per_call(lambda: gb.gdn_tree_commit(*cargs, parents=plan, accepted=acc, initial_state=s0), a.n)
        cacc = gb.checked_accepted(acc, B, T, "cuda")
        checked_c = per_call(lambda: gb.gdn_tree_commit(*cargs, parents=plan, accepted=cacc, initial_state=s0), a.n)
        with fastcall.python_path():
            py_c = per_call(lambda: gb.gdn_tree_commit(*cargs, parents=py_plan, accepted=cacc, initial_state=s0), a.n)
        launch_c, _ = plan_commit(*cargs, parents=plan, accepted=acc, initial_state=s0, poison=False)
        kern_c = per_call(launch_c, a.n)
        sgl = "–"
        if sglang_fn is not None:
            HV, V, K = inp["v"].shape[2], inp["v"].shape[3], inp["q"].shape[3]
            neg_g = (-inp["g"].float()).clamp_min(1e-30)
            ga = torch.log(torch.expm1(neg_g)).contiguous()
            gb_ = torch.logit(inp["beta"].float().clamp(1e-7, 1 - 1e-7)).contiguous()
            zeros = torch.zeros(HV, device="cuda")
            pool = s0.transpose(-1, -2).contiguous()
            slots = torch.arange(B, dtype=torch.int32, device="cuda")
            buf = torch.empty(B, T, HV, V, K, device="cuda")
            rp = parents.to(torch.int32).contiguous()
            sgl = f"{per_call(lambda: sglang_fn(zeros, ga, zeros, 1.0, 20.0, inp['q'], inp['k'], inp['v'], gb_, pool, slots, use_qk_l2norm_in_kernel=True, disable_state_update=True, intermediate_states_buffer=buf, intermediate_state_indices=slots, cache_steps=T, retrieve_parent_token=rp), a.n):.1f}"  # noqa: E501
        print(f"| {B} x {T} | {raw_v:.1f} | {plan_v:.1f} | {py_v:.1f} | {kern_v:.1f} | {kern_v_triton:.1f} | "
              f"{plan_v_triton:.1f} | {raw_c:.1f} | {plan_c:.1f} | {checked_c:.1f} | {py_c:.1f} | {kern_c:.1f} | {sgl} |",
              flush=True)
    print(f"# fastcall: {fastcall.stats()}")


if __name__ == "__main__":
    main()
