"""Generations in lock step (ddsim.sim.generate.speculative_lockstep): the oracle answers each round's trees
of every prompt as one batch, and every generation is the one it would be alone."""
import math

import numpy as np
import pytest

from ddsim import oracle
from ddsim.errors import InputError
from ddsim.measure.distributed import Shard
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.model.weights import weight_shapes as audit_shapes
from ddsim.sim.drafters import SyntheticDrafter
from ddsim.sim.generate import OracleRequest, TreePolicy, run_lockstep, speculative, speculative_lockstep

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9], [7, 7]]  # contexts of different lengths


def _setup():
    cfg = get_preset("micro")
    w = init_weights(cfg, seed=0)
    kw = dict(drafter=SyntheticDrafter(vocab_size=cfg.vocab_size, depth=4, seed=1), policy=TreePolicy("ddtree", 8),
              mode="leaky", steps=3, measure="full", weights=w, attribution=("leaky-state",))
    return cfg, HybridModel(cfg, w), kw


def _batches(monkeypatch):
    sizes = []
    real = oracle.verify_trees

    def counted(weights, cfg, items, **k):
        sizes.append(len(items))
        return real(weights, cfg, items, **k)
    monkeypatch.setattr(oracle, "verify_trees", counted)
    return sizes


def test_lockstep_generations_equal_each_alone_with_the_oracle_batched(monkeypatch):
    cfg, m, kw = _setup()
    alone = [speculative(m, p, **kw) for p in PROMPTS]
    sizes = _batches(monkeypatch)
    together = speculative_lockstep(m, PROMPTS, **kw)
    assert sizes == [3, 3, 3]  # three rounds, each the three prompts' trees in one oracle batch
    for a, b in zip(alone, together):
        assert b.tokens == a.tokens
        assert [s.emitted for s in b.steps] == [s.emitted for s in a.steps]
        assert [s.decision_flips for s in b.steps] == [s.decision_flips for s in a.steps]
        for sa, sb in zip(a.steps, b.steps):
            assert sa.nodes.keys() == sb.nodes.keys() == {"leaky", "exact", "leaky-state"}
            for mode in sa.nodes:
                for key, va in sa.nodes[mode].items():
                    np.testing.assert_allclose(sb.nodes[mode][key], va, rtol=1e-6, atol=1e-12, err_msg=f"{mode} {key}")


@pytest.mark.interpreter
@pytest.mark.slow  # the Triton kernels in the interpreter
def test_lockstep_through_the_graph_machinery_with_states_equals_the_model():
    """The audit's leaky generations on a GPU: verifies with per-node states through ddsim.model.graphs (here
    uncaptured, Triton kernels in the interpreter), one set of buffers for every mode, and the drafter's
    greedy continuations through the serving path. Each result is measured and committed before the
    next verify reuses the buffers (node_metrics refuses a reused one), so the generations equal the
    model's own: the same tokens, decisions and, within float32 rounding, leak metrics."""
    from ddsim.model.graphs import GraphedModel
    cfg, m, kw = _setup()
    fast = HybridModel(cfg, kw["weights"], backend="triton")
    gm = GraphedModel(fast, capture=False)
    kw = {**kw, "steps": 2, "attribution": ("leaky-state", "leaky-conv")}
    plain = speculative_lockstep(m, PROMPTS[:2], **kw)
    graphed = speculative_lockstep(gm, PROMPTS[:2], serving=gm, **kw)
    keys = gm.captured()  # one graph with states (the four modes side by side); the serving ones
    assert [k for k in keys if k[4]] == [("any", 36, 4, 256, True)] and {k[0] for k in keys if not k[4]} == {"exact"}
    for a, b in zip(plain, graphed):
        assert b.tokens == a.tokens and [s.emitted for s in b.steps] == [s.emitted for s in a.steps]
        for sa, sb in zip(a.steps, b.steps):
            assert list(sb.nodes) == list(sa.nodes) == ["leaky", "exact", "leaky-state", "leaky-conv"]
            for mode in sa.nodes:
                for key in ("state_rel", "conv_rel", "hidden_rel", "kl"):
                    np.testing.assert_allclose(sb.nodes[mode][key], sa.nodes[mode][key], rtol=1e-3, atol=1e-5,
                                               err_msg=f"{mode} {key}")


