"""Whole generations: prompt -> N tokens, autoregressive or speculative in one verify mode.

A speculative step (README, Contracts: verify modes and acceptance): draft logits -> tree (root = last emitted token) -> verify the tree
in the mode from the committed state -> a target token per node -> walk -> emit the accepted
draft tokens and the bonus token -> commit what the mode computed at the accepted node.

Every step is also judged against exact verification from the same committed state (a silent
corruption step emits tokens that exact verification would not), and, when ``measure="full"``,
against the float64 oracle per node and per layer, with the exact fast path's error beside it as
the numerical noise floor.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ddsim import oracle
from ddsim.errors import InputError
from ddsim.measure.metrics import node_keys, node_metrics, reference_norms
from ddsim.model.model import HybridModel
from ddsim.sampling.law import length_tv, total_variation
from ddsim.sampling.rules import probabilities
from ddsim.sim.acceptance import (
    accept_with_rule,
    decision_margins,
    decision_scores,
    emitted_tokens,
    step_law_of,
    target_tokens,
    walk,
)
from ddsim.sim.drafters import DraftContext, Drafter
from ddsim.sim.memory import footprint
from ddsim.sim.timing import timed
from ddsim.trees.builders import check_whole, ddtree, is_whole
from ddsim.trees.modes import VERIFY_MODES
from ddsim.trees.tree import Tree, chain


@dataclass(frozen=True)
class TreePolicy:
    """How a step's tree is built from draft logits: "ddtree" (best-first, ``budget`` nodes) or
    "chain" (the linear DFlash/MTP baseline: budget = depth, top-1 only)."""
    kind: str = "ddtree"
    budget: int = 32
    topk_cap: int | None = None

    def __post_init__(self):
        if self.kind not in ("ddtree", "chain"):
            raise InputError(f"tree policy: expected 'ddtree' or 'chain', got {self.kind!r}")
        if self.kind == "ddtree":
            check_whole("budget", self.budget, 0)
        if self.topk_cap is not None and not is_whole(self.topk_cap, 1):
            raise InputError(f"topk_cap: expected None or an integer >= 1, got {self.topk_cap!r}")

    def build(self, draft_logits: torch.Tensor, *, root_token: int, max_rank: int | None = None) -> Tree:
        if self.kind == "chain":
            return ddtree(draft_logits, draft_logits.shape[0], topk_cap=1, root_token=root_token)
        caps = [c for c in (self.topk_cap, max_rank) if c]
        return ddtree(draft_logits, self.budget, min(caps) if caps else None, root_token=root_token)

    def label(self) -> str:
        return "chain" if self.kind == "chain" else f"ddtree-{self.budget}" + (f"-cap{self.topk_cap}" if self.topk_cap else "")


def _check_prompt(model: HybridModel, prompt, n_tokens: int, extra: int = 0) -> list[int]:
    prompt = [int(t) for t in prompt]
    cfg = model.cfg
    if not prompt:
        raise InputError("prompt: empty (at least one token is needed as the first root)")
    if n_tokens < 1:
        raise InputError(f"steps: expected at least 1 token to generate, got {n_tokens}")
    bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
    if bad:
        raise InputError(f"prompt: token {bad[0]} is outside the vocabulary ({cfg.vocab_size})")
    need = len(prompt) + n_tokens + extra
    if need > cfg.max_position_embeddings:
        raise InputError(f"prompt: {len(prompt)} tokens + {n_tokens} generated (+{extra} draft depth) exceed the "
                         f"model's {cfg.max_position_embeddings} positions")
    return prompt


def autoregressive(model: HybridModel, prompt, n_tokens: int, *, temperature: float = 0.0, seed: int = 0) -> list[int]:
    """Plain decoding of the target, one token per forward (greedy, or seeded sampling with the
    per-position noise of ddsim.sim.acceptance)."""
    return reference_decode(model, prompt, n_tokens, temperature=temperature, seed=seed)[0]


def reference_decode(model: HybridModel, prompt, n_tokens: int, *, temperature: float = 0.0,
                     seed: int = 0) -> tuple[list[int], list[float]]:
    """autoregressive() plus each token's decision margin: how far it led the runner-up in the
    decision scores (logits in nats when greedy), a measure of how near a tie the choice was."""
    return reference_rows(model, [prompt], n_tokens, temperature=temperature, seed=seed)[0]


def reference_rows(model: HybridModel, prompts, n_tokens: int, *, temperature: float = 0.0,
                   seed: int = 0) -> list[tuple[list[int], list[float]]]:
    """reference_decode() of every prompt, decoded together: each step one token of every prompt in
    one pass, the rows packed once (``model.decoder``). Every prompt is checked before any work."""
    prompts = [_check_prompt(model, p, n_tokens) for p in prompts]
    dec = model.decoder([model.prefill(p[:-1])[0] for p in prompts], steps=n_tokens)
    roots = [p[-1] for p in prompts]
    out = [([], []) for _ in prompts]
    for t in range(n_tokens):
        positions = [len(p) - 1 + t for p in prompts]  # each root's own position (the sampling noise's)
        scores = decision_scores(dec.step(roots), positions, temperature=temperature, seed=seed)
        roots = [int(x) for x in scores.argmax(-1)]
        lead = decision_margins(scores).tolist()
        for (toks, margins), r, m in zip(out, roots, lead):
            toks.append(r)
            margins.append(m if math.isfinite(m) else None)  # None: no runner-up (a one-token vocabulary)
    return out


def greedy_rows(model: HybridModel, requests) -> list[tuple[list[int], object]]:
    """The target's greedy continuation of ``q.n`` tokens after ``q.root`` from each exact ``q.state``
    (GreedyRequests), one token of every request per pass, the rows packed once (``model.decoder``:
    a ddsim.model.graphs.GraphedModel replays the passes from a CUDA graph). Returns per request (its tokens
    y_1..y_n, its tip: the state after root, y_1..y_{n-1}, from which feeding y_n continues the same
    greedy path; a request of no tokens keeps its state as its tip)."""
    n = max(q.n for q in requests)
    dec = model.decoder([q.state for q in requests], steps=n)
    roots, out, tips = [int(q.root) for q in requests], [[] for _ in requests], [q.state for q in requests]
    for t in range(n):
        # every row decodes until the longest is done (a row's passes past its own n are never read)
        done = []
        for b, y in enumerate(dec.step(roots).argmax(-1).tolist()):
            if t < requests[b].n:
                out[b].append(int(y))
                if t == requests[b].n - 1:  # the tip: after root, y_1..y_{n-1}
                    done.append(b)
            roots[b] = int(y)
        for b, tip in zip(done, dec.states(done)):  # the tips of this pass copied out of the buffers together
            tips[b] = tip
    return list(zip(out, tips))


def greedy_continuation(model: HybridModel, state, root: int, n: int) -> list[int]:
    """The target's greedy continuation of n tokens after ``root`` from an exact ``state``."""
    return greedy_rows(model, [GreedyRequest(state, root, n)])[0][0]


