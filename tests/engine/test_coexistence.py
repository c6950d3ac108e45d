"""nbxcert beside torch: after nbxcert has launched in a process that imported torch, what torch and Triton do without
nbxcert keeps working (plain Triton kernels on torch tensors and torch streams, `triton.testing.do_bench`, kernels
under `triton.autotune`, a function built by `torch.compile`), and nbxcert still never imports torch itself.

The GPU test runs the script below (written to a file: Triton reads a kernel's source) in a process of its own with
torch importable (this test process never imports torch: `conftest.py` fails a run that ends with it loaded)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    import triton
    import triton.language as tl

    from nbxcert.kernels import rows
    from nbxcert.kernels.inputs import randn, rng

    x, w = randn(rng(1), (16, 1024), "float16", "cuda:0"), randn(rng(2), (1024,), "float16", "cuda:0")
    first = rows.rmsnorm(x, w).numpy()  # nbxcert has launched: its driver is Triton's active one
    assert type(triton.runtime.driver.active).__name__ == "NbxcertCudaDriver"

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    n = 1 << 20
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(a)
    add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
    assert torch.equal(out, a + b), "a plain Triton kernel on torch tensors"

    side = torch.cuda.Stream()
    slow = torch.empty(1 << 26, device="cuda")
    with torch.cuda.stream(side):
        slow.normal_()  # long work queued first on torch's side stream
        on_side = torch.empty_like(a)
        add_kernel[(triton.cdiv(n, 1024),)](a, b, on_side, n, BLOCK=1024)  # launched on torch's current stream
    side.synchronize()
    assert torch.equal(on_side, a + b), "a Triton kernel under torch.cuda.stream"

    ms = triton.testing.do_bench(lambda: add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024))
    assert 0 < ms < 100, ms

    @triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2), triton.Config({"BLOCK": 1024}, num_warps=4)],
                     key=["n"])
    @triton.jit
    def add_tuned(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    tuned = torch.empty_like(a)
    add_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](a, b, tuned, n)
    assert torch.equal(tuned, a + b) and add_tuned.best_config is not None, "a kernel under triton.autotune"

    compiled = torch.compile(lambda u, v: torch.sin(u) * v + 1.0)
    assert torch.allclose(compiled(a, b), torch.sin(a) * b + 1.0, atol=1e-5), "a function built by torch.compile"

    again = rows.rmsnorm(x, w).numpy()
    assert np.array_equal(again.view(np.uint16), first.view(np.uint16)), "nbxcert after torch's work"
    print("coexistence: ok")
    """
)


def _torch_importable(env) -> bool:
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)"
    return subprocess.run([sys.executable, "-c", probe], env=env).returncode == 0


@pytest.mark.gpu
def test_gpu_torch_and_triton_keep_working_after_nbxcert_has_launched(backend, tmp_path):
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # torch visible to the script alone
    env["NBXCERT_UNCERTIFIED"] = "default"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    if not _torch_importable(env):
        pytest.skip("torch is not installed here (the test needs it as the other library)")
    script = tmp_path / "beside_torch.py"  # a file: Triton reads a @jit function's source from it
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "coexistence: ok" in done.stdout
