"""Mamba2-hybrid checkpoints: the architectures transformers calls ``nemotron_h`` (Nemotron-H),
``bamba`` (Bamba), ``granitemoehybrid`` (Granite-4.0-H, dense) and ``falcon_h1`` (Falcon-H1).
ddsim.model.checkpoint reads the directory; this module turns their config.json into a ModelConfig and
maps their tensors into ddsim's layout (ddsim.model.weights).

Layout notes (from the reference implementation in transformers):
- every Mamba2 mixer packs in_proj as [z (I), x || B || C (I + 2GN), dt (H)]; the conv runs over
  x || B || C with a bias; the gated RMSNorm normalises each of the G groups of I/G channels.
- Nemotron-H: tensors under "backbone." (as its checkpoints and transformers' save_pretrained name
  them; "model." is read too); one mixer per block ('M' Mamba2, '*' attention without RoPE, '-' a relu^2
  MLP, 'E' the MoE: relu^2 experts stored one by one, a sigmoid router with a score-correction bias
  and grouped top-k, a relu^2 shared expert), so ``layer_mlp=False``; its Mamba2 mixer clamps dt from
  below at time_step_min.
- Bamba: a mixer and a SwiGLU MLP per layer; attention with (partial) RoPE.
- Granite-4.0-H: Bamba's layout plus scalings (embedding, residual, attention scale, logits), the
  SwiGLU packed as input_linear [gate; up]; attention without RoPE unless position_embedding_type
  is "rope". With num_local_experts > 0 every layer's MLP is the routed MoE (experts of
  intermediate_size, top-k of the router's logits softmaxed over the k chosen, i.e. the softmax over
  all experts renormalised over the top k) plus the shared MLP added ungated.
- Falcon-H1: attention and Mamba2 in parallel in every layer (kind 'p'); its multipliers are folded
  into the weights they scale (in float32, then back to the checkpoint's dtype): attention in/out
  and key multipliers into q/k/v/o, ssm in/out multipliers and the per-section mup vector into
  in_proj/out_proj, the MLP multipliers into gate/down; the embedding and lm-head multipliers
  become ``embedding_multiplier`` and ``logits_scaling``.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_default_rope, rope_parameters

ARCHS = ("nemotron_h", "bamba", "granitemoehybrid", "falcon_h1")
PREFIXES = ("model.", "backbone.")  # Nemotron-H checkpoints name the decoder "backbone"
_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def _number(v) -> float:
    """A config number; transformers writes infinities as {"__float__": "Infinity"}."""
    if isinstance(v, dict) and "__float__" in v:
        return float(v["__float__"])
    return float(v)


def _layer_kinds(mt: str, raw: dict, where: Path) -> str:
    n = raw.get("num_hidden_layers")
    if n is None and mt != "nemotron_h":  # transformers counts Nemotron-H's layers from its pattern; the others' count is given
        raise InputError(f"{where}: missing field 'num_hidden_layers'")
    if mt == "falcon_h1":
        return "p" * int(n)
    if mt == "nemotron_h":
        types = raw.get("layers_block_type")
        if types is None and raw.get("hybrid_override_pattern"):
            types = [{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}.get(c, c) for c in raw["hybrid_override_pattern"]]
    elif mt == "bamba" and raw.get("layer_types") is None and "attn_layer_indices" in raw:
        idx = set(raw.get("attn_layer_indices") or [])
        types = ["attention" if i in idx else "mamba" for i in range(int(n))]
    else:
        types = raw.get("layer_types") or raw.get("layers_block_type")
    if not types:
        raise InputError(f"{where}: no layer types (layer_types / layers_block_type)")
    kinds = {"mamba": "m", "linear_attention": "m", "attention": "a", "full_attention": "a", "mlp": "f"}
    if mt == "nemotron_h":
        kinds["moe"] = "f"  # an MLP block whose MLP is the routed MoE (moe_blocks tells them apart)
    bad = [t for t in types if t not in kinds]
    if bad:
        why = "routed-expert blocks are supported for nemotron_h only" if bad[0] == "moe" else "unknown layer type"
        raise InputError(f"{where}: {why} ({bad[0]!r})")
    if n is not None and len(types) != n:
        raise InputError(f"{where}: {len(types)} layer types for {n} layers")
    return "".join(kinds[t] for t in types)


def read_mamba_config(raw: dict, d: Path) -> ModelConfig:
    """A ModelConfig from the config.json of one of ARCHS (a missing or malformed field raises KeyError,
    TypeError or ValueError: ddsim.model.checkpoint.read_config names the file)."""
    mt = raw["model_type"]
    where = d / "config.json"
    for flag in ("attention_bias", "mlp_bias", "mamba_proj_bias", "use_bias", "projectors_bias"):
        if raw.get(flag):
            raise InputError(f"{where}: {flag}=true is not supported")
    act = raw.get("mlp_hidden_act" if mt == "nemotron_h" else "hidden_act", "silu")
    if act not in (("relu2",) if mt == "nemotron_h" else ("silu",)):
        raise InputError(f"{where}: MLP activation {act!r} is not supported")
    pattern = _layer_kinds(mt, raw, where)
    types = raw.get("layers_block_type") or [{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}.get(c, c)
                                             for c in raw.get("hybrid_override_pattern", "")]
    nh = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or raw["hidden_size"] // nh)
    rope = rope_parameters(raw, where=where)
    if mt == "nemotron_h":
        H, P, N = raw["mamba_num_heads"], raw["mamba_head_dim"], raw["ssm_state_size"]
        G, W, bias = raw["n_groups"], raw["conv_kernel"], raw.get("use_conv_bias", True)
        limit = (float(raw.get("time_step_min", 0.0)), math.inf)  # transformers' NemotronHMamba2Mixer.time_step_limit
        eps = raw.get("layer_norm_epsilon", 1e-5)
    else:
        H, N, G = raw["mamba_n_heads"], raw["mamba_d_state"], raw["mamba_n_groups"]
        inner = raw.get("mamba_d_ssm") if mt == "falcon_h1" else None
        inner = int(inner or raw.get("mamba_expand", 2) * raw["hidden_size"])
        P = raw.get("mamba_d_head")
        P = inner // H if P in (None, "auto") else int(P)
        if H * P != inner:
            raise InputError(f"{where}: mamba_n_heads * mamba_d_head = {H * P} != the Mamba2 inner width {inner}")
        W, bias = raw.get("mamba_d_conv", 4), raw.get("mamba_conv_bias", True)
        lo, hi = raw.get("time_step_limit") or (0.0, math.inf)
        limit = (_number(lo), math.inf if hi is None else _number(hi))
        eps = raw.get("rms_norm_eps", 1e-6)
    norm = "gated"
    if mt == "falcon_h1":
        norm = ("gated-before" if raw.get("mamba_norm_before_gate", True) else "gated") if raw.get("mamba_rms_norm") else "gate"
    use_rope = mt in ("bamba", "falcon_h1") or (mt == "granitemoehybrid" and raw.get("position_embedding_type") == "rope")
    if use_rope:
        check_default_rope(raw, where=where)
    # the fraction of each head RoPE turns, as transformers runs it: Bamba's half unless rope_parameters names
    # another (a top-level partial_rotary_factor is not read); Falcon-H1's and Granite's attention turns the whole
    # head whatever the config says, so another fraction there is refused rather than run as either
    prf = rope.get("partial_rotary_factor", 0.5 if mt == "bamba" else 1.0)
    if use_rope and mt != "bamba" and float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise InputError(f"{where}: a partial_rotary_factor other than 1 is not supported for {mt} (its attention "
                         "turns the whole head)")
    extra = {}
    if mt == "granitemoehybrid":
        extra = dict(embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)),
                     residual_multiplier=float(raw.get("residual_multiplier", 1.0)),
                     attention_scale=float(raw.get("attention_multiplier") or 0.0),
                     logits_scaling=float(raw.get("logits_scaling", 1.0)))
    if mt == "falcon_h1":
        extra = dict(embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)),
                     logits_scaling=1.0 / float(raw.get("lm_head_multiplier", 1.0)))
    inter = raw.get("shared_intermediate_size") if mt == "granitemoehybrid" else raw.get("intermediate_size")
    if mt == "nemotron_h" and "moe" in types:  # Nemotron-H's MoE blocks: relu^2 experts, grouped sigmoid router
        if raw.get("moe_latent_size") is not None:
            raise InputError(f"{where}: moe_latent_size={raw['moe_latent_size']}: latent MoE projections are not supported")
        if int(raw.get("n_shared_experts", 1) or 0) > 1:
            raise InputError(f"{where}: n_shared_experts={raw['n_shared_experts']}: one shared expert is supported")
        extra.update(num_experts=int(raw["n_routed_experts"]), num_experts_per_tok=int(raw["num_experts_per_tok"]),
                     moe_intermediate_size=int(raw["moe_intermediate_size"]),
                     shared_expert_intermediate_size=int(raw.get("moe_shared_expert_intermediate_size") or 0)
                     if int(raw.get("n_shared_experts", 1) or 0) else 0,
                     shared_expert_gate=False, norm_topk_prob=bool(raw.get("norm_topk_prob", True)), moe_router="sigmoid",
                     moe_n_group=int(raw.get("n_group", 1)), moe_topk_group=int(raw.get("topk_group", 1)),
                     routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
                     mlp_only_layers=tuple(i for i, t in enumerate(types) if t != "moe"))
    E = int(raw.get("num_local_experts") or 0) if mt == "granitemoehybrid" else 0
    if E:  # every layer's MLP: routed experts of intermediate_size (top-k softmax) plus the shared MLP
        extra.update(num_experts=E, num_experts_per_tok=int(raw.get("num_experts_per_tok", 1)),
                     moe_intermediate_size=int(raw["intermediate_size"]),
                     shared_expert_intermediate_size=int(raw.get("shared_intermediate_size") or 0),
                     shared_expert_gate=False, norm_topk_prob=True)
    return ModelConfig(
        name=d.name, architecture=mt, vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        layer_pattern=pattern, intermediate_size=int(inter or 1), num_attention_heads=nh,
        num_key_value_heads=int(raw.get("num_key_value_heads") or nh), head_dim=head_dim,
        rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        partial_rotary_factor=float(prf),
        conv_kernel_size=int(W), rms_norm_eps=float(eps),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        mamba_num_heads=int(H), mamba_head_dim=int(P), mamba_state_size=int(N), mamba_n_groups=int(G),
        mamba_conv_bias=bool(bias), mamba_dt_limit=limit, mamba_norm=norm, layer_mlp=mt != "nemotron_h",
        mlp_act="relu2" if mt == "nemotron_h" else "swiglu", use_rope=use_rope,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), notes=f"checkpoint {d}", **extra)


def _mup_rows(raw: dict, cfg: ModelConfig) -> torch.Tensor:
    """Falcon-H1's per-row scale of in_proj: ssm_in_multiplier times the mup vector over the
    sections [z (I), x (I), B (GN), C (GN), dt (H)]."""
    I, GN, H = cfg.mamba_inner, cfg.mamba_n_groups * cfg.mamba_state_size, cfg.mamba_num_heads
    mult = raw.get("ssm_multipliers") or [1.0] * 5
    sizes = [I, I, GN, GN, H]
    return float(raw.get("ssm_in_multiplier", 1.0)) * torch.cat(
        [torch.full((n,), float(m), dtype=torch.float32) for n, m in zip(sizes, mult)])


class MambaMapper:
    """Maps one checkpoint tensor at a time into ddsim's layout (the mapper contract of
    ddsim.model.checkpoint: call(key, tensor), writing into ``out``)."""

    def __init__(self, cfg: ModelConfig, meta: dict, device, out: dict, raw: dict):
        self.cfg, self.meta, self.device, self.out, self.raw = cfg, meta, device, out, raw
        self.mt = meta["model_type"]

    def put(self, name, t, scale=None):
        if scale is not None:  # a folded multiplier: scaled in float32, stored in the checkpoint's dtype
            s = torch.as_tensor(scale, dtype=torch.float32)
            t = (t.float() * (s[:, None] if s.dim() == 1 else s)).to(t.dtype)
        dev = self.device
        if self.meta.get("layer_devices") is not None:
            from ddsim.model.placement import weight_device
            dev = weight_device(name, self.meta["layer_devices"])
        self.out[name] = t.to(dev)

    def expert(self, name, e, t):
        """Expert e's slice of a stacked [E, ...] expert tensor, allocated on first use."""
        if name not in self.out:
            from ddsim.model.weights import weight_shapes
            dev = self.device
            if self.meta.get("layer_devices") is not None:
                from ddsim.model.placement import weight_device
                dev = weight_device(name, self.meta["layer_devices"])
            self.out[name] = torch.empty(weight_shapes(self.cfg)[name], dtype=t.dtype, device=dev)
        self.out[name][e] = t.to(self.out[name].device)

    def __call__(self, key: str, t: torch.Tensor) -> None:
        cfg, raw = self.cfg, self.raw
        if key == "lm_head.weight":
            return self.put("lm_head", t)
        pre = next((x for x in PREFIXES if key.startswith(x)), None)
        if pre is None:
            raise InputError(f"tensor {key!r} is not part of a {self.mt} decoder (refused rather than ignored)")
        k = key[len(pre):]
        if k in ("embed_tokens.weight", "embeddings.weight"):
            return self.put("embed", t)
        if k in ("norm.weight", "norm_f.weight", "final_layernorm.weight"):
            return self.put("final_norm", t)
        m = _LAYER.fullmatch(k)
        if not m:
            raise InputError(f"tensor {key!r} is not part of a {self.mt} decoder (refused rather than ignored)")
        i, rest = int(m.group(1)), m.group(2)
        if i >= cfg.num_layers:
            raise InputError(f"tensor {key!r} is for layer {i}, but config.json lists {cfg.num_layers} layers "
                             "(the audit would drop layers and run another model)")
        p, kind = f"layers.{i}.", cfg.layer_pattern[i]
        falcon = self.mt == "falcon_h1"
        if self.mt == "nemotron_h":  # one mixer per block, under "mixer."
            if rest == "norm.weight":
                return self.put(p + "input_norm", t)
            mix = {"m": "mamba.", "a": "self_attn.", "f": "mlp."}[kind]
            rest = mix + rest[len("mixer."):] if rest.startswith("mixer.") else rest
        attn_in = float(raw.get("attention_in_multiplier", 1.0)) if falcon else None
        simple = {
            "input_layernorm.weight": ("input_norm", None), "pre_ff_layernorm.weight": ("post_norm", None),
            "post_attention_layernorm.weight": ("post_norm", None),
            "self_attn.q_proj.weight": ("attn.q", attn_in),
            "self_attn.k_proj.weight": ("attn.k", attn_in * float(raw.get("key_multiplier", 1.0)) if falcon else None),
            "self_attn.v_proj.weight": ("attn.v", attn_in),
            "self_attn.o_proj.weight": ("attn.o", float(raw.get("attention_out_multiplier", 1.0)) if falcon else None),
            "feed_forward.gate_proj.weight": ("mlp.gate", (raw.get("mlp_multipliers") or [1.0, 1.0])[0] if falcon else None),
            "feed_forward.up_proj.weight": ("mlp.up", None),
            "feed_forward.down_proj.weight": ("mlp.down", (raw.get("mlp_multipliers") or [1.0, 1.0])[1] if falcon else None),
            "mlp.up_proj.weight": ("mlp.up", None), "mlp.down_proj.weight": ("mlp.down", None),
            "mamba.dt_bias": ("mamba.dt_bias", None), "mamba.A_log": ("mamba.A_log", None), "mamba.D": ("mamba.D", None),
            "mamba.conv1d.bias": ("mamba.conv_bias", None), "mamba.norm.weight": ("mamba.norm", None),
            "mamba.out_proj.weight": ("mamba.out", float(raw.get("ssm_out_multiplier", 1.0)) if falcon else None),
        }
        if rest in simple:
            name, scale = simple[rest]
            return self.put(p + name, t, None if scale in (None, 1.0) else scale)
        if rest == "mamba.conv1d.weight":  # [Cm, 1, W]
            return self.put(p + "mamba.conv", t.reshape(t.shape[0], -1))
        if rest == "mamba.in_proj.weight":  # [z (I); x || B || C (Cm); dt (H)]
            if falcon:
                t = (t.float() * _mup_rows(raw, cfg)[:, None]).to(t.dtype)
            I, Cm = cfg.mamba_inner, cfg.mamba_conv_dim
            self.put(p + "mamba.z", t[:I])
            self.put(p + "mamba.xbc", t[I:I + Cm])
            return self.put(p + "mamba.dt", t[I + Cm:])
        moe = cfg.is_moe_layer(i)
        if rest == "shared_mlp.input_linear.weight":  # [gate; up]: the layer's MLP, or its shared expert
            I = cfg.shared_expert_intermediate_size if moe else cfg.intermediate_size
            self.put(p + ("mlp.shared.gate" if moe else "mlp.gate"), t[:I])
            return self.put(p + ("mlp.shared.up" if moe else "mlp.up"), t[I:])
        if rest == "shared_mlp.output_linear.weight":
            return self.put(p + ("mlp.shared.down" if moe else "mlp.down"), t)
        if rest == "block_sparse_moe.router.layer.weight":  # [E, d]
            return self.put(p + "mlp.router", t)
        if rest == "block_sparse_moe.input_linear.weight":  # [E, 2I, d]: per expert [gate; up]
            I = cfg.moe_intermediate_size
            self.put(p + "mlp.experts.gate", t[:, :I])
            return self.put(p + "mlp.experts.up", t[:, I:])
        if rest == "block_sparse_moe.output_linear.weight":  # [E, d, I]
            return self.put(p + "mlp.experts.down", t)
        m = re.fullmatch(r"mlp\.experts\.(\d+)\.(up|down)_proj\.weight", rest)  # Nemotron-H: one expert at a time
        if m and moe:
            return self.expert(p + f"mlp.experts.{m.group(2)}", int(m.group(1)), t)
        nemotron_moe = {"mlp.gate.weight": "mlp.router", "mlp.gate.e_score_correction_bias": "mlp.router_bias",
                        "mlp.shared_experts.up_proj.weight": "mlp.shared.up",
                        "mlp.shared_experts.down_proj.weight": "mlp.shared.down"}
        if moe and rest in nemotron_moe:
            return self.put(p + nemotron_moe[rest], t)
        raise InputError(f"tensor {key!r} is not part of a {self.mt} layer as ddsim reads it (refused rather than ignored)")
