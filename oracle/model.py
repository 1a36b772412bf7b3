"""The model-level oracle: plain decoding, one token at a time, in float64 on the CPU (float32 when
run on a GPU for full-size models: ``device``/``dtype``, default from where the weights are). Weights
spread over several devices (a layer placement) are used where they are: each layer computes on its
own weights' device and the hidden state follows.

``verify_tree`` gives every node the state of its own root path, computing each node with one
decode step from its parent's exact state (parent-state reuse): by default scheduled layer by layer
over the whole tree (``verify_trees``: a layer's projections of every node at once, its conv,
recurrence and attention depth by depth, the nodes of one depth as one batch of rows, each its own
sequence), or one node at a time depth-first through ``decode_step`` (``order="node"``). Only one
layer's states of two depths (or the root path's) are alive unless ``record_states`` asks for every
node's state (for the leak metrics). Every layer is the same code in both schedules
(``_attention_proj``/``_core``/``_out``, ``_gdn_*``, ``_mamba2_*``, ``_mamba1*``, ``_lightning_*``,
``_kda_*``, ``_short_conv_*``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ddsim.model.state import ModelState, empty_state

F64 = torch.float64


def _rmsnorm(x, w, eps):
    """RMSNorm over the last dim of x [..., d]."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta, rot):
    """x [n, heads, hd]: each row's first ``rot`` dims rotated to its position pos [n] (rotate-half)."""
    inv = theta ** (-torch.arange(0, rot, 2, dtype=F64, device=x.device) / rot)  # [rot/2]
    ang = pos.to(F64)[:, None] * inv[None]  # [n, rot/2]
    cos = torch.cat([torch.cos(ang), torch.cos(ang)], -1).to(x.dtype)[:, None]  # [n, 1, rot]
    sin = torch.cat([torch.sin(ang), torch.sin(ang)], -1).to(x.dtype)[:, None]
    xr = x[..., :rot]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], dim=-1) * sin, x[..., rot:]], dim=-1)


def _attention_proj(w, p, cfg, x, pos):
    """Each row's query, key and value, x [n, d], pos [n] -> q [n, nh, hd], k, v [n, nkv, hd] (q/k
    norms and RoPE where the config has them)."""
    n = x.shape[0]
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if cfg.mla_kv_lora_rank:
        return _mla_proj(w, p, cfg, x, pos)
    rot = int(hd * cfg.partial_rotary_factor)
    q = x @ w[p + "attn.q"].T
    k = x @ w[p + "attn.k"].T
    if cfg.qk_norm_all:  # one norm over all heads
        q = _rmsnorm(q, w[p + "attn.q_norm"], cfg.rms_norm_eps)
        k = _rmsnorm(k, w[p + "attn.k_norm"], cfg.rms_norm_eps)
    q, k = q.view(n, nh, hd), k.view(n, nkv, hd)
    if cfg.qk_norm and not cfg.qk_norm_all:
        q = _rmsnorm(q, w[p + "attn.q_norm"], cfg.rms_norm_eps)  # per head, over hd
        k = _rmsnorm(k, w[p + "attn.k_norm"], cfg.rms_norm_eps)
    if cfg.use_rope:
        q = _rope(q, pos, cfg.rope_theta, rot)
        k = _rope(k, pos, cfg.rope_theta, rot)
    return q, k, (x @ w[p + "attn.v"].T).view(n, nkv, hd)


def _mla_proj(w, p, cfg, x, pos):
    """Multi-head latent attention's q, k, v of each row x [n, d] at positions pos [n], each [n, nh, hd] zero-padded
    from its own width (qk = nope + rope dims for q and k, v dims for v): q = x W_q (or W_qb norm(W_qa x)); the latent
    c = W_kva x splits into the part normed and expanded per head, W_kvb norm(c_lat) = [k_nope, v], and k_rope shared
    by every head. With RoPE (DeepSeek's decoupled RoPE) q's last rope dims and k_rope are rotated to the row's
    position, first regrouped from interleaved pairs into halves where the config lays them out so."""
    n, nh, hd = x.shape[0], cfg.num_attention_heads, cfg.head_dim
    nope, rope, vd, kvl = cfg.mla_qk_nope_head_dim, cfg.mla_qk_rope_head_dim, cfg.mla_v_head_dim, cfg.mla_kv_lora_rank
    if cfg.mla_q_lora_rank:
        q = _rmsnorm(x @ w[p + "attn.q_a"].T, w[p + "attn.q_a_norm"], cfg.mla_norm_eps) @ w[p + "attn.q_b"].T
    else:
        q = x @ w[p + "attn.q"].T
    q = q.view(n, nh, nope + rope)
    c = x @ w[p + "attn.kv_a"].T
    kv = (_rmsnorm(c[:, :kvl], w[p + "attn.kv_a_norm"], cfg.mla_norm_eps) @ w[p + "attn.kv_b"].T).view(n, nh, nope + vd)
    q_rope, k_rope = q[:, :, nope:], c[:, None, kvl:]  # [n, nh, rope], [n, 1, rope]
    if cfg.use_rope:
        if cfg.mla_rope_interleave:
            q_rope = torch.cat([q_rope[..., 0::2], q_rope[..., 1::2]], dim=-1)
            k_rope = torch.cat([k_rope[..., 0::2], k_rope[..., 1::2]], dim=-1)
        q_rope, k_rope = _rope(q_rope, pos, cfg.rope_theta, rope), _rope(k_rope, pos, cfg.rope_theta, rope)
    q = torch.cat([q[:, :, :nope], q_rope], dim=-1)
    k = torch.cat([kv[..., :nope], k_rope.expand(n, nh, rope)], dim=-1)
    pad = lambda t: F.pad(t, (0, hd - t.shape[-1]))  # noqa: E731
    return pad(q), pad(k), pad(kv[..., nope:])


def _attention_core(cfg, q, k, v, ctx_k, ctx_v, ctx_valid=None):
    """One token per row of causal GQA: q [n, nh, hd], k, v [n, nkv, hd]; ctx_k/ctx_v [n, m, nkv, hd]:
    each row's earlier visible tokens; ctx_valid [n, m] bool, or None when every row sees all m (rows
    of different prompts stacked together pad their contexts: the padding is masked out).
    Returns [n, nh * hd]."""
    n, nh, hd = q.shape
    K = _heads(torch.cat([ctx_k, k[:, None]], dim=1), nh)  # [n, m+1, nh, hd]
    Vv = _heads(torch.cat([ctx_v, v[:, None]], dim=1), nh)
    scale = cfg.attention_scale or 1.0 / math.sqrt(hd)
    scores = torch.einsum("nmhd,nhd->nhm", K, q) * scale  # [n, nh, m+1]
    if ctx_valid is not None:  # padded context entries get no weight (each row's own token always does)
        seen = torch.cat([ctx_valid, ctx_valid.new_ones(n, 1)], dim=1)  # [n, m+1] (m may be 0)
        scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
    return torch.einsum("nhm,nmhd->nhd", torch.softmax(scores, dim=-1), Vv).reshape(n, nh * hd)


