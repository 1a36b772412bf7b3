"""The command line through subprocesses: audit, report determinism, gate exit codes, tree, and
bad input (one line, exit 2, no traceback, nothing half-written)."""
import json

import pytest

from ddsim.reports import json_report
from tests import report_fixtures
from tests.cli_runs import FAST_AUDIT, run_cli
from tests.cli_runs import one_line_error as _one_line_error

DEFAULT_POLICY = "hybrid-unsafe"  # the built-in policy, ddsim/verdict/policies/hybrid-unsafe.toml


def test_audit_writes_valid_report_and_html(audit_dir, report):
    typed = json_report.load(audit_dir / "report.json")  # validates fully, consistency included
    assert typed.schema_version == 12 and report["schema_version"] == 12
    import triton
    assert typed.environment.triton == triton.__version__  # the Triton the kernels compile and interpret under
    assert typed.precision.oracle_products == "converted"
    # a CPU audit compares a float32 fast path with the float64 oracle
    assert report["precision"] == {"fast_path": "float32", "recurrent_state": "float32", "oracle": "float64",
                                   "oracle_products": "converted"}
    assert typed.provenance.source == "preset micro" and typed.provenance.fast_path == "ddsim-torch"
    assert len(typed.provenance.weights_sha256) == 64 and typed.provenance.inputs_sha256 == {}
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
        assert b["leak"]["leaky"]["argmax_flip_rate"]["order_exact"] == 0.0


