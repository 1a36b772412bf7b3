"""The drop-in's inputs checked on the device with no host read (gpu_backend.device_checks), so that a server can
capture its verify and commit in a CUDA graph: a batch of trees' tables built by one kernel, as the host builds them;
a device-checked call giving the host-checked call's bits and reading nothing on the host; a sequence with a tree,
slot, buffer row, accepted node or segment it cannot trust failing closed (NaN outputs, node states and committed
state), and nothing else changed; on a GPU, the calls captured in a CUDA graph and replayed on other steps' values."""
import contextlib
import os
import sys

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ddsim.bench.bench import wy_form_output
from ddsim.gpu_backend import checks, device_checks, engine_api, host_tables
from ddsim.properties.strategies import gdn_inputs
from tests.test_host_tables import parent_batches


@pytest.mark.interpreter
@given(parents=parent_batches(max_batch=3, max_nodes=40), data=st.data())
def test_checked_tables_are_the_host_tables_of_the_tree_as_read(parents, data):
    """triton_tables.checked_tables on trees as an engine hands them over: node 0's entry anything (SGLang leaves 0),
    some nodes' parents not an earlier node. Its tables are the host's for the tree read with each such node under
    the previous one (each block of 32 nodes' depth too, its deepest node's), and exactly the trees with such a node
    are flagged."""
    from ddsim.gpu_backend import triton_tables
    B, T = parents.shape
    raw, read = parents.clone(), parents.clone()
    for b in range(B):
        raw[b, 0] = data.draw(st.integers(-3, T + 3))  # not read
        for i in data.draw(st.sets(st.integers(1, T - 1), max_size=3)) if T > 1 else ():
            raw[b, i] = data.draw(st.one_of(st.integers(-9, -1), st.integers(i, T + 9)))
            read[b, i] = i - 1
    bad_want = [bool(((raw[b, 1:] < 0) | (raw[b, 1:] >= torch.arange(1, T))).any()) for b in range(B)]
    dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))
    src = torch.full((B, T), 7, dtype=torch.int64)
    anc = torch.full((B, T, T), 7, dtype=torch.int8)
    paths = torch.full((B, T, T), 7, dtype=torch.int32)
    bad = torch.full((B, triton_tables.blocks(T)), 7, dtype=torch.int32)  # a flag per block of 32 nodes
    depths = torch.full_like(bad, 7)
    triton_tables.checked_tables(raw.to(dtype), src=src, anc=anc, paths=paths, bad=bad, depths=depths)
    assert torch.equal(depths, _block_depths(read))
    mask, depth = host_tables.ancestor_mask(read.numpy())
    want_paths = np.full((B, T, T), -1, dtype=np.int32)
    want_paths[:, :, :depth + 1] = host_tables.root_paths(mask, depth)
    assert torch.equal(src, read) and np.array_equal(anc.numpy(), mask) and np.array_equal(paths.numpy(), want_paths)
    assert bad.bool().any(1).tolist() == bad_want and set(bad.flatten().tolist()) <= {0, 1}


def _block_depths(parents: torch.Tensor) -> torch.Tensor:
    """int32 [B, blocks(T)]: each block of 32 nodes' deepest node's depth (the root's 0) in valid trees parents [B, T]
    (each node's depth its parent's plus one, in node order)."""
    from ddsim.gpu_backend import triton_tables
    B, T = parents.shape
    depth = torch.zeros(B, T, dtype=torch.int32)
    for t in range(1, T):
        depth[:, t] = depth[torch.arange(B), parents[:, t]] + 1
    out = torch.zeros(B, triton_tables.blocks(T), dtype=torch.int32)
    for j in range(out.shape[1]):
        out[:, j] = depth[:, 32 * j:32 * (j + 1)].amax(1)
    return out


@contextlib.contextmanager
def _chunks(columns: int):
    """triton_tables' walks over ``columns`` columns a chunk (MAX_CHUNK) while inside."""
    from ddsim.gpu_backend import triton_tables
    before, triton_tables.MAX_CHUNK = triton_tables.MAX_CHUNK, columns
    try:
        yield
    finally:
        triton_tables.MAX_CHUNK = before


_GEN = torch.Generator().manual_seed(11)


# slow: about 14 s of one core drawing trees in the interpreter; CI runs it in make test-slow
@pytest.mark.slow
@pytest.mark.interpreter
@given(parents=parent_batches(max_batch=2, max_nodes=40), columns=st.sampled_from([1, 8, 32, 128]))
@example(parents=torch.tensor([[-1] + [int(torch.randint(0, i, (1,), generator=_GEN)) for i in range(1, 200)],
                               [-1] + list(range(199))]), columns=128)  # two chunks of 128 columns: a chain's last
# block walks 200 steps in the first and 72 in the second
@example(parents=torch.tensor([[-1] + list(range(199)), [-1] + [0] * 199]), columns=32)  # the default's 7 chunks
def test_the_tables_walk_their_columns_a_chunk_at_a_time(parents, columns):
    """The tables' walk (triton_tables.block_tables) covers a tree's columns MAX_CHUNK at a time, each chunk's walk
    stopped where its columns are out of reach (an ancestor's index and depth are below its node's): with chunks of
    1, 8, 32 or 128 columns the tables kernel and the step kernel write the host's tables and each block's depth."""
    from ddsim.gpu_backend import triton_tables
    B, T = parents.shape
    mask, depth = host_tables.ancestor_mask(parents.numpy())
    want_paths = np.full((B, T, T), -1, dtype=np.int32)
    want_paths[:, :, :depth + 1] = host_tables.root_paths(mask, depth)
    raw = parents.clone()
    raw[:, 0] = 0
    with _chunks(columns):
        plans = (device_checks.DevicePlan(raw), device_checks.step(a=torch.zeros(B, T, 1), b=torch.zeros(B, T, 1),
                                                                   slots=torch.arange(B), N=B, tree=raw).plan)
    for plan in plans:
        assert not plan.bad.any() and torch.equal(plan.parents, parents)
        assert np.array_equal(plan.ancestors("exact")[0].numpy(), mask)
        assert np.array_equal(plan.root_paths().numpy(), want_paths)
        assert torch.equal(plan.depth_table("exact"), _block_depths(parents))
    assert triton_tables.MAX_CHUNK == 32


@pytest.mark.interpreter
@given(parents=parent_batches(max_batch=3, max_nodes=40))
def test_a_device_plan_serves_the_tables_a_host_plan_serves_in_both_modes(parents):
    """DevicePlan (the tables kernel's, and the step kernel's for a tree as read and for the flattened recurrence's
    chains) against TreePlan on valid trees: the same source parents, ancestor masks and root paths in exact and
    leaky mode (the root paths padded to T columns, the depth reported as T - 1, the most T nodes reach, with each
    tree's own per block for exact mode where it is a tree's); no conv tables; nothing flagged."""
    B, T = parents.shape
    host = checks.TreePlan(parents)
    raw = parents.clone()
    raw[:, 0] = 0  # SGLang's root entry
    chain = torch.arange(-1, T - 1).expand(B, T)
    step = dict(a=torch.zeros(B, T, 1), b=torch.zeros(B, T, 1), slots=torch.arange(B), N=B)
    for dev, hp in ((device_checks.DevicePlan(raw.int()), host), (device_checks.step(**step, tree=raw).plan, host),
                    (device_checks.step(**step, chain=True).plan, checks.TreePlan(chain))):
        assert not dev.bad.any()
        for mode in checks.MODES:
            assert torch.equal(dev.src(mode), hp.src(mode))
            (m_dev, d_dev), (m_host, _) = dev.ancestors(mode), hp.ancestors(mode)
            assert m_dev.dtype == torch.int8 and torch.equal(m_dev, m_host) and d_dev == T - 1
            want = torch.full((B, T, T), -1, dtype=torch.int32)
            paths = hp.root_paths(mode)
            want[:, :, :paths.shape[2]] = paths
            assert torch.equal(dev.root_paths(mode)[:, :, :T], want[:, :, :dev.root_paths(mode).shape[2]])
        tree_built = hp is host
        assert dev.depth_table("leaky") is None and (dev.depth_table("exact") is None) is not tree_built
        if tree_built:
            assert torch.equal(dev.depth_table("exact"), _block_depths(parents))
        with pytest.raises(RuntimeError, match="no conv tables"):
            dev.conv_table("exact", 4)
        with pytest.raises(ValueError, match="^mode: expected one of"):
            dev.ancestors("sideways")


