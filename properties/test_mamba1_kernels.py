"""The Mamba1 (selective scan, Jamba) fast path against the float64 oracle on hypothesis trees: outputs and
per-node states in both modes and every input dtype, the commit along the accepted path, inputs and the
committed state bit-identical after every call, states NaN-poisoned before the loop writes them (a node
it skipped cannot pass), and the leak there: off the order-exact nodes the leaky path differs. Both backends: PyTorch
and the Triton recurrent kernel (compiled on a GPU, in Triton's interpreter on the CPU)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.measure.compare import assert_close
from ddsim.properties.kernel_checks import on_device
from ddsim.properties.strategies import mamba1_inputs

TENSORS = ("x", "dt", "A", "B", "C", "D", "dt_bias")


def _args(inp, dtype=torch.float32):
    return {k: (None if inp[k] is None else inp[k].to(dtype) if k in ("x", "B", "C") else inp[k]) for k in TENSORS}


BACKENDS = pytest.mark.parametrize("backend", ["torch", "triton"])  # each backend gets every drawn example
MODES = pytest.mark.parametrize("mode", ["exact", "leaky"])
# each (backend, mode) draws its own examples: fewer each than the profile's, more in all than one drawn pair
PER_PAIR = settings(max_examples=15)


@BACKENDS
@MODES
@PER_PAIR
@given(inp=mamba1_inputs(max_nodes=7), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_mamba1_verify_and_states_match_oracle(inp, mode, dtype, backend):
    args = _args(inp, dtype)
    dev, par = on_device(args), on_device(inp["parents"])  # the fast path's inputs on the GPU where there is one
    before = {k: v.clone() for k, v in dev.items() if v is not None}
    S0 = on_device(inp["initial_state"]).clone()
    y, states = gb.mamba1_tree_verify(**dev, dt_softplus=inp["dt_softplus"], parents=par,
                                      initial_state=S0, mode=mode, output_states=True, backend=backend)
    ref_y, ref = oracle.mamba1_tree_verify(**args, dt_softplus=inp["dt_softplus"], parents=inp["parents"],
                                           initial_state=inp["initial_state"], mode=mode, output_states=True)
    assert y.dtype == dtype and y.shape == ref_y.shape and states.shape == ref.shape
    assert_close(f"y ({mode})", y.cpu(), ref_y, dtype=dtype, slack=5)
    assert_close(f"per-node states ({mode})", states.cpu(), ref, dtype=torch.float32, slack=5)
    assert torch.equal(S0.cpu(), inp["initial_state"])  # verify never writes the committed state
    assert all(torch.equal(dev[k], v) for k, v in before.items())
    y2 = gb.mamba1_tree_verify(**dev, dt_softplus=inp["dt_softplus"], parents=par, initial_state=S0, mode=mode,
                               backend=backend)
    assert torch.equal(y2, y)  # without per-node states returned: the same outputs


@BACKENDS
@PER_PAIR
@given(inp=mamba1_inputs(max_nodes=7), picks=st.lists(st.integers(0, 10**6), min_size=2, max_size=2))
def test_mamba1_commit_is_the_accepted_nodes_state(inp, picks, backend):
    acc = [picks[i] % t.size for i, t in enumerate(inp["trees"])]
    args = _args(inp)
    kw = {k: args[k] for k in ("x", "dt", "A", "B", "dt_bias")}
    dev, par, S0 = on_device(args), on_device(inp["parents"]), on_device(inp["initial_state"]).clone()
    out = gb.mamba1_tree_commit(**{k: dev[k] for k in kw}, dt_softplus=inp["dt_softplus"], parents=par, accepted=acc,
                                initial_state=S0, backend=backend).cpu()
    ref = oracle.mamba1_tree_commit(**kw, dt_softplus=inp["dt_softplus"], parents=inp["parents"], accepted=acc,
                                    initial_state=inp["initial_state"])
    assert_close("committed state", out, ref, dtype=torch.float32, slack=5)
    assert torch.equal(S0.cpu(), inp["initial_state"])
    _, states = gb.mamba1_tree_verify(**dev, dt_softplus=inp["dt_softplus"], parents=par, initial_state=S0,
                                      output_states=True)
    assert_close("commit = the accepted node's state", out, states.cpu()[torch.arange(len(acc)), torch.tensor(acc)],
                 dtype=torch.float32, slack=5)


@BACKENDS
@PER_PAIR
@given(inp=mamba1_inputs(max_nodes=7))
def test_mamba1_leaky_is_exact_where_the_layout_is_and_leaks_elsewhere(inp, backend):
    args = _args(inp)
    kw = dict(dt_softplus=inp["dt_softplus"], parents=inp["parents"], initial_state=inp["initial_state"])
    exact, leaky = (gb.mamba1_tree_verify(**on_device(args), **on_device(kw), mode=m, backend=backend).cpu()
                    for m in ("exact", "leaky"))
    ox = torch.tensor([list(t.order_exact) for t in inp["trees"]])
    assert torch.equal(exact[ox], leaky[ox])  # the same computation on order-exact nodes, bit for bit
    ref = oracle.mamba1_tree_verify(**args, **kw, mode="leaky")
    assert_close("leaky = the oracle's flattened recurrence", leaky, ref, dtype=torch.float32, slack=5)


@BACKENDS
def test_a_sibling_inherits_its_elder_siblings_state_in_the_leaky_path(backend):
    """A star of three nodes: node 2's leaky state is built from node 1's, not the root's."""
    g = torch.Generator().manual_seed(0)
    x, dt = torch.randn(1, 3, 4, generator=g), torch.randn(1, 3, 4, generator=g)
    A, B, C = -torch.rand(4, 3, generator=g) - 0.1, torch.randn(1, 3, 3, generator=g), torch.randn(1, 3, 3, generator=g)
    kw = on_device(dict(parents=torch.tensor([[-1, 0, 0]]), initial_state=torch.randn(1, 4, 3, generator=g),
                        output_states=True, backend=backend))
    _, ex = gb.mamba1_tree_verify(*on_device((x, dt, A, B, C)), mode="exact", **kw)
    _, lk = gb.mamba1_tree_verify(*on_device((x, dt, A, B, C)), mode="leaky", **kw)
    ex, lk = ex.cpu(), lk.cpu()
    assert torch.equal(ex[:, :2], lk[:, :2]) and not torch.allclose(ex[:, 2], lk[:, 2])
    d = torch.nn.functional.softplus(dt[0, 2])
    want = torch.exp(d[:, None] * A) * lk[0, 1] + (d * x[0, 2])[:, None] * B[0, 2][None]
    torch.testing.assert_close(lk[0, 2], want)
