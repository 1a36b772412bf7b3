"""Whether a rechecked figure reproduces the report's (``gate --report``'s recheck, ddsim.measure.recheck):
token sequences, counts and decisions exactly; floats within the fast path's relative tolerance, above an
absolute floor set by what the figure measures. A sample of the prompts, re-run, cannot reproduce leak tables
pooled over every prompt, but it bounds them (``bounded``): its own pooled table's counts, flips and maxima
cannot exceed the report's. Value code only: ``make mutation`` runs the fast chain tests against mutants of it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ddsim.errors import InputError
from ddsim.values import is_real

ABS_FLOOR = 1e-9


@dataclass(frozen=True)
class Tolerance:
    """How closely a rechecked float must come to the report's: within ``rtol`` of the larger, above an
    absolute floor set by what the figure measures (``figure_kind``; ABS_FLOOR for any other figure)."""
    rtol: float
    floors: dict[str, float]

    def close(self, a, b, where: str) -> bool:
        if not (is_real(a) and is_real(b)):
            return a == b
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        if not (math.isfinite(a) and math.isfinite(b)):
            return a == b
        kind = figure_kind(where)
        atol = ABS_FLOOR if kind is None else self.floors[kind]
        return abs(a - b) <= atol + self.rtol * max(abs(a), abs(b))


def tolerance(precision: str) -> Tolerance:
    """The recheck's tolerance for a report whose fast path computes in ``precision``: ddsim.measure.compare's
    for that dtype with the model slack (atol 2e-4, rtol 4e-4 for float32), with the floors
    - "logit" (a logit difference or margin, nats): that absolute term;
    - "kl" (a KL divergence): half its square (KL is about half the squared logit difference: 2e-8);
    - "rel" (a relative error): eight unit roundoffs of the dtype (4.8e-7 for float32; another CPU moved
      the fixture audit's exact-path errors, 1.7e-7 to 5.6e-7, by up to 1.4e-7);
    - "tv" (a total variation): half the logit term."""
    import torch

    from ddsim.measure.compare import MODEL_SLACK, TOLERANCES
    dtype = getattr(torch, precision)
    atol, rtol = (MODEL_SLACK * x for x in TOLERANCES[dtype])
    u = torch.finfo(dtype).eps / 2
    return Tolerance(rtol, {"logit": atol, "kl": atol * atol / 2, "rel": 8 * u, "tv": atol / 2})


def figure_kind(where: str) -> str | None:
    """What the figure at path ``where`` measures, from the innermost field name that says
    (budgets[0].leak.exact.kl.order_exact.mean: "kl"; generations[3].divergence_margin: "logit"), else None."""
    for part in reversed(where.split(".")):
        name = part.split("[", 1)[0]
        if name == "max_abs_logit" or "margin" in name:
            return "logit"
        if name == "kl" or name.startswith("kl_") or name.endswith("_kl"):
            return "kl"
        if name.endswith("_rel") or "_rel_" in name:
            return "rel"
        if name.endswith("_tv"):
            return "tv"
    return None


def compare(got, want, tol: Tolerance, where: str = "") -> int:
    """Values compared; InputError at the first that differs (lists and dicts recursively)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            raise InputError(f"--report: does not reproduce: {where or 'report'} has other fields on recheck")
        return sum(compare(got[k], want[k], tol, f"{where}.{k}" if where else str(k)) for k in want)
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            raise InputError(f"--report: does not reproduce: {where} has {len(got) if isinstance(got, list) else got!r} "
                             f"entries on recheck, the report {len(want)}")
        return sum(compare(g, w, tol, f"{where}[{i}]") for i, (g, w) in enumerate(zip(got, want)))
    if not tol.close(got, want, where):
        raise InputError(f"--report: does not reproduce: {where} is {want!r} in the report, {got!r} on recheck "
                         "(the report was not produced by this audit)")
    return 1


SUMMARY = {"n", "mean", "median", "p90", "max"}  # a leak table's summary of one quantity (report_model.Summary)
ROW_KEYS = ("depth", "rank", "layer", "family")  # what names a row of a leak table's lists
FLIPS = (("order_exact", "order_exact_nodes"), ("other", "not_order_exact_nodes"), ("all", "nodes"))


def bounded(got, want, tol: Tolerance, where: str = "") -> int:
    """Values checked that ``got``, a leak table pooled over some of the audit's prompts (re-run), does not exceed
    ``want``, the report's table of every prompt (both as JSON): every count (nodes, a summary's n, flips: a rate
    times its nodes) at most the report's, every summary's max at most its max within ``tol``, every row (a depth,
    rank, layer or family) one the report has. InputError at the first that exceeds: the report's table is not
    the pool of its prompts (mean, median and p90 of a part may exceed the whole's: not compared)."""
    if isinstance(want, dict) and set(want) == SUMMARY:
        if not isinstance(got, dict) or set(got) != SUMMARY:
            raise InputError(f"--report: does not reproduce: {where} is not a summary on recheck")
        _at_most(got["n"], want["n"], f"{where}.n")
        if got["n"]:
            _at_most(got["max"], want["max"], f"{where}.max", tol)
        return 2
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            raise InputError(f"--report: does not reproduce: {where or 'leak table'} has other fields on recheck")
        n = 0
        if "argmax_flip_rate" in want:
            rates_g, rates_w = got["argmax_flip_rate"], want["argmax_flip_rate"]
            pairs = FLIPS if isinstance(rates_w, dict) else ((None, "nodes"),)
            for rate, nodes in pairs:
                rg = rates_g if rate is None else rates_g[rate]
                rw = rates_w if rate is None else rates_w[rate]
                label = f"{where}.argmax_flip_rate" + ("" if rate is None else f".{rate}")
                _at_most(round((rg or 0.0) * got[nodes]), round((rw or 0.0) * want[nodes]), f"{label} (flipped nodes)")
                n += 1
        return n + sum(bounded(got[k], want[k], tol, f"{where}.{k}" if where else k) for k in want
                       if k != "argmax_flip_rate")
    if isinstance(want, list):
        if not isinstance(got, list):
            raise InputError(f"--report: does not reproduce: {where} is not a list on recheck")
        rows = want or got
        if not rows:
            return 0
        key = next((k for k in ROW_KEYS if k in rows[0]), None)
        if key is None:
            raise InputError(f"--report: does not reproduce: {where} has rows without a depth, rank, layer or family")
        theirs = {row[key]: row for row in want}
        n = 0
        for row in got:
            if row[key] not in theirs:
                raise InputError(f"--report: does not reproduce: {where} has no {key} {row[key]!r}, which the re-run "
                                 f"prompts reach (the report was not produced by this audit)")
            n += bounded(row, theirs[row[key]], tol, f"{where}[{key} {row[key]!r}]")
        return n
    if is_real(want) and isinstance(got, (int, float)):
        _at_most(got, want, where)  # a count (a row's key: equal, as matched)
        return 1
    if got != want:
        raise InputError(f"--report: does not reproduce: {where} is {want!r} in the report, {got!r} on recheck")
    return 1


def _at_most(got, want, where: str, tol: Tolerance | None = None) -> None:
    """InputError unless got <= want (within tol of the figure's kind, for a float; exactly for a count)."""
    if got is None or want is None or not (math.isfinite(got) and math.isfinite(want)):
        raise InputError(f"--report: does not reproduce: {where} is {want!r} in the report, {got!r} on recheck")
    slack = 0.0
    if tol is not None:
        kind = figure_kind(where)
        slack = (ABS_FLOOR if kind is None else tol.floors[kind]) + tol.rtol * max(abs(got), abs(want))
    if got > want + slack:
        raise InputError(f"--report: does not reproduce: {where} is {want!r} in the report, but the re-run prompts "
                         f"alone reach {got!r} (the report's table is not the pool of its prompts)")
