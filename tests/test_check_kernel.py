"""`ddsim check-kernel` against the oracle: ddsim's own kernels and flash-linear-attention's pass
(fla-core is installed by the Makefile's setup into .engines, outside the venv, where transformers
would take it for its own GDN backend), and kernels with planted bugs are caught, each with its
shrunk counterexample naming the first wrong node."""
import json
import re
from pathlib import Path

import pytest

from tests.cli_runs import one_line_error, run_cli

ENGINES = Path(__file__).resolve().parents[1] / ".engines"
pytestmark = pytest.mark.slow  # `make test-slow` (kernels in Triton's interpreter at the quick profile's serving shapes)
# the plants in ddsim's convention wrap ddsim's torch path, which reads on the host: on a GPU their replayed example
# cannot be captured in a CUDA graph (tests/test_graph_replay.py holds that), so were they run there they would replay
# eager and each test see the bug it plants (on the CPU, where these calls run, every replay is eager)
EAGER = ["--launch", "eager"]
# the CPU and its quick profile wherever the suite runs (on a GPU machine --device auto would take the serving
# profile on the GPU, which these expectations are not about: the GPU suites check that)
CPU = ["--device", "cpu"]


def bound_by(rec: dict, own: str) -> None:
    """A check's JSON binds the kernel it checked (``rec``: its kernel, or its commit) by the files its module reaches
    in its package, its own file ``own`` among them with the digest the JSON gives that file."""
    mine = [p for p in rec["sources"] if p.endswith(own)]
    assert rec["source"].endswith(own) and len(mine) == 1 and rec["sources"][mine[0]] == rec["source_sha256"], rec


def _verdict(r):
    return [l for l in r.stdout.splitlines() if l.startswith("FAILED") or "properties" in l]


@pytest.mark.parametrize("mode, dtype", [("exact", "float32"), ("leaky", "float32"), ("exact", "bfloat16"),
                                         ("leaky", "bfloat16")])
def test_ddsims_own_kernel_passes(tmp_path, mode, dtype):
    progress = ["--progress"] if dtype == "float32" else []  # (the same verdicts with it: asserted below either way)
    r = run_cli("check-kernel", "--impl", "ddsim", "--mode", mode, "--dtype", dtype, "--max-examples", "25",
                *CPU, "--out", tmp_path / "ce.json", *progress)  # the quick profile, the CPU's
    assert r.returncode == 0, r.stdout + r.stderr
    told = r.stderr.splitlines()
    if progress:  # each serving example's and each property's wall time, on stderr as each ends
        assert told and all(re.fullmatch(r"serving example \[.+\]: \d+\.\d s|"
                                         r"property '.+': \d+ drawn inputs run so far, \d+\.\d s", line)
                            for line in told), r.stderr
        assert any(line.startswith("serving example [") for line in told), r.stderr
        # every property with a drawn search (leaky's eighth, leaks off order-exact nodes, is judged on what they ran)
        assert len({line.split("'")[1] for line in told if line.startswith("property '")}) == 7
    else:
        assert not told, r.stderr
    assert f"{dtype} inputs" in r.stdout
    assert f"all {7 if mode == 'exact' else 8} properties hold (quick profile: " in r.stdout
    doc = json.loads((tmp_path / "ce.json").read_text())
    assert doc["holds"] and doc["profile"] == "quick" and doc["counterexamples"] == []
    cov = doc["coverage"]  # every wide dimension of the quick profile was run
    assert max(cov["nodes"]) >= 129 and 128 in cov["K"] and max(cov["batch"]) >= 8 and max(cov["pool slots"]) >= 256
    assert max(cov["largest slot id"]) > 255 and {4, 6, 8} <= set(cov["HV/H"]) and cov["g min"] <= -29
    assert {"float32", "bfloat16", "float16"} <= set(cov["dtype"]) and max(cov["calls"]) >= 20


def test_fla_passes_as_the_flattened_path_and_refuses_exact(tmp_path):
    # a test dependency: missing must fail, not skip
    assert (ENGINES / "fla").is_dir(), "fla-core is missing from .engines: `make test` installs it"
    r = run_cli("check-kernel", *CPU, "--impl", "fla", "--mode", "leaky", "--max-examples", "3", "--out", tmp_path / "ce.json",
                pythonpath=ENGINES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fla-core 0.6.0" in r.stdout and "leaks off order-exact nodes" in r.stdout
    assert "all 8 properties hold (quick profile" in r.stdout
    # refused before fla-core is imported (about 4 s): the same line where it cannot be imported at all
    r = run_cli("check-kernel", *CPU, "--impl", "fla", "--mode", "exact")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "ddsim check-kernel: error: --mode exact: fla.fused_recurrent_gated_delta_rule offers only leaky (it takes "
        "no tree: on a tree it is the flattened path)"]


def test_fla_refuses_exact_for_each_of_its_kernels_by_the_names_its_adapter_gives():
    from ddsim.engines import fla
    from ddsim.errors import InputError
    for op, name in (("kda", "fla.fused_recurrent_kda"), ("lightning", "fla.fused_recurrent_simple_gla")):
        with pytest.raises(InputError, match=rf"^--mode exact: {name} offers only leaky \(it takes no tree"):
            fla.refuse_before_import(op, "exact")
        fla.refuse_before_import(op, "leaky")
    fla.refuse_before_import("mamba2", "exact")  # an op fla lacks: the adapter's to refuse, once loaded


