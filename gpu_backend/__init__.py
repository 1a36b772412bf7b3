"""Fast paths for tree verification (README: Contracts, kernel interface). Each op has a plain twin in ``oracle/`` with the same
keyword-only signature.

Backends, chosen by ``backend=`` (default: "triton" for CUDA tensors, "torch" otherwise):
  torch             pure PyTorch, batched over the tree (serves CPU users)
  triton            gdn_tree_verify: "triton-wy" unless per-node states are asked for, then
                    "triton-recurrent"
  triton-recurrent  leaky = flattened recurrence (per-node states optional);
                    exact = parent-indexed recurrence over per-node snapshots, or for a small batch
                    (triton_gdn.paths_design) a program per node along its root path
  triton-wy         exact (or leaky) through the tree-masked WY form: no per-node states; up to 65
                    nodes in two kernels (the value-independent half once per head, then per V
                    tile), in one kernel for a single sequence of <= 17 nodes; over 64-row chunks
                    beyond (budgets 128, 256, ...: three kernels, triton_wy_blocked). Which form:
                    "split" for one sequence, "head" for a batch with bf16 inputs, else "fold" (what
                    measured fastest on the H200)
  triton-wy-fused   the WY form in one kernel (the solve repeated per V tile); past 65 nodes the
                    one-kernel chunked form
  triton-wy-split   two kernels: K.K^T, Q.K^T and the solve once per head; the root step, U and O per
                    V tile (past 65 nodes: three, the solve per head and chunk)
  triton-wy-fold    two kernels: the solve also folds W, P, the gates and K into the output's weights
                    on the root state and on v; per V tile two products (O = Qe S_r + Ve V); past 65
                    nodes the same fold over chunks
  triton-wy-head    one kernel: a program per head folds the root's step into those weights too and
                    applies them to every V tile of the committed state itself; past 65 nodes as fold
Mamba2 (mamba2_tree_verify / mamba2_tree_commit) takes "torch", "triton" ("triton-ssd" unless
per-node states are asked for), "triton-recurrent" and "triton-ssd" (the tree-masked SSD form: no
per-node states, any tree size).
The layers' glue (rms_norm, rms_norm_rope, gated_rms_norm, gated_act, gdn_gates, tree_attention) takes ``glue=``
"torch" (the reference, what the CPU runs) or "triton" (one kernel each, triton_norms and triton_attention; the
model's default on CUDA).
Triton kernels also run on the CPU under TRITON_INTERPRET=1 (the tests do this).

``parents=`` takes a [B, T] integer tensor, or a ``TreePlan`` built once per tree and shared by every
layer: validated when built, its index tables derived once and cached, so the per-layer calls do
no host synchronisation for the tree. Likewise the commits take ``accepted=`` as ``checked_accepted(...)``
(validated once per step, on the host when given host values) in place of raw indices, and every
pooled call ``state_indices=`` as ``checked_slots(...)`` (the pool rows validated once).

Outputs are allocated unfilled, as an engine allocates them, except where ``poisoning()`` is on (the
test suites, audits and ``ddsim check-kernel``: ``poisoned()``), where the launchers NaN-fill them first
so an element a kernel fails to write cannot pass a comparison.
"""
from __future__ import annotations

import contextlib
import importlib
import math

import torch

from ddsim.gpu_backend import _common, checks, fastcall, torch_kda, torch_lightning, torch_mamba1, torch_mamba2, torch_ops
from ddsim.gpu_backend import launch as _launch
from ddsim.gpu_backend.checks import CheckedIndices, CheckedSlots, TreePlan, checked_accepted, checked_slots, poisoned, poisoning

BACKENDS = ("torch", "triton", "triton-recurrent", "triton-wy", "triton-wy-fused", "triton-wy-split", "triton-wy-fold",
            "triton-wy-head")
MAMBA2_BACKENDS = ("torch", "triton", "triton-recurrent", "triton-ssd")


