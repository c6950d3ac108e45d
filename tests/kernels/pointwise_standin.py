"""Test stand-ins for `nbxcert.oracles.pointwise` and `nbxcert.kernels.promotion`, used by the pointwise tests only
while those modules are absent (`install()`); the real modules replace them. A few ops' float64 references, written
from torch's documented semantics, and torch's type promotion over nbxcert's dtypes."""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np

FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("uint8", "int8", "int16", "int32", "int64")


def _wrap(v, dtype):
    return np.asarray(v).astype(np.int64).astype(np.dtype(dtype)).astype(np.int64)


def _rounded(ref, scale, dtype):
    """A float reference as the dtype holds it at its ends: beyond its range it is the infinity."""
    from nbxcert.kernels.dtypes import decode, encode, get_dtype

    if dtype not in FLOATS:
        return ref, scale
    with np.errstate(over="ignore", invalid="ignore"):
        big = np.isinf(decode(encode(np.asarray(ref, np.float64), get_dtype(dtype)), get_dtype(dtype)))
    return np.where(big, np.sign(ref) * np.inf, ref), np.where(big, 0.0, scale)


def _exact(ref):
    return ref, np.zeros(np.shape(ref))


def add(x, y, *, dtype, alpha=1):
    if dtype == "bool":
        return _exact(np.asarray(x) | (np.asarray(y) & bool(alpha)))
    if dtype in INTS:
        with np.errstate(over="ignore"):
            return _exact(_wrap(x + np.int64(alpha) * y, dtype))
    return _rounded(x + alpha * y, np.abs(x) + np.abs(alpha * y), dtype)


def sub(x, y, *, dtype, alpha=1):
    if dtype in INTS:
        with np.errstate(over="ignore"):
            return _exact(_wrap(x - np.int64(alpha) * y, dtype))
    return _rounded(x - alpha * y, np.abs(x) + np.abs(alpha * y), dtype)


def mul(x, y, *, dtype):
    if dtype == "bool":
        return _exact(np.asarray(x) & np.asarray(y))
    if dtype in INTS:
        with np.errstate(over="ignore"):
            return _exact(_wrap(x * y, dtype))
    with np.errstate(invalid="ignore", over="ignore"):
        return _rounded(x * y, np.abs(x * y), dtype)


def div(x, y, *, dtype, rounding_mode=None):
    with np.errstate(all="ignore"):
        if rounding_mode is None:
            r = x / y
            return _rounded(r, np.abs(r), dtype)
        if dtype in INTS:
            if np.any(y == 0):
                raise ZeroDivisionError("div: integer division by zero")
            q = np.floor_divide(x, y)
            if rounding_mode == "trunc":
                q = np.where((q < 0) & (q * y != x), q + 1, q)
            return _exact(_wrap(q, dtype))
        r = np.trunc(x / y) if rounding_mode == "trunc" else np.floor_divide(x, y)
        return _rounded(r, np.zeros(np.shape(r)), dtype)


def remainder(x, y, *, dtype):
    with np.errstate(all="ignore"):
        if dtype in INTS:
            if np.any(y == 0):
                raise ZeroDivisionError("remainder: integer division by zero")
            return _exact(_wrap(np.remainder(x, y), dtype))
        return np.remainder(x, y), np.abs(np.remainder(x, y))


def fmod(x, y, *, dtype):
    with np.errstate(all="ignore"):
        if dtype in INTS:
            if np.any(y == 0):
                raise ZeroDivisionError("fmod: integer division by zero")
            return _exact(_wrap(np.fmod(x, y), dtype))
        return _exact(np.fmod(x, y))


def exp(x, *, dtype):
    with np.errstate(all="ignore"):
        r = np.exp(x)
    return _rounded(r, np.abs(r) * np.maximum(1.0, np.abs(x)), dtype)


def neg(x, *, dtype):
    if dtype in INTS:
        with np.errstate(over="ignore"):
            return _exact(_wrap(-x, dtype))
    return _exact(-x)


def relu(x, *, dtype):
    return _exact(np.where(np.isnan(x), x, np.maximum(x, 0)) if dtype in FLOATS else np.maximum(x, 0))


def gt(x, y, *, dtype):
    return _exact(np.asarray(x > y))


def where(c, x, y, *, dtype):
    return _exact(np.where(c, x, y))


def bitwise_left_shift(x, y, *, dtype):
    bits = 8 * np.dtype(dtype).itemsize
    ok = (y >= 0) & (y < bits)
    with np.errstate(over="ignore"):
        r = np.where(ok, np.left_shift(x.astype(np.uint64), np.where(ok, y, 0).astype(np.uint64)).view(np.int64), 0)
    return _exact(_wrap(r, dtype))


def copy(x, *, dtype):
    return _exact(x)


def fill(shape, value, *, dtype):
    return _exact(np.full(shape, value, np.int64 if dtype in INTS else np.float64))


def arange(start, end, step, *, dtype):
    n = int(round((end - start) / step))
    r = start + np.arange(n) * step
    return r, np.abs(r) if dtype in FLOATS else np.zeros(n)


def cast(x, *, src, dtype):
    if dtype == "bool":
        return _exact(np.asarray(x != 0))
    if dtype in INTS:
        if np.any(~np.isfinite(x)):
            raise ValueError("cast: NaN or infinity to an integer")
        return _exact(_wrap(np.trunc(x), dtype))
    return _rounded(np.asarray(x, np.float64), np.zeros(np.shape(x)), dtype)


# --- promotion ---------------------------------------------------------------------------------------------------
_ORDER = ("bool",) + INTS + FLOATS


def _category(d):
    return 0 if d == "bool" else 1 if d in INTS else 2


def promote_types(a, b):
    if a == b:
        return a
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    if {a, b} == {"uint8", "int8"}:
        return "int16"
    if _category(a) != _category(b):
        return a if _category(a) > _category(b) else b
    return max(a, b, key=_ORDER.index)


def result_type(*operands):
    tiers = {0: None, 1: None, 2: None}
    for o in operands:
        if isinstance(o, bool):
            d, tier = "bool", 0
        elif isinstance(o, int):
            d, tier = "int64", 0
        elif isinstance(o, float):
            d, tier = "float32", 0
        else:
            d, tier = o.dtype.name, (2 if o.ndim else 1)
        tiers[tier] = d if tiers[tier] is None else promote_types(tiers[tier], d)
    result = None
    for tier in (2, 1, 0):
        d = tiers[tier]
        if d is None:
            continue
        if result is None:
            result = d
        elif _category(d) > _category(result):
            result = d if tier != 0 else ("float32" if _category(d) == 2 else "int64")
    return result


def elementwise_dtypes(*operands, kind):
    r = result_type(*operands)
    if kind == "int_to_float" and r not in FLOATS:
        r = "float32"
    if kind == "bool_to_long" and r == "bool":
        r = "int64"
    comp = "float32" if r in ("float16", "bfloat16") and kind != "no_opmath" else r
    if kind == "always_bool":
        return comp, "bool"
    return comp, r


def install() -> None:
    """Put the stand-ins in place of `nbxcert.oracles.pointwise` and `nbxcert.kernels.promotion` where those are
    absent."""
    this = sys.modules[__name__]
    for name, funcs in (
        ("nbxcert.oracles.pointwise", None),
        ("nbxcert.kernels.promotion", ("promote_types", "result_type", "elementwise_dtypes")),
    ):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            mod = types.ModuleType(name, "test stand-in")
            for k, v in vars(this).items():
                if callable(v) and not k.startswith("_") and (funcs is None or k in funcs) and k != "install":
                    setattr(mod, k, v)
            sys.modules[name] = mod
