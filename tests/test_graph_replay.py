"""check-kernel's replayed examples: a kernel launched on one step and judged on the next step's values in that step's
tensors, as a server's CUDA graph runs its verify (ddsim/engines/graphs.py, kernel_cases.replayed). On the CPU the
kept launch is called again on its kept tensors; on CUDA it is captured in a CUDA graph and replayed."""
import pytest
import torch

from ddsim.engines import check_kernel as ck
from ddsim.engines import graphs
from ddsim.engines import kernel_cases as kc


def _step(values, extra=0.0):
    """(a view of a guarded storage holding ``values``, its storage as a whole)."""
    backing = torch.full((len(values) + 2,), -1.0)
    backing[1:-1] = torch.tensor(values) + extra
    return backing[1:-1], backing


def test_a_replayed_launch_runs_on_the_first_steps_tensors_with_the_new_values_and_carries_everything_back():
    seen = []

    def kernel(x, table, *, scale):
        seen.append((x, table, x.clone(), table.clone()))
        x.as_strided((1,), (1,), x.storage_offset() - 1).fill_(7.0)  # the slot before x in its storage
        table.add_(1)  # writes its own input
        return x * scale

    replay = graphs.Replay()
    first_x, _ = _step([1.0, 2.0])
    first_t = torch.tensor([0, 0], dtype=torch.int32)
    with graphs.replaying(replay):
        replay.begin()
        assert torch.equal(graphs.launch(kernel, first_x, first_t, scale=2.0), torch.tensor([2.0, 4.0]))
        replay.replayed()
        x, backing = _step([5.0, 6.0])
        t = torch.tensor([3, 4], dtype=torch.int32)
        replay.begin()
        out = graphs.launch(kernel, x, t, scale=2.0)
    # the kernel got the first step's very tensors, holding this step's values
    assert seen[1][0] is first_x and seen[1][1] is first_t
    assert torch.equal(seen[1][2], torch.tensor([5.0, 6.0])) and torch.equal(seen[1][3], torch.tensor([3, 4], dtype=torch.int32))
    assert torch.equal(out, torch.tensor([10.0, 12.0]))
    # and what it wrote, its own input and a slot beside it in the storage, reaches this step's tensors
    assert torch.equal(t, torch.tensor([4, 5], dtype=torch.int32)) and backing[0] == 7.0 and backing[-1] == -1.0
    # outside replaying, launch is the plain call
    assert graphs.launch(lambda a: a + 1, 1) == 2


@pytest.mark.parametrize("change, says", [
    (lambda x, t: ((x[:1], t), {"scale": 2.0}), "laid out"),
    (lambda x, t: ((x, t.long()), {"scale": 2.0}), "laid out"),
    (lambda x, t: ((x.clone(), t), {"scale": 2.0}), "laid out"),  # same shape, in a storage without the guards
    (lambda x, t: ((x, t), {"scale": 3.0}), "^launch 1 of a replayed step: keyword scale is 3.0, the first step's 2.0 "
                                            r"\(a captured launch keeps it\)$"),
    (lambda x, t: ((x, t), {}), r"arguments \['argument 0', 'argument 1'\], the first step's"),
])
def test_a_replayed_step_laid_out_otherwise_than_the_kept_launch_is_refused(change, says):
    replay = graphs.Replay()

    def kernel(x, t, scale=2.0):
        return x * scale

    with graphs.replaying(replay):
        replay.begin()
        graphs.launch(kernel, _step([1.0, 2.0])[0], torch.tensor([0, 0], dtype=torch.int32), scale=2.0)
        replay.replayed()
        replay.begin()
        args, kw = change(_step([3.0, 4.0])[0], torch.tensor([1, 1], dtype=torch.int32))
        with pytest.raises(graphs.ReplayMismatch, match=says):
            graphs.launch(kernel, *args, **kw)
        replay.begin()
        with pytest.raises(graphs.ReplayMismatch, match="calls"):  # another function at the kept launch
            graphs.launch(lambda x, t, scale: x, _step([3.0, 4.0])[0], torch.tensor([1, 1], dtype=torch.int32), scale=2.0)
        replay.begin()
        graphs.launch(kernel, _step([3.0, 4.0])[0], torch.tensor([1, 1], dtype=torch.int32), scale=2.0)
        with pytest.raises(graphs.ReplayMismatch, match="the first step made 1"):  # one launch more than kept
            graphs.launch(kernel, _step([3.0, 4.0])[0], torch.tensor([1, 1], dtype=torch.int32), scale=2.0)


