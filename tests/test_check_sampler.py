"""check-sampler: every lossless reference holds, every planted lossy rule is caught, the statistical test's
false-alarm rate and power are what ddsim.sampling.stats says, and the exact step law (ddsim.sampling.law)
is both autoregressive sampling's and what the rules do."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ddsim.sampling import sglang_convention as sg
from ddsim.sampling.cases import child_id, explicit_cases, fixed_tree, offsets, tables
from ddsim.sampling.law import first_token, length_tv, step_law, total_variation
from ddsim.sampling.rules import RULES, children_table, draw_randoms
from ddsim.sampling.stats import detectable_tv, l1_test
from tests.cli_runs import one_line_error, run_cli

QUICK = ["--draws", "30000", "--max-examples", "2"]


@pytest.mark.parametrize("impl", ["sglang", "eagle", "ddtree", "gumbel", "specinfer", "rrs",
                                  "ddsim.sampling.sglang_convention:tree_speculative_sampling_target_only"])
def test_every_lossless_reference_holds(tmp_path, impl):
    extra = ["--convention", "sglang"] if ":" in impl else []
    r = run_cli("check-sampler", "--impl", impl, *extra, *QUICK, "--out", tmp_path / "s.json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["lossless"] and len(doc["cases"]) == 11 and all(c["holds"] for c in doc["cases"])
    assert "no evidence of loss: 11 cases x 30000 draws hold" in r.stdout
    assert doc["environment"]["torch"] == torch.__version__ and doc["environment"]["device"] == "cpu"
    if ":" in impl:  # a rule of one's own: bound by its file and the files of its package its module reaches
        sampler = doc["sampler"]
        assert sampler["sources"]["ddsim/sampling/sglang_convention.py"] == sampler["source_sha256"], sampler


@pytest.mark.parametrize("impl, extra", [
    ("typical", []),
    ("sglang", ["--param", "threshold_single=0.5"]),
    ("sglang", ["--param", "threshold_acc=0.5"]),
    ("specinfer", ["--drafting", "fixed"]),  # a rule for sampled drafts on a top-k tree
    ("tests.planted_samplers:resample_from_target", ["--convention", "ddsim"]),
    ("tests.planted_samplers:no_renormalise", ["--convention", "ddsim"]),
    ("tests.planted_samplers:coins_reused", ["--convention", "ddsim"]),
    ("tests.planted_samplers:residual_without_draft_update", ["--convention", "ddsim"]),
    ("ddsim.sampling.sglang_convention:tree_speculative_sampling_target_only",
     ["--convention", "sglang", "--param", "threshold_acc=0.9"]),
])
def test_every_planted_lossy_rule_is_caught(tmp_path, impl, extra):
    r = run_cli("check-sampler", "--impl", impl, *extra, *QUICK, "--out", tmp_path / "s.json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "LOSSY:" in r.stdout and "worst case:" in r.stdout
    doc = json.loads((tmp_path / "s.json").read_text())
    assert not doc["lossless"]
    if ":" in impl:  # in either convention, the rule's own file among the files it is bound by
        own = impl.partition(":")[0].replace(".", "/") + ".py"
        assert doc["sampler"]["sources"][own] == doc["sampler"]["source_sha256"], doc["sampler"]


def _fixed(case):
    tt, dt = tables(case)
    par, tok = fixed_tree(case, dt)
    _, depth = children_table(par)
    off = offsets(case.vocab, max(case.depth, 1))
    ids = [0]
    for i in range(1, len(par)):
        ids.append(child_id(ids[par[i]], tok[i], V=case.vocab, off=off, length=int(depth[par[i]])))
    return par, tok, tt[torch.tensor(ids)]


def test_sglangs_convention_computes_ddsims_sglang_rule_draw_for_draw():
    """The rule written out in SGLang's tensor convention and ddsim's own, independently, agree on the same
    random numbers, thresholds included."""
    g = torch.Generator().manual_seed(0)
    for case in explicit_cases():
        par, tok, probs = _fixed(case)
        R, T = 3000, len(par)
        target = probs.float().double().expand(R, T, case.vocab)
        rnd = {k: v.float().double() for k, v in draw_randoms({"coins": "node", "final": "draw"}, R=R, T=T, D=0,
                                                               V=case.vocab, generator=g).items()}
        tokens = torch.tensor(tok).expand(R, T).contiguous()
        for kw in ({}, {"threshold_single": 0.4, "threshold_acc": 0.8}):
            a = RULES["sglang"].fn(parents=torch.tensor(par), tokens=tokens, target=target, randoms=rnd, **kw)
            b = sg.adapter(sg.tree_speculative_sampling_target_only, **kw)(parents=torch.tensor(par), tokens=tokens,
                                                                           target=target, randoms=rnd)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), case.label


def _ar_mass(par, tok, P):
    """The autoregressive probability of each (path end u, bonus b): the product of the target along the
    path times p_u(b), zero where b is one of u's children (that sequence continues through the child)."""
    T, V = P.shape
    kids = [[c for c in range(T) if par[c] == u] for u in range(T)]
    reach = [1.0] * T
    for c in range(1, T):
        reach[c] = reach[par[c]] * float(P[par[c], tok[c]])
    m = torch.zeros(T, V, dtype=torch.float64)
    for u in range(T):
        for b in range(V):
            if b not in [tok[c] for c in kids[u]]:
                m[u, b] = reach[u] * float(P[u, b])
    return m


