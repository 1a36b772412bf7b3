"""Verifies whose outputs are right but whose kept per-node states are not, for `ddsim check-kernel` to catch
(tests/test_check_kernel.py). In SGLang's calling convention: GDN verifies that wrap ddsim's drop-in
(engine_api.target_verify, the same semantics as SGLang's kernel) and break one thing in how they keep the node states
in intermediate_states_buffer (SGLang's commit copies the accepted node's state from there), one of them seen only
past 2^31 elements (a GPU's serving profile), and SGLang's own tree conv keeping its windows at the wrong rows; in
vLLM's, its own spec-decode kernel storing its per-token states out of order. Before node states were checked, every
one of them passed check-kernel: a verify's outputs never read a leaf's kept state."""
import functools

import torch

from ddsim.gpu_backend import engine_api


def _keeping(keep):
    """A drop-in that verifies with its node states in a scratch buffer of its own (states [B, T, HV, V, K]), then
    keeps them in the caller's intermediate_states_buffer as ``keep(buffer, rows, states, args, kw)`` does: the
    fault. Without a buffer it is the drop-in itself."""
    @functools.wraps(keep)
    def verify(*args, intermediate_states_buffer=None, intermediate_state_indices=None, **kw):
        if intermediate_states_buffer is None:
            return engine_api.target_verify(*args, **kw)
        B, T = kw["retrieve_parent_token"].shape
        states = torch.full((B, T, *intermediate_states_buffer.shape[2:]), float("nan"),
                            device=intermediate_states_buffer.device, dtype=intermediate_states_buffer.dtype)
        o = engine_api.target_verify(*args, intermediate_states_buffer=states,
                                     intermediate_state_indices=torch.arange(B, dtype=torch.int32, device=states.device),
                                     **kw)
        keep(intermediate_states_buffer, intermediate_state_indices, states, args, kw)
        return o
    return verify


@_keeping
def last_node_state_not_kept(buffer, rows, states, args, kw):
    """The store loop stops one node short: the last node's state is never written (a commit that accepts it
    copies NaN into the pool)."""
    T = states.shape[1]
    buffer[rows.long(), :T - 1] = states[:, :T - 1]


@_keeping
def node_states_by_batch_index(buffer, rows, states, args, kw):
    """intermediate_state_indices ignored: sequence b's node states go to row b, another request's row."""
    buffer[:states.shape[0], :states.shape[1]] = states


@_keeping
def pitch_taken_as_nodes(buffer, rows, states, args, kw):
    """The buffer's pitch taken as this step's node count T, not its stride (SGLang reads it from stride(0): a buffer
    sized for the largest draft keeps it when a step drafts fewer nodes): row r's step t lands at (r T + t) steps."""
    T = states.shape[1]
    flat = buffer.view(-1, *states.shape[2:])  # [M * P, HV, V, K], a view: the writes land
    at = (rows.long()[:, None] * T + torch.arange(T, device=flat.device)).flatten()
    flat[at] = states.flatten(0, 1)


@_keeping
def node_state_before_its_update(buffer, rows, states, args, kw):
    """Each node keeps the state it started from (its parent's; the committed one for the root), not its own."""
    pool, slots = args[9], args[10]
    parents = kw["retrieve_parent_token"].long()
    B, T = parents.shape
    live = (slots >= 0).view(-1, 1, 1, 1)
    committed = torch.where(live, pool[slots.long().clamp(min=0)], 0.0)  # [B, HV, V, K]
    before = torch.stack([committed if t == 0 else states[torch.arange(B), parents[:, t]] for t in range(T)], 1)
    buffer[rows.long(), :T] = before


@_keeping
def node_offsets_in_32_bits(buffer, rows, states, args, kw):
    """The buffer's element offsets ((row P + step) HV V K) computed in 32 bits, wrapping past 2^31: right wherever
    the buffer is smaller, and another row's states (and the right ones never written) past it."""
    B, T = states.shape[:2]
    per = states[0, 0].numel()
    flat = buffer.view(-1)
    P = buffer.shape[1]
    for b in range(B):
        for t in range(T):
            start = ((int(rows[b]) * P + t) * per) % 2 ** 31
            flat[start:start + per] = states[b, t].flatten()