def test_no_generation_holds_an_oracle_answer_past_its_step(monkeypatch):
    """The oracle's answers carry every node's per-layer states (gigabytes per tree at full size): by
    the time the oracle answers a round, every answer of the round before is gone."""
    import gc
    import weakref
    cfg, m, kw = _setup()
    real, earlier, alive = oracle.verify_trees, [], []

    def watched(weights, cfg, items, **k):
        gc.collect()
        alive.append(sum(r() is not None for r in earlier))
        out = real(weights, cfg, items, **k)
        earlier.extend(weakref.ref(o) for o in out)
        return out
    monkeypatch.setattr(oracle, "verify_trees", watched)
    speculative_lockstep(m, PROMPTS, max_trees=2, **kw)
    assert len(alive) == 6 and alive[0] == 0
    assert all(n <= 0 for n in alive[1:]), alive  # not one answer of an earlier batch outlives it


def test_generations_that_need_greedy_continuations_share_the_rounds_oracle_batch(monkeypatch):
    """A generation on its reference takes its drafter's greedy path from it; one without a reference
    asks for a continuation first. Both kinds reach the same round's oracle batch, and the
    continuations of one round are decoded as one batch."""
    import ddsim.sim.generate as gen
    cfg, m, kw = _setup()
    refs = [speculative(m, p, **{**kw, "measure": "decisions", "mode": "exact"}).tokens for p in PROMPTS]
    sizes = _batches(monkeypatch)
    decoded, real = [], gen.greedy_rows

    def counted(model, reqs):
        decoded.append(len(reqs))
        return real(model, reqs)
    monkeypatch.setattr(gen, "greedy_rows", counted)
    mixed = speculative_lockstep(m, PROMPTS, references=[refs[0], None, refs[2]], **kw)
    assert sizes == [3, 3, 3]  # every round one batch of all three trees
    assert decoded and max(decoded) >= 1 and sum(decoded) >= 3  # prompt 1 asks every step
    alone = [speculative(m, p, reference=r, **kw) for p, r in zip(PROMPTS, [refs[0], None, refs[2]])]
    assert [g.tokens for g in mixed] == [g.tokens for g in alone]


def test_max_trees_splits_a_round(monkeypatch):
    cfg, m, kw = _setup()
    sizes = _batches(monkeypatch)
    speculative_lockstep(m, PROMPTS, max_trees=2, **{**kw, "steps": 1})
    assert sizes == [2, 1]
    with pytest.raises(InputError, match="max_trees"):
        speculative_lockstep(m, PROMPTS, max_trees=0, **kw)


def test_every_prompt_is_checked_before_any_generation_starts():
    cfg, m, kw = _setup()
    steps = []
    with pytest.raises(InputError, match="outside the vocabulary"):
        speculative_lockstep(m, [PROMPTS[0], [cfg.vocab_size]], on_step=steps.append, **kw)
    assert steps == []
    with pytest.raises(InputError, match="references"):
        speculative_lockstep(m, PROMPTS, references=[None], **kw)


def test_run_lockstep_answers_each_round_together_in_order():
    def gen(name, rounds):
        got = []
        for r in range(rounds):
            got.append((yield OracleRequest(state=None, parents=[name, r], tokens=[])))
        return name, got
    asked = []

    def answer(reqs):
        asked.append([q.parents for q in reqs])
        return [f"{q.parents[0]}{q.parents[1]}" for q in reqs]
    out = run_lockstep([gen("a", 2), gen("b", 0), gen("c", 3)], answer)
    assert out == [("a", ["a0", "a1"]), ("b", []), ("c", ["c0", "c1", "c2"])]
    assert asked == [[["a", 0], ["c", 0]], [["a", 1], ["c", 1]], [["c", 2]]]


def test_a_share_is_computed_as_one_group():
    calls = []

    def fn(idx):
        calls.append(idx)
        return [i * 10 for i in idx]
    assert Shard.single().run_group(fn, 4) == [0, 10, 20, 30]
    assert calls == [[0, 1, 2, 3]]
    assert Shard.single().run(lambda i: i + 1, 3) == [1, 2, 3]


