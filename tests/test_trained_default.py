"""The trained default: the hybrid and drafter shipped in ddsim/models (benchmarks/train_stdlib_hybrid.py)
load as checkpoints ddsim reads, the drafter runs in the loop, and the gate's verdict on the trained
model is asserted exactly."""
import json
from pathlib import Path

import pytest
import torch

from tests.cli_runs import one_line_error, run_cli

MODELS = Path(__file__).resolve().parents[1] / "ddsim" / "models"
TARGET, DRAFTER, PROMPTS = MODELS / "hybrid-stdlib", MODELS / "drafter-stdlib", MODELS / "prompts-stdlib.jsonl"
AUDIT = ["--model", TARGET, "--drafter-model", DRAFTER, "--prompts", PROMPTS, "--budget", "16,32", "--steps", "4"]


def test_the_shipped_checkpoints_are_small_qwen35_hybrids():
    from ddsim.model.checkpoint import read_config
    for d, pattern in ((TARGET, "ggga"), (DRAFTER, "ga")):
        cfg, meta = read_config(d)
        assert meta["model_type"] == "qwen3_5_text" and cfg.layer_pattern == pattern
        assert cfg.vocab_size == 2048 and cfg.partial_rotary_factor == 0.25
        assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
        assert (d / "tokenizer.json").is_file()
        size = sum(f.stat().st_size for f in d.iterdir())
        assert size < 12 * 2**20, size  # "a few MB": 9.4 and 3.5 MB as shipped
    log = json.loads((MODELS / "train-log.json").read_text())
    # held-out perplexity far below the unigram baseline and the random initialisation
    assert log["hybrid-stdlib"]["val_perplexity"] < log["unigram_val_perplexity"] / 10
    assert log["drafter-stdlib"]["val_perplexity"] < log["unigram_val_perplexity"] / 10


def test_the_model_drafter_follows_its_own_greedy_chain():
    from ddsim.model.checkpoint import load_checkpoint
    from ddsim.model.model import HybridModel
    from ddsim.sim.drafters import DraftContext, ModelDrafter
    d = ModelDrafter(DRAFTER, vocab_size=2048, depth=3)
    ctx = [5, 17, 300, 42]
    rows = d.draft(DraftContext(step=0, tokens=ctx))
    assert rows.shape == (3, 2048) and rows.dtype == torch.float64
    cfg, w, _ = load_checkpoint(DRAFTER)
    m = HybridModel(cfg, w)
    y1 = int(rows[0].argmax())
    _, lg = m.prefill(ctx + [y1])
    torch.testing.assert_close(rows[0], lg[-2].double(), rtol=1e-5, atol=1e-5)  # depth 1: after the root
    torch.testing.assert_close(rows[1], lg[-1].double(), rtol=1e-5, atol=1e-5)  # depth 2: after its own top-1
    # a draft is a function of the prefix: a drafter that drafted before gives what a fresh one gives
    again = d.draft(DraftContext(step=1, tokens=ctx + [7, 9]))
    fresh = ModelDrafter(DRAFTER, vocab_size=2048, depth=3).draft(DraftContext(step=1, tokens=ctx + [7, 9]))
    assert torch.equal(again, fresh)


def test_the_model_drafter_decodes_a_context_seen_again_once(monkeypatch):
    """Drafts are kept by their tokens: a context seen again is not decoded again and gives the same rows, each
    call a tensor of its own (a caller writing into one cannot change the next); the oldest draft goes past MEMO."""
    from ddsim.sim.drafters import DraftContext, ModelDrafter
    d = ModelDrafter(DRAFTER, vocab_size=2048, depth=2)
    decoded = []
    real = d._decode
    monkeypatch.setattr(d, "_decode", lambda ctx: decoded.append(tuple(ctx.tokens)) or real(ctx))
    monkeypatch.setattr(ModelDrafter, "MEMO", 2)
    a = d.draft(DraftContext(step=0, tokens=[5, 17, 300]))
    a.fill_(0.0)
    b = d.draft(DraftContext(step=3, tokens=[5, 17, 300]))  # the step does not matter, the tokens do
    assert decoded == [(5, 17, 300)] and b.abs().sum() > 0
    assert torch.equal(b, ModelDrafter(DRAFTER, vocab_size=2048, depth=2).draft(DraftContext(step=0, tokens=[5, 17, 300])))
    d.draft(DraftContext(step=0, tokens=[5, 17, 301]))
    d.draft(DraftContext(step=0, tokens=[5, 17, 302]))  # past MEMO = 2: (5, 17, 300), the oldest, goes
    d.draft(DraftContext(step=0, tokens=[5, 17, 300]))
    assert decoded == [(5, 17, 300), (5, 17, 301), (5, 17, 302), (5, 17, 300)]


def test_the_gate_on_the_trained_model(tmp_path):
    """Learned gates and a real drafter: the leak is exercised in every budget and the hybrid-unsafe
    mode fails the gate on the trained model, by these rules; the exact path passes its own."""
    r = run_cli("gate", "--policy", "hybrid-unsafe", *AUDIT, "--out", tmp_path / "g")
    assert r.returncode == 1, r.stdout + r.stderr
    violated = sorted(l.split(":")[0].removeprefix("VIOLATED ") for l in r.stdout.splitlines()
                      if l.startswith("VIOLATED"))
    assert violated == ["argmax_flip_rate_above_noise", "decision_flip_rate", "generations_leaving_greedy_above_noise",
                        "silent_corruption_steps"], r.stdout
    rep = json.loads((tmp_path / "g" / "report.json").read_text())
    assert rep["config"]["drafter"] == {"kind": "model", "path": str(DRAFTER), "sha256": rep["config"]["drafter"]["sha256"],
                                        "depth": 8}
    from ddsim.model.checkpoint import checkpoint_digest
    assert rep["config"]["drafter"]["sha256"] == checkpoint_digest(DRAFTER)
    assert rep["provenance"]["source"] == f"checkpoint {TARGET}"
    assert all(b["modes"]["exact"]["generations_leaving_greedy"] == 0 for b in rep["budgets"])
    m = run_cli("gate", "--policy", "hybrid-unsafe", "--report", tmp_path / "g" / "report.json",
                "--drafter-model", TARGET)
    assert m.returncode == 2 and "--drafter-model" in m.stderr and "does not match" in m.stderr


@pytest.mark.parametrize("args, needle", [
    (["--drafter-model", DRAFTER, "--trace", PROMPTS], "--drafter-model: not with --trace"),
    (["--preset", "tiny", "--drafter-model", DRAFTER], "--drafter-model"),
    (["--model", TARGET, "--drafter-model", MODELS / "nope"], "not a directory"),
])
def test_drafter_model_bad_input(tmp_path, args, needle):
    one_line_error(run_cli("audit", *args, "--out", tmp_path / "o"), needle)
    assert not (tmp_path / "o").exists()
