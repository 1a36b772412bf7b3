"""Pure-PyTorch Kimi Delta Attention (KDA) tree ops, batched over sequences and heads; the recurrence steps over the
nodes in index order, each node reading its source state (its parent's for "exact", the previous node's for
"leaky"). q and k are L2-normalised here (q scaled by K^-1/2), as the engines' kernels do with
use_qk_l2norm_in_kernel. Twins: oracle.kda_tree_verify, oracle.kda_tree_commit.
"""
from __future__ import annotations

import torch

from ddsim.gpu_backend.checks import check_accepted, check_kda, check_parents, path_to, source_parents


def _l2(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _step(S, k, v, g, beta):
    """S [..., K, V]; k [..., K] (normalised); v [..., V]; g [..., K]; beta [...] -> S_t."""
    S = torch.exp(g)[..., None] * S
    delta = beta[..., None] * (v - torch.einsum("...kv,...k->...v", S, k))
    return S + k[..., :, None] * delta[..., None, :]


def kda_tree_verify(q, k, v, g, beta, *, parents, initial_state, mode="exact", output_states=False):
    """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] (log decay per key channel); beta [B, T, H]; parents
    [B, T] or a TreePlan; initial_state [B, H, K, V] float32 (read, never written). Returns o [B, T, H, V] in
    v's dtype and, with output_states, the state after each node [B, T, H, K, V]."""
    Bn, T, H, K, V = check_kda(q, k, v, g, beta, initial_state)
    src = source_parents(parents, Bn, T, q.device, mode)  # [B, T]
    f = initial_state.dtype
    qf, kf = _l2(q.to(f)) * K ** -0.5, _l2(k.to(f))
    vf, gf, bf = v.to(f), g.to(f), beta.to(f)
    # NaN-poisoned so that a node the loop failed to write cannot pass a comparison
    states = torch.full((Bn, T, H, K, V), float("nan"), dtype=f, device=q.device)
    bidx = torch.arange(Bn, device=q.device)
    for t in range(T):
        s = src[:, t]
        prev = torch.where((s < 0)[:, None, None, None], initial_state, states[bidx, s.clamp(min=0)])  # [B, H, K, V]
        states[:, t] = _step(prev, kf[:, t], vf[:, t], gf[:, t], bf[:, t])
    o = torch.einsum("bthkv,bthk->bthv", states, qf).to(v.dtype)
    return (o, states) if output_states else o


def kda_tree_commit(k, v, g, beta, *, parents, accepted, initial_state):
    """State after the accepted path root..accepted[b]: a new [B, H, K, V] tensor (input untouched)."""
    Bn, T, H, K, V = check_kda(None, k, v, g, beta, initial_state)
    p = check_parents(parents, Bn, T, k.device)
    acc = check_accepted(accepted, Bn, T, k.device)
    out = initial_state.clone()
    f = out.dtype
    kf, vf, gf, bf = _l2(k.to(f)), v.to(f), g.to(f), beta.to(f)
    for b in range(Bn):
        for n in path_to(p[b], int(acc[b])):
            out[b] = _step(out[b], kf[b, n], vf[b, n], gf[b, n], bf[b, n])
    return out
