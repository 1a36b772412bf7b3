"""CUDA graphs for the serving verify and its commit: a tree's pass through the whole model, and the
commit of its accepted path, replayed rather than launched op by op from Python; and for the verify
that keeps every node's states (what the audit's leak metrics read).

``GraphedModel(model)`` verifies as ``model.verify(..., keep_states=False)`` does (no per-node states;
the commit replays the accepted path through the commit kernels) with the whole pass captured once
per key and replayed for every later tree of that key. The key is (mode, nodes T, the doubling
rounds of the WY solve, which the tree's depth sets, the KV prefix capacity, whether per-node states
are kept): attention reads the
committed prefix from fixed buffers of that capacity (a power of two, at least 256 rows) with the
rows past the prefix masked out, so a growing prefix changes the key only when it crosses a power
of two.

What a replay reads it reads at fixed addresses, refilled before each replay: the tree's tokens,
positions, ancestor mask and index tables (a ``StaticPlan``, built on the host from the tree's
parents and copied in), the committed recurrent states and conv windows, the KV prefix. Each key has
its own memory pool, so no two keys share memory; within a key a replay reuses the buffers of the
previous one, so a result's KV and commit inputs are valid until the next verify of its key:
``VerifyResult.fresh`` says so and the commit refuses a stale result (logits are copied out).
``verify(..., keep_states=True)`` replays the verify with per-node states: one graph per T for every
mode (key ("any", T, 1, capacity, True); a prefix past its capacity replaces it by a larger one, a
shorter prefix runs in it), captured with the parent-indexed
kernels (each node reads its source's stored state) and refilled per verify with the mode's source
tables (a leaky recurrence or conv reads the previous node instead of the parent, as
``AnyModePlan`` maps them). ``verify_modes(state, tree, modes=...)`` replays the same verify for
several modes in one pass (key ("any", k x T, k, capacity, True) for k modes): the tree copied k times
side by side, each copy with its mode's tables and its own attention block, so the model's weights
are read once for the k modes instead of k times; at full size each copy's per-node states are ~10 GB
(what the audit's oracle batches leave room for). Per-node states, windows and hidden states are read
in place (not copied), valid while the result is fresh, i.e. until the next verify with states of
the same key: measure a result, and commit it, before verifying the next tree. Its commit copies the
accepted node's state as the model's does.

Attention over a fixed-capacity prefix sums the same terms as over the prefix alone but the
reduction may group them differently: a replay equals the eager serving verify within float32
rounding, not bit for bit. ``capture=False`` runs the same buffers, tables and masks eagerly (no
graph): the CPU tests check that machinery against ``model.verify``; properties/test_cuda_graphs.py
checks the replays on a GPU.
"""
from __future__ import annotations

import contextlib
import gc
import math

import numpy as np
import torch

import ddsim.gpu_backend as gb
from ddsim.errors import InputError
from ddsim.gpu_backend import host_tables
from ddsim.gpu_backend._common import interpreting
from ddsim.model import slabs
from ddsim.model.model import _LAYER_MODES, HybridModel, LayerOutputs, PrefixMask, Rope, VerifyResult
from ddsim.model.state import ModelState
from ddsim.trees.tree import Tree, chain

MIN_PREFIX_CAPACITY = 256
PREFILL_GRAPH_NODES = 65  # longer prefills run eagerly (GraphedModel.prefill)
CAPTURE_BLAS = "cublaslt"  # capture_blas: None keeps torch's choice


def wy_rounds(depth: int) -> int:
    """Doubling rounds of the WY solve for a tree of this depth (what the kernel is specialised on)."""
    return max(0, math.ceil(math.log2(max(depth, 1))))


def _check_rounds(depth: int, captured: int) -> None:
    """A tree of ``depth`` into a plan whose ancestor mask was first built at depth ``captured``: the same number of
    WY rounds (the kernels are specialised on it), or one line."""
    if wy_rounds(depth) != wy_rounds(captured):
        raise InputError(f"tree: depth {depth} needs {wy_rounds(depth)} WY rounds, this plan was captured for "
                         f"{wy_rounds(captured)}")


