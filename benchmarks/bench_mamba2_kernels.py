"""Mamba2 tree kernels on CUDA at Nemotron-H-8B (H=128, P=64, N=128, G=8) and Falcon-H1-7B (H=24,
P=128, N=256, G=1) SSM shapes, bf16 inputs: median time per call of the flattened (leaky),
parent-indexed (exact, per-node snapshots) and tree-masked SSD (exact, no per-node states) kernels
and the commit, against each design's memory floor; sequences x nodes in {1x16, 1x65, 8x65, 32x65,
1x129, 8x129}, DDTree trees; beside them SGLang's selective_state_update, its tree path (retrieve_parent_token,
per-node states) and its flattened path, where its kernel module is on the path (PYTHONPATH=.engines, as
`make setup` fetches it), each first checked against ddsim's output. Then accuracy against the float64 oracle.

    PYTHONPATH=.engines python benchmarks/bench_mamba2_kernels.py [--commit SHA] [--presets nemotron-h-8b,falcon-h1-7b]
"""
import argparse

import torch

from ddsim.bench.bench import cuda_header
from ddsim.bench.bench_mamba2 import mamba2_kernel_accuracy, mamba2_kernel_table

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--presets", default="nemotron-h-8b,falcon-h1-7b")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_mamba2_kernels: needs a CUDA device")
    print(cuda_header(a.commit))
    print(mamba2_kernel_accuracy(), flush=True)
    for preset in a.presets.split(","):
        table, _ = mamba2_kernel_table(preset=preset, progress=lambda r: print(
            f"# {r['B']}x{r['T']} {r['kernel']}: {r['us']:.1f} us (floor {r['floor_us']:.1f}) {r['config']}", flush=True))
        print(table, flush=True)