@pytest.mark.parametrize("mode, held", [("exact", 12), ("leaky", 8)])
def test_sglang_target_verify_kernel_in_both_modes(tmp_path, mode, held):
    """SGLang 0.5.23's fused_sigmoid_gating_delta_rule_update (its source from the wheel, in Triton's
    interpreter): with retrieve_parent_token it is exact on every node, and so is every node's state it keeps in
    intermediate_states_buffer for its commit (at the rows and pitch it is given), and its commit
    (fused_mamba_state_scatter_with_mask) copies the accepted node's into every layer's pool slot; without it it is
    the flattened path, and disable_state_update leaves the pool alone: it reads each sequence's own shuffled
    slot and writes none."""
    assert (ENGINES / "sglang" / "kernels").is_dir(), "SGLang's kernel is missing from .engines: `make test` fetches it"
    r = run_cli("check-kernel", *CPU, "--impl", "sglang", "--mode", mode, "--max-examples", "3", "--out", tmp_path / "ce.json",
                pythonpath=ENGINES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(sglang 0.5.23)" in r.stdout and f"all {held} properties hold (quick profile" in r.stdout
    # a padded batch among them (slot -1: SGLang's CUDA-graph padding), which its kernel skips
    cov = json.loads((tmp_path / "ce.json").read_text())["coverage"]
    assert cov["padded rows"] == [0, 2]
    assert cov["input layout"] == ["contiguous", "views of one projection"]  # q, k, v as SGLang's layer splits them
    if mode == "exact":  # its node states, at each buffer layout, and its commit of them
        assert cov["node-state layout"] == ["batch rows", "draft-budget pitch", "shuffled rows"]
        assert "node states exact on every node" in r.stdout and "committed state exact at the accepted node" in r.stdout
        assert cov["commit layers"] == [2] and "commit sglang.fused_mamba_state_scatter_with_mask" in r.stdout


def test_vllm_spec_decode_kernel_is_the_flattened_path(tmp_path):
    """vLLM 0.33.0's fused_sigmoid_gating_delta_rule_update on its spec-decode path (per-token state
    slots, the committed slot read through ssm_state_indices and num_accepted_tokens): on a tree it is
    the flattened path, it reads the slot it is given and writes only the per-token slots."""
    assert (ENGINES / "vllm" / "third_party").is_dir(), "vLLM's kernel is missing from .engines: `make test` fetches it"
    r = run_cli("check-kernel", *CPU, "--impl", "vllm", "--mode", "leaky", "--max-examples", "3", "--out", tmp_path / "ce.json",
                pythonpath=ENGINES)
    assert r.returncode == 0, r.stdout + r.stderr
    # its per-token states (where its next step starts, at the accepted token) are the flattened path's too
    assert "(vllm 0.33.0)" in r.stdout and "all 10 properties hold (quick profile" in r.stdout
    assert "node states flattened on every node" in r.stdout
    # its next step reads the accepted token's state in place: no commit kernel of its own, and the line says so
    assert "no commit checked: vllm.fused_sigmoid_gating_delta_rule_update offers none" in " ".join(r.stdout.split())
    r = run_cli("check-kernel", *CPU, "--impl", "vllm", "--mode", "exact", pythonpath=ENGINES)
    assert r.returncode == 2 and "--mode exact: vllm.fused_sigmoid_gating_delta_rule_update offers only leaky" in r.stderr


@pytest.mark.parametrize("kernel, failing, node", [
    ("parent_off_by_one", ["exact on order-exact nodes", "exact on every node"], 2),
    # exp(-g) overflows at the serving examples' strong decay (g down to -30): not finite there
    ("wrong_gate_sign", ["output finite", "exact on order-exact nodes", "exact on every node"], 0),
    ("writes_the_committed_state", ["committed state untouched"], None),
    ("writes_a_slot_outside_the_batch", ["other pool slots untouched"], None),
    ("reads_slot_by_batch_index", ["output finite", "exact on order-exact nodes", "exact on every node"], 0),
])
def test_planted_bugs_are_caught_with_the_first_wrong_node(tmp_path, kernel, failing, node):
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", *CPU, "--impl", f"tests.planted_kernels:{kernel}", "--convention", "ddsim", *EAGER, "--mode", "exact",
                "--max-examples", "15", "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [l.split(":")[0] for l in r.stdout.splitlines() if l.startswith("FAILED")] == [f"FAILED {p}" for p in failing]
    ces = json.loads(out.read_text())["counterexamples"]
    assert [c["property"] for c in ces] == failing
    if node is not None:
        first = ces[-1]["first_wrong_node"]
        # the first wrong node is where the bug first acts: the first node with a grandparent (2), or the
        # root itself for a wrong gate or a wrong slot
        assert first["node"] == node and first["max_abs_error"] > first["bound"], ces[-1]
        assert f"first wrong node {node} of sequence {first['sequence']}" in r.stdout
    else:  # the slots written, and whose they are
        pool = ces[0]["pool"]
        owned = set(pool["batch_slots"])
        written = set(pool["written_slots"])
        assert written and (written <= owned if kernel == "writes_the_committed_state" else not written & owned), pool
        assert f"slots written {pool['written_slots']}" in r.stdout


@pytest.mark.parametrize("mode, held", [("exact", 13), ("leaky", 13)])
def test_sglang_tree_conv_in_both_modes(tmp_path, mode, held):
    """SGLang 0.5.23's causal_conv1d_update: with retrieve_next_token/next_sibling (built from the
    parents) exact on every node, without them the flattened conv; it reads each sequence's own
    shuffled window slot and, by its design, rewrites that slot with the window after the whole
    flattened draft (its commit, fused_conv_window_scatter_with_mask, restores the accepted node's window from
    intermediate_conv_window, whose every node's window is held to the oracle's too, and the restored windows too),
    and no other slot."""
    r = run_cli("check-kernel", *CPU, "--impl", "sglang", "--op", "conv", "--mode", mode, "--max-examples", "3",
                "--out", tmp_path / "ce.json", pythonpath=ENGINES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "committed window = the flattened draft's window" in r.stdout and "causal_conv1d_triton.py" in r.stdout
    assert f"all {held} properties hold (quick profile" in r.stdout
    assert f"node states {'exact' if mode == 'exact' else 'flattened'} on every node" in r.stdout
    assert f"committed state {'exact' if mode == 'exact' else 'flattened'} at the accepted node" in r.stdout
    # in exact mode it fills the parent table SGLang's verifies then read: held to the tree's parents
    assert ("parent table the verify reads is the tree's" in r.stdout) == (mode == "exact")
    doc = json.loads((tmp_path / "ce.json").read_text())
    bound_by(doc["kernel"], "causal_conv1d_triton.py")  # the conv's files, not its verify's
    bound_by(doc["kernel"]["commit"], "mamba_state_scatter_triton.py")
    assert doc["coverage"]["commit layers"] == [2]


@pytest.mark.parametrize("kernel, failing, written", [
    # the replayed step's padded rows too, whose pool's last slot is no sequence's
    ("conv_pads_wrap_to_the_last_slot", ["committed window = the flattened draft's window", "other pool slots untouched"],
     [29, 39]),
    ("conv_pads_by_address", ["other pool slots untouched"], [-1, 29, 39]),
])
def test_a_padded_row_that_writes_a_slot_is_caught(tmp_path, kernel, failing, written):
    """SGLang pads a CUDA-graph batch with slot -1, and its tree conv rewrites each sequence's window slot: a conv
    that takes -1 as Python does writes the pool's last slot (another sequence's, or on the replayed step no
    sequence's), one that does not know the pad id writes a slot's worth before the pool (check-kernel's guard slot).
    Each fails first on the padded batch."""
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", *CPU, "--impl", f"tests.planted_pads:{kernel}", "--convention", "sglang", "--op", "conv",
                "--mode", "exact", "--max-examples", "3", "--out", out, pythonpath=ENGINES)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [l.split(":")[0] for l in r.stdout.splitlines() if l.startswith("FAILED")] == [f"FAILED {f}" for f in failing]
    ce = json.loads(out.read_text())["counterexamples"][0]
    assert ce["example"] == "padded batch: 2 sequences and 2 padded rows (slot -1) at 4 x 9"
    assert ce["pool"]["batch_slots"] == [29, 39, -1, -1] and ce["pool"]["written_slots"] == written
    assert ("the slot's worth before and after the pool" in r.stdout) == (-1 in written)


def test_a_conv_that_fills_the_verifys_parent_table_as_a_chain_is_caught(tmp_path):
    """SGLang's verifies read the parent table its tree conv fills (retrieve_parent_token). A conv whose outputs and
    windows are right but whose table is a chain's would make every exact verify after it run the draft flattened:
    it fails that property alone, on a tree, naming the node, what it wrote and the tree's parent."""
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", *CPU, "--impl", "tests.planted_pads:conv_parent_table_as_a_chain", "--convention", "sglang",
                "--op", "conv", "--mode", "exact", "--max-examples", "3", "--out", out, pythonpath=ENGINES)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [l.split(":")[0] for l in r.stdout.splitlines() if l.startswith("FAILED")] == [
        "FAILED parent table the verify reads is the tree's"]
    ce = json.loads(out.read_text())["counterexamples"][0]
    call, b, node, wrote, parent = ce["parent_table_wrong"][0]
    assert wrote == node - 1 != parent == ce["trees"][b]["parents"][node]
    assert f"node {node} of sequence {b} (parents " in r.stdout and f"given parent {wrote}, not {parent}" in r.stdout


BOTH = ["node states exact on every node", "other node-state entries untouched"]


@pytest.mark.parametrize("kernel, op, failing", [
    ("last_node_state_not_kept", "gdn", ["node states exact on every node"]),
    ("node_states_by_batch_index", "gdn", BOTH),
    ("pitch_taken_as_nodes", "gdn", BOTH),
    ("node_state_before_its_update", "gdn", ["node states exact on every node"]),
    ("conv_windows_by_batch_index", "conv", BOTH),
    ("vllm_token_states_reversed", "gdn", ["node states flattened on every node"]),
])
def test_node_states_a_commit_would_copy_are_checked(tmp_path, kernel, op, failing):
    """A verify whose outputs are right but whose kept node states (SGLang's intermediate_states_buffer, which its
    commit copies into the pool, its conv's intermediate_conv_window, vLLM's per-token states) are not fails exactly
    the node-state properties, with the node or the buffer entries named; every output property still holds."""
    out = tmp_path / "ce.json"
    convention, mode = ("vllm", "leaky") if kernel.startswith("vllm") else ("sglang", "exact")
    r = run_cli("check-kernel", *CPU, "--impl", f"tests.planted_node_states:{kernel}", "--convention", convention, "--op", op,
                "--mode", mode, "--max-examples", "5", "--out", out, pythonpath=ENGINES)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [l.split(":")[0] for l in r.stdout.splitlines() if l.startswith("FAILED")] == [f"FAILED {p}" for p in failing]
    ces = json.loads(out.read_text())["counterexamples"]
    assert [c["property"] for c in ces] == failing
    first = ces[0]["first_wrong_node"]
    assert first["max_abs_error"] > first["bound"] and f"first wrong node state {first['node']} " in r.stdout
    if kernel == "last_node_state_not_kept":  # never written: NaN, at a tree's last node
        assert first["max_abs_error"] == float("inf") and first["node"] == len(ces[0]["trees"][0]["parents"]) - 1
    if len(ces) > 1:  # the entries written outside the batch's rows, by (row, step)
        nb = ces[1]["node_buffer"]
        assert nb["written_outside"] and all(w[0] not in nb["batch_rows"] or w[1] >= ces[1]["shapes"]["T"]
                                             for w in nb["written_outside"]), nb
        assert f"written outside them (row, step) {nb['written_outside']}" in r.stdout


COMMITTED = ["committed state exact at the accepted node", "committed state the kept node state bit for bit"]


@pytest.mark.parametrize("commit, op, failing", [
    ("rows_by_request_index", "gdn", COMMITTED),
    ("the_next_node", "gdn", COMMITTED),
    ("state_rounded_to_bf16", "gdn", COMMITTED),
    ("no_step_is_a_step", "gdn", ["commit writes nothing else"]),
    ("first_layer_only", "gdn", COMMITTED),
    ("the_next_node", "mamba2", COMMITTED),
    ("rows_by_request_index", "conv", COMMITTED),
    ("offsets_in_32_bits", "gdn", []),  # right below 2^31 elements: on a GPU the serving profile's commit example
    ("layers_one_after_another", "gdn", [*COMMITTED, "commit writes nothing else"]),  # on a slot-major pool alone
    # on the replayed step alone: the first step's slots written (a server replays its state update from a graph)
    ("slots_kept_by_tensor", "gdn", [*COMMITTED, "commit writes nothing else"]),
    ("slots_kept_by_tensor", "mamba2", [*COMMITTED, "commit writes nothing else"]),
])
def test_a_commit_that_copies_the_kept_states_wrongly_is_caught(tmp_path, commit, op, failing):
    """SGLang's verify (right) with a planted commit in its convention (--commit) in place of its own: each fails
    exactly the commit properties it breaks, named by layer, sequence and accepted node, and every verify and
    node-state property holds."""
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", "--impl", "sglang", "--commit", f"tests.planted_commits:{commit}", "--op", op,
                "--mode", "exact", "--max-examples", "3", *CPU, "--out", out, pythonpath=ENGINES)
    assert r.returncode == (1 if failing else 0), r.stdout + r.stderr
    assert [l.split(":")[0] for l in r.stdout.splitlines() if l.startswith("FAILED")] == [f"FAILED {p}" for p in failing]
    doc = json.loads(out.read_text())
    assert doc["kernel"]["commit"]["name"] == f"tests.planted_commits:{commit}"
    bound_by(doc["kernel"]["commit"], "planted_commits.py")
    assert [p["name"] for p in doc["properties"]][-3:] == [*COMMITTED, "commit writes nothing else"]
    ces = doc["counterexamples"]
    if failing == COMMITTED:
        first = ces[0]["commit"]["first_wrong"]
        assert f"sequence {first['sequence']}'s committed state (accepted node {first['node']}, " in r.stdout
        assert first["max_abs_error"] > first["bound"] and ces[0]["commit"]["layers"] >= 2
        copy = ces[1]["commit"]["first_wrong"]
        assert f"layer {copy['layer']} of " in r.stdout and copy["max_abs_difference"] > 0
        if commit == "first_layer_only":
            assert copy["layer"] == 1
    if commit == "layers_one_after_another":  # right where the layers lie one after another
        assert all(c["example"].endswith("pool layer 2 of 4 slot-major") for c in ces), [c["example"] for c in ces]
    if commit == "slots_kept_by_tensor":  # right on fresh tensors
        assert all(c["example"].endswith("replayed on a chain step's launch") for c in ces), [c["example"] for c in ces]
    if commit == "no_step_is_a_step":  # a sequence that accepted none had its slot written
        c = ces[0]["commit"]
        assert -1 in c["accepted"] and c["written"] and "written besides the committed slots" in r.stdout