def test_nested_arguments_and_odd_sized_storages_are_replayed_whole():
    """Tensors inside lists, tuples and dicts are kept and refilled like the others, a 16-bit storage of an odd number
    of elements whole; a nested structure of another length, kind or keys cannot replay the launch."""
    seen = []

    def kernel(xs, opts, *, half):
        seen.append((xs[0], opts["w"], half, xs[0].clone(), opts["w"].clone(), half.clone()))
        xs[1].mul_(2)
        return xs[0] + opts["w"] * opts["s"]

    def step(v):
        return ([torch.full((2,), v), torch.full((2,), v + 1)], {"w": torch.full((2,), v + 2), "s": 3.0},
                torch.tensor([v, v + 1, v + 2], dtype=torch.bfloat16))  # 6 bytes: no whole float32
    replay = graphs.Replay()
    with graphs.replaying(replay):
        replay.begin()
        xs0, opts0, half0 = step(1.0)
        graphs.launch(kernel, xs0, opts0, half=half0)
        replay.replayed()
        replay.begin()
        xs, opts, half = step(10.0)
        out = graphs.launch(kernel, xs, opts, half=half)
        assert seen[1][0] is xs0[0] and seen[1][1] is opts0["w"] and seen[1][2] is half0
        assert torch.equal(seen[1][3], xs[0]) and torch.equal(seen[1][4], opts["w"]) and torch.equal(seen[1][5], half)
        assert torch.equal(out, torch.full((2,), 10.0 + 3 * 12.0)) and torch.equal(xs[1], torch.full((2,), 22.0))
        for bad, says in [
            (lambda: ([xs[0]], opts), r"arguments \['argument 0', 'argument 0\[0\]', 'argument 1'"),
            (lambda: (tuple(xs), opts), "argument 0 is <class 'tuple'>, the first step's <class 'list'>"),
            (lambda: (xs, {"w": opts["w"], "t": 3.0}), r"arguments \[.*\"argument 1\['t'\]\".*\], the first step's "
                                                       r"\[.*\"argument 1\['s'\]\".*\]$"),
            (lambda: (xs, {**opts, "s": torch.ones(1)}), r"argument 1\['s'\] is a Tensor, the first step's a float"),
        ]:
            replay.begin()
            with pytest.raises(graphs.ReplayMismatch, match=f"^launch 1 of a replayed step: {says}"):
                graphs.launch(kernel, *bad(), half=half)


def test_a_replayed_steps_extra_launch_or_other_function_is_named():
    import functools
    replay = graphs.Replay()
    x = torch.zeros(2)

    def kernel(t):
        return t + 1
    other = functools.partial(kernel)  # no __name__: named by its repr
    with graphs.replaying(replay):
        replay.begin()
        graphs.launch(kernel, x)
        graphs.launch(other, x)  # two launches a step, replayed in their order
        replay.replayed()
        replay.begin()
        with pytest.raises(graphs.ReplayMismatch, match="^launch 1 of a replayed step calls <lambda>, the first step's "
                                                         "called kernel$"):
            graphs.launch(lambda t: t, x)
        replay.begin()
        graphs.launch(kernel, x)
        with pytest.raises(graphs.ReplayMismatch, match="^launch 2 of a replayed step calls kernel, the first step's "
                                                         "called functools.partial"):
            graphs.launch(kernel, x)
        replay.begin()
        graphs.launch(kernel, x)
        assert torch.equal(graphs.launch(other, torch.ones(2)), torch.full((2,), 2.0))
        with pytest.raises(graphs.ReplayMismatch, match="^launch 3 of a replayed step: the first step made 2$"):
            graphs.launch(other, x)
        replay.begin()
        with pytest.raises(graphs.ReplayMismatch, match="^launch 1 of a replayed step calls functools.partial"):
            graphs.launch(other, x)


def test_arguments_sharing_storages_otherwise_than_the_kept_launchs_are_refused():
    replay = graphs.Replay()
    with graphs.replaying(replay):
        replay.begin()
        graphs.launch(torch.add, torch.zeros(2), torch.ones(2))
        replay.replayed()
        replay.begin()
        same = torch.zeros(2)
        with pytest.raises(graphs.ReplayMismatch, match="^launch 1 of a replayed step: argument 1 shares a storage "
                                                         "otherwise than the first step's did$"):
            graphs.launch(torch.add, same, same)
    replay = graphs.Replay()  # and the other way round: kept in one storage, given in two
    with graphs.replaying(replay):
        replay.begin()
        kept = torch.zeros(2)
        graphs.launch(torch.add, kept, kept)
        replay.replayed()
        replay.begin()
        with pytest.raises(graphs.ReplayMismatch, match="argument 1 shares a storage otherwise"):
            graphs.launch(torch.add, torch.zeros(2), torch.ones(2))


