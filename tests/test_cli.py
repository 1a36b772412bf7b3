"""The command line through subprocesses: audit, report determinism, gate exit codes, tree, and
bad input (one line, exit 2, no traceback, nothing half-written)."""
import copy
import json

import pytest

from reports import json_report
from tests.conftest import FAST_AUDIT, run_cli

DEFAULT_POLICY = "policies/hybrid-unsafe.toml"


def _one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_audit_writes_valid_report_and_html(audit_dir, report):
    assert json_report.validate(report) is None
    assert report["schema_version"] == 2
    # a CPU audit compares a float32 fast path with the float64 oracle
    assert report["precision"] == {"fast_path": "float32", "recurrent_state": "float32", "oracle": "float64"}
    assert (audit_dir / "report.html").read_text().startswith("<!doctype html>")
    assert not [p for p in audit_dir.iterdir() if p.name.startswith(".")]  # no temp files left
    # every prompt carries its token ids and the reference continuation beside each mode's output
    assert all(p["tokens"] and p["reference"] for p in report["prompts"])
    modes = {(g["budget"], g["mode"]) for g in report["generations"]}
    assert {(4, "exact"), (4, "leaky"), (8, "leaky-conv"), (None, "exact")} <= modes
    # exact verification is lossless in the audit, too
    for b in report["budgets"]:
        assert b["modes"]["exact"]["generations_leaving_greedy"] == 0
        assert b["modes"]["exact"]["silent_corruption_steps"] == 0
        assert b["leak"]["leaky"]["argmax_flip_rate"]["order_exact"] in (0.0, None)


def test_same_seed_same_report(tmp_path, report):
    r = run_cli("audit", *FAST_AUDIT, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    again = json.loads((tmp_path / "report.json").read_text())
    strip = lambda d: {k: v for k, v in d.items() if k != "generated_at"}  # noqa: E731
    assert strip(again) == strip(report)


def _without_leak(report):
    clean = copy.deepcopy(report)
    for b in clean["budgets"]:
        for m in ("leaky", "leaky-state", "leaky-conv"):
            b["modes"][m].update(generations_leaving_greedy=0, generations_leaving_greedy_above_noise=0,
                                 silent_corruption_steps=0, decision_flip_rate=0.0)
            b["leak"][m]["argmax_flip_rate"]["all"] = b["leak"]["exact"]["argmax_flip_rate"]["all"]
    return clean


def test_gate_passes_and_fails_on_the_numbers(tmp_path, report):
    clean = _without_leak(report)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(clean))
    r = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", good)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gate hybrid-unsafe (float32 fast path): all 7 rules hold" in r.stdout

    bad = copy.deepcopy(clean)
    bad["budgets"][-1]["modes"]["leaky"]["generations_leaving_greedy_above_noise"] = 2
    bad["budgets"][0]["modes"]["leaky"]["silent_corruption_steps"] = 3
    bad["budgets"][0]["modes"]["exact"]["generations_leaving_greedy_above_noise"] = 1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", path)
    assert r.returncode == 1
    assert "VIOLATED generations_leaving_greedy_above_noise: measured 2 > bound 0" in r.stdout
    assert "VIOLATED silent_corruption_steps: measured 3 > bound 0" in r.stdout
    assert "VIOLATED exact_generations_leaving_greedy_above_noise: measured 1 > bound 0" in r.stdout


@pytest.mark.parametrize("fast_path, holds", [("float32", False), ("bfloat16", True), ("float16", False)])
def test_gate_bounds_follow_the_fast_paths_precision(tmp_path, report, fast_path, holds):
    """A bfloat16 exact path 1e-2 from the oracle passes [rules.bfloat16]; the same figures under a
    float32 fast path, or a dtype with no table of its own (float32's bounds), do not."""
    d = _without_leak(report)
    d["precision"]["fast_path"] = fast_path
    for v in d["noise_floor"].values():
        v.update(state_rel_max=1e-2, kl_max=8e-3)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    r = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", p)
    assert r.returncode == (0 if holds else 1), r.stdout + r.stderr
    assert f"({fast_path} fast path)" in r.stdout
    if not holds:
        assert "VIOLATED exact_state_rel_max: measured 0.01 > bound 0.0001" in r.stdout
        assert "VIOLATED exact_kl_max: measured 0.008 > bound 1e-06" in r.stdout


def test_gate_on_the_default_audit_report_is_1_or_0_never_2(audit_dir):
    r = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", audit_dir / "report.json")
    assert r.returncode in (0, 1), r.stderr


def test_gate_runs_the_audit_itself(tmp_path):
    r = run_cli("gate", "--policy", DEFAULT_POLICY, *FAST_AUDIT, "--out", tmp_path / "rep")
    assert r.returncode in (0, 1), r.stderr
    assert (tmp_path / "rep" / "report.json").exists()


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(schema_version=99), "schema_version 99"),
    (lambda d: d.pop("budgets"), "does not match the report schema"),
    (lambda d: d["budgets"][0]["modes"].pop("leaky"), "does not match the report schema"),
    (lambda d: d.pop("precision"), "does not match the report schema"),
    (lambda d: d["precision"].update(fast_path="int8"), "does not match the report schema"),
])
def test_gate_rejects_foreign_reports(tmp_path, report, mutate, needle):
    d = copy.deepcopy(report)
    mutate(d)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", p), needle)


