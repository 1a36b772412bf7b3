"""The replay's diagnosis of a step, in process (mutation testing's mutants reach it, tests/MUTATION.md): dumps
written here step by step, each with engine logits made by ddsim's own model with one thing wrong, and each named by
the hypothesis that reproduces it, with its evidence. The planted engines of tests/test_replay.py cover the bugs an
engine has; these cover the replay's own branches they leave unexercised: the dumped positions, a shift on a chain
(where one candidate is the tree's own positions), a node's ancestor removed, errors no hypothesis reproduces, a
dumped conv window off, a request whose context starts over, a small error on an unlikely token."""
import pytest
import torch

from ddsim.engines.dump import VerifyDumpWriter
from ddsim.engines.replay_verdict import greedy_walk
from ddsim.trees.tree import chain
from tests.emulated_engine import _continuation, _tree, load_model

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def model(ckpt):
    return load_model(ckpt)


def _replay(ckpt, path, steps):
    """Write ``steps`` (dicts: context, tree, logits [T, V]; optional request, positions, states) as a dump, each
    accepting greedily on its own logits, and replay it in process: the report."""
    from ddsim.engines import replay
    with VerifyDumpWriter(path, vocab_size=96, engine={"name": "crafted"}) as w:
        for st in steps:
            tree, logits, context = st["tree"], st["logits"], st["context"]
            acc = greedy_walk(tree, logits)
            pos = st.get("positions") or [int(p) for p in tree.positions(len(context))]
            w.write_step(request=st.get("request", "r"), context=context, parents=tree.parents, tokens=tree.tokens,
                         positions=pos, logits=logits, accepted=acc,
                         emitted=[tree.tokens[i] for i in acc[1:]] + [int(logits[acc[-1]].argmax())],
                         states=st.get("states"))
    return replay.run(ckpt, path)


def _setup(model, depth=3):
    """The committed state after PROMPT[:-1], and the greedy-plus-sibling tree (1 + 2 depth nodes) on its root."""
    context = PROMPT[:-1]
    state, _ = model.prefill(context)
    return context, state, _tree(model, state, PROMPT[-1], depth)


def _one(rep):
    (step,) = rep["steps"]
    return step["diagnosis"], step["evidence"]


def test_positions_the_engine_dumped_are_tried_first(tmp_path, ckpt, model):
    """An engine that dumps the positions it used, off the tree's at every other node: named by the dumped ones."""
    context, state, tree = _setup(model)
    pos = [int(p) + i % 2 for i, p in enumerate(tree.positions(len(context)))]
    logits = model.verify(state, tree, positions=pos).logits
    rep = _replay(ckpt, tmp_path / "d", [dict(context=context, tree=tree, logits=logits, positions=pos)])
    diagnosis, evidence = _one(rep)
    assert diagnosis == "position error" and evidence.startswith("the dumped positions reproduces"), evidence
    assert not rep["steps"][0]["positions_as_expected"]


def test_a_shift_on_a_chain_is_found_past_the_tree_own_positions(tmp_path, ckpt, model):
    """On a chain, context + node index is the tree's own positions (skipped, not the end of the search); a shift
    of -3 on a 3-token context puts the root at position 0, which is a position like any other."""
    context = PROMPT[:3]
    state, _ = model.prefill(context)
    greedy = [int(t) for t in _continuation(model, state, PROMPT[3], 3).argmax(-1)]
    tree = chain([PROMPT[3], *greedy])
    pos = [int(p) - 3 for p in tree.positions(len(context))]
    assert pos[0] == 0
    logits = model.verify(state, tree, positions=pos).logits
    diagnosis, evidence = _one(_replay(ckpt, tmp_path / "d", [dict(context=context, tree=tree, logits=logits)]))
    assert diagnosis == "position error" and evidence.startswith("positions shifted by -3 reproduces"), evidence


@pytest.mark.parametrize("j, kind", [(0, "removed"), (2, "added")])
def test_one_node_off_in_a_nodes_ancestor_set_is_a_mask_error(tmp_path, ckpt, model, j, kind):
    """The root right and node 1 wrong: its ancestor set without the root (removed), or with its sibling node 2, a
    node after it in batch order (added). A tree bug, named by the node and how."""
    context, state, tree = _setup(model)
    anc = tree.ancestor_mask.copy()
    anc[1, j] = not anc[1, j]
    logits = model.verify(state, tree, ancestor_mask=anc).logits
    diagnosis, evidence = _one(_replay(ckpt, tmp_path / "d", [dict(context=context, tree=tree, logits=logits)]))
    assert diagnosis == "mask error" and evidence.startswith(f"node 1's ancestor set with node {j} {kind} reproduces"), \
        evidence


