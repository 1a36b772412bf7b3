"""Where a serving verify's GPU time goes at full size, against the floor of reading the weights once.

The Qwen3.6-27B-shaped model (random bf16 weights), one DDTree tree per budget. For each glue (the layers'
norms, gates, gated activations and tree attention as one Triton kernel each, the CUDA default, and PyTorch's ops):
the exact serving verify (no per-node states) replayed from CUDA graphs (ddsim.model.graphs), ms per tree, beside
its CUDA graph alone (the rest is the host's part: --host-profile says where it goes, by function and by phase),
and the eager verify under torch.profiler, kernels grouped by name and by kind (GEMMs, the recurrent kernels, glue, copies);
and the first glue's replay captured with NaN-filled outputs, as the audit captures it (gpu_backend.poisoned).
The floor: the weights' bytes at the rate a kernel streaming them reaches (the MLP matrices each summed once,
replayed from a CUDA graph); beside it every weight matrix read by a one-row GEMM (a decode step's GEMMs alone,
graphed) and the bytes over the H200's nominal 4.8 TB/s.

    python benchmarks/profile_verify.py [--budgets 16,64] [--glues triton,torch] [--top 25] [--skip-profile]
                                        [--host-profile] [--auto-head on|off|both] [--variants] [--commit SHA]

--variants first times the serving verify (the first glue) with the graph's savings added one at a time, in this
run: none; tree attention reading the committed prefix rows only (graphs.ATTEND_COMMITTED_ROWS); each block's last
residual add left to the next norm (HybridModel.defer_residuals); the projections of one input laid side by side
(HybridModel.lay_projections, made once the others are timed: the model is built unlaid); the tree's exact tables
built in the graph from its parents (graphs.DEVICE_TABLES). The rest of the run is the
model as made on CUDA (the defaults).
"""
import gc
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from ddsim.bench.bench import cuda_header, event_median_ms, graphed_us
from ddsim.cli import _budgets, _int_in, _Parser
from ddsim.gpu_backend import GLUES, poisoned, triton_gdn
from ddsim.model import graphs
from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree

PEAK_BYTES_PER_S = 4.8e12  # the H200's HBM3e, as specified


def _kind(name: str) -> str:
    n = name.lower()
    if "nvjet" in n or "gemm" in n or "splitk" in n or "cutlass" in n:
        return "GEMMs"
    if "_gdn_" in n or "_tree_conv" in n or "attention" in n or "_commit" in n:
        return "recurrence, conv, attention"
    if any(k in n for k in ("_rms_norm", "_gated_", "_gdn_gates")):
        return "glue kernels"
    if "copy" in n or "cat" in n or "fill" in n:
        return "copies, fills"
    return "other elementwise"


def replay_ms(fn, repeats=20) -> float:
    """Median ms of fn() (a replay), synchronised around each call."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def weight_floor_ms(model) -> float:
    """Every 2-D weight read once by a one-row GEMM (x [1, in] @ W^T), the whole pass replayed from a CUDA graph."""
    mats = [w for w in model.w.values() if w.dim() == 2 and w.is_cuda]
    xs = {w.shape[1]: torch.randn(1, w.shape[1], device="cuda", dtype=w.dtype) for w in mats}

    def read_all():
        for w in mats:
            F.linear(xs[w.shape[1]], w)
    return graphed_us([read_all]) / 1e3


def streamed_read_tb_s(model) -> float:
    """TB/s of reading the MLP's weight matrices (the largest) once each by a full reduction, graphed: the rate a
    kernel that only streams the weights reaches on this device."""
    mats = [w for w in model.w.values() if w.dim() == 2 and w.is_cuda and w.numel() * w.element_size() >= 64 << 20]
    out = torch.empty(len(mats), device="cuda")

    def read_all():
        for i, w in enumerate(mats):
            torch.sum(w, dim=(0, 1), dtype=torch.float32, out=out[i])
    return sum(w.numel() * w.element_size() for w in mats) / graphed_us([read_all]) / 1e6


def profile_eager(model, state, tree, top: int) -> None:
    for _ in range(2):
        model.verify(state, tree, keep_states=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.verify(state, tree, keep_states=False)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0)]
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    total = sum(getattr(e, key) for e in events)
    count = sum(e.count for e in events)
    print(f"  eager serving verify of {tree.size} nodes: {count} GPU ops, {total / 1e3:.2f} ms of GPU time")
    kinds: dict = {}
    for e in events:
        k = kinds.setdefault(_kind(e.key), [0, 0.0])
        k[0] += e.count
        k[1] += getattr(e, key)
    print("  | kind | kernels | GPU ms | share |\n  |---|---|---|---|")
    for name, (n, us) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"  | {name} | {n} | {us / 1e3:.3f} | {us / total:.1%} |")
    print("  | kernel | calls | GPU ms | share |\n  |---|---|---|---|")
    for e in sorted(events, key=lambda e: -getattr(e, key))[:top]:
        print(f"  | {e.key[:90]} | {e.count} | {getattr(e, key) / 1e3:.3f} | {getattr(e, key) / total:.1%} |")


def graph_alone_ms(graphed, state, tree, repeats=20) -> float:
    """Median ms of the verify's CUDA graph alone (its replay between two CUDA events, the inputs already in its
    buffers): the verify without the host's part (checking the tree, building its tables, copying them in)."""
    graphed.verify(state, tree)
    return event_median_ms(graphed._keys[graphed.key(state, tree, "exact", False)].verify_graph.replay, repeats=repeats)


