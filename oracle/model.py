"""The model-level oracle: plain decoding, one token at a time, in float64 on the CPU (float32 when
run on a GPU for full-size models: ``device``/``dtype``, default from where the weights are).

``verify_tree`` gives every node the state of its own root path: it walks the tree depth-first,
computing each node with one ``decode_step`` from its parent's exact state (parent-state reuse),
so only the states along the current root path are alive at once unless ``record_states`` asks
for every node's state (for the leak metrics).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ddsim.state import ModelState, empty_state

F64 = torch.float64


def _rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean() + eps) * w


def _rope(x, pos, theta, rot):
    """x [n_heads, hd]: its first ``rot`` dims rotated to position pos (rotate-half convention)."""
    inv = theta ** (-torch.arange(0, rot, 2, dtype=F64, device=x.device) / rot)  # [rot/2]
    ang = pos * inv
    cos = torch.cat([torch.cos(ang), torch.cos(ang)]).to(x.dtype)
    sin = torch.cat([torch.sin(ang), torch.sin(ang)]).to(x.dtype)
    xr = x[..., :rot]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], dim=-1) * sin, x[..., rot:]], dim=-1)


def _attention(w, p, cfg, x, pos, ctx_k, ctx_v):
    """One token of causal GQA. x [d]; ctx_k/ctx_v [n, nkv, hd] are all earlier visible tokens."""
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rot = int(hd * cfg.partial_rotary_factor)
    q = (w[p + "attn.q"] @ x).view(nh, hd)
    k = (w[p + "attn.k"] @ x).view(nkv, hd)
    if cfg.qk_norm:
        q = torch.stack([_rmsnorm(q[h], w[p + "attn.q_norm"], cfg.rms_norm_eps) for h in range(nh)])
        k = torch.stack([_rmsnorm(k[h], w[p + "attn.k_norm"], cfg.rms_norm_eps) for h in range(nkv)])
    q = _rope(q, pos, cfg.rope_theta, rot)
    k = _rope(k, pos, cfg.rope_theta, rot)
    v = (w[p + "attn.v"] @ x).view(nkv, hd)
    K = torch.cat([ctx_k, k[None]], dim=0).repeat_interleave(nh // nkv, dim=1)  # [n+1, nh, hd]
    Vv = torch.cat([ctx_v, v[None]], dim=0).repeat_interleave(nh // nkv, dim=1)
    scores = torch.einsum("nhd,hd->hn", K, q) / math.sqrt(hd)  # [nh, n+1]
    out = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), Vv).reshape(-1)  # [nh * hd]
    if cfg.attn_output_gate:
        out = out * torch.sigmoid(w[p + "attn.gate"] @ x)
    return w[p + "attn.o"] @ out, k, v


def _swiglu(x, gate, up, down):
    return down @ (F.silu(gate @ x) * (up @ x))


def _mlp(w, p, cfg, x, i):
    """One token's MLP: SwiGLU, or the MoE block (softmax router over experts, the top-k experts'
    outputs weighted by their (renormalised) probabilities, plus the sigmoid-gated shared expert)."""
    moe = cfg.num_experts > 0 and i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0
    if not moe:
        return _swiglu(x, w[p + "mlp.gate"], w[p + "mlp.up"], w[p + "mlp.down"])
    probs = torch.softmax(w[p + "mlp.router"] @ x, dim=0)
    top, idx = torch.topk(probs, cfg.num_experts_per_tok)
    if cfg.norm_topk_prob:
        top = top / top.sum()
    out = torch.zeros_like(x)
    for pr, e in zip(top, idx.tolist()):
        out = out + pr * _swiglu(x, w[p + "mlp.experts.gate"][e], w[p + "mlp.experts.up"][e], w[p + "mlp.experts.down"][e])
    if p + "mlp.shared.gate" in w:
        out = out + torch.sigmoid(w[p + "mlp.shared_gate"] @ x) * _swiglu(
            x, w[p + "mlp.shared.gate"], w[p + "mlp.shared.up"], w[p + "mlp.shared.down"])
    return out


def _gdn(w, p, cfg, x, S, window):
    """One token of Gated DeltaNet. x [d]; S [HV, K, V]; window [C, W-1]."""
    H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    K, V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    xin = w[p + "gdn.qkv"] @ x  # [C]
    z = (w[p + "gdn.z"] @ x).view(HV, V)
    a = w[p + "gdn.a"] @ x
    b = w[p + "gdn.b"] @ x
    inputs = torch.cat([window, xin[:, None]], dim=1)  # [C, W] oldest first
    y = F.silu((inputs * w[p + "gdn.conv"]).sum(dim=1))
    new_window = inputs[:, 1:]
    q = y[: H * K].view(H, K)
    k = y[H * K: 2 * H * K].view(H, K)
    v = y[2 * H * K:].view(HV, V)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    g = -torch.exp(w[p + "gdn.A_log"]) * F.softplus(a + w[p + "gdn.dt_bias"])  # [HV]
    beta = torch.sigmoid(b)
    group = HV // H
    k = k.repeat_interleave(group, dim=0)  # [HV, K]: value head j reads key head j // group
    q = q.repeat_interleave(group, dim=0)
    # S_t = exp(g) (I - beta k k^T) S_{t-1} + beta k v^T, every value head at once
    eye = torch.eye(K, dtype=S.dtype, device=S.device)
    decay = torch.exp(g)[:, None, None] * (eye - beta[:, None, None] * torch.einsum("hi,hj->hij", k, k))
    S_new = decay @ S + beta[:, None, None] * torch.einsum("hk,hv->hkv", k, v)
    o = torch.einsum("hkv,hk->hv", S_new, q * K ** -0.5)  # o_t = S_t^T (scale q_t)
    o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w[p + "gdn.norm"] * F.silu(z)
    return w[p + "gdn.out"] @ o.reshape(-1), S_new, new_window


def decode_step(w, cfg, *, token, pos, kv_ctx, ssm, conv):
    """One token through the whole model.

    w: weight dict in float64; kv_ctx[l]: (K [n, nkv, hd], V) visible context for attention layers;
    ssm[l], conv[l]: recurrent state before this token for GDN layers.
    Returns (logits [N], hidden [L, d] after each layer, new_kv [l] -> (k, v), ssm', conv').
    """
    h = w["embed"][token]
    hidden, new_kv, ssm2, conv2 = [], [], [], []
    for i, kind in enumerate(cfg.layer_pattern):
        p = f"layers.{i}."
        xn = _rmsnorm(h, w[p + "input_norm"], cfg.rms_norm_eps)
        if kind == "a":
            out, k, v = _attention(w, p, cfg, xn, pos, *kv_ctx[i])
            new_kv.append((k, v))
            ssm2.append(None)
            conv2.append(None)
        else:
            out, S, win = _gdn(w, p, cfg, xn, ssm[i], conv[i])
            new_kv.append(None)
            ssm2.append(S)
            conv2.append(win)
        h = h + out
        h = h + _mlp(w, p, cfg, _rmsnorm(h, w[p + "post_norm"], cfg.rms_norm_eps), i)
        hidden.append(h)
    logits = w["lm_head"] @ _rmsnorm(h, w["final_norm"], cfg.rms_norm_eps)
    return logits, torch.stack(hidden), new_kv, ssm2, conv2


class _Weights:
    """The weights in the oracle's dtype and device; every RMSNorm scale but the GDN gated norm's is
    (norm_offset + weight). Small models are converted once; large ones (a full-size checkpoint on a
    GPU) tensor by tensor as each is used, so no second copy of the model is held."""

    EAGER_BYTES = 2 << 30

    def __init__(self, weights, cfg, device, dtype):
        self.raw, self.cfg, self.device, self.dtype = weights, cfg, torch.device(device), dtype
        total = sum(v.numel() for v in weights.values()) * torch.tensor([], dtype=dtype).element_size()
        self.cache = {k: self._convert(k) for k in weights} if total <= self.EAGER_BYTES else None

    def _convert(self, k):
        v = self.raw[k].detach().to(self.device, self.dtype)
        if k.endswith("norm") and not k.endswith("gdn.norm"):
            v = v + self.cfg.norm_offset
        return v

    def __getitem__(self, k):
        return self.cache[k] if self.cache is not None else self._convert(k)

    def __contains__(self, k):
        return k in self.raw


def default_dtype(device) -> torch.dtype:
    """The oracle's arithmetic unless told otherwise: float64 on the CPU, float32 on a GPU."""
    return F64 if torch.device(device).type == "cpu" else torch.float32


