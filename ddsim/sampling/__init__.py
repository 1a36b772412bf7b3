"""Sampled tree verification (temperature > 0): the acceptance rules engines run, written as plain reference
functions over explicit random numbers (rules), a step's exact law under a rule (law), check-sampler's cases,
statistics and harness (cases, stats, check), SGLang's tensor convention (sglang_convention) and what
`check-sampler --impl` names (load).
"""
