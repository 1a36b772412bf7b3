"""CUDA graphs for the serving verify: a tree's pass through the model replayed, not re-launched.

``GraphedModel(model)`` verifies as ``model.verify(..., keep_states=False)`` does (no per-node
states; the commit replays the accepted path) with the recurrent layers captured as CUDA graphs,
piecewise as vLLM captures a model: every maximal run of layers without attention is one graph,
and the attention layers run eagerly between them (their KV prefix grows every step, so their
shapes change; the recurrent layers' do not). Graphs are captured on first use per key
(mode, nodes T, the doubling rounds of the WY solve, which the tree's depth sets) and replayed for
every later tree of that key.

What a replay reads it reads at fixed addresses: the tree's index tables (a ``StaticPlan``, filled
on the host from the tree's parents and copied in), the committed recurrent states and conv windows
(copied into fixed buffers), the hidden state entering each piece. Each key has its own memory pool,
so no two keys share memory; within a key, a replay reuses the buffers of the previous one, so a
result's commit inputs are only valid until the next verify of its key: ``VerifyResult.fresh`` says
so and the model's commit refuses a stale result.

``capture=False`` runs the same pieces, buffers and tables eagerly (no graphs): the CPU tests check
that machinery bit for bit against ``model.verify``; the GPU suite checks the replays
(properties/test_cuda_graphs.py).
"""
from __future__ import annotations

import math

import torch

import ddsim.gpu_backend as gb
from ddsim.errors import InputError
from ddsim.model import _LAYER_MODES, HybridModel, LayerOutputs, VerifyResult
from ddsim.state import ModelState
from ddsim.tree import Tree


def wy_rounds(depth: int) -> int:
    """Doubling rounds of the WY solve for a tree of this depth (what the kernel is specialised on)."""
    return max(0, math.ceil(math.log2(max(depth, 1))))


class StaticPlan(gb.TreePlan):
    """A TreePlan for one sequence of T nodes whose tables live in fixed device buffers. ``load(tree)``
    builds the tree's tables on the host (validating its parents) and copies them into the buffers,
    so a graph captured against this plan reads the current tree's tables. Tables are allocated on
    first use, which must come before capture (the warm-up run does it).

    ``ancestors(mode)`` reports the depth of the tree it was first built for: kernels read it only
    as their number of doubling rounds, which the graph's key fixes (``load`` checks it)."""

    def __init__(self, T: int, device):
        self.B, self.T = 1, T
        self.parents = torch.zeros(1, T, dtype=torch.long, device=device)
        self.device = self.parents.device  # "cuda" resolved to its index, as the layers' tensors report it
        self._cache = {}
        self._host = None

    def load(self, tree: Tree) -> None:
        if tree.size != self.T:
            raise InputError(f"tree: {tree.size} nodes, this plan holds {self.T}")
        self._host = gb.TreePlan(torch.tensor(tree.parents)[None])  # validated on the host, no device sync
        self.parents.copy_(self._host.parents, non_blocking=True)
        for key, value in self._cache.items():
            new = self._host_value(key)
            if key[0] == "anc":
                if wy_rounds(new[1]) != wy_rounds(value[1]):
                    raise InputError(f"tree: depth {new[1]} needs {wy_rounds(new[1])} WY rounds, this plan was "
                                     f"captured for {wy_rounds(value[1])}")
                value[0].copy_(new[0], non_blocking=True)
            else:
                value.copy_(new, non_blocking=True)

    def _host_value(self, key):
        h = self._host
        if key[0] == "src":
            return h.src(key[1])
        if key[0] == "conv":
            return h.conv_table(key[1], key[2])
        if key[0] == "anc":
            return h.ancestors(key[1])
        return h.root_paths()

    def _cached(self, key, build):
        if key not in self._cache:
            if self._host is None:
                raise RuntimeError("StaticPlan: load a tree before use")
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"StaticPlan: table {key} first asked for during capture (warm up first)")
            value = self._host_value(key)
            if key[0] == "anc":
                self._cache[key] = (value[0].to(self.device), value[1])
            else:
                self._cache[key] = value.to(self.device)
        return self._cache[key]


class _Piece:
    """Consecutive layers without attention, run from a fixed input buffer (captured or not)."""

    def __init__(self, layers: list[int]):
        self.layers = layers
        self.h_in = None
        self.h_out = None
        self.out = None
        self.graph = None


class _Captured:
    """Everything one key's replays use: its plan, its pieces, its pool, the number of replays."""

    def __init__(self, model: HybridModel, T: int, pieces: list[list[int]], pool):
        self.plan = StaticPlan(T, model.device)
        self.pieces = [_Piece(layers) for layers in pieces]
        self.pool = pool
        self.epoch = 0
        self.ready = False


