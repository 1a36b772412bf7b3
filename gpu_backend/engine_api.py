"""ddsim's exact snapshot-free GDN tree verify behind SGLang's calling convention for target verify, so
an engine can swap it in for ``fused_sigmoid_gating_delta_rule_update`` (and ``ddsim check-kernel
--impl ddsim.gpu_backend.engine_api:target_verify --convention sglang`` checks it like any engine's):

    o = target_verify(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                      initial_state_source, initial_state_indices, *, scale=None,
                      use_qk_l2norm_in_kernel=True, disable_state_update=True,
                      retrieve_parent_token=None, cu_seqlens=None, ...)
    commit_accepted(A_log, a, dt_bias, k, v, b, initial_state_source, initial_state_indices, *,
                    retrieve_parent_token, accepted, ...)

Shapes as SGLang's: q, k [B, T, H, K] (or [1, B*T, H, K] with cu_seqlens of B equal segments),
v [B, T, HV, V], a, b [B, T, HV], A_log, dt_bias [HV], the state pool initial_state_source
[N, HV, V, K] float32 addressed by initial_state_indices [B], retrieve_parent_token [B, T] (the
parent's index; the root's entry is not read: SGLang's tree conv, which fills the table, leaves 0 there; None: the
flattened recurrence, the hybrid-unsafe path). Per step, as
an engine would, build once and pass to every layer (raw tensors are validated, with host syncs, on
every call):
  - ``plan_tree(retrieve_parent_token)`` as retrieve_parent_token;
  - ``plan_slots(initial_state_source, initial_state_indices)`` as initial_state_indices (the pool
    rows: distinct, in range), and for the drop-in ``plan_slots(intermediate_states_buffer,
    intermediate_state_indices)`` as intermediate_state_indices;
  - ``plan_accepted(tree_plan, accepted)`` as commit_accepted's accepted.

target_verify reads the pool and never writes it (``disable_state_update=False`` is refused rather
than half-honoured). Two ways to use it:
  - drop-in: pass SGLang's ``intermediate_states_buffer`` [*, >=T, HV, V, K] and
    ``intermediate_state_indices`` [B] as today, and every node's state is written there, exactly
    as SGLang's kernel does (the parent-indexed recurrence with per-node states), for the engine's
    own commit to copy the accepted node's. An fp32 contiguous buffer is written by the kernels themselves (up to
    four sequences at Qwen3.6-27B's shapes a program per node along its root path, else node by node, each
    parent's state read back from the buffer); another dtype or layout takes the states made apart, then copied
    in. Without retrieve_parent_token the flattened recurrence runs on a chain plan built once per batch shape;
  - snapshot-free: pass no buffer; the tree-masked WY form verifies without per-node states, and
    after acceptance commit_accepted writes the state after root..accepted[b] into the sequence's
    slot, from the committed state and the accepted nodes alone.
SGLang's fp32 pool is neither copied nor transposed: the kernels read it (and commit_accepted writes
the accepted state into it) through its [N, HV, K, V] transpose view; a pool of another dtype is
gathered into a float32 copy of the batch's rows and written back.
A padded batch (initial_state_indices -1 for the rows SGLang pads a CUDA-graph replay with, PAD_SLOT_ID) is taken as
SGLang's kernel takes it: a padded row verifies from a zero state, and neither call reads or writes a pool slot for it.
Under CUDA-graph capture (a server's captured verify) raw tensors are checked on the device instead, and a sequence
with an input it cannot trust fails closed as NaN (gpu_backend/device_checks.py); outside capture they are checked on
the host and refused in one line, then go through the same launch a capture makes (its checks then all pass), so
that an engine's warm-up compiles every kernel its capture launches. On CUDA (and in Triton's interpreter) Triton
kernels run (the WY form; past 65 nodes, its form over 64-row chunks); on the CPU otherwise, the torch path.
"""
from __future__ import annotations

import torch

from ddsim.gpu_backend import _common, checks, device_checks


def _backend(x: torch.Tensor) -> str:
    return "triton" if x.is_cuda or _common.interpreting() else "torch"


