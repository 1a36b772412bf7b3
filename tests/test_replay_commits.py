"""The replay's commit hypotheses (ddsim/engines/replay_commits.py) by value: what each rule commits, the words
the evidence gives it, the state it leaves, the chain's memo, and the hypotheses in the order they are tried.
In process, so that mutation testing reaches them (tests/MUTATION.md)."""
import pytest
import torch

from ddsim.engines import replay_commits as rc
from ddsim.trees.tree import Tree
from tests.emulated_engine import load_model

PAIRS = Tree([-1, 0, 0, 1, 1, 3, 3], [5, 6, 7, 8, 9, 10, 11])  # node 1, 3, 5 the path, each with a sibling after it
PATH = [0, 1, 3, 5]


@pytest.mark.parametrize("path, T, want", [
    # the path leaves batch order: each rule its own nodes (the batch index and the parent agree on node 3 here)
    ([0, 1, 3, 5], 7, [(3, (0, 1, 3, 5)), (4, (0, 1, 3, 5)), (3, (0, 1, 3, 5)), (5, (0, 1, 2, 3)), (3, (0, 1, 2, 3)),
                       (5, (0, 1, 2, 3, 4, 5, 6))]),
    ([0, 2, 6], 7, [(2, (0, 2, 6)), (3, (0, 2, 6)), (2, (0, 2, 6)), (6, (0, 1, 2)), (2, (0, 1, 2)),
                    (6, (0, 1, 2, 3, 4, 5, 6))]),
    # nothing accepted: the root's state either way, but one past the batch index is node 1 (and no rollback keeps all)
    ([0], 7, [(0, (0,)), (1, (0,)), (0, (0,)), (0, (0,)), (0, (0,)), (0, (0, 1, 2, 3, 4, 5, 6))]),
    # a chain accepted whole: one past the batch index is clipped to the last node; no rollback is the exact commit
    ([0, 1, 2, 3], 4, [(3, (0, 1, 2, 3)), (3, (0, 1, 2, 3)), (2, (0, 1, 2, 3)), (3, (0, 1, 2, 3)), (3, (0, 1, 2, 3)),
                       (3, (0, 1, 2, 3))]),
    ([0, 1, 2], 4, [(2, (0, 1, 2)), (3, (0, 1, 2)), (1, (0, 1, 2)), (2, (0, 1, 2)), (2, (0, 1, 2)), (2, (0, 1, 2, 3))]),
])
def test_what_each_rule_commits(path, T, want):
    assert [rc.what(r, path, T) for r in rc.RULES] == want


@pytest.mark.parametrize("path, T, want", [
    ([0, 1, 3, 5], 7, [0, 1, 2, 6]),  # the rules name 3 and 4, the path ends at 5
    ([0, 2, 6], 7, [0, 1, 4, 5]),
    ([0], 7, [2, 3, 4, 5, 6]),  # one past the batch index is node 1
    ([0, 1, 2, 3], 4, [0, 1]),
    ([0], 1, []),
])
def test_the_nodes_the_search_tries(path, T, want):
    assert rc.unnamed(path, T) == want


def test_the_words_of_a_commit():
    assert rc.words((3, (0, 1, 3, 5)), PATH) == "the recurrent state and conv window of node 3 in place of node 5's"
    assert rc.words((5, (0, 1, 2, 3)), PATH) == ("the KV rows of nodes [0, 1, 2, 3] in place of the accepted path's "
                                                 "[0, 1, 3, 5]")
    assert rc.words((3, (0, 1, 2, 3)), PATH) == (
        "the recurrent state and conv window of node 3 in place of node 5's and the KV rows of nodes [0, 1, 2, 3] in "
        "place of the accepted path's [0, 1, 3, 5]")
    assert rc.words((5, (0, 1, 3, 5)), PATH) == ""
    # the first n nodes past four as a range, others as a list
    assert rc.words((5, (0, 1, 2, 3, 4, 5, 6)), PATH) == "the KV rows of nodes 0..6 in place of the accepted path's [0, 1, 3, 5]"
    assert rc.words((5, (0, 1, 2, 3, 4)), PATH) == "the KV rows of nodes 0..4 in place of the accepted path's [0, 1, 3, 5]"
    assert rc.words((5, (0, 1, 2, 4, 5)), PATH) == ("the KV rows of nodes [0, 1, 2, 4, 5] in place of the accepted "
                                                    "path's [0, 1, 3, 5]")


