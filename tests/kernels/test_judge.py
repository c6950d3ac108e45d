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
    for dtype in device_judge.KINDS
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
    """The same cases with the kernel compiled for and run on the GPU (float64 division and comparisons there)."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    for case in CASES:
        _case(backend.device, *case)


def _bf16(bits, device):
    from nbxcert.kernels.tensor import from_bits

    return from_bits(bits.astype(np.uint16), "bfloat16", device)


def test_what_the_device_does_not_judge_is_judged_on_the_host(interpreted):
    dev = interpreted.device
    ref = np.linspace(-1, 1, 64)
    assert not device_judge.usable(
        Judge(np.append(ref, np.inf), np.ones(65), get_dtype("float16"), 1e-3), from_numpy(np.zeros(65), "float16", dev)
    )
    assert not device_judge.usable(Judge(ref, np.ones(64), get_dtype("int32"), 0.0), from_numpy(ref, "int32", dev))
    wide = from_numpy(np.zeros((8, 16)), "float16", dev)
    strided = wide[:, :8]
    assert not device_judge.usable(Judge(ref.reshape(8, 8), np.ones((8, 8)), get_dtype("float16"), 1e-3), strided)


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
