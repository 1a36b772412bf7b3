"""ddsim's own fast path as an engine: gpu_backend.gdn_tree_verify, tree_causal_conv1d and
mamba2_tree_verify, kda_tree_verify and lightning_tree_verify (Triton on CUDA, torch on the CPU), and the ddsim calling
convention for a kernel of anyone's that shares their signatures."""
from __future__ import annotations

from ddsim.engines.graphs import launch


def fp32_pool(state_pool):
    """The pool to hand ddsim's verifies, which keep float32 states in a pool whose slots lie one after another: a
    float32 (or float64) pool so laid out itself; a server's 16-bit state cache, or one layer of a slot-major pool
    (kernel_cases.SLOT_MAJOR), as a contiguous float32 copy (its values exactly), whose writes carry_back returns."""
    import torch
    keep = state_pool.dtype in (torch.float32, torch.float64)
    if keep and state_pool.is_contiguous():
        return state_pool
    return (state_pool if keep else state_pool.float()).contiguous()


def carry_back(pool, state_pool) -> None:
    """The slots a verify wrote in fp32_pool's copy ``pool``, written back into ``state_pool`` in its dtype and layout
    (nothing where pool is state_pool itself)."""
    if pool is state_pool:
        return
    from ddsim.engines import _bits
    changed = (_bits(pool) != _bits(state_pool.to(pool.dtype))).flatten(1).any(1).nonzero().flatten()
    state_pool[changed] = pool[changed].to(state_pool.dtype)


def as_contract(fn):
    """fn(q, k, v, g, beta, *, parents, initial_state, state_indices, mode, scale) -> o (or (o, ...)),
    as gdn_tree_verify: initial_state is the pool [N, HV, K, V] (a 16-bit or slot-major pool: fp32_pool's copy),
    state_indices [B] the batch's slots."""
    def verify(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale):
        pool = fp32_pool(state_pool)
        out = launch(fn, q, k, v, g, beta, parents=parents, initial_state=pool, state_indices=slots, mode=mode, scale=scale)
        carry_back(pool, state_pool)
        return out[0] if isinstance(out, tuple) else out
    return verify


def as_conv_contract(fn):
    """fn(x, *, weight, bias, parents, initial_window, state_indices, mode, activation) -> out, as
    gpu_backend.tree_causal_conv1d: initial_window is the window pool [N, C, W-1]."""
    def conv(x, *, weight, bias, parents, window_pool, slots, mode, activation):
        return launch(fn, x, weight=weight, bias=bias, parents=parents, initial_window=window_pool, state_indices=slots,
                  mode=mode, activation=activation)
    return conv


def as_mamba2_contract(fn):
    """fn(x, dt, A, B, C, *, D, dt_bias, parents, initial_state, state_indices, mode) -> y, as
    gpu_backend.mamba2_tree_verify: initial_state is the pool [N, H, P, N] (a 16-bit or slot-major pool: fp32_pool's
    copy)."""
    def mamba2(x, dt, A, B, C, *, D, dt_bias, parents, state_pool, slots, mode):
        pool = fp32_pool(state_pool)
        out = launch(fn, x, dt, A, B, C, D=D, dt_bias=dt_bias, parents=parents, initial_state=pool, state_indices=slots,
                 mode=mode)
        carry_back(pool, state_pool)
        return out[0] if isinstance(out, tuple) else out
    return mamba2


def as_kda_contract(fn):
    """fn(q, k, v, g, beta, *, parents, initial_state, mode) -> o, as gpu_backend.kda_tree_verify (a state per
    sequence, no pool: the batch's slots are gathered from the pool, a copy, in float32 from a 16-bit pool)."""
    def kda(q, k, v, g, beta, *, parents, state_pool, slots, mode):
        out = launch(fn, q, k, v, g, beta, parents=parents, initial_state=_gathered(state_pool, slots), mode=mode)
        return out[0] if isinstance(out, tuple) else out
    return kda


def _gathered(state_pool, slots):
    """The batch's states from the pool, a copy (in float32 from a 16-bit pool: its values exactly)."""
    return fp32_pool(state_pool.index_select(0, slots.long()))


def as_lightning_contract(fn):
    """fn(q, k, v, *, decay, parents, initial_state, mode) -> o, as gpu_backend.lightning_tree_verify (the batch's
    slots gathered from the pool, a copy, in float32 from a 16-bit pool)."""
    def lightning(q, k, v, *, decay, parents, state_pool, slots, mode):
        out = launch(fn, q, k, v, decay=decay, parents=parents, initial_state=_gathered(state_pool, slots), mode=mode)
        return out[0] if isinstance(out, tuple) else out
    return lightning


def adapter():
    import ddsim
    import ddsim.gpu_backend as gb
    from ddsim.engines import EngineKernel, _bound, _op_source
    return EngineKernel("ddsim", ("exact", "leaky"), as_contract(gb.gdn_tree_verify), "ddsim-spec", ddsim.__version__,
                        *_bound(gb.gdn_tree_verify),
                        conv=as_conv_contract(gb.tree_causal_conv1d), conv_name="ddsim.tree_causal_conv1d",
                        **_op_source("conv", gb.tree_causal_conv1d),
                        mamba2=as_mamba2_contract(gb.mamba2_tree_verify), mamba2_name="ddsim.mamba2_tree_verify",
                        **_op_source("mamba2", gb.mamba2_tree_verify),
                        kda=as_kda_contract(gb.kda_tree_verify), kda_name="ddsim.kda_tree_verify",
                        **_op_source("kda", gb.kda_tree_verify),
                        lightning=as_lightning_contract(gb.lightning_tree_verify),
                        lightning_name="ddsim.lightning_tree_verify", **_op_source("lightning", gb.lightning_tree_verify))
