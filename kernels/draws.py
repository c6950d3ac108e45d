"""Seeded normal draws made where a tensor lies: one Triton kernel instead of the host's draws, rounding and copy.

On a GPU, the host's part of a key's inputs (drawing a model weight or a decode cache in float32, rounding it into
float16 or bfloat16, copying it to the device) is the largest part of a certify run's time after the checks (an H200
run of llama-3-8b: 23-34% of each key). `device_normal` makes the same kind of input on the device: a Philox seed
taken from the input maker's generator (one draw), then one kernel that draws float32 normals (Triton's `randn`),
scales them, puts NaN where a mask says (a cache's positions past a sequence's length) and rounds once into the
tensor's dtype. The values depend on the seed alone: the same on the GPU and under Triton's interpreter, but for the
last bit of a transcendental's rounding in the Box-Muller transform.

`kernels.inputs.randn` draws this way every tensor of at least ON_GPU_FROM elements on a GPU (the host's float64
draws of a 4096 x 3584 activation alone took 0.3 s).
"""

from __future__ import annotations

import math

import numpy as np

from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.tensor import Tensor, empty, from_numpy

# The dtypes a device draw makes, and the least element count `inputs.randn` draws on a GPU.
ON_DEVICE = ("float16", "bfloat16", "float32")
ON_GPU_FROM = 1 << 16
NORMAL_BLOCK = 1024
MASK_DIMS = 4  # a `nan_where` mask of a device draw: at most this many dimensions


# Sizes, strides and the seed are not specialised on (their value 1 or their divisibility by 16 would compile a kernel
# for each kind of shape a certify run meets, each compile in the runner's way)
@jit(do_not_specialize=["n", "seed", "d1", "d2", "d3", "m0", "m1", "m2", "m3"])
def _normal_kernel(
    out,
    mask,
    n,
    seed,
    scale,
    d1,
    d2,
    d3,
    m0,
    m1,
    m2,
    m3,
    HAS_MASK: tl.constexpr,
    BF16_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[i] = the normal draw of Philox counter i under `seed`, times `scale` (float32), NaN where the mask holds,
    rounded to nearest even into out's dtype (bfloat16 by its bits: out is then the int16 view of its storage).

    out: contiguous, n elements of shape [d0, d1, d2, d3]. mask: uint8, element (i0, i1, i2, i3) at
    i0 * m0 + i1 * m1 + i2 * m2 + i3 * m3 (stride 0 where it broadcasts)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    z = tl.randn(seed, offs) * scale
    if HAS_MASK:
        i3 = offs % d3
        rest = offs // d3
        i2 = rest % d2
        rest = rest // d2
        i1 = rest % d1
        i0 = rest // d1
        hit = tl.load(mask + i0 * m0 + i1 * m1 + i2 * m2 + i3 * m3, mask=inside, other=0)
        z = tl.where(hit != 0, float("nan"), z)
    if BF16_BITS:
        bits = z.to(tl.int32, bitcast=True)
        tl.store(out + offs, ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.int16), mask=inside)
    else:
        tl.store(out + offs, z.to(out.dtype.element_ty), mask=inside)


def device_normal(gen: np.random.Generator, shape, dtype, device, scale: float = 1.0, nan_where=None) -> Tensor:
    """`randn` drawn where the tensor lies: a Philox seed taken from `gen` (one draw), then one kernel that draws
    float32 normals (Triton's `randn`), scales them, puts NaN where `nan_where` holds and rounds once into `dtype`
    (float16, bfloat16 or float32). The values depend on the seed alone (the same on the GPU and under Triton's
    interpreter, but for the last bit of a transcendental's rounding)."""
    from nbxcert.kernels.launch import cdiv

    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    out = empty(shape, get_dtype(dtype), device)
    seed = int(gen.integers(1 << 32, 1 << 62))  # always a 64-bit argument (one compiled kernel)
    dims = (1,) * (MASK_DIMS - len(shape)) + shape
    strides = (0,) * MASK_DIMS
    mask = out  # unread without a mask
    if nan_where is not None:
        where = np.asarray(nan_where, dtype=bool)
        where = where.reshape((1,) * (MASK_DIMS - where.ndim) + where.shape)
        np.broadcast_shapes(where.shape, dims)  # refuses a mask that does not broadcast to the shape
        mask = from_numpy(np.ascontiguousarray(where, dtype=np.uint8), "uint8", device)
        own = [int(np.prod(where.shape[i + 1 :], dtype=np.int64)) for i in range(MASK_DIMS)]
        strides = tuple(0 if where.shape[i] == 1 else own[i] for i in range(MASK_DIMS))
    target = out
    bf16 = out.dtype.name == "bfloat16"
    if bf16:  # the same bytes as int16, rounded by their bits (as `judge` reads them)
        target = Tensor(out.untyped_storage(), out.shape, out.strides, "int16", out.storage_offset())
    grid = (cdiv(n, NORMAL_BLOCK),)
    _normal_kernel[grid](
        target,
        mask,
        n,
        seed,
        float(scale),
        *dims[1:],
        *strides,
        HAS_MASK=nan_where is not None,
        BF16_BITS=bf16,
        BLOCK=NORMAL_BLOCK,
    )
    return out


settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
