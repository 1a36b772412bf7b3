"""Files' times set back for tests that write a file again and expect its stat to move. Linux stamps a write with a
coarse clock (a tick of a few milliseconds) unless the kernel stamps it finely (multigrain timestamps, 6.13 on, on some
file systems): a file created and written again within one tick can keep its mtime and ctime, where a reader's check of
the stat could not tell."""
import os
from pathlib import Path


def set_back(*roots: Path, seconds: int = 10) -> None:
    """Every file under each of ``roots`` (or the file itself) with its mtime ``seconds`` earlier: the next write
    stamps it with the time now, which differs whatever the clock's tick."""
    for root in roots:
        for p in ([root] if root.is_file() else [q for q in root.rglob("*") if q.is_file()]):
            st = os.stat(p)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 10**9))
