"""A tree plan's tables built on the host in numpy (gpu_backend.host_tables, what TreePlan takes for parents on the
CPU: every CUDA-graph verify's tables) against their torch twins (gpu_backend.checks, what builds them on a GPU),
integer for integer, on drawn batches of trees in both source orders; and the root paths against each node's path
walked up its parents."""
import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ddsim.gpu_backend import checks, host_tables


@st.composite
def parent_batches(draw, max_batch: int = 3, max_nodes: int = 70) -> torch.Tensor:
    """[B, T] int64 parents: node 0 the root (-1), every other node's parent an earlier node (deep chains, wide
    stars and everything between)."""
    B, T = draw(st.integers(1, max_batch)), draw(st.integers(1, max_nodes))
    rows = []
    for _ in range(B):
        style = draw(st.sampled_from(["chain", "star", "random"]))
        row = [-1]
        for i in range(1, T):
            row.append(i - 1 if style == "chain" else 0 if style == "star" else draw(st.integers(0, i - 1)))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64)


@given(parents=parent_batches(), W=st.integers(2, 5), mode=st.sampled_from(checks.MODES))
def test_host_tables_equal_their_torch_twins(parents, W, mode):
    src = checks.mode_parents(parents, mode)
    want_conv = checks.conv_sources(src, W)
    got_conv = host_tables.conv_sources(src.numpy(), W)
    assert got_conv.dtype == np.int64 and np.array_equal(got_conv, want_conv.numpy())
    want_mask, want_depth = checks.ancestor_mask(src)
    got_mask, got_depth = host_tables.ancestor_mask(src.numpy())
    assert got_mask.dtype == np.int8 and np.array_equal(got_mask, want_mask.numpy()) and got_depth == want_depth
    got_paths = host_tables.root_paths(got_mask, got_depth)
    assert got_paths.dtype == np.int32 and np.array_equal(got_paths, checks.root_paths_of(want_mask, want_depth).numpy())


def test_host_tables_at_serving_shapes():
    """32 sequences of 129 and of 257 nodes (random trees, and chains as deep as the tree), conv window 4."""
    gen = torch.Generator().manual_seed(0)
    for T in (129, 257):
        rand = [torch.randint(0, max(i, 1), (32, 1), generator=gen) for i in range(1, T)]
        parents = torch.cat([torch.full((32, 1), -1), *rand], 1)
        parents[:4, 1:] = torch.arange(T - 1)  # four chains: depth T - 1
        for mode in checks.MODES:
            src = checks.mode_parents(parents, mode)
            assert np.array_equal(host_tables.conv_sources(src.numpy(), 4), checks.conv_sources(src, 4).numpy())
            mask, depth = host_tables.ancestor_mask(src.numpy())
            want_mask, want_depth = checks.ancestor_mask(src)
            assert np.array_equal(mask, want_mask.numpy()) and depth == want_depth == T - 1
            assert np.array_equal(host_tables.root_paths(mask, depth), checks.root_paths_of(want_mask, depth).numpy())


@given(parents=parent_batches(max_nodes=20), W=st.integers(2, 4))
def test_a_plan_on_the_cpu_serves_the_host_tables_as_a_gpu_plan_serves_its_own(parents, W):
    """TreePlan's tables for parents on the CPU (numpy) are what the torch builders give: int32 contiguous conv
    tables, int8 masks with the same depth, and the root paths derived from them."""
    plan = checks.TreePlan(parents)
    for mode in checks.MODES:
        conv = plan.conv_table(mode, W)
        assert conv.dtype == torch.int32 and conv.is_contiguous()
        assert torch.equal(conv, checks.conv_sources(plan.src(mode), W).to(torch.int32))
        mask, depth = plan.ancestors(mode)
        want_mask, want_depth = checks.ancestor_mask(plan.src(mode))
        assert mask.dtype == torch.int8 and torch.equal(mask, want_mask) and depth == want_depth
    paths = plan.root_paths()  # each node's row: its ancestors-or-self in node order, -1 padded
    for b in range(plan.B):
        for i in range(plan.T):
            path, n = [], i
            while n >= 0:
                path.append(n)
                n = int(parents[b, n])
            row = paths[b, i].tolist()
            assert row[:len(path)] == path[::-1] and all(x == -1 for x in row[len(path):])


