"""The served one-kernel form at one block of at most 16 nodes, in Gluon (gpu_backend.gluon_gdn, triton_gdn.FUSED_GLUON
on: design auto's launch) beside the Triton form it replaced (FUSED_GLUON off), in one process, the rows interleaved
round by round; Qwen3.6-27B GDN shapes (H=16, HV=48, K=V=128), bf16 inputs, DDTree trees. For each shape:

  kernels alone           plan_wy's launch on the states by sequence, the gates given: what issue #36's bound at
                          1 x 16 (8 us, H200) is set on (bench_engine_api.py's "kernels alone")
  through slots           the same with the states in a pool of 2 B rows read through a slot table
  engine_api verify       engine_api.target_verify in SGLang's calling convention (the gates fused, the pool in
                          SGLang's layout, q, k, v views of one projection's rows as SGLang's layer hands them over),
                          the public call with the step's plans: what an engine launches

Printed first: each form's output against the float64 oracle (the share of entries off the oracle rounded to bf16,
bench.off_rounded) and whether the two kernels' outputs are finite, then the timing table (bench.timing_rounds: the
timer, the median of --calls do_bench calls, and three device times after do_bench's flush, one warm). --layers N
(N > 0) adds, each round, both kernels replayed from one CUDA graph of N layers' verifies (design auto, each layer its
own inputs; the states by sequence and through slots; bench.graphed_layers_us, us a layer), as a server's replayed
verify runs a model's GDN layers (Qwen3.6-27B has 48).

    python benchmarks/gluon_served.py [--commit SHA] [--shapes 1x16,1x9] [--calls 5] [--rounds 2] [--layers 48]
"""
import argparse
from unittest import mock

import torch

from ddsim import oracle
from ddsim.bench.bench import (
    at_least_one,
    cuda_run,
    ddtree_batch,
    graphed_layers_us,
    kernel_inputs,
    off_rounded,
    parse_shapes,
    sglang_layer,
    slotted_pool,
    timing_options,
    timing_rounds,
)


def forms_at(B: int, T: int, gluon: bool) -> dict:
    """{name: (launch, output, the float64 oracle's output)} of the three forms at B x T, planned with
    triton_gdn.FUSED_GLUON = ``gluon``."""
    from ddsim.engines.kernel_cases import split_views
    from ddsim.gpu_backend import engine_api, triton_gdn
    torch.manual_seed(0)  # sglang_layer's pool: the same in both forms
    _, parents = ddtree_batch(B, T)
    inp = kernel_inputs(B, T, dtype=torch.bfloat16, device="cuda")
    qkvgb = {n: inp[n] for n in ("q", "k", "v", "g", "beta")}
    kpool, kslots = slotted_pool(inp["initial_state"])
    lay = sglang_layer(B, T)
    q, k, v = split_views({"q": lay.inp["q"], "k": lay.inp["k"], "v": lay.inp["v"]}).values()
    with mock.patch.object(triton_gdn, "FUSED_GLUON", gluon):  # restored however the planning ends
        alone, o_alone = triton_gdn.plan_wy(**qkvgb, parents=parents.cuda(), initial_state=inp["initial_state"],
                                            poison=True)
        slotted, o_slotted = triton_gdn.plan_wy(**qkvgb, parents=parents.cuda(), initial_state=kpool,
                                                state_indices=kslots, poison=True)
        out = {}

        def engine():
            out["o"] = engine_api.target_verify(lay.zeros, lay.a, lay.zeros, 1.0, 20.0, q, k, v, lay.b, lay.pool,
                                                lay.pslots, retrieve_parent_token=lay.plan)
        engine()  # planned (and recorded for replay) under this setting
    ref = oracle.gdn_tree_verify(**{n: x.cpu() for n, x in qkvgb.items()}, parents=parents,
                                 initial_state=inp["initial_state"].cpu())
    # the engine's gates as its kernel makes them from a and b (A_log = dt_bias = 0)
    fused = dict(g=-torch.nn.functional.softplus(lay.a.double().cpu()), beta=torch.sigmoid(lay.b.double().cpu()))
    eng = oracle.gdn_tree_verify(**{n: lay.inp[n].cpu() for n in ("q", "k", "v")}, **fused, parents=parents,
                                 initial_state=lay.pool[lay.slots.long()].transpose(-1, -2).cpu())
    return {"kernels alone": (alone, lambda: o_alone, ref), "through slots": (slotted, lambda: o_slotted, ref),
            "engine_api verify": (engine, lambda: out["o"], eng)}


def main():
    ap = argparse.ArgumentParser()
    timing_options(ap, rounds=2)
    ap.add_argument("--shapes", default="1x16,1x9")
    ap.add_argument("--layers", type=int, default=0, help="layers of the graphed replay (0: none)")
    a = ap.parse_args()
    at_least_one(ap, a, "calls", "rounds")
    if a.layers < 0:
        ap.error(f"--layers: expected 0 (no graphed replay) or more, got {a.layers}")
    shapes = parse_shapes(ap, a.shapes)
    if any(T > 16 or B != 1 for B, T in shapes):  # (design auto takes the head form for a batch: 3bbaadd's 2 x 16
        # rows timed it under both names)
        ap.error(f"--shapes: design auto takes the one-kernel form (the Gluon fold, or the Triton form) for one "
                 f"sequence of at most 16 nodes, got {a.shapes!r}")
    cuda_run("gluon_served", a.commit)
    launches = {}
    print("| shape | form | kernel | off the rounded oracle | finite |")
    print("|---|---|---|---|---|")
    for B, T in shapes:
        for gluon in (True, False):
            for name, (launch, out, ref) in forms_at(B, T, gluon).items():
                launch()
                torch.cuda.synchronize()
                o = out()
                kernel = "Gluon fold" if gluon else "Triton form"
                print(f"| {B} x {T} | {name} | {kernel} | {off_rounded(o, ref):.4%} | "
                      f"{bool(torch.isfinite(o).all())} |", flush=True)
                launches[f"{B} x {T}, {name}, {kernel}"] = launch
    timing_rounds(launches, rounds=a.rounds, calls=a.calls)
    if a.layers:
        graphed(shapes, a.layers, a.rounds)


def graphed(shapes, layers: int, rounds: int) -> None:
    """Both kernels replayed from one CUDA graph of ``layers`` verifies at each shape, round by round."""
    from ddsim.gpu_backend import triton_gdn
    print(f"| round | shape | states | kernel | graphed, {layers} layers, us a layer |")
    print("|---|---|---|---|---|")
    for rnd in range(rounds):  # (numbered from 0, as timing_rounds' rows)
        for B, T in shapes:
            _, parents = ddtree_batch(B, T)
            for slots in (False, True):
                for gluon in (True, False):
                    with mock.patch.object(triton_gdn, "FUSED_GLUON", gluon):
                        us = graphed_layers_us(B, T, parents, layers, slots=slots)
                    print(f"| {rnd} | {B} x {T} | {'through slots' if slots else 'by sequence'} | "
                          f"{'Gluon fold' if gluon else 'Triton form'} | {us:.2f} |", flush=True)


if __name__ == "__main__":
    main()
