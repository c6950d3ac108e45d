"""Seeded random inputs for kernels: never zeros, scaled so that float16/bfloat16 do not overflow."""

from __future__ import annotations

import numpy as np

from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.tensor import Tensor, from_numpy


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(gen: np.random.Generator, shape, dtype, device: str, scale: float = 1.0) -> Tensor:
    """Normal values times `scale`, rounded once into `dtype`."""
    return from_numpy(gen.standard_normal(shape) * scale, get_dtype(dtype), device)


def uniform(gen: np.random.Generator, shape, dtype, device: str, low: float = -1.0, high: float = 1.0) -> Tensor:
    return from_numpy(gen.uniform(low, high, size=shape), get_dtype(dtype), device)


def randint(gen: np.random.Generator, shape, low: int, high: int, dtype, device: str) -> Tensor:
    """Integers in [low, high)."""
    d = get_dtype(dtype)
    return from_numpy(gen.integers(low, high, size=shape).astype(d.storage), d, device)
