"""Audits larger than one GPU, and audits sharded over GPUs (issue: layer placement and torchrun).

Placement (one process, a model split across GPUs by ``--devices``):
    python benchmarks/audit_multi_gpu.py --preset qwen3-next-80b --devices cuda:0,cuda:1 --prompts 2 --steps 2
Data parallel (one model copy per rank, prompts sharded):
    torchrun --standalone --nproc-per-node 2 benchmarks/audit_multi_gpu.py --preset qwen3.6-27b --prompts 4
and the same without torchrun for the one-process time. Prints the wall time of the audit, the time
to build the weights and each GPU's peak memory (every rank's, gathered on rank 0), and where the
layers ran; ``--check-placement`` first compares a placed tiny model's verify and oracle with the
one-GPU model's (the same weights moved), node for node.

    [--budgets 16] [--prompt-len 32] [--commit SHA] [--out DIR]
"""
import argparse
import json
import os
import time

import torch


def check_placement(devices):
    """A tiny model on one GPU and the same weights placed over ``devices``: identical results."""
    from ddsim import oracle
    from ddsim.model.config import get_preset
    from ddsim.model.model import HybridModel
    from ddsim.model.placement import describe, parse_devices, place, plan_layers
    from ddsim.model.weights import init_weights
    from ddsim.trees.builders import ddtree
    cfg = get_preset("tiny")
    devs = parse_devices(devices)
    w = init_weights(cfg, seed=0, device=devs[0])
    placed = place(w, cfg, plan_layers(cfg, devs))
    # unlaid, as the placed model is (HybridModel.lay_projections): the same GEMMs, so the same bits
    one, split = HybridModel(cfg, w, device=devs[0], lay=False), HybridModel(cfg, placed)
    prompt = list(range(1, 20))
    s1, _ = one.prefill(prompt)
    s2, _ = split.prefill(prompt)
    tree = ddtree(torch.randn(8, cfg.vocab_size, generator=torch.Generator().manual_seed(0)) * 3.0, 32)
    out = {"placement": describe(cfg, split.layer_devices)}
    for mode in ("exact", "leaky"):
        a, b = one.verify(s1, tree, mode=mode), split.verify(s2, tree, mode=mode)
        out[f"fast {mode} max |logit diff|"] = (a.logits - b.logits.to(a.logits.device)).abs().max().item()
    o1 = oracle.verify_tree(w, cfg, s1, tree.parents, tree.tokens)
    o2 = oracle.verify_tree(placed, cfg, s2, tree.parents, tree.tokens)
    out["oracle max |logit diff|"] = (o1.logits - o2.logits.to(o1.logits.device)).abs().max().item()
    out["layer 0 / last state devices"] = [str(s2.ssm[cfg.recurrent_layers[0]].device),
                                           str(s2.ssm[cfg.recurrent_layers[-1]].device)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.6-27b")
    ap.add_argument("--devices", default=None)
    ap.add_argument("--budgets", default="16")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--out", default=None)
    ap.add_argument("--check-placement", default=None, metavar="DEVICES")
    a = ap.parse_args()
    from ddsim.measure.audit import run_audit
    from ddsim.measure.distributed import Shard
    from ddsim.measure.settings import AuditConfig
    from ddsim.sim import memory
    shard = Shard.from_env("cuda")
    if shard.is_main:
        print(f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.device_count()} x {torch.cuda.get_device_name()} | "
              f"torch {torch.__version__} | commit {a.commit} | ranks {shard.world}", flush=True)
    if a.check_placement and shard.is_main:
        print("placement check:", json.dumps(check_placement(a.check_placement)), flush=True)
        torch.cuda.empty_cache()
    for i in range(torch.cuda.device_count()):
        memory.reset_peak(i)
    ac = AuditConfig(preset=a.preset, device="cuda", devices=a.devices,
                     budgets=[int(b) for b in a.budgets.split(",")], steps=a.steps, n_prompts=a.prompts,
                     prompt_len=a.prompt_len)
    t0 = time.perf_counter()
    rep = run_audit(ac, shard=shard)
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    wall = time.perf_counter() - t0
    mine = {"rank": shard.rank, "wall_s": wall,
            "peak_GiB": {f"cuda:{i}": memory.peak_allocated(i) / 2**30 for i in range(torch.cuda.device_count())
                         if memory.peak_allocated(i) > 0}}
    ranks = [mine]
    if shard.distributed:
        import torch.distributed as dist
        ranks = [None] * shard.world if shard.is_main else None
        dist.gather_object(mine, ranks, dst=0)
    if shard.is_main:
        for r in ranks:
            print(f"rank {r['rank']}: audit {r['wall_s']:.1f} s; peak memory "
                  + ", ".join(f"{d} {g:.1f} GiB" for d, g in r["peak_GiB"].items()), flush=True)
        print(f"audit of {a.prompts} prompts x {a.steps} steps, budgets {a.budgets}, preset {a.preset}, "
              f"{'devices ' + a.devices if a.devices else str(shard.world) + ' rank(s)'}: "
              f"{max(r['wall_s'] for r in ranks):.1f} s", flush=True)
        for b in rep.budgets:
            lk, md = b.leak, b.modes
            print(f"budget {b.budget}: leak nodes {lk['leaky'].not_order_exact_nodes}; leaky state rel err (other) "
                  f"median {lk['leaky'].state_rel.other.median:.3g}, KL (other) median {lk['leaky'].kl.other.median:.3g}; "
                  "tokens/step " + ", ".join(f"{m} {md[m].tokens_per_step:.2f}" for m in md)
                  + "; generations leaving greedy " + ", ".join(f"{m} {md[m].generations_leaving_greedy}" for m in md),
                  flush=True)
        if a.out:
            from pathlib import Path

            from ddsim.reports import html, json_report
            rep = json_report.stamp(rep)
            json_report.write_report(rep, html.render(rep), Path(a.out))
    shard.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    main()
