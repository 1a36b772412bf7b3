"""The WY launchers never launch a 16-wide V tile at a block of 64 rows or more (_common.MIN_V_TILE_64): compiled for
sm_90 such a launch takes wgmma of N = 8, and on an H100 the one-kernel form's read 256 bytes past shared memory (an
illegal address, or NaN outputs: benchmarks/wy_fault_probe.py, RESULTS.md). Planned on the
CPU, nothing launched: every design at 37 and 65 nodes (one block) and 100 (past it), V of 4 and 16, bf16 and fp32,
a V tile asked for or not; Mamba2's SSD kernel's P tile at a block of 64 rows asked for (block_i) too. With the old
least width (16) planted the rule fails, so the test can."""
import pytest
import torch

from ddsim.gpu_backend import _common, triton_gdn, triton_mamba2, triton_wy_blocked, triton_wy_split

# planned on CPU tensors (the launch plans' device tables run in Triton's interpreter): skipped where Triton compiles
pytestmark = pytest.mark.interpreter
GOT: list[dict] = []


@pytest.fixture
def planned(monkeypatch):
    """The keyword arguments of each launch the WY plans bind (nothing launched)."""
    GOT.clear()

    def bind(kernel, grid, kw):
        GOT.append(dict(kw, kernel=kernel))
        return lambda: None
    for m in (triton_gdn, triton_wy_split, triton_wy_blocked, triton_mamba2):
        monkeypatch.setattr(m, "bind", bind)
    return GOT


def _plan(T: int, V: int, dtype: torch.dtype, design: str, **kw) -> None:
    B, H, HV, K = 1, 1, 2, 4
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    parents = torch.tensor([[-1] + list(range(T - 1))])
    triton_gdn.plan_wy(q, k, v, -torch.rand(B, T, HV), torch.rand(B, T, HV), parents=parents,
                       initial_state=torch.zeros(B, HV, K, V), design=design, poison=False, **kw)


CASES = [(T, V, dtype, design) for T in (37, 65, 100) for V in (4, 16) for dtype in (torch.float32, torch.bfloat16)
         for design in ("fused", "split", "fold", "head", "auto")]


def _tiles(planned, T, V, dtype, design, **kw) -> list[tuple[int, int]]:
    planned.clear()
    _plan(T, V, dtype, design, **kw)
    return [(g["BT"], g["BV"]) for g in planned if "BT" in g and "BV" in g]


@pytest.mark.parametrize("T,V,dtype,design", CASES)
def test_no_launch_takes_a_16_wide_v_tile_at_64_rows(planned, T, V, dtype, design):
    tiles = _tiles(planned, T, V, dtype, design)
    assert tiles, "no WY launch with a block and a V tile was planned"
    assert any(bt >= 64 for bt, _ in tiles), tiles  # the rule is exercised: a 64-row block was planned
    assert all(bv >= 32 for bt, bv in tiles if bt >= 64), tiles
    assert all(bv == 16 for bt, bv in tiles if bt < 64), tiles  # smaller blocks keep V's own tile


def test_a_16_wide_tile_asked_for_at_64_rows_is_widened_and_a_wider_one_kept(planned):
    assert {bv for bt, bv in _tiles(planned, 37, 128, torch.float32, "fused", block_v=16) if bt >= 64} == {32}
    assert {bv for bt, bv in _tiles(planned, 37, 128, torch.float32, "fused", block_v=64) if bt >= 64} == {64}
    assert {bv for bt, bv in _tiles(planned, 17, 128, torch.float32, "fused", block_v=16)} == {16}


def test_the_old_least_width_planted_breaks_the_rule(planned, monkeypatch):
    monkeypatch.setattr(_common, "MIN_V_TILE_64", 16)
    tiles = _tiles(planned, 37, 4, torch.float32, "fused")
    assert (64, 16) in tiles, tiles


def _ssd_tiles(planned, block_i: int, P: int, **kw) -> list[tuple[int, int]]:
    planned.clear()
    Bn, T, H, G, N = 1, 40, 2, 1, 4
    gen = torch.Generator().manual_seed(0)
    triton_mamba2.plan_ssd(torch.randn(Bn, T, H, P, generator=gen), torch.rand(Bn, T, H, generator=gen),
                           -torch.rand(H, generator=gen), torch.randn(Bn, T, G, N, generator=gen),
                           torch.randn(Bn, T, G, N, generator=gen), parents=torch.tensor([[-1] + list(range(T - 1))]),
                           initial_state=torch.zeros(Bn, H, P, N), block_i=block_i, poison=False, **kw)
    return [(g["BI"], g["BP"]) for g in planned if "BP" in g]


def test_mamba2_ssds_p_tile_is_at_least_32_at_64_rows_and_its_own_below(planned):
    """Compiled for sm_90 at block_i 64 and 8 warps, a 16-wide P tile takes the N = 8 wgmma layouts of the faulting
    GDN launch; 32-wide, N = 16 and 32. The default block_i, 32, compiles to mma.sync and keeps P's own tile."""
    assert _ssd_tiles(planned, 64, 4, num_warps=8) == [(64, 32)]
    assert _ssd_tiles(planned, 64, 64) == [(64, 64)]
    assert _ssd_tiles(planned, 32, 4) == [(32, 16)]
    assert _ssd_tiles(planned, 64, 4, block_p=16) == [(64, 32)]
