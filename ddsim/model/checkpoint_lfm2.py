"""LFM2 checkpoints: the architectures transformers calls ``lfm2`` (LFM2, dense) and ``lfm2_moe``
(LFM2-MoE). ddsim.model.checkpoint reads the directory; this module turns their config.json into a
ModelConfig and maps their tensors into ddsim's layout (ddsim.model.weights).

Layout notes (from the reference implementation in transformers):
- a layer is ``operator_norm``, its operator (attention, or the gated short conv), residual, then
  ``ffn_norm``, the feed-forward, residual; the final norm is ``embedding_norm``; embeddings are tied
  unless ``tie_word_embeddings`` (or the older ``tie_embedding``) says otherwise.
- the short conv: ``in_proj`` [3d, d] gives B, C and x in that order; a depthwise causal conv of
  ``conv_L_cache`` taps over B * x, no activation; C times its output through ``out_proj``. Its cache is
  the conv window alone.
- attention: GQA with per-head RMSNorms of q and k (``q_layernorm``, ``k_layernorm``) before full RoPE;
  ``out_proj`` is the output projection.
- LFM2's dense feed-forward is SwiGLU (w1 gate, w3 up, w2 down); with ``block_auto_adjust_ff_dim`` its
  width is int(2 * intermediate_size / 3), times ``block_ffn_dim_multiplier``, rounded up to a multiple of
  ``block_multiple_of``.
- LFM2-MoE: the first ``num_dense_layers`` layers are dense SwiGLU of ``intermediate_size``; the others route
  each token to the top ``num_experts_per_tok`` experts by sigmoid score plus ``expert_bias``, weighted by
  the chosen sigmoid scores (renormalised with ``norm_topk_prob``: divided by their sum + 1e-6), times
  ``routed_scaling_factor``; no shared expert. Experts are read as saved one by one
  (``experts.{e}.w1/w3/w2``) or fused (``experts.gate_up_proj`` [E, 2I, d], ``experts.down_proj``).
Refused in one line: biases (``conv_bias``), a RoPE other than the default, an MoE without the expert bias.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_default_rope, check_layer_types

ARCHS = ("lfm2", "lfm2_moe")


def _ff_dim(raw: dict) -> int:
    """LFM2's dense feed-forward width from its config (the auto-adjusted block width)."""
    size = int(raw.get("intermediate_size", raw.get("block_ff_dim", 12288)))
    if raw.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        mult = raw.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            of = int(raw.get("block_multiple_of", 256))
            size = of * ((int(mult * size) + of - 1) // of)
    return size


def read_lfm2_config(raw: dict, d: Path) -> ModelConfig:
    """A ModelConfig from the config.json of one of ARCHS (a missing or malformed field raises KeyError,
    TypeError or ValueError: ddsim.model.checkpoint.read_config names the file)."""
    mt = raw["model_type"]
    where = d / "config.json"
    if raw.get("conv_bias"):
        raise InputError(f"{where}: conv_bias=true is not supported (the short conv's projections and taps without "
                         "bias only)")
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        attn = set(raw.get("full_attn_idxs") if raw.get("full_attn_idxs") is not None else range(n))
        types = ["full_attention" if i in attn else "conv" for i in range(n)]
    check_layer_types(types, n=n, allowed=("full_attention", "conv"), where=where)
    check_default_rope(raw, where=where)
    rope = raw.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", raw.get("rope_theta", 1_000_000.0)))
    nh = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    moe = {}
    if mt == "lfm2_moe":
        if not raw.get("use_expert_bias", True):
            raise InputError(f"{where}: use_expert_bias=false is not supported (LFM2-MoE's biased routing only)")
        dense = int(raw.get("num_dense_layers", 2))
        moe = dict(num_experts=int(raw.get("num_experts", 32)), num_experts_per_tok=int(raw.get("num_experts_per_tok", 4)),
                   moe_intermediate_size=int(raw.get("moe_intermediate_size", 1792)), moe_router="sigmoid",
                   moe_norm_eps=1e-6, norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
                   routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
                   mlp_only_layers=tuple(range(min(dense, n))))
        ff = int(raw.get("intermediate_size", 7168))
    else:
        ff = _ff_dim(raw)
    tied = raw.get("tie_word_embeddings", raw.get("tie_embedding", True))
    return ModelConfig(
        name=d.name, architecture=mt, vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
        layer_pattern="".join("a" if t == "full_attention" else "c" for t in types), intermediate_size=ff,
        num_attention_heads=nh, num_key_value_heads=int(raw["num_key_value_heads"]),
        head_dim=int(raw.get("head_dim") or hidden // nh), rope_theta=theta, conv_kernel_size=int(raw.get("conv_L_cache", 3)),
        rms_norm_eps=float(raw.get("norm_eps", 1e-5)), max_position_embeddings=int(raw.get("max_position_embeddings", 128000)),
        qk_norm=True, tie_word_embeddings=bool(tied), notes=f"checkpoint {d}", **moe)


class Lfm2Mapper:
    """Maps one LFM2 / LFM2-MoE checkpoint tensor at a time into ddsim's layout."""

    def __init__(self, cfg: ModelConfig, meta: dict, base):
        """base: ddsim.model.checkpoint's mapper, whose put(name, t) and expert(name, e, t) place a tensor."""
        self.base, self.cfg, self.meta = base, cfg, meta

    def __call__(self, key: str, t: torch.Tensor) -> None:
        put = self.base.put
        layer = self.base.layer_of(key, t, final_norm="embedding_norm.weight")
        if layer is None:
            return None
        i, rest = layer
        p = f"layers.{i}."
        simple = {"operator_norm.weight": "input_norm", "ffn_norm.weight": "post_norm",
                  "self_attn.q_proj.weight": "attn.q", "self_attn.k_proj.weight": "attn.k",
                  "self_attn.v_proj.weight": "attn.v", "self_attn.out_proj.weight": "attn.o",
                  "self_attn.q_layernorm.weight": "attn.q_norm", "self_attn.k_layernorm.weight": "attn.k_norm",
                  "conv.in_proj.weight": "conv.in", "conv.out_proj.weight": "conv.out",
                  "feed_forward.w1.weight": "mlp.gate", "feed_forward.w3.weight": "mlp.up",
                  "feed_forward.w2.weight": "mlp.down", "feed_forward.gate.weight": "mlp.router",
                  "feed_forward.expert_bias": "mlp.router_bias"}
        if rest in simple:
            return put(p + simple[rest], t)
        if rest == "conv.conv.weight":  # [d, 1, W]
            return put(p + "conv.conv", t.reshape(t.shape[0], -1))
        if self.base.experts(p, rest, t, one=r"feed_forward\.experts\.(\d+)\.(w1|w2|w3)\.weight", fused="feed_forward.experts"):
            return None
        raise self.base.refuse(key, "layer")
