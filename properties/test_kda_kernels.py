"""The Kimi Delta Attention (KDA) fast path against the float64 oracle on hypothesis trees: outputs and per-node
states in both modes and every input dtype, the commit along the accepted path, inputs and the committed state
bit-identical after every call, and the leak: on order-exact nodes the leaky path is the exact one (bit for bit,
compiled at KDA's serving widths; at the odd, narrow widths drawn here within an fp32 rounding compiled).
A per-channel decay must act per key row (a planted per-head decay is caught). Every backend: PyTorch, the Triton
recurrent kernel and the WY form (compiled on a GPU, in Triton's interpreter on the CPU); the WY form also on paths longer than its
chunk and under decays whose inverse overflows fp32."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.measure.compare import assert_close
from ddsim.properties.kernel_checks import DEVICE, check_verify_against_oracle, on_device
from ddsim.properties.strategies import kda_inputs


def _args(inp, dtype=torch.float32):
    return {k: inp[k].to(dtype) if k in ("q", "k", "v") else inp[k] for k in ("q", "k", "v", "g", "beta")}


# each backend gets every drawn example; "triton-wy" runs the WY form for exact without per-node states ("triton"
# takes it for large batches only: the drawn ones run its recurrence)
# the Triton designs run in the interpreter: `make test-slow`
SLOW = lambda backend: pytest.param(backend, marks=pytest.mark.slow)  # noqa: E731
BACKENDS = pytest.mark.parametrize("backend", ["torch", SLOW("triton-recurrent"), SLOW("triton-wy")])
MODES = pytest.mark.parametrize("mode", ["exact", "leaky"])
# each (backend, mode) draws its own examples: fewer each than the profile's, more in all than one drawn pair
PER_PAIR = settings(max_examples=15)


@BACKENDS
@MODES
@PER_PAIR
@given(inp=kda_inputs(max_nodes=7), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       keep=st.booleans())
def test_kda_verify_and_states_match_oracle(inp, mode, dtype, backend, keep):
    check_verify_against_oracle(gb.kda_tree_verify, oracle.kda_tree_verify, _args(inp, dtype),
                                kw=dict(parents=inp["parents"]), initial_state=inp["initial_state"], mode=mode,
                                dtype=dtype, backend=backend, keep=keep)


@BACKENDS
@PER_PAIR
@given(inp=kda_inputs(max_nodes=7), picks=st.lists(st.integers(0, 10**6), min_size=2, max_size=2))
def test_kda_commit_is_the_accepted_nodes_state(inp, picks, backend):
    acc = [picks[i] % t.size for i, t in enumerate(inp["trees"])]
    args = _args(inp)
    kw = {k: args[k] for k in ("k", "v", "g", "beta")}
    dev, par, S0 = on_device(args), on_device(inp["parents"]), on_device(inp["initial_state"]).clone()
    out = gb.kda_tree_commit(**{k: dev[k] for k in kw}, parents=par, accepted=acc, initial_state=S0,
                             backend=backend).cpu()
    ref = oracle.kda_tree_commit(**kw, parents=inp["parents"], accepted=acc, initial_state=inp["initial_state"])
    assert_close("committed state", out, ref, dtype=torch.float32, slack=5)
    assert torch.equal(S0.cpu(), inp["initial_state"])
    _, states = gb.kda_tree_verify(**dev, parents=par, initial_state=S0, output_states=True)
    assert_close("commit = the accepted node's state", out, states.cpu()[torch.arange(len(acc)), torch.tensor(acc)],
                 dtype=torch.float32, slack=5)


def _same_steps(exact, leaky, backend):
    """exact's and leaky's results on nodes where both make the same steps: the same bits from PyTorch and in Triton's
    interpreter. Compiled, the Triton kernel's two compilations (parent-indexed, flattened) may lay a tile of the odd,
    narrow widths drawn here out apart and sum its rows in another order: within an fp32 rounding there (on the H200,
    KDA at K = 3 differed by up to an ulp; at its serving widths the bits agree: the test below)."""
    if backend == "torch" or DEVICE == "cpu":
        assert torch.equal(exact, leaky)
    else:
        torch.testing.assert_close(leaky, exact, rtol=1e-6, atol=1e-6 * float(exact.abs().max()))


@pytest.mark.parametrize("backend", ["torch", SLOW("triton-recurrent")])  # one design, both modes
@given(inp=kda_inputs(max_nodes=7))
def test_kda_leaky_is_exact_where_the_layout_is(inp, backend):
    args = on_device(_args(inp))
    kw = dict(parents=on_device(inp["parents"]), initial_state=on_device(inp["initial_state"]), backend=backend)
    exact, leaky = (gb.kda_tree_verify(**args, **kw, mode=m).cpu() for m in ("exact", "leaky"))
    ox = torch.tensor([list(t.order_exact) for t in inp["trees"]])
    _same_steps(exact[ox], leaky[ox], backend)


@pytest.mark.slow
def test_kda_modes_make_the_same_bits_at_its_serving_widths():
    """At Kimi Linear's head widths (K = V = 128), on DDTree trees of 16 nodes, the Triton recurrent kernel's leaky
    verify gives the exact verify's bits on the order-exact nodes, outputs and per-node states, compiled as in the
    interpreter (bf16 inputs, as a server's)."""
    from ddsim.bench.bench import ddtree_batch
    trees, parents = ddtree_batch(2, 16, seed=3)
    gen = torch.Generator().manual_seed(11)
    B, T, H, K, V = 2, 16, 2, 128, 128
    q, k, v = (torch.randn(B, T, H, d, generator=gen).to(torch.bfloat16) for d in (K, K, V))
    g, beta = -torch.rand(B, T, H, K, generator=gen), torch.rand(B, T, H, generator=gen)
    kw = on_device(dict(parents=parents, initial_state=torch.randn(B, H, K, V, generator=gen), output_states=True))
    x = on_device((q, k, v, g, beta))
    ex, lk = (gb.kda_tree_verify(*x, **kw, mode=m, backend="triton-recurrent") for m in ("exact", "leaky"))
    ox = on_device(torch.tensor([list(t.order_exact) for t in trees]))
    assert int(ox.sum()) > B and not bool(ox.all())  # chains past the roots, and nodes off them (where the modes part)
    for a, b in zip(ex, lk):
        assert torch.equal(a[ox], b[ox])
        assert not torch.equal(a[~ox], b[~ox])


@BACKENDS
def test_the_decay_acts_per_key_channel(backend):
    """Two key channels with different decays: the state's rows decay apart (a per-head decay, the GDN's, would
    scale both rows alike); a sibling's leaky state is built on its elder sibling's."""
    S0 = torch.ones(1, 1, 2, 1)
    z = torch.zeros(1, 2, 1, 2)
    g = torch.log(torch.tensor([0.5, 0.9])).expand(1, 2, 1, 2).contiguous()
    kw = on_device(dict(parents=torch.tensor([[-1, 0]]), initial_state=S0, output_states=True, backend=backend))
    _, st_ = gb.kda_tree_verify(*on_device((z, z, torch.zeros(1, 2, 1, 1), g, torch.zeros(1, 2, 1))), **kw)
    torch.testing.assert_close(st_.cpu()[0, 1, 0, :, 0], torch.tensor([0.25, 0.81]))
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 3, 2, 3, generator=gen), torch.randn(1, 3, 2, 3, generator=gen), torch.randn(1, 3, 2, 4, generator=gen)
    g3, b3 = -torch.rand(1, 3, 2, 3, generator=gen), torch.rand(1, 3, 2, generator=gen)
    kw = on_device(dict(parents=torch.tensor([[-1, 0, 0]]), initial_state=torch.randn(1, 2, 3, 4, generator=gen),
                        output_states=True, backend=backend))
    q, k, v, g3, b3 = on_device((q, k, v, g3, b3))
    _, ex = gb.kda_tree_verify(q, k, v, g3, b3, mode="exact", **kw)
    _, lk = gb.kda_tree_verify(q, k, v, g3, b3, mode="leaky", **kw)
    _same_steps(ex[:, :2].cpu(), lk[:, :2].cpu(), backend)
    assert not torch.allclose(ex[:, 2], lk[:, 2])