@pytest.mark.parametrize("rule", ["sglang", "eagle", "ddtree", "gumbel"])
def test_the_lossless_law_is_autoregressive_sampling_and_what_each_rule_does(rule):
    """Closed form: the step law of a lossless target-only rule is the autoregressive probability of every
    emitted sequence (enumerated on each explicit tree); Monte Carlo: the rule itself emits that law (L1 within
    the test's bound at alpha 1e-6)."""
    g = torch.Generator().manual_seed(1)
    for case in explicit_cases()[:5]:
        par, tok, P = _fixed(case)
        law = step_law(rule, parents=par, tokens=tok, probs=P)
        assert torch.allclose(law.mass(), _ar_mass(par, tok, P), atol=1e-12)
        assert abs(float(law.mass().sum()) - 1) < 1e-12
        assert torch.allclose(first_token(law, par, tok), P[0], atol=1e-12)
        R, T, V = 60000, len(par), case.vocab
        _, depth = children_table(par)
        rnd = draw_randoms(RULES[rule].randoms, R=R, T=T, D=int(depth.max()), V=V, generator=g)
        path, bonus = RULES[rule].fn(parents=torch.tensor(par), tokens=torch.tensor(tok).expand(R, T),
                                     target=P.expand(R, T, V), randoms=rnd)
        end = path.gather(1, ((path >= 0).sum(1) - 1)[:, None])[:, 0]
        counts = torch.bincount(end * V + bonus, minlength=T * V)
        assert l1_test(counts, law.mass().reshape(-1), 1e-6)["holds"], case.label


def test_the_law_under_sglangs_thresholds_and_typical_acceptance_is_what_they_do():
    """The lossy laws are exact too: the audit's distribution shift for a lossy rule matches its Monte Carlo."""
    g = torch.Generator().manual_seed(2)
    for rule, kw in (("sglang", {"threshold_single": 0.3, "threshold_acc": 0.7}), ("typical", {})):
        for case in explicit_cases()[:5]:
            par, tok, P = _fixed(case)
            law = step_law(rule, parents=par, tokens=tok, probs=P, **kw)
            R, T, V = 60000, len(par), case.vocab
            rnd = draw_randoms(RULES[rule].randoms, R=R, T=T, D=0, V=V, generator=g)
            path, bonus = RULES[rule].fn(parents=torch.tensor(par), tokens=torch.tensor(tok).expand(R, T),
                                         target=P.expand(R, T, V), randoms=rnd, **kw)
            end = path.gather(1, ((path >= 0).sum(1) - 1)[:, None])[:, 0]
            counts = torch.bincount(end * V + bonus, minlength=T * V)
            assert l1_test(counts, law.mass().reshape(-1), 1e-6)["holds"], (rule, case.label)


