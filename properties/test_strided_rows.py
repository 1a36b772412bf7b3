"""ddsim's GDN kernels on q, k, v as a serving engine hands them over: views of one fused projection's rows (SGLang's
split of mixed_qkv), each token's row strided by the projection's width. The kernels read them in place (a row
stride per input, _common.rows_of: a constexpr, so a contiguous input compiles to the machine code it did before)
instead of copying them first. Every design's output on the views is bit-identical to its output on contiguous
copies (the same values, the same arithmetic), and the launch is handed the views themselves. On the CPU the
kernels run in Triton's interpreter (small shapes); on a GPU compiled."""
import pytest
import torch

import ddsim.gpu_backend as gb
from ddsim.engines.kernel_cases import gdn_case, split_views
from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import triton_commit, triton_gdn, triton_wy_blocked, triton_wy_split
from ddsim.properties.kernel_checks import on_device


def test_rows_of_keeps_a_projections_rows_and_copies_any_other_layout():
    inp = gdn_case(T=5, B=3, H=2, ratio=2, K=8, V=4)
    views = split_views({n: inp[n] for n in "qkv"})
    W = 2 * 2 * 8 + 4 * 4
    for n in "qkv":
        t, rs = C.rows_of(views[n])
        assert t is views[n] and rs == W  # read in place, row r at r * W
        t, rs = C.rows_of(inp[n])
        assert t is inp[n] and rs == inp[n][0, 0].numel()  # contiguous: its own width
    heads_first = inp["q"].transpose(1, 2).contiguous().transpose(1, 2)  # [B, T, H, K] with heads before tokens
    t, rs = C.rows_of(heads_first)
    assert t.is_contiguous() and torch.equal(t, inp["q"]) and rs == 16
    # one token of each sequence (T = 1): the batch stride is the row stride, whatever the token axis's says
    one_token = split_views({n: inp[n] for n in "qkv"})["k"][:, 0].unsqueeze(1)  # [B, 1, H, K]
    assert one_token.stride(1) != one_token.stride(0)
    t, rs = C.rows_of(one_token)
    assert t is one_token and rs == 5 * W
    gapped = inp["q"][:, :, :, :4]  # a dim stride of 1 but rows wider than their heads: not heads side by side
    t, rs = C.rows_of(gapped)
    assert t.is_contiguous() and rs == 8
    # each sequence's rows at the start of a longer one's (a buffer sized for 7 tokens): not one row after another
    padded = split_views({n: torch.cat([inp[n], inp[n][:, :2]], 1) for n in "qkv"})["v"][:, :5]
    t, rs = C.rows_of(padded)
    assert t.is_contiguous() and torch.equal(t, inp["v"]) and rs == 4 * 4
    expanded = inp["k"][:1, :1].expand(1, 5, 2, 8)  # one sequence's one row for every token: read so in place too
    t, rs = C.rows_of(expanded)
    assert t is expanded and rs == 0
    t, rs = C.rows_of(inp["k"][:, :1].expand(3, 5, 2, 8))  # three sequences: row b T + t is not at (b T + t) 0
    assert t.is_contiguous() and rs == 16


# (plan, its keyword arguments): every launch a GDN verify or commit makes, one block and past it
DESIGNS = [
    ("fused", lambda inp, kw: triton_gdn.plan_wy(**inp, **kw, design="fused")),
    ("split", lambda inp, kw: triton_gdn.plan_wy(**inp, **kw, design="split")),
    ("fold", lambda inp, kw: triton_gdn.plan_wy(**inp, **kw, design="fold")),
    ("fold, root apart", lambda inp, kw: triton_gdn.plan_wy(**inp, **kw, design="fold", fold_root=False)),
    ("head", lambda inp, kw: triton_gdn.plan_wy(**inp, **kw, design="head")),
    ("blocked", lambda inp, kw: triton_wy_blocked.plan_wy_blocked(**inp, **kw, block_t=16)),
    ("blocked, folded", lambda inp, kw: triton_wy_blocked.plan_wy_blocked(**inp, **kw, block_t=16, fold=True)),
    ("chunked", lambda inp, kw: triton_wy_blocked.plan_wy_blocked(**inp, **kw, block_t=16, design="chunked")),
    ("serial", lambda inp, kw: triton_gdn.plan_recurrent(**inp, **kw, design="serial")),
    ("paths", lambda inp, kw: triton_gdn.plan_recurrent(**inp, **kw, design="paths")),
]


