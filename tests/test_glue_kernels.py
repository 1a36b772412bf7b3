"""The layers' glue kernels (gpu_backend.triton_norms, here in Triton's interpreter) against their PyTorch
twins (torch_ops: what the CPU runs, and what the model ran on CUDA before), and the model on either glue.

The twins round every intermediate to the activations' dtype at the same points, so in fp32 they agree to
the fp32 sums' order and in 16 bits an output may sit one unit in the last place apart where the fp32 value
before rounding lies on a rounding midpoint (a few entries in a thousand at most). The 16-bit cases run in fp16
here: Triton's interpreter converts to bf16 wrongly (73% of one RMSNorm's outputs off); bf16 is held to the same
bar on the GPU (properties/test_glue_gpu.py)."""
import pytest
import torch
import torch.nn.functional as F

import ddsim.gpu_backend as gb
from ddsim.measure.compare import assert_close
from ddsim.model.config import get_preset
from ddsim.model.model import HybridModel
from ddsim.model.weights import init_weights
from ddsim.properties.kernel_checks import assert_rounding_twins
from ddsim.trees.builders import ddtree
from ddsim.trees.tree import Tree

pytest.importorskip("triton")


def _rand(*shape, dtype, scale=1.0, gen):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_with_and_without_the_residual_add_equals_its_twin(dtype):
    gen = torch.Generator().manual_seed(1)
    x, res = _rand(5, 80, dtype=dtype, scale=3.0, gen=gen), _rand(5, 80, dtype=dtype, gen=gen)
    w = _rand(80, dtype=dtype, gen=gen)
    keep = x.clone(), res.clone(), w.clone()
    assert_rounding_twins(gb.rms_norm(x, w, eps=1e-6, glue="triton"), gb.rms_norm(x, w, eps=1e-6), dtype)
    (out, h), (out_ref, h_ref) = (gb.rms_norm(x, w, eps=1e-6, residual=res, glue=g) for g in ("triton", "torch"))
    assert torch.equal(h, h_ref)  # the residual sum is one rounding of an exact fp32 sum: bit for bit
    assert_rounding_twins(out, out_ref, dtype)
    for a, b in zip((x, res, w), keep):  # the inputs untouched
        assert torch.equal(a, b)


