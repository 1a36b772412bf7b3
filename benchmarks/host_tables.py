"""The host's part of a CUDA-graph verify that grows with the tree: building its index tables on the CPU
(ddsim.model.graphs.StaticPlan.load: the source order, the conv source table and the
ancestor mask the WY kernels read, the root paths): a graph's StaticPlan.load itself (its four tables refilled,
into CPU buffers here), the same load with the tables built on the device (graphs.DEVICE_TABLES: the parents alone
copied; the device's kernel is not timed here), the whole plan as TreePlan builds it on the CPU (numpy), and its tables alone with
gpu_backend.host_tables' numpy builders beside the torch builders they replaced there (gpu_backend.checks, what a
plan on a GPU still runs), on DDTree trees of the budgets given (top-k 8, a random draft of depth 8). Median
microseconds per tree, one torch thread.

    python benchmarks/host_tables.py [--budgets 16,64] [--W 4] [--n 500] [--commit SHA]
"""
import platform
import statistics
import time

import torch

from ddsim.cli import _budgets, _int_in, _Parser
from ddsim.gpu_backend import checks
from ddsim.model.graphs import StaticPlan
from ddsim.trees.builders import ddtree


def median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main():
    ap = _Parser(prog="host_tables")  # bad input: one line, exit 2
    ap.add_argument("--budgets", type=_budgets, default=[16, 64])
    ap.add_argument("--W", type=_int_in(2), default=4, help="the conv window (Qwen3.6's 4)")
    ap.add_argument("--n", type=_int_in(1), default=500)
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# {time.strftime('%Y-%m-%d')} | {platform.processor() or platform.machine()} CPU | torch {torch.__version__} | "
          f"commit {a.commit}")
    print("| nodes | depth | StaticPlan.load (4 tables refilled), us | the same, the tables built on the device "
          "(the parents copied), us | plan on the host (validated, numpy tables), us | the tables alone: numpy / "
          "torch ops, us |")
    print("|---|---|---|---|---|---|")
    for budget in a.budgets:
        tree = ddtree(torch.randn(8, 1000, generator=torch.Generator().manual_seed(budget)) * 3.0, budget, 8)
        parents = torch.tensor(tree.parents)[None]

        def plan():
            p = checks.TreePlan(parents)
            p.conv_table("exact", a.W), p.ancestors("exact")

        src = checks.mode_parents(parents, "exact")
        plan()  # warm-up
        np_tables = median_us(lambda: (checks.host_tables.conv_sources(src.numpy(), a.W),
                                       checks.host_tables.ancestor_mask(src.numpy())), a.n)
        torch_tables = median_us(lambda: (checks.conv_sources(src, a.W).to(torch.int32).contiguous(),
                                          checks.ancestor_mask(src)), a.n)
        static = StaticPlan(tree.size, "cpu", max_depth=int(tree.depths.max()))
        static.load(tree)
        static.src("exact"), static.conv_table("exact", a.W), static.ancestors("exact"), static.root_paths()
        load = median_us(lambda: static.load(tree), a.n)
        static.on_device = True  # graphs.DEVICE_TABLES: load copies the parents, the graph builds the rest
        parents_only = median_us(lambda: static.load(tree), a.n)
        print(f"| {tree.size} | {int(tree.depths.max())} | {load:.0f} | {parents_only:.0f} | {median_us(plan, a.n):.0f} "
              f"| {np_tables:.0f} / {torch_tables:.0f} |", flush=True)


if __name__ == "__main__":
    main()
