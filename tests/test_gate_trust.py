"""The gate trusts only what it can check (the second hostile probe): a bare policy name is the
built-in policy, never a file in the working directory; a report from another ddsim version, of a
kernel whose source changed, or whose figures do not reproduce is refused (exit 2); a policy that
omits or loosens built-in rules says so in its verdict; MODULE:FUNCTION never shadows an installed
package. Each class is planted and must come out red or refused."""
import hashlib
import json
import sys
from pathlib import Path

import pytest

from ddsim import cli
from ddsim.verdict.gate import BUILTIN_POLICIES, load_policy, relaxations
from tests import report_fixtures
from tests.cli_runs import FAST_AUDIT, one_line_error, run_cli

LEAK = report_fixtures.path("leak")
LAX = "[policy]\nname = 'hybrid-unsafe'\n[rules]\nsilent_corruption_steps = 1e308\n"


def _gate(capsys, *args):
    code = cli.main(["gate", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_file_in_the_working_directory_never_replaces_the_builtin_policy(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hybrid-unsafe").write_text(LAX)  # would approve the leaking report
    (tmp_path / "hybrid-unsafe.toml").write_text(LAX)
    code, out, _ = _gate(capsys, "--policy", "hybrid-unsafe", "--report", LEAK, "--no-recheck")
    assert code == 1, out
    sha = hashlib.sha256((BUILTIN_POLICIES / "hybrid-unsafe.toml").read_bytes()).hexdigest()
    assert f"policy hybrid-unsafe: built-in hybrid-unsafe, sha256 {sha[:16]}" in out.splitlines()
    # the file is used only when named as a path, and then the verdict names it and what it relaxes
    code, out, _ = _gate(capsys, "--policy", "./hybrid-unsafe.toml", "--report", LEAK, "--no-recheck")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("policy hybrid-unsafe: hybrid-unsafe.toml, sha256 ")
    assert lines[1].startswith("policy relaxes 10 built-in rules: argmax_flip_rate_above_noise (built-in 0, policy omits it)")
    assert "silent_corruption_steps (built-in 0, policy 1e+308)" in lines[1]
    assert "require.leak_nodes_per_budget (built-in 100, policy 1)" in lines[1]
    code, _, err = _gate(capsys, "--policy", "no-such", "--report", LEAK)
    assert code == 2 and "--policy no-such: no built-in policy of that name" in err and "./no-such.toml" in err


@pytest.mark.parametrize("text, relaxed", [
    # a [rules.float32] table loosening every rule of a float32 report
    ("[rules]\n" + "".join(f"{r} = 0\n" for r in ("argmax_flip_rate_above_noise", "decision_flip_rate",
                                                  "generations_leaving_greedy_above_noise", "silent_corruption_steps",
                                                  "exact_generations_leaving_greedy_above_noise")) +
     "exact_state_rel_max = 1e-4\nexact_kl_max = 1e-6\n[rules.float32]\nexact_state_rel_max = 1\nexact_kl_max = 1\n"
     "decision_flip_rate = 0.5\n[require]\nleak_nodes_per_budget = 100\n",
     ["decision_flip_rate (built-in 0, policy 0.5)", "exact_state_rel_max (built-in 0.0001, policy 1)",
      "exact_kl_max (built-in 1e-06, policy 1)", "sampled_emitted_tv_above_noise (built-in 0, policy omits it)",
      "sampled_accepted_length_tv_above_noise (built-in 0, policy omits it)"]),
    # the built-in's own text, copied to a file: nothing relaxed
    ((BUILTIN_POLICIES / "hybrid-unsafe.toml").read_text(), []),
    # a stricter policy: nothing relaxed
    ((BUILTIN_POLICIES / "hybrid-unsafe.toml").read_text().replace("leak_nodes_per_budget = 100",
                                                                    "leak_nodes_per_budget = 500"), []),
    # the leak mode changed, and a replay tolerance loosened
    ((BUILTIN_POLICIES / "hybrid-unsafe.toml").read_text().replace('mode = "leaky"', 'mode = "leaky-conv"'),
     ["mode (built-in leaky, policy leaky-conv)"]),
])
def test_relaxations_name_each_loosened_rule(tmp_path, text, relaxed):
    p = tmp_path / "p.toml"
    p.write_text(text)
    assert relaxations(load_policy(p), "float32") == relaxed


def test_replay_relaxations_and_tolerances(tmp_path):
    base = load_policy("hybrid-unsafe")
    assert base.noise_kl("float32") == 1e-6 and base.noise_kl("bfloat16") == 5e-2 and base.noise_kl("float64") == 1e-6
    p = tmp_path / "p.toml"
    p.write_text("[rules]\nsilent_corruption_steps = 0\n[replay]\ndiagnosed_steps = 3\nnoise_kl = 1e-3\n"
                 "[replay.bfloat16]\nnoise_kl = 0.5\n")
    r = relaxations(load_policy(p), None)
    assert r == ["replay.diagnosed_steps (built-in 0, policy 3)", "replay.noise_kl (built-in 1e-06, policy 0.001)",
                 "replay.float64.noise_kl (built-in 1e-06, policy 0.001)",
                 "replay.float32.noise_kl (built-in 1e-06, policy 0.001)",
                 "replay.bfloat16.noise_kl (built-in 0.05, policy 0.5)"]
    p.write_text("[rules]\nsilent_corruption_steps = 0\n[replay.bf16]\nnoise_kl = 1\n")
    from ddsim.errors import InputError
    with pytest.raises(InputError, match=r"\[replay.bf16\] names no dtype"):
        load_policy(p)


def _forge_leaky_as_exact(d: dict) -> dict:
    """The leaking report with every leaky figure replaced by the exact mode's: self-consistent, and
    what a gate that trusts names would approve."""
    for b in d["budgets"]:
        b["modes"]["leaky"] = json.loads(json.dumps(b["modes"]["exact"]))
        b["leak"]["leaky"] = json.loads(json.dumps(b["leak"]["exact"]))
    exact = {(g["prompt"], g["budget"]): g for g in d["generations"] if g["mode"] == "exact"}
    for g in d["generations"]:
        if g["mode"] == "leaky":
            g.update({k: v for k, v in exact[(g["prompt"], g["budget"])].items() if k != "mode"})
    rows = {(r["budget"], r["mode"]): r for r in d["throughput"]["rows"]}
    for (bud, mode), r in rows.items():
        if mode == "leaky":
            r.update({k: v for k, v in rows[(bud, "exact")].items() if k not in ("mode",)})
    return d


def test_a_forged_report_passes_on_trust_and_fails_the_recheck(tmp_path, capsys):
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(_forge_leaky_as_exact(json.loads(LEAK.read_text()))))
    opts = ["--preset", "micro", "--budget", "24,32", "--steps", "4", "--seed", "5"]
    code, out, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", forged, *opts, "--no-recheck")
    assert code == 0, out + err  # every number is self-consistent: on trust, the forgery passes
    assert "taken on trust" in out.splitlines()[-1]
    code, out, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", forged, *opts)
    assert code == 2 and "does not reproduce: generations[prompt" in err and "mode leaky]" in err, out + err
    # the genuine report reproduces, whichever prompt the digest picks, and the whole audit too
    code, out, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", LEAK, "--recheck-prompts", "99")
    assert code == 1 and out.startswith("recheck: the whole audit re-run"), out + err


def test_leak_tables_forged_beside_genuine_generations_fail_the_one_prompt_recheck(tmp_path, capsys):
    """The generations left as audited (they reproduce) and only the leaky mode's leak tables replaced by the exact
    mode's (no flips, rounding-sized errors): self-consistent, and a one-prompt recheck cannot reproduce tables
    pooled over every prompt, but the re-run prompt's own nodes must fit inside them. They do not."""
    d = json.loads(LEAK.read_text())
    for b in d["budgets"]:
        b["leak"]["leaky"] = json.loads(json.dumps(b["leak"]["exact"]))
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(d))
    code, out, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", forged, "--no-recheck")
    assert code == 1 and "taken on trust" in out.splitlines()[-1], out + err  # it loads: self-consistent
    code, out, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", forged)
    assert code == 2 and "--report: does not reproduce: budgets[24].leak.leaky." in err, out + err
    assert "(the report's table is not the pool of its prompts)" in err, err


def test_a_report_of_another_ddsim_version_is_refused(tmp_path, capsys):
    d = json.loads(LEAK.read_text())
    d["provenance"]["ddsim_version"] = d["environment"]["ddsim"] = "0.1.9"
    p = tmp_path / "old.json"
    p.write_text(json.dumps(d))
    code, _, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", p)
    assert code == 2 and "--report: written by ddsim 0.1.9, this is ddsim" in err
    code, out, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", p, "--accept-other-version")
    assert code == 1, out + err
    assert "the report was written by ddsim 0.1.9 (accepted explicitly)" in out.splitlines()[-1]


KERNEL = '''import ddsim.gpu_backend as gb


def verify(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    return gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state,
                              state_indices=state_indices, mode=mode, scale=scale, backend="torch")
'''


def test_a_kernel_whose_source_changed_or_vanished_is_refused(tmp_path):
    (tmp_path / "mykernel.py").write_text(KERNEL)
    r = run_cli("audit", *FAST_AUDIT, "--fast-path", "mykernel:verify", "--convention", "ddsim", "--out", "a",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = tmp_path / "a" / "report.json"
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, cwd=tmp_path)
    assert g.returncode == 1 and g.stdout.startswith("recheck: "), g.stdout + g.stderr  # FAST_AUDIT: no leak exercised
    # its kernel ran under other torch or Triton releases (the interpreter's here): not the kernel gated here, where
    # the gate takes it to be this one (the recheck re-runs it; --fast-path names it); without either, on trust
    named = ["--fast-path", "mykernel:verify", "--convention", "ddsim", "--no-recheck"]
    for name, key in (("torch", "torch"), ("Triton", "triton")):
        d = json.loads(rep.read_text())
        here, d["environment"][key] = d["environment"][key], "0.0.1"
        forged = tmp_path / f"{key}.json"
        forged.write_text(json.dumps(d))
        for extra in ([], named):
            one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", forged, *extra, cwd=tmp_path),
                           f"--report: its kernels ran under {name} 0.0.1, this is {name} {here} (the kernel gated here "
                           "is not the one audited; --accept-other-version")
        g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", forged, *named, "--accept-other-version",
                    cwd=tmp_path)
        assert g.returncode == 1 and (f"the report's kernels ran under {name} 0.0.1, this is {here} (accepted "
                                      "explicitly)") in g.stdout.splitlines()[-1], g.stdout + g.stderr
        g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", forged, "--no-recheck", cwd=tmp_path)
        assert g.returncode == 1 and "taken on trust" in g.stdout.splitlines()[-1], g.stdout + g.stderr
    (tmp_path / "mykernel.py").write_text(KERNEL + "# patched after the audit\n")
    for extra in ([], ["--fast-path", "mykernel:verify", "--convention", "ddsim", "--no-recheck"]):
        one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, *extra, cwd=tmp_path),
                       "--fast-path mykernel:verify: its source", "is not the kernel the report audited")
    (tmp_path / "mykernel.py").unlink()
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, "--fast-path", "mykernel:verify",
                           "--convention", "ddsim", "--no-recheck", cwd=tmp_path), "cannot import 'mykernel'")


