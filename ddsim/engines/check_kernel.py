"""``ddsim check-kernel``: the property suite against the oracle for an engine's own GDN kernel (``--op
gdn``), tree causal conv (``--op conv``), Mamba2 tree verify (``--op mamba2``) or Kimi Delta Attention verify
(``--op kda``) or lightning-attention verify (``--op lightning``).

Every property is checked first on the profile's explicit examples (ddsim.engines.kernel_cases: every
dimension a server runs, one example per value, whatever ``--max-examples`` says; ``quick`` on the CPU
where Triton's interpreter is slow, ``serving`` on CUDA), then hypothesis draws small trees of every
shape (chains, stars, deep and bushy, as ddsim.properties.strategies makes them), grouped heads,
fast- and long-memory gates and searches each property for a counterexample (``hypothesis.find``),
which comes back shrunk to the smallest tree. A property holds only if it held on every explicit
example too; an explicit example that fails is reported by its label (it covers one serving
dimension, so it names what the kernel gets wrong). The coverage (trees, widths, head ratios,
batches, pools, dtypes, gate ranges, calls) is printed and written into the JSON.

The committed states live in a state pool, as in a serving engine: each sequence in a shuffled slot,
every other slot NaN (a kernel that reads a slot it was not given turns its outputs NaN), the pool between two guard
slots in its storage (a write a slot's worth before or after it counts as a write to another slot: -1, N). Where the
kernel's convention pads a CUDA-graph batch (EngineKernel.pads), padded batches run too: rows of slot -1, whose
output is the engine's own (left out of finiteness, repeatability and the comparisons) and for which no slot may be
written. The inputs come contiguous, but in some explicit examples (kernel_cases.SPLIT) as a server's layer hands
them over: q, k and v (Mamba2: x, B and C) views of one fused projection, each token's row strided by the
projection's width, so a kernel that takes its inputs' strides from their shapes reads the wrong columns there.

Properties (mode "exact"):
  output finite           no NaN or Inf in any node's output
  inputs untouched        every argument (q, k, v, gates, the index tables) bit-identical after the call
  repeatable              repeated calls on one input give bit-identical outputs: two on every drawn input
                          and every serving example, a burst of them on some (the quick profile calls its
                          other examples once: the interpreter runs programs one after another)
  committed state untouched   the batch's pool slots are bit-identical after the call (verify reads)
  other pool slots untouched  so is every slot outside the batch
  exact on order-exact    every order-exact node equals the oracle's exact output
  exact on every node     every node equals the oracle's exact output
Mode "leaky" (the flattened path) replaces the last by
  flattened semantics     every node equals the oracle's flattened (leaky) output
  leaks off order         some node that is not order-exact differs from the exact output: the leak
                          is there (a "leaky" kernel that never leaks is not what it claims)
so a leaky kernel passes when the leak is identified and bounded: exact where the layout makes it
exact, the flattened recurrence elsewhere.
A kernel that keeps every node's state for its commit (EngineKernel.node_states: SGLang's exact verifies fill
intermediate_states_buffer and its conv intermediate_conv_window, vLLM's spec decode a state per token) gets a NaN
per-node state buffer and a row per sequence on every call (kernel_cases.node_layout: shuffled rows, a pitch past T,
offsets past 2^31 elements; a conv's window [C, W-1] is its node state), and
  node states exact on every node      (exact) / node states flattened on every node (leaky): each node's kept
                                       state equals the oracle's state after it, what a commit copies into the pool
  other node-state entries untouched   every entry outside the batch's rows' first T steps (a padded row's
                                       row aside), and the guard rows before and after the buffer, keep their bits
A kernel that also commits them (EngineKernel.commit: SGLang's fused_mamba_state_scatter_with_mask and its conv
windows' twin) has its commit run after the first call of every example, over L layers at once (_commit_writes: two,
or a model's every layer past 2^31 elements in the serving profile), each sequence committing its deepest node, its
root, its last node or none (_accepted), and
  committed state exact at the accepted node  (exact) / ... flattened ... (leaky): the last layer's slot equals the
                                       oracle's state after the accepted node
  committed state the kept node state bit for bit   every layer's slot is the kept entry it copies
  commit writes nothing else           no other slot, kept state, guard or index table is written
"""
from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ddsim.engines import GUARD, _bits, beside, graphs, guarded_empty, guarded_like, slot_major_like, slot_major_whole
from ddsim.engines.kernel_cases import split_views
from ddsim.errors import InputError, one_line
from ddsim.measure.compare import TOLERANCES


@dataclass
class PropertyResult:
    name: str
    holds: bool
    detail: str = ""
    counterexample: dict | None = None


@dataclass
class CheckResult:
    properties: list[PropertyResult]
    profile: str
    examples: int  # explicit examples run
    coverage: dict  # dimension -> sorted values seen (explicit and drawn examples)
    # where a fault ended the device's CUDA context (an explicit example's label, or "a drawn input of <property>"),
    # and the explicit examples never run after it: nothing after a fault can be checked in the process
    lost_at: str | None = None
    unchecked: list[str] = field(default_factory=list)

    def __iter__(self):  # the properties, as the older list result was read
        return iter(self.properties)


