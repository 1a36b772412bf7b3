"""Fast value tests of the two other chains that decide a verdict, for mutation testing (`make mutation`):
replay's judging (ddsim.engines.replay_verdict: exact greedy's walk and what it emits, a sampled step
recomputed from its dumped numbers, the bonus and the declared rule, a request's
continuity, the noise bound, the summary the gate reads) and check-kernel's property chain
(ddsim.engines.check_kernel: the calls, the pool and input bits, the tolerance, every property's predicate,
the coverage). No model, no subprocess: every expected value is written out by hand."""
from types import SimpleNamespace as NS

import pytest
import torch

from ddsim.engines import check_kernel as ck
from ddsim.engines import replay_verdict as rv
from ddsim.trees.tree import Tree

# ---- replay ---------------------------------------------------------------------------------------

TREE = Tree([-1, 0, 0, 1, 1, 3], [7, 1, 2, 3, 4, 5])  # root 7; 1 and 2 under it; 3, 4 under 1; 5 under 3


def _logits(argmax: list[int], V: int = 8) -> torch.Tensor:
    x = torch.zeros(len(argmax), V)
    for i, a in enumerate(argmax):
        x[i, a] = 1.0
    return x


def test_greedy_walk_follows_the_argmax_token_down_the_tree():
    assert rv.greedy_walk(TREE, _logits([1, 3, 0, 5, 0, 6])) == [0, 1, 3, 5]
    assert rv.greedy_walk(TREE, _logits([2, 0, 0, 0, 0, 0])) == [0, 2]
    assert rv.greedy_walk(TREE, _logits([6, 0, 0, 0, 0, 0])) == [0]  # no child carries the argmax
    assert rv.greedy_walk(TREE, _logits([1, 4, 0, 0, 0, 0])) == [0, 1, 4]  # the second child
    assert rv.emitted_by_exact_greedy(TREE, _logits([1, 3, 0, 5, 0, 6]), [0, 1, 3, 5]) == [1, 3, 5, 6]
    assert rv.emitted_by_exact_greedy(TREE, _logits([6, 0, 0, 0, 0, 0]), [0]) == [6]


def test_bonus_error_names_the_node_and_both_tokens():
    tops = [frozenset({t}) for t in (1, 3, 0, 5, 2, 6)]
    assert rv.bonus_error([1, 3, 5], [0, 1, 3], tops) is None
    assert rv.bonus_error([1, 3, 4], [0, 1, 3], tops) == (
        "the engine emitted bonus 4 at node 3, its own logits' argmax there is 5")
    assert rv.bonus_error([1], [0], tops) is None
    assert rv.bonus_error([2], [0], tops) is not None
    tied = [frozenset({1, 2}), *tops[1:]]  # a tie at the root: either token is the argmax
    assert rv.bonus_error([2], [0], tied) is None and rv.bonus_error([1], [0], tied) is None
    assert rv.bonus_error([0], [0], tied) == "the engine emitted bonus 0 at node 0, its own logits' argmax there is 1 or 2"


def test_an_engines_argmax_keeps_its_ties():
    x = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, 0.0, 0.0, 3.0], [0.0, 0.0, 0.0, 5.0]])
    assert rv.top_sets(x) == [frozenset({1, 2}), frozenset({0, 3}), frozenset({3})]
    ids = torch.tensor([[2, 1, 0], [3, 0, 1], [3, 2, 1], [4, 5, 6]])
    lp = torch.tensor([[-0.5, -0.5, -2.0], [-0.1, -3.0, -4.0], [-1.0, -1.0, -1.0], [-0.2, -0.3, -0.4]])
    assert rv.top_sets(topk=(ids, lp)) == [frozenset({1, 2}), frozenset({3}), frozenset({1, 2, 3}), frozenset({4})]


def test_an_engines_argmax_and_walk_at_a_serving_shape():
    """129 nodes over Qwen's 151936-token vocabulary, bf16-like ties planted at every fourth node: each node's set is
    its tied maxima, and greedy's walk down a 128-deep chain of the argmax tokens takes every node."""
    T, V = 129, 151936
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(T, V, generator=gen)
    want = torch.randint(0, V, (T,), generator=gen)
    logits[torch.arange(T), want] = 50.0
    tied = torch.arange(0, T, 4)
    logits[tied, (want[tied] + 1) % V] = 50.0
    tops = rv.top_sets(logits)
    assert tops == [frozenset({int(want[i])} | ({int(want[i] + 1) % V} if i % 4 == 0 else set())) for i in range(T)]
    chain = Tree(list(range(-1, T - 1)), [0] + [int(want[i]) for i in range(T - 1)])  # node i+1 carries i's argmax
    path = list(range(T))
    assert rv.walk_tops(chain, tops) == path and rv.greedy_walk(chain, logits) == path
    assert rv.follows_greedy(chain, tops, path, [int(t) for t in want[: T - 1]] + [int(want[T - 1])])
    assert rv.acceptance_error(chain, tops, path[:64], [int(t) for t in want[:63]] + [int(want[63])]) == (
        f"the engine accepted {path[:64]}; greedy verification on its own logits accepts {path}")


def test_a_step_follows_greedy_on_the_engines_own_logits():
    """TREE: root 7; 1 and 2 under it; 3, 4 under 1; 5 under 3."""
    tops = [frozenset({t}) for t in (1, 3, 0, 5, 2, 6)]
    assert rv.follows_greedy(TREE, tops, [0, 1, 3, 5], [1, 3, 5, 6])
    assert not rv.follows_greedy(TREE, tops, [0, 1, 3], [1, 3, 5])  # stopped where a child carries the bonus
    assert not rv.follows_greedy(TREE, tops, [0, 1, 4], [1, 4, 2])  # node 4 is not node 1's argmax
    assert not rv.follows_greedy(TREE, tops, [0, 1, 3, 5], [1, 3, 5, 0])  # a bonus that is not node 5's argmax
    assert rv.follows_greedy(TREE, [frozenset({9}), *tops[1:]], [0], [9])  # no child carries the root's argmax
    tied = [frozenset({1, 2}), frozenset({3, 4}), *tops[2:]]
    assert rv.follows_greedy(TREE, tied, [0, 2], [2, 0]) and rv.follows_greedy(TREE, tied, [0, 1, 4], [1, 4, 2])
    assert not rv.follows_greedy(TREE, tied, [0, 1], [1, 3])  # either tied token is carried by a child