def test_same_seed_same_report(tmp_path, report):
    r = run_cli("audit", *FAST_AUDIT, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    again = json.loads((tmp_path / "report.json").read_text())
    assert _seeded(again) == _seeded(report)


def _seeded(report: dict) -> dict:
    """A report without what a second run of its seed may change (docs/cli.md): its time stamp, and the timings of
    its measured steps (taken on a GPU; null on the CPU), whose rows and settings stay."""
    d = {k: v for k, v in report.items() if k != "generated_at"}
    if d.get("measured_steps"):
        timing = ("verify_ms", "commit_ms", "step_ms", "tokens_per_s", "speedup_vs_ar")
        d["measured_steps"] = {**d["measured_steps"], "rows": [{k: v for k, v in r.items() if k not in timing}
                                                             for r in d["measured_steps"]["rows"]]}
    return d


def test_fixture_reports_are_what_the_audit_produces():
    """The committed planted-leak / no-leak reports the fast gate tests read are this code's output, as a
    whole recheck on this machine would find them: tokens, decisions and counts exactly, floats within
    the recheck's tolerance (the fixtures were written on another CPU, whose float32 sums round otherwise)."""
    from ddsim.measure.reproduce import compare, tolerance
    for kind in report_fixtures.KINDS:
        fresh = json_report.comparable(report_fixtures.make(kind))
        committed = json_report.comparable(json_report.load(report_fixtures.path(kind)))
        compare(fresh, committed, tolerance(committed["precision"]["fast_path"]), kind)  # InputError where not


def test_gate_verdict_on_the_fast_audit_is_exact(audit_dir):
    """The deterministic FAST_AUDIT: budgets 4 and 8 under a depth-8 drafter build chains only, so no
    node is outside order-exact positions and every leak rule reads 0 -- the vacuous pass the gate
    must refuse. The verdict and every line are asserted."""
    import hashlib

    from ddsim.verdict.gate import BUILTIN_POLICIES
    sha = hashlib.sha256((BUILTIN_POLICIES / "hybrid-unsafe.toml").read_bytes()).hexdigest()
    r = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", audit_dir / "report.json", "--recheck-prompts", "9")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("recheck: the whole audit re-run; ") and lines[0].endswith(" figures reproduce the report")
    assert lines[1:] == [
        f"policy hybrid-unsafe: built-in hybrid-unsafe, sha256 {sha[:16]}",
        "VIOLATED leak_nodes_per_budget: measured 0 < bound 100 (verified nodes that were not order-exact, fewest "
        "over budgets; mode leaky)",
        "the audit never exercised the leak: some budget verified no node outside order-exact positions (raise "
        "--budget or --topk-cap), so it cannot approve hybrid-unsafe verification",
        "gate hybrid-unsafe (float32 fast path, preset micro): 1 of 9 rules violated; keep hybrid-unsafe verification off"]


def test_gate_runs_the_audit_itself_and_checks_what_it_wrote(tmp_path, audit_dir):
    r = run_cli("gate", "--policy", DEFAULT_POLICY, *FAST_AUDIT, "--out", tmp_path / "rep")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "VIOLATED leak_nodes_per_budget: measured 0 < bound 100" in r.stdout
    written = json.loads((tmp_path / "rep" / "report.json").read_text())
    before = json.loads((audit_dir / "report.json").read_text())
    assert {k: v for k, v in written.items() if k != "generated_at"} == {k: v for k, v in before.items() if k != "generated_at"}


def test_gate_on_an_audit_that_never_exercised_the_leak(tmp_path):
    """--topk-cap 1 builds chains: every node is order-exact, nothing can leak, and the gate must
    not read the clean numbers as approval."""
    r = run_cli("gate", "--policy", DEFAULT_POLICY, "--preset", "micro", "--budget", "8", "--steps", "2",
                "--topk-cap", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "VIOLATED leak_nodes_per_budget: measured 0 < bound 100" in r.stdout
    assert "the audit never exercised the leak" in r.stdout
    assert [l for l in r.stdout.splitlines() if l.startswith("VIOLATED")] == [
        l for l in r.stdout.splitlines() if l.startswith("VIOLATED leak_nodes")]


def test_gate_report_must_match_the_audit_options_given(tmp_path):
    leak = report_fixtures.path("leak")
    settings = report_fixtures.SETTINGS
    ok = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", leak, "--preset", "micro", "--budget", "24,32",
                 "--steps", settings["steps"], "--seed", settings["seed"], "--temperature", "0", "--device", "cpu")
    assert ok.returncode == 1, ok.stdout + ok.stderr  # matches: the verdict is the report's
    for args, needle in [(["--preset", "tiny"], "--preset tiny: the report does not match (it records preset micro)"),
                         (["--budget", "16,64"], "--budget [16, 64]: the report does not match (it records [24, 32])"),
                         (["--steps", "8"], "--steps 8: the report does not match (it records 4)"),
                         (["--seed", "0"], "--seed 0: the report does not match"),
                         (["--temperature", "0.5"], "--temperature 0.5: the report does not match"),
                         (["--topk-cap", "4"], "--topk-cap 4: the report does not match (it records None)"),
                         (["--device", "cuda"], "--device cuda: the report does not match"),
                         (["--out", tmp_path / "o"], "--out: only with an audit the gate runs itself")]:
        _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", leak, *args), needle)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"tokens": [1, 2]}\n')
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", leak, "--prompts", prompts),
                    "--prompts", "the report does not match")


def test_gate_refuses_a_tampered_report_in_one_line(tmp_path):
    d = json.loads(report_fixtures.path("leak").read_text())
    d["budgets"][0]["modes"]["leaky"]["silent_corruption_steps"] = None
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", p),
                    "r.json: invalid report at budgets.0.modes.leaky.silent_corruption_steps")
    d = json.loads(report_fixtures.path("leak").read_text())
    d["config"]["budgets"] = [24, 32, 48]
    p.write_text(json.dumps(d))
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", p), "config.budgets is [24, 32, 48]")