_SAME = contextlib.nullcontext()
_TRITON: dict = {}  # the Triton launcher modules, imported on first use (they import triton)


def _on(x):
    """Triton launches on the current CUDA device: run a launcher under x's device (a guard: inputs on a
    GPU other than the current one, as in a model placed over several GPUs); nothing to do when x is
    on the current device already, or on the CPU."""
    if not getattr(x, "is_cuda", False) or x.device.index == torch._C._cuda_getDevice():  # (not a tensor: refused
        return _SAME  # by the launcher's checks, by name)
    return torch.cuda.device(x.device)


def _triton(name: str):
    """ddsim.gpu_backend.<name>, imported once (an import statement in a launcher costs a microsecond
    a call)."""
    mod = _TRITON.get(name)
    if mod is None:
        mod = _TRITON[name] = importlib.import_module(f"ddsim.gpu_backend.{name}")
    return mod


# fastcall: the positions of the public calls' arguments a recipe may read as tensors (the data and the
# state; never state_indices or accepted, whose raw values are checked on every call)
_VERIFY_TENSORS = frozenset((0, 1, 2, 3, 4, 5, 11, 12, 13, 14))
_COMMIT_TENSORS = frozenset((0, 1, 2, 3, 5, 9, 10, 11, 12))
_STATES_TENSORS = frozenset((0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14))  # _verify_into's: the data, the state, states_out
_FAST: list = [None]  # fastcall's C++ call, once its extension is built


def _recordable(parents, x) -> bool:
    """A call on a TreePlan on the current CUDA device, with the extension at hand: recorded."""
    if type(parents) is not TreePlan or not x.is_cuda or not _launch.DIRECT or _on(x) is not _SAME:
        return False
    if _FAST[0] is None:
        mod = fastcall.ext()
        if mod is None:
            return False
        _FAST[0] = mod.call
    return True


def _unreplayable(*data, rows: int = 0) -> bool:
    """Calls whose launchers make a tensor per call, so that a recipe could never be kept, told apart
    before recording (a plan records a bounded number of calls: these would spend them): data the launcher copies,
    non-contiguous gates, or among the first ``rows`` (q, k, v: read by row stride, _common.rows_of) a layout other
    than rows of heads side by side (a fused projection's views are read in place; the model's q, k, v come from
    the tree conv contiguous, split=). Counted among fastcall's refusals."""
    if not all(x is None or (_common.row_stride(x) is not None if i < rows else x.is_contiguous()) for i, x in enumerate(data)):
        fastcall.skip("data the launcher copies (a layout its kernels do not read)")
        return True
    return False


def _recorded_or_run(plan, data: tuple, op: str, args: tuple, tensors: frozenset, owners: tuple, run, rows: int = 0):
    """run() of a public call on data (its first tensor the one whose device it runs on): through fastcall's
    recorder (op's recipes of plan, args the call's arguments, tensors / owners as fastcall.record takes them) where
    it can be replayed, else under that tensor's device."""
    x = data[0]
    if _recordable(plan, x) and not _unreplayable(*data, rows=rows):
        return fastcall.record(plan, op, args, tensors, owners, run)
    with _on(x):
        return run()


def _backend(x, backend, known=BACKENDS):
    b = backend or ("triton" if getattr(x, "is_cuda", False) else "torch")  # (not a tensor: the checks name it)
    if b not in known:
        raise ValueError(f"backend: expected one of {known}, got {b!r}")
    return b


