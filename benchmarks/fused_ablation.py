"""What each part of the one-kernel WY form's chain costs at one sequence (1 x 16: the root in the block, q and k as
read, their rows' norms from the rows as read, the state held; Qwen3.6-27B GDN shapes, bf16 inputs, a DDTree tree):
copies of _gdn_wy_kernel with a part cut out, timed beside the form in one process, the rows interleaved round by
round. A cut copy computes the wrong output: it is timed, never used. What a cut saves bounds what any faster way of
making that part could save while the rest is made as now.

  no remainder          the state's products by its bf16 head alone (its remainder neither made nor multiplied)
  no state products     K S0 and Q S0 zero; the state still read, its column sums times zero added to the
                        right-hand side so that the read is kept
  no solve              the right-hand side used as U (no doubling steps)
  no output product     the output A_q Q S0 alone, U times zero added so that U is still made
  K side alone          no state products, no solve and no output product: the reads, the gates, K K^T, Q K^T, -L,
                        the right-hand side from v and the store
  K side alone, no state read
                        the same with the state (and its slot) not read

Each copy is the kernel's source with lines replaced (bench.edited_kernel); a line it no longer finds once stops the
script. Timer: bench.median_us_calls (the median of --calls do_bench
calls, their range); device: bench.kernel_device_us after do_bench's flush and warm.

    python benchmarks/fused_ablation.py [--commit SHA] [--calls 5] [--rounds 2]
"""
import argparse

import torch

from ddsim.bench.bench import (
    at_least_one,
    cuda_run,
    edited_kernel,
    timing_options,
    timing_rounds,
    wy_default_launch,
)
from ddsim.gpu_backend.launch import bind

KS = "            KS = tl.dot(k_raw, s_hi, tl.dot(k_raw, s_lo))\n"
QS = "            QS = tl.dot(q_raw, s_hi, tl.dot(q_raw, s_lo))\n"
SOLVE = ("    if NSTEP > 0:\n        U = U + tl.dot(NL, U, input_precision=PRECISION)\n    for _ in range(1, NSTEP):\n"
         "        NL = tl.dot(NL, NL, input_precision=PRECISION)\n        U = U + tl.dot(NL, U, input_precision=PRECISION)\n")
OUT = "    b_o = A_q[:, None] * QS + tl.dot(D * QK, U, input_precision=PRECISION)\n"
RHS = "    U = b_beta[:, None] * (b_v - A_k[:, None] * KS)  # right-hand side\n"
READ = ("        s0 = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),\n"
        "                     mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)  # a padded row: zero\n")
ZERO_KS = ("            KS = tl.zeros([BT, BV], tl.float32)\n            QS = tl.zeros([BT, BV], tl.float32)\n")
KEEP_READ = RHS + "    U = U + tl.sum(s0, 0)[None, :] * 0.0  # the state's read kept\n"
CUTS = {
    "no remainder": [(KS, "            KS = tl.dot(k_raw, s_hi)\n"), (QS, "            QS = tl.dot(q_raw, s_hi)\n")],
    "no state products": [(KS + QS, ZERO_KS), (RHS, KEEP_READ)],
    "no solve": [(SOLVE, "")],
    "no output product": [(OUT, "    b_o = A_q[:, None] * QS + U * 0.0\n")],
    "K side alone": [(KS + QS, ZERO_KS), (RHS, KEEP_READ), (SOLVE, ""), (OUT, "    b_o = A_q[:, None] * QS + U * 0.0\n")],
    "K side alone, no state read": [(KS + QS, ZERO_KS), (SOLVE, ""), (OUT, "    b_o = A_q[:, None] * QS + U * 0.0\n"),
                                    (READ, "        s0 = tl.zeros([BK, BV], tl.float32)\n")],
}


def cut_kernel(name: str):
    """_gdn_wy_kernel with CUTS[name]'s lines replaced (bench.edited_kernel)."""
    from ddsim.gpu_backend import triton_gdn as G
    header = ("import triton\nimport triton.language as tl\nfrom ddsim.gpu_backend import triton_helpers as h\n"
              "from ddsim.gpu_backend.triton_gdn import _apart\n\n\n")
    return edited_kernel(G._gdn_wy_kernel, CUTS[name], header=header, who="fused_ablation")


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=2)
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    cuda_run("fused_ablation", a.commit)
    B, T = 1, 16
    default, o, grid, kw, _, _ = wy_default_launch(B, T)
    if kw.get("ROOT") != 2 or not kw.get("RAW16") or not kw.get("HOLD") or kw.get("CHAINS"):
        raise SystemExit(f"fused_ablation: the default at {B} x {T} is not the form these cuts are of")
    forms = {"the form": default}
    for name in CUTS:
        forms[name] = bind(cut_kernel(name), grid, dict(kw, o=torch.empty_like(o)))
    for launch in forms.values():
        launch()
    torch.cuda.synchronize()
    print(f"B x T {B} x {T}, {kw['num_warps']} warps, {kw['BV']}-wide V tiles, NSTEP {kw['NSTEP']}")
    timing_rounds(forms, rounds=a.rounds, calls=a.calls)


if __name__ == "__main__":
    main()
