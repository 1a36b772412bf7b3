"""ddsim's exact kernel behind SGLang's calling convention (ddsim.gpu_backend.engine_api), in Triton's
interpreter: `check-kernel --convention sglang` holds every property (drop-in with SGLang's
intermediate-state buffer, and flattened), the snapshot-free path equals the oracle, commit_accepted
writes the oracle's state after the accepted path into the sequence's slot and nothing else."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ddsim import oracle
from ddsim.gpu_backend import engine_api
from tests.cli_runs import run_cli

IMPL = "ddsim.gpu_backend.engine_api:target_verify"


@pytest.mark.slow
@pytest.mark.parametrize("mode, held", [("exact", 9), ("leaky", 8)])
def test_check_kernel_holds_in_sglangs_convention(tmp_path, mode, held):
    """The drop-in holds every property in SGLang's convention; in exact mode that includes every node's state it
    writes into intermediate_states_buffer (at the rows and pitch it is given), which SGLang's commit copies from. On a
    GPU its replayed example is captured in a CUDA graph (check-kernel's default there), as a server captures its
    verify: the drop-in checks its inputs on the device there (device_checks)."""
    r = run_cli("check-kernel", "--impl", IMPL, "--convention", "sglang", "--mode", mode, "--max-examples", "3",
                "--out", tmp_path / "ce.json")
    assert r.returncode == 0, r.stdout + r.stderr
    profile = "serving" if torch.cuda.is_available() else "quick"  # check_kernel.default_profile on its device
    assert f"all {held} properties hold ({profile} profile" in r.stdout, r.stdout
    import json  # padded batches among the examples (SGLang's convention pads a CUDA-graph batch with slot -1)
    report = json.loads((tmp_path / "ce.json").read_text())
    assert report["coverage"]["padded rows"] == ([0, 2] if profile == "quick" else [0, 1, 3])
    assert report["kernel"]["launch"] == ("graph" if torch.cuda.is_available() else "eager")


def _inputs(seed=0, B=2, T=6, H=1, HV=2, K=4, V=3, N=5):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 0, 3, 3]])[:B, :T]
    pool = r(N, HV, V, K)  # SGLang's layout
    slots = torch.tensor([3, 1], dtype=torch.int32)[:B]
    return dict(A_log=r(HV) * 0.3, a=r(B, T, HV), dt_bias=r(HV) * 0.3, q=r(B, T, H, K), k=r(B, T, H, K),
                v=r(B, T, HV, V), b=r(B, T, HV)), parents, pool, slots


def test_the_table_sglangs_tree_conv_fills_is_read_as_its_parents():
    """SGLang's tree conv fills retrieve_parent_token for its verifies and leaves each root's entry 0: the drop-in takes
    that table (raw or planned) as the tree's parents, bit for bit the result with -1 there, and leaves it as given."""
    x, parents, pool, slots = _inputs()
    table = parents.int().clone()
    table[:, 0] = 0
    given = table.clone()
    args = (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots)
    want = engine_api.target_verify(*args, retrieve_parent_token=parents.int())
    assert torch.equal(engine_api.target_verify(*args, retrieve_parent_token=table), want)
    assert torch.equal(engine_api.target_verify(*args, retrieve_parent_token=engine_api.plan_tree(table)), want)
    assert torch.equal(table, given)
    acc = torch.tensor([3, 4], dtype=torch.int32)
    outs = []
    for t in (parents.int(), table):
        p = pool.clone()
        engine_api.commit_accepted(x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"], p, slots,
                                   retrieve_parent_token=t, accepted=acc)
        outs.append(p)
    assert torch.equal(outs[0], outs[1])


def _oracle_gates(x):
    gate = -torch.exp(x["A_log"].double()) * F.softplus(x["a"].double() + x["dt_bias"].double())
    return gate, torch.sigmoid(x["b"].double())


def test_snapshot_free_verify_and_commit_equal_the_oracle():
    x, parents, pool, slots = _inputs()
    before = pool.clone()
    o = engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool,
                                 slots, retrieve_parent_token=parents.int())
    assert torch.equal(pool, before)  # verify reads the pool only
    gate, beta = _oracle_gates(x)
    s0 = before[slots.long()].transpose(-1, -2).double()
    ref = oracle.gdn_tree_verify(x["q"].double(), x["k"].double(), x["v"].double(), gate, beta, parents=parents,
                                 initial_state=s0, mode="exact")
    torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
    # packed as SGLang packs a batch of trees: [1, B*T, ...] with cu_seqlens
    B, T = parents.shape
    packed = engine_api.target_verify(x["A_log"], x["a"].reshape(1, B * T, -1), x["dt_bias"], 1.0, 20.0,
                                      *(x[n].reshape(1, B * T, *x[n].shape[2:]) for n in ("q", "k", "v", "b")), pool,
                                      slots, retrieve_parent_token=parents.int(),
                                      cu_seqlens=torch.arange(0, B * T + 1, T))
    torch.testing.assert_close(packed.reshape(B, T, *packed.shape[2:]), o)
    # offsets not 0, T, .., B*T of q's tokens (shifted, past q's end, as floats) are refused, as a captured call's
    # device check flags them: before, shifted ones read the tokens from 0 as if they were the offsets' tokens
    for cu in (torch.arange(0, B * T + 1, T) + 2, torch.arange(0, B * T + T + 1, T), torch.arange(0, B * T + 1, T) * 1.0):
        with pytest.raises(ValueError, match="cu_seqlens: expected .* integer offsets"):
            engine_api.target_verify(x["A_log"], x["a"].reshape(1, B * T, -1), x["dt_bias"], 1.0, 20.0,
                                     *(x[n].reshape(1, B * T, *x[n].shape[2:]) for n in ("q", "k", "v", "b")), pool,
                                     slots, retrieve_parent_token=parents.int(), cu_seqlens=cu)
    accepted = torch.tensor([4, 5])
    engine_api.commit_accepted(x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"], pool, slots,
                               retrieve_parent_token=parents.int(), accepted=accepted)
    want = oracle.gdn_tree_commit(x["k"].double(), x["v"].double(), gate, beta, parents=parents, accepted=accepted,
                                  initial_state=s0)
    torch.testing.assert_close(pool[slots.long()].transpose(-1, -2).double(), want, rtol=1e-5, atol=1e-5)
    others = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    assert torch.equal(pool[others], before[others])  # no other slot touched


