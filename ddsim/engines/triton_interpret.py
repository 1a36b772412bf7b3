"""Running engines' Triton kernels on the CPU, in Triton's interpreter (TRITON_INTERPRET=1).

Two interpreter defects are worked around here; compiled kernels on a GPU never see this code.

- A mask built as ``scalar_bool & block_bool`` (SGLang's causal_conv1d_update does this) comes out of
  the interpreter's numpy arithmetic as int64, and the interpreter's masked load and store refuse any
  mask that is not bool. Nonzero is true either way, so the masked load and store cast such a mask to
  bool; a bool mask passes unchanged (a mask comes as a TensorHandle, or as the numpy array itself from Triton 3.6's
  descriptor and block-pointer accesses: ``as_bool_mask`` and the bounds check read both).
- The interpreter stores bfloat16 values as their uint16 bit patterns and does arithmetic on those
  integers (a bf16 ``x * w`` came out as 1e35). Arithmetic on bf16 operands is done here in float32
  and rounded back to bf16, as a GPU's bf16 instructions round; comparisons return their bools.

And one missing piece: an autotuned kernel times its configurations on a GPU driver the interpreter lacks;
interpreted, it runs its first configuration.

And one check: a compiled kernel that reads or writes past its tensors faults on a GPU, or reads a neighbour's
memory and goes on, while the interpreter reads or writes host memory wherever its pointers point. ``check_bounds``
makes every interpreted load and store fail where a lane it does not mask off points outside every tensor the launch
was given (its storage: a view may reach the rest of its storage, as on a GPU), naming the kernel, the access and the
nearest argument; the root conftest installs it for every test run in the interpreter, and ``prepare`` for
the command line's (check-kernel's engine kernels on the CPU).

And one cost: at every launch the interpreter re-patches triton.language's builtins, listing each module's
members with inspect.getmembers (a third of an engine kernel's interpreted time). ``cache_builtin_names``
lists them once per module; each launch still patches exactly the members that are builtins at that moment.
It patches them again at every call of a @triton.jit helper inside the kernel, though the launch has patched the
same modules already and restores them when it ends (a fifth of ddsim's drop-in's interpreted time, its path kernel
calling its helpers at every step): ``patch_once_per_launch`` skips a helper's patching where the running launch
patched every language module the helper's globals name, and patches as before where it did not.

And one incompatibility: Triton 3.6's interpreter converts a tensor used as a Python int with int() of its
one-element data array, which numpy 2.4 refuses; ``index_one_element_arrays`` takes the element
(triton-lang/triton#9171).
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings

import numpy as np


def cache_builtin_names() -> bool:
    """Make the interpreter's per-launch patching of builtins list each module's builtin names once (Triton
    versions whose ``_patch_builtin(pkg, builder, scope)`` this was written against; others are left alone).
    True when installed."""
    import inspect

    from triton.runtime import interpreter
    original = interpreter._patch_builtin
    if getattr(original, "_ddsim_cached", False):
        return True
    if list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"] or \
            not hasattr(interpreter, "_patch_attr"):
        return False
    import triton.language as tl
    names: dict = {}

    def _patch_builtin(pkg, builder, scope):
        listed = names.get(pkg)
        if listed is None:  # the first launch, with every member unpatched: the names of the builtins
            listed = names[pkg] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in listed:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):  # as the original: a member patched already is left as it is
                interpreter._patch_attr(pkg, name, member, builder, scope)
    _patch_builtin._ddsim_cached = True
    interpreter._patch_builtin = _patch_builtin
    return True


class _OneElement:
    """A stand-in for an interpreted tensor whose data is a one-element array (what ``range(n)`` or an index hands
    ``__index__`` for a scalar loaded in a kernel)."""

    class handle:
        data = np.array([3])


def index_one_element_arrays() -> bool:
    """Make the interpreter's ``tensor.__index__`` take the one element of a tensor's one-element data array where
    Triton's own gives it to int() whole: numpy 2.4 refuses that conversion (TypeError: only 0-dimensional arrays can
    be converted to Python scalars), so every launch of a kernel that uses a loaded scalar as a Python int (a loop
    bound, an index) failed under Triton 3.6's interpreter (triton-lang/triton#9171, fixed upstream the same way:
    the element taken). Wraps ``_patch_lang_tensor(tensor, scope)``; at each launch, after Triton's patching, its ``__index__``
    is tried on a one-element array and replaced only where it raises (a Triton with the fix, or a numpy before 2.4,
    keeps its own). Triton versions whose patching goes through a scope (3.6 to 3.9); others are left alone. True
    when installed."""
    import inspect

    from triton.runtime import interpreter
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if getattr(original, "_ddsim_index", False):
        return True
    if original is None or list(inspect.signature(original).parameters) != ["tensor", "scope"]:
        return False

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        try:
            with warnings.catch_warnings():  # (numpy 1.25 to 2.3 warn where 2.4 raises)
                warnings.simplefilter("error", DeprecationWarning)
                tensor.__index__(_OneElement)
        except (TypeError, DeprecationWarning):  # the scope restores Triton's own at the launch's end, then the original
            scope.set_attr(tensor, "__index__",
                           lambda self: int(self.handle.data.item()) if self.handle.data.size == 1 else int(self.handle.data))
    _patch_lang_tensor._ddsim_index = True
    interpreter._patch_lang_tensor = _patch_lang_tensor
    return True


_PATCHED = threading.local()  # .langs: ids of the language modules the running launch patched (None: none yet, or
# no launch running); .launching: a launch (GridExecutor's call) is running


def patch_once_per_launch() -> bool:
    """Make a @triton.jit helper's call inside an interpreted kernel skip the interpreter's re-patching of
    triton.language where the running launch has patched every language module (triton.language, its core) the
    helper's globals name; the launch's own patching and its restore at the end, a helper naming another module, and
    any call outside a launch are as before. Triton versions whose GridExecutor's call patches by ``_patch_lang(fn)``,
    which this was written against; others are left alone. True when installed."""
    import inspect

    from triton.runtime import interpreter
    original, run = interpreter._patch_lang, interpreter.GridExecutor.__call__
    if getattr(original, "_ddsim_once", False):
        return True
    if list(inspect.signature(original).parameters) != ["fn"] or not hasattr(interpreter, "_LangPatchScope"):
        return False
    import triton.language as tl

    def langs(fn):  # as the original finds them
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def _patch_lang(fn):
        active = getattr(_PATCHED, "langs", None)
        if active is None:  # a launch's own patching (restored when its grid has run, or failed), or outside one
            scope = original(fn)
            if getattr(_PATCHED, "launching", False):
                _PATCHED.langs = langs(fn)
            return scope
        mine = langs(fn)  # a helper's call inside a launch (its scope is never restored, as in Triton's)
        if mine <= active:
            return interpreter._LangPatchScope()
        _PATCHED.langs = active | mine
        return original(fn)

    def __call__(self, *args, **kwargs):
        with launching():
            return run(self, *args, **kwargs)
    _patch_lang._ddsim_once, _patch_lang._ddsim_original = True, original
    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = __call__
    return True


@contextlib.contextmanager
def launching():
    """While a launch runs (patch_once_per_launch's GridExecutor call): the first patching is the launch's."""
    _PATCHED.launching, _PATCHED.langs = True, None
    try:
        yield
    finally:
        _PATCHED.launching, _PATCHED.langs = False, None


class OutOfBounds(RuntimeError):
    """An interpreted kernel's load or store with a lane, not masked off, outside every tensor it was given."""


_LAUNCH = threading.local()  # .fn, .ranges: the running launch's kernel name and its arguments' (name, lo, hi) bytes


def _arguments(self, args_hst, kwargs_hst) -> None:
    """The byte ranges [lo, hi) of one launch's tensor arguments' storages (a host tensor descriptor's base's; a
    tuple's members'), kept as the running launch's."""
    ranges = []

    def add(name, a):
        if isinstance(a, tuple):
            for i, x in enumerate(a):
                add(f"{name}[{i}]", x)
            return
        if hasattr(a, "block_shape") and hasattr(a, "base"):
            a = a.base
        if hasattr(a, "untyped_storage"):
            st = a.untyped_storage()
            ranges.append((name, st.data_ptr(), st.data_ptr() + st.nbytes()))
    for name, a in zip(self.arg_names, args_hst):
        add(name, a)
    for name, a in kwargs_hst.items():
        add(name, a)
    _LAUNCH.fn, _LAUNCH.ranges = getattr(self.fn, "__name__", "kernel"), ranges


def _mask_data(mask) -> np.ndarray:
    """A load's or store's mask as the builder is given it: a TensorHandle, or (Triton 3.6's descriptor and
    block-pointer accesses) the numpy array itself, whose ``.data`` is its raw buffer."""
    return mask if isinstance(mask, np.ndarray) else mask.data


def as_bool_mask(mask):
    """``mask`` with bool data, in the form it came in (a TensorHandle or a numpy array); a bool mask unchanged."""
    from triton.runtime import interpreter
    data = _mask_data(mask)
    if data.dtype == np.bool_:
        return mask
    return data.astype(np.bool_) if isinstance(mask, np.ndarray) else interpreter.TensorHandle(data.astype(np.bool_),
                                                                                              mask.dtype)


def _check_access(what: str, ptrs, mask, width: int) -> None:
    """Raise OutOfBounds where a lane of ``ptrs`` (a TensorHandle of addresses) that ``mask`` keeps reads or writes
    ``width`` bytes outside every argument of the running launch."""
    ranges = getattr(_LAUNCH, "ranges", None)
    if ranges is None:  # a builder call outside a launch: nothing to hold it to
        return
    p = ptrs.data if mask is None else ptrs.data[np.broadcast_to(_mask_data(mask).astype(np.bool_), ptrs.data.shape)]
    p = np.asarray(p, dtype=np.uint64).ravel()
    if p.size == 0:
        return
    inside = np.zeros(p.shape, dtype=np.bool_)
    for _, lo, hi in ranges:
        inside |= (p >= lo) & (p + width <= hi)
    if inside.all():
        return
    out = int(p[~inside][0])
    where = "no tensor given"
    if ranges:
        name, lo, hi = min(ranges, key=lambda r: min(abs(out - r[1]), abs(out - r[2])))
        where = f"{out - lo} bytes from the start of {name}'s storage of {hi - lo} bytes"
    raise OutOfBounds(f"kernel {_LAUNCH.fn}: a {what} of {width} bytes outside every tensor argument in "
                      f"{int((~inside).sum())} of {p.size} lanes, the first {where}")


def check_bounds() -> bool:
    """Hold every interpreted launch's masked-in loads and stores to its tensor arguments' storages (OutOfBounds
    otherwise). True when installed (on Triton versions whose interpreter keeps a launch's host arguments in
    GridExecutor._init_args_hst and its memory accesses in InterpreterBuilder.create_masked_load / _store, which
    this was written against); False where those are missing, and nothing changed."""
    import inspect

    from triton.runtime import interpreter
    grid, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    if getattr(builder, "_ddsim_bounds", False):
        return True
    if not all(hasattr(x, n) for x, n in ((grid, "_init_args_hst"), (builder, "create_masked_load"),
                                          (builder, "create_masked_store"), (interpreter, "_get_np_dtype"))) or \
            list(inspect.signature(grid._init_args_hst).parameters) != ["self", "args_dev", "kwargs"]:
        return False
    init, load, store = grid._init_args_hst, builder.create_masked_load, builder.create_masked_store

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        _arguments(self, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    def create_masked_load(self, ptrs, mask, *rest, **kw):  # (a descriptor's load names its policies)
        width = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        _check_access("load", ptrs, mask, width)
        return load(self, ptrs, mask, *rest, **kw)

    def create_masked_store(self, ptrs, value, mask, *rest, **kw):
        _check_access("store", ptrs, mask, value.data.dtype.itemsize)
        return store(self, ptrs, value, mask, *rest, **kw)

    grid._init_args_hst = _init_args_hst
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    builder._ddsim_bounds = True
    return True


def bounds_checked() -> bool:
    """Whether check_bounds is installed in this process."""
    from triton.runtime import interpreter
    return bool(getattr(interpreter.InterpreterBuilder, "_ddsim_bounds", False))


def _first_config_when_interpreted() -> None:
    """An autotuned kernel (fla's common fused recurrence is one) times its configurations on a GPU driver the
    interpreter does not have: interpreted, it runs its first configuration (the configurations differ only in
    launch parameters, which the interpreter ignores)."""
    from triton.runtime.autotuner import Autotuner
    if getattr(Autotuner, "_ddsim_first_config", False):
        return
    run = Autotuner.run

    def first_config_run(self, *args, **kwargs):
        if len(self.configs) > 1:
            self.configs = self.configs[:1]
        return run(self, *args, **kwargs)
    Autotuner.run = first_config_run
    Autotuner._ddsim_first_config = True


def interpreter_turned_off() -> str | None:
    """TRITON_INTERPRET's value where it is set and Triton reads it as off (its kernels then compile for a GPU and
    refuse CPU tensors), else None."""
    from ddsim.gpu_backend._common import interpreting  # imports no Triton kernel: safe before prepare()
    value = os.environ.get("TRITON_INTERPRET")
    return value if value is not None and not interpreting() else None


def prepare() -> None:
    """Set TRITON_INTERPRET=1 (before triton is imported) and apply the fixes once."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    cache_builtin_names()
    patch_once_per_launch()
    index_one_element_arrays()
    check_bounds()  # an engine's kernel that reads or writes past its tensors fails its check, as on a GPU it may fault
    import torch
    from triton.runtime import interpreter

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()

    _first_config_when_interpreted()
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_ddsim_bool_masks", False):
        return

    load, store = builder.create_masked_load, builder.create_masked_store

    # the builder's trailing arguments (cache and eviction policies, volatility) differ between
    # Triton versions (3.6 passes one more than 3.9): passed on as they come
    def create_masked_load(self, ptrs, mask, *rest, **kw):
        return load(self, ptrs, as_bool_mask(mask), *rest, **kw)

    def create_masked_store(self, ptrs, value, mask, *rest, **kw):
        return store(self, ptrs, value, as_bool_mask(mask), *rest, **kw)

    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store

    import triton.language as tl
    binary, unary = builder.binary_op, builder.unary_op

    def bf16(h) -> bool:
        return h.dtype.scalar == tl.bfloat16

    def back(self, out):
        """A float32 result of bf16 arithmetic rounded back to bf16 (bools and integers unchanged)."""
        return self.cast_impl(out, tl.bfloat16) if out.data.dtype == np.float32 else out

    def binary_op(self, lhs, rhs, op):
        if bf16(lhs) or bf16(rhs):
            f32 = lambda h: self.cast_impl(h, tl.float32) if bf16(h) else h  # noqa: E731
            return back(self, binary(self, f32(lhs), f32(rhs), op))
        return binary(self, lhs, rhs, op)

    def unary_op(self, arg, op):
        if bf16(arg):
            return back(self, unary(self, self.cast_impl(arg, tl.float32), op))
        return unary(self, arg, op)

    builder.binary_op, builder.unary_op = binary_op, unary_op
    builder._ddsim_bool_masks = True
