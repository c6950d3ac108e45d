"""Quantized-weight products (dequant_gemv, dequant_matmul; int4 GPTQ and int8 per channel) against their float64
oracle.

Under the interpreter (CI): every candidate the interpreter prune keeps runs once at a small shape (K = 256, N not a
multiple of any tile, M <= 16), rotating format and dtype; the defaults run every example problem in every dtype; the
int4 packing is checked against a hand-made weight; bad operands are refused by name; the prunes against the device
files. GPU tests run every hopper-kept candidate at the issue's shapes (4096 x 4096 and 4096 x 14336, int4 and int8).
"""

from __future__ import annotations

import numpy as np
import pytest
from sampletools import SUBSETS, chosen, field

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import quant
from nbxcert.kernels.check import all_ok, first_report, run_checked
from nbxcert.kernels.compare import compare
from nbxcert.kernels.tensor import from_numpy
from nbxcert.oracles import quant as oracle
from nbxcert.profiles import get_profile
from nbxcert.warm import check_configs

SPECS = {s.name: s for s in quant.SPECS}
SMALL_M = {"dequant_gemv": (1, 3, 4), "dequant_matmul": (16, 5, 9)}


def check(spec, config, prob, dtypes, profile, device, seed=0):
    verdicts = run_checked(spec, config, prob, dtypes, profile, seed, device)
    assert all_ok(verdicts), first_report(verdicts)


