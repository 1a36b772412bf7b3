"""Replayed public calls (gpu_backend.fastcall) against the Python path, on a GPU: on hypothesis trees,
batches, dtypes, gates, pools and designs, the second call of a signature on a TreePlan is served in C++
and gives the same bits as the Python path with Triton's own dispatch; a call of another signature, and
bad input, take the Python path (which records the new signature, and raises as before); outputs are
NaN-poisoned when poisoning; replayed calls capture into CUDA graphs. GPU only (the extension's matching
and the recorder are tested on the CPU in tests/test_fastcall.py)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim.gpu_backend import fastcall, launch
from ddsim.properties.strategies import gdn_pool_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="replayed launches need a GPU")

BACKENDS = ["triton", "triton-wy-fused", "triton-wy-split", "triton-wy-fold", "triton-wy-head", "triton-recurrent"]


def _cuda(inp, dtype, fused):
    """The drawn layer on the GPU; with fused gates, (a, b, A_log, dt_bias) in place of (g, beta)."""
    x = {n: inp[n].cuda() for n in ("q", "k", "v", "g", "beta", "initial_state", "pool", "slots")}
    HV = x["v"].shape[2]
    if fused:
        x["a"], x["b"] = x.pop("g").to(dtype) + 0.3, x.pop("beta").to(dtype) - 0.5
        x["A_log"], x["dt_bias"] = torch.linspace(-1, 0.5, HV, device="cuda"), torch.linspace(0, 1, HV, device="cuda")
    return x


def _refill(x, seed):
    """Fresh values of the same signature (a new layer's inputs)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for n, t in x.items():
        if n in ("slots",) or not t.is_floating_point():
            out[n] = t
        elif n == "pool":
            out[n] = torch.where(torch.isnan(t), t, torch.randn(t.shape, generator=gen, device="cuda"))
        else:
            out[n] = torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype).reshape(t.shape)
            if n == "g":
                out[n] = -out[n].abs() * 0.3
            if n == "beta":
                out[n] = out[n].sigmoid()
    return out


def _verify(x, plan, *, pooled, slots, mode, backend, states):
    gates = {n: x[n] for n in ("g", "beta", "a", "b", "A_log", "dt_bias") if n in x}
    state = dict(initial_state=x["pool"], state_indices=slots) if pooled else dict(initial_state=x["initial_state"])
    return gb.gdn_tree_verify(x["q"], x["k"], x["v"], **gates, parents=plan, **state, mode=mode, backend=backend,
                              output_states=states)


def _commit(x, plan, *, pooled, slots, accepted, inplace):
    gates = {n: x[n] for n in ("g", "beta", "a", "b", "A_log", "dt_bias") if n in x}
    if pooled:
        return gb.gdn_tree_commit(x["k"], x["v"], **gates, parents=plan, accepted=accepted, initial_state=x["pool"],
                                  state_indices=slots, inplace=inplace)
    return gb.gdn_tree_commit(x["k"], x["v"], **gates, parents=plan, accepted=accepted,
                              initial_state=x["initial_state"])


def _python_path(fn):
    """fn() through the Python path with Triton's dispatch (no recipe is recorded or replayed)."""
    launch.DIRECT = False
    try:
        return fn()
    finally:
        launch.DIRECT = True


def _same(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(y, nan=7.0))


@settings(max_examples=16, deadline=None)
@given(inp=gdn_pool_inputs(max_batch=3, max_nodes=20), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       backend=st.sampled_from(BACKENDS), mode=st.sampled_from(["exact", "leaky"]), fused=st.booleans(),
       pooled=st.booleans(), states=st.booleans(), inplace=st.booleans(), data=st.data())
