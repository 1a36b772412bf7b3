"""Measured decoding steps: each mode's verify and commit timed as the audit's serving model runs them (on
CUDA, replays of captured CUDA graphs: ddsim.model.graphs), beside the autoregressive step and the chain's.

For every budget the tree is the one the audit's drafter builds at the first step of its first prompt, from
that prompt's committed state; every mode verifies that same tree, then commits the path its own greedy walk
accepts. The autoregressive baseline verifies and commits the root alone; the chain verifies the target's own
greedy tokens, as many as the drafter's depth, as a chain (every node accepted: its longest commit). Each figure
is the median of ``repeats`` timed repetitions after ``warmup`` untimed ones (CUDA events on a GPU, the wall
clock elsewhere). A step is its verify and commit: the draft is not timed, since ddsim's drafters are
simulations (synthetic, trace) or a reference draft model that runs on the CPU and prefills its context afresh
each step; a served drafter's time adds to every speculative row alike.

Tokens per second = the audit's measured tokens per step / the measured step time; for the autoregressive
baseline one token per step.
"""
from __future__ import annotations

import statistics
import time

import torch

from ddsim.sim.acceptance import target_tokens, walk
from ddsim.sim.drafters import DraftContext
from ddsim.trees.tree import Tree, chain


class _Clock:
    """Milliseconds between marks: CUDA events on a GPU (the device's own time), else the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


def _time_step(serving, state, tree: Tree, mode: str, clock: _Clock, *, warmup: int, repeats: int) -> dict:
    """Median milliseconds of the verify and the commit of ``tree`` in ``mode`` from ``state``."""
    parts = {"verify": [], "commit": []}
    for k in range(warmup + repeats):
        t1 = clock.mark()
        res = serving.verify(state, tree, mode=mode)
        t2 = clock.mark()
        # the path the mode's own greedy walk accepts (host side, as a server's sampler would read the logits)
        path, _ = walk(tree, target_tokens(res.logits, tree.positions(state.pos)))
        t3 = clock.mark()
        serving.commit(state, tree, res, path[-1])
        t4 = clock.mark()
        if k >= warmup:
            parts["verify"].append(clock.elapsed(t1, t2))
            parts["commit"].append(clock.elapsed(t3, t4))
        del res
    return {k: statistics.median(v) for k, v in parts.items()}


def measure_steps(serving, *, prompt: list[int], greedy: list[int], drafter, policies: dict, modes, warmup: int = 3,
                  repeats: int = 20) -> dict:
    """{"ar": times, "chain": times, (budget, mode): times} with times {verify, commit (ms), nodes}.
    ``greedy``: the target's greedy continuation of ``prompt`` (at least the drafter's depth tokens);
    ``policies``: {budget: TreePolicy}."""
    clock = _Clock(serving.device)
    state, _ = serving.prefill(prompt[:-1])
    root = prompt[-1]
    ctx = DraftContext(step=0, tokens=list(prompt), greedy=list(greedy[:drafter.depth]) if drafter.needs_greedy else None)
    logits = drafter.draft(ctx)
    out = {"ar": {**_time_step(serving, state, Tree([-1], [root]), "exact", clock, warmup=warmup, repeats=repeats),
                  "nodes": 1}}
    # the chain baseline drafts the target's own greedy tokens (its best case): depth + 1 nodes
    ch = chain([root] + list(greedy[:drafter.depth]))
    out["chain"] = {**_time_step(serving, state, ch, "exact", clock, warmup=warmup, repeats=repeats), "nodes": ch.size}
    for budget, policy in policies.items():
        tree = policy.build(logits, root_token=root, max_rank=drafter.max_rank)
        for mode in modes:
            out[(budget, mode)] = {**_time_step(serving, state, tree, mode, clock, warmup=warmup, repeats=repeats),
                                   "nodes": tree.size}
    return out


def rows(times: dict, *, tokens_per_step: dict) -> list[dict]:
    """Report rows (ddsim.verdict.report_model.MeasuredStep) from measure_steps' times and the audit's tokens per
    step ({"chain": x, (budget, mode): x})."""
    ar_ms = times["ar"]["verify"] + times["ar"]["commit"]
    out = []
    for key, t in times.items():
        step = t["verify"] + t["commit"]
        tps = 1.0 if key == "ar" else tokens_per_step[key]
        label, mode, budget = (("autoregressive", "exact", None) if key == "ar" else ("chain", "exact", None)
                               if key == "chain" else (f"ddtree-{key[0]}", key[1], key[0]))
        out.append({"label": label, "mode": mode, "budget": budget, "nodes": t["nodes"], "verify_ms": t["verify"],
                    "commit_ms": t["commit"], "step_ms": step, "tokens_per_step": tps, "tokens_per_s": tps / step * 1e3,
                    "speedup_vs_ar": (tps / step) / (1.0 / ar_ms)})
    return out
