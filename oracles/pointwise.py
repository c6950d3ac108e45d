"""Float64 references for the pointwise library: one function per op, named as the op (torch's name).

Every oracle reads `op(*operands, dtype=..., **params) -> (reference, scale)`:

- `operands` are numpy arrays (broadcastable against each other) holding the exact values the kernel reads, already in
  the op's dtype: float values as float64 arrays (each representable in `dtype`), integers as int64 arrays, bools as
  numpy bool arrays. Scalars (alpha, value, min, ...) are Python numbers given by name.
- `dtype` names the tensors' dtype ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32",
  "int64", "bool"): it fixes the integer width (two's complement wrap-around), the defaults (nan_to_num's posinf is
  the dtype's max), the conversion of scalars (threshold's bound is the dtype's value, as torch converts it), the
  overflow of a float result (a value at or past the dtype's max + half an ulp is +-inf, as rounding makes it) and,
  for the half types, the float32 arithmetic torch does where its result depends on it (div's "trunc" quotient).
- `reference` is float64 for a float result, int64 for an integer one (the wrapped value), bool for a bool one;
  `scale` (float64, same shape) is the magnitude the element's error is judged against (`kernels/compare.py`:
  `|out - ref| <= tol(dtype) * scale + half an ulp of dtype at ref`). A scale of 0 means the result must be the
  reference exactly (up to the final rounding into dtype). A non-finite reference has scale 0 (it must be matched
  exactly); a finite reference whose scale overflowed (the terms of a sum near float64's max) has scale float64 max.

The reference is the exact value of the op's definition, rounded once to float64, except where torch's definition is
itself a rounded computation whose rounding changes the answer by more than an ulp (div's "trunc" mode: the quotient
is rounded before it is truncated). Where torch evaluates a formula that only approximates the exact value (lerp's
two-branch form, linspace's two-sided steps) the reference is the exact value and the scale covers torch's rounding.

Accuracy of the references (checked against mpmath at 50 digits, tests/oracles/test_pointwise_oracle.py):

- within 1 ulp of float64 (the house standard, oracles/elementwise.py): exp, tanh, sigmoid, erf (oracles/elementwise),
  and exp2, expm1, log, log2, log1p, rsqrt, sin, cos, tan, atan2, pow, hypot, silu, mish, elu, celu, selu, softplus,
  log_sigmoid, glu: evaluated in x86 80-bit extended precision (`np.longdouble`: the C library's expl, log1pl, sinl,
  powl, ... each within a few units of 2^-64) and rounded once to float64, so within 0.5 ulp + 2^-10 ulp. numpy's
  float64 versions of these are SIMD approximations whose error depends on the CPU (oracles/elementwise.py says why);
  they are not used. Where long double is no wider than float64 these refuse to run.
- correctly rounded (0.5 ulp): sqrt, reciprocal, div, mul and add/sub of two operands of a type narrower than float64
  (exact), and every exact op below.
- gelu: oracles/elementwise.gelu (erf from the C library, two more float64 roundings): within 2 ulp of its terms.
- lerp, addcdiv, addcmul, add/sub with alpha, hardswish's and hardsigmoid's linear parts, arange, linspace: evaluated in
  extended precision and rounded once: within 2^-62 of their scale (far below any tolerance).

Error scales (times the dtype's tolerance):

- exact results, scale 0: abs, neg, sign, floor, ceil, round, trunc, relu, threshold, maximum, minimum, fmod,
  remainder (where fmod's result is kept), div "floor" (the floor of the exact quotient, +-inf past the dtype's
  range), every comparison, logical and bitwise op, isnan/isinf/isfinite, nan_to_num, clamp (and _min/_max), where,
  masked_fill, copy, fill, zeros, ones, full, cast (the reference is the value rounded into the target, by this
  module's own rounding code), and every integer or bool result.
- the result's own magnitude |ref| (a chain of products, quotients and monotone functions, no cancellation; a
  correctly rounded implementation is within half an ulp of it): exp, exp2, expm1, log, log2, log1p, sqrt, rsqrt,
  reciprocal, sin, cos, tan, tanh, erf, sigmoid, silu, mish, elu, celu, selu, leaky_relu, softplus, log_sigmoid, glu,
  mul, div (true division), pow, atan2, hypot.
- div "trunc": |ref| (the quotient rounded in the dtype's arithmetic, float32 for the half types, then truncated).
- gelu: 0.5 |x| (1 + |f|) with f = erf(x / sqrt 2) or the tanh form's tanh (oracles/elementwise.gelu: the two terms of
  0.5 x + 0.5 x f; the textbook formula cancels in the left tail).
- add / sub: |a| + |alpha b|; addcmul: |input| + |value t1 t2|; addcdiv: |input| + |value t1 / t2| (the terms).
- lerp: |start| + |end| + |weight (end - start)|: covers both of torch's branches, start + w (end - start) for
  w < 0.5 and end - (end - start)(1 - w) otherwise (the exact value is the same; their roundings differ).
- remainder where fmod's result r was moved by the divisor (r + b): |b| (that sum is rounded).
- hardsigmoid: (|x| + 3) / 6 inside (-3, 3) (x + 3 is rounded), 0 where it saturates; hardsigmoid(NaN) = NaN
  (std::max/min keep a first NaN argument); hardswish: |x| (|x| + 3) / 6 inside, |x| where it is x, 0 where it is
  0; in float64 hardswish is +inf where torch's float64 product x * 6 overflows (x > max / 6).
- float64 outputs of a formula of several roundings (sigmoid, silu, mish, elu, celu, selu, softplus, log_sigmoid,
  glu): instead of |ref|, a bound on torch's float64 evaluation of that formula (`_f64_formula_scale`: each rounding
  counted in units of 2^-53 at the magnitude it reaches the result with; 1 per + - * / or rounded constant, 2 per
  library function within 1 ulp), stated at each op. float64 is torch's compute type there, so its result carries
  those roundings; the other dtypes keep |ref| (their compute type is wider than the output in nbxcert's kernel).
- arange: |start| + |i step|; linspace: |start| + |end| (torch's two-sided form adds one of them to a multiple of the
  step that is at most |end - start|).

Refusals, as torch refuses or as nbxcert refuses what torch leaves undefined: an op given a dtype it does not take
(bitwise ops on floats, transcendental functions on integers, arithmetic negation of bools, ...) raises `TypeError`
naming the op and the dtype; integer division or remainder by zero raises `ZeroDivisionError` naming the op; a float to
integer cast of NaN, +-inf or a value outside the integer's range, an integer raised to a negative Python-scalar power
(a negative exponent in an array is torch's 1, +-1 or 0), a scalar that does not fit the dtype (torch's checked
conversion: masked_fill(int8, 300), fill(float16, 1e5)), a float scalar given to an integer op, celu with alpha 0, glu
over an odd size, arange with a zero step or the wrong sign raise `ValueError` naming the op.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from nbxcert.oracles import elementwise as _ew
from nbxcert.oracles import parts as _parts

# --- dtypes -----------------------------------------------------------------------------------------------------------
# float formats: (precision in bits including the implicit one, smallest normal exponent, largest finite value)
FLOAT_FORMATS = {
    "float16": (11, -14, 65504.0),
    "bfloat16": (8, -126, float.fromhex("0x1.fep127")),
    "float32": (24, -126, float.fromhex("0x1.fffffep127")),
    "float64": (53, -1022, float.fromhex("0x1.fffffffffffffp1023")),
}
# integer types: (bits, signed)
INT_TYPES = {"int8": (8, True), "uint8": (8, False), "int16": (16, True), "int32": (32, True), "int64": (64, True)}
FLOAT_NAMES = tuple(FLOAT_FORMATS)
INT_NAMES = tuple(INT_TYPES)
ALL_NAMES = (*FLOAT_NAMES, *INT_NAMES, "bool")
_F64_MAX = FLOAT_FORMATS["float64"][2]


def kind_of(op: str, dtype: str) -> str:
    """'float', 'int' or 'bool' for a dtype name; `ValueError` naming the op for an unknown one (float8 included: no
    pointwise op takes it)."""
    if dtype in FLOAT_FORMATS:
        return "float"
    if dtype in INT_TYPES:
        return "int"
    if dtype == "bool":
        return "bool"
    raise ValueError(f"{op}: dtype {dtype!r} is not one the pointwise ops take ({', '.join(ALL_NAMES)})")


def int_range(dtype: str) -> tuple[int, int]:
    """(min, max) of an integer dtype."""
    bits, signed = INT_TYPES[dtype]
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def _takes(op: str, dtype: str, kinds: str) -> str:
    """The dtype's kind, or `TypeError` when the op does not take that kind ('f' float, 'i' int, 'b' bool)."""
    kind = kind_of(op, dtype)
    if kind[0] not in kinds:
        names = {"f": "floating", "i": "integer", "b": "bool"}
        takes = ", ".join(names[k] for k in kinds)
        raise TypeError(f"{op}: does not take dtype {dtype} (it takes {takes} dtypes)")
    return kind


