"""Test-wide setup: the backend is chosen before any kernel module is imported, and `gpu` tests skip cleanly.

With no usable NVIDIA GPU the interpreter backend is chosen (CI); on a GPU machine the cuda backend is, and the
`gpu`-marked tests run. Tests never import torch: a test after which torch is loaded in its process fails (benchmarks'
torch peers run in processes of their own).
"""

from __future__ import annotations

import os
import sys

import pytest

# Kernel tests call the user-facing functions, which go through serving. With no certificate for their small shapes,
# serving would sweep every one at run time; the tests ask for the untuned default instead (an explicit serving mode,
# said once). The serving tests set their own mode.
os.environ.setdefault("NBXCERT_UNCERTIFIED", "default")


def _gpu_available() -> bool:
    from nbxcert.kernels.backends import cuda

    return cuda.available()[0]


GPU = _gpu_available()


def _choose_backend() -> None:
    """Fix the backend now, before any test module imports Triton: Triton decorates its own helpers interpreted or
    compiled when it is first imported, and the interpreter backend refuses a process that imported it first."""
    from nbxcert.kernels.backends import select

    select()


_choose_backend()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="no usable NVIDIA GPU on this machine (gpu tests run on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def backend():
    from nbxcert.kernels.backends import select

    return select()


@pytest.fixture(scope="module")
def profile(backend):
    """The profile kernels are judged at: cpu/interpreter under the interpreter, the GPU's own profile on a GPU."""
    from nbxcert.profiles import get_profile, match_nvidia

    if backend.name == "interpreter":
        return get_profile("cpu/interpreter")
    from nbxcert.kernels.backends import cuda

    return match_nvidia(cuda.device_info(0).compute_capability)[0]


@pytest.fixture(autouse=True)
def _no_torch():
    """nbxcert never imports torch, and nor does its test run: the test after which torch is loaded fails, by name (in
    every test process, the workers of `pytest -n` included)."""
    yield
    assert "torch" not in sys.modules, "torch was imported into this test process: nbxcert and its tests run without it"


@pytest.fixture
def host_cuda(monkeypatch):
    """cuBLAS calls (`backends.cublas`, a stand-in library: `cublastools.FakeCublas`) on cpu tensors: no stream,
    nothing to wait for."""
    from nbxcert.kernels.backends import cuda

    monkeypatch.setattr(cuda, "current_stream", lambda index=None: 0)
    monkeypatch.setattr(cuda, "synchronize", lambda: None)
