"""KDA's two exact designs on CUDA at Kimi Linear's heads (H=32, K=V=128, bf16 inputs, fp32 states), the kernels
alone (plan_* then the launch timed, median us), over their launch settings: the WY form (block_v, num_warps,
block_d) and the parent-indexed recurrence (block_v, num_warps). DDTree trees, sequences x nodes in {1x17, 8x65,
32x65}.

    python benchmarks/bench_kda_designs.py [--commit SHA]
"""
import argparse
import itertools
import sys

import torch
import triton
import triton.testing

from ddsim import gpu_backend as gb
from ddsim.bench.bench import cuda_header, ddtree_batch
from ddsim.gpu_backend import triton_kda

SHAPES = ((1, 17), (8, 65), (32, 65))


def _us(launch) -> float:
    return triton.testing.do_bench(launch, warmup=5, rep=30, return_mode="median") * 1e3


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_kda_designs: needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    print(cuda_header(a.commit))
    g = torch.Generator(device="cuda").manual_seed(0)
    H, K = 32, 128
    print("| B x T | depth | design | block_v | warps | block_d | us |\n|---|---|---|---|---|---|---:|")
    for B, T in SHAPES:
        _, parents = ddtree_batch(B, T)
        plan = gb.TreePlan(parents.cuda())
        depth = plan.root_paths().shape[2]

        def r(*s):
            return torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16)
        q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, K)
        gg = -torch.rand(B, T, H, K, generator=g, device="cuda") * 0.1
        beta = torch.rand(B, T, H, generator=g, device="cuda")
        S0 = torch.randn(B, H, K, K, generator=g, device="cuda") * 0.1
        for bv, w in itertools.product((32, 64), (4, 8)):
            launch, _ = triton_kda.plan_recurrent(q, k, v, gg, beta, parents=plan, initial_state=S0, block_v=bv,
                                                  num_warps=w)
            print(f"| {B}x{T} | {depth} | recurrent | {bv} | {w} | - | {_us(launch):.1f} |", flush=True)
        for bv, w, bd in itertools.product((32, 64, 128), (4, 8), (8, 16)):
            launch, _ = triton_kda.plan_wy(q, k, v, gg, beta, parents=plan, initial_state=S0, block_v=bv, num_warps=w,
                                           block_d=bd)
            print(f"| {B}x{T} | {depth} | wy | {bv} | {w} | {bd} | {_us(launch):.1f} |", flush=True)
