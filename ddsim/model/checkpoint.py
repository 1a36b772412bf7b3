"""Real checkpoints: a local Hugging Face directory (config.json, safetensors, optional sharded
index) of the architectures transformers calls ``qwen3_next``, ``qwen3_5`` (the text decoder of the
multimodal checkpoint; vision and MTP weights are skipped) and ``qwen3_5_moe`` (also their
``*_text`` variants), and the Mamba2 hybrids ``nemotron_h``, ``bamba``, ``granitemoehybrid`` and
``falcon_h1`` (ddsim.model.checkpoint_mamba), the short-conv hybrids ``lfm2`` and ``lfm2_moe``
(ddsim.model.checkpoint_lfm2), ``jamba`` (Mamba1, ddsim.model.checkpoint_jamba), ``olmo_hybrid``
(ddsim.model.checkpoint_olmo), ``minimax`` (lightning attention, ddsim.model.checkpoint_minimax), ``kimi_linear``
(KDA and MLA, ddsim.model.checkpoint_kimi) and ``zamba2`` (Mamba2 with shared transformer blocks,
ddsim.model.checkpoint_zamba). Weights are
mapped to ddsim's layout (ddsim.model.weights) tensor by tensor, shard by shard, straight onto the
target device in the checkpoint's dtype, so no second copy of the model is held in host memory.
Anything wrong raises InputError before a model is returned.

Layout notes (from the reference implementation): Qwen3-Next packs in_proj_qkvz per key-head group
as [q, k, v (HV/H heads), z (HV/H heads)] and in_proj_ba as [b, a]; Qwen3.5 stores in_proj_qkv,
in_proj_z, in_proj_b, in_proj_a separately. Attention q_proj holds [query, gate] per head. Every
RMSNorm except the GDN gated norm scales by (1 + weight). Text-only positions make Qwen3.5's
multimodal RoPE the plain partial RoPE.
"""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import torch

from ddsim.errors import InputError
from ddsim.jsonl import read_json
from ddsim.model.checkpoint_jamba import ARCHS as JAMBA_ARCHS
from ddsim.model.checkpoint_jamba import JambaMapper, read_jamba_config
from ddsim.model.checkpoint_kimi import ARCHS as KIMI_ARCHS
from ddsim.model.checkpoint_kimi import KimiMapper, read_kimi_config
from ddsim.model.checkpoint_lfm2 import ARCHS as LFM2_ARCHS
from ddsim.model.checkpoint_lfm2 import Lfm2Mapper, read_lfm2_config
from ddsim.model.checkpoint_mamba import ARCHS as MAMBA_ARCHS
from ddsim.model.checkpoint_mamba import MambaMapper, read_mamba_config
from ddsim.model.checkpoint_minimax import ARCHS as MINIMAX_ARCHS
from ddsim.model.checkpoint_minimax import MiniMaxMapper, read_minimax_config
from ddsim.model.checkpoint_olmo import ARCHS as OLMO_ARCHS
from ddsim.model.checkpoint_olmo import OlmoMapper, read_olmo_config
from ddsim.model.checkpoint_zamba import ARCHS as ZAMBA_ARCHS
from ddsim.model.checkpoint_zamba import Zamba2Mapper, read_zamba2_config
from ddsim.model.config import ModelConfig
from ddsim.model.config_checks import check_default_rope, check_layer_types, check_silu
from ddsim.model.config_defaults import with_defaults
from ddsim.model.weights import weight_shapes

SUPPORTED = (("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text") + MAMBA_ARCHS + LFM2_ARCHS
             + JAMBA_ARCHS + OLMO_ARCHS + MINIMAX_ARCHS + KIMI_ARCHS + ZAMBA_ARCHS)
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


@contextlib.contextmanager
def _fields_of(where: Path):
    """A config.json's fields read inside: a missing one (KeyError) or a malformed one (TypeError, ValueError, and
    the ModelConfig's own ConfigError) becomes one InputError naming the file; an InputError, which names it
    already, passes unchanged."""
    try:
        yield
    except InputError:
        raise
    except KeyError as e:
        raise InputError(f"{where}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: {e}") from None


