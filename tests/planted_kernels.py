"""GDN kernels with planted bugs, in ddsim's calling convention, for `ddsim check-kernel` to catch
(tests/test_check_kernel.py). Each wraps ddsim's torch fast path and breaks one thing. The pool
is ``initial_state`` [N, HV, K, V], the batch's slots ``state_indices`` [B]."""
import torch

import ddsim.gpu_backend as gb


def _verify(q, k, v, g, beta, *, parents, initial_state, state_indices, mode, scale):
    return gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state,
                              state_indices=state_indices, mode=mode, scale=scale, backend="torch")


def parent_off_by_one(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Every node below depth 1 reads its grandparent's state instead of its parent's."""
    p = parents.clone()
    deep = p > 0
    p[deep] = torch.gather(parents, 1, p.clamp(min=0))[deep]
    return _verify(q, k, v, g, beta, parents=p, initial_state=initial_state, state_indices=state_indices, mode=mode,
                   scale=scale)


def wrong_gate_sign(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """exp(-g) instead of exp(g): the state grows where it should decay."""
    return _verify(q, k, v, -g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale)


def writes_the_committed_state(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                               scale=None):
    """Right outputs, but the batch's committed pool slots are overwritten (a clobbered slot)."""
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                mode=mode, scale=scale)
    initial_state[state_indices.long()] *= 0.5
    return o


def reads_slot_by_batch_index(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                              scale=None):
    """A stale pool slot: sequence b reads pool slot b, not the slot it was given."""
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state[: q.shape[0]], state_indices=None,
                   mode=mode, scale=scale)


def writes_a_slot_outside_the_batch(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                                    scale=None):
    """Right outputs, but a pool slot no sequence of the batch owns is written (a scatter off by one)."""
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                mode=mode, scale=scale)
    owned = set(state_indices.tolist())
    initial_state[min(s for s in range(initial_state.shape[0]) if s not in owned)] = 0.0
    return o


def exact_calling_itself_leaky(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                               scale=None):
    """The exact kernel under a leaky flag: it never leaks, so it is not the flattened path."""
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode="exact", scale=scale)


def conv_skips_the_grandparent(x, *, weight, bias=None, parents, initial_window, state_indices=None, mode="exact",
                               activation="silu"):
    """A tree conv (ddsim's tree_causal_conv1d signature) whose nodes below depth 1 take their
    grandparent's input where the parent's belongs: a wrong hop in the parent walk."""
    p = parents.clone()
    deep = p > 0
    p[deep] = torch.gather(parents, 1, p.clamp(min=0))[deep]
    return gb.tree_causal_conv1d(x, weight=weight, bias=bias, parents=p, initial_window=initial_window,
                                 state_indices=state_indices, mode=mode, activation=activation, backend="torch")


def mamba2_parent_off_by_one(x, dt, A, B, C, *, D=None, dt_bias=None, parents, initial_state, state_indices=None,
                             mode="exact"):
    """A Mamba2 tree verify (ddsim's mamba2_tree_verify signature) whose nodes below depth 1 read
    their grandparent's state instead of their parent's."""
    p = parents.clone()
    deep = p > 0
    p[deep] = torch.gather(parents, 1, p.clamp(min=0))[deep]
    return gb.mamba2_tree_verify(x, dt, A, B, C, D=D, dt_bias=dt_bias, parents=p, initial_state=initial_state,
                                 state_indices=state_indices, mode=mode, backend="torch")


def mamba2_forgets_dt_bias(x, dt, A, B, C, *, D=None, dt_bias=None, parents, initial_state, state_indices=None,
                           mode="exact"):
    """A Mamba2 tree verify that drops dt_bias from the step (softplus(dt) instead of softplus(dt + dt_bias))."""
    return gb.mamba2_tree_verify(x, dt, A, B, C, D=D, dt_bias=None, parents=parents, initial_state=initial_state,
                                 state_indices=state_indices, mode=mode, backend="torch")


def mamba2_writes_x_in_place(x, dt, A, B, C, *, D=None, dt_bias=None, parents, initial_state, state_indices=None,
                             mode="exact"):
    """Right outputs, but the caller's x is overwritten afterwards (a kernel reusing its input as scratch)."""
    y = gb.mamba2_tree_verify(x, dt, A, B, C, D=D, dt_bias=dt_bias, parents=parents, initial_state=initial_state,
                              state_indices=state_indices, mode=mode, backend="torch")
    x.zero_()
    return y


# ---- kernels wrong along one serving dimension only (the second hostile probe): every one passed the
# small drawn examples, each must be caught by the quick profile's explicit examples ---------------------