def test_the_audit_reports_its_phases_and_oracle_batches():
    from ddsim.measure.audit import run_audit
    from ddsim.measure.settings import AuditConfig
    timings = {}
    run_audit(AuditConfig(preset="micro", budgets=[4], steps=2, n_prompts=3, seed=2), timings=timings)
    assert {"references", "chain", "decision-only generations, budget 4", "leaky generations in lock step, budget 4",
            "  of which the oracle, budget 4", "  of which drafts and trees, budget 4",
            "  of which (leaky generations) drafts and trees, budget 4"} <= timings.keys()
    assert timings["  oracle batches (trees), budget 4"] == [3, 3]  # two rounds of the three prompts' trees
    assert 0 < timings["  of which the oracle, budget 4"] < timings["leaky generations in lock step, budget 4"]


def test_the_audit_puts_as_many_modes_side_by_side_as_a_fifth_of_the_device_holds(monkeypatch):
    """side_by_side at Qwen3.6-27B shapes (about 159 MB of per-node states a node): on an H200 (139.8 GiB) all
    four modes a replay at budget 16, two at budget 64 (replayed two and two), one where even one
    copy exceeds the share; every mode a replay off CUDA (the model verifies them one by one anyway)."""
    import types

    import torch

    from ddsim.measure import audit
    from ddsim.model.graphs import copies_per_replay
    m = types.SimpleNamespace(cfg=get_preset("qwen3.6-27b"), device=torch.device("cuda"), state_dtype=torch.float32,
                              dtype=torch.bfloat16)
    memory = {"total_memory": int(139.8 * 2**30)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(**memory))
    assert [audit.side_by_side(m, n, 4) for n in (17, 65, 257)] == [4, 2, 1]
    assert [copies_per_replay(4, audit.side_by_side(m, n, 4)) for n in (17, 65)] == [4, 2]
    memory["total_memory"] = 24 * 2**30
    assert audit.side_by_side(m, 65, 4) == 1
    assert audit.side_by_side(types.SimpleNamespace(**{**vars(m), "device": torch.device("cpu")}), 65, 4) == 4


def test_the_oracle_batch_fits_three_quarters_of_the_free_memory_less_the_reserve(monkeypatch):
    import torch

    from ddsim.measure import audit
    cfg = get_preset("micro")
    b = 8  # float64 on the CPU
    rec = sum(math.prod(cfg.state_shape(l)) + math.prod(cfg.window_shape(l)) for l in cfg.recurrent_layers)
    layer = max(math.prod(cfg.state_shape(l)) + math.prod(cfg.window_shape(l)) for l in cfg.recurrent_layers)
    assert 0 < layer < rec
    wide, deep = [-1, 0, 0, 0, 1, 1, 2, 2, 3], [-1, 0, 1, 2, 3, 4, 5, 6, 0]  # widest levels: 5 and 2 nodes
    d = cfg.hidden_size
    act = 8 * d + 3 * cfg.intermediate_size + max(cfg.window_shape(l)[0] for l in cfg.recurrent_layers)
    # each node's row, with a layer's states and every layer's hidden states once more: gathered for the batch
    row = cfg.num_layers * d + cfg.vocab_size + act + layer + cfg.num_layers * d
    assert audit.oracle_tree_bytes(cfg, wide, torch.device("cpu")) == b * (9 * (rec + row) + 4 * 5 * layer)
    assert audit.oracle_tree_bytes(cfg, deep, torch.device("cpu")) == b * (9 * (rec + row) + 4 * 2 * layer)
    fixed = audit.oracle_batch_bytes(cfg, torch.device("cpu"))  # the LM head or a layer, converted once a batch
    assert fixed == b * max(cfg.vocab_size * d, max(sum(math.prod(s) for n, s in audit_shapes(cfg).items()
                                                        if n.startswith(f"layers.{i}.")) for i in range(cfg.num_layers)))
    need = audit.oracle_tree_bytes(cfg, wide, torch.device("cpu"))
    reqs = [OracleRequest(None, deep, None)] * 31 + [OracleRequest(None, wide, None)]  # the largest sets the size
    for free, want in ((None, 1), (0, 1), (fixed + 4 * need, 3), (fixed + 4 * need - 4, 2), (10**15, 32)):
        monkeypatch.setattr(audit, "available_memory", lambda d, f=free: f)
        assert audit.OracleBatches(cfg, torch.device("cpu"))(reqs) == want, free
    monkeypatch.setattr(audit, "available_memory", lambda d: fixed + 4 * need + 100)
    assert audit.OracleBatches(cfg, torch.device("cpu"), reserve=100)(reqs) == 3
    assert audit.OracleBatches(cfg, torch.device("cpu"), reserve=101)(reqs) == 2
    held = [101]  # asked each round: what the fast path will still allocate, 0 once it has
    fit = audit.OracleBatches(cfg, torch.device("cpu"), reserve=lambda: held[0])
    assert fit(reqs) == 2
    held[0] = 0
    assert fit(reqs) == 3
    sizes = _batches(monkeypatch)
    cfg, m, kw = _setup()
    speculative_lockstep(m, PROMPTS, max_trees=lambda reqs: len(reqs) - 1, **{**kw, "steps": 1})
    assert sizes == [2, 1]  # asked per round


