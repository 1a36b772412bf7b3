"""Jamba checkpoints (Mamba1 + attention + MoE) against transformers, the reference implementation: tiny
random configs (dense, and with routed experts on every other layer) are built with transformers, saved,
loaded with ddsim, and must give the same logits (prefill and step-by-step decode) and the same greedy
continuation, from both the fast path and the oracle; the Mamba1 state leaks on a tree; what ddsim does not
run is refused in one line; an audit runs on one of them from the command line."""
import json

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim.model.checkpoint import SUPPORTED, load_checkpoint
from ddsim.model.model import HybridModel
from tests.checkpoint_checks import (
    assert_config_refusals,
    assert_decode_matches,
    assert_leaks,
    assert_prefill_matches,
    assert_unknown_tensor_refused,
    perturbed,
)
from tests.cli_runs import run_cli

COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
              max_position_embeddings=256, num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=2,
              mamba_d_state=6, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=5, use_mamba_kernels=False)


def _config(arch: str):
    if arch == "jamba":
        return transformers.JambaConfig(**COMMON, num_experts=1)
    if arch == "jamba_moe":  # experts on layers 1 and 3 (one of them attention's neighbour, one a Mamba1 layer's)
        return transformers.JambaConfig(**COMMON, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                                        expert_layer_offset=1)
    raise AssertionError(arch)


def _hf_model(arch: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch))
    return perturbed(model)


ARCHS = ["jamba", "jamba_moe"]


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, max_shard_size="100KB" if request.param == "jamba" else "2GB")  # one sharded
    return request.param, d, model


def test_supported_architectures_listed():
    assert "jamba" in SUPPORTED
    help_text = " ".join(run_cli("audit", "--help").stdout.split())
    assert all(a in help_text for a in SUPPORTED if not a.endswith("_text")), help_text  # --model names each


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, meta = load_checkpoint(d)
    assert cfg.layer_pattern == "ssas" and meta["model_type"] == "jamba" and not cfg.use_rope
    assert (cfg.mamba1_inner, cfg.mamba1_dt_rank, cfg.mamba_state_size) == (64, 5, 6)
    assert [cfg.is_moe_layer(i) for i in range(4)] == ([False, True, False, True] if arch == "jamba_moe" else [False] * 4)
    assert_prefill_matches(cfg, w, hf)


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_decode_matches(cfg, w, hf)


def test_the_mamba1_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    """On the loaded checkpoint: leaky verification (and leaky-state alone, and leaky-conv alone) differs
    from the oracle off the order-exact nodes, exact verification equals it everywhere, and the serving
    verify's replayed commit gives the per-node path's state."""
    _, d, _ = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_leaks(cfg, w, exact_modes=("exact",))


def test_jamba_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "jamba_moe":
        pytest.skip("checked on jamba_moe alone")
    assert_config_refusals(d, tmp_path, (
        ("mamba_proj_bias", True, "mamba_proj_bias=true is not supported"),
        ("hidden_act", "gelu", "hidden_act 'gelu' is not supported"),
        ("hidden_size", None, "missing field 'hidden_size'")))
    assert_unknown_tensor_refused(d, tmp_path, "model.layers.0.mamba.mystery", "mamba.mystery.*refused rather than ignored")


def test_audit_command_on_a_jamba_checkpoint(tmp_path, checkpoint):
    """The whole audit from the command line on the MoE checkpoint: the leak table's mamba1 family carries a
    state and a window error."""
    arch, d, _ = checkpoint
    if arch != "jamba_moe":
        pytest.skip("checked on jamba_moe alone")
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    leak = json.loads((out / "report.json").read_text())["budgets"][0]["leak"]["leaky"]
    assert [(f["family"], f["layers"]) for f in leak["by_family"]] == [("mamba1", 3)]
    assert leak["by_family"][0]["state_rel"]["n"] > 0 and leak["by_family"][0]["state_rel"]["max"] > 1e-3
    assert [row["kind"] for row in leak["by_layer"]] == list("ssas")


def test_every_recurrent_family_may_be_captured_in_cuda_graphs():
    """Mamba1, lightning and KDA layers run Triton kernels that read the tree from device tables: nothing about the
    family keeps a dense model from CUDA graphs (properties/test_cuda_graphs.py replays them on a GPU); on the CPU the
    device is the one reason given, and the fixed buffers without capture take the model."""
    from ddsim.model.config import get_preset
    from ddsim.model.graphs import not_capturable
    from ddsim.model.weights import init_weights
    for kind in ("s", "l", "k"):
        cfg = get_preset("micro").replace(layer_pattern="a" + kind, linear_num_value_heads=1, linear_value_head_dim=8,
                                           mamba1_inner=8, mamba_state_size=4)
        model = HybridModel(cfg, init_weights(cfg))
        assert not_capturable(model) == "the model is on cpu, not a CUDA device", not_capturable(model)
        assert not_capturable(model, capture=False) is None
    assert "not a CUDA device" in not_capturable(HybridModel(get_preset("micro"), init_weights(get_preset("micro"))))
