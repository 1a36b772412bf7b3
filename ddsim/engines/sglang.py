"""SGLang's GDN target-verify kernel, ``fused_sigmoid_gating_delta_rule_update`` (and its KDA mode, ``is_kda``:
``check-kernel --op kda``): with
``retrieve_parent_token`` the parent-indexed recurrence over per-node intermediate states (exact),
without it the flattened recurrence (leaky, the hybrid-unsafe path); ``disable_state_update`` keeps
the pool slot's state unwritten in both.

Layout translation at the edge: SGLang keeps states as [HV, V, K] (ddsim: [HV, K, V]) in a pool
addressed by slot indices (the caller's pool is handed over transposed, with the batch's slots),
takes the gates fused (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)), and returns o with
a leading split-K axis. The adapter passes A_log = dt_bias = 0, a = softplus^-1(-g), b = logit(beta)
(float32; beta is kept 1e-7 inside (0, 1)), and reflects any write the kernel makes to its copy of
the pool back into the caller's pool, so the pool properties check SGLang's own no-write-back. In
exact mode the per-node state buffer starts NaN: a node that reads a state before it is written shows.
"""
from __future__ import annotations

import importlib
import inspect

import torch

from ddsim.engines.graphs import launch
from ddsim.errors import NotInstalled

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
    raise NotInstalled(f"the package sglang is not installed (missing module {missing!r}; "
                     "pip install sglang, or its wheel with --no-deps)")


def _node_buffer(node_states, shape, dev, *, transposed: bool, dtype=torch.float32):
    """(the per-node state buffer a kernel writes, its rows int32 on ``dev``): the contract's node_states (buffer, rows)
    as a copy in the kernel's layout (its last two axes swapped where ``transposed``) between guard rows, whose writes
    reflect_writes carries back; without them a NaN buffer of ``shape`` (B rows of T steps) at rows 0..B-1 in
    ``dtype``, the state pool's (SGLang allocates its intermediate states in its SSM cache's dtype)."""
    if node_states is None:
        return (torch.full(shape, float("nan"), device=dev, dtype=dtype),
                torch.arange(shape[0], dtype=torch.int32, device=dev))
    from ddsim.engines import guarded_like
    nodes, rows = node_states
    return guarded_like(nodes.transpose(-1, -2) if transposed else nodes), rows.to(device=dev, dtype=torch.int32)


def parent_table(parents, dev) -> torch.Tensor:
    """retrieve_parent_token [B, T] int32 as SGLang's verifies read it in serving: the table its tree conv filled (the
    tree's parents, the root's entry 0: the conv never sets it; the verifies start the root from the committed state
    and do not read it)."""
    table = torch.as_tensor(parents, device=dev).to(torch.int32).contiguous()
    table[:, 0] = 0
    return table


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t [B, T, heads, dim] as SGLang's verify reads it: each token's heads side by side in one row (dim stride 1, head
    stride dim) and the batch's rows one after another (batch stride T times the row's stride, which it takes from
    t.stride(1)), as its layer's split of mixed_qkv is; t itself where it is laid out so, else a contiguous copy."""
    B, T, heads, dim = t.shape
    s = t.stride()
    if s[3] == 1 and (heads == 1 or s[2] == dim) and (B == 1 or s[0] == T * s[1]):
        return t
    return t.contiguous()


