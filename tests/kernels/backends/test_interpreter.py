"""Launches through Triton's interpreter on nbxcert tensors (no GPU): the backend CI and GPU-less machines use."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import triton.language as tl

from nbxcert.kernels import tensor as T
from nbxcert.kernels.jit import jit


@jit
def _scaled_add(x_ptr, y_ptr, out_ptr, n_rows, n_cols, sx_row, sx_col, sy_row, so_row, alpha, BLOCK: tl.constexpr):
    """out[r, c] = x[r, c] * alpha + y[r, c], all strided; computed in float32 (bf16 arrives as raw bits in the
    interpreter, so the explicit upcast is what makes it correct there)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * sx_row + cols * sx_col, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + row * sy_row + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * so_row + cols, (x * alpha + y).to(out_ptr.dtype.element_ty), mask=mask)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_strided_launch_matches_float64(dtype, backend):
    if backend.name != "interpreter":
        pytest.skip("this test pins the interpreter backend; the GPU path is covered by the gpu tests")
    rng = np.random.default_rng(3)
    x = T.from_numpy(rng.standard_normal((40, 13)), dtype).T  # (13, 40), column-major view
    y = T.from_numpy(rng.standard_normal((13, 40)), dtype)
    out = T.full((13, 40), float("nan"), dtype)
    _scaled_add[(13,)](x, y, out, 13, 40, x.stride(0), x.stride(1), y.stride(0), out.stride(0), 0.5, BLOCK=64)
    want = x.float64() * 0.5 + y.float64()
    got = out.float64()
    ulp = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23}[dtype]
    assert np.all(np.abs(got - want) <= ulp * np.abs(want) + 1e-30), (dtype, np.abs(got - want).max())


def test_interpreter_selected_without_gpu_and_reported():
    code = (
        "import os; os.environ.pop('NBXCERT_BACKEND', None);"
        "from nbxcert.kernels.backends import cuda, select;"
        "c = select(); print(c.line()); assert (c.name == 'cuda') == cuda.available()[0]"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[nbxcert] backend: ")


def test_unknown_backend_is_refused_by_name():
    code = "from nbxcert.kernels.backends import select; select()"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(NBXCERT_BACKEND="tpu")
    )
    assert r.returncode != 0 and "NBXCERT_BACKEND=tpu is not a backend" in r.stderr


def test_nothing_imports_torch():
    code = (
        "import sys, nbxcert.cli, nbxcert.doctor, nbxcert.profiles, nbxcert.kernels.tensor;"
        "from nbxcert.kernels.spec import load_all; load_all();"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def _env(**extra):
    import os

    env = dict(os.environ)
    env.update(extra)
    return env
