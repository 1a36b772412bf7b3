"""Reading JSON and JSONL input files (checkpoint configs, reports, cost files; drafter traces,
prompts): every problem is an InputError naming the file and, where it has one, the line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ddsim.errors import InputError


def read_json(path: str | Path, what: str):
    """The parsed content of the JSON file ``path`` (``what`` names it in errors)."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except OSError as e:
        raise InputError(f"{p}: cannot read {what} ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{p}: malformed JSON at line {e.lineno} ({e.msg})") from None


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[str, object]]:
    """Yield ("FILE:LINE", parsed record) for every non-blank line of ``path``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"{p}: cannot read {what} ({e.strerror or e})") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: malformed JSON ({e.msg})") from None
