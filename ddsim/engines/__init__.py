"""Serving engines, and what checks them against the oracle. This package holds the adapters that put
engines' kernels behind ddsim's kernel contract (below), `ddsim check-kernel` (check_kernel, its explicit
serving examples kernel_cases, triton_interpret for Triton's interpreter on the CPU), and the
verify-step dump an engine writes with `ddsim replay` over it (dump, replay, replay_verdict,
replay_report).

Serving engines' GDN tree-verify kernels behind ddsim's kernel contract, one small adapter per
engine (the core never imports an engine; each adapter translates layouts and flags at the edge).

The contract every adapter meets (shapes as in the README, Contracts: kernel interface):
    verify(q, k, v, g, beta, *, parents, state_pool, slots, mode, scale) -> o [B, T, HV, V]
with q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV] (g in log space), parents [B, T],
state_pool [N, HV, K, V] holding sequence b's committed state in slot slots[b] (slots [B]
int32; a verify reads the pool, never writes it). The pool is float32, or a server's 16-bit state cache
(kernel_cases.STATE_DTYPES), and may be one layer of a slot-major pool, its slots stride(0) apart
(kernel_cases.SLOT_MAJOR); a per-node state buffer is in the pool's dtype. ``mode`` is one of the adapter's ``modes``; an
adapter refuses the others in one line. For the ops in the adapter's ``pads`` (conventions whose engines pad a
CUDA-graph batch: SGLang's, vLLM's), slots[b] = -1 marks a padded row: no slot is written for it, and its output is
the engine's own.

For the (op, mode) pairs in the adapter's ``node_states`` (an engine that keeps every node's state for its commit, as
SGLang's exact verify fills ``intermediate_states_buffer``, from which its commit copies the accepted node's state,
its conv ``intermediate_conv_window``, and vLLM's spec decode writes a state per token), the call also takes
``node_states=(buffer, rows)``: buffer [M, P, ...] float32 (the conv: its window pool's dtype), NaN, in ddsim's state
layout of the op (GDN [HV, K, V], KDA [H, K, V], Mamba2 [H, P, N], the conv's window [C, W-1]), P >= T steps a row
(its pitch: a buffer sized for the longest draft), and rows [B] int32, sequence b's row. The call writes node t's
state (after node t, along its path for exact, in batch order for leaky) into buffer[rows[b], t] and nothing else
in the buffer; a padded row's buffer row is the engine's own.

An engine whose commit copies the accepted node's kept state into the pool (SGLang's fused_mamba_state_scatter_with_mask
for the SSM states, fused_conv_window_scatter_with_mask for the conv's windows, after a verify) offers it as
    commit(op, *, pool, buffer, slots, rows, accepted) -> None
for each op in its ``commit_ops``, with every layer at once, as an engine commits: pool [L, N, *state] and buffer
[L, M, P, *state] in the op's state layout and its pool's dtype (as node_states' buffer, a layer axis first), slots,
rows [B] int32 as the verify's, accepted [B] int32 the index of sequence b's last accepted node (-1: nothing to
commit, as SGLang marks a request that has none). For every layer l and every b with accepted[b] >= 0 and
slots[b] >= 0 it copies buffer[l, rows[b], accepted[b]] into pool[l, slots[b]], bit for bit, and writes nothing else
(the buffer is only read).

An engine with a tree causal conv offers it as
    conv(x, *, weight, bias, parents, window_pool, slots, mode, activation) -> out [B, T, C]
with x [B, T, C], weight [C, W], bias [C] or None, window_pool [N, C, W-1] (sequence b's committed
window, oldest first, in slot slots[b]), activation "silu" or None. A conv whose exact mode also fills the parent
table its engine's verifies read (conv_parents: SGLang's) takes parents_out= [B, T] int32 and writes sequence b's
node t's parent at [b, t] (the root's entry is its own).

An engine with a Mamba2 tree verify (the SSM of a Nemotron-H / Falcon-H1 layer) offers it as
    mamba2(x, dt, A, B, C, *, D, dt_bias, parents, state_pool, slots, mode) -> y [B, T, H, P]
with x [B, T, H, P], raw dt [B, T, H] (softplus(dt + dt_bias) is the step; no dt limit), A [H] < 0,
B, C [B, T, G, N], D and dt_bias [H], state_pool [N, H, P, N] (read, never written).

An engine with a Kimi Delta Attention (KDA) verify (Kimi Linear's recurrent layer) offers it as
    kda(q, k, v, g, beta, *, parents, state_pool, slots, mode) -> o [B, T, H, V]
with q, k [B, T, H, K] (L2-normalised in the kernel, q scaled by K^-1/2), v [B, T, H, V], g [B, T, H, K] the log
decay per key channel, beta [B, T, H], state_pool [N, H, K, V] (read, never written).

An engine with a lightning-attention verify (MiniMax's linear attention with a constant decay per head) offers it as
    lightning(q, k, v, *, decay, parents, state_pool, slots, mode) -> o [B, T, H, V]
with q, k [B, T, H, K] (no scale, no norm), v [B, T, H, V], decay [H] in (0, 1] (S_t = decay S_{t-1} + k_t v_t^T,
o_t = S_t^T q_t), state_pool [N, H, K, V] (read, never written).

    load("ddsim")                 ddsim's own fast path (exact and leaky)
    load("fla")                   flash-linear-attention's fused_recurrent_gated_delta_rule, and its
                                  fused_recurrent_kda for KDA and fused_recurrent_simple_gla for
                                  lightning attention (leaky only: they take no tree, so on a tree
                                  they are the flattened path)
    load("sglang")                SGLang's fused_sigmoid_gating_delta_rule_update (exact with
                                  retrieve_parent_token, leaky without)
    load("vllm")                  vLLM's fused_sigmoid_gating_delta_rule_update on its spec-decode
                                  path (per-token state slots; no tree: leaky only)
    load("pkg.module:function", convention="ddsim" | "sglang" | "vllm" | "fla")
                                  anything else with one of those calling conventions
    load(..., commit="pkg.module:function")
                                  the kernel with that commit in SGLang's convention (its
                                  fused_mamba_state_scatter_with_mask signature) in place of its own
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from ddsim.errors import InputError, NotInstalled

CONVENTIONS = ("ddsim", "sglang", "vllm", "fla")
# the ops an engine may offer beside its GDN verify (each its own fields below), as a refusal names them
OPS = {"conv": "tree causal conv", "mamba2": "Mamba2 tree verify", "kda": "KDA verify",
       "lightning": "lightning-attention verify"}


@dataclass(frozen=True)
class EngineKernel:
    name: str  # what reports and tables call it
    modes: tuple[str, ...]  # the verify modes it offers
    verify: Callable  # the contract above
    package: str | None = None  # distribution it came from, with its version
    version: str | None = None
    source: str | None = None  # the file the kernel lives in
    source_sha256: str | None = field(default=None)
    # ((path, sha256), ...): the files of its package the kernel's code comes from, its own among them (its module's
    # import statements followed, ddsim.engines.sources.kernel_sources); what a report binds the kernel by
    sources: tuple[tuple[str, str], ...] = ()
    # the engine's tree causal conv, where it has one (contract below), and what its verify writes
    conv: Callable | None = None
    conv_name: str | None = None
    conv_modes: tuple[str, ...] = ("exact", "leaky")
    conv_widths: tuple[int, ...] = (2, 3, 4, 5)  # the kernel widths it supports
    conv_writes_slot: str | None = None  # None: reads the window pool only; "flattened window": rewrites the slot
    # the conv's exact mode also writes the tree's parent table its engine's verifies then read (SGLang's
    # causal_conv1d_update fills retrieve_parent_token from retrieve_next_token and retrieve_next_sibling): the
    # contract's parents_out, which check-kernel holds to the tree's parents
    conv_parents: bool = False
    conv_source: str | None = None
    conv_source_sha256: str | None = None
    conv_sources: tuple[tuple[str, str], ...] = ()  # the files its module reaches, as sources
    # the engine's Mamba2 tree verify, where it has one (contract above)
    mamba2: Callable | None = None
    mamba2_name: str | None = None
    mamba2_modes: tuple[str, ...] = ("exact", "leaky")
    mamba2_source: str | None = None
    mamba2_source_sha256: str | None = None
    mamba2_sources: tuple[tuple[str, str], ...] = ()  # the files its module reaches, as sources
    # the engine's KDA verify, where it has one (contract above)
    kda: Callable | None = None
    kda_name: str | None = None
    kda_modes: tuple[str, ...] = ("exact", "leaky")
    kda_source: str | None = None
    kda_source_sha256: str | None = None
    kda_sources: tuple[tuple[str, str], ...] = ()  # the files its module reaches, as sources
    # the engine's lightning-attention verify, where it has one (contract above)
    lightning: Callable | None = None
    lightning_name: str | None = None
    lightning_modes: tuple[str, ...] = ("exact", "leaky")
    lightning_source: str | None = None
    lightning_source_sha256: str | None = None
    lightning_sources: tuple[tuple[str, str], ...] = ()  # the files its module reaches, as sources
    # the ops ("gdn" for the verify) whose calling convention pads a CUDA-graph batch with slot -1 (SGLang's and
    # vLLM's PAD_SLOT_ID): a padded row's state is neither read nor written, and check-kernel runs padded batches
    pads: tuple[str, ...] = ()
    # the (op, mode) pairs whose call writes every node's state into a per-node state buffer (the contract's
    # node_states): check-kernel gives one and holds each node's state to the oracle's
    node_states: tuple[tuple[str, str], ...] = ()
    # the commit that copies the accepted node's kept state into the pool (contract above), for the ops in commit_ops:
    # check-kernel runs it after every verify that keeps node states and holds the pool to the oracle's
    commit: Callable | None = None
    commit_name: str | None = None
    commit_ops: tuple[str, ...] = ()
    commit_source: str | None = None
    commit_source_sha256: str | None = None
    commit_sources: tuple[tuple[str, str], ...] = ()  # the files its module reaches, as sources

    def check_op(self, op: str, mode: str) -> None:
        """``--op op --mode mode`` on this kernel (any op not in OPS: the GDN verify): one line naming the op it lacks
        or the modes it offers."""
        if op in OPS:
            fn, name, modes = getattr(self, op), getattr(self, f"{op}_name"), getattr(self, f"{op}_modes")
            if fn is None:
                raise InputError(f"--op {op}: {self.name} has no {OPS[op]}")
        else:
            name, modes = self.name, self.modes
        refuse_mode(name, modes, mode)

    def commits(self, op: str, mode: str) -> bool:
        """Whether check-kernel runs this kernel's commit after its verify of ``op`` in ``mode``: it keeps the node states
        there and has a commit for the op."""
        return self.commit is not None and op in self.commit_ops and (op, mode) in self.node_states

    def provenance(self) -> dict:
        """What a report records about the kernel (ddsim.verdict.report_model.EngineRecord)."""
        return {"name": self.name, "modes": list(self.modes), "package": self.package, "version": self.version,
                "source": self.source, "source_sha256": self.source_sha256, "sources": dict(self.sources)}


def refuse_mode(name: str, modes: tuple, mode: str) -> None:
    """``--mode mode`` of the kernel ``name`` that offers ``modes``: one InputError line where it is not one."""
    if mode not in modes:
        raise InputError(f"--mode {mode}: {name} offers only {', '.join(modes)}"
                         + (" (it takes no tree: on a tree it is the flattened path)" if tuple(modes) == ("leaky",) else ""))


def fused_gates(g, beta):
    """(a, b) float32 such that an engine's fused gating with A_log = dt_bias = 0 gives back g and beta:
    -softplus(a) = g (softplus threshold 20) and sigmoid(b) = beta (beta kept 1e-7 inside (0, 1))."""
    import torch
    neg_g = (-g.float()).clamp_min(1e-30)
    a = torch.where(neg_g > 20.0, neg_g, torch.log(torch.expm1(neg_g)))
    return a.contiguous(), torch.logit(beta.float().clamp(1e-7, 1 - 1e-7)).contiguous()


# the bits check-kernel fills the slot before and the slot after a pool with (guarded_like), by element
# size: a NaN in float32, and in both bf16 and fp16, that no arithmetic makes
GUARD = {2: 0x7FA5, 4: 0x7FC5A5A5, 8: 0x7FF8A5A5A5A5A5A5}


def _bits(t):
    """The tensor's bit pattern (so NaN slots compare equal to themselves): a view where t is contiguous."""
    import torch
    size = t.element_size()
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def beside(pool):
    """(the slot before, the slot after) a contiguous pool [N, ...] in its storage: check-kernel's guard slots, which
    a kernel that takes slot -1 as an address offset, or writes slot N, changes. None where the storage has no room
    for them (a pool check-kernel did not make)."""
    n = pool[0].numel()
    off = pool.storage_offset()
    if not pool.is_contiguous() or off < n or (off + (pool.shape[0] + 1) * n) * pool.element_size() > \
            pool.untyped_storage().nbytes():
        return None
    full = pool.as_strided((pool.shape[0] + 2, *pool.shape[1:]), pool.stride(), off - n)
    return full[0], full[-1]


