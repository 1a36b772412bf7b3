"""The audit, report and gate on a Mamba2 hybrid, in use exactly as on Gated DeltaNet: a deterministic
CPU audit of the micro-mamba2 preset (Mamba2, parallel and MLP-only blocks in Nemotron-H's block
layout) with its exact gate verdict, lossless exact verification, and a leak table per family."""
import json

import pytest

from tests.cli_runs import run_cli

# (a whole audit and gate, 20 s of one core: `make test-slow`, to keep `make test` inside CI's six minutes; the
# Mamba2 kernels' properties and an audit's mamba2 leak tables, tests/test_checkpoints_mamba.py's Nemotron-H audit,
# stay in `make test`; this exact gate verdict on a Mamba2 hybrid is asserted here only)
pytestmark = pytest.mark.slow

# on the CPU wherever the suite runs (`--device auto` takes a GPU where there is one: a bf16 fast path, other figures)
ARGS = ["--preset", "micro-mamba2", "--budget", "16,32", "--steps", "3", "--seed", "5", "--device", "cpu"]


def test_micro_mamba2_audit_and_its_exact_gate_verdict(tmp_path):
    out = tmp_path / "out"
    r = run_cli("audit", *ARGS, "--out", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["model"]["config"]["layer_pattern"] == "mfmapf"
    for b in rep["budgets"]:
        assert b["modes"]["exact"]["generations_leaving_greedy"] == 0  # lossless
        assert b["modes"]["exact"]["silent_corruption_steps"] == 0
        fam = b["leak"]["leaky"]["by_family"]
        assert [(f["family"], f["layers"]) for f in fam] == [("mamba2", 3)]
        assert fam[0]["state_rel"]["median"] > 0.1  # siblings inherit each other's state
        assert b["leak"]["exact"]["by_family"][0]["state_rel"]["max"] < 1e-5  # the exact path: noise only
        kinds = [row["kind"] for row in b["leak"]["leaky"]["by_layer"]]
        assert kinds == list("mfmapf")
        assert [row.get("state_rel") is not None for row in b["leak"]["leaky"]["by_layer"]] == [
            k in "mp" for k in "mfmapf"]
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json")
    assert g.returncode == 1, g.stdout + g.stderr
    violated = sorted(line.split()[1].rstrip(":") for line in g.stdout.splitlines() if line.startswith("VIOLATED"))
    assert violated == ["argmax_flip_rate_above_noise", "decision_flip_rate", "generations_leaving_greedy_above_noise",
                        "leak_nodes_per_budget", "silent_corruption_steps"], g.stdout
    # same seed, same report (apart from the time stamp and the machine)
    again = tmp_path / "again"
    assert run_cli("audit", *ARGS, "--out", again).returncode == 0
    a, b = (json.loads((d / "report.json").read_text()) for d in (out, again))
    for d in (a, b):
        d.pop("generated_at"), d.pop("environment")
    assert a == b
