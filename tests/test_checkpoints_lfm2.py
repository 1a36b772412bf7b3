"""LFM2 checkpoints (gated short convs) against transformers, the reference implementation: tiny random
configs of lfm2 (the auto-adjusted feed-forward width, tied embeddings) and lfm2_moe (dense first layers,
sigmoid-routed experts with the expert bias, an untied head) are built with transformers, saved, loaded with
ddsim, and must give the same logits (prefill and step-by-step decode) and the same greedy continuation, from
both the fast path and the oracle; what ddsim does not run is refused in one line; an audit runs on one of
them from the command line."""
import json

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim.model.checkpoint import SUPPORTED, load_checkpoint
from tests.checkpoint_checks import (
    assert_config_refusals,
    assert_decode_matches,
    assert_leaks,
    assert_prefill_matches,
    assert_unknown_tensor_refused,
    perturbed,
)
from tests.cli_runs import run_cli

COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              num_hidden_layers=5, layer_types=["conv", "conv", "full_attention", "conv", "conv"], conv_L_cache=3)


def _config(arch: str):
    if arch == "lfm2":  # intermediate 100 -> int(2 * 100 / 3) = 66 -> rounded up to 80 (multiple of 16)
        return transformers.Lfm2Config(**COMMON, intermediate_size=100, block_multiple_of=16)
    if arch == "lfm2_moe":
        return transformers.Lfm2MoeConfig(**COMMON, intermediate_size=40, moe_intermediate_size=16, num_experts=6,
                                          num_experts_per_tok=2, num_dense_layers=2, tie_word_embeddings=False,
                                          routed_scaling_factor=1.5)
    raise AssertionError(arch)


def _hf_model(arch: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch))
    return perturbed(model, ("expert_bias",))


ARCHS = ["lfm2", "lfm2_moe"]


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, max_shard_size="100KB" if request.param == "lfm2" else "2GB")  # one sharded
    return request.param, d, model


def test_supported_architectures_listed():
    assert {"lfm2", "lfm2_moe"} <= set(SUPPORTED)


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, meta = load_checkpoint(d)
    assert cfg.layer_pattern == "ccacc" and meta["model_type"] == arch and cfg.conv_kernel_size == 3
    if arch == "lfm2":
        assert cfg.intermediate_size == 80 and cfg.tie_word_embeddings and cfg.num_experts == 0
    else:
        assert [cfg.is_moe_layer(i) for i in range(5)] == [False, False, True, True, True]
        assert cfg.moe_router == "sigmoid" and cfg.num_experts == 6 and not cfg.tie_word_embeddings
        assert not torch.equal(w["lm_head"], w["embed"])
    assert_prefill_matches(cfg, w, hf)


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_decode_matches(cfg, w, hf)


def test_the_short_conv_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    """On the loaded checkpoint: siblings verified in batch order inherit each other's conv window (leaky
    differs from the oracle off the order-exact nodes), exact verification equals it everywhere, and the
    short conv keeps no state beside its window (leaky-state is exact)."""
    _, d, _ = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_leaks(cfg, w, exact_modes=("exact", "leaky-state"))


def test_lfm2_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "lfm2_moe":
        pytest.skip("checked on lfm2_moe alone")
    assert_config_refusals(d, tmp_path, (
        ("conv_bias", True, "conv_bias=true is not supported"),
        ("use_expert_bias", False, "use_expert_bias=false is not supported"),
        ("layer_types", ["conv", "mamba", "full_attention", "conv", "conv"],
         "unknown layer type 'mamba'"),
        ("num_attention_heads", None, "missing field 'num_attention_heads'"),
        ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0},
         "rope_parameters.rope_type 'yarn' is not supported (the default RoPE only)")))
    assert_unknown_tensor_refused(d, tmp_path, "model.layers.0.conv.mystery", "conv.mystery.*refused rather than ignored")


def test_audit_command_on_an_lfm2_moe_checkpoint(tmp_path, checkpoint):
    """The whole audit from the command line on the LFM2-MoE checkpoint: the leak table has the conv family
    (its windows' error, no state error), and the gate says exact_state_rel_max does not apply."""
    arch, d, _ = checkpoint
    if arch != "lfm2_moe":
        pytest.skip("checked on lfm2_moe alone")
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads((out / "report.json").read_text())
    leak = rep["budgets"][0]["leak"]["leaky"]
    assert [f["family"] for f in leak["by_family"]] == ["conv"] and leak["by_family"][0]["layers"] == 4
    assert leak["by_family"][0]["state_rel"] is None and leak["by_family"][0]["conv_rel"]["n"] > 0
    assert [row["kind"] for row in leak["by_layer"]] == list("ccacc")
    g = run_cli("gate", "--report", out / "report.json", "--policy", "hybrid-unsafe", "--model", d)
    assert g.returncode == 1, g.stdout + g.stderr
    assert ("not applicable: exact_state_rel_max: the model's recurrent layers keep no state beside their conv windows"
            in g.stdout), g.stdout
    assert [ln.split(":")[0] for ln in g.stdout.splitlines() if ln.startswith("VIOLATED")] == [
        "VIOLATED leak_nodes_per_budget"]  # four steps exercise too few leak nodes to judge: it fails closed
