"""HybridModel.decode_rows: one plain decode step of several sequences at once (the audit's references
and greedy continuations), against verify + commit of a one-node tree per sequence; and
HybridModel.verify_rows: the serving verify of several trees at once (the decision-only generations'),
against each tree's own serving verify and commit."""
import pytest
import torch

from ddsim.errors import InputError
from ddsim.measure.compare import assert_close
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.tree import Tree, chain

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [7]]  # prefixes of different lengths: padded, the padding masked out


@pytest.mark.parametrize("preset,backend", [("micro", None), ("micro-mamba2", None), ("tiny", None),
                                            pytest.param("micro", "triton", marks=pytest.mark.interpreter)])
def test_decode_rows_equals_one_node_verify_and_commit_per_row(preset, backend):
    cfg = get_preset(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0), backend=backend)
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    roots = [p[-1] for p in PROMPTS]
    for _step in range(3):  # rows keep their own positions and contexts step after step
        logits, after = m.decode_rows(states, roots)
        assert logits.shape == (len(PROMPTS), cfg.vocab_size)
        for b, (st, root) in enumerate(zip(states, roots)):
            t = chain([root])
            res = m.verify(st, t, mode="exact")
            one = m.commit(st, t, res, 0)
            assert_close(f"row {b} logits", logits[b], res.logits[0], slack=5)  # (tolerances: verify_rows' test)
            assert after[b].pos == one.pos == st.pos + 1
            _assert_states_close(after[b], one)
        states, roots = after, [int(x) for x in logits.argmax(-1)]


def test_decode_rows_refuses_what_it_cannot_decode():
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    st = m.prefill([1, 2])[0]
    with pytest.raises(InputError, match="one each"):
        m.decode_rows([st, st], [1])
    with pytest.raises(InputError, match="one each"):
        m.decode_rows([], [])
    with pytest.raises(InputError, match="outside the vocabulary"):
        m.decode_rows([st], [cfg.vocab_size])


TREES = [Tree([-1, 0, 0, 1, 1], [5, 6, 7, 8, 9]), Tree([-1, 0, 1, 2, 0], [2, 3, 4, 5, 6]),
         Tree([-1, 0, 0, 0, 0], [1, 2, 3, 4, 7])]  # one size, three shapes


MODES = ["exact", "leaky", "leaky-state", "leaky-conv"]
INTERPRETED = (pytest.mark.slow, pytest.mark.interpreter)  # the Triton kernels on CPU tensors, in the interpreter
# every mode with PyTorch's ops; with the Triton kernels (the interpreter) on two presets: `make test-slow`'s
ROWS_CASES = [*[(m, "tiny", None) for m in MODES],
              *[pytest.param(m, p, "triton", marks=INTERPRETED) for p in ("micro", "micro-mamba2") for m in MODES]]


@pytest.mark.parametrize("mode,preset,backend", ROWS_CASES)
def test_verify_rows_equals_each_trees_serving_verify(preset, backend, mode):
    """The Triton kernels (the interpreter here) on B sequences, in every mode: a leaky recurrence or
    conv reads the previous node of its own tree, never the last node of the tree before it.
    Within float32's tolerance at each tensor's size (ddsim.measure.compare; the logits with five times
    it): the B trees' projections are one GEMM of 3T rows against T rows a tree, which a CPU may block and
    sum otherwise (AMX and AVX-512 do: a conv window's entry of 0.06 moved 1.7e-6), while reading another
    tree's node moves states and logits by tenths."""
    cfg = get_preset(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0), backend=backend)
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    rows = m.verify_rows(states, TREES, mode=mode)
    for b, (st, t, res) in enumerate(zip(states, TREES, rows)):
        one = m.verify(st, t, mode=mode, keep_states=False)
        assert_close(f"tree {b} logits", res.logits, one.logits, slack=5)
        a, c = m.commit(st, t, one, 3), m.commit(st, t, res, 3)
        for i in cfg.recurrent_layers:
            assert_close(f"tree {b} layer {i} state", c.ssm[i], a.ssm[i])
            assert_close(f"tree {b} layer {i} conv window", c.conv[i], a.conv[i])
        for i in cfg.attention_layers:
            assert_close(f"tree {b} layer {i} keys", c.kv[i][0], a.kv[i][0])


