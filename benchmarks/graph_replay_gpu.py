"""check-kernel's replayed examples alone (kernel_cases.replay_cases: a step judged on the launch of another step,
captured in a CUDA graph on a GPU), one run per kernel, op and mode, each in a process of its own: which properties
hold there, and the first failure's line. A run is "impl:op:mode"; impl is an adapter (ddsim, sglang, vllm, fla),
"api" for ddsim's engine_api.target_verify in SGLang's convention, or "planted.NAME" for tests/planted_launches.py's
NAME (in SGLang's convention for names starting sglang_, else ddsim's).

    python benchmarks/graph_replay_gpu.py [--device cuda] [--profile serving] [--dtype bfloat16] [--launch graph]
        RUN ...
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

ONE = r"""
import json, sys, torch
from ddsim.engines import check_kernel as ck, kernel_cases as kc, load
impl, op, mode, device, profile, dtype, launch = sys.argv[1:8]
from ddsim.devices import prepare_engine_device
device = prepare_engine_device(device)  # on the CPU: Triton's interpreter, as check-kernel's command line sets it up
cases = kc.cases
kc.cases = lambda *a, **k: [c for c in cases(*a, **k) if "replay" in c]
if impl == "api":
    kernel = load("ddsim.gpu_backend.engine_api:target_verify", convention="sglang")
elif impl.startswith("planted."):
    name = impl.removeprefix("planted.")
    kernel = load(f"tests.planted_launches:{name}", convention="sglang" if name.startswith("sglang_") else "ddsim")
else:
    kernel = load(impl)
res = ck.check(kernel, mode=mode, device=device, max_examples=1, op=op, profile=profile, dtype=getattr(torch, dtype),
               launch=launch)
print(json.dumps({"examples": res.examples, "coverage": res.coverage.get("engine launch"),
                  "properties": [[r.name, r.holds, r.detail] for r in res.properties]}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="impl:op:mode")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", default="serving", choices=("quick", "serving"))
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--launch", default="graph", choices=("graph", "eager"))
    ap.add_argument("--timeout", type=float, default=240.0)
    a = ap.parse_args(argv)
    for run in a.runs:
        if run.count(":") != 2:
            ap.error(f"run {run!r}: expected impl:op:mode")
    import torch
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"# replayed examples, profile {a.profile}, inputs {a.dtype}, launch {a.launch}, on {dev}")
    for run in a.runs:
        start = time.time()
        try:
            p = subprocess.run([sys.executable, "-c", ONE, *run.split(":"), a.device, a.profile, a.dtype, a.launch],
                               capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print(f"{run}: did not finish within {a.timeout:.0f} s")
            continue
        took = time.time() - start
        if p.returncode != 0:
            print(f"{run}: rc {p.returncode} in {took:.0f} s: {(p.stderr.strip().splitlines() or [''])[-1][:300]}")
            continue
        doc = json.loads(p.stdout.strip().splitlines()[-1])
        bad = [(n, d) for n, h, d in doc["properties"] if not h]
        head = f"{run}: {len(doc['properties']) - len(bad)}/{len(doc['properties'])} hold in {took:.0f} s"
        print(head + ("" if not bad else f"; failing {[n for n, _ in bad]}; first: {bad[0][1][:400]}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
