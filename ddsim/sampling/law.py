"""A step's exact law under a rule on a fixed tree: which node the accepted path ends at and which bonus
follows, computed from the per-node target distributions without sampling noise.

For the target-only rules (sglang, eagle, ddtree, gumbel) a child c of the path's node u is accepted with
probability p_u(c) (SGLang's thresholds below 1 change that: ``_accept``), and a step that stops at u draws
its bonus from p_u with u's children zeroed. Typical acceptance walks deterministically and draws the bonus
from p at the end; greedy is deterministic throughout.

    law.stop   [T]     P(the accepted path ends at node u)
    law.bonus  [T, V]  P(bonus = b | the path ends at u) (a zero row where u is never the end)

The emitted sequence of a step is the path's tokens then the bonus; different (u, b) are different
sequences, so the total-variation distance between two laws on one tree is half the L1 distance of
stop[u] * bonus[u, b]. ddsim.measure uses these to say how far a leaky mode moves the output distribution
at temperature > 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ddsim.errors import InputError
from ddsim.trees.tree import Tree

TARGET_ONLY = ("sglang", "eagle", "ddtree", "gumbel")
LAW_RULES = TARGET_ONLY + ("typical", "greedy")


@dataclass
class Law:
    stop: torch.Tensor  # [T] float64
    bonus: torch.Tensor  # [T, V] float64
    depth: torch.Tensor  # [T] int64

    def mass(self) -> torch.Tensor:
        """[T, V]: P(the step emits the path to u, then b)."""
        return self.stop[:, None] * self.bonus

    def length_distribution(self) -> torch.Tensor:
        """[D + 1]: P(the step accepts d draft tokens)."""
        return torch.zeros(int(self.depth.max()) + 1, dtype=torch.float64).index_add_(0, self.depth, self.stop)

    def expected_accepted(self) -> float:
        return float((self.stop * self.depth.double()).sum())


def _accept(pk: torch.Tensor, threshold_single: float, threshold_acc: float) -> torch.Tensor:
    """[K] probabilities of the children in try order -> [K + 1]: P(child i is the one accepted), then
    P(none is), under SGLang's rule (at thresholds 1: p(c_i), and 1 - their sum)."""
    tau = max(threshold_acc, 1e-9)
    cum = torch.cat([pk.new_zeros(1), pk.cumsum(0)]).div(tau).clamp(max=1.0)  # P(coin <= cum_i / tau)
    out = torch.zeros(len(pk) + 1, dtype=torch.float64)
    for i in range(len(pk)):
        if pk[i] >= threshold_single:  # accepted whenever reached
            out[i] = 1.0 - cum[i]
            return out
        out[i] = cum[i + 1] - cum[i]
    out[-1] = 1.0 - cum[-1]
    return out


def step_law(rule: str, *, parents, tokens, probs: torch.Tensor, threshold_single: float = 1.0,
             threshold_acc: float = 1.0, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> Law:
    """The law of one step under ``rule`` on the tree (parents, tokens: lists of T), target distributions
    probs [T, V] (rows sum to 1)."""
    if rule not in LAW_RULES:
        raise InputError(f"--sampler {rule}: its exact law needs a fixed tree; one of {', '.join(LAW_RULES)}")
    tree = Tree(parents, tokens)
    tokens, kids = tree.tokens, tree.children
    P = probs.double()
    T, V = P.shape
    depth = torch.from_numpy(tree.depths)
    reach = torch.zeros(T, dtype=torch.float64)
    reach[0] = 1.0
    stop = torch.zeros(T, dtype=torch.float64)
    bonus = torch.zeros(T, V, dtype=torch.float64)
    if rule in ("typical", "greedy"):
        end = _deterministic_end(rule, tree, P, posterior_threshold, posterior_alpha)
        stop[end] = 1.0
        if rule == "greedy":
            bonus[end, int(P[end].argmax())] = 1.0
        else:
            bonus[end] = P[end] / P[end].sum()
        return Law(stop, bonus, depth)
    for u in range(T):  # parents come before children: reach[u] is final here
        ks = kids[u]
        toks = torch.tensor([tokens[c] for c in ks], dtype=torch.long)
        acc = _accept(P[u, toks] if ks else P.new_zeros(0), threshold_single, threshold_acc)
        for c, a in zip(ks, acc[:-1]):
            reach[c] = reach[u] * a
        stop[u] = reach[u] * acc[-1]
        rest = P[u].clone()
        rest[toks] = 0.0
        if float(rest.sum()) > 0:
            bonus[u] = rest / rest.sum()
    return Law(stop, bonus, depth)


def _deterministic_end(rule, tree: Tree, P, posterior_threshold, posterior_alpha) -> int:
    if rule == "greedy":
        u = 0
        while True:
            nxt = [c for c in tree.children[u] if tree.tokens[c] == int(P[u].argmax())]
            if not nxt:
                return u
            u = nxt[0]
    ent = -(P * P.clamp_min(1e-300).log()).sum(-1)
    thr = torch.clamp(posterior_alpha * torch.exp(-ent), max=posterior_threshold)
    ok = [True] + [False] * (tree.size - 1)
    for i in range(1, tree.size):
        p = tree.parents[i]
        ok[i] = ok[p] and bool(P[p, tree.tokens[i]] > thr[p])
    return max(range(tree.size), key=lambda i: (ok[i] * (int(tree.depths[i]) + 1), -i))


def total_variation(a: Law, b: Law) -> float:
    """TV between the emitted-sequence laws of two steps on one tree."""
    return 0.5 * float((a.mass() - b.mass()).abs().sum())


def length_tv(a: Law, b: Law) -> float:
    la, lb = a.length_distribution(), b.length_distribution()
    return 0.5 * float((la - lb).abs().sum())


def first_token(law: Law, parents, tokens) -> torch.Tensor:
    """[V]: the distribution of the step's first emitted token."""
    tree = Tree(parents, tokens)
    out = law.stop[0] * law.bonus[0]
    m = law.mass()
    below = torch.from_numpy(tree.ancestor_mask)  # [T, T]: below[i, c] iff c is on i's root path
    # a draw whose path passes through the root's child c emits c's token first
    for c in tree.children[0]:
        out[tree.tokens[c]] += float(m[below[:, c]].sum())
    return out
