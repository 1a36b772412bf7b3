"""Tree attention's Triton kernel (gpu_backend.triton_attention; compiled on a GPU, interpreted on the CPU) against
the oracle's attention (oracle.model._attention_core, float64, one token per row over its visible context) on drawn
trees: each node attends the prefix rows its mask leaves visible (and, given a committed length, only those before it)
and its ancestors, itself last. Inputs untouched."""
import torch
from hypothesis import given
from hypothesis import strategies as st

import ddsim.gpu_backend as gb
from ddsim.model.config import get_preset
from ddsim.oracle.model import _attention_core
from ddsim.properties.kernel_checks import DEVICE
from ddsim.properties.strategies import trees


def _oracle(q, k, v, pk, pv, tree, visible, scale):
    """Row i over the visible prefix rows then its ancestors root..parent (padded, masked), and itself: float64."""
    rows = []
    for i in range(tree.size):
        anc = tree.root_path(i)[:-1]
        rows.append((torch.cat([pk[visible], k[anc]]), torch.cat([pv[visible], v[anc]])))
    m = max(r[0].shape[0] for r in rows)
    pad = lambda x: torch.cat([x, x.new_zeros(m - x.shape[0], *x.shape[1:])])  # noqa: E731
    ctx_k, ctx_v = torch.stack([pad(r[0]) for r in rows]), torch.stack([pad(r[1]) for r in rows])
    valid = torch.stack([torch.arange(m) < r[0].shape[0] for r in rows])
    cfg = get_preset("micro").replace(attention_scale=scale)
    out = _attention_core(cfg, q.double(), k.double(), v.double(), ctx_k.double(), ctx_v.double(), valid)
    return out.view(q.shape)


@given(tree=trees(max_size=40), P=st.integers(0, 40), heads=st.sampled_from([(1, 1), (4, 2), (6, 1)]),
       hd=st.sampled_from([16, 24, 64]), masked=st.booleans(), seed=st.integers(0, 2**16),
       committed=st.none() | st.integers(-2, 45))
def test_tree_attention_kernel_equals_the_oracle_on_drawn_trees(tree, P, heads, hd, masked, seed, committed):
    gen = torch.Generator().manual_seed(seed)
    (nh, nkv), T = heads, tree.size
    q, k, v = (torch.randn(T, n, hd, generator=gen) for n in (nh, nkv, nkv))
    pk, pv = torch.randn(P, nkv, hd, generator=gen), torch.randn(P, nkv, hd, generator=gen)
    visible = torch.rand(P, generator=gen) < 0.6 if masked else torch.ones(P, dtype=torch.bool)
    anc = torch.as_tensor(tree.ancestor_mask)
    mask = torch.cat([visible.expand(T, P), anc], 1) if masked else anc
    args = [x.to(DEVICE) for x in (q, k, v, pk, pv, mask)]
    before = [x.clone() for x in args]
    scale = 0.7 if seed % 2 else None
    # a committed length (a graph's fixed-capacity prefix): the rows at or past it are not visible, nor read
    rows = None if committed is None else torch.tensor(committed, device=DEVICE)
    got = gb.tree_attention(*args[:3], prefix_k=args[3], prefix_v=args[4], ancestor_mask=args[5], scale=scale,
                            prefix_rows=rows, glue="triton")
    if committed is not None:
        visible = visible & (torch.arange(P) < committed)
    want = _oracle(q, k, v, pk, pv, tree, visible, scale or hd ** -0.5)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(args, before))
