"""What every checkpoint suite (tests/test_checkpoints_*.py) checks of a transformers-built checkpoint loaded by ddsim:
the same logits as transformers (prefill, and every decode step from the committed state), from the fast path and
the oracle, and the same greedy continuation; the leak on one tree per verify mode; refusals of what ddsim does not
run. One definition each, so every architecture is held to the same bounds."""
import dataclasses
import json
import re
import shutil

import pytest
import torch

from ddsim import oracle
from ddsim.errors import InputError
from ddsim.model.checkpoint import load_checkpoint, read_config
from ddsim.model.model import HybridModel
from ddsim.sim.generate import autoregressive
from ddsim.trees.tree import Tree, chain

MODES = ("exact", "leaky", "leaky-state", "leaky-conv")


def perturbed(model, buffers: tuple = (), matrices: float = 0.05):
    """The transformers model with random, non-trivial weights everywhere (vectors such as norms and gates moved
    by 0.3, matrices by ``matrices``) and the named buffers ending in ``buffers`` moved by 0.3; float32, eval mode."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else matrices))
        for name, b in model.named_buffers():
            if name.endswith(tuple(buffers)):
                b.add_(torch.randn_like(b) * 0.3)
    return model.float().eval()


def fast_model(cfg, w) -> HybridModel:
    return HybridModel(cfg, {k: v.float() for k, v in w.items()})


def assert_prefill_matches(cfg, w, hf) -> None:
    """Nine random tokens prefilled: the fast path's and the oracle's logits within 1e-4 of transformers' (relative
    to the largest logit, which must not be near zero)."""
    toks = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=toks).logits[0].double()
    _, lg = fast_model(cfg, w).prefill(toks[0].tolist())
    scale = ref.abs().max().item()
    assert scale > 0.1  # the comparison is not between near-zero logits
    assert (lg.double() - ref).abs().max().item() < 1e-4 * scale
    _, olg = oracle.prefill(w, cfg, toks[0].tolist())
    assert (olg - ref).abs().max().item() < 1e-4 * scale


def assert_decode_matches(cfg, w, hf) -> None:
    """Eight greedy tokens after a 5-token prompt: the same tokens as transformers' generate (up to its end of
    sequence), and every decode step's logits, one token verified from the committed state, within 1e-4 of
    transformers', from the fast path and the oracle."""
    prompt = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = hf.generate(input_ids=prompt, max_new_tokens=8, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
    hf_tokens = out.sequences[0, prompt.shape[1]:].tolist()
    fast = fast_model(cfg, w)
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


def assert_leaks(cfg, w, *, exact_modes=("exact",), commit=True) -> None:
    """One branching tree after a 5-token prompt: the modes in ``exact_modes`` equal the oracle on every node; every
    other mode equals it on the order-exact nodes and differs by more than 100x the bound off them. With ``commit``,
    each mode's serving verify (no per-node states) commits node 4 to the per-node path's recurrent state."""
    fast = fast_model(cfg, w)
    state, _ = fast.prefill([3, 1, 4, 1, 5])
    ostate, _ = oracle.prefill(w, cfg, [3, 1, 4, 1, 5])
    t = Tree([-1, 0, 0, 1, 2, 2], [9, 2, 6, 5, 3, 5])
    ref = oracle.verify_tree(w, cfg, ostate, t.parents, t.tokens).logits
    ex = torch.as_tensor(t.order_exact)
    tol = 1e-4 * ref.abs().max().item()
    for m in MODES:
        full = fast.verify(state, t, mode=m)
        err = (full.logits.double() - ref).abs().amax(-1)
        if m in exact_modes:
            assert err.max() < tol, m
        else:
            assert err[ex].max() < tol and err[~ex].max() > 100 * tol, m
        if commit:
            a, b = fast.commit(state, t, full, 4), fast.commit(state, t, fast.verify(state, t, mode=m, keep_states=False), 4)
            for i in cfg.recurrent_layers:
                torch.testing.assert_close(b.ssm[i], a.ssm[i], rtol=1e-5, atol=1e-6)


DELETE = object()  # with_config: the field removed


def with_config(d, dest, **edits):
    """A copy of checkpoint directory ``d`` at ``dest`` whose config.json has ``edits`` (DELETE removes a field;
    None writes null)."""
    shutil.copytree(d, dest)
    cfg = json.loads((dest / "config.json").read_text())
    for field, value in edits.items():
        if value is DELETE:
            del cfg[field]
        else:
            cfg[field] = value
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def assert_config_refusals(d, tmp_path, cases) -> None:
    """Each (field, value, message): the config edited so (None: the field deleted) is refused with one InputError
    naming the file once and the problem."""
    for field, value, needle in cases:
        with pytest.raises(InputError, match=re.escape(needle)) as e:
            read_config(with_config(d, tmp_path / field, **{field: DELETE if value is None else value}))
        assert str(e.value).count("config.json") == 1, str(e.value)


def assert_config_read_alike(d, tmp_path, field, value) -> None:
    """The config edited so (as with_config) gives the model config.json gave before, but for its name and notes
    (which name the directory)."""
    edited = with_config(d, tmp_path / f"alike_{field}", **{field: value})
    want = read_config(d)[0]
    assert read_config(edited)[0] == dataclasses.replace(want, name=edited.name, notes=want.notes.replace(str(d), str(edited)))


def assert_unknown_tensor_refused(d, tmp_path, name: str, needle: str) -> None:
    """A tensor ``name`` ddsim does not read, added to the first shard, is refused rather than dropped."""
    from safetensors.torch import load_file, save_file
    extra = tmp_path / "extra"
    shutil.copytree(d, extra)
    f = sorted(extra.glob("*.safetensors"))[0]
    tensors = load_file(str(f))
    tensors[name] = torch.zeros(3)
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(InputError, match=needle):
        load_checkpoint(extra)