def _placement(weights, device, dtype):
    """Where the weights live unless told otherwise, in default_dtype there."""
    if device is None:
        device = weights["embed"].device
    device = torch.device(device)
    return device, (default_dtype(device) if dtype is None else dtype)


def prefill(weights, cfg, tokens, *, state: ModelState | None = None, device=None, dtype=None):
    """Decode ``tokens`` one at a time from ``state`` (default: empty).

    Returns (state after all tokens, logits [n, N] at each token), in the oracle's dtype.
    """
    device, dtype = _placement(weights, device, dtype)
    w = _Weights(weights, cfg, device, dtype)
    st = (state or empty_state(cfg)).to(dtype, device).clone()
    logits = []
    for tok in tokens:
        lg, _, new_kv, st.ssm, st.conv = decode_step(w, cfg, token=int(tok), pos=st.pos,
                                                     kv_ctx=st.kv, ssm=st.ssm, conv=st.conv)
        st.kv = [None if kv is None else (torch.cat([kv[0], nk[0][None]]), torch.cat([kv[1], nk[1][None]]))
                 for kv, nk in zip(st.kv, new_kv)]
        st.pos += 1
        logits.append(lg)
    return st, (torch.stack(logits) if logits else torch.zeros(0, cfg.vocab_size, dtype=dtype, device=device))


