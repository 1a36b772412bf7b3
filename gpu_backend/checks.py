"""Input checks and index tables shared by every fast-path backend (pure torch and Triton): one
definition each, so the backends refuse the same inputs with the same messages.

Shapes: parents, accepted [B, T] / [B]; q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV];
states [B or N, HV, K, V]; conv x [B, T, C], weight [C, W], windows [B or N, C, W-1].
"""
from __future__ import annotations

import contextlib
import numbers
import os

import numpy as np
import torch
import torch.nn.functional as F

from ddsim.gpu_backend import host_tables

MODES = ("exact", "leaky")


PAD_SLOT = -1  # a padded row's slot (SGLang's PAD_SLOT_ID: a CUDA-graph batch padded to its captured size)


class CheckedSlots:
    """A batch's pool rows [B] validated once (``checked_slots``: distinct, in 0..N-1) and passed as
    ``state_indices=`` to every layer's call, which then checks only the pool's row count, the shape
    and the device: no per-layer host sync. ``indices`` is int32 (made so once: under capture a cast is one more
    kernel in the graph, a layer). ``padded``: how many rows are padding (PAD_SLOT), which only the GDN verify and
    commit take (engine_api)."""

    def __init__(self, indices: torch.Tensor, N: int, padded: int = 0):
        self.indices, self.N, self.padded = indices.to(torch.int32).contiguous(), N, padded


def _integers(host: list) -> bool:
    """Whether every host value is an integer (numpy's included), none a bool or a float: an index given as 2.7 or
    True is refused, not truncated to another one."""
    return all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in host)


def checked_slots(state_indices, N: int, B: int, device, name: str = "state_indices", pad: bool = False
                  ) -> CheckedSlots:
    """Validate the pool rows state_indices [B] of a pool of N rows once: on the host when given host
    values (no device sync), else with one sync. ``name``: the argument the messages name. ``pad``: rows of
    PAD_SLOT (-1) are padding, as an engine pads a CUDA-graph batch (the rest distinct, in 0..N-1)."""
    if isinstance(state_indices, CheckedSlots):
        return state_indices
    if isinstance(state_indices, torch.Tensor) and (state_indices.dtype not in (torch.int32, torch.int64)
                                                    or state_indices.dim() != 1):
        raise ValueError(f"{name}: expected [B] integers, got {tuple(state_indices.shape)} {state_indices.dtype}")
    host = state_indices.tolist() if isinstance(state_indices, (torch.Tensor, np.ndarray)) else list(state_indices)
    if len(host) != B or not _integers(host):
        raise ValueError(f"{name}: expected [B] = [{B}] integers, got {host}")
    host = [int(x) for x in host]
    noun = "slots" if name in ("state_indices", "initial_state_indices") else "rows"
    real = [x for x in host if not (pad and x == PAD_SLOT)]
    if any(not 0 <= x < N for x in real):
        raise ValueError(f"{name}: {noun} must lie in 0..{N - 1}{f' (or {PAD_SLOT}: a padded row)' if pad else ''}, "
                         f"got {host}")
    if len(set(real)) != len(real):
        raise ValueError(f"{name}: {noun} must be distinct, got {host}")
    return CheckedSlots(torch.tensor(host, dtype=torch.int32, device=device), N, B - len(real))


