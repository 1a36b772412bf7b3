"""An engine's step inputs checked on the device, with no host sync, so that a verify and a commit can be captured
in a CUDA graph (a server replays its verify from one, refilling the same tensors every step; nothing computed on the
host at capture is computed again, and a host read cannot be captured at all).

A check on the host raises; a check inside a graph cannot stop the graph. So here every input a sequence depends on
is checked on the device, and a sequence with an input it cannot trust fails closed: its gates are made NaN
(``poisoned``), so every output, node state and committed state of that sequence is NaN, never a wrong number.
Nothing is read or written outside the tensors handed over:

- ``DevicePlan``: a batch of trees [B, T] as an engine hands them over (SGLang's retrieve_parent_token; node 0 each
  tree's root, its entry not read). Its exact tables are built by one kernel (triton_tables.checked_tables, or the
  step's, ``step``); a node whose parent is not an earlier node flags its tree, and is read as the previous node's
  child, so every walk stays in the tree. The kernel writes each tree's depth too (per block of 32 nodes,
  ``depth_table``): the WY kernels take each sequence's doubling rounds from it (triton_helpers.tree_depth), where a
  host plan's come from its deepest tree. Its depth as the host sees it is T - 1, the most T nodes can have (a bound:
  the extra rounds multiply by a zero power of the solve's matrix, the same bits).
- ``slots``: pool slots [B]; -1 is a padded row (SGLang's PAD_SLOT_ID), read as a zero state and never written. A
  slot outside the pool is flagged and read as padding (so neither read nor written); a slot two live rows share is
  flagged in both (a verify only reads it; the commit writes both sequences' NaN states there).
- ``rows``: a node-state buffer's rows [B] (the drop-in's intermediate_state_indices). A row outside the buffer is
  flagged and clamped into it: its sequence's NaN states land in a row of this step's scratch buffer, so a sequence
  whose row it is reads NaN where the two overlap, never another number. A row two sequences share is flagged in both.
- ``accepted``: the accepted node [B] of each sequence; one outside 0..T-1 is flagged and read as the root.
- ``segments``: packed inputs' offsets cu_seqlens [B + 1]; unless they are B segments of T, every live sequence is
  flagged.

A padded row (slot -1) is flagged only for its buffer row: its outputs are not used.

``step`` runs every check of a call and builds a raw tree's tables in one kernel (triton_checks.step_checks, its
tables as triton_tables.checked_tables writes them); the torch functions here, with checked_tables for the tree, are
its reference (``step_reference``), which the tests hold it to.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ddsim.gpu_backend import checks

_FORCED = [False]


@contextlib.contextmanager
def forced():
    """Take the device-checked path outside a CUDA graph's capture too (the interpreter's tests of it on the CPU)."""
    before, _FORCED[0] = _FORCED[0], True
    try:
        yield
    finally:
        _FORCED[0] = before


def capturing(x: torch.Tensor) -> bool:
    """Whether a call on x must not sync with the host: x's stream is being captured into a CUDA graph (or
    ``forced``)."""
    if _FORCED[0]:
        return True
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


class DevicePlan(checks.TreePlan):
    """A batch of trees [B, T] (int32 or int64, node 0 each tree's root) with its exact tables built on the device
    and no host sync: a TreePlan for the Triton kernels (src, ancestors, root_paths), built afresh for each call
    inside a graph, since its tree changes from step to step. ``bad`` [B] bool: the trees with a node whose parent is
    not an earlier node (their tables are those of the tree with each such node under the previous one).

    For the flattened recurrence (mode "leaky") its tables are every node's predecessor's, as TreePlan's are; the
    step kernel writes a batch of chains' by formula (``step(chain=True)``), a plan serving both modes."""

    def __init__(self, parents: torch.Tensor):
        from ddsim.gpu_backend import triton_tables
        if parents.dim() != 2:
            raise ValueError(f"parents: expected [B, T], got {tuple(parents.shape)}")
        src, anc, paths, bad, depths = triton_tables.batch_tables(*parents.shape, parents.device)
        triton_tables.checked_tables(parents, src=src, anc=anc, paths=paths, bad=bad, depths=depths)
        self._built(src, anc, paths, bad, depths)

    @classmethod
    def of_tables(cls, src, anc, paths, bad, depths) -> "DevicePlan":
        """The plan of tables checked_tables' kernel (or the step kernel, ``step``) wrote: src [B, T] int64, anc
        [B, T, T] int8, paths [B, T, T] int32, bad and depths [B, blocks(T)] int32; bad and depths None: a chain's
        tables (nothing to flag, its depth T - 1), serving leaky mode as well."""
        plan = cls.__new__(cls)
        plan._built(src, anc, paths, bad, depths)
        return plan

    def _built(self, src, anc, paths, bad, depths) -> None:
        self.B, self.T = src.shape
        self.bad_blocks, self.depths = bad, depths
        self.parents, self.device = src, src.device
        self._cache = {("src", "exact"): src, ("anc", "exact"): (anc, self.T - 1), ("paths",): paths}
        if bad is None:  # a chain's (the step kernel's, by formula): its tables are leaky mode's too
            self._cache.update({("src", "leaky"): src, ("anc", "leaky"): (anc, self.T - 1), ("paths", "leaky"): paths})
        self.fast_verify, self.fast_commit, self.fast_states = [], [], []  # never recorded (fastcall's are TreePlan's)
        self.fast_tries = {"verify": 0, "commit": 0, "states": 0}
        self.serves_paths = True

    @property
    def bad(self) -> torch.Tensor:
        """[B] bool: the trees with a node whose parent is not an earlier node (torch; the step kernel reads the
        blocks' flags itself)."""
        if self.bad_blocks is None:
            return torch.zeros(self.B, dtype=torch.bool, device=self.device)
        return self.bad_blocks.bool().any(1)

    def depth_table(self, mode: str):
        """int32 [B, blocks(T)] each tree's depth per block of 32 nodes, as the kernel wrote it, for mode "exact"
        where the plan is a tree's; else None (a chain's depth is T - 1, ``ancestors``' bound)."""
        return self.depths if mode == "exact" else None

    def ancestors(self, mode: str):
        if mode == "exact" and ("anc", "exact") in self._cache:
            return self._cache[("anc", "exact")]
        checks.check_mode(mode)  # (no tensor made for it, as mode_parents would)
        return self._cached(("anc", "leaky"), lambda: (torch.ones(self.T, self.T, dtype=torch.int8, device=self.device)
                                                    .tril().expand(self.B, -1, -1).contiguous(), self.T - 1))

    def conv_table(self, mode: str, W: int):
        raise RuntimeError("DevicePlan: no conv tables (a GDN verify's and commit's plan)")


def slots(indices: torch.Tensor, N: int, name: str) -> tuple[checks.CheckedSlots, torch.Tensor]:
    """(the slots to launch with, bad [B] bool) of pool slots indices [B] in a pool of N rows, on the device (see
    the module's note). The CheckedSlots counts every row as possibly padded: which are is not known on the host."""
    idx = _indices(indices, name)
    live = idx != checks.PAD_SLOT
    inside = (idx >= 0) & (idx < N)
    bad = live & (~inside | _shared(idx, inside))
    return checks.CheckedSlots(torch.where(inside, idx, checks.PAD_SLOT), N, padded=idx.shape[0]), bad


def rows(indices: torch.Tensor, N: int, name: str) -> tuple[checks.CheckedSlots, torch.Tensor]:
    """(the rows to launch with, bad [B] bool) of a node-state buffer's rows indices [B] in a buffer of N rows, on the
    device (see the module's note)."""
    idx = _indices(indices, name)
    inside = (idx >= 0) & (idx < N)
    bad = ~inside | _shared(idx, inside)
    return checks.CheckedSlots(idx.clamp(0, N - 1), N), bad


def accepted(indices: torch.Tensor, B: int, T: int) -> tuple[checks.CheckedIndices, torch.Tensor]:
    """(the accepted nodes to launch with, bad [B] bool) of accepted [B], on the device (see the module's note)."""
    idx = _indices(indices, "accepted", B)
    inside = (idx >= 0) & (idx < T)
    return checks.CheckedIndices(torch.where(inside, idx, 0), T), ~inside


def segments(cu_seqlens: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """[B] bool: every sequence, unless the offsets cu_seqlens [B + 1] are B segments of T (on the device)."""
    return (cu_seqlens.long() != torch.arange(B + 1, device=cu_seqlens.device) * T).any().expand(B)


def poisoned(a: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """a [B, T, HV] (the gates' input) with every flagged sequence's entries NaN: its decay is NaN, and with it every
    output and state the sequence has."""
    return torch.where(bad.view(-1, *[1] * (a.dim() - 1)), float("nan"), a)


def _indices(indices, name: str, B: int | None = None) -> torch.Tensor:
    """int64 [B] of an integer tensor [B] (its shape and dtype are the host's to check: refused in one line)."""
    if (not isinstance(indices, torch.Tensor) or indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64)
            or (B is not None and indices.shape[0] != B)):
        got = f"{indices.dtype} {tuple(indices.shape)}" if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise ValueError(f"{name}: expected an integer tensor [B]{f' = [{B}]' if B is not None else ''}, got {got}")
    return indices.long()


def _shared(idx: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """[B] bool: the rows whose index, inside, another row inside has too."""
    same = (idx[:, None] == idx[None, :]) & inside[:, None] & inside[None, :]
    same.fill_diagonal_(False)
    return same.any(1)


@dataclass
class Step:
    """A call's inputs as launched after the device checks: the plan (a DevicePlan of the tree's tables where the call
    gave a tree as read, else the plan it gave), the slots (CheckedSlots of the pool, -1 for padding and
    for a slot outside it), the buffer's rows (CheckedSlots, clamped into it) and accepted nodes (CheckedIndices)
    where given, the gates' inputs a, b [B, T, HV] (NaN for a flagged sequence), and the flags [B] (nonzero: a
    sequence flagged; ``bad`` as bool, made when read: the call itself never reads it, and under capture a cast is
    one more kernel in the graph)."""
    plan: checks.TreePlan | None
    slots: checks.CheckedSlots
    rows: checks.CheckedSlots | None
    accepted: checks.CheckedIndices | None
    a: torch.Tensor
    b: torch.Tensor
    flags: torch.Tensor

    @property
    def bad(self) -> torch.Tensor:
        return self.flags.bool()


def step(*, a, b, slots, N: int, tree=None, chain: bool = False, plan=None, rows=None, N_buf: int = 0,
         accepted=None, cu_seqlens=None, names: dict | None = None) -> Step:
    """Every check of a call on the device in one kernel (triton_checks.step_checks): slots [B] of a pool of N rows,
    tree [B, T] a batch of trees as an engine hands it over (their tables built in the same launch: Step.plan), or
    chain (the flattened recurrence's chains, their tables built in the launch), or else plan a TreePlan (validated
    before) or a DevicePlan (its trees' flags read), rows [B] of a node-state buffer of N_buf rows, accepted [B],
    cu_seqlens [B + 1]; a, b [B, T, HV] the gates' inputs; ``names``: the caller's names of these arguments, for
    the refusals (triton_checks.step_checks)."""
    from ddsim.gpu_backend import triton_checks
    B, T, _ = a.shape
    if (tree is not None) + bool(chain) + (plan is not None) > 1:
        raise ValueError("step: one of a tree as read, a chain, or a plan")
    tree_bad = plan.bad_blocks if isinstance(plan, DevicePlan) else None
    s, r, acc, a2, b2, bad, tables = triton_checks.step_checks(
        slots=slots, N=N, a=a, b=b, tree=tree, chain=chain, tree_bad=tree_bad, rows=rows, N_buf=N_buf,
        accepted=accepted, cu_seqlens=cu_seqlens, names=names)
    return Step(DevicePlan.of_tables(*tables) if tables is not None else plan, checks.CheckedSlots(s, N, padded=B),
                None if r is None else checks.CheckedSlots(r, N_buf),
                None if acc is None else checks.CheckedIndices(acc, T), a2, b2, bad)


def step_reference(*, a, b, slots, N: int, tree=None, chain: bool = False, plan=None, rows=None, N_buf: int = 0,
                   accepted=None, cu_seqlens=None) -> Step:
    """``step`` in torch, from the functions above (a tree's tables from checked_tables' kernel, a chain's a
    TreePlan's): its reference."""
    B, T, _ = a.shape
    if tree is not None:
        plan = DevicePlan(tree)
    if chain:
        plan = checks.TreePlan(torch.arange(-1, T - 1, device=a.device).repeat(B, 1))
    checked, bad = globals()["slots"](slots, N, "initial_state_indices")
    live = slots.long() != checks.PAD_SLOT
    if isinstance(plan, DevicePlan):
        bad = bad | (plan.bad & live)
    acc = None
    if accepted is not None:
        acc, wrong = globals()["accepted"](accepted, B, T)
        bad = bad | (wrong & live)
    if cu_seqlens is not None:
        bad = bad | (segments(cu_seqlens, B, T) & live)
    r = None
    if rows is not None:
        r, wrong = globals()["rows"](rows, N_buf, "intermediate_state_indices")
        bad = bad | wrong
    return Step(plan, checked, r, acc, poisoned(a, bad).contiguous(), poisoned(b, bad).contiguous(), bad)
