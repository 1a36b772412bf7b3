"""Jamba checkpoints: the architecture transformers calls ``jamba`` (Mamba1 + attention + MoE).
ddsim.model.checkpoint reads the directory; this module turns its config.json into a ModelConfig and maps
its tensors into ddsim's layout (ddsim.model.weights).

Layout notes (from the reference implementation in transformers):
- layer i is attention when i % attn_layer_period == attn_layer_offset, else a Mamba1 mixer (layer kind
  's'); its feed-forward is the routed MoE when num_experts > 1 and i % expert_layer_period ==
  expert_layer_offset, else a SwiGLU MLP; each is ``input_layernorm``, mixer, residual, ``pre_ff_layernorm``,
  feed-forward, residual; the final norm is ``final_layernorm``.
- attention has no positional encoding (NoPE) and no q/k norms.
- the Mamba1 mixer: ``in_proj`` [2I, d] gives x then z; a depthwise causal conv (with bias) and silu over x;
  ``x_proj`` gives dt (rank R), B and C (N each), each RMS-normed (``dt_layernorm``, ``b_layernorm``,
  ``c_layernorm``); dt = softplus(``dt_proj`` dt + its bias) per channel; the selective scan with A =
  -exp(A_log) [I, N] and the D skip; times silu(z); ``out_proj``.
- the MoE: softmax over the router's logits, the top ``num_experts_per_tok`` weights as they are (not
  renormalised), SwiGLU experts of ``intermediate_size``, no shared expert; experts read as saved one by
  one (``experts.{e}.gate_proj/up_proj/down_proj``) or fused (``experts.gate_up_proj`` [E, 2I, d],
  ``experts.down_proj``).
Refused in one line: projection biases (``mamba_proj_bias``), an activation other than silu.
"""
from __future__ import annotations

import math
from pathlib import Path

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_silu

ARCHS = ("jamba",)


def read_jamba_config(raw: dict, d: Path) -> ModelConfig:
    """A ModelConfig from a Jamba config.json (a missing or malformed field raises KeyError,
    TypeError or ValueError: ddsim.model.checkpoint.read_config names the file)."""
    where = d / "config.json"
    if raw.get("mamba_proj_bias"):
        raise InputError(f"{where}: mamba_proj_bias=true is not supported")
    check_silu(raw, where)
    n, hidden = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    ap, ao = int(raw.get("attn_layer_period", 8)), int(raw.get("attn_layer_offset", 4))
    ep, eo = int(raw.get("expert_layer_period", 2)), int(raw.get("expert_layer_offset", 1))
    for what, period, offset in (("attn", ap, ao), ("expert", ep, eo)):  # as transformers' JambaConfig refuses them
        if not 0 <= offset < period:
            raise InputError(f"{where}: {what}_layer_offset={offset} must be at least 0 and below {what}_layer_period={period}")
    E = int(raw.get("num_experts", 16))
    pattern = "".join("a" if i % ap == ao else "s" for i in range(n))
    moe_layers = [i for i in range(n) if E > 1 and i % ep == eo]
    rank = raw.get("mamba_dt_rank", "auto")
    rank = math.ceil(hidden / 16) if rank == "auto" else int(rank)
    nh = int(raw["num_attention_heads"])
    ff = int(raw["intermediate_size"])
    moe = {}
    if moe_layers:
        moe = dict(num_experts=E, num_experts_per_tok=int(raw.get("num_experts_per_tok", 2)), moe_intermediate_size=ff,
                   norm_topk_prob=False, mlp_only_layers=tuple(i for i in range(n) if i not in moe_layers))
    return ModelConfig(
        name=d.name, architecture="jamba", vocab_size=int(raw["vocab_size"]), hidden_size=hidden, layer_pattern=pattern,
        intermediate_size=ff, num_attention_heads=nh, num_key_value_heads=int(raw.get("num_key_value_heads") or nh),
        head_dim=int(raw.get("head_dim") or hidden // nh), use_rope=False, conv_kernel_size=int(raw.get("mamba_d_conv", 4)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), max_position_embeddings=int(raw.get("max_position_embeddings", 262144)),
        mamba1_inner=int(raw.get("mamba_expand", 2)) * hidden, mamba1_dt_rank=rank, mamba_state_size=int(raw.get("mamba_d_state", 16)),
        mamba_conv_bias=bool(raw.get("mamba_conv_bias", True)), mamba1_bcdt_norm=True,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), notes=f"checkpoint {d}", **moe)


class JambaMapper:
    """Maps one Jamba checkpoint tensor at a time into ddsim's layout."""

    def __init__(self, cfg: ModelConfig, meta: dict, base):
        """base: ddsim.model.checkpoint's mapper, whose put(name, t) and expert(name, e, t) place a tensor."""
        self.base, self.cfg, self.meta = base, cfg, meta

    def __call__(self, key: str, t) -> None:
        put = self.base.put
        layer = self.base.layer_of(key, t, final_norm="final_layernorm.weight")
        if layer is None:
            return None
        i, rest = layer
        p = f"layers.{i}."
        simple = {"input_layernorm.weight": "input_norm", "pre_ff_layernorm.weight": "post_norm",
                  "self_attn.q_proj.weight": "attn.q", "self_attn.k_proj.weight": "attn.k",
                  "self_attn.v_proj.weight": "attn.v", "self_attn.o_proj.weight": "attn.o",
                  "mamba.in_proj.weight": "mamba1.in", "mamba.conv1d.bias": "mamba1.conv_bias",
                  "mamba.x_proj.weight": "mamba1.x_proj", "mamba.dt_proj.weight": "mamba1.dt_proj",
                  "mamba.dt_proj.bias": "mamba1.dt_bias", "mamba.A_log": "mamba1.A_log", "mamba.D": "mamba1.D",
                  "mamba.out_proj.weight": "mamba1.out", "mamba.dt_layernorm.weight": "mamba1.dt_norm",
                  "mamba.b_layernorm.weight": "mamba1.b_norm", "mamba.c_layernorm.weight": "mamba1.c_norm",
                  "feed_forward.gate_proj.weight": "mlp.gate", "feed_forward.up_proj.weight": "mlp.up",
                  "feed_forward.down_proj.weight": "mlp.down", "feed_forward.router.weight": "mlp.router"}
        if rest in simple:
            return put(p + simple[rest], t)
        if rest == "mamba.conv1d.weight":  # [I, 1, W]
            return put(p + "mamba1.conv", t.reshape(t.shape[0], -1))
        if self.base.experts(p, rest, t, one=r"feed_forward\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight",
                             fused="feed_forward.experts"):
            return None
        raise self.base.refuse(key, "layer")
