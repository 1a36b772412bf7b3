"""Every Triton kernel against the oracle on hypothesis trees. Without a GPU they run under
TRITON_INTERPRET=1 (set in the root conftest), so shapes stay small; outputs are NaN-poisoned by
the launchers and state-pool slots outside the batch must stay bit-identical."""
import contextlib

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim import oracle
from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import triton_wy_split as ws
from ddsim.measure.compare import assert_close
from ddsim.properties.kernel_checks import DEVICE, on_device
from ddsim.properties.strategies import conv_inputs, fixed_conv_example, fixed_gdn_example, gdn_inputs
from ddsim.trees.tree import Tree

pytestmark = pytest.mark.slow  # `make test-slow`: the GDN and conv kernels in Triton's interpreter

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
_dev = on_device  # the kernels' inputs where they run: compiled on a GPU when there is one, interpreted on the CPU


def _long_example(T=20, seed=3, V=6, B=1):
    """T above one 16-row block: a two-level tree with siblings and a deep chain (the same tree for each of B
    sequences, their values apart)."""
    parents = [-1] + [0, 0, 1, 2] + list(range(4, 4 + T - 5))
    ts = [Tree(parents, list(range(T)))] * B
    gen = torch.Generator().manual_seed(seed)
    H, HV, K = 2, 4, 5
    return dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen) * 0.2,
                beta=torch.rand(B, T, HV, generator=gen), parents=torch.tensor([parents] * B),
                initial_state=torch.randn(B, HV, K, V, generator=gen), trees=ts)


def _pool(inp, extra=3, seed=0):
    """Embed the batch's states in a larger pool at shuffled slots (on DEVICE)."""
    s0 = inp["initial_state"]
    B = s0.shape[0]
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(B + extra, *s0.shape[1:], generator=gen)
    slots = torch.randperm(B + extra, generator=gen)[:B]
    pool[slots] = s0
    return pool.to(DEVICE), slots.to(DEVICE)


@contextlib.contextmanager
def _recurrent_design(design):
    """The recurrent verify's kernel forced to ``design`` ("serial" or "paths"; leaky mode stays serial) through
    design auto's rule (triton_gdn.PATHS_MAX_SERIAL_PROGRAMS), so the public calls take it."""
    from ddsim.gpu_backend import triton_gdn
    before = triton_gdn.PATHS_MAX_SERIAL_PROGRAMS
    triton_gdn.PATHS_MAX_SERIAL_PROGRAMS = -1 if design == "serial" else 2**62
    try:
        yield
    finally:
        triton_gdn.PATHS_MAX_SERIAL_PROGRAMS = before


def _cast(inp, dtype):
    """q, k, v in ``dtype``; everything on DEVICE (the oracle copies to the CPU itself)."""
    return {k: _dev(inp[k].to(dtype) if k in ("q", "k", "v") else inp[k]) for k in ("q", "k", "v", "g", "beta")}


@given(gdn_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]),
       st.sampled_from(["triton-recurrent", "triton-wy", "triton-wy-fused", "triton-wy-split", "triton-wy-fold",
                        "triton-wy-head"]),
       st.sampled_from(DTYPES))
@example(fixed_gdn_example(), "exact", "triton-wy-fused", torch.float32)
@example(fixed_gdn_example(), "leaky", "triton-wy-fused", torch.float32)
@example(fixed_gdn_example(), "exact", "triton-recurrent", torch.bfloat16)
@example(fixed_gdn_example(), "exact", "triton-wy-split", torch.float16)
@example(fixed_gdn_example(), "leaky", "triton-wy-split", torch.bfloat16)
@example(_long_example(), "exact", "triton-wy", torch.float32)
@example(_long_example(), "exact", "triton-wy-split", torch.float16)
@example(fixed_gdn_example(), "exact", "triton-wy-fold", torch.float16)
@example(fixed_gdn_example(), "leaky", "triton-wy-fold", torch.float32)
@example(_long_example(), "exact", "triton-wy-fold", torch.float16)
@example(_long_example(V=40), "leaky", "triton-wy-head", torch.float16)
@example(_long_example(), "exact", "triton-recurrent", torch.float16)
def test_triton_gdn_verify_matches_oracle(inp, mode, backend, dtype):
    args = _cast(inp, dtype)
    pool, slots = _pool(inp)
    before = pool.clone()
    o = gb.gdn_tree_verify(**args, parents=_dev(inp["parents"]), initial_state=pool, state_indices=slots, mode=mode,
                           backend=backend)
    ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode)
    assert o.dtype == dtype
    assert_close(f"o ({backend}, {mode})", o, ref, dtype=dtype, slack=5)
    assert torch.equal(pool, before)  # verify never writes the committed state


@pytest.mark.parametrize("root", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, V", [(37, 4), (40, 6)])
def test_the_one_kernel_form_at_a_64_row_block_with_a_narrow_v_matches_oracle(T, V, dtype, root):
    """The one-kernel form at 37-40 nodes (a 64-row block, 8 warps) with V of 4 or 6, each root placement: its V
    tile 32 wide (_common.MIN_V_TILE_64). Compiled for sm_90 with a 16-wide tile this launch read past its shared
    memory on an H100 (an illegal address, or NaN outputs: RESULTS.md,
    benchmarks/wy_fault_probe.py); here, compiled on a GPU or interpreted, equal to the oracle, the pool
    untouched."""
    from ddsim.gpu_backend import triton_gdn
    inp = _long_example(T=T, V=V, seed=T)
    args = _cast(inp, dtype)
    pool, slots = _pool(inp)
    before = pool.clone()
    tiles, bind = [], triton_gdn.bind
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_gdn, "FUSED_ROOT", root)
        mp.setattr(triton_gdn, "bind", lambda kernel, grid, kw: tiles.append((kw["BT"], kw["BV"])) or
                   bind(kernel, grid, kw))
        o = triton_gdn.gdn_tree_verify_wy(**args, parents=_dev(inp["parents"]), initial_state=pool,
                                          state_indices=slots, mode="exact", design="fused")
    assert tiles == [(64, 32)], tiles
    ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode="exact")
    assert_close(f"o (fused, {T} nodes, V {V}, root {root})", o, ref, dtype=dtype, slack=5)
    assert torch.equal(pool, before)


@settings(max_examples=12)
@given(gdn_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]), st.sampled_from([0, 1, 2]),
       st.sampled_from(DTYPES), st.booleans(), st.booleans(), st.booleans(),
       st.booleans())
