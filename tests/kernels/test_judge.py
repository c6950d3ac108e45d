"""The device-side judge (`nbxcert.kernels.judge`) gives the host's verdict: same pass/fail, same mismatch count and
report (a failing output is reported by the host), same largest errors. Run here under Triton's interpreter; the GPU
runs the same kernel in every sweep."""

from __future__ import annotations

import numpy as np
import pytest

from nbxcert.kernels import judge as device_judge
from nbxcert.kernels.compare import Judge
from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.tensor import from_numpy


@pytest.fixture(scope="module")
def interpreted(backend):
    if backend.name != "interpreter":
        pytest.skip("checks the kernel's answers against the host's under the interpreter")
    return backend


CASES = [
    (dtype, noise, special, n)
    for dtype in ("float16", "bfloat16", "float32")
    for noise in (0.0, 1e-4, 0.3)
    for special in ("none", "nan", "inf")
    for n in (1, 2047, 5000)
]


def _case(device, dtype, noise, special, n):
    gen = np.random.default_rng(n + int(noise * 1e4))
    dt = get_dtype(dtype)
    ref = gen.standard_normal(n) * 3.0
    ref[: n // 7] = 0.0  # references of 0: excluded from the relative error
    out = from_numpy(ref + gen.standard_normal(n) * noise, dt, device)  # rounded into the dtype once
    if special != "none":
        bits = out.numpy()
        bits[n // 2] = (
            np.array(np.nan if special == "nan" else -np.inf).astype(np.float32).view(np.uint32) >> 16
            if dtype == "bfloat16"
            else (np.nan if special == "nan" else -np.inf)
        )
        out = from_numpy(bits, dt, device) if dtype != "bfloat16" else _bf16(bits, device)
    host = Judge(ref, np.abs(ref) + 0.5, dt, 2.0**-10)
    assert device_judge.usable(host, out)
    got = device_judge.DeviceJudge(host, device).verdict_of(out, "ctx")
    assert got == host.verdict_of(out, "ctx")


@pytest.mark.parametrize("dtype,noise,special,n", CASES)
def test_the_device_verdict_is_the_hosts(interpreted, dtype, noise, special, n):
    _case(interpreted.device, dtype, noise, special, n)


@pytest.mark.gpu
def test_on_the_gpu_the_device_verdict_is_the_hosts(backend):
    """The same cases, those of special values and exact results, views in rows and permuted outputs, with the kernel
    compiled for and run on the GPU (float64 division and comparisons there)."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    for case in CASES:
        _case(backend.device, *case)
    for case in SPECIAL_CASES:
        _special_case(backend.device, *case)
    for dtype in ("float16", "bfloat16", "float32"):
        for noise in (0.0, 0.3):
            _rows_case(backend.device, dtype, noise)
    for dtype in ("float16", "bfloat16", "float32", "int32", "bool"):
        for wrong in (False, True):
            _permuted_case(backend.device, dtype, wrong)


def _bf16(bits, device):
    from nbxcert.kernels.tensor import from_bits

    return from_bits(bits.astype(np.uint16), "bfloat16", device)


def test_what_the_device_does_not_judge_is_judged_on_the_host(interpreted):
    dev = interpreted.device
    ref = np.linspace(-1, 1, 64)
    # every other element of every other row: neither contiguous rows nor one stride between its elements
    gapped = from_numpy(np.zeros((16, 16)), "float16", dev)[::2, ::2]
    assert not device_judge.usable(Judge(ref.reshape(8, 8), np.ones((8, 8)), get_dtype("float16"), 1e-3), gapped)
    fp8 = get_dtype("float8_e4m3fn")
    assert not device_judge.usable(Judge(ref, np.ones(64), fp8, 1e-1), from_numpy(ref, fp8, dev))
    assert not device_judge.usable(Judge(ref, np.ones(64), get_dtype("float16"), 1e-3), from_numpy(ref, "float32", dev))


# What the device judged on the host only before: a reference with NaN and infinities (the pointwise ops' special
# values), exact results (an allowed error of 0: integer and bool outputs, and float ones such as floor's), float64.
SPECIAL_CASES = [
    (dtype, case, n)
    for dtype in ("float16", "bfloat16", "float32", "float64")
    for case in ("ref_specials", "ref_specials_missed", "ref_nan_as_inf", "exact", "exact_missed", "overflowed_rel")
    for n in (7, 2049)
] + [
    (dtype, case, n)
    for dtype in ("int8", "uint8", "int16", "int32", "int64", "bool")
    for case in ("exact", "exact_missed")
    for n in (7, 2049)
]


def _special_case(device, dtype, case, n):
    gen = np.random.default_rng(n)
    dt = get_dtype(dtype)
    if not dt.is_float:
        if dtype == "bool":
            ref = (gen.standard_normal(n) > 0).astype(np.float64)
        else:
            info = np.iinfo(dt.storage)
            ref = gen.integers(info.min, info.max, n, endpoint=True, dtype=dt.storage).astype(np.float64)
        values = ref.copy()
        if case == "exact_missed":
            values[n // 2] = 0.0 if values[n // 2] != 0 else 1.0
        out = from_numpy(values.astype(dt.storage), dt, device)
        host = Judge(ref, np.ones(n), dt, 0.0)
    else:
        ref = gen.standard_normal(n) * 3.0
        ref[: n // 5] = 0.0
        scale = np.abs(ref) + 0.5
        tol = 2.0**-10
        if case.startswith("ref_"):
            ref[1], ref[2], ref[3] = np.nan, np.inf, -np.inf
        if case == "overflowed_rel":
            ref[4] = (
                5e-324  # the least subnormal reference: err / |ref| overflows to inf (left out of the finite maxima)
            )
            ref[5] = np.nan
        if case.startswith("exact"):
            ref = np.round(ref)
            tol = 0.0
            scale = np.zeros(n)
        out_values = from_numpy(ref, dt, "cpu").numpy()  # the reference rounded into the dtype (NaN, inf kept)
        out_values = out_values.astype(np.float64) if dtype != "bfloat16" else None
        if dtype == "bfloat16":
            out = from_numpy(ref, dt, device)
        else:
            if case == "ref_specials_missed":
                out_values[2] = -np.inf  # the other infinity
            if case == "ref_nan_as_inf":
                out_values[1] = np.inf
            if case == "exact_missed":
                out_values[n // 2] += 1.0
            if case == "overflowed_rel":
                out_values[4] = 2.0**-11  # within the allowed error there, 2^-10 and the rounding bound
            out = from_numpy(out_values, dt, device)
        host = Judge(ref, scale, dt, tol)
        if case == "overflowed_rel":
            host = Judge(ref, np.where(np.arange(n) == 4, 1.0, scale), dt, tol)
    assert device_judge.usable(host, out)
    on_device = device_judge.DeviceJudge(host, device)
    fell_back = []
    on_device.judge = _Counting(host, fell_back)
    got = on_device.verdict_of(out, "ctx")
    want = host.verdict_of(out, "ctx")
    assert got == want, (got, want)
    # a passing output is judged on the device alone (the host only reports a failing one)
    assert bool(fell_back) is not want.ok
    return want


class _Counting:
    """The host judge a `DeviceJudge` falls back to, counting the times it does."""

    def __init__(self, judge, calls):
        self._judge, self._calls = judge, calls

    def __getattr__(self, name):
        return getattr(self._judge, name)

    def verdict_of(self, *args):
        self._calls.append(args)
        return self._judge.verdict_of(*args)


@pytest.mark.parametrize("dtype,case,n", SPECIAL_CASES)
def test_the_device_verdict_is_the_hosts_for_specials_and_exact_results(interpreted, dtype, case, n):
    want = _special_case(interpreted.device, dtype, case, n)
    missed = case.endswith("_missed") or case == "ref_nan_as_inf"
    assert want.ok is not (missed and dtype != "bfloat16")  # the cases test a pass and a failure each


def test_a_sweep_on_the_device_path_finds_the_same_verdicts(interpreted):
    """`prepare(on_device=True)` routes every check through the device judge: a correct and a wrong candidate of the
    faulty fixture keep their verdicts."""
    import sys
    from pathlib import Path

    from nbxcert.kernels.check import prepare, run_prepared
    from nbxcert.profiles import get_profile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    import faulty_kernels

    spec = faulty_kernels.SPEC
    prepared = prepare(spec, {"n": 3000}, ("float32",), get_profile("interpreter"), 2, interpreted.device, True)
    right, wrong = (next(c for c in spec.candidates if c["FAULT"] == f) for f in (0, 2))
    assert all(v.ok for v in run_prepared(prepared, right).values())
    assert prepared.device_judges, "the output was judged on the device"
    verdicts = run_prepared(prepared, wrong)
    assert [v.n_mismatched for v in verdicts.values()] == [3000]
    assert "Mismatched elements: 3000 / 3000" in next(iter(verdicts.values())).report


def test_rows_of_a_layout():
    """(run, row stride) of the layouts the device judges: contiguous, and rows of contiguous elements."""
    t = from_numpy(np.zeros((6, 4, 5)), "float16", "cpu")
    assert device_judge.rows_of(t) == (120, 120)
    assert device_judge.rows_of(t[:, :2, :]) == (10, 20)  # rows of 2 x 5 elements, 20 apart
    assert device_judge.rows_of(t[::2]) == (20, 40)
    assert device_judge.rows_of(t[:, :, :3]) == (3, 5)  # runs of 3, 5 apart, and 4 x 5 apart: one row stride
    assert device_judge.rows_of(t[:, :2, :3]) is None  # runs of 3, 5 apart, then 20: not one row stride
    assert device_judge.rows_of(t[:1, :1, :3]) == (3, 3)  # dimensions of 1 do not count
    assert device_judge.rows_of(from_numpy(np.zeros((4, 4)), "float16", "cpu").T) is None  # read in its own order
    nhwc = from_numpy(np.zeros((2, 3, 4, 5)), "float16", "cpu").permute(0, 3, 1, 2)  # N, C, H, W over N, H, W, C
    assert device_judge.storage_order(nhwc) == (0, 2, 3, 1)
    assert device_judge.rows_of(device_judge._in_order(nhwc, (0, 2, 3, 1))) == (120, 120)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int32", "bool"])
@pytest.mark.parametrize("wrong", [False, True])
def test_a_permuted_output_is_judged_in_its_storage_order(interpreted, dtype, wrong):
    """A channels-last output (conv2d's, group_norm's) and a transposed one: read as they lie, against the reference
    permuted alike, with the host's verdict; a wrong element is found (and reported by the host)."""
    _permuted_case(interpreted.device, dtype, wrong)


def _permuted_case(dev, dtype, wrong):
    gen = np.random.default_rng(5)
    dt = get_dtype(dtype)
    for stored, order in (((2, 3, 4, 5), (0, 3, 1, 2)), ((6, 7), (1, 0))):
        values = gen.standard_normal(stored) * 4
        if not dt.is_float:
            values = np.round(values) if dtype != "bool" else (values > 0).astype(np.float64)
        ref = np.transpose(values, order)  # what the output should hold, in its own (logical) order
        out_values = values.copy()
        if wrong:
            out_values.reshape(-1)[7] = (
                1.0 - out_values.reshape(-1)[7] if dtype == "bool" else out_values.reshape(-1)[7] + 8
            )
        out = from_numpy(out_values, dt, dev).permute(*order)
        assert tuple(out.shape) == ref.shape and not out.is_contiguous()
        host = Judge(ref, np.abs(ref) + 0.5, dt, 2.0**-8 if dt.is_float else 0.0)
        assert device_judge.usable(host, out)
        on_device = device_judge.DeviceJudge(host, dev)
        fell_back = []
        on_device.judge = _Counting(host, fell_back)
        got, want = on_device.verdict_of(out, "ctx"), host.verdict_of(out, "ctx")
        assert got == want and want.ok is not wrong and bool(fell_back) is wrong


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_a_view_in_rows_is_judged_on_the_device_as_the_host_judges_it(interpreted, dtype, noise):
    """rope's q and k lie in a fused qkv buffer: rows of heads x dim elements, a row of q, k and v apart."""
    _rows_case(interpreted.device, dtype, noise)


def _rows_case(dev, dtype, noise):
    gen = np.random.default_rng(3)
    dt = get_dtype(dtype)
    ref = gen.standard_normal((7, 5, 80))
    fused = np.concatenate([ref + gen.standard_normal(ref.shape) * noise, gen.standard_normal((7, 2, 80))], axis=1)
    q = from_numpy(fused, dt, dev)[:, :5, :]
    assert device_judge.rows_of(q) == (400, 560)
    host = Judge(ref, np.abs(ref) + 0.5, dt, 2.0**-8)
    on_device = device_judge.DeviceJudge(host, dev)
    fell_back = []
    on_device.judge = _Counting(host, fell_back)
    got, want = on_device.verdict_of(q, "ctx"), host.verdict_of(q, "ctx")
    assert got == want and bool(fell_back) is not want.ok
    assert want.ok is (noise == 0.0)


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["first", "every"])
def test_every_spec_is_judged_on_the_device_as_on_the_host(interpreted, monkeypatch, every):
    """Each registered kernel's first example problem at its first dtypes (every example at every dtype under `-m
    slow`), prepared for the device judge and for the host's: the default config's verdicts agree, the device judged
    at least one output of each (pointwise ops with NaN and infinities among their values, exact integer and bool
    results, rope's q and k in a fused buffer), and an output it judged passing never went to the host (a misread
    view would fail on the device and pass there)."""
    from nbxcert.kernels.check import prepare, run_prepared
    from nbxcert.kernels.spec import load_all
    from nbxcert.profiles import get_profile

    asked = []
    host_verdict = Judge.verdict_of
    monkeypatch.setattr(Judge, "verdict_of", lambda self, *a: asked.append(id(self)) or host_verdict(self, *a))
    profile = get_profile("cpu/interpreter")
    host_only = []
    shipped = {n: s for n, s in load_all().items() if s.launch.__module__.startswith("nbxcert.kernels.")}
    assert len(shipped) > 100  # the fixtures' specs other tests register are left out, not the library's
    cases = [
        (name, spec, problem, dtypes)
        for name, spec in shipped.items()
        for problem in (spec.example_problems if every else spec.example_problems[:1])
        for dtypes in (
            (spec.interpreter_dtypes or spec.dtypes) if every else (spec.interpreter_dtypes or spec.dtypes)[:1]
        )
    ]
    for name, spec, problem, dtypes in cases:
        config = spec.default_for(problem) if spec.default_for else spec.default
        on_device = prepare(spec, problem, dtypes, profile, 1, interpreted.device, True)
        on_host = prepare(spec, problem, dtypes, profile, 1, interpreted.device, False)
        asked.clear()
        verdicts = run_prepared(on_device, config)
        assert verdicts == run_prepared(on_host, config), name
        for out, dj in on_device.device_judges.items():
            if verdicts[out].ok:
                assert id(dj.judge) not in asked, f"{name}: output {out} passed on the host only"
        if not on_device.device_judges:
            host_only.append(name)
    assert host_only == [], host_only
