"""Where the batched oracle's time goes at full size: ``oracle.verify_trees`` of a batch of DDTree trees
(each from its own committed state, as the audit's lock step hands it a round) through the
Qwen3.6-27B-shaped model (random bf16 weights, fp32 oracle) under torch.profiler: wall seconds per
batch, host-side operators by self CPU time, GPU kernels by GPU time, and how many of each there are.

    python benchmarks/profile_oracle.py [--batches 64x3,16x16] [--products bf16,float32] [--accuracy 16]
                                        [--top 20] [--commit SHA]

``--batches BxN``: budget B, N trees per batch (the audit's batch sizes on an H200: 3 trees at budget
64, about 16 at budget 16). ``--products``: the oracle's products by the bf16 weights, each timed: "bf16"
(the weights left in bf16, x split in three bf16 parts: the default on a GPU) and "float32" (each
weight converted, cuBLAS's float32 products). ``--accuracy B``: first, one tree of budget B through
the float64 oracle, and each products' relative error against it (logits, hidden states, recurrent
states; Frobenius).
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ddsim import oracle
from ddsim.bench.bench import cuda_header
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="64x3,16x16")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--products", default="bf16,float32")
    ap.add_argument("--accuracy", type=int, default=0)
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    cfg = get_preset("qwen3.6-27b")
    print(cuda_header(a.commit), flush=True)
    w = init_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    model = HybridModel(cfg, w, device="cuda", dtype=torch.bfloat16)

    def trees(budget, n):
        items = []
        for j in range(n):
            prompt = torch.randint(0, cfg.vocab_size, (32,), generator=torch.Generator().manual_seed(j)).tolist()
            state, _ = model.prefill(prompt[:-1])
            tree = ddtree(torch.randn(8, cfg.vocab_size, generator=torch.Generator().manual_seed(budget + j)) * 3.0,
                          budget, root_token=prompt[-1])
            items.append((state, tree.parents, tree.tokens))
        return items
    if a.accuracy:
        items = trees(a.accuracy, 1)
        ref = oracle.verify_trees(w, cfg, items, dtype=torch.float64)[0]
        print(f"\n## accuracy: one tree of budget {a.accuracy}, relative to the float64 oracle")
        print("| products | logits | hidden states | recurrent states (worst layer) |")
        print("|---|---|---|---|")
        for products in a.products.split(","):
            got = oracle.verify_trees(w, cfg, items, bf16_products=products == "bf16")[0]
            rel = lambda g, r: ((g.double() - r).norm() / r.norm()).item()  # noqa: E731
            worst = max(rel(got.ssm[i], ref.ssm[i]) for i in cfg.recurrent_layers)
            print(f"| {products} | {rel(got.logits, ref.logits):.2e} | {rel(got.hidden, ref.hidden):.2e} | {worst:.2e} |",
                  flush=True)
            got = None
        ref = items = None
        torch.cuda.empty_cache()
    for spec, products in ((s, p) for s in a.batches.split(",") for p in a.products.split(",")):
        budget, n = (int(x) for x in spec.split("x"))
        items = trees(budget, n)
        run = lambda: oracle.verify_trees(w, cfg, items, bf16_products=products == "bf16")  # noqa: E731
        run()  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        ev = prof.key_averages()
        gkey = "self_device_time_total" if hasattr(ev[0], "self_device_time_total") else "self_cuda_time_total"
        gpu = [e for e in ev if getattr(e, gkey) > 0]
        gpu_total = sum(getattr(e, gkey) for e in gpu)
        cpu_total = sum(e.self_cpu_time_total for e in ev)
        print(f"\n## budget {budget}, {n} trees of {len(items[0][1])} nodes, {products} products: {wall:.3f} s per "
              f"batch unprofiled; "
              f"GPU busy {gpu_total / 1e6:.3f} s in {sum(e.count for e in gpu)} kernels; host operators "
              f"{cpu_total / 1e6:.3f} s self time in {sum(e.count for e in ev)} calls", flush=True)
        print("| host operator | calls | self CPU ms | GPU ms |")
        print("|---|---|---|---|")
        for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:a.top]:
            print(f"| {e.key[:70]} | {e.count} | {e.self_cpu_time_total / 1e3:.1f} | {getattr(e, gkey) / 1e3:.1f} |")
        print("| GPU kernel | calls | GPU ms |")
        print("|---|---|---|")
        for e in sorted(gpu, key=lambda e: -getattr(e, gkey))[:a.top]:
            print(f"| {e.key[:90]} | {e.count} | {getattr(e, gkey) / 1e3:.1f} |", flush=True)
        items = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
