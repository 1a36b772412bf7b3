"""Audit reports: terminal summary, report.json (with its JSON Schema) and a self-contained HTML file."""


def precision_label(report: dict) -> str:
    """The arithmetic compared, e.g. 'bfloat16 fast path (float32 states) vs float32 oracle'."""
    p = report["precision"]
    return f"{p['fast_path']} fast path ({p['recurrent_state']} states) vs {p['oracle']} oracle"


def model_label(report: dict) -> str:
    """What was audited: the checkpoint directory, or the preset."""
    cfg = report["config"]
    return f"checkpoint {cfg['model_path']}" if cfg.get("model_path") else f"preset {cfg['preset']}"
