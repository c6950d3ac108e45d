"""The one dtype table of nbxcert's tensor layer, and exact conversions for the types numpy lacks.

Each `DType` is a singleton: its `str()` is the name Triton's argument specializer maps (it reads `str(tensor.dtype)`
and caches by the dtype object's hash, so one persistent object per type is required), its `itemsize`, its Triton
type and the numpy type its storage uses. bfloat16 and the float8 types have no numpy type: they live in numpy as raw
bits (uint16 / uint8) and are converted here, exactly, with round-to-nearest-even.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from nbxcert.errors import DTypeError


@dataclass(frozen=True, eq=False)
class DType:
    """One element type: `name` (torch-style, what Triton maps), `itemsize`, `triton` type name, numpy `storage`.

    One object per type (`get_dtype`; copies and pickles come back as it): equality and hash are identity's, the
    hash object's own C one (Triton hashes each tensor argument's dtype on every launch)."""

    name: str
    itemsize: int
    triton: str
    storage: type
    is_float: bool
    is_signed: bool

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"nbxcert.{self.name}"

    def __reduce__(self):  # singletons survive copy/deepcopy/multiprocessing as themselves
        return (get_dtype, (self.name,))

    @property
    def is_raw_bits(self) -> bool:
        """True where numpy holds the values as raw bit patterns (bfloat16, float8)."""
        return self.is_float and self.storage in (np.uint16, np.uint8)


float16 = DType("float16", 2, "fp16", np.float16, True, True)
bfloat16 = DType("bfloat16", 2, "bf16", np.uint16, True, True)
float32 = DType("float32", 4, "fp32", np.float32, True, True)
float64 = DType("float64", 8, "fp64", np.float64, True, True)
float8_e4m3fn = DType("float8_e4m3fn", 1, "fp8e4nv", np.uint8, True, True)
float8_e5m2 = DType("float8_e5m2", 1, "fp8e5", np.uint8, True, True)
int8 = DType("int8", 1, "i8", np.int8, False, True)
uint8 = DType("uint8", 1, "u8", np.uint8, False, False)
int16 = DType("int16", 2, "i16", np.int16, False, True)
int32 = DType("int32", 4, "i32", np.int32, False, True)
int64 = DType("int64", 8, "i64", np.int64, False, True)
bool_ = DType("bool", 1, "u1", np.bool_, False, False)

ALL_DTYPES: tuple[DType, ...] = (
    float16,
    bfloat16,
    float32,
    float64,
    float8_e4m3fn,
    float8_e5m2,
    int8,
    uint8,
    int16,
    int32,
    int64,
    bool_,
)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}
_ALIASES.update({"fp64": "float64", "double": "float64", "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2"})
_ALIASES.update({"bool_": "bool"})
FLOAT_DTYPES = tuple(d for d in ALL_DTYPES if d.is_float)


def get_dtype(name: str | DType) -> DType:
    """The dtype named `name` (or an alias such as `fp16`); `DTypeError` naming it and listing the known ones."""
    if isinstance(name, DType):
        return name
    key = _ALIASES.get(str(name), str(name))
    try:
        return _BY_NAME[key]
    except KeyError:
        known = ", ".join(_BY_NAME)
        raise DTypeError(f"unknown dtype '{name}'; known dtypes: {known}") from None


def from_numpy_dtype(dt: np.dtype) -> DType:
    """The nbxcert dtype of a numpy array whose values are meant as is (never bfloat16/float8: those are bits)."""
    for d in ALL_DTYPES:
        if not d.is_raw_bits and np.dtype(d.storage) == np.dtype(dt):
            return d
    raise DTypeError(f"numpy dtype '{np.dtype(dt)}' has no nbxcert dtype; convert it to one of float16/32/64 or ints")


# --- bfloat16 ---------------------------------------------------------------------------------------------------------
def _f64_to_f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd: an exact result stays, an inexact one becomes the truncated value with
    its last bit set. Rounding to odd first, then to nearest-even into a type at least 2 bits narrower, equals one
    direct rounding to nearest-even (Boldo & Melquiond, "When double rounding is odd", 2005). This makes
    float64 -> bfloat16 exact without a float64 bit-twiddling path."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
    exact = (f.astype(np.float64) == x) | np.isnan(x) | np.isinf(f)
    # truncated toward zero: where rounding moved away from zero, step one float32 back toward zero
    away = np.abs(f.astype(np.float64)) > np.abs(x)
    t = np.where(away & ~exact, np.nextafter(f, np.float32(0)), f)
    bits = t.view(np.uint32).copy()
    bits[~exact] |= np.uint32(1)
    return bits.view(np.float32)


def float32_to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values -> bfloat16 bits (uint16), round to nearest, ties to even; NaN stays a quiet NaN, sign kept."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16).astype(np.uint16)) | np.uint16(0x0040)
    return rounded


# elements per step of a large conversion, so its temporaries stay in cache: 67M float64 normals took 7.7 s in one step
# and 1.7 s in 1M steps (bfloat16 rounding, the project's 2-core machine, 2026-11-29; results equal); `encode` and
# `decode` run a large array in such chunks
_CHUNK = 1 << 20


def _map_chunks(fn, x: np.ndarray, out_dtype) -> np.ndarray:
    """`fn` (element-wise) over `x` in flat chunks of _CHUNK elements, on threads (numpy's loops release the GIL), into
    one array of x's shape: the same values as one call, in a fraction of the time on a many-core host (a decode
    cache of 400M values took 13 s to round into bfloat16 on one core)."""
    flat = x.reshape(-1)
    out = np.empty(flat.shape, dtype=out_dtype)
    starts = range(0, flat.size, _CHUNK)

    def one(i: int) -> None:
        out[i : i + _CHUNK] = fn(flat[i : i + _CHUNK])

    with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
        list(pool.map(one, starts))
    return out.reshape(x.shape)


def to_bfloat16_bits(x) -> np.ndarray:
    """Any float values (float16/32/64) -> bfloat16 bits, rounded once to nearest-even (`encode` runs it over large
    arrays in chunks)."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        x = _f64_to_f32_round_to_odd(x)
    return float32_to_bfloat16_bits(x.astype(np.float32))


