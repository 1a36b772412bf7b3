"""Drafters: per-depth draft logits [D, V] for the tree builder, one call per decoding step.

- SyntheticDrafter: derived from the target's own greedy continuation, the way a block-diffusion
  drafter's (DFlash) marginals behave: every depth is predicted independently from the same
  context, conditioned on the target's argmax path y_1..y_D (not on the tree). Knobs:
    accuracy      P(top-1 at depth 1 is y_1); depth d uses accuracy * accuracy_decay^(d-1)
    sharpness     logit gap (nats) between the drafter's top-1 and the background
    recall        when the top-1 is wrong, y_d still gets recall * sharpness extra logit, so
                  it tends to sit at rank 2-4, where branching recovers it
    noise         std of the Gaussian background logits
  The background weighs as much as BACKGROUND_TOKENS tokens at most: beyond that vocabulary size
  the planted tokens are lifted by log(V / BACKGROUND_TOKENS), so the knobs mean the same on a
  512-token preset and a 248k-token checkpoint (without it, a real vocabulary's tail would swallow
  the planted tokens and DDTree would spend its budget on depth-1 siblings).
  Deterministic from (seed, step).
- TraceDrafter: replays per-step, per-depth top-k (token, logprob) records from a JSONL file as a
  serving stack can dump them (format below).
- ModelDrafter: a draft model (a checkpoint ddsim reads) run autoregressively on each generation's
  own prefix: depth d's logits are the draft model's after the root and its own top-1 tokens of
  depths 1..d-1 (a chain drafter's marginals, as EAGLE's and MTP's are).
- The chain baseline (DFlash / MTP linear draft) is the tree policy "chain": budget = depth,
  top-1 only, over any drafter's logits.

Trace format, one JSON object per line, line i = decoding step i:
  {"step": 0, "vocab_size": 512, "depths": [[[token, logprob], ...], ...]}
``depths[d]`` lists depth d+1's top-k candidates (k >= 1, the same k on every depth of a line,
distinct tokens, finite logprobs <= 0). ``vocab_size`` must equal the model's. Unlisted tokens get
a log-prob far below the listed ones, and the builder's top-k is capped at the listed k.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from ddsim.errors import InputError
from ddsim.jsonl import read_jsonl
from ddsim.trees.seeds import derive_seed
from ddsim.values import is_int, is_real


class Drafter(Protocol):
    """What the speculative loop needs of a drafter (ddsim.sim.generate.speculative, ddsim.measure.audit)."""
    depth: int  # rows of draft logits per step: the deepest draft position
    max_rank: int | None  # a cap on the per-depth top-k the drafter can rank (None: the vocabulary)
    needs_greedy: bool  # whether draft() wants the target's greedy continuation in ctx.greedy

    def draft(self, ctx: "DraftContext") -> torch.Tensor:
        """[depth, V] float draft logits for one step."""

    def params(self) -> dict:
        """What the report records about this drafter: {"kind": ..., knobs...}."""


@dataclass
class DraftContext:
    """What a drafter may look at for one step."""
    step: int
    tokens: list[int]  # committed tokens so far, ending with the root (last emitted) token
    greedy: list[int] | None = None  # target's greedy continuation after the root (synthetic only)


class SyntheticDrafter:
    needs_greedy = True
    BACKGROUND_TOKENS = 512
    DRAWS_KEPT = 4  # steps whose draws are kept (generations in lock step share one step's)

    def __init__(self, *, vocab_size: int, depth: int = 8, accuracy: float = 0.75, accuracy_decay: float = 0.92,
                 sharpness: float = 8.0, recall: float = 0.6, noise: float = 1.0, seed: int = 0):
        for name, v, lo, hi in (("accuracy", accuracy, 0, 1), ("accuracy_decay", accuracy_decay, 0, 1),
                                ("recall", recall, 0, 1)):
            if not lo <= v <= hi:
                raise InputError(f"{name}: expected a value in [{lo}, {hi}], got {v}")
        if depth < 1:
            raise InputError(f"depth: expected >= 1, got {depth}")
        if sharpness < 0 or noise < 0:
            raise InputError("sharpness, noise: expected >= 0")
        self.vocab_size, self.depth, self.seed = vocab_size, depth, seed
        self.accuracy, self.accuracy_decay = accuracy, accuracy_decay
        self.sharpness, self.recall, self.noise = sharpness, recall, noise
        self.max_rank = None
        self._kept: dict = {}  # step -> its draws (_draws), least recently used first

    def params(self) -> dict:
        return {"kind": "synthetic", "depth": self.depth, "accuracy": self.accuracy,
                "accuracy_decay": self.accuracy_decay, "sharpness": self.sharpness,
                "recall": self.recall, "noise": self.noise, "seed": self.seed}

    def _draws(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step ``step``'s seeded draws, in the generator's order: the background logits [D, V] float64
        (times ``noise``), the uniforms u [D] deciding each depth's hit, the wrong tokens [D]. They
        depend on (seed, step) alone, so every generation at a step shares them: the last
        DRAWS_KEPT steps' are kept (read-only) and not drawn again; at a 248k vocabulary one step's
        background is 2M normals, about 30 ms of a host core."""
        draws = self._kept.pop(step, None)
        if draws is None:
            gen = torch.Generator().manual_seed(derive_seed(self.seed, "synthetic-drafter", step))
            D, V = self.depth, self.vocab_size
            background = torch.randn(D, V, generator=gen, dtype=torch.float64) * self.noise
            draws = (background, torch.rand(D, generator=gen, dtype=torch.float64), torch.randint(0, V, (D,), generator=gen))
            while len(self._kept) >= self.DRAWS_KEPT:
                self._kept.pop(next(iter(self._kept)))  # the least recently used
        self._kept[step] = draws  # most recently used last
        return draws

    def draft(self, ctx: DraftContext) -> torch.Tensor:
        """[D, V] float64 draft logits."""
        if ctx.greedy is None or len(ctx.greedy) < self.depth:
            raise InputError("synthetic drafter: needs the target's greedy continuation of `depth` tokens")
        D, V = self.depth, self.vocab_size
        background, u, wrong = self._draws(ctx.step)
        logits = background.clone()
        lift = math.log(max(V, self.BACKGROUND_TOKENS) / self.BACKGROUND_TOKENS)  # 0 up to 512 tokens
        for d in range(D):
            y = int(ctx.greedy[d])
            acc = self.accuracy * self.accuracy_decay ** d
            if u[d] < acc or V == 1:
                logits[d, y] += self.sharpness + lift
            else:
                w = int(wrong[d]) if int(wrong[d]) != y else (y + 1) % V
                logits[d, w] += self.sharpness + lift
                logits[d, y] += self.recall * self.sharpness + lift
        return logits


