"""check-kernel's orchestration in process, on ddsim's torch path (about a second each): the explicit
examples before the drawn ones, a serving-only bug reported by its example, a bug drawn inputs reach
shrunk, the leaky mode's leak, a kernel that raises, conv and Mamba2, the profiles. Kept apart from
tests/test_verdict_chain.py so that mutation testing of the property chain stays fast (each of these
re-runs the quick profile)."""
import numpy as np
import pytest
import torch

from ddsim.engines import check_kernel as ck


def _load(name):
    from ddsim.engines import load
    return load(name, convention="ddsim") if ":" in name else load(name)


def test_check_holds_on_ddsims_kernel_with_its_coverage():
    res = ck.check(_load("ddsim"), mode="exact", max_examples=2)
    assert res.profile == "quick" and res.examples == 13 and len(res.properties) == 7
    assert all(r.holds for r in res) and all(r.counterexample is None for r in res)
    assert res.properties[-1].detail == "held on 13 serving examples (quick) and 2 drawn inputs"
    cov = res.coverage
    assert max(cov["nodes"]) == 129 and max(cov["K"]) == 128 and max(cov["batch"]) == 8 and max(cov["HV/H"]) == 8
    assert cov["g min"] < -29 and cov["beta min"] == 0.0 and cov["beta max"] == 1.0 and max(cov["calls"]) == 24
    assert cov["dtype"] == ["bfloat16", "float16", "float32"] and "drawn" in cov["tree"]
    assert cov["not order-exact nodes total"] > 150
    assert cov["input layout"] == ["contiguous", "views of one projection"]
    assert cov["state pool dtype"] == ["bfloat16", "float16", "float32"]  # a server's 16-bit state caches too
    assert cov["state pool layout"] == ["layer 2 of 4 slot-major", "one layer"]  # and its unified pool
    # and a server's replay of its verify, on the CPU called again on the kept tensors (test_graph_replay.py)
    assert cov["engine launch"] == ["fresh each call", "replayed on another step's (eager)"]


def test_check_reports_a_serving_only_bug_by_its_example():
    res = ck.check(_load("tests.planted_kernels:wrong_past_16_nodes"), mode="exact", max_examples=2)
    bad = [r for r in res if not r.holds]
    assert [r.name for r in bad] == ["exact on every node"]
    ce = bad[0].counterexample
    assert ce["example"].startswith("ddtree budget 16 top-k 8 T=17") and ce["first_wrong_node"]["node"] == 16
    assert bad[0].detail.startswith(f"serving example [{ce['example']}]: first wrong node 16 of sequence 0")


def test_check_shrinks_a_bug_drawn_inputs_reach_too():
    res = ck.check(_load("tests.planted_kernels:parent_off_by_one"), mode="exact", max_examples=30)
    ce = next(r for r in res if r.name == "exact on every node").counterexample
    assert ce["example"] == "drawn" and ce["first_wrong_node"]["node"] == 2 and "serving_example" in ce
    assert ce["shapes"]["T"] <= 4  # shrunk


def test_a_drawn_counterexample_is_described_as_it_ran_not_as_a_rerun_gives_it():
    """A kernel wrong only the first time it sees an input: the shrunk counterexample's line shows the wrong node of
    the run that failed (a re-run, right, once described it with no wrong node at all)."""
    from tests import planted_kernels
    planted_kernels._SEEN.clear()  # every input unseen, whatever ran before in this process
    res = {r.name: r for r in ck.check(_load("tests.planted_kernels:wrong_once_per_input"), mode="exact",
                                       max_examples=5)}
    every = res["exact on every node"]
    assert not every.holds and every.counterexample["example"] == "drawn"
    assert every.detail.startswith("first wrong node 0 of sequence 0 (parents [-1]), error "), every.detail


def test_check_in_leaky_mode_needs_the_leak():
    res = {r.name: r for r in ck.check(_load("tests.planted_kernels:exact_calling_itself_leaky"), mode="leaky",
                                       max_examples=2)}
    assert list(res)[-2:] == ["flattened semantics on every node", "leaks off order-exact nodes"]
    assert not res["flattened semantics on every node"].holds and not res["leaks off order-exact nodes"].holds
    assert res["exact on order-exact nodes"].holds
    ok = {r.name: r for r in ck.check(_load("ddsim"), mode="leaky", max_examples=2)}
    assert all(r.holds for r in ok.values()) and ok["leaks off order-exact nodes"].detail.startswith("e.g. serving example")


def test_a_kernel_that_raises_fails_every_property(tmp_path, monkeypatch):
    from ddsim.engines import EngineKernel

    def refuses_wide(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale):
        if q.shape[1] > 64:
            raise ValueError("T > 64 not supported")
        return _load("ddsim").verify(q, k, v, g, beta, parents=parents, state_pool=state_pool, slots=slots, mode=mode,
                                     scale=scale)
    res = ck.check(EngineKernel("refuses", ("exact",), refuses_wide), mode="exact", max_examples=2)
    assert not any(r.holds for r in res)
    assert res.properties[0].detail.startswith("serving example [ddtree budget 128 top-k 4 T=129") and \
        "the kernel raised ValueError: T > 64 not supported" in res.properties[0].detail

    def refuses_all_but_16(q, k, v, g, beta, **kw):  # every drawn input too (at most 10 nodes)
        if q.shape[1] != 17:
            raise ValueError("T must be 17\n(one line on the terminal)")
        return _load("ddsim").verify(q, k, v, g, beta, **kw)
    res = ck.check(EngineKernel("refuses", ("exact",), refuses_all_but_16), mode="exact", max_examples=2)
    detail = res.properties[0].detail  # the serving example's line first, then the drawn input's
    assert detail.startswith("serving example [") and detail.endswith(
        "the kernel raised ValueError: T must be 17 (one line on the terminal); then the kernel raised ValueError: T "
        "must be 17 (one line on the terminal) on a drawn input")


@pytest.mark.parametrize("where", ["serving", "drawn"])
def test_sigterm_in_a_kernel_call_ends_the_check_not_one_example(where):
    """SIGTERM (cli.Terminated, raised by the handler in whatever the main thread is running) during a kernel's call is
    not the kernel's error: the check stops there, and the command says "terminated" and writes no verdict. It was an
    Exception, and the serving loop took it for the kernel raising on that example (every property failed on it) and
    went on to the next examples."""
    from ddsim import cli
    from ddsim.engines import EngineKernel
    calls = []

    def killed(q, k, v, g, beta, **kw):
        calls.append(q.shape[1])
        if where == "serving" or q.shape[1] <= 10:  # drawn inputs have at most 10 nodes
            raise cli.Terminated()
        return _load("ddsim").verify(q, k, v, g, beta, **kw)
    import ddsim.engines.kernel_cases as kc
    with pytest.MonkeyPatch.context() as mp:
        if where == "drawn":  # no serving example: the first drawn input is the one killed
            mp.setattr(kc, "cases", lambda *a, **k: [])
        with pytest.raises(cli.Terminated):
            ck.check(EngineKernel("killed", ("exact",), killed), mode="exact", max_examples=2)
    assert len(calls) == 1  # nothing run after it


def test_progress_names_every_serving_example_and_property_as_it_ends():
    """check(progress=...) is told each serving example's and each property's drawn search's wall time as it ends (what
    a long serving-profile check spends its time on); the verdicts are those of a check without it."""
    lines = []
    res = ck.check(_load("ddsim"), mode="exact", max_examples=2, op="conv", progress=lines.append)
    assert all(r.holds for r in res)
    serving = [ln for ln in lines if ln.startswith("serving example [")]
    assert len(serving) == res.examples > 0 and all(ln.endswith(" s") for ln in serving), lines
    searched = [ln.split("'")[1] for ln in lines if ln.startswith("property '")]
    assert searched == [r.name for r in res.properties if r.name in searched] and len(searched) == len(set(searched))
    assert len(lines) == len(serving) + len(searched) and lines[:len(serving)] == serving  # the examples first


@pytest.mark.parametrize("kernel, said", [
    ("output_with_an_extra_axis", "an output of shape (1, 1, 17, 1, 128) where the contract's is (1, 17, 1, 128)"),
    ("output_heads_flattened", "an output of shape (1, 17, 128) where the contract's is (1, 17, 1, 128)"),
    ("output_as_a_list", "an output of list, not a floating-point tensor"),
])
def test_an_output_that_breaks_the_contract_fails_every_property(kernel, said):
    """The right values in another shape or type: every property fails on the first serving example, named so (an
    extra axis once raised out of check() on the comparison's mask)."""
    res = ck.check(_load(f"tests.planted_kernels:{kernel}"), mode="exact", max_examples=2)
    assert [r.holds for r in res] == [False] * 7
    first = res.properties[0].detail
    assert first.startswith("serving example [ddtree budget 16 top-k 8 T=17 B=1") and \
        f"the kernel broke its contract: {said}" in first, first


def test_check_conv_and_mamba2_and_bad_profiles():
    conv = ck.check(_load("ddsim"), mode="exact", max_examples=2, op="conv")
    assert all(r.holds for r in conv) and [r.name for r in conv][3] == "committed window untouched"
    assert 1024 in conv.coverage["C"] and conv.coverage["W"] == [2, 3, 4, 5]
    m2 = ck.check(_load("ddsim"), mode="exact", max_examples=2, op="mamba2")
    assert all(r.holds for r in m2) and max(m2.coverage["P"]) == 64 and max(m2.coverage["N"]) == 128
    bad = ck.check(_load("tests.planted_kernels:mamba2_forgets_dt_bias"), mode="exact", max_examples=2, op="mamba2")
    assert {r.name for r in bad if not r.holds} == {"exact on order-exact nodes", "exact on every node"}
    # a write to a positional input (x) is seen as a write to the kernel's arguments
    bad = ck.check(_load("tests.planted_kernels:mamba2_writes_x_in_place"), mode="exact", max_examples=2, op="mamba2")
    assert {r.name for r in bad if not r.holds} == {"inputs untouched"}
    from ddsim.errors import InputError
    with pytest.raises(InputError, match="--profile: expected one of quick, serving"):
        ck.check(_load("ddsim"), mode="exact", profile="huge")
    assert ck.default_profile("cuda:0") == "serving" and ck.default_profile("cpu") == "quick"


@pytest.mark.parametrize("op, want", [
    ("gdn", [dict(batch=8, nodes=65, HV=48, **{"HV/H": 3, "input layout": "views of one projection"}, K=128, V=128),
             dict(batch=32, nodes=17, HV=48, K=128, V=128, **{"input layout": "views of one projection"}),
             dict(batch=8, nodes=65, HV=48, **{"HV/H": 3, "state pool dtype": "bfloat16"}, K=128, V=128)]),
    ("kda", [dict(batch=8, nodes=33, H=32, K=128, V=128, **{"input layout": "views of one projection"}),
             dict(batch=8, nodes=33, H=32, K=128, V=128, **{"state pool dtype": "bfloat16"})]),
    ("lightning", [dict(batch=8, nodes=33, H=64, K=128, V=128, **{"input layout": "views of one projection"}),
                   dict(batch=8, nodes=33, H=64, K=128, V=128, **{"state pool dtype": "bfloat16"})]),
    ("mamba2", [dict(batch=8, nodes=33, H=128, P=64, N=128, **{"H/G": 16, "input layout": "views of one projection"}),
                dict(batch=8, nodes=33, H=128, P=64, N=128, **{"H/G": 16, "state pool dtype": "bfloat16"})]),
    ("conv", [dict(batch=8, nodes=65, C=10240)]),
])
def test_the_serving_profile_runs_a_models_layer_with_every_dimension_at_once(op, want):
    """Each op's serving profile holds an example with every dimension at a model's serving size together (an
    engine may choose another configuration or grid only there), and the coverage names its head count."""
    from ddsim.engines import kernel_cases as kc
    seen = [kc.describe(c) for c in kc.cases(op, "serving")]
    for w in want:
        assert any(all(d.get(k) == v for k, v in w.items()) for d in seen), (op, w)
    assert not any(d["batch"] >= 8 and (d.get("HV") == 48 or d.get("H", 0) >= 32) for d in
                   (kc.describe(c) for c in kc.cases(op, "quick"))), "the quick profile stays sized for the interpreter"