@dataclass
class StepRecord:
    step: int
    position: int  # position of the root
    tree_size: int
    tree_depth: int
    accepted: int  # draft tokens accepted (path length without the root)
    bonus: int
    emitted: list[int]
    exact_emitted: list[int]  # what exact verification emits from the same committed state
    silent_corruption: bool  # emitted != exact_emitted
    decision_flips: int  # along the reference walk: nodes whose target token differs from the reference's
    reference_walk: int  # nodes on the reference walk (root included): the decisions looked at
    path: list[int] = field(default_factory=list)  # accepted node indices, root first
    tree: Tree | None = None
    # measure="full": {mode: node_metrics vs the oracle} for the generation's mode, "exact" (the
    # noise floor) and any attribution modes, all on this step's tree and committed state
    nodes: dict | None = None
    keys: dict | None = None  # depth, rank, order_exact per node
    # temperature > 0: the step's exact law under the sampler (ddsim.sampling.law), the mode's against exact's
    emitted_tv: float | None = None  # total variation between the emitted-sequence laws
    length_tv: float | None = None  # between the accepted-length distributions
    expected_accepted: float | None = None  # E[draft tokens accepted] under the mode's distributions
    expected_accepted_exact: float | None = None
    # measure="full" at temperature > 0: the exact path's own law against the oracle's (its arithmetic's noise)
    noise_tv: float | None = None
    noise_length_tv: float | None = None


