"""gpu_backend.fastcall on a CPU: the extension builds; a recipe matches only arguments of the exact
signature it was recorded with; its parameters are the right pointers and bytes; and the recorder keeps
a recipe only when every tensor a kernel reads is accounted for. The replayed launches themselves are
compared with the Python path's on a GPU (properties/test_fastcall_gpu.py)."""
import struct
from types import SimpleNamespace

import pytest
import torch

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import checks, fastcall
from ddsim.gpu_backend import launch as launches

ARG, ALLOC, FIXED = fastcall.ARG, fastcall.ALLOC, fastcall.FIXED


@pytest.fixture(scope="module")
def ext():
    mod = fastcall.ext()
    assert mod is not None, fastcall.status()  # CI has a compiler and ninja: the extension must build
    return mod


def _args(**over):
    a = dict(q=torch.randn(1, 3, 2, 16), state=torch.randn(1, 2, 16, 16), mode="exact", scale=None, l2=True)
    a.update(over)
    return tuple(a.values())


def _recipe(ext, args, params=((ARG, 0), (ALLOC, 0), (FIXED, struct.pack("<i", 7) + bytes(4)), (ARG, 1))):
    positions = tuple((isinstance(a, torch.Tensor), a) for a in args)
    allocs = ((torch.empty(1, 3, 2, 16), True),)
    launch = (0x1234, 2, 3, 1, 128, 1024, tuple(params))
    return ext.make(positions, allocs, (launch,), ((ALLOC, 0),), False, 0, ())


def test_a_recipe_matches_only_its_exact_signature(ext):
    recipe = _recipe(ext, _args())
    assert ext.match(recipe, *_args())  # fresh tensors of the same signature
    buf = torch.zeros(1 * 3 * 2 * 16 + 1)
    differs = {
        "shape": _args(q=torch.randn(1, 4, 2, 16)),
        "strides": _args(q=torch.randn(1, 2, 3, 16).transpose(1, 2)),
        "dtype": _args(q=torch.randn(1, 3, 2, 16, dtype=torch.bfloat16)),
        "alignment": _args(q=buf[1:].view(1, 3, 2, 16)),
        "tensor type": _args(q=torch.nn.Parameter(torch.randn(1, 3, 2, 16))),
        "option value": _args(mode="leaky"),
        "option type": _args(l2=1),
        "None for a value": _args(scale=0.25),
        "a tensor for an option": _args(mode=torch.zeros(1)),
    }
    for what, args in differs.items():
        assert not ext.match(recipe, *args), what
    assert not ext.match(recipe, *_args()[:-1])  # one argument short
    assert ext.match(_recipe(ext, _args(scale=0.25)), *_args(scale=0.25))  # equal values match


def test_the_parameters_are_the_arguments_pointers_and_fixed_bytes(ext):
    recipe = _recipe(ext, _args())
    args = _args()
    slots = ext.params(recipe, 0, *args)
    assert slots == (args[0].data_ptr(), 0, 7, args[1].data_ptr())
    with pytest.raises(IndexError):
        ext.params(recipe, 1, *args)


def test_malformed_recipes_are_refused(ext):
    with pytest.raises(ValueError, match="names no argument"):
        _recipe(ext, _args(), params=((ARG, 9),))
    with pytest.raises(ValueError, match="non-tensor argument"):
        _recipe(ext, _args(), params=((ARG, 2),))
    with pytest.raises(ValueError, match="not 8 bytes"):
        _recipe(ext, _args(), params=((FIXED, b"\x01"),))


def test_a_call_without_a_matching_recipe_returns_none(ext):
    recipe = _recipe(ext, _args())
    assert ext.call([recipe], *_args(mode="leaky")) is None
    assert ext.call([], *_args()) is None


# ---- the recorder ---------------------------------------------------------------------------------
class _Kernel:
    """A stand-in for a JITFunction: its argument names, in order."""
    arg_names = ("q", "state", "idx", "o", "T", "scale", "BT")
    __name__ = "fake"


def _compiled(**md):
    meta = dict(num_warps=4, shared=2048, num_ctas=1, launch_pdl=False, launch_cooperative_grid=False,
                global_scratch_size=0, profile_scratch_size=0)
    meta.update(md)
    sig = {"q": "*fp32", "state": "*fp32", "idx": "*i32", "o": "*fp32", "T": "i32", "scale": "fp32", "BT": "constexpr"}
    return SimpleNamespace(function=0xABC, metadata=SimpleNamespace(**meta), src=SimpleNamespace(signature=sig))


