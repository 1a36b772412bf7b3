"""The verify modes (README, Contracts: verify modes), in one place; a light module so the gate and the reports need no torch."""

VERIFY_MODES = ("exact", "leaky", "leaky-state", "leaky-conv")
LEAK_MODES = VERIFY_MODES[1:]  # the hybrid-unsafe mode and its two single-source attributions