@example(_long_example(T=16), "exact", 1, torch.float32, True, False, False, False)  # a chain of 11 below two levels: 4 doublings
@example(_long_example(T=16), "exact", 1, torch.bfloat16, True, False, False, False)
@example(_long_example(T=16), "leaky", 1, torch.float32, True, False, False, False)
@example(_long_example(T=6, V=40), "leaky", 1, torch.float16, True, False, False, False)
@example(_long_example(T=16), "exact", 2, torch.bfloat16, True, False, False, False)
@example(_long_example(T=16), "leaky", 2, torch.float16, True, False, False, False)
@example(_long_example(T=6, V=40), "exact", 2, torch.float32, True, False, False, False)  # three V tiles
@example(_long_example(T=17), "exact", 2, torch.bfloat16, True, False, False, False)  # 16 draft nodes fill the block: the root first
@example(_long_example(T=17), "leaky", 0, torch.float32, True, False, False, False)
@example(_long_example(T=16), "exact", 2, torch.bfloat16, False, False, False, False)  # compiled: q, k l2-normed in fp32 (bf16x3)
@example(_long_example(T=17), "leaky", 0, torch.bfloat16, False, False, False, False)
@example(_long_example(T=16), "exact", 2, torch.bfloat16, True, True, False, False)  # the state held behind the state-free products
@example(_long_example(T=6, V=40), "leaky", 2, torch.float32, True, True, False, False)  # held, three V tiles
@example(_long_example(T=16), "exact", 2, torch.bfloat16, True, True, True, False)  # the rows' norms from the rows as read
@example(_long_example(T=16), "leaky", 1, torch.bfloat16, True, False, True, False)
@example(_long_example(T=17), "exact", 0, torch.bfloat16, True, False, True, False)  # the root first: norms not as read
@example(_long_example(T=6, V=40), "exact", 2, torch.bfloat16, True, True, True, False)  # three V tiles
@example(_long_example(T=16), "exact", 2, torch.bfloat16, True, True, False, True)  # the state's products in two chains
@example(_long_example(T=16), "leaky", 2, torch.bfloat16, True, True, True, True)  # with the rows' norms as read
@example(_long_example(T=17), "exact", 0, torch.bfloat16, True, False, True, True)
def test_the_one_kernel_form_with_the_root_in_its_block_matches_oracle(inp, mode, root, dtype, raw16, hold, rownorm,
                                                                       chains):
    """triton_gdn.FUSED_ROOT: where the whole tree fits the one-kernel form's block (T <= 16 in a 16-row block), the
    root is its row 0 on the committed state, the solve counting the root's chain (1) or eliminating its column
    first (2); 0, and any tree whose draft nodes alone fill the block, the root's recurrent step first. Compiled,
    bf16 q and k go into its products as read (FUSED_RAW16), or l2-normed in fp32 with it off; with the root's column
    eliminated, the state's use held behind its state-free products or not (FUSED_HOLD); with q and k as read, the
    rows' norms summed from the rows as read or from the products' diagonals (FUSED_ROWNORM) and the state's products
    by its head and remainder in one chain of MMAs or two (FUSED_CHAINS). Equal to the oracle; the pool untouched."""
    from ddsim.gpu_backend import triton_gdn
    roots, bind = [], triton_gdn.bind
    args = _cast(inp, dtype)
    pool, slots = _pool(inp)
    before = pool.clone()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_gdn, "FUSED_ROOT", root)
        mp.setattr(triton_gdn, "FUSED_RAW16", raw16)
        mp.setattr(triton_gdn, "FUSED_HOLD", hold)
        mp.setattr(triton_gdn, "FUSED_ROWNORM", rownorm)
        mp.setattr(triton_gdn, "FUSED_CHAINS", chains)
        mp.setattr(triton_gdn, "bind", lambda kernel, grid, kw: roots.append(
            (kw["ROOT"], kw["RAW16"], kw["HOLD"], kw["ROWNORM"], kw["CHAINS"])) or bind(kernel, grid, kw))
        o = triton_gdn.gdn_tree_verify_wy(**args, parents=_dev(inp["parents"]), initial_state=pool,
                                          state_indices=slots, mode=mode, design="fused")
    ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode)
    T = inp["q"].shape[1]  # at most 17 nodes here: a 16-row block, which the root joins up to 16
    raw = raw16 and dtype == torch.bfloat16 and not C.interpreting()  # (the interpreter's bf16 products are wrong)
    placed = root if T <= 16 else 0
    assert roots == [(placed, raw, hold and placed == 2, rownorm and raw and placed != 0, chains and raw)], (T, roots)
    assert_close(f"o (fused, root {placed}, raw16 {raw}, held {roots[0][2]}, rows' norms as read {roots[0][3]}, "
                 f"two chains {roots[0][4]}, {mode})", o, ref, dtype=dtype, slack=5)
    assert torch.equal(pool, before)


@settings(max_examples=8)
@given(gdn_inputs(max_batch=3, max_nodes=6), st.sampled_from(["exact", "leaky"]), st.sampled_from([0, 2]),
       st.sampled_from(DTYPES), st.booleans())
@example(_long_example(T=16, B=3), "exact", 2, torch.bfloat16, False)  # the root in the block, states by sequence
@example(_long_example(T=16, B=3), "leaky", 2, torch.float32, True)  # the same through a slot table
@example(_long_example(T=17, B=3), "exact", 0, torch.bfloat16, False)  # the root first (its own reads)
@example(_long_example(T=17, B=2), "exact", 0, torch.float32, True)
def test_the_one_kernel_form_reads_states_given_by_sequence_or_through_a_pools_slots(inp, mode, root, dtype, pooled):
    """The one-kernel form with the committed states given by sequence (initial_state [B, ...], no state_indices:
    sequence b's state at row b) or in a pool at shuffled slots: equal to the oracle either way, with the root in the
    block or first, the states untouched, at up to three sequences (a state read from another sequence's row shows)."""
    from ddsim.gpu_backend import triton_gdn
    args = _cast(inp, dtype)
    states = dict(zip(("initial_state", "state_indices"), _pool(inp))) if pooled else dict(
        initial_state=_dev(inp["initial_state"]))
    before = states["initial_state"].clone()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_gdn, "FUSED_ROOT", root)
        o = triton_gdn.gdn_tree_verify_wy(**args, parents=_dev(inp["parents"]), **states, mode=mode, design="fused")
    ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode)
    assert_close(f"o (fused, root {root}, states {'through slots' if pooled else 'by sequence'}, {mode})", o, ref,
                 dtype=dtype, slack=5)
    assert torch.equal(states["initial_state"], before)


def test_the_one_kernel_form_takes_bf16_q_and_k_as_read_where_compiled():
    """plan_wy's choice for the one-kernel form (nothing launched): compiled, bf16 q and k go into its products as
    read (RAW16) unless FUSED_RAW16 is off; other dtypes, and the interpreter (whose bf16 products are wrong), take
    them l2-normed in fp32. 4 warps for the 16-row block; with the root in it (T <= 16) its state's use held
    (FUSED_HOLD) and its rows' norms taken from the rows as read (FUSED_ROWNORM), neither with the root first (T = 17);
    the state's products in one chain (FUSED_CHAINS off): the defaults, pinned here. A pool in SGLang's layout with
    the root in the block takes 8 warps and the norms from the products' diagonals."""
    from ddsim.gpu_backend import triton_gdn
    for T, root, warps in ((16, 2, 4), (17, 0, 4)):
        inp = _long_example(T=T)
        for dtype, switch, compiled, want in ((torch.bfloat16, True, True, True), (torch.float16, True, True, False),
                                              (torch.float32, True, True, False), (torch.bfloat16, False, True, False),
                                              (torch.bfloat16, True, False, False)):
            got = []
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(triton_gdn, "FUSED_RAW16", switch)
                mp.setattr(C, "interpreting", lambda c=compiled: not c)
                mp.setattr(C, "check_device", lambda *xs: None)
                mp.setattr(triton_gdn, "bind", lambda kernel, grid, kw: got.append(kw) or (lambda: None))
                triton_gdn.plan_wy(**{n: inp[n].to(dtype) if n in "qkv" else inp[n] for n in ("q", "k", "v", "g",
                                                                                              "beta")},
                                   parents=inp["parents"], initial_state=inp["initial_state"], design="fused")
            assert [(kw["ROOT"], kw["RAW16"], kw["num_warps"], kw["HOLD"], kw["ROWNORM"], kw["CHAINS"]) for kw in got] == [
                (root, want, warps, root == 2, want and root == 2, False)], (T, dtype, switch, compiled)
        # a pool in SGLang's layout (the transpose of a contiguous [N, HV, V, K] pool): with the root in the block, 8
        # warps and the rows' norms from the products' diagonals; root first as any pool
        got = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(C, "interpreting", lambda: False)
            mp.setattr(C, "check_device", lambda *xs: None)
            mp.setattr(triton_gdn, "bind", lambda kernel, grid, kw: got.append(kw) or (lambda: None))
            triton_gdn.plan_wy(**{n: inp[n].to(torch.bfloat16) if n in "qkv" else inp[n] for n in ("q", "k", "v", "g",
                                                                                                   "beta")},
                               parents=inp["parents"], design="fused",
                               initial_state=inp["initial_state"].transpose(-1, -2).contiguous().transpose(-1, -2))
        assert [(kw["ROOT"], kw["RAW16"], kw["num_warps"], kw["HOLD"], kw["ROWNORM"], kw["STATE_VK"]) for kw in got] == [
            (root, True, 8 if root else 4, root == 2, False, True)], T


