"""The simulator: acceptance (the greedy walk, seeded sampling), drafters (synthetic, trace replay, a draft
model), and whole speculative generations (draft, verify, accept, commit) next to autoregressive
decoding, stepped in lock step over prompts; phase timers stand beside the loop, not in it.
"""
