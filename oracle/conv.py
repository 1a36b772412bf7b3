"""Depthwise causal conv1d over a tree, the plain way. For node t the W inputs are, oldest first,
the committed window then the node's history (root path for "exact", batch order for "leaky"),
keeping the last W. Window convention: [C, W-1], oldest first; weight [C, W], weight[:, W-1]
multiplies the current input.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ddsim.oracle._paths import check_mode, history, parent_rows

F64 = torch.float64


def _inputs(x_b, window_b, hist, W):
    """[C, W] the last W inputs seen by the last node of hist, oldest first."""
    seq = [window_b[:, j] for j in range(window_b.shape[1])] + [x_b[n] for n in hist]
    return torch.stack(seq[-W:], dim=1)


def tree_causal_conv1d(x, *, weight, bias=None, parents, initial_window, mode="exact",
                       activation="silu", output_windows=False):
    """x: [B, T, C]; weight: [C, W]; bias: [C] or None; parents: [B, T]; initial_window: [B, C, W-1].

    Returns out [B, T, C] float64 and, with output_windows, the window after each node
    [B, T, C, W-1] (the node's own input newest).
    """
    check_mode(mode)
    if x.dim() != 3:
        raise ValueError(f"x: expected [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    if weight.dim() != 2 or weight.shape[0] != C:
        raise ValueError(f"weight: expected [C, W] with C={C}, got {tuple(weight.shape)}")
    W = weight.shape[1]
    if tuple(initial_window.shape) != (B, C, W - 1):
        raise ValueError(f"initial_window: expected [B, C, W-1] = {(B, C, W - 1)}, got {tuple(initial_window.shape)}")
    if activation not in ("silu", None):
        raise ValueError(f"activation: expected 'silu' or None, got {activation!r}")
    rows = parent_rows(parents, B, T)
    x, w, win = (t.detach().to("cpu", F64) for t in (x, weight, initial_window))
    bias = None if bias is None else bias.detach().to("cpu", F64)
    out = torch.zeros(B, T, C, dtype=F64)
    windows = torch.zeros(B, T, C, W - 1, dtype=F64) if output_windows else None
    for b in range(B):
        for t in range(T):
            xin = _inputs(x[b], win[b], history(rows[b], t, mode), W)  # [C, W]
            y = (xin * w).sum(dim=1)
            if bias is not None:
                y = y + bias
            out[b, t] = F.silu(y) if activation == "silu" else y
            if windows is not None:
                windows[b, t] = xin[:, 1:]
    return (out, windows) if output_windows else out


def conv_tree_commit(x, *, parents, accepted, initial_window):
    """Window after accepting root..accepted[b]: [B, C, W-1] float64."""
    B, T, C = x.shape
    W1 = initial_window.shape[-1]
    rows = parent_rows(parents, B, T)
    x, win = x.detach().to("cpu", F64), initial_window.detach().to("cpu", F64)
    out = torch.zeros(B, C, W1, dtype=F64)
    for b in range(B):
        a = int(accepted[b])
        if not 0 <= a < T:
            raise ValueError(f"accepted: sequence {b} node {a} is outside 0..{T - 1}")
        out[b] = _inputs(x[b], win[b], history(rows[b], a, "exact"), W1 + 1)[:, 1:]
    return out