def gdn_tree_verify(q, k, v, g=None, beta=None, *, parents, initial_state, mode="exact", scale=None,
                    use_qk_l2norm=True, output_states=False, state_indices=None, a=None, b=None, A_log=None,
                    dt_bias=None, states_out=None, states_rows=None, backend=None):
    """q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] (or fused a, b [B, T, HV] with A_log,
    dt_bias [HV]); parents [B, T]; initial_state [B, HV, K, V] fp32 or a pool with state_indices [B].
    Returns o [B, T, HV, V] and, with output_states, per-node states [B, T, HV, K, V]. With states_out,
    an fp32 [N, TS >= T, HV, K, V] buffer (or the transpose of a contiguous [N, TS, HV, V, K] one,
    SGLang's intermediate buffer), sequence b's node states are written into states_out[states_rows[b],
    :T] (states_rows None: row b, N >= B) and (o, states_out) returned; on the Triton backends the recurrent
    kernels write them there themselves (no per-node allocation): the serial one reading each parent's back from
    it, the paths one (small batches in exact mode) each node's from its root path."""
    if states_out is not None or states_rows is not None:
        if type(parents) is TreePlan and parents.fast_states and _launch.DIRECT:  # a recorded signature
            out = _FAST[0](parents.fast_states, q, k, v, g, beta, initial_state, mode, scale, use_qk_l2norm,
                           state_indices, a, b, A_log, dt_bias, states_out, states_rows, backend)
            if out is not None:
                return out
        return _verify_into(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode=mode, scale=scale,
                            use_qk_l2norm=use_qk_l2norm, state_indices=state_indices, a=a, b=b, A_log=A_log,
                            dt_bias=dt_bias, states_out=states_out, states_rows=states_rows, backend=backend)
    if type(parents) is TreePlan and parents.fast_verify and _launch.DIRECT:  # a recorded signature: C++ serves it
        out = _FAST[0](parents.fast_verify, q, k, v, g, beta, initial_state, mode, scale, use_qk_l2norm, output_states,
                       state_indices, a, b, A_log, dt_bias, backend)
        if out is not None:
            return out
    be = _backend(q, backend)
    kw = dict(parents=parents, initial_state=initial_state, mode=mode, scale=scale, use_qk_l2norm=use_qk_l2norm,
              output_states=output_states, state_indices=state_indices, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    if be == "torch":
        return torch_ops.gdn_tree_verify(q, k, v, g, beta, **kw)
    triton_gdn = _triton("triton_gdn")
    if be == "triton":
        be = "triton-recurrent" if output_states else "triton-wy"
    if be == "triton-recurrent":
        fn = triton_gdn.gdn_tree_verify_recurrent
    else:
        fn = triton_gdn.gdn_tree_verify_wy
        kw["design"] = {"triton-wy-split": "split", "triton-wy-fused": "fused", "triton-wy-fold": "fold",
                        "triton-wy-head": "head"}.get(be, "auto")
    args = (q, k, v, g, beta, initial_state, mode, scale, use_qk_l2norm, output_states, state_indices, a, b, A_log,
            dt_bias, backend)
    return _recorded_or_run(parents, (q, k, v, g, beta, a, b, A_log, dt_bias), "verify", args, _VERIFY_TENSORS,
                            (parents, state_indices), lambda: fn(q, k, v, g, beta, **kw), rows=3)


def _verify_into(q, k, v, g, beta, *, states_out, states_rows, backend, **kw):
    """gdn_tree_verify with states_out: the recurrent Triton kernels writing into the buffer (replayed on a TreePlan
    with planned rows); the torch path computing them, then copied in; a Triton backend named other than recurrent
    (which keeps no node states) refused."""
    if states_out is None:
        raise ValueError("states_rows: given without states_out")
    be = _backend(q, backend)
    if be in ("triton", "triton-recurrent"):
        def run():
            return _triton("triton_gdn").gdn_tree_verify_recurrent(q, k, v, g, beta, states_out=states_out,
                                                                   states_rows=states_rows, **kw)
        plan, a, b, A_log, dt_bias = kw["parents"], kw["a"], kw["b"], kw["A_log"], kw["dt_bias"]
        args = (q, k, v, g, beta, kw["initial_state"], kw["mode"], kw["scale"], kw["use_qk_l2norm"],
                kw["state_indices"], a, b, A_log, dt_bias, states_out, states_rows, backend)
        return _recorded_or_run(plan, (q, k, v, g, beta, a, b, A_log, dt_bias), "states", args, _STATES_TENSORS,
                                (plan, kw["state_indices"], states_rows), run, rows=3)
    if be != "torch":
        raise ValueError(f"states_out: backend {be!r} writes no per-node states; use 'triton' or 'torch'")
    B, T, _, HV, K, V = checks.check_gdn_args(q, k, v, g, beta, kw["a"], kw["b"])
    checks.node_states_vk(states_out, T, HV, K, V, q.device)
    rows = checks.node_state_rows(states_out, states_rows, B).long()
    o, states = torch_ops.gdn_tree_verify(q, k, v, g, beta, output_states=True, **kw)
    states_out[rows, :T] = states.to(states_out.dtype)
    return o, states_out


def gdn_tree_commit(k, v, g=None, beta=None, *, parents, accepted, initial_state, use_qk_l2norm=True,
                    state_indices=None, inplace=False, a=None, b=None, A_log=None, dt_bias=None, backend=None):
    """State after the accepted path root..accepted[b], without per-node snapshots. initial_state
    [B, HV, K, V], or a pool [N, HV, K, V] addressed by state_indices [B]. inplace writes the result
    into the batch's pool slots and returns the pool; otherwise a new [B, HV, K, V] tensor."""
    if type(parents) is TreePlan and parents.fast_commit and _launch.DIRECT:
        out = _FAST[0](parents.fast_commit, k, v, g, beta, accepted, initial_state, use_qk_l2norm, state_indices,
                       inplace, a, b, A_log, dt_bias, backend)
        if out is not None:
            return out
    be = _backend(k, backend)
    if be == "torch":
        checks.check_gdn_args(k, k, v, g, beta, a, b)
        g, beta = checks.resolve_gates(g, beta, a, b, A_log, dt_bias)
        new = torch_ops.gdn_tree_commit(k, v, g, beta, parents=parents, accepted=accepted,
                                        initial_state=checks.resolve_state(initial_state, state_indices, k.shape[0],
                                                                           pads=True),
                                        use_qk_l2norm=use_qk_l2norm)
        if inplace:
            return checks.write_slots(initial_state, state_indices, k.shape[0], new, "initial_state", "states", pads=True)
        return new
    def run():
        return _triton("triton_commit").gdn_tree_commit_triton(
            k, v, g, beta, parents=parents, accepted=accepted, initial_state=initial_state, use_qk_l2norm=use_qk_l2norm,
            state_indices=state_indices, inplace=inplace, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    args = (k, v, g, beta, accepted, initial_state, use_qk_l2norm, state_indices, inplace, a, b, A_log, dt_bias,
            backend)
    return _recorded_or_run(parents, (k, v, g, beta, a, b, A_log, dt_bias), "commit", args, _COMMIT_TENSORS,
                            (parents, accepted, state_indices), run, rows=2)


def tree_causal_conv1d(x, *, weight, bias=None, parents, initial_window, mode="exact", activation="silu",
                       output_windows=False, state_indices=None, split=None, backend=None):
    """x [B, T, C]; weight [C, W]; initial_window [B, C, W-1] oldest first, or a pool [N, C, W-1]
    addressed by state_indices [B]. Returns out [B, T, C] and, with output_windows, each node's
    window [B, T, C, W-1]. The windows are read, never written. split (three channel counts summing to C):
    out as a tuple of its channel groups [B, T, c_i]: the Triton kernel writes them apart, each contiguous
    (GDN's q, k, v go to the WY kernels without a copy); PyTorch's are views of its whole output."""
    be = _backend(x, backend)
    if split is not None and (len(split) != 3 or any(int(c) <= 0 for c in split) or sum(split) != x.shape[-1]):
        raise ValueError(f"split: expected three positive channel counts summing to {x.shape[-1]}, got {split}")
    kw = dict(weight=weight, bias=bias, parents=parents, mode=mode, activation=activation,
              output_windows=output_windows)
    if be == "torch":
        out = torch_ops.tree_causal_conv1d(
            x, initial_window=checks.resolve_window(initial_window, state_indices, x.shape[0]), **kw)
        if split is None:
            return out
        y, win = out if output_windows else (out, None)
        parts = tuple(y.split(list(split), -1))
        return (parts, win) if output_windows else parts
    with _on(x):
        return _triton("triton_conv").tree_causal_conv1d_triton(x, initial_window=initial_window, state_indices=state_indices,
                                                                split=split, **kw)


def conv_tree_commit(x, *, parents, accepted, initial_window, state_indices=None, inplace=False, backend=None):
    """Window after root..accepted[b]: [B, C, W-1]; with a pool and state_indices, the batch's slots
    are read, and with inplace written (the pool is returned). Other slots are not touched."""
    be = _backend(x, backend)
    if be == "torch":
        new = torch_ops.conv_tree_commit(x, parents=parents, accepted=accepted,
                                         initial_window=checks.resolve_window(initial_window, state_indices, x.shape[0]))
        if inplace:
            return checks.write_slots(initial_window, state_indices, x.shape[0], new, "initial_window", "windows")
        return new
    with _on(x):
        return _triton("triton_commit").conv_tree_commit_triton(x, parents=parents, accepted=accepted, initial_window=initial_window,
                                       state_indices=state_indices, inplace=inplace)


def mamba2_tree_verify(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf),
                       parents, initial_state, state_indices=None, mode="exact", output_states=False, backend=None):
    """One Mamba2 SSM over a tree. x [B, T, H, P]; dt [B, T, H] raw (dt_bias added, softplus and
    dt_limit applied in the op); A [H] negative; B, C [B, T, G, N]; D, dt_bias [H] or None;
    parents [B, T] or a TreePlan; initial_state [B, H, P, N] fp32, or a pool with state_indices [B]
    (read, never written). Returns y [B, T, H, P] in x's dtype and, with output_states, the state
    after every node [B, T, H, P, N] fp32."""
    be = _backend(x, backend, MAMBA2_BACKENDS)
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit, parents=parents,
              initial_state=initial_state, state_indices=state_indices, mode=mode, output_states=output_states)
    if be == "torch":
        return torch_mamba2.mamba2_tree_verify(x, dt, A, B, C, **kw)
    triton_mamba2 = _triton("triton_mamba2")
    if be == "triton":
        be = "triton-recurrent" if output_states else "triton-ssd"
    fn = triton_mamba2.mamba2_tree_verify_recurrent if be == "triton-recurrent" else triton_mamba2.mamba2_tree_verify_ssd
    with _on(x):
        return fn(x, dt, A, B, C, **kw)


