"""GDN kernels with planted bugs, in ddsim's calling convention, for `ddsim check-kernel` to catch
(tests/test_check_kernel.py). Each wraps ddsim's torch fast path and breaks one thing."""
import torch

import ddsim.gpu_backend as gb


def parent_off_by_one(q, k, v, g, beta, *, parents, initial_state, mode="exact", scale=None):
    """Every node below depth 1 reads its grandparent's state instead of its parent's."""
    p = parents.clone()
    deep = p > 0
    p[deep] = torch.gather(parents, 1, p.clamp(min=0))[deep]
    return gb.gdn_tree_verify(q, k, v, g, beta, parents=p, initial_state=initial_state, mode=mode, scale=scale,
                              backend="torch")


def wrong_gate_sign(q, k, v, g, beta, *, parents, initial_state, mode="exact", scale=None):
    """exp(-g) instead of exp(g): the state grows where it should decay."""
    return gb.gdn_tree_verify(q, k, v, -g, beta, parents=parents, initial_state=initial_state, mode=mode, scale=scale,
                              backend="torch")


def writes_the_committed_state(q, k, v, g, beta, *, parents, initial_state, mode="exact", scale=None):
    """Right outputs, but the committed state slot is overwritten (a stale or clobbered pool slot)."""
    o = gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode=mode, scale=scale,
                           backend="torch")
    initial_state.mul_(0.5)
    return o


def exact_calling_itself_leaky(q, k, v, g, beta, *, parents, initial_state, mode="exact", scale=None):
    """The exact kernel under a leaky flag: it never leaks, so it is not the flattened path."""
    return gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode="exact",
                              scale=scale, backend="torch")