def host_profile(graphed, state, tree, top: int, repeats=20) -> None:
    """Where the host's part of a graphed verify goes: cProfile over ``repeats`` verifies (each synchronised), the
    functions taking the most time of their own."""
    import cProfile
    import io
    import pstats
    graphed.verify(state, tree)
    prof = cProfile.Profile()
    for _ in range(repeats):
        torch.cuda.synchronize()
        prof.enable()
        graphed.verify(state, tree)
        torch.cuda.synchronize()
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    print(f"  host profile of {repeats} graphed verifies (each synchronised):")
    print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip()), flush=True)
    host_phases(graphed, state, tree, repeats)


def host_phases(graphed, state, tree, repeats=20) -> None:
    """The host's part of a graphed verify by phase, without a profiler: the median host microseconds of each
    phase over ``repeats`` verifies (each synchronised), timed by wrapping the functions that run them."""
    import time

    from ddsim.model import graphs
    spans: dict = {}
    wrapped = [(graphed.model, "check_tree"), (graphs.StaticPlan, "load"), (graphs._Captured, "load"),
               (torch.cuda.CUDAGraph, "replay")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in wrapped]

    def timed(label, fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spans.setdefault(label, []).append(time.perf_counter() - t0)
        return run
    try:
        for obj, name, fn in saved:
            setattr(obj, name, timed(f"{getattr(obj, '__name__', type(obj).__name__)}.{name}", fn))
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graphed.verify(state, tree)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            spans.setdefault("verify() returns", []).append(t1 - t0)
            spans.setdefault("then the GPU finishes", []).append(time.perf_counter() - t1)
    finally:
        for obj, name, fn in saved:
            if isinstance(obj, type):
                setattr(obj, name, fn)
            else:  # the instance's own attribute goes: its class's method shows through again
                delattr(obj, name)
    print("  host phases (median us per verify; the tree plan's load is inside the captured key's):")
    for label, xs in spans.items():
        xs = sorted(xs)
        print(f"    {label}: {xs[len(xs) // 2] * 1e6:.0f} us ({len(xs) // repeats} a verify)")


def variants(model, state, trees, glue: str) -> None:
    """The graphed serving verify (whole, and its graph alone) with the savings added one at a time (--variants);
    leaves the model laid and the other settings at their defaults."""
    model.glue = glue
    steps = [("none", dict(rows=False, defer=False, lay=False, tables=False)),
             ("+ attention reads the committed rows", dict(rows=True, defer=False, lay=False, tables=False)),
             ("+ residual adds left to the next norm", dict(rows=True, defer=True, lay=False, tables=False)),
             ("+ projections laid side by side", dict(rows=True, defer=True, lay=True, tables=False)),
             ("+ tables built on the device", dict(rows=True, defer=True, lay=True, tables=True))]
    rows = []
    default_tables = graphs.DEVICE_TABLES
    for name, on in steps:
        graphs.ATTEND_COMMITTED_ROWS, model.defer_residuals = on["rows"], on["defer"]
        graphs.DEVICE_TABLES = on["tables"]
        if on["lay"]:
            print(f"laid {model.lay_projections()} groups of projections", flush=True)
        graphed = GraphedModel(model)
        for budget, tree in trees.items():
            graphed.verify(state, tree)
            ms = replay_ms(lambda g=graphed, t=tree: g.verify(state, t))
            alone = graph_alone_ms(graphed, state, tree)
            rows.append((name, budget, tree.size, ms, alone))
            print(f"  {name}, budget {budget}: {ms:.2f} ms per verify, the graph alone {alone:.2f}", flush=True)
        graphed = None
        gc.collect()
        torch.cuda.empty_cache()
    graphs.DEVICE_TABLES = default_tables  # the rest of the run as the model is made
    print(f"\n| glue {glue}: savings | budget | nodes | graphed verify, ms | the graph alone, ms |\n|---|---|---|---|---|")
    for name, budget, n, ms, alone in rows:
        print(f"| {name} | {budget} | {n} | {ms:.2f} | {alone:.2f} |")
    print(flush=True)


def main():
    ap = _Parser(prog="profile_verify")  # bad input: one line, exit 2
    ap.add_argument("--budgets", type=_budgets, default=[16, 64])
    ap.add_argument("--glues", default="triton,torch")
    ap.add_argument("--top", type=_int_in(1), default=40)
    ap.add_argument("--preset", default="qwen3.6-27b")
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--host-profile", action="store_true", help="cProfile the host's part of each graphed verify")
    ap.add_argument("--auto-head", default="on", choices=["on", "off", "both"],
                    help="whether the GDN verify's design auto takes the head form (triton_gdn.AUTO_HEAD, AUTO_HEAD_ONE); "
                         "both: each, one after the other in this run")
    ap.add_argument("--variants", action="store_true",
                    help="first time the serving verify with the graph's savings added one at a time")
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    glues = a.glues.split(",")
    if not glues or any(g not in GLUES for g in glues):
        ap.error(f"--glues: expected a comma-separated list of {', '.join(GLUES)}, got {a.glues!r}")
    if not torch.cuda.is_available():
        raise SystemExit("profile_verify: needs a CUDA device")
    cfg = get_preset(a.preset)
    print(cuda_header(a.commit) + f" | {cfg.name}", flush=True)
    # --variants lays the projections once it has timed them unlaid
    model = HybridModel(cfg, init_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda"), device="cuda",
                        dtype=torch.bfloat16, lay=not a.variants)
    weight_bytes = sum(v.numel() * v.element_size() for v in model.w.values())
    gemv = weight_floor_ms(model)
    rate = streamed_read_tb_s(model)
    floor = weight_bytes / rate / 1e9
    nominal = weight_bytes / PEAK_BYTES_PER_S * 1e3
    print(f"weights {weight_bytes / 1e9:.1f} GB: streamed at {rate:.2f} TB/s (the MLP matrices summed, graphed) "
          f"{floor:.2f} ms; read by one-row GEMMs (graphed) {gemv:.2f} ms ({weight_bytes / gemv / 1e9:.2f} TB/s); at "
          f"4.8 TB/s {nominal:.2f} ms", flush=True)
    prompt = torch.randint(0, cfg.vocab_size, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    state, _ = model.prefill(prompt[:-1])
    rows = []
    trees = {b: ddtree(torch.randn(8, cfg.vocab_size, generator=torch.Generator().manual_seed(b)) * 3.0, b,
                       root_token=prompt[-1]) for b in a.budgets}
    if a.variants:
        variants(model, state, trees, glues[0])
    # (glue, NaN-poisoned outputs): as a server runs it, and the first glue as the audit captures it (poisoned)
    runs = [(g, False, True) for g in glues] + [(glues[0], True, True)]
    if a.auto_head != "on":  # the same runs with design auto's two-kernel forms, in place or after
        off = [(g, p, False) for g, p, _ in runs]
        runs = off if a.auto_head == "off" else runs + off
    for glue, poison, head in runs:
        triton_gdn.AUTO_HEAD = head
        triton_gdn.AUTO_HEAD_ONE = head
        model.glue = glue
        with poisoned(poison):
            graphed = GraphedModel(model)
            for budget, tree in trees.items():
                print(f"glue {glue}{', poisoned' if poison else ''}{'' if head else ', GDN head form off'}, "
                      f"budget {budget}:", flush=True)
                if not a.skip_profile and not poison:
                    profile_eager(model, state, tree, a.top)
                graphed.verify(state, tree)
                ms = replay_ms(lambda g=graphed, t=tree: g.verify(state, t))
                rows.append((glue + (" (outputs NaN-filled first, as in the audit)" if poison else "")
                             + ("" if head else " (GDN head form off)"), budget, tree.size, ms))
                alone = graph_alone_ms(graphed, state, tree)
                if a.host_profile and not poison:
                    host_profile(graphed, state, tree, 18)
                print(f"  CUDA-graph replay: {ms:.2f} ms per verify (host copies included); the graph alone "
                      f"{alone:.2f} ms", flush=True)
        graphed = None  # its graphs freed before the next glue's
        gc.collect()
        torch.cuda.empty_cache()
    print("\n| glue | budget | nodes | graphed exact verify, ms | / weights streamed | / one-row GEMMs | "
          "/ weights at 4.8 TB/s |")
    print("|---|---|---|---|---|---|---|")
    for glue, budget, n, ms in rows:
        print(f"| {glue} | {budget} | {n} | {ms:.2f} | {ms / floor:.2f}x | {ms / gemv:.2f}x | {ms / nominal:.2f}x |")


if __name__ == "__main__":
    main()
