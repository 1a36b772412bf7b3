"""Leakage metrics (README, Contracts: leakage metrics): a fast-path verify result against the oracle, per node and layer.

Per node and layer: recurrent state relative error ||S - S_ref||_F / ||S_ref||_F, conv window
relative error, hidden-state relative error. At the logits: KL(oracle || mode), max abs diff,
the oracle's top-1 margin (logit gap top-1 minus top-2, in nats), argmax flip.
Returned as plain numpy arrays; aggregation helpers group them by any per-node key.
"""
from __future__ import annotations

import numpy as np
import torch

from ddsim.acceptance import decision_margins
from ddsim.errors import MeasurementError
from ddsim.tree import Tree


def _rel_rows_on_device(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Row-wise ||a - ref|| / ||ref|| over all but the first dim, on ref's device: [T, ...] -> [T] float64.
    Computed in the wider of the two dtypes (type promotion: the oracle's, float64 on the CPU and
    float32 on a GPU, where a per-node state set is gigabytes): the difference of two values of that
    dtype is exactly rounded, and the norms carry its relative rounding, far below any error reported."""
    a, ref = a.to(ref.device).flatten(1), ref.flatten(1)
    num = torch.linalg.vector_norm(a - ref, dim=1).double()
    den = torch.linalg.vector_norm(ref, dim=1).double()
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.where(num > 0, torch.inf, 0.0))


def _rel_table(pairs) -> np.ndarray:
    """[len(pairs), T]: _rel_rows_on_device of each (a, ref) pair, computed where the references are and
    brought to the host in one transfer (one device sync for every layer, not one per layer)."""
    return torch.stack([_rel_rows_on_device(a, ref).to(pairs[0][1].device) for a, ref in pairs]).cpu().numpy()


def node_metrics(tree: Tree, res, ref, cfg) -> dict:
    """Everything per node for one verify result ``res`` (ddsim.model.VerifyResult) against the
    oracle's ``ref`` (oracle.OracleResult) on the same tree and committed state, computed on the
    oracle's device: the logits in float64, the state, window and hidden errors in the oracle's dtype
    (_rel_rows_on_device).

    Returns {"kl", "max_abs", "margin", "flip"} as [T] arrays and {"hidden_rel" [L, T],
    "state_rel" [G, T], "conv_rel" [G, T]} with G = the recurrent layers (GDN and Mamba2) in order.
    """
    fresh = getattr(res, "fresh", None)
    if fresh is not None and not fresh():
        raise MeasurementError("verify result: its per-node buffers were reused by a later verify (a CUDA-graph "
                               "replay); measure a result before verifying the next")
    lo = ref.logits.double()
    lm = res.logits.to(lo.device, torch.float64)
    logp_o, logp_m = torch.log_softmax(lo, -1), torch.log_softmax(lm, -1)
    kl = (logp_o.exp() * (logp_o - logp_m)).sum(-1).clamp_min(0.0)
    logit_rows = torch.stack([kl, (lm - lo).abs().amax(-1), decision_margins(lo),
                              (lm.argmax(-1) != lo.argmax(-1)).double()]).cpu().numpy()
    out = {
        "kl": logit_rows[0],
        "max_abs": logit_rows[1],
        "margin": logit_rows[2],
        "flip": logit_rows[3] != 0,
        "hidden_rel": _rel_table([(res.hidden[l], ref.hidden[l]) for l in range(cfg.num_layers)]),
    }
    g = cfg.recurrent_layers
    if g and ref.ssm[g[0]] is not None:
        out["state_rel"] = _rel_table([(res.ssm[l], ref.ssm[l]) for l in g])
        out["conv_rel"] = _rel_table([(res.conv[l], ref.conv[l]) for l in g])
    else:
        out["state_rel"] = np.zeros((0, tree.size))
        out["conv_rel"] = np.zeros((0, tree.size))
    return out


def node_keys(tree: Tree) -> dict:
    """Per-node grouping keys: depth, sibling rank, order-exact flag."""
    return {"depth": tree.depths.copy(), "rank": tree.sibling_rank.copy(), "order_exact": tree.order_exact.copy()}


def summarize(values: np.ndarray) -> dict:
    """Median / p90 / max / mean of a flat array, with its count. A non-finite value is an error,
    not a value to skip: it means a fast path produced NaN or Inf, the worst leak there is."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if not np.isfinite(v).all():
        raise MeasurementError(f"{int((~np.isfinite(v)).sum())} of {v.size} measured values are NaN or infinite "
                               "(the fast path produced non-finite output)")
    if v.size == 0:
        return {"n": 0, "mean": None, "median": None, "p90": None, "max": None}
    return {"n": int(v.size), "mean": float(v.mean()), "median": float(np.median(v)),
            "p90": float(np.quantile(v, 0.9)), "max": float(v.max())}


def group_by(keys: np.ndarray, values: np.ndarray, *, mask: np.ndarray | None = None) -> dict:
    """{key: summarize(values[keys == key])} for each distinct key (values [N] or [..., N])."""
    keys = np.asarray(keys).ravel()
    values = np.asarray(values)
    values = values.reshape(-1, keys.size) if values.ndim > 1 else values[None]
    sel = np.ones(keys.size, bool) if mask is None else np.asarray(mask).ravel()
    out = {}
    for k in np.unique(keys[sel]):
        m = sel & (keys == k)
        out[int(k) if not isinstance(k, (bool, np.bool_)) else bool(k)] = summarize(values[:, m])
    return out
