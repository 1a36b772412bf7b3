"""The statistics a synthetic preset is documented by: typical exp(g) per GDN head (how long heads
remember) and the target's top-1 margins and probabilities (how close argmax flips are).

    python benchmarks/preset_stats.py [--preset tiny] [--seed 0] [--contexts 64]

Margins are measured at every position of one random-token context of --contexts tokens.
"""
import argparse

import numpy as np
import torch

from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--contexts", type=int, default=64)
    a = ap.parse_args()
    cfg = get_preset(a.preset)
    w = init_weights(cfg, seed=a.seed)
    decay = []
    for l in cfg.gdn_layers:
        A = torch.exp(w[f"layers.{l}.gdn.A_log"].double())
        decay.append(torch.exp(-A * torch.nn.functional.softplus(w[f"layers.{l}.gdn.dt_bias"].double())))
    d = torch.cat(decay).numpy()
    print(f"preset {cfg.name}, seed {a.seed}: typical exp(g) per GDN value head (gate input 0)")
    print("  quantiles 0/10/50/90/100%:", np.quantile(d, [0, 0.1, 0.5, 0.9, 1]).round(4).tolist())
    m = HybridModel(cfg, w)
    toks = np.random.default_rng(a.seed).integers(0, cfg.vocab_size, a.contexts).tolist()
    _, logits = m.prefill(toks)
    top2 = logits.topk(2, -1).values
    margin = (top2[:, 0] - top2[:, 1]).numpy()
    p1 = torch.softmax(logits, -1).max(-1).values.numpy()
    print("top-1 margin (nats) quantiles 10/50/90%:", np.quantile(margin, [0.1, 0.5, 0.9]).round(2).tolist())
    print("top-1 probability median:", round(float(np.median(p1)), 2))
