"""Reading JSON and JSONL input files (checkpoint configs, reports, cost files; drafter traces,
prompts): every problem is an InputError naming the file and, where it has one, the line.

Parsing is strict: a key repeated in one object (JSON would keep the last silently) and the
non-standard constants NaN, Infinity and -Infinity are refused.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ddsim.digest import read_bytes
from ddsim.errors import InputError


class _Refused(ValueError):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def _no_constants(name):
    raise _Refused(f"{name} is not a JSON number")


def strict_loads(text: str, where: str):
    """json.loads that refuses repeated keys and NaN/Infinity; InputError naming ``where``."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except _Refused as e:
        raise InputError(f"{where}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: malformed JSON at line {e.lineno} ({e.msg})") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply") from None


def read_text(path: str | Path, what: str) -> str:
    """The file's text (UTF-8, JSON's encoding), read once as bytes: inside `ddsim.digest.reading()` their sha256 and
    the file's stat are noted, so a report's digest of an input is of the bytes parsed."""
    p = Path(path)
    try:
        return read_bytes(p).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read {what} ({getattr(e, 'strerror', None) or e})") from None


def read_json(path: str | Path, what: str):
    """The parsed content of the JSON file ``path`` (``what`` names it in errors)."""
    return strict_loads(read_text(path, what), str(path))


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[str, object]]:
    """Yield ("FILE:LINE", parsed record) for every non-blank line of ``path``."""
    p = Path(path)
    text = read_text(p, what)
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        rec = strict_loads(line, where)
        yield where, rec
