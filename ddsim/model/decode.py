"""Batched decode of several sequences over a run of tokens: a serving stack's decode batch.

The audit decodes every prompt's reference, and every generation's greedy continuation, one token of
each sequence per pass over the weights. ``DecodeBuffers`` holds B sequences' committed states packed
once for a whole run of passes (per attention layer the KV [B, capacity, nkv, hd], per recurrent layer
the states [B, ...] and conv windows [B, ...]); each pass (``HybridModel.decode_pass``) writes every
row's new key and value at its position and advances its recurrent state and window in place. So a
pass does no per-row work on the host: no stacking of states, no padding of prefixes, no
concatenation of each row's KV, all of which cost a launch per row and layer when the rows were
ModelStates. ``RowDecoder`` drives it: ``step(tokens)`` one pass, ``state(b)`` a row's ModelState.

A ddsim.model.graphs.GraphedModel replays the pass from a CUDA graph captured for its (rows, capacity):
the buffers are at fixed addresses and the pass reads its tokens and positions from them.
"""
from __future__ import annotations

from typing import Callable

import torch

import ddsim.gpu_backend as gb
from ddsim.errors import InputError
from ddsim.model.state import ModelState


class DecodeBuffers:
    """B rows' states for one-token passes, each layer's on its own device: per attention layer
    (K, V) [B, capacity, nkv, hd], per recurrent layer states [B, ...] and windows [B, ...], all in
    the model's state dtype; ``tokens`` and ``positions`` [B] (long, on the embedding's device) say
    what each row feeds next and at which position (its committed length: where its new key goes).
    ``pos`` holds the positions on the host (no device read to check them)."""

    def __init__(self, model, rows: int, capacity: int):
        cfg = model.cfg
        self.rows, self.capacity = rows, capacity
        L, dt = cfg.num_layers, model.state_dtype
        self.kv, self.ssm, self.conv = [None] * L, [None] * L, [None] * L
        for i in cfg.attention_layers:
            shape, d = (rows, capacity, cfg.num_key_value_heads, cfg.head_dim), model.layer_devices[i]
            self.kv[i] = (torch.zeros(shape, dtype=dt, device=d), torch.zeros(shape, dtype=dt, device=d))
        for i in cfg.recurrent_layers:
            d = model.layer_devices[i]
            self.ssm[i] = torch.zeros((rows, *cfg.state_shape(i)), dtype=dt, device=d)
            self.conv[i] = torch.zeros((rows, *cfg.window_shape(i)), dtype=dt, device=d)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=model.device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=model.device)
        self.pos = [0] * rows
        self._per_device: dict = {}

    def tables(self, d: torch.device):
        """(the plan of B one-node trees [B, 1], the row indices [B], the slots [capacity]) on device d,
        made once (before any capture)."""
        if d not in self._per_device:
            self._per_device[d] = (gb.TreePlan(torch.full((self.rows, 1), -1, dtype=torch.long, device=d)),
                                   torch.arange(self.rows, device=d), torch.arange(self.capacity, device=d))
        return self._per_device[d]

    def load(self, states: list) -> None:
        """Pack ``states`` into rows 0..n-1 (rows past them keep whatever they hold: their outputs are
        never read). Each state's KV goes to its row's first ``pos`` slots."""
        for i, kv in enumerate(self.kv):
            if kv is not None:
                for b, st in enumerate(states):
                    kv[0][b, :st.pos].copy_(st.kv[i][0], non_blocking=True)
                    kv[1][b, :st.pos].copy_(st.kv[i][1], non_blocking=True)
        n = len(states)
        for i, s in enumerate(self.ssm):
            if s is not None:
                s[:n].copy_(torch.stack([st.ssm[i] for st in states]), non_blocking=True)
                self.conv[i][:n].copy_(torch.stack([st.conv[i] for st in states]), non_blocking=True)
        self.pos = [st.pos for st in states] + [0] * (self.rows - n)

    def feed(self, tokens: list) -> None:
        """The next pass's tokens for rows 0..n-1 (the other rows feed token 0) at the rows' positions."""
        toks = list(tokens) + [0] * (self.rows - len(tokens))
        self.tokens.copy_(torch.tensor(toks, dtype=torch.long), non_blocking=True)
        self.positions.copy_(torch.tensor(self.pos, dtype=torch.long), non_blocking=True)

    def row(self, b: int, *, copy: bool) -> ModelState:
        """Row b's committed state: views into the buffers, or (copy) its own memory."""
        return self._state(b, (lambda x: x.clone()) if copy else (lambda x: x))

    def _state(self, b: int, own) -> ModelState:
        """Row b's committed state, each of its tensors (views into the buffers) passed through ``own``."""
        n = self.pos[b]
        return ModelState(n, [None if kv is None else (own(kv[0][b, :n]), own(kv[1][b, :n])) for kv in self.kv],
                          [None if s is None else own(s[b]) for s in self.ssm],
                          [None if c is None else own(c[b]) for c in self.conv])

    def rows_of(self, bs: list[int]) -> list[ModelState]:
        """Rows ``bs``' committed states, each in memory of its own (as ``row(b, copy=True)``: a state kept
        past its batch must not hold the others' alive), copied by one multi-tensor copy per dtype for all
        of them (row by row, a 64-layer model's 32 rows are some 4,000 copy launches)."""
        src, dst = {}, {}

        def own(x):
            d = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            src.setdefault(x.dtype, []).append(x)
            dst.setdefault(x.dtype, []).append(d)
            return d
        out = [self._state(b, own) for b in bs]
        for dtype, xs in src.items():
            torch._foreach_copy_(dst[dtype], xs)
        return out


