"""The tree acceptance rules at temperature > 0, as reference functions, each vectorised over R draws.

Every rule takes the same keyword arguments and returns the same two tensors:

    parents  [T] int64       the tree's shape: parents[0] = -1, parents[i] < i; siblings are tried in
                             node-index order
    tokens   [R, T] int64    each draw's node tokens (the same row R times for a fixed tree); node 0's
                             is the root (the last committed token) and no rule reads it
    target   [R, T, V]       float64 target distribution at every node (the row that predicts the token
                             after the node's prefix); an expanded view is fine
    draft    [R, T, V] | None  the distribution node i's token was drafted from (the draft model's at its
                             parent); row 0 unused; None for a rule that does not read it
    randoms  {name: tensor}  uniform [0, 1) numbers of the shapes the rule declares (RANDOM_KINDS)
    -> path  [R, D + 1] int64  the accepted path, root first, -1 past its end (D the tree's depth)
       bonus [R] int64         the token the step emits after the path's last node (-1: the rule had
                               nothing to sample from; a harness counts that as a failure)

A step emits the path's tokens after the root, then the bonus. The random numbers are inputs, so a
replay recomputes a step exactly from the numbers an engine drew.

A rule is *lossless* when, for the drafting it assumes (``Rule.drafting``), the emitted tokens are
distributed as autoregressive sampling from the target. ``fixed``: any tree whose siblings carry distinct
tokens (top-k trees as engines build them); ``iid``: every node's children drafted independently from the
node's draft distribution; ``without-replacement``: one node's children drafted one after another without
replacement.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

RANDOM_KINDS = {"node": "[R, T]: one per node", "draw": "[R]: one per draw",
                "depth-vocab": "[R, D + 1, V]: one per depth and token"}


@dataclass(frozen=True)
class Rule:
    name: str
    fn: Callable
    randoms: dict  # name -> kind (RANDOM_KINDS)
    drafting: str  # "fixed" | "iid" | "without-replacement": what its guarantee assumes of the tree
    lossless: bool
    source: str  # where the rule comes from
    summary: str  # one sentence: what it guarantees
    uses_draft: bool = False
    params: dict = field(default_factory=dict)  # its knobs and their lossless defaults


def children_table(parents) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [T] -> (kids [T, K] int64: each node's children in index order, -1 padded; depth [T])."""
    par = [int(p) for p in (parents.tolist() if hasattr(parents, "tolist") else parents)]
    kids = [[] for _ in par]
    depth = [0] * len(par)
    for i, p in enumerate(par[1:], start=1):
        kids[p].append(i)
        depth[i] = depth[p] + 1
    width = max(1, max(len(k) for k in kids))
    table = torch.full((len(par), width), -1, dtype=torch.long)
    for i, k in enumerate(kids):
        table[i, :len(k)] = torch.tensor(k, dtype=torch.long)
    return table, torch.tensor(depth, dtype=torch.long)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [R, V] >= 0 (unnormalised), u [R] uniform -> [R] the token whose cumulative interval holds
    u * total; -1 where the weights are all zero."""
    cum = weights.cumsum(-1)
    total = cum[:, -1]
    idx = (cum <= (u * total)[:, None]).sum(-1)
    # rounding can carry u * total past the last positive weight: take that one
    last = weights.shape[-1] - 1 - (weights > 0).flip(-1).float().argmax(-1)
    idx = torch.minimum(idx, last)
    return torch.where(total > 0, idx, torch.full_like(idx, -1))


def _descend(parents, R: int, step) -> tuple[torch.Tensor, torch.Tensor]:
    """From the root: ``step(cur [R]) -> (next node [R] or -1 to stop, bonus [R] for a draw that stops)``,
    until every draw has stopped. -> (path [R, D + 1], bonus [R])."""
    kids, depth = children_table(parents)
    D = int(depth.max())
    cur = torch.zeros(R, dtype=torch.long)
    path = torch.full((R, D + 1), -1, dtype=torch.long)
    path[:, 0] = 0
    bonus = torch.full((R,), -1, dtype=torch.long)
    alive = torch.ones(R, dtype=torch.bool)
    for d in range(D + 1):
        nxt, b = step(cur, kids)
        stop = alive & (nxt < 0)
        bonus[stop] = b[stop]
        alive &= nxt >= 0
        if not bool(alive.any()):
            break
        cur = torch.where(alive, nxt, cur)
        path[alive, d + 1] = nxt[alive]
    return path, bonus


def _at(x: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """x [R, T, ...], cur [R] -> x[r, cur[r]] [R, ...]."""
    return x[torch.arange(len(cur)), cur]


def _child_tokens(tokens, kids, cur):
    """-> (kid [R, K] node ids or -1, valid [R, K], tok [R, K] their tokens (0 where not valid))."""
    kid = kids[cur]
    valid = kid >= 0
    tok = tokens.gather(1, kid.clamp(min=0)).masked_fill(~valid, 0)
    return kid, valid, tok


def _first(kid: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """kid [R, K] children in try order, ok [R, K] -> [R] the first child where ok holds, -1 where none does."""
    return torch.where(ok.any(1), kid.gather(1, ok.float().argmax(1, keepdim=True))[:, 0], -1)


def _holding(tokens, kids, cur, t: torch.Tensor) -> torch.Tensor:
    """[R] the child of cur whose token is t (siblings carry distinct tokens), -1 where none is."""
    kid, valid, tok = _child_tokens(tokens, kids, cur)
    return _first(kid, valid & (tok == t[:, None]))


def _without(p: torch.Tensor, tok: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """p [R, V] with the tokens tok [R, K] zeroed where drop [R, K] (a token listed twice is dropped if
    either entry says so)."""
    hits = torch.zeros(p.shape, dtype=torch.long).scatter_add_(1, tok, drop.long())
    return p.masked_fill(hits > 0, 0.0)


# ---- the rules ---------------------------------------------------------------------------------------------

def greedy(*, parents, tokens, target, draft=None, randoms=None):
    """Temperature 0: follow the child whose token is the argmax; the bonus is the argmax at the last node."""
    def step(cur, kids):
        best = _at(target, cur).argmax(-1)
        return _holding(tokens, kids, cur, best), best
    return _descend(parents, tokens.shape[0], step)


def sglang_target_only(*, parents, tokens, target, draft=None, randoms, threshold_single: float = 1.0,
                       threshold_acc: float = 1.0):
    """SGLang's tree_speculative_sampling_target_only (sgl-kernel speculative_sampling.cuh): one coin per
    node; its children tried in order, accepting child i when coin <= (p(c_1) + .. + p(c_i)) / threshold_acc
    or p(c_i) >= threshold_single; when none is, the bonus is drawn from p with every child zeroed, with the
    draw's final coin. Lossless at threshold_single = threshold_acc = 1 (it is inverse-CDF sampling of p
    with the children's tokens first)."""
    coins, final = randoms["coins"], randoms["final"]
    tau_acc = max(float(threshold_acc), 1e-9)  # the kernel's launcher caps it so

    def step(cur, kids):
        p = _at(target, cur)
        kid, valid, tok = _child_tokens(tokens, kids, cur)
        pk = p.gather(1, tok).masked_fill(~valid, 0.0)
        u = _at(coins, cur)
        ok = valid & ((u[:, None] <= pk.cumsum(1) / tau_acc) | (pk >= threshold_single))
        return _first(kid, ok), inverse_cdf(_without(p, tok, valid), final)
    return _descend(parents, tokens.shape[0], step)


