"""`compare` judges big outputs in chunks on threads (a sweep judges every candidate of a key against one reference):
the chunked verdict must equal the plain whole-array definition, element for element, on every kind of value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbxcert.kernels import compare as cmp
from nbxcert.kernels.dtypes import get_dtype, rounding_bound


def plain_verdict(out, ref, scale, dtype, tol):
    """The definition in the module docstring, written out on whole arrays (the pre-chunking implementation)."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    scale = np.broadcast_to(np.asarray(scale, np.float64), ref.shape)
    finite_ref = np.isfinite(ref)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        abs_err = np.abs(out - ref)
        allowed = tol * np.abs(scale) + rounding_bound(ref, dtype) if dtype.is_float else np.zeros(ref.shape)
        bad = finite_ref & ~np.isfinite(out)
        bad |= finite_ref & np.isfinite(out) & (abs_err > allowed)
        bad |= ~finite_ref & ~((np.isnan(ref) & np.isnan(out)) | (np.isinf(ref) & (out == ref)))
        fin = finite_ref & np.isfinite(out)
        max_abs = cmp._finite_max(np.where(fin, abs_err, np.nan))
        max_rel = cmp._finite_max(np.where(fin & (ref != 0), abs_err / np.abs(np.where(ref == 0, 1, ref)), np.nan))
        scaled = np.where(fin, abs_err / np.where(allowed > 0, allowed, np.inf), np.nan)
        scaled = np.where(fin & (allowed == 0) & (abs_err > 0), np.inf, scaled)
    max_scaled = float(np.nanmax(scaled)) if np.any(fin) else 0.0
    if np.any(bad & ~fin):
        max_scaled = float("inf")
    return int(bad.sum()), max_abs, max_rel, max_scaled


SPECIAL = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-8, 65504.0])


@st.composite
def cases(draw):
    n = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = np.random.default_rng(seed)
    ref = gen.standard_normal(n)
    out = ref + gen.standard_normal(n) * draw(st.sampled_from([0.0, 1e-4, 1e-2, 1.0]))
    for arr in (ref, out):
        for _ in range(draw(st.integers(0, 4))):
            arr[draw(st.integers(0, n - 1))] = draw(SPECIAL)
    if draw(st.booleans()):
        out[: n // 2] = ref[: n // 2]
    scale = np.abs(gen.standard_normal(n)) * draw(st.sampled_from([0.0, 1.0]))
    dtype = get_dtype(draw(st.sampled_from(["float16", "bfloat16", "float32", "int32"])))
    if not dtype.is_float:
        ref, out = (np.round(np.clip(np.nan_to_num(a), -1e6, 1e6) * 10) for a in (ref, out))
    return out, ref, scale, dtype, draw(st.sampled_from([0.0, 1e-3, 1e-2]))


@settings(max_examples=150, deadline=None)
@given(cases(), st.sampled_from([7, 64, 1 << 20]))
def test_chunked_verdict_equals_the_definition(case, chunk):
    out, ref, scale, dtype, tol = case
    original = cmp.CHUNK
    cmp.CHUNK = chunk  # small chunks make the threaded path run on small arrays
    try:
        v = cmp.compare(out, ref, scale, dtype, tol, "ctx")
    finally:
        cmp.CHUNK = original
    n_bad, max_abs, max_rel, max_scaled = plain_verdict(out, ref, scale, dtype, tol)
    assert v.n_mismatched == n_bad
    assert v.ok == (n_bad == 0)
    assert (v.max_abs, v.max_rel) == pytest.approx((max_abs, max_rel), rel=0, abs=0)
    assert v.max_scaled == max_scaled or (np.isnan(v.max_scaled) and np.isnan(max_scaled))
    if not v.ok:
        assert f"Mismatched elements: {n_bad} / {ref.size}" in v.report


def test_a_judge_is_reused_across_outputs():
    ref = np.linspace(-3, 3, 5000)
    judge = cmp.Judge(ref, np.abs(ref) + 1, get_dtype("float16"), 1e-3)
    assert judge.verdict(ref.copy()).ok
    wrong = ref.copy()
    wrong[4321] += 1.0
    v = judge.verdict(wrong, "kernel k")
    assert not v.ok and v.n_mismatched == 1 and "(4321,)" in v.report
    assert judge.verdict(ref.copy()).ok  # the judge kept no state from the failed verdict


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int32"])
def test_judging_a_tensor_widens_it_exactly_as_float64_does(dtype):
    from nbxcert.kernels.tensor import from_numpy

    gen = np.random.default_rng(3)
    values = np.round(gen.standard_normal((37, 29)) * 40)
    values[3, 4], values[5, 6] = np.inf, np.nan
    if dtype == "int32":
        values = np.nan_to_num(values, posinf=7.0)
    t = from_numpy(values, get_dtype(dtype))
    original = cmp.CHUNK
    cmp.CHUNK = 64
    try:
        judge = cmp.Judge(t.float64() + 0.5, np.ones(values.shape), get_dtype(dtype), 1e-3)
        assert judge.verdict_of(t, "c") == judge.verdict(t.float64(), "c")
    finally:
        cmp.CHUNK = original
