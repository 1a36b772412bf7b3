"""Replayed launches: the public GDN verify and commit at the cost of a C++ call.

Through Python, one call of ``gdn_tree_verify`` with a TreePlan takes 40-70 us of host time on the
H200's lent hosts (RESULTS.md): the checks, the output's allocation and the launch call are each a few
microseconds of interpreted code. At one sequence the kernel itself takes about 8 us, so the public
function was host-bound at 5-6x the kernel.

What a call does is fixed by the plan and its arguments' signatures: the same checks pass, the same
kernels launch with the same grids and scalars, only the data pointers change. So the first call of a
signature on a plan runs the Python path under a recorder (``record``), which keeps what it did as a
recipe on the plan (fastcall.cpp): every argument's signature (a tensor's type, sizes, strides, dtype,
device and 16-byte alignment; any other argument's type and value), each output and scratch buffer it
allocated, and each kernel launch (Triton's compiled function, grid, block, shared memory, and every
parameter as an argument's pointer, an allocation's pointer or fixed bytes). Every later call on that
plan goes to ``call`` first: a call whose arguments match a recipe is served in C++ (allocate, launch
with cuLaunchKernel on the current stream, return the outputs); any other call runs the Python path,
which validates it in full and raises as before, and records a recipe if it passes.

A recipe is kept only when everything the launches read is accounted for: each tensor a kernel gets is
an argument of the call itself, a buffer the call allocated, a table the TreePlan built, one of the
launchers' read-only constants, or the tensor of a CheckedSlots / CheckedIndices argument (matched by
identity: validated once, immutable). A copy made for the call (a non-contiguous input made contiguous,
a dtype conversion) is none of these, so such calls are never replayed (the public functions tell the
known case apart before recording: data in a layout the kernels do not read, _common.rows_of). One tensor passed as two
arguments (zeros as both A_log and dt_bias) is recorded with the alias: a replay requires one object in
both places again, since the kernels read it through the first one's pointer. Raw ``state_indices`` or
``accepted`` (value-checked with a host sync on every call) are never replayed either. Nor are launches
Triton would not make with cuLaunchKernel (programmatic dependent launch, clusters, cooperative grids,
scratch memory), or calls while a launch hook is installed (profilers) or while a CUDA graph is being
captured (the first, recording call; replayed calls are captured like any launch). Only calls on the
current CUDA device are recorded or replayed (a model placed over several GPUs calls its other devices'
layers under a device guard: those take the Python path).

What a recipe replays was decided when it was recorded, so the launchers' module settings
(triton_wy_split.MAXNREG, FOLD_DEFAULTS, launch.DIRECT aside: replays stop while it is False) apply
to plans built after they change. A plan records at most MAX_RECIPES calls per function (one TreePlan
per tree per step, one signature per layer kind: one or two are used); the recording state is per thread.

The extension is built on first use with torch.utils.cpp_extension (ninja and a C++ compiler; 12-16 s
measured, then cached under torch's extensions folder). Where it cannot be built, or with
DDSIM_FASTCALL=0, every call takes the Python path; ``status()`` says which. Installing a Triton launch
hook after a recipe was recorded does not see the replayed launches: set DDSIM_FASTCALL=0 when
profiling through Triton's hooks.
"""
from __future__ import annotations

import contextlib
import functools
import os
import struct
import threading

import torch

ENABLED = os.environ.get("DDSIM_FASTCALL", "1") != "0"
# Triton releases whose launcher ABI (the parameters cuLaunchKernel gets, the two scratch pointers 3.6
# appends included) the replay was checked against, bit for bit, on a GPU: on any other release a GPU
# call takes the Python path (Triton's own launcher), since a wrong parameter layout would launch
# a kernel with wrong pointers
CHECKED_TRITON = ("3.6",)


@functools.lru_cache(maxsize=1)
def _triton_minor() -> str | None:
    """Triton's major.minor, read once a process: importlib.metadata's lookup takes about 0.5 ms, which every call
    that records or is refused a recipe (raw indices on every call) would otherwise pay."""
    try:
        from importlib.metadata import version
        return ".".join(version("triton").split(".")[:2])
    except Exception:  # noqa: BLE001 (no triton, or no metadata: nothing is replayed)
        return None


def launcher_abi_checked() -> bool:
    """Whether this Triton's launcher ABI is one the replay was checked against (CHECKED_TRITON)."""
    return _triton_minor() in CHECKED_TRITON
MAX_RECIPES = 4  # calls recorded per plan and function, kept or refused; then every new signature takes the Python path

