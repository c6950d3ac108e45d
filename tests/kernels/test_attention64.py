"""The float64 attention reference evaluated on the device (`kernels/attention64.py`) against the host's
(`oracles/attention.py`): under the interpreter, whose "device" memory is the host's, with a numpy DGEMM standing in
for cuBLAS (`cublastools.FakeCublas`); on a GPU, with cuBLAS itself. Both are float64 evaluations of one definition:
they agree to a relative 1e-12 (the summation order of the products, the last bit of exp), far inside any tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from cublastools import FakeCublas

from nbxcert.kernels import attention as A
from nbxcert.kernels import attention64, products
from nbxcert.kernels.spec import get_spec, load_all
from nbxcert.oracles import attention as oracle

FLASH = [
    # causal, q_len < kv_len (a prefill continuing a cache), grouped heads, unaligned (one element into the buffer)
    {"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 32, "q_len": 5, "kv_len": 9, "causal": 1, "aligned": 0},
    # causal, q_len > kv_len: the first rows see no key (zeros)
    {"batch": 1, "heads": 2, "kv_heads": 1, "head_dim": 16, "q_len": 7, "kv_len": 3, "causal": 1, "aligned": 1},
    # not causal, more keys than a softmax block (two passes of the row loop)
    {"batch": 1, "heads": 2, "kv_heads": 2, "head_dim": 16, "q_len": 3, "kv_len": 1500, "causal": 0, "aligned": 1},
]
DECODE = {"batch": 4, "heads": 8, "kv_heads": 2, "head_dim": 32, "kv_len": 40}


def _interpreted(backend):
    if backend.name != "interpreter":
        pytest.skip("the interpreter's host memory stands in for the device here (on a GPU: the gpu tests)")


def _close(got, want):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("problem", FLASH)
def test_flash_reference_on_the_device_is_the_hosts(problem, dtype, host_cuda, backend):
    _interpreted(backend)
    inputs = A._flash_inputs(problem, (dtype,), 3, backend.device)
    t, s = inputs.tensors, inputs.scalars
    host = inputs.host()
    want = oracle.attention(host["q"], host["k"], host["v"], s["scale"], s["causal"])
    lib = FakeCublas()
    got = attention64.attention_on_device(t["q"], t["k"], t["v"], s["scale"], s["causal"], None, lib)
    _close(got, want)
    assert len(lib.calls) == 3 * problem["batch"] * problem["kv_heads"]  # one step holds every KV head: 3 products


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_reference_on_the_device_reads_no_position_past_a_length(dtype, host_cuda, backend, monkeypatch):
    """The caches hold NaN past each sequence's length (sequence 1 is empty: zeros), and a step of one KV head at a
    time (STEP_ELEMENTS) gives the same answer."""
    _interpreted(backend)
    inputs = A.decode_inputs(DECODE, (dtype,), 5, backend.device)
    t, scale = inputs.tensors, inputs.scalars["scale"]
    lengths = t["lengths"].numpy()
    assert lengths[1] == 0 and np.isnan(t["k_cache"].float64()).any()
    want = oracle.decode_attention(t["q"].float64(), t["k_cache"].float64(), t["v_cache"].float64(), lengths, scale)
    q = t["q"].unsqueeze(2)
    got = attention64.attention_on_device(q, t["k_cache"], t["v_cache"], scale, False, lengths, FakeCublas())
    _close((got[0][:, :, 0], got[1][:, :, 0]), want)
    assert np.all(got[0][1] == 0) and np.all(got[1][1] == 0)
    monkeypatch.setattr(attention64, "STEP_ELEMENTS", 1)
    lib = FakeCublas()
    stepped = attention64.attention_on_device(q, t["k_cache"], t["v_cache"], scale, False, lengths, lib)
    _close(stepped, got)
    assert len(lib.calls) == 3 * int(np.count_nonzero(lengths)) * DECODE["kv_heads"]


@pytest.mark.parametrize("name", ["flash_attention", "decode_attention"])
def test_the_oracle_evaluates_on_the_device_where_products_are_the_devices(name, host_cuda, backend, monkeypatch):
    """The family's oracle takes the device's evaluation where `products.device_library` gives a cuBLAS (inputs on a
    GPU with libcublas, or NBXCERT_ORACLE_PRODUCTS=device), the host's otherwise: the same references."""
    _interpreted(backend)
    load_all()
    spec = get_spec(name)
    problem = spec.example_problems[0]
    inputs = spec.make_inputs(problem, spec.dtypes[0], 7, backend.device)
    monkeypatch.setattr(products, "device_library", lambda device: None)
    host = spec.oracle(inputs)["out"]
    lib = FakeCublas()
    monkeypatch.setattr(products, "device_library", lambda device: lib)
    device = spec.oracle(inputs)["out"]
    assert lib.calls, "the oracle did not multiply on the device"
    _close((device.value, device.scale), (host.value, host.scale))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["flash_attention", "decode_attention"])
def test_on_the_gpu_the_device_reference_is_the_hosts(name, monkeypatch, backend):
    """cuBLAS and the float64 softmax kernel on the GPU against numpy on the host, for every example problem."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    load_all()
    spec = get_spec(name)
    for problem in spec.example_problems:
        for dtypes in spec.dtypes:
            inputs = spec.make_inputs(problem, dtypes, 11, backend.device)
            monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "host")
            host = spec.oracle(inputs)["out"]
            monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "device")
            device = spec.oracle(inputs)["out"]
            np.testing.assert_allclose(device.value, host.value, rtol=1e-11, atol=1e-12, err_msg=f"{problem}")
            np.testing.assert_allclose(device.scale, host.scale, rtol=1e-11, atol=1e-12, err_msg=f"{problem}")
