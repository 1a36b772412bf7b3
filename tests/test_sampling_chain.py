"""Fast value tests of the chain behind check-sampler's verdict and the sampled audit's figures, for mutation
testing (`make mutation`): the L1 test (ddsim.sampling.stats), the step law (ddsim.sampling.law), the reference
rules on hand-built coins (ddsim.sampling.rules), and the harness's output checks, counts and tests
(ddsim.sampling.check). Every expected value is written out by hand."""
import math

import pytest
import torch

from ddsim.sampling import check as ck
from ddsim.sampling import law as lw
from ddsim.sampling import rules as rl
from ddsim.sampling import stats as st
from ddsim.sampling.cases import child_id, offsets

# ---- the L1 test -------------------------------------------------------------------------------------------


def test_the_threshold_is_the_jensen_term_plus_the_mcdiarmid_term():
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    want = (0.5 + 0.5) / math.sqrt(100) + math.sqrt(2 * math.log(1 / 0.01) / 100)
    assert st.l1_threshold(p, 100, 0.01) == pytest.approx(want, rel=1e-12)
    assert st.l1_threshold(torch.tensor([1.0, 0.0], dtype=torch.float64), 100, 0.01) == pytest.approx(
        math.sqrt(2 * math.log(100) / 100), rel=1e-12)


def test_the_l1_test_counts_holds_and_impossible_draws():
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    t = st.l1_test(torch.tensor([50, 50, 0]), p, 0.01)
    assert t["n"] == 100 and t["l1"] == 0 and t["impossible"] == 0 and t["holds"]
    t = st.l1_test(torch.tensor([49, 50, 1]), p, 0.01)  # one draw where p is 0: certain failure
    assert t["impossible"] == 1 and not t["holds"] and t["l1"] == pytest.approx(0.02)
    t = st.l1_test(torch.tensor([90, 10, 0]), p, 0.01)
    assert t["l1"] == pytest.approx(0.8) and not t["holds"]
    thr = st.l1_threshold(p, 100, 0.01)
    at = st.l1_test(torch.tensor([50 + round(thr * 50), 50 - round(thr * 50), 0]), p, 0.01)
    assert at["holds"] == (at["l1"] <= at["threshold"])


def test_the_detectable_total_variation():
    want = 0.5 * (2 * math.sqrt(15 / 1e6) + math.sqrt(2 * math.log(1e9) / 1e6) + math.sqrt(2 * math.log(100) / 1e6))
    assert st.detectable_tv(16, 10**6, 1e-9) == pytest.approx(want, rel=1e-12)
    assert st.detectable_tv(16, 10**6, 1e-9, beta=0.5) < st.detectable_tv(16, 10**6, 1e-9)


# ---- the step law -------------------------------------------------------------------------------------------

# root 0 with children 1 (token 1) and 2 (token 2); node 3 (token 3) under node 1
PAR, TOK = [-1, 0, 0, 1], [0, 1, 2, 3]
P = torch.tensor([[0.1, 0.5, 0.25, 0.15],
                  [0.2, 0.2, 0.2, 0.4],
                  [0.25, 0.25, 0.25, 0.25],
                  [0.0, 0.5, 0.5, 0.0]], dtype=torch.float64)


def test_accept_probabilities_by_hand():
    assert lw._accept(torch.tensor([0.5, 0.25], dtype=torch.float64), 1.0, 1.0).tolist() == [0.5, 0.25, 0.25]
    # threshold_acc 0.5: coin <= cum / 0.5
    assert lw._accept(torch.tensor([0.2, 0.1], dtype=torch.float64), 1.0, 0.5).tolist() == pytest.approx([0.4, 0.2, 0.4])
    assert lw._accept(torch.tensor([0.5, 0.25], dtype=torch.float64), 1.0, 0.5).tolist() == [1.0, 0.0, 0.0]
    # threshold_single 0.3: the second child (0.4 >= 0.3) takes whatever the first leaves
    assert lw._accept(torch.tensor([0.2, 0.4, 0.1], dtype=torch.float64), 0.3, 1.0).tolist() == pytest.approx(
        [0.2, 0.8, 0.0, 0.0])
    assert lw._accept(torch.zeros(0, dtype=torch.float64), 1.0, 1.0).tolist() == [1.0]