PACKAGED_KERNEL = '''import ddsim.gpu_backend as gb

from kpkg.helpers import scale_of


def verify(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    return gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=initial_state,
                              state_indices=state_indices, mode=mode, scale=scale_of(scale), backend="torch")
'''
HELPERS = "def scale_of(scale):\n    return scale\n"


def test_a_kernel_whose_package_changed_around_it_is_refused(tmp_path):
    """The report binds the files the kernel's module reaches in its package, not only its own: a helper module
    changed after the audit, a file newly reached, or a report that names a file no longer reached or none at all
    is one line naming the file, with the recheck or without it."""
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kernel.py").write_text(PACKAGED_KERNEL)
    (pkg / "helpers.py").write_text(HELPERS)
    r = run_cli("audit", *FAST_AUDIT, "--fast-path", "kpkg.kernel:verify", "--convention", "ddsim", "--out", "a",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = tmp_path / "a" / "report.json"
    rec = json.loads(rep.read_text())["provenance"]["engine"]
    assert sorted(rec["sources"]) == ["kpkg/helpers.py", "kpkg/kernel.py"]
    assert rec["sources"]["kpkg/kernel.py"] == rec["source_sha256"]
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, cwd=tmp_path)
    assert g.returncode == 1 and g.stdout.startswith("recheck: "), g.stdout + g.stderr  # FAST_AUDIT: no leak exercised
    opts = ["--fast-path", "kpkg.kernel:verify", "--convention", "ddsim", "--no-recheck"]

    def refused(report, *what):
        for extra in ([], opts):
            one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", report, *extra, cwd=tmp_path),
                           *what)
    (pkg / "helpers.py").write_text(HELPERS + "# patched after the audit\n")
    refused(rep, "--fast-path kpkg.kernel:verify: its package's file kpkg/helpers.py (sha256",
            "is not the file the report audited")
    (pkg / "extra.py").write_text("OFFSET = 0.0\n")
    (pkg / "helpers.py").write_text("from kpkg.extra import OFFSET\n\n\n" + HELPERS)  # a file newly reached
    refused(rep, "its package's file kpkg/extra.py is not among the files the report audited")
    (pkg / "helpers.py").write_text(HELPERS)  # as audited again: the report's own records altered
    for name, sources in (("gone", {**rec["sources"], "kpkg/gone.py": "0" * 64}), ("none", {})):
        d = json.loads(rep.read_text())
        d["provenance"]["engine"]["sources"] = sources
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    refused(tmp_path / "gone.json", "its package's file kpkg/gone.py is no longer reached from the kernel's module")
    refused(tmp_path / "none.json", "--fast-path kpkg.kernel:verify: the report records no source files")


