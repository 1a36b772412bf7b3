"""Serving engines' GDN tree-verify kernels behind ddsim's kernel contract, one small adapter per
engine (the core never imports an engine; each adapter translates layouts and flags at the edge).

The contract every adapter meets (shapes as in the README, Contracts: kernel interface):
    verify(q, k, v, g, beta, *, parents, initial_state, mode, scale) -> o [B, T, HV, V]
with q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV] (g in log space), parents [B, T],
initial_state [B, HV, K, V] float32 (read, never written). ``mode`` is one of the adapter's
``modes``; an adapter refuses the others in one line.

    load("ddsim")                 ddsim's own fast path (exact and leaky)
    load("fla")                   flash-linear-attention's fused_recurrent_gated_delta_rule (leaky only:
                                  it takes no tree, so on a tree it is the flattened path)
    load("sglang")                SGLang's fused_sigmoid_gating_delta_rule_update (exact with
                                  retrieve_parent_token, leaky without)
    load("pkg.module:function", convention="ddsim" | "fla")   anything else with one of those signatures
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from ddsim.errors import InputError

CONVENTIONS = ("ddsim", "fla")


@dataclass(frozen=True)
class EngineKernel:
    name: str  # what reports and tables call it
    modes: tuple[str, ...]  # the verify modes it offers
    verify: Callable  # the contract above
    package: str | None = None  # distribution it came from, with its version
    version: str | None = None
    source: str | None = None  # the file the kernel lives in
    source_sha256: str | None = field(default=None)

    def check_mode(self, mode: str) -> None:
        if mode not in self.modes:
            raise InputError(f"--mode {mode}: {self.name} offers only {', '.join(self.modes)}"
                             + (" (it takes no tree: on a tree it is the flattened path)" if self.modes == ("leaky",) else ""))

    def provenance(self) -> dict:
        """What a report records about the kernel (ddsim.report_model.EngineRecord)."""
        return {"name": self.name, "modes": list(self.modes), "package": self.package, "version": self.version,
                "source": self.source, "source_sha256": self.source_sha256}


def _source_of(fn) -> tuple[str | None, str | None]:
    try:
        path = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        return None, None
    if not path:
        return None, None
    from ddsim.digest import file_digest
    return path, file_digest(path)


def _version(dist: str) -> str | None:
    """The installed distribution's version, else the package's own ``<dist>.version.__version__``
    (a kernel module taken from a wheel without its metadata), else None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        pass
    try:
        return str(importlib.import_module(f"{dist}.version").__version__)
    except (ImportError, AttributeError):
        return None


def load(impl: str, *, convention: str | None = None) -> EngineKernel:
    """The adapter for ``impl``; a missing engine package is one InputError naming it."""
    if impl == "ddsim":
        from ddsim.engines import ddsim_kernels
        return ddsim_kernels.adapter()
    if impl == "fla":
        from ddsim.engines import fla
        return fla.adapter()
    if impl == "sglang":
        from ddsim.engines import sglang
        return sglang.adapter()
    if impl == "vllm":
        raise InputError(f"--impl {impl}: no adapter in this release (use MODULE:FUNCTION with --convention "
                         "ddsim or fla, or --impl sglang or fla)")
    if ":" not in impl:
        raise InputError(f"--impl {impl}: expected ddsim, fla, sglang or MODULE:FUNCTION")
    module, _, name = impl.partition(":")
    if os.getcwd() not in sys.path:  # a serving repo's own module, run from its checkout
        sys.path.insert(0, os.getcwd())
    if convention not in CONVENTIONS:
        raise InputError(f"--convention: MODULE:FUNCTION needs one of {', '.join(CONVENTIONS)}, got {convention!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        raise InputError(f"--impl {impl}: cannot import {e.name!r}") from None
    except AttributeError:
        raise InputError(f"--impl {impl}: module {module!r} has no {name!r}") from None
    if not callable(fn):
        raise InputError(f"--impl {impl}: {name!r} is not callable")
    src, digest = _source_of(fn)
    top = module.split(".")[0]
    if convention == "ddsim":
        from ddsim.engines.ddsim_kernels import as_contract
        return EngineKernel(impl, ("exact", "leaky"), as_contract(fn), top, _version(top), src, digest)
    from ddsim.engines.fla import as_contract
    return EngineKernel(impl, ("leaky",), as_contract(fn), top, _version(top), src, digest)
