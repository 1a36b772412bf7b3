"""How far inside their bars KDA, lightning attention, Mamba1 and Mamba2 lie at their models' serving shapes: the cases
properties/test_serving_shapes.py runs (ddsim.properties.serving_cases), compiled, each row the figures its check
returns. A bf16 output: its relative error over the error of rounding the float64 oracle to bf16 (bar 1.01) and the
share of its entries off the rounded oracle (bar 2%), on the sampled heads or channels; fp32 states (per node, or
committed): the largest error over its bound (bar 1). A case that fails its bar is printed as such, and the script
then exits 1.

    python benchmarks/serving_shape_margins.py [--commit SHA] [--families kda,lightning,mamba1,mamba2]
"""
import argparse
import sys

from ddsim.bench.bench import cuda_run
from ddsim.properties import serving_cases as S


def _cells(fig: dict) -> str:
    """The row's three figures (blank where the call has none)."""
    out = [f"{fig['err_over_cast']:.4f}", f"{fig['off']:.2%}"] if "off" in fig else ["", ""]
    return " | ".join(out + [f"{fig['states_over_bound']:.3f}" if "states_over_bound" in fig else ""])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--families", default=",".join(S.FAMILIES), help="comma-separated, of " + ", ".join(S.FAMILIES))
    a = ap.parse_args()
    families = a.families.split(",")
    unknown = [f for f in families if f not in S.FAMILIES]
    if unknown or not families:
        ap.error(f"--families: expected some of {', '.join(S.FAMILIES)}, got {a.families!r}")
    cuda_run("serving_shape_margins", a.commit)
    print("\n| family | B x T | call | design | output error / rounding's | off the rounded oracle | states' error / bound |")
    print("|---|---|---|---|---|---|---|")
    failed = 0
    for name in families:
        fam = S.FAMILIES[name]
        cases = [("exact", b, t, "triton", False) for b, t in S.EXACT_SHAPES]
        cases += [("leaky", b, t, "triton", False) for b, t in S.LEAKY_SHAPES]
        cases += [(m, b, t, "triton", True) for m, b, t in S.STATE_SHAPES]
        cases += [("exact", b, t, be, False) for be in fam.designs[1:] for b, t in S.DESIGN_SHAPES]
        cases += [("commit", b, t, "triton", False) for b, t in S.COMMIT_SHAPES]
        for mode, B, T, backend, states in cases:
            call = mode + (", every node's state" if states else "")
            try:
                fig = (S.check_commit(fam, B, T, dims="serving") if mode == "commit" else
                       S.check_verify(fam, B, T, mode=mode, backend=backend, states=states, dims="serving"))
                cells = _cells(fig)
            except AssertionError as e:
                failed += 1
                cells = f"FAILS: {str(e).splitlines()[0]} | | "
            print(f"| {name} | {B} x {T} | {call} | {backend} | {cells} |", flush=True)
    if failed:
        print(f"\n{failed} case(s) outside their bars", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