def mamba2_tree_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, dt_limit=(0.0, math.inf), parents, accepted,
                       initial_state, state_indices=None, inplace=False, backend=None):
    """SSM state after the accepted path root..accepted[b], without per-node snapshots. inplace
    writes it into the batch's pool slots and returns the pool; otherwise a new [B, H, P, N]."""
    be = _backend(x, backend, MAMBA2_BACKENDS)
    kw = dict(dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit, parents=parents, accepted=accepted,
              initial_state=initial_state, state_indices=state_indices)
    if be == "torch":
        new = torch_mamba2.mamba2_tree_commit(x, dt, A, B, **kw)
        if inplace:
            return checks.write_slots(initial_state, state_indices, x.shape[0], new, "initial_state", "states")
        return new
    with _on(x):
        return _triton("triton_mamba2").mamba2_tree_commit_triton(x, dt, A, B, inplace=inplace, **kw)


MAMBA1_BACKENDS = ("torch", "triton", "triton-recurrent")  # one Triton design
LIGHTNING_BACKENDS = ("torch", "triton", "triton-recurrent", "triton-masked")
KDA_BACKENDS = ("torch", "triton", "triton-recurrent", "triton-wy")


def _one_design(x, state, backend, allowed) -> str:
    """The backend of an op with the Triton designs ``allowed`` (Mamba1, KDA, lightning): ``backend`` checked, else
    Triton for CUDA tensors with fp32 states and PyTorch otherwise."""
    if backend is None:
        return "triton" if getattr(x, "is_cuda", False) and getattr(state, "dtype", None) == torch.float32 else "torch"
    if backend not in allowed:
        raise ValueError(f"backend: expected one of {allowed}, got {backend!r}")
    return backend


