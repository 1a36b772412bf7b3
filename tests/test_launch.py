"""gpu_backend.launch: the key a compiled kernel is kept under separates every specialization Triton
makes (dtypes, 16-byte alignment, ints and constexprs by value), so a direct launch runs the kernel
Triton would have picked. The launches themselves are compared on a GPU (properties/test_launch_gpu.py);
under the interpreter every launch goes through kernel[grid]."""
import pytest
import torch

from ddsim.gpu_backend import launch
from ddsim.gpu_backend.triton_commit import _gdn_commit_kernel


def _kw(**over):
    k = torch.zeros(1, 2, 1, 16)
    v = torch.zeros(1, 2, 2, 16)
    kw = dict(k=k, v=v, g=torch.zeros(1, 2, 2), beta=torch.zeros(1, 2, 2), A_log=torch.zeros(1), dt_bias=torch.zeros(1),
              paths=torch.zeros(1, 2, 2, dtype=torch.int32), acc=torch.zeros(1, dtype=torch.int64),
              state=torch.zeros(1, 2, 16, 16),
              state_idx=torch.zeros(1, dtype=torch.int32), out=torch.zeros(1, 2, 16, 16),
              out_idx=torch.zeros(1, dtype=torch.int32), T=2, TP=2, DMAX=2, H=1, HV=2, K=16, V=16, BK=16, BV=16,
              FUSED=False, L2NORM=True, STATE_VK=False, OUT_VK=False, KS=16, VS=32, num_warps=4)
    kw.update(over)
    return kw


def test_the_key_separates_every_specialization():
    base, args = launch.key_of(_gdn_commit_kernel, _kw(), 0)
    assert args[0] is not None and len(args) == len(_gdn_commit_kernel.arg_names)
    assert launch.key_of(_gdn_commit_kernel, _kw(), 0)[0] == base  # same specialization, same key
    buf = torch.zeros(64)
    differs = {
        "dtype": _kw(k=torch.zeros(1, 2, 1, 16, dtype=torch.bfloat16)),
        "alignment": _kw(state=buf[1:].view(1, 1, 7, 9)),  # 4 bytes off a 16-byte boundary
        "int value": _kw(T=3),
        "int 1": _kw(DMAX=1),
        "constexpr": _kw(BV=32),
        "bool constexpr": _kw(L2NORM=False),
        "state layout": _kw(STATE_VK=True),
        "row stride": _kw(VS=48),  # v as views of a fused projection: a binary of its own, never the contiguous one
        "launch option": _kw(num_warps=8),
    }
    for what, kw in differs.items():
        assert launch.key_of(_gdn_commit_kernel, kw, 0)[0] != base, what
    assert launch.key_of(_gdn_commit_kernel, _kw(), 1)[0] != base  # another device


def test_a_tensor_descriptor_is_keyed_by_what_triton_specializes_it_on():
    """A host tensor descriptor (triton.tools.tensor_descriptor, benchmarks/state_reads.py's) keys by its base's dtype,
    its block's shape and its padding, which Triton compiles into the kernel; its base, shape and strides are values
    the launcher encodes on each call, so another tensor of the same kind keeps the key."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t, block, padding="zero"):
        return _kw(state=TensorDescriptor.from_tensor(t, block, padding))

    base = launch.key_of(_gdn_commit_kernel, desc(torch.zeros(4, 16), [2, 16]), 0)[0]
    assert launch.key_of(_gdn_commit_kernel, desc(torch.ones(8, 16), [2, 16]), 0)[0] == base
    for what, kw in {"dtype": desc(torch.zeros(4, 16, dtype=torch.bfloat16), [2, 16]),
                     "block": desc(torch.zeros(4, 16), [4, 16]),
                     "padding": desc(torch.zeros(4, 16), [2, 16], "nan")}.items():
        assert launch.key_of(_gdn_commit_kernel, kw, 0)[0] != base, what


def test_unknown_or_missing_arguments_are_refused():
    with pytest.raises(TypeError, match="unknown arguments"):
        launch.key_of(_gdn_commit_kernel, _kw(bogus=1), 0)
    kw = _kw()
    del kw["T"]
    with pytest.raises(KeyError):
        launch.key_of(_gdn_commit_kernel, kw, 0)


def test_the_interpreter_launches_through_triton():
    before = launch.cached()  # other tests' compiled kernels on a GPU: this one adds none
    calls = []

    class Fake:
        def __getitem__(self, grid):
            return lambda **kw: calls.append((grid, kw))
    launch.bind(Fake(), (3, 1), {"x": 1})()
    assert calls == [((3, 1), {"x": 1})] and launch.cached() == before


def test_poisoning_is_on_in_the_tests_and_scoped_elsewhere():
    """The suites NaN-fill every launcher output (root conftest: DDSIM_POISON=1), so an unwritten
    element fails its comparison; poisoned() scopes it (audits, check-kernel); outside, outputs are
    allocated unfilled, as engines allocate them."""
    from ddsim.gpu_backend import _common, poisoned, poisoning
    assert poisoning()
    assert _common.alloc((3,), torch.float32, "cpu").isnan().all()
    with poisoned(False):
        assert not poisoning()
        with poisoned():
            assert poisoning()
        assert not poisoning()
    assert poisoning()


def test_audits_poison_their_fast_path(monkeypatch):
    from ddsim.gpu_backend import poisoned, poisoning
    from ddsim.measure import audit
    seen = []
    monkeypatch.setattr(audit, "_audit", lambda ac, **kw: seen.append(poisoning()))
    with poisoned(False):
        audit.run_audit(None)
    assert seen == [True]


def test_only_an_installed_launch_hook_sends_launches_through_triton():
    """Triton >= 3.4's default hooks are empty HookChains (its dispatch builds launch metadata for them
    on every launch); only a hook that would run (a profiler's) makes launches go through kernel[grid]."""
    from types import SimpleNamespace
    assert not launch._active(None)
    assert not launch._active(SimpleNamespace(calls=[]))
    assert launch._active(SimpleNamespace(calls=[print]))
    assert launch._active(print)  # older Triton: the hook itself, or None
