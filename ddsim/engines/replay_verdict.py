"""What decides a replay's verdict, apart from the model: exact greedy verification's walk and what it
emits, what counts as silent corruption and what as the engine's rounding, the continuity of a request's
steps, the noise bound, and the summary the gate reads. Plain functions of the dump's steps and the per-step
records (ddsim.engines.replay computes those with the oracle); mutation-tested with tests/test_verdict_chain.py."""
from __future__ import annotations

import math

import torch

from ddsim.trees.tree import Tree

DIAGNOSES = ("within noise", "sibling leak", "position error", "mask error", "state commit error", "state drift",
             "stale state", "unexplained", "bonus error", "acceptance error", "commit error")


def greedy_walk(tree: Tree, logits: torch.Tensor) -> list[int]:
    """Exact greedy verification: from the root, follow the child whose token is the argmax."""
    return walk_tops(tree, [frozenset({int(t)}) for t in logits.argmax(-1)])


def emitted_by_exact_greedy(tree: Tree, logits: torch.Tensor, path: list[int]) -> list[int]:
    """What exact greedy verification appends after walking ``path``: its draft tokens after the root,
    then the bonus (the argmax at the path's last node)."""
    return [tree.tokens[i] for i in path[1:]] + [int(logits[path[-1]].argmax())]


def top_sets(logits=None, *, topk=None) -> list[frozenset[int]]:
    """Per node, the tokens an engine's greedy choice may take: every token at its logits' maximum (a tie, as
    bf16 logits often hold, lets either be the argmax). ``logits`` [T, V], or ``topk`` (ids [T, k], log-probs
    [T, k], most likely first)."""
    if topk is not None:
        ids, lp = topk
        return [frozenset(int(t) for t in ids[i][lp[i] == lp[i, 0]]) for i in range(ids.shape[0])]
    top = logits.max(-1, keepdim=True).values
    return [frozenset(int(t) for t in row.nonzero().flatten()) for row in logits == top]


def follows_greedy(tree: Tree, tops: list[frozenset[int]], accepted: list[int], emitted: list[int]) -> bool:
    """Whether a step is greedy verification on the engine's own logits (``tops``: top_sets): each accepted node's
    token an argmax of its parent's, the bonus an argmax of the last accepted node's, and no child of that node
    carrying the bonus (greedy would have gone on)."""
    if any(tree.tokens[v] not in tops[u] for u, v in zip(accepted, accepted[1:])):
        return False
    last, bonus = accepted[-1], emitted[-1]
    return bonus in tops[last] and all(tree.tokens[c] != bonus for c in tree.children[last])


def walk_tops(tree: Tree, tops: list[frozenset[int]]) -> list[int]:
    """Greedy verification's walk on an engine's own logits (``tops``: top_sets): from the root, the first child
    whose token is an argmax of its parent's."""
    path, node = [0], 0
    while True:
        nxt = [c for c in tree.children[node] if tree.tokens[c] in tops[node]]
        if not nxt:
            return path
        node = nxt[0]
        path.append(node)


def acceptance_error(tree: Tree, tops: list[frozenset[int]], accepted: list[int], emitted: list[int]) -> str | None:
    """Why a greedy step's accepted path is not greedy verification on the engine's own logits (None: it is, or the
    bonus alone is off, which bonus_error names)."""
    if follows_greedy(tree, tops, accepted, emitted) or emitted[-1] not in tops[accepted[-1]]:
        return None
    return (f"the engine accepted {list(accepted)}; greedy verification on its own logits accepts "
            f"{walk_tops(tree, tops)}")


def judge_emission(*, emitted: list[int], exact: list[int], follows_rule: bool, within_noise: bool) -> tuple[bool, bool]:
    """(silent corruption, rounding divergence) of one step. ``exact``: what exact verification emits on the
    oracle's logits; ``follows_rule``: the engine's emission is its declared rule's on its own logits (greedy:
    follows_greedy; sampled: its sampler with its own random numbers); ``within_noise``: every node's logits
    within the noise of the oracle's. An engine that emits other than exact verification corrupts the output
    silently, unless it ran its rule and its logits count as the oracle's: then a near-tie its rounding turned (an
    argmax, or a random number on a decision boundary) is a rounding divergence, counted apart."""
    differs = list(emitted) != list(exact)
    rounding = differs and within_noise and follows_rule
    return differs and not rounding, rounding


def node_bound(noise_kl: float, logits: str) -> float:
    """The per-node figure within which an engine's logits count as the oracle's: the KL itself for full logits;
    for a top-k dump, whose figure is the largest log-probability error over the reported tokens, sqrt(2 KL): an
    error of at most e on every token gives a KL of at most about e^2 / 2 (second order), so a top-k dump is held
    to the log-probability error the KL tolerance allows."""
    return {"full": noise_kl, "topk": math.sqrt(2.0 * noise_kl)}[logits]


def tolerance_words(noise_kl: float, logits: str) -> str:
    """The tolerance as a verdict line names it: "KL 1e-06", and for a top-k dump the log-probability error it
    allows."""
    words = f"KL {noise_kl:.3g}"
    return words if logits == "full" else f"{words} (top-k: log-probabilities within {node_bound(noise_kl, logits):.3g})"


def node_within_noise(node, noise_kl: float) -> bool:
    """Whether one node's logits count as the oracle's: its KL (full logits), else its log-probability error
    (top-k), within ``noise_kl``'s bound (node_bound)."""
    if node.kl is not None:
        return node.kl <= noise_kl
    return node.logprob_err <= node_bound(noise_kl, "topk")


