"""Seeded random inputs for kernels: never zeros, scaled so that float16/bfloat16 do not overflow."""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.tensor import Tensor, empty, from_numpy

_SHAPE_ONLY = contextvars.ContextVar("nbxcert_shape_only", default=False)


@contextlib.contextmanager
def shape_only():
    """Inputs made only to be compiled for (what Triton specialises on: dtypes, shapes, strides, alignment), never run
    or judged: `randn` and `uniform` then allocate their tensor without drawing or rounding a value (its contents are
    undefined). A fused_moe weight of Mixtral (8 x 28672 x 4096) costs seconds of random numbers and gigabytes of
    float64 per compile worker otherwise. Integer draws stay real, so host-side checks of ids still hold."""
    token = _SHAPE_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPE_ONLY.reset(token)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(gen: np.random.Generator, shape, dtype, device: str, scale: float = 1.0) -> Tensor:
    """Normal values times `scale`, rounded once into `dtype` (undefined values under `shape_only`)."""
    if _SHAPE_ONLY.get():
        return empty(shape, get_dtype(dtype), device)
    return from_numpy(gen.standard_normal(shape) * scale, get_dtype(dtype), device)


def uniform(gen: np.random.Generator, shape, dtype, device: str, low: float = -1.0, high: float = 1.0) -> Tensor:
    """Uniform values in [low, high), rounded once into `dtype` (undefined values under `shape_only`)."""
    if _SHAPE_ONLY.get():
        return empty(shape, get_dtype(dtype), device)
    return from_numpy(gen.uniform(low, high, size=shape), get_dtype(dtype), device)


def randint(gen: np.random.Generator, shape, low: int, high: int, dtype, device: str) -> Tensor:
    """Integers in [low, high)."""
    d = get_dtype(dtype)
    return from_numpy(gen.integers(low, high, size=shape).astype(d.storage), d, device)
