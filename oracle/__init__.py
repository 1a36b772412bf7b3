"""The exact sequential reference. Plain float64 code, one token at a time along each node's own
root path. It shares no code with ddsim's fast paths or gpu_backend; only data (configs, weights,
trees' parent arrays) crosses over.

Layer-level twins of the gpu_backend kernels (same keyword-only signatures, README, Contracts: kernel interface):
  gdn_tree_verify, gdn_tree_commit, mamba2_tree_verify, mamba2_tree_commit, mamba1_tree_verify,
  mamba1_tree_commit, lightning_tree_verify, lightning_tree_commit, kda_tree_verify, kda_tree_commit,
  tree_causal_conv1d, conv_tree_commit
Model level: decode_step, prefill, verify_tree, verify_trees (several prompts' trees at once)
A layer oracle's product with a row of its inputs (C . S, S^T q, S^T k) is an elementwise product summed by torch,
never BLAS's dot or gemv: MKL rounds those by their operands' addresses (AVX-512: nearly a third of 3-element dots differ
in the last bit when the vector sits one element further on), so a sequence's outputs would depend on its row in
the batch, and a node would not equal its history verified alone bit for bit (properties/test_oracle.py).
(default_dtype: float64 on the CPU, float32 on a GPU; takes_bf16_products: whether a float32 oracle takes its
products by bf16 weights (PRODUCT_WEIGHTS) unconverted, in three bf16 parts of the other operand).
"""
from ddsim.oracle.conv import conv_tree_commit, tree_causal_conv1d
from ddsim.oracle.gdn import gdn_tree_commit, gdn_tree_verify
from ddsim.oracle.kda import kda_tree_commit, kda_tree_verify
from ddsim.oracle.lightning import lightning_tree_commit, lightning_tree_verify
from ddsim.oracle.mamba1 import mamba1_tree_commit, mamba1_tree_verify
from ddsim.oracle.mamba2 import mamba2_tree_commit, mamba2_tree_verify
from ddsim.oracle.model import (
    PRODUCT_WEIGHTS,
    OracleResult,
    decode_step,
    default_dtype,
    prefill,
    takes_bf16_products,
    verify_tree,
    verify_trees,
)

__all__ = ["gdn_tree_verify", "gdn_tree_commit", "mamba2_tree_verify", "mamba2_tree_commit", "mamba1_tree_verify",
           "mamba1_tree_commit", "lightning_tree_verify", "lightning_tree_commit", "kda_tree_verify", "kda_tree_commit",
           "tree_causal_conv1d", "conv_tree_commit",
           "decode_step", "prefill", "verify_tree", "verify_trees", "OracleResult", "default_dtype", "takes_bf16_products",
           "PRODUCT_WEIGHTS"]
