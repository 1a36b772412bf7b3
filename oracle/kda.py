"""Kimi Delta Attention (KDA, Kimi Linear's linear attention) tree verification, the plain way: per node, per head,
run the recurrence token by token along the node's history (its root path for "exact", batch order for "leaky"),
starting from the committed state: each node one step from the state of the node before it in its history
(`_paths.predecessor`), the same operations as replaying the history from scratch. float64 throughout.

Per head h, with S [K, V], q and k L2-normalised (q then scaled by K^-1/2) and a decay per key channel:
    S'  = Diag(exp(g_t)) S_{t-1}                     g_t [K] (<= 0): each key row of the state decays on its own
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T         the delta rule
    o_t = S_t^T q_t
"""
from __future__ import annotations

import torch

from ddsim.oracle._paths import check_mode, history, parent_rows, predecessor
from ddsim.oracle._shapes import head_values, qk_shape, state_shape

F64 = torch.float64


def _check(q, k, v, g, beta, initial_state):
    """The shapes; q None for a commit, which takes none (its messages then name k alone)."""
    Bn, T, H, K = qk_shape(q, k)
    V = head_values(v, Bn, T, H)
    if tuple(g.shape) != (Bn, T, H, K):
        raise ValueError(f"g: expected [B, T, H, K] = {(Bn, T, H, K)}, got {tuple(g.shape)}")
    if tuple(beta.shape) != (Bn, T, H):
        raise ValueError(f"beta: expected [B, T, H] = {(Bn, T, H)}, got {tuple(beta.shape)}")
    state_shape(initial_state, (Bn, H, K, V), "B, H, K, V")
    return Bn, T, H, K, V


def _l2(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _step(S, k, v, g, beta):
    """One token of one head: S [K, V], k [K] (normalised), v [V], g [K], beta a scalar -> S_t."""
    S = torch.exp(g)[:, None] * S
    return S + beta * torch.outer(k, v - (S * k[:, None]).sum(0))


def kda_tree_verify(q, k, v, g, beta, *, parents, initial_state, mode="exact", output_states=False):
    """Reference tree verification of one KDA layer.

    q, k: [B, T, H, K] (before the L2 norm); v: [B, T, H, V]; g: [B, T, H, K] (log decay, <= 0); beta: [B, T, H];
    parents: [B, T]; initial_state: [B, H, K, V]. Returns o [B, T, H, V] float64 and, with output_states, the
    state after each node [B, T, H, K, V] float64.
    """
    check_mode(mode)
    Bn, T, H, K, V = _check(q, k, v, g, beta, initial_state)
    rows = parent_rows(parents, Bn, T)
    q, k, v, g, beta = (t.detach().to("cpu", F64) for t in (q, k, v, g, beta))
    q, k = _l2(q) * K ** -0.5, _l2(k)
    S0 = initial_state.detach().to("cpu", F64)
    o = torch.zeros(Bn, T, H, V, dtype=F64)
    states = torch.zeros(Bn, T, H, K, V, dtype=F64) if output_states else None
    for b in range(Bn):
        for h in range(H):
            after = []  # after[n]: head h's state after node n [K, V]
            for t in range(T):
                p = predecessor(rows[b], t, mode)
                S = S0[b, h].clone() if p < 0 else after[p]
                S = _step(S, k[b, t, h], v[b, t, h], g[b, t, h], beta[b, t, h])
                after.append(S)
                o[b, t, h] = (S * q[b, t, h][:, None]).sum(0)
                if states is not None:
                    states[b, t, h] = S
    return (o, states) if output_states else o


def kda_tree_commit(k, v, g, beta, *, parents, accepted, initial_state):
    """State after accepting the path root..accepted[b], recomputed along that path alone: [B, H, K, V] float64."""
    Bn, T, H, K, V = _check(None, k, v, g, beta, initial_state)
    rows = parent_rows(parents, Bn, T)
    k, v, g, beta = (t.detach().to("cpu", F64) for t in (k, v, g, beta))
    k = _l2(k)
    out = initial_state.detach().to("cpu", F64).clone()
    for b in range(Bn):
        a = int(accepted[b])
        if not 0 <= a < T:
            raise ValueError(f"accepted: sequence {b} node {a} is outside 0..{T - 1}")
        for n in history(rows[b], a, "exact"):
            for h in range(H):
                out[b, h] = _step(out[b, h], k[b, n, h], v[b, n, h], g[b, n, h], beta[b, n, h])
    return out
