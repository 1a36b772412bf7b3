"""Trees per second per verify mode (and the oracle) for a preset on the CPU, at budgets 16/32/64.

    python benchmarks/bench_cpu_modes.py [--preset tiny] [--repeats 5]

Prints a table; paste it into benchmarks/RESULTS.md with date, machine and commit.
"""
from __future__ import annotations

import argparse
import platform
import subprocess
import time

import numpy as np
import torch

import oracle
from ddsim.builders import ddtree
from ddsim.config import get_preset
from ddsim.model import VERIFY_MODES, HybridModel
from ddsim.weights import init_weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefix", type=int, default=64)
    args = ap.parse_args()
    cfg = get_preset(args.preset)
    w = init_weights(cfg, seed=0)
    m = HybridModel(cfg, w)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, args.prefix).tolist()
    state, _ = m.prefill(prompt)
    ostate, _ = oracle.prefill(w, cfg, prompt)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d')} | {platform.processor() or platform.machine()} | "
          f"torch {torch.__version__} | threads {torch.get_num_threads()} | commit {commit} | preset {cfg.name}")
    print("| budget | nodes | " + " | ".join(VERIFY_MODES) + " | oracle |")
    print("|---|---|" + "---|" * (len(VERIFY_MODES) + 1))
    for budget in (16, 32, 64):
        tree = ddtree(torch.randn(8, cfg.vocab_size, generator=torch.Generator().manual_seed(budget)) * 3, budget)
        cells = []
        for mode in VERIFY_MODES:
            m.verify(state, tree, mode=mode)  # warm-up
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                m.verify(state, tree, mode=mode)
            cells.append(args.repeats / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        oracle.verify_tree(w, cfg, ostate, tree.parents, tree.tokens)
        cells.append(1.0 / (time.perf_counter() - t0))
        print(f"| {budget} | {tree.size} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    print("(trees per second)")


if __name__ == "__main__":
    main()