def test_an_acceptance_error_names_both_paths():
    """TREE: root 7; 1 and 2 under it; 3, 4 under 1; 5 under 3."""
    tops = [frozenset({t}) for t in (1, 3, 0, 5, 2, 6)]
    assert rv.walk_tops(TREE, tops) == [0, 1, 3, 5]
    assert rv.walk_tops(TREE, [frozenset({2, 1}), *tops[1:]]) == [0, 1, 3, 5]  # a tie: the first child carrying one
    assert rv.acceptance_error(TREE, tops, [0, 1, 3, 5], [1, 3, 5, 6]) is None
    assert rv.acceptance_error(TREE, tops, [0, 1, 3], [1, 3, 5]) == (
        "the engine accepted [0, 1, 3]; greedy verification on its own logits accepts [0, 1, 3, 5]")
    assert rv.acceptance_error(TREE, tops, [0, 1, 4], [1, 4, 2]) == (
        "the engine accepted [0, 1, 4]; greedy verification on its own logits accepts [0, 1, 3, 5]")
    assert rv.acceptance_error(TREE, tops, [0, 1, 3, 5], [1, 3, 5, 0]) is None  # the bonus alone: bonus_error's


def test_a_divergence_is_rounding_only_within_noise_and_by_the_engines_rule():
    judge = lambda **kw: rv.judge_emission(emitted=[1, 2], **{"exact": [1, 3], "follows_rule": True,  # noqa: E731
                                                               "within_noise": True, **kw})
    assert judge() == (False, True)
    assert judge(within_noise=False) == (True, False)
    assert judge(follows_rule=False) == (True, False)
    assert judge(exact=[1, 2]) == (False, False) and judge(exact=[1, 2], within_noise=False) == (False, False)
    assert judge(exact=[1, 2], follows_rule=False) == (False, False)


def test_a_top_k_dump_is_held_to_the_log_probability_error_the_kl_allows():
    assert rv.node_bound(1e-6, "full") == 1e-6 and rv.node_bound(0.08, "full") == 0.08
    assert rv.node_bound(0.08, "topk") == pytest.approx(0.4) and rv.node_bound(2e-6, "topk") == pytest.approx(2e-3)
    with pytest.raises(KeyError):
        rv.node_bound(1e-6, "logits")
    node = lambda kl, lp: NS(kl=kl, logprob_err=lp)  # noqa: E731
    assert rv.node_within_noise(node(1e-6, 5.0), 1e-6) and not rv.node_within_noise(node(1.1e-6, 0.0), 1e-6)
    assert rv.node_within_noise(node(None, 0.4), 0.08) and not rv.node_within_noise(node(None, 0.41), 0.08)
    assert rv.tolerance_words(1e-6, "full") == "KL 1e-06"
    assert rv.tolerance_words(0.08, "topk") == "KL 0.08 (top-k: log-probabilities within 0.4)"


def _step(step, request, context, tokens, emitted):
    return NS(step=step, request=request, context=context, tokens=tokens, emitted=emitted)


def _rec(diagnosis="within noise", evidence="fine"):
    return NS(diagnosis=diagnosis, evidence=evidence, commit_ok=True)


def _probs_logits(rows: list[dict], V: int = 8) -> torch.Tensor:
    x = torch.full((len(rows), V), 1e-30, dtype=torch.float64)
    for i, r in enumerate(rows):
        for t, p in r.items():
            x[i, t] = p
    return x.log()


def test_a_sampled_step_is_recomputed_from_the_dumped_numbers():
    """SGLang's rule by hand on TREE: root p(1) = 0.5, p(2) = 0.25; node 1 p(3) = 0.1, p(4) = 0.2; node 4's
    bonus from {0: 0.5, 6: 0.5}."""
    logits = _probs_logits([{1: 0.5, 2: 0.25, 0: 0.25}, {3: 0.1, 4: 0.2, 6: 0.7}, {0: 1.0}, {0: 1.0},
                            {0: 0.5, 6: 0.5}, {0: 1.0}])
    acc = {"rule": "sglang", "temperature": 1.0, "params": {}}

    def numbers(c0, c1, final):
        coins = torch.full((6,), 0.5, dtype=torch.float64)
        coins[0], coins[1] = c0, c1
        return {"random.coins": coins, "random.final": torch.tensor([final], dtype=torch.float64)}
    assert rv.sampled_walk(TREE, logits, acc, numbers(0.3, 0.25, 0.7)) == ([0, 1, 4], [1, 4, 6])
    assert rv.sampled_walk(TREE, logits, acc, numbers(0.3, 0.05, 0.7)) == ([0, 1, 3], [1, 3, 0])
    assert rv.sampled_walk(TREE, logits, acc, numbers(0.6, 0.25, 0.7)) == ([0, 2], [2, 0])
    assert rv.sampled_walk(TREE, logits, acc, numbers(0.8, 0.25, 0.7)) == ([0], [0])  # the residual: token 0 only
    assert rv.sampled_walk(TREE, logits, acc, numbers(0.3, 0.25, 0.3)) == ([0, 1, 4], [1, 4, 0])
    # the temperature sharpens: at 0.5 node 1's p(4) = 0.04 / 0.54, so 0.25 falls past both children
    assert rv.sampled_walk(TREE, logits, {**acc, "temperature": 0.5}, numbers(0.3, 0.25, 0.7))[0] == [0, 1]
    assert rv.rule_error([1, 4, 6], [1, 4, 6], "sglang") is None
    assert rv.rule_error([1, 4, 6], [1, 3, 0], "sglang") == (
        "the engine emitted [1, 4, 6]; its declared rule sglang on its own logits and random numbers emits [1, 3, 0]")