def test_the_one_kernel_forms_warps_follow_fused_warps_where_none_are_given():
    """plan_wy's warps for the one-kernel form (nothing launched): triton_gdn.FUSED_WARPS where set (benchmarks set
    it), else 4 for the 16-row block (the root in it or first) and 8 for larger ones; num_warps given wins over all."""
    from ddsim.gpu_backend import triton_gdn
    for T, rule in ((16, 4), (17, 4), (33, 8)):
        inp = _long_example(T=T)
        for fused_warps, asked, want in ((None, None, rule), (4, None, 4), (2, None, 2), (4, 8, 8)):
            got = []
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(triton_gdn, "FUSED_WARPS", fused_warps)
                mp.setattr(C, "check_device", lambda *xs: None)  # CPU tensors where there is a GPU: nothing launches
                mp.setattr(triton_gdn, "bind", lambda kernel, grid, kw: got.append(kw["num_warps"]) or (lambda: None))
                triton_gdn.plan_wy(**{n: inp[n] for n in ("q", "k", "v", "g", "beta")}, parents=inp["parents"],
                                   initial_state=inp["initial_state"], design="fused", num_warps=asked)
            assert got == [want], (T, fused_warps, asked)


@given(gdn_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]), st.sampled_from(["serial", "paths"]))
@example(fixed_gdn_example(), "exact", "serial")
@example(fixed_gdn_example(), "exact", "paths")
def test_triton_recurrent_states_match_oracle(inp, mode, design):
    args = _cast(inp, torch.float32)
    with _recurrent_design(design):
        o, states = gb.gdn_tree_verify(**args, parents=_dev(inp["parents"]), initial_state=_dev(inp["initial_state"]),
                                       mode=mode, output_states=True, backend="triton-recurrent")
    _, ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode,
                                    output_states=True)
    assert_close("per-node states", states, ref, dtype=torch.float32, slack=5)


@settings(max_examples=10)
@given(gdn_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]), st.booleans(), st.integers(0, 2),
       st.integers(0, 10**6), st.sampled_from(["serial", "paths"]))
@example(fixed_gdn_example(), "exact", True, 1, 7, "serial")
@example(fixed_gdn_example(), "exact", False, 0, 3, "serial")
@example(fixed_gdn_example(), "exact", True, 1, 7, "paths")
@example(fixed_gdn_example(), "exact", False, 2, 3, "paths")
def test_triton_recurrent_writes_node_states_into_a_callers_buffer_and_reads_parents_back_from_it(inp, mode, vk, extra,
                                                                                                   seed, design):
    """The recurrent kernel given states_out (SGLang's intermediate buffer as its [N, TS, HV, K, V] transpose with vk,
    or contiguous) and states_rows: each node's state at its sequence's row, equal to the oracle's (serial, in exact
    mode: each node starts from its parent's state read back from that buffer; paths: each node's program steps
    along its root path), the outputs the oracle's; every other row and node slot of the buffer bit-identical."""
    args = _cast(inp, torch.float32)
    B, T = inp["parents"].shape
    HV, K, V = inp["initial_state"].shape[1:]
    gen = torch.Generator().manual_seed(seed)
    N, TS = B + extra, T + extra
    base = torch.randn((N, TS, HV, V, K) if vk else (N, TS, HV, K, V), generator=gen).to(DEVICE)
    before = base.clone()
    rows = torch.randperm(N, generator=gen)[:B]
    buf = base.transpose(-1, -2) if vk else base
    with _recurrent_design(design):
        o, out = gb.gdn_tree_verify(**args, parents=_dev(inp["parents"]), initial_state=_dev(inp["initial_state"]),
                                    mode=mode, states_out=buf, states_rows=rows.to(DEVICE), backend="triton-recurrent")
    ref_o, ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode,
                                        output_states=True)
    assert out is buf
    assert_close("o (states into a buffer)", o, ref_o, dtype=torch.float32, slack=5)
    assert_close("node states in the buffer", buf[rows.to(DEVICE), :T], ref, dtype=torch.float32, slack=5)
    untouched = torch.ones(N, TS, dtype=torch.bool)
    untouched[rows, :T] = False
    assert torch.equal(base[untouched.to(DEVICE)], before[untouched.to(DEVICE)])


@settings(max_examples=10)
@given(gdn_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]), st.sampled_from(["none", "states", "buffer"]),
       st.sampled_from([torch.float32, torch.bfloat16]), st.booleans())
@example(fixed_gdn_example(), "exact", "buffer", torch.bfloat16, True)
def test_the_paths_design_takes_the_serial_designs_steps(inp, mode, states, dtype, pooled):
    """plan_recurrent's designs of the recurrent verify, a program per node stepping along its root path from the
    committed state (paths) and a program per head stepping over the nodes with each parent's state read back
    (serial), make the same steps in the same order: outputs and node states (none, a new tensor, or a caller's
    buffer and the committed states in SGLang's layout) the same bits interpreted, and compiled the same to their
    rounding, in both modes. Compiled, each kernel lays its rows as its own reads lie, so its sums over the key rows
    (the l2 norms, k^T S, q^T S) meet in its own order: at one warp and fp32 inputs, one node of K = 3, their outputs
    differed in the last bits on an H100, and at two warps by a bf16 output's last bit on the H200 (RESULTS.md)."""
    from ddsim.gpu_backend import triton_gdn
    args = _cast(inp, dtype)
    B, T = inp["parents"].shape
    HV, K, V = inp["initial_state"].shape[1:]
    state = dict(initial_state=_dev(inp["initial_state"]))
    if pooled:
        pool, slots = _pool(inp)
        state = dict(initial_state=pool, state_indices=slots)
    if states == "buffer":  # the committed states in the buffer's layout, SGLang's (the drop-in's case): compiled,
        # a kernel lays its state as its reads lie, and the key rows' sums follow that layout
        s0 = state["initial_state"]
        state["initial_state"] = s0.transpose(-1, -2).contiguous().transpose(-1, -2)
    got = {}
    for design in ("serial", "paths"):
        kw = {}
        if states == "states":
            kw = dict(output_states=True)
        elif states == "buffer":
            base = torch.full((B + 1, T + 1, HV, V, K), 7.0, device=DEVICE)
            kw = dict(states_out=base.transpose(-1, -2), states_rows=torch.arange(B, 0, -1, device=DEVICE))
        launch, result = triton_gdn.plan_recurrent(**args, parents=_dev(inp["parents"]), **state, mode=mode,
                                                   design=design, block_v=32, num_warps=1, **kw)
        launch()
        got[design] = (result if isinstance(result, tuple) else (result,)) + ((base,) if states == "buffer" else ())
    for x, y in zip(got["serial"], got["paths"]):
        _same_steps(x, y, exact=DEVICE == "cpu")


def _same_steps(x, y, *, exact):
    """x and y the same bits where Triton interprets (both kernels sum as numpy does); compiled, within their dtype's
    rounding: each entry within 2 units of its dtype's last place of the larger, or 64 float32 units of the tensor's
    largest entry (a sum of cancelling terms in another order). A step taken from another parent, skipped or
    repeated is off by far more; NaN anywhere fails."""
    if exact:
        assert torch.equal(x, y)
        return
    assert x.dtype == y.dtype and x.shape == y.shape and torch.isfinite(x).all() and torch.isfinite(y).all()
    x, y, eps = x.double(), y.double(), torch.finfo(x.dtype).eps
    bound = 2 * eps * torch.maximum(x.abs(), y.abs()) + 64 * torch.finfo(torch.float32).eps * y.abs().max()
    assert ((x - y).abs() <= bound).all(), ((x - y).abs() - bound).max()