def test_drop_in_fills_sglangs_intermediate_buffer_with_each_nodes_state():
    x, parents, pool, slots = _inputs(seed=1)
    B, T = parents.shape
    buf = torch.full((4, T, 2, 3, 4), float("nan"))  # [rows, T, HV, V, K]
    rows = torch.tensor([2, 0], dtype=torch.int32)
    engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots,
                             retrieve_parent_token=parents.int(), intermediate_states_buffer=buf,
                             intermediate_state_indices=rows, cache_steps=T)
    gate, beta = _oracle_gates(x)
    s0 = pool[slots.long()].transpose(-1, -2).double()
    for bi in range(B):
        for t in range(T):
            want = oracle.gdn_tree_commit(x["k"][bi:bi + 1].double(), x["v"][bi:bi + 1].double(), gate[bi:bi + 1],
                                          beta[bi:bi + 1], parents=parents[bi:bi + 1], accepted=torch.tensor([t]),
                                          initial_state=s0[bi:bi + 1])[0]
            torch.testing.assert_close(buf[rows[bi], t].transpose(-1, -2).double(), want, rtol=1e-5, atol=1e-5)
    assert torch.isnan(buf[[1, 3]]).all()  # rows of no sequence stay as they were


def test_the_flattened_verify_builds_its_chain_plan_once_and_fills_the_buffer_as_the_oracle(monkeypatch):
    """Without retrieve_parent_token (the hybrid-unsafe flattened path): the outputs and every node's state in
    SGLang's buffer are the oracle's leaky ones, rows of no sequence staying as they were, with raw slots and rows
    (on the Triton backend the chains' tables written by the step's launch, nothing cached) and with planned ones
    (the chain's TreePlan built once per (B, T, device) and reused: no tree validated per call)."""
    monkeypatch.setattr(engine_api, "_CHAINS", {})
    x, parents, pool, slots = _inputs(seed=2)
    B, T = parents.shape
    gate, beta = _oracle_gates(x)
    s0 = pool[slots.long()].transpose(-1, -2).double()
    ref_o, ref = oracle.gdn_tree_verify(x["q"].double(), x["k"].double(), x["v"].double(), gate, beta,
                                        parents=parents, initial_state=s0, mode="leaky", output_states=True)
    buf = torch.full((3, T, 2, 3, 4), float("nan"))
    for s_, r_ in ((slots, torch.tensor([2, 0])), (engine_api.plan_slots(pool, slots), engine_api.plan_slots(buf, [2, 0])),
                   (engine_api.plan_slots(pool, slots), engine_api.plan_slots(buf, [2, 0]))):
        buf.fill_(float("nan"))
        o = engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool,
                                     s_, intermediate_states_buffer=buf, intermediate_state_indices=r_, cache_steps=T)
        torch.testing.assert_close(o.double(), ref_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(buf[[2, 0]].transpose(-1, -2).double(), ref, rtol=1e-5, atol=1e-5)
        assert torch.isnan(buf[1]).all()
        if s_ is slots and engine_api._backend(x["q"]) == "triton":
            assert not engine_api._CHAINS
    (key, plan), = engine_api._CHAINS.items()
    assert key == (B, T, "cpu") and engine_api.chain_plan(B, T, "cpu") is plan
    assert plan.parents.tolist() == [list(range(-1, T - 1))] * B
    monkeypatch.setattr(engine_api, "MAX_CHAINS", 1)
    assert engine_api.chain_plan(B, T + 1, "cpu") is not plan and len(engine_api._CHAINS) == 1  # the cache starts over


def test_drop_in_fills_a_bf16_buffer_through_a_copy_of_the_states():
    """A buffer of another dtype than the states' (the kernel reads parents back from the buffer only in fp32): the
    states are made apart and copied in, rounded to the buffer's dtype; rows of no sequence untouched."""
    x, parents, pool, slots = _inputs(seed=2)
    B, T = parents.shape
    buf = torch.full((3, T + 1, 2, 3, 4), float("nan"), dtype=torch.bfloat16)
    rows = torch.tensor([2, 0], dtype=torch.int32)
    engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots,
                             retrieve_parent_token=parents.int(), intermediate_states_buffer=buf,
                             intermediate_state_indices=rows)
    gate, beta = _oracle_gates(x)
    s0 = pool[slots.long()].transpose(-1, -2).double()
    _, want = oracle.gdn_tree_verify(x["q"].double(), x["k"].double(), x["v"].double(), gate, beta, parents=parents,
                                     initial_state=s0, mode="exact", output_states=True)
    got = buf[rows.long(), :T].transpose(-1, -2).double()
    torch.testing.assert_close(got, want.to(torch.bfloat16).double(), rtol=0, atol=0.02)
    assert torch.isnan(buf[1]).all() and torch.isnan(buf[:, T]).all()


