"""Tree builders: DDTree (best-first over per-depth top-k), chain, static choice lists, random trees."""
from __future__ import annotations

import heapq
import math
import operator
from typing import Sequence

import numpy as np
import torch

from ddsim.errors import InputError
from ddsim.trees.tree import Tree, chain

__all__ = ["ddtree", "chain", "static_tree", "random_tree", "topk_logprobs", "EAGLE_CHOICES_DEFAULT"]


def _check_logits(draft_logits, name: str = "draft_logits") -> torch.Tensor:
    x = torch.as_tensor(draft_logits)
    if x.dim() != 2:
        raise InputError(f"{name}: expected shape [D, V], got {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise InputError(f"{name}: vocabulary size is 0")
    if not x.is_floating_point():
        raise InputError(f"{name}: expected a floating dtype, got {x.dtype}")
    # a finite sum means every entry is finite (a NaN or an infinity makes the sum non-finite): one pass,
    # no mask, at a 248k vocabulary; a non-finite sum (or finite entries that overflow it) is looked into
    if not math.isfinite(float(x.sum())) and not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).nonzero()[0].tolist()
        raise InputError(f"{name}: non-finite value at depth row {bad[0]}, token {bad[1]}")
    return x.detach().to("cpu", torch.float64)


ARITHMETICS = ("published", "float64")


def topk_logprobs(draft_logits, k: int, *, arithmetic: str = "float64") -> tuple[np.ndarray, np.ndarray]:
    """Per depth, the k best log-probs and their tokens: ``lp[d] = topk(logits[d]) - logsumexp``.

    Returns (lp [D, k], tok [D, k] int64), ranks in descending order.
    arithmetic "published": as the published DDTree implementation computes them: logits in float32,
    torch.topk (its order among equal logits), log-probs rounded to float32.
    arithmetic "float64": float64 throughout; ties break towards the lower token id (stable sort).
    """
    if arithmetic not in ARITHMETICS:
        raise InputError(f"arithmetic: expected one of {ARITHMETICS}, got {arithmetic!r}")
    return _topk_logprobs(_check_logits(draft_logits), k, arithmetic)


def _topk_logprobs(x: torch.Tensor, k: int, arithmetic: str) -> tuple[np.ndarray, np.ndarray]:
    """topk_logprobs of logits already checked (_check_logits: [D, V] finite float64 on the CPU)."""
    if arithmetic == "published":
        x32 = x.float()
        vals, order = torch.topk(x32, k, dim=-1)  # [D, k]
        lp = (vals - torch.logsumexp(x32, dim=-1, keepdim=True)).numpy()  # float32
        return lp, order.numpy()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [D, 1]
    order = torch.sort(-x, dim=-1, stable=True).indices[:, :k]  # [D, k]
    lp = (torch.gather(x, 1, order) - lse).numpy()
    return lp, order.numpy()


def is_whole(v, lo: int) -> bool:
    """Whether v is an integer of at least lo: anything with __index__ (Python's, numpy's, a 0-d integer tensor) but a
    bool, which Python counts as 1 or 0."""
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, torch.Tensor) and v.dtype == torch.bool):
        return False
    try:
        return operator.index(v) >= lo
    except TypeError:
        return False


def check_whole(name: str, v, lo: int) -> None:
    """is_whole, or an InputError naming ``name``."""
    if not is_whole(v, lo):
        raise InputError(f"{name}: expected an integer >= {lo}, got {v!r}")


def ddtree(draft_logits, budget: int, topk_cap: int | None = None, *, root_token: int = 0,
           arithmetic: str = "published") -> Tree:
    """The published DDTree construction, node for node, ties included.

    draft_logits: [D, V], row d-1 holds the drafter's logits for depth d.
    Per depth, ``k = min(budget, V, topk_cap or inf)`` top log-probs. Best-first over rank paths
    with a max-heap keyed by (-score, rank-path tuple); a path's score is the sum of its
    per-depth log-probs. Start with (depth 1, rank 0) under the root. Each pop creates the next
    node (index = pop order) and pushes its next sibling (rank+1 < k) and its first child
    (depth < D). Stops at ``budget`` non-root nodes; budget 0 gives the root alone.

    arithmetic "published" (default) reproduces the published implementation's numbers: float32
    log-probs (topk_logprobs), scores accumulated in Python floats, a first child's score its
    parent's plus the depth's best log-prob, and a sibling's score updated from the previous
    sibling's (score - lp[rank] + lp[rank + 1]), so at exact ties the same tree comes out.
    "float64": float64 log-probs and each sibling's score the parent's plus its own log-prob (the
    exact path sum).
    """
    check_whole("budget", budget, 0)
    if topk_cap is not None and not is_whole(topk_cap, 1):
        raise InputError(f"topk_cap: expected an integer >= 1 or None, got {topk_cap!r}")
    check_whole("root_token", root_token, 0)
    if arithmetic not in ARITHMETICS:
        raise InputError(f"arithmetic: expected one of {ARITHMETICS}, got {arithmetic!r}")
    x = _check_logits(draft_logits)
    D, V = x.shape
    parents, tokens = [-1], [int(root_token)]
    if budget == 0 or D == 0:
        return Tree(parents, tokens)
    k = min(int(budget), V, int(topk_cap) if topk_cap else V)
    lp, tok = _topk_logprobs(x, k, arithmetic)  # x checked once above (a full scan at a 248k vocabulary)
    lp_list = lp.tolist()  # python floats (float32 values exactly, under "published")
    incremental = arithmetic == "published"

    # heap entries: (-score, rank_path, parent_index, parent_score); depth = len(rank_path).
    # Rank paths are unique, so comparison never reaches the later fields.
    heap: list[tuple[float, tuple[int, ...], int, float]] = [(-lp_list[0][0], (0,), 0, 0.0)]
    while heap and len(parents) - 1 < budget:
        neg, path, parent, parent_score = heapq.heappop(heap)
        depth, rank = len(path), path[-1]
        node = len(parents)
        parents.append(parent)
        tokens.append(int(tok[depth - 1][rank]))
        score = -neg
        if rank + 1 < k:  # next sibling: same parent, next rank at this depth
            row = lp_list[depth - 1]
            sib = score - row[rank] + row[rank + 1] if incremental else parent_score + row[rank + 1]
            heapq.heappush(heap, (-sib, path[:-1] + (rank + 1,), parent, parent_score))
        if depth < D:  # first child: rank 0 one depth down
            heapq.heappush(heap, (-(score + lp_list[depth][0]), path + (0,), node, score))
    return Tree(parents, tokens)