def wrap(v, dtype: str) -> np.ndarray:
    """Integer values (int64, possibly already wrapped modulo 2^64) wrapped into the dtype's width, two's complement."""
    bits, signed = INT_TYPES[dtype]
    u = np.asarray(v, dtype=np.int64).astype(np.uint64)  # the low 64 bits, as numpy's int64 arithmetic leaves them
    if bits == 64:
        return u.astype(np.int64)
    mask = np.uint64((1 << bits) - 1)
    if not signed:
        return (u & mask).astype(np.int64)
    half = np.uint64(1 << (bits - 1))
    return ((u + half) & mask).astype(np.int64) - np.int64(1 << (bits - 1))


def round_to(x, dtype: str) -> np.ndarray:
    """Float64 values rounded to the nearest value of the float format `dtype`, ties to even; past the largest finite
    value (at or beyond max + half an ulp of max) +-inf; NaN stays NaN; signed zeros kept.

    This module's own rounding (not the tensor layer's): the value is scaled by a power of two so that the format's
    ulp at it becomes 1, rounded to an integer half to even (np.rint), and scaled back; both scalings are exact."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return x.copy()
    prec, emin, fmax = FLOAT_FORMATS[dtype]
    finite = np.isfinite(x)
    small = finite & (np.abs(x) < 2.0 * fmax)  # beyond that: inf whatever the rounding; keeps the scaling in range
    _, e = np.frexp(np.where(small, x, 1.0))  # |x| in [2^(e-1), 2^e)
    q = np.maximum(e - prec, emin - prec + 1)  # the ulp's exponent, floored at the subnormal spacing
    rounded = np.ldexp(np.rint(np.ldexp(np.where(small, x, 0.0), -q)), q)
    rounded = np.copysign(rounded, x)  # a value rounded to zero keeps its sign
    out = np.where(small, rounded, x)
    over = finite & (np.abs(out) > fmax)
    return np.where(over, np.copysign(np.inf, x), out)


def round_int_to(v, dtype: str) -> np.ndarray:
    """Integer values (int64) rounded once, to nearest even, into the float format `dtype` (as float64 values). Exact
    integer arithmetic: an int64 beyond 2^53 would be rounded twice by a float64 detour."""
    v = np.asarray(v, dtype=np.int64)
    prec, _, fmax = FLOAT_FORMATS[dtype]
    mag = v.astype(np.uint64)
    neg = v < 0
    mag = np.where(neg, (~mag) + np.uint64(1), mag)  # |v| as uint64; |INT64_MIN| = 2^63 is representable
    bitlen = np.zeros(v.shape, dtype=np.int64)
    for k in range(64):
        bitlen += (mag >> np.uint64(k)) > 0
    shift = np.maximum(bitlen - prec, 0).astype(np.uint64)
    q = mag >> shift
    rem = mag - (q << shift)
    half = np.where(shift > 0, np.uint64(1) << (np.maximum(shift, np.uint64(1)) - np.uint64(1)), np.uint64(0))
    up = (shift > 0) & ((rem > half) | ((rem == half) & ((q & np.uint64(1)) == 1)))
    q = q + up.astype(np.uint64)
    value = np.ldexp(q.astype(np.float64), shift.astype(np.int64))  # q <= 2^prec: exact in float64
    value = np.where(value > fmax, np.inf, value)
    return np.where(neg, -value, value)


def checked_scalar(op: str, name: str, value, dtype: str, *, truncate: bool = False):
    """A Python scalar converted to `dtype` as torch converts a Scalar argument (c10's checked conversion): a float
    scalar keeps its exact value (the reference rounds once at the end) but a finite one past the dtype's largest
    value is refused; an integer dtype takes integers in its range (a float only with `truncate`, as full/fill do,
    toward zero; NaN/inf refused); bool takes anything (nonzero is True)."""
    kind = kind_of(op, dtype)
    if kind == "bool":
        return bool(value)
    if isinstance(value, complex):
        raise ValueError(f"{op}: {name}={value!r} is complex; the pointwise ops take real scalars")
    if kind == "float":
        v = float(value)
        if math.isfinite(v) and math.fabs(v) > FLOAT_FORMATS[dtype][2]:
            raise ValueError(f"{op}: {name}={value!r} cannot be converted to {dtype} without overflow")
        return v
    if isinstance(value, float):
        if not truncate:
            raise ValueError(f"{op}: {name}={value!r} is a float; an {dtype} op takes integer scalars")
        if not math.isfinite(value):
            raise ValueError(f"{op}: {name}={value!r} cannot be converted to {dtype}")
        value = math.trunc(value)
    lo, hi = int_range(dtype)
    if not lo <= int(value) <= hi:
        raise ValueError(f"{op}: {name}={value!r} cannot be converted to {dtype} without overflow")
    return int(value)


def _ints(op: str, dtype: str, *xs) -> list[np.ndarray]:
    """Integer operands as int64 arrays, each checked to lie in the dtype's range (a value outside it is not one the
    kernel can read)."""
    lo, hi = int_range(dtype)
    out = []
    for x in xs:
        a = np.asarray(x)
        if a.dtype.kind not in "iub":
            raise TypeError(f"{op}: an {dtype} operand must hold integers, got numpy {a.dtype}")
        a = a.astype(np.int64)
        if a.size and (a.min() < lo or a.max() > hi):
            raise ValueError(f"{op}: an operand holds values outside {dtype}'s range [{lo}, {hi}]")
        out.append(a)
    return out


def _floats(*xs) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in xs]


def _bools(*xs) -> list[np.ndarray]:
    return [np.asarray(x).astype(bool) for x in xs]


def _operands(op: str, dtype: str, kind: str, *xs) -> list[np.ndarray]:
    if kind == "float":
        return _floats(*xs)
    if kind == "int":
        return _ints(op, dtype, *xs)
    return _bools(*xs)


def _exact(ref) -> tuple[np.ndarray, np.ndarray]:
    """An exact result: scale 0 for every element, one read-only zero seen at every index (an array of zeros of a 2^25
    element output was 268 MB of new memory to touch for nothing)."""
    ref = np.asarray(ref)
    return ref, np.broadcast_to(np.float64(0.0), ref.shape)


def _float_result(ref, scale, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """A float reference overflowed to +-inf past the dtype's range (rounding does so), and its scale made usable: 0
    where the reference is not finite, float64 max where a finite reference's scale overflowed."""
    ref = np.asarray(ref, dtype=np.float64)
    scale = np.broadcast_to(np.abs(np.asarray(scale, dtype=np.float64)), ref.shape)
    if dtype != "float64":
        prec, _, fmax = FLOAT_FORMATS[dtype]
        overflow_at = fmax + math.ldexp(1.0, math.frexp(fmax)[1] - prec - 1)  # max + half an ulp of max
        ref = np.where(np.abs(ref) >= overflow_at, np.copysign(np.inf, ref), ref)
    finite = np.isfinite(ref)
    scale = np.where(finite, np.where(np.isfinite(scale), scale, _F64_MAX), 0.0)
    return ref, scale