@pytest.mark.interpreter
def test_rms_norm_reads_strided_rows_and_heads_and_promotes_like_pytorch():
    gen = torch.Generator().manual_seed(2)
    wide = _rand(4, 3 * 32 + 7, dtype=torch.float16, gen=gen)
    x = wide[:, 7:]  # a column slice: rows 103 apart
    w = _rand(32, dtype=torch.float16, gen=gen)
    heads = x.view(4, 3, 32)
    assert_rounding_twins(gb.rms_norm(heads, w, eps=1e-5, glue="triton"), gb.rms_norm(heads, w, eps=1e-5), torch.float16)
    w32 = torch.randn(32, generator=gen)  # 16-bit rows times an fp32 weight: an fp32 product, as in PyTorch
    got, want = gb.rms_norm(heads, w32, eps=1e-5, glue="triton"), gb.rms_norm(heads, w32, eps=1e-5)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gated_rms_norm_equals_its_twin_on_a_strided_gate(dtype):
    gen = torch.Generator().manual_seed(3)
    N, HV, V = 6, 3, 16
    x = _rand(N, HV, V, dtype=dtype, scale=2.0, gen=gen)
    wide = _rand(N, HV * V + 5, dtype=dtype, scale=3.0, gen=gen)
    z = wide[:, :HV * V]  # the GEMM output's first columns
    w = _rand(V, dtype=dtype, gen=gen)
    assert_rounding_twins(gb.gated_rms_norm(x, w, z, eps=1e-6, glue="triton"), gb.gated_rms_norm(x, w, z, eps=1e-6), dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rot", [16, 64])
def test_the_per_head_norm_and_rope_in_one_kernel_equal_their_twin(dtype, rot):
    """q [n, heads, 64] normed per head, then its first rot dims rotated at each row's position (partial RoPE, as
    Qwen3.5's 64 of 256, and whole); read from a column slice (q of a wider projection)."""
    gen = torch.Generator().manual_seed(9)
    n, HN, D = 5, 3, 64
    wide = _rand(n, HN * D + 8, dtype=dtype, scale=2.0, gen=gen)
    x = wide[:, 8:].view(n, HN, D)
    w = _rand(D, dtype=dtype, gen=gen)
    ang = torch.arange(n)[:, None] * 0.3 ** torch.arange(rot // 2)[None, :]
    cos, sin = (torch.cat([f(ang), f(ang)], -1).to(dtype) for f in (torch.cos, torch.sin))
    got = gb.rms_norm_rope(x, w, cos, sin, eps=1e-6, glue="triton")
    assert_rounding_twins(got, gb.rms_norm_rope(x, w, cos, sin, eps=1e-6), dtype)
    assert torch.equal(got, gb.rms_norm_rope(x.contiguous(), w, cos, sin, eps=1e-6, glue="triton"))
    # every other head of a wider view (rows and heads each at their own stride), read in place
    every = _rand(n, 2 * HN * D, dtype=dtype, scale=2.0, gen=gen).view(n, 2 * HN, D)[:, 1::2]
    assert torch.equal(gb.rms_norm_rope(every, w, cos, sin, eps=1e-6, glue="triton"),
                       gb.rms_norm_rope(every.contiguous(), w, cos, sin, eps=1e-6, glue="triton"))
    with pytest.raises(ValueError, match="cos, sin"):
        gb.rms_norm_rope(x, w, cos[:, :-1], sin[:, :-1], eps=1e-6, glue="triton")


@pytest.mark.interpreter
@pytest.mark.parametrize("act", ["silu", "gelu", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gated_act_equals_its_twin(act, dtype):
    """GELU's share of flipped roundings is taken where gate > -2 (there 1 + erf(gate / sqrt 2) > 0.045, and an
    erf's few-ulp error moves the act by under 1e-5 of itself); below, where the two erfs lose digits, within
    the bound alone (the kernel differs from PyTorch's there on 3-6% of all entries, by the CPU's erf)."""
    gen = torch.Generator().manual_seed(4)
    g, u = _rand(7, 300, dtype=dtype, scale=4.0, gen=gen), _rand(7, 300, dtype=dtype, gen=gen)
    gelu = act == "gelu"
    got = gb.gated_act(g, u, act=act, glue="triton")
    assert_rounding_twins(got, gb.gated_act(g, u, act=act), dtype, atol=1e-5 if gelu else 1e-7,
                          counted=g > -2 if gelu else None)
    # the gate a column slice of a wider projection (as gated attention's), read in place: the same bits
    wide = torch.cat([_rand(7, 40, dtype=dtype, gen=gen), g], 1)
    assert torch.equal(gb.gated_act(wide[:, 40:], u, act=act, glue="triton"), got)
    assert torch.equal(gb.gated_act(wide[:, 40:].reshape(7, 2, 150)[:, 1], u[:, 150:], act=act, glue="triton"),
                       got[:, 150:])
    # rows wider than a program's block of columns (1024): each row in three programs, the last one part-masked
    g3, u3 = _rand(3, 2500, dtype=dtype, scale=4.0, gen=gen), _rand(3, 2500, dtype=dtype, gen=gen)
    got3 = gb.gated_act(g3, u3, act=act, glue="triton")
    assert_rounding_twins(got3, gb.gated_act(g3, u3, act=act), dtype, atol=1e-5 if gelu else 1e-7,
                          counted=g3 > -2 if gelu else None)
    assert torch.equal(got3[1], gb.gated_act(g3[1:2], u3[1:2], act=act, glue="triton")[0])


@pytest.mark.interpreter
@pytest.mark.parametrize("beta_scale", [1.0, 2.0])
def test_gdn_gates_equal_their_twin_over_softplus_whole_range(beta_scale):
    """a from -60 to 60: softplus's tail (where log(1 + e) alone loses the digits), its middle and its
    linear part past 20; read from one [a | b] GEMM output, as the model does."""
    gen = torch.Generator().manual_seed(5)
    N, HV = 40, 6
    ab = torch.empty(N, 2 * HV)
    ab[:, :HV] = torch.linspace(-60, 60, N * HV).view(N, HV)
    ab[:, HV:] = torch.randn(N, HV, generator=gen) * 5
    ab = ab.to(torch.float16)
    A, bias = -torch.rand(HV, generator=gen) * 4, torch.randn(HV, generator=gen)
    kw = dict(A=A, dt_bias=bias, beta_scale=beta_scale)
    (g, beta), (g_ref, beta_ref) = (gb.gdn_gates(ab[:, :HV], ab[:, HV:], glue=x, **kw) for x in ("triton", "torch"))
    assert g.dtype == beta.dtype == torch.float32
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=0)  # relative even where g is 1e-26
    torch.testing.assert_close(beta, beta_ref, rtol=1e-6, atol=0)


def _tree_mask(T: int, gen) -> torch.Tensor:
    """A random tree's ancestor mask [T, T] (node i's parent drawn among 0..i-1)."""
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]
    return torch.from_numpy(Tree(parent, list(range(T))).ancestor_mask)


@pytest.mark.interpreter
@pytest.mark.parametrize("P", [0, 3, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tree_attention_equals_its_twin_over_prefix_and_ancestors(dtype, P):
    """Grouped queries (4 heads over 2 key-value heads) over a prefix of P rows and a random tree of 21 nodes (two
    row blocks), head_dim 24 (not a power of two), q, k, v read in place from one wider projection; the prefix
    stored in fp32 (rounded to the queries' dtype, as the twin does); the mask [T, T] and [T, P + T] with some
    prefix rows masked out, as a fixed-capacity prefix's unused rows are."""
    gen = torch.Generator().manual_seed(10 + P)
    T, nh, nkv, hd = 21, 4, 2, 24
    wide = _rand(T, (nh + 2 * nkv) * hd + 8, dtype=dtype, scale=1.5, gen=gen)
    q = wide[:, :nh * hd].view(T, nh, hd)
    k = wide[:, nh * hd:(nh + nkv) * hd].view(T, nkv, hd)
    v = wide[:, (nh + nkv) * hd:(nh + 2 * nkv) * hd].view(T, nkv, hd)
    pk, pv = torch.randn(P, nkv, hd, generator=gen) * 1.5, torch.randn(P, nkv, hd, generator=gen)
    anc = _tree_mask(T, gen)
    keep = torch.rand(P, generator=gen) < 0.7
    for mask in (anc, torch.cat([keep.expand(T, P), anc], 1)):
        got = gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask, glue="triton")
        want = gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask)
        if dtype == torch.float32:  # fp32's tolerance at the output's size: the exps and sums of two libraries
            assert_close("tree attention", got, want)  # (an entry of 0.014 moved 1.5e-6 under AVX2's exp)
        else:  # one rounding of the same fp32 value summed in another order: a flip on a few entries
            assert_rounding_twins(got, want, dtype, scale=want.float().abs())
    # a scale of the caller's (MLA's, MiniMax's) and a prefix the mask leaves out whole: the tree alone
    got = gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=torch.cat([torch.zeros(T, P, dtype=torch.bool), anc], 1),
                            scale=0.3, glue="triton")
    want = gb.tree_attention(q, k, v, prefix_k=pk[:0], prefix_v=pv[:0], ancestor_mask=anc, scale=0.3)
    if dtype == torch.float32:
        assert_close("tree attention, prefix masked out", got, want)
    else:  # as above: a flipped rounding moves a cancelled entry (-4.7e-4) by its ulp, measured at the rms size
        assert_rounding_twins(got, want, dtype, scale=want.float().abs())


@pytest.mark.interpreter
def test_tree_attention_reads_the_prefix_up_to_its_committed_length():
    """A fixed-capacity prefix (70 rows, three 32-row blocks of the kernel) with its committed length as a device
    scalar, as a graph keeps it: the kernel reads no row at or past it. Against the twin (which masks them out), and
    bit for bit against the same kernel given the mask alone (the rows it skips were masked: nothing they add); the
    length at a block's edge, inside one, 0, past the capacity and negative (clamped to [0, P])."""
    gen = torch.Generator().manual_seed(11)
    T, nh, nkv, hd, P = 21, 4, 2, 24, 70
    q, k, v = (_rand(T, n, hd, dtype=torch.float32, scale=1.5, gen=gen) for n in (nh, nkv, nkv))
    pk, pv = torch.randn(P, nkv, hd, generator=gen) * 1.5, torch.randn(P, nkv, hd, generator=gen)
    anc = _tree_mask(T, gen)
    for n in (32, 33, 63, 0, 70, 90, -3):
        rows = torch.tensor(n)
        seen = torch.arange(P) < max(0, min(n, P))
        mask = torch.cat([seen.expand(T, P), anc], 1)
        got = gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask, prefix_rows=rows, glue="triton")
        assert torch.equal(got, gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask,
                                                  glue="triton")), n
        assert_close(f"tree attention, {n} prefix rows", got,
                     gb.tree_attention(q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=mask, prefix_rows=rows))
        # the length alone hides the rows past it, in both (the mask leaving every prefix row visible)
        full = torch.cat([torch.ones(T, P, dtype=torch.bool), anc], 1)
        for glue in ("triton", "torch"):
            assert_close(f"tree attention, {n} prefix rows, {glue}", gb.tree_attention(
                q, k, v, prefix_k=pk, prefix_v=pv, ancestor_mask=full, prefix_rows=rows, glue=glue), got)


