"""CUDA-graph replays of the serving verify against the eager serving verify (GPU only: skipped
without CUDA; the same machinery runs uncaptured on the CPU in tests/test_serving_verify.py).

Trees of one key replay one captured graph set: a replay reading a stale table, state or input
buffer gives another tree's logits, which these comparisons catch."""
import pytest
import torch

from ddsim.errors import InputError
from ddsim.measure.compare import assert_per_node_close
from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.tree import Tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")

TREES = [Tree([-1, 0, 0, 1, 1, 2, 3, 4], [5, 1, 2, 3, 4, 6, 7, 8]),
         Tree([-1, 0, 1, 1, 0, 2, 3, 5], [5, 9, 1, 2, 3, 4, 6, 7]),
         Tree([-1, 0, 0, 0, 1, 2, 3, 6], [5, 1, 2, 3, 4, 6, 7, 8])]


def _config(preset: str):
    """A preset, or "<preset>-dense": the preset without its MoE layers (MoE routes on the host, so only a dense
    model with KDA, Mamba1 or lightning layers is captured)."""
    if preset.endswith("-dense"):
        return get_preset(preset.removesuffix("-dense")).replace(num_experts=0)
    return get_preset(preset)


@pytest.mark.parametrize("preset", ["tiny", "tiny-mamba2", "micro-mamba2", "tiny-zamba2", "tiny-kimi-dense",
                                    "tiny-jamba-dense", "tiny-minimax-dense", "tiny-lfm2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replays_equal_the_eager_serving_verify(preset, dtype):
    cfg = _config(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda", dtype=dtype)
    gm = GraphedModel(m)
    st, _ = m.prefill([1, 2, 3, 4, 5])
    # float32 rounding, not bits (the graph's attention reads a fixed-capacity prefix, its GEMMs may tile otherwise);
    # in bf16 a flipped rounding grows through the random model's layers (tiny-lfm2: logits 0.0625 apart on an H200
    # with the attention kernel, its fp32 twin here 1e-5): the bound of the side-by-side test below
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=5e-2, atol=1e-1)
    for mode in ("exact", "leaky", "leaky-state", "leaky-conv"):
        for step, t in enumerate(TREES + TREES[:1]):
            a, b = m.verify(st, t, mode=mode, keep_states=False), gm.verify(st, t, mode=mode)
            assert torch.isfinite(b.logits).all()
            torch.testing.assert_close(b.logits, a.logits, **tol, msg=lambda s: f"{mode} tree {step}: {s}")
            sa, sb = m.commit(st, t, a, 7), gm.commit(st, t, b, 7)
            for i in cfg.recurrent_layers:
                torch.testing.assert_close(sb.ssm[i], sa.ssm[i], **tol)
                torch.testing.assert_close(sb.conv[i], sa.conv[i], **tol)
            st2 = sb  # the next tree from a new committed state: the state buffers are refilled
            a2, b2 = m.verify(st2, t, mode=mode, keep_states=False), gm.verify(st2, t, mode=mode)
            torch.testing.assert_close(b2.logits, a2.logits, **tol)
    assert [k[0] for k in gm.captured()] == ["exact", "leaky", "leaky-conv", "leaky-state"]


@pytest.mark.parametrize("preset", ["tiny", "tiny-mamba2", "tiny-kimi-dense", "tiny-jamba-dense", "tiny-minimax-dense"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replays_with_per_node_states_equal_the_eager_verify(preset, dtype):
    """The verify that keeps every node's states (the audit's leaky generations), replayed from one
    graph for every mode (parent-indexed kernels on the mode's refilled source tables): logits,
    hidden states, per-node states and windows equal the eager verify's in each mode, tree after tree
    of different depths, and the commit takes the accepted node's state."""
    cfg = _config(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda", dtype=dtype)
    gm = GraphedModel(m)
    st, _ = m.prefill([1, 2, 3, 4, 5])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    deep = Tree(list(range(-1, 7)), [5, 1, 2, 3, 4, 6, 7, 8])
    for mode in ("exact", "leaky", "leaky-state", "leaky-conv"):
        for step, t in enumerate(TREES + [deep, TREES[0]]):
            a, b = m.verify(st, t, mode=mode), gm.verify(st, t, mode=mode, keep_states=True)
            assert_per_node_close(b, a, cfg.recurrent_layers, msg=f"{mode} tree {step}: ", **tol)
            sa, sb = m.commit(st, t, a, 6), gm.commit(st, t, b, 6)
            for i in cfg.recurrent_layers:
                torch.testing.assert_close(sb.ssm[i], sa.ssm[i], **tol)
    assert gm.captured() == [("any", 8, 1, 256, True)]  # one graph for every mode and tree


@pytest.mark.parametrize("preset", ["tiny", "tiny-mamba2", "tiny-kimi-dense", "tiny-jamba-dense", "tiny-minimax-dense"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_several_modes_replayed_side_by_side_equal_the_eager_verify(preset, dtype):
    """verify_modes (the audit's leaky generations): the tree's four modes as four copies in one replayed
    pass equal the eager verify of each mode (logits, hidden states, per-node states, windows), tree after
    tree on one graph, from a new committed state each time; a copy's commit takes its accepted node's."""
    cfg = _config(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda", dtype=dtype)
    gm = GraphedModel(m)
    st, _ = m.prefill([1, 2, 3, 4, 5])
    # bf16: the forest's GEMMs (four times the rows) round otherwise than each mode's alone, and the random model's
    # leaky modes amplify it (tiny, leaky, tree 2: 0.078 on a logit, through the glue kernels); fp32 holds 1e-5
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=5e-2, atol=1e-1)
    modes = ("leaky", "exact", "leaky-state", "leaky-conv")
    for step, t in enumerate(TREES + [Tree(list(range(-1, 7)), [5, 1, 2, 3, 4, 6, 7, 8]), TREES[0]]):
        results = list(gm.verify_modes(st, t, modes=modes))
        for r in results:
            a = m.verify(st, t, mode=r.mode)
            assert_per_node_close(r, a, cfg.recurrent_layers, msg=f"{r.mode} tree {step}: ", **tol)
        sa, sb = m.commit(st, t, m.verify(st, t, mode="leaky"), 6), gm.commit(st, t, results[0], 6)
        for i in cfg.recurrent_layers:
            torch.testing.assert_close(sb.ssm[i], sa.ssm[i], **tol)
        st = sb
    assert gm.captured() == [("any", 32, 4, 256, True)]


@pytest.mark.parametrize("preset", ["tiny", "tiny-mamba2", "tiny-zamba2", "tiny-lfm2"])
def test_states_held_as_slabs_replay_as_layer_by_layer(preset, monkeypatch):
    """ddsim.model.slabs.GROUPED on: a captured commit copies its states out of the graph's buffers (the first
    commit's state unchanged by the same key's next commit, which rewrites them), equal to the eager commit, and
    the next verify from a committed state (its slabs copied in whole) equals the eager verify from it."""
    from ddsim.model import slabs
    monkeypatch.setattr(slabs, "GROUPED", True)
    cfg = _config(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda")
    gm = GraphedModel(m)
    st, _ = m.prefill([1, 2, 3, 4, 5])
    tol = dict(rtol=1e-5, atol=1e-5)
    first = gm.commit(st, TREES[0], gm.verify(st, TREES[0]), 7)
    keep = [None if s is None else s.clone() for s in first.ssm]
    gm.commit(st, TREES[1], gm.verify(st, TREES[1]), 5)  # the same key: its commit graph replayed again
    eager = m.commit(st, TREES[0], m.verify(st, TREES[0], keep_states=False), 7)
    for i in cfg.recurrent_layers:
        assert torch.equal(first.ssm[i], keep[i]), i
        torch.testing.assert_close(first.ssm[i], eager.ssm[i], **tol)
        torch.testing.assert_close(first.conv[i], eager.conv[i], **tol)
    for i in cfg.attention_layers:
        for a, b in zip(first.kv[i], eager.kv[i]):
            torch.testing.assert_close(a, b, **tol)
    for t in TREES:
        a, b = m.verify(first, t, keep_states=False), gm.verify(first, t)
        torch.testing.assert_close(b.logits, a.logits, **tol)


def test_a_stale_replay_result_is_refused():
    cfg = get_preset("tiny")
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda")
    gm = GraphedModel(m)
    st, _ = m.prefill([1, 2, 3])
    first = gm.verify(st, TREES[0])
    gm.verify(st, TREES[1])
    with pytest.raises(InputError, match="reused"):
        gm.commit(st, TREES[0], first, 2)


def test_a_cuda_audit_runs_its_decision_generations_from_graphs():
    """The audit on CUDA: decision-only generations through GraphedModel (named in the provenance),
    the leaky generation with per-node states against the oracle; the exact path stays lossless."""
    from ddsim.measure.audit import run_audit
    from ddsim.measure.settings import AuditConfig
    rep = run_audit(AuditConfig(preset="micro", device="cuda", budgets=[4, 8], steps=2, n_prompts=2))
    assert rep.provenance.fast_path == ("ddsim-triton (replayed from CUDA graphs: the serving verify of "
                                        "decision-only generations, the verify with per-node states of the leaky "
                                        "ones)")
    for b in rep.budgets:
        assert b.modes["exact"].generations_leaving_greedy_above_noise == 0


@pytest.mark.parametrize("preset", ["tiny", "tiny-mamba2"])
def test_decode_rows_on_the_gpu_equals_one_node_verifies(preset):
    """The batched decode of the audit's references and greedy continuations (HybridModel.decode_rows,
    Triton kernels over B one-node trees, attention over padded prefixes) against each row's own
    one-node verify and commit, step after step: equal within float32 rounding in float32; in bfloat16
    (where another grouping of the products moves logits by a few hundredths over random layers) no
    further from the float32 decode than the one-node verify is."""
    from ddsim.trees.tree import chain
    cfg = get_preset(preset)
    w = init_weights(cfg, seed=0, device="cuda")
    models = {dt: HybridModel(cfg, w, device="cuda", dtype=dt) for dt in (torch.float32, torch.bfloat16)}
    prompts = ([3, 1, 4, 1, 5], [9, 2], [7, 7, 7, 7, 7, 7, 7, 7, 7])
    rows = {dt: [m.prefill(p)[0] for p in prompts] for dt, m in models.items()}
    ones = [s for s in rows[torch.bfloat16]]
    roots = [2, 6, 5]
    for _ in range(3):
        out = {dt: models[dt].decode_rows(rows[dt], roots) for dt in models}
        ref = out[torch.float32][0]
        m16 = models[torch.bfloat16]
        for b, root in enumerate(roots):
            st32 = rows[torch.float32][b]
            res32 = models[torch.float32].verify(st32, chain([root]))
            torch.testing.assert_close(ref[b], res32.logits[0], rtol=1e-4, atol=1e-4)
            res = m16.verify(ones[b], chain([root]))
            err_rows = (out[torch.bfloat16][0][b] - ref[b]).abs().max().item()
            err_one = (res.logits[0] - ref[b]).abs().max().item()
            assert err_rows <= 2 * err_one + 1e-2, (b, err_rows, err_one)
            ones[b] = m16.commit(ones[b], chain([root]), res, 0)
        rows = {dt: out[dt][1] for dt in models}
        roots = [int(x) for x in ref.argmax(-1)]


@pytest.mark.parametrize("preset", ["tiny", "tiny-mamba2"])
@pytest.mark.parametrize("mode", ["exact", "leaky", "leaky-state", "leaky-conv"])
def test_verify_rows_and_commit_rows_on_the_gpu_equal_each_trees_own(preset, mode):
    """The decision-only generations' batched serving verify and commit (HybridModel.verify_rows,
    commit_rows: the WY and commit kernels over B trees, attention over padded prefixes) against each
    tree's own serving verify and commit: within float32 rounding in float32; in bfloat16 no further
    from the float32 result than the tree's own bfloat16 verify is (plus 1e-2)."""
    cfg = get_preset(preset)
    w = init_weights(cfg, seed=0, device="cuda")
    models = {dt: HybridModel(cfg, w, device="cuda", dtype=dt) for dt in (torch.float32, torch.bfloat16)}
    prompts = ([3, 1, 4, 1, 5], [9, 2], [7, 7, 7, 7, 7, 7, 7, 7, 7])
    accepted = [7, 3, 5]
    ref = {}
    for dt, m in models.items():
        states = [m.prefill(p)[0] for p in prompts]
        rows = m.verify_rows(states, TREES, mode=mode)
        assert all(torch.isfinite(r.logits).all() for r in rows)
        ones = [m.verify(st, t, mode=mode, keep_states=False) for st, t in zip(states, TREES)]
        together = m.commit_rows(states, TREES, rows, accepted)
        alone = [m.commit(st, t, r, a) for st, t, r, a in zip(states, TREES, ones, accepted)]
        if dt == torch.float32:
            ref = {"logits": [r.logits for r in ones], "states": alone}
            for b in range(len(TREES)):
                torch.testing.assert_close(rows[b].logits, ones[b].logits, rtol=1e-4, atol=1e-4)
                for i in cfg.recurrent_layers:
                    torch.testing.assert_close(together[b].ssm[i], alone[b].ssm[i], rtol=1e-4, atol=1e-5)
                    torch.testing.assert_close(together[b].conv[i], alone[b].conv[i], rtol=1e-4, atol=1e-5)
            continue
        for b in range(len(TREES)):
            err_rows = (rows[b].logits - ref["logits"][b]).abs().max().item()
            err_one = (ones[b].logits - ref["logits"][b]).abs().max().item()
            assert err_rows <= 2 * err_one + 1e-2, (b, err_rows, err_one)
            for i in cfg.recurrent_layers:
                want = ref["states"][b].ssm[i]
                e_rows = (together[b].ssm[i] - want).abs().max().item()
                e_one = (alone[b].ssm[i] - want).abs().max().item()
                assert e_rows <= 2 * e_one + 1e-2, (b, i, e_rows, e_one)


def test_a_capture_survives_another_threads_copies():
    """Another thread copying device memory out (on its own stream: a weight digest run beside the
    audit did) while the main thread captures its graphs: a global-mode capture is invalidated."""
    import threading
    cfg = get_preset("tiny")
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda")
    big = torch.randn(64 << 20, device="cuda")
    stop = threading.Event()

    def copy_out():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            while not stop.is_set():
                big.cpu()
    t = threading.Thread(target=copy_out)
    t.start()
    try:
        gm = GraphedModel(m)
        st, _ = m.prefill([1, 2, 3])
        for tree in TREES:  # each a capture while the other thread copies
            gm.verify(st, tree)
            gm.verify(st, tree, mode="leaky")
    finally:
        stop.set()
        t.join()
    assert len(gm.captured()) == 2


@pytest.mark.parametrize("preset", ["tiny", "tiny-mamba2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replayed_decode_passes_equal_the_eager_decoder(preset, dtype):
    """GraphedModel.decoder (the audit's references and greedy continuations replayed from one graph per
    (rows, capacity)) against the model's eager decoder, step after step: logits and every row's state.
    The warm-up before the capture must leave the states where they were (a pass applied twice would
    show at the first step); a second decoder of the same key (other rows, other positions) replays the
    same graph from its own rows."""
    cfg = get_preset(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda", dtype=dtype)
    gm = GraphedModel(m)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for prompts in (([3, 1, 4, 1, 5], [9, 2], [7] * 9), ([2, 7, 1, 8], [2, 8, 1, 8, 2, 8], [4], [5, 9])):
        states = [m.prefill(p)[0] for p in prompts]
        eager, replayed = m.decoder(states, steps=5), gm.decoder(states, steps=5)
        assert replayed.buffers.rows == 4
        roots = [6, 5, 4, 3][: len(prompts)]
        for step in range(5):
            a, b = eager.step(roots), replayed.step(roots)
            assert torch.isfinite(b).all()
            torch.testing.assert_close(b, a, **tol, msg=lambda s: f"step {step}: {s}")
            for r in range(len(prompts)):
                sa, sb = eager.state(r, copy=False), replayed.state(r, copy=False)
                assert sa.pos == sb.pos
                for i in cfg.recurrent_layers:
                    torch.testing.assert_close(sb.ssm[i], sa.ssm[i], **tol)
                    torch.testing.assert_close(sb.conv[i], sa.conv[i], **tol)
                for i in cfg.attention_layers:
                    torch.testing.assert_close(sb.kv[i][0], sa.kv[i][0], **tol)
            roots = [int(x) for x in a.argmax(-1)]
    assert gm._decode.graph is not None


def test_no_garbage_is_collected_during_a_capture(monkeypatch):
    """The collector is off inside every capture (and the cycles were collected before it): a dead cycle holding
    an old graph, collected mid-capture, destroys that graph inside the capture and invalidates it (the zamba2-2.7b
    audit failed so on the H200; when the collector runs cannot be arranged in a test, so the test watches that it
    cannot). The captured verify replays equal to the eager verify, and the collector is back on after."""
    import gc
    real, seen = torch.cuda.graph, []

    class Watched:
        def __init__(self, *a, **kw):
            self.inner = real(*a, **kw)

        def __enter__(self):
            seen.append(gc.isenabled())
            return self.inner.__enter__()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)
    monkeypatch.setattr(torch.cuda, "graph", Watched)
    cfg = get_preset("tiny-zamba2")
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda", dtype=torch.bfloat16)
    st, _ = m.prefill([1, 2, 3, 4, 5])
    assert gc.isenabled()
    b = GraphedModel(m).verify(st, TREES[1], mode="leaky")
    assert seen and not any(seen) and gc.isenabled()
    a = m.verify(st, TREES[1], mode="leaky", keep_states=False)
    torch.testing.assert_close(b.logits, a.logits, rtol=2e-2, atol=2e-2)


def test_graphs_capture_cublaslt_gemms_and_restore_the_callers_library(monkeypatch):
    """Every capture (verify, commit) runs with cuBLASLt preferred (a verify's few-row GEMMs read the weights
    faster from it: benchmarks/bench_skinny_linear.py), and the caller's preference is back after; the replays
    equal the eager verify."""
    real, seen = torch.cuda.graph, []

    class Watched:
        def __init__(self, *a, **kw):
            self.inner = real(*a, **kw)

        def __enter__(self):
            seen.append(torch.backends.cuda.preferred_blas_library())
            return self.inner.__enter__()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)
    monkeypatch.setattr(torch.cuda, "graph", Watched)
    before = torch.backends.cuda.preferred_blas_library("cublas")
    try:
        cfg = get_preset("tiny")
        m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda", dtype=torch.bfloat16)
        st, _ = m.prefill([1, 2, 3, 4, 5])
        gm = GraphedModel(m)
        b = gm.verify(st, TREES[0], mode="exact")
        gm.commit(st, TREES[0], b, 5)
        assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublas
        assert len(seen) == 2 and all(s == torch._C._BlasBackend.Cublaslt for s in seen)
        a = m.verify(st, TREES[0], mode="exact", keep_states=False)
        torch.testing.assert_close(b.logits, a.logits, rtol=5e-2, atol=1e-1)
    finally:
        torch.backends.cuda.preferred_blas_library(before)



@pytest.mark.parametrize("preset", ["tiny", "tiny-lfm2"])
def test_replays_with_the_tables_built_on_the_device_equal_the_eager_serving_verify(preset, monkeypatch):
    """graphs.DEVICE_TABLES: the captured verify builds its exact tables and attention mask from the copied parents,
    and the captured commit its root paths (a table made after the verify's capture); tree after tree, each replay
    and commit equals the eager serving verify's (a table left stale would give another tree's)."""
    from ddsim.model import graphs
    monkeypatch.setattr(graphs, "DEVICE_TABLES", True)
    cfg = _config(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0, device="cuda"), device="cuda", dtype=torch.float32)
    gm = GraphedModel(m)
    st, _ = m.prefill([1, 2, 3, 4, 5])
    tol = dict(rtol=1e-5, atol=1e-5)
    for mode in ("exact", "leaky"):
        for step, t in enumerate(TREES + TREES[:1]):
            a, b = m.verify(st, t, mode=mode, keep_states=False), gm.verify(st, t, mode=mode)
            torch.testing.assert_close(b.logits, a.logits, **tol, msg=lambda s: f"{mode} tree {step}: {s}")
            sa, sb = m.commit(st, t, a, 6), gm.commit(st, t, b, 6)
            for i in cfg.recurrent_layers:
                torch.testing.assert_close(sb.ssm[i], sa.ssm[i], **tol)
                torch.testing.assert_close(sb.conv[i], sa.conv[i], **tol)
    assert all(c.device_tables for c in gm._keys.values())
