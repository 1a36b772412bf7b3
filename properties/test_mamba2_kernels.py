"""Every Mamba2 fast path (pure torch, the recurrent Triton kernel, the tree-masked SSD kernel, the
commit) against the float64 oracle on hypothesis trees, as the GDN kernels are: committed states in
a pool whose other slots are NaN, outputs NaN-poisoned by the launchers, the pool bit-identical
after a verify, slots outside the batch bit-identical after a commit. Without a GPU the Triton
kernels run under TRITON_INTERPRET=1 (root conftest)."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.measure.compare import assert_close, compare
from ddsim.properties.kernel_checks import DEVICE
from ddsim.properties.strategies import fixed_mamba2_example, mamba2_inputs

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BACKENDS = ["torch", "triton-recurrent", "triton-ssd"]
TENSORS = ("x", "dt", "A", "B", "C", "D", "dt_bias")


def _args(inp, dtype=torch.float32, device=DEVICE):
    """The layer tensors (x, B, C in ``dtype``) on ``device`` and the scalar options."""
    out = {}
    for k in TENSORS:
        v = inp[k]
        if v is not None:
            v = v.to(dtype) if k in ("x", "B", "C") else v
            v = v.to(device)
        out[k] = v
    return dict(out, dt_softplus=inp["dt_softplus"], dt_limit=inp["dt_limit"])


def _oracle(inp, args, mode, **kw):
    a = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    return oracle.mamba2_tree_verify(**a, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode, **kw)


@given(mamba2_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]), st.sampled_from(BACKENDS),
       st.sampled_from(DTYPES))
@example(fixed_mamba2_example(), "exact", "triton-ssd", torch.float32)
@example(fixed_mamba2_example(), "leaky", "triton-ssd", torch.float32)
@example(fixed_mamba2_example(), "exact", "triton-recurrent", torch.bfloat16)
@example(fixed_mamba2_example(T=40), "exact", "triton-ssd", torch.float32)
@example(fixed_mamba2_example(T=40), "leaky", "triton-ssd", torch.float16)
@example(fixed_mamba2_example(T=40), "exact", "torch", torch.float32)
@example(fixed_mamba2_example(T=40, growing=True), "exact", "triton-ssd", torch.float32)
def test_mamba2_verify_matches_oracle(inp, mode, backend, dtype):
    args = _args(inp, dtype)
    pool, slots = inp["pool"].to(DEVICE), inp["slots"].to(DEVICE)
    before = pool.clone()
    y = gb.mamba2_tree_verify(**args, parents=inp["parents"].to(DEVICE), initial_state=pool, state_indices=slots,
                              mode=mode, backend=backend)
    ref = _oracle(inp, args, mode)
    assert y.dtype == dtype and y.shape == ref.shape
    assert_close(f"y ({backend}, {mode})", y, ref, dtype=dtype, slack=5)
    assert torch.equal(pool.isnan(), before.isnan())
    assert torch.equal(pool.nan_to_num(), before.nan_to_num())  # verify never writes a state


@pytest.mark.parametrize("num_warps", [4, 8])
@pytest.mark.parametrize("mode", ["exact", "leaky"])
def test_mamba2_ssd_at_a_64_row_block_matches_oracle(mode, num_warps):
    """The SSD kernel asked for 64-row blocks (block_i; its default is 32) at 4 and 8 warps, P = 3: its P tile 32
    wide (_common.MIN_V_TILE_64; 16 wide at 8 warps compiles for sm_90 to the N = 8 wgmma layouts of the GDN launch
    that read past its shared memory). Equal to the oracle, the pool untouched."""
    from ddsim.gpu_backend import triton_mamba2
    inp = fixed_mamba2_example(T=40)
    args = _args(inp)
    pool, slots = inp["pool"].to(DEVICE), inp["slots"].to(DEVICE)
    before = pool.clone()
    tiles, bind = [], triton_mamba2.bind
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_mamba2, "bind", lambda kernel, grid, kw: tiles.append(kw.get("BP")) or bind(kernel, grid, kw))
        y = triton_mamba2.mamba2_tree_verify_ssd(**args, parents=inp["parents"].to(DEVICE), initial_state=pool,
                                                 state_indices=slots, mode=mode, block_i=64, num_warps=num_warps)
    assert 32 in tiles and 16 not in tiles, tiles
    assert_close(f"y (ssd, block_i 64, {num_warps} warps, {mode})", y, _oracle(inp, args, mode), dtype=torch.float32,
                 slack=5)
    assert torch.equal(pool.isnan(), before.isnan())
    assert torch.equal(pool.nan_to_num(), before.nan_to_num())


@given(mamba2_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]), st.sampled_from(["torch", "triton-recurrent"]))
@example(fixed_mamba2_example(), "exact", "triton-recurrent")
def test_mamba2_per_node_states_match_oracle(inp, mode, backend):
    args = _args(inp)
    y, states = gb.mamba2_tree_verify(**args, parents=inp["parents"].to(DEVICE),
                                      initial_state=inp["initial_state"].to(DEVICE), mode=mode, output_states=True,
                                      backend=backend)
    ref_y, ref = _oracle(inp, args, mode, output_states=True)
    assert_close("per-node states", states, ref, dtype=torch.float32, slack=5)
    assert_close("y", y, ref_y, dtype=torch.float32, slack=5)


@given(mamba2_inputs(max_nodes=6), st.lists(st.integers(0, 10**6), min_size=2, max_size=2), st.booleans(),
       st.sampled_from(["torch", "triton"]))
@example(fixed_mamba2_example(), [5, 4], True, "triton")
@example(fixed_mamba2_example(), [0, 5], False, "torch")
def test_mamba2_commit_matches_oracle_and_leaves_other_slots(inp, picks, inplace, backend):
    acc = [picks[i] % t.size for i, t in enumerate(inp["trees"])]
    args = _args(inp)
    kw = {k: args[k] for k in ("x", "dt", "A", "B", "dt_bias", "dt_softplus", "dt_limit")}
    pool, slots = inp["pool"].to(DEVICE), inp["slots"].to(DEVICE)
    before = pool.clone()
    out = gb.mamba2_tree_commit(**kw, parents=inp["parents"].to(DEVICE), accepted=acc, initial_state=pool,
                                state_indices=slots, inplace=inplace, backend=backend)
    ref = oracle.mamba2_tree_commit(**{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()},
                                    parents=inp["parents"], accepted=acc, initial_state=inp["initial_state"])
    others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    others[slots.long()] = False
    if inplace:
        assert out is pool
        assert_close("committed slots", pool[slots.long()], ref, dtype=torch.float32, slack=5)
    else:
        assert_close("committed state", out, ref, dtype=torch.float32, slack=5)
        assert torch.equal(pool[slots.long()], before[slots.long()])
    assert torch.equal(pool[others].isnan(), before[others].isnan())  # slots outside the batch: untouched (NaN)


@given(mamba2_inputs(max_nodes=6))
def test_mamba2_commit_equals_the_verify_state_at_the_accepted_node(inp):
    """The snapshot-free commit and the per-node state of an exact verify agree node for node."""
    args = _args(inp, device="cpu")
    kw = {k: args[k] for k in ("x", "dt", "A", "B", "dt_bias", "dt_softplus", "dt_limit")}
    _, states = gb.mamba2_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"],
                                      output_states=True, backend="torch")
    T = inp["parents"].shape[1]
    for a in range(T):
        acc = [a] * len(inp["trees"])
        out = gb.mamba2_tree_commit(**kw, parents=inp["parents"], accepted=acc, initial_state=inp["initial_state"],
                                    backend="torch")
        assert_close(f"commit at {a}", out, states[:, a], dtype=torch.float32, slack=5)


def test_leaky_equals_exact_exactly_on_order_exact_nodes_and_differs_elsewhere():
    """The planted bug a flattened kernel is: on the fixed example its sibling nodes get the wrong
    state (the comparison fails there), while order-exact nodes agree."""
    inp = fixed_mamba2_example()
    args = _args(inp, device="cpu")
    exact = _oracle(inp, args, "exact")
    leaky = gb.mamba2_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode="leaky",
                                  backend="torch")
    for b, t in enumerate(inp["trees"]):
        oe = t.order_exact
        for n in range(t.size):
            c = compare(f"seq {b} node {n}", leaky[b, n], exact[b, n], dtype=torch.float32, slack=5)
            assert c.ok == bool(oe[n]), str(c)


def test_mamba2_rejects_bad_input():
    inp = fixed_mamba2_example()
    args = _args(inp)
    par = inp["parents"].to(DEVICE)
    s0 = inp["initial_state"].to(DEVICE)
    with pytest.raises(ValueError, match="output_states"):
        gb.mamba2_tree_verify(**args, parents=par, initial_state=s0, output_states=True, backend="triton-ssd")
    with pytest.raises(ValueError, match="backend"):
        gb.mamba2_tree_verify(**args, parents=par, initial_state=s0, backend="triton-wy")
    with pytest.raises(ValueError, match="B: H=4 heads is not a multiple of G=3"):
        gb.mamba2_tree_verify(**dict(args, B=torch.zeros(2, 6, 3, 5, device=DEVICE), C=torch.zeros(2, 6, 3, 5, device=DEVICE)),
                              parents=par, initial_state=s0)
    with pytest.raises(ValueError, match=r"dt_bias: expected \[4\]"):
        gb.mamba2_tree_verify(**dict(args, dt_bias=torch.zeros(3, device=DEVICE)), parents=par, initial_state=s0)
    with pytest.raises(ValueError, match="dt_limit"):
        gb.mamba2_tree_verify(**dict(args, dt_limit=(1.0, 0.5)), parents=par, initial_state=s0)
    with pytest.raises(ValueError, match="state_indices: slots must be distinct"):
        gb.mamba2_tree_verify(**args, parents=par, initial_state=inp["pool"].to(DEVICE),
                              state_indices=torch.tensor([1, 1], device=DEVICE), backend="triton-ssd")
    with pytest.raises(ValueError, match="initial_state: expected a contiguous float32 pool, got torch.float64$"):
        gb.mamba2_tree_verify(**args, parents=par, initial_state=s0.double(), backend="triton-recurrent")
    with pytest.raises(ValueError, match=r"initial_state: expected a contiguous float32 pool, got a non-contiguous "
                                         r"\(strides .*\) torch.float32$"):  # (it had named the dtype alone)
        gb.mamba2_tree_verify(**args, parents=par, initial_state=s0.transpose(-1, -2).contiguous().transpose(-1, -2),
                              backend="triton-recurrent")
    with pytest.raises(ValueError, match="parents: sequence 0 node 2"):
        gb.mamba2_tree_verify(**args, parents=torch.tensor([[-1, 0, 5, 1, 1, 2], [-1, 0, 1, 0, 3, 3]], device=DEVICE),
                              initial_state=s0, backend="triton-ssd")
    with pytest.raises(ValueError, match="accepted"):
        gb.mamba2_tree_commit(args["x"], args["dt"], args["A"], args["B"], parents=par, accepted=[9, 0],
                              initial_state=s0, backend="triton")