# the config fields every reader takes as whole numbers (its int(...) of them, or the ModelConfig field they fill):
# a float there was truncated (hidden_size 32.5 read as 32) and a bool taken as 0 or 1 (JSON's true == 1)
INTEGER_FIELDS = frozenset("""
    attn_layer_offset attn_layer_period block_multiple_of conv_L_cache conv_kernel decoder_sparse_step
    expert_layer_offset expert_layer_period first_k_dense_replace head_dim hidden_size intermediate_size kv_lora_rank
    linear_conv_kernel_dim linear_key_head_dim linear_num_key_heads linear_num_value_heads linear_value_head_dim
    mamba_d_conv mamba_d_head mamba_d_ssm mamba_d_state mamba_expand mamba_head_dim mamba_n_groups mamba_n_heads
    mamba_ngroups mamba_num_heads max_position_embeddings moe_intermediate_size moe_shared_expert_intermediate_size
    n_group n_groups n_mamba_heads n_routed_experts n_shared_experts num_attention_heads num_dense_layers num_experts
    num_experts_per_tok num_heads num_hidden_layers num_key_value_heads num_local_experts q_lora_rank qk_nope_head_dim
    qk_rope_head_dim shared_expert_intermediate_size shared_intermediate_size short_conv_kernel_size ssm_state_size
    topk_group v_head_dim vocab_size""".split())


# the fields the readers take as real numbers (their float(...) of them): a bool there was taken as 0.0 or 1.0
REAL_FIELDS = frozenset("""
    attention_in_multiplier attention_multiplier attention_out_multiplier embedding_multiplier key_multiplier
    layer_norm_epsilon lm_head_multiplier logits_scaling norm_eps partial_rotary_factor residual_multiplier rms_norm_eps
    rope_theta routed_scaling_factor ssm_in_multiplier ssm_out_multiplier time_step_min""".split())


def _numbers(raw: dict, where: Path, prefix: str = "") -> None:
    """Every INTEGER_FIELDS entry of a config.json (its nested tables too) a JSON integer, and every REAL_FIELDS
    entry a JSON number, or null, or a string that its reader reads itself ("auto"): a float where a whole number
    belongs, or a bool for either, is refused in one line naming the field."""
    for k, v in raw.items():
        if isinstance(v, dict):
            _numbers(v, where, f"{prefix}{k}.")
        elif k in INTEGER_FIELDS and isinstance(v, (bool, float)):
            raise InputError(f"{where}: {prefix}{k} must be a whole number, got {json.dumps(v)}")
        elif k in REAL_FIELDS and isinstance(v, bool):
            raise InputError(f"{where}: {prefix}{k} must be a number, got {json.dumps(v)}")


