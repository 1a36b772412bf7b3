"""Trees per second per verify mode (and the oracle) for a preset, at budgets 16/32/64.

    python benchmarks/bench_cpu_modes.py [--preset tiny] [--repeats 5]   (same as `ddsim bench`)

Prints a table; record it in benchmarks/RESULTS.md with date, machine and commit.
"""
import argparse

from ddsim.bench.bench import mode_table

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    print(mode_table(preset=a.preset, repeats=a.repeats, device=a.device))
