"""Model configurations and presets for the synthetic hybrid decoder (README, Contracts: the model).

A layer pattern is a string over {'g', 'a'}: 'g' a Gated DeltaNet layer, 'a' an attention layer,
one character per layer in order. ``pattern(n_layers, gdn=3, attn=1)`` gives the Qwen3-Next /
Qwen3.5 layout (three GDN layers, then one attention layer, repeated).

Synthetic statistics that decide how large the leak is and whether it flips tokens:
- gates: every GDN layer's value heads get typical memory half-lives spread log-uniformly over
  ``gate_halflife`` tokens (exp(g) = 2^(-1/halflife)), from fast forgetting to long memory; a
  token-dependent gate input with std ``gate_noise`` moves each token's g by a factor e^(+-noise).
- logits: the LM head is scaled so that logits have standard deviation ``logit_std`` across the
  vocabulary, which sets the top-1 margins (see README for the measured distribution).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ddsim.errors import ConfigError


def pattern(n_layers: int, *, gdn: int = 3, attn: int = 1) -> str:
    """'ggga' repeated to n_layers layers (gdn GDN layers then attn attention layers)."""
    unit = "g" * gdn + "a" * attn
    return (unit * (n_layers // len(unit) + 1))[:n_layers]


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    layer_pattern: str
    intermediate_size: int
    # attention (causal GQA with RoPE)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    # Gated DeltaNet
    linear_num_key_heads: int = 2  # H
    linear_num_value_heads: int = 4  # HV
    linear_key_head_dim: int = 32  # K
    linear_value_head_dim: int = 32  # V
    conv_kernel_size: int = 4  # W
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    # synthetic statistics (documented above and in the README)
    gate_halflife: tuple[float, float] = (1.0, 256.0)
    gate_noise: float = 0.5
    logit_std: float = 4.0
    notes: str = ""
    # real-architecture features (Qwen3-Next / Qwen3.5 checkpoints); the synthetic presets leave them off
    architecture: str = "synthetic"
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + weight): 1.0 for Qwen's zero-centred norms
    attn_output_gate: bool = False  # attention output times sigmoid(gate), gate from q_proj's second half
    qk_norm: bool = False  # RMSNorm of q and k per head before RoPE
    partial_rotary_factor: float = 1.0  # RoPE on the first int(head_dim * factor) dims of each head
    num_experts: int = 0  # MoE MLP (SwiGLU experts, softmax top-k router, shared expert) when > 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()
    tie_word_embeddings: bool = False

    def __post_init__(self):
        self.validate()

    # ---- derived ----
    @property
    def num_layers(self) -> int:
        return len(self.layer_pattern)

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i, c in enumerate(self.layer_pattern) if c == "g"]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, c in enumerate(self.layer_pattern) if c == "a"]

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN short conv: q ‖ k ‖ v = 2*H*K + HV*V."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    def validate(self) -> None:
        def need(cond, arg, why):
            if not cond:
                raise ConfigError(f"{arg}: {why} (config {self.name!r})")

        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                  "linear_key_head_dim", "linear_value_head_dim", "conv_kernel_size",
                  "max_position_embeddings"):
            v = getattr(self, f)
            need(isinstance(v, int) and v >= 1, f, f"expected a positive integer, got {v!r}")
        need(len(self.layer_pattern) >= 1, "layer_pattern", "no layers")
        need(set(self.layer_pattern) <= {"g", "a"}, "layer_pattern",
             f"only 'g' (gdn) and 'a' (attention) are allowed, got {self.layer_pattern!r}")
        need(self.linear_num_value_heads % self.linear_num_key_heads == 0, "linear_num_value_heads",
             f"HV={self.linear_num_value_heads} is not a multiple of H={self.linear_num_key_heads}")
        need(self.num_attention_heads % self.num_key_value_heads == 0, "num_attention_heads",
             f"{self.num_attention_heads} is not a multiple of num_key_value_heads={self.num_key_value_heads}")
        need(self.head_dim % 2 == 0, "head_dim", "RoPE needs an even head_dim")
        lo, hi = self.gate_halflife
        need(0 < lo <= hi, "gate_halflife", f"need 0 < min <= max, got {self.gate_halflife}")
        need(self.gate_noise >= 0, "gate_noise", "must be >= 0")
        need(self.logit_std > 0, "logit_std", "must be > 0")
        need(0 < self.partial_rotary_factor <= 1 and self.rotary_dim % 2 == 0, "partial_rotary_factor",
             f"needs an even rotary dim in (0, head_dim], got {self.partial_rotary_factor}")
        if self.num_experts:
            need(0 < self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
                 f"expected 1..{self.num_experts}, got {self.num_experts_per_tok}")
            need(self.moe_intermediate_size >= 1, "moe_intermediate_size", "expected >= 1 with experts")
            need(self.decoder_sparse_step >= 1, "decoder_sparse_step", "expected >= 1")

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["gate_halflife"] = list(self.gate_halflife)
        d["mlp_only_layers"] = list(self.mlp_only_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"config: unknown field {unknown[0]!r}")
        d = dict(d)
        if "gate_halflife" in d:
            d["gate_halflife"] = tuple(d["gate_halflife"])
        if "mlp_only_layers" in d:
            d["mlp_only_layers"] = tuple(d["mlp_only_layers"])
        return cls(**d)


PRESETS: dict[str, ModelConfig] = {
    # The CPU default: 8 layers in the 3:1 pattern; a 65-node tree takes milliseconds per mode.
    "tiny": ModelConfig(
        name="tiny", vocab_size=512, hidden_size=128, layer_pattern=pattern(8),
        intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, notes="CPU default audit preset"),
    # For property tests: every code path (grouped heads, GQA, both layer kinds) at toy size.
    "micro": ModelConfig(
        name="micro", vocab_size=48, hidden_size=32, layer_pattern=pattern(4),
        intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, max_position_embeddings=512, notes="property-test preset"),
    # Real shapes (random weights; meant for the GPU).
    "qwen3.6-27b": ModelConfig(
        name="qwen3.6-27b", vocab_size=248320, hidden_size=5120, layer_pattern=pattern(64),
        intermediate_size=17408, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, max_position_embeddings=262144, rope_theta=10_000_000.0,
        architecture="qwen3_5", norm_offset=1.0, attn_output_gate=True, qk_norm=True, partial_rotary_factor=0.25,
        notes="Qwen3.5/3.6-27B shapes and layer features (gated attention, q/k norm, partial RoPE), random weights"),
    "qwen3-next-80b": ModelConfig(
        name="qwen3-next-80b", vocab_size=151936, hidden_size=2048, layer_pattern=pattern(48),
        intermediate_size=5632, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, max_position_embeddings=262144, rope_theta=10_000_000.0,
        notes="Qwen3-Next-80B-A3B shapes; the MoE is replaced by a dense SwiGLU of the active width "
              "(shared expert + 10 routed experts of 512)"),
}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"preset: unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})")
    return PRESETS[name]
