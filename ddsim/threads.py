"""How many CPU threads torch uses, chosen for the work rather than left at torch's default of one per
core: ddsim's CPU work is small models and many small ops (a tree of tens of nodes, heads of 4-128
channels), where a thread pool costs more in hand-offs than it saves, and on a machine shared with
other jobs torch's default pool oversubscribes it (the default audit ran 25x slower under load).

    configure(None)   OMP_NUM_THREADS when set (the user's or the scheduler's choice), else 1
    configure(n)      n threads (``--threads``)

The audit records the count it ran with (report.json ``environment.threads``), and ``gate --report``
rechecks a report with the count the report records.
"""
from __future__ import annotations

import os

from ddsim.errors import InputError
from ddsim.values import is_int

DEFAULT_THREADS = 1


def wanted(threads: int | None) -> int:
    """The thread count to use: ``threads`` if given, else OMP_NUM_THREADS, else DEFAULT_THREADS."""
    if threads is not None:
        if not is_int(threads) or not 1 <= threads <= 1024:
            raise InputError(f"--threads: expected an integer in 1..1024, got {threads!r}")
        return threads
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise InputError(f"OMP_NUM_THREADS={env!r}: expected a positive integer") from None
        if n >= 1:
            return n
        raise InputError(f"OMP_NUM_THREADS={env!r}: expected a positive integer")
    return DEFAULT_THREADS


def configure(threads: int | None = None) -> int:
    """Set torch's intra-op (and, where still possible, inter-op) thread count; returns it. Without torch
    (the gate on a report needs none) there is nothing to set."""
    n = wanted(threads)
    try:
        import torch
    except ImportError:
        return n
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # only settable before any inter-op work; the intra-op pool is what matters here
        pass
    return n
