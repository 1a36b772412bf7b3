"""The audit at temperature > 0 with an engine's acceptance rule (--sampler): each step's law under the rule,
the mode's against exact's, recorded per step and summarised; the gate's sampled rules judge it, and the rules
that compare with the seeded reference are said not to apply to a rule not coupled to it."""
from __future__ import annotations

import json

import pytest

from tests.cli_runs import one_line_error, run_cli

STDLIB = ["--model", "stdlib", "--drafter-model", "stdlib", "--prompts", "stdlib", "--budget", "16", "--steps", "3",
          "--temperature", "0.8"]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    out = tmp_path_factory.mktemp("sampled")
    r = run_cli("audit", *STDLIB, "--sampler", "sglang", "--out", out)
    assert r.returncode == 0, r.stderr
    return out, json.loads((out / "report.json").read_text())


def test_the_leak_moves_the_output_distribution_and_exact_does_not(sampled):
    _, rep = sampled
    assert rep["config"]["sampler"] == "sglang" and rep["config"]["temperature"] == 0.8
    modes = rep["budgets"][0]["modes"]
    assert modes["exact"]["emitted_tv_max"] == 0 and modes["exact"]["accepted_length_tv_max"] == 0
    assert modes["leaky"]["emitted_tv_max"] > 0.05  # the trained hybrid's leak moves what a step emits
    assert modes["leaky"]["emitted_tv_mean"] <= modes["leaky"]["emitted_tv_max"]
    # the exact path's own distance from the oracle, in the generation measured against it: float32 rounding
    assert modes["leaky"]["noise_tv_max"] < 1e-5 and modes["exact"]["noise_tv_max"] is None
    for g in rep["generations"]:
        assert len(g["emitted_tv"]) == len(g["accepted"]) == 3


def test_the_gate_judges_a_sampled_report_by_its_sampled_rules(sampled):
    out, _ = sampled
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json", "--no-recheck")
    assert g.returncode == 1
    violated = {l.split(":")[0].removeprefix("VIOLATED ") for l in g.stdout.splitlines() if l.startswith("VIOLATED")}
    assert {"sampled_emitted_tv_above_noise", "silent_corruption_steps"} <= violated
    assert "not applicable: exact_generations_leaving_greedy_above_noise: the sglang sampler is not coupled" in g.stdout


def test_a_policy_without_sampled_rules_cannot_judge_a_sampled_report(sampled, tmp_path):
    out, _ = sampled
    from ddsim.verdict.gate import BUILTIN_POLICIES
    text = (BUILTIN_POLICIES / "hybrid-unsafe.toml").read_text()
    text = "\n".join(l for l in text.splitlines() if not l.startswith("sampled_"))
    (tmp_path / "p.toml").write_text(text)
    one_line_error(run_cli("gate", "--policy", tmp_path / "p.toml", "--report", out / "report.json", "--no-recheck"),
                   "the policy bounds none of sampled_emitted_tv_above_noise")


def test_the_recheck_reproduces_a_sampled_report(sampled):
    out, _ = sampled
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json")
    assert "figures reproduce the report or hold inside its leak tables" in g.stdout and g.returncode == 1


@pytest.mark.parametrize("args, needle", [
    (["--sampler", "sglang"], "--sampler sglang: a sampler decides at temperature > 0 only"),
    # it once named the gumbel sampler, which temperature 0 does not run either
    (["--sampler-param", "threshold_single=0.5"], "--sampler-param threshold_single: a sampler decides at temperature "
                                                  "> 0 only"),
    (["--temperature", "1", "--sampler", "eagle", "--sampler-param", "threshold_acc=0.5"],
     "--sampler-param threshold_acc: not a parameter of the eagle sampler"),
    (["--temperature", "1", "--sampler", "sglang", "--sampler-param", "threshold_acc=2"],
     "--sampler-param threshold_acc=2: expected a value in (0, 1]"),
])
def test_sampler_bad_input(tmp_path, args, needle):
    one_line_error(run_cli("audit", "--preset", "micro", "--steps", "1", *args, "--out", tmp_path / "o"), needle)
    assert not (tmp_path / "o").exists()
