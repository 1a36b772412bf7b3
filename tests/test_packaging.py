"""The installed package is the one namespace the README promises: every sub-package of ddsim/ and
every mapped top-level folder is listed for setuptools (an unlisted one works in the editable
install and is missing from a wheel), and nothing else installs at the top level."""
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_under_the_ddsim_namespace():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    assert all(p == "ddsim" or p.startswith("ddsim.") for p in listed)
    found = set()
    for name, folder in dirs.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found == listed, (sorted(found - listed), sorted(listed - found))


def test_the_cpu_path_runs_without_triton(tmp_path):
    """Triton is required only on Linux x86-64 / aarch64 (where it ships wheels): elsewhere the pure-torch
    CPU path serves every call. With triton unimportable, a CPU audit runs and the gate reads it."""
    import os
    import subprocess
    import sys
    code = ("import sys\n"
            "class NoTriton:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'triton': raise ImportError('no triton on this platform')\n"
            "sys.meta_path.insert(0, NoTriton())\n"
            "from ddsim.cli import main\n"
            f"sys.exit(main(['audit', '--preset', 'micro', '--budget', '8', '--steps', '2', '--device', 'cpu', '--out', "
            f"{str(tmp_path / 'r')!r}]))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "r" / "report.json").is_file() and "triton" not in r.stderr.lower()


def test_the_property_suites_run_from_outside_the_checkout(tmp_path):
    """docs/testing.md runs the property suites on a GPU from outside the checkout (`cd /tmp && python -m pytest
    <checkout>/properties --import-mode=importlib`), where the checkout is not on the import path: the root conftest
    and its collection hook import from the installed namespace only (a hook importing from tests/ stopped every
    collection there)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "properties" / "test_trees.py"), "--import-mode=importlib",
                        "-p", "no:cacheprovider", "-q", "--co"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert " collected" in r.stdout.splitlines()[-1], r.stdout[-500:]