@dataclass
class OracleResult:
    """Per-node oracle outputs for a tree block (float64 on the CPU; float32 on a GPU).

    logits [T, N]; hidden [L, T, d] (residual stream after each layer);
    ssm[l] [T, HV, K, V] and conv[l] [T, C, W-1] for GDN layers when recorded (else None);
    kv[l] = (k [T, nkv, hd], v [T, nkv, hd]) for attention layers (each node's own entry).
    """
    logits: torch.Tensor
    hidden: torch.Tensor
    ssm: list
    conv: list
    kv: list


def verify_tree(weights, cfg, state: ModelState, parents, tokens, *, record_states: bool = True,
                device=None, dtype=None) -> OracleResult:
    """Every node of the block computed from its own root path, one decode step per node from its
    parent's exact state (depth-first: besides what is recorded, only the states along the current
    root path and its pending siblings' parents are alive, O(depth x branching) of them)."""
    device, dtype = _placement(weights, device, dtype)
    w = _Weights(weights, cfg, device, dtype)
    st = state.to(dtype, device)
    parents = [int(x) for x in parents]
    T, L = len(parents), cfg.num_layers
    children = [[] for _ in range(T)]
    for i in range(1, T):
        children[parents[i]].append(i)
    f = dict(dtype=dtype, device=device)
    logits = torch.zeros(T, cfg.vocab_size, **f)
    hidden = torch.zeros(L, T, cfg.hidden_size, **f)
    kv_out = [None] * L
    for i in cfg.attention_layers:
        shape = (T, cfg.num_key_value_heads, cfg.head_dim)
        kv_out[i] = (torch.zeros(shape, **f), torch.zeros(shape, **f))
    ssm_out = [None] * L
    conv_out = [None] * L
    if record_states:
        for i in cfg.gdn_layers:
            ssm_out[i] = torch.zeros(T, *st.ssm[i].shape, **f)
            conv_out[i] = torch.zeros(T, *st.conv[i].shape, **f)

    # stack entries: (node, ssm before it, conv before it, kv context before it, position)
    stack = [(0, st.ssm, st.conv, st.kv, st.pos)] if T else []
    while stack:
        node, ssm, conv, ctx, pos = stack.pop()
        lg, hid, new_kv, ssm2, conv2 = decode_step(w, cfg, token=int(tokens[node]), pos=pos,
                                                   kv_ctx=ctx, ssm=ssm, conv=conv)
        logits[node] = lg
        hidden[:, node] = hid
        ctx2 = []
        for i, (c, nk) in enumerate(zip(ctx, new_kv)):
            if c is None:
                ctx2.append(None)
                continue
            kv_out[i][0][node], kv_out[i][1][node] = nk
            ctx2.append((torch.cat([c[0], nk[0][None]]), torch.cat([c[1], nk[1][None]])))
        if record_states:
            for i in cfg.gdn_layers:
                ssm_out[i][node] = ssm2[i]
                conv_out[i][node] = conv2[i]
        for c in reversed(children[node]):
            stack.append((c, ssm2, conv2, ctx2, pos + 1))
    return OracleResult(logits, hidden, ssm_out, conv_out, kv_out)
