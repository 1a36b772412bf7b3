"""What ``ddsim gate --json PATH`` and ``--junit PATH`` write for CI systems: the verdict as JSON (every
rule with its measured value and bound, the policy's source and sha256, what it relaxes, how the report
was trusted, and what was gated, by content: ``audited``), and as JUnit XML (one test case per rule, a failure
per violated rule). Also written on an error (verdict "error", the message), so a CI system never reads an old
file as this run's result. Both are written atomically.

Version 2 (from version 1): ``audited``, what the verdict is about. An audit's report: its sha256 as read (None
where the gate ran the audit itself), the subject and its weights' sha256, the fast path, the engine kernel's record
(its files and their sha256) and the releases it ran under. A replay: the dump's and the checkpoint's sha256 and the
engine the dump names. None with an error."""
from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

FORMAT = "ddsim-gate-verdict"
VERSION = 2


def document(*, exit_code: int, policy=None, verdicts=(), relaxed=(), subject: str = "", notes=(), error: str | None = None,
             version: str, audited: dict | None = None) -> dict:
    verdict = "error" if error is not None else ("holds" if exit_code == 0 else "violated")
    return {"format": FORMAT, "version": VERSION, "ddsim_version": version, "verdict": verdict, "exit_code": exit_code,
            "subject": subject, "error": error, "audited": audited,
            "policy": None if policy is None else {"name": policy.name, "mode": policy.mode, "path": policy.path,
                                                   "builtin": policy.builtin, "sha256": policy.sha256},
            "relaxed_builtin_rules": list(relaxed), "notes": list(notes),
            "rules": [{"rule": v.rule, "measured": v.measured, "bound": v.bound, "kind": v.kind, "holds": v.holds,
                       "meaning": v.meaning} for v in verdicts]}


def audited_report(report, report_sha256: str | None) -> dict:
    """``audited`` for an audit's report (a Report; ``report_sha256``: the sha256 of the text read, None where the
    gate ran the audit itself)."""
    env, prov = report.environment, report.provenance
    return {"report_sha256": report_sha256, "subject": prov.source, "weights_sha256": prov.weights_sha256,
            "fast_path": prov.fast_path, "engine": None if prov.engine is None else prov.engine.model_dump(mode="json"),
            "environment": {"torch": env.torch, "triton": env.triton, "device": env.device,
                            "device_name": env.device_name}}


def audited_replay(rep: dict) -> dict:
    """``audited`` for a replay's report (its provenance: the dump and the checkpoint, by sha256)."""
    p = rep["provenance"]
    return {"dump": p["dump"], "dump_sha256": p["dump_sha256"], "model": p["model"],
            "weights_sha256": p["weights_sha256"], "engine": p["engine"]}


def junit(doc: dict) -> str:
    rules = doc["rules"]
    failures = sum(not r["holds"] for r in rules)
    cases = []
    for r in rules:
        op = "<=" if r["kind"] == "max" else ">="
        message = "measured {:.6g}, bound {} {:.6g}".format(r["measured"], op, r["bound"])
        body = "" if r["holds"] else f"<failure message={quoteattr(message)}>{escape(r['meaning'])}</failure>"
        cases.append(f'  <testcase classname="ddsim.verdict.gate" name={quoteattr(r["rule"])}>{body}</testcase>')
    if doc["error"] is not None:
        cases.append(f'  <testcase classname="ddsim.verdict.gate" name="gate"><error message={quoteattr(doc["error"])}/></testcase>')
    name = f"ddsim gate {doc['policy']['name'] if doc['policy'] else ''}".strip()
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            f'<testsuite name={quoteattr(name)} tests="{len(cases)}" failures="{failures}" '
            f'errors="{int(doc["error"] is not None)}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def write(doc: dict, *, json_path: str | None, junit_path: str | None) -> None:
    from ddsim.reports.json_report import write_atomic
    files = {}
    if json_path:
        files[Path(json_path)] = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    if junit_path:
        files[Path(junit_path)] = junit(doc)
    if files:
        write_atomic(files)