@pytest.fixture(scope="module")
def model(ckpt):
    torch.manual_seed(0)
    return load_model(ckpt)


def _same(a, b) -> bool:
    def eq(x, y):
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
    return a.pos == b.pos and all(eq(x, y) for x, y in zip(a.ssm, b.ssm)) and all(
        eq(x, y) for x, y in zip(a.conv, b.conv)) and all(
        (p is None and q is None) or (eq(p[0], q[0]) and eq(p[1], q[1])) for p, q in zip(a.kv, b.kv))


def test_a_commit_as_the_rules_say(model):
    """The exact commit is the model's own, bit for bit; a rule's takes its recurrent state and conv window, or its
    new KV rows, from the nodes it names, and the rest from the exact commit."""
    st = model.prefill([3, 1, 4])[0]
    res = model.verify(st, PAIRS, mode="exact")
    exact = model.commit(st, PAIRS, res, 5)
    assert _same(rc.commit_as(model, state=st, tree=PAIRS, path=PATH, commit=(5, (0, 1, 3, 5))), exact)
    by_node = rc.commit_as(model, state=st, tree=PAIRS, path=PATH, commit=(4, (0, 1, 3, 5)))
    rec, att = model.cfg.recurrent_layers, model.cfg.attention_layers
    assert rec and att and by_node.pos == exact.pos == st.pos + 4
    for i in rec:
        assert torch.equal(by_node.ssm[i], res.ssm[i][4]) and torch.equal(by_node.conv[i], res.conv[i][4])
        assert not torch.equal(by_node.ssm[i], exact.ssm[i])
    for i in att:
        assert torch.equal(by_node.kv[i][0], exact.kv[i][0]) and torch.equal(by_node.kv[i][1], exact.kv[i][1])
    by_rows = rc.commit_as(model, state=st, tree=PAIRS, path=PATH, commit=(5, (0, 1, 2, 3)))
    for i in att:
        for side in (0, 1):
            assert torch.equal(by_rows.kv[i][side][:st.pos], st.kv[i][side])
            assert torch.equal(by_rows.kv[i][side][st.pos:], res.kv[i][side][[0, 1, 2, 3]])
    for i in rec:
        assert torch.equal(by_rows.ssm[i], exact.ssm[i]) and torch.equal(by_rows.conv[i], exact.conv[i])


def test_the_chain_commits_every_step_and_extends_its_longest_known_prefix(model, monkeypatch):
    st = model.prefill([3, 1, 4])[0]
    rec = rc.RequestCommits(start=st, next_context=[])
    steps = [(0, PAIRS, PATH), (1, PAIRS, PATH), (2, PAIRS, [0, 2])]
    commits = [(3, (0, 1, 3, 5)), (4, (0, 1, 3, 5)), (2, (0, 2))]
    want = st
    for (_, tree, path), c in zip(steps, commits):  # by hand
        want = rc.commit_as(model, state=want, tree=tree, path=path, commit=c)
    calls = []
    real = rc.commit_as
    monkeypatch.setattr(rc, "commit_as", lambda *a, **kw: calls.append(kw["commit"]) or real(*a, **kw))
    rec.steps = steps[:1]
    rec.chained(model, tuple(commits[:1]))
    rec.steps = steps[:2]
    rec.chained(model, tuple(commits[:2]))
    assert calls == commits[:2]  # the second from the first's memo
    rec.steps = steps
    assert _same(rec.chained(model, tuple(commits)), want)
    assert calls == commits  # the first two steps from the memo, the third committed once
    assert sorted(map(len, rec.chains)) == [2, 3]  # the one-step state freed: a long dump keeps two per rule
    calls.clear()
    assert _same(rec.chained(model, tuple(commits)), want) and calls == []


