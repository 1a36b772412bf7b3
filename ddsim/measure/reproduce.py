"""Whether a rechecked figure reproduces the report's (``gate --report``'s recheck, ddsim.measure.recheck):
token sequences, counts and decisions exactly; floats within the fast path's relative tolerance, above an
absolute floor set by what the figure measures. Value code only: ``make mutation`` runs the fast chain tests
against mutants of it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ddsim.errors import InputError

ABS_FLOOR = 1e-9


@dataclass(frozen=True)
class Tolerance:
    """How closely a rechecked float must come to the report's: within ``rtol`` of the larger, above an
    absolute floor set by what the figure measures (``figure_kind``; ABS_FLOOR for any other figure)."""
    rtol: float
    floors: dict[str, float]

    def close(self, a, b, where: str) -> bool:
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
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
