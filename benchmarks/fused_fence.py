"""Whether the one-kernel WY form at one sequence (1 x 16: the root in the block, q and k as read, their rows' norms
from the rows as read, the state held; Qwen3.6-27B GDN shapes, bf16 inputs, a DDTree tree) is faster with every read
issued before any is used: copies of _gdn_wy_kernel with its draft rows' reads fenced, beside the form, in one process,
the rows interleaved round by round.

Compiled for sm_90 (Triton 3.6's ptxas, as the GPUs run it), the form's machine code sums the path gates (which waits
for the gates' and the mask's reads) before it issues three of q's, k's and v's 16-byte reads: those go out a round
trip late, beside the state's read (issued once its slot arrives), and wait behind it. The copies:

  fenced                 q, k, v read; a barrier; the mask read; a barrier; the gates read. ptxas moves no read across a
                         barrier, and a use cannot rise above the read it waits for, so every read but the state's
                         goes out before the first use of any (--sass prints where each read and its first use lie)
  fenced, q k v only     the first barrier alone

Each copy is the kernel's source with its draft reads replaced (bench.edited_kernel); its output is the form's, bit
for bit (a barrier changes no value). Timer: bench.median_us_calls (the median of --calls do_bench calls, their range);
device: bench.kernel_device_us after do_bench's flush and warm.

    python benchmarks/fused_fence.py [--commit SHA] [--calls 5] [--rounds 3]   # needs CUDA
    python benchmarks/fused_fence.py --sass                                    # on the CPU: the reads' places
"""
import argparse
import sys

import torch

from ddsim.bench.bench import at_least_one, edited_kernel, timing_options

DRAFT = ("        draft = h.draft_reads(q, k, v, g, beta, rows, mt, i_h, i_hv, o_k, o_v, mk, mv, H, HV, K, V, QS, KS, "
         "VS)\n"
         "        anc = tl.load(mask + (i_b * T + o_t[:, None]).to(tl.int64) * T + o_t[None, :],\n"
         "                      mask=mt[:, None] & mt[None, :], other=0) != 0\n")
QKV = ("        mqk = mt[:, None] & mk[None, :]\n"
       "        f_q = h.raw_rows(q, rows[:, None], i_h, o_k[None, :], mqk, H, K, QS)\n"
       "        f_k = h.raw_rows(k, rows[:, None], i_h, o_k[None, :], mqk, H, K, KS)\n"
       "        f_v = h.raw_rows(v, rows[:, None], i_hv, o_v[None, :], mt[:, None] & mv[None, :], HV, V, VS)\n"
       "        tl.debug_barrier()\n")
MASK = ("        anc = tl.load(mask + (i_b * T + o_t[:, None]).to(tl.int64) * T + o_t[None, :],\n"
        "                      mask=mt[:, None] & mt[None, :], other=0) != 0\n")
GATES = ("        raw_g, raw_b = h.raw_gates(g, beta, rows * HV + i_hv, mt, True)\n"
         "        draft = (f_q, f_k, f_v, raw_g, raw_b)\n")
QKV_OPEN = QKV.replace("        tl.debug_barrier()\n", "")
FENCES = {
    "fenced": QKV + MASK + "        tl.debug_barrier()\n" + GATES,
    "fenced, q k v only": QKV + MASK + GATES,
    "fenced after every read": QKV_OPEN + MASK + GATES + "        tl.debug_barrier()\n",
    "gates first, fenced after every read": GATES.replace("        draft = (f_q, f_k, f_v, raw_g, raw_b)\n", "")
    + QKV_OPEN + MASK + "        draft = (f_q, f_k, f_v, raw_g, raw_b)\n        tl.debug_barrier()\n",
}


def fenced_kernel(name: str):
    """_gdn_wy_kernel with its draft reads replaced as FENCES[name] says (bench.edited_kernel)."""
    from ddsim.gpu_backend import triton_gdn as G
    header = ("import triton\nimport triton.language as tl\nfrom ddsim.gpu_backend import triton_helpers as h\n"
              "from ddsim.gpu_backend.triton_gdn import _apart\n\n\n")
    return edited_kernel(G._gdn_wy_kernel, [(DRAFT, FENCES[name])], header=header, who="fused_fence")


def sass():
    """Each form compiled for sm_90 on the CPU (the served launch at 1 x 16, tests/gpu_compile.py's launches): its
    reads' places."""
    import os
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import gpu_compile as gc

    from ddsim.gpu_backend import triton_gdn
    triton_gdn.FUSED_GLUON = False  # the Triton form, which the copies edit
    kernel, kw = gc.launches(1, 16, torch.bfloat16, "auto")[-1]
    forms = {"the form": kernel, **{name: fenced_kernel(name) for name in FENCES}}
    for name, kern in forms.items():
        ops = [gc.opcode(x) for x in gc.sass_instructions(gc.compile_for(kern, kw))]
        print(f"{name}: {gc.read_places(ops)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=3)
    ap.add_argument("--sass", action="store_true", help="print each form's reads' places compiled for sm_90 (no GPU)")
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    if a.sass:
        return sass()
    from ddsim.bench.bench import cuda_run, timing_rounds, wy_default_launch
    from ddsim.gpu_backend.launch import bind
    cuda_run("fused_fence", a.commit)
    B, T = 1, 16
    default, o, grid, kw, _, _ = wy_default_launch(B, T)
    if kw.get("ROOT") != 2 or not kw.get("RAW16") or not kw.get("HOLD"):
        raise SystemExit(f"fused_fence: the default at {B} x {T} is not the form these copies are of")
    forms, outs = {"the form": default}, {}
    for name in FENCES:
        outs[name] = torch.full_like(o, float("nan"))
        forms[name] = bind(fenced_kernel(name), grid, dict(kw, o=outs[name]))
    for launch in forms.values():
        launch()
    torch.cuda.synchronize()
    for name, x in outs.items():
        print(f"{name}: output equal to the form's bit for bit: {torch.equal(x, o)}", flush=True)
    print(f"B x T {B} x {T}, {kw['num_warps']} warps, {kw['BV']}-wide V tiles, NSTEP {kw['NSTEP']}")
    timing_rounds(forms, rounds=a.rounds, calls=a.calls)


if __name__ == "__main__":
    main()
