"""The float64 transcendental functions the oracles use (exp, tanh, sigmoid, erf) are within 1 ulp of the exact value
over each function's whole useful range, tails and subnormal inputs included, checked against mpmath at 50 digits.

The ulp is that of the exact value: the spacing of float64 at |exact| (below a power of two, the finer spacing
below it; in the subnormal range, 2^-1074). An exact value that underflows float64 must come out as 0 or the nearest
subnormal; one past float64's range as inf.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from nbxcert.oracles import elementwise as ew

mpmath.mp.dps = 50
TINY = 2.0**-1074  # the smallest subnormal
MAX = float(np.finfo(np.float64).max)


def ulp_of_exact(t: mpmath.mpf) -> mpmath.mpf:
    """The float64 spacing at the exact value t (the spacing just below a power of two when |t| is below it)."""
    a = abs(t)
    if a < mpmath.mpf(2) ** -1022:
        return mpmath.mpf(2) ** -1074
    e = int(mpmath.floor(mpmath.log(a, 2)))
    if mpmath.mpf(2) ** e > a:  # log2 rounded up across a power of two
        e -= 1
    return mpmath.mpf(2) ** (e - 52)


def ulp_errors(fn, exact, xs: np.ndarray) -> tuple[float, float]:
    """(max ulp error, the input where it occurs) of fn over xs against mpmath's exact function."""
    got = fn(xs)
    worst, where = 0.0, float("nan")
    for x, g in zip(xs.tolist(), got.tolist(), strict=False):
        t = exact(mpmath.mpf(x))
        if abs(t) > MAX * (1 + 2.0**-53):  # beyond float64: must be an infinity of the same sign
            err = 0.0 if (math.isinf(g) and (g > 0) == (t > 0)) else math.inf
        elif math.isnan(g) or math.isinf(g):
            err = math.inf
        else:
            err = float(abs(mpmath.mpf(g) - t) / ulp_of_exact(t)) if t != 0 else (0.0 if g == 0 else math.inf)
        if err > worst:
            worst, where = err, x
    return worst, where


def _subnormals(gen, n):
    return np.concatenate([gen.uniform(1, 2**52, n).round() * TINY, [TINY, 2 * TINY, 2.0**-1023, 2.0**-1022]])


def _both_signs(a):
    return np.concatenate([a, -a])


def samples(name: str) -> np.ndarray:
    """Inputs covering each function's useful range: the bulk, near zero, subnormal inputs, and the tails where the
    result underflows to subnormals or overflows / saturates."""
    gen = np.random.default_rng({"exp": 1, "tanh": 2, "sigmoid": 3, "erf": 4}[name])
    tiny = _both_signs(np.concatenate([_subnormals(gen, 40), np.exp2(gen.uniform(-1022, -20, 80))]))
    if name == "exp":
        parts = [
            gen.uniform(-745.2, 709.79, 600),
            gen.standard_normal(200) * 1e-3,
            gen.uniform(-745.2, -708.0, 200),  # results in the subnormal range
            gen.uniform(700.0, 709.78, 50),  # near overflow
            [-745.14, -745.13, -744.44, -708.4, 709.78, 709.7827128933840, 709.79, 710.0, -746.0, 0.0],
        ]
    elif name == "tanh":
        parts = [
            _both_signs(gen.uniform(0, 20, 400)),
            _both_signs(gen.uniform(20, 800, 40)),  # saturated at +-1
            gen.standard_normal(200) * 1e-4,
            _both_signs(np.exp2(gen.uniform(-30, 0, 200))),
            [0.0, 0.5493061443340548, 19.06, 22.0, 710.0],
        ]
    elif name == "sigmoid":
        parts = [
            gen.uniform(-50, 50, 500),
            gen.uniform(-745.0, -700.0, 150),  # results in the subnormal range
            gen.uniform(-800.0, -745.2, 20),  # underflow to 0
            gen.uniform(36.0, 800.0, 50),  # saturated at 1
            gen.standard_normal(200) * 1e-4,
            [0.0, -708.4, -744.4, -745.13, 36.7, 37.0],
        ]
    elif name == "erf":
        parts = [
            _both_signs(gen.uniform(0, 6.0, 500)),
            _both_signs(gen.uniform(6.0, 30.0, 40)),  # saturated at +-1
            gen.standard_normal(200) * 1e-4,
            _both_signs(np.exp2(gen.uniform(-30, 0, 200))),
            [0.0, 0.5, 0.8427, 2.0, 5.9, 5.93, 6.0],
        ]
    else:
        raise ValueError(name)
    return np.concatenate([np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]), tiny])


