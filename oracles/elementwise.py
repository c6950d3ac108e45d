"""Float64 references for the element-wise kernels, and the float64 transcendental functions every oracle uses.

Pure numpy (and the C library's `erf` through `math`), written from the definitions; nothing here is shared with the
kernels it judges. Each kernel oracle returns `(reference, error scale)` as float64 arrays (a dict of them where a
kernel has several outputs).

The transcendental functions (`exp`, `tanh`, `sigmoid`, `erf`) are within 1 ulp of the exact value over all float64
inputs, tails and subnormals included (tests/oracles/test_transcendental.py checks them against mpmath at 50 digits):

- `exp`, `tanh`, `sigmoid` are evaluated in x86's 80-bit extended precision (`np.longdouble`, 64 significand bits)
  and rounded once to float64: the extended result is within a few units of 2^-64 relative, so the float64 result
  is within 0.5 ulp + 2^-11 ulp. numpy's own float64 `exp` and `tanh` are SIMD approximations whose error depends on
  the CPU's vector extensions (0.68 and 0.92 ulp were seen on an AVX-512 machine, close to the bound, and other
  machines take other code paths). Where `np.longdouble` is no wider than float64 (Windows, macOS on Apple silicon)
  these functions refuse to run rather than silently lose the margin (`_require_extended`).
- `erf` is the C library's `erf` (glibc's is within 1 ulp: 0.82 ulp was the worst seen), vectorised; numpy has no
  erf. `erfc` is deliberately not offered: glibc's loses up to 2.4 ulp in the tail, and no oracle here needs it
  (gelu's error scale absorbs the cancellation of 1 + erf, see `gelu`).

Error scales (what `|kernel - reference|` is judged against, times the output dtype's tolerance):
- silu_and_mul: `|silu(a) * b|`, the result's own magnitude: a chain of products and one quotient, no cancellation.
- gelu: `0.5 |x| (1 + |erf(x / sqrt 2)|)` (and the tanh form's `0.5 |x| (1 + |tanh t|)`): the magnitudes of the two
  terms of `0.5 x + 0.5 x erf(...)`. The textbook formula, which every GELU kernel computes, loses the small tail
  value for x << 0 to cancellation in `1 + erf`; judged against its own terms, not against the tiny result.
- gelu_and_mul: gelu's scale times `|b|` (the second half), the product adding no cancellation.
- add / mul: `|a| + |b|` and `|a b|`.
- cast: the reference is the source value itself, rounded once into the target format only where it overflows (to
  inf by round-to-nearest-even); scale 0, so the kernel may differ by the rounding alone (half an ulp of the target,
  which `compare` adds). Bit-exactness against the tensor layer's conversions is a separate test.
- rope: `|x1 cos| + |x2 sin|` for each rotated pair (the magnitudes of the two products summed); the dimensions past
  `rot_dim` are the input itself with scale 0.
- embedding: the gathered table rows, scale 0 (a copy).
"""

from __future__ import annotations

import math

import numpy as np

from nbxcert.oracles.parts import TILE, elementwise_in_parts, in_parts, part_bounds, row_parts, tiles

_EXTENDED = np.finfo(np.longdouble).nmant >= 63


def _require_extended() -> None:
    if not _EXTENDED:
        raise RuntimeError(
            "nbxcert.oracles.elementwise needs np.longdouble wider than float64 (x86 80-bit extended precision) to "
            f"keep exp/tanh/sigmoid within 1 ulp; this platform's long double has {np.finfo(np.longdouble).nmant} "
            "mantissa bits"
        )