def test_the_lossless_law_by_hand():
    law = lw.step_law("sglang", parents=PAR, tokens=TOK, probs=P)
    assert law.stop.tolist() == pytest.approx([0.25, 0.5 * 0.6, 0.25, 0.5 * 0.4])
    assert law.bonus[0].tolist() == pytest.approx([0.4, 0.0, 0.0, 0.6])  # children 1, 2 removed
    assert law.bonus[1].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])  # child 3 removed
    assert law.bonus[3].tolist() == pytest.approx([0.0, 0.5, 0.5, 0.0])
    assert law.length_distribution().tolist() == pytest.approx([0.25, 0.55, 0.2])
    assert law.expected_accepted() == pytest.approx(0.55 + 0.4)
    assert lw.first_token(law, PAR, TOK).tolist() == pytest.approx(P[0].tolist())
    assert law.depth.tolist() == [0, 1, 1, 2]


def test_distances_between_laws_by_hand():
    a = lw.step_law("sglang", parents=PAR, tokens=TOK, probs=P)
    Q = P.clone()
    Q[1] = torch.tensor([0.2, 0.2, 0.4, 0.2], dtype=torch.float64)  # node 1: child 3 less likely, bonus 2 likelier
    b = lw.step_law("sglang", parents=PAR, tokens=TOK, probs=Q)
    # node 1 stops with 0.5 * 0.8 (was 0.5 * 0.6), node 3 is reached with 0.5 * 0.2 (was 0.5 * 0.4)
    assert lw.length_tv(a, b) == pytest.approx(0.1)
    mass = (a.mass() - b.mass()).abs().sum() / 2
    assert lw.total_variation(a, b) == pytest.approx(float(mass))
    assert lw.total_variation(a, b) == pytest.approx(0.5 * (0.1 + 0.1 + 0.3 - 0.1 + 0.1) / 1, abs=0.2)
    assert lw.total_variation(a, a) == 0 and lw.length_tv(a, a) == 0


def test_the_deterministic_laws_by_hand():
    g = lw.step_law("greedy", parents=PAR, tokens=TOK, probs=P)  # argmax 1 at the root, then 3 at node 1
    assert g.stop.tolist() == [0, 0, 0, 1] and g.bonus[3].tolist() == [0, 1, 0, 0]
    t = lw.step_law("typical", parents=PAR, tokens=TOK, probs=P)
    # thresholds min(0.09, 0.3 exp(-H)): every drafted token here is above its parent's
    assert t.stop.tolist() == [0, 0, 0, 1] and t.bonus[3].tolist() == pytest.approx([0, 0.5, 0.5, 0])
    with pytest.raises(Exception, match="its exact law needs a fixed tree"):
        lw.step_law("specinfer", parents=PAR, tokens=TOK, probs=P)


# ---- the rules on hand-built coins ----------------------------------------------------------------------------

def _run(rule, coins=None, final=None, noise=None, **kw):
    randoms = {}
    if coins is not None:
        randoms["coins"] = torch.tensor([coins], dtype=torch.float64)
    if final is not None:
        randoms["final"] = torch.tensor([final], dtype=torch.float64)
    if noise is not None:
        randoms["noise"] = noise[None]
    path, bonus = rl.RULES[rule].fn(parents=torch.tensor(PAR), tokens=torch.tensor([TOK]), target=P[None],
                                    randoms=randoms, **kw)
    return [int(x) for x in path[0] if x >= 0], int(bonus[0])


def test_sglangs_rule_by_hand():
    assert _run("sglang", [0.3, 0.7, 0.5, 0.5], 0.5) == ([0, 1], 1)  # 0.3 <= 0.5; at node 1, 0.7 > 0.4: bonus
    assert _run("sglang", [0.3, 0.2, 0.5, 0.5], 0.5) == ([0, 1, 3], 2)  # 0.2 <= 0.4; node 3 bonus at 0.5: token 2
    assert _run("sglang", [0.6, 0.2, 0.5, 0.5], 0.5) == ([0, 2], 2)  # 0.5 < 0.6 <= 0.75; uniform bonus at 0.5: 2
    assert _run("sglang", [0.9, 0.2, 0.5, 0.5], 0.3) == ([0], 0)  # none: residual {0: 0.1, 3: 0.15}
    assert _run("sglang", [0.9, 0.2, 0.5, 0.5], 0.5) == ([0], 3)
    # 0.9 <= 0.5 / 0.5 at the root, 0.2 <= 0.4 / 0.5 at node 1; node 3's bonus at 0.5: token 2
    assert _run("sglang", [0.9, 0.2, 0.5, 0.5], 0.5, threshold_acc=0.5) == ([0, 1, 3], 2)
    assert _run("sglang", [0.9, 0.7, 0.5, 0.5], 0.5) == ([0], 3)
    # p(1) = 0.5 >= 0.2 and p(3) = 0.4 >= 0.2: accepted whatever the coins
    assert _run("sglang", [0.9, 0.7, 0.5, 0.5], 0.5, threshold_single=0.2) == ([0, 1, 3], 2)


