"""A throughput model: expected speedup of each mode over chain verification and over
autoregressive decoding, from measured tokens per step and a verify cost per node count.

Costs are in units of one autoregressive target step (a 1-token forward), so the model needs no
clock. ``verify_cost(T) = 1 + node_cost * (T - 1)`` (memory-bound target: extra nodes are cheap
until compute bites), times a per-mode factor (exact tree kernels may cost more or less than the
flattened one; see benchmarks/RESULTS.md), plus ``draft_cost`` per step. Alternatively a
benchmark file gives measured verify times per node count, interpolated linearly.

Defaults (documented assumptions, not measurements of this machine): node_cost 0.02,
draft_cost 0.15 (a block-diffusion drafter's one forward), mode factors 1.0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ddsim.errors import InputError
from ddsim.jsonl import read_json
from ddsim.trees.modes import VERIFY_MODES
from ddsim.values import is_real


@dataclass
class CostModel:
    node_cost: float = 0.02
    draft_cost: float = 0.15
    mode_factor: dict = field(default_factory=dict)  # mode -> multiplier on the verify cost
    table: list | None = None  # [(nodes, cost in AR steps)], sorted; overrides node_cost
    source: str = "parameters"

    def verify_cost(self, nodes: float, mode: str = "exact") -> float:
        if self.table:
            xs, ys = zip(*self.table)
            base = float(np.interp(nodes, xs, ys))
        else:
            base = 1.0 + self.node_cost * (nodes - 1)
        return base * float(self.mode_factor.get(mode, 1.0))

    def step_cost(self, nodes: float, mode: str = "exact") -> float:
        return self.verify_cost(nodes, mode) + self.draft_cost

    def to_dict(self) -> dict:
        return {"node_cost": self.node_cost, "draft_cost": self.draft_cost, "mode_factor": dict(self.mode_factor),
                "table": self.table, "source": self.source}

    @classmethod
    def from_file(cls, path: str | Path) -> "CostModel":
        """JSON: {"ar_step_us": float, "verify_us": {"<nodes>": us, ...}, "draft_us": float,
        "mode_factor": {mode: factor}} -> costs in AR steps. Every figure must be a finite number,
        times and factors > 0 (draft_us >= 0), node counts integers >= 1, modes known; unknown keys
        are refused (a typo would silently leave a default in place)."""
        path = Path(path)
        d = read_json(path, "cost file")

        def bad(why):
            return InputError(f"{path}: not a cost file ({why})")

        def number(v, name, *, zero_ok=False):
            if not is_real(v) or not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
                raise bad(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, got {v!r}")
            return float(v)

        if not isinstance(d, dict):
            raise bad("expected a JSON object")
        unknown = sorted(set(d) - {"ar_step_us", "verify_us", "draft_us", "mode_factor"})
        if unknown:
            raise bad(f"unknown key {unknown[0]!r}")
        if "ar_step_us" not in d or "verify_us" not in d:
            raise bad("needs ar_step_us and verify_us")
        ar = number(d["ar_step_us"], "ar_step_us")
        if not isinstance(d["verify_us"], dict) or not d["verify_us"]:
            raise bad("verify_us must be a non-empty object of node count -> microseconds")
        table = []
        for n, us in d["verify_us"].items():
            if not n.isdigit() or int(n) < 1:
                raise bad(f"verify_us key {n!r} is not a node count >= 1")
            table.append((int(n), number(us, f"verify_us[{n}]") / ar))
        factors = d.get("mode_factor", {})
        if not isinstance(factors, dict):
            raise bad("mode_factor must be an object of mode -> factor")
        for m, f in factors.items():
            if m not in VERIFY_MODES:
                raise bad(f"mode_factor names no verify mode: {m!r} (known: {', '.join(VERIFY_MODES)})")
            number(f, f"mode_factor[{m}]")
        return cls(draft_cost=number(d.get("draft_us", 0.0), "draft_us", zero_ok=True) / ar,
                   mode_factor={m: float(f) for m, f in factors.items()}, table=sorted(table), source=str(path))


def expected_speedup(*, tokens_per_step: float, nodes: float, mode: str, cost: CostModel) -> float:
    """Speedup over autoregressive decoding (1 token per unit cost)."""
    return tokens_per_step / cost.step_cost(nodes, mode)


def speedup_table(rows: list[dict], cost: CostModel) -> list[dict]:
    """rows: {"label", "mode", "tokens_per_step", "nodes"} (chain rows have label "chain").
    Adds "speedup_vs_ar" and "speedup_vs_chain" (vs the chain row of the same mode, else exact)."""
    out = []
    chain = {r["mode"]: r for r in rows if r["label"] == "chain"}
    for r in rows:
        s = expected_speedup(tokens_per_step=r["tokens_per_step"], nodes=r["nodes"], mode=r["mode"], cost=cost)
        c = chain.get(r["mode"]) or chain.get("exact")
        sc = None
        if c is not None:
            sc = s / expected_speedup(tokens_per_step=c["tokens_per_step"], nodes=c["nodes"], mode=c["mode"], cost=cost)
        out.append({**r, "step_cost": cost.step_cost(r["nodes"], r["mode"]), "speedup_vs_ar": s,
                    "speedup_vs_chain": sc})
    return out
