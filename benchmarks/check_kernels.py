"""`ddsim check-kernel` for every engine kernel this machine has, on one device: each property's
verdict and the wall time of the whole suite per (kernel, mode). On CUDA the kernels are compiled;
on the CPU, Triton's interpreter runs them.

    python benchmarks/check_kernels.py [--device cuda] [--max-examples 100] [--dtype float32|bfloat16] [--commit SHA]
"""
import argparse
import platform
import time

import torch

from ddsim.check_kernel import DTYPES, check, prepare_device
from ddsim.engines import load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-examples", type=int, default=100)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    a = ap.parse_args()
    device = prepare_device(a.device)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    print(f"# {time.strftime('%Y-%m-%d')} | {name} | torch {torch.__version__} | commit {a.commit} | "
          f"{a.max_examples} examples per property | {a.dtype} inputs")
    print("| kernel | package | op | mode | properties held | failed | wall s |")
    print("|---|---|---|---|---|---|---|")
    for impl, op, modes in (("ddsim", "gdn", ("exact", "leaky")), ("ddsim", "conv", ("exact", "leaky")),
                            ("sglang", "gdn", ("exact", "leaky")), ("sglang", "conv", ("exact", "leaky")),
                            ("vllm", "gdn", ("leaky",)), ("fla", "gdn", ("leaky",))):
        try:
            kernel = load(impl)
        except ValueError as e:
            print(f"| {impl} | not installed ({e}) | | | | | |")
            continue
        name = kernel.conv_name if op == "conv" else kernel.name
        for mode in modes:
            t = time.perf_counter()
            results = check(kernel, mode=mode, device=device, max_examples=a.max_examples, dtype=DTYPES[a.dtype],
                            op=op)
            wall = time.perf_counter() - t
            held = sum(r.holds for r in results)
            failed = "; ".join(f"{r.name}: {r.detail}" for r in results if not r.holds) or "none"
            print(f"| {name} | {kernel.package} {kernel.version} | {op} | {mode} | {held}/{len(results)} | {failed} | "
                  f"{wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
