"""Aggregation of per-node leak metrics into the report's leak tables: split by order-exact or
not, grouped by depth, sibling rank, layer and recurrent family (GDN, Mamba2). The gate's coverage rule and argmax-flip rule read
what this computes, so every number here has a value test on hand-built records
(tests/test_gate_chain.py) and is under mutation testing (make mutation)."""
from __future__ import annotations

import numpy as np

from ddsim.measure.metrics import group_by, summarize


class NodePool:
    """Collects per-node metric arrays (ddsim.measure.metrics.node_metrics, node_keys) over many steps for one
    mode, and reduces them to the report's leak table (ddsim.verdict.report_model.LeakTable)."""

    def __init__(self):
        self.cols: dict[str, list] = {}

    def add(self, metrics: dict, keys: dict):
        for k, v in {**metrics, **keys}.items():
            self.cols.setdefault(k, []).append(np.asarray(v))

    def get(self, k):
        arrs = self.cols.get(k, [])
        if not arrs:
            return np.zeros(0)
        return np.concatenate(arrs, axis=-1)

    def table(self, cfg) -> dict:
        ex = self.get("order_exact").astype(bool)
        other = ~ex
        flip = self.get("flip").astype(float)
        depth, rank = self.get("depth"), self.get("rank")
        state, conv, hidden = self.get("state_rel"), self.get("conv_rel"), self.get("hidden_rel")
        last_hidden = hidden[-1] if hidden.size else np.zeros(0)
        out = {
            "nodes": int(ex.size), "order_exact_nodes": int(ex.sum()), "not_order_exact_nodes": int(other.sum()),
            "argmax_flip_rate": {"order_exact": _rate(flip, ex), "other": _rate(flip, other), "all": _rate(flip, None)},
        }
        for name, arr in (("kl", self.get("kl")), ("max_abs_logit", self.get("max_abs")),
                          ("state_rel", state), ("conv_rel", conv), ("hidden_rel_last", last_hidden)):
            out[name] = {"order_exact": summarize(arr[..., ex]) if arr.size else summarize([]),
                         "other": summarize(arr[..., other]) if arr.size else summarize([])}
        out["by_depth"] = _rows("depth", group_by(depth, state, mask=None) if state.size else {},
                                group_by(depth, flip), group_by(depth, last_hidden))
        out["by_rank"] = _rows("rank", group_by(rank, state, mask=depth > 0) if state.size else {},
                               group_by(rank, flip, mask=depth > 0), group_by(rank, last_hidden, mask=depth > 0))
        out["by_layer"] = [{"layer": int(l), "kind": cfg.layer_pattern[l],
                            "hidden_rel": summarize(hidden[l][other]) if other.any() else summarize([])}
                           for l in range(cfg.num_layers)]
        rec = cfg.recurrent_layers
        # layer -> its row of the state table (not the short convs: no state beside the window) and of the window
        # table (not lightning attention: no conv)
        srow = {l: si for si, l in enumerate(l for l in rec if cfg.stateful(l))}
        crow = {l: ci for ci, l in enumerate(l for l in rec if cfg.windowed(l))}
        for l in rec:
            if l in srow:
                out["by_layer"][l]["state_rel"] = summarize(state[srow[l]][other]) if other.any() else summarize([])
            if l in crow:
                out["by_layer"][l]["conv_rel"] = summarize(conv[crow[l]][other]) if other.any() else summarize([])
        out["by_family"] = []
        for fam in sorted({cfg.family(l) for l in rec}):
            layers = [l for l in rec if cfg.family(l) == fam]
            srows, crows = [srow[l] for l in layers if l in srow], [crow[l] for l in layers if l in crow]
            pick = (lambda a, r: a[r][:, other]) if other.any() else (lambda a, r: [])  # noqa: E731
            out["by_family"].append({"family": fam, "layers": len(layers),
                                     "state_rel": summarize(pick(state, srows)) if srows else None,
                                     "conv_rel": summarize(pick(conv, crows)) if crows else None})
        margin = self.get("margin")
        out["margin_of_flipped"] = summarize(margin[flip > 0]) if flip.size else summarize([])
        out["margin_all"] = summarize(margin)
        return out


def _rate(flags: np.ndarray, mask) -> float | None:
    f = flags if mask is None else flags[mask]
    return float(f.mean()) if f.size else None


def _rows(key, state_groups, flip_groups, hidden_groups) -> list:
    keys = sorted(set(flip_groups) | set(state_groups))
    return [{key: int(k), "nodes": flip_groups.get(k, {}).get("n", 0),
             "state_rel": state_groups.get(k, summarize([])),
             "hidden_rel_last": hidden_groups.get(k, summarize([])),
             "argmax_flip_rate": flip_groups.get(k, {}).get("mean")} for k in keys]
