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
