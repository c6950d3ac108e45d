"""Seeded random inputs for kernels: never zeros, scaled so that float16/bfloat16 do not overflow."""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from nbxcert.kernels import draws
from nbxcert.kernels.backends import on_gpu
from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.tensor import Tensor, empty, from_numpy, zeros

_SHAPE_ONLY = contextvars.ContextVar("nbxcert_shape_only", default=False)
_ZEROED = contextvars.ContextVar("nbxcert_shape_only_zeroed", default=False)


@contextlib.contextmanager
def shape_only(zeroed: bool = False):
    """Inputs made only to be compiled for (what Triton specialises on: dtypes, shapes, strides, alignment), never run
    or judged: `randn` and `uniform` then allocate their tensor without drawing or rounding a value (its contents are
    undefined; `zeroed`: zeros, set on the device, for inputs that are run but never judged, such as a cold-start
    benchmark's), and `rng` hands out a `ShapeOnlyGenerator`, whose float draws are constants. A fused_moe weight of
    Mixtral (8 x 28672 x 4096) costs seconds of random numbers and gigabytes of float64 per compile worker otherwise.
    Integer draws stay real, so host-side checks of ids still hold."""
    token, zero_token = _SHAPE_ONLY.set(True), _ZEROED.set(zeroed)
    try:
        yield
    finally:
        _ZEROED.reset(zero_token)
        _SHAPE_ONLY.reset(token)


def _unfilled(shape, dtype, device: str) -> Tensor:
    return (zeros if _ZEROED.get() else empty)(shape, get_dtype(dtype), device)


def rng(seed: int):
    """The seeded generator of an input maker; under `shape_only` a `ShapeOnlyGenerator` over it."""
    gen = np.random.default_rng(seed)
    return ShapeOnlyGenerator(gen) if _SHAPE_ONLY.get() else gen


def _filled(size, value: float, dtype=np.float64):
    if size is None:
        return dtype(value) if isinstance(dtype, type) else np.dtype(dtype).type(value)
    return np.full(size, value, dtype=dtype)


class ShapeOnlyGenerator:
    """The generator of an input maker under `shape_only`: integer draws are real (token ids, lengths, block tables,
    routing: host-side checks and the integer scalars Triton specialises on stay what they are in the real inputs);
    float draws return a constant (0, or `uniform`'s lower bound) of the shape asked for, without drawing, since
    values made only to be compiled for are never run. Every family's inputs go through it, so none pays seconds of
    float64 draws per compile request (a decode cache of batch 48 at 8192 positions: 117 s of a key's sweep on the
    H200)."""

    def __init__(self, gen: np.random.Generator) -> None:
        self._gen = gen

    def integers(self, *args, **kwargs):
        return self._gen.integers(*args, **kwargs)

    def permutation(self, *args, **kwargs):
        return self._gen.permutation(*args, **kwargs)

    def spawn(self, n: int) -> list[ShapeOnlyGenerator]:
        return [ShapeOnlyGenerator(g) for g in self._gen.spawn(n)]

    def standard_normal(self, size=None, dtype=np.float64):
        return _filled(size, 0.0, dtype)

    def random(self, size=None, dtype=np.float64):
        return _filled(size, 0.0, dtype)

    def uniform(self, low=0.0, high=1.0, size=None):
        return _filled(size, low)


# A tensor of at least LARGE elements (a model's weight, not a test's operand) is drawn in float32, in PART-element
# parts, each from its own child generator of `gen` (`Generator.spawn`: the values depend on the seed and on PART
# alone, not on how many threads fill them), on threads (numpy fills without the GIL). Mixtral's 8 x 28672 x 4096
# fused_moe weight took 24 s of float64 draws on one core and 7.5 GB; a float32 normal rounded once into a 16-bit
# dtype is as good an input.
LARGE = 1 << 24
PART = 1 << 22


def _large_normal(gen: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    n = math.prod(shape)
    out = np.empty(n, dtype=dtype)
    starts = range(0, n, PART)
    children = gen.spawn(len(starts))

    def fill(i: int) -> None:
        children[i].standard_normal(out=out[starts[i] : starts[i] + PART], dtype=dtype)

    with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
        list(pool.map(fill, range(len(starts))))
    return out.reshape(shape)


def normals(gen: np.random.Generator, n: int) -> np.ndarray:
    """`n` standard normal float64 values: `gen.standard_normal(n)` below LARGE; from LARGE on in PART-element parts on
    threads, each from its own child generator (the values depend on the seed alone, not on the threads)."""
    if n < LARGE or isinstance(gen, ShapeOnlyGenerator):
        return gen.standard_normal(n)
    return _large_normal(gen, (n,), np.float64)


def randn(gen: np.random.Generator, shape, dtype, device: str, scale: float = 1.0, nan_where=None) -> Tensor:
    """Normal values times `scale`, rounded once into `dtype` (undefined values under `shape_only`). On a GPU a
    tensor of at least `draws.ON_GPU_FROM` elements (of a dtype `draws.ON_DEVICE` names, at most `draws.MASK_DIMS`
    dimensions) is drawn where it lies (`draws.device_normal`); on the host, float32 draws in parallel parts for one
    of at least LARGE elements. `nan_where`: a boolean array broadcast to `shape`, NaN where it holds (a cache's
    positions past a sequence's length, so a read past it shows)."""
    if _SHAPE_ONLY.get():
        return _unfilled(shape, dtype, device)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if (
        math.prod(shape) >= draws.ON_GPU_FROM
        and get_dtype(dtype).name in draws.ON_DEVICE
        and len(shape) <= draws.MASK_DIMS
        and on_gpu(device)
    ):
        return draws.device_normal(gen, shape, dtype, device, scale, nan_where)
    if math.prod(shape) >= LARGE:
        values = _large_normal(gen, shape)
        values *= np.float32(scale)
    else:
        values = gen.standard_normal(shape) * scale
    if nan_where is not None:
        np.copyto(values, np.nan, where=np.broadcast_to(nan_where, shape))
    return from_numpy(values, get_dtype(dtype), device)


def of_values(gen: np.random.Generator, shape, values: str, dtype, device: str, host_values, normal_scale: float):
    """A test tensor of a family's kind of `values`: "normal" (standard normal x `normal_scale`) drawn by `randn`,
    on a GPU where the tensor lies (no host draw, rounding or copy: a SwiGLU input of 4096 x 28672 took 4.4 s of a
    certify key on an H100's host at both ends of its bucket); any other kind `host_values(gen, shape, values,
    dtype)` (float64 on the host) rounded into `dtype`. Undefined values under `shape_only`."""
    if values == "normal":
        return randn(gen, shape, dtype, device, normal_scale)
    if _SHAPE_ONLY.get():
        return _unfilled(shape, dtype, device)
    return from_numpy(host_values(gen, shape, values, dtype), get_dtype(dtype), device)


def uniform(gen: np.random.Generator, shape, dtype, device: str, low: float = -1.0, high: float = 1.0) -> Tensor:
    """Uniform values in [low, high), rounded once into `dtype` (undefined values under `shape_only`)."""
    if _SHAPE_ONLY.get():
        return _unfilled(shape, dtype, device)
    return from_numpy(gen.uniform(low, high, size=shape), get_dtype(dtype), device)


def randint(gen: np.random.Generator, shape, low: int, high: int, dtype, device: str) -> Tensor:
    """Integers in [low, high)."""
    d = get_dtype(dtype)
    return from_numpy(gen.integers(low, high, size=shape).astype(d.storage), d, device)
