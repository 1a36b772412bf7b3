"""Synthetic weights for the hybrid decoder, deterministic from a seed.

Weights are a flat dict of tensors with these names (shapes for hidden d, vocab N):
  embed [N, d]; final_norm [d]; lm_head [N, d]
  layers.{i}.input_norm [d]; layers.{i}.post_norm [d]
  layers.{i}.mlp.gate [I, d]; .up [I, d]; .down [d, I]                       (SwiGLU)
  attention layer: .attn.q [nh*hd, d]; .attn.k [nkv*hd, d]; .attn.v [nkv*hd, d]; .attn.o [d, nh*hd];
             with attn_output_gate .attn.gate [nh*hd, d]; with qk_norm .attn.q_norm [hd], .attn.k_norm [hd]
             ([nh*hd] and [nkv*hd] with qk_norm_all); with attn_post_norm, input_norm and post_norm norm the
             attention's and the MLP's outputs
  MoE layer (instead of .mlp.gate/up/down): .mlp.router [E, d]; .mlp.experts.gate [E, I, d];
             .mlp.experts.up [E, I, d]; .mlp.experts.down [E, d, I]; .mlp.shared.gate/up/down;
             .mlp.shared_gate [1, d] (with shared_expert_gate)
Norm weights are stored as checkpoints store them: the scale is (cfg.norm_offset + weight) for every
RMSNorm except the GDN, Mamba2 and KDA gated norms (plain weight).
  gdn layer: .gdn.qkv [2*H*K + HV*V, d]; .gdn.z [HV*V, d]; .gdn.a [HV, d]; .gdn.b [HV, d];
             .gdn.conv [2*H*K + HV*V, W]; .gdn.A_log [HV]; .gdn.dt_bias [HV]; .gdn.norm [V];
             .gdn.out [d, HV*V]
  mamba2 layer ('m', 'p', 'z'; I = H*P, Cm = I + 2*G*N): .mamba.z [I, d]; .mamba.xbc [Cm, d];
             .mamba.dt [H, d]; .mamba.conv [Cm, W]; with mamba_conv_bias .mamba.conv_bias [Cm];
             .mamba.dt_bias [H]; .mamba.A_log [H]; .mamba.D [H]; unless mamba_norm == "gate"
             .mamba.norm [I]; .mamba.out [d, I]
  mamba1 layer ('s'; I = mamba1_inner, R = mamba1_dt_rank, N = mamba_state_size): .mamba1.in [2I, d] (x, then z);
             .mamba1.conv [I, W]; with mamba_conv_bias .mamba1.conv_bias [I]; .mamba1.x_proj [R + 2N, I] (dt, B, C);
             with mamba1_bcdt_norm .mamba1.dt_norm [R], .mamba1.b_norm [N], .mamba1.c_norm [N]; .mamba1.dt_proj [I, R];
             .mamba1.dt_bias [I]; .mamba1.A_log [I, N]; .mamba1.D [I]; .mamba1.out [d, I]
  lightning layer ('l'; H = num_attention_heads, hd = head_dim): .lightning.qkv [3*H*hd, d] (per head q, k, v);
             .lightning.norm [H*hd]; .lightning.gate [H*hd, d]; .lightning.out [d, H*hd]; .lightning.slope [H]
             (the decay per step is exp(-slope))
  kda layer ('k'; H heads of K = V dims): .kda.qkv [3HK, d]; .kda.conv [3HK, W]; .kda.f_a [K, d]; .kda.f_b [HK, K];
             .kda.dt_bias [HK]; .kda.A_log [H]; .kda.b [H, d]; .kda.g_a [K, d]; .kda.g_b [HK, K]; .kda.norm [K];
             .kda.out [d, HK]
  MLA attention (mla_kv_lora_rank > 0), instead of .attn.q/k/v: .attn.q [nh*qk, d] (or .attn.q_a [ql, d],
             .attn.q_a_norm [ql], .attn.q_b [nh*qk, ql]); .attn.kv_a [kvl + rope, d]; .attn.kv_a_norm [kvl];
             .attn.kv_b [nh*(nope + v), kvl]; .attn.o [d, nh*v]
  short conv layer ('c'): .conv.in [3d, d] (B, C, x in that order); .conv.conv [d, W]; .conv.out [d, d]
  Zamba2's hybrid layer ('z'): the attention's weights read the [h, embeddings] input: .input_norm [2d],
             .attn.q [nh*hd, 2d], .attn.k/.attn.v [nkv*hd, 2d] (.attn.gate [nh*hd, 2d]); post_norm and the MLP are
             its transformer block's; .hybrid.proj [d, d] projects the block's output; .hybrid.norm [d] norms
             h + that before the Mamba2 weights above
  'f' layers have the MLP under input_norm and no post_norm; with layer_mlp=False mixer layers have
  no MLP and no post_norm ('z' layers keep theirs); mlp_act "relu2" MLPs have .mlp.up and .mlp.down only.
The oracle and the fast path read the same dict; nothing else is shared.
"""
from __future__ import annotations