@pytest.mark.parametrize("op", ["gdn", "kda", "lightning", "mamba2"])
def test_each_profile_hands_some_inputs_over_as_views_of_one_projection(op):
    """Both profiles hold an example whose q, k, v (Mamba2: x, B, C) are split from one fused projection, as a
    server's layer passes them (kernel_cases.SPLIT); split_views keeps the values, in one storage, in order, each
    token's row strided by the projection's width."""
    from ddsim.engines import kernel_cases as kc
    for profile in kc.PROFILES:
        split = [c for c in kc.cases(op, profile) if c.get("split")]
        assert split and all(c["split"] == kc.SPLIT[op] for c in split), (op, profile)
        # said in the label (the replayed example's then says it was replayed)
        assert all(c["label"].removesuffix(", replayed on a chain step's launch").endswith(
            f"{' '.join(kc.SPLIT[op])} views of one fused projection") for c in split)
    inp = split[-1]
    views = kc.split_views({n: inp[n] for n in kc.SPLIT[op]})
    widths = [inp[n][0, 0].numel() for n in kc.SPLIT[op]]
    base = views[kc.SPLIT[op][0]].untyped_storage().data_ptr()
    for at, (n, t) in zip(np.cumsum([0] + widths[:-1]), views.items()):
        assert torch.equal(t, inp[n]) and t.shape == inp[n].shape and not t.is_contiguous()
        assert t.untyped_storage().data_ptr() == base and t.storage_offset() == at
        assert t.stride()[:2] == (inp[n].shape[1] * sum(widths), sum(widths))


@pytest.mark.parametrize("op", ["gdn", "kda", "lightning", "mamba2"])
def test_each_profile_holds_a_state_pool_in_each_16_bit_dtype(op):
    """Both profiles hold examples whose state pool is a server's 16-bit state cache (kernel_cases.STATE_DTYPES), the
    pool's values the oracle's initial states (rounded once, when drawn), said in the label; the other examples keep
    float32 pools, and the conv its window pool in its input's dtype."""
    from ddsim.engines import kernel_cases as kc
    for profile in kc.PROFILES:
        cases = kc.cases(op, profile)
        got = sorted({str(c["pool"].dtype) for c in cases})
        assert got == ["torch.bfloat16", "torch.float16", "torch.float32"], (op, profile, got)
        for c in cases:
            assert c["initial_state"].dtype == c["pool"].dtype
            assert torch.equal(c["pool"][c["slots"].long()], c["initial_state"])
            assert c["label"].endswith(f"state pool {str(c['pool'].dtype).removeprefix('torch.')}") == (
                c["pool"].dtype != torch.float32), c["label"]
    assert all(c["pool"].dtype == c["x"].dtype for c in kc.cases("conv", "quick"))


def test_16_bit_state_pools_are_judged_at_their_rounding_and_reach_engines_in_their_dtype():
    """An example's outputs and node states are held to the coarser of its inputs' and its state pool's tolerance (a
    kernel keeps its node states in the pool's dtype: SGLang's exact verifies carry each node's state through them).
    SGLang's and vLLM's adapters hand the kernel the pool, and allocate its node states, in the pool's dtype (a float32
    copy would check a cache the server never keeps); ddsim's convention hands ddsim's verifies (float32 states) a
    float32 copy of the pool and carries any write back."""
    from ddsim.engines import ddsim_kernels, sglang, vllm
    from ddsim.engines import kernel_cases as kc
    c = next(c for c in kc.cases("gdn", "quick") if c["pool"].dtype == torch.bfloat16)
    assert c["q"].dtype == torch.float32 and ck._judged_dtype(c) == torch.bfloat16
    f16 = next(c for c in kc.cases("gdn", "quick", torch.bfloat16) if c["pool"].dtype == torch.float16)
    assert ck._judged_dtype(f16) == torch.bfloat16  # bf16 inputs: theirs, the coarser
    assert ck._judged_dtype(kc.cases("gdn", "quick")[0]) == torch.float32
    seen = {}

    def sglang_gdn(A_log, a, dt_bias, sb, th, q, k, v, b, pool, slots, **kw):
        seen.update(pool=pool.dtype, buffer=kw["intermediate_states_buffer"].dtype)
        return torch.zeros(1, *v.shape)

    args = dict(g=c["g"], beta=c["beta"], parents=c["parents"], state_pool=c["pool"], slots=c["slots"])
    sglang.as_contract(sglang_gdn)(c["q"], c["k"], c["v"], **args, mode="exact")
    assert seen == {"pool": torch.bfloat16, "buffer": torch.bfloat16}

    def vllm_gdn(A_log, a, b, dt_bias, q, k, v, initial_state, **kw):
        seen.update(vllm=initial_state.dtype)
        return torch.zeros(1, *v.shape), None

    vllm.as_contract(vllm_gdn)(c["q"], c["k"], c["v"], **args, mode="leaky", scale=None)
    assert seen["vllm"] == torch.bfloat16
    pool = ddsim_kernels.fp32_pool(c["pool"])
    assert pool.dtype == torch.float32 and torch.equal(pool[c["slots"].long()], c["initial_state"].float())
    f32 = kc.cases("gdn", "quick")[0]["pool"]
    assert ddsim_kernels.fp32_pool(f32) is f32 and ddsim_kernels.fp32_pool(f32.double()).dtype == torch.float64
    # a write into the copy comes back to the 16-bit pool in its dtype, and only the slots written
    before = c["pool"].clone()
    pool[3] = 2.0
    ddsim_kernels.carry_back(pool, c["pool"])
    assert torch.equal(c["pool"][3], torch.full_like(before[3], 2.0))
    assert torch.equal(c["pool"][:3].view(torch.int16), before[:3].view(torch.int16))
    assert torch.equal(c["pool"][4:].view(torch.int16), before[4:].view(torch.int16))


def _drop_in_on_torch(monkeypatch):
    """The planted drop-ins (tests/planted_node_states.py wraps engine_api.target_verify) on ddsim's torch backend: the
    pool's addressing under test is the wrapper's, and the same through either backend, where Triton's interpreter
    took about a minute a check on the CPU."""
    from ddsim.gpu_backend import engine_api
    monkeypatch.setattr(engine_api, "_backend", lambda x: "torch")


def test_a_kernel_that_addresses_a_16_bit_pool_as_float32_is_caught_only_by_the_16_bit_pools(monkeypatch):
    """A verify that computes a slot's offset in float32 units reads another request's state from a bf16 or fp16
    pool: the 16-bit examples fail it, naming their pool; without them (every pool float32) it holds everything."""
    from ddsim.engines import kernel_cases as kc
    from ddsim.engines import load
    _drop_in_on_torch(monkeypatch)
    kernel = load("tests.planted_node_states:pool_at_float32_offsets", convention="sglang")
    res = ck.check(kernel, mode="exact", max_examples=1)
    bad = [r for r in res if not r.holds]
    assert {r.name for r in bad} == {"output finite", "exact on order-exact nodes", "exact on every node",
                                     "node states exact on every node"}
    assert all(r.counterexample["example"].endswith(("state pool bfloat16", "state pool float16")) for r in bad)
    monkeypatch.setattr(kc, "STATE_DTYPES", ())
    assert all(r.holds for r in ck.check(kernel, mode="exact", max_examples=1))


@pytest.mark.parametrize("op", ["gdn", "kda", "lightning", "mamba2", "conv"])
def test_each_profile_holds_a_pool_that_is_one_layer_of_a_slot_major_pool(op):
    """Both profiles hold examples whose pool is handed over as one layer of a slot-major pool (kernel_cases.SLOT_MAJOR:
    each slot's entries of every layer side by side, as a server's unified pool keeps them), the model's layer among
    the serving ones, said in the label and the coverage; the rest are pools of one layer."""
    from ddsim.engines import kernel_cases as kc
    for profile in kc.PROFILES:
        cases = kc.cases(op, profile)
        marked = [c for c in cases if "pool_layers" in c]
        assert marked and all(c["pool_layers"] == kc.SLOT_MAJOR for c in marked), (op, profile)
        assert all(c["label"].endswith("pool layer 2 of 4 slot-major") for c in marked)
        layouts = {kc.describe(c)["state pool layout"] for c in cases}
        assert layouts == {"one layer", "layer 2 of 4 slot-major"}, layouts
    widest = max(marked, key=lambda c: c["pool"][0].numel())
    assert widest["pool"][0].numel() == {"gdn": 48 * 128 * 128, "kda": 32 * 128 * 128, "lightning": 64 * 128 * 128,
                                         "mamba2": 128 * 64 * 128, "conv": 10240 * 3}[op]  # the model's layer


def test_a_slot_major_pool_reaches_sglangs_kernel_as_it_lies_and_its_writes_anywhere_come_back():
    """check-kernel builds the layer's pool as a view of a slot-major pool (slot_major_like: the other layers' entries
    NaN, guard slots beside); SGLang's adapter hands its kernel its layout at the same slot pitch and place
    (pitched_like: its kernel reads the pitch from stride(0)), and a write to the layer's entries, to another layer's
    or to a guard slot comes back to the caller's pool (reflect_pitched), where _pool_writes sees it."""
    from ddsim.engines import beside, sglang, slot_major_like, slot_major_whole
    from ddsim.engines import kernel_cases as kc
    c = next(c for c in kc.cases("gdn", "quick") if "pool_layers" in c)
    pool = slot_major_like(c["pool"], *c["pool_layers"])
    whole = slot_major_whole(pool)
    N, E = c["pool"].shape[0], c["pool"][0].numel()
    assert pool.stride(0) == 4 * E and whole.shape == (N, 4, *c["pool"].shape[1:])
    assert torch.equal(ck._bits(pool), ck._bits(c["pool"]))  # NaN slots and all
    assert torch.isnan(whole[:, [0, 1, 3]]).all() and slot_major_whole(c["pool"]) is None
    before = ck._bits(whole).clone()
    seen = {}

    def kernel(A_log, a, dt_bias, sb, th, q, k, v, b, p, slots, **kw):
        seen.update(stride=p.stride(), equal=torch.equal(ck._bits(p), ck._bits(c["pool"].transpose(-1, -2))))
        mine = slot_major_whole(p)
        mine[1, 3] = 1.0  # slot 1's entry of layer 3
        p[4] = 2.0  # slot 4's own entry (layer 2)
        mine.view(N, -1)[0, 0] = 0.0  # slot 0's layer-0 entry, its first element
        beside(mine)[1].fill_(3.0)  # the guard slot after the whole pool
        return torch.zeros(1, *v.shape)

    sglang.as_contract(kernel)(c["q"], c["k"], c["v"], c["g"], c["beta"], parents=c["parents"], state_pool=pool,
                               slots=c["slots"], mode="leaky")
    HV, K, V = c["pool"].shape[1:]
    assert seen == {"stride": (4 * E, V * K, K, 1), "equal": True}
    w = ck._pool_writes(whole, before, c["slots"], 2)
    assert w["written_slots"] == [0, 1, 4, N] and not w["others_untouched"]
    assert w["committed_untouched"] == (4 not in c["slots"].tolist())
    assert bool((whole[1, 3] == 1.0).all()) and bool((pool[4] == 2.0).all()) and whole[0, 0].flatten()[0] == 0.0


