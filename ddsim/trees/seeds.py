"""One way to derive independent random streams from the user's --seed: every seeded draw in ddsim
(the synthetic drafter's per-step logits, the sampling noise per position, test drafters) asks for
``derive_seed(seed, stream, index)``. numpy's SeedSequence mixes the three, so neighbouring seeds,
steps or positions give unrelated streams and two streams never share a generator by accident."""
from __future__ import annotations

import zlib

import numpy as np


def derive_seed(seed: int, stream: str, index: int = 0) -> int:
    """A 63-bit generator seed for draw ``index`` of the named ``stream`` under ``seed``."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be >= 0, got {seed}, {index}")
    entropy = [int(seed), zlib.crc32(stream.encode()), int(index)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))