import math

import torch

from ddsim.model.config import ModelConfig


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight name of a config with its shape (the layout documented above)."""
    d, N = cfg.hidden_size, cfg.vocab_size
    out = {"embed": (N, d), "final_norm": (d,), "lm_head": (N, d)}
    for i, kind in enumerate(cfg.layer_pattern):
        p = f"layers.{i}."
        out[p + "input_norm"] = (cfg.attention_input(i),)
        if cfg.has_mlp(i):
            if kind != "f":
                out[p + "post_norm"] = (d,)
            out.update(_mlp_shapes(cfg, p, i))
        if kind in "ap" and cfg.mla_kv_lora_rank:
            out.update(_mla_shapes(cfg, p))
        elif kind in "apz":
            nh, nkv, hd, da = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attention_input(i)
            out.update({p + "attn.q": (nh * hd, da), p + "attn.k": (nkv * hd, da), p + "attn.v": (nkv * hd, da),
                        p + "attn.o": (d, nh * hd)})
            if cfg.attn_output_gate:
                out[p + "attn.gate"] = (nh * hd, da)
            if cfg.qk_norm:
                out[p + "attn.q_norm"], out[p + "attn.k_norm"] = ((nh * hd,), (nkv * hd,)) if cfg.qk_norm_all else ((hd,), (hd,))
        if kind == "g":
            HV, V, C = cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.conv_dim
            out.update({p + "gdn.qkv": (C, d), p + "gdn.z": (HV * V, d), p + "gdn.a": (HV, d), p + "gdn.b": (HV, d),
                        p + "gdn.conv": (C, cfg.conv_kernel_size), p + "gdn.A_log": (HV,), p + "gdn.dt_bias": (HV,),
                        p + "gdn.norm": (V,), p + "gdn.out": (d, HV * V)})
        if kind == "z":
            out.update({p + "hybrid.proj": (d, d), p + "hybrid.norm": (d,)})
        if kind in "mpz":
            H, I, Cm = cfg.mamba_num_heads, cfg.mamba_inner, cfg.mamba_conv_dim
            out.update({p + "mamba.z": (I, d), p + "mamba.xbc": (Cm, d), p + "mamba.dt": (H, d),
                        p + "mamba.conv": (Cm, cfg.conv_kernel_size), p + "mamba.dt_bias": (H,), p + "mamba.A_log": (H,),
                        p + "mamba.D": (H,), p + "mamba.out": (d, I)})
            if cfg.mamba_conv_bias:
                out[p + "mamba.conv_bias"] = (Cm,)
            if cfg.mamba_norm != "gate":
                out[p + "mamba.norm"] = (I,)
        if kind == "s":
            I, R, Ns, W = cfg.mamba1_inner, cfg.mamba1_dt_rank, cfg.mamba_state_size, cfg.conv_kernel_size
            out.update({p + "mamba1.in": (2 * I, d), p + "mamba1.conv": (I, W), p + "mamba1.x_proj": (R + 2 * Ns, I),
                        p + "mamba1.dt_proj": (I, R), p + "mamba1.dt_bias": (I,), p + "mamba1.A_log": (I, Ns),
                        p + "mamba1.D": (I,), p + "mamba1.out": (d, I)})
            if cfg.mamba_conv_bias:
                out[p + "mamba1.conv_bias"] = (I,)
            if cfg.mamba1_bcdt_norm:
                out.update({p + "mamba1.dt_norm": (R,), p + "mamba1.b_norm": (Ns,), p + "mamba1.c_norm": (Ns,)})
        if kind == "l":
            Hl, hd = cfg.num_attention_heads, cfg.head_dim
            out.update({p + "lightning.qkv": (3 * Hl * hd, d), p + "lightning.norm": (Hl * hd,),
                        p + "lightning.gate": (Hl * hd, d), p + "lightning.out": (d, Hl * hd), p + "lightning.slope": (Hl,)})
        if kind == "k":
            H, K, W = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.conv_kernel_size
            out.update({p + "kda.qkv": (3 * H * K, d), p + "kda.conv": (3 * H * K, W), p + "kda.f_a": (K, d),
                        p + "kda.f_b": (H * K, K), p + "kda.dt_bias": (H * K,), p + "kda.A_log": (H,), p + "kda.b": (H, d),
                        p + "kda.g_a": (K, d), p + "kda.g_b": (H * K, K), p + "kda.norm": (K,), p + "kda.out": (d, H * K)})
        if kind == "c":
            out.update({p + "conv.in": (3 * d, d), p + "conv.conv": (d, cfg.conv_kernel_size), p + "conv.out": (d, d)})
    return out


def _mla_shapes(cfg: ModelConfig, p: str) -> dict:
    d, nh = cfg.hidden_size, cfg.num_attention_heads
    qk, vd = cfg.mla_qk_nope_head_dim + cfg.mla_qk_rope_head_dim, cfg.mla_v_head_dim
    kvl, ql = cfg.mla_kv_lora_rank, cfg.mla_q_lora_rank
    out = {p + "attn.kv_a": (kvl + cfg.mla_qk_rope_head_dim, d), p + "attn.kv_a_norm": (kvl,),
           p + "attn.kv_b": (nh * (cfg.mla_qk_nope_head_dim + vd), kvl), p + "attn.o": (d, nh * vd)}
    if ql:
        out.update({p + "attn.q_a": (ql, d), p + "attn.q_a_norm": (ql,), p + "attn.q_b": (nh * qk, ql)})
    else:
        out[p + "attn.q"] = (nh * qk, d)
    return out


def _mlp_shapes(cfg: ModelConfig, p: str, i: int) -> dict:
    d = cfg.hidden_size
    gated = cfg.gated_mlp  # relu^2 MLPs and experts have up and down only
    if cfg.is_moe_layer(i):
        E, I, Is = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        out = {p + "mlp.router": (E, d), p + "mlp.experts.up": (E, I, d), p + "mlp.experts.down": (E, d, I)}
        if gated:
            out[p + "mlp.experts.gate"] = (E, I, d)
        if cfg.moe_router == "sigmoid":
            out[p + "mlp.router_bias"] = (E,)
        if Is:
            out.update({p + "mlp.shared.up": (Is, d), p + "mlp.shared.down": (d, Is)})
            if gated:
                out[p + "mlp.shared.gate"] = (Is, d)
            if cfg.shared_expert_gate:
                out[p + "mlp.shared_gate"] = (1, d)
        return out
    I = cfg.intermediate_size
    out = {p + "mlp.up": (I, d), p + "mlp.down": (d, I)}
    if gated:
        out[p + "mlp.gate"] = (I, d)
    return out


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def init_weights(cfg: ModelConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", layer_devices=None) -> dict[str, torch.Tensor]:
    """Random weights with the gate and logit statistics of the config (see ddsim.model.config).

    Generated on ``device`` itself (so a 27B-parameter preset never passes through host memory);
    the same seed gives the same weights on the same kind of device. ``layer_devices`` (one device
    per layer, ddsim.model.placement.plan_layers): each layer's tensors generated on its own device, the
    embedding on the first and the head on the last, each device with its own generator of the same
    seed (so a placed model's weights differ from the one-device model's of the same seed)."""
    device = torch.device(device)
    placed = layer_devices is not None and len(set(layer_devices)) > 1
    gens = {}

    def gen_on(dev):
        if dev not in gens:
            gens[dev] = torch.Generator(device=dev).manual_seed(int(seed))
        return gens[dev]

    d, N, L = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    out_scale = 1.0 / math.sqrt(2.0 * L)
    where = {"dev": torch.device(layer_devices[0]) if placed else device}  # the device being filled

    def normal(*shape, std=1.0):
        dev = where["dev"]
        return (torch.randn(*shape, generator=gen_on(dev), dtype=torch.float32, device=dev) * std).to(dtype)

    def linear(n_out, n_in, scale=1.0):
        return normal(n_out, n_in, std=scale / math.sqrt(n_in))

    def norm_weight(n):  # scale (norm_offset + weight) near 1
        return (1.0 - cfg.norm_offset) + normal(n, std=0.05)

    def decays(n):
        """(A, dt) of n heads: A ~ U(1, 16) as initialised in Qwen3-Next, dt at each head's typical
        memory half-life, log-uniform quantiles over gate_halflife, shuffled across heads."""
        dev = where["dev"]
        A = 1.0 + 15.0 * torch.rand(n, generator=gen_on(dev), device=dev)
        lo, hi = cfg.gate_halflife
        frac = (torch.arange(n, dtype=torch.float64, device=dev) + 0.5) / n
        frac = frac[torch.randperm(n, generator=gen_on(dev), device=dev)]
        halflife = lo * (hi / lo) ** frac
        return A, math.log(2.0) / (halflife * A.double())  # -g = A * dt = ln2 / halflife

    w: dict[str, torch.Tensor] = {"embed": normal(N, d)}
    for i, kind in enumerate(cfg.layer_pattern):
        p = f"layers.{i}."
        if placed:
            where["dev"] = torch.device(layer_devices[i])
        w[p + "input_norm"] = norm_weight(cfg.attention_input(i))
        if cfg.has_mlp(i):
            if kind != "f":
                w[p + "post_norm"] = norm_weight(d)
            if cfg.is_moe_layer(i):
                E, I, Is = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
                gated = cfg.gated_mlp
                w[p + "mlp.router"] = linear(E, d, 2.0)
                if gated:
                    w[p + "mlp.experts.gate"] = normal(E, I, d, std=1.0 / math.sqrt(d))
                w[p + "mlp.experts.up"] = normal(E, I, d, std=1.0 / math.sqrt(d))
                w[p + "mlp.experts.down"] = normal(E, d, I, std=out_scale / math.sqrt(I))
                if cfg.moe_router == "sigmoid":
                    w[p + "mlp.router_bias"] = normal(E, std=0.1)
                if Is:
                    if gated:
                        w[p + "mlp.shared.gate"] = linear(Is, d)
                    w[p + "mlp.shared.up"] = linear(Is, d)
                    w[p + "mlp.shared.down"] = linear(d, Is, out_scale)
                    if cfg.shared_expert_gate:
                        w[p + "mlp.shared_gate"] = linear(1, d)
            else:
                I = cfg.intermediate_size
                if cfg.gated_mlp:
                    w[p + "mlp.gate"] = linear(I, d)
                w[p + "mlp.up"] = linear(I, d)
                w[p + "mlp.down"] = linear(d, I, out_scale)
        if kind in "ap" and cfg.mla_kv_lora_rank:
            for name, shape in _mla_shapes(cfg, p).items():
                w[name] = norm_weight(shape[0]) if name.endswith("norm") else linear(*shape, out_scale if name.endswith(
                    "attn.o") else 1.0)
        elif kind in "apz":
            nh, nkv, hd, da = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attention_input(i)
            w[p + "attn.q"] = linear(nh * hd, da)
            w[p + "attn.k"] = linear(nkv * hd, da)
            w[p + "attn.v"] = linear(nkv * hd, da)
            w[p + "attn.o"] = linear(d, nh * hd, out_scale)
            if cfg.attn_output_gate:
                w[p + "attn.gate"] = linear(nh * hd, da)
            if cfg.qk_norm:
                w[p + "attn.q_norm"] = norm_weight(nh * hd if cfg.qk_norm_all else hd)
                w[p + "attn.k_norm"] = norm_weight(nkv * hd if cfg.qk_norm_all else hd)
        if kind == "g":
            HV, V, W = cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.conv_kernel_size
            C = cfg.conv_dim
            w[p + "gdn.qkv"] = linear(C, d)
            w[p + "gdn.z"] = linear(HV * V, d)
            # gate input a = x . W_a has std gate_noise for unit-RMS x
            w[p + "gdn.a"] = linear(HV, d, cfg.gate_noise)
            w[p + "gdn.b"] = linear(HV, d)
            w[p + "gdn.conv"] = normal(C, W, std=1.0 / math.sqrt(W))
            A, dt = decays(HV)
            w[p + "gdn.A_log"] = torch.log(A).to(dtype)
            w[p + "gdn.dt_bias"] = _inv_softplus(dt).to(dtype)
            w[p + "gdn.norm"] = 1.0 + normal(V, std=0.05)
            w[p + "gdn.out"] = linear(d, HV * V, out_scale)
        if kind == "z":
            w[p + "hybrid.proj"] = linear(d, d, out_scale)
            w[p + "hybrid.norm"] = norm_weight(d)
        if kind in "mpz":
            H, I, Cm, W = cfg.mamba_num_heads, cfg.mamba_inner, cfg.mamba_conv_dim, cfg.conv_kernel_size
            w[p + "mamba.z"] = linear(I, d)
            w[p + "mamba.xbc"] = linear(Cm, d)
            w[p + "mamba.dt"] = linear(H, d, cfg.gate_noise)  # the token-dependent part of log dt
            w[p + "mamba.conv"] = normal(Cm, W, std=1.0 / math.sqrt(W))
            if cfg.mamba_conv_bias:
                w[p + "mamba.conv_bias"] = normal(Cm, std=0.1)
            A, dt = decays(H)
            w[p + "mamba.A_log"] = torch.log(A).to(dtype)
            w[p + "mamba.dt_bias"] = _inv_softplus(dt).to(dtype)
            w[p + "mamba.D"] = 1.0 + normal(H, std=0.1)
            if cfg.mamba_norm != "gate":
                w[p + "mamba.norm"] = 1.0 + normal(I, std=0.05)
            w[p + "mamba.out"] = linear(d, I, out_scale)
        if kind == "s":
            I, R, Ns, W = cfg.mamba1_inner, cfg.mamba1_dt_rank, cfg.mamba_state_size, cfg.conv_kernel_size
            w[p + "mamba1.in"] = linear(2 * I, d)
            w[p + "mamba1.conv"] = normal(I, W, std=1.0 / math.sqrt(W))
            if cfg.mamba_conv_bias:
                w[p + "mamba1.conv_bias"] = normal(I, std=0.1)
            w[p + "mamba1.x_proj"] = linear(R + 2 * Ns, I)
            if cfg.mamba1_bcdt_norm:
                for n, size in (("dt_norm", R), ("b_norm", Ns), ("c_norm", Ns)):
                    w[p + "mamba1." + n] = norm_weight(size)
            w[p + "mamba1.dt_proj"] = linear(I, R, cfg.gate_noise)  # the token-dependent part of log dt
            # S4D-real A = -(1..N) per channel (Mamba's initialisation); each channel's typical step dt set so
            # its slowest state index (A = -1) has its half-life, spread log-uniformly over gate_halflife
            A1, dt = decays(I)
            w[p + "mamba1.A_log"] = torch.log(torch.arange(1, Ns + 1, dtype=torch.float32, device=where["dev"])).expand(
                I, Ns).to(dtype).clone()
            w[p + "mamba1.dt_bias"] = _inv_softplus(dt * A1.double()).to(dtype)
            w[p + "mamba1.D"] = 1.0 + normal(I, std=0.1)
            w[p + "mamba1.out"] = linear(d, I, out_scale)
        if kind == "l":
            Hl, hd = cfg.num_attention_heads, cfg.head_dim
            w[p + "lightning.qkv"] = linear(3 * Hl * hd, d)
            w[p + "lightning.norm"] = norm_weight(Hl * hd)
            w[p + "lightning.gate"] = linear(Hl * hd, d)
            w[p + "lightning.out"] = linear(d, Hl * hd, out_scale)
            # MiniMax's slopes: base^(h+1), base = 2^(-8/H), shrinking with depth to about 0 at the last layer
            base = 2.0 ** (-8.0 / Hl)
            depth = 1.0 - i / (cfg.num_layers - 1 + 1e-5) + 1e-5
            w[p + "lightning.slope"] = torch.tensor([base ** (h + 1) * depth for h in range(Hl)], device=where["dev"]).to(dtype)
        if kind == "k":
            H, K, W = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.conv_kernel_size
            w[p + "kda.qkv"] = linear(3 * H * K, d)
            w[p + "kda.conv"] = normal(3 * H * K, W, std=1.0 / math.sqrt(W))
            w[p + "kda.f_a"] = linear(K, d)
            w[p + "kda.f_b"] = linear(H * K, K, cfg.gate_noise)  # the token-dependent part of each channel's gate
            A, dt = decays(H)  # each head's channels at its typical half-life
            w[p + "kda.A_log"] = torch.log(A).to(dtype)
            w[p + "kda.dt_bias"] = _inv_softplus(dt).repeat_interleave(K).to(dtype)
            w[p + "kda.b"] = linear(H, d)
            w[p + "kda.g_a"] = linear(K, d)
            w[p + "kda.g_b"] = linear(H * K, K)
            w[p + "kda.norm"] = 1.0 + normal(K, std=0.05)
            w[p + "kda.out"] = linear(d, H * K, out_scale)
        if kind == "c":
            w[p + "conv.in"] = linear(3 * d, d)
            w[p + "conv.conv"] = normal(d, cfg.conv_kernel_size, std=1.0 / math.sqrt(cfg.conv_kernel_size))
            w[p + "conv.out"] = linear(d, d, out_scale)
    if placed:
        where["dev"] = torch.device(layer_devices[-1])
    w["final_norm"] = norm_weight(d)
    w["lm_head"] = linear(N, d, cfg.logit_std)
    return w
