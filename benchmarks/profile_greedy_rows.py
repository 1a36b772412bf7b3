"""Where a lock-step round's drafter work goes at full size on a GPU: the synthetic drafter's greedy
continuations (ddsim.sim.generate.greedy_rows: one decode pass per token for every row, replayed from a
CUDA graph) and its shadow prefills (prefill_requests: a batched serving verify and commit of short
chains), the parts the audit's timings name "drafter's greedy continuations" and "drafter's shadow
prefills". Qwen3.6-27B-shaped model, random bf16 weights, prompts of --context tokens.

    python benchmarks/profile_greedy_rows.py [--rows 32,64] [--depth 8] [--context 32] [--commit SHA]

Prints, per row count: the decoder's set-up (the rows' states copied into its buffers), each pass, the
tips copied out, the whole greedy_rows call; the shadow prefill of 3 tokens per row; and the torch
profiler's top operators of one greedy_rows call (host self time and device time)."""
import argparse
import datetime
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ddsim.errors import InputError
from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.sim.generate import GreedyRequest, PrefillRequest, greedy_rows, prefill_requests


def fail(msg: str):
    print(f"profile_greedy_rows: {msg}", file=sys.stderr)
    sys.exit(2)


def clock(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="32,64")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    try:
        rows = [int(r) for r in a.rows.split(",")]
        if not rows or min(rows) < 1 or a.depth < 1 or a.context < 2:
            raise ValueError
    except ValueError:
        fail(f"--rows {a.rows!r} --depth {a.depth} --context {a.context}: expected positive row counts, a depth "
             ">= 1 and a context >= 2")
    if not torch.cuda.is_available():
        fail("needs a CUDA device")
    print(f"# {datetime.date.today()} | {torch.cuda.get_device_name()} | torch {torch.__version__} | commit {a.commit}")
    cfg = get_preset("qwen3.6-27b")
    w = init_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    gm = GraphedModel(HybridModel(cfg, w, device="cuda", dtype=torch.bfloat16))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (a.context,), generator=g).tolist() for _ in range(max(rows))]
    states = [gm.prefill(p[:-1])[0] for p in prompts]
    print("| rows | decoder set-up ms | pass ms (median) | tips copied ms | greedy_rows ms | shadow prefill of 3 "
          "tokens ms |")
    print("|---|---|---|---|---|---|")
    for n in rows:
        reqs = [GreedyRequest(states[i], prompts[i][-1], a.depth) for i in range(n)]
        greedy_rows(gm, reqs)  # warm-up: the key's graph captured
        setup, dec = clock(lambda: gm.decoder([q.state for q in reqs], steps=a.depth))
        roots, passes = [q.root for q in reqs], []
        for _ in range(a.depth):
            ms, logits = clock(lambda: dec.step(roots))
            passes.append(ms)
            roots = logits.argmax(-1).tolist()
        tips, _ = clock(lambda: [dec.state(b) for b in range(n)])
        whole, _ = clock(lambda: greedy_rows(gm, reqs))
        pre = [PrefillRequest(states[i], prompts[i][:3]) for i in range(n)]
        prefill_requests(gm, pre)  # warm-up
        shadow, _ = clock(lambda: prefill_requests(gm, pre))
        print(f"| {n} | {setup:.1f} | {sorted(passes)[len(passes) // 2]:.1f} | {tips:.1f} | {whole:.1f} | {shadow:.1f} |",
              flush=True)
    n = rows[0]
    reqs = [GreedyRequest(states[i], prompts[i][-1], a.depth) for i in range(n)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        greedy_rows(gm, reqs)
        torch.cuda.synchronize()
    print(f"\n## one greedy_rows call, {n} rows x {a.depth} tokens: top operators by host self time")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    print("## the same call: top operators by device time")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        fail(str(e))