def guarded_empty(shape: tuple, dtype, device):
    """An uninitialised contiguous tensor of ``shape`` [N, ...] inside guard slots (GUARD's bits) in its storage: the
    slot before and the slot after it (beside)."""
    import torch
    backing = torch.empty((shape[0] + 2, *shape[1:]), dtype=dtype, device=device)
    for end in (backing[0], backing[-1]):
        _bits(end).fill_(GUARD[backing.element_size()])  # a view: the slot is contiguous
    out = backing[1:-1]
    out._ddsim_guarded = True  # reflect_writes reads its guards
    return out


def guarded_like(pool):
    """A contiguous copy of pool inside guard slots (GUARD's bits), for an adapter that hands its engine a copy in
    the engine's layout: reflect_writes carries a write to its guards to the caller's."""
    out = guarded_empty(tuple(pool.shape), pool.dtype, pool.device)
    out.copy_(pool)
    return out


def slot_major_like(pool, layer: int, layers: int):
    """A copy of pool [N, ...] as layer ``layer`` of a slot-major pool of ``layers`` layers (a server's unified state
    pool, SGLang's page-major one: each slot's entries of every layer side by side): its storage [N, layers, ...] inside
    guard slots, the other layers' entries NaN, and the view [N, ...] returned, each slot ``layers`` entries after the
    one before (its stride(0)). slot_major_whole gives the whole."""
    whole = guarded_empty((pool.shape[0], layers, *pool.shape[1:]), pool.dtype, pool.device)
    whole.fill_(float("nan"))
    whole[:, layer] = pool
    return whole[:, layer]


