"""Zamba2 checkpoints (Mamba2 layers and hybrid layers running shared transformer blocks on [h, embeddings])
against transformers, the reference implementation: tiny random configs (two shared blocks with attention adapters
and RoPE, one saved in shards; one block without them) are built with transformers, saved, loaded with ddsim, and
must give the same logits (prefill and step-by-step decode) and the same greedy continuation, from both the fast
path and the oracle; the Mamba2 state leaks on a tree; what ddsim does not run is refused in one line; an audit runs
on one of them from the command line."""
import json

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim.errors import InputError
from ddsim.model.checkpoint import SUPPORTED, load_checkpoint
from tests.checkpoint_checks import (
    assert_config_read_alike,
    assert_config_refusals,
    assert_decode_matches,
    assert_leaks,
    assert_prefill_matches,
    assert_unknown_tensor_refused,
    perturbed,
)
from tests.cli_runs import run_cli

TYPES = ["mamba", "hybrid", "mamba", "hybrid", "hybrid"]  # hybrid layers 1, 3, 4 run blocks 0, 1, 0 (two blocks)
COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=48,
              max_position_embeddings=256, num_hidden_layers=5, layers_block_type=TYPES, mamba_d_state=8,
              mamba_d_conv=4, mamba_expand=2, n_mamba_heads=4, mamba_ngroups=2, adapter_rank=4, chunk_size=8)


def _config(arch: str):
    if arch == "zamba2":  # two shared blocks, attention adapters, RoPE
        return transformers.Zamba2Config(**COMMON, num_mem_blocks=2, use_shared_attention_adapter=True,
                                         use_mem_rope=True)
    if arch == "zamba2_plain":  # one block, MLP adapters only, no positional encoding
        return transformers.Zamba2Config(**COMMON, num_mem_blocks=1)
    raise AssertionError(arch)


