"""Triton commit kernels: the recurrent state and the conv window after an accepted path, written
into a state-pool slot (in place, as a serving stack does) or into a new tensor, without per-node
snapshots. Twins: oracle.gdn_tree_commit, oracle.conv_tree_commit.

The GDN commit replays the delta rule along the accepted root path only (depth <= a few dozen
steps) from the committed state: it reads the slot's state once and writes it once, so its memory
floor is that of a state copy.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddsim.gpu_backend import _common as C
from ddsim.gpu_backend import checks
from ddsim.gpu_backend import triton_helpers as h
from ddsim.gpu_backend.launch import bind, launch


@triton.jit
def _gdn_commit_kernel(
    k, v, g, beta, A_log, dt_bias,  # [B,T,H,K], [B,T,HV,V], [B,T,HV] x2 (or a, b), [HV] x2
    paths, acc,  # [B, TP, DMAX] int32: root paths (root first, -1 padded); [B] int64: the row of each sequence's
    state, state_idx, out, out_idx,  # read pool + slots, write pool + slots (may be the same)
    T, TP, DMAX,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FUSED: tl.constexpr, L2NORM: tl.constexpr, STATE_VK: tl.constexpr, OUT_VK: tl.constexpr,  # h.state_ptrs
    KS: tl.constexpr, VS: tl.constexpr,  # k's and v's row strides (_common.rows_of)
):
    i_v, i_b, i_hv, i_h = h.head_coords(H, HV)
    o_k, o_v, mk, mv = h.kv_tile(i_v, K, V, BK, BV)
    slot, live = h.pool_slot(state_idx, i_b)  # a padded row (slot -1) starts from a zero state
    S = tl.load(h.state_ptrs(state, slot, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                mask=h.live_rows(o_k, K, live)[:, None] & mv[None, :], other=0.0)
    neg_A, bias = h.gate_params(A_log, dt_bias, i_hv, FUSED)
    path = paths + (i_b * TP + tl.load(acc + i_b)) * DMAX  # the accepted node's root path
    d = tl.full((), 0, tl.int32)
    n = tl.load(path)
    while n >= 0:  # its nodes only, not the table's width (a DevicePlan's paths are T wide, whatever the depth)
        row = (i_b * T + n).to(tl.int64)
        b_k = h.load_rows(k, row, i_h, o_k, mk, H, K, L2NORM, 0, KS)
        b_v = h.load_rows(v, row, i_hv, o_v, mv, HV, V, False, 0, VS)
        b_g, b_beta = h.gates(g, beta, row * HV + i_hv, 0, neg_A, bias, FUSED, False)
        S = h.delta_step(S, b_k, b_v, b_g, b_beta)
        d += 1
        n = tl.load(path + d, mask=d < DMAX, other=-1)
    oslot, olive = h.pool_slot(out_idx, i_b)
    # in place a padded row's slot is not written (out_idx is then the pool's slots)
    tl.store(h.state_ptrs(out, oslot, i_hv, o_k, o_v, HV, K, V, OUT_VK), S,
             mask=h.live_rows(o_k, K, olive)[:, None] & mv[None, :])


def _paths(parents: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """[B, DMAX] int32 root-first accepted paths, -1 padded."""
    B, T = parents.shape
    cur = accepted.clone()
    rows = []
    while (cur >= 0).any():
        rows.append(cur)
        cur = torch.where(cur >= 0, parents.gather(1, cur.clamp(min=0)[:, None])[:, 0], cur)
    rev = torch.stack(rows[::-1], dim=1)  # [B, DMAX] with -1 on the left for shorter paths
    # shift each row so the root comes first
    keep = rev >= 0
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    return rev.gather(1, order).to(torch.int32).contiguous()


def accepted_paths(parents, p: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(paths [B, TP, DMAX] int32, rows [B]): row rows[b] of paths[b] is sequence b's root-first accepted
    path (-1 padded), for checked parents p [B, T] and accepted nodes acc [B]. A TreePlan's cached
    root paths of every node with acc as the rows (the kernel picks the row: no gather launched),
    else the accepted paths walked here (TP = 1, rows 0)."""
    if isinstance(parents, checks.TreePlan):
        return parents.root_paths(), acc
    return _paths(p, acc)[:, None, :].contiguous(), checks.constant("dummy", p.shape[0], p.device, torch.int64)


