"""Example-based checks of the synthetic model: determinism, presets, gate statistics, commit."""
import math

import torch

from ddsim import oracle
from ddsim.model.config import PRESETS, get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.tree import Tree


def test_weights_deterministic_from_seed():
    cfg = get_preset("micro")
    a, b, c = init_weights(cfg, seed=3), init_weights(cfg, seed=3), init_weights(cfg, seed=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed"], c["embed"])


def test_presets_validate_and_real_shapes():
    q = get_preset("qwen3.6-27b")
    assert q.num_layers == 64 and len(q.gdn_layers) == 48 and len(q.attention_layers) == 16
    assert (q.linear_num_key_heads, q.linear_num_value_heads, q.linear_key_head_dim) == (16, 48, 128)
    assert q.layer_pattern[:4] == "ggga"
    n = get_preset("qwen3-next-80b")
    assert n.num_layers == 48 and n.linear_num_value_heads == 32
    for cfg in PRESETS.values():
        cfg.validate()


def test_gate_halflives_span_the_configured_range():
    cfg = get_preset("tiny")
    w = init_weights(cfg, seed=0)
    lo, hi = cfg.gate_halflife
    for l in cfg.gdn_layers:
        A = torch.exp(w[f"layers.{l}.gdn.A_log"].double())
        dt = torch.nn.functional.softplus(w[f"layers.{l}.gdn.dt_bias"].double())
        decay = torch.exp(-A * dt)  # typical exp(g) at gate input a = 0
        halflife = math.log(2) / -torch.log(decay)
        assert halflife.min() >= lo * 0.99 and halflife.max() <= hi * 1.01
        assert halflife.max() / halflife.min() > (hi / lo) ** 0.5  # heads really differ


def test_commit_then_verify_equals_longer_prefill():
    cfg = get_preset("micro")
    w = init_weights(cfg, seed=0)
    m = HybridModel(cfg, w)
    st, _ = m.prefill([1, 2, 3])
    tree = Tree([-1, 0, 0, 2, 3], [4, 5, 6, 7, 8])
    res = m.verify(st, tree, mode="exact")
    st2 = m.commit(st, tree, res, accepted=4)  # path 0 -> 2 -> 3 -> 4: tokens 4, 6, 7, 8
    assert st2.pos == st.pos + 4
    ref, _ = oracle.prefill(w, cfg, [1, 2, 3, 4, 6, 7, 8])
    for l in cfg.gdn_layers:
        assert torch.allclose(st2.ssm[l].double(), ref.ssm[l], atol=1e-5)
        assert torch.allclose(st2.conv[l].double(), ref.conv[l], atol=1e-5)
    for l in cfg.attention_layers:
        assert torch.allclose(st2.kv[l][0].double(), ref.kv[l][0], atol=1e-5)


def test_single_source_modes_leak_only_their_source():
    """leaky-state keeps the exact conv windows; leaky-conv takes the flattened ones (first GDN
    layer, where both see identical inputs)."""
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=2))
    st, _ = m.prefill([3, 4])
    tree = Tree([-1, 0, 0, 1, 2, 2], [1, 2, 3, 4, 5, 6])
    res = {mode: m.verify(st, tree, mode=mode) for mode in ("exact", "leaky", "leaky-state", "leaky-conv")}
    l0 = cfg.gdn_layers[0]
    assert torch.equal(res["leaky-state"].conv[l0], res["exact"].conv[l0])
    assert torch.equal(res["leaky-conv"].conv[l0], res["leaky"].conv[l0])
    assert not torch.equal(res["leaky-conv"].conv[l0], res["exact"].conv[l0])
    assert not torch.allclose(res["leaky-state"].ssm[l0], res["exact"].ssm[l0])


def test_weight_shapes_describe_init_weights():
    from ddsim.model.weights import weight_shapes
    for cfg in (get_preset("micro"), get_preset("tiny"),
                get_preset("micro").replace(num_experts=3, num_experts_per_tok=2, moe_intermediate_size=8,
                                            shared_expert_intermediate_size=8, attn_output_gate=True, qk_norm=True)):
        w = init_weights(cfg, seed=0)
        assert {k: tuple(v.shape) for k, v in w.items()} == weight_shapes(cfg)


def test_oracle_lazy_weights_and_float32_placement(monkeypatch):
    """Full-size models convert weights tensor by tensor as used; same numbers as converting once."""
    from ddsim.oracle import model as om
    cfg = get_preset("micro")
    w = init_weights(cfg, seed=0)
    tree = Tree([-1, 0, 0, 1], [1, 2, 3, 4])
    st, _ = oracle.prefill(w, cfg, [5, 6])
    eager = oracle.verify_tree(w, cfg, st, tree.parents, tree.tokens)
    monkeypatch.setattr(om._Weights, "EAGER_BYTES", 0)
    lazy = oracle.verify_tree(w, cfg, st, tree.parents, tree.tokens)
    assert torch.equal(eager.logits, lazy.logits) and eager.logits.dtype == torch.float64
    f32 = oracle.verify_tree(w, cfg, st, tree.parents, tree.tokens, dtype=torch.float32)
    assert f32.logits.dtype == torch.float32
    assert torch.allclose(f32.logits.double(), eager.logits, atol=1e-4)
