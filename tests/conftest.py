import json

import pytest

from tests.cli_runs import FAST_AUDIT, run_cli


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


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """A tiny transformers-built Qwen3.5 checkpoint, the replay tests' model (the emulated engine serves it)."""
    from tests.test_checkpoints import _hf_model
    d = tmp_path_factory.mktemp("replay") / "qwen3_5"
    _hf_model("qwen3_5").save_pretrained(d)
    return d