class TreePlan:
    """The parents of a batch of trees [B, T], validated once, and the index tables every layer's
    kernels derive from them, each built on first use and cached: source parents per mode, conv
    source tables per (mode, W), ancestor-or-self masks per mode. A model builds one per verify step
    and passes it as ``parents=`` to every layer, so no layer re-validates or re-derives them (the
    validation's host syncs happen once per step, not once per layer)."""

    def __init__(self, parents, *, device=None):
        p = torch.as_tensor(parents, device=device)
        if p.dim() != 2:
            raise ValueError(f"parents: expected [B, T], got {tuple(p.shape)}")
        self.B, self.T = p.shape
        self.parents = check_parents(p, self.B, self.T, p.device)  # [B, T] int64
        self.device = self.parents.device
        self._cache: dict = {}
        # fastcall's recipes of the public calls made with this plan (CUDA only)
        self.fast_verify: list = []
        self.fast_commit: list = []
        self.fast_states: list = []  # the verify with states_out (gdn_tree_verify's drop-in form)
        self.fast_tries = {"verify": 0, "commit": 0, "states": 0}
        # whether root_paths serves the recurrent verify's paths kernel (ddsim.model.graphs.AnyModePlan's does not:
        # its kernels run with another mode's sources in place of the tree's)
        self.serves_paths = True

    def _cached(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def src(self, mode: str) -> torch.Tensor:
        """[B, T] each node's source of state in ``mode`` (its parent, or the previous node)."""
        return self._cached(("src", mode), lambda: mode_parents(self.parents, mode))

    def conv_table(self, mode: str, W: int) -> torch.Tensor:
        """int32 [B, T, W]: conv_sources of ``mode``'s source parents (on the host, host_tables' twin)."""
        def build():
            src = self.src(mode)
            if src.device.type == "cpu":
                return torch.from_numpy(host_tables.conv_sources(src.numpy(), W).astype(np.int32))
            return conv_sources(src, W).to(torch.int32).contiguous()
        return self._cached(("conv", mode, W), build)

    def ancestors(self, mode: str):
        """(int8 [B, T, T] ancestor-or-self mask, max depth) of ``mode``'s source parents (on the host,
        host_tables' twin)."""
        def build():
            src = self.src(mode)
            if src.device.type == "cpu":
                mask, depth = host_tables.ancestor_mask(src.numpy())
                return torch.from_numpy(mask), depth
            return ancestor_mask(src)
        return self._cached(("anc", mode), build)

    def depth_table(self, mode: str):
        """None: a host plan's depth is ``ancestors``' (its deepest tree's), which its kernels' launch takes; a
        DevicePlan's (device_checks) is each tree's on the device."""
        return None

    def root_paths(self, mode: str = "exact") -> torch.Tensor:
        """int32 [B, T, depth + 1]: each node's root path (its ancestors-or-self among ``mode``'s source parents: in
        the tree for "exact", every earlier node for "leaky"), root first, -1 padded; a commit picks its accepted
        node's row with one gather, no host sync (on the host, host_tables' twin)."""
        def build():
            mask, depth = self.ancestors(mode)
            if mask.device.type == "cpu":
                return torch.from_numpy(host_tables.root_paths(mask.numpy(), depth))
            return root_paths_of(mask, depth)
        return self._cached(("paths",) if mode == "exact" else ("paths", mode), build)


def root_paths_of(mask: torch.Tensor, depth: int) -> torch.Tensor:
    """int32 [B, T, depth + 1] from an ancestor-or-self mask [B, T, T] of that max depth: each node's ancestors-or-
    self in node order (root first), -1 padded (host_tables.root_paths is its numpy twin)."""
    T = mask.shape[-1]
    idx = torch.arange(T, device=mask.device)
    key = torch.where(mask.bool(), idx, idx + T)  # ancestors sort first, in node order
    first = key.sort(dim=-1).values[..., : depth + 1]
    return torch.where(first < T, first, -1).to(torch.int32).contiguous()


def fp32_state(initial_state: torch.Tensor, kernel: str) -> None:
    """A Triton recurrent-family kernel keeps its states in fp32: any other committed state is refused."""
    if initial_state.dtype != torch.float32:
        raise ValueError(f"initial_state: the Triton {kernel} kernel keeps fp32 states, got {initial_state.dtype}")


def root_paths(parents, B: int, T: int, device, mode: str = "exact") -> torch.Tensor:
    """int32 [B, T, DMAX] every node's root path among ``mode``'s source parents (root first, the node last, -1
    padded) from raw parents (checked) or a TreePlan (cached)."""
    plan = parents if isinstance(parents, TreePlan) else TreePlan(parents, device=device)
    check_parents(plan, B, T, device)
    return plan.root_paths(mode)


def path_to(parents: torch.Tensor, node: int) -> list[int]:
    """The nodes from the root to ``node``, root first, up one sequence's checked parents ([T]): the path a commit
    replays (the torch fast paths' host walk)."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


def source_parents(parents, B: int, T: int, device, mode: str) -> torch.Tensor:
    """[B, T] source parents of ``mode`` from raw parents (checked) or a TreePlan (cached)."""
    if isinstance(parents, TreePlan):
        check_parents(parents, B, T, device)  # the plan's shape and device
        return parents.src(mode)
    return mode_parents(check_parents(parents, B, T, device), mode)


def check_parents(parents, B: int, T: int, device) -> torch.Tensor:
    """parents [B, T] as int64 on ``device``, every tree valid: node 0 the root (-1), every other
    node's parent an earlier node. A TreePlan was validated when built: only its shape is checked."""
    if isinstance(parents, TreePlan):
        if (parents.B, parents.T) != (B, T):
            raise ValueError(f"parents: a plan for [B, T] = {(parents.B, parents.T)}, the inputs have {(B, T)}")
        if parents.device != torch.device(device):
            raise ValueError(f"parents: a plan on {parents.device}, the inputs on {device}")
        return parents.parents
    p = torch.as_tensor(parents, device=device)
    if p.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"parents: expected an integer tensor, got {p.dtype}")
    if tuple(p.shape) != (B, T):
        raise ValueError(f"parents: expected [B, T] = {(B, T)}, got {tuple(p.shape)}")
    p = p.long()
    if T:
        # on the host in numpy (a graph's verify validates its tree every step: torch's dispatch costs more there)
        a, idx = (p.numpy(), np.arange(T)) if p.device.type == "cpu" else (p, torch.arange(T, device=p.device))
        bad_root = a[:, 0] != -1
        bad = (a[:, 1:] < 0) | (a[:, 1:] >= idx[1:])
        if bad_root.any():
            b = _first(bad_root)[0]
            raise ValueError(f"parents: sequence {b} node 0 must have parent -1, got {int(p[b, 0])}")
        if bad.any():
            b, i = _first(bad)
            raise ValueError(f"parents: sequence {b} node {i + 1}: parent {int(p[b, i + 1])} is not an earlier node")
    return p


