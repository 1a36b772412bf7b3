"""Verdicts: the typed report every reader shares (report_model: validated completely on load) and the gate
(TOML policies, built-in ones in policies/, the rules, their relaxations against the default policy).
The report's files, HTML and terminal views live in ddsim.reports.
"""