@pytest.mark.interpreter
def test_tree_attention_refuses_in_one_line():
    q, kv, m = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8), torch.ones(3, 3, dtype=torch.bool)
    pre = torch.zeros(2, 2, 8)
    for bad, match in ((dict(ancestor_mask=torch.ones(3, 4, dtype=torch.bool)), "ancestor_mask"),
                       (dict(ancestor_mask=m.float()), "ancestor_mask"),
                       (dict(ancestor_mask=torch.ones(3, 6, dtype=torch.bool)[:, ::2]), "ancestor_mask: expected contiguous rows"),
                       (dict(k=torch.zeros(3, 3, 8), v=torch.zeros(3, 3, 8)), "nkv"),
                       (dict(k=kv.half()), "q, k, v"),
                       (dict(q=torch.zeros(8, 4, 3).transpose(0, 2)), "contiguous last dim"),
                       (dict(prefix_rows=2), "prefix_rows: expected an int32 or int64 tensor of one element, got int"),
                       (dict(prefix_rows=torch.tensor([1, 2])), "prefix_rows"),
                       (dict(prefix_rows=torch.tensor(1.0)), "prefix_rows")):
        args = {**dict(q=q, k=kv, v=kv, prefix_k=pre, prefix_v=pre, ancestor_mask=m), **bad}
        with pytest.raises(ValueError, match=match):
            gb.tree_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args, glue="triton")
    # the torch glue refuses the mask and prefix_rows alike: a float mask there was SDPA's additive mask (1.0 or 0.0
    # added to the scores), so every node attended every other, a wrong output rather than a refusal
    for bad in (dict(ancestor_mask=m.float()), dict(ancestor_mask=m.int()), dict(ancestor_mask=torch.ones(3, 4, dtype=torch.bool)),
                dict(prefix_rows=torch.tensor(1.0))):
        args = {**dict(prefix_k=pre, prefix_v=pre, ancestor_mask=m), **bad}
        with pytest.raises(ValueError, match="ancestor_mask|prefix_rows"):
            gb.tree_attention(q, kv, kv, **args, glue="torch")


