"""Pure-PyTorch Mamba2 tree ops, batched over sequences and heads; the recurrence steps over the
nodes in index order, each node reading its source state (its parent's for "exact", the previous
node's for "leaky"). Twins: oracle.mamba2_tree_verify, oracle.mamba2_tree_commit.
"""
from __future__ import annotations

import math

import torch

from ddsim.gpu_backend.checks import (
    check_accepted,
    check_mamba2,
    check_mamba2_state,
    check_parents,
    mamba2_dt,
    path_to,
    source_parents,
)


def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    """[B, T, G, N] -> [B, T, H, N]: head h reads group h // (H / G)."""
    return t.repeat_interleave(H // t.shape[2], dim=2)


def mamba2_tree_verify(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf),
                       parents, initial_state, state_indices=None, mode="exact", output_states=False):
    """x [B, T, H, P]; dt [B, T, H]; A [H]; B, C [B, T, G, N]; D, dt_bias [H]; parents [B, T];
    initial_state [B, H, P, N] float32 (or a pool with state_indices [B]). Returns y [B, T, H, P]
    in x's dtype and, with output_states, the state after each node [B, T, H, P, N]."""
    Bn, T, H, P, G, N = check_mamba2(x, dt, A, B, C, D, dt_bias, dt_limit)
    slots = check_mamba2_state(initial_state, state_indices, Bn, H, P, N).long()
    S0 = initial_state[slots]  # [B, H, P, N]
    src = source_parents(parents, Bn, T, x.device, mode)  # [B, T]
    f = S0.dtype
    d = mamba2_dt(dt, dt_bias, dt_softplus, dt_limit, f)  # [B, T, H]
    decay = torch.exp(d * A.to(f))  # [B, T, H]
    xs, Bh, Ch = x.to(f), _heads(B.to(f), H), _heads(C.to(f), H)
    # NaN-poisoned so that a node the loop failed to write cannot pass a comparison
    states = torch.full((Bn, T, H, P, N), float("nan"), dtype=f, device=x.device)
    y = torch.full((Bn, T, H, P), float("nan"), dtype=f, device=x.device)
    bidx = torch.arange(Bn, device=x.device)
    for t in range(T):
        s = src[:, t]
        prev = torch.where((s < 0)[:, None, None, None], S0, states[bidx, s.clamp(min=0)])  # [B, H, P, N]
        S = decay[:, t, :, None, None] * prev + (d[:, t, :, None] * xs[:, t])[..., None] * Bh[:, t, :, None, :]
        states[:, t] = S
        y[:, t] = torch.einsum("bhpn,bhn->bhp", S, Ch[:, t])
    if D is not None:
        y = y + D.to(f)[:, None] * xs
    y = y.to(x.dtype)
    return (y, states) if output_states else y


def mamba2_tree_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf), parents,
                       accepted, initial_state, state_indices=None):
    """State after the accepted path root..accepted[b]: a new [B, H, P, N] tensor (input untouched)."""
    Bn, T, H, P, G, N = check_mamba2(x, dt, A, B, None, None, dt_bias, dt_limit)
    slots = check_mamba2_state(initial_state, state_indices, Bn, H, P, N).long()
    p = check_parents(parents, Bn, T, x.device)
    acc = check_accepted(accepted, Bn, T, x.device)
    out = initial_state[slots].clone()
    f = out.dtype
    d = mamba2_dt(dt, dt_bias, dt_softplus, dt_limit, f)
    xs, Bh = x.to(f), _heads(B.to(f), H)
    for b in range(Bn):
        for n in path_to(p[b], int(acc[b])):
            out[b] = (torch.exp(d[b, n] * A.to(f))[:, None, None] * out[b]
                      + (d[b, n, :, None] * xs[b, n])[..., None] * Bh[b, n, :, None, :])
    return out
