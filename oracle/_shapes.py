"""The shapes the recurrences' oracles share (plain checks, one message each)."""
from __future__ import annotations


def qk_shape(q, k) -> tuple[int, int, int, int]:
    """(B, T, H, K) of q and k [B, T, H, K]; q None for a commit, which takes none (the message then names k alone)."""
    if q is None:
        if k.dim() != 4:
            raise ValueError(f"k: expected [B, T, H, K], got {tuple(k.shape)}")
    elif q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q, k: expected [B, T, H, K] each, got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, K = k.shape
    return B, T, H, K


def head_values(v, B: int, T: int, H: int) -> int:
    """V of v [B, T, H, V], a value head per key head (KDA's, lightning attention's)."""
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v: expected [B, T, H, V] with {(B, T, H)}, got {tuple(v.shape)}")
    return v.shape[3]


def state_shape(initial_state, want: tuple, dims: str) -> None:
    """initial_state's shape is ``want`` ([``dims``]), or one ValueError naming both."""
    if tuple(initial_state.shape) != tuple(want):
        raise ValueError(f"initial_state: expected [{dims}] = {tuple(want)}, got {tuple(initial_state.shape)}")
