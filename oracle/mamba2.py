"""Mamba2 (SSD) tree verification, the plain way: per node, per head, run the selective-state
recurrence token by token along the node's history (its root path for "exact", batch order for
"leaky"), starting from the committed state: each node one step from the state of the node before it in its
history (`_paths.predecessor`), the same operations as replaying the history from scratch. float64 throughout.

Per head h (group g = h // (H / G)), with S [P, N]:
    dt_t = clamp(softplus(dt_raw_t + dt_bias_h), *dt_limit)      (softplus only when dt_softplus)
    S_t  = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T                 x_t [P], B_t [N] of group g
    y_t  = S_t C_t + D_h x_t                                       C_t [N] of group g
"""
from __future__ import annotations

import math

import torch

from ddsim.oracle._paths import check_mode, history, parent_rows, predecessor
from ddsim.oracle._rounding import softplus_by_node
from ddsim.oracle._shapes import state_shape

F64 = torch.float64


def _check(x, dt, A, B, C, initial_state):
    if x.dim() != 4:
        raise ValueError(f"x: expected [B, T, H, P], got {tuple(x.shape)}")
    Bn, T, H, P = x.shape
    if tuple(dt.shape) != (Bn, T, H):
        raise ValueError(f"dt: expected [B, T, H] = {(Bn, T, H)}, got {tuple(dt.shape)}")
    if tuple(A.shape) != (H,):
        raise ValueError(f"A: expected [H] = [{H}], got {tuple(A.shape)}")
    if B.dim() != 4 or tuple(B.shape[:2]) != (Bn, T):
        raise ValueError(f"B: expected [B, T, G, N] with B={Bn}, T={T}, got {tuple(B.shape)}")
    G, N = B.shape[2], B.shape[3]
    if H % G:
        raise ValueError(f"B: H={H} heads is not a multiple of G={G} groups")
    if C is not None and C.shape != B.shape:
        raise ValueError(f"C: expected the shape of B {tuple(B.shape)}, got {tuple(C.shape)}")
    state_shape(initial_state, (Bn, H, P, N), "B, H, P, N")
    return Bn, T, H, P, G, N


def _dt(dt, dt_bias, dt_softplus, dt_limit):
    """The discretisation step per node and head [B, T, H] float64."""
    d = dt.detach().to("cpu", F64)
    if dt_bias is not None:
        d = d + dt_bias.detach().to("cpu", F64)
    if dt_softplus:
        d = softplus_by_node(d)  # a node's step the same bits in any batch
    lo, hi = dt_limit
    if lo > 0.0 or hi < math.inf:
        d = d.clamp(min=lo, max=hi)
    return d


def mamba2_tree_verify(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf),
                       parents, initial_state, mode="exact", output_states=False):
    """Reference tree verification of one Mamba2 SSM.

    x: [B, T, H, P]; dt: [B, T, H] (raw, before dt_bias and softplus); A: [H] (negative);
    B, C: [B, T, G, N]; D, dt_bias: [H] or None; parents: [B, T]; initial_state: [B, H, P, N].
    Returns y [B, T, H, P] float64 and, with output_states, the state after each node
    [B, T, H, P, N] float64.
    """
    check_mode(mode)
    Bn, T, H, P, G, N = _check(x, dt, A, B, C, initial_state)
    rows = parent_rows(parents, Bn, T)
    d = _dt(dt, dt_bias, dt_softplus, dt_limit)
    x, A, B, C = (t.detach().to("cpu", F64) for t in (x, A, B, C))
    Dv = None if D is None else D.detach().to("cpu", F64)
    S0 = initial_state.detach().to("cpu", F64)
    heads_per_group = H // G
    y = torch.zeros(Bn, T, H, P, dtype=F64)
    states = torch.zeros(Bn, T, H, P, N, dtype=F64) if output_states else None
    for b in range(Bn):
        for h in range(H):
            g = h // heads_per_group
            after = []  # after[n]: head h's state after node n [P, N]
            for t in range(T):
                p = predecessor(rows[b], t, mode)
                S = S0[b, h].clone() if p < 0 else after[p]
                S = torch.exp(d[b, t, h] * A[h]) * S + d[b, t, h] * torch.outer(x[b, t, h], B[b, t, g])
                after.append(S)
                y[b, t, h] = (S * C[b, t, g]).sum(-1)
                if Dv is not None:
                    y[b, t, h] = y[b, t, h] + Dv[h] * x[b, t, h]
                if states is not None:
                    states[b, t, h] = S
    return (y, states) if output_states else y


def mamba2_tree_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf), parents,
                       accepted, initial_state):
    """State after accepting the path root..accepted[b], recomputed along that path alone.

    x: [B, T, H, P]; dt: [B, T, H]; A: [H]; B: [B, T, G, N]; accepted: [B];
    initial_state: [B, H, P, N]. Returns [B, H, P, N] float64.
    """
    Bn, T, H, P, G, N = _check(x, dt, A, B, None, initial_state)
    rows = parent_rows(parents, Bn, T)
    d = _dt(dt, dt_bias, dt_softplus, dt_limit)
    x, A, B = (t.detach().to("cpu", F64) for t in (x, A, B))
    out = initial_state.detach().to("cpu", F64).clone()
    heads_per_group = H // G
    for b in range(Bn):
        a = int(accepted[b])
        if not 0 <= a < T:
            raise ValueError(f"accepted: sequence {b} node {a} is outside 0..{T - 1}")
        for n in history(rows[b], a, "exact"):
            for h in range(H):
                out[b, h] = (torch.exp(d[b, n, h] * A[h]) * out[b, h]
                             + d[b, n, h] * torch.outer(x[b, n, h], B[b, n, h // heads_per_group]))
    return out
