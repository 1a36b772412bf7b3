"""`ddsim replay` and `ddsim gate --dump`: an engine emulated from ddsim's own layers (tests/emulated_engine.py)
serves a tiny transformers-built Qwen3.5 checkpoint and dumps its verify steps, clean and with each
planted integration bug; the replay must pass the clean dump and name the right class for each bug,
step by step. Bad dumps get one line and exit 2."""
import json
import re
from pathlib import Path

import pytest
import torch

from tests.cli_runs import one_line_error, run_cli
from tests.emulated_engine import load_model, write_dump
from tests.file_times import set_back

# per bug: the diagnosis of each of the 8 steps (2 requests x 4 steps)
EXPECTED = {
    None: ["within noise"] * 8,
    "leak": ["sibling leak"] * 8,
    "leak-state": ["sibling leak"] * 8,
    "leak-conv": ["sibling leak"] * 8,
    "positions": ["position error"] * 8,
    "shift": ["position error"] * 8,
    "mask": ["mask error"] * 8,
    "causal": ["mask error"] * 8,
    "flat": ["sibling leak"] * 8,
    # the first step of each request starts from an exact prefill; then the drift grows
    "drift": ["within noise"] + ["state drift"] * 3 + ["within noise"] + ["state drift"] * 3,
    # only step 2 of each request read the stale block
    "stale": ["within noise"] * 2 + ["stale state"] + ["within noise"] * 3 + ["stale state", "within noise"],
    # step 1 of each request emits a bonus its own logits do not pick (and so the next root follows it)
    "bonus": ["within noise", "bonus error", "within noise", "within noise"] * 2,
    # step 1 of each request stops a node short of the engine's own greedy walk
    "accept": ["within noise", "acceptance error", "within noise", "within noise"] * 2,
    # after step 1 the rejected sibling is committed: step 2's context does not continue the request
    "commit": ["within noise", "within noise", "commit error", "within noise"] * 2,
    # step 2's root is not step 1's bonus
    "root": ["within noise", "within noise", "commit error", "within noise"] * 2,
    # every step commits the recurrent state of node len(path) - 1, or the KV rows of nodes 0 .. len(path) - 1: each
    # later step of the request starts from the wrong state
    "commit-state": (["within noise"] + ["state commit error"] * 3) * 2,
    "commit-kv": (["within noise"] + ["state commit error"] * 3) * 2,
    # the rejected nodes' KV never rolled back: every later step attends to them
    "commit-norollback": (["within noise"] + ["state commit error"] * 3) * 2,
    # step 1 alone commits node len(path)'s recurrent state; step 3 inherits it
    "commit-once": ["within noise", "within noise", "state commit error", "state commit error"] * 2,
    # every step commits the recurrent state of node 6, a rejected sibling no rule names: found by the search, then
    # carried step by step
    "commit-node": (["within noise"] + ["state commit error"] * 3) * 2,
}


@pytest.fixture(scope="module")
def dumps(ckpt, tmp_path_factory):
    model = load_model(ckpt)
    root = tmp_path_factory.mktemp("dumps")
    out = {}
    for bug in EXPECTED:
        write_dump(root / str(bug), model, bug=bug)
        out[bug] = root / str(bug)
    return out