def _first(mask) -> tuple[int, ...]:
    """The index of a bool array's or tensor's first true entry, in row-major order."""
    first = np.argwhere(mask)[0] if isinstance(mask, np.ndarray) else mask.nonzero()[0]
    return tuple(int(x) for x in first)


class CheckedIndices:
    """Accepted node indices [B] validated once (``checked_accepted``) and passed as ``accepted=`` to
    the commit of every layer, which then checks only their shape and device: no per-layer host sync.
    ``indices`` is int64 on its device; a CUDA graph may refill it in place between replays."""

    def __init__(self, indices: torch.Tensor, T: int):
        self.indices, self.T = indices, T


def checked_accepted(accepted, B: int, T: int, device) -> CheckedIndices:
    """Validate accepted [B] in 0..T-1 once: on the host when given host values (no device sync),
    else with one sync."""
    if isinstance(accepted, CheckedIndices):
        return CheckedIndices(check_accepted(accepted, B, T, device), T)
    if isinstance(accepted, torch.Tensor) and accepted.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"accepted: expected [B] = [{B}] integer node indices, got {accepted.dtype} {accepted.tolist()}")
    host = accepted.tolist() if isinstance(accepted, (torch.Tensor, np.ndarray)) else accepted
    host = list(host) if isinstance(host, (list, tuple)) else [host]
    if not _integers(host):  # 2.7 is not node 2
        raise ValueError(f"accepted: expected [B] = [{B}] integer node indices, got {host}")
    host = [int(a) for a in host]
    if len(host) != B or any(not 0 <= a < T for a in host):
        raise ValueError(f"accepted: expected [B] = [{B}] node indices in 0..{T - 1}, got {host}")
    return CheckedIndices(torch.tensor(host, dtype=torch.long, device=device), T)


def check_accepted(accepted, B: int, T: int, device) -> torch.Tensor:
    """accepted: one node index per sequence, [B] in 0..T-1 (values checked with one host sync), or
    CheckedIndices (checked once before: only its shape, tree size and device here)."""
    if isinstance(accepted, CheckedIndices):
        idx = accepted.indices
        if tuple(idx.shape) != (B,) or accepted.T != T or idx.device != torch.device(device):
            raise ValueError(f"accepted: checked indices {tuple(idx.shape)} for {accepted.T} nodes on {idx.device}; "
                             f"the inputs have [B] = [{B}], {T} nodes, on {device}")
        return idx
    acc = torch.as_tensor(accepted, device=device)
    if acc.dtype not in (torch.int32, torch.int64):  # a float or bool node index would be truncated to another node
        raise ValueError(f"accepted: expected [B] = [{B}] integer node indices, got {acc.dtype} {acc.tolist()}")
    acc = acc.long().reshape(-1).contiguous()  # a slice of a wider table, as a kernel reads it: [B], stride 1
    if acc.numel() != B or ((acc < 0) | (acc >= T)).any():
        raise ValueError(f"accepted: expected [B] = [{B}] node indices in 0..{T - 1}, got {acc.tolist()}")
    return acc


def check_mode(mode: str) -> None:
    """A verify mode's name, exact or leaky, refused in one line otherwise (every backend's message)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")


def mode_parents(p: torch.Tensor, mode: str) -> torch.Tensor:
    check_mode(mode)
    if mode == "exact":
        return p
    T = p.shape[1]
    return (torch.arange(T, device=p.device) - 1).expand_as(p)


def check_inputs(q, k, v, g, beta, gates: tuple[str, str] = ("g", "beta")):
    """Shapes and dtypes of q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV] -> (B, T, H, HV, K, V). ``gates``:
    the names the refusals give g and beta (("a", "b") for the fused gates' raw inputs, which have their shape)."""
    check_tensors(q=q, k=k, v=v, **dict(zip(gates, (g, beta))))
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q, k: expected equal shapes [B, T, H, K], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected [B, T, HV, V] with B={B}, T={T}, got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"v: HV={HV} value heads is not a multiple of H={H} key heads")
    for name, x in zip(gates, (g, beta)):
        if tuple(x.shape) != (B, T, HV):
            raise ValueError(f"{name}: expected [B, T, HV] = {(B, T, HV)}, got {tuple(x.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), *zip(gates, (g, beta))):
        if not x.is_floating_point():
            raise ValueError(f"{name}: expected a floating dtype, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, q is on {q.device}")
    return B, T, H, HV, K, V


def check_state(initial_state, B, HV, K, V):
    if tuple(initial_state.shape) != (B, HV, K, V):
        raise ValueError(f"initial_state: expected [B, HV, K, V] = {(B, HV, K, V)}, got {tuple(initial_state.shape)}")
    if initial_state.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"initial_state: expected float32 (or float64), got {initial_state.dtype}")


