"""The Gluon fold (gpu_backend.gluon_gdn) on the CPU: which launches plan_wy gives it (and which keep the Triton
form), what it is handed, and its code compiled for Hopper and both Blackwell targets with Triton's bundled ptxas in
every way it reads its inputs: its state copied by cp.async (16 bytes a copy) and waited for after every product
but P S0's, within each target's shared memory, and every global read issued before any is used. Gluon has no
interpreter: its values are tested on a GPU (properties/test_gluon_fold.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddsim.bench.bench import ddtree_batch, kernel_inputs
from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import gluon_gdn, triton_gdn

pytestmark = pytest.mark.skipif(not gluon_gdn.available(), reason="this Triton has no Gluon")
TESTS = Path(__file__).parent


def _bound(monkeypatch, B=1, T=16, *, dtype=torch.bfloat16, K=128, V=128, device_plan=False, vk=False,
           **plan_kw) -> list:
    """(kernel, grid, keyword arguments) of each launch plan_wy binds for B DDTree trees of T nodes at Qwen3.6-27B's
    GDN heads (K, V as given), compiled (not interpreted) and nothing launched."""
    got = []
    monkeypatch.setattr(C, "interpreting", lambda: False)
    monkeypatch.setattr(C, "check_device", lambda *xs: None)
    monkeypatch.setattr(triton_gdn, "bind", lambda kernel, grid, kw: got.append((kernel, grid, kw)) or (lambda: None))
    _, parents = ddtree_batch(B, T)
    if device_plan:
        from ddsim.gpu_backend import device_checks
        parents = device_checks.DevicePlan(parents.int())
    inp = kernel_inputs(B, T, K=K, V=V, dtype=dtype, device="cpu")
    state = inp["initial_state"]
    if vk:  # SGLang's pool layout: the transpose of a contiguous [N, HV, V, K]
        state = state.transpose(-1, -2).contiguous().transpose(-1, -2)
    triton_gdn.plan_wy(**{n: inp[n] for n in ("q", "k", "v", "g", "beta")}, parents=parents, initial_state=state,
                       poison=False, **plan_kw)
    return got


def test_the_gluon_fold_serves_trees_of_up_to_16_nodes_with_bf16_inputs(monkeypatch):
    """design auto at one sequence of 16 and of 9 nodes, design fused at three of 16, a pool in SGLang's layout, a
    device plan (a captured call's: each sequence's rounds from its depths): the Gluon fold, over (V / 64, B x HV)
    programs of 4 warps, every row a node (FULL) only at 16, handed the Triton form's own tensors and options. (The
    device plan's tables are built by Triton kernels on the CPU tensors here: in the interpreter only, so where Triton
    compiles for a GPU that case is left to properties/test_gluon_fold.py, which draws device plans there.)"""
    cases = [(1, 16, "auto", False, False), (1, 9, "auto", False, False), (3, 16, "fused", False, False),
             (1, 16, "auto", True, False)] + ([(2, 16, "fused", False, True)] if C.interpreting() else [])
    for B, T, design, vk, plan in cases:
        (kernel, grid, kw), = _bound(monkeypatch, B, T, design=design, vk=vk, device_plan=plan)
        assert kw["DEPTHS"] == plan and (not plan or kw["depths"].dtype == torch.int32), kw
        assert kernel is gluon_gdn._gdn_fold_kernel, (B, T, design, vk)
        assert grid == (2, B * 48) and kw["num_warps"] == 4 and kw["BT"] == 16 and kw["BV"] == 64, (grid, kw)
        assert kw["FULL"] == (T == 16) and kw["STATE_VK"] == vk and kw["T"] == T and not kw["FUSED"], kw
        with monkeypatch.context() as mp:  # the same call with the fold off: the Triton form's arguments
            mp.setattr(triton_gdn, "FUSED_GLUON", False)
            (tkernel, _, tkw), = _bound(mp, B, T, design=design, vk=vk, device_plan=plan)
        assert tkernel is triton_gdn._gdn_wy_kernel and tkw["ROOT"] == 2
        shared = set(kw) & set(tkw) - {"num_warps"}
        assert len(shared) == 29, sorted(shared)  # every argument the fold takes but FULL

        def same(a, b):  # (o, allocated unfilled, by its layout alone)
            if isinstance(a, torch.Tensor):
                return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and (
                    a is kw["o"] or torch.equal(a, b))
            return a == b
        assert all(same(kw[n], tkw[n]) for n in shared), [n for n in shared if not same(kw[n], tkw[n])]


def test_the_triton_form_serves_what_the_gluon_fold_does_not(monkeypatch):
    """The root first (17 nodes), fp16 or fp32 inputs, q and k not as read (FUSED_RAW16 off), another V tile or warps
    asked for (or FUSED_WARPS set), K or V the fold
    does not take, the fold off (FUSED_GLUON), SGLang's layout with GLUON_VK off, a Triton without Gluon, and
    Triton's interpreter: _gdn_wy_kernel."""
    cases = [dict(T=17), dict(dtype=torch.float16), dict(dtype=torch.float32), dict(block_v=32), dict(num_warps=8),
             dict(K=32), dict(V=96)]
    for case in cases:
        (kernel, _, _), = _bound(monkeypatch, **case)
        assert kernel is triton_gdn._gdn_wy_kernel, case
    for module, name, value, how in ((triton_gdn, "FUSED_RAW16", False, {}), (triton_gdn, "FUSED_WARPS", 8, {}),
                                     (triton_gdn, "FUSED_GLUON", False, {}), (triton_gdn, "GLUON_VK", False, {"vk": True})):
        with monkeypatch.context() as mp:
            mp.setattr(module, name, value)
            (kernel, _, _), = _bound(mp, **how)
        assert kernel is triton_gdn._gdn_wy_kernel, name
    with monkeypatch.context() as mp:
        mp.setattr(gluon_gdn, "available", lambda: False)
        (kernel, _, _), = _bound(mp)
    assert kernel is triton_gdn._gdn_wy_kernel
    assert not gluon_gdn.serves(q=torch.empty(1, dtype=torch.bfloat16), v=torch.empty(1, dtype=torch.bfloat16), T=16,
                                K=128, V=128, root=2, raw16=True, block_v=None, num_warps=None) \
        or not C.interpreting()  # under the interpreter (the CPU suite's default) never