@pytest.mark.parametrize("bug", list(EXPECTED))
def test_replay_names_each_planted_bug(ckpt, dumps, bug):
    """In process, so that mutation testing's mutants reach it (the command line's own test is the next one)."""
    from ddsim.engines import replay
    from ddsim.engines.dump import load_dump
    from ddsim.model.checkpoint import checkpoint_digest
    from ddsim.trees.tree import Tree
    rep = replay.run(ckpt, dumps[bug])
    assert [s["diagnosis"] for s in rep["steps"]] == EXPECTED[bug]
    s = rep["summary"]
    assert s["steps"] == 8 and s["requests"] == 2 and s["fast_path_kl_max"] < 1e-9
    p = rep["provenance"]
    assert p["engine"] == {"name": f"emulated-{bug or 'clean'}"}
    env = rep["environment"]  # what the reference ran under
    assert (env["torch"], env["device"], env["ddsim"]) == (torch.__version__, "cpu", p["ddsim_version"])
    assert (p["model"], p["dump"], p["weights_sha256"]) == (str(ckpt), str(dumps[bug]), checkpoint_digest(ckpt))
    dumped = load_dump(dumps[bug], vocab_size=96).steps
    for st, d in zip(rep["steps"], dumped, strict=True):  # each node's flags and figures, node by node
        assert [n["order_exact"] for n in st["nodes"]] == [bool(x) for x in Tree(d.parents, d.tokens).order_exact]
        lp = torch.log_softmax(d.tensors["logits"].double(), -1)
        for n in st["nodes"]:  # the engine's figures against its own logits: a node within noise is so in both
            assert n["logprob_err"] < 1e-5 or n["kl"] > 1e-9, (st["step"], n)
            top2 = lp[n["node"]].topk(2).values  # the oracle's lead, within the engine's noise where it is exact
            assert n["kl"] > 1e-9 or abs(n["oracle_margin"] - float(top2[0] - top2[1])) < 1e-5, (st["step"], n)
    if bug is None:
        assert s["silent_corruption_steps"] == 0 and s["top1_disagreements"] == 0 and s["kl_max"] < 1e-9
        assert all(st["engine_accepted"] == st["exact_accepted"] for st in rep["steps"])
        assert all(st["engine_emitted"] == st["exact_emitted"] for st in rep["steps"])
    else:
        assert s["diagnosed_steps"] == sum(d != "within noise" for d in EXPECTED[bug])
    if bug == "leak":  # the leak reaches only nodes that are not order-exact, and here it changes what is accepted
        for st in rep["steps"]:
            assert all(n["kl"] < 1e-9 and n["logprob_err"] < 1e-5 for n in st["nodes"] if n["order_exact"])
            assert any(n["kl"] > 1e-6 for n in st["nodes"] if not n["order_exact"])
        assert s["silent_corruption_steps"] > 0
        assert all(st["evidence"].startswith("the flattened recurrence reproduces") for st in rep["steps"])
    if bug == "mask":  # node 2 (the sibling of node 1) with node 1 blended in
        assert rep["steps"][0]["evidence"].startswith("node 2's ancestor set with node 1 added reproduces"), \
            rep["steps"][0]["evidence"]
    if bug == "stale":  # the root already off, by its own discrepancy
        st = rep["steps"][2]
        assert st["evidence"] == (f"the root node is already wrong (discrepancy {st['nodes'][0]['kl']:.3g}): the "
                                  "committed state"), st["evidence"]
    if bug == "bonus":  # the accepted path is right, the emitted bonus is not: silent corruption all the same
        bad = [st for st in rep["steps"] if st["diagnosis"] == "bonus error"]
        assert all(st["engine_accepted"] == st["exact_accepted"] and st["silent_corruption"] for st in bad)
        assert s["bonus_error_steps"] == 2 and "its own logits' argmax there is" in bad[0]["evidence"]
    if bug in ("leak-state", "leak-conv"):  # one leak source alone, named as such
        assert rep["steps"][0]["evidence"].startswith(
            "the flattened recurrence in the state alone" if bug == "leak-state" else
            "the flattened conv window alone"), rep["steps"][0]["evidence"]
    if bug in ("causal", "flat"):  # a causal mask over the tree, with or without the flattened recurrence
        assert rep["steps"][0]["evidence"].startswith(
            "attention by a causal mask in batch order (in place of the tree's) reproduces" if bug == "causal" else
            "the flattened recurrence and attention by a causal mask in batch order (the whole tree flattened) "
            "reproduces"), rep["steps"][0]["evidence"]
    if bug in ("positions", "shift"):  # named by the hypothesis that reproduces it
        ev = rep["steps"][0]["evidence"]
        assert ev.startswith("positions context + node index (per-node positions ignored) reproduces"
                             if bug == "positions" else "positions shifted by +1 reproduces"), ev
    if bug == "accept":  # every logit right, the bonus its own argmax, the path a node short: silent corruption
        bad = [st for st in rep["steps"] if st["diagnosis"] == "acceptance error"]
        assert all(st["silent_corruption"] and st["bonus_ok"] and st["engine_accepted"] == st["exact_accepted"][:-1]
                   for st in bad) and s["kl_max"] < 1e-9
        assert bad[0]["evidence"] == (f"the engine accepted {bad[0]['engine_accepted']}; greedy verification on its "
                                      f"own logits accepts {bad[0]['exact_accepted']}")
    if bug in ("commit", "root"):
        assert s["commit_error_steps"] == 2 and s["kl_max"] < 1e-9  # every logit right, the request broken
        ev = next(st["evidence"] for st in rep["steps"] if st["diagnosis"] == "commit error")
        assert ("is not step 1's context plus what that step committed" in ev if bug == "commit"
                else "is not step 1's bonus" in ev), ev
    if bug in ("commit-state", "commit-kv", "commit-norollback", "commit-once", "commit-node"):  # the context
        # continues, the state not
        assert s["commit_error_steps"] == 0 and s["diagnoses"]["state commit error"] == 6 - 2 * (bug == "commit-once")
        ev = [st["evidence"] for st in rep["steps"][:4]]
        if bug == "commit-state":  # len(path) - 1 is also the last node's parent on this tree: both named
            assert ev[1].startswith("step 0 committed the recurrent state and conv window of node 3 in place of node "
                                    "5's (the accepted path's length read as a batch index or the last accepted node's "
                                    "parent, an accept length off by one): reproduces the engine within"), ev[1]
            assert ev[3].startswith("every step committed by the accepted path's length read as a batch index or the "
                                    "last accepted node's parent, an accept length off by one (other than the accepted "
                                    "path's at steps 0, 1, 2): reproduces"), ev[3]
        elif bug == "commit-norollback":
            assert ev[1].startswith("step 0 committed the KV rows of nodes 0..6 in place of the accepted path's "
                                    "[0, 1, 3, 5] (the KV never rolled back): reproduces"), ev[1]
            assert ev[3].startswith("every step committed by the KV never rolled back (other than the accepted "
                                    "path's at steps 0, 1, 2): reproduces"), ev[3]
        elif bug == "commit-kv":
            assert ev[1].startswith("step 0 committed the KV rows of nodes [0, 1, 2, 3] in place of the accepted path's "
                                    "[0, 1, 3, 5] (the KV rows in batch order): reproduces"), ev[1]
            assert ev[2].startswith("every step committed by the KV rows in batch order (other than the accepted "
                                    "path's at steps 0, 1): reproduces"), ev[2]
        elif bug == "commit-node":
            assert ev[1].startswith("step 0 committed the recurrent state and conv window of node 6 in place of node "
                                    "5's (a node no rule names, found by search): reproduces"), ev[1]
            for k in (2, 3):
                assert ev[k].startswith("step 0 committed the recurrent state and conv window of node 6 in place of "
                                        "node 5's (a node no rule names, found by search), carried on, and step "
                                        f"{k - 1} committed the recurrent state and conv window of node 6 in place of "
                                        "node "), ev[k]
                assert "(a node no rule names, found by search): reproduces" in ev[k], ev[k]
        else:
            assert ev[2].startswith("step 1 committed the recurrent state and conv window of node 4 in place of node "
                                    "5's (that batch index off by one): reproduces"), ev[2]
            assert ev[3].startswith("step 1 committed the recurrent state and conv window of node 4 in place of node "
                                    "5's (that batch index off by one), carried on, step 2 committed exactly: "), ev[3]


def test_the_commit_search_runs_once_per_run_of_unreproduced_states(ckpt, dumps, monkeypatch):
    """A drifting engine: each request's steps 1-3 have a wrong state no hypothesis reproduces. The search over
    every node runs at step 1 alone (after step 0, whose state was right), not after a step whose state it could not
    reproduce; a wrong node committed every step is searched at each step, each found."""
    from ddsim.engines import replay, replay_commits
    calls = []
    real = replay_commits.unnamed
    monkeypatch.setattr(replay_commits, "unnamed", lambda path, T: calls.append(T) or real(path, T))
    assert [s["diagnosis"] for s in replay.run(ckpt, dumps["drift"])["steps"]] == EXPECTED["drift"]
    assert calls == [7, 7]
    calls.clear()
    assert [s["diagnosis"] for s in replay.run(ckpt, dumps["commit-node"])["steps"]] == EXPECTED["commit-node"]
    assert calls == [7] * 6


