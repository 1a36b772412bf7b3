"""check-sampler at its default settings on every reference rule and every planted lossy one, one row each:
verdict, failing cases, the worst case's test and seconds. Usage: python benchmarks/check_sampler_separation.py"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddsim.sampling import sglang_convention as sg  # noqa: E402
from ddsim.sampling.check import DEFAULT_DRAWS, Sampler, check, power_line  # noqa: E402
from ddsim.sampling.rules import RULES  # noqa: E402
from tests import planted_samplers as planted  # noqa: E402


def builtin(name, drafting=None, **params):
    r = RULES[name]
    fn = functools.partial(r.fn, **params) if params else r.fn
    label = name + "".join(f" {k}={v}" for k, v in params.items()) + (f" (drafting {drafting})" if drafting else "")
    return label, Sampler(label, fn, r.randoms, drafting or r.drafting, r.uses_draft)


ROWS = [
    ("lossless", *builtin("sglang")), ("lossless", *builtin("eagle")), ("lossless", *builtin("ddtree")),
    ("lossless", *builtin("gumbel")), ("lossless", *builtin("specinfer")), ("lossless", *builtin("rrs")),
    ("lossless", "sglang convention (torch transcription)",
     Sampler("sg", sg.adapter(sg.tree_speculative_sampling_target_only), sg.RANDOMS, "fixed")),
    ("lossy", *builtin("typical")), ("lossy", *builtin("sglang", threshold_single=0.5)),
    ("lossy", *builtin("sglang", threshold_acc=0.9)), ("lossy", *builtin("specinfer", "fixed")),
    ("lossy", "resample from the target", Sampler("r", planted.resample_from_target, planted.RANDOMS, "fixed")),
    ("lossy", "siblings not renormalised", Sampler("n", planted.no_renormalise, planted.RANDOMS, "fixed")),
    ("lossy", "coins reused across siblings", Sampler("c", planted.coins_reused, planted.RANDOMS, "fixed")),
    ("lossy", "SpecInfer residual, drafts without replacement",
     Sampler("w", planted.residual_without_draft_update, planted.RANDOMS, "without-replacement", True)),
]

if __name__ == "__main__":
    torch.set_num_threads(1)
    print("| rule | designed | verdict | failing cases | worst test (L1 / threshold) | s |")
    print("|---|---|---|---|---|---|")
    ok = True
    for kind, label, s in ROWS:
        r = check(s, draws=DEFAULT_DRAWS)
        w = r.worst()
        t = w.worst()
        worst = w.failure or (f"{w.case.label}: {t['name']} ({t['l1'] / t['threshold']:.2f})" if t else "-")
        print(f"| {label} | {kind} | {'holds' if r.holds else 'LOSSY'} | {sum(not c.holds for c in r.cases)}/"
              f"{len(r.cases)} | {worst} | {r.seconds:.0f} |", flush=True)
        ok &= r.holds == (kind == "lossless")
    print(power_line(DEFAULT_DRAWS, 1e-6 / ((9 + 24) * 32)))
    print("every lossless rule holds and every lossy one is caught" if ok else "SEPARATION FAILED")
    sys.exit(0 if ok else 1)