def test_the_compiled_designs_bound_takes_their_rounding_and_not_another_step():
    """_same_steps's compiled bound: a last-place difference in float32 or bf16 passes; a state stepped once more
    (a decayed copy), the largest entry 0.1% off, a NaN or another shape fails."""
    gen = torch.Generator().manual_seed(5)
    y = torch.randn(2, 6, 4, 8, generator=gen)
    _same_steps(torch.nextafter(y, torch.full_like(y, 9.0)), y, exact=False)
    yb = y.bfloat16()
    _same_steps(torch.nextafter(yb, torch.full_like(yb, 9.0)), yb, exact=False)
    bad = y.clone().view(-1)
    bad[y.abs().argmax()] *= 1.001  # the largest entry, 0.1% off
    bad = bad.view_as(y)
    nan = y.clone()
    nan[0, 0, 0, 0] = float("nan")
    for x in (y * 0.99, bad, nan, y[:1]):
        with pytest.raises(AssertionError):
            _same_steps(x, y, exact=False)
    with pytest.raises(AssertionError):
        _same_steps(torch.nextafter(y, torch.full_like(y, 9.0)), y, exact=True)


def test_design_auto_takes_paths_in_exact_mode_where_the_serial_kernel_would_not_fill_the_gpu(monkeypatch):
    from ddsim.gpu_backend import triton_gdn
    assert triton_gdn.PATHS_MAX_SERIAL_PROGRAMS == 768
    # Qwen3.6-27B: 48 value heads of 128 columns, 4 V tiles of 32 a head: 4 sequences fill 768 programs
    assert [triton_gdn.paths_design(B, 48, 128, "exact") for B in (1, 4, 5, 8)] == [True, True, False, False]
    assert not triton_gdn.paths_design(1, 48, 128, "leaky")
    inp = fixed_gdn_example()
    got = []
    monkeypatch.setattr(triton_gdn, "bind", lambda kernel, grid, kw: got.append((kernel, grid, kw["BV"],
                                                                                 kw["num_warps"])))
    for mode in ("exact", "leaky"):
        triton_gdn.plan_recurrent(**_cast(inp, torch.float32), parents=_dev(inp["parents"]),
                                  initial_state=_dev(inp["initial_state"]), mode=mode)
    (k1, g1, _, w1), (k2, _, bv2, w2) = got
    B, T = inp["parents"].shape
    HV, V = inp["v"].shape[2:]
    assert k1 is triton_gdn._gdn_paths_kernel and g1 == (B * HV * T, C.cdiv(V, min(32, C.next_pow2(V, 1))))
    assert k2 is triton_gdn._gdn_recurrent_kernel and bv2 == min(16, C.next_pow2(V, 1))
    assert (w1, w2) == (2, 1)
    with pytest.raises(ValueError, match="design: expected"):
        triton_gdn.plan_recurrent(**_cast(inp, torch.float32), parents=_dev(inp["parents"]),
                                  initial_state=_dev(inp["initial_state"]), design="tree")


@given(gdn_inputs(max_nodes=6), st.sampled_from(["triton-recurrent", "triton-wy-fused", "triton-wy-split",
                                                 "triton-wy-fold", "triton-wy-head"]))
@example(fixed_gdn_example(), "triton-wy-head")
@example(fixed_gdn_example(), "triton-wy-fused")
@example(fixed_gdn_example(), "triton-wy-split")
@example(fixed_gdn_example(), "triton-wy-fold")
def test_triton_fused_gates_match_oracle(inp, backend):
    B, T, HV = inp["g"].shape
    gen = torch.Generator().manual_seed(11)
    a, b = torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen)
    A_log, dt_bias = torch.log(1 + 15 * torch.rand(HV, generator=gen)), torch.randn(HV, generator=gen) - 3
    o = gb.gdn_tree_verify(*(_dev(inp[n]) for n in ("q", "k", "v")), a=_dev(a), b=_dev(b), A_log=_dev(A_log),
                           dt_bias=_dev(dt_bias), parents=_dev(inp["parents"]), initial_state=_dev(inp["initial_state"]),
                           backend=backend)
    a64, b64 = a.double(), b.double()
    g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(a64 + dt_bias.double())  # plain reference gates
    ref = oracle.gdn_tree_verify(inp["q"], inp["k"], inp["v"], g, torch.sigmoid(b64), parents=inp["parents"],
                                 initial_state=inp["initial_state"])
    assert_close("o (fused gates)", o, ref, dtype=torch.float32, slack=5)


@given(gdn_inputs(max_nodes=6), st.lists(st.integers(0, 10**6), min_size=3, max_size=3), st.booleans())
@example(fixed_gdn_example(), [5, 4, 0], True)
def test_triton_commit_matches_oracle_and_leaves_other_slots(inp, picks, inplace):
    acc = [picks[i] % t.size for i, t in enumerate(inp["trees"])]
    pool, slots = _pool(inp)
    before = pool.clone()
    out = gb.gdn_tree_commit(*(_dev(inp[n]) for n in ("k", "v", "g", "beta")), parents=_dev(inp["parents"]),
                             accepted=acc, initial_state=pool, state_indices=slots, inplace=inplace, backend="triton")
    ref = oracle.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], parents=inp["parents"], accepted=acc,
                                 initial_state=inp["initial_state"])
    others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    others[slots] = False
    if inplace:
        assert out is pool
        assert_close("committed slots", pool[slots], ref, dtype=torch.float32, slack=5)
    else:
        assert_close("committed state", out, ref, dtype=torch.float32, slack=5)
        assert torch.equal(pool[slots], before[slots])
    assert torch.equal(pool[others], before[others])  # slots outside the batch: bit-identical


@given(conv_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]), st.sampled_from(DTYPES))
@example(fixed_conv_example(), "exact", torch.float32)
@example(fixed_conv_example(), "leaky", torch.bfloat16)
def test_triton_conv_matches_oracle(inp, mode, dtype):
    x, w = _dev(inp["x"].to(dtype)), _dev(inp["weight"].to(dtype))
    bias = None if inp["bias"] is None else _dev(inp["bias"].to(dtype))
    win0 = _dev(inp["initial_window"].to(dtype))
    kw = dict(weight=w, bias=bias, parents=_dev(inp["parents"]), initial_window=win0, mode=mode, output_windows=True)
    y, win = gb.tree_causal_conv1d(x, **kw, backend="triton")
    y_ref, win_ref = oracle.tree_causal_conv1d(x, **kw)
    assert_close("conv out", y, y_ref, dtype=dtype, slack=5)
    assert torch.equal(win.cpu().double(), win_ref)  # windows copy inputs: bit-exact


@given(conv_inputs(max_nodes=6), st.lists(st.integers(0, 10**6), min_size=2, max_size=2))
@example(fixed_conv_example(), [5, 3])
def test_triton_conv_commit_matches_oracle(inp, picks):
    acc = [picks[b] % t.size for b, t in enumerate(inp["trees"])]
    kw = dict(parents=inp["parents"], accepted=acc, initial_window=inp["initial_window"])
    out = gb.conv_tree_commit(_dev(inp["x"]), **{k: _dev(v) for k, v in kw.items()}, backend="triton")
    assert torch.equal(out.cpu().double(), oracle.conv_tree_commit(inp["x"], **kw))


