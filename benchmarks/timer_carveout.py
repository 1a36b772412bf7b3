"""What do_bench's timer adds to a launch that takes shared memory, and whether the driver's shared-memory carveout
changes it (Qwen3.6-27B GDN shapes, bf16 inputs, DDTree trees, one sequence).

The L2 flush before each do_bench call is a kernel that takes no shared memory; the one-kernel WY form takes 32 KiB
a block. Where the SMs' split of L1 and shared memory must change between the two, the change lies between
do_bench's events and outside the kernel's own device time. Rows:

  empty, S KiB dynamic shared    a kernel that reads and writes nothing, on the form's grid and warps, launched with S
                                 KiB of dynamic shared memory (0, 16, 32, 64): the timer's cost by shared memory alone
  empty, carveout P              the same with no shared memory and the driver's carveout preference P
  the form, carveout P           plan_wy's launch (design auto) with its kernel's carveout preference P
                                 (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: -1 none, the default; else
                                 the percent of the SM's largest shared memory), by sequence and through a pool's slots

each as the median of --calls do_bench calls (their range), and the profiler's device time after the same flush.

    python benchmarks/timer_carveout.py [--commit SHA] [--shape 1x16] [--calls 5] [--carveouts=-1,0,25,100]
"""
import argparse
import ctypes

import torch
from fused_floor import _empty_kernel  # benchmarks/, the script's own folder

from ddsim.bench.bench import (
    at_least_one,
    calls_cell,
    captured_launch,
    compiled_during,
    cuda_header,
    ddtree_batch,
    kernel_device_us,
    kernel_inputs,
    median_us_calls,
    parse_shape,
    slotted_pool,
)
from ddsim.gpu_backend.launch import bind
from ddsim.gpu_backend.triton_gdn import plan_wy

NAMES = ("q", "k", "v", "g", "beta")
MAX_DYNAMIC_SHARED = 8  # CUfunction_attribute: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def set_attribute(ck, attribute: int, value: int) -> None:
    """cuFuncSetAttribute on a compiled kernel's function; a non-zero CUresult is an error."""
    cuda = ctypes.CDLL("libcuda.so.1")
    err = cuda.cuFuncSetAttribute(ctypes.c_void_p(ck.function), ctypes.c_int(attribute), ctypes.c_int(value))
    if err != 0:
        raise SystemExit(f"timer_carveout: cuFuncSetAttribute({attribute}, {value}) returned CUresult {err}")


def compiled(launch, same=None):
    """The compiled kernel launch() runs (launch.py's cache), once launch has run; ``same`` where it compiled none
    (a specialization already compiled: the states by sequence and through slots share one)."""
    _, new = compiled_during(lambda: (launch(), launch(), torch.cuda.synchronize()))
    new = [ck for _, ck in new]
    if len(new) > 1 or (not new and same is None):
        raise SystemExit(f"timer_carveout: expected the launch to compile one kernel, it compiled {len(new)}")
    return new[0] if new else same


def row(name: str, launch, calls: int) -> str:
    times = median_us_calls(launch, calls)
    return f"| {name} | {calls_cell(times)} | {kernel_device_us(launch):.2f} |"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shape", default="1x16")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--carveouts", default="-1,0,25,100")
    a = ap.parse_args()
    B, T = parse_shape(ap, a.shape)
    try:
        carveouts = [int(x) for x in a.carveouts.split(",")]
    except ValueError:
        ap.error(f"--carveouts {a.carveouts!r}: expected comma-separated integers")
    if any(not -1 <= p <= 100 for p in carveouts):
        ap.error(f"--carveouts {a.carveouts!r}: each -1 (none) or a percent from 0 to 100")
    at_least_one(ap, a, "calls")
    if not torch.cuda.is_available():
        raise SystemExit("timer_carveout: needs a CUDA device")
    print(cuda_header(a.commit))
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device="cuda")
    pool, slots = slotted_pool(inp["initial_state"])
    states = {"by sequence": dict(initial_state=inp["initial_state"]),
              "through slots": dict(initial_state=pool, state_indices=slots)}
    forms, ck = {}, None
    for way, st in states.items():
        launch, _ = plan_wy(**{n: inp[n] for n in NAMES}, parents=parents.to("cuda"), **st, poison=False)
        ck = compiled(launch, ck)
        forms[way] = (launch, ck)
    warps, _, shared = ck.packed_metadata
    _, launch_grid, _ = captured_launch(lambda: plan_wy(**{n: inp[n] for n in NAMES}, parents=parents.to("cuda"),
                                                        initial_state=inp["initial_state"], poison=False))
    o = torch.empty(1, device="cuda")
    empty = bind(_empty_kernel, launch_grid, dict(o=o, num_warps=warps))
    eck = compiled(empty)
    set_attribute(eck, MAX_DYNAMIC_SHARED, 64 * 1024)
    print(f"# the form: {warps} warps, {shared} bytes of shared memory, grid {launch_grid}")
    print(f"| {B} x {T}, launch | do_bench us (median of {a.calls} calls, range) | device us |")
    print("|---|---|---|")
    for kib in (0, 16, 32, 64):
        eck.packed_metadata = (warps, 1, kib * 1024)
        print(row(f"empty, {kib} KiB dynamic shared", empty, a.calls), flush=True)
    eck.packed_metadata = (warps, 1, 0)
    for p in carveouts:
        set_attribute(eck, CARVEOUT, p)
        print(row(f"empty, carveout {p}", empty, a.calls), flush=True)
    set_attribute(eck, CARVEOUT, -1)
    for p in carveouts:
        for way, (launch, fck) in forms.items():
            set_attribute(fck, CARVEOUT, p)
            print(row(f"the form, {way}, carveout {p}", launch, a.calls), flush=True)
    for way, (launch, fck) in forms.items():
        set_attribute(fck, CARVEOUT, -1)
        print(row(f"the form, {way}, carveout -1 again", launch, a.calls), flush=True)


if __name__ == "__main__":
    main()