FUNCTIONS = {
    "exp": (ew.exp, mpmath.exp),
    "tanh": (ew.tanh, mpmath.tanh),
    "sigmoid": (ew.sigmoid, lambda x: 1 / (1 + mpmath.exp(-x))),
    "erf": (ew.erf, mpmath.erf),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_within_one_ulp_everywhere(name):
    fn, exact = FUNCTIONS[name]
    xs = samples(name)
    worst, where = ulp_errors(fn, exact, xs)
    assert worst <= 1.0, f"oracle {name} is {worst:.3f} ulp off at x = {where!r} (over {xs.size} samples)"


def test_the_checker_itself_catches_a_two_ulp_error():
    """The ulp measure is not vacuous: exp pushed two ulps off is reported as about 2 ulp."""
    xs = np.array([0.3, 1.7, -2.5])
    off = ulp_errors(lambda v: np.nextafter(np.nextafter(ew.exp(v), np.inf), np.inf), mpmath.exp, xs)[0]
    assert 1.5 < off < 2.6


def test_the_checker_uses_the_finer_spacing_below_a_power_of_two():
    assert ulp_of_exact(mpmath.mpf(1) - mpmath.mpf(2) ** -60) == mpmath.mpf(2) ** -53
    assert ulp_of_exact(mpmath.mpf(1)) == mpmath.mpf(2) ** -52
    assert ulp_of_exact(mpmath.mpf(2) ** -1030) == mpmath.mpf(2) ** -1074


def test_numpy_float64_exp_and_tanh_are_not_what_the_oracles_use():
    """Documents the reason for the extended-precision evaluation: numpy's own float64 exp/tanh are SIMD
    approximations whose error depends on the CPU; the oracle's are at most ~0.5 ulp here."""
    xs = samples("tanh")[:300]
    assert ulp_errors(ew.tanh, mpmath.tanh, xs)[0] <= 0.51
    xs = samples("exp")[:300]
    assert ulp_errors(ew.exp, mpmath.exp, xs)[0] <= 0.51


def test_large_arrays_are_evaluated_in_parts_on_threads_to_the_same_bits(monkeypatch):
    """exp, tanh and sigmoid cut a large array into parts evaluated on threads (long double has no SIMD): the values
    are the one-piece evaluation's, bit for bit, for any layout."""
    from nbxcert.oracles import elementwise as E
    from nbxcert.oracles import parts as P

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert P.threads() == 1  # the certify scripts' share of the cores is honoured
    monkeypatch.setattr(P, "PARALLEL_AT", 1000)
    monkeypatch.setattr(P, "threads", lambda: 3)  # three parts, whatever this machine has
    x = np.random.default_rng(3).standard_normal((7, 2001)) * 30
    for fn, one in ((E.exp, E._exp_extended), (E.tanh, E._tanh_extended), (E.sigmoid, E._sigmoid_extended)):
        for arr in (x, x[:, ::3], x.T):
            got = fn(arr)
            assert got.shape == arr.shape and np.array_equal(got, one(arr), equal_nan=True), fn.__name__


def _every_half(kind: str) -> np.ndarray:
    """Every finite value of a 16-bit float format, as float64 (zeros, subnormals, the largest included)."""
    with np.errstate(invalid="ignore"):  # the signalling NaN codes
        if kind == "float16":
            values = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
        else:
            values = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return values[np.isfinite(values)]


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
def test_sixteen_bit_arguments_are_tabulated_to_the_same_bits(kind):
    """A large array of 16-bit floats' values (a half-precision kernel's input, widened) is evaluated through the
    function's values at the format's 65536 codes, computed once: the values are the element-wise evaluation's, bit
    for bit, whatever the layout, with every finite value of the format among them (both zeros, subnormals, the
    extremes, infinities); the function itself sees the codes' values and nothing else."""
    from nbxcert.oracles import elementwise as E

    values = np.concatenate([_every_half(kind), [np.inf, -np.inf]])
    x = np.random.default_rng(5).permutation(np.tile(values, 15)).reshape(5, -1)
    assert x[:, ::3].size >= E.TABULATE_AT
    for one in (E._exp_extended, E._tanh_extended, E._sigmoid_extended):
        seen: list[int] = []

        def spy(a, one=one, seen=seen):
            seen.append(a.size)
            return one(a)

        for arr in (x, x[:, ::3], x.T, x[:, 1:]):
            with np.errstate(over="ignore", invalid="ignore"):
                want = one(arr)
            got = E._evaluate(spy, arr)
            assert got.shape == arr.shape and np.array_equal(got, want, equal_nan=True), (one.__name__, kind)
        # float16 holds every bfloat16 value of moderate size: a bfloat16 array's tiles may go through either table
        assert seen and set(seen) == {1 << 16} and len(seen) <= 2, seen
    assert E.exp(x).shape == x.shape  # the public functions take this way too


def test_other_tiles_are_evaluated_element_by_element_and_small_arrays_whole():
    """A tile with one value no 16-bit float holds (or a NaN) is evaluated element by element, the rest of the array
    through the table, the same values either way; an array too small to gain is evaluated whole."""
    from nbxcert.oracles import elementwise as E

    x = np.random.default_rng(6).standard_normal(4 * E.TILE).astype(np.float16).astype(np.float64)
    x = np.concatenate([x] * (E.TABULATE_AT // x.size + 1))
    codes, kind = E._half_codes(x)
    assert kind == "float16" and np.array_equal(E._grid(kind)[codes], x)
    for odd in (1.0 + 2.0**-30, np.nan):
        y = x.copy()
        y[1234] = odd
        assert E._half_codes(y) is None
    bf = x.astype(np.float32)
    bf = (bf.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64) * 2.0**100  # bf16, no half
    codes, kind = E._half_codes(bf)
    assert kind == "bfloat16" and np.array_equal(E._grid(kind)[codes], bf)
    for odd in (0.1, np.nan):
        y = x.copy()
        y[-1] = odd  # in the last tile
        seen: list[int] = []

        def spy(a, seen=seen):
            seen.append(a.size)
            return E._sigmoid_extended(a)

        got = E._evaluate(spy, y)
        assert np.array_equal(got, E._sigmoid_extended(y), equal_nan=True)
        # the table once (the codes' 65536 values), and the odd tile alone (at most TILE elements)
        assert len(seen) == 2 and (1 << 16) in seen and max(seen) <= E.TILE, seen
    seen = []
    small = x[: E.TABULATE_AT - 1]
    E._evaluate(lambda a: seen.append(a.size) or E._sigmoid_extended(a), small)
    assert seen == [small.size]


def test_large_arrays_of_other_values_are_evaluated_tile_by_tile_to_the_same_bits():
    """A large array of float64 values (no 16-bit float's) goes tile by tile, element by element, on the cores: the
    same values as one evaluation, contiguous, strided, transposed, and in rows longer than a tile."""
    from nbxcert.oracles import elementwise as E

    x = np.random.default_rng(7).standard_normal((3, 2 * E.TABULATE_AT)) * 30
    for fn, one in ((E.exp, E._exp_extended), (E.tanh, E._tanh_extended), (E.sigmoid, E._sigmoid_extended)):
        for arr in (x, x[:, ::2], x.T, x.reshape(-1, 96)[:, 5:]):
            assert arr.size >= E.TABULATE_AT
            with np.errstate(over="ignore"):
                want = one(arr)
            assert np.array_equal(fn(arr), want, equal_nan=True), fn.__name__


@pytest.mark.parametrize("half", [True, False])
def test_erf_and_gelus_terms_take_the_tiles_to_the_same_bits(half):
    """erf, and GELU's erf and tanh terms, over a large array go the tile way (through the 16-bit table where the
    values are a float16's): the values of the whole-array formulas, bit for bit."""
    from nbxcert.oracles import elementwise as E

    x = np.random.default_rng(8).standard_normal((5, E.TABULATE_AT)) * 4
    if half:
        x = x.astype(np.float16).astype(np.float64)
    strided = x[:, ::2]
    for arr in (x, strided):
        assert np.array_equal(E.erf(arr), np.asarray(E._erf(arr), dtype=np.float64))
        want_erf = np.asarray(E._erf(arr / math.sqrt(2.0)), dtype=np.float64)
        with np.errstate(over="ignore"):
            want_tanh = E._tanh_extended(math.sqrt(2.0 / math.pi) * (arr + E.GELU_TANH_C * arr * arr * arr))
        for approximate, f in (("none", want_erf), ("tanh", want_tanh)):
            ref, scale = E.gelu(arr, approximate)
            assert np.array_equal(ref, 0.5 * arr * (1.0 + f)) and np.array_equal(
                scale, 0.5 * np.abs(arr) * (1.0 + np.abs(f))
            )
