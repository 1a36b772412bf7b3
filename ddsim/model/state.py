"""The committed decoding state: a plain data container read by the oracle and the fast path alike."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelState:
    """Everything committed before a verify block.

    pos: committed positions with cached KV (= prefix_len; the block's root sits at position pos).
    kv[l]: (K [P, nkv, hd], V [P, nkv, hd]) for layers with attention ('a', 'p'), else None.
    ssm[l]: the recurrent state, S [HV, K, V] for GDN layers, h [H, P, N] for Mamba2 layers ('m',
            'p'), else None (float32 in the fast path, float64 in the oracle).
    conv[l]: the conv window [C, W-1], oldest first, for recurrent layers, else None.
    """
    pos: int
    kv: list
    ssm: list
    conv: list

    def to(self, dtype: torch.dtype | None = None, device=None) -> "ModelState":
        def cv(x):
            return None if x is None else x.to(device=device or x.device, dtype=dtype or x.dtype)
        return ModelState(self.pos, [None if p is None else (cv(p[0]), cv(p[1])) for p in self.kv],
                          [cv(s) for s in self.ssm], [cv(c) for c in self.conv])

    def clone(self) -> "ModelState":
        def c(x):
            return None if x is None else x.clone()
        return ModelState(self.pos, [None if p is None else (c(p[0]), c(p[1])) for p in self.kv],
                          [c(s) for s in self.ssm], [c(w) for w in self.conv])


def empty_state(cfg, *, dtype=torch.float32, device="cpu", layer_devices=None) -> ModelState:
    """The state before any token: empty KV, zero recurrent state and conv window, each layer's on
    ``device`` or, with a placement, on its own entry of ``layer_devices``."""
    kv, ssm, conv = [None] * cfg.num_layers, [None] * cfg.num_layers, [None] * cfg.num_layers
    devs = layer_devices or [device] * cfg.num_layers
    shape = (0, cfg.num_key_value_heads, cfg.head_dim)
    for i in cfg.attention_layers:
        kv[i] = (torch.zeros(shape, dtype=dtype, device=devs[i]), torch.zeros(shape, dtype=dtype, device=devs[i]))
    for i in cfg.recurrent_layers:
        ssm[i] = torch.zeros(cfg.state_shape(i), dtype=dtype, device=devs[i])
        conv[i] = torch.zeros(cfg.window_shape(i), dtype=dtype, device=devs[i])
    return ModelState(0, kv, ssm, conv)