def _nudged(o, rows):
    """o with the rows selected by the boolean ``rows`` (broadcast over o's leading dims) scaled by 1.01."""
    return torch.where(rows, o * 1.01, o)


def wrong_past_16_nodes(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Right on trees of up to 16 nodes; past that, nodes 16 and on are 1% off (a block boundary bug)."""
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices, mode=mode,
                scale=scale)
    nodes = torch.arange(o.shape[1], device=o.device)[None, :, None, None] >= 16
    return _nudged(o, nodes)


def wrong_past_key_width_16(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Right for K <= 16; for wider keys only the first 16 key channels enter the output's scale."""
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices, mode=mode,
                scale=scale)
    return o * 1.01 if q.shape[-1] > 16 else o


def wrong_from_the_third_sequence(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                                  scale=None):
    """Right for the first two sequences of a batch, 1% off from the third on."""
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices, mode=mode,
                scale=scale)
    return _nudged(o, torch.arange(o.shape[0], device=o.device)[:, None, None, None] >= 2)


def wrong_for_slot_ids_above_7(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                               scale=None):
    """A slot index kept in 3 bits: a sequence in slot 8 or above reads slot id & 7."""
    idx = state_indices.long() & 7
    pool = initial_state.clone()
    pool[state_indices.long()] = initial_state[idx]
    return _verify(q, k, v, g, beta, parents=parents, initial_state=pool, state_indices=state_indices, mode=mode,
                   scale=scale)


def wrong_for_4_value_heads_per_key_head(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                                         scale=None):
    """A head mapping that holds for up to 3 value heads per key head and breaks from 4 on (shown here as
    the wrong key heads and a 1% error on those calls)."""
    H, HV = q.shape[2], v.shape[2]
    if HV // H >= 4:
        heads = (torch.arange(HV, device=q.device) // 2) % H
        qq, kk = q[:, :, heads], k[:, :, heads]  # one key head per value head, the wrong ones
        o = _verify(qq, kk, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                    mode=mode, scale=scale)
        return o * 1.01
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices, mode=mode,
                   scale=scale)


def clamps_strong_decay(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Gates clamped at g >= -5 (an exp underflow guard): right for slowly decaying gates only."""
    return _verify(q, k, v, g.clamp(min=-5.0), beta, parents=parents, initial_state=initial_state,
                   state_indices=state_indices, mode=mode, scale=scale)


def _as_if_contiguous(t):
    """t's elements read as a kernel that computes its offsets from t's shape reads them: from t's first element on,
    row after row, as if t were contiguous."""
    return torch.as_strided(t, t.shape, torch.empty(t.shape, device="meta").stride(), t.storage_offset())


def strides_from_shapes(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Offsets from the shapes (token t of sequence b at (b T + t) H K): right on contiguous inputs, the wrong columns
    on q, k, v split from one projection, as a server's layer passes them."""
    return _verify(_as_if_contiguous(q), _as_if_contiguous(k), _as_if_contiguous(v), g, beta, parents=parents,
                   initial_state=initial_state, state_indices=state_indices, mode=mode, scale=scale)


def mamba2_strides_from_shapes(x, dt, A, B, C, *, D=None, dt_bias=None, parents, initial_state, state_indices=None,
                               mode="exact"):
    """A Mamba2 tree verify whose offsets come from its inputs' shapes: wrong on x, B, C split from one xBC."""
    return gb.mamba2_tree_verify(_as_if_contiguous(x), dt, A, _as_if_contiguous(B), _as_if_contiguous(C), D=D,
                                 dt_bias=dt_bias, parents=parents, initial_state=initial_state,
                                 state_indices=state_indices, mode=mode, backend="torch")


_CALLS = [0]


def wrong_on_one_call_in_twenty(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                                scale=None):
    """Right, except on every twentieth call (a race)."""
    _CALLS[0] += 1
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices, mode=mode,
                scale=scale)
    return o * 1.01 if _CALLS[0] % 20 == 0 else o


_SEEN: set = set()


def wrong_once_per_input(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Wrong the first time it sees an input (by q's bits), right on every call after (a race that a re-run hides)."""
    import hashlib
    key = hashlib.sha256(q.detach().float().cpu().numpy().tobytes() + repr(tuple(q.shape)).encode()).hexdigest()
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices, mode=mode,
                scale=scale)
    if key in _SEEN:
        return o
    _SEEN.add(key)
    return o * 1.01 + 0.01


def output_with_an_extra_axis(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                              scale=None):
    """The right values, returned as [1, B, T, HV, V]."""
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale).unsqueeze(0)


