"""ddsim's own fast path as an engine: gpu_backend.gdn_tree_verify, tree_causal_conv1d and
mamba2_tree_verify, kda_tree_verify and lightning_tree_verify (Triton on CUDA, torch on the CPU), and the ddsim calling
convention for a kernel of anyone's that shares their signatures."""
from __future__ import annotations


def as_contract(fn):
    """fn(q, k, v, g, beta, *, parents, initial_state, state_indices, mode, scale) -> o (or (o, ...)),
    as gdn_tree_verify: initial_state is the pool [N, HV, K, V], state_indices [B] the batch's slots."""
    def verify(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale):
        out = fn(q, k, v, g, beta, parents=parents, initial_state=state_pool, state_indices=slots, mode=mode,
                 scale=scale)
        return out[0] if isinstance(out, tuple) else out
    return verify


def as_conv_contract(fn):
    """fn(x, *, weight, bias, parents, initial_window, state_indices, mode, activation) -> out, as
    gpu_backend.tree_causal_conv1d: initial_window is the window pool [N, C, W-1]."""
    def conv(x, *, weight, bias, parents, window_pool, slots, mode, activation):
        return fn(x, weight=weight, bias=bias, parents=parents, initial_window=window_pool, state_indices=slots,
                  mode=mode, activation=activation)
    return conv


def as_mamba2_contract(fn):
    """fn(x, dt, A, B, C, *, D, dt_bias, parents, initial_state, state_indices, mode) -> y, as
    gpu_backend.mamba2_tree_verify: initial_state is the pool [N, H, P, N]."""
    def mamba2(x, dt, A, B, C, *, D, dt_bias, parents, state_pool, slots, mode):
        out = fn(x, dt, A, B, C, D=D, dt_bias=dt_bias, parents=parents, initial_state=state_pool,
                 state_indices=slots, mode=mode)
        return out[0] if isinstance(out, tuple) else out
    return mamba2


def as_kda_contract(fn):
    """fn(q, k, v, g, beta, *, parents, initial_state, mode) -> o, as gpu_backend.kda_tree_verify (a state per
    sequence, no pool: the batch's slots are gathered from the pool, a copy)."""
    def kda(q, k, v, g, beta, *, parents, state_pool, slots, mode):
        out = fn(q, k, v, g, beta, parents=parents, initial_state=state_pool.index_select(0, slots.long()), mode=mode)
        return out[0] if isinstance(out, tuple) else out
    return kda


def as_lightning_contract(fn):
    """fn(q, k, v, *, decay, parents, initial_state, mode) -> o, as gpu_backend.lightning_tree_verify (the batch's
    slots gathered from the pool, a copy)."""
    def lightning(q, k, v, *, decay, parents, state_pool, slots, mode):
        out = fn(q, k, v, decay=decay, parents=parents, initial_state=state_pool.index_select(0, slots.long()), mode=mode)
        return out[0] if isinstance(out, tuple) else out
    return lightning


def adapter():
    import ddsim
    import ddsim.gpu_backend as gb
    from ddsim.engines import EngineKernel, _source_of
    src, digest = _source_of(gb.gdn_tree_verify)
    csrc, cdigest = _source_of(gb.tree_causal_conv1d)
    msrc, mdigest = _source_of(gb.mamba2_tree_verify)
    ksrc, kdigest = _source_of(gb.kda_tree_verify)
    lsrc, ldigest = _source_of(gb.lightning_tree_verify)
    return EngineKernel("ddsim", ("exact", "leaky"), as_contract(gb.gdn_tree_verify), "ddsim-spec", ddsim.__version__,
                        src, digest, conv=as_conv_contract(gb.tree_causal_conv1d), conv_name="ddsim.tree_causal_conv1d",
                        conv_source=csrc, conv_source_sha256=cdigest, mamba2=as_mamba2_contract(gb.mamba2_tree_verify),
                        mamba2_name="ddsim.mamba2_tree_verify", mamba2_source=msrc, mamba2_source_sha256=mdigest,
                        kda=as_kda_contract(gb.kda_tree_verify), kda_name="ddsim.kda_tree_verify", kda_source=ksrc,
                        kda_source_sha256=kdigest, lightning=as_lightning_contract(gb.lightning_tree_verify),
                        lightning_name="ddsim.lightning_tree_verify", lightning_source=lsrc, lightning_source_sha256=ldigest)