class GraphedModel:
    """``model`` with its serving verify replayed from CUDA graphs (see the module docstring). Also
    a drop-in for ``model`` where a verify without per-node states is enough: ``verify`` always
    keeps no states; prefill, commit and the rest are the model's."""

    def __init__(self, model: HybridModel, *, capture: bool = True):
        cfg = model.cfg
        if capture and model.device.type != "cuda":
            raise InputError(f"cuda graphs: the model is on {model.device}, not a CUDA device")
        if len(set(model.layer_devices)) > 1:
            raise InputError("cuda graphs: a model placed over several devices is not captured")
        if model.engine is not None:
            raise InputError("cuda graphs: an engine kernel's launcher is not known to be capturable")
        if any(cfg.is_moe_layer(i) for i in range(cfg.num_layers)):
            raise InputError("cuda graphs: MoE layers route on the host (a device sync per layer)")
        self.model, self.cfg, self.capture = model, cfg, capture
        self.segments = _segments(cfg.layer_pattern)
        self._keys: dict = {}
        # committed recurrent states and windows at fixed addresses, shared by every key (replays run
        # one after another on one stream, each after copying its state in)
        L = cfg.num_layers
        ssm, conv = [None] * L, [None] * L
        for i in cfg.recurrent_layers:
            d = model.layer_devices[i]
            ssm[i] = torch.zeros(cfg.state_shape(i), dtype=model.state_dtype, device=d)
            conv[i] = torch.zeros(cfg.window_shape(i), dtype=model.state_dtype, device=d)
        self._state = ModelState(0, [None] * L, ssm, conv)

    def __getattr__(self, name):  # prefill, commit, empty_state, cfg, device, ... are the model's
        return getattr(self.model, name)

    def key(self, tree: Tree, mode: str) -> tuple:
        """(mode, T, WY rounds of the recurrence's source order): one graph set per key."""
        rec = _LAYER_MODES[mode][1]
        depth = int(tree.depths.max()) if rec == "exact" else tree.size - 1
        return mode, tree.size, wy_rounds(depth)

    def verify(self, state: ModelState, tree: Tree, *, mode: str = "exact", keep_states: bool = False,
               **kw) -> VerifyResult:
        if keep_states or kw:
            raise InputError("cuda graphs: verify keeps no per-node states and takes the tree's own positions "
                             "and mask (use the model itself otherwise)")
        m = self.model
        m.check_tree(state, tree, mode)
        key = self.key(tree, mode)
        cap = self._keys.get(key)
        if cap is None:
            pool = torch.cuda.graph_pool_handle() if self.capture else None
            cap = self._keys[key] = _Captured(m, tree.size, [s for kind, s in self.segments if kind == "graph"], pool)
        cap.plan.load(tree)
        for i in self.cfg.recurrent_layers:
            self._state.ssm[i].copy_(state.ssm[i], non_blocking=True)
            self._state.conv[i].copy_(state.conv[i], non_blocking=True)
        pos = torch.as_tensor(tree.positions(state.pos), device=m.device)
        mask = torch.as_tensor(tree.ancestor_mask, device=m.device)
        tables = lambda d: (cap.plan, pos, mask)  # noqa: E731 (the attention layers read pos and mask only)
        out = LayerOutputs.empty(self.cfg.num_layers, keep_states=False)
        h = m.embed(tree)
        pieces = iter(cap.pieces)
        for kind, layers in self.segments:
            if kind == "eager":
                h = m.run_layers(layers, h, state, tables, mode, out)
            else:
                h = self._run_piece(cap, next(pieces), h, mode, out)
        cap.ready = True
        cap.epoch += 1
        epoch = cap.epoch
        return m.finish(h, out, mode, fresh=lambda: cap.epoch == epoch)

    def _run_piece(self, cap: _Captured, piece: _Piece, h, mode: str, out: LayerOutputs):
        m = self.model
        plan_tables = lambda d: (cap.plan, None, None)  # noqa: E731 (no attention inside a piece)
        if piece.h_in is None:
            piece.h_in = torch.empty_like(h)
        piece.h_in.copy_(h)
        if not self.capture:
            piece.out = LayerOutputs.empty(self.cfg.num_layers, keep_states=False)
            piece.h_out = m.run_layers(piece.layers, piece.h_in, self._state, plan_tables, mode, piece.out)
        elif piece.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: compiles the kernels, allocates the plan's tables
                m.run_layers(piece.layers, piece.h_in, self._state, plan_tables, mode,
                             LayerOutputs.empty(self.cfg.num_layers, keep_states=False))
            torch.cuda.current_stream().wait_stream(side)
            piece.out = LayerOutputs.empty(self.cfg.num_layers, keep_states=False)
            piece.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(piece.graph, pool=cap.pool):
                piece.h_out = m.run_layers(piece.layers, piece.h_in, self._state, plan_tables, mode, piece.out)
            piece.graph.replay()
        else:
            piece.graph.replay()
        for i in piece.layers:
            out.commit_inputs[i] = piece.out.commit_inputs[i]
        return piece.h_out

    def captured(self) -> list[tuple]:
        """The keys captured so far."""
        return sorted(k for k, c in self._keys.items() if c.ready)


def _segments(pattern: str) -> list[tuple[str, list[int]]]:
    """[("graph", layers) | ("eager", [i])]: maximal runs of layers without attention, and each
    attention layer ('a', 'p') on its own."""
    segs: list[tuple[str, list[int]]] = []
    for i, kind in enumerate(pattern):
        if kind in "ap":
            segs.append(("eager", [i]))
        elif segs and segs[-1][0] == "graph":
            segs[-1][1].append(i)
        else:
            segs.append(("graph", [i]))
    return segs