def eagle(*, parents, tokens, target, draft=None, randoms):
    """EAGLE's tree rule (evaluate_posterior in SafeAILab/EAGLE, the draft treated as certain): siblings in
    order, each with a fresh coin: accept c_i when coin < r(c_i), r the target renormalised after zeroing the
    siblings rejected before it; with none accepted, the bonus is drawn from r."""
    coins, final = randoms["coins"], randoms["final"]

    def step(cur, kids):
        r = _at(target, cur).clone()
        kid, valid, tok = _child_tokens(tokens, kids, cur)
        nxt = torch.full_like(cur, -1)
        for k in range(kid.shape[1]):
            open_ = valid[:, k] & (nxt < 0)
            x = tok[:, k:k + 1]
            px = r.gather(1, x)[:, 0] / r.sum(-1).clamp_min(1e-300)
            acc = open_ & (_at(coins, kid[:, k].clamp(min=0)) < px)
            nxt = torch.where(acc, kid[:, k], nxt)
            r = _without(r, x, (open_ & ~acc)[:, None])
        return nxt, inverse_cdf(r, final)
    return _descend(parents, tokens.shape[0], step)


def ddtree_walk(*, parents, tokens, target, draft=None, randoms):
    """The DDTree walk at temperature > 0: at each node sample the target's token (inverse CDF of p with the
    node's coin); step to the child carrying it if there is one, else emit it as the bonus. The greedy walk
    with a sample in place of the argmax."""
    coins = randoms["coins"]

    def step(cur, kids):
        t = inverse_cdf(_at(target, cur), _at(coins, cur))
        return _holding(tokens, kids, cur, t), t
    return _descend(parents, tokens.shape[0], step)


