"""`torchrun --nproc-per-node 2 -m ddsim.cli audit ...` on the CPU (gloo): the prompts are sharded over
two processes and gathered on rank 0 into one report.json equal to the single-process report for the
same seed, apart from its time stamp (both runs with one OpenMP thread per process, as torchrun sets
it: float reductions then associate alike)."""
import json
import os
import subprocess
import sys

from tests.report_fixtures import SETTINGS

ARGS = ["--preset", SETTINGS["preset"], "--budget", ",".join(map(str, SETTINGS["budgets"])), "--steps",
        str(SETTINGS["steps"]), "--seed", str(SETTINGS["seed"])]


def _run(cmd, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_two_rank_audit_equals_the_single_process_audit(tmp_path):
    py = sys.executable
    single = _run([py, "-m", "ddsim.cli", "audit", *ARGS, "--out", str(tmp_path / "one")], tmp_path)
    assert single.returncode == 0, single.stderr
    two = _run([py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "ddsim.cli",
                "audit", *ARGS, "--out", str(tmp_path / "two")], tmp_path)
    assert two.returncode == 0, two.stdout + two.stderr
    assert "(2 ranks)" in two.stdout and two.stdout.count("wrote ") == 1  # rank 0 alone writes and prints
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("one", "two"))
    strip = lambda r: {k: v for k, v in r.items() if k != "generated_at"}  # noqa: E731
    assert strip(a) == strip(b)
    assert len(a["prompts"]) == 3  # prompts 0 and 2 on rank 0, prompt 1 on rank 1
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["report.html", "report.json"]
