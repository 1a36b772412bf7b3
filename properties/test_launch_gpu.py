"""Direct launches of compiled kernels (gpu_backend.launch) against Triton's own dispatch, on a GPU:
the same bits from every public function, the second call of a specialization never entering
JITFunction.run, and a new specialization (another tree size) compiled through Triton again.
GPU only: under the interpreter every launch goes through kernel[grid] (tests/test_launch.py)."""
import pytest
import torch
import triton.runtime.jit as jit

import ddsim.gpu_backend as gb
from ddsim.bench.bench import ddtree_batch, kernel_inputs
from ddsim.gpu_backend import launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="direct launches need a GPU")


def _calls(fn, monkeypatch):
    """(result of fn(), number of JITFunction.run calls it made)."""
    n = [0]
    orig = jit.JITFunction.run

    def counted(self, *a, **k):
        n[0] += 1
        return orig(self, *a, **k)
    monkeypatch.setattr(jit.JITFunction, "run", counted)
    try:
        return fn(), n[0]
    finally:
        monkeypatch.setattr(jit.JITFunction, "run", orig)


@pytest.mark.parametrize("B,T,backend", [(1, 17, "triton-wy"), (2, 33, "triton-wy-split"), (2, 33, "triton-wy-fold"),
                                         (2, 33, "triton-wy-head"), (2, 9, "triton-recurrent"), (1, 80, "triton-wy")])
def test_direct_launches_equal_triton_dispatch(B, T, backend, monkeypatch):
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, H=2, HV=4, K=64, V=64)
    qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    plan = gb.TreePlan(parents.cuda())
    acc = gb.checked_accepted([T - 1] * B, B, T, "cuda")

    def run():
        o = gb.gdn_tree_verify(**qkv, parents=plan, initial_state=inp["initial_state"], backend=backend)
        c = gb.gdn_tree_commit(inp["k"], inp["v"], inp["g"], inp["beta"], parents=plan, accepted=acc,
                               initial_state=inp["initial_state"])
        return o.clone(), c.clone()
    monkeypatch.setattr(launch, "DIRECT", False)
    (o_ref, c_ref), n_ref = _calls(run, monkeypatch)
    monkeypatch.setattr(launch, "DIRECT", True)
    (o1, c1), _ = _calls(run, monkeypatch)  # compiles into the direct cache through Triton
    (o2, c2), n2 = _calls(run, monkeypatch)
    assert n_ref >= 2 and n2 == 0, (n_ref, n2)  # the second call never entered Triton's dispatch
    for a, b in ((o1, o_ref), (o2, o_ref), (c1, c_ref), (c2, c_ref)):
        assert torch.equal(a, b)


def test_a_new_specialization_goes_through_triton_again(monkeypatch):
    counts = []
    for T in (9, 17, 9):
        _, parents = ddtree_batch(1, T)
        inp = kernel_inputs(1, T, H=2, HV=4, K=64, V=64, dtype=torch.float16)
        qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
        run = lambda: gb.gdn_tree_verify(**qkv, parents=parents.cuda(), initial_state=inp["initial_state"],  # noqa: E731
                                         backend="triton-wy-fused")
        o, n = _calls(run, monkeypatch)
        monkeypatch.setattr(launch, "DIRECT", False)
        ref = run()
        monkeypatch.setattr(launch, "DIRECT", True)
        assert torch.equal(o, ref), T
        counts.append(n)
    assert counts[1] >= 1 and counts[2] == 0, counts  # another T: through Triton; T = 9 again: direct


@pytest.mark.parametrize("pdl", [True, "grid"])
@pytest.mark.parametrize("fold_root", [True, False])
@pytest.mark.parametrize("B,T", [(1, 17), (2, 33), (8, 65), (32, 65)])
def test_programmatic_dependent_launch_gives_the_same_bits(B, T, fold_root, pdl):
    """The folded WY form with its second kernel launched early waits for what the fold grid writes: its head's
    fold program (pdl=True: a per-head ready flag, release/acquire) or the whole grid (pdl="grid":
    griddepcontrol.wait), reading the committed state before it waits. With the scratch between them poisoned (NaN)
    before every call, a read before the fold's writes would show as NaN; the outputs equal the plain launch's bit
    for bit, call after call. Both second kernels: the root's step folded into the weights (bf16's default) and
    taken per V tile; 16-wide V tiles for one sequence (the most apply programs)."""
    from ddsim.gpu_backend.triton_gdn import plan_wy
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device="cuda")
    qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
    common = dict(parents=parents.cuda(), initial_state=inp["initial_state"], design="fold", poison=True,
                  fold_root=fold_root, block_v=16 if B == 1 else None)
    plain, o_ref = plan_wy(**qkv, **common)
    early, o = plan_wy(**qkv, **common, pdl=pdl)
    plain()
    for _ in range(20):
        for t in early.scratch:
            t.fill_(float("nan"))
        early()
        torch.cuda.synchronize()
        assert torch.equal(o, o_ref)
