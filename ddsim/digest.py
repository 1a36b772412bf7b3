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


def _raw_key(p: Path) -> tuple:
    """(resolved path, device, inode, size, mtime, ctime); OSError as stat raises it."""
    st = os.stat(p)
    return (str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat_key(p: Path) -> tuple:
    try:
        return _raw_key(p)
    except OSError as e:
        raise _unreadable(p, e) from None


def files_digest(paths) -> str:
    """sha256 over several files, each as its name then its bytes, in the order given (looked up where this process
    read the same files, unchanged, before: _DIGESTS). Inside `reading()`, a file opened there that has changed
    since, before or during this read, is an InputError."""
    paths = [Path(p) for p in paths]
    started = time.time_ns()
    key = tuple((p.name, _stat_key(p)) for p in paths)
    _unchanged_since_opened(paths, [k for _, k in key])  # (inside an audit: what it loaded is what is digested)
    if key in _DIGESTS:
        return _DIGESTS[key]
    h = hashlib.sha256()
    for p in paths:
        h.update(f"{p.name}\0".encode())
        _update(h, p)
    digest = h.hexdigest()
    after = tuple((p.name, _stat_key(p)) for p in paths)
    _unchanged_since_opened(paths, [k for _, k in after])
    if all(k[-1] < started - _SETTLED_NS for _, k in key) and key == after:  # settled, and unchanged while read
        _DIGESTS[key] = digest
    return digest


# What an audit read, by file: `ddsim.jsonl.read_text` notes the sha256 of each file's bytes as it reads them (prompts,
# trace, cost file, a checkpoint's config), so the report's inputs_sha256 names the bytes the audit ran on, not a second
# read of the same path (which a file replaced meanwhile would answer with other bytes); and each file's stat (inode,
# size, mtime, ctime) as it was opened, with a checkpoint's weight files (`held_while_read`: safetensors reads them), so the
# weights' digest taken after the load refuses a file that changed since (a write moves ctime, but for one within the
# same tick of a coarse file clock as the file's previous write: tests/file_times.py). Noted only inside
# `reading()`: an audit (ddsim.measure.audit.run_audit) and a replay's inputs (ddsim.engines.replay.prepare: the
# checkpoint and the dump, digested after they are read).
class Reads(dict):
    """{resolved path: sha256 of the bytes read}; ``opened``: {resolved path: its stat key when first opened}."""

    def __init__(self):
        super().__init__()
        self.opened: dict[str, tuple] = {}


_READS: contextvars.ContextVar[Reads | None] = contextvars.ContextVar("ddsim_reads", default=None)


@contextlib.contextmanager
def reading():
    """Within it, each file read through ddsim.jsonl, or opened with `note_opened`, is noted (Reads)."""
    reads = Reads()
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def read_bytes(path: Path) -> bytes:
    """The file's bytes (OSError as open raises it); inside `reading()` its stat before the read and the bytes' sha256
    are noted, and a file read before with other bytes, or opened before with another stat, is an InputError."""
    reads = _READS.get()
    if reads is None:
        return path.read_bytes()
    key = _note_opened(reads, path, _raw_key(path))
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if reads.setdefault(key, digest) != digest:
        raise InputError(f"{path}: changed while it was read (two reads gave other bytes)")
    return data


@contextlib.contextmanager
def held_while_read(path: Path):
    """Inside `reading()`: the file's stat noted as the block opens it and checked again once the block has read it
    (note_opened at both ends: a write during the read is an InputError). Nothing outside it."""
    note_opened(path)
    yield
    note_opened(path)


def note_opened(path: Path) -> None:
    """Inside `reading()`: note the file's stat as it is opened to be read (a checkpoint's weight files), or refuse
    one opened before with another stat (called again once it is read: refuses a write during the read). Nothing
    outside it."""
    reads = _READS.get()
    if reads is not None:
        _note_opened(reads, path, _stat_key(path))


def _note_opened(reads: Reads, path: Path, key: tuple) -> str:
    if reads.opened.setdefault(key[0], key) != key:
        raise InputError(f"{path}: changed while it was read (its inode, size or times are not those it was opened with)")
    return key[0]


def _unchanged_since_opened(paths: list[Path], keys: list[tuple]) -> None:
    """Inside `reading()`: each of ``paths`` opened there has the stat it had then (keys: their stat keys now)."""
    reads = _READS.get()
    for p, key in zip(paths, keys) if reads is not None else ():
        if reads.opened.get(key[0], key) != key:
            raise InputError(f"{p}: changed since it was read (its inode, size or times moved)")


def read_digest(path: str | Path) -> str:
    """The sha256 of the bytes of ``path`` noted by the running `reading()`; a file not read there (or no reading()
    running) is an internal error, not a second read's digest."""
    reads, key = _READS.get(), str(Path(path).resolve())
    if reads is None or key not in reads:
        raise RuntimeError(f"{path}: no read of it was noted (its digest would not be of what was parsed)")
    return reads[key]
