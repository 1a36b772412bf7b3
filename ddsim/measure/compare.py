"""The one comparison helper: max abs error and relative errors per named tensor, with tolerances
from one per-dtype table. Tests and the audit's noise-floor figures use the same numbers."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# dtype -> (atol, rtol): ok when max|a - ref| <= atol + rtol * max|ref|.
# Rows are for one op (a layer); whole-model comparisons use the MODEL_SLACK multiple.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-9),
    torch.float32: (1e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}
MODEL_SLACK = 20.0  # errors compound over layers and through softmax / norms


def rel_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref||_F / ||ref||_F (0 when both are zero, inf when only ref is)."""
    a, ref = a.double(), ref.double()
    num = torch.linalg.vector_norm(a - ref).item()
    den = torch.linalg.vector_norm(ref).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


@dataclass
class Comparison:
    name: str
    max_abs: float
    rel_fro: float
    bound: float
    ok: bool

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        return (f"{self.name}: max abs {self.max_abs:.3e} (bound {self.bound:.3e}), "
                f"relative {self.rel_fro:.3e} -> {verdict}")


def compare(name: str, actual: torch.Tensor, expected: torch.Tensor, *, dtype: torch.dtype | None = None,
            slack: float = 1.0) -> Comparison:
    """Compare ``actual`` (a fast path, in ``dtype``) with ``expected`` (the oracle)."""
    if tuple(actual.shape) != tuple(expected.shape):
        return Comparison(name, float("inf"), float("inf"), 0.0, False)
    atol, rtol = TOLERANCES[dtype or actual.dtype]
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    finite = bool(torch.isfinite(a).all())
    max_abs = (a - e).abs().max().item() if a.numel() and finite else (0.0 if finite else float("inf"))
    bound = slack * (atol + rtol * (e.abs().max().item() if e.numel() else 0.0))
    return Comparison(name, max_abs, rel_error(a, e) if finite else float("inf"), bound, finite and max_abs <= bound)


def assert_close(name: str, actual, expected, *, dtype=None, slack: float = 1.0) -> Comparison:
    c = compare(name, actual, expected, dtype=dtype, slack=slack)
    if not c.ok:
        raise AssertionError(str(c))
    return c


def assert_per_node_close(got, want, recurrent_layers, *, msg: str = "", **tol) -> None:
    """Two verify results with per-node states (ddsim.model.model.VerifyResult) equal within ``tol``
    (torch.testing.assert_close's rtol and atol): logits, hidden states, and every recurrent layer's
    per-node states and conv windows."""
    pairs = [("logits", got.logits, want.logits), ("hidden", got.hidden, want.hidden)]
    pairs += [(f"layer {i} {name}", g[i], w[i]) for i in recurrent_layers
              for name, g, w in (("states", got.ssm, want.ssm), ("windows", got.conv, want.conv))]
    for name, g, w in pairs:
        torch.testing.assert_close(g, w, **tol, msg=lambda s, name=name: f"{msg}{name}: {s}")