ARG, ALLOC, FIXED = 0, 1, 2
_EXT: list = []  # [module or None, why not]
_LOCK = threading.Lock()
_STATS = {"recorded": 0, "refused": {}}

# bytes of a kernel parameter of each Triton signature type (the little-endian value in an 8-byte slot)
_PACK = {"i1": "<b", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u1": "<B", "u8": "<B", "u16": "<H",
         "u32": "<I", "u64": "<Q", "fp16": "<e", "fp32": "<f", "f32": "<f", "fp64": "<d"}


def ext():
    """The compiled extension (built on first use), or None where it cannot be had."""
    if _EXT:
        return _EXT[0]
    with _LOCK:
        if not _EXT:
            _EXT.extend(_build())
    return _EXT[0]


def compile_extension():
    """fastcall.cpp compiled and loaded by torch.utils.cpp_extension (cached under torch's extensions folder,
    keyed by the source and flags: a second call, in any process, loads the cached build). Needs only torch,
    ninja and a C++ compiler, not ddsim: `make setup` runs it from this file alone while pip installs the rest."""
    from torch.utils.cpp_extension import load
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastcall.cpp")
    return load(name="ddsim_fastcall", sources=[src], extra_cflags=["-O2"], verbose=False)


def _build():
    if not ENABLED:
        return [None, "disabled (DDSIM_FASTCALL=0)"]
    try:
        mod = compile_extension()
    except Exception as e:  # no compiler, no ninja, no headers: the Python path serves every call
        return [None, f"not built: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"]
    from ddsim.gpu_backend import checks
    mod.set_poison_flag(checks._POISON)
    return [mod, "built"]


_OFF = [False]


@contextlib.contextmanager
def python_path():
    """Record no recipe inside the block (the benches time the Python path on a plan without recipes)."""
    before, _OFF[0] = _OFF[0], True
    try:
        yield
    finally:
        _OFF[0] = before


def status() -> str:
    """'built', 'disabled (DDSIM_FASTCALL=0)', 'not built: <why>', or 'not loaded yet'; and on a GPU with a
    Triton whose launcher ABI was not checked, that no call is replayed."""
    s = _EXT[1] if _EXT else "not loaded yet"
    if torch.cuda.is_available() and not launcher_abi_checked():
        s += f" (Triton {_triton_minor()}: launcher ABI not checked, every GPU call takes the Python path)"
    return s


def stats() -> dict:
    """Recipes recorded, calls refused a recipe (by reason) and calls served in C++ (tests, benches)."""
    mod = _EXT[0] if _EXT else None
    return {"recorded": _STATS["recorded"], "refused": dict(_STATS["refused"]),
            "served": mod.calls() if mod is not None else 0}


# ---- recording ------------------------------------------------------------------------------------
class _RecordingState:
    def __init__(self):
        self.launches: list = []  # (kernel, grid, kw, key) in the order launched
        self.allocs: list = []  # (tensor, poisonable) in the order allocated


def skip(reason: str) -> None:
    """A call the public functions did not record (told apart before recording), counted by reason."""
    _refuse(reason)


def _refuse(reason: str):
    _STATS["refused"][reason] = _STATS["refused"].get(reason, 0) + 1
    return None


def record(plan, op: str, args: tuple, tensor_positions: frozenset, owners: tuple, run):
    """Run the Python path ``run()`` (validating and launching as always) under a recorder and keep
    what it did as a recipe in ``plan.fast_<op>`` when it can be replayed. args: every argument of the
    public call, in the order ``call`` receives them; tensor_positions: the positions whose tensors a
    recipe may read (the data: never indices that are value-checked per call); owners: the TreePlan and
    the checked index objects whose tensors the kernels may read as fixed pointers. A plan records at
    most MAX_RECIPES calls per function, kept or refused (a caller whose calls are refused, such as the
    model's with views of its conv output, pays the recorder that many times a plan, then never).
    Returns run()'s result."""
    tries = plan.fast_tries
    if tries[op] >= MAX_RECIPES or _OFF[0]:
        return run()
    if any(isinstance(a, (torch.Tensor, list, tuple)) for i, a in enumerate(args) if i not in tensor_positions):
        # raw indices (accepted, state_indices), value-checked on every call: never replayed, and no try spent,
        # so the same plan's calls with checked indices are still recorded
        _refuse("raw indices, checked on every call")
        return run()
    if ext() is None or (torch.cuda.is_available() and (not launcher_abi_checked()
                                                        or torch.cuda.is_current_stream_capturing())):
        return run()
    from ddsim.gpu_backend.launch import _RECORDING  # where launch.bind and _common.alloc look
    rec = _RecordingState()
    _RECORDING.rec = rec
    try:
        result = run()  # bad input raises here, as on any call, and counts as no try
    finally:
        _RECORDING.rec = None
    tries[op] += 1
    recipe = _recipe(rec, args, tensor_positions, owners, result)
    if recipe is not None:
        getattr(plan, f"fast_{op}").append(recipe)
        _STATS["recorded"] += 1
    return result