def _captured(x: torch.Tensor) -> bool:
    """Whether this call's inputs are checked on the device (device_checks): under CUDA-graph capture, on the Triton
    backend (or forced, for the interpreter's tests)."""
    return _backend(x) == "triton" and device_checks.capturing(x)


def _step(x, *, a, b, pool, slots, tree, cu_seqlens, rows=None, buf=None, accepted=None) -> device_checks.Step:
    """The step's raw inputs checked on the device, and a raw tree's tables built, in one launch (device_checks.step;
    tree a raw table, the call's TreePlan, or None for the flattened recurrence's chains, whose tables the launch
    writes too): under capture as given, outside it after _host_checked. Refused in one
    line: what a replay could not see a step's values in (host lists, tensors on another device), and index tensors
    of another length or dtype."""
    idx = slots.indices if isinstance(slots, checks.CheckedSlots) else slots
    raw = tree if not isinstance(tree, checks.TreePlan) else None
    for name, t in (("initial_state_indices", idx), ("intermediate_state_indices", rows), ("accepted", accepted),
                    ("cu_seqlens", cu_seqlens), ("retrieve_parent_token", raw)):
        if t is not None and not (isinstance(t, torch.Tensor) and t.device == x.device):
            raise ValueError(f"{name}: {'on ' + str(t.device) if isinstance(t, torch.Tensor) else type(t).__name__} "
                             f"under CUDA-graph capture, the inputs on {x.device} (a replay would read the capture's "
                             "values for ever): pass a tensor on the inputs' device")
    B, T, _ = a.shape
    if raw is not None and raw.numel() == B * T:
        raw = raw.reshape(B, T)  # (a packed call's may come flat; another size is refused by the step's checks)
    return device_checks.step(a=a, b=b, slots=idx, N=pool.shape[0], tree=raw, chain=tree is None,
                              plan=tree if isinstance(tree, checks.TreePlan) else None, rows=rows,
                              N_buf=0 if buf is None else buf.shape[0], accepted=accepted, cu_seqlens=cu_seqlens,
                              names=_STEP_NAMES)


# the step's arguments (device_checks.step) as SGLang's convention names them, for its refusals
_STEP_NAMES = dict(slots="initial_state_indices", tree="retrieve_parent_token", rows="intermediate_state_indices",
                   accepted="accepted", cu_seqlens="cu_seqlens")


def _unpack(x, cu_seqlens, B_T, name: str):
    """[1, B*T, ...] with cu_seqlens of equal segments -> [B, T, ...]; [B, T, ...] as given (its shape checked after,
    check_gdn_args)."""
    if cu_seqlens is None:
        return x
    B, T = B_T
    if tuple(x.shape[:2]) != (1, B * T) or x.dim() < 3:
        raise ValueError(f"{name}: expected [1, B*T = {B * T}, ...] with cu_seqlens, got {tuple(x.shape)}")
    return x.reshape(B, T, *x.shape[2:])


def _tree_table(p, B: int, T: int) -> torch.Tensor:
    """A raw retrieve_parent_token as [B, T] (a packed call's may come flat), refused in one line if it holds another
    number of entries."""
    p = torch.as_tensor(p)
    if p.numel() != B * T:
        raise ValueError(f"retrieve_parent_token: expected [B, T] = [{B}, {T}], got {tuple(p.shape)}")
    return p.reshape(B, T)


def _batch_shape(q, cu_seqlens, slots=None, captured: bool = False):
    """(B, T). Packed inputs [1, B*T, ...]: B and T from the host offsets; under capture from shapes alone, B being the
    slots' count (the offsets are then checked on the device, device_checks.step)."""
    if cu_seqlens is None:
        return q.shape[0], q.shape[1]
    if captured:
        idx = slots.indices if isinstance(slots, checks.CheckedSlots) else slots
        B = idx.shape[0] if isinstance(idx, torch.Tensor) else len(idx)
        if q.shape[0] != 1 or B < 1 or q.shape[1] % B or len(cu_seqlens) != B + 1:
            raise ValueError(f"cu_seqlens: expected q [1, B*T, H, K] and [B + 1] offsets for the B = {B} slots, got q "
                             f"{tuple(q.shape)}, {len(cu_seqlens)} offsets")
        return B, q.shape[1] // B
    cu = torch.as_tensor(cu_seqlens).cpu()
    lens = torch.diff(cu) if cu.dim() == 1 else cu.new_zeros(0)
    # the same offsets the device check holds a captured call to: 0, T, 2T, .. B*T = q's tokens, as integers
    if (q.shape[0] != 1 or cu.dtype not in (torch.int32, torch.int64) or lens.numel() == 0 or int(cu[0]) != 0
            or int(cu[-1]) != q.shape[1] or not bool((lens == lens[0]).all()) or int(lens[0]) < 1):
        raise ValueError(f"cu_seqlens: expected q [1, B*T, H, K] and integer offsets 0, T, 2T, .., B*T = its "
                         f"{q.shape[1] if q.dim() > 1 else '?'} tokens (B trees of one size T), got q {tuple(q.shape)}, "
                         f"offsets {cu.tolist()}")
    return int(lens.numel()), int(lens[0])


