"""Sampling kernels over the last dimension of a [n_rows, n_cols] view (a vocabulary row of up to 256k logits),
ending in validated `KernelSpec`s:

    argmax         the index of each row's largest element (int64)
    topk           each row's k largest elements (k <= 64): values (x's dtype) and indices (int64), in rank order
    log_softmax    x - M - log Σ exp(x - M), M the row maximum (looped online max, as softmax's `loop` variant)
    cross_entropy  per row: M + log Σ exp(x - M) - x[target] (x's dtype); 0 where target == ignore_index; NaN where
                   the target is outside [0, n_cols) (the row is never read outside its columns)

Order (argmax, topk). Elements rank by value, largest first; NaN ranks above every number (as numpy.argmax and
torch.topk treat it); equal values (+0.0 and -0.0 are equal), and NaNs among themselves, rank by index, THE LOWEST
INDEX FIRST. So argmax is the lowest index holding the row's maximum (the first NaN of a row that has one), and
topk(k) returns the first k elements of the row in the order (value descending, index ascending): of tied elements
the ones of lowest index are kept, and they come out in index order. This order is total, so the result does not
depend on how the row is cut up: every config field of argmax and topk changes no output bit (the tests check it).

Variants (config field `VARIANT`):
- `loop` (all four): ROWS rows per program, each walked in BLOCK_N column tiles. argmax keeps, per lane, the best
  element it has seen (value, NaN flag, index) and reduces the lanes once at the end; topk keeps a running set of the
  k best elements seen (K_PAD = next_pow2(k) slots) and inserts from each tile every element that ranks before the
  set's worst member (a data-dependent `while` loop: after the first tiles of a random row it rarely runs), then
  writes the set in rank order (each member's rank is the number of members ranking before it); log_softmax and
  cross_entropy keep a running maximum and a running sum rescaled as the maximum grows (one exp per element), then
  log_softmax makes a second pass to write.
- `split` (all four): for a few long rows (decode sampling at batch 1). Program (row, chunk) reduces CHUNK
  columns to its best index (argmax) or its k best indices (topk) in an int32 workspace; a second kernel per row
  ranks the workspace's candidates, gathering their values from x again. log_softmax and cross_entropy: program
  (row, chunk) writes its columns' (maximum, rescaled sum) to a float64 workspace; a second kernel combines a row's
  partials in one fixed-shape reduction (per chunk for log_softmax, which then writes its chunk; per row for
  cross_entropy).
- `radix` (topk): as `split`, but a chunk's k best are selected without insertions: each element gets one int32
  order key, the k-th largest key is found by bisection (16 to 32 counting reductions by dtype), and the elements
  above it, then the lowest-indexed ones equal to it, are written by a prefix sum; the combine selects the same way
  among the chunks' candidates, then ranks the k for the final write.

Numerics: argmax and topk compare values exactly (float16/bfloat16/float32 widen exactly to float32); topk's values
are the input elements themselves, gathered by index. log_softmax and cross_entropy compute half-precision inputs in
float32 and float32 inputs in float64 (as the row kernels do, `kernels/rows.py`); the oracles are
`nbxcert.oracles.sampling`. Under the interpreter, bfloat16 stores round through `common.narrow` and inputs are never
bfloat16 subnormals (its bfloat16 load mishandles them, see `kernels/rows.py`).

Prunes (device facts only): threads per block; a tile of at least num_warps x warp_size elements (`lanes_refusal`);
registers of the tile-shaped values each kernel keeps live (counted below from the kernels, for the float32 path),
for topk also the [K_PAD, K_PAD] rank comparison of its final write; shared memory for the reductions' scratch
(`shared_bytes`). Every config uses num_stages = 1: no loop here feeds a tl.dot, which is all
Triton's pipeliner pipelines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.common import as_rows, both, compute_type, family_spec, narrow, upcast
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import KernelLaunch, cdiv, next_power_of_2, served
from nbxcert.kernels.launch import run_all as _run
from nbxcert.kernels.prune import lanes_refusal, prune_with, registers_refusal, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KernelSpec, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_numpy
from nbxcert.oracles import sampling as _oracle

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
INDEX_DTYPE = "int64"
MAX_K = 64
# The index of "no element" (an empty slot, a column past the row): ranks after every real element. Indices inside
# the kernels are int32, so rows are refused from this many columns on.
NO_INDEX = tl.constexpr(2**31 - 1)
MAX_COLS = 2**31 - 2
IGNORE_INDEX = -100  # cross_entropy's default ignore_index (torch's)


# --- order helpers ----------------------------------------------------------------------------------------------------
@jit
def _ranks_before(v, n, i, bv, bn, bi):
    """True where element (v, n, i) ranks before element (bv, bn, bi) (any shapes that broadcast).

    v: float32 value (0 where the element is NaN); n: int32 NaN flag (1: NaN); i: int32 column (NO_INDEX: none).
    A NaN ranks before a number; then the larger value; then, for equal values or two NaNs, the lower index."""
    return (n > bn) | ((n == bn) & ((v > bv) | ((v == bv) & (i < bi))))


@jit
def _keys(x, ok, i):
    """The rank keys (v, n, i) of loaded float32 values x: masked-out elements become "no element" (-inf, 0,
    NO_INDEX), which ranks after everything."""
    nan = (x != x).to(tl.int32)
    v = tl.where(nan != 0, 0.0, x)
    v = tl.where(ok, v, float("-inf"))
    return v, tl.where(ok, nan, 0), tl.where(ok, i, NO_INDEX)


@jit
def _column_keys(row_ptr, c, ok):
    """Rank keys of the columns c of one row (`ok`: which are in the row)."""
    x = tl.load(row_ptr + c, mask=ok, other=0.0).to(tl.float32)
    return _keys(x, ok, c)


@jit
def _gathered_keys(row_ptr, idx, ok):
    """Rank keys of the elements idx of one row, gathered (`ok`: which idx are real)."""
    x = tl.load(row_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    return _keys(x, ok, idx)


@jit
def _best_of(v, n, i):
    """The element of a 1-d tile that ranks first: (value, NaN flag, index); "no element" for an empty tile."""
    bn = tl.max(n, axis=0)
    cand = n == bn
    bv = tl.max(tl.where(cand, v, float("-inf")), axis=0)
    cand = cand & (v == bv)
    bi = tl.min(tl.where(cand, i, NO_INDEX), axis=0)
    return bv, bn, bi


@jit
def _worst_of(rv, rn, ri, slot, live, K_PAD: tl.constexpr):
    """The member of the running set (slots `live`) that ranks last, and its slot (the lowest such slot: empty slots
    are all alike)."""
    wn = tl.min(tl.where(live, rn, 1), axis=0)
    cand = live & (rn == wn)
    wv = tl.min(tl.where(cand, rv, float("inf")), axis=0)
    cand = cand & (rv == wv)
    wi = tl.max(tl.where(cand, ri, -1), axis=0)
    ws = tl.min(tl.where(cand & (ri == wi), slot, K_PAD), axis=0)
    return wv, wn, wi, ws


@jit
def _merge(rv, rn, ri, wv, wn, wi, ws, v, n, i, slot, live, K_PAD: tl.constexpr):
    """Insert into the running set (rv, rn, ri) every element of the tile (v, n, i) that ranks before the set's
    worst member (wv, wn, wi at slot ws), best first, each replacing the worst; returns the set and its new worst."""
    bv, bn, bi = _best_of(v, n, i)
    while _ranks_before(bv, bn, bi, wv, wn, wi):
        at = slot == ws
        rv = tl.where(at, bv, rv)
        rn = tl.where(at, bn, rn)
        ri = tl.where(at, bi, ri)
        gone = i == bi
        v = tl.where(gone, float("-inf"), v)
        n = tl.where(gone, 0, n)
        i = tl.where(gone, NO_INDEX, i)
        bv, bn, bi = _best_of(v, n, i)
        wv, wn, wi, ws = _worst_of(rv, rn, ri, slot, live, K_PAD)
    return rv, rn, ri, wv, wn, wi, ws


@jit
def _empty_set(K_PAD: tl.constexpr):
    """A running set of K_PAD empty slots ("no element")."""
    rv = tl.full([K_PAD], float("-inf"), tl.float32)
    rn = tl.zeros([K_PAD], tl.int32)
    ri = tl.full([K_PAD], NO_INDEX, tl.int32)
    return rv, rn, ri


@jit
def _store_ranked(row_ptr, val_ptr, idx_ptr, rv, rn, ri, live, ok):
    """Write the running set in rank order: member s goes to position rank(s), the number of members ranking before
    it (distinct positions 0..k-1: the order is total). Values are gathered from the row (the input's own bits)."""
    before = _ranks_before(rv[None, :], rn[None, :], ri[None, :], rv[:, None], rn[:, None], ri[:, None])
    rank = tl.sum((before & live[None, :]).to(tl.int32), axis=1)
    # compared with 0 to be a boolean mask: Triton 3.9's interpreter computes `live & ok` as int32 data (its dtype
    # says int1) and then refuses it as a store's mask
    keep = (live & ok) != 0
    tl.store(idx_ptr + rank, ri.to(tl.int64), mask=keep)
    tl.store(val_ptr + rank, tl.load(row_ptr + ri, mask=keep), mask=keep)


# --- argmax kernels ---------------------------------------------------------------------------------------------------
@jit
def _argmax_loop_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out[r] = the first-ranked column of row r of x [n_rows, n_cols] (rows `x_row_stride` apart, columns
    contiguous); out: int64 [n_rows]. ROWS: rows per program. BLOCK_N: the column tile; lane j keeps the best of
    columns j, j + BLOCK_N, ... (a strictly-later column replaces it only by ranking before it), the lanes are reduced
    once at the end. Live tile values: the lane's best (value, flag, index), the loaded tile's keys, the offsets."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        row_ok = row < n_rows
        row_ptr = x_ptr + row * x_row_stride
        av = tl.full([BLOCK_N], float("-inf"), tl.float32)
        an = tl.zeros([BLOCK_N], tl.int32)
        ai = tl.full([BLOCK_N], NO_INDEX, tl.int32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            v, n, i = _column_keys(row_ptr, c, both(c < n_cols, row_ok))
            take = _ranks_before(v, n, i, av, an, ai)
            av = tl.where(take, v, av)
            an = tl.where(take, n, an)
            ai = tl.where(take, i, ai)
        _, _, best = _best_of(av, an, ai)
        tl.store(out_ptr + row, best.to(tl.int64), mask=row_ok)


@jit
def _argmax_split_kernel(
    x_ptr,
    ws_ptr,
    n_cols,
    x_row_stride,
    n_chunks,
    CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Split argmax, step 1: program (row, chunk) writes the first-ranked column among columns [chunk * CHUNK,
    (chunk + 1) * CHUNK) of its row to ws[row * n_chunks + chunk] (int32). CHUNK: a multiple of BLOCK_N."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    row_ptr = x_ptr + row * x_row_stride
    cols = tl.arange(0, BLOCK_N)
    av = tl.full([BLOCK_N], float("-inf"), tl.float32)
    an = tl.zeros([BLOCK_N], tl.int32)
    ai = tl.full([BLOCK_N], NO_INDEX, tl.int32)
    for start in range(0, CHUNK, BLOCK_N):
        c = chunk * CHUNK + start + cols
        v, n, i = _column_keys(row_ptr, c, c < n_cols)
        take = _ranks_before(v, n, i, av, an, ai)
        av = tl.where(take, v, av)
        an = tl.where(take, n, an)
        ai = tl.where(take, i, ai)
    _, _, best = _best_of(av, an, ai)
    tl.store(ws_ptr + row * n_chunks + chunk, best)


@jit
def _argmax_combine_kernel(x_ptr, ws_ptr, out_ptr, x_row_stride, n_chunks, CHUNKS: tl.constexpr):
    """Split argmax, step 2: out[row] = the first-ranked of the row's n_chunks chunk winners (ws, int32), their values
    gathered from x again. CHUNKS: a power of two >= n_chunks."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, CHUNKS)
    ok = k < n_chunks
    idx = tl.load(ws_ptr + row * n_chunks + k, mask=ok, other=0)
    v, n, i = _gathered_keys(x_ptr + row * x_row_stride, idx, ok)
    _, _, best = _best_of(v, n, i)
    tl.store(out_ptr + row, best.to(tl.int64))


# --- topk kernels -----------------------------------------------------------------------------------------------------
@jit
def _topk_loop_kernel(
    x_ptr,
    val_ptr,
    idx_ptr,
    n_rows,
    n_cols,
    k,
    x_row_stride,
    val_row_stride,
    idx_row_stride,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_PAD: tl.constexpr,
):
    """The k first-ranked elements of each row of x [n_rows, n_cols] (rows `x_row_stride` apart, columns contiguous),
    in rank order: values into val [n_rows, k] (x's dtype, rows `val_row_stride` apart) and columns into idx
    [n_rows, k] (int64, rows `idx_row_stride` apart). k: 1 <= k <= min(n_cols, K_PAD). ROWS: rows per program.
    BLOCK_N: the column tile. K_PAD: the running set's slots, a power of two >= k (slots >= k stay empty).
    Live values: the tile's keys and their updates (BLOCK_N wide); the running set (K_PAD); at the end the
    [K_PAD, K_PAD] rank comparison."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    slot = tl.arange(0, K_PAD)
    live = slot < k
    for r in range(ROWS):
        row = pid * ROWS + r
        row_ok = row < n_rows
        row_ptr = x_ptr + row * x_row_stride
        rv, rn, ri = _empty_set(K_PAD)
        wv, wn, wi, ws = _worst_of(rv, rn, ri, slot, live, K_PAD)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            v, n, i = _column_keys(row_ptr, c, both(c < n_cols, row_ok))
            rv, rn, ri, wv, wn, wi, ws = _merge(rv, rn, ri, wv, wn, wi, ws, v, n, i, slot, live, K_PAD)
        _store_ranked(row_ptr, val_ptr + row * val_row_stride, idx_ptr + row * idx_row_stride, rv, rn, ri, live, row_ok)


@jit
def _topk_split_kernel(
    x_ptr,
    ws_ptr,
    n_cols,
    k,
    x_row_stride,
    n_chunks,
    CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_PAD: tl.constexpr,
):
    """Split topk, step 1: program (row, chunk) writes the k first-ranked columns among columns [chunk * CHUNK,
    (chunk + 1) * CHUNK) of its row, unordered, to ws[(row * n_chunks + chunk) * k + 0..k-1] (int32; NO_INDEX for
    a slot left empty by a chunk of fewer than k columns). CHUNK: a multiple of BLOCK_N."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    row_ptr = x_ptr + row * x_row_stride
    cols = tl.arange(0, BLOCK_N)
    slot = tl.arange(0, K_PAD)
    live = slot < k
    rv, rn, ri = _empty_set(K_PAD)
    wv, wn, wi, ws = _worst_of(rv, rn, ri, slot, live, K_PAD)
    for start in range(0, CHUNK, BLOCK_N):
        c = chunk * CHUNK + start + cols
        v, n, i = _column_keys(row_ptr, c, c < n_cols)
        rv, rn, ri, wv, wn, wi, ws = _merge(rv, rn, ri, wv, wn, wi, ws, v, n, i, slot, live, K_PAD)
    tl.store(ws_ptr + (row * n_chunks + chunk) * k + slot, ri, mask=live)


@jit
def _topk_combine_kernel(
    x_ptr,
    ws_ptr,
    val_ptr,
    idx_ptr,
    k,
    x_row_stride,
    val_row_stride,
    idx_row_stride,
    n_chunks,
    BLOCK_N: tl.constexpr,
    K_PAD: tl.constexpr,
):
    """Split topk, step 2: the k first-ranked of the row's n_chunks * k chunk candidates (ws, int32, NO_INDEX for
    none), their values gathered from x again, written in rank order as `_topk_loop_kernel` writes them. BLOCK_N:
    candidates per step."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * x_row_stride
    cand = tl.arange(0, BLOCK_N)
    slot = tl.arange(0, K_PAD)
    live = slot < k
    total = n_chunks * k
    rv, rn, ri = _empty_set(K_PAD)
    wv, wn, wi, ws = _worst_of(rv, rn, ri, slot, live, K_PAD)
    for start in range(0, total, BLOCK_N):
        e = start + cand
        idx = tl.load(ws_ptr + row * total + e, mask=e < total, other=NO_INDEX)
        v, n, i = _gathered_keys(row_ptr, idx, idx != NO_INDEX)
        rv, rn, ri, wv, wn, wi, ws = _merge(rv, rn, ri, wv, wn, wi, ws, v, n, i, slot, live, K_PAD)
    _store_ranked(row_ptr, val_ptr + row * val_row_stride, idx_ptr + row * idx_row_stride, rv, rn, ri, live, True)


# --- topk by radix selection ------------------------------------------------------------------------------------------
@jit
def _order_keys(x, ok, SHIFT: tl.constexpr):
    """One int32 per element whose signed order is the rank order by value: NaN (every NaN) above +inf, +0.0 equal to
    -0.0, negative numbers below positive ones; masked-out elements get the least key, below -inf. Ties (equal
    values, NaNs) are left to the index. x: float32 values widened from a format whose float32 patterns end in SHIFT
    zero bits (float16 13, bfloat16 16, float32 0): the key is shifted right by SHIFT, an order-keeping map that
    keeps distinct values distinct, so it spans 2^(32 - SHIFT) values."""
    b = x.to(tl.int32, bitcast=True)
    key = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    key = tl.where(x == 0.0, 0, key)
    key = tl.where(x != x, 0x7FFFFFFF, key)
    return tl.where(ok, key, -0x7FFFFFFF - 1) >> SHIFT


@jit
def _radix_keys(row_ptr, idx, ok, SHIFT: tl.constexpr):
    """Order keys of the elements idx of one row (`ok`: which are real), and idx with NO_INDEX where not."""
    x = tl.load(row_ptr + idx, mask=ok, other=0.0).to(tl.float32)
    return _order_keys(x, ok, SHIFT), tl.where(ok, idx, NO_INDEX)


@jit
def _radix_tile(row_ptr, src_ptr, e0, end, GATHER: tl.constexpr, BLOCK_N: tl.constexpr, SHIFT: tl.constexpr):
    """Keys and indices of entries e0 .. e0 + BLOCK_N - 1 (those below `end` are real): the row's columns of those
    numbers (GATHER False), or the candidate columns src_ptr[e] (int32, NO_INDEX for none; GATHER True)."""
    e = e0 + tl.arange(0, BLOCK_N)
    if GATHER:
        idx = tl.load(src_ptr + e, mask=e < end, other=NO_INDEX)
        return _radix_keys(row_ptr, idx, idx != NO_INDEX, SHIFT)
    return _radix_keys(row_ptr, e, e < end, SHIFT)


@jit
def _past(key, t, STRICT: tl.constexpr):
    if STRICT:
        return key > t
    return key >= t


@jit
def _radix_count(
    held,
    row_ptr,
    src_ptr,
    first,
    end,
    t,
    STRICT: tl.constexpr,
    GATHER: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SHIFT: tl.constexpr,
):
    """How many entries have a key above `t` (STRICT) or at least `t`: `held` holds their keys when TILES == 1; else
    the tiles are loaded again."""
    count = tl.zeros([], tl.int32)
    if TILES == 1:
        count += tl.sum(_past(held, t, STRICT).to(tl.int32), axis=0)
    else:
        for i in range(TILES):
            key, _idx = _radix_tile(row_ptr, src_ptr, first + i * BLOCK_N, end, GATHER, BLOCK_N, SHIFT)
            count += tl.sum(_past(key, t, STRICT).to(tl.int32), axis=0)
    return count


@jit
def _radix_select(
    row_ptr,
    src_ptr,
    first,
    end,
    k,
    dst_ptr,
    GATHER: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SHIFT: tl.constexpr,
):
    """Write to dst_ptr[0..k-1] (in dst_ptr's integer type) the indices of the k first-ranked of the entries first ..
    end - 1 (`_radix_tile`, TILES tiles of BLOCK_N from `first`), unordered; NO_INDEX in the slots of missing entries
    (fewer than k).

    The k-th order key T is found by bisection over the keys' range (32 - SHIFT counting passes); then the
    entries above T, and of those equal to T the first in entry order (the lowest indices: entries come in index
    order) up to k, are written at positions given by a running prefix sum. With TILES == 1 the entries are loaded
    once and kept in registers."""
    # the first tile: with TILES == 1 every entry, held for all the passes
    key, idx = _radix_tile(row_ptr, src_ptr, first, end, GATHER, BLOCK_N, SHIFT)
    lo = tl.full([], -(2 ** (31 - SHIFT)), tl.int64)
    hi = tl.full([], 2 ** (31 - SHIFT) - 1, tl.int64)
    for _ in range(32 - SHIFT):
        mid = lo + ((hi - lo + 1) >> 1)
        count = _radix_count(key, row_ptr, src_ptr, first, end, mid.to(tl.int32), False, GATHER, TILES, BLOCK_N, SHIFT)
        enough = count >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    t32 = lo.to(tl.int32)
    ties = k - _radix_count(key, row_ptr, src_ptr, first, end, t32, True, GATHER, TILES, BLOCK_N, SHIFT)
    placed = tl.zeros([], tl.int32)
    ties_seen = tl.zeros([], tl.int32)  # ties is how many of the entries equal to T are taken, the first ones
    for t in range(TILES):
        if TILES > 1:
            key, idx = _radix_tile(row_ptr, src_ptr, first + t * BLOCK_N, end, GATHER, BLOCK_N, SHIFT)
        eq = (key == t32).to(tl.int32)
        take = (key > t32) | ((eq != 0) & (ties_seen + tl.cumsum(eq, axis=0) <= ties))
        took = take.to(tl.int32)
        pos = placed + tl.cumsum(took, axis=0) - 1
        tl.store(dst_ptr + pos, idx.to(dst_ptr.dtype.element_ty), mask=take)
        placed += tl.sum(took, axis=0)
        ties_seen += tl.sum(eq, axis=0)


@jit
def _topk_radix_kernel(
    x_ptr,
    ws_ptr,
    n_cols,
    k,
    x_row_stride,
    n_chunks,
    CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SHIFT: tl.constexpr,
):
    """Radix topk, step 1: program (row, chunk) writes the k first-ranked columns among columns [chunk * CHUNK,
    (chunk + 1) * CHUNK) of its row, unordered, to ws[(row * n_chunks + chunk) * k + 0..k-1] (int32; NO_INDEX for
    a slot left empty), as `_topk_split_kernel` does, by `_radix_select` instead of insertions. CHUNK: a multiple of
    BLOCK_N."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * CHUNK
    end = tl.minimum(n_cols, start + CHUNK)
    dst = ws_ptr + (row * n_chunks + chunk) * k
    _radix_select(x_ptr + row * x_row_stride, ws_ptr, start, end, k, dst, False, CHUNK // BLOCK_N, BLOCK_N, SHIFT)


@jit
def _topk_radix_combine_kernel(
    x_ptr,
    ws_ptr,
    val_ptr,
    idx_ptr,
    k,
    x_row_stride,
    val_row_stride,
    idx_row_stride,
    n_chunks,
    TILES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_PAD: tl.constexpr,
    SHIFT: tl.constexpr,
):
    """Radix topk, step 2: the k first-ranked of the row's n_chunks * k candidates (ws, in index order: chunk after
    chunk, each chunk's in index order), selected by `_radix_select` into the row of idx (scratch at first), then read
    back and written in rank order as `_topk_loop_kernel` writes them. TILES: cdiv(n_chunks * k, BLOCK_N)."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * x_row_stride
    out_idx = idx_ptr + row * idx_row_stride
    total = n_chunks * k
    _radix_select(row_ptr, ws_ptr + row * total, 0, total, k, out_idx, True, TILES, BLOCK_N, SHIFT)
    tl.debug_barrier()  # the selection's stores are seen by every thread of the program
    slot = tl.arange(0, K_PAD)
    live = slot < k
    chosen = tl.load(out_idx + slot, mask=live, other=NO_INDEX).to(tl.int32)
    rv, rn, ri = _gathered_keys(row_ptr, chosen, live)
    tl.debug_barrier()  # every thread has read the scratch before any writes the ranked result over it
    _store_ranked(row_ptr, val_ptr + row * val_row_stride, out_idx, rv, rn, ri, live, True)


# --- log_softmax and cross_entropy kernels ----------------------------------------------------------------------------
@jit
def _chunk_lse(row_ptr, start, stop, cols, BLOCK_N: tl.constexpr, CDT: tl.constexpr):
    """(M, S) of columns [start, stop) of one row: their maximum and Σ exp(x - M), one pass over BLOCK_N tiles keeping
    a running maximum and a running sum rescaled as the maximum grows (online softmax). An empty range: (-inf, 0)."""
    m_run = tl.max(tl.full([BLOCK_N], float("-inf"), CDT), axis=0)
    s_run = tl.sum(tl.zeros([BLOCK_N], CDT), axis=0)
    for first in range(start, stop, BLOCK_N):
        c = first + cols
        z = tl.load(row_ptr + c, mask=c < stop, other=float("-inf")).to(CDT)
        m_new = tl.maximum(m_run, tl.max(z, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_run = s_run * tl.exp(m_run - m_safe) + tl.sum(tl.exp(z - m_safe), axis=0)
        m_run = m_new
    return m_run, s_run


@jit
def _row_lse(row_ptr, n_cols, row_ok, cols, BLOCK_N: tl.constexpr, CDT: tl.constexpr):
    """(M, S) of one row (`_chunk_lse` over all its columns)."""
    # a padding row past n_rows reads nothing: an empty range, (-inf, 0)
    return _chunk_lse(row_ptr, 0, tl.where(row_ok, n_cols, 0), cols, BLOCK_N, CDT)


@jit
def _log_softmax_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """y = x - M - log S per row (`_row_lse`), then a second pass writes. x_ptr, y_ptr: [n_rows, n_cols], rows the
    given strides apart, columns contiguous. ROWS: rows per program (changes no bit). BLOCK_N: the column tile. CDT:
    compute type. UPCAST: interpreter backend (`common.narrow`). Live tile values: the loaded tile, its exponentials,
    the offsets."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        row_ok = row < n_rows
        m, s = _row_lse(x_ptr + row * x_row_stride, n_cols, row_ok, cols, BLOCK_N, CDT)
        log_s = tl.log(tl.where(s > 0.0, s, 1.0))  # s >= 1 in a row; 0 only in a padding row past n_rows
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            ok = both(c < n_cols, row_ok)
            z = tl.load(x_ptr + row * x_row_stride + c, mask=ok, other=0.0).to(CDT)
            y = (z - m) - log_s
            tl.store(y_ptr + row * y_row_stride + c, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _cross_entropy_kernel(
    x_ptr,
    t_ptr,
    loss_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    ignore_index,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """loss[r] = M + log S - x[r, t] (`_row_lse`), t = target[r]; 0 where t == ignore_index; NaN where t is outside
    [0, n_cols) (x is then not read at t). x_ptr: logits [n_rows, n_cols], rows `x_row_stride` apart, columns
    contiguous. t_ptr: int64 targets [n_rows]. loss_ptr: [n_rows], x's dtype. ignore_index: int. ROWS, BLOCK_N,
    CDT, UPCAST: as `_log_softmax_kernel`."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        row_ok = row < n_rows
        row_ptr = x_ptr + row * x_row_stride
        m, s = _row_lse(row_ptr, n_cols, row_ok, cols, BLOCK_N, CDT)
        t = tl.load(t_ptr + row, mask=row_ok, other=ignore_index)
        t_ok = (t >= 0) & (t < n_cols)
        x_t = tl.load(row_ptr + t, mask=t_ok & row_ok, other=0.0).to(CDT)
        loss = (m + tl.log(tl.where(s > 0.0, s, 1.0))) - x_t
        loss = tl.where(t_ok, loss, float("nan"))
        loss = tl.where(t == ignore_index, 0.0, loss)
        tl.store(loss_ptr + row, narrow(loss, loss_ptr.dtype.element_ty, UPCAST), mask=row_ok)


@jit
def _lse_partial_kernel(
    x_ptr,
    ws_ptr,
    n_cols,
    x_row_stride,
    n_chunks,
    CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CDT: tl.constexpr,
):
    """Split log_softmax / cross_entropy, step 1. Grid: (n_rows, n_chunks). Program (row, c) writes (M, S) of the
    row's columns [c CHUNK, (c + 1) CHUNK) (`_chunk_lse`) to ws[row, c, 0:2] (float64 [n_rows, n_chunks, 2]). x_ptr:
    [n_rows, n_cols], rows `x_row_stride` apart, columns contiguous. BLOCK_N: the column tile. CDT: compute type."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * CHUNK
    stop = tl.minimum(n_cols, start + CHUNK)
    m, s = _chunk_lse(x_ptr + row * x_row_stride, start, stop, tl.arange(0, BLOCK_N), BLOCK_N, CDT)
    slot = ws_ptr + (row * n_chunks + chunk) * 2
    tl.store(slot, m)
    tl.store(slot + 1, s)


@jit
def _lse_of_chunks(ws_ptr, row, n_chunks, NCH: tl.constexpr, CDT: tl.constexpr):
    """(M, S) of a whole row from its n_chunks partials in ws (NCH: a power of two >= n_chunks): M the partials'
    maximum, S = Σ_c S_c exp(M_c - M), one vector reduction of fixed shape."""
    i = tl.arange(0, NCH)
    ok = i < n_chunks
    base = ws_ptr + (row * n_chunks + i) * 2
    m_c = tl.load(base, mask=ok, other=float("-inf")).to(CDT)
    s_c = tl.load(base + 1, mask=ok, other=0.0).to(CDT)
    m = tl.max(m_c, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(s_c * tl.exp(m_c - m_safe), axis=0)


@jit
def _log_softmax_split_kernel(
    x_ptr,
    y_ptr,
    ws_ptr,
    n_cols,
    x_row_stride,
    y_row_stride,
    n_chunks,
    CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NCH: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Split log_softmax, step 2. Grid: (n_rows, n_chunks). Program (row, c) combines the row's partials
    (`_lse_of_chunks`) and writes y = x - M - log S over the row's columns [c CHUNK, (c + 1) CHUNK). Arguments as
    `_log_softmax_kernel` and `_lse_partial_kernel`."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    m, s = _lse_of_chunks(ws_ptr, row, n_chunks, NCH, CDT)
    log_s = tl.log(tl.where(s > 0.0, s, 1.0))
    cols = tl.arange(0, BLOCK_N)
    start = chunk * CHUNK
    stop = tl.minimum(n_cols, start + CHUNK)
    for first in range(start, stop, BLOCK_N):
        c = first + cols
        ok = c < stop
        z = tl.load(x_ptr + row * x_row_stride + c, mask=ok, other=0.0).to(CDT)
        y = (z - m) - log_s
        tl.store(y_ptr + row * y_row_stride + c, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _cross_entropy_split_kernel(
    x_ptr,
    t_ptr,
    loss_ptr,
    ws_ptr,
    n_cols,
    x_row_stride,
    ignore_index,
    n_chunks,
    NCH: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Split cross_entropy, step 2. Grid: (n_rows,). The row's partials combined (`_lse_of_chunks`), then the loss as
    `_cross_entropy_kernel` writes it. Arguments as `_cross_entropy_kernel` and `_lse_partial_kernel`."""
    row = tl.program_id(0).to(tl.int64)
    m, s = _lse_of_chunks(ws_ptr, row, n_chunks, NCH, CDT)
    row_ptr = x_ptr + row * x_row_stride
    t = tl.load(t_ptr + row)
    t_ok = (t >= 0) & (t < n_cols)
    x_t = tl.load(row_ptr + t, mask=t_ok, other=0.0).to(CDT)
    loss = (m + tl.log(tl.where(s > 0.0, s, 1.0))) - x_t
    loss = tl.where(t_ok, loss, float("nan"))
    loss = tl.where(t == ignore_index, 0.0, loss)
    tl.store(loss_ptr + row, narrow(loss, loss_ptr.dtype.element_ty, UPCAST))


# --- configs: named factories -----------------------------------------------------------------------------------------
def loop_config(block_n: int, num_warps: int, rows: int = 1) -> Config:
    """The `loop` variant: ROWS rows per program, each walked in BLOCK_N column tiles."""
    return Config.make(num_warps=num_warps, num_stages=1, VARIANT="loop", ROWS=rows, BLOCK_N=block_n)


def split_config(chunk: int, block_n: int, num_warps: int) -> Config:
    """The `split` variant: CHUNK columns per program in BLOCK_N tiles, then one combine per row."""
    return Config.make(num_warps=num_warps, num_stages=1, VARIANT="split", CHUNK=chunk, BLOCK_N=block_n)


# The trailing zero bits of a format's values widened to float32 (23 - its mantissa bits): radix topk's order keys
# drop them, and its bisection takes 32 minus that many steps.
RADIX_SHIFT = {"float16": 13, "bfloat16": 16, "float32": 0}


def radix_config(chunk: int, block_n: int, num_warps: int) -> Config:
    """topk's `radix` variant: CHUNK columns per program selected by bisection on order keys, in BLOCK_N tiles
    (kept in registers when CHUNK == BLOCK_N), then one radix combine per row."""
    return Config.make(num_warps=num_warps, num_stages=1, VARIANT="radix", CHUNK=chunk, BLOCK_N=block_n)


LOOP_TILES = ((256, 1), (256, 2), (1024, 4), (1024, 8), (4096, 8), (4096, 16))  # (BLOCK_N, warps)
SPLIT_TILES = ((1024, 4), (2048, 8))


def argmax_candidates() -> tuple[Config, ...]:
    """loop: (BLOCK_N, warps) in LOOP_TILES x ROWS {1, 4}; split: CHUNK {4096, 16384} x (BLOCK_N, warps) in
    SPLIT_TILES."""
    loop = [loop_config(b, w, r) for b, w in LOOP_TILES for r in (1, 4)]
    split = [split_config(chunk, b, w) for chunk in (4096, 16384) for b, w in SPLIT_TILES]
    return tuple(loop + split)


def topk_candidates() -> tuple[Config, ...]:
    """loop: (BLOCK_N, warps) in LOOP_TILES, one row per program (a row's insertions are serial: several rows per
    program would only serialise more); split: CHUNK {4096, 16384} x (BLOCK_N, warps) in SPLIT_TILES; radix: a
    4096-column chunk in one tile of 4, 8 or 16 warps, or a 16384-column chunk in tiles of 4096 (8 warps). The H200
    measured split and loop at 0.30-0.53x of torch.topk (2026-11-29): every insertion is a few reductions one after
    another, and a chunk's first tile inserts k of them; radix's count is 16 to 32 reductions per chunk (by dtype)
    whatever k."""
    loop = [loop_config(b, w) for b, w in LOOP_TILES]
    split = [split_config(chunk, b, w) for chunk in (4096, 16384) for b, w in SPLIT_TILES]
    radix = [radix_config(4096, 4096, w) for w in (4, 8, 16)] + [radix_config(16384, 4096, 8)]
    return tuple(loop + split + radix)


def lse_candidates() -> tuple[Config, ...]:
    """log_softmax, cross_entropy: loop: (BLOCK_N, warps) in LOOP_TILES x ROWS {1, 4}; split: CHUNK {4096, 16384} x
    (BLOCK_N, warps) in SPLIT_TILES (a few long rows: the loop variant gives one 256k-column row to one program; the
    H200 run of 2026-11-29 measured it at 0.48x of torch for log_softmax 1x256000)."""
    loop = [loop_config(b, w, r) for b, w in LOOP_TILES for r in (1, 4)]
    split = [split_config(chunk, b, w) for chunk in (4096, 16384) for b, w in SPLIT_TILES]
    return tuple(loop + split)


ARGMAX_DEFAULT = loop_config(1024, 4)
TOPK_DEFAULT = loop_config(1024, 4)
LSE_DEFAULT = loop_config(1024, 4)
SMALLEST_CHUNK = 4096  # make_inputs sizes the split workspace for the most chunks any candidate makes

# 32-bit registers per tile element live at the peak, counted from the kernels (float32 path; the int1 masks and the
# offsets of an arange are rematerialised): argmax: the lane's best (value, flag, index) and the tile's keys (3 + 3);
# topk: the tile's keys (3) and the inserted element's removal (a select per key, +2 live at once); log_softmax and
# cross_entropy: the loaded tile, its exponentials and the offsets (as rows' loop kernels). topk's final write holds
# the [K_PAD, K_PAD] comparison, one register per element (its int1 terms, summed as they are made: ptxas gave the
# loop kernel 152 registers for K_PAD = 64 at one warp, 128 elements per thread, with no spill). Besides its tiles a
# kernel holds ~12 registers of scalars (row addresses, strides, the loop counter, the row's statistics; as
# `common.SCALAR_REGS`). The census (`nbxcert census --kernels argmax,topk,log_softmax,cross_entropy`) compiles every
# kept candidate and found no spill for hopper, ampere or volta.
SCALAR_REGS = 12
ARGMAX_REGS = 6
TOPK_TILE_REGS = 5
TOPK_RANK_REGS = 1
LSE_REGS = 3


def k_pad(k: int) -> int:
    """topk's running-set slots: the smallest power of two >= k."""
    return next_power_of_2(max(1, int(k)))


def shared_bytes(config: Config, kp: int = 0) -> int:
    """Shared memory a sampling kernel may take, an upper bound of Triton's figure for every candidate the census
    compiled (sm_70, sm_80, sm_90): the cross-warp reductions' scratch, one 8-byte partial per warp for each of the
    (up to 4) values a reduction carries at once; for topk at least the layout conversion of its K_PAD ranks and
    indices for the scattered store, 8 bytes per slot (Triton gave 512 bytes at K_PAD = 64 for sm_90, any warps)."""
    return max(4 * 8 * config.num_warps, 8 * kp)


# --- prune: device facts only -----------------------------------------------------------------------------------------
def _tile_refusal(c: Config, regs: int, profile, kp: int = 0) -> str | None:
    block = c["BLOCK_N"]
    return (
        shared_memory_refusal(shared_bytes(c, kp), profile)
        or lanes_refusal(block, c, profile, "column tile")
        or registers_refusal(block, regs, c, profile, f"a column tile of {block} elements", SCALAR_REGS)
    )


def prune_argmax(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse argmax configs whose column tile is smaller than the block's lanes or over its registers."""
    return prune_with(candidates, profile, lambda c: _tile_refusal(c, ARGMAX_REGS, profile))


def prune_topk(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse topk configs as argmax's, and those whose final [K_PAD, K_PAD] rank comparison exceeds the registers a
    thread of the block has."""
    kp = k_pad(problem["k"])

    def check(c: Config) -> str | None:
        return _tile_refusal(c, TOPK_TILE_REGS, profile, kp) or registers_refusal(
            kp * kp, TOPK_RANK_REGS, c, profile, f"the {kp}x{kp} rank comparison", SCALAR_REGS
        )

    return prune_with(candidates, profile, check)


def prune_lse(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse log_softmax / cross_entropy configs whose column tile is smaller than the block's lanes or over its
    registers (the float64 path of float32 inputs may spill in the widest tiles kept: slower, still correct)."""
    return prune_with(candidates, profile, lambda c: _tile_refusal(c, LSE_REGS, profile))


# --- launches ---------------------------------------------------------------------------------------------------------
def _warps(config: Config) -> dict[str, int]:
    return {"num_warps": config.num_warps, "num_stages": config.num_stages}


def _check_cols(name: str, n_cols: int) -> None:
    if n_cols == 0:
        raise LaunchError(f"{name}: a row of 0 columns has no element to pick")
    if n_cols > MAX_COLS:
        raise LaunchError(f"{name}: rows of {n_cols} columns exceed the kernels' int32 indices (max {MAX_COLS})")


def workspace_elements(n_rows: int, n_cols: int, k: int, chunk: int) -> int:
    """int32 elements of the split variant's workspace: one (argmax, k = 1) or k candidates per row and chunk."""
    return max(1, n_rows * cdiv(max(1, n_cols), chunk) * k)


def split_workspace(n_rows: int, n_cols: int, k: int, device, chunk: int = SMALLEST_CHUNK) -> Tensor:
    """A workspace for the split variant of [n_rows, n_cols] rows, chunks of >= `chunk` columns."""
    return empty((workspace_elements(n_rows, n_cols, k, chunk),), "int32", device)


def lse_workspace(n_rows: int, n_cols: int, device, chunk: int = SMALLEST_CHUNK) -> Tensor:
    """The float64 workspace of split log_softmax / cross_entropy: (M, S) per row and chunk of >= `chunk` columns."""
    return empty((2 * workspace_elements(n_rows, n_cols, 1, chunk),), "float64", device)


def _lse_workspace_ok(ws: Tensor | None, need: int, name: str) -> Tensor:
    if ws is None or ws.dtype.name != "float64" or ws.numel < need or not ws.is_contiguous():
        raise LaunchError(f"{name} split: needs a contiguous float64 workspace of >= {need} elements, got {ws}")
    return ws


def _workspace_ok(ws: Tensor | None, need: int, name: str) -> Tensor:
    if ws is None or ws.dtype.name != "int32" or ws.numel < need or not ws.is_contiguous():
        raise LaunchError(f"{name} split: needs a contiguous int32 workspace of >= {need} elements, got {ws}")
    return ws


def argmax_launches(config: Config, x: Tensor, out: Tensor, workspace: Tensor | None) -> list[KernelLaunch]:
    """The launches of one argmax of the row view x [n_rows, n_cols] into out int64 [n_rows]."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return []
    _check_cols("argmax", n_cols)
    if config["VARIANT"] == "loop":
        rows = config["ROWS"]
        args = (x, out, n_rows, n_cols, x.stride(0))
        kwargs = dict(ROWS=rows, BLOCK_N=config["BLOCK_N"], **_warps(config))
        return [KernelLaunch(_argmax_loop_kernel, (cdiv(n_rows, rows),), args, kwargs)]
    chunk, block = config["CHUNK"], config["BLOCK_N"]
    n_chunks = cdiv(n_cols, chunk)
    ws = _workspace_ok(workspace, n_rows * n_chunks, "argmax")
    return [
        KernelLaunch(
            _argmax_split_kernel,
            (n_rows, n_chunks),
            (x, ws, n_cols, x.stride(0), n_chunks),
            dict(CHUNK=chunk, BLOCK_N=block, **_warps(config)),
        ),
        KernelLaunch(
            _argmax_combine_kernel,
            (n_rows,),
            (x, ws, out, x.stride(0), n_chunks),
            dict(CHUNKS=next_power_of_2(n_chunks), **_warps(config)),
        ),
    ]


def topk_launches(
    config: Config, x: Tensor, k: int, values: Tensor, indices: Tensor, workspace: Tensor | None
) -> list[KernelLaunch]:
    """The launches of one topk of the row view x [n_rows, n_cols] into values [n_rows, k] (x's dtype) and indices
    [n_rows, k] (int64), both with contiguous columns."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return []
    _check_cols("topk", n_cols)
    _check_k(k, n_cols)
    kp, block = k_pad(k), config["BLOCK_N"]
    if config["VARIANT"] == "loop":
        rows = config["ROWS"]
        args = (x, values, indices, n_rows, n_cols, k, x.stride(0), values.stride(0), indices.stride(0))
        kwargs = dict(ROWS=rows, BLOCK_N=block, K_PAD=kp, **_warps(config))
        return [KernelLaunch(_topk_loop_kernel, (cdiv(n_rows, rows),), args, kwargs)]
    chunk = config["CHUNK"]
    n_chunks = cdiv(n_cols, chunk)
    ws = _workspace_ok(workspace, n_rows * n_chunks * k, "topk")
    # step 1 per (row, chunk) into the workspace, then the combine per row; radix selects where split inserts
    step_kw = dict(CHUNK=chunk, BLOCK_N=block, **_warps(config))
    combine_kw = dict(BLOCK_N=block, K_PAD=kp, **_warps(config))
    if config["VARIANT"] == "radix":
        step, combine = _topk_radix_kernel, _topk_radix_combine_kernel
        shift = RADIX_SHIFT[x.dtype.name]
        step_kw.update(SHIFT=shift)
        combine_kw.update(SHIFT=shift, TILES=cdiv(n_chunks * k, block))
    else:
        step, combine = _topk_split_kernel, _topk_combine_kernel
        step_kw.update(K_PAD=kp)
    return [
        KernelLaunch(step, (n_rows, n_chunks), (x, ws, n_cols, k, x.stride(0), n_chunks), step_kw),
        KernelLaunch(
            combine,
            (n_rows,),
            (x, ws, values, indices, k, x.stride(0), values.stride(0), indices.stride(0), n_chunks),
            combine_kw,
        ),
    ]


def _lse_partial(config: Config, x: Tensor, workspace: Tensor | None, name: str) -> tuple[KernelLaunch, Tensor, int]:
    """Step 1 of a split log_softmax / cross_entropy: its launch, the workspace and the number of chunks."""
    n_rows, n_cols = x.shape
    chunk = config["CHUNK"]
    n_chunks = cdiv(n_cols, chunk)
    ws = _lse_workspace_ok(workspace, 2 * n_rows * n_chunks, name)
    kwargs = dict(CHUNK=chunk, BLOCK_N=config["BLOCK_N"], CDT=compute_type(x.dtype.name), **_warps(config))
    launch = KernelLaunch(_lse_partial_kernel, (n_rows, n_chunks), (x, ws, n_cols, x.stride(0), n_chunks), kwargs)
    return launch, ws, n_chunks


def log_softmax_launches(config: Config, x: Tensor, y: Tensor, workspace: Tensor | None = None) -> list[KernelLaunch]:
    """The launches of one log_softmax of the row view x [n_rows, n_cols] into y (same shape and dtype); the split
    variant needs `workspace` (`lse_workspace`)."""
    n_rows, n_cols = x.shape
    if n_rows == 0 or n_cols == 0:
        return []
    if config["VARIANT"] == "split":
        partial, ws, n_chunks = _lse_partial(config, x, workspace, "log_softmax")
        kwargs = dict(
            CHUNK=config["CHUNK"],
            BLOCK_N=config["BLOCK_N"],
            NCH=next_power_of_2(n_chunks),
            CDT=compute_type(x.dtype.name),
            UPCAST=upcast(),
            **_warps(config),
        )
        args = (x, y, ws, n_cols, x.stride(0), y.stride(0), n_chunks)
        return [partial, KernelLaunch(_log_softmax_split_kernel, (n_rows, n_chunks), args, kwargs)]
    rows = config["ROWS"]
    args = (x, y, n_rows, n_cols, x.stride(0), y.stride(0))
    kwargs = dict(ROWS=rows, BLOCK_N=config["BLOCK_N"], CDT=compute_type(x.dtype.name), UPCAST=upcast())
    return [KernelLaunch(_log_softmax_kernel, (cdiv(n_rows, rows),), args, dict(kwargs, **_warps(config)))]


def cross_entropy_launches(
    config: Config, x: Tensor, target: Tensor, loss: Tensor, ignore_index: int, workspace: Tensor | None = None
) -> list[KernelLaunch]:
    """The launches of one cross_entropy of logits x [n_rows, n_cols] with int64 targets [n_rows] into loss
    [n_rows]; the split variant needs `workspace` (`lse_workspace`)."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return []
    _check_cols("cross_entropy", n_cols)
    if config["VARIANT"] == "split":
        partial, ws, n_chunks = _lse_partial(config, x, workspace, "cross_entropy")
        kwargs = dict(NCH=next_power_of_2(n_chunks), CDT=compute_type(x.dtype.name), UPCAST=upcast(), **_warps(config))
        args = (x, target, loss, ws, n_cols, x.stride(0), int(ignore_index), n_chunks)
        return [partial, KernelLaunch(_cross_entropy_split_kernel, (n_rows,), args, kwargs)]
    rows = config["ROWS"]
    args = (x, target, loss, n_rows, n_cols, x.stride(0), int(ignore_index))
    kwargs = dict(ROWS=rows, BLOCK_N=config["BLOCK_N"], CDT=compute_type(x.dtype.name), UPCAST=upcast())
    return [KernelLaunch(_cross_entropy_kernel, (cdiv(n_rows, rows),), args, dict(kwargs, **_warps(config)))]


# --- user-facing functions --------------------------------------------------------------------------------------------
def _check_float(name: str, t: Tensor) -> None:
    """x must be a float tensor of at least one dimension whose last dimension is not empty."""
    if t.dtype.name not in FLOAT_DTYPES:
        raise ShapeMismatch(f"{name} has dtype {t.dtype.name}; one of {', '.join(FLOAT_DTYPES)} is required")
    if t.ndim and t.shape[-1] == 0:
        raise LaunchError(f"{name}: a row of 0 columns has no element to pick")


def _check_k(k: int, n_cols: int) -> None:
    if not 1 <= k <= min(MAX_K, n_cols):
        raise LaunchError(f"topk: k={k} must be in [1, min({MAX_K}, n_cols={n_cols})]")


def _out(out: Tensor | None, shape: tuple[int, ...], dtype: str, like: Tensor, name: str) -> Tensor:
    if out is None:
        return empty(shape, dtype, like.device)
    if tuple(out.shape) != tuple(shape) or out.dtype.name != dtype or not out.is_contiguous():
        raise ShapeMismatch(f"{name}: out must be a contiguous {dtype}{list(shape)}, got {out.dtype.name}{out.shape}")
    return out


def rows_problem(x: Tensor, *_, **__) -> dict:
    """The key problem of argmax, log_softmax and cross_entropy: rows and columns of the last dimension."""
    n_cols = x.shape[-1] if x.ndim else 1
    return {"n_rows": x.numel // max(1, n_cols), "n_cols": n_cols}


def topk_problem(x: Tensor, k: int, *_, **__) -> dict:
    """The key problem of topk: rows, columns and k."""
    return dict(rows_problem(x), k=int(k))


@served
def argmax(x: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """The index (int64) of the largest element over the last dimension -> x.shape[:-1]: the lowest index of the
    maximum; a NaN ranks above every number (the first NaN's index)."""
    _check_float("argmax: x", x)
    rows_x = as_rows(x, "argmax: x")
    out = _out(out, x.shape[:-1], INDEX_DTYPE, x, "argmax")
    flat = out.view(-1) if out.ndim != 1 else out
    problem = rows_problem(x)

    def run(c: Config) -> None:
        ws = None
        if c["VARIANT"] == "split":
            ws = split_workspace(rows_x.shape[0], rows_x.shape[1], 1, x.device, c["CHUNK"])
        _run(argmax_launches(c, rows_x, flat, ws))

    run(choose_config(ARGMAX, problem, (x.dtype.name, INDEX_DTYPE), config, run=run, outputs=(flat,)))
    return out


@served
def topk(
    x: Tensor,
    k: int,
    values: Tensor | None = None,
    indices: Tensor | None = None,
    config: Config | None = None,
) -> tuple[Tensor, Tensor]:
    """The k (<= 64) largest elements over the last dimension, in rank order (value descending, the lower index
    first among equal values; NaN above every number): (values [..., k] of x's dtype, indices [..., k] int64)."""
    _check_float("topk: x", x)
    rows_x = as_rows(x, "topk: x")
    k = int(k)
    _check_k(k, rows_x.shape[1])
    shape = x.shape[:-1] + (k,)
    values = _out(values, shape, x.dtype.name, x, "topk values")
    indices = _out(indices, shape, INDEX_DTYPE, x, "topk indices")
    rows_v, rows_i = values.view(-1, k), indices.view(-1, k)
    problem = topk_problem(x, k)

    def run(c: Config) -> None:
        ws = None
        if c["VARIANT"] in ("split", "radix"):
            ws = split_workspace(rows_x.shape[0], rows_x.shape[1], k, x.device, c["CHUNK"])
        _run(topk_launches(c, rows_x, k, rows_v, rows_i, ws))

    run(choose_config(TOPK, problem, (x.dtype.name,), config, run=run, outputs=(rows_v, rows_i)))
    return values, indices


@served
def log_softmax(x: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """x - max - log Σ exp(x - max) over the last dimension (x's shape and dtype)."""
    _check_float("log_softmax: x", x)
    rows_x = as_rows(x, "log_softmax: x")
    y = _out(out, x.shape, x.dtype.name, x, "log_softmax")
    rows_y = as_rows(y, "log_softmax: out")
    problem = rows_problem(x)

    def run(c: Config) -> None:
        ws = lse_workspace(*rows_x.shape, x.device, c["CHUNK"]) if c["VARIANT"] == "split" else None
        _run(log_softmax_launches(c, rows_x, rows_y, ws))

    run(choose_config(LOG_SOFTMAX, problem, (x.dtype.name,), config, run=run, outputs=(rows_y,)))
    return y


@served
def cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = IGNORE_INDEX,
    out: Tensor | None = None,
    config: Config | None = None,
) -> Tensor:
    """Per-row loss logsumexp(logits[r]) - logits[r, target[r]] over the last dimension (reduction "none"; logits'
    dtype): 0 where target == ignore_index; NaN where a target is outside [0, n_cols). target: int64, one per row."""
    _check_float("cross_entropy: logits", logits)
    rows_x = as_rows(logits, "cross_entropy: logits")
    n_rows = rows_x.shape[0]
    if target.dtype.name != INDEX_DTYPE or target.numel != n_rows or not target.is_contiguous():
        raise ShapeMismatch(
            f"cross_entropy: target must be a contiguous int64 tensor of {n_rows} elements, got "
            f"{target.dtype.name}{target.shape}"
        )
    loss = _out(out, logits.shape[:-1], logits.dtype.name, logits, "cross_entropy")
    flat = loss.view(-1) if loss.ndim != 1 else loss
    flat_t = target.view(-1) if target.ndim != 1 else target
    problem = rows_problem(logits)

    def run(c: Config) -> None:
        ws = lse_workspace(*rows_x.shape, logits.device, c["CHUNK"]) if c["VARIANT"] == "split" else None
        _run(cross_entropy_launches(c, rows_x, flat_t, flat, ignore_index, ws))

    run(choose_config(CROSS_ENTROPY, problem, (logits.dtype.name,), config, run=run, outputs=(flat,)))
    return loss


# --- inputs and oracle adapters ---------------------------------------------------------------------------------------
def ranked_values(gen: np.random.Generator, shape, dtype: str, values: str, device) -> Tensor:
    """Seeded test rows for argmax and topk, stored in `dtype` (never zeros):
    - "ties": normal values x 2 where each row holds deliberate ties: its maximum at 3 more places, and about one
      column in 16 a copy of one of the row's 16 largest values (so the first k of a row are often tied);
    - "equal": every row one repeated value (every element tied: argmax 0, topk 0..k-1);
    - "special": "ties" rows with +inf, -inf and NaN placed in some rows (NaN ranks first, +inf next)."""
    n_rows, n_cols = shape
    if values not in ("ties", "special", "equal"):
        raise ValueError(f"unknown values kind {values!r}")
    if values == "equal":
        return from_numpy(np.broadcast_to(gen.standard_normal((n_rows, 1)) * 3.0 + 0.5, shape).copy(), dtype, device)
    x = from_numpy(gen.standard_normal(shape) * 2.0, dtype, device).float64()  # the stored values, exactly
    for r in range(n_rows):
        row = x[r]
        top = np.sort(row)[::-1][: min(16, n_cols)]
        row[gen.integers(0, n_cols, 3)] = top[0]
        copies = gen.integers(0, n_cols, max(1, n_cols // 16))
        row[copies] = top[gen.integers(0, len(top), len(copies))]
        if values == "special" and r % 2 == 0:
            row[gen.integers(0, n_cols, 2)] = np.inf
            row[gen.integers(0, n_cols, 2)] = -np.inf
            if r % 4 == 0:
                row[gen.integers(0, n_cols, 2)] = np.nan
    return from_numpy(x, dtype, device)


def argmax_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, values: str = "ties"
) -> Inputs:
    """x [n_rows, n_cols] of `ranked_values`; out int64 [n_rows]; the split workspace."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    x = ranked_values(_inputs.rng(seed), (n_rows, n_cols), dtypes[0], values, device)
    tensors = {
        "x": x,
        "out": empty((n_rows,), INDEX_DTYPE, device),
        "workspace": split_workspace(n_rows, n_cols, 1, device),
    }
    return Inputs(tensors, {}, ("out",), dict(problem))


def _argmax_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(argmax_launches(config, t["x"], t["out"], t["workspace"]))


def _argmax_oracle(inputs: Inputs) -> dict[str, Reference]:
    ref, scale = _oracle.argmax(inputs.tensors["x"].float64())
    return {"out": Reference(ref, scale)}


def topk_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, values: str = "ties"
) -> Inputs:
    """x [n_rows, n_cols] of `ranked_values`; values [n_rows, k] (x's dtype), indices int64 [n_rows, k]; the split
    workspace."""
    n_rows, n_cols, k = int(problem["n_rows"]), int(problem["n_cols"]), int(problem["k"])
    _check_k(k, n_cols)
    x = ranked_values(_inputs.rng(seed), (n_rows, n_cols), dtypes[0], values, device)
    tensors = {
        "x": x,
        "values": empty((n_rows, k), dtypes[0], device),
        "indices": empty((n_rows, k), INDEX_DTYPE, device),
        "workspace": split_workspace(n_rows, n_cols, k, device),
    }
    return Inputs(tensors, {"k": k}, ("values", "indices"), dict(problem))


def _topk_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(topk_launches(config, t["x"], inputs.scalars["k"], t["values"], t["indices"], t["workspace"]))


def _topk_oracle(inputs: Inputs) -> dict[str, Reference]:
    refs = _oracle.topk(inputs.tensors["x"].float64(), inputs.scalars["k"])
    return {name: Reference(*pair) for name, pair in refs.items()}


def logit_values(gen: np.random.Generator, shape, values: str) -> np.ndarray:
    """Float64 logits: "normal" (standard normal x 3: a spread like a language model's logits); "equal": every row
    one repeated value."""
    if values == "normal":
        return gen.standard_normal(shape) * 3.0
    if values == "equal":
        return np.broadcast_to(gen.standard_normal(shape[:-1] + (1,)) * 3.0 + 0.5, shape).copy()
    raise ValueError(f"unknown values kind {values!r}")


def log_softmax_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, values: str = "normal"
) -> Inputs:
    """x [n_rows, n_cols] of `logit_values`; y alike; the split workspace."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    x = from_numpy(logit_values(_inputs.rng(seed), (n_rows, n_cols), values), dtypes[0], device)
    tensors = {"x": x, "y": empty((n_rows, n_cols), dtypes[0], device)}
    tensors["workspace"] = lse_workspace(n_rows, n_cols, device)
    return Inputs(tensors, {}, ("y",), dict(problem))


def _log_softmax_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(log_softmax_launches(config, t["x"], t["y"], t["workspace"]))


def _log_softmax_oracle(inputs: Inputs) -> dict[str, Reference]:
    return {"y": Reference(*_oracle.log_softmax(inputs.tensors["x"].float64()))}


def cross_entropy_inputs(
    problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str, values: str = "normal"
) -> Inputs:
    """logits [n_rows, n_cols] of `logit_values`; targets int64 [n_rows] uniform in [0, n_cols) with about one row in
    8 set to ignore_index (-100); loss [n_rows] of the logits' dtype; the split workspace."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    gen = _inputs.rng(seed)
    x = from_numpy(logit_values(gen, (n_rows, n_cols), values), dtypes[0], device)
    t = gen.integers(0, n_cols, n_rows)
    t[gen.random(n_rows) < 0.125] = IGNORE_INDEX
    tensors = {"x": x, "target": from_numpy(t.astype(np.int64), INDEX_DTYPE, device)}
    tensors["loss"] = empty((n_rows,), dtypes[0], device)
    tensors["workspace"] = lse_workspace(n_rows, n_cols, device)
    return Inputs(tensors, {"ignore_index": IGNORE_INDEX}, ("loss",), dict(problem))


def _cross_entropy_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(cross_entropy_launches(config, t["x"], t["target"], t["loss"], inputs.scalars["ignore_index"], t["workspace"]))


def _cross_entropy_oracle(inputs: Inputs) -> dict[str, Reference]:
    t = inputs.tensors
    ref = _oracle.cross_entropy(t["x"].float64(), t["target"].numpy(), inputs.scalars["ignore_index"])
    return {"loss": Reference(*ref)}


def _index_out(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (INDEX_DTYPE,)


def _values_and_index(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0], INDEX_DTYPE)


def _same(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0],)


# --- specs ------------------------------------------------------------------------------------------------------------
ROW_KEY = (KeyField("n_rows", "rows"), KeyField("n_cols"))
ROW_EXAMPLES = ({"n_rows": 7, "n_cols": 1000}, {"n_rows": 3, "n_cols": 5000})
TOPK_EXAMPLES = (
    {"n_rows": 3, "n_cols": 1000, "k": 1},
    {"n_rows": 2, "n_cols": 2100, "k": 64},
    {"n_rows": 5, "n_cols": 300, "k": 7},
)
# argmax and topk: the order is total, so no field changes a bit (module docstring); every field is claimed
RANK_NO_BIT = ("VARIANT", "ROWS", "BLOCK_N", "CHUNK", "num_warps")

ARGMAX = family_spec(
    "sampling",
    "argmax",
    "index of the largest element over the last dimension (lowest index on ties, NaN first)",
    (_argmax_loop_kernel, _argmax_split_kernel, _argmax_combine_kernel),
    problem_args=("n_rows", "n_cols"),
    key_fields=ROW_KEY,
    # the index dtype is a key dtype: certificates are filed under the first output's dtype, which must be one
    dtype_args=("x", "out"),
    dtypes=tuple((d, INDEX_DTYPE) for d in FLOAT_DTYPES),
    output_dtypes=_index_out,
    tuning=(argmax_candidates(), ARGMAX_DEFAULT, prune_argmax),
    parts=(argmax_inputs, _argmax_launch, _argmax_oracle, rows_problem),
    no_bit_fields=RANK_NO_BIT,
    examples=ROW_EXAMPLES,
)

TOPK = family_spec(
    "sampling",
    "topk",
    "the k <= 64 largest elements over the last dimension, values and int64 indices in rank order",
    (
        _topk_loop_kernel,
        _topk_split_kernel,
        _topk_combine_kernel,
        _topk_radix_kernel,
        _topk_radix_combine_kernel,
    ),
    problem_args=("n_rows", "n_cols", "k"),
    key_fields=ROW_KEY + (KeyField("k"),),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in FLOAT_DTYPES),
    output_dtypes=_values_and_index,
    tuning=(topk_candidates(), TOPK_DEFAULT, prune_topk),
    parts=(topk_inputs, _topk_launch, _topk_oracle, topk_problem),
    no_bit_fields=RANK_NO_BIT,
    examples=TOPK_EXAMPLES,
)


def _lse_spec(name, description, kernels, make_inputs, launch, oracle) -> KernelSpec:
    """The row log-sum-exp specs (log_softmax, cross_entropy): one candidate list, one prune, one row key."""
    return family_spec(
        "sampling",
        name,
        description,
        kernels,
        problem_args=("n_rows", "n_cols"),
        key_fields=ROW_KEY,
        dtype_args=("x",),
        dtypes=tuple((d,) for d in FLOAT_DTYPES),
        output_dtypes=_same,
        tuning=(lse_candidates(), LSE_DEFAULT, prune_lse),
        parts=(make_inputs, launch, oracle, rows_problem),
        no_bit_fields=("ROWS",),
        examples=ROW_EXAMPLES,
    )


LOG_SOFTMAX = _lse_spec(
    "log_softmax",
    "log-softmax over the last dimension (looped online max)",
    (_log_softmax_kernel, _lse_partial_kernel, _log_softmax_split_kernel),
    log_softmax_inputs,
    _log_softmax_launch,
    _log_softmax_oracle,
)
CROSS_ENTROPY = _lse_spec(
    "cross_entropy",
    "per-row cross-entropy of logits and int64 targets (ignore_index -100), looped online max",
    (_cross_entropy_kernel, _lse_partial_kernel, _cross_entropy_split_kernel),
    cross_entropy_inputs,
    _cross_entropy_launch,
    _cross_entropy_oracle,
)

SPECS = (ARGMAX, TOPK, LOG_SOFTMAX, CROSS_ENTROPY)

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
