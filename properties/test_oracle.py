"""The oracle against itself: chains equal prefill, nodes equal decoding from scratch, and
leaky equals exact exactly where the layout makes them the same."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ddsim import oracle
from ddsim.model.config import get_preset
from ddsim.model.weights import init_weights
from ddsim.properties.strategies import (
    conv_inputs,
    fixed_conv_example,
    fixed_gdn_example,
    gdn_inputs,
    kda_inputs,
    lightning_inputs,
    mamba1_inputs,
    mamba2_inputs,
    model_configs,
    trees,
)

MICRO = get_preset("micro")
MICRO_W = init_weights(MICRO, seed=1)


@given(st.lists(st.integers(0, MICRO.vocab_size - 1), min_size=0, max_size=4),
       st.lists(st.integers(0, MICRO.vocab_size - 1), min_size=1, max_size=6))
def test_oracle_chain_equals_prefill(prefix, block):
    st0, _ = oracle.prefill(MICRO_W, MICRO, prefix)
    res = oracle.verify_tree(MICRO_W, MICRO, st0, [-1] + list(range(len(block) - 1)), block)
    _, ref_logits = oracle.prefill(MICRO_W, MICRO, prefix + block)
    assert torch.allclose(res.logits, ref_logits[len(prefix):], rtol=0, atol=1e-12)


@given(model_configs(), st.data(), st.integers(0, 2**16))
def test_oracle_node_equals_root_path_from_scratch(cfg, data, seed):
    w = init_weights(cfg, seed=seed)
    prefix = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), max_size=3))
    t = data.draw(trees(max_size=7, vocab=cfg.vocab_size))
    st0, _ = oracle.prefill(w, cfg, prefix)
    res = oracle.verify_tree(w, cfg, st0, t.parents, t.tokens, order="node")
    for i in range(t.size):
        path_tokens = [t.tokens[n] for n in t.root_path(i)]
        st_i, lg = oracle.prefill(w, cfg, prefix + path_tokens)
        assert torch.allclose(res.logits[i], lg[-1], rtol=0, atol=1e-12)
        for l in cfg.recurrent_layers:
            assert torch.allclose(res.ssm[l][i], st_i.ssm[l], rtol=0, atol=1e-12)
            assert torch.equal(res.conv[l][i], st_i.conv[l])


@given(model_configs(), st.data(), st.integers(0, 2**16))
def test_oracle_by_level_equals_one_node_at_a_time(cfg, data, seed):
    """The batched oracle (each depth level decoded as one batch of rows, each from its parent's
    exact state) equals the one-node-at-a-time oracle up to the reassociation of batched products."""
    w = init_weights(cfg, seed=seed)
    prefix = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), max_size=3))
    t = data.draw(trees(max_size=9, vocab=cfg.vocab_size))
    st0, _ = oracle.prefill(w, cfg, prefix)
    lvl = oracle.verify_tree(w, cfg, st0, t.parents, t.tokens, order="level")
    one = oracle.verify_tree(w, cfg, st0, t.parents, t.tokens, order="node")
    _assert_same_nodes(lvl, one, cfg)


def _assert_same_nodes(got, want, cfg):
    """Two oracle results of one tree equal node by node up to float64 reassociation: logits, hidden
    states, recurrent states, windows and KV."""
    assert torch.allclose(got.logits, want.logits, rtol=0, atol=1e-12)
    assert torch.allclose(got.hidden, want.hidden, rtol=0, atol=1e-12)
    for l in cfg.recurrent_layers:
        assert torch.allclose(got.ssm[l], want.ssm[l], rtol=0, atol=1e-12)
        assert torch.allclose(got.conv[l], want.conv[l], rtol=0, atol=1e-12)
    for l in cfg.attention_layers:
        assert torch.allclose(got.kv[l][0], want.kv[l][0], rtol=0, atol=1e-12)
        assert torch.allclose(got.kv[l][1], want.kv[l][1], rtol=0, atol=1e-12)


@given(model_configs(), st.data(), st.integers(0, 2**16))
def test_oracle_trees_of_several_prompts_equal_each_tree_alone(cfg, data, seed):
    """The oracle over the trees of several prompts at once (each depth of every tree one batch; the
    contexts of different lengths padded and masked) equals each tree alone, node by node, up to the
    reassociation of batched products: logits, hidden states, recurrent states, windows and KV."""
    w = init_weights(cfg, seed=seed)
    n = data.draw(st.integers(1, 3), label="prompts")
    items = []
    for _ in range(n):
        prefix = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), max_size=4))  # lengths differ
        t = data.draw(trees(max_size=7, vocab=cfg.vocab_size))
        items.append((oracle.prefill(w, cfg, prefix)[0], t.parents, t.tokens))
    together = oracle.verify_trees(w, cfg, items)
    for (st0, parents, tokens), got in zip(items, together):
        _assert_same_nodes(got, oracle.verify_tree(w, cfg, st0, parents, tokens, order="node"), cfg)


def test_oracle_trees_mask_the_padding_of_shorter_contexts():
    """Two prompts of different lengths: a context padded without its mask would give the padding
    softmax weight and change the shorter prompt's logits (the case the property above relies on)."""
    st_short, _ = oracle.prefill(MICRO_W, MICRO, [1])
    st_long, _ = oracle.prefill(MICRO_W, MICRO, [1, 2, 3, 4, 5])
    items = [(st_short, [-1, 0, 0], [6, 7, 8]), (st_long, [-1, 0, 1], [9, 10, 11])]
    together = oracle.verify_trees(MICRO_W, MICRO, items)
    for (st0, parents, tokens), got in zip(items, together):
        alone = oracle.verify_tree(MICRO_W, MICRO, st0, parents, tokens)
        assert torch.allclose(got.logits, alone.logits, rtol=0, atol=1e-12)
    assert oracle.verify_trees(MICRO_W, MICRO, []) == []
    empty = oracle.verify_trees(MICRO_W, MICRO, [(st_short, [], [])] + items[:1])
    assert empty[0].logits.shape == (0, MICRO.vocab_size)
    assert torch.allclose(empty[1].logits, together[0].logits, rtol=0, atol=1e-12)