def _hf_model(arch: str):
    """The model with perturbed weights, long Mamba2 memories (A ~ -0.1, dt ~ 0.13: a decay of about 0.99 per token,
    where transformers' initialisation forgets within a few tokens) and a small skip D, so that a state leak shows in
    the logits."""
    torch.manual_seed(0)
    model = perturbed(transformers.AutoModelForCausalLM.from_config(_config(arch)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mamba.A_log"):
                p.copy_(torch.log(torch.full_like(p, 0.1)) + 0.3 * torch.randn_like(p))
            elif name.endswith("mamba.dt_bias"):
                p.copy_(-2.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("mamba.D"):  # the skip small beside the state's read-out
                p.copy_(0.1 * torch.randn_like(p))
    return model


ARCHS = ["zamba2", "zamba2_plain"]


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, max_shard_size="100KB" if request.param == "zamba2" else "2GB")  # one sharded
    return request.param, d, model


def test_supported_architectures_listed():
    assert "zamba2" in SUPPORTED
    help_text = " ".join(run_cli("audit", "--help").stdout.split())
    assert all(a in help_text for a in SUPPORTED if not a.endswith("_text")), help_text  # --model names each


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, meta = load_checkpoint(d)
    assert cfg.layer_pattern == "mzmzz" and meta["model_type"] == "zamba2"
    assert (cfg.head_dim, cfg.mamba_head_dim, cfg.mamba_n_groups, cfg.use_rope) == (16, 16, 2, arch == "zamba2")
    assert cfg.attention_scale == 8 ** -0.5 and cfg.mlp_act == "geglu" and cfg.mamba_dt_limit[0] == 0.001
    assert w["layers.1.attn.q"].shape == (64, 64) and w["layers.1.input_norm"].shape == (64,)
    if arch == "zamba2":  # layers 1 and 4 run block 0, each with its own adapters folded in
        assert not torch.equal(w["layers.1.attn.q"], w["layers.4.attn.q"])
        assert torch.equal(w["layers.1.attn.o"], w["layers.4.attn.o"])
        assert not torch.equal(w["layers.1.attn.o"], w["layers.3.attn.o"])
    assert_prefill_matches(cfg, w, hf)


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    _, d, hf = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_decode_matches(cfg, w, hf)


def test_the_mamba2_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    """On the loaded checkpoint: leaky verification (and leaky-state alone, and leaky-conv alone) differs from the
    oracle off the order-exact nodes, exact verification equals it everywhere, and the serving verify's replayed
    commit gives the per-node path's state."""
    _, d, _ = checkpoint
    cfg, w, _ = load_checkpoint(d)
    assert_leaks(cfg, w, exact_modes=("exact",))


def test_zamba2_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "zamba2":
        pytest.skip("checked on zamba2 alone")
    assert_config_refusals(d, tmp_path, (
        ("add_bias_linear", True, "add_bias_linear=true is not supported"),
        ("hidden_act", "silu", "hidden_act 'silu' is not supported"),
        ("use_long_context", True, "use_long_context=true"),
        ("rms_norm_eps", 1e-6, "rms_norm_eps=1e-06 is not supported"),
        ("num_key_value_heads", 2, "attention adapters with num_key_value_heads=2"),
        ("layers_block_type", ["mamba", "hybrid", "mamba", "shared"], "lists 4 layers for 5"),
        ("hidden_size", None, "missing field 'hidden_size'"),
        ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
         "rope_parameters.rope_type 'dynamic' is not supported (the default RoPE only)")))
    assert_unknown_tensor_refused(d, tmp_path, "model.layers.0.mamba.mystery", "mamba.mystery.*refused rather than ignored")
    assert_unknown_tensor_refused(d, tmp_path / "2", "model.layers.1.shared_transformer.self_attn.mystery",
                                  "shared_transformer.self_attn.mystery.*refused rather than ignored")


def test_without_use_mem_rope_a_rope_scaling_is_read_past(tmp_path, checkpoint):
    """Without use_mem_rope the shared block has no positional encoding: a RoPE scaling names nothing it runs and
    is read past (with it, refused: above)."""
    arch, d, _ = checkpoint
    if arch != "zamba2_plain":
        pytest.skip("checked on zamba2_plain alone")
    assert_config_read_alike(d, tmp_path, "rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})


def test_a_shared_block_missing_or_with_an_adapter_nobody_runs_is_refused(tmp_path, checkpoint):
    """Block 1 (stored under layer 3) taken out: refused, naming the layer that needs it; an adapter for a hybrid
    layer the block does not serve: refused rather than ignored."""
    from safetensors.torch import load_file, save_file
    arch, d, _ = checkpoint
    if arch != "zamba2_plain":
        pytest.skip("checked on zamba2_plain alone")
    import shutil
    for name, edit, needle in (
            ("missing", lambda t: {k: v for k, v in t.items() if ".layers.1.shared_transformer." not in k},
             "no shared transformer block for hybrid layer 1"),
            ("spare", lambda t: {**t, "model.layers.1.shared_transformer.self_attn.linear_q_adapter_list.0.0.weight":
                                 torch.zeros(4, 64)}, "linear_q_adapter_list.0.0.weight' is not part")):
        bad = tmp_path / name
        shutil.copytree(d, bad)
        f = sorted(bad.glob("*.safetensors"))[0]
        save_file(edit(load_file(str(f))), str(f), metadata={"format": "pt"})
        with pytest.raises(InputError, match=needle):
            load_checkpoint(bad)


def test_audit_command_on_a_zamba2_checkpoint(tmp_path, checkpoint):
    """The whole audit from the command line: the leak table's mamba2 family holds the Mamba2 layers and the hybrid
    layers, each with a state and a window error."""
    arch, d, _ = checkpoint
    if arch != "zamba2":
        pytest.skip("checked on zamba2 alone")
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    leak = json.loads((out / "report.json").read_text())["budgets"][0]["leak"]["leaky"]
    assert [(f["family"], f["layers"]) for f in leak["by_family"]] == [("mamba2", 5)]
    assert leak["by_family"][0]["state_rel"]["n"] > 0 and leak["by_family"][0]["state_rel"]["max"] > 1e-3
    assert [row["kind"] for row in leak["by_layer"]] == list("mzmzz")
    assert all(row["state_rel"] is not None and row["conv_rel"] is not None for row in leak["by_layer"])
