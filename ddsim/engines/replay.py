"""`ddsim replay`: a serving engine's verify steps (a dump, ddsim.engines.dump) against the exact oracle.

For every dumped step the committed context is decoded by the oracle (float64, one token at a time,
continued from the same request's previous step where the context extends it), the tree is verified
by the oracle (every node from its parent's exact state) and by ddsim's exact fast path, and each
node's engine logits are compared with the oracle's: KL(oracle || engine), top-1 agreement, the
oracle's top-1 margin. Exact greedy verification's accepted path is walked on the oracle's logits;
an engine that accepted anything else corrupted the output silently.

A step whose engine logits are not within the noise of the oracle's gets a diagnosis, each one a
recomputation of the step with ddsim's fast path that reproduces the engine's logits within noise:

  sibling leak     the flattened (leaky) recurrence, or its state or conv window alone (the audit's leaky,
                   leaky-state and leaky-conv modes): errors only on nodes that are not order-exact; or the
                   whole tree flattened (that recurrence and attention by a causal mask in batch order)
  position error   RoPE positions ignored (context + node index) or shifted by a few tokens (which moves the
                   root's too: tried before a wrong root is put down to the state)
  mask error       attention by a causal mask in batch order in place of the tree's, or one node's ancestor
                   set with one node added (a sibling blended in) or removed
  state commit error  the committed state wrong, and reproduced by a commit that took the recurrent state or
                   the attention KV from the wrong nodes of the previous step's tree, at that step or at every
                   step of the request (ddsim.engines.replay_commits: the path's length read as a batch index,
                   off by one, the last node's parent, the KV rows in batch order, the KV never rolled back)
  state drift      the committed state wrong: the root node already wrong (no tree bug can do that),
                   or order-exact nodes wrong that no tree hypothesis reproduces; the error growing
                   across the request's steps (approximate rollback, a drifting recurrent state)
  stale state      the committed state wrong without growth (a stale recurrent block, e.g. a
                   prefix-cache hit); so too a dumped committed state off the oracle's where the step's
                   logits are within noise (the engine's state, or its dump, is then not to be trusted)
  unexplained      none of the above reproduces the engine's logits

A step is judged whole, beyond its logits:

  bonus error      the emitted bonus token is not the argmax of the engine's own logits at the last
                   accepted node (the engine sampled or read the wrong row)
  acceptance error (greedy) the accepted path is not greedy verification on the engine's own logits (its
                   bonus their argmax all the same: an acceptance test off by a node, or a draft compared with
                   the wrong row)
  commit error     within a request, the step's context is not the previous step's context plus its
                   root and the tokens it emitted before the bonus, or its root is not the previous
                   bonus (the engine committed a rejected sibling, dropped or repeated a token)

Silent corruption compares what the engine emitted (accepted draft tokens and the bonus) with what
exact greedy verification on the oracle's logits emits. A sampled dump (temperature > 0) names its rule and
carries the engine's random numbers: the rule recomputed with them on the oracle's distributions is what
exact verification emits, and recomputed on the engine's own logits is what the engine should have emitted
(a difference is a bonus error); a difference from the oracle's that the engine's rounding explains (its
logits within noise, its rule followed) is not corruption. Positions are checked against the tree's
(prefix length + depth); unexpected ones are counted and fail the default policy.

The noise bound is the policy's KL tolerance for the engine's dtype (ddsim.verdict.gate.Policy.noise_kl, the
default policy's 1e-6; 5e-2 for a bf16 or fp16 engine named on the command line); a dump's declared
compute dtype can only tighten it, never loosen it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ddsim.engines.dump import Dump, DumpStep
from ddsim.engines.replay_commits import RequestCommits, hypotheses
from ddsim.engines.replay_verdict import (
    DIAGNOSES,
    acceptance_error,
    bonus_error,
    continued_context,
    default_tolerance,
    emitted_by_exact_greedy,
    greedy_walk,
    judge_continuity,
    judge_emission,
    node_bound,
    noise_bound,
    rule_error,
    sampled_walk,
    summarize,
    tolerance,
    tolerance_words,
    top_sets,
)
from ddsim.trees.tree import Tree

__all__ = ["DIAGNOSES", "Replayer", "default_tolerance", "greedy_walk", "noise_bound", "prepare", "run", "summarize",
           "tolerance", "tolerance_words", "write"]

# a dumped committed state (ssm.L, conv.L) further than this from the oracle's, relative, is wrong
# (the default policy's exact_state_rel_max per precision)
STATE_REL = {"float32": 1e-4, "float64": 1e-4, "bfloat16": 5e-2, "float16": 5e-2}
SHIFTS = (-3, -2, -1, 1, 2, 3)
# A commit hypothesis is screened by its root alone first (one node's verify): one whose root is further than this
# many noise bounds from the engine's cannot reproduce the step (the root is every node's ancestor). The margin keeps
# a hypothesis whose root a one-node batch rounds otherwise than the whole tree's.
ROOT_SCREEN = 4.0


@dataclass
class NodeRecord:
    node: int
    order_exact: bool
    kl: float | None  # KL(oracle || engine), full logits only
    logprob_err: float  # max |log p_oracle - log p_engine| over the engine's reported tokens
    top1_agrees: bool
    oracle_margin: float  # the oracle's top-1 lead over its runner-up, in logits
    fast_path_kl: float  # KL(oracle || ddsim's exact fast path): ddsim's own arithmetic noise here


@dataclass
class StepRecord:
    step: int
    request: str
    nodes: list[NodeRecord]
    positions_as_expected: bool
    engine_accepted: list[int]
    exact_accepted: list[int]
    silent_corruption: bool
    diagnosis: str
    evidence: str
    state_rel_max: float | None = None  # the dumped committed state against the oracle's (None: not dumped)
    engine_emitted: list[int] | None = None  # what the engine appended: accepted draft tokens, then the bonus
    exact_emitted: list[int] | None = None  # what exact greedy verification on the oracle's logits appends
    bonus_ok: bool = True  # the bonus is the argmax of the engine's own logits at its last accepted node
    commit_ok: bool = True  # the context and root continue the request's previous step
    # the engine emitted other than exact verification, but ran its rule on logits within noise of the oracle's
    # (a near-tie its rounding turned): not silent corruption (replay_verdict.judge_emission)
    rounding_divergence: bool = False


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits.double(), dim=-1)


def _engine_error(ref_lp: torch.Tensor, eng, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per node: max abs log-prob error over the engine's tokens [T], and KL(ref || engine) [T]
    (full logits; None for top-k)."""
    if mode == "full":
        lp = _logprobs(eng)
        kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).clamp_min(0.0)
        return (ref_lp - lp).abs().amax(-1), kl
    ids, lp = eng
    return (ref_lp.gather(-1, ids) - lp.double()).abs().amax(-1), None