def test_a_leak_moves_the_law_and_the_distance_is_zero_without_one():
    case = explicit_cases()[3]
    par, tok, P = _fixed(case)
    exact = step_law("sglang", parents=par, tokens=tok, probs=P)
    assert total_variation(exact, exact) == 0 and length_tv(exact, exact) == 0
    Q = P.clone()
    Q[1:] = torch.softmax(P[1:].log() + torch.randn(P[1:].shape, generator=torch.Generator().manual_seed(0)), -1)
    leaky = step_law("sglang", parents=par, tokens=tok, probs=Q)
    assert total_variation(leaky, exact) > 0.01 and length_tv(leaky, exact) > 0
    assert torch.allclose(first_token(leaky, par, tok), first_token(exact, par, tok))  # the root is exact


def test_the_statistical_test_keeps_its_false_alarm_rate_and_power():
    """Measured on exact multinomial draws: at alpha = 0.01 no more than 1% of 2000 tests on the true
    distribution fail (the bound is conservative: none do), and a distribution at the power statement's total
    variation is flagged in at least 99% of 400 tests."""
    rng = np.random.default_rng(0)
    V, n, alpha = 16, 20000, 0.01
    p = rng.dirichlet(np.ones(V))
    false = sum(not l1_test(torch.from_numpy(rng.multinomial(n, p)), torch.from_numpy(p), alpha)["holds"]
                for _ in range(2000))
    assert false <= 20
    tv = detectable_tv(V, n, alpha)
    q = p.copy()  # move tv of mass from the largest cell to the smallest
    big, small = int(np.argmax(p)), int(np.argmin(p))
    q[big] -= tv
    q[small] += tv
    assert q.min() >= 0
    caught = sum(not l1_test(torch.from_numpy(rng.multinomial(n, q)), torch.from_numpy(p), alpha)["holds"]
                 for _ in range(400))
    assert caught >= 396


