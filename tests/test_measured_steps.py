"""Measured decoding steps (ddsim.measure.step_timing): on CUDA by default, on any device with --measure-steps on.
The rows cover the autoregressive step, the chain and every budget and mode at the audit's tokens per step; the
timings are the machine's, so they stay out of what two runs of one seed must share."""
import json

import pytest

from ddsim.reports import json_report
from tests.cli_runs import run_cli

AUDIT = ["--preset", "micro", "--budget", "4,8", "--steps", "2", "--measure-steps", "on", "--device", "cpu"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("measured")
    r = run_cli("audit", *AUDIT, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


def test_every_mode_step_is_measured_at_the_audits_tokens_per_step(measured):
    rep = json.loads((measured / "report.json").read_text())
    ms = rep["measured_steps"]
    assert ms["device"] == "cpu" and ms["repeats"] == 20
    keys = {(r["label"], r["mode"]) for r in ms["rows"]}
    assert keys == {("autoregressive", "exact"), ("chain", "exact")} | {
        (f"ddtree-{b}", m) for b in (4, 8) for m in ("exact", "leaky", "leaky-state", "leaky-conv")}
    by = {(r["label"], r["mode"]): r for r in ms["rows"]}
    assert by[("ddtree-8", "leaky")]["tokens_per_step"] == rep["budgets"][1]["modes"]["leaky"]["tokens_per_step"]
    assert by[("autoregressive", "exact")]["speedup_vs_ar"] == pytest.approx(1.0)
    for r in ms["rows"]:
        assert r["step_ms"] == pytest.approx(r["verify_ms"] + r["commit_ms"])
    html = (measured / "report.html").read_text()
    assert "Measured decoding steps (cpu)" in html


def test_timings_are_not_what_two_runs_share(measured, tmp_path):
    r = run_cli("audit", *AUDIT, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    a, b = json_report.load(measured / "report.json"), json_report.load(tmp_path / "report.json")
    assert json_report.comparable(a) == json_report.comparable(b)


def test_a_measured_row_that_does_not_add_up_is_refused(measured, tmp_path):
    doc = json.loads((measured / "report.json").read_text())
    doc["measured_steps"]["rows"][3]["tokens_per_s"] *= 2
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match="tokens_per_s is not tokens_per_step / step_ms"):
        json_report.load(tmp_path / "r.json")
    doc = json.loads((measured / "report.json").read_text())
    doc["measured_steps"]["rows"].pop()
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match="every budget and mode once"):
        json_report.load(tmp_path / "r.json")


def test_a_cpu_audit_measures_nothing_by_default():
    from tests.report_fixtures import path
    assert json.loads(path("leak").read_text())["measured_steps"] is None


def test_steps_are_timed_as_a_server_runs_them_without_the_audits_nan_fills(monkeypatch):
    """The audit runs NaN-poisoned (an unwritten output cannot pass), and its CUDA graphs carry those fills; the
    timed steps run with them off, on a serving model of their own (on the CPU the model itself), and the setting
    is the caller's again after."""
    import ddsim.gpu_backend as gb
    from ddsim.measure import step_timing
    from ddsim.measure.audit import run_audit
    from ddsim.measure.settings import AuditConfig
    seen, real = [], step_timing._time_step

    def spy(serving, state, tree, mode, clock, *, warmup, repeats):
        seen.append(gb.poisoning())
        return real(serving, state, tree, mode, clock, warmup=0, repeats=1)
    monkeypatch.setattr(step_timing, "_time_step", spy)
    before = gb.poisoning()
    rep = run_audit(AuditConfig(preset="micro", budgets=[4], steps=1, n_prompts=1, measure_steps="on"))
    assert rep.measured_steps is not None and len(rep.measured_steps.rows) == 2 + 4
    assert seen == [False] * 6
    assert gb.poisoning() == before