@pytest.mark.parametrize("policy_text, needle", [
    ("[rules\n", "malformed TOML"),
    ("[policy]\nmode = 'leaky'\n", "no [rules] table"),
    ("[rules]\nbogus_rule = 1\n", "unknown key 'bogus_rule' in [rules]"),
    ("[policy]\nmdoe = 'leaky-conv'\n[rules]\ndecision_flip_rate = 0\n", "unknown key 'mdoe' in [policy]"),
    ("[policy]\nname = 3\n[rules]\ndecision_flip_rate = 0\n", "policy.name must be a string"),
    ("[rules]\ndecision_flip_rate = 0\n[require]\nleak_nodes = 5\n", "unknown key 'leak_nodes' in [require]"),
    ("[rules]\ndecision_flip_rate = 0\n[require]\nleak_nodes_per_budget = -5\n", "needs a finite bound"),
    ("[rules]\ndecision_flip_rate = nan\n", "needs a finite bound"),
    ("[rules]\ndecision_flip_rate = inf\n", "needs a finite bound"),
    ("[rules]\ndecision_flip_rate = true\n", "needs a finite bound"),
    ("[rule]\ndecision_flip_rate = 0\n", "unknown table [rule]"),
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


def test_gate_options_of_a_reports_recheck_are_refused_where_they_would_be_ignored():
    """--no-recheck, --accept-other-version and --recheck-prompts act on a report the gate reads: without --report (the
    gate runs the audit itself) each is refused, and so is a recheck's size with no recheck."""
    for opt in (["--no-recheck"], ["--accept-other-version"], ["--recheck-prompts", "3"]):
        _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, *FAST_AUDIT, *opt),
                        "--accept-other-version, --no-recheck, --recheck-prompts: only with --report")
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", "r.json", "--no-recheck",
                            "--recheck-prompts", "3"), "--recheck-prompts: not with --no-recheck")
    for where in (["--report", "r.json", "--no-recheck"], FAST_AUDIT):  # and a replay's dtype with no replay
        _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, *where, "--engine-dtype", "bfloat16"),
                        "--engine-dtype: only with --dump")


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
    (["--budget", "16,,32"], "--budget: expected comma-separated integers, got '16,,32'"),  # (the empty entry was
    (["--budget", "16,32,"], "--budget: expected comma-separated integers, got '16,32,'"),  # skipped, the audit ran)
    (["--steps", "0"], "--steps"),
    (["--device", "cuda:7"], "--device"),
    (["--device", "tpu"], "--device"),
    (["--model", "/nonexistent"], "--model /nonexistent: not a directory"),
    (["--temperature", "-1"], "--temperature: Input should be greater than or equal to 0"),
    (["--temperature", "nan"], "--temperature: expected a finite number, got nan"),
    (["--temperature", "inf"], "--temperature: expected a finite number, got inf"),
    (["--budget", "5000"], "--budget: Input should be less than or equal to 1024"),
    (["--budget", "8,8"], "--budget: budgets repeat"),
    (["--steps", "100000"], "--steps: Input should be less than or equal to 4096"),
    (["--topk-cap", "0"], "--topk-cap: Input should be greater than or equal to 1"),
    (["--seed", "-3"], "--seed: Input should be greater than or equal to 0"),
    (["--preset", "qwen3.6-27b", "--device", "cpu"], "--preset qwen3.6-27b: the audit needs about"),
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
    _one_line_error(run_cli("audit", *FAST_AUDIT, "--out", a_file / "sub"), "is not a directory")
    # found before the audit runs, not after it: /proc takes no new directories
    _one_line_error(run_cli("audit", *FAST_AUDIT, "--out", "/proc/ddsim-out/x"), "--out /proc/ddsim-out/x: cannot write there")
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
    assert sorted(rep["provenance"]["inputs_sha256"]) == ["prompts", "trace"]
    # the trace moved: the gate's recheck refuses, naming the option that says where it is; named, the whole audit
    # (one prompt) re-runs from it and reproduces the report (its drafter record's path put back)
    moved = tmp_path / "moved" / "t2.jsonl"
    moved.parent.mkdir()
    trace.rename(moved)
    report = tmp_path / "o" / "report.json"
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", report),
                    f"the audited --trace file {trace} is not here; --trace FILE names where it is here")
    g = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", report, "--trace", moved)
    assert g.returncode == 1 and g.stdout.startswith("recheck: the whole audit re-run"), g.stdout + g.stderr


