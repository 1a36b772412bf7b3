"""Zamba2 checkpoints: the architecture transformers calls ``zamba2`` (Mamba2 layers and hybrid layers whose
transformer blocks are shared). ddsim.model.checkpoint reads the directory; this module turns its config.json into
a ModelConfig and maps its tensors into ddsim's layout (ddsim.model.weights).

Layout notes (from the reference implementation in transformers):
- ``layers_block_type`` names each layer ``mamba`` (also ``linear_attention``, ``m``) or ``hybrid`` (``g``). A Mamba
  layer is h + Mamba2(``input_layernorm`` h). A hybrid layer (kind 'z') runs a transformer block on the concatenation
  [h, embeddings] (2d wide): ``input_layernorm`` [2d], attention with heads of 2d / nh dims scaled by (hd / 2)^-0.5
  (RoPE only with ``use_mem_rope``), ``pre_ff_layernorm``, a GeGLU MLP (``gate_up_proj``: gate, then up; exact GELU);
  no residual inside the block. Its output, projected by the layer's own ``linear``, joins the Mamba2 mixer's input:
  h + Mamba2(``mamba_decoder.input_layernorm`` (h + t)).
- the transformer blocks are shared: hybrid layer j runs block j % ``num_mem_blocks``; a checkpoint saved by
  transformers stores each block once, under the first hybrid layer that runs it (a copy under another layer is
  read the same way). Each block holds low-rank adapters per hybrid layer it serves (``linear_{q,k,v}_adapter_list.j``
  with ``use_shared_attention_adapter``, ``gate_up_proj_adapter_list.j`` always): W x + B (A x). ddsim folds each
  layer's adapters into its own copy of the block's weights, W + B A (in float64, then the checkpoint's dtype): the
  same map, rounded once.
- the Mamba2 mixer: ``in_proj`` gives z (I), x || B || C (I + 2GN), dt (H); a depthwise conv with bias; dt =
  softplus(dt + dt_bias) held at or above ``time_step_min`` (transformers' prefill path; its one-token path does
  not hold it, which differs only where the step falls below that floor); the gated RMSNorm rmsnorm(y * silu(z)) per
  group, its epsilon fixed at 1e-5 (ddsim uses ``rms_norm_eps``: refused unless that is 1e-5 too).
Refused in one line: ``add_bias_linear``, an activation other than gelu, ``use_long_context`` (a rescaled RoPE),
attention adapters with fewer key/value heads than query heads, another ``rms_norm_eps``.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from ddsim.errors import InputError
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_default_rope, check_layer_types, rope_parameters

ARCHS = ("zamba2",)
_MAMBA, _HYBRID = ("mamba", "linear_attention", "m"), ("hybrid", "g")


def read_zamba2_config(raw: dict, d: Path) -> ModelConfig:
    """A ModelConfig from a Zamba2 config.json (a missing or malformed field raises KeyError, TypeError or
    ValueError: ddsim.model.checkpoint.read_config names the file)."""
    where = d / "config.json"
    if raw.get("add_bias_linear"):
        raise InputError(f"{where}: add_bias_linear=true is not supported")
    if raw.get("hidden_act", "gelu") != "gelu":
        raise InputError(f"{where}: hidden_act {raw.get('hidden_act')!r} is not supported (gelu only)")
    if raw.get("use_long_context"):
        raise InputError(f"{where}: use_long_context=true (a rescaled RoPE) is not supported")
    eps = float(raw.get("rms_norm_eps", 1e-5))
    if eps != 1e-5:
        raise InputError(f"{where}: rms_norm_eps={eps} is not supported (Zamba2's Mamba norm is fixed at 1e-5 and "
                         "ddsim uses one epsilon for both)")
    n, hidden, nh = int(raw["num_hidden_layers"]), int(raw["hidden_size"]), int(raw["num_attention_heads"])
    nkv = int(raw.get("num_key_value_heads") or nh)
    if raw.get("use_shared_attention_adapter") and nkv != nh:
        raise InputError(f"{where}: attention adapters with num_key_value_heads={nkv} < num_attention_heads={nh} "
                         "are not supported")
    types = raw["layers_block_type"]
    if not isinstance(types, list) or len(types) != n:
        raise InputError(f"{where}: layers_block_type lists {len(types) if isinstance(types, list) else types!r} "
                         f"layers for {n}")
    check_layer_types(types, n=None, allowed=_MAMBA + _HYBRID, where=where)
    H, expand = int(raw.get("n_mamba_heads", 8)), int(raw.get("mamba_expand", 2))
    if (expand * hidden) % H:
        raise InputError(f"{where}: mamba_expand * hidden_size = {expand * hidden} is not a multiple of n_mamba_heads={H}")
    hd = 2 * hidden // nh
    rope = rope_parameters(raw, where=where)
    if raw.get("use_mem_rope", False):
        check_default_rope(raw, where=where)
    return ModelConfig(
        name=d.name, architecture="zamba2", vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
        layer_pattern="".join("z" if t in _HYBRID else "m" for t in types),
        intermediate_size=int(raw.get("intermediate_size") or 4 * hidden), num_attention_heads=nh,
        num_key_value_heads=nkv, head_dim=hd, attention_scale=(hd / 2) ** -0.5,
        use_rope=bool(raw.get("use_mem_rope", False)), rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        rms_norm_eps=eps, max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        conv_kernel_size=int(raw.get("mamba_d_conv", 4)), mamba_num_heads=H, mamba_head_dim=expand * hidden // H,
        mamba_state_size=int(raw.get("mamba_d_state", 64)), mamba_n_groups=int(raw.get("mamba_ngroups", 1)),
        mamba_conv_bias=True, mamba_dt_limit=(float(raw.get("time_step_min", 0.001)), math.inf), mamba_norm="gated",
        layer_mlp=False, mlp_act="geglu", tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        notes=f"checkpoint {d}")


_BLOCK = re.compile(r"shared_transformer\.(input_layernorm\.weight|pre_ff_layernorm\.weight|self_attn\.[qkvo]_proj\.weight|"
                    r"feed_forward\.(?:gate_up|down)_proj\.weight|self_attn\.linear_[qkv]_adapter_list\.\d+\.[01]\.weight|"
                    r"feed_forward\.gate_up_proj_adapter_list\.\d+\.[01]\.weight)")


class Zamba2Mapper:
    """Maps one Zamba2 checkpoint tensor at a time into ddsim's layout; the shared blocks' tensors are held until
    every shard is read (finish), then each hybrid layer gets its block with its own adapters folded in."""

    def __init__(self, cfg: ModelConfig, meta: dict, base):
        """base: ddsim.model.checkpoint's mapper, whose put(name, t) places a tensor."""
        self.base, self.cfg = base, cfg
        self.hybrid = [i for i, c in enumerate(cfg.layer_pattern) if c == "z"]
        self.blocks = int(meta["raw"].get("num_mem_blocks", 1))
        self.attn_adapters = bool(meta["raw"].get("use_shared_attention_adapter", False))
        self.held: dict[int, dict[str, torch.Tensor]] = {}  # layer -> its shared-block tensors, by name

    def __call__(self, key: str, t) -> None:
        put, cfg = self.base.put, self.cfg
        layer = self.base.layer_of(key, t, final_norm="final_layernorm.weight")
        if layer is None:
            return None
        i, rest = layer
        p = f"layers.{i}."
        if cfg.layer_pattern[i] == "z":
            if rest.startswith("shared_transformer."):
                if not _BLOCK.fullmatch(rest):
                    raise self.base.refuse(key, "layer")
                self.held.setdefault(i, {})[rest[len("shared_transformer."):]] = t
                return None
            if rest == "linear.weight":
                return put(p + "hybrid.proj", t)
            if rest == "mamba_decoder.input_layernorm.weight":
                return put(p + "hybrid.norm", t)
            if not rest.startswith("mamba_decoder.mamba."):
                raise self.base.refuse(key, "layer")
            rest = rest[len("mamba_decoder."):]
        elif rest == "input_layernorm.weight":
            return put(p + "input_norm", t)
        return self._mamba(key, p, rest, t)

    def _mamba(self, key: str, p: str, rest: str, t) -> None:
        put, cfg = self.base.put, self.cfg
        simple = {"mamba.conv1d.bias": "mamba.conv_bias", "mamba.dt_bias": "mamba.dt_bias", "mamba.A_log": "mamba.A_log",
                  "mamba.D": "mamba.D", "mamba.norm.weight": "mamba.norm", "mamba.out_proj.weight": "mamba.out"}
        if rest in simple:
            return put(p + simple[rest], t)
        if rest == "mamba.conv1d.weight":  # [Cm, 1, W]
            return put(p + "mamba.conv", t.reshape(t.shape[0], -1))
        if rest == "mamba.in_proj.weight":  # [I + Cm + H, d]: z, x || B || C, dt
            I, Cm = cfg.mamba_inner, cfg.mamba_conv_dim
            if t.shape[0] != I + Cm + cfg.mamba_num_heads:
                raise InputError(f"{key}: {t.shape[0]} rows, the config implies {I + Cm + cfg.mamba_num_heads}")
            put(p + "mamba.z", t[:I])
            put(p + "mamba.xbc", t[I:I + Cm])
            return put(p + "mamba.dt", t[I + Cm:])
        raise self.base.refuse(key, "layer")

    def finish(self) -> None:
        """Each hybrid layer's transformer block: the block it runs (from its own copy, else the first layer's that
        runs the same block), its adapters folded in, and nothing of any held block left unread."""
        used: dict[int, set[str]] = {i: set() for i in self.held}
        for j, i in enumerate(self.hybrid):
            src = i if i in self.held else self.hybrid[j % self.blocks]
            if src not in self.held:
                raise InputError(f"no shared transformer block for hybrid layer {i} (block {j % self.blocks}, stored "
                                 f"under layer {src})")
            block, seen = self.held[src], used[src]

            def get(name, src=src, block=block, seen=seen):
                if name not in block:
                    raise InputError(f"model.layers.{src}.shared_transformer.{name} is missing")
                seen.add(name)
                return block[name]

            def folded(name, adapter, on=True):
                w = get(name)
                if not on:
                    return w
                a, b = get(f"{adapter}.{j}.0.weight"), get(f"{adapter}.{j}.1.weight")  # [r, in], [out, r]
                return (w.double() + b.double() @ a.double()).to(w.dtype)

            p, put = f"layers.{i}.", self.base.put
            put(p + "input_norm", get("input_layernorm.weight"))
            put(p + "post_norm", get("pre_ff_layernorm.weight"))
            for x in "qkv":
                put(p + f"attn.{x}", folded(f"self_attn.{x}_proj.weight", f"self_attn.linear_{x}_adapter_list",
                                            self.attn_adapters))
            put(p + "attn.o", get("self_attn.o_proj.weight"))
            gate_up = folded("feed_forward.gate_up_proj.weight", "feed_forward.gate_up_proj_adapter_list")
            put(p + "mlp.gate", gate_up[:self.cfg.intermediate_size])
            put(p + "mlp.up", gate_up[self.cfg.intermediate_size:])
            put(p + "mlp.down", get("feed_forward.down_proj.weight"))
        for src, names in used.items():
            left = sorted(set(self.held[src]) - names)
            if left:
                raise InputError(f"tensor 'model.layers.{src}.shared_transformer.{left[0]}' is not part of a zamba2 "
                                 "layer as ddsim reads it (refused rather than ignored)")