def test_the_recheck_refuses_what_is_not_at_hand(tmp_path, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, wherever the test runs
    from ddsim.environment import triton_version
    d = json.loads(LEAK.read_text())
    d["environment"]["device"] = "cuda:0"  # (run under this torch and Triton: the releases a CUDA report is held to)
    d["environment"]["torch"], d["environment"]["triton"] = torch.__version__, triton_version()
    d["config"]["device"] = "cuda"
    d["precision"]["oracle"] = "float32"
    p = tmp_path / "cuda.json"
    p.write_text(json.dumps(d))
    code, _, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", p)
    assert code == 2 and "cannot recheck a cuda:0 audit without a CUDA device" in err and "--no-recheck" in err
    d["environment"]["triton"] = "0.0.1"  # ddsim's own kernels, compiled by another Triton: not the ones gated here
    p.write_text(json.dumps(d))
    code, _, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", p)
    assert code == 2 and "--report: its kernels ran under Triton 0.0.1, this is Triton" in err, err


def test_module_function_never_shadows_an_installed_package(tmp_path, monkeypatch):
    """A jsonschema.py in the working directory (first on sys.path, as under `python -m`) is not what
    `jsonschema:validate` imports: the installed package is."""
    from ddsim.engines import load
    (tmp_path / "jsonschema.py").write_text("def validate(*a, **k):\n    return 'shadow'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, "jsonschema", raising=False)
    kernel = load("jsonschema:validate", convention="ddsim")
    assert kernel.source and str(tmp_path) not in kernel.source, kernel.source
    assert sys.path[0] == str(tmp_path)  # the caller's path is left as it was


def test_gate_json_and_junit_carry_the_verdict_or_the_error(tmp_path, capsys):
    from xml.etree import ElementTree
    j, x = tmp_path / "g.json", tmp_path / "g.xml"
    code, out, _ = _gate(capsys, "--policy", "hybrid-unsafe", "--report", LEAK, "--no-recheck", "--json", j, "--junit", x)
    doc = json.loads(j.read_text())
    assert code == 1 and doc["verdict"] == "violated" and doc["exit_code"] == 1 and doc["error"] is None
    assert doc["policy"]["builtin"] and len(doc["policy"]["sha256"]) == 64
    assert [r["rule"] for r in doc["rules"] if not r["holds"]] == [
        l.split(":")[0].removeprefix("VIOLATED ") for l in out.splitlines() if l.startswith("VIOLATED")]
    assert any("taken on trust" in n for n in doc["notes"])
    from ddsim.digest import file_digest
    rep = json.loads(LEAK.read_text())  # what was gated, by content: the report's bytes, the weights, the fast path
    assert doc["version"] == 2 and doc["audited"] == {
        "report_sha256": file_digest(LEAK), "subject": rep["provenance"]["source"],
        "weights_sha256": rep["provenance"]["weights_sha256"], "fast_path": "ddsim-torch", "engine": None,
        "environment": {k: rep["environment"].get(k) for k in ("torch", "triton", "device", "device_name")}}
    suite = ElementTree.parse(x).getroot()
    assert int(suite.get("tests")) == len(doc["rules"]) and int(suite.get("failures")) == 4
    code, _, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", tmp_path / "nope.json", "--json", j,
                         "--junit", x)
    doc = json.loads(j.read_text())
    assert code == 2 and doc["verdict"] == "error" and doc["exit_code"] == 2 and "cannot read report" in doc["error"]
    assert doc["audited"] is None
    assert ElementTree.parse(x).getroot().get("errors") == "1"
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", LEAK, "--json", tmp_path),
                   "--json", "is a directory")
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", LEAK, "--junit", "/proc/x/g.xml"),
                   "--junit /proc/x", "cannot write there")


