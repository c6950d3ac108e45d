"""The pointwise family's half-precision helpers (`math_level`: float16 and bfloat16 results on an NVIDIA GPU) over
every input of each 16-bit type, against the op's float64 oracle at the device file's tolerance.

Under the interpreter the helpers run with DM = EMULATED + the level: the same algorithms (series, ranges, special
values, scalings), their approximate GPU instructions (ex2.approx, lg2.approx, rsqrt.approx, div.full) replaced by
numpy's exact float32 ones, the result rounded once to the 16-bit type as the kernel's store does; the float32 result
must also lie within MARGIN of the tolerance before that rounding, the room left to the instructions' own error. The
GPU test runs the ops themselves, served, over the same inputs: the instructions' error included."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from devicetools import empty, from_numpy

from nbxcert.kernels import dtypes as dt
from nbxcert.kernels import pointwise as pw
from nbxcert.kernels.backends import select
from nbxcert.kernels.compare import compare
from nbxcert.kernels.jit import jit, tl
from nbxcert.oracles import pointwise as oracles
from nbxcert.profiles import get_profile

# the largest error of a half-precision helper before its result is rounded, as a share of the tolerance, under the
# interpreter (exact primitives)
MARGIN = 2.0**-8
MIN_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126}
LEVEL = {"float16": pw.HALF_MATH.value, "bfloat16": pw.HALF_BF16.value}

# every op whose body takes a half-precision path, and the parameters it is tried at
HALF_OPS = {
    "exp": {},
    "log": {},
    "log2": {},
    "log1p": {},
    "expm1": {},
    "rsqrt": {},
    "tanh": {},
    "sin": {},
    "cos": {},
    "tan": {},
    "reciprocal": {},
    "sigmoid": {},
    "silu": {},
    "mish": {},
    "elu": {"alpha": 1.0},
    "celu": {"alpha": 0.5},
    "selu": {},
    "softplus": {"beta": 1.0, "threshold": 20.0},
    "gelu_tanh": {},
    "log_sigmoid": {},
    "erf": {},
    "gelu": {},
    "hardsigmoid": {},
    "hardswish": {},
}


@jit
def _half_body_kernel(x_ptr, y_ptr, out_ptr, n, p0, p1, p2, BODY: tl.constexpr, DM: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = BODY(x[i], y[i]) in float32, the parameters p0..p2 float32."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    y = tl.load(y_ptr + offs, mask=ok, other=0.0)
    r = BODY(x, y, x, p0, p1, p2, offs.to(tl.int64), DM)
    tl.store(out_ptr + offs, r, mask=ok)


def every_value(dtype: str) -> np.ndarray:
    """Every value of a 16-bit float type (NaN patterns once), widened exactly to float32."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    if dtype == "float16":
        x = bits.view(np.float16).astype(np.float32)
    else:
        x = dt.bfloat16_bits_to_float32(bits)
    return np.concatenate([x[~np.isnan(x)], np.float32([np.nan])]).astype(np.float32)


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 results rounded once to the 16-bit type (nearest even), as float64."""
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float64)
    return dt.bfloat16_bits_to_float32(dt.float32_to_bfloat16_bits(values)).astype(np.float64)


FLOAT16_ONLY = {"sin", "cos", "tan"}  # bfloat16's range keeps CUDA's reduction


def half_results(op: str, x: np.ndarray, params: dict, dtype: str, y: np.ndarray | None = None) -> np.ndarray:
    row = pw.OPS[op]
    p = [float(v) for v in params.values()] + [0.0] * (3 - len(params))
    out = empty((x.size,), "float32")
    block = 4096
    xt = from_numpy(x)
    yt = xt if y is None else from_numpy(y)
    level = pw.EMULATED.value + LEVEL[dtype]
    grid = (pw.cdiv(x.size, block),)
    with np.errstate(all="ignore"):  # the interpreter's numpy meets the special values (log of 0, inf - inf, ...)
        _half_body_kernel[grid](xt, yt, out, x.size, p[0], p[1], p[2], BODY=row.body, DM=level, BLOCK=block)
    return out.numpy()


@pytest.mark.skipif(select().name != "interpreter", reason="the emulated half path runs under the interpreter")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(HALF_OPS))
def test_half_helpers_over_every_16_bit_input(op, dtype):
    if op in FLOAT16_ONLY and dtype != "float16":
        pytest.skip(f"{op} has no bfloat16 half-precision form")
    x = every_value(dtype)
    params = HALF_OPS[op]
    single = half_results(op, x, params, dtype)
    row = pw.OPS[op]
    oracle = getattr(oracles, row.oracle or op)
    ref, scale = oracle(x.astype(np.float64), dtype=dtype, **dict(row.oracle_params), **params)
    judge_single(single, ref, scale, dtype, f"{op} {dtype}, every input")


FITS = (np.float64, np.float32)  # the fits' evaluations: exact enough, and as the kernel runs them


def _horner(coef, x: np.ndarray, square: bool) -> np.ndarray:
    """The polynomial with coefficients `coef` at x (at x^2: `square`), by Horner's rule in x's dtype."""
    t = x * x if square else x
    p = np.zeros_like(x)
    for c in reversed(coef):
        p = p * t + x.dtype.type(c)
    return p


def test_the_erfc_fit_keeps_its_bound():
    """erf's and gelu's erfc past 1/4 is 2^Q, Q fitted to log2 erfc on [1/4, 4] (`pw.ERFC_Q`): within 2^-24.9 of
    mpmath's erfc evaluated in float64, 2^-23.4 in float32 as the kernel's Horner rule runs it, on 4001 points."""
    import mpmath

    xs = np.linspace(0.25, 4.0, 4001)
    ref = np.array([float(mpmath.erfc(float(x))) for x in xs])
    err = {d: np.abs(np.exp2(_horner(pw.ERFC_Q.value, xs.astype(d), False).astype(float)) - ref).max() for d in FITS}
    assert err[np.float64] <= 2.0**-24.9 and err[np.float32] <= 2.0**-23.4, {d: np.log2(e) for d, e in err.items()}


def test_the_tan_fit_keeps_its_bound():
    """float16 tan's tan r = r P(r^2) on |r| <= pi/4 + 2^-8 (`pw.TAN_P`): within 2^-21.9 of mpmath's tan relative,
    P evaluated in float64, 2^-21.2 in float32 as the kernel runs it (r^2, Horner, r P), on 4001 points."""
    import mpmath

    r = np.linspace(2.0**-12, np.pi / 4 + 2.0**-8, 4001)
    ref = np.array([float(mpmath.tan(float(v))) for v in r])
    err = {}
    for d in FITS:
        x = r.astype(d)
        err[d] = (np.abs((x * _horner(pw.TAN_P.value, x, True)).astype(float) - ref) / ref).max()
    assert err[np.float64] <= 2.0**-21.9 and err[np.float32] <= 2.0**-21.2, {d: np.log2(e) for d, e in err.items()}


def judge_single(single: np.ndarray, ref: np.ndarray, scale: np.ndarray, dtype: str, what: str) -> None:
    """The float32 results rounded to `dtype` pass the oracle at the device file's tolerance, and before that rounding
    lie within MARGIN of it: the rest is the room the GPU's approximate instructions take (a few float32 ulps, 2^-11
    of float16's tolerance). Results below the type's least normal are left to the verdict (its half-ulp allowance is
    then the larger one)."""
    tol = get_profile("hopper").tolerance(dtype)
    verdict = compare(rounded(single, dtype), ref, scale, dt.get_dtype(dtype), tol, context=what)
    assert verdict.ok, verdict.report
    judged = np.isfinite(ref) & (scale > 0) & (np.abs(ref) >= MIN_NORMAL[dtype])
    with np.errstate(invalid="ignore", over="ignore"):
        share = np.abs(single[judged].astype(np.float64) - ref[judged]) / (tol * scale[judged])
    worst = float(share.max()) if share.size else 0.0
    assert worst <= MARGIN, f"{what}: {worst:.3g} of the tolerance before the rounding"


# the second operands a binary op is tried at, with every 16-bit first operand: special values, small and large
# integers (pow's odd and even exponents), fractions, and values that overflow or underflow a 16-bit result
SECOND = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 0.1, 1.5, 7.0, 7.5, -11.0, 100.0, -100.0, 1e-4]
SECOND += [float("inf"), float("-inf"), float("nan")]
BINARY_OPS = {
    "pow": ("float16", "bfloat16"),
    "hypot": ("float16",),
    "atan2": ("float16",),
    "fmod": ("float16",),
    "remainder": ("float16",),
}


@pytest.mark.skipif(select().name != "interpreter", reason="the emulated half path runs under the interpreter")
@pytest.mark.parametrize("op, dtype", [(op, d) for op, ds in BINARY_OPS.items() for d in ds])
def test_half_binary_helpers_over_every_first_operand(op, dtype):
    """Every 16-bit x against each of SECOND (rounded to the type) as y, and y against every x the other way."""
    base = every_value(dtype)
    ys = rounded(np.float32(SECOND), dtype).astype(np.float32)
    x = np.concatenate([np.tile(base, ys.size), np.repeat(ys, base.size)]).astype(np.float32)
    y = np.concatenate([np.repeat(ys, base.size), np.tile(base, ys.size)]).astype(np.float32)
    single = half_results(op, x, {}, dtype, y)
    ref, scale = getattr(oracles, op)(x.astype(np.float64), y.astype(np.float64), dtype=dtype)
    judge_single(single, ref, scale, dtype, f"{op} {dtype}")


# Python scalars below float32's least normal: a scalar operand keeps float32 (torch's opmath), where the half forms'
# ftz instructions (lg2.approx.ftz, rcp.approx.ftz) would read it as 0; the interpreter's stand-ins flush as they do
TINY_SCALARS = [1e-40, -1e-40, 2.0**-149, -(2.0**-149), 1e-38, -1e-38]


@pytest.mark.skipif(select().name != "interpreter", reason="the emulated half path runs under the interpreter")
@pytest.mark.parametrize("op, dtype", [(op, d) for op, ds in BINARY_OPS.items() for d in ds])
def test_half_binary_helpers_with_a_scalar_below_float32s_normals(op, dtype):
    """Bug: pow(1e-40, x) gave 0 (lg2.approx.ftz read the base as 0), atan2(0, 1e-40) and fmod(0, 1e-40) NaN
    (rcp.approx.ftz of the divisor was infinite). Every 16-bit value against each tiny scalar, both ways."""
    base = every_value(dtype)
    tiny = np.float32(TINY_SCALARS)
    x = np.concatenate([np.tile(base, tiny.size), np.repeat(tiny, base.size)]).astype(np.float32)
    y = np.concatenate([np.repeat(tiny, base.size), np.tile(base, tiny.size)]).astype(np.float32)
    single = half_results(op, x, {}, dtype, y)
    ref, scale = getattr(oracles, op)(x.astype(np.float64), y.astype(np.float64), dtype=dtype)
    judge_single(single, ref, scale, dtype, f"{op} {dtype}, a scalar below float32's normals")


def _half_paths(items):
    """(In the cross-compiling subprocess.) Each (op, dtypes): the libdevice functions its compiled TTIR calls."""
    from nbxcert.kernels.backends import cross

    for name, dtypes in items:
        spec = pw.SPECS[name]
        inputs = spec.make_inputs(spec.example_problems[0], tuple(dtypes), 0, "cpu")
        with cross.recording() as launched:
            spec.launch(pw.DEFAULT, inputs)
        compiled = launched[0].compiled
        yield {
            "op": name,
            "dtypes": dtypes,
            "calls": sorted(set(re.findall(r"__nv_\w+", compiled.asm["ttir"]))),
            "ex2": sorted(set(re.findall(r"ex2\.approx[.\w]*", compiled.asm["ptx"]))),
            "rcp": sorted(set(re.findall(r"rcp\.approx[.\w]*", compiled.asm["ptx"]))),
            "lg2": sorted(set(re.findall(r"lg2\.approx[.\w]*", compiled.asm["ptx"]))),
            "rsqrt": sorted(set(re.findall(r"rsqrt\.approx[.\w]*", compiled.asm["ptx"]))),
        }


def test_16_bit_results_compile_for_sm90_with_the_half_forms():
    """Cross-compiled for sm_90: 16-bit results take the fast instructions, written in (ex2.approx, rcp.approx,
    lg2.approx and rsqrt.approx, with ftz where no subnormal reaches them) and call no CUDA function, or none at all,
    where float32 results call CUDA's accurate functions; bfloat16's sin and atan2 keep CUDA's; round calls rint."""
    import crosstools

    items = [
        ("log", ("float16", "float16")),
        ("log", ("bfloat16", "bfloat16")),
        ("log", ("float32", "float32")),
        ("sin", ("float16", "float16")),
        ("sin", ("bfloat16", "bfloat16")),
        ("softplus", ("bfloat16", "bfloat16")),
        ("rsqrt", ("bfloat16", "bfloat16")),
        ("hypot", ("float16", "float16", "float16")),
        ("round", ("float32", "float32")),
        ("erf", ("float16", "float16")),
        ("erf", ("float32", "float32")),
        ("atan2", ("float16", "float16", "float16")),
        ("atan2", ("bfloat16", "bfloat16", "bfloat16")),
        ("exp", ("float16", "float16")),
        ("exp", ("bfloat16", "bfloat16")),
        ("sigmoid", ("float16", "float16")),
    ]
    rows = crosstools.cross_compile(90, _half_paths, items, 600)
    got = {(r["op"], tuple(r["dtypes"])): r["calls"] for r in rows}
    ex2 = {(r["op"], tuple(r["dtypes"])): r["ex2"] for r in rows}
    # float16 results take ex2.approx.ftz (float32's subnormals round to 0 in float16); bfloat16 keeps them
    assert ex2[("exp", ("float16", "float16"))] == ["ex2.approx.ftz.f32"]
    assert ex2[("sigmoid", ("float16", "float16"))] == ["ex2.approx.ftz.f32"]
    assert ex2[("exp", ("bfloat16", "bfloat16"))] == ["ex2.approx.f32"]
    rcp = {(r["op"], tuple(r["dtypes"])): r["rcp"] for r in rows}
    assert rcp[("sigmoid", ("float16", "float16"))] == ["rcp.approx.ftz.f32"]  # `_p_div`
    assert rcp[("atan2", ("float16", "float16", "float16"))] == ["rcp.approx.ftz.f32"]
    lg2 = {(r["op"], tuple(r["dtypes"])): r["lg2"] for r in rows}
    rsqrt = {(r["op"], tuple(r["dtypes"])): r["rsqrt"] for r in rows}
    # lg2.approx.ftz: float16's values are float32 normals, and bfloat16's subnormals are scaled first
    assert got[("log", ("float16", "float16"))] == [] and lg2[("log", ("float16", "float16"))] == ["lg2.approx.ftz.f32"]
    assert got[("log", ("bfloat16", "bfloat16"))] == []
    assert lg2[("log", ("bfloat16", "bfloat16"))] == ["lg2.approx.ftz.f32"]
    assert got[("log", ("float32", "float32"))] == ["__nv_logf"]
    assert got[("sin", ("float16", "float16"))] == ["__nv_rintf"]  # the reduction's quadrant, and no sine call
    assert got[("sin", ("bfloat16", "bfloat16"))] == ["__nv_sinf"]
    assert got[("softplus", ("bfloat16", "bfloat16"))] == []
    assert lg2[("softplus", ("bfloat16", "bfloat16"))] == ["lg2.approx.ftz.f32"]
    assert got[("rsqrt", ("bfloat16", "bfloat16"))] == []
    assert rsqrt[("rsqrt", ("bfloat16", "bfloat16"))] == ["rsqrt.approx.ftz.f32"]
    assert got[("hypot", ("float16", "float16", "float16"))] == []
    assert got[("round", ("float32", "float32"))] == ["__nv_rintf"]
    assert got[("erf", ("float16", "float16"))] == []  # a series and 2^Q: no erff, no division
    assert got[("erf", ("float32", "float32"))] == ["__nv_erf"]  # float32 results compute in float64 (see OPS)
    assert got[("atan2", ("float16", "float16", "float16"))] == []  # one rcp.approx, no atan2f
    assert got[("atan2", ("bfloat16", "bfloat16", "bfloat16"))] == ["__nv_atan2f"]


