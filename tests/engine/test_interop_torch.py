"""torch tensors in, torch tensors out, on a GPU: a served op takes torch tensors with no copy and gives torch tensors
back (made by torch's own `from_dlpack`), an `out=` comes back as the caller's object, the work goes in the order of
torch's current stream; and a Triton tutorial kernel in its usual torch form, with `triton.autotune` replaced by
`nbxcert.autotune` and nothing else changed, is served on torch tensors.

The script runs in a process of its own with torch importable (this test process never imports torch)."""

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

    import nbxcert
    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels import rows
    from nbxcert.kernels.tensor import from_dlpack

    torch.manual_seed(0)
    x = torch.randn(16, 1024, device="cuda", dtype=torch.float16)
    w = torch.rand(1024, device="cuda", dtype=torch.float16) + 0.5
    y = rows.rmsnorm(x, w, 1e-5)
    assert type(y) is torch.Tensor and y.device.type == "cuda" and y.dtype == torch.float16 and y.shape == x.shape
    native = rows.rmsnorm(from_dlpack(x), from_dlpack(w), 1e-5).numpy()
    assert np.array_equal(y.cpu().numpy().view(np.uint16), native.view(np.uint16)), "the same bits as nbxcert's own"
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w.float())
    assert torch.allclose(y.float(), ref, atol=2e-2, rtol=1e-2)
    assert from_dlpack(x).data_ptr() == x.data_ptr(), "an input is viewed, not copied"

    out = torch.empty_like(x)
    again = rows.rmsnorm(x, w, 1e-5, out=out)
    assert again is out and torch.equal(out, y), "out= comes back as the caller's object, written in place"

    a = torch.randn(64, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    prod = mm.matmul(a, b.T)
    assert type(prod) is torch.Tensor and torch.allclose(prod.float(), a.float() @ b.float().T, atol=0.1, rtol=1e-2)

    from nbxcert import ops  # torch's names over nbxcert's kernels, on torch tensors

    s = ops.add(a, a, alpha=2)
    assert type(s) is torch.Tensor and torch.equal(s, a + 2 * a)
    assert ops.to(a, torch.float32).dtype == torch.float32 and ops.to(a, torch.float16) is a
    t = ops.clone(a.T)
    assert t.stride() == a.T.clone().stride() and torch.equal(t, a.T), "preserve_format, as torch.clone"
    doubled = a.clone()
    assert ops.mul_(doubled, 2) is doubled and torch.equal(doubled, a * 2)
    # a new result laid out as torch lays it out, against torch itself (test_ops.py holds the rule's cases on the CPU)
    c = torch.randn(512, 64, device="cuda", dtype=torch.float16)
    row = torch.randn(64, device="cuda", dtype=torch.float16)
    for ours, theirs in [
        (ops.add(a.T, a.T), a.T + a.T),
        (ops.add(a.T, c), a.T + c),
        (ops.add(c, a.T), c + a.T),
        (ops.mul(a.T, 2.0), a.T * 2.0),
        (ops.add(a.T, row), a.T + row),
        (ops.neg(a.T), -a.T),
        (ops.add(a[:, ::2], a[:, ::2]), a[:, ::2] + a[:, ::2]),
    ]:
        assert ours.stride() == theirs.stride() and torch.equal(ours, theirs), (ours.stride(), theirs.stride())

    side = torch.cuda.Stream()
    late = torch.empty_like(x)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the side stream busy for a while
        late.copy_(x)  # written on the side stream after the wait
        got = rows.rmsnorm(late, w, 1e-5)  # on torch's current stream: after the copy
    side.synchronize()
    assert torch.equal(got, y), "the op ran in the order of torch's current stream"

    @nbxcert.autotune(
        configs=[triton.Config({"BLOCK_SIZE": 128}, num_warps=4), triton.Config({"BLOCK_SIZE": 1024}, num_warps=4)],
        key=["n_elements"],
    )
    @triton.jit
    def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(axis=0)
        block_start = pid * BLOCK_SIZE
        offsets = block_start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(output_ptr + offsets, x + y, mask=mask)

    def add(x: torch.Tensor, y: torch.Tensor):
        output = torch.empty_like(x)
        n_elements = output.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        add_kernel[grid](x, y, output, n_elements)
        return output

    u, v = torch.rand(98432, device="cuda"), torch.rand(98432, device="cuda")
    assert torch.equal(add(u, v), u + v) and add_kernel.best_config is not None, "the tutorial kernel, served"
    assert torch.equal(add(u, v), u + v)
    assert "torch" in sys.modules
    print("interop: ok", add_kernel.best_config)
    """
)


@pytest.mark.gpu
def test_gpu_served_ops_take_and_give_torch_tensors(backend, tmp_path):
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # torch visible to the script alone
    env.update(NBXCERT_UNCERTIFIED="sweep", NBXCERT_CERTIFIED_ONLY="0", NBXCERT_CACHE_DIR=str(tmp_path / "cache"))
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)"
    if subprocess.run([sys.executable, "-c", probe], env=env).returncode:
        pytest.skip("torch is not installed here (the test needs it as the caller's library)")
    script = tmp_path / "torch_caller.py"  # a file: Triton reads a @jit function's source from it
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "interop: ok" in done.stdout


TUTORIAL = textwrap.dedent(
    '''
    """Triton's vector-addition tutorial in its usual torch form, triton.autotune replaced by nbxcert.autotune."""
    import torch
    import triton
    import triton.language as tl

    import nbxcert

    DEVICE = triton.runtime.driver.active.get_active_torch_device()


    @nbxcert.autotune(
        configs=[
            triton.Config({"BLOCK_SIZE": 256}, num_warps=2),
            triton.Config({"BLOCK_SIZE": 1024}, num_warps=4),
            triton.Config({"BLOCK_SIZE": 2048}, num_warps=8),
        ],
        key=["n_elements"],
    )
    @triton.jit
    def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(axis=0)
        block_start = pid * BLOCK_SIZE
        offsets = block_start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        output = x + y
        tl.store(output_ptr + offsets, output, mask=mask)


    def add(x: torch.Tensor, y: torch.Tensor):
        output = torch.empty_like(x)
        assert x.device == DEVICE and y.device == DEVICE and output.device == DEVICE
        n_elements = output.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        add_kernel[grid](x, y, output, n_elements)
        return output
    '''
)

CERTIFY_TUTORIAL = textwrap.dedent(
    """
    import numpy as np
    import triton

    from nbxcert.kernels.inputs import randn, rng
    from nbxcert.kernels.spec import Inputs, Reference
    from nbxcert.kernels.tensor import empty
    from tutorial_torch import add_kernel


    def make_inputs(problem, dtypes, seed, device):
        n = problem["n_elements"]
        gen = rng(seed)
        x, y = randn(gen, (n,), "float32", device), randn(gen, (n,), "float32", device)
        out = empty((n,), "float32", device)
        return Inputs({"x_ptr": x, "y_ptr": y, "output_ptr": out}, {"n_elements": n}, ("output_ptr",))


    def oracle(inputs):
        x, y = inputs.tensors["x_ptr"].float64(), inputs.tensors["y_ptr"].float64()
        return {"output_ptr": Reference(x + y, np.abs(x) + np.abs(y))}


    add_kernel.certify_with(
        make_inputs=make_inputs,
        oracle=oracle,
        grid=lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK_SIZE"]),),
        dtypes=[("float32", "float32", "float32")],
        dtype_args=("x_ptr", "y_ptr", "output_ptr"),
    )
    """
)

SERVE_TUTORIAL = textwrap.dedent(
    """
    import sys
    import torch
    import tutorial_torch

    torch.manual_seed(0)
    x = torch.rand(98432, device="cuda")
    y = torch.rand(98432, device="cuda")
    calls = []
    original = tutorial_torch.add_kernel.fn.run
    tutorial_torch.add_kernel.fn.run = lambda *a, **k: (calls.append(k.get("BLOCK_SIZE")), original(*a, **k))[1]
    out = tutorial_torch.add(x, y)
    assert torch.equal(out, x + y), "the tutorial's sum"
    print("served:", calls, tutorial_torch.add_kernel.best_config)
    assert len(calls) == 1, "one launch: served from the certificate, no sweep"
    """
)


@pytest.mark.gpu
def test_gpu_the_torch_form_tutorial_is_certified_and_served_certified_only(backend, tmp_path):
    """The tutorial's file is Triton's (torch tensors, torch.empty_like) with triton.autotune replaced and nothing
    else; a module of its own gives the inputs and the oracle (`certify_with`); `nbxcert certify --spec` certifies
    n_elements=98432 on the GPU, and the torch program is then served certified-only: one launch, the certified
    config, no sweep."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)"
    if subprocess.run([sys.executable, "-c", probe], env=env).returncode:
        pytest.skip("torch is not installed here (the test needs it as the caller's library)")
    (tmp_path / "tutorial_torch.py").write_text(TUTORIAL)
    (tmp_path / "certify_tutorial_torch.py").write_text(CERTIFY_TUTORIAL)
    (tmp_path / "serve_tutorial_torch.py").write_text(SERVE_TUTORIAL)
    env.update(PYTHONPATH=str(tmp_path), NBXCERT_CACHE_DIR=str(tmp_path / "cache"))
    key = "tutorial_torch_add_kernel[n_elements=98432;float32,float32,float32]@v1"
    certs = tmp_path / "certs"
    cmd = [sys.executable, "-m", "nbxcert", "certify", "--profile", "hopper", "--spec", "certify_tutorial_torch"]
    done = subprocess.run(
        [*cmd, "--key", key, "--out", str(certs), "--jobs", "2"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(certs.rglob("*.json")), done.stdout[-2000:]
    env.update(NBXCERT_CERTIFIED_DIR=str(certs), NBXCERT_CERTIFIED_ONLY="1")
    done = subprocess.run(
        [sys.executable, str(tmp_path / "serve_tutorial_torch.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "served:" in done.stdout