def test_checked_tables_refuse_a_table_of_another_shape_in_one_line():
    pytest.importorskip("triton")
    from ddsim.gpu_backend import triton_tables
    par = torch.tensor([[-1, 0, 1]])
    ok = dict(src=torch.zeros(1, 3, dtype=torch.int64), anc=torch.zeros(1, 3, 3, dtype=torch.int8),
              paths=torch.zeros(1, 3, 3, dtype=torch.int32), bad=torch.zeros(1, 1, dtype=torch.int32))
    for name, wrong in (("anc", torch.zeros(1, 3, 2, dtype=torch.int8)), ("paths", torch.zeros(1, 3, 4, dtype=torch.int32)),
                        ("bad", torch.zeros(1, dtype=torch.int32)), ("src", torch.zeros(3, dtype=torch.int64)),
                        ("depths", torch.zeros(1, 1, dtype=torch.int64)), ("depths", torch.zeros(1, 2, dtype=torch.int32)),
                        ("depths", torch.zeros(1, 1))):
        with pytest.raises(ValueError, match=f"^{name}: expected a contiguous"):
            triton_tables.checked_tables(par, **{**ok, name: wrong})
    with pytest.raises(ValueError, match=r"^parents: expected int32 or int64 \[B, T >= 1\]"):
        triton_tables.checked_tables(par.float(), **ok)