def checked_accepted_paths(parents, accepted, B: int, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted_paths of parents [B, T] (raw or a TreePlan) and accepted [B], both checked first."""
    p = checks.check_parents(parents, B, T, device)
    return accepted_paths(parents, p, checks.check_accepted(accepted, B, T, device))


def gdn_tree_commit_triton(*args, **kwargs):
    """State after root..accepted[b]. inplace=True writes it into the pool slots (state_indices)
    and returns the pool; otherwise returns a new [B, HV, K, V] tensor. Other slots are untouched."""
    launch, out = plan_commit(*args, **kwargs)
    launch()
    return out


def plan_commit(k, v, g=None, beta=None, *, parents, accepted, initial_state, use_qk_l2norm=True,
                state_indices=None, inplace=False, a=None, b=None, A_log=None, dt_bias=None,
                block_v: int = 32, num_warps: int = 4, poison: bool | None = None):
    """Validate, build the paths and allocate once; returns (launch, out)."""
    B, T, H, HV, K, V = C.check_gdn_args(k, k, v, g, beta, a, b)
    C.check_device(k, v, initial_state)
    p = checks.check_parents(parents, B, T, k.device)
    acc = checks.check_accepted(accepted, B, T, k.device)
    idx = C.check_pool(initial_state, state_indices, B, HV, K, V)
    g_, b_, al, db, fused = C.gates_args(g, beta, a, b, A_log, dt_bias, B, T, HV, k.device)
    paths, rows = accepted_paths(parents, p, acc)
    if inplace:
        out, out_idx = initial_state, idx
    else:
        out = C.alloc((B, HV, K, V), torch.float32, k.device, poison)
        out_idx = checks.constant("slots", B, k.device)
    BK, BV = C.next_pow2(K, 1), min(block_v, C.next_pow2(V, 1))
    (k, ks), (v, vs) = C.rows_of(k), C.rows_of(v)  # as given where their rows are, else contiguous copies
    kw = dict(k=k, v=v, KS=ks, VS=vs, g=g_, beta=b_, A_log=al, dt_bias=db, paths=paths, acc=rows,
              state=initial_state, state_idx=idx, out=out, out_idx=out_idx, T=T, TP=paths.shape[1],
              DMAX=paths.shape[2], H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, FUSED=fused, L2NORM=use_qk_l2norm,
              STATE_VK=C.state_vk(initial_state), OUT_VK=C.state_vk(out), num_warps=num_warps)
    return bind(_gdn_commit_kernel, (C.cdiv(V, BV), B * HV), kw), out


@triton.jit
def _conv_commit_kernel(x, src, window, win_idx, out, out_idx, acc, T, C, W: tl.constexpr, BC: tl.constexpr,
                        BW: tl.constexpr):
    """out slot <- the last W-1 inputs along the accepted path (src row of node acc[b])."""
    i_c = tl.program_id(0)
    i_b = tl.program_id(1)
    o_c = i_c * BC + tl.arange(0, BC)
    o_w = tl.arange(0, BW)
    mc = o_c < C
    mw = o_w < W - 1
    m2 = mc[:, None] & mw[None, :]
    a = tl.load(acc + i_b)
    slot = tl.load(win_idx + i_b).to(tl.int64)
    j = tl.load(src + (i_b * T + a) * W + 1 + o_w, mask=mw, other=0)  # [BW] sources of window positions
    from_win = tl.load(window + (slot * C + o_c[:, None]) * (W - 1) + tl.minimum(j, W - 2)[None, :], mask=m2, other=0.0)
    from_x = tl.load(x + (i_b * T + tl.maximum(j - (W - 1), 0)).to(tl.int64)[None, :] * C + o_c[:, None],
                     mask=m2, other=0.0)
    vals = tl.where((j < W - 1)[None, :], from_win, from_x.to(from_win.dtype))
    tl.debug_barrier()  # every read of the old window is done before the (possibly in-place) write
    oslot = tl.load(out_idx + i_b).to(tl.int64)
    tl.store(out + (oslot * C + o_c[:, None]) * (W - 1) + o_w[None, :], vals, mask=m2)


def conv_tree_commit_triton(x, *, parents, accepted, initial_window, state_indices=None, inplace=False,
                            block_c: int = 128):
    """Window after root..accepted[b]: x [B, T, C]; initial_window [B or N, C, W-1]."""
    B, T, Cn, W = checks.check_conv_commit(x, initial_window, pooled=True)
    C.check_device(x, initial_window)
    p = checks.check_parents(parents, B, T, x.device)
    acc = checks.check_accepted(accepted, B, T, x.device)
    idx = C.window_slots(initial_window, state_indices, B)
    src = checks.conv_table(parents, p, W, "exact")  # a TreePlan's cached table: no per-layer rebuild
    if inplace:
        out, out_idx = initial_window, idx
    else:
        out = C.alloc((B, Cn, W - 1), initial_window.dtype, x.device)
        out_idx = checks.constant("slots", B, x.device)
    BC = min(block_c, C.next_pow2(Cn, 1))
    launch(_conv_commit_kernel, (C.cdiv(Cn, BC), B),
           x=x.contiguous(), src=src, window=initial_window, win_idx=idx, out=out, out_idx=out_idx,
           acc=acc.to(torch.int32).contiguous(), T=T, C=Cn, W=W, BC=BC, BW=C.next_pow2(W - 1, 1))
    return out