def test_the_recheck_refuses_a_checkpoint_or_input_file_that_changed_or_went(tmp_path):
    """A report of a checkpoint audit (a copy of the shipped hybrid) with a prompts file: the recheck runs while
    both are as audited, and refuses the report once the prompts file changed, or the checkpoint's weights
    changed, or the checkpoint is gone."""
    import shutil

    from ddsim.cli import SHIPPED
    models = Path(cli.__file__).with_name("models")
    ck = tmp_path / "ck"
    shutil.copytree(models / SHIPPED["model"], ck)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"tokens": [5, 6, 7, 8]}\n')
    rep = tmp_path / "a" / "report.json"
    assert run_cli("audit", "--model", ck, "--prompts", prompts, "--budget", "8", "--steps", "1",
                   "--out", tmp_path / "a").returncode == 0
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep)
    assert g.returncode == 1 and g.stdout.startswith("recheck: the whole audit re-run"), g.stdout + g.stderr  # (no leak node)
    prompts.write_text('{"tokens": [5, 6, 7, 9]}\n')
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep),
                   f"the --prompts file {prompts} is not the one audited", "--no-recheck")
    prompts.write_text('{"tokens": [5, 6, 7, 8]}\n')
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-5 if cfg.get("rms_norm_eps") != 1e-5 else 2e-5}))
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep),
                   f"the checkpoint at {ck} is not the one audited")
    shutil.rmtree(ck)
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep),
                   f"cannot recheck: the audited checkpoint {ck} is not here")