def _case(seed=0, B=3, T=7, HV=2, K=4, V=3, N=6):
    """Inputs in SGLang's convention: three sequences, the last a padded row (slot -1) whose tree is not one."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    parents = torch.tensor([[0, 0, 0, 1, 1, 2, 4], [0, 0, 1, 0, 3, 3, 5], [0, 5, 9, -4, 1, 0, 0]], dtype=torch.int32)
    x = dict(A_log=r(HV) * 0.3, a=r(B, T, HV), dt_bias=r(HV) * 0.3, q=r(B, T, 1, K), k=r(B, T, 1, K),
             v=r(B, T, HV, V), b=r(B, T, HV))
    return x, parents, r(N, HV, V, K), torch.tensor([3, 1, -1], dtype=torch.int32)


def _verify(x, parents, pool, slots, **kw):
    return engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool,
                                    slots, retrieve_parent_token=parents, **kw)


def _commit(x, parents, pool, slots, accepted, **kw):
    return engine_api.commit_accepted(x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"], pool, slots,
                                      retrieve_parent_token=parents, accepted=accepted, **kw)


_READS = ("tolist", "item", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def _no_host_reads():
    """Any of ddsim's fast-path modules reading a tensor's value on the host (what stops a CUDA graph's capture)
    raises: a host read from its own Python, where the interpreter cannot see a device."""
    import ddsim.gpu_backend as gb
    root = os.path.dirname(gb.__file__)
    real = {name: getattr(torch.Tensor, name) for name in _READS}

    def reader(name):
        def read(self, *a, **kw):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(root) and not os.path.basename(caller).startswith("triton_"):
                raise AssertionError(f"host read ({name}) in {caller}")
            return real[name](self, *a, **kw)
        return read
    try:
        for name in _READS:
            setattr(torch.Tensor, name, reader(name))
        yield
    finally:
        for name, fn in real.items():
            setattr(torch.Tensor, name, fn)


@pytest.mark.interpreter
@pytest.mark.parametrize("form", ["snapshot-free", "drop-in", "flattened", "packed"])
def test_a_device_checked_call_gives_the_host_checked_bits_and_reads_nothing_on_the_host(form):
    """With device_checks.forced() (what capture takes) each form of the verify, and the commit, give the bits of
    the same call planned on the host (plan_tree, plan_slots, plan_accepted: the host's tables, the tree's own depth,
    no step kernel), reading no value on the host from ddsim's code."""
    x, parents, pool, slots = _case()
    parents[2] = torch.tensor([0, 0, 1, 2, 3, 4, 5])  # every tree valid: the host check passes
    B, T = parents.shape
    kw = {}
    if form == "drop-in":
        kw = dict(intermediate_states_buffer=torch.full((5, T, 2, 3, 4), float("nan")),
                  intermediate_state_indices=torch.tensor([4, 0, 2]))
    if form == "packed":
        x = {n: t.reshape(1, B * T, *t.shape[2:]) if t.dim() > 1 else t for n, t in x.items()}
        kw = dict(cu_seqlens=torch.arange(0, B * T + 1, T))
    tree = None if form == "flattened" else parents
    pool0 = pool.clone()
    planned = dict(kw, intermediate_state_indices=engine_api.plan_slots(kw["intermediate_states_buffer"],
                                                                        kw["intermediate_state_indices"])
                   ) if form == "drop-in" else kw
    plan = engine_api.plan_tree(parents)
    host = _verify(x, None if tree is None else plan, pool, engine_api.plan_slots(pool, slots), **planned)
    host_buf = kw.get("intermediate_states_buffer", torch.zeros(0)).clone()
    if form == "drop-in":
        kw["intermediate_states_buffer"].fill_(float("nan"))
    with device_checks.forced(), _no_host_reads():
        dev = _verify(x, tree, pool, slots, **kw)
        if form == "snapshot-free":
            _commit(x, parents, pool, slots, torch.tensor([6, 4, 3]))
    assert torch.equal(dev, host) and torch.isfinite(dev).all()
    if form == "drop-in":
        assert torch.equal(kw["intermediate_states_buffer"].nan_to_num(7.0), host_buf.nan_to_num(7.0))
    if form == "snapshot-free":
        committed = pool.clone()
        pool.copy_(pool0)
        _commit(x, plan, pool, engine_api.plan_slots(pool, slots),
                engine_api.plan_accepted(plan, torch.tensor([6, 4, 3])))
        assert torch.equal(committed, pool)


FAULTS = ["tree", "slot outside the pool", "slot shared", "row outside the buffer", "row shared", "segments",
          "accepted outside the tree"]


@pytest.mark.interpreter
@pytest.mark.parametrize("fault", FAULTS)
def test_a_sequence_with_an_input_it_cannot_trust_fails_closed_and_nothing_else_changes(fault):
    """Under device checks (capture) a sequence whose tree, slot, buffer row, packing or accepted node is wrong gets
    NaN outputs, NaN node states and a NaN committed state; every other sequence gets its bits of a right call, the
    padded row (whose tree is not one) is not flagged, and no other slot or buffer row changes."""
    x, parents, pool, slots = _case(seed=1)
    B, T = parents.shape
    nan = float("nan")
    rows = torch.tensor([4, 0, 2])
    right = dict(buf=torch.full((5, T, 2, 3, 4), nan), pool=pool.clone())
    with device_checks.forced():
        o_right = _verify(x, parents, right["pool"], slots, intermediate_states_buffer=right["buf"],
                          intermediate_state_indices=rows)
        _commit(x, parents, right["pool"], slots, torch.tensor([6, 4, 3]))
    flagged = {0: False, 1: True, 2: False}
    tree, slots_f, rows_f, acc, xx, kw = parents.clone(), slots.clone(), rows.clone(), torch.tensor([6, 4, 3]), x, {}
    if fault == "tree":
        tree[1, 4] = 6  # a later node
    elif fault == "slot outside the pool":
        slots_f[1] = 6
    elif fault == "slot shared":
        slots_f[1], flagged[0] = 3, True
    elif fault == "row outside the buffer":
        rows_f[1] = 5  # clamped to row 4, sequence 0's: it reads NaN where they meet
        flagged[0] = None
    elif fault == "row shared":
        rows_f[1], flagged[0] = 4, True
    elif fault == "segments":
        xx = {n: t.reshape(1, B * T, *t.shape[2:]) if t.dim() > 1 else t for n, t in x.items()}
        kw = dict(cu_seqlens=torch.tensor([0, T, 2 * T + 1, 3 * T]))
        flagged[0] = True
    else:
        acc[1] = T
    buf, pool_f = torch.full((5, T, 2, 3, 4), nan), pool.clone()
    with device_checks.forced():
        o = _verify(xx, tree, pool_f, slots_f, intermediate_states_buffer=buf, intermediate_state_indices=rows_f,
                    **kw).reshape(B, T, 2, 3)
        _commit(xx, tree, pool_f, slots_f, acc, **kw)
    verify_flags = flagged if fault != "accepted outside the tree" else {0: False, 1: False, 2: False}
    for b, bad in verify_flags.items():
        if bad:
            assert torch.isnan(o[b]).all(), (b, o[b])
        elif bad is False:
            assert torch.equal(o[b], o_right[b]), b
    if verify_flags[1]:  # its node states: NaN in the row it was given (clamped into the buffer)
        assert torch.isnan(buf[min(int(rows_f[1]), 4)]).all()
    if not verify_flags[1]:
        assert torch.equal(buf[rows_f[1]], right["buf"][rows[1]])
    assert torch.equal(buf[[1, 3]].nan_to_num(7.0), right["buf"][[1, 3]].nan_to_num(7.0))  # rows of no sequence
    if verify_flags[0] is False:
        assert torch.equal(buf[4], right["buf"][4]) and torch.equal(buf[2], right["buf"][2])
    commit_flags = {"accepted outside the tree": {0: False, 1: True, 2: False}, "row outside the buffer": {0: False,
                    1: False, 2: False}, "row shared": {0: False, 1: False, 2: False}}.get(fault, flagged)
    live = {0: 3, 1: int(slots_f[1])}
    for b, slot in live.items():
        if not 0 <= slot < 6:
            continue
        if commit_flags[b] or (b == 0 and fault == "slot shared"):
            assert torch.isnan(pool_f[slot]).all(), b
        elif commit_flags[b] is False:
            assert torch.equal(pool_f[slot], right["pool"][slot]), b
    untouched = [s for s in range(6) if s not in live.values()]
    assert torch.equal(pool_f[untouched], pool[untouched])


@pytest.mark.interpreter
def test_what_a_capture_cannot_take_is_refused_in_one_line():
    """Under device checks: slots as a host list (a replay would read the capture's for ever), a tree on another
    device, as a list, of another dtype or size, index tensors of another length or dtype, a bf16 pool's commit
    (written back past a host read); and the step kernel's own refusals of such index tensors."""
    x, parents, pool, slots = _case()
    with device_checks.forced():
        with pytest.raises(ValueError, match=r"^initial_state_indices: list under CUDA-graph capture"):
            _verify(x, parents, pool, [3, 1, -1])
        with pytest.raises(ValueError, match="^retrieve_parent_token: on meta under CUDA-graph capture"):
            _verify(x, torch.empty(3, 7, dtype=torch.int32, device="meta"), pool, slots)
        with pytest.raises(ValueError, match="^retrieve_parent_token: list under CUDA-graph capture"):
            _verify(x, parents.tolist(), pool, slots)
        with pytest.raises(ValueError, match=r"^retrieve_parent_token: expected int32 or int64 \[3, 7\], got "
                                             r"torch.float32 \(3, 7\)"):
            _verify(x, parents.float(), pool, slots)
        with pytest.raises(ValueError, match=r"^retrieve_parent_token: expected int32 or int64 \[3, 7\], got "
                                             r"torch.int32 \(3, 6\)"):
            _commit(x, parents[:, :6], pool, slots, torch.tensor([1, 1, 1]))
        with pytest.raises(ValueError, match="^accepted: list under CUDA-graph capture"):
            _commit(x, parents, pool, slots, [1, 1, 1])
        # an index tensor of another length or dtype: the kernel would read past it (another tensor's memory taken
        # as a sequence's node or row) or take a float for an index
        with pytest.raises(ValueError, match=r"^accepted: expected int32 or int64 \[3\], got torch.int64 \(2,\)"):
            _commit(x, parents, pool, slots, torch.tensor([1, 1]))
        with pytest.raises(ValueError, match=r"^intermediate_state_indices: expected int32 or int64 \[3\], got "
                                             r"torch.float32 \(3,\)"):
            _verify(x, parents, pool, slots, intermediate_states_buffer=torch.zeros(5, 7, 2, 3, 4),
                    intermediate_state_indices=torch.tensor([4.0, 0.0, 2.0]))
        with pytest.raises(ValueError, match=r"^initial_state_indices: expected int32 or int64 \[3\], got "
                                             r"torch.float32 \(3,\)"):
            _verify(x, parents, pool, slots.float())
        with pytest.raises(ValueError, match="^initial_state_source: a torch.bfloat16 pool's commit"):
            _commit(x, parents, pool.bfloat16(), slots, torch.tensor([1, 1, 1]))
    a = torch.zeros(3, 7, 2)
    with pytest.raises(ValueError, match=r"^step_checks: b: expected a's shape \[B, T, HV\] = \(3, 7, 2\), got "
                                         r"\(3, 7, 1\)$"):  # (it had named both shapes, not what was expected)
        device_checks.step(a=a, b=a[..., :1], slots=slots, N=6)
    for name, wrong in (("tree", torch.zeros(3, 6, dtype=torch.int32)), ("rows", torch.zeros(3, 1, dtype=torch.int32)),
                        ("accepted", torch.zeros(2, dtype=torch.int64)), ("cu_seqlens", torch.zeros(3, dtype=torch.int32))):
        with pytest.raises(ValueError, match=f"^step_checks: {name}: expected "):
            device_checks.step(a=a, b=a, slots=slots, N=6, **{name: wrong}, **({"N_buf": 4} if name == "rows" else {}))


def test_the_poison_reaches_every_output_and_state():
    """device_checks.poisoned: a flagged sequence's gate input NaN, the others' as given."""
    a = torch.randn(3, 4, 2)
    p = device_checks.poisoned(a, torch.tensor([False, True, False]))
    assert torch.isnan(p[1]).all() and torch.equal(p[[0, 2]], a[[0, 2]])


def test_slots_rows_and_accepted_checked_on_the_device():
    """The torch twins at their bounds: the first and last slot, row and node inside, one past, -1 and below; what
    they launch with (pool and buffer sizes, a count of padded rows) as the kernels take it."""
    s, bad = device_checks.slots(torch.tensor([2, -1, 9, 2, 0, 4, 5, -2]), 5, "initial_state_indices")
    assert s.indices.tolist() == [2, -1, -1, 2, 0, 4, -1, -1] and s.N == 5 and s.padded == 8
    assert bad.tolist() == [True, False, True, True, False, False, True, True]
    r, bad = device_checks.rows(torch.tensor([4, 7, 1, -2, 0, 5]), 5, "intermediate_state_indices")
    assert r.indices.tolist() == [4, 4, 1, 0, 0, 4] and r.N == 5 and r.padded == 0
    # rows 7 and 5 are outside (flagged, clamped to row 4, whose own sequence is not flagged: NaN may land in its
    # states, never another number)
    assert bad.tolist() == [False, True, False, True, False, True]
    acc, bad = device_checks.accepted(torch.tensor([0, 7, -1, 6]), 4, 7)
    assert acc.indices.tolist() == [0, 0, 0, 6] and acc.T == 7 and bad.tolist() == [False, True, True, False]
    p = device_checks.poisoned(torch.ones(2, 1, 1), torch.tensor([True, False]))
    assert torch.isnan(p[0]).all() and p[1].item() == 1.0
    with pytest.raises(ValueError, match=r"^rows_of_x: expected an integer tensor \[B\], got torch.float32 \(2,\)$"):
        device_checks.rows(torch.zeros(2), 5, "rows_of_x")
    with pytest.raises(ValueError, match=r"^slots_of_x: expected an integer tensor \[B\], got torch.int64 \(1, 2\)$"):
        device_checks.slots(torch.zeros(1, 2, dtype=torch.long), 5, "slots_of_x")
    with pytest.raises(ValueError, match=r"^slots_of_x: expected an integer tensor \[B\], got tuple$"):
        device_checks.slots((1, 2), 5, "slots_of_x")
    with pytest.raises(ValueError, match=r"^accepted: expected an integer tensor \[B\] = \[3\]"):
        device_checks.accepted(torch.tensor([0, 1]), 3, 7)


def _captured_step(x, pool, buf, *, tree, slots, accepted, rows, gen):
    """The drop-in's step captured once in a CUDA graph on the step's tensors (x's, pool, buf, tree [B, T],
    slots [B], accepted [B], rows [B], all on the GPU): target_verify snapshot-free and into buf's rows, then
    commit_accepted. Returns trial(new_tree, new_slots, eager): writes the tree, the slots, fresh q, k, v, a, b and a
    fresh pool (from ``gen``) into those tensors, replays the graph, and returns (got, want, start): the replay's two
    outputs, buffer and pool; with ``eager`` the same step run eagerly on the same values (else None); the pool the
    two started from."""
    def step():
        o1 = _verify(x, tree, pool, slots)
        o2 = _verify(x, tree, pool, slots, intermediate_states_buffer=buf, intermediate_state_indices=rows)
        _commit(x, tree, pool, slots, accepted)
        return o1, o2
    pool0 = pool.clone()
    step()  # warm-up: compiles what the capture launches
    pool.copy_(pool0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()

    def trial(new_tree, new_slots, eager: bool):
        for n in ("q", "k", "v", "a", "b"):
            x[n].copy_(torch.randn(x[n].shape, generator=gen))
        tree.copy_(new_tree)
        slots.copy_(torch.as_tensor(new_slots, dtype=torch.int32))
        start = torch.randn(pool.shape, generator=gen).to(pool.device)
        pool.copy_(start)
        buf.fill_(float("nan"))
        graph.replay()
        got = [t.clone() for t in outs] + [buf.clone(), pool.clone()]
        pool.copy_(start)
        buf.fill_(float("nan"))
        return got, (list(step()) + [buf, pool] if eager else None), start
    return trial


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_the_drop_in_is_captured_in_a_cuda_graph_and_replays_other_steps():
    """target_verify (snapshot-free and with SGLang's buffer) and commit_accepted captured once on one step's tensors,
    then replayed on other trees, slots and values written into those tensors: each replay gives the eager call's
    outputs, node states and committed states on that step's values (the same bits), and a step with a wrong tree
    fails closed in the replay."""
    dev = torch.device("cuda")
    x, parents, pool, slots = _case(seed=3, T=7)
    x = {n: t.to(dev).bfloat16() if n in ("q", "k", "v") else t.to(dev) for n, t in x.items()}
    pool = pool.to(dev)
    parents[2] = torch.tensor([0, 0, 1, 2, 3, 4, 5])
    st_tree, st_slots = parents.to(dev), slots.to(dev)
    st_acc, st_rows = torch.tensor([6, 4, 3], device=dev), torch.tensor([4, 0, 2], device=dev)
    buf = torch.full((5, 7, 2, 3, 4), float("nan"), device=dev)
    replay = _captured_step(x, pool, buf, tree=st_tree, slots=st_slots, accepted=st_acc, rows=st_rows,
                            gen=torch.Generator().manual_seed(11))
    for trial in range(3):
        new_tree = torch.tensor([[0, 0, 1, 1, 0, 4, 2], [0, 0, 0, 0, 0, 0, 0], [0, 0, 1, 2, 3, 4, 5]], dtype=torch.int32)
        if trial == 2:
            new_tree[0, 5] = 5  # not an earlier node
        new_slots = [[0, 5, -1], [2, 4, 1], [1, 3, 0]][trial]
        got, want, _ = replay(new_tree, new_slots, eager=trial < 2)
        if trial < 2:
            for g_, w in zip(got, want):
                assert torch.equal(g_.nan_to_num(7.0), w.nan_to_num(7.0)), trial
        else:
            # sequence 0's outputs, its node states (its buffer row, 4) and its committed state NaN; sequence 1's not
            assert torch.isnan(got[0][0]).all() and torch.isnan(got[1][0]).all() and torch.isnan(got[2][4]).all()
            assert torch.isnan(got[3][int(new_slots[0])]).all() and torch.isfinite(got[0][1]).all()


@pytest.mark.interpreter
def test_a_nan_gate_input_reaches_what_it_feeds_as_in_torch():
    """A NaN in a gate's raw input (GDN's a, Mamba2's dt) gives NaN where torch's softplus and clamp give it, not a
    finite gate: the node's output and its descendants' in the tree verify (the WY form's products carry it to other
    nodes of the head too: never fewer), no other head's or sequence's, and the gates kernel's g. (Triton's minimum
    drops a NaN unless told to keep it; the poisoning above relies on it.)"""
    import ddsim.gpu_backend as gb
    x, parents, pool, slots = _case(seed=5)
    parents[2] = torch.tensor([0, 0, 1, 2, 3, 4, 5])
    x["a"][0, 3, 1] = float("nan")  # node 3 of sequence 0, value head 1: node 3 and its child 6 (0, 0, 0, 1, 1, 2, 4)
    o = _verify(x, parents, pool, slots)
    nan = torch.isnan(o).any(-1)  # [B, T, HV]
    assert nan[0, [3, 6], 1].all() and not nan[1:].any() and not nan[:, :, 0].any()
    g, _ = gb.gdn_gates(x["a"].reshape(-1, 2), x["b"].reshape(-1, 2), A=-x["A_log"].exp(), dt_bias=x["dt_bias"],
                        glue="triton")
    assert torch.isnan(g).sum() == 1 and torch.isnan(g.reshape(3, 7, 2)[0, 3, 1])
    gen = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    Bn, T, H, P, G, N = 1, 5, 2, 4, 1, 8
    dt = r(Bn, T, H)
    dt[0, 2, 0] = float("nan")
    tree = torch.tensor([[-1, 0, 1, 2, 0]])
    for limit in ((0.0, float("inf")), (0.01, 5.0)):
        y = gb.mamba2_tree_verify(r(Bn, T, H, P), dt, -r(H).exp(), r(Bn, T, G, N), r(Bn, T, G, N), dt_limit=limit,
                                  parents=tree, initial_state=torch.zeros(Bn, H, P, N), backend="triton")
        nan = torch.isnan(y).any(-1)
        assert nan[0, :, 1].sum() == 0 and nan[0, :, 0].tolist() == [False, False, True, True, False], limit


@pytest.mark.interpreter
@given(data=st.data())
def test_the_step_kernel_equals_its_torch_reference(data):
    """device_checks.step (one kernel, triton_checks) against step_reference (the torch functions), on drawn slots
    (padding, outside the pool, shared), buffer rows, accepted nodes, packing offsets and trees, a and b strided."""
    # 200 heads: a block's 32 nodes copied in two tiles of 16 (triton_checks.step_checks)
    # past 32 nodes often (a second block: its program's tables, flags and copy)
    B, T = data.draw(st.integers(1, 6)), data.draw(st.one_of(st.integers(1, 40), st.integers(33, 40)))
    HV, N = data.draw(st.sampled_from([1, 2, 5, 200])), 5
    def ints(lo, hi, n_right):  # [B]: right values (distinct in 0..n_right-1 where they fit), at most one entry wrong
        right = data.draw(st.permutations(range(max(n_right, B))))[:B]
        out = [x % n_right for x in right] if n_right else [0] * B
        if data.draw(st.booleans()):
            out[data.draw(st.integers(0, B - 1))] = data.draw(st.integers(lo, hi))
        return torch.tensor(out)
    parents = torch.tensor([[0] + [data.draw(st.integers(0, i - 1)) for i in range(1, T)] for _ in range(B)])
    if T > 1 and data.draw(st.booleans()):  # one node's parent not an earlier node
        i = data.draw(st.one_of(st.integers(1, T - 1), st.just(T - 1)))
        parents[data.draw(st.integers(0, B - 1)), i] = data.draw(st.one_of(st.integers(-2, -1), st.integers(i, T + 1)))
    given = data.draw(st.sampled_from(["tree", "chain", "plan", "none"]))  # a tree as read (its tables built in the
    # launch), the flattened recurrence's chains (theirs too), a DevicePlan (its flags read), or neither (a plan
    # validated on the host)
    kw = dict(slots=ints(-2, N + 1, N).to(data.draw(st.sampled_from([torch.int32, torch.int64]))), N=N)
    if given == "tree":
        kw.update(tree=parents.to(data.draw(st.sampled_from([torch.int32, torch.int64]))))
    elif given == "chain":
        kw.update(chain=True)
    elif given == "plan":
        kw.update(plan=device_checks.DevicePlan(parents))
    if data.draw(st.booleans()):
        kw.update(rows=ints(-1, 6, 6), N_buf=6)
    if data.draw(st.booleans()):
        kw.update(accepted=ints(-1, T, T))
    if data.draw(st.booleans()):
        cu = torch.arange(B + 1) * T
        if data.draw(st.booleans()):
            cu[data.draw(st.integers(0, B))] += 1
        kw.update(cu_seqlens=cu)
    wide = torch.randn(B, T, 2 * HV + 1)
    kw.update(a=wide[:, :, :HV], b=wide[:, :, HV + 1:].bfloat16())
    got, want = device_checks.step(**kw), device_checks.step_reference(**kw)
    assert torch.equal(got.bad, want.bad)
    if given == "tree":  # the tables the launch built: checked_tables' (which the host's hold), flags and all
        assert isinstance(got.plan, device_checks.DevicePlan)
        assert torch.equal(got.plan.bad_blocks, want.plan.bad_blocks)
        assert torch.equal(got.plan.parents, want.plan.parents)
        assert torch.equal(got.plan.ancestors("exact")[0], want.plan.ancestors("exact")[0])
        assert torch.equal(got.plan.root_paths(), want.plan.root_paths())
    elif given == "chain":  # by formula: the chains' TreePlan's tables, leaky mode's as exact's
        assert got.plan.bad_blocks is None and not got.plan.bad.any()
        for mode in checks.MODES:
            assert torch.equal(got.plan.src(mode), want.plan.src(mode))
            assert torch.equal(got.plan.ancestors(mode)[0], want.plan.ancestors(mode)[0])
            assert torch.equal(got.plan.root_paths(mode), want.plan.root_paths(mode))
    else:
        assert got.plan is kw.get("plan")
    assert torch.equal(got.slots.indices, want.slots.indices)
    for name in ("rows", "accepted"):
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None) and (g is None or torch.equal(g.indices, w.indices.to(g.indices.dtype)))
    for name in ("a", "b"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.is_contiguous() and g.dtype == w.dtype and torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0))


