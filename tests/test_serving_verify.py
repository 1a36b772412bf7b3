"""The serving verify (no per-node states, commit by replay) and ddsim.model.graphs' machinery on the CPU:
the fixed buffers, fixed-capacity KV prefix and refilled StaticPlan of the CUDA-graph path run without
capture, with the Triton kernels in the interpreter (the GPU suite replays real graphs:
properties/test_cuda_graphs.py)."""
import numpy as np
import pytest
import torch

from ddsim.errors import InputError
from ddsim.gpu_backend.checks import TreePlan
from ddsim.measure.compare import assert_per_node_close
from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel, StaticPlan, prefix_capacity, wy_rounds
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.sim.generate import TreePolicy, speculative
from ddsim.trees.tree import Tree

# three trees of 8 nodes whose depths (3, 4, 3) need the same two WY doubling rounds: one graph key
TREES = [Tree([-1, 0, 0, 1, 1, 2, 3, 4], [5, 1, 2, 3, 4, 6, 7, 8]),
         Tree([-1, 0, 1, 1, 0, 2, 3, 5], [5, 9, 1, 2, 3, 4, 6, 7]),
         Tree([-1, 0, 0, 0, 1, 2, 3, 6], [5, 1, 2, 3, 4, 6, 7, 8])]
MODES = ("exact", "leaky", "leaky-state", "leaky-conv")


def _config(preset):
    """A preset, or "micro-kls": micro with a KDA, a Mamba1 and a lightning layer (dense) after its attention."""
    if preset == "micro-kls":
        return get_preset("micro").replace(layer_pattern="aksl", linear_num_value_heads=1, linear_value_head_dim=8,
                                           mamba1_inner=16, mamba_state_size=4)
    return get_preset(preset)


def _models(preset, backend=None):
    cfg = _config(preset)
    w = init_weights(cfg, seed=0)
    return cfg, HybridModel(cfg, w), HybridModel(cfg, w, backend=backend)


def test_the_trees_share_one_key():
    assert {wy_rounds(int(t.depths.max())) for t in TREES} == {2}
    assert len({t.parents for t in TREES}) == 3


