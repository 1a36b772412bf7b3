"""Audit reports: the typed report model (model.py), report.json (json_report.py, with the JSON
Schema generated from the model), a self-contained HTML file and the terminal summary."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddsim.verdict.report_model import Report


def precision_label(report: Report) -> str:
    """The arithmetic compared, e.g. 'bfloat16 fast path (float32 states) vs float32 oracle'."""
    p = report.precision
    products = " (bf16x3 products)" if p.oracle_products == "bf16x3" else ""
    return f"{p.fast_path} fast path ({p.recurrent_state} states) vs {p.oracle} oracle{products}"


def model_label(report: Report) -> str:
    """What was audited: the checkpoint directory, or the preset."""
    return report.provenance.source
