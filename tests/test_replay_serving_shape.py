"""`ddsim replay` at a serving shape: DDTree trees of 65 nodes (budget 64, top-k cap 8, 8 deep) over Qwen's
151936-token vocabulary, drafted from noised target logits so accepted paths run 1-5 nodes deep and leave batch
order, on a tiny Qwen3.5 checkpoint with that vocabulary (tests/emulated_engine.py). The replay must pass the clean
engine and name each planted bug step by step, as it does on the 7-node trees of tests/test_replay.py."""
import json

import pytest

from tests.cli_runs import run_cli
from tests.emulated_engine import load_model, write_dump

pytestmark = pytest.mark.slow

# per bug: the diagnosis of each of the 4 steps of one request
EXPECTED = {
    None: ["within noise"] * 4,
    "leak": ["sibling leak"] * 4,
    "causal": ["mask error"] * 4,
    "mask": ["mask error"] * 4,
    "positions": ["position error"] * 4,
    "stale": ["within noise", "within noise", "stale state", "within noise"],
    "commit-state": ["within noise"] + ["state commit error"] * 3,
    "commit-kv": ["within noise"] + ["state commit error"] * 3,
    "commit-norollback": ["within noise"] + ["state commit error"] * 3,
    "commit-once": ["within noise", "within noise", "state commit error", "state commit error"],
    "commit-node": ["within noise"] + ["state commit error"] * 3,  # found by the search over 65 nodes, then carried
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.test_checkpoints import _hf_model
    root = tmp_path_factory.mktemp("serving")
    _hf_model("qwen3_5", vocab_size=151936, max_position_embeddings=512).save_pretrained(root / "ckpt")
    return root / "ckpt", load_model(root / "ckpt")


@pytest.mark.parametrize("bug", list(EXPECTED))
def test_replay_at_a_serving_shape_names_each_planted_bug(tmp_path, served, bug):
    from ddsim.engines import replay
    ckpt, model = served
    write_dump(tmp_path / "dump", model, bug=bug, prompts=((3, 1, 4, 1, 5),), steps=4, depth=8, ddtree=(64, 8))
    rep = replay.run(ckpt, tmp_path / "dump")
    steps = rep["steps"]
    assert [len(s["nodes"]) for s in steps] == [65] * 4
    assert [s["diagnosis"] for s in steps] == EXPECTED[bug], [s["evidence"] for s in steps]
    if bug is None:  # exact: every node within fp32 noise, and the engine emits what exact verification does
        assert rep["summary"]["kl_max"] < 1e-9 and rep["summary"]["silent_corruption_steps"] == 0
        assert all(s["engine_emitted"] == s["exact_emitted"] for s in steps)
        # the accepted paths leave batch order and go deep: what the commit hypotheses and the walk must handle
        assert any(s["engine_accepted"] != list(range(len(s["engine_accepted"]))) for s in steps)
        assert max(len(s["engine_accepted"]) for s in steps) >= 4
        g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", tmp_path / "dump", "--model", ckpt)
        assert g.returncode == 0, g.stdout + g.stderr
    if bug == "leak":  # at this size the leak changes what is accepted: silent corruption, and the gate fails
        assert rep["summary"]["silent_corruption_steps"] > 0
        assert all(n["kl"] < 1e-9 for s in steps for n in s["nodes"] if n["order_exact"])
    if bug in ("commit-state", "commit-kv", "commit-norollback"):  # named as the rule that every step ran
        assert all(s["evidence"].startswith("every step committed by " + {
            "commit-state": "the accepted path's length read as a batch index", "commit-kv": "the KV rows in batch order",
            "commit-norollback": "the KV never rolled back"}[bug]) for s in steps[2:]), [s["evidence"] for s in steps]
    if bug == "commit-node":  # node 64 among 65, found by the search, then followed step by step
        assert steps[1]["evidence"].startswith("step 0 committed the recurrent state and conv window of node 64 in "
                                               "place of node "), steps[1]["evidence"]
        assert all("(a node no rule names, found by search): reproduces" in s["evidence"] for s in steps[1:])
        assert all(", carried on, and step" in s["evidence"] for s in steps[2:]), [s["evidence"] for s in steps]
    assert json.loads(json.dumps(rep)) == rep  # the report as written


@pytest.mark.parametrize("bug", [None, "dump-stale"])
def test_a_dumped_committed_state_at_a_serving_shape(tmp_path, served, bug):
    """The engine's committed recurrent state and conv window in the dump, at the same shape: a clean engine's are
    within fp32 noise of the oracle's at every step. An engine whose dump at step 2 holds the previous step's state
    while its verify reads the right one has logits within noise there, and the step is still stale state: the
    gate refuses the dump."""
    from ddsim.engines import replay
    ckpt, model = served
    write_dump(tmp_path / "dump", model, bug=bug, dump_states=True, prompts=((3, 1, 4, 1, 5),), steps=4, depth=8,
               ddtree=(64, 8))
    rep = replay.run(ckpt, tmp_path / "dump")
    steps = rep["steps"]
    rel = [s["state_rel_max"] for s in steps]
    assert [len(s["nodes"]) for s in steps] == [65] * 4 and None not in rel
    assert max(n["kl"] for s in steps for n in s["nodes"]) < 1e-9  # the logits within noise, the planted step too
    if bug is None:
        assert max(rel) < 1e-5 and [s["diagnosis"] for s in steps] == ["within noise"] * 4
        return
    assert [s["diagnosis"] for s in steps] == ["within noise", "within noise", "stale state", "within noise"]
    assert max(rel[:2] + rel[3:]) < 1e-5 and rel[2] > 1e-2, rel
    assert steps[2]["evidence"].startswith("the dumped committed state "), steps[2]["evidence"]
    assert "though the step's logits are within noise" in steps[2]["evidence"], steps[2]["evidence"]
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--dump", tmp_path / "dump", "--model", ckpt)
    assert g.returncode == 1, g.stdout + g.stderr
    assert [l.split(":")[0] for l in g.stdout.splitlines() if l.startswith("VIOLATED")] == \
        ["VIOLATED diagnosed_steps"], g.stdout
