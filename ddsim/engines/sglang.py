"""SGLang's GDN target-verify kernel, ``fused_sigmoid_gating_delta_rule_update``: with
``retrieve_parent_token`` the parent-indexed recurrence over per-node intermediate states (exact),
without it the flattened recurrence (leaky, the hybrid-unsafe path); ``disable_state_update`` keeps
the pool slot's state unwritten in both.

Layout translation at the edge: SGLang keeps states as [HV, V, K] (ddsim: [HV, K, V]) in a pool
addressed by slot indices, takes the gates fused (g = -exp(A_log) softplus(a + dt_bias),
beta = sigmoid(b)), and returns o with a leading split-K axis. The adapter passes A_log = dt_bias = 0,
a = softplus^-1(-g), b = logit(beta) (float32; beta is kept 1e-7 inside (0, 1)), and reflects any
write the kernel makes to its copy of the state back into the caller's state, so "state untouched"
checks SGLang's own no-write-back.
"""
from __future__ import annotations

import importlib

import torch

from ddsim.errors import InputError

# where each supported SGLang release keeps the kernel, newest first
LOCATIONS = (
    "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent",  # 0.5.23
    "sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent",  # earlier 0.5.x
)


def _kernel():
    missing = None
    for loc in LOCATIONS:
        try:
            return importlib.import_module(loc).fused_sigmoid_gating_delta_rule_update, loc
        except ModuleNotFoundError as e:
            missing = missing or e.name
    raise InputError(f"--impl sglang: the package sglang is not installed (missing module {missing!r}; "
                     "pip install sglang, or its wheel with --no-deps)")


def as_contract(fn):
    def verify(q, k, v, g, beta, *, parents, initial_state, mode, scale):
        B, T = q.shape[:2]
        HV = v.shape[2]
        dev = q.device
        neg_g = (-g.float()).clamp_min(1e-30)
        a = torch.where(neg_g > 20.0, neg_g, torch.log(torch.expm1(neg_g)))  # softplus(a) = -g (threshold 20)
        b = torch.logit(beta.float().clamp(1e-7, 1 - 1e-7))
        zeros = torch.zeros(HV, dtype=torch.float32, device=dev)
        pool = initial_state.transpose(-1, -2).contiguous()  # [B, HV, V, K]
        before = pool.clone()
        slots = torch.arange(B, dtype=torch.int32, device=dev)
        tree = {}
        if mode == "exact":
            tree = dict(intermediate_states_buffer=torch.zeros(B, T, HV, v.shape[3], q.shape[3], device=dev),
                        intermediate_state_indices=slots, cache_steps=T,
                        retrieve_parent_token=torch.as_tensor(parents, device=dev).to(torch.int32).contiguous())
        o = fn(zeros, a.contiguous(), zeros, 1.0, 20.0, q.contiguous(), k.contiguous(), v.contiguous(), b.contiguous(),
               pool, slots, scale=scale, use_qk_l2norm_in_kernel=True, disable_state_update=True, **tree)
        if not torch.equal(pool, before):  # show the caller what the kernel wrote into its slot
            initial_state.copy_(pool.transpose(-1, -2))
        return o[0] if o.dim() == 5 else o
    return verify


def adapter():
    from ddsim.engines import EngineKernel, _source_of, _version
    fn, _ = _kernel()
    src, digest = _source_of(fn)
    return EngineKernel("sglang.fused_sigmoid_gating_delta_rule_update", ("exact", "leaky"), as_contract(fn), "sglang",
                        _version("sglang"), src, digest)
