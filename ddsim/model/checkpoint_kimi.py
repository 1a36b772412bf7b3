"""Kimi Linear checkpoints: the architecture transformers calls ``kimi_linear`` (Kimi Delta Attention, multi-head
latent attention, MoE). ddsim.model.checkpoint reads the directory; this module turns its config.json into a
ModelConfig and maps its tensors into ddsim's layout (ddsim.model.weights).

Layout notes (from the reference implementation in transformers):
- ``layer_types`` (or the released ``linear_attn_config``'s 1-indexed ``kda_layers`` / ``full_attn_layers``) names
  each layer ``linear_attention`` (KDA, layer kind 'k') or ``full_attention`` (MLA); ``mlp_layer_types`` (or
  ``first_k_dense_replace``) names each feed-forward ``dense`` (SwiGLU of ``intermediate_size``) or ``sparse``.
- KDA: q, k, v projections of H = ``linear_num_heads`` heads of ``linear_head_dim``, each through its short conv
  (saved as ``q_conv1d``, ``k_conv1d``, ``v_conv1d``) and silu; q and k L2-normed; the forget gate per key channel,
  g = -exp(``A_log``[h]) softplus(``f_b_proj`` ``f_a_proj`` x + ``dt_bias``); beta = sigmoid(``b_proj`` x); the
  output RMS-normed per head and gated by sigmoid(``g_b_proj`` ``g_a_proj`` x); ``o_proj``.
- MLA without RoPE: q = ``q_proj`` x (or ``q_b_proj`` norm(``q_a_proj`` x)); ``kv_a_proj_with_mqa`` x splits into a
  latent (``kv_a_layernorm``, then ``kv_b_proj`` to per-head k_nope and v) and k_rope shared by the heads; scale
  (nope + rope)^-1/2. ddsim expands it to per-head keys and values (zero-padded to one head width).
- MoE: sigmoid scores, chosen with ``e_score_correction_bias`` among the best ``n_group`` groups, the chosen
  scores renormalised (``norm_topk_prob``) and scaled by ``routed_scaling_factor``; plus the shared experts (one
  SwiGLU of ``moe_intermediate_size`` x ``n_shared_experts``), added ungated. The saved config may carry the
  attribute-map names (``num_experts``, ``num_experts_per_token``, ``num_expert_group``, ``num_shared_experts``,
  ``moe_renormalize``, ``model_max_length``): both are read.
Refused in one line: ``attention_bias``, an activation other than silu.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_layer_types, check_silu

ARCHS = ("kimi_linear",)


def _get(raw: dict, *names, default=None):
    """The first of ``names`` the config has (a field and its attribute-map alias)."""
    for n in names:
        if raw.get(n) is not None:
            return raw[n]
    return default


def read_kimi_config(raw: dict, d: Path) -> ModelConfig:
    """A ModelConfig from a Kimi Linear config.json (a missing or malformed field raises KeyError,
    TypeError or ValueError: ddsim.model.checkpoint.read_config names the file)."""
    where = d / "config.json"
    if raw.get("attention_bias"):
        raise InputError(f"{where}: attention_bias=true is not supported")
    check_silu(raw, where)
    n = int(raw["num_hidden_layers"])
    lin = raw.get("linear_attn_config") or {}
    types = raw.get("layer_types")
    if types is None and "kda_layers" in lin:
        kda = set(lin["kda_layers"])
        types = ["linear_attention" if i + 1 in kda else "full_attention" for i in range(n)]
    if types is None or len(types) != n:
        raise InputError(f"{where}: layer_types (or linear_attn_config) must name {n} layers")
    check_layer_types(types, n=None, allowed=("linear_attention", "full_attention"), where=where)
    mlp_types = raw.get("mlp_layer_types") or ["dense" if i < int(raw.get("first_k_dense_replace", 1)) else "sparse"
                                               for i in range(n)]
    H = int(lin.get("num_heads", raw.get("linear_num_heads", 32)))
    K = int(lin.get("head_dim", raw.get("linear_head_dim", 128)))
    nope, rope = int(raw["qk_nope_head_dim"]), int(raw["qk_rope_head_dim"])
    vd = int(raw.get("v_head_dim") or nope + rope)
    nh, E = int(raw["num_attention_heads"]), int(_get(raw, "num_local_experts", "num_experts", default=256))
    moe_i = int(raw.get("moe_intermediate_size", 1024))
    groups = int(_get(raw, "n_group", "num_expert_group", default=1))
    return ModelConfig(
        name=d.name, architecture="kimi_linear", vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        layer_pattern="".join("k" if t == "linear_attention" else "a" for t in types),
        intermediate_size=int(raw["intermediate_size"]), num_attention_heads=nh, num_key_value_heads=nh,
        head_dim=max(nope + rope, vd), use_rope=False, attention_scale=(nope + rope) ** -0.5,
        mla_kv_lora_rank=int(raw["kv_lora_rank"]), mla_q_lora_rank=int(raw.get("q_lora_rank") or 0),
        mla_qk_nope_head_dim=nope, mla_qk_rope_head_dim=rope, mla_v_head_dim=vd,
        linear_num_key_heads=H, linear_num_value_heads=H, linear_key_head_dim=K, linear_value_head_dim=K,
        conv_kernel_size=int(lin.get("short_conv_kernel_size", raw.get("linear_conv_kernel_dim", 4))),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=int(_get(raw, "max_position_embeddings", "model_max_length", default=1048576)),
        num_experts=E, num_experts_per_tok=int(_get(raw, "num_experts_per_tok", "num_experts_per_token", default=8)),
        moe_intermediate_size=moe_i, shared_expert_intermediate_size=moe_i * int(_get(raw, "n_shared_experts",
                                                                                     "num_shared_experts", default=1)),
        shared_expert_gate=False, moe_router="sigmoid", moe_n_group=groups,
        moe_topk_group=int(raw.get("topk_group") or 1), routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        norm_topk_prob=bool(_get(raw, "norm_topk_prob", "moe_renormalize", default=True)),
        mlp_only_layers=tuple(i for i, t in enumerate(mlp_types) if t == "dense"),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), notes=f"checkpoint {d}")


class KimiMapper:
    """Maps one Kimi Linear checkpoint tensor at a time into ddsim's layout; a KDA layer's q, k, v projections and
    convs are held until all three arrived, then put as one."""

    def __init__(self, cfg: ModelConfig, meta: dict, base):
        """base: ddsim.model.checkpoint's mapper, whose put(name, t) and expert(name, e, t) place a tensor."""
        self.base, self.cfg, self.meta = base, cfg, meta

    def __call__(self, key: str, t: torch.Tensor) -> None:
        put, cfg = self.base.put, self.cfg
        layer = self.base.layer_of(key, t, final_norm="norm.weight")
        if layer is None:
            return None
        i, rest = layer
        p, kda = f"layers.{i}.", cfg.layer_pattern[i] == "k"
        rest = re.sub(r"^(block_sparse_moe|mlp)\.", "ffn.", rest)
        rest = re.sub(r"^self_attn\.forget_gate\.", "self_attn.", rest)
        simple = {"input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_norm",
                  "ffn.gate_proj.weight": "mlp.gate", "ffn.up_proj.weight": "mlp.up", "ffn.down_proj.weight": "mlp.down",
                  "ffn.gate.weight": "mlp.router", "ffn.gate.e_score_correction_bias": "mlp.router_bias",
                  "ffn.shared_experts.gate_proj.weight": "mlp.shared.gate", "ffn.shared_experts.up_proj.weight": "mlp.shared.up",
                  "ffn.shared_experts.down_proj.weight": "mlp.shared.down"}
        if kda:
            simple.update({"self_attn.f_a_proj.weight": "kda.f_a", "self_attn.f_b_proj.weight": "kda.f_b",
                           "self_attn.dt_bias": "kda.dt_bias", "self_attn.b_proj.weight": "kda.b",
                           "self_attn.g_a_proj.weight": "kda.g_a", "self_attn.g_b_proj.weight": "kda.g_b",
                           "self_attn.o_norm.weight": "kda.norm", "self_attn.o_proj.weight": "kda.out"})
        else:
            simple.update({"self_attn.q_proj.weight": "attn.q", "self_attn.q_a_proj.weight": "attn.q_a",
                           "self_attn.q_a_layernorm.weight": "attn.q_a_norm", "self_attn.q_b_proj.weight": "attn.q_b",
                           "self_attn.kv_a_proj_with_mqa.weight": "attn.kv_a", "self_attn.kv_a_layernorm.weight": "attn.kv_a_norm",
                           "self_attn.kv_b_proj.weight": "attn.kv_b", "self_attn.o_proj.weight": "attn.o"})
        if rest in simple:
            return put(p + simple[rest], t)
        if kda and rest == "self_attn.A_log":  # [1, 1, H, 1]
            return put(p + "kda.A_log", t.reshape(-1))
        if kda and rest == "self_attn.conv1d.weight":  # [3HK, 1, W]
            return put(p + "kda.conv", t.reshape(t.shape[0], -1))
        m = re.fullmatch(r"self_attn\.([qkv])_(proj|conv1d)\.weight", rest) if kda else None
        if m:  # held until q, k and v arrived: the conv's input projection, or its taps
            which, w = m.group(2), self.base.gather((i, m.group(2)), m.group(1), t)
            if w is not None:  # all three arrived
                put(p + ("kda.qkv" if which == "proj" else "kda.conv"), w if which == "proj" else w.reshape(w.shape[0], -1))
            return None
        if self.base.experts(p, rest, t, one=r"ffn\.experts\.(\d+)\.(w1|w2|w3)\.weight", fused="ffn.experts"):
            return None
        raise self.base.refuse(key, "layer")
