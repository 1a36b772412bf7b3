"""Where a serving verify's GPU time goes at full size: the eager serving verify (no per-node states)
of one DDTree tree through the Qwen3.6-27B-shaped model (random bf16 weights) under torch.profiler,
kernels grouped by name, beside the time of the CUDA-graph replay of the same tree (ddsim.model.graphs).

    python benchmarks/profile_verify.py [--budget 64] [--top 30] [--commit SHA]
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--preset", default="qwen3.6-27b")
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    cfg = get_preset(a.preset)
    print(f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.get_device_name()} | torch {torch.__version__} | "
          f"commit {a.commit} | {cfg.name} budget {a.budget}", flush=True)
    model = HybridModel(cfg, init_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda"), device="cuda",
                        dtype=torch.bfloat16)
    weight_bytes = sum(v.numel() * v.element_size() for v in model.w.values())
    prompt = torch.randint(0, cfg.vocab_size, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    state, _ = model.prefill(prompt[:-1])
    tree = ddtree(torch.randn(8, cfg.vocab_size, generator=torch.Generator().manual_seed(a.budget)) * 3.0, a.budget,
                  root_token=prompt[-1])
    for _ in range(2):
        model.verify(state, tree, keep_states=False)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.verify(state, tree, keep_states=False)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0)]
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    total = sum(getattr(e, key) for e in events)
    count = sum(e.count for e in events)
    print(f"weights {weight_bytes / 2**30:.1f} GiB; eager serving verify of {tree.size} nodes: {count} GPU ops, "
          f"{total / 1e3:.2f} ms of GPU time")
    print("| kernel | calls | GPU ms | share |")
    print("|---|---|---|---|")
    for e in sorted(events, key=lambda e: -getattr(e, key))[:a.top]:
        print(f"| {e.key[:90]} | {e.count} | {getattr(e, key) / 1e3:.3f} | {getattr(e, key) / total:.1%} |")
    graphed = GraphedModel(model)
    graphed.verify(state, tree)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        graphed.verify(state, tree)
    torch.cuda.synchronize()
    print(f"CUDA-graph replay: {(time.perf_counter() - t) / 10 * 1e3:.2f} ms per verify (host copies included)")


if __name__ == "__main__":
    main()
