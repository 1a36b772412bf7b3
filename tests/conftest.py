import json
import os
import subprocess
import sys

import pytest

FAST_AUDIT = ["--preset", "micro", "--budget", "4,8", "--steps", "3", "--seed", "5"]


def run_cli(*args, cwd=None, timeout=600, pythonpath=None):
    """Run the real command line in a subprocess; returns CompletedProcess (text). ``pythonpath``:
    a directory put first on the subprocess's import path (the engine packages under .engines)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "ddsim.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


def one_line_error(r, *needles):
    """A bad-input refusal: exit 2, one line on stderr naming every needle, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="session")
def audit_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    r = run_cli("audit", *FAST_AUDIT, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def report(audit_dir):
    return json.loads((audit_dir / "report.json").read_text())


@pytest.fixture(scope="session")
def typed_report(audit_dir):
    from ddsim.reports import json_report
    return json_report.load(audit_dir / "report.json")