def test_verify_rows_refuses_what_it_cannot_verify():
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    st = m.prefill([1, 2])[0]
    with pytest.raises(InputError, match="one size per batch"):
        m.verify_rows([st, st], [TREES[0], chain([1, 2])])
    with pytest.raises(InputError, match="one each"):
        m.verify_rows([st], TREES[:2])
    with pytest.raises(InputError, match="mode"):
        m.verify_rows([st], TREES[:1], mode="sloppy")


def _assert_states_close(got, want):
    """Two states of one sequence, computed in a batch and alone: float32's tolerance at each tensor's size (see
    test_verify_rows_equals_each_trees_serving_verify)."""
    assert got.pos == want.pos
    for i, (a, b) in enumerate(zip(got.ssm + got.conv, want.ssm + want.conv)):
        if b is not None:
            assert_close(f"recurrent tensor {i}", a, b)
    for i, (a, b) in enumerate(zip(got.kv, want.kv)):
        if b is not None:
            assert_close(f"layer {i} keys", a[0], b[0])
            assert_close(f"layer {i} values", a[1], b[1])


@pytest.mark.parametrize("preset,backend", [pytest.param("micro", "triton", marks=INTERPRETED), ("micro-mamba2", None)])
@pytest.mark.parametrize("mode", ["exact", "leaky"])
def test_commit_rows_replays_a_whole_pass_together(preset, backend, mode, monkeypatch):
    """commit_rows of a whole verify_rows pass replays every recurrent layer once for all its trees
    (each to its own accepted node, from its own state); a part of a pass is committed tree by tree.
    Both equal each tree's own commit."""
    import ddsim.gpu_backend as gb
    cfg = get_preset(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0), backend=backend)
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    rows = m.verify_rows(states, TREES, mode=mode)
    accepted = [3, 2, 4]
    want = [m.commit(st, t, r, a) for st, t, r, a in zip(states, TREES, rows, accepted)]
    calls = []
    for name in ("gdn_tree_commit", "mamba2_tree_commit"):
        real = getattr(gb, name)
        monkeypatch.setattr(gb, name, lambda *a, real=real, **k: calls.append(k["initial_state"].shape[0]) or real(*a, **k))
    got = m.commit_rows(states, TREES, rows, accepted)
    assert calls == [3] * len(cfg.recurrent_layers)  # one replay per layer, all three trees
    for g, w in zip(got, want):
        _assert_states_close(g, w)
    calls.clear()
    part = m.commit_rows(states[1:], TREES[1:], rows[1:], accepted[1:])
    assert calls == [1] * (2 * len(cfg.recurrent_layers))  # not the whole pass: tree by tree
    for g, w in zip(part, want[1:]):
        _assert_states_close(g, w)


def test_prefill_requests_pad_chains_and_commit_each_at_its_end():
    """Shadow contexts moved on together: chains of different lengths padded to the longest, each
    committed at its own last token: the state its own prefill gives."""
    from ddsim.sim.generate import PrefillRequest, prefill_requests
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    chains = [[4, 4, 2], [8], [1, 6, 3, 5, 2]]
    got = prefill_requests(m, [PrefillRequest(st, c) for st, c in zip(states, chains)] + [PrefillRequest(states[0], [])])
    assert got[3] is states[0]  # nothing to move on by
    for st, c, g in zip(states, chains, got):
        _assert_states_close(g, m.prefill(c, state=st)[0])


