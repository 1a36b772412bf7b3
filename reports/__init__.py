"""Audit reports: terminal summary, report.json (with its JSON Schema) and a self-contained HTML file."""
