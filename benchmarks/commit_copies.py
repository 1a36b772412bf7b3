"""What a graphed step's copies of the state cost, like layers grouped into slabs (ddsim.model.slabs) against layer by
layer (slabs.GROUPED off), in one run: the commit (GraphedModel.commit: the KV's gather and concatenation, the commit
graph's replay, the recurrent states copied out of its buffers) and the copies of a committed state into the graph's
buffers before the next verify (the recurrent states and windows, the KV prefix). Qwen3.6-27B's layer pattern and
state shapes (64 layers: 48 GDN states [48, 128, 128] fp32, 16 attention layers' KV [P, 4, 256]) with a narrow
hidden size (the copies do not depend on it; the verify is not timed), a prompt of 31 tokens, one DDTree tree.
On CUDA the graphs are captured; on the CPU they run eagerly (the commit's replay is then the model's arithmetic).
Median milliseconds of --n, each synchronised.

    python benchmarks/commit_copies.py [--n 50] [--budget 16] [--commit SHA]
"""
import platform
import statistics
import time

import torch

from ddsim.cli import _int_in, _Parser
from ddsim.model import slabs
from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree


def median_ms(fn, n: int, sync) -> float:
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main():
    ap = _Parser(prog="commit_copies")  # bad input: one line, exit 2
    ap.add_argument("--n", type=_int_in(1), default=50)
    ap.add_argument("--budget", type=_int_in(1), default=16)
    ap.add_argument("--commit", default="?")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = get_preset("qwen3.6-27b").replace(vocab_size=1024, hidden_size=256, intermediate_size=256,
                                            num_attention_heads=8)
    model = HybridModel(cfg, init_weights(cfg, seed=0, device=dev), dtype=torch.bfloat16 if cuda else torch.float32,
                        device=dev)
    print(f"# {time.strftime('%Y-%m-%d')} | {torch.cuda.get_device_name() if cuda else platform.processor() or 'cpu'} "
          f"| torch {torch.__version__} | commit {a.commit} | qwen3.6-27b layers and states, hidden 256")
    tree = ddtree(torch.randn(8, cfg.vocab_size, generator=torch.Generator().manual_seed(0)), a.budget, topk_cap=8)
    rows, default = [], slabs.GROUPED
    for grouped in (False, True):
        slabs.GROUPED = grouped
        gm = GraphedModel(model, capture=cuda)
        state, _ = gm.prefill(list(range(1, 32)))
        res = gm.verify(state, tree)
        committed = gm.commit(state, tree, res, tree.size - 1)

        def commit():
            gm.commit(state, tree, res, tree.size - 1)

        def load():  # a committed state into the buffers, as the next verify copies it
            gm._resident = None
            gm._load_state(committed)
            prefix = next(iter(gm._prefixes.values()))
            prefix.resident = None
            prefix.load(committed)
        rows.append(("slabs of like layers" if grouped else "layer by layer", median_ms(commit, a.n, sync),
                     median_ms(load, a.n, sync)))
    slabs.GROUPED = default
    print("\n| copies | commit, ms | a committed state into the graph's buffers, ms |\n|---|---|---|")
    for name, c, ld in rows:
        print(f"| {name} | {c:.3f} | {ld:.3f} |")


if __name__ == "__main__":
    main()
