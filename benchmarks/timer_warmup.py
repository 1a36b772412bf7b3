"""The kernel tables' timer (bench.median_us: do_bench, 10 ms of warm-up, the L2 flushed before each call) on one
launch, call after call from the process's start, and again after the device idles: whether its first readings carry
the device's ramp from idle, beside the SM clock nvidia-smi samples every 20 ms (where it runs) and the kernels' own
device time. Phases, each after the one before:

  start          readings back to back once the launch is compiled
  idle           after a pause of --idle seconds (the device idle, as while a bench compiles its next kernel)
  idle, warm-up  after the same pause, do_bench with --warmup-ms of warm-up calls instead of 10
  idle, spun     after the same pause, --spin-ms of the launch back to back first, then bench.median_us

then placements: the launch planned anew --placements times, each plan's output allocated past a filler of a further
1 MiB + 64 KiB, three readings each (whether the two levels follow where the output lies); each reading names where
do_bench's 256 MiB flush buffer lay (MiB from the first reading's), whether the levels follow that;
then the same launch between CUDA events with the L2 flushed as do_bench flushes it (zeroing 256 MiB), by reading
256 MiB, and not at all; then every sample of one do_bench call (CUDA events' resolution shows in them) for each way of the one-kernel form
with q and k as read (triton_gdn.FUSED_ROWNORM, FUSED_CHAINS): its median, mean, the mean of its middle 80%, the most
common values, beside the form's device time.

    python benchmarks/timer_warmup.py [--commit SHA] [--shape 1x16] [--idle 3] [--warmup-ms 250] [--spin-ms 500]
                                      [--placements 8]
        # the launch: design auto's, as the kernel table's "ddsim kernels alone"
"""
import argparse
import datetime
import shutil
import subprocess
import tempfile
import time
from collections import Counter

import torch

from ddsim.bench.bench import (
    cuda_header,
    ddtree_batch,
    event_samples_us,
    fused_root_sweep,
    kernel_device_us,
    kernel_inputs,
    median_us,
    parse_shape,
)
from ddsim.gpu_backend.triton_gdn import plan_wy


def sm_clocks(log: str, start: float, end: float) -> str:
    """The SM clocks (MHz) nvidia-smi sampled between the wall-clock times start and end: 'min-max (n)'."""
    got = []
    for line in log.splitlines():
        try:
            stamp, sm = (x.strip() for x in line.split(",")[:2])
            when = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            mhz = int(sm.split()[0])
        except (ValueError, IndexError):
            continue
        if start <= when <= end:
            got.append(mhz)
    return f"{min(got)}-{max(got)} ({len(got)})" if got else "–"