def slot_major_whole(pool):
    """The whole slot-major pool [N, layers, ...] that slot_major_like's view ``pool`` is a layer of (None where pool
    is laid out otherwise: its slots one entry after another). Read from the strides alone: any pool whose stride(0) is
    a multiple of its entry reads so (a slice of every other slot too); check-kernel hands kernels only pools it
    built."""
    entry = pool[0].numel() if pool.shape[0] else 0
    if pool.dim() < 2 or pool.shape[0] < 1 or pool.stride(0) == entry or pool.stride(0) % entry:
        return None
    layers = pool.stride(0) // entry
    start = pool.storage_offset() - pool.storage_offset() % pool.stride(0)
    return pool.as_strided((pool.shape[0], layers, *pool.shape[1:]),
                           (pool.stride(0), entry, *pool.stride()[1:]), start)


def slot_major_layer(pool) -> int:
    """The layer of its slot-major pool that ``pool`` is (slot_major_whole: its place within a slot's pitch)."""
    return (pool.storage_offset() % pool.stride(0)) // pool[0].numel()


def carry_other_layers(mine, whole, layer: int) -> None:
    """Every entry of a layer other than ``layer`` that differs bitwise between an engine's copy ``mine`` [N, layers,
    ...] (any entry shape of the same size) and the caller's slot-major pool ``whole`` [N, layers, ...], copied into
    ``whole``: the caller's properties then see a write to another layer's state."""
    N = whole.shape[0]
    for l in range(whole.shape[1]):
        if l == layer:
            continue
        theirs = mine[:, l].reshape(N, -1)
        wrote = (_bits(theirs) != _bits(whole[:, l].reshape(N, -1))).any(-1)
        if wrote.any():
            whole[wrote, l] = theirs[wrote].view(-1, *whole.shape[2:])


