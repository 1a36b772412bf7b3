"""``ddsim check-kernel``: the property suite against the oracle for an engine's own GDN kernel (``--op
gdn``), tree causal conv (``--op conv``) or Mamba2 tree verify (``--op mamba2``).

Hypothesis draws trees of every shape (chains, stars, deep and bushy, as ddsim.properties.strategies
makes them), grouped heads (HV/H in 1..3), fast- and long-memory gates; for each property it
searches for a counterexample (``hypothesis.find``), which comes back shrunk to the smallest tree.

The committed states live in a state pool, as in a serving engine: each sequence in a shuffled slot,
every other slot NaN (a kernel that reads a slot it was not given turns its outputs NaN).

Properties (mode "exact"):
  output finite           no NaN or Inf in any node's output
  committed state untouched   the batch's pool slots are bit-identical after the call (verify reads)
  other pool slots untouched  so is every slot outside the batch
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
        from ddsim.properties import strategies
    except ModuleNotFoundError as e:
        raise InputError(f"check-kernel needs hypothesis (missing module {e.name!r}; "
                         "pip install 'ddsim-spec[properties]')") from None
    return strategies


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _bound(ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """The comparison bound of one layer's output in ``dtype`` (ddsim.compare's table)."""
    atol, rtol = TOLERANCES[dtype]
    return atol + rtol * (ref.abs().max().item() if ref.numel() else 0.0)


def _node_errors(o: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[B, T] max abs error per node (inf where the output is not finite)."""
    err = (o.double().cpu() - ref.double().cpu()).abs().flatten(2).amax(-1)
    return torch.where(torch.isfinite(o.double().cpu()).flatten(2).all(-1), err, torch.inf)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern (so NaN slots compare equal to themselves)."""
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int64 if t.element_size() == 8
                               else torch.int16)


class _Runner:
    """One kernel, one mode, on one device: runs the kernel and the oracle on drawn inputs."""

    def __init__(self, kernel, mode: str, device: str, dtype: torch.dtype = torch.float32):
        self.kernel, self.mode, self.device, self.dtype = kernel, mode, device, dtype

    def run(self, inp) -> dict:
        from ddsim import oracle
        dev = self.device
        # copies: a kernel that writes its inputs must not change what the oracle reads
        args = {k: inp[k].to(dev, copy=True) for k in ("q", "k", "v", "g", "beta")}
        pool = inp["pool"].to(dev, copy=True).contiguous()  # [N, HV, K, V]
        slots = inp["slots"].to(dev)
        before = _bits(pool).clone()
        o = self.kernel.verify(**args, parents=inp["parents"].to(dev), state_pool=pool, slots=slots, mode=self.mode,
                               scale=None)
        writes = _pool_writes(pool, before, slots)
        plain = {k: inp[k].double() for k in ("q", "k", "v", "g", "beta")}
        ref = {m: oracle.gdn_tree_verify(**plain, parents=inp["parents"], initial_state=inp["initial_state"].double(),
                                         mode=m) for m in ("exact", "leaky")}
        order_exact = torch.tensor([list(t.order_exact) for t in inp["trees"]])
        return {"o": o.detach().cpu(), **writes, "ref": ref, "order_exact": order_exact}

    def properties(self) -> dict:
        return _properties(self.mode, self.dtype)


def _pool_writes(pool: torch.Tensor, before: torch.Tensor, slots: torch.Tensor) -> dict:
    """Which pool slots a call wrote (bitwise), split into the batch's and the others."""
    changed = (_bits(pool) != before).flatten(1).any(-1).cpu()  # [N]
    in_batch = torch.zeros_like(changed)
    in_batch[slots.long().cpu()] = True
    return {"committed_untouched": not bool(changed[in_batch].any()), "others_untouched": not bool(changed[~in_batch].any()),
            "written_slots": changed.nonzero().flatten().tolist()}