def test_vllms_adapter_hands_its_kernel_a_slot_major_pool_so_laid_out_and_carries_its_other_layer_writes_back():
    """vLLM's kernel reads its pool's slot pitch from stride(0): the adapter's own pool (a null slot, the caller's,
    the per-token ones) goes to it at the caller's pitch and layer. A write to another layer's entry beside a caller's
    slot comes back to the caller's whole pool; one beside the adapter's own slots, which no property sees, raises."""
    from ddsim.engines import kernel_cases as kc
    from ddsim.engines import slot_major_like, slot_major_whole, vllm
    c = next(c for c in kc.cases("gdn", "quick") if "pool_layers" in c)
    pool = slot_major_like(c["pool"], *c["pool_layers"])
    whole = slot_major_whole(pool)
    N, E = c["pool"].shape[0], c["pool"][0].numel()
    before = ck._bits(whole).clone()
    seen = {}

    def kernel(A_log, a, b, dt_bias, q, k, v, initial_state, stray=False, **kw):
        seen.update(stride=initial_state.stride(0), slot=torch.equal(
            ck._bits(initial_state[1 + 2]), ck._bits(c["pool"][2].transpose(-1, -2))))
        mine = slot_major_whole(initial_state)
        mine[1 + 3, 0] = 5.0  # layer 0's entry of the caller's slot 3
        if seen.get("stray"):
            mine[1 + N, 1] = 5.0  # layer 1's entry of the first per-token slot
        return torch.zeros(1, *v.shape), None

    contract = vllm.as_contract(kernel)
    args = dict(parents=c["parents"], state_pool=pool, slots=c["slots"], mode="leaky", scale=None)
    contract(c["q"], c["k"], c["v"], c["g"], c["beta"], **args)
    assert seen == {"stride": 4 * E, "slot": True}
    w = ck._pool_writes(whole, before, c["slots"], 2)
    assert w["written_slots"] == [3] and not w["others_untouched"] and w["committed_untouched"]
    assert bool((whole[3, 0] == 5.0).all())
    seen["stray"] = True
    with pytest.raises(RuntimeError, match="wrote layer 1's entry of a null or per-token slot, beside the layer 2"):
        contract(c["q"], c["k"], c["v"], c["g"], c["beta"], **args)


def test_a_kernel_that_takes_the_slot_pitch_from_the_shape_is_caught_only_by_slot_major_pools(monkeypatch):
    """A verify that reads slot s at s entries (not s times the pool's stride(0)) reads another layer's state, and one
    that writes another layer's entry of its slot writes what the layer's own view never shows: the slot-major examples
    fail each, naming their pool; with every pool one layer both hold everything."""
    from ddsim.engines import kernel_cases as kc
    from ddsim.engines import load
    _drop_in_on_torch(monkeypatch)
    wants = {"slot_pitch_from_shape": {"output finite", "exact on order-exact nodes", "exact on every node",
                                       "node states exact on every node"},
             "writes_its_slot_in_another_layer": {"other pool slots untouched"}}
    for name, want in wants.items():
        kernel = load(f"tests.planted_node_states:{name}", convention="sglang")
        bad = [r for r in ck.check(kernel, mode="exact", max_examples=1) if not r.holds]
        assert {r.name for r in bad} == want, (name, [r.name for r in bad])
        assert all(r.counterexample["example"].endswith("pool layer 2 of 4 slot-major") for r in bad)
    monkeypatch.setattr(kc, "_slot_major", lambda inp: inp)
    for name in wants:
        kernel = load(f"tests.planted_node_states:{name}", convention="sglang")
        assert all(r.holds for r in ck.check(kernel, mode="exact", max_examples=1)), name


def test_check_kernel_calls_the_kernel_with_the_split_views_each_time():
    """A split example reaches the kernel as views of one projection on every call of its burst (fresh ones each
    time), and the oracle's inputs are the same values."""
    import ddsim.gpu_backend as gb
    from ddsim import oracle
    from ddsim.engines import kernel_cases as kc
    seen = []

    def recorder(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale):
        seen.append((q.stride(), k.stride(), v.stride(), q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()))
        return gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=state_pool, state_indices=slots,
                                  mode=mode, scale=scale, backend="torch")
    inp = next(c for c in kc.cases("gdn", "quick") if c.get("split"))
    inp = {**inp, "burst": 3}
    r = ck._Runner(recorder, oracle.gdn_tree_verify, ("q", "k", "v", "g", "beta"), (), "exact", "cpu",
                   extra={"scale": None}).run(inp)
    B, T, H, K = inp["q"].shape
    W = 2 * H * K + inp["v"].shape[2] * inp["v"].shape[3]
    assert len(seen) == 3 and all(s[0][:2] == s[1][:2] == s[2][:2] == (T * W, W) and s[3] for s in seen), seen
    props = ck._properties("exact")
    assert all(p(r) for p in props.values()), [n for n, p in props.items() if not p(r)]


def test_sglangs_adapters_hand_its_kernels_the_layouts_its_layer_passes():
    """SGLang's layer passes its GDN verify q, k, v split from mixed_qkv, its Mamba2 verify x, B, C split from xBC,
    and its tree conv mixed_qkv as a [B, C, T] view of [B, T, C] rows: the adapters pass them on as they come, no
    copy (a copy would check the kernel on a layout SGLang never hands it)."""
    from ddsim.engines import kernel_cases as kc
    from ddsim.engines import sglang
    got = {}

    def gdn(A_log, a, dt_bias, softplus_beta, threshold, q, k, v, b, pool, slots, **kw):
        got.update(q=q, k=k, v=v)
        return torch.zeros(1, *v.shape)

    inp = next(c for c in kc.cases("gdn", "quick") if c.get("split"))
    views = kc.split_views({n: inp[n] for n in "qkv"})
    sglang.as_contract(gdn)(**views, g=inp["g"], beta=inp["beta"], parents=inp["parents"], state_pool=inp["pool"],
                            slots=inp["slots"], mode="leaky")
    assert all(got[n] is views[n] for n in "qkv")
    # a layout its kernel does not read (heads before tokens, as a model's attention may keep them) is copied
    inp = kc.gdn_case(T=5, B=2, H=2, ratio=2, K=8, V=8)
    heads_first = {n: inp[n].transpose(1, 2).contiguous().transpose(1, 2) for n in "qkv"}
    sglang.as_contract(gdn)(**heads_first, g=inp["g"], beta=inp["beta"], parents=inp["parents"],
                            state_pool=inp["pool"], slots=inp["slots"], mode="leaky")
    assert all(got[n] is not heads_first[n] and got[n].is_contiguous() and torch.equal(got[n], inp[n]) for n in "qkv")

    def conv(x, window_pool, weight, bias, activation, **kw):
        got["x"] = x
        return torch.zeros_like(x)

    # its Mamba2 layer splits the conv's output xBC into x, B, C and its kernel reads every stride: passed as they come
    def mamba2(state, x, dt, A, B, C, **kw):
        got.update(x=x, B=B, C=C)

    inp = next(c for c in kc.cases("mamba2", "quick") if c.get("split"))
    views = kc.split_views({n: inp[n] for n in ("x", "B", "C")})
    sglang.as_mamba2_contract(mamba2)(views["x"], inp["dt"], inp["A"], views["B"], views["C"], D=inp["D"],
                                      dt_bias=inp["dt_bias"], parents=inp["parents"], state_pool=inp["pool"],
                                      slots=inp["slots"], mode="leaky")
    assert all(got[n] is views[n] for n in ("x", "B", "C"))

    c = kc.cases("conv", "quick")[0]
    out = sglang.as_conv_contract(conv)(c["x"], weight=c["weight"], bias=c["bias"], parents=c["parents"],
                                        window_pool=c["pool"], slots=c["slots"], mode="leaky", activation="silu")
    B, T, C = c["x"].shape
    assert got["x"].shape == (B, C, T) and got["x"].stride() == (T * C, 1, C)
    assert got["x"].data_ptr() == c["x"].data_ptr() and out.shape == (B, T, C)


def test_sglangs_verifies_get_the_parent_table_as_its_tree_conv_fills_it():
    """In serving SGLang's GDN, KDA and Mamba2 verifies read the parent table its tree conv filled, whose root entries
    are 0: the adapters hand them that table (a verify that read the root's entry as a parent would be caught here as
    in serving), and the conv's adapter hands the conv the caller's table to fill."""
    from ddsim.engines import kernel_cases as kc
    from ddsim.engines import sglang
    got = {}

    def gdn(*a, retrieve_parent_token=None, intermediate_states_buffer=None, **kw):
        got["gdn"] = retrieve_parent_token.clone()
        return torch.zeros(1, *a[7].shape)

    def mamba2(state, x, *a, retrieve_parent_token=None, **kw):
        got["mamba2"] = retrieve_parent_token.clone()

    c = next(c for c in kc.cases("gdn", "quick") if c["parents"].shape[0] > 1)
    sglang.as_contract(gdn)(c["q"], c["k"], c["v"], c["g"], c["beta"], parents=c["parents"], state_pool=c["pool"],
                            slots=c["slots"], mode="exact")
    want = c["parents"].to(torch.int32)
    want[:, 0] = 0
    assert torch.equal(got["gdn"], want) and torch.equal(sglang.parent_table(c["parents"], "cpu"), want)
    m = kc.cases("mamba2", "quick")[0]
    sglang.as_mamba2_contract(mamba2)(m["x"], m["dt"], m["A"], m["B"], m["C"], D=m["D"], dt_bias=m["dt_bias"],
                                      parents=m["parents"], state_pool=m["pool"], slots=m["slots"], mode="exact")
    assert got["mamba2"][:, 0].eq(0).all() and torch.equal(got["mamba2"][:, 1:], m["parents"][:, 1:].int())

    def conv(x, window_pool, weight, bias, activation, retrieve_parent_token=None, **kw):
        got["conv"] = retrieve_parent_token
        return torch.zeros_like(x)

    v = kc.cases("conv", "quick")[0]
    table = torch.full(tuple(v["parents"].shape), -7, dtype=torch.int32)
    sglang.as_conv_contract(conv)(v["x"], weight=v["weight"], bias=v["bias"], parents=v["parents"],
                                  window_pool=v["pool"], slots=v["slots"], mode="exact", activation="silu",
                                  parents_out=table)
    assert got["conv"] is table