@pytest.mark.interpreter
@pytest.mark.slow  # the Triton kernels in the interpreter (the same machinery with PyTorch's ops: properties/test_model_fastpath.py)
@pytest.mark.parametrize("preset", ["micro", "micro-mamba2", "micro-lfm2", "micro-kls"])
def test_graph_machinery_with_triton_kernels_equals_the_serving_verify(preset):
    """Triton kernels read the StaticPlan's tables (conv sources, ancestor masks, root paths): refilled
    per tree, the graph path equals the model's own serving verify and the per-node torch path within
    float32 rounding (attention over the fixed-capacity prefix groups its sums differently), tree
    after tree on one key."""
    cfg, ref, fast = _models(preset, backend="triton")
    gm = GraphedModel(fast, capture=False)
    st, _ = ref.prefill([1, 2, 3, 4, 5])
    for mode in ("exact", "leaky"):
        for t in TREES:
            a, b, full = fast.verify(st, t, mode=mode, keep_states=False), gm.verify(st, t, mode=mode), \
                ref.verify(st, t, mode=mode)
            torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(b.logits, full.logits, rtol=1e-4, atol=1e-4)
            sa, sb, sf = fast.commit(st, t, a, 7), gm.commit(st, t, b, 7), ref.commit(st, t, full, 7)
            assert sb.pos == sa.pos == st.pos + len(t.root_path(7))
            for i in cfg.attention_layers:
                torch.testing.assert_close(sb.kv[i][0], sa.kv[i][0], rtol=1e-5, atol=1e-5)
            for i in cfg.recurrent_layers:
                torch.testing.assert_close(sb.ssm[i], sa.ssm[i], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(sb.conv[i], sa.conv[i], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(sb.ssm[i], sf.ssm[i], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(sb.conv[i], sf.conv[i], rtol=1e-5, atol=1e-6)
    assert gm.captured() == [("exact", 8, 2, 256, False), ("leaky", 8, 3, 256, False)]


@pytest.mark.interpreter
@pytest.mark.slow  # the Triton kernels in the interpreter
@pytest.mark.parametrize("preset", ["micro", "micro-mamba2", "micro-kls"])
def test_graph_machinery_keeping_per_node_states_equals_the_model(preset):
    """verify(keep_states=True) through the fixed buffers (uncaptured): every node's states, windows,
    hidden states and logits equal the model's own verify with states within float32 rounding, tree
    after tree of different depths on one key for every mode (no WY solve); the commit takes the
    accepted node's states, and a result whose buffers a later verify of its key reused is refused."""
    cfg, ref, fast = _models(preset, backend="triton")
    gm = GraphedModel(fast, capture=False)
    st, _ = ref.prefill([1, 2, 3, 4, 5])
    deep = Tree(list(range(-1, 7)), [5, 1, 2, 3, 4, 6, 7, 8])  # depth 7: three WY rounds in a serving key
    tol = dict(rtol=1e-5, atol=1e-5)
    for mode in ("exact", "leaky"):
        for t in (TREES[0], deep, TREES[1]):  # depths 3, 7, 4 on one key
            b, full = gm.verify(st, t, mode=mode, keep_states=True), ref.verify(st, t, mode=mode)
            assert_per_node_close(b, full, cfg.recurrent_layers, msg=f"{mode}: ", **tol)
            sb, sf = gm.commit(st, t, b, 5), ref.commit(st, t, full, 5)
            for i in cfg.recurrent_layers:
                torch.testing.assert_close(sb.ssm[i], sf.ssm[i], **tol)
            assert sb.pos == sf.pos
    assert gm.captured() == [("any", 8, 1, 256, True)]  # one graph (and one set of buffers) for every mode
    first = gm.verify(st, TREES[0], mode="leaky", keep_states=True)
    gm.verify(st, TREES[0], mode="exact", keep_states=True)
    with pytest.raises(InputError, match="reused"):
        gm.commit(st, TREES[0], first, 2)
    from ddsim import oracle
    from ddsim.errors import MeasurementError
    from ddsim.measure.metrics import node_metrics
    ref_out = oracle.verify_tree(init_weights(cfg, seed=0), cfg, st, TREES[0].parents, TREES[0].tokens)
    with pytest.raises(MeasurementError, match="reused"):
        node_metrics(TREES[0], first, ref_out, cfg)


@pytest.mark.interpreter
@pytest.mark.slow  # the Triton kernels in the interpreter
@pytest.mark.parametrize("preset, order", [("micro", ("leaky", "exact", "leaky-state", "leaky-conv")),
                                           ("micro-mamba2", ("leaky-conv", "exact", "leaky", "leaky-state")),
                                           ("micro-kls", ("leaky-state", "leaky", "leaky-conv", "exact"))])
def test_several_modes_verified_side_by_side_equal_each_verified_alone(preset, order):
    """verify_modes: the tree copied once per mode into one pass (uncaptured), each copy's root on the
    committed state, its sources its mode's, its attention its own: every mode's per-node states,
    windows, hidden states, KV and logits equal the model's own verify of that mode within float32
    rounding, whatever the order of the modes, tree after tree on one key; the commit of a copy takes its
    accepted node's states, and every copy is stale after the key's next verify."""
    cfg, ref, fast = _models(preset, backend="triton")
    gm = GraphedModel(fast, capture=False)
    st, _ = ref.prefill([1, 2, 3, 4, 5])
    tol = dict(rtol=1e-5, atol=1e-5)
    for t in TREES[:2]:
        results = list(gm.verify_modes(st, t, modes=order))
        assert [r.mode for r in results] == list(order)
        full = {}
        for r in results:
            full[r.mode] = ref.verify(st, t, mode=r.mode)
            assert_per_node_close(r, full[r.mode], cfg.recurrent_layers, msg=f"{r.mode}: ", **tol)
            for i in cfg.attention_layers:
                torch.testing.assert_close(r.kv[i][0], full[r.mode].kv[i][0], **tol)
                torch.testing.assert_close(r.kv[i][1], full[r.mode].kv[i][1], **tol)
        sb, sf = gm.commit(st, t, results[1], 6), ref.commit(st, t, full[order[1]], 6)
        for i in cfg.recurrent_layers:
            torch.testing.assert_close(sb.ssm[i], sf.ssm[i], **tol)
            torch.testing.assert_close(sb.conv[i], sf.conv[i], **tol)
        for i in cfg.attention_layers:
            torch.testing.assert_close(sb.kv[i][0], sf.kv[i][0], **tol)
        assert sb.pos == sf.pos
    assert gm.captured() == [("any", 32, 4, 256, True)]  # one graph for both trees
    list(gm.verify_modes(st, TREES[0], modes=MODES))
    with pytest.raises(InputError, match="reused"):
        gm.commit(st, TREES[2], results[0], 2)
    with pytest.raises(InputError, match="distinct"):
        gm.verify_modes(st, TREES[0], modes=("leaky", "leaky"))
    with pytest.raises(InputError, match="mode"):
        gm.verify_modes(st, TREES[0], modes=("exact", "sloppy"))


@pytest.mark.interpreter
def test_modes_past_the_copies_limit_are_replayed_in_even_groups_as_asked():
    """GraphedModel.max_copies: four modes at most three a replay go as two replays of two (one key), the
    second run only when its first result is asked for, which makes the first group's results stale; each
    result is still its mode's own verify."""
    from ddsim.model.graphs import copies_per_replay
    assert [copies_per_replay(4, k) for k in (None, 1, 2, 3, 4, 9)] == [4, 1, 2, 2, 4, 4]
    assert [copies_per_replay(5, k) for k in (2, 3, 4)] == [2, 3, 3]
    cfg, ref, fast = _models("micro", backend="triton")
    gm = GraphedModel(fast, capture=False)
    gm.max_copies = 3
    st, _ = ref.prefill([1, 2, 3, 4, 5])
    results = gm.verify_modes(st, TREES[1], modes=MODES)
    first = [next(results), next(results)]
    assert gm.captured() == [("any", 16, 2, 256, True)] and first[0].fresh()
    rest = list(results)
    assert not first[0].fresh() and rest[0].fresh() and gm.captured() == [("any", 16, 2, 256, True)]
    for r in first + rest:
        assert_per_node_close(r, ref.verify(st, TREES[1], mode=r.mode), cfg.recurrent_layers, msg=f"{r.mode}: ",
                              rtol=1e-5, atol=1e-5)
    assert [r.mode for r in first + rest] == list(MODES)


def test_the_model_verifies_several_modes_one_at_a_time_as_asked():
    """HybridModel.verify_modes: every mode checked before any verify, then one verify per result asked
    for (one mode's per-node states held at a time), each the model's own verify of that mode."""
    cfg, m, _ = _models("micro")
    st, _ = m.prefill([1, 2, 3, 4, 5])
    calls = []
    real = m.verify
    m.verify = lambda *a, **kw: calls.append(kw["mode"]) or real(*a, **kw)
    with pytest.raises(InputError, match="mode"):
        m.verify_modes(st, TREES[0], modes=("exact", "sloppy"))
    results = m.verify_modes(st, TREES[0], modes=("leaky", "exact"))
    assert calls == []
    first = next(results)
    assert calls == ["leaky"] and first.mode == "leaky"
    torch.testing.assert_close(first.logits, real(st, TREES[0], mode="leaky").logits, rtol=0, atol=0)
    assert next(results).mode == "exact" and calls == ["leaky", "exact"]


def test_a_plan_for_several_modes_offsets_each_copys_sources_into_it():
    """AnyModePlan with copies: copy c's sources are its mode's, shifted by c x n, its root -1 (the committed
    state); the conv tables walk each copy's own chain into the committed window."""
    from ddsim.gpu_backend.checks import conv_sources
    from ddsim.model.graphs import AnyModePlan
    t = TREES[1]
    plan = AnyModePlan(24, "cpu", copies=3)
    plan.load(t, ("exact", "leaky-state", "leaky-conv"))
    par, chain = list(t.parents), list(range(-1, 7))
    shift = lambda xs, c: [x + 8 * c if x >= 0 else -1 for x in xs]  # noqa: E731
    shift65 = lambda xs, c: [x + 65 * c if x >= 0 else -1 for x in xs]  # noqa: E731
    assert plan.src("exact")[0].tolist() == par + shift(chain, 1) + shift(par, 2)
    conv = plan.conv_table("exact", 4)
    assert conv.tolist() == conv_sources(torch.tensor([par + shift(par, 1) + shift(chain, 2)]), 4).tolist()
    for c in range(3):  # each copy's root reads the committed window, then itself
        assert conv[0, 8 * c].tolist() == [0, 1, 2, 8 * c + 3]
    with pytest.raises(InputError, match="3 copies"):
        plan.load(t, ("exact", "leaky"))
    # at a serving budget's size: four copies of a 65-node tree (260 nodes), each copy's sources its own mode's
    import numpy as np

    from ddsim.trees.builders import random_tree
    big = random_tree(65, vocab=1000, rng=np.random.default_rng(0))
    wide = AnyModePlan(260, "cpu", copies=4)
    wide.load(big, ("leaky", "exact", "leaky-conv", "leaky-state"))
    chain65, par65 = list(range(-1, 64)), list(big.parents)
    rec = [chain65, par65, par65, chain65]  # the recurrence's sources per copy's mode
    conv = [chain65, par65, chain65, par65]
    assert wide.src("exact")[0].tolist() == [x for c in range(4) for x in shift65(rec[c], c)]
    assert wide.conv_table("exact", 4).tolist() == conv_sources(
        torch.tensor([[x for c in range(4) for x in shift65(conv[c], c)]]), 4).tolist()
    with pytest.raises(InputError, match="24 nodes"):
        plan.load(Tree([-1, 0], [1, 2]), ("exact", "leaky", "leaky-conv"))


@pytest.mark.interpreter
def test_per_node_states_keep_one_graph_per_tree_size_whose_prefix_capacity_only_grows():
    """A prefix past the kept key's capacity replaces that key (its buffers go, its results are stale);
    a shorter prefix then runs in the larger key, its rows past the prefix masked out: the same states
    and logits as the model's."""
    cfg, ref, fast = _models("micro", backend="triton")
    gm = GraphedModel(fast, capture=False)
    short, _ = ref.prefill([1, 2, 3, 4, 5])
    long, _ = ref.prefill([(7 * i) % cfg.vocab_size for i in range(300)])
    t = TREES[0]
    first = gm.verify(short, t, mode="exact", keep_states=True)
    assert gm.captured() == [("any", 8, 1, 256, True)]
    for st in (long, short):
        b, full = gm.verify(st, t, mode="leaky", keep_states=True), ref.verify(st, t, mode="leaky")
        assert_per_node_close(b, full, cfg.recurrent_layers, rtol=1e-5, atol=1e-5)
        assert gm.captured() == [("any", 8, 1, 512, True)]
    with pytest.raises(InputError, match="reused"):
        gm.commit(short, t, first, 2)


def test_a_plan_for_any_mode_refills_the_modes_source_tables():
    """AnyModePlan hands the kernels' "exact" tables over as the current mode's: the recurrence's
    source parents and the conv's (leaky-state: recurrence from the previous node, conv from the
    ancestors; leaky-conv the other way round); the snapshot-free kernels' tables are refused."""
    from ddsim.model.graphs import AnyModePlan
    t = TREES[1]
    plan = AnyModePlan(8, "cpu")
    plan.load(t, "leaky-state")
    chain = list(range(-1, 7))
    assert plan.src("exact")[0].tolist() == chain
    own = plan.conv_table("exact", 4).clone()
    plan.load(t, "leaky-conv")
    assert plan.src("exact")[0].tolist() == list(t.parents)
    assert not torch.equal(plan.conv_table("exact", 4), own)  # refilled in place with the chain's windows
    plan.load(t, "leaky-state")
    assert torch.equal(plan.conv_table("exact", 4), own)
    with pytest.raises(RuntimeError, match="source and conv tables only"):
        plan.ancestors("exact")


def test_a_result_is_stale_after_the_next_verify_of_its_key():
    cfg, m, _ = _models("tiny")
    gm = GraphedModel(m, capture=False)
    st, _ = m.prefill([1, 2, 3])
    first = gm.verify(st, TREES[0], mode="exact")
    other_key = gm.verify(st, TREES[0], mode="leaky")
    assert first.fresh() and other_key.fresh()
    gm.commit(st, TREES[0], first, 3)  # another key's verify does not touch it
    second = gm.verify(st, TREES[1], mode="exact")
    with pytest.raises(InputError, match="reused by a later verify"):
        gm.commit(st, TREES[0], first, 3)
    gm.commit(st, TREES[1], second, 3)


@pytest.mark.parametrize("mode", MODES)
def test_speculative_decoding_through_the_graph_path_emits_the_same_tokens(mode):
    """speculative() over GraphedModel (serving verify + replayed commit) against the model."""
    from ddsim.sim.drafters import SyntheticDrafter
    cfg, m, _ = _models("tiny")
    gm = GraphedModel(m, capture=False)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    kw = dict(drafter=SyntheticDrafter(vocab_size=cfg.vocab_size, depth=4, seed=1), policy=TreePolicy("ddtree", 8),
              mode=mode, steps=4)
    a, b = speculative(m, prompt, **kw), speculative(gm, prompt, **kw)
    assert b.tokens == a.tokens and [s.emitted for s in b.steps] == [s.emitted for s in a.steps]
    assert len(gm.captured()) >= 1


def test_static_plan_refuses_what_its_graphs_cannot_replay():
    plan = StaticPlan(8, "cpu", max_depth=4)
    with pytest.raises(RuntimeError, match="load a tree"):
        plan.src("exact")
    with pytest.raises(RuntimeError, match="load a tree"):
        plan.tree_mask()
    plan.load(TREES[0])
    plan.ancestors("exact")  # allocated for depth 3: two rounds
    plan.root_paths()
    with pytest.raises(InputError, match="9 nodes"):
        plan.load(Tree(list(range(-1, 8)), list(range(9))))
    with pytest.raises(InputError, match="depth 7, this plan holds trees up to 4"):
        plan.load(Tree([-1, 0, 1, 2, 3, 4, 5, 6], list(range(8))))
    with pytest.raises(InputError, match="captured for 2"):
        plan.load(Tree([-1, 0, 0, 0, 0, 0, 0, 0], list(range(8))))  # a star: depth 1, no rounds
    # refused before any table was written: the buffers still hold the first tree's
    assert torch.equal(plan.parents, torch.tensor([TREES[0].parents]))
    assert torch.equal(plan.ancestors("exact")[0], torch.as_tensor(TREES[0].ancestor_mask)[None].to(torch.int8))
    plan.load(TREES[1])
    assert torch.equal(plan.ancestors("exact")[0], torch.as_tensor(TREES[1].ancestor_mask)[None].to(torch.int8))
    assert torch.equal(plan.parents, torch.tensor([TREES[1].parents]))
    paths = plan.root_paths()[0]  # padded to max_depth + 1 = 5 entries
    assert paths.shape == (8, 5) and paths[7].tolist() == [0, 1, 2, 5, 7]
    assert paths[0].tolist() == [0, -1, -1, -1, -1]


def test_a_refilled_static_plan_serves_a_fresh_plans_tables():
    """StaticPlan.load refills the tables its graphs read (the exact ones built in one pass over the tree,
    host_tables.one_tree; another mode's by the batch builders): after each load of a run of random trees and
    chains they equal a fresh TreePlan's, the root paths padded to max_depth + 1. (A mask's depth stays the
    first tree's: only its number of WY rounds must match, and load refuses a tree where it would not.)"""
    gen = torch.Generator().manual_seed(3)
    T, max_depth = 12, 11
    plan = StaticPlan(T, "cpu", max_depth=max_depth)
    loaded = 0
    for n in range(24):
        parents = [-1] + ([int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)] if n % 4 else
                          list(range(T - 1)))  # every fourth a chain: depth T - 1
        tree = Tree(parents, list(range(T)))
        try:
            plan.load(tree)
        except InputError as e:  # another number of WY rounds than the plan's first tree: refused
            assert "WY rounds" in str(e)
            continue
        loaded += 1
        # the captured verify's attention mask, before any table is asked for (built in the load's own pass)
        assert np.array_equal(plan.tree_mask(), tree.ancestor_mask)
        fresh = TreePlan(torch.tensor([parents]))
        for mode in ("exact", "leaky"):
            assert torch.equal(plan.src(mode), fresh.src(mode))
            for W in (2, 4):
                assert torch.equal(plan.conv_table(mode, W), fresh.conv_table(mode, W))
            (mask, depth), (want, want_depth) = plan.ancestors(mode), fresh.ancestors(mode)
            assert torch.equal(mask, want) and wy_rounds(depth) == wy_rounds(want_depth)
        paths, want = plan.root_paths(), fresh.root_paths()
        assert paths.shape == (1, T, max_depth + 1) and torch.equal(paths[..., :want.shape[-1]], want)
        assert (paths[..., want.shape[-1]:] == -1).all()
    assert loaded >= 6  # the first tree's rounds came round again and again
    # another mode's root paths (leaky's: every earlier node), from the loaded tree's host plan, on a branching tree
    branching = [-1, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8]
    other = StaticPlan(T, "cpu", max_depth=max_depth)
    other.load(Tree(branching, list(range(T))))
    assert torch.equal(other.root_paths("leaky"), TreePlan(torch.tensor([branching])).root_paths("leaky"))


def test_prefix_capacity_is_a_power_of_two_of_at_least_256():
    assert [prefix_capacity(P) for P in (0, 1, 255, 256, 257, 1000, 1024, 1025)] == \
        [256, 256, 256, 256, 512, 1024, 1024, 2048]


def test_graphed_model_refuses_what_it_cannot_capture():
    cfg, m, _ = _models("tiny")
    with pytest.raises(InputError, match="not a CUDA device"):
        GraphedModel(m)
    gm = GraphedModel(m, capture=False)
    st, _ = m.prefill([1, 2])
    with pytest.raises(InputError, match="the tree's own positions and mask"):
        gm.verify(st, TREES[0], positions=torch.arange(8))
    with pytest.raises(InputError, match="the tree's own positions and mask"):
        gm.verify(st, TREES[0], keep_states=True, ancestor_mask=torch.ones(8, 8, dtype=torch.bool))
    moe = get_preset("micro").replace(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8)
    with pytest.raises(InputError, match="MoE"):
        GraphedModel(HybridModel(moe, init_weights(moe, seed=0)), capture=False)


def test_capture_blas_sets_the_library_for_the_capture_and_restores_the_callers(monkeypatch):
    """The CPU build cannot set cuBLASLt, so torch's setter is stood in for: the library is set on entry, the
    caller's restored on exit, also when the capture raises; None leaves it alone."""
    from ddsim.model.graphs import capture_blas
    current, calls = ["cublas"], []

    def preferred(backend=None):
        if backend is not None:
            calls.append(backend)
            current[0] = backend
        return current[0]
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred)
    with capture_blas("cublaslt"):
        assert current == ["cublaslt"]
    assert current == ["cublas"] and calls == ["cublaslt", "cublas"]
    with pytest.raises(RuntimeError, match="capture failed"), capture_blas("cublaslt"):
        raise RuntimeError("capture failed")
    assert current == ["cublas"]
    calls.clear()
    with capture_blas(None):
        pass
    assert calls == []


def test_checked_accepted_is_validated_once_and_then_only_its_shape():
    import ddsim.gpu_backend as gb
    from ddsim.gpu_backend.checks import check_accepted
    acc = gb.checked_accepted([3], 1, 8, "cpu")
    assert check_accepted(acc, 1, 8, torch.device("cpu")).tolist() == [3]
    for bad in ([8], [-1], [1, 2]):
        with pytest.raises(ValueError, match="node indices in 0..7"):
            gb.checked_accepted(bad, 1, 8, "cpu")
    with pytest.raises(ValueError, match="checked indices"):
        check_accepted(acc, 1, 9, torch.device("cpu"))  # checked for another tree size
    with pytest.raises(ValueError, match="checked indices"):
        check_accepted(acc, 2, 8, torch.device("cpu"))


def test_accepted_node_indices_are_held_to_their_bounds_raw_and_planned():
    """0 and T-1 are nodes, -1 and T are not, one per sequence, in both checks; a plan passed to the planner again is
    the same plan, checked for its batch and tree size."""
    import ddsim.gpu_backend as gb
    from ddsim.gpu_backend.checks import CheckedIndices, check_accepted
    cpu = torch.device("cpu")
    for ok in ([0, 7], [7, 0]):
        assert check_accepted(torch.tensor(ok), 2, 8, cpu).tolist() == ok
        assert gb.checked_accepted(ok, 2, 8, "cpu").indices.tolist() == ok
    for bad in ([-1, 3], [3, 8], [3], [3, 4, 5]):
        with pytest.raises(ValueError, match=r"expected \[B\] = \[2\] node indices in 0\.\.7, got"):
            check_accepted(torch.tensor(bad), 2, 8, cpu)
        with pytest.raises(ValueError, match=r"expected \[B\] = \[2\] node indices in 0\.\.7, got"):
            gb.checked_accepted(bad, 2, 8, "cpu")
    plan = gb.checked_accepted([7, 0], 2, 8, "cpu")
    again = gb.checked_accepted(plan, 2, 8, "cpu")
    assert isinstance(again, CheckedIndices) and again.T == 8 and again.indices.tolist() == [7, 0]
    for B, T in ((1, 8), (2, 9)):
        with pytest.raises(ValueError, match="checked indices"):
            gb.checked_accepted(plan, B, T, "cpu")


def test_accepted_node_indices_are_integers_not_truncated():
    """A float or bool accepted index is refused, not truncated to another node (2.7 is not node 2), in both checks;
    numpy integers are integers; a strided accepted tensor comes back with stride 1, as a kernel reads it."""
    import numpy as np

    import ddsim.gpu_backend as gb
    from ddsim.gpu_backend.checks import check_accepted
    cpu = torch.device("cpu")
    for bad in ([2.7], torch.tensor([2.7]), torch.tensor([True]), [True], 2.0):
        with pytest.raises(ValueError, match="integer node indices"):
            gb.checked_accepted(bad, 1, 8, "cpu")
        with pytest.raises(ValueError, match="integer node indices"):
            check_accepted(bad, 1, 8, cpu)
    assert gb.checked_accepted(np.array([3, 1]), 2, 8, "cpu").indices.tolist() == [3, 1]
    assert gb.checked_accepted([np.int32(3)], 1, 8, "cpu").indices.tolist() == [3]
    wide = torch.tensor([[3, 9], [1, 9]])[:, 0]  # a column of a wider table: stride 2
    got = check_accepted(wide, 2, 8, cpu)
    assert got.tolist() == [3, 1] and got.is_contiguous()
    # end to end: the public commit refuses it (it committed node 2's state before)
    from ddsim.gpu_backend.torch_ops import gdn_tree_commit
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 8, 1, 4, generator=g), torch.randn(1, 8, 1, 4, generator=g)
    gate, beta = -torch.rand(1, 8, 1, generator=g), torch.rand(1, 8, 1, generator=g)
    with pytest.raises(ValueError, match="integer node indices"):
        gdn_tree_commit(k, v, gate, beta, parents=torch.arange(-1, 7)[None], accepted=torch.tensor([2.7]),
                        initial_state=torch.zeros(1, 1, 4, 4))