def _states_out_case(seed=4, B=2, T=5, H=1, HV=2, K=3, V=4):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), g=-torch.rand(B, T, HV, generator=g) * 0.3,
                beta=torch.rand(B, T, HV, generator=g)), torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 1, 0]])[:B, :T], \
        r(B, HV, K, V)


@pytest.mark.parametrize("vk", [False, True])
def test_node_states_go_into_a_callers_buffer_at_its_rows_and_nowhere_else(vk):
    """gdn_tree_verify(states_out=, states_rows=) on the torch path: each sequence's node states at its row's first
    T nodes, equal to output_states'; every other row and node bit-identical; in [N, TS, HV, K, V] or as the
    transpose of SGLang's [N, TS, HV, V, K]."""
    import ddsim.gpu_backend as gb
    args, parents, s0 = _states_out_case()
    B, T = parents.shape
    base = torch.randn(4, T + 2, 2, 4, 3) if vk else torch.randn(4, T + 2, 2, 3, 4)
    before = base.clone()
    buf = base.transpose(-1, -2) if vk else base
    rows = torch.tensor([3, 1])
    o, out = gb.gdn_tree_verify(**args, parents=parents, initial_state=s0, states_out=buf, states_rows=rows,
                                backend="torch")
    want_o, want = gb.gdn_tree_verify(**args, parents=parents, initial_state=s0, output_states=True, backend="torch")
    assert out is buf and torch.equal(o, want_o)
    assert torch.equal(buf[rows, :T], want)
    untouched = torch.ones(4, T + 2, dtype=torch.bool)
    untouched[rows, :T] = False
    assert torch.equal(base[untouched], before[untouched])


@pytest.mark.parametrize("backend", ["torch", "triton-recurrent"])
@pytest.mark.parametrize("change, needle", [
    (dict(states_out=torch.zeros(2, 5, 2, 3, 4, dtype=torch.float64)), "states_out: expected float32"),
    (dict(states_out=torch.zeros(2, 4, 2, 3, 4)), "states_out: expected [N, TS >= 5, 2, 3, 4], got (2, 4, 2, 3, 4)"),
    (dict(states_out=torch.zeros(2, 5, 3, 2, 4).transpose(2, 3)), "states_out: expected a contiguous"),
    (dict(states_out=torch.zeros(1, 5, 2, 3, 4)), "states_out: 1 rows for 2 sequences (sequence b at row b)"),
    (dict(states_out=torch.zeros(3, 5, 2, 3, 4), states_rows=[1, 1]), "states_rows: rows must be distinct"),
    (dict(states_out=torch.zeros(3, 5, 2, 3, 4), states_rows=[0, 3]), "states_rows: rows must lie in 0..2"),
    (dict(states_rows=[0, 1]), "states_rows: given without states_out"),
])
def test_a_node_state_buffer_it_cannot_write_is_refused_before_anything_is_written(backend, change, needle):
    """One ValueError naming the argument and the problem, from either backend's checks; the buffer unchanged.
    The Triton backend's inputs on the GPU where there is one (interpreted on the CPU otherwise)."""
    import ddsim.gpu_backend as gb
    dev = "cuda" if backend != "torch" and torch.cuda.is_available() else "cpu"
    args, parents, s0 = _states_out_case()
    args, parents, s0 = {n: x.to(dev) for n, x in args.items()}, parents.to(dev), s0.to(dev)
    change = {n: x.to(dev) if isinstance(x, torch.Tensor) else x for n, x in change.items()}
    buf = change.get("states_out")
    before = None if buf is None else buf.clone()
    with pytest.raises(ValueError) as e:
        gb.gdn_tree_verify(**args, parents=parents, initial_state=s0, backend=backend, **change)
    assert str(e.value).startswith(needle), str(e.value)
    assert buf is None or torch.equal(buf, before)


