"""The oracles' float64 products: the choice (NBXCERT_ORACLE_PRODUCTS), cuBLAS's search and the row-major DGEMM that
`backends.cublas.matmul64` issues (checked here against a column-major DGEMM written in numpy, on host memory), and on
a GPU the device products against numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from cublastools import FakeCublas

from nbxcert.errors import BackendUnavailable, UsageError
from nbxcert.kernels import products
from nbxcert.kernels.backends import cublas


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((3, 5), (5, 7)), ((1, 9), (9, 1)), ((2, 4, 6), (6, 3)), ((4, 6), (2, 6, 5)), ((2, 1, 3, 4), (5, 4, 2))],
)
def test_matmul64_issues_the_row_major_product(a_shape, b_shape, host_cuda):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    lib = FakeCublas()
    got = cublas.matmul64(a, b, "cpu", lib)
    assert got.shape == np.matmul(a, b).shape
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-13, atol=1e-13)
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    assert set(lib.calls) == {(n, m, k, n, k, n)}  # C^T = B^T A^T, each in its row-major memory


def test_each_library_uses_its_own_handle(host_cuda):
    """A handle is its library's: one made by another libcublas (or a stand-in) is never handed to this one."""
    first, second = FakeCublas(), FakeCublas()
    seen = []
    second.create = lambda handle_ref: setattr(handle_ref._obj, "value", 0x5678) or 0
    second.set_stream = lambda handle, stream: seen.append(handle.value) or 0
    cublas.matmul64(np.ones((2, 2)), np.ones((2, 2)), "cpu", first)
    cublas.matmul64(np.ones((2, 2)), np.ones((2, 2)), "cpu", second)
    assert seen == [0x5678]


def test_a_library_without_a_handle_is_refused(host_cuda):
    lib = FakeCublas()
    lib.create = lambda handle_ref: 0  # a stub: success, no handle
    with pytest.raises(BackendUnavailable, match="cublasCreate_v2 of fake-libcublas made no handle"):
        cublas.matmul64(np.ones((2, 2)), np.ones((2, 2)), "cpu", lib)


def test_matmul64_empty_and_vector_shapes_are_numpys(host_cuda):
    lib = FakeCublas()
    assert cublas.matmul64(np.ones((3, 0)), np.ones((0, 4)), "cpu", lib).tolist() == [[0.0] * 4] * 3
    np.testing.assert_array_equal(cublas.matmul64(np.ones(3), np.ones((3, 2)), "cpu", lib), [3.0, 3.0])
    assert lib.calls == []
    with pytest.raises(ValueError):
        cublas.matmul64(np.ones((2, 3)), np.ones((4, 2)), "cpu", lib)


def test_choice_is_checked(monkeypatch):
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "gpu")
    with pytest.raises(UsageError, match="NBXCERT_ORACLE_PRODUCTS=gpu is not one of auto, host, device"):
        products.choice()
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", " Device ")
    assert products.choice() == "device"
    monkeypatch.delenv("NBXCERT_ORACLE_PRODUCTS")
    assert products.choice() == "auto"


def test_auto_is_the_default_numpy_off_a_gpu_and_device_needs_one(monkeypatch):
    monkeypatch.delenv("NBXCERT_ORACLE_PRODUCTS", raising=False)
    assert products.in_force("cpu", "interpreter") == ("host", "the inputs are not on a GPU")
    assert products.product_for("cpu") is np.matmul
    assert products.describe("cpu", "interpreter") == (
        "numpy on the host (the inputs are not on a GPU; NBXCERT_ORACLE_PRODUCTS=device: cuBLAS on the GPU)"
    )
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "host")
    assert products.in_force("cuda:0", "cuda") == ("host", "NBXCERT_ORACLE_PRODUCTS=host")
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "device")
    with pytest.raises(UsageError, match="cuBLAS products need an NVIDIA GPU"):
        products.product_for("cpu")
    with pytest.raises(UsageError, match="lie on cpu with the interpreter backend: cuBLAS products need an NVIDIA GPU"):
        products.describe("cpu", "interpreter")


def test_auto_on_a_gpu_without_libcublas_says_why_it_uses_numpy(monkeypatch, tmp_path):
    """`auto` on a GPU whose machine has no libcublas: numpy's products, and the line certify and doctor print says
    why; `device` chosen outright is refused there, naming where libcublas was looked for."""
    missing = str(tmp_path / "libcublas.so.99")
    monkeypatch.setenv("NBXCERT_CUBLAS", missing)
    monkeypatch.setattr(cublas, "_loaded", [])
    monkeypatch.delenv("NBXCERT_ORACLE_PRODUCTS", raising=False)
    where, why = products.in_force("cuda:0", "cuda")
    assert where == "host" and why.startswith("no libcublas: no libcublas could be loaded") and missing in why
    assert products.describe("cuda:0", "cuda").startswith("numpy on the host (no libcublas: ")
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "device")
    with pytest.raises(BackendUnavailable, match="no libcublas could be loaded"):
        products.in_force("cuda:0", "cuda")