def test_a_commit_that_would_never_run_is_refused(tmp_path):
    """--commit on a verify that keeps no node states (SGLang's flattened GDN) is refused before any work: a commit
    never exercised is no verdict."""
    r = run_cli("check-kernel", *CPU, "--impl", "sglang", "--mode", "leaky", "--commit", "tests.planted_commits:the_next_node",
                "--out", tmp_path / "x.json", pythonpath=ENGINES)
    one_line_error(r, "--commit tests.planted_commits:the_next_node: sglang.fused_sigmoid_gating_delta_rule_update "
                      "keeps no node states in --op gdn --mode leaky")
    assert not (tmp_path / "x.json").exists()


def test_the_serving_profile_puts_node_states_past_two_to_the_31_elements():
    """For each op whose engines keep node states, the serving profile has one buffer whose batch lies past 2^31
    elements (a 32-bit offset wraps there), beside the three layouts; kernels without node states get none."""
    from ddsim.engines import kernel_cases
    for op in ("gdn", "kda", "mamba2"):
        inps = kernel_cases.cases(op, "serving", nodes=True)
        wide = [i for i in inps if i["node_layout"] == "past 2^31 elements"]
        assert len(wide) == 1 and {i["node_layout"] for i in inps} == {*kernel_cases.NODE_LAYOUTS, "past 2^31 elements"}
        M, P = wide[0]["node_buffer"]
        per = wide[0]["initial_state"][0].numel()
        assert int(wide[0]["node_rows"].min()) * P * per >= kernel_cases.INT32_OFFSETS and M * P * per < 2 ** 32, op
        d = kernel_cases.describe(wide[0])
        assert d["node-state buffer elements max"] == M * P * per
    # a kernel that commits them too: a model's every layer at once, the last layers' entries past 2^31 elements
    for op in ("gdn", "kda", "mamba2"):
        inps = kernel_cases.cases(op, "serving", nodes=True, commit=True)
        wide = [i for i in inps if i.get("commit_layers", 2) > 2]
        assert len(wide) == 1 and wide[0]["commit_layers"] == kernel_cases.MODEL_LAYERS[op]
        # the node states past 2^31 elements are committed from their one layer (two would double several GB)
        assert [i["commit_layers"] for i in inps if i["node_layout"] == "past 2^31 elements"] == [1]
        L, per, N = wide[0]["commit_layers"], wide[0]["initial_state"][0].numel(), wide[0]["pool"].shape[0]
        M, P = wide[0]["node_buffer"]
        assert (L - 1) * N * per >= kernel_cases.INT32_OFFSETS > (L - 1) * (N - 2) * per  # no larger than it needs
        assert ((L - 1) * M + int(wide[0]["node_rows"].min())) * P * per >= kernel_cases.INT32_OFFSETS
        assert kernel_cases.describe(wide[0], commit=True)["commit pool elements max"] == L * N * per
        assert all(i.get("commit_layers", 2) <= 2 for i in kernel_cases.cases(op, "serving", nodes=True))
    assert all("commit_layers" not in i for i in kernel_cases.cases("conv", "quick", nodes=True, commit=True))
    # the conv keeps windows of C (W - 1) elements a node: a server's buffer of them stays far below 2^31
    assert {i["node_layout"] for i in kernel_cases.cases("conv", "quick", nodes=True)} == set(kernel_cases.NODE_LAYOUTS)
    assert all("node_rows" not in i for i in kernel_cases.cases("gdn", "serving"))
    assert all("node_rows" not in i for i in kernel_cases.cases("gdn", "quick", nodes=False))


