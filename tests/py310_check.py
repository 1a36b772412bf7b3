"""The oldest supported Python (3.10), run by `make test` where the machine has a python3.10:

1. every module of the package byte-compiles under 3.10's grammar;
2. in a small venv of its own (VENV, made once: pydantic, numpy, rich, tomli, jinja2 and the project with
   --no-deps; no torch, which has no 3.10 wheel on this machine's disk), `python -m ddsim --version` runs
   and the gate evaluates a committed report without a recheck (tomli reading the policy), exiting 1 with
   the leak's violations, as under 3.11.

    python3.10 tests/py310_check.py .venv310
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
assert sys.version_info[:2] == (3, 10), f"run me with python3.10, not {sys.version.split()[0]}"


def compile_all() -> int:
    n = 0
    for folder in ("ddsim", "oracle", "gpu_backend", "reports", "properties", "tests"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            compile(f.read_text(), str(f), "exec")
            n += 1
    return n


def venv(path: Path) -> Path:
    py = path / "bin" / "python"
    stamp = path / ".ddsim-py310"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        from venv_setup import install  # uv where it can be had, else pip (tests/venv_setup.py)
        install(str(py), ["setuptools>=68", "pydantic>=2.7", "numpy>=1.24", "rich>=13", "tomli>=2", "jinja2>=3.1"])
        stamp.write_text("ok\n")
    # the project itself, fresh each run, without its dependencies (torch and triton stay out)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--force-reinstall", str(ROOT)], check=True, cwd="/")
    return py


def main() -> None:
    print(f"py310: {compile_all()} modules compile under Python {sys.version.split()[0]}")
    py = venv(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / ".venv310")
    env = {**os.environ, "PYTHONPATH": ""}
    v = subprocess.run([str(py), "-m", "ddsim", "--version"], capture_output=True, text=True, cwd="/", env=env)
    assert v.returncode == 0 and v.stdout.startswith("ddsim "), (v.stdout, v.stderr)
    g = subprocess.run([str(py), "-m", "ddsim", "gate", "--policy", "hybrid-unsafe", "--no-recheck", "--report",
                        str(ROOT / "tests" / "data" / "report-micro-leak.json")], capture_output=True, text=True, cwd="/",
                       env=env)
    assert g.returncode == 1, (g.returncode, g.stdout, g.stderr)
    assert "VIOLATED silent_corruption_steps" in g.stdout and "taken on trust" in g.stdout, g.stdout
    print(f"py310: {v.stdout.strip()} runs; the gate on a committed report exits 1 with its violations")


if __name__ == "__main__":
    main()
