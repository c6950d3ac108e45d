"""Row kernels: softmax, LayerNorm / RMSNorm (alone or fused with a residual add) and row reductions, each over the
last dimension of a [n_rows, n_cols] view, ending in validated `KernelSpec`s:

    softmax        one spec, three variants among its candidates: `tile` (a row in one tile, rows that fit),
                   `loop` (online max/sum over column tiles, any row length) and `split` (a long row split across
                   programs: per-chunk max/sum to a workspace, then a second kernel combines and writes)
    layernorm, rmsnorm, add_layernorm, add_rmsnorm
                   one kernel; variants `tile` (the row stays in registers: one read, one write) and `loop` (three
                   passes over column tiles for rows too wide to hold)
    row_reduce     sum / mean / amax / var (two-pass) with the op an exact key field: one spec, because the four share
                   the kernel, its candidates and its prune, and differ by one constexpr (four specs would be four
                   copies of the same table, certified and served apart for no gain)

Numerics (the oracles are `nbxcert.oracles.rows`):
- half-precision inputs (float16, bfloat16) compute in float32; float32 inputs compute in float64. A float32 output is
  certified at one float32 epsilon of its error scale, which a float32 reduction of thousands of terms (log2(n)
  roundings deep) does not meet, while H100/H200 float64 throughput keeps these memory-bound kernels memory-bound;
- `scale` (softmax) and `eps` (norms) are kernel arguments of type float32: the value used is float32(value);
- softmax subtracts the row maximum; masked entries are -inf and give exactly 0; a row whose entries are all -inf is
  DEFINED as all zeros (as `nbxcert.oracles.rows.softmax` defines it);
- causal masks group rows by `q_len` (row r is query i = r mod q_len) and align bottom-right against n_cols keys: row
  i sees column j iff j <= i + (n_cols - q_len); an additive mask [q_len, n_cols] adds mask[r mod q_len] to row r;
- variance is two-pass (mean first, then the mean of squared deviations), population for the norms;
- the fused add variants return s = x + residual (rounded to x's dtype) and normalise s as computed (unrounded);
- under Triton's interpreter, float32 -> bfloat16 stores round to nearest even here (`narrow`): the interpreter's own
  cast truncates (seen with Triton 3.6 and 3.9). Its bfloat16 -> float32 load mishandles bfloat16 subnormals (seen
  with both versions): interpreter inputs here are never subnormal.

Which config fields can change output bits: `ROWS` (rows per program) changes none: each row is processed by the same
code, in a loop over the program's rows, whatever their number (the tests check it). The reduction's tile (`BLOCK_N`,
the variant) and `num_warps` can: they decide which partial sums are formed and in which order.

Prunes use device-file facts only (`nbxcert.kernels.prune`): threads per block; registers (the tile-shaped values a
kernel keeps live, counted from its code below, against min(max_registers_per_thread, max_registers_per_block /
threads)), counted for the float32 compute path of half-precision inputs (a prune does not see dtypes; float32 inputs,
computed in float64, may spill in the widest tiles kept: slower, still correct, and timed as such); lanes (a tile has
at least num_warps x warp_size elements, or surplus lanes hold copies); and Triton's own limit on a tile,
`triton.language.TRITON_MAX_TENSOR_NUMEL` elements, which the `tile` variant's power-of-two cover of the row must
respect; shared memory: no row kernel uses more than the reductions' scratch (one value per warp,
`reduction_shared_bytes`; no loop is pipelined: the pipeliner only pipelines loads feeding `tl.dot`, and compiling
with 1 or 3 stages gives the same shared memory, so `num_stages` is fixed at 1). tests/kernels/test_rows.py compiles
every candidate the hopper prune keeps at the issue's shapes for sm_90 and checks ptxas's registers (no spill) and
Triton's `metadata.shared` against these counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.common import (
    MAX_TILE,
    SCALAR_REGS,
    as_rows,
    both,
    compute_type,
    family_spec,
    narrow,
    reduction_shared_bytes,
    upcast,
)
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import SPLIT_WORKSPACE, KernelLaunch, cdiv, constexprs, next_power_of_2, served
from nbxcert.kernels.launch import run_all as _run
from nbxcert.kernels.prune import lanes_refusal, prune_with, registers_refusal, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KernelSpec, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_numpy
from nbxcert.oracles import rows as _oracle

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
MASKS = {"none": 0, "causal": 1, "additive": 2}
OPS = {"sum": 0, "mean": 1, "amax": 2, "var": 3}


# --- softmax kernels --------------------------------------------------------------------------------------------------
@jit
def _scores(
    x_ptr,
    mask_ptr,
    row,
    cols,
    ok,
    n_cols,
    x_row_stride,
    mask_row_stride,
    mask_rows,
    q_len,
    scale,
    MASK: tl.constexpr,
    CDT: tl.constexpr,
):
    """z = x[row, cols] * scale (+ mask), -inf where masked or outside the row (`ok` false).

    row: int64 row index. cols: int32 column indices, `ok` their validity. MASK: 0 none, 1 causal (query i = row mod
    q_len sees columns <= i + n_cols - q_len), 2 additive (adds mask[row mod mask_rows, cols]). CDT: compute type."""
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=ok, other=0.0).to(CDT)
    z = x * scale
    if MASK == 2:
        m_row = row % mask_rows
        z += tl.load(mask_ptr + m_row * mask_row_stride + cols, mask=ok, other=0.0).to(CDT)
    if MASK == 1:
        last_seen = row % q_len + (n_cols - q_len)
        z = tl.where(cols <= last_seen, z, float("-inf"))
    return tl.where(ok, z, float("-inf"))


@jit
def _softmax_tile_kernel(
    x_ptr,
    y_ptr,
    mask_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    mask_row_stride,
    mask_rows,
    q_len,
    scale,
    MASK: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Softmax of whole rows held in one tile.

    x_ptr, y_ptr: [n_rows, n_cols] input and output, rows `x_row_stride` / `y_row_stride` elements apart, columns
    contiguous. mask_ptr: the additive mask [mask_rows, n_cols] (rows `mask_row_stride` apart), read only when
    MASK == 2. q_len: rows per causal group (MASK == 1). scale: float32 multiplier of x. ROWS: rows per program
    (changes no bit). BLOCK_N: the tile, a power of two >= n_cols. CDT: compute type. UPCAST: interpreter backend.
    Live tile values at the peak: the scores and their exponentials (+ the column offsets)."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        ok = both(cols < n_cols, row < n_rows)
        z = _scores(
            x_ptr, mask_ptr, row, cols, ok, n_cols, x_row_stride, mask_row_stride, mask_rows, q_len, scale, MASK, CDT
        )
        m = tl.max(z, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)  # a fully masked row: every p is exp(-inf) = 0
        p = tl.exp(z - m)
        s = tl.sum(p, axis=0)
        inv = tl.where(s > 0.0, 1.0 / s, 0.0)
        tl.store(y_ptr + row * y_row_stride + cols, narrow(p * inv, y_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _softmax_loop_kernel(
    x_ptr,
    y_ptr,
    mask_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    mask_row_stride,
    mask_rows,
    q_len,
    scale,
    MASK: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Softmax of rows of any length: pass 1 keeps a running maximum and a running sum rescaled as the maximum grows
    (online softmax, one exp per element), pass 2 writes exp(z - max) / sum. Arguments as `_softmax_tile_kernel`;
    BLOCK_N is the column tile the passes step by."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        row_ok = row < n_rows
        m_run = tl.max(tl.full([BLOCK_N], float("-inf"), CDT), axis=0)
        s_run = tl.sum(tl.zeros([BLOCK_N], CDT), axis=0)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            ok = both(c < n_cols, row_ok)
            z = _scores(
                x_ptr, mask_ptr, row, c, ok, n_cols, x_row_stride, mask_row_stride, mask_rows, q_len, scale, MASK, CDT
            )
            m_new = tl.maximum(m_run, tl.max(z, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_run = s_run * tl.exp(m_run - m_safe) + tl.sum(tl.exp(z - m_safe), axis=0)
            m_run = m_new
        m_safe = tl.where(m_run == float("-inf"), 0.0, m_run)
        inv = tl.where(s_run > 0.0, 1.0 / s_run, 0.0)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            ok = both(c < n_cols, row_ok)
            z = _scores(
                x_ptr, mask_ptr, row, c, ok, n_cols, x_row_stride, mask_row_stride, mask_rows, q_len, scale, MASK, CDT
            )
            y = tl.exp(z - m_safe) * inv
            tl.store(y_ptr + row * y_row_stride + c, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _softmax_split_stats_kernel(
    x_ptr,
    ws_ptr,
    mask_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    mask_row_stride,
    mask_rows,
    q_len,
    scale,
    n_chunks,
    MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
):
    """Split softmax, step 1: program (row, chunk) writes the chunk's maximum and its sum of exp(z - max) to the
    workspace ws[row, chunk, 0:2] (CDT; the maximum may be -inf). A chunk is one BLOCK_N tile of the row."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    c = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = c < n_cols
    z = _scores(x_ptr, mask_ptr, row, c, ok, n_cols, x_row_stride, mask_row_stride, mask_rows, q_len, scale, MASK, CDT)
    m = tl.max(z, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp(z - m_safe), axis=0)
    base = ws_ptr + (row * n_chunks + chunk) * 2
    tl.store(base, m)
    tl.store(base + 1, s)


