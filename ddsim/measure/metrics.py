"""Leakage metrics (README, Contracts: leakage metrics): a fast-path verify result against the oracle, per node and layer.

Per node and layer: recurrent state relative error ||S - S_ref||_F / ||S_ref||_F, conv window
relative error, hidden-state relative error. At the logits: KL(oracle || mode), max abs diff,
the oracle's top-1 margin (logit gap top-1 minus top-2, in nats), argmax flip.
Returned as plain numpy arrays; aggregation helpers group them by any per-node key.
"""
from __future__ import annotations

import numpy as np
import torch

from ddsim.errors import MeasurementError
from ddsim.sim.acceptance import decision_margins
from ddsim.trees.tree import Tree


def _layers(x, cfg) -> list:
    """x's per-layer state tables (a VerifyResult or OracleResult), [T, ...] each, in the order of the metric
    tables: the recurrent states of the layers that keep one (not the short convs, whose window is their whole
    state), then the conv windows of the layers that keep one (not lightning attention, which has no conv)."""
    g = cfg.recurrent_layers
    s, c = [l for l in g if cfg.stateful(l)], [l for l in g if cfg.windowed(l)]
    return [x.ssm[l] for l in s] + [x.conv[l] for l in c]


def _hidden(x, cfg) -> torch.Tensor:
    """x's hidden states after every layer, [L, T, d] (one tensor, or a list stacked)."""
    h = x.hidden
    return h[:cfg.num_layers] if torch.is_tensor(h) else torch.stack([h[l] for l in range(cfg.num_layers)])


def _has_states(ref, cfg) -> bool:
    g = cfg.recurrent_layers
    return bool(g) and ref.ssm[g[0]] is not None


def _row_norms(tensors: list, device) -> torch.Tensor:
    """[len(tensors), T] float64 on ``device``: each tensor's row norms ||x[t]|| over all but the first dim."""
    return torch.stack([torch.linalg.vector_norm(x, dim=_rest(x)).to(device) for x in tensors]).double()


def _rest(x: torch.Tensor) -> tuple:
    """All of x's dims but the first (a norm over them reduces each row without a reshape: one call)."""
    return tuple(range(1, x.dim()))


def reference_norms(ref, cfg) -> torch.Tensor:
    """The oracle's row norms of every table node_metrics reads ([P, T] float64 on the oracle's logits'
    device): the same for every fast-path mode measured against ``ref``, so a step computes them once
    and hands them to each node_metrics call."""
    dev = ref.logits.device
    hid = torch.linalg.vector_norm(_hidden(ref, cfg), dim=-1).to(dev).double()  # [L, T]: every layer at once
    return torch.cat([hid, _row_norms(_layers(ref, cfg), dev)]) if _has_states(ref, cfg) else hid


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den elementwise, a zero reference giving 0 where num is 0, else inf."""
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.where(num > 0, torch.inf, 0.0))


def _rel_rows(pairs, den: torch.Tensor | None = None) -> torch.Tensor:
    """[len(pairs), T] float64 on the first reference's device: for each (a [T, ...], ref [T, ...]) pair,
    row-wise ||a - ref|| / ||ref|| over all but the first dim (a row with ||ref|| = 0: 0 when a equals
    it, else inf); ``den``: the references' row norms, when known (reference_norms). Computed in the
    wider of the two dtypes (type promotion in the difference: the oracle's, float64 on the CPU and
    float32 on a GPU, where a per-node state set is gigabytes): the difference of two values of that
    dtype is exactly rounded, and the norms carry its relative rounding, far below any error reported.
    Two operator calls per pair (the difference, its norm; a third for the reference's norm unless
    handed in) and a few for the whole table: a call is launch-bound at full size, not memory-bound."""
    dev = pairs[0][1].device
    num = torch.stack([torch.linalg.vector_norm(a.to(ref.device) - ref, dim=_rest(ref)).to(dev)
                       for a, ref in pairs]).double()
    den = _row_norms([ref for _, ref in pairs], dev) if den is None else den.to(dev)
    return _ratio(num, den)


def _rel_table(pairs) -> np.ndarray:
    """_rel_rows brought to the host: [len(pairs), T] float64."""
    return _rel_rows(pairs).cpu().numpy()


def node_metrics(tree: Tree, res, ref, cfg, *, ref_norms: torch.Tensor | None = None) -> dict:
    """Everything per node for one verify result ``res`` (ddsim.model.model.VerifyResult) against the
    oracle's ``ref`` (oracle.OracleResult) on the same tree and committed state, computed on the
    oracle's device: the logits in float64, the state, window and hidden errors in the oracle's dtype
    (_rel_rows; the hidden states of every layer in one difference and one norm). ``ref_norms``:
    reference_norms(ref, cfg), when the caller measures several results against one ref.

    Returns {"kl", "max_abs", "margin", "flip"} as [T] arrays and {"hidden_rel" [L, T],
    "state_rel" [S, T], "conv_rel" [C, T]} with S = the recurrent layers that keep a state (all but the short
    convs) and C = those that keep a conv window (all but lightning attention), in order.
    """
    fresh = getattr(res, "fresh", None)
    if fresh is not None and not fresh():
        raise MeasurementError("verify result: its per-node buffers were reused by a later verify (a CUDA-graph "
                               "replay); measure a result before verifying the next")
    L, G = cfg.num_layers, len(cfg.recurrent_layers) if _has_states(ref, cfg) else 0
    S = sum(cfg.stateful(l) for l in cfg.recurrent_layers) if G else 0
    C = sum(cfg.windowed(l) for l in cfg.recurrent_layers) if G else 0
    if ref_norms is not None and tuple(ref_norms.shape) != (L + S + C, tree.size):
        raise MeasurementError(f"ref_norms: shape {tuple(ref_norms.shape)}, the oracle's tables are "
                               f"{(L + S + C, tree.size)}")
    lo = ref.logits.double()
    lm = res.logits.to(lo.device, torch.float64)
    logp_o, logp_m = torch.log_softmax(lo, -1), torch.log_softmax(lm, -1)
    kl = (logp_o.exp() * (logp_o - logp_m)).sum(-1).clamp_min(0.0)
    norms = reference_norms(ref, cfg) if ref_norms is None else ref_norms
    # the hidden states' errors of every layer at once ([L, T]; a difference and a norm), then the states'
    ref_hidden = _hidden(ref, cfg)
    num = torch.linalg.vector_norm(_hidden(res, cfg).to(ref_hidden.device) - ref_hidden, dim=-1).double()
    tables = [_ratio(num, norms[:L].to(num.device)).to(lo.device)]
    if G:
        pairs = list(zip(_layers(res, cfg), _layers(ref, cfg)))
        tables.append(_rel_rows(pairs, norms[L:]).to(lo.device))
    # every row of every table, brought to the host in one transfer (one device sync per call)
    rows = torch.cat([torch.stack([kl, (lm - lo).abs().amax(-1), decision_margins(lo),
                                   (lm.argmax(-1) != lo.argmax(-1)).double()])] + tables).cpu().numpy()
    return {"kl": rows[0], "max_abs": rows[1], "margin": rows[2], "flip": rows[3] != 0, "hidden_rel": rows[4:4 + L],
            "state_rel": rows[4 + L:4 + L + S] if S else np.zeros((0, tree.size)),
            "conv_rel": rows[4 + L + S:] if C else np.zeros((0, tree.size))}


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
