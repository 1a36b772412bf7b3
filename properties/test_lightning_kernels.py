"""The lightning-attention (MiniMax) fast path against the float64 oracle on hypothesis trees: outputs and
per-node states in both modes and every input dtype, the commit along the accepted path, inputs and the committed
state bit-identical after every call, states NaN-poisoned before the loop writes them, and the leak: off the
order-exact nodes the leaky path is the oracle's flattened recurrence, on them the exact one. Every backend: PyTorch,
the Triton recurrent kernel and the masked form of the exact verify without states (compiled on a GPU, in Triton's
interpreter on the CPU); the masked form also on paths longer than its chunk."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.measure.compare import assert_close
from ddsim.properties.kernel_checks import check_verify_against_oracle, on_device
from ddsim.properties.strategies import lightning_inputs


def _args(inp, dtype=torch.float32):
    return {k: inp[k].to(dtype) for k in ("q", "k", "v")}


# each backend gets every drawn example; "triton" runs the masked form for exact without per-node states
# the Triton designs run in the interpreter: `make test-slow`
SLOW = lambda backend: pytest.param(backend, marks=pytest.mark.slow)  # noqa: E731
BACKENDS = pytest.mark.parametrize("backend", ["torch", SLOW("triton"), SLOW("triton-recurrent")])
MODES = pytest.mark.parametrize("mode", ["exact", "leaky"])
# each (backend, mode) draws its own examples: fewer each than the profile's, more in all than one drawn pair
PER_PAIR = settings(max_examples=15)


@BACKENDS
@MODES
@PER_PAIR
@given(inp=lightning_inputs(max_nodes=7), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       keep=st.booleans())
def test_lightning_verify_and_states_match_oracle(inp, mode, dtype, backend, keep):
    check_verify_against_oracle(gb.lightning_tree_verify, oracle.lightning_tree_verify, _args(inp, dtype),
                                kw=dict(decay=inp["decay"], parents=inp["parents"]), initial_state=inp["initial_state"],
                                mode=mode, dtype=dtype, backend=backend, keep=keep)


@BACKENDS
@PER_PAIR
@given(inp=lightning_inputs(max_nodes=7), picks=st.lists(st.integers(0, 10**6), min_size=2, max_size=2))
def test_lightning_commit_is_the_accepted_nodes_state(inp, picks, backend):
    acc = [picks[i] % t.size for i, t in enumerate(inp["trees"])]
    args = _args(inp)
    dev, kw, S0 = on_device(args), on_device(dict(decay=inp["decay"], parents=inp["parents"])), on_device(inp["initial_state"]).clone()
    out = gb.lightning_tree_commit(dev["k"], dev["v"], **kw, accepted=acc, initial_state=S0, backend=backend).cpu()
    ref = oracle.lightning_tree_commit(args["k"], args["v"], decay=inp["decay"], parents=inp["parents"], accepted=acc,
                                       initial_state=inp["initial_state"])
    assert_close("committed state", out, ref, dtype=torch.float32, slack=5)
    assert torch.equal(S0.cpu(), inp["initial_state"])
    _, states = gb.lightning_tree_verify(**dev, **kw, initial_state=S0, output_states=True)
    assert_close("commit = the accepted node's state", out, states.cpu()[torch.arange(len(acc)), torch.tensor(acc)],
                 dtype=torch.float32, slack=5)


@pytest.mark.parametrize("backend", ["torch", SLOW("triton-recurrent")])  # one design, both modes: bit for bit
@given(inp=lightning_inputs(max_nodes=7))
def test_lightning_leaky_is_exact_where_the_layout_is(inp, backend):
    args = on_device(_args(inp))
    kw = dict(on_device(dict(decay=inp["decay"], parents=inp["parents"], initial_state=inp["initial_state"])), backend=backend)
    exact, leaky = (gb.lightning_tree_verify(**args, **kw, mode=m).cpu() for m in ("exact", "leaky"))
    ox = torch.tensor([list(t.order_exact) for t in inp["trees"]])
    assert torch.equal(exact[ox], leaky[ox])


@BACKENDS
def test_a_sibling_inherits_its_elder_siblings_state_in_the_leaky_path(backend):
    """A star of three nodes: node 2's leaky state is lambda * node 1's state + k2 v2^T, not built on the root's."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 2, 3, generator=g) for _ in range(3))
    decay = torch.tensor([0.9, 0.5])
    kw = on_device(dict(decay=decay, parents=torch.tensor([[-1, 0, 0]]), initial_state=torch.randn(1, 2, 3, 3, generator=g),
                        output_states=True, backend=backend))
    _, ex = gb.lightning_tree_verify(*on_device((q, k, v)), mode="exact", **kw)
    _, lk = gb.lightning_tree_verify(*on_device((q, k, v)), mode="leaky", **kw)
    ex, lk = ex.cpu(), lk.cpu()
    assert torch.equal(ex[:, :2], lk[:, :2]) and not torch.allclose(ex[:, 2], lk[:, 2])
    want = decay[:, None, None] * lk[0, 1] + torch.einsum("hk,hv->hkv", k[0, 2], v[0, 2])
    torch.testing.assert_close(lk[0, 2], want)
    torch.testing.assert_close(ex[0, 2], decay[:, None, None] * ex[0, 0] + torch.einsum("hk,hv->hkv", k[0, 2], v[0, 2]))


@pytest.mark.slow
@pytest.mark.parametrize("T, BD", [(33, 16), (20, 8)])
def test_the_masked_form_reads_long_paths_in_chunks(T, BD):
    """Chains of 33 and 20 nodes (three chunks of the root path each), decays from fast (0.01: lambda^32 underflows
    to 0) to none (1): the masked form equals the oracle."""
    from ddsim.gpu_backend import triton_lightning
    gen = torch.Generator().manual_seed(5)
    H, K, V = 3, 4, 5
    parents = torch.tensor([list(range(-1, T - 1))])
    q, k, v = (torch.randn(1, T, H, d, generator=gen) for d in (K, K, V))
    decay, S0 = torch.tensor([0.01, 0.9, 1.0]), torch.randn(1, H, K, V, generator=gen)
    launch, o = triton_lightning.plan_masked(*on_device((q, k, v)), decay=on_device(decay), parents=on_device(parents),
                                             initial_state=on_device(S0), block_d=BD)
    launch()
    o = o.cpu()
    ref = oracle.lightning_tree_verify(q, k, v, decay=decay, parents=parents, initial_state=S0)
    assert torch.isfinite(o).all()
    assert_close("o (masked)", o, ref, dtype=torch.float32, slack=5)