def test_the_interpreters_cached_builtin_patching_patches_what_the_original_does():
    """ddsim.engines.triton_interpret.cache_builtin_names: for every module the interpreter patches at a launch,
    the cached version sets exactly the attributes the original sets, to wrappers of the same members, and the
    scope restores them."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    from ddsim.engines.triton_interpret import cache_builtin_names
    assert cache_builtin_names()
    cached = interpreter._patch_builtin
    assert cached._ddsim_cached

    def original(pkg, builder, scope):  # Triton's own, as written in triton/runtime/interpreter.py
        for name, member in inspect.getmembers(pkg):
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)
    for pkg in (tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        attrs = lambda: {k: v for k, v in vars(pkg).items() if not k.startswith("__")}  # noqa: E731
        before = attrs()  # (getmembers may create a class's __annotations__)
        seen = []
        for fn in (original, cached, cached):  # the second cached call reads the listed names
            scope = interpreter._LangPatchScope()
            fn(pkg, None, scope)
            seen.append(sorted((name, id(getattr(pkg, name).__kwdefaults__["member"])) for _, name, _ in scope._changes))
            scope.restore()
            assert attrs() == before
        assert seen[0] == seen[1] == seen[2] and seen[0]


def test_a_helpers_call_inside_a_launch_patches_only_what_the_launch_has_not():
    """ddsim.engines.triton_interpret.patch_once_per_launch: a launch patches triton.language as Triton does and its
    scope restores it; inside it, a helper naming only the modules the launch patched patches nothing, one naming
    another language module patches as Triton does; outside a launch every call patches as Triton's does."""
    import triton.language as tl
    from triton.language import core
    from triton.runtime import interpreter

    from ddsim.engines import triton_interpret
    assert triton_interpret.patch_once_per_launch() and interpreter._patch_lang._ddsim_once

    def fn(**names):  # a function whose module names ``names`` (a kernel's or a helper's globals)
        exec("def f():\n    pass", names)
        return names["f"]
    kernel, helper, core_helper = fn(tl=tl), fn(tl=tl, torch=torch), fn(tl=tl, core=core)
    before = {k: v for k, v in vars(tl).items() if not k.startswith("__")}
    with triton_interpret.launching():  # as GridExecutor's call runs under patch_once_per_launch
        launch = interpreter._patch_lang(kernel)
        try:
            assert launch._changes and vars(tl)["dot"] is not before["dot"]
            assert interpreter._patch_lang(helper)._changes == []
            assert interpreter._patch_lang(kernel)._changes == []
            assert interpreter._patch_lang(core_helper)._changes  # triton.language.core: not patched by the launch
            assert interpreter._patch_lang(core_helper)._changes == []  # (now it is)
        finally:
            launch.restore()
    assert {k: v for k, v in vars(tl).items() if not k.startswith("__")} == before
    assert triton_interpret._PATCHED.langs is None
    for _ in range(2):  # outside a launch (a helper called from Python): each call patches, and marks nothing
        outside = interpreter._patch_lang(helper)
        try:
            assert outside._changes and triton_interpret._PATCHED.langs is None
        finally:
            outside.restore()


@pytest.mark.interpreter
def test_an_interpreted_kernel_calling_helpers_patches_the_language_once(monkeypatch):
    """A launch of ddsim's path kernel (its helpers called at every step of a node's path) lists triton.language's
    builtins once, not again at each helper's call, and gives the bits Triton's own patching gives."""
    from triton.runtime import interpreter

    from ddsim.gpu_backend import triton_gdn
    torch.manual_seed(0)
    T, H, K, V = 5, 2, 4, 4
    args = dict(q=torch.randn(1, T, H, K), k=torch.randn(1, T, H, K), v=torch.randn(1, T, H, V),
                g=-torch.rand(1, T, H), beta=torch.rand(1, T, H), parents=torch.tensor([[-1, 0, 1, 1, 0]]),
                initial_state=torch.randn(1, H, K, V), mode="exact", design="paths", output_states=True)
    listed, launches = [], []
    patch_builtin, run = interpreter._patch_builtin, interpreter.GridExecutor.__call__
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda pkg, *a: (listed.append(pkg), patch_builtin(pkg, *a)))
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", lambda *a, **kw: (launches.append(1), run(*a, **kw)))
    once = triton_gdn.gdn_tree_verify_recurrent(**args)
    per_call, launched = len(listed), len(launches)
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang._ddsim_original)
    tritons = triton_gdn.gdn_tree_verify_recurrent(**args)
    # a launch lists triton.language, its tensor, math and descriptors (4); the first helper naming
    # triton.language.core (tl.sum's module) patches every language module it names as Triton does (up to 6 more);
    # Triton's own patching lists them again at every helper's call
    assert launched == len(launches) - launched > 0
    names = " ".join(getattr(p, "__name__", str(p)) for p in listed[:per_call])
    assert 0 < per_call <= 10 * launched and len(listed) - per_call > 50 * per_call, (launched, names, len(listed))
    for a, b in zip(once, tritons):
        assert torch.equal(a, b)


@pytest.mark.interpreter
def test_a_loaded_scalar_used_as_a_python_int_runs_where_numpy_refuses_int_of_a_one_element_array(monkeypatch):
    """ddsim.engines.triton_interpret.index_one_element_arrays: Triton 3.6's interpreter gives int() a tensor's
    one-element data array whole, which numpy 2.4 refuses (emulated here whatever the Triton and numpy: a kernel's
    loop bound loaded from memory then fails every launch, as SGLang's kernels did under check-kernel on the CPU).
    With the hook the same launch runs and sums the first n elements; the tensor's __index__ is Triton's own again
    after the launch."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    from ddsim.engines import triton_interpret

    @triton.jit
    def first_n_summed(x_ptr, n_ptr, out_ptr):
        n = tl.load(n_ptr)
        acc = tl.zeros([1], dtype=tl.float32)
        for i in range(n):  # (n's __index__)
            acc += tl.load(x_ptr + i + tl.arange(0, 1))
        tl.store(out_ptr + tl.arange(0, 1), acc)

    def refused(self):  # numpy 2.4's int() of an array, as Triton 3.6's __index__ calls it
        if self.handle.data.ndim:
            raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
        return int(self.handle.data)

    tritons = interpreter._patch_lang_tensor
    monkeypatch.setattr(interpreter, "_patch_lang_tensor",
                        lambda tensor, scope: (tritons(tensor, scope), scope.set_attr(tensor, "__index__", refused)))
    x, n, out = torch.arange(8, dtype=torch.float32), torch.tensor([5], dtype=torch.int32), torch.full((1,), -1.0)
    before = tl.core.tensor.__dict__.get("__index__")
    with pytest.raises(Exception, match="only 0-dimensional arrays can be converted"):
        first_n_summed[(1,)](x, n, out)
    assert triton_interpret.index_one_element_arrays() and interpreter._patch_lang_tensor._ddsim_index
    first_n_summed[(1,)](x, n, out)
    assert out.tolist() == [10.0]
    assert tl.core.tensor.__dict__.get("__index__") is before


@pytest.mark.parametrize("op", ["gdn", "conv", "mamba2", "kda", "lightning"])
@pytest.mark.parametrize("profile", ["quick", "serving"])
def test_padded_batches_are_run_where_the_convention_pads(op, profile):
    """A kernel whose convention pads a CUDA-graph batch (SGLang's, vLLM's) gets padded batches: the last rows slot
    -1, no state of theirs in the pool, a real sequence in the pool's last slot (where Python's -1 lands); the
    serving profile's in a pool of 1024 slots at a model's widths. Other conventions get none."""
    from ddsim.engines import kernel_cases as kc
    # the replayed example is the last either way, padded where the convention pads (test_graph_replay.py)
    plain, padded = ([c for c in kc.cases(op, profile, pads=p) if "replay" not in c] for p in (False, True))
    extra = padded[len(plain):]
    assert [c["label"] for c in padded[:len(plain)]] == [c["label"] for c in plain]
    assert len(extra) == (1 if profile == "quick" else 2)
    assert not any(kc.describe(c)["padded rows"] for c in plain)
    for c in extra:
        slots, pool = c["slots"], c["pool"]
        pad = int((slots < 0).sum())
        assert pad and bool((slots[-pad:] == -1).all()) and bool((slots[:-pad] >= 0).all())
        assert pool.shape[0] - 1 in slots.tolist()
        real = slots[:-pad].long()
        assert not torch.isnan(pool[real]).any() and int((~torch.isnan(pool)).flatten(1).all(-1).sum()) == len(real)
        state = c.get("initial_state", c.get("initial_window"))
        assert bool((state[-pad:] == 0).all())  # an engine computes a padded row from a zero state
    if profile == "serving":
        assert kc.describe(extra[0])["pool slots"] == 1024 and kc.describe(extra[0])["batch"] == 8


def test_guard_slots_show_a_write_beside_the_pool_and_adapters_carry_it_back():
    """check-kernel's pool sits between two guard slots in its storage: a write a slot's worth before it (slot -1
    taken as an address offset) or after it is a write outside the pool; an adapter's guarded copy in the engine's
    layout carries such a write to the caller's guards."""
    from ddsim.engines import beside, guarded_like, reflect_writes
    from ddsim.engines.check_kernel import _bits, _pool_writes
    pool = guarded_like(torch.randn(5, 2, 3, 4))
    before = _bits(pool).clone()
    w = _pool_writes(pool, before, torch.tensor([1, 3, -1], dtype=torch.int32))
    assert w == {"committed_untouched": True, "others_untouched": True, "written_slots": []}
    for end, slot in ((0, -1), (1, 5)):
        p = guarded_like(torch.randn(5, 2, 3, 4))
        b = _bits(p).clone()
        beside(p)[end].zero_()
        w = _pool_writes(p, b, torch.tensor([1, 3, -1], dtype=torch.int32))
        assert w == {"committed_untouched": True, "others_untouched": False, "written_slots": [slot]}
    assert beside(torch.randn(5, 2, 3, 4)) is None  # a pool check-kernel did not make: no guards to read
    caller = guarded_like(torch.randn(5, 2, 3, 4))
    engine = guarded_like(caller.transpose(-1, -2))  # the engine's [N, ..., V, K] copy
    theirs = _bits(caller).clone()
    beside(engine)[0].fill_(1.0)
    reflect_writes(engine, caller)
    assert torch.equal(beside(caller)[0], torch.ones(2, 3, 4)) and torch.equal(_bits(caller), theirs)
    assert _pool_writes(caller, theirs, torch.tensor([0], dtype=torch.int32))["written_slots"] == [-1]


def test_repeatable_leaves_a_padded_rows_output_aside():
    """vLLM's kernel and SGLang's conv leave a padded row's output unwritten (memory as it was): calls may differ
    there and still be repeatable; a real row that differs between calls is not."""
    calls = iter(range(100))

    def kernel(noisy_row):
        def call(args, pool, slots):
            o = torch.zeros(2, 3)
            o[noisy_row] = float(next(calls))  # differs on every call
            return o
        return call
    inp = {"burst": 3, "parents": torch.tensor([[-1, 0, 0]] * 2), "slots": torch.tensor([0, -1], dtype=torch.int32),
           "pool": torch.zeros(2, 4), "x": torch.zeros(2, 3)}
    assert ck._calls(kernel(1), inp, ("x",), "cpu")["repeatable"]
    assert not ck._calls(kernel(0), inp, ("x",), "cpu")["repeatable"]


def test_the_guard_slots_are_found_only_where_check_kernel_made_them():
    """engines.beside finds the two slots around a contiguous pool only where its storage holds them: not for a
    pool at either end of its storage, nor for a transposed view; guarded_like keeps the pool's dtype (16-bit pools
    too) and works for a pool of one slot."""
    from ddsim.engines import GUARD, beside, guarded_like
    from ddsim.engines.check_kernel import _bits
    assert beside(torch.zeros(6, 2, 3)[1:]) is None  # a slot before it, none after
    assert beside(torch.zeros(6, 2, 3)[:-1]) is None  # one after, none before
    assert beside(guarded_like(torch.zeros(5, 2, 3)).transpose(-1, -2)) is None
    one = guarded_like(torch.ones(1, 2, 3))
    assert one.shape == (1, 2, 3) and all(bool((_bits(e) == GUARD[4]).all()) for e in beside(one))
    half = guarded_like(torch.ones(4, 3, dtype=torch.float16))
    assert half.dtype == torch.float16 and all(bool((_bits(e) == GUARD[2]).all()) for e in beside(half))
    assert bool(torch.isnan(beside(half)[0]).all()) and bool(torch.isnan(beside(one)[1]).all())
    double = guarded_like(torch.ones(2, 3, dtype=torch.float64))
    assert all(bool((_bits(e) == GUARD[8]).all()) for e in beside(double))