@pytest.mark.parametrize("first, diagnosis", [(2, "unexplained"), (1, "stale state")])
def test_errors_no_hypothesis_reproduces(tmp_path, ckpt, model, first, diagnosis):
    """Noise on nodes first.. of an 11-node tree, the root right: where none of them is order-exact (only nodes 0
    and 1 are) the step is unexplained; where one is, the state is blamed. The evidence lists the first 8."""
    context, state, tree = _setup(model, depth=5)
    assert [bool(x) for x in tree.order_exact] == [True, True] + [False] * 9
    logits = model.verify(state, tree).logits.clone()
    logits[first:] += torch.randn(logits[first:].shape, generator=torch.Generator().manual_seed(0))
    got, evidence = _one(_replay(ckpt, tmp_path / "d", [dict(context=context, tree=tree, logits=logits)]))
    nodes = list(range(first, first + 8))
    assert got == diagnosis and evidence == (
        f"errors above noise on nodes {nodes}; no hypothesis reproduces them" if first == 2 else
        f"errors above noise on nodes {nodes}, order-exact ones among them, that no tree hypothesis reproduces: the "
        "committed state"), evidence


def test_a_dumped_conv_window_off_is_named_the_worst_tensor_off(tmp_path, ckpt, model):
    """The engine's dumped committed state: every recurrent state a little off (past the bound), one conv window far
    off. The step is stale state, and the evidence names the conv window, the tensor furthest off."""
    context, state, tree = _setup(model)
    layers = model.cfg.recurrent_layers
    states = {f"ssm.{i}": state.ssm[i] * 1.001 for i in layers}
    states |= {f"conv.{i}": state.conv[i] for i in layers}
    far = f"conv.{layers[-1]}"
    states[far] = state.conv[layers[-1]] * 1.5
    logits = model.verify(state, tree).logits  # the logits right: only the dumped state is off
    step = _replay(ckpt, tmp_path / "d", [dict(context=context, tree=tree, logits=logits, states=states)])["steps"][0]
    assert step["diagnosis"] == "stale state", step
    assert step["evidence"].startswith(f"the dumped committed state {far} is 0.5 (relative) from the oracle's"), \
        step["evidence"]
    assert f"{len(layers) + 1} tensors off" in step["evidence"] and abs(step["state_rel_max"] - 0.5) < 1e-6


def test_a_request_whose_context_starts_over_is_replayed_from_its_own_context(tmp_path, ckpt, model):
    """Two steps of one request, the second on a context that does not extend the first's: its logits are judged
    from its own context (within noise), and the break is a commit error."""
    steps = []
    for context in (PROMPT[:-1], [9, 8, 7]):
        state, _ = model.prefill(context)
        tree = _tree(model, state, PROMPT[-1], 2)
        steps.append(dict(context=context, tree=tree, logits=model.verify(state, tree).logits))
    rep = _replay(ckpt, tmp_path / "d", steps)
    assert [s["diagnosis"] for s in rep["steps"]] == ["within noise", "commit error"]
    assert max(n["kl"] for n in rep["steps"][1]["nodes"]) < 1e-9


def test_a_small_error_on_an_unlikely_token_is_within_noise(tmp_path, ckpt, model):
    """Judged by KL over full logits, not by the largest log-probability error: 1e-3 on each node's least likely
    token moves KL by far less than its bound of 1e-6, and that token's log-probability by 1e-3."""
    context, state, tree = _setup(model)
    logits = model.verify(state, tree).logits.clone()
    logits[torch.arange(tree.size), logits.argmin(-1)] += 1e-3
    step = _replay(ckpt, tmp_path / "d", [dict(context=context, tree=tree, logits=logits)])["steps"][0]
    assert step["diagnosis"] == "within noise", step["evidence"]
    assert max(n["logprob_err"] for n in step["nodes"]) > 5e-4 and max(n["kl"] for n in step["nodes"]) < 1e-7


def _record(request, nodes_kl, diagnosis="stale state"):
    from ddsim.engines.replay import NodeRecord, StepRecord
    nodes = [NodeRecord(i, True, kl, 0.0, True, 1.0, 0.0) for i, kl in enumerate(nodes_kl)]
    return StepRecord(0, request, nodes, True, [0], [0], False, diagnosis, "e")


@pytest.mark.parametrize("kls, drift", [
    ([[1.0], [2.0], [3.0]], True),  # growing, step after step
    ([[1.0], [3.0], [2.0]], False),  # not growing at the last
    ([[2.0], [1.0]], False),  # two steps, shrinking
    ([[1.0], [1.0]], False),  # level: not growing
    ([[1.0, 1.0], [1.5, 0.1, 0.1]], False),  # its sum grows, its mean over nodes does not
    ([[1.0]], False),  # one step: no growth to see
])
def test_a_wrong_state_drifts_only_where_its_error_grows_at_every_step(kls, drift):
    from ddsim.engines.replay import _label_state_errors
    recs = [_record("a", k) for k in kls] + [_record("b", [5.0], "within noise"), _record("c", [0.5])]
    _label_state_errors(recs)
    assert [r.diagnosis for r in recs[:len(kls)]] == ["state drift" if drift else "stale state"] * len(kls)
    assert [r.diagnosis for r in recs[len(kls):]] == ["within noise", "stale state"]  # other requests untouched
    if drift:
        assert recs[0].evidence == "e; growing across the request's steps (mean over nodes 1, 2, 3)"