@dataclass
class GenerationResult:
    mode: str
    policy: str
    prompt: list[int]
    tokens: list[int]
    reference: list[int] | None
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def first_divergence(self) -> int | None:
        """Index of the first generated token that differs from the reference (None: never)."""
        if self.reference is None:
            return None
        for i, (a, b) in enumerate(zip(self.tokens, self.reference)):
            if a != b:
                return i
        return None

    @property
    def agreement(self) -> float | None:
        if self.reference is None:
            return None
        n = min(len(self.tokens), len(self.reference))
        return float(np.mean([a == b for a, b in zip(self.tokens[:n], self.reference[:n])])) if n else 1.0

    @property
    def tokens_per_step(self) -> float:
        return float(np.mean([len(s.emitted) for s in self.steps])) if self.steps else 0.0

    @property
    def silent_corruption_steps(self) -> int:
        return sum(s.silent_corruption for s in self.steps)


@dataclass(frozen=True)
class GreedyRequest:
    """A step's question to the target for a synthetic drafter: its greedy continuation of ``n``
    tokens after ``root`` from the exact ``state``. A generation yields it and is sent back the tokens
    and the continuation's tip (``greedy_rows``), so generations running together decode their
    continuations as one batch."""
    state: object
    root: int
    n: int


@dataclass(frozen=True)
class VerifyRequest:
    """A step's serving verify (no per-node states: measure="decisions") of ``tree`` in ``mode`` from
    ``state``. A generation yields it and is sent the VerifyResult back, so generations running
    together verify one round's trees of a size and mode in one pass (``verify_requests``)."""
    state: object
    tree: Tree
    mode: str


@dataclass(frozen=True)
class CommitRequest:
    """A step's commit of a serving verify's ``result`` at node ``accepted``: a generation yields it and
    is sent the committed ModelState, so the round's results of one batched verify are committed
    together (``commit_requests``)."""
    state: object
    tree: Tree
    result: object
    accepted: int


@dataclass(frozen=True)
class PrefillRequest:
    """A synthetic drafter's shadow context moved on by the tokens emitted since it was last used:
    ``tokens`` committed as one chain after ``state`` (the exact path). A generation yields it and is
    sent the new state, so the round's shadows move on in one pass (``prefill_requests``)."""
    state: object
    tokens: list


MAX_VERIFY_ROWS = 4096  # nodes of all trees together in one batched serving verify (verify_requests)


