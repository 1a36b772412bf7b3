"""The WY kernels' doubling rounds (NSTEP) as a value (_common.ROUNDS_AS_VALUE, as shipped) against Triton's default,
which compiles an int argument equal to 1 as a constant, so that a host plan of one round gets another compilation
than a device plan (a captured call's, its rounds read on the device from its depths, the launch's NSTEP a bound);
side by side in one run on one GPU:

  bits  trees on which a host plan takes one round (a star under FUSED_ROOT 1, a tree of depth 2 otherwise), drawn
        --trials times per form: how many give other bits on a host plan than on a device plan, each variant.
        Forms: the one-kernel form at FUSED_ROOT 0, 1, 2 (fp32 and bf16, K = V = 16), the split, fold, head, chunked
        and blocked forms (fp32), the Gluon fold (bf16, K = V = 128, where this GPU compiles it)
  time  DDTree's 1 x 16 at Qwen3.6-27B GDN shapes (bf16), the kernels alone as bench_engine_api.py's column (a host
        plan: one round), each variant, and on a device plan: the median of --calls do_bench calls (their range), and
        device time (torch.profiler)

    python benchmarks/rounds_specialization.py [--commit SHA] [--trials 40] [--calls 5]
"""
import argparse

import torch

from ddsim.bench.bench import (
    at_least_one,
    calls_cell,
    cuda_header,
    ddtree_batch,
    kernel_device_us,
    kernel_inputs,
    median_us_calls,
    wy_form_output,
)
from ddsim.gpu_backend import checks, device_checks, gluon_gdn, triton_gdn, triton_wy_blocked, triton_wy_split

KERNELS = [triton_gdn._gdn_wy_kernel, triton_wy_split._gdn_wy_solve_kernel, triton_wy_split._gdn_wy_fold_kernel,
           triton_wy_split._gdn_wy_fold_head_kernel, triton_wy_blocked._gdn_wy_blocked_kernel,
           triton_wy_blocked._gdn_wy_blocked_diag_kernel]
if gluon_gdn.available():
    KERNELS.append(gluon_gdn._gdn_fold_kernel)


def specialize_rounds(on: bool) -> None:
    """NSTEP compiled as Triton's launcher does by default (on: 1 a constant) or as a value (off, as shipped); every
    binder and compiled kernel dropped, so the next launch specializes anew."""
    from ddsim.gpu_backend import launch
    for kernel in KERNELS:
        (p,) = [p for p in kernel.params if p.name == "NSTEP"]
        p.do_not_specialize = not on
        kernel.device_caches.clear()
    launch._COMPILED.clear()


def launched() -> str:
    """The WY kernels launched since the last specialize_rounds (those bind keeps compiled)."""
    from ddsim.gpu_backend import launch
    names = {id(k): k.__name__ for k in KERNELS}
    return ", ".join(sorted({names[key[0]] for key in launch._COMPILED if key[0] in names})) or "?"


