"""An engine's step inputs checked on the device, with no host sync, so that a verify and a commit can be captured
in a CUDA graph (a server replays its verify from one, refilling the same tensors every step; nothing computed on the
host at capture is computed again, and a host read cannot be captured at all).

A check on the host raises; a check inside a graph cannot stop the graph. So here every input a sequence depends on
is checked on the device, and a sequence with an input it cannot trust fails closed: its gates are made NaN
(``poisoned``), so every output, node state and committed state of that sequence is NaN, never a wrong number.
Nothing is read or written outside the tensors handed over:

- ``DevicePlan``: a batch of trees [B, T] as an engine hands them over (SGLang's retrieve_parent_token; node 0 each
  tree's root, its entry not read). Its exact tables are built by one kernel (triton_tables.checked_tables); a node
  whose parent is not an earlier node flags its tree, and is read as the previous node's child, so every walk stays
  in the tree. Its depth is taken as T - 1, the most T nodes can have: the WY kernels' doubling rounds are then fixed
  per T (the extra rounds multiply by a zero power of the solve's matrix: the same bits).
- ``slots``: pool slots [B]; -1 is a padded row (SGLang's PAD_SLOT_ID), read as a zero state and never written. A
  slot outside the pool is flagged and read as padding (so neither read nor written); a slot two live rows share is
  flagged in both (a verify only reads it; the commit writes both sequences' NaN states there).
- ``rows``: a node-state buffer's rows [B] (the drop-in's intermediate_state_indices). A row outside the buffer is
  flagged and clamped into it: its sequence's NaN states land in a row of this step's scratch buffer, so a sequence
  whose row it is reads NaN where the two overlap, never another number. A row two sequences share is flagged in both.
- ``accepted``: the accepted node [B] of each sequence; one outside 0..T-1 is flagged and read as the root.

A padded row (slot -1) is never flagged: its outputs are not used.
"""
from __future__ import annotations

import contextlib

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

    For the flattened recurrence (mode "leaky") its tables are every node's predecessor's, as TreePlan's are."""

    def __init__(self, parents: torch.Tensor):
        from ddsim.gpu_backend import triton_tables
        if parents.dim() != 2:
            raise ValueError(f"parents: expected [B, T], got {tuple(parents.shape)}")
        self.B, self.T = parents.shape
        dev = parents.device
        src = torch.empty(self.B, self.T, dtype=torch.int64, device=dev)
        anc = torch.empty(self.B, self.T, self.T, dtype=torch.int8, device=dev)
        paths = torch.empty(self.B, self.T, self.T, dtype=torch.int32, device=dev)
        bad = torch.zeros(self.B, dtype=torch.int32, device=dev)
        triton_tables.checked_tables(parents, src=src, anc=anc, paths=paths, bad=bad)
        self.parents, self.device, self.bad = src, src.device, bad.bool()
        self._cache = {("src", "exact"): src, ("anc", "exact"): (anc, self.T - 1), ("paths",): paths}
        self.fast_verify, self.fast_commit, self.fast_states = [], [], []  # never recorded (fastcall's are TreePlan's)
        self.fast_tries = {"verify": 0, "commit": 0, "states": 0}
        self.serves_paths = True

    def ancestors(self, mode: str):
        if mode == "exact":
            return self._cache[("anc", "exact")]
        checks.mode_parents(self.parents, mode)  # the mode's name checked
        return self._cached(("anc", mode), lambda: (torch.ones(self.T, self.T, dtype=torch.int8, device=self.device)
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