def _heads(x, nh: int) -> torch.Tensor:
    """x [n, m, nkv, hd] -> [n, m, nh, hd]: query head h reads key-value head h // (nh / nkv)."""
    n, m, nkv, hd = x.shape
    return x[:, :, :, None].expand(n, m, nkv, nh // nkv, hd).reshape(n, m, nh, hd)


def _attention_out(w, p, cfg, x, o):
    """The attention output o [n, nh * hd] gated by x [n, d] (where the config says) and projected (MLA: its values'
    own width, unpadded)."""
    if cfg.mla_kv_lora_rank:
        o = o.view(o.shape[0], cfg.num_attention_heads, cfg.head_dim)[..., :cfg.mla_v_head_dim].reshape(o.shape[0], -1)
    if cfg.attn_output_gate:
        o = o * torch.sigmoid(x @ w[p + "attn.gate"].T)
    return o @ w[p + "attn.o"].T


def _attention(w, p, cfg, x, pos, ctx_k, ctx_v, ctx_valid=None):
    """One token per row of causal GQA. x [n, d]; pos [n]; ctx_k/ctx_v [n, m, nkv, hd]: each row's
    earlier visible tokens (_attention_core). Returns (out [n, d], k, v)."""
    q, k, v = _attention_proj(w, p, cfg, x, pos)
    return _attention_out(w, p, cfg, x, _attention_core(cfg, q, k, v, ctx_k, ctx_v, ctx_valid)), k, v


def _swiglu(x, gate, up, down):
    """x [n, d] (or [d])."""
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def _ffn(x, up, down, gate, act):
    """One feed-forward of x [..., d]: SwiGLU down(silu(gate x) * up x), GeGLU down(gelu(gate x) * up x) (exact,
    erf GELU), or relu^2 down(relu(up x)^2)."""
    if act == "relu2":
        return torch.relu(x @ up.T).pow(2) @ down.T
    if act == "geglu":
        g = x @ gate.T
        return (0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0))) * (x @ up.T)) @ down.T
    return _swiglu(x, gate, up, down)


