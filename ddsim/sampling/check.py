"""`ddsim check-sampler`: a statistical losslessness test of a tree acceptance rule at temperature > 0.

For every case (ddsim.sampling.cases: the explicit ones, then hypothesis-drawn ones) the rule runs ``draws``
times, vectorised, on the case's tree with fresh random numbers; a rule that assumes sampled drafts gets its
children's tokens drafted per draw as it assumes (``iid`` or ``without-replacement``). What the step emits is
compared with autoregressive sampling from the target:

  first token       the first emitted token against the target at the root
  first two         the first two emitted tokens jointly (a step that emitted one is continued by one
                    autoregressive sample) against p(y1) p(y2 | y1)
  after prefix s    for the prefixes the draws emitted most (up to ``max_prefix_tests`` per case, each seen
                    at least ``min_prefix_draws`` times), the next emitted token among the draws that emitted
                    more than s, against the target after s

each by ddsim.sampling.stats' L1 test at false-alarm rate alpha / (cases x tests per case), so that the whole
run raises a false alarm with probability at most ``alpha``. Beyond the statistics, a rule fails outright
when it returns a path that is not a root path of the tree or a bonus outside the vocabulary, emits a token
the target gives probability 0, changes its inputs, or gives different outputs for the same random numbers.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ddsim.errors import one_line
from ddsim.sampling.cases import SamplerCase, case_strategy, child_id, explicit_cases, fixed_tree, offsets, tables
from ddsim.sampling.rules import children_table, draw_randoms, inverse_cdf
from ddsim.sampling.stats import detectable_tv, l1_test
from ddsim.trees.seeds import derive_seed

DEFAULT_DRAWS = 1_000_000
DEFAULT_ALPHA = 1e-6
CHUNK = 1 << 15


@dataclass
class Sampler:
    """What check-sampler runs: ``call(parents, tokens, target, draft, randoms) -> (path, bonus)`` in ddsim's
    convention (ddsim.sampling.rules)."""
    name: str
    call: object
    randoms: dict
    drafting: str
    uses_draft: bool = False


@dataclass
class CaseResult:
    case: SamplerCase
    draws: int
    tests: list = field(default_factory=list)  # {name, n, l1, threshold, impossible, holds, measured, expected}
    failure: str | None = None  # a certain failure (malformed output, impossible token, inputs changed, ...)

    @property
    def holds(self) -> bool:
        return self.failure is None and all(t["holds"] for t in self.tests)

    def worst(self) -> dict | None:
        return max(self.tests, key=lambda t: (not t["holds"], t["l1"] / t["threshold"]), default=None)


@dataclass
class SamplerResult:
    sampler: str
    drafting: str
    draws: int
    alpha: float
    alpha_per_test: float
    cases: list
    seconds: float

    @property
    def holds(self) -> bool:
        return all(c.holds for c in self.cases)

    def worst(self) -> CaseResult:
        """A failing case before a holding one, a certain failure first, then the largest L1 over threshold."""
        def key(c: CaseResult):
            w = c.worst()
            return not c.holds, c.failure is not None, w["l1"] / w["threshold"] if w else 0.0
        return max(self.cases, key=key)


def _validate(path, bonus, parents, R, D, V) -> str | None:
    if not (isinstance(path, torch.Tensor) and isinstance(bonus, torch.Tensor)):
        return "the rule did not return two tensors (path, bonus)"
    if tuple(path.shape) != (R, D + 1) or tuple(bonus.shape) != (R,):
        return f"shapes path {tuple(path.shape)} and bonus {tuple(bonus.shape)}, expected ({R}, {D + 1}) and ({R},)"
    if path.dtype.is_floating_point or bonus.dtype.is_floating_point:
        return "path and bonus must be integer tensors"
    if bool((path[:, 0] != 0).any()):
        return "a path does not start at the root"
    par = torch.tensor(parents, dtype=torch.long)
    for d in range(1, D + 1):
        on, prev = path[:, d] >= 0, path[:, d - 1]
        if bool((on & (prev < 0)).any()):
            return f"a path resumes after its end (depth {d})"
        node = path[:, d].clamp(0, len(parents) - 1)  # (a node id past the tree is looked up at the last node)
        if bool((on & ((path[:, d] >= len(parents)) | (par[node] != prev))).any()):
            return f"a path steps to a node that is not a child of the previous one (depth {d})"
    if bool(((bonus < 0) | (bonus >= V)).any()):
        return "a bonus token outside the vocabulary (or none: the rule had nothing left to sample from)"
    return None


def _draft_tokens(case, parents, draft_tab, drafting, R, gen, V, off, depth):
    """tokens [R, T] and prefix ids [R, T] drafted per draw (iid or without replacement)."""
    T = len(parents)
    tokens = torch.zeros(R, T, dtype=torch.long)
    ids = torch.zeros(R, T, dtype=torch.long)
    taken: dict[int, torch.Tensor] = {}
    for i in range(1, T):
        p = parents[i]
        q = draft_tab[ids[:, p]]
        if drafting == "without-replacement":
            mask = taken.setdefault(p, torch.zeros(R, V, dtype=torch.bool))
            q = q.masked_fill(mask, 0.0)
        t = inverse_cdf(q, torch.rand(R, generator=gen, dtype=torch.float64))
        if bool((t < 0).any()):  # every token already drafted: the shape has more children than V
            raise ValueError(f"{case.label}: a node has more children than the draft has tokens")
        if drafting == "without-replacement":
            taken[p][torch.arange(R), t] = True
        tokens[:, i] = t
        ids[:, i] = child_id(ids[:, p], t, V=V, off=off, length=int(depth[p]))
    return tokens, ids


def run_case(sampler: Sampler, case: SamplerCase, *, draws: int, alpha_per_test: float, max_prefix_tests: int = 30,
             min_prefix_draws: int = 2000, seed: int = 0) -> CaseResult:
    target_tab, draft_tab = tables(case)
    parents, fixed_tokens = fixed_tree(case, draft_tab)
    T, V = len(parents), case.vocab
    _, depth = children_table(parents)
    D = int(depth.max())
    off = offsets(V, max(case.depth, 1))
    res = CaseResult(case, draws)
    fixed_ids = torch.zeros(T, dtype=torch.long)
    for i in range(1, T):
        fixed_ids[i] = child_id(int(fixed_ids[parents[i]]), fixed_tokens[i], V=V, off=off, length=int(depth[parents[i]]))
    counts = torch.zeros(len(target_tab) * V, dtype=torch.long)
    joint = torch.zeros(V * V, dtype=torch.long)
    gen = torch.Generator().manual_seed(derive_seed(seed, "check-sampler", case.seed))
    done = 0
    while done < draws:
        R = min(CHUNK, draws - done)
        if sampler.drafting == "fixed":
            tokens = torch.tensor(fixed_tokens, dtype=torch.long).expand(R, T).contiguous()
            ids = fixed_ids.expand(R, T)
        else:
            tokens, ids = _draft_tokens(case, parents, draft_tab, sampler.drafting, R, gen, V, off, depth)
        target = target_tab[ids]  # [R, T, V]
        draft = draft_tab[ids.gather(1, torch.tensor([0] + list(parents[1:])).expand(R, T))] if sampler.uses_draft \
            else None
        randoms = draw_randoms(sampler.randoms, R=R, T=T, D=D, V=V, generator=gen)
        if done == 0:
            before = [x.clone() for x in (tokens, target, *( [draft] if draft is not None else []), *randoms.values())]
        try:
            out = sampler.call(parents=torch.tensor(parents), tokens=tokens, target=target, draft=draft,
                               randoms=randoms)
        except Exception as e:  # noqa: BLE001 - a rule that raises fails its case, with the reason
            res.failure = f"the rule raised {type(e).__name__}: {one_line(e)}"
            return res
        path, bonus = out if isinstance(out, (tuple, list)) and len(out) == 2 else (out, None)
        bad = _validate(path, bonus, parents, R, D, V)  # (not two outputs: said as _validate says it)
        if bad:
            res.failure = bad
            return res
        path, bonus = path.long(), bonus.long()
        if done == 0:
            after = [tokens, target, *([draft] if draft is not None else []), *randoms.values()]
            if any(not torch.equal(a, b) for a, b in zip(before, after)):
                res.failure = "the rule wrote into its inputs (tokens, distributions or random numbers)"
                return res
            try:  # called again on the same numbers: a raise there fails the case too, as does another output
                again = sampler.call(parents=torch.tensor(parents), tokens=tokens, target=target, draft=draft,
                                     randoms=randoms)
            except Exception as e:  # noqa: BLE001
                res.failure = (f"the rule raised {type(e).__name__}: {one_line(e)} when called again on the same "
                               "random numbers")
                return res
            if not (isinstance(again, (tuple, list)) and len(again) == 2 and _validate(*again, parents, R, D, V) is None
                    and torch.equal(again[0].long(), path) and torch.equal(again[1].long(), bonus)):
                res.failure = "the same random numbers gave different outputs"
                return res
        _count(path, bonus, tokens, ids, counts, joint, target_tab, gen, V, off)
        done += R
    res.tests = _tests(counts, joint, target_tab, V, off, draws, alpha_per_test, max_prefix_tests, min_prefix_draws)
    return res


def _count(path, bonus, tokens, ids, counts, joint, target_tab, gen, V, off) -> None:
    R, D1 = path.shape
    rows = torch.arange(R)
    emitted = []
    for k in range(D1):
        node = path[:, k]
        on = node >= 0
        nxt_node = path[:, k + 1] if k + 1 < D1 else torch.full_like(node, -1)
        nxt = torch.where(nxt_node >= 0, tokens[rows, nxt_node.clamp(min=0)], bonus)
        pid = ids[rows, node.clamp(min=0)]
        counts.index_add_(0, (pid * V + nxt)[on], torch.ones(int(on.sum()), dtype=torch.long))
        emitted.append(torch.where(on, nxt, -1))
    y1 = emitted[0]
    y2 = emitted[1] if D1 > 1 else torch.full_like(y1, -1)
    more = inverse_cdf(target_tab[child_id(torch.zeros_like(y1), y1, V=V, off=off, length=0)],
                       torch.rand(R, generator=gen, dtype=torch.float64))
    y2 = torch.where(y2 >= 0, y2, more)
    joint.index_add_(0, y1 * V + y2, torch.ones(R, dtype=torch.long))


def _tests(counts, joint, target_tab, V, off, draws, alpha, max_prefix_tests, min_prefix_draws) -> list[dict]:
    table = counts.view(-1, V)
    out = []

    def add(name, c, p):
        t = l1_test(c, p, alpha)
        t.update(name=name, measured=(c.double() / max(t["n"], 1)).tolist(), expected=p.tolist())
        out.append(t)
    add("first token", table[0], target_tab[0])
    pj = (target_tab[0][:, None] * target_tab[off[1]:off[1] + V]).reshape(-1)
    add("first two tokens", joint, pj)
    n = table.sum(1)
    n[0] = 0
    order = torch.argsort(n, descending=True, stable=True)[:max_prefix_tests]
    for pid in order.tolist():
        if int(n[pid]) < min_prefix_draws:
            break
        add(f"after prefix {_prefix(pid, V, off)}", table[pid], target_tab[pid])
    return out


def _prefix(pid: int, V: int, off: list[int]) -> list[int]:
    l = max(i for i in range(len(off)) if off[i] <= pid)
    x, toks = pid - off[l], []
    for _ in range(l):
        toks.append(x % V)
        x //= V
    return toks[::-1]


def draw_cases(max_examples: int, seed: int = 0) -> list[SamplerCase]:
    """The explicit cases, then ``max_examples`` hypothesis-drawn ones (derandomised: the same list every run)."""
    cases = explicit_cases()
    if max_examples <= 0:
        return cases
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample
    drawn: list[SamplerCase] = []

    def keep(c):
        if len(drawn) < max_examples and c not in drawn:
            drawn.append(c)
        return False
    try:
        find(case_strategy(), keep, settings=settings(max_examples=max_examples * 3, database=None, derandomize=True,
                                                      deadline=None, suppress_health_check=list(HealthCheck)))
    except NoSuchExample:
        pass
    from dataclasses import replace
    return cases + [replace(c, label=f"drawn {k + 1}") for k, c in enumerate(drawn[:max_examples])]


def check(sampler: Sampler, *, draws: int = DEFAULT_DRAWS, max_examples: int = 24, alpha: float = DEFAULT_ALPHA,
          max_prefix_tests: int = 30, seed: int = 0, on_case=None) -> SamplerResult:
    t0 = time.perf_counter()
    cases = draw_cases(max_examples, seed)
    alpha_per_test = alpha / (len(cases) * (2 + max_prefix_tests))
    results = []
    for c in cases:
        if sampler.drafting == "without-replacement" and _too_wide(c):
            continue  # more children than tokens: no draft without replacement exists
        r = run_case(sampler, c, draws=draws, alpha_per_test=alpha_per_test, max_prefix_tests=max_prefix_tests,
                     seed=seed)
        results.append(r)
        if on_case:
            on_case(r)
    return SamplerResult(sampler.name, sampler.drafting, draws, alpha, alpha_per_test, results,
                         time.perf_counter() - t0)


def _too_wide(case: SamplerCase) -> bool:
    kids: dict[int, int] = {}
    for p in case.parents[1:]:
        kids[p] = kids.get(p, 0) + 1
    return max(kids.values(), default=0) > case.vocab


def power_line(draws: int, alpha_per_test: float, V: int = 16) -> str:
    return (f"detects, with probability >= 0.99, a first-token error of total variation "
            f"{detectable_tv(V, draws, alpha_per_test):.4f} (V={V}) and a first-two-tokens error of "
            f"{detectable_tv(V * V, draws, alpha_per_test):.4f} (V={V})")


def describe_failure(r: CaseResult) -> list[str]:
    lines = [f"worst case: {r.case.describe()}"]
    if r.failure:
        return lines + [f"  {r.failure}"]
    w = r.worst()
    lines.append(f"  {w['name']}: L1 {w['l1']:.4g} over {w['n']} draws, threshold {w['threshold']:.4g}"
                 + (f", {w['impossible']} draws emitted a token of target probability 0" if w["impossible"] else ""))
    if len(w["measured"]) <= 32:
        lines.append("  measured " + " ".join(f"{x:.4f}" for x in w["measured"]))
        lines.append("  expected " + " ".join(f"{x:.4f}" for x in w["expected"]))
    else:  # the joint table: its largest differences
        diff = sorted(range(len(w["measured"])), key=lambda i: -abs(w["measured"][i] - w["expected"][i]))[:6]
        V = int(math.isqrt(len(w["measured"])))
        lines.append("  largest differences (y1, y2): " + ", ".join(
            f"({i // V}, {i % V}) {w['measured'][i]:.4f} vs {w['expected'][i]:.4f}" for i in diff))
    return lines