@pytest.mark.parametrize("op", ["gdn", "conv", "mamba2", "kda", "lightning"])
@pytest.mark.parametrize("profile", ["quick", "serving"])
def test_each_profile_replays_one_step_of_each_op_on_another_steps_launch(op, profile):
    """One replayed example per op and profile: its other step has every tensor of the same shape and dtype, a chain
    where the example's trees branch, other values and other slots, and no padded rows where the example has some
    (where the convention pads); a kernel that keeps node states gets a buffer of one size in both, rows of their own."""
    pads = op in ("gdn", "conv", "mamba2")
    cases = kc.cases(op, profile, pads=pads, nodes=op != "lightning")
    replayed = [c for c in cases if "replay" in c]
    assert len(replayed) == 1
    c = replayed[0]
    o = c["replay"]
    for k, v in c.items():
        if isinstance(v, torch.Tensor):
            assert o[k].shape == v.shape and o[k].dtype == v.dtype, k
    assert all(list(t.parents) == list(range(-1, t.size - 1)) for t in o["trees"])
    assert not all(list(t.parents) == list(range(-1, t.size - 1)) for t in c["trees"])
    assert not torch.equal(o["slots"], c["slots"]) and not torch.equal(ck._bits(o["pool"]), ck._bits(c["pool"]))
    assert int((o["slots"] < 0).sum()) == 0 and int((c["slots"] < 0).sum()) == {"quick": 2, "serving": 3}[profile] * pads
    if op != "lightning":  # one buffer, each step's rows its own
        assert o["node_buffer"] == c["node_buffer"] and o["node_layout"] == c["node_layout"] == "shuffled rows"
        assert not torch.equal(o["node_rows"], c["node_rows"])
    B, T = c["parents"].shape
    assert (B, T) == ((4, 9) if profile == "quick" else (8, 17))
    assert c["label"].endswith("replayed on a chain step's launch")
    assert c.get("split") == o.get("split") == kc.SPLIT.get(op)  # a server's graph holds its layer's projection
    assert kc.describe(c)["engine launch"] == "replayed on another step's"
    assert all(kc.describe(x)["engine launch"] == "fresh each call" for x in cases if x is not c)


def _failing(kernel, **kw):
    return {r.name: r for r in ck.check(kernel, mode="exact", max_examples=2, **kw) if not r.holds}


def test_a_kernel_that_keeps_its_tree_by_the_tensors_identity_fails_only_on_the_replayed_step(monkeypatch):
    """A launcher that keeps the table it derives from the tree by the parents tensor's identity (fla's tensor_cache)
    is right on every fresh call; replayed on a chain step's launch, as a server's CUDA graph runs it, it verifies the
    branching tree as the chain: exact on the order-exact nodes, and wrong past them (the leak). Without the replayed
    example it holds every property, as it did before them."""
    from ddsim.engines import load
    kernel = load("tests.planted_launches:tree_kept_by_tensor", convention="ddsim")
    bad = _failing(kernel)
    assert list(bad) == ["exact on every node"]
    ce = bad["exact on every node"].counterexample
    assert ce["example"] == ("a step at 4 x 9, q k v views of one fused projection, replayed on a chain step's launch")
    assert ce["first_wrong_node"]["node"] == 4
    monkeypatch.setattr(kc, "replay_cases", lambda *a, **k: [])
    assert _failing(kernel) == {}


def test_a_replayed_examples_first_step_is_not_judged_and_a_mismatch_fails_it():
    """The step the launch is kept on is called first and not judged: a kernel wrong only on its first call holds; a
    launch the replayed step cannot match (another launch count) fails every property on that example, naming it."""
    import ddsim.gpu_backend as gb
    from ddsim import oracle
    calls = []

    def first_wrong(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale):
        calls.append(parents.clone())
        o = graphs.launch(gb.gdn_tree_verify, q, k, v, g, beta, parents=parents, initial_state=state_pool,
                          state_indices=slots, mode=mode, scale=scale, backend="torch")
        return o * 2 if len(calls) == 1 else o

    inp = next(c for c in kc.cases("gdn", "quick") if "replay" in c)
    runner = ck._Runner(first_wrong, oracle.gdn_tree_verify, ("q", "k", "v", "g", "beta"), (), "exact", "cpu",
                        extra={"scale": None})
    r = runner.run(inp)
    assert len(calls) == 2 and torch.equal(calls[0].cpu(), inp["replay"]["parents"])
    assert all(p(r) for p in runner.properties().values())

    def twice(q, k, v, g, beta, **kw):
        n = 1 if not calls else 2
        calls.append(None)
        for _ in range(n):
            o = first_wrong(q, k, v, g, beta, **kw)
        return o
    calls.clear()
    with pytest.raises(graphs.ReplayMismatch, match="the first step made 1"):
        ck._Runner(twice, oracle.gdn_tree_verify, ("q", "k", "v", "g", "beta"), (), "exact", "cpu",
                   extra={"scale": None}).run(inp)