def test_triton_rejects_bad_input():
    inp = fixed_gdn_example()
    args = _cast(inp, torch.float32)
    with pytest.raises(ValueError, match="output_states"):
        gb.gdn_tree_verify(**args, parents=inp["parents"], initial_state=_dev(inp["initial_state"]), output_states=True,
                           backend="triton-wy")
    with pytest.raises(ValueError, match="state_indices: slots must be distinct"):
        gb.gdn_tree_verify(**args, parents=inp["parents"], initial_state=_dev(torch.zeros(4, 3, 3, 5)),
                           state_indices=_dev(torch.tensor([1, 1])), backend="triton-wy")
    with pytest.raises(ValueError, match="initial_state: expected float32"):
        gb.gdn_tree_verify(**args, parents=inp["parents"], initial_state=_dev(inp["initial_state"].double()),
                           backend="triton-recurrent")
    with pytest.raises(ValueError, match="backend"):
        gb.gdn_tree_verify(**args, parents=inp["parents"], initial_state=_dev(inp["initial_state"]), backend="cuda-magic")
    with pytest.raises(ValueError, match="gates"):
        gb.gdn_tree_verify(_dev(inp["q"]), _dev(inp["k"]), _dev(inp["v"]), parents=inp["parents"], initial_state=_dev(inp["initial_state"]),
                           backend="triton-wy")
    with pytest.raises(ValueError, match="beta: required with g"):
        gb.gdn_tree_verify(_dev(inp["q"]), _dev(inp["k"]), _dev(inp["v"]), _dev(inp["g"]), parents=inp["parents"],
                           initial_state=_dev(inp["initial_state"]), backend="triton-recurrent")


@pytest.mark.parametrize("T, mode, backend", [(66, "exact", "triton"), (70, "leaky", "triton"), (131, "exact", "triton"),
                                              (131, "leaky", "triton-wy-split"), (131, "leaky", "triton-wy-fused")])
def test_wy_verifies_trees_beyond_one_block_chunk_by_chunk(T, mode, backend):
    """Budgets past 64 draft nodes: the WY kernel over 64-row chunks (the default three-kernel split
    form, folded for a batch; "triton-wy-split" unfolded; "triton-wy-fused" the one-kernel chunked form), exact
    without per-node states; DDTree trees, grouped heads, fused gates."""
    from ddsim.bench.bench import ddtree_batch
    _, parents = ddtree_batch(2, T, vocab=60, depth=12, topk=4, seed=T)
    gen = torch.Generator().manual_seed(T)
    B, H, HV, K, V = 2, 1, 2, 8, 4
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    a, b = torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen)
    A_log, dt_bias = torch.log(1 + 15 * torch.rand(HV, generator=gen)), torch.randn(HV, generator=gen) - 3
    s0 = torch.randn(B, HV, K, V, generator=gen)
    o = gb.gdn_tree_verify(*(_dev(x) for x in (q, k, v)), a=_dev(a), b=_dev(b), A_log=_dev(A_log), dt_bias=_dev(dt_bias),
                           parents=_dev(parents), initial_state=_dev(s0), mode=mode, backend=backend)
    g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(a.double() + dt_bias.double())
    ref = oracle.gdn_tree_verify(q, k, v, g, torch.sigmoid(b.double()), parents=parents, initial_state=s0, mode=mode)
    assert_close(f"o (T={T}, {mode})", o, ref, dtype=torch.float32, slack=5)


BLOCKED = [dict(design="split", fold=True), dict(design="split", fold=False), dict(design="chunked")]


@given(gdn_inputs(max_nodes=40), st.sampled_from(["exact", "leaky"]), st.sampled_from(BLOCKED), st.sampled_from(DTYPES))
@example(_long_example(T=37), "exact", BLOCKED[2], torch.float32)
@example(_long_example(T=37), "exact", BLOCKED[1], torch.float32)
@example(_long_example(T=50), "leaky", BLOCKED[0], torch.bfloat16)
def test_wy_in_chunks_of_16_matches_the_oracle(inp, mode, form, dtype):
    """Every form past one block with 16-row chunks, so hypothesis's small trees span several chunks
    (the split form's solve then walks up to three chunks to the left of its own)."""
    from ddsim.gpu_backend.triton_wy_blocked import plan_wy_blocked
    args = _cast(inp, dtype)
    pool, slots = _pool(inp)
    before = pool.clone()
    launch, o = plan_wy_blocked(**args, parents=_dev(inp["parents"]), initial_state=pool, state_indices=slots,
                                mode=mode, block_t=16, **form)
    launch()
    ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode)
    assert_close(f"o ({form}, chunks of 16, {mode})", o, ref, dtype=dtype, slack=5)
    assert torch.equal(pool, before)


@given(gdn_inputs(), st.data())
def test_triton_commit_with_a_tree_plan_equals_raw_parents(inp, data):
    """The commit reads root paths from the plan's cached table instead of walking parents per call."""
    acc = torch.tensor([data.draw(st.integers(0, t.size - 1)) for t in inp["trees"]])
    kw = dict(accepted=_dev(acc), initial_state=_dev(inp["initial_state"]), backend="triton")
    args = [_dev(inp[k]) for k in ("k", "v", "g", "beta")]
    raw = gb.gdn_tree_commit(*args, parents=_dev(inp["parents"]), **kw)
    planned = gb.gdn_tree_commit(*args, parents=gb.TreePlan(_dev(inp["parents"])), **kw)
    # the same steps; the plan pads every path to the tree's depth, so the loop bound (a kernel
    # argument Triton may specialise when it is 1) can differ: equal to fp32 rounding, not bitwise
    assert_close("commit with a plan", planned.cpu(), raw.cpu(), dtype=torch.float32)
    paths = gb.TreePlan(inp["parents"]).root_paths()
    for b, t in enumerate(inp["trees"]):
        for n in range(t.size):
            row = [int(x) for x in paths[b, n] if x >= 0]
            assert row == list(t.root_path(n))


@settings(max_examples=16)
@given(gdn_inputs(max_nodes=40, ks=(3, 5, 24, 40)), st.sampled_from(["exact", "leaky"]),
       st.sampled_from([torch.float32, torch.float16]),
       st.sampled_from(["split", "fold", "fold-root", "head"]), st.sampled_from([16, None]), st.booleans(),
       st.sampled_from([None, False, True]))
@example(_long_example(T=40), "exact", torch.float32, "split", None, False, None)
@example(_long_example(T=33), "leaky", torch.float16, "split", None, False, None)
@example(_long_example(T=40), "exact", torch.float16, "fold", None, False, None)
@example(_long_example(T=33), "leaky", torch.float32, "fold", None, True, None)
@example(_long_example(T=40), "exact", torch.float16, "fold-root", 16, True, None)
@example(_long_example(T=33), "leaky", torch.float32, "fold-root", None, False, None)
@example(_long_example(T=40, V=80), "exact", torch.float16, "head", None, True, None)  # three V tiles (32 wide at 64 rows)
@example(_long_example(T=33, V=24), "leaky", torch.float32, "head", None, False, None)
@example(_long_example(T=40, V=80), "exact", torch.float16, "head", None, True, True)  # a program per V tile
@example(_long_example(T=33, V=24), "leaky", torch.float32, "head", None, False, False)  # one per head
def test_triton_wy_split_matches_oracle_on_larger_trees(inp, mode, dtype, design, block_k, vk, split_v):
    """The two-kernel WY forms on trees of up to 40 nodes (a 64-row block, several doubling rounds); "fold-root"
    the folded form with the root's step folded into the weights, reading the committed state in block_k-row
    chunks of K; "head" the same weights applied by the program that made them (one kernel), a program per head
    or per (head, V tile) (split_v; None: its default, per V tile when the split programs fit in one wave); the
    pool contiguous or SGLang's seen through a transpose (vk)."""
    from ddsim.gpu_backend.triton_gdn import gdn_tree_verify_wy
    args = _cast(inp, dtype)
    pool, slots = _pool(inp)
    if vk:
        pool = pool.transpose(-1, -2).contiguous().transpose(-1, -2)
    before = pool.clone()
    root = dict(fold_root=design == "fold-root", block_k=block_k) if design in ("fold", "fold-root") else {}
    tiles = {} if design == "head" else dict(block_v=16)
    with pytest.MonkeyPatch.context() as mp:  # head's V tile (it takes no block_v): several tiles a program
        mp.setattr(ws, "HEAD_BLOCK_V", 16)
        mp.setattr(ws, "HEAD_SPLIT_V", split_v)
        o = gdn_tree_verify_wy(**args, parents=_dev(inp["parents"]), initial_state=pool, state_indices=slots,
                               mode=mode, design=design.removesuffix("-root"), **tiles, **root)
    ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode)
    assert_close(f"o ({design}, {mode})", o, ref, dtype=dtype, slack=5)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("mode, dtype, precision, same_bits", [("exact", torch.float16, None, True),
                                                               ("leaky", torch.float32, None, False),
                                                               ("leaky", torch.float32, "ieee", True)])
