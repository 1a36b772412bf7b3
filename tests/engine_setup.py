"""Test setup for `ddsim check-kernel --impl sglang`: SGLang's GDN kernel module at a pinned release,
taken from its wheel (downloaded with --no-deps: SGLang's own dependencies are a serving stack), with
shims for the two helper modules it imports, into the engines folder the tests put on the path.
The shims live here, in the test fixture; the adapter (ddsim/engines/sglang.py) imports the kernel
exactly as it would from an installed SGLang.

    python tests/engine_setup.py .engines      # run by the Makefile's setup
"""
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SGLANG = "sglang==0.5.23"
FROM_WHEEL = ["sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py", "sglang/version.py",
              "sglang/_version.py"]
# what the kernel module imports besides torch and triton, answered for a machine without SGLang's
# runtime (no PDL, no AMD, architecture unknown: the kernel's portable launch path)
SHIMS = {
    "sglang/kernels/jit/utils.py": "def is_arch_support_pdl():\n    return False\n",
    "sglang/srt/utils.py": "".join(f"def {name}():\n    return {value}\n\n\n" for name, value in (
        ("get_device_sm", 0), ("is_cuda", False), ("is_gfx95_supported", False), ("is_hip", False),
        ("is_sm90_supported", False))),
}


def main(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", d, SGLANG], check=True)
        wheel = next(Path(d).glob("sglang-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            for name in FROM_WHEEL:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                (dest / name).write_bytes(z.read(name))
    for name, text in SHIMS.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    for folder in [dest / "sglang", *(p for p in (dest / "sglang").rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
