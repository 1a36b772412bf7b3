"""Tree invariants, relabeling, and the DDTree builder against brute force."""
import itertools

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ddsim.properties.strategies import ddtree_logits, topological_orders, trees
from ddsim.trees.builders import ddtree, path_score, static_tree, topk_logprobs
from ddsim.trees.tree import Tree


@given(trees(max_size=20))
def test_tree_invariants(t: Tree):
    d, m = t.depths, t.ancestor_mask
    assert d[0] == 0 and all(d[i] == d[t.parents[i]] + 1 for i in range(1, t.size))
    assert (m.sum(1) == d + 1).all()  # EAGLE-2: depth = row sum - 1
    assert np.array_equal(np.tril(m), m)  # topological order: ancestors come first
    for i in range(t.size):
        path = t.root_path(i)
        assert path[0] == 0 and path[-1] == i and len(path) == d[i] + 1
        assert set(np.flatnonzero(m[i])) == set(path)
    # order-exact: exactly the leading run of a chain 0, 1, 2, ...
    run = 1
    while run < t.size and t.parents[run] == run - 1:
        run += 1
    assert list(np.flatnonzero(t.order_exact)) == list(range(run))
    g = t.to_networkx()
    assert g.number_of_nodes() == t.size and g.number_of_edges() == t.size - 1
    assert Tree.from_dict(t.to_dict()) == t


@given(st.data(), trees(max_size=16))
def test_relabel_preserves_paths(data, t: Tree):
    order = data.draw(topological_orders(t))
    r = t.relabel(order)
    for new, old in enumerate(order):
        assert r.tokens[new] == t.tokens[old]
        assert [r.tokens[n] for n in r.root_path(new)] == [t.tokens[n] for n in t.root_path(old)]
    inverse = [0] * t.size
    for new, old in enumerate(order):
        inverse[old] = new
    back = r.relabel([inverse[i] for i in range(t.size)])
    assert back == t
    assert t.relabel(t.dfs_order()).size == t.size and t.relabel(t.bfs_order()).size == t.size


def _brute_force(logits, budget, topk_cap):
    """float64 arithmetic: every rank path scored by its exact sum, the best ``budget`` taken."""
    D, V = logits.shape
    k = min(budget, V, topk_cap or V)
    lp, tok = topk_logprobs(logits, k, arithmetic="float64")
    lpl = lp.tolist()
    paths = [p for depth in range(1, D + 1) for p in itertools.product(range(k), repeat=depth)]
    paths.sort(key=lambda p: (-path_score(lpl, p), p))
    chosen = paths[:budget]
    index = {(): 0}
    parents, tokens = [-1], [0]
    for p in chosen:
        index[p] = len(parents)
        parents.append(index[p[:-1]])
        tokens.append(int(tok[len(p) - 1][p[-1]]))
    return Tree(parents, tokens)


@given(ddtree_logits(), st.integers(0, 12), st.sampled_from([None, 1, 2, 3]))
@example(torch.zeros(3, 4, dtype=torch.float64), 7, None)  # all ties: ranks decide everything
def test_ddtree_float64_equals_brute_force(logits, budget, cap):
    assert ddtree(logits, budget, cap, arithmetic="float64") == _brute_force(logits, budget, cap)


def _published_by_scan(logits, budget, topk_cap):
    """The published construction's arithmetic, selected by a linear scan instead of a heap: float32
    log-probs from torch.topk, a first child scored parent + lp[d][0], each next sibling scored from
    the previous one as score - lp[d][r] + lp[d][r + 1]; the best (score, then rank path) goes next."""
    D, V = logits.shape
    if budget == 0:
        return Tree([-1], [0])
    k = min(budget, V, topk_cap or V)
    x = logits.float()
    vals, tok = torch.topk(x, k, dim=-1)
    lp = (vals - torch.logsumexp(x, -1, keepdim=True)).tolist()
    frontier = [(lp[0][0], (0,), 0)]  # (score, rank path, parent index)
    parents, tokens = [-1], [0]
    while frontier and len(parents) - 1 < budget:
        best = min(frontier, key=lambda e: (-e[0], e[1]))
        frontier.remove(best)
        score, path, parent = best
        node = len(parents)
        parents.append(parent)
        tokens.append(int(tok[len(path) - 1][path[-1]]))
        d, r = len(path) - 1, path[-1]
        if r + 1 < k:
            frontier.append((score - lp[d][r] + lp[d][r + 1], path[:-1] + (r + 1,), parent))
        if d + 1 < D:
            frontier.append((score + lp[d + 1][0], path + (0,), node))
    return Tree(parents, tokens)


# Equal per-depth distributions put many rank paths at exactly tied scores; the float32 rounding of
# the incremental sibling update then decides between them as the published implementation does.
TIED = torch.tensor([[2.3, 1.7, 1.7, 0.4, 0.4, 0.1]] * 4, dtype=torch.float64)


@given(ddtree_logits(), st.integers(0, 12), st.sampled_from([None, 1, 2, 3]))
@example(TIED, 12, None)
@example(torch.zeros(3, 4, dtype=torch.float64), 7, None)
def test_ddtree_published_arithmetic(logits, budget, cap):
    assert ddtree(logits, budget, cap) == _published_by_scan(logits, budget, cap)


def test_published_and_float64_arithmetic_part_at_exact_ties():
    """Proof that the choice matters: on tied per-depth distributions the two arithmetics build
    different trees from the same logits (and each equals its own reference)."""
    differ = [b for b in range(1, 40) if ddtree(TIED, b) != ddtree(TIED, b, arithmetic="float64")]
    assert differ, "no budget separates the arithmetics on TIED"
    b = differ[0]
    assert ddtree(TIED, b) == _published_by_scan(TIED, b, None)
    assert ddtree(TIED, b, arithmetic="float64") == _brute_force(TIED, b, None)


@given(ddtree_logits(), st.integers(0, 12))
def test_ddtree_shape(logits, budget):
    t = ddtree(logits, budget)
    D, V = logits.shape
    assert t.size - 1 == min(budget, sum(min(budget, V) ** d for d in range(1, D + 1)))
    assert int(t.depths.max()) <= D
    # deterministic: same logits, same tree
    assert ddtree(logits.clone(), budget) == t


def test_ddtree_budget_zero_and_errors():
    logits = torch.randn(3, 10)
    assert ddtree(logits, 0).size == 1
    for bad, arg in ((lambda: ddtree(logits, -1), "budget"),
                     (lambda: ddtree(torch.tensor([[0.0, float("nan")]]), 3), "draft_logits"),
                     (lambda: ddtree(torch.tensor([[0.0, float("inf")]]), 3), "draft_logits"),
                     (lambda: ddtree(torch.randn(3), 3), "draft_logits"),
                     (lambda: ddtree(logits, 3, topk_cap=0), "topk_cap")):
        with pytest.raises(ValueError, match=arg):
            bad()


def test_static_tree_layout():
    logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 3.0, 2.0]])
    t = static_tree([(0,), (1,), (0, 0), (0, 1), (1, 0)], logits, root_token=9)
    assert t.parents == (-1, 0, 0, 1, 1, 2)
    assert t.tokens == (9, 0, 1, 1, 2, 1)
    with pytest.raises(ValueError, match="no parent choice"):
        static_tree([(0, 0)], logits)
