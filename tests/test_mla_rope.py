"""MLA's decoupled RoPE (DeepSeek-V2/V3's multi-head latent attention; Kimi Linear's MLA has none) against
transformers' own DeepseekV3 attention: an attention-only DeepSeek-V3 model with dense MLPs, built by transformers,
its weights read into ddsim's names, gives the same logits at every position of a prompt in both RoPE layouts
(interleaved pairs, DeepSeek-V3's default, and rotate-half halves), with and without the low-rank q, and ddsim's
float64 oracle agrees. No hybrid transformers ships uses MLA with RoPE, so no checkpoint reader takes one."""
import dataclasses
import math

import pytest
import torch
import transformers

from ddsim import oracle
from ddsim.model.config import ModelConfig
from ddsim.model.model import HybridModel
from ddsim.model.weights import weight_shapes
from ddsim.trees.tree import Tree

NOPE, ROPE, V, KVL = 8, 4, 12, 16


def _deepseek(interleave: bool, q_lora: int):
    cfg = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=48, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, first_k_dense_replace=2, n_routed_experts=4, n_group=1,
        topk_group=1, num_experts_per_tok=2, kv_lora_rank=KVL, q_lora_rank=q_lora or None, qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE, v_head_dim=V, rope_interleave=interleave, rms_norm_eps=1e-6, max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval().double()
    with torch.no_grad():  # weights of a size that lets RoPE's rotation move the logits well past rounding
        for n, t in model.named_parameters():
            t.copy_(torch.randn_like(t) * (1.0 if n.endswith("norm.weight") or "layernorm" in n else 0.3))
    return cfg, model


def _ddsim(cfg, model, interleave: bool, q_lora: int):
    sd = model.state_dict()  # float64
    w = {"embed": sd["model.embed_tokens.weight"], "final_norm": sd["model.norm.weight"], "lm_head": sd["lm_head.weight"]}
    names = {"input_layernorm": "input_norm", "post_attention_layernorm": "post_norm", "mlp.gate_proj": "mlp.gate",
             "mlp.up_proj": "mlp.up", "mlp.down_proj": "mlp.down", "self_attn.q_proj": "attn.q", "self_attn.q_a_proj": "attn.q_a",
             "self_attn.q_a_layernorm": "attn.q_a_norm", "self_attn.q_b_proj": "attn.q_b",
             "self_attn.kv_a_proj_with_mqa": "attn.kv_a", "self_attn.kv_a_layernorm": "attn.kv_a_norm",
             "self_attn.kv_b_proj": "attn.kv_b", "self_attn.o_proj": "attn.o"}
    for i in range(cfg.num_hidden_layers):
        for theirs, ours in names.items():
            if f"model.layers.{i}.{theirs}.weight" in sd:
                w[f"layers.{i}.{ours}"] = sd[f"model.layers.{i}.{theirs}.weight"]
    ours = ModelConfig(
        name="deepseek-mla-test", vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, layer_pattern="aa",
        intermediate_size=cfg.intermediate_size, num_attention_heads=4, num_key_value_heads=4, head_dim=max(NOPE + ROPE, V),
        linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=4, linear_value_head_dim=4,
        max_position_embeddings=128, rms_norm_eps=1e-6, mla_norm_eps=1e-6, norm_offset=0.0, rope_theta=500.0,
        use_rope=True, mla_rope_interleave=interleave, mla_kv_lora_rank=KVL, mla_q_lora_rank=q_lora,
        mla_qk_nope_head_dim=NOPE, mla_qk_rope_head_dim=ROPE, mla_v_head_dim=V, attention_scale=(NOPE + ROPE) ** -0.5)
    assert set(w) == set(weight_shapes(ours))
    return ours, w


@pytest.mark.parametrize("interleave, q_lora", [(True, 16), (False, 0), (True, 0)])
def test_mla_decoupled_rope_equals_transformers_deepseek_v3(interleave, q_lora):
    cfg, model = _deepseek(interleave, q_lora)
    ours, w = _ddsim(cfg, model, interleave, q_lora)
    prompt = [3, 17, 5, 29, 11, 2, 40, 7, 33, 8, 21, 60]
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0]  # [T, vocab] float64
    _, got = HybridModel(ours, {k: v.float() for k, v in w.items()}).prefill(prompt)  # float32 fast path
    _, ref = oracle.prefill(w, ours, prompt)  # float64 oracle
    scale = want.abs().max().item()
    # transformers computes RoPE's angles in float32: 1e-7 of the logits' scale apart from float64 angles
    assert (ref - want).abs().max().item() < 1e-6 * scale
    assert (got.double() - want).abs().max().item() < 1e-5 * scale
    # the rotation matters: the same weights read with the other layout (or none) give other logits
    for other in ({"mla_rope_interleave": not interleave, "use_rope": True}, {"mla_rope_interleave": False, "use_rope": False}):
        _, moved = oracle.prefill(w, dataclasses.replace(ours, **other), prompt)
        assert (moved - want).abs().max().item() > 1e-3 * scale
    assert math.isfinite(scale) and scale > 0.1


@pytest.mark.parametrize("interleave", [True, False])
def test_mla_rope_on_a_tree_equals_the_oracle_node_by_node(interleave):
    """On a branching tree after a prompt, every node's keys are rotated to its own depth's position: the float32
    fast path's verify (each mode) equals the float64 oracle node by node."""
    cfg, model = _deepseek(interleave, 16)
    ours, w = _ddsim(cfg, model, interleave, 16)
    fast = HybridModel(ours, {k: v.float() for k, v in w.items()})
    tree = Tree(parents=[-1, 0, 0, 1, 1, 2, 4], tokens=[7, 3, 9, 12, 5, 44, 18])
    state, _ = fast.prefill([3, 17, 5, 29, 11])
    st64, _ = oracle.prefill(w, ours, [3, 17, 5, 29, 11])
    ref = oracle.verify_tree(w, ours, st64, tree.parents, tree.tokens)
    scale = ref.logits.abs().max().item()
    for mode in ("exact", "leaky"):  # no recurrent layer: every mode is the same computation
        res = fast.verify(state, tree, mode=mode)
        assert (res.logits.double() - ref.logits).abs().max().item() < 1e-5 * scale
