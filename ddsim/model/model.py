"""The fast path: a hybrid decoder that verifies a whole tree block at once (README, Contracts: the model and the verify modes).

Attention layers use the ancestor mask (exact in every mode). Recurrent layers (GDN, Mamba2) use the
tree conv and the tree recurrence from gpu_backend with a per-mode choice of source states (a short conv,
LFM2's, has the window alone: its leaky-state is exact and its leaky-conv is leaky):

  mode          conv window from          recurrent state from
  exact         ancestors                 parent
  leaky         previous nodes (batch)    previous node (batch order)
  leaky-state   ancestors                 previous node
  leaky-conv    previous nodes            parent
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

import ddsim.gpu_backend as gb
from ddsim.errors import InputError
from ddsim.gpu_backend import torch_ops
from ddsim.model import slabs
from ddsim.model.config import ModelConfig
from ddsim.model.placement import is_placed, layer_devices_of
from ddsim.model.state import ModelState, empty_state
from ddsim.trees.modes import VERIFY_MODES
from ddsim.trees.tree import Tree, chain

_LAYER_MODES = {  # mode -> (conv mode, recurrence mode)
    "exact": ("exact", "exact"),
    "leaky": ("leaky", "leaky"),
    "leaky-state": ("exact", "leaky"),
    "leaky-conv": ("leaky", "exact"),
}


@dataclass
class VerifyResult:
    """Per-node outputs of one verify pass.

    logits [T, N] float32; hidden [L, T, d] residual stream after each layer;
    ssm[l] [T, *state] state after each node and conv[l] [T, C, W-1] window after each node
    (recurrent layers, else None); kv[l] = (k [T, nkv, hd], v) per attention layer.

    A verify without per-node states (``keep_states=False``, what a serving stack runs) has
    hidden, ssm and conv None and keeps instead, per recurrent layer, the inputs its commit replays
    along the accepted path: commit_inputs[l] (CommitInputs), else None. ``fresh`` says whether those
    inputs are still this verify's (a CUDA-graph replay reuses its buffers: ddsim.model.graphs).
    """
    mode: str
    logits: torch.Tensor
    hidden: torch.Tensor | None
    ssm: list | None
    conv: list | None
    kv: list
    commit_inputs: list | None = None
    fresh: object = None  # () -> bool, or None: always fresh
    batch: tuple | None = None  # (RowBatch, b): row b of a verify_rows pass (commit_rows commits them together)


@dataclass
class RowBatch:
    """What one verify_rows pass keeps for committing its trees together (``commit_rows``): its mode,
    its trees and, per recurrent layer, the CommitInputs of all of them [B, T, ...] (else None)."""
    mode: str
    trees: list
    commit_inputs: list


@dataclass
class CommitInputs:
    """What one recurrent layer's commit replays along the accepted path, [1, T, ...] each.

    conv_x [1, T, C] the conv's inputs; GDN: k [1, T, H, K], v [1, T, HV, V] (after the conv),
    g, beta [1, T, HV]; Mamba2: x [1, T, H, P], dt [1, T, H] raw, B [1, T, G, N] (after the conv); Mamba1: x
    [1, T, I] (after the conv), dt [1, T, I] raw, B [1, T, N]; a short conv: conv_x alone; lightning attention:
    k [1, T, H, hd], v (conv_x None: no conv)."""
    conv_x: torch.Tensor | None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    g: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    x: torch.Tensor | None = None
    dt: torch.Tensor | None = None
    B: torch.Tensor | None = None


# A layer's projections of one input, laid side by side on CUDA (HybridModel.lay_projections), in this order (the
# ones the config uses: HybridModel._group); all of them present, or the group is not laid (MLA's attention has no
# attn.k, attn.v)
LAID_GROUPS = ("attn", "gdn")


class _Deferred(NamedTuple):
    """A hidden state h + add [T, d] whose residual add is left to the next block's input norm (its residual
    argument adds them, add + h, which is h + add bit for bit): a serving verify's kernel fewer a layer."""
    h: torch.Tensor
    add: torch.Tensor

    def sum(self) -> torch.Tensor:
        return self.h + self.add


class PrefixMask(NamedTuple):
    """The attention mask of a tree over a fixed-capacity KV prefix and itself, ``mask`` [T, P + T] bool (the prefix's
    unused rows masked out), with the committed length ``rows`` (an integer tensor of one element, on the device):
    tree attention reads no prefix row at or past it (ddsim.model.graphs, whose prefix holds a power of two rows)."""
    mask: torch.Tensor
    rows: torch.Tensor


@dataclass
class LayerOutputs:
    """Per-layer outputs of a verify pass, filled layer by layer (lists of num_layers entries)."""
    keep_states: bool
    kv: list
    hidden: list
    ssm: list
    conv: list
    commit_inputs: list

    @classmethod
    def empty(cls, n_layers: int, keep_states: bool) -> "LayerOutputs":
        return cls(keep_states, *([None] * n_layers for _ in range(5)))


def _offset_norm(name: str) -> bool:
    return name.endswith("norm") and not name.endswith(("gdn.norm", "mamba.norm", "kda.norm"))


def _current(device: torch.device):
    """The CUDA device guard for ``device`` (nothing for the CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class Rope:
    """RoPE tables of one set of positions [T], built once per (theta, rot, dtype) and shared by every
    attention layer of a verify (rotate-half convention)."""

    def __init__(self, pos: torch.Tensor):
        self.pos = pos
        self._tables: dict = {}

    def tables(self, theta: float, rot: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [T, 1, rot] in dtype."""
        key = (theta, rot, dtype)
        if key not in self._tables:
            inv = theta ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=self.pos.device) / rot)
            ang = self.pos.to(torch.float64)[:, None] * inv[None]  # [T, rot/2]
            cos, sin = ang.cos(), ang.sin()
            self._tables[key] = (torch.cat([cos, cos], -1)[:, None].to(dtype), torch.cat([sin, sin], -1)[:, None].to(dtype))
        return self._tables[key]


def _rope(x, rope: Rope, theta, rot):
    """x [T, n, hd] -> x with its first ``rot`` dims rotated by the positions' angles."""
    cos, sin = rope.tables(theta, rot, x.dtype)
    return torch_ops.rope(x, cos[:, 0], sin[:, 0])