# slow: the interpreter's longest here (about 30 s of one core on the 2-core machine); CI runs it in make test-slow
@pytest.mark.slow
@pytest.mark.interpreter
def test_past_one_block_a_device_checked_call_gives_the_host_checked_bits():
    """Past 65 nodes (the WY form over chunks, the tables kernel over three blocks of 32 nodes), slots past row 64 of
    an 80-row pool: the device-checked verify, drop-in (into an fp32 buffer and a bf16 one) and commit give the bits
    of the calls planned on the host, and a wrong parent in the third block fails its sequence closed. (The gates'
    copy in several tiles: the step kernel's test, at 200 heads.)"""
    from ddsim.bench.bench import ddtree_batch
    _, parents = ddtree_batch(2, 70, vocab=60, depth=8, topk=4, seed=3)
    (B, T), HV = parents.shape, 2
    assert T > 65
    g = torch.Generator().manual_seed(9)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = dict(A_log=r(HV) * 0.3, a=r(B, T, HV), dt_bias=r(HV) * 0.3, q=r(B, T, 1, 4), k=r(B, T, 1, 4),
             v=r(B, T, HV, 3), b=r(B, T, HV))
    pool, slots, tree = r(80, HV, 3, 4), torch.tensor([70, 3], dtype=torch.int32), parents.int()  # past row 64
    tree[:, 0] = 0
    acc = torch.tensor([T - 1, 40])
    outs = []
    for forced in (False, True):  # planned on the host (the host's tables, no step kernel), then device-checked
        buf, p = torch.full((2, T, HV, 3, 4), float("nan")), pool.clone()
        buf16 = torch.full((3, T, HV, 3, 4), float("nan"), dtype=torch.bfloat16)  # states made apart, copied in
        plan = engine_api.plan_tree(tree)
        t_, s_, r1, r2, a_ = (tree, slots, torch.tensor([1, 0]), torch.tensor([2, 0]), acc) if forced else (
            plan, engine_api.plan_slots(p, slots), engine_api.plan_slots(buf, [1, 0]), engine_api.plan_slots(buf16, [2, 0]),
            engine_api.plan_accepted(plan, acc))
        with device_checks.forced() if forced else contextlib.nullcontext():
            o = _verify(x, t_, p, s_)
            o2 = _verify(x, t_, p, s_, intermediate_states_buffer=buf, intermediate_state_indices=r1)
            _verify(x, t_, p, s_, intermediate_states_buffer=buf16, intermediate_state_indices=r2)
            _commit(x, t_, p, s_, a_)
        outs.append((o, o2, buf, buf16, p))
    for h, d in zip(*outs):
        assert torch.equal(h.nan_to_num(7.0), d.nan_to_num(7.0))
    assert torch.isfinite(outs[1][3][[2, 0]]).all() and torch.isnan(outs[1][3][1]).all()  # the rows given, only
    bad = tree.clone()
    bad[1, 66] = 67  # a later node, in the third block of 32
    with device_checks.forced():
        o = _verify(x, bad, pool.clone(), slots)
    assert torch.isnan(o[1]).all() and torch.equal(o[0], outs[0][0][0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_past_65_nodes_a_pool_past_64_rows_and_a_bf16_buffer_are_captured():
    """Past 65 nodes (the chunked WY form, the tables kernel over three blocks), with slots past row 64 of an
    80-row pool and node states into a bf16 buffer (the drop-in's copy into it, ``buf[rows, :T] = ...``, captured):
    replays on other trees, slots and values give the eager host-checked calls' bits, and a wrong parent in the third
    block of nodes fails that sequence closed in the replay and nothing else."""
    from ddsim.bench.bench import ddtree_batch
    dev = torch.device("cuda")
    B, HV, K, V, N = 2, 4, 16, 8, 80
    trees = []
    for seed in (3, 4, 5):
        _, p = ddtree_batch(B, 70, vocab=60, depth=8, topk=4, seed=seed)
        p = p.int()
        p[:, 0] = 0
        trees.append(p)
    T = trees[0].shape[1]
    assert T > 65 and all(t.shape == (B, T) for t in trees)
    gen = torch.Generator().manual_seed(5)
    x = {n: torch.randn(*s, generator=gen).to(dev) for n, s in (
        ("A_log", (HV,)), ("a", (B, T, HV)), ("dt_bias", (HV,)), ("q", (B, T, 1, K)), ("k", (B, T, 1, K)),
        ("v", (B, T, HV, V)), ("b", (B, T, HV)))}
    for n in ("q", "k", "v"):
        x[n] = x[n].bfloat16()
    pool = torch.randn(N, HV, V, K, generator=gen).to(dev)
    st_tree, st_slots = trees[0].to(dev), torch.tensor([70, 3], dtype=torch.int32, device=dev)
    st_acc, st_rows = torch.tensor([T - 1, 40], device=dev), torch.tensor([2, 0], device=dev)
    buf = torch.full((3, T, HV, V, K), float("nan"), dtype=torch.bfloat16, device=dev)
    replay = _captured_step(x, pool, buf, tree=st_tree, slots=st_slots, accepted=st_acc, rows=st_rows, gen=gen)
    for trial, (tree, slots) in enumerate(((trees[1], [79, 64]), (trees[2], [5, 77]), (trees[1], [66, 70]))):
        tree = tree.clone()
        if trial == 2:
            tree[1, 66] = 67  # a later node, in the third block of 32
        got, want, start = replay(tree, slots, eager=trial < 2)
        if trial < 2:
            for g_, w in zip(got, want):
                assert torch.equal(g_.nan_to_num(7.0), w.nan_to_num(7.0)), trial
            assert torch.isfinite(got[0]).all() and torch.isfinite(got[2][st_rows.long()]).all()
        else:
            # sequence 1's outputs, its node states (buffer row 0) and committed state (slot 70) NaN; sequence 0's not
            assert torch.isnan(got[0][1]).all() and torch.isnan(got[1][1]).all() and torch.isnan(got[2][0]).all()
            assert torch.isnan(got[3][70]).all() and torch.isfinite(got[0][0]).all()
            assert torch.isfinite(got[2][2]).all() and torch.equal(got[3][:66], start[:66])


@pytest.mark.interpreter
@pytest.mark.parametrize("given", ["tree", "plan"])
def test_every_block_of_nodes_sees_a_wrong_parent_in_another_block(given):
    """At 70 nodes (three blocks of 32, a program each): a wrong parent in the third block flags its sequence in the
    step kernel's every program, as a tree read in the launch and as a DevicePlan's flags, so every node's gates of
    that sequence are NaN, and nothing of the other sequence's."""
    T, HV = 70, 3
    tree = torch.tensor([[0] + list(range(T - 1))] * 2)
    tree[1, 66] = 68
    a, b = torch.randn(2, T, HV), torch.randn(2, T, HV)
    kw = dict(tree=tree) if given == "tree" else dict(plan=device_checks.DevicePlan(tree))
    got = device_checks.step(a=a, b=b, slots=torch.tensor([0, 1]), N=2, **kw)
    assert got.bad.tolist() == [False, True]
    for name, x in (("a", a), ("b", b)):
        out = getattr(got, name)
        assert torch.isnan(out[1]).all() and torch.equal(out[0], x[0]), name


@pytest.mark.interpreter
def test_an_eager_raw_call_launches_what_its_capture_launches():
    """The drop-in's eager calls on raw tensors (an engine's warm-up before it captures) launch the kernels a
    captured call launches, in the same order, each with the same specialization (its constexprs and its tensors'
    dtypes), so that a capture compiles nothing: verify, drop-in, flattened verify, commit and packed verify.
    (Triton's interpreter sees every launch, whatever ddsim's launchers keep.)"""
    import triton.runtime.interpreter as interpreter
    x, parents, pool, slots = _case()
    parents[2] = torch.tensor([0, 0, 1, 2, 3, 4, 5])
    real = interpreter.GridExecutor.__call__
    seen: list = []

    def call(self, *args, **kw):
        seen[-1].append((self.fn.__name__, sorted((k, v.dtype if isinstance(v, torch.Tensor) else v)
                                                  for k, v in kw.items() if k.isupper() or isinstance(v, torch.Tensor))))
        return real(self, *args, **kw)
    interpreter.GridExecutor.__call__ = call
    try:
        for forced in (False, True):
            seen.append([])
            with device_checks.forced() if forced else contextlib.nullcontext():
                _verify(x, parents, pool.clone(), slots)
                _verify(x, parents, pool.clone(), slots, intermediate_states_buffer=torch.zeros(5, 7, 2, 3, 4),
                        intermediate_state_indices=torch.tensor([4, 0, 2]))
                engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"],
                                         pool.clone(), slots)
                _commit(x, parents, pool.clone(), slots, torch.tensor([6, 4, 3]))
                packed = {n: t.reshape(1, 21, *t.shape[2:]) if t.dim() > 1 else t for n, t in x.items()}
                _verify(packed, parents, pool.clone(), slots, cu_seqlens=torch.arange(0, 22, 7))
    finally:
        interpreter.GridExecutor.__call__ = real
    eager, captured = seen
    assert [n for n, _ in eager].count("_step_checks_kernel") == 5, [n for n, _ in eager]
    assert eager == captured


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values as a strided view (every other entry of a wider tensor along its last dim), as an engine may hand
    over its slots or its tree (a slice of a wider table)."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), 99, dtype=t.dtype)
    wide[..., ::2] = t
    out = wide[..., ::2]
    assert not out.is_contiguous() and torch.equal(out, t)
    return out


@pytest.mark.interpreter
@pytest.mark.parametrize("which", ["slots", "tree", "rows", "accepted", "cu_seqlens"])
def test_index_tensors_given_as_strided_views_are_read_as_their_values(which):
    """The step kernel reads slots, a tree, buffer rows, accepted nodes and packing offsets given as strided views as
    their values, not as the memory past them (another sequence's entry: a wrong slot read, not a NaN), in its torch
    twin's bits; and the drop-in given strided slots and tree, eager and device-checked, gives the bits of
    contiguous ones."""
    B, T = 3, 7
    x, parents, pool, slots = _case()
    parents[2] = torch.tensor([0, 0, 1, 2, 3, 4, 5])
    kw = dict(a=x["a"], b=x["b"], slots=slots, N=pool.shape[0], tree=parents, rows=torch.tensor([4, 0, 2]), N_buf=5,
              accepted=torch.tensor([6, 4, 3]), cu_seqlens=torch.arange(B + 1) * T)
    want = device_checks.step(**kw)
    kw[which] = _strided(kw[which])
    for got in (device_checks.step(**kw), device_checks.step_reference(**kw)):
        assert torch.equal(got.bad, want.bad) and not got.bad[:2].any()
        assert torch.equal(got.slots.indices, want.slots.indices)
        assert torch.equal(got.rows.indices, want.rows.indices.to(got.rows.indices.dtype))
        assert torch.equal(got.accepted.indices, want.accepted.indices)
        assert torch.equal(got.plan.root_paths(), want.plan.root_paths())
        assert torch.equal(got.a.nan_to_num(7.0), want.a.nan_to_num(7.0))
    if which in ("slots", "tree"):
        for forced in (False, True):
            with device_checks.forced() if forced else contextlib.nullcontext():
                o = _verify(x, parents, pool.clone(), slots)
                o2 = _verify(x, _strided(parents) if which == "tree" else parents, pool.clone(),
                             _strided(slots) if which == "slots" else slots)
            assert torch.equal(o.nan_to_num(7.0), o2.nan_to_num(7.0)), forced


@pytest.mark.interpreter
def test_an_eager_raw_call_refuses_in_one_line_before_any_launch():
    """Outside capture the raw inputs a captured call would fail closed on are refused on the host, in one line naming
    the argument, before any kernel is launched and with the pool untouched: a later node as a parent, a slot
    outside the pool, a buffer row two sequences share, an accepted node outside the tree."""
    import triton.runtime.interpreter as interpreter
    x, parents, pool, slots = _case()
    parents[2] = torch.tensor([0, 0, 1, 2, 3, 4, 5])
    bad_tree = parents.clone()
    bad_tree[1, 3] = 5
    buf = torch.zeros(5, 7, 2, 3, 4)
    cases = [
        (r"^parents: sequence 1 node 3: parent 5 is not an earlier node", lambda p: _verify(x, bad_tree, p, slots)),
        (r"^initial_state_indices: slots must lie in 0..5", lambda p: _verify(x, parents, p, torch.tensor([3, 9, -1]))),
        (r"^intermediate_state_indices: rows must be distinct",
         lambda p: _verify(x, parents, p, slots, intermediate_states_buffer=buf,
                           intermediate_state_indices=torch.tensor([4, 0, 4]))),
        (r"^accepted: expected \[B\] = \[3\] node indices in 0..6", lambda p: _commit(x, parents, p, slots,
                                                                                    torch.tensor([6, 7, 0]))),
    ]
    real = interpreter.GridExecutor.__call__
    launched = []
    interpreter.GridExecutor.__call__ = lambda self, *a, **kw: launched.append(self.fn.__name__)
    try:
        for needle, call in cases:
            p = pool.clone()
            with pytest.raises(ValueError, match=needle):
                call(p)
            assert not launched and torch.equal(p, pool), needle
    finally:
        interpreter.GridExecutor.__call__ = real


def _rounds_example(T: int) -> dict:
    """Two sequences: a tree whose deepest node sits 3 (T = 6) or 4 (T = 7) below its root, and a chain (T - 1 deep,
    the batch's depth): at the tree's depth one doubling round fewer than its solve needs leaves a power of -L out
    (ceil(log2 d) drops with d - 1; ceil(log2 (d + 1)) where the root's chain counts, at T = 7)."""
    parents = [-1, 0, 0, 1, 2, 4, 5][:T]
    gen = torch.Generator().manual_seed(T)
    B, H, HV, K, V = 2, 1, 2, 4, 3
    return dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen) * 0.2,
                beta=torch.rand(B, T, HV, generator=gen), parents=torch.tensor([parents, [-1] + list(range(T - 1))]),
                initial_state=torch.randn(B, HV, K, V, generator=gen))


