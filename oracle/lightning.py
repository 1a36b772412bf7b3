"""Lightning attention (MiniMax's linear attention with a constant per-head decay) tree verification, the plain
way: per node, per head, run the recurrence token by token along the node's history (its root path for "exact",
batch order for "leaky"), starting from the committed state: each node one step from the state of the node before
it in its history (`_paths.predecessor`), the same operations as replaying the history from scratch. float64
throughout.

Per head h, with S [K, V] and lambda_h = exp(-slope_h):
    S_t = lambda_h S_{t-1} + k_t v_t^T
    o_t = S_t^T q_t                      (the current token included; no scaling of q)
"""
from __future__ import annotations

import torch

from ddsim.oracle._paths import check_mode, history, parent_rows, predecessor
from ddsim.oracle._shapes import head_values, qk_shape, state_shape

F64 = torch.float64


def _check(q, k, v, decay, initial_state):
    """The shapes; q None for a commit, which takes none (its messages then name k alone)."""
    Bn, T, H, K = qk_shape(q, k)
    V = head_values(v, Bn, T, H)
    if tuple(decay.shape) != (H,):
        raise ValueError(f"decay: expected [H] = [{H}], got {tuple(decay.shape)}")
    state_shape(initial_state, (Bn, H, K, V), "B, H, K, V")
    return Bn, T, H, K, V


def lightning_tree_verify(q, k, v, *, decay, parents, initial_state, mode="exact", output_states=False):
    """Reference tree verification of one lightning-attention layer.

    q, k: [B, T, H, K]; v: [B, T, H, V]; decay: [H] (lambda, in (0, 1]); parents: [B, T]; initial_state:
    [B, H, K, V]. Returns o [B, T, H, V] float64 and, with output_states, the state after each node
    [B, T, H, K, V] float64.
    """
    check_mode(mode)
    Bn, T, H, K, V = _check(q, k, v, decay, initial_state)
    rows = parent_rows(parents, Bn, T)
    q, k, v, lam = (t.detach().to("cpu", F64) for t in (q, k, v, decay))
    S0 = initial_state.detach().to("cpu", F64)
    o = torch.zeros(Bn, T, H, V, dtype=F64)
    states = torch.zeros(Bn, T, H, K, V, dtype=F64) if output_states else None
    for b in range(Bn):
        for h in range(H):
            after = []  # after[n]: head h's state after node n [K, V]
            for t in range(T):
                p = predecessor(rows[b], t, mode)
                S = S0[b, h].clone() if p < 0 else after[p]
                S = lam[h] * S + torch.outer(k[b, t, h], v[b, t, h])
                after.append(S)
                o[b, t, h] = (S * q[b, t, h][:, None]).sum(0)
                if states is not None:
                    states[b, t, h] = S
    return (o, states) if output_states else o


def lightning_tree_commit(k, v, *, decay, parents, accepted, initial_state):
    """State after accepting the path root..accepted[b], recomputed along that path alone: [B, H, K, V] float64."""
    Bn, T, H, K, V = _check(None, k, v, decay, initial_state)
    rows = parent_rows(parents, Bn, T)
    k, v, lam = (t.detach().to("cpu", F64) for t in (k, v, decay))
    out = initial_state.detach().to("cpu", F64).clone()
    for b in range(Bn):
        a = int(accepted[b])
        if not 0 <= a < T:
            raise ValueError(f"accepted: sequence {b} node {a} is outside 0..{T - 1}")
        for n in history(rows[b], a, "exact"):
            for h in range(H):
                out[b, h] = lam[h] * out[b, h] + torch.outer(k[b, n, h], v[b, n, h])
    return out
