"""Pure-PyTorch tree ops, batched over sequences and heads; the recurrence steps over nodes in
index order (topological), each node reading its source state: its parent's ("exact") or the
previous node's ("leaky"). A leaky pass is exactly an exact pass over the chain parents
[-1, 0, 1, ..., T-2], which is how both modes share one code path here.

Twins: oracle.gdn_tree_verify, oracle.gdn_tree_commit, oracle.tree_causal_conv1d,
oracle.conv_tree_commit.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MODES = ("exact", "leaky")


# ---- input checks ------------------------------------------------------------------------------
def _check_parents(parents, B: int, T: int, device) -> torch.Tensor:
    p = torch.as_tensor(parents, device=device)
    if p.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"parents: expected an integer tensor, got {p.dtype}")
    if tuple(p.shape) != (B, T):
        raise ValueError(f"parents: expected [B, T] = {(B, T)}, got {tuple(p.shape)}")
    p = p.long()
    if T:
        idx = torch.arange(T, device=p.device)
        bad_root = p[:, 0] != -1
        bad = (p[:, 1:] < 0) | (p[:, 1:] >= idx[1:])
        if bad_root.any():
            b = int(bad_root.nonzero()[0, 0])
            raise ValueError(f"parents: sequence {b} node 0 must have parent -1, got {int(p[b, 0])}")
        if bad.any():
            b, i = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"parents: sequence {b} node {i + 1}: parent {int(p[b, i + 1])} is not an earlier node")
    return p


def _check_accepted(accepted, B: int, T: int, device) -> torch.Tensor:
    """accepted: one node index per sequence, [B] in 0..T-1."""
    acc = torch.as_tensor(accepted, device=device).long().reshape(-1)
    if acc.numel() != B or ((acc < 0) | (acc >= T)).any():
        raise ValueError(f"accepted: expected [B] = [{B}] node indices in 0..{T - 1}, got {acc.tolist()}")
    return acc


def _mode_parents(p: torch.Tensor, mode: str) -> torch.Tensor:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if mode == "exact":
        return p
    T = p.shape[1]
    return (torch.arange(T, device=p.device) - 1).expand_as(p)


def _check_inputs(q, k, v, g, beta):
    """Shapes and dtypes of q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV] -> (B, T, H, HV, K, V)."""
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q, k: expected equal shapes [B, T, H, K], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected [B, T, HV, V] with B={B}, T={T}, got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"v: HV={HV} value heads is not a multiple of H={H} key heads")
    for name, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != (B, T, HV):
            raise ValueError(f"{name}: expected [B, T, HV] = {(B, T, HV)}, got {tuple(x.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not x.is_floating_point():
            raise ValueError(f"{name}: expected a floating dtype, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, q is on {q.device}")
    return B, T, H, HV, K, V


def _check_state(initial_state, B, HV, K, V):
    if tuple(initial_state.shape) != (B, HV, K, V):
        raise ValueError(f"initial_state: expected [B, HV, K, V] = {(B, HV, K, V)}, got {tuple(initial_state.shape)}")
    if initial_state.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"initial_state: expected float32 (or float64), got {initial_state.dtype}")


def _check_gdn(q, k, v, g, beta, initial_state):
    dims = _check_inputs(q, k, v, g, beta)
    B, T, H, HV, K, V = dims
    _check_state(initial_state, B, HV, K, V)
    return dims


def resolve_gates(g, beta, a, b, A_log, dt_bias):
    """(g, beta) as given, or fused from (a, b, A_log, dt_bias):
    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)."""
    if g is not None:
        if beta is None:
            raise ValueError("beta: required with g")
        return g, beta
    if any(x is None for x in (a, b, A_log, dt_bias)):
        raise ValueError("gates: pass g and beta, or all of a, b, A_log and dt_bias")
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def pool_slots(pool, state_indices, B: int, name: str, rows: str) -> torch.Tensor:
    """int32 [B] rows of pool [N, ...] holding the batch: its first B rows when state_indices is
    None (then N must be B), else state_indices [B], distinct and in 0..N-1."""
    N = pool.shape[0]
    if state_indices is None:
        if N != B:
            raise ValueError(f"{name}: {N} {rows} for {B} sequences; pass state_indices to address a pool")
        return torch.arange(B, dtype=torch.int32, device=pool.device)
    idx = torch.as_tensor(state_indices, device=pool.device)
    if idx.dtype not in (torch.int32, torch.int64) or tuple(idx.shape) != (B,):
        raise ValueError(f"state_indices: expected [B] = [{B}] integers, got {tuple(idx.shape)} {idx.dtype}")
    if ((idx < 0) | (idx >= N)).any():
        raise ValueError(f"state_indices: slots must lie in 0..{N - 1}")
    if idx.unique().numel() != B:
        raise ValueError("state_indices: slots must be distinct")
    return idx.to(torch.int32).contiguous()


def resolve_state(initial_state, state_indices, B: int):
    """The committed states of the batch: initial_state itself, or the pool slots state_indices
    (checked as the Triton backend checks them)."""
    if state_indices is None:
        return initial_state
    return initial_state[pool_slots(initial_state, state_indices, B, "initial_state", "states").long()]


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
    g, beta = resolve_gates(g, beta, a, b, A_log, dt_bias)
    initial_state = resolve_state(initial_state, state_indices, q.shape[0])
    B, T, H, HV, K, V = _check_gdn(q, k, v, g, beta, initial_state)
    src = _mode_parents(_check_parents(parents, B, T, q.device), mode)  # [B, T]
    dt = initial_state.dtype
    scale = K ** -0.5 if scale is None else float(scale)
    qe = _prep_qk(q, HV, use_qk_l2norm, dt) * scale  # [B, T, HV, K]
    ke = _prep_qk(k, HV, use_qk_l2norm, dt)  # [B, T, HV, K]
    vv, alpha, bb = v.to(dt), torch.exp(g.to(dt)), beta.to(dt)
    # NaN-poisoned so that a node the loop failed to write cannot pass a comparison
    states = torch.full((B, T, HV, K, V), float("nan"), dtype=dt, device=q.device)  # per-node snapshots
    o = torch.full((B, T, HV, V), float("nan"), dtype=dt, device=q.device)
    bidx = torch.arange(B, device=q.device)
    for t in range(T):
        s = src[:, t]  # [B]
        prev = states[bidx, s.clamp(min=0)]  # [B, HV, K, V]
        prev = torch.where((s < 0)[:, None, None, None], initial_state, prev)
        S = alpha[:, t, :, None, None] * prev
        kt = ke[:, t]  # [B, HV, K]
        u = bb[:, t, :, None] * (vv[:, t] - torch.einsum("bhk,bhkv->bhv", kt, S))  # [B, HV, V]
        S = S + kt[..., None] * u[:, :, None, :]
        states[:, t] = S
        o[:, t] = torch.einsum("bhk,bhkv->bhv", qe[:, t], S)
    o = o.to(v.dtype)
    return (o, states) if output_states else o


def gdn_tree_commit(k, v, g, beta, *, parents, accepted, initial_state, use_qk_l2norm=True):
    """State after the accepted path root..accepted[b], without per-node snapshots.

    k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; parents: [B, T]; accepted: [B];
    initial_state: [B, HV, K, V]. Returns a new [B, HV, K, V] tensor (input untouched).
    """
    B, T, H, HV, K, V = _check_gdn(k, k, v, g, beta, initial_state)
    p = _check_parents(parents, B, T, k.device)
    acc = _check_accepted(accepted, B, T, k.device)
    dt = initial_state.dtype
    ke = _prep_qk(k, HV, use_qk_l2norm, dt)
    out = initial_state.clone()
    for b in range(B):
        path, n = [], int(acc[b])
        while n >= 0:
            path.append(n)
            n = int(p[b, n])
        S = out[b]
        for n in reversed(path):
            S = torch.exp(g[b, n].to(dt))[:, None, None] * S
            u = beta[b, n].to(dt)[:, None] * (v[b, n].to(dt) - torch.einsum("hk,hkv->hv", ke[b, n], S))
            S = S + ke[b, n][..., None] * u[:, None, :]
        out[b] = S
    return out


# ---- causal conv1d -----------------------------------------------------------------------------
def _conv_sources(src: torch.Tensor, W: int) -> torch.Tensor:
    """[B, T, W] indices into cat(window [W-1], nodes [T]) of each node's inputs, oldest first.

    Lag l walks l steps up the source chain; past the root it continues into the committed window
    (newest at W-2).
    """
    B, T = src.shape
    cur = torch.arange(T, device=src.device).expand(B, T).clone()  # node at current lag, or <0
    over = torch.zeros(B, T, dtype=torch.long, device=src.device)  # steps taken past the root
    cols = [cur + (W - 1)]
    for _ in range(1, W):
        inside = cur >= 0
        nxt = torch.where(inside, src.gather(1, cur.clamp(min=0)), cur)
        over = torch.where(inside & (nxt >= 0), over, over + 1)
        cur = torch.where(inside, nxt, cur)
        cols.append(torch.where(cur >= 0, cur + (W - 1), (W - 1) - over))
    return torch.stack(cols[::-1], dim=-1)


def _check_conv(x, weight, initial_window, parents, mode, activation, *, pooled: bool):
    """Shapes of x [B, T, C], weight [C, W] and the committed windows ([B, C, W-1], or a pool
    [N, C, W-1] when pooled), the activation and the mode -> (B, T, C, W, source parents [B, T])."""
    if x.dim() != 3:
        raise ValueError(f"x: expected [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    if weight.dim() != 2 or weight.shape[0] != C:
        raise ValueError(f"weight: expected [C, W] with C={C}, got {tuple(weight.shape)}")
    W = weight.shape[1]
    lead = initial_window.shape[0] if pooled and initial_window.dim() == 3 else B
    if tuple(initial_window.shape) != (lead, C, W - 1):
        want = f"[N, C, W-1] = [N, {C}, {W - 1}]" if pooled else f"[B, C, W-1] = {(B, C, W - 1)}"
        raise ValueError(f"initial_window: expected {want}, got {tuple(initial_window.shape)}")
    if activation not in ("silu", None):
        raise ValueError(f"activation: expected 'silu' or None, got {activation!r}")
    return B, T, C, W, _mode_parents(_check_parents(parents, B, T, x.device), mode)


def tree_causal_conv1d(x, *, weight, bias=None, parents, initial_window, mode="exact",
                       activation="silu", output_windows=False):
    """Depthwise causal conv over a tree. x: [B, T, C]; weight: [C, W]; bias: [C] or None;
    initial_window: [B, C, W-1] (oldest first). Returns out [B, T, C] and, with output_windows,
    the window after each node [B, T, C, W-1]."""
    B, T, C, W, src = _check_conv(x, weight, initial_window, parents, mode, activation, pooled=False)
    idx = _conv_sources(src, W)  # [B, T, W]
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
    B, T, C = x.shape
    W = initial_window.shape[-1] + 1
    p = _check_parents(parents, B, T, x.device)
    acc = _check_accepted(accepted, B, T, x.device)
    idx = _conv_sources(p, W)[torch.arange(B, device=x.device), acc]  # [B, W]
    buf = torch.cat([initial_window.transpose(1, 2).to(x.dtype), x], dim=1)
    return buf[torch.arange(B, device=x.device)[:, None], idx[:, 1:]].transpose(1, 2).contiguous()


# ---- attention ---------------------------------------------------------------------------------
def tree_attention(q, k, v, *, prefix_k, prefix_v, ancestor_mask, scale=None):
    """Tree attention over a committed KV prefix (PyTorch SDPA with a boolean mask).

    q: [T, nh, hd]; k, v: [T, nkv, hd] (already rotated); prefix_k, prefix_v: [P, nkv, hd];
    ancestor_mask: [T, T] bool (M[i, j]: j on root..i). Returns [T, nh, hd].
    """
    T, nh, hd = q.shape
    nkv, P = k.shape[1], prefix_k.shape[0]
    K = torch.cat([prefix_k.to(q.dtype), k], 0).transpose(0, 1)  # [nkv, P+T, hd]
    Vv = torch.cat([prefix_v.to(q.dtype), v], 0).transpose(0, 1)
    K = K.repeat_interleave(nh // nkv, dim=0)  # [nh, P+T, hd]
    Vv = Vv.repeat_interleave(nh // nkv, dim=0)
    mask = torch.cat([torch.ones(T, P, dtype=torch.bool, device=q.device),
                      torch.as_tensor(ancestor_mask, device=q.device)], dim=1)  # [T, P+T]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), K, Vv, attn_mask=mask,
                                         scale=scale if scale is not None else 1.0 / math.sqrt(hd))
    return out.transpose(0, 1)