def _assert_one_tree_equals_the_batch_builders(parents: list[int], width: int, W: int) -> None:
    """one_tree's mask and depth, its root paths padded to ``width`` columns, and path_conv_sources' window-W
    sources against the batch builders on the one tree ``parents``."""
    src = np.asarray([parents])
    mask, depth = host_tables.ancestor_mask(src)
    got_mask, got_depth, paths = host_tables.one_tree(parents, width)
    assert got_mask.dtype == np.int8 and np.array_equal(got_mask, mask[0]) and got_depth == depth
    assert paths.dtype == np.int32 and paths.shape == (len(parents), width)
    assert np.array_equal(paths[:, :depth + 1], host_tables.root_paths(mask, depth)[0])
    assert (paths[:, depth + 1:] == -1).all()
    conv = host_tables.path_conv_sources(paths, W)
    assert conv.dtype == np.int32 and np.array_equal(conv, host_tables.conv_sources(src, W)[0])


@given(parents=parent_batches(max_batch=1, max_nodes=70), W=st.integers(2, 5), extra=st.integers(0, 3))
def test_one_tree_tables_equal_the_batch_builders(parents, W, extra):
    """host_tables.one_tree (what a graph's StaticPlan refills every step) against the batch builders on one tree:
    the same mask and depth, the root paths padded to any width past the depth, and the conv sources read off
    the paths (path_conv_sources); a width the deepest path does not fit is refused."""
    _, depth = host_tables.ancestor_mask(parents.numpy())
    _assert_one_tree_equals_the_batch_builders(parents[0].tolist(), depth + 1 + extra, W)
    with pytest.raises(ValueError, match="width"):
        host_tables.one_tree(parents[0].tolist(), depth)


def test_one_tree_tables_at_serving_shapes():
    """129 and 257 nodes: random trees and a chain as deep as the tree, conv window 4."""
    gen = torch.Generator().manual_seed(1)
    for T in (129, 257):
        for parents in ([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)],
                        [-1] + list(range(T - 1))):
            _assert_one_tree_equals_the_batch_builders(parents, T, 4)


_SEEDED = torch.Generator().manual_seed(7)  # a random tree of 70 nodes: three programs' blocks of 32


@pytest.mark.interpreter
@given(parents=parent_batches(max_batch=1, max_nodes=70), W=st.integers(2, 6), spare=st.integers(0, 3),
       which=st.sets(st.sampled_from(["src", "anc", "mask", "paths", "conv"]), min_size=1))
@example(parents=torch.tensor([[-1] + [int(torch.randint(0, i, (1,), generator=_SEEDED)) for i in range(1, 70)]]), W=4,
         spare=1, which={"src", "anc", "mask", "paths", "conv"})
@example(parents=torch.tensor([[-1] + list(range(69))]), W=6, spare=0, which={"paths", "conv"})  # a chain: paths of
# up to 70 nodes turned root first over three chunks of columns, the last block's walk 70 steps
def test_the_device_builder_writes_the_host_tables(parents, W, spare, which):
    """gpu_backend.triton_tables (here in Triton's interpreter) against host_tables.one_tree and path_conv_sources,
    integer for integer: any subset of the tables, paths wider than the tree is deep (spare columns), conv windows
    longer than the paths; every output written over (they start as garbage)."""
    pytest.importorskip("triton")
    from ddsim.gpu_backend import triton_tables
    par = parents[0]
    mask, depth, paths = host_tables.one_tree(par.tolist(), int(checks.ancestor_mask(parents)[1]) + 1 + spare)
    width = paths.shape[1]
    want = dict(src=par.numpy(), anc=mask, mask=mask.view(bool), paths=paths,
                conv=host_tables.path_conv_sources(paths, W))
    out = {k: torch.full(want[k].shape, 7, dtype=torch.from_numpy(want[k]).dtype) for k in which}
    triton_tables.tree_tables(par, width=width, **out)
    for k, v in out.items():
        assert np.array_equal(v.numpy(), want[k]), k


def test_the_device_builder_refuses_a_table_of_another_shape_in_one_line():
    pytest.importorskip("triton")
    from ddsim.gpu_backend import triton_tables
    par = torch.tensor([-1, 0, 1])
    for bad, match in ((dict(anc=torch.zeros(3, 2, dtype=torch.int8)), "anc: expected"),
                       (dict(paths=torch.zeros(3, 4, dtype=torch.int64)), "paths: expected"),
                       (dict(mask=torch.zeros(3, 3, dtype=torch.int8)), "mask: expected")):
        with pytest.raises(ValueError, match=match):
            triton_tables.tree_tables(par, width=4, **bad)
    with pytest.raises(ValueError, match="parents: expected int64"):
        triton_tables.tree_tables(par.int(), width=4, src=torch.zeros(3, dtype=torch.int64))
