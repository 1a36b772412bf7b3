"""Reproduces the chunked WY form's failure with bf16x3 products (triton_wy_blocked.CHUNKED_REFUSES): one
verify of bf16 inputs at B = 2, T = 131 (H = 2, HV = 4, K = V = 128, a DDTree tree) through the chunked
kernel at the given dot precision, synchronised, and its error against the float64 oracle. On the H200
(Triton 3.6, 20ea267): tf32x3 1.65e-3, the oracle rounded to bf16; bf16x3 8.46e-2, compute-sanitizer
clean (in a pytest process the same call faulted with an illegal memory access). Run each precision in
its own process: a fault poisons the CUDA context.

    python benchmarks/repro_chunked_bf16x3.py --precision bf16x3   (or tf32x3)
"""
import argparse

import torch

from ddsim import oracle
from ddsim.bench.bench import ddtree_batch, kernel_inputs
from ddsim.gpu_backend import triton_wy_blocked
from ddsim.gpu_backend.triton_wy_blocked import plan_wy_blocked
from ddsim.measure.compare import rel_error

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", choices=("tf32x3", "bf16x3"), required=True)
    ap.add_argument("--T", type=int, default=131)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("repro_chunked_bf16x3: needs a CUDA device")
    triton_wy_blocked.CHUNKED_REFUSES = ()
    _, parents = ddtree_batch(2, a.T, seed=1)
    inp = kernel_inputs(2, a.T, H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device="cuda", seed=1)
    qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    launch, o = plan_wy_blocked(**qkv, parents=parents.cuda(), initial_state=inp["initial_state"], design="chunked",
                                precision=a.precision)
    launch()
    torch.cuda.synchronize()
    ref = oracle.gdn_tree_verify(**{k: x.cpu() for k, x in qkv.items()}, parents=parents,
                                 initial_state=inp["initial_state"].cpu(), mode="exact")
    print(f"chunked, {a.precision}, T = {a.T}: ran; relative error vs oracle {rel_error(o.cpu(), ref):.2e} "
          f"(the oracle rounded to bf16: {rel_error(ref.to(torch.bfloat16), ref):.2e})")