def test_audit_with_a_cost_file_models_from_it_and_binds_it(tmp_path):
    """--cost FILE: the modelled throughput takes the file's figures (its verify table, its leaky factor), --wide shows
    them, the report records the file's digest, and the gate refuses the report once the file changed, or with
    another file named."""
    from ddsim.digest import file_digest
    cost = tmp_path / "c.json"
    cost.write_text(json.dumps({"ar_step_us": 100, "verify_us": {"1": 100, "65": 900}, "draft_us": 10,
                                "mode_factor": {"leaky": 0.5}}))
    r = run_cli("audit", *FAST_AUDIT, "--cost", cost, "--wide", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    flat = "".join(r.stdout.split())  # (however the terminal's width wrapped the line)
    assert "modelled" in r.stdout and f"fromthecostmodel({cost})" in flat, r.stdout
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["config"]["cost_file"] == str(cost) and rep["provenance"]["inputs_sha256"] == {"cost": file_digest(cost)}
    model = rep["throughput"]["cost_model"]
    assert model["table"] == [[1, 1.0], [65, 9.0]] and model["draft_cost"] == pytest.approx(0.1)
    assert model["mode_factor"] == {"leaky": 0.5}
    rows = {(row["budget"], row["mode"]): row for row in rep["throughput"]["rows"]}
    for b in (4, 8):  # the same nodes: leaky's verify at half exact's cost (each step's draft cost added to both)
        ex, lk = rows[(b, "exact")], rows[(b, "leaky")]
        assert lk["step_cost"] - 0.1 == pytest.approx((ex["step_cost"] - 0.1) / 2)
        assert rows[(b, "leaky-state")]["step_cost"] == ex["step_cost"]
    g = run_cli("gate", "--policy", DEFAULT_POLICY, "--report", tmp_path / "o" / "report.json")
    # the file as audited: the recheck re-runs prompts of the audit (violated: the micro preset at these budgets never
    # exercises the leak)
    assert g.returncode == 1 and g.stdout.startswith("recheck: prompts"), g.stdout + g.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"ar_step_us": 100, "verify_us": {"1": 50}}))
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", tmp_path / "o" / "report.json",
                            "--cost", other), f"--cost {other}: the report does not match (it records cost sha256")
    cost.write_text(json.dumps({"ar_step_us": 100, "verify_us": {"1": 100, "65": 900}, "draft_us": 10}))
    _one_line_error(run_cli("gate", "--policy", DEFAULT_POLICY, "--report", tmp_path / "o" / "report.json"),
                    f"the --cost file {cost} is not the one audited")