def _int_result(v, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    return _exact(wrap(v, dtype))


# --- extended precision -----------------------------------------------------------------------------------------------
_LD = np.longdouble


def _extended(fn, *xs) -> np.ndarray:
    """fn evaluated on the operands widened to long double (x86 80-bit: 64 significand bits), rounded once to float64.
    Large operands run in parts on threads (`oracles.parts.elementwise_in_parts`); one operand tile by tile, through
    the table of its 16-bit values where a tile holds only those (`oracles.elementwise._evaluate`: the same values)."""
    _ew._require_extended()

    def run(*args):
        with np.errstate(all="ignore"):  # set here: the parts run on threads, which do not inherit numpy's state
            return np.asarray(fn(*(a.astype(_LD) for a in args))).astype(np.float64)

    xs = _floats(*xs)
    if len(xs) == 1:  # tile by tile, a tile of 16-bit arguments through their table (`oracles.elementwise._evaluate`)
        return _ew._evaluate(run, xs[0], remember=False)
    return _parts.elementwise_in_parts(run, *np.broadcast_arrays(*xs))


def _softplus_ld(t):
    """log(1 + e^t) in long double, in the form that neither overflows nor cancels: max(t, 0) + log1p(e^-|t|)."""
    return np.maximum(t, _LD(0)) + np.log1p(np.exp(-np.abs(t)))


# --- unary math -------------------------------------------------------------------------------------------------------
def abs(x, *, dtype: str):  # torch's name (shadows the builtin in this module)
    """|x|; integers wrap (abs(INT_MIN) == INT_MIN); bool not taken."""
    kind = _takes("abs", dtype, "fi")
    (x,) = _operands("abs", dtype, kind, x)
    return _exact(np.abs(x)) if kind == "float" else _int_result(np.abs(x), dtype)


def neg(x, *, dtype: str):
    """-x; integers wrap (-INT_MIN == INT_MIN, uint8: 256 - x); bool refused as torch refuses `-` on bools."""
    kind = _takes("neg", dtype, "fi")
    (x,) = _operands("neg", dtype, kind, x)
    return _exact(-x) if kind == "float" else _int_result(-x, dtype)


def _transcendental(op: str, fn, x, dtype: str):
    _takes(op, dtype, "f")
    ref = fn(np.asarray(x, dtype=np.float64))
    return _float_result(ref, np.abs(ref), dtype)


def exp(x, *, dtype: str):
    """e^x (oracles/elementwise.exp)."""
    return _transcendental("exp", _ew.exp, x, dtype)


def exp2(x, *, dtype: str):
    """2^x."""
    return _transcendental("exp2", lambda v: _extended(np.exp2, v), x, dtype)


def expm1(x, *, dtype: str):
    """e^x - 1, accurate near 0."""
    return _transcendental("expm1", lambda v: _extended(np.expm1, v), x, dtype)


def log(x, *, dtype: str):
    """Natural log; log(+-0) = -inf, log(x < 0) = NaN."""
    return _transcendental("log", lambda v: _extended(np.log, v), x, dtype)


def log2(x, *, dtype: str):
    """Base-2 log."""
    return _transcendental("log2", lambda v: _extended(np.log2, v), x, dtype)


def log1p(x, *, dtype: str):
    """log(1 + x), accurate near 0; log1p(-1) = -inf."""
    return _transcendental("log1p", lambda v: _extended(np.log1p, v), x, dtype)


def sqrt(x, *, dtype: str):
    """Square root (IEEE: correctly rounded); sqrt(-0) = -0, sqrt(x < 0) = NaN."""
    return _transcendental("sqrt", np.sqrt, x, dtype)


def rsqrt(x, *, dtype: str):
    """1 / sqrt(x); rsqrt(+0) = inf, rsqrt(-0) = -inf, rsqrt(inf) = 0."""
    return _transcendental("rsqrt", lambda v: _extended(lambda t: _LD(1) / np.sqrt(t), v), x, dtype)


def reciprocal(x, *, dtype: str):
    """1 / x (correctly rounded in float64); 1/+-0 = +-inf."""
    return _transcendental("reciprocal", lambda v: 1.0 / v, x, dtype)


def sin(x, *, dtype: str):
    """sin x (the C library's sinl, its argument reduction exact at any argument)."""
    return _transcendental("sin", lambda v: _extended(np.sin, v), x, dtype)


def cos(x, *, dtype: str):
    """cos x."""
    return _transcendental("cos", lambda v: _extended(np.cos, v), x, dtype)


def tan(x, *, dtype: str):
    """tan x."""
    return _transcendental("tan", lambda v: _extended(np.tan, v), x, dtype)


def tanh(x, *, dtype: str):
    """tanh x (oracles/elementwise.tanh)."""
    return _transcendental("tanh", _ew.tanh, x, dtype)


def erf(x, *, dtype: str):
    """erf x (oracles/elementwise.erf)."""
    return _transcendental("erf", _ew.erf, x, dtype)


def sigmoid(x, *, dtype: str):
    """1 / (1 + e^-x) (oracles/elementwise.sigmoid). In float64, torch's formula's roundings: exp (2), the sum (1,
    condition number <= 1), the quotient (1) (`_f64_formula_scale`)."""
    ref, scale = _transcendental("sigmoid", _ew.sigmoid, x, dtype)
    return ref, (_f64_formula_scale(4 * scale) if dtype == "float64" else scale)


def sign(x, *, dtype: str):
    """-1, 0 or 1 as torch computes it, (0 < x) - (x < 0): sign(NaN) = 0 and sign(-0.0) = 0; bool: x itself."""
    kind = kind_of("sign", dtype)
    (x,) = _operands("sign", dtype, kind, x)
    if kind == "bool":
        return _exact(x.copy())
    s = (x > 0).astype(np.int64) - (x < 0).astype(np.int64)
    return _exact(s.astype(np.float64)) if kind == "float" else _exact(s)


def _rounding(op: str, fn, x, dtype: str):
    kind = _takes(op, dtype, "fi")
    (x,) = _operands(op, dtype, kind, x)
    return _exact(fn(x)) if kind == "float" else _exact(x.copy())  # an integer is its own floor, ceil, ...


def floor(x, *, dtype: str):
    """Largest integer <= x; integers unchanged; bool not taken."""
    return _rounding("floor", np.floor, x, dtype)


def ceil(x, *, dtype: str):
    """Smallest integer >= x."""
    return _rounding("ceil", np.ceil, x, dtype)


def round(x, *, dtype: str):  # torch's name (shadows the builtin in this module)
    """Nearest integer, halves to even (torch.round: round(2.5) = 2, round(-0.5) = -0)."""
    return _rounding("round", np.rint, x, dtype)


def trunc(x, *, dtype: str):
    """x rounded toward zero."""
    return _rounding("trunc", np.trunc, x, dtype)


# --- activations ------------------------------------------------------------------------------------------------------
def relu(x, *, dtype: str):
    """max(x, 0), NaN kept (torch's relu is clamp_min(x, 0), which propagates NaN); integers too, bool refused."""
    kind = _takes("relu", dtype, "fi")
    (x,) = _operands("relu", dtype, kind, x)
    return _exact(np.maximum(x, 0))


def gelu(x, *, dtype: str, approximate: str = "none"):
    """GELU, erf form ("none") or tanh form ("tanh"), as oracles/elementwise.gelu (its scale)."""
    _takes("gelu", dtype, "f")
    ref, scale = _ew.gelu(np.asarray(x, dtype=np.float64), approximate)
    return _float_result(ref, scale, dtype)


def _activation(op: str, fn, x, dtype: str, roundings=None):
    """fn's exact value (extended precision, rounded once). Scale: |ref|; in float64, where torch's compute type is
    the output's own, `roundings(x, ref)` (if given) bounds torch's float64 evaluation of its formula instead (see
    `_f64_formula_scale`)."""
    _takes(op, dtype, "f")
    ref = _extended(fn, x)
    scale = np.abs(ref)
    if roundings is not None and dtype == "float64":
        with np.errstate(all="ignore"):
            scale = _f64_formula_scale(roundings(np.asarray(x, dtype=np.float64), ref))
    return _float_result(ref, scale, dtype)


def _f64_formula_scale(bound):
    """The scale of a float64 result computed by a formula of several roundings: `bound` is the sum over its
    roundings of (their count in units of 2^-53, float64's half ulp: 1 for a correctly rounded + - * / or a rounded
    constant, 2 for a library function within 1 ulp: CUDA's exp, expm1, log1p, tanh) x (the magnitude that rounding
    reaches the result with: |ref| where the function's condition number in that argument is at most 1). The
    tolerance multiplies the scale by float64's epsilon 2^-52, so the scale is bound / 2."""
    return np.abs(bound) / 2.0


def silu(x, *, dtype: str):
    """x / (1 + e^-x); silu(-inf) = -inf / inf = NaN, as torch's formula gives."""
    # torch: x / (1 + exp(-x)): exp (2), the sum (1), the quotient (1); the sum's condition number in exp(-x) is <= 1
    return _activation("silu", lambda t: t / (_LD(1) + np.exp(-t)), x, dtype, lambda x, r: 4 * r)


def mish(x, *, dtype: str):
    """x tanh(softplus(x)); mish(-inf) = -inf * 0 = NaN, as torch's formula gives."""
    # torch: x tanh(log1p(exp(x))): exp (2) and log1p (2), each reaching the result with condition numbers <= 1
    # (log1p(e) in e: e / ((1 + e) log1p(e)); tanh(s) in s: 2s / sinh(2s)), tanh (2), the product (1)
    return _activation("mish", lambda t: t * np.tanh(_softplus_ld(t)), x, dtype, lambda x, r: 7 * r)


def _elu_form(op: str, x, dtype: str, alpha, scale, input_scale, roundings):
    """torch's elu family: x > 0 ? scale x : alpha scale (e^(input_scale x) - 1), NaN kept. The coefficients are long
    doubles (or exact Python floats). `roundings`: torch's float64 roundings (units of 2^-53, `_f64_formula_scale`)
    on the positive and the negative side (expm1's condition number in its argument t < 0 is t e^t / (e^t - 1) <=
    1)."""
    al, sc, ins = _LD(alpha), _LD(scale), _LD(input_scale)

    def fn(t):
        negative = al * sc * np.expm1(t * ins)
        return np.where(t > 0, t * sc, np.where(np.isnan(t), t, negative))

    pos, neg = roundings
    return _activation(op, fn, x, dtype, lambda x, r: np.where(x > 0, pos, neg) * r)


def elu(x, *, dtype: str, alpha: float = 1.0):
    """x > 0 ? x : alpha (e^x - 1). torch's float64 roundings: x itself (scale |x|); expm1 (2) and the product (1)."""
    return _elu_form("elu", x, dtype, float(alpha), 1.0, 1.0, (2, 3))


def celu(x, *, dtype: str, alpha: float = 1.0):
    """max(0, x) + min(0, alpha (e^(x/alpha) - 1)); alpha = 0 refused (torch: division by zero)."""
    _takes("celu", dtype, "f")
    if float(alpha) == 0.0:
        raise ValueError("celu: alpha=0 is refused (x / alpha divides by zero)")
    al = _LD(float(alpha))

    def fn(t):
        return np.where(t > 0, t, np.where(np.isnan(t), t, al * np.expm1(t / al)))

    # torch: elu with input scale 1 / alpha: that constant (1), x times it (1), expm1 (2), the product (1)
    return _activation("celu", fn, x, dtype, lambda x, r: np.where(x > 0, 2, 5) * r)


# torch's constants (aten/src/ATen/native/Activation.cpp, from Klambauer et al. 2017), as decimal strings so that the
# long double evaluation reads them to 64 bits
SELU_ALPHA = "1.6732632423543772848170429916717"
SELU_SCALE = "1.0507009873554804934193349852946"


def selu(x, *, dtype: str):
    """SELU_SCALE (x > 0 ? x : SELU_ALPHA (e^x - 1))."""
    _takes("selu", dtype, "f")
    # torch's float64 roundings: x > 0: the constant (1), the product (1); else the two constants and their product
    # (3), expm1 (2), the product (1)
    return _elu_form("selu", x, dtype, np.longdouble(SELU_ALPHA), np.longdouble(SELU_SCALE), 1.0, (2, 6))


def leaky_relu(x, *, dtype: str, negative_slope: float = 0.01):
    """x > 0 ? x : negative_slope x."""
    slope = _LD(float(negative_slope))
    return _activation("leaky_relu", lambda t: np.where(t > 0, t, t * slope), x, dtype)


def hardsigmoid(x, *, dtype: str):
    """min(max(x + 3, 0), 6) / 6 (NaN propagates)."""
    _takes("hardsigmoid", dtype, "f")
    x = np.asarray(x, dtype=np.float64)
    ref = _extended(lambda t: np.minimum(np.maximum(t + _LD(3), _LD(0)), _LD(6)) / _LD(6), x)
    inside = (x > -3) & (x < 3)
    return _float_result(ref, np.where(inside, (np.abs(x) + 3) / 6, 0.0), dtype)


def hardswish(x, *, dtype: str):
    """x min(max(x + 3, 0), 6) / 6; hardswish(-inf) = -inf * 0 = NaN, as torch's formula gives. In float64, torch's
    compute type is the output's own and its product x * 6 overflows for x > max / 6: the result is +inf there, as
    torch gives (float32 and the half types are judged by the formula's exact value: float32 is computed wider here).
    """
    _takes("hardswish", dtype, "f")
    x = np.asarray(x, dtype=np.float64)
    ref = _extended(lambda t: t * np.minimum(np.maximum(t + _LD(3), _LD(0)), _LD(6)) / _LD(6), x)
    if dtype == "float64":
        with np.errstate(over="ignore", invalid="ignore"):
            product = x * np.minimum(np.maximum(x + 3.0, 0.0), 6.0)  # torch's float64 product, rounded
        ref = np.where(np.isinf(product) & np.isfinite(x), product, ref)
    inside = (x > -3) & (x < 3)
    scale = np.where(inside, np.abs(x) * (np.abs(x) + 3) / 6, np.where(x >= 3, np.abs(x), 0.0))
    return _float_result(ref, scale, dtype)


def softplus(x, *, dtype: str, beta: float = 1.0, threshold: float = 20.0):
    """beta x > threshold ? x : log(1 + e^(beta x)) / beta (torch reverts to the identity past the threshold)."""
    b, th = _LD(float(beta)), _LD(float(threshold))

    def fn(t):
        bt = t * b
        return np.where(bt > th, t, _softplus_ld(bt) / b)

    def roundings(x, r):
        """torch: log1p(exp(beta x)) / beta: the product beta x (1) reaches the result times its derivative
        sigmoid(beta x), so as |x| sigmoid(beta x); exp (2) and log1p (2) with condition numbers <= 1, the quotient
        (1). The identity side is x itself."""
        bx = x * float(beta)
        sig = 0.5 * (1.0 + np.tanh(0.5 * bx))  # sigmoid without overflow (a magnitude: its rounding is immaterial)
        return np.where(bx > float(threshold), 2 * r, np.abs(x) * sig + 5 * np.abs(r))

    return _activation("softplus", fn, x, dtype, roundings)


def log_sigmoid(x, *, dtype: str):
    """log(1 / (1 + e^-x)) = min(x, 0) - log1p(e^-|x|)."""
    # torch: min(x, 0) - log1p(exp(-|x|)) (two terms of one sign): exp (2) and log1p (2), the difference (1)
    return _activation("log_sigmoid", lambda t: -_softplus_ld(-t), x, dtype, lambda x, r: 5 * r)


def threshold(x, *, dtype: str, threshold: float, value: float):
    """x <= threshold ? value : x, with threshold and value converted to the dtype first (torch converts both
    Scalars to the tensor's type: the comparison is against the dtype's value of threshold); NaN stays NaN."""
    kind = _takes("threshold", dtype, "fi")
    (x,) = _operands("threshold", dtype, kind, x)
    th = checked_scalar("threshold", "threshold", threshold, dtype)
    val = checked_scalar("threshold", "value", value, dtype)
    if kind == "float":
        th, val = float(round_to(th, dtype)), float(round_to(val, dtype))
    return _exact(np.where(x <= th, val, x).astype(x.dtype))


def glu(x, *, dtype: str, dim: int = -1):
    """a sigmoid(b), a and b the first and second halves of x along `dim` (an odd size refused, as torch does)."""
    _takes("glu", dtype, "f")
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("glu: a 0-d input has no dimension to halve")
    n = x.shape[dim]
    if n % 2:
        raise ValueError(f"glu: halving dimension {dim} must be even, got size {n}")
    a, b = np.split(x, 2, axis=dim)
    ref = _extended(lambda s, t: s / (_LD(1) + np.exp(-t)), a, b)
    scale = np.abs(ref)
    if dtype == "float64":
        # torch: a (1 / (1 + exp(-b))): exp (2), the sum (1, condition number <= 1), the quotient (1), the product (1)
        scale = _f64_formula_scale(5 * scale)
    return _float_result(ref, scale, dtype)


# --- binary -----------------------------------------------------------------------------------------------------------
def _add_like(op: str, a, b, alpha, dtype: str, sign: int):
    kind = kind_of(op, dtype)
    if kind == "bool":
        if sign < 0:
            raise TypeError(f"{op}: does not take two bool tensors (torch refuses `-` on bools; use logical_xor)")
        a, b = _bools(a, b)
        return _exact(a | (b & bool(alpha)))
    a, b = _operands(op, dtype, kind, a, b)
    if kind == "int":
        al = checked_scalar(op, "alpha", alpha, dtype)
        return _int_result(a + sign * (al * b), dtype)  # numpy's int64 products and sums wrap modulo 2^64
    al = float(alpha)
    ref = _extended(lambda s, t: s + _LD(sign * al) * t, a, b)
    return _float_result(ref, np.abs(a) + np.abs(al * b), dtype)


def add(a, b, *, dtype: str, alpha=1):
    """a + alpha b; integers wrap; bools: a or (b and alpha)."""
    return _add_like("add", a, b, alpha, dtype, 1)


def sub(a, b, *, dtype: str, alpha=1):
    """a - alpha b; integers wrap; two bools refused."""
    return _add_like("sub", a, b, alpha, dtype, -1)


def mul(a, b, *, dtype: str):
    """a b; integers wrap; bools: and."""
    kind = kind_of("mul", dtype)
    a, b = _operands("mul", dtype, kind, a, b)
    if kind == "bool":
        return _exact(a & b)
    if kind == "int":
        return _int_result(a * b, dtype)
    ref = a * b  # correctly rounded; exact for operands of a type narrower than float64
    return _float_result(ref, np.abs(ref), dtype)


def _check_divisor(op: str, b: np.ndarray) -> None:
    if np.any(b == 0):
        raise ZeroDivisionError(f"{op}: integer division by zero (nbxcert refuses it, as torch does on the CPU)")


def _int_floor_div(a, b):
    """Floor division of int64 arrays, INT64_MIN // -1 wrapping to INT64_MIN (two's complement)."""
    a, b = np.broadcast_arrays(a, b)
    minus_one = b == -1
    q = np.floor_divide(a, np.where(minus_one, 1, b))
    return np.where(minus_one, -a, q)  # numpy's int64 negation wraps INT64_MIN to itself


def _int_trunc_div(a, b):
    """C's truncating division of int64 arrays (the floor quotient moved up by one where it was inexact and the
    signs differ)."""
    a, b = np.broadcast_arrays(a, b)
    q = _int_floor_div(a, b)
    inexact = (b != -1) & (a - q * b != 0)
    return np.where(inexact & ((a < 0) != (b < 0)), q + 1, q)


def div(a, b, *, dtype: str, rounding_mode: str | None = None):
    """a / b. rounding_mode None: true division (float dtypes only: integers are promoted by the caller); "floor":
    the floor of the exact quotient (torch's div_floor_floating, Python's float //; a zero divisor gives IEEE's
    a / b; a quotient past the dtype's range is +-inf, as storing torch's float32 result into a half type makes it);
    "trunc": the quotient rounded in the dtype's arithmetic (float32 for the half types) then truncated, as
    torch computes trunc(a / b). Integers: C truncation or Python floor, wrapping (INT_MIN / -1 == INT_MIN); a zero
    divisor raises ZeroDivisionError."""
    if rounding_mode not in (None, "trunc", "floor"):
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    kind = _takes("div", dtype, "f" if rounding_mode is None else "fi")
    a, b = _operands("div", dtype, kind, a, b)
    if kind == "int":
        _check_divisor("div", b)
        q = _int_floor_div(a, b) if rounding_mode == "floor" else _int_trunc_div(a, b)
        return _int_result(q, dtype)
    q = a / b
    if rounding_mode is None:
        return _float_result(q, np.abs(q), dtype)
    if rounding_mode == "floor":
        ref = np.where(b == 0, q, np.floor_divide(a, np.where(b == 0, 1.0, b)))
        ref = np.where((ref == 0) & (b != 0), np.copysign(0.0, q), ref)  # a zero quotient keeps its sign
        return _float_result(ref, 0.0, dtype)  # exact, but a quotient past the dtype's range is +-inf
    # the float64 quotient is correctly rounded, and rounding it again to float32 is too (53 >= 2 * 24 + 2)
    ref = np.trunc(round_to(q, "float64" if dtype == "float64" else "float32"))
    return _float_result(ref, np.abs(ref), dtype)


def _int_pow(a, b):
    """a ** b for int64 arrays, b >= 0, modulo 2^64 (square and multiply in uint64, whose products wrap)."""
    base, e = (v.astype(np.uint64) for v in np.broadcast_arrays(a, b))
    result = np.ones(base.shape, dtype=np.uint64)
    while np.any(e):
        odd = (e & np.uint64(1)).astype(bool)
        result = np.where(odd, result * base, result)
        base = base * base
        e = e >> np.uint64(1)
    return result.astype(np.int64)


def pow(a, b, *, dtype: str):  # torch's name (shadows the builtin in this module)
    """a ** b. Floats: C's pow (pow(x, 0) = 1 and pow(1, y) = 1 even for NaN, a negative base to a non-integer power is
    NaN, pow(+-0, negative odd integer) = +-inf). Integers: exact power, wrapping; 0 ** 0 = 1; a negative exponent
    in an array gives what torch's integer pow gives (1 for base 1, +-1 for base -1 by the exponent's parity, else 0:
    the truncated 1 / a^-b); a negative Python-scalar exponent raises ValueError (torch: "Integers to negative integer
    powers are not allowed"). bool not taken."""
    kind = _takes("pow", dtype, "fi")
    scalar_exponent = isinstance(b, int | float) and not isinstance(b, bool)
    a, b = _operands("pow", dtype, kind, a, b)
    if kind == "int":
        if scalar_exponent and b < 0:
            raise ValueError("pow: integers to negative integer powers are not allowed")
        a, b = np.broadcast_arrays(a, b)
        negative = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 != 0, -1, 1), 0))
        return _int_result(np.where(b < 0, negative, _int_pow(a, np.maximum(b, 0))), dtype)
    ref = _extended(np.power, a, b)
    # an infinite base by C99's rules (F.9.4.4), not the C library's powl: glibc's gives pow(-inf, -2^63) = +inf
    # (-2^63 is an even integer: the result is +0)
    a, b = np.broadcast_arrays(a, b)
    odd = np.isfinite(b) & (np.floor(b) == b) & (np.abs(b) < 2.0**53) & (np.fmod(b, 2.0) != 0)
    with np.errstate(invalid="ignore"):
        magnitude = np.where(b < 0, 0.0, np.inf)
    signed = np.where((a < 0) & odd, -magnitude, magnitude)
    ref = np.where(np.isinf(a) & (b != 0) & ~np.isnan(b), signed, ref)
    return _float_result(ref, np.abs(ref), dtype)