def test_the_head_kernels_mixed_grid_matches_oracle(mode, dtype, precision, same_bits, monkeypatch):
    """HEAD_MIXED: the heads of whole waves a program each, the last, partial wave's a program per V tile, in one
    grid. 4 heads on 3 slots (three V tiles a head, 32 wide: the least at a 64-row block, _common.MIN_V_TILE_64): 3
    whole, then the fourth in 3 programs. Both grids' outputs equal the oracle's, and each other's bit for bit (the
    same arithmetic a tile) but with fp32 inputs' default tf32x3 products: there Triton compiles the mixed grid's loop
    over runtime bounds to other bits (on an H200, up to 1.8e-7 apart, each 3.1e-7 off the float64 oracle; ieee and
    tf32 products, and bf16x3 for 16-bit inputs, the same bits: benchmarks/repro_head_mixed_bits.py)."""
    from ddsim.gpu_backend.triton_gdn import gdn_tree_verify_wy
    inp = _long_example(T=40, V=80)
    args = _cast(inp, dtype)
    pool, slots = _pool(inp)
    before = pool.clone()
    monkeypatch.setattr(ws, "HEAD_BLOCK_V", 32)
    monkeypatch.setattr(ws, "_slots", lambda device: 3)
    grids, bind = [], ws.bind
    monkeypatch.setattr(ws, "bind", lambda kernel, grid, kw: grids.append((grid, kw["NWHOLE"], kw["MIXED"])) or
                        bind(kernel, grid, kw))
    outs = {}
    for mixed in (False, True):
        monkeypatch.setattr(ws, "HEAD_MIXED", mixed)
        outs[mixed] = gdn_tree_verify_wy(**args, parents=_dev(inp["parents"]), initial_state=pool,
                                         state_indices=slots, mode=mode, design="head", precision=precision)
    assert grids == [((4,), 0, False), ((6,), 3, True)], grids
    ref = oracle.gdn_tree_verify(**args, parents=inp["parents"], initial_state=inp["initial_state"], mode=mode)
    for mixed, o in outs.items():
        assert_close(f"o (head, {'mixed grid' if mixed else 'a program per head'}, {mode})", o, ref, dtype=dtype,
                     slack=5)
    if same_bits:
        assert torch.equal(outs[True], outs[False])
    assert torch.equal(pool, before)


def test_the_mixed_grid_splits_only_a_last_wave_that_fits_one_wave():
    """_head_mixed: the heads that keep a program each. Qwen3.6-27B's 48 value heads, two V tiles, an H200's 264
    slots: 4 and 32 sequences keep every head whole (4: one partial wave of 192, split it would take 384 programs;
    32: the last wave's 216 heads would take 432), 6 and 8 split the last wave's 24 and 120 heads."""
    assert [ws._head_mixed(B * 48, 2, 264) for B in (4, 6, 8, 32)] == [192, 264, 264, 1536]
    assert ws._head_mixed(264, 2, 264) == 264 and ws._head_mixed(265, 2, 264) == 264


@settings(max_examples=12)
@given(gdn_inputs(max_nodes=6), st.sampled_from(["exact", "leaky"]),
       st.sampled_from(["triton-recurrent", "triton-wy-fused", "triton-wy-split", "triton-wy-fold", "triton-wy-head",
                        "torch"]),
       st.booleans())
@example(fixed_gdn_example(), "exact", "triton-wy-fold", True)
@example(fixed_gdn_example(), "leaky", "torch", True)
@example(_long_example(T=20), "exact", "triton-recurrent", True)
def test_a_pool_in_sglangs_layout_is_read_and_written_in_place(inp, mode, backend, per_node_states):
    """SGLang keeps states as [N, HV, V, K]; its transpose, a [N, HV, K, V] view, is read (and the
    commit writes it) in place, with no transposing copy: outputs, per-node states and the committed
    slots equal the contiguous pool's (bit for bit in the interpreter; compiled, the tile layouts
    follow memory and so the order of a sum may differ: within fp32 rounding), other slots untouched
    bit for bit."""
    args = _cast(inp, torch.float32)
    pool, slots = _pool(inp)  # contiguous [N, HV, K, V]
    sglang = pool.transpose(-1, -2).contiguous()  # [N, HV, V, K]
    view = sglang.transpose(-1, -2)  # [N, HV, K, V], SGLang's memory
    before = sglang.clone()
    states = per_node_states and backend in ("triton-recurrent", "torch")
    kw = dict(parents=_dev(inp["parents"]), state_indices=slots, mode=mode, backend=backend, output_states=states)
    want, got = gb.gdn_tree_verify(**args, initial_state=pool, **kw), gb.gdn_tree_verify(**args, initial_state=view, **kw)
    for w, x in zip(want if states else [want], got if states else [got]):
        _same(x, w)
    assert torch.equal(sglang, before)  # verify only reads
    acc = [t.size - 1 for t in inp["trees"]]
    for p in (pool, view):
        gb.gdn_tree_commit(*(args[n] for n in ("k", "v", "g", "beta")), parents=_dev(inp["parents"]), accepted=acc,
                           initial_state=p, state_indices=slots, inplace=True,
                           backend="torch" if backend == "torch" else "triton")
    _same(view[slots], pool[slots])
    assert not torch.equal(view[slots], before.transpose(-1, -2)[slots])
    others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    others[slots] = False
    assert torch.equal(sglang[others], before[others])


def _same(x, want):
    """Equal bit for bit in Triton's interpreter, within fp32 rounding when compiled (see above)."""
    if DEVICE == "cpu":
        assert torch.equal(x, want)
    else:
        assert_close("the other layout's result", x, want, dtype=torch.float32)


def test_a_pool_neither_contiguous_nor_sglangs_transpose_is_refused():
    inp = fixed_gdn_example()
    pool = _dev(inp["initial_state"]).permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)  # heads outermost
    with pytest.raises(ValueError, match="transpose of a contiguous"):
        gb.gdn_tree_verify(**_cast(inp, torch.float32), parents=_dev(inp["parents"]), initial_state=pool,
                           backend="triton-wy-fold")


@pytest.mark.parametrize("form", BLOCKED)
def test_the_chunked_wy_form_reads_sglangs_layout_in_place(form):
    from ddsim.gpu_backend.triton_wy_blocked import plan_wy_blocked
    inp = _long_example(T=40)
    args = _cast(inp, torch.float32)
    s0 = _dev(inp["initial_state"])
    view = s0.transpose(-1, -2).contiguous().transpose(-1, -2)
    outs = []
    for st_ in (s0, view):
        launch, o = plan_wy_blocked(**args, parents=_dev(inp["parents"]), initial_state=st_, block_t=16, block_v=16,
                                    **form)
        launch()
        outs.append(o)
    _same(outs[1], outs[0])