def test_a_request_must_continue_from_what_its_previous_step_committed():
    steps = [_step(0, "a", [1, 2], [3, 9, 8], [9, 4]),  # committed: root 3, then 9; bonus 4
             _step(1, "b", [5], [6], [7]),
             _step(2, "a", [1, 2, 3, 9], [4, 1], [1, 2]),  # continues a
             _step(3, "b", [5, 6], [7], [0]),  # continues b
             _step(4, "a", [1, 2, 3, 9, 4, 9], [2], [3]),  # context wrong at position 5 (9 for 1)
             _step(5, "b", [5, 6, 7], [1], [2])]  # root 1 is not b's last bonus 0
    recs = [_rec() for _ in steps]
    recs[5].diagnosis, recs[5].evidence = "sibling leak", "the flattened recurrence"
    rv.judge_continuity(steps, recs)
    assert [r.commit_ok for r in recs] == [True, True, True, True, False, False]
    assert [r.diagnosis for r in recs] == ["within noise"] * 4 + ["commit error"] * 2
    assert recs[4].evidence == ("its context (6 tokens) is not step 2's context plus what that step committed (6 "
                                "tokens; first difference at position 5)")
    assert recs[5].evidence == ("its root 1 is not step 3's bonus 0 (logits: sibling leak, the flattened recurrence)")
    # a shorter context differs at its end; both faults are named
    steps = [_step(0, "a", [1], [2], [3, 4]), _step(1, "a", [1, 2], [5], [6])]
    recs = [_rec(), _rec()]
    rv.judge_continuity(steps, recs)
    assert recs[1].evidence == ("its context (2 tokens) is not step 0's context plus what that step committed (3 "
                                "tokens; first difference at position 2); its root 5 is not step 0's bonus 4")


def test_the_noise_bound_is_the_tighter_of_the_engines_and_the_dumps():
    tol = {"engine": 0.05, "dtype": {"float32": 1e-6, "bfloat16": 0.05, "float16": 0.04}.get}
    dump = lambda dt: NS(header={"compute_dtype": dt})  # noqa: E731
    assert rv.noise_bound(dump("float32"), tol) == 1e-6
    assert rv.noise_bound(dump("bfloat16"), tol) == 0.05
    assert rv.noise_bound(dump("float16"), tol) == 0.04
    assert rv.noise_bound(dump("bfloat16"), {**tol, "engine": 1e-3}) == 1e-3
    d = rv.default_tolerance()
    assert d["engine"] == 1e-6 and d["dtype"]("bfloat16") == 5e-2
    assert rv.default_tolerance(engine_dtype="float16")["engine"] == 5e-2
    assert rv.default_tolerance(0.3, "bfloat16")["engine"] == 0.3


def test_the_summary_counts_every_step_level_fault_apart():
    node = lambda kl, top1, lp=0.0, fast=0.0: NS(kl=kl, top1_agrees=top1, logprob_err=lp, fast_path_kl=fast)  # noqa: E731
    step = lambda request, nodes, silent, diagnosis, **kw: NS(  # noqa: E731
        request=request, nodes=nodes, silent_corruption=silent, diagnosis=diagnosis, **{
            "positions_as_expected": True, "bonus_ok": True, "commit_ok": True, "rounding_divergence": False, **kw})
    recs = [step("a", [node(0.0, True), node(0.2, False, 1.5, 1e-9)], True, "sibling leak"),
            step("a", [node(None, True, 0.1)], False, "commit error", positions_as_expected=False, commit_ok=False),
            step("b", [node(0.01, False)], True, "bonus error", bonus_ok=False),
            step("b", [node(0.0, True, 0.0, 2e-9)], False, "within noise"),
            # a near-tie turned within the noise: counted apart, and not above noise
            step("c", [node(0.005, False), node(None, False, 0.1), node(None, False, 0.2)], False, "within noise",
                 rounding_divergence=True)]
    s = rv.summarize(recs, 0.01)
    assert s == {"steps": 5, "requests": 3, "nodes": 8, "silent_corruption_steps": 2, "rounding_divergence_steps": 1,
                 "diagnosed_steps": 3,
                 "diagnoses": {"within noise": 2, "sibling leak": 1, "position error": 0, "mask error": 0,
                               "state commit error": 0, "state drift": 0, "stale state": 0, "unexplained": 0,
                               "bonus error": 1, "acceptance error": 0, "commit error": 1},
                 "top1_disagreements": 5, "top1_disagreements_above_noise": 2, "kl_max": 0.2, "logprob_err_max": 1.5,
                 "fast_path_kl_max": 2e-9, "positions_unexpected_steps": 1, "bonus_error_steps": 1,
                 "commit_error_steps": 1}
    # the bound decides which disagreements are above noise: at KL 0.02 the top-k error 0.2 is within sqrt(2 * 0.02)
    assert rv.summarize(recs, 0.02)["top1_disagreements_above_noise"] == 1
    assert rv.summarize(recs, 1e-3)["top1_disagreements_above_noise"] == 5
    empty = rv.summarize([], 1e-6)
    assert empty["steps"] == 0 and empty["kl_max"] is None and empty["logprob_err_max"] is None


# ---- check-kernel -----------------------------------------------------------------------------------