def mamba1_tree_verify(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=True, parents, initial_state, mode="exact",
                       output_states=False, backend=None):
    """One Mamba1 selective scan over a tree. x [B, T, I]; dt [B, T, I] raw (dt_bias added and softplus applied
    in the op); A [I, N] negative; B, C [B, T, N]; D, dt_bias [I] or None; parents [B, T] or a TreePlan;
    initial_state [B, I, N] fp32 (read, never written). Returns y [B, T, I] in x's dtype and, with
    output_states, the state after every node [B, T, I, N] fp32. Backends: "torch" (the default off CUDA, and for fp64
    states), "triton" = "triton-recurrent" (the default on CUDA: flattened, or parent-indexed over per-node states)."""
    if _one_design(x, initial_state, backend, MAMBA1_BACKENDS) == "torch":
        return torch_mamba1.mamba1_tree_verify(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                               parents=parents, initial_state=initial_state, mode=mode,
                                               output_states=output_states)
    with _on(x):
        return _triton("triton_mamba1").mamba1_tree_verify(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                           parents=parents, initial_state=initial_state, mode=mode,
                                                           output_states=output_states)


def mamba1_tree_commit(x, dt, A, B, *, dt_bias=None, dt_softplus=True, parents, accepted, initial_state, backend=None):
    """Mamba1 state after the accepted path root..accepted[b], without per-node snapshots: a new [B, I, N]. Backends
    as mamba1_tree_verify's (Triton: the accepted path's steps in one kernel)."""
    if _one_design(x, initial_state, backend, MAMBA1_BACKENDS) == "torch":
        return torch_mamba1.mamba1_tree_commit(x, dt, A, B, dt_bias=dt_bias, dt_softplus=dt_softplus, parents=parents,
                                               accepted=accepted, initial_state=initial_state)
    with _on(x):
        return _triton("triton_mamba1").mamba1_tree_commit(x, dt, A, B, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                           parents=parents, accepted=accepted, initial_state=initial_state)


