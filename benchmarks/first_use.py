"""When the one-kernel WY form first uses what it reads, compiled offline (no GPU): for each place of the root
(triton_gdn.FUSED_ROOT), each way of its products by q and k (triton_gdn.FUSED_RAW16: bf16 as read, or l2-normed
in fp32) and, with the root's place 2, its state's use held behind its state-free products or not
(triton_gdn.FUSED_HOLD), and with q and k as read, the rows' norms from the products' diagonals or summed from the
rows as read (triton_gdn.FUSED_ROWNORM) and the state's products in one chain or two (triton_gdn.FUSED_CHAINS),
at one sequence of a few nodes, the kernel design "fused" launches compiled for sm_90 with Triton's bundled ptxas,
and in its machine code, for every 128-bit global read (LDG.E.128: the state tile is most
of them, 16 a thread at 4 warps and 64-wide V tiles), how many barriers (BAR.SYNC) and tensor-core MMAs (HMMA)
come before the first instruction that uses its registers. A read first used before any barrier holds up
everything after it until it arrives; one first used after the solve's MMAs lets the solve run while it is in
flight (the held form measured 0.1-0.4 us less device time on the H200, forms that held it behind the solve
slower: RESULTS.md). Also: instructions, barriers, MMAs, registers
and stack (spills). The kernel is compiled with NSTEP as a runtime value (its doubling loop present), where the JIT
specializes NSTEP = 1 (DDTree's trees at 16 nodes) into a constant.

    python benchmarks/first_use.py [--commit SHA] [--shape 1x16] [--roots 0,2] [--raw16 1,0] [--warps 4] [--block-v 64]
                                   [--hold 1] [--rownorm 1] [--chains 0]
"""
import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

import torch  # noqa: E402
import triton  # noqa: E402

from ddsim.bench.bench import (  # noqa: E402
    add_fused_sweep_options,
    fused_root_sweep,
    fused_sweep_options,
    parse_shape,
)
from tests import gpu_compile as G  # noqa: E402  (its launch capture, offline compile and machine-code reading)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shape", default="1x16")
    add_fused_sweep_options(ap, roots="0,2", raw16="1,0", warps="4", block_v="64")
    a = ap.parse_args()
    B, T = parse_shape(ap, a.shape)
    sweep = fused_sweep_options(ap, a)
    print(f"# {time.strftime('%Y-%m-%d')} | compiled for sm_90 on the CPU | triton {triton.__version__} | "
          f"commit {a.commit} | {B} x {T}, bf16 inputs, Qwen3.6-27B GDN shapes")
    print("| FUSED_ROOT | FUSED_RAW16 | FUSED_HOLD | FUSED_ROWNORM | FUSED_CHAINS | warps | V tile | instructions | "
          "barriers | MMAs | registers | stack B | 128-bit reads by where first used: (barriers, MMAs before it) x count |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for *_, warps, bv in fused_root_sweep(**sweep):
        (kernel, kw), = G.launches(B, T, torch.bfloat16, "fused", block_v=bv, num_warps=warps)
        ck = G.compile_for(kernel, kw)
        ins, res = G.sass_instructions(ck), G.cuobjdump(ck, "-res-usage")
        reg, stack = re.search(r"REG:(\d+)", res).group(1), re.search(r"STACK:(\d+)", res).group(1)
        found = G.first_uses(ins)
        order = sorted(w for w in found if w != "never") + (["never"] if "never" in found else [])
        flags = " | ".join(str(int(kw[f])) for f in ("ROOT", "RAW16", "HOLD", "ROWNORM", "CHAINS"))
        print(f"| {flags} | {warps} | {bv} | {len(ins)} | "
              f"{sum('BAR.SYNC' in x for x in ins)} | {sum(map(G.is_mma, ins))} | {reg} | {stack} | "
              f"{', '.join(f'{w} x {found[w]}' for w in order)} |", flush=True)


if __name__ == "__main__":
    main()