def test_bits_pools_and_bounds():
    x = torch.tensor([float("nan"), 1.0])
    assert torch.equal(ck._bits(x), ck._bits(x.clone()))  # NaN slots equal themselves bit for bit
    assert ck._bits(torch.tensor([1.0], dtype=torch.bfloat16)).dtype == torch.int16
    assert ck._bits(torch.tensor([1], dtype=torch.int64)).dtype == torch.int64
    assert ck._bits(torch.tensor([True])).dtype == torch.uint8
    assert ck._bound(torch.tensor([[2.0, -4.0]]), torch.float32) == pytest.approx(1e-5 + 2e-5 * 4.0)
    assert ck._bound(torch.tensor([[2.0, -4.0]]), torch.bfloat16) == pytest.approx(1e-2 + 1.6e-2 * 4.0)
    assert ck._bound(torch.zeros(0), torch.float32) == pytest.approx(1e-5)
    pool = torch.zeros(5, 2)
    before = ck._bits(pool).clone()
    pool[1, 0] = 1.0
    pool[4, 1] = 2.0
    w = ck._pool_writes(pool, before, torch.tensor([1, 3], dtype=torch.int32))
    assert w == {"committed_untouched": False, "others_untouched": False, "written_slots": [1, 4]}
    w = ck._pool_writes(pool, ck._bits(pool).clone(), torch.tensor([0], dtype=torch.int32))
    assert w == {"committed_untouched": True, "others_untouched": True, "written_slots": []}
    # a whole slot-major pool [N, layers, ...] given its layer: the batch's entries there are the committed states,
    # any other layer's entry (of the batch's slots too) another's
    whole = torch.zeros(5, 3, 2)
    before = ck._bits(whole).clone()
    slots = torch.tensor([1, 3, -1], dtype=torch.int32)
    assert ck._pool_writes(whole, before, slots, 1) == {"committed_untouched": True, "others_untouched": True,
                                                        "written_slots": []}
    whole[3, 1, 0] = 1.0  # the batch's own entry
    assert ck._pool_writes(whole, before, slots, 1) == {"committed_untouched": False, "others_untouched": True,
                                                        "written_slots": [3]}
    whole[3, 1, 0] = 0.0
    whole[1, 2, 1] = 1.0  # another layer's entry of a batch slot
    assert ck._pool_writes(whole, before, slots, 1) == {"committed_untouched": True, "others_untouched": False,
                                                        "written_slots": [1]}
    whole[1, 2, 1] = 0.0
    whole[4, 1, 1] = 1.0  # the layer's entry of a slot outside the batch
    assert ck._pool_writes(whole, before, slots, 1) == {"committed_untouched": True, "others_untouched": False,
                                                        "written_slots": [4]}
    whole[4, 1, 1] = 0.0
    whole[0, 0, 0] = 1.0  # another layer's entry of a slot outside the batch
    assert ck._pool_writes(whole, before, slots, 1)["written_slots"] == [0]
    assert ck._pool_writes(whole, before, slots, 0)["committed_untouched"]  # slot 0 is not the batch's


def test_node_errors_are_inf_where_the_output_is_not_finite():
    ref = torch.zeros(1, 3, 1, 2)
    o = torch.tensor([[[[0.0, 0.5]], [[float("nan"), 0.0]], [[-0.25, 0.0]]]])
    assert ck._node_errors(o, ref).tolist() == [[0.5, float("inf"), 0.25]]


def _result(o, ref_exact, ref_leaky=None, *, order_exact=(True, True, False), **kw):
    return {"o": o, "ref": {"exact": ref_exact, "leaky": ref_exact if ref_leaky is None else ref_leaky},
            "order_exact": torch.tensor([list(order_exact)] * o.shape[0]), "dtype": torch.float32, "inputs_changed": [],
            "repeatable": True, "committed_untouched": True, "others_untouched": True,
            "real": torch.ones(o.shape[0], dtype=torch.bool), **kw}


def test_a_padded_rows_output_is_the_engines_own_and_a_real_rows_is_not():
    """A padded row (slot -1) verifies whatever its engine makes of it (SGLang: a zero state; vLLM: nothing
    written): its output is left out of finiteness and of every comparison; the same fault on a real row fails."""
    ref = torch.ones(2, 3, 1, 1)
    bad = ref.clone()
    bad[1] = float("nan")  # every node of the second row
    pad = torch.tensor([True, False])
    for mode in ("exact", "leaky"):
        props = ck._properties(mode)
        assert all(p(_result(bad, ref, real=pad)) for p in props.values())
        assert [n for n, p in props.items() if not p(_result(bad, ref))] == [
            "output finite", "exact on order-exact nodes",
            "exact on every node" if mode == "exact" else "flattened semantics on every node"]


def test_every_property_predicate_on_hand_built_results():
    ref = torch.ones(1, 3, 1, 1)
    exact = ck._properties("exact")
    leaky = ck._properties("leaky")
    assert list(exact) == ["output finite", "inputs untouched", "repeatable", "committed state untouched",
                           "other pool slots untouched", "exact on order-exact nodes", "exact on every node"]
    assert list(leaky)[-1] == "flattened semantics on every node" and len(leaky) == 7
    ok = _result(ref.clone(), ref)
    assert all(p(ok) for p in exact.values())
    off = ref.clone()
    off[0, 2] += 1e-3  # node 2 (not order-exact) off by more than float32's bound 3e-5
    r = _result(off, ref)
    assert [n for n, p in exact.items() if not p(r)] == ["exact on every node"]
    off[0, 1] += 1e-3  # an order-exact node too
    assert [n for n, p in exact.items() if not p(_result(off, ref))] == ["exact on order-exact nodes",
                                                                       "exact on every node"]
    within = ref.clone()
    within[0, 2] += 2.9e-5  # inside atol 1e-5 + rtol 2e-5 * 1
    assert exact["exact on every node"](_result(within, ref))
    within[0, 2] += 2e-6
    assert not exact["exact on every node"](_result(within, ref))
    zero = torch.zeros(1, 3, 1, 1, dtype=torch.float64)
    at = zero.clone()
    at[0, 2] = 1e-5  # exactly float32's bound on a zero reference: still within
    assert exact["exact on every node"](_result(at, zero))
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert not exact["output finite"](_result(nan, ref))
    assert not exact["inputs untouched"](_result(ref, ref, inputs_changed=["k"]))
    assert not exact["repeatable"](_result(ref, ref, repeatable=False))
    assert not exact["committed state untouched"](_result(ref, ref, committed_untouched=False))
    assert not exact["other pool slots untouched"](_result(ref, ref, others_untouched=False))
    # leaky: the flattened reference on every node, the exact one on order-exact nodes
    flat = ref.clone()
    flat[0, 2] = 5.0
    assert leaky["flattened semantics on every node"](_result(flat.clone(), ref, flat))
    assert leaky["exact on order-exact nodes"](_result(flat.clone(), ref, flat))
    assert not leaky["flattened semantics on every node"](_result(ref.clone(), ref, flat))
    # a bf16 input dtype widens the bound
    assert exact["exact on every node"](_result(ref + 1e-3, ref, dtype=torch.bfloat16))
    committed = ck._properties("exact", ("window rewritten", lambda r: r["x"]))
    assert "committed state untouched" not in committed and committed["window rewritten"]({"x": True})