def summary(xs: list[float]) -> str:
    """'median | mean | mean of the middle 80%' of sorted samples xs (us), as the tables' cells."""
    n = len(xs)
    middle = xs[n // 10: n - n // 10]
    return f"{xs[n // 2]:.2f} | {sum(xs) / n:.2f} | {sum(middle) / len(middle):.2f}"


def watch_flush_buffer():
    """Wrap Triton's driver's get_empty_cache_for_benchmark (the buffer do_bench zeroes before each call) so that the
    address of the last one handed out can be read: returns a function giving it (None before any)."""
    import triton
    driver = triton.runtime.driver.active
    got = {"at": None}
    make = driver.get_empty_cache_for_benchmark

    def watched():
        buf = make()
        got["at"] = buf.data_ptr()
        return buf

    driver.get_empty_cache_for_benchmark = watched
    return lambda: got["at"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shape", default="1x16")
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--warmup-ms", type=int, default=250)
    ap.add_argument("--spin-ms", type=int, default=500)
    ap.add_argument("--placements", type=int, default=8)
    a = ap.parse_args()
    B, T = parse_shape(ap, a.shape)
    if a.idle < 0 or a.warmup_ms < 1 or a.spin_ms < 1 or a.placements < 0:
        ap.error("--idle: expected 0 or more seconds; --warmup-ms, --spin-ms: 1 or more; --placements: 0 or more")
    if not torch.cuda.is_available():
        raise SystemExit("timer_warmup: needs a CUDA device")
    print(cuda_header(a.commit) + f" | {B} x {T}, design auto, Qwen3.6-27B GDN shapes, bf16 inputs")
    log = tempfile.NamedTemporaryFile("w+", suffix=".csv")
    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm", "--format=csv,noheader", "-lms", "20"],
                               stdout=log, stderr=subprocess.DEVNULL)
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, device="cuda")

    def plan():  # (launch, its output): a fresh output each time
        return plan_wy(**{n: inp[n] for n in ("q", "k", "v", "g", "beta")}, parents=parents.to("cuda"),
                       initial_state=inp["initial_state"], poison=False)

    launch, _ = plan()
    launch()
    torch.cuda.synchronize()
    rows = []
    flush_at = watch_flush_buffer()

    def reading(phase: str, timer):
        start = time.time()
        us = timer()
        rows.append((phase, time.time() - t0, us, start, time.time(), flush_at()))

    def do_bench_warm():
        import triton.testing
        return triton.testing.do_bench(launch, warmup=a.warmup_ms, rep=50, return_mode="median") * 1e3

    def spin():
        end = time.time() + a.spin_ms / 1e3
        while time.time() < end:
            for _ in range(100):
                launch()
            torch.cuda.synchronize()

    t0 = time.time()
    for _ in range(12):
        reading("start", lambda: median_us(launch))
    time.sleep(a.idle)
    for _ in range(6):
        reading(f"after {a.idle:g} s idle", lambda: median_us(launch))
    time.sleep(a.idle)
    for _ in range(6):
        reading(f"after {a.idle:g} s idle, do_bench warm-up {a.warmup_ms} ms", do_bench_warm)
    time.sleep(a.idle)
    spin()
    for _ in range(6):
        reading(f"after {a.idle:g} s idle, {a.spin_ms} ms of calls first", lambda: median_us(launch))
    device = kernel_device_us(launch)
    keep = []
    for i in range(a.placements):  # the output past a filler a further 1 MiB + 64 KiB long each time
        keep.append(torch.empty((i + 1) * (2**20 + 2**16), dtype=torch.uint8, device="cuda"))
        placed, o = plan()
        keep.append(o)
        placed()
        for _ in range(3):
            reading(f"placement {i + 1}, the output at {o.data_ptr() % 2**30 / 2**20:.3f} MiB mod 1 GiB",
                    lambda: median_us(placed))
    forms = []  # every sample of one do_bench per way of the one-kernel form with q and k as read
    import triton.testing

    from ddsim.gpu_backend import triton_gdn
    for f in fused_root_sweep((triton_gdn.FUSED_ROOT,), (None,), (None,), holds=(triton_gdn.FUSED_HOLD,),
                              rownorms=(False, True), chains=(False, True)):  # plan_wy's own warps and V tile
        form, _ = plan()
        form()
        samples = sorted(x * 1e3 for x in triton.testing.do_bench(form, warmup=10, rep=50, return_mode="all"))
        forms.append((f"FUSED_ROWNORM {int(f.rownorm)}, FUSED_CHAINS {int(f.chains)}", samples, kernel_device_us(form)))
    # the flush itself: do_bench zeroes 256 MiB (the L2 left full of lines still to be written back); read instead, the
    # L2 is left full of clean lines; none, warm
    buf = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    flushes = {"zeroed (do_bench's)": buf.zero_, "read": buf.sum, "none": None}
    flushed = {name: event_samples_us(launch, flush=f) for name, f in flushes.items()}
    if smi is not None:
        smi.terminate()
        smi.wait()
    log.seek(0)
    text = log.read()
    print("| phase | s since the first reading | do_bench us | SM clock MHz while it ran (samples) | "
          "do_bench's flush buffer at, MiB from the first reading's |")
    print("|---|---|---|---|---|")
    first = rows[0][5]
    for phase, since, us, start, end, at in rows:
        where = "–" if at is None or first is None else f"{(at - first) / 2**20:+.0f}"
        print(f"| {phase} | {since:.2f} | {us:.2f} | {sm_clocks(text, start, end)} | {where} |")
    print(f"# the launch's device time after the phases (bench.kernel_device_us): {device:.2f} us")
    print("\n| flush before each call | median us | mean us | mean of the middle 80% us |")
    print("|---|---|---|---|")
    for name, xs in flushed.items():
        print(f"| {name} | {summary(xs)} |")
    print("\n| form | samples | median us | mean us | mean of the middle 80% us | most common values us (share) | "
          "device us |")
    print("|---|---|---|---|---|---|---|")
    for name, xs, dev in forms:
        common = Counter(round(x, 2) for x in xs).most_common(4)
        print(f"| {name} | {len(xs)} | {summary(xs)} | "
              f"{', '.join(f'{v:.2f} ({c / len(xs):.0%})' for v, c in common)} | {dev:.2f} |")


if __name__ == "__main__":
    main()
