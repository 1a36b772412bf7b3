"""The whole fast-path model against the oracle, per node and per layer."""
import torch
from hypothesis import given
from hypothesis import strategies as st

from ddsim import oracle
from ddsim.measure.compare import MODEL_SLACK, assert_close
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.properties.strategies import TREE_SHAPES, model_configs, topological_orders, trees


def _setup(cfg, seed, prefix):
    w = init_weights(cfg, seed=seed)
    m = HybridModel(cfg, w)
    fast_state, _ = m.prefill(prefix)
    ref_state, _ = oracle.prefill(w, cfg, prefix)
    return w, m, fast_state, ref_state


@given(model_configs(), st.data(), st.integers(0, 2**16))
def test_exact_equals_oracle_per_node_and_layer(cfg, data, seed):
    prefix = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), max_size=4))
    t = data.draw(trees(max_size=9, vocab=cfg.vocab_size))
    w, m, fs, rs = _setup(cfg, seed, prefix)
    res = m.verify(fs, t, mode="exact")
    ref = oracle.verify_tree(w, cfg, rs, t.parents, t.tokens)
    assert_close("logits", res.logits, ref.logits, dtype=torch.float32, slack=MODEL_SLACK)
    assert_close("hidden", res.hidden, ref.hidden, dtype=torch.float32, slack=MODEL_SLACK)
    for l in cfg.recurrent_layers:
        assert_close(f"layer {l} state", res.ssm[l], ref.ssm[l], dtype=torch.float32, slack=MODEL_SLACK)
        assert_close(f"layer {l} conv", res.conv[l], ref.conv[l], dtype=torch.float32, slack=MODEL_SLACK)


@given(model_configs(), st.data(), st.integers(0, 2**16), st.sampled_from(["leaky", "leaky-state", "leaky-conv"]))
def test_leaky_equals_oracle_on_order_exact_nodes(cfg, data, seed, mode):
    t = data.draw(trees(max_size=9, vocab=cfg.vocab_size))
    w, m, fs, rs = _setup(cfg, seed, [1, 2])
    res = m.verify(fs, t, mode=mode)
    ref = oracle.verify_tree(w, cfg, rs, t.parents, t.tokens)
    ex = torch.as_tensor(t.order_exact)
    assert_close("logits (order-exact nodes)", res.logits[ex], ref.logits[ex], dtype=torch.float32, slack=MODEL_SLACK)
    if not cfg.recurrent_layers:  # a model without recurrent layers has no leak anywhere
        assert_close("logits (all nodes)", res.logits, ref.logits, dtype=torch.float32, slack=MODEL_SLACK)


@given(model_configs(), st.data(), st.integers(0, 2**16))
def test_relabeling_leaves_exact_results_unchanged(cfg, data, seed):
    t = data.draw(trees(max_size=9, vocab=cfg.vocab_size))
    order = data.draw(topological_orders(t))
    w, m, fs, _ = _setup(cfg, seed, [3])
    a = m.verify(fs, t, mode="exact")
    b = m.verify(fs, t.relabel(order), mode="exact")
    assert_close("logits", b.logits, a.logits[order], dtype=torch.float32, slack=MODEL_SLACK)


@given(model_configs(), st.data(), st.integers(0, 2**16), st.sampled_from(["exact", "leaky", "leaky-state", "leaky-conv"]))
def test_serving_verify_and_replayed_commit_equal_the_per_node_path(cfg, data, seed, mode):
    """A verify without per-node states gives the same logits, and its commit (the accepted path
    replayed from the committed state) the same state, as the per-node verify and its snapshot."""
    t = data.draw(trees(max_size=9, vocab=cfg.vocab_size))
    accepted = data.draw(st.integers(0, t.size - 1))
    w, m, fs, rs = _setup(cfg, seed, [1, 2])
    full = m.verify(fs, t, mode=mode)
    lean = m.verify(fs, t, mode=mode, keep_states=False)
    assert lean.ssm is None and lean.hidden is None
    assert_close("logits", lean.logits, full.logits, dtype=torch.float32, slack=MODEL_SLACK)
    a, b = m.commit(fs, t, full, accepted), m.commit(fs, t, lean, accepted)
    assert b.pos == a.pos
    for l in cfg.recurrent_layers:
        assert_close(f"layer {l} committed state", b.ssm[l], a.ssm[l], dtype=torch.float32, slack=MODEL_SLACK)
        assert_close(f"layer {l} committed window", b.conv[l], a.conv[l], dtype=torch.float32, slack=MODEL_SLACK)
    if mode == "exact":  # and directly against the oracle: its logits and its state at the accepted node
        ref = oracle.verify_tree(w, cfg, rs, t.parents, t.tokens)
        assert_close("logits vs oracle", lean.logits, ref.logits, dtype=torch.float32, slack=MODEL_SLACK)
        for l in cfg.recurrent_layers:
            assert_close(f"layer {l} committed state vs oracle", b.ssm[l], ref.ssm[l][accepted], dtype=torch.float32,
                         slack=MODEL_SLACK)
            assert_close(f"layer {l} committed window vs oracle", b.conv[l], ref.conv[l][accepted],
                         dtype=torch.float32, slack=MODEL_SLACK)
    for l in cfg.attention_layers:
        assert torch.equal(b.kv[l][0], a.kv[l][0]) and torch.equal(b.kv[l][1], a.kv[l][1])


