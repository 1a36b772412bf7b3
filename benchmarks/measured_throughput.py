"""Measured throughput of the seed's scenario: the audit of a Qwen3.6-27B-shaped model (random bf16 weights) at
DDTree budgets 15 and 64 with top-k cap 8, on one GPU, each mode's decoding step timed as the serving model runs
it (ddsim.measure.step_timing). Prints, per tree and mode, tokens per step (good and corrupted apart), the
measured step and tokens per second, and writes the report.

    python benchmarks/measured_throughput.py --commit SHA [--out DIR] [--prompts 3] [--steps 8] [--slabs on|off]

--slabs: a step's state copies grouped into slabs of like layers (ddsim.model.slabs.GROUPED) or layer by layer;
without it, the module's default.
"""
import argparse
import json
import time
from pathlib import Path

from ddsim.bench.bench import cuda_header
from ddsim.measure.audit import run_audit
from ddsim.measure.settings import AuditConfig
from ddsim.model import slabs
from ddsim.reports.json_report import dumps, stamp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--preset", default="qwen3.6-27b")
    ap.add_argument("--budgets", default="15,64")
    ap.add_argument("--topk-cap", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="measured-throughput")
    ap.add_argument("--slabs", choices=("on", "off"), default=None)
    a = ap.parse_args()
    if a.slabs is not None:
        slabs.GROUPED = a.slabs == 'on'
    budgets = [int(b) for b in a.budgets.split(",")]
    print(cuda_header(a.commit) + f" | {a.preset}, budgets {budgets}, top-k cap {a.topk_cap}, {a.prompts} prompts x {a.steps} steps | "
          f"state copies {'in slabs' if slabs.GROUPED else 'layer by layer'}",
          flush=True)
    ac = AuditConfig.build(preset=a.preset, budgets=budgets, topk_cap=a.topk_cap, n_prompts=a.prompts, steps=a.steps,
                           device="cuda", measure_steps="on")
    t0 = time.perf_counter()
    rep = run_audit(ac)
    print(f"audit {time.perf_counter() - t0:.0f} s", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(dumps(stamp(rep)))
    summary = {("chain", "exact"): rep.chain}
    summary.update({(f"ddtree-{b.budget}", m): b.modes[m] for b in rep.budgets for m in b.modes})
    print("| tree | mode | nodes | tokens/step | of which corrupted | verify ms | commit ms | step ms | tokens/s | "
          "vs autoregressive |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rep.measured_steps.rows:
        s = summary.get((r.label, r.mode))
        bad = "-" if s is None else f"{s.corrupted_tokens_per_step:.2f}"
        print(f"| {r.label} | {r.mode} | {r.nodes} | {r.tokens_per_step:.2f} | {bad} | {r.verify_ms:.2f} | "
              f"{r.commit_ms:.2f} | {r.step_ms:.2f} | {r.tokens_per_s:.1f} | {r.speedup_vs_ar:.2f} |", flush=True)
    (out / "measured.json").write_text(json.dumps([r.model_dump() for r in rep.measured_steps.rows], indent=1))


if __name__ == "__main__":
    main()
