"""Compile, for an sm_90 (Hopper) GPU and without one, every kernel the GDN WY launchers would launch
at Qwen3.6-27B GDN shapes: one block (65 nodes: fused, split, fold) and past it (131 nodes: the
chunked form and the split form, unfolded and folded), bf16 and fp32 inputs. Triton's interpreter
runs kernels without compiling them, so a kernel it runs may still not compile (a loop variable that
changes type, shared memory past the SM's); this catches that on a CPU. Run as a script (it must
import Triton without TRITON_INTERPRET); prints a line per kernel, exits 1 if any fails.

    python tests/sm90_compile.py
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # before Triton is imported: compile, do not interpret

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ddsim.bench import ddtree_batch, kernel_inputs  # noqa: E402
from ddsim.gpu_backend import _common, triton_gdn, triton_wy_blocked, triton_wy_split  # noqa: E402

DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int8: "i8", torch.int32: "i32",
         torch.int64: "i64"}
SHARED_PER_SM = 232448  # the H200's (sm_90) largest shared memory per block, in bytes


def launches(B, T, dtype, design):
    """(kernel, keyword arguments) of each launch plan_wy would make."""
    got = []

    def capture(kernel, grid, kw):
        got.append((kernel, dict(kw)))
        return lambda: None
    for m in (triton_gdn, triton_wy_split, triton_wy_blocked):
        m.bind = capture
    _common.check_device = lambda *xs: None  # CPU tensors: nothing is launched
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, dtype=dtype, device="cpu")
    triton_gdn.plan_wy(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents,
                       initial_state=inp["initial_state"], design=design, poison=False)
    return got


def compile_sm90(kernel, kw):
    sig, consts = {}, {}
    for i, p in enumerate(kernel.params):
        x = kw[p.name]
        if p.is_constexpr:
            sig[p.name], consts[(i,)] = "constexpr", x
        elif isinstance(x, torch.Tensor):
            sig[p.name] = "*" + DTYPE[x.dtype]
        elif isinstance(x, bool):
            sig[p.name] = "i1"
        elif isinstance(x, int):
            sig[p.name] = "i32" if -2**31 <= x < 2**31 else "i64"
        else:
            sig[p.name] = "fp32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.params) if sig[p.name][0] == "*"}
    opts = {k: kw[k] for k in ("num_warps", "num_stages", "maxnreg") if k in kw}
    ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32), options=opts)
    return ck.metadata.shared


if __name__ == "__main__":
    failed = 0
    for T, designs in ((65, ("fused", "split", "fold")), (131, ("fused", "split", "fold"))):
        for dtype in (torch.bfloat16, torch.float32):
            for design in designs:
                for kernel, kw in launches(2, T, dtype, design):
                    what = f"{T} nodes, {str(dtype)[6:]}, design {design}: {kernel.__name__}"
                    try:
                        shared = compile_sm90(kernel, kw)
                        if shared > SHARED_PER_SM:
                            raise RuntimeError(f"{shared} B of shared memory, more than {SHARED_PER_SM}")
                        print(f"ok   {what} ({shared} B shared)", flush=True)
                    except Exception as e:  # every kernel is tried; each failure is one line
                        failed += 1
                        print(f"FAIL {what}: {type(e).__name__}: {str(e).splitlines()[-1][:300]}", flush=True)
    sys.exit(1 if failed else 0)
