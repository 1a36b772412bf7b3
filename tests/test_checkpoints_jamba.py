"""Jamba checkpoints (Mamba1 + attention + MoE) against transformers, the reference implementation: tiny
random configs (dense, and with routed experts on every other layer) are built with transformers, saved,
loaded with ddsim, and must give the same logits (prefill and step-by-step decode) and the same greedy
continuation, from both the fast path and the oracle; the Mamba1 state leaks on a tree; what ddsim does not
run is refused in one line; an audit runs on one of them from the command line."""
import json
import re
import shutil

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim import oracle
from ddsim.errors import InputError
from ddsim.model.checkpoint import SUPPORTED, load_checkpoint, read_config
from ddsim.model.model import HybridModel
from ddsim.sim.generate import autoregressive
from ddsim.trees.tree import Tree, chain
from tests.conftest import run_cli

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
    with torch.no_grad():  # random, non-trivial weights everywhere (norms, D, dt bias, conv bias)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.05))
    return model.float().eval()


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
    toks = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=toks).logits[0].double()
    fast = HybridModel(cfg, {k: v.float() for k, v in w.items()})
    _, lg = fast.prefill(toks[0].tolist())
    scale = ref.abs().max().item()
    assert scale > 0.1  # the comparison is not between near-zero logits
    assert (lg.double() - ref).abs().max().item() < 1e-4 * scale
    _, olg = oracle.prefill(w, cfg, toks[0].tolist())
    assert (olg - ref).abs().max().item() < 1e-4 * scale


def test_step_decode_and_greedy_continuation_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, _ = load_checkpoint(d)
    prompt = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = hf.generate(input_ids=prompt, max_new_tokens=8, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
    hf_tokens = out.sequences[0, prompt.shape[1]:].tolist()
    fast = HybridModel(cfg, {k: v.float() for k, v in w.items()})
    ours = autoregressive(fast, prompt[0].tolist(), 8)
    if len(hf_tokens) < 8:  # transformers stopped at the end-of-sequence token; ddsim decodes on
        assert hf_tokens[-1] == hf.generation_config.eos_token_id
        ours = ours[:len(hf_tokens)]
    assert ours == hf_tokens
    state, _ = fast.prefill(prompt[0, :-1].tolist())
    ostate, _ = oracle.prefill(w, cfg, prompt[0, :-1].tolist())
    root = int(prompt[0, -1])
    for step, tok in enumerate(hf_tokens):  # every decode step's logits, one token from the committed state
        t = chain([root])
        res = fast.verify(state, t)
        ref = out.logits[step][0].double()
        bound = 1e-4 * ref.abs().max().item()
        assert (res.logits[0].double() - ref).abs().max().item() < bound
        ores = oracle.verify_tree(w, cfg, ostate, t.parents, t.tokens)
        assert (ores.logits[0] - ref).abs().max().item() < bound
        state, root = fast.commit(state, t, res, 0), tok
        ostate, _ = oracle.prefill(w, cfg, [t.tokens[0]], state=ostate)


def test_the_mamba1_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    """On the loaded checkpoint: leaky verification (and leaky-state alone, and leaky-conv alone) differs
    from the oracle off the order-exact nodes, exact verification equals it everywhere, and the serving
    verify's replayed commit gives the per-node path's state."""
    _, d, _ = checkpoint
    cfg, w, _ = load_checkpoint(d)
    fast = HybridModel(cfg, {k: v.float() for k, v in w.items()})
    state, _ = fast.prefill([3, 1, 4, 1, 5])
    ostate, _ = oracle.prefill(w, cfg, [3, 1, 4, 1, 5])
    t = Tree([-1, 0, 0, 1, 2, 2], [9, 2, 6, 5, 3, 5])
    ref = oracle.verify_tree(w, cfg, ostate, t.parents, t.tokens).logits
    ex = torch.as_tensor(t.order_exact)
    tol = 1e-4 * ref.abs().max().item()
    for m in ("exact", "leaky", "leaky-state", "leaky-conv"):
        full, serving = fast.verify(state, t, mode=m), fast.verify(state, t, mode=m, keep_states=False)
        err = (full.logits.double() - ref).abs().amax(-1)
        if m == "exact":
            assert err.max() < tol
        else:
            assert err[ex].max() < tol and err[~ex].max() > 100 * tol, m
        a, b = fast.commit(state, t, full, 4), fast.commit(state, t, serving, 4)
        for i in cfg.recurrent_layers:
            torch.testing.assert_close(b.ssm[i], a.ssm[i], rtol=1e-5, atol=1e-6)


def test_jamba_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "jamba_moe":
        return
    for field, value, needle in (("mamba_proj_bias", True, "mamba_proj_bias=true is not supported"),
                                 ("hidden_act", "gelu", "hidden_act 'gelu' is not supported"),
                                 ("hidden_size", None, "missing field 'hidden_size'")):
        bad = tmp_path / field
        shutil.copytree(d, bad)
        cfgj = json.loads((bad / "config.json").read_text())
        if value is None:
            del cfgj[field]
        else:
            cfgj[field] = value
        (bad / "config.json").write_text(json.dumps(cfgj))
        with pytest.raises(InputError, match=re.escape(needle)):
            read_config(bad)
    from safetensors.torch import load_file, save_file
    extra = tmp_path / "extra"
    shutil.copytree(d, extra)
    f = sorted(extra.glob("*.safetensors"))[0]
    tensors = load_file(str(f))
    tensors["model.layers.0.mamba.mystery"] = torch.zeros(3)
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(InputError, match="mamba.mystery.*refused rather than ignored"):
        load_checkpoint(extra)


def test_audit_command_on_a_jamba_checkpoint(tmp_path, checkpoint):
    """The whole audit from the command line on the MoE checkpoint: the leak table's mamba1 family carries a
    state and a window error."""
    arch, d, _ = checkpoint
    if arch != "jamba_moe":
        return
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    leak = json.loads((out / "report.json").read_text())["budgets"][0]["leak"]["leaky"]
    assert [(f["family"], f["layers"]) for f in leak["by_family"]] == [("mamba1", 3)]
    assert leak["by_family"][0]["state_rel"]["n"] > 0 and leak["by_family"][0]["state_rel"]["max"] > 1e-3
    assert [row["kind"] for row in leak["by_layer"]] == list("ssas")


def test_layers_without_a_triton_kernel_are_not_captured_in_cuda_graphs():
    """Mamba1, lightning and KDA layers run PyTorch loops whose commit reads the tree on the host: a model with
    any of them is run eagerly on CUDA, not captured (the reason is given), even without MoE; the fixed buffers
    without capture still take it."""
    from ddsim.model.config import get_preset
    from ddsim.model.graphs import not_capturable
    from ddsim.model.weights import init_weights
    for kind, family in (("s", "mamba1"), ("l", "lightning"), ("k", "kda")):
        cfg = get_preset("micro").replace(layer_pattern="a" + kind, linear_num_value_heads=1, linear_value_head_dim=8,
                                           mamba1_inner=8, mamba_state_size=4)
        model = HybridModel(cfg, init_weights(cfg))
        why = not_capturable(model)
        assert why is not None and family in why and "no Triton kernel" in why, why
        assert not_capturable(model, capture=False) is None
    assert "not a CUDA device" in not_capturable(HybridModel(get_preset("micro"), init_weights(get_preset("micro"))))