def test_the_drop_ins_buffer_rows_planned_once_none_or_raw_fill_the_same_rows(monkeypatch):
    """intermediate_state_indices planned once per step (engine_api.plan_slots on the buffer) fill the buffer as the
    raw indices do, with no validation in the call (none may run under CUDA-graph capture); without indices
    sequence b takes row b of a buffer of more rows; planned rows of another buffer are refused."""
    from ddsim.gpu_backend import checks
    x, parents, pool, slots = _inputs(seed=4)
    B, T = parents.shape
    args = (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots)
    raw = torch.full((4, T, 2, 3, 4), float("nan"))
    engine_api.target_verify(*args, retrieve_parent_token=parents.int(), intermediate_states_buffer=raw,
                             intermediate_state_indices=torch.tensor([2, 0]))
    planned = torch.full_like(raw, float("nan"))
    rows, pool_rows = engine_api.plan_slots(planned, torch.tensor([2, 0])), engine_api.plan_slots(pool, slots)

    def no_validation(*a, **kw):
        raise AssertionError("validated again in the call")
    monkeypatch.setattr(checks, "checked_slots", no_validation)
    engine_api.target_verify(*args[:-1], pool_rows, retrieve_parent_token=parents.int(),
                             intermediate_states_buffer=planned, intermediate_state_indices=rows)
    monkeypatch.undo()
    assert torch.equal(planned.nan_to_num(7.0), raw.nan_to_num(7.0))
    none = torch.full_like(raw, float("nan"))
    engine_api.target_verify(*args, retrieve_parent_token=parents.int(), intermediate_states_buffer=none)
    assert torch.equal(none[[0, 1]], raw[[2, 0]]) and torch.isnan(none[[2, 3]]).all()
    with pytest.raises(ValueError, match="^intermediate_state_indices: checked rows \\(2,\\) of a 4-row buffer"):
        engine_api.target_verify(*args, retrieve_parent_token=parents.int(),
                                 intermediate_states_buffer=torch.zeros(3, T, 2, 3, 4), intermediate_state_indices=rows)


def test_the_drop_in_names_the_buffer_and_its_indices_as_sglang_does_when_it_refuses_them():
    """A buffer too short for the tree, or repeated indices: one ValueError naming SGLang's argument; nothing
    written."""
    x, parents, pool, slots = _inputs(seed=3)
    B, T = parents.shape
    args = (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots)
    short = torch.full((2, T - 1, 2, 3, 4), float("nan"))
    with pytest.raises(ValueError, match=r"^intermediate_states_buffer \(transposed\): expected \[N, TS >= 6"):
        engine_api.target_verify(*args, retrieve_parent_token=parents.int(), intermediate_states_buffer=short)
    buf = torch.full((3, T, 2, 3, 4), float("nan"))
    with pytest.raises(ValueError, match="^intermediate_state_indices: rows must be distinct"):
        engine_api.target_verify(*args, retrieve_parent_token=parents.int(), intermediate_states_buffer=buf,
                                 intermediate_state_indices=torch.tensor([1, 1]))
    # a buffer of another dtype (the states made apart, then copied in): its rows and shape checked before the verify
    # too, named as SGLang names them
    buf16 = torch.full((3, T, 2, 3, 4), float("nan"), dtype=torch.bfloat16)
    for rows, want in ((torch.tensor([1, 1]), "^intermediate_state_indices: rows must be distinct"),
                       (torch.tensor([0, 5]), r"^intermediate_state_indices: rows must lie in 0\.\.2"),
                       (None, r"^intermediate_states_buffer: 1 rows for 2 sequences")):
        with pytest.raises(ValueError, match=want):
            engine_api.target_verify(*args, retrieve_parent_token=parents.int(), intermediate_state_indices=rows,
                                     intermediate_states_buffer=buf16 if rows is not None else buf16[:1])
    assert torch.isnan(buf16).all()
    short16 = torch.full((2, T - 1, 2, 3, 4), float("nan"), dtype=torch.bfloat16)
    wide16 = torch.full((2, T, 2, 4, 3), float("nan"), dtype=torch.bfloat16)  # V and K swapped
    for bad in (short16, wide16):
        with pytest.raises(ValueError, match=r"^intermediate_states_buffer \(transposed\): expected \[N, TS >= 6, "
                                             r"2, 4, 3\]"):
            engine_api.target_verify(*args, retrieve_parent_token=parents.int(), intermediate_states_buffer=bad)
    # a buffer on another device, in either path: refused before the verify, not by torch after it
    for dtype in (torch.float32, torch.bfloat16):
        elsewhere = torch.empty(2, T, 2, 3, 4, dtype=dtype, device="meta")
        with pytest.raises(ValueError, match=r"^intermediate_states_buffer \(transposed\): on meta, the inputs on cpu"):
            engine_api.target_verify(*args, retrieve_parent_token=parents.int(), intermediate_states_buffer=elsewhere)
    assert torch.isnan(short).all() and torch.isnan(buf).all()
    assert torch.isnan(short16).all() and torch.isnan(wide16).all()


