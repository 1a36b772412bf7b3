"""Gated DeltaNet tree verification, the plain way: per node, per value head, run the delta rule
token by token along the node's history (its root path for "exact", batch order for "leaky"),
starting from the committed state: each node one step from the state of the node before it in its history
(`_paths.predecessor`), the same operations as replaying the history from scratch. float64 throughout.

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T (scale q_t)
"""
from __future__ import annotations

import torch

from ddsim.oracle._paths import check_mode, history, parent_rows, predecessor
from ddsim.oracle._shapes import qk_shape, state_shape

F64 = torch.float64


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum() + 1e-6)


def _step(S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """One delta-rule step for one head. S [K, V], k [K], v [V], g and beta scalars."""
    K = S.shape[0]
    eye = torch.eye(K, dtype=F64)
    return torch.exp(g) * (eye - beta * torch.outer(k, k)) @ S + beta * torch.outer(k, v)


def _check(q, k, v, g, beta, initial_state):
    """The shapes; q None for a commit, which takes none (its messages then name k alone)."""
    B, T, H, K = qk_shape(q, k)
    if v.dim() != 4 or v.shape[:2] != (B, T):
        raise ValueError(f"v: expected [B, T, HV, V] with B={B}, T={T}, got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"v: HV={HV} value heads is not a multiple of H={H} key heads")
    for name, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != (B, T, HV):
            raise ValueError(f"{name}: expected [B, T, HV] = {(B, T, HV)}, got {tuple(x.shape)}")
    state_shape(initial_state, (B, HV, K, V), "B, HV, K, V")
    return B, T, H, HV, K, V


def gdn_tree_verify(q, k, v, g, beta, *, parents, initial_state, mode="exact", scale=None,
                    use_qk_l2norm=True, output_states=False):
    """Reference tree verification of one GDN layer.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV] (g in log space);
    parents: [B, T] int (a tree per sequence, topological order); initial_state: [B, HV, K, V].
    Returns o [B, T, HV, V] float64, and with output_states also the state after each node
    [B, T, HV, K, V] float64. Value head j uses key head j // (HV / H).
    """
    check_mode(mode)
    B, T, H, HV, K, V = _check(q, k, v, g, beta, initial_state)
    rows = parent_rows(parents, B, T)
    scale = K ** -0.5 if scale is None else float(scale)
    q, k, v, g, beta = (x.detach().to("cpu", F64) for x in (q, k, v, g, beta))
    S0 = initial_state.detach().to("cpu", F64)
    group = HV // H
    o = torch.zeros(B, T, HV, V, dtype=F64)
    states = torch.zeros(B, T, HV, K, V, dtype=F64) if output_states else None
    for b in range(B):
        for j in range(HV):
            hk = j // group
            after = []  # after[n]: head j's state after node n [K, V]
            for t in range(T):
                p = predecessor(rows[b], t, mode)
                S = S0[b, j].clone() if p < 0 else after[p]
                kn = _l2norm(k[b, t, hk]) if use_qk_l2norm else k[b, t, hk]
                S = _step(S, kn, v[b, t, j], g[b, t, j], beta[b, t, j])
                after.append(S)
                qt = _l2norm(q[b, t, hk]) if use_qk_l2norm else q[b, t, hk]
                o[b, t, j] = S.T @ (scale * qt)
                if states is not None:
                    states[b, t, j] = S
    return (o, states) if output_states else o


def gdn_tree_commit(k, v, g, beta, *, parents, accepted, initial_state, use_qk_l2norm=True):
    """State after accepting the path root..accepted[b], recomputed along that path alone.

    k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; parents: [B, T];
    accepted: [B] node index per sequence; initial_state: [B, HV, K, V]. Returns [B, HV, K, V] float64.
    """
    B, T, H, HV, K, V = _check(None, k, v, g, beta, initial_state)
    rows = parent_rows(parents, B, T)
    k, v, g, beta = (x.detach().to("cpu", F64) for x in (k, v, g, beta))
    out = initial_state.detach().to("cpu", F64).clone()
    group = HV // H
    for b in range(B):
        a = int(accepted[b])
        if not 0 <= a < T:
            raise ValueError(f"accepted: sequence {b} node {a} is outside 0..{T - 1}")
        for n in history(rows[b], a, "exact"):
            for j in range(HV):
                kn = _l2norm(k[b, n, j // group]) if use_qk_l2norm else k[b, n, j // group]
                out[b, j] = _step(out[b, j], kn, v[b, n, j], g[b, n, j], beta[b, n, j])
    return out