def test_commit_hypotheses_are_screened_by_their_root(ckpt, dumps, monkeypatch):
    """Each commit hypothesis is verified on its root alone first, and the whole tree only where the root is within
    the screen's margin: the same diagnoses and evidence as with no screen, in fewer verifies of the whole tree."""
    from ddsim.engines import replay
    from ddsim.model.model import HybridModel
    real, margin = HybridModel.verify, replay.ROOT_SCREEN
    for bug in ("commit-node", "drift", "commit-state"):
        runs = []
        for screen in (margin, float("inf")):
            sizes = []
            monkeypatch.setattr(replay, "ROOT_SCREEN", screen)
            monkeypatch.setattr(HybridModel, "verify", lambda self, state, tree, *a, **kw: sizes.append(tree.size)
                                or real(self, state, tree, *a, **kw))
            rep = replay.run(ckpt, dumps[bug])
            runs.append(([(s["diagnosis"], s["evidence"]) for s in rep["steps"]], sizes.count(7), sizes.count(1)))
        (screened, whole, roots), (unscreened, whole_all, roots_all) = runs
        assert screened == unscreened and roots == roots_all > 0, bug
        assert whole < whole_all, (bug, whole, whole_all)


@pytest.mark.parametrize("bug", [None, "leak"])
def test_the_replay_command_reports_what_the_replay_finds(tmp_path, ckpt, dumps, bug):
    """The command line's replay: exit 0, report.json with the diagnoses and counts of the in-process replay
    (above), report.html beside it, and silent corruption named on stdout."""
    from ddsim.engines import replay
    r = run_cli("replay", "--model", ckpt, "--dump", dumps[bug], "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    here = replay.run(ckpt, dumps[bug])
    assert [s["diagnosis"] for s in rep["steps"]] == [s["diagnosis"] for s in here["steps"]] == EXPECTED[bug]
    counts = {k: v for k, v in here["summary"].items() if isinstance(v, int | dict)}
    assert counts and {k: rep["summary"][k] for k in counts} == counts
    assert (tmp_path / "r" / "report.html").is_file()
    assert ("SILENT CORRUPTION" in r.stdout) == (bug == "leak"), r.stdout


def test_a_dumped_committed_state_is_checked_against_the_oracles(tmp_path, ckpt):
    """With the engine's committed state in the dump, a drifting state is named by the tensor that is
    off, from the first drifted step on; a clean engine's dumped state is within fp32 noise."""
    from ddsim.engines import replay
    model = load_model(ckpt)
    for bug in (None, "drift"):
        write_dump(tmp_path / str(bug), model, bug=bug, dump_states=True, prompts=((3, 1, 4, 1, 5),), steps=3)
        steps = replay.run(ckpt, tmp_path / str(bug))["steps"]
        rel = [s["state_rel_max"] for s in steps]
        if bug is None:
            assert max(rel) < 1e-5 and [s["diagnosis"] for s in steps] == ["within noise"] * 3
        else:
            assert rel[0] < 1e-5 and min(rel[1:]) > 0.1
            assert [s["diagnosis"] for s in steps] == ["within noise", "state drift", "state drift"]
            assert "the dumped committed state ssm." in steps[1]["evidence"]


def test_gate_on_a_dump(tmp_path, ckpt, dumps):
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps[None], "--model", ckpt)
    assert g.returncode == 0, g.stdout + g.stderr
    assert g.stdout.splitlines()[-1].endswith("logits within KL 1e-06 of the oracle's count as exact: the policy's "
                                              "tolerance for a float32 engine): all 7 rules hold")
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps["leak"], "--model", ckpt, "--out", tmp_path / "g")
    assert g.returncode == 1, g.stdout + g.stderr
    violated = [l.split(":")[0] for l in g.stdout.splitlines() if l.startswith("VIOLATED")]
    assert violated == ["VIOLATED silent_corruption_steps", "VIOLATED diagnosed_steps",
                        "VIOLATED top1_disagreements_above_noise"]
    assert json.loads((tmp_path / "g" / "report.json").read_text())["summary"]["diagnoses"]["sibling leak"] == 8
    # a dump with no verify step approves nothing
    from ddsim.engines.dump import VerifyDumpWriter
    with VerifyDumpWriter(tmp_path / "empty", vocab_size=96):
        pass
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", tmp_path / "empty", "--model", ckpt)
    assert g.returncode == 1 and "VIOLATED replayed_steps: measured 0 < bound 1" in g.stdout
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps[None]), "--dump: needs --model DIR")
    one_line_error(run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps[None], "--model", ckpt, "--budget", "4"),
                   "--budget: not an option of a replay")


def _edit(src, dst, *, header=None, step=None, tensors=None, drop_end=False):
    """A copy of the dump at src with its header, first step line or first step's tensors edited."""
    import shutil
    shutil.copytree(src, dst)
    lines = (dst / "index.jsonl").read_text().splitlines()
    if header:
        lines[0] = json.dumps({**json.loads(lines[0]), **header})
    if step:
        lines[1] = json.dumps({**json.loads(lines[1]), **step})
    if drop_end:
        lines = lines[:-1]
    (dst / "index.jsonl").write_text("\n".join(lines) + "\n")
    if tensors:
        from safetensors.torch import load_file, save_file
        f = dst / "steps" / "000000.safetensors"
        save_file(tensors(load_file(str(f))), str(f))
    return dst


def _nan_logits(t):
    t["logits"][0, 0] = float("nan")
    return t