def test_tree_attention_takes_a_mask_over_prefix_and_tree():
    import ddsim.gpu_backend as gb
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 4, generator=g) for _ in range(3))
    pk, pv = torch.randn(5, 2, 4, generator=g), torch.randn(5, 2, 4, generator=g)
    anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    short = gb.tree_attention(q, k, v, prefix_k=pk[:2], prefix_v=pv[:2], ancestor_mask=anc)
    valid = torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool)  # a 5-row capacity holding 2 rows
    full = gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv,
                             ancestor_mask=torch.cat([valid.expand(3, 5), anc], dim=1))
    torch.testing.assert_close(full, short)
    with pytest.raises(ValueError, match="ancestor_mask"):
        gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=torch.ones(3, 4, dtype=torch.bool))


def test_a_commit_refuses_a_tree_of_another_size_than_its_result():
    cfg, m, _ = _models("tiny")
    gm = GraphedModel(m, capture=False)
    st, _ = m.prefill([1, 2])
    other = Tree([-1, 0, 0], [5, 1, 2])
    for model, res in ((m, m.verify(st, TREES[0], keep_states=False)), (m, m.verify(st, TREES[0])),
                       (gm, gm.verify(st, TREES[0]))):
        with pytest.raises(InputError, match="3 nodes, the verify result has 8"):
            model.commit(st, other, res, 1)