def test_eagles_rule_by_hand():
    # child 1 with coin 0.6 > 0.5: rejected; child 2 with coin 0.4 < 0.25 / 0.5: accepted
    assert _run("eagle", [0.5, 0.6, 0.4, 0.5], 0.5) == ([0, 2], 2)
    assert _run("eagle", [0.5, 0.6, 0.6, 0.5], 0.5) == ([0], 3)  # both rejected: residual {0: .1, 3: .15}
    assert _run("eagle", [0.5, 0.4, 0.6, 0.1], 0.5) == ([0, 1, 3], 2)


def test_the_ddtree_and_gumbel_walks_by_hand():
    assert _run("ddtree", [0.55, 0.65, 0.5, 0.2]) == ([0, 1, 3], 1)  # 0.55 in [0.1, 0.6): token 1; then 3; then 1
    assert _run("ddtree", [0.05, 0.65, 0.5, 0.2]) == ([0], 0)
    noise = torch.full((3, 4), 0.5, dtype=torch.float64)
    noise[0] = torch.tensor([0.5, 0.5, 0.999, 0.5])  # depth 0: token 2's Gumbel noise dominates
    noise[1] = torch.tensor([0.999, 0.5, 0.5, 0.5])  # depth 1: token 0 (on node 2: a bonus)
    assert _run("gumbel", noise=noise) == ([0, 2], 0)


def test_the_residual_rules_by_hand():
    # the draft is uniform over the four tokens at every node
    draft = torch.full((1, 4, 4), 0.25, dtype=torch.float64)
    args = dict(parents=torch.tensor(PAR), tokens=torch.tensor([TOK]), target=P[None], draft=draft)
    r = {"coins": torch.tensor([[0.5, 0.99, 0.5, 0.5]], dtype=torch.float64),
         "final": torch.tensor([0.0], dtype=torch.float64)}
    # child 1: min(1, 0.5 / 0.25) = 1 > 0.99: accepted; at node 1 child 3: 0.4 / 0.25 -> accepted
    path, bonus = rl.specinfer(**args, randoms=r)
    assert path[0].tolist() == [0, 1, 3] and int(bonus[0]) == 1  # node 3's residual {1: .5, 2: .5} at 0: token 1
    # child 1 rejected needs coin >= 1: impossible; a target below the draft: child 2 at 0.25 / 0.25 = 1
    r["coins"] = torch.tensor([[0.5, 0.99, 0.5, 0.99]], dtype=torch.float64)
    P2 = P.clone()
    P2[0] = torch.tensor([0.4, 0.1, 0.25, 0.25], dtype=torch.float64)
    args["target"] = P2[None]
    path, bonus = rl.specinfer(**args, randoms=r)  # 0.99 >= 0.1 / 0.25: rejected; residual norm(max(p - q, 0))
    # = {0: 1}: child 2 (token 2) has residual 0: rejected; bonus 0
    assert path[0].tolist() == [0, -1, -1] and int(bonus[0]) == 0
    path, bonus = rl.recursive_rejection(**args, randoms=r)  # q drops token 1: q2 = 1/3 each; r2 = {0: 1}
    assert path[0].tolist() == [0, -1, -1] and int(bonus[0]) == 0