def plan_tree(retrieve_parent_token) -> checks.TreePlan:
    """The step's trees validated once (host syncs here), their index tables cached: pass the plan as
    ``retrieve_parent_token`` to every layer's target_verify and commit_accepted of the step."""
    return checks.TreePlan(_rooted(retrieve_parent_token))


def plan_slots(initial_state_source, initial_state_indices) -> checks.CheckedSlots:
    """The step's pool rows [B] validated once (one host sync for a device tensor, none for host
    values): pass as ``initial_state_indices`` to every layer's target_verify and commit_accepted. A row of slot
    -1 is padding, as SGLang pads a CUDA-graph batch (PAD_SLOT_ID): its verify starts from a zero state, and no
    pool slot is read or written for it."""
    idx = initial_state_indices
    B = len(idx) if not isinstance(idx, torch.Tensor) else (idx.shape[0] if idx.dim() == 1 else -1)
    return checks.checked_slots(idx, initial_state_source.shape[0], B, initial_state_source.device,
                                "initial_state_indices", pad=True)


def plan_accepted(tree: checks.TreePlan, accepted) -> checks.CheckedIndices:
    """The step's accepted nodes [B] validated once against the planned trees: pass as ``accepted``
    to every layer's commit_accepted."""
    return checks.checked_accepted(accepted, tree.B, tree.T, tree.device)


_CHAINS: dict = {}  # (B, T, device) -> the flattened recurrence's TreePlan
MAX_CHAINS = 256  # plans kept; past that the cache starts over


def chain_plan(B: int, T: int, device) -> checks.TreePlan:
    """The flattened recurrence's parents (each node's predecessor) for B sequences of T nodes as a TreePlan, built
    once per (B, T, device): a call without retrieve_parent_token then validates no tree (no host sync) and, on
    CUDA, is replayed like a planned exact call."""
    key = (B, T, str(torch.device(device)))
    plan = _CHAINS.get(key)
    if plan is None:
        if len(_CHAINS) >= MAX_CHAINS:
            _CHAINS.clear()
        plan = _CHAINS[key] = checks.TreePlan(torch.arange(-1, T - 1, device=device).repeat(B, 1))
    return plan


def _parents(p, B, T, x):
    """The call's tree: as planned (a TreePlan), else on the Triton backend the raw table, whose tables the step's
    launch builds (_step), or on the torch backend the table rooted."""
    if isinstance(p, checks.TreePlan) or _backend(x) == "triton":  # (a raw one checked by _host_checked or the step)
        return p
    return _rooted(_tree_table(p, B, T))


def _raw(*inputs) -> bool:
    """Whether a call gives any of its step inputs raw (not planned: a tree, slots, rows or accepted nodes as an
    engine hands them over; None for one it does not give). A Triton call with one checks them, and builds a raw
    tree's tables, in the step's one launch (_step), under capture or not."""
    planned = (checks.TreePlan, checks.CheckedSlots, checks.CheckedIndices)
    return any(x is not None and not isinstance(x, planned) for x in inputs)


