"""MiniMax checkpoints (lightning attention, softmax attention, MoE, the scaled normed-residual blocks) against
transformers, the reference implementation: tiny random configs (every alpha and beta factor at 1, and away from
1) are built with transformers, saved, loaded with ddsim, and must give the same logits (prefill and step-by-step
decode) and the same greedy continuation, from both the fast path and the oracle; the lightning state leaks on a
tree (and only the state: there is no conv); refusals; an audit and the gate from the command line."""
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
    with torch.no_grad():  # random, non-trivial weights everywhere (norms included)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.05))
    return model.float().eval()


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
    toks = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))  # > block_size
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


def test_the_lightning_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
    """leaky and leaky-state differ from the oracle off the order-exact nodes; exact and leaky-conv (there is no
    conv) equal it everywhere; the serving verify's replayed commit gives the per-node path's state."""
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
        if m in ("exact", "leaky-conv"):
            assert err.max() < tol, m
        else:
            assert err[ex].max() < tol and err[~ex].max() > 100 * tol, m
        a, b = fast.commit(state, t, full, 4), fast.commit(state, t, serving, 4)
        for i in cfg.recurrent_layers:
            torch.testing.assert_close(b.ssm[i], a.ssm[i], rtol=1e-5, atol=1e-6)


def test_minimax_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "minimax":
        return
    for field, value, needle in (("sliding_window", 64, "sliding_window=64 is not supported"),
                                 ("layer_types", ["linear_attention", "mamba", "full_attention", "linear_attention"],
                                  "unknown layer type 'mamba'"),
                                 ("num_attention_heads", None, "missing field 'num_attention_heads'")):
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


def test_audit_command_on_a_minimax_checkpoint(tmp_path, checkpoint):
    """The audit from the command line: the lightning family carries a state error and no window error."""
    arch, d, _ = checkpoint
    if arch != "minimax":
        return
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