@pytest.mark.interpreter
def test_glue_refuses_what_it_cannot_compute_in_one_line():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="last dim must be contiguous"):
        gb.rms_norm(x.t(), torch.ones(4), eps=1e-6, glue="triton")
    with pytest.raises(ValueError, match="weight: expected"):
        gb.rms_norm(x, torch.ones(5), eps=1e-6, glue="triton")
    with pytest.raises(ValueError, match="one dtype"):
        gb.gated_rms_norm(x.view(4, 2, 4), torch.ones(4), x.to(torch.bfloat16), eps=1e-6, glue="triton")
    with pytest.raises(ValueError, match="act"):
        gb.gated_act(x, x, act="relu", glue="triton")
    with pytest.raises(ValueError, match="glue"):
        gb.rms_norm(x, torch.ones(8), eps=1e-6, glue="cuda")


@pytest.mark.interpreter
def test_the_model_on_the_triton_glue_equals_the_model_on_pytorchs():
    """A whole verify (norms, residual adds, GDN gates and gated norm, MLP activations) through the glue
    kernels against the same model on PyTorch's ops, the recurrences on PyTorch in both (fp32)."""
    cfg = get_preset("micro")
    w = init_weights(cfg, seed=0)
    ref = HybridModel(cfg, w, backend="torch")
    fused = HybridModel(cfg, w, backend="torch", glue="triton")
    assert ref.glue == "torch" and fused.glue == "triton"
    state, _ = ref.prefill([1, 2, 3, 4])
    tree = ddtree(torch.randn(3, cfg.vocab_size, generator=torch.Generator().manual_seed(0)) * 3, 8, root_token=5)
    for keep in (True, False):
        a, b = ref.verify(state, tree, keep_states=keep), fused.verify(state, tree, keep_states=keep)
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="glue"):
        HybridModel(cfg, w, glue="cuda")


