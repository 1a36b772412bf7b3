"""Which WY launches fault on the GPU: each configuration in a process of its own (a CUDA fault is sticky: every
later call in the process fails too), on two chains of T nodes (B=2, H=1, HV=3, K and V 4 unless given), a host plan
(checks.TreePlan) or a device plan (device_checks.DevicePlan: the tables' kernel, then the WY kernel taking each
sequence's rounds from the depths it wrote), the root in the block (FUSED_ROOT 1 or 2) or first (0), fp32 or bf16
inputs, a design, and the least V tile at a 64-row block (_common.MIN_V_TILE_64: 32, or 16 as before the fix).
tests/test_device_checks.py's drawn-tree test faulted with an illegal address on the one-kernel form's launches (fp32,
design fused, a device plan, 37 nodes, the root in the block, on an H100), while Triton's interpreter, every access
held to its tensors (ddsim.engines.triton_interpret.check_bounds), found none. Run at a047ec3, this probe found the
cause (RESULTS.md): at a 64-row block with a 16-wide V tile the compiled kernel read past its shared memory
(memcheck), an illegal address or NaN outputs; 32- and 64-wide tiles ran clean. Its configurations now run the fix
(32), four of the faulting launches with 16, and the other forms with both; and Mamba2's SSD kernel at a 64-row block
and 8 warps (design "ssd": the properties' fixed example of T nodes, P = 3, its P tile at least 16 or 32 wide, against
the recurrent kernel), which the same rule widens.

A line per configuration: (T, FUSED_ROOT, plan, dtype, DEVICE_ROUNDS, K, V, design, least tile), the child's exit
status, then "ok" with whether the output is finite, whether it equals the host plan's, and its largest distance
from the serial kernel's over that output's largest entry; or the error's last line. The first two that fault run
again under compute-sanitizer's memcheck where the machine has it (its first 40 lines). --mma, on the CPU: each
launch compiled for sm_90, its MMA layouts (at a 64-row block the products are wgmma: some of N = 8 over 8 warps at
16-wide V tiles, N = 16 and 32 at 32-wide, N = 32 at 64-wide).

    python benchmarks/wy_fault_probe.py [--commit SHA] [--first N] [--design D]   # needs CUDA
    python benchmarks/wy_fault_probe.py --mma [--first N]           # no GPU
"""
import argparse
import glob
import itertools
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
# a configuration's process: this file's child() on its arguments
CHILD = f"import sys; sys.path.insert(0, {HERE!r}); import wy_fault_probe; wy_fault_probe.child(sys.argv[1:])"


def case(T: int, dtype: str, K: int, V: int, device: str) -> tuple:
    """(the verify's inputs, parents [B, T]) of one configuration: two chains of T nodes, B=2, H=1, HV=3, q, k, v in
    ``dtype``, on ``device``."""
    import torch
    B, H, HV = 2, 1, 3
    gen = torch.Generator().manual_seed(0)
    x = dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
             v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen),
             beta=torch.rand(B, T, HV, generator=gen), initial_state=torch.randn(B, HV, K, V, generator=gen))
    x = {n: (t.to(getattr(torch, dtype)) if n in ("q", "k", "v") else t).to(device) for n, t in x.items()}
    return x, torch.tensor([[-1] + list(range(T - 1))] * B, device=device)


def plan_of(name: str, parents):
    from ddsim.gpu_backend import checks, device_checks
    return device_checks.DevicePlan(parents.int()) if name == "device" else checks.TreePlan(parents)


def child(argv: list[str]) -> None:
    """One configuration (T, root, plan, dtype, rounds, K, V, design, least V tile at 64 rows) on the GPU: its output
    finite, equal to the host plan's, and its largest distance from the serial kernel's (no products: a reference
    the fault cannot reach) over the serial output's largest entry."""
    import torch

    from ddsim.gpu_backend import _common, triton_gdn
    T, root, plan, dt, rounds, K, V, design, least = (int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4] == "1",
                                                      int(argv[5]), int(argv[6]), argv[7], int(argv[8]))
    if design == "ssd":
        return ssd_child(T, dt, least)
    x, parents = case(T, dt, K, V, "cuda")
    triton_gdn.FUSED_ROOT, triton_gdn.DEVICE_ROUNDS, _common.MIN_V_TILE_64 = root, rounds, least
    o = triton_gdn.gdn_tree_verify_wy(**x, parents=plan_of(plan, parents), mode="exact", design=design)
    torch.cuda.synchronize()
    ref = triton_gdn.gdn_tree_verify_wy(**x, parents=plan_of("host", parents), mode="exact", design=design)
    serial = triton_gdn.gdn_tree_verify_recurrent(**x, parents=parents, mode="exact").float()
    torch.cuda.synchronize()
    dev = ((o.float() - serial).abs().max() / serial.abs().max()).item()
    print("ok", torch.isfinite(o).all().item(), torch.equal(o, ref), f"{dev:.1e}")


def ssd_child(T: int, dt: str, least: int) -> None:
    """Mamba2's SSD kernel at a 64-row block (block_i 64) and 8 warps on the properties' fixed example (P = 3, N = 5)
    of T nodes, its P tile at least ``least`` wide: its output finite, and its largest distance from the recurrent
    kernel's (no products) over that output's largest entry."""
    import torch

    from ddsim.gpu_backend import _common, triton_mamba2
    from ddsim.gpu_backend import mamba2_tree_verify as verify
    from ddsim.properties.strategies import fixed_mamba2_example
    inp = fixed_mamba2_example(T=T, dtype=getattr(torch, dt))
    x = {n: (inp[n].cuda() if isinstance(inp[n], torch.Tensor) else inp[n])
         for n in ("x", "dt", "A", "B", "C", "D", "dt_bias", "dt_softplus", "dt_limit", "parents", "initial_state")}
    _common.MIN_V_TILE_64 = least
    y = triton_mamba2.mamba2_tree_verify_ssd(**x, mode="exact", block_i=64, num_warps=8)
    torch.cuda.synchronize()
    serial = verify(**x, mode="exact", backend="triton-recurrent").float()
    torch.cuda.synchronize()
    dev = ((y.float() - serial).abs().max() / serial.abs().max()).item()
    print("ok", torch.isfinite(y).all().item(), "-", f"{dev:.1e}")