def test_a_report_made_elsewhere_rechecks_with_its_inputs_named_where_they_are_here(tmp_path):
    """A report audited in one directory (relative paths: a checkpoint, a drafter checkpoint, a prompts file, a cost
    file) and gated from another, its inputs copied there under other names: the recheck refuses in one line naming
    the option that says where each input is; with the options given, it reads them there (each bound by its digest
    first) and the verdict is the one given where the audit ran, by a partial recheck and by a whole one. A named
    file of other content is refused before any work."""
    import shutil

    from ddsim.cli import SHIPPED
    models = Path(cli.__file__).with_name("models")
    gpu, ci = tmp_path / "gpu", tmp_path / "ci"
    gpu.mkdir()
    shutil.copytree(models / SHIPPED["model"], gpu / "ck")
    shutil.copytree(models / SHIPPED["drafter_model"], gpu / "dr")
    (gpu / "p.jsonl").write_text('{"tokens": [5, 6, 7, 8]}\n{"tokens": [9, 10, 11]}\n')
    (gpu / "c.json").write_text(json.dumps({"ar_step_us": 100, "verify_us": {"1": 100, "9": 300}, "draft_us": 10}))
    files = ["--model", "ck", "--drafter-model", "dr", "--prompts", "p.jsonl", "--cost", "c.json"]
    a = run_cli("audit", *files, "--budget", "8", "--steps", "1", "--out", "out", cwd=gpu)
    assert a.returncode == 0, a.stderr
    rep = gpu / "out" / "report.json"
    here = run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, cwd=gpu)
    assert here.returncode == 1 and here.stdout.startswith("recheck: prompts ["), here.stdout + here.stderr
    verdict = here.stdout.splitlines()[1:]
    shutil.copytree(gpu, ci / "inputs")
    for old, new in (("ck", "ck2"), ("dr", "dr2"), ("p.jsonl", "p2.jsonl"), ("c.json", "c2.json")):
        (ci / "inputs" / old).rename(ci / "inputs" / new)
    moved = ["--model", "inputs/ck2", "--drafter-model", "inputs/dr2/", "--prompts", "inputs/p2.jsonl",
             "--cost", "inputs/c2.json"]
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, cwd=ci),
                   "cannot recheck: the audited checkpoint ck is not here; --model DIR names where it is here")
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, *moved[:2], cwd=ci),
                   "cannot recheck: the audited drafter dr is not here; --drafter-model DIR names where it is here")
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, *moved[:6], cwd=ci),
                   "cannot recheck: the audited --cost file c.json is not here; --cost FILE names where it is here")
    for extra, first in (((), "recheck: prompts ["), (("--recheck-prompts", "2"), "recheck: the whole audit re-run")):
        g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, *moved, *extra, cwd=ci)
        assert g.returncode == 1 and g.stdout.startswith(first), g.stdout + g.stderr
        assert g.stdout.splitlines()[1:] == verdict
    (ci / "inputs" / "p2.jsonl").write_text('{"tokens": [5, 6, 7, 8]}\n')
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--report", rep, *moved, cwd=ci),
                   "--prompts inputs/p2.jsonl: the report does not match")
    # the recheck holds a file named elsewhere to the report's digest itself, not only the command line before it
    from ddsim.errors import InputError
    from ddsim.measure.recheck import check_at_hand
    from ddsim.reports import json_report
    at = {field: str(ci / value) for field, value in
          zip(("model_path", "drafter_model", "prompts_file", "cost_file"), moved[1::2])}
    with pytest.raises(InputError, match="the --prompts file .*p2.jsonl is not the one audited"):
        check_at_hand(json_report.load(rep), at)


