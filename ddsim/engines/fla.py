"""flash-linear-attention (package fla-core): ``fused_recurrent_gated_delta_rule``, the recurrence a
serving stack runs when it verifies a tree without parent pointers, ``fused_recurrent_kda``, Kimi Delta
Attention's (``check-kernel --op kda``), and ``fused_recurrent_simple_gla``, the kernel fla's lightning attention
runs (``check-kernel --op lightning``). They take no tree, so on a tree they are the flattened ("leaky") path;
exact mode is refused.

Layout translation: fla's q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV] and state
[N, HV, K, V] match ddsim's; fla normalises q and k in kernel with ``use_qk_l2norm_in_kernel``.
fla takes one initial state per sequence and no pool indices, so the adapter gathers the batch's
slots from the pool (the slot handling checked is the adapter's, not fla's)."""
from __future__ import annotations

from ddsim.engines.graphs import launch
from ddsim.errors import NotInstalled

# each op's kernel, and what it offers, known without importing fla-core (about 4 s): they take no tree
NAMES = {"gdn": "fla.fused_recurrent_gated_delta_rule", "kda": "fla.fused_recurrent_kda",
         "lightning": "fla.fused_recurrent_simple_gla"}
MODES = ("leaky",)


def refuse_before_import(op: str, mode: str) -> None:
    """``--impl fla --op op --mode mode``: a mode fla's kernel for the op does not offer, refused in the words
    EngineKernel.check_op uses, before fla-core is imported (an op fla lacks is the adapter's to refuse)."""
    from ddsim.engines import refuse_mode
    if op in NAMES:
        refuse_mode(NAMES[op], MODES, mode)


def as_contract(fn):
    """fn with fla's signature (q, k, v, g=, beta=, scale=, initial_state=, output_final_state=,
    use_qk_l2norm_in_kernel=) -> (o, final_state)."""
    def verify(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale):
        initial_state = state_pool.index_select(0, slots.long())  # [B, HV, K, V], a copy
        o, _ = launch(fn, q.contiguous(), k.contiguous(), v.contiguous(), g=g.contiguous(), beta=beta.contiguous(),
                  scale=scale, initial_state=initial_state, output_final_state=False, use_qk_l2norm_in_kernel=True)
        return o
    return verify


def as_kda_contract(fn):
    """fn with fla's KDA signature (q, k, v, g, beta, initial_state=, output_final_state=, use_qk_l2norm_in_kernel=)
    -> (o, final_state): g is the log decay per key channel, beta after its sigmoid, the state [N, H, K, V]."""
    def kda(q, k, v, g, beta, *, parents, state_pool, slots, mode):
        initial_state = state_pool.index_select(0, slots.long())  # [B, H, K, V], a copy
        o, _ = launch(fn, q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
                  initial_state=initial_state, output_final_state=False, use_qk_l2norm_in_kernel=True)
        return o
    return kda


def as_lightning_contract(fn):
    """fn with fla's simple GLA signature (q, k, v, g_gamma=, scale=, initial_state=, output_final_state=) -> (o,
    final_state): lightning attention is simple GLA with the per-head log decay g_gamma = log(decay) and no scale
    (fla's lightning_attn computes its own decays from the layer index; this is the kernel it runs)."""
    def lightning(q, k, v, *, decay, parents, state_pool, slots, mode):
        import torch
        initial_state = state_pool.index_select(0, slots.long())  # [B, H, K, V], a copy
        o, _ = launch(fn, q.contiguous(), k.contiguous(), v.contiguous(), g_gamma=torch.log(decay.float()), scale=1.0,
                  initial_state=initial_state, output_final_state=False)
        return o
    return lightning


def _optional(module: str, name: str):
    """module.name, or None where this fla-core release lacks it (its import-time warnings silenced)."""
    import importlib
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def adapter():
    import warnings
    try:
        with warnings.catch_warnings():  # fla warns on import when it finds no GPU (the CPU runs the interpreter)
            warnings.simplefilter("ignore")
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ModuleNotFoundError as e:
        raise NotInstalled(f"the package fla-core is not installed (missing module {e.name!r}; "
                         "pip install fla-core einops)") from None
    from ddsim.engines import EngineKernel, _bound, _op_source, _version
    extra = {}
    # KDA and lightning attention's kernel (simple GLA): in fla-core releases that have them (--op kda or lightning
    # on one without says so in one line)
    kda, gla = _optional("fla.ops.kda", "fused_recurrent_kda"), _optional("fla.ops.simple_gla", "fused_recurrent_simple_gla")
    if kda is not None:
        extra.update(kda=as_kda_contract(kda), kda_name=NAMES["kda"], kda_modes=MODES, **_op_source("kda", kda))
    if gla is not None:
        extra.update(lightning=as_lightning_contract(gla), lightning_name=NAMES["lightning"], lightning_modes=MODES,
                     **_op_source("lightning", gla))
    return EngineKernel(NAMES["gdn"], MODES, as_contract(fused_recurrent_gated_delta_rule),
                        "fla-core", _version("fla-core"), *_bound(fused_recurrent_gated_delta_rule), **extra)
