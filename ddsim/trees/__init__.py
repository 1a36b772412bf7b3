"""Trees: the one tree representation (parents in topological order plus tokens, everything else derived),
the builders (DDTree's best-first construction, chains, static and random trees), the verify modes'
names and the seeded draws every random choice goes through. No torch model here: the simulator, the
model and the engines build on it.
"""
