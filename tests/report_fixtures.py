"""The two deterministic audits the gate tests read, a planted-leak / no-leak pair on the micro preset:

- ``leak``:  the micro preset as it is: the flattened path's wrong states change the logits.
- ``inert``: the same preset with every GDN layer's output projection zeroed, so the recurrent state
  (right or wrong) cannot reach the logits: the flattened path leaks state and changes nothing.

The gate must refuse the first and approve the second with the default policy. The reports are
committed in tests/data/ (so the fast gate tests and mutation testing read them without running an
audit); test_cli checks they are still exactly what this code produces.

    python -m tests.report_fixtures     # rewrite tests/data/report-micro-*.json
"""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).with_name("data")
SETTINGS = dict(preset="micro", budgets=[24, 32], steps=4, seed=5, device="cpu")  # CPU audits wherever made
KINDS = ("leak", "inert")


def path(kind: str) -> Path:
    return DATA / f"report-micro-{kind}.json"


def make(kind: str):
    """Run the fixture audit ``kind`` in-process and return its (unstamped) Report."""
    from unittest import mock

    import ddsim.measure.audit as audit
    from ddsim.measure.settings import AuditConfig
    ac = AuditConfig(**SETTINGS)
    if kind == "leak":
        return audit.run_audit(ac)
    assert kind == "inert", kind
    real = audit.init_weights

    def zero_gdn_out(cfg, **kw):
        w = real(cfg, **kw)
        for layer in cfg.gdn_layers:
            w[f"layers.{layer}.gdn.out"].zero_()
        return w

    with mock.patch.object(audit, "init_weights", zero_gdn_out):
        return audit.run_audit(ac)


if __name__ == "__main__":
    from ddsim.reports import json_report
    DATA.mkdir(exist_ok=True)
    for kind in KINDS:
        report = json_report.stamp(make(kind))
        path(kind).write_text(json_report.dumps(report))
        print(f"wrote {path(kind)}")
