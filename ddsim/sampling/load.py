"""What `check-sampler --impl` names, as a check.Sampler: a built-in rule, sgl_kernel's CUDA kernel, or a
MODULE:FUNCTION in ddsim's or SGLang's convention. Every problem is one InputError, before any draw."""
from __future__ import annotations

import functools
import inspect

from ddsim.errors import InputError
from ddsim.sampling import sglang_convention
from ddsim.sampling.check import Sampler
from ddsim.sampling.rules import DRAFTINGS, RANDOM_KINDS, RULES

CONVENTIONS = ("ddsim", "sglang")


def parse_params(items: list[str] | None) -> dict:
    """--param NAME=VALUE (repeatable) -> {name: float}."""
    out = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        try:
            if not eq or not name:
                raise ValueError
            out[name] = float(value)
        except ValueError:
            raise InputError(f"--param {item}: expected NAME=NUMBER") from None
        if out[name] != out[name] or out[name] in (float("inf"), float("-inf")):
            raise InputError(f"--param {item}: not a finite number")
    return out


def _check_params(where: str, params: dict, known: dict) -> None:
    for k in params:
        if k not in known:
            raise InputError(f"--param {k}: {where} takes {', '.join(sorted(known)) or 'no parameters'}")


def resolve(impl: str, *, convention: str | None = None, params: dict | None = None, drafting: str | None = None,
            device: str = "cpu") -> tuple[Sampler, dict]:
    """(the sampler, its description for the JSON)."""
    params = params or {}
    if drafting is not None and drafting not in DRAFTINGS:
        raise InputError(f"--drafting {drafting}: expected one of {', '.join(DRAFTINGS)}")
    if impl in RULES:
        if convention is not None:
            raise InputError("--convention: only with a MODULE:FUNCTION --impl")
        rule = RULES[impl]
        if impl == "greedy":
            raise InputError("--impl greedy: greedy is temperature 0's rule (deterministic); check-sampler tests rules "
                             "at temperature > 0")
        _check_params(f"--impl {impl}", params, rule.params)
        fn = functools.partial(rule.fn, **params) if params else rule.fn
        return (Sampler(impl, fn, rule.randoms, drafting or rule.drafting, rule.uses_draft),
                {"impl": impl, "source": rule.source, "params": {**rule.params, **params},
                 "lossless_as_designed": rule.lossless and (not params or params == rule.params)
                 and (drafting or rule.drafting) == rule.drafting})
    if impl == "sgl-kernel":
        try:
            from sgl_kernel import tree_speculative_sampling_target_only as fn
        except ImportError as e:
            raise InputError(f"--impl sgl-kernel: cannot import sgl_kernel ({e}); install the sgl-kernel wheel "
                             "that matches this torch and CUDA") from None
        if not device.startswith("cuda"):
            raise InputError("--impl sgl-kernel: sgl_kernel's sampling kernel runs on CUDA (--device cuda)")
        return _sglang(fn, impl, params, drafting, device)
    if ":" not in impl:
        raise InputError(f"--impl {impl}: expected one of {', '.join(n for n in RULES if n != 'greedy')}, sgl-kernel "
                         "or MODULE:FUNCTION")
    if convention not in CONVENTIONS:
        raise InputError(f"--convention: MODULE:FUNCTION needs one of {', '.join(CONVENTIONS)}, got {convention!r}")
    from ddsim.engines import _bound, import_function
    fn = import_function(impl)
    if convention == "sglang":
        return _sglang(fn, impl, params, drafting, device)
    randoms = getattr(fn, "randoms", sglang_convention.RANDOMS)
    if not isinstance(randoms, dict) or any(k not in RANDOM_KINDS for k in randoms.values()):
        raise InputError(f"--impl {impl}: its .randoms must map names to {', '.join(RANDOM_KINDS)}")
    accepted = set(inspect.signature(fn).parameters)
    _check_params(f"--impl {impl}", params, {k: None for k in accepted})
    src, digest, sources = _bound(fn)
    call = functools.partial(fn, **params) if params else fn
    d = drafting or getattr(fn, "drafting", "fixed")
    if d not in DRAFTINGS:
        raise InputError(f"--impl {impl}: its .drafting {d!r} is not one of {', '.join(DRAFTINGS)}")
    return (Sampler(impl, call, dict(randoms), d, bool(getattr(fn, "uses_draft", False))),
            {"impl": impl, "convention": "ddsim", "params": params, "source": src, "source_sha256": digest,
             "sources": dict(sources)})


def _sglang(fn, impl, params, drafting, device):
    _check_params(f"--impl {impl}", params, {"threshold_single": 1.0, "threshold_acc": 1.0})
    if drafting not in (None, "fixed"):
        raise InputError(f"--drafting {drafting}: SGLang's target-only rule takes a fixed tree (drafting fixed)")
    from ddsim.engines import _bound
    src, digest, sources = _bound(fn)
    return (Sampler(impl, sglang_convention.adapter(fn, device=device, **params), dict(sglang_convention.RANDOMS),
                    "fixed"),
            {"impl": impl, "convention": "sglang", "params": params, "device": device, "source": src,
             "source_sha256": digest, "sources": dict(sources)})
