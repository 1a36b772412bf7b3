"""The exact verify that writes every node's state (the drop-in's work: SGLang's target verify with its intermediate
buffer) at Qwen3.6-27B GDN shapes (H=16, HV=48, K=V=128, bf16 inputs, fp32 state pool in SGLang's layout), DDTree
trees, side by side in one run on one GPU:

  sglang exact      fused_sigmoid_gating_delta_rule_update with retrieve_parent_token, every node's state written to
                    the intermediate buffer (SGLang's own kernel)
  ddsim drop-in     engine_api.target_verify with the same buffer (plan_recurrent's design "auto"), the public call
  serial BV/W       the recurrent kernel alone (plan_recurrent design "serial"): a program per (head, V tile) steps
                    over the nodes in index order, each parent's state read back from the buffer; V tiles of BV,
                    W warps (the first configuration is the reference of the bit-for-bit comparison)
  paths BV/W        the paths kernel alone (design "paths"): a program per (node, head, V tile) steps along the node's
                    root path from the committed state in registers; V tiles of BV, W warps
Beside them: the floor of writing the node states once (the buffer's bytes over the measured copy bandwidth), the
buffer zeroed by torch (what writing those bytes alone takes), and
the path steps the paths kernel makes per node (the mean root-path length). Timer: do_bench (CUDA events around
the call, the L2 flushed before it: bench.median_us); device: the kernels' own time after the flush
(bench.kernel_device_us). Before timing, each ddsim kernel's output and buffer are compared with the first serial
configuration's: the last column gives each configuration's largest difference from it (0: the same bits; another
tile or warp count sums the key rows in another order).

    python benchmarks/bench_node_states.py [--commit SHA] [--shapes 1x16,1x65,8x65,32x65,8x129,8x257]
                                           [--serial 16/1,32/4] [--paths 32/2,64/4] [--mode exact|leaky]
        # --mode leaky: the flattened verify (SGLang's kernel without retrieve_parent_token, its buffer written);
        # design auto then takes serial
        # needs CUDA and SGLang's kernel importable
"""
import argparse

import torch

from ddsim.bench.bench import (
    copy_bandwidth,
    cuda_header,
    kernel_device_us,
    median_us,
    parse_shapes,
    sglang_layer,
    sglang_run,
)
from ddsim.gpu_backend import engine_api
from ddsim.gpu_backend import triton_gdn as G


def parse_configs(ap, name: str, text: str) -> list[tuple[int, int]]:
    """--serial / --paths "BV/W,...": V tiles (16, 32, 64 or 128) and warps (1, 2, 4, 8) of a kernel's
    configurations, refused through ap.error (one line, exit 2) before any work."""
    try:
        out = [tuple(int(x) for x in s.split("/")) for s in text.split(",")]
    except ValueError:
        ap.error(f"--{name} {text!r}: expected BV/W,BV/W,...")
    for c in out:
        if len(c) != 2 or c[0] not in (16, 32, 64, 128) or c[1] not in (1, 2, 4, 8):
            ap.error(f"--{name} {text!r}: expected BV in 16, 32, 64, 128 and W in 1, 2, 4, 8, got {c}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x16,1x65,8x65,32x65,8x129,8x257")
    ap.add_argument("--serial", default="16/1,32/4")
    ap.add_argument("--paths", default="32/2,64/4")
    ap.add_argument("--mode", choices=("exact", "leaky"), default="exact")
    a = ap.parse_args()
    shapes, serial, configs = parse_shapes(ap, a.shapes), parse_configs(ap, "serial", a.serial), parse_configs(
        ap, "paths", a.paths)
    sgl, where = sglang_run("bench_node_states")
    print(cuda_header(a.commit) + f" | SGLang kernel {where} | mode {a.mode}")
    exact = a.mode == "exact"
    bw = copy_bandwidth("cuda")
    print(f"# floor: the node states' bytes written once over the measured copy bandwidth {bw / 1e9:.0f} GB/s")
    names = [f"serial {bv}/{w}" for bv, w in serial] + [f"paths {bv}/{w}" for bv, w in configs]
    cols = ["sglang exact", "ddsim drop-in (design auto)"] + names
    print("| B x T | mean path steps | write floor | buffer zeroed | " + " | ".join(cols)
          + " | device: sglang / " + " / ".join(names) + " | largest difference from " + names[0] + " |")
    print("|---|---|---|---|" + "---|" * (len(cols) + 2))
    dev = "cuda"
    for B, T in shapes:
        _, _, inp, a_, b_, zeros, pool, slots, par, plan, pslots, buf, rows, prows = sglang_layer(B, T, device=dev)
        HV, V = inp["v"].shape[2:]
        q, k, v = inp["q"], inp["k"], inp["v"]
        steps = float((plan.root_paths() >= 0).sum()) / (B * T)

        def sg_exact():
            sgl(zeros, a_, zeros, 1.0, 20.0, q, k, v, b_, pool, slots, use_qk_l2norm_in_kernel=True,
                disable_state_update=True, intermediate_states_buffer=buf, intermediate_state_indices=rows,
                cache_steps=T, retrieve_parent_token=par if exact else None)

        def dropin():
            engine_api.target_verify(zeros, a_, zeros, 1.0, 20.0, q, k, v, b_, pool, pslots,
                                     retrieve_parent_token=plan if exact else None, intermediate_states_buffer=buf,
                                     intermediate_state_indices=prows, cache_steps=T)

        def alone(design, bv=32, w=4):
            bufd = torch.full_like(buf, float("nan"))
            launch, (o, _) = G.plan_recurrent(q, k, v, parents=plan, initial_state=pool.transpose(-1, -2),
                                              state_indices=pslots, a=a_, b=b_, A_log=zeros, dt_bias=zeros,
                                              states_out=bufd.transpose(-1, -2), states_rows=prows, design=design,
                                              block_v=bv, num_warps=w, poison=True, mode=a.mode)
            return launch, o, bufd

        kernels = ({f"serial {bv}/{w}": alone("serial", bv, w) for bv, w in serial}
                   | {f"paths {bv}/{w}": alone("paths", bv, w) for bv, w in configs})
        for launch, _, _ in kernels.values():
            launch()
        torch.cuda.synchronize()
        _, o_ref, b_ref = kernels[names[0]]
        diff = [max(float((o.float() - o_ref.float()).abs().max()), float((bd - b_ref).abs().max()))
                for _, o, bd in kernels.values()]
        auto = "paths" if G.paths_design(B, HV, V, a.mode) else "serial"
        t = [median_us(sg_exact), median_us(dropin)] + [median_us(launch) for launch, _, _ in kernels.values()]
        d = [kernel_device_us(sg_exact)] + [kernel_device_us(launch) for launch, _, _ in kernels.values()]
        floor = buf.numel() * 4 / bw * 1e6
        zeroed = median_us(buf.zero_)
        print(f"| {B} x {T} | {steps:.1f} | {floor:.1f} | {zeroed:.1f} | " + " | ".join(f"{x:.1f}" for x in t[:1]) + f" | {t[1]:.1f} "
              f"({auto}) | " + " | ".join(f"{x:.1f}" for x in t[2:]) + " | " + " / ".join(f"{x:.1f}" for x in d)
              + " | " + " / ".join(f"{x:.1e}" if x else "0" for x in diff) + " |", flush=True)
    print("times in microseconds per call (do_bench), device: the kernels' own time after the flush")


if __name__ == "__main__":
    main()
