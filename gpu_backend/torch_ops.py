"""Pure-PyTorch tree ops, batched over sequences and heads; the recurrence steps over nodes in
index order (topological), each node reading its source state: its parent's ("exact") or the
previous node's ("leaky"). A leaky pass is exactly an exact pass over the chain parents
[-1, 0, 1, ..., T-2], which is how both modes share one code path here. With the sources on the
host (a CPU plan) the GDN recurrence steps a whole depth level of the source tree at a time (the
same arithmetic per node, a level's nodes batched: a tree of depth D takes D + 1 steps, a chain
one per node), reading a source every sequence shares as a view.

Twins: oracle.gdn_tree_verify, oracle.gdn_tree_commit, oracle.tree_causal_conv1d,
oracle.conv_tree_commit.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ddsim.gpu_backend.checks import (
    check_accepted,
    check_ancestor_mask,
    check_conv,
    check_conv_commit,
    check_gdn,
    check_gdn_args,
    check_parents,
    check_prefix_rows,
    conv_sources,
    conv_table,
    gate_values,
    path_to,
    resolve_gates,
    resolve_state,
    source_parents,
)


# ---- input checks ------------------------------------------------------------------------------
def _prep_qk(x, HV, use_l2norm, dt):
    """[B, T, H, K] -> [B, T, HV, K] in the state dtype, l2-normalised, heads repeated for groups."""
    x = x.to(dt)
    if use_l2norm:
        x = x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    return x.repeat_interleave(HV // x.shape[2], dim=2)


# ---- Gated DeltaNet ----------------------------------------------------------------------------
def gdn_tree_verify(q, k, v, g=None, beta=None, *, parents, initial_state, mode="exact", scale=None,
                    use_qk_l2norm=True, output_states=False, state_indices=None, a=None, b=None, A_log=None,
                    dt_bias=None):
    """Tree verification of one GDN layer.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; parents: [B, T] int;
    initial_state: [B, HV, K, V] float32 (or a pool [N, HV, K, V] with state_indices [B]).
    Gates from (g, beta) or fused from (a, b, A_log, dt_bias). Returns o [B, T, HV, V] in v's
    dtype and, with output_states, the state after every node [B, T, HV, K, V] in the state dtype.
    """
    check_gdn_args(q, k, v, g, beta, a, b)  # the gates' inputs as given, before they are made (and broadcast)
    g, beta = resolve_gates(g, beta, a, b, A_log, dt_bias)
    initial_state = resolve_state(initial_state, state_indices, q.shape[0], pads=True)  # a padded row: a zero state
    B, T, H, HV, K, V = check_gdn(q, k, v, g, beta, initial_state)
    src = source_parents(parents, B, T, q.device, mode)  # [B, T]
    dt = initial_state.dtype
    scale = K ** -0.5 if scale is None else float(scale)
    qe = _prep_qk(q, HV, use_qk_l2norm, dt) * scale  # [B, T, HV, K]
    ke = _prep_qk(k, HV, use_qk_l2norm, dt)  # [B, T, HV, K]
    vv, alpha, bb = v.to(dt), torch.exp(g.to(dt)), beta.to(dt)
    # NaN-poisoned so that a node the loop failed to write cannot pass a comparison
    states = torch.full((B, T, HV, K, V), float("nan"), dtype=dt, device=q.device)  # per-node snapshots
    o = torch.full((B, T, HV, V), float("nan"), dtype=dt, device=q.device)
    if src.device.type == "cpu":  # sources on the host: whole depth levels at once, no per-node gathers
        rows = src.tolist()
        groups = [(slice(None), rows[0])] if all(r == rows[0] for r in rows) else \
            [(slice(b, b + 1), r) for b, r in enumerate(rows)]
        for rs, srcs in groups:
            for nodes in _levels(srcs):
                step = _gdn_level_step if len(nodes) > 1 else _gdn_node_step
                step(nodes, [srcs[n] for n in nodes], rs=rs, states=states, o=o, initial_state=initial_state,
                     alpha=alpha, ke=ke, qe=qe, vv=vv, bb=bb)
    else:
        bidx = torch.arange(B, device=q.device)
        for t in range(T):
            s = src[:, t]  # [B]
            prev = states[bidx, s.clamp(min=0)]  # [B, HV, K, V]
            prev = torch.where((s < 0)[:, None, None, None], initial_state, prev)
            states[:, t], o[:, t] = _delta_rule(prev, alpha[:, t], ke[:, t], qe[:, t], vv[:, t], bb[:, t])
    o = o.to(v.dtype)
    return (o, states) if output_states else o


def _levels(srcs: list) -> list:
    """The nodes of one tree by depth of their source chains, shallowest first: each level's nodes read sources of
    earlier levels only, so a level runs as one batch (a chain: one node a level)."""
    depth, levels = [], {}
    for n, p in enumerate(srcs):
        depth.append(0 if p < 0 else depth[p] + 1)
        levels.setdefault(depth[-1], []).append(n)
    return [levels[d] for d in sorted(levels)]


def _delta_rule(prev, a, kt, qt, vt, bt):
    """One gated delta-rule step on any leading dims [...]: prev [..., HV, K, V], gates a, bt [..., HV], kt, qt
    [..., HV, K], vt [..., HV, V] -> (the node's state [..., HV, K, V], its output [..., HV, V])."""
    S = a[..., None, None] * prev
    u = bt[..., None] * (vt - (kt[..., None, :] @ S)[..., 0, :])
    S = S + kt[..., None] * u[..., None, :]
    return S, (qt[..., None, :] @ S)[..., 0, :]


def _gdn_node_step(nodes, srcs, *, rs, states, o, initial_state, alpha, ke, qe, vv, bb):
    """One node t of the sequences rs (their shared source srcs[0]) into states / o [b, T, ...] in place."""
    t, p = nodes[0], srcs[0]
    prev = initial_state[rs] if p < 0 else states[rs, p]  # [b, HV, K, V]
    states[rs, t], o[rs, t] = _delta_rule(prev, alpha[rs, t], ke[rs, t], qe[rs, t], vv[rs, t], bb[rs, t])


def _gdn_level_step(nodes, srcs, *, rs, states, o, initial_state, alpha, ke, qe, vv, bb):
    """The m nodes of one level of the sequences rs, each from its own source (all earlier), batched over the level."""
    idx = torch.tensor(nodes, device=states.device)
    sp = torch.tensor(srcs, device=states.device)
    prev = states[rs][:, sp.clamp(min=0)]  # [b, m, HV, K, V]
    if min(srcs) < 0:
        prev = torch.where((sp < 0)[None, :, None, None, None], initial_state[rs][:, None], prev)
    states[rs, idx], o[rs, idx] = _delta_rule(prev, alpha[rs][:, idx], ke[rs][:, idx], qe[rs][:, idx], vv[rs][:, idx],
                                              bb[rs][:, idx])


def gdn_tree_commit(k, v, g, beta, *, parents, accepted, initial_state, use_qk_l2norm=True):
    """State after the accepted path root..accepted[b], without per-node snapshots.

    k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; parents: [B, T]; accepted: [B];
    initial_state: [B, HV, K, V]. Returns a new [B, HV, K, V] tensor (input untouched).
    """
    B, T, H, HV, K, V = check_gdn(k, k, v, g, beta, initial_state)
    p = check_parents(parents, B, T, k.device)
    acc = check_accepted(accepted, B, T, k.device)
    dt = initial_state.dtype
    ke = _prep_qk(k, HV, use_qk_l2norm, dt)
    out = initial_state.clone()
    for b in range(B):
        S = out[b]
        for n in path_to(p[b], int(acc[b])):
            S = torch.exp(g[b, n].to(dt))[:, None, None] * S
            u = beta[b, n].to(dt)[:, None] * (v[b, n].to(dt) - torch.einsum("hk,hkv->hv", ke[b, n], S))
            S = S + ke[b, n][..., None] * u[:, None, :]
        out[b] = S
    return out


# ---- causal conv1d -----------------------------------------------------------------------------
def tree_causal_conv1d(x, *, weight, bias=None, parents, initial_window, mode="exact",
                       activation="silu", output_windows=False):
    """Depthwise causal conv over a tree. x: [B, T, C]; weight: [C, W]; bias: [C] or None;
    initial_window: [B, C, W-1] (oldest first). Returns out [B, T, C] and, with output_windows,
    the window after each node [B, T, C, W-1]."""
    B, T, C, W, src = check_conv(x, weight, initial_window, parents, mode, activation, pooled=False, bias=bias)
    idx = conv_table(parents, src, W, mode).long()  # [B, T, W]
    buf = torch.cat([initial_window.transpose(1, 2).to(x.dtype), x], dim=1)  # [B, W-1+T, C]
    gathered = buf[torch.arange(B, device=x.device)[:, None, None], idx]  # [B, T, W, C]
    y = torch.einsum("btwc,cw->btc", gathered, weight.to(x.dtype))
    if bias is not None:
        y = y + bias.to(x.dtype)
    out = F.silu(y) if activation == "silu" else y
    if output_windows:
        return out, gathered[:, :, 1:, :].transpose(2, 3).contiguous()
    return out


def conv_tree_commit(x, *, parents, accepted, initial_window):
    """Window after accepting root..accepted[b]. x: [B, T, C] -> [B, C, W-1]."""
    B, T, C, W = check_conv_commit(x, initial_window, pooled=False)
    p = check_parents(parents, B, T, x.device)
    acc = check_accepted(accepted, B, T, x.device)
    idx = conv_sources(p, W)[torch.arange(B, device=x.device), acc]  # [B, W]
    buf = torch.cat([initial_window.transpose(1, 2).to(x.dtype), x], dim=1)
    return buf[torch.arange(B, device=x.device)[:, None], idx[:, 1:]].transpose(1, 2).contiguous()


# ---- attention ---------------------------------------------------------------------------------
def tree_attention(q, k, v, *, prefix_k, prefix_v, ancestor_mask, scale=None, prefix_rows=None):
    """Tree attention over a committed KV prefix (PyTorch SDPA with a boolean mask).

    q: [T, nh, hd]; k, v: [T, nkv, hd] (already rotated); prefix_k, prefix_v: [P, nkv, hd];
    ancestor_mask: [T, T] bool (M[i, j]: j on root..i), every prefix row attended; or [T, P + T], the
    mask over prefix and tree together (a fixed-capacity prefix whose unused rows are masked out, as
    ddsim.model.graphs keeps it); prefix_rows (None, or an integer tensor of one element): the prefix rows at
    or past it are not visible either. Returns [T, nh, hd].
    """
    T, nh, hd = q.shape
    nkv, P = k.shape[1], prefix_k.shape[0]
    K = torch.cat([prefix_k.to(q.dtype), k], 0).transpose(0, 1)  # [nkv, P+T, hd]
    Vv = torch.cat([prefix_v.to(q.dtype), v], 0).transpose(0, 1)
    K = K.repeat_interleave(nh // nkv, dim=0)  # [nh, P+T, hd]
    Vv = Vv.repeat_interleave(nh // nkv, dim=0)
    mask = torch.as_tensor(ancestor_mask, device=q.device)
    check_ancestor_mask(mask, T, P)
    if tuple(mask.shape) == (T, T) and P:
        mask = torch.cat([torch.ones(T, P, dtype=torch.bool, device=q.device), mask], dim=1)  # [T, P+T]
    check_prefix_rows(prefix_rows)
    if prefix_rows is not None and P:  # on the device: no host sync
        cols = torch.arange(P + T, device=q.device)
        mask = mask & ((cols >= P) | (cols < prefix_rows.reshape(()).to(q.device)))
    out = F.scaled_dot_product_attention(q.transpose(0, 1), K, Vv, attn_mask=mask,
                                         scale=scale if scale is not None else 1.0 / math.sqrt(hd))
    return out.transpose(0, 1)


# ---- the layers' glue (twins: triton_norms) ----------------------------------------------------
def rms_norm(x, weight, *, eps: float, residual=None):
    """RMSNorm over the last dim in float32, rounded to x's dtype, times weight (rounded again): x [..., D]
    -> [..., D]. With residual: h = x + residual (in x's dtype) first, and (normed h, h) is returned."""
    h = x if residual is None else x + residual
    out = F.rms_norm(h.float(), (h.shape[-1],), eps=eps).to(h.dtype) * weight
    return out if residual is None else (out, h)


def rope(x, cos, sin):
    """x [n, heads, D] with its first ROT dims rotated (rotate-half) by cos, sin [n, ROT] in x's dtype."""
    rot = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)


def rms_norm_rope(x, weight, cos, sin, *, eps: float):
    """rope(rms_norm(x, weight), cos, sin): a q or k per head [n, heads, D], normed over D, then rotated."""
    return rope(rms_norm(x, weight, eps=eps), cos, sin)


def gated_rms_norm(x, weight, gate, *, eps: float):
    """x [N, heads, D] normed over D (as rms_norm) times silu(gate) (gate [N, heads * D], rounded to the dtype)."""
    return rms_norm(x, weight, eps=eps) * F.silu(gate).reshape(x.shape)


def gated_act(gate, up, *, act: str):
    """act(gate) * up (SwiGLU with act "silu", GeGLU with "gelu", F.gelu's erf form, a sigmoid gate with
    "sigmoid"), in gate's dtype."""
    return {"gelu": F.gelu, "sigmoid": torch.sigmoid, "silu": F.silu}[act](gate) * up


def gdn_gates(a, b, *, A, dt_bias, beta_scale: float = 1.0):
    """GDN's gates from the raw projections a, b [N, HV]: g = A softplus(a + dt_bias) (A = -exp(A_log)),
    beta = sigmoid(b) beta_scale, both [N, HV] float32."""
    g, beta = gate_values(a, b, A=A, dt_bias=dt_bias)
    return g, (beta if beta_scale == 1.0 else beta * beta_scale)