def test_inverse_cdf_and_the_children_table():
    w = torch.tensor([[0.0, 1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    u = torch.tensor([0.2, 0.5, 0.9999999999999999], dtype=torch.float64)
    assert rl.inverse_cdf(w, u).tolist() == [1, -1, 1]
    assert rl.inverse_cdf(w[:1], torch.tensor([0.25], dtype=torch.float64)).tolist() == [3]  # on the boundary
    kids, depth = rl.children_table([-1, 0, 0, 1])
    assert kids.tolist() == [[1, 2], [3, -1], [-1, -1], [-1, -1]] and depth.tolist() == [0, 1, 1, 2]


# ---- the harness ---------------------------------------------------------------------------------------------

def test_malformed_outputs_are_named():
    par = [-1, 0, 0, 1]
    good = torch.tensor([[0, 1, 3], [0, 2, -1]]), torch.tensor([1, 2])
    assert ck._validate(*good, par, 2, 2, 4) is None
    assert "two tensors" in ck._validate([0], good[1], par, 2, 2, 4)
    assert "shapes" in ck._validate(good[0][:, :2], good[1], par, 2, 2, 4)
    assert "integer" in ck._validate(good[0].double(), good[1], par, 2, 2, 4)
    assert "start at the root" in ck._validate(torch.tensor([[1, 3, -1], [0, 2, -1]]), good[1], par, 2, 2, 4)
    assert "resumes" in ck._validate(torch.tensor([[0, -1, 3], [0, 2, -1]]), good[1], par, 2, 2, 4)
    assert "not a child" in ck._validate(torch.tensor([[0, 2, 3], [0, 2, -1]]), good[1], par, 2, 2, 4)
    assert "not a child" in ck._validate(torch.tensor([[0, 4, -1], [0, 2, -1]]), good[1], par, 2, 2, 4)
    assert "outside the vocabulary" in ck._validate(good[0], torch.tensor([1, 4]), par, 2, 2, 4)
    assert "outside the vocabulary" in ck._validate(good[0], torch.tensor([-1, 2]), par, 2, 2, 4)


def test_counts_of_each_prefix_and_the_joint_continuation():
    V, off = 4, offsets(4, 2)
    tok = [0, 1, 2, 3]  # the tree of PAR
    ids = torch.tensor([[0, child_id(0, 1, V=V, off=off, length=0), child_id(0, 2, V=V, off=off, length=0),
                         child_id(child_id(0, 1, V=V, off=off, length=0), 3, V=V, off=off, length=1)]] * 3)
    tokens = torch.tensor([tok] * 3)
    path = torch.tensor([[0, 1, 3], [0, -1, -1], [0, 2, -1]])
    bonus = torch.tensor([2, 0, 1])
    counts = torch.zeros(off[-1] * V, dtype=torch.long)
    joint = torch.zeros(V * V, dtype=torch.long)
    table = torch.zeros(off[-1], V, dtype=torch.float64)
    table[:, 3] = 1.0  # every continuation samples token 3
    ck._count(path, bonus, tokens, ids, counts, joint, table, torch.Generator().manual_seed(0), V, off)
    c = counts.view(-1, V)
    assert c[0].tolist() == [1, 1, 1, 0]  # first tokens: 1, 0 (a bonus), 2
    assert c[off[1] + 1].tolist() == [0, 0, 0, 1]  # after [1]: 3
    assert c[off[1] + 2].tolist() == [0, 1, 0, 0]  # after [2]: the bonus 1
    assert c[off[2] + 1 * V + 3].tolist() == [0, 0, 1, 0]  # after [1, 3]: the bonus 2
    assert int(c.sum()) == 6
    j = joint.view(V, V)
    assert j[1, 3] == 1 and j[0, 3] == 1 and j[2, 1] == 1 and int(j.sum()) == 3  # (0, ...) continued by 3


def test_the_tests_of_a_case_by_hand():
    V, off = 2, offsets(2, 1)
    table = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    counts = torch.zeros(off[-1] * V, dtype=torch.long)
    counts.view(-1, V)[0] = torch.tensor([5000, 5000])
    counts.view(-1, V)[1] = torch.tensor([3000, 0])
    counts.view(-1, V)[2] = torch.tensor([0, 10])  # below min_prefix_draws: not tested
    joint = torch.tensor([5000, 0, 0, 5000])
    tests = ck._tests(counts, joint, table, V, off, 10000, 1e-6, 30, 2000)
    assert [t["name"] for t in tests] == ["first token", "first two tokens", "after prefix [0]"]
    assert all(t["holds"] for t in tests) and tests[1]["n"] == 10000 and tests[2]["n"] == 3000
    joint = torch.tensor([5000, 1, 0, 4999])  # (0, 1) has probability 0
    assert not ck._tests(counts, joint, table, V, off, 10000, 1e-6, 30, 2000)[1]["holds"]
    assert ck._tests(counts, joint, table, V, off, 10000, 1e-6, 0, 2000)[-1]["name"] == "first two tokens"
    assert ck._prefix(offsets(2, 2)[2] + 1 * V + 0, V, offsets(2, 2)) == [1, 0]
    assert ck._prefix(2, 2, off) == [1] and ck._prefix(0, 2, off) == []


# ---- the corners mutation testing found unguarded ------------------------------------------------------------

def test_validate_names_each_fault_in_its_own_words():
    par = [-1, 0, 0, 1]
    path, bonus = torch.tensor([[0, 1, 3], [0, 2, -1]]), torch.tensor([0, 2])  # a bonus of token 0 is fine
    assert ck._validate(path, bonus, par, 2, 2, 4) is None
    assert ck._validate([0], bonus, par, 2, 2, 4) == "the rule did not return two tensors (path, bonus)"
    assert ck._validate(path[:, :2], bonus, par, 2, 2, 4) == (
        "shapes path (2, 2) and bonus (2,), expected (2, 3) and (2,)")
    assert ck._validate(path.double(), bonus, par, 2, 2, 4) == "path and bonus must be integer tensors"
    assert ck._validate(path + torch.tensor([[1, 0, 0], [0, 0, 0]]), bonus, par, 2, 2, 4) == (
        "a path does not start at the root")
    assert ck._validate(torch.tensor([[0, 0, -1], [0, 2, -1]]), bonus, par, 2, 2, 4) == (  # the root again
        "a path steps to a node that is not a child of the previous one (depth 1)")
    assert ck._validate(torch.tensor([[0, 1, 4], [0, 2, -1]]), bonus, par, 2, 2, 4) == (  # node 4 of 4
        "a path steps to a node that is not a child of the previous one (depth 2)")
    assert ck._validate(path, torch.tensor([0, 4]), par, 2, 2, 4) == (
        "a bonus token outside the vocabulary (or none: the rule had nothing left to sample from)")


def test_counts_on_trees_of_depth_zero_and_one():
    V, off = 3, offsets(3, 1)
    table = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    # the root alone: every step emits one token, continued by the target after it (row 1 + token)
    counts, joint = torch.zeros(len(table) * V, dtype=torch.long), torch.zeros(V * V, dtype=torch.long)
    ck._count(torch.tensor([[0], [0], [0]]), torch.tensor([0, 1, 2]), torch.tensor([[7], [7], [7]]),
              torch.zeros(3, 1, dtype=torch.long), counts, joint, table, g, V, off)
    assert joint.view(V, V).tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    # depth 1: a draw that accepted child 1 (token 0) emitted 0 then its bonus 2; one that stopped emitted 1 only
    counts, joint = torch.zeros(len(table) * V, dtype=torch.long), torch.zeros(V * V, dtype=torch.long)
    ids = torch.tensor([[0, child_id(0, 0, V=V, off=off, length=0)]] * 2)
    ck._count(torch.tensor([[0, 1], [0, -1]]), torch.tensor([2, 1]), torch.tensor([[7, 0], [7, 0]]), ids, counts,
              joint, table, g, V, off)
    assert joint.view(V, V).tolist() == [[0, 0, 1], [0, 1, 0], [0, 0, 0]]
    assert counts.view(-1, V)[0].tolist() == [1, 1, 0] and counts.view(-1, V)[1].tolist() == [0, 0, 1]
    # a second token 0 after token 1, and a continuation drawn after the first token, not after the root
    counts, joint = torch.zeros(len(table) * V, dtype=torch.long), torch.zeros(V * V, dtype=torch.long)
    ids = torch.tensor([[0, child_id(0, 1, V=V, off=off, length=0)]] * 2)
    ck._count(torch.tensor([[0, 1], [0, -1]]), torch.tensor([0, 2]), torch.tensor([[7, 1], [7, 1]]), ids, counts,
              joint, table, g, V, off)
    assert joint.view(V, V).tolist() == [[0, 0, 0], [1, 0, 0], [0, 0, 1]]


def test_the_tests_carry_their_distributions_and_pick_prefixes_in_order():
    V, off = 2, offsets(2, 1)
    table = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    counts = torch.zeros(off[-1] * V, dtype=torch.long)
    counts.view(-1, V)[0] = torch.tensor([3, 1])
    counts.view(-1, V)[1] = torch.tensor([2, 0])
    counts.view(-1, V)[2] = torch.tensor([0, 2])  # as often as prefix [0]: the lower id first
    joint = torch.tensor([3, 0, 0, 1])
    tests = ck._tests(counts, joint, table, V, off, 4, 0.01, 30, 2)
    assert [t["name"] for t in tests] == ["first token", "first two tokens", "after prefix [0]", "after prefix [1]"]
    assert tests[0]["measured"] == [0.75, 0.25] and tests[0]["expected"] == [0.5, 0.5]
    assert tests[1]["expected"] == [0.5, 0.0, 0.0, 0.5] and tests[1]["measured"] == [0.75, 0.0, 0.0, 0.25]
    assert tests[2]["measured"] == [1.0, 0.0] and tests[3]["expected"] == [0.0, 1.0]
    assert [t["name"] for t in ck._tests(counts, joint, table, V, off, 4, 0.01, 1, 2)][2:] == ["after prefix [0]"]
    assert len(ck._tests(counts, joint, table, V, off, 4, 0.01, 30, 3)) == 2  # each seen twice: too few
    assert len(ck._tests(counts, joint, table, V, off, 4, 0.01, 30, 1)) == 4  # the root is never a prefix test


def test_the_l1_test_with_one_draw_and_a_threshold_met_exactly():
    t = st.l1_test(torch.tensor([1, 0]), torch.tensor([0.5, 0.5], dtype=torch.float64), 0.5)
    assert t["n"] == 1 and t["l1"] == 1.0


def test_sglangs_threshold_single_is_inclusive_and_the_law_is_float64():
    assert lw._accept(torch.tensor([0.3, 0.5], dtype=torch.float64), 0.3, 1.0).tolist() == [1.0, 0.0, 0.0]
    P1 = torch.tensor([[0.1, 0.7, 0.2], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8]], dtype=torch.float64)
    law = lw.step_law("sglang", parents=[-1, 0, 1], tokens=[0, 1, 2], probs=P1)
    assert law.stop.dtype == law.bonus.dtype == torch.float64
    assert law.stop[2].item() == 0.7 * 0.4 and law.stop[1].item() == 0.7 * 0.6  # float64 products, bit for bit
    assert law.mass().sum().item() == pytest.approx(1.0, abs=1e-15)


def test_typical_acceptance_by_hand():
    # root: entropy of (0.85, 0.1, 0.05) is 0.5182 nats; threshold min(0.09, 0.3 exp(-0.5182)) = 0.09
    P1 = torch.tensor([[0.85, 0.1, 0.05], [0.5, 0.25, 0.25], [0.2, 0.7, 0.1], [0.4, 0.3, 0.3]], dtype=torch.float64)
    par, tok = [-1, 0, 0, 1], [0, 1, 2, 2]
    law = lw.step_law("typical", parents=par, tokens=tok, probs=P1)
    # node 1 (0.1 > 0.09) passes; node 2 (0.05) does not; node 3: p = 0.25 at node 1, threshold
    # min(0.09, 0.3 exp(-1.0397)) = 0.09: passes -> the deepest path ends at node 3
    assert law.stop.tolist() == [0, 0, 0, 1] and law.bonus[3].tolist() == [0.4, 0.3, 0.3]
    # a stricter threshold: node 1 fails, so the walk stops at the root
    law = lw.step_law("typical", parents=par, tokens=tok, probs=P1, posterior_threshold=0.2)
    assert law.stop.tolist() == [1, 0, 0, 0] and law.bonus[0].tolist() == pytest.approx([0.85, 0.1, 0.05])
    # posterior_alpha scales the entropy term: alpha 0.1 -> threshold 0.1 * exp(-0.518) = 0.0596 at the root, so
    # node 1 passes; at node 1, 0.1 * exp(-1.0397) = 0.0354: node 3 passes
    assert lw.step_law("typical", parents=par, tokens=tok, probs=P1, posterior_alpha=0.1).stop.tolist() == [0, 0, 0, 1]
    # two paths of one depth: the first node wins the tie
    law = lw.step_law("typical", parents=[-1, 0, 0], tokens=[0, 1, 0], probs=P1[:3])
    assert law.stop.tolist() == [0, 1, 0]
    t = torch.tensor
    path, bonus = rl.typical(parents=t(par), tokens=t([tok, tok]), target=P1.expand(2, 4, 3),
                             randoms={"final": t([0.3, 0.9], dtype=torch.float64)})
    assert path.tolist() == [[0, 1, 3], [0, 1, 3]] and bonus.tolist() == [0, 2]


def test_first_token_sums_each_childs_whole_subtree():
    P1 = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]], dtype=torch.float64)
    law = lw.step_law("sglang", parents=[-1, 0, 1], tokens=[0, 1, 1], probs=P1)  # a chain root -> 1 -> 2
    assert lw.first_token(law, [-1, 0, 1], [0, 1, 1]).tolist() == pytest.approx([0.2, 0.5, 0.3], abs=1e-15)
    Q = P1.clone()
    Q[1] = torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64)
    assert lw.first_token(lw.step_law("sglang", parents=[-1, 0, 1], tokens=[0, 1, 1], probs=Q),
                          [-1, 0, 1], [0, 1, 1]).tolist() == pytest.approx([0.2, 0.5, 0.3], abs=1e-15)