@pytest.mark.interpreter
def test_a_gated_attention_model_with_qk_norms_and_partial_rope_on_the_triton_glue():
    """Qwen3.5's attention features (per-head q/k norms and partial RoPE in one kernel each, the sigmoid-gated
    output) through the glue kernels against PyTorch's ops (fp32)."""
    cfg = get_preset("micro").replace(qk_norm=True, attn_output_gate=True, partial_rotary_factor=0.5)
    w = init_weights(cfg, seed=1)
    ref, fused = HybridModel(cfg, w, backend="torch"), HybridModel(cfg, w, backend="torch", glue="triton")
    state, _ = ref.prefill([1, 2, 3, 4])
    tree = ddtree(torch.randn(3, cfg.vocab_size, generator=torch.Generator().manual_seed(1)) * 3, 8, root_token=5)
    a, b = ref.verify(state, tree, keep_states=False), fused.verify(state, tree, keep_states=False)
    torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)


def test_the_model_picks_pytorchs_glue_on_the_cpu_and_where_the_fast_path_is_pytorchs():
    cfg = get_preset("micro")
    w = init_weights(cfg, seed=0)
    assert HybridModel(cfg, w).glue == "torch"
    assert HybridModel(cfg, w, backend="triton").glue == "torch"  # no CUDA here


def test_the_residual_add_and_post_norm_fused_equal_the_two_steps():
    """The layer's `h + out` then norm, as one call with residual=: the same h, bit for bit, on the CPU path."""
    gen = torch.Generator().manual_seed(6)
    h, out, w = (torch.randn(3, 32, generator=gen).to(torch.bfloat16) for _ in range(3))  # PyTorch's path: bf16 holds
    xn, h2 = gb.rms_norm(out, w, eps=1e-6, residual=h)
    assert torch.equal(h2, h + out)
    assert torch.equal(xn, F.rms_norm((h + out).float(), (32,), eps=1e-6).to(torch.bfloat16) * w)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=pytest.mark.interpreter), "torch"])
@pytest.mark.parametrize("windows", [False, True])
def test_the_conv_writes_its_channel_groups_apart_each_contiguous(backend, windows):
    """split=(c1, c2, c3): GDN's q, k, v out of the tree conv as three tensors, from the Triton kernel each
    contiguous (no copy before the WY kernels), each equal to its columns of the whole output; channel blocks that straddle the groups' ends
    included (130 channels in blocks of 128, groups of 40, 70 and 20); the windows as without split."""
    gen = torch.Generator().manual_seed(8)
    B, T, C, W = 2, 6, 130, 4
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 0, 4]])
    x, weight = torch.randn(B, T, C, generator=gen), torch.randn(C, W, generator=gen)
    win0 = torch.randn(B, C, W - 1, generator=gen)
    kw = dict(weight=weight, parents=parents, initial_window=win0, output_windows=windows, backend=backend)
    whole, parts = gb.tree_causal_conv1d(x, **kw), gb.tree_causal_conv1d(x, split=(40, 70, 20), **kw)
    if windows:
        (whole, win), (parts, win_split) = whole, parts
        assert torch.equal(win, win_split)
    assert len(parts) == 3
    for part, cols in zip(parts, whole.split([40, 70, 20], -1)):
        assert torch.equal(part, cols)
        assert part.is_contiguous() == (backend == "triton")  # PyTorch's: views of the whole (what the CPU computed before)
    with pytest.raises(ValueError, match="split"):
        gb.tree_causal_conv1d(x, split=(40, 70, 21), **kw)
    with pytest.raises(ValueError, match="split: expected three"):  # either backend: the kernel writes three
        gb.tree_causal_conv1d(x, split=(60, 70), **kw)


