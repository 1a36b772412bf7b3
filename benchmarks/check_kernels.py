"""`ddsim check-kernel` for every engine kernel this machine has, on one device: each property's
verdict, the explicit serving examples run (the profile: serving by default on CUDA), the coverage and
the wall time of the whole suite per (kernel, op, mode). On CUDA the kernels are compiled; on the CPU,
Triton's interpreter runs them.

    python benchmarks/check_kernels.py [--device cuda] [--profile serving|quick] [--max-examples 100]
                                       [--dtype float32|bfloat16|float16] [--only ddsim,fla,...] [--commit SHA]
"""
import argparse
import platform
import time

import torch

from ddsim.devices import prepare_engine_device
from ddsim.engines import load
from ddsim.engines.check_kernel import DTYPES, check


def _hung(name, kernel, op, mode, label, seconds):
    """A kernel that does not return on a serving example: its row says so, and the process ends (a hung
    GPU kernel cannot be interrupted)."""
    import os
    print(f"| {name} | {kernel.package} {kernel.version} | {op} | {mode} | did not return on [{label}] within "
          f"{seconds:g} s | | hung | |", flush=True)
    os._exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-examples", type=int, default=100)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--profile", choices=["quick", "serving"], default=None)
    ap.add_argument("--only", default=None, help="comma-separated engines to run (default: every one installed)")
    ap.add_argument("--op", default=None, help="one op only (gdn, conv, mamba2)")
    ap.add_argument("--mode", default=None, help="one mode only (exact, leaky)")
    a = ap.parse_args()
    device = prepare_engine_device(a.device)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    print(f"# {time.strftime('%Y-%m-%d')} | {name} | torch {torch.__version__} | commit {a.commit} | "
          f"{a.max_examples} drawn examples per property | {a.dtype} inputs | profile {a.profile or 'default'}")
    print("| kernel | package | op | mode | properties held | serving examples | failed | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    only = set(a.only.split(",")) if a.only else None
    for impl, op, modes in (("ddsim", "gdn", ("exact", "leaky")), ("ddsim", "conv", ("exact", "leaky")),
                            ("ddsim", "mamba2", ("exact", "leaky")),
                            ("sglang", "gdn", ("exact", "leaky")), ("sglang", "conv", ("exact", "leaky")),
                            ("sglang", "mamba2", ("exact", "leaky")),
                            ("vllm", "gdn", ("leaky",)), ("fla", "gdn", ("leaky",))):
        if (only is not None and impl not in only) or (a.op and op != a.op):
            continue
        try:
            kernel = load(impl)
        except ValueError as e:
            print(f"| {impl} | not installed ({e}) | | | | | |")
            continue
        name = {"conv": kernel.conv_name, "mamba2": kernel.mamba2_name}.get(op, kernel.name)
        coverage = {}
        for mode in modes:
            if a.mode and mode != a.mode:
                continue
            t = time.perf_counter()
            results = check(kernel, mode=mode, device=device, max_examples=a.max_examples, dtype=DTYPES[a.dtype],
                            op=op, profile=a.profile, example_timeout=600.0,
                            on_hang=lambda label, sec, name=name, op=op, mode=mode: _hung(name, kernel, op, mode, label, sec))
            wall = time.perf_counter() - t
            held = sum(r.holds for r in results)
            failed = "; ".join(f"{r.name}: {r.detail}" for r in results if not r.holds) or "none"
            coverage = results.coverage
            print(f"| {name} | {kernel.package} {kernel.version} | {op} | {mode} | {held}/{len(results.properties)} | "
                  f"{results.examples} ({results.profile}) | {failed} | {wall:.1f} |", flush=True)
        print(f"<!-- coverage {impl} {op}: " + "; ".join(
            f"{k} {v if not isinstance(v, list) else ','.join(map(str, v))}" for k, v in coverage.items()) + " -->",
              flush=True)


if __name__ == "__main__":
    main()
