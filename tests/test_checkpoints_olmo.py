"""OLMo-Hybrid checkpoints (Gated DeltaNet with negative-eigenvalue beta, OLMo 2's output-normed attention blocks,
q/k norms over all heads) against transformers, the reference implementation: tiny random configs, without
RoPE as released and with it, are built with transformers, saved, loaded with ddsim, and must give the same
logits (prefill and step-by-step decode) and the same greedy continuation, from both the fast path and the
oracle; the GDN leak on a tree; refusals; an audit from the command line."""
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
    with torch.no_grad():  # random, non-trivial weights everywhere (norms, A_log, dt_bias)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.05))
    return model.float().eval()


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
        assert hf_tokens[-1] in [hf.generation_config.eos_token_id]
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


def test_the_gdn_state_leaks_on_a_tree_and_exact_verification_does_not(checkpoint):
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
        err = (fast.verify(state, t, mode=m).logits.double() - ref).abs().amax(-1)
        assert (err.max() < tol) if m == "exact" else (err[ex].max() < tol and err[~ex].max() > 100 * tol), m


def test_olmo_checkpoints_refuse_what_ddsim_does_not_run(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "olmo_hybrid":
        return
    for field, value, needle in (("attention_bias", True, "attention_bias=true is not supported"),
                                 ("layer_types", ["linear_attention"] * 3, "3 layer_types for 4 layers"),
                                 ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
                                  "rope_type 'yarn' is not supported"),
                                 ("linear_num_key_heads", None, "missing field 'linear_num_key_heads'")):
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
    # rope_parameters null is transformers' default RoPE when it loads the checkpoint, not NoPE
    null = tmp_path / "null_rope"
    shutil.copytree(d, null)
    cfgj = json.loads((null / "config.json").read_text())
    cfgj["rope_parameters"] = None
    (null / "config.json").write_text(json.dumps(cfgj))
    cfg, _ = read_config(null)
    assert cfg.use_rope and cfg.rope_theta == 10000.0
    assert not read_config(d)[0].use_rope


def test_audit_command_on_an_olmo_hybrid_checkpoint(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    if arch != "olmo_hybrid":
        return
    out = tmp_path / "audit"
    r = run_cli("audit", "--model", d, "--budget", "16", "--steps", "4", "--seed", "2", "--out", out)
    assert r.returncode in (0, 1), r.stderr
    leak = json.loads((out / "report.json").read_text())["budgets"][0]["leak"]["leaky"]
    assert [(f["family"], f["layers"]) for f in leak["by_family"]] == [("gdn", 3)]