def test_an_adapters_copy_carries_its_slot_writes_back_and_its_guard_writes_only_when_guarded():
    """reflect_writes: a slot the engine wrote in its [N, HV, V, K] copy goes back transposed into the caller's
    [N, HV, K, V] pool, no other; a write to the copy's guard reaches the caller's guard only when the copy was made
    by guarded_like (vLLM's copy has its null block and scratch slots beside the pool, which it may write)."""
    from ddsim.engines import beside, guarded_like, reflect_writes
    from ddsim.engines.check_kernel import _bits
    caller = guarded_like(torch.randn(4, 2, 3, 5))
    engine = guarded_like(caller.transpose(-1, -2))
    theirs = _bits(caller).clone()
    engine[2] += 1.0
    reflect_writes(engine, caller)
    assert torch.equal(caller[2], engine[2].transpose(-1, -2))
    assert torch.equal(_bits(caller)[[0, 1, 3]], theirs[[0, 1, 3]])
    ends = [_bits(e).clone() for e in beside(caller)]
    vpool = torch.zeros(6, 2, 5, 3)  # a copy beside which the engine keeps slots of its own
    plain = vpool[1:5]
    plain.copy_(caller.transpose(-1, -2))
    vpool[0] = 7.0
    reflect_writes(plain, caller)
    assert all(torch.equal(_bits(e), x) for e, x in zip(beside(caller), ends))


def test_a_batch_slot_0_written_is_the_batchs_and_a_single_call_example_is_called_once():
    """_pool_writes counts slot 0 as any other slot of the batch (a write there is the committed state's, not another
    slot's); an example of one call (the quick profile's) calls the kernel once."""
    from ddsim.engines import guarded_like
    from ddsim.engines.check_kernel import _bits, _pool_writes
    pool = guarded_like(torch.randn(4, 3))
    before = _bits(pool).clone()
    pool[0] += 1.0
    assert _pool_writes(pool, before, torch.tensor([0, 2, -1], dtype=torch.int32)) == {
        "committed_untouched": False, "others_untouched": True, "written_slots": [0]}
    n = []
    inp = {"burst": 1, "parents": torch.tensor([[-1, 0]]), "slots": torch.tensor([1], dtype=torch.int32),
           "pool": torch.zeros(2, 4), "x": torch.zeros(1, 2)}
    ck._calls(lambda a, p, s: n.append(1) or torch.zeros(1, 2), inp, ("x",), "cpu")
    assert len(n) == 1


def _node_inp(B=3, T=4, rows=(4, 0, 2), M=5, P=6, slots=(1, 3, -1), burst=1):
    return {"burst": burst, "parents": torch.tensor([[-1] + list(range(T - 1))] * B),
            "slots": torch.tensor(slots, dtype=torch.int32), "pool": torch.zeros(4, 2, 3), "x": torch.zeros(B, T),
            "node_rows": torch.tensor(rows, dtype=torch.int32), "node_buffer": (M, P)}


def test_node_state_writes_are_read_by_row_and_step_with_the_guards():
    """_node_writes: the batch's rows' first T steps are the node states; a write past T in a batch row, to another
    row or to either guard row is outside ((row, step); -1 and M the guards); a padded row's whole row is the
    engine's own; a drawn input (no layout) takes its rows reversed in one row and one step more."""
    inp = _node_inp()
    real = inp["slots"] >= 0
    assert [t.tolist() if hasattr(t, "tolist") else t for t in ck._node_layout(inp)] == [[4, 0, 2], 5, 6]
    drawn = ck._node_layout({"parents": torch.zeros(3, 7)})
    assert [drawn[0].tolist(), *drawn[1:]] == [[2, 1, 0], 4, 8] and drawn[0].dtype == torch.int32

    def written(*entries, guard=None):
        buf, rows = ck._node_buffer(inp, (2, 3), "cpu")
        assert rows.tolist() == [4, 0, 2] and buf.shape == (5, 6, 2, 3) and bool(torch.isnan(buf).all())
        for r, s in entries:
            buf[r, s] = 1.0
        if guard is not None:
            from ddsim.engines import beside
            beside(buf)[guard][0, 0, 0] = 0.0
        return ck._node_writes(buf, inp, real)
    w = written((4, 0), (0, 3), (2, 5))  # the batch's own (row 2 is the padded row's: any step)
    assert w["node_others_untouched"] and w["node_written"] == [] and w["node_vals"].shape == (3, 4, 2, 3)
    assert bool((w["node_vals"][0, 0] == 1).all()) and bool(torch.isnan(w["node_vals"][0, 1]).all())
    assert written((4, 4))["node_written"] == [[4, 4]]  # past T in a batch row
    assert written((1, 0), (3, 2))["node_written"] == [[1, 0], [3, 2]]  # rows no sequence has
    assert written(guard=0)["node_written"] == [[-1, 0]] and written(guard=1)["node_written"] == [[5, 0]]
    assert not written(guard=1)["node_others_untouched"]
    assert len(written(*[(1, s) for s in range(6)], *[(3, s) for s in range(6)])["node_written"]) == 8  # the first 8


def test_node_states_are_compared_with_the_oracles_and_repeated_calls_cover_them():
    """The node-state property holds each real sequence's kept states within the dtype's bound of the oracle's (a
    padded row's aside, an error at the bound holds, past it fails); repeatable covers the kept states of real rows;
    the node rows are an index table the kernel must not write."""
    props = ck._properties("exact", nodes=True)
    assert list(props)[-2:] == ["node states exact on every node", "other node-state entries untouched"]
    assert list(ck._properties("leaky", nodes=True))[-2] == "node states flattened on every node"
    assert "node states exact on every node" not in ck._properties("exact")
    # a FAILED line is "FAILED <name>: <where>": no name holds the colon a reader splits it at
    assert not [n for m in ("exact", "leaky") for n in ck._properties(m, nodes=True) if ":" in n]
    ref = torch.zeros(2, 3, 4, dtype=torch.float64)
    bound = ck._bound(ref, torch.bfloat16)  # the input dtype's bound, not float32's
    assert bound > ck._bound(ref, torch.float32)
    r = {"node_vals": ref.clone(), "ref_states": ref, "real": torch.tensor([True, False]),
         "dtype": torch.bfloat16, "node_others_untouched": True}
    check = props["node states exact on every node"]
    assert check(r)
    r["node_vals"][1] = float("nan")  # the padded row's: the engine's own
    assert check(r)
    r["node_vals"][0, 2, 1] = bound  # an error at the bound holds
    assert check(r)
    r["node_vals"][0, 2, 1] = 2 * bound
    assert not check(r)
    r["node_vals"][0, 2, 1] = float("nan")
    assert not check(r)
    untouched = props["other node-state entries untouched"]
    assert untouched(r) is True and untouched({**r, "node_others_untouched": False}) is False

    calls = iter(range(100))

    def kernel(noisy_row, write_rows=False):
        def call(args, pool, slots, node):
            buf, rows = node
            buf[rows.long(), :4] = pool[slots.long().clamp(min=0), None]  # [B, T, 2, 3]: the pool's rows
            buf[rows[noisy_row].long(), 0] = float(next(calls))  # differs on every call
            if write_rows:
                rows[0] = rows[1]
            return args["x"].clone()
        return call
    inp = _node_inp(burst=3)
    inp["pool"] = torch.arange(24.0).view(4, 2, 3)
    out = ck._calls(kernel(2), inp, ("x",), "cpu", node_shape=(2, 3))
    assert out["repeatable"] and out["node_others_untouched"] and not out["inputs_changed"]
    assert out["real"].tolist() == [True, True, False] and out["o"].shape == (3, 4)
    assert torch.equal(out["node_vals"][1, 1], inp["pool"][3])  # the pool and slots the kernel was handed
    assert ck._calls(kernel(0), inp, ("x",), "cpu", node_shape=(2, 3))["repeatable"] is False
    assert ck._calls(kernel(2, write_rows=True), inp, ("x",), "cpu", node_shape=(2, 3))["inputs_changed"] == ["node rows"]
    assert inp["node_rows"].tolist() == [4, 0, 2]  # the kernel wrote its copy, not the example
    assert "node_vals" not in ck._calls(lambda a, p, s: torch.zeros(3, 4), inp, ("x",), "cpu")


def test_an_adapters_buffer_copy_carries_back_the_rows_it_wrote_and_its_guard_writes(monkeypatch):
    """reflect_writes on a per-node state buffer: each row of the engine's guarded copy that now differs goes back
    into the caller's buffer (transposed, or as it is), no other, whatever rows a chunk of the comparison holds; a
    write to the copy's guard row reaches the caller's guard row."""
    from ddsim import engines
    from ddsim.engines import beside, guarded_like, reflect_writes
    from ddsim.engines.check_kernel import _bits
    for transposed, rows_a_chunk in ((True, 4), (False, 4), (True, 1), (False, 3)):
        monkeypatch.setattr(engines, "REFLECT_CHUNK", rows_a_chunk * 3 * 2 * 5 * 4)  # bytes of that many rows
        caller = guarded_like(torch.full((4, 3, 2, 5), float("nan")))
        engine = guarded_like(caller.transpose(-1, -2) if transposed else caller)
        theirs = _bits(caller).clone()
        engine[3, 2] = 1.0  # the last row
        beside(engine)[1].zero_()
        reflect_writes(engine, caller, transposed=transposed)
        back = engine[3].transpose(-1, -2) if transposed else engine[3]
        assert torch.equal(_bits(caller[3]), _bits(back)) and torch.equal(_bits(caller)[[0, 1, 2]], theirs[[0, 1, 2]])
        assert bool((beside(caller)[1] == 0).all()) and not bool((beside(caller)[0] == 0).any())
    caller = guarded_like(torch.zeros(2, 3, 4, 5))
    engine = guarded_like(caller.transpose(-1, -2))
    engine[0] = 1.0
    reflect_writes(engine, caller)  # transposed unless told
    assert bool((caller[0] == 1).all())
    plain = torch.zeros(2, 3, 4)  # a caller's buffer without guard rows: its rows come back, nothing else
    engine = guarded_like(plain)
    engine[1] = 2.0
    beside(engine)[0].zero_()
    reflect_writes(engine, plain, transposed=False)
    assert bool((plain[1] == 2).all()) and bool((plain[0] == 0).all())
    # a copy that guarded_like did not make (vLLM's: the buffer's entries after the pool's slots in one tensor): what
    # lies beside it is the engine's, not a guard row
    caller = guarded_like(torch.zeros(2, 3, 4))
    vpool = torch.full((6, 3, 4), 5.0)
    engine = vpool[2:4]
    engine.copy_(caller)
    reflect_writes(engine, caller, transposed=False)
    from ddsim.engines import GUARD
    assert all(bool((_bits(e) == GUARD[4]).all()) for e in beside(caller)) and bool((caller == 0).all())
    one = torch.zeros(1, 2, 3)  # a pool of one slot: its chunk is sized by that slot
    engine = guarded_like(one.transpose(-1, -2))
    engine[0, 1, 0] = 4.0
    reflect_writes(engine, one)
    assert one[0, 0, 1] == 4.0 and int((one != 0).sum()) == 1