CONFIGS = {  # how the fold reads its inputs: kernel arguments over the served launch's at 1 x 16
    "as the kernel table's kernels alone": {},
    "the gates fused": dict(FUSED=True),
    "a pool in SGLang's layout": dict(STATE_VK=True),
    "q, k, v rows strided as SGLang's projection's": dict(QS=2 * 16 * 128 + 48 * 128, KS=2 * 16 * 128 + 48 * 128,
                                                          VS=2 * 16 * 128 + 48 * 128),
    "without the l2 norms": dict(L2NORM=False),
    "as engine_api's verify": dict(FUSED=True, STATE_VK=True, QS=10240, KS=10240, VS=10240),
    "K = 64": dict(K=64),
    "rows past the tree masked": dict(FULL=False, T=9),
    "as engine_api's verify, rows past the tree masked": dict(FUSED=True, STATE_VK=True, QS=10240, KS=10240, VS=10240,
                                                              FULL=False, T=9),
    "captured, a device plan's depths": dict(FUSED=True, STATE_VK=True, DEPTHS=True, NPD=1,
                                             depths=torch.ones(1, 1, dtype=torch.int32)),
}


@pytest.mark.slow  # every way compiled for three targets: 16 s of the 2-core machine, as the other kernels' compiles
def test_the_gluon_fold_compiles_for_hopper_and_blackwell():
    """Each way of CONFIGS compiled for sm_90a, sm_100a and sm_120a (a subprocess without TRITON_INTERPRET):
    within the target's shared memory a block (34 KiB: the state's [K, 64] fp32 tile and the layouts' scratch), the
    state's tile copied by 16-byte cp.async copies (K / 8 a thread), their wait after every product but P S0's six
    (TTGIR: the copy before the first product, the wait before the last six); compiled for sm_90a, no global read
    into registers after the first use of one (tests/gpu_compile.late_reads: the barriers among the reads and every
    read's first use tied to the slot's, the last read, behind a barrier of its own, hold it; without the tie and
    the third barrier 4-7 of them were late in three of these ways on Triton 3.6's ptxas and 6 in the last on 3.9's,
    without the barriers 10-18 in every way)."""
    pytest.importorskip("triton.backends.nvidia")
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "import torch, gpu_compile as gc, test_gluon_gdn as t\n"
            "from triton.backends.compiler import GPUTarget\n"
            "from ddsim.bench.bench import compile_kernel\n"
            "(kernel, kw), = gc.launches(1, 16, torch.bfloat16, 'auto')\n"
            "for arch in (90, 100, 120):\n"
            "    for name, how in t.CONFIGS.items():\n"
            "        ck = compile_kernel(kernel, {**kw, **how}, GPUTarget('cuda', arch, 32))\n"
            "        ir = ck.asm['ttgir'].split(chr(10))\n"
            "        ops = ''.join('c' if 'ttg.async_copy_global_to_local' in x else 'w' if 'ttg.async_wait' in x else 'd'"
            " for x in ir if 'ttg.async_copy_global_to_local' in x or 'ttg.async_wait' in x or ' = tt.dot ' in x)\n"
            "        ins = [gc.opcode(x) for x in gc.sass_instructions(ck)]\n"
            "        late = gc.late_reads(ck) if arch == 90 else -1\n"
            "        print('FOLD', arch, name, '|', ck.metadata.shared, ops, sum(x.startswith('LDGSTS.E.BYPASS.128')"
            " for x in ins), late)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=TESTS.parent,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = {}
    for line in r.stdout.splitlines():
        if line.startswith("FOLD "):
            head, tail = line.split(" | ")
            _, arch, name = head.split(" ", 2)
            shared, ops, copies, late = tail.split()
            got[(int(arch), name)] = (int(shared), ops, int(copies), int(late))
    assert len(got) == 3 * len(CONFIGS), r.stdout[-3000:]
    limit = {90: 232448, 100: 232448, 120: 101376}
    for (arch, name), (shared, ops, copies, late) in got.items():
        k = CONFIGS[name].get("K", 128)
        assert shared <= limit[arch] and shared == k * 64 * 4 + 2048, (arch, name, shared)
        assert copies == k // 8, (arch, name, copies)  # [K, 64] fp32 over 128 threads, 16 bytes a copy
        assert ops.startswith("c") and ops.count("c") == 1 and ops.endswith("w" + "d" * 6), (arch, name, ops)
        if arch == 90:
            assert late == 0, (name, late)
