"""A config.json read as transformers reads it, fields left out included.

transformers saves a config as its difference from the class's defaults, so a checkpoint it wrote leaves out every
field equal to one. For each test checkpoint's config (each reader's, as transformers saves it) and each field in it
in turn, the config without that field is read by ddsim and by transformers; ddsim must refuse it, or read from it
exactly the model it reads from transformers' own completion of it (every field written out); where transformers
refuses it, ddsim must too. Before ddsim/model/config_defaults.py 16 of the 22 configs then tested had a field read
otherwise (28 ways): a Kimi Linear re-saved without its routed scaling (2.446) ran at 1.0, a Nemotron-H without its dt
floor (0.001) at 0.0 (and without its relu2 was refused), Bamba's and Falcon-H1's norms at 1e-6 for 1e-5, Granite's
attention at 1/sqrt(d) for a scale of 1, Qwen3-Next's head_dim was taken as hidden / heads for 256; a Jamba whose
attention offset is not below its period, and a config without num_hidden_layers, were read. Qwen3.5's language model
saved alone (qwen3_5_text, qwen3_5_moe_text) joined later: with the table emptied 18 of today's 24 fail."""
import dataclasses
import importlib
import json
import warnings

import pytest
import transformers

from ddsim.errors import InputError
from ddsim.model.checkpoint import read_config


def _configs():
    """(name, the config as transformers saves it: its difference from the class's defaults) for every reader's
    test checkpoints."""
    out = []
    for module in ("jamba", "kimi", "lfm2", "mamba", "minimax", "olmo", "zamba2"):
        m = importlib.import_module(f"tests.test_checkpoints_{module}")
        out += [(arch, m._config(arch)) for arch in m.ARCHS]
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config, Qwen3_5TextConfig
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeConfig, Qwen3_5MoeTextConfig
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    q = importlib.import_module("tests.test_checkpoints")
    out += [("qwen3_next", Qwen3NextConfig(**q.TEXT, **q.MOE, decoder_sparse_step=2)),
            ("qwen3_5", Qwen3_5Config(text_config=q.TEXT, vision_config=q.VISION)),
            ("qwen3_5_moe", Qwen3_5MoeConfig(text_config={**q.TEXT, **q.MOE}, vision_config=q.VISION)),
            # the language model's config alone (model_type qwen3_5_text, qwen3_5_moe_text), as a text-only export saves it
            ("qwen3_5_text", Qwen3_5TextConfig(**q.TEXT)), ("qwen3_5_moe_text", Qwen3_5MoeTextConfig(**q.TEXT, **q.MOE))]
    return [(name, json.loads(c.to_json_string(use_diff=True))) for name, c in out]


CONFIGS = _configs()
KEPT = ("model_type", "architectures", "transformers_version")  # what names the class itself


def _read(d):
    """ddsim's ModelConfig of directory d without the fields that name the directory, or None where refused."""
    try:
        cfg = read_config(d)[0]
    except InputError:
        return None
    return dataclasses.replace(cfg, name="", notes="")


@pytest.mark.parametrize("name, saved", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_each_field_left_out_is_read_as_transformers_reads_it(tmp_path, name, saved):
    text = "text_config" in saved  # Qwen3.5: the language model's fields sit in text_config
    fields = saved["text_config"] if text else saved
    wrong = []
    for field in [None, *(f for f in fields if f not in KEPT)]:  # None: the config as saved
        kept = {k: v for k, v in fields.items() if k != field}
        sparse, full = tmp_path / f"{field}-sparse", tmp_path / f"{field}-full"
        sparse.mkdir()
        full.mkdir()
        (sparse / "config.json").write_text(json.dumps({**saved, "text_config": kept} if text else kept))
        got = _read(sparse)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                completed = transformers.AutoConfig.from_pretrained(sparse)
        except Exception as e:  # transformers refuses it (its config's checks): so must ddsim
            if got is not None:
                wrong.append(f"without {field}: read, where transformers refuses it ({type(e).__name__})")
            continue
        if got is None:
            continue  # refused: a field ddsim needs and will not guess
        (full / "config.json").write_text(completed.to_json_string(use_diff=False))
        want = _read(full)
        if want is None:
            wrong.append(f"without {field}: read, where transformers' completion is refused")
        elif got != want:
            diff = {f.name: (getattr(got, f.name), getattr(want, f.name)) for f in dataclasses.fields(got)
                    if getattr(got, f.name) != getattr(want, f.name)}
            wrong.append(f"without {field}: (ddsim, transformers) {diff}")
    assert not wrong, f"{name}:\n" + "\n".join(wrong)
    assert _read(tmp_path / "None-sparse") is not None, "the config as saved is refused"


# the fields the Mamba2 and Zamba2 mappers read from the config as they place the tensors (multipliers folded into
# the weights, the shared blocks): not in the ModelConfig, so compared on the weights
MAPPER_FIELDS = ("attention_in_multiplier", "key_multiplier", "attention_out_multiplier", "mlp_multipliers",
                 "ssm_multipliers", "ssm_in_multiplier", "ssm_out_multiplier", "num_mem_blocks",
                 "use_shared_attention_adapter")


@pytest.mark.parametrize("module, arch", [("mamba", "falcon_h1"), ("zamba2", "zamba2")])
def test_each_field_a_mapper_reads_left_out_gives_transformers_weights(tmp_path, module, arch):
    """Each field a mapper reads from the config (Falcon-H1's nine multipliers, Zamba2's shared blocks), left out of
    a saved checkpoint: ddsim's weights equal those it reads with transformers' completion of the config."""
    import shutil

    import torch

    from ddsim.model.checkpoint import load_checkpoint
    m = importlib.import_module(f"tests.test_checkpoints_{module}")
    saved_dir = tmp_path / "saved"
    m._hf_model(arch).save_pretrained(saved_dir)
    saved = json.loads((saved_dir / "config.json").read_text())
    fields = [f for f in MAPPER_FIELDS if f in saved]
    compared = []
    for field in fields:
        sparse, full = tmp_path / f"{field}-sparse", tmp_path / f"{field}-full"
        shutil.copytree(saved_dir, sparse)
        shutil.copytree(saved_dir, full)
        (sparse / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != field}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            completed = transformers.AutoConfig.from_pretrained(sparse)
        (full / "config.json").write_text(completed.to_json_string(use_diff=False))
        try:
            got = load_checkpoint(sparse)[1]
        except InputError:  # refused (the adapters' tensors with no use_shared_attention_adapter, say): not guessed
            continue
        want = load_checkpoint(full)[1]
        compared.append(field)
        assert got.keys() == want.keys(), field
        assert all(torch.equal(got[k], want[k]) for k in got), f"without {field}: the weights differ"
    assert compared, f"every field of {fields} left out was refused: nothing was compared"
