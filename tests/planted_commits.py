"""Commits that copy a verify's kept node states into the pool wrongly, for `ddsim check-kernel --commit` to catch
(tests/test_check_kernel.py). Each takes SGLang's fused_mamba_state_scatter_with_mask signature, (dst [L, N, *state],
src [L, M, P, *state], dst_indices [B], step_indices [B] (-1: nothing to commit), src_indices [B]), and copies
dst[l, dst_indices[b]] = src[l, src_indices[b], step_indices[b]] but for one thing. The verify before them is SGLang's
own and right, so every verify and node-state property holds: only the commit's may fail."""
import torch
import triton
import triton.language as tl

from tests.planted_launches import kept_by_identity


def _copies(dst, src, dst_indices, steps, rows, *, layers=None, skip_none=True):
    """(layer, slot, row, step) of each copy the contract asks for (all layers unless ``layers``)."""
    for b in range(steps.shape[0]):
        step, slot, row = int(steps[b]), int(dst_indices[b]), int(rows[b])
        if (skip_none and step < 0) or slot < 0:
            continue
        for l in (range(dst.shape[0]) if layers is None else layers):
            yield l, slot, row, step


def rows_by_request_index(dst, src, dst_indices, step_indices, src_indices=None):
    """The kept states read from row b for request b, the source rows ignored (SGLang's scatter before it took
    src_indices: right only where the verify kept request b's states in row b)."""
    for l, slot, row, step in _copies(dst, src, dst_indices, step_indices, torch.arange(step_indices.shape[0])):
        dst[l, slot] = src[l, row, step]


def the_next_node(dst, src, dst_indices, step_indices, src_indices=None):
    """The accepted length taken for the last accepted node's index: node step + 1's state (the next in the buffer's
    row, another branch's node or an unwritten step) committed."""
    for l, slot, row, step in _copies(dst, src, dst_indices, step_indices, src_indices):
        dst[l, slot] = src[l, row, min(step + 1, src.shape[2] - 1)]


def state_rounded_to_bf16(dst, src, dst_indices, step_indices, src_indices=None):
    """The state copied through a bf16 staging buffer: the pool's fp32 state loses its low 16 bits."""
    for l, slot, row, step in _copies(dst, src, dst_indices, step_indices, src_indices):
        dst[l, slot] = src[l, row, step].to(torch.bfloat16).to(dst.dtype)


def no_step_is_a_step(dst, src, dst_indices, step_indices, src_indices=None):
    """A request with nothing to commit (step -1) not skipped: -1 indexes the row's last step, whose contents go into
    its slot."""
    for l, slot, row, step in _copies(dst, src, dst_indices, step_indices, src_indices, skip_none=False):
        dst[l, slot] = src[l, row, step]


def first_layer_only(dst, src, dst_indices, step_indices, src_indices=None):
    """The layer axis taken for one layer's: only layer 0's slots committed."""
    for l, slot, row, step in _copies(dst, src, dst_indices, step_indices, src_indices, layers=[0]):
        dst[l, slot] = src[l, row, step]


@triton.jit
def _copy_in_32_bits(src, dst, dst_indices, steps, rows, ENTRY, SRC_LAYER, SRC_ROW, DST_LAYER, DST_SLOT,
                     BLOCK: tl.constexpr):
    b = tl.program_id(0)
    layer = tl.program_id(1)  # int32, and so every offset below: it wraps past 2^31 elements
    step = tl.load(steps + b)
    slot = tl.load(dst_indices + b)
    if (step >= 0) & (slot >= 0):
        row = tl.load(rows + b)
        o = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
        m = o < ENTRY
        x = tl.load(src + (layer * SRC_LAYER + row * SRC_ROW + step * ENTRY + o), mask=m)
        tl.store(dst + (layer * DST_LAYER + slot * DST_SLOT + o), x, mask=m)


def offsets_in_32_bits(dst, src, dst_indices, step_indices, src_indices=None):
    """The scatter with its offsets in 32-bit integers (layer * layer stride in int32; the layer's and the slot's
    strides read from dst, as SGLang's are): past 2^31 elements into the pool or the kept states (a model's every layer
    at once, the serving profile's commit example, on a GPU) it copies from, and into, other entries; below that it is
    right."""
    entry = dst[0, 0].numel()
    BLOCK = 1024
    _copy_in_32_bits[(step_indices.shape[0], dst.shape[0], triton.cdiv(entry, BLOCK))](
        src, dst, dst_indices.to(torch.int32), step_indices.to(torch.int32), src_indices.to(torch.int32), entry,
        src.stride(0), src.stride(1), dst.stride(0), dst.stride(1), BLOCK=BLOCK)


def layers_one_after_another(dst, src, dst_indices, step_indices, src_indices=None):
    """dst's layers taken to lie one after another (layer l's slot s at (l N + s) entries from its start), not where
    its strides put them: right on such a pool; on one whose slots hold every layer's entry side by side (a server's
    unified pool, whose layer and slot strides SGLang's scatter reads) the copies land in other slots' entries."""
    L, N = dst.shape[:2]
    entry = dst[0, 0].numel()
    flat = dst.as_strided((L * N, *dst.shape[2:]), (entry, *dst.stride()[2:]), dst.storage_offset())
    for l, slot, row, step in _copies(dst, src, dst_indices, step_indices, src_indices):
        flat[l * N + slot] = src[l, row, step]


_slots_kept = kept_by_identity()  # the slots, kept by the index tensor's identity


def slots_kept_by_tensor(dst, src, dst_indices, step_indices, src_indices=None):
    """A right copy whose launcher keeps the slots it writes by the dst_indices tensor's identity (fla's
    tensor_cache): on fresh tensors right; replayed as a server replays its state update from a CUDA graph, the first
    step's slots every step, so this step's accepted states land in that step's slots."""
    for l, slot, row, step in _copies(dst, src, _slots_kept(dst_indices), step_indices, src_indices):
        dst[l, slot] = src[l, row, step]