@given(model_configs(), st.data(), st.integers(0, 2**16), st.sampled_from(["exact", "leaky", "leaky-state", "leaky-conv"]))
def test_graph_machinery_equals_the_serving_verify(cfg, data, seed, mode):
    """ddsim.model.graphs' path (fixed buffers, a refilled StaticPlan, the KV prefix at a fixed capacity),
    run without capture, is the serving verify and its commit within float32 rounding, tree after
    tree on one key."""
    from hypothesis import assume

    from ddsim.model.graphs import GraphedModel
    assume(not any(cfg.is_moe_layer(i) for i in range(cfg.num_layers)))
    T = data.draw(st.integers(1, 9))
    w, m, fs, _ = _setup(cfg, seed, [1, 2])
    gm = GraphedModel(m, capture=False)
    for _ in range(2):
        shape = "single" if T == 1 else data.draw(st.sampled_from([s for s in TREE_SHAPES if s != "single"]))
        t = data.draw(trees(min_size=T, max_size=T, vocab=cfg.vocab_size, shape=shape))
        a, b = m.verify(fs, t, mode=mode, keep_states=False), gm.verify(fs, t, mode=mode)
        assert_close("logits", b.logits, a.logits, dtype=torch.float32, slack=MODEL_SLACK)
        acc = data.draw(st.integers(0, T - 1))
        sa, sb = m.commit(fs, t, a, acc), gm.commit(fs, t, b, acc)
        for l in cfg.recurrent_layers:
            assert_close(f"layer {l} committed state", sb.ssm[l], sa.ssm[l], dtype=torch.float32, slack=MODEL_SLACK)
            assert_close(f"layer {l} committed window", sb.conv[l], sa.conv[l], dtype=torch.float32,
                         slack=MODEL_SLACK)
        for l in cfg.attention_layers:
            assert_close(f"layer {l} committed keys", sb.kv[l][0], sa.kv[l][0], dtype=torch.float32,
                         slack=MODEL_SLACK)


@given(model_configs(), st.data(), st.integers(0, 2**16), st.sampled_from(["exact", "leaky", "leaky-state", "leaky-conv"]))
def test_verify_rows_equals_each_trees_serving_verify(cfg, data, seed, mode):
    """HybridModel.verify_rows (the decision-only generations' verifies: every prompt's tree in one
    pass): tree b, from its own committed state (prefixes of different lengths), gets its own serving
    verify's logits and, committed at any node, the same state; in exact mode, the oracle's logits and
    the oracle's state at the accepted node."""
    n = data.draw(st.integers(1, 7))
    shapes = [s for s in TREE_SHAPES if n == 1 or s != "single"]
    B = data.draw(st.integers(1, 3))
    ts = [data.draw(trees(min_size=n, max_size=n, vocab=cfg.vocab_size, shape=data.draw(st.sampled_from(shapes))))
          for _ in range(B)]
    prefixes = [data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), max_size=4)) for _ in range(B)]
    accepted = [data.draw(st.integers(0, n - 1)) for _ in range(B)]
    w = init_weights(cfg, seed=seed)
    m = HybridModel(cfg, w)
    states = [m.prefill(p)[0] for p in prefixes]
    rows = m.verify_rows(states, ts, mode=mode)
    assert len(rows) == B
    for b, (fs, t, acc, res) in enumerate(zip(states, ts, accepted, rows)):
        one = m.verify(fs, t, mode=mode, keep_states=False)
        assert res.mode == mode and res.ssm is None
        assert_close(f"tree {b} logits", res.logits, one.logits, dtype=torch.float32, slack=MODEL_SLACK)
        a, c = m.commit(fs, t, one, acc), m.commit(fs, t, res, acc)
        assert c.pos == a.pos
        for l in cfg.recurrent_layers:
            assert_close(f"tree {b} layer {l} committed state", c.ssm[l], a.ssm[l], dtype=torch.float32, slack=MODEL_SLACK)
            assert_close(f"tree {b} layer {l} committed window", c.conv[l], a.conv[l], dtype=torch.float32,
                         slack=MODEL_SLACK)
        for l in cfg.attention_layers:
            assert_close(f"tree {b} layer {l} committed K", c.kv[l][0], a.kv[l][0], dtype=torch.float32, slack=MODEL_SLACK)
            assert_close(f"tree {b} layer {l} committed V", c.kv[l][1], a.kv[l][1], dtype=torch.float32, slack=MODEL_SLACK)
        if mode == "exact":
            ref = oracle.verify_tree(w, cfg, oracle.prefill(w, cfg, prefixes[b])[0], t.parents, t.tokens)
            assert_close(f"tree {b} logits vs oracle", res.logits, ref.logits, dtype=torch.float32, slack=MODEL_SLACK)
            for l in cfg.recurrent_layers:
                assert_close(f"tree {b} layer {l} committed state vs oracle", c.ssm[l], ref.ssm[l][acc],
                             dtype=torch.float32, slack=MODEL_SLACK)
