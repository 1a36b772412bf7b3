"""Mamba1 (selective scan, Jamba's mixer) tree verification, the plain way: per node, per channel, run the
recurrence token by token along the node's history (its root path for "exact", batch order for "leaky"),
starting from the committed state: each node one step from the state of the node before it in its history
(`_paths.predecessor`), the same operations as replaying the history from scratch. float64 throughout.

Per channel c, with S [N] (the state of one channel; A [I, N] is per channel and state index):
    dt_t = softplus(dt_raw_t + dt_bias_c)                (softplus only when dt_softplus)
    S_t  = exp(dt_t A_c) * S_{t-1} + dt_t x_t B_t        x_t a scalar, B_t [N] shared by every channel
    y_t  = S_t . C_t + D_c x_t                           C_t [N]
"""
from __future__ import annotations

import torch

from ddsim.oracle._paths import check_mode, history, parent_rows, predecessor
from ddsim.oracle._rounding import softplus_by_node
from ddsim.oracle._shapes import state_shape

F64 = torch.float64


def _check(x, dt, A, B, C, initial_state):
    if x.dim() != 3:
        raise ValueError(f"x: expected [B, T, I], got {tuple(x.shape)}")
    Bn, T, I = x.shape
    if tuple(dt.shape) != (Bn, T, I):
        raise ValueError(f"dt: expected [B, T, I] = {(Bn, T, I)}, got {tuple(dt.shape)}")
    if A.dim() != 2 or A.shape[0] != I:
        raise ValueError(f"A: expected [I, N] with I={I}, got {tuple(A.shape)}")
    N = A.shape[1]
    if tuple(B.shape) != (Bn, T, N):
        raise ValueError(f"B: expected [B, T, N] = {(Bn, T, N)}, got {tuple(B.shape)}")
    if C is not None and C.shape != B.shape:
        raise ValueError(f"C: expected the shape of B {tuple(B.shape)}, got {tuple(C.shape)}")
    state_shape(initial_state, (Bn, I, N), "B, I, N")
    return Bn, T, I, N


def _dt(dt, dt_bias, dt_softplus):
    """The discretisation step per node and channel [B, T, I] float64."""
    d = dt.detach().to("cpu", F64)
    if dt_bias is not None:
        d = d + dt_bias.detach().to("cpu", F64)
    return softplus_by_node(d) if dt_softplus else d  # a node's step the same bits in any batch


def mamba1_tree_verify(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, parents, initial_state,
                       mode="exact", output_states=False):
    """Reference tree verification of one Mamba1 selective scan.

    x: [B, T, I]; dt: [B, T, I] (raw, before dt_bias and softplus); A: [I, N] (negative); B, C: [B, T, N];
    D, dt_bias: [I] or None; parents: [B, T]; initial_state: [B, I, N].
    Returns y [B, T, I] float64 and, with output_states, the state after each node [B, T, I, N] float64.
    """
    check_mode(mode)
    Bn, T, I, N = _check(x, dt, A, B, C, initial_state)
    rows = parent_rows(parents, Bn, T)
    d = _dt(dt, dt_bias, dt_softplus)
    x, A, B, C = (t.detach().to("cpu", F64) for t in (x, A, B, C))
    Dv = None if D is None else D.detach().to("cpu", F64)
    S0 = initial_state.detach().to("cpu", F64)
    y = torch.zeros(Bn, T, I, dtype=F64)
    states = torch.zeros(Bn, T, I, N, dtype=F64) if output_states else None
    for b in range(Bn):
        after = []  # after[n]: the state after node n [I, N]
        for t in range(T):
            p = predecessor(rows[b], t, mode)
            S = (S0[b] if p < 0 else after[p]).clone()  # [I, N], stepped channel by channel in place
            for c in range(I):
                S[c] = torch.exp(d[b, t, c] * A[c]) * S[c] + d[b, t, c] * x[b, t, c] * B[b, t]
            after.append(S)
            for c in range(I):
                y[b, t, c] = (S[c] * C[b, t]).sum() + (0.0 if Dv is None else Dv[c] * x[b, t, c])
            if states is not None:
                states[b, t] = S
    return (y, states) if output_states else y


def mamba1_tree_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, parents, accepted, initial_state):
    """State after accepting the path root..accepted[b], recomputed along that path alone.

    x: [B, T, I]; dt: [B, T, I]; A: [I, N]; B: [B, T, N]; accepted: [B]; initial_state: [B, I, N].
    Returns [B, I, N] float64.
    """
    Bn, T, I, N = _check(x, dt, A, B, None, initial_state)
    rows = parent_rows(parents, Bn, T)
    d = _dt(dt, dt_bias, dt_softplus)
    x, A, B = (t.detach().to("cpu", F64) for t in (x, A, B))
    out = initial_state.detach().to("cpu", F64).clone()
    for b in range(Bn):
        a = int(accepted[b])
        if not 0 <= a < T:
            raise ValueError(f"accepted: sequence {b} node {a} is outside 0..{T - 1}")
        for n in history(rows[b], a, "exact"):
            for c in range(I):
                out[b, c] = torch.exp(d[b, n, c] * A[c]) * out[b, c] + d[b, n, c] * x[b, n, c] * B[b, n]
    return out
