"""The one tree representation: parents in topological order plus tokens; everything else derived.

A verify block is node 0 (the root: the last committed token, i.e. the previous step's bonus token)
and draft nodes 1..T-1. ``parents[0] == -1`` and ``0 <= parents[i] < i``. Node index order is the
order in which the verify batch lays the nodes out; children of one parent carry distinct tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from ddsim.errors import TreeError


@dataclass(frozen=True, eq=True)
class Tree:
    parents: tuple[int, ...]
    tokens: tuple[int, ...]

    def __init__(self, parents: Iterable[int], tokens: Iterable[int]):
        p = tuple(int(x) for x in parents)
        t = tuple(int(x) for x in tokens)
        object.__setattr__(self, "parents", p)
        object.__setattr__(self, "tokens", t)
        _validate(p, t)

    # ---- sizes -----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """T, the number of nodes including the root."""
        return len(self.parents)

    def __len__(self) -> int:
        return len(self.parents)

    # ---- derived structure -------------------------------------------------------------------
    @cached_property
    def depths(self) -> np.ndarray:
        """[T] int64: depth[0] = 0, depth[i] = depth[parents[i]] + 1."""
        d = np.zeros(self.size, dtype=np.int64)
        for i in range(1, self.size):
            d[i] = d[self.parents[i]] + 1
        return d

    def positions(self, prefix_len: int) -> np.ndarray:
        """[T] int64: absolute positions, prefix_len + depth."""
        return prefix_len + self.depths

    @cached_property
    def ancestor_mask(self) -> np.ndarray:
        """[T, T] bool: M[i, j] iff j is on the path root..i (ancestor-or-self)."""
        m = np.zeros((self.size, self.size), dtype=bool)
        for i in range(self.size):
            if i > 0:
                m[i] = m[self.parents[i]]
            m[i, i] = True
        return m

    def root_path(self, i: int) -> list[int]:
        """Node indices root..i inclusive."""
        path = []
        while i >= 0:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[i]: child indices of i, in index order."""
        ch: list[list[int]] = [[] for _ in range(self.size)]
        for i in range(1, self.size):
            ch[self.parents[i]].append(i)
        return tuple(tuple(c) for c in ch)

    @cached_property
    def sibling_rank(self) -> np.ndarray:
        """[T] int64: position of a node among its parent's children (index order); root 0.

        For trees from ``ddtree`` this is the top-k rank of the node's token at its depth.
        """
        r = np.zeros(self.size, dtype=np.int64)
        for kids in self.children:
            for k, c in enumerate(kids):
                r[c] = k
        return r

    @cached_property
    def order_exact(self) -> np.ndarray:
        """[T] bool: root, or parent is i-1 and i-1 is order-exact.

        Only these nodes receive the right recurrent state from a flattened (leaky) pass.
        """
        e = np.zeros(self.size, dtype=bool)
        e[0] = True
        for i in range(1, self.size):
            e[i] = self.parents[i] == i - 1 and e[i - 1]
        return e

    @cached_property
    def is_chain(self) -> bool:
        return bool(self.order_exact.all())

    def child_with_token(self, i: int, token: int) -> int | None:
        for c in self.children[i]:
            if self.tokens[c] == token:
                return c
        return None

    # ---- relabeling ---------------------------------------------------------------------------
    def relabel(self, order: Sequence[int]) -> "Tree":
        """The same tree laid out in another topological order.

        ``order[k]`` is the old index of the node placed at new index k; it must be a permutation
        with ``order[0] == 0`` that puts every parent before its children.
        """
        order = [int(x) for x in order]
        if sorted(order) != list(range(self.size)):
            raise TreeError(f"relabel order: not a permutation of 0..{self.size - 1}")
        new_index = {old: new for new, old in enumerate(order)}
        parents = [-1 if self.parents[old] < 0 else new_index[self.parents[old]] for old in order]
        for new, p in enumerate(parents):
            if new > 0 and p >= new:
                raise TreeError(f"relabel order: node {order[new]} placed before its parent")
        return Tree(parents, [self.tokens[old] for old in order])

    def dfs_order(self) -> list[int]:
        """A depth-first topological order (children in index order)."""
        out, stack = [], [0]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(self.children[n]))
        return out

    def bfs_order(self) -> list[int]:
        """A breadth-first topological order."""
        out, frontier = [0], [0]
        while frontier:
            frontier = [c for n in frontier for c in self.children[n]]
            out.extend(frontier)
        return out

    # ---- conversion ---------------------------------------------------------------------------
    def to_networkx(self):
        """A networkx DiGraph with edges parent -> child and node attributes token, depth, order_exact."""
        import networkx as nx

        g = nx.DiGraph()
        for i in range(self.size):
            g.add_node(i, token=self.tokens[i], depth=int(self.depths[i]),
                       order_exact=bool(self.order_exact[i]))
        for i in range(1, self.size):
            g.add_edge(self.parents[i], i)
        return g

    def to_dict(self) -> dict:
        return {"parents": list(self.parents), "tokens": list(self.tokens)}

    @classmethod
    def from_dict(cls, d: dict) -> "Tree":
        if not isinstance(d, dict) or "parents" not in d or "tokens" not in d:
            raise TreeError("tree: expected an object with 'parents' and 'tokens'")
        return cls(d["parents"], d["tokens"])


def _validate(parents: tuple[int, ...], tokens: tuple[int, ...]) -> None:
    if len(parents) == 0:
        raise TreeError("tree: no nodes (the root, node 0, is required)")
    if len(tokens) != len(parents):
        raise TreeError(f"tree: {len(parents)} parents but {len(tokens)} tokens")
    if parents[0] != -1:
        raise TreeError(f"node 0: the root must have parent -1, got {parents[0]}")
    seen: dict[tuple[int, int], int] = {}
    for i, (p, tok) in enumerate(zip(parents, tokens)):
        if tok < 0:
            raise TreeError(f"node {i}: token {tok} is negative")
        if i == 0:
            continue
        if not 0 <= p < i:
            raise TreeError(f"node {i}: parent {p} is not an earlier node (need 0 <= parent < {i})")
        key = (p, tok)
        if key in seen:
            raise TreeError(f"node {i}: token {tok} repeats sibling node {seen[key]} under parent {p}")
        seen[key] = i


def chain(tokens: Sequence[int]) -> Tree:
    """The linear draft (DFlash / MTP): node i's parent is i-1. ``tokens[0]`` is the root."""
    n = len(tokens)
    return Tree([-1] + list(range(n - 1)), tokens)
