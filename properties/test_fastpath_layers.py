"""Every pure-torch fast path against the oracle on hypothesis trees (layer level)."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.measure.compare import assert_close
from ddsim.properties.kernel_checks import DEVICE as TRITON_DEVICE  # compiled on a GPU, else interpreted
from ddsim.properties.strategies import conv_inputs, fixed_conv_example, fixed_gdn_example, gdn_inputs


def _on(backend, inp):
    """inp's tensors on the device ``backend`` runs on (the torch backend: where they are)."""
    if backend == "torch":
        return inp
    return {k: v.to(TRITON_DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}


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


@given(gdn_inputs(), st.data())
@example(fixed_gdn_example(), None)
def test_gdn_pool_slots_and_fused_gates_match_oracle(inp, data):
    """The torch path's state-pool addressing and fused gates (g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b)), verify and commit, against the oracle on the plain gates and states; pool
    slots outside the batch stay bit-identical."""
    B, T, HV = inp["g"].shape
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen)
    A_log, dt_bias = torch.log(1 + 15 * torch.rand(HV, generator=gen)), torch.randn(HV, generator=gen) - 3
    g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(a.double() + dt_bias.double())  # plain gates
    beta = torch.sigmoid(b.double())
    pool = torch.randn(B + 2, *inp["initial_state"].shape[1:], generator=gen)
    slots = torch.randperm(B + 2, generator=gen)[:B]
    pool[slots] = inp["initial_state"]
    before = pool.clone()
    fused = dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias, parents=inp["parents"], initial_state=pool,
                 state_indices=slots, backend="torch")
    o = gb.gdn_tree_verify(inp["q"], inp["k"], inp["v"], mode="exact", **fused)
    ref = oracle.gdn_tree_verify(inp["q"], inp["k"], inp["v"], g, beta, parents=inp["parents"],
                                 initial_state=inp["initial_state"])
    assert_close("o (pool slots, fused gates)", o, ref, dtype=torch.float32, slack=5)
    acc = [0] * B if data is None else [data.draw(st.integers(0, t.size - 1)) for t in inp["trees"]]
    out = gb.gdn_tree_commit(inp["k"], inp["v"], accepted=acc, **fused)
    ref = oracle.gdn_tree_commit(inp["k"], inp["v"], g, beta, parents=inp["parents"], accepted=acc,
                                 initial_state=inp["initial_state"])
    assert_close("committed state (pool slots, fused gates)", out, ref, dtype=torch.float32, slack=5)
    assert torch.equal(pool, before)  # the torch path writes no pool slot


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


@given(conv_inputs(), st.lists(st.integers(0, 10**6), min_size=2, max_size=2), st.sampled_from(["torch", "triton"]),
       st.booleans())
@example(fixed_conv_example(), [5, 3], "torch", True)
@example(fixed_conv_example(), [5, 3], "triton", True)
def test_conv_pool_slots_and_inplace_commit_through_the_public_api(inp, picks, backend, inplace):
    """The public conv functions address a window pool by state_indices on both backends: the tree
    conv reads the batch's slots, the commit writes them only when inplace; every other slot stays
    bit-identical, and the results equal the oracle on the plain per-sequence windows."""
    ref_inp = inp
    inp = _on(backend, inp)
    B = inp["x"].shape[0]
    gen = torch.Generator().manual_seed(11)
    win = inp["initial_window"]
    pool = torch.randn(B + 3, *win.shape[1:], generator=gen, dtype=win.dtype).to(win.device)
    slots = torch.randperm(B + 3, generator=gen)[:B].to(win.device)
    pool[slots] = win
    before = pool.clone()
    kw = dict(parents=inp["parents"], state_indices=slots, backend=backend)
    y = gb.tree_causal_conv1d(inp["x"], weight=inp["weight"], bias=inp["bias"], initial_window=pool, **kw)
    y_ref = oracle.tree_causal_conv1d(ref_inp["x"], weight=ref_inp["weight"], bias=ref_inp["bias"],
                                      parents=ref_inp["parents"], initial_window=ref_inp["initial_window"])
    assert_close("conv out (pool slots)", y.cpu(), y_ref, dtype=torch.float32)
    assert torch.equal(pool, before)  # reading the pool writes nothing
    acc = [picks[b] % t.size for b, t in enumerate(inp["trees"])]
    out = gb.conv_tree_commit(inp["x"], accepted=acc, initial_window=pool, inplace=inplace, **kw)
    ref = oracle.conv_tree_commit(ref_inp["x"], parents=ref_inp["parents"], accepted=acc,
                                  initial_window=ref_inp["initial_window"])
    others = torch.ones(B + 3, dtype=torch.bool, device=pool.device)
    others[slots] = False
    if inplace:
        assert out is pool
        assert torch.equal(pool[slots].double().cpu(), ref)
        assert torch.equal(pool[others], before[others])  # slots outside the batch: bit-identical
    else:
        assert torch.equal(out.double().cpu(), ref) and torch.equal(pool, before)