# the regular run: a sample taking every tile field's every value and both dtypes per format; -m slow: every candidate
@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_kept_candidate_matches_at_a_small_shape(name, subset, profile, backend):
    spec = SPECS[name]
    kinds = [field(f) for f in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K")]
    for i, fmt in enumerate(quant.FORMATS):
        prob = {"M": SMALL_M[name][i], "N": 72, "K": 256, "format": fmt}
        kept = spec.pruned_for(prob, profile).kept
        assert kept
        for j in chosen(kept, subset, f"quant every kept {name} {fmt}", kinds=kinds, turns=[2]):
            check(spec, kept[j], prob, spec.dtypes[(i + j) % 2], profile, backend.device, seed=j)


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_split_k_gemv_slices_that_divide_k_unevenly(fmt, profile, backend):
    """K = 640 is five 128-chunks: SPLIT_K 2 cuts them 3 + 2, SPLIT_K 4 cuts 2 + 2 + 1 + 0 (an empty slice adds 0),
    SPLIT_K 16 leaves eleven slices empty; each matches the oracle, the int8 scale applied once after the sum."""
    spec = quant.DEQUANT_GEMV
    prob = {"M": 3, "N": 40, "K": 640, "format": fmt}
    for i, split_k in enumerate((2, 4, 16)):
        config = quant.gemv_config(32, 128, 4, split_k)
        assert config in spec.candidates
        check(spec, config, prob, spec.dtypes[i % 2], profile, backend.device, seed=i)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_default_on_every_example_problem_and_dtype(name, profile, backend):
    spec = SPECS[name]
    for p, prob in enumerate(spec.example_problems):
        for dtypes in spec.dtypes:
            check(spec, spec.default, prob, dtypes, profile, backend.device, seed=p)


def test_int4_packing_against_a_hand_made_weight(backend):
    """The GPTQ layout: row k of W in bits 4 (k mod 8) of qweight[k // 8]; zero of column n in bits 4 (n mod 8) of
    qzeros[g, n // 8]. A weight with a known pattern comes out as its dequantised values, through both kernels."""
    dev = backend.device
    k, n = 128, 16
    q = (np.arange(k)[:, None] + 3 * np.arange(n)[None, :]) % 16
    z = (np.arange(n) * 5 % 16)[None, :]
    s = np.full((1, n), 0.25)
    assert np.array_equal(oracle.unpack_int4_rows(quant.pack_int4_rows(q)), q)
    assert np.array_equal(oracle.unpack_int4_cols(quant.pack_int4_cols(z)), z)
    qw = from_numpy(quant.pack_int4_rows(q), "int32", dev)
    qz = from_numpy(quant.pack_int4_cols(z), "int32", dev)
    scales = from_numpy(s, "float16", dev)
    eye = from_numpy(np.eye(k)[:4], "float16", dev)  # rows 0..3 of W, exactly
    want = (q[:4] - z) * 0.25
    assert np.array_equal(quant.dequant_gemv(eye, qw, scales, qz, "int4").float64(), want)
    assert np.array_equal(quant.dequant_matmul(eye, qw, scales, qz, "int4").float64(), want)


def test_user_facing_functions_match_the_oracle(profile, backend):
    dev = backend.device
    for fmt in quant.FORMATS:
        inputs = quant.quant_inputs({"M": 3, "N": 48, "K": 256, "format": fmt}, ("bfloat16",), 4, dev)
        t = inputs.tensors
        ref = quant._quant_oracle(inputs)["out"]
        for fn in (quant.dequant_gemv, quant.dequant_matmul):
            out = fn(t["x"], t["qweight"], t["scales"], t.get("qzeros"), fmt)
            v = compare(out.float64(), ref.value, ref.scale, out.dtype, profile.tolerance("bfloat16"), fn.__name__)
            assert v.ok, v.report
        assert quant.quant_problem(t["x"], t["qweight"], t["scales"], t.get("qzeros"), fmt) == {
            "M": 3,
            "N": 48,
            "K": 256,
            "format": fmt,
        }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_the_weight_dequantized_on_the_device_is_the_hosts_to_the_bit(fmt, dtype, backend):
    """`quant64.dequantized` (one float64 element a lane, where the weight lies) against `oracles.quant.dequantize`:
    every step exact, so equal bit for bit, every nibble of every word and every group's zero point and scale; a
    transposed (column-major) qweight view as well."""
    from nbxcert.kernels import quant64

    dev = backend.device
    inputs = quant.quant_inputs({"M": 2, "N": 48, "K": 384, "format": fmt}, (dtype,), 5, dev)
    t = inputs.tensors
    qz = t["qzeros"].numpy() if "qzeros" in t else None
    want = oracle.dequantize(fmt, t["qweight"].numpy(), t["scales"].float64(), qz, quant.GROUP)
    got = quant64.dequantized(fmt, t["qweight"], t["scales"], t.get("qzeros"), quant.GROUP)
    assert got.dtype.name == "float64" and tuple(got.shape) == want.shape
    np.testing.assert_array_equal(got.numpy(), want)
    column_major = from_numpy(np.ascontiguousarray(t["qweight"].numpy().T), t["qweight"].dtype, dev).T
    got = quant64.dequantized(fmt, column_major, t["scales"], t.get("qzeros"), quant.GROUP)
    np.testing.assert_array_equal(got.numpy(), want)
    if fmt == "int4":
        with pytest.raises(ValueError, match="int4 dequantization needs qzeros"):
            quant64.dequantized(fmt, t["qweight"], t["scales"], None, quant.GROUP)
    with pytest.raises(ValueError, match="unknown format 'int3'"):
        quant64.dequantized("int3", t["qweight"], t["scales"], t.get("qzeros"), quant.GROUP)


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_the_oracle_dequantizes_on_the_device_where_products_are_the_devices(fmt, host_cuda, backend, monkeypatch):
    """Where `products.device_library` gives a cuBLAS, the oracle dequantizes where the weight lies and multiplies
    there (two products); the host's reference otherwise: the same to rounding."""
    if backend.name != "interpreter":
        pytest.skip("the interpreter's host memory stands in for the device here")
    from cublastools import FakeCublas

    from nbxcert.kernels import products

    inputs = quant.quant_inputs({"M": 5, "N": 40, "K": 256, "format": fmt}, ("bfloat16",), 6, backend.device)
    monkeypatch.setattr(products, "device_library", lambda device: None)
    host = quant._quant_oracle(inputs)["out"]
    lib = FakeCublas()
    monkeypatch.setattr(products, "device_library", lambda device: lib)
    device = quant._quant_oracle(inputs)["out"]
    assert len(lib.calls) == 2
    np.testing.assert_allclose(device.value, host.value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(device.scale, host.scale, rtol=1e-12, atol=0)


def test_bad_operands_are_refused_by_name(backend):
    dev = backend.device
    t = quant.quant_inputs({"M": 8, "N": 48, "K": 256, "format": "int4"}, ("float16",), 0, dev).tensors
    with pytest.raises(LaunchError, match="M <= 4"):
        quant.dequant_gemv(t["x"], t["qweight"], t["scales"], t["qzeros"], "int4")
    with pytest.raises(ShapeMismatch, match="qzeros"):
        quant.dequant_matmul(t["x"], t["qweight"], t["scales"], None, "int4")
    with pytest.raises(ShapeMismatch, match="int8 qweight"):
        quant.dequant_matmul(t["x"], t["qweight"], t["scales"], None, "int8")
    with pytest.raises(LaunchError, match="format"):
        quant.dequant_matmul(t["x"], t["qweight"], t["scales"], t["qzeros"], "int3")
    x = from_numpy(np.ones((2, 200)), "float16", dev)
    with pytest.raises(LaunchError, match="multiple of 128"):
        quant.dequant_matmul(x, t["qweight"], t["scales"], t["qzeros"], "int4")


# --- prunes against the device files ----------------------------------------------------------------------------------
REAL = ((4096, 4096), (4096, 14336), (14336, 4096))


def test_interpreter_prune_keeps_every_candidate():
    interp = get_profile("cpu/interpreter")
    for spec in SPECS.values():
        prob = {"M": 4, "N": 14336, "K": 4096, "format": "int4"}
        assert spec.pruned_for(prob, interp).kept == spec.candidates


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("profile_key", ["nvidia/hopper", "nvidia/ampere", "nvidia/volta"])
def test_device_prunes_keep_the_default_or_name_a_fact(name, profile_key):
    spec, prof = SPECS[name], get_profile(profile_key)
    for k, n in REAL:
        result = spec.pruned_for({"M": 4, "N": n, "K": k, "format": "int4"}, prof)
        facts = ("max_registers_per_thread", "max_registers_per_block", "max_num_stages", "max_shared_memory")
        for config, reason in result.pruned:
            assert any(f in reason for f in facts), (config.label(), reason)
        if profile_key != "nvidia/volta":
            assert spec.default in result.kept


# --- GPU: every hopper-kept candidate at the shapes -----------------------------------------------------------
GPU_CASES = (
    ("dequant_gemv", 1, 4096, 4096),
    ("dequant_gemv", 4, 14336, 4096),
    ("dequant_gemv", 1, 4096, 14336),
    ("dequant_matmul", 16, 4096, 4096),
    ("dequant_matmul", 512, 14336, 4096),
    ("dequant_matmul", 256, 4096, 14336),
)


@pytest.mark.gpu
@pytest.mark.parametrize("name,m,n,k", GPU_CASES)
@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_gpu_every_kept_candidate_at_real_shapes(name, m, n, k, fmt, profile, backend):
    """float16 (and bfloat16 for int4) at the real shapes: each candidate the device's prune keeps matches the
    oracle, computed once per case."""
    spec = SPECS[name]
    prob = {"M": m, "N": n, "K": k, "format": fmt}
    failures = []
    for dtypes in spec.dtypes if fmt == "int4" else spec.dtypes[:1]:
        failures += check_configs(spec, prob, dtypes, profile, 7, backend.device)
    assert not failures, "\n\n".join(failures[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_gpu_oracle_on_the_device_is_the_hosts(fmt, monkeypatch, backend):
    """The weight dequantized and multiplied on the GPU against numpy on the host, at a gate-up projection's shape."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    from nbxcert.kernels import products

    inputs = quant.quant_inputs({"M": 16, "N": 14336, "K": 4096, "format": fmt}, ("bfloat16",), 7, backend.device)
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "host")
    host = quant._quant_oracle(inputs)["out"]
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "device")
    assert products.describe(backend.device).startswith("cuBLAS DGEMM on ")
    device = quant._quant_oracle(inputs)["out"]
    # two float64 sums of 4096 terms in different orders: apart by far less than the error scale
    assert np.all(np.abs(device.value - host.value) <= 1e-8 * host.scale)
    np.testing.assert_allclose(device.scale, host.scale, rtol=1e-10, atol=0)


def _pack_awq_by_hand(q: np.ndarray) -> np.ndarray:
    """AutoAWQ's packing, written out element by element (independent of `quant._unpack_awq`): columns 8 j + o of
    row r go into the int32 [r, j] at nibble i where AWQ_ORDER[i] = o, with AWQ_ORDER = 0, 2, 4, 6, 1, 3, 5, 7."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    rows, cols = q.shape
    out = np.zeros((rows, cols // 8), dtype=np.uint64)
    for r in range(rows):
        for j in range(cols // 8):
            word = 0
            for i, o in enumerate(order):
                word |= int(q[r, 8 * j + o]) << (4 * i)
            out[r, j] = word
    return out.astype(np.uint32).view(np.int32)


def test_an_awq_checkpoint_is_served_after_a_repack(backend):
    """AWQ packs along N in the order 0, 2, 4, 6, 1, 3, 5, 7; after `awq_to_gptq` both kernels give the weight's own
    dequantised values (a known pattern, read back row by row through an identity X)."""
    dev = backend.device
    k, n = 128, 16
    q = (np.arange(k)[:, None] * 7 + 3 * np.arange(n)[None, :]) % 16
    z = (np.arange(n) * 5 % 16)[None, :]
    qw, qz = quant.awq_to_gptq(
        from_numpy(_pack_awq_by_hand(q), "int32", dev), from_numpy(_pack_awq_by_hand(z), "int32", dev)
    )
    assert np.array_equal(oracle.unpack_int4_rows(qw.numpy()), q)
    assert np.array_equal(oracle.unpack_int4_cols(qz.numpy()), z)
    scales = from_numpy(np.full((1, n), 0.5), "float16", dev)
    eye = from_numpy(np.eye(k)[:4], "float16", dev)
    want = (q[:4] - z) * 0.5
    assert np.array_equal(quant.dequant_gemv(eye, qw, scales, qz, "int4").float64(), want)
    assert np.array_equal(quant.dequant_matmul(eye, qw, scales, qz, "int4").float64(), want)
    with pytest.raises(ShapeMismatch, match=r"awq_to_gptq: qzeros must be a 2-d int32 tensor, got float16\[1, 16\]"):
        quant.awq_to_gptq(qw, from_numpy(z, "float16", dev))
    with pytest.raises(ShapeMismatch, match=r"awq_to_gptq: qweight \[128, 2\] needs K a multiple of 128 and qzeros"):
        quant.awq_to_gptq(
            from_numpy(_pack_awq_by_hand(q), "int32", dev), from_numpy(np.zeros((2, 2), np.int32), "int32", dev)
        )