def _record(args, kw_over=None, result=None, ck=None, positions=frozenset((0, 1)), owners=()):
    """A recording of one launch of _Kernel with kw (q, state: the call's; idx: a constant; o: allocated)."""
    rec = fastcall._RecordingState()
    q, state = args[0], args[1]
    o = torch.empty(1, 3, 2, 16)
    rec.allocs.append((o, True))
    kw = dict(q=q, state=state, idx=checks.constant("slots", 1, "cpu"), o=o, T=3, scale=0.5, BT=16)
    kw.update(kw_over or {})
    key = ("fastcall-test", 0, id(kw))  # (kernel, device, ...) as launch.key_of makes them
    launches._COMPILED[key] = ck or _compiled()
    rec.launches.append((_Kernel, (2, 3), kw, key))
    try:
        return fastcall._recipe(rec, args, positions, owners, o if result is None else result), kw
    finally:
        del launches._COMPILED[key]


def test_the_recorder_accounts_for_every_parameter(ext):
    args = _args()
    recipe, kw = _record(args)
    assert recipe is not None
    assert ext.match(recipe, *_args())
    slots = ext.params(recipe, 0, *args)
    scale = struct.unpack("<I", struct.pack("<f", 0.5))[0]
    # q, state: the arguments; idx: the constant's fixed address; o: the allocation; T, scale: bytes; BT: constexpr;
    # then the global and profile scratch pointers Triton's launcher appends (null)
    assert slots == (args[0].data_ptr(), args[1].data_ptr(), kw["idx"].data_ptr(), 0, 3, scale, 0, 0)


def test_one_tensor_as_two_arguments_is_replayed_only_for_the_same_tensor_twice(ext):
    shared = torch.randn(1, 3, 2, 16)
    recipe, _ = _record((shared, shared) + _args()[2:], kw_over=dict(state=shared))
    assert recipe is not None
    other = torch.randn(1, 3, 2, 16)
    assert ext.match(recipe, other, other, *_args()[2:])  # the same object in both places again
    assert not ext.match(recipe, other, torch.randn(1, 3, 2, 16), *_args()[2:])  # the kernel would read the first
    assert ext.params(recipe, 0, other, other, *_args()[2:])[:2] == (other.data_ptr(), other.data_ptr())


@pytest.mark.parametrize("what", ["copy", "tensor position", "pdl", "scratch memory", "output", "pointer"])
def test_the_recorder_refuses_what_a_replay_would_get_wrong(ext, what):
    args = _args()
    before = sum(fastcall.stats()["refused"].values())
    cases = {
        "copy": dict(kw_over=dict(q=args[0].clone())),  # a tensor the call made: replaying would read stale data
        "tensor position": dict(positions=frozenset((0,))),  # state where no tensor is allowed (e.g. raw indices)
        "pdl": dict(ck=_compiled(launch_pdl=True)),
        "scratch memory": dict(ck=_compiled(global_scratch_size=128)),
        "output": dict(result=torch.zeros(1)),  # an output that is neither an allocation nor an argument
        "pointer": dict(kw_over=dict(idx=5)),  # an int where the kernel takes a pointer
    }
    recipe, _ = _record(args, **cases[what])
    assert recipe is None
    assert sum(fastcall.stats()["refused"].values()) == before + 1


def test_the_allocations_of_a_recorded_call_are_noted_as_poisonable_or_not():
    rec = fastcall._RecordingState()
    launches._RECORDING.rec = rec
    try:
        o = C.alloc((2, 3), torch.float32, "cpu")
        s = C.scratch((4,), torch.float32, "cpu")
    finally:
        launches._RECORDING.rec = None
    assert [(t is o, p) for t, p in rec.allocs[:1]] == [(True, True)]
    assert rec.allocs[1][0] is s and rec.allocs[1][1] is False
    C.alloc((1,), torch.float32, "cpu")  # not recording: nothing noted
    assert len(rec.allocs) == 2


def test_cpu_calls_are_never_recorded():
    import ddsim.gpu_backend as gb
    plan = gb.TreePlan(torch.tensor([[-1, 0, 0]]))
    q = torch.randn(1, 3, 1, 16)
    gb.gdn_tree_verify(q, q.clone(), torch.randn(1, 3, 1, 16), torch.zeros(1, 3, 1), torch.rand(1, 3, 1),
                       parents=plan, initial_state=torch.zeros(1, 1, 16, 16))
    assert plan.fast_verify == []