def gumbel_walk(*, parents, tokens, target, draft=None, randoms):
    """ddsim's coupled walk (Contracts: acceptance): the DDTree walk with the sample drawn by the Gumbel-max
    trick from noise per depth (per position), so exact verification emits what seeded autoregressive
    sampling with the same noise emits."""
    noise = randoms["noise"]
    _, depth = children_table(parents)
    g = -torch.log(-torch.log(noise.clamp(1e-300, 1.0 - 1e-16)))

    def step(cur, kids):
        p = _at(target, cur)
        score = torch.where(p > 0, p.clamp_min(1e-300).log(), float("-inf")) + _at(g, depth[cur])
        t = score.argmax(-1)
        return _holding(tokens, kids, cur, t), t
    return _descend(parents, tokens.shape[0], step)


def _residual_rule(*, parents, tokens, target, draft, randoms, without_replacement: bool):
    coins, final = randoms["coins"], randoms["final"]

    def step(cur, kids):
        r = _at(target, cur).clone()
        kid, valid, tok = _child_tokens(tokens, kids, cur)
        q = _at(draft, kid[:, 0].clamp(min=0)).clone()  # every child of a node was drafted from one distribution
        nxt = torch.full_like(cur, -1)
        for k in range(kid.shape[1]):
            open_ = valid[:, k] & (nxt < 0)
            x = tok[:, k:k + 1]
            rn = r / r.sum(-1, keepdim=True).clamp_min(1e-300)
            qn = q / q.sum(-1, keepdim=True).clamp_min(1e-300)
            qx = qn.gather(1, x)[:, 0]
            ratio = torch.where(qx > 0, rn.gather(1, x)[:, 0] / qx.clamp_min(1e-300), torch.ones_like(qx))
            acc = open_ & (_at(coins, kid[:, k].clamp(min=0)) < ratio.clamp(max=1.0))
            nxt = torch.where(acc, kid[:, k], nxt)
            rej = (open_ & ~acc)[:, None]
            nr = (rn - qn).clamp_min(0.0)
            # r <= q everywhere means r == q: the child was accepted with certainty (kept for rounding)
            r = torch.where(rej & (nr.sum(-1, keepdim=True) > 0), nr, r)
            if without_replacement:
                q = _without(q, x, rej)
        return nxt, inverse_cdf(r, final)
    return _descend(parents, tokens.shape[0], step)


def specinfer(*, parents, tokens, target, draft, randoms):
    """SpecInfer's multi-step speculative sampling (Miao et al., ASPLOS 2024; Chen et al. 2023 for one
    draft): children drafted i.i.d. from q are tried in order, child x accepted with probability
    min(1, r(x) / q(x)); on a rejection the residual becomes norm(max(r - q, 0)); with none accepted the
    bonus is drawn from the residual."""
    return _residual_rule(parents=parents, tokens=tokens, target=target, draft=draft, randoms=randoms,
                          without_replacement=False)


def recursive_rejection(*, parents, tokens, target, draft, randoms):
    """Recursive rejection sampling for siblings drafted without replacement (Jeon et al. 2024, Recursive
    Speculative Decoding): as SpecInfer, but after each rejection the draft distribution drops the
    rejected token and is renormalised."""
    return _residual_rule(parents=parents, tokens=tokens, target=target, draft=draft, randoms=randoms,
                          without_replacement=True)


