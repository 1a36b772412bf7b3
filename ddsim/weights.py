"""Synthetic weights for the hybrid decoder, deterministic from a seed.

Weights are a flat dict of tensors with these names (shapes for hidden d, vocab N):
  embed [N, d]; final_norm [d]; lm_head [N, d]
  layers.{i}.input_norm [d]; layers.{i}.post_norm [d]
  layers.{i}.mlp.gate [I, d]; .up [I, d]; .down [d, I]                       (SwiGLU)
  attention layer: .attn.q [nh*hd, d]; .attn.k [nkv*hd, d]; .attn.v [nkv*hd, d]; .attn.o [d, nh*hd]
  gdn layer: .gdn.qkv [2*H*K + HV*V, d]; .gdn.z [HV*V, d]; .gdn.a [HV, d]; .gdn.b [HV, d];
             .gdn.conv [2*H*K + HV*V, W]; .gdn.A_log [HV]; .gdn.dt_bias [HV]; .gdn.norm [V];
             .gdn.out [d, HV*V]
The oracle and the fast path read the same dict; nothing else is shared.
"""
from __future__ import annotations

import math

import torch

from ddsim.config import ModelConfig


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def init_weights(cfg: ModelConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Random weights with the gate and logit statistics of the config (see ddsim.config)."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    d, N, L = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    out_scale = 1.0 / math.sqrt(2.0 * L)

    def normal(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def linear(n_out, n_in, scale=1.0):
        return normal(n_out, n_in, std=scale / math.sqrt(n_in))

    w: dict[str, torch.Tensor] = {"embed": normal(N, d)}
    for i, kind in enumerate(cfg.layer_pattern):
        p = f"layers.{i}."
        w[p + "input_norm"] = 1.0 + normal(d, std=0.05)
        w[p + "post_norm"] = 1.0 + normal(d, std=0.05)
        I = cfg.intermediate_size
        w[p + "mlp.gate"] = linear(I, d)
        w[p + "mlp.up"] = linear(I, d)
        w[p + "mlp.down"] = linear(d, I, out_scale)
        if kind == "a":
            nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            w[p + "attn.q"] = linear(nh * hd, d)
            w[p + "attn.k"] = linear(nkv * hd, d)
            w[p + "attn.v"] = linear(nkv * hd, d)
            w[p + "attn.o"] = linear(d, nh * hd, out_scale)
        else:
            HV, V, W = cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.conv_kernel_size
            C = cfg.conv_dim
            w[p + "gdn.qkv"] = linear(C, d)
            w[p + "gdn.z"] = linear(HV * V, d)
            # gate input a = x . W_a has std gate_noise for unit-RMS x
            w[p + "gdn.a"] = linear(HV, d, cfg.gate_noise)
            w[p + "gdn.b"] = linear(HV, d)
            w[p + "gdn.conv"] = normal(C, W, std=1.0 / math.sqrt(W))
            # A ~ U(1, 16) as initialised in Qwen3-Next; dt_bias sets each head's typical decay
            A = 1.0 + 15.0 * torch.rand(HV, generator=gen)
            lo, hi = cfg.gate_halflife
            frac = (torch.arange(HV, dtype=torch.float64) + 0.5) / HV
            frac = frac[torch.randperm(HV, generator=gen)]
            halflife = lo * (hi / lo) ** frac  # log-uniform quantiles, shuffled across heads
            dt = math.log(2.0) / (halflife * A.double())  # -g = A * dt = ln2 / halflife
            w[p + "gdn.A_log"] = torch.log(A)
            w[p + "gdn.dt_bias"] = _inv_softplus(dt).float()
            w[p + "gdn.norm"] = 1.0 + normal(V, std=0.05)
            w[p + "gdn.out"] = linear(d, HV * V, out_scale)
    w["final_norm"] = 1.0 + normal(d, std=0.05)
    w["lm_head"] = linear(N, d, cfg.logit_std)
    return {k: v.to(device=device, dtype=dtype) for k, v in w.items()}