def test_the_wy_launcher_refuses_unknown_options_before_any_work():
    from ddsim.gpu_backend.triton_gdn import plan_wy
    inp = fixed_gdn_example()
    args = dict(**_cast(inp, torch.float32), parents=_dev(inp["parents"]), initial_state=_dev(inp["initial_state"]))
    for kw, what in ((dict(design="blocked"), "design"), (dict(precision="fp16"), "precision"),
                     (dict(exact16="fp16x2"), "exact16"), (dict(exact16="fp16x2", design="split"), "exact16"),
                     (dict(design="fold", block_k=24), "block_k"), (dict(design="fold", block_k=8), "block_k")):
        with pytest.raises(ValueError, match=what):
            plan_wy(**args, **kw)


def test_the_wy_dot_precision_is_bf16x3_for_16_bit_inputs_and_tf32x3_otherwise(monkeypatch):
    from ddsim.gpu_backend._common import check_precision, dot_precision
    bf, f16, f32 = (torch.empty(1, dtype=d) for d in (torch.bfloat16, torch.float16, torch.float32))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert dot_precision(None, bf, bf, bf) == "bf16x3"
    assert dot_precision(None, f16, f16, bf) == "bf16x3"
    assert dot_precision(None, bf, bf, f32) == "tf32x3"
    assert dot_precision(None, f32, f32, f32) == "tf32x3"
    for asked in ("ieee", "tf32", "tf32x3", "bf16x3"):
        assert dot_precision(asked, f32, f32, f32) == asked
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter has no bf16x3 (its products are fp32 matmuls)
    assert dot_precision(None, bf, bf, bf) == "tf32x3"
    assert dot_precision("bf16x3", bf, bf, bf) == "tf32x3"
    with pytest.raises(ValueError, match="precision: expected one of ieee, tf32, tf32x3, bf16x3"):
        check_precision("bf16x6")


def test_the_chunked_wy_form_refuses_bf16x3_and_runs_tf32x3_for_16_bit_inputs(monkeypatch):
    from ddsim.gpu_backend import triton_wy_blocked as wb
    inp = _long_example(T=20)
    args = dict(**_cast(inp, torch.bfloat16), parents=_dev(inp["parents"]), initial_state=_dev(inp["initial_state"]))
    with pytest.raises(ValueError, match="precision: bf16x3 is refused for the chunked form"):
        wb.plan_wy_blocked(**args, design="chunked", precision="bf16x3", block_t=16)
    got = []
    monkeypatch.setattr(wb, "bind", lambda kernel, grid, kw: got.append(kw["PRECISION"]))
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the compiled default, resolved without launching
    monkeypatch.setattr(wb.C, "check_device", lambda *xs: None)
    wb.plan_wy_blocked(**args, design="chunked", block_t=16)
    wb.plan_wy_blocked(**args, design="split", block_t=16)
    assert got == ["tf32x3"] + ["bf16x3"] * 3


# the share of bf16 outputs off the correctly rounded oracle a kernel may move (H200, RESULTS.md: bf16x3
# 0.15-0.5%, tf32x3 0.03%, single-pass tf32 9.5-30%)
OFF_ROUNDED_MAX = 0.02


