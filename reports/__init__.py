"""Audit reports: terminal summary, report.json (with its JSON Schema) and a self-contained HTML file."""


def model_label(report: dict) -> str:
    """What was audited: the checkpoint directory, or the preset."""
    cfg = report["config"]
    return f"checkpoint {cfg['model_path']}" if cfg.get("model_path") else f"preset {cfg['preset']}"
