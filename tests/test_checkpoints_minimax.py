"""MiniMax checkpoints (lightning attention, softmax attention, MoE, the scaled normed-residual blocks) against
transformers, the reference implementation: tiny random configs (every alpha and beta factor at 1, and away from
1) are built with transformers, saved, loaded with ddsim, and must give the same logits (prefill and step-by-step
decode) and the same greedy continuation, from both the fast path and the oracle; the lightning state leaks on a
tree (and only the state: there is no conv); refusals; an audit and the gate from the command line."""
import json

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim.model.checkpoint import SUPPORTED, load_checkpoint
from tests.checkpoint_checks import assert_config_refusals, assert_decode_matches, assert_leaks, assert_prefill_matches, perturbed
from tests.cli_runs import run_cli

COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=16,
              num_hidden_layers=4, layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
              num_local_experts=4, num_experts_per_tok=2, block_size=4, max_position_embeddings=256)


def _config(arch: str):
    if arch == "minimax":
        return transformers.MiniMaxConfig(**COMMON)
    if arch == "minimax_scaled":  # MiniMax-Text-01's kind of factors: residual weighted more than the mixer
        return transformers.MiniMaxConfig(**COMMON, full_attn_alpha_factor=3.5, full_attn_beta_factor=0.8,
                                          linear_attn_alpha_factor=3.5, linear_attn_beta_factor=0.8,
                                          mlp_alpha_factor=3.5, mlp_beta_factor=0.8)
    raise AssertionError(arch)


def _hf_model(arch: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch))
    return perturbed(model)


ARCHS = ["minimax", "minimax_scaled"]


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, max_shard_size="100KB" if request.param == "minimax" else "2GB")  # one sharded
    return request.param, d, model


def test_supported_architectures_listed():
    assert "minimax" in SUPPORTED


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, meta = load_checkpoint(d)
    assert cfg.layer_pattern == "llal" and meta["model_type"] == "minimax" and cfg.residual_from_norm
    assert cfg.attn_alpha == (3.5 if arch == "minimax_scaled" else 1.0)
    slope = hf.model.layers[0].self_attn.slope_rate.reshape(-1)
    assert torch.equal(w["layers.0.lightning.slope"], slope) and not torch.equal(w["layers.3.lightning.slope"], slope)
    assert_prefill_matches(cfg, w, hf)


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_decode_matches(cfg, w, hf)


def test_the_lightning_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    """leaky and leaky-state differ from the oracle off the order-exact nodes; exact and leaky-conv (there is no
    conv) equal it everywhere; the serving verify's replayed commit gives the per-node path's state."""
    _, d, _ = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_leaks(cfg, w, exact_modes=("exact", "leaky-conv"))


def test_minimax_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "minimax":
        pytest.skip("checked on minimax alone")
    assert_config_refusals(d, tmp_path, (
        ("sliding_window", 64, "sliding_window=64 is not supported"),
        ("layer_types", ["linear_attention", "mamba", "full_attention", "linear_attention"],
         "unknown layer type 'mamba'"),
        ("num_attention_heads", None, "missing field 'num_attention_heads'"),
        ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0},
         "rope_parameters.rope_type 'yarn' is not supported (the default RoPE only)")))


def test_audit_command_on_a_minimax_checkpoint(tmp_path, checkpoint):
    """The audit from the command line: the lightning family carries a state error and no window error."""
    arch, d, _ = checkpoint
    if arch != "minimax":
        pytest.skip("checked on minimax alone")
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    leak = json.loads((out / "report.json").read_text())["budgets"][0]["leak"]["leaky"]
    assert [(f["family"], f["layers"]) for f in leak["by_family"]] == [("lightning", 3)]
    assert leak["by_family"][0]["conv_rel"] is None and leak["by_family"][0]["state_rel"]["max"] > 1e-3
    assert [(row.get("state_rel") is not None, row.get("conv_rel") is not None) for row in leak["by_layer"]] == \
        [(True, False), (True, False), (False, False), (True, False)]
    g = run_cli("gate", "--report", out / "report.json", "--policy", "hybrid-unsafe", "--model", d)
    assert g.returncode == 1 and "recheck:" in g.stdout, g.stdout + g.stderr
