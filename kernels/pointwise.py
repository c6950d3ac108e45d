"""Pointwise kernels: every element-wise op of torch's (unary math, activations, binary arithmetic, comparisons,
logic, bit operations, selection, data movement) through ONE kernel, `_map_kernel`, and a table of ops.

The kernel. `_map_kernel` reads up to three operands x, y, z, each either a tensor read through its own strides over
the output's (merged) index space, or a scalar; takes up to three scalar parameters p0, p1, p2 (alpha, min/max, a
fill value, ...); applies the op's body, a `@jit` function given as the constexpr BODY; and stores into the output
through the output's strides (so a copy into a strided view, or an in-place op on a view, is the same launch). The
index space is the output's shape with adjacent dimensions merged wherever they are contiguous in every tensor
(`merge_dims`), at most `MAX_DIMS` of them; when every tensor is contiguous with the output's shape (DENSE) the
kernel does no index arithmetic at all. Otherwise it is done in 32-bit integers wherever every index and offset stays
below 2^31 (`fits_index32`; 64-bit past that): each division by Triton's own where the output's rows are contiguous
and a multiple of 16 long (a thread's run of elements stays contiguous: vector loads and stores, one division a run),
else by the size's divider, a multiply-high, an add and a shift (`divider`; CUDA has no integer division
instruction, and a 64-bit one is a call). A zero-input generator (fill, arange, linspace) is the same kernel with no
operand: its body reads the element's index. One transposed operand read into a contiguous output (a transposed
copy or cast, any unary op: layout class "transposed") has a second kernel too, `_tile_kernel`: 2-d tiles loaded
along the operand's contiguous dimension and stored along the output's (configs `TILE_A` x `TILE_B`, legal only for
such keys), the same expression per element.

Types. An operand is loaded in its own dtype, converted to the op's common dtype (torch's: the type every operand is
cast to, `nbxcert.kernels.promotion`), then to the compute type (`compute_dtype`). On the GPU it is torch's: half
precision and float32 in float32, float64 in float64, except the ops whose float32 result would miss the float32
tolerance (`Op.gpu_f64`, with the reason in the row: measured over every float32 input), which compute float32 in
float64. Under the interpreter: half precision in float32 (float64 for `Op.interp_wide`), float32 and float64 in
float64. Integers compute in their own width with two's complement wrap-around, bool as int1. The result is rounded
once into the output's dtype (`narrow`: round to nearest even, bfloat16 on the bits under the interpreter). A Python
scalar operand is passed as its float64 bits (or as an int64), so no value is rounded through a float32 kernel
argument.

Device functions. On the GPU (the cuda and cross backends: `DEVICE_MATH`, a constexpr the launch sets from the
backend in force, `math_level`) the bodies call the device's math library (`libdevice`: CUDA's accurate __nv_expf,
__nv_logf, __nv_tanh, ..., and its exact fmod, launched without libdevice's flush-to-zero, `math_options`), except
where a float16 or bfloat16 result is computed in float32 on an NVIDIA GPU: there exp, log, log2, log1p, expm1, rsqrt,
reciprocal, tanh, erf, sigmoid, silu, softplus, log_sigmoid, mish, elu, celu, selu, gelu (both forms), hardsigmoid,
hardswish, glu and pow, and for float16 sin, cos, tan, atan2 and hypot, take this module's half-precision helpers
(`_h_*`: the GPU's approximate instructions, short series and published approximations, checked over every 16-bit
input; round takes the exact rint instruction on any float). Under Triton's interpreter (no device math library) the
transcendental helpers here are written out from exp, log, sin, cos and erf (tanh: its series near 0, 1 - 2 /
(e^2|x| + 1) elsewhere; expm1 and log1p: Kahan's and Goldberg's corrections; fmod: a long division on the bits).

Refusals (`nbxcert.kernels.faults`): integer division or remainder by zero, and a float to integer cast of NaN, an
infinity or a value outside the target's range, are recorded by the kernel and raised as one `LaunchError` line.

Every op is a row of `OPS` (`Op`): its name (torch's), its operand count, its body, the dtypes it takes, torch's
type promotion kind, its scalar parameters, and its oracle (`nbxcert.oracles.pointwise.<name>`, looked up when it
judges, as `nbxcert.kernels.promotion` is when a call promotes). Each row becomes one `KernelSpec` named `pw_<name>`
(family "pointwise"), all built by `op_spec`.

Keys: the element count, bucketed on the device file's `numel` ladder, and each operand's and the output's layout
class (dense / broadcast / strided / scalar / none: `layout_of`); the dtypes are the operands' and the output's.
No config field changes an output bit (each element is computed by the same expression whatever the tile or warps):
every spec says so in `no_bit_fields`, and the tests check it.
"""

from __future__ import annotations

import importlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from nbxcert.errors import DTypeError, LaunchError, ShapeMismatch
from nbxcert.kernels import faults
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.common import broadcast_strides, family_spec, merge_dims, narrow, upcast
from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.faults import record_fault_lanes
from nbxcert.kernels.indexing import divider, fits_index32
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import KernelLaunch, cdiv, constexprs, served
from nbxcert.kernels.launch import run_all as _run
from nbxcert.kernels.prune import lanes_refusal, prune_with, registers_refusal
from nbxcert.kernels.spec import Config, Inputs, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_numpy

# Triton's device math library (`libdevice.exp`, ...), imported once `nbxcert.kernels.jit` above chose the backend: a
# Triton module imported before that choice would be decorated for the wrong one
libdevice = importlib.import_module("triton.language.extra.libdevice")

MAX_DIMS = 6  # dimensions the kernel indexes after merging (torch's TensorIterator merges alike; 6 covers NCDHW+1)
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "uint8", "int16", "int32", "int64")
ALL = FLOATS + INTS + ("bool",)
NUMERIC = FLOATS + INTS
INT_BITS = {"int8": 8, "uint8": 8, "int16": 16, "int32": 32, "int64": 64, "bool": 1}
# operand modes (constexpr X_MODE, ...)
TENSOR, FLOAT_SCALAR, INT_SCALAR, UNUSED = 0, 1, 2, 3

PI = tl.constexpr(3.141592653589793)
HALF_PI = tl.constexpr(1.5707963267948966)
QUARTER_PI = tl.constexpr(0.7853981633974483)
TAN_PI_8 = tl.constexpr(0.41421356237309503)
INV_SQRT2 = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
GELU_TANH_C = tl.constexpr(0.044715)
SELU_ALPHA = tl.constexpr(1.6732632423543772)
SELU_SCALE = tl.constexpr(1.0507009873554805)


# ======================================================================================================================
# device helpers
# ======================================================================================================================
@jit
def _c(value: tl.constexpr, like):
    """The constant `value` in `like`'s type at its full precision (a bare Python float enters Triton as float32)."""
    return tl.full([], value, like.dtype)


@jit
def _ftz(v):
    """v with float32 subnormals flushed to a zero of their sign: what an ftz instruction reads or writes (the
    interpreter's stand-ins for the approximate instructions, DM >= EMULATED)."""
    return tl.where(tl.abs(v) < _c(FLT_MIN, v), v * 0.0, v)


@jit
def _nan(like):
    return tl.full(like.shape, float("nan"), like.dtype)


@jit
def _isnan(x):
    return x != x


@jit
def _isinf(x):
    return (x == float("inf")) | (x == float("-inf"))


@jit
def _sign_bit(x):
    """x's sign bit (-0.0 and NaN's too), as a bool."""
    if x.dtype == tl.float64:
        return x.to(tl.int64, bitcast=True) < 0
    elif x.dtype == tl.float32:
        return x.to(tl.int32, bitcast=True) < 0
    else:
        return x.to(tl.int16, bitcast=True) < 0


@jit
def _div(x, y):
    """x / y rounded to nearest (Triton's float32 `/` is an approximate division on the GPU)."""
    if x.dtype == tl.float32:
        return tl.math.div_rn(x, y)
    else:
        return x / y


@jit
def _sqrt(x):
    if x.dtype == tl.float32:
        return tl.math.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@jit
def _expm1(x):
    """exp(x) - 1 without cancellation near 0 (Kahan: (u - 1) x / log u, u = exp x)."""
    u = tl.exp(x)
    um1 = u - 1.0
    safe = tl.where((um1 == 0.0) | (u == float("inf")), 1.0, u)
    r = um1 * _div(x, tl.log(safe))
    r = tl.where(um1 == -1.0, -1.0, r)
    r = tl.where(u == 1.0, x, r)
    return tl.where(u == float("inf"), u, r)


@jit
def _log1p(x):
    """log(1 + x) without cancellation near 0 (Goldberg: log(u) x / (u - 1), u = 1 + x)."""
    u = 1.0 + x
    d = u - 1.0
    r = tl.log(u) * _div(x, tl.where(d == 0.0, 1.0, d))
    r = tl.where(d == 0.0, x, r)
    return tl.where(u == float("inf"), u, r)


@jit
def _sigmoid(x):
    """1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0, e = exp(-|x|): no overflow on either side."""
    e = tl.exp(-tl.abs(x))
    return _div(tl.where(x >= 0, 1.0, e), 1.0 + e)


def _tanh_series() -> tuple[float, ...]:
    """tanh's Taylor coefficients c_k of x^(2k + 1), exactly (tanh' = 1 - tanh^2: (2k + 1) c_k = -sum_(i + j = k - 1)
    c_i c_j), rounded once to float64."""
    c = [Fraction(1)]
    for k in range(1, TANH_TERMS.value):
        c.append(-sum(c[i] * c[k - 1 - i] for i in range(k)) / (2 * k + 1))
    return tuple(float(v) for v in c)


# |x| < TANH_SERIES_AT: the series, TANH_TERMS terms (each next one is (2x / pi)^2 < 0.123 of the last: 22 terms
# leave a remainder below 2^-60 of x); past it 1 - 2 / (e^2|x| + 1), free of cancellation (the result is > 0.5)
TANH_TERMS = tl.constexpr(22)
TANH_SERIES_AT = tl.constexpr(0.55)
TANH_C = tl.constexpr(_tanh_series())


@jit
def _tanh(x):
    """tanh within an ulp (the interpreter's: no device library): the odd series x + x^3 (c1 + c2 x^2 + ...) near 0,
    1 - 2 / (e^2|x| + 1) elsewhere (e^2|x| overflowing gives 1); signed zeros and NaN kept."""
    a = tl.abs(x)
    small = a < _c(TANH_SERIES_AT, a)
    s = tl.where(small, a, 0.0)
    s2 = s * s
    p = tl.zeros_like(s)
    for k in tl.static_range(TANH_TERMS - 1, 0, -1):
        p = p * s2 + _c(TANH_C[k], s)
    series = s + s * (s2 * p)
    e = tl.exp(2.0 * tl.where(small, 0.0, a))
    far = 1.0 - _div(tl.full(a.shape, 2.0, a.dtype), e + 1.0)
    t = tl.where(small, series, far)
    t = tl.where(x < 0, -t, tl.where(x == 0, x, t))
    return tl.where(_isnan(x), x, t)