def lightning_tree_verify(q, k, v, *, decay, parents, initial_state, mode="exact", output_states=False, backend=None):
    """One lightning-attention layer (MiniMax) over a tree. q, k [B, T, H, K]; v [B, T, H, V]; decay [H] (the
    per-head lambda = exp(-slope)); parents [B, T] or a TreePlan; initial_state [B, H, K, V] fp32 (read, never
    written). Returns o [B, T, H, V] in q's dtype and, with output_states, the state after every node
    [B, T, H, K, V] fp32. Backends: "torch" (the default off CUDA, and for fp64 states); "triton" = "triton-masked"
    (the default on CUDA): mode "exact" without per-node states as tree-masked decayed attention from each node's
    root path (no state per node written), the recurrence otherwise (flattened, or parent-indexed over per-node
    states); "triton-recurrent": the recurrence always."""
    backend = _one_design(q, initial_state, backend, LIGHTNING_BACKENDS)
    if backend == "torch":
        return torch_lightning.lightning_tree_verify(q, k, v, decay=decay, parents=parents, initial_state=initial_state,
                                                     mode=mode, output_states=output_states)
    design = {"triton": "auto", "triton-recurrent": "recurrent", "triton-masked": "masked"}[backend]
    with _on(q):
        return _triton("triton_lightning").lightning_tree_verify(q, k, v, decay=decay, parents=parents,
                                                                 initial_state=initial_state, mode=mode,
                                                                 output_states=output_states, design=design)


