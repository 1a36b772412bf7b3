"""Kernel launches at the cost of the driver call.

``kernel[grid](**kw)`` goes through Triton's ``JITFunction.run`` on every call: bind the
arguments, compute their specialization and the cache key, look the compiled kernel up, check the
kernel's globals, then launch. On the H200's host that took 24-42 us per launch (RESULTS.md), more
than the WY kernel itself at one sequence. ``bind`` keeps the compiled kernel of a specialization
once Triton has made it and launches it directly afterwards (``CompiledKernel.run``, the call
``JITFunction.run`` ends in, with the same arguments in the same order).

The key a compiled kernel is kept under is finer than Triton's specialization, so a kernel found
here is the one Triton would pick: every tensor's dtype and 16-byte alignment, every int, bool,
string and dtype by value, floats by type (Triton does not specialize on float values), the launch
options, the kernel and the device. Under Triton's interpreter, or with a launch hook installed
(profilers), every launch goes through ``kernel[grid]`` as before.
"""
from __future__ import annotations

import threading

import torch

_COMPILED: dict = {}  # key -> CompiledKernel
_PARAMS: dict = {}  # kernel -> (argument names in order, compiled?, getter of the arguments)
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl", "enable_fp_fusion")
DIRECT = True  # False: every launch through kernel[grid] (benchmarks compare the two)


def _params(kernel):
    """(argument names in order, whether the kernel is compiled: a JITFunction, not the interpreter's
    InterpretedFunction, which @triton.jit makes under TRITON_INTERPRET=1, a getter of the arguments
    in order from the keyword dict). Kept by the kernel's id: hashing a JITFunction computes its cache
    key, about a microsecond a call (kernels are module-level objects that live as long as the process)."""
    hit = _PARAMS.get(id(kernel))
    if hit is None:
        from operator import itemgetter

        from triton.runtime.jit import JITFunction

        from ddsim.gpu_backend._common import interpreting
        compiled = isinstance(kernel, JITFunction) and not interpreting()
        names = tuple(getattr(kernel, "arg_names", ()))
        get = itemgetter(*names) if len(names) > 1 else (lambda kw: tuple(kw[n] for n in names))
        hit = _PARAMS[id(kernel)] = (names, compiled, get, kernel)  # the kernel kept: its id stays its own
    return hit


def _active(hook) -> bool:
    """A launch hook is installed: None, or an empty HookChain (Triton >= 3.4's default), is none."""
    return hook is not None and bool(getattr(hook, "calls", True))


_RUNTIME: list = []  # triton's runtime knobs, imported once (an import statement costs a microsecond a call)


def _hooked() -> bool:
    if not _RUNTIME:
        from triton import knobs
        _RUNTIME.append(knobs.runtime)
    rt = _RUNTIME[0]
    return _active(rt.launch_enter_hook) or _active(rt.launch_exit_hook)


def key_of(kernel, kw: dict, device: int) -> tuple:
    """(the key a compiled specialization is kept under, the kernel's arguments in its order)."""
    names, _, get, _ = _params(kernel)
    args = get(kw)
    options = tuple(map(kw.get, _OPTIONS))
    if len(kw) != len(names) + len(options) - options.count(None):
        unknown = sorted(set(kw) - set(names) - set(_OPTIONS))
        raise TypeError(f"{kernel.__name__}: unknown arguments {unknown}")
    T = torch.Tensor  # every tensor's dtype and alignment, a float's type, a tensor descriptor's (_desc_spec),
    # anything else by value
    spec = tuple([(a.dtype, a.data_ptr() & 15 == 0) if isinstance(a, T) else
                  (float if type(a) is float else _desc_spec(a) if hasattr(a, "block_shape") else a) for a in args])
    return (id(kernel), device, options, spec), args


def _desc_spec(d) -> tuple:
    """What Triton specializes a host tensor descriptor (triton.tools.tensor_descriptor) on: its base's dtype, its
    block's shape and its padding (its base, shape and strides are values the launcher encodes on each call)."""
    return ("tensordesc", d.base.dtype, tuple(d.block_shape), d.padding)


def bind(kernel, grid, kw: dict):
    """A launcher of ``kernel`` over ``grid`` (up to three ints) with the keyword arguments ``kw``
    (the kernel's arguments and launch options), bound now: calling it launches. The first call of a
    specialization goes through Triton (compiling if needed); later ones launch the compiled kernel."""
    rec = recording()
    if not (DIRECT and _params(kernel)[1]):
        if rec is not None:
            return _recorded(rec, (kernel, grid, kw, None), lambda: kernel[grid](**kw))
        return lambda: kernel[grid](**kw)
    device = torch._C._cuda_getDevice()  # the current device (torch.cuda.current_device, without its checks)
    key, args = key_of(kernel, kw, device)
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]

    def launch():
        ck = _COMPILED.get(key)
        if ck is None or _hooked():
            ck = kernel[grid](**kw)
            ck = ck.result() if hasattr(ck, "result") else ck
            if all(hasattr(ck, a) for a in ("run", "function", "packed_metadata")):
                _COMPILED[key] = ck
            return
        ck.run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), ck.function, ck.packed_metadata,
               None, None, None, *args)
    if rec is not None:  # a call fastcall records: its launches are kept with the compiled kernel's key
        return _recorded(rec, (kernel, grid, kw, None if _hooked() else key), launch)
    return launch


_RECORDING = threading.local()  # .rec: fastcall's recording in progress in this thread, if any


def recording():
    """The recording of the public call this thread is running under fastcall.record, or None."""
    return getattr(_RECORDING, "rec", None)


def _recorded(rec, entry, launch):
    """launch, noting entry in the recording when it runs (the recipe keeps the launch order)."""
    def run():
        launch()
        rec.launches.append(entry)
    return run


def launch(kernel, grid, **kw) -> None:
    """Launch now (``bind(kernel, grid, kw)()``)."""
    bind(kernel, grid, kw)()


def cached() -> int:
    """How many compiled specializations are kept (tests)."""
    return len(_COMPILED)