def _score(err: tuple) -> torch.Tensor:
    """The per-node discrepancy a hypothesis is judged by: KL where there are full logits."""
    lp_err, kl = err
    return kl if kl is not None else lp_err


class Replayer:
    """Replays a dump against one checkpoint: the oracle, ddsim's exact fast path, the hypotheses."""

    def __init__(self, cfg, weights, *, device="cpu", tolerance: dict | None = None):
        from ddsim.model.model import HybridModel
        self.cfg, self.weights, self.device = cfg, weights, device
        self.model = HybridModel(cfg, weights, device=device, dtype=torch.float32)
        self.tolerance = tolerance or default_tolerance()
        self._oracle_ctx: dict[str, tuple[list[int], object]] = {}  # request -> (context, oracle state)
        self._fast_ctx: dict[str, tuple[list[int], object]] = {}
        self._commits: dict[str, RequestCommits] = {}  # request -> its steps, for the commit hypotheses

    def _state(self, cache, request, context, prefill):
        """The committed state after ``context``, continued from the request's last one if it extends it."""
        old = cache.get(request)
        if old is not None and context[: len(old[0])] == old[0]:
            st = prefill(context[len(old[0]):], old[1])
        else:
            st = prefill(context, None)
        cache[request] = (list(context), st)
        return st

    def _oracle_state(self, request, context):
        from ddsim import oracle
        return self._state(self._oracle_ctx, request, context,
                           lambda toks, st: oracle.prefill(self.weights, self.cfg, toks, state=st)[0])

    def _fast_state(self, request, context):
        return self._state(self._fast_ctx, request, context, lambda toks, st: self.model.prefill(toks, st)[0])

    def replay(self, dump: Dump) -> list[StepRecord]:
        noise = noise_bound(dump, self.tolerance)
        self.acceptance = dump.header["acceptance"]
        self.state_rel = STATE_REL[dump.header["compute_dtype"]]
        records = [self._step(s, dump.header["logits"], node_bound(noise, dump.header["logits"])) for s in dump.steps]
        _label_state_errors(records)
        judge_continuity(dump.steps, records)
        return records

    def _step(self, s: DumpStep, mode: str, noise: float) -> StepRecord:
        """One step's record; ``noise``: the per-node bound (replay_verdict.node_bound) for the dump's logits."""
        from ddsim import oracle
        tree = Tree(s.parents, s.tokens)
        ost = self._oracle_state(s.request, s.context)
        ref = oracle.verify_tree(self.weights, self.cfg, ost, s.parents, s.tokens, record_states=False).logits
        ref_lp = _logprobs(ref.cpu())
        fst = self._fast_state(s.request, s.context)
        commits = self._commits.get(s.request)
        if commits is None or commits.next_context != s.context:  # a new request, or one that does not continue
            commits = self._commits[s.request] = RequestCommits(start=fst, next_context=list(s.context))
        fast = self.model.verify(fst, tree, mode="exact").logits.cpu()
        fast_kl = _engine_error(ref_lp, fast, "full")[1]
        eng = s.tensors["logits"] if mode == "full" else (s.tensors["topk_ids"], s.tensors["topk_logprobs"])
        lp_err, kl = _engine_error(ref_lp, eng, mode)
        tops = top_sets(eng) if mode == "full" else top_sets(topk=eng)  # the engine's argmax per node, ties kept
        top2 = ref.double().topk(min(2, ref.shape[-1]), dim=-1).values
        margin = (top2[:, 0] - top2[:, -1]).cpu()
        oe = tree.order_exact
        nodes = [NodeRecord(i, bool(oe[i]), None if kl is None else float(kl[i]), float(lp_err[i]),
                            int(ref[i].argmax()) in tops[i], float(margin[i]), float(fast_kl[i]))
                 for i in range(tree.size)]
        acceptance = self.acceptance
        if acceptance == "greedy":
            exact_path = greedy_walk(tree, ref)
            exact_emitted = emitted_by_exact_greedy(tree, ref, exact_path)
        else:  # the engine's rule with its own random numbers, on the oracle's distributions
            exact_path, exact_emitted = sampled_walk(tree, ref, acceptance, s.tensors)
        expected_pos = [int(p) for p in tree.positions(len(s.context))]
        state_rel = _state_errors(s, ost)
        diagnosis, evidence = self._diagnose(s, tree, fst, eng, mode, ref_lp, noise, expected_pos, state_rel, commits)
        commits.steps.append((s.step, tree, list(s.accepted)))
        commits.last_exact = fst
        commits.next_context = continued_context(s)
        wrong_accept = None
        if acceptance == "greedy":  # greedy on its own logits: neither error (replay_verdict.follows_greedy)
            wrong_bonus = bonus_error(s.emitted, s.accepted, tops)
            wrong_accept = acceptance_error(tree, tops, s.accepted, s.emitted)
            follows = wrong_bonus is None and wrong_accept is None
        else:
            wrong_bonus = rule_error(list(s.emitted), sampled_walk(tree, eng, acceptance, s.tensors)[1],
                                     acceptance["rule"])
            follows = wrong_bonus is None
        # a near-tie the engine's rounding turned (an argmax, a random number on a decision boundary) is not
        # corruption where the engine ran its rule and its logits are within noise of the oracle's
        silent, rounding = judge_emission(emitted=s.emitted, exact=exact_emitted, follows_rule=follows,
                                          within_noise=diagnosis == "within noise")
        if wrong_bonus and diagnosis == "within noise":
            diagnosis, evidence = "bonus error", wrong_bonus
        elif wrong_accept and diagnosis == "within noise":
            diagnosis, evidence = "acceptance error", wrong_accept
        if rounding:  # where the engine left exact verification's walk, and by how near a tie
            i = next(j for j, (a, b) in enumerate(zip(s.emitted, exact_emitted)) if a != b)
            at = exact_path[i]  # the node whose decision emitted token i
            evidence += (f"; a rounding divergence: token {s.emitted[i]} where exact verification emits "
                         f"{exact_emitted[i]}, decided at node {at}, " + (
                             f"whose oracle top-1 lead is {float(margin[at]):.3g}" if acceptance == "greedy" else
                             "by a random number the engine's rounding put on the other side of a decision boundary"))
        return StepRecord(s.step, s.request, nodes, s.positions == expected_pos, list(s.accepted), exact_path,
                          silent, diagnosis, evidence,
                          max(state_rel.values()) if state_rel else None, list(s.emitted), exact_emitted,
                          wrong_bonus is None, rounding_divergence=rounding)

    def _diagnose(self, s, tree, fst, eng, mode, ref_lp, noise, expected_pos, state_rel, commits) -> tuple[str, str]:
        base = _score(_engine_error(ref_lp, eng, mode))
        worst = float(base.max())
        off = {k: v for k, v in state_rel.items() if v > self.state_rel}

        def state_off() -> str:
            k = max(off, key=off.get)
            return (f"the dumped committed state {k} is {off[k]:.3g} (relative) from the oracle's (bound "
                    f"{self.state_rel:.3g}; {len(off)} tensors off)")

        if worst <= noise:
            if off:  # the logits right and the dumped state not: the engine's state, or its dump, is not to be trusted
                return "stale state", (f"{state_off()}, though the step's logits are within noise (max discrepancy "
                                       f"{worst:.3g} <= noise {noise:.3g}): the committed state")
            return "within noise", f"max discrepancy {worst:.3g} <= noise {noise:.3g}"

        def fit(state=fst, **kw) -> float:
            logits = self.model.verify(state, tree, **kw).logits.cpu()
            return float(_score(_engine_error(_logprobs(logits), eng, mode)).max())

        def found(name, how, err):
            return name, f"{how} reproduces the engine within {err:.3g} (exact: {worst:.3g})"

        root = Tree([-1], [tree.tokens[0]])
        eng_root = eng[:1] if mode == "full" else (eng[0][:1], eng[1][:1])

        def root_off(state) -> bool:
            """Whether the root alone, verified from ``state``, is past ROOT_SCREEN noise bounds from the engine's."""
            logits = self.model.verify(state, root).logits.cpu()
            return float(_score(_engine_error(_logprobs(logits), eng_root, mode))[0]) > ROOT_SCREEN * noise

        def committed():
            """A commit hypothesis (replay_commits) whose state reproduces the engine, or None; the state it found
            is kept for the request's next step. Each is screened by its root first (ROOT_SCREEN)."""
            for how, state, origin in hypotheses(self.model, commits):
                if root_off(state):
                    continue
                err = fit(state)
                if err <= noise:
                    commits.diagnosed = (s.step, state, origin)
                    return found("state commit error", how + ":", err)
            commits.unreproduced = s.step  # the next step's hypotheses leave the search out (replay_commits)
            return None

        if off:  # the engine dumped its committed state, and it is not the oracle's
            if (hit := committed()) is not None:
                return hit
            return "stale state", f"{state_off()}: the committed state"

        T = tree.size

        def positions():
            """A position error that reproduces the engine, or None: the dumped positions where they differ from
            the tree's, per-node positions ignored, the tree's shifted (which moves the root's too)."""
            candidates = [("positions context + node index (per-node positions ignored)",
                           [len(s.context) + i for i in range(T)])]
            candidates += [(f"positions shifted by {d:+d}", [p + d for p in expected_pos]) for d in SHIFTS]
            if s.positions != expected_pos:
                candidates.insert(0, ("the dumped positions", s.positions))
            for how, pos in candidates:
                if min(pos) < 0 or pos == expected_pos:
                    continue
                err = fit(positions=pos)
                if err <= noise:
                    return found("position error", how, err)
            return None

        wrong = (base > noise).nonzero().flatten().tolist()
        if 0 not in wrong:  # the root is right: a tree-handling bug, not the state
            if tree.size > 1:
                for leak, how in (("leaky", "the flattened recurrence"),
                                  ("leaky-state", "the flattened recurrence in the state alone (the conv window by "
                                                  "the tree)"),
                                  ("leaky-conv", "the flattened conv window alone (the state by the tree)")):
                    err = fit(mode=leak)
                    if err <= noise:
                        return found("sibling leak", how, err)
                causal = np.tril(np.ones((T, T), dtype=bool))  # every earlier node in batch order, siblings included
                err = fit(ancestor_mask=causal)
                if err <= noise:
                    return found("mask error", "attention by a causal mask in batch order (in place of the tree's)", err)
                err = fit(mode="leaky", ancestor_mask=causal)
                if err <= noise:
                    return found("sibling leak", "the flattened recurrence and attention by a causal mask in batch order "
                                 "(the whole tree flattened)", err)
            if (hit := positions()) is not None:
                return hit
            t = wrong[0]
            anc = tree.ancestor_mask
            for j in range(T):  # add a non-ancestor, or remove a strict ancestor, from node t's set
                if j == t:
                    continue
                m = anc.copy()
                m[t, j] = not m[t, j]
                err = fit(ancestor_mask=m)
                if err <= noise:
                    kind = "added" if m[t, j] else "removed"
                    return found("mask error", f"node {t}'s ancestor set with node {j} {kind}", err)
            if not any(tree.order_exact[i] for i in wrong):
                return "unexplained", f"errors above noise on nodes {wrong[:8]}; no hypothesis reproduces them"
            return "stale state", (f"errors above noise on nodes {wrong[:8]}, order-exact ones among them, that no tree "
                                   "hypothesis reproduces: the committed state")
        if (hit := positions()) is not None:  # the root wrong: every position shifted, or the state
            return hit
        if (hit := committed()) is not None:
            return hit
        return "stale state", f"the root node is already wrong (discrepancy {float(base[0]):.3g}): the committed state"