class HybridModel:
    """Weights plus the batched tree forward. ``dtype`` is the fast path's compute dtype (float32
    on the CPU); recurrent state is always float32 or wider. On CUDA the recurrences (GDN, Mamba2) and
    convs run the Triton kernels (the recurrent ones, since the simulator keeps per-node states).

    Weights placed over several devices (ddsim.model.placement) stay where they are: each layer runs on its
    own device, the hidden state moves between layers, and each device gets its own tree tables;
    ``device`` is then the embedding's device, ``head_device`` the LM head's.

    ``engine`` (a ddsim.engines.EngineKernel): an external GDN tree-verify kernel that computes every
    GDN layer's outputs in the recurrence modes it offers, so the logits, and every decision taken
    from them, are that kernel's. The per-node states kept for the leak metrics and the commit stay
    ddsim's own computation of the same mode (an engine kernel returns outputs only)."""

    # whether a serving verify leaves each block's last residual add to the next block's input norm (run_layers);
    # the same sums either way (the tests turn it off to compare)
    defer_residuals = True
    # whether a model on one CUDA device lays the projections of one input side by side when it is made
    # (lay_projections: one GEMM for several), unless its ``lay`` argument says
    lay_on_cuda = True

    def __init__(self, cfg: ModelConfig, weights: dict, *, dtype=torch.float32, device="cpu", backend=None,
                 engine=None, glue=None, lay: bool | None = None):
        self.cfg = cfg
        self.backend = backend  # gpu_backend backend: None = triton on CUDA, torch elsewhere
        self.engine = engine
        self.dtype = dtype
        placed = is_placed(weights)
        self.device = weights["embed"].device if placed else torch.device(device)
        self.layer_devices = layer_devices_of(weights, cfg) if placed else [self.device] * cfg.num_layers
        self.head_device = weights["lm_head"].device if placed else self.device
        # norm scales are (norm_offset + weight) for every RMSNorm but the gated ones;
        # placed weights stay on their devices (no copy when already in dtype there)
        self.w = {k: v.to(device=v.device if placed else self.device, dtype=dtype) for k, v in weights.items()}
        for k in self.w:
            if _offset_norm(k) and cfg.norm_offset:
                self.w[k] = self.w[k] + cfg.norm_offset
        self.state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self._consts: dict = {}
        # the layers' glue (norms, gates, gated activations, tree attention): one Triton kernel each on CUDA
        # (gpu_backend.triton_norms, triton_attention), PyTorch's ops elsewhere, or where the fast path is PyTorch's
        # or float64
        if glue is None:
            glue = ("triton" if self.device.type == "cuda" and backend != "torch" and dtype != torch.float64
                    else "torch")
        self.glue = gb.check_glue(glue)
        self._laid: dict = {}  # (layer prefix, group) -> (the group's weights side by side [sum out, in], out sizes)
        if (self.lay_on_cuda if lay is None else lay) and self.device.type == "cuda" and not placed:
            self.lay_projections(weights)

    def lay_projections(self, shared: dict | None = None) -> int:
        """Lays each layer's projections of one input side by side in one allocation (LAID_GROUPS: attention's
        q, k, v and output gate; GDN's z, a, b), so that one GEMM makes them all (the fewer, larger GEMMs read the
        weights faster, and a graph launches fewer kernels); the model's weights become views of it, the same
        values. Where ``shared`` (the caller's weights) holds the very tensor the model took, its entry becomes
        the view too, so no weight is held twice. Placed models lay nothing. Returns how many groups were laid.
        (A model on one CUDA device does this when made, unless its ``lay`` is False; a GEMM's output columns may
        round differently as part of a wider GEMM, so a model compared bit for bit with an unlaid one is made with
        lay=False.)"""
        if is_placed(self.w):
            return 0
        n = 0
        for i in range(self.cfg.num_layers):
            p = f"layers.{i}."
            for group in LAID_GROUPS:
                keys = [p + name for name in self._group(group)]
                if (p, group) in self._laid or not all(k in self.w for k in keys):
                    continue
                ws = [self.w[k] for k in keys]
                if len({(w.dim(), w.shape[1:], w.dtype, w.device) for w in ws}) != 1 or ws[0].dim() != 2:
                    continue
                sizes = [w.shape[0] for w in ws]
                laid = torch.cat(ws)
                for k, old, view in zip(keys, ws, laid.split(sizes)):
                    self.w[k] = view
                    if shared is not None and shared.get(k) is old:
                        shared[k] = view
                self._laid[(p, group)] = (laid, sizes)
                n += 1
        if n and self.device.type == "cuda":
            torch.cuda.empty_cache()  # the replaced weights' memory back to the driver (free memory is read there)
        return n

    def _group(self, group: str) -> tuple:
        """The weight names (after a layer's prefix) of a LAID_GROUPS group the config uses, in their laid order:
        attention's q, k, v and (with attn_output_gate) its output gate; GDN's z, a, b."""
        if group == "attn":
            return ("attn.q", "attn.k", "attn.v") + (("attn.gate",) if self.cfg.attn_output_gate else ())
        return ("gdn.z", "gdn.a", "gdn.b")

    def _projections(self, p: str, group: str, x) -> list:
        """x [n, d] times each of layer p's weights of ``group`` (_group's order) -> [n, out] each: views of one
        GEMM's output where the group is laid side by side (lay_projections), else a GEMM each."""
        laid = self._laid.get((p, group))
        if laid is None:
            return [F.linear(x, self.w[p + name]) for name in self._group(group)]
        return list(F.linear(x, laid[0]).split(laid[1], -1))

    def _family_backend(self) -> str | None:
        """The backend of the ops with one Triton design (Mamba1, KDA, lightning): "torch" or "triton" as the model's GDN
        backend says, their own default (Triton on CUDA) when it says nothing."""
        return None if self.backend is None else "torch" if self.backend == "torch" else "triton"

    def _const(self, name: str) -> torch.Tensor:
        """A per-layer constant in float32, derived from its weight once (not once per verify):
        A = -exp(A_log) for a ``*.A_log`` weight, the decay per step exp(-slope) for a ``*.slope`` weight (lightning
        attention), else the weight itself (dt_bias, D)."""
        if name not in self._consts:
            x = self.w[name].float()
            self._consts[name] = -torch.exp(x) if name.endswith("A_log") else torch.exp(-x) if name.endswith("slope") else x
        return self._consts[name]

    def _ab(self, p: str) -> torch.Tensor:
        """GDN layer p's a and b projections stacked [2 HV, d] (one GEMM for both), made once."""
        key = p + "gdn.ab"
        if key not in self._consts:
            self._consts[key] = torch.cat([self.w[p + "gdn.a"], self.w[p + "gdn.b"]])
        return self._consts[key]

    def _norm(self, x, w, eps, residual=None):
        """RMSNorm of x [..., D] in float32, rounded to x's dtype, times w [D] (with residual: (normed x +
        residual, x + residual)), through the model's glue."""
        return gb.rms_norm(x, w, eps=eps, residual=residual, glue=self.glue)

    # ---- states --------------------------------------------------------------------------------
    def empty_state(self) -> ModelState:
        return empty_state(self.cfg, dtype=self.state_dtype, device=self.device, layer_devices=self.layer_devices)

    def prefill(self, tokens, state: ModelState | None = None) -> tuple[ModelState, torch.Tensor]:
        """Process ``tokens`` as one chain block and commit all of them.

        Returns (state, logits [n, N]); an empty token list returns the state unchanged.
        """
        state = state or self.empty_state()
        if len(tokens) == 0:
            return state, torch.zeros(0, self.cfg.vocab_size)
        tree = chain(list(tokens))
        res = self.verify(state, tree, mode="exact")
        return self.commit(state, tree, res, len(tree) - 1), res.logits

    # ---- verify --------------------------------------------------------------------------------
    def verify(self, state: ModelState, tree: Tree, *, mode: str = "exact", positions=None,
               ancestor_mask=None, keep_states: bool = True) -> VerifyResult:
        """All nodes of ``tree`` in one pass from the committed ``state``. ``positions`` [T] and
        ``ancestor_mask`` [T, T] (bool) replace the tree's own RoPE positions and attention mask: what
        an engine with an integration bug computes (ddsim.engines.replay's hypotheses and its test engine).

        keep_states=False verifies as a serving stack does: no per-node states or hidden states (the
        recurrences run their snapshot-free kernels on CUDA: WY, SSD), and the commit replays the
        accepted path from the inputs the result keeps."""
        self.check_tree(state, tree, mode)
        tables = self.tables(tree, state.pos, positions, ancestor_mask)
        out = LayerOutputs.empty(self.cfg.num_layers, keep_states)
        h = self.embed(tree)
        h = self.run_layers(range(self.cfg.num_layers), h, state, tables, mode, out)
        return self.finish(h, out, mode)

    def verify_modes(self, state: ModelState, tree: Tree, *, modes):
        """``verify(state, tree, mode=m)`` (per-node states) for each m of ``modes`` (distinct), one after
        another as they are asked for: an iterator, so one mode's per-node states are held at a time
        (ddsim.model.graphs' GraphedModel.verify_modes runs them as one pass). Every mode is checked
        first."""
        modes = self.check_modes(state, tree, modes)
        return (self.verify(state, tree, mode=m) for m in modes)

    def check_modes(self, state: ModelState, tree: Tree, modes) -> tuple:
        """``modes`` as a tuple, distinct and at least one, each checked with the tree (check_tree): what a
        verify_modes takes."""
        modes = tuple(modes)
        if not modes or len(set(modes)) != len(modes):
            raise InputError(f"modes: expected distinct verify modes, at least one, got {list(modes)}")
        for m in modes:
            self.check_tree(state, tree, m)
        return modes

    def check_tree(self, state: ModelState, tree: Tree, mode: str) -> None:
        """The mode, the tree's positions and tokens against the model (host values: no device sync)."""
        if mode not in VERIFY_MODES:
            raise InputError(f"mode: expected one of {VERIFY_MODES}, got {mode!r}")
        cfg = self.cfg
        if state.pos + int(tree.depths.max()) >= cfg.max_position_embeddings:
            raise InputError(f"tree: positions up to {state.pos + int(tree.depths.max())} exceed the "
                             f"model's {cfg.max_position_embeddings} positions")
        if max(tree.tokens) >= cfg.vocab_size or min(tree.tokens) < 0:
            bad = max(tree.tokens) if max(tree.tokens) >= cfg.vocab_size else min(tree.tokens)
            raise InputError(f"tree: token {bad} is outside the vocabulary ({cfg.vocab_size})")

    def tables(self, tree: Tree, pos: int, positions=None, ancestor_mask=None):
        """d -> the tree's tables on device d, built on first use and shared by every layer there: the
        TreePlan (parents [1, T], checked once), the RoPE tables of its positions [T], ancestor mask [T, T]."""
        pos0 = tree.positions(pos) if positions is None else positions
        mask0 = tree.ancestor_mask if ancestor_mask is None else ancestor_mask
        cache = {}

        def on(d):
            if d not in cache:
                cache[d] = (gb.TreePlan(torch.tensor(tree.parents, device=d)[None]), Rope(torch.as_tensor(pos0, device=d)),
                            torch.as_tensor(mask0, device=d))
            return cache[d]
        return on

    def embed(self, tree: Tree) -> torch.Tensor:
        """[T, d] the tree's token embeddings (times the embedding multiplier)."""
        return self.embed_tokens(torch.tensor(tree.tokens, device=self.device))

    def embed_tokens(self, toks: torch.Tensor) -> torch.Tensor:
        """toks [T] (checked against the vocabulary by the caller) -> [T, d]."""
        return self.w["embed"][toks] * self.cfg.embedding_multiplier

    def run_layers(self, layers, h, state: ModelState, tables, mode: str, out: "LayerOutputs"):
        """h [T, d] through ``layers`` (indices, in order) from ``state``; each layer's outputs go to
        ``out``. Returns h after the last one."""
        conv_mode, rec_mode = _LAYER_MODES[mode]
        x0 = h  # the embeddings, which Zamba2's hybrid layers read again
        # without per-layer hidden states (a serving verify), on one device: a layer's last residual add is left to
        # the next layer's input norm (_Deferred), one kernel fewer a layer
        defer = self.defer_residuals and not out.keep_states and len(set(self.layer_devices)) == 1
        for i in layers:
            kind = self.cfg.layer_pattern[i]
            if not isinstance(h, _Deferred):
                h = h.to(self.layer_devices[i])  # a placed model hands the hidden state on (no copy otherwise)
            parents, pos, mask = tables(self.layer_devices[i])
            attend = lambda p, xn, i=i: self._attention(p, xn, pos, mask, state.kv[i])  # noqa: E731
            S0 = None if state.ssm[i] is None else state.ssm[i][None]
            win0 = None if state.conv[i] is None else state.conv[i][None]
            with _current(self.layer_devices[i]):  # Triton launches on the current CUDA device: make it this layer's
                h, out.kv[i], S, win, cin = self._layer(i, kind, f"layers.{i}.", h, attend, S0, win0, parents,
                                                        conv_mode, rec_mode, out.keep_states, x0=x0, defer=defer)
            if out.keep_states:
                out.ssm[i], out.conv[i] = (None, None) if S is None else (S[0], win[0])
                out.hidden[i] = h.to(self.head_device)
            else:
                out.commit_inputs[i] = cin
        return h.sum() if isinstance(h, _Deferred) else h

    def head(self, h) -> torch.Tensor:
        """The final norm and the LM head: h [T, d] -> logits [T, vocab] float32."""
        h = h.to(self.head_device)
        logits = F.linear(self._norm(h, self.w["final_norm"], self.cfg.rms_norm_eps), self.w["lm_head"]).float()
        return logits / self.cfg.logits_scaling

    def finish(self, h, out: "LayerOutputs", mode: str) -> VerifyResult:
        """The VerifyResult of a pass ending in h [T, d]."""
        logits = self.head(h)
        if out.keep_states:
            return VerifyResult(mode, logits, torch.stack(out.hidden), out.ssm, out.conv, out.kv)
        return VerifyResult(mode, logits, None, None, None, out.kv, out.commit_inputs)

    def _layer(self, i, kind, p, h, attend, S0, win0, parents, conv_mode, rec_mode, keep_states=True, *, x0=None,
               defer=False):
        """Layer i on h [B*T, d] (B sequences of T nodes, row-major) -> (h after it, its new KV or None,
        per-node states [B, T, ...] and windows or None, its CommitInputs or None). attend(p, xn) ->
        (out, k, v) is the attention of these rows; S0, win0 [B, ...] each sequence's committed
        recurrent state and window (recurrent layers); x0 [B*T, d] the rows' embeddings (Zamba2's hybrid layers
        read them). The block: input norm, mixer, residual, post norm, MLP, residual; OLMo-Hybrid's attention blocks
        norm the outputs instead (attn_post_norm); MiniMax's take the normed input as the residual and scale each
        sum (residual_from_norm); Zamba2's hybrid layer feeds its transformer block's output to the Mamba2 mixer.
        h may be a _Deferred (the last layer's residual add not yet made: this block's input norm makes it); with
        ``defer`` this block may return one too (its own last add, where it is h + MLP)."""
        cfg, w = self.cfg, self.w
        r = cfg.residual_multiplier
        plain = kind not in "zf" and not cfg.residual_from_norm and not (kind == "a" and cfg.attn_post_norm)
        if isinstance(h, _Deferred) and not plain:
            h = h.sum()
        mix = lambda x: self._mixer(kind, p, x, attend, S0, win0, parents, conv_mode, rec_mode, keep_states)  # noqa: E731
        if kind == "z":  # attention and its MLP on [h, x0] (2d), projected to t; then h + Mamba2(norm(h + t))
            a, k, v = attend(p, self._norm(torch.cat([h, x0.to(h.device)], -1), w[p + "input_norm"], cfg.rms_norm_eps))
            t = F.linear(self._mlp(p, self._norm(a, w[p + "post_norm"], cfg.rms_norm_eps), i), w[p + "hybrid.proj"])
            m, S, win, cin = self._mamba2(p, self._norm(h + t, w[p + "hybrid.norm"], cfg.rms_norm_eps), parents, S0, win0,
                                          conv_mode, rec_mode, keep_states)
            return h + r * m, (k, v), S, win, cin
        if kind == "f":
            return h + r * self._mlp(p, self._norm(h, w[p + "input_norm"], cfg.rms_norm_eps), i), None, None, None, None
        if cfg.residual_from_norm:
            xn = self._norm(h, w[p + "input_norm"], cfg.rms_norm_eps)
            out, nk, S, win, cin = mix(xn)
            alpha, beta = (cfg.attn_alpha, cfg.attn_beta) if kind == "a" else (cfg.linear_alpha, cfg.linear_beta)
            xn = self._norm(alpha * xn + beta * out, w[p + "post_norm"], cfg.rms_norm_eps)
            return cfg.mlp_alpha * xn + cfg.mlp_beta * self._mlp(p, xn, i), nk, S, win, cin
        if kind == "a" and cfg.attn_post_norm:
            out, nk, S, win, cin = mix(h)
            h = h + r * self._norm(out, w[p + "input_norm"], cfg.rms_norm_eps)
            if cfg.layer_mlp:
                h = h + r * self._norm(self._mlp(p, h, i), w[p + "post_norm"], cfg.rms_norm_eps)
            return h, nk, S, win, cin
        if isinstance(h, _Deferred):  # the last layer's residual add and this input norm in one
            xn, h = self._norm(h.add, w[p + "input_norm"], cfg.rms_norm_eps, residual=h.h)
        else:
            xn = self._norm(h, w[p + "input_norm"], cfg.rms_norm_eps)
        out, nk, S, win, cin = mix(xn)
        if not cfg.layer_mlp:
            return h + (out if r == 1.0 else r * out), nk, S, win, cin
        if r == 1.0:  # the residual add and the post norm in one (h + out is out + h, bit for bit)
            xn, h = self._norm(out, w[p + "post_norm"], cfg.rms_norm_eps, residual=h)
            m = self._mlp(p, xn, i)
            return (_Deferred(h, m) if defer else h + m), nk, S, win, cin
        h = h + r * out
        return h + r * self._mlp(p, self._norm(h, w[p + "post_norm"], cfg.rms_norm_eps), i), nk, S, win, cin

    def _mixer(self, kind, p, xn, attend, S0, win0, parents, conv_mode, rec_mode, keep_states):
        """The mixer of a layer of ``kind`` on its input xn [B*T, d] -> (out [B*T, d], new KV or None, per-node
        states and windows or None, CommitInputs or None); a parallel layer ('p') sums attention and Mamba2."""
        nk, S, win, cin = None, None, None, None
        parts = []  # the mixers' outputs, summed (attention first)
        if kind in "ap":
            a, k, v = attend(p, xn)
            parts, nk = [a], (k, v)
        if kind == "g":
            m, S, win, cin = self._gdn(p, xn, parents, S0, win0, conv_mode, rec_mode, keep_states)
        elif kind in "mp":
            m, S, win, cin = self._mamba2(p, xn, parents, S0, win0, conv_mode, rec_mode, keep_states)
        elif kind == "c":
            m, S, win, cin = self._short_conv(p, xn, parents, S0, win0, conv_mode, keep_states)
        elif kind == "s":
            m, S, win, cin = self._mamba1(p, xn, parents, S0, win0, conv_mode, rec_mode, keep_states)
        elif kind == "l":
            m, S, win, cin = self._lightning(p, xn, parents, S0, win0, rec_mode, keep_states)
        elif kind == "k":
            m, S, win, cin = self._kda(p, xn, parents, S0, win0, conv_mode, rec_mode, keep_states)
        if kind != "a":
            parts.append(m)
        return (parts[0] if len(parts) == 1 else parts[0] + parts[1]), nk, S, win, cin

    def _ffn(self, x, up, down, gate):
        """SwiGLU down(silu(gate x) * up x), GeGLU down(gelu(gate x) * up x) or relu^2 down(relu(up x)^2), as the
        config says."""
        if self.cfg.mlp_act == "relu2":
            return F.linear(torch.relu(F.linear(x, up)).square(), down)
        act = "gelu" if self.cfg.mlp_act == "geglu" else "silu"
        return F.linear(gb.gated_act(F.linear(x, gate), F.linear(x, up), act=act, glue=self.glue), down)

    def _route(self, p, x):
        """(weights [T, k], expert indices [T, k]): softmax top-k (renormalised when norm_topk_prob), or
        Nemotron-H's sigmoid scores chosen with the router bias among the best groups, scaled."""
        cfg, w = self.cfg, self.w
        logits = F.linear(x, w[p + "mlp.router"]).float()  # [T, E]
        k = cfg.num_experts_per_tok
        if cfg.moe_router == "softmax":
            top, idx = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
            return (top / top.sum(-1, keepdim=True) if cfg.norm_topk_prob else top), idx
        scores = torch.sigmoid(logits)
        choice = scores + w[p + "mlp.router_bias"].float()
        T, E, G = choice.shape[0], choice.shape[1], cfg.moe_n_group
        group_scores = choice.view(T, G, E // G).topk(min(2, E // G), dim=-1).values.sum(-1)  # [T, G]
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, torch.topk(group_scores, cfg.moe_topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
        idx = torch.topk(choice, k, dim=-1).indices
        top = scores.gather(1, idx)
        if cfg.norm_topk_prob:
            top = top / (top.sum(-1, keepdim=True) + cfg.moe_norm_eps)
        return top * cfg.routed_scaling_factor, idx

    def _mlp(self, p, x, i):
        """The layer's MLP (SwiGLU, GeGLU or relu^2), or the MoE block: the routed top-k experts plus the
        shared expert (sigmoid-gated for Qwen, a plain sum for Granite and Nemotron-H)."""
        cfg, w = self.cfg, self.w
        gated = cfg.gated_mlp
        if not cfg.is_moe_layer(i):
            return self._ffn(x, w[p + "mlp.up"], w[p + "mlp.down"], w[p + "mlp.gate"] if gated else None)
        top, idx = self._route(p, x)  # [T, k] each
        k = idx.shape[1]
        order = torch.argsort(idx.reshape(-1), stable=True)  # the (row, slot) choices grouped by expert, rows ascending
        counts = torch.bincount(idx.reshape(-1), minlength=cfg.num_experts).tolist()  # one host sync per layer
        out = torch.zeros_like(x)
        start = 0
        for e, c in enumerate(counts):
            if not c:
                continue
            chosen = order[start:start + c]
            start += c
            rows, slot = chosen // k, chosen % k
            ye = self._ffn(x[rows], w[p + "mlp.experts.up"][e], w[p + "mlp.experts.down"][e],
                           w[p + "mlp.experts.gate"][e] if gated else None)
            out.index_add_(0, rows, ye * top[rows, slot, None].to(x.dtype))
        if p + "mlp.shared.down" in w:
            shared = self._ffn(x, w[p + "mlp.shared.up"], w[p + "mlp.shared.down"],
                               w[p + "mlp.shared.gate"] if gated else None)
            if p + "mlp.shared_gate" in w:  # Qwen's gated shared expert; Granite's and Nemotron-H's a plain sum
                shared = torch.sigmoid(F.linear(x, w[p + "mlp.shared_gate"])) * shared
            out = out + shared
        return out

    def _qkv(self, p, x, rope: Rope):
        """x [n, d] -> q [n, nh, hd], k, v [n, nkv, hd] and the output gate's projection [n, nh hd] (None without
        one): the projections (one GEMM where they are laid side by side), with the q/k norms and RoPE at rope's
        positions where the config has them."""
        cfg, w = self.cfg, self.w
        n, nkv, hd = x.shape[0], cfg.num_key_value_heads, cfg.head_dim
        if cfg.mla_kv_lora_rank:
            gate = F.linear(x, w[p + "attn.gate"]) if cfg.attn_output_gate else None
            return (*self._mla_qkv(p, x, rope), gate)
        q, k, v, *gate = self._projections(p, "attn", x)
        q, k = self._qk(p, q, k, rope)
        return q, k, v.view(n, nkv, hd), gate[0] if gate else None

    def _qk(self, p, q, k, rope: Rope):
        """q [n, nh hd], k [n, nkv hd] (projected) -> q [n, nh, hd], k [n, nkv, hd], normed and rotated where the
        config says."""
        cfg, w = self.cfg, self.w
        n, nh, nkv, hd = q.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if cfg.qk_norm_all:  # one norm over all heads
            q = self._norm(q, w[p + "attn.q_norm"], cfg.rms_norm_eps)
            k = self._norm(k, w[p + "attn.k_norm"], cfg.rms_norm_eps)
        q, k = q.view(n, nh, hd), k.view(n, nkv, hd)
        if cfg.qk_norm and not cfg.qk_norm_all and cfg.use_rope:  # each per-head norm and its RoPE as one call
            cos, sin = rope.tables(cfg.rope_theta, cfg.rotary_dim, q.dtype)
            q = gb.rms_norm_rope(q, w[p + "attn.q_norm"], cos[:, 0], sin[:, 0], eps=cfg.rms_norm_eps, glue=self.glue)
            k = gb.rms_norm_rope(k, w[p + "attn.k_norm"], cos[:, 0], sin[:, 0], eps=cfg.rms_norm_eps, glue=self.glue)
            return q, k
        if cfg.qk_norm and not cfg.qk_norm_all:
            q = self._norm(q, w[p + "attn.q_norm"], cfg.rms_norm_eps)
            k = self._norm(k, w[p + "attn.k_norm"], cfg.rms_norm_eps)
        if cfg.use_rope:
            q = _rope(q, rope, cfg.rope_theta, cfg.rotary_dim)
            k = _rope(k, rope, cfg.rope_theta, cfg.rotary_dim)
        return q, k

    def _mla_qkv(self, p, x, rope: Rope):
        """MLA's q [n, nh, hd], k, v [n, nh, hd]: q from x or its normed low-rank bottleneck; per head k = [k_nope,
        k_rope] and v from the normed latent (k_rope shared by the heads); q's rope dims and k_rope rotated at
        rope's positions where the config has RoPE (DeepSeek's decoupled RoPE; Kimi Linear has none); zero-padded
        to hd."""
        cfg, w = self.cfg, self.w
        n, nh, hd = x.shape[0], cfg.num_attention_heads, cfg.head_dim
        nope, rd, vd, kvl = cfg.mla_qk_nope_head_dim, cfg.mla_qk_rope_head_dim, cfg.mla_v_head_dim, cfg.mla_kv_lora_rank
        if cfg.mla_q_lora_rank:
            q = F.linear(self._norm(F.linear(x, w[p + "attn.q_a"]), w[p + "attn.q_a_norm"], cfg.mla_norm_eps), w[p + "attn.q_b"])
        else:
            q = F.linear(x, w[p + "attn.q"])
        q = q.view(n, nh, nope + rd)
        c = F.linear(x, w[p + "attn.kv_a"])  # [n, kvl + rope]
        kv = F.linear(self._norm(c[:, :kvl], w[p + "attn.kv_a_norm"], cfg.mla_norm_eps), w[p + "attn.kv_b"]).view(n, nh, nope + vd)
        q_rot, k_rot = q[..., nope:], c[:, None, kvl:]  # [n, nh, rope], [n, 1, rope]
        if cfg.use_rope:
            if cfg.mla_rope_interleave:  # pairs (x0, x1), (x2, x3), ... -> halves (x0, x2, ...), (x1, x3, ...)
                q_rot, k_rot = (torch.cat([t[..., 0::2], t[..., 1::2]], -1) for t in (q_rot, k_rot))
            q_rot, k_rot = _rope(q_rot, rope, cfg.rope_theta, rd), _rope(k_rot, rope, cfg.rope_theta, rd)
        pad = lambda t: F.pad(t, (0, hd - t.shape[-1]))  # noqa: E731
        return (pad(torch.cat([q[..., :nope], q_rot], -1)), pad(torch.cat([kv[..., :nope], k_rot.expand(n, nh, rd)], -1)),
                pad(kv[..., nope:]))

    def _attend_out(self, p, o, gate):
        """The attention's output o [n, nh * hd] gated by ``gate`` (its projection [n, nh hd], from _qkv; None: no
        gate) and projected: [n, d]."""
        cfg = self.cfg
        if cfg.mla_kv_lora_rank and cfg.mla_v_head_dim < cfg.head_dim:  # MLA's values, unpadded
            o = o.view(o.shape[0], cfg.num_attention_heads, cfg.head_dim)[..., :cfg.mla_v_head_dim].reshape(o.shape[0], -1)
        if gate is not None:  # sigmoid(gate) o: o sigmoid(gate), bit for bit
            o = gb.gated_act(gate, o, act="sigmoid", glue=self.glue)
        return F.linear(o, self.w[p + "attn.o"])

    def _attention(self, p, x, pos, mask, prefix):
        """The tree's rows x [T, d] over the committed prefix and their ancestors -> (out [T, d], k, v); mask [T, T],
        [T, P + T] or a PrefixMask."""
        cfg = self.cfg
        q, k, v, gate = self._qkv(p, x, pos)
        mask, rows = mask if isinstance(mask, PrefixMask) else (mask, None)
        o = gb.tree_attention(q, k, v, prefix_k=prefix[0], prefix_v=prefix[1], ancestor_mask=mask, prefix_rows=rows,
                              scale=cfg.attention_scale or None, glue=self.glue).reshape(x.shape[0], -1)
        return self._attend_out(p, o, gate), k, v

    def _gdn(self, p, x, parents, S0, win0, conv_mode, rec_mode, keep_states=True):
        """x [B*T, d] (B sequences of T nodes); S0 [B, HV, K, V], win0 [B, C, W-1] -> (out [B*T, d],
        per-node states [B, T, HV, K, V] and windows [B, T, C, W-1], or None and None and the
        CommitInputs without keep_states)."""
        cfg, w = self.cfg, self.w
        N, B = x.shape[0], S0.shape[0]
        T = N // B
        H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        K, V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        xin = F.linear(x, w[p + "gdn.qkv"]).view(B, T, -1)  # [B, T, C]
        if (p, "gdn") in self._laid:  # z, a, b from one GEMM [N, HV V + 2 HV], each read in place
            z, a, b = self._projections(p, "gdn", x)
        else:
            z = F.linear(x, w[p + "gdn.z"])  # [N, HV * V]
            if self.glue == "triton":  # a and b from one GEMM [N, 2 HV], read in place by the gates kernel
                ab = F.linear(x, self._ab(p))
                a, b = ab[:, :HV], ab[:, HV:]
            else:
                a, b = F.linear(x, w[p + "gdn.a"]), F.linear(x, w[p + "gdn.b"])  # [N, HV] each
        g, beta = gb.gdn_gates(a, b, A=self._const(p + "gdn.A_log"), dt_bias=self._const(p + "gdn.dt_bias"),
                               beta_scale=cfg.gdn_beta_scale, glue=self.glue)  # [N, HV] float32 each
        g, beta = g.view(B, T, HV), beta.view(B, T, HV)
        y = gb.tree_causal_conv1d(xin, weight=w[p + "gdn.conv"], parents=parents, initial_window=win0,
                                  mode=conv_mode, output_windows=keep_states, split=(H * K, H * K, HV * V),
                                  backend=self.backend)
        (q, k, v), windows = y if keep_states else (y, None)  # [B, T, H K] x2, [B, T, HV V] (contiguous from Triton)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, HV, V)
        o = gb.gdn_tree_verify(q, k, v, g, beta, parents=parents, initial_state=S0.to(self.state_dtype),
                               mode=rec_mode, output_states=keep_states, backend=self.backend)
        o, states = o if keep_states else (o, None)
        if self.engine is not None and rec_mode in self.engine.modes:  # the engine's outputs [B, T, HV, V]
            o = self.engine.verify(q, k, v, g, beta, parents=parents.parents, state_pool=S0.to(torch.float32).clone(),
                                   slots=torch.arange(B, dtype=torch.int32, device=q.device), mode=rec_mode,
                                   scale=None)
        o = gb.gated_rms_norm(o.reshape(N, HV, V).to(x.dtype), w[p + "gdn.norm"], z,
                              eps=cfg.gdn_norm_eps or cfg.rms_norm_eps, glue=self.glue)  # norm(o) silu(z)
        out = F.linear(o.reshape(N, HV * V), w[p + "gdn.out"])
        if keep_states:
            return out, states, windows, None
        return out, None, None, CommitInputs(xin, k=k, v=v, g=g, beta=beta)

    def _mamba2(self, p, x, parents, S0, win0, conv_mode, rec_mode, keep_states=True):
        """x [B*T, d] (B sequences of T nodes); S0 [B, H, P, N]; win0 [B, Cm, W-1] -> (out [B*T, d],
        states [B, T, H, P, N], windows [B, T, Cm, W-1], None), or (out, None, None, CommitInputs)
        without keep_states."""
        cfg, w = self.cfg, self.w
        Nr, Bs = x.shape[0], S0.shape[0]
        T = Nr // Bs
        H, P, N, G, I = (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.mamba_state_size, cfg.mamba_n_groups,
                         cfg.mamba_inner)
        z = F.linear(x, w[p + "mamba.z"])  # [B*T, I]
        xbc = F.linear(x, w[p + "mamba.xbc"]).view(Bs, T, -1)  # [B, T, Cm]
        dt = F.linear(x, w[p + "mamba.dt"]).float().view(Bs, T, H)
        y = gb.tree_causal_conv1d(xbc, weight=w[p + "mamba.conv"], bias=w.get(p + "mamba.conv_bias"),
                                  parents=parents, initial_window=win0, mode=conv_mode,
                                  output_windows=keep_states, backend=self.backend)
        y, windows = y if keep_states else (y, None)  # y [B, T, Cm]
        xs = y[..., :I].reshape(Bs, T, H, P)
        Bm = y[..., I: I + G * N].reshape(Bs, T, G, N)
        Cm = y[..., I + G * N:].reshape(Bs, T, G, N)
        o = gb.mamba2_tree_verify(xs, dt, self._const(p + "mamba.A_log"), Bm, Cm,
                                  D=self._const(p + "mamba.D"), dt_bias=self._const(p + "mamba.dt_bias"),
                                  dt_limit=cfg.mamba_dt_limit, parents=parents,
                                  initial_state=S0.to(self.state_dtype), mode=rec_mode,
                                  output_states=keep_states, backend=self.backend)
        o, states = o if keep_states else (o, None)
        o = o.reshape(Nr, I).float()
        zf = F.silu(z.float())

        def group_rms(v):  # RMSNorm over each of the G groups of I/G channels (float32), times the weight
            g = v.view(Nr, G, I // G)
            return (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)).view(Nr, I) * w[p + "mamba.norm"]

        if cfg.mamba_norm == "gated":
            o = group_rms(o * zf)
        elif cfg.mamba_norm == "gated-before":
            o = group_rms(o) * zf
        else:
            o = o * zf
        out = F.linear(o.to(x.dtype), w[p + "mamba.out"])
        if keep_states:
            return out, states, windows, None
        return out, None, None, CommitInputs(xbc, x=xs, dt=dt, B=Bm)

    def _mamba1(self, p, x, parents, S0, win0, conv_mode, rec_mode, keep_states=True):
        """A Mamba1 mixer (Jamba's). x [B*T, d] (B sequences of T nodes); S0 [B, I, N]; win0 [B, I, W-1] ->
        (out [B*T, d], states [B, T, I, N], windows [B, T, I, W-1], None), or (out, None, None, CommitInputs)
        without keep_states."""
        cfg, w = self.cfg, self.w
        Nr, Bs = x.shape[0], S0.shape[0]
        T, I, R, Ns = Nr // Bs, cfg.mamba1_inner, cfg.mamba1_dt_rank, cfg.mamba_state_size
        xz = F.linear(x, w[p + "mamba1.in"])  # [B*T, 2I]: x, then z
        xs, z = xz[:, :I].reshape(Bs, T, I), xz[:, I:]
        y = gb.tree_causal_conv1d(xs, weight=w[p + "mamba1.conv"], bias=w.get(p + "mamba1.conv_bias"), parents=parents,
                                  initial_window=win0, mode=conv_mode, output_windows=keep_states, backend=self.backend)
        u, windows = y if keep_states else (y, None)  # u [B, T, I]: silu(conv)
        dbc = F.linear(u, w[p + "mamba1.x_proj"])  # [B, T, R + 2N]
        dtr, Bm, Cm = dbc[..., :R], dbc[..., R:R + Ns], dbc[..., R + Ns:]
        if cfg.mamba1_bcdt_norm:
            dtr = self._norm(dtr, w[p + "mamba1.dt_norm"], cfg.rms_norm_eps)
            Bm = self._norm(Bm, w[p + "mamba1.b_norm"], cfg.rms_norm_eps)
            Cm = self._norm(Cm, w[p + "mamba1.c_norm"], cfg.rms_norm_eps)
        dt = F.linear(dtr, w[p + "mamba1.dt_proj"]).float()  # [B, T, I] raw
        o = gb.mamba1_tree_verify(u, dt, self._const(p + "mamba1.A_log"), Bm, Cm, D=self._const(p + "mamba1.D"),
                                  dt_bias=self._const(p + "mamba1.dt_bias"), parents=parents,
                                  initial_state=S0.to(self.state_dtype), mode=rec_mode, output_states=keep_states,
                                  backend=self._family_backend())
        o, states = o if keep_states else (o, None)
        o = o.reshape(Nr, I).float() * F.silu(z.float())
        out = F.linear(o.to(x.dtype), w[p + "mamba1.out"])
        if keep_states:
            return out, states, windows, None
        return out, None, None, CommitInputs(xs, x=u, dt=dt, B=Bm)

    def _kda(self, p, x, parents, S0, win0, conv_mode, rec_mode, keep_states=True):
        """Kimi Delta Attention. x [B*T, d] (B sequences of T nodes); S0 [B, H, K, V]; win0 [B, 3HK, W-1] -> (out
        [B*T, d], states [B, T, H, K, V], windows [B, T, 3HK, W-1], None), or (out, None, None, CommitInputs)
        without keep_states."""
        cfg, w = self.cfg, self.w
        N, Bs = x.shape[0], S0.shape[0]
        T, H, K = N // Bs, cfg.linear_num_value_heads, cfg.linear_key_head_dim
        xin = F.linear(x, w[p + "kda.qkv"]).view(Bs, T, -1)  # [B, T, 3HK]: q, k, v
        y = gb.tree_causal_conv1d(xin, weight=w[p + "kda.conv"], parents=parents, initial_window=win0, mode=conv_mode,
                                  output_windows=keep_states, backend=self.backend)
        y, windows = y if keep_states else (y, None)  # y [B, T, 3HK]: silu(conv)
        q, k, v = (y[..., j * H * K:(j + 1) * H * K].view(Bs, T, H, K) for j in range(3))
        f = F.linear(F.linear(x, w[p + "kda.f_a"]), w[p + "kda.f_b"]).float() + self._const(p + "kda.dt_bias")  # [N, HK]
        g = (self._const(p + "kda.A_log")[:, None] * F.softplus(f.view(N, H, K))).view(Bs, T, H, K)  # -exp(A_log) * ...
        beta = torch.sigmoid(F.linear(x, w[p + "kda.b"]).float()).view(Bs, T, H)
        o = gb.kda_tree_verify(q, k, v, g, beta, parents=parents, initial_state=S0.to(self.state_dtype), mode=rec_mode,
                               output_states=keep_states, backend=self._family_backend())
        o, states = o if keep_states else (o, None)
        gate = F.linear(F.linear(x, w[p + "kda.g_a"]), w[p + "kda.g_b"]).view(N, H, K)
        o = self._norm(o.reshape(N, H, K).float(), w[p + "kda.norm"].float(), cfg.rms_norm_eps) * torch.sigmoid(gate.float())
        out = F.linear(o.reshape(N, H * K).to(x.dtype), w[p + "kda.out"])
        if keep_states:
            return out, states, windows, None
        return out, None, None, CommitInputs(xin, k=k, v=v, g=g, beta=beta)

    def _lightning(self, p, x, parents, S0, win0, rec_mode, keep_states=True):
        """MiniMax's lightning attention. x [B*T, d] (B sequences of T nodes); S0 [B, H, hd, hd]; win0 [B, 0, 0] (no
        conv) -> (out [B*T, d], states [B, T, H, hd, hd], empty windows [B, T, 0, 0], None), or (out, None, None,
        CommitInputs) without keep_states."""
        cfg, w = self.cfg, self.w
        N, Bs = x.shape[0], S0.shape[0]
        T, H, hd = N // Bs, cfg.num_attention_heads, cfg.head_dim
        qkv = F.silu(F.linear(x, w[p + "lightning.qkv"])).view(Bs, T, H, 3 * hd)
        q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
        decay = self._const(p + "lightning.slope")  # [H] exp(-slope)
        o = gb.lightning_tree_verify(q, k, v, decay=decay, parents=parents, initial_state=S0.to(self.state_dtype),
                                     mode=rec_mode, output_states=keep_states, backend=self._family_backend())
        o, states = o if keep_states else (o, None)
        o = self._norm(o.reshape(N, H * hd), w[p + "lightning.norm"], cfg.lightning_norm_eps)
        out = F.linear(o * torch.sigmoid(F.linear(x, w[p + "lightning.gate"])), w[p + "lightning.out"])
        if keep_states:
            return out, states, win0.new_zeros(Bs, T, *win0.shape[1:]), None
        return out, None, None, CommitInputs(None, k=k, v=v)

    def _short_conv(self, p, x, parents, S0, win0, conv_mode, keep_states=True):
        """LFM2's gated short conv. x [B*T, d] (B sequences of T nodes); S0 [B, 0] (no state); win0 [B, d, W-1]
        -> (out [B*T, d] = out(C * conv(B * x)), the empty states [B, T, 0] and windows [B, T, d, W-1], None),
        or (out, None, None, CommitInputs) without keep_states."""
        w = self.w
        N, Bs = x.shape[0], S0.shape[0]
        T, d = N // Bs, x.shape[1]
        bg, cg, xs = F.linear(x, w[p + "conv.in"]).chunk(3, dim=-1)  # [B*T, d] each
        u = (bg * xs).view(Bs, T, d)
        y = gb.tree_causal_conv1d(u, weight=w[p + "conv.conv"], parents=parents, initial_window=win0, mode=conv_mode,
                                  activation=None, output_windows=keep_states, backend=self.backend)
        y, windows = y if keep_states else (y, None)  # y [B, T, d]
        out = F.linear(cg * y.reshape(N, d), w[p + "conv.out"])
        if keep_states:
            return out, S0.new_zeros(Bs, T, *S0.shape[1:]), windows, None
        return out, None, None, CommitInputs(u)

    # ---- several sequences in one pass: batched decode and batched serving verify --------------
    def decoder(self, states: list, *, steps: int):
        """A ddsim.model.decode.RowDecoder of ``states`` for ``steps`` one-token passes: the rows packed into
        fresh buffers once, each pass eager (``decode_pass``)."""
        from ddsim.model.decode import DecodeBuffers, RowDecoder
        if not states:
            raise InputError("decoder: no states (at least one row)")
        buf = DecodeBuffers(self, len(states), max(st.pos for st in states) + max(1, steps))
        return RowDecoder(self, buf, states, run=lambda: self.decode_pass(buf))

    def decode_rows(self, states: list, tokens) -> tuple[torch.Tensor, list]:
        """One token for each of B sequences, row b from its own committed ``states[b]``: what a
        serving stack's batched decode does, and what ``verify`` of the one-node tree [tokens[b]] then
        ``commit`` of it does per row (the products run over B rows instead of one: the same within
        the arithmetic's rounding). Returns (logits [B, vocab] float32, the state after each row's
        token). Each row's state is a view into the pass's buffers (no copy per row and layer: a
        pass is host-bound): a caller that keeps one row's state past the others' copies it
        (``ModelState.clone``), or the whole batch stays alive with it. A run of tokens is decoded
        by one ``decoder`` (the rows packed once)."""
        B = len(states)
        if B == 0 or len(tokens) != B:
            raise InputError(f"decode_rows: {B} states and {len(tokens)} tokens (one each, at least one)")
        dec = self.decoder(states, steps=1)
        logits = dec.step(tokens)
        return logits, [dec.state(b, copy=False) for b in range(B)]

    def decode_pass(self, buf, *, advance: bool = True) -> torch.Tensor:
        """One token of each of ``buf``'s rows (ddsim.model.decode.DecodeBuffers: buf.tokens at
        buf.positions [B]) -> logits [B, vocab] float32. Every row's new key and value are written at its
        position (attention then reads the row's slots up to it); with ``advance`` each recurrent
        layer's state and window move on in place (without it, only the keys and values are written,
        which a repeated pass writes the same: a CUDA graph's warm-up)."""
        cfg = self.cfg
        tables = {}

        def on(d):  # (plan, RoPE of the positions, positions [B], row indices [B], slots seen [B, capacity])
            if d not in tables:
                plan, rows, slots = buf.tables(d)
                pos = buf.positions.to(d)
                tables[d] = (plan, Rope(pos), pos, rows, slots[None, :] <= pos[:, None])
            return tables[d]
        h = x0 = self.embed_tokens(buf.tokens)  # [B, d]
        for i, kind in enumerate(cfg.layer_pattern):
            h = h.to(self.layer_devices[i])
            plan, rope, pos, rows, seen = on(h.device)
            attend = lambda p, xn, i=i, t=(rope, pos, rows, seen): self._attention_decode(  # noqa: E731
                p, xn, *t, kv=buf.kv[i])
            with _current(h.device):
                h, _, S, win, _ = self._layer(i, kind, f"layers.{i}.", h, attend, buf.ssm[i], buf.conv[i], plan,
                                              "exact", "exact", True, x0=x0)
                if advance and S is not None:
                    buf.ssm[i].copy_(S[:, 0])  # [B, ...]
                    buf.conv[i].copy_(win[:, 0])
        return self.head(h)

    def _attention_decode(self, p, x, rope: Rope, pos, rows, seen, *, kv):
        """One token of each of B rows, x [B, d], at positions pos [B]: its key and value written into
        the row's slot pos of kv = (K, V) [B, capacity, nkv, hd], then attention over the row's slots
        seen [B, capacity] (bool: 0..pos) -> (out [B, d], k, v)."""
        cfg = self.cfg
        B, nh, nkv, hd = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q, k, v, gate = self._qkv(p, x, rope)  # [B, nh | nkv, hd]
        K, V = kv
        K.index_put_((rows, pos), k.to(K.dtype))
        V.index_put_((rows, pos), v.to(V.dtype))
        # each query head reads its group's key and value head (SDPA's grouped attention): the rows' whole
        # KV is not copied once per query head of the group
        Kq, Vq = K.to(q.dtype).transpose(1, 2), V.to(q.dtype).transpose(1, 2)  # [B, nkv, capacity, hd]
        o = F.scaled_dot_product_attention(q[:, :, None], Kq, Vq, attn_mask=seen[:, None, None, :],
                                           scale=cfg.attention_scale or 1.0 / math.sqrt(hd),
                                           enable_gqa=nh != nkv)  # [B, nh, 1, hd]
        return self._attend_out(p, o.reshape(B, nh * hd), gate), k, v

    def verify_rows(self, states: list, trees: list, *, mode: str = "exact") -> list[VerifyResult]:
        """The serving verify (``verify(..., keep_states=False)``) of B trees of the same size in one
        pass, tree b from its own committed ``states[b]``: the recurrences run B sequences of T nodes,
        attention runs each tree over its own prefix (padded, the padding masked out) and ancestors,
        the projections over all B*T rows at once. Each result is tree b's: its logits [T, vocab],
        KV and commit inputs (views into the batch's tensors), committed by ``commit`` as any
        serving result; the same as the tree's own verify within the arithmetic's rounding."""
        B = len(states)
        if B == 0 or len(trees) != B:
            raise InputError(f"verify_rows: {B} states and {len(trees)} trees (one each, at least one)")
        T = trees[0].size
        if any(t.size != T for t in trees):
            raise InputError(f"verify_rows: trees of {sorted({t.size for t in trees})} nodes (one size per batch)")
        for st, tree in zip(states, trees):
            self.check_tree(st, tree, mode)
        masks = torch.stack([torch.as_tensor(t.ancestor_mask, dtype=torch.bool) for t in trees])  # [B, T, T]
        positions = [int(p) for st, t in zip(states, trees) for p in t.positions(st.pos)]
        h, kv, cin = self._pass_rows(states, [x for t in trees for x in t.tokens], [list(t.parents) for t in trees],
                                     positions, masks, mode)
        logits = self.head(h)  # [B*T, vocab]
        batch = RowBatch(mode, list(trees), cin)
        out = []
        for b in range(B):
            rows = slice(b * T, (b + 1) * T)
            kv_b = [None if x is None else (x[0][rows], x[1][rows]) for x in kv]
            cin_b = [None if c is None else CommitInputs(**{f: None if getattr(c, f) is None else getattr(c, f)[b:b + 1]
                                                            for f in c.__dataclass_fields__}) for c in cin]
            out.append(VerifyResult(mode, logits[rows], None, None, None, kv_b, cin_b, batch=(batch, b)))
        return out

    def _pass_rows(self, states: list, tokens: list, parents: list, positions: list, masks: torch.Tensor, mode: str):
        """B sequences of T nodes through every layer as a server verifies them (no per-node states),
        sequence b from ``states[b]``: tokens and positions [B*T] (row-major), parents [B][T], masks
        [B, T, T] (bool ancestor masks). Returns (h [B*T, d] after the last layer, per layer: the new
        (k, v) [B*T, nkv, hd] or None, CommitInputs [B, T, ...] or None)."""
        conv_mode, rec_mode = _LAYER_MODES[mode]
        L = self.cfg.num_layers
        tables = {}

        lens = [st.kv[self.cfg.attention_layers[0]][0].shape[0] for st in states] if self.cfg.attention_layers else []
        P = max(lens, default=0)
        B, T = masks.shape[0], masks.shape[1]

        def on(d):  # the batch's tree plan, RoPE positions and attention masks [B, T, P + T] on device d
            if d not in tables:
                prefix = (torch.arange(P)[None, :] < torch.tensor(lens or [0] * B)[:, None])[:, None, :].expand(B, T, P)
                tables[d] = (gb.TreePlan(torch.tensor(parents, dtype=torch.long, device=d)),
                             Rope(torch.tensor(positions, device=d)), torch.cat([prefix, masks], -1).to(d))
            return tables[d]
        h = x0 = self.embed_tokens(torch.tensor(tokens, device=self.device))  # [B*T, d]
        kv, cin = [None] * L, [None] * L
        for i, kind in enumerate(self.cfg.layer_pattern):
            h = h.to(self.layer_devices[i])
            plan, rope, mask = on(h.device)
            rec = states[0].ssm[i] is not None
            S0 = torch.stack([st.ssm[i] for st in states]) if rec else None  # [B, ...]
            win0 = torch.stack([st.conv[i] for st in states]) if rec else None
            attend = lambda p, xn, i=i, rope=rope, mask=mask: self._attention_rows(  # noqa: E731
                p, xn, rope, [st.kv[i] for st in states], mask)
            with _current(h.device):
                h, kv[i], _, _, cin[i] = self._layer(i, kind, f"layers.{i}.", h, attend, S0, win0, plan,
                                                     conv_mode, rec_mode, keep_states=False, x0=x0)
        return h, kv, cin

    def _attention_rows(self, p, x, rope: Rope, prefixes: list, seen: torch.Tensor):
        """Attention of B sequences of T nodes, x [B*T, d]: sequence b's nodes over its own committed
        prefix (prefixes[b] = (K [P_b, nkv, hd], V); lengths may differ: padded to the longest, P)
        and its nodes, as seen[b] [T, P + T] (bool: the prefix's real rows, then the ancestor mask)
        lets them (the lengths come from the host: no device sync per layer)."""
        cfg = self.cfg
        B, T, P = seen.shape[0], seen.shape[1], seen.shape[2] - seen.shape[1]
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q, k, v, gate = self._qkv(p, x, rope)  # [B*T, nh | nkv, hd]
        pad = torch.nn.utils.rnn.pad_sequence  # in the prefixes' dtype, converted once (not per row)
        Kp = pad([pk for pk, _ in prefixes] + [prefixes[0][0].new_zeros(P, nkv, hd)], batch_first=True)[:B].to(q.dtype)
        Vp = pad([pv for _, pv in prefixes] + [prefixes[0][1].new_zeros(P, nkv, hd)], batch_first=True)[:B].to(q.dtype)
        # each query head reads its group's key and value head (SDPA's grouped attention, as in decode_pass)
        K = torch.cat([Kp, k.view(B, T, nkv, hd)], 1).transpose(1, 2)  # [B, nkv, P+T, hd]
        Vv = torch.cat([Vp, v.view(B, T, nkv, hd)], 1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.view(B, T, nh, hd).transpose(1, 2), K, Vv, attn_mask=seen[:, None],
                                           scale=cfg.attention_scale or 1.0 / math.sqrt(hd),
                                           enable_gqa=nh != nkv)  # [B, nh, T, hd]
        return self._attend_out(p, o.transpose(1, 2).reshape(B * T, nh * hd), gate), k, v

    # ---- commit --------------------------------------------------------------------------------
    def commit(self, state: ModelState, tree: Tree, res: VerifyResult, accepted: int, *, replay=None) -> ModelState:
        """State after accepting the root path ending at node ``accepted``: the accepted nodes' KV
        is appended in path order; S and the conv window become what this mode computed at that
        node (a leaky pass commits its leaky state, as a serving stack copies the intermediate
        state at the node's batch index). A result without per-node states is committed by replaying
        its mode's source path root..accepted from ``state`` (the commit kernels): the same state
        within float32 reassociation. ``replay(state, tree, res, accepted) -> (ssm, conv)`` replaces
        that replay (ddsim.model.graphs replays it from a CUDA graph; commit_rows hands each row its share
        of one batched replay)."""
        self._check_commit(tree, res, accepted)
        path = tree.root_path(accepted)
        L = self.cfg.num_layers
        kv, ssm, conv = [None] * L, [None] * L, [None] * L
        # the path's keys and values appended to the prefix's, like layers together (slabs.GROUPED; else layer by
        # layer): each group's new KV is one slab [layers, P + n, nkv, hd] (its layers' tensors views of it), made by
        # one gather and one concatenation from the prefix's own slab where it is one (a state this commits)
        on = {}  # the path's rows on each device, copied there once (a copy per layer stalls the host)
        for g in slabs.grouped(self.cfg.attention_layers,
                               lambda i: (slabs.like(res.kv[i][0]), slabs.like(state.kv[i][0]))):
            d = res.kv[g[0]][0].device
            rows = on.get(d)
            if rows is None:
                rows = on[d] = torch.tensor(path, device=d)
            sides = []
            for side in (0, 1):
                old = slabs.stacked([state.kv[i][side] for i in g])  # [A, P, nkv, hd]
                new = slabs.stacked([res.kv[i][side] for i in g])[:, rows].to(old.dtype)  # [A, n, nkv, hd]
                sides.append(torch.cat([old, new], 1).unbind(0))
            for i, k, v in zip(g, *sides):
                kv[i] = (k, v)
        if res.ssm is not None:  # the accepted node's states, copied (a stack: one launch per group of like layers)
            rec = self.cfg.recurrent_layers
            ssm = slabs.copied([res.ssm[i][accepted] if i in rec else None for i in range(L)])
            conv = slabs.copied([res.conv[i][accepted].to(state.conv[i].dtype) if i in rec else None for i in range(L)])
        else:
            ssm, conv = (replay or self._commit_replay)(state, tree, res, accepted)
        return ModelState(state.pos + len(path), kv, ssm, conv)

    @staticmethod
    def _check_commit(tree: Tree, res: VerifyResult, accepted: int) -> None:
        if not 0 <= accepted < tree.size:
            raise InputError(f"accepted: node {accepted} is outside 0..{tree.size - 1}")
        if res.logits.shape[0] != tree.size:
            raise InputError(f"tree: {tree.size} nodes, the verify result has {res.logits.shape[0]}")
        if res.fresh is not None and not res.fresh():
            raise InputError("commit: this verify result's buffers were reused by a later verify of the same "
                             "shape (a CUDA-graph replay); commit a result before verifying the next tree")

    def commit_rows(self, states: list, trees: list, results: list, accepted: list) -> list[ModelState]:
        """``commit`` of each (states[b], trees[b], results[b], accepted[b]). Results that are one
        whole verify_rows pass, in its order, have their recurrent layers replayed together (each
        layer's commit kernels over the B sequences, each from its own state to its own accepted
        node); others are committed one by one. The same states within float32 reassociation."""
        B = len(results)
        batch = results[0].batch[0] if B and results[0].batch is not None else None
        whole = batch is not None and len(batch.trees) == B and len(states) == len(trees) == len(accepted) == B and all(
            r.batch is not None and r.batch[0] is batch and r.batch[1] == b and t is batch.trees[b]
            for b, (r, t) in enumerate(zip(results, trees)))
        if not whole:
            return [self.commit(st, t, r, a) for st, t, r, a in zip(states, trees, results, accepted)]
        for t, r, a in zip(trees, results, accepted):
            self._check_commit(t, r, a)
        ssm, conv = self._replay(lambda i: (torch.stack([st.ssm[i] for st in states]),
                                            torch.stack([st.conv[i] for st in states])),
                                 batch.mode, batch.commit_inputs, _replay_tables(trees, accepted, batch.mode))
        def row(b: int, st: ModelState):  # row b's states, copied (see decode_rows): one stack a group of like layers
            return (slabs.copied([None if x is None else x[b] for x in ssm]),
                    slabs.copied([None if x is None else x[b].to(st.conv[i].dtype) for i, x in enumerate(conv)]))
        return [self.commit(st, t, r, a, replay=lambda *_, b=b, st=st: row(b, st))
                for b, (st, t, r, a) in enumerate(zip(states, trees, results, accepted))]

    def _commit_replay(self, state: ModelState, tree: Tree, res: VerifyResult, accepted: int):
        """(ssm, conv) per layer after node ``accepted``, replayed along res.mode's source paths (the
        tree's parents, or the batch order for a leaky recurrence or conv) from the inputs kept.
        The source orders the mode uses are planned, and the accepted index checked, once per device."""
        return self.replay_states(state, res.mode, res.commit_inputs, _replay_tables([tree], [accepted], res.mode))

    def replay_states(self, state: ModelState, mode: str, commit_inputs: list, tables):
        """(ssm, conv) per recurrent layer: each layer's commit kernels over its CommitInputs from
        ``state``; tables(d) -> ({"exact": plan of the tree, "leaky": plan of the batch order; the
        source orders of ``mode`` at least}, CheckedIndices of the accepted node) on device d."""
        ssm, conv = self._replay(lambda i: (state.ssm[i][None], state.conv[i][None]), mode, commit_inputs, tables)
        return ([None if x is None else x[0] for x in ssm],
                [None if x is None else x[0].to(state.conv[i].dtype) for i, x in enumerate(conv)])

    def _replay(self, initial, mode: str, commit_inputs: list, tables):
        """(ssm [B, ...], conv [B, ...]) per recurrent layer (else None): the commit kernels of B
        sequences, CommitInputs [B, T, ...], from initial(i) -> (S0 [B, ...], window0 [B, C, W-1])."""
        conv_mode, rec_mode = _LAYER_MODES[mode]
        cfg, L = self.cfg, self.cfg.num_layers
        ssm, conv = [None] * L, [None] * L
        for i in cfg.recurrent_layers:
            ci, p, d = commit_inputs[i], f"layers.{i}.", self.layer_devices[i]
            plans, acc = tables(d)
            S0, win0 = initial(i)
            with _current(d):
                conv[i] = win0.clone() if ci.conv_x is None else gb.conv_tree_commit(  # lightning: no window
                    ci.conv_x, parents=plans[conv_mode], accepted=acc, initial_window=win0, backend=self.backend)
                S0 = S0.to(self.state_dtype)
                if cfg.layer_pattern[i] == "c":  # the window is the whole state
                    ssm[i] = S0.clone()
                elif cfg.layer_pattern[i] == "k":
                    ssm[i] = gb.kda_tree_commit(ci.k, ci.v, ci.g, ci.beta, parents=plans[rec_mode], accepted=acc,
                                                initial_state=S0, backend=self._family_backend())
                elif cfg.layer_pattern[i] == "l":
                    ssm[i] = gb.lightning_tree_commit(ci.k, ci.v, decay=self._const(p + "lightning.slope"),
                                                      parents=plans[rec_mode], accepted=acc, initial_state=S0,
                                                      backend=self._family_backend())
                elif cfg.layer_pattern[i] == "s":
                    ssm[i] = gb.mamba1_tree_commit(ci.x, ci.dt, self._const(p + "mamba1.A_log"), ci.B,
                                                   dt_bias=self._const(p + "mamba1.dt_bias"), parents=plans[rec_mode],
                                                   accepted=acc, initial_state=S0, backend=self._family_backend())
                elif cfg.layer_pattern[i] == "g":
                    ssm[i] = gb.gdn_tree_commit(ci.k, ci.v, ci.g, ci.beta, parents=plans[rec_mode], accepted=acc,
                                                initial_state=S0, backend=self.backend)
                else:
                    ssm[i] = gb.mamba2_tree_commit(ci.x, ci.dt, self._const(p + "mamba.A_log"), ci.B,
                                                   dt_bias=self._const(p + "mamba.dt_bias"), dt_limit=cfg.mamba_dt_limit,
                                                   parents=plans[rec_mode], accepted=acc, initial_state=S0,
                                                   backend=self.backend)
        return ssm, conv


def _replay_tables(trees: list, accepted: list, mode: str):
    """tables(d) for HybridModel._replay of B trees of one size: ({source order: its TreePlan [B, T]}
    for the orders ``mode`` uses (the trees' parents, "exact"; the batch order, "leaky"), the accepted
    nodes checked), built once per device."""
    B, T = len(trees), trees[0].size
    source = {"exact": [list(t.parents) for t in trees], "leaky": [list(range(-1, T - 1))] * B}
    plans = {}

    def tables(d):
        if d not in plans:
            plans[d] = ({m: gb.TreePlan(torch.tensor(source[m], device=d)) for m in set(_LAYER_MODES[mode])},
                        gb.checked_accepted([int(a) for a in accepted], B, T, d))
        return plans[d]
    return tables
