"""Run one engine kernel's explicit check-kernel examples one by one on a device, printing each
example's label, wall time and verdicts as it ends (to find an example a kernel hangs or fails on).

    python benchmarks/check_kernel_progress.py --impl sglang --op conv --mode exact [--profile serving]
"""
import argparse
import time

import torch

from ddsim.devices import prepare_engine_device
from ddsim.engines import check_kernel as ck
from ddsim.engines import kernel_cases, load

ap = argparse.ArgumentParser()
ap.add_argument("--impl", required=True)
ap.add_argument("--op", default="gdn")
ap.add_argument("--mode", default="exact")
ap.add_argument("--profile", default="serving")
ap.add_argument("--device", default="cuda")
a = ap.parse_args()
device = prepare_engine_device(a.device)
kernel = load(a.impl)
runner = {"gdn": ck._Runner, "conv": ck._ConvRunner, "mamba2": ck._Mamba2Runner}[a.op](kernel, a.mode, device)
props = runner.properties()
extra = {"widths": kernel.conv_widths} if a.op == "conv" else {}
for inp in kernel_cases.cases(a.op, a.profile, torch.float32, **extra):
    print(f"start [{inp['label']}]", flush=True)
    t = time.perf_counter()
    r = runner.run(inp)
    bad = [n for n, p in props.items() if not p(r)]
    print(f"  {time.perf_counter() - t:.1f} s, {'FAILS ' + ', '.join(bad) if bad else 'holds'}", flush=True)