def _properties(mode: str, dtype: torch.dtype, committed: tuple | None = None) -> dict:
    """name -> predicate(run result) that must hold on every drawn input. ``committed`` replaces the
    committed-slot property for a kernel whose verify rewrites its slot by design: (name, predicate)."""
    def close(r, m, nodes):
        err = _node_errors(r["o"], r["ref"][m])
        return bool((err[nodes] <= _bound(r["ref"][m], dtype)).all())

    name, pred = committed or ("committed state untouched", lambda r: r["committed_untouched"])
    props = {
        "output finite": lambda r: bool(torch.isfinite(r["o"]).all()),
        name: pred,
        "other pool slots untouched": lambda r: r["others_untouched"],
        "exact on order-exact nodes": lambda r: close(r, "exact", r["order_exact"]),
    }
    if mode == "exact":
        props["exact on every node"] = lambda r: close(r, "exact", torch.ones_like(r["order_exact"]))
    else:
        props["flattened semantics on every node"] = lambda r: close(r, "leaky", torch.ones_like(r["order_exact"]))
    return props


class _ConvRunner:
    """The engine's tree causal conv, one mode, on one device, against the oracle's conv."""

    def __init__(self, kernel, mode: str, device: str, dtype: torch.dtype = torch.float32):
        self.kernel, self.mode, self.device, self.dtype = kernel, mode, device, dtype

    def run(self, inp) -> dict:
        from ddsim import oracle
        dev = self.device
        x = inp["x"].to(dev, copy=True)
        weight = inp["weight"].to(dev, copy=True)
        bias = None if inp["bias"] is None else inp["bias"].to(dev, copy=True)
        pool = inp["pool"].to(dev, copy=True).contiguous()  # [N, C, W-1]
        slots = inp["slots"].to(dev)
        before = _bits(pool).clone()
        o = self.kernel.conv(x, weight=weight, bias=bias, parents=inp["parents"].to(dev), window_pool=pool,
                             slots=slots, mode=self.mode, activation="silu")
        writes = _pool_writes(pool, before, slots)
        plain = dict(weight=inp["weight"].double(), bias=None if inp["bias"] is None else inp["bias"].double())
        ref = {m: oracle.tree_causal_conv1d(inp["x"].double(), **plain, parents=inp["parents"],
                                            initial_window=inp["initial_window"].double(), mode=m)
               for m in ("exact", "leaky")}
        W1 = inp["initial_window"].shape[-1]
        # the window after the whole flattened draft: what a verify that rewrites its slot writes there
        flat = torch.cat([inp["initial_window"], inp["x"].transpose(1, 2).to(inp["initial_window"].dtype)], -1)
        flat = flat[..., flat.shape[-1] - W1:]
        batch = pool.cpu()[inp["slots"].long()]
        order_exact = torch.tensor([list(t.order_exact) for t in inp["trees"]])
        return {"o": o.detach().cpu(), **writes, "slot_is_flattened_window": torch.equal(_bits(batch), _bits(flat)),
                "ref": ref, "order_exact": order_exact}

    def properties(self) -> dict:
        committed = None
        if self.kernel.conv_writes_slot == "flattened window":
            committed = ("committed window = the flattened draft's window", lambda r: r["slot_is_flattened_window"])
        else:
            committed = ("committed window untouched", lambda r: r["committed_untouched"])
        return _properties(self.mode, self.dtype, committed)