class TraceDrafter:
    needs_greedy = False

    def __init__(self, path: str | Path, *, vocab_size: int):
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.steps: list[list[list[tuple[int, float]]]] = []
        depth = None
        for where, rec in read_jsonl(self.path, "trace"):
            if not isinstance(rec, dict) or "depths" not in rec:
                raise InputError(f"{where}: expected an object with 'depths'")
            for key in ("vocab_size", "step"):  # JSON integers: true or 1.0 equals 1 in Python
                if key in rec and not is_int(rec[key]):
                    raise InputError(f"{where}: '{key}' must be an integer, got {rec[key]!r}")
            if rec.get("vocab_size", vocab_size) != vocab_size:
                raise InputError(f"{where}: vocab_size {rec.get('vocab_size')} differs from the model's {vocab_size}")
            if rec.get("step", len(self.steps)) != len(self.steps):
                raise InputError(f"{where}: step {rec.get('step')} out of order (expected {len(self.steps)})")
            depths = rec["depths"]
            if not isinstance(depths, list) or not depths:
                raise InputError(f"{where}: 'depths' must be a non-empty list")
            if depth is None:
                depth = len(depths)
            elif len(depths) != depth:
                raise InputError(f"{where}: {len(depths)} depths, earlier lines have {depth} (missing depths)")
            parsed = []
            k = None
            for d, cands in enumerate(depths, start=1):
                if not isinstance(cands, list) or not cands:
                    raise InputError(f"{where}: depth {d} has no candidates (missing depth)")
                if k is None:
                    k = len(cands)
                elif len(cands) != k:
                    raise InputError(f"{where}: depth {d} has {len(cands)} candidates, depth 1 has {k}")
                row, seen = [], set()
                for c in cands:
                    if not (isinstance(c, list) and len(c) == 2):
                        raise InputError(f"{where}: depth {d}: candidate {c!r} is not [token, logprob]")
                    tok, lp = c
                    if not is_int(tok) or not 0 <= tok < vocab_size:
                        raise InputError(f"{where}: depth {d}: unknown token {tok!r} (vocab {vocab_size})")
                    if not is_real(lp) or not math.isfinite(lp) or lp > 1e-6:
                        raise InputError(f"{where}: depth {d}: logprob {lp!r} is not a finite log-probability")
                    if tok in seen:
                        raise InputError(f"{where}: depth {d}: token {tok} listed twice")
                    seen.add(tok)
                    row.append((tok, float(lp)))
                parsed.append(row)
            self.steps.append(parsed)
        if not self.steps:
            raise InputError(f"{self.path}: trace has no records")
        self.depth = depth
        self.max_rank = min(len(s[0]) for s in self.steps)

    def params(self) -> dict:
        return {"kind": "trace", "path": str(self.path), "steps": len(self.steps), "depth": self.depth,
                "topk": self.max_rank}

    def draft(self, ctx: DraftContext) -> torch.Tensor:
        if ctx.step >= len(self.steps):
            raise InputError(f"{self.path}: trace has {len(self.steps)} steps, step {ctx.step} was asked for")
        rows = self.steps[ctx.step]
        floor = min(lp for row in rows for _, lp in row) - 50.0
        logits = torch.full((len(rows), self.vocab_size), floor, dtype=torch.float64)
        for d, row in enumerate(rows):
            for tok, lp in row:
                logits[d, tok] = lp
        return logits


