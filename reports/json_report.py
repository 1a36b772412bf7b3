"""report.json: versioned, deterministic for a seed (apart from ``generated_at``), written atomically."""
from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from ddsim.errors import InputError
from ddsim.jsonl import read_json

SCHEMA_VERSION = 2  # 2 added "precision" and the noise margin (reference and divergence margins)
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


def _clean(x):
    """JSON-safe: numpy scalars to Python, non-finite floats to null."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dumps(report: dict) -> str:
    return json.dumps(_clean(report), indent=1, sort_keys=True) + "\n"


def stamp(report: dict) -> dict:
    return {**report, "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_atomic(files: dict[Path, str]) -> None:
    """Write every file to a temporary sibling first, then rename them all into place; on any
    failure nothing new is left behind."""
    tmps = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            tmps.append((tmp, path))
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in tmps:
            os.replace(tmp, path)
        tmps = []
    finally:
        for tmp, _ in tmps:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def load(path: str | Path) -> dict:
    """Read and check a report: a clear InputError for unreadable, malformed or foreign files."""
    p = Path(path)
    report = read_json(p, "report")
    if not isinstance(report, dict) or "schema_version" not in report:
        raise InputError(f"{p}: not a ddsim report (no schema_version)")
    if report["schema_version"] != SCHEMA_VERSION:
        raise InputError(f"{p}: schema_version {report['schema_version']!r}, this ddsim reads {SCHEMA_VERSION}")
    problem = validate(report)
    if problem:
        raise InputError(f"{p}: does not match the report schema ({problem})")
    return report


def validate(report: dict) -> str | None:
    """None when ``report`` matches reports/report.schema.json, else the first problem.
    Uses jsonschema when installed; otherwise checks the required top-level fields."""
    schema = json.loads(SCHEMA_PATH.read_text())
    try:
        import jsonschema
    except ImportError:
        missing = [k for k in schema["required"] if k not in report]
        return f"missing {missing[0]!r}" if missing else None
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(report))
    if err is None:
        return None
    where = "/".join(str(x) for x in err.absolute_path) or "(top level)"
    return f"{where}: {err.message[:200]}"
