"""What a config.json leaves out, read as transformers reads it.

transformers saves a config as its difference from the class's defaults (``save_pretrained`` writes ``use_diff``): a
fine-tuned Qwen3-Next keeps ``num_experts`` 512 only by leaving it out, a re-saved Kimi Linear its routed scaling
2.446, a Nemotron-H its relu2 MLP and its dt floor of 0.001. A reader that filled such a gap with a default of its own
ran another model than the checkpoint (a silent eps or scale) or refused a valid one. DEFAULTS holds, for each
``model_type``, the defaults of transformers' config class (5.x) for every field a ddsim reader takes with a default
where that class's default differs from the reader's own; ``tests/test_config_defaults.py`` drops each field of every
test checkpoint's config in turn and holds ddsim's reading to its reading of transformers' own completion of it (or to
a refusal), so a default that drifts from transformers' fails there. The table fills only the gaps the readers filled
before with values of their own (and Nemotron-H's activation, which they refused as silu): a field a reader refuses
when missing (``vocab_size``, ``num_attention_heads``, the layer count and types) is refused still.
"""
from __future__ import annotations

DEFAULTS: dict[str, dict] = {
    "qwen3_next": dict(head_dim=256, intermediate_size=5632, max_position_embeddings=32768, num_experts=512,
                       num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                       partial_rotary_factor=0.25),
    "qwen3_5_text": dict(head_dim=256, intermediate_size=12288, max_position_embeddings=32768, partial_rotary_factor=0.25),
    "qwen3_5_moe_text": dict(head_dim=256, max_position_embeddings=32768, num_experts=256, num_experts_per_tok=8,
                             moe_intermediate_size=512, shared_expert_intermediate_size=512, partial_rotary_factor=0.25),
    "jamba": dict(num_key_value_heads=8),
    "kimi_linear": dict(routed_scaling_factor=2.446, v_head_dim=128),
    "nemotron_h": dict(head_dim=128, intermediate_size=21504, num_key_value_heads=8, time_step_min=0.001,
                       mlp_hidden_act="relu2", n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=7688,
                       moe_shared_expert_intermediate_size=7688),
    "bamba": dict(intermediate_size=14336, max_position_embeddings=262144, num_key_value_heads=8, rms_norm_eps=1e-5),
    "granitemoehybrid": dict(intermediate_size=11008, max_position_embeddings=2048, attention_multiplier=1.0,
                             num_local_experts=8, num_experts_per_tok=2, shared_intermediate_size=1024),
    "falcon_h1": dict(intermediate_size=14336, max_position_embeddings=8192, num_key_value_heads=8, rms_norm_eps=1e-5,
                      mamba_d_ssm=1024),
    "minimax": dict(num_key_value_heads=8),
}


def with_defaults(raw: dict, model_type: str) -> dict:
    """raw with each field it leaves out that DEFAULTS gives for model_type filled in (a field present, null
    included, is kept as written)."""
    return {**DEFAULTS.get(model_type, {}), **raw}