def test_inverse_cdf_at_the_top_of_the_interval_and_the_table_of_a_chain():
    w = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 1.0]], dtype=torch.float64)
    assert rl.inverse_cdf(w, torch.tensor([1.0, 1.0], dtype=torch.float64)).tolist() == [1, 3]  # the last positive
    assert rl.inverse_cdf(w, torch.tensor([0.0, 0.0], dtype=torch.float64)).tolist() == [0, 2]
    kids, depth = rl.children_table(torch.tensor([-1, 0, 1]))
    assert kids.tolist() == [[1], [2], [-1]] and depth.tolist() == [0, 1, 2] and kids.dtype == torch.long


def test_every_rule_decides_each_draw_of_a_batch_on_its_own():
    """Two draws in one call give what each gives alone (sums and shapes taken per draw)."""
    t = torch.tensor
    draft = torch.stack([torch.full((4,), 0.25, dtype=torch.float64), t([0.1, 0.6, 0.2, 0.1], dtype=torch.float64),
                         t([0.4, 0.2, 0.2, 0.2], dtype=torch.float64), t([0.1, 0.1, 0.1, 0.7], dtype=torch.float64)])
    rows = [{"coins": t([0.3, 0.7, 0.2, 0.9], dtype=torch.float64), "final": t(0.35, dtype=torch.float64),
             "noise": torch.full((3, 4), 0.4, dtype=torch.float64)},
            {"coins": t([0.95, 0.1, 0.05, 0.5], dtype=torch.float64), "final": t(0.8, dtype=torch.float64),
             "noise": t([[0.9, 0.1, 0.2, 0.3], [0.3, 0.2, 0.1, 0.95], [0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)}]
    for name in ("sglang", "eagle", "ddtree", "gumbel", "specinfer", "rrs", "typical"):
        rule = rl.RULES[name]
        kw = {"draft": draft[None].expand(2, 4, 4)} if rule.uses_draft else {}

        def call(rs):
            R = len(rs)
            randoms = {k: torch.stack([r[k] for r in rs]) for k in rule.randoms}
            out = rule.fn(parents=t(PAR), tokens=t([TOK] * R), target=P.expand(R, 4, 4), randoms=randoms,
                          **({k: v[:R] for k, v in kw.items()}))
            return out[0].tolist(), out[1].tolist()
        both = call(rows)
        assert both == (call(rows[:1])[0] + call(rows[1:])[0], call(rows[:1])[1] + call(rows[1:])[1]), name


def test_the_residual_rules_renormalise_and_update_the_draft():
    """One node with three children (tokens 1, 2, 3) drafted from q = (0.1, 0.4, 0.3, 0.2); the target p =
    (0.4, 0.1, 0.1, 0.4); coins 0.3, 0.5, 0.99 for the three children. Child 1 (ratio 0.1 / 0.4 = 0.25) is
    rejected by both rules, child 2 (residual 0 there) too. SpecInfer then tries child 3 against
    norm(max(r - q, 0)) with q unchanged and accepts it (ratio above 1); recursive rejection has dropped tokens 1
    and 2 from q, rejects it (ratio 0.2) and draws the bonus from what is left: token 0 alone."""
    t = torch.tensor
    par, tok = [-1, 0, 0, 0], [0, 1, 2, 3]
    p = t([0.4, 0.1, 0.1, 0.4], dtype=torch.float64)
    q = t([0.1, 0.4, 0.3, 0.2], dtype=torch.float64)
    target = torch.stack([p, p, p, p])[None]
    draft = torch.stack([q, q, q, q])[None]
    randoms = {"coins": t([[0.5, 0.3, 0.5, 0.99]], dtype=torch.float64), "final": t([0.5], dtype=torch.float64)}
    # SpecInfer: r1 = (0.3, 0, 0, 0.2)/0.5 = (0.6, 0, 0, 0.4); child 2: 0 -> rejected, r2 = max(r1 - q, 0) =
    # (0.5, 0, 0, 0.2)/0.7; child 3: min(1, (0.2/0.7) / 0.2) = 1 > 0.99: accepted
    path, bonus = rl.specinfer(parents=t(par), tokens=t([tok]), target=target, draft=draft, randoms=randoms)
    assert path.tolist() == [[0, 3]]
    # rrs: q2 = q without token 1 = (0.1, 0, 0.3, 0.2)/0.6; r2 = max(r1 - q2, 0) = (0.6 - 1/6, 0, 0, 0.4 - 1/3)
    # = (0.4333, 0, 0, 0.0667) / 0.5; q3 = (0.1, 0, 0, 0.2)/0.3; child 3: (0.1333) / 0.6667 = 0.2 < 0.99: rejected;
    # r3 = max(r2 - q3, 0) = (0.8667 - 0.3333, 0, 0, 0) -> bonus token 0
    path, bonus = rl.recursive_rejection(parents=t(par), tokens=t([tok]), target=target, draft=draft, randoms=randoms)
    assert path.tolist() == [[0, -1]] and bonus.tolist() == [0]


def test_typical_acceptance_where_the_entropy_term_binds():
    """The threshold min(0.09, 0.3 exp(-H)) with its entropy term binding. Tree: the root's children are node 1
    (token 1) and node 2 (token 0); node 3 (token 0) is under node 2.
    Root (0.08, 0.3, 0.3, 0.32): H = 1.289, threshold 0.0827; node 2's 0.08 fails, node 1's 0.3 passes: the
    walk ends at depth 1 of a depth-2 tree.
    Root (0.1, 0.3, 0.3, 0.3): H = 1.314, threshold 0.0806, node 2's 0.1 passes; node 2 (0.085, 0.305, 0.305,
    0.305): H = 1.296, threshold 0.0821, node 3's 0.085 passes (against the 0.09 cap alone it would fail): the
    walk ends at node 3."""
    t = torch.tensor
    par, tok = [-1, 0, 0, 2], [0, 1, 0, 0]
    P1 = t([[0.08, 0.3, 0.3, 0.32], [0.96, 0.02, 0.01, 0.01], [0.085, 0.305, 0.305, 0.305],
            [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    assert lw.step_law("typical", parents=par, tokens=tok, probs=P1).stop.tolist() == [0, 1, 0, 0]
    path, bonus = rl.typical(parents=t(par), tokens=t([tok]), target=P1[None],
                             randoms={"final": t([0.5], dtype=torch.float64)})
    assert path.tolist() == [[0, 1, -1]] and bonus.tolist() == [0]  # node 1's bonus: 0.5 falls on token 0
    P2 = P1.clone()
    P2[0] = t([0.1, 0.3, 0.3, 0.3], dtype=torch.float64)
    law = lw.step_law("typical", parents=par, tokens=tok, probs=P2)
    assert law.stop.tolist() == [0, 0, 0, 1] and law.bonus[3].tolist() == [0.25] * 4
    path, bonus = rl.typical(parents=t(par), tokens=t([tok]), target=P2[None],
                             randoms={"final": t([0.6], dtype=torch.float64)})
    assert path.tolist() == [[0, 2, 3]] and bonus.tolist() == [2]


def test_a_rule_called_again_on_the_same_numbers_that_raises_or_answers_otherwise_fails_its_case():
    """run_case calls the rule a second time on its first chunk's random numbers: a raise there fails the case with
    the reason (it once went out of check-sampler as an internal error), and so does another answer or a malformed
    one."""
    from ddsim.sampling.cases import explicit_cases
    from ddsim.sampling.check import Sampler
    case = explicit_cases()[0]
    calls = []

    def second(kind):
        def call(**kw):
            calls.append(kind)
            path, bonus = rl.eagle(**kw)
            if len(calls) % 2:
                return path, bonus
            if kind == "raises":
                raise RuntimeError("stale\nbuffer")  # two lines, said on one
            if kind == "other":
                return path, (bonus + 1) % case.vocab
            return (path,)
        return Sampler(kind, call, {"coins": "node", "final": "draw"}, "fixed")
    said = {"raises": "the rule raised RuntimeError: stale buffer when called again on the same random numbers",
            "other": "the same random numbers gave different outputs",
            "malformed": "the same random numbers gave different outputs"}
    for kind, want in said.items():
        calls.clear()
        r = ck.run_case(second(kind), case, draws=1000, alpha_per_test=1e-6)
        assert r.failure == want and calls == [kind, kind], (kind, r.failure, calls)
    # three outputs on the first call: named as what it is, not as a raise on unpacking them
    three = Sampler("three", lambda **kw: (*rl.eagle(**kw), None), {"coins": "node", "final": "draw"}, "fixed")
    assert ck.run_case(three, case, draws=1000, alpha_per_test=1e-6).failure == (
        "the rule did not return two tensors (path, bonus)")
    calls.clear()
    assert ck.run_case(Sampler("eagle", lambda **kw: calls.append(1) or rl.eagle(**kw), {"coins": "node",
                                                                                         "final": "draw"}, "fixed"),
                       case, draws=1000, alpha_per_test=1e-6).failure is None
