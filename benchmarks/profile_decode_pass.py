"""Host work of one batched decode pass (HybridModel.decode_rows), counted on the CPU: the number of
device-launching operations a pass makes, which is what a host-bound pass at full size spends its time
on. The model has Qwen3.6-27B's 64-layer pattern (48 GDN, 16 attention) with the tiny preset's widths,
so the count is the full-size model's and the arithmetic is small.

    python benchmarks/profile_decode_pass.py [--rows 32] [--context 29]

Prints the pass's wall time here (CPU arithmetic, not a GPU figure), the number of aten calls and
those that launch work on a device (copies, concatenations, arithmetic, matrix products)."""
import argparse
import dataclasses
import time

from torch.profiler import ProfilerActivity, profile

from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights

WIDTHS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
          "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "vocab_size")
# aten ops that are views or metadata only (no device work of their own)
VIEWS = {"aten::as_strided", "aten::select", "aten::slice", "aten::view", "aten::narrow", "aten::resolve_conj",
         "aten::unsqueeze", "aten::transpose", "aten::permute", "aten::reshape", "aten::t", "aten::expand",
         "aten::empty", "aten::empty_strided", "aten::to", "aten::_to_copy", "aten::linear", "aten::matmul",
         "aten::clone", "aten::detach", "aten::alias", "aten::lift_fresh", "aten::_unsafe_view", "aten::contiguous",
         "aten::flatten", "aten::split", "aten::unbind", "aten::chunk", "aten::squeeze", "aten::result_type"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--context", type=int, default=29)
    a = ap.parse_args()
    big, tiny = get_preset("qwen3.6-27b"), get_preset("tiny")
    cfg = dataclasses.replace(big, **{k: getattr(tiny, k) for k in WIDTHS})
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    states = [m.prefill(list(range(1, a.context + 1)))[0] for _ in range(a.rows)]
    toks = [1] * a.rows
    m.decode_rows(states, toks)  # warm-up
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        m.decode_rows(states, toks)
    wall = time.perf_counter() - t
    ev = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    launching = sum(e.count for e in ev if e.key not in VIEWS)
    print(f"{cfg.num_layers} layers ({cfg.layer_pattern.count('g')} GDN, {cfg.layer_pattern.count('a')} attention), "
          f"{a.rows} rows, context {a.context}: one pass {wall * 1e3:.0f} ms on this CPU (profiled); "
          f"{sum(e.count for e in ev)} aten calls, {launching} that launch device work")
    for e in sorted((e for e in ev if e.key not in VIEWS), key=lambda e: -e.count)[:12]:
        print(f"  {e.key:28s} {e.count:6d}")


if __name__ == "__main__":
    main()
