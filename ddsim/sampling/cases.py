"""check-sampler's cases: a tree shape, a vocabulary, and a target and a draft *model*: a distribution for
every token prefix up to the tree's depth, so that two nodes with the same prefix (duplicate siblings drafted
with replacement) see the same target, as a real model's would.

A prefix (t_1 .. t_l) has the id offset(l) + sum_i t_i V^(l - i), offset(l) = 1 + V + .. + V^(l - 1): the
tables hold every prefix up to length max(D, 1) (V^D <= 2^16 keeps them small).

Distribution families: ``dirichlet:a`` (small a: near-deterministic), ``sharp:e`` (one token 1 - e), ``zeros``
(about half the vocabulary exactly 0), ``ties`` (weights 1 or 2: exact ties), ``uniform``; a draft family may
also be ``target`` (the draft is the target) or ``mix`` (half target, half uniform).

For a rule whose drafting is ``fixed`` a node's children carry the top tokens of the draft at its prefix
(ties to the lower token id); a ``ddtree`` case builds its tree with ddsim's DDTree builder from per-depth
draft marginals. For ``iid`` and ``without-replacement`` the tokens are drafted per draw (ddsim.sampling.check).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ddsim.trees.seeds import derive_seed

MAX_TABLE = 2**16 + 2**12


@dataclass(frozen=True)
class SamplerCase:
    label: str
    vocab: int
    parents: tuple[int, ...]
    target: str  # family (module docstring)
    draft: str
    seed: int
    ddtree: tuple[int, int, int] | None = None  # (budget, topk cap, depth): the shape comes from the DDTree builder

    @property
    def depth(self) -> int:
        if self.ddtree is not None:
            return self.ddtree[2]
        d = [0] * len(self.parents)
        for i in range(1, len(self.parents)):
            d[i] = d[self.parents[i]] + 1
        return max(d)

    def describe(self) -> str:
        return (f"{self.label}: {len(self.parents)} nodes, depth {self.depth}, V={self.vocab}, target {self.target}, "
                f"draft {self.draft}")


def offsets(V: int, L: int) -> list[int]:
    """offset(l) for l = 0 .. L + 1."""
    out = [0]
    for l in range(L + 1):
        out.append(out[-1] + V**l)
    return out


def _family(name: str, n: int, V: int, rng: np.random.Generator) -> np.ndarray:
    kind, _, arg = name.partition(":")
    if kind == "dirichlet":
        p = rng.gamma(float(arg), size=(n, V)) + 1e-300
    elif kind == "sharp":
        e = float(arg)
        p = rng.gamma(1.0, size=(n, V))
        p = p / p.sum(1, keepdims=True) * e
        top = rng.integers(0, V, size=n)
        p[np.arange(n), top] += 1.0 - e
    elif kind == "zeros":
        p = rng.gamma(1.0, size=(n, V)) * (rng.random((n, V)) < 0.5)
        p[np.arange(n), rng.integers(0, V, size=n)] += 1.0  # never all zero
    elif kind == "ties":
        p = rng.integers(1, 3, size=(n, V)).astype(np.float64)
    elif kind == "uniform":
        p = np.ones((n, V))
    else:
        raise ValueError(f"unknown distribution family {name!r}")
    return p / p.sum(1, keepdims=True)


def tables(case: SamplerCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(target [P, V], draft [P, V]) float64 over every prefix up to length max(D, 1)."""
    V, L = case.vocab, max(case.depth, 1)
    P = offsets(V, L)[-1]
    if P > MAX_TABLE:
        raise ValueError(f"{case.label}: {P} prefixes (V^D too large)")
    p = _family(case.target, P, V, np.random.default_rng(derive_seed(case.seed, "sampler-target")))
    if case.draft == "target":
        q = p.copy()
    elif case.draft == "mix":
        q = 0.5 * p + 0.5 / V
    else:
        q = _family(case.draft, P, V, np.random.default_rng(derive_seed(case.seed, "sampler-draft")))
    if case.ddtree is not None:  # DDTree's drafter: one marginal per depth, whatever came before
        off = offsets(V, L)
        for l in range(L + 1):
            q[off[l]:off[l + 1]] = q[off[l]]
    return torch.from_numpy(p), torch.from_numpy(q)


def child_id(parent_id, token, *, V: int, off: list[int], length):
    """The id of a prefix extended by ``token``, from its parent's id and length (tensors or ints)."""
    return off_at(off, length + 1) + (parent_id - off_at(off, length)) * V + token


def off_at(off: list[int], length):
    if isinstance(length, torch.Tensor):
        return torch.tensor(off, dtype=torch.long)[length]
    return off[length]


