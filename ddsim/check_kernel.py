"""``ddsim check-kernel``: the property suite against the oracle for an engine's own GDN kernel.

Hypothesis draws trees of every shape (chains, stars, deep and bushy, as ddsim.properties.strategies
makes them), grouped heads (HV/H in 1..3), fast- and long-memory gates; for each property it
searches for a counterexample (``hypothesis.find``), which comes back shrunk to the smallest tree.

Properties (mode "exact"):
  output finite           no NaN or Inf in any node's output
  state untouched         the committed state passed in is bit-identical after the call
  exact on order-exact    every order-exact node equals the oracle's exact output
  exact on every node     every node equals the oracle's exact output
Mode "leaky" (the flattened path) replaces the last by
  flattened semantics     every node equals the oracle's flattened (leaky) output
  leaks off order         some node that is not order-exact differs from the exact output: the leak
                          is there (a "leaky" kernel that never leaks is not what it claims)
so a leaky kernel passes when the leak is identified and bounded: exact where the layout makes it
exact, the flattened recurrence elsewhere.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ddsim.compare import TOLERANCES
from ddsim.errors import InputError


@dataclass
class PropertyResult:
    name: str
    holds: bool
    detail: str = ""
    counterexample: dict | None = None


def _strategies():
    try:
        from ddsim.properties.strategies import gdn_inputs
    except ModuleNotFoundError as e:
        raise InputError(f"check-kernel needs hypothesis (missing module {e.name!r}; "
                         "pip install 'ddsim-spec[properties]')") from None
    return gdn_inputs


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _bound(ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """The comparison bound of one layer's output in ``dtype`` (ddsim.compare's table)."""
    atol, rtol = TOLERANCES[dtype]
    return atol + rtol * (ref.abs().max().item() if ref.numel() else 0.0)


def _node_errors(o: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[B, T] max abs error per node (inf where the output is not finite)."""
    err = (o.double().cpu() - ref.double().cpu()).abs().flatten(2).amax(-1)
    return torch.where(torch.isfinite(o.double().cpu()).flatten(2).all(-1), err, torch.inf)


class _Runner:
    """One kernel, one mode, on one device: runs the kernel and the oracle on drawn inputs."""

    def __init__(self, kernel, mode: str, device: str, dtype: torch.dtype = torch.float32):
        self.kernel, self.mode, self.device, self.dtype = kernel, mode, device, dtype

    def run(self, inp) -> dict:
        from ddsim import oracle
        dev = self.device
        # copies: a kernel that writes its inputs must not change what the oracle reads
        args = {k: inp[k].to(dev, copy=True) for k in ("q", "k", "v", "g", "beta")}
        s0 = inp["initial_state"].to(dev, copy=True).contiguous()
        before = s0.clone()
        o = self.kernel.verify(**args, parents=inp["parents"].to(dev), initial_state=s0, mode=self.mode, scale=None)
        plain = {k: inp[k].double() for k in ("q", "k", "v", "g", "beta")}
        ref = {m: oracle.gdn_tree_verify(**plain, parents=inp["parents"], initial_state=inp["initial_state"].double(),
                                         mode=m) for m in ("exact", "leaky")}
        order_exact = torch.tensor([list(t.order_exact) for t in inp["trees"]])
        return {"o": o.detach().cpu(), "untouched": torch.equal(s0, before), "ref": ref, "order_exact": order_exact}

    def properties(self) -> dict:
        """name -> predicate(run result) that must hold on every drawn input."""
        def close(r, m, nodes):
            err = _node_errors(r["o"], r["ref"][m])
            return bool((err[nodes] <= _bound(r["ref"][m], self.dtype)).all())

        props = {
            "output finite": lambda r: bool(torch.isfinite(r["o"]).all()),
            "state untouched": lambda r: r["untouched"],
            "exact on order-exact nodes": lambda r: close(r, "exact", r["order_exact"]),
        }
        if self.mode == "exact":
            props["exact on every node"] = lambda r: close(r, "exact", torch.ones_like(r["order_exact"]))
        else:
            props["flattened semantics on every node"] = lambda r: close(r, "leaky", torch.ones_like(r["order_exact"]))
        return props


