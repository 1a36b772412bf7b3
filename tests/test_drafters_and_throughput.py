"""Trace replay, the synthetic drafter's knobs, generation bad input and the throughput model."""
import json

import pytest
import torch

from ddsim.errors import InputError
from ddsim.measure.throughput import CostModel, speedup_table
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.sim.drafters import DraftContext, SyntheticDrafter, TraceDrafter
from ddsim.sim.generate import TreePolicy, autoregressive, speculative

CFG = get_preset("micro")


def _write(tmp_path, lines, name="trace.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
    return p


def _rec(step, depths, vocab=CFG.vocab_size):
    return {"step": step, "vocab_size": vocab, "depths": depths}


def test_trace_replay_builds_the_listed_tree(tmp_path):
    p = _write(tmp_path, [_rec(0, [[[5, -0.1], [7, -2.5]], [[3, -0.2], [9, -1.9]]])])
    d = TraceDrafter(p, vocab_size=CFG.vocab_size)
    logits = d.draft(DraftContext(step=0, tokens=[1]))
    tree = TreePolicy("ddtree", 6).build(logits, root_token=1, max_rank=d.max_rank)
    assert set(tree.tokens[1:]) <= {5, 7, 3, 9}
    assert tree.tokens[1] == 5 and tree.size == 7  # 2 + 4 paths with top-k capped at the listed 2


@pytest.mark.parametrize("lines, msg", [
    ([_rec(0, [[[5, -0.1]], [[3, -0.2]]]), _rec(1, [[[5, -0.1]]])], r"trace.jsonl:2: 1 depths, earlier lines have 2"),
    ([_rec(0, [[[5, -0.1]], []])], r"trace.jsonl:1: depth 2 has no candidates"),
    ([_rec(0, [[[CFG.vocab_size, -0.1]]])], r"trace.jsonl:1: depth 1: unknown token"),
    (['{"step": 0, "vocab_size": 48, "depths": [[[1, NaN]]]}'], r"trace.jsonl:1: NaN is not a JSON number"),
    (['{"step": 0, "step": 1, "vocab_size": 48, "depths": [[[1, -0.1]]]}'], r"trace.jsonl:1: key 'step' appears twice"),
    ([_rec(0, [[[1, -0.1]]], vocab=1000)], r"trace.jsonl:1: vocab_size 1000 differs"),
    (["{not json"], r"trace.jsonl:1: malformed JSON"),
    ([_rec(3, [[[1, -0.1]]])], r"trace.jsonl:1: step 3 out of order"),
    # JSON's false, true and 0.0 equal 0 and 1 in Python: a logprob false was taken as 0.0, a step 0.0 as step 0
    ([_rec(0, [[[1, False]]])], r"trace.jsonl:1: depth 1: logprob False is not a finite log-probability"),
    ([_rec(0.0, [[[1, -0.1]]])], r"trace.jsonl:1: 'step' must be an integer, got 0.0"),
    ([_rec(False, [[[1, -0.1]]])], r"trace.jsonl:1: 'step' must be an integer, got False"),
    ([_rec(0, [[[1, -0.1]]], vocab=float(CFG.vocab_size))], r"trace.jsonl:1: 'vocab_size' must be an integer, got"),
    ([], r"trace has no records"),
])
def test_trace_bad_input_names_file_and_line(tmp_path, lines, msg):
    with pytest.raises(InputError, match=msg):
        TraceDrafter(_write(tmp_path, lines), vocab_size=CFG.vocab_size)


def test_trace_missing_file(tmp_path):
    with pytest.raises(InputError, match="cannot read trace"):
        TraceDrafter(tmp_path / "nope.jsonl", vocab_size=CFG.vocab_size)


def test_synthetic_drafter_accuracy_knob():
    greedy = list(range(8))
    ctx = DraftContext(step=0, tokens=[0], greedy=greedy)
    perfect = SyntheticDrafter(vocab_size=CFG.vocab_size, depth=8, accuracy=1.0, accuracy_decay=1.0).draft(ctx)
    assert perfect.argmax(-1).tolist() == greedy
    never = SyntheticDrafter(vocab_size=CFG.vocab_size, depth=8, accuracy=0.0, recall=0.5).draft(ctx)
    assert all(never[d].argmax() != greedy[d] for d in range(8))
    # recall keeps the right token near the top: over 240 draws, second place typically, rank <= 3
    # (0-based: how many tokens beat it) in at least 95% of draws
    ranks = []
    for seed in range(10):
        for step in range(3):
            d = SyntheticDrafter(vocab_size=CFG.vocab_size, depth=8, accuracy=0.0, recall=0.5, seed=seed)
            x = d.draft(DraftContext(step=step, tokens=[0], greedy=greedy))
            ranks += [(x[i] > x[i, greedy[i]]).sum().item() for i in range(8)]
    assert sorted(ranks)[len(ranks) // 2] == 1 and sum(r <= 3 for r in ranks) >= 0.95 * len(ranks)
    with pytest.raises(InputError, match="accuracy"):
        SyntheticDrafter(vocab_size=10, accuracy=1.5)


def test_synthetic_drafter_kept_draws_are_the_fresh_ones():
    """A step's draws are kept for the generations that ask for the same step later: each draft is
    bit for bit what a fresh drafter draws, in any order of steps, past the steps kept, and planting
    the tokens never writes into the kept background."""
    def ctx(step, g):
        return DraftContext(step=step, tokens=[0], greedy=[(g * 31 + step * 7 + d) % CFG.vocab_size for d in range(6)])
    shared = SyntheticDrafter(vocab_size=CFG.vocab_size, depth=6, seed=5, accuracy=0.5)
    order = [0, 0, 1, 0, 2, 3, 4, 5, 0, 5, 5, 1]  # step 0 revisited after it was let go
    for g, step in enumerate(order):
        fresh = SyntheticDrafter(vocab_size=CFG.vocab_size, depth=6, seed=5, accuracy=0.5).draft(ctx(step, g))
        assert torch.equal(shared.draft(ctx(step, g)), fresh), (g, step)
    assert len(shared._kept) == SyntheticDrafter.DRAWS_KEPT


def test_synthetic_drafter_means_the_same_at_a_real_vocabulary():
    """The knobs give the planted tokens the same probability on the 512-token preset and at
    Qwen3.6's 248,320 tokens, so DDTree grows the same depth there instead of depth-1 siblings."""
    def stats(V):
        d = SyntheticDrafter(vocab_size=V, depth=8, seed=3)
        probs, depths = [], []
        for step in range(40):
            greedy = [(step * 97 + 13 * i) % V for i in range(8)]
            logits = d.draft(DraftContext(step=step, tokens=[0], greedy=greedy))
            p = logits.softmax(-1)
            probs += p.max(-1).values.tolist()
            depths.append(max(TreePolicy("ddtree", 16).build(logits, root_token=0).depths))
        return sum(probs) / len(probs), sum(depths) / len(depths)

    (p_small, depth_small), (p_big, depth_big) = stats(512), stats(248320)
    assert 0.5 < p_small < 0.95
    assert abs(p_big - p_small) < 0.05, (p_small, p_big)
    assert depth_big >= depth_small - 1, (depth_small, depth_big)


def test_generation_bad_input():
    m = HybridModel(CFG, init_weights(CFG, seed=0))
    d = SyntheticDrafter(vocab_size=CFG.vocab_size, depth=2)
    with pytest.raises(InputError, match="steps"):
        autoregressive(m, [1], 0)
    with pytest.raises(InputError, match="steps"):
        speculative(m, [1], steps=0, drafter=d, policy=TreePolicy())
    with pytest.raises(InputError, match="exceed the model's 512 positions"):
        autoregressive(m, [1] * 600, 4)
    with pytest.raises(InputError, match="prompt: empty"):
        autoregressive(m, [], 4)


def test_throughput_model(tmp_path):
    cost = CostModel(node_cost=0.1, draft_cost=0.0)
    rows = speedup_table([{"label": "chain", "mode": "exact", "tokens_per_step": 2.0, "nodes": 5},
                          {"label": "ddtree-16", "mode": "exact", "tokens_per_step": 3.0, "nodes": 17}], cost)
    assert rows[0]["speedup_vs_ar"] == pytest.approx(2.0 / 1.4)
    assert rows[1]["speedup_vs_ar"] == pytest.approx(3.0 / 2.6)
    assert rows[1]["speedup_vs_chain"] == pytest.approx((3.0 / 2.6) / (2.0 / 1.4))
    f = tmp_path / "cost.json"
    f.write_text(json.dumps({"ar_step_us": 100, "verify_us": {"1": 100, "65": 200}, "draft_us": 10}))
    c = CostModel.from_file(f)
    assert c.verify_cost(33) == pytest.approx(1.5) and c.draft_cost == pytest.approx(0.1)
    f.write_text("{}")
    with pytest.raises(InputError, match="not a cost file"):
        CostModel.from_file(f)


@pytest.mark.parametrize("content, needle", [
    ('{"ar_step_us": NaN, "verify_us": {"1": 100}}', "NaN is not a JSON number"),
    ('{"ar_step_us": 100, "verify_us": {"1": -5}}', r"verify_us\[1\] must be a finite number > 0"),
    ('{"ar_step_us": 0, "verify_us": {"1": 5}}', "ar_step_us must be a finite number > 0"),
    ('{"ar_step_us": 1e999, "verify_us": {"1": 5}}', "ar_step_us must be a finite number > 0"),
    ('{"ar_step_us": 100, "verify_us": {"1": 5}, "draft_us": -1}', "draft_us must be a finite number >= 0"),
    ('{"ar_step_us": 100, "verify_us": {"x": 5}}', "verify_us key 'x' is not a node count"),
    ('{"ar_step_us": 100, "verify_us": {"1": 5}, "mode_factor": {"leakey": 2}}', "mode_factor names no verify mode"),
    ('{"ar_step_us": 100, "verify_us": {"1": 5}, "mode_factor": {"leaky": 0}}', r"mode_factor\[leaky\] must be"),
    ('{"ar_step_us": 100, "verify_us": {"1": 5}, "draftus": 3}', "unknown key 'draftus'"),
    ('{"ar_step_us": 100, "ar_step_us": 5, "verify_us": {"1": 5}}', "key 'ar_step_us' appears twice"),
])
def test_cost_file_refuses_figures_it_cannot_trust(tmp_path, content, needle):
    """A cost file with a NaN, negative, zero or unknown figure would turn speedups null or negative."""
    f = tmp_path / "cost.json"
    f.write_text(content)
    with pytest.raises(InputError, match=needle):
        CostModel.from_file(f)


def test_every_drafter_satisfies_the_protocol():
    """The loop and the audit use depth, max_rank, needs_greedy, draft() and params() of any drafter."""
    import inspect

    from ddsim.properties.strategies import RandomDrafter
    from ddsim.sim.drafters import Drafter, SyntheticDrafter
    members = ("depth", "max_rank", "needs_greedy", "draft", "params")
    for d in (SyntheticDrafter(vocab_size=48, depth=3), RandomDrafter(vocab_size=48, depth=3, seed=1)):
        for name in members:
            assert hasattr(d, name), (type(d).__name__, name)
        assert isinstance(d.params()["kind"], str)
    assert {n for n, _ in inspect.getmembers(Drafter) if not n.startswith("_")} >= {"draft", "params"}


def test_derived_seeds_are_stable_and_separate_streams():
    from ddsim.trees.seeds import derive_seed
    assert derive_seed(0, "a", 1) == derive_seed(0, "a", 1)
    assert len({derive_seed(s, st, i) for s in (0, 1) for st in ("a", "b") for i in (0, 1)}) == 8
    assert 0 <= derive_seed(2**62, "x", 10**9) < 2**63
    with pytest.raises(ValueError):
        derive_seed(-1, "a")
