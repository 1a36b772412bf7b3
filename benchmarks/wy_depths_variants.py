"""The one-kernel WY form compiled twice for the same tree, on a host plan (DEPTHS off: the launch's rounds) and on a
device plan (DEPTHS on: each sequence's rounds from the depth its tables kernel wrote), for an sm_90 GPU on the CPU
(tests/gpu_compile.py's helpers, Triton's bundled ptxas), each specialized as Triton's launcher specializes the launch
(bench.launch_specialization): the two compilations' fp32 and tensor-core instruction counts, contractible PTX
operations and reduction-layout fingerprints, side by side. Written for the drawn example on which the two plans gave
other bits compiled on an H100 (RESULTS.md, 2026-12-07): one float32 sequence, an 8-node star, K = V = 2, FUSED_ROOT 1,
where the host plan takes one doubling round. --nstep-constant compiles the rounds as Triton does by default (an int
equal to 1 a constant), as the kernels were before _common.ROUNDS_AS_VALUE.

    env -u TRITON_INTERPRET python benchmarks/wy_depths_variants.py [--commit SHA] [--root 0|1|2] [--nodes 8]
                                                                    [--nstep-constant]
"""
import argparse
import collections
import sys
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--root", type=int, choices=(0, 1, 2), default=1, help="triton_gdn.FUSED_ROOT")
    ap.add_argument("--nodes", type=int, default=8, help="nodes of the star (2..64)")
    ap.add_argument("--nstep-constant", action="store_true", help="NSTEP specialized as Triton's default (1 a constant)")
    a = ap.parse_args()
    if not 2 <= a.nodes <= 64:
        ap.error(f"--nodes: expected 2..64, got {a.nodes}")
    sys.argv = [sys.argv[0], "--arch", "90"]  # gpu_compile reads its target from the command line
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import gpu_compile as G
    import torch

    from ddsim.gpu_backend import checks, device_checks, triton_gdn
    triton_gdn.FUSED_ROOT = a.root
    if a.nstep_constant:
        from rounds_specialization import specialize_rounds  # a sibling: the WY kernels' rounds as Triton's default
        specialize_rounds(True)
    gen = torch.Generator().manual_seed(0)
    B, T, K, V = 1, a.nodes, 2, 2
    q, k = (torch.randn(B, T, 1, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, 1, V, generator=gen)
    g, beta = -torch.rand(B, T, 1, generator=gen), torch.rand(B, T, 1, generator=gen)
    s0 = torch.randn(B, 1, K, V, generator=gen)
    parents = torch.tensor([[-1] + [0] * (T - 1)])
    rounds = "a constant where 1 (Triton's default)" if a.nstep_constant else "a value (_common.ROUNDS_AS_VALUE)"
    print(f"# commit {a.commit} | sm_90 (compiled on the CPU) | a {T}-node star, float32, K = V = 2, FUSED_ROOT {a.root} "
          f"| NSTEP {rounds}")
    print("| plan | kernel | DEPTHS | NSTEP | FFMA | FMUL | FADD | HMMA | contractible PTX ops | reductions |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, plan in (("host", checks.TreePlan(parents)), ("device", device_checks.DevicePlan(parents.int()))):
        G.GOT.clear()
        triton_gdn.plan_wy(q, k, v, g, beta, parents=plan, initial_state=s0, design="fused", poison=False)
        kernel, kw = next((kern, kw) for kern, kw in G.GOT if "DEPTHS" in kw)
        ck = G.compile_for(kernel, kw)
        ops = collections.Counter(G.opcode(i).split()[0] for i in G.sass_instructions(ck))
        hmma = sum(c for o, c in ops.items() if o.startswith("HMMA"))
        print(f"| {name} | {kernel.__name__} | {kw['DEPTHS']} | {kw['NSTEP']} | {ops['FFMA']} | {ops['FMUL']} | {ops['FADD']} | {hmma} | "
              f"{G.contractible(ck)} | {G.reductions(ck)} |")


if __name__ == "__main__":
    main()