# (T, FUSED_ROOT, plan, dtype, DEVICE_ROUNDS, K, V, design, MIN_V_TILE_64). The first 91: the one-kernel form's
# launches around the drawn-tree test's fault, with the 32-wide least tile at 64 rows (the fix); then four of them
# that faulted with 16 (the fault, reproduced); then the two- and three-kernel forms (split, fold, head at 37 and 65
# nodes) and past one block (100 nodes: the chunked form as "fused", the split form as "auto"), each with 16 and 32
_FUSED = (list(itertools.product([17, 33, 37, 48, 64, 65], [0, 1, 2], ["device", "host"], ["float32", "bfloat16"],
                                 [1], [4], [4]))
          + list(itertools.product([37], [1], ["device"], ["float32"], [0], [4, 16, 128], [4]))
          # V tiles of 32 and 64 (--mma: the 64-row block's products' N at 16-wide tiles 8, at 32-wide 16)
          + list(itertools.product([37, 64], [1, 2], ["device", "host"], ["float32"], [1], [4], [32, 64])))
CONFIGS = ([(*c, "fused", 32) for c in _FUSED]
           + [(37, 1, "device", "float32", 1, 4, 4, "fused", 16), (37, 1, "host", "bfloat16", 1, 4, 4, "fused", 16),
              (48, 0, "host", "float32", 1, 4, 4, "fused", 16), (64, 0, "device", "float32", 1, 4, 4, "fused", 16)]
           + list(itertools.product([37, 65], [2], ["host"], ["float32", "bfloat16"], [1], [4], [4],
                                    ["split", "fold", "head"], [16, 32]))
           + list(itertools.product([100], [2], ["host"], ["float32", "bfloat16"], [1], [4], [4], ["fused", "auto"],
                                    [16, 32]))
           # Mamba2's SSD kernel at block_i 64, 8 warps (only T, dtype and the least tile are read)
           + [(T, 0, "host", dt, 1, 4, 4, "ssd", least)
              for T, dt, least in itertools.product([40, 64, 65], ["float32", "bfloat16"], [16, 32])])


def one(cfg):
    r = subprocess.run([sys.executable, "-c", CHILD, *map(str, cfg)], capture_output=True, text=True, timeout=120)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    err = [ln for ln in r.stderr.splitlines() if "Error" in ln][-1:] if r.returncode else []
    return cfg, r.returncode, last, err


def mma(configs) -> None:
    """Each configuration's WY launch compiled for sm_90 on the CPU (tests/gpu_compile.py's capture, Triton's bundled
    ptxas): its block, warps and V tile, and its products' MMA layouts (instrShape: wgmma's three numbers M, N, K
    per warp, mma.sync's two)."""
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import gpu_compile as gc
    import triton

    from ddsim.gpu_backend import _common, triton_gdn
    print(f"# sm_90, triton {triton.__version__}", flush=True)
    seen = set()
    for T, root, plan, dt, _, K, V, design, least in configs:  # (the rounds change no layout)
        if (T, root, plan, dt, K, V, design, least) in seen:
            continue
        seen.add((T, root, plan, dt, K, V, design, least))
        x, parents = case(T, dt, K, V, "cpu")
        triton_gdn.FUSED_ROOT, _common.MIN_V_TILE_64 = root, least
        gc.GOT.clear()
        triton_gdn.plan_wy(**x, parents=plan_of(plan, parents), mode="exact", design=design)
        kernel, kw = gc.GOT[-1]
        ttgir = gc.compile_for(kernel, kw).asm["ttgir"]
        layouts = sorted(set(re.findall(r"warpsPerCTA = \[\d+, \d+\], instrShape = \[[\d, ]+\]", ttgir)))
        print((T, root, plan, dt, K, V, design, least), f"BT {kw['BT']} warps {kw['num_warps']} BV {kw['BV']}:", "; ".join(layouts),
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--first", type=int, default=len(CONFIGS), help="run the first N configurations only")
    ap.add_argument("--mma", action="store_true", help="print each launch's MMA layouts compiled for sm_90 (no GPU)")
    ap.add_argument("--design", choices=sorted({c[7] for c in CONFIGS}), help="run this design's configurations only")
    a = ap.parse_args()
    if not 1 <= a.first <= len(CONFIGS):
        ap.error(f"--first {a.first}: expected 1 to {len(CONFIGS)}")
    configs = [c for c in CONFIGS[:a.first] if a.design in (None, c[7]) and not (a.mma and c[7] == "ssd")]
    if not configs:  # (--mma prints the WY launches' layouts: the SSD kernel's are held by tests/test_v_tiles.py)
        ap.error(f"--first {a.first}" + (f" --design {a.design}" if a.design else "") + (" --mma" if a.mma else "")
                 + ": no configuration to run")
    if a.mma:
        return mma(configs)
    import torch
    if not torch.cuda.is_available():
        sys.exit("wy_fault_probe.py: needs a CUDA GPU (it runs compiled kernels)")
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | commit {a.commit}", flush=True)
    faults = []
    with ThreadPoolExecutor(8) as ex:
        for cfg, rc, last, err in ex.map(one, configs):
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