@pytest.mark.parametrize("edit, needle", [
    (dict(drop_end=True), "truncated: no end marker"),
    (dict(header={"version": 9}), "schema version 9 is not supported"),
    (dict(header={"version": True}), "schema version True is not supported"),  # (True == 1 in Python: it was taken)
    (dict(header={"version": 1.0}), "schema version 1.0 is not supported"),
    (dict(step={"step": 0.0}), "step line 2: step 0.0, expected 0"),
    (dict(step={"step": False}), "step line 2: step False, expected 0"),
    (dict(header={"vocab_size": 50}), "vocab_size 50 does not fit the checkpoint's 96"),
    (dict(header={"engine": {"name": "x", "config": {"tp": 2}}}), "header engine: expected an object of names to"),
    (dict(header={"engine": ["x"]}), "header engine: expected an object"),
    (dict(header={"sampling": "greedy"}), "header key 'sampling' is not one of the format's"),
    (dict(step={"tokens": [500, 1, 2, 3, 4, 5, 6]}), "step 0: tokens token 500 is outside the vocabulary"),
    (dict(tensors=_nan_logits), "step 0: logits has non-finite values"),
    (dict(tensors=lambda t: {"logits": t["logits"][:, :10].contiguous()}), "step 0: logits has shape (7, 10)"),
    (dict(tensors=lambda t: {**t, "ssm.0": torch.zeros(3, 3)}), "step 0: ssm.0 has shape (3, 3)"),
    (dict(step={"parents": [-1, 0, 0, 1, 1, 9, 3]}), "step 0:"),
    (dict(step={"accepted": [0, 2, 3]}), "step 0: accepted [0, 2, 3] is not a root path"),
    (dict(step={"tensors": "steps/nope.safetensors"}), "tensor file 'steps/nope.safetensors' is missing"),
    (dict(step={"positions": [-1000000] * 7}), "step 0: position -1000000 is outside [0, "),
    (dict(step={"positions": [2**70] * 7}), f"step 0: position {2**70} is outside [0, "),
    (dict(step={"positions": [256] * 7}), "step 0: position 256 is outside [0, 256) (the checkpoint's max positions)"),
])
def test_bad_dumps_get_one_line_and_exit_2(tmp_path, ckpt, dumps, edit, needle):
    from ddsim.engines import replay
    from ddsim.errors import InputError
    bad = _edit(dumps[None], tmp_path / "bad", **edit)
    one_line_error(run_cli("replay", "--model", ckpt, "--dump", bad, "--out", tmp_path / "r"), needle)
    assert not (tmp_path / "r").exists()
    with pytest.raises(InputError) as e:  # in process too, where mutation testing's mutants reach the checks
        replay.prepare(ckpt, bad)
    assert needle in str(e.value)


@pytest.fixture(scope="module")
def topk_dumps(ckpt, tmp_path_factory):
    """The same engines dumping each node's 4 most likely tokens (logits "topk") in place of full logits."""
    model = load_model(ckpt)
    root = tmp_path_factory.mktemp("topk")
    for bug in EXPECTED:
        write_dump(root / str(bug), model, bug=bug, topk=4)
    return {bug: root / str(bug) for bug in EXPECTED}


@pytest.mark.parametrize("bug", list(EXPECTED))
def test_a_top_k_dump_names_each_planted_bug(ckpt, topk_dumps, bug):
    """A top-k dump is judged by its log-probability errors, held to sqrt(2 KL) of the noise: the same diagnosis
    of every step as the full logits give."""
    from ddsim.engines import replay
    rep = replay.run(ckpt, topk_dumps[bug])
    assert [s["diagnosis"] for s in rep["steps"]] == EXPECTED[bug]
    s = rep["summary"]
    assert rep["provenance"]["logits"] == "topk" and s["kl_max"] is None
    assert all(n["kl"] is None for st in rep["steps"] for n in st["nodes"])
    if bug is None:
        assert s["silent_corruption_steps"] == 0 and s["top1_disagreements"] == 0 and s["logprob_err_max"] < 1e-5
    if bug in ("leak", "bonus"):
        assert s["silent_corruption_steps"] > 0 and s["rounding_divergence_steps"] == 0


@pytest.mark.parametrize("logits, bug", [("full", "leak"), ("topk", "drift")])
def test_the_html_report_says_what_the_json_says(ckpt, dumps, topk_dumps, logits, bug):
    """report.html, cell by cell against report.json: per step its worst node (KL, or the log-probability error of a
    top-k dump), top-1 agreements, both accepted paths, silent corruption, diagnosis and evidence; the engine, the
    checkpoint's digest, the summary's counts and the diagnoses that occur."""
    import html
    import re

    from ddsim.engines import replay
    rep = replay.run(ckpt, (dumps if logits == "full" else topk_dumps)[bug])
    page = replay.render_html(rep)
    s, full = rep["summary"], logits == "full"
    assert f"<h1>ddsim replay: emulated-{bug}</h1>" in page
    assert f"(sha256 {rep['provenance']['weights_sha256'][:16]}…)" in page
    assert (f"{s['steps']} steps of {s['requests']} requests, {s['nodes']} nodes; silent corruption in "
            f"<b>{s['silent_corruption_steps']}</b> steps (and 0 where") in page
    occur = {"leak": "sibling leak: 8", "drift": "within noise: 2, state drift: 6"}[bug]
    assert f"; diagnoses: {occur}; top-1 disagreements {s['top1_disagreements']} (" in page
    assert re.findall(r"<th>(.*?)</th>", page) == [
        "step", "request", "nodes", "max KL" if full else "max log-prob error", "top-1 agree", "engine accepted",
        "exact accepts", "silent corruption", "diagnosis", "evidence"]
    assert f"{logits} logits" in page
    rows = page.split("</th></tr>")[1].split("</table>")[0].split("<tr>")[1:]
    assert len(rows) == len(rep["steps"]) == 8
    for row, st in zip(rows, rep["steps"]):
        worst = max(n["kl"] if full else n["logprob_err"] for n in st["nodes"])
        assert re.findall(r"<td>(.*?)</td>", row) == [
            str(st["step"]), st["request"], str(len(st["nodes"])), f"{worst:.3g}",
            f"{sum(n['top1_agrees'] for n in st['nodes'])}/{len(st['nodes'])}", str(st["engine_accepted"]),
            str(st["exact_accepted"]), "<b>yes</b>" if st["silent_corruption"] else "no", st["diagnosis"],
            html.escape(st["evidence"])]


def _replaced(t, **kw):
    """A step's tensors with some replaced."""
    return {**t, **kw}


def _rising(t):
    lp = t["topk_logprobs"].clone()
    lp[2] = lp[2].flip(0)
    return _replaced(t, topk_logprobs=lp)


def _twice(t):
    ids = t["topk_ids"].clone()
    ids[1, 3] = ids[1, 0]
    return _replaced(t, topk_ids=ids)