@pytest.mark.parametrize("kw, needle", [
    (dict(disable_state_update=False), "never writes the pool"),
    (dict(softplus_beta=2.0), "softplus_beta"),
])
def test_refusals(kw, needle):
    x, parents, pool, slots = _inputs()
    args = dict(softplus_beta=1.0, softplus_threshold=20.0)
    args.update({k: v for k, v in kw.items() if k.startswith("softplus")})
    with pytest.raises(ValueError, match=needle):
        engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], args["softplus_beta"], args["softplus_threshold"],
                                 x["q"], x["k"], x["v"], x["b"], pool, slots, retrieve_parent_token=parents.int(),
                                 **{k: v for k, v in kw.items() if not k.startswith("softplus")})


def test_a_plan_built_once_per_step_gives_the_same_outputs():
    x, parents, pool, slots = _inputs(seed=2)
    args = (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots)
    plan = engine_api.plan_tree(parents.int())
    assert torch.equal(engine_api.target_verify(*args, retrieve_parent_token=plan),
                       engine_api.target_verify(*args, retrieve_parent_token=parents.int()))


def test_slots_and_accepted_planned_once_per_step_give_the_same_state():
    """plan_slots / plan_accepted validate once (host values: no sync) and every layer's call then
    checks only the pool size, shape and device; the outputs and the committed pool are the same
    bits as with raw tensors, and bad plans are refused before any work."""
    x, parents, pool, slots = _inputs(seed=3)
    tree = engine_api.plan_tree(parents.int())
    ps, pa = engine_api.plan_slots(pool, slots), engine_api.plan_accepted(tree, torch.tensor([4, 5]))
    args = (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool)
    assert torch.equal(engine_api.target_verify(*args, ps, retrieve_parent_token=tree),
                       engine_api.target_verify(*args, slots, retrieve_parent_token=parents.int()))
    raw, planned = pool.clone(), pool.clone()
    cargs = (x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"])
    engine_api.commit_accepted(*cargs, raw, slots, retrieve_parent_token=parents.int(), accepted=torch.tensor([4, 5]))
    engine_api.commit_accepted(*cargs, planned, engine_api.plan_slots(planned, slots), retrieve_parent_token=tree,
                               accepted=pa)
    assert torch.equal(planned, raw)
    for bad, needle in (([3, 3], "distinct"), ([3, 5], "0..4"), (torch.zeros(2, 1, dtype=torch.int32), "integers")):
        with pytest.raises(ValueError, match=needle):
            engine_api.plan_slots(pool, torch.as_tensor(bad, dtype=torch.int32))
    for bad in (parents.float() + 0.5, parents.bool(), parents.tolist()):  # a float tree was truncated to another
        with pytest.raises(ValueError, match="retrieve_parent_token: expected int32 or int64"):
            engine_api.plan_tree(bad if isinstance(bad, torch.Tensor) else torch.tensor(bad, dtype=torch.float64))
    for bad in ([1.0, 2.0], [True, 2], np.array([1.5, 2.0])):  # host values: a float or bool slot is not a slot
        with pytest.raises(ValueError, match="integers"):
            engine_api.plan_slots(pool, bad)
    assert engine_api.plan_slots(pool, np.array([1, 2])).indices.tolist() == [1, 2]
    with pytest.raises(ValueError, match="5-row pool"):  # planned for another pool size
        engine_api.target_verify(*args[:-1], torch.zeros(7, *pool.shape[1:]), ps, retrieve_parent_token=tree)
    with pytest.raises(ValueError, match="checked slots"):  # planned for another batch
        engine_api.target_verify(*args, engine_api.plan_slots(pool, [3]), retrieve_parent_token=tree)
    with pytest.raises(ValueError, match="accepted"):
        engine_api.plan_accepted(tree, [4, 6])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_float_tree_is_refused_by_either_backend_not_truncated(monkeypatch, backend):
    """retrieve_parent_token as floats is refused in one line before any work, raw or planned, on either backend: the
    torch backend's rooting had truncated it to an integer tree (0.5 -> 0), another tree than the one given."""
    monkeypatch.setattr(engine_api, "_backend", lambda x: backend)
    x, parents, pool, slots = _inputs()
    before = pool.clone()
    args = (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots)
    for tree in (parents.float(), parents.float() + 0.5):
        with pytest.raises(ValueError, match="retrieve_parent_token: expected int32 or int64"):
            engine_api.target_verify(*args, retrieve_parent_token=tree)
        with pytest.raises(ValueError, match="retrieve_parent_token: expected int32 or int64"):
            engine_api.commit_accepted(x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"], pool, slots,
                                       retrieve_parent_token=tree, accepted=torch.tensor([4, 5]))
    assert torch.equal(pool, before)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("arg, bad, needle", [
    pytest.param("A_log", lambda t: t[:1], r"^A_log: expected \[HV\] = \(2,\), got \(1,\)$", id="A_log-one-head"),
    pytest.param("dt_bias", lambda t: t[:1], r"^dt_bias: expected \[HV\] = \(2,\), got \(1,\)$", id="dt_bias-one-head"),
    pytest.param("a", lambda t: t[..., :1], r"^a: expected \[B, T, HV\] = \(2, 6, 2\), got \(2, 6, 1\)$", id="a-one-head"),
    pytest.param("b", lambda t: t[..., :1], r"^b: expected \[B, T, HV\] = \(2, 6, 2\), got \(2, 6, 1\)$", id="b-one-head"),
    pytest.param("A_log", lambda t: t.round().long(), r"^A_log: expected a floating dtype, got torch.int64$", id="A_log-int"),
    pytest.param("a", lambda t: t.round().int(), r"^a: expected a floating dtype, got torch.int32$", id="a-int"),
    pytest.param("dt_bias", lambda t: t.numpy(), r"^dt_bias: expected a torch.Tensor, got ndarray$", id="dt_bias-numpy"),
    pytest.param("dt_bias", lambda t: t.round().int(), r"^dt_bias: expected a floating dtype, got torch.int32$",
                 id="dt_bias-int"),
    pytest.param("b", lambda t: t.bool(), r"^b: expected a floating dtype, got torch.bool$", id="b-bool"),
    pytest.param("q", lambda t: t[:, :, 0], r"^q: expected \[B, T, H, K\] \(or \[1, B\*T, H, K\] with cu_seqlens\), "
                 r"got \(2, 6, 4\)$", id="q-rank-3"),
    pytest.param("k", lambda t: t.tolist(), r"^k: expected a torch.Tensor, got list$", id="k-list"),
    pytest.param("pool", lambda t: t.round().long(),
                 r"^initial_state_source: expected a floating-point pool, got torch.int64$", id="pool-int"),
    pytest.param("pool", lambda t: t.transpose(-1, -2), r"^initial_state_source: expected \[N, HV, V, K\] with HV, V, K "
                 r"= \(2, 3, 4\), got \(5, 2, 4, 3\)$", id="pool-transposed"),
    pytest.param("pool", lambda t: t.flatten(), r"^initial_state_source: expected \[N, HV, V, K\], got \(120,\)$", id="pool-flat"),
    pytest.param("slots", lambda t: t[:1], r"^initial_state_indices: expected \[B\] = \[2\] slots, got \(1,\)$", id="slots-short"),
    pytest.param("parents", lambda t: t[:, :1], r"^retrieve_parent_token: expected \[B, T\] = \[2, 6\], got \(2, 1\)$", id="tree-short"),
])
def test_inputs_that_broadcast_truncate_or_crash_are_refused_by_name_before_any_work(monkeypatch, backend, arg, bad,
                                                                                    needle):
    """The torch backend made the gates from a, b, A_log and dt_bias as torch broadcasts: an A_log or dt_bias of [1],
    or a and b of [B, T, 1], gave every value head one head's gate, and the verify and the commit ran on those numbers.
    Integer gates and an integer pool were taken as values (the pool's commit written back truncated to integers); a
    numpy array or a list failed deep inside as an AttributeError, a transposed pool or a short tree as torch's
    reshape error. Each is refused in one line naming SGLang's argument, on either backend, before any launch (the
    Triton backend is taken here on CPU tensors, where any launch would fail) and with the pool untouched."""
    monkeypatch.setattr(engine_api, "_backend", lambda x: backend)
    x, parents, pool, slots = _inputs()
    given = dict(x, pool=pool, slots=slots, parents=parents.int())
    given[arg] = bad(given[arg])
    before = pool.clone()
    g = given
    with pytest.raises(ValueError, match=needle):
        engine_api.target_verify(g["A_log"], g["a"], g["dt_bias"], 1.0, 20.0, g["q"], g["k"], g["v"], g["b"],
                                 g["pool"], g["slots"], retrieve_parent_token=g["parents"])
    if arg != "q":  # (the commit takes no q)
        with pytest.raises(ValueError, match=needle):
            engine_api.commit_accepted(g["A_log"], g["a"], g["dt_bias"], g["k"], g["v"], g["b"], g["pool"],
                                       g["slots"], retrieve_parent_token=g["parents"], accepted=torch.tensor([4, 5]))
    assert torch.equal(pool, before)


@pytest.mark.parametrize("buf, needle", [
    (np.zeros((4, 6, 2, 3, 4), dtype=np.float32), r"^intermediate_states_buffer: expected a torch.Tensor, got ndarray$"),
    (torch.zeros(4, 6, 2, 3, 4, dtype=torch.int32),
     r"^intermediate_states_buffer: expected a floating-point pool, got torch.int32$"),
])
def test_a_node_state_buffer_that_is_no_float_tensor_is_refused_before_any_work(buf, needle):
    x, parents, pool, slots = _inputs()
    with pytest.raises(ValueError, match=needle):
        engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, slots,
                                 retrieve_parent_token=parents.int(), intermediate_states_buffer=buf,
                                 intermediate_state_indices=torch.tensor([0, 1], dtype=torch.int32))


