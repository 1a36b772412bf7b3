"""The exact WY verify's kernels alone at plan_wy's defaults (design "auto", default configuration) at
every bench shape, with the dot precision bf16 inputs now default to (bf16x3) beside the one they had
before (tf32x3), and the memory the verify allocates per layer call (its output and its scratch:
W / P / Qe / Ve / G buffers; nothing per node). Qwen3.6-27B GDN shapes, bf16 inputs, DDTree trees,
median us (do_bench: each call alone, L2 flushed before it). With --layers N, the default precision also as a
server's replayed verify runs it: N layers' inputs (states, q, k, v, gates, each set its own) verified back to
back from one CUDA graph, us per launch (ddsim.bench.bench.graphed_layers_us; 48 is Qwen3.6-27B's GDN layers).

With --parts, each kernel of a multi-kernel default (bf16x3) also timed alone, in the order launched.

    python benchmarks/bench_wy_defaults.py [--commit SHA] [--shapes 1x16,1x65,...] [--layers 48] [--head-off] [--parts]
"""
import argparse

import torch

from ddsim.bench.bench import (
    copy_bandwidth,
    cuda_header,
    ddtree_batch,
    fp32_tensor_rate,
    graphed_layers_us,
    kernel_bytes,
    kernel_flops,
    kernel_inputs,
    median_us,
    parse_shapes,
)
from ddsim.gpu_backend import _common, triton_gdn
from ddsim.gpu_backend.triton_gdn import auto_design, plan_wy

SHAPES = "1x16,1x65,8x65,32x65,1x129,8x129,1x257,8x257"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--layers", type=int, default=0, help="also time N layers' inputs back to back from a CUDA graph")
    ap.add_argument("--head-off", action="store_true",
                    help="also time bf16x3 with design auto kept off the head form (triton_gdn.AUTO_HEAD, AUTO_HEAD_ONE), alone "
                         "and graphed")
    ap.add_argument("--parts", action="store_true",
                    help="also time each kernel of a multi-kernel default (bf16x3) alone, in launch order")
    a = ap.parse_args()
    if a.layers < 0:
        ap.error(f"--layers: expected 0 or more, got {a.layers}")
    shapes = parse_shapes(ap, a.shapes)
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_defaults: needs a CUDA device")
    bw = copy_bandwidth("cuda")
    rates = {p: fp32_tensor_rate("cuda", p) for p in ("bf16x3", "tf32x3")}
    print(cuda_header(a.commit))
    graphed = f" graphed, {a.layers} layers in turn, us |" if a.layers else ""
    parts = " each kernel alone (launch order), us |" if a.parts else ""
    off = (" bf16x3, head off, us |" + (" graphed, head off, us |" if a.layers else "")) if a.head_off else ""
    print("| B x T | design (auto) | bf16x3 (default) us | tf32x3 us | memory floor us | FLOP floor us: bf16x3 / tf32x3 "
          "| verify allocations MiB/layer (output + scratch) |" + graphed + off + parts)
    print("|---|---|---|---|---|---|---|" + "---|" * (graphed + off + parts).count("|"))
    for B, T in shapes:
        _, parents = ddtree_batch(B, T)
        inp = kernel_inputs(B, T, device="cuda")
        common = dict(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents.cuda(),
                      initial_state=inp["initial_state"], poison=False)
        assert _common.dot_precision(None, inp["q"], inp["k"], inp["v"]) == "bf16x3"
        us, mib = {}, None
        for prec in ("bf16x3", "tf32x3"):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            launch, o = plan_wy(**common, precision=None if prec == "bf16x3" else prec)
            if prec == "bf16x3":
                mib = (torch.cuda.memory_allocated() - before) / 2**20
            us[prec] = median_us(launch)
            del launch, o
        alone = ""
        if a.parts:
            launch, o = plan_wy(**common)
            ks = getattr(launch, "parts", (launch,))
            alone = " " + " / ".join(f"{median_us(k):.1f}" for k in ks) + " |"
            del launch, o
        fl = kernel_flops(B, T)["wy"]
        layers = ""
        if a.layers:
            layers = f" {graphed_layers_us(B, T, parents, a.layers):.1f} |"
        if a.head_off:
            triton_gdn.AUTO_HEAD = triton_gdn.AUTO_HEAD_ONE = False
            try:
                launch, o = plan_wy(**common)
                layers += f" {median_us(launch):.1f} |"
                del launch, o
                if a.layers:
                    layers += f" {graphed_layers_us(B, T, parents, a.layers):.1f} |"
            finally:
                triton_gdn.AUTO_HEAD = triton_gdn.AUTO_HEAD_ONE = True
        print(f"| {B} x {T} | {auto_design(B, T, 'bf16x3')} | {us['bf16x3']:.1f} | {us['tf32x3']:.1f} | "
              f"{kernel_bytes(B, T)['wy'] / bw * 1e6:.1f} | "
              + (" / ".join(f"{fl / rates[p] * 1e6:.1f}" for p in ("bf16x3", "tf32x3")) if rates["bf16x3"] else "–")
              + f" | {mib:.1f} |" + layers + alone, flush=True)
    print("kernels alone (the launch plan_wy returns), median us of do_bench; tf32x3 at auto's form for tf32x3 "
          "(past one block a batch folds)")


if __name__ == "__main__":
    main()
