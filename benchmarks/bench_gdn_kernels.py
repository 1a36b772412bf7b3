"""GDN tree-verify kernels on CUDA at Qwen3.6-27B GDN shapes (H=16, HV=48, K=V=128, bf16 inputs),
sequences x nodes in {1x16, 1x65, 8x65, 32x65}, DDTree trees (top-k 8, depth 15): median time per
call, achieved bandwidth and the memory floor of each design; then accuracy against the float64
oracle. Same as `ddsim bench --device cuda`.

    python benchmarks/bench_gdn_kernels.py [--commit SHA]
"""
import argparse

import torch

from ddsim.bench.bench import cuda_header, kernel_accuracy, kernel_table

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--only", default=None, help="comma-separated kernel names to time (default: all)")
    ap.add_argument("--precisions", default="ieee,tf32x3")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gdn_kernels: needs a CUDA device")
    print(cuda_header(a.commit))
    table, _ = kernel_table(only=a.only.split(",") if a.only else None, precisions=tuple(a.precisions.split(",")),
                            progress=lambda r: print(f"# {r['B']}x{r['T']} {r['kernel']}: {r['us']:.1f} us "
                                                     f"(floor {r['floor_us']:.1f}) {r['config']}", flush=True))
    print(table)
    print()
    print(kernel_accuracy())
