"""Verify-throughput benchmark of the pure-torch fast path and the oracle (trees per second)."""
from __future__ import annotations

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


def mode_table(*, preset: str = "tiny", repeats: int = 5, prefix: int = 64, device: str = "cpu",
               budgets=(16, 32, 64)) -> str:
    cfg = get_preset(preset)
    w = init_weights(cfg, seed=0)
    m = HybridModel(cfg, w, device=device)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, prefix).tolist()
    state, _ = m.prefill(prompt)
    ostate, _ = oracle.prefill(w, cfg, prompt)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# {time.strftime('%Y-%m-%d')} | {platform.machine()} | device {device} | torch {torch.__version__} | "
             f"threads {torch.get_num_threads()} | commit {commit or '?'} | preset {cfg.name}",
             "| budget | nodes | " + " | ".join(VERIFY_MODES) + " | oracle |",
             "|---|---|" + "---|" * (len(VERIFY_MODES) + 1)]
    for budget in budgets:
        gen = torch.Generator().manual_seed(budget)
        tree = ddtree(torch.randn(8, cfg.vocab_size, generator=gen) * 3, budget)
        cells = []
        for mode in VERIFY_MODES:
            m.verify(state, tree, mode=mode)  # warm-up
            if m.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(repeats):
                m.verify(state, tree, mode=mode)
            if m.device.type == "cuda":
                torch.cuda.synchronize()
            cells.append(repeats / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        oracle.verify_tree(w, cfg, ostate, tree.parents, tree.tokens)
        cells.append(1.0 / (time.perf_counter() - t0))
        lines.append(f"| {budget} | {tree.size} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    lines.append("(trees per second)")
    return "\n".join(lines)
