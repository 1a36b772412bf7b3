"""Whether each family's Triton recurrent kernel gives a leaky verify the exact verify's bits on order-exact nodes
(the root, and each node whose parent is the node before it and order-exact), compiled on a GPU: the outputs and
per-node states of both modes on DDTree trees (whose first nodes run a chain), random fp32 inputs, at a small shape
and at the family's serving shape. The two modes run one kernel compiled twice (parent-indexed for exact, flattened
for leaky), so a node's arithmetic is the same in both, up to what ptxas contracts into FMAs in each compilation.
KDA, lightning attention and Mamba1 compile theirs without contraction (gpu_backend._common.ONE_ARITHMETIC): each row
gives the bits as launched and with contraction (the option off), and each mode's verify time both ways (the median
of 5 bench.median_us calls and their range, bf16 inputs, no per-node states). GDN for reference: its kernels keep
their contractions (both columns alike), and its exact verify runs another kernel (the paths design), not a second
compilation.

    python benchmarks/order_exact_bits.py [--commit SHA] [--cases 30]
"""
import argparse

import torch

import ddsim.gpu_backend as gb
from ddsim.bench.bench import cuda_run, ddtree_batch, median_us_calls
from ddsim.gpu_backend import _common as C


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, device="cuda")


def _rand(gen, *shape):
    return torch.rand(*shape, generator=gen, device="cuda")


def _delta_rule(B, T, H, K, V, gen, *, g_per_key: bool):
    """KDA's (a log decay per key channel) or GDN's (one per head) layer inputs."""
    return dict(q=_randn(gen, B, T, H, K), k=_randn(gen, B, T, H, K), v=_randn(gen, B, T, H, V),
                g=-_rand(gen, B, T, H, *((K,) if g_per_key else ())), beta=_rand(gen, B, T, H),
                initial_state=_randn(gen, B, H, K, V))


def _kda(B, T, H, K, V, gen):
    return _delta_rule(B, T, H, K, V, gen, g_per_key=True)


def _gdn(B, T, H, K, V, gen):
    return _delta_rule(B, T, H, K, V, gen, g_per_key=False)


def _lightning(B, T, H, K, V, gen):
    return dict(q=_randn(gen, B, T, H, K), k=_randn(gen, B, T, H, K), v=_randn(gen, B, T, H, V),
                decay=_rand(gen, H) * 0.5 + 0.5, initial_state=_randn(gen, B, H, K, V))


def _mamba1(B, T, I, N, _, gen):
    return dict(x=_randn(gen, B, T, I), dt=_randn(gen, B, T, I), A=-_rand(gen, I, N) - 0.1, B=_randn(gen, B, T, N),
                C=_randn(gen, B, T, N), D=_randn(gen, I), dt_bias=_randn(gen, I), initial_state=_randn(gen, B, I, N))


# family: (inputs, verify, its recurrent backend, shapes (B, T, heads or channels, K or N, V)): one of odd widths (where
# the property tests first found KDA's and Mamba1's modes apart), then the family's serving shape (Kimi Linear's KDA,
# MiniMax's lightning attention, Jamba's Mamba1, Qwen3.6-27B's GDN)
FAMILIES = {
    "kda": (_kda, gb.kda_tree_verify, "triton-recurrent", [(2, 9, 1, 3, 1), (2, 16, 32, 128, 128)]),
    "lightning": (_lightning, gb.lightning_tree_verify, "triton-recurrent", [(2, 9, 3, 5, 3), (2, 16, 64, 128, 128)]),
    "mamba1": (_mamba1, gb.mamba1_tree_verify, "triton", [(2, 9, 1, 1, 0), (2, 16, 8192, 16, 0)]),
    "gdn": (_gdn, gb.gdn_tree_verify, "triton-recurrent", [(2, 9, 2, 3, 5), (2, 16, 48, 128, 128)]),
}


def _differ(verify, x, parents, ox, backend) -> list:
    """[(entries that differ, of how many, largest difference)] of the outputs and the per-node states of the two
    modes on the order-exact nodes ``ox``."""
    kw = dict(parents=parents, output_states=True, backend=backend)
    got = []
    for e, l in zip(verify(**x, **kw, mode="exact"), verify(**x, **kw, mode="leaky")):
        e, l = e[ox], l[ox]
        got.append((int((e != l).sum()), e.numel(), (e.float() - l.float()).abs().max().item()))
    return got


def _bits(verify, inputs, shape, backend, cases) -> str:
    B, T = shape[:2]
    gen = torch.Generator(device="cuda").manual_seed(0)
    tot = [[0, 0, 0.0], [0, 0, 0.0]]
    for case in range(cases):
        trees, parents = ddtree_batch(B, T, seed=case)
        ox = torch.tensor([list(t.order_exact) for t in trees], device="cuda")
        for acc, (d, n, m) in zip(tot, _differ(verify, inputs(*shape, gen), parents.cuda(), ox, backend)):
            acc[0], acc[1], acc[2] = acc[0] + d, acc[1] + n, max(acc[2], m)
    return "; ".join(f"{what} {d} of {n} differ (max {m:.1e})" for what, (d, n, m) in zip(("o", "states"), tot))


def _times(verify, inputs, shape, backend) -> str:
    B, T = shape[:2]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = inputs(*shape, gen)
    x = {k: v.to(torch.bfloat16) if k in ("q", "k", "v", "x", "B", "C") else v for k, v in x.items()}
    _, parents = ddtree_batch(B, T)
    plan = gb.TreePlan(parents.cuda())
    cells = []
    for mode in ("exact", "leaky"):
        t = median_us_calls(lambda: verify(**x, parents=plan, mode=mode, backend=backend), 5)
        cells.append(f"{mode} {t[2]:.1f} ({t[0]:.1f}-{t[-1]:.1f}) us")
    return ", ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--cases", type=int, default=30)
    a = ap.parse_args()
    if a.cases < 1:
        ap.error(f"--cases {a.cases}: expected at least 1")
    cuda_run("order_exact_bits.py", a.commit)
    launched = dict(C.ONE_ARITHMETIC)
    print("| family | B x T, heads or channels / K or N / V | as launched: order-exact entries that differ | "
          "with contraction | time as launched | time with contraction |\n|---|---|---|---|---|---|")
    for fam, (inputs, verify, backend, shapes) in FAMILIES.items():
        for i, shape in enumerate(shapes):
            row = []
            for option in (launched, {}):
                C.ONE_ARITHMETIC = option
                row.append(_bits(verify, inputs, shape, backend, a.cases))
            times = []
            for option in (launched, {}):
                C.ONE_ARITHMETIC = option
                times.append(_times(verify, inputs, shape, backend) if i else "")
            C.ONE_ARITHMETIC = launched
            B, T, H, K, V = shape
            print(f"| {fam} | {B} x {T}, {H} / {K} / {V} | {row[0]} | {row[1]} | {times[0]} | {times[1]} |", flush=True)


if __name__ == "__main__":
    main()
