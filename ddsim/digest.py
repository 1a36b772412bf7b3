"""sha256 digests of input files, read in chunks: what a report records as the audited weights and
inputs, and what ``gate --report`` checks a named checkpoint or file against. No torch here."""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import time
from pathlib import Path

from ddsim.errors import InputError


def _unreadable(path: Path, e: OSError) -> InputError:
    """The one line naming a file that cannot be read (or stat'ed) and why."""
    return InputError(f"{path}: cannot read ({e.strerror or e})")


def _update(h, path: Path) -> None:
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    except OSError as e:
        raise _unreadable(path, e) from None


def file_digest(path: str | Path) -> str:
    """sha256 of one file's bytes."""
    h = hashlib.sha256()
    _update(h, Path(path))
    return h.hexdigest()


# files_digest's results in this process, by what each file's inode says of it: `gate --report R --model DIR` digests a
# checkpoint (50 GB at full size) to match it to the report, again to check it before the recheck, and a third time
# in the re-run audit; the second and third are looked up while no file has changed since. A write changes a file's
# ctime, which no caller can set back (os.utime sets mtime and atime, and moves ctime to now), so a file written since
# has another key; a digest is kept only where every file's ctime was 2 s older than the read's start (a write within
# the timestamps' granularity of the read could otherwise leave the key unchanged: git's "racily clean" case).
_DIGESTS: dict[tuple, str] = {}
_SETTLED_NS = 2_000_000_000


def _stat_key(p: Path) -> tuple:
    try:
        st = os.stat(p)
    except OSError as e:
        raise _unreadable(p, e) from None
    return (str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def files_digest(paths) -> str:
    """sha256 over several files, each as its name then its bytes, in the order given (looked up where this process
    read the same files, unchanged, before: _DIGESTS)."""
    paths = [Path(p) for p in paths]
    started = time.time_ns()
    key = tuple((p.name, _stat_key(p)) for p in paths)
    if key in _DIGESTS:
        return _DIGESTS[key]
    h = hashlib.sha256()
    for p in paths:
        h.update(f"{p.name}\0".encode())
        _update(h, p)
    digest = h.hexdigest()
    settled = all(k[-1] < started - _SETTLED_NS for _, k in key)
    if settled and key == tuple((p.name, _stat_key(p)) for p in paths):  # unchanged while read
        _DIGESTS[key] = digest
    return digest


# The bytes an audit parsed, by file: `ddsim.jsonl.read_text` notes the sha256 of each input file's bytes as it reads
# them (prompts, trace, cost file), so the report's inputs_sha256 names the bytes the audit ran on, not a second read
# of the same path (which a file replaced meanwhile would answer with other bytes). Noted only inside `reading()`.
_READS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("ddsim_reads", default=None)


@contextlib.contextmanager
def reading():
    """Within it, each file read through ddsim.jsonl is noted: {resolved path: sha256 of the bytes read}."""
    reads: dict[str, str] = {}
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def note_read(path: Path, data: bytes) -> None:
    """Note that ``data`` was read from ``path`` (inside `reading()`; nothing otherwise). A file read twice with other
    bytes is an InputError: what the reads parsed is not one file's content."""
    reads = _READS.get()
    if reads is None:
        return
    key, digest = str(Path(path).resolve()), hashlib.sha256(data).hexdigest()
    if reads.setdefault(key, digest) != digest:
        raise InputError(f"{path}: changed while it was read (two reads gave other bytes)")


def read_digest(reads: dict, path: str | Path) -> str:
    """The sha256 of the bytes of ``path`` noted in ``reads`` (from `reading()`); a file not read there is an
    internal error, not a second read's digest."""
    key = str(Path(path).resolve())
    if key not in reads:
        raise RuntimeError(f"{path}: no read of it was noted (its digest would not be of what was parsed)")
    return reads[key]
