"""What decides a replay's verdict, apart from the model: exact greedy verification's walk and what it
emits, the continuity of a request's steps, the noise bound, and the summary the gate reads. Plain
functions of the dump's steps and the per-step records (ddsim.engines.replay computes those with the oracle);
mutation-tested with tests/test_verdict_chain.py."""
from __future__ import annotations

import torch

from ddsim.trees.tree import Tree

DIAGNOSES = ("within noise", "sibling leak", "position error", "mask error", "state drift", "stale state",
             "unexplained", "bonus error", "commit error")


def greedy_walk(tree: Tree, logits: torch.Tensor) -> list[int]:
    """Exact greedy verification: from the root, follow the child whose token is the argmax."""
    children = tree.children
    path, node = [0], 0
    while True:
        want = int(logits[node].argmax())
        nxt = [c for c in children[node] if tree.tokens[c] == want]
        if not nxt:
            return path
        node = nxt[0]
        path.append(node)


def emitted_by_exact_greedy(tree: Tree, logits: torch.Tensor, path: list[int]) -> list[int]:
    """What exact greedy verification appends after walking ``path``: its draft tokens after the root,
    then the bonus (the argmax at the path's last node)."""
    return [tree.tokens[i] for i in path[1:]] + [int(logits[path[-1]].argmax())]


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


def bonus_error(emitted: list[int], accepted: list[int], engine_top1) -> str | None:
    """Why the emitted bonus is not the engine's own argmax at its last accepted node (None: it is)."""
    want = int(engine_top1[accepted[-1]])
    if emitted[-1] == want:
        return None
    return f"the engine emitted bonus {emitted[-1]} at node {accepted[-1]}, its own logits' argmax there is {want}"


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
        want = prev.context + [prev.tokens[0]] + prev.emitted[:-1]
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


def summarize(records) -> dict:
    """The replay's summary from its step records (StepRecord, or the report model's StepFigures)."""
    nodes = [n for r in records for n in r.nodes]
    kls = [n.kl for n in nodes if n.kl is not None]
    return {"steps": len(records), "requests": len({r.request for r in records}), "nodes": len(nodes),
            "silent_corruption_steps": sum(r.silent_corruption for r in records),
            "diagnosed_steps": sum(r.diagnosis != "within noise" for r in records),
            "diagnoses": {d: sum(r.diagnosis == d for r in records) for d in DIAGNOSES},
            "top1_disagreements": sum(not n.top1_agrees for n in nodes),
            "kl_max": max(kls) if kls else None,
            "logprob_err_max": max((n.logprob_err for n in nodes), default=None),
            "fast_path_kl_max": max((n.fast_path_kl for n in nodes), default=None),
            "positions_unexpected_steps": sum(not r.positions_as_expected for r in records),
            "bonus_error_steps": sum(not r.bonus_ok for r in records),
            "commit_error_steps": sum(not r.commit_ok for r in records)}
