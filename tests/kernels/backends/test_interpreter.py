"""Launches through Triton's interpreter on nbxcert tensors (no GPU): the backend CI and GPU-less machines use."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import triton.language as tl

from nbxcert.kernels import tensor as T
from nbxcert.kernels.backends import interpreter
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


# where the installed Triton's interpreter cannot run with the installed numpy (a GPU machine's Triton 3.6 beside
# numpy >= 2.3), selecting it is refused for that reason first: these tests see their own refusal only where it runs
needs_a_runnable_interpreter = pytest.mark.skipif(
    interpreter.numpy_problem() is not None, reason="this Triton's interpreter does not run with this numpy"
)


def _without(*names):
    import os

    return {k: v for k, v in os.environ.items() if k not in names}


def _refusal(call: str, env: dict) -> str:
    """What `call` (run after `import triton`, in a fresh process) says when it raises `BackendUnavailable`."""
    code = (
        "import triton\n"
        "from nbxcert.errors import BackendUnavailable\n"
        "from nbxcert.kernels.backends import cross, select\n"
        f"try:\n    {call}\nexcept BackendUnavailable as e:\n    print(e); print(e.hint)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


@needs_a_runnable_interpreter
def test_a_process_that_imported_triton_first_is_refused_in_one_line_not_patched():
    """Triton decorates its own helpers when it is first imported; nbxcert re-makes none of them. A process that
    imported Triton before choosing the interpreter is refused, naming why and what to do."""
    said = _refusal("select()", dict(_without("TRITON_INTERPRET"), NBXCERT_BACKEND="interpreter"))
    assert "Triton was imported before nbxcert chose its interpreter backend" in said and "TRITON_INTERPRET=1" in said


@needs_a_runnable_interpreter
def test_triton_imported_first_under_triton_interpret_runs_interpreted():
    code = (
        "import triton, numpy as np\n"
        "from nbxcert.kernels import rows\n"
        "from nbxcert.kernels.tensor import from_numpy\n"
        "x = from_numpy(np.ones((2, 8), np.float32), 'float32', 'cpu'); w = from_numpy(np.ones(8, np.float32), "
        "'float32', 'cpu')\n"
        "print(rows.rmsnorm(x, w, config=rows.RMSNORM.default).numpy()[0, 0])\n"
    )
    env = dict(_without(), NBXCERT_BACKEND="interpreter", TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert abs(float(r.stdout.split()[-1]) - 1.0) < 1e-5


def test_cross_compiling_refuses_a_process_whose_triton_is_interpreted():
    said = _refusal(
        "cross.activate(cross.Target('cuda', 90, 32, 'nvidia/hopper', 132))",
        dict(_without("NBXCERT_BACKEND"), TRITON_INTERPRET="1"),
    )
    assert "imported with TRITON_INTERPRET=1" in said and "cuda sm_90" in said


def test_hip_cross_compiling_is_refused_under_a_triton_that_imports_torch_for_it(monkeypatch):
    """Triton 3.6's `HIPBackend.is_within_2gb` imports torch unconditionally; nbxcert does not replace it, it refuses
    HIP targets under such a Triton (told apart by Triton 3.9's `_torch_available`)."""
    amd = pytest.importorskip("triton.backends.amd.compiler")
    from nbxcert.kernels.backends import cross

    if hasattr(amd.HIPBackend, "_torch_available"):
        assert cross.hip_needs_torch_free_triton() is None
        monkeypatch.delattr(amd.HIPBackend, "_torch_available")
    why = cross.hip_needs_torch_free_triton()
    assert why is not None and "imports torch for every tensor argument" in why and "\n" not in why