def test_reference_decoding_through_the_graph_path_is_the_models():
    """The audit decodes its references through the serving model (the prompt's prefill replayed from
    a graph on a GPU, then the model's batched decode): the same tokens and margins as the model's own."""
    from ddsim.sim.generate import reference_decode
    cfg, m, _ = _models("tiny")
    gm = GraphedModel(m, capture=False)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    (ta, ma), (tb, mb) = reference_decode(m, prompt, 6), reference_decode(gm, prompt, 6)
    assert tb == ta
    assert mb == pytest.approx(ma, rel=1e-5, abs=1e-5)
    assert [key[1] for key in gm.captured()] == [7]  # the prompt's prefill (7 tokens before the root)


@pytest.mark.interpreter
def test_the_graphed_prefill_equals_the_models():
    """GraphedModel.prefill runs the chain through the serving verify and commit (uncaptured here):
    the committed state and the logits equal the model's own prefill within float32 rounding."""
    cfg, ref, fast = _models("micro", backend="triton")
    gm = GraphedModel(fast, capture=False)
    st, lg = ref.prefill([1, 2, 3, 4, 5])
    st2, lg2 = gm.prefill([1, 2, 3, 4, 5])
    torch.testing.assert_close(lg2, lg, rtol=1e-5, atol=1e-5)
    a, b = ref.prefill([6, 7], state=st)[0], gm.prefill([6, 7], state=st2)[0]
    assert (a.pos, b.pos) == (7, 7)
    for i in cfg.recurrent_layers:
        torch.testing.assert_close(b.ssm[i], a.ssm[i], rtol=1e-5, atol=1e-6)
    for i in cfg.attention_layers:
        torch.testing.assert_close(b.kv[i][0], a.kv[i][0], rtol=1e-5, atol=1e-6)
    assert sorted(k[1] for k in gm.captured()) == [2, 5]  # one key per chain length
    assert gm.prefill([], state=a)[0] is a


