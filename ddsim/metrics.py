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

REL_CHUNK_BYTES = 1 << 30  # differences alive at once in _rel_rows (a per-node state set is ~10 GB at full size)


def _rel_rows(pairs) -> torch.Tensor:
    """[len(pairs), T] float64 on the references' device: for each (a [T, ...], ref [T, ...]) pair,
    row-wise ||a - ref|| / ||ref|| over all but the first dim (a row with ||ref|| = 0: 0 when a equals
    it, else inf). Computed in the wider of the two dtypes (the oracle's: float64 on the CPU, float32 on
    a GPU, where a per-node state set is gigabytes): the difference of two values of that dtype is
    exactly rounded, and the norms carry its relative rounding, far below any error reported. Every
    row of every pair goes through the multi-tensor (foreach) difference and norm, a few launches per
    chunk of about REL_CHUNK_BYTES instead of several per layer."""
    dev = pairs[0][1].device
    num, den, chunk = [], [], {"a": [], "ref": [], "bytes": 0, "device": None}

    def flush():
        if chunk["a"]:
            num.append(torch.stack(torch._foreach_norm(torch._foreach_sub(chunk["a"], chunk["ref"]))).to(dev))
            den.append(torch.stack(torch._foreach_norm(chunk["ref"])).to(dev))
        chunk.update(a=[], ref=[], bytes=0)
    for a, ref in pairs:
        if ref.device != chunk["device"] or chunk["bytes"] >= REL_CHUNK_BYTES:
            flush()  # a chunk is one device's (a placed oracle's layers are on theirs)
            chunk["device"] = ref.device
        wide = torch.promote_types(a.dtype, ref.dtype)
        a, ref = a.to(device=ref.device, dtype=wide).flatten(1), ref.to(wide).flatten(1)  # [T, X]
        chunk["a"].extend(a.unbind(0))
        chunk["ref"].extend(ref.unbind(0))
        chunk["bytes"] += ref.numel() * ref.element_size()
    flush()
    n, d = torch.cat(num).double(), torch.cat(den).double()
    rel = torch.where(d > 0, n / d.clamp_min(1e-300), torch.where(n > 0, torch.inf, 0.0))
    return rel.view(len(pairs), -1)


def _rel_table(pairs) -> np.ndarray:
    """_rel_rows brought to the host: [len(pairs), T] float64."""
    return _rel_rows(pairs).cpu().numpy()


def node_metrics(tree: Tree, res, ref, cfg) -> dict:
    """Everything per node for one verify result ``res`` (ddsim.model.VerifyResult) against the
    oracle's ``ref`` (oracle.OracleResult) on the same tree and committed state, computed on the
    oracle's device: the logits in float64, the state, window and hidden errors in the oracle's dtype
    (_rel_rows).

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
    L, g = cfg.num_layers, cfg.recurrent_layers
    pairs = [(res.hidden[l], ref.hidden[l]) for l in range(L)]
    states = bool(g) and ref.ssm[g[0]] is not None
    if states:
        pairs += [(res.ssm[l], ref.ssm[l]) for l in g] + [(res.conv[l], ref.conv[l]) for l in g]
    # every row of every table, brought to the host in one transfer (one device sync per call)
    rows = torch.cat([torch.stack([kl, (lm - lo).abs().amax(-1), decision_margins(lo),
                                   (lm.argmax(-1) != lo.argmax(-1)).double()]),
                      _rel_rows(pairs).to(lo.device)]).cpu().numpy()
    out = {"kl": rows[0], "max_abs": rows[1], "margin": rows[2], "flip": rows[3] != 0, "hidden_rel": rows[4:4 + L]}
    G = len(g) if states else 0
    out["state_rel"] = rows[4 + L:4 + L + G] if states else np.zeros((0, tree.size))
    out["conv_rel"] = rows[4 + L + G:] if states else np.zeros((0, tree.size))
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
