"""Model configurations and presets for the synthetic hybrid decoder (README, Contracts: the model).

A layer pattern is a string, one character per layer in order:
  'g'  Gated DeltaNet mixer            (Qwen3-Next, Qwen3.5/3.6)
  'a'  attention mixer
  'm'  Mamba2 mixer                    (Nemotron-H, Bamba, Granite-4.0-H)
  'p'  attention and Mamba2 in parallel on the same normed input, outputs summed (Falcon-H1)
  'f'  an MLP block alone              (Nemotron-H's '-' layers)
  's'  Mamba1 mixer (selective scan)    (Jamba: a per-channel state [I, N], dt/B/C from the conv's output)
  'l'  lightning attention             (MiniMax: linear attention with a constant decay per head; a state
                                        [H, hd, hd] and no conv window)
  'k'  Kimi Delta Attention            (Kimi Linear: GDN's delta rule with a decay per key channel, H heads
                                        of K = V = linear_key_head_dim, short convs over q, k, v)
  'c'  a gated short convolution       (LFM2: out(C * conv(B * x)), no recurrent state beyond the
                                        conv window: the family whose whole state is a window)
  'z'  attention, then Mamba2          (Zamba2's hybrid layer: a transformer block (attention and its MLP) on
                                        the concatenation [h, embeddings] (2d wide) projected to t, then
                                        h + Mamba2(norm(h + t)); the transformer block's output joins the
                                        Mamba2 mixer's input, not the residual stream)
A mixer layer is input norm, mixer, residual, then (when ``layer_mlp``) post norm, MLP, residual;
Nemotron-H has ``layer_mlp=False`` and its MLPs in 'f' layers. ``pattern(n_layers, gdn=3, attn=1)``
gives the Qwen3-Next / Qwen3.5 layout (three GDN layers, then one attention layer, repeated).

Synthetic statistics that decide how large the leak is and whether it flips tokens:
- gates: every GDN layer's value heads get typical memory half-lives spread log-uniformly over
  ``gate_halflife`` tokens (exp(g) = 2^(-1/halflife)), from fast forgetting to long memory; a
  token-dependent gate input with std ``gate_noise`` moves each token's g by a factor e^(+-noise).
- logits: the LM head is scaled so that logits have standard deviation ``logit_std`` across the
  vocabulary, which sets the top-1 margins (see README for the measured distribution).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ddsim.errors import ConfigError
from ddsim.values import is_int

LAYER_KINDS = "gampfcslkz"
STATEFUL_KINDS = "gmpslkz"  # the kinds with a recurrent state beside any conv window (reports' state_rel)
WINDOWED_KINDS = "gmpskcz"  # the kinds with a conv window (reports' conv_rel)
FAMILIES = {"g": "gdn", "m": "mamba2", "p": "mamba2", "c": "conv", "s": "mamba1", "l": "lightning",
            "k": "kda", "z": "mamba2"}  # recurrent layer kind -> family


def pattern(n_layers: int, *, gdn: int = 3, attn: int = 1, kind: str = "g") -> str:
    """'ggga' repeated to n_layers layers (gdn recurrent layers of ``kind`` then attn attention layers)."""
    unit = kind * gdn + "a" * attn
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
    gdn_beta_scale: float = 1.0  # beta = scale * sigmoid(b): 2.0 lets the delta rule's eigenvalues go negative (OLMo-Hybrid)
    gdn_norm_eps: float = 0.0  # epsilon of the GDN gated RMSNorm (0: rms_norm_eps)
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
    qk_norm_all: bool = False  # with qk_norm: one RMSNorm over all heads' q (and k) jointly (OLMo-Hybrid)
    # attention layers ('a') norm their outputs instead of their inputs: h + norm(attn(h)), h + norm(mlp(h))
    # (OLMo-Hybrid's attention blocks; input_norm and post_norm are those two output norms)
    attn_post_norm: bool = False
    # multi-head latent attention when mla_kv_lora_rank > 0: q from x (or through a normed rank mla_q_lora_rank
    # bottleneck), per head k = [k_nope, k_rope] and v from a normed rank mla_kv_lora_rank latent (k_rope shared by the
    # heads); heads of qk = nope + rope dims and v dims, zero-padded to head_dim = max(qk, v) (exact: the zeros add
    # nothing), scale attention_scale. use_rope: the decoupled RoPE of DeepSeek's MLA, q's rope dims and k_rope rotated
    # at the token's position (rotate-half over the rope dims; mla_rope_interleave: they are laid out in interleaved
    # pairs (x0, x1), (x2, x3), ..., DeepSeek-V3's rope_interleave); without it NoPE (Kimi Linear)
    mla_kv_lora_rank: int = 0
    mla_q_lora_rank: int = 0
    mla_qk_nope_head_dim: int = 0
    mla_qk_rope_head_dim: int = 0
    mla_v_head_dim: int = 0
    mla_norm_eps: float = 1e-6  # the latents' RMSNorms (Kimi Linear's are built without the config's epsilon)
    mla_rope_interleave: bool = False
    partial_rotary_factor: float = 1.0  # RoPE on the first int(head_dim * factor) dims of each head
    num_experts: int = 0  # MoE MLP (SwiGLU experts, softmax top-k router, shared expert) when > 0
    shared_expert_gate: bool = True  # the shared expert's output scaled by sigmoid(x . w) (False: Granite's plain sum)
    # "softmax": softmax over experts, top k (renormalised with norm_topk_prob); "sigmoid" (Nemotron-H):
    # sigmoid scores, top k chosen by score + router_bias among the best moe_topk_group of moe_n_group
    # groups, weights the chosen scores (renormalised) times routed_scaling_factor
    moe_router: str = "softmax"
    moe_n_group: int = 1
    moe_topk_group: int = 1
    routed_scaling_factor: float = 1.0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_norm_eps: float = 1e-20  # the renormalised top-k weights are top / (sum + moe_norm_eps) (LFM2-MoE: 1e-6)
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()
    tie_word_embeddings: bool = False
    # Mamba2 mixers ('m', 'p'): H heads of P channels, state size N, G groups of B/C; the conv over
    # x || B || C has conv_kernel_size taps. dt = clamp(softplus(dt_raw + dt_bias), *mamba_dt_limit).
    mamba_num_heads: int = 4  # H
    mamba_head_dim: int = 16  # P
    mamba_state_size: int = 16  # N
    mamba_n_groups: int = 1  # G
    mamba_conv_bias: bool = True
    mamba_dt_limit: tuple[float, float] = (0.0, float("inf"))
    # "gated": rmsnorm(y * silu(z)) per group (Mamba2's norm_before_gate=False); "gated-before":
    # rmsnorm(y) * silu(z); "gate": y * silu(z), no norm (Falcon-H1's mamba_rms_norm=False)
    mamba_norm: str = "gated"
    # Mamba1 mixers ('s', Jamba): I channels of state size mamba_state_size (N), dt from a rank-R projection
    # of the conv's output; with mamba1_bcdt_norm, RMSNorms of dt (before its projection), B and C (Jamba's)
    mamba1_inner: int = 32  # I
    mamba1_dt_rank: int = 4  # R
    mamba1_bcdt_norm: bool = True
    # lightning attention ('l', MiniMax): num_attention_heads heads of head_dim; each layer's decays are its weights
    lightning_norm_eps: float = 1e-6
    # MiniMax's blocks: the residual is the normed input, each sum scaled: h = alpha xn + beta mixer(xn), then
    # xn' = post_norm(h), h = mlp_alpha xn' + mlp_beta mlp(xn') (attn_* for attention, linear_* for other mixers)
    residual_from_norm: bool = False
    attn_alpha: float = 1.0
    attn_beta: float = 1.0
    linear_alpha: float = 1.0
    linear_beta: float = 1.0
    mlp_alpha: float = 1.0
    mlp_beta: float = 1.0
    # block structure and scalings (Nemotron-H, Granite-4.0-H, Falcon-H1 fold theirs into these)
    layer_mlp: bool = True  # every mixer layer has its own post-norm MLP
    # "swiglu": down(silu(gate x) * up x); "geglu": down(gelu(gate x) * up x) (exact GELU, Zamba2's);
    # "relu2": down(relu(up x)^2)
    mlp_act: str = "swiglu"
    use_rope: bool = True  # False: attention without positional encoding (NoPE)
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0  # each block's output is scaled before the residual add
    attention_scale: float = 0.0  # 0: head_dim ** -0.5
    logits_scaling: float = 1.0  # logits are divided by it

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
    def mamba_layers(self) -> list[int]:
        """Layers with a Mamba2 mixer ('m', the parallel 'p' and Zamba2's hybrid 'z')."""
        return [i for i, c in enumerate(self.layer_pattern) if c in "mpz"]

    @property
    def recurrent_layers(self) -> list[int]:
        """Layers that keep a conv window, and a recurrent state beside it (GDN, Mamba2; a short conv's
        state is empty: state_shape (0,))."""
        return [i for i, c in enumerate(self.layer_pattern) if c in FAMILIES]

    @property
    def attention_layers(self) -> list[int]:
        """Layers with an attention mixer ('a', the parallel 'p' and Zamba2's hybrid 'z')."""
        return [i for i, c in enumerate(self.layer_pattern) if c in "apz"]

    def has_mlp(self, i: int) -> bool:
        """Whether layer i has an MLP: 'f' layers, Zamba2's hybrid layers (their transformer block's), and every
        mixer layer with layer_mlp."""
        return self.layer_pattern[i] in "fz" or self.layer_mlp

    @property
    def gated_mlp(self) -> bool:
        """Whether MLPs (and experts) have a gate projection: SwiGLU and GeGLU, not relu^2."""
        return self.mlp_act != "relu2"

    def attention_input(self, i: int) -> int:
        """Width of layer i's attention input: 2d for Zamba2's hybrid layers ([h, embeddings]), else d."""
        return 2 * self.hidden_size if self.layer_pattern[i] == "z" else self.hidden_size

    def family(self, i: int) -> str | None:
        """The recurrent family of layer i ('gdn', 'mamba2', 'conv') or None."""
        return FAMILIES.get(self.layer_pattern[i])

    @property
    def mamba_inner(self) -> int:
        """Mamba2 inner width I = H * P."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the Mamba2 conv: x || B || C = I + 2 G N."""
        return self.mamba_inner + 2 * self.mamba_n_groups * self.mamba_state_size

    def windowed(self, i: int) -> bool:
        """Whether recurrent layer i keeps a conv window (all but lightning attention)."""
        return self.layer_pattern[i] in WINDOWED_KINDS

    def stateful(self, i: int) -> bool:
        """Whether recurrent layer i keeps a state beside its window (all but the short conv)."""
        return self.layer_pattern[i] in STATEFUL_KINDS

    def state_shape(self, i: int) -> tuple[int, ...]:
        """Recurrent state of layer i: [HV, K, V] (GDN), [H, P, N] (Mamba2), [I, N] (Mamba1), or [0] (a short
        conv: none)."""
        if self.layer_pattern[i] == "c":
            return (0,)
        if self.layer_pattern[i] == "s":
            return (self.mamba1_inner, self.mamba_state_size)
        if self.layer_pattern[i] == "l":
            return (self.num_attention_heads, self.head_dim, self.head_dim)
        if self.layer_pattern[i] in "gk":
            return (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim)
        return (self.mamba_num_heads, self.mamba_head_dim, self.mamba_state_size)

    def window_shape(self, i: int) -> tuple[int, int]:
        """Conv window of layer i: [C, W-1] (a short conv's C is the hidden size)."""
        kind = self.layer_pattern[i]
        if kind == "l":  # lightning attention has no conv: an empty window
            return (0, 0)
        C = {"g": self.conv_dim, "k": self.conv_dim, "c": self.hidden_size, "s": self.mamba1_inner}.get(kind, self.mamba_conv_dim)
        return (C, self.conv_kernel_size - 1)

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

        def whole(v, lo: int) -> bool:
            return is_int(v) and v >= lo

        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                  "linear_key_head_dim", "linear_value_head_dim", "conv_kernel_size",
                  "max_position_embeddings", "mamba_num_heads", "mamba_head_dim", "mamba_state_size",
                  "mamba_n_groups", "mamba1_inner", "mamba1_dt_rank",
                  "moe_n_group", "moe_topk_group", "decoder_sparse_step"):  # (the MoE ones read with no experts too)
            v = getattr(self, f)
            need(whole(v, 1), f, f"expected a positive integer, got {v!r}")
        for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                  "mla_kv_lora_rank", "mla_q_lora_rank", "mla_qk_nope_head_dim", "mla_qk_rope_head_dim",
                  "mla_v_head_dim"):  # 0: the part is absent
            v = getattr(self, f)
            need(whole(v, 0), f, f"expected an integer >= 0, got {v!r}")
        need(all(whole(i, 0) for i in self.mlp_only_layers),
             "mlp_only_layers", f"expected layer indices (integers >= 0), got {self.mlp_only_layers!r}")
        need(len(self.layer_pattern) >= 1, "layer_pattern", "no layers")
        need(set(self.layer_pattern) <= set(LAYER_KINDS), "layer_pattern",
             f"only 'g' (gdn), 'a' (attention), 'm' (mamba2), 'p' (parallel attention + mamba2), 'f' (MLP), "
             f"'c' (short conv), 's' (mamba1), 'l' (lightning), 'k' (KDA) and 'z' (attention then mamba2) are allowed, "
             f"got {self.layer_pattern!r}")
        need(self.mamba_num_heads % self.mamba_n_groups == 0, "mamba_num_heads",
             f"{self.mamba_num_heads} heads is not a multiple of mamba_n_groups={self.mamba_n_groups}")
        lo, hi = self.mamba_dt_limit
        need(0.0 <= lo <= hi, "mamba_dt_limit", f"need 0 <= lo <= hi, got {self.mamba_dt_limit}")
        need(self.mamba_norm in ("gated", "gated-before", "gate"), "mamba_norm",
             f"expected 'gated', 'gated-before' or 'gate', got {self.mamba_norm!r}")
        need(self.mlp_act in ("swiglu", "geglu", "relu2"), "mlp_act",
             f"expected 'swiglu', 'geglu' or 'relu2', got {self.mlp_act!r}")
        need(self.moe_router in ("softmax", "sigmoid"), "moe_router", f"expected 'softmax' or 'sigmoid', got {self.moe_router!r}")
        if self.num_experts:
            need(self.moe_n_group >= 1 and self.num_experts % self.moe_n_group == 0, "moe_n_group",
                 f"{self.num_experts} experts are not split into {self.moe_n_group} equal groups")
            need(1 <= self.moe_topk_group <= self.moe_n_group, "moe_topk_group",
                 f"expected 1..{self.moe_n_group}, got {self.moe_topk_group}")
            need(self.num_experts_per_tok <= self.moe_topk_group * (self.num_experts // self.moe_n_group),
                 "num_experts_per_tok", "more experts per token than the kept groups hold")
        need(self.layer_mlp or "f" in self.layer_pattern or "z" in self.layer_pattern or not self.layer_pattern, "layer_mlp",
             "False needs 'f' or 'z' layers (the model would have no MLP at all)")
        need("z" not in self.layer_pattern or not self.mla_kv_lora_rank, "mla_kv_lora_rank",
             "MLA attention in Zamba2's hybrid layers ('z') is not supported")
        need(self.moe_norm_eps >= 0, "moe_norm_eps", "must be >= 0")
        need(math.isfinite(self.rms_norm_eps) and self.rms_norm_eps >= 0, "rms_norm_eps",
             f"expected a finite number >= 0, got {self.rms_norm_eps!r}")
        need(not self.use_rope or (math.isfinite(self.rope_theta) and self.rope_theta > 0), "rope_theta",
             f"expected a finite base > 0, got {self.rope_theta!r}")
        need(0 < self.gdn_beta_scale <= 2, "gdn_beta_scale", f"expected (0, 2], got {self.gdn_beta_scale}")
        need(self.gdn_norm_eps >= 0, "gdn_norm_eps", "must be >= 0")
        need(not self.qk_norm_all or self.qk_norm, "qk_norm_all", "needs qk_norm")
        if self.mla_kv_lora_rank:
            qk = self.mla_qk_nope_head_dim + self.mla_qk_rope_head_dim
            need(self.head_dim == max(qk, self.mla_v_head_dim) and qk >= 1 and self.mla_v_head_dim >= 1, "head_dim",
                 f"MLA pads its heads to max(qk {qk}, v {self.mla_v_head_dim}), got {self.head_dim}")
            need(self.num_key_value_heads == self.num_attention_heads and not self.qk_norm and not self.attn_output_gate,
                 "mla_kv_lora_rank", "MLA: one key and value head per query head, without q/k norms or an output gate")
            need(not self.use_rope or (self.mla_qk_rope_head_dim >= 2 and self.mla_qk_rope_head_dim % 2 == 0),
                 "mla_qk_rope_head_dim", f"MLA's decoupled RoPE rotates an even number of dims, got {self.mla_qk_rope_head_dim}")
        need(not self.mla_rope_interleave or (self.mla_kv_lora_rank and self.use_rope), "mla_rope_interleave",
             "needs MLA with its decoupled RoPE (mla_kv_lora_rank > 0, use_rope)")
        need("k" not in self.layer_pattern or (self.linear_num_key_heads == self.linear_num_value_heads
                                               and self.linear_key_head_dim == self.linear_value_head_dim),
             "linear_num_value_heads", "KDA layers ('k') have H heads of K = V dims")
        need(not self.residual_from_norm or (set(self.layer_pattern) <= set("alf") and self.layer_mlp),
             "residual_from_norm", "MiniMax's block: attention ('a'), lightning ('l') and MLP ('f') layers, each with its MLP")
        need(not (self.residual_from_norm and self.attn_post_norm), "attn_post_norm", "excludes residual_from_norm")
        for f in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
            need(getattr(self, f) > 0, f, "must be > 0")
        need(self.attention_scale >= 0, "attention_scale", "must be >= 0 (0: head_dim ** -0.5)")
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
        d["mamba_dt_limit"] = [self.mamba_dt_limit[0], self.mamba_dt_limit[1] if math.isfinite(self.mamba_dt_limit[1])
                               else None]  # JSON has no infinity: null is "no upper limit"
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
        if "mamba_dt_limit" in d:
            lo, hi = d["mamba_dt_limit"]
            d["mamba_dt_limit"] = (float(lo), math.inf if hi is None else float(hi))
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
        intermediate_size=5120, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, max_position_embeddings=262144, rope_theta=10_000_000.0,
        architecture="qwen3_next", norm_offset=1.0, attn_output_gate=True, qk_norm=True, partial_rotary_factor=0.25,
        num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        notes="Qwen3-Next-80B-A3B shapes and layer features: every layer's MLP the routed MoE (512 experts of 512, "
              "top 10, renormalised) plus the sigmoid-gated shared expert; 79.7B parameters, 159 GB in bf16: more than "
              "one H200 holds (--devices places it across GPUs); random weights"),
    # Mamba2 hybrids. CPU size: Bamba's layout (a Mamba2 mixer and a SwiGLU MLP per layer, one
    # attention layer in four), grouped B/C.
    "tiny-mamba2": ModelConfig(
        name="tiny-mamba2", vocab_size=512, hidden_size=128, layer_pattern=pattern(8, kind="m"),
        intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32, mamba_num_heads=8,
        mamba_head_dim=16, mamba_state_size=16, mamba_n_groups=2, notes="CPU Mamba2-hybrid audit preset"),
    "micro-mamba2": ModelConfig(
        name="micro-mamba2", vocab_size=48, hidden_size=32, layer_pattern="mfmapf", intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, mamba_num_heads=4, mamba_head_dim=4,
        mamba_state_size=6, mamba_n_groups=2, max_position_embeddings=512, layer_mlp=False, mlp_act="relu2",
        use_rope=False, notes="property-test preset: Mamba2, parallel, MLP-only layers, Nemotron-H's block layout"),
    # Real shapes (random weights; meant for the GPU).
    "nemotron-h-8b": ModelConfig(
        name="nemotron-h-8b", vocab_size=131072, hidden_size=4096,
        layer_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-".translate(str.maketrans("M*-", "maf")),
        intermediate_size=21504, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        mamba_num_heads=128, mamba_head_dim=64, mamba_state_size=128, mamba_n_groups=8,
        mamba_dt_limit=(0.001, float("inf")), rms_norm_eps=1e-5, max_position_embeddings=8192, layer_mlp=False,
        mlp_act="relu2", use_rope=False, architecture="nemotron_h",
        notes="Nemotron-H-8B shapes and block layout (24 Mamba2, 4 attention without RoPE, 24 relu^2 MLP blocks), "
              "random weights"),
    "falcon-h1-7b": ModelConfig(
        name="falcon-h1-7b", vocab_size=130048, hidden_size=3072, layer_pattern="p" * 44, intermediate_size=12288,
        num_attention_heads=12, num_key_value_heads=2, head_dim=128, rope_theta=1e11, mamba_num_heads=24,
        mamba_head_dim=128, mamba_state_size=256, mamba_n_groups=1, mamba_norm="gate", rms_norm_eps=1e-5,
        max_position_embeddings=262144, architecture="falcon_h1",
        notes="Falcon-H1-7B shapes (44 layers of attention and Mamba2 in parallel; d_state 256), random weights "
              "with the multipliers at 1 (a checkpoint's are folded into its weights)"),
    # Jamba (Mamba1 mixers, attention without RoPE one layer in four, routed experts on every other layer).
    "tiny-jamba": ModelConfig(
        name="tiny-jamba", vocab_size=512, hidden_size=128, layer_pattern="ssassssa", intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, use_rope=False, mamba1_inner=256, mamba1_dt_rank=8,
        mamba_state_size=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=False,
        mlp_only_layers=(0, 2, 4, 6), architecture="jamba", notes="CPU Mamba1 (Jamba-layout) audit preset"),
    "jamba-mini-1.6": ModelConfig(
        name="jamba-mini-1.6", vocab_size=65536, hidden_size=4096, layer_pattern="ssssasss" * 4, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, use_rope=False, mamba1_inner=8192,
        mamba1_dt_rank=256, mamba_state_size=16, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=14336,
        norm_topk_prob=False, mlp_only_layers=tuple(range(0, 32, 2)), max_position_embeddings=262144,
        architecture="jamba", notes="Jamba Mini 1.6 shapes (32 layers: 28 Mamba1 of 8192 channels, d_state 16, dt rank "
                                    "256; 4 attention layers without RoPE; 16 experts of 14336, top 2, on odd layers; "
                                    "51.6B parameters), random weights"),
    # MiniMax-Text-01's layout (seven lightning-attention layers to one softmax attention layer, MoE everywhere, the
    # scaled normed-residual block); its published size (456B) does not fit one GPU: no full-size preset.
    "tiny-minimax": ModelConfig(
        name="tiny-minimax", vocab_size=512, hidden_size=128, layer_pattern="llllllla", intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1e7, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=128, residual_from_norm=True, attn_alpha=3.5, attn_beta=1.0, linear_alpha=3.5,
        linear_beta=1.0, mlp_alpha=3.5, mlp_beta=1.0, rms_norm_eps=1e-5, architecture="minimax",
        notes="CPU lightning-attention (MiniMax-layout) audit preset"),
    # Kimi Linear (KDA and MLA without RoPE, 3:1, the last layer MLA; grouped sigmoid MoE with a shared expert).
    "tiny-kimi": ModelConfig(
        name="tiny-kimi", vocab_size=512, hidden_size=128, layer_pattern="kkkakkka", intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32, use_rope=False, attention_scale=24 ** -0.5,
        mla_kv_lora_rank=32, mla_qk_nope_head_dim=16, mla_qk_rope_head_dim=8, mla_v_head_dim=32,
        linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        shared_expert_gate=False, moe_router="sigmoid", moe_n_group=2, moe_topk_group=1, routed_scaling_factor=2.446,
        mlp_only_layers=(0,), rms_norm_eps=1e-5, architecture="kimi_linear",
        notes="CPU Kimi Delta Attention (Kimi Linear-layout) audit preset"),
    "kimi-linear-48b-a3b": ModelConfig(
        name="kimi-linear-48b-a3b", vocab_size=163840, hidden_size=2304,
        layer_pattern="".join("a" if i + 1 in (4, 8, 12, 16, 20, 24, 27) else "k" for i in range(27)),
        intermediate_size=9216, num_attention_heads=32, num_key_value_heads=32, head_dim=192, use_rope=False,
        attention_scale=192 ** -0.5, mla_kv_lora_rank=512, mla_qk_nope_head_dim=128, mla_qk_rope_head_dim=64,
        mla_v_head_dim=128, linear_num_key_heads=32, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=1024,
        shared_expert_intermediate_size=1024, shared_expert_gate=False, moe_router="sigmoid",
        routed_scaling_factor=2.446, mlp_only_layers=(0,), rms_norm_eps=1e-5, max_position_embeddings=1048576,
        architecture="kimi_linear",
        notes="Kimi-Linear-48B-A3B shapes (27 layers: 20 KDA of 32 heads x 128, 7 MLA at 4, 8, ..., 24, 27 without "
              "RoPE; 256 experts of 1024, top 8, and a shared expert from layer 1 on), random weights"),
    # Zamba2 (Mamba2 layers; hybrid layers run a shared transformer block on [h, embeddings] and feed it to their
    # Mamba2 mixer). Random weights give each hybrid layer its own block, as a checkpoint's adapters folded in do.
    "tiny-zamba2": ModelConfig(
        name="tiny-zamba2", vocab_size=512, hidden_size=128, layer_pattern="mmmzmmmz", intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=4, head_dim=64, attention_scale=32 ** -0.5, mamba_num_heads=8,
        mamba_head_dim=32, mamba_state_size=16, mamba_dt_limit=(0.001, float("inf")), rms_norm_eps=1e-5,
        layer_mlp=False, mlp_act="geglu", architecture="zamba2", notes="CPU Zamba2-layout audit preset"),
    "zamba2-2.7b": ModelConfig(
        name="zamba2-2.7b", vocab_size=32000, hidden_size=2560,
        layer_pattern="".join("z" if i in (6, 12, 18, 24, 30, 36, 42, 47, 51) else "m" for i in range(54)),
        intermediate_size=10240, num_attention_heads=32, num_key_value_heads=32, head_dim=160,
        attention_scale=80 ** -0.5, use_rope=False, mamba_num_heads=80, mamba_head_dim=64, mamba_state_size=64,
        mamba_dt_limit=(0.001, float("inf")), rms_norm_eps=1e-5, layer_mlp=False, mlp_act="geglu",
        tie_word_embeddings=True, architecture="zamba2",
        notes="Zamba2-2.7B shapes (54 layers: 45 Mamba2 of 80 heads x 64, d_state 64; 9 hybrid layers at 6, 12, ..., "
              "42, 47, 51 whose transformer blocks, 32 heads x 160 on [h, embeddings] and a GeGLU MLP of 10240, feed "
              "their Mamba2 mixers), random weights, each hybrid layer its own block (3.9B parameters as built; 2.7B "
              "with the blocks shared)"),
    # LFM2 (gated short convs, the window their whole state): LFM2's layout (two short convs to an attention
    # layer with q/k norms, a SwiGLU MLP per layer). The MoE variant's router is drawn by the property tests.
    "tiny-lfm2": ModelConfig(
        name="tiny-lfm2", vocab_size=512, hidden_size=128, layer_pattern="ccaccacc", intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, conv_kernel_size=3, qk_norm=True,
        rope_theta=1_000_000.0, rms_norm_eps=1e-5, architecture="lfm2", notes="CPU short-conv (LFM2) audit preset"),
    "micro-lfm2": ModelConfig(
        name="micro-lfm2", vocab_size=48, hidden_size=32, layer_pattern="ccacc", intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, conv_kernel_size=3, qk_norm=True,
        max_position_embeddings=512, architecture="lfm2",
        notes="property-test preset: short convs (the window their whole state), attention with q/k norms"),
    # Real shapes (random weights; meant for the GPU).
    "lfm2-8b-a1b": ModelConfig(
        name="lfm2-8b-a1b", vocab_size=65536, hidden_size=2048, layer_pattern="ccaccca" "cccacccacccaccacc",
        intermediate_size=7168, num_attention_heads=32, num_key_value_heads=8, head_dim=64, conv_kernel_size=3,
        qk_norm=True, rope_theta=1_000_000.0, rms_norm_eps=1e-5, max_position_embeddings=128000, num_experts=32,
        num_experts_per_tok=4, moe_intermediate_size=1792, moe_router="sigmoid", moe_norm_eps=1e-6,
        mlp_only_layers=(0, 1), tie_word_embeddings=True, architecture="lfm2_moe",
        notes="LFM2-8B-A1B shapes (24 layers: 18 gated short convs of 3 taps, 6 attention at 2, 6, 10, 14, 18, 21; "
              "two dense SwiGLU layers, then 32 sigmoid-routed experts of 1792, top 4), random weights"),
}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"preset: unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})")
    return PRESETS[name]