ROUNDS_FORMS = [("fused", 0, 6), ("fused", 1, 7), ("fused", 2, 6), ("split", None, 6), ("fold", None, 6),
                ("head", None, 6), ("chunked", None, 6), ("blocked", None, 6)]


@pytest.mark.parametrize("design,root,T", ROUNDS_FORMS)
def test_the_wy_forms_take_a_device_plans_rounds_from_each_trees_depth(design, root, T):
    """A plan built on the device (as under capture) gives its trees' depth to the host as T - 1, a bound; every WY
    form (one block's, and past one block the chunked and split forms) then takes each sequence's doubling rounds
    from the depths the kernel wrote (DEPTHS), where a host plan's are its deepest tree's. The same bits as the host
    plan's, the depths read; with the tree's depth one less than it is, a round short, other bits (so the rounds are
    each sequence's, not a bound's)."""
    from ddsim.gpu_backend import triton_gdn, triton_wy_blocked, triton_wy_split
    from ddsim.properties.kernel_checks import on_device
    inp = _rounds_example(T)
    x = {n: on_device(inp[n]) for n in ("q", "k", "v", "g", "beta", "initial_state")}
    parents = on_device(inp["parents"])
    host = checks.TreePlan(parents)
    device = device_checks.DevicePlan(parents.int())
    short = device_checks.DevicePlan(parents.int())
    short.depths = short.depths.clone()
    short.depths[0] -= 1  # the tree's depth one less (the chain's unchanged)
    got, seen, bind = {}, {}, triton_gdn.bind
    with pytest.MonkeyPatch.context() as mp:
        if root is not None:
            mp.setattr(triton_gdn, "FUSED_ROOT", root)
        for name, plan in (("device", device), ("host", host), ("short", short)):
            for module in (triton_gdn, triton_wy_split, triton_wy_blocked):  # each WY launcher's bind
                mp.setattr(module, "bind", lambda kernel, grid, kw, name=name: seen.setdefault(
                    name, kw.get("DEPTHS")) is None or bind(kernel, grid, kw))
            got[name] = wy_form_output(x, plan, design)
    assert seen == {"device": True, "host": False, "short": True}, seen
    assert torch.equal(got["device"], got["host"]) and torch.isfinite(got["host"]).all()
    assert not torch.equal(got["short"][0], got["host"][0]) and torch.equal(got["short"][1], got["host"][1])


