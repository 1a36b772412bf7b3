"""Which earlier nodes a node's state is built from, per verify mode (plain Python)."""
from __future__ import annotations

MODES = ("exact", "leaky")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")


def history(parents: list[int], t: int, mode: str) -> list[int]:
    """Nodes whose tokens a node's state has consumed, oldest first, ending with t itself.

    exact: the root path root..t. leaky: nodes 0..t in batch order (what a flattened pass does).
    """
    if mode == "leaky":
        return list(range(t + 1))
    path = []
    while t >= 0:
        path.append(t)
        t = parents[t]
    return path[::-1]


def predecessor(parents: list[int], t: int, mode: str) -> int:
    """The node whose kept state node t's state is one token on from: -1 for the committed state.

    history(t) is history(predecessor(t)) followed by t in both modes, so a verify that steps each node once from its
    predecessor's state makes the same float operations, in the same order, as replaying the node's whole history
    from the committed state: the same bits, in O(T) steps a sequence where the replay takes O(T x depth) (exact)
    and O(T^2) (leaky)."""
    return t - 1 if mode == "leaky" else parents[t]


def parent_rows(parents, B: int, T: int) -> list[list[int]]:
    """parents as B python lists of T ints, validated as trees in topological order."""
    rows = [[int(x) for x in parents[b]] for b in range(B)]
    for b, row in enumerate(rows):
        if len(row) != T:
            raise ValueError(f"parents: row {b} has {len(row)} entries, expected {T}")
        if T and row[0] != -1:
            raise ValueError(f"parents: sequence {b} node 0 must have parent -1, got {row[0]}")
        for i in range(1, T):
            if not 0 <= row[i] < i:
                raise ValueError(f"parents: sequence {b} node {i}: parent {row[i]} is not an earlier node")
    return rows