def test_a_missing_library_names_where_it_was_looked_for(monkeypatch, tmp_path):
    missing = str(tmp_path / "libcublas.so.99")
    monkeypatch.setenv("NBXCERT_CUBLAS", missing)
    monkeypatch.setattr(cublas, "_loaded", [])
    assert cublas.candidates() == [missing]
    with pytest.raises(
        BackendUnavailable, match=f"no libcublas could be loaded \\(tried {missing}\\) from NBXCERT_CUBLAS"
    ):
        cublas.load()


def test_the_search_covers_the_cuda_wheels(monkeypatch, tmp_path):
    wheel = tmp_path / "nvidia" / "cu13" / "lib"
    wheel.mkdir(parents=True)
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (wheel / name).write_bytes(b"")
    monkeypatch.delenv("NBXCERT_CUBLAS", raising=False)
    monkeypatch.setattr(cublas.site, "getsitepackages", lambda: [str(tmp_path)])
    found = cublas.candidates()
    assert found[: len(cublas.NAMES)] == list(cublas.NAMES)
    assert str(wheel / "libcublas.so.13") in found
    assert not any("Lt" in f for f in found)


@pytest.mark.gpu
def test_device_products_equal_numpys(backend):
    rng = np.random.default_rng(1)
    for a_shape, b_shape in [((4096, 3584), (3584, 4608)), ((7, 129), (129, 33)), ((3, 64, 128), (128, 80))]:
        a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
        got = cublas.matmul64(a, b, backend.device)
        np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
def test_a_matmul_oracle_on_the_device_equals_the_hosts(monkeypatch, backend, profile):
    from nbxcert.kernels.spec import get_spec, load_all

    load_all()
    spec = get_spec("matmul")
    problem = {"M": 300, "N": 520, "K": 1000, "aligned": 1, "trans_a": 0, "trans_b": 1}
    inputs = spec.make_inputs(problem, ("bfloat16", "bfloat16"), 0, backend.device)
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "host")
    host = spec.oracle(inputs)["out"]
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "device")
    assert products.describe(backend.device).startswith("cuBLAS DGEMM on ")
    device = spec.oracle(inputs)["out"]
    np.testing.assert_allclose(device.value, host.value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(device.scale, host.scale, rtol=1e-12, atol=0)


MM_PROBLEMS = [
    ({"M": 5, "N": 7, "K": 9, "aligned": 1, "trans_a": 0, "trans_b": 1}, "float16"),
    ({"M": 4, "N": 3, "K": 17, "aligned": 0, "trans_a": 1, "trans_b": 0}, "bfloat16"),
    ({"M": 3, "N": 6, "K": 8, "aligned": 1, "trans_a": 0, "trans_b": 0, "batch": 2, "bcast_b": 1}, "float32"),
]


@pytest.mark.parametrize("problem,dtype", MM_PROBLEMS)
def test_products_from_the_operands_as_they_lie(problem, dtype, host_cuda, backend):
    """The operands widened where they lie (`_widen_kernel`: strided, transposed, unaligned and broadcast views, 16-bit
    patterns for bfloat16) and multiplied by the row-major DGEMM give numpy's products of the host's widening."""
    if backend.name != "interpreter":
        pytest.skip("the interpreter's host memory stands in for the device here")
    from nbxcert.kernels.matmul import _make_mm_inputs

    inputs = _make_mm_inputs(problem, (dtype, dtype), 3, backend.device)
    a, b = inputs.tensors["a"], inputs.tensors["b"]
    lib = FakeCublas()
    ab, abs_ab = products.products_on_device(a, b, lib)
    a64, b64 = a.float64(), b.float64()
    np.testing.assert_allclose(ab, a64 @ b64, rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(abs_ab, np.abs(a64) @ np.abs(b64), rtol=1e-13, atol=1e-12)
    assert len(lib.calls) == 2 * problem.get("batch", 1)


def test_addmm_of_its_products_is_addmm():
    from nbxcert.oracles import matmul as oracle

    rng = np.random.default_rng(2)
    a, b, bias = rng.standard_normal((6, 40)), rng.standard_normal((40, 5)), rng.standard_normal(5)
    terms = {"alpha": 0.5, "beta": -2.0, "activation_name": "gelu_tanh", "acc_eps": 2.0**-23, "out_eps": 2.0**-10}
    value, scale = oracle.addmm(a, b, bias, **terms)
    value_of, scale_of = oracle.addmm_of(a @ b, np.abs(a) @ np.abs(b), 40, bias, **terms)
    np.testing.assert_array_equal(value_of, value)
    np.testing.assert_array_equal(scale_of, scale)