@jit
def _softplus(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))."""
    return tl.maximum(x, 0.0) + _log1p(tl.exp(-tl.abs(x)))


@jit
def _atan(t):
    """atan(t): |t| > 1 through pi/2 - atan(1/|t|); past tan(pi/8), pi/4 + atan((u - 1)/(u + 1)); then the series
    v (1 - v^2/3 + v^4/5 - ...) for |v| <= tan(pi/8) (26 terms: below float64's half ulp)."""
    ax = tl.abs(t)
    inv = ax > 1.0
    u = tl.where(inv, _div(tl.full(ax.shape, 1.0, ax.dtype), tl.where(inv, ax, 1.0)), ax)
    shifted = u > _c(TAN_PI_8, u)
    v = tl.where(shifted, _div(u - 1.0, u + 1.0), u)
    v2 = v * v
    s = tl.zeros_like(v)
    for k in tl.static_range(25, -1, -1):
        s = s * v2 + _c((1 - 2 * (k % 2)) / (2 * k + 1), v)
    a = v * s
    a = tl.where(shifted, _c(QUARTER_PI, u) + a, a)
    a = tl.where(inv, _c(HALF_PI, u) - a, a)
    a = tl.where(ax == float("inf"), _c(HALF_PI, u), a)
    return tl.where(t < 0, -a, tl.where(t == 0, t, a))


@jit
def _atan2(y, x):
    """atan2 with C99's special cases (signed zeros, infinities)."""
    ay = tl.abs(y)
    ax = tl.abs(x)
    both_inf = (ay == float("inf")) & (ax == float("inf"))
    r = _atan(_div(ay, tl.where(ax == 0.0, 1.0, ax)))
    r = tl.where(ax == 0.0, tl.where(ay == 0.0, ay, _c(HALF_PI, y)), r)  # atan2(+-0, -0) = +-pi after the reflection
    r = tl.where(both_inf, _c(QUARTER_PI, y), r)
    neg_x = (x < 0) | ((x == 0) & ((1.0 / tl.where(x == 0, x, 1.0)) < 0))  # x negative, -0.0 included
    r = tl.where(neg_x, _c(PI, y) - r, r)
    r = tl.where((ay == 0) & (ax == 0) & ~neg_x, ay, r)
    r = tl.where(_isnan(x) | _isnan(y), _nan(y), r)
    neg_y = (y < 0) | ((y == 0) & ((1.0 / tl.where(y == 0, y, 1.0)) < 0))
    return tl.where(neg_y, -r, r)


@jit
def _rint(x):
    """Round half to even; integers, infinities and NaN unchanged; the sign of a zero result is x's."""
    if x.dtype == tl.float64:
        big = tl.abs(x) >= 4503599627370496.0  # 2^52: already an integer
    else:
        big = tl.abs(x) >= 8388608.0  # 2^23
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    r = tl.where(tie & ((r - 2.0 * tl.floor(r * 0.5)) != 0.0), r - 1.0, r)
    r = tl.where(x < 0, -tl.abs(r), r)
    return tl.where(big | _isnan(x), x, r)


@jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@jit
def _pow2(j, one, BIAS: tl.constexpr, P: tl.constexpr, MIN_K: tl.constexpr, FT: tl.constexpr):
    """2^j as the float type FT (bits of the integer type of `one`), for MIN_K <= j <= BIAS: normal or subnormal."""
    j = tl.maximum(j, MIN_K)
    bits = tl.where(j >= 1 - BIAS, (j + BIAS).to(one.dtype) << P, one << (j - MIN_K).to(one.dtype))
    return bits.to(FT, bitcast=True)


@jit
def _fmod_float(a, b):
    """C's fmod, exact: the significands' long division on the bits (the float64 or float32 compute type), one
    shift-subtract step per binade between a and b; the result has a's sign. Subnormals are normalized first (scaled
    by 2^P, exactly), so both significands have their leading bit at P."""
    if a.dtype == tl.float64:
        IT: tl.constexpr = tl.int64
        P: tl.constexpr = 52
        EMASK: tl.constexpr = 0x7FF
        BIAS: tl.constexpr = 1023
        MIN_K: tl.constexpr = -1074
        TWO_P: tl.constexpr = 4503599627370496.0
    else:
        IT: tl.constexpr = tl.int32
        P: tl.constexpr = 23
        EMASK: tl.constexpr = 0xFF
        BIAS: tl.constexpr = 127
        MIN_K: tl.constexpr = -149
        TWO_P: tl.constexpr = 8388608.0
    aa = tl.abs(a)
    ab = tl.abs(b)
    one = aa.to(IT, bitcast=True) * 0 + 1
    sub_a = aa < _pow2(one * (1 - BIAS), one, BIAS, P, MIN_K, a.dtype)
    sub_b = ab < _pow2(one * (1 - BIAS), one, BIAS, P, MIN_K, a.dtype)
    ua = tl.where(sub_a, aa * TWO_P, aa).to(IT, bitcast=True)
    ub = tl.where(sub_b, ab * TWO_P, ab).to(IT, bitcast=True)
    ea = ((ua >> P) & EMASK) - tl.where(sub_a, P, 0)
    eb = ((ub >> P) & EMASK) - tl.where(sub_b, P, 0)
    ma = (ua & ((one << P) - 1)) | (one << P)
    mb = (ub & ((one << P) - 1)) | (one << P)
    finite = (aa < float("inf")) & (b == b) & (b != 0.0) & (ab < float("inf"))
    work = finite & (aa >= ab) & (a != 0.0)
    steps = tl.where(work, ea - eb, 0)
    m = tl.where(work, ma, 0)
    mb = tl.where(work, mb, 1)
    for _ in range(0, tl.max(steps)):
        live = steps > 0
        m = tl.where(live & (m >= mb), m - mb, m)
        m = tl.where(live, m << 1, m)
        steps = tl.where(live, steps - 1, steps)
    m = tl.where(m >= mb, m - mb, m)
    # the result is m 2^k, exactly representable: one scaling where 2^k is a float, else two (2^(k + P), then 2^-P)
    k = eb - BIAS - P
    direct = m.to(a.dtype) * _pow2(k, one, BIAS, P, MIN_K, a.dtype)
    twice = (m.to(a.dtype) * _pow2(k + P, one, BIAS, P, MIN_K, a.dtype)) * _c(1.0 / TWO_P, a)
    r = tl.where(k >= MIN_K, direct, twice)
    r = tl.where(a < 0, -r, r)
    r = tl.where(work, r, tl.where(finite | ((ab == float("inf")) & (aa < float("inf"))), a, _nan(a)))
    return r


@jit
def _int_div_parts(x, y):
    """(trunc(x / y), x - trunc(x / y) * y) for integers, wrapping: y == 0 gives (0, 0) (the guard refuses it) and
    y == -1 gives (-x, 0) (INT_MIN / -1 wraps to INT_MIN, as torch's)."""
    if x.dtype.is_int_unsigned():
        safe = tl.where(y == 0, 1, y).to(x.dtype)
        q = tl.where(y == 0, 0, x // safe).to(x.dtype)
        r = tl.where(y == 0, 0, x % safe).to(x.dtype)
        return q, r
    else:
        minus_one = y == tl.full(y.shape, -1, y.dtype)
        safe = tl.where((y == 0) | minus_one, 1, y).to(x.dtype)
        q = x // safe
        r = x % safe
        neg_x = (tl.zeros_like(x) - x).to(x.dtype)
        q = tl.where(minus_one, neg_x, tl.where(y == 0, 0, q)).to(x.dtype)
        r = tl.where(minus_one | (y == 0), 0, r).to(x.dtype)
        return q, r


@jit
def _int_pow(x, e, BITS: tl.constexpr):
    """x ** e for integers by squaring, wrapping; e < 0 gives 1 for x == 1, +-1 for x == -1, else 0 (torch's)."""
    result = tl.full(x.shape, 1, x.dtype)
    base = x
    k = tl.where(e < 0, 0, e)
    for _ in range(BITS):
        result = tl.where((k & 1) != 0, result * base, result).to(x.dtype)
        base = (base * base).to(x.dtype)
        k = k >> 1
    if x.dtype.is_int_unsigned():
        return result
    else:
        minus_one = x == tl.full(x.shape, -1, x.dtype)
        neg = tl.where(x == 1, 1, tl.where(minus_one, tl.where((e & 1) != 0, -1, 1), 0)).to(x.dtype)
        return tl.where(e < 0, neg, result)


@jit
def _float_pow(x, e, DM: tl.constexpr):
    """C99 pow: exp2(e log2 |x|), the sign of x for an odd integer e, and the standard's special cases. For a
    half-precision result (DM), log2 is `_h_log2` (relative near 1, where a large e would magnify an absolute error)
    and exp2 ex2.approx: within 2^-17 of the result over the exponents a 16-bit result can have."""
    ax = tl.abs(x)
    e_int = tl.floor(e) == e
    e_odd = e_int & ((e - 2.0 * tl.floor(e * 0.5)) != 0.0) & (tl.abs(e) < 9007199254740992.0)
    if DM % 10 >= HALF_MATH:
        return _h_pow(x, e, ax, e_int, e_odd, DM)
    lg = tl.log2(tl.where(ax == 0.0, 1.0, ax))
    r = _p_exp2(e * lg, DM)
    r = tl.where(ax == 0.0, tl.where(e < 0, float("inf"), 0.0), r)
    r = tl.where((x < 0) & ~e_int & (tl.abs(e) < float("inf")), _nan(x), r)
    r = tl.where((x < 0) & e_odd, -r, r)
    zero_neg = (x == 0) & _sign_bit(x)
    r = tl.where(zero_neg & e_odd, -r, r)
    ax_inf = ax == float("inf")
    r = tl.where(ax_inf, tl.where(e < 0, 0.0, float("inf")), r)
    r = tl.where(ax_inf & (x < 0) & e_odd, -r, r)
    e_inf = tl.abs(e) == float("inf")
    big = tl.where(e > 0, float("inf"), 0.0)
    small = tl.where(e > 0, 0.0, float("inf"))
    r = tl.where(e_inf, tl.where(ax == 1.0, 1.0, tl.where(ax > 1.0, big, small)), r)
    r = tl.where(_isnan(x) | _isnan(e), _nan(x), r)
    r = tl.where(x == 1.0, 1.0, r)
    return tl.where(e == 0.0, 1.0, r)


@jit
def _h_pow(x, e, ax, e_int, e_odd, DM: tl.constexpr):
    """`_float_pow` for a half-precision result, C99's special cases from exp2(e log2 |x|) itself where its infinities
    give them: log2 of 0 and inf is -inf and inf (lg2.approx; `_h_log2_far` for bfloat16's subnormals), so |x| = 0
    or inf and e = +-inf come out 0 or inf, and ex2.approx of -inf is 0. Left to set: NaN for a finite negative x and
    a finite e not an integer, the sign of x (-0 and -inf too) for an odd integer e, 1 for x = 1 (e NaN too) and for
    x = -1 with e infinite (0 times inf in the product), and 1 for e = 0 (x NaN too). 4 selects instead of 15."""
    if DM % 10 == HALF_MATH:  # a Python scalar base below float32's least normal, scaled for the ftz lg2
        sub = ax < _c(FLT_MIN, ax)
        lg = _h_log2(tl.where(sub, ax * _c(TWO_24, ax), ax), DM) - tl.where(sub, 24.0, 0.0)
    else:  # bfloat16: `_h_log2_far` scales its subnormals
        lg = _h_log2(ax, DM)
    r = _p_exp2(e * lg, DM)
    r = tl.where((x < 0.0) & (x > float("-inf")) & ~e_int, _nan(x), r)
    r = tl.where(_sign_bit(x) & e_odd, -r, r)
    r = tl.where((ax == 1.0) & ((x == 1.0) | (tl.abs(e) == float("inf"))), 1.0, r)
    return tl.where(e == 0.0, 1.0, r)


# --- half precision on the GPU (DM >= HALF_MATH): float32 algorithms whose error is far below a 16-bit tolerance ----
# A float16 or bfloat16 result is judged at its type's epsilon (2^-10, 2^-7) besides its final rounding, 2^13 and 2^16
# times float32's. There CUDA's accurate float32 functions spend up to 90 instructions an element (log 33, softplus
# 80, sin 88, against abs's 6: sm_90's SASS, `benchmarks/sass_pointwise.py`) on accuracy the result cannot hold,
# and an op reading and writing 16-bit values is held to that rate, not to the memory's. These helpers keep the
# float32 compute type and take the GPU's approximate instructions (ex2.approx through tl.exp, lg2.approx,
# rsqrt.approx, rcp.approx: each within a few float32 ulps, subnormals kept, as `math_options` launches them) where
# their error is a relative one, and short series (exact rational coefficients, rounded once) where a result must
# keep its relative accuracy near a zero of the function (log near 1, log1p and expm1 near 0, sin and cos after the
# reduction, tanh near 0), and two published approximations with stated error bounds where a series would be long
# (atan: Abramowitz and Stegun 4.4.49), and a polynomial fitted here with its bound checked by a test (log2 erfc). A
# float16 result's exponentials drop float32's subnormals
# (`_p_exp2`: they round to 0 in float16).
# `tests/kernels/test_pointwise_half.py` runs every helper under the interpreter over every float16 and bfloat16 input
# against its oracle (the approximate instructions there are numpy's exact ones: DM + EMULATED; the float32 result
# within 2^-8 of the tolerance before its rounding, 2^-9.3 at worst), and on the GPU each op served over the same
# inputs, the instructions' own error included.
# DM: HALF_MATH for a float16 result, HALF_BF16 for a bfloat16 one (sin, cos, tan, atan2 and hypot: float16's range
# only).
HALF_MATH = tl.constexpr(2)
HALF_BF16 = tl.constexpr(3)
EMULATED = tl.constexpr(10)  # added to DM by the tests: the half algorithms under the interpreter
LN2 = tl.constexpr(0.6931471805599453)
LOG2E = tl.constexpr(1.4426950408889634)
FLT_MIN = tl.constexpr(1.1754943508222875e-38)  # float32's least normal, 2^-126: bfloat16 has subnormals below it
TWO_24 = tl.constexpr(16777216.0)


def _series(coefficient, terms: int) -> tuple[float, ...]:
    """`terms` coefficients (Fractions from `coefficient(k)`, k = 0, 1, ...) rounded once to float64."""
    return tuple(float(Fraction(coefficient(k))) for k in range(terms))


# Each series stops where its remainder is below 2^-19 of the result (2^-9 of float16's tolerance):
# log1p(t) / t = sum (-t)^k / (k + 1): at |t| <= 1/8, 6 terms leave 8^-6 / 7 = 2^-20.8; log(1 + t) near t = 0 takes
# the same series at |t| <= 1/16, 5 terms leaving 16^-5 / 6 = 2^-22.6. expm1(x) / x = sum x^k / (k + 1)!: at
# |x| <= 1/4, 5 terms leave 4^-5 / 6! = 2^-19.5.
LOG1P_AT = tl.constexpr(0.125)
LOG1P_TERMS = tl.constexpr(6)
LOG_NEAR_ONE = tl.constexpr(0.0625)
LOG_TERMS = tl.constexpr(5)
LOG1P_C = tl.constexpr(_series(lambda k: Fraction((-1) ** k, k + 1), 6))
EXPM1_AT = tl.constexpr(0.25)
EXPM1_C = tl.constexpr(_series(lambda k: Fraction(1, math.factorial(k + 1)), 5))


@jit
def _p_log2(x, DM: tl.constexpr):
    """log2 of a float32 for the half forms (DM >= HALF_MATH, its only callers): lg2.approx.ftz on the GPU, since no x
    they give it is below float32's least normal (float16's values are float32 normals, `_h_log2_far` scales
    bfloat16's subnormals and `_h_pow` a Python scalar base's, log1p's 1 + t is 0 or at least 2^-11), so the compare
    and the scalings that keep subnormal inputs (`libdevice.fast_log2f`) are saved; numpy's under the interpreter
    (DM >= EMULATED: the half algorithms tried there), reading a subnormal as 0 as the ftz instruction does."""
    if DM < EMULATED:
        return tl.inline_asm_elementwise(
            "lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.log2(_ftz(x))


@jit
def _p_exp2(v, DM: tl.constexpr):
    """2^v of a float32. For a float16 result on the GPU ex2.approx.ftz: a result below 2^-126 (float32's subnormals,
    which round to 0 in float16 wherever these helpers use it: a product with at most 65504 stays below 2^-110) is
    0, and the three instructions that keep it (`tl.exp2`'s ex2.approx without ftz: a compare, a scaling before and
    a squaring after) are saved; bfloat16 (float32's range) and every other level keep `tl.exp2`."""
    if DM % 10 == HALF_MATH and DM < EMULATED:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=f,f", [v], dtype=tl.float32, is_pure=True, pack=1
        )
    elif DM % 10 == HALF_MATH:
        return _ftz(tl.exp2(v))
    else:
        return tl.exp2(v)


@jit
def _p_exp(x, DM: tl.constexpr):
    """e^x of a float32 by ex2.approx of x log2(e) (`_p_exp2`: ftz for a float16 result), as `tl.exp` lowers."""
    if DM % 10 == HALF_MATH and DM < EMULATED:
        return _p_exp2(x * _c(LOG2E, x), DM)
    else:
        return tl.exp(x)


@jit
def _p_rsqrt(x, DM: tl.constexpr):
    """1 / sqrt(x) of a float32 for the half forms (DM >= HALF_MATH; their only caller, rsqrt, scales a bfloat16
    subnormal first; a float16 value is a float32 normal; every result is a normal or 0 or inf): rsqrt.approx.ftz on
    the GPU; exact under the interpreter, reading a subnormal as 0 as the ftz instruction does."""
    if DM < EMULATED:
        return tl.inline_asm_elementwise(
            "rsqrt.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 / tl.sqrt(_ftz(x))


RCP_FLUSHES_PAST = tl.constexpr(2.0**126)  # rcp.approx.ftz of a y past it is below float32's least normal: 0
RCP_ERROR = tl.constexpr(2.0**-22.4)  # x times rcp.approx (1 ulp) against x / y, rounded: within 2^-22.4 of it


@jit
def _p_div(x, y, DM: tl.constexpr):
    """x / y of float32s as x times rcp.approx.ftz(y) on the GPU (the reciprocal within 1 ulp: 2^-22.4 with the
    product's rounding; one MUFU and one multiply, where `libdevice.fast_dividef` adds a range test and two scalings);
    exact under the interpreter, with the flushes emulated. A y past 2^126 gives 0 (its reciprocal is below float32's
    normals), as __fdividef does; a y below 2^-126 reads as 0 (a Python scalar below float32's least normal: atan2's
    and fmod's callers route it elsewhere). Its divisors: sigmoid's in [1, 2], mish's in [2, 2.4e17], atan2's
    larger operand and tan's tan r (float16: at least 2^-24); tanh's e^2|x| + 1 and gelu's (tanh form) 1 + e^-2t go
    past 2^126, where tanh is 1 - 0 = 1 as in float32 and gelu's quotient, below |x| 2^-126, is far inside its error
    scale (about |x| there)."""
    if DM < EMULATED:
        return x * tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [y], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        # the exact quotient moved by the bound, up or down by its last bit: the forms that round a quotient (fmod's
        # floor) meet both errors under the interpreter too
        # and the ftz instruction's flushes: a subnormal y reads as a zero (an infinite reciprocal), a y past 2^126
        # has a subnormal reciprocal, written as a zero
        y = _ftz(y)
        q = x / y
        up = (q.to(tl.int32, bitcast=True) & 1) != 0
        q = q * tl.where(up, 1.0 + _c(RCP_ERROR, q), 1.0 - _c(RCP_ERROR, q))
        return tl.where(tl.abs(y) > _c(RCP_FLUSHES_PAST, y), x * tl.where(y < 0.0, -0.0, 0.0), q)


@jit
def _q_scalar(x, p, DM: tl.constexpr):
    """x / p for a scalar parameter p: for a half-precision result x times 1 / p (two float32 roundings, the
    reciprocal made once), else rounded to nearest (`_div`)."""
    if DM % 10 >= HALF_MATH:
        return x * (1.0 / p)
    else:
        return _div(x, tl.full(x.shape, 0.0, x.dtype) + p)


@jit
def _q(x, y, DM: tl.constexpr):
    """x / y: x times rcp.approx (`_p_div`) for a half-precision result, else rounded to nearest (`_div`)."""
    if DM % 10 >= HALF_MATH:
        return _p_div(x, y, DM)
    else:
        return _div(x, y)


@jit
def _h_poly(t, C: tl.constexpr, TERMS: tl.constexpr):
    """C[0] + C[1] t + ... + C[TERMS - 1] t^(TERMS - 1) by Horner's rule, in t's type."""
    p = tl.zeros_like(t) + _c(C[TERMS - 1], t)
    for k in tl.static_range(TERMS - 2, -1, -1):
        p = p * t + _c(C[k], t)
    return p


@jit
def _h_log2_far(x, DM: tl.constexpr):
    """log2(x) away from 1 by lg2.approx; a bfloat16 x below float32's least normal (float16 has none there) is scaled
    by 2^24 first, exactly."""
    if DM % 10 == HALF_BF16:
        sub = x < _c(FLT_MIN, x)
        return _p_log2(tl.where(sub, x * _c(TWO_24, x), x), DM) - tl.where(sub, 24.0, 0.0)
    else:
        return _p_log2(x, DM)


@jit
def _h_log1p_near(t, TERMS: tl.constexpr):
    """log(1 + t) near 0, relative: t (1 - t/2 + t^2/3 - ...), TERMS terms; -0.0 stays -0.0."""
    return t * _h_poly(t, LOG1P_C, TERMS)


@jit
def _h_log(x, DM: tl.constexpr):
    """log(x): the series of log(1 + t) at t = x - 1 (exact) where |t| <= 1/16 (log(x) there is t's size, so an
    absolute error would be a large relative one), lg2.approx times ln 2 elsewhere (|log x| > 0.06)."""
    t = x - 1.0
    return tl.where(tl.abs(t) <= _c(LOG_NEAR_ONE, t), _h_log1p_near(t, LOG_TERMS), _h_log2_far(x, DM) * _c(LN2, x))


@jit
def _h_log2(x, DM: tl.constexpr):
    """log2(x), as `_h_log`: the series times log2(e) near 1, lg2.approx elsewhere."""
    t = x - 1.0
    return tl.where(tl.abs(t) <= _c(LOG_NEAR_ONE, t), _h_log1p_near(t, LOG_TERMS) * _c(LOG2E, t), _h_log2_far(x, DM))


@jit
def _h_log1p(t, DM: tl.constexpr):
    """log(1 + t): the series where |t| <= 1/8, else log of u = 1 + t (rounded: a relative 2^-24 of u, at most
    2^-21 of |log u| > 0.11 there; u is 0 or at least 2^-24, never below float32's least normal)."""
    u = 1.0 + t
    return tl.where(tl.abs(t) <= _c(LOG1P_AT, t), _h_log1p_near(t, LOG1P_TERMS), _p_log2(u, DM) * _c(LN2, u))


@jit
def _h_expm1(x, DM: tl.constexpr):
    """e^x - 1: x (1 + x/2 + x^2/6 + ...) where |x| <= 1/4, else exp(x) - 1 (|e^x - 1| > 0.22 there, at most 4.5
    times the error of e^x); -0.0 stays -0.0, -inf gives -1."""
    near = x * _h_poly(x, EXPM1_C, 5)
    return tl.where(tl.abs(x) <= _c(EXPM1_AT, x), near, _p_exp(x, DM) - 1.0)


@jit
def _h_sigmoid(x, DM: tl.constexpr):
    """1 / (1 + e) for x >= 0, e / (1 + e) for x < 0, e = exp(-|x|) (`_p_div`: 1 + e lies in [1, 2]); e itself
    below x = -20, where 1 + e is 1 in float32 (and e may be subnormal)."""
    e = _p_exp(-tl.abs(x), DM)
    q = _p_div(tl.where(x >= 0, 1.0, e), 1.0 + e, DM)
    return tl.where(x < -20.0, e, q)


@jit
def _h_softplus(x, DM: tl.constexpr):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), the log1p of a value in (0, 1]."""
    return tl.maximum(x, 0.0) + _h_log1p(_p_exp(-tl.abs(x), DM), DM)


# sin and cos of a float16 x (|x| <= 65504), one polynomial each: x (+ pi/2 for cos) = k pi + r, k = rint(x / pi
# (+ 1/2)) < 2^15, |r| <= pi/2 (and 2^-8 more from rounding x / pi), sin x = (-1)^k sin r. r from pi in two float32
# parts (Cody and Waite): x - m P1 (m = k, or k - 1/2 for cos) is exact where |r| < 1 (x and m P1 are multiples of
# 2^-24), the second part one fma, so r keeps its relative accuracy where x lies next to a zero (sin x then as small as
# r): the part left out, pi - P1 - P2 = -3.4e-15, costs m times that, below 7.2e-11, 2^-19.7 of the least normal
# float16. sin r by its Taylor series: 6 terms leave (pi/2 + 2^-8)^13 / 13! = 2^-24 of sin r.
# (The parity of k by floor(k / 2) in float32: no float-to-integer conversion of an infinite or NaN x's k.)
# tan takes the quarter-period reduction: x = j pi/2 + r, |r| <= pi/4 (+ 2^-8), tan x = tan r, or -1 / tan r where j
# is odd (one reciprocal, `_p_div`), tan r = r P(r^2), P of degree 5 fitted to tan r / r
# (`benchmarks/fit_pointwise.py`: within 2^-21.9 relative in float64, 2^-21.2 in float32 with r^2 and r P rounded; a
# test holds the bound).
# A bfloat16 x (up to 3.4e38) keeps CUDA's reduction.
INV_PI = tl.constexpr(0.3183098861837907)
PI_1 = tl.constexpr(3.1415927410125732)  # float32(pi)
PI_2 = tl.constexpr(-8.742277657347586e-08)  # float32(pi - PI_1)
SIN6_C = tl.constexpr(_series(lambda k: Fraction((-1) ** k, math.factorial(2 * k + 1)), 6))
TWO_OVER_PI = tl.constexpr(0.6366197723675814)
PIO2_1 = tl.constexpr(1.5707963705062866)  # float32(pi/2)
PIO2_2 = tl.constexpr(-4.371138828673793e-08)  # float32(pi/2 - PIO2_1)
TAN_P = tl.constexpr(
    (
        0.9999997504827526,
        0.33336137869265675,
        0.13282214563393868,
        0.057321322866205074,
        0.012246428866582082,
        0.02059146183290154,
    )
)


@jit
def _m_rint(x, DM: tl.constexpr):
    """x rounded half to even, exact: on an NVIDIA GPU one instruction (cvt.rni), else `_rint`."""
    if DM > 0 and DM < EMULATED:
        return libdevice.rint(x)
    else:
        return _rint(x)


@jit
def _h_reduce(x, m, P1: tl.constexpr, P2: tl.constexpr):
    """x - m P, P in two float32 parts (Cody and Waite: PI_1 + PI_2 within 3.4e-15 of pi, PIO2_1 + PIO2_2 within
    half that of pi/2): the first product's difference exact where it is small, the second one fma."""
    r = tl.fma(m, -_c(P1, x), x)
    return tl.fma(m, -_c(P2, x), r)


@jit
def _h_odd(k):
    """k (an integer-valued float32, or infinite or NaN: False) is odd."""
    h = k * 0.5
    return h != tl.floor(h)


@jit
def _h_sin_or_cos(x, COS: tl.constexpr, DM: tl.constexpr):
    """sin x, or cos x (COS), of a float16 x in float32 (see above); NaN for an infinite or NaN x; sin(-0.0) = -0.0."""
    if COS:
        k = _m_rint(x * _c(INV_PI, x) + 0.5, DM)
        m = k - 0.5
    else:
        k = _m_rint(x * _c(INV_PI, x), DM)
        m = k
    r = _h_reduce(x, m, PI_1, PI_2)
    s = r * _h_poly(r * r, SIN6_C, 6)
    s = tl.where(_h_odd(k), -s, s)
    if COS:
        return s
    else:
        return tl.where(x == 0.0, x, s)


# erf of a 16-bit result: x times erf's Taylor series in x^2 (2/sqrt(pi) (-1)^k / (k! (2k + 1)), rounded once) where
# |x| < 1/4, 4 terms (the next, 2^-25.6 of the result, left out); past it 1 - erfc(|x|) with x's sign, erfc(a) as
# 2^Q(a), Q a polynomial of degree 6 fitted to log2 erfc on [1/4, 4] (`benchmarks/fit_pointwise.py`: least squares
# weighted by erfc, reweighted towards the largest errors, against mpmath): 2^Q is within 2^-24.9 of erfc there in
# float64 and 2^-23.4 in float32 (`tests/kernels/test_pointwise_half.py` checks the bound on 4001 points), one
# exponential and no division. Past 4 it is 0: erfc(4) = 1.5e-8 (2^-26) leaves erf at 1 in float32.
ERF_SERIES_AT = tl.constexpr(0.25)
ERF_C = tl.constexpr(
    tuple(2.0 / math.sqrt(math.pi) * float(Fraction((-1) ** k, math.factorial(k) * (2 * k + 1))) for k in range(4))
)
ERFC_AT_MOST = tl.constexpr(4.0)
ERFC_Q = tl.constexpr(
    (
        2.1359696740219647e-05,
        -1.6281669294201102,
        -0.917169187295804,
        -0.15160930267531364,
        0.03271269279116861,
        -0.004488028100251691,
        0.00028297231095354735,
    )
)


@jit
def _h_erfc_far(a, DM: tl.constexpr):
    """erfc(a) for a >= 1/4 (above): within 2^-23.4, absolute; 0 past 4 (erfc(4) = 1.5e-8: gelu(-inf) = -inf * 0 is
    NaN, as torch's formula gives); NaN kept."""
    return tl.where(a > _c(ERFC_AT_MOST, a), 0.0, _p_exp2(_h_poly(a, ERFC_Q, 7), DM))


@jit
def _h_erf(x, DM: tl.constexpr):
    """erf x (above); -0.0 and NaN kept."""
    a = tl.abs(x)
    far = 1.0 - _h_erfc_far(a, DM)
    return tl.where(a < _c(ERF_SERIES_AT, a), x * _h_poly(x * x, ERF_C, 4), tl.where(x < 0, -far, far))


@jit
def _h_gelu(x, DM: tl.constexpr):
    """0.5 x (1 + erf(u)), u = x / sqrt 2, with 1 + erf(u) as erfc(-u) where u <= -1/4 and 2 - erfc(u) where u >= 1/4
    (`_h_erfc_far`), 1 + u S(u^2) between: the oracle's scale is 0.5 |x| (1 + |erf u|), and each form is within
    2^-22 of 1 + erf(u) there."""
    u = x * _c(INV_SQRT2, x)
    a = tl.abs(u)
    e = _h_erfc_far(a, DM)
    near = 1.0 + u * _h_poly(u * u, ERF_C, 4)
    return 0.5 * x * tl.where(a < _c(ERF_SERIES_AT, a), near, tl.where(x < 0, e, 2.0 - e))


# atan2 of float16 operands: atan(t), t = min(|x|, |y|) / max(|x|, |y|) in [0, 1] (`_p_div`), by Abramowitz and
# Stegun 4.4.49 (Hastings): t (1 + a2 t^2 + ... + a16 t^16), absolute error at most 2e-8 (1.8e-8 of atan t at most,
# relative, checked here over [0, 1]); then pi/2 - it where |y| > |x|, pi - it where x is negative (-0.0 included),
# y's sign. bfloat16 operands (up to 3.4e38 and below 2^-126, past the reciprocal's range) keep CUDA's.
ATAN_C = tl.constexpr(
    (
        1.0,
        -0.3333314528,
        0.1999355085,
        -0.1420889944,
        0.1065626393,
        -0.0752896400,
        0.0429096138,
        -0.0161657367,
        0.0028662257,
    )
)


@jit
def _h_atan2(y, x, DM: tl.constexpr):
    """atan2(y, x) of float16 values in float32 (above), with C99's special values: both zero gives +-0 or +-pi, an
    infinite operand 0, pi/2 or pi (pi/4 and 3 pi/4 where both are), NaN where either is."""
    ay = tl.abs(y)
    ax = tl.abs(x)
    hi = tl.maximum(ay, ax)
    # an infinite hi and finite lo: 0; a hi below float32's least normal (a Python scalar, the other operand 0 or
    # as small) scaled with lo by 2^24 first, for the ftz reciprocal
    up = tl.where(hi < _c(FLT_MIN, hi), _c(TWO_24, hi), 1.0)
    t = _p_div(tl.minimum(ay, ax) * up, tl.where(hi == 0.0, 1.0, hi * up), DM)
    a = t * _h_poly(t * t, ATAN_C, 9)
    r = tl.where(ay > ax, _c(HALF_PI, a) - a, a)
    r = tl.where((ay == float("inf")) & (ax == float("inf")), _c(QUARTER_PI, a), r)
    r = tl.where(_sign_bit(x), _c(PI, a) - r, r)
    r = tl.where(_isnan(x) | _isnan(y), _nan(r), r)
    return tl.where(_sign_bit(y), -r, r)


@jit
def _h_tan(x, DM: tl.constexpr):
    """tan x of a float16 x in float32 (see above); NaN for an infinite or NaN x; tan(-0.0) = -0.0."""
    j = _m_rint(x * _c(TWO_OVER_PI, x), DM)
    r = _h_reduce(x, j, PIO2_1, PIO2_2)
    t = r * _h_poly(r * r, TAN_P, 6)
    t = tl.where(_h_odd(j), _p_div(tl.full(t.shape, -1.0, t.dtype), t, DM), t)
    return tl.where(x == 0.0, x, t)


@jit
def _h_tanh(x, DM: tl.constexpr):
    """tanh(x): x times tanh's series in x^2 (TANH_C, exact) where |x| < 1/4, 4 terms (each next below (2x/pi)^2 =
    0.025 of the last: 2^-21 left); else 1 - 2 / (e^2|x| + 1) with x's sign (at |x| = 1/4 the quotient's relative
    error, 2^-21, is 3 times that of tanh; e^2|x| past 2^126 gives 1); -0.0 and NaN kept."""
    a = tl.abs(x)
    far = 1.0 - _p_div(tl.full(a.shape, 2.0, a.dtype), _p_exp(2.0 * a, DM) + 1.0, DM)
    return tl.where(a < 0.25, x * _h_poly(x * x, TANH_C, 4), tl.where(x < 0, -far, far))


@jit
def _h_mish(x, DM: tl.constexpr):
    """x tanh(softplus(x)) = x n / (n + 2), n = e^x (e^x + 2) (tanh(log(1 + e^x)) written out); x itself past x = 20
    (the quotient is 1 in float32), x e^x below x = -20 (it is e^x there, which may be subnormal)."""
    e = _p_exp(x, DM)
    n = e * (e + 2.0)
    r = x * _p_div(n, n + 2.0, DM)  # n + 2 lies in [2, 2.4e17] where r is kept
    return tl.where(x > 20.0, x, tl.where(x < -20.0, x * e, r))


# --- the device library on the GPU (DM: DEVICE_MATH), the helpers above under the interpreter -------------------------
# `libdevice.f` is Triton's spelling (3.6 and 3.9) of the backend's library function for the argument's type: CUDA's
# __nv_expf / __nv_exp, __nv_logf, __nv_tanhf, ... (the accurate ones: never the .approx instructions tl.exp, tl.log,
# tl.sin and tl.cos lower to in float32), ROCm's ocml on AMD targets.
@jit
def _m_exp(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _p_exp(x, DM)  # ex2.approx (x log2 e) on the GPU: below 2^-17 of e^x over a 16-bit type's range
    elif DM:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@jit
def _m_exp2(x, DM: tl.constexpr):
    if DM:
        return libdevice.exp2(x)
    else:
        return tl.exp2(x)


@jit
def _m_log(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_log(x, DM)
    elif DM:
        return libdevice.log(x)
    else:
        return tl.log(x)


@jit
def _m_log2(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_log2(x, DM)
    elif DM:
        return libdevice.log2(x)
    else:
        return tl.log2(x)


@jit
def _m_sin(x, DM: tl.constexpr):
    if DM % 10 == HALF_MATH:
        return _h_sin_or_cos(x, False, DM)
    elif DM:
        return libdevice.sin(x)
    else:
        return tl.sin(x)


@jit
def _m_cos(x, DM: tl.constexpr):
    if DM % 10 == HALF_MATH:
        return _h_sin_or_cos(x, True, DM)
    elif DM:
        return libdevice.cos(x)
    else:
        return tl.cos(x)


@jit
def _m_tan(x, DM: tl.constexpr):
    if DM % 10 == HALF_MATH:
        return _h_tan(x, DM)
    elif DM:
        return libdevice.tan(x)
    else:
        return _div(tl.sin(x), tl.cos(x))


@jit
def _m_erf(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_erf(x, DM)
    elif DM:
        return libdevice.erf(x)
    else:
        return tl.math.erf(x)


@jit
def _m_expm1(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_expm1(x, DM)
    elif DM:
        return libdevice.expm1(x)
    else:
        return _expm1(x)


@jit
def _m_log1p(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_log1p(x, DM)
    elif DM:
        return libdevice.log1p(x)
    else:
        return _log1p(x)


@jit
def _m_tanh(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_tanh(x, DM)
    elif DM:
        return libdevice.tanh(x)
    else:
        return _tanh(x)


@jit
def _m_sigmoid(x, DM: tl.constexpr):
    """`_sigmoid`'s form (no overflow on either side) with the device library's exp."""
    if DM % 10 >= HALF_MATH:
        return _h_sigmoid(x, DM)
    elif DM:
        e = libdevice.exp(-tl.abs(x))
        return _div(tl.where(x >= 0, 1.0, e), 1.0 + e)
    else:
        return _sigmoid(x)


@jit
def _m_softplus(x, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_softplus(x, DM)
    elif DM:
        return tl.maximum(x, 0.0) + libdevice.log1p(libdevice.exp(-tl.abs(x)))
    else:
        return _softplus(x)


@jit
def _m_atan2(y, x, DM: tl.constexpr):
    """CUDA's atan2 and pow have C99's special values (CUDA C++ Programming Guide, Mathematical Functions), as
    `_atan2` and `_float_pow` do."""
    if DM % 10 == HALF_MATH:
        return _h_atan2(y, x, DM)
    elif DM:
        return libdevice.atan2(y, x)
    else:
        return _atan2(y, x)


@jit
def _m_pow(x, e, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _float_pow(x, e, DM)
    elif DM:
        return libdevice.pow(x, e)
    else:
        return _float_pow(x, e, DM)


@jit
def _no_guard(x, y, z):
    """No refusal: no lane is bad."""
    return x != x, x


# ======================================================================================================================
# op bodies: body(x, y, z, p0, p1, p2, i) -> result (i: the element's flat index in the output, int64)
# ======================================================================================================================
@jit
def _b_copy(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x


@jit
def _b_fill(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return tl.where(i >= 0, p0, p0)


@jit
def _b_arange(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return p0 + i.to(p0.dtype) * p2


@jit
def _b_linspace(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """torch's: start + i step over the first half, end - (steps - 1 - i) step over the second (steps = p2)."""
    steps = p2
    step = _div(p1 - p0, tl.maximum(steps - 1.0, 1.0))
    fi = i.to(p0.dtype)
    lo = p0 + fi * step
    hi = p1 - (steps - 1.0 - fi) * step
    return tl.where(fi < steps * 0.5, lo, hi)


@jit
def _b_abs(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype == tl.int1:
        return x
    else:
        if x.dtype.is_floating():
            return tl.abs(x)
        else:
            return tl.where(x < 0, 0 - x, x).to(x.dtype)


@jit
def _b_neg(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return -x
    else:
        return (0 - x).to(x.dtype)


@jit
def _b_exp(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_exp(x, DM)


@jit
def _b_exp2(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_exp2(x, DM)


@jit
def _b_expm1(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_expm1(x, DM)


@jit
def _b_log(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_log(x, DM)


@jit
def _b_log2(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_log2(x, DM)


@jit
def _b_log1p(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_log1p(x, DM)


@jit
def _b_sqrt(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _sqrt(x)


@jit
def _b_rsqrt(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if DM % 10 == HALF_BF16:
        # rsqrt.approx; a bfloat16 x below float32's least normal scaled by 2^24 first, the result by 2^12 after
        sub = x < _c(FLT_MIN, x)
        return _p_rsqrt(tl.where(sub, x * _c(TWO_24, x), x), DM) * tl.where(sub, 4096.0, 1.0)
    elif DM % 10 == HALF_MATH:
        return _p_rsqrt(x, DM)
    else:
        return _div(tl.full(x.shape, 1.0, x.dtype), _sqrt(x))


@jit
def _b_reciprocal(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return 1.0 / x  # div.full: a few float32 ulps
    else:
        return _div(tl.full(x.shape, 1.0, x.dtype), x)


@jit
def _b_sin(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_sin(x, DM)


@jit
def _b_cos(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_cos(x, DM)


@jit
def _b_tan(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_tan(x, DM)


@jit
def _b_tanh(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_tanh(x, DM)


@jit
def _b_erf(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_erf(x, DM)


@jit
def _b_sign(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype == tl.int1:
        return x
    else:
        if x.dtype.is_floating():
            # torch's signum, (0 < x) - (x < 0): sign(NaN) is 0
            return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)
        else:
            return ((x > 0).to(x.dtype) - (x < 0).to(x.dtype)).to(x.dtype)


@jit
def _b_floor(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return tl.floor(x)
    else:
        return x


@jit
def _b_ceil(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return tl.ceil(x)
    else:
        return x


@jit
def _b_round(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return _m_rint(x, DM)
    else:
        return x


@jit
def _b_trunc(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        if DM > 0 and DM < EMULATED:
            return libdevice.trunc(x)  # exact: one instruction (cvt.rzi) on an NVIDIA GPU, the sign of a zero kept
        else:
            return _trunc(x)
    else:
        return x


@jit
def _b_sigmoid(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_sigmoid(x, DM)


# --- activations ------------------------------------------------------------------------------------------------------
@jit
def _b_relu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return tl.where(x > 0, x, tl.where(_isnan(x), x, 0.0))
    else:
        return tl.where(x > 0, x, 0).to(x.dtype)


@jit
def _b_gelu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_gelu(x, DM)
    else:
        return 0.5 * x * (1.0 + _m_erf(x * _c(INV_SQRT2, x), DM))


@jit
def _b_gelu_tanh(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """0.5 x (1 + tanh(t)), t = sqrt(2/pi) (x + 0.044715 x^3), as x / (1 + exp(-2t)): the same value, with no
    cancellation of 1 + tanh for x << 0."""
    t = _c(SQRT_2_OVER_PI, x) * (x + _c(GELU_TANH_C, x) * x * x * x)
    return _q(x, 1.0 + _m_exp(-2.0 * t, DM), DM)


@jit
def _b_silu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x * _m_sigmoid(x, DM)


@jit
def _b_mish(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if DM % 10 >= HALF_MATH:
        return _h_mish(x, DM)
    else:
        return x * _m_tanh(_m_softplus(x, DM), DM)


@jit
def _b_elu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return tl.where(x > 0, x, p0 * _m_expm1(x, DM))


@jit
def _b_celu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return tl.where(x > 0, x, p0 * _m_expm1(_q_scalar(x, p0, DM), DM))


@jit
def _b_selu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _c(SELU_SCALE, x) * tl.where(x > 0, x, _c(SELU_ALPHA, x) * _m_expm1(x, DM))


@jit
def _b_leaky_relu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return tl.where(x > 0, x, x * p0)


@jit
def _sixth(x, DM: tl.constexpr):
    """x / 6: for a half-precision result x times float32(1/6), as torch's CUDA kernels write it (two roundings of
    2^-24, far inside a 16-bit tolerance; the quotient rounded to nearest costs 20 instructions an element, and an
    op reading and writing 16-bit values was held to that rate), else rounded to nearest."""
    if DM % 10 >= HALF_MATH:
        return x * _c(1.0 / 6.0, x)
    else:
        return _div(x, tl.full(x.shape, 6.0, x.dtype))


@jit
def _b_hardsigmoid(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """torch's min(max(x + 3, 0), 6) / 6; std::max and std::min return a NaN first argument, Triton's maximum and
    minimum drop it (fmax): NaN is kept explicitly."""
    r = _sixth(tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0), DM)
    return tl.where(_isnan(x), x, r)


@jit
def _b_hardswish(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """x min(max(x + 3, 0), 6) / 6: in torch's order (float64 results overflow past max / 6 as torch's do), and for a
    half-precision result the clamp divided first (x * 6 overflows float32 for a bfloat16 x past 5.7e37, where
    hardswish(x) = x)."""
    clamp = tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0)
    if DM % 10 >= HALF_MATH:
        return x * _sixth(clamp, DM)
    else:
        return _sixth(x * clamp, DM)


@jit
def _b_softplus(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """log(1 + exp(beta x)) / beta, x itself where beta x > threshold (p0 beta, p1 threshold)."""
    bx = x * p0
    return tl.where(bx > p1, x, _q_scalar(_m_softplus(bx, DM), p0, DM))


@jit
def _b_log_sigmoid(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return tl.minimum(x, 0.0) - _m_log1p(_m_exp(-tl.abs(x), DM), DM)


@jit
def _b_threshold(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return tl.where(x <= p0, p1, x)


@jit
def _b_glu(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x * _m_sigmoid(y, DM)


# --- binary -----------------------------------------------------------------------------------------------------------
@jit
def _b_add(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype == tl.int1:
        return x | (y & (p0 != 0))
    else:
        if x.dtype.is_floating():
            # one rounding, as torch's a + alpha * b compiles on CUDA (contracted to an fma): alpha * b neither
            # rounds nor overflows on its own
            return tl.fma(p0, y, x)
        else:
            return (x + p0 * y).to(x.dtype)


@jit
def _b_sub(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return tl.fma(-p0, y, x)  # one rounding, as add
    else:
        return (x - p0 * y).to(x.dtype)


@jit
def _b_mul(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype == tl.int1:
        return x & y
    else:
        if x.dtype.is_floating():
            return x * y
        else:
            return (x * y).to(x.dtype)


@jit
def _b_div(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _div(x, y)


@jit
def _div_guard(x, y, z):
    """Integer division by zero is refused (torch raises ZeroDivisionError on the CPU); float division never is."""
    return y == 0, y.to(tl.int64)


@jit
def _m_fmod(a, b, DM: tl.constexpr):
    """C's fmod, exact either way: the device library's (its error bound is 0 ulp, float32 and float64 alike, as an
    IEEE 754 remainder must be) on the GPU, the long division above under the interpreter; float16 operands on the
    GPU `_h_fmod`, exact too."""
    if DM % 10 == HALF_MATH:
        return _h_fmod(a, b, DM)
    elif DM:
        return libdevice.fmod(a, b)
    else:
        return _fmod_float(a, b)


FMOD_FAST_BELOW = tl.constexpr(4194304.0)  # 2^22


@jit
def _h_fmod(a, b, DM: tl.constexpr):
    """fmod of float16 values in float32, exact and with no branch where |a| < 2^22 |b|: q = floor(|a| / |b|) from one
    reciprocal (`_p_div`: within 2^-22.4, so q is the quotient's floor or one off), r = |a| - q |b| by one fma (exact:
    r lies in (-|b|, 2 |b|) on |b|'s grid of 2^11 steps, or is |a| itself), moved into [0, |b|) by one add of -|b|
    or |b|, a's sign. Elsewhere (the quotient past 2^22, b = 0, a infinite) CUDA's fmod, given 0 and 1 in the other
    lanes, where it leaves at once (|0| < |1|), in a block that holds such a lane only; under the interpreter the long
    division (`_fmod_float`)."""
    ax = tl.abs(a)
    ay = tl.abs(b)
    # (and a divisor below float32's least normal, a Python scalar: the ftz reciprocal would read it as 0)
    big = (ax >= ay * _c(FMOD_FAST_BELOW, ay)) | (ay < _c(FLT_MIN, ay))
    q = tl.floor(_p_div(ax, ay, DM))
    r = tl.where(q == 0.0, ax, tl.fma(-q, ay, ax))  # an infinite b: 0 times it is NaN
    r = tl.where(r < 0.0, r + ay, r)
    r = tl.where(r >= ay, r - ay, r)
    r = tl.where(_sign_bit(a), -r, r)
    # a block with a lane off the fast path (none in most blocks, whose branch is then skipped)
    if tl.max(tl.where(big, 1, 0), axis=None) != 0:
        big_a = tl.where(big, a, 0.0)
        big_b = tl.where(big, b, 1.0)
        if DM < EMULATED:
            slow = libdevice.fmod(big_a, big_b)
        else:
            slow = _fmod_float(big_a, big_b)
        r = tl.where(big, slow, r)
    return r


FLOOR_DIV_FAST_BELOW = tl.constexpr(536870912.0)  # 2^29


@jit
def _floor_div_float(x, y, DM: tl.constexpr):
    """Floor division of floats. float64 on the GPU (float32 operands compute in float64 there): below a 2^29
    quotient, floor(q) of q = x / y correctly rounded, one less where q is an integer above the exact quotient (x - q y,
    exact by one fma since q is x / y rounded to nearest, has the sign opposite to y's; no integer lies between the
    exact quotient and a q that is not one); elsewhere (a quotient past 2^29, y zero or infinite, x infinite or NaN:
    none in most blocks, whose branch is then skipped) torch's formula, `_floor_div_torch`. Otherwise that formula.
    Below 2^29 both are the floor of the exact quotient: for float32 operands torch's numerator x - fmod(x, y) = k y
    is exact there (k below 2^29, y of 24 bits), and for float64 ones the formula's nearest-integer step undoes its
    rounding (`tests/kernels/test_pointwise_floor_div.py` compares the two paths bit for bit, both dtypes)."""
    if x.dtype == tl.float64 and DM % 10 == 1:
        q = x / y
        fast = (tl.abs(q) < FLOOR_DIV_FAST_BELOW) & (tl.abs(y) < float("inf"))
        f = tl.floor(q)
        r = tl.fma(-f, y, x)
        fl = tl.where((q == f) & (r != 0.0) & ((r < 0.0) != (y < 0.0)), f - 1.0, f)
        # a block with a lane off the fast path: the formula for those lanes
        if tl.max(tl.where(fast, 0, 1), axis=None) != 0:
            if DM < EMULATED:
                fl = tl.where(fast, fl, _floor_div_torch(x, y, DM))
            else:
                fl = tl.where(fast, fl, _floor_div_torch(x, y, 0))
        return fl
    else:
        return _floor_div_torch(x, y, DM)


@jit
def _floor_div_torch(x, y, DM: tl.constexpr):
    """torch's floor division of floats: (x - fmod(x, y)) / y, moved down by one where the remainder's sign differs
    from y's, then the nearest integer to that (x / y where y is 0)."""
    mod = _m_fmod(x, y, DM)
    div = _div(x - mod, y)
    div = tl.where((mod != 0) & ((y < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    # where the quotient is 0 or y is 0, x / y's value is its sign's (x's xor y's, zeros included): no second division
    neg = _sign_bit(x) != _sign_bit(y)
    zero = tl.zeros_like(div)
    fl = tl.where(div == 0, tl.where(neg, -zero, zero), fl)
    inf = zero + float("inf")
    by_zero = tl.where((x == 0) | _isnan(x), _nan(x), tl.where(neg, -inf, inf))
    return tl.where(y == 0, by_zero, fl)


@jit
def _b_div_trunc(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return _trunc(_div(x, y))
    else:
        q, r = _int_div_parts(x, y)
        return q


@jit
def _b_div_floor(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return _floor_div_float(x, y, DM)
    else:
        q, r = _int_div_parts(x, y)
        return tl.where((r != 0) & ((r < 0) != (y < 0)), q - 1, q).to(x.dtype)


@jit
def _b_remainder(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        r = _m_fmod(x, y, DM)
        return tl.where((r != 0) & ((y < 0) != (r < 0)), r + y, r)
    else:
        q, r = _int_div_parts(x, y)
        return tl.where((r != 0) & ((r < 0) != (y < 0)), r + y, r).to(x.dtype)


@jit
def _b_fmod(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return _m_fmod(x, y, DM)
    else:
        q, r = _int_div_parts(x, y)
        return r


@jit
def _b_pow(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return _m_pow(x, y, DM)
    else:
        if x.dtype == tl.int1:
            return x | (y == 0)
        else:
            return _int_pow(x, y, x.dtype.primitive_bitwidth)


@jit
def _b_maximum(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype == tl.int1:
        return x | y
    else:
        if x.dtype.is_floating():
            return tl.where(_isnan(x) | _isnan(y), x + y, tl.maximum(x, y))
        else:
            return tl.maximum(x, y)


@jit
def _b_minimum(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype == tl.int1:
        return x & y
    else:
        if x.dtype.is_floating():
            return tl.where(_isnan(x) | _isnan(y), x + y, tl.minimum(x, y))
        else:
            return tl.minimum(x, y)


@jit
def _b_atan2(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return _m_atan2(x, y, DM)


@jit
def _b_hypot(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if DM % 10 == HALF_MATH:
        # float16 operands: their squares are exact in float32 and their sum cannot overflow; one fma, one sqrt
        h = tl.sqrt(tl.fma(x, x, y * y))
    else:
        ax = tl.abs(x)
        ay = tl.abs(y)
        hi = tl.maximum(ax, ay)
        lo = tl.minimum(ax, ay)
        r = _div(lo, tl.where(hi == 0, 1.0, hi))
        h = hi * _sqrt(1.0 + r * r)
        h = tl.where(hi == 0, hi, h)
    h = tl.where(_isnan(x) | _isnan(y), _nan(x), h)
    return tl.where((tl.abs(x) == float("inf")) | (tl.abs(y) == float("inf")), float("inf"), h)


@jit
def _b_lerp(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """torch's: start + w (end - start) for |w| < 0.5, end - (end - start)(1 - w) otherwise (w: z)."""
    d = y - x
    return tl.where(tl.abs(z) < 0.5, x + z * d, y - d * (1.0 - z))


@jit
def _b_addcdiv(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x + p0 * _div(y, z)


@jit
def _b_addcmul(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        # torch's order: input + value (t1 t2), the product first (value t1 could underflow or overflow where the
        # product does not), fused with the sum as torch's explicit fma is; value 1 fuses the product itself
        return tl.where(p0 == 1, tl.fma(y, z, x), tl.fma(p0, y * z, x))
    else:
        if x.dtype == tl.int1:
            return x | (y & z & (p0 != 0))
        else:
            return (x + p0 * y * z).to(x.dtype)


# --- comparisons and logic --------------------------------------------------------------------------------------------
@jit
def _b_eq(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x == y


@jit
def _b_ne(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x != y


@jit
def _b_lt(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x < y


@jit
def _b_le(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x <= y


@jit
def _b_gt(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x > y


@jit
def _b_ge(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x >= y


@jit
def _b_logical_and(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return (x != 0) & (y != 0)


@jit
def _b_logical_or(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return (x != 0) | (y != 0)


@jit
def _b_logical_xor(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return (x != 0) != (y != 0)


@jit
def _b_logical_not(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x == 0


@jit
def _b_bitwise_and(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x & y


@jit
def _b_bitwise_or(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x | y


@jit
def _b_bitwise_xor(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    return x ^ y


@jit
def _b_bitwise_not(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype == tl.int1:
        return x == 0
    else:
        return ~x


@jit
def _b_left_shift(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """x << y; an amount < 0 or >= the width gives 0 (torch's)."""
    W: tl.constexpr = x.dtype.primitive_bitwidth
    ok = (y >= 0) & (y < W)
    return tl.where(ok, x << tl.where(ok, y, 0).to(x.dtype), 0).to(x.dtype)


@jit
def _b_right_shift(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """x >> y (arithmetic for signed types); an amount < 0 or >= the width gives the sign fill (torch's)."""
    W: tl.constexpr = x.dtype.primitive_bitwidth
    ok = (y >= 0) & (y < W)
    if x.dtype.is_int_unsigned():
        fill = tl.zeros_like(x)
    else:
        fill = tl.where(x < 0, tl.full(x.shape, -1, x.dtype), tl.zeros_like(x))
    return tl.where(ok, x >> tl.where(ok, y, 0).to(x.dtype), fill).to(x.dtype)


# --- predicates and selection -----------------------------------------------------------------------------------------
@jit
def _b_isnan(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return _isnan(x)
    else:
        return x != x


@jit
def _b_isinf(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return _isinf(x)
    else:
        return x != x


@jit
def _b_isfinite(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    if x.dtype.is_floating():
        return (x == x) & ~_isinf(x)
    else:
        return x == x


@jit
def _b_nan_to_num(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """NaN -> p0, +inf -> p1, -inf -> p2; integers unchanged."""
    if x.dtype.is_floating():
        r = tl.where(x == float("inf"), p1, tl.where(x == float("-inf"), p2, x))
        return tl.where(_isnan(x), p0, r)
    else:
        return x


@jit
def _b_clamp(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """min(max(x, p0), p1); NaN stays NaN (torch's)."""
    r = tl.minimum(tl.maximum(x, p0), p1)
    if x.dtype.is_floating():
        return tl.where(_isnan(x), x, r)
    else:
        return r


@jit
def _b_clamp_min(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    r = tl.maximum(x, p0)
    if x.dtype.is_floating():
        return tl.where(_isnan(x), x, r)
    else:
        return r


@jit
def _b_clamp_max(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    r = tl.minimum(x, p0)
    if x.dtype.is_floating():
        return tl.where(_isnan(x), x, r)
    else:
        return r


@jit
def _b_where(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """x: the condition; y where it holds, z elsewhere."""
    return tl.where(x != 0, y, z)


@jit
def _b_masked_fill(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """x where the mask y is false, p0 where it holds."""
    return tl.where(y != 0, p0, x)


@jit
def _cast_guard(x, y, z):
    """A float to integer cast of NaN, an infinity or a value outside the target's range is refused: the value's
    class (1 NaN, 2 above the range, 3 below it). The range is fixed by p-free bounds the launch passes as y and z
    (the smallest value above the range and the largest below it, both exact in float64)."""
    if x.dtype.is_floating():
        above = x >= y
        below = x <= z
        bad = _isnan(x) | above | below
        code = tl.where(_isnan(x), 1, tl.where(above, 2, 3)).to(tl.int64)
        return bad, code
    else:
        return x != x, x.to(tl.int64)


@jit
def _b_cast(x, y, z, p0, p1, p2, i, DM: tl.constexpr):
    """x itself: the conversion to the output's dtype is the store's (floats to integers truncate toward zero)."""
    return x


# ======================================================================================================================
# the kernel
# ======================================================================================================================
@jit
def _operand(ptr, off, ok, v, MODE: tl.constexpr, VIA: tl.constexpr, TO: tl.constexpr, UPCAST: tl.constexpr):
    """One operand's values in the compute type TO: a tensor's (MODE 0) loaded in its dtype and converted to the
    common dtype VIA first (torch rounds every operand to it), or a scalar's (MODE 1: float64 bits, 2: an int64)."""
    if MODE == 0:
        raw = tl.load(ptr + off, mask=ok, other=0)
        if UPCAST and raw.dtype == tl.bfloat16:
            # the interpreter's bfloat16 -> float32 conversion loses subnormals: widen the bits instead (exact)
            raw = (raw.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
            if tl.bfloat16 == VIA:
                return raw.to(TO)
        if tl.int1 == VIA:
            return raw != 0
        else:
            if raw.dtype != VIA:
                if tl.bfloat16 == VIA:
                    raw = narrow(raw.to(tl.float32), VIA, UPCAST)
                elif raw.dtype == tl.int1:
                    raw = raw.to(tl.int8).to(VIA)
                else:
                    raw = raw.to(VIA)
            return raw.to(TO)
    elif MODE == 1:
        s = tl.full(off.shape, 0.0, tl.float64) + v.to(tl.int64).to(tl.float64, bitcast=True)
        if tl.int1 == TO:
            return s != 0
        return s.to(TO)
    elif MODE == 2:
        s = v.to(tl.int64)
        if tl.int1 == TO:
            return (tl.full(off.shape, 0, tl.int64) + s) != 0
        return (tl.full(off.shape, 0, tl.int64) + s).to(TO)
    else:
        return tl.full(off.shape, 0, TO)


@jit
def _param(v, P_FLOAT: tl.constexpr, TO: tl.constexpr):
    """A scalar parameter in the compute type: passed as float64 bits (P_FLOAT) or as an int64."""
    if P_FLOAT:
        s = v.to(tl.int64).to(tl.float64, bitcast=True)
    else:
        s = v.to(tl.int64)
    if tl.int1 == TO:
        return s != 0
    else:
        return s.to(TO)


@jit
def _to_output(y, DT: tl.constexpr, UPCAST: tl.constexpr):
    """The result in the output's dtype: rounded to nearest even into a float (bfloat16 through `narrow`; a NaN as the
    dtype's one quiet NaN), != 0 into bool, wrapped into an integer (a float result reaches an integer output only
    through `cast`, truncated)."""
    if tl.int1 == DT:
        return y != 0
    else:
        if y.dtype == tl.int1:
            y = y.to(tl.int8)
        if DT.is_floating():
            if not y.dtype.is_floating():
                y = y.to(tl.float64)
            if UPCAST and tl.bfloat16 == DT:
                # the interpreter's float32 -> bfloat16 conversion loses subnormals: store the rounded bits themselves
                bits = y.to(tl.float32).to(tl.uint32, bitcast=True)
                bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
                return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
            else:
                r = narrow(y, DT, UPCAST)
                # one NaN for every kernel and config: a NaN's payload depends on the conversions the compiler chose
                # (float16 -> float64 gave 0x7ff8... in one kernel, 0x7fffffffe... through float32 in another)
                return tl.where(r != r, tl.full(r.shape, float("nan"), DT), r)
        else:
            if y.dtype.is_floating():
                # only a cast reaches here, its refused lanes (NaN, out of range) recorded: they store 0
                y = tl.where((y == y) & (tl.abs(y) < 9.2e18), y, 0.0)
            return y.to(DT)


@jit
def _apply_and_store(
    out_ptr,
    oo,
    ok,
    x,
    y,
    z,
    p0,
    p1,
    p2,
    i,
    fault_ptr,
    BODY: tl.constexpr,
    GUARD: tl.constexpr,
    SITE: tl.constexpr,
    BOUND: tl.constexpr,
    P_FLOAT: tl.constexpr,
    P_TO: tl.constexpr,
    UPCAST: tl.constexpr,
    DEVICE_MATH: tl.constexpr,
):
    """The op on loaded operands, shared by both kernels: lanes GUARD finds bad recorded as fault SITE (0: none) at
    their index i, BODY(x, y, z, p0, p1, p2, i) stored into out_ptr + oo in the output's dtype where ok."""
    if SITE != 0:
        bad, value = GUARD(x, y, z)
        bad = bad & ok
        record_fault_lanes(fault_ptr, SITE, i, value, BOUND, bad)
    r = BODY(x, y, z, _param(p0, P_FLOAT, P_TO), _param(p1, P_FLOAT, P_TO), _param(p2, P_FLOAT, P_TO), i, DEVICE_MATH)
    tl.store(out_ptr + oo, _to_output(r, out_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _dim_step(rest, d, q, oo, ox, oy, oz, so, sx, sy, sz, INDEX32: tl.constexpr, NATIVE: tl.constexpr):
    """One dimension of the index: its index (rest mod d) times each tensor's stride added, rest // d returned. In
    64-bit integers as written; in 32-bit ones (INDEX32: rest, oo.. int32, rest < 2^31) as written in unsigned ones
    (NATIVE: Triton's analysis follows them, d a multiple of 16: a thread's run of elements stays contiguous, so its
    loads are vectors and its division is done once a run), else by `q`, d's divider (`divider`: a multiply-high, an
    add and a shift in place of the integer division CUDA has no instruction for, done for each element)."""
    if INDEX32:
        r = rest.to(tl.uint32)
        if NATIVE:
            du = d.to(tl.uint32)
            quot = (r // du).to(tl.int32)
            i = (r % du).to(tl.int32)
        else:
            magic = (q & 0xFFFFFFFF).to(tl.uint32)
            shift = (q >> 32).to(tl.uint32)
            quot = ((tl.umulhi(r, magic) + r) >> shift).to(tl.int32)
            i = rest - quot * d
    else:
        i = rest % d
        quot = rest // d
    return quot, oo + i * so, ox + i * sx, oy + i * sy, oz + i * sz


@jit(do_not_specialize=["xv", "yv", "zv", "p0", "p1", "p2", "q1", "q2", "q3", "q4", "q5"])
def _map_kernel(
    out_ptr,
    x_ptr,
    y_ptr,
    z_ptr,
    fault_ptr,
    xv,
    yv,
    zv,
    p0,
    p1,
    p2,
    n,
    d1,
    d2,
    d3,
    d4,
    d5,
    q1,
    q2,
    q3,
    q4,
    q5,
    so0,
    so1,
    so2,
    so3,
    so4,
    so5,
    sx0,
    sx1,
    sx2,
    sx3,
    sx4,
    sx5,
    sy0,
    sy1,
    sy2,
    sy3,
    sy4,
    sy5,
    sz0,
    sz1,
    sz2,
    sz3,
    sz4,
    sz5,
    BODY: tl.constexpr,
    GUARD: tl.constexpr,
    SITE: tl.constexpr,
    BOUND: tl.constexpr,
    X_MODE: tl.constexpr,
    Y_MODE: tl.constexpr,
    Z_MODE: tl.constexpr,
    X_VIA: tl.constexpr,
    Y_VIA: tl.constexpr,
    Z_VIA: tl.constexpr,
    X_TO: tl.constexpr,
    Y_TO: tl.constexpr,
    Z_TO: tl.constexpr,
    P_FLOAT: tl.constexpr,
    P_TO: tl.constexpr,
    NDIM: tl.constexpr,
    DENSE: tl.constexpr,
    INDEX32: tl.constexpr,
    NATIVE_DIV: tl.constexpr,
    RAW: tl.constexpr,
    BLOCK: tl.constexpr,
    UPCAST: tl.constexpr,
    DEVICE_MATH: tl.constexpr,
):
    """out[idx] = BODY(x[idx], y[idx], z[idx], p0, p1, p2, flat idx) over the n elements of the output.

    out_ptr, x_ptr, y_ptr, z_ptr: the output and the operands (an unused or scalar operand's pointer is the
    output's, never read). fault_ptr: the device's fault word (`nbxcert.kernels.faults`). xv, yv, zv: a scalar
    operand's value (float64 bits or an int64, X_MODE...); p0, p1, p2: the op's scalar parameters (float64 bits when
    P_FLOAT, else int64), converted to P_TO. n: elements. The index space: NDIM merged dimensions, sizes (d0,) d1..d5
    right-aligned (the outermost's size is implied by n), each tensor's strides in elements so0..so5 (output),
    sx.., sy.., sz.. (0 where broadcast), the outermost dimension's stride in slot 0 and the inner ones right-aligned
    in slots 6 - (NDIM - 1) .. 5. q1..q5: each size's divider (`divider`). DENSE: every tensor is contiguous with the
    output's shape (no index arithmetic). INDEX32: every index and offset below 2^31 (`fits_index32`): the index
    arithmetic in 32-bit integers, each division Triton's own (NATIVE_DIV: the output's rows contiguous and a multiple
    of 16 long) or by its divider; else in 64-bit ones. RAW (`raw_mode`): RAW_COPY, a copy within one dtype, stores x's
    bits as they are; RAW_SELECT, where(x, y, z) of y and z in the output's dtype, y's or z's; 0: the op's body.
    BODY: the op (a @jit function). GUARD, SITE, BOUND: lanes GUARD(x, y, z) finds bad are recorded as fault SITE
    (0: none). X_MODE..: 0 tensor, 1 float scalar, 2 integer scalar, 3 unused. X_VIA..: the common dtype each operand
    is rounded to; X_TO..: the compute type. BLOCK: elements per program. UPCAST: interpreter backend (`narrow`).
    DEVICE_MATH: the bodies use the device's math library (a compiled backend; `device_math`)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    if DENSE:
        oo = offs
        ox = offs
        oy = offs
        oz = offs
    else:
        if INDEX32:
            rest = offs.to(tl.int32)
        else:
            rest = offs
        oo = rest * 0
        ox = oo
        oy = oo
        oz = oo
        if NDIM > 1:
            rest, oo, ox, oy, oz = _dim_step(rest, d5, q5, oo, ox, oy, oz, so5, sx5, sy5, sz5, INDEX32, NATIVE_DIV)
        if NDIM > 2:
            rest, oo, ox, oy, oz = _dim_step(rest, d4, q4, oo, ox, oy, oz, so4, sx4, sy4, sz4, INDEX32, NATIVE_DIV)
        if NDIM > 3:
            rest, oo, ox, oy, oz = _dim_step(rest, d3, q3, oo, ox, oy, oz, so3, sx3, sy3, sz3, INDEX32, NATIVE_DIV)
        if NDIM > 4:
            rest, oo, ox, oy, oz = _dim_step(rest, d2, q2, oo, ox, oy, oz, so2, sx2, sy2, sz2, INDEX32, NATIVE_DIV)
        if NDIM > 5:
            rest, oo, ox, oy, oz = _dim_step(rest, d1, q1, oo, ox, oy, oz, so1, sx1, sy1, sz1, INDEX32, NATIVE_DIV)
        oo += rest * so0
        ox += rest * sx0
        oy += rest * sy0
        oz += rest * sz0
    if RAW == RAW_COPY:
        # a copy within one dtype: the bits as they are, no conversion (so no NaN made canonical), as torch's copy
        tl.store(out_ptr + oo, tl.load(x_ptr + ox, mask=ok), mask=ok)
    elif RAW == RAW_SELECT:
        # where(x, y, z) of y and z in the output's dtype: one of their bits, as torch's where
        keep = tl.load(x_ptr + ox, mask=ok, other=0) != 0
        tl.store(out_ptr + oo, tl.where(keep, tl.load(y_ptr + oy, mask=ok), tl.load(z_ptr + oz, mask=ok)), mask=ok)
    else:
        x = _operand(x_ptr, ox, ok, xv, X_MODE, X_VIA, X_TO, UPCAST)
        y = _operand(y_ptr, oy, ok, yv, Y_MODE, Y_VIA, Y_TO, UPCAST)
        z = _operand(z_ptr, oz, ok, zv, Z_MODE, Z_VIA, Z_TO, UPCAST)
        _apply_and_store(
            out_ptr,
            oo,
            ok,
            x,
            y,
            z,
            p0,
            p1,
            p2,
            offs,
            fault_ptr,
            BODY,
            GUARD,
            SITE,
            BOUND,
            P_FLOAT,
            P_TO,
            UPCAST,
            DEVICE_MATH,
        )


@jit(do_not_specialize=["yv", "zv", "p0", "p1", "p2"])
def _tile_kernel(
    out_ptr,
    x_ptr,
    fault_ptr,
    yv,
    zv,
    p0,
    p1,
    p2,
    size_a,
    size_b,
    sxa,
    sxb,
    soa,
    tiles_a,
    tiles_b,
    n1,
    n2,
    n3,
    n4,
    sx1,
    sx2,
    sx3,
    sx4,
    so1,
    so2,
    so3,
    so4,
    BODY: tl.constexpr,
    GUARD: tl.constexpr,
    SITE: tl.constexpr,
    BOUND: tl.constexpr,
    Y_MODE: tl.constexpr,
    Z_MODE: tl.constexpr,
    X_VIA: tl.constexpr,
    Y_VIA: tl.constexpr,
    Z_VIA: tl.constexpr,
    X_TO: tl.constexpr,
    Y_TO: tl.constexpr,
    Z_TO: tl.constexpr,
    P_FLOAT: tl.constexpr,
    P_TO: tl.constexpr,
    NBATCH: tl.constexpr,
    TILE_A: tl.constexpr,
    TILE_B: tl.constexpr,
    RAW: tl.constexpr,
    UPCAST: tl.constexpr,
    DEVICE_MATH: tl.constexpr,
):
    """`_map_kernel` for one tensor operand x read across its layout into a contiguous output (a transposed copy or
    cast, any unary op): a TILE_A x TILE_B tile, dimension a the one x is contiguous along (stride sxa, 1 where it is
    transposed), dimension b the output's innermost (stride 1). x is loaded along a and the result stored along b, both
    coalesced (Triton converts the tile's layout between them through shared memory); each element is computed by
    the same expression as in `_map_kernel`, so no bit differs. The grid is one-dimensional: program -> (tile along
    a, tile along b, batch index), the batch index over the other dimensions (NBATCH of them, sizes n1.., strides
    sx1.. and so1.., innermost first). soa: the output's stride along a. y, z: only scalars (a cast's range bounds).
    RAW: RAW_COPY for a copy within one dtype (`raw_mode`): x's bits stored as they are."""
    pid = tl.program_id(0).to(tl.int64)
    ta = pid % tiles_a
    rest = pid // tiles_a
    tb = rest % tiles_b
    rest = rest // tiles_b
    bx = rest * 0
    bo = bx
    if NBATCH > 0:
        bx += (rest % n1) * sx1
        bo += (rest % n1) * so1
        rest = rest // n1
    if NBATCH > 1:
        bx += (rest % n2) * sx2
        bo += (rest % n2) * so2
        rest = rest // n2
    if NBATCH > 2:
        bx += (rest % n3) * sx3
        bo += (rest % n3) * so3
        rest = rest // n3
    if NBATCH > 3:
        bx += (rest % n4) * sx4
        bo += (rest % n4) * so4
    ra = ta * TILE_A + tl.arange(0, TILE_A).to(tl.int64)
    rb = tb * TILE_B + tl.arange(0, TILE_B).to(tl.int64)
    ok = (ra[:, None] < size_a) & (rb[None, :] < size_b)
    ox = bx + ra[:, None] * sxa + rb[None, :] * sxb
    oo = bo + ra[:, None] * soa + rb[None, :]
    if RAW == RAW_COPY:
        tl.store(out_ptr + oo, tl.load(x_ptr + ox, mask=ok), mask=ok)  # a copy within one dtype: the bits as they are
    else:
        x = _operand(x_ptr, ox, ok, 0, 0, X_VIA, X_TO, UPCAST)
        y = _operand(x_ptr, oo, ok, yv, Y_MODE, Y_VIA, Y_TO, UPCAST)
        z = _operand(x_ptr, oo, ok, zv, Z_MODE, Z_VIA, Z_TO, UPCAST)
        _apply_and_store(
            out_ptr,
            oo,
            ok,
            x,
            y,
            z,
            p0,
            p1,
            p2,
            oo,
            fault_ptr,
            BODY,
            GUARD,
            SITE,
            BOUND,
            P_FLOAT,
            P_TO,
            UPCAST,
            DEVICE_MATH,
        )


# ======================================================================================================================
# the op table
# ======================================================================================================================
@dataclass(frozen=True)
class Op:
    """One pointwise op: `name` (torch's), `arity` (tensor operands), `body`, the common dtypes it takes, torch's
    type promotion `kind`, its scalar parameters (names and defaults, p0.. in order), and what is special about it.

    interp_wide: under the interpreter, half-precision operands compute in float64 (there the transcendental bodies
    are this module's own, checked in float64). gpu_f64: on the GPU, float32 operands compute in float64, for the
    reason given ("": in float32, as torch's; see `compute_dtype`); gpu_half_f64: so do half-precision ones (else in
    float32, torch's opmath, whose error is far below their tolerance). guard: (the fault site, the guard) of a
    refused input. operand_dtypes: per operand, a fixed common dtype where the operand is
    not promoted with the others (where's and masked_fill's bool mask)."""

    name: str
    arity: int
    body: Any
    dtypes: tuple[str, ...]
    kind: str = "default"
    params: tuple[tuple[str, Any], ...] = ()
    interp_wide: bool = False
    gpu_f64: str = ""
    gpu_half_f64: bool = False
    guard: tuple[int, Any] | None = None
    operand_dtypes: tuple[str | None, ...] = ()
    description: str = ""
    oracle: str = ""  # the oracle's function name in nbxcert.oracles.pointwise (default: `name`)
    oracle_params: tuple[tuple[str, Any], ...] = ()  # fixed keywords the oracle takes for this row (gelu's approximate)
    domain: str = "any"  # what the input maker draws (see `operand_values`)
    int_floats: bool = False  # integer operands are computed as floats (kind int_to_float)


# Measured on an H200 (Triton 3.6.0, libdevice without flush-to-zero), over every float32 input: the largest
# |out - ref| / (tol * |ref| + half an ulp) of each float32 function, ref its float64 value, tol 2^-23 (the device
# file's): expm1 0.72, log 0.46, log2 0.61, log1p 0.47, sin 0.96, cos 0.98, rsqrt 0.77 pass; these did not or had no
# margin, and compute float32 in float64 on the GPU (the half types' float32 error is 2^-13 of their tolerance).
_F32_OVER = "CUDA's float32 {} measured {} of the float32 tolerance at worst, over every float32 input"
# (name, body, half precision in float64 under the interpreter, why float32 computes in float64 on the GPU)
_UNARY_MATH = [
    ("exp", _b_exp, True, _F32_OVER.format("expf", "1.22x")),
    ("exp2", _b_exp2, True, _F32_OVER.format("exp2f", "1.71x")),
    ("expm1", _b_expm1, True, ""),
    ("log", _b_log, True, ""),
    ("log2", _b_log2, True, ""),
    ("log1p", _b_log1p, True, ""),
    ("sqrt", _b_sqrt, False, ""),
    ("rsqrt", _b_rsqrt, False, ""),
    ("reciprocal", _b_reciprocal, False, ""),
    ("sin", _b_sin, True, ""),
    ("cos", _b_cos, True, ""),
    ("tan", _b_tan, True, _F32_OVER.format("tanf", "1.41x")),
    ("tanh", _b_tanh, True, _F32_OVER.format("tanhf", "1.14x")),
    ("erf", _b_erf, True, _F32_OVER.format("erff", "1.00x (no margin)")),
    ("sigmoid", _b_sigmoid, True, _F32_OVER.format("1 / (1 + expf(-x))", "1.42x")),
]
# (name, body, params, the oracle's fixed keywords, why the GPU computes float32 in float64)
# These chain float32 library functions (1-2 ulps each: CUDA C++ Programming Guide, Mathematical Functions) with
# roundings, and measured over the one-epsilon tolerance in float32 (same measurement as `_UNARY_MATH`'s: gelu
# 6.7e6x, cancelling in 1 + erf; silu and mish 104x, at subnormal results; softplus and log_sigmoid 1.22x; elu 0.63x
# with alpha 1, before the product by another alpha); in float64 their error is 2^-29 of it.
_CHAIN = "a chain of float32 library functions (1-2 ulps each) and roundings exceeds one float32 epsilon"
_ACTIVATIONS = [
    ("gelu", _b_gelu, (), (("approximate", "none"),), "0.5 x (1 + erf(x / sqrt 2)), cancelling for x << 0: " + _CHAIN),
    ("gelu_tanh", _b_gelu_tanh, (), (("approximate", "tanh"),), "x / (1 + exp(-2t)), t's error times 2|t|: " + _CHAIN),
    ("silu", _b_silu, (), (), "x sigmoid(x): " + _CHAIN),
    ("mish", _b_mish, (), (), "tanh(log1p(exp x)): " + _CHAIN),
    ("elu", _b_elu, (("alpha", 1.0),), (), "alpha expm1(x): " + _CHAIN),
    ("celu", _b_celu, (("alpha", 1.0),), (), "alpha expm1(x / alpha), three roundings: " + _CHAIN),
    ("selu", _b_selu, (), (), "scale alpha expm1(x), two rounded constants: " + _CHAIN),
    ("leaky_relu", _b_leaky_relu, (("negative_slope", 0.01),), (), ""),
    ("hardsigmoid", _b_hardsigmoid, (), (), ""),
    ("hardswish", _b_hardswish, (), (), ""),
    ("softplus", _b_softplus, (("beta", 1.0), ("threshold", 20.0)), (), "log1p(exp(beta x)) / beta: " + _CHAIN),
    ("log_sigmoid", _b_log_sigmoid, (), (), "min(x, 0) - log1p(exp -|x|), cancelling near 0: " + _CHAIN),
]
DIV_GUARD = (faults.INTEGER_DIVISOR, _div_guard)


def _ops() -> dict[str, Op]:
    rows: list[Op] = []
    for name, body, wide, gpu_f64 in _UNARY_MATH:
        rows.append(Op(name, 1, body, ALL, "int_to_float", interp_wide=wide, gpu_f64=gpu_f64, int_floats=True))
    for name, body, params, oracle_params, gpu_f64 in _ACTIVATIONS:
        oracle = "gelu" if name.startswith("gelu") else name
        rows.append(
            Op(
                name,
                1,
                body,
                FLOATS,
                params=params,
                interp_wide=True,
                gpu_f64=gpu_f64,
                oracle=oracle,
                oracle_params=oracle_params,
            )
        )
    rows += [
        Op("abs", 1, _b_abs, NUMERIC),
        Op("neg", 1, _b_neg, NUMERIC),
        Op("sign", 1, _b_sign, ALL),
        Op("floor", 1, _b_floor, NUMERIC),
        Op("ceil", 1, _b_ceil, NUMERIC),
        Op("round", 1, _b_round, NUMERIC),
        Op("trunc", 1, _b_trunc, NUMERIC),
        Op("relu", 1, _b_relu, NUMERIC),
        Op("threshold", 1, _b_threshold, NUMERIC, params=(("threshold", 0.0), ("value", 0.0))),
        Op("glu", 2, _b_glu, FLOATS, interp_wide=True, gpu_f64="x sigmoid(y): " + _F32_OVER.format("sigmoid", "1.42x")),
        Op("add", 2, _b_add, ALL, params=(("alpha", 1),)),
        Op("sub", 2, _b_sub, NUMERIC, params=(("alpha", 1),)),
        Op("mul", 2, _b_mul, ALL),
        Op("div", 2, _b_div, ALL, "int_to_float", int_floats=True),
        Op(
            "div_trunc",
            2,
            _b_div_trunc,
            NUMERIC,
            guard=DIV_GUARD,
            oracle="div",
            oracle_params=(("rounding_mode", "trunc"),),
            domain="divisor",
        ),
        Op(
            "div_floor",
            2,
            _b_div_floor,
            NUMERIC,
            gpu_f64="the floor of the exact quotient: float32's (x - fmod(x, y)) / y can round onto the next integer",
            guard=DIV_GUARD,
            oracle="div",
            oracle_params=(("rounding_mode", "floor"),),
            domain="divisor",
        ),
        Op("remainder", 2, _b_remainder, NUMERIC, guard=DIV_GUARD, domain="divisor"),
        Op("fmod", 2, _b_fmod, NUMERIC, guard=DIV_GUARD, domain="divisor"),
        # float64 pow is exp2(e log2 |x|) in float64, whose error grows with |e log2 x| (125 ulps seen near the
        # range's end): it would need log2 and exp2 in double-double, which the kernel has not, so float64 is not
        # offered (refused by name); the half types and float32 compute it in float64, well within their tolerance
        Op(
            "pow",
            2,
            _b_pow,
            tuple(d for d in NUMERIC if d != "float64"),
            interp_wide=True,
            gpu_f64="x^e's error is |e log x| times log's: float32's powf (up to 2 ulps) can exceed one epsilon",
            domain="pow",
        ),
        Op("maximum", 2, _b_maximum, ALL),
        Op("minimum", 2, _b_minimum, ALL),
        Op(
            "atan2",
            2,
            _b_atan2,
            ALL,
            "int_to_float",
            interp_wide=True,
            gpu_f64="float32's atan2f is within 2 ulps (CUDA's table), over one epsilon near the axes",
            int_floats=True,
        ),
        Op("hypot", 2, _b_hypot, FLOATS, gpu_f64="hi sqrt(1 + (lo / hi)^2): four float32 roundings exceed one epsilon"),
        Op("lerp", 3, _b_lerp, FLOATS),
        Op("addcdiv", 3, _b_addcdiv, FLOATS, params=(("value", 1.0),)),
        Op("addcmul", 3, _b_addcmul, NUMERIC, params=(("value", 1),)),
    ]
    for name, body in (("eq", _b_eq), ("ne", _b_ne), ("lt", _b_lt), ("le", _b_le), ("gt", _b_gt), ("ge", _b_ge)):
        rows.append(Op(name, 2, body, ALL, "always_bool"))
    for name, body in (("logical_and", _b_logical_and), ("logical_or", _b_logical_or), ("logical_xor", _b_logical_xor)):
        rows.append(Op(name, 2, body, ALL, "always_bool"))
    rows.append(Op("logical_not", 1, _b_logical_not, ALL, "always_bool"))
    ints = INTS + ("bool",)
    rows += [
        Op("bitwise_and", 2, _b_bitwise_and, ints),
        Op("bitwise_or", 2, _b_bitwise_or, ints),
        Op("bitwise_xor", 2, _b_bitwise_xor, ints),
        Op("bitwise_not", 1, _b_bitwise_not, ints),
        Op("bitwise_left_shift", 2, _b_left_shift, INTS, domain="shift"),
        Op("bitwise_right_shift", 2, _b_right_shift, INTS, domain="shift"),
        Op("isnan", 1, _b_isnan, ALL, "always_bool"),
        Op("isinf", 1, _b_isinf, ALL, "always_bool"),
        Op("isfinite", 1, _b_isfinite, ALL, "always_bool"),
        Op("nan_to_num", 1, _b_nan_to_num, ALL, params=(("nan", 0.0), ("posinf", None), ("neginf", None))),
        Op("clamp", 1, _b_clamp, NUMERIC, params=(("min", None), ("max", None))),
        Op("clamp_min", 1, _b_clamp_min, NUMERIC, params=(("min", None),)),
        Op("clamp_max", 1, _b_clamp_max, NUMERIC, params=(("max", None),)),
        Op("where", 3, _b_where, ALL, operand_dtypes=("bool", None, None)),
        Op("masked_fill", 2, _b_masked_fill, ALL, params=(("value", 0),), operand_dtypes=(None, "bool")),
        Op("copy", 1, _b_copy, ALL),
        Op(
            "cast",
            1,
            _b_cast,
            ALL,
            interp_wide=True,
            gpu_f64="the range guard's bounds (-2^31 - 1, ...) are exact in float64 only; the value is unchanged",
            gpu_half_f64=True,
            guard=(faults.FLOAT_TO_INT, _cast_guard),
        ),
        Op("fill", 0, _b_fill, ALL, params=(("value", 0),)),
        Op("arange", 0, _b_arange, NUMERIC, params=(("start", 0), ("end", None), ("step", 1))),
        Op("linspace", 0, _b_linspace, FLOATS, params=(("start", 0.0), ("end", None), ("steps", None))),
    ]
    return {r.name: r for r in rows}


OPS: dict[str, Op] = _ops()


# ======================================================================================================================
# types
# ======================================================================================================================
def device_math() -> bool:
    """Whether the backend in force compiles for a GPU (cuda, cross), whose bodies use the device's math library
    (`DEVICE_MATH`); False under Triton's interpreter, which has none."""
    return not upcast()


HALF_TYPES = ("float16", "bfloat16")


def math_level(plan: Plan, out: Tensor) -> int:
    """A launch's DEVICE_MATH: 0 under the interpreter (this module's helpers); on a GPU 1 (the device library), or
    where the op computes in float32 for a float16 or bfloat16 common dtype into an output of the same type on an
    NVIDIA target, the half-precision helpers (their approximate instructions are NVIDIA's): HALF_MATH for float16,
    HALF_BF16 for bfloat16."""
    if not device_math():
        return 0
    common = plan.via[0]
    if plan.compute == "float32" and common in HALF_TYPES and out.dtype.name == common and _nvidia():
        return HALF_MATH.value if common == "float16" else HALF_BF16.value
    return 1


_TARGET_IS_NVIDIA: dict[int, bool] = {}  # id of Triton's active driver -> whether it compiles for an NVIDIA target


def _nvidia() -> bool:
    """Whether Triton's active driver compiles for an NVIDIA target: asked once per driver, not at every launch
    (`math_level` runs before a launch's constexprs are looked up)."""
    from triton.runtime.driver import driver

    active = driver.active
    known = _TARGET_IS_NVIDIA.get(id(active))
    if known is None:
        known = _TARGET_IS_NVIDIA[id(active)] = active.get_current_target().backend == "cuda"
    return known


def math_options() -> dict[str, Any]:
    """Compile options of a launch with `DEVICE_MATH`: on an NVIDIA target, libdevice without flush-to-zero (Triton's
    `enable_reflect_ftz` defaults to True, which makes __nv_expf, __nv_sinf, ... read and return float32 subnormals as
    0: sin of the smallest subnormal would be 0, not itself; torch's CUDA build keeps them)."""
    if not device_math():
        return {}
    from triton.runtime.driver import driver

    return {"enable_reflect_ftz": False} if driver.active.get_current_target().backend == "cuda" else {}


def compute_dtype(common: str, op: Op | None = None, device: bool | None = None) -> str:
    """The type `op` computes in for its common dtype, on the GPU (`device`; None: the backend in force) or under the
    interpreter. GPU: torch's, float32 for half precision and float32, float64 for float64; float32 in float64 where
    `op.gpu_f64` says why, half precision too where `op.gpu_half_f64`. Interpreter (its transcendentals are this
    module's float64 helpers): float32 for half precision (float64 where `op.interp_wide`), float64 for float32 and
    float64. An integer computes in its own type, bool in int1."""
    device = device_math() if device is None else device
    if device and common in ("float16", "bfloat16", "float32"):
        wide = op is not None and (op.gpu_half_f64 if common != "float32" else bool(op.gpu_f64))
        return "float64" if wide else "float32"
    if common in ("float16", "bfloat16"):
        return "float64" if op is not None and op.interp_wide else "float32"
    if common in ("float32", "float64"):
        return "float64"
    return common


_TL = {
    "float16": tl.float16,
    "bfloat16": tl.bfloat16,
    "float32": tl.float32,
    "float64": tl.float64,
    "int8": tl.int8,
    "uint8": tl.uint8,
    "int16": tl.int16,
    "int32": tl.int32,
    "int64": tl.int64,
    "bool": tl.int1,
}


def float_bits(value: float) -> int:
    """A Python float's float64 bit pattern as a signed int64 (how a float scalar reaches the kernel)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _wrap_int(value: int, dtype: str) -> int:
    """An integer wrapped into `dtype`'s width (two's complement), as torch casts a Python int to an integer type."""
    bits = INT_BITS[dtype]
    if dtype == "bool":
        return int(bool(value))
    v = int(value) & ((1 << bits) - 1)
    if dtype != "uint8" and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def scalar_arg(value: Any, dtype: str, compute: str) -> tuple[int, int]:
    """(mode, kernel argument) of a Python scalar cast to the common dtype `dtype`: a float's float64 bits (rounded
    into float32 first where the op computes float32 data in float32 the compute type: torch's opmath for a
    float32 tensor's scalar), or an int64."""
    if dtype in FLOATS:
        v = float(value)
        if dtype == "float32":
            v = float(np.float32(v)) if math.isfinite(v) and abs(v) <= float(np.finfo(np.float32).max) else v
        return FLOAT_SCALAR, float_bits(v)
    if dtype == "bool":
        return INT_SCALAR, int(bool(value))
    return INT_SCALAR, _wrap_int(int(value), dtype)


def param_arg(value: Any, compute: str) -> int:
    """A scalar parameter's kernel argument for the compute type: float64 bits or a wrapped int64."""
    if value is None:
        return 0
    if compute in FLOATS:
        return float_bits(float(value))
    if compute == "bool":
        return int(bool(value))
    return _wrap_int(int(value), compute)


# ======================================================================================================================
# layouts and dimension merging
# ======================================================================================================================
LAYOUTS = ("dense", "broadcast", "transposed", "strided", "scalar", "none")


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy's broadcast of shapes; `ShapeMismatch` (one line) when they do not broadcast."""
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        padded = (1,) * (n - len(s)) + tuple(s)
        for i, (a, b) in enumerate(zip(out, padded, strict=True)):
            if a != b and 1 not in (a, b):
                raise ShapeMismatch(f"shapes {', '.join(str(tuple(x)) for x in shapes)} do not broadcast")
            out[i] = b if a == 1 else a
    return tuple(out)


def layout_of(t: Any, shape: tuple[int, ...]) -> str:
    """How an operand reads into the broadcast `shape`: "dense" (contiguous, that very shape), "broadcast" (some
    dimension repeated by a 0 stride), "transposed" (its innermost dimension not contiguous, another one is: the
    tiled configs read it coalesced), "strided" (any other view), "scalar" (a Python number), "none" (absent)."""
    if t is None:
        return "none"
    if not isinstance(t, Tensor):
        return "scalar"
    if tuple(t.shape) == tuple(shape) and t.is_contiguous():
        return "dense"
    sizes = (1,) * (len(shape) - t.ndim) + tuple(t.shape)
    if any(n_t == 1 and n != 1 for n_t, n in zip(sizes, shape, strict=True)) or any(
        s == 0 and n > 1 for s, n in zip(t.strides, t.shape, strict=True)
    ):
        return "broadcast"
    inner_strided = t.ndim > 1 and t.shape[-1] > 1 and t.strides[-1] != 1
    if inner_strided and any(s == 1 and n > 1 for s, n in zip(t.strides[:-1], t.shape[:-1], strict=True)):
        return "transposed"
    return "strided"


# ======================================================================================================================
# configs and prune
# ======================================================================================================================
def flat_config(block: int, num_warps: int) -> Config:
    """BLOCK elements per program."""
    return Config.make(num_warps=num_warps, num_stages=1, BLOCK=block)


def tile_config(tile_a: int, tile_b: int, num_warps: int) -> Config:
    """A TILE_A x TILE_B tile per program (`_tile_kernel`): a transposed operand into a contiguous output."""
    return Config.make(num_warps=num_warps, num_stages=1, TILE_A=tile_a, TILE_B=tile_b)


def flat_candidates() -> tuple[Config, ...]:
    """BLOCK {256, 512, 1024, 2048, 4096} x warps {2, 4, 8}; then the tiles {32, 64} x {32, 64} x warps {4, 8}
    (legal only where the one operand is transposed and the output contiguous: `prune_flat`)."""
    flat = tuple(flat_config(b, w) for b in (256, 512, 1024, 2048, 4096) for w in (2, 4, 8))
    return flat + tuple(tile_config(a, b, w) for a in (32, 64) for b in (32, 64) for w in (4, 8))


def is_tiled(config: Config) -> bool:
    return config.get("TILE_A") is not None


DEFAULT = flat_config(1024, 4)
DEFAULT_TILE = tile_config(64, 64, 8)


def default_for(problem: Mapping[str, Any]) -> Config:
    """The untuned config of a problem: a tile where its one operand is read transposed into a contiguous output (the
    flat kernel's gather there runs at a sixth of torch's speed on an H200), else DEFAULT."""
    layouts = tuple(problem.get(k) for k in ("x", "y", "z", "out"))
    return DEFAULT_TILE if layouts == ("transposed", "none", "none", "dense") else DEFAULT


# 32-bit registers per element live at the peak, counted from the kernel at its widest (float64 compute, 2 a value):
# each operand the problem has and the result, and the int64 offsets: one where every tensor is dense (DENSE: the flat
# index is every tensor's offset), else the output's and each operand slot's (four). 16 at the most (three operands,
# strided), 6 for a dense unary op. It counts a tensor's address once a vector, as a large tensor's loads vectorize;
# where they do not (a count that is no multiple of the vector, masked element by element) each element keeps its own
# addresses, and the census finds 1 to 25 kept configs that spill at the specs' 33- and 64-element examples on NVIDIA
# targets (README, Census): they run, slower, and lose their sweep.
VALUE_REGS = 2
OFFSET_REGS = 2


def regs_per_element(problem: Mapping[str, Any]) -> int:
    """The flat kernel's registers per element at its peak for `problem` (its layouts; see above)."""
    slots = [problem.get(k, "none") for k in ("x", "y", "z")]
    present = sum(s != "none" for s in slots)
    dense = problem.get("out") == "dense" and all(s in ("dense", "scalar", "none") for s in slots)
    return VALUE_REGS * (present + 1) + OFFSET_REGS * (1 if dense else 4)


# the tiled kernel's: one operand and the result (2 each at float64) and two int64 offsets (2 each)
TILE_REGS = 8


def prune_flat(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse configs whose BLOCK (or tile) leaves a warp without elements or needs more registers than a thread has,
    and the tiled configs except where they apply: one operand, transposed, into a contiguous output."""

    def check(c: Config) -> str | None:
        if is_tiled(c):
            layouts = tuple(problem.get(k) for k in ("x", "y", "z", "out"))
            if layouts != ("transposed", "none", "none", "dense"):
                return (
                    "a tile reads one transposed operand into a contiguous output (problem: x, y, z, out = {})".format(
                        ", ".join(str(v) for v in layouts)
                    )
                )
            b = c["TILE_A"] * c["TILE_B"]
            what = f"a tile of {c['TILE_A']} x {c['TILE_B']}"
            return lanes_refusal(b, c, profile, "tile") or registers_refusal(b, TILE_REGS, c, profile, what)
        b = c["BLOCK"]
        regs = regs_per_element(problem)
        return lanes_refusal(b, c, profile, "tile") or registers_refusal(b, regs, c, profile, f"a tile of {b}")

    return prune_with(candidates, profile, check)


# ======================================================================================================================
# launches
# ======================================================================================================================
@dataclass(frozen=True)
class Plan:
    """What a launch of one op needs besides its tensors: the common dtype of each operand, the compute type, and
    each operand's scalar (mode, argument) where it is a Python number."""

    op: str
    via: tuple[str, str, str]
    compute: str
    scalars: tuple[tuple[int, int] | None, ...]
    params: tuple[int, int, int]
    p_float: bool
    bound: int = 0


def _operand_strides(t: Any, shape: tuple[int, ...]) -> list[int]:
    return broadcast_strides(t, shape) if isinstance(t, Tensor) else [0] * len(shape)


def _guard_of(op: Op, plan: Plan, out: Tensor) -> tuple[int, Any]:
    """(the fault site, the guard) in force for a launch of `op`: none where its refusal cannot happen."""
    site, guard = op.guard if op.guard else (0, _no_guard)
    if site == faults.INTEGER_DIVISOR and plan.compute in FLOATS:
        site, guard = 0, _no_guard
    if site == faults.FLOAT_TO_INT and (out.dtype.name not in INTS or plan.compute not in FLOATS):
        site, guard = 0, _no_guard
    return site, guard


RAW_COPY = tl.constexpr(1)  # `raw_mode`'s answers, the kernels' constexpr RAW (0: the op's body)
RAW_SELECT = tl.constexpr(2)


def raw_mode(plan: Plan, operands: Sequence[Any], out: Tensor) -> int:
    """How a launch stores bits it is given as they are (torch's copy and where keep a NaN's payload; a conversion
    through the compute type would make it the dtype's one quiet NaN): RAW_COPY for a copy of the tensor x within one
    dtype, RAW_SELECT for where(x, y, z) of tensors y and z in the output's dtype, else 0."""
    ops3 = list(operands) + [None] * (3 - len(operands))
    x, y, z = ops3[:3]
    if plan.op == "copy" and isinstance(x, Tensor) and x.dtype.name == out.dtype.name:
        return RAW_COPY.value
    tensors = all(isinstance(t, Tensor) for t in (x, y, z))
    if plan.op == "where" and tensors and y.dtype.name == z.dtype.name == out.dtype.name:
        return RAW_SELECT.value
    return 0


def tile_launches(config: Config, plan: Plan, operands: Sequence[Any], out: Tensor) -> list[KernelLaunch]:
    """The tiled launch (`_tile_kernel`) of a one-operand op writing the contiguous `out` from the tensor x (any
    strides, broadcast to out's shape; y and z at most scalars: a cast's bounds). `LaunchError` for any other call:
    a tiled config is certified only for such keys (`prune_flat`)."""
    op = OPS[plan.op]
    ops3 = list(operands) + [None] * (3 - len(operands))
    x = ops3[0]
    if not isinstance(x, Tensor) or any(isinstance(t, Tensor) for t in ops3[1:]) or not out.is_contiguous():
        tensors = sum(isinstance(t, Tensor) for t in ops3)
        kind = "contiguous" if out.is_contiguous() else "non-contiguous"
        raise LaunchError(
            f"{op.name}: config {config.label()} tiles one tensor operand into a contiguous output; this call has "
            f"{tensors} tensor operand(s) and a {kind} output"
        )
    shape = tuple(out.shape)
    sizes, (so, sx) = merge_dims(shape, out.strides, _operand_strides(x, shape))
    if not sizes:
        sizes, so, sx = [1], [1], [0]
    nd = len(sizes)
    if nd > MAX_DIMS:
        raise LaunchError(
            f"{op.name}: {nd} dimensions remain after merging the contiguous ones; at most {MAX_DIMS} are indexed "
            "(make the operand contiguous first)"
        )
    # b: the output's innermost dimension (stride 1); a: the other one x is most nearly contiguous along
    b = nd - 1
    others = list(range(nd - 1))
    a = min(others, key=lambda k: (abs(sx[k]), -k)) if others else None
    batch = [k for k in reversed(others) if k != a]
    size_a, sxa, soa = (sizes[a], sx[a], so[a]) if a is not None else (1, 0, 0)
    tile_a, tile_b = config["TILE_A"], config["TILE_B"]
    tiles_a, tiles_b = cdiv(size_a, tile_a), cdiv(sizes[b], tile_b)
    nb = [sizes[k] for k in batch] + [1] * (4 - len(batch))
    bsx = [sx[k] for k in batch] + [0] * (4 - len(batch))
    bso = [so[k] for k in batch] + [0] * (4 - len(batch))
    programs = tiles_a * tiles_b * math.prod(nb)
    scalars = list(plan.scalars) + [None] * 3
    modes = [sc[0] if sc is not None else UNUSED for sc in scalars[1:3]]
    values = [sc[1] if sc is not None else 0 for sc in scalars[1:3]]
    site, guard = _guard_of(op, plan, out)
    compute = _TL[plan.compute]
    level = math_level(plan, out)
    raw = raw_mode(plan, operands, out)
    key = ("tile", config, plan.op, plan.via, plan.compute, tuple(modes), plan.p_float, len(batch), site, plan.bound)
    key += (level, raw)

    def make() -> dict:
        kwargs = dict(
            BODY=op.body,
            GUARD=guard,
            SITE=site,
            BOUND=plan.bound,
            Y_MODE=modes[0],
            Z_MODE=modes[1],
            X_VIA=_TL[plan.via[0]],
            Y_VIA=_TL[plan.via[1]],
            Z_VIA=_TL[plan.via[2]],
            X_TO=tl.int1 if plan.via[0] == "bool" else compute,
            Y_TO=compute,
            Z_TO=compute,
            P_FLOAT=plan.p_float,
            P_TO=compute,
            NBATCH=len(batch),
            TILE_A=tile_a,
            TILE_B=tile_b,
            RAW=raw,
            UPCAST=upcast(),
            DEVICE_MATH=level,
        )
        return dict(kwargs, num_warps=config.num_warps, num_stages=config.num_stages, **math_options())

    kwargs = constexprs(key, make)
    args = (out, x, faults.word(out.device), *values, *plan.params, size_a, sizes[b], sxa, sx[b], soa)
    args += (tiles_a, tiles_b, *nb, *bsx, *bso)
    return [KernelLaunch(_tile_kernel, (programs,), args, kwargs)]


def map_launches(config: Config, plan: Plan, operands: Sequence[Any], out: Tensor) -> list[KernelLaunch]:
    """The launch of `plan`'s op writing `out` (any strides) from `operands` (tensors broadcast to out's shape, Python
    numbers, or None), at most three."""
    n = out.numel
    if n == 0:
        return []
    if is_tiled(config):
        return tile_launches(config, plan, operands, out)
    op = OPS[plan.op]
    shape = tuple(out.shape)
    ops3 = list(operands) + [None] * (3 - len(operands))
    strides = [out.strides] + [_operand_strides(t, shape) for t in ops3]
    sizes, merged = merge_dims(shape, *strides)
    if not sizes:
        sizes, merged = [1], [[0] for _ in strides]
    if len(sizes) > MAX_DIMS:
        raise LaunchError(
            f"{op.name}: {len(sizes)} dimensions remain after merging the contiguous ones; at most {MAX_DIMS} are "
            "indexed (make an operand contiguous first)"
        )
    ndim = len(sizes)
    d_slots = [1] * MAX_DIMS
    s_slots = [[0] * MAX_DIMS for _ in strides]
    for k in range(1, ndim):
        d_slots[MAX_DIMS - ndim + k] = sizes[k]
        for j, st in enumerate(merged):
            s_slots[j][MAX_DIMS - ndim + k] = st[k]
    for j, st in enumerate(merged):
        s_slots[j][0] = st[0]
    dense = out.is_contiguous() and all(
        t is None or not isinstance(t, Tensor) or (tuple(t.shape) == shape and t.is_contiguous()) for t in ops3
    )
    ptrs, modes, values = [], [], []
    for t, sc in zip(ops3, list(plan.scalars) + [None] * 3, strict=False):
        if isinstance(t, Tensor):
            ptrs.append(t)
            modes.append(TENSOR)
            values.append(0)
        elif sc is not None:
            ptrs.append(out)
            modes.append(sc[0])
            values.append(sc[1])
        else:
            ptrs.append(out)
            modes.append(UNUSED)
            values.append(0)
    site, guard = _guard_of(op, plan, out)
    block = config["BLOCK"]
    index32 = not dense and fits_index32(sizes, merged, block)
    # Triton's own division where a thread's run of output elements is contiguous and stays so across the innermost
    # size (a multiple of 16): stored as vectors, one division a run; a divider's multiply-high for each element else
    native_div = index32 and sizes[-1] % 16 == 0 and merged[0][-1] == 1
    q_slots = [divider(d) for d in d_slots[1:]] if index32 else [1] * (MAX_DIMS - 1)
    compute = _TL[plan.compute]
    level = math_level(plan, out)
    key = (config, plan.op, plan.via, plan.compute, tuple(modes), plan.p_float, ndim, dense, index32, native_div)
    raw = raw_mode(plan, ops3, out)
    key += (site, plan.bound, level, raw)

    def make() -> dict:
        kwargs = dict(
            BODY=op.body,
            GUARD=guard,
            SITE=site,
            BOUND=plan.bound,
            X_MODE=modes[0],
            Y_MODE=modes[1],
            Z_MODE=modes[2],
            X_VIA=_TL[plan.via[0]],
            Y_VIA=_TL[plan.via[1]],
            Z_VIA=_TL[plan.via[2]],
            X_TO=tl.int1 if plan.via[0] == "bool" else compute,
            Y_TO=tl.int1 if plan.via[1] == "bool" else compute,
            Z_TO=tl.int1 if plan.via[2] == "bool" else compute,
            P_FLOAT=plan.p_float,
            P_TO=compute,
            NDIM=ndim,
            DENSE=dense,
            INDEX32=index32,
            NATIVE_DIV=native_div,
            RAW=raw,
            BLOCK=block,
            UPCAST=upcast(),
            DEVICE_MATH=level,
        )
        return dict(kwargs, num_warps=config.num_warps, num_stages=config.num_stages, **math_options())

    kwargs = constexprs(key, make)
    rest = tuple(v for slots in s_slots for v in slots)

    def launch(target: Tensor, sources: list, count: int) -> KernelLaunch:
        args = (target, *sources, faults.word(out.device), *values, *plan.params, count, *d_slots[1:], *q_slots)
        return KernelLaunch(_map_kernel, (cdiv(count, block),), args + rest, kwargs)

    # A dense count that is no multiple of 16 (Triton specialises a count on that divisibility) masks each lane on its
    # own, so no load or store is a vector: the whole 16s are launched apart, their masks uniform over each vector,
    # and the last few elements after them (an op whose body reads the element's index, or records a refused one's,
    # keeps one launch)
    tail = n % ALIGN if dense and n > ALIGN and op.arity and site == 0 else 0
    if not tail:
        return [launch(out, ptrs, n)]
    start = n - tail
    after = [_elements_from(t, start) if isinstance(t, Tensor) and t is not out else None for t in ptrs]
    out_after = _elements_from(out, start)
    return [launch(out, ptrs, start), launch(out_after, [a or out_after for a in after], tail)]


ALIGN = 16  # Triton specialises an integer argument on its divisibility by 16


def _elements_from(t: Tensor, start: int) -> Tensor:
    """The elements of the contiguous `t` from flat index `start` on, as a 1-d view."""
    return Tensor(t.untyped_storage(), (t.numel - start,), (1,), t.dtype.name, t.storage_offset() + start)


# ======================================================================================================================
# the call: promotion, checks, the key, the served launch
# ======================================================================================================================
def promotion():
    """`nbxcert.kernels.promotion`, looked up when a call promotes."""
    return importlib.import_module("nbxcert.kernels.promotion")


def problem_of(op: str, operands: Sequence[Any], out: Tensor, **_) -> dict:
    """The key's problem of one launch: the element count and each operand's and the output's layout class."""
    shape = tuple(out.shape)
    padded = list(operands) + [None] * (3 - len(operands))
    return {
        "numel": out.numel,
        "x": layout_of(padded[0], shape),
        "y": layout_of(padded[1], shape),
        "z": layout_of(padded[2], shape),
        "out": "dense" if out.is_contiguous() else "strided",
    }


def key_dtypes(plan: Plan, operands: Sequence[Any], out: Tensor) -> tuple[str, ...]:
    """The key's dtypes: each operand's (a Python number's: the common dtype it was cast to), then the output's."""
    op = OPS[plan.op]
    names = []
    for i in range(op.arity):
        t = operands[i] if i < len(operands) else None
        names.append(t.dtype.name if isinstance(t, Tensor) else plan.via[i])
    return tuple(names) + (out.dtype.name,)


def _bounds(common: str, target: str) -> tuple[float, float]:
    """(the smallest float64 above `target`'s range, the largest below it) for a float to integer cast: a value
    truncated toward zero fits when strictly between them."""
    bits = INT_BITS[target]
    if target == "uint8":
        return 256.0, -1.0
    if bits == 64:
        return 2.0**63, float(np.nextafter(-(2.0**63), -np.inf))
    return float(2 ** (bits - 1)), -float(2 ** (bits - 1)) - 1.0


@served
def pointwise_call(
    op: str, x: Any, y: Any, z: Any, out: Tensor, via: tuple, compute: str, params: tuple, p_float: bool, config=None
) -> Tensor:
    """Launch op `op` writing `out` from operands x, y, z (tensors broadcast to out's shape, Python numbers already
    cast to their common dtype `via[i]`, or None), computing in `compute`, with parameters `params` (kernel
    arguments). The checks and the promotion are the caller's (`nbxcert.ops`); this forms the key, chooses the
    config and launches. A refused input raises `LaunchError` (`nbxcert.kernels.faults`)."""
    row = OPS[op]
    operands = [x, y, z][: max(row.arity, 0)]
    result, operands, out = out, *_in_storage_order(operands, out)
    scalars = []
    for v, d in zip([x, y, z], via, strict=True):
        scalars.append(None if v is None or isinstance(v, Tensor) else scalar_arg(v, d, compute))
    bound = 0
    problem = problem_of(op, operands, out)
    dtypes = key_dtypes(Plan(op, tuple(via), compute, tuple(scalars), tuple(params), p_float), operands, out)
    if op == "cast" and out.dtype.name in INTS and compute in FLOATS:
        hi, lo = _bounds(compute, out.dtype.name)
        scalars[1], scalars[2] = (FLOAT_SCALAR, float_bits(hi)), (FLOAT_SCALAR, float_bits(lo))
        bound = INT_BITS[out.dtype.name]
        operands = [operands[0], hi, lo]
    plan = Plan(op, tuple(via), compute, tuple(scalars), tuple(params), p_float, bound)
    spec = SPECS[op]

    def run(c: Config) -> None:
        _run(map_launches(c, plan, operands, out))

    aliased = any(isinstance(t, Tensor) and t.untyped_storage() is out.untyped_storage() for t in operands)
    restore = (out,) if aliased else ()
    run(choose_config(spec, problem, dtypes, config, run=run, outputs=(out,), restore=restore))
    if plan_has_guard(op, compute, out):
        faults.after_launch(out.device)
    return result


def _in_storage_order(operands: list, out: Tensor) -> tuple[list, Tensor]:
    """An element-wise op is the same op on its operands and output with their dimensions permuted alike: where `out`
    is dense in another order of its dimensions than the given one (a transposed or permuted result), the views in
    its storage order, so that it is contiguous and an operand laid out as it is reads dense (the flat kernel over
    one run of storage, the dense key), a broadcast one broadcast. Anything else as given."""
    if out.ndim < 2 or out.is_contiguous():
        return operands, out
    shape = tuple(out.shape)
    perm = sorted(range(out.ndim), key=lambda d: (out.strides[d], shape[d]), reverse=True)
    view = out.permute(perm)
    if not view.is_contiguous():  # a strided output: no order makes it one run
        return operands, out
    moved = [t.expand(shape).permute(perm) if isinstance(t, Tensor) else t for t in operands]
    return moved, view


def plan_has_guard(op: str, compute: str, out: Tensor) -> bool:
    row = OPS[op]
    if row.guard is None:
        return False
    if row.guard[0] == faults.INTEGER_DIVISOR:
        return compute not in FLOATS
    return out.dtype.name in INTS and compute in FLOATS


# ======================================================================================================================
# inputs and the oracle adapter
# ======================================================================================================================
def _specials(dtype: str) -> np.ndarray:
    """The special values of a dtype mixed into every operand: signed zeros, infinities, NaN, the extremes and the
    smallest subnormal for floats; the extremes, -1, 0 and 1 for integers."""
    if dtype == "bool":
        return np.array([0, 1], np.int64)
    if dtype in INTS:
        info = np.iinfo(np.dtype(dtype))
        return np.array(sorted({int(info.min), int(info.max), 0, 1, -1 if info.min < 0 else 2}), np.int64)
    tiny_sub = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 5e-324}[dtype]
    big = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}.get(dtype, 1.7e308)
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, tiny_sub, -tiny_sub, big, -big, 1.0, -1.0])


def _round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded to `dtype` and back (each then exact in it): numpy's own conversion where it has the
    type (round to nearest even from float64 itself, the same bits as `encode`; 0.2 s against 1.4 s at 2^25 values),
    `encode` and `decode` for bfloat16."""
    from nbxcert.kernels.dtypes import decode, encode
    from nbxcert.oracles import parts as _parts

    def rounded(part: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            if dtype in ("float16", "float32", "float64"):
                return part.astype(np.dtype(dtype)).astype(np.float64)
            return decode(encode(part, get_dtype(dtype)), get_dtype(dtype)).astype(np.float64)

    # large operands in parts on the process's cores (element by element the same)
    return _parts.elementwise_in_parts(rounded, np.asarray(values, dtype=np.float64))


def operand_values(gen: np.random.Generator, n: int, dtype: str, domain: str = "any", role: int = 0) -> np.ndarray:
    """`n` seeded values of `dtype` (float64 for floats, int64 for integers and bool): random values with the dtype's
    special values mixed in. `domain`: "divisor" (integer divisors are never 0: division by zero is refused),
    "shift" (a shift amount, role 1: -2 .. width + 2), "pow" (integer exponents 0 .. 9 and bases small, so integer
    powers exercise wrap-around without every result overflowing), "cast" (float values inside every integer
    range: the refusal tests make the others)."""
    if dtype in INTS or dtype == "bool":
        if dtype == "bool":
            v = gen.integers(0, 2, n)
        else:
            info = np.iinfo(np.dtype(dtype))
            lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
            v = gen.integers(lo, hi + 1, n, dtype=np.int64)
            k = min(n // 4, len(_specials(dtype)))
            v[:k] = gen.permutation(_specials(dtype))[:k]
        if domain == "shift" and role == 1:
            v = gen.integers(-2, INT_BITS[dtype] + 3, n) if dtype != "uint8" else gen.integers(0, 11, n)
        if domain == "pow" and role == 1:
            v = gen.integers(0 if dtype == "uint8" else -2, 10, n)
        if domain == "pow" and role == 0:
            v = gen.integers(0 if dtype == "uint8" else -7, 8, n)
        if domain == "divisor" and role == 1:
            v = np.where(v == 0, 1, v)
        return v.astype(np.int64)
    v = _inputs.normals(gen, n)
    v *= 3.0
    if domain != "cast":
        k = min(n // 4, 11)
        v[:k] = gen.permutation(_specials(dtype))[:k]
    if domain == "pow" and role == 1:
        v = np.where(gen.random(n) < 0.3, np.round(v), v)
    return _round_to(v, dtype)


def _layout_tensor(gen, values: np.ndarray, shape: tuple[int, ...], layout: str, dtype: str, device: str) -> Tensor:
    """A tensor of `values` that reads into `shape` as `layout`: dense; broadcast (the first dimension of a shape of
    more than one, else the one element, repeated by a 0 stride); transposed (a contiguous buffer with its last two
    dimensions swapped); strided (every other element of a twice-as-long buffer)."""
    if layout == "dense":
        return from_numpy(_storage_values(values.reshape(shape), dtype), dtype, device)
    if layout == "broadcast":
        if len(shape) > 1 and shape[0] > 1:
            row = values[: math.prod(shape[1:])].reshape(shape[1:])
            return from_numpy(_storage_values(row, dtype), dtype, device)
        one = from_numpy(_storage_values(values[:1], dtype), dtype, device)
        return one.expand(*shape) if shape else one
    if layout == "transposed":
        if len(shape) < 2:
            raise ValueError(f"a transposed operand needs two dimensions, not the shape {shape}")
        swapped = tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2)
        t = from_numpy(
            _storage_values(np.ascontiguousarray(values.reshape(shape).transpose(swapped)), dtype), dtype, device
        )
        return t.permute(*swapped)
    if layout == "strided":
        wide = np.repeat(values.reshape(-1), 2).reshape(shape[:-1] + (2 * shape[-1],)) if shape else values[:1]
        t = from_numpy(_storage_values(wide, dtype), dtype, device)
        return t[..., ::2] if shape else t
    raise ValueError(f"unknown layout {layout!r}")


def _storage_values(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return values.astype(bool)
    if dtype in INTS:
        return values.astype(np.dtype(dtype))
    return values.astype(np.float64)


def shape_for(numel: int) -> tuple[int, ...]:
    """A 2-d shape of `numel` elements whose rows are at most 64 long (1-d for a prime count)."""
    for cols in range(min(64, numel), 0, -1):
        if numel % cols == 0 and cols > 1:
            return (numel // cols, cols)
    return (numel,)


def example_params(op: Op, dtype: str) -> dict[str, Any]:
    """Parameters an input maker gives an op: its defaults, with the ones that have none chosen here."""
    params = dict(op.params)
    # uint8's bounds are in its range (torch refuses a Scalar it cannot convert without overflow)
    lo, hi = (3, 100) if dtype == "uint8" else (-1, 2)
    if op.name == "clamp":
        params.update(min=lo, max=hi) if dtype in INTS else params.update(min=-1.5, max=2.25)
    if op.name == "clamp_min":
        params["min"] = lo if dtype in INTS else -1.5
    if op.name == "clamp_max":
        params["max"] = hi if dtype in INTS else 2.25
    if op.name in ("add", "sub"):
        params["alpha"] = 2 if dtype in INTS else 1.5
    if op.name == "addcmul":
        params["value"] = 3 if dtype in INTS else 0.5
    if op.name == "addcdiv":
        params["value"] = 0.5
    if op.name == "masked_fill":
        params["value"] = 7 if dtype in INTS or dtype == "bool" else -2.5
    if op.name == "fill":
        params["value"] = 1 if dtype == "bool" else (3 if dtype == "uint8" else -3 if dtype in INTS else 1.25)
    if op.name == "arange":
        params.update(start=3, end=None, step=1) if dtype in INTS else params.update(start=-2.5, end=None, step=0.75)
    if op.name == "linspace":
        params.update(start=-3.0, end=7.5, steps=None)
    if op.name == "threshold":
        if dtype == "uint8":
            params.update(threshold=50, value=9)
        else:
            params.update(threshold=0, value=-9) if dtype in INTS else params.update(threshold=0.5, value=-9.5)
    if op.name == "nan_to_num" and dtype in FLOATS:
        params.update(nan=0.25, posinf=1000.0, neginf=-1000.0)
    if op.name == "elu":
        params["alpha"] = 1.25
    if op.name == "celu":
        params["alpha"] = 0.75
    if op.name == "leaky_relu":
        params["negative_slope"] = 0.125
    if op.name == "softplus":
        params.update(beta=1.5, threshold=10.0)
    return params


def resolve_params(op: Op, params: Mapping[str, Any], out: Tensor, common: str) -> dict[str, Any]:
    """The parameters a launch passes: every one given, defaults filled in (nan_to_num's infinities: the result
    dtype's extremes; arange's and linspace's count: the output's elements)."""
    resolved = dict(op.params)
    resolved.update(params)
    if op.name == "nan_to_num" and common in FLOATS:
        top = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}.get(common)
        top = top or float(np.finfo(np.dtype(common)).max)
        resolved["posinf"] = top if resolved.get("posinf") is None else resolved["posinf"]
        resolved["neginf"] = -top if resolved.get("neginf") is None else resolved["neginf"]
    if op.name == "linspace":
        resolved["steps"] = out.numel
    return resolved


def make_inputs_for(op: Op):
    def make_inputs(problem, dtypes, seed, device) -> Inputs:
        """Operands laid out as the problem says, of the key's dtypes, seeded, special values mixed in; the output
        poisoned by the caller."""
        numel = int(problem["numel"])
        layouts = [problem.get(name) for name in ("x", "y", "z")[: op.arity]]
        if "transposed" in layouts and len(shape_for(numel)) < 2:
            # a prime count has no 2-d shape, so no transposed view (a key's bucket on the power-of-two ladder starts
            # at one: 257 of (256, 512]); its next count, in the same bucket, is made instead
            numel += 1
            problem = dict(problem, numel=numel)
        shape = (numel,) if op.name in ("arange", "linspace") else shape_for(numel)
        gen = _inputs.rng(seed)
        tensors: dict[str, Tensor] = {}
        out_dtype = dtypes[-1]
        common = common_of(op, dtypes)
        domain = "cast" if op.name == "cast" and out_dtype in INTS else op.domain
        scalars: dict[str, Any] = {}
        for i, name in enumerate(("x", "y", "z")[: op.arity]):
            layout = str(problem[name])
            d = dtypes[i]
            values = operand_values(gen, numel, d, domain, i)
            if domain == "cast" and out_dtype == "uint8":
                values = np.abs(values)
            if op.name == "lerp" and i == 2:
                values = _round_to(gen.uniform(-0.5, 1.5, numel), d)
            if layout == "scalar":
                v = values[-1]
                scalars[name] = bool(v) if d == "bool" else int(v) if d in INTS else float(v)
                continue
            tensors[name] = _layout_tensor(gen, values, shape, layout, d, device)
        out = empty(shape, out_dtype, device)
        if problem["out"] == "strided":
            out = empty(shape[:-1] + (2 * shape[-1],), out_dtype, device)[..., ::2]
        tensors["out"] = out
        params = example_params(op, common)
        scalars["params"] = params
        scalars["common"] = common
        return Inputs(tensors, scalars, ("out",), dict(problem))

    return make_inputs


def plan_for(op: Op, operands: Sequence[Any], common: str, out: Tensor, params: Mapping[str, Any]) -> tuple:
    """(via, compute, kernel params, p_float) of a launch of `op` whose common dtype is `common`."""
    compute = compute_dtype(common, op)
    via = []
    for i in range(3):
        fixed = op.operand_dtypes[i] if i < len(op.operand_dtypes) else None
        via.append(fixed or common)
    resolved = resolve_params(op, params, out, common)
    values = [resolved[name] for name, _ in op.params]
    pcompute = compute
    if op.name in ("arange", "linspace") and compute not in FLOATS:
        pcompute = compute
    kernel_params = [param_arg(v, pcompute) for v in values] + [0] * (3 - len(values))
    if op.name == "arange":
        kernel_params = [param_arg(resolved["start"], pcompute), 0, param_arg(resolved["step"], pcompute)]
    return tuple(via), compute, tuple(kernel_params), pcompute in FLOATS


def _launch_for(op: Op):
    def launch(config: Config, inputs: Inputs) -> None:
        t, s = inputs.tensors, inputs.scalars
        operands = [t.get(n, s.get(n)) for n in ("x", "y", "z")[: op.arity]]
        out = t["out"]
        via, compute, params, p_float = plan_for(op, operands, s["common"], out, s["params"])
        pointwise_call(op.name, *(operands + [None] * (3 - len(operands))), out, via, compute, params, p_float, config)

    return launch


def _oracle_operand(v: Any, dtype: str, compute: str) -> np.ndarray:
    """An operand as the oracle reads it: the values in the common dtype `dtype` (floats as float64, integers as
    int64, bool as bool)."""
    if isinstance(v, Tensor):
        raw = v.numpy() if v.dtype.name in INTS + ("bool",) else v.float64()
    else:
        raw = np.asarray(v)
    if dtype == "bool":
        return np.asarray(raw != 0)
    if dtype in INTS:
        with np.errstate(over="ignore", invalid="ignore"):
            ints = np.asarray(raw).astype(np.float64 if np.asarray(raw).dtype.kind == "f" else np.int64)
            return np.asarray(ints).astype(np.int64).astype(np.dtype(dtype)).astype(np.int64)
    if isinstance(v, Tensor):
        return _round_to(np.asarray(raw, np.float64), dtype)
    # a Python scalar: cast to the common dtype as the kernel's argument is (float32: rounded; half: kept at float32)
    _, bits = scalar_arg(v, dtype, compute)
    return np.asarray(struct.unpack("<d", struct.pack("<q", bits))[0])


def oracle_module():
    """`nbxcert.oracles.pointwise`, looked up when an op is judged."""
    return importlib.import_module("nbxcert.oracles.pointwise")


def _evaluate(fn, operands: list[np.ndarray], kwargs: dict, shape: tuple[int, ...], elementwise: bool):
    """fn(*operands, **kwargs) -> (reference, scale), for a large output in parts of its elements on the process's
    cores (`oracles.parts`; every op here is element by element, glu's halves aside): the same values,
    seconds less a key at 2^25 elements (float division's floor took 5.3 s of one core of the H200's host)."""
    from nbxcert.oracles import parts as _parts

    parts = _parts.part_bounds(math.prod(shape)) if elementwise and any(np.ndim(o) for o in operands) else None
    if parts is None:
        return fn(*operands, **kwargs)
    # each operand flat over the output's elements (a broadcast one made whole); a 0-d one (a scalar) as it is
    flat = [np.broadcast_to(o, shape).reshape(-1) if np.ndim(o) else o for o in operands]

    if sum(1 for o in operands if np.ndim(o)) >= 2:
        return _evaluate_in_tiles(fn, flat, kwargs, parts)

    def part(lo: int, hi: int):
        ref, scale = fn(*(o[lo:hi] if np.ndim(o) else o for o in flat), **kwargs)
        return np.asarray(ref), np.asarray(scale)

    done = _parts.in_parts(part, parts)
    ref = np.concatenate([r for r, _ in done])
    # one scale for every element (an exact op's 0, a view of one value): kept a view of it, not made whole
    constant = {float(s.reshape(-1)[0]) if s.size and not any(s.strides) else None for _, s in done}
    if len(constant) == 1 and None not in constant:
        return ref, np.broadcast_to(np.float64(constant.pop()), ref.shape)
    return ref, np.concatenate([np.broadcast_to(s, r.shape) for r, s in done])


# An op of two or more array operands is judged a tile (`oracles.parts.TILE` elements) at a time within each part, into
# one reference and one scale: whole-part temporaries (a few arrays of each operand's size) were fresh memory faulted
# in at every call (pw_sub's oracle: 3.9 s of 2^25 elements on the H200's host). One-operand ops keep their parts
# whole: their long double functions go tile by tile themselves, through the table of their 16-bit arguments
# (`oracles.elementwise._evaluate`), which a tile smaller than its threshold would skip.
def _evaluate_in_tiles(fn, flat: list, kwargs: dict, parts: list) -> tuple[np.ndarray, np.ndarray]:
    """`_evaluate`'s parts, each a tile at a time into one reference and one scale; a tile's scale that is one
    value for all its elements (a view of it) is noted, not written, and the scale is kept a view of that value where
    every tile's is the same one."""
    from nbxcert.oracles import parts as _parts

    size = parts[-1][1]
    ref, scale = np.empty(size), np.empty(size)

    def part(lo: int, hi: int) -> list:
        constants = []
        for t in _parts.tiles(lo, hi):
            r, sc = fn(*(o[t] if np.ndim(o) else o for o in flat), **kwargs)
            ref[t] = r
            sc = np.asarray(sc)
            if sc.size and not any(sc.strides):
                constants.append((t, float(sc.reshape(-1)[0])))
            else:
                scale[t] = sc
        return constants

    constants = [c for done in _parts.in_parts(part, parts) for c in done]
    tiles = sum(-(-(hi - lo) // _parts.TILE) for lo, hi in parts)
    if len(constants) == tiles and len({v for _, v in constants}) == 1:
        return ref, np.broadcast_to(np.float64(constants[0][1]), ref.shape)
    for t, v in constants:
        scale[t] = v
    return ref, scale


def _oracle_for(op: Op):
    def oracle(inputs: Inputs) -> dict[str, Reference]:
        t, s = inputs.tensors, inputs.scalars
        out = t["out"]
        common = s["common"]
        fn = getattr(oracle_module(), op.oracle or op.name)
        compute = compute_dtype(common, op)
        params = resolve_params(op, s["params"], out, common)
        kwargs = dict(op.oracle_params)
        if op.arity == 0:
            if op.name == "fill":
                ref, scale = fn(out.shape, params["value"], dtype=common)
            elif op.name == "arange":
                start, step = params["start"], params["step"]
                ref, scale = fn(start, start + step * out.numel, step, dtype=common)
            else:
                ref, scale = fn(params["start"], params["end"], out.numel, dtype=common)
        else:
            operands = []
            for i, n in enumerate(("x", "y", "z")[: op.arity]):
                via = op.operand_dtypes[i] if i < len(op.operand_dtypes) and op.operand_dtypes[i] else common
                if op.name == "cast":
                    via = t["x"].dtype.name
                operands.append(_oracle_operand(t.get(n, s.get(n)), via, compute))
            if op.name == "glu":
                # the kernel reads glu's two halves as two operands; the oracle takes the whole input and halves it
                a, b, _ = np.broadcast_arrays(*operands, np.empty(out.shape))
                operands = [np.concatenate([a, b], axis=-1)]
                kwargs["dim"] = -1
            for name, _ in op.params:
                kwargs[name] = params[name]
            if op.name == "cast":
                kwargs = dict(src=t["x"].dtype.name, dtype=out.dtype.name)
            else:
                kwargs["dtype"] = common
            ref, scale = _evaluate(fn, operands, kwargs, out.shape, op.name != "glu")
        shape = out.shape
        ref, scale = np.asarray(ref), np.asarray(scale)
        if ref.size == out.numel:
            ref, scale = ref.reshape(shape), np.broadcast_to(scale, ref.shape).reshape(shape)
        return {"out": Reference(np.broadcast_to(ref, shape), np.broadcast_to(scale, shape))}

    return oracle


def _problem_for(op: Op):
    def problem(*operands, out: Tensor, **_) -> dict:
        return problem_of(op.name, operands, out)

    return problem


def _out_dtype(op: Op):
    def output_dtypes(dtypes: tuple[str, ...]) -> tuple[str, ...]:
        return (dtypes[-1],)

    return output_dtypes


def result_dtype_of(op: Op, common: str) -> str:
    """The result dtype of a uniform-dtype launch (torch's promotion kinds)."""
    if op.kind == "always_bool":
        return "bool"
    if op.kind == "int_to_float" and common not in FLOATS:
        return "float32"
    return common


def common_of(op: Op, dtypes: Sequence[str]) -> str:
    """The common dtype of a launch of one of the spec's uniform dtype tuples (operands, then the output)."""
    if op.arity == 0:
        return dtypes[-1]
    common = dtypes[1] if op.name == "where" else dtypes[0]
    if op.kind == "int_to_float" and common not in FLOATS:
        return "float32"
    return common


def spec_dtypes(op: Op) -> tuple[tuple[str, ...], ...]:
    """The dtype tuples a spec certifies: every operand of one dtype (where's condition bool, masked_fill's mask
    bool), the output of the op's result dtype; a cast: every pair."""
    if op.name == "cast":
        return tuple((s, d) for s in ALL for d in ALL)
    combos = []
    for d in op.dtypes:
        operands = []
        for i in range(op.arity):
            fixed = op.operand_dtypes[i] if i < len(op.operand_dtypes) else None
            operands.append(fixed or d)
        combos.append(tuple(operands) + (result_dtype_of(op, d),))
    return tuple(combos)


def example_problems(op: Op) -> tuple[dict[str, Any], ...]:
    """Tiny problems: a dense one, and one with the other layouts (a broadcast and a strided operand, a strided
    output) where the op has operands."""
    names = ("x", "y", "z")
    dense = {"numel": 37, **{n: ("dense" if i < op.arity else "none") for i, n in enumerate(names)}, "out": "dense"}
    mixed_layouts = ("strided", "broadcast", "dense")
    mixed = {"numel": 96, **{n: (mixed_layouts[i] if i < op.arity else "none") for i, n in enumerate(names)}}
    mixed["out"] = "strided"
    if op.arity != 1:
        return (dense, mixed)
    # odd sizes (17 x 23): the tiled configs' masks on both sides
    transposed = {"numel": 391, "x": "transposed", "y": "none", "z": "none", "out": "dense"}
    return (dense, mixed, transposed)


SPECS: dict[str, Any] = {}


def op_spec(op: Op):
    """The registered `KernelSpec` of one op row: `pw_<name>`, family "pointwise"."""
    names = ("x", "y", "z")[: op.arity]
    spec = family_spec(
        "pointwise",
        f"pw_{op.name}",
        op.description or f"torch.{op.name}, element-wise, through the pointwise map kernel",
        (_map_kernel,),
        problem_args=("numel", "x", "y", "z", "out"),
        key_fields=(KeyField("numel", "numel"), KeyField("x"), KeyField("y"), KeyField("z"), KeyField("out")),
        dtype_args=names + ("out",),
        dtypes=spec_dtypes(op),
        output_dtypes=_out_dtype(op),
        tuning=(flat_candidates(), DEFAULT, prune_flat),
        parts=(make_inputs_for(op), _launch_for(op), _oracle_for(op), _problem_for(op)),
        no_bit_fields=("BLOCK", "TILE_A", "TILE_B", "num_warps"),
        examples=example_problems(op),
        default_for=default_for,
        oracle_name=f"nbxcert.oracles.pointwise.{op.oracle or op.name}",
    )
    SPECS[op.name] = spec
    return spec


for _op in OPS.values():
    op_spec(_op)


def check_dtype(op: Op, common: str) -> None:
    """`DTypeError` (one line) when `op` does not take the common dtype `common`."""
    if common not in op.dtypes:
        raise DTypeError(f"{op.name}: dtype {common} is not supported (takes {', '.join(op.dtypes)})")


# The modules this one imports only when it runs (`oracle_module`, `promotion`, the oracle's parts): inputs of
# every pointwise spec's code digest all the same (`nbxcert.fingerprint`), so a change of an op's oracle or of type
# promotion sweeps the pointwise keys again.
__digest_modules__ = ("nbxcert.oracles.pointwise", "nbxcert.kernels.promotion", "nbxcert.oracles.parts")

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