def test_a_planted_tree_conv_bug_and_a_missing_conv(tmp_path):
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", *CPU, "--impl", "tests.planted_kernels:conv_skips_the_grandparent", "--convention", "ddsim", *EAGER,
                "--op", "conv", "--mode", "exact", "--max-examples", "15", "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [l.split(":")[0] for l in r.stdout.splitlines() if l.startswith("FAILED")] == [
        "FAILED exact on order-exact nodes", "FAILED exact on every node"]
    ce = json.loads(out.read_text())["counterexamples"][-1]
    assert ce["op"] == "conv" and ce["first_wrong_node"]["node"] == 2, ce
    r = run_cli("check-kernel", "--impl", "ddsim", "--op", "conv", "--mode", "leaky", "--max-examples", "10",
                *CPU, "--out", out)  # the quick profile, the CPU's (a GPU's default is the serving one)
    assert r.returncode == 0 and "all 8 properties hold (quick profile" in r.stdout, r.stdout + r.stderr
    one_line_error(run_cli("check-kernel", *CPU, "--impl", "fla", "--op", "conv", "--mode", "leaky", pythonpath=ENGINES),
                   "--op conv: fla.fused_recurrent_gated_delta_rule has no tree causal conv")


def test_a_planted_bug_is_caught_in_bfloat16_too(tmp_path):
    """bf16 inputs widen the tolerance to bf16's, not enough to hide a wrong gate."""
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", *CPU, "--impl", "tests.planted_kernels:wrong_gate_sign", "--convention", "ddsim", *EAGER, "--mode",
                "exact", "--dtype", "bfloat16", "--max-examples", "15", "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    ce = json.loads(out.read_text())["counterexamples"][-1]  # exact on every node, shrunk to the root
    assert ce["dtype"] == "bfloat16" and ce["first_wrong_node"]["node"] == 0 and ce["example"] == "drawn"