def remainder(a, b, *, dtype: str):
    """a - floor(a / b) b, the divisor's sign (Python's %): torch computes r = fmod(a, b) and adds b when r is nonzero
    and of the other sign than b. Integers: a zero divisor raises ZeroDivisionError."""
    kind = _takes("remainder", dtype, "fi")
    a, b = _operands("remainder", dtype, kind, a, b)
    if kind == "int":
        _check_divisor("remainder", b)
        return _int_result(a - _int_floor_div(a, b) * b, dtype)
    r = np.fmod(a, b)
    moved = (r != 0) & ((b < 0) != (r < 0))
    ref, _ = _float_result(np.where(moved, r + b, r), 0.0, dtype)
    scale = np.where(moved & np.isfinite(ref), np.abs(np.broadcast_to(b, ref.shape)), 0.0)
    return ref, scale


def fmod(a, b, *, dtype: str):
    """C's fmod: a - trunc(a / b) b, the dividend's sign, exact; fmod(x, 0) = NaN, fmod(x, inf) = x. Integers: a zero
    divisor raises ZeroDivisionError."""
    kind = _takes("fmod", dtype, "fi")
    a, b = _operands("fmod", dtype, kind, a, b)
    if kind == "int":
        _check_divisor("fmod", b)
        return _int_result(a - _int_trunc_div(a, b) * b, dtype)
    return _exact(np.fmod(a, b))