@pytest.mark.parametrize("edit, needle", [
    (_twice, "step 0: node 1's topk_ids name a token twice"),
    (_rising, "step 0: node 2's topk_logprobs rise along the row (most likely first expected)"),
    # raw logits in place of log-probabilities: a probability mass past 1
    (lambda t: _replaced(t, topk_logprobs=t["topk_logprobs"] + 3.0), "step 0: node 0's topk_logprobs hold a probability of"),
    (lambda t: _replaced(t, topk_ids=t["topk_ids"].double()), "step 0: topk_ids are torch.float64, expected integers"),
    (lambda t: _replaced(t, topk_logprobs=t["topk_logprobs"].long()), "step 0: topk_logprobs are torch.int64"),
])
def test_an_inconsistent_top_k_dump_gets_one_line_and_exit_2(tmp_path, ckpt, topk_dumps, edit, needle):
    """The first of a top-k row is read as the engine's argmax: a row that is not its k most likely tokens, most
    likely first, as log-probabilities, is refused before any replay."""
    bad = _edit(topk_dumps[None], tmp_path / "bad", tensors=edit)
    one_line_error(run_cli("replay", "--model", ckpt, "--dump", bad, "--out", tmp_path / "r"), needle)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("topk, needle", [(True, "header topk True: expected an integer in 1..96"),
                                           (4.0, "header topk 4.0: expected an integer in 1..96")])
def test_a_top_k_header_of_another_kind_is_refused(tmp_path, ckpt, topk_dumps, topk, needle):
    """A top-k dump's k must be a JSON integer: true was read as k = 1 (Python's True == 1)."""
    from ddsim.engines import replay
    from ddsim.errors import InputError
    bad = _edit(topk_dumps[None], tmp_path / "bad", header={"topk": topk})
    with pytest.raises(InputError, match=re.escape(needle)):
        replay.prepare(ckpt, bad)


def test_integer_logits_get_one_line_and_exit_2(tmp_path, ckpt, dumps):
    bad = _edit(dumps[None], tmp_path / "bad", tensors=lambda t: {"logits": t["logits"].round().long()})
    one_line_error(run_cli("replay", "--model", ckpt, "--dump", bad, "--out", tmp_path / "r"),
                   "step 0: logits are torch.int64, expected floating point")


# a prompt on which the tiny checkpoint's bf16 engine turns one near-tie in 5 steps, greedy and sampled
NEAR_TIE_PROMPT = (21, 34, 47, 60, 73)


@pytest.fixture(scope="module")
def bf16_dumps(ckpt, tmp_path_factory):
    """The clean engine computing in bfloat16 (the checkpoint's weights rounded, every product in bf16), greedy
    and with SGLang's rule at temperature 0.7: its logits are within bf16's noise of the oracle's and it follows
    its rule on them, but its rounding turns a near-tie."""
    from ddsim.model.checkpoint import load_checkpoint
    from ddsim.model.model import HybridModel
    cfg, weights, _ = load_checkpoint(ckpt)
    model = HybridModel(cfg, weights, dtype=torch.bfloat16)
    root = tmp_path_factory.mktemp("bf16")
    write_dump(root / "greedy", model, prompts=(NEAR_TIE_PROMPT,), steps=5, compute_dtype="bfloat16")
    write_dump(root / "sampled", model, prompts=(NEAR_TIE_PROMPT,), steps=5, compute_dtype="bfloat16",
               sampler={"rule": "sglang", "temperature": 0.7, "params": {}})
    return {"greedy": root / "greedy", "sampled": root / "sampled"}


@pytest.mark.parametrize("rule", ["greedy", "sampled"])
def test_a_near_tie_a_bf16_engines_rounding_turns_is_not_silent_corruption(tmp_path, ckpt, bf16_dumps, rule):
    """A right bf16 engine emits other than exact verification where its rounding turns a near-tie: at its
    tolerance that is a rounding divergence, counted apart, and the gate holds; judged as a float32 engine its
    logits are beyond the noise and the gate fails. (A sampled step there once failed the report's own check.)
    The sampled engine's turned step is within float32's noise too: a random number that close to a boundary."""
    from ddsim.engines import replay
    rep = replay.run(ckpt, bf16_dumps[rule], tolerance=replay.default_tolerance(engine_dtype="bfloat16"))
    s = rep["summary"]
    assert s["rounding_divergence_steps"] == 1 and s["silent_corruption_steps"] == 0 and s["diagnosed_steps"] == 0
    assert s["top1_disagreements_above_noise"] == 0 and s["bonus_error_steps"] == 0
    step = next(st for st in rep["steps"] if st["rounding_divergence"])
    assert step["engine_emitted"] != step["exact_emitted"] and not step["silent_corruption"]
    assert replay.render_html(rep).count("<td>rounding</td>") == 1  # report.html marks it apart
    assert step["evidence"].startswith("max discrepancy "), step["evidence"]  # within noise, then the divergence
    # the evidence names where the walk left exact verification's, and the oracle's lead there
    i = next(j for j, (a, b) in enumerate(zip(step["engine_emitted"], step["exact_emitted"])) if a != b)
    at = step["exact_accepted"][i]
    assert step["evidence"].endswith(
        f"; a rounding divergence: token {step['engine_emitted'][i]} where exact verification emits "
        f"{step['exact_emitted'][i]}, decided at node {at}, " + (
            f"whose oracle top-1 lead is {step['nodes'][at]['oracle_margin']:.3g}" if rule == "greedy" else
            "by a random number the engine's rounding put on the other side of a decision boundary")), step["evidence"]
    if rule == "greedy":  # a near-tie: the lead is below bf16's spacing of these logits
        assert step["nodes"][at]["oracle_margin"] < 0.01
    if rule == "greedy":
        assert s["top1_disagreements"] >= 1  # the turned argmax itself, within the noise
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", bf16_dumps[rule], "--model", ckpt,
                "--engine-dtype", "bfloat16", "--json", tmp_path / "g.json")
    assert g.returncode == 0, g.stdout + g.stderr
    note = ("note: 1 steps emitted other tokens than exact verification where the engine's rounding turned a near-tie "
            "(every node within the noise, the engine following its own rule); not counted as silent corruption")
    assert note in g.stdout.splitlines() and g.stdout.splitlines()[-1].endswith("all 7 rules hold"), g.stdout
    gated = json.loads((tmp_path / "g.json").read_text())
    assert note[len("note: "):] in gated["notes"]
    from ddsim.model.checkpoint import checkpoint_digest
    assert gated["audited"]["weights_sha256"] == checkpoint_digest(ckpt)  # the replay gated, by content
    assert gated["audited"]["dump"] == str(bf16_dumps[rule])
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", bf16_dumps[rule], "--model", ckpt)
    assert g.returncode == 1 and "VIOLATED diagnosed_steps" in g.stdout, g.stdout
    if rule == "greedy":  # its turned step beyond float32's noise: the divergence is corruption again
        assert "VIOLATED silent_corruption_steps: measured 1" in g.stdout, g.stdout
    r = run_cli("replay", "--model", ckpt, "--dump", bf16_dumps[rule], "--engine-dtype", "bfloat16",
                "--out", tmp_path / "r")
    assert r.returncode == 0 and "silent corruption in 0 steps (and 1 steps where the engine's rounding turned a " \
        "near-tie)" in r.stdout, r.stdout
    replayed = json.loads((tmp_path / "r" / "report.json").read_text())["provenance"]
    assert gated["audited"]["dump_sha256"] == replayed["dump_sha256"]  # the gate's verdict names the dump replayed