def _host_checked(x, B, T, *, pool, slots, tree, cu_seqlens, rows=None, buf=None, accepted=None):
    """Outside capture, a raw-input call's raw inputs validated on the host first (refused in one line, as before any
    launch), then as tensors on x's device for the step's launch (_step), which a capture launches the same way: an
    engine's warm-up compiles what its capture runs, and the checks' flags come out clear. (tree, slots, rows,
    accepted, cu_seqlens)."""
    dev = x.device
    if tree is not None and not isinstance(tree, checks.TreePlan):
        tree = _tree_table(tree, B, T)
        plan_tree(tree)
        tree = tree.to(dev)
    if not isinstance(slots, checks.CheckedSlots):
        plan_slots(pool, slots)
        slots = torch.as_tensor(slots).to(dev)
    if rows is not None and not isinstance(rows, checks.CheckedSlots):
        checks.node_state_rows(buf, rows, B, buf_name="intermediate_states_buffer",
                               rows_name="intermediate_state_indices")
        rows = torch.as_tensor(rows).to(dev)
    if accepted is not None and not isinstance(accepted, checks.CheckedIndices):
        checks.checked_accepted(accepted, B, T, dev)
        accepted = torch.as_tensor(accepted).to(dev)
    if cu_seqlens is not None:
        cu_seqlens = torch.as_tensor(cu_seqlens).to(dev)
    return tree, slots, rows, accepted, cu_seqlens


def _rooted(table: torch.Tensor) -> torch.Tensor:
    """retrieve_parent_token [B, T] as ddsim's parents int64: a copy with every root's entry -1. SGLang's tree conv
    fills the table its verifies read and leaves the root's entry 0 (its verifies start the root from the committed
    state and never read it), so the entry is not the parent's."""
    table = torch.as_tensor(table)
    if table.dtype not in (torch.int32, torch.int64):  # a float table would be truncated to another tree
        raise ValueError(f"retrieve_parent_token: expected int32 or int64 [B, T], got {table.dtype} {tuple(table.shape)}")
    parents = table.to(torch.int64, copy=True)
    parents[:, 0] = -1
    return parents


def _check_entry(first: str, **tensors) -> None:
    """An entry point's tensor arguments, before anything reads them: each a torch.Tensor; ``first`` (q, or the
    commit's k: what the batch's shape is read from) of rank 4; the state pool [N, HV, V, K]; the pool and the
    node-state buffer of a floating dtype (an integer pool would be read through a float32 copy and the commit
    written back truncated). The other shapes are checked once the batch's shape is known (_checked_shapes)."""
    buf = tensors.pop("intermediate_states_buffer", None)  # the one that may be None (the snapshot-free verify)
    checks.check_tensors(**tensors)
    checks.check_given(intermediate_states_buffer=buf)
    if tensors[first].dim() != 4:
        raise ValueError(f"{first}: expected [B, T, H, K] (or [1, B*T, H, K] with cu_seqlens), "
                         f"got {tuple(tensors[first].shape)}")
    pool = tensors["initial_state_source"]
    if pool.dim() != 4:
        raise ValueError(f"initial_state_source: expected [N, HV, V, K], got {tuple(pool.shape)}")
    for name, x in (("initial_state_source", pool), ("intermediate_states_buffer", buf)):
        if x is not None and not x.is_floating_point():
            raise ValueError(f"{name}: expected a floating-point pool, got {x.dtype}")


def _checked_shapes(q, k, v, a, b, A_log, dt_bias, pool, slots) -> None:
    """q, k, v, the fused gates' inputs [B, T, ...] (unpacked), the pool [N, HV, V, K] and raw slots [B], checked as
    the kernels read them and named as SGLang names them, before any launch (the step's device checks take a and b
    as given)."""
    B, _, _, HV, K, V = checks.check_gdn_args(q, k, v, None, None, a, b)
    checks.check_fused_gates(a, b, A_log, dt_bias)
    if tuple(pool.shape[1:]) != (HV, V, K):
        raise ValueError(f"initial_state_source: expected [N, HV, V, K] with HV, V, K = {(HV, V, K)}, got "
                         f"{tuple(pool.shape)}")
    if not isinstance(slots, checks.CheckedSlots) and isinstance(slots, torch.Tensor) and slots.dim() == 1 \
            and slots.shape[0] != B:
        raise ValueError(f"initial_state_indices: expected [B] = [{B}] slots, got {tuple(slots.shape)}")


