"""Operator calls, the host's cost where the full-size audit is host-bound: how many aten operators one
``oracle.verify_trees`` batch and one ``node_metrics`` call dispatch, counted at Qwen3.6-27B's layer pattern
(64 layers, GDN and attention 3:1, gated attention, q/k norms, partial RoPE) with every width shrunk (a count
depends on the layers, the trees' depths and the number of trees, not on the widths), on the CPU.

    python -m benchmarks.count_oracle_ops [--batches 16x15,64x3] [--from REV]

``--batches BxN``: budget B, N DDTree trees a batch (the audit's on an H200: about 15 at budget 16, 3-4 at
budget 64). ``--from REV``: the same counts with oracle/model.py and ddsim/measure/metrics.py as they were at
git revision REV (each loaded from that revision beside the current package), printed beside the current ones.
"""
import argparse
import collections
import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddsim import oracle
from ddsim.measure import metrics
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.builders import ddtree

ROOT = Path(__file__).resolve().parents[1]


class Count(TorchDispatchMode):
    """Counts the aten operators dispatched inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def narrow_27b():
    return dataclasses.replace(get_preset("qwen3.6-27b"), vocab_size=512, hidden_size=64, intermediate_size=128,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                               linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)


def at_revision(rev: str, path: str, name: str):
    """The module at ``path`` as it was at ``rev``, loaded from a temporary file (its imports resolve against the
    current package)."""
    try:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True,
                             check=True).stdout
    except subprocess.CalledProcessError as e:
        print(f"count_oracle_ops: --from {rev}: {e.stderr.strip().splitlines()[-1] if e.stderr.strip() else 'git show failed'}",
              file=sys.stderr)
        sys.exit(2)
    f = Path(tempfile.mkdtemp()) / f"{name}.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def counts(oracle_model, metrics_mod, cfg, w, model, batches) -> dict:
    out = {}
    for budget, n in batches:
        items = []
        for j in range(n):
            prompt = torch.randint(0, cfg.vocab_size, (32,), generator=torch.Generator().manual_seed(j)).tolist()
            state, _ = model.prefill(prompt[:-1])
            logits = torch.randn(8, cfg.vocab_size, generator=torch.Generator().manual_seed(budget + j)) * 3.0
            tree = ddtree(logits, budget, root_token=prompt[-1])
            items.append((state, tree.parents, tree.tokens))
        with Count() as c:
            refs = oracle_model.verify_trees(w, cfg, items)
        out[f"verify_trees, budget {budget}, {n} trees"] = sum(c.calls.values())
        res = model.verify(items[0][0], tree_of(items[0]), mode="leaky", keep_states=True)
        norms = metrics_mod.reference_norms(refs[0], cfg)
        with Count() as c:
            metrics_mod.node_metrics(tree_of(items[0]), res, refs[0], cfg, ref_norms=norms)
        out[f"node_metrics, budget {budget}"] = sum(c.calls.values())
    return out


def tree_of(item):
    from ddsim.trees.tree import Tree
    return Tree(item[1], item[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16x15,64x3")
    ap.add_argument("--from", dest="rev", default=None, metavar="REV")
    a = ap.parse_args()
    try:
        batches = [tuple(int(x) for x in s.split("x")) for s in a.batches.split(",")]
        assert batches and all(len(b) == 2 and b[0] >= 1 and b[1] >= 1 for b in batches)
    except (ValueError, AssertionError):
        print(f"count_oracle_ops: --batches {a.batches!r}: expected BxN[,BxN...] with B, N >= 1", file=sys.stderr)
        sys.exit(2)
    old = None
    if a.rev:  # checked before any work
        old = (at_revision(a.rev, "oracle/model.py", "oracle_then"), at_revision(a.rev, "ddsim/measure/metrics.py",
                                                                                 "metrics_then"))
    torch.set_num_threads(1)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"# operator calls at Qwen3.6-27B's layer pattern, widths shrunk, CPU; commit {head.stdout.strip() or '?'}")
    cfg = narrow_27b()
    w = init_weights(cfg, seed=0)
    model = HybridModel(cfg, w)
    now = counts(oracle.model, metrics, cfg, w, model, batches)
    then = counts(*old, cfg, w, model, batches) if old else None
    print(f"| call | now |{f' at {a.rev} | change |' if then else ''}")
    print(f"|---|---:|{'---:|---:|' if then else ''}")
    for k, v in now.items():
        extra = f" {then[k]} | {v / then[k] - 1:+.0%} |" if then else ""
        print(f"| {k} | {v} |{extra}")


if __name__ == "__main__":
    main()