def _as_launched(kernel, kw: dict) -> tuple[dict, dict, dict]:
    """(types, constants, hints) by parameter name under which Triton's launcher would compile ``kernel`` for an sm_90
    GPU with the launch's arguments ``kw`` (bench.launch_specialization); under Triton's interpreter the kernel as it
    would be compiled (its own decorator's options)."""
    pytest.importorskip("triton.backends.nvidia")
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    from ddsim.bench.bench import launch_specialization
    jit = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)
    sig, consts, attrs = launch_specialization(jit, kw, GPUTarget("cuda", 90, 32))
    names = [p.name for p in jit.params]
    return sig, {names[i[0]]: v for i, v in consts.items()}, {names[i[0]]: a for i, a in attrs.items()}


SPECIALIZED_FORMS = [("fused", 0), ("fused", 1), ("fused", 2), ("split", None), ("fold", None), ("head", None),
                     ("chunked", None), ("blocked", None), ("gluon", 2)]


@pytest.mark.parametrize("design,root", SPECIALIZED_FORMS)
def test_a_host_plan_is_compiled_as_a_device_plan_whatever_its_rounds(design, root):
    """Triton's launcher compiles an int argument equal to 1 as a constant, and one divisible by 16 (0 among them)
    with that hint. A host plan's rounds are its deepest tree's, a device plan's launch a bound (each sequence's read
    on the device): on a star (0 rounds, 1 with the root in the block, FUSED_ROOT 1), a tree of depth 2 (1, or 2) and
    a chain, every WY kernel (and the Gluon fold) is specialized alike on both plans, as the launcher would compile it
    for an sm_90 GPU (bench.launch_specialization), but for DEPTHS. With NSTEP specialized, the host plan's one round
    compiled to other contractions and its outputs differed in their last bits from a captured call's (an H100,
    benchmarks/RESULTS.md 2026-12-07); _common.ROUNDS_AS_VALUE."""
    from ddsim.gpu_backend import gluon_gdn, triton_gdn, triton_wy_blocked, triton_wy_split
    from ddsim.properties.kernel_checks import on_device
    T, K = (16, 128) if design == "gluon" else (8, 4)
    dtype = torch.bfloat16 if design == "gluon" else torch.float32
    gen = torch.Generator().manual_seed(0)
    x = dict(q=torch.randn(1, T, 1, K, generator=gen).to(dtype), k=torch.randn(1, T, 1, K, generator=gen).to(dtype),
             v=torch.randn(1, T, 1, K, generator=gen).to(dtype), g=-torch.rand(1, T, 1, generator=gen),
             beta=torch.rand(1, T, 1, generator=gen), initial_state=torch.randn(1, 1, K, K, generator=gen))
    x = {n: on_device(t) for n, t in x.items()}
    trees = {"star": [-1] + [0] * (T - 1), "depth 2": [-1, 0] + [1] * (T - 2), "chain": [-1] + list(range(T - 1))}
    seen, rounds = [], set()
    with pytest.MonkeyPatch.context() as mp:
        if root is not None:
            mp.setattr(triton_gdn, "FUSED_ROOT", root)
        for module in (triton_gdn, triton_wy_split, triton_wy_blocked):
            mp.setattr(module, "bind", lambda kernel, grid, kw: seen.append((kernel, dict(kw))) or (lambda: None))
        for tree, parents in trees.items():
            parents = on_device(torch.tensor([parents]))
            got = {}
            for name, plan in (("host", checks.TreePlan(parents)), ("device", device_checks.DevicePlan(parents.int()))):
                seen.clear()
                wy_form_output(x, plan, "fused" if design == "gluon" else design)
                kernel, kw = next((k, kw) for k, kw in seen if "DEPTHS" in kw)
                if design == "gluon" and kernel is not gluon_gdn._gdn_fold_kernel:  # interpreted: the Triton form's
                    kernel, kw = gluon_gdn._gdn_fold_kernel, gluon_gdn.kernel_args(kw)[0]
                sig, consts, attrs = _as_launched(kernel, kw)
                assert consts.pop("DEPTHS") is (name == "device")
                attrs.pop("depths", None)  # the depths' pointer, read only with DEPTHS (a host plan's a stand-in)
                assert sig.pop("depths") == ("*i32" if name == "device" else "*i8")
                if name == "host":
                    rounds.add(kw["NSTEP"])
                got[name] = sig, consts, attrs
            assert got["device"] == got["host"], (tree, kernel.__name__)
    assert {0, 1} <= rounds or (root == 1 and {1, 2} <= rounds), rounds  # the launcher's two specializations drawn