def as_contract(fn, *, kda: bool = False):
    """fn with SGLang's signature: (A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
    initial_state_source [N, HV, V, K], initial_state_indices [B], *, scale, use_qk_l2norm_in_kernel,
    disable_state_update, intermediate_states_buffer, intermediate_state_indices, cache_steps,
    retrieve_parent_token) -> o [1 or NK, B, T, HV, V]. With ``kda`` the same kernel's KDA mode (is_kda): the gate
    per key channel, a [B, T, H, K] and dt_bias [H * K], the contract's ``kda`` (no scale argument). In exact mode the
    contract's ``node_states`` (buffer [M, P, HV, K, V], rows [B]) go to the kernel as intermediate_states_buffer (a
    copy in SGLang's layout [M, P, HV, V, K] with guard rows beside it, its pitch P read from its stride) and
    intermediate_state_indices = rows, and its writes are carried back; without them a buffer of B rows of T steps.
    q, k and v go to the kernel as SGLang's layer passes its split of mixed_qkv: views whose token stride is the
    projection's width, passed as they come (the kernel reads that stride); any other layout is copied (_rows)."""
    def verify(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale=None, node_states=None):
        B, T = q.shape[:2]
        HV = v.shape[2]
        dev = q.device
        from ddsim.engines import fused_gates, pitched_like, reflect_pitched, reflect_writes
        a, b = fused_gates(g, beta)  # elementwise: KDA's a is [B, T, H, K]
        zeros = torch.zeros(HV, dtype=torch.float32, device=dev)
        dt_bias = torch.zeros(HV * q.shape[3], dtype=torch.float32, device=dev) if kda else zeros
        flags = {"is_kda": True} if kda else {}
        # [N, HV, V, K], SGLang's layout, guard slots beside; one layer of a slot-major pool stays one (its kernel
        # takes the slot pitch from stride(0): "envelope-strided" pools)
        pool = pitched_like(state_pool.transpose(-1, -2), state_pool)
        tree = {}
        if mode == "exact":  # per-node states [M, P, HV, V, K], NaN until the kernel writes them
            buf, rows = _node_buffer(node_states, (B, T, HV, v.shape[3], q.shape[3]), dev, transposed=True,
                                     dtype=state_pool.dtype)
            tree = dict(intermediate_states_buffer=buf, intermediate_state_indices=rows, cache_steps=buf.shape[1],
                        retrieve_parent_token=parent_table(parents, dev))
        o = launch(fn, zeros, a.contiguous(), dt_bias, 1.0, 20.0, _rows(q), _rows(k), _rows(v), b.contiguous(), pool,
               slots.to(device=dev, dtype=torch.int32), scale=scale, use_qk_l2norm_in_kernel=True,
               disable_state_update=True, **tree, **flags)
        reflect_pitched(pool, state_pool)  # show the caller what the kernel wrote into the pool
        if mode == "exact" and node_states is not None:
            reflect_writes(tree["intermediate_states_buffer"], node_states[0])  # and into the node states
        return o[0] if o.dim() == 5 else o
    return verify


# SGLang's Mamba2 selective_state_update, with retrieve_parent_token for trees
MAMBA2_LOCATIONS = ("sglang.kernels.ops.mamba.triton_ops.mamba_ssm",  # 0.5.23
                    "sglang.srt.layers.attention.mamba.ops.mamba_ssm")  # earlier 0.5.x


def _mamba2_kernel():
    for loc in MAMBA2_LOCATIONS:
        try:
            return importlib.import_module(loc).selective_state_update
        except ModuleNotFoundError:
            continue
    return None


def as_mamba2_contract(fn):
    """fn with SGLang's selective_state_update signature: (state [N, H, P, N], x [B, T, H, P],
    dt [B, T, H, P], A [H, P, N], B, C [B, T, G, N], D [H, P], z, dt_bias [H, P], dt_softplus,
    state_batch_indices [B], *, out, disable_state_update, intermediate_states_buffer, cache_steps,
    retrieve_parent_token, intermediate_state_indices). x, B and C are passed as they come (SGLang's Mamba2 layer
    hands them over as views of its conv's output, split by torch.split). dt, A, D and dt_bias are passed per head,
    broadcast over P and N with stride 0 (SGLang's Mamba2 mixer does the same; the kernel then takes
    its one-scalar-per-head path). A missing D or dt_bias is passed as zeros (the launcher needs both:
    it reads their strides). exact: retrieve_parent_token = parents and a NaN-filled per-node state
    buffer; leaky: neither. disable_state_update=True in both (a verify). The contract's ``node_states`` (buffer
    [M, steps, H, P, N], rows [B]) go to the kernel as that buffer (a copy with guard rows beside it; cache_steps its
    pitch) and intermediate_state_indices, and its writes are carried back."""
    def mamba2(x, dt, A, B, C, *, D, dt_bias, parents, state_pool, slots, mode, node_states=None):
        Bn, T, H, P = x.shape
        N = B.shape[-1]
        dev = x.device
        tree = {}
        if mode == "exact":
            buf, rows = _node_buffer(node_states, (Bn, T, H, P, N), dev, transposed=False, dtype=state_pool.dtype)
            tree = dict(intermediate_states_buffer=buf, cache_steps=buf.shape[1],
                        retrieve_parent_token=parent_table(parents, dev),
                        intermediate_state_indices=rows)
        out = torch.full_like(x, float("nan"))
        # x, B, C as they come: SGLang's layer passes them split from its conv's output xBC (views, each token's row
        # strided by xBC's width) and its kernel reads every stride; a copy would check a layout it is never handed
        launch(fn, state_pool, x, dt.float()[..., None].expand(Bn, T, H, P), A.float()[:, None, None].expand(H, P, N),
           B, C, D=(torch.zeros(H, device=dev) if D is None else D.float())[:, None].expand(H, P),
           dt_bias=(torch.zeros(H, device=dev) if dt_bias is None else dt_bias.float())[:, None].expand(H, P),
           dt_softplus=True,
           state_batch_indices=slots.to(device=dev, dtype=torch.int32), out=out, disable_state_update=True, **tree)
        if mode == "exact" and node_states is not None:
            from ddsim.engines import reflect_writes
            reflect_writes(tree["intermediate_states_buffer"], node_states[0], transposed=False)
        return out
    return mamba2


