"""Tree samplers with one planted fault each, in ddsim's convention (ddsim.sampling.rules): each is lossy,
and check-sampler must say so at its default settings. Each takes EAGLE's rule (siblings in order, a coin
per child, the target renormalised over the tokens not yet rejected) and breaks one thing."""
from __future__ import annotations

import torch

from ddsim.sampling.rules import _at, _child_tokens, _descend, _without, inverse_cdf, specinfer

RANDOMS = {"coins": "node", "final": "draw"}


def _eagle_like(*, parents, tokens, target, randoms, renormalise=True, coin_per_parent=False, bonus_from_target=False):
    coins, final = randoms["coins"], randoms["final"]

    def step(cur, kids):
        p = _at(target, cur)
        r = p.clone()
        kid, valid, tok = _child_tokens(tokens, kids, cur)
        nxt = torch.full_like(cur, -1)
        for k in range(kid.shape[1]):
            open_ = valid[:, k] & (nxt < 0)
            x = tok[:, k:k + 1]
            px = r.gather(1, x)[:, 0] / (r.sum(-1).clamp_min(1e-300) if renormalise else 1.0)
            u = _at(coins, cur) if coin_per_parent else _at(coins, kid[:, k].clamp(min=0))
            acc = open_ & (u < px)
            nxt = torch.where(acc, kid[:, k], nxt)
            r = _without(r, x, (open_ & ~acc)[:, None])
        return nxt, inverse_cdf(p if bonus_from_target else r, final)
    return _descend(parents, tokens.shape[0], step)


def resample_from_target(*, parents, tokens, target, draft=None, randoms):
    """After every child is rejected, the bonus is drawn from the target, not the residual."""
    return _eagle_like(parents=parents, tokens=tokens, target=target, randoms=randoms, bonus_from_target=True)


def no_renormalise(*, parents, tokens, target, draft=None, randoms):
    """A later sibling is accepted with its raw target probability: the residual is never renormalised."""
    return _eagle_like(parents=parents, tokens=tokens, target=target, randoms=randoms, renormalise=False)


def coins_reused(*, parents, tokens, target, draft=None, randoms):
    """One coin for every sibling of a node instead of a fresh one each."""
    return _eagle_like(parents=parents, tokens=tokens, target=target, randoms=randoms, coin_per_parent=True)


def residual_without_draft_update(*, parents, tokens, target, draft, randoms):
    """SpecInfer's residual rule on siblings drafted without replacement: the draft distribution is not
    updated after a rejection (the rule is lossless only for siblings drafted with replacement)."""
    return specinfer(parents=parents, tokens=tokens, target=target, draft=draft, randoms=randoms)


for _f in (resample_from_target, no_renormalise, coins_reused, residual_without_draft_update):
    _f.randoms = RANDOMS
residual_without_draft_update.uses_draft = True
residual_without_draft_update.drafting = "without-replacement"