def path_score(lp: Sequence[Sequence[float]], path: Sequence[int]) -> float:
    """Score of a rank path: per-depth log-probs summed from depth 1 down."""
    s = 0.0
    for d, r in enumerate(path):
        s = s + lp[d][r]
    return s


# Medusa/EAGLE-style static tree: each tuple is a rank path (top-k rank per depth).
EAGLE_CHOICES_DEFAULT: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (1, 0, 0), (1, 0, 1),
    (1, 1, 0), (2, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0),
)


def static_tree(choices: Sequence[Sequence[int]], draft_logits, *, root_token: int = 0) -> Tree:
    """A static choice-list tree (EAGLE/Medusa): every choice is a rank path.

    Nodes are laid out as Medusa does: sorted by (depth, rank path). Rank r at depth d takes the
    r-th best token of ``draft_logits[d-1]``. Every proper prefix of a choice must be a choice.
    """
    check_whole("root_token", root_token, 0)
    paths = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda p: (len(p), p))
    if any(len(p) == 0 for p in paths):
        raise InputError("choices: an empty rank path (the root is implicit)")
    x = _check_logits(draft_logits)
    D, V = x.shape
    max_depth = max((len(p) for p in paths), default=0)
    max_rank = max((max(p) for p in paths), default=0)
    if max_depth > D:
        raise InputError(f"choices: depth {max_depth} needs {max_depth} logit rows, draft_logits has {D}")
    if max_rank >= V:
        raise InputError(f"choices: rank {max_rank} is beyond the vocabulary ({V})")
    if any(r < 0 for p in paths for r in p):
        raise InputError("choices: negative rank")
    _, tok = topk_logprobs(x, max_rank + 1)
    index = {(): 0}
    parents, tokens = [-1], [int(root_token)]
    for p in paths:
        if p[:-1] not in index:
            raise InputError(f"choices: {list(p)} has no parent choice {list(p[:-1])}")
        index[p] = len(parents)
        parents.append(index[p[:-1]])
        tokens.append(int(tok[len(p) - 1][p[-1]]))
    return Tree(parents, tokens)


def random_tree(size: int, *, vocab: int, rng: np.random.Generator, max_children: int | None = None,
                root_token: int | None = None) -> Tree:
    """A random tree of ``size`` nodes: each new node picks a uniformly random earlier parent
    (that still has room for a child and a fresh token)."""
    check_whole("size", size, 1)
    check_whole("vocab", vocab, 1)
    if max_children is not None:
        check_whole("max_children", max_children, 1)
    if root_token is not None:
        check_whole("root_token", root_token, 0)
    cap = min(vocab, max_children or vocab)
    parents = [-1]
    tokens = [int(rng.integers(vocab)) if root_token is None else int(root_token)]
    used: list[set[int]] = [set()]
    for i in range(1, size):
        open_nodes = [n for n in range(i) if len(used[n]) < cap]
        if not open_nodes:
            raise InputError(f"size: {size} nodes do not fit with vocab {vocab}, max_children {max_children}")
        p = open_nodes[int(rng.integers(len(open_nodes)))]
        free = [t for t in range(vocab) if t not in used[p]] if len(used[p]) > vocab // 2 else None
        while True:
            t = int(free[int(rng.integers(len(free)))]) if free else int(rng.integers(vocab))
            if t not in used[p]:
                break
        used[p].add(t)
        parents.append(p)
        tokens.append(t)
        used.append(set())
    return Tree(parents, tokens)
