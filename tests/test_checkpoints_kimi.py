"""Kimi Linear checkpoints (Kimi Delta Attention, multi-head latent attention without RoPE, grouped sigmoid MoE with
shared experts) against transformers, the reference implementation: tiny random configs (MLA with q straight from
x and through its low-rank bottleneck, value heads narrower than the query-key heads and wider) are built with
transformers, saved, loaded with ddsim, and must give the same logits (prefill and step-by-step decode) and the
same greedy continuation, from both the fast path and the oracle; the KDA leak on a tree; refusals; an audit and
the gate from the command line."""
import json

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim.model.checkpoint import SUPPORTED, load_checkpoint, read_config
from tests.checkpoint_checks import (
    DELETE,
    assert_config_refusals,
    assert_decode_matches,
    assert_leaks,
    assert_prefill_matches,
    perturbed,
    with_config,
)
from tests.cli_runs import run_cli

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8,
              num_local_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
              linear_head_dim=8, linear_num_heads=2, routed_scaling_factor=2.446,
              layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _config(arch: str):
    if arch == "kimi_linear":  # v heads narrower than q/k heads (12 vs 8), q straight from x
        return transformers.KimiLinearConfig(**COMMON, q_lora_rank=None, v_head_dim=8)
    if arch == "kimi_linear_qlora":  # q through its low-rank bottleneck, v heads wider (16 vs 12)
        return transformers.KimiLinearConfig(**COMMON, q_lora_rank=6, v_head_dim=16)
    raise AssertionError(arch)


def _hf_model(arch: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch))
    return perturbed(model, ("e_score_correction_bias",))


ARCHS = ["kimi_linear", "kimi_linear_qlora"]


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, max_shard_size="100KB" if request.param == "kimi_linear" else "2GB")  # one sharded
    return request.param, d, model


def test_supported_architectures_listed():
    assert "kimi_linear" in SUPPORTED


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, meta = load_checkpoint(d)
    assert cfg.layer_pattern == "kkak" and meta["model_type"] == "kimi_linear" and cfg.mla_kv_lora_rank == 8
    assert cfg.head_dim == (12 if arch == "kimi_linear" else 16) and cfg.mla_q_lora_rank == (6 if arch != "kimi_linear" else 0)
    assert [cfg.is_moe_layer(i) for i in range(4)] == [False, True, True, True] and cfg.moe_router == "sigmoid"
    assert_prefill_matches(cfg, w, hf)


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_decode_matches(cfg, w, hf)


def test_the_kda_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    _, d, _ = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_leaks(cfg, w, exact_modes=("exact",))


def test_kimi_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "kimi_linear":
        pytest.skip("checked on kimi_linear alone")
    assert_config_refusals(d, tmp_path, (
        ("attention_bias", True, "attention_bias=true is not supported"),
        ("layer_types", ["linear_attention"] * 3, "layer_types (or linear_attn_config) must name 4"),
        ("kv_lora_rank", None, "missing field 'kv_lora_rank'")))
    # the released form of the layer layout: linear_attn_config's 1-indexed KDA and full-attention layers
    released = with_config(d, tmp_path / "released", layer_types=DELETE, linear_attn_config={
        "kda_layers": [1, 2, 4], "full_attn_layers": [3], "head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4})
    assert read_config(released)[0].layer_pattern == "kkak"


def test_audit_command_on_a_kimi_linear_checkpoint(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "kimi_linear":
        pytest.skip("checked on kimi_linear alone")
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    leak = json.loads((out / "report.json").read_text())["budgets"][0]["leak"]["leaky"]
    assert [(f["family"], f["layers"]) for f in leak["by_family"]] == [("kda", 3)]
    assert leak["by_family"][0]["state_rel"]["max"] > 1e-3 and leak["by_family"][0]["conv_rel"]["n"] > 0
    g = run_cli("gate", "--report", out / "report.json", "--policy", "hybrid-unsafe", "--model", d)
    assert g.returncode == 1 and "recheck:" in g.stdout, g.stdout + g.stderr