def test_oracle_by_level_in_float32_and_order_checked():
    """In float32 (the oracle's arithmetic on a GPU) the two orders agree to fp32 reassociation."""
    st0, _ = oracle.prefill(MICRO_W, MICRO, [1, 2, 3], dtype=torch.float32)
    parents, tokens = [-1, 0, 0, 1, 1, 2, 3], [4, 5, 6, 7, 8, 9, 10]
    lvl = oracle.verify_tree(MICRO_W, MICRO, st0, parents, tokens, dtype=torch.float32)
    one = oracle.verify_tree(MICRO_W, MICRO, st0, parents, tokens, order="node", dtype=torch.float32)
    assert lvl.logits.dtype == torch.float32
    assert torch.allclose(lvl.logits, one.logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="order"):
        oracle.verify_tree(MICRO_W, MICRO, st0, parents, tokens, order="dfs")


@given(gdn_inputs(dtype=torch.float64))
@example(fixed_gdn_example(dtype=torch.float64))
def test_oracle_gdn_leaky_equals_exact_on_order_exact_nodes(inp):
    args = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    o_e, s_e = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"],
                                      mode="exact", output_states=True)
    o_l, s_l = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"],
                                      mode="leaky", output_states=True)
    for b, t in enumerate(inp["trees"]):
        ex = torch.as_tensor(t.order_exact)
        assert torch.equal(o_e[b, ex], o_l[b, ex]) and torch.equal(s_e[b, ex], s_l[b, ex])
        # and where the layout differs, the leaky state really is different (the leak exists)
        if (~ex).any() and inp["beta"][b].abs().min() > 1e-3:
            assert not torch.equal(s_e[b, ~ex], s_l[b, ~ex])


# per family: the verify, its strategy and the arguments that hold one row per node ([B, T, ...])
RECURRENCES = {
    "gdn": (oracle.gdn_tree_verify, gdn_inputs, ("q", "k", "v", "g", "beta")),
    "mamba2": (oracle.mamba2_tree_verify, mamba2_inputs, ("x", "dt", "B", "C")),
    "mamba1": (oracle.mamba1_tree_verify, mamba1_inputs, ("x", "dt", "B", "C")),
    "kda": (oracle.kda_tree_verify, kda_inputs, ("q", "k", "v", "g", "beta")),
    "lightning": (oracle.lightning_tree_verify, lightning_inputs, ("q", "k", "v")),
}


def _verified(verify, per_node, inp, mode):
    """(the arguments every node shares, the batched verify's outputs, its states after each node) of inputs ``inp``."""
    shared = {k: v for k, v in inp.items() if k not in (*per_node, "parents", "initial_state", "trees", "pool", "slots")}
    out, states = verify(**{k: inp[k] for k in per_node}, **shared, parents=inp["parents"],
                         initial_state=inp["initial_state"], mode=mode, output_states=True)
    return shared, out, states


