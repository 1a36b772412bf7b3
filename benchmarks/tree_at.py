"""The ddsim package of an earlier commit, laid out to import from a directory (PYTHONPATH=DIR), so that one device
command can time a benchmark at two commits back to back: the commit's ddsim/, oracle/, gpu_backend/, properties/
and reports/ (pyproject.toml's package-dir: each under ddsim/) from `git archive`, without the shipped model weights.

    python benchmarks/tree_at.py COMMIT DIR
    PYTHONPATH=DIR python benchmarks/bench_wy_defaults.py --commit COMMIT   # that commit's kernels
"""
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# where each installed subpackage lives in the repository (pyproject.toml's [tool.setuptools.package-dir])
PACKAGES = {"ddsim": "ddsim", "ddsim/oracle": "oracle", "ddsim/gpu_backend": "gpu_backend",
            "ddsim/properties": "properties", "ddsim/reports": "reports"}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tree_at.py COMMIT DIR")
    commit, out = sys.argv[1], Path(sys.argv[2])
    root = Path(__file__).resolve().parent.parent
    try:
        blob = subprocess.run(["git", "archive", commit, *PACKAGES.values()], cwd=root, capture_output=True,
                              check=True).stdout
    except subprocess.CalledProcessError as e:
        print(f"tree_at: commit {commit!r}: {e.stderr.decode().strip()}", file=sys.stderr)
        sys.exit(2)
    if out.exists() and not out.is_dir():
        print(f"tree_at: {out}: exists and is not a directory", file=sys.stderr)
        sys.exit(2)
    # laid out beside DIR, then put in its place: an interrupted run leaves DIR as it was
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.resolve().parent))
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for m in tar.getmembers():
            top, _, rest = m.name.partition("/")
            if not m.isfile() or rest.startswith("models/"):
                continue
            dest = next(k for k, v in PACKAGES.items() if v == top)
            path = tmp / dest / rest
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tar.extractfile(m).read())
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    print(f"{commit}: ddsim in {out}")


if __name__ == "__main__":
    main()