class _Kernel:
    """A fake kernel that records its calls, optionally writes an argument or varies its output."""

    def __init__(self, *, write=None, vary=False):
        self.calls, self.write, self.vary = 0, write, vary

    def __call__(self, args, pool, slots):
        self.calls += 1
        if self.write == "q":
            args["q"].add_(1.0)
        if self.write == "parents":
            args["parents"][0, 0] = 5
        if self.write == "slots":
            slots[0] = 3
        if self.write == "pool":
            pool[slots.long()] += 1.0
        if self.write == "q once" and self.calls == 1:
            args["q"].add_(1.0)
        out = args["q"] * 2.0
        return out + (self.calls * 1e-3 if self.vary and self.calls == 3 else 0.0)


def _inp(burst=2):
    inp = {"q": torch.ones(1, 2, 1, 1), "k": None, "parents": torch.tensor([[-1, 0]]),
           "slots": torch.tensor([1], dtype=torch.int32), "pool": torch.zeros(3, 1), "burst": burst}
    if burst is None:
        del inp["burst"]
    return inp


@pytest.mark.parametrize("write, changed", [(None, []), ("q", ["q"]), ("parents", ["parents"]), ("slots", ["slots"]),
                                            ("pool", []), ("q once", ["q"])])
def test_calls_see_every_argument_written(write, changed):
    k = _Kernel(write=write)
    inp = _inp()
    kept = {n: ck._bits(inp[n]).clone() for n in ("q", "parents", "slots", "pool")}
    r = ck._calls(k, inp, ("q", "k"), "cpu")
    assert k.calls == 2 and r["inputs_changed"] == changed and r["repeatable"] is (write != "q once")
    # every call worked on copies: the caller's tensors are as they were
    assert all(torch.equal(ck._bits(inp[n]), b) for n, b in kept.items())
    want_pool = torch.zeros(3, 1)
    if write == "pool":
        want_pool[1] = 1.0
    assert torch.equal(r["pool_after"], want_pool)  # the pool as the first call left it
    assert torch.equal(r["o"], torch.full((1, 2, 1, 1), 2.0) + (2.0 if write in ("q", "q once") else 0.0))
    assert r["committed_untouched"] == (write != "pool") and r["others_untouched"]
    assert r["written_slots"] == ([1] if write == "pool" else [])


def test_calls_burst_and_repeatability():
    k = _Kernel(vary=True)  # its third call differs
    assert ck._calls(k, _inp(burst=2), ("q",), "cpu")["repeatable"] and k.calls == 2
    k = _Kernel(vary=True)
    r = ck._calls(k, _inp(burst=5), ("q",), "cpu")
    assert k.calls == 5 and r["repeatable"] is False
    k = _Kernel()
    ck._calls(k, _inp(burst=None), ("q",), "cpu")
    assert k.calls == 2  # no burst asked: two calls
    assert ck._calls(_Kernel(), _inp(burst=0), ("q",), "cpu")["repeatable"]  # at least two calls whatever burst says


def test_coverage_sums_totals_and_takes_range_ends():
    cov = ck._coverage([{"nodes": 3, "g min": -2.0, "g max": -0.5, "tree": "chain", "not order-exact nodes total": 4},
                        {"nodes": 17, "g min": -30.0, "g max": -1e-4, "tree": "drawn", "not order-exact nodes total": 0},
                        {"nodes": 3, "g min": -1.0, "g max": -0.1, "tree": "chain", "not order-exact nodes total": 5}])
    assert cov == {"nodes": [3, 17], "g min": -30.0, "g max": -1e-4, "tree": ["chain", "drawn"],
                   "not order-exact nodes total": 9}
    assert ck._coverage([]) == {}
    assert ck._coverage([{"nodes": 5, "tree": "star"}]) == {"nodes": [5], "tree": ["star"]}


def test_a_counterexample_names_the_node_its_property_is_about_and_a_slot_property_its_slots():
    """The first wrong node of "exact on order-exact nodes" is an order-exact one (a leaky kernel's other nodes
    differ from exact by design), of "output finite" a non-finite one; a property of the pool's slots (a conv's
    committed window) is located by the slots written, not by an output that differs as the mode allows."""
    from ddsim.engines import kernel_cases as kc
    inp = kc.gdn_case(T=4, kind="star", B=2, K=2, V=2, seed=0)  # order-exact: nodes 0 and 1 of each sequence
    ref = torch.zeros(2, 4, 2, 2, dtype=torch.float64)
    o = ref.clone()
    o[0, 2] = 1.0  # sequence 0's node 2: not order-exact (a leaky kernel's leak)
    o[1, 1] = 1.0  # sequence 1's node 1: order-exact
    o[1, 3] = float("nan")
    r = {"o": o, "ref": {"exact": ref, "leaky": ref}, "order_exact": torch.tensor([list(t.order_exact)
                                                                                   for t in inp["trees"]]),
         "real": torch.ones(2, dtype=torch.bool), "dtype": torch.float32, "inputs_changed": [], "repeatable": True,
         "written_slots": [3]}
    ce = ck._describe(inp, r, "exact on order-exact nodes", "leaky")
    assert (ce["first_wrong_node"]["sequence"], ce["first_wrong_node"]["node"]) == (1, 1)
    assert (ck._describe(inp, r, "exact on every node", "exact")["first_wrong_node"]["node"]) == 2
    fin = ck._describe(inp, r, "output finite", "leaky")["first_wrong_node"]
    assert (fin["sequence"], fin["node"]) == (1, 3) and "first wrong node 3 of sequence 1" in ck._where(
        {**ck._describe(inp, r, "output finite", "leaky"), "example": "drawn"})
    window = ck._where(ck._describe(inp, r, "committed window = the flattened draft's window", "leaky"))
    assert "slots written [3]" in window and "wrong node" not in window