class RowDecoder:
    """Decode n sequences together from their committed ``states``: ``step(tokens)`` feeds token b to
    row b and returns the logits [n, vocab] (float32, the caller's own), every row moving on by one;
    ``state(b)`` is row b's state after the steps so far. ``run()`` runs one pass on ``buffers``
    (rows >= n, capacity >= each row's position + the steps it will take) and returns its logits
    [rows, vocab]; ``fresh()`` says the buffers still hold this decoder's rows (a GraphedModel reuses
    them for its next decoder)."""

    def __init__(self, model, buffers: DecodeBuffers, states: list, *, run: Callable[[], torch.Tensor],
                 fresh: Callable[[], bool] | None = None):
        self.model, self.buffers, self.n = model, buffers, len(states)
        self._run, self._fresh = run, fresh
        buffers.load(states)

    def _check_fresh(self) -> None:
        if self._fresh is not None and not self._fresh():
            raise InputError("decoder: its buffers were taken by a later decoder of the same shape")

    def step(self, tokens) -> torch.Tensor:
        cfg, buf = self.model.cfg, self.buffers
        toks = [int(t) for t in tokens]
        if len(toks) != self.n:
            raise InputError(f"decoder: {len(toks)} tokens for {self.n} rows (one each)")
        if toks and (max(toks) >= cfg.vocab_size or min(toks) < 0):
            raise InputError(f"decoder: a token outside the vocabulary ({cfg.vocab_size})")
        top = max(buf.pos[:self.n])
        if top >= cfg.max_position_embeddings:
            raise InputError(f"decoder: a position beyond the model's {cfg.max_position_embeddings}")
        if top >= buf.capacity:
            raise InputError(f"decoder: position {top} is past the buffers' {buf.capacity} slots")
        self._check_fresh()
        buf.feed(toks)
        logits = self._run()[: self.n].clone()
        buf.pos = [p + 1 for p in buf.pos]
        return logits

    def state(self, b: int, *, copy: bool = True) -> ModelState:
        """Row b's state now; copy=False: views into the buffers (valid until the next step)."""
        self._check_fresh()
        return self.buffers.row(b, copy=copy)

    def states(self, bs: list[int]) -> list[ModelState]:
        """Rows ``bs``' states now, each its own memory, copied out together (DecodeBuffers.rows_of)."""
        self._check_fresh()
        return self.buffers.rows_of(list(bs))
