"""Element-wise kernels, each ending in a validated `KernelSpec`:

    silu_and_mul   SwiGLU: x [..., 2d] -> silu(x[..., :d]) * x[..., d:]
    gelu_and_mul   GeGLU (Gemma): x [..., 2d] -> gelu(x[..., :d]) * x[..., d:], tanh or erf form
    gelu           0.5 x (1 + erf(x / sqrt 2)), or the tanh form (`approximate` an exact key field)
    add_mul        a + b or a * b (`op` an exact key field) with numpy broadcasting over strided inputs (up to 4
                   dimensions after merging the ones that are contiguous in all three tensors)
    cast           between float16, bfloat16, float32 and float64, every pair, round to nearest even, bit for bit
                   equal to the tensor layer's host conversion (`nbxcert.kernels.dtypes.encode`)
    rope           rotary embedding applied in place to q and k (neox and gpt-j pairings, partial rotary dims,
                   positions per token, a [max_position, rot_dim] float32 cos/sin cache as vLLM lays it out)
    embedding      row gather by token id; an id outside [0, vocab) is refused before the launch (`LaunchError`
                   naming the id and the table size), so no launch ever reads past the table

Numerics (oracles: `nbxcert.oracles.elementwise`): half-precision inputs compute in float32, float32 and float64
inputs in float64 (a float32 output is certified at one float32 epsilon, which a float32 chain of exp, add and divide
does not meet); constants enter the float64 path at float64 precision (`_c`). `cast` never rounds through a float
unit: it widens the source bits exactly to float64 bits, then rounds those to the target with integer arithmetic.
That is the same on every backend: Triton's interpreter truncates float32 -> bfloat16, mishandles bfloat16
subnormals and maps float64 -> bfloat16 beyond range to 0 (all seen with Triton 3.6 and 3.9), and a GPU's float32
unit may flush subnormals.

No config field of these kernels changes an output bit (no reduction: every element is computed by the same
expression whatever the tile, the rows or tokens per program, or the warps); every spec says so in `no_bit_fields`
and the tests check it.

Prunes (device facts only, `nbxcert.kernels.prune`): threads per block, a tile of at least num_warps x warp_size
elements, and the registers its live values need.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import faults
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.common import (
    as_rows,
    both,
    broadcast_strides,
    compute_type,
    family_spec,
    merge_dims,
    narrow,
    upcast,
)
from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.faults import record_fault
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import KernelLaunch, cdiv, constexprs, next_power_of_2, served
from nbxcert.kernels.launch import run_all as _run
from nbxcert.kernels.prune import lanes_refusal, prune_with, registers_refusal, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_numpy
from nbxcert.oracles import elementwise as _oracle

HALF_AND_SINGLE = ("float16", "bfloat16", "float32")
CAST_DTYPES = ("float16", "bfloat16", "float32", "float64")
# (exponent bits, mantissa bits) of each float format, and the integer type its bits are read as
FORMATS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
BITS_TYPE = {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64"}
# constants the kernels read (globals a @jit function reads must be tl.constexpr)
INV_SQRT2 = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
GELU_TANH_C = tl.constexpr(0.044715)


# --- kernels ----------------------------------------------------------------------------------------------------------
@jit
def _c(value: tl.constexpr, CDT: tl.constexpr):
    """The constant `value` in the compute type at its full precision (a bare Python float enters Triton as float32,
    which would round it before a float64 computation uses it)."""
    return tl.full([], value, CDT)


@jit
def _silu_and_mul_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    d,
    x_row_stride,
    y_row_stride,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """y[r, c] = silu(x[r, c]) * x[r, d + c] for c < d, silu(a) = a * sigmoid(a).

    sigmoid(a) is 1 / (1 + e) for a >= 0 and e / (1 + e) for a < 0, with e = exp(-|a|) <= 1: never exp of a large
    positive number, whose overflow would turn silu(a) for a in (-104, -88) into 0 where float32 and bfloat16 still
    hold the tiny result.

    x_ptr: [n_rows, 2d], rows `x_row_stride` apart; y_ptr: [n_rows, d], rows `y_row_stride` apart; columns contiguous.
    Grid (cdiv(n_rows, ROWS), cdiv(d, BLOCK)): ROWS rows x BLOCK columns per program. CDT: compute type. UPCAST:
    interpreter backend (bfloat16 rounding, `narrow`)."""
    pid_r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    c_ok = cols < d
    for r in range(ROWS):
        row = pid_r * ROWS + r
        ok = both(c_ok, row < n_rows)
        a = tl.load(x_ptr + row * x_row_stride + cols, mask=ok, other=0.0).to(CDT)
        b = tl.load(x_ptr + row * x_row_stride + d + cols, mask=ok, other=0.0).to(CDT)
        e = tl.exp(-tl.abs(a))
        y = a * (tl.where(a >= 0, 1.0, e) / (1.0 + e)) * b
        tl.store(y_ptr + row * y_row_stride + cols, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _gelu_kernel(x_ptr, y_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr, CDT: tl.constexpr, UPCAST: tl.constexpr):
    """y = gelu(x) over n contiguous elements, BLOCK per program.

    TANH false: 0.5 x (1 + erf(x / sqrt 2)). TANH true: the tanh form 0.5 x (1 + tanh(t)), t = sqrt(2/pi) (x +
    0.044715 x³), computed as x / (1 + exp(-2t)) (the same value; no cancellation of 1 + tanh for x << 0, and
    exp(-2t) = inf gives the correct limit 0). CDT: compute type. UPCAST: interpreter backend."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(CDT)
    if TANH:
        t = _c(SQRT_2_OVER_PI, CDT) * (x + _c(GELU_TANH_C, CDT) * x * x * x)
        y = x / (1.0 + tl.exp(-2.0 * t))
    else:
        y = 0.5 * x * (1.0 + tl.math.erf(x * _c(INV_SQRT2, CDT)))
    tl.store(y_ptr + offs, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _add_mul_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    n,
    size1,
    size2,
    size3,
    a_s0,
    a_s1,
    a_s2,
    a_s3,
    b_s0,
    b_s1,
    b_s2,
    b_s3,
    MUL: tl.constexpr,
    DENSE: tl.constexpr,
    BLOCK: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """out = a + b (MUL false) or a * b (MUL true) over n elements of the contiguous out [size0, size1, size2, size3].

    a_ptr, b_ptr: read through their strides a_s0..a_s3 / b_s0..b_s3 in elements (0 where broadcast). DENSE: a and b
    are contiguous with out's shape (the index arithmetic is skipped). BLOCK elements per program. CDT: compute type.
    UPCAST: interpreter backend."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    if DENSE:
        a_off = offs
        b_off = offs
    else:
        i3 = offs % size3
        rest = offs // size3
        i2 = rest % size2
        rest = rest // size2
        i1 = rest % size1
        i0 = rest // size1
        a_off = i0 * a_s0 + i1 * a_s1 + i2 * a_s2 + i3 * a_s3
        b_off = i0 * b_s0 + i1 * b_s1 + i2 * b_s2 + i3 * b_s3
    a = tl.load(a_ptr + a_off, mask=ok, other=0.0).to(CDT)
    b = tl.load(b_ptr + b_off, mask=ok, other=0.0).to(CDT)
    if MUL:
        y = a * b
    else:
        y = a + b
    tl.store(out_ptr + offs, narrow(y, out_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _widen_bits(bits, E: tl.constexpr, M: tl.constexpr, WE: tl.constexpr, WM: tl.constexpr):
    """The WE/WM-format pattern (float64 (11, 52) in int64 or float32 (8, 23) in int32: `bits`' integer type) of the
    value whose E-exponent-bit, M-mantissa-bit pattern is `bits` (zero-extended; E <= WE, M < WM). Exact: normals and
    infinities/NaNs re-bias the exponent and shift the mantissa. A subnormal source of a narrower exponent (float16
    anywhere, bfloat16 and float32 into float64) is normal in the wide format: m is converted to the wide float
    exactly (m < 2^M) and its exponent lowered by BIAS + M - 1, an integer subtraction, so no subnormal is ever
    formed on the GPU; one of the wide format's exponent width (bfloat16 into float32) maps by the shift alone."""
    BIAS: tl.constexpr = (1 << (E - 1)) - 1
    WBIAS: tl.constexpr = (1 << (WE - 1)) - 1
    WTOP: tl.constexpr = (1 << WE) - 1
    sign = (bits >> (E + M)) & 1
    e = (bits >> M) & ((1 << E) - 1)
    m = bits & ((1 << M) - 1)
    frac = m << (WM - M)
    normal = (sign << (WE + WM)) | ((e + (WBIAS - BIAS)) << WM) | frac
    special = (sign << (WE + WM)) | (WTOP << WM) | frac
    if E == WE:
        sub = (sign << (WE + WM)) | frac
    else:
        if WM == 52:
            wide = m.to(tl.float64)
        else:
            wide = m.to(tl.float32)
        scaled = wide.to(bits.dtype, bitcast=True) - ((BIAS + M - 1) << WM)
        sub = (sign << (WE + WM)) | tl.where(m == 0, 0, scaled)
    return tl.where(e == 0, sub, tl.where(e == (1 << E) - 1, special, normal))


@jit
def _round_bits(bits, E: tl.constexpr, M: tl.constexpr, WE: tl.constexpr, WM: tl.constexpr):
    """The E/M-format pattern (zero-extended, of `bits`' integer type) nearest the value whose WE/WM-format pattern
    is `bits`: float64 (11, 52) in int64 or float32 (8, 23) in int32. Round to nearest, ties to even; overflow to
    infinity; results below the normal range are the format's subnormals (or zero); NaN stays a (quiet) NaN with the
    top of its payload. Integer arithmetic only.

    The significand (WM + 1 bits with the implicit one) is shifted right by the bits the target lacks (more for a
    subnormal result), rounded on the shifted-out remainder, then added to the exponent field: a round-up that
    carries into the next binade, or past the largest finite value into infinity, is the carry itself."""
    BIAS: tl.constexpr = (1 << (E - 1)) - 1
    INF: tl.constexpr = ((1 << E) - 1) << M
    WBIAS: tl.constexpr = (1 << (WE - 1)) - 1
    WTOP: tl.constexpr = (1 << WE) - 1
    # sig < 2^(WM + 1): a shift past WM + 2 leaves 0 and a remainder below half; the cap keeps `one << shift` in range
    CAP: tl.constexpr = WE + WM - 1
    sign = (bits >> (WE + WM)) & 1
    ew = (bits >> WM) & WTOP
    mw = bits & ((1 << WM) - 1)
    one = mw * 0 + 1  # a one of the tile's shape and type: shifts by tensor amounts need one type on both sides
    sig = tl.where(ew == 0, mw, mw | (one << WM))
    te = tl.where(ew == 0, 1, ew) - (WBIAS - BIAS)  # the target's biased exponent, <= 0 below its normals
    shift = (WM - M) + tl.where(te < 1, 1 - te, 0)
    shift = tl.minimum(shift, CAP)
    q = sig >> shift
    rem = sig & ((one << shift) - 1)
    half = one << (shift - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(bits.dtype)
    mag = tl.where(te < 1, q, ((te - 1) << M) + q)
    mag = tl.minimum(mag, INF)
    nan = (INF | (1 << (M - 1))) | (mw >> (WM - M))
    mag = tl.where(ew == WTOP, tl.where(mw == 0, INF, nan), mag)
    return (sign << (E + M)) | mag


@jit
def _cast_kernel(
    x_ptr,
    y_ptr,
    n,
    SRC_E: tl.constexpr,
    SRC_M: tl.constexpr,
    DST_E: tl.constexpr,
    DST_M: tl.constexpr,
    WIDE_E: tl.constexpr,
    WIDE_M: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """y = x converted between float formats, on the bits: x_ptr and y_ptr are the tensors' storage read as integers
    (int16 for float16/bfloat16, int32 for float32, int64 for float64), n contiguous elements, BLOCK per program.
    SRC_E/SRC_M, DST_E/DST_M: exponent and mantissa bits of the source and target formats. The value passes through
    the wide format WIDE_E/WIDE_M (`cast_launches`): float32's pattern in int32 between formats of at most 32 bits,
    float64's in int64 with float64 on either side (the H200 ran float16 -> float32 at a third of its copy bandwidth
    when every pair went through int64)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    raw = tl.load(x_ptr + offs, mask=ok, other=0)
    if WIDE_M == 52:
        raw = raw.to(tl.int64)
    else:
        raw = raw.to(tl.int32)
    if SRC_M == WIDE_M:
        wide = raw
    else:
        wide = _widen_bits(raw & ((1 << (1 + SRC_E + SRC_M)) - 1), SRC_E, SRC_M, WIDE_E, WIDE_M)
    if DST_M == WIDE_M:
        out = wide
    else:
        out = _round_bits(wide, DST_E, DST_M, WIDE_E, WIDE_M)
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=ok)


@jit
def _token_index(idx_ptr, tok, tok_ok, bound, fault_ptr, SITE: tl.constexpr):
    """(idx[tok] as int64, whether it is outside [0, bound)) for a token of the program (`tok_ok`: it exists); a bad
    index is recorded at fault_ptr as fault SITE (`nbxcert.kernels.faults`)."""
    idx = tl.load(idx_ptr + tok, mask=tok_ok, other=0).to(tl.int64)
    bad = tok_ok & ((idx < 0) | (idx >= bound))
    record_fault(fault_ptr, SITE, tok, idx, bound, bad)
    return idx, bad


@jit
def _rotate_heads(
    x_ptr,
    pos_ptr,
    cache_ptr,
    fault_ptr,
    pid_t,
    pid_h,
    n_tokens,
    n_heads,
    tok_stride,
    head_stride,
    cache_stride,
    max_position,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    NEOX: tl.constexpr,
    TOKENS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Rotate, in place, heads [pid_h BLOCK_H, (pid_h + 1) BLOCK_H) of tokens [pid_t TOKENS, (pid_t + 1) TOKENS) of x
    [n_tokens, n_heads, head_dim] (tokens `tok_stride` and heads `head_stride` elements apart, head dims contiguous):
    see `_rope_kernel`."""
    heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    i_ok = i < HALF
    if NEOX:
        d1 = i
        d2 = i + HALF
    else:
        d1 = 2 * i
        d2 = 2 * i + 1
    for t in range(TOKENS):
        tok = pid_t * TOKENS + t
        tok_ok = tok < n_tokens
        pos, bad = _token_index(pos_ptr, tok, tok_ok, max_position, fault_ptr, 2)
        tok_ok = tok_ok & (bad == 0)
        cs = cache_ptr + pos * cache_stride
        cos = tl.load(cs + i, mask=both(i_ok, tok_ok), other=0.0).to(CDT)[None, :]
        sin = tl.load(cs + HALF + i, mask=both(i_ok, tok_ok), other=0.0).to(CDT)[None, :]
        base = x_ptr + tok * tok_stride + heads[:, None].to(tl.int64) * head_stride
        ok = both((heads[:, None] < n_heads) & i_ok[None, :], tok_ok)
        x1 = tl.load(base + d1[None, :], mask=ok, other=0.0).to(CDT)
        x2 = tl.load(base + d2[None, :], mask=ok, other=0.0).to(CDT)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        tl.store(base + d1[None, :], narrow(y1, x_ptr.dtype.element_ty, UPCAST), mask=ok)
        tl.store(base + d2[None, :], narrow(y2, x_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cache_ptr,
    fault_ptr,
    n_tokens,
    n_heads,
    n_kv_heads,
    q_tok_stride,
    q_head_stride,
    k_tok_stride,
    k_head_stride,
    cache_stride,
    max_position,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    NEOX: tl.constexpr,
    TOKENS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Rotate q [n_tokens, n_heads, head_dim] and k [n_tokens, n_kv_heads, head_dim] in place, in one launch: for
    token t at position p = pos[t] and frequency i < HALF, the pair (x1, x2) becomes (x1 cos - x2 sin, x2 cos + x1 sin)
    with cos = cache[p, i], sin = cache[p, HALF + i].

    q_ptr, k_ptr: tokens `*_tok_stride` and heads `*_head_stride` elements apart, head dims contiguous. pos_ptr:
    [n_tokens] integer positions. cache_ptr: [max_position, 2 HALF] float32, rows `cache_stride` apart. A position
    outside [0, max_position) is recorded at fault_ptr (`nbxcert.kernels.faults`) and its token left as it was. NEOX:
    pairs (i, i + HALF) (GPT-NeoX, Llama); else pairs (2i, 2i + 1) (GPT-J). Head dims past 2 HALF are neither read nor
    written. Grid (cdiv(n_tokens, TOKENS), cdiv(n_heads, BLOCK_H) + cdiv(n_kv_heads, BLOCK_H)): the first head blocks
    are q's, the rest k's (one launch: a served call's host time is the driver's per launch). BLOCK_HALF: a power of
    two >= HALF. CDT: compute type. UPCAST: interpreter backend."""
    pid_t = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    q_blocks = tl.cdiv(n_heads, BLOCK_H)
    if pid_h < q_blocks:
        _rotate_heads(
            q_ptr,
            pos_ptr,
            cache_ptr,
            fault_ptr,
            pid_t,
            pid_h,
            n_tokens,
            n_heads,
            q_tok_stride,
            q_head_stride,
            cache_stride,
            max_position,
            HALF,
            BLOCK_HALF,
            NEOX,
            TOKENS,
            BLOCK_H,
            CDT,
            UPCAST,
        )
    else:
        _rotate_heads(
            k_ptr,
            pos_ptr,
            cache_ptr,
            fault_ptr,
            pid_t,
            pid_h - q_blocks,
            n_tokens,
            n_kv_heads,
            k_tok_stride,
            k_head_stride,
            cache_stride,
            max_position,
            HALF,
            BLOCK_HALF,
            NEOX,
            TOKENS,
            BLOCK_H,
            CDT,
            UPCAST,
        )


@jit
def _embedding_kernel(
    table_ptr,
    ids_ptr,
    out_ptr,
    fault_ptr,
    n_tokens,
    dim,
    table_stride,
    out_stride,
    vocab,
    TOKENS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out[t, :] = table[ids[t], :] (a copy of the bits).

    table_ptr: [vocab, dim], rows `table_stride` apart; ids_ptr: [n_tokens] int32/int64 ids; out_ptr: [n_tokens,
    dim], rows `out_stride` apart. An id outside [0, vocab) is recorded at fault_ptr (`nbxcert.kernels.faults`) and
    its row of out is zeros. Grid (cdiv(n_tokens, TOKENS), cdiv(dim, BLOCK_D))."""
    pid_t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c_ok = cols < dim
    for t in range(TOKENS):
        tok = pid_t * TOKENS + t
        tok_ok = tok < n_tokens
        idx, bad = _token_index(ids_ptr, tok, tok_ok, vocab, fault_ptr, 1)
        v = tl.load(table_ptr + idx * table_stride + cols, mask=both(c_ok, tok_ok & (bad == 0)), other=0)
        tl.store(out_ptr + tok * out_stride + cols, v, mask=both(c_ok, tok_ok))


@jit
def _gelu_and_mul_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    d,
    x_row_stride,
    y_row_stride,
    TANH: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """GeGLU: y[r, c] = gelu(x[r, c]) * x[r, d + c] for c < d, gelu as `_gelu_kernel` computes it (TANH: the tanh
    form, Gemma's `gelu_pytorch_tanh`; else the erf form).

    x_ptr: [n_rows, 2d], rows `x_row_stride` apart; y_ptr: [n_rows, d], rows `y_row_stride` apart; columns contiguous.
    Grid (cdiv(n_rows, ROWS), cdiv(d, BLOCK)): ROWS rows x BLOCK columns per program. CDT: compute type. UPCAST:
    interpreter backend (bfloat16 rounding, `narrow`). Placed after the other kernels of this module: Triton's key of
    a kernel holds its line, so a kernel added above would change the compiled kernels shipped in bundles."""
    pid_r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    c_ok = cols < d
    for r in range(ROWS):
        row = pid_r * ROWS + r
        ok = both(c_ok, row < n_rows)
        a = tl.load(x_ptr + row * x_row_stride + cols, mask=ok, other=0.0).to(CDT)
        b = tl.load(x_ptr + row * x_row_stride + d + cols, mask=ok, other=0.0).to(CDT)
        if TANH:
            t = _c(SQRT_2_OVER_PI, CDT) * (a + _c(GELU_TANH_C, CDT) * a * a * a)
            g = a / (1.0 + tl.exp(-2.0 * t))
        else:
            g = 0.5 * a * (1.0 + tl.math.erf(a * _c(INV_SQRT2, CDT)))
        tl.store(y_ptr + row * y_row_stride + cols, narrow(g * b, y_ptr.dtype.element_ty, UPCAST), mask=ok)


# --- configs: named factories -----------------------------------------------------------------------------------------
def flat_config(block: int, num_warps: int) -> Config:
    """A flat element-wise config: BLOCK elements per program."""
    return Config.make(num_warps=num_warps, num_stages=1, BLOCK=block)


def flat_candidates() -> tuple[Config, ...]:
    """BLOCK {512, 1024, 2048, 4096} x warps {4, 8}."""
    return tuple(flat_config(b, w) for b in (512, 1024, 2048, 4096) for w in (4, 8))


def rows_config(rows: int, block: int, num_warps: int) -> Config:
    """silu_and_mul: ROWS rows x BLOCK output columns per program."""
    return Config.make(num_warps=num_warps, num_stages=1, ROWS=rows, BLOCK=block)


def silu_candidates() -> tuple[Config, ...]:
    """ROWS {1, 4} x (BLOCK, warps) {(256, 2), (512, 4), (1024, 4), (2048, 8)}."""
    return tuple(rows_config(r, b, w) for r in (1, 4) for b, w in ((256, 2), (512, 4), (1024, 4), (2048, 8)))


def rope_config(tokens: int, block_h: int, num_warps: int) -> Config:
    """rope: TOKENS tokens x BLOCK_H heads per program."""
    return Config.make(num_warps=num_warps, num_stages=1, TOKENS=tokens, BLOCK_H=block_h)


def rope_candidates() -> tuple[Config, ...]:
    """TOKENS {1, 4} x BLOCK_H {1, 4, 16} x warps {1, 2, 4}."""
    return tuple(rope_config(t, h, w) for t in (1, 4) for h in (1, 4, 16) for w in (1, 2, 4))


def embedding_config(tokens: int, block_d: int, num_warps: int) -> Config:
    """embedding: TOKENS tokens x BLOCK_D columns per program."""
    return Config.make(num_warps=num_warps, num_stages=1, TOKENS=tokens, BLOCK_D=block_d)


def embedding_candidates() -> tuple[Config, ...]:
    """TOKENS {1, 4} x (BLOCK_D, warps) {(128, 1), (128, 4), (512, 2), (512, 4), (2048, 4), (2048, 8)}."""
    pairs = ((128, 1), (128, 4), (512, 2), (512, 4), (2048, 4), (2048, 8))
    return tuple(embedding_config(t, b, w) for t in (1, 4) for b, w in pairs)


FLAT_DEFAULT = flat_config(1024, 4)
SILU_DEFAULT = rows_config(1, 1024, 4)
ROPE_DEFAULT = rope_config(1, 4, 1)  # one warp: kept however few frequencies rot_dim has
EMBEDDING_DEFAULT = embedding_config(1, 512, 4)

# 32-bit registers per tile element live at the peak (float32 path), counted from the kernels: flat kernels: the
# inputs, the result and the int64 offsets (2); rope: x1, x2, their two results, the offsets d1/d2.
FLAT_REGS = 5
ROPE_REGS = 6


# --- prune: device facts only -----------------------------------------------------------------------------------------
def _tile_check(block: int, regs: int, profile, what: str):
    def check(c: Config) -> str | None:
        b = block(c)
        return lanes_refusal(b, c, profile, what) or registers_refusal(b, regs, c, profile, f"a {what} of {b}")

    return check


def prune_flat(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse flat configs whose BLOCK is smaller than the block's lanes or over its registers, or whose layout
    conversion would not fit shared memory: Triton stages at most one int64 tile of BLOCK elements through it when the
    store's layout differs from the load's (the cast kernel's int64 bits: 4096 bytes at BLOCK 4096 for sm_90)."""
    return prune_with(
        candidates,
        profile,
        lambda c: shared_memory_refusal(8 * c["BLOCK"], profile),
        _tile_check(lambda c: c["BLOCK"], FLAT_REGS, profile, "tile"),
    )


def rope_block_half(rot_dim: int) -> int:
    """The power-of-two tile that covers rot_dim / 2 frequencies."""
    return next_power_of_2(max(1, int(rot_dim) // 2))


def prune_rope(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse rope configs whose BLOCK_H x rot_dim/2 tile is smaller than the block's lanes or over its registers."""
    half = rope_block_half(problem["rot_dim"])
    return prune_with(candidates, profile, _tile_check(lambda c: c["BLOCK_H"] * half, ROPE_REGS, profile, "head tile"))


def prune_embedding(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse embedding configs whose BLOCK_D is smaller than the block's lanes."""
    return prune_with(candidates, profile, _tile_check(lambda c: c["BLOCK_D"], 2, profile, "column tile"))


# --- launches ---------------------------------------------------------------------------------------------------------
def _warps(config: Config) -> dict[str, int]:
    return {"num_warps": config.num_warps, "num_stages": config.num_stages}


def silu_and_mul_launches(config: Config, x: Tensor, y: Tensor) -> list[KernelLaunch]:
    """x [n_rows, 2d], y [n_rows, d] row views."""
    n_rows, d = y.shape
    if n_rows == 0 or d == 0:
        return []
    dtype_name = x.dtype.name

    def make() -> dict:
        kwargs = dict(ROWS=config["ROWS"], BLOCK=config["BLOCK"], CDT=compute_type(dtype_name), UPCAST=upcast())
        return dict(kwargs, **_warps(config))

    kwargs = constexprs((_silu_and_mul_kernel, config, dtype_name), make)
    args = (x, y, n_rows, d, x.stride(0), y.stride(0))
    return [KernelLaunch(_silu_and_mul_kernel, (cdiv(n_rows, kwargs["ROWS"]), cdiv(d, kwargs["BLOCK"])), args, kwargs)]


def gelu_and_mul_launches(config: Config, x: Tensor, y: Tensor, approximate: str) -> list[KernelLaunch]:
    """x [n_rows, 2d], y [n_rows, d] row views."""
    n_rows, d = y.shape
    if n_rows == 0 or d == 0:
        return []
    dtype_name = x.dtype.name

    def make() -> dict:
        kwargs = dict(ROWS=config["ROWS"], BLOCK=config["BLOCK"], CDT=compute_type(dtype_name), UPCAST=upcast())
        return dict(kwargs, TANH=approximate == "tanh", **_warps(config))

    kwargs = constexprs((_gelu_and_mul_kernel, config, dtype_name, approximate), make)
    args = (x, y, n_rows, d, x.stride(0), y.stride(0))
    grid = (cdiv(n_rows, kwargs["ROWS"]), cdiv(d, kwargs["BLOCK"]))
    return [KernelLaunch(_gelu_and_mul_kernel, grid, args, kwargs)]


def gelu_launches(config: Config, x: Tensor, y: Tensor, approximate: str) -> list[KernelLaunch]:
    """x, y contiguous with the same shape."""
    n = x.numel
    if n == 0:
        return []
    block = config["BLOCK"]
    kwargs = dict(TANH=approximate == "tanh", BLOCK=block, CDT=compute_type(x.dtype.name), UPCAST=upcast())
    return [KernelLaunch(_gelu_kernel, (cdiv(n, block),), (x, y, n), dict(kwargs, **_warps(config)))]


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy's broadcast of two shapes; `ShapeMismatch` when they do not broadcast."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b, strict=False):
        if x != y and 1 not in (x, y):
            raise ShapeMismatch(f"shapes {tuple(a)} and {tuple(b)} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def add_mul_launches(config: Config, a: Tensor, b: Tensor, out: Tensor, op: str) -> list[KernelLaunch]:
    """out (contiguous, the broadcast shape) = a op b, a and b read through their (broadcast) strides."""
    n = out.numel
    if n == 0:
        return []
    shape = out.shape
    sa, sb = broadcast_strides(a, shape), broadcast_strides(b, shape)
    sizes, (ma, mb) = merge_dims(shape, sa, sb)
    if len(sizes) > 4:
        raise LaunchError(f"add_mul: {len(sizes)} dimensions remain after merging contiguous ones; at most 4 are read")
    pad = 4 - len(sizes)
    sizes, ma, mb = [1] * pad + sizes, [0] * pad + ma, [0] * pad + mb
    dense = layout_of(a, shape) == "dense" and layout_of(b, shape) == "dense"
    block = config["BLOCK"]
    args = (a, b, out, n, sizes[1], sizes[2], sizes[3], *ma, *mb)
    kwargs = dict(MUL=op == "mul", DENSE=dense, BLOCK=block, CDT=compute_type(out.dtype.name), UPCAST=upcast())
    return [KernelLaunch(_add_mul_kernel, (cdiv(n, block),), args, dict(kwargs, **_warps(config)))]


def _bits_view(t: Tensor) -> Tensor:
    """The same storage, shape and strides read as the integer type of the float format's bits."""
    return Tensor(t.untyped_storage(), t.shape, t.strides, BITS_TYPE[t.dtype.name], t.storage_offset())


def cast_launches(config: Config, x: Tensor, y: Tensor) -> list[KernelLaunch]:
    """x, y contiguous with the same shape, float formats of `FORMATS`."""
    n = x.numel
    if n == 0:
        return []
    (se, sm), (de, dm) = FORMATS[x.dtype.name], FORMATS[y.dtype.name]
    we, wm = FORMATS["float64" if 52 in (sm, dm) else "float32"]
    block = config["BLOCK"]
    kwargs = dict(SRC_E=se, SRC_M=sm, DST_E=de, DST_M=dm, WIDE_E=we, WIDE_M=wm, BLOCK=block, **_warps(config))
    return [KernelLaunch(_cast_kernel, (cdiv(n, block),), (_bits_view(x), _bits_view(y), n), kwargs)]


def rope_launches(
    config: Config, q: Tensor, k: Tensor, positions: Tensor, cache: Tensor, rot_dim: int, style: str
) -> list[KernelLaunch]:
    """q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] (head dims contiguous), rotated in place by one
    launch."""
    tokens, block_h = config["TOKENS"], config["BLOCK_H"]
    half = rot_dim // 2
    n_tokens, n_heads, n_kv_heads = q.shape[0], q.shape[1], k.shape[1]
    if n_tokens == 0 or n_heads + n_kv_heads == 0 or half == 0:
        return []
    args = (q, k, positions, cache, faults.word(q.device), n_tokens, n_heads, n_kv_heads, q.stride(0), q.stride(1))
    args += (k.stride(0), k.stride(1), cache.stride(0), cache.shape[0])
    kwargs = dict(HALF=half, BLOCK_HALF=rope_block_half(rot_dim), NEOX=style == "neox", TOKENS=tokens)
    kwargs.update(BLOCK_H=block_h, CDT=compute_type(q.dtype.name), UPCAST=upcast(), **_warps(config))
    grid = (cdiv(n_tokens, tokens), cdiv(n_heads, block_h) + cdiv(n_kv_heads, block_h))
    return [KernelLaunch(_rope_kernel, grid, args, kwargs)]


def embedding_launches(config: Config, table: Tensor, ids: Tensor, out: Tensor) -> list[KernelLaunch]:
    """table [vocab, dim]; ids of any shape and out [*ids.shape, dim], both contiguous (the kernel reads them as
    [n_tokens] and [n_tokens, dim]); each id checked by the kernel."""
    n_tokens, dim = ids.numel, table.shape[1]
    if n_tokens == 0 or dim == 0:
        return []
    tokens, block_d = config["TOKENS"], config["BLOCK_D"]
    args = (table, ids, out, faults.word(out.device), n_tokens, dim, table.stride(0), dim, table.shape[0])
    kwargs = dict(TOKENS=tokens, BLOCK_D=block_d, **_warps(config))
    return [KernelLaunch(_embedding_kernel, (cdiv(n_tokens, tokens), cdiv(dim, block_d)), args, kwargs)]


# --- user-facing functions --------------------------------------------------------------------------------------------
def _float(name: str, t: Tensor, allowed: Sequence[str]) -> None:
    if t.dtype.name not in allowed:
        raise ShapeMismatch(f"{name} has dtype {t.dtype.name}; one of {', '.join(allowed)} is required")


def _contiguous_out(out: Tensor | None, shape, dtype, device, name: str) -> Tensor:
    if out is None:
        return empty(shape, dtype, device)
    if tuple(out.shape) != tuple(shape) or out.dtype is not get_dtype(dtype) or not out.is_contiguous():
        raise ShapeMismatch(f"{name}: out must be a contiguous {get_dtype(dtype).name}{list(shape)}")
    return out


def _rows_cols(shape) -> tuple[int, int]:
    n_cols = shape[-1] if len(shape) else 1
    return (math.prod(shape) // max(1, n_cols), n_cols)


def silu_and_mul_problem(x: Tensor, **_) -> dict:
    n_rows, n_cols = _rows_cols(x.shape)
    return {"n_rows": n_rows, "d": n_cols // 2}


@served
def silu_and_mul(x: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """silu(x[..., :d]) * x[..., d:] for x [..., 2d] -> [..., d]."""
    _float("silu_and_mul: x", x, HALF_AND_SINGLE)
    if x.shape[-1] % 2:
        raise ShapeMismatch(f"silu_and_mul: the last dimension {x.shape[-1]} is not even")
    d = x.shape[-1] // 2
    y = _contiguous_out(out, x.shape[:-1] + (d,), x.dtype, x.device, "silu_and_mul")
    rows_x, rows_y = as_rows(x, "silu_and_mul: x"), as_rows(y, "silu_and_mul: out")

    def run(c: Config) -> None:
        _run(silu_and_mul_launches(c, rows_x, rows_y))

    cfg = choose_config(SILU_AND_MUL, silu_and_mul_problem(x), (x.dtype.name,), config, run=run, outputs=(y,))
    _run(silu_and_mul_launches(cfg, rows_x, rows_y))
    return y


def gelu_and_mul_problem(x: Tensor, approximate: str = "tanh", **_) -> dict:
    return dict(silu_and_mul_problem(x), approximate=approximate)


@served
def gelu_and_mul(
    x: Tensor, approximate: str = "tanh", out: Tensor | None = None, config: Config | None = None
) -> Tensor:
    """GeGLU: gelu(x[..., :d]) * x[..., d:] for x [..., 2d] -> [..., d]; `approximate` "tanh" (Gemma's
    gelu_pytorch_tanh, the default) or "none" (the erf form)."""
    _float("gelu_and_mul: x", x, HALF_AND_SINGLE)
    if approximate not in ("none", "tanh"):
        raise LaunchError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    if x.shape[-1] % 2:
        raise ShapeMismatch(f"gelu_and_mul: the last dimension {x.shape[-1]} is not even")
    d = x.shape[-1] // 2
    y = _contiguous_out(out, x.shape[:-1] + (d,), x.dtype, x.device, "gelu_and_mul")
    rows_x, rows_y = as_rows(x, "gelu_and_mul: x"), as_rows(y, "gelu_and_mul: out")

    def run(c: Config) -> None:
        _run(gelu_and_mul_launches(c, rows_x, rows_y, approximate))

    problem = gelu_and_mul_problem(x, approximate)
    cfg = choose_config(GELU_AND_MUL, problem, (x.dtype.name,), config, run=run, outputs=(y,))
    _run(gelu_and_mul_launches(cfg, rows_x, rows_y, approximate))
    return y


def gelu_problem(x: Tensor, approximate: str = "none", **_) -> dict:
    n_rows, n_cols = _rows_cols(x.shape)
    return {"n_rows": n_rows, "n_cols": n_cols, "approximate": approximate}


@served
def gelu(x: Tensor, approximate: str = "none", out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """GELU of a contiguous x: approximate "none" (erf) or "tanh"."""
    _float("gelu: x", x, HALF_AND_SINGLE)
    if approximate not in ("none", "tanh"):
        raise LaunchError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    if not x.is_contiguous():
        raise LaunchError(f"gelu: x (strides {x.strides}) must be contiguous; call .contiguous() first")
    y = _contiguous_out(out, x.shape, x.dtype, x.device, "gelu")

    def run(c: Config) -> None:
        _run(gelu_launches(c, x, y, approximate))

    run(choose_config(GELU, gelu_problem(x, approximate), (x.dtype.name,), config, run=run, outputs=(y,)))
    return y


LAYOUTS = ("dense", "broadcast", "strided")


def layout_of(t: Tensor, shape: tuple[int, ...]) -> str:
    """How `t` reads into the broadcast `shape`: "dense" (contiguous, that very shape), "broadcast" (some dimension
    repeated by a 0 stride), "strided" (any other view)."""
    if tuple(t.shape) == tuple(shape) and t.is_contiguous():
        return "dense"
    sizes = (1,) * (len(shape) - t.ndim) + tuple(t.shape)
    if any(n_t == 1 and n != 1 for n_t, n in zip(sizes, shape, strict=False)) or any(
        s == 0 and n > 1 for s, n in zip(t.strides, t.shape, strict=False)
    ):
        return "broadcast"
    return "strided"


def add_mul_problem(a: Tensor, b: Tensor, op: str = "add", **_) -> dict:
    shape = broadcast_shape(a.shape, b.shape)
    n_rows, n_cols = _rows_cols(shape)
    return {
        "n_rows": n_rows,
        "n_cols": n_cols,
        "op": op,
        "a_layout": layout_of(a, shape),
        "b_layout": layout_of(b, shape),
    }


def _add_mul(a: Tensor, b: Tensor, op: str, out: Tensor | None, config: Config | None) -> Tensor:
    _float(f"{op}: a", a, CAST_DTYPES)
    if b.dtype is not a.dtype:
        raise ShapeMismatch(f"{op}: a is {a.dtype.name} but b is {b.dtype.name}; cast one first")
    shape = broadcast_shape(a.shape, b.shape)
    y = _contiguous_out(out, shape, a.dtype, a.device, op)

    def run(c: Config) -> None:
        _run(add_mul_launches(c, a, b, y, op))

    dtypes = (a.dtype.name, b.dtype.name)
    run(choose_config(ADD_MUL, add_mul_problem(a, b, op), dtypes, config, run=run, outputs=(y,)))
    return y


@served
def add(a: Tensor, b: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """a + b with numpy broadcasting; a and b any strides, one dtype; out contiguous."""
    return _add_mul(a, b, "add", out, config)


@served
def mul(a: Tensor, b: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """a * b with numpy broadcasting; a and b any strides, one dtype; out contiguous."""
    return _add_mul(a, b, "mul", out, config)


def cast_problem(x: Tensor, dtype: Any = None, **_) -> dict:
    n_rows, n_cols = _rows_cols(x.shape)
    return {"n_rows": n_rows, "n_cols": n_cols}


@served
def cast(x: Tensor, dtype, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """x converted to `dtype` (float16, bfloat16, float32, float64), round to nearest even; x contiguous."""
    target = get_dtype(dtype)
    _float("cast: x", x, CAST_DTYPES)
    if target.name not in CAST_DTYPES:
        raise ShapeMismatch(f"cast: target dtype {target.name} is not one of {', '.join(CAST_DTYPES)}")
    if not x.is_contiguous():
        raise LaunchError(f"cast: x (strides {x.strides}) must be contiguous; call .contiguous() first")
    y = _contiguous_out(out, x.shape, target, x.device, "cast")

    def run(c: Config) -> None:
        _run(cast_launches(c, x, y))

    run(choose_config(CAST, cast_problem(x), (x.dtype.name, target.name), config, run=run, outputs=(y,)))
    return y


def rope_problem(q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor, rot_dim=None, style="neox", **_):
    rot = int(rot_dim) if rot_dim is not None else int(q.shape[-1])
    return {
        "n_tokens": q.shape[0],
        "n_heads": q.shape[1],
        "n_kv_heads": k.shape[1],
        "head_dim": q.shape[2],
        "rot_dim": rot,
        "style": style,
    }


@served
def rope(
    q: Tensor,
    k: Tensor,
    positions: Tensor,
    cos_sin_cache: Tensor,
    rot_dim: int | None = None,
    style: str = "neox",
    config: Config | None = None,
) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim], IN PLACE, at `positions`
    [tokens] (int32/int64), with `cos_sin_cache` [max_position, rot_dim] float32 (cos then sin). `rot_dim` (default
    head_dim, even) dims rotate; the rest are untouched. Returns (q, k). A position outside [0, max_position) raises
    `LaunchError`: at once under the interpreter, at the first synchronisation after the launch on a GPU (the kernel
    checks each one; `nbxcert.kernels.faults`)."""
    _float("rope: q", q, HALF_AND_SINGLE)
    if k.dtype is not q.dtype or q.ndim != 3 or k.ndim != 3 or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ShapeMismatch(f"rope: q {q.dtype.name}{list(q.shape)} and k {k.dtype.name}{list(k.shape)} do not match")
    problem = rope_problem(q, k, positions, cos_sin_cache, rot_dim, style)
    rot = problem["rot_dim"]
    if style not in ("neox", "gptj"):
        raise LaunchError(f"rope: style must be 'neox' or 'gptj', got {style!r}")
    if rot % 2 or not 0 < rot <= q.shape[2]:
        raise LaunchError(f"rope: rot_dim {rot} must be even and within head_dim {q.shape[2]}")
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise LaunchError("rope: q and k need contiguous head dims")
    if cos_sin_cache.dtype.name != "float32" or cos_sin_cache.ndim != 2 or cos_sin_cache.shape[1] < rot:
        raise ShapeMismatch(f"rope: cos_sin_cache must be float32 [max_position, >= {rot}]")
    if cos_sin_cache.stride(1) != 1 or positions.shape != (q.shape[0],) or not positions.is_contiguous():
        raise ShapeMismatch("rope: cos_sin_cache rows must be contiguous and positions a contiguous [tokens] vector")
    if positions.dtype.name not in ("int32", "int64"):
        raise ShapeMismatch(f"rope: positions must be int32 or int64, got {positions.dtype.name}")

    def run(c: Config) -> None:
        _run(rope_launches(c, q, k, positions, cos_sin_cache, rot, style))

    # in place: a run-time sweep restores q and k before each candidate
    cfg = choose_config(ROPE, problem, (q.dtype.name,), config, run=run, outputs=(q, k), restore=(q, k))
    _run(rope_launches(cfg, q, k, positions, cos_sin_cache, rot, style))
    faults.after_launch(q.device)
    return q, k


def embedding_problem(table: Tensor, ids: Tensor, **_) -> dict:
    return {"n_tokens": ids.numel, "dim": table.shape[1]}


@served
def embedding(table: Tensor, ids: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """table[ids] for table [vocab, dim] (rows contiguous) and integer ids of any shape -> [*ids.shape, dim]. An id
    outside [0, vocab) raises `LaunchError` naming it and the table size: at once under the interpreter, at the
    first synchronisation after the launch on a GPU (the kernel checks each id; `nbxcert.kernels.faults`)."""
    _float("embedding: table", table, CAST_DTYPES)
    if ids.dtype.name not in ("int32", "int64"):
        raise ShapeMismatch(f"embedding: ids must be int32 or int64, got {ids.dtype.name}")
    if table.ndim != 2 or (table.shape[1] > 1 and table.stride(1) != 1):
        raise ShapeMismatch(f"embedding: table must be [vocab, dim] with contiguous rows, got {list(table.shape)}")
    y = _contiguous_out(out, ids.shape + (table.shape[1],), table.dtype, table.device, "embedding")
    ids = ids if ids.is_contiguous() else ids.contiguous()

    def run(c: Config) -> None:
        _run(embedding_launches(c, table, ids, y))

    dtypes = (table.dtype.name, ids.dtype.name)
    cfg = choose_config(EMBEDDING, embedding_problem(table, ids), dtypes, config, run=run, outputs=(y,))
    _run(embedding_launches(cfg, table, ids, y))
    faults.after_launch(table.device)
    return y


# --- inputs and oracle adapters ---------------------------------------------------------------------------------------
NORMAL_SCALE = 2.0  # "normal" test values: standard normal times this


def values_of(gen: np.random.Generator, shape, values: str, dtype: str) -> np.ndarray:
    """Float64 test values: "normal" (standard normal x 2); "large" (normal x 1e4 clipped to +-30000: near float16's
    top, with room for a sum of two or a rotation to stay below its 65504; silu/gelu of -1e4 underflow to an exact 0
    even in float64); "equal" (one repeated value)."""
    if values == "normal":
        return gen.standard_normal(shape) * NORMAL_SCALE
    if values == "large":
        return np.clip(gen.standard_normal(shape) * 1e4, -30000.0, 30000.0)
    if values == "equal":
        return np.full(shape, gen.standard_normal() * 3.0)
    raise ValueError(f"unknown values kind {values!r}")


def tensor_of(gen: np.random.Generator, shape, values: str, dtype: str, device: str) -> Tensor:
    """`values_of` as a tensor of `dtype` on `device` ("normal" drawn where it lies: `inputs.of_values`)."""
    return _inputs.of_values(gen, shape, values, dtype, device, values_of, NORMAL_SCALE)


def silu_inputs(problem, dtypes, seed, device, values: str = "normal") -> Inputs:
    """x [n_rows, 2d] of `values`; out [n_rows, d]. "large" keeps the gate large and the other half in [-1, 1], so
    the product stays inside float16's range."""
    n_rows, d = int(problem["n_rows"]), int(problem["d"])
    gen = _inputs.rng(seed)
    if values == "large":
        values_x = values_of(gen, (n_rows, 2 * d), values, dtypes[0])
        values_x[:, d:] = gen.uniform(-1.0, 1.0, (n_rows, d))
        x = from_numpy(values_x, dtypes[0], device)
    else:
        x = tensor_of(gen, (n_rows, 2 * d), values, dtypes[0], device)
    tensors = {"x": x, "y": empty((n_rows, d), dtypes[0], device)}
    return Inputs(tensors, {}, ("y",), dict(problem))


def _silu_launch(config: Config, inputs: Inputs) -> None:
    _run(silu_and_mul_launches(config, inputs.tensors["x"], inputs.tensors["y"]))


def _silu_oracle(inputs: Inputs) -> dict[str, Reference]:
    ref, err = _oracle.silu_and_mul(inputs.tensors["x"].float64())
    return {"y": Reference(ref, err)}


def gelu_and_mul_inputs(problem, dtypes, seed, device, values: str = "normal") -> Inputs:
    """`silu_inputs`' x and y; `approximate` from the problem."""
    inputs = silu_inputs(problem, dtypes, seed, device, values)
    inputs.scalars["approximate"] = str(problem["approximate"])
    return inputs


def _gelu_and_mul_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(gelu_and_mul_launches(config, t["x"], t["y"], inputs.scalars["approximate"]))


def _gelu_and_mul_oracle(inputs: Inputs) -> dict[str, Reference]:
    ref, err = _oracle.gelu_and_mul(inputs.tensors["x"].float64(), inputs.scalars["approximate"])
    return {"y": Reference(ref, err)}


def gelu_inputs(problem, dtypes, seed, device, values: str = "normal") -> Inputs:
    """x [n_rows, n_cols] of `values`; y alike."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    gen = _inputs.rng(seed)
    x = tensor_of(gen, (n_rows, n_cols), values, dtypes[0], device)
    tensors = {"x": x, "y": empty((n_rows, n_cols), dtypes[0], device)}
    return Inputs(tensors, {"approximate": str(problem["approximate"])}, ("y",), dict(problem))


def _gelu_launch(config: Config, inputs: Inputs) -> None:
    _run(gelu_launches(config, inputs.tensors["x"], inputs.tensors["y"], inputs.scalars["approximate"]))


def _gelu_oracle(inputs: Inputs) -> dict[str, Reference]:
    ref, err = _oracle.gelu(inputs.tensors["x"].float64(), inputs.scalars["approximate"])
    return {"y": Reference(ref, err)}


def layout_operand(gen, n_rows: int, n_cols: int, layout: str, dtype: str, device: str, values: str) -> Tensor:
    """An operand that reads into [n_rows, n_cols] as `layout`: "dense" (contiguous); "broadcast" (a [n_cols] row
    vector, repeated over the rows by a 0 stride); "strided" (the transpose of a contiguous [n_cols, n_rows])."""
    if layout == "dense":
        return tensor_of(gen, (n_rows, n_cols), values, dtype, device)
    if layout == "broadcast":
        return tensor_of(gen, (n_cols,), values, dtype, device)
    if layout == "strided":
        return tensor_of(gen, (n_cols, n_rows), values, dtype, device).T
    raise ValueError(f"unknown layout {layout!r}")


def add_mul_inputs(problem, dtypes, seed, device, values: str = "normal") -> Inputs:
    """a and b laid out as the problem says (`layout_operand`); out [n_rows, n_cols] contiguous."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    gen = _inputs.rng(seed)
    a = layout_operand(gen, n_rows, n_cols, str(problem["a_layout"]), dtypes[0], device, values)
    b = layout_operand(gen, n_rows, n_cols, str(problem["b_layout"]), dtypes[1], device, values)
    tensors = {"a": a, "b": b, "out": empty((n_rows, n_cols), dtypes[0], device)}
    return Inputs(tensors, {"op": str(problem["op"])}, ("out",), dict(problem))


def _add_mul_launch(config: Config, inputs: Inputs) -> None:
    t = inputs.tensors
    _run(add_mul_launches(config, t["a"], t["b"], t["out"], inputs.scalars["op"]))


def _add_mul_oracle(inputs: Inputs) -> dict[str, Reference]:
    t = inputs.tensors
    fn = _oracle.mul if inputs.scalars["op"] == "mul" else _oracle.add
    ref, err = fn(t["a"].float64(), t["b"].float64())
    return {"out": Reference(np.broadcast_to(ref, t["out"].shape), np.broadcast_to(err, t["out"].shape))}


def cast_values(gen: np.random.Generator, n: int, values: str) -> np.ndarray:
    """Values for casts. "normal": normal values over magnitudes 2^-20 .. 2^14 (inside every target's normal range,
    away from float16's subnormals); "extreme": random float64 bit patterns, ties of every target, subnormals of
    every format, values past every range, infinities and NaNs."""
    if values == "normal":
        return gen.standard_normal(n) * np.exp2(gen.integers(-20, 15, n))
    if values != "extreme":
        raise ValueError(f"unknown values kind {values!r}")
    bits = gen.integers(0, 2**63, n // 4, dtype=np.int64) * np.where(gen.random(n // 4) < 0.5, 1, -1)
    parts = [bits.astype(np.int64).view(np.float64)]
    mags = np.exp2(gen.uniform(-160, 140, n // 4)) * np.where(gen.random(n // 4) < 0.5, 1.0, -1.0)
    parts.append(mags)
    # exact ties of each target: a representable value plus half its ulp, at random binades
    for m, lo, hi in ((10, -24, 15), (7, -133, 127), (23, -149, 127)):
        k = n // 16
        e = gen.integers(lo, hi, k).astype(np.float64)
        odd = gen.integers(0, 2**m, k).astype(np.float64)
        base = (2.0**m + odd) * np.exp2(e - m)
        parts.append(base + np.exp2(e - m - 1))
    # subnormals of each format (float64's included: random bit patterns almost never are)
    for m, min_exp in ((10, -24), (7, -133), (23, -149), (52, -1074)):
        k = n // 32
        parts.append(gen.integers(1, 2**m, k).astype(np.float64) * 2.0**min_exp * np.where(gen.random(k) < 0.5, 1, -1))
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 2.0**-24, 2.0**-25, 2.0**-26]
    specials += [float.fromhex("0x1.fep127"), 3.4028235677973366e38, 2.0**-149, 2.0**-150, 2.0**-133, 1e-320]
    parts.append(np.array(specials))
    out = np.concatenate(parts)
    return np.concatenate([out, np.full(max(0, n - out.size), 1.0)])[: max(n, out.size)]


def cast_inputs(problem, dtypes, seed, device, values: str = "normal") -> Inputs:
    """x [n_rows, n_cols] of dtypes[0] from `cast_values` (rounded once into the source dtype); y of dtypes[1]."""
    n_rows, n_cols = int(problem["n_rows"]), int(problem["n_cols"])
    gen = _inputs.rng(seed)
    raw = cast_values(gen, n_rows * n_cols, values)[: n_rows * n_cols]
    if values == "extreme":
        raw = raw[gen.permutation(raw.size)]
    with np.errstate(over="ignore", invalid="ignore"):
        x = from_numpy(raw.reshape(n_rows, n_cols), dtypes[0], device)
    tensors = {"x": x, "y": empty((n_rows, n_cols), dtypes[1], device)}
    return Inputs(tensors, {"target": dtypes[1]}, ("y",), dict(problem))


def _cast_launch(config: Config, inputs: Inputs) -> None:
    _run(cast_launches(config, inputs.tensors["x"], inputs.tensors["y"]))


def _cast_oracle(inputs: Inputs) -> dict[str, Reference]:
    ref, err = _oracle.cast(inputs.tensors["x"].float64(), inputs.scalars["target"])
    return {"y": Reference(ref, err)}


ROPE_MAX_POSITION = 4096
ROPE_BASE = 10000.0


_ROPE_CACHES: dict[tuple, np.ndarray] = {}


def rope_cache(rot_dim: int, max_position: int = ROPE_MAX_POSITION, base: float = ROPE_BASE) -> np.ndarray:
    """The usual cos/sin cache [max_position, rot_dim]: frequency i is base^(-2i / rot_dim) (float64 values; stored
    as float32). Made once a process for each (rot_dim, max_position, base), as a model makes its own once (every
    rope key's inputs take one: 40 of them were 0.47 s of a cold start under cProfile on an H200's host); read-only."""
    found = _ROPE_CACHES.get((rot_dim, max_position, base))
    if found is None:
        inv_freq = base ** (-np.arange(0, rot_dim, 2) / rot_dim)
        angles = np.arange(max_position)[:, None] * inv_freq[None, :]
        found = np.concatenate([np.cos(angles), np.sin(angles)], axis=1)
        found.flags.writeable = False
        _ROPE_CACHES[rot_dim, max_position, base] = found
    return found


def rope_inputs(problem, dtypes, seed, device, values: str = "normal") -> Inputs:
    """q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] as views of one fused qkv buffer (token stride
    (heads + 2 kv_heads) head_dim, as vLLM's q/k slices are); random positions < 4096; the float32 cache."""
    t, h, kh = int(problem["n_tokens"]), int(problem["n_heads"]), int(problem["n_kv_heads"])
    d, rot = int(problem["head_dim"]), int(problem["rot_dim"])
    gen = _inputs.rng(seed)
    qkv = tensor_of(gen, (t, (h + 2 * kh) * d), values, dtypes[0], device)
    q = qkv[:, : h * d].view(t, h, d) if t else empty((0, h, d), dtypes[0], device)
    k = qkv[:, h * d : (h + kh) * d].view(t, kh, d) if t else empty((0, kh, d), dtypes[0], device)
    positions = from_numpy(gen.integers(0, ROPE_MAX_POSITION, t).astype(np.int64), "int64", device)
    cache = from_numpy(rope_cache(rot), "float32", device)
    tensors = {"q": q, "k": k, "positions": positions, "cache": cache}
    return Inputs(tensors, {"rot_dim": rot, "style": str(problem["style"])}, ("q", "k"), dict(problem), ("q", "k"))


def _rope_launch(config: Config, inputs: Inputs) -> None:
    # No check of the positions here: `rope_inputs` draws them in range, and the sweep times this launch (a host
    # read of the positions would wait for the device in every timed repetition). `rope` checks a caller's.
    t, s = inputs.tensors, inputs.scalars
    _run(rope_launches(config, t["q"], t["k"], t["positions"], t["cache"], s["rot_dim"], s["style"]))


def _rope_oracle(inputs: Inputs) -> dict[str, Reference]:
    t, s = inputs.tensors, inputs.scalars
    pos, cache = t["positions"].numpy(), t["cache"].float64()
    refs = {}
    for name in ("q", "k"):
        ref, err = _oracle.rope(t[name].float64(), pos, cache, s["rot_dim"], s["style"])
        refs[name] = Reference(ref, err)
    return refs


EMBEDDING_VOCAB = 1000


def embedding_inputs(problem, dtypes, seed, device, values: str = "normal", vocab: int = EMBEDDING_VOCAB) -> Inputs:
    """table [vocab, dim] of `values`; ids [n_tokens] uniform in [0, vocab) (the last id is vocab - 1, the first 0,
    so both ends of the table are read); out [n_tokens, dim]."""
    n, dim = int(problem["n_tokens"]), int(problem["dim"])
    gen = _inputs.rng(seed)
    table = tensor_of(gen, (vocab, dim), values, dtypes[0], device)
    ids = gen.integers(0, vocab, n)
    if n:
        ids[0], ids[-1] = 0, vocab - 1
    tensors = {"table": table, "ids": from_numpy(ids.astype(dtypes[1]), dtypes[1], device)}
    tensors["out"] = empty((n, dim), dtypes[0], device)
    return Inputs(tensors, {}, ("out",), dict(problem))


def _embedding_launch(config: Config, inputs: Inputs) -> None:
    # No check of the ids here: the inputs draw them in range, and the sweep times this launch (a host read of the ids
    # would wait for the device in every timed repetition). `embedding` checks a caller's.
    t = inputs.tensors
    _run(embedding_launches(config, t["table"], t["ids"], t["out"]))


def _embedding_oracle(inputs: Inputs) -> dict[str, Reference]:
    t = inputs.tensors
    ref, err = _oracle.embedding(t["table"].float64(), t["ids"].numpy())
    return {"out": Reference(ref, err)}


def _first(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0],)


def _second(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[1],)


def _twice(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0], dtypes[0])


# --- specs ------------------------------------------------------------------------------------------------------------
FLAT_NO_BIT = ("BLOCK", "num_warps")
ROW_KEY = (KeyField("n_rows", "rows"), KeyField("n_cols"))

# the gated MLPs (silu_and_mul, gelu_and_mul) share their candidates, prune and no-bit claim
SILU_AND_MUL_TUNING = (
    silu_candidates(),
    SILU_DEFAULT,
    lambda cands, problem, profile: prune_with(
        cands, profile, _tile_check(lambda c: c["BLOCK"], FLAT_REGS, profile, "column tile")
    ),
)

SILU_AND_MUL = family_spec(
    "elementwise",
    "silu_and_mul",
    "SwiGLU: silu(x[..., :d]) * x[..., d:]",
    (_silu_and_mul_kernel,),
    problem_args=("n_rows", "d"),
    key_fields=(KeyField("n_rows", "tokens"), KeyField("d")),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in HALF_AND_SINGLE),
    output_dtypes=_first,
    tuning=SILU_AND_MUL_TUNING,
    parts=(silu_inputs, _silu_launch, _silu_oracle, silu_and_mul_problem),
    no_bit_fields=("ROWS", "BLOCK", "num_warps"),
    examples=({"n_rows": 7, "d": 300}, {"n_rows": 1, "d": 1}, {"n_rows": 3, "d": 2500}),
)

GELU_AND_MUL = family_spec(
    "elementwise",
    "gelu_and_mul",
    "GeGLU: gelu(x[..., :d]) * x[..., d:], tanh (Gemma) or erf form",
    (_gelu_and_mul_kernel,),
    problem_args=("n_rows", "d", "approximate"),
    key_fields=(KeyField("n_rows", "tokens"), KeyField("d"), KeyField("approximate")),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in HALF_AND_SINGLE),
    output_dtypes=_first,
    tuning=SILU_AND_MUL_TUNING,
    parts=(gelu_and_mul_inputs, _gelu_and_mul_launch, _gelu_and_mul_oracle, gelu_and_mul_problem),
    no_bit_fields=("ROWS", "BLOCK", "num_warps"),
    examples=tuple({"n_rows": r, "d": d, "approximate": a} for r, d in ((7, 300), (1, 1)) for a in ("tanh", "none")),
)


# the flat specs (gelu, add_mul, cast) share their candidates, prune and no-bit claim
FLAT_TUNING = (flat_candidates(), FLAT_DEFAULT, prune_flat)

GELU = family_spec(
    "elementwise",
    "gelu",
    "GELU, erf form (approximate=none) or tanh form (approximate=tanh)",
    (_gelu_kernel,),
    problem_args=("n_rows", "n_cols", "approximate"),
    key_fields=ROW_KEY + (KeyField("approximate"),),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in HALF_AND_SINGLE),
    output_dtypes=_first,
    tuning=FLAT_TUNING,
    parts=(gelu_inputs, _gelu_launch, _gelu_oracle, gelu_problem),
    no_bit_fields=FLAT_NO_BIT,
    examples=tuple(
        {"n_rows": r, "n_cols": c, "approximate": a} for r, c in ((7, 300), (1, 1), (3, 2500)) for a in ("none", "tanh")
    ),
)
ADD_MUL = family_spec(
    "elementwise",
    "add_mul",
    "a + b or a * b (op) with broadcasting over strided inputs",
    (_add_mul_kernel,),
    problem_args=("n_rows", "n_cols", "op", "a_layout", "b_layout"),
    key_fields=ROW_KEY + (KeyField("op"), KeyField("a_layout"), KeyField("b_layout")),
    dtype_args=("a", "b"),
    dtypes=tuple((d, d) for d in CAST_DTYPES),
    output_dtypes=_first,
    tuning=FLAT_TUNING,
    parts=(add_mul_inputs, _add_mul_launch, _add_mul_oracle, add_mul_problem),
    no_bit_fields=FLAT_NO_BIT,
    examples=tuple(
        {"n_rows": r, "n_cols": c, "op": op, "a_layout": la, "b_layout": lb}
        for r, c in ((7, 300), (1, 1))
        for op in ("add", "mul")
        for la, lb in (("dense", "dense"), ("strided", "broadcast"))
    ),
    oracle_name="nbxcert.oracles.elementwise.add / mul",
)
CAST = family_spec(
    "elementwise",
    "cast",
    "float16/bfloat16/float32/float64 to any of them, round to nearest even, on the bits",
    (_cast_kernel,),
    problem_args=("n_rows", "n_cols"),
    key_fields=ROW_KEY,
    dtype_args=("x", "y"),
    dtypes=tuple((s, d) for s in CAST_DTYPES for d in CAST_DTYPES),
    output_dtypes=_second,
    tuning=FLAT_TUNING,
    parts=(cast_inputs, _cast_launch, _cast_oracle, cast_problem),
    no_bit_fields=FLAT_NO_BIT,
    examples=({"n_rows": 7, "n_cols": 300}, {"n_rows": 1, "n_cols": 1}),
)

ROPE = family_spec(
    "elementwise",
    "rope",
    "rotary embedding of q and k in place: neox / gptj pairs, partial rotary dims, per-token positions",
    (_rope_kernel,),
    problem_args=("n_tokens", "n_heads", "n_kv_heads", "head_dim", "rot_dim", "style"),
    key_fields=(
        KeyField("n_tokens", "tokens"),
        KeyField("n_heads"),
        KeyField("n_kv_heads"),
        KeyField("head_dim"),
        KeyField("rot_dim"),
        KeyField("style"),
    ),
    dtype_args=("q",),
    dtypes=tuple((d,) for d in HALF_AND_SINGLE),
    output_dtypes=_twice,
    tuning=(rope_candidates(), ROPE_DEFAULT, prune_rope),
    parts=(rope_inputs, _rope_launch, _rope_oracle, rope_problem),
    no_bit_fields=("TOKENS", "BLOCK_H", "num_warps"),
    examples=tuple(
        {"n_tokens": t, "n_heads": 5, "n_kv_heads": 1, "head_dim": 80, "rot_dim": r, "style": s}
        for t, r in ((7, 80), (1, 32))
        for s in ("neox", "gptj")
    ),
)

EMBEDDING = family_spec(
    "elementwise",
    "embedding",
    "row gather by token id; ids out of range refused before the launch",
    (_embedding_kernel,),
    problem_args=("n_tokens", "dim"),
    key_fields=(KeyField("n_tokens", "tokens"), KeyField("dim")),
    dtype_args=("table", "ids"),
    dtypes=tuple((d, i) for d in HALF_AND_SINGLE for i in ("int32", "int64")),
    output_dtypes=_first,
    tuning=(embedding_candidates(), EMBEDDING_DEFAULT, prune_embedding),
    parts=(embedding_inputs, _embedding_launch, _embedding_oracle, embedding_problem),
    no_bit_fields=("TOKENS", "BLOCK_D", "num_warps"),
    examples=({"n_tokens": 7, "dim": 300}, {"n_tokens": 1, "dim": 1}),
)

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