def test_states_kept_past_their_batch_are_their_own_memory():
    """A state kept while others of its batch move on is its own copy (a view into the batch's tensors
    would keep all of it alive: gigabytes per pass at full size): commit_rows' states (shadows and
    committed states move on at different times), and greedy_rows' tips of rows that stop before the
    others. decode_rows' own states are views (a pass is host-bound; its callers copy what they keep)."""
    from ddsim.sim.generate import GreedyRequest, greedy_rows
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]

    def own(st):  # every allocation the state's tensors lie in holds those tensors and nothing else (a state's
        # like layers may share one: ddsim.model.slabs)
        held: dict = {}
        for x in st.ssm + st.conv:
            if x is not None:
                key = x.untyped_storage().data_ptr()
                held[key] = held.get(key, (x.untyped_storage().nbytes(), 0))
                held[key] = (held[key][0], held[key][1] + x.numel() * x.element_size())
        return all(size == used for size, used in held.values())
    _, after = m.decode_rows(states, [p[-1] for p in PROMPTS])
    assert not any(own(st) for st in after)  # views, by design
    rows = m.verify_rows(states, TREES, mode="leaky")
    assert all(own(st) for st in m.commit_rows(states, TREES, rows, [3, 2, 4]))
    tips = greedy_rows(m, [GreedyRequest(st, p[-1], n) for st, p, n in zip(states, PROMPTS, (1, 3, 2))])
    assert own(tips[0][1]) and own(tips[2][1])  # stopped before the last row


def test_rows_copied_out_together_equal_each_row_copied_alone():
    """RowDecoder.states (greedy_rows' tips of one pass): each row's state bit for bit as state(b) copies it,
    in memory of its own (no storage shared with the buffers or another row), unchanged by later steps."""
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    dec = m.decoder(states, steps=2)
    dec.step([p[-1] for p in PROMPTS])
    together, alone = dec.states([2, 0]), [dec.state(2), dec.state(0)]
    storages = set()
    for a, b in zip(together, alone):
        assert a.pos == b.pos
        for xs, ys in ((a.ssm, b.ssm), (a.conv, b.conv), ([t for kv in a.kv if kv for t in kv], [t for kv in b.kv if kv for t in kv])):
            for x, y in zip(xs, ys):
                if y is not None:
                    assert torch.equal(x, y) and x.untyped_storage().nbytes() == x.numel() * x.element_size()
                    storages.add(x.untyped_storage().data_ptr())
    assert len(storages) == sum(1 for st in together for x in st.ssm + st.conv + [t for kv in st.kv if kv for t in kv]
                                if x is not None)
    dec.step([1, 2, 3])
    for a, b in zip(together, alone):
        for x, y in zip(a.ssm, b.ssm):
            if y is not None:
                assert torch.equal(x, y)


def test_prefill_requests_never_pad_past_the_models_positions():
    """A chain whose padding to the batch's longest would run past the model's last position is
    prefilled on its own (the padding is the batch's, not the request's)."""
    from ddsim.sim.generate import PrefillRequest, prefill_requests
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    near_end = m.prefill([1] * (cfg.max_position_embeddings - 3))[0]  # room for 3 more tokens
    short = m.prefill([2, 3])[0]
    got = prefill_requests(m, [PrefillRequest(near_end, [4, 5]), PrefillRequest(short, [6, 7, 8, 9, 5])])
    _assert_states_close(got[0], m.prefill([4, 5], state=near_end)[0])
    _assert_states_close(got[1], m.prefill([6, 7, 8, 9, 5], state=short)[0])


def _one_node_step(m, st, root):
    """verify + commit of the one-node tree [root]: the plain decode step the decoders must equal."""
    t = chain([root])
    res = m.verify(st, t, mode="exact")
    return res.logits[0], m.commit(st, t, res, 0)


@pytest.mark.parametrize("preset,backend", [("micro", None), pytest.param("micro-mamba2", "triton", marks=INTERPRETED),
                                            ("tiny", None)])