def maximum(a, b, *, dtype: str):
    """Element-wise max; NaN propagates."""
    kind = kind_of("maximum", dtype)
    a, b = _operands("maximum", dtype, kind, a, b)
    return _exact(np.maximum(a, b))


def minimum(a, b, *, dtype: str):
    """Element-wise min; NaN propagates."""
    kind = kind_of("minimum", dtype)
    a, b = _operands("minimum", dtype, kind, a, b)
    return _exact(np.minimum(a, b))


def atan2(a, b, *, dtype: str):
    """The angle of the point (b, a) in [-pi, pi] (C's atan2: atan2(+-0, -0) = +-pi, atan2(+-inf, +inf) = +-pi/4)."""
    _takes("atan2", dtype, "f")
    ref = _extended(np.arctan2, a, b)
    return _float_result(ref, np.abs(ref), dtype)


def lerp(start, end, weight, *, dtype: str):
    """start + weight (end - start), the exact value where torch's formula is finite (torch evaluates start + w (end -
    start) for |w| < 0.5 and end - (end - start)(1 - w) otherwise; the scale covers both). Where that formula,
    evaluated in torch's compute type (float32 for the half types and float32, float64 for float64), is not finite,
    the reference is what it gives: an infinite operand or an end - start that overflows makes inf or NaN as the
    branch taken combines them (lerp(inf, 1, 0.7) = 1 - (-inf)(0.3) = inf where the exact form says NaN).
    `weight`: an array or a Python number."""
    _takes("lerp", dtype, "f")
    start, end, w = _floats(start, end, weight)
    ref = _extended(lambda s, e, t: s + t * (e - s), start, end, w)
    ct = np.float64 if dtype == "float64" else np.float32
    s_, e_, w_ = (v.astype(ct) for v in np.broadcast_arrays(start, end, w))
    d = e_ - s_
    torch_form = np.where(np.abs(w_) < ct(0.5), s_ + w_ * d, e_ - d * (ct(1) - w_)).astype(np.float64)
    ref = np.where(np.isfinite(torch_form), ref, torch_form)
    return _float_result(ref, np.abs(start) + np.abs(end) + np.abs(w * (end - start)), dtype)


