"""The CI gate: a TOML policy of upper bounds evaluated against a report. Fails closed: anything
that cannot be evaluated is an error (exit 2), never a pass.

[rules] holds the bounds; a subtable [rules.<dtype>] (bfloat16, float16, float32, float64) replaces
or adds bounds for reports whose fast path computes in that dtype (report.precision.fast_path):
the exact path's distance from the oracle is a property of the arithmetic, the leak is not."""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ddsim.errors import InputError
from ddsim.modes import LEAK_MODES

GATED_MODES = LEAK_MODES
PRECISIONS = ("float64", "float32", "bfloat16", "float16")


def _worst(values):
    vals = [v for v in values if v is not None]
    if not vals:
        raise InputError("report: the rule's measurement is missing from every budget")
    return max(vals)


def _flip_excess(r, mode):
    return _worst([(b["leak"][mode]["argmax_flip_rate"]["all"] or 0.0) - (b["leak"]["exact"]["argmax_flip_rate"]["all"] or 0.0)
                   for b in r["budgets"]])


def _mode_field(field: str, mode: str | None = None):
    """The worst over budgets of a mode summary's ``field``, for the gated mode (or ``mode``)."""
    return lambda r, m: _worst([b["modes"][mode or m][field] for b in r["budgets"]])


RULES = {
    "argmax_flip_rate_above_noise": (_flip_excess, "argmax flip rate of the mode minus the exact path's"),
    "decision_flip_rate": (_mode_field("decision_flip_rate"),
                           "accept decisions that differ along the reference walk, per walked node"),
    "generations_leaving_greedy": (_mode_field("generations_leaving_greedy"),
                                   "generations whose output leaves the reference"),
    "generations_leaving_greedy_above_noise": (
        _mode_field("generations_leaving_greedy_above_noise"),
        "generations leaving the reference where its choice led by more than the noise margin"),
    "silent_corruption_steps": (_mode_field("silent_corruption_steps"),
                                "steps emitting tokens exact verification would not"),
    "exact_generations_leaving_greedy": (_mode_field("generations_leaving_greedy", "exact"),
                                         "exact-mode generations leaving the reference (must be lossless)"),
    "exact_generations_leaving_greedy_above_noise": (
        _mode_field("generations_leaving_greedy_above_noise", "exact"),
        "exact-mode generations leaving the reference where its choice led by more than the noise margin"),
    "exact_state_rel_max": (lambda r, m: _worst([v["state_rel_max"] for v in r["noise_floor"].values()]),
                            "largest recurrent-state relative error of the exact path vs the oracle"),
    "exact_kl_max": (lambda r, m: _worst([v["kl_max"] for v in r["noise_floor"].values()]),
                     "largest KL(oracle || exact)"),
}


@dataclass
class Policy:
    path: str
    name: str
    mode: str
    rules: dict  # rule -> bound
    by_precision: dict  # fast-path dtype -> {rule: bound} replacing or adding to rules

    def bounds(self, precision: str) -> dict:
        return {**self.rules, **self.by_precision.get(precision, {})}


@dataclass
class Verdict:
    rule: str
    measured: float
    bound: float
    holds: bool
    meaning: str


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as e:
        raise InputError(f"{p}: cannot read policy ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{p}: malformed TOML ({e})") from None
    head = data.get("policy", {})
    rules = data.get("rules")
    if not isinstance(rules, dict) or not rules:
        raise InputError(f"{p}: no [rules] table (a policy with no rules would pass anything)")
    unknown = sorted(set(data) - {"policy", "rules"})
    if unknown:
        raise InputError(f"{p}: unknown table [{unknown[0]}]")
    mode = head.get("mode", "leaky")
    if mode not in GATED_MODES:
        raise InputError(f"{p}: policy.mode {mode!r} is not one of {', '.join(GATED_MODES)}")
    by_precision = {}
    for dt, table in rules.items():
        if isinstance(table, dict):
            if dt not in PRECISIONS:
                raise InputError(f"{p}: [rules.{dt}] names no dtype (known: {', '.join(PRECISIONS)})")
            by_precision[dt] = _bounds(p, table, f"rules.{dt}")
    base = {k: v for k, v in rules.items() if k not in by_precision}
    if not base:
        raise InputError(f"{p}: [rules] has no bounds of its own (a report of another precision would pass anything)")
    return Policy(str(p), str(head.get("name", p.stem)), mode, _bounds(p, base, "rules"), by_precision)


def _bounds(p: Path, table: dict, where: str) -> dict:
    """{rule: float bound} from a policy table, every rule known and every bound finite and >= 0."""
    for k, v in table.items():
        if k not in RULES:
            raise InputError(f"{p}: unknown rule {k!r} in [{where}] (known: {', '.join(sorted(RULES))})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InputError(f"{p}: rule {k!r} in [{where}] needs a finite bound >= 0, got {v!r}")
    return {k: float(v) for k, v in table.items()}


def report_precision(report: dict) -> str:
    """The fast path's dtype of an audit report (the key of the policy's per-precision bounds)."""
    try:
        dt = report["precision"]["fast_path"]
    except (KeyError, TypeError):
        raise InputError("report: no precision.fast_path (the gate cannot choose its bounds)") from None
    if dt not in PRECISIONS:
        raise InputError(f"report: precision.fast_path {dt!r} is not one of {', '.join(PRECISIONS)}")
    return dt


def evaluate(policy: Policy, report: dict) -> list[Verdict]:
    out = []
    for rule, bound in policy.bounds(report_precision(report)).items():
        fn, meaning = RULES[rule]
        try:
            measured = float(fn(report, policy.mode))
        except (KeyError, TypeError, IndexError) as e:
            raise InputError(f"report: cannot evaluate rule {rule!r} (missing {e})") from None
        if not math.isfinite(measured):
            raise InputError(f"report: rule {rule!r} measured a non-finite value")
        out.append(Verdict(rule, measured, bound, measured <= bound, meaning))
    return out