@pytest.mark.parametrize("graphed", [False, True])
def test_a_decoder_runs_many_steps_from_rows_packed_once(preset, backend, graphed):
    """model.decoder (the audit's references and greedy continuations): the rows packed once, each step
    writing every row's key at its own position and moving its recurrent state on in place, equals
    each row's one-node verify and commit from the row's state before the step, step after step (and
    the chain of them from the start, within the rounding that compounds); a GraphedModel's decoder
    (uncaptured here: the same buffers and pass) rounds its rows up to a power of two (the extra row
    is never read) and its capacity to prefix_capacity."""
    from ddsim.model.graphs import GraphedModel, prefix_capacity
    cfg = get_preset(preset)
    m = HybridModel(cfg, init_weights(cfg, seed=0), backend=backend)
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    on = GraphedModel(m, capture=False) if graphed else m
    dec = on.decoder(states, steps=4)
    if graphed:
        assert (dec.buffers.rows, dec.buffers.capacity) == (4, prefix_capacity(max(st.pos for st in states) + 4))
    roots = [p[-1] for p in PROMPTS]
    for _step in range(4):
        before = [dec.state(b) for b in range(len(PROMPTS))]
        logits = dec.step(roots)
        assert logits.shape == (len(PROMPTS), cfg.vocab_size)
        for b in range(len(PROMPTS)):
            want, one = _one_node_step(m, before[b], roots[b])
            assert_close(f"row {b} logits", logits[b], want, slack=5)
            _assert_states_close(dec.state(b), one)
            _, states[b] = _one_node_step(m, states[b], roots[b])  # each row's own chain from the start
            for x, y in zip(dec.state(b).ssm, states[b].ssm):
                if y is not None:
                    torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
        roots = [int(x) for x in logits.argmax(-1)]


def test_a_graphed_decoder_hands_its_buffers_on_and_refuses_to_step_after():
    """One decode key at a time: a second decoder of the same shape takes the buffers over (the first
    then refuses to step or read a state: its rows are gone), a decoder of another shape frees the
    old key; the decoder checks tokens, the vocabulary and its capacity before a pass."""
    from ddsim.model.graphs import GraphedModel
    cfg = get_preset("micro")
    m = HybridModel(cfg, init_weights(cfg, seed=0))
    gm = GraphedModel(m, capture=False)
    states = [m.prefill(p[:-1])[0] for p in PROMPTS]
    first = gm.decoder(states, steps=2)
    second = gm.decoder(states[:1] * 4, steps=2)  # 4 rows: the same key (4, 256)
    assert second.buffers is first.buffers
    with pytest.raises(InputError, match="taken by a later decoder"):
        first.step([1, 2, 3])
    with pytest.raises(InputError, match="taken by a later decoder"):
        first.state(0)
    second.step([1, 2, 3, 4])
    third = gm.decoder(states[:1] * 5, steps=2)  # 8 rows: a new key, the old one freed
    assert third.buffers is not second.buffers and gm._decode.key == (8, 256)
    with pytest.raises(InputError, match="taken by a later decoder"):
        second.step([1, 2, 3, 4])
    assert gm.decoder(states[:2], steps=2).buffers.rows == 8  # a smaller one fits the key kept
    far = gm.decoder(states[:1], steps=300)  # positions past 256: a key as large as both
    assert gm._decode.key == (8, 512) and far.buffers.capacity == 512
    third = gm.decoder(states[:1] * 5, steps=2)
    with pytest.raises(InputError, match="one each"):
        third.step([1, 2])
    with pytest.raises(InputError, match="outside the vocabulary"):
        third.step([cfg.vocab_size] * 5)
    short = m.decoder(states, steps=1)  # eager buffers hold exactly the positions asked for
    short.step([1, 2, 3])
    with pytest.raises(InputError, match="past the buffers"):
        short.step([1, 2, 3])
    gm.set_decode_graphs(False)  # off: the key freed, the model's own decoder
    assert gm._decode is None
    eager = gm.decoder(states, steps=2)
    assert eager.buffers.rows == 3 and gm._decode is None