def _state_errors(s: DumpStep, ost) -> dict[str, float]:
    """{"ssm.L" | "conv.L": relative error} of the engine's dumped committed state against the oracle's."""
    out = {}
    for name, t in s.tensors.items():
        kind, _, layer = name.partition(".")
        if kind not in ("ssm", "conv"):
            continue
        ref = (ost.ssm if kind == "ssm" else ost.conv)[int(layer)].double().cpu()
        out[name] = float((t.double() - ref).norm() / ref.norm().clamp_min(1e-30))
    return out


def _label_state_errors(records: list[StepRecord]) -> None:
    """The steps diagnosed with a wrong committed state: a request whose such steps grow in error step
    after step drifts ("state drift"); otherwise they stay "stale state". A step's error is its nodes' mean (KL,
    or log-probability error for a top-k dump): its worst node follows the few tokens a top-k row reports too
    closely to show the growth."""
    by_request: dict[str, list[StepRecord]] = {}
    for r in records:
        if r.diagnosis == "stale state":
            by_request.setdefault(r.request, []).append(r)
    for recs in by_request.values():
        mean = [sum(n.kl if n.kl is not None else n.logprob_err for n in r.nodes) / len(r.nodes) for r in recs]
        if len(recs) >= 2 and all(b > a for a, b in zip(mean, mean[1:])):
            for r in recs:
                r.diagnosis = "state drift"
                r.evidence += (f"; growing across the request's steps (mean over nodes "
                               f"{', '.join(f'{x:.3g}' for x in mean)})")


