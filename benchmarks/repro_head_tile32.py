"""The head kernel with 32-wide V tiles (triton_wy_split.HEAD_BLOCK_V = 32; the default is 64, and design head refuses
block_v) at 8 x 65, Qwen3.6-27B GDN shapes, bf16: launched once, then design auto's output beside it. Under Triton 3.6
on the H200 it fails with an illegal memory access; run under compute-sanitizer to see where:

    compute-sanitizer --tool memcheck --print-limit 4 python benchmarks/repro_head_tile32.py [--block-v 32]

(RESULTS.md: an out-of-bounds __shared__ read by the product Ve V, _dot_exact_rhs; shared memory is laid out by the
compiler, not addressed by the kernel.)
"""
import argparse

import torch

from ddsim.bench.bench import ddtree_batch, kernel_inputs
from ddsim.gpu_backend import triton_wy_split as ws
from ddsim.gpu_backend.triton_gdn import plan_wy

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-v", type=int, default=32, choices=[16, 32, 64, 128])
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("repro_head_tile32: needs a CUDA device")
    ws.HEAD_BLOCK_V = a.block_v
    _, parents = ddtree_batch(8, 65)
    inp = kernel_inputs(8, 65, device="cuda")
    common = dict(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents.cuda(),
                  initial_state=inp["initial_state"], poison=False, mode="exact")
    launch, o = plan_wy(**common, design="head")
    launch()
    torch.cuda.synchronize()
    ws.HEAD_BLOCK_V = 64
    ref_launch, ref = plan_wy(**common)
    ref_launch()
    torch.cuda.synchronize()
    print(f"head, {a.block_v}-wide tiles: max |o - auto's o| {(o.float() - ref.float()).abs().max().item():.3e}")