@given(gdn_inputs(), st.data())
def test_gdn_inplace_commit_on_the_torch_backend(inp, data):
    """The torch backend commits into pool slots in place like the Triton one."""
    B = inp["k"].shape[0]
    gen = torch.Generator().manual_seed(5)
    s0 = inp["initial_state"]
    pool = torch.randn(B + 2, *s0.shape[1:], generator=gen)
    slots = torch.randperm(B + 2, generator=gen)[:B]
    pool[slots] = s0
    before = pool.clone()
    acc = [data.draw(st.integers(0, t.size - 1)) for t in inp["trees"]]
    out = gb.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], parents=inp["parents"], accepted=acc,
                             initial_state=pool, state_indices=slots, inplace=True, backend="torch")
    ref = oracle.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], parents=inp["parents"], accepted=acc,
                                 initial_state=s0)
    others = torch.ones(B + 2, dtype=torch.bool)
    others[slots] = False
    assert out is pool
    assert_close("committed state (in place)", pool[slots], ref, dtype=torch.float32, slack=5)
    assert torch.equal(pool[others], before[others])


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])  # the interpreter: 15 s
@given(gdn_inputs(), conv_inputs(), st.sampled_from(["exact", "leaky"]))
@example(fixed_gdn_example(), fixed_conv_example(), "exact")
def test_a_tree_plan_gives_the_same_results_as_raw_parents(backend, inp, cinp, mode):
    """A TreePlan (validated once, tables cached) is interchangeable with raw parents on both
    backends, reused across calls and modes as every layer of a model reuses it."""
    inp, cinp = _on(backend, inp), _on(backend, cinp)
    args = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    plan = gb.TreePlan(inp["parents"])
    for _ in range(2):  # the second call reads the cached tables
        o_raw = gb.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode,
                                   backend=backend)
        o_plan = gb.gdn_tree_verify(**args, parents=plan, initial_state=inp["initial_state"], mode=mode, backend=backend)
        assert torch.equal(o_raw, o_plan)
    cplan = gb.TreePlan(cinp["parents"])
    kw = dict(weight=cinp["weight"], bias=cinp["bias"], initial_window=cinp["initial_window"], mode=mode,
              output_windows=True, backend=backend)
    y_raw, w_raw = gb.tree_causal_conv1d(cinp["x"], parents=cinp["parents"], **kw)
    y_plan, w_plan = gb.tree_causal_conv1d(cinp["x"], parents=cplan, **kw)
    assert torch.equal(y_raw, y_plan) and torch.equal(w_raw, w_plan)


def test_a_tree_plan_is_checked_once_and_must_fit():
    import pytest
    with pytest.raises(ValueError, match="node 2: parent 5 is not an earlier node"):
        gb.TreePlan(torch.tensor([[-1, 0, 5]]))
    with pytest.raises(ValueError, match=r"parents: expected \[B, T\]"):
        gb.TreePlan(torch.tensor([-1, 0]))
    inp = fixed_gdn_example()
    B, T = inp["parents"].shape
    other = gb.TreePlan(torch.tensor([[-1] + list(range(T))] * B))  # one node too many
    with pytest.raises(ValueError, match="a plan for"):
        gb.gdn_tree_verify(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], parents=other,
                           initial_state=inp["initial_state"])
