"""The recurrent families at their models' serving shapes, every dimension at once, compiled, against the float64
oracle: GDN at Qwen3.6-27B's heads (H = 16 key heads, HV = 48 value heads, K = V = 128; also with its gates fused
from the raw projections and q, k, v split from one fused projection, as SGLang calls it, and in a batch padded as
SGLang pads a CUDA-graph replay: slot -1, a zero state, no slot written), KDA at Kimi Linear's (H = 32,
K = V = 128), lightning attention at MiniMax-Text-01's (H = 64, K = V = 128), Mamba1 at Jamba Mini 1.6's channels
(I = 8192, N = 16) and Mamba2 at Nemotron-H-8B's heads (H = 128, P = 64, N = 128, G = 8); GDN's and Mamba2's committed
states in a pool, read through shuffled slots and committed in place. DDTree trees of 16 to 257 nodes in batches of 1
to 32, bf16 inputs and fp32 states. The property suites draw small shapes; a fault that needs a serving width, a grid
of thousands of programs or a root path past one chunk shows here. (test_triton_kernels.py holds GDN's WY forms to
the same bar at full size, through design "auto" and each design at two sequences.)

Each call is a server's: the design the family's default takes for the batch (and each other design it can take), the
tree as a TreePlan, outputs NaN-poisoned, so every output of every head is checked written and finite; the inputs and
the committed states bit-identical after it; a second call on the same input bit-identical (the same plan, slots
and arguments: for GDN, what fastcall replays where its extension builds; benchmarks/serving_shape_replays.py counts it).
Heads (Mamba1: channels) never mix in these recurrences, so the oracle recomputes a fixed sample of them from the same
inputs: the first and the last, both sides of the middle and of the kernels' first tile, and some drawn at random
(GDN's value heads each with its key head). Bars: a bf16 output within 1.01x the error of rounding the oracle to bf16,
with at most 2% of its entries off the rounded oracle (serving_cases.OFF_ROUNDED_MAX); per-node and committed fp32
states within 5x float32's tolerance.

Without a GPU the same checks run at small shapes in Triton's interpreter (`make test-slow`); the serving shapes run
on a GPU only (benchmarks/RESULTS.md records them on an H200)."""
import pytest

from ddsim.properties.kernel_checks import DEVICE
from ddsim.properties.serving_cases import (
    COMMIT_SHAPES,
    DESIGN_SHAPES,
    EXACT_SHAPES,
    FAMILIES,
    LEAKY_SHAPES,
    STATE_SHAPES,
    check_commit,
    check_verify,
)

GPU_ONLY = pytest.mark.skipif(DEVICE != "cuda", reason="serving shapes run compiled (a GPU); small ones in the interpreter")


SERVING = [pytest.param(f, id=f) for f in FAMILIES]


@GPU_ONLY
@pytest.mark.parametrize("family", SERVING)
@pytest.mark.parametrize("B, T", EXACT_SHAPES)
def test_the_exact_verify_at_serving_shapes(family, B, T):
    check_verify(FAMILIES[family], B, T, mode="exact", backend="triton", states=False, dims="serving")


@GPU_ONLY
@pytest.mark.parametrize("family", SERVING)
@pytest.mark.parametrize("B, T", LEAKY_SHAPES)
def test_the_leaky_verify_at_serving_shapes(family, B, T):
    check_verify(FAMILIES[family], B, T, mode="leaky", backend="triton", states=False, dims="serving")


@GPU_ONLY
@pytest.mark.parametrize("family", SERVING)
@pytest.mark.parametrize("mode, B, T", STATE_SHAPES)
def test_per_node_states_at_serving_shapes(family, mode, B, T):
    check_verify(FAMILIES[family], B, T, mode=mode, backend="triton", states=True, dims="serving")


@GPU_ONLY
@pytest.mark.parametrize("family, backend", [(f.name, b) for f in FAMILIES.values() for b in f.designs[1:]])
@pytest.mark.parametrize("B, T", DESIGN_SHAPES)
def test_every_exact_design_at_serving_shapes(family, backend, B, T):
    check_verify(FAMILIES[family], B, T, mode="exact", backend=backend, states=False, dims="serving")


@GPU_ONLY
@pytest.mark.parametrize("family", SERVING)
@pytest.mark.parametrize("B, T", COMMIT_SHAPES)
def test_the_commit_at_serving_shapes(family, B, T):
    check_commit(FAMILIES[family], B, T, dims="serving")


SLOW = pytest.mark.slow if DEVICE == "cpu" else lambda f: f  # the interpreter is slow; compiled these take seconds


@SLOW
@pytest.mark.parametrize("family", SERVING)
@pytest.mark.parametrize("mode, design, states", [("exact", 0, False), ("leaky", 0, True), ("exact", -1, False)],
                         ids=["exact-default", "leaky-states", "exact-last-design"])
def test_the_same_checks_at_small_shapes(family, mode, design, states):
    """The checks above at small shapes (Mamba1's channels over two tiles, the second partial), every head sampled,
    also in Triton's interpreter (CI has no GPU): trees of 17 nodes in a batch of 2, and the commit."""
    fam = FAMILIES[family]
    check_verify(fam, 2, 17, mode=mode, backend=fam.designs[design], states=states, dims="small", seed=1)
    check_commit(fam, 2, 17, dims="small", seed=1)