# ---- the command: checks first, then the replay, then report.json / report.html --------------------
REPORT_FORMAT = "ddsim-replay-report"
REPORT_VERSION = 4


def prepare(model_dir, dump_path, *, device="cpu"):
    """Checkpoint and dump, both read and checked before any replay work: (cfg, weights, dump, meta). Their digests
    are taken from disk after the reads, inside ddsim.digest.reading(): a file written or replaced since it was
    opened is an InputError, not a digest of other bytes than those replayed."""
    from ddsim.digest import files_digest, reading
    from ddsim.engines.dump import load_dump
    from ddsim.model.checkpoint import checkpoint_digest, load_checkpoint
    from ddsim.model.state import empty_state
    with reading():
        cfg, weights, _ = load_checkpoint(model_dir, device=device)
        st = empty_state(cfg)  # the committed state's shapes, as the model keeps it
        layers = {f"{kind}.{i}": tuple(t.shape) for kind, ts in (("ssm", st.ssm), ("conv", st.conv))
                  for i, t in enumerate(ts) if t is not None}
        dump = load_dump(dump_path, vocab_size=cfg.vocab_size, layers=layers, max_positions=cfg.max_position_embeddings)
        meta = {"model": str(model_dir), "weights_sha256": checkpoint_digest(model_dir),
                "dump": str(dump_path), "dump_sha256": files_digest(
                    [dump.path / "index.jsonl", *(dump.path / s.tensors_file for s in dump.steps)])}
    return cfg, weights, dump, meta