class _Mamba2Runner:
    """The engine's Mamba2 tree verify, one mode, on one device, against the oracle's."""

    def __init__(self, kernel, mode: str, device: str, dtype: torch.dtype = torch.float32):
        self.kernel, self.mode, self.device, self.dtype = kernel, mode, device, dtype

    def run(self, inp) -> dict:
        from ddsim import oracle
        dev = self.device
        names = ("x", "dt", "A", "B", "C", "D", "dt_bias")
        args = {k: None if inp[k] is None else inp[k].to(dev, copy=True) for k in names}
        pool = inp["pool"].to(dev, copy=True).contiguous()  # [N, H, P, N]
        slots = inp["slots"].to(dev)
        before = _bits(pool).clone()
        y = self.kernel.mamba2(args.pop("x"), args.pop("dt"), args.pop("A"), args.pop("B"), args.pop("C"), **args,
                               parents=inp["parents"].to(dev), state_pool=pool, slots=slots, mode=self.mode)
        writes = _pool_writes(pool, before, slots)
        plain = {k: None if inp[k] is None else inp[k].double() for k in names}
        ref = {m: oracle.mamba2_tree_verify(plain["x"], plain["dt"], plain["A"],
                                            plain["B"], plain["C"], D=plain["D"], dt_bias=plain["dt_bias"],
                                            parents=inp["parents"], initial_state=inp["initial_state"].double(), mode=m)
               for m in ("exact", "leaky")}
        order_exact = torch.tensor([list(t.order_exact) for t in inp["trees"]])
        return {"o": y.detach().cpu(), **writes, "ref": ref, "order_exact": order_exact}

    def properties(self) -> dict:
        return _properties(self.mode, self.dtype)


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
    if "q" in inp:
        B, T, H, K = inp["q"].shape
        shapes = {"B": B, "T": T, "H": H, "HV": inp["v"].shape[2], "K": K, "V": inp["v"].shape[3]}
    elif "dt" in inp:
        B, T, H, P = inp["x"].shape
        shapes = {"B": B, "T": T, "H": H, "P": P, "G": inp["B"].shape[2], "N": inp["B"].shape[3]}
    else:
        B, T, C = inp["x"].shape
        shapes = {"B": B, "T": T, "C": C, "W": inp["weight"].shape[1], "bias": inp["bias"] is not None}
    return {"property": prop, "op": "gdn" if "q" in inp else "mamba2" if "dt" in inp else "conv", "mode": mode,
            "dtype": str(dtype).removeprefix("torch."), "reference": ref_mode,
            "trees": [{"parents": list(t.parents), "tokens": list(t.tokens)} for t in inp["trees"]],
            "shapes": shapes,
            "pool": {"slots": inp["pool"].shape[0], "batch_slots": inp["slots"].tolist(),
                     "written_slots": r["written_slots"]},
            "first_wrong_node": first}


OPS = ("gdn", "conv", "mamba2")


def check(kernel, *, mode: str, device: str = "cpu", max_examples: int = 100,
          dtype: torch.dtype = torch.float32, op: str = "gdn") -> list[PropertyResult]:
    """Search each property for a counterexample; the results, with shrunk counterexamples. Inputs
    are drawn in ``dtype`` (recurrent states stay float32); the oracle computes in float64 from the
    same rounded values, and outputs are compared within ``dtype``'s tolerance. ``op`` "gdn" checks
    the recurrence (kernel.verify), "conv" the tree causal conv (kernel.conv), "mamba2" the Mamba2 tree
    verify (kernel.mamba2)."""
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    from ddsim.gpu_backend import poisoned
    strategies = _strategies()
    if op == "conv":
        kernel.check_conv(mode)
        runner = _ConvRunner(kernel, mode, device, dtype)
        strategy = strategies.conv_pool_inputs(max_nodes=10, dtype=dtype, widths=kernel.conv_widths)
    elif op == "mamba2":
        kernel.check_mamba2(mode)
        runner = _Mamba2Runner(kernel, mode, device, dtype)
        strategy = strategies.mamba2_inputs(max_nodes=10, dtype=dtype, engine=True)
    else:
        kernel.check_mode(mode)
        runner = _Runner(kernel, mode, device, dtype)
        strategy = strategies.gdn_pool_inputs(max_nodes=10, dtype=dtype)
    cfg = settings(max_examples=max_examples, database=None, derandomize=True, deadline=None,
                   suppress_health_check=list(HealthCheck))
    results = []
    for name, pred in runner.properties().items():
        try:
            with poisoned():  # ddsim's own kernels (the ddsim adapter) NaN-fill their outputs here too
                bad = find(strategy, lambda inp, pred=pred: not pred(runner.run(inp)), settings=cfg)
        except NoSuchExample:
            results.append(PropertyResult(name, True, f"held on {max_examples} drawn inputs"))
            continue
        ce = _describe(bad, runner.run(bad), name, mode, dtype)
        node = ce["first_wrong_node"]
        where = (f"first wrong node {node['node']} of sequence {node['sequence']} (parents "
                 f"{ce['trees'][node['sequence']]['parents']}), error {node['max_abs_error']:.3g} > {node['bound']:.3g}"
                 if node else f"trees {[t['parents'] for t in ce['trees']]}, batch slots {ce['pool']['batch_slots']} "
                 f"of {ce['pool']['slots']}, slots written {ce['pool']['written_slots']}")
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
        from ddsim.triton_interpret import prepare
        prepare()
        return "cpu"
    if device.startswith("cuda"):
        from ddsim.audit import resolve_device  # the audit's check: CUDA present, the index exists
        return str(resolve_device(device))
    raise InputError(f"--device: expected cpu or cuda[:N], got {device!r}")