def test_the_op_and_dtype_of_an_example_come_from_its_inputs():
    """_op_of tells lightning attention (a decay), KDA (a gate per key channel), GDN, Mamba2 (dt) and the conv apart;
    _input_dtype reads q, else x; _short cuts a long repr to its limit with an ellipsis."""
    from ddsim.engines import kernel_cases as kc
    small = dict(T=3, kind="chain", B=1, seed=0)
    ops = {"gdn": kc.gdn_case(**small, K=2, V=2), "kda": kc.kda_case(**small, K=2),
           "lightning": kc.lightning_case(**small, K=2), "mamba2": kc.mamba2_case(**small, P=2, N=2),
           "conv": kc.conv_case(**small, C=2, dtype=torch.bfloat16)}
    assert {op: ck._op_of(inp) for op, inp in ops.items()} == {op: op for op in ops}
    assert ck._input_dtype(ops["conv"]) == torch.bfloat16 and ck._input_dtype(ops["gdn"]) == torch.float32
    assert ck._short("x" * 10, 10) == "x" * 10 and ck._short("x" * 11, 10) == "x" * 9 + "…"
    assert ck._short(list(range(100))) == str(list(range(100)))[:159] + "…"


def _node_state_run():
    """A GDN example (2 sequences of 3 nodes, rows [3, 1] of 4, pitch 5) with node 2 of sequence 1 kept wrong, and
    its run result with writes outside the batch's rows (row 0 step 0, and the guard row after the buffer)."""
    from ddsim.engines import kernel_cases as kc
    inp = kc.gdn_case(T=3, kind="chain", B=2, K=2, V=3, seed=0, label="two chains", dtype=torch.bfloat16)
    inp.update(node_rows=torch.tensor([3, 1], dtype=torch.int32), node_buffer=(4, 5), node_layout="shuffled rows")
    ref = torch.zeros(2, 3, 2, 3, dtype=torch.float64)
    states = torch.zeros(2, 3, 2, 2, 3, dtype=torch.float64)
    vals = states.clone()
    vals[1, 2] = 0.5
    vals[0, 1] = ck._bound(states, torch.bfloat16)  # at the bound: not wrong
    r = {"o": ref.clone(), "ref": {"exact": ref, "leaky": ref}, "ref_states": states, "node_vals": vals,
         "order_exact": torch.ones(2, 3, dtype=torch.bool), "real": torch.ones(2, dtype=torch.bool),
         "dtype": torch.float32, "inputs_changed": ["node rows"], "repeatable": False, "written_slots": [],
         "node_written": [[0, 0], [4, 0]], "node_others_untouched": False}
    return inp, r


def test_a_node_state_counterexample_names_its_node_and_the_buffer_entries_written():
    """_describe's whole JSON for a node-state property (the kept states against the oracle's, the buffer's layout and
    what was written outside it), and _where's line for it and for every other kind of property."""
    inp, r = _node_state_run()
    bound = ck._bound(r["ref_states"], torch.bfloat16)  # the input dtype's
    ce = ck._describe(inp, r, "node states exact on every node", "exact")
    assert ce == {"property": "node states exact on every node", "op": "gdn", "mode": "exact", "example": "two chains",
                  "dtype": "bfloat16", "reference": "exact",
                  "trees": [{"parents": [-1, 0, 1], "tokens": [0, 1, 2]}] * 2,
                  "shapes": {"B": 2, "T": 3, "H": 1, "HV": 2, "K": 2, "V": 3},
                  "pool": {"slots": 5, "batch_slots": inp["slots"].tolist(), "written_slots": [], "dtype": "float32"},
                  "inputs_changed": ["node rows"], "repeatable": False,
                  "first_wrong_node": {"sequence": 1, "node": 2, "max_abs_error": 0.5, "bound": bound,
                                       "order_exact": True},
                  "node_buffer": {"rows": 4, "pitch": 5, "batch_rows": [3, 1], "written_outside": [[0, 0], [4, 0]]}}
    assert ck._where(ce) == (f"serving example [two chains]: first wrong node state 2 of sequence 1 (parents [-1, 0, 1]),"
                             f" error 0.5 > {bound:.3g}")
    assert ck._where({**ce, "example": "drawn"}).startswith("first wrong node state 2 of sequence 1")
    unlabelled = {k: v for k, v in inp.items() if k != "label"}  # a drawn input
    assert ck._describe(unlabelled, r, "node states exact on every node", "exact")["example"] == "drawn"
    o = r["o"].clone()
    o[0, 0, 1] = ck._bound(r["ref"]["exact"], torch.bfloat16)  # an output at its bound, and one past it
    o[1, 1, 0] = 1.0
    wrong = ck._describe(inp, {**r, "o": o}, "exact on every node", "exact")["first_wrong_node"]
    assert (wrong["sequence"], wrong["node"], wrong["bound"]) == (1, 1, ck._bound(r["ref"]["exact"], torch.bfloat16))
    flat = ck._describe(inp, r, "node states flattened on every node", "leaky")
    assert flat["reference"] == "leaky" and flat["first_wrong_node"]["node"] == 2
    out = ck._describe(inp, r, "exact on every node", "exact")  # the outputs are right: no wrong node
    assert out["first_wrong_node"] is None and out["reference"] == "exact"
    buf = ck._describe(inp, r, "other node-state entries untouched", "exact")
    assert ck._where(buf) == ("serving example [two chains]: batch rows [3, 1] of 4 (pitch 5 steps, 3 nodes), written "
                              "outside them (row, step) [[0, 0], [4, 0]] (rows -1 and 4: the guard rows)")
    inside = {**buf, "node_buffer": {**buf["node_buffer"], "written_outside": [[0, 3]]}}
    assert ck._where(inside).endswith("written outside them (row, step) [[0, 3]]")
    before = {**buf, "node_buffer": {**buf["node_buffer"], "written_outside": [[-1, 0]]}}
    assert ck._where(before).endswith("(rows -1 and 4: the guard rows)")
    assert ck._where(ck._describe(inp, r, "inputs untouched", "exact")) == (
        "serving example [two chains]: the kernel wrote its arguments node rows")
    assert ck._where({**ck._describe(inp, {**r, "inputs_changed": ["q", "slots"]}, "inputs untouched", "exact"),
                      "example": "drawn"}) == "the kernel wrote its arguments q, slots"
    assert ck._where(ck._describe(inp, r, "repeatable", "exact")) == (
        "serving example [two chains]: repeated calls on one input gave outputs that differ bit for bit")
    assert ck._where({"property": "output finite", "example": "two chains", "error": "ValueError: no"}) == (
        "serving example [two chains]: the kernel raised ValueError: no")
    slots = ck._describe(inp, {**r, "written_slots": [-1, 2]}, "other pool slots untouched", "exact")
    assert ck._where(slots) == (f"serving example [two chains]: trees [[-1, 0, 1], [-1, 0, 1]], batch slots "
                                f"{inp['slots'].tolist()} of 5, slots written [-1, 2] (-1 and 5: the slot's worth "
                                "before and after the pool)")
    assert ck._where({**slots, "pool": {**slots["pool"], "written_slots": [0, 4]}}).endswith("slots written [0, 4]")
    assert ck._where({**slots, "pool": {**slots["pool"], "written_slots": [5]}}).endswith(
        "slots written [5] (-1 and 5: the slot's worth before and after the pool)")
    assert "node_buffer" not in ck._describe(inp, {k: v for k, v in r.items() if k != "node_vals"}, "repeatable",
                                             "exact")


