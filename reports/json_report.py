"""report.json: the serialised ddsim.verdict.report_model.Report — versioned, deterministic for a seed
(apart from ``generated_at``), written atomically together with report.html, validated on load.

    python -m ddsim.reports.json_report --write-schema   # regenerate report.schema.json (and the replay's)
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from ddsim.errors import InputError
from ddsim.jsonl import read_text, strict_loads
from ddsim.verdict.report_model import SCHEMA_VERSION, Report

SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


def schema() -> dict:
    """The JSON Schema of report.json, generated from the model."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "ddsim/report.schema.json",
            **Report.model_json_schema()}


def _clean(x):
    """JSON-safe: numpy scalars and arrays to Python; non-finite floats stay non-finite (the model
    refuses them, so an audit that produced one fails loudly instead of writing null)."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        return _clean(x.tolist())
    return x


def _where(e: ValidationError) -> str:
    err = e.errors()[0]
    msg = err["msg"].removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {msg}" if loc else msg


def from_audit(content: dict) -> Report:
    """The audit's raw content as a validated Report (through JSON, as a reader would see it)."""
    text = json.dumps(_clean(content), allow_nan=True)
    try:
        return Report.model_validate_json(text)
    except ValidationError as e:
        raise RuntimeError(f"internal: the audit produced an invalid report ({_where(e)})") from None


def dumps(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=1, sort_keys=True, allow_nan=False) + "\n"


def comparable(report: Report) -> dict:
    """What two runs of one seed share: everything but the time stamp and the machine."""
    d = report.model_dump(mode="json")
    d.pop("generated_at")
    d.pop("environment")
    d.pop("measured_steps")  # the machine's timings
    return d


def stamp(report: Report) -> Report:
    return report.model_copy(update={"generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})


def loads(text: str, where: str) -> Report:
    """Parse and validate report.json text; InputError naming ``where`` and the first bad field."""
    data = strict_loads(text, where)  # refuses repeated keys and NaN/Infinity before the model sees the text
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError(f"{where}: not a ddsim report (no schema_version)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise InputError(f"{where}: schema_version {data['schema_version']!r}, this ddsim reads {SCHEMA_VERSION}")
    if data.get("generated_at") is None:
        raise InputError(f"{where}: generated_at missing (a report is stamped when it is written)")
    try:
        return Report.model_validate_json(text)
    except ValidationError as e:
        raise InputError(f"{where}: invalid report at {_where(e)}") from None


def load(path: str | Path) -> Report:
    """Read and check a report: a clear InputError for unreadable, malformed, inconsistent or foreign files."""
    return loads(read_text(path, "report"), str(path))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(files: dict[Path, str]) -> None:
    """Write every file to a temporary sibling first, then rename them into place in the order
    given, so the last one is the commit point: a reader that sees the new last file sees every
    earlier one new too. On any failure (SIGTERM included, which the command line turns into an
    exception) the temporary files are removed and nothing new is left behind. Files get the
    mode a plain open() would (0666 less the umask), not mkstemp's 0600."""
    mode = 0o666 & ~_umask()
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
            os.chmod(tmp, mode)
        for tmp, path in tmps:
            os.replace(tmp, path)
        tmps = []
    finally:
        for tmp, _ in tmps:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_report(report: Report, html: str, out: Path) -> None:
    """report.html first, report.json last: a new report.json never stands beside an old report.html."""
    write_atomic({out / "report.html": html, out / "report.json": dumps(report)})


REPLAY_SCHEMA_PATH = Path(__file__).with_name("replay-report.schema.json")


def replay_schema() -> dict:
    """The JSON Schema of a replay's report.json, generated from ddsim.engines.replay_report."""
    from ddsim.engines.replay_report import ReplayReport
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "ddsim/replay-report.schema.json",
            **ReplayReport.model_json_schema()}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-schema"]:
        raise SystemExit("usage: python -m ddsim.reports.json_report --write-schema")
    for path, sch in ((SCHEMA_PATH, schema()), (REPLAY_SCHEMA_PATH, replay_schema())):
        path.write_text(json.dumps(sch, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")