def read_config(path: str | Path) -> tuple[ModelConfig, dict]:
    """(ModelConfig, meta) from a checkpoint directory; meta has model_type, dtype, prefix."""
    d = Path(path)
    if not d.is_dir():
        raise InputError(f"--model {d}: not a directory")
    if not (d / "config.json").is_file():
        raise InputError(f"--model {d}: no config.json (not a Hugging Face checkpoint directory)")
    raw = read_json(d / "config.json", "config")
    if not isinstance(raw, dict):
        raise InputError(f"{d / 'config.json'}: expected a JSON object, got {type(raw).__name__}")
    _numbers(raw, d / "config.json")
    mt = raw.get("model_type")
    if mt not in SUPPORTED:
        raise InputError(f"{d / 'config.json'}: unsupported architecture {mt!r} (supported: {', '.join(SUPPORTED)})")
    raw = with_defaults(raw, mt)  # what transformers' saved difference leaves out, as transformers reads it
    readers = {**dict.fromkeys(MAMBA_ARCHS, read_mamba_config), **dict.fromkeys(LFM2_ARCHS, read_lfm2_config),
               "jamba": read_jamba_config, "olmo_hybrid": read_olmo_config, "minimax": read_minimax_config,
               "kimi_linear": read_kimi_config, "zamba2": read_zamba2_config}
    if mt in readers:
        dtype_name = str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16").replace("torch.", "")
        if dtype_name not in _DTYPES:
            raise InputError(f"{d / 'config.json'}: unsupported dtype {dtype_name!r}")
        with _fields_of(d / "config.json"):
            cfg = readers[mt](raw, d)
        meta = {"model_type": mt, "dtype": _DTYPES[dtype_name], "prefix": "backbone." if mt == "nemotron_h" else "model.",
                "path": str(d)}
        return cfg, ({**meta, "raw": raw} if mt in MAMBA_ARCHS + ZAMBA_ARCHS else meta)
    text = with_defaults(raw.get("text_config", raw), f"{mt}_text") if mt in ("qwen3_5", "qwen3_5_moe") else raw
    check_silu(text, d / "config.json")
    if text.get("attention_bias", False):
        raise InputError(f"{d / 'config.json'}: attention_bias=true is not supported")
    n = text.get("num_hidden_layers")
    if n is None:
        raise InputError(f"{d / 'config.json'}: missing field 'num_hidden_layers'")
    types = text.get("layer_types") or [
        "full_attention" if (i + 1) % text.get("full_attention_interval", 4) == 0 else "linear_attention"
        for i in range(n)]
    check_layer_types(types, n=n, allowed=("linear_attention", "full_attention"), where=d / "config.json")
    check_default_rope(text, where=d / "config.json")
    rope = text.get("rope_parameters") or {}
    theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
    prf = rope.get("partial_rotary_factor", text.get("partial_rotary_factor"))  # DEFAULTS: a quarter where neither names one
    dtype_name = str(text.get("dtype") or raw.get("dtype") or raw.get("torch_dtype") or "bfloat16").replace("torch.", "")
    if dtype_name not in _DTYPES:
        raise InputError(f"{d / 'config.json'}: unsupported dtype {dtype_name!r}")
    with _fields_of(d / "config.json"):
        cfg = ModelConfig(
            name=d.name, architecture=mt, vocab_size=int(text["vocab_size"]), hidden_size=int(text["hidden_size"]),
            layer_pattern="".join("a" if t == "full_attention" else "g" for t in types),
            intermediate_size=int(text.get("intermediate_size") or text.get("moe_intermediate_size") or 1),
            num_attention_heads=int(text["num_attention_heads"]), num_key_value_heads=int(text["num_key_value_heads"]),
            head_dim=int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]),
            rope_theta=float(theta), linear_num_key_heads=int(text["linear_num_key_heads"]),
            linear_num_value_heads=int(text["linear_num_value_heads"]),
            linear_key_head_dim=int(text["linear_key_head_dim"]), linear_value_head_dim=int(text["linear_value_head_dim"]),
            conv_kernel_size=int(text.get("linear_conv_kernel_dim", 4)), rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
            norm_offset=1.0, attn_output_gate=True, qk_norm=True, partial_rotary_factor=float(prf),
            num_experts=int(text.get("num_experts", 0) or 0), num_experts_per_tok=int(text.get("num_experts_per_tok", 0) or 0),
            moe_intermediate_size=int(text.get("moe_intermediate_size", 0) or 0),
            shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size", 0) or 0),
            norm_topk_prob=bool(text.get("norm_topk_prob", True)),
            decoder_sparse_step=int(text.get("decoder_sparse_step", 1) or 1),
            mlp_only_layers=tuple(text.get("mlp_only_layers", []) or []),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            notes=f"checkpoint {d}")
    prefix = "model.language_model." if mt in ("qwen3_5", "qwen3_5_moe") else "model."
    return cfg, {"model_type": mt, "dtype": _DTYPES[dtype_name], "prefix": prefix, "path": str(d)}


def _inside(d: Path, f: Path, where: str) -> Path:
    """``f`` if it resolves inside the checkpoint directory ``d`` (no absolute path, no '..', no symlink
    leading out of it), else InputError: a checkpoint names only its own files."""
    root = d.resolve()
    if root != f.resolve() and root not in f.resolve().parents:
        raise InputError(f"{where}: weight file {f.name} resolves outside the checkpoint directory {d}")
    return f


