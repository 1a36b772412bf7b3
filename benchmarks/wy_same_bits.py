"""Whether the WY verify gives the same bits at two commits, in Triton's interpreter on the CPU: every design (fused,
split, fold with and without the root folded in, head, auto; past one block at 70 nodes), fp32 and fp16 inputs,
given gates and gates fused from a, b, A_log, dt_bias, at small shapes (H=2, HV=4, K=V=32) and fixed seeds. For a
change meant to move work, not arithmetic (the kernels' reads issued first, 4f2ea9f): the other commit's package laid
out by benchmarks/tree_at.py runs in a subprocess, this checkout's here, and every output is compared bit for bit.

    python benchmarks/tree_at.py COMMIT DIR
    python benchmarks/wy_same_bits.py --against DIR     # exit 1 where any output differs
"""
import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import torch  # noqa: E402

SHAPES = ((1, 17), (2, 9), (2, 33), (1, 70))


def outputs() -> dict:
    """{case name: output} at this interpreter's ddsim."""
    from ddsim.bench.bench import ddtree_batch, kernel_inputs
    from ddsim.gpu_backend.triton_gdn import plan_wy
    out = {}
    for B, T in SHAPES:
        _, parents = ddtree_batch(B, T, depth=6)
        for dtype in (torch.float32, torch.float16):
            torch.manual_seed(0)
            inp = kernel_inputs(B, T, H=2, HV=4, K=32, V=32, dtype=dtype, device="cpu")
            qkv = {k: inp[k] for k in ("q", "k", "v", "g", "beta")}
            common = dict(parents=parents, initial_state=inp["initial_state"], poison=True)
            cases = [(d, {}) for d in ("fused", "split", "fold", "head", "auto")] + [("fold", dict(fold_root=False))]
            for design, extra in cases:  # (past one block head and fold are the folded split form)
                launch, o = plan_wy(**qkv, **common, design=design, **extra)
                launch()
                out[f"{B}x{T} {dtype} {design} {extra or ''}"] = o.clone()
            gen = torch.Generator().manual_seed(1)
            fused = dict(a=torch.randn(B, T, 4, generator=gen), b=torch.randn(B, T, 4, generator=gen),
                         A_log=torch.randn(4, generator=gen), dt_bias=torch.randn(4, generator=gen))
            for design in ("fused", "head", "split"):
                launch, o = plan_wy(inp["q"], inp["k"], inp["v"], **common, **fused, design=design)
                launch()
                out[f"{B}x{T} {dtype} {design} fused gates"] = o.clone()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", help="a directory benchmarks/tree_at.py laid another commit's ddsim out in")
    ap.add_argument("--out", help="(internal) write this checkout's outputs here and stop")
    a = ap.parse_args()
    if a.out:
        torch.save(outputs(), a.out)
        return
    if not a.against or not os.path.isdir(os.path.join(a.against, "ddsim")):
        ap.error(f"--against: expected a directory with a ddsim package (benchmarks/tree_at.py), got {a.against!r}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        theirs_file = os.path.join(tmp, "theirs.pt")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(a.against), os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, os.path.abspath(__file__), "--out", theirs_file], env=env, check=True,
                       cwd=tmp)
        theirs = torch.load(theirs_file)
    mine = outputs()
    differ = [k for k in mine if k not in theirs or not torch.equal(mine[k], theirs[k])]
    print(f"{len(mine)} outputs, {len(differ)} differ from {a.against}'s" + "".join(f"\n  {k}" for k in differ))
    sys.exit(1 if differ or set(theirs) != set(mine) else 0)


if __name__ == "__main__":
    main()