# What a captured call may launch otherwise than the same call planned on the host, by kernel: the WY kernels read
# each sequence's rounds on the device (DEPTHS, its pointer a host plan's stand-in); the paths kernel's path table is T
# wide under capture, the tree's depth + 1 on the host (BD, DMAX: how far a node's path is counted, integer work)
CAPTURE_ONLY = {"DEPTHS", "depths"}
CAPTURE_PATHS = {"BD", "DMAX"}


@pytest.mark.parametrize("form", ["snapshot-free", "drop-in"])
def test_a_captured_call_compiles_the_kernels_a_host_planned_call_compiles(form):
    """Every kernel the drop-in launches both planned on the host (plan_tree, plan_slots, plan_accepted) and
    device-checked (what capture takes), verify and commit, on a star, a tree of depth 2 and a chain, is specialized
    alike, as Triton's launcher would compile it for an sm_90 GPU (bench.launch_specialization), but for what a
    device plan reads on the device (CAPTURE_ONLY, CAPTURE_PATHS): no argument equal to 1, or divisible by 16, on one
    plan alone makes another kernel there (the WY kernels' rounds did: _common.ROUNDS_AS_VALUE)."""
    from ddsim.gpu_backend import launch as L
    from ddsim.gpu_backend import triton_checks, triton_commit, triton_gdn, triton_tables, triton_wy_blocked, triton_wy_split
    from ddsim.properties.kernel_checks import on_device
    seen = []

    def record(kernel, grid, kw):
        seen.append((kernel, dict(kw)))
        return L.bind(kernel, grid, kw)

    def specs() -> dict:
        out: dict = {}
        for kernel, kw in seen:
            out.setdefault(kernel.__name__, []).append(_as_launched(kernel, kw))
        return out
    x, _, pool, slots = _case()
    x, pool, slots = ({n: on_device(t) for n, t in x.items()}, on_device(pool), on_device(slots))
    T, compared = 7, set()
    trees = {"star": [0] * T, "depth 2": [0, 0, 1, 1, 1, 1, 1], "chain": [0] + list(range(T - 1))}
    with pytest.MonkeyPatch.context() as mp:
        for module in (triton_gdn, triton_wy_split, triton_wy_blocked, triton_commit):
            mp.setattr(module, "bind", record)
        for module in (triton_checks, triton_commit, triton_tables):
            mp.setattr(module, "launch", lambda kernel, grid, **kw: record(kernel, grid, kw)())
        for tree, row in trees.items():
            parents = on_device(torch.tensor([row] * 3, dtype=torch.int32))
            accepted = on_device(torch.tensor([T - 1, 2, 0]))
            kw = {}
            if form == "drop-in":
                kw = dict(intermediate_states_buffer=on_device(torch.zeros(5, T, 2, 3, 4)),
                          intermediate_state_indices=on_device(torch.tensor([4, 0, 2])))
            plan = engine_api.plan_tree(parents)
            planned = dict(kw, intermediate_state_indices=engine_api.plan_slots(
                kw["intermediate_states_buffer"], kw["intermediate_state_indices"])) if kw else {}
            got = {}
            for name in ("host", "captured"):
                seen.clear()
                if name == "host":
                    pslots = engine_api.plan_slots(pool, slots)
                    _verify(x, plan, pool.clone(), pslots, **planned)
                    _commit(x, plan, pool.clone(), pslots, engine_api.plan_accepted(plan, accepted))
                else:
                    with device_checks.forced():
                        _verify(x, parents, pool.clone(), slots, **kw)
                        _commit(x, parents, pool.clone(), slots, accepted)
                got[name] = specs()
            for kernel, launches in got["host"].items():
                assert len(got["captured"].get(kernel, [])) == len(launches), (tree, kernel)
                skip = CAPTURE_ONLY | (CAPTURE_PATHS if kernel == "_gdn_paths_kernel" else set())
                for host, captured in zip(launches, got["captured"][kernel]):
                    for h, c in zip(host, captured):
                        assert {n: v for n, v in h.items() if n not in skip} == \
                            {n: v for n, v in c.items() if n not in skip}, (tree, kernel)
                compared.add(kernel)
    # the verify's kernels (a WY form's, whichever the design takes on this device; the buffer's paths kernel) and the
    # commit's, each compared on every tree
    verify = {"_gdn_paths_kernel"} if form == "drop-in" else {k for k in compared if k.startswith(("_gdn_wy", "_gdn_fold"))}
    assert verify and compared == verify | {"_gdn_commit_kernel"}, compared