def _route(w, p, cfg, xr):
    """(weights [k], expert indices [k]) for one row xr [d]."""
    logits = w[p + "mlp.router"] @ xr  # [E]
    k = cfg.num_experts_per_tok
    if cfg.moe_router == "softmax":
        top, idx = torch.topk(torch.softmax(logits, dim=0), k)
        return (top / top.sum() if cfg.norm_topk_prob else top), idx
    # sigmoid scores; choose by score + bias, among the best groups (each group scored by its top two)
    scores = torch.sigmoid(logits)
    choice = scores + w[p + "mlp.router_bias"]
    G = cfg.moe_n_group
    groups = choice.view(G, -1).topk(min(2, choice.numel() // G), dim=-1).values.sum(-1)  # [G]
    keep = torch.zeros(G, dtype=torch.bool, device=xr.device)
    keep[torch.topk(groups, cfg.moe_topk_group).indices] = True
    choice = choice.masked_fill(~keep.repeat_interleave(choice.numel() // G), float("-inf"))
    idx = torch.topk(choice, k).indices
    top = scores[idx]
    if cfg.norm_topk_prob:
        top = top / (top.sum() + cfg.moe_norm_eps)
    return top * cfg.routed_scaling_factor, idx


def _mlp(w, p, cfg, x, i):
    """Each row's MLP (SwiGLU, GeGLU or relu^2), or the MoE block, routed row by row: the top-k experts'
    outputs weighted by the router (softmax, or Nemotron-H's grouped sigmoid), plus the shared expert
    (sigmoid-gated for Qwen, a plain sum for Granite and Nemotron-H). Each expert chosen by some row runs once on
    the rows that chose it (its weights converted once: a large model's are converted as they are used)."""
    moe = cfg.num_experts > 0 and i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0
    act = cfg.mlp_act
    if not moe:
        return _ffn(x, w[p + "mlp.up"], w[p + "mlp.down"], w[p + "mlp.gate"] if act != "relu2" else None, act)
    chosen: dict[int, list] = {}  # expert -> [(row, its router weight), ...]
    for r in range(x.shape[0]):
        top, idx = _route(w, p, cfg, x[r])
        for pr, e in zip(top, idx.tolist()):
            chosen.setdefault(e, []).append((r, pr))
    out = torch.zeros_like(x)
    for e in sorted(chosen):
        rows = torch.tensor([r for r, _ in chosen[e]], device=x.device)
        weight = torch.stack([pr for _, pr in chosen[e]]).to(x.dtype)  # [n_e]
        gate = w.expert(p + "mlp.experts.gate", e) if act != "relu2" else None
        y = _ffn(x[rows], w.expert(p + "mlp.experts.up", e), w.expert(p + "mlp.experts.down", e), gate, act)
        out.index_add_(0, rows, weight[:, None] * y)
    if p + "mlp.shared.down" in w:
        shared = _ffn(x, w[p + "mlp.shared.up"], w[p + "mlp.shared.down"],
                      w[p + "mlp.shared.gate"] if act != "relu2" else None, act)
        if p + "mlp.shared_gate" in w:  # gated (Qwen), or a plain sum (Granite, Nemotron-H)
            shared = torch.sigmoid(x @ w[p + "mlp.shared_gate"].T) * shared
        out = out + shared
    return out


def _gdn_proj(w, p, cfg, x):
    """Gated DeltaNet's input projections of each row x [n, d] and the gates they give: (conv input [n, C],
    z [n, HV, V], g [n, HV] the decay's log, beta [n, HV] the write strength)."""
    n = x.shape[0]
    a, b = x @ w[p + "gdn.a"].T, x @ w[p + "gdn.b"].T
    g = -torch.exp(w[p + "gdn.A_log"]) * F.softplus(a + w[p + "gdn.dt_bias"])
    beta = torch.sigmoid(b) * cfg.gdn_beta_scale
    return x @ w[p + "gdn.qkv"].T, (x @ w[p + "gdn.z"].T).view(n, cfg.linear_num_value_heads, -1), g, beta


def _gdn_core(w, p, cfg, xin, g, beta, S, window):
    """One token per row of Gated DeltaNet's conv and recurrence from the row's own state: xin [n, C],
    g, beta [n, HV] (_gdn_proj); S [n, HV, K, V]; window [n, C, W-1] -> (o [n, HV, V] = S_t^T q_t, S_t,
    window')."""
    n = xin.shape[0]
    H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    K, V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    inputs = torch.cat([window, xin[:, :, None]], dim=2)  # [n, C, W] oldest first
    y = F.silu((inputs * w[p + "gdn.conv"]).sum(dim=2))  # [n, C]
    qk = y[:, : 2 * H * K].view(n, 2 * H, K)  # each head's q, then each head's k
    qk = qk / torch.sqrt((qk * qk).sum(-1, keepdim=True) + 1e-6)
    # value head j reads key head j // (HV / H): [n, 2, HV, K]
    qk = qk.view(n, 2, H, 1, K).expand(n, 2, H, HV // H, K).reshape(n, 2, HV, K)
    q, k = qk[:, 0], qk[:, 1]
    v = y[:, 2 * H * K:].view(n, HV, V)
    # S_t = exp(g) (I - beta k k^T) S_{t-1} + beta k v^T, every row and value head at once, as the delta rule
    # writes it: the decayed state S' = exp(g) S_{t-1}, then S_t = S' + beta k (v - S'^T k)^T (a rank-one
    # update: no [K, K] matrix per row and head)
    Sd = torch.exp(g).view(n, HV, 1, 1) * S  # [n, HV, K, V]
    # (batched products over the rows and heads as one [n * HV] batch of vectors)
    kS = torch.bmm(k.reshape(n * HV, 1, K), Sd.view(n * HV, K, V)).view(n, HV, V)  # S'^T k
    S_new = Sd + (beta.view(n, HV, 1) * k).unsqueeze(-1) * (v - kS).unsqueeze(-2)
    o = torch.bmm((q * K ** -0.5).reshape(n * HV, 1, K), S_new.view(n * HV, K, V)).view(n, HV, V)  # o_t = S_t^T (scale q_t)
    return o, S_new, inputs[:, :, 1:]


def _gdn_out(w, p, cfg, o, z):
    """The gated RMSNorm of o [n, HV, V] times silu(z), projected: [n, d]."""
    n = o.shape[0]
    o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + (cfg.gdn_norm_eps or cfg.rms_norm_eps)) * w[p + "gdn.norm"] * F.silu(z)
    return o.reshape(n, -1) @ w[p + "gdn.out"].T


def _gdn(w, p, cfg, x, S, window):
    """One token per row of Gated DeltaNet. x [n, d]; S [n, HV, K, V]; window [n, C, W-1]."""
    xin, z, g, beta = _gdn_proj(w, p, cfg, x)
    o, S_new, new_window = _gdn_core(w, p, cfg, xin, g, beta, S, window)
    return _gdn_out(w, p, cfg, o, z), S_new, new_window


def _mamba2_proj(w, p, cfg, x):
    """A Mamba2 mixer's input projections of each row x [n, d]: (z [n, I], conv input [n, Cm], dt [n, H] raw)."""
    return x @ w[p + "mamba.z"].T, x @ w[p + "mamba.xbc"].T, x @ w[p + "mamba.dt"].T


def _mamba2_core(w, p, cfg, xbc, dt_raw, S, window):
    """One token per row of a Mamba2 mixer's conv and recurrence from the row's own state: xbc [n, Cm],
    dt_raw [n, H]; S [n, H, P, N]; window [n, Cm, W-1] -> (y [n, I] = S_t C_t + D x_t, S_t, window')."""
    n = xbc.shape[0]
    H, P, N, G, I = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.mamba_state_size, cfg.mamba_n_groups, cfg.mamba_inner
    inputs = torch.cat([window, xbc[:, :, None]], dim=2)  # [n, Cm, W] oldest first
    y = (inputs * w[p + "mamba.conv"]).sum(dim=2)
    if p + "mamba.conv_bias" in w:
        y = y + w[p + "mamba.conv_bias"]
    y = F.silu(y)
    xs = y[:, :I].view(n, H, P)
    Bg = y[:, I: I + G * N].view(n, G, N).repeat_interleave(H // G, dim=1)  # [n, H, N]: head h reads group h // (H/G)
    Cg = y[:, I + G * N:].view(n, G, N).repeat_interleave(H // G, dim=1)
    dt = F.softplus(dt_raw + w[p + "mamba.dt_bias"])  # [n, H]
    lo, hi = cfg.mamba_dt_limit
    dt = dt.clamp(min=lo, max=hi) if (lo > 0 or hi < math.inf) else dt
    A = -torch.exp(w[p + "mamba.A_log"])  # [H]
    # S_t = exp(dt A) S_{t-1} + dt x B^T;  y_t = S_t C_t + D x_t
    S_new = torch.exp(dt * A)[..., None, None] * S + (dt[..., None] * xs)[..., None] * Bg[:, :, None, :]
    out = torch.einsum("nhpk,nhk->nhp", S_new, Cg) + w[p + "mamba.D"][:, None] * xs
    return out.reshape(n, I), S_new, inputs[:, :, 1:]


def _mamba2_out(w, p, cfg, y, z):
    """y [n, I] gated by z [n, I] (before or after the grouped RMSNorm, or without one), projected: [n, d]."""
    n, I, G = y.shape[0], cfg.mamba_inner, cfg.mamba_n_groups

    def group_rms(v):  # RMSNorm over each of the G groups of I/G channels, times the weight
        g = v.view(n, G, I // G)
        return (g / torch.sqrt((g * g).mean(-1, keepdim=True) + cfg.rms_norm_eps)).view(n, I) * w[p + "mamba.norm"]

    if cfg.mamba_norm == "gated":
        y = group_rms(y * F.silu(z))
    elif cfg.mamba_norm == "gated-before":
        y = group_rms(y) * F.silu(z)
    else:
        y = y * F.silu(z)
    return y @ w[p + "mamba.out"].T


def _mamba2(w, p, cfg, x, S, window):
    """One token per row of a Mamba2 mixer. x [n, d]; S [n, H, P, N]; window [n, Cm, W-1]."""
    z, xbc, dt_raw = _mamba2_proj(w, p, cfg, x)
    y, S_new, new_window = _mamba2_core(w, p, cfg, xbc, dt_raw, S, window)
    return _mamba2_out(w, p, cfg, y, z), S_new, new_window


def _mamba1_core(w, p, cfg, xs, S, window):
    """One token per row of a Mamba1 mixer's conv and selective scan from the row's own state: xs [n, I] (the
    conv's input); S [n, I, N]; window [n, I, W-1] -> (y [n, I] = S_t C_t + D x_t, S_t, window')."""
    R, Ns = cfg.mamba1_dt_rank, cfg.mamba_state_size
    inputs = torch.cat([window, xs[:, :, None]], dim=2)  # [n, I, W] oldest first
    u = (inputs * w[p + "mamba1.conv"]).sum(dim=2)
    if p + "mamba1.conv_bias" in w:
        u = u + w[p + "mamba1.conv_bias"]
    u = F.silu(u)  # [n, I]
    dbc = u @ w[p + "mamba1.x_proj"].T  # [n, R + 2N]: dt, B, C
    dtr, Bv, Cv = dbc[:, :R], dbc[:, R:R + Ns], dbc[:, R + Ns:]
    if cfg.mamba1_bcdt_norm:
        dtr = _rmsnorm(dtr, w[p + "mamba1.dt_norm"], cfg.rms_norm_eps)
        Bv = _rmsnorm(Bv, w[p + "mamba1.b_norm"], cfg.rms_norm_eps)
        Cv = _rmsnorm(Cv, w[p + "mamba1.c_norm"], cfg.rms_norm_eps)
    dt = F.softplus(dtr @ w[p + "mamba1.dt_proj"].T + w[p + "mamba1.dt_bias"])  # [n, I]
    A = -torch.exp(w[p + "mamba1.A_log"])  # [I, N]
    # S_t = exp(dt A) * S_{t-1} + dt x B;  y_t = S_t C_t + D x_t   (per channel)
    S_new = torch.exp(dt[:, :, None] * A) * S + (dt * u)[:, :, None] * Bv[:, None, :]
    out = torch.einsum("nik,nk->ni", S_new, Cv) + w[p + "mamba1.D"] * u
    return out, S_new, inputs[:, :, 1:]


def _mamba1(w, p, cfg, x, S, window):
    """One token per row of a Mamba1 mixer. x [n, d]; S [n, I, N]; window [n, I, W-1]."""
    xz = x @ w[p + "mamba1.in"].T
    I = cfg.mamba1_inner
    y, S_new, new_window = _mamba1_core(w, p, cfg, xz[:, :I], S, window)
    return (y * F.silu(xz[:, I:])) @ w[p + "mamba1.out"].T, S_new, new_window


def _kda_proj(w, p, x):
    """Kimi Delta Attention's projections of each row x [n, d]: (conv input q‖k‖v [n, 3HK], forget-gate input
    [n, HK], beta input [n, H], output gate [n, HK])."""
    return (x @ w[p + "kda.qkv"].T, (x @ w[p + "kda.f_a"].T) @ w[p + "kda.f_b"].T, x @ w[p + "kda.b"].T,
            (x @ w[p + "kda.g_a"].T) @ w[p + "kda.g_b"].T)


def _kda_core(w, p, cfg, xin, f, b, S, window):
    """One token per row of KDA's conv and recurrence from the row's own state: xin [n, 3HK]; f [n, HK]; b [n, H];
    S [n, H, K, V]; window [n, 3HK, W-1] -> (o [n, H, V] = S_t^T q_t, S_t, window')."""
    n, H, K = xin.shape[0], cfg.linear_num_value_heads, cfg.linear_key_head_dim
    inputs = torch.cat([window, xin[:, :, None]], dim=2)  # [n, C, W] oldest first
    y = F.silu((inputs * w[p + "kda.conv"]).sum(dim=2))
    q, k, v = (y[:, j * H * K:(j + 1) * H * K].view(n, H, K) for j in range(3))
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * K ** -0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    g = -torch.exp(w[p + "kda.A_log"])[:, None] * F.softplus((f + w[p + "kda.dt_bias"]).view(n, H, K))  # [n, H, K]
    beta = torch.sigmoid(b)  # [n, H]
    # S' = Diag(exp(g)) S;  S_t = S' + beta k (v - S'^T k)^T;  o_t = S_t^T q_t
    S = torch.exp(g)[..., None] * S
    S_new = S + beta[..., None, None] * k[..., :, None] * (v - torch.einsum("nhkv,nhk->nhv", S, k))[..., None, :]
    return torch.einsum("nhkv,nhk->nhv", S_new, q), S_new, inputs[:, :, 1:]


def _kda_out(w, p, cfg, o, gate):
    """The gated RMSNorm of o [n, H, V] times sigmoid(gate), projected: [n, d]."""
    n, H = o.shape[0], o.shape[1]
    o = _rmsnorm(o, w[p + "kda.norm"], cfg.rms_norm_eps) * torch.sigmoid(gate.view(n, H, -1))
    return o.reshape(n, -1) @ w[p + "kda.out"].T


def _kda(w, p, cfg, x, S, window):
    """One token per row of Kimi Delta Attention. x [n, d]; S [n, H, K, V]; window [n, 3HK, W-1]."""
    xin, f, b, gate = _kda_proj(w, p, x)
    o, S_new, new_window = _kda_core(w, p, cfg, xin, f, b, S, window)
    return _kda_out(w, p, cfg, o, gate), S_new, new_window


def _lightning_proj(w, p, cfg, x):
    """Lightning attention's q, k, v of each row x [n, d]: silu of one projection, per head [q, k, v]: [n, H, hd] each."""
    H, hd = cfg.num_attention_heads, cfg.head_dim
    qkv = F.silu(x @ w[p + "lightning.qkv"].T).view(x.shape[0], H, 3 * hd)
    return qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]


def _lightning_core(w, p, q, k, v, S, window):
    """One token per row from the row's own state: q, k, v [n, H, hd]; S [n, H, hd, hd]; window [n, 0, 0] (none,
    passed on) -> (o [n, H, hd] = S_t^T q_t, S_t = lambda S + k v^T, window)."""
    lam = torch.exp(-w[p + "lightning.slope"])  # [H]
    S_new = lam[None, :, None, None] * S + torch.einsum("nhk,nhv->nhkv", k, v)
    return torch.einsum("nhkv,nhk->nhv", S_new, q), S_new, window


def _lightning_out(w, p, cfg, x, o):
    """The norm over all heads of o [n, H, hd], gated by sigmoid of x's gate projection, projected: [n, d]."""
    o = _rmsnorm(o.reshape(o.shape[0], -1), w[p + "lightning.norm"], cfg.lightning_norm_eps)
    return (o * torch.sigmoid(x @ w[p + "lightning.gate"].T)) @ w[p + "lightning.out"].T


def _lightning(w, p, cfg, x, S, window):
    """One token per row of MiniMax's lightning attention. x [n, d]; S [n, H, hd, hd]."""
    q, k, v = _lightning_proj(w, p, cfg, x)
    o, S_new, window = _lightning_core(w, p, q, k, v, S, window)
    return _lightning_out(w, p, cfg, x, o), S_new, window


def _short_conv_proj(w, p, x):
    """LFM2's short conv input projection of each row x [n, d]: (B [n, d], C [n, d], x [n, d])."""
    d = x.shape[1]
    bcx = x @ w[p + "conv.in"].T  # [n, 3d]: B, C, x
    return bcx[:, :d], bcx[:, d:2 * d], bcx[:, 2 * d:]


def _short_conv_core(w, p, bg, xs, S, window):
    """One token per row of the short conv from the row's own window: bg, xs [n, d]; S [n, 0] (no state,
    passed on); window [n, d, W-1] -> (conv(B * x) [n, d], S, window')."""
    inputs = torch.cat([window, (bg * xs)[:, :, None]], dim=2)  # [n, d, W] oldest first
    return (inputs * w[p + "conv.conv"]).sum(dim=2), S, inputs[:, :, 1:]


def _short_conv(w, p, cfg, x, S, window):
    """One token per row of LFM2's gated short conv: out(C * conv(B * x)). x [n, d]; window [n, d, W-1]."""
    bg, cg, xs = _short_conv_proj(w, p, x)
    y, S, new_window = _short_conv_core(w, p, bg, xs, S, window)
    return (cg * y) @ w[p + "conv.out"].T, S, new_window


def decode_step(w, cfg, *, token, pos, kv_ctx, ssm, conv, ctx_valid=None):
    """One token through the whole model, for each of n rows at once (each row its own sequence).

    token, pos: [n] (or ints, for one row); kv_ctx[l]: (K [n, m, nkv, hd], V) each row's visible
    context for attention layers, padded to one length m where ctx_valid [n, m] (bool) says which
    entries are real (None: all of them); ssm[l] [n, HV, K, V],
    conv[l] [n, C, W-1]: each row's recurrent state before its token for recurrent layers (GDN S
    [n, HV, K, V], Mamba2 h [n, H, P, N]).
    Returns (logits [n, N], hidden [L, n, d] after each layer, new_kv[l] -> (k [n, nkv, hd], v),
    ssm', conv').
    """
    token = torch.as_tensor(token).reshape(-1)
    pos0 = torch.as_tensor(pos).reshape(-1)
    h = x0 = w.rows("embed", token) * cfg.embedding_multiplier  # [n, d] (x0: Zamba2's hybrid layers read it again)
    r = cfg.residual_multiplier
    hidden, new_kv, ssm2, conv2 = [], [], [], []
    head = w["final_norm"].device
    for i, kind in enumerate(cfg.layer_pattern):
        p = f"layers.{i}."
        norm = w[p + "input_norm"]
        h, pos = h.to(norm.device), pos0.to(norm.device)  # this layer's device (the same one unless placed)
        nk, S, win = None, None, None
        if kind == "z":  # Zamba2: attention and its MLP on [h, embeddings] (2d), projected to t; h + Mamba2(norm(h + t))
            valid = None if ctx_valid is None else ctx_valid.to(norm.device)
            xa = _rmsnorm(torch.cat([h, x0.to(h.device)], -1), norm, cfg.rms_norm_eps)
            a, k, v = _attention(w, p, cfg, xa, pos, *kv_ctx[i], valid)
            t = _mlp(w, p, cfg, _rmsnorm(a, w[p + "post_norm"], cfg.rms_norm_eps), i) @ w[p + "hybrid.proj"].T
            m, S, win = _mamba2(w, p, cfg, _rmsnorm(h + t, w[p + "hybrid.norm"], cfg.rms_norm_eps), ssm[i], conv[i])
            h = h + r * m
            new_kv.append((k, v))
            ssm2.append(S)
            conv2.append(win)
            hidden.append(h.to(head))
            continue
        if cfg.residual_from_norm and kind != "f":  # MiniMax's block: the residual is the normed input, sums scaled
            xn = _rmsnorm(h, norm, cfg.rms_norm_eps)
            if kind == "a":
                valid = None if ctx_valid is None else ctx_valid.to(norm.device)
                m, k, v = _attention(w, p, cfg, xn, pos, *kv_ctx[i], valid)
                nk, alpha, beta = (k, v), cfg.attn_alpha, cfg.attn_beta
            else:
                m, S, win = _lightning(w, p, cfg, xn, ssm[i], conv[i])
                alpha, beta = cfg.linear_alpha, cfg.linear_beta
            xn = _rmsnorm(alpha * xn + beta * m, w[p + "post_norm"], cfg.rms_norm_eps)
            h = cfg.mlp_alpha * xn + cfg.mlp_beta * _mlp(w, p, cfg, xn, i)
            new_kv.append(nk)
            ssm2.append(S)
            conv2.append(win)
            hidden.append(h.to(head))
            continue
        if kind == "a" and cfg.attn_post_norm:  # norms on the attention's and the MLP's outputs (OLMo-Hybrid)
            valid = None if ctx_valid is None else ctx_valid.to(norm.device)
            a, k, v = _attention(w, p, cfg, h, pos, *kv_ctx[i], valid)
            h = h + r * _rmsnorm(a, norm, cfg.rms_norm_eps)
            if cfg.layer_mlp:
                h = h + r * _rmsnorm(_mlp(w, p, cfg, h, i), w[p + "post_norm"], cfg.rms_norm_eps)
            new_kv.append((k, v))
            ssm2.append(None)
            conv2.append(None)
            hidden.append(h.to(head))
            continue
        xn = _rmsnorm(h, norm, cfg.rms_norm_eps)
        if kind == "f":
            h = h + r * _mlp(w, p, cfg, xn, i)
        else:
            out = torch.zeros_like(h)
            if kind in "ap":
                valid = None if ctx_valid is None else ctx_valid.to(norm.device)
                a, k, v = _attention(w, p, cfg, xn, pos, *kv_ctx[i], valid)
                out, nk = out + a, (k, v)
            if kind == "g":
                g, S, win = _gdn(w, p, cfg, xn, ssm[i], conv[i])
                out = out + g
            if kind in "mp":
                m, S, win = _mamba2(w, p, cfg, xn, ssm[i], conv[i])
                out = out + m
            if kind == "c":
                c, S, win = _short_conv(w, p, cfg, xn, ssm[i], conv[i])
                out = out + c
            if kind == "s":
                m, S, win = _mamba1(w, p, cfg, xn, ssm[i], conv[i])
                out = out + m
            if kind == "l":
                m, S, win = _lightning(w, p, cfg, xn, ssm[i], conv[i])
                out = out + m
            if kind == "k":
                m, S, win = _kda(w, p, cfg, xn, ssm[i], conv[i])
                out = out + m
            h = h + r * out
            if cfg.layer_mlp:
                h = h + r * _mlp(w, p, cfg, _rmsnorm(h, w[p + "post_norm"], cfg.rms_norm_eps), i)
        new_kv.append(nk)
        ssm2.append(S)
        conv2.append(win)
        hidden.append(h.to(head))
    h = h.to(head)
    logits = (_rmsnorm(h, w["final_norm"], cfg.rms_norm_eps) @ w["lm_head"].T) / cfg.logits_scaling
    return logits, torch.stack(hidden), new_kv, ssm2, conv2


# the weights every use of which is a product x @ W.T (the tail of the name after "layers.{i}.")
PRODUCT_WEIGHTS = frozenset({
    "attn.q", "attn.k", "attn.v", "attn.o", "attn.gate", "attn.q_a", "attn.q_b", "attn.kv_a", "attn.kv_b",
    "mlp.up", "mlp.down", "mlp.gate", "mlp.shared.up", "mlp.shared.down", "mlp.shared.gate", "mlp.shared_gate",
    "mlp.experts.up", "mlp.experts.down", "mlp.experts.gate",
    "gdn.qkv", "gdn.z", "gdn.a", "gdn.b", "gdn.out", "mamba.z", "mamba.xbc", "mamba.dt", "mamba.out",
    "mamba1.in", "mamba1.out", "mamba1.x_proj", "mamba1.dt_proj", "kda.qkv", "kda.f_a", "kda.f_b", "kda.b",
    "kda.g_a", "kda.g_b", "kda.out", "lightning.qkv", "lightning.gate", "lightning.out", "conv.in", "conv.out",
    "hybrid.proj", "lm_head"})


def _bf16_parts(x):
    """x (float32) as three bfloat16 tensors [3, ...] whose sum is x to 2^-27 relative: the head
    rounded to bf16, then the remainder's head, then the remainder of that (each subtraction exact)."""
    hi = x.to(torch.bfloat16)
    r = x - hi.float()
    mid = r.to(torch.bfloat16)
    return torch.stack([hi, mid, (r - mid.float()).to(torch.bfloat16)])


class _Bf16Weight:
    """A bfloat16 weight W [n, k] of a float32 oracle, left as it is: its one use is ``x @ W.T``
    (_Bf16Product); anything else on it is an error."""

    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w  # [n, k] bfloat16

    @property
    def T(self):
        return _Bf16Product(self.w)


class _Bf16Product:
    """W.T for a bfloat16 weight W [n, k] of a float32 oracle, used only as ``x @ W.T``: x (float32
    [..., k]) split into three bfloat16 parts (_bf16_parts), the parts' rows stacked into one product with
    float32 accumulation (a bf16 x bf16 product is exact in float32), the three results summed. The same
    product as x @ W.float().T up to float32 accumulation, without converting W (2 bytes a parameter read
    once, not 2 read + 4 written + 4 read) and on the tensor cores: the full-size oracle's products, which
    cuBLAS runs without tensor cores in float32. Anything but ``x @`` on it is a TypeError."""

    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w  # [n, k] bfloat16

    def __rmatmul__(self, x):
        if x.dtype != torch.float32:
            raise TypeError(f"_Bf16Product: a float32 operand, got {x.dtype}")
        lead, k = x.shape[:-1], x.shape[-1]
        parts = _bf16_parts(x.reshape(-1, k))  # [3, m, k]
        m = parts.shape[1]
        flat = parts.reshape(3 * m, k)
        if flat.is_cuda:
            reduced = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
            try:
                y = torch.mm(flat, self.w.T, out_dtype=torch.float32)
            finally:
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
        else:  # no bf16 -> float32 product on the CPU: the same exact products, accumulated in float32
            y = flat.float() @ self.w.float().T
        y = y.view(3, m, self.w.shape[0])
        return ((y[0] + y[1]) + y[2]).view(*lead, self.w.shape[0])


class _Weights:
    """The weights in the oracle's dtype and device; every RMSNorm scale but the gated norms' is
    (norm_offset + weight). Small models are converted once; large ones (a full-size checkpoint on a
    GPU) tensor by tensor as each is used, so no second copy of the model is held. ``bf16_products``
    (default: takes_bf16_products): the PRODUCT_WEIGHTS left in bfloat16
    (_Bf16Weight), their products as _Bf16Product."""

    EAGER_BYTES = 2 << 30

    def __init__(self, weights, cfg, device, dtype, bf16_products: bool | None = None):
        """device None: every weight where it is (a placed model)."""
        self.raw, self.cfg, self.dtype = weights, cfg, dtype
        self.device = None if device is None else torch.device(device)
        eager = _bytes_in(weights, dtype) <= self.EAGER_BYTES
        if bf16_products is None:
            bf16_products = takes_bf16_products(weights, device, dtype)
        if bf16_products and dtype != torch.float32:
            raise ValueError(f"bf16_products: a float32 oracle, not {dtype}")
        self.bf16_products = bf16_products
        self.cache = {k: self._convert(k) for k in weights} if eager else None

    def _product(self, k, v):
        """v (the raw weight named k, or one expert's slice) as a _Bf16Weight where that applies."""
        if not (self.bf16_products and v.dim() == 2 and v.dtype == torch.bfloat16):
            return None
        if (k.split(".", 2)[-1] if k.startswith("layers.") else k) not in PRODUCT_WEIGHTS:
            return None
        return _Bf16Weight(v.detach().to(self.device or v.device))

    def rows(self, k, idx):
        """Rows idx of a 2-D weight (the embedding's tokens), converting those rows alone when large."""
        if self.cache is not None:
            return self.cache[k][idx.to(self.cache[k].device)]
        raw = self.raw[k]
        return raw[idx.to(raw.device)].detach().to(self.device or raw.device, self.dtype)

    def expert(self, k, e):
        """Expert e of a stacked expert tensor [E, ...], converting that slice alone when large."""
        if self.cache is not None:
            return self.cache[k][e]
        return self._product(k, self.raw[k][e]) or self.raw[k][e].detach().to(self.device or self.raw[k].device, self.dtype)

    def _convert(self, k):
        product = self._product(k, self.raw[k])
        if product is not None:
            return product
        v = self.raw[k].detach().to(self.device or self.raw[k].device, self.dtype)
        if k.endswith("norm") and not k.endswith(("gdn.norm", "mamba.norm", "kda.norm")):
            v = v + self.cfg.norm_offset
        return v

    def __getitem__(self, k):
        return self.cache[k] if self.cache is not None else self._convert(k)

    def __contains__(self, k):
        return k in self.raw


def takes_bf16_products(weights, device=None, dtype=None) -> bool:
    """Whether the oracle on ``weights`` (on ``device``, in ``dtype``: by default where the weights are, in
    default_dtype there) takes its products as _Bf16Product by default: a bfloat16 model on a GPU, in a
    float32 oracle, too large to convert once (over _Weights.EAGER_BYTES in float32)."""
    device, dtype = _placement(weights, device, dtype)
    return (_bytes_in(weights, dtype) > _Weights.EAGER_BYTES and dtype == torch.float32 and weights["embed"].dtype == torch.bfloat16
            and (device or weights["embed"].device).type == "cuda")


def _bytes_in(weights, dtype) -> int:
    """Bytes the weights would take converted to dtype."""
    return sum(v.numel() for v in weights.values()) * torch.tensor([], dtype=dtype).element_size()


def default_dtype(device) -> torch.dtype:
    """The oracle's arithmetic unless told otherwise: float64 on the CPU, float32 on a GPU."""
    return F64 if torch.device(device).type == "cpu" else torch.float32


def _placement(weights, device, dtype):
    """(device, dtype): where the weights live unless told otherwise, in default_dtype there. Weights
    spread over several devices with no device given: (None, dtype), every weight used in place."""
    if device is None:
        devs = {v.device for v in weights.values()}
        if len(devs) > 1:
            return None, (default_dtype(weights["embed"].device) if dtype is None else dtype)
        device = weights["embed"].device
    device = torch.device(device)
    return device, (default_dtype(device) if dtype is None else dtype)


def _layer_devices(weights, cfg, device):
    """Each layer's device: ``device``, or for a placed model its weights' own."""
    return [device or weights[f"layers.{i}.input_norm"].device for i in range(cfg.num_layers)]


def _rows(state: ModelState):
    """A committed state as one batch row: kv (K [1, n, nkv, hd], V), ssm [1, ...], conv [1, ...]."""
    kv = [None if kv is None else (kv[0][None], kv[1][None]) for kv in state.kv]
    return kv, [None if s is None else s[None] for s in state.ssm], [None if c is None else c[None] for c in state.conv]


def _append_kv(kv, new_kv):
    """Every row's context grown by its decoded token: kv[l] (K [n, m, nkv, hd], V) and new_kv[l]
    (k [n, nkv, hd], v) -> [n, m + 1, nkv, hd] (None for layers without attention)."""
    return [None if c is None else (torch.cat([c[0], nk[0][:, None]], 1), torch.cat([c[1], nk[1][:, None]], 1))
            for c, nk in zip(kv, new_kv)]


def prefill(weights, cfg, tokens, *, state: ModelState | None = None, device=None, dtype=None,
            bf16_products: bool | None = None):
    """Decode ``tokens`` one at a time from ``state`` (default: empty).

    Returns (state after all tokens, logits [n, N] at each token), in the oracle's dtype.
    """
    device, dtype = _placement(weights, device, dtype)
    w = _Weights(weights, cfg, device, dtype, bf16_products)
    st = (state or empty_state(cfg, layer_devices=_layer_devices(weights, cfg, device))).to(dtype, device).clone()
    kv, ssm, conv = _rows(st)
    logits = []
    for tok in tokens:
        lg, _, new_kv, ssm, conv = decode_step(w, cfg, token=[int(tok)], pos=[st.pos], kv_ctx=kv, ssm=ssm, conv=conv)
        kv = _append_kv(kv, new_kv)
        st.pos += 1
        logits.append(lg[0])
    st.kv = [None if c is None else (c[0][0], c[1][0]) for c in kv]
    st.ssm = [None if s is None else s[0] for s in ssm]
    st.conv = [None if c is None else c[0] for c in conv]
    return st, (torch.stack(logits) if logits else torch.zeros(0, cfg.vocab_size, dtype=dtype,
                                                              device=device or weights["lm_head"].device))


@dataclass
class OracleResult:
    """Per-node oracle outputs for a tree block (float64 on the CPU; float32 on a GPU).

    logits [T, N]; hidden [L, T, d] (residual stream after each layer);
    ssm[l] [T, *state] and conv[l] [T, C, W-1] for recurrent layers when recorded (else None);
    kv[l] = (k [T, nkv, hd], v [T, nkv, hd]) for attention layers (each node's own entry).
    """
    logits: torch.Tensor
    hidden: torch.Tensor
    ssm: list
    conv: list
    kv: list


class _TreeOut:
    """One tree's outputs as the oracle fills them (OracleResult's fields). ``whole``: each output is
    assigned whole once it is known for every node (verify_trees: a layer's states and keys of every node
    at once, gathered in node order), not allocated here and filled node by node (``record``)."""

    def __init__(self, cfg, st: ModelState, parents, tokens, record_states, dtype, ldev, head, *, whole=False):
        self.st, self.pos = st, st.pos
        self.parents = [int(x) for x in parents]
        self.tokens = [int(x) for x in tokens]
        T, L = len(self.parents), cfg.num_layers
        self.children = [[] for _ in range(T)]
        for i in range(1, T):
            self.children[self.parents[i]].append(i)
        self.kv, self.ssm, self.conv = [None] * L, [None] * L, [None] * L
        if whole and T:
            self.logits = self.hidden = None
            return
        self.logits = torch.zeros(T, cfg.vocab_size, dtype=dtype, device=head)
        self.hidden = torch.zeros(L, T, cfg.hidden_size, dtype=dtype, device=head)
        for i in cfg.attention_layers:  # each layer's outputs on its own device
            shape = (T, cfg.num_key_value_heads, cfg.head_dim)
            self.kv[i] = (torch.zeros(shape, dtype=dtype, device=ldev[i]), torch.zeros(shape, dtype=dtype, device=ldev[i]))
        if record_states:
            for i in cfg.recurrent_layers:
                self.ssm[i] = torch.zeros(T, *st.ssm[i].shape, dtype=dtype, device=ldev[i])
                self.conv[i] = torch.zeros(T, *st.conv[i].shape, dtype=dtype, device=ldev[i])

    def result(self) -> OracleResult:
        return OracleResult(self.logits, self.hidden, self.ssm, self.conv, self.kv)

    def record(self, cfg, nodes, rows, lg, hid, new_kv, ssm2, conv2, record_states):
        """Outputs of this tree's ``nodes``, rows ``rows`` of a decoded batch."""
        self.logits[nodes] = lg[rows]
        self.hidden[:, nodes] = hid[:, rows]
        for i, nk in enumerate(new_kv):
            if nk is not None:
                self.kv[i][0][nodes], self.kv[i][1][nodes] = nk[0][rows], nk[1][rows]
        if record_states:
            for i in cfg.recurrent_layers:
                self.ssm[i][nodes] = ssm2[i][rows]
                self.conv[i][nodes] = conv2[i][rows]


def _stack_roots(cfg, trees):
    """The committed states of every tree as one batch, a row each: kv contexts padded to the longest
    (ctx_valid [n, m] marks the real entries; None when every context has the same length), ssm, conv."""
    L = cfg.num_layers
    lens = [t.st.kv[cfg.attention_layers[0]][0].shape[0] if cfg.attention_layers else 0 for t in trees]
    m = max(lens)
    kv, ssm, conv = [None] * L, [None] * L, [None] * L
    for i in cfg.attention_layers:
        def padded(x, n):
            return torch.cat([x, x.new_zeros(m - n, *x.shape[1:])]) if n < m else x
        kv[i] = (torch.stack([padded(t.st.kv[i][0], n) for t, n in zip(trees, lens)]),
                 torch.stack([padded(t.st.kv[i][1], n) for t, n in zip(trees, lens)]))
    for i in cfg.recurrent_layers:
        ssm[i] = torch.stack([t.st.ssm[i] for t in trees])
        conv[i] = torch.stack([t.st.conv[i] for t in trees])
    valid = None
    if len(set(lens)) > 1:
        valid = torch.arange(m)[None, :] < torch.tensor(lens)[:, None]  # [n, m]
    return kv, ssm, conv, valid


class _Held:
    """One layer's weights, each converted once (``_Weights`` converts a large model's weight at every
    use) and kept while that layer runs over every level of the batch, then let go with it."""

    def __init__(self, w: _Weights):
        self.w, self.cache = w, {}

    def __getitem__(self, k):
        if k not in self.cache:
            self.cache[k] = self.w[k]
        return self.cache[k]

    def __contains__(self, k):
        return k in self.w

    def rows(self, k, idx):
        return self.w.rows(k, idx)

    def expert(self, k, e):
        return self.w.expert(k, e)


class _Index:
    """The batch's index lists, each made a tensor once per device it is used on: indexing a GPU
    tensor with a Python list copies the list to the device at every use, a synchronous copy that
    holds the host until the GPU has caught up (thousands of them per batch)."""

    def __init__(self):
        self.host, self.made = {}, {}

    def add(self, key, values) -> None:
        """values: a list of indices, or a (host) tensor."""
        self.host[key] = values

    def __call__(self, key, device) -> torch.Tensor:
        t = self.made.get((key, device))
        if t is None:
            v = self.host[key]
            t = self.made[(key, device)] = (v.to(device) if isinstance(v, torch.Tensor)
                                            else torch.tensor(v, dtype=torch.long, device=device))
        return t


def _by_tree(rows) -> dict:
    """{tree: (its nodes, their places in ``rows``)} of rows [(tree, node), ...], trees in order seen."""
    out = {}
    for r, (j, n) in enumerate(rows):
        nodes, places = out.setdefault(j, ([], []))
        nodes.append(n)
        places.append(r)
    return out


def _levels(trees, live):
    """The batch's schedule, the same for every layer: per depth, its rows [(tree, node)] (every live
    tree's nodes of that depth, trees in order, children in order under their parents in order) and
    each row's parent row in the depth before (None at depth 0)."""
    level, out = [(j, 0) for j in live], []
    parents = None
    while level:
        out.append((level, parents))
        nxt = [((j, c), r) for r, (j, n) in enumerate(level) for c in trees[j].children[n]]
        level, parents = [x for x, _ in nxt], [r for _, r in nxt]
    return out


def verify_trees(weights, cfg, items, *, record_states: bool = True, device=None, dtype=None,
                 bf16_products: bool | None = None) -> list[OracleResult]:
    """``verify_tree`` for several trees at once, items [(state, parents, tokens), ...] (each tree on
    its own committed state: the prompts of an audit). Every node is one decode step from its parent's
    exact state, as ``decode_step`` computes it, scheduled layer by layer: for each layer, its input
    projections of every node of every tree at once, then depth by depth the conv, recurrence and
    attention of the nodes of that depth (each row from its parent's state and context at this layer,
    computed the depth before; rows of different trees carry their own positions and contexts,
    padded to one length, the padding masked out), then its output projection and MLP of every node
    at once; then the LM head of every node. Each layer's weights are converted to the oracle's dtype
    once per batch, not once per depth (with ``bf16_products``, default takes_bf16_products, the product
    weights are not converted at all: _Bf16Product). Per node the same computation as one tree alone, one node
    at a time; only the reassociation of batched matrix products differs."""
    device, dtype = _placement(weights, device, dtype)
    w = _Weights(weights, cfg, device, dtype, bf16_products)
    ldev = _layer_devices(weights, cfg, device)
    head = device or weights["lm_head"].device
    trees = [_TreeOut(cfg, state.to(dtype, device), parents, tokens, record_states, dtype, ldev, head, whole=True)
             for state, parents, tokens in items]
    live = [j for j, t in enumerate(trees) if t.parents]
    if not live:
        return [t.result() for t in trees]
    kv0, ssm0, conv0, valid0 = _stack_roots(cfg, [trees[j] for j in live])
    levels = _levels(trees, live)
    offsets = [0]
    for rows, _ in levels:
        offsets.append(offsets[-1] + len(rows))
    spans = [slice(a, b) for a, b in zip(offsets, offsets[1:])]
    order = [x for rows, _ in levels for x in rows]  # (tree, node) of every batch row, depth by depth
    # each level's context validity: the roots' padded prefixes, grown by one real entry per depth
    valids, valid = [], valid0
    for d, (_, parents) in enumerate(levels):
        if d and valid is not None:
            valid = torch.cat([valid, torch.ones_like(valid[:, :1])], dim=1)[parents]
        valids.append(valid)
    ix = _Index()  # ("parents", d): each row's parent row; ("valid", d): depth d's rows' context masks;
    # ("rows", j): tree j's batch rows in node order (its outputs gathered whole)
    for j, (nodes, rows) in _by_tree(order).items():
        ix.add(("rows", j), [r for _, r in sorted(zip(nodes, rows))])
    for d, (_, parents) in enumerate(levels):
        if d:
            ix.add(("parents", d), parents)
        if valids[d] is not None:
            ix.add(("valid", d), valids[d])
    tokens = torch.tensor([trees[j].tokens[n] for j, n in order])
    pos_all = torch.tensor([trees[j].pos + d for d, (rows, _) in enumerate(levels) for j, _ in rows])
    h = x0 = w.rows("embed", tokens) * cfg.embedding_multiplier  # [N, d] (x0: Zamba2's hybrid layers read it again)
    r_mul = cfg.residual_multiplier
    hids = []  # [N, d] after each layer
    for i, kind in enumerate(cfg.layer_pattern):
        p, lw = f"layers.{i}.", _Held(w)
        norm = lw[p + "input_norm"]
        h, pos = h.to(norm.device), pos_all.to(norm.device)
        post = kind == "a" and cfg.attn_post_norm  # norms on the attention's and the MLP's outputs (OLMo-Hybrid)
        xn = h if post or kind == "z" else _rmsnorm(h, norm, cfg.rms_norm_eps)
        if kind == "z":  # Zamba2: attention and its MLP on [h, embeddings] (2d), projected to t; h + Mamba2(norm(h + t))
            xa = _rmsnorm(torch.cat([h, x0.to(h.device)], -1), norm, cfg.rms_norm_eps)
            a = _attention_out(lw, p, cfg, xa, _tree_attention(lw, p, cfg, xa, pos, kv0[i], spans, valids, trees, live, ix, i))
            t = _mlp(lw, p, cfg, _rmsnorm(a, lw[p + "post_norm"], cfg.rms_norm_eps), i) @ lw[p + "hybrid.proj"].T
            z, xbc, dt_raw = _mamba2_proj(lw, p, cfg, _rmsnorm(h + t, lw[p + "hybrid.norm"], cfg.rms_norm_eps))
            o = _tree_recurrence(lambda sl, S, win: _mamba2_core(lw, p, cfg, xbc[sl], dt_raw[sl], S, win),
                                 ssm0[i], conv0[i], spans, trees, live, ix, i, record_states)
            h = h + r_mul * _mamba2_out(lw, p, cfg, o, z)
        elif cfg.residual_from_norm and kind != "f":  # MiniMax's block: the residual is the normed input, sums scaled
            if kind == "a":
                m = _attention_out(lw, p, cfg, xn, _tree_attention(lw, p, cfg, xn, pos, kv0[i], spans, valids, trees, live, ix, i))
                alpha, beta = cfg.attn_alpha, cfg.attn_beta
            else:
                m, alpha, beta = _tree_lightning(lw, p, cfg, xn, ssm0[i], conv0[i], spans, trees, live, ix, i,
                                                 record_states), cfg.linear_alpha, cfg.linear_beta
            xn = _rmsnorm(alpha * xn + beta * m, lw[p + "post_norm"], cfg.rms_norm_eps)
            h = cfg.mlp_alpha * xn + cfg.mlp_beta * _mlp(lw, p, cfg, xn, i)
        elif post:
            a = _attention_out(lw, p, cfg, h, _tree_attention(lw, p, cfg, h, pos, kv0[i], spans, valids, trees, live, ix, i))
            h = h + r_mul * _rmsnorm(a, norm, cfg.rms_norm_eps)
            if cfg.layer_mlp:
                h = h + r_mul * _rmsnorm(_mlp(lw, p, cfg, h, i), lw[p + "post_norm"], cfg.rms_norm_eps)
        elif kind == "f":
            h = h + r_mul * _mlp(lw, p, cfg, xn, i)
        else:
            out = torch.zeros_like(h)
            if kind in "ap":
                out = out + _attention_out(lw, p, cfg, xn, _tree_attention(lw, p, cfg, xn, pos, kv0[i], spans, valids,
                                                                            trees, live, ix, i))
            if kind == "g":
                xin, z, g, beta = _gdn_proj(lw, p, cfg, xn)
                o = _tree_recurrence(lambda sl, S, win: _gdn_core(lw, p, cfg, xin[sl], g[sl], beta[sl], S, win),
                                     ssm0[i], conv0[i], spans, trees, live, ix, i, record_states)
                out = out + _gdn_out(lw, p, cfg, o, z)
            if kind in "mp":
                z, xbc, dt_raw = _mamba2_proj(lw, p, cfg, xn)
                o = _tree_recurrence(lambda sl, S, win: _mamba2_core(lw, p, cfg, xbc[sl], dt_raw[sl], S, win),
                                     ssm0[i], conv0[i], spans, trees, live, ix, i, record_states)
                out = out + _mamba2_out(lw, p, cfg, o, z)
            if kind == "c":
                bg, cg, xs = _short_conv_proj(lw, p, xn)
                o = _tree_recurrence(lambda sl, S, win: _short_conv_core(lw, p, bg[sl], xs[sl], S, win),
                                     ssm0[i], conv0[i], spans, trees, live, ix, i, record_states)
                out = out + (cg * o) @ lw[p + "conv.out"].T
            if kind == "l":
                out = out + _tree_lightning(lw, p, cfg, xn, ssm0[i], conv0[i], spans, trees, live, ix, i, record_states)
            if kind == "k":
                xin, f, b, gate = _kda_proj(lw, p, xn)
                o = _tree_recurrence(lambda sl, S, win: _kda_core(lw, p, cfg, xin[sl], f[sl], b[sl], S, win),
                                     ssm0[i], conv0[i], spans, trees, live, ix, i, record_states)
                out = out + _kda_out(lw, p, cfg, o, gate)
            if kind == "s":
                xz = xn @ lw[p + "mamba1.in"].T
                I = cfg.mamba1_inner
                o = _tree_recurrence(lambda sl, S, win: _mamba1_core(lw, p, cfg, xz[sl, :I], S, win),
                                     ssm0[i], conv0[i], spans, trees, live, ix, i, record_states)
                out = out + (o * F.silu(xz[:, I:])) @ lw[p + "mamba1.out"].T
            h = h + r_mul * out
            if cfg.layer_mlp:
                h = h + r_mul * _mlp(lw, p, cfg, _rmsnorm(h, lw[p + "post_norm"], cfg.rms_norm_eps), i)
        hids.append(h.to(head))
    lw = None  # the last layer's converted weights go before the LM head's are made
    h = h.to(head)
    logits = (_rmsnorm(h, w["final_norm"], cfg.rms_norm_eps) @ w["lm_head"].T) / cfg.logits_scaling
    hid = torch.stack(hids)  # [L, N, d]
    hids.clear()
    for j in live:  # each tree's rows, in node order
        rows = ix(("rows", j), head)
        trees[j].logits, trees[j].hidden = logits[rows], hid[:, rows]
    return [t.result() for t in trees]


def _tree_attention(w, p, cfg, xn, pos, root_kv, spans, valids, trees, live, ix, i):
    """Attention layer i over every node of the batch, xn [N, d] -> [N, nh * hd]: the projections of all
    rows at once, then depth by depth each row over its own prefix (root_kv, the roots' contexts) and
    its ancestors' keys and values at this layer. Records each node's key and value."""
    q, k, v = _attention_proj(w, p, cfg, xn, pos)
    o = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    ctx, dev = root_kv, q.device
    for d, sl in enumerate(spans):
        if d:  # each row's context: its parent's, grown by the parent's own key and value
            before, parents = spans[d - 1], ix(("parents", d), dev)
            ctx = (torch.cat([ctx[0], k[before][:, None]], 1)[parents], torch.cat([ctx[1], v[before][:, None]], 1)[parents])
        o[sl] = _attention_core(cfg, q[sl], k[sl], v[sl], ctx[0], ctx[1], None if valids[d] is None else ix(("valid", d), dev))
    for j in live:
        rows = ix(("rows", j), dev)
        trees[j].kv[i] = (k[rows], v[rows])
    return o


def _tree_lightning(w, p, cfg, xn, S, win, spans, trees, live, ix, i, record_states):
    """Lightning-attention layer i over every node of the batch, xn [N, d] -> [N, d] (_tree_recurrence)."""
    q, k, v = _lightning_proj(w, p, cfg, xn)
    o = _tree_recurrence(lambda sl, S, win: _lightning_core(w, p, q[sl], k[sl], v[sl], S, win), S, win, spans, trees,
                         live, ix, i, record_states)
    return _lightning_out(w, p, cfg, xn, o)


def _tree_recurrence(core, S, win, spans, trees, live, ix, i, record_states):
    """Recurrent layer i over every node, depth by depth: core(rows, S, window) -> (out, S', window')
    for the rows of one depth, each from its parent's state and window at this layer (the roots' S,
    win before depth 0). Returns every row's output [N, ...]; records each node's state and window,
    every depth's gathered in node order for each tree (``live``: the trees with nodes)."""
    outs, dev, N = [], S.device, spans[-1].stop
    S_all = win_all = None  # [N, ...] every row's state and window, in batch order
    for d, sl in enumerate(spans):
        if d:
            parents = ix(("parents", d), dev)
            S, win = S[parents], win[parents]
        o, S, win = core(sl, S, win)
        outs.append(o)
        if record_states:
            if S_all is None:
                S_all, win_all = S.new_empty(N, *S.shape[1:]), win.new_empty(N, *win.shape[1:])
            S_all[sl], win_all[sl] = S, win
    if record_states:
        for j in live:
            rows = ix(("rows", j), dev)
            trees[j].ssm[i], trees[j].conv[i] = S_all[rows], win_all[rows]
    return torch.cat(outs)


def verify_tree(weights, cfg, state: ModelState, parents, tokens, *, record_states: bool = True,
                order: str = "level", device=None, dtype=None, bf16_products: bool | None = None) -> OracleResult:
    """Every node of the block computed from its own root path, one decode step per node from its
    parent's exact state.

    order "level" (default): ``verify_trees`` with one tree: layer by layer, the nodes of one depth
    decoded together as one batch at each layer, each row from its parent's exact state at that layer
    (a level's rows share their position and context length, so they stack without padding); only one
    layer's states of two depths are alive besides what is recorded.
    order "node": one node at a time, depth-first (besides what is recorded, only the states along
    the current root path and its pending siblings' parents are alive). Both are the same per-node
    computation; they differ only in reassociation of batched matrix products.
    """
    if order not in ("level", "node"):
        raise ValueError(f"order: expected 'level' or 'node', got {order!r}")
    if order == "level":
        return verify_trees(weights, cfg, [(state, parents, tokens)], record_states=record_states, device=device,
                            dtype=dtype, bf16_products=bf16_products)[0]
    device, dtype = _placement(weights, device, dtype)
    w = _Weights(weights, cfg, device, dtype, bf16_products)
    ldev = _layer_devices(weights, cfg, device)
    tree = _TreeOut(cfg, state.to(dtype, device), parents, tokens, record_states, dtype, ldev,
                    device or weights["lm_head"].device)
    if not tree.parents:
        return tree.result()
    root_kv, root_ssm, root_conv, _ = _stack_roots(cfg, [tree])
    stack = [(0, tree.pos, root_kv, root_ssm, root_conv)]
    while stack:
        node, pos, kv, ssm, conv = stack.pop()
        lg, hid, new_kv, ssm2, conv2 = decode_step(w, cfg, token=[tree.tokens[node]], pos=[pos], kv_ctx=kv, ssm=ssm,
                                                   conv=conv)
        tree.record(cfg, [node], [0], lg, hid, new_kv, ssm2, conv2, record_states)
        kv2 = _append_kv(kv, new_kv)
        for c in reversed(tree.children[node]):
            stack.append((c, pos + 1, kv2, ssm2, conv2))
    return tree.result()