def _check_gating(softplus_beta, softplus_threshold):
    if float(softplus_beta) != 1.0 or float(softplus_threshold) != 20.0:
        raise ValueError("softplus_beta, softplus_threshold: only 1.0 and 20.0 (torch's softplus) are supported, "
                         f"got {softplus_beta}, {softplus_threshold}")


def _state_view(pool, slots, B):
    """(initial_state, state_indices, rows) for ddsim's functions: SGLang's fp32 pool [N, HV, V, K]
    seen through a transpose as [N, HV, K, V] (read, and by the commit written, in place: no copy)
    with the batch's rows checked (plan_slots: distinct, in range, -1 a padded row; once per step when the
    caller passes the plan), rows None. A pool of another dtype: a float32 copy of the batch's rows (a padded row's
    zero), state_indices None, and the checked rows int64 [B] (to write the commit back; -1 for a padded row)."""
    if not isinstance(slots, checks.CheckedSlots):
        slots = plan_slots(pool, slots)
    if pool.dtype == torch.float32 and pool.dim() == 4 and pool.is_contiguous():
        return pool.transpose(-1, -2), slots, None
    idx = checks.pool_slots(pool, slots, B, "initial_state_source", "states", pads=True).long()
    return checks.live_rows(pool, idx).transpose(-1, -2).float().contiguous(), None, idx


def target_verify(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
                  initial_state_indices, *, scale=None, use_qk_l2norm_in_kernel=True, disable_state_update=True,
                  retrieve_parent_token=None, cu_seqlens=None, intermediate_states_buffer=None,
                  intermediate_state_indices=None, cache_steps=None):
    """o [B, T, HV, V] (or [1, B*T, HV, V] with cu_seqlens): exact tree verification with
    retrieve_parent_token, the flattened recurrence without it. The pool is only read."""
    if not disable_state_update:
        raise ValueError("disable_state_update=False: target_verify never writes the pool; call commit_accepted "
                         "with the accepted node")
    _check_entry("q", A_log=A_log, a=a, dt_bias=dt_bias, q=q, k=k, v=v, b=b,
                 initial_state_source=initial_state_source, intermediate_states_buffer=intermediate_states_buffer)
    _check_gating(softplus_beta, softplus_threshold)
    captured = _captured(q)
    B, T = _batch_shape(q, cu_seqlens, initial_state_indices, captured)
    q, k, v, a, b = (_unpack(x, cu_seqlens, (B, T), n) for x, n in zip((q, k, v, a, b), "qkvab"))
    _checked_shapes(q, k, v, a, b, A_log, dt_bias, initial_state_source, initial_state_indices)
    buf = intermediate_states_buffer
    rows = intermediate_state_indices if buf is not None else None
    slots = initial_state_indices
    if buf is not None:  # refused before any launch
        checks.node_states_shape(buf.transpose(-1, -2) if isinstance(buf, torch.Tensor) else buf, T, v.shape[2],
                                 q.shape[3], v.shape[3], q.device, "intermediate_states_buffer (transposed)")
    on_device = _backend(q) == "triton" and (captured or _raw(retrieve_parent_token, slots, rows))
    if retrieve_parent_token is None:  # the chains' tables: built in the step's launch on the device path
        parents, mode = None if on_device else chain_plan(B, T, q.device), "leaky"
    else:
        parents, mode = _parents(retrieve_parent_token, B, T, q), "exact"
    if on_device:
        tree, slots, raw_rows, _, cu = (parents, slots, rows, None, cu_seqlens) if captured else _host_checked(
            q, B, T, pool=initial_state_source, slots=slots, tree=parents, cu_seqlens=cu_seqlens, rows=rows, buf=buf)
        step = _step(q, a=a, b=b, pool=initial_state_source, slots=slots, tree=tree, cu_seqlens=cu,
                     rows=raw_rows if not isinstance(raw_rows, checks.CheckedSlots) else None, buf=buf)
        a, b, slots, parents = step.a, step.b, step.slots, step.plan
        rows = step.rows or rows
    s0, slots, _ = _state_view(initial_state_source, slots, B)
    from ddsim import gpu_backend as gb
    kw = dict(parents=parents, initial_state=s0, state_indices=slots, mode=mode, scale=scale,
              use_qk_l2norm=use_qk_l2norm_in_kernel, a=a, b=b, A_log=A_log, dt_bias=dt_bias, backend=_backend(q))
    if buf is None:
        o = gb.gdn_tree_verify(q, k, v, **kw)
    elif buf.dtype == torch.float32 and buf.dim() == 5 and buf.is_contiguous():
        # SGLang's layout, buffer[intermediate_state_indices[b], t] = node t's state [HV, V, K]: the kernels write
        # each node's state there through the buffer's [N, TS, HV, K, V] transpose. Its rows are checked here (or by
        # the step's launch), named as the caller names them; raw rows then go on as checked (no second host sync)
        idx = checks.node_state_rows(buf, rows, B, buf_name="intermediate_states_buffer",
                                     rows_name="intermediate_state_indices")
        if rows is not None and not isinstance(rows, checks.CheckedSlots):
            rows = checks.CheckedSlots(idx, buf.shape[0])
        o, _ = gb.gdn_tree_verify(q, k, v, states_out=buf.transpose(-1, -2), states_rows=rows, **kw)
    else:  # another dtype or layout: the states made apart, then copied in (the buffer and its rows checked before)
        rows = checks.node_state_rows(buf, rows, B, buf_name="intermediate_states_buffer",
                                      rows_name="intermediate_state_indices").long()
        o, states = gb.gdn_tree_verify(q, k, v, output_states=True, **kw)
        buf[rows, :T] = states.transpose(-1, -2).to(buf.dtype)
    return o.reshape(1, B * T, *o.shape[2:]) if cu_seqlens is not None else o