def test_a_windows_buffer_takes_its_pools_dtype():
    """A conv's node windows lie in a buffer of its window pool's dtype (bf16 here): NaN in that dtype, whose bits
    mark an entry unwritten, so an untouched bf16 buffer reads untouched and one write to another row is seen."""
    inp = _node_inp()
    real = inp["slots"] >= 0
    buf, _ = ck._node_buffer(inp, (2, 3), "cpu", torch.bfloat16)
    assert buf.dtype == torch.bfloat16 and bool(torch.isnan(buf).all())
    assert ck._node_writes(buf, inp, real)["node_others_untouched"]
    buf[1, 0] = 1.0
    assert ck._node_writes(buf, inp, real)["node_written"] == [[1, 0]]

    def kernel(args, pool, slots, node):
        assert node[0].dtype == torch.bfloat16
        return args["x"].clone()
    assert ck._calls(kernel, inp, ("x",), "cpu", node_shape=(2, 3), node_dtype=torch.bfloat16)["node_others_untouched"]


def _commit_inp():
    """Three sequences (the last padded), node states kept in rows (4, 0, 2) of a 5 x 6 buffer, a pool of 4 slots."""
    from ddsim.trees.tree import Tree
    inp = _node_inp()
    inp["trees"] = [Tree([-1, 0, 0, 1], [1, 2, 3, 4]), Tree([-1, 0, 1, 2], [1, 2, 3, 4]), Tree([-1, 0, 0, 0], [1, 2, 3, 4])]
    inp["pool"] = torch.arange(24.0).view(4, 2, 3)
    return inp


def _kept(inp):
    """A verify's kept buffer for _commit_inp: entry (row, step) holds 100 row + step (NaN outside the batch's rows)."""
    buf, _ = ck._node_buffer(inp, (2, 3), "cpu")
    for r in (4, 0, 2):
        for t in range(4):
            buf[r, t] = 100.0 * r + t
    return buf


def _copy_commit(*, pool, buffer, slots, rows, accepted):
    """The contract's commit, plainly."""
    for b in range(len(slots)):
        if accepted[b] >= 0 and slots[b] >= 0:
            pool[:, slots[b]] = buffer[:, rows[b], accepted[b]]


def test_a_commits_nodes_and_layers_are_what_the_verify_kept_times_exact_factors():
    """_accepted takes each sequence's deepest node, its root, its last node or none, by b % 4 (an example may say);
    _layer_factor gives the last layer the kept values themselves and every other a power of two, negated, no two
    neighbours alike, exact in fp32, bf16 and fp16 (in their normal range)."""
    from ddsim.trees.tree import Tree
    trees = [Tree([-1, 0, 1, 0, 3, 4], [0, 1, 2, 3, 4, 5])] * 6
    assert ck._accepted({"trees": trees}).tolist() == [5, 0, 5, -1, 5, 0]
    assert ck._accepted({"trees": [Tree([-1, 0, 1, 0], [0, 1, 2, 3])] * 3}).tolist() == [2, 0, 3]
    assert ck._accepted({"trees": trees, "accepted": torch.tensor([1, 2], dtype=torch.int32)}).tolist() == [1, 2]
    assert ck._accepted({"trees": trees}).dtype == torch.int32
    assert [ck._layer_factor(l, 3) for l in range(3)] == [-0.25, -0.5, 1.0]
    f = [ck._layer_factor(l, 48) for l in range(48)]
    assert f[-1] == 1.0 and f[-2] == -0.5 and f[-9] == -2.0 ** -8 and f[-10] == -0.5 and f[0] == -2.0 ** -7
    assert all(a != b for a, b in zip(f, f[1:]))
    x = torch.tensor([1.2345678, -0.75, 7.0])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        y = x.to(dtype)
        assert all(torch.equal((y * v) / v, y) for v in f)  # exact: undone bit for bit


def test_a_commit_is_run_on_every_layer_and_each_slot_read_back():
    """_commit_writes: a right copy commits each sequence that accepted a node (not the padded one, not one that
    accepted none) in every layer, the slot's value the kept entry times the layer's factor; nothing else written."""
    inp = _commit_inp()
    inp["accepted"] = torch.tensor([3, -1, 1], dtype=torch.int32)
    w = ck._commit_writes(_copy_commit, _kept(inp), inp, "cpu")
    assert w["commit_layers"] == 2 and w["commit_done"].tolist() == [True, False, False]
    assert w["commit_others_untouched"] and w["commit_written"] == [] and w["commit_tables_written"] == []
    assert w["commit_vals"].shape == (2, 3, 2, 3) and w["commit_kept"].shape == (2, 3, 2, 3)
    assert bool((w["commit_vals"][1, 0] == 403.0).all()) and bool((w["commit_vals"][0, 0] == -201.5).all())
    assert torch.equal(w["commit_vals"][:, 1], torch.stack([-0.5 * inp["pool"][3], inp["pool"][3]]))  # kept
    assert torch.equal(w["commit_kept"][:, 0], w["commit_vals"][:, 0])
    assert "commit_error" not in w and ck._commit_miscopied(w) == []
    four = ck._commit_writes(_copy_commit, _kept(inp), {**inp, "commit_layers": 4}, "cpu")
    assert four["commit_vals"].shape[0] == 4 and bool((four["commit_vals"][0, 0] == -403.0 / 8).all())


def test_a_commits_stray_writes_are_found_by_layer_slot_row_and_step_with_the_guards():
    """_commit_writes' stray writes: a pool slot no committing sequence holds (sequence 1 accepted none), by (layer,
    slot); the kept states by (layer, row, step); the guards beside the layers' pool (0, -1) / (L-1, N) and beside
    their buffer (0, -1, 0) / (L-1, M, 0); the index tables by name; the first 8; a commit that raises, its error."""
    inp = _commit_inp()
    inp["accepted"] = torch.tensor([3, -1, 1], dtype=torch.int32)

    def commit(extra):
        def run(*, pool, buffer, slots, rows, accepted):
            _copy_commit(pool=pool, buffer=buffer, slots=slots, rows=rows, accepted=accepted)
            extra(pool, buffer, slots, rows, accepted)
        return run

    def written(extra):
        w = ck._commit_writes(commit(extra), _kept(inp), inp, "cpu")
        return w["commit_written"], w["commit_tables_written"], w["commit_others_untouched"]
    assert written(lambda p, b, s, r, a: None) == ([], [], True)

    def stray(p, b, s, r, a):
        p[1, 0] = 7.0  # a slot no sequence holds
        p[0, 3] = 7.0  # sequence 1's slot in layer 0
        b[1, 4, 5] = 7.0  # the kept states
    assert written(stray) == ([[0, 3], [1, 0], [1, 4, 5]], [], False)
    from ddsim.engines import beside
    assert written(lambda p, b, s, r, a: beside(p.flatten(0, 1))[0].fill_(0.0))[0] == [[0, -1]]
    assert written(lambda p, b, s, r, a: beside(p.flatten(0, 1))[1].fill_(0.0))[0] == [[1, 4]]
    assert written(lambda p, b, s, r, a: beside(b.flatten(0, 1))[1].fill_(0.0))[0] == [[1, 5, 0]]
    assert written(lambda p, b, s, r, a: a.fill_(0)) == ([], ["accepted"], False)
    assert written(lambda p, b, s, r, a: r.fill_(0))[1] == ["rows"]
    assert len(written(lambda p, b, s, r, a: b.fill_(1.0))[0]) == 8  # the first 8

    def raises(**kw):
        raise ValueError("only CUDA tensors")
    w = ck._commit_writes(raises, _kept(inp), inp, "cpu")
    assert w["commit_error"] == "ValueError: only CUDA tensors" and w["commit_done"].tolist() == [True, False, False]


def test_the_commit_properties_hold_a_right_copy_and_fail_each_wrong_one():
    """The three commit properties, their names and order after the node-state ones; the oracle's is held within the
    input dtype's bound on the last layer (the verify's own states), the copy bit for bit on every layer; a commit that
    raised fails all three; each counterexample names its layer, sequence and node, and its line says so."""
    props = ck._properties("exact", nodes=True, commit=True)
    names = list(props)[-3:]
    assert names == ["committed state exact at the accepted node", "committed state the kept node state bit for bit",
                     "commit writes nothing else"]
    assert list(ck._properties("leaky", nodes=True, commit=True))[-3] == "committed state flattened at the accepted node"
    assert names[0] not in ck._properties("exact", nodes=True) and not [n for n in names if ":" in n]
    inp = _commit_inp()
    inp["accepted"] = torch.tensor([3, 0, 1], dtype=torch.int32)
    kept = _kept(inp)
    ref = torch.full((3, 4, 2, 3), float("nan"), dtype=torch.float64)
    for b, r in enumerate((4, 0, 2)):
        for t in range(4):
            ref[b, t] = 100.0 * r + t

    def run(commit):
        return {**ck._commit_writes(commit, kept, inp, "cpu"), "ref_states": ref, "dtype": torch.float32}
    r = run(_copy_commit)
    assert [props[n](r) for n in names] == [True, True, True]
    bound = ck._bound(ref[:2], torch.float32)

    def nudged(layer, by):
        def commit(**kw):
            _copy_commit(**kw)
            kw["pool"][layer, 3] += by  # sequence 1's slot
        return commit
    assert [props[n](run(nudged(1, bound / 2))) for n in names] == [True, False, True]
    off = run(nudged(1, 4 * bound))
    assert [props[n](off) for n in names] == [False, False, True]
    assert [props[n](run(nudged(0, 1.0))) for n in names] == [True, False, True]  # another layer: the copy's alone
    ce = ck._describe_commit(off, names[0], torch.float32)
    assert ce["first_wrong"] == {"sequence": 1, "node": 0, "max_abs_error": pytest.approx(4 * bound, rel=1e-6),
                                 "bound": bound}
    assert ce["layers"] == 2 and ce["accepted"] == [3, 0, 1]
    ce = ck._describe_commit(run(nudged(0, 1.0)), names[1], torch.float32)
    assert ce["first_wrong"] == {"layer": 0, "sequence": 1, "node": 0, "max_abs_difference": 1.0}

    def unwritten(**kw):  # a NaN committed: its difference is inf, not NaN
        _copy_commit(**kw)
        kw["pool"][1, 3, 0, 0] = float("nan")
    ce = ck._describe_commit(run(unwritten), names[1], torch.float32)
    assert ce["first_wrong"] == {"layer": 1, "sequence": 1, "node": 0, "max_abs_difference": float("inf")}

    def raises(**kw):
        raise RuntimeError("no")
    bad = run(raises)
    assert [props[n](bad) for n in names] == [False, False, False]
    assert ck._describe_commit(bad, names[2], torch.float32)["error"] == "RuntimeError: no"


def test_a_commit_counterexamples_line():
    base = {"example": "drawn", "property": "commit writes nothing else", "first_wrong_node": None,
            "trees": [{"parents": [-1, 0]}, {"parents": [-1, 0, 0]}], "pool": {"slots": 4, "batch_slots": [1, 3]},
            "node_buffer": {"rows": 5}}
    c = {"layers": 2, "accepted": [1, -1], "first_wrong": None, "written": [[0, -1], [1, 2, 3]], "tables_written": []}
    assert ck._where({**base, "commit": c}) == (
        "nodes accepted [1, -1] (-1: none), slots [1, 3] of 4 in each of 2 layers; written besides the committed "
        "slots: (layer, slot) and (layer, row, step) [[0, -1], [1, 2, 3]] (slot -1 or 4, row -1 or 5: the guards)")
    c2 = {**c, "written": [[1, 2]], "tables_written": ["rows"]}
    assert ck._where({**base, "example": "e", "commit": c2}) == (
        "serving example [e]: nodes accepted [1, -1] (-1: none), slots [1, 3] of 4 in each of 2 layers; written "
        "besides the committed slots: (layer, slot) and (layer, row, step) [[1, 2]], and its index tables rows")
    wrong = {"sequence": 1, "node": 2, "max_abs_error": 0.5, "bound": 1e-5}
    assert ck._where({**base, "property": "committed state exact at the accepted node",
                      "commit": {**c, "first_wrong": wrong}}) == (
        "sequence 1's committed state (accepted node 2, parents [-1, 0, 0], 2 layers) off the oracle's by 0.5 > 1e-05")
    copy = {"layer": 0, "sequence": 0, "node": 1, "max_abs_difference": 0.25}
    assert ck._where({**base, "property": "committed state the kept node state bit for bit",
                      "commit": {**c, "first_wrong": copy}}) == (
        "layer 0 of 2, sequence 0: its slot after the commit is not the kept state of its accepted node 1 (parents "
        "[-1, 0]) bit for bit (max difference 0.25)")
    assert ck._where({**base, "commit": {**c, "error": "ValueError: x"}}) == "the commit raised ValueError: x"