def _chains_example(T: int) -> dict:
    """Two chains of T nodes, fp32, H = 1, HV = 3, K = V = 4: at T = 37 with design fused and the root in the block (a
    64-row block over two blocks of depths) the draw on which the drawn-tree test below faulted on an H100 (seed 6,
    RESULTS.md 2026-12-06; interpreted, every access inside its tensors)."""
    gen = torch.Generator().manual_seed(T)
    B, H, HV, K, V = 2, 1, 3, 4, 4
    return dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen),
                beta=torch.rand(B, T, HV, generator=gen), parents=torch.tensor([[-1] + list(range(T - 1))] * B),
                initial_state=torch.randn(B, HV, K, V, generator=gen))


def _one_round_example() -> dict:
    """Two trees of depth 2 (12 nodes, fp32, HV = 2, K = V = 16): one doubling round on a host plan, on which the
    forms compiled with NSTEP a constant gave other bits than on a device plan on every such draw (an H100,
    benchmarks/rounds_specialization.py, RESULTS.md 2026-12-07)."""
    gen = torch.Generator().manual_seed(12)
    B, T, H, HV, K, V = 2, 12, 1, 2, 16, 16
    return dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen) * 0.3,
                beta=torch.rand(B, T, HV, generator=gen),
                parents=torch.tensor([[-1, 0, 0, 0, 1, 1, 2, 3, 3, 1, 2, 0], [-1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]),
                initial_state=torch.randn(B, HV, K, V, generator=gen))


# slow: about 13 s of one core drawing trees in the interpreter; CI runs it in make test-slow
@pytest.mark.slow
@given(inp=gdn_inputs(max_batch=3, max_nodes=40), design=st.sampled_from(["fused", "split", "fold", "head", "blocked"]),
       root=st.sampled_from([0, 1, 2]))
@example(inp=_chains_example(37), design="fused", root=1)
@example(inp=_one_round_example(), design="fused", root=0)
@example(inp=_one_round_example(), design="head", root=0)
def test_a_device_plans_rounds_give_a_host_plans_bits_on_drawn_trees(inp, design, root):
    """On drawn batches of trees (each sequence its own depth, the batch's deepest one a host plan's rounds), every
    WY form on a device plan (each sequence's rounds from its depth) gives the host plan's bits: a sequence's rounds
    past its own depth add zero powers, and none falls short of it."""
    from ddsim.gpu_backend import triton_gdn
    from ddsim.properties.kernel_checks import on_device
    x = {n: on_device(inp[n]) for n in ("q", "k", "v", "g", "beta", "initial_state")}
    parents = on_device(inp["parents"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_gdn, "FUSED_ROOT", root)
        got = {name: wy_form_output(x, plan, design) for name, plan in (
            ("device", device_checks.DevicePlan(parents.int())), ("host", checks.TreePlan(parents)))}
    assert torch.equal(got["device"], got["host"]), design


# the blocked form at 97 nodes: about 10 s of one core in the interpreter, in make test-slow
@pytest.mark.parametrize("design", ["chunked", pytest.param("blocked", marks=pytest.mark.slow)])
def test_a_device_plans_rounds_take_the_deepest_block_of_a_tree(design):
    """Past 32 nodes a tree's depth comes in a block of 32 each (four at 97 nodes). Here the deepest is the third:
    31 nodes under the root, a chain of 49 from node 1, then 16 more under the root (blocks' depths 1, 33, 50, 1).
    Each sequence's rounds from its deepest block give the host plan's bits; read from its first or its last block
    alone (planted), other bits."""
    from ddsim.gpu_backend import triton_tables
    from ddsim.properties.kernel_checks import on_device
    T = 97
    tree = [-1] + [0] * 31 + [1] + list(range(32, 80)) + [0] * 16
    gen = torch.Generator().manual_seed(97)
    B, H, HV, K, V = 2, 1, 2, 4, 3
    inp = dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
               v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen) * 0.05,
               beta=torch.rand(B, T, HV, generator=gen) * 0.5, initial_state=torch.randn(B, HV, K, V, generator=gen))
    x = {n: on_device(t) for n, t in inp.items()}
    parents = on_device(torch.tensor([tree, [-1] + [0] * (T - 1)]))
    plans = {"device": device_checks.DevicePlan(parents.int()), "host": checks.TreePlan(parents)}
    assert triton_tables.blocks(T) == 4 and plans["device"].depths.tolist() == [[1, 33, 50, 1], [1, 1, 1, 1]]
    for name, block in (("first", 0), ("last", 3)):  # every block read as that one
        plans[name] = device_checks.DevicePlan(parents.int())
        plans[name].depths = plans[name].depths[:, block:block + 1].expand(B, 4).contiguous()
    got = {name: wy_form_output(x, plan, design) for name, plan in plans.items()}
    assert torch.equal(got["device"], got["host"]) and torch.isfinite(got["host"]).all()
    for name in ("first", "last"):
        assert not torch.equal(got[name][0], got["host"][0]) and torch.equal(got[name][1], got["host"][1]), name
