"""check-sampler's statistical test: is a table of counts drawn from the expected distribution?

The statistic is the L1 distance between the empirical distribution p^ of n draws and the expected p. Two
facts give a test whose false-alarm rate is bounded for every p and every n, with no large-sample
approximation:

  E ||p^ - p||_1 <= sum_i sqrt(p_i (1 - p_i) / n)            (Jensen, per cell)
  P(||p^ - p||_1 >= E + t) <= exp(-n t^2 / 2)                (McDiarmid: one draw moves it by <= 2 / n)

so rejecting when ||p^ - p||_1 > sum_i sqrt(p_i (1 - p_i) / n) + sqrt(2 ln(1 / alpha) / n) raises a false
alarm with probability at most alpha. Power: if the draws come from q with ||q - p||_1 = d, the same two facts
(for q, over the k cells q can fill) flag them with probability >= 1 - beta once
d >= threshold + sqrt((k - 1) / n) + sqrt(2 ln(1 / beta) / n).

A count in a cell the expected distribution gives probability 0 is a certain failure.
"""
from __future__ import annotations

import math

import torch


def l1_threshold(expected: torch.Tensor, n: int, alpha: float) -> float:
    """The rejection threshold on ||p^ - p||_1 for n draws at false-alarm rate alpha."""
    p = expected.double()
    return float((p * (1 - p)).clamp_min(0).sqrt().sum()) / math.sqrt(n) + math.sqrt(2 * math.log(1 / alpha) / n)


def detectable_tv(cells: int, n: int, alpha: float, beta: float = 0.01) -> float:
    """The total-variation error (half the L1) detected with probability >= 1 - beta by a test over ``cells``
    cells with n draws at false-alarm rate alpha, whatever the expected distribution."""
    l1 = (2 * math.sqrt((cells - 1) / n) + math.sqrt(2 * math.log(1 / alpha) / n)
          + math.sqrt(2 * math.log(1 / beta) / n))
    return 0.5 * l1


def l1_test(counts: torch.Tensor, expected: torch.Tensor, alpha: float) -> dict:
    """counts [k] int, expected [k] (sums to 1) -> {n, l1, threshold, impossible, holds}."""
    n = int(counts.sum())
    p = expected.double()
    emp = counts.double() / max(n, 1)
    impossible = int(counts[p <= 0].sum())
    l1 = float((emp - p).abs().sum())
    thr = l1_threshold(p, n, alpha)
    return {"n": n, "l1": l1, "threshold": thr, "impossible": impossible,
            "holds": impossible == 0 and l1 <= thr}