def verify_requests(model, requests) -> list:
    """The VerifyResult of each request, in order: requests of one mode and tree size verified
    together (``model.verify_rows``, at most MAX_VERIFY_ROWS nodes a pass); one alone by
    ``model.verify`` (a ddsim.model.graphs.GraphedModel replays it from a CUDA graph). Every result is
    valid until its generation commits it (the batched ones are fresh tensors; a replayed one is the
    only one of its graph's key here)."""
    out = [None] * len(requests)
    groups: dict = {}
    for k, q in enumerate(requests):
        groups.setdefault((q.mode, q.tree.size), []).append(k)
    for (mode, T), ks in groups.items():
        if len(ks) == 1:
            q = requests[ks[0]]
            out[ks[0]] = model.verify(q.state, q.tree, mode=mode, keep_states=False)
            continue
        per = max(1, MAX_VERIFY_ROWS // T)
        for lo in range(0, len(ks), per):
            chunk = ks[lo:lo + per]
            res = model.verify_rows([requests[k].state for k in chunk], [requests[k].tree for k in chunk], mode=mode)
            for k, r in zip(chunk, res):
                out[k] = r
    return out


def commit_requests(model, requests) -> list:
    """The committed state of each CommitRequest, in order: results of one verify_rows pass
    committed together (``model.commit_rows``, which commits a partial or reordered pass one by one),
    any other (a CUDA-graph replay's) by ``model.commit``."""
    out = [None] * len(requests)
    groups: dict = {}
    for k, q in enumerate(requests):
        if q.result.batch is None:
            out[k] = model.commit(q.state, q.tree, q.result, q.accepted)
        else:
            groups.setdefault(id(q.result.batch[0]), []).append(k)
    for ks in groups.values():
        qs = [requests[k] for k in ks]
        states = model.commit_rows([q.state for q in qs], [q.tree for q in qs], [q.result for q in qs],
                                   [q.accepted for q in qs])
        for k, st in zip(ks, states):
            out[k] = st
    return out


def prefill_requests(model, requests) -> list:
    """The state after each PrefillRequest's tokens, in order: one request by ``model.prefill`` (a
    ddsim.model.graphs.GraphedModel replays it); several as one batch of chains, each padded to the
    longest with copies of its last token (nodes after the last real one, which nothing real attends
    to), verified by ``model.verify_rows`` and committed at each chain's own last node
    (``model.commit_rows``): the same states within the arithmetic's rounding."""
    out = [None] * len(requests)
    todo = [k for k, q in enumerate(requests) if q.tokens]
    n = max((len(requests[k].tokens) for k in todo), default=1)
    for k, q in enumerate(requests):
        if not q.tokens:
            out[k] = q.state
        elif len(todo) == 1 or q.state.pos + n > model.cfg.max_position_embeddings:
            # alone, or a chain whose padding would run past the model's positions: its own prefill
            out[k] = model.prefill(list(q.tokens), state=q.state)[0]
    todo = [k for k in todo if out[k] is None]
    per = max(1, MAX_VERIFY_ROWS // n)
    for lo in range(0, len(todo), per):
        ks = todo[lo:lo + per]
        qs = [requests[k] for k in ks]
        trees = [chain(list(q.tokens) + [q.tokens[-1]] * (n - len(q.tokens))) for q in qs]
        states = [q.state for q in qs]
        res = model.verify_rows(states, trees, mode="exact")
        for k, st in zip(ks, model.commit_rows(states, trees, res, [len(q.tokens) - 1 for q in qs])):
            out[k] = st
    return out


@dataclass(frozen=True)
class OracleRequest:
    """A step's question to the oracle (measure="full"): every node of ``tree`` from the committed
    ``state``. A generation yields it and is sent the OracleResult back, so whoever runs several
    generations together can put the trees of one round into one oracle batch (``speculative_lockstep``)."""
    state: object
    parents: list
    tokens: list


def speculative(model: HybridModel, prompt, n_tokens: int | None = None, *, drafter: Drafter, policy: TreePolicy,
                mode: str = "exact", steps: int | None = None, temperature: float = 0.0, seed: int = 0,
                reference: list[int] | None = None, measure: str = "decisions", weights=None,
                attribution: tuple[str, ...] = (), keep_trees: bool = False, serving=None,
                on_step: Callable[[StepRecord], None] | None = None) -> GenerationResult:
    """Speculative decoding until ``n_tokens`` are emitted (cut to n_tokens) or ``steps`` steps ran.

    measure: "decisions" (exact fast path from the same state: silent corruption and decision
    flips; verifies keep no per-node states, the commit replays the accepted path, so ``model`` may
    be a ddsim.model.graphs.GraphedModel) or "full" (also the oracle per node and layer; needs the float
    ``weights`` and a model that keeps per-node states).
    attribution: extra modes evaluated vs the oracle on each step's tree and state (measure="full").
    serving: the model for the exact computations that need logits only, the drafter's greedy
    continuation and the exact shadow state it starts from (default ``model``; with measure="full", a
    ddsim.model.graphs.GraphedModel of the same weights spares those their per-node states).
    """
    return speculative_lockstep(model, [prompt], n_tokens, references=[reference], drafter=drafter, policy=policy,
                                mode=mode, steps=steps, temperature=temperature, seed=seed, measure=measure,
                                weights=weights, attribution=attribution, keep_trees=keep_trees, serving=serving,
                                on_step=on_step)[0]


def speculative_lockstep(model: HybridModel, prompts, n_tokens: int | None = None, *, references=None,
                         max_trees: int | Callable | None = None, timings: dict | None = None,
                         **kw) -> list[GenerationResult]:
    """``speculative`` for each of ``prompts`` (``references[i]`` its reference), the generations
    stepping together: with measure="full", the oracle takes the trees of one round of steps as one
    batch (``oracle.verify_trees``, at most ``max_trees`` trees at once, or ``max_trees(requests)``
    asked each round; default all; a callable with an ``observe(requests, footprint)`` method is told,
    on a GPU, each batch's peak allocation over what was allocated before it: ddsim.sim.memory.footprint,
    which resets CUDA's peak statistic for the batch; ddsim.sim.memory.peak_allocated keeps the process's). Each
    generation is the same as alone: its steps see only its own state, and the oracle computes every
    node the same way (up to the reassociation of batched products). Every input is checked before
    the first step of any generation. ``timings``: a dict to which the oracle's wall seconds
    ("oracle"), its batch sizes ("oracle_batches"), how often a batch was split for memory
    ("oracle_splits") and on a GPU the memory allocated after and at most during each batch
    ("oracle_batch_memory_gib", "oracle_batch_peak_gib") are added, and the generations' own wall
    seconds per part of a step ("fast-path verifies", "node metrics", "commits", "drafter's greedy
    continuations", "drafter's shadow prefills", the host's "drafts and trees"; ddsim.sim.timing.timed,
    synchronised on a GPU)."""
    references = [None] * len(prompts) if references is None else list(references)
    if len(references) != len(prompts):
        raise InputError(f"references: {len(references)} for {len(prompts)} prompts")
    if max_trees is not None and not callable(max_trees) and max_trees < 1:
        raise InputError(f"max_trees: expected at least 1, got {max_trees}")
    checked = [_checked_generation(model, p, n_tokens, **kw) for p in prompts]
    gens = [_generation(model, p, n_tokens, reference=r, timings=timings, **kw) for p, r in zip(checked, references)]

    def verify(reqs):
        """The oracle on a batch of requests; a batch that runs out of device memory is split in two
        (the estimate of what fits is an estimate: a split batch is the same computation)."""
        try:
            return oracle.verify_trees(kw.get("weights"), model.cfg, [(q.state, q.parents, q.tokens) for q in reqs])
        except torch.OutOfMemoryError:
            if len(reqs) == 1:
                raise
            torch.cuda.empty_cache()
            if timings is not None:
                timings["oracle_splits"] = timings.get("oracle_splits", 0) + 1
            half = len(reqs) // 2
            return verify(reqs[:half]) + verify(reqs[half:])

    observe = getattr(max_trees, "observe", None)

    def answer(reqs):
        gpu = model.device.type == "cuda" and (timings is not None or observe is not None)
        with footprint(model.device) if gpu else contextlib.nullcontext({}) as fp, \
                timed(timings, "oracle", model.device):
            out = verify(reqs)
        if gpu and observe is not None:
            observe(reqs, fp["bytes"])
        if timings is not None:
            timings.setdefault("oracle_batches", []).append(len(reqs))
            if gpu:  # memory held when the batch came back, and at most while it ran (GiB), for the record
                timings.setdefault("oracle_batch_memory_gib", []).append(
                    round(torch.cuda.memory_allocated(model.device) / 2**30, 1))
                timings.setdefault("oracle_batch_peak_gib", []).append(round(fp["peak"] / 2**30, 1))
        return out
    helper = kw.get("serving") or model

    def handler(part: str, answer_all, on):
        """A batch of requests -> answer_all(on, requests), its wall time added to the step part."""
        def run(reqs):
            with timed(timings, part, model.device):
                return answer_all(on, reqs)
        return run
    greedy = "drafter's greedy continuations"
    return run_lockstep(gens, answer, max_trees=max_trees, decode=handler(greedy, greedy_rows, helper),
                        prefill=handler("drafter's shadow prefills", prefill_requests, helper),
                        verify=handler("fast-path verifies", verify_requests, model),
                        commit=handler("commits", commit_requests, model))


def run_lockstep(gens: list, answer: Callable[[list[OracleRequest]], list], *, max_trees=None,
                 decode: Callable[[list[GreedyRequest]], list] | None = None,
                 verify: Callable[[list[VerifyRequest]], list] | None = None,
                 commit: Callable[[list[CommitRequest]], list] | None = None,
                 prefill: Callable[[list[PrefillRequest]], list] | None = None) -> list:
    """Run generators that yield OracleRequests and the requests of a step's other batched work
    (PrefillRequest, GreedyRequest, VerifyRequest, CommitRequest) together; returns each generator's
    return value, in order. Each round, the pending requests of one kind are answered all at once
    by their handler (``prefill``, ``decode``, ``verify``, ``commit``: a list of requests -> the list
    of their answers), the kinds in that order of precedence (the order they come in a step: a
    generation waiting on an earlier stage is answered first, so the others wait for it and every
    batch holds the whole round), until every unfinished generator waits on the oracle, so the
    round's oracle batch holds every generation's tree; then the oracle requests are answered by
    ``answer``, at most ``max_trees`` at a time (or ``max_trees(requests)``, asked each round), each
    answer handed over and let go."""
    results, pending = [None] * len(gens), {}
    handlers = ((PrefillRequest, prefill, "prefill", "a prefill"), (GreedyRequest, decode, "decode", "a greedy continuation"),
                (VerifyRequest, verify, "verify", "a verify"), (CommitRequest, commit, "commit", "a commit"))

    def advance(i, value):
        try:
            pending[i] = gens[i].send(value)
        except StopIteration as stop:
            results[i] = stop.value

    for i in range(len(gens)):
        advance(i, None)
    while pending:
        while True:
            for kind, handle, name, what in handlers:  # noqa: B007 (the kind found is used after the loop)
                asked = sorted((i, q) for i, q in pending.items() if isinstance(q, kind))
                if asked:
                    break
            else:
                break
            if handle is None:
                raise ValueError(f"run_lockstep: a generation asked for {what} and no {name} was given")
            for i, _ in asked:
                del pending[i]
            for (i, _), out in zip(asked, handle([q for _, q in asked])):
                advance(i, out)
        round_ = sorted(pending.items())
        pending.clear()
        if callable(max_trees):
            size = max_trees([q for _, q in round_]) if round_ else 1
        else:
            size = max_trees or len(round_) or 1
        for lo in range(0, len(round_), size):
            chunk = round_[lo:lo + size]
            outs = answer([q for _, q in chunk])
            for k, (i, _) in enumerate(chunk):  # each answer let go once its generation has it
                out, outs[k] = outs[k], None
                advance(i, out)
            del out, outs
    return results


def _decide(tree: Tree, logits, targets, *, rule: str | None, temperature: float, seed: int, position: int,
            params: dict | None):
    """(accepted path, bonus, the step's law or None) of one verify result: the walk on ``targets`` (greedy, or
    ddsim's coupled Gumbel walk), or the named rule on the result's distributions, computed once for both the
    decision and the law."""
    if rule is None:
        return (*walk(tree, targets), None)
    probs = probabilities(logits, temperature)
    path, bonus = walk(tree, targets) if rule == "gumbel" else accept_with_rule(
        tree, probs, seed=seed, position=position, sampler=rule, params=params)
    return path, bonus, step_law_of(tree, probs, sampler=rule, params=params)


def _checked_generation(model, prompt, n_tokens, *, drafter, policy, mode="exact", steps=None, measure="decisions",
                        weights=None, **_):
    """The prompt as checked token ids: every argument of a generation refused before any work, one
    line naming it."""
    if n_tokens is None and steps is None:
        raise InputError("steps: give n_tokens or steps")
    if steps is not None and steps < 1:
        raise InputError(f"steps: expected at least 1 step, got {steps}")
    budget_tokens = n_tokens if n_tokens is not None else steps * (drafter.depth + 1)
    if mode not in VERIFY_MODES:
        raise InputError(f"mode: expected one of {VERIFY_MODES}, got {mode!r}")
    if measure not in ("decisions", "full"):
        raise InputError(f"measure: expected 'decisions' or 'full', got {measure!r}")
    if measure == "full" and weights is None:
        raise InputError("measure='full' needs the model weights for the oracle")
    return _check_prompt(model, prompt, budget_tokens, extra=drafter.depth + 1)


def _generation(model: HybridModel, prompt: list[int], n_tokens: int | None, *, drafter: Drafter,
                policy: TreePolicy, mode: str = "exact", steps: int | None = None, temperature: float = 0.0,
                seed: int = 0, sampler: str | None = None, sampler_params: dict | None = None,
                reference: list[int] | None = None, measure: str = "decisions", weights=None,
                attribution: tuple[str, ...] = (), keep_trees: bool = False, serving=None,
                on_step: Callable[[StepRecord], None] | None = None, timings: dict | None = None):
    """One speculative generation (arguments checked) as a generator: yields a GreedyRequest when its
    synthetic drafter needs the target's greedy continuation (and neither the reference nor its own
    continuation so far gives it) and is sent the tokens and the continuation's tip; yields an
    OracleRequest per step when measure="full" and is sent its OracleResult (computed by the caller
    from ``weights``); with measure="decisions" yields a
    VerifyRequest for each serving verify (its mode's, then exact's from the same state) and is sent
    the VerifyResult, and a CommitRequest for the commit of its mode's, and is sent the state; yields a
    PrefillRequest, before a GreedyRequest, to move the drafter's exact shadow context on by the tokens
    emitted since it last asked (a mode other than exact), and is sent the new shadow state; returns
    the GenerationResult."""
    cfg = model.cfg
    part = lambda name: timed(timings, name, model.device)  # noqa: E731
    state, _ = model.prefill(prompt[:-1])
    # the synthetic drafter's greedy path. ``own``: the target's greedy tokens from output index
    # own_at on, as far as decoded, and ``tip``: the exact state that continues them (own[-1] is its
    # next input); valid while the output follows them. Else ``shadow``, an exact state of the
    # context before the tokens ``behind`` (moved on only when a step asks for a new continuation).
    shadow, behind = state, []
    own, own_at, tip = [], 0, None
    root, out = prompt[-1], []
    result = GenerationResult(mode, policy.label(), prompt, out, reference)
    step = 0
    while (n_tokens is None or len(out) < n_tokens) and (steps is None or step < steps):
        greedy = None
        if drafter.needs_greedy:
            n_done = len(out)
            if reference is not None and temperature == 0 and out == reference[:n_done] \
                    and len(reference) >= n_done + drafter.depth:
                greedy = reference[n_done:n_done + drafter.depth]
            elif tip is not None and own_at <= n_done <= own_at + len(own) and out[own_at:] == own[:n_done - own_at]:
                # still on its own greedy path: decode only the tokens past what is known, from the tip
                ahead = own[n_done - own_at:]
                if len(ahead) < drafter.depth:
                    more, tip = yield GreedyRequest(tip, own[-1], drafter.depth - len(ahead))
                    own += more
                greedy = own[n_done - own_at:n_done - own_at + drafter.depth]
            else:
                if behind:  # the shadow catches up with the tokens emitted since (with the round's others)
                    shadow, behind = (yield PrefillRequest(shadow, behind)), []
                greedy, tip = yield GreedyRequest(shadow, root, drafter.depth)
                own, own_at = list(greedy), n_done
        with timed(timings, "drafts and trees", torch.device("cpu")):  # the host's work: no device sync around it
            logits = drafter.draft(DraftContext(step=step, tokens=prompt + out, greedy=greedy))
            tree = policy.build(logits, root_token=root, max_rank=drafter.max_rank)
        positions = tree.positions(state.pos)
        # the oracle first: a generation waiting for it (in lock step with others) holds no per-node state
        ref = (yield OracleRequest(state, tree.parents, tree.tokens)) if measure == "full" else None
        keep = measure == "full"  # decisions need logits only: the serving verify (no per-node states)
        targets_ref = target_tokens(ref.logits, positions, temperature=temperature, seed=seed) if ref is not None else None
        nodes = {} if measure == "full" else None
        norms = []  # the oracle's row norms, computed at the step's first measurement and shared by the others

        def measured(result):
            """node_metrics of ``result`` against the step's oracle result."""
            with part("node metrics"):
                if not norms:
                    norms.append(reference_norms(ref, cfg))
                return node_metrics(tree, result, ref, cfg, ref_norms=norms[0])
        # with per-node states: the mode's, exact's and the attributions' verifies of this tree, in that
        # order (one pass for all of them where the model replays CUDA graphs: ddsim.model.graphs), each
        # measured, and the mode's committed, before the next tree's
        if keep:
            with part("fast-path verifies"):
                kept = iter(model.verify_modes(state, tree, modes=dict.fromkeys((mode, "exact", *attribution))))

            def next_kept(expected: str):
                with part("fast-path verifies"):
                    r = next(kept)
                if r.mode != expected:
                    raise RuntimeError(f"verify_modes: a {r.mode} result where {expected}'s was due")
                return r
            res = next_kept(mode)
        else:  # the serving verify, batched with the other generations' of this round
            res = yield VerifyRequest(state, tree, mode)
        targets = target_tokens(res.logits, positions, temperature=temperature, seed=seed)
        # at temperature > 0 the sampler decides (ddsim's coupled Gumbel walk unless another is named); the
        # per-node targets above stay the coupled decisions the flip metrics compare
        rule = (sampler or "gumbel") if temperature > 0 else None
        decide = lambda logits, targets: _decide(tree, logits, targets, rule=rule, temperature=temperature,  # noqa: E731
                                                 seed=seed, position=state.pos, params=sampler_params)
        path, bonus, law = decide(res.logits, targets)
        emitted = emitted_tokens(tree, path, bonus)
        if keep:
            nodes[mode] = measured(res)
        if keep:
            with part("commits"):
                committed = model.commit(state, tree, res, path[-1])
        else:  # committed with the round's other results of the same batched verify
            committed = yield CommitRequest(state, tree, res, path[-1])
        del res

        if mode == "exact":
            targets_x, path_x, bonus_x, law_x = targets, path, bonus, law
        else:
            if keep:
                res_x = next_kept("exact")
            else:
                res_x = yield VerifyRequest(state, tree, "exact")
            targets_x = target_tokens(res_x.logits, positions, temperature=temperature, seed=seed)
            path_x, bonus_x, law_x = decide(res_x.logits, targets_x)
            if keep:
                nodes["exact"] = measured(res_x)
            del res_x
        keys = None
        law_ref = None
        if measure == "full" and rule is not None:  # before the oracle's result is let go
            law_ref = step_law_of(tree, probabilities(ref.logits, temperature), sampler=rule, params=sampler_params)
        if measure == "full":
            for extra in attribution:
                if extra not in nodes:
                    res_e = next_kept(extra)
                    nodes[extra] = measured(res_e)
                    del res_e
            del kept
            keys = node_keys(tree)
            ref = None  # the oracle's per-node states (gigabytes at full size): not held while the others step
            norms.clear()
        else:
            targets_ref = targets_x
        exact_emitted = emitted_tokens(tree, path_x, bonus_x)
        ref_path, _ = walk(tree, targets_ref)
        flips = sum(targets[n] != targets_ref[n] for n in ref_path)

        rec = StepRecord(step, state.pos, tree.size, int(tree.depths.max()), len(path) - 1, bonus, emitted,
                         exact_emitted, emitted != exact_emitted, int(flips), len(ref_path), path,
                         tree if keep_trees else None, nodes, keys)
        if law is not None:
            rec.emitted_tv, rec.length_tv = total_variation(law, law_x), length_tv(law, law_x)
            rec.expected_accepted, rec.expected_accepted_exact = law.expected_accepted(), law_x.expected_accepted()
        if law_ref is not None:
            rec.noise_tv, rec.noise_length_tv = total_variation(law_x, law_ref), length_tv(law_x, law_ref)
        result.steps.append(rec)
        if on_step:
            on_step(rec)
        state = committed
        if drafter.needs_greedy:
            if mode == "exact":
                shadow = state  # exact verification's own committed state
            else:
                behind += [root] + emitted[:-1]
        out.extend(emitted)
        root = bonus
        step += 1
    if n_tokens is not None:
        del out[n_tokens:]
    return result
