"""Kernels right on every fresh call and wrong as a server runs them: on the same tensors step after step, the
step's values written into them (a CUDA graph's static inputs), or replayed from a CUDA graph captured on another
step. check-kernel's replayed examples (kernel_cases.replayed) catch them; before those, each got a green verdict
(tests/test_graph_replay.py)."""

from tests.planted_kernels import _verify


def kept_by_identity():
    """A launcher's table derived from a tensor (here its copy), kept in a single entry by the tensor's identity, as
    fla's ``tensor_cache`` keeps its last result (``a is b``): right for a new tensor, the first copy again for the
    same tensor with new values. Each call makes a cache of its own."""
    last = {}

    def kept(t):
        if last.get("arg") is not t:
            last.update(arg=t, out=t.clone())
        return last["out"]
    return kept


_tree_table = kept_by_identity()  # [B, T]: a table derived from the tree (SGLang's retrieve_* tables, a plan)


def tree_kept_by_tensor(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact", scale=None):
    """Keeps the table it derives from the tree by the parents tensor's identity: a server that hands it the same
    parents tensor each step (its CUDA graph's input) gets the first step's tree every step. Captured on a chain, an
    exact verify then runs every branching tree flattened: the leak."""
    return _verify(q, k, v, g, beta, parents=_tree_table(parents), initial_state=initial_state,
                   state_indices=state_indices, mode=mode, scale=scale)


def _sglang_verify():
    from ddsim.engines.sglang import _kernel
    return _kernel()[0]


_parent_table = kept_by_identity()


def sglang_parent_table_kept_by_tensor(*args, retrieve_parent_token=None, **kw):
    """SGLang's GDN verify behind a launcher that keeps retrieve_parent_token by the tensor's identity (SGLang's
    convention): in exact mode the first step's tree on every replay."""
    table = None if retrieve_parent_token is None else _parent_table(retrieve_parent_token)
    return _sglang_verify()(*args, retrieve_parent_token=table, **kw)


def sizes_its_launch_on_the_host(q, k, v, g, beta, *, parents, initial_state, state_indices=None, mode="exact",
                                 scale=None):
    """Reads the tree's depth on the host to size its launch (a sync): right on every eager call, and on a GPU not
    capturable in a CUDA graph, so a server that replays its verify from graphs cannot run it."""
    if parents.is_cuda:
        int(parents.max())  # a host read: refused while a stream is being captured
    return _verify(q, k, v, g, beta, parents=parents, initial_state=initial_state, state_indices=state_indices,
                   mode=mode, scale=scale)