def lightning_tree_commit(k, v, *, decay, parents, accepted, initial_state, backend=None):
    """Lightning-attention state after the accepted path root..accepted[b], without per-node snapshots: a new
    [B, H, K, V]. Backends as lightning_tree_verify's (Triton: the accepted path's steps in one kernel)."""
    if _one_design(k, initial_state, backend, LIGHTNING_BACKENDS) == "torch":
        return torch_lightning.lightning_tree_commit(k, v, decay=decay, parents=parents, accepted=accepted,
                                                     initial_state=initial_state)
    with _on(k):
        return _triton("triton_lightning").lightning_tree_commit(k, v, decay=decay, parents=parents, accepted=accepted,
                                                                 initial_state=initial_state)


def kda_tree_verify(q, k, v, g, beta, *, parents, initial_state, mode="exact", output_states=False, backend=None):
    """One Kimi Delta Attention layer over a tree. q, k [B, T, H, K] (L2-normalised in the op); v [B, T, H, V];
    g [B, T, H, K] the log decay per key channel; beta [B, T, H]; parents [B, T] or a TreePlan; initial_state
    [B, H, K, V] fp32 (read, never written). Returns o [B, T, H, V] in v's dtype and, with output_states, the state
    after every node [B, T, H, K, V] fp32. Backends: "torch" (the default off CUDA, and for fp64 states); "triton"
    (the default on CUDA): for mode "exact" without per-node states the WY form (no state per node written) from
    triton_kda.WY_FROM_PROGRAMS (sequence, head) pairs on, the recurrence (flattened, or parent-indexed over per-node
    states) otherwise; "triton-wy" takes the WY form wherever it applies, "triton-recurrent" never."""
    backend = _one_design(q, initial_state, backend, KDA_BACKENDS)
    if backend == "torch":
        return torch_kda.kda_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, mode=mode,
                                         output_states=output_states)
    design = {"triton": "auto", "triton-recurrent": "recurrent", "triton-wy": "wy"}[backend]
    with _on(q):
        return _triton("triton_kda").kda_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state,
                                                     mode=mode, output_states=output_states, design=design)


def kda_tree_commit(k, v, g, beta, *, parents, accepted, initial_state, backend=None):
    """KDA state after the accepted path root..accepted[b], without per-node snapshots: a new [B, H, K, V]. Backends as
    kda_tree_verify's (Triton: the accepted path's steps in one kernel)."""
    if _one_design(k, initial_state, backend, KDA_BACKENDS) == "torch":
        return torch_kda.kda_tree_commit(k, v, g, beta, parents=parents, accepted=accepted, initial_state=initial_state)
    with _on(k):
        return _triton("triton_kda").kda_tree_commit(k, v, g, beta, parents=parents, accepted=accepted,
                                                     initial_state=initial_state)


# ---- the layers' glue ----------------------------------------------------------------------------
GLUES = ("torch", "triton")


def check_glue(glue: str) -> str:
    """``glue`` if it is one of GLUES, else a ValueError naming it."""
    if glue not in GLUES:
        raise ValueError(f"glue: expected one of {GLUES}, got {glue!r}")
    return glue


def _glue(glue: str, module: str = "triton_norms"):
    """The Triton module ``module``, ``glue`` checked (each function below takes torch_ops' twin for "torch" first,
    so what reaches here is "triton" or refused)."""
    check_glue(glue)
    return _triton(module)


def tree_attention(q, k, v, *, prefix_k, prefix_v, ancestor_mask, scale=None, prefix_rows=None,
                   glue: str = "torch"):
    """Tree attention over a committed KV prefix: q [T, nh, hd]; k, v [T, nkv, hd] (rotated); prefix_k, prefix_v
    [P, nkv, hd]; ancestor_mask [T, T] bool (every prefix row attended) or [T, P + T] (a fixed-capacity prefix whose
    unused rows are masked out); prefix_rows (None, or an integer tensor of one element on q's device, read there:
    a fixed-capacity prefix's committed length): the prefix rows at or past it are not visible, and the kernel
    reads none of them -> [T, nh, hd]. glue "torch": PyTorch's SDPA; "triton": one kernel (triton_attention), the
    same fp32 sums in another order."""
    if glue == "torch":
        return torch_ops.tree_attention(q, k, v, prefix_k=prefix_k, prefix_v=prefix_v, ancestor_mask=ancestor_mask,
                                        scale=scale, prefix_rows=prefix_rows)
    with _on(q):
        return _glue(glue, "triton_attention").tree_attention_triton(q, k, v, prefix_k=prefix_k, prefix_v=prefix_v,
                                                                     ancestor_mask=ancestor_mask, scale=scale,
                                                                     prefix_rows=prefix_rows)


