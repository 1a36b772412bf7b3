"""A step replayed on another step's buffers, as a server's CUDA graph runs an engine's kernel.

A server captures its verify once per batch size, on the tensors of one step (the graph's static inputs), and every
later step only writes new values into those same tensors and replays the graph: the kernel gets the same tensor
objects and addresses every step, and nothing its launcher computed on the host at capture is computed again. A
launcher that keeps a result by its inputs' identity (fla's ``tensor_cache``, single-entry, keyed by ``a is b``) or
bakes a value read on the host into its launch is right on the fresh tensors of a first call and wrong on every
replay. check-kernel's replayed examples (kernel_cases.replayed) run the kernel once on another step's inputs and
then judge it on the example's: inside ``replaying(replay)`` each adapter's call of its engine kernel goes through
``launch``, which on that first step keeps the kernel's arguments (and on CUDA captures the call in a CUDA graph,
after one warm-up call), and on every later step copies the new arguments' values into the kept ones (their whole
storages: guard slots and other layers too), runs the kernel on those very tensors (replays the graph on CUDA), and
copies every kept storage back into the new arguments, so the adapter and the properties see what the kernel wrote.
Outside ``replaying``, launch is the plain call.

A later step whose arguments are laid out otherwise than the first's (a tensor of another shape, stride, dtype,
device, offset or storage size; a scalar of another value; the arguments sharing storages otherwise) cannot replay
the first step's launch: ReplayMismatch, which check-kernel reports as the kernel's failure on that example (a
server would replay the stale launch).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


class ReplayMismatch(RuntimeError):
    """A replayed step's arguments differ in layout or scalars from those the kernel was first launched (captured)
    with."""


class NotCapturable(RuntimeError):
    """The kernel's launch could not be captured in a CUDA graph (it synchronises with the host, allocates outside
    the graph's pool, ...): a server that replays its verify from CUDA graphs cannot run it."""


def _leaves(args: tuple, kwargs: dict) -> list:
    """[(name, leaf)] of a launch's arguments: "argument i" and "keyword k", tuples, lists and dicts walked in order
    ("argument i[j]")."""
    out = []

    def walk(name, x):
        if isinstance(x, (tuple, list)):
            out.append((name, type(x)))  # its kind a leaf; its length and a dict's keys are in the names below
            for j, v in enumerate(x):
                walk(f"{name}[{j}]", v)
        elif isinstance(x, dict):
            out.append((name, dict))
            for k in sorted(x, key=str):
                walk(f"{name}[{k!r}]", x[k])
        else:
            out.append((name, x))
    for i, a in enumerate(args):
        walk(f"argument {i}", a)
    for k in sorted(kwargs):
        walk(f"keyword {k}", kwargs[k])
    return out


def _is_tensor(x) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _layout(t) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.storage_offset(), t.untyped_storage().nbytes())


def _map(x, fn):
    """x with every tensor leaf replaced by fn(leaf)."""
    if isinstance(x, tuple):
        return tuple(_map(v, fn) for v in x)
    if isinstance(x, list):
        return [_map(v, fn) for v in x]
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return fn(x) if _is_tensor(x) else x


@dataclass
class _Site:
    """One launch of a step (the i-th call of launch within it): the function, its kept arguments, their leaves, and
    on CUDA the graph captured on them with its output."""
    fn: object
    args: tuple
    kwargs: dict
    leaves: list
    graph: object = None
    out: object = None