def one_round_tree(gen: torch.Generator, T: int, star: bool) -> list[int]:
    """A tree of T nodes whose host plan takes one doubling round: a star (every node under the root) for FUSED_ROOT 1,
    else depth 2 (each node under the root or under one of the root's children, at least one such)."""
    if star:
        return [-1] + [0] * (T - 1)
    tops = 1 + int(torch.randint(0, max(1, (T - 1) // 2), (1,), generator=gen))
    return [-1] + [0] * tops + [1 + int(torch.randint(0, tops, (1,), generator=gen)) for _ in range(T - 1 - tops)]


def inputs(gen: torch.Generator, B: int, T: int, K: int, V: int, dtype, star: bool) -> tuple[dict, torch.Tensor]:
    """(the verify's inputs on the GPU, q, k, v in dtype, H = 1, HV = 2; parents [B, T] of one_round_tree's trees)."""
    H, HV = 1, 2
    x = dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
             v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(B, T, HV, generator=gen) * 0.3,
             beta=torch.rand(B, T, HV, generator=gen), initial_state=torch.randn(B, HV, K, V, generator=gen))
    x = {n: t.to("cuda", dtype if n in ("q", "k", "v") else torch.float32) for n, t in x.items()}
    parents = torch.tensor([one_round_tree(gen, T, star) for _ in range(B)], device="cuda")
    return x, parents


# (label, design, FUSED_ROOT, dtype, K = V, T, B)
FORMS = [("fused, root 0, fp32", "fused", 0, torch.float32, 16, 12, 2),
         ("fused, root 1, fp32", "fused", 1, torch.float32, 16, 12, 2),
         ("fused, root 2, fp32", "fused", 2, torch.float32, 16, 12, 2),
         ("fused, root 1, bf16", "fused", 1, torch.bfloat16, 16, 12, 2),
         ("fused, root 2, bf16", "fused", 2, torch.bfloat16, 16, 12, 2),
         ("split, fp32", "split", 0, torch.float32, 16, 12, 2),
         ("fold, fp32", "fold", 0, torch.float32, 16, 12, 2),
         ("head, fp32", "head", 0, torch.float32, 16, 12, 2),
         ("chunked, fp32", "chunked", 0, torch.float32, 16, 12, 2),
         ("blocked, fp32", "blocked", 0, torch.float32, 16, 12, 2)]


def bits_row(label, design, root, dtype, KV, T, B, trials: int) -> str:
    old = triton_gdn.FUSED_ROOT
    triton_gdn.FUSED_ROOT = root
    try:
        cells = []
        for on in (True, False):
            specialize_rounds(on)
            gen = torch.Generator().manual_seed(0)
            differ = 0
            for _ in range(trials):
                x, parents = inputs(gen, B, T, KV, KV, dtype, star=root == 1)
                host = checks.TreePlan(parents)
                got = {name: wy_form_output(x, plan, design) for name, plan in (
                    ("host", host), ("device", device_checks.DevicePlan(parents.int())))}
                assert torch.isfinite(got["host"]).all(), label
                differ += not torch.equal(got["host"], got["device"])
            cells.append(f"{differ} / {trials}")
        return f"| {label} | {B} x {T} | {KV} | {launched()} | {' | '.join(cells)} |"
    finally:
        triton_gdn.FUSED_ROOT = old
        specialize_rounds(False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args()
    at_least_one(ap, a, "trials", "calls")
    if not torch.cuda.is_available():
        ap.error("needs CUDA")
    print(cuda_header(a.commit))
    print(f"\n## bits: host plan (one round) against device plan, trees with differing bits of {a.trials}")
    print("| form | B x T | K = V | kernel | NSTEP specialized (Triton's default) | NSTEP a value (shipped) |")
    print("|---|---|---|---|---|---|")
    forms = list(FORMS)
    if gluon_gdn.available():
        forms.append(("Gluon fold (fused, root 2), bf16", "fused", 2, torch.bfloat16, 128, 16, 1))
    for form in forms:
        print(bits_row(*form, a.trials), flush=True)

    print("\n## time: DDTree 1 x 16, Qwen3.6-27B GDN shapes, bf16, kernels alone (us: do_bench median of calls, range; "
          "device time)")
    print("| plan | NSTEP | do_bench | device |")
    print("|---|---|---|---|")
    _, parents = ddtree_batch(1, 16)
    inp = kernel_inputs(1, 16)
    qkvgb = {n: inp[n] for n in ("q", "k", "v", "g", "beta")}
    for label, on, device in (("host", True, False), ("host", False, False), ("device", False, True)):
        specialize_rounds(on)
        plan = device_checks.DevicePlan(parents.to("cuda").int()) if device else parents.to("cuda")
        run, _ = triton_gdn.plan_wy(**qkvgb, parents=plan, initial_state=inp["initial_state"], poison=False)
        times = median_us_calls(run, a.calls)
        what = "specialized (1 a constant)" if on else "a value (shipped)"
        print(f"| {label} | {what} | {calls_cell(times)} | {kernel_device_us(run):.2f} |", flush=True)
    specialize_rounds(False)


if __name__ == "__main__":
    main()