def run(model_dir, dump_path, *, device="cpu", tolerance: dict | None = None) -> dict:
    """The replay's report. ``tolerance``: the policy's KL tolerance (default_tolerance(); see noise_bound)."""
    from dataclasses import asdict

    import ddsim
    from ddsim.environment import environment
    tolerance = tolerance or default_tolerance()
    cfg, weights, dump, meta = prepare(model_dir, dump_path, device=device)
    rp = Replayer(cfg, weights, device=device, tolerance=tolerance)
    records = rp.replay(dump)
    noise = noise_bound(dump, tolerance)
    from ddsim.engines.replay_report import ReplayReport
    rep = {"format": REPORT_FORMAT, "version": REPORT_VERSION,
           "provenance": {"ddsim_version": ddsim.__version__, **meta, "engine": dump.header.get("engine", {}),
                          "compute_dtype": dump.header["compute_dtype"], "logits": dump.header["logits"],
                          "acceptance": dump.header["acceptance"]},
           "environment": environment(torch.device(device)), "noise_kl": noise, "summary": summarize(records, noise),
           "steps": [asdict(r) for r in records]}
    # validated through the typed model (a round trip through JSON, as a reader will see it)
    return json.loads(ReplayReport.model_validate_json(json.dumps(rep, allow_nan=False)).model_dump_json())