def test_the_hypotheses_in_the_order_tried(model):
    """The previous step alone, fewest wrong commits first, rules that commit the same nodes named together; then
    every step; then the diagnosed state carried on; last, the search, from the exact state and then the carried one.
    A rule that commits the accepted path at every step is no hypothesis."""
    st = model.prefill([3, 1, 4])[0]
    rec = rc.RequestCommits(start=st, next_context=[], steps=[(0, PAIRS, [0]), (1, PAIRS, PATH)], last_exact=st)
    hows_alone = hows = [h for h, _, _ in rc.hypotheses(model, rec)]
    assert hows == [
        "step 1 committed the recurrent state and conv window of node 3 in place of node 5's (the accepted path's "
        "length read as a batch index or the last accepted node's parent, an accept length off by one)",
        "step 1 committed the recurrent state and conv window of node 4 in place of node 5's (that batch index off by one)",
        "step 1 committed the KV rows of nodes [0, 1, 2, 3] in place of the accepted path's [0, 1, 3, 5] (the KV rows "
        "in batch order)",
        "step 1 committed the recurrent state and conv window of node 3 in place of node 5's and the KV rows of nodes "
        "[0, 1, 2, 3] in place of the accepted path's [0, 1, 3, 5] (the tree committed as a chain)",
        "step 1 committed the KV rows of nodes 0..6 in place of the accepted path's [0, 1, 3, 5] (the KV never rolled "
        "back)",
        # at step 0 (nothing accepted) only one past the batch index and no rollback differ: the rules tried at every step
        "every step committed by that batch index off by one (other than the accepted path's at steps 0, 1)",
        "every step committed by the KV never rolled back (other than the accepted path's at steps 0, 1)",
    ] + SEARCH
    rec.diagnosed = (1, st, "ORIGIN")
    hows = [h for h, _, _ in rc.hypotheses(model, rec)]
    assert hows[:7] + hows[13:17] == hows_alone
    assert hows[7:13] == [
        "ORIGIN, carried on, step 1 committed exactly",
        "ORIGIN, carried on, and step 1 committed the recurrent state and conv window of node 3 in place of node 5's "
        "(the accepted path's length read as a batch index or the last accepted node's parent, an accept length off by one)",
        "ORIGIN, carried on, and step 1 committed the recurrent state and conv window of node 4 in place of node 5's "
        "(that batch index off by one)",
        "ORIGIN, carried on, and step 1 committed the KV rows of nodes [0, 1, 2, 3] in place of the accepted path's "
        "[0, 1, 3, 5] (the KV rows in batch order)",
        "ORIGIN, carried on, and step 1 committed the recurrent state and conv window of node 3 in place of node 5's and "
        "the KV rows of nodes [0, 1, 2, 3] in place of the accepted path's [0, 1, 3, 5] (the tree committed as a chain)",
        "ORIGIN, carried on, and step 1 committed the KV rows of nodes 0..6 in place of the accepted path's [0, 1, 3, 5] "
        "(the KV never rolled back)"]
    assert hows[17:] == [f"ORIGIN, carried on, and {h}" for h in SEARCH]
    assert [o for _, _, o in rc.hypotheses(model, rec)] == hows[:7] + ["ORIGIN"] * 6 + SEARCH + ["ORIGIN"] * 4
    rec.diagnosed = (0, st, "ORIGIN")  # diagnosed at an earlier step than the last: not carried
    assert [h for h, _, _ in rc.hypotheses(model, rec)] == hows_alone
    rec.unreproduced = 1  # the last step's wrong state reproduced by nothing: no search after it
    assert [h for h, _, _ in rc.hypotheses(model, rec)] == hows_alone[:7]
    rec.unreproduced = 0  # an earlier step's: searched
    assert [h for h, _, _ in rc.hypotheses(model, rec)] == hows_alone
    # the states: the first is step 1 alone committed at node 3 from the exact state before it
    (_, s0, o0), *_, (_, s_last, _) = rc.hypotheses(model, rec)
    assert _same(s0, rc.commit_as(model, state=st, tree=PAIRS, path=PATH, commit=(3, (0, 1, 3, 5)))) and o0.startswith(
        "step 1 committed")
    assert _same(s_last, rc.commit_as(model, state=st, tree=PAIRS, path=PATH, commit=(6, (0, 1, 3, 5))))  # searched
    assert list(rc.hypotheses(model, rc.RequestCommits(start=st, next_context=[]))) == []
    # nothing accepted at the last step: only one past the batch index commits other than the path there; rules that
    # agree at every step are named together
    rec = rc.RequestCommits(start=st, next_context=[], steps=[(0, PAIRS, PATH), (1, PAIRS, [0])], last_exact=st)
    assert [h for h, _, _ in rc.hypotheses(model, rec)] == [
        "step 1 committed the recurrent state and conv window of node 1 in place of node 0's (that batch index off by one)",
        "step 1 committed the KV rows of nodes 0..6 in place of the accepted path's [0] (the KV never rolled back)",
        "every step committed by the accepted path's length read as a batch index or the last accepted node's parent, an "
        "accept length off by one (other than the accepted path's at steps 0)",
        "every step committed by that batch index off by one (other than the accepted path's at steps 0, 1)",
        "every step committed by the KV rows in batch order (other than the accepted path's at steps 0)",
        "every step committed by the tree committed as a chain (other than the accepted path's at steps 0)",
        "every step committed by the KV never rolled back (other than the accepted path's at steps 0, 1)"] + [
        f"step 1 committed the recurrent state and conv window of node {j} in place of node 0's (a node no rule names, "
        "found by search)" for j in (2, 3, 4, 5, 6)]
    # a chain of two accepted whole: the rules name every node, so nothing is searched; the parent is still tried
    rec = rc.RequestCommits(start=st, next_context=[], steps=[(0, Tree([-1, 0], [5, 6]), [0, 1])], last_exact=st)
    assert [h for h, _, _ in rc.hypotheses(model, rec)] == [
        "step 0 committed the recurrent state and conv window of node 0 in place of node 1's (the last accepted node's "
        "parent, an accept length off by one)"]


# the search after PATH on PAIRS: the nodes no rule names, the KV the path's
SEARCH = [f"step 1 committed the recurrent state and conv window of node {j} in place of node 5's (a node no rule names, "
          "found by search)" for j in (0, 1, 2, 6)]


def test_the_previous_step_is_verified_once_per_state_it_is_tried_from(model, monkeypatch):
    """Every rule's commit of the previous step alone comes from one verify of it, and every carried one from one
    more: a serving-sized tree is verified twice, not once per rule."""
    st = model.prefill([3, 1, 4])[0]
    last, before = st.clone(), st.clone()
    rec = rc.RequestCommits(start=st, next_context=[], steps=[(0, PAIRS, [0]), (1, PAIRS, PATH)], last_exact=last,
                            diagnosed=(1, before, "ORIGIN"))
    calls = []
    real = model.verify
    monkeypatch.setattr(model, "verify", lambda state, tree, **kw: calls.append(state) or real(state, tree, **kw))
    assert len(list(rc.hypotheses(model, rec))) == 21  # 5 alone, 2 at every step, 6 carried on, 4 + 4 searched
    assert sum(c is last for c in calls) == 1 and sum(c is before for c in calls) == 1