def test_packed_inputs_of_another_token_count_are_refused_by_name():
    """With cu_seqlens every input is [1, B*T, ...]: one of another token count was reshaped by torch (a RuntimeError
    naming no argument), now refused in one line naming it."""
    x, parents, pool, slots = _inputs()
    packed = {n: t.reshape(1, 12, *t.shape[2:]) for n, t in x.items() if n not in ("A_log", "dt_bias")}
    cu = torch.tensor([0, 6, 12], dtype=torch.int32)
    args = lambda p: (x["A_log"], p["a"], x["dt_bias"], 1.0, 20.0, p["q"], p["k"], p["v"], p["b"], pool, slots)  # noqa: E731
    want = engine_api.target_verify(*args(packed), retrieve_parent_token=parents.int(), cu_seqlens=cu)
    assert torch.equal(want.reshape(2, 6, *want.shape[2:]),
                       engine_api.target_verify(*args(x), retrieve_parent_token=parents.int()))
    for name in ("k", "v", "a", "b"):
        short = dict(packed, **{name: packed[name][:, :11]})
        with pytest.raises(ValueError, match=rf"^{name}: expected \[1, B\*T = 12, \.\.\.\] with cu_seqlens, got "
                                             rf"\(1, 11, "):
            engine_api.target_verify(*args(short), retrieve_parent_token=parents.int(), cu_seqlens=cu)