def conv_windows_by_batch_index(x, conv_state, weight, bias=None, activation=None, *, intermediate_conv_window=None,
                                intermediate_state_indices=None, **kw):
    """SGLang 0.5.23's tree conv (its source under .engines) keeping each node's window (intermediate_conv_window,
    which its commit restores the accepted node's window from) at row b, not at intermediate_state_indices[b]."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    if intermediate_conv_window is not None:
        intermediate_state_indices = torch.arange(x.shape[0], dtype=torch.int32, device=x.device)
    return causal_conv1d_update(x, conv_state, weight, bias, activation, intermediate_conv_window=intermediate_conv_window,
                                intermediate_state_indices=intermediate_state_indices, **kw)


def vllm_token_states_reversed(*args, ssm_state_indices=None, num_accepted_tokens=None, **kw):
    """vLLM 0.33.0's spec-decode kernel (its source under .engines) with its per-token index table read back to front:
    token t's state lands in token T - 1 - t's slot (a next step that starts from the accepted token's slot starts
    from another token's state). Its outputs are right: it reads its committed state where it should."""
    from vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating import fused_sigmoid_gating_delta_rule_update
    idx = ssm_state_indices.clone()
    T = idx.shape[1] - 1  # the last column is the committed slot, read at num_accepted_tokens - 1
    idx[:, :T] = idx[:, :T].flip(1)
    return fused_sigmoid_gating_delta_rule_update(*args, ssm_state_indices=idx, num_accepted_tokens=num_accepted_tokens,
                                                  **kw)


def pool_at_float32_offsets(*args, **kw):
    """ddsim's drop-in with its state pool addressed as if it held float32 states, whatever its dtype (a kernel that
    computes a slot's byte offset with sizeof(float)): slot s of a 16-bit pool, a server's bf16 or fp16 state cache,
    is read from the bytes where a float32 pool's slot s would lie, row 2 s (mod N) of it, another request's state.
    Right on every float32 pool; before check-kernel drew 16-bit pools it passed."""
    args = list(args)
    pool, slots = args[9], args[10]  # initial_state_source [N, HV, V, K], initial_state_indices [B]
    if pool.element_size() == 2:
        s = slots.long()
        args[10] = torch.where(s >= 0, (2 * s) % pool.shape[0], s).to(slots.dtype)
    return engine_api.target_verify(*args, **kw)


def slot_pitch_from_shape(*args, **kw):
    """ddsim's drop-in with its pool's slot pitch taken from its shape (one entry of HV V K), not from its stride(0):
    right on a pool whose slots lie one after another; on one layer of a slot-major pool (a server's unified pool,
    which SGLang's kernel reads by stride(0)) slot s is read s entries on from slot 0, another layer's entry. Before
    check-kernel drew slot-major pools it passed."""
    args = list(args)
    pool = args[9]  # initial_state_source [N, HV, V, K]
    entry = pool[0].numel()
    if pool.stride(0) != entry:
        args[9] = pool.as_strided(tuple(pool.shape), (entry, *pool.stride()[1:]), pool.storage_offset())
    return engine_api.target_verify(*args, **kw)


def writes_its_slot_in_another_layer(*args, **kw):
    """ddsim's drop-in that then writes each sequence's committed state into the next layer's entry of its slot (a
    state update addressed by the layer's shape, not the pool's): on a pool of one layer it writes nothing; on one
    layer of a slot-major pool it overwrites another layer's state, which the layer's own view never shows."""
    from ddsim.engines import slot_major_layer, slot_major_whole
    o = engine_api.target_verify(*args, **kw)
    pool, slots = args[9], args[10]
    whole = slot_major_whole(pool)
    if whole is not None:
        layer = slot_major_layer(pool)
        live = slots[slots >= 0].long()
        whole[live, (layer + 1) % whole.shape[1]] = pool[live]
    return o
