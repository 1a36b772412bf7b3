"""vLLM's GDN verify kernel on its speculative-decoding path, ``fused_sigmoid_gating_delta_rule_update``
with ``ssm_state_indices`` [B, T] and ``num_accepted_tokens`` [B]: vLLM verifies a chain of draft
tokens, reading the committed state from slot ``ssm_state_indices[b, num_accepted_tokens[b] - 1]``
and writing the state after each token t into slot ``ssm_state_indices[b, t]`` (the engine later
keeps the accepted token's slot). It takes no tree, so on a tree it is the flattened path: leaky
only, exact refused.

Layout translation at the edge: vLLM keeps states as [HV, V, K] (ddsim: [HV, K, V]) and reserves
slot 0 as its null block (a sequence pointed at slot 0 is skipped). The adapter hands the kernel the
caller's pool transposed and shifted by one slot, plus T scratch slots per sequence for the
per-token states, with each sequence's committed slot in the last column of its index row
(num_accepted_tokens = T + 1), so a kernel that writes only the per-token slots leaves the caller's
pool untouched; any write it makes to the caller's slots is reflected back, for the pool properties
to see. Gates as for SGLang: A_log = dt_bias = 0, a = softplus^-1(-g), b = logit(beta).
"""
from __future__ import annotations

import importlib

import torch

from ddsim.engines.graphs import launch
from ddsim.errors import NotInstalled

# where each supported vLLM release keeps the kernel, newest first
LOCATIONS = (
    "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating",  # 0.33
    "vllm.model_executor.layers.fla.ops.fused_sigmoid_gating",  # earlier releases
)


def _kernel():
    missing = None
    for loc in LOCATIONS:
        try:
            return importlib.import_module(loc).fused_sigmoid_gating_delta_rule_update
        except ModuleNotFoundError as e:
            missing = missing or e.name
    raise NotInstalled(f"the package vllm is not installed (missing module {missing!r}; "
                     "pip install vllm, or its wheel with --no-deps)")


def as_contract(fn):
    """fn with vLLM's signature: (A_log, a, b, dt_bias, q, k, v, beta=, threshold=, scale=,
    initial_state= [S, HV, V, K], inplace_final_state=, cu_seqlens=, ssm_state_indices=,
    num_accepted_tokens=, use_qk_l2norm_in_kernel=) -> (o, final_state). Its per-token states (the states its next
    step starts from, at the accepted token) lie in slots after the pool, one per token, which ssm_state_indices
    names: with the contract's ``node_states`` (buffer [M, P, HV, K, V], rows [B]) those slots are the buffer's
    entries (token t of sequence b at buffer row rows[b], step t: slot 1 + N + rows[b] P + t of a pool that holds the
    whole buffer after its N slots), so vLLM's own addressing puts them there, and its writes are carried back;
    without them, B T scratch slots. A pool that is one layer of a slot-major pool goes to the kernel so laid out
    (_slot_major), its writes to any layer carried back."""
    def verify(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale, node_states=None):
        B, T, HV, V = v.shape
        N, K = state_pool.shape[0], q.shape[3]
        dev = q.device
        from ddsim.engines import fused_gates, reflect_writes
        a, b = fused_gates(g, beta)
        zeros = torch.zeros(HV, dtype=torch.float32, device=dev)
        # vLLM's per-token states share the pool, and its dtype (a 16-bit state cache: its mamba cache dtype "auto")
        null = torch.zeros(1, HV, V, K, device=dev, dtype=state_pool.dtype)
        if node_states is None:
            scratch = torch.full((B * T, HV, V, K), float("nan"), device=dev, dtype=state_pool.dtype)  # per-token states
            per_token = 1 + N + torch.arange(B * T, device=dev, dtype=torch.int32).view(B, T)
        else:  # the buffer's entries as per-token slots: [M * P, HV, V, K]
            nodes, rows = node_states
            M, P = nodes.shape[:2]
            scratch = nodes.transpose(-1, -2).reshape(M * P, HV, V, K)
            per_token = (1 + N + rows.to(dev, torch.int32)[:, None] * P
                         + torch.arange(T, device=dev, dtype=torch.int32)[None, :])
        vpool = torch.cat([null, state_pool.transpose(-1, -2), scratch]).contiguous()  # [1 + N + slots, HV, V, K]
        del scratch
        vpool, whole, vwhole, at = _slot_major(vpool, state_pool)
        # [B, T + 1]; a padded row's slot -1 becomes 0, vLLM's null block, which its kernel skips
        indices = torch.cat([per_token, (slots.to(dev, torch.int32) + 1)[:, None]], 1).contiguous()
        accepted = torch.full((B,), T + 1, dtype=torch.int32, device=dev)
        # q, k, v contiguous, as vLLM's layer makes its split of mixed_qkv (rearrange_mixed_qkv) before the kernel
        o, _ = launch(fn, zeros, a.contiguous(), b.contiguous(), zeros, q.contiguous(), k.contiguous(), v.contiguous(),
                  scale=scale, initial_state=vpool, inplace_final_state=True, ssm_state_indices=indices,
                  num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True)
        reflect_writes(vpool[1:1 + N], state_pool)
        if node_states is not None:
            reflect_writes(vpool[1 + N:].view(M, P, HV, V, K), nodes)
        if whole is not None:
            _reflect_other_layers(vwhole, whole, at, N)
        return o[0] if o.dim() == 5 else o
    return verify


