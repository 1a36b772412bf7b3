"""The chain that decides the gate's verdict — per-node metrics -> aggregation -> report model ->
gate — tested on values: hand-built records with hand-computed results, the committed planted-leak
/ no-leak reports with their exact verdicts, and every class of report the gate must refuse.

Fast (no audit runs here): `make mutation` runs these tests against mutants of ddsim/measure/metrics.py,
ddsim/measure/aggregate.py, ddsim/verdict/report_model.py, ddsim/verdict/gate.py and the recheck's comparison
(ddsim/measure/reproduce.py).
"""
from __future__ import annotations

import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ddsim import cli
from ddsim.errors import InputError, MeasurementError
from ddsim.measure.aggregate import NodePool
from ddsim.measure.metrics import group_by, node_metrics, summarize
from ddsim.model.config import get_preset
from ddsim.reports import json_report
from ddsim.trees.tree import Tree
from ddsim.verdict.gate import evaluate, leak_nodes, load_policy
from ddsim.verdict.report_model import LeakTable, ModeSummary, NoiseFloor, Summary, noise_margin_of
from tests.report_fixtures import path as fixture_path

POLICY = load_policy("hybrid-unsafe")


@pytest.fixture(scope="module")
def raw():
    return {k: json.loads(fixture_path(k).read_text()) for k in ("leak", "inert")}


@pytest.fixture(scope="module")
def reports(raw):
    return {k: json_report.load(fixture_path(k)) for k in raw}


# --- per-node metrics and their aggregation, on hand-built values -------------------------------

def test_summarize_values_and_refuses_non_finite():
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert s == {"n": 4, "mean": 4.0, "median": 2.5, "p90": pytest.approx(7.9), "max": 10.0}
    assert summarize([]) == {"n": 0, "mean": None, "median": None, "p90": None, "max": None}
    for bad in (float("nan"), float("inf")):
        with pytest.raises(MeasurementError, match="1 of 3 measured values are NaN or infinite"):
            summarize([1.0, bad, 2.0])


def test_group_by_groups_and_masks():
    keys = np.array([0, 1, 1, 2])
    vals = np.array([[1.0, 2.0, 4.0, 8.0], [0.0, 0.0, 0.0, 16.0]])  # [layers, nodes]: a group pools both rows
    g = group_by(keys, vals)
    assert sorted(g) == [0, 1, 2]
    assert g[1] == {"n": 4, "mean": 1.5, "median": 1.0, "p90": pytest.approx(3.4), "max": 4.0}
    assert g[2]["max"] == 16.0 and g[2]["n"] == 2
    assert sorted(group_by(keys, vals[0], mask=keys > 0)) == [1, 2]


def test_kl_is_oracle_against_mode_and_flags_and_margins():
    """KL(oracle || mode), not the reverse: the two differ on these logits."""
    cfg = get_preset("micro")
    lo = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)  # oracle
    lm = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 2.5]], dtype=torch.float64)  # mode
    hid = [torch.ones(2, 4)] * cfg.num_layers
    ref = SimpleNamespace(logits=lo, hidden=hid, ssm=[None] * cfg.num_layers)
    res = SimpleNamespace(logits=lm, hidden=[h * 1.5 for h in hid], ssm=[None] * cfg.num_layers)
    tree = Tree(parents=[-1, 0], tokens=[0, 1])
    m = node_metrics(tree, res, ref, cfg)
    p, q = torch.softmax(lo, -1), torch.softmax(lm, -1)
    forward = (p * (p.log() - q.log())).sum(-1).numpy()
    backward = (q * (q.log() - p.log())).sum(-1).numpy()
    assert np.allclose(m["kl"], forward) and not np.allclose(m["kl"], backward)
    assert m["flip"].tolist() == [False, True]  # node 0: the uniform row ties, argmax takes the first
    assert np.allclose(m["margin"], [3.0, 1.0])  # the oracle's top-1 minus top-2
    assert np.allclose(m["max_abs"], [2.0, 2.5])
    assert np.allclose(m["hidden_rel"], 0.5)


def _step_metrics():
    """A 4-node tree (0 root; 1, 2 children of 0; 3 child of 2): order-exact [T, T, F, F]."""
    tree = Tree(parents=[-1, 0, 0, 2], tokens=[0, 1, 2, 3])
    assert tree.order_exact.tolist() == [True, True, False, False]
    G, L = 3, 4
    metrics = {
        "kl": np.array([0.0, 0.1, 0.5, 0.9]), "max_abs": np.array([0.0, 1.0, 2.0, 3.0]),
        "margin": np.array([1.0, 2.0, 3.0, 4.0]), "flip": np.array([False, False, True, True]),
        "state_rel": np.arange(G * 4, dtype=float).reshape(G, 4) / 100,
        "conv_rel": np.arange(G * 4, dtype=float).reshape(G, 4) / 10,
        "hidden_rel": np.arange(L * 4, dtype=float).reshape(L, 4) / 1000,
    }
    keys = {"depth": tree.depths.copy(), "rank": tree.sibling_rank.copy(), "order_exact": tree.order_exact.copy()}
    return metrics, keys


def test_pool_table_splits_groups_and_counts():
    cfg = get_preset("micro")  # ggga: GDN layers 0, 1, 2
    pool = NodePool()
    metrics, keys = _step_metrics()
    pool.add(metrics, keys)
    pool.add(metrics, keys)  # two steps: 8 nodes
    t = pool.table(cfg)
    LeakTable(**t)  # the report model accepts it
    assert (t["nodes"], t["order_exact_nodes"], t["not_order_exact_nodes"]) == (8, 4, 4)
    assert t["argmax_flip_rate"] == {"order_exact": 0.0, "other": 1.0, "all": 0.5}
    assert t["kl"]["other"] == summarize([0.5, 0.9, 0.5, 0.9]) and t["kl"]["order_exact"]["max"] == 0.1
    assert t["max_abs_logit"]["other"]["max"] == 3.0
    # state rows of order-exact nodes (columns 0, 1) and the others (2, 3), every GDN layer pooled
    st = metrics["state_rel"]
    assert t["state_rel"]["other"] == summarize(np.concatenate([st[:, 2:], st[:, 2:]], 1))
    assert t["state_rel"]["order_exact"] == summarize(np.concatenate([st[:, :2], st[:, :2]], 1))
    # hidden_rel_last is the last layer's
    assert t["hidden_rel_last"]["other"]["max"] == metrics["hidden_rel"][-1, 3]
    by_depth = {r["depth"]: r for r in t["by_depth"]}
    assert {d: r["nodes"] for d, r in by_depth.items()} == {0: 2, 1: 4, 2: 2}
    assert by_depth[1]["argmax_flip_rate"] == 0.5 and by_depth[2]["argmax_flip_rate"] == 1.0
    assert by_depth[2]["state_rel"] == summarize(np.concatenate([st[:, 3:], st[:, 3:]], 1))
    by_rank = {r["rank"]: r for r in t["by_rank"]}  # the root (depth 0) is no one's sibling
    assert {k: r["nodes"] for k, r in by_rank.items()} == {0: 4, 1: 2}
    assert by_rank[1]["argmax_flip_rate"] == 1.0 and by_rank[0]["argmax_flip_rate"] == 0.5
    layers = t["by_layer"]
    assert [r["kind"] for r in layers] == list("ggga") and "state_rel" not in layers[3]
    assert layers[1]["state_rel"] == summarize(np.concatenate([st[1, 2:], st[1, 2:]]))
    assert layers[2]["conv_rel"]["max"] == metrics["conv_rel"][2, 3]
    assert layers[3]["hidden_rel"] == summarize(np.concatenate([metrics["hidden_rel"][3, 2:]] * 2))
    assert t["margin_of_flipped"] == summarize([3.0, 4.0, 3.0, 4.0])
    assert t["margin_all"]["n"] == 8


def test_pool_table_by_family_pools_each_family_apart():
    """A mixed model (layers g, m, a with the same three recurrent rows as micro's GDN layers): the
    family rows pool the non-order-exact nodes of their own layers only, in family order."""
    cfg = get_preset("micro").replace(layer_pattern="gmpa")  # recurrent rows: 0 -> gdn, 1 and 2 -> mamba2
    pool = NodePool()
    metrics, keys = _step_metrics()
    pool.add(metrics, keys)
    t = pool.table(cfg)
    LeakTable(**t)
    st, cv = metrics["state_rel"], metrics["conv_rel"]
    fam = {r["family"]: r for r in t["by_family"]}
    assert [r["family"] for r in t["by_family"]] == ["gdn", "mamba2"]
    assert (fam["gdn"]["layers"], fam["mamba2"]["layers"]) == (1, 2)
    assert fam["gdn"]["state_rel"] == summarize(st[0, 2:])
    assert fam["mamba2"]["state_rel"] == summarize(st[1:, 2:])
    assert fam["mamba2"]["conv_rel"] == summarize(cv[1:, 2:])
    assert [r["kind"] for r in t["by_layer"]] == list("gmpa") and "state_rel" in t["by_layer"][2]
    none = NodePool()
    ex = {k: v[..., :2] for k, v in metrics.items()}  # order-exact nodes only: the families are empty
    none.add(ex, {k: v[:2] for k, v in keys.items()})
    assert all(r["state_rel"]["n"] == 0 for r in none.table(cfg)["by_family"])