def adapter():
    from ddsim.engines import EngineKernel, _bound, _op_source, _version
    fn, _ = _kernel()
    src, digest, sources = _bound(fn)  # the GDN verify's, and its KDA mode's (the same function)
    conv = _conv_kernel()
    extra = {}
    if conv is not None:
        extra = dict(conv=as_conv_contract(conv), conv_name="sglang.causal_conv1d_update", conv_widths=(2, 3, 4),
                     conv_writes_slot="flattened window", conv_parents=True, **_op_source("conv", conv))
    m2 = _mamba2_kernel()
    if m2 is not None:
        extra.update(mamba2=as_mamba2_contract(m2), mamba2_name="sglang.selective_state_update",
                     **_op_source("mamba2", m2))
    if "is_kda" in inspect.signature(fn).parameters:  # its KDA mode (0.5.23)
        extra.update(kda=as_contract(fn, kda=True), kda_name="sglang.fused_sigmoid_gating_delta_rule_update (is_kda)",
                     kda_source=src, kda_source_sha256=digest, kda_sources=sources)
    scatter = _commit_module()
    if scatter is not None:  # its commit: the accepted node's kept state and conv window copied into the pool
        extra.update(commit=as_commit_contract(scatter.fused_mamba_state_scatter_with_mask,
                                               scatter.fused_conv_window_scatter_with_mask),
                     commit_name="sglang.fused_mamba_state_scatter_with_mask (fused_conv_window_scatter_with_mask "
                                 "for the conv)",
                     commit_ops=COMMIT_OPS, **_op_source("commit", scatter.fused_mamba_state_scatter_with_mask))
    # its CUDA-graph replays pad the batch with slot -1 (PAD_SLOT_ID) in every one of these kernels
    return EngineKernel("sglang.fused_sigmoid_gating_delta_rule_update", ("exact", "leaky"), as_contract(fn), "sglang",
                        _version("sglang"), src, digest, sources, **extra, pads=("gdn", "conv", "mamba2", "kda"),
                        node_states=NODE_STATES)


# the exact verifies that fill intermediate_states_buffer and the conv that fills intermediate_conv_window (on a tree
# and on the flattened draft): SGLang's commit's sources
NODE_STATES = (("gdn", "exact"), ("kda", "exact"), ("mamba2", "exact"), ("conv", "exact"), ("conv", "leaky"))


# ---- the commit after a verify ---------------------------------------------------------------------
# where SGLang keeps the scatter its update_mamba_state_after_mtp_verify commits with (the SSM states of every layer
# from intermediate_ssm, the conv windows from intermediate_conv_window)
COMMIT_LOCATIONS = ("sglang.kernels.ops.mamba.mamba_state_scatter_triton",)  # 0.5.23
COMMIT_OPS = ("gdn", "kda", "mamba2", "conv")


def _commit_module():
    for loc in COMMIT_LOCATIONS:
        try:
            return importlib.import_module(loc)
        except ModuleNotFoundError:
            continue
    return None


class _Interpreted(torch.Tensor):
    """A CPU tensor that answers is_cuda: SGLang's scatter wrappers refuse any tensor that is not on CUDA (or XPU)
    before they launch; on the CPU, where Triton's interpreter runs their kernels, the pool and the buffer are handed
    over as views of this class, so the engine's own wrapper code computes the launch. Used for CPU tensors alone."""

    @property
    def is_cuda(self):
        return True


