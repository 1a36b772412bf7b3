"""Where a kernel's time goes, from Nsight Compute's source page: warp stall samples by reason, samples and
executed instructions by span of the code (address order), and what a span executes per program, read from the
page's CSV (per SASS instruction). Produced on the device:

    ncu --set full --import-source yes -k regex:_gdn_wy_fold_head -c 1 -o head \\
        python3 benchmarks/profile_wy_fold.py --shapes 8x65 --ncu --design auto
    ncu -i head.ncu-rep --page source --csv --print-source sass > head-sass.csv

then, anywhere:

    python benchmarks/ncu_sass_summary.py head-sass.csv --programs 384 [--span 200] [--split 6150]

--programs: the grid's programs (B * HV for the head kernel), for per-program counts; --split: an instruction
index at which to split the per-program counts of local / global / shared memory, MMA and conversion
instructions (the head kernel's V-tile loop began at 6272 at d1c5305).
"""
import argparse
import collections
import csv
import sys

SAMPLES, EXECUTED = "Warp Stall Sampling (All Samples)", "Instructions Executed"
WATCH = ("LDL", "STL", "LDG", "STS", "LDS", "HGMMA", "BAR", "F2F")


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    words = source.strip().split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def summary(rows: list[list[str]], header: list[str], programs: int, span: int, split: int | None) -> list[str]:
    col = {h: i for i, h in enumerate(header)}
    if SAMPLES not in col or EXECUTED not in col or "Source" not in col:
        raise ValueError(f"not an Nsight Compute source page with SASS metrics (columns {header[:4]}...)")
    src = col["Source"]
    samples = [number(r[col[SAMPLES]]) for r in rows]
    executed = [number(r[col[EXECUTED]]) for r in rows]
    total_s, total_e = sum(samples) or 1.0, sum(executed)
    out = [f"SASS instructions {len(rows)}, warp stall samples {sum(samples):.0f}, warp instructions executed "
           f"{total_e:.0f} ({total_e / programs:.0f} a program)", "stall reasons (share of samples):"]
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    for h, v in sorted(((h, sum(number(r[col[h]]) for r in rows)) for h in reasons), key=lambda x: -x[1])[:10]:
        out.append(f"  {h[6:]:20s} {v / total_s:6.1%}")
    out.append(f"by {span}-instruction span of the code (address order): share of samples, warp instructions a "
               "program, top opcodes")
    for i in range(0, len(rows), span):
        ops = collections.Counter(opcode(r[src]) for r in rows[i:i + span])
        out.append(f"  {i:5d} {sum(samples[i:i + span]) / total_s:6.1%} {sum(executed[i:i + span]) / programs:6.0f}  "
                   + ", ".join(f"{k} {v}" for k, v in ops.most_common(5)))
    if split is not None:
        out.append(f"executed a program before instruction {split} / from it:")
        for a, b in ((0, split), (split, len(rows))):
            count = collections.Counter()
            for r, e in zip(rows[a:b], executed[a:b]):
                count[opcode(r[src])] += e / programs
            out.append(f"  {a}-{b}: " + ", ".join(f"{k} {int(count[k])}" for k in WATCH))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--programs", type=int, required=True)
    ap.add_argument("--span", type=int, default=200)
    ap.add_argument("--split", type=int)
    a = ap.parse_args()
    if a.programs < 1 or a.span < 1:
        ap.error("--programs and --span: expected at least 1")
    try:
        with open(a.csv, newline="") as f:
            table = list(csv.reader(f))
        # the page's first row names the kernel, the second the columns
        lines = summary(table[2:], table[1], a.programs, a.span, a.split) if len(table) > 2 else None
    except (OSError, ValueError, IndexError) as e:
        print(f"ncu_sass_summary: {a.csv}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if lines is None:
        print(f"ncu_sass_summary: {a.csv}: no instruction rows", file=sys.stderr)
        raise SystemExit(2)
    print("\n".join(lines))