def test_a_16_bit_state_pool_is_judged_at_the_coarser_of_its_rounding_and_the_inputs():
    """_judged_dtype: an example's outputs and node states are held to its inputs' tolerance, or its state pool's where
    that is coarser (a server's 16-bit cache); the conv's window pool is its input's. _describe's bound is the same,
    its dtype the inputs', and its pool says its dtype."""
    from ddsim.engines import kernel_cases as kc
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    for inputs, pool, judged in ((f32, bf16, bf16), (f32, f16, f16), (bf16, f16, bf16), (f16, f32, f16),
                                 (f32, f32, f32), (f16, bf16, bf16)):
        inp = kc.gdn_case(T=3, kind="chain", B=1, K=2, V=3, seed=0, dtype=inputs, state_dtype=pool)
        assert (ck._input_dtype(inp), ck._judged_dtype(inp)) == (inputs, judged), (inputs, pool)
    for op in (kc.mamba2_case, kc.kda_case, kc.lightning_case):
        assert ck._judged_dtype(op(T=3, kind="chain", B=1, seed=0, state_dtype=f16)) == f16
    assert ck._judged_dtype(kc.conv_case(T=3, kind="chain", B=1, seed=0, dtype=f16)) == f16
    inp, r = _node_state_run()
    inp = {**inp, **kc.gdn_case(T=3, kind="chain", B=2, K=2, V=3, seed=0, label="two chains", state_dtype=bf16)}
    inp["label"] = "two chains"
    ce = ck._describe(inp, r, "node states exact on every node", "exact")
    assert ce["dtype"] == "float32" and ce["pool"]["dtype"] == "bfloat16"
    assert ce["first_wrong_node"]["bound"] == ck._bound(r["ref_states"], bf16)
    states = ck._properties("exact", nodes=True)["node states exact on every node"]
    vals = r["ref_states"].clone()
    vals[0, 1] = ck._bound(r["ref_states"], bf16)  # at the pool's bound, past the inputs'
    assert states({**r, "node_vals": vals, "dtype": bf16}) and not states({**r, "node_vals": vals, "dtype": f32})
    # a commit's counterexample is judged so too: sequence 0's slot off the oracle's by the pool's bound
    kept = r["ref_states"][:, 2].clone()[None]  # [L = 1, B, ...]: each sequence's state after node 2
    kept[0, 0] += ck._bound(r["ref_states"], bf16)
    c = {**r, "commit_vals": kept, "commit_kept": kept, "commit_accepted": torch.tensor([2, -1]),
         "commit_done": torch.tensor([True, False]), "commit_layers": 1}
    name = ck.COMMIT_PROPERTIES["exact"]
    assert ck._describe(inp, c, name, "exact")["commit"] == ck._describe_commit(c, name, bf16)
    assert ck._describe(inp, c, name, "exact")["commit"]["first_wrong"] is None  # at the bound: not wrong
    assert ck._describe_commit(c, name, f32)["first_wrong"]["sequence"] == 0
    copied = ck._describe(inp, {**c, "commit_kept": kept + 1.0}, ck.COMMIT_COPY, "exact")["commit"]["first_wrong"]
    assert (copied["layer"], copied["sequence"], copied["node"]) == (0, 0, 2)


def test_the_shapes_of_a_counterexample_by_op():
    """_describe's shapes: a Mamba2 example's heads, head dim, groups and state size; a conv's channels, width and
    whether it has a bias."""
    from ddsim.engines import kernel_cases as kc
    m = kc.mamba2_case(T=3, kind="chain", B=1, G=2, ratio=3, P=4, N=5, seed=0)
    c = kc.conv_case(T=3, kind="chain", B=2, C=6, W=3, bias=False, seed=0)
    r = {"o": torch.zeros(1, 3, 6, 4), "ref": {"exact": torch.zeros(1, 3, 6, 4)}, "order_exact": torch.ones(1, 3, dtype=torch.bool),
         "real": torch.ones(1, dtype=torch.bool), "inputs_changed": [], "repeatable": True, "written_slots": []}
    assert ck._describe(m, r, "exact on every node", "exact")["shapes"] == {"B": 1, "T": 3, "H": 6, "P": 4, "G": 2, "N": 5}
    rc = {**r, "o": torch.zeros(2, 3, 6), "ref": {"exact": torch.zeros(2, 3, 6)},
          "order_exact": torch.ones(2, 3, dtype=torch.bool), "real": torch.ones(2, dtype=torch.bool)}
    d = ck._describe(c, rc, "exact on every node", "exact")
    assert d["shapes"] == {"B": 2, "T": 3, "C": 6, "W": 3, "bias": False} and d["op"] == "conv"


