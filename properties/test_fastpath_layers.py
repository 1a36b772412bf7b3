"""Every pure-torch fast path against the oracle on hypothesis trees (layer level)."""
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import gpu_backend as gb
import oracle
from ddsim.compare import assert_close
from properties.strategies import conv_inputs, fixed_conv_example, fixed_gdn_example, gdn_inputs


@given(gdn_inputs(), st.sampled_from(["exact", "leaky"]))
@example(fixed_gdn_example(), "exact")
@example(fixed_gdn_example(), "leaky")
def test_gdn_tree_verify_matches_oracle(inp, mode):
    args = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    s0 = inp["initial_state"]
    s0_before = s0.clone()
    o, states = gb.gdn_tree_verify(**args, parents=inp["parents"], initial_state=s0, mode=mode, output_states=True)
    o_ref, s_ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=s0, mode=mode,
                                          output_states=True)
    assert_close("o", o, o_ref, dtype=torch.float32, slack=5)
    assert_close("states", states, s_ref, dtype=torch.float32, slack=5)
    assert torch.equal(s0, s0_before)  # the committed state is read, never written


@given(gdn_inputs(), st.data())
def test_gdn_commit_matches_oracle(inp, data):
    acc = [data.draw(st.integers(0, t.size - 1)) for t in inp["trees"]]
    s0 = inp["initial_state"]
    s0_before = s0.clone()
    kw = dict(parents=inp["parents"], accepted=acc, initial_state=s0)
    out = gb.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], **kw)
    ref = oracle.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], **kw)
    assert_close("committed state", out, ref, dtype=torch.float32, slack=5)
    assert torch.equal(s0, s0_before)


@given(conv_inputs(), st.sampled_from(["exact", "leaky"]))
@example(fixed_conv_example(), "exact")
@example(fixed_conv_example(), "leaky")
def test_tree_conv_matches_oracle(inp, mode):
    kw = dict(weight=inp["weight"], bias=inp["bias"], parents=inp["parents"], initial_window=inp["initial_window"],
              mode=mode, output_windows=True)
    y, win = gb.tree_causal_conv1d(inp["x"], **kw)
    y_ref, win_ref = oracle.tree_causal_conv1d(inp["x"], **kw)
    assert_close("conv out", y, y_ref, dtype=torch.float32)
    assert torch.equal(win.double(), win_ref)  # windows are copies of inputs: bit-exact


@given(conv_inputs(), st.lists(st.integers(0, 10**6), min_size=2, max_size=2))
@example(fixed_conv_example(), [5, 5])
def test_conv_commit_matches_oracle(inp, picks):
    acc = [picks[b] % t.size for b, t in enumerate(inp["trees"])]
    kw = dict(parents=inp["parents"], accepted=acc, initial_window=inp["initial_window"])
    c = gb.conv_tree_commit(inp["x"], **kw)
    assert torch.equal(c.double(), oracle.conv_tree_commit(inp["x"], **kw))