def addcdiv(x, t1, t2, *, dtype: str, value=1):
    """x + value t1 / t2 (floats only: torch refuses integer addcdiv)."""
    _takes("addcdiv", dtype, "f")
    x, t1, t2 = _floats(x, t1, t2)
    v = float(value)
    ref = _extended(lambda s, p, q: s + _LD(v) * p / q, x, t1, t2)
    return _float_result(ref, np.abs(x) + np.abs(v * t1 / t2), dtype)


def addcmul(x, t1, t2, *, dtype: str, value=1):
    """x + value t1 t2; integers wrap."""
    kind = _takes("addcmul", dtype, "fi")
    x, t1, t2 = _operands("addcmul", dtype, kind, x, t1, t2)
    if kind == "int":
        v = checked_scalar("addcmul", "value", value, dtype)
        return _int_result(x + v * t1 * t2, dtype)
    v = float(value)
    ref = _extended(lambda s, p, q: s + _LD(v) * p * q, x, t1, t2)
    return _float_result(ref, np.abs(x) + np.abs(v * t1 * t2), dtype)


def hypot(a, b, *, dtype: str):
    """sqrt(a^2 + b^2) without overflow; hypot(+-inf, NaN) = inf (C's hypot)."""
    _takes("hypot", dtype, "f")
    ref = _extended(np.hypot, a, b)
    return _float_result(ref, np.abs(ref), dtype)


# --- comparison and logic ---------------------------------------------------------------------------------------------
def _compare(op: str, fn, a, b, dtype: str):
    kind = kind_of(op, dtype)
    a, b = _operands(op, dtype, kind, a, b)
    return _exact(fn(a, b))


def eq(a, b, *, dtype: str):
    """a == b (NaN equals nothing)."""
    return _compare("eq", np.equal, a, b, dtype)


def ne(a, b, *, dtype: str):
    """a != b (NaN differs from everything)."""
    return _compare("ne", np.not_equal, a, b, dtype)


def lt(a, b, *, dtype: str):
    """a < b."""
    return _compare("lt", np.less, a, b, dtype)


def le(a, b, *, dtype: str):
    """a <= b."""
    return _compare("le", np.less_equal, a, b, dtype)