def test_a_kernel_that_never_leaks_is_not_the_flattened_path(tmp_path):
    r = run_cli("check-kernel", *CPU, "--impl", "tests.planted_kernels:exact_calling_itself_leaky", "--convention", "ddsim", *EAGER,
                "--mode", "leaky", "--max-examples", "20", "--out", tmp_path / "ce.json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED flattened semantics on every node" in r.stdout
    assert "FAILED leaks off order-exact nodes: never differed from exact verification" in r.stdout


def test_a_leaky_kernel_that_raises_everywhere_fails_with_its_counterexamples_written(tmp_path):
    """In leaky mode the leak's search runs a drawn input when no serving example showed the leak; a kernel that
    raises there fails the leak too, in the table and the JSON (the command line once stopped on that raise with
    exit 2 and no result written)."""
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", *CPU, "--impl", "tests.planted_kernels:refuses_every_call", "--convention", "ddsim", *EAGER,
                "--mode", "leaky", "--max-examples", "2", "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED leaks off order-exact nodes: no leak seen: the kernel raised ValueError: no kernel for" in r.stdout
    got = json.loads(out.read_text())
    assert [p["holds"] for p in got["properties"]] == [False] * 8, got["properties"]
    assert got["properties"][-1]["name"] == "leaks off order-exact nodes"


@pytest.mark.interpreter  # compiled, the read one past lands inside the allocator's block and the kernel passes
def test_a_kernel_that_reads_past_its_tensors_fails_every_property_in_the_interpreter(tmp_path):
    """A kernel with right outputs whose Triton copy reads one entry past its input (its value never stored): the
    interpreter, every access held to the launch's tensors (check_bounds, which the command line installs), raises
    on every call, so every property fails, naming the kernel's read and how far past which tensor it lies. Unheld,
    it read host memory and passed."""
    out = tmp_path / "ce.json"
    r = run_cli("check-kernel", *CPU, "--impl", "tests.planted_kernels:reads_one_past_the_output", "--convention", "ddsim",
                *EAGER, "--mode", "exact", "--max-examples", "2", "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert [p["holds"] for p in got["properties"]] == [False] * 7, got["properties"]
    assert ('OutOfBounds("kernel copy_one_past: a load of 4 bytes outside every tensor argument in 1 of 2177 lanes, '
            "the first 8704 bytes from the start of x's storage of 8704 bytes\")") in r.stdout, r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--impl", "nope", "--mode", "exact"], "--impl nope: expected ddsim, fla, sglang, vllm or MODULE:FUNCTION"),
    (["--impl", "no_such_module:f", "--convention", "ddsim", "--mode", "exact"], "cannot import 'no_such_module'"),
    (["--impl", "tests.planted_kernels:nothing", "--convention", "ddsim", "--mode", "exact"], "has no 'nothing'"),
    (["--impl", "tests.planted_kernels:wrong_gate_sign", "--mode", "exact"], "--convention: MODULE:FUNCTION needs"),
    (["--impl", "vllm", "--mode", "leaky"], "--impl vllm: the package vllm is not installed"),
    (["--impl", "ddsim", "--convention", "sglang", "--mode", "exact"],  # it was ignored
     "--convention: only with a MODULE:FUNCTION --impl (ddsim's adapter has its own)"),
    (["--impl", "sglang", "--mode", "exact"], "--impl sglang: the package sglang is not installed"),
    (["--impl", "fla", "--mode", "leaky"], "--impl fla: the package fla-core is not installed"),
    (["--impl", "ddsim", "--mode", "exact", "--max-examples", "0"], "--max-examples: expected >= 1"),
    (["--impl", "ddsim", "--mode", "exact", "--example-timeout", "-1"], "--example-timeout: expected a finite"),
    (["--impl", "ddsim", "--mode", "exact", "--example-timeout", "nan"], "--example-timeout: expected a finite"),
    (["--impl", "ddsim", "--mode", "exact", "--device", "cuda:3"], "--device"),
    (["--impl", "ddsim", "--mode", "exact", "--device", "cpu", "--launch", "graph"],
     "--launch graph: needs a CUDA device, got --device cpu (cpu); the CPU replays eager"),
    (["--impl", "ddsim", "--mode", "exact", "--launch", "captured"], "--launch: invalid choice"),
    (["--impl", "ddsim", "--mode", "exact", "--commit", "tests.planted_commits:the_next_node"],
     "--commit tests.planted_commits:the_next_node: ddsim keeps no node states for a commit to copy"),
    (["--impl", "ddsim", "--mode", "exact", "--commit", "planted_commits"], "--commit planted_commits: expected "
                                                                          "MODULE:FUNCTION"),
    (["--impl", "ddsim", "--mode", "exact", "--commit", "no_such_module:f"], "--commit no_such_module:f: cannot import"),
])
def test_check_kernel_bad_input(args, needle):
    one_line_error(run_cli("check-kernel", *args), needle)