@pytest.mark.parametrize("family", list(RECURRENCES))
@given(st.data())
def test_oracle_node_is_its_history_verified_as_a_chain(family, data):
    """A node's output and state are, bit for bit, the last node's of its history (root path for exact, nodes 0..t
    for leaky) verified alone as a chain from the committed state: what each mode means, whatever way the oracle
    walks the tree (it steps each node from its predecessor's kept state). Mamba's dt goes in raw: its softplus is
    taken a node at a time, so a node's step is the same bits at any index (oracle/_rounding.py)."""
    verify, inputs, per_node = RECURRENCES[family]
    inp = data.draw(inputs(dtype=torch.float64, max_nodes=10))
    mode = data.draw(st.sampled_from(["exact", "leaky"]))
    shared, out, states = _verified(verify, per_node, inp, mode)
    for b, tree in enumerate(inp["trees"]):
        for t in range(tree.size):
            hist = list(range(t + 1)) if mode == "leaky" else tree.root_path(t)
            o1, s1 = verify(**{k: inp[k][b:b + 1, hist] for k in per_node}, **shared,
                            parents=torch.arange(-1, len(hist) - 1)[None], initial_state=inp["initial_state"][b:b + 1],
                            mode="exact", output_states=True)
            assert torch.equal(out[b, t], o1[0, -1]) and torch.equal(states[b, t], s1[0, -1]), (b, t, hist)


def _elsewhere(t: torch.Tensor, off: int) -> torch.Tensor:
    """t's values in memory of their own, starting ``off`` elements into a fresh buffer: another address."""
    buf = torch.zeros(off + t.numel(), dtype=t.dtype)
    buf[off:] = t.reshape(-1)
    return buf[off:].view(t.shape)


@pytest.mark.parametrize("family", list(RECURRENCES))
@given(st.data())
def test_oracle_rounds_alike_wherever_a_sequence_sits(family, data):
    """A sequence's outputs and states are the same bits whatever its row in the batch and wherever its inputs lie in
    memory: each row of a batched verify equals that row verified alone from copies of its inputs placed 0-7
    elements into fresh memory. (MKL's dot and gemv round by their operands' addresses, and torch's softplus by an
    element's index: an oracle taking C . S by `@`, or softplus over the whole batch, fails this on an AVX-512
    machine.)"""
    verify, inputs, per_node = RECURRENCES[family]
    # Mamba2's state width as models have it (16-128): MKL's gemv rounds by address from 16 columns, not at 2-8
    inp = data.draw(inputs(dtype=torch.float64, max_nodes=6, **({"ns": (16, 64)} if family == "mamba2" else {})))
    mode = data.draw(st.sampled_from(["exact", "leaky"]))
    shared, out, states = _verified(verify, per_node, inp, mode)
    for b in range(len(inp["trees"])):
        for off in range(8):
            row = {k: _elsewhere(inp[k][b:b + 1], off) for k in (*per_node, "parents", "initial_state")}
            o1, s1 = verify(**{k: row[k] for k in per_node}, **shared, parents=row["parents"],
                            initial_state=row["initial_state"], mode=mode, output_states=True)
            assert torch.equal(out[b], o1[0]) and torch.equal(states[b], s1[0]), (b, off)


@pytest.mark.parametrize("family", list(RECURRENCES))
@given(st.data())
def test_oracle_defaults_are_exact_mode_in_float64_and_its_readout_input_is_checked(family, data):
    """Each family's verify at its defaults (mode, output_states, and Mamba's softplus on dt) is its exact mode, its
    outputs and states float64 whatever the inputs' dtype; a read-out input (q, or Mamba's C) of another shape than
    its keys' is refused in one line naming it."""
    verify, inputs, _ = RECURRENCES[family]
    inp = data.draw(inputs(max_nodes=6))  # float32 inputs
    args = {k: v for k, v in inp.items() if k not in ("trees", "pool", "slots")}
    o_exact, s_exact = verify(**args, mode="exact", output_states=True)
    defaults = {k: v for k, v in args.items() if not (k == "dt_softplus" and v)}  # softplus left to its default
    o = verify(**defaults)
    assert isinstance(o, torch.Tensor) and o.dtype == s_exact.dtype == torch.float64
    assert torch.equal(o, o_exact)
    name = "q" if "q" in args else "C"
    wrong = args[name][:, :, :1] if args[name].shape[2] > 1 else torch.cat([args[name]] * 2, 2)  # another head count
    with pytest.raises(ValueError, match=f"^{name}(, k)?: expected"):
        verify(**{**args, name: wrong})


