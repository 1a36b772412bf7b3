"""Pure-PyTorch lightning-attention tree ops (MiniMax's linear attention with a constant per-head decay), batched
over sequences and heads; the recurrence steps over the nodes in index order, each node reading its source state
(its parent's for "exact", the previous node's for "leaky"). Twins: oracle.lightning_tree_verify,
oracle.lightning_tree_commit.
"""
from __future__ import annotations

import torch

from ddsim.gpu_backend.checks import check_accepted, check_lightning, check_parents, path_to, source_parents


def lightning_tree_verify(q, k, v, *, decay, parents, initial_state, mode="exact", output_states=False):
    """q, k [B, T, H, K]; v [B, T, H, V]; decay [H] (lambda); parents [B, T] or a TreePlan; initial_state
    [B, H, K, V] float32 (read, never written). Returns o [B, T, H, V] in q's dtype and, with output_states, the
    state after each node [B, T, H, K, V]."""
    Bn, T, H, K, V = check_lightning(q, k, v, decay, initial_state)
    src = source_parents(parents, Bn, T, q.device, mode)  # [B, T]
    f = initial_state.dtype
    lam = decay.to(f)[None, :, None, None]  # [1, H, 1, 1]
    kv = torch.einsum("bthk,bthv->bthkv", k.to(f), v.to(f))  # [B, T, H, K, V]
    # NaN-poisoned so that a node the loop failed to write cannot pass a comparison
    states = torch.full((Bn, T, H, K, V), float("nan"), dtype=f, device=q.device)
    bidx = torch.arange(Bn, device=q.device)
    for t in range(T):
        s = src[:, t]
        prev = torch.where((s < 0)[:, None, None, None], initial_state, states[bidx, s.clamp(min=0)])  # [B, H, K, V]
        states[:, t] = lam * prev + kv[:, t]
    o = torch.einsum("bthkv,bthk->bthv", states, q.to(f)).to(q.dtype)
    return (o, states) if output_states else o


def lightning_tree_commit(k, v, *, decay, parents, accepted, initial_state):
    """State after the accepted path root..accepted[b]: a new [B, H, K, V] tensor (input untouched)."""
    Bn, T, H, K, V = check_lightning(None, k, v, decay, initial_state)
    p = check_parents(parents, Bn, T, k.device)
    acc = check_accepted(accepted, Bn, T, k.device)
    out = initial_state.clone()
    f = out.dtype
    lam = decay.to(f)[:, None, None]
    kf, vf = k.to(f), v.to(f)
    for b in range(Bn):
        for n in path_to(p[b], int(acc[b])):
            out[b] = lam * out[b] + torch.einsum("hk,hv->hkv", kf[b, n], vf[b, n])
    return out
