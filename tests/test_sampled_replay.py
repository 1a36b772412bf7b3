"""`ddsim replay` of sampled dumps: the engine (tests/emulated_engine.py) accepts with SGLang's target-only rule
at temperature 0.9 (0.02 for the leak) and dumps the random numbers it drew; the replay recomputes the rule on the oracle's
distributions with those numbers. A clean engine passes; the flattened recurrence is a sibling leak that
emits what the rule on exact distributions would not; an engine that accepts by another rule than it declares,
or dumps other numbers than it drew, is named step by step, and so is one that commits the wrong node's state."""
import json

import pytest
import torch

from tests.cli_runs import one_line_error, run_cli
from tests.emulated_engine import load_model, write_dump

SAMPLER = {"rule": "sglang", "temperature": 0.9, "params": {"threshold_single": 1.0, "threshold_acc": 1.0}}


@pytest.fixture(scope="module")
def dumps(ckpt, tmp_path_factory):
    model = load_model(ckpt)
    root = tmp_path_factory.mktemp("sdumps")
    out = {}
    for bug in (None, "leak", "rule", "coins", "commit-state"):
        # the leak and the wrong commit at a temperature where this random model accepts deep enough for them to matter
        sampler = {**SAMPLER, "temperature": 0.02} if bug in ("leak", "commit-state") else SAMPLER
        write_dump(root / str(bug), model, bug=bug, sampler=sampler, steps=6)
        out[bug] = root / str(bug)
    return out


def _replay(ckpt, dump):
    """The replay's report, in process (where mutation testing's mutants reach it)."""
    from ddsim.engines import replay
    return replay.run(ckpt, dump)


def test_a_clean_sampled_engine_passes_replay_and_the_gate(tmp_path, ckpt, dumps):
    r = run_cli("replay", "--model", ckpt, "--dump", dumps[None], "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [st["diagnosis"] for st in rep["steps"]] == [st["diagnosis"] for st in _replay(ckpt, dumps[None])["steps"]]
    assert rep["provenance"]["acceptance"] == SAMPLER
    s = rep["summary"]
    assert s["steps"] == 12 and s["silent_corruption_steps"] == 0 and s["diagnosed_steps"] == 0
    assert s["bonus_error_steps"] == 0 and s["commit_error_steps"] == 0
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps[None], "--model", ckpt)
    assert g.returncode == 0, g.stdout + g.stderr


def test_the_sampled_leak_is_diagnosed_and_corrupts_the_output(ckpt, dumps):
    rep = _replay(ckpt, dumps["leak"])
    assert {st["diagnosis"] for st in rep["steps"]} == {"sibling leak"}
    assert rep["summary"]["silent_corruption_steps"] >= 1  # the rule on the leaked distributions emitted otherwise
    assert run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps["leak"], "--model", ckpt).returncode == 1


def test_a_sampled_engines_wrong_commit_is_named(ckpt, dumps):
    """The recurrent state committed at the path's length as a batch index, under sampling: each step after one whose
    accepted path left batch order starts from the wrong state, and is named so (the commit hypotheses do not depend
    on the acceptance rule)."""
    rep = _replay(ckpt, dumps["commit-state"])
    diagnoses = [st["diagnosis"] for st in rep["steps"]]
    assert set(diagnoses) == {"within noise", "state commit error"} and diagnoses[0] == diagnoses[6] == "within noise"
    for st in rep["steps"]:  # wrong exactly where an earlier step of the request left batch order
        req = [p for p in rep["steps"] if p["request"] == st["request"] and p["step"] < st["step"]]
        left = any(p["engine_accepted"] != list(range(len(p["engine_accepted"]))) for p in req)
        assert (st["diagnosis"] == "state commit error") == left, (st["step"], st["evidence"])
    assert run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps["commit-state"], "--model", ckpt).returncode == 1


@pytest.mark.parametrize("bug, steps", [("rule", None), ("coins", [1, 7])])
def test_an_engine_off_its_declared_rule_is_named(ckpt, dumps, bug, steps):
    rep = _replay(ckpt, dumps[bug])
    wrong = [st["step"] for st in rep["steps"] if st["diagnosis"] == "bonus error"]
    assert wrong and (steps is None or wrong == steps)
    assert all("its declared rule sglang on its own logits and random numbers emits" in st["evidence"]
               for st in rep["steps"] if st["step"] in wrong)
    assert run_cli("gate", "--policy", "hybrid-unsafe", "--dump", dumps[bug], "--model", ckpt).returncode == 1


def test_the_replay_recomputes_a_step_from_the_dumped_numbers(dumps):
    """The rule recomputed on the engine's own logits with its dumped numbers is what the clean engine emitted,
    step for step (the replay's recomputation is the engine's)."""
    from ddsim.engines.dump import load_dump
    from ddsim.engines.replay_verdict import sampled_walk
    from ddsim.trees.tree import Tree
    d = load_dump(dumps[None])
    for s in d.steps:
        path, emitted = sampled_walk(Tree(s.parents, s.tokens), s.tensors["logits"], SAMPLER, s.tensors)
        assert path == s.accepted and emitted == s.emitted


@pytest.mark.parametrize("edit, needle", [
    (lambda h, t: h.update(acceptance={"rule": "nope", "temperature": 1.0, "params": {}}),
     "header acceptance rule 'nope'"),
    (lambda h, t: h.update(acceptance={"rule": "sglang", "temperature": 0, "params": {}}),
     "header acceptance temperature 0: expected a finite number > 0"),
    (lambda h, t: h.update(acceptance={"rule": "sglang", "temperature": 1.0, "params": {"threshold_acc": 3}}),
     "header acceptance params threshold_acc=3"),
    (lambda h, t: t.pop("random.coins"), "tensor 'random.coins' is missing"),
    (lambda h, t: t.update({"random.final": torch.tensor([1.5], dtype=torch.float64)}),
     "random.final has numbers outside [0, 1)"),
])
def test_a_bad_sampled_dump_is_refused(tmp_path, ckpt, dumps, edit, needle):
    import shutil

    from safetensors.torch import load_file, save_file
    d = tmp_path / "d"
    shutil.copytree(dumps[None], d)
    lines = (d / "index.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    f = d / "steps" / "000000.safetensors"
    tensors = load_file(str(f))
    edit(header, tensors)
    save_file(tensors, str(f))
    (d / "index.jsonl").write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    one_line_error(run_cli("replay", "--model", ckpt, "--dump", d, "--out", tmp_path / "r"), needle)
    assert not (tmp_path / "r").exists()