def copies_per_replay(modes: int, max_copies: int | None) -> int:
    """The group size verify_modes replays ``modes`` modes in: as few groups as ``max_copies`` (None: no
    limit) allows, of one size (one key), as even as they can be: 4 modes at most 3 a replay go 2 + 2."""
    most = modes if max_copies is None else max(1, min(max_copies, modes))
    groups = -(-modes // most)
    return -(-modes // groups)


# whether a graph's tree attention reads only the committed rows of its fixed-capacity prefix (PrefixMask), not
# every row up to the capacity (the benchmarks turn it off to time both in one run; the same outputs)
ATTEND_COMMITTED_ROWS = True
# whether a serving key's exact-mode tables (ancestor mask, root paths, conv sources, source parents, and the
# attention's mask) are built on the device from the copied parents, in the graph (gpu_backend.triton_tables),
# instead of on the host and copied in every step (the host's part of a whole verify 0.22 -> 0.10 ms at 65 nodes on
# the H200, profile_verify.py --variants; its replays are tested in properties/test_cuda_graphs.py and, uncaptured,
# on the CPU). The benchmarks turn it off to time both in one run.
DEVICE_TABLES = True


def prefix_capacity(P: int) -> int:
    """KV rows a graph keeps for a committed prefix of P tokens: a power of two >= max(P, 256)."""
    return max(MIN_PREFIX_CAPACITY, 1 << max(P - 1, 0).bit_length())


class StaticPlan(gb.TreePlan):
    """A TreePlan for one sequence of T nodes whose tables live in fixed device buffers. ``load(tree)``
    builds the tree's tables on the host (from its parents, which a Tree validates when it is made) and copies
    them into the buffers,
    so a graph captured against this plan reads the current tree's tables. Tables are allocated on
    first use, which must come before capture (a warm-up run does it).

    Trees up to ``max_depth`` deep fit: root paths are padded to max_depth + 1 entries (-1).
    ``ancestors(mode)`` reports the depth of the first tree it was built for: kernels read it only as
    their number of doubling rounds, which must not change (``load`` checks it)."""

    def __init__(self, T: int, device, max_depth: int):
        self.B, self.T, self.max_depth = 1, T, max_depth
        self.parents = torch.zeros(1, T, dtype=torch.long, device=device)
        self.device = self.parents.device  # "cuda" resolved to its index, as the layers' tensors report it
        self._cache = {}
        self._host = None
        self._tree = self._tables = None  # the loaded tree's parents; its exact-mode tables (host_tables.one_tree)
        self._parents_host = None  # [1, T] int64 on the host: the loaded tree's parents
        self.on_device = False  # build_on_device fills the exact tables from the parents: load copies only those

    def load(self, tree: Tree) -> None:
        if tree.size != self.T:
            raise InputError(f"tree: {tree.size} nodes, this plan holds {self.T}")
        if int(tree.depths.max()) > self.max_depth:
            raise InputError(f"tree: depth {int(tree.depths.max())}, this plan holds trees up to {self.max_depth}")
        # a Tree's parents were validated when it was made (0 <= parent < node, the root's -1): the exact tables are
        # built from them directly; a TreePlan on the host (the batch builders) only for another mode's tables
        self._tree, self._tables, self._host = tree.parents, None, None
        self._parents_host = torch.from_numpy(np.asarray(tree.parents, dtype=np.int64))[None]  # [1, T]
        if self.on_device:
            self._load_parents(tree)
            return
        news = {key: self._host_value(key) for key in self._cache}  # every check before the first copy
        for key, new in news.items():
            if key[0] == "anc":
                _check_rounds(new[1], self._cache[key][1])
        self.parents.copy_(self._parents_host, non_blocking=True)
        for key, new in news.items():
            if key[0] == "anc":
                self._cache[key][0].copy_(new[0], non_blocking=True)
            else:
                self._cache[key].copy_(new, non_blocking=True)

    def _load_parents(self, tree: Tree) -> None:
        """load() with the exact tables built on the device (on_device): the WY rounds checked from the tree's depth,
        the parents copied; the other modes' tables (the batch order's: the same for every tree of T nodes) kept."""
        depth = int(tree.depths.max())
        for key, value in self._cache.items():
            if key == ("anc", "exact"):
                _check_rounds(depth, value[1])
            if key[0] != "paths" and key[1] not in ("exact", "leaky"):
                raise RuntimeError(f"StaticPlan: table {key} cannot be kept from tree to tree")
        self.parents.copy_(self._parents_host, non_blocking=True)

    def build_on_device(self, mask: torch.Tensor | None = None) -> None:
        """The loaded tree's exact tables (those made so far) and ``mask`` [T, T] bool (its ancestor mask, for
        attention) from the parents on the device (gpu_backend.triton_tables): what a captured graph starts with."""
        from ddsim.gpu_backend import triton_tables
        c = self._cache
        exact_conv = [v for k, v in c.items() if k[0] == "conv" and k[1] == "exact"]
        width = self.max_depth + 1
        anc = c.get(("anc", "exact"))
        triton_tables.tree_tables(self.parents[0], width=width, src=c.get(("src", "exact")),
                                  anc=None if anc is None else anc[0], mask=mask, paths=c.get(("paths",)),
                                  conv=exact_conv[0] if exact_conv else None)
        for conv in exact_conv[1:]:  # another conv width: a launch of its own
            triton_tables.tree_tables(self.parents[0], width=width, conv=conv)

    def _exact_tables(self) -> tuple[np.ndarray, int, np.ndarray]:
        """The loaded tree's exact-mode tables, (int8 [T, T] ancestor-or-self mask, depth, int32 [T, max_depth + 1]
        root paths): one pass over the tree (host_tables.one_tree), once a load."""
        if self._tree is None:
            raise RuntimeError("StaticPlan: load a tree before use")
        if self._tables is None:
            self._tables = host_tables.one_tree(self._tree, self.max_depth + 1)
        return self._tables

    def tree_mask(self) -> np.ndarray:
        """[T, T] bool: the loaded tree's ancestor-or-self mask (Tree.ancestor_mask), the exact tables' own (the
        captured verify's attention mask takes it too)."""
        return self._exact_tables()[0].view(bool)

    def _host_plan(self) -> "gb.TreePlan":
        """The loaded tree's parents as a host TreePlan (its other modes' tables), built once a load."""
        if self._host is None:
            self._host = gb.TreePlan(self._parents_host)
        return self._host

    def _host_value(self, key):
        if key == ("src", "exact"):
            return self._parents_host
        if key[0] == "paths" and key[1:]:  # another mode's root paths (the recurrent verify's paths kernel)
            return self._host_plan().root_paths(key[1])
        if key[0] != "paths" and key[1] != "exact":  # another mode's sources: the batch builders
            h = self._host_plan()
            if key[0] == "src":
                return h.src(key[1])
            return h.conv_table(key[1], key[2]) if key[0] == "conv" else h.ancestors(key[1])
        mask, depth, paths = self._exact_tables()  # [T, T], int, [T, max_depth + 1]
        if key[0] == "conv":
            return torch.from_numpy(host_tables.path_conv_sources(paths, key[2]))[None]
        if key[0] == "anc":
            return torch.from_numpy(mask)[None], depth
        return torch.from_numpy(paths)[None]

    def _cached(self, key, build):
        if key not in self._cache:
            if self._host is None and self._tree is None:
                raise RuntimeError("StaticPlan: load a tree before use")
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"StaticPlan: table {key} first asked for during capture (warm up first)")
            value = self._host_value(key)
            if key[0] == "anc":
                self._cache[key] = (value[0].to(self.device), value[1])
            else:
                self._cache[key] = value.to(self.device)
        return self._cache[key]


class AnyModePlan(StaticPlan):
    """A StaticPlan for the verify with per-node states in any mode: the kernels run their exact
    (parent-indexed) form and ask for the "exact" tables, and get the current mode's instead, the
    recurrence's source parents as ``src`` and the conv's as ``conv_table`` (``load(tree, modes)``
    refills both). Other tables (ancestor masks, root paths: the snapshot-free kernels') are refused.

    With ``copies`` > 1 the plan holds that many copies of one tree side by side, a forest of
    T = copies x n nodes: copy c's nodes are c*n .. c*n + n - 1, its root reads the committed state
    and window (source -1), and its sources are its own mode's, offset into the copy. So one pass
    verifies the tree in every mode of ``load``'s ``modes`` at once."""

    def __init__(self, T: int, device, copies: int = 1):
        super().__init__(T, device, T - 1)
        self.copies = copies
        self._src = self._conv_src = None  # host [1, T] the forest's recurrence and conv sources
        self.serves_paths = False  # the recurrent verify runs its serial kernel on these sources

    def load(self, tree: Tree, modes=("exact",)) -> None:
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
        if len(modes) != self.copies:
            raise InputError(f"modes: {len(modes)} given, this plan holds {self.copies} copies of the tree")
        if tree.size * self.copies != self.T:
            raise InputError(f"tree: {tree.size} nodes x {self.copies} copies, this plan holds {self.T} nodes")
        host = gb.TreePlan(torch.tensor(tree.parents)[None])  # validated on the host, no device sync
        n = tree.size

        def forest(source) -> torch.Tensor:  # [1, T]: each copy's sources (``source(mode)``), offset into it
            cols = []
            for c, m in enumerate(modes):
                s = host.src(source(m))[0]  # [n], -1 at the root
                cols.append(torch.where(s >= 0, s + c * n, s))
            return torch.cat(cols)[None]

        self._host = host
        self._conv_src, self._src = forest(lambda m: _LAYER_MODES[m][0]), forest(lambda m: _LAYER_MODES[m][1])
        self.parents.copy_(forest(lambda m: "exact"), non_blocking=True)  # the forest's own parents
        for key, value in self._cache.items():
            value.copy_(self._host_value(key), non_blocking=True)

    def _host_value(self, key):
        if key[0] == "src":
            return self._src
        if key[0] == "conv":
            return gb.checks.conv_sources(self._conv_src, key[2]).to(torch.int32).contiguous()
        raise RuntimeError(f"AnyModePlan: table {key[0]!r} asked for; it serves source and conv tables only")


class _Prefix:
    """The KV prefix at a fixed capacity: per attention layer (K, V) [capacity, nkv, hd] in the
    state's dtype, and the committed length as a device scalar (rows past it are masked out, and tree attention
    reads none of them: PrefixMask)."""

    def __init__(self, model: HybridModel, capacity: int):
        cfg = model.cfg
        self.capacity = capacity
        # each device's layers' K (and V) rows of one slab [layers, capacity, nkv, hd]: a state committed by
        # HybridModel.commit holds its KV as such slabs, copied in with one launch each (slabs)
        L, attn = cfg.num_layers, cfg.attention_layers
        shape, d = (lambda i: (capacity, cfg.num_key_value_heads, cfg.head_dim)), (lambda i: model.layer_devices[i])
        self.keys = slabs.zeros(L, attn, shape, dtype=model.state_dtype, device=d)
        self.values = slabs.zeros(L, attn, shape, dtype=model.state_dtype, device=d)
        self.kv = [None if k is None else (k, v) for k, v in zip(self.keys, self.values)]
        self.length = torch.zeros((), dtype=torch.long, device=model.device)
        self.rows = torch.arange(capacity, device=model.device)
        self.resident = None  # the state whose prefix the buffers hold (states are never written in place)

    def load(self, state: ModelState) -> None:
        if state is self.resident:
            return
        self.resident = state
        for side, buffers in enumerate((self.keys, self.values)):  # the state's P rows: [P, nkv, hd] a layer
            slabs.load(buffers, [None if kv is None else kv[side] for kv in state.kv], rows=state.pos)
        self.length.fill_(state.pos)


class _Epoch:
    """VerifyResult.fresh of a replayed result: true until its key's next verify."""

    def __init__(self, captured: "_Captured"):
        self.captured, self.epoch = captured, captured.epoch

    def __call__(self) -> bool:
        return self.captured.epoch == self.epoch


class _Captured:
    """One key: its plans (the tree's, and the batch order's for leaky sources), input buffers,
    graphs, static outputs and memory pool."""

    def __init__(self, model: HybridModel, key: tuple, prefix: _Prefix, pool):
        mode, T, rounds, _, keep_states = key
        dev = model.device
        self.T, self.prefix, self.pool, self.keep_states = T, prefix, pool, keep_states
        if keep_states:  # the parent-indexed kernels, reading the refilled modes' source tables (rounds: copies)
            self.mode, self.plan = "exact", AnyModePlan(T, dev, copies=rounds)
        else:
            self.mode = mode
            self.plan = StaticPlan(T, dev, 2 ** rounds if _LAYER_MODES[mode][1] == "exact" else T - 1)
        self.chain = None  # the batch order's plan, for a serving key's leaky commit replay
        if not keep_states:
            self.chain = StaticPlan(T, dev, T - 1)
            self.chain.load(Tree(range(-1, T - 1), range(T)))
        self.tokens = torch.zeros(T, dtype=torch.long, device=dev)
        self.positions = torch.zeros(T, dtype=torch.long, device=dev)
        self.mask = torch.zeros(T, T, dtype=torch.bool, device=dev)
        self.accepted = torch.zeros(1, dtype=torch.long, device=dev)
        # the exact tables and the attention mask built in the graph from the parents (DEVICE_TABLES; a serving key
        # on a device the Triton kernels run on)
        triton = model.backend != "torch" if dev.type == "cuda" else model.backend == "triton" and interpreting()
        self.device_tables = DEVICE_TABLES and not keep_states and triton
        self.plan.on_device = self.device_tables
        self.verify_graph = self.commit_graph = None
        self.logits = self.out = self.committed = self.hidden = None
        self.epoch = 0

    def release(self) -> None:
        """Let the verify's outputs go (a warm-up's, before the capture makes the graph's own)."""
        self.logits = self.out = self.hidden = None

    def load(self, tree: Tree, state: ModelState, modes: tuple) -> None:
        """The tree (copied once per mode of ``modes``, side by side, with per-node states; else its one
        mode's) into the fixed buffers, and the state's KV prefix."""
        k = len(modes)
        if self.keep_states:
            self.plan.load(tree, modes)
        else:
            self.plan.load(tree)
        self.tokens.copy_(torch.from_numpy(np.tile(np.asarray(tree.tokens, dtype=np.int64), k)), non_blocking=True)
        self.positions.copy_(torch.from_numpy(np.tile(tree.positions(state.pos), k)), non_blocking=True)
        # [n, n] -> the copies' block diagonal [k n, k n]; one mode's is the plan's own, built in its load (or in the
        # graph from the parents: device_tables)
        if not self.device_tables:
            mask = tree.ancestor_mask if self.keep_states else self.plan.tree_mask()
            self.mask.copy_(torch.from_numpy(mask if k == 1 else np.kron(np.eye(k, dtype=bool), mask)),
                            non_blocking=True)
        self.prefix.load(state)


class GraphedModel:
    """``model`` with its verify and commit replayed from CUDA graphs (see the module docstring);
    ``verify`` keeps no per-node states unless asked, ``commit`` takes its results (and the model's),
    prefill and the rest are the model's. A drop-in for ``model`` in ddsim.sim.generate."""

    def __init__(self, model: HybridModel, *, capture: bool = True):
        cfg = model.cfg
        why = not_capturable(model, capture=capture)
        if why:
            raise InputError(f"cuda graphs: {why}")
        self.model, self.cfg, self.capture = model, cfg, capture
        self._keys: dict = {}
        self._prefixes: dict = {}
        # committed recurrent states and windows at fixed addresses, shared by every key: each verify
        # and each commit copies its state in before it replays (replays run one after another)
        # (like layers rows of one slab: a state committed here, itself slabs, is copied in one launch a group)
        L, rec, dt = cfg.num_layers, cfg.recurrent_layers, model.state_dtype
        self._ssm = slabs.zeros(L, rec, cfg.state_shape, dtype=dt, device=lambda i: model.device)
        self._conv = slabs.zeros(L, rec, cfg.window_shape, dtype=dt, device=lambda i: model.device)
        self._resident = None  # the state the buffers hold (states are never written in place)
        self._decode = None  # the decode key (ddsim.model.decode): its buffers and graph
        self.decode_graphs = True
        self.max_copies = None  # verify_modes: the most modes side by side in one replay (None: every mode)
        self.blas = CAPTURE_BLAS  # the BLAS library the graphs' GEMMs are chosen from (capture_blas)

    def __getattr__(self, name):  # empty_state, cfg, device, ... are the model's
        return getattr(self.model, name)

    def prefill(self, tokens, state: ModelState | None = None) -> tuple[ModelState, torch.Tensor]:
        """The model's prefill (``tokens`` as one chain, all committed) as a server runs it, without
        per-node states (the model's own keeps every node's state): chains of up to
        PREFILL_GRAPH_NODES tokens (a drafter's shadow context, a short prompt) replayed from graphs,
        one key per length; longer ones (a long prompt, once) by the eager serving verify and commit,
        so they leave no graph and no memory pool behind."""
        state = state or self.model.empty_state()
        if len(tokens) == 0:
            return state, torch.zeros(0, self.cfg.vocab_size)
        tree = chain(list(tokens))
        if len(tokens) > PREFILL_GRAPH_NODES:
            res = self.model.verify(state, tree, mode="exact", keep_states=False)
            return self.model.commit(state, tree, res, len(tree) - 1), res.logits
        res = self.verify(state, tree, mode="exact")
        return self.commit(state, tree, res, len(tree) - 1), res.logits

    def key(self, state: ModelState, tree: Tree, mode: str, keep_states: bool = False, *, copies: int = 1) -> tuple:
        """(mode, T, WY rounds of the recurrence's source order, KV prefix capacity, keep_states); with
        per-node states ("any", copies x T, copies, capacity, True): one graph for every mode (or, with
        ``copies`` > 1, every tuple of that many modes, side by side), no WY solve."""
        if keep_states:
            return "any", copies * tree.size, copies, prefix_capacity(state.pos), True
        depth = int(tree.depths.max()) if _LAYER_MODES[mode][1] == "exact" else tree.size - 1
        return mode, tree.size, wy_rounds(depth), prefix_capacity(state.pos), False

    def captured(self) -> list[tuple]:
        """The keys whose verify graph exists (or, uncaptured, that ran)."""
        return sorted(k for k, c in self._keys.items() if c.out is not None)

    # ---- verify --------------------------------------------------------------------------------
    def verify(self, state: ModelState, tree: Tree, *, mode: str = "exact", keep_states: bool = False,
               **kw) -> VerifyResult:
        if kw:
            raise InputError("cuda graphs: verify takes the tree's own positions and mask (use the model itself "
                             "otherwise)")
        self.model.check_tree(state, tree, mode)
        cap = self._replay(state, tree, (mode,), keep_states)
        out = cap.out
        if cap.keep_states:
            return VerifyResult(mode, cap.logits.clone(), cap.hidden, list(out.ssm), list(out.conv), list(out.kv),
                                None, _Epoch(cap))
        return VerifyResult(mode, cap.logits.clone(), None, None, None, list(out.kv), list(out.commit_inputs),
                            _Epoch(cap))

    def verify_modes(self, state: ModelState, tree: Tree, *, modes):
        """``verify(state, tree, mode=m, keep_states=True)`` for each m of ``modes`` (distinct), in order, as
        few replays as ``max_copies`` allows: the tree's copies side by side, one per mode (a forest of
        k x T nodes: each copy's root reads the committed state, its recurrence and conv read its mode's
        sources, its attention sees the prefix and its own ancestors), so the weights are read once per
        replay, not once per mode. The modes go in groups of equal size (one key), at most max_copies each
        (None: all at once), each replayed when its first result is asked for: an iterator. Each result is
        its copy's rows of the key's buffers (logits copied out), fresh until the key's next verify (the
        next group's, or the next tree's): measure them, and commit one, before asking for the next.
        Every mode is checked first. HybridModel.verify_modes verifies them one by one."""
        modes = self.model.check_modes(state, tree, modes)
        size = copies_per_replay(len(modes), self.max_copies)
        return (r for lo in range(0, len(modes), size) for r in self._side_by_side(state, tree, modes[lo:lo + size]))

    def _side_by_side(self, state: ModelState, tree: Tree, modes: tuple) -> list[VerifyResult]:
        """One replay of ``tree`` in each of ``modes`` (checked), its results per copy."""
        cap = self._replay(state, tree, modes, True)
        out, n, fresh = cap.out, tree.size, _Epoch(cap)
        logits = cap.logits.clone()
        results = []
        for c, m in enumerate(modes):
            rows = slice(c * n, (c + 1) * n)
            cut = [None if x is None else x[rows] for x in out.ssm], [None if x is None else x[rows] for x in out.conv]
            kv = [None if x is None else (x[0][rows], x[1][rows]) for x in out.kv]
            results.append(VerifyResult(m, logits[rows], cap.hidden[:, rows], *cut, kv, None, fresh))
        return results

    def _replay(self, state: ModelState, tree: Tree, modes: tuple, keep_states: bool) -> "_Captured":
        """The verify of ``tree`` from ``state`` in ``modes`` (one, or with per-node states several side by
        side) replayed under its key (captured on first use): its _Captured, outputs filled."""
        m = self.model
        key = self.key(state, tree, modes[0], keep_states, copies=len(modes))
        if keep_states:
            key = self._states_key(key)
        cap = self._keys.get(key)
        if cap is None:
            prefix = self._prefixes.get(key[3]) or self._prefixes.setdefault(key[3], _Prefix(m, key[3]))
            cap = self._keys[key] = _Captured(m, key, prefix, torch.cuda.graph_pool_handle() if self.capture else None)
        cap.load(tree, state, modes)
        self._load_state(state)
        self._run(cap, "verify_graph", lambda: self._verify_body(cap), release=cap.release)
        cap.epoch += 1
        return cap

    def _states_key(self, key: tuple) -> tuple:
        """The key a verify with per-node states runs under: one per (T, copies), its prefix capacity only
        growing. A smaller prefix takes the kept key (rows past it are masked out); a larger one replaces
        it, and the old graph and its ~10 GB of per-node buffers (at full size, per copy) go first: kept
        beside the new one, every capacity a generation's prefix crosses would hold a set of buffers of its
        own. The replaced key's results are stale, as after the next verify of their key."""
        kept = next((k for k in self._keys if k[4] and k[1:3] == key[1:3]), None)
        if kept is None or kept[3] >= key[3]:
            return key if kept is None else kept
        self._keys.pop(kept).epoch += 1
        return key

    def _verify_body(self, cap: _Captured) -> None:
        """The whole pass from the fixed buffers into cap.logits [T, vocab] and cap.out."""
        m = self.model
        T, P = cap.T, cap.prefix.capacity
        if cap.device_tables:  # the tree's exact tables and attention mask from its parents, first
            cap.plan.build_on_device(mask=cap.mask)
        # [T, P + T], and the committed length: attention reads no prefix row past it
        mask = torch.cat([(cap.prefix.rows < cap.prefix.length).expand(T, P), cap.mask], dim=1)
        if ATTEND_COMMITTED_ROWS:
            mask = PrefixMask(mask, cap.prefix.length)
        rope = Rope(cap.positions)  # built inside the graph: the RoPE tables of the refilled positions
        tables = lambda d: (cap.plan, rope, mask)  # noqa: E731 (one device: not placed)
        state = ModelState(0, cap.prefix.kv, self._ssm, self._conv)
        out = LayerOutputs.empty(self.cfg.num_layers, keep_states=cap.keep_states)
        h = m.run_layers(range(self.cfg.num_layers), m.embed_tokens(cap.tokens), state, tables, cap.mode, out)
        cap.logits, cap.out = m.head(h), out
        cap.hidden = torch.stack(out.hidden) if cap.keep_states else None  # [L, T, d]

    # ---- commit --------------------------------------------------------------------------------
    def commit(self, state: ModelState, tree: Tree, res: VerifyResult, accepted: int) -> ModelState:
        """The model's commit (its checks, the KV rows); for a replayed serving result the recurrent
        layers' replay runs from a CUDA graph too (one per key), from ``state``; a result with per-node
        states commits its accepted node's (copied)."""
        if not isinstance(res.fresh, _Epoch) or res.ssm is not None:
            return self.model.commit(state, tree, res, accepted)
        return self.model.commit(state, tree, res, accepted, replay=self._replay_from_graph)

    def _replay_from_graph(self, state: ModelState, tree: Tree, res: VerifyResult, accepted: int):
        """(ssm, conv) after node ``accepted``: the key's commit graph from ``state``, its outputs copied
        out (the next commit of the key rewrites them)."""
        cap = res.fresh.captured
        cap.accepted.fill_(accepted)
        self._load_state(state)
        self._run(cap, "commit_graph", lambda: self._commit_body(cap))
        ssm, conv = cap.committed  # slabs.pack's: one copy a group of like layers
        L = self.cfg.num_layers
        return slabs.unpack(ssm, L, copy=True), slabs.unpack(conv, L, copy=True)

    def _commit_body(self, cap: _Captured) -> None:
        if cap.device_tables:  # the tables a commit made after the verify's capture (the root paths) too
            cap.plan.build_on_device()
        checked = gb.CheckedIndices(cap.accepted, cap.T)
        tables = lambda d: ({"exact": cap.plan, "leaky": cap.chain}, checked)  # noqa: E731
        state = ModelState(0, [None] * self.cfg.num_layers, self._ssm, self._conv)
        ssm, conv = self.model.replay_states(state, cap.mode, cap.out.commit_inputs, tables)
        # like layers stacked in the graph (its own buffers; a layer alone is left where it is): _replay_from_graph
        # copies each group out with one launch
        cap.committed = slabs.pack(ssm), slabs.pack(conv)

    # ---- decode ----------------------------------------------------------------------------------
    def decoder(self, states: list, *, steps: int):
        """The model's RowDecoder (ddsim.model.decode) with each pass replayed from a CUDA graph: one key
        (rows, capacity) kept at a time, its rows the states' count rounded up to a power of two (the
        rows past them decode token 0 and are never read), its capacity ``prefix_capacity`` of the
        furthest position the steps reach. Decoders that fit the key kept use it; one that does not
        gets a key as large as both, which frees the old one (its buffers and graph: about 6 GB at
        Qwen3.6-27B shapes for 32 rows), so keys only grow and a run of decoders of varying sizes
        captures a few graphs, not one per size. The decoder's buffers are the key's: a later decoder
        of the same key takes them over (the earlier one then refuses to step)."""
        from ddsim.model.decode import DecodeBuffers, RowDecoder
        if not self.decode_graphs:
            return self.model.decoder(states, steps=steps)
        if not states:
            raise InputError("decoder: no states (at least one row)")
        key = (1 << (len(states) - 1).bit_length(), prefix_capacity(max(st.pos for st in states) + max(1, steps)))
        dk = self._decode
        if dk is not None and dk.key[0] >= key[0] and dk.key[1] >= key[1]:
            key = dk.key  # it fits the key kept (its extra rows and slots are masked out, never read)
        elif dk is not None:
            key = (max(key[0], dk.key[0]), max(key[1], dk.key[1]))  # keys only grow: no capture back and forth
        if dk is None or dk.key != key:
            self._decode = dk = None  # the old key's buffers and graph go before the new ones are made
            dk = self._decode = _DecodeKey(key, DecodeBuffers(self.model, *key),
                                           torch.cuda.graph_pool_handle() if self.capture else None)
        dk.epoch += 1
        epoch = dk.epoch
        return RowDecoder(self.model, dk.buffers, states, run=lambda: self._decode_pass(dk),
                          fresh=lambda: dk.epoch == epoch and self._decode is dk)

    def set_decode_graphs(self, on: bool) -> None:
        """Whether ``decoder`` replays its passes from a graph (the default) or is the model's eager
        decoder, whose buffers live only as long as it does; off frees the kept key (the audit's leaky
        phases: its memory is the oracle's batch room there)."""
        self.decode_graphs = on
        if not on:
            self._decode = None

    def _decode_pass(self, dk: "_DecodeKey") -> torch.Tensor:
        """One pass of dk's buffers -> logits [rows, vocab] (the graph's own output: read before the next).
        The warm-up before the capture writes only the keys (a pass that also moved the states on would
        be applied twice)."""
        m, buf = self.model, dk.buffers
        self._run(dk, "graph", lambda: setattr(dk, "logits", m.decode_pass(buf)),
                  warmup=lambda: m.decode_pass(buf, advance=False))
        return dk.logits

    # ---- capture -------------------------------------------------------------------------------
    def _load_state(self, state: ModelState) -> None:
        if state is self._resident:
            return
        self._resident = state
        slabs.load(self._ssm, state.ssm)
        slabs.load(self._conv, state.conv)

    def _run(self, cap, name: str, body, *, warmup=None, release=None) -> None:
        """Run ``body`` eagerly (capture=False), or capture it on first use into ``cap.<name>`` (from
        ``cap.pool``), after a warm-up that compiles the kernels and allocates the plans' tables
        (``warmup``, default ``body``: a body that is not idempotent warms up with a version that is),
        and replay it. ``release`` lets the warm-up's outputs go before the capture allocates its own (at
        full size a verify with per-node states holds ~10 GB of them per tree copy)."""
        if not self.capture:
            body()
            return
        graph = getattr(cap, name)
        if graph is None:
            with capture_blas(self.blas):
                graph = self._capture(cap, body, warmup, release)
            setattr(cap, name, graph)
        graph.replay()

    def _capture(self, cap, body, warmup, release) -> "torch.cuda.CUDAGraph":
        """``body`` warmed up on a side stream, then captured into a new graph from ``cap.pool``."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), _no_grad():
            (warmup or body)()
        torch.cuda.current_stream().wait_stream(side)
        if release is not None:  # the warm-up's outputs go before the capture makes its own
            release()
        torch.cuda.current_stream().synchronize()
        torch.cuda.empty_cache()  # the warm-up's blocks (its stream's) back to the device for the graph's pool
        graph = torch.cuda.CUDAGraph()
        # thread-local capture: another thread's CUDA calls (a weight digest copying tensors out
        # beside the audit did, on the H200) must not invalidate this capture; nor may the garbage
        # collector, which torch no longer runs before a capture: a dead cycle holding an old graph,
        # collected mid-capture, destroys that graph inside the capture and invalidates it (the
        # zamba2-2.7b audit did, on the H200). So the cycles go first and none are collected during it.
        gc.collect()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=cap.pool, capture_error_mode="thread_local"), _no_grad():
                body()
        finally:
            if was_enabled:
                gc.enable()
        return graph


class _DecodeKey:
    """The batched decode of one (rows, capacity): its buffers, graph, output logits and memory pool;
    ``epoch`` counts the decoders that have loaded its buffers."""

    def __init__(self, key: tuple, buffers, pool):
        self.key, self.buffers, self.pool = key, buffers, pool
        self.graph = self.logits = None
        self.epoch = 0


def not_capturable(model: HybridModel, *, capture: bool = True) -> str | None:
    """Why ``model``'s verify cannot be captured (None: it can). Without ``capture`` (the fixed buffers run
    eagerly) only what the buffers themselves cannot hold counts."""
    if capture and model.device.type != "cuda":
        return f"the model is on {model.device}, not a CUDA device"
    if len(set(model.layer_devices)) > 1:
        return "a model placed over several devices is not captured"
    if model.engine is not None:
        return "an engine kernel's launcher is not known to be capturable"
    if any(model.cfg.is_moe_layer(i) for i in range(model.cfg.num_layers)):
        return "MoE layers route on the host (a device sync per layer)"
    return None


def serving_model(model: HybridModel):
    """What runs a serving verify (no per-node states) fastest here: the model replayed from CUDA
    graphs where it can be captured, else the model itself (its verify with keep_states=False)."""
    return model if not_capturable(model) else GraphedModel(model)


@contextlib.contextmanager
def capture_blas(library: str | None):
    """torch's preferred BLAS library set to ``library`` (None: left as it is) while a graph is warmed up and
    captured, the caller's restored after: the graph keeps the GEMM kernels chosen then. cuBLASLt's, for a
    verify's few rows, read a 27B model's weights in 14.3 ms on an H200 where cuBLAS's take 14.6-14.8
    (benchmarks/bench_skinny_linear.py)."""
    if library is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def _no_grad():
    return torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()
