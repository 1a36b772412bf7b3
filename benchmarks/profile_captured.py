"""Where a captured drop-in call's time goes: engine_api.target_verify (snapshot-free, and with SGLang's buffer) and
commit_accepted on SGLang's raw step tensors, n GDN layers in one CUDA graph (as drop_in_graphed.py), against the
same calls given a plan made before the capture (plan_tree, plan_slots, plan_accepted: the tables made on the host,
so the step's launch in the graph only checks and copies; a fixed tree, as a static-tree engine's), the verify with
one of the two planned (the tree or the slots), and the kernels' own device time per layer, split by kernel
(torch.profiler over graph replays), at Qwen3.6-27B GDN shapes. --depths D,...: the planned verify again with its
trees' depth taken as each D (at least the trees' own), so that the solve runs the doubling rounds of a deeper tree
(a captured raw tree's plan takes T - 1): the extra rounds multiply by zero powers of the solve's matrix, the same
bits, so these forms time the rounds alone. --bound-rounds: a captured raw tree's solves run the rounds of its bound,
T - 1 (triton_gdn.DEVICE_ROUNDS off), as before each sequence's were read from the depths its tables' kernel writes.
--step-warps: the step kernel's warps (the device checks' launch, triton_checks.STEP_WARPS). --walk-chunk: the most
columns a chunk of its tables' walk takes (triton_tables.MAX_CHUNK).

    python benchmarks/profile_captured.py [--commit SHA] [--shapes 1x16,1x65,8x65,32x65] [--layers 48] [--gib 40]
                                          [--depths 3,5,9,15] [--bound-rounds] [--step-warps 1|2|4|8]
                                          [--walk-chunk 16|32|64|128]
"""
import argparse
import collections

import torch
from drop_in_graphed import options, step_layers

from ddsim.bench.bench import cuda_run, event_median_ms, layers_graph
from ddsim.gpu_backend import engine_api, triton_checks, triton_gdn, triton_tables


def _split(graph, n: int, replays: int = 10) -> dict:
    """{kernel name: device us per layer} over ``replays`` replays of a graph of n layers."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    out = collections.Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            out[e.name[:60]] += e.time_range.elapsed_us() / (n * replays)
    return out


def _depth_list(text: str) -> list[int]:
    """--depths' value: integers >= 1, comma-separated (argparse's one line and exit 2 otherwise)."""
    try:
        depths = [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers D,D,...") from None
    if any(d < 1 for d in depths):
        raise argparse.ArgumentTypeError(f"{text!r}: expected depths >= 1")
    return depths


def _depths(ap) -> None:
    ap.add_argument("--depths", type=_depth_list, default=[], help="comma-separated depths to plan the verify's trees at")
    ap.add_argument("--bound-rounds", action="store_true", help="a device plan's solves at T - 1's rounds")
    ap.add_argument("--step-warps", type=int, choices=(1, 2, 4, 8), default=None,
                    help="the step kernel's warps (triton_checks.STEP_WARPS; unset: its default)")
    ap.add_argument("--walk-chunk", type=int, choices=(16, 32, 64, 128), default=None,
                    help="the columns a chunk of the tables' walk takes at most (triton_tables.MAX_CHUNK; unset: its "
                         "default)")


def deeper(plan, depth: int):
    """plan (a TreePlan, its exact tables built) with its trees' depth taken as ``depth`` where that is deeper: the
    solve's doubling rounds then a deeper tree's."""
    mask, own = plan.ancestors("exact")
    plan._cache[("anc", "exact")] = (mask, max(own, depth))
    return plan


def main():
    a, shapes = options(_depths)
    depths = a.depths
    triton_gdn.DEVICE_ROUNDS = not a.bound_rounds
    if a.step_warps is not None:
        triton_checks.STEP_WARPS = a.step_warps
    if a.walk_chunk is not None:
        triton_tables.MAX_CHUNK = a.walk_chunk
    cuda_run("profile_captured", a.commit)
    print(f"# a device plan's rounds: {'the bound, T - 1' if a.bound_rounds else 'each sequence its own'}; the step "
          f"kernel's warps: {triton_checks.STEP_WARPS}; the tables' walk: "
          f"{triton_tables.MAX_CHUNK} columns a chunk at most")
    for B, T in shapes:
        par, acc, layers = step_layers(B, T, a.layers, a.gib)
        n = len(layers)
        plan = engine_api.plan_tree(par)
        slots = engine_api.plan_slots(layers[0]["pool"], layers[0]["slots"])
        p_acc = engine_api.plan_accepted(plan, acc)
        rows = engine_api.plan_slots(layers[0]["buf"], layers[0]["rows"])

        def verify(x, tree, s, r=None):
            engine_api.target_verify(x["zeros"], x["a"], x["zeros"], 1.0, 20.0, x["q"], x["k"], x["v"], x["b"],
                                     x["pool"], s, retrieve_parent_token=tree,
                                     **({} if r is None else dict(intermediate_states_buffer=x["buf"],
                                                                  intermediate_state_indices=r, cache_steps=T)))

        def commit(x, tree, s, c):
            engine_api.commit_accepted(x["zeros"], x["a"], x["zeros"], x["k"], x["v"], x["b"], x["pool"], s,
                                       retrieve_parent_token=tree, accepted=c)

        forms = {"verify, raw tensors": lambda x: verify(x, par, x["slots"]),
                 "verify, planned": lambda x: verify(x, plan, slots),
                 # each half of the plan alone: which of the raw tree and the raw slots the raw call's time is in
                 "verify, raw tree, planned slots": lambda x: verify(x, par, slots),
                 "verify, planned tree, raw slots": lambda x: verify(x, plan, x["slots"]),
                 "drop-in (buffer), raw tensors": lambda x: verify(x, par, x["slots"], x["rows"]),
                 "drop-in (buffer), planned": lambda x: verify(x, plan, slots, rows),
                 "commit, raw tensors": lambda x: commit(x, par, x["slots"], acc),
                 "commit, planned": lambda x: commit(x, plan, slots, p_acc)}
        own = plan.ancestors("exact")[1]
        for d in depths:  # a fresh plan each (fastcall keeps its recipes on the plan)
            forms[f"verify, planned, depth {max(own, d)} (the trees' {own})"] = (
                lambda x, p=deeper(engine_api.plan_tree(par), d): verify(x, p, slots))
        pools = [x["pool"].clone() for x in layers]
        print(f"\n## {B} x {T}, {n} layers a graph: us per layer (graph replays, median of 20), and the kernels' "
              "device time per layer (torch.profiler over 10 replays)\n")
        print("| form | graphed us/layer | kernels' device us/layer | by kernel |")
        print("|---|---|---|---|")
        for name, fn in forms.items():
            graph = layers_graph([(lambda x=x: fn(x)) for x in layers])
            us = event_median_ms(graph.replay, repeats=20) * 1e3 / n
            split = _split(graph, n)
            by = ", ".join(f"{k} {v:.2f}" for k, v in split.most_common()) or "(no kernel records from the replays)"
            print(f"| {name} | {us:.1f} | {sum(split.values()):.1f} | {by} |", flush=True)
            del graph
            for x, p in zip(layers, pools):
                x["pool"].copy_(p)
        del layers, pools
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