def bfloat16_bits_to_float32(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32 values (exact: every bfloat16 is a float32)."""
    b = np.ascontiguousarray(b, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


# --- float8 (OCP FP8: E4M3FN has no infinities and one NaN per sign; E5M2 is IEEE-like) -------------------------------
def _fp8_table(exp_bits: int, man_bits: int, bias: int, fn: bool) -> np.ndarray:
    """The float64 value of each of the 256 codes."""
    vals = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if fn and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
            vals[code] = np.nan
        elif not fn and e == (1 << exp_bits) - 1:
            vals[code] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            vals[code] = sign * m * 2.0 ** (1 - bias - man_bits)
        else:
            vals[code] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return vals


_FP8 = {
    "float8_e4m3fn": _fp8_table(4, 3, 7, fn=True),
    "float8_e5m2": _fp8_table(5, 2, 15, fn=False),
}


def _to_fp8_bits(x, name: str) -> np.ndarray:
    """Float values -> float8 bits, round to nearest, ties to the even code. Out of range: E5M2 -> +-inf (IEEE);
    E4M3FN, which has no infinity, -> NaN (0x7F/0xFF), as PyTorch's and the OCP spec's non-saturating cast does."""
    table = _FP8[name]
    x = np.asarray(x, dtype=np.float64)
    pos_codes = np.arange(0, 128)
    pos_vals = table[:128]
    finite = np.isfinite(pos_vals)
    codes, vals = pos_codes[finite], pos_vals[finite]  # increasing in value as the code increases
    a = np.abs(x)
    idx = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo, hi = vals[idx - 1], vals[idx]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (codes[idx - 1] % 2 == 1))
    out = np.where(pick_hi, codes[idx], codes[idx - 1]).astype(np.uint8)
    vmax = vals[-1]
    next_up = 2 * vmax - vals[-2]  # the value one step past the largest finite, in the same binade spacing
    overflow = a >= (vmax + next_up) / 2
    if name == "float8_e5m2":
        # the midpoint between max and the (unrepresented) next value rounds to even: max's code 0x7B is odd -> inf
        out = np.where(overflow, np.uint8(0x7C), out)
        out = np.where(np.isnan(x), np.uint8(0x7E), out)
    else:
        # E4M3FN's max 448 (0x7E) is even, so the midpoint 464 stays at 448; above it there is nothing but NaN
        overflow = a > (vmax + next_up) / 2
        out = np.where(overflow | np.isnan(x), np.uint8(0x7F), out)
    sign = np.signbit(x) & ~np.isnan(x)
    return (out | np.where(sign, np.uint8(0x80), np.uint8(0))).astype(np.uint8)


def _fp8_bits_to_float64(b, name: str) -> np.ndarray:
    return _FP8[name][np.asarray(b, dtype=np.uint8)]


# --- the conversions the tensor layer uses ----------------------------------------------------------------------------
def encode(values, dtype: DType) -> np.ndarray:
    """Values (any numpy numbers) -> the storage array of `dtype` (raw bits for bfloat16/float8), rounded once."""
    values = np.asarray(values)
    if values.size > _CHUNK and dtype.is_float:
        return _map_chunks(lambda chunk: encode(chunk, dtype), values, dtype.storage)
    if dtype is bfloat16:
        return to_bfloat16_bits(values if values.dtype.kind == "f" else values.astype(np.float64))
    if dtype in (float8_e4m3fn, float8_e5m2):
        return _to_fp8_bits(values, dtype.name)
    if not dtype.is_float and values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        raise DTypeError(f"cannot store non-finite values in an integer tensor of dtype {dtype.name}")
    # overflow to inf is the rounding asked for; signalling-NaN patterns narrow to quiet NaNs (numpy calls both invalid)
    with np.errstate(over="ignore", invalid="ignore" if dtype.is_float else "warn"):
        return values.astype(dtype.storage)


def decode(storage: np.ndarray, dtype: DType) -> np.ndarray:
    """The storage array of `dtype` -> float64 values (exact for every float type nbxcert has; ints as float64)."""
    storage = np.asarray(storage)
    if storage.size > _CHUNK:
        return _map_chunks(lambda chunk: decode(chunk, dtype), storage, np.float64)
    if dtype is bfloat16:
        with np.errstate(invalid="ignore"):  # signalling-NaN patterns widen to quiet NaNs, which is what we want
            return bfloat16_bits_to_float32(storage).astype(np.float64)
    if dtype in (float8_e4m3fn, float8_e5m2):
        return _fp8_bits_to_float64(storage, dtype.name)
    with np.errstate(invalid="ignore"):  # as above: signalling NaNs widen to quiet NaNs
        return storage.astype(np.float64)


def finfo(dtype: DType) -> dict:
    """eps (spacing at 1), max finite, smallest normal and mantissa bits of a float dtype."""
    table = {
        "float16": (2.0**-10, 65504.0, 2.0**-14, 10),
        "bfloat16": (2.0**-7, float.fromhex("0x1.fep127"), 2.0**-126, 7),
        "float32": (2.0**-23, float(np.finfo(np.float32).max), 2.0**-126, 23),
        "float64": (2.0**-52, float(np.finfo(np.float64).max), 2.0**-1022, 52),
        "float8_e4m3fn": (2.0**-3, 448.0, 2.0**-6, 3),
        "float8_e5m2": (2.0**-2, 57344.0, 2.0**-14, 2),
    }
    if dtype.name not in table:
        raise DTypeError(f"dtype {dtype.name} is not a float type")
    eps, fmax, tiny, mant = table[dtype.name]
    return {"eps": eps, "max": fmax, "tiny": tiny, "mantissa_bits": mant}


def rounding_bound(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Half a unit in the last place of `dtype` at each value: the error storing the value in `dtype` can add.
    Integers round to nothing (0)."""
    if not dtype.is_float:
        return np.zeros(np.shape(values))
    info = finfo(dtype)
    a = np.abs(np.asarray(values, dtype=np.float64))
    a = np.where(np.isfinite(a), a, 0.0)
    # ulp(x) = 2^(floor(log2 |x|) - mantissa_bits), floored at the subnormal spacing
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.maximum(a, info["tiny"])))
    return 0.5 * np.exp2(e - info["mantissa_bits"])