def sampled_walk(tree: Tree, logits: torch.Tensor, acceptance: dict, tensors: dict) -> tuple[list[int], list[int]]:
    """A sampled step recomputed: the dump's rule (acceptance {rule, temperature, params}) on softmax(logits / T)
    with the random numbers the engine drew (tensors "random.NAME"; a step's one number dumped as [1]) ->
    (accepted path, emitted tokens)."""
    from ddsim.sampling.rules import RULES, one_step, probabilities
    randoms = {k: tensors[f"random.{k}"].double().reshape(()) if kind == "draw" else tensors[f"random.{k}"].double()
               for k, kind in RULES[acceptance["rule"]].randoms.items()}
    path, bonus = one_step(acceptance["rule"], parents=tree.parents, tokens=tree.tokens,
                           probs=probabilities(logits, acceptance["temperature"]), randoms=randoms,
                           params=acceptance["params"])
    return path, [tree.tokens[i] for i in path[1:]] + [bonus]


def rule_error(emitted: list[int], own: list[int], rule: str) -> str | None:
    """Why a sampled step's emitted tokens are not what its declared rule gives on the engine's own logits and
    random numbers (None: they are)."""
    if emitted == own:
        return None
    return f"the engine emitted {emitted}; its declared rule {rule} on its own logits and random numbers emits {own}"


def bonus_error(emitted: list[int], accepted: list[int], tops: list[frozenset[int]]) -> str | None:
    """Why the emitted bonus is not an argmax of the engine's own logits at its last accepted node (None: it is;
    ``tops``: top_sets)."""
    want = tops[accepted[-1]]
    if emitted[-1] in want:
        return None
    return (f"the engine emitted bonus {emitted[-1]} at node {accepted[-1]}, its own logits' argmax there is "
            f"{' or '.join(str(t) for t in sorted(want))}")


def noise_bound(dump, tolerance: dict) -> float:
    """The KL within which the engine counts as exact: ``tolerance`` {"engine": the policy's bound for the
    engine dtype the caller named, "dtype": {dtype: the policy's bound}}; the dump's declared compute
    dtype picks its own bound only where that is tighter."""
    return min(tolerance["engine"], tolerance["dtype"](dump.header["compute_dtype"]))


def tolerance(policy, engine_dtype: str = "float32", noise_kl: float | None = None) -> dict:
    """``policy``'s replay tolerance (noise_bound's argument) for an engine computing in ``engine_dtype``, or a
    fixed ``noise_kl`` given by the caller; either way the dump's dtype can still only tighten it."""
    return {"engine": policy.noise_kl(engine_dtype) if noise_kl is None else noise_kl, "dtype": policy.noise_kl}


def default_tolerance(noise_kl: float | None = None, engine_dtype: str = "float32") -> dict:
    """The default policy's replay tolerance (``tolerance``)."""
    from ddsim.verdict.gate import DEFAULT_POLICY, load_policy
    return tolerance(load_policy(DEFAULT_POLICY), engine_dtype, noise_kl)


def continued_context(step) -> list[int]:
    """The context a request's next step must have: the step's context plus its root and the tokens it emitted
    before the bonus (what it committed)."""
    return step.context + [step.tokens[0]] + step.emitted[:-1]


def judge_continuity(steps, records) -> None:
    """Within each request, step n continues step n-1: its context is the previous context plus the
    previous root and the tokens emitted before the bonus (the committed path), its root the previous
    bonus. A step that does not is a commit error (its diagnosis, whatever its logits say)."""
    last: dict = {}  # request -> its previous step
    for s, r in zip(steps, records):
        prev = last.get(s.request)
        last[s.request] = s
        if prev is None:
            continue
        want = continued_context(prev)
        problems = []
        if s.context != want:
            at = next((i for i, (a, b) in enumerate(zip(s.context, want)) if a != b), min(len(s.context), len(want)))
            problems.append(f"its context ({len(s.context)} tokens) is not step {prev.step}'s context plus what that "
                            f"step committed ({len(want)} tokens; first difference at position {at})")
        if s.tokens[0] != prev.emitted[-1]:
            problems.append(f"its root {s.tokens[0]} is not step {prev.step}'s bonus {prev.emitted[-1]}")
        if problems:
            r.commit_ok = False
            r.diagnosis, r.evidence = "commit error", "; ".join(problems) + (
                f" (logits: {r.diagnosis}, {r.evidence})" if r.diagnosis != "within noise" else "")


def summarize(records, noise_kl: float) -> dict:
    """The replay's summary from its step records (StepRecord, or the report model's StepFigures) and the noise
    bound they were judged by (a node's top-1 disagreement counts above noise where its logits are not within
    it: node_within_noise)."""
    nodes = [n for r in records for n in r.nodes]
    kls = [n.kl for n in nodes if n.kl is not None]
    return {"steps": len(records), "requests": len({r.request for r in records}), "nodes": len(nodes),
            "silent_corruption_steps": sum(r.silent_corruption for r in records),
            "rounding_divergence_steps": sum(r.rounding_divergence for r in records),
            "diagnosed_steps": sum(r.diagnosis != "within noise" for r in records),
            "diagnoses": {d: sum(r.diagnosis == d for r in records) for d in DIAGNOSES},
            "top1_disagreements": sum(not n.top1_agrees for n in nodes),
            "top1_disagreements_above_noise": sum(not n.top1_agrees and not node_within_noise(n, noise_kl)
                                                  for n in nodes),
            "kl_max": max(kls) if kls else None,
            "logprob_err_max": max((n.logprob_err for n in nodes), default=None),
            "fast_path_kl_max": max((n.fast_path_kl for n in nodes), default=None),
            "positions_unexpected_steps": sum(not r.positions_as_expected for r in records),
            "bonus_error_steps": sum(not r.bonus_ok for r in records),
            "commit_error_steps": sum(not r.commit_ok for r in records)}