@pytest.mark.parametrize("args, needle", [
    (["--impl", "greedy"], "--impl greedy: greedy is temperature 0's rule"),
    (["--impl", "nope"], "--impl nope: expected one of"),
    (["--impl", "sglang", "--param", "threshold=1"], "--param threshold: --impl sglang takes threshold_acc, "
                                                     "threshold_single"),
    (["--impl", "sglang", "--param", "threshold_acc"], "--param threshold_acc: expected NAME=NUMBER"),
    (["--impl", "tests.planted_samplers:coins_reused"], "--convention: MODULE:FUNCTION needs one of ddsim, sglang"),
    (["--impl", "tests.planted_samplers:nothing", "--convention", "ddsim"], "has no 'nothing'"),
    (["--impl", "sgl-kernel"], "--impl sgl-kernel: cannot import sgl_kernel"),
    (["--impl", "sglang", "--draws", "10"], "--draws: expected 1000 to 1e8 draws per case, got 10"),
    (["--impl", "sglang", "--alpha", "0"], "--alpha: expected a false-alarm rate in (0, 0.5], got 0.0"),
    # no verdict on the explicit cases alone (0 once ran them and said "no evidence of loss"), no negative seed
    (["--impl", "sglang", "--max-examples", "0"], "--max-examples: expected >= 1, got 0"),
    (["--impl", "sglang", "--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
])
def test_check_sampler_bad_input(tmp_path, args, needle):
    one_line_error(run_cli("check-sampler", *args, "--out", tmp_path / "s.json"), needle)
    assert not (tmp_path / "s.json").exists()


def _enumerate(rule: str, par, tok, P, breakpoints: dict) -> torch.Tensor:
    """The exact law of ``rule`` on a star tree by enumeration: its decisions are comparisons of each random
    number with fixed breakpoints, so evaluating it once per cell of the breakpoints' grid (at the cell's
    midpoint, weighted by the cell's volume) enumerates every outcome with its probability. The grid also cuts
    each axis in 16 equal cells: a rule whose breakpoints are not the given ones (a wrong rule) then lands off
    the exact law by a cell's share."""
    names = sorted(breakpoints)
    cells = []
    for n in names:
        edges = torch.tensor(sorted({*[i / 16 for i in range(17)], *[float(b) for b in breakpoints[n] if 0 < b < 1]}),
                             dtype=torch.float64)
        cells.append(((edges[:-1] + edges[1:]) / 2, edges[1:] - edges[:-1]))
    mids = torch.cartesian_prod(*[c[0] for c in cells]).reshape(-1, len(names))
    vol = torch.cartesian_prod(*[c[1] for c in cells]).reshape(-1, len(names)).prod(1)
    R, T, V = len(mids), len(par), P.shape[1]
    randoms = {}
    for j, n in enumerate(names):
        kind, _, node = n.partition(":")
        if kind == "final":
            randoms["final"] = mids[:, j]
        else:
            randoms.setdefault("coins", torch.full((R, T), 0.5, dtype=torch.float64))[:, int(node)] = mids[:, j]
    path, bonus = RULES[rule].fn(parents=torch.tensor(par), tokens=torch.tensor(tok).expand(R, T),
                                 target=P.expand(R, T, V), randoms=randoms)
    end = path.gather(1, ((path >= 0).sum(1) - 1)[:, None])[:, 0]
    return torch.zeros(T * V, dtype=torch.float64).index_add_(0, end * V + bonus, vol).reshape(T, V)


@pytest.mark.parametrize("rule", ["sglang", "eagle", "ddtree"])
def test_each_reference_on_a_star_enumerated_exactly_is_autoregressive_sampling(rule):
    """On stars of 1 to 3 children the rule's outcomes, enumerated exactly over its random numbers, have the
    autoregressive law (the closed form), to rounding."""
    g = torch.Generator().manual_seed(3)
    for K in (1, 2, 3):
        V = 6
        par, tok = [-1] + [0] * K, [0] + list(range(1, K + 1))
        # flat-Dirichlet rows from the test's own generator (normalised exponentials): the same P whatever ran before
        E = -torch.rand(K + 1, V, generator=g, dtype=torch.float64).log()
        P = E / E.sum(1, keepdim=True)
        p0 = P[0]
        kids = torch.tensor(tok[1:])
        rest = p0.clone()
        rest[kids] = 0
        final = (rest / rest.sum()).cumsum(0).tolist()
        if rule == "sglang":
            bp = {"coin:0": p0[kids].cumsum(0).tolist(), "final": final}
        elif rule == "eagle":
            # the renormalised threshold, and the raw one a rule that forgets to renormalise compares with: the
            # enumeration is then exact for that wrong rule too, and tells it apart whatever P is drawn
            bp = {f"coin:{k + 1}": [float(p0[tok[k + 1]] / (1 - p0[kids[:k]].sum())), float(p0[tok[k + 1]])]
                  for k in range(K)}
            bp["final"] = final
        else:
            bp = {"coin:0": p0.cumsum(0).tolist()}
        # a leaf's bonus is drawn with the same coin or final number: its breakpoints join the grid
        for c in range(1, K + 1):
            key = "final" if rule in ("sglang", "eagle") else f"coin:{c}"
            bp.setdefault(key, [])
            bp[key] = list(bp[key]) + P[c].cumsum(0).tolist()
        law = _enumerate(rule, par, tok, P, bp)
        assert torch.allclose(law, _ar_mass(par, tok, P), atol=1e-12), (rule, K)


def test_the_enumeration_catches_a_rule_off_by_one_threshold_or_one_renormalisation(monkeypatch):
    import dataclasses
    import functools

    from ddsim.sampling import rules
    from tests import planted_samplers
    for name, fn in (("sglang", functools.partial(rules.sglang_target_only, threshold_acc=0.8)),
                     ("eagle", planted_samplers.no_renormalise), ("eagle", planted_samplers.coins_reused)):
        monkeypatch.setitem(rules.RULES, name, dataclasses.replace(rules.RULES[name], fn=fn))
        with pytest.raises(AssertionError):
            test_each_reference_on_a_star_enumerated_exactly_is_autoregressive_sampling(name)