def fixed_tree(case: SamplerCase, draft: torch.Tensor) -> tuple[tuple[int, ...], list[int]]:
    """(parents, tokens) of the case's fixed tree: top draft tokens per node (or DDTree's tree)."""
    if case.ddtree is not None:
        from ddsim.trees.builders import ddtree
        budget, cap, _ = case.ddtree
        V, off = case.vocab, offsets(case.vocab, max(case.depth, 1))
        marg = torch.stack([draft[off[l]] for l in range(case.depth)])
        t = ddtree(marg.log(), budget, cap, root_token=0, arithmetic="float64")
        return tuple(t.parents), list(t.tokens)
    V, off = case.vocab, offsets(case.vocab, max(case.depth, 1))
    parents = case.parents
    tokens, ids, length = [0], [0], [0]
    used: dict[int, int] = {}
    for i in range(1, len(parents)):
        p = parents[i]
        rank = used.get(p, 0)
        used[p] = rank + 1
        order = sorted(range(V), key=lambda t, row=draft[ids[p]]: (-float(row[t]), t))
        tok = order[rank]
        tokens.append(tok)
        ids.append(child_id(ids[p], tok, V=V, off=off, length=length[p]))
        length.append(length[p] + 1)
    return parents, tokens


def _shape(kind: str, n: int) -> tuple[int, ...]:
    if kind == "chain":
        return tuple(range(-1, n - 1))
    if kind == "star":
        return (-1,) + (0,) * (n - 1)
    if kind == "binary":
        return (-1,) + tuple((i - 1) // 2 for i in range(1, n))
    raise ValueError(kind)


def explicit_cases() -> list[SamplerCase]:
    """Run before the drawn ones, whatever --max-examples says: the shapes each planted fault needs
    (siblings holding most of the mass, a rejected first sibling, a child of probability 0.6 to 0.9,
    near-certain tokens, zeros and ties, a DDTree tree)."""
    return [
        SamplerCase("chain-4", 8, _shape("chain", 5), "dirichlet:1", "mix", 11),
        SamplerCase("star-4, draft = target", 8, _shape("star", 5), "dirichlet:0.5", "target", 12),
        SamplerCase("star-3, flat target", 6, _shape("star", 4), "dirichlet:4", "dirichlet:1", 13),
        SamplerCase("binary depth 3", 6, _shape("binary", 15), "dirichlet:1", "mix", 14),
        SamplerCase("near-deterministic", 8, (-1, 0, 0, 0, 1, 1), "sharp:0.02", "dirichlet:1", 15),
        SamplerCase("zeros", 8, (-1, 0, 0, 1, 1, 2), "zeros", "mix", 16),
        SamplerCase("ties", 5, (-1, 0, 0, 0, 1, 2), "ties", "uniform", 17),
        SamplerCase("one likely child", 6, (-1, 0, 0, 1), "sharp:0.4", "target", 19),
        SamplerCase("ddtree budget 15, cap 4", 12, (-1,), "dirichlet:0.7", "dirichlet:0.7", 18, ddtree=(15, 4, 4)),
    ]


def case_strategy():
    """Hypothesis: small trees of every shape over vocabularies of 2 to 16, every family; one case in three a
    DDTree tree (budget 2 to 24, top-k cap 1 to 4, depth 2 to 4) built from per-depth draft marginals."""
    from hypothesis import strategies as st
    families = st.sampled_from(["dirichlet:0.1", "dirichlet:0.5", "dirichlet:1", "dirichlet:5", "sharp:0.001",
                                "sharp:0.05", "zeros", "ties", "uniform"])
    drafts = st.one_of(families, st.sampled_from(["target", "mix"]))

    @st.composite
    def cases(draw):
        if draw(st.integers(0, 2)) == 0:  # a DDTree tree: its shape comes from the builder
            V = draw(st.integers(2, 12))
            depth = draw(st.integers(2, max(2, min(4, int(np.floor(np.log(2**16) / np.log(V)))))))
            return SamplerCase(f"drawn {draw(st.integers(0, 10**6))}", V, (-1,), draw(families), draw(drafts),
                               draw(st.integers(0, 2**31 - 1)),
                               ddtree=(draw(st.integers(2, 24)), draw(st.integers(1, min(4, V))), depth))
        V = draw(st.integers(2, 16))
        max_depth = max(1, int(np.floor(np.log(2**16) / np.log(V))))
        n = draw(st.integers(2, 16))
        parents = [-1]
        kids = {0: 0}
        depth = [0]
        for i in range(1, n):
            options = [j for j in range(i) if depth[j] < min(max_depth, 4) and kids.get(j, 0) < V]
            p = draw(st.sampled_from(options))
            parents.append(p)
            kids[p] = kids.get(p, 0) + 1
            depth.append(depth[p] + 1)
        return SamplerCase(f"drawn {draw(st.integers(0, 10**6))}", V, tuple(parents), draw(families), draw(drafts),
                           draw(st.integers(0, 2**31 - 1)))
    return cases()