def typical(*, parents, tokens, target, draft=None, randoms, posterior_threshold: float = 0.09,
            posterior_alpha: float = 0.3):
    """Medusa's typical acceptance (Cai et al. 2024, evaluate_posterior): a node passes when its token's
    target probability at its parent exceeds min(posterior_threshold, posterior_alpha * exp(-H(p_parent)));
    the accepted path is the deepest whose nodes all pass (the first such node on a tie); the bonus is
    sampled from the target at its end. Lossy by design: a known-bad reference."""
    final = randoms["final"]
    R, T = tokens.shape
    par = [int(p) for p in (parents.tolist() if hasattr(parents, "tolist") else parents)]
    ent = -(target * target.clamp_min(1e-300).log()).sum(-1)  # [R, T]
    thr = torch.minimum(torch.full_like(ent, posterior_threshold), posterior_alpha * torch.exp(-ent))
    reach = torch.ones(R, T, dtype=torch.bool)
    _, depth = children_table(par)
    for i in range(1, T):
        p = par[i]
        prob = target[:, p].gather(1, tokens[:, i:i + 1])[:, 0]
        reach[:, i] = reach[:, p] & (prob > thr[:, p])
    best = (reach.long() * (depth + 1)).argmax(1)  # deepest reached node, first on a tie
    D = int(depth.max())
    path = torch.full((R, D + 1), -1, dtype=torch.long)
    node = best.clone()
    par_t = torch.tensor(par, dtype=torch.long).clamp(min=0)
    for d in range(D, -1, -1):
        here = depth[node] == d
        path[here, d] = node[here]
        node = torch.where(here & (node > 0), par_t[node], node)
    return path, inverse_cdf(_at(target, best), final)


RULES = {r.name: r for r in (
    Rule("greedy", greedy, {}, "fixed", False, "Contracts: acceptance", "temperature 0 only: emits greedy decoding"),
    Rule("sglang", sglang_target_only, {"coins": "node", "final": "draw"}, "fixed", True,
         "SGLang sgl-kernel tree_speculative_sampling_target_only",
         "lossless for any tree with distinct siblings at threshold_single = threshold_acc = 1; below 1 it "
         "accepts more and is lossy",
         params={"threshold_single": 1.0, "threshold_acc": 1.0}),
    Rule("eagle", eagle, {"coins": "node", "final": "draw"}, "fixed", True, "EAGLE evaluate_posterior",
         "lossless for any tree with distinct siblings"),
    Rule("ddtree", ddtree_walk, {"coins": "node"}, "fixed", True, "the DDTree walk, sampled",
         "lossless for any tree with distinct siblings"),
    Rule("gumbel", gumbel_walk, {"noise": "depth-vocab"}, "fixed", True, "ddsim (Contracts: acceptance)",
         "lossless for any tree with distinct siblings, and coupled to seeded autoregressive sampling"),
    Rule("specinfer", specinfer, {"coins": "node", "final": "draw"}, "iid", True,
         "SpecInfer multi-step speculative sampling", "lossless when every node's children are drafted "
         "independently from its draft distribution (not for top-k trees)", uses_draft=True),
    Rule("rrs", recursive_rejection, {"coins": "node", "final": "draw"}, "without-replacement", True,
         "Recursive Speculative Decoding (recursive rejection sampling)",
         "lossless when siblings are drafted without replacement from the draft distribution", uses_draft=True),
    Rule("typical", typical, {"final": "draw"}, "fixed", False, "Medusa typical acceptance",
         "lossy by design: accepts any token the target finds typical enough",
         params={"posterior_threshold": 0.09, "posterior_alpha": 0.3}),
)}
DRAFTINGS = ("fixed", "iid", "without-replacement")


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [T, V] -> [T, V] float64 softmax(logits / temperature) on the CPU: the distributions a rule reads."""
    return torch.softmax(logits.double().cpu() / temperature, dim=-1)


def one_step(name: str, *, parents, tokens, probs: torch.Tensor, randoms: dict, params: dict | None = None):
    """One step under the named rule: parents and tokens of the tree's T nodes, probs [T, V], the random numbers
    of one draw (each without the draw axis: [T], [] or [D + 1, V]) -> (accepted path, bonus token)."""
    path, bonus = RULES[name].fn(parents=torch.tensor(parents), tokens=torch.tensor(tokens)[None], target=probs[None],
                                 randoms={k: v[None] for k, v in randoms.items()}, **(params or {}))
    return [int(x) for x in path[0] if x >= 0], int(bonus[0])


def draw_randoms(rule_randoms: dict, *, R: int, T: int, D: int, V: int, generator: torch.Generator) -> dict:
    """Uniform [0, 1) float64 numbers of the shapes ``rule_randoms`` declares, for R draws."""
    shape = {"node": (R, T), "draw": (R,), "depth-vocab": (R, D + 1, V)}
    return {name: torch.rand(shape[kind], generator=generator, dtype=torch.float64)
            for name, kind in sorted(rule_randoms.items())}
