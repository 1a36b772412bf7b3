"""Mamba2-hybrid checkpoints against transformers, the reference implementation: tiny random configs
of nemotron_h, bamba, granitemoehybrid (dense and with routed experts) and falcon_h1 are built with transformers (non-trivial
multipliers, grouped B/C, every gated-norm form), saved, loaded with ddsim, and must give the same
logits (prefill and step-by-step decode) and the same greedy continuation, from both the fast path
and the oracle; an audit runs on one of them from the command line."""
import json

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim.model.checkpoint import SUPPORTED, load_checkpoint, read_config
from tests.checkpoint_checks import (
    DELETE,
    assert_config_read_alike,
    assert_config_refusals,
    assert_decode_matches,
    assert_prefill_matches,
    assert_unknown_tensor_refused,
    perturbed,
    with_config,
)

COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
              max_position_embeddings=256)
MAMBA = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=6, mamba_n_groups=2, mamba_expand=2, mamba_chunk_size=8)


def _config(arch: str):
    from transformers import BambaConfig, FalconH1Config, GraniteMoeHybridConfig, NemotronHConfig
    if arch == "nemotron_h":  # M Mamba2, - relu^2 MLP, * attention (no RoPE); one mixer per block
        return NemotronHConfig(**COMMON, head_dim=8, hybrid_override_pattern="M-M*-M", num_hidden_layers=6,
                               mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=6, n_groups=2, conv_kernel=4,
                               chunk_size=8)
    if arch == "nemotron_h_moe":  # Nemotron 3 Nano's kind: E blocks of relu^2 experts, grouped sigmoid router
        return NemotronHConfig(**COMMON, head_dim=8, hybrid_override_pattern="ME*-E", num_hidden_layers=5,
                               mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=6, n_groups=2, conv_kernel=4,
                               chunk_size=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                               moe_shared_expert_intermediate_size=24, n_group=2, topk_group=1,
                               routed_scaling_factor=2.5)
    if arch == "bamba":
        return BambaConfig(**COMMON, **MAMBA, num_hidden_layers=4, attn_layer_indices=[2])
    if arch == "granitemoehybrid":
        return GraniteMoeHybridConfig(**COMMON, **MAMBA, num_hidden_layers=4,
                                      layer_types=["mamba", "mamba", "attention", "mamba"], num_local_experts=0,
                                      shared_intermediate_size=48, embedding_multiplier=3.0, residual_multiplier=0.5,
                                      attention_multiplier=0.2, logits_scaling=2.0, position_embedding_type="rope")
    if arch == "granitemoehybrid_moe":  # Granite-4.0-H-Tiny's kind: routed experts plus the shared MLP
        return GraniteMoeHybridConfig(**{**COMMON, "intermediate_size": 16}, **MAMBA, num_hidden_layers=3,
                                      layer_types=["mamba", "attention", "mamba"], num_local_experts=4,
                                      num_experts_per_tok=2, shared_intermediate_size=24, embedding_multiplier=2.0,
                                      residual_multiplier=0.7, logits_scaling=1.5)
    if arch == "falcon_h1":  # attention and Mamba2 in parallel; every multiplier away from 1
        return FalconH1Config(**COMMON, **{k: v for k, v in MAMBA.items() if k != "mamba_expand"}, mamba_d_ssm=64,
                              num_hidden_layers=3, head_dim=8, mamba_rms_norm=True, mamba_norm_before_gate=False,
                              embedding_multiplier=1.5, lm_head_multiplier=0.7, mlp_multipliers=[0.8, 1.3],
                              key_multiplier=0.6, attention_in_multiplier=1.2, attention_out_multiplier=0.9,
                              ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3], ssm_in_multiplier=0.7, ssm_out_multiplier=1.4)
    if arch == "falcon_h1_gate":  # Falcon-H1's default: no Mamba2 norm, y * silu(z)
        return FalconH1Config(**COMMON, **{k: v for k, v in MAMBA.items() if k != "mamba_expand"}, mamba_d_ssm=64,
                              num_hidden_layers=2, head_dim=8)
    raise AssertionError(arch)


def _hf_model(arch: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch))
    return perturbed(model, ("e_score_correction_bias",), matrices=0.02)  # norms, D, dt_bias, conv and router bias


