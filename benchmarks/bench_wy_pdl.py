"""The folded WY form's two kernels (a program per head makes the output's weights, a program per V tile applies
them to the committed state) launched with programmatic dependent launch, the apply grid reading its state tile
before it waits, beside design auto's defaults: is a small tree's verify the state read with the weights' arithmetic
hidden under it? Issue #36 asks 8 us at 1 x 16, where the one-kernel form measures 12-13.

Rows per shape: design auto; design fold without PDL, with PDL waiting on per-head ready flags (zeroed by a memset
before each launch: pdl True), and with PDL waiting on the whole fold grid (griddepcontrol.wait, no flags: pdl
"grid"), each at 16-, 32- and 64-wide V tiles (more apply programs for narrower tiles: the state read spread over more
SMs); each kernel alone; whether each PDL form gives the plain launch's bits; and design auto against the best PDL
form as a server replays them, 48 layers' inputs back to back from one CUDA graph (us a layer).

    python benchmarks/bench_wy_pdl.py [--commit SHA] [--shapes 1x16,1x65,2x65,8x65] [--layers 48] [--warps]

--warps: instead, at each shape, the one-kernel form (design fused) over warps and V tiles, the fold kernel alone over
its warps (solve_warps), and the PDL grid form over both kernels' warps and the V tile: does a smaller tree's
dependent chain of small products run shorter in fewer warps (fewer threads to meet at each barrier)?
"""
import argparse

import torch

from ddsim.bench.bench import (
    copy_bandwidth,
    cuda_header,
    ddtree_batch,
    graphed_layers_us,
    kernel_bytes,
    kernel_inputs,
    median_us,
    parse_shapes,
    timed_resources,
)
from ddsim.gpu_backend.triton_gdn import auto_design, plan_wy

PDLS = (("off", False), ("flags", True), ("grid", "grid"))
TILES = (16, 32, 64)


def resources(launch) -> tuple[float, str]:
    ms, kernels = timed_resources(launch)
    return ms * 1e3, "; ".join(f"{c['name']} {c['regs']} regs {c['spills']} spilled" for c in kernels)


def warps(B, T, common):
    for nw in (2, 4, 8):
        for bv in (32, 64, 128):
            launch, _ = plan_wy(**common, design="fused", num_warps=nw, block_v=bv)
            us, comp = resources(launch)
            print(f"| {B} x {T} | fused | {bv} | {us:.1f} | | | {nw} warps | {comp} |", flush=True)
    for sw in (1, 2, 4):
        launch, _ = plan_wy(**common, design="fold", solve_warps=sw)
        print(f"| {B} x {T} | fold kernel alone | | | {median_us(launch.parts[0]):.1f} | | {sw} warps | |", flush=True)
    for sw in (1, 2, 4):
        for nw in (2, 4):
            for bv in (32, 64):
                launch, _ = plan_wy(**common, design="fold", pdl="grid", solve_warps=sw, num_warps=nw, block_v=bv)
                us, comp = resources(launch)
                print(f"| {B} x {T} | fold, PDL grid | {bv} | {us:.1f} | | | {sw} / {nw} warps | {comp} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="?")
    ap.add_argument("--shapes", default="1x16,1x65,2x65,8x65")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--warps", action="store_true", help="the warps and V tiles sweep instead (module docstring)")
    a = ap.parse_args()
    shapes = parse_shapes(ap, a.shapes)
    if a.layers < 0:
        ap.error(f"--layers: expected 0 or more, got {a.layers}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_wy_pdl: needs a CUDA device")
    bw = copy_bandwidth("cuda")
    print(cuda_header(a.commit))
    print("| B x T | form | V tile | us (do_bench) | fold kernel alone | apply kernel alone | same bits as no PDL | "
          "compiled |")
    print("|---|---|---|---|---|---|---|---|")
    for B, T in shapes:
        _, parents = ddtree_batch(B, T)
        inp = kernel_inputs(B, T, device="cuda")
        common = dict(**{k: inp[k] for k in ("q", "k", "v", "g", "beta")}, parents=parents.cuda(),
                      initial_state=inp["initial_state"], poison=False)
        launch, o = plan_wy(**common)
        us, comp = resources(launch)
        if a.warps:
            print(f"| {B} x {T} | auto ({auto_design(B, T, 'bf16x3')}) | | {us:.1f} | | | | {comp} |", flush=True)
            warps(B, T, common)
            continue
        launch()
        ref = o.clone()
        print(f"| {B} x {T} | auto ({auto_design(B, T, 'bf16x3')}) | | {us:.1f} | | | | {comp} |", flush=True)
        best = None
        for bv in TILES:
            plain = None
            for name, pdl in PDLS:
                launch, o = plan_wy(**common, design="fold", pdl=pdl, block_v=bv)
                us, comp = resources(launch)
                launch()
                torch.cuda.synchronize()
                if plain is None:
                    plain = o.clone()
                    same = "(reference)"
                else:
                    same = "yes" if torch.equal(o, plain) else f"NO (max diff {(o - plain).abs().max().item():.3g})"
                parts = " | ".join(f"{median_us(p):.1f}" for p in launch.parts) if name == "off" else " | "
                err = (o.float() - ref.float()).abs().max().item()
                print(f"| {B} x {T} | fold, PDL {name} | {bv} | {us:.1f} | {parts} | {same}; max diff from auto "
                      f"{err:.3g} | {comp} |", flush=True)
                if pdl and (best is None or us < best[0]):
                    best = (us, pdl, bv)
                del launch, o
        print(f"| {B} x {T} | memory floor | | {kernel_bytes(B, T)['wy'] / bw * 1e6:.1f} | | | | |")
        if a.layers and best:
            auto_us = graphed_layers_us(B, T, parents, a.layers)
            pdl_us = graphed_layers_us(B, T, parents, a.layers, design="fold", pdl=best[1], block_v=best[2])
            print(f"| {B} x {T} | graphed, {a.layers} layers in turn, us a layer: auto {auto_us:.1f}, fold PDL "
                  f"{best[1]} V tile {best[2]} {pdl_us:.1f} | | | | | | |", flush=True)
    print("kernels alone (the launch plan_wy returns), median us of do_bench (each call alone, L2 flushed before it); "
          "Qwen3.6-27B GDN shapes, bf16 inputs, DDTree trees")


if __name__ == "__main__":
    main()