def test_the_thread_count_is_the_one_asked_for_and_recorded(tmp_path, monkeypatch):
    """--threads N (else OMP_NUM_THREADS) is the count the audit runs with and records in report.json; a count out of
    range, or an OMP_NUM_THREADS that is not a positive integer, is one line before any work, nothing written."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    for extra, want in ((["--threads", "2"], 2), ([], 3)):
        out = tmp_path / f"o{want}"
        r = run_cli("audit", "--preset", "micro", "--budget", "4", "--steps", "1", *extra, "--out", out)
        assert r.returncode == 0, r.stderr
        assert json.loads((out / "report.json").read_text())["environment"]["threads"] == want
    for bad in ("0", "1025", "x"):
        _one_line_error(run_cli("audit", *FAST_AUDIT, "--threads", bad, "--out", tmp_path / "bad"),
                        f"argument --threads: expected an integer in 1..1024, got '{bad}'")
    for env in ("abc", "0", "-2"):
        monkeypatch.setenv("OMP_NUM_THREADS", env)
        _one_line_error(run_cli("audit", *FAST_AUDIT, "--out", tmp_path / "bad"),
                        f"OMP_NUM_THREADS={env!r}: expected a positive integer")
    assert not (tmp_path / "bad").exists()


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
    # zero never stands for a default (--vocab 0 drew a tree over 32 tokens, --budget 0 a root alone)
    for option, value, want in (("--vocab", "0", ">= 1"), ("--budget", "0", "in 1..1024"), ("--depth", "0", ">= 1"),
                                ("--topk-cap", "0", ">= 1"), ("--seed", "-1", ">= 0"), ("--budget", "1025", "in 1..1024")):
        _one_line_error(run_cli("tree", option, value), f"argument {option}: expected an integer {want}, got '{value}'")
    # and no option that would be ignored: the random logits' with a trace, a trace's step without one
    _one_line_error(run_cli("tree", "--trace", trace, "--vocab", "20", "--depth", "3"), "--depth: not with --trace")
    _one_line_error(run_cli("tree", "--trace", trace, "--vocab", "20", "--seed", "1"), "--seed: not with --trace")
    _one_line_error(run_cli("tree", "--step", "2"), "--step: only with --trace")


def test_an_audit_asks_for_expandable_cuda_segments_unless_told_otherwise(monkeypatch, tmp_path):
    """`ddsim audit` sets PyTorch's CUDA allocator to expandable segments before its first allocation (a full-size
    audit ran out with 23 GiB reserved but unallocated); a PYTORCH_CUDA_ALLOC_CONF of the user's is kept."""
    import os

    import ddsim.devices
    from ddsim.cli import main
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    ddsim.devices.audit_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    ddsim.devices.audit_allocator()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    calls = []
    monkeypatch.setattr(ddsim.devices, "audit_allocator", lambda: calls.append(1))
    assert main(["audit", "--steps", "0", "--out", str(tmp_path / "r")]) == 2  # bad input, after the allocator's
    assert calls == [1]


def test_the_command_line_runs_in_a_fresh_interpreter_on_a_machine_with_cuda(monkeypatch):
    """tests.cli_runs.run_cli forks its worker by default; where there is a CUDA device (asking sets the driver up in
    the worker, after which a fork could not use CUDA) the call runs `python -m ddsim.cli` in a fresh interpreter."""
    import subprocess

    import torch

    from tests import cli_runs
    calls = []
    monkeypatch.setattr(cli_runs, "_forked_cli", lambda args, **kw: calls.append(("fork", args)))
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(("fresh", cmd[1:3])))
    monkeypatch.delenv("DDSIM_TEST_FORK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cli_runs.run_cli("--help")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cli_runs.run_cli("--help")
    assert calls == [("fork", ["--help"]), ("fresh", ["-m", "ddsim.cli"])]


@pytest.mark.parametrize("args, needle", [
    (["--repeats", "0"], "--repeats: expected an integer in 1..100000, got '0'"),
    (["--repeats", "-3"], "--repeats: expected an integer in 1..100000, got '-3'"),
    (["--op", "mamba2"], "--op mamba2: a kernel table, on CUDA only"),
    (["--preset", "nope"], "unknown preset 'nope'"),
])
def test_bench_bad_options_on_the_cpu(args, needle):
    """A count below one (it once printed negative trees per second) and an option the CPU's table would ignore."""
    _one_line_error(run_cli("bench", "--device", "cpu", *args), needle)


@pytest.mark.parametrize("args, needle", [
    (["--repeats", "3"], "--repeats: the CPU's mode table only"),
    (["--preset", "qwen3.6-27b"], "--preset qwen3.6-27b: the GDN kernel table runs at Qwen3.6-27B's GDN shapes"),
    (["--op", "mamba2", "--preset", "tiny"], "--preset tiny: has no Mamba2 layers"),
])
def test_bench_options_a_cuda_table_would_ignore_are_refused_before_any_work(monkeypatch, capsys, args, needle):
    """On CUDA (faked here: every refusal comes before the device is used) an option the kernel tables do not take
    is refused in one line, never ignored."""
    import torch

    from ddsim import cli, devices
    monkeypatch.setattr(devices, "resolve_device", lambda name: torch.device("cuda"))
    assert cli.main(["bench", "--device", "cuda", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and needle in err, err
