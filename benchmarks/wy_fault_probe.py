"""Which one-kernel WY launches (triton_gdn's design "fused") fault on the GPU: each configuration in a process of its
own (a CUDA fault is sticky: every later call in the process fails too), on two chains of T nodes (B=2, H=1, HV=3,
K and V 4 unless given), a host plan (checks.TreePlan) or a device plan (device_checks.DevicePlan: the tables' kernel,
then the WY kernel taking each sequence's rounds from the depths it wrote), the root in the block (FUSED_ROOT 1 or 2)
or first (0), fp32 or bf16 inputs. tests/test_device_checks.py's drawn-tree test faulted with an illegal address on
such launches (fp32, design fused, a device plan; at 37 nodes with the root in the block on an H100), while Triton's
interpreter, every access held to its tensors (ddsim.engines.triton_interpret.check_bounds), found none.

A line per configuration: (T, FUSED_ROOT, plan, dtype, DEVICE_ROUNDS, K, V), the child's exit status, "ok" with whether
the output is finite and equal to the host plan's, or the error's last line. The first two that fault run again
under compute-sanitizer's memcheck where the machine has it (its first 40 lines).

    python benchmarks/wy_fault_probe.py [--commit SHA] [--first N]   # needs CUDA
"""
import argparse
import glob
import itertools
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CHILD = r'''
import sys, torch
from ddsim.gpu_backend import triton_gdn, checks, device_checks
T, root, plan, dt, rounds, K, V = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1",
                                   int(sys.argv[6]), int(sys.argv[7]))
B, H, HV = 2, 1, 3
gen = torch.Generator().manual_seed(0)
x = dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
         v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen),
         beta=torch.rand(B, T, HV, generator=gen), initial_state=torch.randn(B, HV, K, V, generator=gen))
x = {n: (t.to(getattr(torch, dt)) if n in ("q", "k", "v") else t).cuda() for n, t in x.items()}
parents = torch.tensor([[-1] + list(range(T - 1))] * B).cuda()
triton_gdn.FUSED_ROOT, triton_gdn.DEVICE_ROUNDS = root, rounds
p = device_checks.DevicePlan(parents.int()) if plan == "device" else checks.TreePlan(parents)
o = triton_gdn.gdn_tree_verify_wy(**x, parents=p, mode="exact", design="fused")
torch.cuda.synchronize()
ref = triton_gdn.gdn_tree_verify_wy(**x, parents=checks.TreePlan(parents), mode="exact", design="fused")
torch.cuda.synchronize()
print("ok", torch.isfinite(o).all().item(), torch.equal(o, ref))
'''

CONFIGS = (list(itertools.product([17, 33, 37, 48, 64, 65], [0, 1, 2], ["device", "host"], ["float32", "bfloat16"],
                                  [1], [4], [4]))
           + list(itertools.product([37], [1], ["device"], ["float32"], [0], [4, 16, 128], [4]))
           # V tiles of 32 and 64: compiled for sm_90 (Triton 3.6), the 64-row block's products at 16-wide tiles are
           # wgmma of N = 8 over 8 warps ([8, 1]), at 32-wide N = 16; a serving shape's (V = 128) N = 32
           + list(itertools.product([37, 64], [1, 2], ["device", "host"], ["float32"], [1], [4], [32, 64])))


def one(cfg):
    r = subprocess.run([sys.executable, "-c", CHILD, *map(str, cfg)], capture_output=True, text=True, timeout=120)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    err = [ln for ln in r.stderr.splitlines() if "Error" in ln][-1:] if r.returncode else []
    return cfg, r.returncode, last, err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--first", type=int, default=len(CONFIGS), help="run the first N configurations only")
    a = ap.parse_args()
    if not 1 <= a.first <= len(CONFIGS):
        ap.error(f"--first {a.first}: expected 1 to {len(CONFIGS)}")
    import torch
    if not torch.cuda.is_available():
        sys.exit("wy_fault_probe.py: needs a CUDA GPU (it runs compiled kernels)")
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | commit {a.commit}", flush=True)
    faults = []
    with ThreadPoolExecutor(8) as ex:
        for cfg, rc, last, err in ex.map(one, CONFIGS[:a.first]):
            print(cfg, rc, last, *err, flush=True)
            if rc:
                faults.append(cfg)
    san = shutil.which("compute-sanitizer") or next(iter(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")), None)
    print("faults", len(faults), "compute-sanitizer", san, flush=True)
    for cfg in faults[:2] if san else []:
        r = subprocess.run([san, "--tool", "memcheck", "--show-backtrace", "no", sys.executable, "-c", CHILD,
                            *map(str, cfg)], capture_output=True, text=True, timeout=150)
        print(cfg, "memcheck:", *(r.stdout + r.stderr).splitlines()[:40], sep="\n", flush=True)


if __name__ == "__main__":
    main()