@pytest.mark.parametrize("policy_text, needle", [
    ("[rules\n", "malformed TOML"),
    ("[policy]\nmode = 'leaky'\n", "no [rules] table"),
    ("[rules]\nbogus_rule = 1\n", "unknown rule 'bogus_rule'"),
    ("[rules]\ndecision_flip_rate = -1\n", "needs a finite bound"),
    ("[policy]\nmode = 'exact'\n[rules]\ndecision_flip_rate = 0\n", "policy.mode 'exact'"),
    ("[rules]\ndecision_flip_rate = 0\n[rules.bf16]\nexact_kl_max = 1\n", "[rules.bf16] names no dtype"),
    ("[rules]\ndecision_flip_rate = 0\n[rules.bfloat16]\nexact_kl_max = -1\n", "in [rules.bfloat16] needs a finite"),
    ("[rules.bfloat16]\nexact_kl_max = 1\n", "[rules] has no bounds of its own"),
])
def test_gate_rejects_bad_policies(tmp_path, audit_dir, policy_text, needle):
    p = tmp_path / "policy.toml"
    p.write_text(policy_text)
    _one_line_error(run_cli("gate", "--policy", p, "--report", audit_dir / "report.json"), needle)


def test_gate_missing_and_malformed_files(tmp_path):
    _one_line_error(run_cli("gate", "--policy", tmp_path / "none.toml", "--report", "x.json"), "none.toml", "cannot read")
    bad = tmp_path / "r.json"
    bad.write_text("{oops")
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", bad), "r.json", "malformed JSON")
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", tmp_path / "nope.json"), "cannot read report")
    _one_line_error(run_cli("gate"), "--policy")


@pytest.mark.parametrize("args, needle", [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--budget", "0"], "--budget"),
    (["--budget", "4,x"], "--budget"),
    (["--steps", "0"], "--steps"),
    (["--device", "cuda:7"], "--device"),
    (["--device", "tpu"], "--device"),
    (["--model", "/nonexistent"], "--model /nonexistent: not a directory"),
    (["--temperature", "-1"], "--temperature"),
])
def test_audit_bad_options(tmp_path, args, needle):
    out = tmp_path / "out"
    _one_line_error(run_cli("audit", "--preset", "micro", "--steps", "1", *args, "--out", out), needle)
    assert not (out / "report.json").exists() and not (out / "report.html").exists()


def test_audit_bad_files(tmp_path):
    out = tmp_path / "out"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"tokens": [1, 2]}\n{"tokens": [1, 999]}\n')
    _one_line_error(run_cli("audit", *FAST_AUDIT, "--prompts", prompts, "--out", out), "p.jsonl:2", "outside the vocabulary")
    prompts.write_text('{"text": "hello"}\n')
    _one_line_error(run_cli("audit", *FAST_AUDIT, "--prompts", prompts, "--out", out), "p.jsonl:1", "tokenizer")
    _one_line_error(run_cli("audit", *FAST_AUDIT, "--prompts", tmp_path / "missing.jsonl", "--out", out), "missing.jsonl")
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"step": 0, "vocab_size": 48, "depths": [[[1, -0.5]]]}\n')
    _one_line_error(run_cli("audit", *FAST_AUDIT, "--trace", trace, "--out", out), "t.jsonl", "trace has 1 steps")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    _one_line_error(run_cli("audit", *FAST_AUDIT, "--out", a_file), "not a directory")
    assert not out.exists()


def test_audit_with_prompts_and_trace(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"tokens": [1, 2, 3]}\n')
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"step": s, "vocab_size": 48, "depths": [[[s % 48, -0.1], [7, -2.0]]] * 3}) + "\n"
                             for s in range(3)))
    r = run_cli("audit", *FAST_AUDIT, "--prompts", prompts, "--trace", trace, "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["config"]["drafter"]["kind"] == "trace" and len(rep["prompts"]) == 1


def test_tree_command(tmp_path):
    r = run_cli("tree", "--seed", "3", "--budget", "10")
    assert r.returncode == 0, r.stderr
    assert "#0" in r.stdout and "order-exact" in r.stdout and "11 nodes" in r.stdout
    r = run_cli("tree", "--seed", "3", "--budget", "10", "--format", "dot")
    assert r.returncode == 0 and r.stdout.startswith("digraph") and r.stdout.count("->") == 10
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"step": 0, "vocab_size": 20, "depths": [[[4, -0.1], [5, -3.0]], [[6, -0.2], [1, -2.0]]]}\n')
    r = run_cli("tree", "--trace", trace, "--vocab", "20", "--budget", "6", "--format", "dot")
    assert r.returncode == 0, r.stderr
    assert 'tok 4' in r.stdout and r.stdout.count("->") == 6
    _one_line_error(run_cli("tree", "--trace", trace, "--vocab", "20", "--step", "4"), "trace has 1 steps")
    _one_line_error(run_cli("tree", "--budget", "-2"), "budget")
    _one_line_error(run_cli("tree", "--format", "svg"), "--format")
