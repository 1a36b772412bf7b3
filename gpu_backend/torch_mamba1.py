"""Pure-PyTorch Mamba1 (selective scan) tree ops, batched over sequences and channels; the recurrence
steps over the nodes in index order, each node reading its source state (its parent's for "exact", the
previous node's for "leaky"). Twins: oracle.mamba1_tree_verify, oracle.mamba1_tree_commit.
"""
from __future__ import annotations

import torch

from ddsim.gpu_backend.checks import check_accepted, check_mamba1, check_parents, mamba1_dt, path_to, source_parents


def mamba1_tree_verify(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, parents, initial_state,
                       mode="exact", output_states=False):
    """x [B, T, I]; dt [B, T, I] raw; A [I, N]; B, C [B, T, N]; D, dt_bias [I]; parents [B, T] or a TreePlan;
    initial_state [B, I, N] float32 (read, never written). Returns y [B, T, I] in x's dtype and, with
    output_states, the state after each node [B, T, I, N]."""
    Bn, T, I, N = check_mamba1(x, dt, A, B, C, D, dt_bias, initial_state)
    src = source_parents(parents, Bn, T, x.device, mode)  # [B, T]
    f = initial_state.dtype
    d = mamba1_dt(dt, dt_bias, dt_softplus, f)  # [B, T, I]
    decay = torch.exp(d[..., None] * A.to(f))  # [B, T, I, N]
    inject = (d * x.to(f))[..., None] * B.to(f)[:, :, None, :]  # [B, T, I, N]: dt x B
    # NaN-poisoned so that a node the loop failed to write cannot pass a comparison
    states = torch.full((Bn, T, I, N), float("nan"), dtype=f, device=x.device)
    bidx = torch.arange(Bn, device=x.device)
    for t in range(T):
        s = src[:, t]
        prev = torch.where((s < 0)[:, None, None], initial_state, states[bidx, s.clamp(min=0)])  # [B, I, N]
        states[:, t] = decay[:, t] * prev + inject[:, t]
    y = torch.einsum("btin,btn->bti", states, C.to(f))
    if D is not None:
        y = y + D.to(f) * x.to(f)
    y = y.to(x.dtype)
    return (y, states) if output_states else y


def mamba1_tree_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, parents, accepted, initial_state):
    """State after the accepted path root..accepted[b]: a new [B, I, N] tensor (input untouched)."""
    Bn, T, I, N = check_mamba1(x, dt, A, B, None, None, dt_bias, initial_state)
    p = check_parents(parents, Bn, T, x.device)
    acc = check_accepted(accepted, Bn, T, x.device)
    out = initial_state.clone()
    f = out.dtype
    d = mamba1_dt(dt, dt_bias, dt_softplus, f)
    xs, Bf, Af = x.to(f), B.to(f), A.to(f)
    for b in range(Bn):
        for n in path_to(p[b], int(acc[b])):
            out[b] = torch.exp(d[b, n, :, None] * Af) * out[b] + (d[b, n] * xs[b, n])[:, None] * Bf[b, n][None, :]
    return out
