"""Floor division of float32 and float64 on the GPU (`pointwise._floor_div_float`): floor(x / y) corrected by the sign
of the exact remainder below a 2^29 quotient, torch's formula elsewhere. Under the interpreter the GPU path runs with
DM = EMULATED + 1 (the interpreter's fma is exact, as the GPU's), and must give the bits the formula gives and the
oracle's values, over quotients at and next to integers (where the correction decides), every binade of a wide range,
and the special values; on the GPU the op is served over the same operands."""

from __future__ import annotations

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

SPECIAL = [0.0, -0.0, 1.0, -1.0, 3.0, -3.0, np.inf, -np.inf, np.nan, 1e-45, 2.0**-149, 3e38, 2.0**29, 2.0**29 + 64]


def operands(dtype: str, n: int = 1 << 15, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of `dtype`'s values as float64: a quarter with x the nearest `dtype` value to k y or the next one either
    way (quotients at and beside an integer k), the rest of both over 2^-40..2^40, then every pair of SPECIAL."""
    rng = np.random.default_rng(seed)
    store = np.float32 if dtype == "float32" else np.float64
    scale = np.exp2(rng.integers(-40, 40, (2, n)))
    x, y = (rng.standard_normal((2, n)) * scale).astype(store)
    k = rng.integers(-(1 << 20), 1 << 20, n // 4).astype(store)
    near = (k * y[: n // 4]).astype(store)
    step = rng.integers(-1, 2, n // 4)
    near = np.where(
        step > 0, np.nextafter(near, store(np.inf)), np.where(step < 0, np.nextafter(near, store(-np.inf)), near)
    )
    x[: n // 4] = near
    a, b = np.meshgrid(np.array(SPECIAL, store), np.array(SPECIAL, store))
    return np.concatenate([x, a.ravel()]).astype(np.float64), np.concatenate([y, b.ravel()]).astype(np.float64)


@jit
def _floor_div_kernel(x_ptr, y_ptr, out_ptr, n, DM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=1.0)
    y = tl.load(y_ptr + offs, mask=ok, other=1.0)
    tl.store(out_ptr + offs, pw._b_div_floor(x, y, x, 0.0, 0.0, 0.0, offs.to(tl.int64), DM), mask=ok)


def _body(x: np.ndarray, y: np.ndarray, dm: int) -> np.ndarray:
    out = empty((x.size,), "float64")
    block = 1024
    _floor_div_kernel[(pw.cdiv(x.size, block),)](from_numpy(x), from_numpy(y), out, x.size, DM=dm, BLOCK=block)
    return out.numpy()


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


@pytest.mark.skipif(select().name != "interpreter", reason="the emulated GPU path runs under the interpreter")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_gpu_floor_division_gives_the_formulas_bits_and_the_oracles_values(dtype):
    x, y = operands(dtype)
    with np.errstate(all="ignore"):
        fast = _body(x, y, pw.EMULATED.value + 1)
        formula = _body(x, y, 0)
        ref, _scale = oracles.div(x, y, dtype="float64", rounding_mode="floor")
    same = _same_bits(fast, formula)
    assert same.all(), [(x[i], y[i], fast[i], formula[i]) for i in np.flatnonzero(~same)[:5]]
    same = _same_bits(fast, np.asarray(ref, np.float64))
    assert same.all(), [(x[i], y[i], fast[i], ref[i]) for i in np.flatnonzero(~same)[:5]]
    # the correction decided lanes here: below 2^29, float64 quotients rounded onto an integer above the exact one
    # (float32 operands' quotients, 24-bit significands over 24-bit ones, come to such an integer far more rarely)
    with np.errstate(all="ignore"):
        q = x / y
    corrected = (np.abs(q) < 2.0**29) & (q == np.floor(q)) & (fast == q - 1)
    assert dtype == "float32" or np.count_nonzero(corrected) > 100


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_served_floor_division_on_the_gpu(dtype):
    if select().name == "interpreter":
        pytest.skip("needs a GPU")
    from nbxcert import ops

    x, y = operands(dtype, n=1 << 20, seed=1)
    got = ops.div(from_numpy(x, dtype), from_numpy(y, dtype), rounding_mode="floor").float64()
    with np.errstate(all="ignore"):
        ref, scale = oracles.div(x, y, dtype=dtype, rounding_mode="floor")
    tol = get_profile("hopper").tolerance(dtype)
    verdict = compare(got, ref, scale, dt.get_dtype(dtype), tol, context=f"div floor {dtype}, served")
    assert verdict.ok, verdict.report