def commit_accepted(A_log, a, dt_bias, k, v, b, initial_state_source, initial_state_indices, *,
                    retrieve_parent_token, accepted, use_qk_l2norm_in_kernel=True, cu_seqlens=None):
    """Write the state after root..accepted[b] into sequence b's slot of the [N, HV, V, K] pool; no
    other slot is touched. Returns the pool."""
    _check_entry("k", A_log=A_log, a=a, dt_bias=dt_bias, k=k, v=v, b=b, initial_state_source=initial_state_source)
    captured = _captured(k)
    B, T = _batch_shape(k, cu_seqlens, initial_state_indices, captured)
    k, v, a, b = (_unpack(x, cu_seqlens, (B, T), n) for x, n in zip((k, v, a, b), "kvab"))
    _checked_shapes(k, k, v, a, b, A_log, dt_bias, initial_state_source, initial_state_indices)
    pool = initial_state_source
    parents = _parents(retrieve_parent_token, B, T, k)
    slots = initial_state_indices
    if captured and not (pool.dtype == torch.float32 and pool.dim() == 4 and pool.is_contiguous()):
        raise ValueError(f"initial_state_source: a {pool.dtype} pool's commit writes its rows back past a host "
                         "read, which CUDA-graph capture cannot take; capture the commit on an fp32 pool")
    if _backend(k) == "triton" and (captured or _raw(retrieve_parent_token, slots, accepted)):
        tree, slots, _, acc, cu = (parents, slots, None, accepted, cu_seqlens) if captured else _host_checked(
            k, B, T, pool=pool, slots=slots, tree=parents, cu_seqlens=cu_seqlens, accepted=accepted)
        step = _step(k, a=a, b=b, pool=pool, slots=slots, tree=tree, cu_seqlens=cu,
                     accepted=acc if not isinstance(acc, checks.CheckedIndices) else None)
        a, b, slots, parents = step.a, step.b, step.slots, step.plan
        accepted = step.accepted or accepted
    s0, slots, rows = _state_view(pool, slots, B)
    from ddsim import gpu_backend as gb
    new = gb.gdn_tree_commit(k, v, parents=parents, accepted=accepted,
                             initial_state=s0, state_indices=slots, inplace=rows is None,
                             use_qk_l2norm=use_qk_l2norm_in_kernel, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                             backend=_backend(k))
    if rows is not None:  # a pool of another dtype: its batch rows were copied; write them back (not a padded row's)
        live = rows >= 0
        pool.index_copy_(0, rows[live], new[live].transpose(-1, -2).to(pool.dtype))
    return pool