class ModelDrafter:
    """A real drafter in the loop: a small checkpoint of the same vocabulary, decoding greedily from
    each step's committed tokens (prefilled afresh each step, so a draft depends on the prefix alone,
    not on the calls before it). Deterministic: greedy, float32 on the CPU. A draft is a function of the
    tokens alone, so the last MEMO drafts are kept by their tokens and a context seen again is not decoded
    again (an audit's generations of one prompt share their first contexts across budgets and modes: the
    default audit drafts 123 distinct contexts in 312 calls)."""
    needs_greedy = False
    max_rank = None
    MEMO = 512

    def __init__(self, path: str | Path, *, vocab_size: int, depth: int = 8, device="cpu"):
        from ddsim.model.checkpoint import checkpoint_digest, load_checkpoint
        from ddsim.model.model import HybridModel
        cfg, weights, _ = load_checkpoint(path, device=device)
        if cfg.vocab_size != vocab_size:
            raise InputError(f"--drafter-model {path}: vocabulary of {cfg.vocab_size} tokens, the target has {vocab_size}")
        if depth < 1:
            raise InputError(f"depth: expected >= 1, got {depth}")
        self.path, self.depth, self.vocab_size = str(path), depth, vocab_size
        self.sha256 = checkpoint_digest(path)
        self.model = HybridModel(cfg, weights, device=device, dtype=torch.float32)
        self._memo: OrderedDict = OrderedDict()  # tuple(tokens) -> [D, V] float64, oldest first

    def params(self) -> dict:
        return {"kind": "model", "path": self.path, "sha256": self.sha256, "depth": self.depth}

    def draft(self, ctx: DraftContext) -> torch.Tensor:
        """[D, V] float64: the draft model's logits at depths 1..D along its own greedy chain, decoded as a server's
        draft model decodes it (the model's decoder: one token a pass from buffers packed once); a new tensor."""
        key = tuple(int(t) for t in ctx.tokens)
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key].clone()
        rows = self._decode(ctx)
        self._memo[key] = rows
        if len(self._memo) > self.MEMO:
            self._memo.popitem(last=False)
        return rows.clone()

    def _decode(self, ctx: DraftContext) -> torch.Tensor:
        state, _ = self.model.prefill(list(ctx.tokens[:-1]))  # a function of the prefix alone
        dec = self.model.decoder([state], steps=self.depth)
        rows, tok = [], int(ctx.tokens[-1])
        for _ in range(self.depth):
            logits = dec.step([tok])[0]
            rows.append(logits.double())
            tok = int(logits.argmax())
        return torch.stack(rows)