def _stable_tensors(owners) -> dict:
    """id -> tensor of every tensor a kernel may read at a fixed address: the plan's cached tables, the
    checked index objects' tensors and the launchers' constants."""
    from ddsim.gpu_backend import checks
    found: dict = {}

    def add(x):
        if isinstance(x, torch.Tensor):
            found[id(x)] = x
        elif isinstance(x, (tuple, list)):
            for y in x:
                add(y)
    for o in owners:
        if isinstance(o, checks.TreePlan):
            add(list(o._cache.values()))
            add(o.parents)
        elif isinstance(o, (checks.CheckedSlots, checks.CheckedIndices)):
            add([o.indices, getattr(o, "rows", None)])
    add(list(checks._CONSTANTS.values()))
    return found


def _recipe(rec: _RecordingState, args: tuple, tensor_positions: frozenset, owners: tuple, result):
    from ddsim.gpu_backend import launch as launches
    if not rec.launches:
        return _refuse("no launch")
    by_id = {}
    aliases = {}  # position -> the earlier position holding the same tensor (a replay requires it there again)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if i not in tensor_positions:
                return _refuse("a tensor where a recipe takes none (raw indices are checked per call)")
            if id(a) in by_id:  # one tensor as two arguments (zeros as both A_log and dt_bias, say)
                aliases[i] = by_id[id(a)][1]
            else:
                by_id[id(a)] = (ARG, i)
    for j, (t, _) in enumerate(rec.allocs):
        by_id.setdefault(id(t), (ALLOC, j))
    stable = _stable_tensors(owners)
    device = None
    made = []
    for kernel, grid, kw, key in rec.launches:
        ck = launches._COMPILED.get(key) if key is not None else None
        if ck is None:
            return _refuse("a launch not through a compiled kernel (interpreter, hook, or not direct)")
        md = ck.metadata
        if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_pdl", False) or
                getattr(md, "launch_cooperative_grid", False) or getattr(md, "global_scratch_size", 0) or
                getattr(md, "profile_scratch_size", 0)):
            return _refuse("a launch that needs launch attributes or scratch memory")
        sig = getattr(ck.src, "signature", None)
        if not isinstance(sig, dict):
            return _refuse("a compiled kernel without its signature")
        device = key[1]
        params = []
        for name in kernel.arg_names:
            ty = sig.get(name)
            if ty == "constexpr":
                continue
            value = kw[name]
            if isinstance(ty, str) and ty.startswith("*"):
                if not isinstance(value, torch.Tensor):
                    return _refuse("a pointer parameter that is no tensor")
                where = by_id.get(id(value))
                if where is None:
                    if id(value) not in stable:
                        return _refuse("a tensor the call made (a copy or conversion), not an argument, allocation or table")
                    params.append((FIXED, struct.pack("<Q", value.data_ptr())))
                else:
                    params.append(where)
            elif ty in _PACK and isinstance(value, (bool, int, float)):
                packed = struct.pack(_PACK[ty], value)
                params.append((FIXED, packed + bytes(8 - len(packed))))
            else:
                return _refuse(f"a parameter of type {ty!r}")
        # Triton's launcher passes a pointer per scratch area after the kernel's own parameters (3.6: global
        # and profile scratch, null when unused); the compiled kernel declares them whatever their size
        params += [(FIXED, bytes(8))] * sum(hasattr(md, f) for f in ("global_scratch_size", "profile_scratch_size"))
        g = (tuple(grid) + (1, 1))[:3]
        made.append((ck.function, g[0], g[1], g[2], 32 * md.num_warps, md.shared, tuple(params)))
    outs = result if isinstance(result, tuple) else (result,)
    res = []
    for t in outs:
        where = by_id.get(id(t)) if isinstance(t, torch.Tensor) else None
        if where is None:
            return _refuse("an output that is no allocation or argument")
        res.append(where)
    positions = tuple(((True, a, aliases[i]) if i in aliases else (i in tensor_positions and isinstance(a, torch.Tensor), a))
                      for i, a in enumerate(args))
    keep = list(stable.values())  # tensors only: a reference to the plan would make a cycle through the capsule
    return ext().make(positions, tuple(rec.allocs), tuple(made), tuple(res), isinstance(result, tuple), device, keep)