def test_an_fp32_pool_is_used_in_place_and_a_bf16_pool_through_a_copy_of_its_rows(monkeypatch):
    """SGLang's fp32 pool is read and committed through a transposed view (no copy, other slots
    untouched); a bf16 pool (--mamba-ssm-dtype bfloat16) gives the results of an fp32 pool holding the
    same values, its committed rows rounded to bf16."""
    x, parents, pool, slots = _inputs(seed=4)
    copied = []
    for name in ("index_select", "index_copy_"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _r=real, _n=name, **k: (copied.append((_n, self.dtype)),
                                                                                     _r(self, *a, **k))[1])
    pool16 = pool.to(torch.bfloat16)
    pool32 = pool16.float()  # the same values in fp32
    args = lambda p: (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], p, slots)  # noqa: E731
    o32 = engine_api.target_verify(*args(pool32), retrieve_parent_token=parents.int())
    assert torch.equal(engine_api.target_verify(*args(pool16), retrieve_parent_token=parents.int()), o32)
    cargs = (x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"])
    before = pool32.clone()
    for p in (pool32, pool16):
        engine_api.commit_accepted(*cargs, p, slots, retrieve_parent_token=parents.int(), accepted=torch.tensor([3, 2]))
    assert torch.equal(pool16, pool32.to(torch.bfloat16))
    others = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    assert torch.equal(pool32[others], before[others]) and not torch.equal(pool32, before)
    assert {c for c in copied if c[1] == torch.float32} == set()  # the fp32 pool: no row gathered or scattered
    assert ("index_select", torch.bfloat16) in copied and ("index_copy_", torch.bfloat16) in copied


def test_trees_past_one_block_verify_and_commit_equal_the_oracle():
    """Budget 128 (129 nodes and past): the engine entry point goes through the WY form over 64-row
    chunks, folded for a batch, and stays exact without per-node states; the commit likewise."""
    from ddsim.bench.bench import ddtree_batch
    trees, parents = ddtree_batch(2, 131, vocab=60, depth=12, topk=4, seed=5)
    B, T = parents.shape
    x, _, pool, slots = _inputs(seed=2, B=B, T=T)  # its own parents are for T <= 6: the DDTree trees' instead
    before = pool.clone()
    o = engine_api.target_verify(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool,
                                 slots, retrieve_parent_token=parents.int())
    assert torch.equal(pool, before)
    gate, beta = _oracle_gates(x)
    s0 = before[slots.long()].transpose(-1, -2).double()
    ref = oracle.gdn_tree_verify(x["q"].double(), x["k"].double(), x["v"].double(), gate, beta, parents=parents,
                                 initial_state=s0, mode="exact")
    torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
    accepted = torch.tensor([int(t.depths.argmax()) for t in trees])  # the deepest path
    engine_api.commit_accepted(x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"], pool, slots,
                               retrieve_parent_token=parents.int(), accepted=accepted)
    want = oracle.gdn_tree_commit(x["k"].double(), x["v"].double(), gate, beta, parents=parents, accepted=accepted,
                                  initial_state=s0)
    torch.testing.assert_close(pool[slots.long()].transpose(-1, -2).double(), want, rtol=1e-5, atol=1e-5)


def _guarded(pool):
    """pool inside storage with a slot of sentinel bits on each side (a write to slot -1 by address lands there)."""
    backing = torch.full((pool.shape[0] + 2, *pool.shape[1:]), 1234.5, dtype=pool.dtype)
    backing[1:-1] = pool
    return backing, backing[1:-1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, planned, backend", [
    *(pytest.param(T, planned, "triton", marks=pytest.mark.interpreter) for T, planned in ((6, False), (6, True), (70, True))),
    (6, False, "torch"), (6, True, "torch")])