def _strategies():
    try:
        from ddsim.properties import strategies
    except ModuleNotFoundError as e:
        raise InputError(f"check-kernel needs hypothesis (missing module {e.name!r}; "
                         "pip install 'ddsim-spec[properties]')") from None
    return strategies


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _bound(ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """The comparison bound of one layer's output in ``dtype`` (ddsim.measure.compare's table)."""
    atol, rtol = TOLERANCES[dtype]
    return atol + rtol * (ref.abs().max().item() if ref.numel() else 0.0)


def _node_errors(o: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[B, T] max abs error per node (inf where the output is not finite)."""
    err = (o.double().cpu() - ref.double().cpu()).abs().flatten(2).amax(-1)
    return torch.where(torch.isfinite(o.double().cpu()).flatten(2).all(-1), err, torch.inf)


def _input_digest(inp: dict) -> str:
    """A digest of everything an example holds (tensors by dtype, shape and bits; trees by parents and
    tokens; the rest by repr): equal digests, equal inputs."""
    import hashlib
    h = hashlib.sha256()
    for k in sorted(inp):
        v = inp[k]
        h.update(k.encode())
        if isinstance(v, torch.Tensor):
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(_bits(v.detach().cpu()).numpy().tobytes())
        elif k == "trees":
            h.update(repr([(list(t.parents), list(t.tokens)) for t in v]).encode())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def _input_dtype(inp: dict) -> torch.dtype:
    """The dtype an example's inputs were drawn in."""
    return (inp["q"] if "q" in inp else inp["x"]).dtype


def _judged_dtype(inp: dict) -> torch.dtype:
    """The dtype whose tolerance an example's outputs and states are held to: its inputs', or its state pool's where
    that is coarser (a server's 16-bit state cache, kernel_cases.STATE_DTYPES: a kernel keeps its node states in the
    pool's dtype, and may carry a branch's parent state through them)."""
    dtypes = [_input_dtype(inp)] + ([inp["pool"].dtype] if "initial_state" in inp else [])
    return max(dtypes, key=lambda d: TOLERANCES[d][1])


def _node_layout(inp: dict) -> tuple[torch.Tensor, int, int]:
    """(rows [B] int32, M, P): where an example's per-node state buffer puts each sequence's node states (rows of P >= T
    steps in a buffer of M rows): the explicit examples say (kernel_cases.node_layout); a drawn input takes its
    sequences' rows in reverse order in a buffer of one row and one step more than it needs."""
    if "node_rows" in inp:
        M, P = inp["node_buffer"]
        return inp["node_rows"], M, P
    B, T = inp["parents"].shape
    return torch.arange(B - 1, -1, -1, dtype=torch.int32), B + 1, T + 1


def _node_buffer(inp: dict, shape: tuple, device: str, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer [M, P, *shape] of ``dtype``, NaN, between two guard rows in its storage, rows [B] int32) on the
    device."""
    rows, M, P = _node_layout(inp)
    return (guarded_like(torch.full((M, P, *shape), float("nan"), device=device, dtype=dtype)),
            rows.to(device, copy=True))


def _node_writes(buf: torch.Tensor, inp: dict, real: torch.Tensor) -> dict:
    """What a call left in its per-node state buffer: ``node_vals`` [B, T, ...] the batch's node states (on the CPU),
    ``node_others_untouched`` whether every entry outside them (the steps past T, the other rows, a padded row's row
    aside: the engine's own) and both guard rows kept their bits, and ``node_written`` up to 8 (row, step) pairs
    written outside (-1 and M: the guard rows)."""
    rows, M, P = _node_layout(inp)
    T = inp["parents"].shape[1]
    owned = torch.zeros(M, P, dtype=torch.bool, device=buf.device)
    r = rows.long().to(buf.device)
    owned[r[real.to(buf.device)], :T] = True
    owned[r[~real.to(buf.device)]] = True
    nan = _bits(torch.full((1,), float("nan"), dtype=buf.dtype)).item()  # torch.full's NaN: what the buffer began as
    touched = (_bits(buf) != nan).flatten(2).any(-1)  # [M, P]
    outside = (touched & ~owned).nonzero().tolist()
    ends = beside(buf)
    guard = GUARD[buf.element_size()]
    hit = [end is not None and bool((_bits(end) != guard).any()) for end in (ends or (None, None))]
    outside = ([[-1, 0]] if hit[0] else []) + outside + ([[M, 0]] if hit[1] else [])
    return {"node_vals": buf[r, :T].cpu(), "node_others_untouched": not outside, "node_written": outside[:8]}


# the layers an example's commit copies at once, where the example does not say (kernel_cases.wide_commit: a model's)
COMMIT_LAYERS = 2


def _accepted(inp: dict) -> torch.Tensor:
    """[B] int32: the node whose kept state sequence b's commit copies (-1: nothing to commit), the example's own
    (``accepted``) or by b % 4: its deepest node (the longest path accepted), its root (the bonus token alone), its
    last node, none."""
    if "accepted" in inp:
        return inp["accepted"]
    picks = []
    for b, tree in enumerate(inp["trees"]):
        picks.append([int(tree.depths.argmax()), 0, tree.size - 1, -1][b % 4])
    return torch.tensor(picks, dtype=torch.int32)


def _layer_factor(l: int, L: int) -> float:
    """What layer l of L holds of the verify's kept states (and of the example's pool): the last layer the values
    themselves (held to the oracle's), the others the values times -2^-k (k = 1..8 in turn): no two neighbouring
    layers alike, so a commit that reads or writes another layer's entry shows bit for bit. (Each layer is compared
    with its own products, so a product that leaves a format's normal range, and is rounded, is still its own.)"""
    k = (L - 1 - l) % 8
    return 1.0 if l == L - 1 else -(2.0 ** -(k if k else 8))


class CommitFault(RuntimeError):
    """The commit faulted on the device and took the process's CUDA context with it: no property of the example (nor
    of any after it) can be checked."""


def _context_lost(device) -> bool:
    """Whether the CUDA context of ``device`` is gone (a kernel fault ends it: every later call raises)."""
    try:
        torch.cuda.synchronize(device)
        return False
    except Exception:
        return True


def _device_lost(device) -> bool:
    """Whether ``device`` is a CUDA device whose context a fault has ended (never a CPU)."""
    return torch.device(device).type == "cuda" and _context_lost(device)


def _raise_if_context_lost(e: Exception, device) -> None:
    """Raise CommitFault, naming the commit's error ``e``, where ``e`` ended ``device``'s CUDA context (the example then
    fails every property with that line, not with the next call's echo of the fault); else return."""
    if _device_lost(device):
        raise CommitFault(f"the commit faulted ({type(e).__name__}: {_short(e, 200)}), which ends the device's CUDA "
                          "context: nothing after it can be checked") from None


def _commit_writes(commit, kept: torch.Tensor, inp: dict, device: str) -> dict:
    """Run the engine's commit (its op bound: commit(pool=, buffer=, slots=, rows=, accepted=)) on what its verify
    kept, ``kept`` [M, P, *state] (the verify's per-node state buffer), over L layers (the example's commit_layers, else
    COMMIT_LAYERS) side by side in one storage between two guard entries, as an engine's [L, N, ...] pools are (each
    slot's L entries side by side where the example's pool is one layer of a slot-major pool, kernel_cases.SLOT_MAJOR;
    one layer's pool after another elsewhere): layer
    l's buffer the kept states and its pool the example's, each times _layer_factor(l, L). Returns commit_vals
    [L, B, *state] (each sequence's slot after the commit, on the CPU), commit_kept [L, B, *state] (the entry a copy
    puts there), commit_done [B] (the sequences with something to commit: a node accepted and a slot), commit_accepted
    [B], commit_layers, commit_others_untouched, commit_written (up to 8 entries written besides the committed
    slots: (layer, slot) of the pool, then (layer, row, step) of the kept states; the guards are (0, -1) and
    (L-1, N), (0, -1, 0) and (L-1, M, 0)) and commit_tables_written (the index tables it wrote, by name), or
    commit_error where it raised."""
    L = int(inp.get("commit_layers", COMMIT_LAYERS))
    rows, M, P = _node_layout(inp)
    slots, acc = inp["slots"], _accepted(inp)
    pool0 = inp["pool"].to(device)  # [N, *state]
    N, state = pool0.shape[0], tuple(pool0.shape[1:])
    done = (acc >= 0) & (slots >= 0)
    if "pool_layers" in inp:  # a slot-major pool, as the example's verify got: [L, N] over a storage [N, L]
        pool = guarded_empty((N, L, *state), pool0.dtype, device)
        pools = pool.transpose(0, 1)
    else:  # one layer's pool after another
        pool = guarded_empty((L * N, *state), pool0.dtype, device)
        pools = pool.view(L, N, *state)
    buf = guarded_empty((L * M, P, *state), kept.dtype, device)
    for l in range(L):
        f = _layer_factor(l, L)
        pools[l] = pool0 * f
        buf[l * M:(l + 1) * M] = kept * f
    given = {"slots": slots, "rows": rows, "accepted": acc}
    tables = {name: t.to(device, copy=True) for name, t in given.items()}  # the commit's own copies
    try:
        commit(pool=pools, buffer=buf.view(L, M, P, *state), **tables)
        if pool.is_cuda:  # a fault of the commit's kernel surfaces here, as the commit's
            torch.cuda.synchronize(pool.device)
    except Exception as e:  # the commit properties fail with what it raised; the verify's stand
        _raise_if_context_lost(e, pool.device)
        return {"commit_error": f"{type(e).__name__}: {_short(e, 300)}", "commit_layers": L, "commit_accepted": acc,
                "commit_done": done}
    written = []
    mine = torch.zeros(N, dtype=torch.bool)
    mine[slots[done].long()] = True
    r, a = rows.long().to(device), acc.long().clamp(min=0).to(device)
    vals, copies, stray = [], [], []
    for l in range(L):
        f = _layer_factor(l, L)
        layer = pools[l]
        changed = (_bits(layer) != _bits(pool0 * f)).flatten(1).any(-1).cpu() & ~mine
        written += [[l, s] for s in changed.nonzero().flatten().tolist()]
        vals.append(layer[slots.long().clamp(min=0).to(device)].cpu())
        copies.append((kept[r, a] * f).cpu())
        changed = (_bits(buf[l * M:(l + 1) * M]) != _bits(kept * f)).flatten(2).any(-1)  # [M, P]: the buffer is only read
        stray += [[l, m, t] for m, t in changed.nonzero().tolist()]
    written += stray  # the pool's entries first, then the buffer's
    # the guards: the slot before layer 0's first (0, -1) and after layer L-1's last (L-1, N); the buffer's rows alike
    for t, before, after in ((pool, [0, -1], [L - 1, N]), (buf, [0, -1, 0], [L - 1, M, 0])):
        ends, guard = beside(t), GUARD[t.element_size()]
        written += [at for end, at in zip(ends, (before, after)) if bool((_bits(end) != guard).any())]
    tables_written = [name for name, v in tables.items() if not torch.equal(v.cpu(), given[name])]
    return {"commit_vals": torch.stack(vals), "commit_kept": torch.stack(copies), "commit_done": done,
            "commit_accepted": acc, "commit_layers": L, "commit_others_untouched": not written and not tables_written,
            "commit_written": written[:8], "commit_tables_written": tables_written}


def _buffers(inp: dict, names: tuple[str, ...], device: str, node_shape: tuple | None, node_dtype) -> tuple:
    """(args, pool, slots, node) for one call on ``inp``: fresh copies on the device of the inputs ``names`` (None kept;
    views of one fused projection where the example says), the parents and slots, the pool (between guard slots, or
    one layer of a slot-major pool) and, with ``node_shape``, a NaN per-node state buffer and its rows (else None)."""
    args = {k: None if inp[k] is None else inp[k].to(device, copy=True) for k in names}
    if inp.get("split"):  # as a server's layer hands them over: views of one fused projection
        args.update(split_views({k: args[k] for k in inp["split"]}))
    args["parents"] = inp["parents"].to(device, copy=True)
    slots = inp["slots"].to(device, copy=True)
    if "pool_layers" in inp:  # one layer of a slot-major pool of several (a server's unified state pool)
        pool = slot_major_like(inp["pool"].to(device), *inp["pool_layers"])
    else:
        pool = guarded_like(inp["pool"].to(device))  # a slot of guard bits on either side in its storage
    node = None if node_shape is None else _node_buffer(inp, node_shape, device, node_dtype)
    return args, pool, slots, node


def _calls(call, inp: dict, names: tuple[str, ...], device: str, node_shape: tuple | None = None,
           node_dtype=torch.float32, commit=None, graph: bool = False) -> dict:
    """Call the kernel ``inp['burst']`` times (two unless the example says; at least one), each on fresh copies of
    the inputs ``names`` (None kept), the index tables and the pool: the first call's output and pool writes,
    which arguments any call changed, whether every call's output is bit-identical to the first's (a padded
    row's aside), and ``real`` [B], the rows that are not padding (slot -1), whose output is the engine's own.
    With ``node_shape`` (a kernel that keeps every node's state) each call also gets a per-node state buffer of
    that state shape and ``node_dtype`` (_node_layout), and its first call's writes there are returned (_node_writes); repeatable then
    covers the batch's node states too. With ``commit`` (the engine's, its op bound) the first call's kept states are
    then committed (_commit_writes). A replayed example (``inp['replay']``, kernel_cases.replayed: another step of the
    same shapes) first calls the kernel on that step, unjudged, and every call after it replays that step's engine
    launches on their kept tensors with the example's values (graphs.launch; with ``graph``, on CUDA, a CUDA graph
    captured on it), as a server's CUDA graph runs its verify; a commit after the verify is kept on that step and
    replayed after the first judged call likewise (SGLang's EAGLE worker can replay its state update after the verify
    from a graph of its own)."""
    outs, changed, writes, nodes = None, set(), None, {}
    identical = True
    real = inp["slots"] >= 0  # [B]: the rows that are not padding (slot -1)
    replay = graphs.Replay(capture=graph) if "replay" in inp else None
    with graphs.replaying(replay):
        if replay is not None:  # the step the engine's launches are kept (captured) on: not judged
            first, pool, slots, node = _buffers(inp["replay"], names, device, node_shape, node_dtype)
            replay.begin()
            call(first, pool, slots) if node is None else call(first, pool, slots, node)
            if node is not None and commit is not None:  # and its commit, whose launch a server replays too
                _commit_writes(commit, node[0], inp["replay"], device)
            replay.replayed()
            del first, pool, slots, node
        for n in range(max(1, int(inp.get("burst", 2)))):
            args, pool, slots, node = _buffers(inp, names, device, node_shape, node_dtype)
            tables = {"slots": slots, **({} if node is None else {"node rows": node[1]})}
            seen = {k: _bits(v).clone() for k, v in {**args, **tables}.items() if v is not None}
            whole = slot_major_whole(pool)  # None but for a slot-major pool
            before = _bits(pool if whole is None else whole).clone()
            if replay is not None:
                replay.begin()
            o = call(args, pool, slots) if node is None else call(args, pool, slots, node)
            changed |= {k for k, v in {**args, **tables}.items() if v is not None and not torch.equal(_bits(v), seen[k])}
            checked_output(o)
            o = o.detach().cpu()
            if node is not None:
                got = _node_writes(node[0], inp, real)
                if n == 0 and commit is not None:
                    got.update(_commit_writes(commit, node[0], inp, device))
                del node
            if n == 0:
                outs, writes = o.clone(), _pool_writes(pool if whole is None else whole, before, inp["slots"],
                                                       None if whole is None else inp["pool_layers"][0])
                writes["pool_after"] = pool.cpu()
                if node_shape is not None:
                    nodes = got
            elif o.shape != outs.shape or o.dtype != outs.dtype or not torch.equal(_bits(o[real]), _bits(outs[real])):
                identical = False  # a padded row's output is the engine's own (vLLM's and SGLang's conv leave it unwritten)
            elif node_shape is not None and not torch.equal(_bits(got["node_vals"][real]), _bits(nodes["node_vals"][real])):
                identical = False
    return {"o": outs, **writes, **nodes, "inputs_changed": sorted(changed), "repeatable": identical, "real": real}


def _references(reference, modes: tuple, mode: str, node_states: bool) -> dict:
    """{"ref": {m: the oracle's output in mode m} for ``modes``}, and "ref_states", the state after each node in the
    kernel's own ``mode``, where it keeps them (``node_states``): ``reference(m, with_states)`` returns the output, or
    (output, states) when asked for them."""
    out = {"ref": {}}
    for m in modes:
        got = reference(m, node_states and m == mode)
        if node_states and m == mode:
            got, out["ref_states"] = got
        out["ref"][m] = got
    return out


class _Runner:
    """One recurrence kernel (GDN, Mamba2, KDA, lightning attention), one mode, on one device: runs the kernel (on
    copies: a kernel that writes its inputs must not change what the oracle reads) and its oracle twin on an example.
    ``call`` is the kernel's contract (e.g. kernel.verify) and ``reference`` the oracle's op: both take the inputs
    ``positional`` in order, then ``keywords``; ``extra`` the kernel's further keyword arguments."""

    def __init__(self, call, reference, positional: tuple, keywords: tuple, mode: str, device: str, extra=None,
                 node_states: bool = False, commit=None, graph: bool = False):
        self.call, self.reference, self.mode, self.device = call, reference, mode, device
        self.graph = graph  # a replayed example's launch captured in a CUDA graph (_calls)
        self.positional, self.keywords, self.extra = positional, keywords, extra or {}
        self.node_states = node_states  # the kernel keeps every node's state (the contract's node_states)
        self.commit = commit  # and commits them with this (the contract's commit, its op bound), or None

    def run(self, inp) -> dict:
        names = self.positional + self.keywords

        def call(a, pool, slots, node=None):  # a is read, not emptied: _calls checks every argument for writes after
            kw = {n: a[n] for n in (*self.keywords, "parents")}
            if node is not None:
                kw["node_states"] = node
            return self.call(*(a[n] for n in self.positional), **kw, state_pool=pool, slots=slots, mode=self.mode,
                             **self.extra)
        # the per-node state buffer in the pool's dtype, as a server allocates it beside its state cache
        r = _calls(call, inp, names, self.device, tuple(inp["initial_state"].shape[1:]) if self.node_states else None,
                   inp["pool"].dtype, commit=self.commit, graph=self.graph)
        plain = {k: None if inp[k] is None else inp[k].double() for k in names}
        # the references the mode's properties compare with: exact's always, the flattened one for a leaky kernel,
        # with the state after each node in the kernel's own mode where it keeps them
        r.update(_references(
            lambda m, states: self.reference(*(plain[n] for n in self.positional), **{n: plain[n] for n in self.keywords},
                                             parents=inp["parents"], initial_state=inp["initial_state"].double(), mode=m,
                                             output_states=states),
            ("exact", "leaky") if self.mode == "leaky" else ("exact",), self.mode, self.node_states))
        checked_output(r["o"], r["ref"]["exact"].shape)
        r["order_exact"] = torch.tensor([list(t.order_exact) for t in inp["trees"]])
        r["dtype"] = _judged_dtype(inp)
        return r

    def properties(self) -> dict:
        return _properties(self.mode, nodes=self.node_states, commit=self.commit is not None)


def _pool_writes(pool: torch.Tensor, before: torch.Tensor, slots: torch.Tensor, layer: int | None = None) -> dict:
    """Which pool slots a call wrote (bitwise), split into the batch's (padded rows, slot -1, hold none) and the
    others; a guard slot written (-1: the slot's worth before the pool, N: after it) counts among the others. With
    ``layer``, pool is a whole slot-major pool [N, layers, ...] whose layer ``layer`` the call was given: the batch's
    entries there are its committed states, and an entry of any other layer written counts among the others."""
    if layer is None:
        changed = (_bits(pool) != before).flatten(1).any(-1).cpu()  # [N]
        elsewhere = torch.zeros_like(changed)
    else:
        by_layer = (_bits(pool) != before).flatten(2).any(-1).cpu()  # [N, layers]
        changed, elsewhere = by_layer[:, layer], by_layer.clone()
        elsewhere[:, layer] = False
        elsewhere = elsewhere.any(-1)  # [N]: an entry of another layer written
    in_batch = torch.zeros_like(changed)
    in_batch[slots.long().cpu()[slots.cpu() >= 0]] = True
    written = (changed | elsewhere).nonzero().flatten().tolist()
    ends = beside(pool)
    if ends is not None:
        guard = GUARD[pool.element_size()]
        hit = [bool((_bits(end) != guard).any()) for end in ends]
        written = ([-1] if hit[0] else []) + written + ([pool.shape[0]] if hit[1] else [])
    outside = any(w < 0 or w >= pool.shape[0] for w in written)
    return {"committed_untouched": not bool(changed[in_batch].any()),
            "others_untouched": not bool(changed[~in_batch].any()) and not bool(elsewhere.any()) and not outside,
            "written_slots": written}


def _properties(mode: str, committed: tuple | None = None, nodes: bool = False, commit: bool = False) -> dict:
    """name -> predicate(run result) that must hold on every input. ``committed`` replaces the
    committed-slot property for a kernel whose verify rewrites its slot by design: (name, predicate). ``nodes``: the
    kernel keeps every node's state (NODE_PROPERTIES hold them to the oracle's and the buffer's other rows);
    ``commit``: and its commit copies them into the pool (COMMIT_PROPERTIES)."""
    def close(r, m, nodes):  # nodes [B, T] of the sequences that are not padding
        err = _node_errors(r["o"], r["ref"][m])
        return bool((err[nodes & r["real"][:, None]] <= _bound(r["ref"][m], r["dtype"])).all())

    def states_close(r):  # every real sequence's node states, against the oracle's in the kernel's mode
        err = _node_errors(r["node_vals"], r["ref_states"])
        return bool((err[r["real"]] <= _bound(r["ref_states"], r["dtype"])).all())

    name, pred = committed or ("committed state untouched", lambda r: r["committed_untouched"])
    props = {
        "output finite": lambda r: bool(torch.isfinite(r["o"][r["real"]]).all()),
        "inputs untouched": lambda r: not r["inputs_changed"],
        "repeatable": lambda r: r["repeatable"],
        name: pred,
        "other pool slots untouched": lambda r: r["others_untouched"],
        "exact on order-exact nodes": lambda r: close(r, "exact", r["order_exact"]),
    }
    if mode == "exact":
        props["exact on every node"] = lambda r: close(r, "exact", torch.ones_like(r["order_exact"]))
    else:
        props["flattened semantics on every node"] = lambda r: close(r, "leaky", torch.ones_like(r["order_exact"]))
    if nodes:
        props[NODE_PROPERTIES[mode]] = states_close
        props["other node-state entries untouched"] = lambda r: r["node_others_untouched"]
    if commit:
        props[COMMIT_PROPERTIES[mode]] = lambda r: "commit_error" not in r and bool(
            (_commit_errors(r) <= _bound(r["ref_states"], r["dtype"])).all())
        props[COMMIT_COPY] = lambda r: "commit_error" not in r and not _commit_miscopied(r)
        props[COMMIT_ELSEWHERE] = lambda r: "commit_error" not in r and r["commit_others_untouched"]
    return props


# the property holding a kept node state to the oracle's, by mode: what an engine's commit copies into the pool
NODE_PROPERTIES = {"exact": "node states exact on every node", "leaky": "node states flattened on every node"}
# an engine's commit after the verify (EngineKernel.commit), by mode: the pool's state of each sequence that accepted a
# node against the oracle's after that node (the last layer's, the verify's own states), every layer's against the
# kept entry it copies, bit for bit, and nothing else written
COMMIT_PROPERTIES = {"exact": "committed state exact at the accepted node",
                     "leaky": "committed state flattened at the accepted node"}
COMMIT_COPY = "committed state the kept node state bit for bit"
COMMIT_ELSEWHERE = "commit writes nothing else"


def _commit_errors(r: dict) -> torch.Tensor:
    """[B] the max abs error of each committing sequence's slot after the commit (the last layer: the verify's own
    states) against the oracle's state after its accepted node (inf where not finite; 0 for the sequences that commit
    nothing)."""
    done, acc = r["commit_done"], r["commit_accepted"].long().clamp(min=0)
    ref = r["ref_states"][torch.arange(len(acc)), acc]  # [B, *state]
    err = _node_errors(r["commit_vals"][-1][:, None], ref[:, None])[:, 0]  # each committed state as one node's
    return torch.where(done, err, 0.0)


def _commit_miscopied(r: dict) -> list[list[int]]:
    """(layer, sequence) pairs whose slot after the commit is not the kept entry it copies, bit for bit."""
    differ = (_bits(r["commit_vals"]) != _bits(r["commit_kept"])).flatten(2).any(-1)  # [L, B]
    return (differ & r["commit_done"][None, :]).nonzero().tolist()


class _ConvRunner:
    """The engine's tree causal conv, one mode, on one device, against the oracle's conv; with ``node_states`` (an
    engine that keeps every node's window for its commit, SGLang's intermediate_conv_window) each node's window too."""

    def __init__(self, kernel, mode: str, device: str, node_states: bool = False, commit=None, graph: bool = False):
        self.kernel, self.mode, self.device, self.node_states = kernel, mode, device, node_states
        self.commit, self.graph = commit, graph

    def tables(self) -> bool:
        """Whether the conv's calls fill the parent table its engine's verifies read (EngineKernel.conv_parents)."""
        return self.kernel.conv_parents and self.mode == "exact"

    def run(self, inp) -> dict:
        from ddsim import oracle
        written = []  # each call's parent table, as the conv left it

        def call(a, pool, slots, node=None):
            extra = {} if node is None else {"node_states": node}
            if self.tables():  # a fresh table each call, PARENTS_UNWRITTEN until the conv fills it
                extra["parents_out"] = torch.full(tuple(a["parents"].shape), PARENTS_UNWRITTEN, dtype=torch.int32,
                                                  device=a["parents"].device)
            o = self.kernel.conv(a["x"], weight=a["weight"], bias=a["bias"], parents=a["parents"], window_pool=pool,
                                 slots=slots, mode=self.mode, activation="silu", **extra)
            if self.tables():
                written.append(extra["parents_out"].cpu())
            return o
        window = inp["initial_window"]
        r = _calls(call, inp, ("x", "weight", "bias"), self.device,
                   tuple(window.shape[1:]) if self.node_states else None, window.dtype, commit=self.commit,
                   graph=self.graph)
        plain = dict(weight=inp["weight"].double(), bias=None if inp["bias"] is None else inp["bias"].double())
        r.update(_references(  # a node's state is its window [C, W-1]
            lambda m, windows: oracle.tree_causal_conv1d(inp["x"].double(), **plain, parents=inp["parents"],
                                                         initial_window=window.double(), mode=m,
                                                         output_windows=windows),
            ("exact", "leaky"), self.mode, self.node_states))
        checked_output(r["o"], r["ref"]["exact"].shape)
        if "replay" in inp and written:  # the first call was the replayed example's other step, not judged
            written.pop(0)
        W1 = inp["initial_window"].shape[-1]
        # the window after the whole flattened draft: what a verify that rewrites its slot writes there
        flat = torch.cat([inp["initial_window"], inp["x"].transpose(1, 2).to(inp["initial_window"].dtype)], -1)
        flat = flat[..., flat.shape[-1] - W1:]
        real = r["real"]  # padded rows (slot -1) have no slot
        batch = r.pop("pool_after")[inp["slots"][real].long()]
        r["slot_is_flattened_window"] = torch.equal(_bits(batch), _bits(flat[real]))
        r["order_exact"] = torch.tensor([list(t.order_exact) for t in inp["trees"]])
        r["dtype"] = _input_dtype(inp)
        if self.tables():
            r["parents_wrong"] = _parents_wrong(written, inp["parents"], real)
        return r

    def properties(self) -> dict:
        if self.kernel.conv_writes_slot == "flattened window":
            committed = ("committed window = the flattened draft's window", lambda r: r["slot_is_flattened_window"])
        else:
            committed = ("committed window untouched", lambda r: r["committed_untouched"])
        props = _properties(self.mode, committed, nodes=self.node_states, commit=self.commit is not None)
        if self.tables():  # beside the outputs' properties, before the node states' and the commit's
            at = list(props).index("exact on every node") + 1
            items = list(props.items())
            props = dict(items[:at] + [(PARENT_TABLE, lambda r: not r["parents_wrong"])] + items[at:])
        return props


# the property of a conv that fills its engine's parent table (EngineKernel.conv_parents), and what check-kernel's
# table holds before the conv writes it (no parent index; SGLang's own sentinels are -1 and, unwritten, 0)
PARENT_TABLE = "parent table the verify reads is the tree's"
PARENTS_UNWRITTEN = -7


def _parents_wrong(written: list, parents: torch.Tensor, real: torch.Tensor) -> list:
    """Up to 8 [call, sequence, node, written, parent] where a call's parent table differs from the tree's parents:
    every real sequence's nodes 1..T-1 (the root's entry is the engine's own: no verify reads it)."""
    wrong = []
    for n, table in enumerate(written):
        off = (table[:, 1:] != parents[:, 1:].to(table.dtype)) & real[:, None]
        for b, t in off.nonzero().tolist():
            wrong.append([n, b, t + 1, int(table[b, t + 1]), int(parents[b, t + 1])])
    return wrong[:8]


def _op_of(inp: dict) -> str:
    """The op an example is for: its inputs say (KDA's gate has a key-channel axis, GDN's does not)."""
    if "decay" in inp:
        return "lightning"
    if "q" in inp:
        return "kda" if inp["g"].dim() == 4 else "gdn"
    return "mamba2" if "dt" in inp else "conv"


def _describe(inp, r, prop: str, mode: str) -> dict:
    """The counterexample as JSON: the example's label (an explicit one) or "drawn", the trees (parents
    and tokens), shapes, and the first node whose output is wrong against the reference the property names."""
    ref_mode = "leaky" if "flattened" in prop else "exact"
    dtype = _judged_dtype(inp)  # the tolerance the properties held it to
    if prop in NODE_PROPERTIES.values():  # the kept node states against the oracle's
        err, bound = _node_errors(r["node_vals"], r["ref_states"]), _bound(r["ref_states"], dtype)
    else:
        err, bound = _node_errors(r["o"], r["ref"][ref_mode]), _bound(r["ref"][ref_mode], dtype)
    nodes = r["real"][:, None] & (r["order_exact"] if prop == "exact on order-exact nodes" else True)
    wrong = torch.isinf(err) if prop == "output finite" else err > bound  # the nodes the property is about
    bad = (wrong & nodes).nonzero().tolist()
    first = None
    if bad:
        b, n = bad[0]
        first = {"sequence": b, "node": n, "max_abs_error": float(err[b, n]), "bound": bound,
                 "order_exact": bool(r["order_exact"][b, n])}
    if "q" in inp:
        B, T, H, K = inp["q"].shape
        shapes = {"B": B, "T": T, "H": H, "HV": inp["v"].shape[2], "K": K, "V": inp["v"].shape[3]}
    elif "dt" in inp:
        B, T, H, P = inp["x"].shape
        shapes = {"B": B, "T": T, "H": H, "P": P, "G": inp["B"].shape[2], "N": inp["B"].shape[3]}
    else:
        B, T, C = inp["x"].shape
        shapes = {"B": B, "T": T, "C": C, "W": inp["weight"].shape[1], "bias": inp["bias"] is not None}
    out = {"property": prop, "op": _op_of(inp), "mode": mode,
           "example": inp.get("label", "drawn"), "dtype": str(_input_dtype(inp)).removeprefix("torch."),
           "reference": ref_mode,
           "trees": [{"parents": list(t.parents), "tokens": list(t.tokens)} for t in inp["trees"]],
           "shapes": shapes,
           "pool": {"slots": inp["pool"].shape[0], "batch_slots": inp["slots"].tolist(),
                    "written_slots": r["written_slots"], "dtype": str(inp["pool"].dtype).removeprefix("torch.")},
           "inputs_changed": r["inputs_changed"], "repeatable": r["repeatable"],
           "first_wrong_node": first}
    if prop == PARENT_TABLE:
        out["parent_table_wrong"] = r["parents_wrong"]
    if "node_vals" in r:
        rows, M, P = _node_layout(inp)
        out["node_buffer"] = {"rows": M, "pitch": P, "batch_rows": rows.tolist(),
                              "written_outside": r["node_written"]}
    if prop in (*COMMIT_PROPERTIES.values(), COMMIT_COPY, COMMIT_ELSEWHERE):
        out["commit"] = _describe_commit(r, prop, dtype)
    return out


def _describe_commit(r: dict, prop: str, dtype: torch.dtype) -> dict:
    """A commit property's counterexample: the layers, the nodes accepted, and the commit's error, its first sequence
    off the oracle (the oracle property), its first (layer, sequence) not copied bit for bit (the copy's), or the
    entries it wrote besides the committed slots (the last's)."""
    acc = r["commit_accepted"].tolist()
    out = {"layers": r["commit_layers"], "accepted": acc, "first_wrong": None}
    if "commit_error" in r:
        out["error"] = r["commit_error"]
    elif prop == COMMIT_COPY:
        bad = _commit_miscopied(r)
        if bad:
            l, b = bad[0]
            d = (r["commit_vals"][l, b].double() - r["commit_kept"][l, b].double()).abs()
            d = d.nan_to_num(nan=torch.inf).max().item()  # NaN on either side: inf
            out["first_wrong"] = {"layer": l, "sequence": b, "node": acc[b], "max_abs_difference": d}
    elif prop == COMMIT_ELSEWHERE:
        out.update(written=r["commit_written"], tables_written=r["commit_tables_written"])
    else:
        err, bound = _commit_errors(r), _bound(r["ref_states"], dtype)
        bad = (err > bound).nonzero().flatten().tolist()
        if bad:
            b = bad[0]
            out["first_wrong"] = {"sequence": b, "node": acc[b], "max_abs_error": float(err[b]), "bound": bound}
    return out


# the properties that compare outputs with a reference, whose counterexample is located by its first wrong node (the
# others by the slots written)
OUTPUT_PROPERTIES = ("output finite", "exact on order-exact nodes", "exact on every node",
                     "flattened semantics on every node", *NODE_PROPERTIES.values())


def _where(ce: dict) -> str:
    """One line locating a counterexample for the terminal (or the error a serving example raised)."""
    at = "" if ce["example"] == "drawn" else f"serving example [{ce['example']}]: "
    if "error" in ce:
        return at + _failed(ce["error"])
    if "commit" in ce:
        return at + _where_commit(ce)
    node = ce["first_wrong_node"]
    if ce["property"] == "inputs untouched":
        return f"{at}the kernel wrote its arguments {', '.join(ce['inputs_changed'])}"
    if ce["property"] == PARENT_TABLE:
        n, b, t, w, p = ce["parent_table_wrong"][0]
        got = "nothing" if w == PARENTS_UNWRITTEN else w
        return (f"{at}call {n}: node {t} of sequence {b} (parents {_short(ce['trees'][b]['parents'])}) given parent "
                f"{got}, not {p}")
    if ce["property"] == "repeatable":
        return f"{at}repeated calls on one input gave outputs that differ bit for bit"
    if node and ce["property"] in OUTPUT_PROPERTIES:  # a property of the outputs or node states: its first wrong node
        what = "node state" if ce["property"] in NODE_PROPERTIES.values() else "node"
        return (f"{at}first wrong {what} {node['node']} of sequence {node['sequence']} (parents "
                f"{_short(ce['trees'][node['sequence']]['parents'])}), error {node['max_abs_error']:.3g} > "
                f"{node['bound']:.3g}")
    if ce["property"] == "other node-state entries untouched":
        nb = ce["node_buffer"]
        guards = any(w[0] < 0 or w[0] >= nb["rows"] for w in nb["written_outside"])
        return (f"{at}batch rows {_short(nb['batch_rows'])} of {nb['rows']} (pitch {nb['pitch']} steps, "
                f"{ce['shapes']['T']} nodes), written outside them (row, step) {_short(nb['written_outside'])}"
                + (f" (rows -1 and {nb['rows']}: the guard rows)" if guards else ""))
    n, written = ce["pool"]["slots"], ce["pool"]["written_slots"]
    outside = f" (-1 and {n}: the slot's worth before and after the pool)" if any(w < 0 or w >= n for w in written) else ""
    return (f"{at}trees {_short([t['parents'] for t in ce['trees']])}, batch slots {_short(ce['pool']['batch_slots'])} of "
            f"{n}, slots written {_short(written)}{outside}")


def _where_commit(ce: dict) -> str:
    """_where's line for a commit property."""
    c = ce["commit"]
    if "error" in c:
        return f"the commit raised {c['error']}"
    first, layers = c["first_wrong"], f"{c['layers']} layers"
    if ce["property"] == COMMIT_ELSEWHERE:
        N, M = ce["pool"]["slots"], ce["node_buffer"]["rows"]
        guards = any(w[1] in ((-1, N) if len(w) == 2 else (-1, M)) for w in c["written"])
        return (f"nodes accepted {_short(c['accepted'])} (-1: none), slots {_short(ce['pool']['batch_slots'])} of {N} "
                f"in each of {layers}; written besides the committed slots: (layer, slot) and (layer, row, step) "
                f"{_short(c['written'])}" + (f" (slot -1 or {N}, row -1 or {M}: the guards)" if guards else "")
                + (f", and its index tables {', '.join(c['tables_written'])}" if c["tables_written"] else ""))
    if first is None:  # not reached: a failing property names its first wrong entry
        return f"nodes accepted {_short(c['accepted'])} over {layers}"
    parents = _short(ce["trees"][first["sequence"]]["parents"])
    if ce["property"] == COMMIT_COPY:
        return (f"layer {first['layer']} of {c['layers']}, sequence {first['sequence']}: its slot after the commit is "
                f"not the kept state of its accepted node {first['node']} (parents {parents}) bit for bit (max "
                f"difference {first['max_abs_difference']:.3g})")
    return (f"sequence {first['sequence']}'s committed state (accepted node {first['node']}, parents {parents}, "
            f"{layers}) off the oracle's by {first['max_abs_error']:.3g} > {first['bound']:.3g}")


class ContractError(Exception):
    """What a kernel returned is not what its contract says: no tensor, not floating point, or another shape than the
    oracle's output (a missing or extra axis once raised out of check() on the comparison's mask)."""


def checked_output(o, shape: tuple | None = None) -> None:
    """ContractError unless o is a floating-point tensor (of ``shape``, the oracle's output's, where given). The audit
    holds an engine's --fast-path outputs to the same (ddsim.measure.audit.held_to_contract)."""
    if not isinstance(o, torch.Tensor) or not o.is_floating_point():
        raise ContractError(f"an output of {type(o).__name__ if not isinstance(o, torch.Tensor) else o.dtype}, "
                            "not a floating-point tensor")
    if shape is not None and tuple(o.shape) != tuple(shape):
        raise ContractError(f"an output of shape {tuple(o.shape)} where the contract's is {tuple(shape)}")


def _failed(error: str) -> str:
    """The line for a kernel's error (as raised_line gives it): what it raised, or how its output broke the contract."""
    prefix = ContractError.__name__ + ": "
    if error.startswith(prefix):
        return "the kernel broke its contract: " + error[len(prefix):]
    return f"the kernel raised {error}"


def raised_line(e: Exception, device: str) -> str:
    """A kernel's exception on one line; on the CPU, where Triton raised it compiling for a GPU (a caller that imported
    the kernel before TRITON_INTERPRET=1 was set, which the command line sets first), what to do about it."""
    line = f"{type(e).__name__}: {_short(e, 300)}"
    if str(device) == "cpu" and _from_compiled_triton(e):
        line += (" (Triton compiled the kernel for a GPU: on the CPU an engine's Triton kernels run only in Triton's "
                 "interpreter, TRITON_INTERPRET=1 set before they are imported)")
    return line


def _from_compiled_triton(e: BaseException) -> bool:
    """Whether e was raised inside Triton's runtime while Triton is not interpreting."""
    import traceback

    from ddsim.gpu_backend._common import interpreting
    if interpreting():
        return False
    parts = (os.sep + "triton" + os.sep + "runtime" + os.sep, os.sep + "triton" + os.sep + "backends" + os.sep)
    return any(any(p in f.filename for p in parts) for f in traceback.extract_tb(e.__traceback__))


def _short(x, limit: int = 160) -> str:
    """str(x) on one line, cut to ``limit`` characters (160 unless told: a counterexample's values)."""
    return one_line(x, limit)


OPS = ("gdn", "conv", "mamba2", "kda", "lightning")


def default_profile(device: str) -> str:
    return "serving" if str(device).startswith("cuda") else "quick"


# how a replayed example's launch is replayed (check's ``launch``): "graph", captured in a CUDA graph and replayed, as a
# server that replays its verify from CUDA graphs runs it (CUDA only; the default there); "eager", called again on the
# kept tensors, as a server that runs its verify without graphs on static buffers does (the CPU's only)
LAUNCHES = ("graph", "eager")


def default_launch(device: str) -> str:
    return "graph" if str(device).startswith("cuda") else "eager"


def _coverage(described: list[dict]) -> dict:
    """dimension -> the values seen: sorted distinct values, or [min, max] for ranges."""
    out: dict = {}
    for key in described[0] if described else []:
        vals = [d[key] for d in described if key in d]
        if key.endswith(" total"):
            out[key] = sum(vals)
        elif key.endswith(" min"):
            out[key] = min(vals)
        elif key.endswith(" max"):
            out[key] = max(vals)
        else:
            out[key] = sorted(set(vals), key=lambda v: (isinstance(v, str), v))
    return out


def check(kernel, *, mode: str, device: str = "cpu", max_examples: int = 100, dtype: torch.dtype = torch.float32,
          op: str = "gdn", profile: str | None = None, example_timeout: float | None = None, on_hang=None,
          launch: str | None = None, progress=None) -> CheckResult:
    """Check each property on the profile's explicit examples, then search it for a counterexample on
    drawn inputs; the results, with counterexamples (drawn ones shrunk), and the coverage. Inputs
    are drawn in ``dtype`` (recurrent states stay float32; the explicit examples add the other
    dtypes); the oracle computes in float64 from the same rounded values, and outputs are compared
    within the input dtype's tolerance. ``op`` "gdn" checks the recurrence (kernel.verify), "conv"
    the tree causal conv (kernel.conv), "mamba2" the Mamba2 tree verify (kernel.mamba2), "kda" the KDA verify
    (kernel.kda), "lightning" the lightning-attention verify (kernel.lightning).
    ``example_timeout``: seconds an explicit example may take; past it ``on_hang(label, seconds)`` is called
    from a watchdog thread (a hung GPU kernel cannot be interrupted: the command line reports it and exits).
    ``launch`` (LAUNCHES; default_launch on the device): how a replayed example (kernel_cases.replay_cases) replays
    the engine launch kept on its other step, from a CUDA graph ("graph", CUDA only) or called again ("eager").
    ``progress`` (a callable taking a line, or None): told as each serving example and each property's drawn search
    ends, with its wall time (what a long check spends its time on; nothing a verdict reads)."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    from ddsim import oracle
    from ddsim.engines import kernel_cases
    from ddsim.gpu_backend import poisoned
    profile = profile or default_profile(device)
    if profile not in kernel_cases.PROFILES:
        raise InputError(f"--profile: expected one of {', '.join(kernel_cases.PROFILES)}, got {profile!r}")
    launch = launch or default_launch(device)
    if launch not in LAUNCHES or (launch == "graph" and not str(device).startswith("cuda")):
        raise InputError(f"--launch: expected {' or '.join(LAUNCHES) if str(device).startswith('cuda') else 'eager'} "
                         f"on {device}, got {launch!r}")
    graph = launch == "graph"
    strategies = _strategies()
    extra = {}
    kernel.check_op(op, mode)
    nodes = (op, mode) in kernel.node_states  # it keeps every node's state: give it a buffer and check them
    # and commits them: run its commit after the verify and check the pool
    commit = functools.partial(kernel.commit, op) if kernel.commits(op, mode) else None
    if op == "conv":
        runner = _ConvRunner(kernel, mode, device, node_states=nodes, commit=commit, graph=graph)
        strategy = strategies.conv_pool_inputs(max_nodes=10, dtype=dtype, widths=kernel.conv_widths)
        extra = {"widths": kernel.conv_widths}
    elif op == "mamba2":
        runner = _Runner(kernel.mamba2, oracle.mamba2_tree_verify, ("x", "dt", "A", "B", "C"), ("D", "dt_bias"), mode,
                         device, node_states=nodes, commit=commit, graph=graph)
        strategy = strategies.mamba2_inputs(max_nodes=10, dtype=dtype, engine=True)
    elif op == "kda":
        runner = _Runner(kernel.kda, oracle.kda_tree_verify, ("q", "k", "v", "g", "beta"), (), mode, device,
                         node_states=nodes, commit=commit, graph=graph)
        strategy = strategies.kda_inputs(max_nodes=10, dtype=dtype, engine=True)
    elif op == "lightning":
        runner = _Runner(kernel.lightning, oracle.lightning_tree_verify, ("q", "k", "v"), ("decay",), mode, device,
                         node_states=nodes, commit=commit, graph=graph)
        strategy = strategies.lightning_inputs(max_nodes=10, dtype=dtype, engine=True)
    else:
        runner = _Runner(kernel.verify, oracle.gdn_tree_verify, ("q", "k", "v", "g", "beta"), (), mode, device,
                         extra={"scale": None}, node_states=nodes, commit=commit, graph=graph)
        strategy = strategies.gdn_pool_inputs(max_nodes=10, dtype=dtype)
    # no explain phase: find() reports only the shrunk input, and explaining it reruns the kernel many times over
    cfg = settings(max_examples=max_examples, database=None, derandomize=True, deadline=None,
                   suppress_health_check=list(HealthCheck), phases=[p for p in Phase if p != Phase.explain])
    props = runner.properties()
    described = []
    failed: dict[str, dict] = {}  # property -> counterexample (the first explicit example that fails it)
    leak_seen = None

    def leaks(r) -> bool:
        err = _node_errors(r["o"], r["ref"]["exact"])
        return bool((err[~r["order_exact"] & r["real"][:, None]] > 10 * _bound(r["ref"]["exact"], r["dtype"])).any())

    # padded batches (slot -1) where the kernel's convention has padding: SGLang's and vLLM's
    explicit = kernel_cases.cases(op, profile, dtype, pads=op in kernel.pads, nodes=nodes, commit=commit is not None,
                                  **extra)
    import threading
    lost = None  # where a fault ended the device's CUDA context: every call after it raises, so nothing is run after
    unchecked = []  # the explicit examples not run for that
    with poisoned():  # ddsim's own kernels (the ddsim adapter) NaN-fill their outputs here too
        for inp in explicit:
            if lost is not None:
                unchecked.append(inp["label"])
                continue
            described.append(kernel_cases.describe(inp, commit is not None))
            if "replay" in inp:  # how the launch was replayed: from a CUDA graph, or called again on its tensors
                described[-1]["engine launch"] += f" ({'CUDA graph' if graph else 'eager'})"
            watchdog = None
            if example_timeout is not None and on_hang is not None:
                watchdog = threading.Timer(example_timeout, on_hang, (inp["label"], example_timeout))
                watchdog.daemon = True
                watchdog.start()
            started = time.perf_counter()
            try:
                r = runner.run(inp)
            except Exception as e:  # a kernel that refuses or crashes on a serving shape fails every property
                for name in props:
                    failed.setdefault(name, {"property": name, "example": inp["label"], "error": raised_line(e, device)})
                if _device_lost(device):
                    lost = f"serving example [{inp['label']}]"
                continue
            finally:
                if watchdog is not None:
                    watchdog.cancel()
                if progress is not None:
                    progress(f"serving example [{inp['label']}]: {time.perf_counter() - started:.1f} s")
            for name, pred in props.items():
                if name not in failed and not pred(r):
                    failed[name] = _describe(inp, r, name, mode)
            if mode == "leaky" and leak_seen is None and leaks(r):
                leak_seen = inp["label"]
    results = []
    drawn = []

    ran: dict[str, dict] = {}  # drawn input's digest -> its run: derandomized, every property's search draws the
    # same inputs first, and each is run once for all of them (a shrink's new inputs run as they come)

    def run_drawn(inp):
        key = _input_digest(inp)
        if key not in ran:
            drawn.append(kernel_cases.describe(inp, commit is not None))
            ran[key] = runner.run(inp)
        return ran[key]

    def not_searched() -> str:  # the line of a property whose drawn search a lost context prevents
        after = f", nor the {len(unchecked)} serving examples after it run" if unchecked else ""
        return f"no drawn input searched{after}: a fault at {lost} ended the device's CUDA context"

    for name, pred in props.items():
        started = time.perf_counter()
        try:
            explicit_ce = failed.get(name)
            if lost is not None:  # every call would raise the fault's echo: not searched, and said so
                results.append(PropertyResult(name, False, (f"{_where(explicit_ce)}; " if explicit_ce else "")
                                              + not_searched(), explicit_ce))
                continue
            try:
                with poisoned():
                    bad = find(strategy, lambda inp, pred=pred: not pred(run_drawn(inp)), settings=cfg)
            except NoSuchExample:
                if explicit_ce is None:
                    results.append(PropertyResult(name, True, f"held on {len(explicit)} serving examples ({profile}) and "
                                                              f"{max_examples} drawn inputs"))
                else:  # only a serving shape reaches the bug: the explicit example is the counterexample
                    results.append(PropertyResult(name, False, _where(explicit_ce), explicit_ce))
                continue
            except Exception as e:  # the kernel raised on a drawn input: after a serving example's failure, that comes first
                drawn_line = f"{_failed(raised_line(e, device))} on a drawn input"
                if _device_lost(device):
                    lost = f"a drawn input of property {name!r}"
                results.append(PropertyResult(name, False, drawn_line if explicit_ce is None else
                                              f"{_where(explicit_ce)}; then {drawn_line}", explicit_ce))
                continue
            ce = _describe(bad, run_drawn(bad), name, mode)  # shrunk: the smallest tree that shows the bug, as it ran there
            if explicit_ce is not None:
                ce["serving_example"] = explicit_ce["example"]
            results.append(PropertyResult(name, False, _where(ce) + (f" (also on serving example [{ce['serving_example']}])"
                                                                     if explicit_ce is not None else ""), ce))
        finally:
            if progress is not None:
                progress(f"property {name!r}: {len(ran)} drawn inputs run so far, {time.perf_counter() - started:.1f} s")
    if mode == "leaky":
        # the leak must be there: some non-order-exact node differs from the exact output
        if leak_seen is not None:
            results.append(PropertyResult("leaks off order-exact nodes", True, f"e.g. serving example [{leak_seen}]"))
        elif lost is not None:
            results.append(PropertyResult("leaks off order-exact nodes", False, "no leak seen before the fault; "
                                          + not_searched()))
        else:
            try:
                with poisoned():
                    ex = find(strategy, lambda inp: leaks(runner.run(inp)), settings=cfg)
                results.append(PropertyResult("leaks off order-exact nodes", True,
                                              f"e.g. parents {[list(t.parents) for t in ex['trees']]}"))
            except NoSuchExample:
                results.append(PropertyResult("leaks off order-exact nodes", False,
                                              "never differed from exact verification: not the flattened path"))
            except Exception as e:  # the kernel raised on a drawn input: no leak seen, a failure like any other
                if _device_lost(device):
                    lost = "a drawn input of the leak's search"
                results.append(PropertyResult("leaks off order-exact nodes", False, f"no leak seen: "
                                              f"{_failed(raised_line(e, device))} on a drawn input"))
    return CheckResult(results, profile, len(explicit) - len(unchecked), _coverage(described + drawn), lost, unchecked)


def write_result(result: CheckResult, path: Path, *, kernel: dict, environment: dict) -> None:
    """The check's JSON: the kernel, what it ran under (ddsim.environment), profile, every property's verdict, the
    counterexamples and the coverage."""
    from ddsim.reports.json_report import write_atomic
    failing = [r.counterexample for r in result.properties if r.counterexample is not None]
    doc = {"kernel": kernel, "environment": environment, "profile": result.profile, "explicit_examples": result.examples,
           "properties": [{"name": r.name, "holds": r.holds, "detail": r.detail} for r in result.properties],
           "holds": all(r.holds for r in result.properties), "coverage": result.coverage, "counterexamples": failing,
           "context_lost_at": result.lost_at, "unchecked_examples": result.unchecked}
    write_atomic({path: json.dumps(doc, indent=1) + "\n"})
