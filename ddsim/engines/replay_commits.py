"""The replay's commit hypotheses: a hybrid engine commits its attention KV and its recurrent state by separate
code (KV rows kept by slot, the recurrent state and conv window copied from one node's intermediate state), and
either can take the wrong nodes. A step whose committed state is wrong (its root already off, or its dumped
state) is recomputed from the state the engine would hold had it committed by one of these rules:

  the accepted path's length read as a batch index   the recurrent state and conv window of node len(path) - 1
  that batch index off by one                        node len(path) (the bonus counted as accepted)
  the last accepted node's parent                    node path[-2] (an accept length off by one)
  the KV rows in batch order                         the KV of nodes 0 .. len(path) - 1 in place of the path's
  the tree committed as a chain                      both of the first and the fourth
  the KV never rolled back                           the KV of every node of the tree kept, in batch order (the
                                                     positions still the tokens' count: the rejected nodes' rows
                                                     stay visible to every later step)

Each rule is tried at the previous step alone, at every step of the request so far (an engine that runs it every
step compounds), and from the state diagnosed at the previous step (a wrong commit's state carried on): the first
that reproduces the engine is its diagnosis, so where the state forgets fast (a Mamba2 state can) the fewest
wrong commits that do are named.
Rules that commit the same nodes give the same state and are tried, and named, together.

Last, where no rule reproduces the engine, the recurrent state and conv window of every other node of the previous
step's tree are tried (its KV the accepted path's), from the exact state and from the state diagnosed there: a wrong
node no rule names, found by search, one verify each. An engine that commits such a node every step is followed
step by step through the carried state. Where the previous step's own committed state was wrong and nothing
reproduced it, the search is not run again: it assumes the exact state before that step, which that step put in
doubt, and a drifting engine would pay a verify per node at every step of its dump."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ddsim.model.state import ModelState
from ddsim.trees.tree import Tree


@dataclass(frozen=True)
class CommitRule:
    why: str  # what the engine reads wrongly, for the evidence
    state_node: object = None  # (path, T) -> the node whose recurrent state is committed; None: the path's last
    kv_rows: object = None  # (path, T) -> the nodes whose KV rows are kept, in order; None: the path's


def _clip(x: int, T: int) -> int:
    return max(0, min(x, T - 1))


RULES = (
    CommitRule("the accepted path's length read as a batch index", lambda path, T: _clip(len(path) - 1, T)),
    CommitRule("that batch index off by one", lambda path, T: _clip(len(path), T)),
    CommitRule("the last accepted node's parent, an accept length off by one", lambda path, T: path[max(len(path) - 2, 0)]),
    CommitRule("the KV rows in batch order", None, lambda path, T: tuple(range(len(path)))),
    CommitRule("the tree committed as a chain", lambda path, T: _clip(len(path) - 1, T),
               lambda path, T: tuple(range(len(path)))),
    CommitRule("the KV never rolled back", None, lambda path, T: tuple(range(T))),
)


def what(rule: CommitRule, path: list[int], T: int) -> tuple[int, tuple[int, ...]]:
    """What ``rule`` commits at a step: (the node whose recurrent state it keeps, the nodes whose KV rows it keeps)."""
    node = rule.state_node(path, T) if rule.state_node else path[-1]
    return node, rule.kv_rows(path, T) if rule.kv_rows else tuple(path)


def words(commit: tuple[int, tuple[int, ...]], path: list[int]) -> str:
    """A step's commit in words, beside the accepted path's."""
    node, rows = commit
    parts = []
    if node != path[-1]:
        parts.append(f"the recurrent state and conv window of node {node} in place of node {path[-1]}'s")
    if list(rows) != list(path):
        parts.append(f"the KV rows of nodes {_nodes(rows)} in place of the accepted path's {list(path)}")
    return " and ".join(parts)


def _nodes(rows) -> str:
    """Nodes in words: a list, or "0..n-1" for the first n nodes past four."""
    return f"0..{len(rows) - 1}" if len(rows) > 4 and list(rows) == list(range(len(rows))) else str(list(rows))


def commit_as(model, *, state: ModelState, tree: Tree, path: list[int], commit, res=None) -> ModelState:
    """The state after a step committed ``commit`` (``what``) from ``state``, the state before the step: the exact
    commit of the accepted ``path``, then its recurrent state and conv window or its new KV rows from other nodes.
    ``res``: the step's exact verify from ``state`` (per-node states kept), where the caller has it already."""
    if res is None:
        res = model.verify(state, tree)
    out = model.commit(state, tree, res, path[-1])
    node, rows = commit
    kv, ssm, conv = list(out.kv), list(out.ssm), list(out.conv)
    if node != path[-1]:  # the replay's model keeps its states in its own dtype: no cast
        for i in model.cfg.recurrent_layers:
            ssm[i] = res.ssm[i][node].clone()
            conv[i] = res.conv[i][node].clone()
    if list(rows) != list(path):
        for i in model.cfg.attention_layers:
            kv[i] = tuple(torch.cat([state.kv[i][side], res.kv[i][side][list(rows)]]) for side in (0, 1))
    return ModelState(out.pos, kv, ssm, conv)