def as_commit_contract(state_fn, conv_fn=None):
    """The contract's commit from fns with SGLang's fused_mamba_state_scatter_with_mask signature: (dst [L, N, *state],
    src [L, M, P, *state], dst_indices_raw [B], step_indices_raw [B] (-1: skip), src_indices_raw [B]) copying
    dst[l, dst_indices[b]] = src[l, src_indices[b], step_indices[b]]. ``conv_fn`` for the conv's windows
    (fused_conv_window_scatter_with_mask, the same signature); None: state_fn for every op (a MODULE:FUNCTION commit).
    The caller's pool and buffer are handed over as they are: a commit is a copy of whole entries, the same in SGLang's
    state layout ([HV, V, K] for GDN) as in ddsim's."""
    def commit(op, *, pool, buffer, slots, rows, accepted):
        fn = conv_fn if op == "conv" and conv_fn is not None else state_fn
        dst, src = (pool, buffer) if pool.is_cuda else (pool.as_subclass(_Interpreted), buffer.as_subclass(_Interpreted))
        launch(fn, dst, src, slots.to(device=pool.device, dtype=torch.int32),
               accepted.to(device=pool.device, dtype=torch.int32), rows.to(device=pool.device, dtype=torch.int32))
    return commit


# ---- tree causal conv ------------------------------------------------------------------------------
CONV_LOCATIONS = (
    "sglang.kernels.ops.mamba.causal_conv1d_triton",  # 0.5.23
    "sglang.srt.layers.attention.mamba.causal_conv1d_triton",  # earlier 0.5.x
)


def _conv_kernel():
    for loc in CONV_LOCATIONS:
        try:
            return importlib.import_module(loc).causal_conv1d_update
        except ModuleNotFoundError:
            continue
    return None


def next_token_and_sibling(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's tree encoding from parent indices [B, T]: retrieve_next_token[i] is node i's first
    child, retrieve_next_sibling[i] its next sibling (both in node order; -1 for none). int32 [B, T]."""
    par = parents.tolist()
    nxt = [[-1] * len(row) for row in par]
    sib = [[-1] * len(row) for row in par]
    for b, row in enumerate(par):
        last_child: dict[int, int] = {}
        for i, p in enumerate(row):
            if p < 0:
                continue
            if p in last_child:
                sib[b][last_child[p]] = i
            else:
                nxt[b][p] = i
            last_child[p] = i
    return torch.tensor(nxt, dtype=torch.int32), torch.tensor(sib, dtype=torch.int32)


def as_conv_contract(fn):
    """fn with SGLang's causal_conv1d_update signature: (x [B, C, T], conv_state [N, C, W-1], weight
    [C, W], bias, activation, conv_state_indices=, retrieve_next_token=, retrieve_next_sibling=,
    retrieve_parent_token=) -> out [B, C, T]. Tree mode (retrieve_next_token/next_sibling given) is
    exact; without them the conv runs over the flattened draft (leaky). Either way the kernel rewrites
    the sequence's conv_state slot with the window after the whole flattened draft (SGLang's commit
    then restores the accepted node's window from its intermediate windows). The contract's ``node_states`` (buffer
    [M, P, C, W-1], rows [B]) go to the kernel as intermediate_conv_window (a copy with guard rows beside it, in
    the same layout, [cache line, step, dim, win]) and intermediate_state_indices, and its writes are carried back.
    In exact mode the kernel also fills retrieve_parent_token, the parent table SGLang's verifies then read: the
    contract's parents_out [B, T] int32 where given. x goes to the kernel as SGLang's layer passes it,
    mixed_qkv.view(B, T, C).transpose(1, 2): a [B, C, T] view whose channels are adjacent in memory."""
    def conv(x, *, weight, bias, parents, window_pool, slots, mode, activation, node_states=None, parents_out=None):
        dev = x.device
        tree = {}
        if mode == "exact":  # the parent table it fills goes to the caller's parents_out where given
            nxt, sib = next_token_and_sibling(parents.cpu())
            tree = dict(retrieve_next_token=nxt.to(dev), retrieve_next_sibling=sib.to(dev),
                        retrieve_parent_token=torch.full_like(nxt, -2).to(dev) if parents_out is None else parents_out)
        if node_states is not None:
            buf, rows = _node_buffer(node_states, None, dev, transposed=False)
            tree.update(intermediate_conv_window=buf, intermediate_state_indices=rows)
        out = launch(fn, x.transpose(1, 2), window_pool, weight.contiguous(), bias, activation,
                 conv_state_indices=slots.to(device=dev, dtype=torch.int32), **tree)
        if node_states is not None:
            from ddsim.engines import reflect_writes
            reflect_writes(tree["intermediate_conv_window"], node_states[0], transposed=False)
        return out.transpose(1, 2)
    return conv
