"""Elementwise functions whose last bit must not depend on where an element sits.

torch's CPU kernels run transcendental functions (exp, log1p: softplus) in vector lanes with one
approximation and the tail of a tensor with another, so an element's result depends on its index in the
tensor: over a whole [B, T, H] step tensor, a node's discretisation step would depend on its sequence's row
in the batch and on the tree's size. Taken one node's row at a time, it depends on the head alone: the same
bits for a node verified in any batch, or along its history alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def softplus_by_node(d: torch.Tensor) -> torch.Tensor:
    """softplus of d [B, T, H] (any leading dims), one node's last-dim row at a time."""
    if d.numel() == 0:
        return F.softplus(d)
    rows = d.reshape(-1, d.shape[-1])
    return torch.stack([F.softplus(r) for r in rows]).reshape(d.shape)