@given(gdn_inputs(dtype=torch.float64), st.sampled_from(["exact", "leaky"]))
def test_oracle_gdn_scale_and_l2norm_are_what_they_say(inp, mode):
    """GDN's scale multiplies the read-out (twice the scale, twice the output, bit for bit; K^-1/2 the default), and
    use_qk_l2norm=False takes q and k as given (l2-normed beforehand, the same outputs and states)."""
    args = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], parents=inp["parents"],
                initial_state=inp["initial_state"], mode=mode, output_states=True)
    o, s = oracle.gdn_tree_verify(**args)
    K = inp["q"].shape[-1]
    o_half, _ = oracle.gdn_tree_verify(**args, scale=0.5 * K ** -0.5)
    assert torch.equal(o, oracle.gdn_tree_verify(**args, scale=K ** -0.5)[0]) and torch.equal(o, 2 * o_half)
    unit = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    o_n, s_n = oracle.gdn_tree_verify(**{**args, "q": unit(inp["q"]), "k": unit(inp["k"])}, use_qk_l2norm=False)
    assert torch.allclose(o_n, o, rtol=1e-12, atol=1e-12) and torch.allclose(s_n, s, rtol=1e-12, atol=1e-12)
    o_raw, _ = oracle.gdn_tree_verify(**args, use_qk_l2norm=False)
    assert not torch.allclose(o_raw, o, rtol=1e-6, atol=1e-6)  # (unnormed inputs drawn from randn: not unit rows)


@given(conv_inputs(dtype=torch.float64))
@example(fixed_conv_example(dtype=torch.float64))
def test_oracle_conv_leaky_equals_exact_on_order_exact_nodes(inp):
    kw = dict(weight=inp["weight"], bias=inp["bias"], parents=inp["parents"], initial_window=inp["initial_window"],
              output_windows=True)
    y_e, w_e = oracle.tree_causal_conv1d(inp["x"], mode="exact", **kw)
    y_l, w_l = oracle.tree_causal_conv1d(inp["x"], mode="leaky", **kw)
    for b, t in enumerate(inp["trees"]):
        ex = torch.as_tensor(t.order_exact)
        assert torch.equal(y_e[b, ex], y_l[b, ex]) and torch.equal(w_e[b, ex], w_l[b, ex])


@given(gdn_inputs(dtype=torch.float64), st.data())
def test_oracle_commit_equals_node_state(inp, data):
    _, states = oracle.gdn_tree_verify(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], parents=inp["parents"],
                                       initial_state=inp["initial_state"], output_states=True)
    acc = [data.draw(st.integers(0, t.size - 1)) for t in inp["trees"]]
    out = oracle.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], parents=inp["parents"],
                                 accepted=acc, initial_state=inp["initial_state"])
    for b, a in enumerate(acc):
        assert torch.allclose(out[b], states[b, a], rtol=0, atol=1e-12)


BF16_PRESETS = ["tiny", "micro-mamba2", "tiny-jamba", "tiny-minimax", "tiny-kimi", "tiny-zamba2", "tiny-lfm2"]


@pytest.mark.parametrize("preset", BF16_PRESETS)
def test_oracle_bf16_products_are_float32_products(preset, monkeypatch):
    """A float32 oracle on bfloat16 weights (a full-size model on a GPU) takes its products x @ W.T with
    W left in bf16 and x split into three bf16 parts: every product weight of every family is taken so
    (only conv filters, A_log and the router are converted), and the result is as close to the float64
    oracle as float32 products of converted weights are (logits, hidden states, recurrent states)."""
    import ddsim.oracle.model as om
    monkeypatch.setattr(om._Weights, "EAGER_BYTES", 0)  # converted as used, as a full-size model is
    split, plain = set(), set()
    product = om._Weights._product

    def recorded(self, k, v):
        out = product(self, k, v)
        if self.bf16_products and v.dim() == 2:
            (plain if out is None else split).add(k.split(".", 2)[-1] if k.startswith("layers.") else k)
        return out
    monkeypatch.setattr(om._Weights, "_product", recorded)
    cfg = get_preset(preset)
    w = {k: v.bfloat16() for k, v in init_weights(cfg, seed=1).items()}
    st0, _ = oracle.prefill(w, cfg, [1, 2, 3])
    parents, tokens = [-1, 0, 0, 1, 2, 2], [4, 5, 6, 7, 8, 9]
    ref = oracle.verify_tree(w, cfg, st0, parents, tokens)
    f32 = oracle.verify_tree(w, cfg, st0, parents, tokens, dtype=torch.float32, bf16_products=False)
    got = oracle.verify_tree(w, cfg, st0, parents, tokens, dtype=torch.float32, bf16_products=True)
    assert split and not any(k.rsplit(".", 1)[-1] not in ("conv", "A_log", "router") for k in plain), plain
    assert cfg.num_experts == 0 or {"mlp.experts.up", "mlp.experts.down"} <= split

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()
    pairs = [(got.logits, f32.logits, ref.logits), (got.hidden, f32.hidden, ref.hidden)]
    pairs += [(got.ssm[l], f32.ssm[l], ref.ssm[l]) for l in cfg.recurrent_layers if ref.ssm[l].numel()]
    for g, f, r in pairs:
        assert g.dtype == torch.float32
        assert rel(g, r) <= 2 * rel(f, r) + 1e-7 and rel(g, r) < 1e-6, (rel(g, r), rel(f, r))