def test_a_kernel_that_keeps_node_states_is_judged_on_its_replayed_call_and_the_first_step_gets_its_own_buffer():
    """A verify that writes every node's state into the buffer it is given: the replayed example's first step gets that
    step's own buffer layout and rows (NaN, its pool, its slots), the judged call the example's, and every property,
    the node states' too, holds on the judged call; a launcher that keeps the buffer's rows by the tensor's identity
    writes the example's node states into the first step's rows, which the node-state properties see."""
    import ddsim.gpu_backend as gb
    from ddsim import oracle
    seen = []

    def verify(q, k, v, g, beta, *, parents, initial_state, state_indices, mode, scale, states_out, states_rows):
        seen.append((states_out.shape, states_rows.clone(), state_indices.clone(), bool(torch.isnan(states_out).all())))
        return gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state,
                                  state_indices=state_indices, mode=mode, scale=scale, states_out=states_out,
                                  states_rows=states_rows, backend="torch")[0]

    def contract(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale, node_states):
        return graphs.launch(verify, q, k, v, g, beta, parents=parents, initial_state=state_pool, state_indices=slots,
                             mode=mode, scale=scale, states_out=node_states[0], states_rows=node_states[1])

    inp = next(c for c in kc.cases("gdn", "quick", nodes=True) if "replay" in c)
    runner = ck._Runner(contract, oracle.gdn_tree_verify, ("q", "k", "v", "g", "beta"), (), "exact", "cpu",
                        extra={"scale": None}, node_states=True)
    r = runner.run(inp)
    assert [p for p, pred in runner.properties().items() if not pred(r)] == []
    other = inp["replay"]
    M, P = inp["node_buffer"]
    assert [x[0][:2] for x in seen] == [(M, P), (M, P)] and all(x[3] for x in seen)
    assert torch.equal(seen[0][1], other["node_rows"]) and torch.equal(seen[0][2], other["slots"])
    assert torch.equal(seen[1][1], inp["node_rows"]) and torch.equal(seen[1][2], inp["slots"])
    assert not torch.equal(other["node_rows"], inp["node_rows"])
    kept = {}

    def rows_kept(q, k, v, g, beta, *, states_rows, **kw):
        kept.setdefault("rows", states_rows.clone())  # a launcher's table, kept from the first call
        return verify(q, k, v, g, beta, states_rows=kept["rows"], **kw)

    def contract_kept(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale, node_states):
        return graphs.launch(rows_kept, q, k, v, g, beta, parents=parents, initial_state=state_pool,
                             state_indices=slots, mode=mode, scale=scale, states_out=node_states[0],
                             states_rows=node_states[1])
    runner = ck._Runner(contract_kept, oracle.gdn_tree_verify, ("q", "k", "v", "g", "beta"), (), "exact", "cpu",
                        extra={"scale": None}, node_states=True)
    r = runner.run(inp)
    assert [p for p, pred in runner.properties().items() if not pred(r)] == [
        "node states exact on every node", "other node-state entries untouched"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_a_kernel_that_reads_the_tree_on_the_host_cannot_be_captured():
    """On a GPU the replayed example captures the launch in a CUDA graph: a launcher that reads a value on the host
    (a sync) is refused there, and fails every property on that example, saying so; it holds everything else."""
    from ddsim.engines import load
    kernel = load("tests.planted_launches:sizes_its_launch_on_the_host", convention="ddsim")
    res = ck.check(kernel, mode="exact", device="cuda", max_examples=2, profile="quick")
    bad = [r for r in res if not r.holds]
    assert bad and len(bad) == len(res.properties)
    assert all("not capturable in a CUDA graph" in r.detail and "replayed on a chain step's launch" in r.detail
               for r in bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_a_captured_launch_replays_the_new_values_and_returns_a_copy_of_its_output():
    """On CUDA the first step's launch is run once and captured; a later step's values are copied into its tensors,
    the graph replayed, its writes copied back, and its output returned as a copy (the next replay overwrites the
    graph's own)."""
    def kernel(x, t):
        t.add_(1)
        return x * 2
    replay = graphs.Replay(capture=True)
    with graphs.replaying(replay):
        replay.begin()
        first = graphs.launch(kernel, torch.ones(4, device="cuda"), torch.zeros(4, device="cuda"))
        replay.replayed()
        outs = []
        for v in (3.0, 5.0):
            replay.begin()
            t = torch.full((4,), v, device="cuda")
            outs.append((graphs.launch(kernel, torch.full((4,), v, device="cuda"), t), t))
    assert replay.sites[0].graph is not None and torch.equal(first.cpu(), torch.full((4,), 2.0))
    assert [o.cpu().tolist() for o, _ in outs] == [[6.0] * 4, [10.0] * 4]  # the first copy kept past the second replay
    assert [t.cpu().tolist() for _, t in outs] == [[4.0] * 4, [6.0] * 4]