def render_html(rep: dict) -> str:
    import html
    s = rep["summary"]
    p = rep["provenance"]
    full = p["logits"] == "full"  # a top-k dump has no KL: its nodes' figure is the log-probability error

    def worst(r) -> float:
        return max((n["kl"] if full else n["logprob_err"]) for n in r["nodes"])

    def silent(r) -> str:
        return "<b>yes</b>" if r["silent_corruption"] else ("rounding" if r["rounding_divergence"] else "no")
    rows = "".join(
        f"<tr><td>{r['step']}</td><td>{html.escape(r['request'])}</td><td>{len(r['nodes'])}</td>"
        f"<td>{worst(r):.3g}</td>"
        f"<td>{sum(n['top1_agrees'] for n in r['nodes'])}/{len(r['nodes'])}</td>"
        f"<td>{r['engine_accepted']}</td><td>{r['exact_accepted']}</td>"
        f"<td>{silent(r)}</td><td>{html.escape(r['diagnosis'])}</td>"
        f"<td>{html.escape(r['evidence'])}</td></tr>" for r in rep["steps"])
    diag = ", ".join(f"{k}: {v}" for k, v in s["diagnoses"].items() if v)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>ddsim replay</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:3px 6px;font-size:13px}</style></head><body>"
            f"<h1>ddsim replay: {html.escape(str(p.get('engine', {}).get('name', 'engine')))}</h1>"
            f"<p>model {html.escape(p['model'])} (sha256 {p['weights_sha256'][:16]}…), dump {html.escape(p['dump'])}, "
            f"{p['compute_dtype']} engine, {p['logits']} logits; noise bound "
            f"{html.escape(tolerance_words(rep['noise_kl'], p['logits']))}</p>"
            f"<p>{s['steps']} steps of {s['requests']} requests, {s['nodes']} nodes; silent corruption in "
            f"<b>{s['silent_corruption_steps']}</b> steps (and {s['rounding_divergence_steps']} where the engine's "
            f"rounding turned a near-tie); diagnoses: {html.escape(diag)}; top-1 disagreements "
            f"{s['top1_disagreements']} ({s['top1_disagreements_above_noise']} above noise)</p>"
            f"<table><tr><th>step</th><th>request</th><th>nodes</th><th>{'max KL' if full else 'max log-prob error'}</th>"
            "<th>top-1 agree</th><th>engine accepted</th><th>exact accepts</th><th>silent corruption</th>"
            f"<th>diagnosis</th><th>evidence</th></tr>{rows}</table></body></html>\n")


def write(rep: dict, out) -> None:
    from pathlib import Path

    from ddsim.reports.json_report import write_atomic
    out = Path(out)
    write_atomic({out / "report.html": render_html(rep),
                  out / "report.json": json.dumps(rep, indent=1, allow_nan=False) + "\n"})