def test_replayed_calls_equal_the_python_path(inp, dtype, backend, mode, fused, pooled, states, inplace, data):
    states = states and backend == "triton-recurrent"
    for n in ("q", "k", "v"):
        inp[n] = inp[n].to(dtype)
    x1 = _cuda(inp, dtype, fused)
    x2 = _refill(x1, 1)
    B, T = inp["parents"].shape
    plan = gb.TreePlan(inp["parents"].cuda())
    slots = gb.checked_slots(x1["slots"], x1["pool"].shape[0], B, "cuda")
    accepted = gb.checked_accepted(data.draw(st.lists(st.integers(0, T - 1), min_size=B, max_size=B)), B, T, "cuda")
    kv = dict(pooled=pooled, slots=slots, mode=mode, backend=backend, states=states)
    served = fastcall.stats()["served"]
    first = _verify(x1, plan, **kv)  # recorded
    second = _verify(x2, plan, **kv)  # replayed
    # every backend's launches read the plan's cached tables (the recurrent kernels its int32 source table or its
    # root paths): replayed
    replayed = 1
    assert len(plan.fast_verify) == replayed and fastcall.stats()["served"] == served + replayed, fastcall.stats()
    ref_plan = gb.TreePlan(inp["parents"].cuda())
    _same(first, _python_path(lambda: _verify(x1, ref_plan, **kv)))
    _same(second, _python_path(lambda: _verify(x2, ref_plan, **kv)))
    # the commit: a new state, or written into the pool's slots in place (the pool returned)
    pool1, pool2 = x1["pool"].clone(), x2["pool"].clone()
    ck = dict(pooled=pooled, slots=slots, accepted=accepted, inplace=inplace)
    c1 = _commit(x1, plan, **ck)
    c2 = _commit(x2, plan, **ck)
    assert fastcall.stats()["served"] == served + replayed + 1 and len(plan.fast_commit) == 1, fastcall.stats()
    if pooled and inplace:
        assert c1 is x1["pool"] and c2 is x2["pool"]
    x1["pool"], x2["pool"] = pool1, pool2
    _same(c1, _python_path(lambda: _commit(x1, ref_plan, **ck)))
    _same(c2, _python_path(lambda: _commit(x2, ref_plan, **ck)))


def _layer(T=9, B=2, dtype=torch.bfloat16):
    from ddsim.bench.bench import ddtree_batch, kernel_inputs
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, H=2, HV=4, K=64, V=64, dtype=dtype)
    return gb.TreePlan(parents.cuda()), inp


def _qkv(inp):
    return {n: inp[n] for n in ("q", "k", "v", "g", "beta")}


def test_another_signature_takes_the_python_path_and_bad_input_still_raises():
    plan, inp = _layer()
    s0 = inp["initial_state"]
    gb.gdn_tree_verify(**_qkv(inp), parents=plan, initial_state=s0)
    served = fastcall.stats()["served"]
    as32 = {n: t.float() for n, t in _qkv(inp).items()}
    o = gb.gdn_tree_verify(**as32, parents=plan, initial_state=s0)  # another dtype: recorded, not served
    assert fastcall.stats()["served"] == served and len(plan.fast_verify) == 2
    _same(o, _python_path(lambda: gb.gdn_tree_verify(**as32, parents=gb.TreePlan(plan.parents), initial_state=s0)))
    bad = dict(_qkv(inp), g=inp["g"][:, :-1])  # g one node short
    with pytest.raises(ValueError, match="g: expected"):
        gb.gdn_tree_verify(**bad, parents=plan, initial_state=s0)
    with pytest.raises(ValueError, match="initial_state"):
        gb.gdn_tree_verify(**_qkv(inp), parents=plan, initial_state=s0[:1])
    strided = dict(_qkv(inp), q=inp["q"].transpose(1, 2).contiguous().transpose(1, 2))  # copied by the launcher
    n = fastcall.stats()["refused"].copy()
    gb.gdn_tree_verify(**strided, parents=plan, initial_state=s0)
    assert fastcall.stats()["refused"] != n and len(plan.fast_verify) == 2  # never recorded: a copy is read


def test_raw_indices_are_never_replayed_and_spend_no_try():
    plan, inp = _layer()
    acc = torch.tensor([3, 5], device="cuda")
    cargs = (inp["k"], inp["v"], inp["g"], inp["beta"])
    for _ in range(fastcall.MAX_RECIPES + 2):
        gb.gdn_tree_commit(*cargs, parents=plan, accepted=acc, initial_state=inp["initial_state"])
    assert plan.fast_commit == []  # value-checked every call: no recipe
    checked = gb.checked_accepted(acc, 2, plan.T, "cuda")
    served = fastcall.stats()["served"]
    for _ in range(2):  # the same plan's calls with checked indices: recorded, then replayed
        gb.gdn_tree_commit(*cargs, parents=plan, accepted=checked, initial_state=inp["initial_state"])
    assert len(plan.fast_commit) == 1 and fastcall.stats()["served"] == served + 1


def test_replayed_outputs_are_poisoned_when_poisoning():
    """A recipe that allocates and launches nothing: its output is NaN when poisoning, left as allocated
    otherwise (the Python path's C.alloc does the same)."""
    mod = fastcall.ext()
    x = torch.zeros(4, device="cuda")
    out = torch.empty(3, 5, device="cuda")
    recipe = mod.make(((True, x),), ((out, True),), (), ((fastcall.ALLOC, 0),), False, torch.cuda.current_device(), ())
    with gb.poisoned(True):
        assert torch.isnan(mod.call([recipe], torch.ones(4, device="cuda"))).all()
    with gb.poisoned(False):
        y = mod.call([recipe], torch.ones(4, device="cuda"))
    assert y.shape == (3, 5) and y.dtype == torch.float32