def test_a_padded_batch_verifies_and_commits_its_sequences_and_no_slot_for_its_padding(dtype, T, planned, backend,
                                                                                       monkeypatch):
    """SGLang pads a CUDA-graph batch with slot -1 (PAD_SLOT_ID). Its real rows verify and commit as they would
    alone; a padded row verifies from a zero state (as SGLang's kernel does), and no slot is read or written for it:
    not slot N-1 (Python's -1, here another sequence's), not the slot's worth before the pool. Triton's kernels
    (the WY form, and past 65 nodes its form over chunks) in the interpreter, and the torch path; the fp32 pool in
    place, bf16 through a copy of its rows."""
    from ddsim.bench.bench import ddtree_batch
    monkeypatch.setattr(engine_api, "_backend", lambda x: backend)
    _, parents = ddtree_batch(3, T - 1, vocab=60, depth=8, topk=4, seed=7)
    B, T = parents.shape
    x, _, pool, _ = _inputs(seed=6, B=B, T=T, N=6)
    backing, pool = _guarded(pool.to(dtype))
    slots = torch.tensor([5, 2, -1], dtype=torch.int32)  # the last row padded; slot 5 = N-1 is a real sequence's
    idx = engine_api.plan_slots(pool, slots) if planned else slots
    tree = engine_api.plan_tree(parents.int()) if planned else parents.int()
    before = backing.clone()
    args = (x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"], pool, idx)
    o = engine_api.target_verify(*args, retrieve_parent_token=tree)
    assert torch.equal(backing, before)  # the verify reads the pool only
    gate, beta = _oracle_gates(x)
    s0 = before[1:-1][slots.clamp(min=0).long()].transpose(-1, -2).double()
    s0[2] = 0.0  # the padded row: a zero state
    ref = oracle.gdn_tree_verify(x["q"].double(), x["k"].double(), x["v"].double(), gate, beta, parents=parents,
                                 initial_state=s0, mode="exact")
    torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
    accepted = torch.tensor([T - 1, 1, T - 2])
    engine_api.commit_accepted(x["A_log"], x["a"], x["dt_bias"], x["k"], x["v"], x["b"], pool, idx,
                               retrieve_parent_token=tree, accepted=engine_api.plan_accepted(tree, accepted)
                               if planned else accepted)
    want = oracle.gdn_tree_commit(x["k"].double(), x["v"].double(), gate, beta, parents=parents, accepted=accepted,
                                  initial_state=s0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(pool[[5, 2]].transpose(-1, -2).double(), want[:2], **tol)
    untouched = [0, 1, 3, 4]  # every other slot of the pool, and both guard slots
    assert torch.equal(pool[untouched], before[1:-1][untouched])
    assert torch.equal(backing[0], before[0]) and torch.equal(backing[-1], before[-1])


def test_padding_is_taken_only_where_a_kernel_handles_it():
    """Slot -1 is padding for the GDN verify and commit through engine_api (plan_slots); a raw -1 to ddsim's own
    functions, padded rows planned for another family's pool, and a padded row of the drop-in's node-state buffer
    are refused."""
    import ddsim.gpu_backend as gb
    from ddsim.gpu_backend import checks
    x, parents, pool, _ = _inputs(seed=8)
    with pytest.raises(ValueError, match=r"state_indices: slots must lie in 0..4, got \[3, -1\]"):
        gb.gdn_tree_verify(x["q"], x["k"], x["v"], a=x["a"], b=x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           parents=parents, initial_state=pool.transpose(-1, -2), state_indices=torch.tensor([3, -1]))
    with pytest.raises(ValueError, match=r"initial_state_indices: slots must lie in 0..4 \(or -1: a padded row\)"):
        engine_api.plan_slots(pool, [3, -2])
    with pytest.raises(ValueError, match="initial_state_indices: slots must be distinct"):
        engine_api.plan_slots(pool, [3, 3])
    padded = engine_api.plan_slots(pool, [-1, -1])  # two padded rows are not a repeated slot
    assert padded.padded == 2
    m2 = torch.zeros(5, 2, 3, 4)
    with pytest.raises(ValueError, match="only the GDN verify and commit take padded rows"):
        checks.resolve_window(m2, padded, 2)
    with pytest.raises(ValueError, match="intermediate_state_indices: 1 padded rows"):
        checks.node_state_rows(torch.zeros(5, 6, 2, 4, 3), engine_api.plan_slots(pool, [3, -1]), 2,
                               rows_name="intermediate_state_indices")


@pytest.mark.interpreter
# numpy's overflow in the interpreter: exp(G_i - G_j) for pairs off the ancestor mask (triton_wy_split's prologue), which
# the tl.where beside it discards (traced on the drawn leaky examples)
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("mode, held", [("exact", 9), ("leaky", 8)])
def test_check_kernel_holds_the_drop_in_on_its_device_checked_path(mode, held):
    """Every call of the drop-in made as a captured call makes it (device_checks.forced(): its inputs checked on the
    device, its tables built by the kernels a capture launches), in Triton's interpreter: check-kernel's quick profile
    holds every property, its padded rows, 16-bit pools and replayed example among them. (On a GPU the replayed
    example is captured for real: test_check_kernel_holds_in_sglangs_convention.)"""
    from ddsim.engines import check_kernel as ck
    from ddsim.engines import load
    from ddsim.gpu_backend import device_checks
    kernel = load(IMPL, convention="sglang")
    with device_checks.forced():
        res = ck.check(kernel, mode=mode, device="cpu", max_examples=2, profile="quick")
    assert [r.name for r in res if not r.holds] == [] and len(res.properties) == held