def gt(a, b, *, dtype: str):
    """a > b."""
    return _compare("gt", np.greater, a, b, dtype)


def ge(a, b, *, dtype: str):
    """a >= b."""
    return _compare("ge", np.greater_equal, a, b, dtype)


def _truth(op: str, dtype: str, *xs) -> list[np.ndarray]:
    kind = kind_of(op, dtype)
    return [v != 0 for v in _operands(op, dtype, kind, *xs)]  # NaN != 0: True


def logical_and(a, b, *, dtype: str):
    """bool(a) and bool(b) (nonzero is True, NaN too)."""
    a, b = _truth("logical_and", dtype, a, b)
    return _exact(a & b)


def logical_or(a, b, *, dtype: str):
    """bool(a) or bool(b)."""
    a, b = _truth("logical_or", dtype, a, b)
    return _exact(a | b)


def logical_xor(a, b, *, dtype: str):
    """bool(a) != bool(b)."""
    a, b = _truth("logical_xor", dtype, a, b)
    return _exact(a ^ b)


def logical_not(x, *, dtype: str):
    """not bool(x)."""
    (x,) = _truth("logical_not", dtype, x)
    return _exact(~x)


def _bitwise(op: str, fn, a, b, dtype: str):
    kind = _takes(op, dtype, "ib")
    a, b = _operands(op, dtype, kind, a, b)
    return _exact(fn(a, b))


def bitwise_and(a, b, *, dtype: str):
    """a & b (integers and bools; floats refused)."""
    return _bitwise("bitwise_and", np.bitwise_and, a, b, dtype)


def bitwise_or(a, b, *, dtype: str):
    """a | b."""
    return _bitwise("bitwise_or", np.bitwise_or, a, b, dtype)


def bitwise_xor(a, b, *, dtype: str):
    """a ^ b."""
    return _bitwise("bitwise_xor", np.bitwise_xor, a, b, dtype)


def bitwise_not(x, *, dtype: str):
    """~x in the dtype's width (uint8: 255 - x; bool: not x)."""
    kind = _takes("bitwise_not", dtype, "ib")
    (x,) = _operands("bitwise_not", dtype, kind, x)
    return _exact(~x) if kind == "bool" else _int_result(~x, dtype)


def bitwise_left_shift(a, b, *, dtype: str):
    """a << b in the dtype's width (bits shifted out are lost, the result wraps); a shift amount < 0 or >= the width
    gives 0 (torch's kernels). Integers only."""
    _takes("bitwise_left_shift", dtype, "i")
    a, b = np.broadcast_arrays(*_ints("bitwise_left_shift", dtype, a, b))
    inside = (b >= 0) & (b < INT_TYPES[dtype][0])
    shifted = a.astype(np.uint64) << np.where(inside, b, 0).astype(np.uint64)
    return _int_result(np.where(inside, shifted.astype(np.int64), 0), dtype)


def bitwise_right_shift(a, b, *, dtype: str):
    """a >> b, arithmetic (sign-filling) for signed types; a shift amount < 0 or >= the width gives the sign fill:
    -1 for a negative a, else 0 (torch's kernels). Integers only."""
    _takes("bitwise_right_shift", dtype, "i")
    a, b = np.broadcast_arrays(*_ints("bitwise_right_shift", dtype, a, b))
    inside = (b >= 0) & (b < INT_TYPES[dtype][0])
    shifted = np.right_shift(a, np.where(inside, b, 0))  # int64 >> is arithmetic
    return _exact(np.where(inside, shifted, np.where(a < 0, -1, 0)).astype(np.int64))


# --- predicates and selection -----------------------------------------------------------------------------------------
def isnan(x, *, dtype: str):
    """x is NaN (never for integers and bools)."""
    kind = kind_of("isnan", dtype)
    (x,) = _operands("isnan", dtype, kind, x)
    return _exact(np.isnan(x) if kind == "float" else np.zeros(x.shape, dtype=bool))


def isinf(x, *, dtype: str):
    """x is +-inf."""
    kind = kind_of("isinf", dtype)
    (x,) = _operands("isinf", dtype, kind, x)
    return _exact(np.isinf(x) if kind == "float" else np.zeros(x.shape, dtype=bool))


def isfinite(x, *, dtype: str):
    """x is neither NaN nor +-inf (always for integers and bools)."""
    kind = kind_of("isfinite", dtype)
    (x,) = _operands("isfinite", dtype, kind, x)
    return _exact(np.isfinite(x) if kind == "float" else np.ones(x.shape, dtype=bool))


def nan_to_num(x, *, dtype: str, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None):
    """NaN -> nan, +inf -> posinf (default: the dtype's largest finite value), -inf -> neginf (default: its lowest);
    each replacement converted to the dtype as torch converts it (a plain conversion: posinf=1e10 in float16 is inf).
    Integers and bools are returned unchanged."""
    kind = kind_of("nan_to_num", dtype)
    (x,) = _operands("nan_to_num", dtype, kind, x)
    if kind != "float":
        return _exact(x.copy())
    fmax = FLOAT_FORMATS[dtype][2]
    pos = fmax if posinf is None else float(posinf)
    ng = -fmax if neginf is None else float(neginf)
    nv, pos, ng = (float(round_to(v, dtype)) for v in (float(nan), pos, ng))
    return _exact(np.where(np.isnan(x), nv, np.where(x == np.inf, pos, np.where(x == -np.inf, ng, x))))


def _bound(op: str, name: str, v, dtype: str, kind: str):
    if v is None:
        return None
    if np.ndim(v) == 0 and not isinstance(v, np.ndarray):
        return checked_scalar(op, name, v, dtype)
    return _operands(op, dtype, kind, v)[0]


def clamp(x, *, dtype: str, min=None, max=None):  # torch's names (shadow the builtins in this function)
    """min(max(x, min), max) (torch's order: min > max gives max everywhere); NaN in x or in a bound gives NaN (torch's
    clamp propagates NaN). Either bound may be None (not both); bounds are scalars or arrays."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    kind = _takes("clamp", dtype, "fi")
    (x,) = _operands("clamp", dtype, kind, x)
    lo, hi = _bound("clamp", "min", min, dtype, kind), _bound("clamp", "max", max, dtype, kind)
    ref = x
    if lo is not None:
        ref = np.maximum(ref, lo)  # np.maximum / np.minimum propagate NaN from either side
    if hi is not None:
        ref = np.minimum(ref, hi)
    shape = np.broadcast_shapes(*(np.shape(v) for v in (x, lo, hi) if v is not None))
    return _exact(np.array(np.broadcast_to(ref, shape)))


def clamp_min(x, *, dtype: str, min):
    """max(x, min), NaN propagating."""
    return clamp(x, dtype=dtype, min=min)


def clamp_max(x, *, dtype: str, max):
    """min(x, max), NaN propagating."""
    return clamp(x, dtype=dtype, max=max)


def where(condition, x, other, *, dtype: str):
    """condition ? x : other (condition a bool array)."""
    kind = kind_of("where", dtype)
    cond = np.asarray(condition)
    if cond.dtype != bool:
        raise TypeError(f"where: the condition must be a bool array, got numpy {cond.dtype}")
    x, other = _operands("where", dtype, kind, x, other)
    return _exact(np.where(cond, x, other))


def masked_fill(x, mask, *, dtype: str, value):
    """x with `value` where mask is True; value converted to the dtype with torch's overflow check."""
    kind = kind_of("masked_fill", dtype)
    m = np.asarray(mask)
    if m.dtype != bool:
        raise TypeError(f"masked_fill: the mask must be a bool array, got numpy {m.dtype}")
    (x,) = _operands("masked_fill", dtype, kind, x)
    v = checked_scalar("masked_fill", "value", value, dtype)
    return _exact(np.where(m, v, x).astype(x.dtype))