@pytest.mark.interpreter
def test_a_long_prefill_leaves_no_graph_behind(monkeypatch):
    """A prefill longer than PREFILL_GRAPH_NODES (a long prompt, once per generation) runs the eager
    serving verify and commit: the same state, and no key (no graph, no memory pool) kept for it."""
    import ddsim.model.graphs as graphs
    monkeypatch.setattr(graphs, "PREFILL_GRAPH_NODES", 3)
    cfg, ref, fast = _models("micro", backend="triton")
    gm = GraphedModel(fast, capture=False)
    st, lg = ref.prefill([1, 2, 3, 4, 5])
    st2, lg2 = gm.prefill([1, 2, 3, 4, 5])
    torch.testing.assert_close(lg2, lg, rtol=1e-5, atol=1e-5)
    for i in cfg.recurrent_layers:
        torch.testing.assert_close(st2.ssm[i], st.ssm[i], rtol=1e-5, atol=1e-6)
    assert gm.captured() == []
    gm.prefill([6, 7], state=st2)
    assert [k[1] for k in gm.captured()] == [2]


@pytest.mark.interpreter
@pytest.mark.parametrize("preset", ["micro", "micro-mamba2", "tiny-jamba", "tiny-minimax", "tiny-zamba2", "micro-lfm2",
                                    "tiny-kimi", "olmo"])
