"""How reports reach the disk: report.html and report.json as a pair (a new report.json never stands
beside an old report.html), temporary files removed on failure and on SIGTERM, file modes that
follow the umask; and what the command line says about an internal error."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ddsim import cli
from ddsim.reports import json_report
from tests import report_fixtures
from tests.cli_runs import FAST_AUDIT


def _leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def test_pair_is_written_html_first_and_json_last(tmp_path, monkeypatch):
    report = json_report.load(report_fixtures.path("inert"))
    order = []
    real = os.replace
    monkeypatch.setattr(json_report.os, "replace", lambda a, b: (order.append(os.path.basename(b)), real(a, b)))
    json_report.write_report(report, "<html>new</html>", tmp_path)
    assert order == ["report.html", "report.json"]
    assert json_report.load(tmp_path / "report.json") == report


def test_a_failed_write_leaves_the_old_json_and_no_temporary_files(tmp_path, monkeypatch):
    (tmp_path / "report.json").write_text("old json")
    (tmp_path / "report.html").write_text("old html")
    report = json_report.load(report_fixtures.path("inert"))
    real = os.replace

    def replace(a, b):
        if str(b).endswith("report.json"):
            raise cli.Terminated()  # SIGTERM between the two renames
        return real(a, b)

    monkeypatch.setattr(json_report.os, "replace", replace)
    with pytest.raises(cli.Terminated):
        json_report.write_report(report, "<html>new</html>", tmp_path)
    assert (tmp_path / "report.json").read_text() == "old json"  # the commit point was never reached
    assert _leftovers(tmp_path) == []


def test_report_files_follow_the_umask(tmp_path):
    code = ("import os, sys; os.umask(0o027); from ddsim.cli import main; "
            f"sys.exit(main(['audit', *{FAST_AUDIT!r}, '--out', {str(tmp_path / 'o')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for name in ("report.json", "report.html"):
        assert oct((tmp_path / "o" / name).stat().st_mode & 0o777) == oct(0o640), name


def test_sigterm_during_an_audit_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "ddsim.cli", "audit", "--preset", "tiny", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(4.0)  # inside the audit (it takes tens of seconds)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    assert err.strip().splitlines() == ["ddsim audit: terminated"]
    assert not out.exists() or not any(out.iterdir())


def test_sigterm_during_check_kernel_exits_2_and_writes_no_verdict(tmp_path):
    """A check-kernel killed by a CI's time limit inside a kernel's call ends there, saying so, with no verdict file:
    not a verdict of every property failing on the example the signal came in (which it had then written, after
    running the rest)."""
    out, called = tmp_path / "ck.json", tmp_path / "called"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DDSIM_TEST_CALLED": str(called)}
    p = subprocess.Popen([sys.executable, "-m", "ddsim.cli", "check-kernel", "--impl",
                          "tests.planted_kernels:stalls_once_called", "--convention", "ddsim", "--mode", "exact",
                          "--device", "cpu", "--launch", "eager", "--max-examples", "2", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(1200):  # until the kernel is first called (at most 2 minutes)
            if called.exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        assert called.exists(), p.communicate()[1]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()  # a check that ran on past the signal (each call a minute) is not left behind
    assert p.returncode == 2, err
    assert err.strip().splitlines() == ["ddsim check-kernel: terminated"]
    assert not out.exists()


def test_internal_errors_are_one_line_unless_debug(monkeypatch, capsys, tmp_path):
    import ddsim.measure.audit

    def boom(*a, **k):
        raise RuntimeError("planted")

    monkeypatch.setattr(ddsim.measure.audit, "run_audit", boom)
    args = ["audit", "--preset", "micro", "--out", str(tmp_path / "o")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "ddsim audit: internal error: RuntimeError: planted (--debug or DDSIM_DEBUG=1 shows the traceback)"]
    assert cli.main(["--debug", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().endswith("ddsim audit: internal error: RuntimeError: planted")
    monkeypatch.setenv("DDSIM_DEBUG", "1")
    assert cli.main(args) == 2 and "Traceback" in capsys.readouterr().err


def test_a_presets_weight_digest_covers_every_byte_name_dtype_and_shape():
    """weights_digest of a preset (per-tensor sha256, hashed in parallel, then the lines in name order):
    the same weights give the same digest; one changed byte, a renamed tensor, another dtype or shape
    give another."""
    import torch

    from ddsim.measure.audit import weights_digest
    from ddsim.measure.settings import AuditConfig
    from ddsim.model.config import get_preset
    from ddsim.model.weights import init_weights
    cfg = get_preset("micro")
    w = init_weights(cfg, seed=0)
    ac = AuditConfig(preset="micro")
    d = weights_digest(ac, w)
    assert d == weights_digest(ac, dict(reversed(list(w.items())))) and len(d) == 64
    name = next(k for k in sorted(w) if w[k].dim() == 2)
    changed = dict(w, **{name: w[name].clone()})
    changed[name].view(-1)[-1] += 1
    renamed = {(k + "x" if k == name else k): v for k, v in w.items()}
    others = [changed, renamed, dict(w, **{name: w[name].double()}), dict(w, **{name: w[name].reshape(-1)})]
    assert len({d} | {weights_digest(ac, o) for o in others}) == 5
    assert weights_digest(ac, {k: v.to(torch.float32) for k, v in w.items()}) == d  # float32 already


def _digest_by_formula(w: dict) -> str:
    import hashlib
    lines = "".join(f"{k}:{str(w[k].dtype).removeprefix('torch.')}:{tuple(w[k].shape)}:"
                    f"{hashlib.sha256(w[k].contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()}\n"
                    for k in sorted(w))
    return hashlib.sha256(lines.encode()).hexdigest()


def test_tensor_digest_is_its_formula_piece_by_piece(monkeypatch):
    """tensors_sha256 hashed piece by piece (pieces of 7 bytes here) is the sha256 of the lines of each
    tensor's whole bytes: non-contiguous, empty, bf16 and bool tensors included."""
    from ddsim.model import tensor_digest
    w = {"a": torch.randn(5, 3).T, "b": torch.zeros(0, 4), "c": torch.randn(9).bfloat16(), "d": torch.rand(6) > 0.5}
    want = _digest_by_formula(w)
    assert tensor_digest.tensors_sha256(w) == want
    monkeypatch.setattr(tensor_digest, "PIECE", 7)
    assert tensor_digest.tensors_sha256(w, threads=2) == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's tensors")
def test_tensor_digest_on_a_gpu_is_the_digest_of_the_same_tensors_on_the_host(monkeypatch):
    from ddsim.model import tensor_digest
    w = {f"t{i}": torch.randn(1000 + i, 33, device="cuda").to(torch.bfloat16 if i % 2 else torch.float32)
         for i in range(40)}
    monkeypatch.setattr(tensor_digest, "PIECE", 4096)  # many pieces per tensor, through each thread's buffer
    assert tensor_digest.tensors_sha256(w) == _digest_by_formula({k: v.cpu() for k, v in w.items()})