def _inputs(T, dtype=torch.float32):
    """A batch of 2 trees of T nodes (grouped heads, V narrower than K) in a pool, on the kernels' device."""
    inp = gdn_case(T=T, kind=("ddtree", T - 1, 4), B=2, H=2, ratio=2, K=16, V=8, seed=T, dtype=dtype)
    return {n: on_device(inp[n]) for n in ("q", "k", "v", "g", "beta", "parents", "pool", "slots")}


def _bound(monkeypatch, module):
    """The keyword arguments of every launch ``module``'s plans bind (the launch itself still runs)."""
    got = []
    bind = module.bind

    def spy(kernel, grid, kw):
        got.append(dict(kw))
        return bind(kernel, grid, kw)
    monkeypatch.setattr(module, "bind", spy)
    return got


def _cases():
    """Every design in exact mode on views of one projection; the leaky mode and q's row stride apart from k's and
    v's for every design too, the forms past one block (40 nodes) and the paths form among them in `make test-slow`
    only (in Triton's interpreter about 25 s of one core there, the rest about 12 s)."""
    for mode, split in (("exact", "qkv"), ("leaky", "qkv"), ("exact", "kv")):
        for design, plan in DESIGNS:
            heavy = (mode, split) != ("exact", "qkv") and design.startswith(("blocked", "chunked", "paths"))
            yield pytest.param(mode, split, design, plan, id=f"{mode}-{split}-{design}",
                               marks=[pytest.mark.slow] if heavy else [])


@pytest.mark.parametrize("mode, split, design, plan", list(_cases()))
def test_every_gdn_design_reads_the_views_in_place_with_the_same_bits(monkeypatch, design, plan, mode, split):
    """split "qkv": q, k, v views of one projection (one row stride); "kv": q contiguous, k and v views of another
    (q's row stride apart from k's and v's)."""
    T = 40 if design.startswith(("blocked", "chunked")) else 9  # past one 16-row chunk for the blocked forms
    inp = _inputs(T)
    views = {"q": inp["q"], **split_views({n: inp[n] for n in split})}
    spies = [_bound(monkeypatch, m) for m in (triton_gdn, triton_wy_split, triton_wy_blocked)]
    kw = dict(parents=inp["parents"], initial_state=inp["pool"], state_indices=inp["slots"], mode=mode, poison=True)
    run, o_flat = plan({n: inp[n] for n in ("q", "k", "v", "g", "beta")}, kw)
    run()
    for spy in spies:
        spy.clear()
    run, o_views = plan({**views, "g": inp["g"], "beta": inp["beta"]}, kw)
    run()
    o_flat, o_views = (o[0] if isinstance(o, tuple) else o for o in (o_flat, o_views))
    assert torch.equal(o_views, o_flat), (design, mode, (o_views - o_flat).abs().max())
    launches = [k for spy in spies for k in spy]
    assert launches and all(k[n].data_ptr() == views[n].data_ptr() for k in launches for n in "qkv" if n in k)
    for s, n in (("QS", "q"), ("KS", "k"), ("VS", "v")):
        assert {k[s] for k in launches if s in k} <= {views[n].stride(1)}, (s, launches)
    assert any("VS" in k for k in launches)


def test_the_commit_reads_k_and_v_in_place_with_the_same_bits(monkeypatch):
    inp = _inputs(9)
    views = split_views({n: inp[n] for n in "qkv"})
    acc = on_device(torch.tensor([5, 8]))
    spy = _bound(monkeypatch, triton_commit)

    def commit(k, v):
        return gb.gdn_tree_commit(k, v, inp["g"], inp["beta"], parents=inp["parents"], accepted=acc,
                                  initial_state=inp["pool"], state_indices=inp["slots"], backend="triton")
    flat = commit(inp["k"], inp["v"])
    spy.clear()
    strided = commit(views["k"], views["v"])
    assert torch.equal(strided, flat)
    assert spy and spy[0]["k"].data_ptr() == views["k"].data_ptr() and spy[0]["KS"] == spy[0]["VS"] == views["k"].stride(1)
