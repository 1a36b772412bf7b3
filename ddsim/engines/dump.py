"""The verify-step dump: what a serving engine computed at each tree-verify step, for `ddsim replay`.

A dump is a directory (format "ddsim-verify-dump", version 1):

    index.jsonl                 line 1: the header; then one line per verify step; last: the end marker
    steps/000000.safetensors    the step's tensors (one file per step, written before its index line)

Header: {"format": "ddsim-verify-dump", "version": 1, "vocab_size": V, "logits": "full" | "topk",
"topk": k | null, "acceptance": "greedy" | {"rule": R, "temperature": T, "params": {...}}, "compute_dtype":
"float32" | "bfloat16" | "float16", "engine": {free-form: name, version, ...}}. A sampled dump names the rule
its engine accepts with (ddsim.sampling.rules: sglang, eagle, ddtree, gumbel, typical), the temperature its
per-node distributions are softmax(logits / T) at, and the rule's parameters; it carries full logits.

Step: {"step": i (0, 1, 2, ... in file order), "request": id, "context": [token ids committed before
the step], "parents": [T ints, -1 at the root, parents[i] < i], "tokens": [T ids; the root is the
pending token, the last one the engine emitted], "positions": [T RoPE positions the engine used],
"accepted": [node ids of the accepted path, root first], "emitted": [tokens appended this step: the
accepted nodes after the root, then the bonus token], "tensors": "steps/NNNNNN.safetensors"}.

Tensors: "logits" [T, V] float32 (full), or "topk_ids" [T, k] int64 and "topk_logprobs" [T, k]
float32 (topk); optionally the engine's committed recurrent state before the step, "ssm.L" [HV, K, V]
and "conv.L" [C, W-1] for GDN layer L. A sampled step adds the uniform random numbers the engine drew, one
tensor "random.NAME" per input the rule declares: [T] per node, [1] per step, [D+1, V] per depth and token.

End marker: {"end": true, "steps": N}. A dump without it is truncated and refused.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ddsim.digest import held_while_read, read_bytes
from ddsim.errors import InputError
from ddsim.values import is_int, is_integral, is_real

FORMAT = "ddsim-verify-dump"
VERSION = 1
COMPUTE_DTYPES = ("float32", "bfloat16", "float16", "float64")
HEADER_KEYS = {"format", "version", "vocab_size", "logits", "topk", "acceptance", "compute_dtype", "engine"}


def _flat(engine) -> bool:
    """Whether a header's engine is what the replay report keeps of it: a dict of names to strings, numbers,
    booleans or None."""
    return isinstance(engine, dict) and all(
        isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool))) for k, v in engine.items())


class VerifyDumpWriter:
    """What an engine calls at its verify step (greedy acceptance):

        w = VerifyDumpWriter(path, vocab_size=V, engine={"name": "my-engine", "version": "1.2"})
        w.write_step(request=rid, context=ctx, parents=par, tokens=toks, positions=pos,
                     logits=logits, accepted=path, emitted=out)      # or topk=(ids, logprobs)
        w.close()

    Each step's tensors are written (to a temporary name, then renamed) before its index line, and
    the index line is flushed, so a crash leaves a dump that the reader refuses as truncated."""

    def __init__(self, path, *, vocab_size: int, logits: str = "full", topk: int | None = None,
                 compute_dtype: str = "float32", engine: dict | None = None, acceptance="greedy"):
        if logits not in ("full", "topk") or (logits == "topk") != (topk is not None):
            raise ValueError("logits: 'full' without topk, or 'topk' with topk=k")
        if not is_integral(vocab_size) or vocab_size < 2:
            raise ValueError(f"vocab_size {vocab_size!r}: expected an integer >= 2")
        vocab_size = int(vocab_size)
        if logits == "topk":
            if not is_integral(topk) or not 1 <= topk <= vocab_size:
                raise ValueError(f"topk {topk!r}: expected an integer in 1..{vocab_size}")
            topk = int(topk)
        if acceptance != "greedy" and (not isinstance(acceptance, dict) or logits != "full"):
            raise ValueError("acceptance: 'greedy', or {'rule', 'temperature', 'params'} with full logits")
        try:  # the rule, its temperature and parameters, as the reader checks them
            _check_acceptance(path, {"acceptance": acceptance, "logits": logits})
        except InputError as e:
            raise ValueError(f"acceptance: {e}") from None
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype: expected one of {COMPUTE_DTYPES}")
        if not _flat(engine or {}):
            raise ValueError("engine: expected a flat dict of names to strings, numbers, booleans or None")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=False)  # a dump is never written over anything
        (self.path / "steps").mkdir()
        self.steps = 0
        self._index = open(self.path / "index.jsonl", "w")
        self.header = {"format": FORMAT, "version": VERSION, "vocab_size": vocab_size, "logits": logits, "topk": topk,
                       "acceptance": acceptance, "compute_dtype": compute_dtype, "engine": engine or {}}
        self._line(self.header)

    def _line(self, obj: dict) -> None:
        self._index.write(json.dumps(obj, allow_nan=False) + "\n")
        self._index.flush()

    def write_step(self, *, request: str, context, parents, tokens, positions, accepted, emitted, logits=None,
                   topk=None, states: dict | None = None, randoms: dict | None = None) -> None:
        """One verify step, checked as the reader will check it (check_step) before anything is written: a step
        the reader would refuse is a ValueError here, naming the step, and leaves the dump as it was."""
        from safetensors.torch import save_file

        def fail(msg):
            raise ValueError(f"write_step: step {self.steps}: {msg}")

        def ints(key, x):
            vals = x.tolist() if hasattr(x, "tolist") else list(x)
            if not all(is_integral(v) or isinstance(v, float) and v.is_integer() for v in vals):
                fail(f"{key} must be integers")
            return [int(v) for v in vals]

        def cpu(x):
            return torch.as_tensor(x).detach().cpu()

        def floats(t):  # float32 as the format keeps them; a tensor of another kind kept, for the check to refuse
            return t.float().contiguous() if t.is_floating_point() else t.contiguous()
        tensors = {}
        if self.header["logits"] == "full":
            if logits is None or topk is not None:
                fail("a full-logits dump takes logits= and no topk=")
            tensors["logits"] = floats(cpu(logits))
        else:
            if topk is None or logits is not None:
                fail("a top-k dump takes topk=(ids, logprobs) and no logits=")
            ids, lp = (cpu(t) for t in topk)
            integer = not (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool)
            tensors["topk_ids"] = ids.long().contiguous() if integer else ids.contiguous()
            tensors["topk_logprobs"] = floats(lp)
        for k, v in (states or {}).items():
            if not _state_name(k):
                fail(f"state {k!r}: expected 'ssm.L' or 'conv.L' for a layer L")
            tensors[k] = floats(cpu(v))
        for k, v in (randoms or {}).items():  # as drawn: float64 stays float64; a step's one number as [1]
            t = cpu(v)
            tensors[f"random.{k}"] = (t.reshape(1) if t.ndim == 0 else t).contiguous()
        rel = f"steps/{self.steps:06d}.safetensors"
        rec = {"step": self.steps, "request": str(request), "context": ints("context", context),
               "parents": ints("parents", parents), "tokens": ints("tokens", tokens),
               "positions": ints("positions", positions), "accepted": ints("accepted", accepted),
               "emitted": ints("emitted", emitted), "tensors": rel}
        check_step(rec, tensors, header=self.header, layers=None, max_positions=None, fail=fail)
        tmp = self.path / f"{rel}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, self.path / rel)
        self._line(rec)
        self.steps += 1

    def close(self) -> None:
        self._line({"end": True, "steps": self.steps})
        self._index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:  # no end marker: the reader will call the dump truncated
            self._index.close()


@dataclass
class DumpStep:
    step: int
    request: str
    context: list[int]
    parents: list[int]
    tokens: list[int]
    positions: list[int]
    accepted: list[int]
    emitted: list[int]
    tensors_file: str
    tensors: dict = field(repr=False)  # name -> tensor


@dataclass
class Dump:
    path: Path
    header: dict
    steps: list[DumpStep]


def _fail(path, msg):
    raise InputError(f"--dump {path}: {msg}")


def load_dump(path, *, vocab_size: int | None = None, layers: dict | None = None,
              max_positions: int | None = None) -> Dump:
    """Read and check a whole dump before any work: the header (format, version), every step (a
    valid tree; positions, tokens in the vocabulary, the accepted path a root path of the tree, the
    emitted tokens the accepted nodes' after the root plus one), its tensors (shapes, finite), the
    end marker. ``vocab_size``: the checkpoint's; ``layers``: {"ssm.L": shape, "conv.L": shape} of
    the checkpoint's state tensors; ``max_positions``: the checkpoint's position limit (every position
    an integer in [0, max_positions)). Every problem is one InputError naming the dump and the step."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from ddsim.jsonl import strict_loads
    root = Path(path)
    index = root / "index.jsonl"
    if not index.is_file():
        _fail(path, "no index.jsonl (not a verify-step dump)")
    try:
        lines = read_bytes(index).decode("utf-8").splitlines()  # (noted inside a replay's reading(): ddsim.digest)
    except (OSError, UnicodeDecodeError) as e:
        _fail(path, f"index.jsonl is unreadable ({getattr(e, 'strerror', None) or e})")
    if not lines:
        _fail(path, "index.jsonl is empty")
    header = strict_loads(lines[0], f"--dump {path}: index.jsonl line 1")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        _fail(path, f"line 1: not a {FORMAT} header")
    if type(header.get("version")) is not int or header["version"] != VERSION:  # (JSON's true and 1.0 equal 1)
        _fail(path, f"schema version {header.get('version')!r} is not supported (this ddsim reads version {VERSION})")
    unknown = sorted(set(header) - HEADER_KEYS)
    if unknown:
        _fail(path, f"header key {unknown[0]!r} is not one of the format's ({', '.join(sorted(HEADER_KEYS))})")
    if not _flat(header.get("engine", {})):
        _fail(path, "header engine: expected an object of names to strings, numbers, booleans or null")
    V = header.get("vocab_size")
    if not is_int(V) or V < 2:
        _fail(path, f"header vocab_size {V!r}: expected an integer >= 2")
    if vocab_size is not None and V != vocab_size:
        _fail(path, f"vocab_size {V} does not fit the checkpoint's {vocab_size}")
    if header.get("logits") not in ("full", "topk"):
        _fail(path, f"header logits {header.get('logits')!r}: expected 'full' or 'topk'")
    k = header.get("topk")
    if header["logits"] == "topk" and not (is_int(k) and 1 <= k <= V):
        _fail(path, f"header topk {k!r}: expected an integer in 1..{V}")
    _check_acceptance(path, header)
    if header.get("compute_dtype") not in COMPUTE_DTYPES:
        _fail(path, f"header compute_dtype {header.get('compute_dtype')!r}: expected one of {COMPUTE_DTYPES}")
    steps, end = [], None
    for n, line in enumerate(lines[1:], start=2):
        rec = strict_loads(line, f"--dump {path}: index.jsonl line {n}")
        if not isinstance(rec, dict):
            _fail(path, f"line {n}: expected an object")
        if rec.get("end") is True:
            end = rec
            if n != len(lines):
                _fail(path, f"line {n}: the end marker is not the last line")
            break
        steps.append(_step(path, root, rec, n, header, layers, load_file, SafetensorError, max_positions))
    if end is None:
        _fail(path, "truncated: no end marker (the engine stopped mid-dump)")
    if end.get("steps") != len(steps):
        _fail(path, f"the end marker counts {end.get('steps')!r} steps, the index has {len(steps)}")
    return Dump(root, header, steps)


# the log of a top-k row's probability mass may pass 0 (a mass past 1) by this much, by the header's compute dtype
# (the rounding of log-probabilities computed in it) and no more
TOPK_MASS_SLACK = {"float32": 1e-3, "float64": 1e-3, "bfloat16": 0.1, "float16": 0.1}


def _check_topk(fail, ids, lp, V, dtype) -> None:
    """A top-k step is read as the engine's k most likely tokens per node, most likely first: integer ids in the
    vocabulary, no id twice in a row, float log-probabilities that never rise along a row (the first is read as
    the engine's argmax), are <= 0 and hold a probability mass of at most 1 (TOPK_MASS_SLACK for the rounding of
    the header's compute ``dtype``)."""
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.is_complex():
        fail(f"topk_ids are {ids.dtype}, expected integers")
    if not lp.is_floating_point():
        fail(f"topk_logprobs are {lp.dtype}, expected floating point")
    if not bool(((ids >= 0) & (ids < V)).all()):
        fail("topk_ids outside the vocabulary")
    ids, lp = ids.long(), lp.double()
    twice = (ids.sort(-1).values.diff(dim=-1) == 0).any(-1)  # [T] per node (none where k is 1)
    if bool(twice.any()):
        fail(f"node {int(twice.nonzero()[0])}'s topk_ids name a token twice")
    rising = (lp.diff(dim=-1) > 0).any(-1)
    if bool(rising.any()):
        fail(f"node {int(rising.nonzero()[0])}'s topk_logprobs rise along the row (most likely first expected)")
    mass = lp.logsumexp(-1)
    over = mass > TOPK_MASS_SLACK[dtype]
    if bool(over.any()):
        node = int(over.nonzero()[0])
        fail(f"node {node}'s topk_logprobs hold a probability of {float(mass[node].exp()):.4g} "
             "(log-probabilities of at most 1 in all expected)")


def _check_acceptance(path, header) -> None:
    """'greedy', or a sampled rule ddsim can recompute: its name, a finite temperature > 0, known parameters."""
    acc = header.get("acceptance")
    if acc == "greedy":
        return
    from ddsim.measure.settings import SAMPLERS
    if not isinstance(acc, dict) or set(acc) != {"rule", "temperature", "params"}:
        _fail(path, f"header acceptance {acc!r}: expected 'greedy' or {{rule, temperature, params}}")
    if acc["rule"] not in SAMPLERS:
        _fail(path, f"header acceptance rule {acc['rule']!r}: expected one of {', '.join(SAMPLERS)}")
    t = acc["temperature"]
    if not is_real(t) or not 0 < t < float("inf"):
        _fail(path, f"header acceptance temperature {t!r}: expected a finite number > 0")
    known = SAMPLERS[acc["rule"]]
    if not isinstance(acc["params"], dict):
        _fail(path, "header acceptance params: expected an object")
    for k, v in acc["params"].items():
        if k not in known or not is_real(v) or not known[k][0] < v <= known[k][1]:
            _fail(path, f"header acceptance params {k}={v!r}: not a parameter of {acc['rule']} in its range")
    if header.get("logits") != "full":
        _fail(path, "a sampled dump needs full logits (the rule reads whole distributions)")


def _random_shapes(header, T: int, D: int, V: int) -> dict:
    """{tensor name: shape} of the random numbers a sampled step carries (none for greedy)."""
    acc = header["acceptance"]
    if acc == "greedy":
        return {}
    from ddsim.sampling.rules import RULES
    shape = {"node": (T,), "draw": (1,), "depth-vocab": (D + 1, V)}
    return {f"random.{k}": shape[kind] for k, kind in RULES[acc["rule"]].randoms.items()}


def _step(path, root, rec, n, header, layers, load_file, SafetensorError, max_positions) -> DumpStep:
    """One index line read: its keys and step number, its tensor file, then check_step."""
    where = f"step line {n}"
    keys = {"step", "request", "context", "parents", "tokens", "positions", "accepted", "emitted", "tensors"}
    if set(rec) != keys:
        _fail(path, f"{where}: keys {sorted(set(rec) ^ keys)} missing or unknown")
    if type(rec["step"]) is not int or rec["step"] != n - 2:  # (JSON's false and 0.0 equal 0)
        _fail(path, f"{where}: step {rec['step']!r}, expected {n - 2} (steps in file order from 0)")

    def fail(msg):
        _fail(path, f"step {rec['step']}: {msg}")
    if not isinstance(rec["tensors"], str):
        fail("request and tensors must be strings")
    f = root / rec["tensors"]
    if not f.is_file() or root.resolve() not in f.resolve().parents:
        fail(f"tensor file {rec['tensors']!r} is missing")
    with held_while_read(f):  # (inside a replay: its digest refuses a file changed since, ddsim.digest)
        try:
            tensors = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as e:
            fail(f"tensor file {rec['tensors']!r} is unreadable ({e})")
    check_step(rec, tensors, header=header, layers=layers, max_positions=max_positions, fail=fail)
    return DumpStep(rec["step"], rec["request"], rec["context"], rec["parents"], rec["tokens"], rec["positions"],
                    rec["accepted"], rec["emitted"], rec["tensors"], tensors)


def check_step(rec: dict, tensors: dict, *, header: dict, layers: dict | None, max_positions: int | None,
               fail) -> None:
    """Everything a step must be, read (load_dump) or about to be written (VerifyDumpWriter.write_step): a valid
    tree; positions, tokens in the vocabulary, the accepted path a root path of the tree, the emitted tokens the
    accepted nodes' after the root plus one; its tensors' names, shapes, dtypes, finite values, random numbers in
    [0, 1), top-k rows (_check_topk). ``fail(msg)`` raises; ``layers``, ``max_positions``: the checkpoint's, or
    None where unknown (the writer)."""
    from ddsim.trees.tree import Tree
    V = header["vocab_size"]
    for key in ("context", "parents", "tokens", "positions", "accepted", "emitted"):
        if not isinstance(rec[key], list) or not all(is_int(x) for x in rec[key]):
            fail(f"{key} must be a list of integers")
    if not isinstance(rec["request"], str) or not isinstance(rec["tensors"], str):
        fail("request and tensors must be strings")
    T = len(rec["parents"])
    if T == 0 or len(rec["tokens"]) != T or len(rec["positions"]) != T:
        fail(f"parents, tokens and positions must be one per node (got {T}, {len(rec['tokens'])}, "
             f"{len(rec['positions'])})")
    try:
        tree = Tree(rec["parents"], rec["tokens"])
    except (ValueError, InputError) as e:
        fail(str(e))
    for key in ("context", "tokens", "emitted"):
        bad = [t for t in rec[key] if not 0 <= t < V]
        if bad:
            fail(f"{key} token {bad[0]} is outside the vocabulary (0..{V - 1})")
    limit = max_positions if max_positions is not None else 2**31
    bad = [p for p in rec["positions"] if not 0 <= p < limit]
    if bad:
        fail(f"position {bad[0]} is outside [0, {limit}) (the checkpoint's max positions)")
    if len(rec["context"]) >= limit:
        fail(f"a context of {len(rec['context'])} tokens leaves no position below the checkpoint's {limit}")
    acc = rec["accepted"]
    if not acc or not 0 <= acc[-1] < T or acc != tree.root_path(acc[-1]):
        fail(f"accepted {acc} is not a root path of the tree")
    if rec["emitted"][:-1] != [rec["tokens"][i] for i in acc[1:]] or len(rec["emitted"]) != len(acc):
        fail(f"emitted {rec['emitted']} is not the accepted nodes' tokens after the root plus the bonus token")
    want = {"logits": (T, V)} if header["logits"] == "full" else {"topk_ids": (T, header["topk"]),
                                                                  "topk_logprobs": (T, header["topk"])}
    want.update(_random_shapes(header, T, int(max(tree.depths)), V))
    for name, shape in want.items():
        if name not in tensors:
            fail(f"tensor {name!r} is missing")
        if tuple(tensors[name].shape) != shape:
            fail(f"{name} has shape {tuple(tensors[name].shape)}, expected {shape}")
    extra = set(tensors) - set(want) - set(layers or {})
    if layers is None:  # the writer, which knows no checkpoint: a state tensor by its name alone
        extra = {k for k in extra if not _state_name(k)}
    if extra:
        fail(f"tensor {sorted(extra)[0]!r} does not fit the checkpoint")
    for name, t in tensors.items():
        if name in (layers or {}) and tuple(t.shape) != tuple(layers[name]):
            fail(f"{name} has shape {tuple(t.shape)}, expected {tuple(layers[name])}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            fail(f"{name} has non-finite values")
    for name in want:
        if name.startswith("random.") and not bool(((tensors[name] >= 0) & (tensors[name] < 1)).all()):
            fail(f"{name} has numbers outside [0, 1) (uniform random numbers expected)")
    if header["logits"] == "full" and not tensors["logits"].is_floating_point():
        fail(f"logits are {tensors['logits'].dtype}, expected floating point")
    if header["logits"] == "topk":
        _check_topk(fail, tensors["topk_ids"], tensors["topk_logprobs"], V, header["compute_dtype"])


def _state_name(name: str) -> bool:
    """Whether a tensor's name is a committed state's: "ssm.L" or "conv.L" for a layer L."""
    kind, _, layer = name.partition(".")
    return kind in ("ssm", "conv") and layer.isdigit()
