"""tests/venv_setup.py, the Makefile's installer: uv reading pip's configuration, pip where uv fails."""
import subprocess
import types

import pytest

from tests import venv_setup

PIP_CONFIG = """:env:.cert='/etc/ssl/certs/ca.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
site.trusted-host='\\nhost-a\\nhost-b'
"""


def _run(outputs: dict, calls: list):
    """A subprocess.run that records each command and answers by its first distinctive word."""
    def run(cmd, **kw):
        calls.append((list(cmd), kw.get("env")))
        key = "config" if "config" in cmd else "uv" if cmd[0].endswith("/uv") else "get_uv" if cmd[-1] == "uv" else "pip"
        return types.SimpleNamespace(stdout=outputs.get(key, ""), returncode=outputs.get(key + "_rc", 0))
    return run


def test_pips_configuration_becomes_uvs_options(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", _run({"config": PIP_CONFIG}, calls))
    config = venv_setup.pip_config("/v/bin/python")
    assert config["extra-index-url"] == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert config["find-links"] == ["/opt/wheels"] and config["cert"] == ["/etc/ssl/certs/ca.crt"]
    assert config["trusted-host"] == ["host-a", "host-b"]  # a list over lines in pip.conf
    cmd, env = venv_setup.uv_command("/v/bin/python", config, ["-q", "-e", ".[test]"])
    assert cmd == ["/v/bin/uv", "pip", "install", "--python", "/v/bin/python", "--index-strategy", "unsafe-best-match",
                   "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
                   "--find-links", "/opt/wheels", "--constraint", "/etc/xdg/pip/constraints.txt",
                   "--allow-insecure-host", "host-a", "--allow-insecure-host", "host-b", "-e", ".[test]", "-q"]
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca.crt" and env["UV_HTTP_TIMEOUT"] == "180"
    cmd, _ = venv_setup.uv_command("/v/bin/python", {"no-index": ["true"], "index-url": ["file:///x"]}, ["torch==2.13.0"])
    assert cmd[-4:] == ["file:///x", "--no-index", "torch==2.13.0", "-q"] and "--index-url" in cmd


@pytest.mark.parametrize("outputs, installer", [({}, "uv"), ({"uv_rc": 1}, "pip"), ({"get_uv_rc": 1}, "pip")])
def test_uv_installs_and_pip_takes_over_where_uv_fails_or_cannot_be_had(monkeypatch, outputs, installer):
    calls = []
    monkeypatch.setattr(subprocess, "run", _run({"config": PIP_CONFIG, **outputs}, calls))
    monkeypatch.setattr(venv_setup.os.path, "exists", lambda p: False)  # uv not installed yet: pip installs it
    assert venv_setup.install("/v/bin/python", ["-q", "torch==2.13.0"]) == installer
    assert calls[0][0] == ["/v/bin/python", "-m", "pip", "install", "-q", "uv"]
    ran_uv = [c for c, _ in calls if c[0].endswith("/uv")]
    assert len(ran_uv) == (0 if "get_uv_rc" in outputs else 1)
    assert calls[-1][0][-2:] == (["torch==2.13.0", "-q"] if installer == "uv" else ["-q", "torch==2.13.0"])
    if installer == "pip":
        assert calls[-1][0][:3] == ["/v/bin/python", "-m", "pip"]