def _slot_major(vpool, state_pool):
    """(the pool to hand vLLM's kernel, the caller's whole slot-major pool, the adapter's, the layer): vpool itself
    where the caller's pool is one layer's (None, None, None); where it is one layer of a slot-major pool
    (engines.slot_major_whole; vLLM's kernel reads its pool's slot pitch from stride(0)), vpool laid out the same way,
    every slot of it (the null slot and the per-token ones too) that many layers wide, the caller's other layers'
    entries copied beside its own slots (NaN beside the others)."""
    from ddsim.engines import slot_major_layer, slot_major_whole
    whole = slot_major_whole(state_pool)
    if whole is None:
        return vpool, None, None, None
    S, L, E = vpool.shape[0], whole.shape[1], vpool[0].numel()
    at = slot_major_layer(state_pool)
    vwhole = torch.full((S, L, E), float("nan"), dtype=vpool.dtype, device=vpool.device)
    vwhole[:, at] = vpool.flatten(1)
    N = whole.shape[0]
    for l in range(L):
        if l != at:
            vwhole[1:1 + N, l] = whole[:, l].reshape(N, E)  # as the caller lays it out: compared bitwise only
    return vwhole[:, at].view(vpool.shape), whole, vwhole, at


def _reflect_other_layers(vwhole, whole, at: int, N: int) -> None:
    """The kernel's writes to another layer's entry carried back: beside the caller's slots into its whole pool (the
    caller's properties then see them); beside the adapter's own slots (the null and per-token ones) refused, a raise,
    since no property of the caller's sees those entries."""
    from ddsim.engines import _bits, carry_other_layers
    carry_other_layers(vwhole[1:1 + N], whole, at)
    for l in range(vwhole.shape[1]):
        if l == at:
            continue
        rest = torch.cat([vwhole[:1, l], vwhole[1 + N:, l]])
        if (_bits(rest) != _bits(torch.full_like(rest[:1], float("nan")))).any():
            raise RuntimeError(f"vLLM's kernel wrote layer {l}'s entry of a null or per-token slot, beside the "
                               f"layer {at} it was given")


def adapter():
    from ddsim.engines import EngineKernel, _bound, _version
    fn = _kernel()
    return EngineKernel("vllm.fused_sigmoid_gating_delta_rule_update", ("leaky",), as_contract(fn), "vllm",
                        _version("vllm"), *_bound(fn), pads=("gdn",), node_states=NODE_STATES)


# its per-token states, which its next step reads at the accepted token
NODE_STATES = (("gdn", "leaky"),)
