"""The serving verify (no per-node states, commit by replay) and ddsim.graphs' machinery on the CPU:
the pieces, fixed buffers and refilled StaticPlan of the CUDA-graph path run without capture, with
the Triton kernels in the interpreter (the GPU suite replays real graphs: properties/test_cuda_graphs.py)."""
import pytest
import torch

from ddsim.config import get_preset
from ddsim.errors import InputError
from ddsim.generate import TreePolicy, speculative
from ddsim.graphs import GraphedModel, StaticPlan, wy_rounds
from ddsim.model import HybridModel
from ddsim.tree import Tree
from ddsim.weights import init_weights

# three trees of 8 nodes whose depths (3, 4, 3) need the same two WY doubling rounds: one graph key
TREES = [Tree([-1, 0, 0, 1, 1, 2, 3, 4], [5, 1, 2, 3, 4, 6, 7, 8]),
         Tree([-1, 0, 1, 1, 0, 2, 3, 5], [5, 9, 1, 2, 3, 4, 6, 7]),
         Tree([-1, 0, 0, 0, 1, 2, 3, 6], [5, 1, 2, 3, 4, 6, 7, 8])]
MODES = ("exact", "leaky", "leaky-state", "leaky-conv")


def _models(preset, backend=None):
    cfg = get_preset(preset)
    w = init_weights(cfg, seed=0)
    return cfg, HybridModel(cfg, w), HybridModel(cfg, w, backend=backend)


def test_the_trees_share_one_key():
    assert {wy_rounds(int(t.depths.max())) for t in TREES} == {2}
    assert len({t.parents for t in TREES}) == 3


@pytest.mark.parametrize("preset", ["micro", "micro-mamba2"])
def test_graph_pieces_with_triton_kernels_equal_the_serving_verify(preset):
    """Triton kernels read the StaticPlan's tables (conv sources, ancestor masks): refilled per tree,
    the pieces equal the model's own serving verify bit for bit, and the per-node torch path within
    float32 rounding, tree after tree on one key."""
    cfg, ref, fast = _models(preset, backend="triton")
    gm = GraphedModel(fast, capture=False)
    st, _ = ref.prefill([1, 2, 3, 4, 5])
    for mode in ("exact", "leaky"):
        for t in TREES:
            a, b, full = fast.verify(st, t, mode=mode, keep_states=False), gm.verify(st, t, mode=mode), \
                ref.verify(st, t, mode=mode)
            assert torch.equal(a.logits, b.logits)
            torch.testing.assert_close(b.logits, full.logits, rtol=1e-4, atol=1e-4)
            sa, sb, sf = fast.commit(st, t, a, 7), gm.commit(st, t, b, 7), ref.commit(st, t, full, 7)
            for i in cfg.recurrent_layers:
                assert torch.equal(sa.ssm[i], sb.ssm[i]) and torch.equal(sa.conv[i], sb.conv[i])
                torch.testing.assert_close(sb.ssm[i], sf.ssm[i], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(sb.conv[i], sf.conv[i], rtol=1e-5, atol=1e-6)
    assert gm.captured() == [("exact", 8, 2), ("leaky", 8, 3)]


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
    from ddsim.drafters import SyntheticDrafter
    cfg, m, _ = _models("tiny")
    gm = GraphedModel(m, capture=False)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    kw = dict(drafter=SyntheticDrafter(vocab_size=cfg.vocab_size, depth=4, seed=1), policy=TreePolicy("ddtree", 8),
              mode=mode, steps=4)
    a, b = speculative(m, prompt, **kw), speculative(gm, prompt, **kw)
    assert b.tokens == a.tokens and [s.emitted for s in b.steps] == [s.emitted for s in a.steps]
    assert len(gm.captured()) >= 1


def test_static_plan_refuses_what_its_graphs_cannot_replay():
    plan = StaticPlan(8, "cpu")
    with pytest.raises(RuntimeError, match="load a tree"):
        plan.src("exact")
    plan.load(TREES[0])
    plan.ancestors("exact")  # allocated for depth 3: two rounds
    with pytest.raises(InputError, match="9 nodes"):
        plan.load(Tree(list(range(-1, 8)), list(range(9))))
    with pytest.raises(InputError, match="captured for 2"):
        plan.load(Tree([-1, 0, 1, 2, 3, 4, 5, 6], list(range(8))))  # a chain: depth 7, three rounds
    plan.load(TREES[1])
    assert torch.equal(plan.ancestors("exact")[0], torch.as_tensor(TREES[1].ancestor_mask)[None].to(torch.int8))
    assert torch.equal(plan.parents, torch.tensor([TREES[1].parents]))


def test_graphed_model_refuses_what_it_cannot_capture():
    cfg, m, _ = _models("tiny")
    with pytest.raises(InputError, match="not a CUDA device"):
        GraphedModel(m)
    gm = GraphedModel(m, capture=False)
    st, _ = m.prefill([1, 2])
    with pytest.raises(InputError, match="keeps no per-node states"):
        gm.verify(st, TREES[0], keep_states=True)
    with pytest.raises(InputError, match="keeps no per-node states"):
        gm.verify(st, TREES[0], positions=torch.arange(8))
    moe = get_preset("micro").replace(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8)
    with pytest.raises(InputError, match="MoE"):
        GraphedModel(HybridModel(moe, init_weights(moe, seed=0)), capture=False)