def test_node_metrics_on_hand_built_logits_and_a_model_without_recurrent_layers():
    """KL, max |diff| and flips per row of [T, V] logits (not over the flattened array), and empty
    [0, T] state tables for a model whose layers keep no state."""
    cfg = get_preset("micro").replace(layer_pattern="aa")
    tree = Tree([-1, 0, 0], [1, 2, 3])
    ref_logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    res_logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 6.0, 5.0], [0.0, 2.0, 1.0]])
    none = [None, None]
    ref = SimpleNamespace(logits=ref_logits, hidden=torch.ones(2, 3, 4, dtype=torch.float64), ssm=none, conv=none)
    res = SimpleNamespace(logits=res_logits, hidden=torch.ones(2, 3, 4), ssm=none, conv=none)
    m = node_metrics(tree, res, ref, cfg)
    assert m["flip"].tolist() == [False, True, False]  # per row: node 1's argmax moved from 2 to 1
    assert m["max_abs"].tolist() == [0.0, 6.0, 1.0]
    lo, lm = torch.log_softmax(ref_logits, -1), torch.log_softmax(res_logits.double(), -1)
    assert np.allclose(m["kl"], (lo.exp() * (lo - lm)).sum(-1).numpy()) and m["kl"][0] == 0.0
    assert m["state_rel"].shape == (0, 3) and m["conv_rel"].shape == (0, 3)
    assert m["hidden_rel"].shape == (2, 3) and not m["hidden_rel"].any()
    from ddsim.measure.metrics import reference_norms
    norms = reference_norms(ref, cfg)  # the hidden states' rows alone: no state tables
    assert norms.shape == (2, 3) and torch.allclose(norms, torch.full((2, 3), 2.0, dtype=torch.float64))
    handed = node_metrics(tree, res, ref, cfg, ref_norms=norms)
    assert all(np.array_equal(handed[k], m[k]) for k in m)


def test_handed_in_norms_divide_the_hidden_errors_of_a_result_without_states():
    """A result whose recurrent layers recorded no state (ssm None): the oracle's norms are its hidden
    states' rows alone, [L, T], and node_metrics divides by the norms it is handed, not its own."""
    from ddsim.measure.metrics import reference_norms
    cfg = get_preset("micro")
    L = cfg.num_layers
    hid = torch.ones(L, 2, 4, dtype=torch.float64)
    ref = SimpleNamespace(logits=torch.zeros(2, 3, dtype=torch.float64), hidden=hid, ssm=[None] * L, conv=[None] * L)
    res = SimpleNamespace(logits=torch.zeros(2, 3), hidden=hid * 1.5, ssm=[None] * L, conv=[None] * L)
    tree = Tree(parents=[-1, 0], tokens=[0, 1])
    norms = reference_norms(ref, cfg)
    assert norms.shape == (L, 2)
    alone, handed = node_metrics(tree, res, ref, cfg), node_metrics(tree, res, ref, cfg, ref_norms=norms)
    assert np.allclose(alone["hidden_rel"], 0.5) and np.array_equal(handed["hidden_rel"], alone["hidden_rel"])
    assert handed["state_rel"].shape == (0, 2) and handed["conv_rel"].shape == (0, 2)
    assert np.allclose(node_metrics(tree, res, ref, cfg, ref_norms=norms * 2)["hidden_rel"], 0.25)


def test_noise_floor_is_the_worst_node_of_either_group():
    cfg = get_preset("micro")
    pool = NodePool()
    metrics, keys = _step_metrics()
    metrics["state_rel"] = metrics["state_rel"][:, ::-1].copy()  # the worst state error on an order-exact node
    pool.add(metrics, keys)
    floor = NoiseFloor.of(LeakTable(**pool.table(cfg)))
    assert floor.state_rel_max == metrics["state_rel"].max()
    assert floor.kl_max == 0.9 and floor.argmax_flip_rate == 0.5


def _gen(prompt, accepted, flips, tokens_first=None, margin=None, silent=0, walks=None):
    from ddsim.verdict.report_model import Generation
    n = sum(a + 1 for a in accepted)
    return Generation(prompt=prompt, budget=8, mode="leaky", policy="ddtree-8", tokens=[1] * n,
                      first_divergence=tokens_first, divergence_margin=margin, agreement=0.5 if tokens_first is not None else 1.0,
                      silent_corruption_steps=silent, tokens_per_step=n / len(accepted), accepted=accepted,
                      decision_flips=flips, reference_walk=walks or [a + 1 for a in accepted], tree_sizes=[9] * len(accepted))


def test_mode_summary_from_generations():
    gens = [_gen(0, [2, 0, 3], [0, 1, 2], tokens_first=3, margin=0.7, silent=2, walks=[3, 4, 4]),
            _gen(1, [1, 1, 1], [0, 0, 0])]
    s = ModeSummary.of(gens, ref_len=6, noise_margin=0.5)
    assert s.generations == 2 and s.steps == 6
    assert s.tokens_per_step == pytest.approx(14 / 6)  # each step emits accepted + 1
    assert s.accepted_histogram == [1, 3, 1, 1]
    # decision flips per node of the reference walk (3 + 4 + 4 + 2 + 2 + 2), not of the mode's walk
    assert s.decision_flips == 3 and s.decision_flip_rate == pytest.approx(3 / 17)
    assert s.silent_corruption_steps == 2
    assert s.generations_leaving_greedy == 1 and s.generations_leaving_greedy_above_noise == 1
    assert s.first_divergence == [3, None]
    assert s.agreement == 0.75 and s.mean_tree_size == 9.0
    assert s.survival == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5]  # generation 0 leaves at token 3
    assert ModeSummary.of(gens, ref_len=6, noise_margin=0.7).generations_leaving_greedy_above_noise == 0


def test_noise_margin_of_tables_and_temperature():
    t = lambda xs: SimpleNamespace(margin_of_flipped=Summary(**summarize(xs)))  # noqa: E731
    assert noise_margin_of([t([0.3]), t([0.1, 0.5]), t([])], 0.0) == 0.5
    assert noise_margin_of([t([0.3])], 2.0) == 0.15
    assert noise_margin_of([t([])], 1.0) == 0.0


# --- the gate on the committed planted-leak / no-leak pair --------------------------------------

LEAK_VIOLATIONS = {
    "argmax_flip_rate_above_noise": 0.305556, "decision_flip_rate": 0.172414,
    "generations_leaving_greedy_above_noise": 3, "silent_corruption_steps": 4,
}


def _measured(verdicts):
    return {v.rule: v.measured for v in verdicts}


def test_gate_refuses_the_planted_leak(reports):
    verdicts = evaluate(POLICY, reports["leak"])
    bad = {v.rule: v.measured for v in verdicts if not v.holds}
    assert bad.keys() == LEAK_VIOLATIONS.keys()
    for rule, value in LEAK_VIOLATIONS.items():
        assert bad[rule] == pytest.approx(value, rel=1e-5), rule
    m = _measured(verdicts)
    assert m["exact_generations_leaving_greedy_above_noise"] == 0 and m["exact_kl_max"] < 1e-9
    assert m["leak_nodes_per_budget"] == leak_nodes(reports["leak"], "leaky") >= 100


def test_gate_approves_the_inert_model(reports):
    verdicts = evaluate(POLICY, reports["inert"])
    assert all(v.holds for v in verdicts), [v for v in verdicts if not v.holds]
    assert len(verdicts) == 9
    m = _measured(verdicts)
    assert m["argmax_flip_rate_above_noise"] == 0.0 and m["silent_corruption_steps"] == 0
    # the state did leak (the rules are about what reaches the tokens), and coverage is real
    leaky = reports["inert"].budgets[0].leak["leaky"]
    assert leaky.state_rel.other.median > 0.1 and m["leak_nodes_per_budget"] >= 100