def test_a_plan_records_a_bounded_number_of_calls_and_bad_input_is_no_try(ext):
    import ddsim.gpu_backend as gb
    plan = gb.TreePlan(torch.tensor([[-1, 0, 0]]))
    before = sum(fastcall.stats()["refused"].values())

    def bad():
        raise ValueError("q: bad")
    with pytest.raises(ValueError, match="q: bad"):
        fastcall.record(plan, "verify", _args(), frozenset((0, 1)), (plan,), bad)
    assert plan.fast_tries["verify"] == 0
    for raw in (torch.tensor([2]), [2]):  # raw indices at a position that takes none: no try spent
        assert fastcall.record(plan, "verify", _args(scale=raw), frozenset((0, 1)), (plan,), lambda: "ran") == "ran"
    assert plan.fast_tries["verify"] == 0
    before = sum(fastcall.stats()["refused"].values())
    for _ in range(fastcall.MAX_RECIPES + 3):  # no launch: refused, and tried at most MAX_RECIPES times
        assert fastcall.record(plan, "verify", _args(), frozenset((0, 1)), (plan,), lambda: "ran") == "ran"
    assert plan.fast_tries == {"verify": fastcall.MAX_RECIPES, "commit": 0, "states": 0}
    assert sum(fastcall.stats()["refused"].values()) == before + fastcall.MAX_RECIPES


def test_a_recipe_does_not_keep_its_plan_alive(ext):
    import gc
    import weakref

    import ddsim.gpu_backend as gb
    plan = gb.TreePlan(torch.tensor([[-1, 0, 0]]))
    plan.ancestors("exact")  # a cached table the recipe may point into
    recipe, _ = _record(_args(), owners=(plan,))
    assert recipe is not None
    plan.fast_verify.append(recipe)
    ref = weakref.ref(plan)
    del plan, recipe
    gc.collect()
    assert ref() is None  # one plan per tree per step: a cycle through the recipe would keep every one


def test_a_recording_is_seen_only_by_its_own_thread():
    import threading
    seen = []
    launches._RECORDING.rec = "this thread's"
    try:
        t = threading.Thread(target=lambda: seen.append(launches.recording()))
        t.start()
        t.join()
        assert launches.recording() == "this thread's" and seen == [None]
    finally:
        launches._RECORDING.rec = None


def test_calls_a_recipe_could_never_keep_are_told_apart_before_recording():
    import ddsim.gpu_backend as gb
    q = torch.randn(1, 3, 2, 16)
    before = fastcall.stats()["refused"]
    assert gb._unreplayable(q, q.transpose(1, 2))  # a non-contiguous input: the launcher copies it
    assert not gb._unreplayable(q, None, torch.zeros(3))
    # q, k, v (the first `rows`) split from one projection are read in place by row stride: kept; in another layout
    # (heads before tokens) copied: refused; so is a non-contiguous gate
    fused = torch.randn(1, 3, 3 * 32)
    q, k, v = (fused[..., i * 32:(i + 1) * 32].unflatten(-1, (2, 16)) for i in range(3))
    assert not gb._unreplayable(q, k, v, torch.zeros(1, 3, 2), rows=3)
    assert gb._unreplayable(q, k, v.transpose(1, 2).contiguous().transpose(1, 2), rows=3)
    assert gb._unreplayable(q, k, v, torch.zeros(1, 2, 3).transpose(1, 2), rows=3)
    after = fastcall.stats()["refused"]
    assert sum(after.values()) == sum(before.values()) + 3


def test_a_triton_whose_launcher_abi_was_not_checked_replays_nothing_on_a_gpu(ext, monkeypatch):
    """On a GPU, a Triton release other than the ones the replay was checked against (CHECKED_TRITON)
    records no recipe: every call runs Triton's own launcher."""
    import ddsim.gpu_backend as gb
    plan = gb.TreePlan(torch.tensor([[-1, 0, 0]]))
    monkeypatch.setattr(fastcall, "_triton_minor", lambda: "3.9")
    assert not fastcall.launcher_abi_checked()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = fastcall.stats()["recorded"]
    assert fastcall.record(plan, "verify", _args(), frozenset((0, 1)), (plan,), lambda: "ran") == "ran"
    assert fastcall.stats()["recorded"] == before and plan.fast_tries["verify"] == 0
    assert "launcher ABI not checked" in fastcall.status()
    monkeypatch.setattr(fastcall, "_triton_minor", lambda: "3.6")
    assert fastcall.launcher_abi_checked()


def test_the_triton_release_is_looked_up_once_a_process(monkeypatch):
    """importlib.metadata's lookup takes about 0.5 ms: a call refused a recipe on every call (raw indices) must not
    pay it each time."""
    import importlib.metadata
    calls = []
    monkeypatch.setattr(importlib.metadata, "version", lambda name: calls.append(name) or "3.6.0")
    fastcall._triton_minor.cache_clear()
    try:
        assert [fastcall.launcher_abi_checked() for _ in range(3)] == [True] * 3
        assert calls == ["triton"]
    finally:
        fastcall._triton_minor.cache_clear()