def _describe(inp, r, prop: str, mode: str, dtype: torch.dtype) -> dict:
    """The counterexample as JSON: the trees (parents and tokens), shapes, and the first node whose
    output is wrong against the reference the property names."""
    ref_mode = "leaky" if prop.startswith("flattened") else "exact"
    err = _node_errors(r["o"], r["ref"][ref_mode])
    bound = _bound(r["ref"][ref_mode], dtype)
    bad = (err > bound).nonzero().tolist()
    first = None
    if bad:
        b, n = bad[0]
        first = {"sequence": b, "node": n, "max_abs_error": float(err[b, n]), "bound": bound,
                 "order_exact": bool(r["order_exact"][b, n])}
    B, T, H, K = inp["q"].shape
    return {"property": prop, "mode": mode, "dtype": str(dtype).removeprefix("torch."), "reference": ref_mode,
            "trees": [{"parents": list(t.parents), "tokens": list(t.tokens)} for t in inp["trees"]],
            "shapes": {"B": B, "T": T, "H": H, "HV": inp["v"].shape[2], "K": K, "V": inp["v"].shape[3]},
            "first_wrong_node": first, "state_untouched": r["untouched"]}


def check(kernel, *, mode: str, device: str = "cpu", max_examples: int = 100,
          dtype: torch.dtype = torch.float32) -> list[PropertyResult]:
    """Search each property for a counterexample; the results, with shrunk counterexamples. q, k, v
    and the gates are drawn in ``dtype`` (the state stays float32); the oracle computes in float64
    from the same rounded values, and outputs are compared within ``dtype``'s tolerance."""
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample
    gdn_inputs = _strategies()
    kernel.check_mode(mode)
    runner = _Runner(kernel, mode, device, dtype)
    cfg = settings(max_examples=max_examples, database=None, derandomize=True, deadline=None,
                   suppress_health_check=list(HealthCheck))
    results = []
    strategy = gdn_inputs(max_nodes=10, dtype=dtype)
    for name, pred in runner.properties().items():
        try:
            bad = find(strategy, lambda inp, pred=pred: not pred(runner.run(inp)), settings=cfg)
        except NoSuchExample:
            results.append(PropertyResult(name, True, f"held on {max_examples} drawn inputs"))
            continue
        ce = _describe(bad, runner.run(bad), name, mode, dtype)
        node = ce["first_wrong_node"]
        where = (f"first wrong node {node['node']} of sequence {node['sequence']} (parents "
                 f"{ce['trees'][node['sequence']]['parents']}), error {node['max_abs_error']:.3g} > {node['bound']:.3g}"
                 if node else f"trees {[t['parents'] for t in ce['trees']]}")
        results.append(PropertyResult(name, False, where, ce))
    if mode == "leaky":
        # the leak must be there: some non-order-exact node differs from the exact output
        def differs(inp):
            r = runner.run(inp)
            err = _node_errors(r["o"], r["ref"]["exact"])
            return bool((err[~r["order_exact"]] > 10 * _bound(r["ref"]["exact"], dtype)).any())
        try:
            ex = find(strategy, differs, settings=cfg)
            results.append(PropertyResult("leaks off order-exact nodes", True,
                                          f"e.g. parents {[list(t.parents) for t in ex['trees']]}"))
        except NoSuchExample:
            results.append(PropertyResult("leaks off order-exact nodes", False,
                                          "never differed from exact verification: not the flattened path"))
    return results


def write_counterexamples(results: list[PropertyResult], path: Path) -> None:
    from ddsim.reports.json_report import write_atomic
    failing = [r.counterexample for r in results if r.counterexample is not None]
    write_atomic({path: json.dumps({"counterexamples": failing}, indent=1) + "\n"})


def prepare_device(device: str) -> str:
    """'cpu' runs Triton kernels in Triton's interpreter (set before triton is imported)."""
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return "cpu"
    if device.startswith("cuda"):
        from ddsim.audit import resolve_device  # the audit's check: CUDA present, the index exists
        return str(resolve_device(device))
    raise InputError(f"--device: expected cpu or cuda[:N], got {device!r}")
