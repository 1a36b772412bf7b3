"""ddsim's own fast path as an engine: gpu_backend.gdn_tree_verify (Triton on CUDA, torch on the
CPU), and the ddsim calling convention for a kernel of anyone's that shares its signature."""
from __future__ import annotations


def as_contract(fn):
    """fn(q, k, v, g, beta, *, parents, initial_state, mode, scale, ...) -> o, as gdn_tree_verify."""
    def verify(q, k, v, g, beta, *, parents, initial_state, mode, scale):
        out = fn(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode=mode, scale=scale)
        return out[0] if isinstance(out, tuple) else out
    return verify


def adapter():
    import ddsim
    import ddsim.gpu_backend as gb
    from ddsim.engines import EngineKernel, _source_of
    src, digest = _source_of(gb.gdn_tree_verify)
    return EngineKernel("ddsim", ("exact", "leaky"), as_contract(gb.gdn_tree_verify), "ddsim-spec", ddsim.__version__,
                        src, digest)