def test_the_references_carry_node_states_in_the_kernels_own_mode_only():
    """_references asks the oracle for every mode's outputs, and for the states after each node only in the kernel's
    own mode and only where it keeps them."""
    calls = []

    def reference(m, states):
        calls.append((m, states))
        return (f"{m} out", f"{m} states") if states else f"{m} out"
    assert ck._references(reference, ("exact", "leaky"), "leaky", True) == {
        "ref": {"exact": "exact out", "leaky": "leaky out"}, "ref_states": "leaky states"}
    assert calls == [("exact", False), ("leaky", True)]
    assert ck._references(reference, ("exact", "leaky"), "exact", True)["ref_states"] == "exact states"
    assert ck._references(reference, ("exact",), "exact", False) == {"ref": {"exact": "exact out"}}


def test_a_kernels_output_is_held_to_the_contract_and_its_errors_worded():
    """ContractError for anything but a floating-point tensor of the oracle's shape; the line says 'broke its
    contract' for those and 'raised' for the kernel's own exceptions, cut at 300 characters."""
    ck.checked_output(torch.zeros(2, 3, dtype=torch.bfloat16), (2, 3))
    ck.checked_output(torch.zeros(2, 3))  # no shape: the type alone (before the oracle runs)
    for o, shape, said in (([0.0], None, "an output of list, not a floating-point tensor"),
                           (torch.zeros(2, 3, dtype=torch.int64), None, "an output of torch.int64, not a floating-point "
                                                                        "tensor"),
                           (torch.zeros(1, 2, 3), (2, 3), "an output of shape (1, 2, 3) where the contract's is (2, 3)")):
        with pytest.raises(ck.ContractError) as e:
            ck.checked_output(o, shape)
        assert str(e.value) == said
        assert ck._failed(ck.raised_line(e.value, "cpu")) == f"the kernel broke its contract: {said}"
    assert ck._failed("ValueError: T > 64") == "the kernel raised ValueError: T > 64"
    assert ck.raised_line(ValueError("x" * 400), "cuda") == "ValueError: " + "x" * 299 + "…"


def test_an_error_raised_inside_tritons_runtime_on_the_cpu_says_the_kernel_was_compiled(monkeypatch):
    """The note only for the CPU, only while Triton is not interpreting, only for an exception raised in Triton's
    runtime or backends (a frame of that file name, made here without Triton)."""
    def raised_in(filename):
        try:
            exec(compile("raise RuntimeError('0 active drivers')", filename, "exec"))
        except RuntimeError as e:
            return e
    runtime, backend = raised_in("/x/triton/runtime/driver.py"), raised_in("/x/triton/backends/nvidia/driver.py")
    elsewhere = raised_in("/x/sglang/kernels/ops.py")
    note = " (Triton compiled the kernel for a GPU: on the CPU an engine's Triton kernels run only in Triton's " \
           "interpreter, TRITON_INTERPRET=1 set before they are imported)"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert ck.raised_line(runtime, "cpu") == "RuntimeError: 0 active drivers" + note
    assert ck.raised_line(backend, "cpu") == "RuntimeError: 0 active drivers" + note
    for e, device in ((runtime, "cuda"), (runtime, "cuda:0"), (elsewhere, "cpu")):
        assert ck.raised_line(e, device) == "RuntimeError: 0 active drivers"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ck.raised_line(runtime, "cpu") == "RuntimeError: 0 active drivers"


def test_a_convs_parent_table_is_held_to_the_trees_parents_but_at_its_root_and_padded_rows():
    """A conv that fills its engine's parent table (EngineKernel.conv_parents: SGLang's) is held, in exact mode only,
    to the tree's parents at every real sequence's nodes 1..T-1: the root's entry and a padded row's are the engine's
    own. _parents_wrong lists (call, sequence, node, written, parent), at most 8; _where says the first."""
    import types
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]])
    real = torch.tensor([True, True, False])
    good = parents.to(torch.int32)
    good[:, 0] = 5  # the root's entry: anything
    good[2] = 99  # a padded row's: anything
    assert ck._parents_wrong([good], parents, real) == []
    bad, unwritten = good.clone(), good.clone()
    bad[1, 3] = 1
    unwritten[0, 2] = ck.PARENTS_UNWRITTEN
    assert ck._parents_wrong([good, bad, unwritten], parents, real) == [[1, 1, 3, 1, 2], [2, 0, 2, -7, 0]]
    chain = torch.zeros(2, 12, dtype=torch.int32)
    assert len(ck._parents_wrong([chain], torch.full((2, 12), 3), torch.ones(2, dtype=torch.bool))) == 8
    trees = [{"parents": [-1, 0, 0, 1]}, {"parents": [-1, 0, 1, 2]}]
    ce = {"property": ck.PARENT_TABLE, "example": "x", "trees": trees, "first_wrong_node": None,
          "parent_table_wrong": [[2, 0, 2, -7, 0]]}
    assert ck._where(ce) == "serving example [x]: call 2: node 2 of sequence 0 (parents [-1, 0, 0, 1]) given parent " \
                            "nothing, not 0"
    ce["parent_table_wrong"] = [[0, 1, 3, 1, 2], [1, 0, 2, 3, 0]]
    assert ck._where({**ce, "example": "drawn"}) == ("call 0: node 3 of sequence 1 (parents [-1, 0, 1, 2]) given "
                                                     "parent 1, not 2")
    for mode, has in (("exact", True), ("leaky", False)):
        for fills in (True, False):
            kernel = types.SimpleNamespace(conv_parents=fills, conv_writes_slot=None)
            props = ck._ConvRunner(kernel, mode, "cpu", node_states=True).properties()
            assert (ck.PARENT_TABLE in props) == (has and fills)
            if has and fills:  # beside the outputs' properties, before the node states'
                names = list(props)
                assert names[names.index("exact on every node") + 1] == ck.PARENT_TABLE
                assert names[names.index(ck.PARENT_TABLE) + 1] == "node states exact on every node"
                assert props[ck.PARENT_TABLE]({"parents_wrong": []})
                assert not props[ck.PARENT_TABLE]({"parents_wrong": [[0, 0, 1, 0, 1]]})