def test_a_commit_that_ends_the_cuda_context_is_named_as_the_fault(monkeypatch):
    """A commit whose error ended the device's CUDA context (a kernel fault: every later call raises) is raised as a
    CommitFault naming the commit's error, so the example fails every property with that line; an error that leaves
    the context (or any error on the CPU) is the commit's alone."""
    e = ValueError("CUDA error: an illegal memory access was encountered")
    assert ck._raise_if_context_lost(e, torch.device("cpu")) is None
    monkeypatch.setattr(ck, "_context_lost", lambda device: False)
    assert ck._raise_if_context_lost(e, torch.device("cuda", 0)) is None
    monkeypatch.setattr(ck, "_context_lost", lambda device: True)
    assert ck._raise_if_context_lost(e, torch.device("cpu")) is None
    with pytest.raises(ck.CommitFault, match=r"^the commit faulted \(ValueError: CUDA error: an illegal memory access "
                                             r"was encountered\), which ends the device's CUDA context"):
        ck._raise_if_context_lost(e, torch.device("cuda", 0))


def test_a_kernels_commit_runs_only_where_it_keeps_the_node_states_of_an_op_it_commits():
    from ddsim.engines import EngineKernel
    k = EngineKernel("k", ("exact", "leaky"), None, commit=_copy_commit, commit_ops=("gdn", "conv"),
                     node_states=(("gdn", "exact"), ("conv", "leaky"), ("mamba2", "exact")))
    assert k.commits("gdn", "exact") and k.commits("conv", "leaky")
    assert not k.commits("gdn", "leaky") and not k.commits("mamba2", "exact") and not k.commits("conv", "exact")
    assert not EngineKernel("k", ("exact",), None, commit_ops=("gdn",), node_states=(("gdn", "exact"),)).commits(
        "gdn", "exact")  # no commit


def test_a_commit_runs_once_after_the_first_call_on_what_it_kept():
    """_calls with a commit: it runs once, after the first of the example's calls, on the buffer that call kept (its
    op bound by the caller), and its results join the run's."""
    inp = _commit_inp()
    inp["burst"] = 3
    inp["accepted"] = torch.tensor([2, 1, -1], dtype=torch.int32)
    seen = []

    def kernel(args, pool, slots, node):
        buf, rows = node
        buf[rows.long(), :4] = 7.0 + len(seen)  # what this call keeps
        return args["x"].clone()

    def commit(**kw):
        seen.append(kw["buffer"][1, 4, 2].clone())  # layer 1's (the kept values themselves) row 4, step 2
        _copy_commit(**kw)
    out = ck._calls(kernel, inp, ("x",), "cpu", node_shape=(2, 3), commit=commit)
    assert len(seen) == 1 and bool((seen[0] == 7.0).all())
    assert out["commit_done"].tolist() == [True, True, False] and out["commit_others_untouched"]
    assert bool((out["commit_vals"][1, :2] == 7.0).all()) and bool((out["commit_vals"][0, :2] == -3.5).all())
    assert "commit_vals" not in ck._calls(kernel, inp, ("x",), "cpu", node_shape=(2, 3))


def test_a_commits_edges_slot_0_its_tables_the_buffers_first_guard_and_long_errors():
    inp = _commit_inp()
    inp["slots"] = torch.tensor([0, 3, -1], dtype=torch.int32)  # slot 0 is a slot
    inp["accepted"] = torch.tensor([1, 2, 0], dtype=torch.int32)
    w = ck._commit_writes(_copy_commit, _kept(inp), inp, "cpu")
    assert w["commit_done"].tolist() == [True, True, False] and w["commit_others_untouched"]
    assert bool((w["commit_vals"][1, 0] == 401.0).all())

    def also(extra):
        def run(**kw):
            _copy_commit(**kw)
            extra(kw)
        return run
    w = ck._commit_writes(also(lambda kw: kw["slots"].fill_(0)), _kept(inp), inp, "cpu")
    assert w["commit_tables_written"] == ["slots"] and inp["slots"].tolist() == [0, 3, -1]  # its copy, not the example
    from ddsim.engines import beside
    w = ck._commit_writes(also(lambda kw: beside(kw["buffer"].flatten(0, 1))[0].fill_(0.0)), _kept(inp), inp, "cpu")
    assert w["commit_written"] == [[0, -1, 0]]

    def raises(**kw):
        raise ValueError("x" * 400)
    assert ck._commit_writes(raises, _kept(inp), inp, "cpu")["commit_error"] == "ValueError: " + "x" * 299 + "…"


def test_a_commit_counterexample_in_the_json_and_its_edges():
    """_describe of a commit property carries the commit's record (layers, nodes accepted, first wrong entry or the
    entries written); the oracle's property holds at its bound (in the input dtype's) and reads the last layer (of
    three here); a sequence that commits nothing may hold NaN in its slot."""
    from ddsim.trees.tree import Tree
    inp = _commit_inp()
    inp["accepted"] = torch.tensor([3, -1, 1], dtype=torch.int32)
    inp["pool"][3] = float("nan")  # sequence 1's slot: it commits nothing
    inp.update(label="e", x=torch.zeros(3, 4, 2), weight=torch.zeros(2, 3), bias=None,  # a conv's example
               trees=[Tree([-1, 0, 0, 1], [1, 2, 3, 4])] * 3, commit_layers=3)
    kept = _kept(inp)
    ref = torch.zeros(3, 4, 2, 3, dtype=torch.float64)
    ref[0, 3] = 403.0
    props = ck._properties("exact", nodes=True, commit=True)
    oracle, copy, elsewhere = list(props)[-3:]

    def run(commit, dtype=torch.float32):
        return {**ck._commit_writes(commit, kept, inp, "cpu"), "ref_states": ref, "dtype": dtype, "o": torch.zeros(3, 4, 1),
                "ref": {"exact": torch.zeros(3, 4, 1)}, "real": torch.tensor([True, True, False]),
                "order_exact": torch.ones(3, 4, dtype=torch.bool), "written_slots": [], "inputs_changed": [],
                "repeatable": True, "node_vals": ref.clone(), "node_written": []}
    r = run(_copy_commit)
    assert props[oracle](r) and props[copy](r) and props[elsewhere](r)
    b32, b16 = ck._bound(ref, torch.float32), ck._bound(ref, torch.bfloat16)

    def nudged(by, layer=2):
        def commit(**kw):
            _copy_commit(**kw)
            kw["pool"][layer, 1] += by  # sequence 0's slot
        return commit
    ref[0, 3, 0, 0] = 403.0 - b32  # the committed 403 lies at the bound exactly
    assert props[oracle](run(_copy_commit))
    ref[0, 3, 0, 0] = 403.0
    layer1 = run(nudged(1.0, layer=1))  # the last of three layers is the one held to the oracle; every one is copied
    assert props[oracle](layer1) and not props[copy](layer1)
    assert props[oracle](run(nudged(4.0), torch.bfloat16)) and not props[oracle](run(nudged(4.0)))
    assert b32 < 4.0 < b16
    off = run(nudged(4.0))
    d = ck._describe(inp, off, oracle, "exact")
    assert d["commit"] == {"layers": 3, "accepted": [3, -1, 1], "first_wrong": {
        "sequence": 0, "node": 3, "max_abs_error": 4.0, "bound": b32}}
    d = ck._describe(inp, run(nudged(2.0, layer=0)), copy, "exact")
    assert d["commit"]["first_wrong"] == {"layer": 0, "sequence": 0, "node": 3, "max_abs_difference": 2.0}

    def stray(**kw):
        _copy_commit(**kw)
        kw["pool"][0, 0] = 1.0
    d = ck._describe(inp, run(stray), elsewhere, "exact")
    assert d["commit"] == {"layers": 3, "accepted": [3, -1, 1], "first_wrong": None, "written": [[0, 0]],
                           "tables_written": []}
    assert ck._where(d).startswith("serving example [e]: nodes accepted [3, -1, 1] (-1: none), slots [1, 3, -1] of 4 "
                                   "in each of 3 layers; written besides the committed slots")


def test_a_commit_lines_guard_note_by_pool_slot_or_buffer_row():
    base = {"example": "drawn", "property": "commit writes nothing else", "first_wrong_node": None,
            "trees": [{"parents": [-1]}], "pool": {"slots": 4, "batch_slots": [1]}, "node_buffer": {"rows": 5}}

    def line(written, tables=()):
        c = {"layers": 2, "accepted": [0], "first_wrong": None, "written": written, "tables_written": list(tables)}
        return ck._where({**base, "commit": c})
    note = " (slot -1 or 4, row -1 or 5: the guards)"
    assert line([[1, 4]]).endswith(note) and line([[0, 5, 0]]).endswith(note) and line([[0, -1, 0]]).endswith(note)
    assert not line([[0, 4, 2]]).endswith(note) and not line([[1, 2]]).endswith(note)
    assert line([], ("rows", "slots")).endswith(", and its index tables rows, slots")
    none = {**base, "property": "committed state exact at the accepted node",
            "commit": {"layers": 2, "accepted": [1, -1], "first_wrong": None}}
    assert ck._where(none) == "nodes accepted [1, -1] over 2 layers"


def test_the_context_check_asks_about_the_commits_device_and_cuts_its_error(monkeypatch):
    asked = []
    monkeypatch.setattr(ck, "_context_lost", lambda device: asked.append(device) or True)
    with pytest.raises(ck.CommitFault) as e:
        ck._raise_if_context_lost(ValueError("y" * 300), torch.device("cuda", 1))
    assert asked == [torch.device("cuda", 1)]
    assert str(e.value) == ("the commit faulted (ValueError: " + "y" * 199 + "…), which ends the device's CUDA context: "
                            "nothing after it can be checked")


def test_a_committed_state_at_its_bound_holds_and_a_windows_commit_keeps_its_dtype():
    """The oracle's commit property holds an error equal to the bound (and the counterexample names the first sequence
    past it, in the input dtype's bound); a conv's bf16 windows are committed in bf16."""
    inp = _commit_inp()
    inp["accepted"] = torch.tensor([3, 2, 1], dtype=torch.int32)
    kept = _kept(inp)
    kept[4, 3] = 0.0  # sequence 0's accepted node: 0, so that an error can be the bound exactly
    ref = torch.zeros(3, 4, 2, 3, dtype=torch.float64)
    ref[1, 2] = 2.0
    ref[2] = 403.0  # the padded row's: sets the bound's scale and is never compared
    for dtype in (torch.float32, torch.bfloat16):
        b = ck._bound(ref, dtype)
        ref[0, 3, 0, 0] = -b
        r = {**ck._commit_writes(_copy_commit, kept, inp, "cpu"), "ref_states": ref, "dtype": dtype}
        props = ck._properties("exact", nodes=True, commit=True)
        assert props["committed state exact at the accepted node"](r)  # sequence 0 at the bound exactly
        ref[1, 2, 0, 0] = 2.0 + 2 * b
        assert not props["committed state exact at the accepted node"](r)
        first = ck._describe_commit(r, "committed state exact at the accepted node", dtype)["first_wrong"]
        assert first["sequence"] == 1 and first["bound"] == b
        ref[1, 2, 0, 0] = 2.0
    windows = {**inp, "pool": inp["pool"].to(torch.bfloat16)}
    w = ck._commit_writes(_copy_commit, kept.to(torch.bfloat16), windows, "cpu")
    assert w["commit_vals"].dtype == w["commit_kept"].dtype == torch.bfloat16 and w["commit_others_untouched"]


