"""Real checkpoints against transformers, the reference implementation: tiny random configs of each
supported architecture are built with transformers, saved (also sharded), loaded with ddsim, and
must give the same logits (prefill and step-by-step decode) and the same greedy continuation, from
both the fast path and the oracle. transformers is a test dependency only."""
import dataclasses
import json
import re

import pytest
import torch
import transformers  # a declared test dependency: a missing install must fail, not skip

from ddsim import oracle
from ddsim.errors import InputError
from ddsim.model.checkpoint import SUPPORTED, load_checkpoint, read_config
from ddsim.model.model import HybridModel
from ddsim.sim.generate import autoregressive
from ddsim.trees.tree import chain

TEXT = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=8, intermediate_size=48, max_position_embeddings=256)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)


def _hf_model(arch: str, **text):
    """A tiny random checkpoint of ``arch``; ``text``: its text config's fields in place of TEXT's."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config, Qwen3_5TextConfig
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeConfig, Qwen3_5MoeTextConfig
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    text = {**TEXT, **text}
    torch.manual_seed(0)
    if arch == "qwen3_next":
        cfg = Qwen3NextConfig(**text, **MOE, decoder_sparse_step=2)  # MoE on every second layer, dense between
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    elif arch == "qwen3_5":
        model = transformers.AutoModelForImageTextToText.from_config(Qwen3_5Config(text_config=text, vision_config=VISION))
    elif arch == "qwen3_5_text":  # the language model saved alone (as ddsim's shipped hybrid and drafter are)
        model = transformers.AutoModelForCausalLM.from_config(Qwen3_5TextConfig(**text))
    elif arch == "qwen3_5_moe_text":
        model = transformers.AutoModelForCausalLM.from_config(Qwen3_5MoeTextConfig(**text, **MOE))
    else:
        model = transformers.AutoModelForImageTextToText.from_config(
            Qwen3_5MoeConfig(text_config={**text, **MOE}, vision_config=VISION))
    with torch.no_grad():  # random, non-trivial weights everywhere (norms, gates, biases of the decay)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.02))
    return model.float().eval()


def _save(arch, tmp_path_factory):
    model = _hf_model(arch)
    d = tmp_path_factory.mktemp(arch)
    # sharded for one architecture, so the index path is exercised too
    model.save_pretrained(d, max_shard_size="200KB" if arch == "qwen3_next" else "2GB")
    return arch, d, model


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"])
def checkpoint(request, tmp_path_factory):
    return _save(request.param, tmp_path_factory)


def test_supported_architectures_listed():
    assert {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"} <= set(SUPPORTED)


def test_prefill_logits_match_transformers(checkpoint):
    arch, d, hf = checkpoint
    cfg, w, meta = load_checkpoint(d)
    assert meta["model_type"] == arch and cfg.layer_pattern == "ggga"
    toks = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=toks).logits[0].double()
    fast = HybridModel(cfg, {k: v.float() for k, v in w.items()})
    _, lg = fast.prefill(toks[0].tolist())
    scale = ref.abs().max().item()
    assert scale > 0.5  # the comparison is not between near-zero logits
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
    assert autoregressive(fast, prompt[0].tolist(), 8) == hf_tokens
    # the logits of every decode step, one token at a time from the committed state
    state, _ = fast.prefill(prompt[0, :-1].tolist())
    root = int(prompt[0, -1])
    for step, tok in enumerate(hf_tokens):
        t = chain([root])
        res = fast.verify(state, t)
        ref = out.logits[step][0].double()
        assert (res.logits[0].double() - ref).abs().max().item() < 1e-4 * ref.abs().max().item()
        state, root = fast.commit(state, t, res, 0), tok


def test_bad_checkpoints(tmp_path, checkpoint):
    arch, d, _ = checkpoint
    with pytest.raises(InputError, match="not a directory"):
        read_config(tmp_path / "nope")
    with pytest.raises(InputError, match="no config.json"):
        read_config(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(InputError, match="unsupported architecture 'llama'.*qwen3_next"):
        read_config(bad)
    import shutil
    # a tensor in a dtype ddsim cannot run (as in a quantised checkpoint)
    if arch == "qwen3_5":
        from safetensors.torch import load_file, save_file
        q8 = tmp_path / "q8"
        shutil.copytree(d, q8)
        f = sorted(q8.glob("*.safetensors"))[0]
        tensors = load_file(str(f))
        key = next(k for k in tensors if k.endswith("self_attn.k_proj.weight"))
        tensors[key] = tensors[key].to(torch.float8_e4m3fn)
        save_file(tensors, str(f), metadata={"format": "pt"})
        with pytest.raises(InputError, match="k_proj.weight: dtype float8_e4m3fn is not supported"):
            load_checkpoint(q8)
    # a copy with a truncated shard, then with a missing shard
    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    shard = sorted(broken.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[: 4096])
    with pytest.raises(InputError, match="truncated or not a safetensors file|missing"):
        load_checkpoint(broken)
    shard.unlink()
    with pytest.raises(InputError, match="missing|no \\*.safetensors"):
        load_checkpoint(broken)


def _write_tokenizer(d, vocab_size):
    """A small BPE tokenizer (trained here on the built-in prompts) plus a chat template, as a
    checkpoint ships them: tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from ddsim.model.prompts import BUILTIN_PROMPTS
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  limit_alphabet=40)
    tok.train_from_iterator([p["text"] for p in BUILTIN_PROMPTS] * 3, trainer)
    assert tok.get_vocab_size() <= vocab_size
    tok.save(str(d / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


def test_audit_command_on_a_checkpoint_with_text_prompts(tmp_path_factory, tmp_path, monkeypatch):
    """One architecture through the command line; the others share the path."""
    from tests.cli_runs import _cuda_present, run_cli
    _, d, _ = _save("qwen3_next", tmp_path_factory)
    import shutil
    ck = tmp_path / "ck"
    shutil.copytree(d, ck)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "Write a Python function that merges two sorted lists"}\n'
                       '{"text": "What are the likely causes?", "chat": true}\n{"tokens": [1, 2, 3]}\n')
    out = tmp_path / "out"
    r = run_cli("audit", "--model", ck, "--prompts", prompts, "--budget", "4", "--steps", "2", "--out", out)
    assert r.returncode == 2 and "tokenizer.json" in r.stderr  # text prompts need the checkpoint's tokenizer
    _write_tokenizer(ck, TEXT["vocab_size"])
    r = run_cli("audit", "--model", ck, "--prompts", prompts, "--budget", "4", "--steps", "2", "--out", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["model"]["config"]["architecture"] == "qwen3_next" and rep["model"]["source"] == f"checkpoint {ck}"
    from ddsim.model.checkpoint import checkpoint_digest
    assert rep["provenance"]["weights_sha256"] == checkpoint_digest(ck)
    # the gate checks a report against the checkpoint it names, by content; the match, the recheck's check and the
    # re-run audit take one digest of it (ddsim.digest: read once, looked up while unchanged; a forked command line
    # inherits the counting and, so that files just written count as settled, the settling time)
    from ddsim import digest
    reads, update = tmp_path / "reads", digest._update
    monkeypatch.setattr(digest, "_SETTLED_NS", -10**12)
    monkeypatch.setattr(digest, "_DIGESTS", {})  # (this process's digest above may be kept: the files settled since)
    monkeypatch.setattr(digest, "_update", lambda h, p: (open(reads, "a").write(f"{p.name}\n"), update(h, p)))
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json", "--model", ck)
    assert g.returncode == 1, g.stdout + g.stderr  # matches (and budget 4 barely exercises the leak)
    if not _cuda_present():  # (where the command line runs in a fresh interpreter, nothing is counted)
        read = reads.read_text().split()
        files = sorted(["config.json", *(f.name for f in ck.glob("*.safetensors"))])
        assert len(files) == 3 and sorted(f for f in read if f in files) == files, read  # (two shards)
    monkeypatch.undo()
    other = tmp_path / "other"
    shutil.copytree(ck, other)
    cfgj = json.loads((other / "config.json").read_text())
    cfgj["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(cfgj))
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json", "--model", other)
    assert g.returncode == 2 and "the report does not match" in g.stderr, g.stderr
    assert len(rep["prompts"]) == 3 and rep["prompts"][2]["tokens"] == [1, 2, 3]
    assert f"checkpoint {ck}" in (out / "report.html").read_text() and f"checkpoint {ck}" in r.stdout
    assert all(b["modes"]["exact"]["generations_leaving_greedy"] == 0 for b in rep["budgets"])
    # no --prompts: the built-in math, code and chat prompts through the chat template
    r = run_cli("audit", "--model", ck, "--budget", "4", "--steps", "1", "--out", tmp_path / "out2")
    assert r.returncode == 0, r.stderr
    assert len(json.loads((tmp_path / "out2" / "report.json").read_text())["prompts"]) == 3
    r = run_cli("audit", "--model", tmp_path / "missing", "--out", tmp_path / "out3")
    assert r.returncode == 2 and "not a directory" in r.stderr and not (tmp_path / "out3").exists()


def _edit_tensors(d, edit):
    """Apply ``edit(tensors)`` to every shard of the checkpoint copy ``d`` (and its index)."""
    from safetensors.torch import load_file, save_file
    index = d / "model.safetensors.index.json"
    for f in sorted(d.glob("*.safetensors")):
        tensors = load_file(str(f))
        edit(tensors)
        save_file(tensors, str(f), metadata={"format": "pt"})
        if index.is_file():
            idx = json.loads(index.read_text())
            idx["weight_map"] = {**{k: v for k, v in idx["weight_map"].items() if k in tensors or v != f.name},
                                 **{k: f.name for k in tensors}}
            index.write_text(json.dumps(idx))


@pytest.mark.parametrize("field, value, needle", [
    ("hidden_size", 32.5, "text_config.hidden_size must be a whole number, got 32.5"),
    ("num_attention_heads", True, "text_config.num_attention_heads must be a whole number, got true"),
    ("linear_num_value_heads", 4.0, "text_config.linear_num_value_heads must be a whole number, got 4.0"),
    ("rms_norm_eps", True, "text_config.rms_norm_eps must be a number, got true"),
    ("rms_norm_eps", -1e-6, "rms_norm_eps: expected a finite number >= 0, got -1e-06"),
    ("rope_theta", -10000.0, "rope_theta: expected a finite base > 0, got -10000.0"),
])
def test_a_config_field_of_the_wrong_kind_is_refused_not_truncated(tmp_path_factory, tmp_path, field, value, needle):
    """The readers took config.json's numbers through int() and float(): hidden_size 32.5 was read as 32, true as 1
    (JSON's true is Python's True, which int() and float() take as 1), and a negative epsilon or RoPE base went into
    the model. Each is now one line naming the field."""
    import shutil
    _, d, _ = _save("qwen3_5", tmp_path_factory)
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    cfg = json.loads((bad / "config.json").read_text())
    where = cfg["text_config"]["rope_parameters"] if field == "rope_theta" else cfg["text_config"]
    where[field] = value
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=re.escape(needle)):
        read_config(bad)


@pytest.mark.parametrize("field, value, needle", [
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1e4,
                         "partial_rotary_factor": 0.25}, "rope_parameters.rope_type 'yarn' is not supported (the default RoPE only)"),
    ("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling.rope_type 'linear' is not supported (the default RoPE only)"),
    ("rope_scaling", "yarn", 'rope_scaling must be an object or null, got "yarn"'),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True}, None),  # Qwen3.5's own form
])
def test_a_rope_scaling_is_refused_rather_than_read_as_the_default_rope(checkpoint, tmp_path, field, value, needle):
    """A YaRN, linear or other scaled RoPE, named in rope_parameters or the older rope_scaling (transformers reads
    both), was read as the default RoPE: the audit would have run another attention than the checkpoint's. Each is
    refused in one line naming the field; the default RoPE, Qwen3.5's interleaved sections among it (on text, where
    the three positions are one, the same rotation), is read."""
    import shutil
    arch, d, _ = checkpoint
    bad = tmp_path / "edited"
    shutil.copytree(d, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.get("text_config", cfg)[field] = value
    (bad / "config.json").write_text(json.dumps(cfg))
    if needle is None:
        want = read_config(d)[0]
        assert read_config(bad)[0] == dataclasses.replace(want, name=bad.name, notes=want.notes.replace(str(d), str(bad)))
    else:
        with pytest.raises(InputError, match=re.escape(needle)) as e:
            read_config(bad)
        assert str(e.value).count("config.json") == 1, str(e.value)


@pytest.mark.parametrize("rope", [
    {"rope_parameters": {"rope_type": "default", "rope_theta": 5e4}},  # no fraction named
    {"rope_parameters": None, "rope_theta": 5e4},  # the older form: the base beside the other fields
    {"rope_parameters": None, "rope_theta": 5e4, "partial_rotary_factor": 0.5},
])
def test_the_rope_is_read_as_transformers_reads_it(checkpoint, tmp_path, rope):
    """RoPE's base and the fraction of each head it turns, from the config's forms, as transformers reads them: where
    no field named a fraction ddsim turned the whole head, and transformers (Qwen3-Next's and Qwen3.5's default) a
    quarter."""
    import shutil
    arch, d, _ = checkpoint
    edited = tmp_path / "edited"
    shutil.copytree(d, edited)
    cfg = json.loads((edited / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text.update(rope)
    if text["rope_parameters"] is None:
        del text["rope_parameters"]
    (edited / "config.json").write_text(json.dumps(cfg))
    want = transformers.AutoConfig.from_pretrained(edited).get_text_config().rope_parameters
    got = read_config(edited)[0]
    assert (got.rope_theta, got.partial_rotary_factor) == (want["rope_theta"], want["partial_rotary_factor"])
    assert got.partial_rotary_factor == rope.get("partial_rotary_factor", 0.25)


def test_checkpoints_whose_tensors_and_config_disagree_are_refused(tmp_path_factory, tmp_path):
    """A config that lists fewer layers than the weights hold, or a tensor ddsim does not read: the
    audit would run another model than the checkpoint, so it refuses instead of dropping them."""
    import shutil
    _, d, _ = _save("qwen3_5", tmp_path_factory)
    fewer = tmp_path / "fewer"
    shutil.copytree(d, fewer)
    cfg = json.loads((fewer / "config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = 3
    cfg["text_config"]["layer_types"] = cfg["text_config"]["layer_types"][:3]
    (fewer / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=r"is for layer 3, but config.json lists 3 layers"):
        load_checkpoint(fewer)
    extra = tmp_path / "extra"
    shutil.copytree(d, extra)
    _edit_tensors(extra, lambda t: t.__setitem__("model.language_model.layers.0.linear_attn.out_proj.bias",
                                                  torch.zeros(TEXT["hidden_size"])))
    with pytest.raises(InputError, match=r"linear_attn.out_proj.bias' is not part of a qwen3_5 layer"):
        load_checkpoint(extra)


def test_float64_checkpoint_loads_and_audits(tmp_path_factory, tmp_path):
    """float64 weights load as they are (the oracle computes in float64 on the CPU, the fast path in
    float32), with the same logits as the float32 checkpoint."""
    import shutil

    from tests.cli_runs import run_cli
    _, d, _ = _save("qwen3_next", tmp_path_factory)
    f64 = tmp_path / "f64"
    shutil.copytree(d, f64)
    _edit_tensors(f64, lambda t: t.update({k: v.double() for k, v in t.items()}))
    cfg = json.loads((f64 / "config.json").read_text())
    cfg["dtype"] = "float64"
    cfg.pop("torch_dtype", None)
    (f64 / "config.json").write_text(json.dumps(cfg))
    c64, w64, meta = load_checkpoint(f64)
    assert meta["dtype"] == torch.float64 and w64["embed"].dtype == torch.float64
    c32, w32, _ = load_checkpoint(d)
    toks = [1, 5, 7, 9]
    _, a = HybridModel(c64, w64).prefill(toks)
    _, b = HybridModel(c32, {k: v.float() for k, v in w32.items()}).prefill(toks)
    assert torch.allclose(a, b, atol=1e-5)
    r = run_cli("audit", "--model", f64, "--budget", "4", "--steps", "1", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr


HOSTILE_TEMPLATES = [
    "{{ cycler.__init__.__globals__.os.system('touch PWNED') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% set x = messages.append({'role': 'system'}) %}{{ messages }}",
    "{{ joiner.__init__.__globals__['os'].popen('touch PWNED').read() }}",
]


@pytest.mark.parametrize("template", HOSTILE_TEMPLATES)
def test_a_hostile_chat_template_runs_nothing(tmp_path_factory, tmp_path, template, monkeypatch):
    """A checkpoint's chat template is rendered in jinja2's immutable sandbox: a template reaching for
    Python internals or mutating its arguments is refused in one line (exit 2), and nothing runs."""
    import shutil

    from tests.cli_runs import run_cli
    _, d, _ = _save("qwen3_next", tmp_path_factory)
    ck = tmp_path / "ck"
    shutil.copytree(d, ck)
    _write_tokenizer(ck, TEXT["vocab_size"])
    (ck / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "hello there", "chat": true}\n')
    r = run_cli("audit", "--model", ck, "--prompts", prompts, "--budget", "4", "--steps", "1",
                "--out", tmp_path / "out", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "tokenizer_config.json: chat template" in lines[0], r.stderr
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "out").exists()


def test_a_plain_chat_template_still_renders():
    from ddsim.model.prompts import render_chat_template
    t = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert render_chat_template(t, "hi", where="t") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("template, needle", [
    # an endless render: nested loops that print nothing (the sandbox caps range() at 100,000 items)
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "did not finish within"),
    # a render that never stops growing
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "rendered more than"),
])
def test_a_looping_or_bloating_chat_template_is_refused_in_time(template, needle):
    import time

    from ddsim.model.prompts import render_chat_template
    t0 = time.monotonic()
    with pytest.raises(InputError, match=f"where: chat template refused: it {needle}"):
        render_chat_template(template, "hi", where="where", seconds=0.5)
    assert time.monotonic() - t0 < 30  # bounded: the hang is cut, not waited out


def test_chat_template_jinja_is_read_and_preferred(tmp_path_factory, tmp_path):
    """transformers saves chat_template.jinja beside the tokenizer and prefers it to tokenizer_config.json's."""
    import shutil

    from ddsim.model.prompts import TextEncoder
    _, d, _ = _save("qwen3_next", tmp_path_factory)
    ck = tmp_path / "ck"
    shutil.copytree(d, ck)
    _write_tokenizer(ck, TEXT["vocab_size"])
    (ck / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    enc = TextEncoder(ck)
    assert enc.template_file == ck / "chat_template.jinja"
    assert enc.encode("hi", chat=True) == enc.tok.encode("[hi]", add_special_tokens=False).ids
    (ck / "chat_template.jinja").write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                            "{% endfor %}")
    with pytest.raises(InputError, match="chat_template.jinja: chat template refused"):
        TextEncoder(ck).encode("hi", chat=True)


@pytest.mark.parametrize("target", ["/etc/hostname", "../outside.safetensors", "sub/../../outside.safetensors"])
def test_a_shard_index_naming_files_outside_the_checkpoint_is_refused(tmp_path_factory, tmp_path, target):
    import shutil
    _, d, _ = _save("qwen3_next", tmp_path_factory)  # the sharded one
    ck = tmp_path / "ck"
    shutil.copytree(d, ck)
    (tmp_path / "outside.safetensors").write_bytes(next(ck.glob("*.safetensors")).read_bytes())
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    key = next(iter(index["weight_map"]))
    index["weight_map"][key] = target
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match="is not a file name inside the checkpoint directory"):
        load_checkpoint(ck)


@pytest.mark.parametrize("index", [[], {"weight_map": ["model-00001.safetensors"]}, {"weight_map": {"w": 3}}])
def test_a_shard_index_of_another_shape_is_one_line(tmp_path_factory, tmp_path, index):
    import shutil
    _, d, _ = _save("qwen3_next", tmp_path_factory)  # the sharded one
    ck = tmp_path / "ck"
    shutil.copytree(d, ck)
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match="weight_map must map tensor names to file names"):
        load_checkpoint(ck)


def test_a_symlinked_shard_leaving_the_checkpoint_is_refused(tmp_path_factory, tmp_path):
    import shutil
    _, d, _ = _save("qwen3_5", tmp_path_factory)  # one unsharded file
    ck = tmp_path / "ck"
    shutil.copytree(d, ck)
    f = next(ck.glob("*.safetensors"))
    outside = tmp_path / "elsewhere.safetensors"
    f.rename(outside)
    f.symlink_to(outside)
    with pytest.raises(InputError, match="resolves outside the checkpoint directory"):
        load_checkpoint(ck)
