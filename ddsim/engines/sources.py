"""The source files an engine kernel's code comes from inside its own package, each with its sha256: what a report binds
an external kernel by (``provenance.engine.sources``), beside the digest of the file the kernel is defined in.

A kernel's behaviour lives in more files than its own: fla's GDN verify takes its exp, its softplus and its input guard
from ``fla.ops.utils`` and ``fla.utils``; a report bound by the entry file alone would still pass the gate after any of
those changed. The files taken are the kernel's module's and, transitively, those of the modules of the same top-level
package that a taken file's import statements name when the file is run (its module body, class bodies and
conditional imports included; a ``from M import name`` names M, and M.name where that is a module of its own). Read
from the files, not from what the process has imported, so every process that imports the kernel names the same files,
and nothing is imported to find them. Not followed: imports inside function bodies (made when called, if ever) or
under ``if TYPE_CHECKING:`` (never made: transformers' ``__init__`` names every model there), modules named by string
(importlib), a package's ``__init__`` that no import statement names (run on the way to a submodule, as Python
does; taking them would bind fla's GDN verify by 261 files instead of 9, ``fla/ops/__init__`` importing every op),
modules outside the package (torch, triton: bound by their versions). A compiled extension module of the package
that an import statement names (``import vllm._C``, which registers vLLM's custom ops) is taken as its binary (its
digest binds it; nothing in it is followed)."""
import ast
import inspect
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from ddsim.digest import file_digest


class _RunImports(ast.NodeVisitor):
    """The modules a file's import statements name where they run on import: not inside function bodies, nor under
    ``if TYPE_CHECKING:``."""

    def __init__(self, package: str):
        self.package, self.names = package, set()

    def visit_FunctionDef(self, node):  # noqa: N802 (ast's visitor names)
        pass

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_If(self, node):  # noqa: N802
        """`if TYPE_CHECKING:` imports never run (transformers' __init__ names every model there): its else only."""
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node):  # noqa: N802
        self.names.update(alias.name for alias in node.names)

    def visit_ImportFrom(self, node):  # noqa: N802
        if node.level:  # relative to the file's package: `from . import x` in a.b.c is a.b's x
            parts = self.package.split(".") if self.package else []
            if node.level - 1 >= len(parts):
                return  # beyond the top-level package: not importable
            base = parts[:len(parts) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module
        self.names.add(module)
        self.names.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")


def _file_of(name: str, root: Path) -> Path | None:
    """The file of module ``name`` (a.b.c): c.py, c/__init__.py or a compiled c (c.cpython-311-x86_64-linux-gnu.so,
    c.abi3.so, ...) in the directories of its package a.b where that is imported (its __path__: a package mapped to
    another directory, as an editable install maps ddsim's), else under ``root`` (a/b/c.py, ...), else the file the
    imported module has; None where it has none (a namespace package, no such module)."""
    parent, _, leaf = name.rpartition(".")
    dirs = [Path(d) for d in getattr(sys.modules.get(parent), "__path__", None) or []] if parent else []
    dirs.append(root.joinpath(*name.split(".")[:-1]))
    for d in dirs:  # as Python's path finder looks: the package, then an extension, then a source file
        for p in (d / leaf / "__init__.py", *(d / f"{leaf}{suffix}" for suffix in EXTENSION_SUFFIXES), d / f"{leaf}.py"):
            if p.is_file():
                return p
    where = getattr(sys.modules.get(name), "__file__", None)
    return Path(where) if where and where.endswith((".py", *EXTENSION_SUFFIXES)) and Path(where).is_file() else None


def _root(top: str) -> Path | None:
    """The directory a package's files are named from: the one that holds the top-level package (or module)."""
    mod = sys.modules.get(top)
    where = getattr(mod, "__file__", None)
    if where:
        p = Path(where).resolve()
        return p.parent.parent if p.name == "__init__.py" else p.parent
    paths = list(getattr(mod, "__path__", []) or [])  # a namespace package: no __init__.py
    return Path(paths[0]).resolve().parent if paths else None


def reached_modules(module: str) -> dict[str, Path]:
    """{module name: its source file}: ``module`` and the modules of its top-level package its files' import
    statements name, transitively (the module docstring); empty where ``module`` has no source file."""
    top = module.split(".")[0]
    root = _root(top)
    if root is None:
        return {}
    found, todo = {}, [module]
    while todo:
        name = todo.pop()
        path = _file_of(name, root)
        if path is None or name in found:
            continue
        found[name] = path
        if path.suffix != ".py":  # a compiled extension: its digest binds it, its imports cannot be read
            continue
        visitor = _RunImports(name if path.name == "__init__.py" else name.rpartition(".")[0])
        try:
            visitor.visit(ast.parse(path.read_bytes(), filename=str(path)))
        except (SyntaxError, ValueError):  # a file Python could not have run: the digest alone binds it
            continue
        # in name order (a set's order is the process's hash seed's): the same walk, and the same dict, every run
        todo.extend(sorted(n for n in visitor.names if (n == top or n.startswith(top + ".")) and n not in found))
    return found


def kernel_sources(fn) -> tuple[tuple[str, str], ...]:
    """((path, sha256), ...), sorted by path: the files of reached_modules(fn's module), each path relative to the
    directory holding the package (``fla/ops/utils/op.py``), or absolute where a file lies outside it; () where ``fn``
    has no module with a source file."""
    try:
        module = getattr(inspect.unwrap(fn), "__module__", None)
    except ValueError:  # a __wrapped__ cycle
        return ()
    if not isinstance(module, str) or module not in sys.modules:
        return ()
    root = _root(module.split(".")[0])
    files = {}
    for path in reached_modules(module).values():
        p = path.resolve()
        key = p.relative_to(root).as_posix() if root is not None and p.is_relative_to(root) else str(p)
        files[key] = file_digest(p)
    return tuple(sorted(files.items()))
