"""Fast paths for tree verification (SPEC 8). Each op has a plain twin in ``oracle/`` with the same
keyword-only signature.

Backends: ``torch_ops`` (pure PyTorch, batched over the tree; serves CPU users and is the default
everywhere in this release). Triton kernels for CUDA are a separate piece of work (issue 6).
"""
from gpu_backend.torch_ops import (
    conv_tree_commit,
    gdn_tree_commit,
    gdn_tree_verify,
    tree_attention,
    tree_causal_conv1d,
)

__all__ = ["gdn_tree_verify", "gdn_tree_commit", "tree_causal_conv1d", "conv_tree_commit", "tree_attention"]
