"""Acceptance (README, Contracts: acceptance): a target token per node, then the DDTree walk.

Greedy: t_i = argmax(logits_i). Sampling (temperature > 0): t_i ~ softmax(logits_i / temperature),
drawn with the Gumbel-max trick from noise that depends only on (seed, absolute position). Nodes
at the same depth share a position's noise — they never lie on one path — and autoregressive
sampling with the same seed uses the same noise per position, so exact tree verification emits
exactly the tokens of seeded autoregressive sampling (losslessness under coupled draws).

Walk: from the root, step to the child whose token is the current node's target while one exists.
Accepted = that path; bonus = the target at its last node.
"""
from __future__ import annotations

import torch

from ddsim.errors import InputError
from ddsim.trees.seeds import derive_seed
from ddsim.trees.tree import Tree


def gumbel_noise(*, seed: int, position: int, vocab: int) -> torch.Tensor:
    """[vocab] float64 Gumbel(0, 1) noise, a pure function of (seed, position)."""
    gen = torch.Generator().manual_seed(derive_seed(int(seed), "sampling-noise", int(position)))
    u = torch.rand(vocab, generator=gen, dtype=torch.float64).clamp_(1e-300, 1.0 - 1e-16)
    return -torch.log(-torch.log(u))


def decision_scores(logits: torch.Tensor, positions, *, temperature: float = 0.0, seed: int = 0) -> torch.Tensor:
    """logits [T, N], positions [T] -> [T, N] float64 scores whose argmax is each node's target:
    the logits (greedy), or logits / temperature plus the position's Gumbel noise."""
    if temperature < 0:
        raise InputError(f"temperature: expected >= 0, got {temperature}")
    if temperature == 0:
        return logits.double()
    lg = logits.double() / temperature
    # the noise is drawn on the CPU (the same numbers on every device), then joins the logits
    return torch.stack([lg[i] + gumbel_noise(seed=seed, position=int(p), vocab=lg.shape[-1]).to(lg.device)
                        for i, p in enumerate(positions)]) if len(lg) else lg


def target_tokens(logits: torch.Tensor, positions, *, temperature: float = 0.0, seed: int = 0) -> list[int]:
    """logits [T, N], positions [T] -> the target token of every node."""
    if temperature == 0:
        return logits.argmax(-1).tolist()  # the argmax of the logits' own dtype, no float64 copy
    return decision_scores(logits, positions, temperature=temperature, seed=seed).argmax(-1).tolist()


def decision_margins(scores: torch.Tensor) -> torch.Tensor:
    """[..., N] scores -> [...] how far each row's winner leads its runner-up (inf with one
    candidate). On logits this is the top-1 margin in nats."""
    if scores.shape[-1] < 2:
        return torch.full(scores.shape[:-1], float("inf"), dtype=scores.dtype, device=scores.device)
    top = torch.topk(scores, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def walk(tree: Tree, targets) -> tuple[list[int], int]:
    """The DDTree walk: (accepted path root..a as node indices, bonus token)."""
    cur = 0
    path = [0]
    while True:
        nxt = tree.child_with_token(cur, int(targets[cur]))
        if nxt is None:
            return path, int(targets[cur])
        path.append(nxt)
        cur = nxt


def emitted_tokens(tree: Tree, path: list[int], bonus: int) -> list[int]:
    """Tokens a step emits: the accepted draft tokens (path without the root) then the bonus."""
    return [tree.tokens[n] for n in path[1:]] + [bonus]


def accept_with_rule(tree: Tree, probs: torch.Tensor, *, seed: int, position: int, sampler: str,
                     params: dict | None = None) -> tuple[list[int], int]:
    """A step's (accepted path, bonus) under a named rule of ddsim.sampling.rules at temperature > 0, from the
    verify's distributions probs [T, V] (ddsim.sampling.rules.probabilities). Its random numbers are a pure
    function of (seed, the root's position), so every mode verified from one committed state (the generation's
    and exact's) decides with the same numbers."""
    from ddsim.sampling.rules import RULES, draw_randoms, one_step
    T, V = probs.shape
    gen = torch.Generator().manual_seed(derive_seed(int(seed), "sampler-randoms", int(position)))
    randoms = draw_randoms(RULES[sampler].randoms, R=1, T=T, D=int(tree.depths.max()), V=V, generator=gen)
    return one_step(sampler, parents=tree.parents, tokens=tree.tokens, probs=probs,
                    randoms={k: v[0] for k, v in randoms.items()}, params=params)


def step_law_of(tree: Tree, probs: torch.Tensor, *, sampler: str, params: dict | None = None):
    """The step's exact law (ddsim.sampling.law) under ``sampler`` from the verify's distributions probs [T, V]."""
    from ddsim.sampling.law import step_law
    return step_law(sampler, parents=tree.parents, tokens=tree.tokens, probs=probs, **(params or {}))