def test_a_bf16_weight_is_only_a_product_operand():
    """A bf16 weight left unconverted has one use, x @ W.T, with x in float32: any other is an error."""
    import ddsim.oracle.model as om
    W = om._Bf16Weight(torch.randn(5, 7).bfloat16())
    x = torch.randn(3, 7)
    assert torch.allclose(x @ W.T, (x.double() @ W.w.double().T).float(), rtol=1e-6, atol=1e-6)
    assert (torch.randn(2, 4, 7) @ W.T).shape == (2, 4, 5) and (torch.randn(7) @ W.T).shape == (5,)
    assert (torch.randn(0, 7) @ W.T).shape == (0, 5)
    for bad in (lambda: x @ W, lambda: x.double() @ W.T, lambda: W.T @ x.T):
        with pytest.raises(TypeError):
            bad()


# Qwen3.6-27B's GDN heads (16 key heads, 48 value heads, 128 wide) on the micro preset's other widths
SERVING_GDN = MICRO.replace(linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                            linear_value_head_dim=128)
GDN_WEIGHTS = {"micro": (MICRO, MICRO_W), "serving heads": (SERVING_GDN, init_weights(SERVING_GDN, seed=1))}


@pytest.mark.parametrize("shape", list(GDN_WEIGHTS))
@given(st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_the_gdn_step_is_the_delta_rule_of_its_matrix_form(shape, n, seed):
    """The model oracle's Gated DeltaNet step (a rank-one update of the decayed state) equals the rule
    as the papers write it, S_t = exp(g) (I - beta k k^T) S_{t-1} + beta k v^T and o_t = S_t^T q_t / sqrt(K),
    formed here with the [K, K] matrix, in float64 (q and k as the step normalises them), at the micro
    preset's heads and at a serving model's."""
    from oracle.model import _gdn_core
    cfg, weights = GDN_WEIGHTS[shape]
    H, HV, K, V = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    layer = cfg.gdn_layers[0]
    C, W = cfg.window_shape(layer)
    g = torch.Generator().manual_seed(seed)
    xin, window = torch.randn(n, C, generator=g, dtype=torch.float64), torch.randn(n, C, W, generator=g, dtype=torch.float64)
    gate, beta = -torch.rand(n, HV, generator=g, dtype=torch.float64), torch.rand(n, HV, generator=g, dtype=torch.float64)
    S = torch.randn(n, HV, K, V, generator=g, dtype=torch.float64)
    o, S_new, _ = _gdn_core(weights, f"layers.{layer}.", cfg, xin, gate, beta, S, window)
    y = torch.nn.functional.silu((torch.cat([window, xin[:, :, None]], 2) * weights[f"layers.{layer}.gdn.conv"]).sum(2))
    unit = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q = unit(y[:, :H * K].view(n, H, K)).repeat_interleave(HV // H, dim=1)
    k = unit(y[:, H * K:2 * H * K].view(n, H, K)).repeat_interleave(HV // H, dim=1)
    v = y[:, 2 * H * K:].view(n, HV, V)
    for r in range(n):
        for h in range(HV):
            kk = k[r, h][:, None]
            want = gate[r, h].exp() * (torch.eye(K, dtype=torch.float64) - beta[r, h] * kk @ kk.T) @ S[r, h] \
                + beta[r, h] * kk @ v[r, h][None]
            torch.testing.assert_close(S_new[r, h], want, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(o[r, h], want.T @ q[r, h] / K ** 0.5, rtol=1e-12, atol=1e-12)
