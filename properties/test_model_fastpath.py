"""The whole fast-path model against the oracle, per node and per layer."""
import torch
from hypothesis import given
from hypothesis import strategies as st

from ddsim import oracle
from ddsim.compare import MODEL_SLACK, assert_close
from ddsim.model import HybridModel
from ddsim.properties.strategies import model_configs, topological_orders, trees
from ddsim.weights import init_weights


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
