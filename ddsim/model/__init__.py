"""The hybrid model: its configuration and presets, random weights, the per-layer recurrent state, the
fast-path model (verify in every mode, commit, prefill, the batched decode), CUDA graphs of the serving
verify, layer placement over GPUs, and real checkpoints (GDN and Mamba2 hybrids, loaded shard by shard)
with their tokenizer and chat template. The exact oracle lives apart, in ddsim.oracle.
"""