def test_once_batches_have_run_their_measured_footprint_sizes_the_next(monkeypatch):
    """After a batch has run on a GPU, the need per tree is the largest footprint per node seen so far
    (peak over what was allocated before), times the tree's nodes and a 10% margin, in 90% of the free
    memory less the reserve; a footprint that is not positive, or of no nodes, changes nothing."""
    import torch

    from ddsim.measure import audit
    cfg = get_preset("micro")
    nine, five = [-1, 0, 0, 0, 1, 1, 2, 2, 3], [-1, 0, 1, 2, 3]
    reqs = [OracleRequest(None, five, None)] * 199 + [OracleRequest(None, nine, None)]  # the largest sets the size
    monkeypatch.setattr(audit, "available_memory", lambda d: 10_000_000 + 1000)
    fit = audit.OracleBatches(cfg, torch.device("cpu"), reserve=1000)
    static = fit(reqs)
    fit.observe(reqs[:2], 0)
    fit.observe([], 5000)
    assert fit.per_node is None and fit(reqs) == static
    fit.observe([OracleRequest(None, five, None)] * 2, 10 * 10_000)  # 10,000 bytes a node
    assert fit.per_node == 10_000
    assert fit(reqs) == int(10_000_000 * 0.9 // (10_000 * 1.1 * 9)) == 90
    fit.observe([OracleRequest(None, nine, None)], 9 * 5_000)  # smaller: the largest seen stays
    assert fit(reqs) == 90 and fit(reqs[:30]) == 30  # at most the round
    fit.observe([OracleRequest(None, five, None)], 5 * 40_000)
    assert fit(reqs) == int(10_000_000 * 0.9 // (40_000 * 1.1 * 9)) == 22


def test_on_a_gpu_each_oracle_batch_tells_the_sizing_its_footprint():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("a GPU's peak memory")
    cfg, _, kw = _setup()
    w = init_weights(cfg, seed=0, device="cuda")
    seen = []

    class Sizes:
        def __call__(self, reqs):
            return 2

        def observe(self, reqs, footprint):
            seen.append((len(reqs), footprint))
    speculative_lockstep(HybridModel(cfg, w, device="cuda"), PROMPTS, max_trees=Sizes(), **{**kw, "weights": w, "steps": 2})
    assert [n for n, _ in seen] == [2, 1, 2, 1] and all(f > 0 for _, f in seen), seen


def test_a_blocks_footprint_and_the_process_peak_across_its_resets():
    """ddsim.sim.memory: a block's footprint is its own peak over what was allocated before it (CUDA's peak
    statistic reset for it), and peak_allocated still reports an earlier, higher peak until reset_peak."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("a GPU's allocator")
    import gc

    from ddsim.sim import memory
    # exact byte counts: an earlier test's tensors in this worker, freed by a garbage collection mid-test, would move
    # them (a run under xdist on an H200 was 5 KB off), so they are collected first and the collector held off
    gc.collect()
    torch.cuda.synchronize()
    gc.disable()
    try:
        memory.reset_peak("cuda")
        base = torch.cuda.memory_allocated()
        big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        del big
        with memory.footprint("cuda") as fp:
            small = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
        assert fp["before"] == base and fp["bytes"] == 16 << 20 and fp["peak"] == base + (16 << 20)
        assert torch.cuda.max_memory_allocated() == base + (16 << 20)  # the statistic was reset for the block
        assert memory.peak_allocated("cuda") == base + (64 << 20)  # the process's peak is kept
        del small
        memory.reset_peak("cuda")
        assert memory.peak_allocated("cuda") == base == torch.cuda.memory_allocated()
    finally:
        gc.enable()


def test_an_oracle_batch_that_runs_out_of_memory_is_split(monkeypatch):
    """The batch size is an estimate: a batch that runs out of device memory is answered in halves
    (the same generations), and a single tree that does not fit is an error, not a skip."""
    import torch
    cfg, m, kw = _setup()
    real, sizes = oracle.verify_trees, []

    def tight(weights, cfg, items, **k):
        sizes.append(len(items))
        if len(items) > 1:
            raise torch.OutOfMemoryError("planted")
        return real(weights, cfg, items, **k)
    monkeypatch.setattr(oracle, "verify_trees", tight)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    timings = {}
    split = speculative_lockstep(m, PROMPTS, timings=timings, **{**kw, "steps": 1})
    assert sizes == [3, 1, 2, 1, 1] and timings["oracle_splits"] == 2
    monkeypatch.setattr(oracle, "verify_trees", real)
    whole = speculative_lockstep(m, PROMPTS, **{**kw, "steps": 1})
    assert [g.tokens for g in split] == [g.tokens for g in whole]
    monkeypatch.setattr(oracle, "verify_trees", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("x")))
    with pytest.raises(torch.OutOfMemoryError):
        speculative_lockstep(m, PROMPTS, max_trees=1, **{**kw, "steps": 1})


def test_decision_only_generations_verify_each_rounds_trees_in_one_pass(monkeypatch):
    """measure="decisions": every round's serving verifies of one mode go through one batched pass
    (HybridModel.verify_rows: the mode's, then the exact one from the same states), and every
    generation is the one it is alone (where each verify is its own pass): the same tokens, steps
    and decisions."""
    cfg, m, kw = _setup()
    kw = {**kw, "measure": "decisions", "weights": None, "attribution": (), "mode": "leaky-state"}
    alone = [speculative(m, p, **kw) for p in PROMPTS]
    batches, real = [], HybridModel.verify_rows

    def counted(self, states, trees, *, mode="exact"):
        batches.append((mode if trees[0].size == 9 else "shadow", len(trees)))  # DDTree: 9 nodes; shadows: <= 5
        return real(self, states, trees, mode=mode)
    monkeypatch.setattr(HybridModel, "verify_rows", counted)
    assert all(len(a.steps) == 3 for a in alone) and batches == []  # alone: one tree a pass, never batched
    together = speculative_lockstep(m, PROMPTS, **kw)
    # per step the mode's verifies, then the exact ones, each of all three trees; between steps the
    # drafter shadows of the generations that left their own greedy path move on, in one pass
    assert [b for b in batches if b[0] != "shadow"] == [("leaky-state", 3), ("exact", 3)] * 3
    assert [b for b in batches if b[0] == "shadow"] and all(n <= 3 for _, n in batches if _ == "shadow")
    for a, b in zip(alone, together):
        assert b.tokens == a.tokens
        assert [s.emitted for s in b.steps] == [s.emitted for s in a.steps]
        assert [s.exact_emitted for s in b.steps] == [s.exact_emitted for s in a.steps]
        assert [s.decision_flips for s in b.steps] == [s.decision_flips for s in a.steps]


def test_verify_requests_groups_by_mode_and_size_and_keeps_the_order(monkeypatch):
    from ddsim.sim.generate import VerifyRequest, verify_requests
    from ddsim.trees.tree import Tree, chain
    cfg, m, _ = _setup()
    st = m.prefill([1, 2, 3])[0]
    a, b = Tree([-1, 0, 0], [4, 5, 6]), chain([7, 8])
    reqs = [VerifyRequest(st, a, "exact"), VerifyRequest(st, b, "exact"), VerifyRequest(st, a, "leaky"),
            VerifyRequest(st, a, "exact")]
    out = verify_requests(m, reqs)
    for q, r in zip(reqs, out):
        one = m.verify(q.state, q.tree, mode=q.mode, keep_states=False)
        assert r.mode == q.mode and r.logits.shape == one.logits.shape
        np.testing.assert_allclose(r.logits.numpy(), one.logits.numpy(), rtol=1e-5, atol=1e-5)
    import ddsim.sim.generate as gen
    monkeypatch.setattr(gen, "MAX_VERIFY_ROWS", 3)  # one tree of three nodes a pass
    batches, real = [], HybridModel.verify_rows
    monkeypatch.setattr(HybridModel, "verify_rows",
                        lambda self, s, t, mode="exact": batches.append(len(t)) or real(self, s, t, mode=mode))
    verify_requests(m, reqs)
    assert batches == [1, 1]  # the two exact trees of three nodes, one per pass


class _Recording:
    """A synthetic drafter that records what each step was shown: the context and its greedy path."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []
        self.depth, self.max_rank, self.needs_greedy = inner.depth, inner.max_rank, True

    def params(self):
        return self.inner.params()

    def draft(self, ctx):
        self.seen.append((list(ctx.tokens), list(ctx.greedy)))
        return self.inner.draft(ctx)


@pytest.mark.parametrize("mode", ["leaky", "leaky-conv", "exact"])
def test_the_drafters_greedy_path_is_the_targets_greedy_continuation_of_the_context(mode, monkeypatch):
    """However a generation gets its drafter's greedy path (its reference, its own continuation
    extended from the tip, or the shadow moved on and decoded afresh), every step sees the target's
    greedy continuation of exactly its context; a generation still on its own path decodes only the
    tokens past what it knows."""
    import ddsim.sim.generate as gen
    from ddsim.sim.generate import autoregressive
    cfg, m, kw = _setup()
    rec = _Recording(SyntheticDrafter(vocab_size=cfg.vocab_size, depth=4, seed=1))
    asked, real = [], gen.greedy_rows
    monkeypatch.setattr(gen, "greedy_rows", lambda model, reqs: asked.extend(q.n for q in reqs) or real(model, reqs))
    kw = {**kw, "measure": "decisions", "weights": None, "attribution": (), "mode": mode, "steps": 5, "drafter": rec}
    speculative_lockstep(m, PROMPTS, **kw)
    assert len(rec.seen) == 5 * len(PROMPTS)
    for tokens, greedy in rec.seen:
        assert greedy == autoregressive(m, tokens, 4), tokens
    if mode != "exact":
        assert any(n < 4 for n in asked), asked  # some steps extended their own path from its tip


def test_greedy_rows_continue_from_their_tips():
    """greedy_rows' tip continues the same greedy path: n tokens then m more from the tip equal n + m
    tokens at once, rows of different lengths in one call."""
    from ddsim.sim.generate import GreedyRequest, greedy_rows
    cfg, m, _ = _setup()
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    roots = [p[-1] for p in PROMPTS]
    whole = greedy_rows(m, [GreedyRequest(st, r, 6) for st, r in zip(states, roots)])
    first = greedy_rows(m, [GreedyRequest(st, r, n) for st, r, n in zip(states, roots, (2, 5, 1))])
    rest = greedy_rows(m, [GreedyRequest(tip, toks[-1], 6 - len(toks)) for toks, tip in first])
    for (w, _), (a, _), (b, _) in zip(whole, first, rest):
        assert a + b == w


def test_the_oracle_batch_with_bf16_products_converts_no_product_weight():
    """With bf16 products (a full-size bf16 model on a GPU) the oracle converts no product weight: what it holds
    once a batch is the largest layer's other weights (norms, conv filters, A_log), and each node needs its
    widest product's three partial results (the LM head's) on top; on the CPU it never takes them."""
    import torch

    from ddsim import oracle
    from ddsim.measure import audit
    from ddsim.model.weights import init_weights
    cpu = torch.device("cpu")
    for name in ("micro", "tiny-kimi", "tiny-jamba"):
        cfg = get_preset(name)
        shapes = audit_shapes(cfg)
        others = max(sum(math.prod(s) for n, s in shapes.items() if n.startswith(f"layers.{i}.")
                         and n.split(".", 2)[-1] not in oracle.PRODUCT_WEIGHTS)
                     for i in range(cfg.num_layers))
        assert audit.oracle_batch_bytes(cfg, cpu, bf16_products=True) == 8 * others
        assert 8 * others < audit.oracle_batch_bytes(cfg, cpu) / 4
        tree = [-1, 0, 0, 1]
        assert (audit.oracle_tree_bytes(cfg, tree, cpu, bf16_products=True)
                == audit.oracle_tree_bytes(cfg, tree, cpu) + 8 * 4 * 3 * cfg.vocab_size)
    w = init_weights(get_preset("micro"), seed=0)
    assert not oracle.takes_bf16_products(w) and not oracle.takes_bf16_products({k: v.bfloat16() for k, v in w.items()})