def test_a_blocks_last_residual_add_left_to_the_next_norm_changes_no_bit(preset, monkeypatch):
    """A serving verify leaves each block's last residual add (h + MLP) to the next block's input norm (one
    kernel fewer a layer on a GPU): bit for bit the verify that adds it at once, through layers that take it
    (GDN, Mamba2, attention blocks) and layers that add it first (MLP-only, Zamba2's hybrid, MiniMax's scaled
    sums, OLMo's normed attention outputs), on PyTorch's ops and the Triton glue; the per-node verify never
    defers. The KV rows and commit inputs too."""
    import ddsim.gpu_backend as gb
    cfg = (get_preset("tiny").replace(attn_post_norm=True) if preset == "olmo" else get_preset(preset))
    w = init_weights(cfg, seed=0)
    tree = TREES[0]
    # the blocks whose last add is h + MLP, followed by a block that takes it in its input norm
    plain = [k not in "zf" and not cfg.residual_from_norm and not (k == "a" and cfg.attn_post_norm)
             for k in cfg.layer_pattern]
    deferred = sum(plain[i] and plain[i + 1] and cfg.layer_mlp for i in range(cfg.num_layers - 1))
    assert deferred > 0 or preset in ("micro-mamba2", "tiny-minimax", "tiny-zamba2")
    norms = []
    rms_norm = gb.rms_norm
    monkeypatch.setattr(gb, "rms_norm", lambda *a, **kw: norms.append(kw.get("residual") is not None) or
                        rms_norm(*a, **kw))
    for glue in ("torch", "triton"):
        m = HybridModel(cfg, w, glue=glue)
        st, _ = m.prefill([1, 2, 3, 4, 5])
        norms.clear()
        got = m.verify(st, tree, keep_states=False)
        with_add = sum(norms)
        m.defer_residuals = False
        norms.clear()
        want = m.verify(st, tree, keep_states=False)
        assert with_add - sum(norms) == deferred  # each such add made by a norm
        assert torch.equal(got.logits, want.logits), glue
        norms.clear()
        m.verify(st, tree, keep_states=True)
        m.defer_residuals = True
        without = sum(norms)
        norms.clear()
        m.verify(st, tree, keep_states=True)  # the per-node verify keeps every hidden state: it defers none
        assert sum(norms) == without
        for a, b in zip(got.kv, want.kv):
            assert (a is None) == (b is None) and (a is None or all(torch.equal(x, y) for x, y in zip(a, b)))
        for a, b in zip(got.commit_inputs, want.commit_inputs):
            assert (a is None) == (b is None)
            assert a is None or all(torch.equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__
                                    if getattr(a, f) is not None)