def _exp_extended(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(x.astype(np.longdouble)).astype(np.float64)


def _tanh_extended(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        return np.tanh(x.astype(np.longdouble)).astype(np.float64)


def _sigmoid_extended(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        xl = x.astype(np.longdouble)
        return (np.longdouble(1) / (np.longdouble(1) + np.exp(-xl))).astype(np.float64)


# A large array is evaluated in tiles (`oracles.parts.TILE` elements), each thread its stretch of the array (or its
# rows of a strided one) tile after tile, so no temporary of the array's size is made (see there; a long double copy
# is 16 bytes an element). A tile whose every value is a 16-bit float's (a float16 or bfloat16 kernel's input, widened)
# holds at most 65536 distinct arguments: the function's values at all of them are computed once a process
# (`_table`) and gathered, element by element the same values as evaluating every element (a long double exp costs
# some 100 ns an element). Smaller arrays are evaluated whole, as before.
TABULATE_AT = 1 << 18
_TABLES: dict = {}  # (function, "float16" or "bfloat16") -> its float64 values at the format's 65536 codes


def _grid(kind: str) -> np.ndarray:
    """The float64 value of each of the 65536 codes of a 16-bit float format (its NaN codes included)."""
    with np.errstate(invalid="ignore"):  # the signalling NaN codes
        if kind == "float16":
            return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
        return (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _table(fn, kind: str, tables: dict) -> np.ndarray:
    """fn at every code of `kind`, kept in `tables` (two threads may both compute it: the same values)."""
    table = tables.get((fn, kind))
    if table is None:
        with np.errstate(invalid="ignore"):  # the NaN codes, never gathered: a tile gathers only where it holds none
            table = tables[(fn, kind)] = fn(_grid(kind))
    return table


def _half_codes(x: np.ndarray) -> tuple[np.ndarray, str] | None:
    """(16-bit codes of x's values, the format) where every value of x is exactly a float16's, or else exactly a
    bfloat16's; None where one is neither (a NaN included: those go the direct way)."""
    with np.errstate(over="ignore", invalid="ignore"):
        half = x.astype(np.float16)
        if np.array_equal(half.astype(np.float64), x):
            return half.view(np.uint16), "float16"
        single = x.astype(np.float32)
    bits = single.view(np.uint32)
    if np.any(bits & np.uint32(0xFFFF)) or not np.array_equal(single.astype(np.float64), x):
        return None
    return (bits >> np.uint32(16)).astype(np.uint16), "bfloat16"


def _on_tile(fn, tile: np.ndarray, tables: dict) -> np.ndarray:
    found = _half_codes(tile)
    if found is None:
        return fn(tile)
    codes, kind = found
    return _table(fn, kind, tables)[codes]


def _evaluate(fn, x: np.ndarray, remember: bool = True) -> np.ndarray:
    """fn (float64 -> float64, element by element) over x: a small x whole; a large one tile by tile on the process's
    cores, each tile through the table of its 16-bit arguments where it holds only those. `remember`: keep fn's
    tables for the process (a module's function); else this call's alone (a function made for the call, which would
    otherwise be kept for ever)."""
    if x.size < TABULATE_AT:
        return elementwise_in_parts(fn, x)
    tables = _TABLES if remember else {}
    out = np.empty(x.shape)
    if x.flags.c_contiguous:
        src, dst = x.reshape(-1), out.reshape(-1)

        def part(lo: int, hi: int) -> None:
            for t in tiles(lo, hi):
                dst[t] = _on_tile(fn, src[t], tables)

        parts = part_bounds(src.size)
    else:  # a strided view (SwiGLU's halves): its rows, a block of them (or a stretch of one long row) a tile
        src = x.reshape(-1, x.shape[-1])
        dst = out.reshape(src.shape)
        rows, cols = src.shape
        row_step, col_step = max(1, TILE // cols), min(cols, TILE)

        def part(lo: int, hi: int) -> None:
            for r in range(lo, hi, row_step):
                for c in range(0, cols, col_step):
                    block = (slice(r, min(r + row_step, hi)), slice(c, c + col_step))
                    dst[block] = _on_tile(fn, src[block], tables)

        parts = row_parts(rows, cols)
    if parts is None:
        part(0, dst.shape[0])
    else:
        in_parts(part, parts)
    return out


def exp(x) -> np.ndarray:
    """e^x in float64, within 1 ulp (computed in extended precision, rounded once)."""
    _require_extended()
    return _evaluate(_exp_extended, np.asarray(x, dtype=np.float64))


def tanh(x) -> np.ndarray:
    """tanh(x) in float64, within 1 ulp (extended precision, rounded once)."""
    _require_extended()
    return _evaluate(_tanh_extended, np.asarray(x, dtype=np.float64))


def sigmoid(x) -> np.ndarray:
    """1 / (1 + e^-x) in float64, within 1 ulp (extended precision, rounded once)."""
    _require_extended()
    return _evaluate(_sigmoid_extended, np.asarray(x, dtype=np.float64))


_erf = np.frompyfunc(math.erf, 1, 1)


def _erf_direct(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(x), dtype=np.float64).reshape(x.shape)


def erf(x) -> np.ndarray:
    """erf(x) in float64: the C library's erf element by element (within 1 ulp with glibc); a large array tile by
    tile, through the table of its 16-bit arguments where it holds only those (`_evaluate`: a Python call an element
    otherwise, which threads cannot share)."""
    return _evaluate(_erf_direct, np.asarray(x, dtype=np.float64))


def _gelu_erf_term(x: np.ndarray) -> np.ndarray:
    """erf(x / sqrt 2): element by element, so a tile of 16-bit arguments takes it from their table."""
    return _erf_direct(x / math.sqrt(2.0))


def _gelu_tanh_term(x: np.ndarray) -> np.ndarray:
    """tanh(sqrt(2/pi) (x + 0.044715 x^3)) in extended precision, element by element."""
    with np.errstate(over="ignore"):
        return _tanh_extended(math.sqrt(2.0 / math.pi) * (x + GELU_TANH_C * x * x * x))


# --- kernel oracles ---------------------------------------------------------------------------------------------------
def silu_and_mul(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SwiGLU: x [..., 2d] -> silu(x[..., :d]) * x[..., d:], with silu(a) = a * sigmoid(a)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1])
    ref, scale = np.empty((rows.shape[0], d)), np.empty((rows.shape[0], d))

    def part(lo: int, hi: int) -> None:
        # a * sigmoid(a) * b in place, the products in that order, and its scale: a block of rows a thread (before,
        # the products and the scale ran on one core: 512 x 18944 took 0.36 s, now 0.25 s, on a 2-core host)
        a, b, r = rows[lo:hi, :d], rows[lo:hi, d:], ref[lo:hi]
        r[...] = sigmoid(a)
        np.multiply(a, r, out=r)
        np.multiply(r, b, out=r)
        np.abs(r, out=scale[lo:hi])

    parts = row_parts(*ref.shape)
    if parts is None:
        part(0, ref.shape[0])
    else:
        in_parts(part, parts)
    shape = x.shape[:-1] + (d,)
    return ref.reshape(shape), scale.reshape(shape)


GELU_TANH_C = 0.044715  # the tanh approximation's cubic coefficient (Hendrycks & Gimpel 2016)


def gelu(x: np.ndarray, approximate: str) -> tuple[np.ndarray, np.ndarray]:
    """GELU. `approximate="none"`: 0.5 x (1 + erf(x / sqrt 2)). `"tanh"`: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
    x^3)))."""
    x = np.asarray(x, dtype=np.float64)
    if approximate == "none":
        f = _evaluate(_gelu_erf_term, x)
    elif approximate == "tanh":
        _require_extended()
        f = _evaluate(_gelu_tanh_term, x)
    else:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    ref = 0.5 * x * (1.0 + f)
    return ref, 0.5 * np.abs(x) * (1.0 + np.abs(f))


def gelu_and_mul(x: np.ndarray, approximate: str) -> tuple[np.ndarray, np.ndarray]:
    """GeGLU: x [..., 2d] -> gelu(x[..., :d]) * x[..., d:]; error scale gelu's times |x[..., d:]| (the product adds
    no cancellation)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1] // 2
    g, scale = gelu(x[..., :d], approximate)
    b = x[..., d:]
    return g * b, scale * np.abs(b)


def add(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a + b with numpy broadcasting."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a + b, np.abs(a) + np.abs(b)


def mul(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a * b with numpy broadcasting."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ref = a * b
    return ref, np.abs(ref)


# IEEE binary formats by name: (exponent bits, explicit mantissa bits). The largest finite value is
# (2 - 2^-m) * 2^(2^(e-1) - 1); a value at or beyond max + half an ulp of max rounds to infinity (the midpoint goes to
# the even neighbour, and max's last mantissa bit is 1, so infinity wins the tie).
_FORMATS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}


def cast(x: np.ndarray, target: str) -> tuple[np.ndarray, np.ndarray]:
    """x converted to the float format `target` (round to nearest even): the value itself, or +-inf past the
    format's range; NaN stays NaN. Scale 0 (only the final rounding is allowed)."""
    x = np.asarray(x, dtype=np.float64)
    if target not in _FORMATS:
        raise ValueError(f"cast: unknown target format {target!r}")
    e, m = _FORMATS[target]
    emax = 2 ** (e - 1) - 1
    if target == "float64":
        return x.copy(), np.zeros(x.shape)
    largest = (2.0 - 2.0**-m) * 2.0**emax
    overflow_at = largest + 2.0 ** (emax - m - 1)  # max + half an ulp of max, exact in float64 for these formats
    ref = np.where(np.abs(x) >= overflow_at, np.copysign(np.inf, x), x)
    return ref, np.zeros(x.shape)


def rope(
    x: np.ndarray, positions: np.ndarray, cos_sin_cache: np.ndarray, rot_dim: int, style: str
) -> tuple[np.ndarray, np.ndarray]:
    """Rotary embedding of x [tokens, heads, head_dim] at `positions` [tokens], cos/sin read from `cos_sin_cache`
    [max_position, rot_dim] (cos in the first rot_dim/2 columns, sin in the rest, as vLLM lays it out).

    `style="neox"`: pairs (i, i + rot_dim/2); `"gptj"`: pairs (2i, 2i + 1); for pair (x1, x2) and frequency i:
    x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. Dimensions past rot_dim are returned unchanged (scale 0)."""
    x = np.asarray(x, dtype=np.float64)
    half = rot_dim // 2
    cache = np.asarray(cos_sin_cache, dtype=np.float64)[np.asarray(positions, dtype=np.int64)]
    cos, sin = cache[:, None, :half], cache[:, None, half:rot_dim]
    if style == "neox":
        i1, i2 = np.arange(half), np.arange(half) + half
    elif style == "gptj":
        i1, i2 = 2 * np.arange(half), 2 * np.arange(half) + 1
    else:
        raise ValueError(f"rope: style must be 'neox' or 'gptj', got {style!r}")
    x1, x2 = x[..., i1], x[..., i2]
    ref, scale = x.copy(), np.zeros(x.shape)
    ref[..., i1] = x1 * cos - x2 * sin
    ref[..., i2] = x2 * cos + x1 * sin
    scale[..., i1] = np.abs(x1 * cos) + np.abs(x2 * sin)
    scale[..., i2] = np.abs(x2 * cos) + np.abs(x1 * sin)
    return ref, scale


def embedding(table: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `table` [vocab, dim] gathered by `ids` (any shape) -> [*ids.shape, dim]; ids must lie in [0, vocab)."""
    table = np.asarray(table, dtype=np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise ValueError(f"embedding: ids outside [0, {table.shape[0]})")
    ref = table[ids]
    return ref, np.zeros(ref.shape)