@dataclass
class Replay:
    """The launches of one replayed example: the first step's (``first``, kept, captured on CUDA where ``capture``),
    then each later step's, replayed on them. ``begin()`` before each step's call; ``replayed()`` once the first step
    is done."""
    capture: bool = False  # capture each launch in a CUDA graph (a CUDA device)
    sites: list = field(default_factory=list)
    first: bool = True
    at: int = 0

    def begin(self) -> None:
        self.at = 0

    def replayed(self) -> None:
        self.first = False

    def launch(self, fn, args: tuple, kwargs: dict):
        if self.first:
            return self._keep(fn, args, kwargs)
        if self.at >= len(self.sites):
            raise ReplayMismatch(f"launch {self.at + 1} of a replayed step: the first step made {len(self.sites)}")
        site = self.sites[self.at]
        self.at += 1
        if fn is not site.fn:
            raise ReplayMismatch(f"launch {self.at} of a replayed step calls {getattr(fn, '__name__', fn)}, the first "
                                 f"step's called {getattr(site.fn, '__name__', site.fn)}")
        pairs = _pairs(site.leaves, _leaves(args, kwargs), self.at)
        for mine, theirs in pairs:  # the new step's values into the kept tensors: a server writes its graph's inputs
            mine.copy_(theirs)
        if site.graph is not None:
            site.graph.replay()
            out = _map(site.out, lambda t: t.clone())
        else:
            out = site.fn(*site.args, **site.kwargs)
        for mine, theirs in pairs:  # and what the kernel left in them back to the caller's
            theirs.copy_(mine)
        return out

    def _keep(self, fn, args: tuple, kwargs: dict):
        site = _Site(fn, args, kwargs, _leaves(args, kwargs))
        self.sites.append(site)
        out = fn(*args, **kwargs)
        if self.capture:
            import torch
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    site.out = fn(*args, **kwargs)
            except Exception as e:
                raise NotCapturable(f"not capturable in a CUDA graph: {type(e).__name__}: {e}") from e
            site.graph = graph
        return out


def _pairs(kept: list, new: list, at: int) -> list:
    """[(kept storage, new storage)] as uint8 tensors, one per distinct storage, where every leaf of the new step's
    arguments (_leaves) matches the kept one's: the same names, tensors laid out alike and sharing storages alike,
    other values equal; else ReplayMismatch."""
    import torch
    step = f"launch {at} of a replayed step"
    if [n for n, _ in kept] != [n for n, _ in new]:
        raise ReplayMismatch(f"{step}: arguments {[n for n, _ in new]}, the first step's {[n for n, _ in kept]}")
    pairs, by_mine, by_theirs = [], {}, {}
    for (name, a), (_, b) in zip(kept, new):
        if _is_tensor(a) != _is_tensor(b):
            raise ReplayMismatch(f"{step}: {name} is a {type(b).__name__}, the first step's a {type(a).__name__}")
        if not _is_tensor(a):
            if type(a) is not type(b) or a != b:
                raise ReplayMismatch(f"{step}: {name} is {b!r}, the first step's {a!r} (a captured launch keeps it)")
            continue
        if _layout(a) != _layout(b):
            raise ReplayMismatch(f"{step}: {name} is laid out {_layout(b)}, the first step's {_layout(a)}")
        ka, kb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
        if by_mine.get(ka, kb) != kb or by_theirs.get(kb, ka) != ka:
            raise ReplayMismatch(f"{step}: {name} shares a storage otherwise than the first step's did")
        if ka in by_mine:
            continue
        by_mine[ka], by_theirs[kb] = kb, ka
        pairs.append(tuple(torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
                           for t in (a, b)))
    return pairs


_ACTIVE: list = []


@contextlib.contextmanager
def replaying(replay: Replay | None):
    """Within it, launch goes through ``replay`` (None: the plain call)."""
    _ACTIVE.append(replay)
    try:
        yield replay
    finally:
        _ACTIVE.pop()


def launch(fn, *args, **kwargs):
    """fn(*args, **kwargs), as the step being checked runs it: the plain call, or inside ``replaying`` the kept
    (captured) launch of the replayed example's first step, on its tensors with this call's values."""
    replay = _ACTIVE[-1] if _ACTIVE else None
    if replay is None:
        return fn(*args, **kwargs)
    return replay.launch(fn, args, kwargs)