def test_a_divergence_off_the_engines_own_rule_stays_silent_corruption(tmp_path, ckpt, bf16_dumps):
    """The bf16 engine's rounding step with its bonus replaced by another token: its logits are still within the
    noise, but it no longer emits its own argmax, so the step is silent corruption (and a bonus error)."""
    from ddsim.engines import replay
    tol = replay.default_tolerance(engine_dtype="bfloat16")
    step = next(st for st in replay.run(ckpt, bf16_dumps["greedy"], tolerance=tol)["steps"] if st["rounding_divergence"])
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(bf16_dumps["greedy"], bad)
    lines = (bad / "index.jsonl").read_text().splitlines()
    rec = json.loads(lines[1 + step["step"]])
    rec["emitted"][-1] = (rec["emitted"][-1] + 1) % 96
    lines[1 + step["step"]] = json.dumps(rec)
    (bad / "index.jsonl").write_text("\n".join(lines[:2 + step["step"]] + [json.dumps({"end": True, "steps": step["step"] + 1})]) + "\n")
    s = replay.run(ckpt, bad, tolerance=tol)["summary"]
    assert s["silent_corruption_steps"] == 1 and s["rounding_divergence_steps"] == 0 and s["bonus_error_steps"] == 1


def test_the_tolerance_is_the_policys_and_a_dump_can_only_tighten_it(tmp_path, ckpt, dumps):
    """A dump declaring bf16 is judged at float32's KL unless the command line names a bf16 engine; a
    float32 dump stays at float32's even then. The verdict line prints the tolerance applied."""
    from ddsim.engines import replay
    bf16 = _edit(dumps["leak"], tmp_path / "bf16", header={"compute_dtype": "bfloat16"})
    assert replay.run(ckpt, bf16)["noise_kl"] == 1e-6
    assert replay.run(ckpt, bf16, tolerance=replay.default_tolerance(engine_dtype="bfloat16"))["noise_kl"] == 5e-2
    assert replay.run(ckpt, dumps[None], tolerance=replay.default_tolerance(engine_dtype="bfloat16"))["noise_kl"] == 1e-6
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", bf16, "--model", ckpt)
    assert g.returncode == 1 and "logits within KL 1e-06 of the oracle's count as exact" in g.stdout, g.stdout
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps[None], "--model", ckpt, "--engine-dtype", "bfloat16")
    assert g.returncode == 0 and "KL 1e-06" in g.stdout and "bfloat16 engine, tightened by the dump" in g.stdout, g.stdout