# the GDN model's WY kernels in the interpreter take 20 s: slow; the LFM2 model's conv and attention tables stay here
@pytest.mark.interpreter
@pytest.mark.parametrize("preset", [pytest.param("micro", marks=pytest.mark.slow), "micro-lfm2"])
def test_the_tables_built_on_the_device_give_the_host_tables_verify(preset, monkeypatch):
    """graphs.DEVICE_TABLES: a serving key builds its exact tables (ancestor mask, root paths, conv sources) and the
    attention mask in the graph from the copied parents (gpu_backend.triton_tables, here in Triton's interpreter,
    uncaptured); tree after tree, in exact and leaky modes, the verify and the commit equal the host tables' bit for
    bit, and a load copies no table but the parents."""
    from ddsim.model import graphs
    cfg, _, fast = _models(preset, backend="triton")
    st, _ = fast.prefill([1, 2, 3, 4, 5])
    results = {}
    for on in (False, True):
        monkeypatch.setattr(graphs, "DEVICE_TABLES", on)
        gm = GraphedModel(fast, capture=False)
        out = []
        for mode in ("exact", "leaky"):
            for t in TREES + TREES[:1]:
                r = gm.verify(st, t, mode=mode)
                out.append(r.logits.clone())
                c = gm.commit(st, t, r, 5)
                out += [x.clone() for x in c.ssm if x is not None] + [x.clone() for x in c.conv if x is not None]
        assert all(c.device_tables == on and c.plan.on_device == on for c in gm._keys.values())
        results[on] = out
        if on:  # a load builds no exact table on the host
            cap = next(c for k, c in gm._keys.items() if k[0] == "exact")
            monkeypatch.setattr(graphs.host_tables, "one_tree", lambda *a: pytest.fail("host tables built"))
            cap.plan.load(TREES[1])
            assert (("anc", "exact") in cap.plan._cache) == (preset == "micro")  # the WY kernels' (GDN's) mask
            if preset == "micro":
                with pytest.raises(InputError, match="WY rounds"):  # a star: depth 1, fewer rounds than the key's
                    cap.plan.load(Tree([-1] + [0] * 7, list(range(8))))
    assert len(results[True]) == len(results[False])
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)