def check_gdn(q, k, v, g, beta, initial_state):
    dims = check_inputs(q, k, v, g, beta)
    B, T, H, HV, K, V = dims
    check_state(initial_state, B, HV, K, V)
    return dims


def check_tensors(**named) -> None:
    """Each named argument a torch.Tensor (an engine's entry point reads their shapes and devices before anything
    else: a numpy array or a list would fail there as an AttributeError, not a refusal naming it)."""
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def check_gdn_args(q, k, v, g, beta, a, b) -> tuple:
    """Shapes of q, k, v and of the gates, given (g, beta) or to be fused from (a, b), each named as given ->
    (B, T, H, HV, K, V). Both backends check this before they make the gates (resolve_gates, check_fused_gates)."""
    if g is None and (a is None or b is None):
        raise ValueError("gates: pass g and beta, or all of a, b, A_log and dt_bias")
    if g is not None and beta is None:
        raise ValueError("beta: required with g")
    if g is None:
        return check_inputs(q, k, v, a, b, ("a", "b"))
    return check_inputs(q, k, v, g, beta)


def check_given(**named) -> None:
    """check_tensors over the arguments given (an optional one None is left to its own check)."""
    check_tensors(**{name: x for name, x in named.items() if x is not None})


def check_fused_gates(a, b, A_log, dt_bias) -> None:
    """The fused gates' inputs, a, b [B, T, HV] checked before (check_gdn_args): A_log, dt_bias [HV], and all four
    floating, on a's device. One check for both backends: the torch path computes g from them, and an A_log of [1]
    would broadcast there to every value head, which the kernels' per-head reads never do."""
    check_tensors(a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        if tuple(x.shape) != tuple(a.shape[-1:]):
            raise ValueError(f"{name}: expected [HV] = {tuple(a.shape[-1:])}, got {tuple(x.shape)}")
    _one_device([("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)])


def resolve_gates(g, beta, a, b, A_log, dt_bias):
    """(g, beta) as given, or fused from (a, b, A_log, dt_bias) (check_fused_gates):
    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)."""
    if g is not None:
        if beta is None:
            raise ValueError("beta: required with g")
        return g, beta
    if any(x is None for x in (a, b, A_log, dt_bias)):
        raise ValueError("gates: pass g and beta, or all of a, b, A_log and dt_bias")
    check_fused_gates(a, b, A_log, dt_bias)
    return gate_values(a, b, A=-torch.exp(A_log.float()), dt_bias=dt_bias)


def gate_values(a, b, *, A, dt_bias):
    """GDN's gates from the raw projections, float32: g = A softplus(a + dt_bias) (A = -exp(A_log)), beta =
    sigmoid(b) (the fused gates' and the model's, torch_ops.gdn_gates)."""
    return A * F.softplus(a.float() + dt_bias.float()), torch.sigmoid(b.float())


_POISON = [os.environ.get("DDSIM_POISON", "0") == "1"]


def poisoning() -> bool:
    """Whether the Triton launchers NaN-fill the outputs they allocate before their kernels write
    them (an element a kernel failed to write then fails every comparison). On in the test suites
    (the root conftest sets DDSIM_POISON=1) and in audits (``poisoned``); off otherwise: the fill is
    a launch per output, which serving engines do not pay (they allocate with torch.empty)."""
    return _POISON[0]


@contextlib.contextmanager
def poisoned(enabled: bool = True):
    """Poison (or not) the launchers' outputs inside the block."""
    before, _POISON[0] = _POISON[0], enabled
    try:
        yield
    finally:
        _POISON[0] = before


_CONSTANTS: dict = {}


def constant(kind: str, n: int, device, dtype=torch.float32) -> torch.Tensor:
    """A read-only launcher argument made once per (kind, n, device, dtype) instead of once per call:
    "slots" = arange(n) int32 (a batch's own rows), "dummy" = zeros(n) (an unused pointer argument).
    Kernels never write them. Not cached while a CUDA graph is being captured (a tensor made there is
    only filled when the graph replays)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    key = (kind, n, device, dtype)
    hit = _CONSTANTS.get(key)
    if hit is not None:
        return hit
    if kind == "slots":
        value = torch.arange(n, dtype=torch.int32, device=device)
    else:
        value = torch.zeros(n, dtype=dtype, device=device)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _CONSTANTS[key] = value
    return value


def node_state_rows(buf: torch.Tensor, rows, B: int, *, buf_name: str = "states_out",
                    rows_name: str = "states_rows") -> torch.Tensor:
    """int32 [B] rows of a caller's node-state buffer buf [N, ...] that the batch's sequences take: rows [B],
    distinct and in 0..N-1 (one host sync for device values), CheckedSlots of an N-row buffer (validated before:
    no sync, as under CUDA-graph capture), or None for rows 0..B-1 (sequence b at row b; then N must be B or
    more). Refusals name the buffer and the rows as the caller does (``buf_name``, ``rows_name``)."""
    if isinstance(rows, CheckedSlots):
        if rows.padded:  # a padded row's node states would go to row -1
            raise ValueError(f"{rows_name}: {rows.padded} padded rows (-1): every sequence's node states take a row")
        return planned_rows(rows, buf, B, rows_name, "buffer", buf_name, "rows")
    if rows is None:
        if buf.shape[0] < B:
            raise ValueError(f"{buf_name}: {buf.shape[0]} rows for {B} sequences (sequence b at row b)")
        return constant("slots", B, buf.device)
    return checked_slots(torch.as_tensor(rows), buf.shape[0], B, buf.device, rows_name).indices


def node_states_shape(buf, T: int, HV: int, K: int, V: int, device, name: str = "states_out") -> None:
    """A caller's node-state buffer [N, TS >= T, HV, K, V] (any dtype, any layout) on the inputs' device, refused
    naming ``name``."""
    if not isinstance(buf, torch.Tensor) or buf.dim() != 5 or tuple(buf.shape[2:]) != (HV, K, V) or buf.shape[1] < T:
        raise ValueError(f"{name}: expected [N, TS >= {T}, {HV}, {K}, {V}], got "
                         f"{tuple(buf.shape) if isinstance(buf, torch.Tensor) else type(buf).__name__}")
    if buf.device != torch.device(device):
        raise ValueError(f"{name}: on {buf.device}, the inputs on {device}")


def node_states_vk(buf: torch.Tensor, T: int, HV: int, K: int, V: int, device) -> bool:
    """The recurrent kernels' SNAP_VK of a caller's node-state buffer [N, TS, HV, K, V] (fp32, TS >= T, on device):
    False when contiguous, True when it is the transpose of a contiguous [N, TS, HV, V, K] one (SGLang's
    intermediate buffer, ``buf.transpose(-1, -2)``); anything else is refused."""
    node_states_shape(buf, T, HV, K, V, device)
    if buf.dtype != torch.float32:
        raise ValueError(f"states_out: expected float32 (the states the kernel reads back), got {buf.dtype}")
    return vk_layout(buf, "states_out", "a contiguous [N, TS, HV, K, V] buffer or the transpose of a contiguous "
                                        "[N, TS, HV, V, K] one")


def vk_layout(t: torch.Tensor, name: str, expected: str) -> bool:
    """Whether t [..., K, V] is the transpose of a contiguous [..., V, K] tensor (True) or contiguous itself
    (False), the two layouts the kernels address states in; any other is refused, naming ``name`` and ``expected``."""
    if t.is_contiguous():
        return False
    if t.transpose(-1, -2).is_contiguous():
        return True
    raise ValueError(f"{name}: expected {expected}, got strides {tuple(t.stride())}")


def planned_rows(checked: CheckedSlots, holder: torch.Tensor, B: int, index_name: str, kind: str, name: str,
                 rows: str) -> torch.Tensor:
    """checked's int32 [B] indices, validated before (checked_slots: no sync here), once they are seen to be of
    holder [N, ...] (a pool or a buffer, ``kind``; ``name`` with N ``rows``) for B sequences on its device."""
    idx = checked.indices
    if checked.N != holder.shape[0] or tuple(idx.shape) != (B,) or idx.device != holder.device:
        noun = "slots" if index_name == "state_indices" else "rows"
        raise ValueError(f"{index_name}: checked {noun} {tuple(idx.shape)} of a {checked.N}-row {kind} on "
                         f"{idx.device}; {name} has {holder.shape[0]} {rows} on {holder.device} for {B} sequences")
    return idx


def pool_slots(pool, state_indices, B: int, name: str, rows: str, pads: bool = False) -> torch.Tensor:
    """int32 [B] rows of pool [N, ...] holding the batch: its first B rows when state_indices is
    None (then N must be B), else state_indices [B], distinct and in 0..N-1 (checked_slots: one host
    sync), or CheckedSlots (validated before: only the pool size, shape and device here). ``pads``: the caller's
    kernels take padded rows (PAD_SLOT: CheckedSlots made with pad=True); elsewhere such slots are refused."""
    N = pool.shape[0]
    if isinstance(state_indices, CheckedSlots):
        if state_indices.padded and not pads:
            raise ValueError(f"state_indices: {state_indices.padded} padded rows (slot {PAD_SLOT}); only the GDN "
                             "verify and commit take padded rows")
        return planned_rows(state_indices, pool, B, "state_indices", "pool", name, rows)
    if state_indices is None:
        if N != B:
            raise ValueError(f"{name}: {N} {rows} for {B} sequences; pass state_indices to address a pool")
        return constant("slots", B, pool.device)
    return checked_slots(torch.as_tensor(state_indices), N, B, pool.device).indices  # the same checks, one sync


def resolve_state(initial_state, state_indices, B: int, pads: bool = False):
    """The committed states of the batch: initial_state itself, or the pool slots state_indices
    (checked as the Triton backend checks them; with ``pads`` a padded row's state is zero, as the kernels read it)."""
    if state_indices is None:
        return initial_state
    idx = pool_slots(initial_state, state_indices, B, "initial_state", "states", pads).long()
    if not getattr(state_indices, "padded", 0):
        return initial_state[idx]
    return live_rows(initial_state, idx)


def live_rows(pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """pool's rows idx [B] (int64, checked), a padded row's (-1) zero: [B, *pool.shape[1:]]."""
    live = (idx >= 0).view(-1, *[1] * (pool.dim() - 1))
    return torch.where(live, pool.index_select(0, idx.clamp(min=0)), 0.0)


def resolve_window(initial_window, state_indices, B: int):
    """The committed conv windows of the batch: initial_window itself, or its pool slots."""
    if state_indices is None:
        return initial_window
    return initial_window[pool_slots(initial_window, state_indices, B, "initial_window", "windows").long()]


def write_slots(pool, state_indices, B: int, new: torch.Tensor, name: str, rows: str, pads: bool = False):
    """In-place commit: ``new`` [B, ...] into pool's slots (its first B rows without state_indices);
    returns the pool. Slots outside the batch are not touched, nor, with ``pads``, any for a padded row."""
    idx = pool_slots(pool, state_indices, B, name, rows, pads).long()
    live = idx >= 0
    pool[idx[live]] = new[live].to(pool.dtype)
    return pool


def conv_table(parents, src: torch.Tensor, W: int, mode: str) -> torch.Tensor:
    """int32 [B, T, W] conv source table: a TreePlan's cached one, or built from ``src``."""
    if isinstance(parents, TreePlan):
        return parents.conv_table(mode, W)
    return conv_sources(src, W).to(torch.int32).contiguous()


def conv_sources(src: torch.Tensor, W: int) -> torch.Tensor:
    """[B, T, W] indices into cat(window [W-1], nodes [T]) of each node's inputs, oldest first.

    Lag l walks l steps up the source chain; past the root it continues into the committed window
    (newest at W-2).
    """
    B, T = src.shape
    cur = torch.arange(T, device=src.device).expand(B, T).clone()  # node at current lag, or <0
    over = torch.zeros(B, T, dtype=torch.long, device=src.device)  # steps taken past the root
    cols = [cur + (W - 1)]
    for _ in range(1, W):
        inside = cur >= 0
        nxt = torch.where(inside, src.gather(1, cur.clamp(min=0)), cur)
        over = torch.where(inside & (nxt >= 0), over, over + 1)
        cur = torch.where(inside, nxt, cur)
        cols.append(torch.where(cur >= 0, cur + (W - 1), (W - 1) - over))
    return torch.stack(cols[::-1], dim=-1)


def check_conv(x, weight, initial_window, parents, mode, activation, *, pooled: bool, bias=None):
    """Shapes of x [B, T, C], weight [C, W], bias [C] or None and the committed windows ([B, C, W-1], or a pool
    [N, C, W-1] when pooled), each floating and on x's device, the activation and the mode -> (B, T, C, W, source
    parents [B, T]). A bias of [1] would be broadcast by torch and read past its end by the kernel."""
    named = dict(x=x, weight=weight, initial_window=initial_window, **({} if bias is None else {"bias": bias}))
    check_tensors(**named)
    if x.dim() != 3:
        raise ValueError(f"x: expected [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    if weight.dim() != 2 or weight.shape[0] != C:
        raise ValueError(f"weight: expected [C, W] with C={C}, got {tuple(weight.shape)}")
    W = weight.shape[1]
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"bias: expected [C] = ({C},), got {tuple(bias.shape)}")
    lead = initial_window.shape[0] if pooled and initial_window.dim() == 3 else B
    if tuple(initial_window.shape) != (lead, C, W - 1):
        want = f"[N, C, W-1] = [N, {C}, {W - 1}]" if pooled else f"[B, C, W-1] = {(B, C, W - 1)}"
        raise ValueError(f"initial_window: expected {want}, got {tuple(initial_window.shape)}")
    _one_device(list(named.items()))
    if activation not in ("silu", None):
        raise ValueError(f"activation: expected 'silu' or None, got {activation!r}")
    return B, T, C, W, source_parents(parents, B, T, x.device, mode)


def check_conv_commit(x, initial_window, *, pooled: bool) -> tuple[int, int, int, int]:
    """A conv commit's x [B, T, C] and committed windows ([B, C, W-1], or a pool [N, C, W-1] when pooled), floating,
    on one device -> (B, T, C, W)."""
    check_tensors(x=x, initial_window=initial_window)
    if x.dim() != 3:
        raise ValueError(f"x: expected [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    if initial_window.dim() != 3 or initial_window.shape[1] != C or not (pooled or initial_window.shape[0] == B):
        raise ValueError(f"initial_window: expected [{'N' if pooled else B}, C, W-1] with C={C}, "
                         f"got {tuple(initial_window.shape)}")
    _one_device([("x", x), ("initial_window", initial_window)])
    return B, T, C, initial_window.shape[2] + 1


# ---- Mamba2 ------------------------------------------------------------------------------------
def check_mamba2(x, dt, A, B, C, D=None, dt_bias=None, dt_limit=(0.0, float("inf"))):
    """Shapes and dtypes of x [B, T, H, P], dt [B, T, H], A [H], B and C [B, T, G, N] (C may be None
    for a commit), D and dt_bias [H] or None, dt_limit (lo, hi) -> (B, T, H, P, G, N)."""
    check_given(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias)
    if x.dim() != 4:
        raise ValueError(f"x: expected [B, T, H, P], got {tuple(x.shape)}")
    Bn, T, H, P = x.shape
    if B.dim() != 4 or tuple(B.shape[:2]) != (Bn, T):
        raise ValueError(f"B: expected [B, T, G, N] with B={Bn}, T={T}, got {tuple(B.shape)}")
    G, N = B.shape[2], B.shape[3]
    if H % G:
        raise ValueError(f"B: H={H} heads is not a multiple of G={G} groups")
    want = {"dt": (Bn, T, H), "A": (H,), "C": tuple(B.shape), "D": (H,), "dt_bias": (H,)}
    for name, t in (("dt", dt), ("A", A), ("C", C), ("D", D), ("dt_bias", dt_bias)):
        if t is None:
            if name in ("dt", "A"):
                raise ValueError(f"{name}: required")
            continue
        if tuple(t.shape) != want[name]:
            raise ValueError(f"{name}: expected {list(want[name])}, got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: on {t.device}, x is on {x.device}")
    for name, t in (("x", x), ("B", B)):
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
    if B.device != x.device:
        raise ValueError(f"B: on {B.device}, x is on {x.device}")
    lo, hi = (float(v) for v in dt_limit)
    if not 0.0 <= lo <= hi:
        raise ValueError(f"dt_limit: expected 0 <= lo <= hi, got {tuple(dt_limit)}")
    return Bn, T, H, P, G, N


def check_mamba2_state(initial_state, state_indices, Bn, H, P, N):
    """The committed SSM states: [B, H, P, N], or a pool [N_slots, H, P, N] with state_indices [B]."""
    check_tensors(initial_state=initial_state)
    if initial_state.dim() != 4 or tuple(initial_state.shape[1:]) != (H, P, N):
        raise ValueError(f"initial_state: expected [B or slots, H, P, N] with H, P, N = {(H, P, N)}, got "
                         f"{tuple(initial_state.shape)}")
    if initial_state.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"initial_state: expected float32 (or float64), got {initial_state.dtype}")
    return pool_slots(initial_state, state_indices, Bn, "initial_state", "states")


def mamba2_dt(dt, dt_bias, dt_softplus: bool, dt_limit, dtype) -> torch.Tensor:
    """[B, T, H] discretisation steps: clamp(softplus(dt + dt_bias), *dt_limit) in ``dtype``."""
    d = dt.to(dtype)
    if dt_bias is not None:
        d = d + dt_bias.to(dtype)
    if dt_softplus:
        d = F.softplus(d)
    lo, hi = (float(v) for v in dt_limit)
    if lo > 0.0 or hi < float("inf"):
        d = d.clamp(min=lo, max=hi)
    return d


def ancestor_mask(src: torch.Tensor) -> tuple[torch.Tensor, int]:
    """src [B, T] source parents -> (int8 [B, T, T] ancestor-or-self mask, max depth)."""
    B, T = src.shape
    dev = src.device
    mask = torch.zeros(B, T, T, dtype=torch.int8, device=dev)
    cur = torch.arange(T, device=dev).expand(B, T).clone()
    bidx = torch.arange(B, device=dev)[:, None]
    tidx = torch.arange(T, device=dev)[None, :].expand(B, T)
    depth = 0
    while True:
        live = cur >= 0
        if not live.any():
            break
        mask[bidx.expand(B, T)[live], tidx[live], cur[live]] = 1
        cur = torch.where(live, src.gather(1, cur.clamp(min=0)), cur)
        depth += 1
    return mask.contiguous(), depth - 1


def check_mamba1(x, dt, A, B, C, D=None, dt_bias=None, initial_state=None):
    """Shapes, dtypes and devices of a Mamba1 selective scan's inputs: x [B, T, I], dt [B, T, I], A [I, N],
    B and C [B, T, N] (C may be None for a commit), D and dt_bias [I] or None, initial_state [B, I, N]
    -> (B, T, I, N)."""
    check_given(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, initial_state=initial_state)
    if x.dim() != 3:
        raise ValueError(f"x: expected [B, T, I], got {tuple(x.shape)}")
    Bn, T, I = x.shape
    if A is None or A.dim() != 2 or A.shape[0] != I:
        raise ValueError(f"A: expected [I, N] with I={I}, got {None if A is None else tuple(A.shape)}")
    N = A.shape[1]
    want = {"dt": (Bn, T, I), "B": (Bn, T, N), "C": (Bn, T, N), "D": (I,), "dt_bias": (I,), "initial_state": (Bn, I, N)}
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("dt_bias", dt_bias),
                    ("initial_state", initial_state)):
        if t is None:
            if name in ("dt", "B", "initial_state"):
                raise ValueError(f"{name}: required")
            continue
        if name in want and tuple(t.shape) != want[name]:
            raise ValueError(f"{name}: expected {list(want[name])}, got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: on {t.device}, x is on {x.device}")
    return Bn, T, I, N


def mamba1_dt(dt, dt_bias, dt_softplus: bool, dtype) -> torch.Tensor:
    """[B, T, I] discretisation steps: softplus(dt + dt_bias) in ``dtype``."""
    d = dt.to(dtype)
    if dt_bias is not None:
        d = d + dt_bias.to(dtype)
    return F.softplus(d) if dt_softplus else d


def _queries_and_keys(q, k):
    """q and k [B, T, H, K] each, or k alone (q None: a commit) -> (B, T, H, K)."""
    check_given(q=q, k=k)
    if q is None:
        if k.dim() != 4:
            raise ValueError(f"k: expected [B, T, H, K], got {tuple(k.shape)}")
    elif q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q, k: expected [B, T, H, K] each, got {tuple(q.shape)} and {tuple(k.shape)}")
    return k.shape


def _one_device(named):
    """Every (name, tensor) of ``named`` floating and on the first's device."""
    first, x = named[0]
    for name, t in named:
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: on {t.device}, {first} is on {x.device}")


def check_lightning(q, k, v, decay, initial_state):
    """Shapes, dtypes and devices of a lightning-attention layer's inputs: q, k [B, T, H, K] (q None for a commit),
    v [B, T, H, V], decay [H], initial_state [B, H, K, V] -> (B, T, H, K, V)."""
    check_given(v=v, decay=decay, initial_state=initial_state)
    Bn, T, H, K = _queries_and_keys(q, k)
    if v.dim() != 4 or tuple(v.shape[:3]) != (Bn, T, H):
        raise ValueError(f"v: expected [B, T, H, V] with {(Bn, T, H)}, got {tuple(v.shape)}")
    V = v.shape[3]
    for name, t, want in (("decay", decay, (H,)), ("initial_state", initial_state, (Bn, H, K, V))):
        if t is None or tuple(t.shape) != want:
            raise ValueError(f"{name}: expected {list(want)}, got {None if t is None else tuple(t.shape)}")
    _one_device([(n, t) for n, t in (("q", q), ("k", k), ("v", v), ("decay", decay), ("initial_state", initial_state))
                 if t is not None])
    return Bn, T, H, K, V


def check_kda(q, k, v, g, beta, initial_state):
    """Shapes, dtypes and devices of a KDA layer's inputs: q, k [B, T, H, K] (q None for a commit), v [B, T, H, V],
    g [B, T, H, K], beta [B, T, H], initial_state [B, H, K, V] -> (B, T, H, K, V)."""
    check_given(v=v, g=g, beta=beta, initial_state=initial_state)
    Bn, T, H, K = _queries_and_keys(q, k)
    if v.dim() != 4 or tuple(v.shape[:3]) != (Bn, T, H):
        raise ValueError(f"v: expected [B, T, H, V] with {(Bn, T, H)}, got {tuple(v.shape)}")
    V = v.shape[3]
    for name, t, want in (("g", g, (Bn, T, H, K)), ("beta", beta, (Bn, T, H)), ("initial_state", initial_state, (Bn, H, K, V))):
        if t is None or tuple(t.shape) != want:
            raise ValueError(f"{name}: expected {list(want)}, got {None if t is None else tuple(t.shape)}")
    _one_device([(n, t) for n, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta),
                                     ("initial_state", initial_state)) if t is not None])
    return Bn, T, H, K, V


def check_prefix_rows(prefix_rows) -> None:
    """Tree attention's prefix_rows: None, or an integer tensor of one element (a device scalar: no host sync to read it)."""
    if prefix_rows is not None and (not isinstance(prefix_rows, torch.Tensor) or prefix_rows.numel() != 1
                                    or prefix_rows.dtype not in (torch.int32, torch.int64)):
        got = (f"{prefix_rows.dtype} {tuple(prefix_rows.shape)}" if isinstance(prefix_rows, torch.Tensor)
               else type(prefix_rows).__name__)
        raise ValueError(f"prefix_rows: expected an int32 or int64 tensor of one element, got {got}")


def check_ancestor_mask(mask: torch.Tensor, T: int, P: int) -> None:
    """Tree attention's ancestor_mask: bool [T, T] (every prefix row attended) or [T, P + T], refused in one line
    otherwise. A float mask is not taken as 0/1: SDPA would add it to the scores, and every node would see every
    other."""
    if mask.dtype != torch.bool or tuple(mask.shape) not in ((T, T), (T, P + T)):
        raise ValueError(f"ancestor_mask: expected bool [T, T] or [T, P + T] = {(T, P + T)}, got {mask.dtype} "
                         f"{tuple(mask.shape)}")
