"""sha256 digests of input files, read in chunks: what a report records as the audited weights and
inputs, and what ``gate --report`` checks a named checkpoint or file against. No torch here."""
from __future__ import annotations

import hashlib
from pathlib import Path

from ddsim.errors import InputError


def _update(h, path: Path) -> None:
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None


def file_digest(path: str | Path) -> str:
    """sha256 of one file's bytes."""
    h = hashlib.sha256()
    _update(h, Path(path))
    return h.hexdigest()


def files_digest(paths) -> str:
    """sha256 over several files, each as its name then its bytes, in the order given."""
    h = hashlib.sha256()
    for p in map(Path, paths):
        h.update(f"{p.name}\0".encode())
        _update(h, p)
    return h.hexdigest()
