"""Tree convs in SGLang's calling convention that mishandle a padded row (slot -1, PAD_SLOT_ID, as SGLang pads a
CUDA-graph batch), for `ddsim check-kernel --op conv --convention sglang` to catch (tests/test_check_kernel.py).
Each wraps SGLang 0.5.23's own causal_conv1d_update (its source under .engines) and breaks one thing; SGLang's
verify rewrites the sequence's window slot, so a padded row that is not skipped writes somewhere."""


def _sglang_conv():
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    return causal_conv1d_update


def conv_pads_wrap_to_the_last_slot(x, conv_state, weight, bias=None, activation=None, *, conv_state_indices, **kw):
    """Slot -1 taken as Python takes an index: the padded row's window lands in the pool's last slot, another
    sequence's."""
    wrapped = conv_state_indices % conv_state.shape[0]
    return _sglang_conv()(x, conv_state, weight, bias, activation, conv_state_indices=wrapped, **kw)


def conv_pads_by_address(x, conv_state, weight, bias=None, activation=None, *, conv_state_indices, **kw):
    """Padding not recognised (another pad id): slot -1 goes into the address arithmetic, and the padded row's
    window is written a slot's worth before the pool."""
    return _sglang_conv()(x, conv_state, weight, bias, activation, conv_state_indices=conv_state_indices,
                          pad_slot_id=-2, **kw)


def conv_parent_table_as_a_chain(x, conv_state, weight, bias=None, activation=None, *, retrieve_parent_token=None,
                                 **kw):
    """SGLang's conv, its outputs right, but the parent table it fills for the verifies (retrieve_parent_token) made
    as a chain's, token t's parent t - 1, as SGLang's CPU fallback fills it: on a tree, each verify that reads it then
    runs the draft flattened (the leak) in its exact mode, while the conv's own outputs and windows stay right. Before
    check-kernel held the table to the tree's parents, it passed."""
    out = _sglang_conv()(x, conv_state, weight, bias, activation, retrieve_parent_token=retrieve_parent_token, **kw)
    if retrieve_parent_token is not None:
        import torch
        T = retrieve_parent_token.shape[1]
        retrieve_parent_token[:, 1:] = torch.arange(T - 1, dtype=retrieve_parent_token.dtype,
                                                    device=retrieve_parent_token.device)
    return out