def test_an_engine_kernel_in_the_whole_model_audit(tmp_path, report):
    """`--fast-path` runs an engine's kernel in every GDN layer: a kernel with a wrong gate sign makes
    the exact path's logits wrong, and the gate says so through the exact-path rules; the report
    names the kernel and the hash of its source."""
    from tests.cli_runs import FAST_AUDIT
    out = tmp_path / "planted"
    r = run_cli("audit", *FAST_AUDIT, "--fast-path", "tests.planted_kernels:wrong_gate_sign", "--convention", "ddsim",
                "--out", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    engine = rep["provenance"]["engine"]
    assert engine["name"] == "tests.planted_kernels:wrong_gate_sign" and engine["modes"] == ["exact", "leaky"]
    assert len(engine["source_sha256"]) == 64 and engine["source"].endswith("tests/planted_kernels.py")
    assert engine["sources"]["tests/planted_kernels.py"] == engine["source_sha256"]  # its own file among its package's
    assert rep["provenance"]["fast_path"].startswith("tests.planted_kernels:wrong_gate_sign (exact/leaky recurrences")
    g = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json")
    assert g.returncode == 1
    violated = {l.split(":")[0].removeprefix("VIOLATED ") for l in g.stdout.splitlines() if l.startswith("VIOLATED")}
    assert {"exact_state_rel_max", "exact_kl_max"} <= violated  # the default fast path holds both (report fixture)
    assert report["noise_floor"]["4"]["kl_max"] < 1e-9
    m = run_cli("gate", "--policy", "hybrid-unsafe", "--report", out / "report.json", "--fast-path", "ddsim")
    assert m.returncode == 2 and "--fast-path ddsim: the report does not match" in m.stderr


@pytest.mark.parametrize("args, needle", [  # each refusal names --fast-path, the option given (it once said --impl)
    (["--fast-path", "fla"], "--fast-path fla: the package fla-core is not installed"),
    (["--fast-path", "nope"], "--fast-path nope: expected ddsim, fla, sglang, vllm or MODULE:FUNCTION"),
    (["--fast-path", "no_such_module:f", "--convention", "ddsim"], "--fast-path no_such_module:f: cannot import"),
    (["--convention", "fla"], "--convention: only with a MODULE:FUNCTION --fast-path"),
    (["--fast-path", "sglang", "--convention", "sglang"], "--convention: only with a MODULE:FUNCTION --fast-path (sglang"),
    (["--fast-path", "tests.planted_kernels:wrong_gate_sign"], "--convention: MODULE:FUNCTION needs"),
])
def test_audit_fast_path_bad_input(tmp_path, args, needle):
    from tests.cli_runs import FAST_AUDIT
    one_line_error(run_cli("audit", *FAST_AUDIT, *args, "--out", tmp_path / "o"), needle)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kernel, said", [
    ("refuses_every_call", "the kernel raised ValueError: no kernel for (1, 15, 1, 8) (a second line)"),
    ("output_with_an_extra_axis", "the kernel broke its contract: an output of shape (1, 1, 15, 2, 8) where the "
                                  "contract's is (1, 15, 2, 8)"),
    ("output_as_a_list", "the kernel broke its contract: an output of list, not a floating-point tensor"),
])
def test_an_audits_fast_path_that_raises_or_breaks_its_contract_stops_it_in_one_line(tmp_path, kernel, said):
    """A --fast-path kernel that raises was an internal error; one returning the right values with an extra axis was
    reshaped silently and read as right. Both stop the audit now, naming --fast-path, with nothing written."""
    from tests.cli_runs import FAST_AUDIT
    one_line_error(run_cli("audit", *FAST_AUDIT, "--fast-path", f"tests.planted_kernels:{kernel}", "--convention",
                           "ddsim", "--out", tmp_path / "o"), f"--fast-path tests.planted_kernels:{kernel}: {said}")
    assert not (tmp_path / "o").exists()


# two 4-token prompts: an engine's kernel runs every prefill too, in Triton's interpreter, one token at a time
# on the CPU wherever the suite runs: the engines' kernels in Triton's interpreter, compared bit for bit with ddsim's
# own on the CPU (on a GPU their compiled kernels round otherwise: 2.8e-4 apart, RESULTS.md)
SMALL_AUDIT = ["--preset", "micro", "--budget", "4", "--steps", "1", "--seed", "5", "--device", "cpu", "--prompts",
               str(Path(__file__).with_name("data") / "prompts-short.jsonl")]


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("small")
    assert run_cli("audit", *SMALL_AUDIT, "--out", out).returncode == 0
    return json.loads((out / "report.json").read_text())


def test_fla_in_the_whole_model_audit_matches_ddsims_flattened_path(tmp_path, small_report):
    """fla's kernel computes the leaky recurrences of a small audit (Triton's interpreter): every generation
    comes out token for token as with ddsim's own kernel, and the report records fla-core."""
    assert (ENGINES / "fla").is_dir(), "fla-core is missing from .engines: `make test` installs it"
    out = tmp_path / "fla"
    r = run_cli("audit", *SMALL_AUDIT, "--fast-path", "fla", "--out", out, pythonpath=ENGINES)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["provenance"]["engine"]["package"] == "fla-core" and rep["provenance"]["engine"]["modes"] == ["leaky"]
    # the files of fla its kernel's module reaches: its exp among them, beside the kernel's own file
    assert {"fla/ops/gated_delta_rule/fused_recurrent.py", "fla/ops/utils/op.py"} <= set(rep["provenance"]["engine"]["sources"])
    assert [g["tokens"] for g in rep["generations"]] == [g["tokens"] for g in small_report["generations"]]
    leak = rep["budgets"][0]["leak"]["leaky"]["kl"]["order_exact"]["max"]
    assert leak < 1e-9  # fla is exact where the layout makes the flattened path exact


@pytest.mark.parametrize("engine, package, modes", [("sglang", "sglang", ["exact", "leaky"]),
                                                    ("vllm", "vllm", ["leaky"])])
def test_serving_engines_in_the_whole_model_audit(tmp_path, small_report, engine, package, modes):
    """SGLang's and vLLM's kernels run in every GDN layer of a small audit (Triton's interpreter): the
    generations come out token for token as with ddsim's own kernels, SGLang's exact mode is exact on
    every node, both engines' flattened paths on the order-exact nodes, and the report names the engine,
    its version and the hash of its kernel's source."""
    out = tmp_path / engine
    r = run_cli("audit", *SMALL_AUDIT, "--fast-path", engine, "--out", out, pythonpath=ENGINES)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    rec = rep["provenance"]["engine"]
    assert rec["package"] == package and rec["modes"] == modes and len(rec["source_sha256"]) == 64
    assert rec["source_sha256"] in rec["sources"].values() and all(p.startswith(f"{package}/") for p in rec["sources"])
    assert [g["tokens"] for g in rep["generations"]] == [g["tokens"] for g in small_report["generations"]]
    kl = [b["leak"][m]["kl"][part]["max"] for b in rep["budgets"] for m in modes for part in ("order_exact", "other")
          if m == "exact" or part == "order_exact"]
    assert kl and max(x or 0.0 for x in kl) < 1e-9
    # (the small audit's trees are chains: the leak itself is check-kernel's to show, above)