@pytest.mark.interpreter
@pytest.mark.parametrize("preset", ["gated", "micro", "tiny-kimi", "micro-lfm2"])
def test_projections_laid_side_by_side_make_one_gemm_and_the_same_verify(preset, monkeypatch):
    """lay_projections (what a model on CUDA does when made): attention's q, k, v and output gate, and GDN's z, a,
    b, each layer's as one weight (views of it, the caller's dict too, so none is held twice) and one GEMM, whose
    column slices the norms, RoPE, gates, attention and gated activation read in place. The serving and per-node
    verifies, the prefill and a batched decode equal the unlaid model's within fp32 rounding (the laid GEMM may sum
    a column in another order), on both glues; MLA's attention (tiny-kimi) lays nothing."""
    cfg = (get_preset("micro").replace(qk_norm=True, attn_output_gate=True, partial_rotary_factor=0.5)
           if preset == "gated" else get_preset(preset))
    w = init_weights(cfg, seed=1)
    groups = {"attn": "kimi" not in preset, "gdn": True}
    want_laid = sum(groups[g] and all(f"layers.{i}.{n}" in w for n in names[:2])
                    for i in range(cfg.num_layers) for g, names in (("attn", ("attn.q", "attn.k")),
                                                                    ("gdn", ("gdn.z", "gdn.a"))))
    assert (want_laid == 0) == (preset == "tiny-kimi")
    gemms = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **kw: gemms.append(1) or linear(*a, **kw))
    tree = ddtree(torch.randn(3, cfg.vocab_size, generator=torch.Generator().manual_seed(0)) * 3, 8, root_token=5)
    for glue in ("torch", "triton"):
        ref = HybridModel(cfg, w, backend="torch", glue=glue)
        shared = dict(w)
        laid = HybridModel(cfg, shared, backend="torch", glue=glue)
        assert laid.lay_projections(shared) == want_laid and laid.lay_projections(shared) == 0  # once
        for k in laid.w:
            assert torch.equal(laid.w[k], w[k]) and shared[k] is laid.w[k]
        for (p, _), (fused, _) in laid._laid.items():  # the weights are views of the laid one
            assert any(laid.w[k].data_ptr() == fused.data_ptr() for k in laid.w if k.startswith(p))
        state, _ = ref.prefill([1, 2, 3, 4])
        state2, logits2 = laid.prefill([1, 2, 3, 4])
        torch.testing.assert_close(logits2, ref.prefill([1, 2, 3, 4])[1], rtol=1e-5, atol=1e-5)
        for keep in (True, False):
            gemms.clear()
            a = ref.verify(state, tree, keep_states=keep)
            n_ref = len(gemms)
            gemms.clear()
            b = laid.verify(state, tree, keep_states=keep)
            assert n_ref - len(gemms) == sum(
                {"attn": 2 + cfg.attn_output_gate, "gdn": 1 if glue == "triton" else 2}[g] for _, g in laid._laid)
            torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
            for x, y in zip(b.kv, a.kv):
                assert (x is None) == (y is None)
                if x is not None:
                    torch.testing.assert_close(x[0], y[0], rtol=1e-5, atol=1e-5)
                    torch.testing.assert_close(x[1], y[1], rtol=1e-5, atol=1e-5)
        got, _ = laid.decode_rows([state, state], [5, 6])
        torch.testing.assert_close(got, ref.decode_rows([state, state], [5, 6])[0], rtol=1e-5, atol=1e-5)
