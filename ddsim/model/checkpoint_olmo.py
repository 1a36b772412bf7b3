"""OLMo-Hybrid checkpoints: the architecture transformers calls ``olmo_hybrid`` (Gated DeltaNet and attention).
ddsim.model.checkpoint reads the directory; this module turns its config.json into a ModelConfig and maps its
tensors into ddsim's layout (ddsim.model.weights).

Layout notes (from the reference implementation in transformers):
- ``layer_types`` names each layer ``linear_attention`` (a Gated DeltaNet layer, pre-norm: ``input_layernorm``,
  mixer, residual, ``post_attention_layernorm``, MLP, residual) or ``full_attention`` (OLMo 2's block: the
  norms on the outputs, h + ``post_attention_layernorm``(attn(h)), then h + ``post_feedforward_layernorm``(mlp(h));
  ddsim's ``attn_post_norm``, those two norms stored as the layer's input_norm and post_norm).
- attention: q and k each RMS-normed over all heads at once (``q_norm`` [nh * hd], ``k_norm`` [nkv * hd]);
  no positional encoding when ``rope_parameters`` has ``rope_theta`` null; RoPE otherwise (with
  ``rope_parameters`` itself null, transformers' default theta 10000, as transformers loads it).
- Gated DeltaNet: separate q, k, v projections (concatenated here into the conv's input, in that order; the
  conv's taps likewise, saved as ``q_conv1d``, ``k_conv1d``, ``v_conv1d`` or as one ``conv1d``), a, b
  and the output gate ``g_proj``; beta = 2 sigmoid(b) with ``linear_allow_neg_eigval``; the gated output norm's
  epsilon is 1e-5 whatever ``rms_norm_eps`` says; the conv has no bias.
Refused in one line: ``attention_bias``, an activation other than silu, a RoPE type other than the default.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_default_rope, check_layer_types, check_silu

ARCHS = ("olmo_hybrid",)


def read_olmo_config(raw: dict, d: Path) -> ModelConfig:
    """A ModelConfig from an OLMo-Hybrid config.json (a missing or malformed field raises KeyError,
    TypeError or ValueError: ddsim.model.checkpoint.read_config names the file)."""
    where = d / "config.json"
    if raw.get("attention_bias"):
        raise InputError(f"{where}: attention_bias=true is not supported")
    check_silu(raw, where)
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or []
    check_layer_types(types, n=n, allowed=("linear_attention", "full_attention"), where=where)
    check_default_rope(raw, where=where, none_allowed=True)
    rope = raw.get("rope_parameters")
    if rope is None:  # transformers fills in its default RoPE (a legacy rope_theta, else 10000)
        rope = {"rope_theta": raw.get("rope_theta", 10000.0)}
    theta = rope.get("rope_theta")  # null: no positional encoding (NoPE)
    hidden, nh = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    return ModelConfig(
        name=d.name, architecture="olmo_hybrid", vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
        layer_pattern="".join("a" if t == "full_attention" else "g" for t in types),
        intermediate_size=int(raw["intermediate_size"]), num_attention_heads=nh,
        num_key_value_heads=int(raw.get("num_key_value_heads") or nh), head_dim=int(raw.get("head_dim") or hidden // nh),
        rope_theta=float(theta or 10000.0), use_rope=theta is not None, qk_norm=True, qk_norm_all=True,
        attn_post_norm=True, linear_num_key_heads=int(raw["linear_num_key_heads"]),
        linear_num_value_heads=int(raw["linear_num_value_heads"]), linear_key_head_dim=int(raw["linear_key_head_dim"]),
        linear_value_head_dim=int(raw["linear_value_head_dim"]), conv_kernel_size=int(raw.get("linear_conv_kernel_dim", 4)),
        gdn_beta_scale=2.0 if raw.get("linear_allow_neg_eigval", True) else 1.0, gdn_norm_eps=1e-5,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), max_position_embeddings=int(raw.get("max_position_embeddings", 65536)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), notes=f"checkpoint {d}")


class OlmoMapper:
    """Maps one OLMo-Hybrid checkpoint tensor at a time into ddsim's layout; a GDN layer's q, k and v projections
    (and conv taps, when saved in parts) are held until all three arrived, then put as one."""

    def __init__(self, cfg: ModelConfig, meta: dict, base):
        """base: ddsim.model.checkpoint's mapper, whose put(name, t) places a tensor."""
        self.base, self.cfg, self.meta = base, cfg, meta

    def __call__(self, key: str, t: torch.Tensor) -> None:
        put, cfg = self.base.put, self.cfg
        layer = self.base.layer_of(key, t, final_norm="norm.weight")
        if layer is None:
            return None
        i, rest = layer
        p, attn = f"layers.{i}.", cfg.layer_pattern[i] == "a"
        # checkpoints name post_attention_layernorm feedforward_layer_norm and a GDN layer's input_layernorm
        # attention_layer_norm (transformers renames them when it loads them): both names are read
        norms = ({"post_attention_layernorm.weight": "input_norm", "feedforward_layer_norm.weight": "input_norm",
                  "post_feedforward_layernorm.weight": "post_norm"}
                 if attn else {"input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_norm",
                               "attention_layer_norm.weight": "input_norm", "feedforward_layer_norm.weight": "post_norm"})
        simple = {**norms, "self_attn.q_proj.weight": "attn.q", "self_attn.k_proj.weight": "attn.k",
                  "self_attn.v_proj.weight": "attn.v", "self_attn.o_proj.weight": "attn.o",
                  "self_attn.q_norm.weight": "attn.q_norm", "self_attn.k_norm.weight": "attn.k_norm",
                  "linear_attn.a_proj.weight": "gdn.a", "linear_attn.b_proj.weight": "gdn.b",
                  "linear_attn.g_proj.weight": "gdn.z", "linear_attn.o_proj.weight": "gdn.out",
                  "linear_attn.A_log": "gdn.A_log", "linear_attn.dt_bias": "gdn.dt_bias",
                  "linear_attn.o_norm.weight": "gdn.norm", "mlp.gate_proj.weight": "mlp.gate",
                  "mlp.up_proj.weight": "mlp.up", "mlp.down_proj.weight": "mlp.down"}
        if rest in simple:
            return put(p + simple[rest], t)
        if rest == "linear_attn.conv1d.weight":  # [C, 1, W]
            return put(p + "gdn.conv", t.reshape(t.shape[0], -1))
        m = re.fullmatch(r"linear_attn\.([qkv])_(proj|conv1d)\.weight", rest)
        if m:  # the conv's input projections, and its taps as saved in three parts: concatenated q, k, v
            which, w = m.group(2), self.base.gather((i, m.group(2)), m.group(1), t)
            if w is not None:  # all three arrived
                put(p + ("gdn.qkv" if which == "proj" else "gdn.conv"), w if which == "proj" else w.reshape(w.shape[0], -1))
            return None
        raise self.base.refuse(key, "layer")