def test_replayed_calls_capture_into_cuda_graphs():
    plan, inp = _layer(T=17, B=1)
    s0 = inp["initial_state"]
    static = {n: t.clone() for n, t in _qkv(inp).items()}
    gb.gdn_tree_verify(**static, parents=plan, initial_state=s0)  # recorded outside the capture
    served = fastcall.stats()["served"]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = gb.gdn_tree_verify(**static, parents=plan, initial_state=s0)
    assert fastcall.stats()["served"] == served + 1
    for seed in (1, 2):
        new = _refill(static, seed)
        for n in static:
            static[n].copy_(new[n])
        g.replay()
        torch.cuda.synchronize()
        _same(o, _python_path(lambda: gb.gdn_tree_verify(**static, parents=gb.TreePlan(plan.parents), initial_state=s0)))


def test_one_tensor_as_two_arguments_is_replayed_for_the_same_tensor_only():
    """An engine passing one zeros tensor as both A_log and dt_bias: replayed while it does; distinct
    tensors there take the Python path (a replay would read the first for both)."""
    from ddsim.engines import fused_gates
    plan, inp = _layer()
    a, b = fused_gates(inp["g"], inp["beta"])
    zeros = torch.zeros(inp["v"].shape[2], device="cuda")
    qkv = {n: inp[n] for n in ("q", "k", "v")}

    def verify(A_log, dt_bias, p=plan):
        return gb.gdn_tree_verify(**qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, parents=p,
                                  initial_state=inp["initial_state"])
    verify(zeros, zeros)
    served = fastcall.stats()["served"]
    same = torch.zeros_like(zeros)
    o = verify(same, same)
    assert fastcall.stats()["served"] == served + 1
    _same(o, _python_path(lambda: verify(same, same, gb.TreePlan(plan.parents))))
    bias = torch.linspace(0, 1, zeros.numel(), device="cuda")
    o = verify(same, bias)
    assert fastcall.stats()["served"] == served + 1 and len(plan.fast_verify) == 2
    _same(o, _python_path(lambda: verify(same, bias, gb.TreePlan(plan.parents))))


@pytest.mark.parametrize("vk", [True, False])
def test_the_verify_into_a_callers_buffer_is_replayed_with_planned_rows_only(vk):
    """The drop-in's verify (states_out, SGLang's intermediate buffer): with rows planned once, the second call of a
    signature is served in C++ (the paths kernel) and leaves the buffer, every other row and node slot included, and
    the outputs as the Python path does, bit for bit; raw rows (value-checked per call) are never replayed."""
    from ddsim.gpu_backend import engine_api
    plan, inp = _layer()
    B, T = plan.B, plan.T
    HV, V, K = inp["v"].shape[2], inp["v"].shape[3], inp["q"].shape[3]
    gen = torch.Generator(device="cuda").manual_seed(3)
    base = torch.randn((B + 1, T + 2, HV, V, K) if vk else (B + 1, T + 2, HV, K, V), generator=gen, device="cuda")
    raw = torch.tensor([2, 0], device="cuda")
    rows = engine_api.plan_slots(base, raw)

    def verify(x, buf, p=plan, r=rows):
        return gb.gdn_tree_verify(**_qkv(x), parents=p, initial_state=inp["initial_state"],
                                  states_out=buf.transpose(-1, -2) if vk else buf, states_rows=r)
    served = fastcall.stats()["served"]
    verify(inp, base.clone())  # recorded
    x2 = _refill(_qkv(inp), 1)
    got_buf, want_buf = base.clone(), base.clone()
    o, out = verify(x2, got_buf)  # replayed
    assert fastcall.stats()["served"] == served + 1 and len(plan.fast_states) == 1, fastcall.stats()
    assert out.data_ptr() == got_buf.data_ptr()
    want_o, _ = _python_path(lambda: verify(x2, want_buf, gb.TreePlan(plan.parents)))
    _same(o, want_o)
    assert torch.equal(got_buf, want_buf) and not torch.equal(got_buf, base)
    for _ in range(fastcall.MAX_RECIPES + 1):
        verify(x2, got_buf, r=raw)
    assert len(plan.fast_states) == 1 and plan.fast_tries["states"] == 1  # raw rows: no recipe, no try spent