def test_a_whole_recheck_holds_the_verdict_to_its_own_rerun_too(monkeypatch, capsys):
    """A whole recheck re-runs the audit: its figures reproduce the report's within tolerance, and the verdict
    must hold on both. A report that passes (the no-leak fixture) whose re-run breaks a rule (planted: the
    re-run is the leaking audit's) is given the re-run's violations, never the kinder verdict. (The no-leak
    fixture's weights are planted, so it cannot be rechecked for real; the genuine whole recheck of the leaking
    report above evaluates a real re-run.)"""
    from ddsim.measure import recheck as rc
    from ddsim.reports import json_report
    inert_path = report_fixtures.path("inert")
    inert, leaking = json_report.load(inert_path), json_report.load(LEAK)
    for rerun, code_want in ((inert, 0), (leaking, 1), (None, 0)):
        monkeypatch.setattr(rc, "recheck", lambda report, prompts, at, r=rerun: rc.RecheckResult(
            [0, 1], r is not None, 1, r))
        code, out, err = _gate(capsys, "--policy", "hybrid-unsafe", "--report", inert_path)
        assert code == code_want, out + err
        said = out.splitlines()[-1].endswith("the recheck's re-run of the audit does not (a figure within the "
                                             "recheck's tolerance of its bound): the re-run's verdict is given")
        assert said is (code_want == 1), out
        assert ("VIOLATED silent_corruption_steps" in out) is (code_want == 1), out
