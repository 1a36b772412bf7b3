"""The L1 test's false-alarm rate and power, measured on exact multinomial draws (ddsim.sampling.stats): for
several vocabulary sizes and draw counts, the fraction of tests on the true distribution that fail (at
alpha = 0.01, so it is visible) and the fraction that flag a distribution moved by the stated detectable total
variation (beta = 0.01). Usage: python benchmarks/check_sampler_calibration.py"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddsim.sampling.stats import detectable_tv, l1_test  # noqa: E402

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    print("| V | draws | alpha | false alarms | stated detectable TV | detected |")
    print("|---|---|---|---|---|---|")
    for V, n in ((4, 20_000), (16, 20_000), (16, 1_000_000), (256, 1_000_000)):
        alpha, runs = 0.01, 2000
        p = rng.dirichlet(np.ones(V))
        false = sum(not l1_test(torch.from_numpy(rng.multinomial(n, p)), torch.from_numpy(p), alpha)["holds"]
                    for _ in range(runs))
        tv = detectable_tv(V, n, alpha)
        q = p.copy()
        order = np.argsort(p)
        moved, i = 0.0, 0
        while moved < tv - 1e-15:  # take tv of mass from the largest cells, give it to the smallest
            take = min(q[order[-1 - i]], tv - moved)
            q[order[-1 - i]] -= take
            q[order[i]] += take
            moved += take
            i += 1
        caught = sum(not l1_test(torch.from_numpy(rng.multinomial(n, q)), torch.from_numpy(p), alpha)["holds"]
                     for _ in range(runs))
        print(f"| {V} | {n} | {alpha} | {false}/{runs} | {tv:.4f} | {caught}/{runs} |", flush=True)
