"""Attention: fused prefill (`flash_attention`), split-KV decode (`decode_attention`) and paged decode
(`paged_decode_attention`), each ending in a validated `KernelSpec`.

Every kernel computes softmax(Q Kᵀ · scale + mask) V with an online softmax (running row maximum and row sum, the
accumulator rescaled as the maximum grows), in float32, on float16 or bfloat16 tensors; the probabilities P are
rounded to the input dtype before the P·V product (as FlashAttention does, so the tensor cores take both operands).
Grouped-query attention: query head `h` reads KV head `h // (heads // kv_heads)`.

Definitions every kernel and the oracle (`nbxcert.oracles.attention`) share:
- causal masks are aligned bottom-right (a prefill continuing a KV cache of `kv_len - q_len` earlier tokens): query
  row `i` sees key `j` iff `j <= i + (kv_len - q_len)`;
- a row that sees no key (causal rows `i < q_len - kv_len`, `kv_len == 0`, a decode sequence of length 0) is zeros.

Head dims that are not powers of two (80, 96) run in a tile of the next power of two (`BLOCK_D`), masked.

Prefill candidates (named factories `flash_pointer_configs`, `flash_tma_configs`): BLOCK_M x BLOCK_N x warps x
stages, with pointer loads (every device and layout) or, on Hopper and later, the tensor memory accelerator
(`TMA` = 1: host descriptors of the 4-d tensors, whose copy engine zero-fills rows and lanes past the tensor), which
needs TMA-legal tensors: the `aligned` key field. Tiles with no mask (inside kv_len and, causal, fully visible) run
in a first loop without masks, the boundary tiles in a second. The prune uses device facts only: shared memory
(`flash_shared_bytes`, an upper bound checked by cross-compiling for sm_80/sm_90), the float32 accumulator against
the per-thread register limit, stages and threads, and TMA's compute capability.

Keys: batch on the `batch` ladder, q_len on `tokens`, kv_len (decode: the longest sequence) on `kv_len`; heads,
kv_heads, head_dim, causal, aligned and the paged block size exact.

Decode splits each sequence's KV range into `NUM_SPLITS` chunks (a multiple of `BLOCK_N` long), writes one partial
result per chunk (output normalised by its own sum, and its log2-sum-exp) to a float32 workspace, and a second kernel
combines the chunks of each (sequence, head) in split order 0, 1, ... — a fixed order, so a launch is reproducible.
All query heads of one KV head are processed by one program (the KV tile is read once per group), padded to at least
16 rows (`tl.dot`'s minimum).

Under Triton's interpreter (`UPCAST`), tiles are converted to float32 before `tl.dot`: the interpreter's `tl.dot`
multiplies bfloat16 tensors as their raw uint16 bits (seen with Triton 3.6 and 3.9). P is still rounded to the input
dtype first, and float32 -> bfloat16 rounds to nearest even there too (`_narrow`: the interpreter's own cast
truncates), so the interpreter sees the same rounding as the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import attention64, faults, products
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.backends import select
from nbxcert.kernels.common import family_spec
from nbxcert.kernels.dtypes import bfloat16_bits_to_float32
from nbxcert.kernels.faults import record_fault, record_fault_lanes
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import SPLIT_WORKSPACE, KernelLaunch, cdiv, next_power_of_2, served
from nbxcert.kernels.launch import run_all as _run
from nbxcert.kernels.prune import limit, prune_with, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KernelSpec, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_numpy
from nbxcert.oracles import attention as _oracle

LOG2E = 1.4426950408889634
DTYPES = (("float16",), ("bfloat16",))
MAX_SPLITS = 16  # the largest NUM_SPLITS among the decode candidates: make_inputs sizes the workspace for it


# --- kernels ----------------------------------------------------------------------------------------------------------
@jit
def _narrow(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """float32 `x` converted to DTYPE, rounding to nearest even.

    On a GPU that is `x.to(DTYPE)`. Triton's interpreter converts float32 to bfloat16 by truncation (its cast passes
    no rounding mode; seen with Triton 3.6 and 3.9), so under UPCAST the rounding is done here on the bits first
    (finite values only, which is all these kernels narrow), and the truncating cast is then exact."""
    if UPCAST and tl.bfloat16 == DTYPE:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(DTYPE)


@jit
def _attend_tile(
    acc,
    l_i,
    m_i,
    q,
    k_ptrs,
    v_ptrs,
    start_n,
    offs_m,
    offs_n,
    offs_d,
    kv_len,
    diag,
    qk_scale,
    stride_kn,
    stride_vn,
    b,
    kvh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_N: tl.constexpr,
    MASK_CAUSAL: tl.constexpr,
    TMA: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One KV tile of the prefill's online softmax; returns the updated (acc, l_i, m_i).

    acc [BLOCK_M, BLOCK_D] float32: running sum of P·V, scaled to the running max `m_i`.
    l_i, m_i [BLOCK_M] float32: running row sum of P and running row max of the scores (log2 units; -inf: none yet).
    q [BLOCK_M, BLOCK_D]: the query tile. k_ptrs, v_ptrs [BLOCK_N, BLOCK_D]: pointers to key/value rows 0..BLOCK_N-1.
    start_n: first key of this tile. offs_m, offs_n, offs_d: query rows, tile columns and head-dim lanes.
    kv_len: number of keys; diag = kv_len - q_len (causal: row i sees key j iff j <= i + diag).
    qk_scale: softmax scale (> 0) times log2(e). stride_kn, stride_vn: key/value row strides (elements).
    b, kvh: batch and KV head (int32), the descriptor coordinates under TMA.
    HEAD_DIM / BLOCK_D: the head dim and its power-of-two tile. BLOCK_N: keys per tile. MASK_N: mask keys >= kv_len.
    MASK_CAUSAL: apply the causal mask. TMA: k_ptrs / v_ptrs are tensor descriptors of K / V ([batch, kv_heads,
    kv_len, head_dim], block [1, 1, BLOCK_N, BLOCK_D]; rows and lanes past the tensor read as zero).
    UPCAST: convert tiles to float32 before tl.dot (the interpreter's tl.dot is wrong on bfloat16).
    """
    n = start_n + offs_n
    if TMA:
        k = k_ptrs.load([b, kvh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        v = v_ptrs.load([b, kvh, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
    else:
        kv_mask = offs_d[None, :] < HEAD_DIM
        if MASK_N:
            kv_mask = kv_mask & (n[:, None] < kv_len)
        if MASK_N or HEAD_DIM != BLOCK_D:
            k = tl.load(k_ptrs + start_n * stride_kn, mask=kv_mask, other=0.0)
            v = tl.load(v_ptrs + start_n * stride_vn, mask=kv_mask, other=0.0)
        else:
            k = tl.load(k_ptrs + start_n * stride_kn)
            v = tl.load(v_ptrs + start_n * stride_vn)
    if UPCAST:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    else:
        s = tl.dot(q, tl.trans(k))
    if MASK_N:
        s = tl.where(n[None, :] < kv_len, s, float("-inf"))
    if MASK_CAUSAL:
        s = tl.where(n[None, :] <= offs_m[:, None] + diag, s, float("-inf"))
    # the scale (> 0) is applied to the row maxima and then fused into exp2's argument (one FMA per score): the
    # softmax's element-wise work, not the products, bounds this loop on tensor-core GPUs
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    if MASK_N or MASK_CAUSAL:
        # a row with no visible key so far keeps m = -inf; subtracting 0 keeps exp2 away from (-inf) - (-inf)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new  # every score of an unmasked tile is finite
    p = tl.math.exp2(s * qk_scale - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    p_in = _narrow(p, v.dtype, UPCAST)
    if UPCAST:
        acc += tl.dot(p_in.to(tl.float32), v.to(tl.float32))
    else:
        acc = tl.dot(p_in, v, acc)
    return acc, l_i, m_new


@jit
def _flash_fwd_kernel(
    Q,
    K,
    V,
    Out,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    heads,
    group,
    q_len,
    kv_len,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    TMA: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Prefill attention, one program per (BLOCK_M query rows, batch x head).

    Q [batch, heads, q_len, head_dim], K and V [batch, kv_heads, kv_len, head_dim], Out like Q; any strides
    (`stride_<tensor><dim>`, in elements: b batch, h head, m/n row, d head-dim lane). With TMA, Q, K, V and Out are
    host tensor descriptors of those tensors (blocks [1, 1, BLOCK_M or BLOCK_N, BLOCK_D]; the copy engine zero-fills
    rows and lanes past the tensor and clips the store), and the strides are not used.
    heads: query heads; group = heads // kv_heads (query head h reads KV head h // group).
    q_len, kv_len: rows of Q and of K/V. qk_scale: softmax scale (> 0) times log2(e) (the kernel works in exp2).
    HEAD_DIM: the head dim; BLOCK_D: its next power of two (lanes >= HEAD_DIM are masked).
    BLOCK_M, BLOCK_N: query rows per program, keys per tile. CAUSAL: bottom-right causal mask.
    TMA: Hopper's tensor memory accelerator moves the tiles (see above). UPCAST: float32 operands for tl.dot
    (interpreter only; see the module docstring).

    Grid: (cdiv(q_len, BLOCK_M), batch * heads). Tiles that need no mask (fully inside kv_len and, when causal,
    fully visible to every row of the block) run in a first loop without masks; the rest in a second, masked one.
    """
    pid_m = tl.program_id(0)
    if CAUSAL:
        # the last row blocks see the most keys: start them first so the short ones fill the tail of the grid
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = bh % heads
    kvh = (h // group).to(tl.int64)
    h = h.to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    b32, h32, kvh32 = b.to(tl.int32), h.to(tl.int32), kvh.to(tl.int32)  # descriptor coordinates
    if TMA:
        q = Q.load([b32, h32, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        k_ptrs = K
        v_ptrs = V
    else:
        q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < q_len) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        k_ptrs = K + b * stride_kb + kvh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = V + b * stride_vb + kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    diag = kv_len - q_len
    if CAUSAL:
        # keys every row of the block sees: j <= start_m + diag; keys any row sees: j < start_m + BLOCK_M + diag
        full_end = tl.maximum(tl.minimum(kv_len, start_m + diag + 1), 0)
        end = tl.maximum(tl.minimum(kv_len, start_m + BLOCK_M + diag), 0)
    else:
        full_end = kv_len
        end = kv_len
    full_end = (full_end // BLOCK_N) * BLOCK_N
    # two passes over the keys: the tiles that need no mask [0, full_end), then the masked ones [full_end, end)
    for masked in tl.static_range(2):
        if masked:
            lo, hi = full_end, end
        else:
            lo, hi = 0, full_end
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _attend_tile(
                acc,
                l_i,
                m_i,
                q,
                k_ptrs,
                v_ptrs,
                start_n,
                offs_m,
                offs_n,
                offs_d,
                kv_len,
                diag,
                qk_scale,
                stride_kn,
                stride_vn,
                b32,
                kvh32,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_N,
                masked == 1,
                CAUSAL and masked == 1,
                TMA,
                UPCAST,
            )

    # l_i == 0 only for a row that saw no key, whose acc is 0: it is written as 0 (the defined fully-masked row)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if TMA:
        Out.store([b32, h32, start_m, 0], _narrow(out, q.dtype, UPCAST).reshape(1, 1, BLOCK_M, BLOCK_D))
    else:
        o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
        o_mask = (offs_m[:, None] < q_len) & (offs_d[None, :] < HEAD_DIM)
        tl.store(o_ptrs, _narrow(out, Out.dtype.element_ty, UPCAST), mask=o_mask)


@jit
def _decode_partial_kernel(
    Q,
    K,
    V,
    Out,
    Mid,
    Lengths,
    BlockTable,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_od,
    stride_tb,
    stride_tn,
    heads,
    group,
    lse_offset,
    qk_scale,
    Fault,
    length_bound,
    num_blocks,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Decode, stage 1: one program per (sequence, KV head, split) attends the group's query heads to one chunk.

    Q [batch, heads, head_dim]; Out [batch, heads, head_dim] (written only when NUM_SPLITS == 1).
    Contiguous cache (PAGE_SIZE == 0): K, V [batch, kv_heads, capacity, head_dim], `stride_kb` the batch stride,
    `stride_kn` the position stride. Paged cache (PAGE_SIZE > 0): K, V [num_blocks, PAGE_SIZE, kv_heads, head_dim],
    `stride_kb` the block stride, `stride_kn` the position-in-block stride; BlockTable [batch, max_blocks] int32
    (strides stride_tb, stride_tn) maps position t of sequence b to block BlockTable[b, t // PAGE_SIZE]. Unused when
    PAGE_SIZE == 0. Strides (`stride_<tensor><dim>`) are in elements, any layout.
    Lengths [batch] int32: valid positions of each sequence. Checked here (`nbxcert.kernels.faults`): a length
    outside [0, length_bound] (the capacity, the block table's reach, or the caller's max_len) is recorded at Fault
    and its sequence attends to nothing (zeros); a paged block id outside [0, num_blocks) is recorded and its
    positions skipped.
    Mid: float32 workspace, [batch, heads, NUM_SPLITS, HEAD_DIM] partial outputs (each normalised by its own sum)
    followed, at element `lse_offset`, by [batch, heads, NUM_SPLITS] log2-sum-exps (-inf for an empty chunk).
    heads, group: query heads and heads // kv_heads. qk_scale: softmax scale (> 0) times log2(e).
    HEAD_DIM / BLOCK_D: head dim and its power-of-two tile. BLOCK_H: query-head rows (>= group, >= 16).
    BLOCK_N: positions per tile. NUM_SPLITS: chunks per sequence (each a multiple of BLOCK_N long).
    UPCAST: float32 operands for tl.dot (interpreter only).
    """
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(Lengths + b)
    bad_length = (length < 0) | (length > length_bound)
    record_fault(Fault, 3, b, length, length_bound, bad_length)
    length = tl.where(bad_length, 0, length)
    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, length)

    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < group
    d_ok = offs_d < HEAD_DIM
    head = kvh * group + offs_h
    b64 = b.to(tl.int64)
    q_ptrs = Q + b64 * stride_qb + head[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_head = K + kvh.to(tl.int64) * stride_kh + offs_d[None, :] * stride_kd
    v_head = V + kvh.to(tl.int64) * stride_vh + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        n = start_n + offs_n
        n_ok = n < end
        if PAGE_SIZE > 0:
            column = n // PAGE_SIZE
            block = tl.load(BlockTable + b64 * stride_tb + column * stride_tn, mask=n_ok, other=0)
            block = block.to(tl.int64)
            bad_block = n_ok & ((block < 0) | (block >= num_blocks))
            record_fault_lanes(Fault, 4, b64 * stride_tb + column * stride_tn, block, num_blocks, bad_block)
            n_ok = n_ok & (bad_block == 0)
            k_rows = block * stride_kb + (n % PAGE_SIZE) * stride_kn
            v_rows = block * stride_vb + (n % PAGE_SIZE) * stride_vn
        else:
            k_rows = b64 * stride_kb + n.to(tl.int64) * stride_kn
            v_rows = b64 * stride_vb + n.to(tl.int64) * stride_vn
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_head + k_rows[:, None], mask=kv_mask, other=0.0)
        v = tl.load(v_head + v_rows[:, None], mask=kv_mask, other=0.0)
        if UPCAST:
            s = tl.dot(q, tl.trans(k.to(tl.float32)))
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * qk_scale - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        p_in = _narrow(p, V.dtype.element_ty, UPCAST)
        if UPCAST:
            acc += tl.dot(p_in.to(tl.float32), v.to(tl.float32))
        else:
            acc = tl.dot(p_in, v, acc)
        m_i = m_new

    seen = l_i > 0.0
    part = acc / tl.where(seen, l_i, 1.0)[:, None]  # an empty chunk (or sequence) leaves acc == 0: part is 0
    if NUM_SPLITS == 1:
        o_ptrs = Out + b64 * stride_ob + head[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(o_ptrs, _narrow(part, Out.dtype.element_ty, UPCAST), mask=h_ok[:, None] & d_ok[None, :])
    else:
        row = (b64 * heads + head) * NUM_SPLITS + split
        tl.store(Mid + row[:, None] * HEAD_DIM + offs_d[None, :], part, mask=h_ok[:, None] & d_ok[None, :])
        lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(Mid + lse_offset + row, lse, mask=h_ok)


@jit
def _decode_combine_kernel(
    Mid,
    Out,
    stride_ob,
    stride_oh,
    stride_od,
    heads,
    lse_offset,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Decode, stage 2: one program per (sequence, query head) merges the NUM_SPLITS partial results in split order.

    Mid: the float32 workspace stage 1 wrote (layout in `_decode_partial_kernel`); lse_offset: where its
    log2-sum-exps start. Out [batch, heads, head_dim], strides in elements. heads: query heads.
    HEAD_DIM / BLOCK_D: head dim and its power-of-two tile. NUM_SPLITS: partial results per (sequence, head).
    UPCAST: interpreter rounding of the output (see `_narrow`).
    The merge runs split 0, 1, ... one after another (an unrolled loop): the same inputs give the same bits.
    """
    bh = tl.program_id(0)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row0 = bh.to(tl.int64) * NUM_SPLITS
    m = tl.load(Mid + lse_offset + row0)
    acc = tl.load(Mid + row0 * HEAD_DIM + offs_d, mask=d_ok, other=0.0)
    l_sum = tl.where(m == float("-inf"), 0.0, 1.0)
    for s in tl.static_range(1, NUM_SPLITS):
        lse = tl.load(Mid + lse_offset + row0 + s)
        part = tl.load(Mid + (row0 + s) * HEAD_DIM + offs_d, mask=d_ok, other=0.0)
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_safe)
        w = tl.math.exp2(lse - m_safe)
        acc = acc * alpha + part * w
        l_sum = l_sum * alpha + w
        m = m_new
    out = acc / tl.where(l_sum > 0.0, l_sum, 1.0)  # no split saw a key: acc is 0, the row is 0
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_d * stride_od
    tl.store(o_ptrs, _narrow(out, Out.dtype.element_ty, UPCAST), mask=d_ok)


# --- configs: named factories -----------------------------------------------------------------------------------------
def flash_config(block_m: int, block_n: int, num_warps: int, num_stages: int, tma: int = 0) -> Config:
    """A prefill config: BLOCK_M query rows x BLOCK_N keys per tile, `num_warps` warps, `num_stages` pipeline depth;
    TMA = 1 moves tiles with Hopper's tensor memory accelerator (host descriptors), 0 with pointer loads."""
    return Config.make(num_warps=num_warps, num_stages=num_stages, BLOCK_M=block_m, BLOCK_N=block_n, TMA=int(tma))


def flash_pointer_configs() -> list[Config]:
    """Pointer loads: BLOCK_M {64, 128} x BLOCK_N {32, 64, 128} (BLOCK_N <= BLOCK_M) x warps {4, 8} x stages 1-5.
    Stages 1 keeps head dim 256 within a 99 KB shared memory (sm_86/sm_89); 3-5 feed Hopper's pipeline."""
    tiles = [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128)]
    return [flash_config(m, n, w, s) for m, n in tiles for w in (4, 8) for s in (1, 2, 3, 4, 5)]


def flash_tma_configs() -> list[Config]:
    """TMA tiles (Hopper and later): BLOCK_M x BLOCK_N {64x32, 64x64, 128x64, 128x128} x warps {4, 8} x stages
    {2, 3, 4}: the copy engine issues the loads, which frees the warps' issue slots for the softmax."""
    tiles = [(64, 32), (64, 64), (128, 64), (128, 128)]
    return [flash_config(m, n, w, s, tma=1) for m, n in tiles for w in (4, 8) for s in (2, 3, 4)]


def flash_candidates() -> tuple[Config, ...]:
    """Every prefill candidate: the pointer-load tiles, then the TMA tiles (the prune keeps those only on Hopper+)."""
    return tuple(flash_pointer_configs() + flash_tma_configs())


def decode_config(num_splits: int, block_n: int, num_warps: int, num_stages: int) -> Config:
    """A decode config: NUM_SPLITS chunks per sequence, BLOCK_N positions per tile, warps, pipeline depth."""
    return Config.make(num_warps=num_warps, num_stages=num_stages, NUM_SPLITS=num_splits, BLOCK_N=block_n)


def decode_candidates() -> tuple[Config, ...]:
    """NUM_SPLITS {1, 2, 4, 8, 16} x BLOCK_N {32, 64, 128} x (warps, stages) {(4, 1), (4, 2), (4, 3), (8, 2)}.
    Stages 1 is for devices whose file allows no pipelining (max_num_stages = 1)."""
    splits = (1, 2, 4, 8, MAX_SPLITS)
    shapes = ((4, 1), (4, 2), (4, 3), (8, 2))
    return tuple(decode_config(s, n, w, st) for s in splits for n in (32, 64, 128) for w, st in shapes)


FLASH_DEFAULT = flash_config(64, 64, 4, 2)  # pointer loads: runs on every device and layout
DECODE_DEFAULT = decode_config(4, 64, 4, 2)


# --- prune: device facts only -----------------------------------------------------------------------------------------
ELEMENT_BYTES = 2  # float16 / bfloat16, the only dtypes these kernels take
TMA_BARRIER_BYTES = 1024  # the most Triton's TMA pipeline was seen to add above its tiles (see flash_shared_bytes)


def block_d(head_dim: int) -> int:
    """The power-of-two tile a head dim runs in (80 -> 128, 96 -> 128)."""
    return max(16, next_power_of_2(int(head_dim)))


def block_h(group: int) -> int:
    """Query-head rows of a decode program: the group, padded to a power of two and to tl.dot's minimum of 16."""
    return max(16, next_power_of_2(int(group)))


def flash_shared_bytes(config: Config, head_dim: int, pre_ampere: bool = False) -> int:
    """An upper bound on the prefill kernel's shared memory: the Q tile and `max(1, num_stages)` buffers of the K and V
    tiles, plus 1024 bytes with TMA (the copy engine's barriers, which push the tiles to their next 1024-byte
    aligned start). Triton 3.6 and 3.9 report exactly this for sm_90 (wgmma keeps num_stages buffers; with TMA 16 or
    1024 bytes above the tiles) and less for sm_80, for every candidate and head dims 64/80/128/256. Before Ampere
    (`pre_ampere`: sm_70/sm_75, no cp.async) Triton stages the dot operands differently and was seen to take up to
    twice that (every stage-1 candidate, head dims 64 and 128, on sm_75), so the bound doubles there.
    tests/kernels/test_attention.py cross-compiles to check."""
    bm, bn, bd = config["BLOCK_M"], config["BLOCK_N"], block_d(head_dim)
    tiles = ELEMENT_BYTES * (bm * bd + max(1, config.num_stages) * 2 * bn * bd)
    tiles *= 2 if pre_ampere else 1
    return tiles + (TMA_BARRIER_BYTES if config["TMA"] else 0)


def decode_shared_bytes(
    config: Config, head_dim: int, group: int, pre_ampere: bool = False, paged: bool = False
) -> int:
    """An upper bound on the decode kernel's shared memory: the Q tile [BLOCK_H, BLOCK_D], P [BLOCK_H, BLOCK_N] and
    `max(1, num_stages - 1)` buffers of the K and V tiles (its products are too small for wgmma, so the pipeline
    keeps num_stages - 1 buffers on sm_80 and sm_90 alike), and for a paged cache a 32-bit word per position of the
    tile (the block-id check's mask changes layout through shared memory: 256 bytes at BLOCK_N 64 on sm_90). Triton
    3.6 reports exactly this or less for every candidate, head dims 64/128/256 and groups 1/4/8, contiguous and
    paged; before Ampere (sm_75, stage 1) up to 1.15 times it, and the bound doubles there as for the prefill. The
    tests cross-compile to check."""
    bh, bn, bd = block_h(group), config["BLOCK_N"], block_d(head_dim)
    size = ELEMENT_BYTES * (bh * bd + bh * bn + max(1, config.num_stages - 1) * 2 * bn * bd) + (4 * bn if paged else 0)
    return size * (2 if pre_ampere else 1)


def _pre_ampere(profile) -> bool:
    """Whether the device file states an NVIDIA compute capability below 8.0 (Volta, Turing)."""
    cc = getattr(profile, "compute_capability", None)
    return profile.backend == "cuda" and cc is not None and tuple(cc) < (8, 0)


def _accumulator_refusal(rows: int, head_dim: int, config: Config, profile) -> str | None:
    """The float32 accumulator alone [rows, BLOCK_D] must fit a thread's registers, or it can only spill. (AMD files
    state no per-thread register limit: their VGPR budget trades against occupancy, so nothing is checked there.)"""
    if profile.vendor == "amd":
        return None
    warp = limit(profile, "warp_size")
    max_regs = limit(profile, "max_registers_per_thread")
    if warp is None or max_regs is None:
        return None
    per_thread = rows * block_d(head_dim) // (warp * config.num_warps)
    if per_thread > max_regs:
        return (
            f"the float32 accumulator [{rows}, {block_d(head_dim)}] needs {per_thread} registers per thread with "
            f"num_warps={config.num_warps} > max_registers_per_thread={max_regs}"
        )
    return None


def _tma_refusal(config: Config, problem: Mapping[str, Any], profile) -> str | None:
    """TMA tiles need the copy engine (compute capability >= 9.0, from the device file; Triton's interpreter emulates
    tensor descriptors, so the interpreter keeps them and CI runs them) and TMA-legal tensors (`aligned` = 1)."""
    if not config["TMA"]:
        return None
    if profile.backend != "interpreter":
        cc = getattr(profile, "compute_capability", None)
        if profile.backend != "cuda" or cc is None or tuple(cc) < (9, 0):
            return f"TMA needs compute capability >= 9.0; {profile.key} states {cc}"
    if not problem.get("aligned", 0):
        return "TMA needs aligned=1 tensors (unit inner stride, 16-byte aligned base and strides)"
    return None


def prune_flash(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse prefill configs the device cannot hold: TMA tiles where there is no TMA or the tensors are not
    TMA-legal, shared memory over the opt-in maximum (head dim 256 with large tiles), an accumulator over the
    per-thread register limit, and the shared stage/thread limits."""
    d, old = int(problem["head_dim"]), _pre_ampere(profile)
    return prune_with(
        candidates,
        profile,
        lambda c: _tma_refusal(c, problem, profile),
        lambda c: shared_memory_refusal(flash_shared_bytes(c, d, old), profile),
        lambda c: _accumulator_refusal(c["BLOCK_M"], d, c, profile),
    )


def prune_decode(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse decode configs over the device's shared memory or register limits (and the shared limits)."""
    d, old = int(problem["head_dim"]), _pre_ampere(profile)
    group = int(problem["heads"]) // int(problem["kv_heads"])
    return prune_with(
        candidates,
        profile,
        lambda c: shared_memory_refusal(decode_shared_bytes(c, d, group, old, "block_size" in problem), profile),
        lambda c: _accumulator_refusal(block_h(group), d, c, profile),
    )


# --- launches ---------------------------------------------------------------------------------------------------------
def _upcast() -> bool:
    return select().name == "interpreter"


def _check_float_dtype(name: str, t: Tensor) -> None:
    if t.dtype.name not in ("float16", "bfloat16"):
        raise ShapeMismatch(f"attention: {name} has dtype {t.dtype.name}; float16 or bfloat16 is required")


def _check_same_dtype(named: Mapping[str, Tensor]) -> None:
    names = list(named)
    first = named[names[0]]
    _check_float_dtype(names[0], first)
    for n in names[1:]:
        if named[n].dtype is not first.dtype:
            raise ShapeMismatch(f"attention: {n} is {named[n].dtype.name} but {names[0]} is {first.dtype.name}")


def _check_heads(heads: int, kv_heads: int) -> None:
    if kv_heads < 1 or heads % kv_heads:
        raise ShapeMismatch(f"attention: {heads} query heads are not a multiple of {kv_heads} KV heads")


def _default_scale(head_dim: int, scale: float | None) -> float:
    """1/sqrt(head_dim), or the caller's scale, which must be finite and positive: the kernels scale the row maxima
    rather than every score, which only a positive scale leaves in place."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not math.isfinite(float(scale)) or float(scale) <= 0.0:
        raise LaunchError(f"attention: the softmax scale must be finite and positive, got {scale}")
    return float(scale)


def flash_launches(
    config: Config, q: Tensor, k: Tensor, v: Tensor, out: Tensor, scale: float, causal: bool
) -> list[KernelLaunch]:
    """The prefill launch for validated tensors (none when there is no query row)."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if q_len == 0 or batch * heads == 0:
        return []
    bm, bn, bd = config["BLOCK_M"], config["BLOCK_N"], block_d(head_dim)
    tma = bool(config["TMA"])
    if tma:
        operands = (_descriptor(q, "q", bm, bd), _descriptor(k, "k", bn, bd), _descriptor(v, "v", bn, bd))
        operands += (_descriptor(out, "out", bm, bd),)
    else:
        operands = (q, k, v, out)
    args = (*operands, *q.strides, *k.strides, *v.strides, *out.strides)
    args += (heads, heads // kv_heads, q_len, kv_len, scale * LOG2E)
    kwargs = dict(HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal), TMA=tma)
    kwargs.update(UPCAST=_upcast(), num_warps=config.num_warps, num_stages=config.num_stages)
    return [KernelLaunch(_flash_fwd_kernel, (cdiv(q_len, bm), batch * heads), args, kwargs)]


def tma_ready(t: Tensor) -> bool:
    """Whether the copy engine can read `t` as it lies: unit inner stride, 16-byte aligned base and other strides."""
    item = t.itemsize
    return t.data_ptr() % 16 == 0 and t.strides[-1] == 1 and all((st * item) % 16 == 0 for st in t.strides[:-1])


def _descriptor(t: Tensor, what: str, rows: int, cols: int):
    """A host descriptor of a [batch, heads, len, dim] tensor, block [1, 1, rows, cols]. A length of 0 is described
    as 1 (TMA cannot describe an empty dimension; the kernel reads no row of it then). Refuses a tensor TMA cannot
    read (the prune refuses TMA configs for problems with aligned=0, so a certified launch never gets here with one)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not tma_ready(t):
        raise LaunchError(
            f"flash_attention: {what} (strides {t.strides}, base 0x{t.data_ptr():x}) cannot be read by TMA: it needs a "
            "unit inner stride and a 16-byte aligned base and strides; use a TMA=0 config"
        )
    shape = [t.shape[0], t.shape[1], max(t.shape[2], 1), t.shape[3]]
    return TensorDescriptor(t, shape, list(t.strides), [1, 1, rows, cols])


def _workspace_elements(batch: int, heads: int, num_splits: int, head_dim: int) -> int:
    return batch * heads * num_splits * (head_dim + 1)


def decode_workspace_elements(batch: int, heads: int, head_dim: int) -> int:
    """float32 elements of a decode workspace that every candidate fits (NUM_SPLITS up to MAX_SPLITS)."""
    return _workspace_elements(batch, heads, MAX_SPLITS, head_dim)


def decode_workspace(batch: int, heads: int, head_dim: int, device: str = "cpu") -> Tensor:
    """A decode workspace every candidate fits, to reuse across launches on one stream."""
    return empty((decode_workspace_elements(batch, heads, head_dim),), "float32", device)


def _check_workspace(workspace: Tensor | None, q: Tensor) -> None:
    if workspace is None:
        return
    needed = decode_workspace_elements(*q.shape)
    if workspace.dtype.name != "float32" or workspace.numel < needed or not workspace.is_contiguous():
        raise ShapeMismatch(
            f"decode attention: the workspace must be a contiguous float32 tensor of at least {needed} elements "
            f"(decode_workspace_elements), got {workspace.dtype.name} {workspace.shape}"
        )


def decode_launches(
    config: Config,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lengths: Tensor,
    out: Tensor,
    scale: float,
    workspace: Tensor | None,
    block_table: Tensor | None = None,
    max_len: int | None = None,
) -> list[KernelLaunch]:
    """Both decode launches (one when NUM_SPLITS == 1) for validated tensors; `block_table` given: k and v are paged
    pools [num_blocks, block_size, kv_heads, dim]. `workspace` None: allocated here (when NUM_SPLITS > 1). The kernel
    checks each length against the cache's capacity (or the block table's reach) and `max_len` when given, and each
    paged block id against the pool (`nbxcert.kernels.faults`)."""
    batch, heads, head_dim = q.shape
    paged = block_table is not None
    kv_heads = k.shape[2] if paged else k.shape[1]
    if batch * heads == 0:
        return []
    splits, bn = config["NUM_SPLITS"], config["BLOCK_N"]
    group = heads // kv_heads
    needed = _workspace_elements(batch, heads, splits, head_dim)
    if splits == 1:
        mid = out  # not read or written by the kernel (it writes Out directly), but a pointer must be passed
    else:
        if workspace is None:
            workspace = empty((needed,), "float32", q.device)
        if workspace.dtype.name != "float32" or workspace.numel < needed or not workspace.is_contiguous():
            raise ShapeMismatch(
                f"decode attention: the workspace must be a contiguous float32 tensor of at least {needed} elements, "
                f"got {workspace.dtype.name} {workspace.shape}"
            )
        mid = workspace
    if paged:
        k_strides = (k.strides[0], k.strides[2], k.strides[1], k.strides[3])  # block, head, position, lane
        v_strides = (v.strides[0], v.strides[2], v.strides[1], v.strides[3])
        table, table_strides, page = block_table, block_table.strides, k.shape[1]
        bound, num_blocks = block_table.shape[1] * page, k.shape[0]
    else:
        k_strides, v_strides = k.strides, v.strides
        table, table_strides, page = lengths, (0, 0), 0
        bound, num_blocks = k.shape[2], 0
    bound = bound if max_len is None else min(bound, max_len)
    lse_offset = batch * heads * splits * head_dim
    args = (q, k, v, out, mid, lengths, table, *q.strides, *k_strides, *v_strides, *out.strides, *table_strides)
    args += (heads, group, lse_offset, scale * LOG2E, faults.word(q.device), bound, num_blocks)
    kwargs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_H=block_h(group), BLOCK_N=bn)
    kwargs.update(NUM_SPLITS=splits, PAGE_SIZE=page, UPCAST=_upcast())
    kwargs.update(num_warps=config.num_warps, num_stages=config.num_stages)
    launches = [KernelLaunch(_decode_partial_kernel, (batch, kv_heads, splits), args, kwargs)]
    if splits > 1:
        args = (mid, out, *out.strides, heads, lse_offset)
        kwargs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), NUM_SPLITS=splits, UPCAST=_upcast())
        # the merge reads NUM_SPLITS * (head_dim + 1) floats per program: a small fixed launch, not a tuned one
        kwargs.update(num_warps=4, num_stages=1)
        launches.append(KernelLaunch(_decode_combine_kernel, (batch * heads,), args, kwargs))
    return launches


# --- user-facing functions and their problems -------------------------------------------------------------------------
def flash_problem(q: Tensor, k: Tensor, v: Tensor, out: Tensor | None = None, *, causal: bool = False, **_) -> dict:
    """The prefill problem of a launch (validates shapes and dtypes)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ShapeMismatch(f"flash_attention: q, k, v must be 4-d [batch, heads, len, dim], got {q.shape} {k.shape}")
    batch, heads, q_len, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        raise ShapeMismatch(f"flash_attention: q {q.shape} does not fit k {k.shape} and v {v.shape}")
    _check_heads(heads, k.shape[1])
    _check_same_dtype({"q": q, "k": k, "v": v, **({"out": out} if out is not None else {})})
    if out is not None and out.shape != q.shape:
        raise ShapeMismatch(f"flash_attention: out has shape {out.shape}, q has {q.shape}")
    return {
        "batch": batch,
        "heads": heads,
        "kv_heads": k.shape[1],
        "q_len": q_len,
        "kv_len": k.shape[2],
        "head_dim": head_dim,
        "causal": int(bool(causal)),
        "aligned": int(all(tma_ready(t) for t in (q, k, v, out if out is not None else q))),
    }


@served
def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    config: Config | None = None,
) -> Tensor:
    """softmax(q kᵀ · scale + mask) v for q [batch, heads, q_len, dim] and k, v [batch, kv_heads, kv_len, dim].

    `causal`: bottom-right aligned (row i sees key j iff j <= i + kv_len - q_len); rows that see no key are zeros.
    `scale` defaults to 1/sqrt(dim). Any strides. Returns `out` (allocated like q when None). The config is the
    caller's, else the one serving chooses for the launch's key (`choose_config`: certified, or swept)."""
    out = empty(q.shape, q.dtype, q.device) if out is None else out
    problem = flash_problem(q, k, v, out, causal=causal)
    scale = _default_scale(q.shape[3], scale)

    def run(c: Config) -> None:
        _run(flash_launches(c, q, k, v, out, scale, causal))

    run(choose_config(FLASH_ATTENTION, problem, (q.dtype.name,), config, run=run, outputs=(out,)))
    return out


def _host_lengths(lengths: Tensor, batch: int, capacity: int | None) -> np.ndarray:
    """The lengths on the host (a device-to-host copy on a GPU), each checked to lie in [0, capacity]."""
    _check_lengths_tensor(lengths, batch)
    host = np.asarray(lengths.numpy()).astype(np.int64)
    bad = np.flatnonzero((host < 0) | ((host > capacity) if capacity is not None else False))
    if bad.size:
        b = int(bad[0])
        raise LaunchError(
            f"decode attention: sequence {b} has length {int(host[b])}, outside [0, {capacity}] (the cache capacity)"
        )
    return host


def _decode_shapes(q: Tensor, k: Tensor, v: Tensor, out: Tensor | None, kv_heads: int) -> None:
    if q.ndim != 3:
        raise ShapeMismatch(f"decode attention: q must be 3-d [batch, heads, dim], got {q.shape}")
    if k.shape != v.shape or k.ndim != 4:
        raise ShapeMismatch(f"decode attention: k and v caches must be 4-d and alike, got {k.shape} and {v.shape}")
    if k.shape[3] != q.shape[2]:
        raise ShapeMismatch(f"decode attention: q's head dim {q.shape[2]} differs from the cache's {k.shape[3]}")
    _check_heads(q.shape[1], kv_heads)
    _check_same_dtype({"q": q, "k_cache": k, "v_cache": v, **({"out": out} if out is not None else {})})
    if out is not None and out.shape != q.shape:
        raise ShapeMismatch(f"decode attention: out has shape {out.shape}, q has {q.shape}")


def _serve_decode(spec, problem: dict, tensors: tuple, out, scale, config, workspace, max_len) -> Tensor:
    """A decode call, contiguous or paged (`tensors`: q, k, v, lengths and the block table or None), its `problem`
    validated (by the spec's problem_of, which reads the lengths to the host without `max_len`: such a call gets no
    launch plan): its config chosen (the caller's, else the served one) and launched."""
    q, k, v, lengths, block_table = tensors
    out = empty(q.shape, q.dtype, q.device) if out is None else out
    _check_workspace(workspace, q)
    scale = _default_scale(q.shape[2], scale)

    def run(c: Config) -> None:
        _run(decode_launches(c, q, k, v, lengths, out, scale, workspace, block_table, max_len))

    cfg = choose_config(spec, problem, (q.dtype.name,), config, run=run, outputs=(out,))
    _launch_decode(cfg, tensors, out, workspace, scale, max_len)
    return out


def _launch_decode(cfg: Config, tensors: tuple, out: Tensor, workspace, scale: float, max_len) -> None:
    """Launch `cfg` for a decode call (`scale` already defaulted): the workspace a split config needs is made here when
    the caller gave none."""
    q, k, v, lengths, block_table = tensors
    if workspace is None and cfg["NUM_SPLITS"] > 1:
        # the shared per-stream float32 buffer (no allocation per call), its kernels queued back to back under its lock
        needed = _workspace_elements(q.shape[0], q.shape[1], cfg["NUM_SPLITS"], q.shape[2])
        with SPLIT_WORKSPACE.lock:
            shared = SPLIT_WORKSPACE.get(needed, q.device)
            _run(decode_launches(cfg, q, k, v, lengths, out, scale, shared, block_table, max_len))
    else:
        _run(decode_launches(cfg, q, k, v, lengths, out, scale, workspace, block_table, max_len))
    faults.after_launch(q.device)


def _check_lengths_tensor(lengths: Tensor, batch: int) -> None:
    if lengths.dtype.name != "int32" or lengths.shape != (batch,):
        raise ShapeMismatch(
            f"decode attention: lengths must be int32 [{batch}], got {lengths.dtype.name} {lengths.shape}"
        )


def _longest(lengths: Tensor, batch: int, capacity: int | None, max_len: int | None) -> int:
    """The key's kv_len: `max_len` as the caller gives it (checked against the cache's reach; the kernel checks each
    length against it), else the longest length read to the host."""
    if max_len is None:
        host = _host_lengths(lengths, batch, capacity)
        return int(host.max()) if host.size else 0
    _check_lengths_tensor(lengths, batch)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0:
        raise LaunchError(f"decode attention: max_len must be a non-negative int, got {max_len!r}")
    if capacity is not None and max_len > capacity:
        raise LaunchError(f"decode attention: max_len {max_len} exceeds what the cache holds ({capacity} positions)")
    return max_len


def decode_problem(q, k_cache, v_cache, lengths, out=None, max_len=None, **_) -> dict:
    """The decode problem of a launch: validates shapes and dtypes; its kv_len is `max_len` when given, else the
    longest length (read to the host, each checked)."""
    _decode_shapes(q, k_cache, v_cache, out, k_cache.shape[1])
    if k_cache.shape[0] != q.shape[0]:
        raise ShapeMismatch(f"decode attention: cache batch {k_cache.shape[0]} differs from q's {q.shape[0]}")
    return {
        "batch": q.shape[0],
        "heads": q.shape[1],
        "kv_heads": k_cache.shape[1],
        "kv_len": _longest(lengths, q.shape[0], k_cache.shape[2], max_len),
        "head_dim": q.shape[2],
    }


@served
def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    lengths: Tensor,
    out: Tensor | None = None,
    *,
    scale: float | None = None,
    config: Config | None = None,
    workspace: Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """One query token per sequence against a contiguous KV cache.

    q [batch, heads, dim]; k_cache, v_cache [batch, kv_heads, capacity, dim]; lengths int32 [batch], each in
    [0, capacity] (a length of 0 gives zeros). `max_len`: an upper bound on the lengths the caller knows (a serving
    loop's longest sequence): the launch key takes it and nothing is read to the host; the kernel checks each length
    against it and the capacity, and a bad one raises `LaunchError` at the first synchronisation after the launch
    (`nbxcert.kernels.faults`). Without it the lengths are read to the host (a device-to-host copy on a GPU, which
    waits for the work queued before it) for the key's longest length, and checked there.
    `workspace`: contiguous float32 of at least `decode_workspace_elements(batch, heads, dim)` elements, enough for
    every candidate (`decode_workspace` makes one; allocated per call when None). Returns `out` [batch, heads, dim].
    The config is the caller's, else the one serving chooses (`choose_config`)."""
    problem = decode_problem(q, k_cache, v_cache, lengths, out, max_len)
    return _serve_decode(
        DECODE_ATTENTION, problem, (q, k_cache, v_cache, lengths, None), out, scale, config, workspace, max_len
    )


def _check_block_table_tensor(block_table: Tensor, batch: int) -> None:
    if block_table.dtype.name != "int32" or block_table.ndim != 2 or block_table.shape[0] != batch:
        raise ShapeMismatch(
            f"paged decode attention: block_table must be int32 [batch={batch}, max_blocks], got "
            f"{block_table.dtype.name} {block_table.shape}"
        )


def check_block_table(block_table: Tensor, lengths: np.ndarray, block_size: int, num_blocks: int) -> None:
    """Refuse, before any launch, a block table whose used entries (the first cdiv(length, block_size) of each
    sequence) name a block outside [0, num_blocks), or that has too few columns for a sequence (`LaunchError`).
    Entries past a sequence's last block are never read and are not checked (-1 padding is fine)."""
    _check_block_table_tensor(block_table, lengths.shape[0])
    table = np.asarray(block_table.numpy())
    for b, length in enumerate(lengths):
        used = -(-int(length) // block_size)
        if used > table.shape[1]:
            raise LaunchError(
                f"paged decode attention: sequence {b} of length {int(length)} needs {used} blocks of {block_size}, "
                f"the block table has {table.shape[1]} columns"
            )
        row = table[b, :used]
        bad = np.flatnonzero((row < 0) | (row >= num_blocks))
        if bad.size:
            i = int(bad[0])
            raise LaunchError(
                f"paged decode attention: block id {int(row[i])} (block_table[{b}, {i}]) is out of range for a pool "
                f"of {num_blocks} blocks"
            )


def paged_decode_problem(q, k_pool, v_pool, block_table, lengths, out=None, max_len=None, **_) -> dict:
    """The paged decode problem of a launch: validates shapes and dtypes; its kv_len is `max_len` when given (the
    kernel checks the lengths and block ids), else the longest length, the lengths and the block table read to the
    host and checked there (device-to-host copies on a GPU)."""
    _decode_shapes(q, k_pool, v_pool, out, k_pool.shape[2])
    num_blocks, block_size = k_pool.shape[0], k_pool.shape[1]
    if max_len is None:
        host = _host_lengths(lengths, q.shape[0], None)
        check_block_table(block_table, host, block_size, num_blocks)
        kv_len = int(host.max()) if host.size else 0
    else:
        _check_block_table_tensor(block_table, q.shape[0])
        kv_len = _longest(lengths, q.shape[0], block_table.shape[1] * block_size, max_len)
    return {
        "batch": q.shape[0],
        "heads": q.shape[1],
        "kv_heads": k_pool.shape[2],
        "kv_len": kv_len,
        "head_dim": q.shape[2],
        "block_size": block_size,
    }


@served
def paged_decode_attention(
    q: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    block_table: Tensor,
    lengths: Tensor,
    out: Tensor | None = None,
    *,
    scale: float | None = None,
    config: Config | None = None,
    workspace: Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """One query token per sequence against a paged KV cache.

    q [batch, heads, dim]; k_pool, v_pool [num_blocks, block_size, kv_heads, dim] (any strides); block_table int32
    [batch, max_blocks]: position t of sequence b lives in block block_table[b, t // block_size]; lengths int32
    [batch]. A used block id outside [0, num_blocks) raises `LaunchError`: before the launch without `max_len`
    (the table and lengths read to the host), at the first synchronisation after it with `max_len` (the kernel
    checks; nothing is read to the host). `workspace`, `max_len` and the config as in `decode_attention`. Returns
    `out` [batch, heads, dim]."""
    problem = paged_decode_problem(q, k_pool, v_pool, block_table, lengths, out, max_len)
    return _serve_decode(
        PAGED_DECODE_ATTENTION,
        problem,
        (q, k_pool, v_pool, lengths, block_table),
        out,
        scale,
        config,
        workspace,
        max_len,
    )


# --- inputs and oracles ----------------------------------------------------------------------------------------------
def _flash_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    """Seeded normal q, k, v [batch, (kv_)heads, len, dim]; q twice the size of k so the scores spread (std 2);
    contiguous, TMA-legal when `aligned` = 1, one element off a 16-byte boundary when 0."""
    gen = _inputs.rng(seed)
    dtype = dtypes[0]
    b, h, hkv, d = (int(problem[n]) for n in ("batch", "heads", "kv_heads", "head_dim"))
    q_len, kv_len = int(problem["q_len"]), int(problem["kv_len"])
    aligned = int(problem.get("aligned", 1))

    def tensor(shape, scale=1.0):
        # aligned=0: the tensor starts one element into its buffer, so TMA cannot read it
        flat = _inputs.randn(gen, math.prod(shape) + 1 - aligned, dtype, device, scale)
        return flat[1 - aligned :].view(*shape)

    tensors = {
        "q": tensor((b, h, q_len, d), 2.0),
        "k": tensor((b, hkv, kv_len, d)),
        "v": tensor((b, hkv, kv_len, d)),
        "out": tensor((b, h, q_len, d)),
    }
    scalars = {"scale": 1.0 / math.sqrt(d), "causal": bool(problem["causal"])}
    return Inputs(tensors, scalars, ("out",), dict(problem))


def _flash_launch(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    _run(flash_launches(config, t["q"], t["k"], t["v"], t["out"], s["scale"], s["causal"]))


def _flash_oracle(inputs: Inputs) -> dict[str, Reference]:
    t, s = inputs.tensors, inputs.scalars
    lib = products.device_library(t["q"].device)
    if lib is not None:  # the same reference evaluated where the inputs lie (`attention64`)
        ref, err = attention64.attention_on_device(t["q"], t["k"], t["v"], s["scale"], s["causal"], None, lib)
        return {"out": Reference(ref, err)}
    host = inputs.host()
    ref, err = _oracle.attention(host["q"], host["k"], host["v"], s["scale"], s["causal"])
    return {"out": Reference(ref, err)}


def seeded_lengths(gen: np.random.Generator, batch: int, kv_len: int) -> np.ndarray:
    """Uneven lengths in [1, kv_len], the last exactly kv_len (the problem's longest); with 3 or more sequences,
    sequence 1 is empty (length 0), so the defined zero row is judged in every check."""
    lengths = gen.integers(1, max(kv_len, 1) + 1, size=batch) if kv_len > 0 else np.zeros(batch, dtype=np.int64)
    lengths[-1] = kv_len
    if batch >= 3:
        lengths[1] = 0
    return lengths.astype(np.int32)


def decode_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, lengths: Sequence[int] | None = None
) -> Inputs:
    """q [batch, heads, dim]; contiguous caches [batch, kv_heads, kv_len + 7, dim] whose positions past each
    sequence's length hold NaN (a read past the length shows); `lengths` (default: `seeded_lengths`)."""
    gen = _inputs.rng(seed)
    dtype = dtypes[0]
    b, h, hkv, d, kv_len = (int(problem[n]) for n in ("batch", "heads", "kv_heads", "head_dim", "kv_len"))
    capacity = kv_len + 7
    lengths = seeded_lengths(gen, b, kv_len) if lengths is None else np.asarray(lengths, dtype=np.int32)
    q = _inputs.randn(gen, (b, h, d), dtype, device, 2.0)
    past = np.arange(capacity)[None, None, :, None] >= lengths[:, None, None, None]
    caches = [_inputs.randn(gen, (b, hkv, capacity, d), dtype, device, nan_where=past) for _ in range(2)]
    tensors = {
        "q": q,
        "k_cache": caches[0],
        "v_cache": caches[1],
        "lengths": from_numpy(lengths, "int32", device),
        "out": empty((b, h, d), dtype, device),
        "workspace": decode_workspace(b, h, d, device),
    }
    return Inputs(tensors, {"scale": 1.0 / math.sqrt(d)}, ("out",), dict(problem))


def _decode_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    return decode_inputs(problem, dtypes, seed, device)


DECODE_TENSORS = ("q", "k_cache", "v_cache", "lengths", "out")
PAGED_TENSORS = ("q", "k_pool", "v_pool", "lengths", "out")


def _decode_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(decode_launches(config, *(t[n] for n in DECODE_TENSORS), inputs.scalars["scale"], t["workspace"]))


def _exact_values(t) -> np.ndarray:
    """A tensor's values in a numpy float type that holds them exactly and is no wider than it must be (float16 as
    float16, bfloat16 as float32): the attention oracle widens a cache to float64 one slice at a time."""
    if t.dtype.name == "float16" or t.dtype.name == "float32":
        return t.numpy()
    if t.dtype.name == "bfloat16":
        return bfloat16_bits_to_float32(t.numpy())
    return t.float64()


def _decode_oracle(inputs: Inputs) -> dict[str, Reference]:
    t = inputs.tensors
    lengths = t["lengths"].numpy()
    lib = products.device_library(t["q"].device)
    if lib is not None:  # the same reference evaluated where the inputs lie (`attention64`)
        q = t["q"].unsqueeze(2)
        ref, err = attention64.attention_on_device(
            q, t["k_cache"], t["v_cache"], inputs.scalars["scale"], False, lengths, lib
        )
        return {"out": Reference(ref[:, :, 0, :], err[:, :, 0, :])}
    k, v = _exact_values(t["k_cache"]), _exact_values(t["v_cache"])
    ref, err = _oracle.decode_attention(t["q"].float64(), k, v, lengths, inputs.scalars["scale"])
    return {"out": Reference(ref, err)}


def paged_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, lengths: Sequence[int] | None = None
) -> Inputs:
    """A paged cache whose blocks are shuffled: a pool of batch * cdiv(kv_len, block_size) + 3 blocks
    [num_blocks, block_size, kv_heads, dim], each sequence's blocks drawn from a seeded permutation; table entries
    past a sequence's last block are -1; pool positions no sequence uses hold NaN. `lengths` as in `decode_inputs`."""
    gen = _inputs.rng(seed)
    dtype = dtypes[0]
    b, h, hkv, d, kv_len = (int(problem[n]) for n in ("batch", "heads", "kv_heads", "head_dim", "kv_len"))
    bs = int(problem["block_size"])
    lengths = seeded_lengths(gen, b, kv_len) if lengths is None else np.asarray(lengths, dtype=np.int32)
    max_blocks = max(1, -(-kv_len // bs))
    num_blocks = b * max_blocks + 3
    order = gen.permutation(num_blocks)
    table = np.full((b, max_blocks), -1, dtype=np.int32)
    used = np.zeros((num_blocks, bs), dtype=bool)
    taken = 0
    for i in range(b):
        n_blocks = -(-int(lengths[i]) // bs)
        table[i, :n_blocks] = order[taken : taken + n_blocks]
        taken += n_blocks
        positions = np.arange(int(lengths[i]))
        used[table[i, positions // bs], positions % bs] = True
    unused = ~used[:, :, None, None]
    pools = [_inputs.randn(gen, (num_blocks, bs, hkv, d), dtype, device, nan_where=unused) for _ in range(2)]
    tensors = {
        "q": _inputs.randn(gen, (b, h, d), dtype, device, 2.0),
        "k_pool": pools[0],
        "v_pool": pools[1],
        "block_table": from_numpy(table, "int32", device),
        "lengths": from_numpy(lengths, "int32", device),
        "out": empty((b, h, d), dtype, device),
        "workspace": decode_workspace(b, h, d, device),
    }
    return Inputs(tensors, {"scale": 1.0 / math.sqrt(d)}, ("out",), dict(problem))


def _paged_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    return paged_inputs(problem, dtypes, seed, device)


def _paged_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    tensors = (t[n] for n in PAGED_TENSORS)
    _run(decode_launches(config, *tensors, inputs.scalars["scale"], t["workspace"], block_table=t["block_table"]))


def _paged_oracle(inputs: Inputs) -> dict[str, Reference]:
    t = inputs.tensors
    ref, err = _oracle.paged_decode_attention(
        t["q"].float64(),
        _exact_values(t["k_pool"]),
        _exact_values(t["v_pool"]),
        t["block_table"].numpy(),
        t["lengths"].numpy(),
        inputs.scalars["scale"],
    )
    return {"out": Reference(ref, err)}


def _same_dtype(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0],)


def prefill_problem(batch, heads, kv_heads, q_len, kv_len, head_dim, causal, aligned) -> dict[str, int]:
    """A flash_attention problem dict from its sizes (causal and aligned as 0/1)."""
    return dict(
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        q_len=q_len,
        kv_len=kv_len,
        head_dim=head_dim,
        causal=causal,
        aligned=aligned,
    )


# --- specs ------------------------------------------------------------------------------------------------------------
FLASH_ATTENTION = family_spec(
    "attention",
    "flash_attention",
    "prefill attention, online softmax, causal (bottom-right) or not, GQA, head dims 64-256, TMA",
    (_flash_fwd_kernel,),
    problem_args=("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "aligned"),
    key_fields=(
        KeyField("batch", "batch"),
        KeyField("heads"),
        KeyField("kv_heads"),
        KeyField("q_len", "tokens"),
        KeyField("kv_len", "kv_len"),
        KeyField("head_dim"),
        KeyField("causal"),
        KeyField("aligned"),
    ),
    dtype_args=("q",),
    dtypes=DTYPES,
    output_dtypes=_same_dtype,
    tuning=(flash_candidates(), FLASH_DEFAULT, prune_flash),
    parts=(_flash_inputs, _flash_launch, _flash_oracle, flash_problem),
    no_bit_fields=("num_stages",),
    examples=(
        prefill_problem(1, 4, 1, 17, 17, 80, causal=1, aligned=1),
        prefill_problem(2, 2, 2, 1, 100, 64, causal=0, aligned=0),
        prefill_problem(1, 8, 1, 100, 37, 96, causal=1, aligned=1),
    ),
    oracle_name="nbxcert.oracles.attention.attention",
)

_DECODE_PROBLEM = ("batch", "heads", "kv_heads", "kv_len", "head_dim")
_DECODE_KEY = (
    KeyField("batch", "batch"),
    KeyField("heads"),
    KeyField("kv_heads"),
    KeyField("kv_len", "kv_len"),
    KeyField("head_dim"),
)


def _decode_spec(name, description, paged: bool, make_inputs, launch, oracle, problem_of, examples) -> KernelSpec:
    """The decode attention specs (contiguous or paged KV cache): one kernel pair, one candidate list, one prune."""
    return family_spec(
        "attention",
        name,
        description,
        (_decode_partial_kernel, _decode_combine_kernel),
        problem_args=_DECODE_PROBLEM + (("block_size",) if paged else ()),
        key_fields=_DECODE_KEY + ((KeyField("block_size"),) if paged else ()),
        dtype_args=("q",),
        dtypes=DTYPES,
        output_dtypes=_same_dtype,
        tuning=(decode_candidates(), DECODE_DEFAULT, prune_decode),
        parts=(make_inputs, launch, oracle, problem_of),
        no_bit_fields=("num_stages",),
        examples=examples,
    )


DECODE_ATTENTION = _decode_spec(
    "decode_attention",
    "decode attention (one query per sequence), contiguous KV cache, per-sequence lengths, split-KV",
    False,
    _decode_inputs,
    _decode_launch,
    _decode_oracle,
    decode_problem,
    (
        {"batch": 3, "heads": 8, "kv_heads": 2, "kv_len": 100, "head_dim": 80},
        {"batch": 2, "heads": 8, "kv_heads": 1, "kv_len": 17, "head_dim": 128},
    ),
)
PAGED_DECODE_ATTENTION = _decode_spec(
    "paged_decode_attention",
    "decode attention against a paged KV cache (block table), per-sequence lengths, split-KV",
    True,
    _paged_inputs,
    _paged_launch,
    _paged_oracle,
    paged_decode_problem,
    (
        {"batch": 3, "heads": 4, "kv_heads": 1, "kv_len": 100, "head_dim": 64, "block_size": 16},
        {"batch": 2, "heads": 8, "kv_heads": 8, "kv_len": 37, "head_dim": 96, "block_size": 32},
    ),
)

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
