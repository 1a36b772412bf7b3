"""The GDN WY kernel past one block (budgets 128 and 256: 129 and 257 nodes, chunked form) on CUDA at
Qwen3.6-27B GDN shapes: kernel launches alone against the flattened and parent-indexed recurrent
kernels and the memory floor (ddsim.bench.kernel_table), then accuracy against the float64 oracle.

    python benchmarks/bench_wy_blocked.py [--commit SHA]
"""
import argparse
import time

import torch
import triton

from ddsim.bench import kernel_accuracy, kernel_table

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.get_device_name()} | torch {torch.__version__} | "
          f"triton {triton.__version__} | commit {a.commit}", flush=True)
    print(kernel_accuracy(T=129), flush=True)
    print(kernel_accuracy(B=1, T=257), flush=True)
    table, _ = kernel_table(shapes=((1, 129), (8, 129), (1, 257)), precisions=("tf32x3",),
                            only=["leaky", "exact parent-indexed", "exact wy", "commit"],
                            progress=lambda r: print(f"# {r['B']}x{r['T']} {r['kernel']}: {r['us']:.1f} us", flush=True))
    print(table, flush=True)
