"""The pointwise oracles (oracles/pointwise.py): each transcendental one within 1 ulp of the exact value (mpmath at 50
digits) over seeded random inputs across float64's range, tails and subnormals; the rational ones within 2^-52 of
their scale (exact rational arithmetic); special values per op as torch documents them; integer wrap-around, shifts,
division signs and the refusals; the oracle's own float rounding against independent conversions.

CI runs a small sample of every function; `-m slow` runs 20 times as many.
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
from test_transcendental import MAX, TINY, ulp_of_exact

from nbxcert.oracles import pointwise as P

mpmath.mp.dps = 50
mpf = mpmath.mpf


def ulp_error(got: float, t) -> float:
    """The error of float64 `got` in ulps of the exact value t (inf when it is not the same special value)."""
    if abs(t) > MAX * (1 + 2.0**-53):  # beyond float64: must be an infinity of the same sign
        return 0.0 if (math.isinf(got) and (got > 0) == (t > 0)) else math.inf
    if math.isnan(got) or math.isinf(got):
        return math.inf
    if t == 0:
        return 0.0 if got == 0 else math.inf
    return float(abs(mpf(got) - t) / ulp_of_exact(t))


def worst_ulp(got: np.ndarray, exact, *args: np.ndarray) -> tuple[float, tuple]:
    """(max ulp error, the inputs where it occurs) of the oracle's values `got` against exact(*mpf inputs)."""
    worst, where = 0.0, ()
    cols = [a.tolist() for a in np.broadcast_arrays(*args)]
    for g, xs in zip(got.reshape(-1).tolist(), zip(*[np.ravel(c) for c in cols], strict=True), strict=True):
        err = ulp_error(g, exact(*(mpf(x) for x in xs)))
        if err > worst:
            worst, where = err, xs
    return worst, where


def _both(a):
    return np.concatenate([a, -a])


def _tiny(gen, n):
    """Subnormals and small normals, both signs."""
    sub = gen.uniform(1, 2**52, n).round() * TINY
    return _both(np.concatenate([sub, np.exp2(gen.uniform(-1022, -30, n)), [TINY, 2.0**-1022]]))


