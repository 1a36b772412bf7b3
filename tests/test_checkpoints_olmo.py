"""OLMo-Hybrid checkpoints (Gated DeltaNet with negative-eigenvalue beta, OLMo 2's output-normed attention blocks,
q/k norms over all heads) against transformers, the reference implementation: tiny random configs, without
RoPE as released and with it, are built with transformers, saved, loaded with ddsim, and must give the same
logits (prefill and step-by-step decode) and the same greedy continuation, from both the fast path and the
oracle; the GDN leak on a tree; refusals; an audit from the command line."""
import json

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim.model.checkpoint import SUPPORTED, load_checkpoint, read_config
from tests.checkpoint_checks import (
    assert_config_refusals,
    assert_decode_matches,
    assert_leaks,
    assert_prefill_matches,
    perturbed,
    with_config,
)
from tests.cli_runs import run_cli

COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
              max_position_embeddings=256, num_hidden_layers=4,
              layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              pad_token_id=0, eos_token_id=2)


def _config(arch: str):
    if arch == "olmo_hybrid":  # NoPE: rope_theta null (transformers loads rope_parameters null as its default RoPE)
        c = transformers.OlmoHybridConfig(**COMMON)
        c.rope_parameters = {"rope_type": "default", "rope_theta": None}
        return c
    if arch == "olmo_hybrid_rope":
        return transformers.OlmoHybridConfig(**COMMON, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                             linear_allow_neg_eigval=False)
    raise AssertionError(arch)


def _hf_model(arch: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch))
    return perturbed(model)


ARCHS = ["olmo_hybrid", "olmo_hybrid_rope"]


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, max_shard_size="100KB" if request.param == "olmo_hybrid" else "2GB")  # one sharded
    return request.param, d, model


def test_supported_architectures_listed():
    assert "olmo_hybrid" in SUPPORTED


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, meta = load_checkpoint(d)
    assert cfg.layer_pattern == "ggag" and meta["model_type"] == "olmo_hybrid" and cfg.attn_post_norm and cfg.qk_norm_all
    assert cfg.use_rope == (arch == "olmo_hybrid_rope") and cfg.gdn_beta_scale == (1.0 if arch == "olmo_hybrid_rope" else 2.0)
    assert_prefill_matches(cfg, w, hf)


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_decode_matches(cfg, w, hf)


def test_the_gdn_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    _, d, _ = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_leaks(cfg, w, exact_modes=("exact",))


def test_olmo_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "olmo_hybrid":
        pytest.skip("checked on olmo_hybrid alone")
    assert_config_refusals(d, tmp_path, (
        ("attention_bias", True, "attention_bias=true is not supported"),
        ("layer_types", ["linear_attention"] * 3, "3 layer_types for 4 layers"),
        ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
         "rope_parameters.rope_type 'yarn' is not supported (the default RoPE or none)"),
        ("rope_scaling", {"type": "linear", "factor": 2.0},
         "rope_scaling.rope_type 'linear' is not supported (the default RoPE or none)"),
        ("linear_num_key_heads", None, "missing field 'linear_num_key_heads'")))
    # rope_parameters null is transformers' default RoPE when it loads the checkpoint, not NoPE
    cfg, _ = read_config(with_config(d, tmp_path / "null_rope", rope_parameters=None))
    assert cfg.use_rope and cfg.rope_theta == 10000.0
    assert not read_config(d)[0].use_rope


def test_audit_command_on_an_olmo_hybrid_checkpoint(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "olmo_hybrid":
        pytest.skip("checked on olmo_hybrid alone")
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    leak = json.loads((out / "report.json").read_text())["budgets"][0]["leak"]["leaky"]
    assert [(f["family"], f["layers"]) for f in leak["by_family"]] == [("gdn", 3)]
