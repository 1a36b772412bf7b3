"""Test setup for `ddsim check-kernel --impl sglang|vllm`: each engine's GDN verify kernel module (and
SGLang's tree conv, Mamba2 selective_state_update and the commit's state scatter) at a
pinned release, taken from its wheel (downloaded with --no-deps: an engine's own dependencies are a
serving stack), with shims for the few helper modules it imports, into the engines folder the tests
put on the path. The shims live here, in the test fixture; the adapters (ddsim/engines/) import the
kernels exactly as they would from an installed engine.

    python tests/engine_setup.py .engines      # run by the Makefile's setup
"""
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# pinned release -> (files taken from its wheel, shims: path -> text)
ENGINES = {
    "sglang==0.5.23": (
        ["sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py",
         "sglang/kernels/ops/mamba/causal_conv1d_triton.py", "sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py",
         # its commit after a verify: the accepted node's kept state (and conv window) copied into the pool
         "sglang/kernels/ops/mamba/mamba_state_scatter_triton.py", "sglang/kernels/ops/memory/ptr_table.py",
         "sglang/version.py", "sglang/_version.py"],
        # what the kernel modules import besides torch and triton, answered for a machine without
        # SGLang's runtime (no PDL, no AMD, architecture unknown: the kernel's portable launch path)
        {"sglang/kernels/jit/utils.py": "def is_arch_support_pdl():\n    return False\n",
         "sglang/srt/utils/__init__.py": "".join(f"def {name}():\n    return {value}\n\n\n" for name, value in (
             ("get_device_sm", 0), ("is_cuda", False), ("is_gfx95_supported", False), ("is_hip", False),
             ("is_sm90_supported", False))),
         "sglang/srt/utils/common.py": "import torch\n\n\ndef get_device_core_count(device_id=0):\n"
                                       "    if torch.cuda.is_available():\n"
                                       "        return torch.cuda.get_device_properties(device_id).multi_processor_count\n"
                                       "    return 0\n"}),
    "vllm==0.33.0": (
        ["vllm/third_party/flash_linear_attention/ops/fused_sigmoid_gating.py", "vllm/version.py", "vllm/_version.py"],
        # vllm.triton_utils re-exports triton (and reads vLLM's environment and platform): just triton here
        {"vllm/triton_utils/__init__.py": "import triton\nimport triton.language as tl\n\n__all__ = ['tl', 'triton']\n"}),
}


def fetch(pin: str, dest: Path) -> None:
    files, shims = ENGINES[pin]
    name = pin.split("==")[0]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", d,
                        pin], check=True)
        wheel = next(Path(d).glob(f"{name}-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            for f in files:
                (dest / f).parent.mkdir(parents=True, exist_ok=True)
                (dest / f).write_bytes(z.read(f))
    for f, text in shims.items():
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        (dest / f).write_text(text)
        if f.endswith("/__init__.py"):  # a shim module an earlier setup wrote where a package now stands
            (dest / f.removesuffix("/__init__.py")).with_suffix(".py").unlink(missing_ok=True)
    for folder in [dest / name, *(p for p in (dest / name).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        (folder / "__init__.py").touch()


def main(dest: Path) -> None:
    for pin in ENGINES:
        fetch(pin, dest)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