@jit
def _softmax_split_out_kernel(
    x_ptr,
    y_ptr,
    ws_ptr,
    mask_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    mask_row_stride,
    mask_rows,
    q_len,
    scale,
    n_chunks,
    MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNKS: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Split softmax, step 2: program (row, chunk) combines all the row's chunk statistics (the same values in the
    same order in every program of the row, so they agree to the bit), then writes its chunk's outputs. CHUNKS: a
    power of two >= n_chunks (the statistics tile)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    k = tl.arange(0, CHUNKS)
    k_ok = k < n_chunks
    stats = ws_ptr + (row * n_chunks + k) * 2
    m_k = tl.load(stats, mask=k_ok, other=float("-inf"))
    s_k = tl.load(stats + 1, mask=k_ok, other=0.0)
    m = tl.max(m_k, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_k * tl.exp(m_k - m_safe), axis=0)
    inv = tl.where(s > 0.0, 1.0 / s, 0.0)
    c = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = c < n_cols
    z = _scores(x_ptr, mask_ptr, row, c, ok, n_cols, x_row_stride, mask_row_stride, mask_rows, q_len, scale, MASK, CDT)
    y = tl.exp(z - m_safe) * inv
    tl.store(y_ptr + row * y_row_stride + c, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


# --- normalisation kernel ---------------------------------------------------------------------------------------------
@jit
def _load_row(x_ptr, res_ptr, row, c, ok, x_row_stride, res_row_stride, RESIDUAL: tl.constexpr, CDT: tl.constexpr):
    """x[row, c] (+ res[row, c]) in the compute type (res read only with RESIDUAL)."""
    x = tl.load(x_ptr + row * x_row_stride + c, mask=ok, other=0.0).to(CDT)
    if RESIDUAL:
        x += tl.load(res_ptr + row * res_row_stride + c, mask=ok, other=0.0).to(CDT)
    return x


@jit
def _norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    sum_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    res_row_stride,
    y_row_stride,
    sum_row_stride,
    eps,
    RMS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    ONE_TILE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """LayerNorm (RMS false: (x - mean) * rstd * w + b, two-pass population variance) or RMSNorm (RMS true:
    x * rstd * w, rstd = 1 / sqrt(mean(x²) + eps)) of each row, optionally of s = x + res (RESIDUAL), whose rounded
    value is also written to sum_ptr.

    x_ptr, res_ptr, y_ptr, sum_ptr: [n_rows, n_cols], rows the given strides apart, columns contiguous (res_ptr and
    sum_ptr are read/written only with RESIDUAL). w_ptr, b_ptr: [n_cols] weight and bias (b_ptr unread with RMS).
    eps: float32. ONE_TILE: the row stays in one BLOCK_N >= n_cols tile (one read); else three passes (two for RMS)
    over BLOCK_N column tiles, re-reading x (and res). ROWS: rows per program (changes no bit). CDT: compute type.
    UPCAST: interpreter backend. Live tile values at the peak (ONE_TILE): the centred row, the weight, the bias
    (+ the column offsets)."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    if ONE_TILE:
        c_ok = cols < n_cols
        w = tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(CDT)
        if not RMS:
            b = tl.load(b_ptr + cols, mask=c_ok, other=0.0).to(CDT)
        for r in range(ROWS):
            row = pid * ROWS + r
            ok = both(c_ok, row < n_rows)
            x = _load_row(x_ptr, res_ptr, row, cols, ok, x_row_stride, res_row_stride, RESIDUAL, CDT)
            if RESIDUAL:  # the sum, written once (the first pass)
                tl.store(sum_ptr + row * sum_row_stride + cols, narrow(x, sum_ptr.dtype.element_ty, UPCAST), mask=ok)
            if RMS:
                rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
                y = x * rstd * w
            else:
                mean = tl.sum(x, axis=0) / n_cols
                d = tl.where(ok, x - mean, 0.0)
                rstd = tl.math.rsqrt(tl.sum(d * d, axis=0) / n_cols + eps)
                y = d * rstd * w + b
            tl.store(y_ptr + row * y_row_stride + cols, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)
    else:
        for r in range(ROWS):
            row = pid * ROWS + r
            row_ok = row < n_rows
            acc = tl.zeros([BLOCK_N], CDT)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                ok = both(c < n_cols, row_ok)
                x = _load_row(x_ptr, res_ptr, row, c, ok, x_row_stride, res_row_stride, RESIDUAL, CDT)
                if RESIDUAL:  # the sum, written once (the first pass)
                    tl.store(sum_ptr + row * sum_row_stride + c, narrow(x, sum_ptr.dtype.element_ty, UPCAST), mask=ok)
                if RMS:
                    acc += x * x
                else:
                    acc += x
            if RMS:
                mean = 0.0
                rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
            else:
                mean = tl.sum(acc, axis=0) / n_cols
                acc2 = tl.zeros([BLOCK_N], CDT)
                for start in range(0, n_cols, BLOCK_N):
                    c = start + cols
                    ok = both(c < n_cols, row_ok)
                    x = _load_row(x_ptr, res_ptr, row, c, ok, x_row_stride, res_row_stride, RESIDUAL, CDT)
                    d = tl.where(ok, x - mean, 0.0)
                    acc2 += d * d
                rstd = tl.math.rsqrt(tl.sum(acc2, axis=0) / n_cols + eps)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                c_ok = c < n_cols
                ok = both(c_ok, row_ok)
                x = _load_row(x_ptr, res_ptr, row, c, ok, x_row_stride, res_row_stride, RESIDUAL, CDT)
                w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(CDT)
                if RMS:
                    y = x * rstd * w
                else:
                    y = (x - mean) * rstd * w + tl.load(b_ptr + c, mask=c_ok, other=0.0).to(CDT)
                tl.store(y_ptr + row * y_row_stride + c, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


# --- row reduction kernel ---------------------------------------------------------------------------------------------
@jit
def _row_reduce_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    correction,
    OP: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One value per row of x [n_rows, n_cols] (rows `x_row_stride` apart, columns contiguous) into out [n_rows].

    OP: 0 sum, 1 mean, 2 amax, 3 var (two-pass, divided by n_cols - correction). Each lane of the BLOCK_N tile
    accumulates its columns across the row's tiles; the lanes are reduced once at the end. ROWS: rows per program
    (changes no bit). CDT: compute type. UPCAST: interpreter backend. Live tile values: the accumulator, the loaded
    tile (+ the column offsets)."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        row_ok = row < n_rows
        base = x_ptr + row * x_row_stride
        if OP == 2:
            acc = tl.full([BLOCK_N], float("-inf"), CDT)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                x = tl.load(base + c, mask=both(c < n_cols, row_ok), other=float("-inf")).to(CDT)
                acc = tl.maximum(acc, x)
            result = tl.max(acc, axis=0)
        else:
            acc = tl.zeros([BLOCK_N], CDT)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                acc += tl.load(base + c, mask=both(c < n_cols, row_ok), other=0.0).to(CDT)
            result = tl.sum(acc, axis=0)
            if OP == 1:
                result = result / n_cols
            if OP == 3:
                mean = result / n_cols
                acc2 = tl.zeros([BLOCK_N], CDT)
                for start in range(0, n_cols, BLOCK_N):
                    c = start + cols
                    ok = both(c < n_cols, row_ok)
                    d = tl.where(ok, tl.load(base + c, mask=ok, other=0.0).to(CDT) - mean, 0.0)
                    acc2 += d * d
                result = tl.sum(acc2, axis=0) / (n_cols - correction)
        tl.store(out_ptr + row, narrow(result, out_ptr.dtype.element_ty, UPCAST), mask=row_ok)


# --- configs: named factories -----------------------------------------------------------------------------------------
def tile_config(rows: int, num_warps: int) -> Config:
    """The `tile` variant: ROWS rows per program, each held whole in one tile of next_pow2(n_cols) elements."""
    return Config.make(num_warps=num_warps, num_stages=1, VARIANT="tile", ROWS=rows)


def loop_config(block_n: int, num_warps: int) -> Config:
    """The `loop` variant: one row per program, in passes over BLOCK_N column tiles."""
    return Config.make(num_warps=num_warps, num_stages=1, VARIANT="loop", ROWS=1, BLOCK_N=block_n)


def split_config(block_n: int, num_warps: int) -> Config:
    """The `split` variant (softmax): each BLOCK_N chunk of a row is its own program, in two launches."""
    return Config.make(num_warps=num_warps, num_stages=1, VARIANT="split", BLOCK_N=block_n)


def reduce_config(block_n: int, rows: int, num_warps: int) -> Config:
    """A row reduction: ROWS rows per program, each stepped through in BLOCK_N column tiles."""
    return Config.make(num_warps=num_warps, num_stages=1, ROWS=rows, BLOCK_N=block_n)


TILE_WARPS = (1, 2, 4, 8, 16, 32)


def softmax_candidates() -> tuple[Config, ...]:
    """tile: ROWS {1, 4} x warps {1..32}; loop: BLOCK_N {1024, 4096} x warps {4, 8, 16}; split: BLOCK_N
    {1024, 2048, 4096} x warps {4, 8}."""
    tile = [tile_config(r, w) for r in (1, 4) for w in TILE_WARPS]
    loop = [loop_config(b, w) for b in (1024, 4096) for w in (4, 8, 16)]
    split = [split_config(b, w) for b in (1024, 2048, 4096) for w in (4, 8)]
    return tuple(tile + loop + split)


def norm_candidates() -> tuple[Config, ...]:
    """tile: ROWS {1, 4} x warps {1..32}; loop: BLOCK_N {1024, 4096} x warps {4, 8, 16}."""
    tile = [tile_config(r, w) for r in (1, 4) for w in TILE_WARPS]
    loop = [loop_config(b, w) for b in (1024, 4096) for w in (4, 8, 16)]
    return tuple(tile + loop)


def reduce_candidates() -> tuple[Config, ...]:
    """(BLOCK_N, warps) {(256, 1), (256, 2), (1024, 4), (1024, 8), (4096, 8), (4096, 16)} x ROWS {1, 4}."""
    pairs = ((256, 1), (256, 2), (1024, 4), (1024, 8), (4096, 8), (4096, 16))
    return tuple(reduce_config(b, r, w) for b, w in pairs for r in (1, 4))


# The untuned defaults: the loop variant (any row length, kept by every prune); for row_reduce a mid-size tile.
SOFTMAX_DEFAULT = loop_config(1024, 4)
NORM_DEFAULT = loop_config(1024, 4)
REDUCE_DEFAULT = reduce_config(1024, 1, 4)
SMALLEST_SPLIT_BLOCK = 1024  # make_inputs sizes the split workspace for the most chunks any candidate makes


# --- prune: device facts only -----------------------------------------------------------------------------------------
def row_tile(n_cols: int) -> int:
    """The `tile` variant's tile: the smallest power of two >= n_cols."""
    return next_power_of_2(max(1, int(n_cols)))


# 32-bit registers per tile element each kernel keeps live at its peak on the float32 path, counted from the kernels
# (their docstrings name the values; the column offsets of an arange are rematerialised, not held): softmax tile: the
# scores, which become their exponentials in place, + 1 for the temporaries of exp; norm tile: the row, the weight and
# (LayerNorm) the bias; loop and reduce kernels: the accumulator, the loaded tile and the offsets. Checked against
# ptxas's own allocation for sm_90 (tests/kernels/test_rows.py::test_kept_candidates_compile_for_hopper_without_spills).
# Besides its tiles a row kernel holds `common.SCALAR_REGS` registers of scalars.
SOFTMAX_TILE_REGS = 2
LAYERNORM_TILE_REGS = 3
RMSNORM_TILE_REGS = 2
LOOP_REGS = 3


def _variant_refusal(config: Config, n_cols: int, tile_regs: int, profile) -> str | None:
    smem = shared_memory_refusal(reduction_shared_bytes(config), profile)
    if smem:
        return smem
    if config["VARIANT"] == "tile":
        block = row_tile(n_cols)
        if block > MAX_TILE:
            return f"tile variant: a row of {n_cols} needs a tile of {block} > TRITON_MAX_TENSOR_NUMEL={MAX_TILE}"
        # with several rows per program the compiler issues the next row's loads before this row's stores: one more
        # live tile (ptxas spills rmsnorm's 32768-column tile at 16 and 32 warps with ROWS=4, not with ROWS=1)
        regs = tile_regs + (1 if config["ROWS"] > 1 else 0)
        return lanes_refusal(block, config, profile, "row tile") or registers_refusal(
            block, regs, config, profile, f"a row tile of {block} elements", SCALAR_REGS
        )
    block = config["BLOCK_N"]
    return lanes_refusal(block, config, profile, "column tile") or registers_refusal(
        block, LOOP_REGS, config, profile, f"a column tile of {block} elements", SCALAR_REGS
    )


def prune_softmax(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse softmax configs the device cannot run well: the tile variant where the row's tile exceeds Triton's tile
    limit or the registers a thread of the block has; any tile smaller than the block's lanes."""
    n = int(problem["n_cols"])
    return prune_with(candidates, profile, lambda c: _variant_refusal(c, n, SOFTMAX_TILE_REGS, profile))


def _prune_norm(tile_regs: int):
    def prune(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
        n = int(problem["n_cols"])
        return prune_with(candidates, profile, lambda c: _variant_refusal(c, n, tile_regs, profile))

    prune.__doc__ = "Refuse norm configs as `prune_softmax` does (the tile variant keeps weight and bias live too)."
    return prune


def prune_row_reduce(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse reduction configs whose column tile is smaller than the block's lanes or over its registers."""

    def check(c: Config) -> str | None:
        block = c["BLOCK_N"]
        return (
            shared_memory_refusal(reduction_shared_bytes(c), profile)
            or lanes_refusal(block, c, profile, "column tile")
            or registers_refusal(block, LOOP_REGS, c, profile, f"a column tile of {block} elements", SCALAR_REGS)
        )

    return prune_with(candidates, profile, check)


# --- launches ---------------------------------------------------------------------------------------------------------
def _warps(config: Config) -> dict[str, int]:
    return {"num_warps": config.num_warps, "num_stages": config.num_stages}


def softmax_launches(
    config: Config,
    x: Tensor,
    y: Tensor,
    scale: float,
    mask: str,
    q_len: int,
    additive: Tensor | None,
    workspace: Tensor | None,
) -> list[KernelLaunch]:
    """The launches of one softmax (x, y: [n_rows, n_cols] row views; additive: [mask_rows, n_cols] or None)."""
    n_rows, n_cols = x.shape
    if n_rows == 0 or n_cols == 0:
        return []
    kind = MASKS[mask]
    m = additive if additive is not None else x
    mask_rows, mask_stride = (additive.shape[0], additive.stride(0)) if additive is not None else (1, 0)
    cdt = compute_type(x.dtype.name)
    variant = config["VARIANT"]
    common = (n_rows, n_cols, x.stride(0))
    if variant in ("tile", "loop"):
        block = row_tile(n_cols) if variant == "tile" else config["BLOCK_N"]
        kernel = _softmax_tile_kernel if variant == "tile" else _softmax_loop_kernel
        rows = config["ROWS"]
        args = (x, y, m, *common, y.stride(0), mask_stride, mask_rows, max(1, q_len), float(scale))
        kwargs = dict(MASK=kind, ROWS=rows, BLOCK_N=block, CDT=cdt, UPCAST=upcast(), **_warps(config))
        return [KernelLaunch(kernel, (cdiv(n_rows, rows),), args, kwargs)]
    block = config["BLOCK_N"]
    n_chunks = cdiv(n_cols, block)
    need = n_rows * n_chunks * 2
    if workspace is None or workspace.numel < need or workspace.dtype.name != _workspace_dtype(x.dtype.name):
        raise LaunchError(
            f"softmax split: needs a {_workspace_dtype(x.dtype.name)} workspace of >= {need} elements, got {workspace}"
        )
    grid = (n_rows, n_chunks)
    stats_args = (x, workspace, m, n_rows, n_cols, x.stride(0), mask_stride, mask_rows, max(1, q_len), float(scale))
    stats_args += (n_chunks,)
    out_args = (x, y, workspace, m, n_rows, n_cols, x.stride(0), y.stride(0), mask_stride, mask_rows, max(1, q_len))
    out_args += (float(scale), n_chunks)
    chunks = next_power_of_2(n_chunks)
    return [
        KernelLaunch(
            _softmax_split_stats_kernel, grid, stats_args, dict(MASK=kind, BLOCK_N=block, CDT=cdt, **_warps(config))
        ),
        KernelLaunch(
            _softmax_split_out_kernel,
            grid,
            out_args,
            dict(MASK=kind, BLOCK_N=block, CHUNKS=chunks, CDT=cdt, UPCAST=upcast(), **_warps(config)),
        ),
    ]


def _workspace_dtype(dtype_name: str) -> str:
    return "float64" if compute_type(dtype_name) == tl.float64 else "float32"


def split_workspace(n_rows: int, n_cols: int, dtype_name: str, device, block_n: int = SMALLEST_SPLIT_BLOCK) -> Tensor:
    """A workspace for the split softmax of [n_rows, n_cols] rows with chunks of >= block_n columns."""
    return empty((max(1, n_rows * cdiv(max(1, n_cols), block_n) * 2),), _workspace_dtype(dtype_name), device)


def norm_launches(
    config: Config,
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor,
    bias: Tensor | None,
    y: Tensor,
    s: Tensor | None,
    eps: float,
    rms: bool,
) -> list[KernelLaunch]:
    """The launch of one (add_)layernorm / (add_)rmsnorm over row views x, residual, y, s: [n_rows, n_cols]."""
    n_rows, n_cols = x.shape
    if n_rows == 0 or n_cols == 0:
        return []
    dtype_name = x.dtype.name
    key = (_norm_kernel, config, dtype_name, bool(rms), residual is not None, n_cols)

    def make() -> dict:
        one_tile = config["VARIANT"] == "tile"
        block = row_tile(n_cols) if one_tile else config["BLOCK_N"]
        kwargs = dict(RMS=bool(rms), RESIDUAL=residual is not None, ONE_TILE=one_tile, ROWS=config["ROWS"])
        kwargs.update(BLOCK_N=block, CDT=compute_type(dtype_name), UPCAST=upcast(), **_warps(config))
        return kwargs

    kwargs = constexprs(key, make)
    res = residual if residual is not None else x
    out_s = s if s is not None else y
    b = bias if bias is not None else weight
    args = (x, res, weight, b, y, out_s, n_rows, n_cols, x.stride(0), res.stride(0), y.stride(0), out_s.stride(0))
    args += (float(eps),)
    return [KernelLaunch(_norm_kernel, (cdiv(n_rows, kwargs["ROWS"]),), args, kwargs)]


def row_reduce_launches(config: Config, x: Tensor, out: Tensor, op: str, correction: int) -> list[KernelLaunch]:
    """The launch of one row reduction of x [n_rows, n_cols] into out [n_rows]."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return []
    rows = config["ROWS"]
    args = (x, out, n_rows, n_cols, x.stride(0), int(correction))
    kwargs = dict(OP=OPS[op], ROWS=rows, BLOCK_N=config["BLOCK_N"], CDT=compute_type(x.dtype.name), UPCAST=upcast())
    return [KernelLaunch(_row_reduce_kernel, (cdiv(n_rows, rows),), args, dict(kwargs, **_warps(config)))]


# --- user-facing functions --------------------------------------------------------------------------------------------
def _check_float(name: str, t: Tensor, role: str = "") -> None:
    if t.dtype.name not in FLOAT_DTYPES:
        name = f"{name}: {role}" if role else name
        raise ShapeMismatch(f"{name} has dtype {t.dtype.name}; one of {', '.join(FLOAT_DTYPES)} is required")


def _out_like(out: Tensor | None, like: Tensor, name: str) -> Tensor:
    if out is None:
        return empty(like.shape, like.dtype, like.device)
    if out.shape != like.shape or out.dtype is not like.dtype:
        raise ShapeMismatch(
            f"{name}: out is {out.dtype.name}{list(out.shape)}, expected {like.dtype.name}{list(like.shape)}"
        )
    return out


def softmax_problem(x: Tensor, scale: float = 1.0, mask: Any = None, **_) -> dict:
    """The key problem of a softmax launch: rows, columns and the mask kind."""
    n_cols = x.shape[-1] if x.ndim else 1
    kind = "none" if mask is None else ("causal" if isinstance(mask, str) and mask == "causal" else "additive")
    return {"n_rows": x.numel // max(1, n_cols), "n_cols": n_cols, "mask": kind}


@served
def softmax(
    x: Tensor,
    scale: float = 1.0,
    mask: str | Tensor | None = None,
    out: Tensor | None = None,
    config: Config | None = None,
    workspace: Tensor | None = None,
) -> Tensor:
    """softmax(x * scale + mask) over the last dimension.

    mask: None; "causal" (x [..., q_len, n_cols]: query i of each q_len group sees columns <= i + n_cols - q_len);
    or an additive Tensor [q_len, n_cols] (x's dtype, may hold -inf) added to row r as mask[r mod q_len]. A fully
    masked row comes out as zeros. `workspace`: for the split variant (allocated when None)."""
    _check_float("softmax: x", x)
    rows_x = as_rows(x, "softmax: x")
    y = _out_like(out, x, "softmax")
    rows_y = as_rows(y, "softmax: out")
    additive, q_len = None, 1
    if isinstance(mask, Tensor):
        if mask.dtype is not x.dtype or mask.shape[-1] != x.shape[-1]:
            raise ShapeMismatch(f"softmax: mask {mask.dtype.name}{list(mask.shape)} does not fit x {x.dtype.name}")
        additive = as_rows(mask, "softmax: mask")
        q_len = additive.shape[0]
        kind = "additive"
    elif mask is None:
        kind = "none"
    elif mask == "causal":
        kind = "causal"
        q_len = x.shape[-2] if x.ndim >= 2 else 1
    else:
        raise LaunchError(f"softmax: mask must be None, 'causal' or a Tensor, got {mask!r}")
    problem = softmax_problem(x, scale, mask)

    def workspace_for(c: Config) -> Tensor | None:
        """The workspace c launches with: the caller's, else a split variant's own (made for a run-time sweep)."""
        if c["VARIANT"] != "split" or workspace is not None:
            return workspace
        return split_workspace(rows_x.shape[0], rows_x.shape[1], x.dtype.name, x.device, c["BLOCK_N"])

    def run(c: Config) -> None:
        _run(softmax_launches(c, rows_x, rows_y, scale, kind, q_len, additive, workspace_for(c)))

    cfg = choose_config(SOFTMAX, problem, (x.dtype.name,), config, run=run, outputs=(rows_y,))
    if cfg["VARIANT"] == "split" and workspace is None and _workspace_dtype(x.dtype.name) == "float32":
        # the shared per-stream buffer (no allocation per call), its two kernels queued back to back under its lock
        need = rows_x.shape[0] * cdiv(max(1, rows_x.shape[1]), cfg["BLOCK_N"]) * 2
        with SPLIT_WORKSPACE.lock:
            shared = SPLIT_WORKSPACE.get(max(1, need), x.device)
            _run(softmax_launches(cfg, rows_x, rows_y, scale, kind, q_len, additive, shared))
        return y
    _run(softmax_launches(cfg, rows_x, rows_y, scale, kind, q_len, additive, workspace_for(cfg)))
    return y


def norm_problem(x: Tensor, *_, **__) -> dict:
    """The key problem of a norm launch: rows and columns."""
    n_cols = x.shape[-1] if x.ndim else 1
    return {"n_rows": x.numel // max(1, n_cols), "n_cols": n_cols}


def _norm(spec, x, residual, weight, bias, eps, out, out_sum, config, rms):
    name = spec.name
    _check_float(name, x, "x")
    n_cols = x.shape[-1]
    if weight.shape != (n_cols,) or (bias is not None and bias.shape != (n_cols,)):
        raise ShapeMismatch(f"{name}: weight/bias must have shape ({n_cols},)")
    if weight.dtype.name not in (x.dtype.name, "float32") or (bias is not None and bias.dtype is not weight.dtype):
        raise ShapeMismatch(f"{name}: weight/bias must be {x.dtype.name} or float32, the two alike")
    if residual is not None and (residual.shape != x.shape or residual.dtype is not x.dtype):
        raise ShapeMismatch(f"{name}: residual must be {x.dtype.name}{list(x.shape)}")
    y = _out_like(out, x, name)
    s = _out_like(out_sum, x, name) if residual is not None else None
    problem = norm_problem(x)

    def launches(c: Config) -> list[KernelLaunch]:
        return norm_launches(
            c,
            as_rows(x, name, "x"),
            None if residual is None else as_rows(residual, name, "residual"),
            weight,
            bias,
            as_rows(y, name, "out"),
            None if s is None else as_rows(s, name, "out_sum"),
            eps,
            rms,
        )

    def run(c: Config) -> None:
        _run(launches(c))

    outputs = (y,) if s is None else (y, s)
    cfg = choose_config(spec, problem, (x.dtype.name, weight.dtype.name), config, run=run, outputs=outputs)
    _run(launches(cfg))
    return y if s is None else (s, y)


@served
def layernorm(x, weight, bias, eps: float = 1e-5, out=None, config=None) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (population variance)."""
    return _norm(LAYERNORM, x, None, weight, bias, eps, out, None, config, rms=False)


@served
def rmsnorm(x, weight, eps: float = 1e-6, out=None, config=None) -> Tensor:
    """x / sqrt(mean(x²) + eps) * weight over the last dimension."""
    return _norm(RMSNORM, x, None, weight, None, eps, out, None, config, rms=True)


@served
def add_layernorm(x, residual, weight, bias, eps: float = 1e-5, out=None, out_sum=None, config=None):
    """(s, layernorm(s)) with s = x + residual (s rounded to x's dtype; the norm of the unrounded sum)."""
    return _norm(ADD_LAYERNORM, x, residual, weight, bias, eps, out, out_sum, config, rms=False)


@served
def add_rmsnorm(x, residual, weight, eps: float = 1e-6, out=None, out_sum=None, config=None):
    """(s, rmsnorm(s)) with s = x + residual (s rounded to x's dtype; the norm of the unrounded sum)."""
    return _norm(ADD_RMSNORM, x, residual, weight, None, eps, out, out_sum, config, rms=True)


def row_reduce_problem(x: Tensor, op: str = "sum", correction: int = 0, **_) -> dict:
    """The key problem of a row reduction: rows, columns, the op and the variance's correction (0 unless var)."""
    n_cols = x.shape[-1] if x.ndim else 1
    corr = int(correction) if op == "var" else 0
    return {"n_rows": x.numel // max(1, n_cols), "n_cols": n_cols, "op": op, "correction": corr}


@served
def row_reduce(x: Tensor, op: str, correction: int = 0, out: Tensor | None = None, config=None) -> Tensor:
    """sum / mean / amax / var (divided by n - correction) over the last dimension -> x.shape[:-1], x's dtype."""
    _check_float("row_reduce: x", x)
    if op not in OPS:
        raise LaunchError(f"row_reduce: op must be one of {', '.join(OPS)}, got {op!r}")
    if x.shape[-1] == 0:
        raise LaunchError("row_reduce: a reduction over an empty last dimension has no value")
    rows_x = as_rows(x, "row_reduce: x")
    shape = x.shape[:-1]
    if out is None:
        out = empty(shape, x.dtype, x.device)
    elif out.shape != shape or out.dtype is not x.dtype or not out.is_contiguous():
        raise ShapeMismatch(f"row_reduce: out must be a contiguous {x.dtype.name}{list(shape)}")
    problem = row_reduce_problem(x, op, correction)
    flat = out.view(-1) if out.ndim != 1 else out

    def run(c: Config) -> None:
        _run(row_reduce_launches(c, rows_x, flat, op, problem["correction"]))

    run(choose_config(ROW_REDUCE, problem, (x.dtype.name,), config, run=run, outputs=(flat,)))
    return out


# --- inputs and oracle adapters ---------------------------------------------------------------------------------------
SOFTMAX_SCALE = 0.125  # exact in float32 (the kernels take scale as float32)
LAYERNORM_EPS = float(np.float32(1e-5))
RMSNORM_EPS = float(np.float32(1e-6))
ADDITIVE_MASK_ROWS = 16  # the additive mask's rows in generated inputs (a [q_len, n_cols] mask, q_len <= 16)


ROW_NORMAL_SCALE = 2.0  # "normal" test values: standard normal times this


def row_values(gen: np.random.Generator, shape, values: str, dtype: str) -> np.ndarray:
    """Float64 test values: "normal" (standard normal x 2); "large": magnitudes near the top of what the kernels'
    arithmetic holds, a row's sum of squares (norms, variance) included: x 5000 for float16 (its largest finite is
    65504), x 1e15 for bfloat16 (computed in float32, whose squares overflow past ~1.8e19), x 1e30 for float32
    (computed in float64); "equal": every row one repeated value."""
    if values == "normal":
        return gen.standard_normal(shape) * ROW_NORMAL_SCALE
    if values == "large":
        return gen.standard_normal(shape) * {"float16": 5000.0, "bfloat16": 1e15}.get(dtype, 1e30)
    if values == "equal":
        return np.broadcast_to(gen.standard_normal(shape[:-1] + (1,)) * 3.0, shape).copy()
    raise ValueError(f"unknown values kind {values!r}")


def row_tensor(gen: np.random.Generator, shape, values: str, dtype: str, device: str) -> Tensor:
    """`row_values` as a tensor of `dtype` on `device` ("normal" drawn where it lies: `inputs.of_values`)."""
    return _inputs.of_values(gen, shape, values, dtype, device, row_values, ROW_NORMAL_SCALE)


def softmax_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, values: str = "normal", q_len=None
) -> Inputs:
    """x [n_rows, n_cols]; causal: q_len = n_cols unless given (no fully masked row); additive: a [q_len, n_cols]
    mask (q_len = min(n_rows, 16) unless given) of normal values with about 1 in 8 entries -inf."""
    n_rows, n_cols, mask = int(problem["n_rows"]), int(problem["n_cols"]), str(problem["mask"])
    dtype = dtypes[0]
    gen = _inputs.rng(seed)
    x = row_tensor(gen, (n_rows, n_cols), values, dtype, device)
    tensors = {"x": x, "y": empty((n_rows, n_cols), dtype, device)}
    if mask == "additive":
        q = int(q_len) if q_len is not None else max(1, min(n_rows, ADDITIVE_MASK_ROWS))
        add = gen.standard_normal((q, n_cols))
        add[gen.random((q, n_cols)) < 0.125] = -np.inf
        tensors["mask"] = from_numpy(add, dtype, device)
    else:
        q = int(q_len) if q_len is not None else max(1, n_cols)
    tensors["workspace"] = split_workspace(n_rows, n_cols, dtype, device)
    scalars = {"scale": SOFTMAX_SCALE, "mask": mask, "q_len": q}
    return Inputs(tensors, scalars, ("y",), dict(problem))


def _softmax_launch(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    _run(softmax_launches(config, t["x"], t["y"], s["scale"], s["mask"], s["q_len"], t.get("mask"), t["workspace"]))


def _softmax_oracle(inputs: Inputs) -> dict[str, Reference]:
    t, s = inputs.tensors, inputs.scalars
    add = t["mask"].float64() if "mask" in t else None
    ref, err = _oracle.softmax(t["x"].float64(), float(np.float32(s["scale"])), s["mask"], add, s["q_len"])
    return {"y": Reference(ref, err)}


def norm_inputs(
    problem: Mapping[str, Any],
    dtypes: tuple[str, ...],
    seed: int,
    device: str,
    *,
    rms: bool,
    residual: bool,
    values: str = "normal",
) -> Inputs:
    """x (and residual) [n_rows, n_cols] of `values`; weight ~ 1 + N(0, 0.5²), bias ~ N(0, 0.5²) of dtypes[1]."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    dtype, wdtype = dtypes
    gen = _inputs.rng(seed)
    tensors = {"x": row_tensor(gen, (n_rows, n_cols), values, dtype, device)}
    if residual:
        tensors["residual"] = row_tensor(gen, (n_rows, n_cols), values, dtype, device)
        tensors["s"] = empty((n_rows, n_cols), dtype, device)
    tensors["weight"] = from_numpy(1.0 + 0.5 * gen.standard_normal(n_cols), wdtype, device)
    if not rms:
        tensors["bias"] = from_numpy(0.5 * gen.standard_normal(n_cols), wdtype, device)
    tensors["y"] = empty((n_rows, n_cols), dtype, device)
    eps = RMSNORM_EPS if rms else LAYERNORM_EPS
    outputs = ("s", "y") if residual else ("y",)
    return Inputs(tensors, {"eps": eps, "rms": rms}, outputs, dict(problem))


def _norm_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(
        norm_launches(
            config,
            t["x"],
            t.get("residual"),
            t["weight"],
            t.get("bias"),
            t["y"],
            t.get("s"),
            inputs.scalars["eps"],
            inputs.scalars["rms"],
        )
    )


def _norm_oracle(inputs: Inputs) -> dict[str, Reference]:
    """The references of the sum (with a residual) and the normalised rows; a large x's rows in parts on the
    process's cores (`oracles.parts.row_parts`: each row's reference is its own, so the same values)."""
    from nbxcert.oracles import parts as _parts

    t, eps = inputs.tensors, float(np.float32(inputs.scalars["eps"]))
    x = t["x"].float64()
    residual = t["residual"].float64() if "residual" in t else None
    weight = t["weight"].float64()
    bias = None if inputs.scalars["rms"] else t["bias"].float64()

    def rows(lo: int, hi: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        part, out = x[lo:hi], {}
        if residual is not None:
            out["s"] = _oracle.residual_sum(part, residual[lo:hi])
            part = out["s"][0]
        if bias is None:
            out["y"] = _oracle.rmsnorm(part, weight, eps)
        else:
            out["y"] = _oracle.layernorm(part, weight, bias, eps)
        return out

    parts = _parts.row_parts(*x.shape) if x.ndim == 2 else None
    done = [rows(0, x.shape[0])] if parts is None else _parts.in_parts(rows, parts)
    return {
        name: Reference(np.concatenate([d[name][0] for d in done]), np.concatenate([d[name][1] for d in done]))
        for name in done[0]
    }


def row_reduce_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, values: str = "normal"
) -> Inputs:
    """x [n_rows, n_cols] of `values`; out [n_rows]."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    gen = _inputs.rng(seed)
    x = row_tensor(gen, (n_rows, n_cols), values, dtypes[0], device)
    scalars = {"op": str(problem["op"]), "correction": int(problem["correction"])}
    return Inputs({"x": x, "out": empty((n_rows,), dtypes[0], device)}, scalars, ("out",), dict(problem))


def _row_reduce_launch(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    _run(row_reduce_launches(config, t["x"], t["out"], s["op"], s["correction"]))


def _row_reduce_oracle(inputs: Inputs) -> dict[str, Reference]:
    ref, err = _oracle.row_reduce(inputs.tensors["x"].float64(), inputs.scalars["op"], inputs.scalars["correction"])
    return {"out": Reference(ref, err)}


def _same_as_first(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0],)


def _same_as_first_twice(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0], dtypes[0])


# --- specs ------------------------------------------------------------------------------------------------------------
ROW_KEY = (KeyField("n_rows", "rows"), KeyField("n_cols"))
NORM_DTYPES = (
    ("float16", "float16"),
    ("bfloat16", "bfloat16"),
    ("float32", "float32"),
    ("float16", "float32"),
    ("bfloat16", "float32"),
)
ROW_EXAMPLES = ({"n_rows": 7, "n_cols": 1000}, {"n_rows": 1, "n_cols": 1}, {"n_rows": 5, "n_cols": 5000})

SOFTMAX = family_spec(
    "rows",
    "softmax",
    "softmax over the last dimension, optional scale and causal/additive mask; tile, loop, split",
    (_softmax_tile_kernel, _softmax_loop_kernel, _softmax_split_stats_kernel, _softmax_split_out_kernel),
    problem_args=("n_rows", "n_cols", "mask"),
    key_fields=ROW_KEY + (KeyField("mask"),),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in FLOAT_DTYPES),
    output_dtypes=_same_as_first,
    tuning=(softmax_candidates(), SOFTMAX_DEFAULT, prune_softmax),
    parts=(softmax_inputs, _softmax_launch, _softmax_oracle, softmax_problem),
    no_bit_fields=("ROWS",),
    examples=tuple(dict(p, mask=m) for p in ROW_EXAMPLES for m in MASKS),
)


def _norm_spec(name: str, rms: bool, residual: bool, description: str) -> KernelSpec:
    def make_inputs(problem, dtypes, seed, device, values: str = "normal") -> Inputs:
        return norm_inputs(problem, dtypes, seed, device, rms=rms, residual=residual, values=values)

    make_inputs.__doc__ = f"Inputs of {name}: see `norm_inputs`."
    return family_spec(
        "rows",
        name,
        description,
        (_norm_kernel,),
        problem_args=("n_rows", "n_cols"),
        key_fields=ROW_KEY,
        dtype_args=("x", "weight"),
        dtypes=NORM_DTYPES,
        output_dtypes=_same_as_first_twice if residual else _same_as_first,
        tuning=(norm_candidates(), NORM_DEFAULT, _prune_norm(RMSNORM_TILE_REGS if rms else LAYERNORM_TILE_REGS)),
        parts=(make_inputs, _norm_launch, _norm_oracle, norm_problem),
        no_bit_fields=("ROWS",),
        examples=ROW_EXAMPLES,
        oracle_name=f"nbxcert.oracles.rows.{'rmsnorm' if rms else 'layernorm'}",
    )


LAYERNORM = _norm_spec("layernorm", False, False, "LayerNorm over the last dimension (weight, bias, eps)")
RMSNORM = _norm_spec("rmsnorm", True, False, "RMSNorm over the last dimension (weight, eps)")
ADD_LAYERNORM = _norm_spec("add_layernorm", False, True, "residual add, then LayerNorm; returns the sum and the norm")
ADD_RMSNORM = _norm_spec("add_rmsnorm", True, True, "residual add, then RMSNorm; returns the sum and the norm")

ROW_REDUCE = family_spec(
    "rows",
    "row_reduce",
    "sum, mean, amax or var (two-pass, correction 0 or 1) over the last dimension",
    (_row_reduce_kernel,),
    problem_args=("n_rows", "n_cols", "op", "correction"),
    key_fields=ROW_KEY + (KeyField("op"), KeyField("correction")),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in FLOAT_DTYPES),
    output_dtypes=_same_as_first,
    tuning=(reduce_candidates(), REDUCE_DEFAULT, prune_row_reduce),
    parts=(row_reduce_inputs, _row_reduce_launch, _row_reduce_oracle, row_reduce_problem),
    no_bit_fields=("ROWS",),
    examples=tuple(
        dict(p, op=op, correction=c)
        for p in ROW_EXAMPLES
        for op, c in (("sum", 0), ("mean", 0), ("amax", 0), ("var", 0), ("var", 1))
    ),
)

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