# --- data movement ----------------------------------------------------------------------------------------------------
def copy(x, *, dtype: str):
    """x itself (a strided copy moves values, it computes nothing)."""
    kind = kind_of("copy", dtype)
    (x,) = _operands("copy", dtype, kind, x)
    return _exact(x.copy())


_STORE = {"float": np.float64, "int": np.int64, "bool": bool}


def full(shape, value, *, dtype: str):
    """An array of `shape` filled with value converted to the dtype (torch's checked conversion: a finite float past
    the dtype's range refused; a float into an integer dtype truncated toward zero, NaN/inf refused)."""
    kind = kind_of("full", dtype)
    v = checked_scalar("full", "value", value, dtype, truncate=True)
    return _exact(np.full(tuple(shape), v, dtype=_STORE[kind]))


def fill(shape, value, *, dtype: str):
    """As `full` (torch's fill_ of a tensor of `shape`)."""
    return full(shape, value, dtype=dtype)


def zeros(shape, *, dtype: str):
    """An array of zeros."""
    return full(shape, 0, dtype=dtype)


def ones(shape, *, dtype: str):
    """An array of ones."""
    return full(shape, 1, dtype=dtype)


def arange(start, end, step=1, *, dtype: str):
    """start, start + step, ... up to but excluding end. The length is torch's, ceil((end - start) / step) evaluated
    in float64; the values are exact (start + i step; the scale |start| + |i step| covers a kernel's rounding). A zero
    step, one pointing away from end, or a non-finite argument is refused. Integer dtypes take integer arguments,
    and every value must fit."""
    kind = kind_of("arange", dtype)
    if kind == "bool":
        raise TypeError("arange: does not take dtype bool")
    if not all(math.isfinite(float(v)) for v in (start, end, step)):
        raise ValueError(f"arange: start, end and step must be finite, got ({start}, {end}, {step})")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise ValueError(f"arange: upper bound and lower bound inconsistent with step sign ({start}, {end}, {step})")
    n = int(math.ceil((float(end) - float(start)) / float(step)))
    if kind == "int":
        if any(isinstance(v, float) for v in (start, end, step)):
            raise ValueError(f"arange: an {dtype} arange takes integer start, end and step")
        lo, hi = int_range(dtype)
        if n and not (lo <= start <= hi and lo <= start + step * (n - 1) <= hi):
            raise ValueError(f"arange: values outside {dtype}'s range [{lo}, {hi}]")
        return _exact(start + step * np.arange(n, dtype=np.int64))
    i = np.arange(n, dtype=np.float64)
    s, d = float(start), float(step)
    ref = _extended(lambda a, k, t: a + k * t, np.full(n, s), i, np.full(n, d))
    return _float_result(ref, math.fabs(s) + np.abs(i * d), dtype)


def linspace(start, end, steps: int, *, dtype: str):
    """`steps` values from start to end inclusive, evenly spaced: the exact start + i (end - start) / (steps - 1)
    (steps = 1: [start]). torch computes start + i step for the first half and end - (steps - 1 - i) step for the
    second; the scale |start| + |end| covers that rounding. Integer dtypes: the exact value truncated toward zero
    (torch truncates its float64 value, which can fall an ulp below an integer the exact value reaches)."""
    kind = kind_of("linspace", dtype)
    if kind == "bool":
        raise TypeError("linspace: does not take dtype bool")
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"linspace: steps must be non-negative, got {steps}")
    if kind == "int":
        s, e = Fraction(start), Fraction(end)
        vals = [s] if steps == 1 else [s + (e - s) * i / (steps - 1) for i in range(steps)]
        out = np.array([math.trunc(v) for v in vals], dtype=object)
        lo, hi = int_range(dtype)
        if any(not lo <= v <= hi for v in out):
            raise ValueError(f"linspace: values outside {dtype}'s range [{lo}, {hi}]")
        return _exact(out.astype(np.int64))
    s, e = float(start), float(end)
    if steps <= 1:
        ref = np.full(steps, s)
    else:
        i = np.arange(steps, dtype=np.float64)
        ref = _extended(lambda a, b, k: a + k * (b - a) / _LD(steps - 1), np.full(steps, s), np.full(steps, e), i)
        ref[-1] = e  # the endpoint itself (the extended form has it too, unless end - start overflows long double)
    return _float_result(ref, np.full(steps, math.fabs(s) + math.fabs(e)), dtype)


def cast(x, *, src: str, dtype: str):
    """x (values of dtype `src`) converted to `dtype`: float -> float rounded to nearest even (+-inf past the range,
    NaN kept); float -> integer truncated toward zero, NaN, +-inf and values outside the integer's range refused
    (ValueError: undefined in torch); integer -> float rounded once to nearest even; integer -> integer wrapped; any
    -> bool is x != 0 (NaN is True); bool -> number is 0 or 1. Scale 0."""
    skind, kind = kind_of("cast", src), kind_of("cast", dtype)
    (x,) = _operands("cast", src, skind, x)
    if kind == "bool":
        return _exact(x != 0)
    if skind == "bool":
        x, skind = x.astype(np.int64), "int"
    if kind == "float":
        return _exact(round_to(x, dtype) if skind == "float" else round_int_to(x, dtype))
    if skind == "int":
        return _int_result(x, dtype)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"cast: NaN or inf cannot be converted to {dtype} (undefined in torch; nbxcert refuses it)")
    t = np.trunc(x)
    lo, hi = int_range(dtype)
    # hi + 1 is a power of two, exact in float64 (int64's max itself is not: it rounds up to 2^63)
    if t.size and (t.min() < lo or t.max() >= float(hi + 1)):
        raise ValueError(f"cast: a value outside {dtype}'s range [{lo}, {hi}] (undefined in torch; nbxcert refuses it)")
    return _exact(t.astype(np.int64))


# The ops by group, as the contract lists them.
GROUPS = {
    "unary": (
        "abs",
        "neg",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log1p",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "tan",
        "tanh",
        "erf",
        "sign",
        "floor",
        "ceil",
        "round",
        "trunc",
        "sigmoid",
    ),
    "activation": (
        "relu",
        "gelu",
        "silu",
        "mish",
        "elu",
        "celu",
        "selu",
        "leaky_relu",
        "hardsigmoid",
        "hardswish",
        "softplus",
        "log_sigmoid",
        "threshold",
        "glu",
    ),
    "binary": (
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "remainder",
        "fmod",
        "maximum",
        "minimum",
        "atan2",
        "lerp",
        "addcdiv",
        "addcmul",
        "hypot",
    ),
    "logic": (
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_xor",
        "logical_not",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_not",
        "bitwise_left_shift",
        "bitwise_right_shift",
    ),
    "selection": (
        "isnan",
        "isinf",
        "isfinite",
        "nan_to_num",
        "clamp",
        "clamp_min",
        "clamp_max",
        "where",
        "masked_fill",
    ),
    "movement": ("copy", "fill", "zeros", "ones", "full", "arange", "linspace", "cast"),
}

# Every op runs with numpy's floating-point and integer-overflow warnings off: inf, NaN and wrap-around are the answers
# asked for (an integer op on 0-d arrays computes with numpy scalars, which warn on the wrap-around the op defines).
for _name in (name for names in GROUPS.values() for name in names):
    globals()[_name] = np.errstate(all="ignore")(globals()[_name])

# The oracle of every op, by name (the names of `nbxcert.ops` and of the `pw_` kernel specs).
OPS = {name: globals()[name] for names in GROUPS.values() for name in names}