def _faulting(monkeypatch):
    """tests.planted_kernels' Fault, not yet hit, standing in for check_kernel's context check."""
    from tests import planted_kernels
    monkeypatch.setattr(planted_kernels.Fault, "hit", False)
    monkeypatch.setattr(ck, "_device_lost", planted_kernels.Fault.lost)
    return planted_kernels.Fault


def _quick_gdn_past_64():
    """The quick profile's GDN examples (float32) and the index of its 129-node one, where the planted faults strike."""
    from ddsim.engines import kernel_cases
    cases = kernel_cases.cases("gdn", "quick", torch.float32)
    return cases, next(i for i, c in enumerate(cases) if c["trees"][0].size == 129)


def _counted(kernel, calls: list):
    """``kernel`` whose verify appends each call's node count to ``calls``."""
    import dataclasses
    return dataclasses.replace(kernel, verify=lambda *a, **kw: calls.append(a[0].shape[1]) or kernel.verify(*a, **kw))


def test_after_a_fault_ends_the_context_nothing_runs_and_the_rest_is_named_unchecked(monkeypatch, tmp_path):
    """A fault that ends the device's CUDA context (every later call raises its echo) fails every property with the
    faulting example's line; the explicit examples after it are not run but listed, the coverage counts only those run,
    no drawn input is searched (its raise would be the fault's echo, not the kernel's answer), and the JSON says
    where the context ended and what was not run."""
    import json

    from ddsim.engines import kernel_cases
    fault, calls = _faulting(monkeypatch), []
    res = ck.check(_counted(_load("tests.planted_kernels:faults_past_64_nodes"), calls), mode="exact", max_examples=5)
    cases, at = _quick_gdn_past_64()
    labels = [c["label"] for c in cases]
    assert 0 < at < len(labels) - 1  # examples before and after the fault
    assert res.lost_at == f"serving example [{labels[at]}]" and res.unchecked == labels[at + 1:]
    assert res.examples == at + 1 and calls[-1] == 129 and 129 not in calls[:-1]  # nothing ran after the fault
    assert res.coverage["tree"] == sorted({kernel_cases.describe(c)["tree"] for c in cases[:at + 1]})
    assert res.coverage["nodes"] == sorted({c["trees"][0].size for c in cases[:at + 1]})
    want = (f"{res.lost_at}: the kernel raised RuntimeError: {fault.ECHO}; no drawn input searched, nor the "
            f"{len(labels) - at - 1} serving examples after it run: a fault at {res.lost_at} ended the device's CUDA "
            "context")
    assert [r.detail for r in res] == [want] * len(res.properties) == [want] * 7
    assert [r.holds for r in res] == [False] * 7 and res.profile == "quick"
    assert all(r.counterexample["example"] == labels[at] for r in res)
    out = tmp_path / "check.json"
    ck.write_result(res, out, kernel={"name": "faults"}, environment={"device": "cpu"})
    doc = json.loads(out.read_text())
    assert doc["context_lost_at"] == res.lost_at and doc["unchecked_examples"] == labels[at + 1:] and not doc["holds"]
    assert doc["explicit_examples"] == at + 1
    fault.hit = False  # a run without a fault says so in its JSON too
    ck.write_result(ck.check(_load("ddsim"), mode="exact", max_examples=1), out, kernel={"name": "ddsim"},
                    environment={"device": "cpu"})
    doc = json.loads(out.read_text())
    assert doc["context_lost_at"] is None and doc["unchecked_examples"] == [] and doc["holds"]


def test_a_fault_on_a_drawn_input_stops_the_search_and_a_leak_unseen_before_a_fault_fails_as_not_searched(monkeypatch):
    """Past the explicit examples: the property whose drawn input faulted says the kernel raised there, the ones after
    it are not searched (said so, never run on the fault's echo). In leaky mode the leak seen on a serving example
    before a fault holds; one never seen fails as not searched, not as "never differed"."""
    import dataclasses

    from ddsim.engines import kernel_cases
    fault = _faulting(monkeypatch)
    drawn = []
    describe = kernel_cases.describe
    monkeypatch.setattr(kernel_cases, "describe", lambda inp, commit=False: drawn.append("label" not in inp)
                        or describe(inp, commit))
    ddsim_kernel = _load("ddsim")

    def faults_on_drawn_inputs(*a, **kw):
        if fault.hit or drawn[-1]:
            fault.hit = True
            raise RuntimeError(fault.ECHO)
        return ddsim_kernel.verify(*a, **kw)
    res = ck.check(dataclasses.replace(ddsim_kernel, verify=faults_on_drawn_inputs), mode="exact", max_examples=3)
    first, *rest = res.properties
    assert res.lost_at == f"a drawn input of property {first.name!r}" and res.unchecked == [] and res.examples == 13
    assert first.detail == f"the kernel raised RuntimeError: {fault.ECHO} on a drawn input" and len(rest) == 6
    assert [r.detail for r in rest] == [f"no drawn input searched: a fault at {res.lost_at} ended the device's CUDA "
                                        "context"] * 6 and [r.holds for r in res] == [False] * 7
    fault.hit = False
    leaky = {r.name: r for r in ck.check(_load("tests.planted_kernels:faults_past_64_nodes"), mode="leaky",
                                         max_examples=3)}
    assert leaky["leaks off order-exact nodes"].holds and not leaky["flattened semantics on every node"].holds
    fault.hit = True  # faults from the first call: no leak seen
    leaky = ck.check(_load("tests.planted_kernels:faults_past_64_nodes"), mode="leaky", max_examples=3)
    assert leaky.unchecked and leaky.properties[-1].name == "leaks off order-exact nodes"
    assert leaky.properties[-1].detail == (f"no leak seen before the fault; no drawn input searched, nor the "
                                           f"{len(leaky.unchecked)} serving examples after it run: a fault at "
                                           f"{leaky.lost_at} ended the device's CUDA context")
    assert leaky.properties[-1].holds is False


def test_a_raise_in_the_leaks_search_fails_the_leak_and_a_fault_there_is_named(monkeypatch):
    """In leaky mode, with no leak seen on a serving example, the leak is searched for on drawn inputs, after the
    properties' searches. A kernel that raises there fails the leak ("no leak seen", never an exception out of
    check), and a fault there is named as where the context ended."""
    import dataclasses

    import hypothesis
    fault = _faulting(monkeypatch)
    never_leaks = _load("tests.planted_kernels:exact_calling_itself_leaky")
    find, searches = hypothesis.find, []

    def counted_find(*a, **kw):
        searches.append(1)
        fault.hit = fault.hit or len(searches) == 8  # the leak's search, after the 7 properties'
        return find(*a, **kw)
    monkeypatch.setattr(hypothesis, "find", counted_find)

    def faults_once_hit(*a, **kw):
        if fault.hit:
            raise RuntimeError(fault.ECHO)
        return never_leaks.verify(*a, **kw)
    res = ck.check(dataclasses.replace(never_leaks, verify=faults_once_hit), mode="leaky", max_examples=2)
    assert len(searches) == 8 and len(res.properties) == 8 and res.unchecked == []
    assert res.lost_at == "a drawn input of the leak's search"
    leak = res.properties[-1]
    assert leak.name == "leaks off order-exact nodes" and leak.holds is False
    assert leak.detail == f"no leak seen: the kernel raised RuntimeError: {fault.ECHO} on a drawn input"


def test_the_command_line_says_where_the_context_ended_and_what_was_not_run(monkeypatch, capsys, tmp_path):
    from ddsim import cli
    fault = _faulting(monkeypatch)
    # --device cpu sets TRITON_INTERPRET in os.environ for good (as the command line must, before triton's import):
    # set here, so that it is gone after this test on a GPU machine, where a later command line would inherit it
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "ck.json"
    assert cli.main(["check-kernel", "--impl", "tests.planted_kernels:faults_past_64_nodes", "--convention", "ddsim",
                     "--mode", "exact", "--device", "cpu", "--max-examples", "2", "--out", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = next(line for line in lines if line.startswith("a fault at"))
    assert fault.hit and at == ("a fault at serving example [ddtree budget 128 top-k 4 T=129 B=1 H=1 HV=1 K=16 V=16 "
                                "gates mixed pool shuffled float32] ended the device's CUDA context: the 11 serving "
                                f"examples after it and every drawn input after it not run (named in {out})")
    assert lines[-1] == f"7 of 7 properties failed; counterexamples in {out}"
    fault.hit = False  # a fault on a drawn input: no serving example left unrun
    lost = ck.CheckResult([ck.PropertyResult("p", False, "x")], "quick", 8, {"nodes": [17]}, "a drawn input of property 'p'")
    monkeypatch.setattr(ck, "check", lambda *a, **kw: lost)
    assert cli.main(["check-kernel", "--impl", "ddsim", "--mode", "exact", "--device", "cpu", "--max-examples", "2",
                     "--out", str(out)]) == 1
    assert ("a fault at a drawn input of property 'p' ended the device's CUDA context: every drawn input after it not "
            f"run (named in {out})") in capsys.readouterr().out.splitlines()
    import json

    import triton
    doc = json.loads(out.read_text())  # the kernel by its files, and what it ran under
    assert doc["environment"]["triton"] == triton.__version__ and doc["environment"]["device"] == "cpu"
    assert doc["kernel"]["sources"]["gpu_backend/__init__.py"] == doc["kernel"]["source_sha256"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a device fault needs a GPU")
def test_a_real_device_fault_ends_the_run_and_names_what_was_not_run(tmp_path):
    """On a GPU (the command line in a fresh interpreter: the fault ends its CUDA context): a verify that stores to an
    illegal address on the 129-node example fails every property there, and the examples after it are named as not
    run, in the terminal and the JSON."""
    import json

    from tests.cli_runs import run_cli
    out = tmp_path / "ck.json"
    r = run_cli("check-kernel", "--impl", "tests.planted_kernels:faults_on_the_device_past_64_nodes", "--convention",
                "ddsim", "--mode", "exact", "--device", "cuda", "--profile", "quick", "--max-examples", "2", "--out",
                out)
    assert r.returncode == 1, r.stderr
    cases, at = _quick_gdn_past_64()
    labels = [c["label"] for c in cases]
    doc = json.loads(out.read_text())
    assert doc["context_lost_at"] == f"serving example [{labels[at]}]" and doc["unchecked_examples"] == labels[at + 1:]
    assert not any(p["holds"] for p in doc["properties"]) and doc["explicit_examples"] == at + 1
    assert all("illegal memory access" in p["detail"] and p["detail"].endswith("ended the device's CUDA context")
               for p in doc["properties"])
    assert (f"a fault at serving example [{labels[at]}] ended the device's CUDA context: the {len(labels) - at - 1} "
            f"serving examples after it and every drawn input after it not run (named in {out})") in r.stdout
