"""`torchrun --nproc-per-node 2 -m ddsim.cli audit ...` on the CPU (gloo): the prompts are sharded over
two processes and gathered on rank 0 into one report.json equal to the single-process report for the
same seed, apart from its time stamp (both runs with one OpenMP thread per process, as torchrun sets
it: float reductions then associate alike)."""
import json
import os
import subprocess
import sys

import pytest

from tests.report_fixtures import SETTINGS

# on the CPU wherever the suite runs: `--device auto` on a machine of one GPU would ask torchrun's second rank for a
# second GPU
ARGS = ["--preset", SETTINGS["preset"], "--budget", ",".join(map(str, SETTINGS["budgets"])), "--steps",
        str(SETTINGS["steps"]), "--seed", str(SETTINGS["seed"]), "--device", "cpu"]


def _run(cmd, cwd):
    # TMPDIR: torchrun's own log folder (torchelastic_*, which it leaves behind) in the test's folder, not /tmp
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(cwd)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
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
    # the oracle batches a share's trees together, and the references are decoded a share at a time (3
    # prompts here, 2 and 1 there): the same report up to the reassociation of the oracle's float64
    # products and of the float32 reference decode's; every token, count and verdict exactly
    _assert_same_report(strip(a), strip(b))
    assert len(a["prompts"]) == 3  # prompts 0 and 2 on rank 0, prompt 1 on rank 1
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["report.html", "report.json"]


def _assert_same_report(a, b, path="report"):
    """a == b, floats within float64 reassociation (1e-6 relative: error ratios of order 1e-7 amplify
    it; or both below 1e-11, where KLs of 1e-13 carry no relative precision); the reference's decision
    margins (and what is computed from them) within float32 reassociation (1e-4 relative: the fast
    path's float32 logits, decoded a batch of prompts at a time); everything else exactly."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same_report(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_report(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        rel = 1e-4 if ("margin" in path or "fragility" in path) else 1e-6
        assert a == b or abs(a - b) <= rel * max(abs(a), abs(b)) or max(abs(a), abs(b)) < 1e-11, f"{path}: {a} {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