def test_gate_exit_codes_in_process(capsys):
    assert cli.main(["gate", "--policy", "hybrid-unsafe", "--report", str(fixture_path("leak"))]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED silent_corruption_steps: measured 4 > bound 0" in out and "4 of 9 rules violated" in out
    # the inert report's weights were edited after the preset made them: it does not reproduce, so only
    # --no-recheck gates it, and the verdict says it took the figures on trust
    assert cli.main(["gate", "--policy", "hybrid-unsafe", "--report", str(fixture_path("inert"))]) == 2
    assert "does not reproduce: provenance.weights_sha256" in capsys.readouterr().err
    assert cli.main(["gate", "--policy", "hybrid-unsafe", "--report", str(fixture_path("inert")), "--no-recheck"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        "all 9 rules hold for mode leaky; reached without a recheck (--no-recheck): the report's figures were taken on trust")


def _with_leak_nodes(report, n):
    budgets = [b.model_copy(update={"leak": {m: t.model_copy(update={"not_order_exact_nodes": n})
                                             for m, t in b.leak.items()}}) for b in report.budgets]
    return report.model_copy(update={"budgets": budgets})


def test_no_exercised_leak_is_a_violation_whatever_the_policy(reports, tmp_path):
    """An audit with no node outside order-exact positions cannot approve, even if its policy
    requires nothing; a policy may require more."""
    vacuous = _with_leak_nodes(reports["inert"], 0)
    lax = tmp_path / "lax.toml"
    lax.write_text("[rules]\nsilent_corruption_steps = 0\n")
    v = {x.rule: x for x in evaluate(load_policy(lax), vacuous)}
    assert not v["leak_nodes_per_budget"].holds and v["leak_nodes_per_budget"].bound == 1.0
    assert v["silent_corruption_steps"].holds
    assert v["leak_nodes_per_budget"].line("leaky").startswith("VIOLATED leak_nodes_per_budget: measured 0 < bound 1")
    few = {x.rule: x for x in evaluate(POLICY, _with_leak_nodes(reports["inert"], 99))}
    assert not few["leak_nodes_per_budget"].holds and few["leak_nodes_per_budget"].bound == 100
    assert all(x.holds for x in evaluate(POLICY, _with_leak_nodes(reports["inert"], 100)))


@pytest.mark.parametrize("fast_path, holds", [("float32", False), ("bfloat16", True), ("float16", False)])
def test_gate_bounds_follow_the_fast_paths_precision(reports, fast_path, holds):
    """A bfloat16 exact path 1e-2 from the oracle passes [rules.bfloat16]; the same figures under a
    float32 fast path, or a dtype with no table of its own (float32's bounds), do not."""
    r = reports["inert"]
    r = r.model_copy(update={
        "precision": r.precision.model_copy(update={"fast_path": fast_path}),
        "noise_floor": {k: v.model_copy(update={"state_rel_max": 1e-2, "kl_max": 8e-3}) for k, v in r.noise_floor.items()}})
    v = {x.rule: x for x in evaluate(POLICY, r)}
    assert v["exact_state_rel_max"].holds == holds and v["exact_kl_max"].holds == holds
    assert v["exact_state_rel_max"].bound == (5e-2 if fast_path == "bfloat16" else 1e-4)


# --- reports the gate must refuse ---------------------------------------------------------------

def _mode(d, b, m):
    return d["budgets"][b]["modes"][m]


TAMPER = [
    # bad measurements are refused, not skipped
    ("null rate", lambda d: _mode(d, 0, "leaky").update(decision_flip_rate=None), "budgets.0.modes.leaky.decision_flip_rate"),
    ("negative count", lambda d: _mode(d, 1, "leaky").update(silent_corruption_steps=-1), "silent_corruption_steps"),
    ("rate above 1", lambda d: d["budgets"][0]["leak"]["leaky"]["argmax_flip_rate"].update(all=1.5), "argmax_flip_rate.all"),
    ("string count", lambda d: _mode(d, 0, "leaky").update(generations_leaving_greedy="0"), "generations_leaving_greedy"),
    ("bool count", lambda d: _mode(d, 0, "leaky").update(silent_corruption_steps=False), "silent_corruption_steps"),
    ("missing field", lambda d: _mode(d, 0, "leaky").pop("generations_leaving_greedy_above_noise"), "Field required"),
    ("untyped noise floor", lambda d: d["noise_floor"]["24"].update(kl_max="tiny"), "noise_floor.24.kl_max"),
    ("negative noise floor", lambda d: d["noise_floor"]["24"].update(state_rel_max=-1.0), "noise_floor.24.state_rel_max"),
    ("unknown field", lambda d: d["budgets"][0].update(notes="x"), "Extra inputs are not permitted"),
    ("summary stats out of order", lambda d: d["budgets"][0]["leak"]["leaky"]["kl"]["other"].update(max=0.0), "above max"),
    # inconsistent reports
    ("budget listed but absent", lambda d: d["budgets"].pop(), "config.budgets is [24, 32]"),
    ("budget repeated", lambda d: d["config"].update(budgets=[24, 24]), "budgets repeat"),
    ("mode missing", lambda d: d["budgets"][0]["modes"].pop("leaky-conv"), "mode 'leaky-conv' missing"),
    ("summary disagrees with generations",
     lambda d: _mode(d, 0, "leaky").update(silent_corruption_steps=0), "but generations[] give"),
    ("rate disagrees with generations", lambda d: _mode(d, 1, "leaky").update(decision_flip_rate=0.0), "decision_flip_rate"),
    ("generation dropped", lambda d: d["generations"].pop(), "is missing"),
    ("generation duplicated", lambda d: d["generations"].append(copy.deepcopy(d["generations"][-1])), "appears twice"),
    ("generation of another prompt", lambda d: d["generations"][3]["tokens"].__setitem__(0, 47), "first_divergence"),
    ("precision not the environment's", lambda d: d["precision"].update(fast_path="bfloat16"),
     "a CPU audit compares a float32 fast path"),
    ("oracle not the environment's", lambda d: d["precision"].update(oracle="float32"), "precision"),
    ("bf16x3 oracle products on a CPU", lambda d: d["precision"].update(oracle_products="bf16x3"),
     "precision.oracle_products"),
    ("oracle products unrecorded", lambda d: d["precision"].pop("oracle_products"), "oracle_products"),
    ("noise floor from another run", lambda d: d["noise_floor"]["32"].update(kl_max=1e-3), "noise_floor[32].kl_max"),
    ("noise margin from another run", lambda d: d.update(noise_margin=0.5), "noise_margin"),
    ("noise floor budget missing", lambda d: d["noise_floor"].pop("32"), "noise_floor"),
    ("leak coverage inflated", lambda d: d["budgets"][0]["leak"]["leaky"].update(not_order_exact_nodes=10**6),
     "not_order_exact_nodes"),
    ("leak tables of different trees", lambda d: d["budgets"][0]["leak"]["leaky-conv"].update(
        nodes=1, order_exact_nodes=1, not_order_exact_nodes=0), "leak"),
    ("provenance version", lambda d: d["provenance"].update(ddsim_version="0.0.1"), "provenance.ddsim_version"),
    ("provenance source", lambda d: d["provenance"].update(source="preset tiny"), "provenance.source"),
    ("weights hash", lambda d: d["provenance"].update(weights_sha256="xyz"), "weights_sha256"),
    ("throughput row", lambda d: d["throughput"]["rows"][1].update(tokens_per_step=99.0), "throughput.rows"),
    ("other schema", lambda d: d.update(schema_version=2), "schema_version 2"),
    ("unstamped", lambda d: d.update(generated_at=None), "generated_at missing"),
]


def _one_more_order_exact_node(d):
    """Every mode's leak table of the first budget counts one order-exact node more, every count and rate in it
    consistent (what a forger who inflates the leak's node count must write)."""
    for t in d["budgets"][0]["leak"].values():
        n, fr = t["nodes"], t["argmax_flip_rate"]
        flips = fr["all"] * n
        t["nodes"] += 1
        t["order_exact_nodes"] += 1
        fr["order_exact"] = fr["order_exact"] or 0.0
        fr["all"] = flips / (n + 1)
        for name in ("kl", "max_abs_logit"):
            t[name]["order_exact"]["n"] += 1
        t["margin_all"]["n"] += 1
        t["by_depth"][0]["nodes"] += 1


TAMPER += [  # more classes, found by the mutation run
    ("a checkpoint path on a preset report", lambda d: d["config"].update(model_path="/x"), "provenance.source"),
    ("device not the environment's", lambda d: d["config"].update(device="cuda"), "environment.device"),
    ("reference margin dropped", lambda d: d["prompts"][0]["reference_margins"].pop(), "prompts[0]"),
    ("prompt token at the vocabulary size", lambda d: d["prompts"][1]["tokens"].__setitem__(0, 48),
     "token outside the vocabulary (48)"),
    ("layer kind changed", lambda d: d["budgets"][0]["leak"]["exact"]["by_layer"][0].update(kind="m"),
     "does not match the model's layers"),
    ("attention layer given a state", lambda d: d["budgets"][0]["leak"]["exact"]["by_layer"][3].update(
        state_rel=d["budgets"][0]["leak"]["exact"]["by_layer"][0]["state_rel"]),
     "state_rel is given exactly for layers with a recurrent state"),
    ("family row dropped", lambda d: d["budgets"][0]["leak"]["leaky"]["by_family"].clear(),
     "does not match the model's recurrent layers"),
    ("prompt numbered wrong", lambda d: d["prompts"][1].update(index=5), "prompts[1].index"),
    ("steps changed", lambda d: d["config"].update(steps=3), "expected 27"),
    ("an input digest without its file", lambda d: d["provenance"]["inputs_sha256"].update(trace="0" * 64),
     "provenance.inputs_sha256"),
    ("leak tables counting a node the trees lack", _one_more_order_exact_node,
     "budgets[24].leak: 301 nodes, but the leaky generations' trees have 300"),
]


@pytest.mark.parametrize("name, mutate, needle", TAMPER, ids=[t[0] for t in TAMPER])
def test_tampered_reports_do_not_load(raw, name, mutate, needle):
    d = copy.deepcopy(raw["leak"])
    mutate(d)
    with pytest.raises(InputError) as e:
        json_report.loads(json.dumps(d), "r.json")
    assert needle in str(e.value), str(e.value)
    assert str(e.value).startswith("r.json: ")


@pytest.mark.parametrize("text, needle", [
    ('{"schema_version": 4, "schema_version": 4}', "key 'schema_version' appears twice"),
    ('{"schema_version": NaN}', "NaN is not a JSON number"),
    ('{"schema_version": 4, "x": -Infinity}', "-Infinity is not a JSON number"),
    ("[1, 2]", "not a ddsim report"),
    ("{oops", "malformed JSON"),
])
def test_malformed_report_text(text, needle):
    with pytest.raises(InputError, match=needle):
        json_report.loads(text, "r.json")


def test_duplicate_key_deep_inside_a_real_report(raw):
    text = json.dumps(raw["inert"])
    text = text.replace('"silent_corruption_steps": 0', '"silent_corruption_steps": 5, "silent_corruption_steps": 0', 1)
    with pytest.raises(InputError, match="'silent_corruption_steps' appears twice"):
        json_report.loads(text, "r.json")


def test_fixture_reports_load_and_round_trip(raw, reports):
    for k, r in reports.items():
        assert json.loads(json_report.dumps(r)) == raw[k]
        assert math.isclose(r.noise_margin, 0.0)


def test_schema_file_is_generated_from_the_model():
    assert json.loads(json_report.SCHEMA_PATH.read_text()) == json_report.schema()


def test_the_report_takes_every_layer_kind_the_model_has():
    """A layer row's kind is one of the model's layer kinds, each of them (a kind added to the model and not to the
    report would make every audit of it fail to write its report)."""
    import typing

    from ddsim.model.config import LAYER_KINDS
    from ddsim.verdict.report_model import LayerRow
    assert set(typing.get_args(LayerRow.model_fields["kind"].annotation)) == set(LAYER_KINDS)


# --- edge cases the mutation run showed untested ------------------------------------------------

def test_rel_rows_with_zero_references():
    from ddsim.measure.metrics import _rel_table
    ref = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    a = torch.tensor([[0.0, 0.0], [3.0, 4.5], [1.0, 0.0]], dtype=torch.float32)
    rel = _rel_table([(a, ref)])[0]
    assert rel[0] == 0.0 and rel[1] == pytest.approx(0.1) and rel[2] == np.inf
    assert _rel_table([(torch.full((1, 2), 0.5), torch.full((1, 2), 0.25, dtype=torch.float64))])[0][0] == 1.0


def test_node_metrics_per_gdn_layer_states_and_windows():
    """state_rel and conv_rel: one row per GDN layer, in layer order, each node its own column."""
    cfg = get_preset("micro")  # ggga
    T, L = 2, cfg.num_layers
    lo = torch.zeros(T, 5, dtype=torch.float64)
    ssm_ref = [torch.ones(T, 2, 3, dtype=torch.float64) * (i + 1) if cfg.layer_pattern[i] == "g" else None for i in range(L)]
    conv_ref = [torch.ones(T, 4, 3, dtype=torch.float64) if cfg.layer_pattern[i] == "g" else None for i in range(L)]
    ssm = [None if s is None else s * torch.tensor([1.0, 1.5], dtype=torch.float64)[:, None, None] for s in ssm_ref]
    conv = [None if c is None else c * (1 + 0.1 * i) for i, c in enumerate(conv_ref)]
    hid = [torch.ones(T, 4)] * L
    ref = SimpleNamespace(logits=lo, hidden=hid, ssm=ssm_ref, conv=conv_ref)
    res = SimpleNamespace(logits=lo.clone(), hidden=hid, ssm=ssm, conv=conv)
    m = node_metrics(Tree(parents=[-1, 0], tokens=[0, 1]), res, ref, cfg)
    assert m["state_rel"].shape == (3, 2) and np.allclose(m["state_rel"], [[0.0, 0.5]] * 3)
    assert np.allclose(m["conv_rel"], [[0.0, 0.0], [0.1, 0.1], [0.2, 0.2]])
    assert np.allclose(m["kl"], 0.0) and not m["flip"].any()


def test_node_metrics_with_the_oracles_norms_handed_in():
    """A step measures several modes against one oracle result: reference_norms(ref) computed once and
    handed in gives every table what node_metrics computes alone; norms of another shape are refused,
    and wrong norms of the right shape show in the errors (they are used, not recomputed)."""
    from ddsim.measure.metrics import MeasurementError, reference_norms
    cfg = get_preset("micro")  # ggga
    T, L = 2, cfg.num_layers
    gen = torch.Generator().manual_seed(1)
    rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    g = [i for i in range(L) if cfg.layer_pattern[i] == "g"]
    ref = SimpleNamespace(logits=rnd(T, 5), hidden=[rnd(T, 4) for _ in range(L)],
                          ssm=[rnd(T, 2, 3) if i in g else None for i in range(L)],
                          conv=[rnd(T, 4, 3) if i in g else None for i in range(L)])
    res = SimpleNamespace(logits=rnd(T, 5).float(), hidden=[h.float() + 0.1 for h in ref.hidden],
                          ssm=[None if x is None else x.float() * 1.5 for x in ref.ssm],
                          conv=[None if x is None else x.float() - 0.2 for x in ref.conv])
    tree = Tree(parents=[-1, 0], tokens=[0, 1])
    alone, norms = node_metrics(tree, res, ref, cfg), reference_norms(ref, cfg)
    assert norms.shape == (L + 2 * len(g), T)
    given = node_metrics(tree, res, ref, cfg, ref_norms=norms)
    for k in ("hidden_rel", "state_rel", "conv_rel", "kl"):
        np.testing.assert_array_equal(given[k], alone[k])
    with pytest.raises(MeasurementError, match=r"ref_norms: shape \(9, 2\), the oracle's tables are \(10, 2\)"):
        node_metrics(tree, res, ref, cfg, ref_norms=norms[1:])
    halved = node_metrics(tree, res, ref, cfg, ref_norms=norms * 2)
    np.testing.assert_allclose(halved["state_rel"], alone["state_rel"] / 2, rtol=1e-12)


def test_node_metrics_tables_of_a_model_with_one_recurrent_layer():
    """The tables' rows in order for a model with a single recurrent layer (the edge of "any recurrent
    layer recorded"): hidden_rel one row per layer, then the one state row, then the one window row."""
    from ddsim.measure.metrics import reference_norms
    cfg = SimpleNamespace(num_layers=2, recurrent_layers=[1], stateful=lambda i: True, windowed=lambda i: True)
    T = 3
    ones = lambda *shape: torch.ones(*shape, dtype=torch.float64)  # noqa: E731
    ref = SimpleNamespace(logits=ones(T, 4), hidden=[ones(T, 2), ones(T, 2)], ssm=[None, ones(T, 2, 2)],
                          conv=[None, ones(T, 3)])
    res = SimpleNamespace(logits=ones(T, 4), hidden=[ones(T, 2) * 1.25, ones(T, 2) * 1.5],
                          ssm=[None, ones(T, 2, 2) * 3], conv=[None, ones(T, 3) * 0.5])
    tree = Tree(parents=[-1, 0, 1], tokens=[0, 1, 2])
    for norms in (None, reference_norms(ref, cfg)):
        m = node_metrics(tree, res, ref, cfg, ref_norms=norms)
        np.testing.assert_allclose(m["hidden_rel"], [[0.25] * T, [0.5] * T])
        np.testing.assert_allclose(m["state_rel"], [[2.0] * T])
        np.testing.assert_allclose(m["conv_rel"], [[0.5] * T])


def test_node_metrics_tables_of_a_model_with_a_short_conv():
    """A short conv (LFM2) keeps no state beside its window: its layer has a window row and no state row, so
    the state table holds the stateful layers alone, in order, and the window table every recurrent layer."""
    cfg = SimpleNamespace(num_layers=3, recurrent_layers=[0, 2], stateful=lambda i: i != 0, windowed=lambda i: True)
    T = 2
    ones = lambda *shape: torch.ones(*shape, dtype=torch.float64)  # noqa: E731
    ref = SimpleNamespace(logits=ones(T, 4), hidden=[ones(T, 2)] * 3, ssm=[ones(T, 0), None, ones(T, 2)],
                          conv=[ones(T, 3), None, ones(T, 3)])
    res = SimpleNamespace(logits=ones(T, 4), hidden=[ones(T, 2)] * 3, ssm=[ones(T, 0), None, ones(T, 2) * 4],
                          conv=[ones(T, 3) * 2, None, ones(T, 3) * 0.75])
    m = node_metrics(Tree(parents=[-1, 0], tokens=[0, 1]), res, ref, cfg)
    np.testing.assert_allclose(m["state_rel"], [[3.0] * T])
    np.testing.assert_allclose(m["conv_rel"], [[1.0] * T, [0.25] * T])


def test_a_short_conv_leak_table_has_the_conv_family_without_a_state_error():
    """The leak table of the short-conv preset: its layers' rows carry the window error and no state error, the
    conv family's row likewise, and a report that gives a short conv a state error does not load."""
    cfg = get_preset("micro-lfm2")  # ccacc
    pool = NodePool()
    metrics, keys = _step_metrics()
    metrics.update(state_rel=np.zeros((0, 4)), conv_rel=np.arange(16, dtype=float).reshape(4, 4) / 10,
                   hidden_rel=np.arange(20, dtype=float).reshape(5, 4) / 1000)
    pool.add(metrics, keys)
    t = pool.table(cfg)
    LeakTable(**t)  # the report model accepts it
    assert t["by_layer"][3]["conv_rel"]["max"] == 1.1  # layer 3 is the third short conv: row 2, its nodes 2 and 3
    assert [row.get("state_rel") is None for row in t["by_layer"]] == [True] * 5
    assert [row.get("conv_rel") is not None for row in t["by_layer"]] == [True, True, False, True, True]
    assert t["by_family"] == [{"family": "conv", "layers": 4, "state_rel": None, "conv_rel": t["by_family"][0]["conv_rel"]}]
    assert t["by_family"][0]["conv_rel"]["n"] == 4 * int((~keys["order_exact"]).sum())
    bad = copy.deepcopy(t)
    bad["by_layer"][0]["state_rel"] = bad["by_layer"][0]["conv_rel"]
    with pytest.raises(ValueError, match="state_rel is given exactly for layers with a recurrent state"):
        LeakTable(**bad)
    bad = copy.deepcopy(t)
    bad["by_family"][0]["state_rel"] = bad["by_family"][0]["conv_rel"]
    with pytest.raises(ValueError, match="state_rel is given exactly for the families that keep a state"):
        LeakTable(**bad)


def test_group_by_on_one_row_and_boolean_keys():
    assert group_by(np.array([0, 0, 1]), np.array([1.0, 3.0, 5.0]))[0]["mean"] == 2.0
    g = group_by(np.array([True, False, True]), np.array([1.0, 2.0, 3.0]))
    assert set(g) == {False, True} and all(isinstance(k, bool) for k in g) and g[True]["n"] == 2


def test_empty_pool_and_empty_summaries():
    cfg = get_preset("micro")
    t = NodePool().table(cfg)
    assert (t["nodes"], t["not_order_exact_nodes"]) == (0, 0)
    assert t["argmax_flip_rate"] == {"order_exact": None, "other": None, "all": None}
    assert t["by_depth"] == [] and t["margin_of_flipped"]["n"] == 0 and t["hidden_rel_last"]["other"]["n"] == 0
    assert NodePool().get("kl").shape == (0,)
    s = ModeSummary.of([], ref_len=3, noise_margin=0.0)
    assert (s.steps, s.tokens_per_step, s.mean_tree_size, s.decision_flip_rate) == (0, 0.0, 0.0, 0.0)
    assert s.accepted_histogram == [] and s.agreement is None and s.survival == []


def test_by_rank_leaves_the_root_out_of_every_group():
    cfg = get_preset("micro")
    pool = NodePool()
    metrics, keys = _step_metrics()
    pool.add(metrics, keys)
    by_rank = {r["rank"]: r for r in pool.table(cfg)["by_rank"]}
    st, hid = metrics["state_rel"], metrics["hidden_rel"][-1]
    assert by_rank[0]["state_rel"] == summarize(st[:, [1, 3]])  # nodes 1 and 3, not the root
    assert by_rank[0]["hidden_rel_last"] == summarize(hid[[1, 3]])
    assert by_rank[1]["state_rel"] == summarize(st[:, [2]])


def test_agreement_of_an_empty_generation_is_one():
    from ddsim.verdict.report_model import Generation
    g = Generation(prompt=0, budget=None, mode="exact", policy="chain", tokens=[], first_divergence=None,
                   divergence_margin=None, agreement=1.0, silent_corruption_steps=0, tokens_per_step=0.0,
                   accepted=[], decision_flips=[], reference_walk=[], tree_sizes=[])
    g.check_against([], [], "g")
    with pytest.raises(ValueError, match="agreement"):
        g.model_copy(update={"agreement": 0.0}).check_against([], [], "g")


def test_worst_refuses_what_it_cannot_trust():
    from ddsim.verdict.gate import _worst
    assert _worst([0.5, 2.0, 1.0]) == 2.0
    for bad in ([], [1.0, None], [float("nan")], [float("inf"), 0.0]):
        with pytest.raises(InputError, match="missing or non-finite"):
            _worst(bad)


def test_flip_excess_subtracts_the_exact_paths_flips(reports):
    from ddsim.verdict.gate import _flip_excess

    def with_rates(r, leaky, exact):
        def leak(b):
            upd = {m: t.model_copy(update={"argmax_flip_rate": t.argmax_flip_rate.model_copy(
                update={"all": {"leaky": leaky, "exact": exact}.get(m, t.argmax_flip_rate.all)})})
                for m, t in b.leak.items()}
            return b.model_copy(update={"leak": upd})
        return r.model_copy(update={"budgets": [leak(b) for b in r.budgets]})

    assert _flip_excess(with_rates(reports["inert"], 0.3, 0.1), "leaky") == pytest.approx(0.2)
    null = with_rates(reports["inert"], None, 0.1)
    with pytest.raises(InputError, match="measured no node"):
        _flip_excess(null, "leaky")
    with pytest.raises(InputError, match="measured no node"):
        _flip_excess(with_rates(reports["inert"], 0.1, None), "leaky")


def test_each_rule_reads_its_own_field_and_mode(reports):
    """Every rule's measurement, checked against the report's own numbers (worst budget)."""
    from ddsim.verdict.gate import RULES
    r = reports["leak"]
    worst = lambda mode, f: max(getattr(b.modes[mode], f) for b in r.budgets)  # noqa: E731
    expect = {
        "decision_flip_rate": worst("leaky", "decision_flip_rate"),
        "generations_leaving_greedy": worst("leaky", "generations_leaving_greedy"),
        "generations_leaving_greedy_above_noise": worst("leaky", "generations_leaving_greedy_above_noise"),
        "silent_corruption_steps": worst("leaky", "silent_corruption_steps"),
        "exact_generations_leaving_greedy": worst("exact", "generations_leaving_greedy"),
        "exact_generations_leaving_greedy_above_noise": worst("exact", "generations_leaving_greedy_above_noise"),
        "exact_state_rel_max": max(v.state_rel_max for v in r.noise_floor.values()),
        "exact_kl_max": max(v.kl_max for v in r.noise_floor.values()),
    }
    for rule, value in expect.items():
        assert RULES[rule][0](r, "leaky") == value, rule
    # the gated mode is the policy's: leaky-conv reads leaky-conv's summaries
    assert RULES["silent_corruption_steps"][0](r, "leaky-conv") == worst("leaky-conv", "silent_corruption_steps")
    assert len({RULES["decision_flip_rate"][0](r, m) for m in ("leaky", "leaky-state", "leaky-conv")}) > 1


def test_a_cuda_report_needs_the_float32_oracle(raw):
    d = copy.deepcopy(raw["inert"])
    d["environment"]["device"] = "cuda:0"
    d["config"]["device"] = "cuda"
    with pytest.raises(InputError, match="a CUDA audit runs the float32 oracle"):
        json_report.loads(json.dumps(d), "r.json")
    d["precision"].update(oracle="float32", fast_path="bfloat16")
    assert json_report.loads(json.dumps(d), "r.json").precision.fast_path == "bfloat16"


def test_report_matches_the_generated_json_schema(raw):
    import jsonschema
    jsonschema.Draft202012Validator(json_report.schema()).validate(raw["leak"])


# --- policies, loaded in process ------------------------------------------------------------------

@pytest.mark.parametrize("text, needle", [
    ("[rule]\ndecision_flip_rate = 0\n", "unknown table [rule]"),
    ("policy = 3\n[rules]\ndecision_flip_rate = 0\n", "'policy' must be a table"),
    ("[policy]\nmdoe = 'leaky'\n[rules]\ndecision_flip_rate = 0\n", "unknown key 'mdoe' in [policy]"),
    ("[policy]\nname = 3\n[rules]\ndecision_flip_rate = 0\n", "policy.name must be a string"),
    ("[policy]\ndescription = []\n[rules]\ndecision_flip_rate = 0\n", "policy.description must be a string"),
    ("[policy]\nmode = 'leaky'\n", "no [rules] table"),
    ("rules = 1\n", "no [rules] table"),
    ("[policy]\nmode = 'exact'\n[rules]\ndecision_flip_rate = 0\n", "policy.mode 'exact'"),
    ("[rules]\ndecision_flip_rate = 0\n[rules.bf16]\nexact_kl_max = 1\n", "[rules.bf16] names no dtype"),
    ("[rules.bfloat16]\nexact_kl_max = 1\n", "[rules] has no bounds of its own"),
    ("[rules]\nbogus = 1\n", "unknown key 'bogus' in [rules]"),
    ("[rules]\ndecision_flip_rate = -1\n", "'decision_flip_rate' in [rules] needs a finite bound"),
    ("[rules]\ndecision_flip_rate = nan\n", "needs a finite bound >= 0, got nan"),
    ("[rules]\ndecision_flip_rate = inf\n", "needs a finite bound >= 0, got inf"),
    ("[rules]\ndecision_flip_rate = true\n", "needs a finite bound >= 0, got True"),
    ("[rules]\ndecision_flip_rate = '0'\n", "needs a finite bound >= 0, got '0'"),
    ("[rules]\ndecision_flip_rate = 0\n[rules.bfloat16]\nexact_kl_max = -2\n", "'exact_kl_max' in [rules.bfloat16]"),
    ("[rules]\ndecision_flip_rate = 0\nrequire = 3\n", "unknown key 'require' in [rules]"),
    ("require = 3\n[rules]\ndecision_flip_rate = 0\n", "'require' must be a table"),
    ("[rules]\ndecision_flip_rate = 0\n[require]\nleak_nodes = 5\n", "unknown key 'leak_nodes' in [require]"),
    ("[rules]\ndecision_flip_rate = 0\n[require]\nleak_nodes_per_budget = -5\n", "in [require] needs a finite"),
    ("[rules\n", "malformed TOML"),
])
def test_bad_policies_in_process(tmp_path, text, needle):
    p = tmp_path / "p.toml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_policy(p)
    assert needle in str(e.value) and str(e.value).startswith(str(p)), str(e.value)


def test_policy_fields_and_builtin_lookup(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_text("[policy]\nmode = 'leaky-conv'\n[rules]\ndecision_flip_rate = 0.5\n[rules.bfloat16]\nexact_kl_max = 2\n"
                 "[require]\nleak_nodes_per_budget = 7\n")
    pol = load_policy(p)
    assert (pol.path, pol.name, pol.mode) == (str(p), "mine", "leaky-conv")  # the name defaults to the file's stem
    assert pol.rules == {"decision_flip_rate": 0.5} and pol.by_precision == {"bfloat16": {"exact_kl_max": 2.0}}
    assert pol.require == {"leak_nodes_per_budget": 7.0}
    assert pol.bounds("bfloat16") == {"decision_flip_rate": 0.5, "exact_kl_max": 2.0}
    assert pol.bounds("float32") == {"decision_flip_rate": 0.5}
    p.write_text("[policy]\nname = 'named'\n[rules]\ndecision_flip_rate = 0\n")
    assert load_policy(p).name == "named" and load_policy(p).mode == "leaky"
    assert POLICY.name == "hybrid-unsafe" and POLICY.path.endswith("ddsim/verdict/policies/hybrid-unsafe.toml")
    with pytest.raises(InputError, match="no built-in policy of that name .built-in: hybrid-unsafe; a policy file is "
                                         "given as a path, e.g. ./no-such-policy.toml."):
        load_policy("no-such-policy")
    with pytest.raises(InputError, match="cannot read policy"):
        load_policy(tmp_path / "missing.toml")  # a path (it has a suffix) is never a built-in name


def test_verdict_lines_name_the_bound_and_its_direction():
    from ddsim.verdict.gate import Verdict
    v = {x.rule: x for x in evaluate(POLICY, json_report.load(fixture_path("leak")))}
    assert v["silent_corruption_steps"].line("leaky") == (
        "VIOLATED silent_corruption_steps: measured 4 > bound 0 (steps emitting tokens exact verification would not; "
        "mode leaky)")
    assert v["leak_nodes_per_budget"].meaning == "verified nodes that were not order-exact, fewest over budgets"
    assert Verdict("leak_nodes_per_budget", 3, 100, False, "m", kind="min").line("leaky") == \
        "VIOLATED leak_nodes_per_budget: measured 3 < bound 100 (m; mode leaky)"
    kinds = {x.rule: x.kind for x in evaluate(POLICY, json_report.load(fixture_path("inert")))}
    assert kinds["leak_nodes_per_budget"] == "min" and kinds["silent_corruption_steps"] == "max"


def test_close_is_none_safe_and_relative():
    from ddsim.verdict.report_model import _close
    assert _close(None, None) and not _close(None, 0.0) and not _close(0.0, None)
    assert _close(1.0, 1.0 + 1e-12) and not _close(1.0, 1.0 + 1e-6) and _close(0.0, 0.0)


def test_a_pool_with_no_gdn_layers_still_tables_depths_and_ranks():
    cfg = get_preset("micro").replace(layer_pattern="aa")
    pool = NodePool()
    metrics, keys = _step_metrics()
    metrics.update(state_rel=np.zeros((0, 4)), conv_rel=np.zeros((0, 4)), hidden_rel=metrics["hidden_rel"][:2])
    pool.add(metrics, keys)
    t = pool.table(cfg)
    LeakTable(**t)
    assert [(r["depth"], r["nodes"]) for r in t["by_depth"]] == [(0, 1), (1, 2), (2, 1)]
    assert all(r["state_rel"]["n"] == 0 for r in t["by_depth"] + t["by_rank"])
    assert [(r["rank"], r["nodes"]) for r in t["by_rank"]] == [(0, 2), (1, 1)]


def _reload(d):
    return json_report.loads(json.dumps(d), "r.json")


def test_consistent_variants_still_load(raw):
    """What a real report may say: config.device "auto" on a CPU run, a trace file with its digest."""
    d = copy.deepcopy(raw["inert"])
    d["config"]["device"] = "auto"
    assert _reload(d).config.device == "auto"
    d = copy.deepcopy(raw["inert"])
    d["config"]["trace"], d["provenance"]["inputs_sha256"]["trace"] = "t.jsonl", "0" * 64
    d["config"]["cost_file"], d["provenance"]["inputs_sha256"]["cost"] = "c.json", "1" * 64
    assert set(_reload(d).provenance.inputs_sha256) == {"trace", "cost"}
    d["config"]["prompts_file"], d["provenance"]["inputs_sha256"]["prompts"] = "p.jsonl", "2" * 64
    assert set(_reload(d).provenance.inputs_sha256) == {"prompts", "trace", "cost"}


@pytest.mark.parametrize("name, mutate, needle", [
    ("generation token at the vocabulary size", lambda d: d["generations"][0]["tokens"].__setitem__(0, 48),
     "token outside the vocabulary (48)"),
    ("survival edited", lambda d: d["budgets"][0]["modes"]["leaky"]["survival"].__setitem__(0, 0.5), ".survival"),
    ("histogram edited", lambda d: d["budgets"][0]["modes"]["exact"]["accepted_histogram"].append(0),
     "accepted_histogram"),
])
def test_list_fields_are_compared_element_by_element(raw, name, mutate, needle):
    d = copy.deepcopy(raw["leak"])
    mutate(d)
    with pytest.raises(InputError, match=re_escape(needle)):
        _reload(d)


def re_escape(s):
    import re
    return re.escape(s)


def test_replay_rules_on_hand_built_summaries():
    """gate --dump's verdicts: every [replay] bound is an upper bound (0 where the policy is silent),
    and a dump with no step fails whatever the bounds."""
    from ddsim.verdict.gate import evaluate_replay, load_policy
    policy = load_policy("hybrid-unsafe")
    rules = ("silent_corruption_steps", "diagnosed_steps", "top1_disagreements_above_noise", "bonus_error_steps",
             "commit_error_steps", "positions_unexpected_steps")
    assert policy.replay == {r: 0.0 for r in rules}
    clean = {"steps": 3, **{r: 0 for r in rules}}
    v = evaluate_replay(policy, clean)
    assert [(x.rule, x.measured, x.bound, x.holds) for x in v] == [
        *[(r, 0.0, 0.0, True) for r in rules], ("replayed_steps", 3.0, 1.0, True)]
    bad = evaluate_replay(policy, {**clean, "diagnosed_steps": 1, "top1_disagreements_above_noise": 2})
    assert [x.rule for x in bad if not x.holds] == ["diagnosed_steps", "top1_disagreements_above_noise"]
    # disagreements within the noise, and steps whose divergence the engine's rounding explains, are not rules
    assert all(x.holds for x in evaluate_replay(policy, {**clean, "top1_disagreements": 4,
                                                          "rounding_divergence_steps": 2}))
    for r in rules:  # each step-level check is a rule of its own
        assert [x.rule for x in evaluate_replay(policy, {**clean, r: 1}) if not x.holds] == [r]
    assert [x.holds for x in evaluate_replay(policy, {**clean, "steps": 0})][-1] is False
    assert bad[1].line("replay").startswith("VIOLATED diagnosed_steps: measured 1 > bound 0")
    assert [x.holds for x in evaluate_replay(policy, {**clean, "steps": 1})][-1] is True  # one step is enough
    empty = evaluate_replay(policy, {**clean, "steps": 0})[-1]
    assert empty.line("replay") == ("VIOLATED replayed_steps: measured 0 < bound 1 (a dump with no verify step "
                                    "approves nothing; mode replay)")


def test_replay_table_of_a_policy_is_checked(tmp_path):
    from ddsim.errors import InputError
    from ddsim.verdict.gate import load_policy
    p = tmp_path / "p.toml"
    p.write_text('[rules]\nexact_kl_max = 1e-6\n[replay]\ndiagnosed_steps = 2\n')
    assert load_policy(p).replay == {"silent_corruption_steps": 0.0, "diagnosed_steps": 2.0,
                                     "top1_disagreements_above_noise": 0.0, "bonus_error_steps": 0.0,
                                     "commit_error_steps": 0.0, "positions_unexpected_steps": 0.0}
    p.write_text('[rules]\nexact_kl_max = 1e-6\n[replay]\ntop1_disagreements = 0\n')  # the rule's name before
    with pytest.raises(InputError, match="'top1_disagreements' in \\[replay\\] is retired \\(replaced by "
                                         "top1_disagreements_above_noise"):
        load_policy(p)
    p.write_text('[rules]\nexact_kl_max = 1e-6\n[replay]\nsilent = 2\n')
    with pytest.raises(InputError, match="unknown key 'silent' in \\[replay\\]"):
        load_policy(p)
    p.write_text('[rules]\nexact_kl_max = 1e-6\n[replay]\ndiagnosed_steps = -1\n')
    with pytest.raises(InputError, match="needs a finite bound >= 0"):
        load_policy(p)


def test_reference_fragility_counts_decisions_within_the_noise_margin():
    from ddsim.verdict.report_model import ReferenceFragility
    f = ReferenceFragility.of([[0.1, 0.3, None], [0.2, 2.0]], 0.25)
    assert (f.decisions, f.within_noise_margin, f.fraction, f.fragile) == (5, 2, 0.4, False)
    f = ReferenceFragility.of([[0.1, 0.3, None], [0.2, 0.25]], 0.25)  # ties at the margin count as within
    assert (f.within_noise_margin, f.fraction, f.fragile) == (3, 0.6, True)
    assert ReferenceFragility.of([[0.5]], 0.0).fragile is False


def test_a_fragile_reference_fails_the_gate_whatever_the_policy(reports):
    """A report whose reference decisions mostly lie within the noise margin cannot approve anything;
    the requirement cannot be lowered below 0.5 by a policy."""
    from ddsim.verdict.gate import Policy
    from ddsim.verdict.report_model import ReferenceFragility
    rep = reports["inert"].model_copy(update={"reference_fragility": ReferenceFragility(
        decisions=10, within_noise_margin=6, fraction=0.6, fragile=True)})
    lax = Policy(POLICY.path, "lax", POLICY.mode, POLICY.rules, POLICY.by_precision,
                 {"reference_decisions_above_noise": 0.0}, POLICY.replay)
    for policy in (POLICY, lax):
        bad = [v for v in evaluate(policy, rep) if not v.holds]
        assert [(v.rule, round(v.measured, 6), v.bound) for v in bad] == [("reference_decisions_above_noise", 0.4, 0.5)]


def test_a_tampered_fragility_is_refused(tmp_path):
    from ddsim.reports import json_report
    data = json.loads(fixture_path("leak").read_text())
    data["reference_fragility"]["within_noise_margin"] = 1
    with pytest.raises(InputError, match="reference_fragility"):
        json_report.loads(json.dumps(data), "r.json")


@pytest.fixture(scope="module")
def mamba_report_dict():
    """A small deterministic audit of the micro-mamba2 preset (Mamba2, parallel and MLP-only blocks)."""
    import ddsim.measure.audit as audit
    from ddsim.measure.settings import AuditConfig
    rep = audit.run_audit(AuditConfig(preset="micro-mamba2", budgets=[16], steps=2, n_prompts=1, seed=5))
    return json.loads(json_report.dumps(json_report.stamp(rep)))


def test_a_mamba2_report_loads_and_its_family_rows_are_checked(tmp_path, mamba_report_dict):
    d = copy.deepcopy(mamba_report_dict)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    typed = json_report.load(p)  # consistent as written: m, m and p layers make one mamba2 family of 3
    fam = typed.budgets[0].leak["leaky"].by_family
    assert [(f.family, f.layers) for f in fam] == [("mamba2", 3)]
    for what, edit, needle in (
            ("family renamed", lambda x: x["budgets"][0]["leak"]["leaky"]["by_family"][0].update(family="gdn"),
             "does not match the model's recurrent layers"),
            ("family layer count", lambda x: x["budgets"][0]["leak"]["exact"]["by_family"][0].update(layers=2),
             "does not match the model's recurrent layers"),
            ("MLP layer given a state", lambda x: x["budgets"][0]["leak"]["exact"]["by_layer"][1].update(
                state_rel=x["budgets"][0]["leak"]["exact"]["by_layer"][0]["state_rel"]),
             "state_rel is given exactly for layers with a recurrent state")):
        bad = copy.deepcopy(d)
        edit(bad)
        p.write_text(json.dumps(bad))
        with pytest.raises(InputError, match=needle):
            json_report.load(p)
        assert what  # the case, named in a failure's locals


def test_node_metrics_refuses_a_result_whose_buffers_were_reused():
    """A verify result replayed from a CUDA graph is read in place: once a later verify reused its
    buffers (fresh() false) its numbers are another tree's, so measuring it is an error; a fresh
    result, or one without the notion (fresh None), is measured."""
    cfg = get_preset("micro")
    T, L = 2, cfg.num_layers
    lo = torch.zeros(T, 5, dtype=torch.float64)
    ssm = [torch.ones(T, 2, 3, dtype=torch.float64) if cfg.layer_pattern[i] == "g" else None for i in range(L)]
    conv = [torch.ones(T, 4, 3, dtype=torch.float64) if cfg.layer_pattern[i] == "g" else None for i in range(L)]
    hid = [torch.ones(T, 4)] * L
    ref = SimpleNamespace(logits=lo, hidden=hid, ssm=ssm, conv=conv)
    tree = Tree(parents=[-1, 0], tokens=[0, 1])
    for fresh in (None, lambda: True):
        m = node_metrics(tree, SimpleNamespace(logits=lo.clone(), hidden=hid, ssm=ssm, conv=conv, fresh=fresh), ref, cfg)
        assert np.allclose(m["state_rel"], 0.0)
    with pytest.raises(MeasurementError, match="reused by a later verify"):
        node_metrics(tree, SimpleNamespace(logits=lo.clone(), hidden=hid, ssm=ssm, conv=conv, fresh=lambda: False), ref, cfg)


def test_node_metrics_measures_float32_logits_in_float64():
    """The fast path's logits are float32: KL against the oracle is taken in float64, where a KL of
    1e-9 is resolved (in float32 the log-softmax's rounding alone is 1e-8)."""
    cfg = get_preset("micro").replace(layer_pattern="a")
    lo = torch.zeros(1, 2, dtype=torch.float64)
    lm = torch.tensor([[1e-4, 0.0]], dtype=torch.float32)
    ref = SimpleNamespace(logits=lo, hidden=[torch.ones(1, 4)], ssm=[None], conv=[None])
    res = SimpleNamespace(logits=lm, hidden=[torch.ones(1, 4)], ssm=[None], conv=[None])
    m = node_metrics(Tree(parents=[-1], tokens=[0]), res, ref, cfg)
    x = float(lm[0, 0].double())
    exact = 0.5 * math.log(0.5 * (1 + math.exp(x)) / math.exp(x)) + 0.5 * math.log(0.5 * (1 + math.exp(x)))
    assert m["kl"][0] == pytest.approx(exact, rel=1e-6, abs=1e-15)


def test_the_recheck_reads_rounding_figures_against_the_rounding_they_measure():
    """Another CPU sums float32 GEMMs in another order: the exact path's distance from the oracle (itself
    rounding) comes out other in its leading digits and must still reproduce; a figure moved past that
    rounding, or a signal figure moved past the relative tolerance, must not. The pairs are the fixture
    audit's on two CPUs (AVX2 and AMX)."""
    from ddsim.measure.reproduce import figure_kind, tolerance
    tol = tolerance("float32")
    exact = "budgets[0].leak.exact"
    assert tol.close(1.327652156119586e-13, 2.0499129340210276e-13, f"{exact}.kl.order_exact.median")
    assert tol.close(4.143196509104499e-07, 5.5793586065417e-07, f"{exact}.by_depth[1].hidden_rel_last.max")
    assert tol.close(2.1588441292336374e-06, 2.2163416483222594e-06, f"{exact}.max_abs_logit.order_exact.mean")
    assert tol.close(2.632080416267664e-12, 2.9140855197112123e-12, "noise_floor.24.kl_max")
    assert tol.close(0.21243572235107422, 0.21243858337402344, "generations[4].divergence_margin")
    # past the rounding: an exact path that leaks reads 1e-3 and more (the policy's bounds: KL 1e-6, state 1e-4)
    assert not tol.close(2e-13, 1e-7, f"{exact}.kl.order_exact.max")
    assert not tol.close(2e-7, 2e-6, f"{exact}.state_rel.other.max")
    assert not tol.close(2e-6, 1e-3, f"{exact}.max_abs_logit.other.max")
    # a signal figure keeps the relative tolerance (4e-4), whatever its kind
    assert tol.close(0.5, 0.5001, "budgets[0].leak.leaky.state_rel.other.mean")
    assert not tol.close(0.5, 0.51, "budgets[0].leak.leaky.state_rel.other.mean")
    assert not tol.close(3.0, 3.01, "budgets[0].modes.leaky.tokens_per_step")
    assert not tol.close(1e-10, 3e-9, "chain.agreement")  # no floor but ABS_FLOOR for figures of no kind
    assert not tol.close(2, 3, f"{exact}.kl.order_exact.count") and not tol.close(True, False, "x.kl")
    assert not tol.close(float("nan"), 1e-13, f"{exact}.kl.other.max")
    # every float figure of a leak table has a kind but the flip rates (counts over nodes: compared relatively)
    d = json.loads(fixture_path("leak").read_text())

    def floats(x, where):
        if isinstance(x, dict):
            for k, v in x.items():
                yield from floats(v, f"{where}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                yield from floats(v, f"{where}[{i}]")
        elif isinstance(x, float):
            yield where
    leak = list(floats(d["budgets"][0]["leak"], "budgets[0].leak"))
    untyped = {w for w in leak if figure_kind(w) is None}
    assert leak and untyped and all("argmax_flip_rate" in w for w in untyped), sorted(untyped)[:5]
    assert figure_kind("budgets[0].leak.exact.by_layer[2].conv_rel.p90") == "rel"
    assert figure_kind("generations[0].noise_tv") == "tv" and figure_kind("budgets[0].modes.exact.agreement") is None
    assert figure_kind("noise_floor.24.kl_max") == "kl" and figure_kind("replay.noise_kl") == "kl"
    assert figure_kind("x.state_rel[0][1]") == "rel" and figure_kind("x.noise_kl[2]") == "kl"  # indices stripped
    assert tol.floors == pytest.approx({"logit": 2e-4, "kl": 2e-8, "rel": 8 * 2.0 ** -24, "tv": 1e-4}, rel=1e-12)
    bf16 = tolerance("bfloat16")
    assert bf16.floors == pytest.approx({"logit": 0.2, "kl": 0.02, "rel": 8 * 2.0 ** -8, "tv": 0.1}, rel=1e-12)
    assert tol.close(2, 2.0000001, "budgets[0].modes.exact.tokens_per_step")  # an int reproduced as a float
    assert not tol.close(float("inf"), 1.0, "x") and tol.close(float("inf"), float("inf"), "x")
    from ddsim.measure.reproduce import Tolerance
    edge = Tolerance(0.0, {"logit": 0.5, "kl": 0.25, "rel": 0.125, "tv": 1.0})
    assert edge.close(0.0, 0.25, "x.kl") and not edge.close(0.0, 0.375, "x.kl")  # the floor itself holds


def test_a_samples_leak_table_bounds_the_reports():
    """A sample of the prompts, re-run, cannot reproduce leak tables pooled over every prompt, but its own pool
    must fit inside them: no count, flipped node, maximum or row of its own beyond the report's (a part's mean,
    median and p90 may exceed the whole's). Each overstep is planted on the fixture's leaky table."""
    from ddsim.measure.reproduce import bounded, tolerance
    tol = tolerance("float32")
    d = json.loads(fixture_path("leak").read_text())
    want = d["budgets"][0]["leak"]["leaky"]
    where = "budgets[0].leak.leaky"
    assert want["argmax_flip_rate"]["other"] > 0 and len(want["by_depth"]) > 2  # the planted cases need both
    assert bounded(copy.deepcopy(want), want, tol, where) > 150  # every count, flip and max of the table
    part = copy.deepcopy(want)  # a part above the whole's mean, at its max: fits
    s = part["state_rel"]["other"]
    s["mean"] = s["median"] = s["p90"] = s["max"]
    part["by_depth"] = part["by_depth"][:2]  # fewer rows, fewer nodes and flips: fits
    part["nodes"] -= 5
    part["argmax_flip_rate"]["other"] /= 2
    k = part["kl"]["other"]
    k["max"] *= 1 + 3e-4  # a rounding apart (rtol 4e-4): fits
    bounded(part, want, tol, where)
    exact = d["budgets"][0]["leak"]["exact"]
    e = copy.deepcopy(exact)
    e["state_rel"]["other"]["max"] += 4e-7  # another CPU's rounding, under the 4.8e-7 floor: fits
    bounded(e, exact, tol, "budgets[0].leak.exact")

    def planted(edit_got=None, edit_want=None):
        got, w = copy.deepcopy(want), copy.deepcopy(want)
        (edit_got or (lambda x: None))(got)
        (edit_want or (lambda x: None))(w)
        with pytest.raises(InputError) as err:
            bounded(got, w, tol, where)
        return str(err.value)

    msg = planted(lambda g: g.update(nodes=g["nodes"] + 1))
    assert msg == (f"--report: does not reproduce: {where}.nodes is {want['nodes']} in the report, but the re-run "
                   f"prompts alone reach {want['nodes'] + 1} (the report's table is not the pool of its prompts)"), msg
    assert f"{where}.state_rel.other.max is" in planted(
        lambda g: g["state_rel"]["other"].update(max=g["state_rel"]["other"]["max"] * 1.01))
    assert f"{where}.kl.other.n is" in planted(lambda g: g["kl"]["other"].update(n=g["kl"]["other"]["n"] + 1))
    # the leak's flips forged away in the report (its rates 0) while the re-run prompts flip
    zero = lambda w: w["argmax_flip_rate"].update({"all": 0.0, "other": 0.0})  # noqa: E731
    assert f"{where}.argmax_flip_rate.other (flipped nodes) is 0 in the report" in planted(edit_want=zero)
    deepest = want["by_depth"][-1]["depth"]
    assert f"{where}.by_depth has no depth {deepest}, which the re-run prompts reach" in planted(
        edit_want=lambda w: w["by_depth"].pop())
    assert want["by_depth"][1]["argmax_flip_rate"] > 0
    assert f"{where}.by_depth[depth 1].argmax_flip_rate (flipped nodes) is 0 in the report" in planted(
        edit_want=lambda w: w["by_depth"][1].update(argmax_flip_rate=0.0))
    assert f"{where}.by_layer[layer 0].kind is 'g' in the report, 'x' on recheck" in planted(
        lambda g: g["by_layer"][0].update(kind="x"))
    assert want["by_layer"][3]["kind"] == "a" and want["by_layer"][3]["state_rel"] is None  # attention: no state
    assert f"{where}.by_layer[layer 3].state_rel is None in the report" in planted(
        lambda g: g["by_layer"][3].update(state_rel=want["kl"]["other"]))
    assert f"{where}.kl.other.max is" in planted(lambda g: g["kl"]["other"].update(max=float("nan")))
    assert "has other fields on recheck" in planted(lambda g: g.pop("margin_all"))
    assert f"{where}.margin_all is not a summary on recheck" in planted(lambda g: g.update(margin_all=None))


def test_bounded_counts_what_it_checks_and_names_the_whole_table_without_a_path():
    """The count of values checked, exactly, on a small table (a summary: its n and max; a flip count; a row's key
    and nodes), the messages with no path given, lists that are not, keyless rows, and a max of no kind held to
    ABS_FLOOR above the relative tolerance."""
    from ddsim.measure.reproduce import ABS_FLOOR, bounded, tolerance
    tol = tolerance("float32")
    s = {"n": 2, "mean": 0.5, "median": 0.5, "p90": 0.9, "max": 1.0}
    table = {"nodes": 4, "argmax_flip_rate": 0.5, "kl": s, "by_depth": [{"depth": 0, "nodes": 4}], "kind": "g"}
    assert bounded(copy.deepcopy(table), table, tol) == 1 + 1 + 2 + 2 + 1  # nodes, flips, kl (n, max), row, kind
    assert bounded({**table, "by_depth": []}, table, tol) == 5  # a sample that reaches no depth: nothing to bound
    assert bounded({"rows": []}, {"rows": []}, tol) == 0
    rates = {"nodes": 4, "order_exact_nodes": 1, "not_order_exact_nodes": 3,
             "argmax_flip_rate": {"order_exact": 0.0, "other": 1 / 3, "all": 0.25}}
    assert bounded(copy.deepcopy(rates), rates, tol) == 3 + 3  # three flip counts, three node counts
    edge = lambda floor: (1.0 + floor) / (1 - tol.rtol)  # noqa: E731  the largest max within tol of 1.0, floor above
    assert bounded({"x": {**s, "max": edge(ABS_FLOOR / 2)}}, {"x": s}, tol) == 2  # no kind: ABS_FLOOR
    for got, want, words in (
            ({"nodes": 5}, {"nodes": 4}, "nodes is 4 in the report, but the re-run prompts alone reach 5"),
            ({"nodes": 4}, {"nodes": 4, "kl": s}, "leak table has other fields on recheck"),
            ({"kind": 1}, {"kind": "g"}, "kind is 'g' in the report, 1 on recheck"),
            ({"rows": {"depth": 0}}, {"rows": [{"depth": 0}]}, "rows is not a list on recheck"),
            ({"rows": [{"depth": 1}]}, {"rows": []}, "rows has no depth 1, which the re-run prompts reach"),
            ({"rows": [{"x": 1}]}, {"rows": [{"x": 1}]}, "rows has rows without a depth, rank, layer or family"),
            ({"x": {**s, "max": None}}, {"x": s}, "x.max is 1.0 in the report, None on recheck"),
            ({"x": {**s, "max": edge(2 * ABS_FLOOR)}}, {"x": s}, "x.max is 1.0 in the report, but")):
        with pytest.raises(InputError) as e:
            bounded(got, want, tol)
        assert str(e.value).startswith(f"--report: does not reproduce: {words}"), str(e.value)


def test_the_recheck_compares_every_field_and_names_the_first_that_differs():
    from ddsim.measure.reproduce import compare, tolerance
    tol = tolerance("float32")
    want = {"a": [1, 2.0, {"kl": 1e-13}], "b": "x", "c": None}
    assert compare(copy.deepcopy(want), want, tol) == 5
    for got, words in (({"a": [1, 2.0, {"kl": 1e-13}], "b": "x"}, "report has other fields on recheck"),
                       ({**want, "a": [1, 2.0]}, "a has 2 entries on recheck, the report 3"),
                       ({**want, "a": 7}, "a has 7 entries on recheck, the report 3"),
                       ({**want, "a": [1, 2.0, {"kl": 1e-13, "x": 1}]}, "a[2] has other fields on recheck"),
                       ({**want, "a": [1, 2.0, [1e-13]]}, "a[2] has other fields on recheck"),
                       ({**want, "a": [2, 2.0, {"kl": 1e-13}]}, "a[0] is 1 in the report, 2 on recheck"),
                       ({**want, "a": [1, 2.01, {"kl": 1e-13}]}, "a[1] is 2.0 in the report, 2.01 on recheck"),
                       ({**want, "a": [1, 2.0, {"kl": 1e-6}]}, "a[2].kl is 1e-13 in the report, 1e-06 on recheck"),
                       ({**want, "b": "y"}, "b is 'x' in the report, 'y' on recheck"),
                       ({**want, "c": 0.0}, "c is None in the report, 0.0 on recheck")):
        with pytest.raises(InputError) as e:
            compare(got, want, tol)
        assert str(e.value) == f"--report: does not reproduce: {words}" + (
            " (the report was not produced by this audit)" if " is " in words else ""), str(e.value)