@dataclass
class RequestCommits:
    """One request's steps since its last break in continuity, for the commit hypotheses: the exact state before
    the first of them and before the last, each step's (step number, tree, accepted path), the context the next step
    continues from, per rule the state after the first n steps committed by it (extended as asked), and the state
    a commit hypothesis reproduced at the last step (with its evidence), if one did."""
    start: ModelState
    next_context: list
    steps: list = field(default_factory=list)  # (step number, Tree, accepted path)
    last_exact: ModelState | None = None
    chains: dict = field(default_factory=dict)  # per-step commits (a tuple of what() per step) -> the state after
    diagnosed: tuple | None = None  # (step number, the state before it, origin) of the last step, where one fitted
    unreproduced: int | None = None  # the last step whose committed state was wrong and no hypothesis reproduced

    def chained(self, model, commits: tuple) -> ModelState:
        """The state before the next step had step i committed ``commits[i]``, for every step so far."""
        n, st = 0, self.start
        for k in range(len(commits), 0, -1):  # from the longest prefix already computed
            if commits[:k] in self.chains:
                n, st = k, self.chains[commits[:k]]
                break
        for (_, tree, path), c in zip(self.steps[n:], commits[n:]):
            st = commit_as(model, state=st, tree=tree, path=path, commit=c)
        self.chains[commits] = st
        for key in [k for k in self.chains if len(k) < len(commits) - 1]:  # states no later step extends: freed
            del self.chains[key]
        return st


def hypotheses(model, rec: RequestCommits):
    """(how, state, origin) to try for the next step of ``rec``'s request, fewest wrong commits first: each rule at
    the previous step alone; each rule at every step so far (where it differs from the exact commit at an earlier
    step too); the state diagnosed at the previous step carried on, that step committed exactly, then by each rule;
    last, the search (every node no rule names, from the exact state, then from the carried one). ``origin``: the
    first wrong commit's words, which a carried state keeps."""
    if not rec.steps:
        return
    step, tree, path = rec.steps[-1]
    T, exact = tree.size, (path[-1], tuple(path))
    once: dict = {}  # the previous step's commit -> the rules that give it
    for rule in RULES:
        once.setdefault(what(rule, path, T), []).append(rule)
    once.pop(exact, None)
    # the search's commits, the KV the path's; none after a step whose wrong state nothing reproduced
    searched = [] if rec.unreproduced == step else [(j, tuple(path)) for j in unnamed(path, T)]
    if once or searched:  # one verify of the previous step, every rule's commit and the search's taken from it
        res = model.verify(rec.last_exact, tree)
    for c, rules in once.items():
        how = f"step {step} committed {words(c, path)} ({_why(rules)})"
        yield how, commit_as(model, state=rec.last_exact, tree=tree, path=path, commit=c, res=res), how
    every: dict = {}  # per-step commits -> the rules that give them
    for rule in RULES:
        every.setdefault(tuple(what(rule, p, t.size) for _, t, p in rec.steps), []).append(rule)
    for commits, rules in every.items():
        at = [k for (k, _, p), c in zip(rec.steps, commits) if c != (p[-1], tuple(p))]
        if at and at != [step]:
            how = f"every step committed by {_why(rules)} (other than the accepted path's at steps {', '.join(map(str, at))})"
            yield how, rec.chained(model, commits), how
    carried = rec.diagnosed is not None and rec.diagnosed[0] == step
    if carried:
        _, before, origin = rec.diagnosed
        res_before = model.verify(before, tree)  # the previous step from the state diagnosed there, shared likewise
        yield (f"{origin}, carried on, step {step} committed exactly",
               commit_as(model, state=before, tree=tree, path=path, commit=exact, res=res_before), origin)
        for c, rules in once.items():
            yield (f"{origin}, carried on, and step {step} committed {words(c, path)} ({_why(rules)})",
                   commit_as(model, state=before, tree=tree, path=path, commit=c, res=res_before), origin)
    for c in searched:  # last, the search: every node's recurrent state the rules do not name
        how = f"step {step} committed {words(c, path)} (a node no rule names, found by search)"
        yield how, commit_as(model, state=rec.last_exact, tree=tree, path=path, commit=c, res=res), how
    if carried:
        for c in searched:
            yield (f"{origin}, carried on, and step {step} committed {words(c, path)} (a node no rule names, found "
                   "by search)", commit_as(model, state=before, tree=tree, path=path, commit=c, res=res_before), origin)


def unnamed(path: list[int], T: int) -> list[int]:
    """The nodes of a tree of T nodes whose recurrent state no rule commits after the accepted ``path``, nor the
    exact commit: the search's candidates, in batch order."""
    named = {path[-1]} | {what(rule, path, T)[0] for rule in RULES}
    return [j for j in range(T) if j not in named]


def _why(rules) -> str:
    """The rules that give one commit, in words."""
    return " or ".join(r.why for r in rules)
