"""SGLang's tensor convention for tree sampling at temperature > 0, so check-sampler can be pointed at the rule
a team ships (``--convention sglang``; ``--impl sgl-kernel`` for sgl_kernel's CUDA kernel).

The convention (sgl_kernel.tree_speculative_sampling_target_only; bs requests, n draft tokens per request,
node 0 the root, d the vocabulary):

    predicts          [bs * n] int32, written: the token chosen after each accepted node (the last: the bonus)
    accept_index      [bs, S] int32, written: the accepted nodes' retrive_index values, root first
                      (S = num_speculative_tokens = the tree's depth + 1)
    accept_token_num  [bs] int32, written: how many draft tokens were accepted
    candidates        [bs, n] int64: each node's token
    retrive_index     [bs, n] int64: each node's global index (b * n + i)
    retrive_next_token, retrive_next_sibling  [bs, n] int64: first child and next sibling, -1 for none
    uniform_samples   [bs, n] float32: the coin of each node (for trying its children)
    uniform_samples_for_final_sampling  [bs] float32: the coin of the bonus draw
    target_probs, draft_probs  [bs, n, d] float32 (draft_probs zeros: the rule writes rejected children's
                      target probabilities into it and samples the bonus from max(target - draft, 0))
    threshold_single, threshold_acc, deterministic

check-sampler runs its R draws as R requests of the same tree. ``tree_speculative_sampling_target_only`` below
is that rule written out in torch, in the same convention, vectorised over requests: the CPU stand-in and
the reference for the adapter (ddsim.sampling.rules.sglang_target_only is the same rule in ddsim's own
convention, written independently).
"""
from __future__ import annotations

import torch

from ddsim.sampling.rules import inverse_cdf

RANDOMS = {"coins": "node", "final": "draw"}


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0,
                                          deterministic: bool = True) -> None:
    """The rule of sgl-kernel's speculative_sampling.cuh, in place, request by request in lock step."""
    bs, n = candidates.shape
    S = accept_index.shape[1]
    rows = torch.arange(bs, device=candidates.device)
    tau = max(float(threshold_acc), 1e-9)
    prob_acc = torch.zeros(bs, dtype=target_probs.dtype, device=target_probs.device)
    at = torch.zeros(bs, dtype=torch.long, device=candidates.device)  # the node whose probabilities are current
    coin = uniform_samples[:, 0].clone()
    last = retrive_index[:, 0].clone()
    accept_index[:, 0] = last.to(accept_index.dtype)
    num = torch.zeros(bs, dtype=torch.long, device=candidates.device)
    cur = torch.zeros(bs, dtype=torch.long, device=candidates.device)
    active = torch.ones(bs, dtype=torch.bool, device=candidates.device)
    for _ in range(1, S):
        cur = torch.where(active, retrive_next_token[rows, cur.clamp(min=0)], cur)
        searching = active & (cur != -1)
        while bool(searching.any()):
            c = cur.clamp(min=0)
            tok = candidates[rows, c]
            single = target_probs[rows, at, tok]
            prob_acc = torch.where(searching, prob_acc + single, prob_acc)
            acc = searching & ((coin <= prob_acc / tau) | (single >= threshold_single))
            rej = searching & ~acc
            if bool(acc.any()):
                idx = retrive_index[rows, c]
                predicts[last[acc]] = tok[acc].to(predicts.dtype)
                num = num + acc.long()
                accept_index[rows[acc], num[acc]] = idx[acc].to(accept_index.dtype)
                last = torch.where(acc, idx, last)
                prob_acc = torch.where(acc, torch.zeros_like(prob_acc), prob_acc)
                coin = torch.where(acc, uniform_samples[rows, c], coin)
                at = torch.where(acc, c, at)
            if bool(rej.any()):
                draft_probs[rows[rej], at[rej], tok[rej]] = target_probs[rows[rej], at[rej], tok[rej]]
                cur = torch.where(rej, retrive_next_sibling[rows, c], cur)
            searching = rej & (cur != -1)
        active &= cur != -1
    accept_token_num.copy_(num.to(accept_token_num.dtype))
    q = target_probs[rows, at].double()
    p = torch.where((num != S - 1)[:, None], draft_probs[rows, at].double(), torch.zeros_like(q))
    predicts[last] = inverse_cdf((q - p).clamp_min(0), uniform_samples_for_final_sampling.double()).to(predicts.dtype)


def to_sglang(*, parents, tokens, target, randoms, device="cpu") -> dict:
    """ddsim's convention (ddsim.sampling.rules) -> the kernel's arguments for R requests."""
    R, T = tokens.shape
    par = [int(p) for p in parents.tolist()]
    first, sibling = [-1] * T, [-1] * T
    for i in range(T - 1, 0, -1):  # built backwards: each node's first child, each child's next sibling
        sibling[i] = first[par[i]]
        first[par[i]] = i
    depth = [0] * T
    for i in range(1, T):
        depth[i] = depth[par[i]] + 1
    S = max(depth) + 1
    rep = lambda x: torch.tensor(x, dtype=torch.long).expand(R, T).contiguous().to(device)  # noqa: E731
    return dict(
        predicts=torch.full((R * T,), -1, dtype=torch.int32, device=device),
        accept_index=torch.full((R, S), -1, dtype=torch.int32, device=device),
        accept_token_num=torch.zeros(R, dtype=torch.int32, device=device),
        candidates=tokens.to(device).contiguous(),
        retrive_index=torch.arange(R * T, dtype=torch.long, device=device).view(R, T),
        retrive_next_token=rep(first), retrive_next_sibling=rep(sibling),
        uniform_samples=randoms["coins"].float().to(device),
        uniform_samples_for_final_sampling=randoms["final"].float().to(device),
        target_probs=target.float().to(device).contiguous(),
        draft_probs=torch.zeros(target.shape, dtype=torch.float32, device=device))


def from_sglang(args: dict, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's outputs -> (path [R, S] node ids, -1 past the end; bonus [R])."""
    acc = args["accept_index"].long().cpu()
    num = args["accept_token_num"].long().cpu()
    R, S = acc.shape
    rows = torch.arange(R)
    col = torch.arange(S)[None, :]
    path = torch.where(col <= num[:, None], acc - rows[:, None] * T, torch.full_like(acc, -1))
    last = acc[rows, num.clamp(0, S - 1)]
    bonus = args["predicts"].long().cpu()[last.clamp(0, R * T - 1)]
    return path, bonus


def adapter(fn, *, threshold_single: float = 1.0, threshold_acc: float = 1.0, device: str = "cpu"):
    """A function in SGLang's convention as a rule in ddsim's (check-sampler's ``call``)."""
    def call(*, parents, tokens, target, draft=None, randoms):
        args = to_sglang(parents=parents, tokens=tokens, target=target, randoms=randoms, device=device)
        fn(**args, threshold_single=threshold_single, threshold_acc=threshold_acc, deterministic=True)
        if device != "cpu":
            torch.cuda.synchronize()
        return from_sglang(args, tokens.shape[1])
    return call