def pitched_like(engine_view, caller):
    """engine_view (the caller's pool in an engine's own layout, e.g. its last two axes swapped) as a copy laid out as
    the caller's is: where the caller's pool is a layer of a slot-major pool (slot_major_whole), the copy is one too,
    at the same slot pitch and place in it, the other layers' entries copied, guard slots beside; else guarded_like.
    reflect_pitched carries the engine's writes back."""
    whole = slot_major_whole(caller)
    if whole is None:
        return guarded_like(engine_view)
    N, layers = whole.shape[:2]
    backing = guarded_empty(tuple(whole.shape), whole.dtype, whole.device)
    backing.copy_(whole)
    entry, at = caller[0].numel(), slot_major_layer(caller)
    contiguous = [1]
    for n in reversed(engine_view.shape[2:]):
        contiguous.insert(0, contiguous[0] * n)
    out = backing.as_strided(tuple(engine_view.shape), (caller.stride(0), *contiguous),
                             backing.storage_offset() + at * entry)
    out.copy_(engine_view)
    out._ddsim_whole = backing  # reflect_pitched reads the other layers' entries through it (in the caller's layout)
    return out


def reflect_pitched(engine_copy, caller, *, transposed: bool = True) -> None:
    """reflect_writes for a copy pitched_like made: the caller's layer as reflect_writes carries it, and any write to
    another layer's entries (bitwise, in the engine's copy of the whole) copied into the caller's whole pool."""
    reflect_writes(engine_copy, caller, transposed=transposed)
    backing = getattr(engine_copy, "_ddsim_whole", None)
    if backing is None:
        return
    whole = slot_major_whole(caller)
    carry_other_layers(backing, whole, slot_major_layer(caller))
    ends, theirs = beside(backing), beside(whole)
    if ends is not None and theirs is not None:
        for end, their in zip(ends, theirs):
            if (_bits(end) != GUARD[end.element_size()]).any():
                their.copy_(end)


