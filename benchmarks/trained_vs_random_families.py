"""Each family's leak on trained weights beside the same model with random weights: the default audit (the
synthetic drafter, the standard-library code prompts of ddsim/models/prompts-stdlib.jsonl) of the models
train_family_hybrids.py wrote, trained/ and random/ per family, in one run on one device. Per model: the reference's
decision margins, the leaky path's KL and argmax flips off order-exact nodes, its state and window errors for the
family's layers by depth, accept-decision flips, tokens per step (chain / exact / leaky, and leaky's corrupted
share), generations leaving greedy.

    python benchmarks/trained_vs_random_families.py --models .trained [--families lightning,conv] [--device cpu]
        [--budget 16,64] [--steps 8] [--commit SHA]
"""
import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from ddsim.measure.audit import run_audit
from ddsim.measure.settings import AuditConfig
from ddsim.reports.json_report import dumps, stamp

PROMPTS = Path(__file__).resolve().parents[1] / "ddsim" / "models" / "prompts-stdlib.jsonl"


def _med(s):
    return s["median"] if s and s.get("median") is not None else float("nan")


def _fmt(x) -> str:
    return "-" if x != x else f"{x:.3g}"  # NaN: the family has no such table (lightning has no conv window)


def summarize(rep: dict, family: str) -> dict:
    big = rep["budgets"][-1]
    leaky = big["leak"]["leaky"]
    fam = next(f for f in leaky["by_family"] if f["family"] == family)
    margins = [m for p in rep["prompts"] for m in p["reference_margins"]]
    ex, lk = big["modes"]["exact"], big["modes"]["leaky"]
    return {
        "reference decision margin median (nats)": f"{statistics.median(margins):.3g}",
        "noise margin (nats)": f"{rep['noise_margin']:.3g}",
        f"leaky KL off order-exact, median (budget {big['budget']})": f"{_med(leaky['kl']['other']):.3g}",
        "leaky argmax flips off order-exact": f"{leaky['argmax_flip_rate']['other']:.3g}",
        f"leaky {family} state / window error, median": f"{_fmt(_med(fam['state_rel']))} / {_fmt(_med(fam['conv_rel']))}",
        "leaky state error by depth 1 / 2 / 3, median": " / ".join(_fmt(_med(d["state_rel"])) for d in leaky["by_depth"][1:4]),
        "leaky decision flip rate": f"{lk['decision_flip_rate']:.3g}",
        "tokens/step chain / exact / leaky (corrupted)": f"{rep['chain']['tokens_per_step']:.2f} / "
                                                        f"{ex['tokens_per_step']:.2f} / {lk['tokens_per_step']:.2f} "
                                                        f"({lk['corrupted_tokens_per_step']:.2f})",
        "generations leaving greedy above the noise, exact / leaky": f"{ex['generations_leaving_greedy_above_noise']} / "
                                                                     f"{lk['generations_leaving_greedy_above_noise']} of "
                                                                     f"{ex['generations']}",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--families", default="lightning,conv")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", default="16,64")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    families = a.families.split(",")
    missing = [str(a.models / f / w) for f in families for w in ("trained", "random") if not (a.models / f / w).is_dir()]
    log = json.loads((a.models / "train-log.json").read_text()) if (a.models / "train-log.json").is_file() else {}
    missing += [f"{a.models / 'train-log.json'} (family {f})" for f in families if f not in log]
    if missing:
        print(f"trained_vs_random_families: --models: no checkpoint or training record at {', '.join(missing)} "
              "(run train_family_hybrids.py first)", file=sys.stderr)
        sys.exit(2)
    budgets = [int(x) for x in a.budget.split(",")]
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"# {time.strftime('%Y-%m-%d')} | {dev} | torch {torch.__version__} | commit {a.commit} | budgets {budgets}, "
          f"{a.steps} steps, synthetic drafter, prompts {PROMPTS.name}")
    for f in families:
        cols = {}
        for which in ("trained", "random"):
            ac = AuditConfig.build(model_path=str(a.models / f / which), prompts_file=str(PROMPTS), device=a.device,
                                   budgets=budgets, steps=a.steps)
            t = time.perf_counter()
            rep = json.loads(dumps(stamp(run_audit(ac))))
            cols[which] = summarize(rep, f) | {"audit wall time (s)": f"{time.perf_counter() - t:.1f}"}
        ppl = log[f]
        print(f"\n## {f} ({ppl['model_type']}): held-out perplexity trained {ppl['val_perplexity']:.1f} "
              f"(step {ppl['kept_step']} of {ppl['steps']}), random {ppl['random_init_val_perplexity']:.0f}\n")
        print("| figure | trained | random |\n|---|---|---|")
        for row in cols["trained"]:
            print(f"| {row} | {cols['trained'][row]} | {cols['random'][row]} |")


if __name__ == "__main__":
    main()
