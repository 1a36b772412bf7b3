"""The default audit on the trained hybrid (ddsim/models, trained drafter in the loop, code prompts)
beside the random `tiny` preset (synthetic drafter, random prompts), in one run on one device: learned
vs random decay half-lives, the reference's decision margins, the leak per depth and per GDN layer,
decision flips, tokens per step for chain / exact / leaky, generations leaving greedy.

    python benchmarks/trained_vs_random.py [--device cpu|cuda] [--budget 16,32,64] [--steps 8] [--out DIR]
"""
import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from ddsim.measure.audit import run_audit
from ddsim.measure.settings import AuditConfig
from ddsim.reports.json_report import dumps, stamp

MODELS = Path(__file__).resolve().parents[1] / "ddsim" / "models"


def configs(device, budgets, steps):
    return {
        "trained (hybrid-stdlib + drafter-stdlib)": AuditConfig.build(
            model_path=str(MODELS / "hybrid-stdlib"), drafter_model=str(MODELS / "drafter-stdlib"),
            prompts_file=str(MODELS / "prompts-stdlib.jsonl"), device=device, budgets=budgets, steps=steps),
        "random (preset tiny + synthetic drafter)": AuditConfig.build(device=device, budgets=budgets, steps=steps),
    }


def _med(s):
    return s["median"] if s and s.get("median") is not None else float("nan")


def summarize(rep: dict) -> dict:
    big = rep["budgets"][-1]
    leaky = big["leak"]["leaky"]
    margins = [m for p in rep["prompts"] for m in p["reference_margins"]]
    return {
        "GDN half-life median / max (tokens)": f"{_med(rep['model']['gates']['halflife_tokens']):.3g} / "
                                               f"{rep['model']['gates']['halflife_tokens']['max']:.3g}",
        "reference decision margin median (nats)": f"{statistics.median(margins):.3g}",
        "noise margin (nats)": f"{rep['noise_margin']:.3g}",
        f"leaky KL, not order-exact nodes, median (budget {big['budget']})": f"{_med(leaky['kl']['other']):.3g}",
        "leaky state rel. error by depth 1/2/3 (median)": " / ".join(
            f"{_med(d['state_rel']):.3g}" for d in leaky["by_depth"][1:4]),
        "leaky state rel. error by GDN layer (median)": " / ".join(
            f"{_med(layer['state_rel']):.3g}" for layer in leaky["by_layer"] if layer["kind"] == "g"),
        "leaky argmax flips off order-exact": f"{leaky['argmax_flip_rate']['other']:.3g}",
        "leaky decision flip rate": f"{big['modes']['leaky']['decision_flip_rate']:.3g}",
        "tokens/step chain / exact / leaky": f"{rep['chain']['tokens_per_step']:.2f} / "
                                            f"{big['modes']['exact']['tokens_per_step']:.2f} / "
                                            f"{big['modes']['leaky']['tokens_per_step']:.2f}",
        "generations leaving greedy exact / leaky": f"{big['modes']['exact']['generations_leaving_greedy']} / "
                                                   f"{big['modes']['leaky']['generations_leaving_greedy']} of "
                                                   f"{big['modes']['exact']['generations']}",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", default="16,32,64")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--out", type=Path, default=None, help="also keep both report.json files here")
    a = ap.parse_args()
    budgets = [int(x) for x in a.budget.split(",")]
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"# {time.strftime('%Y-%m-%d')} | {dev} | torch {torch.__version__} | commit {a.commit} | budgets {budgets}, "
          f"{a.steps} steps")
    cols = {}
    for name, ac in configs(a.device, budgets, a.steps).items():
        t = time.perf_counter()
        rep = json.loads(dumps(stamp(run_audit(ac))))
        cols[name] = summarize(rep) | {"audit wall time (s)": f"{time.perf_counter() - t:.1f}"}
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / f"{name.split()[0]}.json").write_text(json.dumps(rep, indent=1))
    names = list(cols)
    print("| figure | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for row in cols[names[0]]:
        print(f"| {row} | " + " | ".join(cols[n][row] for n in names) + " |")


if __name__ == "__main__":
    main()