def test_the_half_level_is_set_for_16_bit_results_on_nvidia_targets_only():
    """math_level: 0 under the interpreter; on a GPU HALF_MATH for a float32 computation of a 16-bit common dtype into
    a 16-bit output on an NVIDIA target, else 1 (the accurate library)."""
    plan = pw.Plan("exp", ("float16",) * 3, "float32", (None, None, None), (0, 0, 0), True)
    plan32 = pw.Plan("exp", ("float32",) * 3, "float32", (None, None, None), (0, 0, 0), True)
    half, single = empty((4,), "float16"), empty((4,), "float32")
    if select().name == "interpreter":
        assert pw.math_level(plan, half) == 0
        return
    expected = pw.HALF_MATH.value if pw._nvidia() else 1
    assert pw.math_level(plan, half) == expected
    assert pw.math_level(plan, single) == 1  # a float16 computation written to float32 is judged at float32's
    assert pw.math_level(plan32, single) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(HALF_OPS) + sorted(BINARY_OPS))
def test_served_half_ops_over_every_16_bit_input_on_the_gpu(op, dtype):
    """On the GPU: the op served (its approximate instructions) over every input (a binary op: every first operand
    against each of SECOND and back), judged as certification judges."""
    if select().name == "interpreter":
        pytest.skip("needs a GPU")
    from nbxcert import ops

    base = every_value(dtype)
    if op in BINARY_OPS:
        ys = rounded(np.float32(SECOND), dtype)
        x = np.concatenate([np.tile(base, ys.size), np.repeat(ys, base.size)])
        y = np.concatenate([np.repeat(ys, base.size), np.tile(base, ys.size)])
        got = getattr(ops, op)(from_numpy(x.astype(np.float64), dtype), from_numpy(y.astype(np.float64), dtype))
        ref, scale = getattr(oracles, op)(x.astype(np.float64), y.astype(np.float64), dtype=dtype)
    else:
        x = base.astype(np.float64)
        params = HALF_OPS[op]
        name = "gelu" if op == "gelu_tanh" else op
        kwargs = {"approximate": "tanh"} if op == "gelu_tanh" else dict(params)
        got = getattr(ops, name)(from_numpy(x, dtype), **kwargs)
        row = pw.OPS[op]
        ref, scale = getattr(oracles, row.oracle or op)(x, dtype=dtype, **dict(row.oracle_params), **params)
    tol = get_profile("hopper").tolerance(dtype)
    values = got.float64()
    verdict = compare(values, ref, scale, dt.get_dtype(dtype), tol, context=f"{op} {dtype}, every input, served")
    report = os.environ.get("NBXCERT_HALF_REPORT")  # gpu_pointwise.sh keeps each op's worst errors
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({"op": op, "dtype": dtype, "ok": verdict.ok, **verdict.as_dict()}) + "\n")
    assert verdict.ok, verdict.report