ARCHS = ["nemotron_h", "nemotron_h_moe", "bamba", "granitemoehybrid", "granitemoehybrid_moe", "falcon_h1",
         "falcon_h1_gate"]
PATTERNS = {"nemotron_h": "mfmafm", "nemotron_h_moe": "mfaff", "bamba": "mmam", "granitemoehybrid": "mmam",
            "granitemoehybrid_moe": "mam", "falcon_h1": "ppp", "falcon_h1_gate": "pp"}
EXPERTS = {"nemotron_h_moe": 8, "granitemoehybrid_moe": 4}


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, max_shard_size="100KB" if request.param == "bamba" else "2GB")  # one sharded
    return request.param, d, model


# transformers before 5.23 normalizes Bamba's and GraniteMoeHybrid's gated RMSNorm over the whole inner width at
# once; mamba_ssm's RMSNormGated, the serving engines and ddsim normalize each of its n_groups groups (5.23 does too).
# With n_groups = 2 (MAMBA) the two differ, so an older reference fails here by name rather than by a logit bound.
GROUPED_NORM = ("bamba", "granitemoehybrid", "granitemoehybrid_moe")


def assert_reference_norms_each_group(arch: str, hf) -> None:
    if arch not in GROUPED_NORM:
        return
    norms = [m for m in hf.modules() if type(m).__name__.endswith("RMSNormGated")]
    assert norms, f"transformers {transformers.__version__}'s {arch} has no module named *RMSNormGated to check"
    inner = MAMBA["mamba_n_heads"] * MAMBA["mamba_d_head"]
    assert all(getattr(m, "group_size", None) == inner // MAMBA["mamba_n_groups"] for m in norms), (
        f"transformers {transformers.__version__} normalizes {arch}'s gated RMSNorm over its whole inner width, not "
        f"over each of its {MAMBA['mamba_n_groups']} groups as mamba_ssm and ddsim do (so does every transformers "
        f"before 5.23): the reference needs transformers>=5.23, pyproject's test extra")


def test_supported_architectures_listed():
    assert {"nemotron_h", "bamba", "granitemoehybrid", "falcon_h1"} <= set(SUPPORTED)


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    assert_reference_norms_each_group(arch, hf)
    cfg, w, meta = load_checkpoint(d)
    assert cfg.layer_pattern == PATTERNS[arch] and meta["model_type"] == arch.removesuffix("_gate").removesuffix("_moe")
    assert cfg.num_experts == EXPERTS.get(arch, 0) and cfg.shared_expert_gate == (arch not in EXPERTS)
    if arch == "nemotron_h_moe":  # the '-' block stays a dense relu^2 MLP, the E blocks are MoE
        assert [cfg.is_moe_layer(i) for i in (1, 3, 4)] == [True, False, True] and cfg.moe_router == "sigmoid"
    assert_prefill_matches(cfg, w, hf)


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    assert_reference_norms_each_group(arch, hf)
    cfg, w, _ = load_checkpoint(d)
    assert_decode_matches(cfg, w, hf)


def test_mamba_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "granitemoehybrid":
        pytest.skip("checked on granitemoehybrid alone")
    assert_config_refusals(d, tmp_path, (
        ("mamba_n_heads", None, "missing field 'mamba_n_heads'"),
        ("mamba_proj_bias", True, "mamba_proj_bias=true is not supported"),
        ("layer_types", ["mamba", "moe", "attention", "mamba"], "routed-expert blocks"),
        ("mamba_d_head", 7, "mamba_n_heads * mamba_d_head = 28"),
        ("rope_scaling", {"rope_type": "yarn", "factor": 2.0},
         "rope_scaling.rope_type 'yarn' is not supported (the default RoPE only)"),
        ("rope_parameters", [10000.0], "rope_parameters must be an object or null, got [10000.0]")))
    assert_unknown_tensor_refused(d, tmp_path, "model.layers.0.mamba.mystery", "mamba.mystery.*refused rather than ignored")