# the most a reflect_writes comparison holds at once (bytes of each side): a buffer of several GB is compared in chunks
REFLECT_CHUNK = 1 << 28


def reflect_writes(engine_copy, caller, *, transposed: bool = True) -> None:
    """Copy back into the caller's tensor [N, ..., K, V] (a state pool, a per-node state buffer) every slot or row the
    engine wrote in its own copy of it, engine_copy [N, ..., V, K] (the same layout where not ``transposed``),
    compared bitwise with the caller's (unchanged until now; NaN entries count as unchanged), in chunks of at most
    REFLECT_CHUNK bytes, so no second copy of a buffer of several GB is made: the caller's properties then check the
    engine's own writes. A copy made by guarded_like has its guard slots' writes carried to the caller's guard slots
    (where it has them) the same way."""
    def back(t):
        return t.transpose(-1, -2) if transposed else t
    step = max(1, REFLECT_CHUNK // max(1, engine_copy[0].numel() * engine_copy.element_size()))
    for i in range(0, engine_copy.shape[0], step):
        mine, theirs = engine_copy[i:i + step], caller[i:i + step]
        wrote = (_bits(mine) != _bits(back(theirs))).flatten(1).any(-1)  # [rows of the chunk]
        if wrote.any():
            theirs[wrote] = back(mine[wrote])
    ends, theirs = beside(engine_copy), beside(caller)
    if getattr(engine_copy, "_ddsim_guarded", False) and ends is not None and theirs is not None:
        for end, their in zip(ends, theirs):
            if (_bits(end) != GUARD[end.element_size()]).any():
                their.copy_(back(end))


def _source_of(fn) -> tuple[str | None, str | None]:
    """The file ``fn`` is defined in and its sha256 (None, None where it has none)."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        return None, None
    if not path:
        return None, None
    from ddsim.digest import file_digest
    return path, file_digest(path)


def _bound(fn) -> tuple[str | None, str | None, tuple[tuple[str, str], ...]]:
    """What binds the function ``fn``: its file, that file's sha256 (_source_of) and the files of its package its module
    reaches with theirs (sources.kernel_sources); EngineKernel's source, source_sha256 and sources, in that order."""
    from ddsim.engines.sources import kernel_sources
    return (*_source_of(fn), kernel_sources(fn))


def _op_source(op: str, fn) -> dict:
    """The EngineKernel fields that bind ``op``'s function ``fn`` (_bound): ``{op}_source``, ``{op}_source_sha256`` and
    ``{op}_sources``."""
    src, digest, sources = _bound(fn)
    return {f"{op}_source": src, f"{op}_source_sha256": digest, f"{op}_sources": sources}


def _version(dist: str) -> str | None:
    """The installed distribution's version, else the package's own ``<dist>.version.__version__`` or
    ``<dist>.__version__`` (a kernel module taken from a wheel without its metadata, or a checkout on the path),
    else None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        pass
    for module in (f"{dist}.version", dist):
        try:
            return str(importlib.import_module(module).__version__)
        except (ImportError, AttributeError):
            continue
    return None


def _import_behind_installed(module: str):
    """Import ``module`` with the working directory searched last: a serving repo's own module is found
    from its checkout, but a file there never shadows an installed package (torch, ddsim, an engine).
    Modules already imported stay what they are."""
    cwd = {"", ".", os.getcwd()}
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p not in cwd] + [os.getcwd()]
    try:
        return importlib.import_module(module)
    finally:
        sys.path[:] = saved


def import_function(impl: str, flag: str = "--impl"):
    """MODULE:FUNCTION -> the callable (imported with the working directory searched last); a module that
    does not import, a missing name or something not callable is one InputError naming ``flag`` and ``impl``."""
    module, sep, name = impl.partition(":")
    if not sep or not module or not name:
        raise InputError(f"{flag} {impl}: expected MODULE:FUNCTION")
    try:
        fn = getattr(_import_behind_installed(module), name)
    except ModuleNotFoundError as e:
        raise InputError(f"{flag} {impl}: cannot import {e.name!r}") from None
    except AttributeError:
        raise InputError(f"{flag} {impl}: module {module!r} has no {name!r}") from None
    if not callable(fn):
        raise InputError(f"{flag} {impl}: {name!r} is not callable")
    return fn


def load(impl: str, *, convention: str | None = None, commit: str | None = None, flag: str = "--impl") -> EngineKernel:
    """The adapter for ``impl``; a missing engine package is one InputError naming it, after ``flag``, the option that
    named the engine (check-kernel's --impl, an audit's --fast-path). ``commit`` (MODULE:FUNCTION in SGLang's
    convention, sglang.as_commit_contract) replaces the kernel's own commit, for every op whose node states it keeps; a
    kernel that keeps none is refused in one line."""
    try:
        kernel = _adapter(impl, convention, flag)
    except NotInstalled as e:
        raise InputError(f"{flag} {impl}: {e}") from None
    if commit is None:
        return kernel
    from dataclasses import replace

    from ddsim.engines import sglang
    fn = import_function(commit, "--commit")
    ops = tuple(dict.fromkeys(op for op, _ in kernel.node_states))
    if not ops:
        raise InputError(f"--commit {commit}: {kernel.name} keeps no node states for a commit to copy")
    return replace(kernel, commit=sglang.as_commit_contract(fn), commit_name=commit, commit_ops=ops,
                   **_op_source("commit", fn))


def _adapter(impl: str, convention: str | None, flag: str) -> EngineKernel:
    if impl in ("ddsim", "fla", "sglang", "vllm") and convention is not None:  # an adapter has its own: never ignored
        raise InputError(f"--convention: only with a MODULE:FUNCTION {flag} ({impl}'s adapter has its own)")
    if impl == "ddsim":
        from ddsim.engines import ddsim_kernels
        return ddsim_kernels.adapter()
    if impl == "fla":
        from ddsim.engines import fla
        return fla.adapter()
    if impl == "sglang":
        from ddsim.engines import sglang
        return sglang.adapter()
    if impl == "vllm":
        from ddsim.engines import vllm
        return vllm.adapter()
    if ":" not in impl:
        raise InputError(f"{flag} {impl}: expected ddsim, fla, sglang, vllm or MODULE:FUNCTION")
    module = impl.partition(":")[0]
    if convention not in CONVENTIONS:
        raise InputError(f"--convention: MODULE:FUNCTION needs one of {', '.join(CONVENTIONS)}, got {convention!r}")
    fn = import_function(impl, flag)
    src, digest, sources = _bound(fn)
    top = module.split(".")[0]
    from ddsim.engines import ddsim_kernels, fla, sglang, vllm
    wrap, modes = {"ddsim": (ddsim_kernels.as_contract, ("exact", "leaky")),
                   "sglang": (sglang.as_contract, ("exact", "leaky")),
                   "vllm": (vllm.as_contract, ("leaky",)), "fla": (fla.as_contract, ("leaky",))}[convention]
    # the same function as a tree conv (`check-kernel --op conv`), in the conventions that have one
    conv = {"ddsim": ddsim_kernels.as_conv_contract, "sglang": sglang.as_conv_contract}.get(convention)
    conv_kw = {} if conv is None else dict(conv=conv(fn), conv_name=impl, conv_source=src, conv_source_sha256=digest,
                                           conv_sources=sources,
                                           conv_widths=(2, 3, 4) if convention == "sglang" else (2, 3, 4, 5),
                                           conv_writes_slot="flattened window" if convention == "sglang" else None,
                                           conv_parents=convention == "sglang")
    # and as a Mamba2 tree verify, a KDA verify and a lightning-attention verify (`check-kernel --op mamba2 / kda /
    # lightning`), in the conventions whose signature has one: (wrapper, modes) per convention (fla's take no tree)
    both, leaky = ("exact", "leaky"), ("leaky",)
    ops_kw = {}
    for op, by_convention in (
            ("mamba2", {"ddsim": (ddsim_kernels.as_mamba2_contract, both), "sglang": (sglang.as_mamba2_contract, both)}),
            ("kda", {"ddsim": (ddsim_kernels.as_kda_contract, both), "fla": (fla.as_kda_contract, leaky)}),
            ("lightning", {"ddsim": (ddsim_kernels.as_lightning_contract, both), "fla": (fla.as_lightning_contract, leaky)})):
        if convention in by_convention:
            as_op, op_modes = by_convention[convention]
            ops_kw.update({op: as_op(fn), f"{op}_name": impl, f"{op}_modes": op_modes, f"{op}_source": src,
                           f"{op}_source_sha256": digest, f"{op}_sources": sources})
    pads = {"sglang": ("gdn", "conv", "mamba2"), "vllm": ("gdn",)}.get(convention, ())
    node_states = {"sglang": (("gdn", "exact"), ("mamba2", "exact"), ("conv", "exact"), ("conv", "leaky")),
                   "vllm": vllm.NODE_STATES}.get(convention, ())
    return EngineKernel(impl, modes, wrap(fn), top, _version(top), src, digest, sources, **conv_kw, **ops_kw,
                        pads=pads, node_states=node_states)