def _assert_bf16_bar(B, T, *, seed, design, **shape):
    """The WY verify of bf16 DDTree inputs ([B, T], heads ``shape`` or the preset's) against the float64
    oracle: at most 1.01x the error of rounding the oracle to bf16, and at most OFF_ROUNDED_MAX of the
    entries off the rounded oracle."""
    from ddsim.bench.bench import ddtree_batch, kernel_inputs, off_rounded
    from ddsim.gpu_backend.triton_gdn import gdn_tree_verify_wy
    from ddsim.measure.compare import rel_error
    _, parents = ddtree_batch(B, T, seed=seed)
    inp = kernel_inputs(B, T, **shape, dtype=torch.bfloat16, device="cuda", seed=seed)
    qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    ref = oracle.gdn_tree_verify(**{k: x.cpu() for k, x in qkv.items()}, parents=parents,
                                 initial_state=inp["initial_state"].cpu(), mode="exact")
    o = gdn_tree_verify_wy(**qkv, parents=parents.cuda(), initial_state=inp["initial_state"], design=design)
    rounding = rel_error(ref.to(torch.bfloat16), ref)
    assert rel_error(o.cpu(), ref) <= 1.01 * rounding, (rel_error(o.cpu(), ref), rounding)
    assert off_rounded(o, ref) <= OFF_ROUNDED_MAX, off_rounded(o, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16x3 products run compiled only")
@pytest.mark.parametrize("T", [17, 65, 131, 257])
@pytest.mark.parametrize("design", ["fused", "split", "fold", "head"])
def test_bf16_inputs_lose_no_more_than_the_rounding_of_the_output(design, T):
    """Issue #13's bar for 16-bit inputs: the error of rounding the oracle's output to bf16. The default
    bf16x3 products (about 2^-16 relative) leave the output the correctly rounded oracle except where
    the oracle lies within that error of a rounding midpoint; single-pass tf32 (2^-11) moves a fifth of
    them (RESULTS.md). (Design "fused" past 65 nodes is the chunked form, which stays at tf32x3.)"""
    _assert_bf16_bar(2, T, seed=1, design=design, H=2, HV=4, K=128, V=128)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16x3 products run compiled only")
@pytest.mark.parametrize("B,T", [(1, 16), (1, 17), (1, 65), (2, 65), (8, 65), (2, 129), (1, 257)])
def test_full_size_bf16_verify_at_the_defaults_loses_only_the_rounding(B, T):
    """The same bar at Qwen3.6-27B GDN shapes (H=16, HV=48, K=V=128: the constexprs the served kernels
    compile with; a miscompile can depend on them, as the chunked form's did on its chunk height), through
    design "auto": fused at 1 x 16 (the root in the block) and 1 x 17 (the root first), head split along V at
    1 x 65 and 2 x 65, head at 8 x 65 (whole heads, the last wave's split along V), past one block the split
    form."""
    _assert_bf16_bar(B, T, seed=2, design="auto")  # kernel_inputs' default shape: the preset's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 q and k go into the products as read compiled only")
@pytest.mark.parametrize("T,rownorm,chains", [(16, True, False), (16, False, True), (16, True, True), (16, False, False),
                                              (9, True, False), (17, False, True), (17, False, False)])
def test_the_one_kernel_forms_ways_with_q_and_k_as_read_lose_only_the_rounding(monkeypatch, T, rownorm, chains):
    """The same bar at full size for the one-kernel form with q and k as read (the root in the block at 1 x 16 and
    1 x 9, first at 1 x 17, where the rows' norms are not taken as read) whichever way it takes its rows' norms
    (triton_gdn.FUSED_ROWNORM) and accumulates its state's products (FUSED_CHAINS): the property test's tolerance
    for bf16 outputs would pass a norm off by 1%, this bar does not."""
    from ddsim.gpu_backend import triton_gdn
    monkeypatch.setattr(triton_gdn, "FUSED_GLUON", False)  # the Triton form (at 16 and 9 nodes the Gluon fold serves:
    # properties/test_gluon_fold.py holds it to the same bar)
    monkeypatch.setattr(triton_gdn, "FUSED_ROWNORM", rownorm)
    monkeypatch.setattr(triton_gdn, "FUSED_CHAINS", chains)
    _assert_bf16_bar(1, T, seed=3, design="fused")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_wy_defaults_follow_the_dot_precision(monkeypatch, dtype):
    """What design "auto" launches for a batch, resolved as compiled (nothing launches): with bf16 inputs
    (bf16x3) one kernel, a program per head folding the root's step into the weights and applying them to
    64-wide V tiles, its loads unpipelined (one stage), no register cap, and past one block the split form is
    not folded and applies 64-wide V tiles (32 for one sequence); with fp32 inputs (tf32x3) the two-kernel fold,
    the root's step in the apply kernel, 32-wide tiles capped at 168, and past one block folded. One sequence
    takes the head form split along V (a program per head and V tile) with bf16 inputs and the split form with
    fp32 ones, and so does a bf16 batch whose split programs fit in one wave (two sequences on an H200, not
    four), while eight split only their last, partial wave's heads (HEAD_MIXED); the two-kernel fold, asked for,
    keeps its bf16 defaults: the root folded in, 64-wide tiles, all of K in one chunk, no caps
    (triton_wy_split.FOLD_DEFAULTS, HEAD_BLOCK_V, HEAD_STAGES, RESULTS.md)."""
    from ddsim.bench.bench import ddtree_batch, kernel_inputs
    from ddsim.gpu_backend import triton_wy_blocked as wb
    from ddsim.gpu_backend.triton_gdn import plan_wy
    got = []
    for mod in (ws, wb):
        monkeypatch.setattr(mod, "bind", lambda kernel, grid, kw: got.append((kernel.__name__, kw)))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(ws.C, "check_device", lambda *xs: None)
    bf16 = dtype == torch.bfloat16
    for T in (65, 131):
        got.clear()
        _, parents = ddtree_batch(2, T)
        inp = kernel_inputs(2, T, H=2, HV=4, K=128, V=128, dtype=dtype, device="cpu")
        plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                initial_state=inp["initial_state"], poison=False)
        kws = dict(got)
        assert {kw["PRECISION"] for kw in kws.values()} == {"bf16x3" if bf16 else "tf32x3"}
        if T == 65 and bf16:
            assert set(kws) == {"_gdn_wy_fold_head_kernel"}
            head = kws["_gdn_wy_fold_head_kernel"]
            assert head["BV"] == 64 and head["num_stages"] == 1 and "maxnreg" not in head
            assert head["SPLIT_V"] is True  # 8 heads, 16 programs: one wave split along V
        elif T == 65:
            assert set(kws) == {"_gdn_wy_fold_kernel", "_gdn_wy_fold_apply_kernel"}
            apply = kws["_gdn_wy_fold_apply_kernel"]
            assert apply["BV"] == 32 and apply.get("maxnreg") == 168
            assert kws["_gdn_wy_fold_kernel"]["ROOT"] is False and "maxnreg" not in kws["_gdn_wy_fold_kernel"]
        else:
            assert kws["_gdn_wy_blocked_solve_kernel"]["FOLD"] is (not bf16)
            assert kws["_gdn_wy_blocked_apply_kernel"]["BV"] == (64 if bf16 else 32)
            got.clear()  # a V tile asked for: 64 kept with bf16x3 products, capped at 32 with tf32x3
            plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                    initial_state=inp["initial_state"], poison=False, block_v=64)
            assert dict(got)["_gdn_wy_blocked_apply_kernel"]["BV"] == (64 if bf16 else 32)
    for B, design, want in ((1, "auto", {"_gdn_wy_fold_head_kernel"} if bf16 else
                             {"_gdn_wy_solve_kernel", "_gdn_wy_apply_kernel"}),
                            (2, "fold", {"_gdn_wy_fold_kernel", "_gdn_wy_fold_root_apply_kernel" if bf16 else
                                         "_gdn_wy_fold_apply_kernel"})):
        got.clear()
        _, parents = ddtree_batch(B, 65)
        inp = kernel_inputs(B, 65, H=2, HV=4, K=128, V=128, dtype=dtype, device="cpu")
        plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                initial_state=inp["initial_state"], poison=False, design=design)
        kws = dict(got)
        assert set(kws) == want, (B, design, set(kws))
        if B == 1 and bf16:
            assert kws["_gdn_wy_fold_head_kernel"]["SPLIT_V"] is True
    if bf16:  # at Qwen3.6-27B's 48 value heads: 2 sequences' 192 programs split fit an H200's 264 slots, 4's 384
        # not; 8 sequences' 384 heads fill one wave whole (264) and split the last wave's 120 in 240 (HEAD_MIXED)
        for B, want in ((2, ((192,), True, 0)), (4, ((192,), False, 0)), (8, ((504,), False, 264))):
            grids = []
            monkeypatch.setattr(ws, "bind", lambda kernel, grid, kw: grids.append((grid, kw["SPLIT_V"],
                                                                                   kw["NWHOLE"])))
            _, parents = ddtree_batch(B, 65)
            inp = kernel_inputs(B, 65, dtype=dtype, device="cpu")
            plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                    initial_state=inp["initial_state"], poison=False)
            assert grids == [want], (B, grids)
        monkeypatch.setattr(ws, "bind", lambda kernel, grid, kw: got.append((kernel.__name__, kw)))
        if design == "fold" and bf16:
            apply = kws["_gdn_wy_fold_root_apply_kernel"]
            assert apply["BV"] == 64 and apply["BKC"] == 128 and "maxnreg" not in apply
            assert kws["_gdn_wy_fold_kernel"]["ROOT"] is True and "maxnreg" not in kws["_gdn_wy_fold_kernel"]
    # the name the benchmarks' tables give auto's form (triton_gdn.auto_design) is the form launched
    from ddsim.gpu_backend import triton_gdn
    from ddsim.gpu_backend.triton_gdn import auto_design
    monkeypatch.setattr(triton_gdn, "bind", lambda kernel, grid, kw: got.append((kernel.__name__, kw)))
    forms = {"fused": {"_gdn_wy_kernel"}, "split": {"_gdn_wy_solve_kernel", "_gdn_wy_apply_kernel"},
             "head": {"_gdn_wy_fold_head_kernel"}, "fold": {"_gdn_wy_fold_kernel", "_gdn_wy_fold_apply_kernel"}}
    batch = "head" if bf16 else "fold"
    one = "head" if bf16 else "split"
    for B, T, want in ((1, 17, "fused"), (1, 18, one), (1, 65, one), (2, 17, batch), (2, 65, batch),
                       (1, 66, "split, unfolded"), (2, 66, "split, unfolded" if bf16 else "split, folded")):
        got.clear()
        _, parents = ddtree_batch(B, T)
        inp = kernel_inputs(B, T, H=2, HV=4, K=128, V=128, dtype=dtype, device="cpu")
        plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                initial_state=inp["initial_state"], poison=False)
        kws, name = dict(got), auto_design(B, T, "bf16x3" if bf16 else "tf32x3")
        assert name == want, (B, T, name)
        if name.startswith("split, "):
            assert kws["_gdn_wy_blocked_solve_kernel"]["FOLD"] is (name == "split, folded"), (B, T, name)
            assert kws["_gdn_wy_blocked_apply_kernel"]["BV"] == (64 if bf16 and B > 1 else 32), (B, T, name)
        else:
            assert set(kws) == forms[name], (B, T, name, set(kws))
    assert [auto_design(2, 65, "bf16x3", **kw) for kw in ({}, dict(pdl=True), dict(pdl="grid"), dict(block_k=64),
                                                           dict(fold_root=False), dict(block_v=32))] == ["head"] + ["fold"] * 5
    # pdl takes False, True or "grid" (in the interpreter, whose programs run one after another, either is off)
    inp = kernel_inputs(1, 17, device="cpu")
    with pytest.raises(ValueError, match="pdl: expected False, True or 'grid', got 'flags'"):
        plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=ddtree_batch(1, 17)[1],
                initial_state=inp["initial_state"], design="fold", pdl="flags")