def unary_samples(name: str, n: int) -> np.ndarray:
    gen = np.random.default_rng(sum(map(ord, name)))
    wide = _both(np.exp2(gen.uniform(-1074, 1023.9, n)))  # every binade
    parts = {
        "exp2": [gen.uniform(-1080, 1025, n), gen.uniform(-1075, -1022, n), gen.uniform(1023, 1024, n // 4)],
        "expm1": [gen.uniform(-60, 709.7, n), gen.standard_normal(n) * 1e-6, gen.uniform(-800, -40, n // 4)],
        "log": [np.abs(wide), 1 + gen.standard_normal(n) * 1e-9, np.abs(_tiny(gen, n // 4))],
        "log2": [np.abs(wide), 1 + gen.standard_normal(n) * 1e-9, np.abs(_tiny(gen, n // 4))],
        "log1p": [np.abs(wide), -1 + np.exp2(gen.uniform(-53, 0, n)), _tiny(gen, n // 4)],
        "sqrt": [np.abs(wide), np.abs(_tiny(gen, n // 4))],
        "rsqrt": [np.abs(wide), np.abs(_tiny(gen, n // 4))],
        "reciprocal": [wide, _tiny(gen, n // 4)],
        "sin": [gen.uniform(-10, 10, n), _both(np.exp2(gen.uniform(3, 1023, n))), _tiny(gen, n // 4)],
        "cos": [gen.uniform(-10, 10, n), _both(np.exp2(gen.uniform(3, 1023, n))), _tiny(gen, n // 4)],
        "tan": [gen.uniform(-10, 10, n), _both(np.exp2(gen.uniform(3, 1023, n))), _tiny(gen, n // 4)],
        "silu": [gen.uniform(-760, 760, n), gen.uniform(-50, 50, n), _tiny(gen, n // 4)],
        "mish": [gen.uniform(-760, 760, n), gen.uniform(-50, 50, n), _tiny(gen, n // 4)],
        "log_sigmoid": [gen.uniform(-760, 760, n), gen.uniform(-50, 50, n), _tiny(gen, n // 4)],
        "softplus": [gen.uniform(-760, 20, n), gen.uniform(-50, 50, n), _tiny(gen, n // 4), [20.0, 20.5, 1e300]],
        "elu": [gen.uniform(-800, 50, n), gen.standard_normal(n), _tiny(gen, n // 4)],
        "celu": [gen.uniform(-800, 50, n), gen.standard_normal(n), _tiny(gen, n // 4)],
        "selu": [gen.uniform(-800, 50, n), gen.standard_normal(n), _tiny(gen, n // 4)],
    }[name]
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])


SELU_A, SELU_S = mpf(P.SELU_ALPHA), mpf(P.SELU_SCALE)
UNARY = {
    "exp2": (P.exp2, {}, lambda x: mpf(2) ** x),
    "expm1": (P.expm1, {}, mpmath.expm1),
    "log": (P.log, {}, mpmath.log),
    "log2": (P.log2, {}, lambda x: mpmath.log(x, 2)),
    "log1p": (P.log1p, {}, mpmath.log1p),
    "sqrt": (P.sqrt, {}, mpmath.sqrt),
    "rsqrt": (P.rsqrt, {}, lambda x: 1 / mpmath.sqrt(x)),
    "reciprocal": (P.reciprocal, {}, lambda x: 1 / x),
    "sin": (P.sin, {}, mpmath.sin),
    "cos": (P.cos, {}, mpmath.cos),
    "tan": (P.tan, {}, mpmath.tan),
    "silu": (P.silu, {}, lambda x: x / (1 + mpmath.exp(-x))),
    "mish": (P.mish, {}, lambda x: x * mpmath.tanh(mpmath.log1p(mpmath.exp(x)))),
    "log_sigmoid": (P.log_sigmoid, {}, lambda x: -mpmath.log1p(mpmath.exp(-x))),
    "softplus": (P.softplus, {"beta": 1.5}, lambda x: x if 1.5 * x > 20 else mpmath.log1p(mpmath.exp(1.5 * x)) / 1.5),
    "elu": (P.elu, {"alpha": 0.7}, lambda x: x if x > 0 else mpf(0.7) * mpmath.expm1(x)),
    "celu": (P.celu, {"alpha": 1.3}, lambda x: x if x > 0 else mpf(1.3) * mpmath.expm1(x / mpf(1.3))),
    "selu": (P.selu, {}, lambda x: SELU_S * (x if x > 0 else SELU_A * mpmath.expm1(x))),
}


# ops whose float64 scale bounds torch's several float64 roundings (oracles/pointwise.py `_f64_formula_scale`)
FLOAT64_FORMULA_SCALES = {"sigmoid", "silu", "mish", "elu", "celu", "selu", "softplus", "log_sigmoid"}


def _check_unary(name: str, n: int) -> None:
    fn, params, exact = UNARY[name]
    xs = unary_samples(name, n)
    ref, scale = fn(xs, dtype="float64", **params)
    worst, where = worst_ulp(ref, exact, xs)
    assert worst <= 1.0, f"oracle {name} is {worst:.3f} ulp off at x = {where!r} (over {xs.size} samples)"
    finite = np.isfinite(ref)
    assert np.all(scale[~finite] == 0)
    if name in FLOAT64_FORMULA_SCALES:
        # float64: a bound on torch's float64 evaluation of its formula, at least the result's magnitude
        assert np.all(scale[finite] >= np.abs(ref[finite])) and np.all(np.isfinite(scale))
        ref, scale = fn(xs, dtype="float32", **params)
        finite = np.isfinite(ref)
    assert np.array_equal(scale[finite], np.abs(ref[finite]))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_within_one_ulp(name):
    _check_unary(name, 150)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_within_one_ulp_many(name):
    _check_unary(name, 1500)


def binary_samples(name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(sum(map(ord, name)))
    sign = lambda: np.where(gen.random(n) < 0.5, -1.0, 1.0)  # noqa: E731
    if name == "atan2":
        a = sign() * np.exp2(gen.uniform(-1074, 1023.9, n))
        b = sign() * np.exp2(gen.uniform(-1074, 1023.9, n))
        return a, b
    if name == "hypot":
        e = gen.uniform(-1074, 1023, n)
        a = sign() * np.exp2(e)
        b = sign() * np.exp2(np.minimum(e + gen.uniform(-40, 40, n), 1023.9))  # comparable magnitudes
        return a, b
    if name == "pow":
        base = np.exp2(gen.uniform(-30, 30, n))
        expo = gen.uniform(-30, 30, n)
        near = np.exp2(gen.uniform(0.5, 2, n // 4))  # results near overflow and in the subnormal range
        near_e = np.log2(MAX) / np.log2(near) * gen.uniform(0.98, 1.0, n // 4)
        neg_base = -np.exp2(gen.uniform(-5, 5, n // 4))
        neg_e = np.round(gen.uniform(-40, 40, n // 4))  # a negative base takes integer exponents
        return np.concatenate([base, near, 1 / near, neg_base]), np.concatenate([expo, near_e, near_e, neg_e])
    if name == "glu":
        a = gen.standard_normal(n) * np.exp2(gen.uniform(-60, 60, n))
        b = np.concatenate([gen.uniform(-760, 760, n // 2), gen.standard_normal(n - n // 2) * 10])
        return a, b
    raise ValueError(name)


BINARY = {
    "atan2": (lambda a, b: P.atan2(a, b, dtype="float64"), mpmath.atan2),
    "hypot": (lambda a, b: P.hypot(a, b, dtype="float64"), mpmath.hypot),
    "pow": (lambda a, b: P.pow(a, b, dtype="float64"), lambda a, b: mpmath.power(a, b)),
    "glu": (
        lambda a, b: P.glu(np.stack([a, b], axis=-1), dtype="float64"),
        lambda a, b: a / (1 + mpmath.exp(-b)),
    ),
}


def _check_binary(name: str, n: int) -> None:
    fn, exact = BINARY[name]
    a, b = binary_samples(name, n)
    ref, _ = fn(a, b)
    worst, where = worst_ulp(ref.reshape(-1), exact, a, b)
    assert worst <= 1.0, f"oracle {name} is {worst:.3f} ulp off at {where!r} (over {a.size} samples)"


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_within_one_ulp(name):
    _check_binary(name, 200)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_within_one_ulp_many(name):
    _check_binary(name, 2000)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_within_two_ulp_of_its_terms(approximate):
    """gelu reuses oracles/elementwise.gelu (float64 erf/tanh, two more roundings): within 2^-51 of its scale (plus
    the subnormal spacing, where the result is subnormal)."""
    gen = np.random.default_rng(9)
    xs = np.concatenate([gen.standard_normal(300) * 4, gen.uniform(-40, 40, 100), _tiny(gen, 20)])
    ref, scale = P.gelu(xs, approximate=approximate, dtype="float64")
    c = mpmath.sqrt(2 / mpmath.pi)
    for x, r, s in zip(xs.tolist(), ref.tolist(), scale.tolist(), strict=True):
        x = mpf(x)
        f = mpmath.erf(x / mpmath.sqrt(2)) if approximate == "none" else mpmath.tanh(c * (x + mpf(0.044715) * x**3))
        assert abs(mpf(r) - x * (1 + f) / 2) <= mpf(2) ** -51 * s + TINY, (x, r)  # a subnormal rounds to TINY


def test_the_ulp_measure_catches_a_two_ulp_error():
    xs = np.array([0.3, 1.7, -2.5])
    ref, _ = P.sin(xs, dtype="float64")
    off = np.nextafter(np.nextafter(ref, np.inf), np.inf)
    assert 1.5 < worst_ulp(off, mpmath.sin, xs)[0] < 2.6


# --- rational ops against exact rational arithmetic ------------------------------------------------------------------
def _fr(v) -> Fraction:
    return Fraction(float(v))


def _rational_cases(gen, n):
    def v(k):
        return gen.standard_normal(k) * np.exp2(gen.integers(-30, 30, k))

    return v(n), v(n), v(n)


@pytest.mark.parametrize("op", ["lerp", "addcdiv", "addcmul", "add", "sub"])
def test_rational_ops_are_the_exact_value_to_well_within_their_scale(op):
    gen = np.random.default_rng(len(op))
    a, b, c = _rational_cases(gen, 300)
    if op == "lerp":
        c = np.concatenate([gen.uniform(-0.5, 1.5, 150), gen.standard_normal(150) * 4])
        ref, scale = P.lerp(a, b, c, dtype="float32")
        exact = [_fr(x) + _fr(w) * (_fr(y) - _fr(x)) for x, y, w in zip(a, b, c, strict=True)]
    elif op == "addcdiv":
        ref, scale = P.addcdiv(a, b, c, value=0.3, dtype="float64")
        exact = [_fr(x) + _fr(0.3) * _fr(y) / _fr(z) for x, y, z in zip(a, b, c, strict=True)]
    elif op == "addcmul":
        ref, scale = P.addcmul(a, b, c, value=-1.7, dtype="float64")
        exact = [_fr(x) + _fr(-1.7) * _fr(y) * _fr(z) for x, y, z in zip(a, b, c, strict=True)]
    else:
        sign = 1 if op == "add" else -1
        ref, scale = getattr(P, op)(a, b, alpha=0.1, dtype="float64")
        exact = [_fr(x) + sign * _fr(0.1) * _fr(y) for x, y in zip(a, b, strict=True)]
    for r, s, e in zip(ref.tolist(), scale.tolist(), exact, strict=True):
        assert abs(Fraction(r) - e) <= Fraction(2.0**-52) * Fraction(s), (op, r, float(e), s)


def test_hardsigmoid_and_hardswish_are_exact_piecewise_values():
    x = np.concatenate([np.random.default_rng(5).uniform(-5, 5, 200), [-3.0, 3.0, -np.inf, np.inf, np.nan, -0.0]])
    hs, _ = P.hardsigmoid(x, dtype="float32")
    hw, _ = P.hardswish(x, dtype="float32")
    for v, s, w in zip(x[:-4].tolist(), hs[:-4].tolist(), hw[:-4].tolist(), strict=True):
        want = min(max(_fr(v) + 3, Fraction(0)), Fraction(6)) / 6
        assert abs(Fraction(s) - want) <= Fraction(2.0**-53) * want
        assert abs(Fraction(w) - _fr(v) * want) <= Fraction(2.0**-53) * abs(_fr(v) * want)
    assert hs[-4:-2].tolist() == [0.0, 1.0] and np.isnan(hs[-2]) and hs[-1] == 0.5
    assert np.isnan(hw[-4]) and hw[-3] == np.inf and np.isnan(hw[-2])  # -inf * 0: NaN, as torch's formula gives


def test_arange_and_linspace_values():
    ref, scale = P.arange(-1.5, 2.0, 0.25, dtype="float32")
    assert ref.tolist() == [-1.5 + 0.25 * i for i in range(14)] and scale[3] == 1.5 + 0.75
    ref, _ = P.arange(0, 1, 0.1, dtype="float64")  # ceil(1 / 0.1) = 10 values, the exact multiples of 0.1's double
    assert len(ref) == 10
    for i, r in enumerate(ref.tolist()):
        assert abs(Fraction(r) - i * _fr(0.1)) <= Fraction(2.0**-53) * i * _fr(0.1)
    assert P.arange(10, 0, -3, dtype="int8")[0].tolist() == [10, 7, 4, 1]
    assert P.arange(0, 0.3, 0.1, dtype="float64")[0].size == 3
    ref, scale = P.linspace(-1.0, 2.0, 7, dtype="float16")
    assert ref.tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0] and np.all(scale == 3.0)
    ref, _ = P.linspace(0.0, 1.0, 4, dtype="float64")
    for i, r in enumerate(ref.tolist()):
        assert abs(Fraction(r) - Fraction(i, 3)) <= Fraction(2.0**-53) * Fraction(i, 3)
    assert P.linspace(3.0, 7.0, 1, dtype="float32")[0].tolist() == [3.0]
    assert P.linspace(3.0, 7.0, 0, dtype="float32")[0].size == 0
    assert P.linspace(0, 10, 4, dtype="int64")[0].tolist() == [0, 3, 6, 10]  # 10/3, 20/3 truncated
    assert P.linspace(0, -10, 4, dtype="int32")[0].tolist() == [0, -3, -6, -10]  # toward zero
    assert P.linspace(0, 10, 7, dtype="int64")[0].tolist() == [0, 1, 3, 5, 6, 8, 10]  # exactly 5 at the middle


# --- the oracle's own rounding ---------------------------------------------------------------------------------------
def test_round_to_matches_numpys_ieee_conversions_at_every_float16_midpoint():
    """Every float16 value, every midpoint between neighbours (ties to even) and values a hair off them."""
    h = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (h[:-1] + h[1:]) / 2
    xs = np.concatenate([h, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), [65519.99, 65520.0, 1e6]])
    xs = np.concatenate([xs, -xs, [np.inf, -np.inf, np.nan]])
    got = P.round_to(xs, "float16")
    with np.errstate(over="ignore"):
        want = xs.astype(np.float16).astype(np.float64)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_round_to_matches_numpys_float32_and_the_tensor_layers_bfloat16():
    from nbxcert.kernels import dtypes as D  # the tensor layer's conversion: a separate implementation to agree with

    gen = np.random.default_rng(11)
    xs = np.concatenate(
        [
            gen.standard_normal(20000) * np.exp2(gen.integers(-160, 130, 20000)),
            np.exp2(gen.uniform(-1074, -120, 2000)),
            [3.4028235677973366e38, 3.402823669209385e38, 1.7e38, 2.0**-149, 2.0**-150, 3 * 2.0**-151],
        ]
    )
    xs = np.concatenate([xs, -xs])
    with np.errstate(over="ignore"):
        assert np.array_equal(P.round_to(xs, "float32"), xs.astype(np.float32).astype(np.float64))
    bf = D.bfloat16_bits_to_float32(D.to_bfloat16_bits(xs)).astype(np.float64)
    assert np.array_equal(P.round_to(xs, "bfloat16"), bf)
    bits = np.arange(0, 0x7F80, dtype=np.uint16)  # every finite positive bfloat16 and the midpoints after them
    vals = D.bfloat16_bits_to_float32(bits).astype(np.float64)
    mids = (vals[:-1] + vals[1:]) / 2
    assert np.array_equal(P.round_to(vals, "bfloat16"), vals)
    assert np.array_equal(P.round_to(mids, "bfloat16"), D.bfloat16_bits_to_float32(D.to_bfloat16_bits(mids)))


def _mp_round(v: int, prec: int, fmax: float) -> float:
    with mpmath.workprec(prec):
        r = float(+mpf(v))  # mpmath rounds to nearest, ties to even
    return math.copysign(math.inf, r) if abs(r) > fmax else r


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_round_int_to_is_one_rounding_to_nearest_even(dtype):
    prec, _, fmax = P.FLOAT_FORMATS[dtype]
    gen = np.random.default_rng(prec)
    vals = [int(v) for v in gen.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64)]
    vals += [2**63 - 1, -(2**63), 0, 1, -1, 65504, 65519, 65520, -65520, 2**24 + 1, 2**24 + 3, 2**53 + 1, 2**53 + 3]
    vals += [(1 << k) + (1 << (k - prec)) for k in range(prec + 1, 62)]  # exact ties: to the even neighbour
    got = P.round_int_to(np.array(vals, dtype=np.int64), dtype)
    assert got.tolist() == [_mp_round(v, prec, fmax) for v in vals]


# --- special values, written from torch's documentation ---------------------------------------------------------------
NAN, INF = math.nan, math.inf
F32_MAX = float.fromhex("0x1.fffffep127")
F = "float32"

SPECIAL = [
    # (op, operands, params, expected)
    ("abs", [[-0.0, -INF, NAN, -2.5]], {}, [0.0, INF, NAN, 2.5]),
    ("neg", [[0.0, INF, NAN]], {}, [-0.0, -INF, NAN]),
    ("exp", [[-INF, INF, NAN, 0.0, -0.0]], {}, [0.0, INF, NAN, 1.0, 1.0]),
    ("exp2", [[-INF, INF, -1075.0, 3.0]], {}, [0.0, INF, 0.0, 8.0]),
    ("expm1", [[-INF, INF, -0.0]], {}, [-1.0, INF, -0.0]),
    ("log", [[0.0, -0.0, -1.0, INF, 1.0, NAN]], {}, [-INF, -INF, NAN, INF, 0.0, NAN]),
    ("log2", [[0.0, 8.0, -TINY]], {}, [-INF, 3.0, NAN]),
    ("log1p", [[-1.0, -2.0, -0.0, INF]], {}, [-INF, NAN, -0.0, INF]),
    ("sqrt", [[-0.0, -1.0, INF, 4.0]], {}, [-0.0, NAN, INF, 2.0]),
    ("rsqrt", [[0.0, -0.0, INF, -1.0, 4.0]], {}, [INF, -INF, 0.0, NAN, 0.5]),
    ("reciprocal", [[0.0, -0.0, INF, -INF, 4.0]], {}, [INF, -INF, 0.0, -0.0, 0.25]),
    ("sin", [[INF, -INF, NAN, -0.0]], {}, [NAN, NAN, NAN, -0.0]),
    ("cos", [[INF, 0.0]], {}, [NAN, 1.0]),
    ("tan", [[INF, -0.0]], {}, [NAN, -0.0]),
    ("tanh", [[INF, -INF, -0.0]], {}, [1.0, -1.0, -0.0]),
    ("erf", [[INF, -INF, -0.0]], {}, [1.0, -1.0, -0.0]),
    ("sigmoid", [[INF, -INF, 0.0]], {}, [1.0, 0.0, 0.5]),
    ("sign", [[NAN, -0.0, 0.0, -INF, 3.0, -TINY]], {}, [0.0, 0.0, 0.0, -1.0, 1.0, -1.0]),
    ("floor", [[-0.5, 2.5, -INF, NAN, -0.0]], {}, [-1.0, 2.0, -INF, NAN, -0.0]),
    ("ceil", [[-0.5, 2.5, INF]], {}, [-0.0, 3.0, INF]),
    ("round", [[0.5, 1.5, 2.5, -0.5, -2.5, 3.49]], {}, [0.0, 2.0, 2.0, -0.0, -2.0, 3.0]),  # half to even
    ("trunc", [[-2.7, 2.7, -0.2, INF]], {}, [-2.0, 2.0, -0.0, INF]),
    ("relu", [[NAN, -INF, -1.0, 2.0]], {}, [NAN, 0.0, 0.0, 2.0]),
    ("gelu", [[INF, NAN, 0.0]], {}, [INF, NAN, 0.0]),
    ("gelu", [[-INF, INF]], {"approximate": "tanh"}, [NAN, INF]),  # -inf * 0, as torch's formula gives
    ("silu", [[-INF, INF, NAN, 0.0]], {}, [NAN, INF, NAN, 0.0]),
    ("mish", [[-INF, INF, 0.0]], {}, [NAN, INF, 0.0]),
    ("elu", [[-INF, INF, NAN, 0.0]], {"alpha": 2.0}, [-2.0, INF, NAN, 0.0]),
    ("celu", [[-INF, INF]], {"alpha": 0.5}, [-0.5, INF]),
    ("selu", [[-INF, 0.0]], {}, [float(-SELU_S * SELU_A), 0.0]),
    ("leaky_relu", [[-INF, NAN, -2.0, 3.0]], {"negative_slope": 0.25}, [-INF, NAN, -0.5, 3.0]),
    ("hardsigmoid", [[-3.0, 3.0, 0.0, NAN]], {}, [0.0, 1.0, 0.5, NAN]),
    ("hardswish", [[-3.0, 3.0, INF]], {}, [-0.0, 3.0, INF]),  # -3 * 0 / 6
    ("softplus", [[21.0, -INF, INF, NAN]], {}, [21.0, 0.0, INF, NAN]),  # past the threshold: x itself
    ("softplus", [[10.0]], {"beta": 2.5, "threshold": 20.0}, [10.0]),  # beta x = 25 > 20
    ("log_sigmoid", [[-INF, INF, 0.0]], {}, [-INF, -0.0, -math.log(2.0)]),
    ("threshold", [[NAN, 0.5, 1.0, 1.5]], {"threshold": 1.0, "value": -7.0}, [NAN, -7.0, -7.0, 1.5]),
    ("add", [[INF, INF, 1.0], [-INF, 1.0, -1.0]], {}, [NAN, INF, 0.0]),
    ("sub", [[INF, 1.0], [INF, 3.0]], {"alpha": 2}, [NAN, -5.0]),
    ("mul", [[INF, 0.0, -0.0], [0.0, -3.0, -3.0]], {}, [NAN, -0.0, 0.0]),
    ("div", [[1.0, -1.0, 0.0, INF], [0.0, 0.0, 0.0, INF]], {}, [INF, -INF, NAN, NAN]),
    (
        "div",
        [[7.0, -7.0, 7.0, -0.0, 1.0], [2.0, 2.0, -0.0, 5.0, INF]],
        {"rounding_mode": "trunc"},
        [3.0, -3.0, -INF, -0.0, 0.0],
    ),
    (
        "div",
        [[7.0, -7.0, 7.0, 5.0, -5.0, 1.0, INF], [2.0, 2.0, 0.0, INF, INF, -3.0, 2.0]],
        {"rounding_mode": "floor"},
        [3.0, -4.0, INF, 0.0, -1.0, -1.0, NAN],
    ),
    (
        "pow",
        [[NAN, 1.0, -1.0, 0.0, -0.0, -8.0, -8.0, 2.0], [0.0, NAN, INF, -1.0, -3.0, 1 / 3, 3.0, -1075.0]],
        {},
        [1.0, 1.0, 1.0, INF, -INF, NAN, -512.0, 0.0],
    ),
    # an infinite base (C99 F.9.4.4): -2^63 is even (glibc's powl(-inf, -2^63) is +inf), -3 and 3 odd
    (
        "pow",
        [[-INF, -INF, -INF, -INF, INF, INF, -INF], [-(2.0**63), -3.0, 3.0, 2.0**63, -0.5, 0.5, NAN]],
        {},
        [0.0, -0.0, -INF, INF, 0.0, INF, NAN],
    ),
    (
        "remainder",
        [[5.0, -5.0, 5.0, -5.0, 5.0, -5.0, INF, 4.0], [3.0, 3.0, -3.0, -3.0, INF, INF, 3.0, 0.0]],
        {},
        [2.0, 1.0, -1.0, -2.0, 5.0, INF, NAN, NAN],
    ),
    (
        "fmod",
        [[5.0, -5.0, 5.0, -5.0, 5.0, INF, 4.0], [3.0, 3.0, -3.0, -3.0, INF, 3.0, 0.0]],
        {},
        [2.0, -2.0, 2.0, -2.0, 5.0, NAN, NAN],
    ),
    ("maximum", [[NAN, 1.0, -INF], [1.0, NAN, 2.0]], {}, [NAN, NAN, 2.0]),
    ("minimum", [[NAN, 1.0, -INF], [1.0, NAN, 2.0]], {}, [NAN, NAN, -INF]),
    (
        "atan2",
        [[0.0, -0.0, 0.0, -0.0, INF, -INF, 1.0, NAN], [0.0, 0.0, -0.0, -0.0, INF, -INF, -INF, 1.0]],
        {},
        [0.0, -0.0, math.pi, -math.pi, math.pi / 4, -3 * math.pi / 4, math.pi, NAN],
    ),
    # torch's second branch at w = 0.5: inf - (inf - 1)(1 - 0.5) = NaN; its first at w = 0.25: 1 + 0.25 inf = inf
    ("lerp", [[1.0, 1.0, 1.0, 1.0], [3.0, INF, INF, 3.0], [0.5, 0.5, 0.25, NAN]], {}, [2.0, NAN, INF, NAN]),
    ("addcdiv", [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], {"value": 2}, [INF, NAN]),
    ("addcmul", [[1.0, 1.0], [INF, 0.0], [0.0, 5.0]], {"value": 2}, [NAN, 1.0]),
    ("hypot", [[INF, -INF, NAN, 3.0, -0.0], [NAN, 1.0, INF, -4.0, 0.0]], {}, [INF, INF, INF, 5.0, 0.0]),
    ("nan_to_num", [[NAN, INF, -INF, 1.5]], {}, [0.0, F32_MAX, -F32_MAX, 1.5]),
    ("clamp", [[NAN, 0.0, 5.0, -5.0]], {"min": -1.0, "max": 1.0}, [NAN, 0.0, 1.0, -1.0]),
    ("clamp", [[0.0, 5.0]], {"min": 3.0, "max": 1.0}, [1.0, 1.0]),  # min > max: max everywhere
    ("clamp", [[0.0, 5.0]], {"min": NAN}, [NAN, NAN]),  # a NaN bound propagates
    ("clamp_min", [[NAN, -2.0, 2.0]], {"min": 0.0}, [NAN, 0.0, 2.0]),
    ("clamp_max", [[INF, -2.0]], {"max": 0.0}, [0.0, -2.0]),
]


def _assert_same(got: np.ndarray, want: list, where: str) -> None:
    want = np.array(want, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        close = np.where(np.isfinite(want), np.abs(got - want) <= 4e-16 * np.abs(want), got == want)
    same = close | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{where}: got {got.tolist()}, expected {want.tolist()}"
    zeros = want == 0
    assert np.array_equal(np.signbit(got[zeros]), np.signbit(want[zeros])), f"{where}: zero signs {got.tolist()}"


@pytest.mark.parametrize(
    ("op", "operands", "params", "expected"), SPECIAL, ids=[f"{c[0]}-{i}" for i, c in enumerate(SPECIAL)]
)
def test_special_values(op, operands, params, expected):
    ref, scale = P.OPS[op](*(np.array(o, dtype=np.float64) for o in operands), dtype=F, **params)
    assert ref.dtype == np.float64 and scale.dtype == np.float64 and scale.shape == ref.shape
    _assert_same(ref, expected, op)
    assert np.all(scale[~np.isfinite(ref)] == 0), "a non-finite reference must be matched exactly"
    assert np.all(np.isfinite(scale))


def test_signed_zero_results_that_torch_defines():
    assert np.signbit(P.div(np.array([-0.0]), np.array([5.0]), dtype=F, rounding_mode="floor")[0]).all()
    assert not np.signbit(P.sign(np.array([-0.0]), dtype=F)[0]).any()  # (0 < x) - (x < 0) is +0


def test_results_past_the_dtypes_range_are_infinite():
    ref, scale = P.exp(np.array([11.0, 12.0, -20.0]), dtype="float16")  # e^11 = 59874 fits, e^12 = 162755 does not
    assert ref[1] == INF and np.isfinite(ref[0]) and scale[1] == 0
    ref, _ = P.add(np.array([65504.0, 65504.0]), np.array([16.0, 15.0]), dtype="float16")
    assert ref.tolist() == [INF, 65519.0]  # max + half an ulp rounds to inf; below it to max
    ref, _ = P.mul(np.array([3e38]), np.array([2.0]), dtype="float32")
    assert ref[0] == INF


def test_comparisons_and_predicates_with_nan_and_inf():
    a = np.array([NAN, 1.0, INF, -0.0])
    b = np.array([NAN, NAN, INF, 0.0])
    assert P.eq(a, b, dtype=F)[0].tolist() == [False, False, True, True]
    assert P.ne(a, b, dtype=F)[0].tolist() == [True, True, False, False]
    assert P.lt(a, b, dtype=F)[0].tolist() == [False, False, False, False]
    assert P.le(a, b, dtype=F)[0].tolist() == [False, False, True, True]
    assert P.gt(np.array([2, 1]), np.array([1, 1]), dtype="int8")[0].tolist() == [True, False]
    assert P.ge(np.array([True, False]), np.array([True, True]), dtype="bool")[0].tolist() == [True, False]
    assert P.isnan(a, dtype=F)[0].tolist() == [True, False, False, False]
    assert P.isinf(a, dtype=F)[0].tolist() == [False, False, True, False]
    assert P.isfinite(a, dtype=F)[0].tolist() == [False, True, False, True]
    assert P.isfinite(np.array([5]), dtype="int32")[0].tolist() == [True]
    assert P.isnan(np.array([5]), dtype="int32")[0].tolist() == [False]
    assert P.logical_and(a, np.array([1.0, 0.0, 1.0, 1.0]), dtype=F)[0].tolist() == [True, False, True, False]
    assert P.logical_not(a, dtype=F)[0].tolist() == [False, False, False, True]  # NaN is True
    assert P.logical_xor(np.array([0, 3]), np.array([2, 3]), dtype="int8")[0].tolist() == [True, False]
    assert P.logical_or(np.array([0, 0]), np.array([0, -1]), dtype="int64")[0].tolist() == [False, True]
    for op in ("eq", "isnan", "logical_not"):
        ref, scale = P.OPS[op](*([a] * (1 if op != "eq" else 2)), dtype=F)
        assert ref.dtype == bool and not scale.any()


def test_nan_to_num_defaults_are_the_dtypes_extremes_and_values_are_converted():
    x = np.array([NAN, INF, -INF, 2.0])
    assert P.nan_to_num(x, dtype="float16")[0].tolist() == [0.0, 65504.0, -65504.0, 2.0]
    bmax = float.fromhex("0x1.fep127")
    assert P.nan_to_num(x, dtype="bfloat16")[0].tolist() == [0.0, bmax, -bmax, 2.0]
    assert P.nan_to_num(x, dtype="float64")[0].tolist() == [0.0, MAX, -MAX, 2.0]
    got = P.nan_to_num(x, dtype="float16", nan=0.1, posinf=1e10, neginf=-70000.0)[0]
    assert got.tolist() == [float(np.float16(0.1)), INF, -INF, 2.0]  # a plain conversion: overflow is inf
    assert P.nan_to_num(np.array([3, -4]), dtype="int16")[0].tolist() == [3, -4]


def test_threshold_compares_against_the_dtypes_value_of_the_bound():
    """threshold converts its Scalar to the tensor's type first: float16(0.1) = 0.0999755859375 < 0.1, so an input
    equal to float16(0.1) is <= the bound and replaced."""
    b = float(np.float16(0.1))
    ref, _ = P.threshold(np.array([b, float(np.float16(0.1001))]), threshold=0.1, value=9.0, dtype="float16")
    assert ref.tolist() == [9.0, float(np.float16(0.1001))]
    ref, _ = P.threshold(np.array([b]), threshold=0.1, value=9.0, dtype="float64")
    assert ref.tolist() == [9.0]  # in float64 the bound is 0.1 itself, and 0.0999755859375 <= 0.1
    assert P.threshold(np.array([-3, 4]), threshold=0, value=100, dtype="int8")[0].tolist() == [100, 4]


def test_where_masked_fill_and_fills():
    cond = np.array([True, False, True])
    assert P.where(cond, np.array([1.0, 2.0, NAN]), np.array([5.0]), dtype=F)[0].tolist()[:2] == [1.0, 5.0]
    assert P.where(cond, np.array([1, 2, 3]), np.array([-1, -2, -3]), dtype="int8")[0].tolist() == [1, -2, 3]
    ref, scale = P.masked_fill(np.array([1.0, 2.0, 3.0]), cond, value=-0.5, dtype="bfloat16")
    assert ref.tolist() == [-0.5, 2.0, -0.5] and not scale.any()
    assert P.masked_fill(np.array([1, 2]), np.array([False, True]), value=-128, dtype="int8")[0].tolist() == [1, -128]
    assert P.full((2, 2), -1.5, dtype="int32")[0].tolist() == [[-1, -1], [-1, -1]]  # truncated toward zero
    assert P.full((3,), 2.5, dtype="bool")[0].tolist() == [True] * 3
    assert P.fill((1,), INF, dtype="float16")[0].tolist() == [INF]  # an infinity converts to any float type
    assert P.zeros((2,), dtype="uint8")[0].dtype == np.int64 and P.ones((2,), dtype="float16")[0].tolist() == [1, 1]
    assert P.copy(np.array([NAN, -0.0]), dtype=F)[0].tolist()[1] == 0.0


def test_glu_halves_along_dim():
    x = np.array([[1.0, 2.0, 0.0, 100.0]])
    ref, _ = P.glu(x, dtype=F)
    assert ref.shape == (1, 2) and ref[0, 0] == 0.5 and ref[0, 1] == 2.0
    ref, _ = P.glu(np.array([[3.0], [0.0]]), dim=0, dtype=F)
    assert ref.tolist() == [[1.5]]


# --- integers ---------------------------------------------------------------------------------------------------------
INT_TYPES = ["int8", "uint8", "int16", "int32", "int64"]


def _py_wrap(v: int, dtype: str) -> int:
    bits, signed = P.INT_TYPES[dtype]
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def _int_samples(dtype: str, n: int, gen, nonzero: bool = False) -> np.ndarray:
    lo, hi = P.int_range(dtype)
    v = gen.integers(lo, hi, n, endpoint=True, dtype=np.int64)
    v = np.concatenate([v, [lo, hi, lo + 1, hi - 1, 0, 1, -1 if lo < 0 else 2]])
    return v[v != 0] if nonzero else v


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_integer_arithmetic_wraps_like_twos_complement(dtype):
    gen = np.random.default_rng(P.INT_TYPES[dtype][0])
    a = _int_samples(dtype, 200, gen)
    b = gen.permutation(a)
    cases = {
        "add": (P.add(a, b, alpha=3, dtype=dtype), lambda x, y: x + 3 * y),
        "sub": (P.sub(a, b, dtype=dtype), lambda x, y: x - y),
        "mul": (P.mul(a, b, dtype=dtype), lambda x, y: x * y),
        "neg": (P.neg(a, dtype=dtype), lambda x, y: -x),
        "abs": (P.abs(a, dtype=dtype), lambda x, y: abs(x)),
        "addcmul": (P.addcmul(a, a, b, value=3, dtype=dtype), lambda x, y: x + 3 * x * y),
        "bitwise_not": (P.bitwise_not(a, dtype=dtype), lambda x, y: ~x),
        "maximum": (P.maximum(a, b, dtype=dtype), max),
    }
    for name, ((ref, scale), fn) in cases.items():
        want = [_py_wrap(fn(x, y), dtype) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
        assert ref.dtype == np.int64 and ref.tolist() == want, (name, dtype)
        assert not scale.any()
    lo, _ = P.int_range(dtype)
    if lo < 0:
        assert P.abs(np.array([lo]), dtype=dtype)[0].tolist() == [lo]  # abs(INT_MIN) == INT_MIN
        assert P.neg(np.array([lo]), dtype=dtype)[0].tolist() == [lo]


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_integer_division_remainder_and_fmod_signs(dtype):
    gen = np.random.default_rng(100 + P.INT_TYPES[dtype][0])
    b = _int_samples(dtype, 200, gen, nonzero=True)
    a = _int_samples(dtype, 200, gen)[: b.size]
    x, y = a.tolist(), b.tolist()
    trunc_q = [_py_wrap(int(Fraction(p, q)), dtype) for p, q in zip(x, y, strict=True)]  # C: toward zero
    assert P.div(a, b, rounding_mode="trunc", dtype=dtype)[0].tolist() == trunc_q
    assert P.div(a, b, rounding_mode="floor", dtype=dtype)[0].tolist() == [
        _py_wrap(p // q, dtype) for p, q in zip(x, y, strict=True)
    ]
    assert P.remainder(a, b, dtype=dtype)[0].tolist() == [p % q for p, q in zip(x, y, strict=True)]  # divisor's sign
    fmod_r = [p - int(Fraction(p, q)) * q for p, q in zip(x, y, strict=True)]  # C: the dividend's sign
    assert P.fmod(a, b, dtype=dtype)[0].tolist() == fmod_r
    lo, _ = P.int_range(dtype)
    if lo < 0:
        assert P.div(np.array([lo]), np.array([-1]), rounding_mode="trunc", dtype=dtype)[0].tolist() == [lo]
        assert P.remainder(np.array([lo]), np.array([-1]), dtype=dtype)[0].tolist() == [0]


def test_remainder_and_fmod_signs_on_floats():
    a = np.array([5.5, -5.5, 5.5, -5.5, 6.0, -6.0])
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 3.0])
    assert P.remainder(a, b, dtype=F)[0].tolist() == [1.5, 0.5, -0.5, -1.5, 0.0, 0.0]
    assert P.fmod(a, b, dtype=F)[0].tolist() == [1.5, -1.5, 1.5, -1.5, 0.0, -0.0]
    ref, scale = P.remainder(np.array([-1e-30, 1.0]), np.array([1.0, 3.0]), dtype="float64")
    assert ref.tolist() == [1.0, 1.0] and scale.tolist() == [1.0, 0.0]  # r + b is rounded: judged against |b|


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_shifts_within_and_past_the_width(dtype):
    bits, signed = P.INT_TYPES[dtype]
    gen = np.random.default_rng(bits + signed)
    a = _int_samples(dtype, 100, gen)
    lo, hi = P.int_range(dtype)
    s = gen.integers(max(lo, -70), min(hi, 70), a.size, endpoint=True)
    left = P.bitwise_left_shift(a, s, dtype=dtype)[0].tolist()
    right = P.bitwise_right_shift(a, s, dtype=dtype)[0].tolist()
    for x, k, got_l, got_r in zip(a.tolist(), s.tolist(), left, right, strict=True):
        inside = 0 <= k < bits
        assert got_l == (_py_wrap(x << k, dtype) if inside else 0), (x, k)
        assert got_r == ((x >> k) if inside else (-1 if x < 0 else 0)), (x, k)
    assert P.bitwise_left_shift(np.array([1]), np.array([bits - 1]), dtype=dtype)[0].tolist() == [
        _py_wrap(1 << (bits - 1), dtype)
    ]
    assert P.bitwise_left_shift(np.array([1]), np.array([bits]), dtype=dtype)[0].tolist() == [0]
    if signed:
        assert P.bitwise_right_shift(np.array([lo]), np.array([bits]), dtype=dtype)[0].tolist() == [-1]
        assert P.bitwise_right_shift(np.array([-8]), np.array([-1]), dtype=dtype)[0].tolist() == [-1]


def test_bitwise_ops_on_ints_and_bools():
    assert P.bitwise_and(np.array([12, -1]), np.array([10, 7]), dtype="int8")[0].tolist() == [8, 7]
    assert P.bitwise_or(np.array([12]), np.array([3]), dtype="uint8")[0].tolist() == [15]
    assert P.bitwise_xor(np.array([255]), np.array([15]), dtype="uint8")[0].tolist() == [240]
    assert P.bitwise_not(np.array([0, 255]), dtype="uint8")[0].tolist() == [255, 0]
    assert P.bitwise_not(np.array([True, False]), dtype="bool")[0].tolist() == [False, True]
    assert P.bitwise_xor(np.array([True, True]), np.array([True, False]), dtype="bool")[0].dtype == bool


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_integer_pow_wraps_and_zero_to_the_zero_is_one(dtype):
    gen = np.random.default_rng(7)
    a = _int_samples(dtype, 80, gen)
    e = gen.integers(0, 70, a.size)
    got = P.pow(a, e, dtype=dtype)[0].tolist()
    assert got == [_py_wrap(pow(x, k, 1 << 64), dtype) for x, k in zip(a.tolist(), e.tolist(), strict=True)]
    assert P.pow(np.array([0]), np.array([0]), dtype=dtype)[0].tolist() == [1]


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_integer_pow_of_a_negative_exponent_array_is_torchs(dtype):
    """torch's integer pow with a negative tensor exponent: 1 for base 1, +-1 for base -1 by parity, else 0."""
    a = np.array([1, 1, -1, -1, 0, 2, -3, 7])
    e = np.array([-1, -64, -1, -2, -1, -3, -1, 2])
    assert P.pow(a, e, dtype=dtype)[0].tolist() == [1, 1, -1, 1, 0, 0, 0, 49]


def test_bool_arithmetic():
    t, f = np.array([True, True, False, False]), np.array([True, False, True, False])
    assert P.add(t, f, dtype="bool")[0].tolist() == [True, True, True, False]
    assert P.mul(t, f, dtype="bool")[0].tolist() == [True, False, False, False]
    assert P.maximum(t, f, dtype="bool")[0].tolist() == [True, True, True, False]
    assert P.sign(t, dtype="bool")[0].tolist() == t.tolist()


# --- casts ------------------------------------------------------------------------------------------------------------
def test_casts_among_the_dtypes():
    x = np.array([1.9, -1.9, -0.5, 127.0, 0.0])
    assert P.cast(x, src="float32", dtype="int8")[0].tolist() == [1, -1, 0, 127, 0]  # toward zero
    assert P.cast(np.array([255.9]), src="float32", dtype="uint8")[0].tolist() == [255]
    assert P.cast(np.array([300, -1, 128]), src="int32", dtype="uint8")[0].tolist() == [44, 255, 128]  # wraps
    assert P.cast(np.array([300, 128]), src="int32", dtype="int8")[0].tolist() == [44, -128]
    assert P.cast(np.array([2**24 + 1, 2**63 - 1]), src="int64", dtype="float32")[0].tolist() == [2.0**24, 2.0**63]
    assert P.cast(np.array([70000, 65519]), src="int32", dtype="float16")[0].tolist() == [INF, 65504.0]
    assert P.cast(np.array([NAN, 0.0, -0.0, 2.0]), src="float16", dtype="bool")[0].tolist() == [
        True,
        False,
        False,
        True,
    ]
    assert P.cast(np.array([True, False]), src="bool", dtype="float16")[0].tolist() == [1.0, 0.0]
    assert P.cast(np.array([True, False]), src="bool", dtype="int64")[0].dtype == np.int64
    got = P.cast(np.array([0.1, 1e-9, 1e6, -NAN]), src="float64", dtype="float16")[0]
    assert got[:3].tolist() == [float(np.float16(0.1)), 0.0, INF] and np.isnan(got[3])
    bf = P.cast(np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8]), src="float32", dtype="bfloat16")[0]
    assert bf.tolist() == [1.0, 1.0 + 2**-6]  # ties to even
    assert P.cast(np.array([-(2.0**63)]), src="float64", dtype="int64")[0].tolist() == [-(2**63)]


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        (NAN, "int32"),
        (INF, "int64"),
        (-INF, "int8"),
        (128.0, "int8"),
        (-129.0, "int8"),
        (-1.0, "uint8"),
        (256.0, "uint8"),
        (2.0**63, "int64"),
        (2.0**31, "int32"),
    ],
)
def test_float_to_integer_casts_refuse_what_torch_leaves_undefined(value, dtype):
    with pytest.raises(ValueError, match=f"cast: .*{dtype}"):
        P.cast(np.array([1.0, value]), src="float64", dtype=dtype)


# --- refusals ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["div", "remainder", "fmod"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64"])
def test_integer_division_by_zero_is_refused_naming_the_op(op, dtype):
    kw = {"rounding_mode": "floor"} if op == "div" else {}
    with pytest.raises(ZeroDivisionError, match=f"^{op}: integer division by zero"):
        P.OPS[op](np.array([5, 6]), np.array([1, 0]), dtype=dtype, **kw)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: P.bitwise_and(np.array([1.0]), np.array([2.0]), dtype="float32"),
            TypeError,
            "bitwise_and: does not take dtype float32",
        ),
        (lambda: P.bitwise_left_shift(np.array([True]), np.array([True]), dtype="bool"), TypeError, "bool"),
        (lambda: P.exp(np.array([1]), dtype="int32"), TypeError, "exp: does not take dtype int32"),
        (lambda: P.div(np.array([1]), np.array([2]), dtype="int32"), TypeError, "div: does not take dtype int32"),
        (lambda: P.neg(np.array([True]), dtype="bool"), TypeError, "neg: does not take dtype bool"),
        (lambda: P.sub(np.array([True]), np.array([True]), dtype="bool"), TypeError, "sub: does not take two bool"),
        (lambda: P.addcdiv(np.array([1]), np.array([1]), np.array([1]), dtype="int16"), TypeError, "addcdiv"),
        (lambda: P.exp(np.array([1.0]), dtype="float8_e4m3fn"), ValueError, "exp: dtype 'float8_e4m3fn' is not one"),
        (lambda: P.pow(np.array([2]), -1, dtype="int64"), ValueError, "negative integer powers"),
        (
            lambda: P.masked_fill(np.array([1]), np.array([True]), value=300, dtype="int8"),
            ValueError,
            "masked_fill: value=300 cannot be converted to int8 without overflow",
        ),
        (lambda: P.full((2,), 1e5, dtype="float16"), ValueError, "full: value=100000.0 cannot be converted"),
        (lambda: P.full((2,), NAN, dtype="int32"), ValueError, "full: value=nan"),
        (lambda: P.add(np.array([1]), np.array([1]), alpha=0.5, dtype="int32"), ValueError, "alpha=0.5 is a float"),
        (lambda: P.clamp(np.array([1]), min=0.5, dtype="int32"), ValueError, "clamp: min=0.5 is a float"),
        (lambda: P.clamp(np.array([1.0]), dtype="float32"), ValueError, "at least one of min and max"),
        (lambda: P.celu(np.array([1.0]), alpha=0.0, dtype="float32"), ValueError, "celu: alpha=0"),
        (lambda: P.glu(np.array([1.0, 2.0, 3.0]), dtype="float32"), ValueError, "glu: halving dimension -1"),
        (lambda: P.arange(0, 5, 0, dtype="int32"), ValueError, "step must be nonzero"),
        (lambda: P.arange(0, 5, -1, dtype="float32"), ValueError, "inconsistent with step sign"),
        (lambda: P.arange(0, 300, 1, dtype="int8"), ValueError, "outside int8's range"),
        (lambda: P.add(np.array([300]), np.array([1]), dtype="int8"), ValueError, "outside int8's range"),
        (lambda: P.div(np.array([1.0]), np.array([1.0]), rounding_mode="round", dtype=F), ValueError, "rounding_mode"),
        (lambda: P.where(np.array([1]), np.array([1.0]), np.array([2.0]), dtype=F), TypeError, "condition must be"),
    ],
)
def test_refusals_name_the_op(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- div "trunc" follows torch's rounded quotient ---------------------------------------------------------------------
def test_div_trunc_truncates_the_quotient_rounded_in_the_dtypes_arithmetic():
    """torch computes trunc(a / b) with a / b rounded in float32 (the half types too) or float64: where the exact
    quotient is just below an integer n and rounds to it, torch's answer (and the oracle's) is n, not n - 1."""
    gen = np.random.default_rng(3)
    found = 0
    for _ in range(4000):
        b = np.float32(gen.uniform(1, 2))
        n = int(gen.integers(2, 200))
        c = np.float32(n * float(b))
        a = np.nextafter(c, np.float32(0)) if float(c) >= n * float(b) else c
        exact = Fraction(float(a)) / Fraction(float(b))
        if exact < n and float(np.float32(a) / b) == n:  # numpy's float32 division is IEEE's
            ref, _ = P.div(np.array([float(a)]), np.array([float(b)]), rounding_mode="trunc", dtype="float32")
            assert ref.tolist() == [float(n)]
            assert (
                P.div(np.array([float(a)]), np.array([float(b)]), rounding_mode="floor", dtype="float32")[0][0] == n - 1
            )
            found += 1
    assert found > 5  # the case is not vacuous


# --- the contract -----------------------------------------------------------------------------------------------------
CONTRACT = (  # the op names of the contract, as it lists them
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
    "isnan",
    "isinf",
    "isfinite",
    "nan_to_num",
    "clamp",
    "clamp_min",
    "clamp_max",
    "where",
    "masked_fill",
    "copy",
    "fill",
    "zeros",
    "ones",
    "full",
    "arange",
    "linspace",
    "cast",
)


def test_every_op_of_the_contract_has_an_oracle_taking_dtype_by_keyword():
    assert sorted(P.OPS) == sorted(CONTRACT) and len(CONTRACT) == len(set(CONTRACT))
    for name, fn in P.OPS.items():
        params = inspect.signature(fn).parameters
        assert params["dtype"].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert fn.__doc__, name


def test_result_types_follow_the_contract():
    x = np.array([0.5, -1.5])
    assert P.exp(x, dtype="float16")[0].dtype == np.float64
    assert P.add(np.array([1]), np.array([2]), dtype="int16")[0].dtype == np.int64
    assert P.lt(x, x, dtype="float16")[0].dtype == bool
    assert P.logical_and(np.array([True]), np.array([False]), dtype="bool")[0].dtype == bool
    for out in (P.exp(x, dtype=F), P.add(np.array([1]), np.array([2]), dtype="int8"), P.eq(x, x, dtype=F)):
        assert out[1].dtype == np.float64


def test_the_oracle_imports_nothing_of_the_kernels_or_the_engine_and_no_torch():
    tree = ast.parse(Path(P.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "fractions", "concurrent.futures", "numpy", "nbxcert.oracles"}, imported
    assert "torch" not in sys.modules


def test_one_operand_extended_ops_take_the_tiles_to_the_same_bits():
    """A long double op of one large operand goes tile by tile, a tile of 16-bit values through their table
    (`oracles.elementwise._evaluate`): the values of evaluating every element, special values included; two operands
    go the parts' way, as before."""
    import numpy as np

    from nbxcert.oracles import elementwise as ew
    from nbxcert.oracles import pointwise as pw

    rng = np.random.default_rng(9)
    half = (rng.standard_normal(ew.TABULATE_AT + 999) * 8).astype(np.float16)
    half[:6] = [0.0, -0.0, np.inf, -np.inf, 65504.0, 6e-8]
    for x in (half.astype(np.float64), rng.standard_normal(ew.TABULATE_AT + 999) * 8):
        for fn in (np.exp2, np.expm1, np.log, np.log1p, np.sin, lambda t: pw._LD(1) / np.sqrt(t)):
            with np.errstate(all="ignore"):
                want = np.asarray(fn(x.astype(pw._LD))).astype(np.float64)
            assert np.array_equal(pw._extended(fn, x), want, equal_nan=True)
    assert not [k for k in ew._TABLES if getattr(k[0], "__name__", "") == "run"]  # a call's tables are its own
