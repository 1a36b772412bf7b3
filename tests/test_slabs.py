"""States held as slabs (ddsim.model.slabs, GROUPED): a commit copies like layers together, one launch a group, and
the copies in and out of a graphed model's buffers take a committed state's slabs whole. The same bits as the
layer-by-layer copies (GROUPED off), and no tensor shared with buffers a later
replay rewrites."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddsim.model import slabs
from ddsim.model.config import get_preset
from ddsim.model.graphs import GraphedModel
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.trees.tree import Tree

TREE = Tree([-1, 0, 0, 1, 1, 2, 3, 4], [5, 1, 2, 3, 4, 6, 7, 8])


@pytest.fixture
def grouped(monkeypatch):
    monkeypatch.setattr(slabs, "GROUPED", True)


class _Ops(TorchDispatchMode):
    """The aten operators run inside it, counted."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _model(layers: int = 8):
    cfg = get_preset("micro").replace(layer_pattern="gga" * (layers // 3) + "g" * (layers % 3))
    return HybridModel(cfg, init_weights(cfg, seed=0))


def _reference_kv(state, res, path, cfg):
    """The commit's KV layer by layer: the prefix's rows, then the path's rows of the verify's keys and values."""
    rows = torch.tensor(path)
    return {i: tuple(torch.cat([state.kv[i][s], res.kv[i][s][rows].to(state.kv[i][s].dtype)]) for s in (0, 1))
            for i in cfg.attention_layers}


def _same(a, b) -> bool:
    """a and b the same memory read the same way."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def test_slab_of_finds_only_a_slabs_own_rows_in_order():
    base = torch.arange(24.0).reshape(3, 2, 4)
    rows = list(base.unbind(0))
    assert _same(slabs.slab_of(rows), base)
    assert _same(slabs.slab_of([base[0], base[1], base[2]]), base)
    assert _same(slabs.slab_of(rows[1:]), base[1:])  # consecutive rows of it: a slab of their own
    assert slabs.slab_of(rows[::-1]) is None  # out of order
    assert slabs.slab_of([rows[0], rows[2]]) is None  # a row skipped
    assert slabs.slab_of([rows[0], rows[1], torch.zeros(2, 4)]) is None  # another allocation
    assert slabs.slab_of([x.clone() for x in rows]) is None
    assert slabs.slab_of([rows[0], rows[1].to(torch.float64)]) is None
    assert slabs.slab_of(list(base.transpose(1, 2).unbind(0))) is None  # rows not contiguous
    assert slabs.slab_of([r[:, :2] for r in rows]) is None  # views of rows, not rows
    assert torch.equal(slabs.stacked(rows[::-1]), base.flip(0)) and _same(slabs.stacked(rows), base)


def test_pack_and_unpack_group_like_layers_and_copy_when_asked(grouped):
    xs = [torch.ones(2, 3), None, torch.zeros(2, 3), torch.ones(4), torch.full((2, 3), 2.0)]
    packed = slabs.pack(xs, copy=True)
    assert [g for g, _ in packed] == [[0, 2, 4], [3]]
    out = slabs.unpack(packed, len(xs), copy=True)
    assert out[1] is None and all(torch.equal(a, b) for a, b in zip(out, xs) if a is not None)
    assert slabs.slab_of([out[0], out[2], out[4]]) is not None
    assert all(o.data_ptr() != s.data_ptr() for o, (_, s) in zip((out[0], out[3]), packed))  # copied
    view = slabs.unpack(packed, len(xs), copy=False)
    assert view[0].data_ptr() == packed[0][1].data_ptr()
    again = slabs.pack(out)  # a slab's own rows: the slab itself, no copy
    assert _same(again[0][1], slabs.slab_of([out[0], out[2], out[4]]))


@pytest.mark.parametrize("graphed", [False, True])
@pytest.mark.parametrize("on", [False, True])
def test_a_commit_holds_each_groups_kv_in_one_slab_with_the_layer_by_layer_bits(graphed, on, monkeypatch):
    """Two commits in a row (the second from the first's slabs): each layer's keys and values are the prefix's
    then the path's, bit for bit as concatenated layer by layer, grouped or not; grouped, the layers are rows of
    one slab per side; and the second commit leaves the first's state as it was."""
    monkeypatch.setattr(slabs, "GROUPED", on)
    m = _model()
    serving = GraphedModel(m, capture=False) if graphed else m
    state, _ = m.prefill([1, 2, 3, 4, 5])
    for accepted in (5, 7):
        res = serving.verify(state, TREE) if graphed else m.verify(state, TREE)
        want = _reference_kv(state, res, TREE.root_path(accepted), m.cfg)
        kept = {i: tuple(x.clone() for x in state.kv[i]) for i in m.cfg.attention_layers}
        new = serving.commit(state, TREE, res, accepted)
        for i in m.cfg.attention_layers:
            assert all(torch.equal(a, b) for a, b in zip(new.kv[i], want[i])), i
            assert all(torch.equal(a, b) for a, b in zip(state.kv[i], kept[i])), i
        for side in (0, 1):
            assert (slabs.slab_of([new.kv[i][side] for i in m.cfg.attention_layers]) is not None) is on
        state = new


def test_a_graphed_commit_copies_its_states_out_of_the_graphs_buffers(grouped):
    """The recurrent states a graphed commit returns are rows of one fresh slab per group: equal to the model's
    own commit, and not the commit body's buffers, which the next commit of the key rewrites."""
    m = _model()
    gm = GraphedModel(m, capture=False)
    state, _ = m.prefill([1, 2, 3, 4, 5])
    res = gm.verify(state, TREE)
    first = gm.commit(state, TREE, res, 5)
    keep = [None if s is None else s.clone() for s in first.ssm]
    ref = m.commit(state, TREE, m.verify(state, TREE, keep_states=False), 5)
    rec = m.cfg.recurrent_layers
    assert slabs.slab_of([first.ssm[i] for i in rec]) is not None
    assert slabs.slab_of([first.conv[i] for i in rec]) is not None
    for i in rec:
        torch.testing.assert_close(first.ssm[i], ref.ssm[i], rtol=1e-6, atol=1e-6)
    for packed in res.fresh.captured.committed:  # the buffers a captured graph's next commit replay rewrites
        for _, slab in packed:
            slab.fill_(float("nan"))
    assert all(torch.equal(first.ssm[i], keep[i]) for i in rec)
    res = gm.verify(state, TREE)
    gm.commit(state, TREE, res, 7)  # the same key's commit body again, another node
    assert all(torch.equal(first.ssm[i], keep[i]) for i in rec)


def test_a_committed_state_is_copied_into_the_graphs_buffers_whole_and_right(grouped):
    """A verify from a state the graphed model committed copies each group's slab in one copy (the buffers equal
    the state's layers after it), and from a prefilled state layer by layer, the same."""
    m = _model()
    gm = GraphedModel(m, capture=False)
    state, _ = m.prefill([1, 2, 3, 4, 5])
    committed = gm.commit(state, TREE, gm.verify(state, TREE), 6)
    for st in (committed, state):
        gm.verify(st, TREE)
        prefix = next(iter(gm._prefixes.values()))
        for i in m.cfg.recurrent_layers:
            assert torch.equal(gm._ssm[i], st.ssm[i]) and torch.equal(gm._conv[i], st.conv[i])
        for i in m.cfg.attention_layers:
            assert all(torch.equal(prefix.kv[i][s][:st.pos], st.kv[i][s]) for s in (0, 1))


@pytest.mark.parametrize("on", [True, False])
def test_a_commits_copies_do_not_grow_with_the_layers(on, monkeypatch):
    """Grouped, the commit's operators (its replay stubbed out) are as many at 8 layers as at 32: one gather and
    one concatenation a group of like layers and side, not a few a layer (as layer by layer they are)."""
    monkeypatch.setattr(slabs, "GROUPED", on)
    counts = []
    for layers in (8, 32):
        m = _model(layers)
        state, _ = m.prefill([1, 2, 3])
        res = m.verify(state, TREE, keep_states=False)
        stub = (lambda *_: (list(state.ssm), list(state.conv)))
        with _Ops() as ops:
            m.commit(state, TREE, res, 5, replay=stub)
        counts.append(ops.n)
    assert (counts[0] == counts[1]) is on, counts