@pytest.mark.slow
@pytest.mark.parametrize("T, BD", [(33, 16), (20, 8), (9, 16)])
def test_the_wy_form_reads_long_paths_in_chunks_and_never_overflows(T, BD):
    """Chains of 33 and 20 nodes (three chunks of the root path each) and a star, under decays of -30 per step and
    channel (the path's summed log decay reaches -990: exp(-Gamma) overflows fp32, the form's suffix sums do not):
    the WY form equals the oracle."""
    from ddsim.gpu_backend import triton_kda
    gen = torch.Generator().manual_seed(3)
    H, K, V = 2, 4, 5
    parents = torch.tensor([list(range(-1, T - 1)) if T > 9 else [-1] + [0] * (T - 1)])
    q, k, v = (torch.randn(1, T, H, d, generator=gen) for d in (K, K, V))
    for scale in (0.1, 30.0):
        g = -torch.rand(1, T, H, K, generator=gen) * scale
        beta, S0 = torch.rand(1, T, H, generator=gen), torch.randn(1, H, K, V, generator=gen)
        launch, o = triton_kda.plan_wy(*on_device((q, k, v, g, beta)), parents=on_device(parents),
                                       initial_state=on_device(S0), block_d=BD)
        launch()
        o = o.cpu()
        ref = oracle.kda_tree_verify(q, k, v, g, beta, parents=parents, initial_state=S0)
        assert torch.isfinite(o).all()
        assert_close(f"o (wy, decay scale {scale})", o, ref, dtype=torch.float32, slack=5)


@pytest.mark.parametrize("B, H, mode, keep, want", [(1, 2, "exact", False, "recurrent"), (64, 2, "exact", False, "wy"),
                                                    (64, 2, "exact", True, "recurrent"),
                                                    (64, 2, "leaky", False, "recurrent")])
def test_the_default_design_takes_the_wy_form_for_large_batches_without_states(B, H, mode, keep, want, monkeypatch):
    from ddsim.gpu_backend import triton_kda
    took = []
    for name in ("wy", "recurrent"):
        real = getattr(triton_kda, f"plan_{name}")
        monkeypatch.setattr(triton_kda, f"plan_{name}", lambda *a, _n=name, _r=real, **kw: (took.append(_n), _r(*a, **kw))[1])
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, 1, H, 2, generator=gen) for _ in range(3))
    g, beta = -torch.rand(B, 1, H, 2, generator=gen), torch.rand(B, 1, H, generator=gen)
    S0 = torch.randn(B, H, 2, 2, generator=gen)
    triton_kda.kda_tree_verify(*on_device((q, k, v, g, beta)), parents=on_device(torch.tensor([[-1]] * B)), mode=mode,
                               output_states=keep, initial_state=on_device(S0))
    assert took == [want]