def output_heads_flattened(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """The right values, returned as [B, T, HV * V]."""
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices, mode=mode,
                scale=scale)
    return o.reshape(*o.shape[:2], -1)


def output_as_a_list(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """The right values, returned as nested lists."""
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale).tolist()


def normalises_k_in_place(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Right outputs, but k is l2-normalised in place: the caller's tensor is changed."""
    k.div_(torch.sqrt((k.float() ** 2).sum(-1, keepdim=True) + 1e-6).to(k.dtype))
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale)


def hangs_past_128_nodes(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Right up to 128 nodes; past that it never returns (as SGLang 0.5.23's tree conv did at 257 nodes on
    an H200)."""
    if q.shape[1] > 128:
        import time
        time.sleep(3600)
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale)


class Fault:
    """A planted device fault's state: once a kernel has faulted, every later call raises (a real fault ends the
    process's CUDA context); tests stand ``lost`` in for check_kernel's context check."""
    hit = False
    ECHO = "CUDA error: an illegal memory access was encountered"

    @classmethod
    def lost(cls, device) -> bool:
        return cls.hit


def refuses_every_call(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Raises on every input, serving or drawn (a kernel that cannot run here at all), in a message of two lines."""
    raise ValueError(f"no kernel for {tuple(q.shape)}\n(a second line)")


def faults_past_64_nodes(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Right up to 64 nodes; past that an illegal address, and every call after it raises its echo."""
    if Fault.hit or q.shape[1] > 64:
        Fault.hit = True
        raise RuntimeError(Fault.ECHO)
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale)


def faults_on_the_device_past_64_nodes(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                                       scale=None):
    """On a GPU, right up to 64 nodes; past that a store 2^40 elements past q (an illegal address, which ends the
    process's CUDA context). Elsewhere right everywhere."""
    if q.is_cuda and q.shape[1] > 64:
        _stray_store()[(1,)](q, 1 << 40)
        torch.cuda.synchronize(q.device)
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale)


def _stray_store():
    import triton
    import triton.language as tl

    @triton.jit
    def stray_store(ptr, offset):
        tl.store(ptr + offset, 0.0)
    return stray_store


def reads_one_past_the_output(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                              scale=None):
    """Right outputs, passed through a Triton copy whose load takes one entry past the output's end (its value never
    stored): compiled, a read of a neighbour's memory that a GPU may let by; interpreted, held to the launch's tensors
    (ddsim.engines.triton_interpret.check_bounds), an error."""
    o = _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                mode=mode, scale=scale).contiguous()
    out = torch.empty_like(o)
    n = o.numel()
    _copy_one_past()[(1,)](o, out, n, BLOCK=1 << n.bit_length())
    return out


def _copy_one_past():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_one_past(x, y, n, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        tl.store(y + o, tl.load(x + o, mask=o <= n), mask=o < n)
    return copy_one_past


# ---- KDA verifies (ddsim's kda_tree_verify signature), each wrong in one way --------------------------------

def kda_decay_per_head(q, k, v, g, beta, *, parents, initial_state, mode="exact"):
    """KDA run as GDN: one decay per head (the mean of its key channels' log decays) instead of one per channel."""
    return gb.kda_tree_verify(q, k, v, g.mean(-1, keepdim=True).expand_as(g), beta, parents=parents,
                              initial_state=initial_state, mode=mode)


def kda_wrong_past_key_width_64(q, k, v, g, beta, *, parents, initial_state, mode="exact"):
    """Right for heads of up to 64 key channels; Kimi Linear's 128 are 1% off (a tile-size bug): only the
    explicit serving example at K = V = 128 reaches it."""
    o = gb.kda_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode=mode)
    return o * 1.01 if q.shape[-1] > 64 else o


# ---- lightning-attention verifies (ddsim's lightning_tree_verify signature) ---------------------------------

def lightning_decays_after_the_update(q, k, v, *, decay, parents, initial_state, mode="exact"):
    """S_t = decay (S_{t-1} + k_t v_t^T) instead of decay S_{t-1} + k_t v_t^T: the new token's own term decayed
    once (a common slip when the decay is folded into the state's read); equal where the decay is 1."""
    return gb.lightning_tree_verify(q, k * decay[:, None].to(k.dtype), v, decay=decay, parents=parents,
                                    initial_state=initial_state, mode=mode)


def stalls_once_called(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """A correct kernel that, called, touches the file DDSIM_TEST_CALLED names and waits a minute: a check-kernel
    inside a kernel's call, for a signal sent there (tests/test_report_files.py)."""
    import os
    import pathlib
    import time
    pathlib.Path(os.environ["DDSIM_TEST_CALLED"]).touch()
    time.sleep(60)
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale)