def _shards(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        raw = read_json(index, "shard index")
        wm = raw.get("weight_map", {}) if isinstance(raw, dict) else None  # (a list had failed as an AttributeError)
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise InputError(f"{index}: weight_map must map tensor names to file names")
        files = sorted(set(wm.values()))
        if not files:
            raise InputError(f"{index}: empty weight_map")
        for f in files:
            p = Path(f)
            if p.is_absolute() or ".." in p.parts or f.strip() != f or not f:
                raise InputError(f"{index}: shard {f!r} is not a file name inside the checkpoint directory")
        missing = [f for f in files if not (d / f).is_file()]
        if missing:
            raise InputError(f"{d}: shard {missing[0]} listed in model.safetensors.index.json is missing")
        return [_inside(d, d / f, str(index)) for f in files]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise InputError(f"--model {d}: no *.safetensors weights")
    return [_inside(d, f, f"--model {d}") for f in files]


_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_EXPERT_PARTS = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


class _Mapper:
    """Maps one checkpoint tensor at a time into ddsim's layout."""

    def __init__(self, cfg: ModelConfig, meta: dict, device, out: dict):
        self.cfg, self.meta, self.device, self.out = cfg, meta, device, out
        self.shapes = weight_shapes(cfg)
        self._held: dict = {}  # gather: the pieces of a tensor seen so far

    def dev(self, name):
        """Where a tensor goes: the one device, or its layer's under a placement."""
        if self.meta.get("layer_devices") is None:
            return self.device
        from ddsim.model.placement import weight_device
        return weight_device(name, self.meta["layer_devices"])

    def put(self, name, t):
        self.out[name] = t.to(self.dev(name))

    def expert(self, name, e, t):
        if name not in self.out:
            self.out[name] = torch.empty(self.shapes[name], dtype=t.dtype, device=self.dev(name))
        self.out[name][e] = t.to(self.dev(name))

    def refuse(self, key: str, what: str = "decoder") -> InputError:
        """The error for a tensor ddsim does not read (``what``: "decoder", or "layer" for a layer's tensor)."""
        mt = self.meta["model_type"]
        reads = " as ddsim reads it" if what == "layer" else ""
        return InputError(f"tensor {key!r} is not part of {'an' if mt[0] in 'aeiou' else 'a'} {mt} {what}{reads} "
                          "(refused rather than ignored)")

    def layer_of(self, key: str, t: torch.Tensor, *, final_norm: str) -> tuple[int, str] | None:
        """A decoder-only checkpoint's tensor under ``meta['prefix']``: the LM head, the embedding and the final
        norm (named ``final_norm`` there) are put and None returned; a layer's tensor gives (its layer, the rest of
        its name). Anything else, or a layer past the config's, is refused (the audit would run another model)."""
        if key == "lm_head.weight":
            return self.put("lm_head", t)
        pre = self.meta["prefix"]
        k = key[len(pre):] if key.startswith(pre) else None
        if k in ("embed_tokens.weight", final_norm):
            return self.put("embed" if k == "embed_tokens.weight" else "final_norm", t)
        m = _LAYER.fullmatch(k or "")
        if not m:
            raise self.refuse(key)
        i = int(m.group(1))
        if i >= self.cfg.num_layers:
            raise InputError(f"tensor {key!r} is for layer {i}, but config.json lists {self.cfg.num_layers} layers "
                             "(the audit would drop layers and run another model)")
        return i, m.group(2)

    def experts(self, p: str, rest: str, t: torch.Tensor, *, one: str, fused: str) -> bool:
        """An MoE layer's expert tensor ``rest`` (of layer prefix ``p``), placed: one expert's, ``rest`` matching the
        regex ``one`` (its groups: the expert index, then the part as saved, w1 / w3 / w2 or gate_proj / up_proj /
        down_proj), or every expert's fused under ``fused`` (``{fused}.gate_up_proj`` [E, 2I, d], gate then up;
        ``{fused}.down_proj``). False: not an expert tensor."""
        m = re.fullmatch(one, rest)
        if m:
            self.expert(p + f"mlp.experts.{_EXPERT_PARTS[m.group(2)]}", int(m.group(1)), t)
        elif rest == fused + ".gate_up_proj":
            I = self.cfg.moe_intermediate_size
            self.put(p + "mlp.experts.gate", t[:, :I])
            self.put(p + "mlp.experts.up", t[:, I:])
        elif rest == fused + ".down_proj":
            self.put(p + "mlp.experts.down", t)
        else:
            return False
        return True

    def gather(self, slot, part: str, t: torch.Tensor, parts=("q", "k", "v")) -> torch.Tensor | None:
        """Hold ``t`` as ``part`` of ``slot`` (a tensor a checkpoint stores in pieces, e.g. the q, k and v
        projections of one layer); once every one of ``parts`` arrived, their concatenation in that order."""
        held = self._held.setdefault(slot, {})
        held[part] = t
        if len(held) < len(parts):
            return None
        del self._held[slot]
        return torch.cat([held[x] for x in parts])

    def __call__(self, key: str, t: torch.Tensor) -> None:
        cfg, pre = self.cfg, self.meta["prefix"]
        if key == "lm_head.weight":
            return self.put("lm_head", t)
        if not key.startswith(pre):
            return  # vision tower, MTP head, anything outside the text decoder
        k = key[len(pre):]
        if k == "embed_tokens.weight":
            return self.put("embed", t)
        if k == "norm.weight":
            return self.put("final_norm", t)
        m = _LAYER.fullmatch(k)
        if not m:
            raise InputError(f"tensor {key!r} is not part of a {self.meta['model_type']} text decoder "
                             "(refused rather than ignored: the audit would run another model)")
        i, rest = int(m.group(1)), m.group(2)
        if i >= cfg.num_layers:
            raise InputError(f"tensor {key!r} is for layer {i}, but config.json lists {cfg.num_layers} layers "
                             "(the audit would drop layers and run another model)")
        p = f"layers.{i}."
        H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        K, V, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, HV // H
        nh, hd = cfg.num_attention_heads, cfg.head_dim
        simple = {"input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_norm",
                  "self_attn.k_proj.weight": "attn.k", "self_attn.v_proj.weight": "attn.v",
                  "self_attn.o_proj.weight": "attn.o", "self_attn.q_norm.weight": "attn.q_norm",
                  "self_attn.k_norm.weight": "attn.k_norm", "linear_attn.A_log": "gdn.A_log",
                  "linear_attn.dt_bias": "gdn.dt_bias", "linear_attn.norm.weight": "gdn.norm",
                  "linear_attn.out_proj.weight": "gdn.out", "linear_attn.in_proj_z.weight": "gdn.z",
                  "linear_attn.in_proj_b.weight": "gdn.b", "linear_attn.in_proj_a.weight": "gdn.a",
                  "linear_attn.in_proj_qkv.weight": "gdn.qkv", "mlp.gate_proj.weight": "mlp.gate",
                  "mlp.up_proj.weight": "mlp.up", "mlp.down_proj.weight": "mlp.down", "mlp.gate.weight": "mlp.router",
                  "mlp.shared_expert.gate_proj.weight": "mlp.shared.gate",
                  "mlp.shared_expert.up_proj.weight": "mlp.shared.up",
                  "mlp.shared_expert.down_proj.weight": "mlp.shared.down",
                  "mlp.shared_expert_gate.weight": "mlp.shared_gate"}
        if rest in simple:
            return self.put(p + simple[rest], t)
        if rest == "self_attn.q_proj.weight":  # [nh * 2hd, d]: per head [query, gate]
            w = t.view(nh, 2 * hd, -1)
            self.put(p + "attn.q", w[:, :hd].reshape(nh * hd, -1))
            return self.put(p + "attn.gate", w[:, hd:].reshape(nh * hd, -1))
        if rest == "linear_attn.conv1d.weight":  # [C, 1, W]
            return self.put(p + "gdn.conv", t.reshape(t.shape[0], -1))
        if rest == "linear_attn.in_proj_qkvz.weight":  # per key head: q, k, v (r heads), z (r heads)
            w = t.view(H, 2 * K + 2 * r * V, -1)
            q, k = w[:, :K].reshape(H * K, -1), w[:, K:2 * K].reshape(H * K, -1)
            v = w[:, 2 * K:2 * K + r * V].reshape(HV * V, -1)
            self.put(p + "gdn.qkv", torch.cat([q, k, v]))
            return self.put(p + "gdn.z", w[:, 2 * K + r * V:].reshape(HV * V, -1))
        if rest == "linear_attn.in_proj_ba.weight":  # per key head: b (r), a (r)
            w = t.view(H, 2 * r, -1)
            self.put(p + "gdn.b", w[:, :r].reshape(HV, -1))
            return self.put(p + "gdn.a", w[:, r:].reshape(HV, -1))
        m = re.fullmatch(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", rest)
        if m:
            return self.expert(p + f"mlp.experts.{m.group(2)}", int(m.group(1)), t)
        if rest == "mlp.experts.gate_up_proj":  # fused [E, 2I, d]
            I = cfg.moe_intermediate_size
            self.put(p + "mlp.experts.gate", t[:, :I])
            return self.put(p + "mlp.experts.up", t[:, I:])
        if rest == "mlp.experts.down_proj":
            return self.put(p + "mlp.experts.down", t)
        raise InputError(f"tensor {key!r} is not part of a {self.meta['model_type']} layer as ddsim reads it "
                         "(refused rather than ignored)")


def checkpoint_digest(path: str | Path) -> str:
    """sha256 over config.json and every weight file (name and bytes, in name order): what a report
    records as the audited weights, and what ``gate --report R --model DIR`` checks DIR against."""
    from ddsim.digest import files_digest
    d = Path(path)
    read_config(d)  # a clear error for a directory that is not a supported checkpoint
    return files_digest([d / "config.json", *_shards(d)])


def load_checkpoint(path: str | Path, *, device="cpu", layer_devices=None) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """(config, weights in the checkpoint's dtype on ``device``, meta). Reads shard by shard; with
    ``layer_devices`` (ddsim.model.placement) each tensor goes straight to its layer's device."""
    from safetensors import SafetensorError, safe_open

    from ddsim.digest import held_while_read

    cfg, meta = read_config(path)
    meta["layer_devices"] = layer_devices
    d = Path(path)
    dev = torch.device(device)
    out: dict[str, torch.Tensor] = {}
    if meta["model_type"] in MAMBA_ARCHS:
        mapper = MambaMapper(cfg, meta, dev, out, meta["raw"])
    elif meta["model_type"] in LFM2_ARCHS:
        mapper = Lfm2Mapper(cfg, meta, _Mapper(cfg, meta, dev, out))
    elif meta["model_type"] in JAMBA_ARCHS:
        mapper = JambaMapper(cfg, meta, _Mapper(cfg, meta, dev, out))
    elif meta["model_type"] in OLMO_ARCHS:
        mapper = OlmoMapper(cfg, meta, _Mapper(cfg, meta, dev, out))
    elif meta["model_type"] in MINIMAX_ARCHS:
        mapper = MiniMaxMapper(cfg, meta, _Mapper(cfg, meta, dev, out))
    elif meta["model_type"] in KIMI_ARCHS:
        mapper = KimiMapper(cfg, meta, _Mapper(cfg, meta, dev, out))
    elif meta["model_type"] in ZAMBA_ARCHS:
        mapper = Zamba2Mapper(cfg, meta, _Mapper(cfg, meta, dev, out))
    else:
        mapper = _Mapper(cfg, meta, dev, out)
    for shard in _shards(d):
        with held_while_read(shard):  # (inside an audit: the weights' digest refuses a shard changed since)
            try:
                on = "cpu" if dev.type == "cpu" or layer_devices is not None else str(dev)  # placed: to each layer's device from the host
                with safe_open(str(shard), framework="pt", device=on) as f:
                    for key in f.keys():
                        t = f.get_tensor(key)
                        if (key.startswith(meta["prefix"]) or key == "lm_head.weight") and t.dtype not in _DTYPES.values():
                            raise InputError(f"{key}: dtype {str(t.dtype).replace('torch.', '')} is not supported "
                                             "(bfloat16, float16, float32 or float64; quantised checkpoints are not)")
                        mapper(key, t)
            except SafetensorError as e:
                raise InputError(f"{shard}: truncated or not a safetensors file ({e})") from None
            except InputError as e:
                raise InputError(f"{shard}: {e}") from None
            except (RuntimeError, ValueError) as e:
                raise InputError(f"{shard}: tensor does not fit the config ({e})") from None
    if hasattr(mapper, "finish"):  # tensors a mapper held until every shard was read (Zamba2's shared blocks)
        try:
            mapper.finish()
        except InputError as e:
            raise InputError(f"--model {d}: {e}") from None
        except (RuntimeError, ValueError) as e:
            raise InputError(f"--model {d}: tensor does not fit the config ({e})") from None
    if "lm_head" not in out and cfg.tie_word_embeddings and "embed" in out:
        out["lm_head"] = out["embed"] if layer_devices is None else out["embed"].to(layer_devices[-1])
    shapes = weight_shapes(cfg)
    missing = sorted(set(shapes) - set(out))
    if missing:
        raise InputError(f"--model {d}: tensor for {missing[0]} missing from the checkpoint ({len(missing)} missing)")
    for k, shape in shapes.items():
        if tuple(out[k].shape) != shape:
            raise InputError(f"--model {d}: {k} has shape {tuple(out[k].shape)}, the config implies {shape}")
    return cfg, {k: out[k] for k in shapes}, meta
