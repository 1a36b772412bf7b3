"""MiniMax checkpoints: the architecture transformers calls ``minimax`` (MiniMax-Text-01: lightning attention, softmax
attention and MoE). ddsim.model.checkpoint reads the directory; this module turns its config.json into a ModelConfig
and maps its tensors into ddsim's layout (ddsim.model.weights).

Layout notes (from the reference implementation in transformers):
- ``layer_types`` names each layer ``linear_attention`` (lightning attention, layer kind 'l') or ``full_attention``.
- the block (ddsim's ``residual_from_norm``): xn = ``input_layernorm``(h); h = alpha xn + beta mixer(xn) (the
  ``full_attn_*`` or ``linear_attn_*`` alpha and beta factors); xn = ``post_attention_layernorm``(h);
  h = ``mlp_alpha_factor`` xn + ``mlp_beta_factor`` moe(xn).
- lightning attention: silu of ``qkv_proj``, per head [q, k, v]; per head the state S = lambda S + k v^T with
  lambda = exp(-``slope_rate``) (a buffer saved with the weights; the blockwise ``query_decay``, ``key_decay`` and
  ``diagonal_decay`` are derived from it and not read); o = S^T q, unscaled; an RMSNorm over all heads (epsilon
  1e-6), times sigmoid(``output_gate`` x), ``out_proj``. No conv.
- softmax attention: GQA with full RoPE; every layer's feed-forward is the MoE: softmax over the router, the top
  ``num_experts_per_tok`` renormalised, SwiGLU experts of ``intermediate_size`` (``block_sparse_moe.experts.{e}.w1``
  gate, ``w3`` up, ``w2`` down, or fused ``mlp.experts.gate_up_proj`` / ``down_proj``), no shared expert.
Refused in one line: ``sliding_window``, a RoPE type other than the default, an activation other than silu.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_default_rope, check_layer_types, check_silu

ARCHS = ("minimax",)
_DERIVED = ("self_attn.query_decay", "self_attn.key_decay", "self_attn.diagonal_decay")  # from slope_rate


def read_minimax_config(raw: dict, d: Path) -> ModelConfig:
    """A ModelConfig from a MiniMax config.json (a missing or malformed field raises KeyError,
    TypeError or ValueError: ddsim.model.checkpoint.read_config names the file)."""
    where = d / "config.json"
    if raw.get("sliding_window") is not None:
        raise InputError(f"{where}: sliding_window={raw['sliding_window']} is not supported (full attention only)")
    check_silu(raw, where)
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or []
    check_layer_types(types, n=n, allowed=("linear_attention", "full_attention"), where=where)
    check_default_rope(raw, where=where)
    rope = raw.get("rope_parameters") or {"rope_theta": raw.get("rope_theta", 1_000_000.0)}
    hidden, nh = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    ff = int(raw["intermediate_size"])
    factor = {k: float(raw.get(f"{k}_factor", 1.0)) for k in ("full_attn_alpha", "full_attn_beta", "linear_attn_alpha",
                                                             "linear_attn_beta", "mlp_alpha", "mlp_beta")}
    return ModelConfig(
        name=d.name, architecture="minimax", vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
        layer_pattern="".join("a" if t == "full_attention" else "l" for t in types), intermediate_size=ff,
        num_attention_heads=nh, num_key_value_heads=int(raw.get("num_key_value_heads") or nh),
        head_dim=int(raw.get("head_dim") or hidden // nh), rope_theta=float(rope.get("rope_theta") or 1_000_000.0),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)), max_position_embeddings=int(raw.get("max_position_embeddings", 131072)),
        num_experts=int(raw.get("num_local_experts", 8)), num_experts_per_tok=int(raw.get("num_experts_per_tok", 2)),
        moe_intermediate_size=ff, norm_topk_prob=True, residual_from_norm=True,
        attn_alpha=factor["full_attn_alpha"], attn_beta=factor["full_attn_beta"], linear_alpha=factor["linear_attn_alpha"],
        linear_beta=factor["linear_attn_beta"], mlp_alpha=factor["mlp_alpha"], mlp_beta=factor["mlp_beta"],
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), notes=f"checkpoint {d}")


class MiniMaxMapper:
    """Maps one MiniMax checkpoint tensor at a time into ddsim's layout."""

    def __init__(self, cfg: ModelConfig, meta: dict, base):
        """base: ddsim.model.checkpoint's mapper, whose put(name, t) and expert(name, e, t) place a tensor."""
        self.base, self.cfg, self.meta = base, cfg, meta

    def __call__(self, key: str, t: torch.Tensor) -> None:
        put, cfg = self.base.put, self.cfg
        layer = self.base.layer_of(key, t, final_norm="norm.weight")
        if layer is None:
            return None
        i, rest = layer
        p = f"layers.{i}."
        if rest in _DERIVED and cfg.layer_pattern[i] == "l":
            return None  # derived from slope_rate (the blockwise form's tables)
        simple = {"input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_norm",
                  "self_attn.q_proj.weight": "attn.q", "self_attn.k_proj.weight": "attn.k",
                  "self_attn.v_proj.weight": "attn.v", "self_attn.o_proj.weight": "attn.o",
                  "self_attn.qkv_proj.weight": "lightning.qkv", "self_attn.out_proj.weight": "lightning.out",
                  "self_attn.output_gate.weight": "lightning.gate", "self_attn.norm.weight": "lightning.norm",
                  "block_sparse_moe.gate.weight": "mlp.router", "mlp.gate.weight": "mlp.router"}
        if rest in simple:
            return put(p + simple[rest], t)
        if rest == "self_attn.slope_rate":  # [H, 1, 1]
            return put(p + "lightning.slope", t.reshape(-1))
        if self.base.experts(p, rest, t, one=r"(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3)\.weight", fused="mlp.experts"):
            return None
        raise self.base.refuse(key, "layer")