def test_replay_noise_kl_on_the_command_line_sets_the_tolerance_a_dump_can_only_tighten(tmp_path, ckpt, dumps):
    """replay --noise-kl X judges at KL X where the dump's declared dtype allows it (a bf16 dump: up to 5e-2), at
    the dump's bound where X is looser; a value that is not a finite number >= 0 is one line, before any work."""
    bf16 = _edit(dumps["leak"], tmp_path / "bf16", header={"compute_dtype": "bfloat16"})
    for given, applied in (("1e-3", 1e-3), ("0", 0.0), ("0.5", 5e-2)):
        out = tmp_path / f"r{given}"
        r = run_cli("replay", "--model", ckpt, "--dump", bf16, "--noise-kl", given, "--out", out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads((out / "report.json").read_text())["noise_kl"] == applied
        assert f"KL {applied:.3g}" in r.stdout, r.stdout
    for bad in ("nan", "-1", "inf"):
        out = tmp_path / f"bad{bad}"
        one_line_error(run_cli("replay", "--model", ckpt, "--dump", bf16, "--noise-kl", bad, "--out", out),
                       "--noise-kl: expected a finite value >= 0, got")
        assert not out.exists()


def test_the_writer_refuses_to_overwrite_and_a_crash_leaves_a_truncated_dump(tmp_path, ckpt):
    from ddsim.engines.dump import VerifyDumpWriter, load_dump
    with pytest.raises(FileExistsError):
        VerifyDumpWriter(tmp_path, vocab_size=96)
    with pytest.raises(ValueError, match="engine: expected a flat dict"):
        VerifyDumpWriter(tmp_path / "nested", vocab_size=96, engine={"name": "x", "config": {"tp": 2}})
    assert not (tmp_path / "nested").exists()
    with pytest.raises(RuntimeError):
        with VerifyDumpWriter(tmp_path / "d", vocab_size=96) as w:
            w.write_step(request="r", context=[1], parents=[-1], tokens=[2], positions=[1], accepted=[0], emitted=[3],
                         logits=torch.zeros(1, 96))
            raise RuntimeError("the engine crashed")
    from ddsim.errors import InputError
    with pytest.raises(InputError, match="truncated"):
        load_dump(tmp_path / "d", vocab_size=96)


def _good_step(**edit) -> dict:
    """A valid three-node step of a 96-token vocabulary (the chain 0 -> 1 -> 2, nodes 0 and 1 accepted), edited."""
    step = dict(request="r", context=[1, 2], parents=[-1, 0, 1], tokens=[5, 6, 7], positions=[2, 3, 4],
                accepted=[0, 1], emitted=[6, 9], logits=torch.zeros(3, 96))
    return {**step, **edit}


def _topk_rows(ids=((5, 6), (6, 7), (7, 8)), lp=((-0.1, -2.5),) * 3):
    return torch.tensor(ids), torch.tensor(lp)


@pytest.mark.parametrize("kind, edit, needle", [
    ("full", dict(logits=torch.zeros(3, 96, dtype=torch.int64)), "logits are torch.int64, expected floating point"),
    ("full", dict(logits=torch.full((3, 96), float("nan"))), "logits has non-finite values"),
    ("full", dict(logits=torch.zeros(3, 95)), "logits has shape (3, 95), expected (3, 96)"),
    ("full", dict(logits=None), "a full-logits dump takes logits= and no topk="),
    ("full", dict(accepted=[0, 2]), "accepted [0, 2] is not a root path of the tree"),
    ("full", dict(emitted=[7, 9]), "emitted [7, 9] is not the accepted nodes' tokens after the root plus the bonus"),
    ("full", dict(tokens=[5, 6, 96]), "tokens token 96 is outside the vocabulary (0..95)"),
    ("full", dict(context=[1, 2.5]), "context must be integers"),
    ("full", dict(positions=[2, 3, float("nan")]), "positions must be integers"),
    ("full", dict(accepted=[0, True]), "accepted must be integers"),
    ("full", dict(parents=[-1, 0, 3]), "node 2: parent 3 is not an earlier node"),
    ("full", dict(positions=[2, 3]), "parents, tokens and positions must be one per node (got 3, 3, 2)"),
    ("full", dict(states={"ssm": torch.zeros(2, 2)}), "state 'ssm': expected 'ssm.L' or 'conv.L'"),
    ("full", dict(states={"ssm.0": torch.full((2, 2), float("inf"))}), "ssm.0 has non-finite values"),
    ("topk", dict(logits=None, topk=_topk_rows(ids=((5.0, 6.0),) * 3)), "topk_ids are torch.float32, expected integers"),
    ("topk", dict(logits=None, topk=_topk_rows(ids=((5, 5), (6, 7), (7, 8)))), "node 0's topk_ids name a token twice"),
    ("topk", dict(logits=None, topk=_topk_rows(lp=((-0.1, -2.5), (-2.5, -0.1), (-0.1, -2.5)))),
     "node 1's topk_logprobs rise along the row"),
    ("topk", dict(logits=None, topk=_topk_rows(lp=((-0.1, -0.2),) * 3)), "node 0's topk_logprobs hold a probability of"),
    ("topk", dict(logits=None, topk=_topk_rows(ids=((5, 96), (6, 7), (7, 8)))), "topk_ids outside the vocabulary"),
    ("topk", dict(logits=None, topk=_topk_rows(lp=((0, -1),) * 3)), "topk_logprobs are torch.int64, expected floating"),
    ("sampled", dict(randoms={"coins": torch.rand(3), "final": torch.tensor([1.0])}),
     "random.final has numbers outside [0, 1)"),
    ("sampled", dict(randoms={"coins": torch.rand(2), "final": torch.tensor([0.5])}),
     "random.coins has shape (2,), expected (3,)"),
    ("sampled", dict(randoms=None), "tensor 'random.coins' is missing"),
])
def test_the_writer_refuses_a_step_the_reader_would_and_writes_nothing(tmp_path, kind, edit, needle):
    """A step the reader would refuse is a ValueError at write_step, naming the step and the problem, before
    anything is written: the engine finds its own fault where it made it, not at replay, and the dump it goes on
    writing stays readable."""
    from ddsim.engines.dump import VerifyDumpWriter, load_dump
    header = {"full": {}, "topk": dict(logits="topk", topk=2),
              "sampled": dict(acceptance={"rule": "sglang", "temperature": 1.0, "params": {}})}[kind]
    good = _good_step() if kind == "full" else _good_step(logits=None, topk=_topk_rows()) if kind == "topk" else \
        _good_step(randoms={"coins": torch.rand(3), "final": torch.tensor([0.5])})
    with VerifyDumpWriter(tmp_path / "d", vocab_size=96, **header) as w:
        w.write_step(**good)
        lines = (tmp_path / "d" / "index.jsonl").read_text()
        with pytest.raises(ValueError) as e:
            w.write_step(**{**good, **edit})
        assert str(e.value).startswith("write_step: step 1: ") and needle in str(e.value), str(e.value)
        assert (tmp_path / "d" / "index.jsonl").read_text() == lines
        assert sorted(f.name for f in (tmp_path / "d" / "steps").iterdir()) == ["000000.safetensors"]
        w.write_step(**good)
    assert len(load_dump(tmp_path / "d", vocab_size=96).steps) == 2


def test_the_writer_takes_numpy_and_tensor_integers(tmp_path):
    """What an engine has at hand: a vocabulary size from numpy, token lists as tensors, positions as float-typed
    whole numbers; written as the format's integers."""
    import numpy as np

    from ddsim.engines.dump import VerifyDumpWriter, load_dump
    with VerifyDumpWriter(tmp_path / "d", vocab_size=np.int64(96), logits="topk", topk=np.int32(2)) as w:
        w.write_step(**_good_step(logits=None, topk=_topk_rows(), context=torch.tensor([1, 2]),
                                  positions=torch.tensor([2.0, 3.0, 4.0]), accepted=np.array([0, 1])))
    d = load_dump(tmp_path / "d", vocab_size=96)
    assert d.header["vocab_size"] == 96 and d.header["topk"] == 2
    assert d.steps[0].context == [1, 2] and d.steps[0].positions == [2, 3, 4] and d.steps[0].accepted == [0, 1]


@pytest.mark.parametrize("kw, needle", [
    (dict(vocab_size=1), "vocab_size 1: expected an integer >= 2"),
    (dict(vocab_size=96, logits="topk", topk=0), "topk 0: expected an integer in 1..96"),
    (dict(vocab_size=96, logits="topk", topk=97), "topk 97: expected an integer in 1..96"),
    (dict(vocab_size=96, acceptance={"rule": "nope", "temperature": 1.0, "params": {}}),
     "acceptance rule 'nope': expected one of"),
    (dict(vocab_size=96, acceptance={"rule": "sglang", "temperature": 0.0, "params": {}}),
     "acceptance temperature 0.0: expected a finite number > 0"),
    (dict(vocab_size=96, acceptance={"rule": "sglang", "temperature": 1.0, "params": {"x": 1}}),
     "params x=1: not a parameter of sglang"),
])
def test_the_writer_refuses_a_header_the_reader_would(tmp_path, kw, needle):
    from ddsim.engines.dump import VerifyDumpWriter
    with pytest.raises(ValueError) as e:
        VerifyDumpWriter(tmp_path / "d", **kw)
    assert needle in str(e.value), str(e.value)
    assert not (tmp_path / "d").exists()


def test_the_replay_report_is_typed_and_checked(tmp_path, ckpt, dumps):
    """report.json validates against the generated schema, and a tampered summary or step is refused."""
    import jsonschema
    from pydantic import ValidationError

    from ddsim.engines.replay_report import ReplayReport
    from ddsim.reports import json_report
    assert json.loads(json_report.REPLAY_SCHEMA_PATH.read_text()) == json_report.replay_schema()
    r = run_cli("replay", "--model", ckpt, "--dump", dumps["leak"], "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    jsonschema.validate(data, json_report.replay_schema())
    ReplayReport.model_validate_json(json.dumps(data))
    for tamper, needle in ((lambda d: d["summary"].update(silent_corruption_steps=0), "silent_corruption_steps"),
                           (lambda d: next(s for s in d["steps"] if s["silent_corruption"]).update(
                               silent_corruption=False), "silent_corruption disagrees"),
                           (lambda d: d["steps"][0].update(diagnosis="fine"), "diagnosis"),
                           # a silent step called the engine's rounding: the summary no longer adds up, and the
                           # step's nodes are beyond the noise
                           (lambda d: next(s for s in d["steps"] if s["silent_corruption"]).update(
                               silent_corruption=False, rounding_divergence=True), "silent_corruption_steps is"),
                           (lambda d: [next(s for s in d["steps"] if s["silent_corruption"]).update(
                               silent_corruption=False, rounding_divergence=True),
                               d["summary"].update(silent_corruption_steps=d["summary"]["silent_corruption_steps"] - 1,
                                                   rounding_divergence_steps=1)], "a rounding divergence with logits"),
                           (lambda d: d["steps"][0].update(rounding_divergence=True), "a rounding divergence where"),
                           (lambda d: d.update(extra=1), "extra")):
        bad = json.loads(json.dumps(data))
        tamper(bad)
        with pytest.raises(ValidationError, match=needle):
            ReplayReport.model_validate_json(json.dumps(bad))


MAMBA_EXPECTED = {
    None: ["within noise"] * 8,
    "leak": ["sibling leak"] * 8,
    "stale": ["within noise"] * 2 + ["stale state"] + ["within noise"] * 3 + ["stale state", "within noise"],
    "leak-conv": ["sibling leak"] * 8,
    "commit-state": (["within noise"] + ["state commit error"] * 3) * 2,
    # the tiny Mamba2 state forgets step 1's wrong commit within a step: step 3 is within noise again
    "commit-once": ["within noise", "within noise", "state commit error", "within noise"] * 2,
}


@pytest.fixture(scope="module")
def mamba_ckpt(tmp_path_factory):
    from tests.test_checkpoints_mamba import _hf_model
    d = tmp_path_factory.mktemp("replay") / "nemotron_h"
    _hf_model("nemotron_h").save_pretrained(d)
    return d


@pytest.mark.parametrize("bug", list(MAMBA_EXPECTED))
def test_replay_of_a_mamba2_hybrid_names_each_planted_bug(tmp_path, mamba_ckpt, bug):
    """The same replay on a Nemotron-H checkpoint (Mamba2 SSM states and conv windows dumped and
    recomputed like GDN's): clean, the sibling leak, a stale committed state, the conv window's leak alone, a state
    committed from the wrong node every step and once."""
    model = load_model(mamba_ckpt)
    write_dump(tmp_path / "dump", model, bug=bug, dump_states=bug == "stale")
    r = run_cli("replay", "--model", mamba_ckpt, "--dump", tmp_path / "dump", "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [s["diagnosis"] for s in rep["steps"]] == MAMBA_EXPECTED[bug]


@pytest.mark.parametrize("which, when, needle", [
    ("index.jsonl", "after", "index.jsonl: changed since it was read"),
    ("tensors", "after", ".safetensors: changed since it was read"),
    ("tensors", "during", ".safetensors: changed while it was read"),
])
def test_a_dump_file_written_after_or_while_it_was_read_is_refused(tmp_path, ckpt, dumps, monkeypatch, which, when,
                                                                   needle):
    """A copy of a dump, one file of it written again (its own bytes) once the dump was read, before its digest, or
    while safetensors read it: the replay's dump_sha256 would not be of what it replayed; one line naming the file."""
    import shutil

    import safetensors.torch

    from ddsim.engines import dump as dump_mod
    from ddsim.engines import replay
    from ddsim.errors import InputError
    d = tmp_path / "d"
    shutil.copytree(dumps[None], d)
    set_back(d)
    target = d / "index.jsonl" if which == "index.jsonl" else sorted((d / "steps").glob("*.safetensors"))[0]
    rewrite = lambda: target.write_bytes(target.read_bytes())  # noqa: E731
    if when == "after":
        real = dump_mod.load_dump
        monkeypatch.setattr(dump_mod, "load_dump", lambda *a, **kw: (real(*a, **kw), rewrite())[0])
    else:
        real_load = safetensors.torch.load_file
        monkeypatch.setattr(safetensors.torch, "load_file",
                            lambda f, *a, **kw: (real_load(f, *a, **kw), Path(f) == target and rewrite())[0])
    with pytest.raises(InputError, match=re.escape(needle)):
        replay.prepare(ckpt, d)
    monkeypatch.undo()
    assert replay.prepare(ckpt, d)[3]["dump"] == str(d)  # (nothing written since: read as before)


def test_an_index_that_is_not_utf8_is_one_line(tmp_path, ckpt, dumps):
    import shutil

    from ddsim.engines import replay
    from ddsim.errors import InputError
    d = tmp_path / "d"
    shutil.copytree(dumps[None], d)
    (d / "index.jsonl").write_bytes(b"\xff" + (d / "index.jsonl").read_bytes())
    with pytest.raises(InputError, match=r"--dump .*: index\.jsonl is unreadable \('utf-8' codec can't decode byte 0xff"):
        replay.prepare(ckpt, d)
