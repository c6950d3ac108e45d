"""The dtype table and the exact conversions for the types numpy lacks (bfloat16, float8)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbxcert.errors import DTypeError
from nbxcert.kernels import dtypes as D

ALL_BF16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def _bf16_value(bits: int) -> float:
    """Decode one bfloat16 pattern by the format's definition (sign, 8-bit exponent, 7-bit fraction)."""
    sign = -1.0 if bits & 0x8000 else 1.0
    e, m = (bits >> 7) & 0xFF, bits & 0x7F
    if e == 0xFF:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (-126 - 7)
    return sign * (1 + m / 128) * 2.0 ** (e - 127)


def test_bf16_decode_matches_the_format_definition_for_all_65536_patterns():
    got = D.decode(ALL_BF16, D.bfloat16)
    want = np.array([_bf16_value(int(b)) for b in ALL_BF16])
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all(), np.argwhere(~same)[:5]


def test_bf16_round_trip_is_exact_for_all_patterns_nan_and_inf_included():
    values32 = D.bfloat16_bits_to_float32(ALL_BF16)
    for values in (values32, D.decode(ALL_BF16, D.bfloat16)):
        back = D.to_bfloat16_bits(values)
        nan = np.isnan(values32)
        assert np.array_equal(back[~nan], ALL_BF16[~nan])
        assert np.isnan(D.bfloat16_bits_to_float32(back[nan])).all()


def _neighbours():
    """Adjacent finite, non-negative bfloat16 pairs (lo, hi) with their bits."""
    bits = np.arange(0, 0x7F80, dtype=np.uint32).astype(np.uint16)  # +0 .. largest finite
    lo = D.bfloat16_bits_to_float32(bits[:-1]).astype(np.float64)
    hi = D.bfloat16_bits_to_float32(bits[1:]).astype(np.float64)
    return bits, lo, hi


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_bf16_rounds_to_nearest_ties_to_even_from_float64(sign):
    bits, lo, hi = _neighbours()
    mid = (lo + hi) / 2  # exact in float64: bfloat16 has 8 significant bits
    even = np.where(bits[:-1] % 2 == 0, bits[:-1], bits[1:])
    sign_bit = np.uint16(0x8000) if sign < 0 else np.uint16(0)
    assert np.array_equal(D.to_bfloat16_bits(sign * mid), even | sign_bit)
    # a hair either side of the midpoint goes to the nearer neighbour, which needs one rounding, not two
    below = np.nextafter(mid, lo)
    above = np.nextafter(mid, hi)
    assert np.array_equal(D.to_bfloat16_bits(sign * below), bits[:-1] | sign_bit)
    assert np.array_equal(D.to_bfloat16_bits(sign * above), bits[1:] | sign_bit)


def test_bf16_from_float32_ties_to_even_and_overflow():
    bits, lo, hi = _neighbours()
    mid32 = ((lo + hi) / 2).astype(np.float32)
    even = np.where(bits[:-1] % 2 == 0, bits[:-1], bits[1:])
    assert np.array_equal(D.float32_to_bfloat16_bits(mid32), even)
    big = np.array([3.5e38, -3.5e38, np.inf, -np.inf], dtype=np.float64)
    assert list(D.to_bfloat16_bits(big)) == [0x7F80, 0xFF80, 0x7F80, 0xFF80]


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_round_trip_and_ties_to_even(name):
    dtype = D.get_dtype(name)
    codes = np.arange(256, dtype=np.uint8)
    values = D.decode(codes, dtype)
    finite = np.isfinite(values)
    back = D.encode(values[finite], dtype)
    # +0 and -0 keep their sign; every finite code round-trips
    assert np.array_equal(back, codes[finite])
    pos = codes[:128][np.isfinite(values[:128])]
    v = D.decode(pos, dtype)
    mids = (v[:-1] + v[1:]) / 2
    even = np.where(pos[:-1] % 2 == 0, pos[:-1], pos[1:])
    assert np.array_equal(D.encode(mids, dtype), even)


def test_fp8_overflow_policy():
    e4 = D.float8_e4m3fn
    e5 = D.float8_e5m2
    assert list(D.encode(np.array([448.0, 464.0, 465.0, 1e6, np.nan]), e4)) == [0x7E, 0x7E, 0x7F, 0x7F, 0x7F]
    assert list(D.encode(np.array([57344.0, 61440.0, 1e9, -1e9]), e5)) == [0x7B, 0x7C, 0x7C, 0xFC]


def test_unknown_dtype_is_refused_by_name():
    with pytest.raises(DTypeError, match="unknown dtype 'float12'"):
        D.get_dtype("float12")
    assert D.get_dtype("bf16") is D.bfloat16


def test_dtype_table_facts():
    assert [d.itemsize for d in (D.float16, D.bfloat16, D.float32, D.float64)] == [2, 2, 4, 8]
    assert str(D.bfloat16) == "bfloat16" and D.bfloat16.triton == "bf16"
    assert len({hash(d) for d in D.ALL_DTYPES}) == len(D.ALL_DTYPES)


def test_triton_maps_every_dtype():
    """Triton's specializer reads str(tensor.dtype): each nbxcert dtype must map to its Triton type."""
    from triton.runtime.jit import mangle_type

    class Probe:
        def __init__(self, dtype):
            self.dtype = dtype

        def data_ptr(self):
            return 1024

    for d in D.ALL_DTYPES:
        assert mangle_type(Probe(d)) == "*" + d.triton, d


def test_integer_storage_refuses_non_finite():
    with pytest.raises(DTypeError, match="non-finite"):
        D.encode(np.array([1.0, np.nan]), D.int32)
