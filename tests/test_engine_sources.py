"""ddsim.engines.sources: the files an engine kernel's code comes from in its package, which a report binds the kernel
by. Followed: the modules of the package a taken file's import statements name where they run on import (module
level, conditional, relative; a value imported from a module names that module); not followed: imports inside function
bodies or under TYPE_CHECKING, modules outside the package. Read from the files: the same whatever else the process imported, and nothing
imported to find them."""
import sys
import textwrap
from pathlib import Path

import pytest

from ddsim.digest import file_digest
from ddsim.engines.sources import kernel_sources, reached_modules

PKG = "ddsim_sources_case"  # a package of the test's own, written under tmp_path


@pytest.fixture
def package(tmp_path, monkeypatch):
    """Write PKG's files ({relative path: text}) and import from them; PKG's modules are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(files):
        for rel, text in files.items():
            p = tmp_path / PKG / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(textwrap.dedent(text))
        return tmp_path / PKG
    yield write
    for name in [n for n in sys.modules if n == PKG or n.startswith(PKG + ".")]:
        del sys.modules[name]


FILES = {
    "__init__.py": f"from {PKG}.reexported import shared\n",
    "reexported.py": "def shared(x):\n    return x\n",
    "helpers.py": f"""\
        import json

        import torch

        from {PKG}.consts import OFFSET
        from .rel import R

        try:
            from {PKG}.optional import missing
        except ImportError:
            missing = None


        class Scaler:
            def scale(self):
                from {PKG} import lazy  # a function body's: not followed
                return lazy.X


        def scale_of(s):
            return OFFSET + R + (1.0 if s is None else s)
        """,
    "consts.py": "OFFSET = 0.0\n",
    "rel.py": "R = 0.0\n",
    "tk.py": """\
        import triton
        import triton.language as tl


        @triton.autotune(configs=[triton.Config({})], key=[])
        @triton.jit
        def kern(x):
            pass
        """,
    "lazy.py": "X = 1\n",
    "runtime.py": "RUNTIME = 1\n",
    "unrelated.py": "Y = 2\n",
    "kernel.py": f"""\
        import functools
        import typing

        import {PKG} as package_root
        from {PKG} import helpers
        from {PKG} import shared
        from {PKG}.tk import kern

        if typing.TYPE_CHECKING:  # never run: not followed
            from {PKG} import unrelated
        else:
            from {PKG}.runtime import RUNTIME


        def lazily():
            from {PKG} import lazy
            return lazy.X


        @functools.lru_cache
        def verify(x):
            return helpers.scale_of(shared(x)), kern, package_root
        """,
}


def test_the_files_reached_from_the_kernels_module_and_no_others(package):
    root = package(FILES)
    import importlib
    kernel = importlib.import_module(f"{PKG}.kernel")
    want = {f"{PKG}/{f}" for f in ("kernel.py", "__init__.py", "helpers.py", "reexported.py", "tk.py", "consts.py",
                                   "rel.py", "runtime.py")}
    got = dict(kernel_sources(kernel.verify))
    assert set(got) == want, sorted(got)
    assert got[f"{PKG}/helpers.py"] == file_digest(root / "helpers.py")
    assert f"{PKG}.lazy" not in sys.modules  # nothing imported to find them
    for extra in ("lazy", "unrelated"):  # imported in this process, named by no import that runs: not the kernel's
        importlib.import_module(f"{PKG}.{extra}")
    assert dict(kernel_sources(kernel.verify)) == got
    assert list(reached_modules(f"{PKG}.kernel"))[0] == f"{PKG}.kernel"  # the kernel's own module first


def test_a_helper_changed_changes_its_digest_alone(package):
    root = package(FILES)
    import importlib
    kernel = importlib.import_module(f"{PKG}.kernel")
    before = dict(kernel_sources(kernel.verify))
    (root / "helpers.py").write_text(textwrap.dedent(FILES["helpers.py"]) + "# patched\n")
    after = dict(kernel_sources(kernel.verify))
    assert [p for p in before if before[p] != after[p]] == [f"{PKG}/helpers.py"]


def test_a_function_without_a_module_file_has_no_sources():
    assert kernel_sources(len) == ()  # builtins: no file
    assert kernel_sources(3) == ()  # nothing with a module
    assert kernel_sources(lambda: 0) != ()  # this test module's own file, under its package (tests)


def test_a_compiled_extension_named_by_an_import_is_bound_by_its_bytes(package):
    """vLLM's custom ops come from ``import vllm._C`` (a .so in its package): that binary is among the files, by its
    bytes; a .py of the same name beside it is not (Python loads the extension), and nothing is read inside it."""
    from importlib.machinery import EXTENSION_SUFFIXES
    ext = f"_ops{EXTENSION_SUFFIXES[0]}"
    root = package({"__init__.py": "", "_ops.py": "SHADOWED = 1\n", ext: "not an ELF file: import fails\n",
                    "kernel.py": f"""\
        try:
            from {PKG} import _ops
        except ImportError:
            _ops = None


        def verify(x):
            return x
        """})
    import importlib
    kernel = importlib.import_module(f"{PKG}.kernel")
    got = dict(kernel_sources(kernel.verify))
    assert set(got) == {f"{PKG}/kernel.py", f"{PKG}/__init__.py", f"{PKG}/{ext}"}, sorted(got)
    assert got[f"{PKG}/{ext}"] == file_digest(root / ext)
    (root / ext).write_bytes(b"another build\n")
    assert dict(kernel_sources(kernel.verify))[f"{PKG}/{ext}"] == file_digest(root / ext) != got[f"{PKG}/{ext}"]


ENGINES = Path(__file__).resolve().parents[1] / ".engines"  # the engines' releases make_engines installs


@pytest.mark.parametrize("impl, ops", [
    ("ddsim", ("", "conv", "mamba2", "kda", "lightning")), ("fla", ("", "kda", "lightning")),
    ("sglang", ("", "conv", "mamba2", "kda", "commit")), ("vllm", ("",))])
def test_every_op_of_an_adapter_is_bound_by_the_files_its_own_module_reaches(impl, ops, monkeypatch):
    """What check-kernel's JSON binds each op by (its ``{op}_sources``): the op's own file with that file's digest, and
    no op left with none: an op given another op's files (the GDN verify's, say) would name a file it is not in."""
    monkeypatch.syspath_prepend(str(ENGINES))
    from ddsim.engines import load
    kernel = load(impl)
    for op in ops:
        pre = f"{op}_" if op else ""
        source, digest = getattr(kernel, f"{pre}source"), getattr(kernel, f"{pre}source_sha256")
        sources = dict(getattr(kernel, f"{pre}sources"))
        # (a path from the package's directory, or an absolute one: ddsim's kernels where mutmut copies ddsim alone)
        own = [p for p in sources if Path(source).resolve().as_posix().endswith("/" + p.lstrip("/"))]
        assert len(own) == 1 and sources[own[0]] == digest == file_digest(source), (impl, op or "gdn", sorted(sources))


NESTED = {
    "__init__.py": "",
    "top_helper.py": "T = 1\n",
    "sub/__init__.py": "from . import inner\n",  # a package's own relative import: within PKG.sub
    "sub/inner.py": f"""\
        from ..top_helper import T
        try:
            from ...{PKG} import unrelated  # past the top-level package: never importable, not taken
        except ImportError:
            unrelated = None
        """,
    "sub/zz_broken.py": "def broken(:\n",  # no file Python can run: bound by its digest, nothing read in it
    "sub/kernel.py": f"""\
        from typing import TYPE_CHECKING

        from .. import top_helper
        try:
            from . import zz_broken
        except SyntaxError:
            zz_broken = None
        if TYPE_CHECKING:  # the bare name too: never run
            from {PKG} import unrelated
        if top_helper.T == 0:  # never true here: a branch this machine does not run is still the kernel's code
            from {PKG}.mapped import elsewhere_impl
            from {PKG}.sub2 import thing


        def verify(x):
            return x
        """,
    "unrelated.py": "U = 1\n",
    # a subpackage whose __path__ its __init__ points at another directory (as an editable install maps ddsim's)
    "mapped/__init__.py": "__path__[:] = [__import__('os').environ['DDSIM_SOURCES_ELSEWHERE']]\n",
    "sub2/__init__.py": "",
    "sub2/thing.py": "THING = 1\n",
}


def test_relative_imports_conditional_branches_and_a_mapped_package_in_a_nested_package(package, tmp_path_factory,
                                                                                        monkeypatch):
    """Relative imports at each level (a package's __init__'s within that package, a module's within its own), one
    climbing past the top (not taken), a file that does not parse (bound, not read, and the walk goes on), the bare
    TYPE_CHECKING (not taken), and a branch not run here (taken, though nothing of it is imported): a subpackage found
    by its __init__, and a module of a package mapped to another directory, named by its absolute path there."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # outside the directory holding the package
    (elsewhere / "elsewhere_impl.py").write_text("E = 1\n")
    monkeypatch.setenv("DDSIM_SOURCES_ELSEWHERE", str(elsewhere))
    root = package(NESTED)
    import importlib
    kernel = importlib.import_module(f"{PKG}.sub.kernel")
    importlib.import_module(f"{PKG}.mapped")  # the mapped package imported (its __path__ set), its module not
    assert f"{PKG}.mapped.elsewhere_impl" not in sys.modules and f"{PKG}.sub2" not in sys.modules
    got = dict(kernel_sources(kernel.verify))
    want = {f"{PKG}/{f}" for f in ("__init__.py", "top_helper.py", "sub/__init__.py", "sub/inner.py", "sub/zz_broken.py",
                                   "sub/kernel.py", "mapped/__init__.py", "sub2/__init__.py", "sub2/thing.py")}
    assert set(got) == want | {str((elsewhere / "elsewhere_impl.py").resolve())}, sorted(got)
    assert got[f"{PKG}/sub/zz_broken.py"] == file_digest(root / "sub" / "zz_broken.py")


def test_a_single_module_kernel_and_a_namespace_package_kernel(tmp_path, monkeypatch):
    """A kernel in a module of its own (`--fast-path my_kernel:verify`) is named from its directory; a namespace
    package's (no __init__.py) from the directory holding it; a module put in place by a loader of its own (no file
    where its package looks) by the file it was loaded from."""
    import importlib
    import importlib.util
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ddsim_flat_kernel.py").write_text("def verify(x):\n    return x\n")
    ns = tmp_path / "ddsim_ns_case"
    ns.mkdir()
    (ns / "kern.py").write_text("try:\n    from ddsim_ns_case import loaded\nexcept ImportError:\n    loaded = None\n\n\n"
                                "def verify(x):\n    return x\n")
    aside = tmp_path / "aside" / "loaded_from_here.py"
    aside.parent.mkdir()
    aside.write_text("L = 1\n")
    importlib.invalidate_caches()  # the files were written after the path's finders may have listed the directory
    try:
        flat = importlib.import_module("ddsim_flat_kernel")
        assert dict(kernel_sources(flat.verify)) == {"ddsim_flat_kernel.py": file_digest(tmp_path / "ddsim_flat_kernel.py")}
        importlib.import_module("ddsim_ns_case")
        spec = importlib.util.spec_from_file_location("ddsim_ns_case.loaded", aside)
        sys.modules["ddsim_ns_case.loaded"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["ddsim_ns_case.loaded"])
        kern = importlib.import_module("ddsim_ns_case.kern")
        assert dict(kernel_sources(kern.verify)) == {"ddsim_ns_case/kern.py": file_digest(ns / "kern.py"),
                                                     "aside/loaded_from_here.py": file_digest(aside)}
    finally:
        for name in [n for n in sys.modules if n.startswith(("ddsim_flat_kernel", "ddsim_ns_case"))]:
            del sys.modules[name]