def rms_norm(x, weight, *, eps: float, residual=None, glue: str = "torch"):
    """RMSNorm of x [..., D] (fp32, rounded to x's dtype) times weight [D]; with residual [..., D]: h = x +
    residual first, and (normed h, h) returned."""
    if glue == "torch":
        return torch_ops.rms_norm(x, weight, eps=eps, residual=residual)
    with _on(x):
        return _glue(glue).rms_norm_triton(x, weight, eps=eps, residual=residual)


def rms_norm_rope(x, weight, cos, sin, *, eps: float, glue: str = "torch"):
    """q or k per head x [n, heads, D]: RMS-normed over D times weight [D], then its first ROT dims rotated by
    cos, sin [n, ROT] (rotate-half RoPE)."""
    if glue == "torch":
        return torch_ops.rms_norm_rope(x, weight, cos, sin, eps=eps)
    with _on(x):
        return _glue(glue).rms_norm_rope_triton(x, weight, cos, sin, eps=eps)


def gated_rms_norm(x, weight, gate, *, eps: float, glue: str = "torch"):
    """x [N, heads, D] RMS-normed over D, times weight [D], times silu(gate) (gate [N, heads * D])."""
    if glue == "torch":
        return torch_ops.gated_rms_norm(x, weight, gate, eps=eps)
    with _on(x):
        return _glue(glue).gated_rms_norm_triton(x, weight, gate, eps=eps)


def gated_act(gate, up, *, act: str = "silu", glue: str = "torch"):
    """act(gate) * up: a gated MLP's (act "silu" or "gelu") or a sigmoid-gated output ("sigmoid")."""
    if act not in ("silu", "gelu", "sigmoid"):
        raise ValueError(f"act: expected 'silu', 'gelu' or 'sigmoid', got {act!r}")
    if glue == "torch":
        return torch_ops.gated_act(gate, up, act=act)
    with _on(gate):
        return _glue(glue).gated_act_triton(gate, up, act=act)


def gdn_gates(a, b, *, A, dt_bias, beta_scale: float = 1.0, glue: str = "torch"):
    """GDN's (g, beta) [N, HV] float32 from the raw projections a, b [N, HV]: g = A softplus(a + dt_bias)
    with A = -exp(A_log), beta = sigmoid(b) beta_scale."""
    if glue == "torch":
        return torch_ops.gdn_gates(a, b, A=A, dt_bias=dt_bias, beta_scale=beta_scale)
    with _on(a):
        return _glue(glue).gdn_gates_triton(a, b, A=A, dt_bias=dt_bias, beta_scale=beta_scale)


__all__ = ["gdn_tree_verify", "gdn_tree_commit", "mamba2_tree_verify", "mamba2_tree_commit", "mamba1_tree_verify",
           "mamba1_tree_commit", "lightning_tree_verify", "lightning_tree_commit", "kda_tree_verify",
           "kda_tree_commit", "tree_causal_conv1d",
           "conv_tree_commit", "tree_attention", "TreePlan", "CheckedIndices",
           "checked_accepted", "CheckedSlots", "checked_slots", "poisoned", "poisoning", "BACKENDS", "MAMBA2_BACKENDS",
           "rms_norm", "rms_norm_rope", "gated_rms_norm", "gated_act", "gdn_gates", "GLUES", "check_glue"]