# (bf16 and fp16 inputs: the quick profile's explicit examples, whatever --dtype says)
@pytest.mark.parametrize("mode, held, dtype", [("exact", 12, "float32"), ("leaky", 8, "float32")])
def test_sglang_mamba2_selective_state_update_in_both_modes(tmp_path, mode, held, dtype):
    """SGLang 0.5.23's Mamba2 selective_state_update (from the wheel, in Triton's interpreter): with
    retrieve_parent_token and a per-node state buffer it is exact on every node, and its commit copies the accepted
    node's state into every layer's slot; without them the flattened path; disable_state_update leaves every pool slot
    alone."""
    assert (ENGINES / "sglang" / "kernels" / "ops" / "mamba" / "triton_ops").is_dir(), \
        "SGLang's Mamba2 kernel is missing from .engines: `make test` fetches it"
    r = run_cli("check-kernel", "--impl", "sglang", "--op", "mamba2", "--mode", mode, "--dtype", dtype,
                "--max-examples", "3", *CPU, "--out", tmp_path / "ce.json", pythonpath=ENGINES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sglang.selective_state_update (sglang 0.5.23)" in r.stdout
    assert f"all {held} properties hold (quick profile" in r.stdout


def test_ddsims_mamba2_kernel_passes_and_planted_mamba2_bugs_are_caught(tmp_path):
    r = run_cli("check-kernel", "--impl", "ddsim", "--op", "mamba2", "--mode", "exact", "--max-examples", "8",
                *CPU, "--out", tmp_path / "ce.json")  # the quick profile, the CPU's
    assert r.returncode == 0 and "all 7 properties hold (quick profile" in r.stdout, r.stdout + r.stderr
    for fn, failing in (("mamba2_parent_off_by_one", {"exact on order-exact nodes", "exact on every node"}),
                        ("mamba2_forgets_dt_bias", {"exact on order-exact nodes", "exact on every node"}),
                        ("mamba2_strides_from_shapes", {"exact on order-exact nodes", "exact on every node"})):
        out = tmp_path / f"{fn}.json"
        r = run_cli("check-kernel", *CPU, "--impl", f"tests.planted_kernels:{fn}", "--convention", "ddsim", "--op", "mamba2",
                    "--mode", "exact", "--max-examples", "8", "--out", out)
        assert r.returncode == 1, r.stdout + r.stderr
        assert {l.split(":")[0].removeprefix("FAILED ") for l in r.stdout.splitlines() if l.startswith("FAILED")} == failing
        ce = json.loads(out.read_text())["counterexamples"]
        assert all(c["op"] == "mamba2" and c["first_wrong_node"] is not None for c in ce)
        if fn == "mamba2_parent_off_by_one":  # the first wrong node sits below depth 1
            assert ce[0]["first_wrong_node"]["node"] >= 2
        if fn == "mamba2_strides_from_shapes":  # only x, B, C split from one xBC reach it
            assert ce[0]["example"].endswith("x B C views of one fused projection"), ce[0]
    r = run_cli("check-kernel", *CPU, "--impl", "fla", "--op", "mamba2", "--mode", "leaky", pythonpath=ENGINES)
    one_line_error(r, "--op mamba2", "has no Mamba2 tree verify")


def test_kda_verifies_of_ddsim_sglang_and_fla_and_planted_kda_bugs(tmp_path):
    """--op kda (ddsim's own KDA verify is checked against the oracle in properties/test_kda_kernels.py): SGLang
    0.5.23's fused_sigmoid_gating_delta_rule_update in its KDA mode
    is exact with retrieve_parent_token and the flattened path without it; fla's
    fused_recurrent_kda is the flattened path (exact refused in one line); planted KDA bugs fail the properties they
    break, the one wrong only at Kimi Linear's K = V = 128 on that serving example."""
    def run(impl, mode, *extra, out="ce.json"):
        return run_cli("check-kernel", *CPU, "--impl", impl, *extra, "--op", "kda", "--mode", mode, "--max-examples", "3",
                       "--out", tmp_path / out, pythonpath=ENGINES)
    # (ddsim's own KDA verify runs below behind the ddsim convention, wrapped by the planted kernels)
    for impl, mode, held in (("sglang", "exact", 12), ("sglang", "leaky", 8), ("fla", "leaky", 8)):
        r = run(impl, mode)
        assert r.returncode == 0 and f"all {held} properties hold (quick profile" in r.stdout, (impl, mode, r.stdout + r.stderr)
    assert "fla.fused_recurrent_kda (fla-core" in r.stdout
    doc = json.loads((tmp_path / "ce.json").read_text())
    bound_by(doc["kernel"], "kda/fused_recurrent.py")
    assert doc["kernel"]["op"] == "kda" and {"name": "leaks off order-exact nodes", "holds": True} in [
        {k: p[k] for k in ("name", "holds")} for p in doc["properties"]]
    assert doc["coverage"]["K"][-1] == 128 and doc["coverage"]["nodes"][-1] == 129
    one_line_error(run("fla", "exact"), "--mode exact", "fla.fused_recurrent_kda offers only leaky")
    one_line_error(run("vllm", "leaky"), "--op kda", "has no KDA verify")
    both = {"exact on order-exact nodes", "exact on every node"}
    for fn, failing, example in (("kda_decay_per_head", both, None), ("kda_wrong_past_key_width_64", both, "K=V=128")):
        r = run(f"tests.planted_kernels:{fn}", "exact", "--convention", "ddsim", out=f"{fn}.json")
        assert r.returncode == 1, r.stdout + r.stderr
        assert {l.split(":")[0].removeprefix("FAILED ") for l in r.stdout.splitlines() if l.startswith("FAILED")} == failing
        ce = json.loads((tmp_path / f"{fn}.json").read_text())["counterexamples"]
        assert ce and all(c["op"] == "kda" for c in ce)
        if example:
            assert all(example in c["example"] for c in ce), [c["example"] for c in ce]


def test_lightning_attention_verifies_of_ddsim_and_fla_and_a_planted_bug(tmp_path):
    """--op lightning (ddsim's own verify is checked against the oracle in properties/test_lightning_kernels.py): fla's
    fused_recurrent_simple_gla (the kernel fla's
    lightning_attn runs, autotuned: its first configuration in the interpreter) is the flattened path (exact
    refused in one line); an engine without one says so; a decay applied after the update is caught."""
    def run(impl, mode, *extra, out="cl.json"):
        return run_cli("check-kernel", *CPU, "--impl", impl, *extra, "--op", "lightning", "--mode", mode, "--max-examples", "3",
                       "--out", tmp_path / out, pythonpath=ENGINES)
    r = run("fla", "leaky")  # (ddsim's own lightning verify runs below, wrapped by the planted kernel)
    assert r.returncode == 0 and "all 8 properties hold (quick profile" in r.stdout, r.stdout + r.stderr
    doc = json.loads((tmp_path / "cl.json").read_text())
    assert doc["kernel"]["name"] == "fla.fused_recurrent_simple_gla" and doc["kernel"]["op"] == "lightning"
    bound_by(doc["kernel"], "simple_gla/fused_recurrent.py")
    assert doc["coverage"]["K"][-1] == 128 and doc["coverage"]["decay max"] == 1.0
    one_line_error(run("fla", "exact"), "--mode exact", "fla.fused_recurrent_simple_gla offers only leaky")
    one_line_error(run("sglang", "exact"), "--op lightning", "has no lightning-attention verify")
    r = run("tests.planted_kernels:lightning_decays_after_the_update", "exact", "--convention", "ddsim", out="bad.json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert {l.split(":")[0].removeprefix("FAILED ") for l in r.stdout.splitlines() if l.startswith("FAILED")} == {
        "exact on order-exact nodes", "exact on every node"}
    assert all(c["op"] == "lightning" for c in json.loads((tmp_path / "bad.json").read_text())["counterexamples"])


@pytest.mark.parametrize("kernel, failing, example", [
    ("wrong_past_16_nodes", {"exact on every node"}, "T=17"),
    ("wrong_past_key_width_16", {"exact on order-exact nodes", "exact on every node"}, "K=128"),
    ("wrong_from_the_third_sequence", {"exact on order-exact nodes", "exact on every node"}, "B=8"),
    ("wrong_for_slot_ids_above_7", {"output finite", "exact on order-exact nodes", "exact on every node"}, "pool high"),
    ("wrong_for_4_value_heads_per_key_head", {"exact on order-exact nodes", "exact on every node"}, "HV=4"),
    ("clamps_strong_decay", {"exact on order-exact nodes", "exact on every node"}, "gates"),
    # the 20th call lands in the burst (repeatable), the 40th on a drawn input's first call (a wrong output)
    ("wrong_on_one_call_in_twenty", {"repeatable", "exact on order-exact nodes", "exact on every node"}, "burst of 24 calls"),
    ("normalises_k_in_place", {"inputs untouched"}, "K=128"),
    # offsets from the shapes: right on contiguous inputs, the wrong columns where q, k, v are split from one projection
    ("strides_from_shapes", {"exact on order-exact nodes", "exact on every node"}, "views of one fused projection"),
])
def test_kernels_wrong_along_one_serving_dimension_are_caught_by_the_quick_profile(tmp_path, kernel, failing, example):
    """Each passed the small drawn examples alone (the second probe's 'all 5 properties hold'); the quick
    profile's explicit examples catch each at its defaults, and name the example that reaches it."""
    import ddsim.engines as engines
    from ddsim.engines import kernel_cases
    from ddsim.engines.check_kernel import check
    from tests import planted_kernels
    # the explicit examples' calls come first, then two calls a drawn input: start the count so that the 40th call
    # is a drawn input's first (its output wrong), whatever number of calls the explicit examples make
    explicit = sum(max(1, c["burst"]) + ("replay" in c) for c in kernel_cases.cases("gdn", "quick"))  # a replayed
    # example's first step is a call more
    planted_kernels._CALLS[0] = (39 - explicit) % 2
    res = check(engines.load(f"tests.planted_kernels:{kernel}", convention="ddsim"), mode="exact", max_examples=5)
    assert {r.name for r in res if not r.holds} == failing, [(r.name, r.detail) for r in res]
    ce = next(r.counterexample for r in res if not r.holds)
    assert example in ce.get("serving_example", ce["example"]), ce


def test_the_coverage_and_verdicts_are_written_even_when_every_property_holds(tmp_path):
    out = tmp_path / "ck.json"
    r = run_cli("check-kernel", "--impl", "ddsim", "--op", "conv", "--mode", "exact", "--max-examples", "3", "--device",
                "cpu", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["holds"] and [p["name"] for p in doc["properties"]] == [
        "output finite", "inputs untouched", "repeatable", "committed window untouched", "other pool slots untouched",
        "exact on order-exact nodes", "exact on every node"]
    assert doc["kernel"]["name"] == "ddsim.tree_causal_conv1d" and 1024 in doc["coverage"]["C"]
    bound_by(doc["kernel"], "gpu_backend/__init__.py")
    assert "coverage: " in r.stdout and "largest slot id" in r.stdout


def test_a_kernel_that_hangs_on_a_serving_shape_fails(tmp_path):
    """A kernel that never returns on the 129-node example: the check fails (exit 1) within the example
    timeout, naming the example, rather than running forever."""
    out = tmp_path / "ck.json"
    r = run_cli("check-kernel", "--impl", "tests.planted_kernels:hangs_past_128_nodes", "--convention", "ddsim", "--mode",
                "exact", "--max-examples", "2", "--example-timeout", "5", *CPU, "--out", out, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED every property: serving example [ddtree budget 128 top-k 4 T=129" in r.stdout
    assert "did not return within 5 s" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["holds"] is False and doc["hung"]["example"].startswith("ddtree budget 128 top-k 4 T=129")


def test_a_module_functions_package_version_comes_from_the_package_when_its_metadata_is_missing(monkeypatch):
    """A MODULE:FUNCTION kernel's report names its package's version: from the installed distribution, else the
    package's own __version__ (ddsim run from a checkout on the path, where no metadata is installed)."""
    import importlib.metadata

    import ddsim
    from ddsim import engines

    impl = "ddsim.gpu_backend.engine_api:target_verify"
    assert engines.load(impl, convention="sglang").version == ddsim.__version__

    def no_metadata(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "version", no_metadata)
    kernel = engines.load(impl, convention="sglang")
    assert (kernel.package, kernel.version) == ("ddsim", ddsim.__version__)
    assert engines._version("no_such_distribution_here") is None