@pytest.mark.parametrize("rope", [
    {"rope_parameters": {"rope_type": "default", "rope_theta": 5e4}},  # no fraction named
    {"rope_parameters": DELETE, "rope_theta": 5e4},  # the older form
    {"rope_parameters": {"rope_type": "default", "rope_theta": 5e4, "partial_rotary_factor": 0.25}},
])
def test_bambas_rope_is_read_as_transformers_reads_it(tmp_path, checkpoint, rope):
    """Bamba's RoPE base and the fraction of each head it turns, as transformers reads them: where rope_parameters
    named no fraction ddsim turned the whole head, and transformers half."""
    arch, d, _ = checkpoint
    if arch != "bamba":
        pytest.skip("checked on bamba alone")
    edited = with_config(d, tmp_path / "edited", **rope)
    want = transformers.AutoConfig.from_pretrained(edited).rope_parameters
    got = read_config(edited)[0]
    assert (got.rope_theta, got.partial_rotary_factor) == (want["rope_theta"], want["partial_rotary_factor"])
    named = rope["rope_parameters"] if isinstance(rope["rope_parameters"], dict) else {}
    assert got.partial_rotary_factor == named.get("partial_rotary_factor", 0.5)


def test_falcon_h1_refuses_a_fraction_of_the_head_its_attention_would_not_turn(tmp_path, checkpoint):
    """Falcon-H1's attention (and Granite's) turns the whole head whatever partial_rotary_factor says: a fraction
    other than 1, in rope_parameters or beside the other fields, is refused rather than run one way or the other."""
    arch, d, _ = checkpoint
    if arch != "falcon_h1":
        pytest.skip("checked on falcon_h1 alone")
    assert_config_refusals(d, tmp_path, (
        ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
         "a partial_rotary_factor other than 1 is not supported for falcon_h1"),
        ("partial_rotary_factor", 0.5, "a partial_rotary_factor other than 1 is not supported for falcon_h1")))
    assert_config_read_alike(d, tmp_path, "partial_rotary_factor", 1.0)


def test_a_model_without_rope_reads_past_a_rope_scaling_but_not_a_malformed_one(tmp_path, checkpoint):
    """Nemotron-H has no positional encoding: a RoPE scaling in its config names nothing it runs and is read past,
    where a model with RoPE refuses it (above); a RoPE table that is not one is refused all the same."""
    arch, d, _ = checkpoint
    if arch != "nemotron_h":
        pytest.skip("checked on nemotron_h alone")
    assert_config_read_alike(d, tmp_path, "rope_scaling", {"rope_type": "yarn", "factor": 2.0})
    assert_config_refusals(d, tmp_path, (("rope_parameters", "yarn", 'rope_parameters must be an object or null, got "yarn"'),))


def test_audit_command_on_a_nemotron_h_checkpoint(tmp_path_factory, tmp_path):
    """The audit, report and gate unchanged in use on a Mamba2 hybrid: exact verification stays
    lossless, the leak tables carry a mamba2 family row, and the per-layer rows name the kinds."""
    from tests.cli_runs import run_cli
    model = _hf_model("nemotron_h")
    ck = tmp_path / "nemotron"
    model.save_pretrained(ck)
    out = tmp_path / "out"
    r = run_cli("audit", "--model", ck, "--prompts", _prompts(tmp_path), "--budget", "16", "--steps", "3",
                "--out", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["model"]["config"]["architecture"] == "nemotron_h"
    assert rep["model"]["config"]["layer_pattern"] == "mfmafm"
    for b in rep["budgets"]:
        assert b["modes"]["exact"]["generations_leaving_greedy"] == 0
        leak = b["leak"]["leaky"]
        assert [f["family"] for f in leak["by_family"]] == ["mamba2"] and leak["by_family"][0]["layers"] == 3
        assert [row["kind"] for row in leak["by_layer"]] == list("mfmafm")
        assert leak["by_family"][0]["state_rel"]["n"] == 3 * leak["not_order_exact_nodes"]
        assert leak["by_family"][0]["state_rel"]["max"] > 1e-3  # siblings inherit each other's state
    html = (out / "report.html").read_text()
    assert "mamba2" in html
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json", "--model", ck)
    assert g.returncode in (0, 1), g.stdout + g.stderr


def _prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"tokens": [1, 2, 3, 4]}\n{"tokens": [9, 8, 7]}\n')
    return p
