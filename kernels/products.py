"""Which float64 matrix product the oracles' largest products use: numpy's on the host, or cuBLAS's DGEMM on the GPU.

The float64 references in `nbxcert.oracles` take their matrix product as an argument (`product=`, numpy's `matmul` by
default). A kernel family's oracle adapter asks `product_for(device)` for the one to hand them:

    NBXCERT_ORACLE_PRODUCTS=auto     (default) cuBLAS where the inputs lie on a GPU of the cuda backend and libcublas
                                     loads, else numpy; `certify` and `doctor` print which is in force and why
    NBXCERT_ORACLE_PRODUCTS=host     numpy on the host
    NBXCERT_ORACLE_PRODUCTS=device   cuBLAS on the GPU the inputs lie on (`backends.cublas`); an error naming where
                                     libcublas was looked for if none loads, or if the inputs are not on a GPU

Both are float64 products of the same float64 operands (only the summation order differs: a relative difference near
1e-16), so a verdict does not depend on the choice; its time does. matmul's oracle (matmul, addmm, bmm, baddbmm, the
GEMV) takes `device_products`: its operands are widened on the GPU where they lie, so no float64 operand crosses; fused
MoE's (`products_on_device` an expert) widens each routed expert's weight there, only the pairs' rows of its input
crossing as they are stored; the dequantizing products dequantize the weight there (`quant64`) and multiply it by
`products_on_device`; conv2d (a product a window position) takes `product_for`, whose float64 operands (made on the
host) cross to the GPU and the products back; flash and decode attention take `device_library` and evaluate their
whole reference there (`attention64`). Measured on an H200 (benchmarks/README.md, throughput): a decode LM-head
key of qwen2.5-7b (64 tokens, a 152064 x 3584 weight) made its inputs and oracle in 3.6 s with the GPU's products
against 20.0 s with numpy's, whose float64 widening of the weight was 17 s of it; hence the default. `describe(device)`
says which is in force, for `nbxcert doctor` and `certify`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from nbxcert.errors import UsageError
from nbxcert.kernels.backends import on_gpu
from nbxcert.kernels.jit import jit, settle_keys, tl

CHOICES = ("auto", "host", "device")


def choice() -> str:
    """NBXCERT_ORACLE_PRODUCTS, checked (default `auto`)."""
    text = os.environ.get("NBXCERT_ORACLE_PRODUCTS", "").strip().lower() or "auto"
    if text not in CHOICES:
        raise UsageError(f"NBXCERT_ORACLE_PRODUCTS={text} is not one of {', '.join(CHOICES)}")
    return text


def in_force(device, backend: str | None = None) -> tuple[str, str]:
    """("host" or "device", why) for inputs on `device`: NBXCERT_ORACLE_PRODUCTS's choice, `auto` resolved (device
    where the inputs lie on a GPU of the cuda backend and libcublas loads). `device` chosen outright refuses inputs
    that are not on a GPU, and a libcublas that does not load, with an error naming it."""
    chosen = choice()
    if chosen == "host":
        return "host", "NBXCERT_ORACLE_PRODUCTS=host"
    if chosen == "device":
        _require_gpu(device, backend)
        from nbxcert.kernels.backends import cublas

        cublas.load()
        return "device", "NBXCERT_ORACLE_PRODUCTS=device"
    if not on_gpu(device, backend):
        return "host", "the inputs are not on a GPU"
    from nbxcert.errors import BackendUnavailable
    from nbxcert.kernels.backends import cublas

    try:
        cublas.load()
    except BackendUnavailable as e:
        return "host", f"no libcublas: {e}"
    return "device", "a GPU with libcublas"


def product_for(device) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The float64 matrix product for an oracle whose inputs lie on `device` (see the module's table)."""
    if in_force(device)[0] == "host":
        return np.matmul
    from nbxcert.kernels.backends import cublas

    lib = cublas.load()
    name = str(device)
    return lambda a, b: cublas.matmul64(a, b, name, lib)


def device_library(device):
    """The cuBLAS an oracle whose inputs lie on `device` multiplies with where `in_force` says "device"; None where
    the host computes (the caller uses the host's reference)."""
    if in_force(device)[0] == "host":
        return None
    from nbxcert.kernels.backends import cublas

    return cublas.load()


def device_products(a, b, lib=None) -> tuple[np.ndarray, np.ndarray] | None:
    """(a @ b, |a| @ |b|) in float64 for operand tensors as they lie ([..., M, K] and [..., K, N] views of 16- or
    32-bit floats, leading dimensions broadcast), computed on their GPU: each operand widened to float64 there by
    `_widen_kernel` (its absolute value beside it), the products by DGEMM, the two results copied back. None when the
    host computes them (`in_force`: host): the caller widens the operands on the host, as before. No
    float64 operand crosses to the GPU, so a decode LM-head key's 4.4 GB weight costs a widening on the device."""
    if in_force(a.device)[0] == "host":
        return None
    from nbxcert.kernels.backends import cublas

    return products_on_device(a, b, cublas.load() if lib is None else lib)


def products_on_device(a, b, lib) -> tuple[np.ndarray, np.ndarray]:
    """`device_products` with cuBLAS `lib` (a stand-in in tests, where the "device" is the interpreter's host)."""
    from nbxcert.kernels.backends import cublas, cuda
    from nbxcert.kernels.tensor import empty

    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"operands a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    lead = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    nb = int(np.prod(lead, dtype=np.int64)) if lead else 1
    shape = (*lead, m, n)
    if nb * m * n == 0 or k == 0:
        return np.zeros(shape), np.zeros(shape)
    a64, a_abs = widened(a.expand(*lead, m, k) if lead else a, nb)
    b64, b_abs = widened(b.expand(*lead, k, n) if lead else b, nb)
    z, z_abs = (empty((nb, m, n), "float64", a.device) for _ in range(2))
    index = a.device.index or 0
    cublas.gemm(lib, index, a64.data_ptr(), b64.data_ptr(), z.data_ptr(), nb, m, n, k)
    cublas.gemm(lib, index, a_abs.data_ptr(), b_abs.data_ptr(), z_abs.data_ptr(), nb, m, n, k)
    if a.device.type == "cuda":
        cuda.synchronize()
    return z.numpy().reshape(shape), z_abs.numpy().reshape(shape)


WIDEN_BLOCK = 1024


@jit
def _widen_kernel(
    src, dst, dst_abs, rows, cols, s_b, s_r, s_c, BF16_BITS: tl.constexpr, ABS: tl.constexpr, BLOCK: tl.constexpr
):
    """dst[b] = float64(src[b]) and, with ABS, dst_abs[b] = |dst[b]|, contiguous [rows, cols], for the batch of
    program axis 1; src element (b, r, c) at b * s_b + r * s_r + c * s_c (its 16-bit patterns when BF16_BITS, widened
    by a shift)."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < rows * cols
    at = batch * s_b + (offs // cols) * s_r + (offs % cols) * s_c
    if BF16_BITS:
        bits = tl.load(src + at, mask=inside, other=0).to(tl.int32) & 0xFFFF
        x = (bits << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        x = tl.load(src + at, mask=inside, other=0.0).to(tl.float64)
    to = batch * rows * cols + offs
    tl.store(dst + to, x, mask=inside)
    if ABS:
        tl.store(dst_abs + to, tl.abs(x), mask=inside)


def widened(t, nb: int, into=None, absolute: bool = True):
    """The [nb, rows, cols] float64 contiguous copies of a (batched) matrix view `t` and, with `absolute`, of its
    absolute values (else None); `into`: flat float64 buffers of at least that many elements to write them into
    (their prefixes; one a copy made), else new ones."""
    from nbxcert.kernels.launch import cdiv
    from nbxcert.kernels.tensor import Tensor, empty

    rows, cols = t.shape[-2], t.shape[-1]
    s_b = t.strides[0] if t.dim() == 3 else 0
    if t.dim() > 3:  # leading dimensions folded into one (a broadcast view's stride-0 dimensions are copied out)
        t = t.contiguous().reshape(nb, rows, cols)
        s_b = t.strides[0]
    s_r, s_c = t.strides[-2], t.strides[-1]
    made = 2 if absolute else 1
    if into is None:
        copies = [empty((nb, rows, cols), "float64", t.device) for _ in range(made)]
    else:
        copies = [prefix(buf, (nb, rows, cols)) for buf in into[:made]]
    wide, wide_abs = copies[0], (copies[1] if absolute else None)
    bf16 = t.dtype.name == "bfloat16"
    if bf16:  # the same bytes read as int16 (same element size, same strides), as `judge` reads them
        t = Tensor(t.untyped_storage(), t.shape, t.strides, "int16", t.storage_offset())
    grid = (cdiv(rows * cols, WIDEN_BLOCK), nb)
    _widen_kernel[grid](t, wide, copies[-1], rows, cols, s_b, s_r, s_c, BF16_BITS=bf16, ABS=absolute, BLOCK=WIDEN_BLOCK)
    return wide, wide_abs


def prefix(flat, shape):
    """The first prod(shape) elements of the flat contiguous tensor `flat`, viewed as a contiguous `shape`."""
    count = int(np.prod(shape, dtype=np.int64))
    if count > flat.numel:
        raise ValueError(f"a buffer of {flat.numel} elements cannot hold {tuple(shape)}")
    return flat[:count].view(*shape)


def _require_gpu(device, backend: str | None = None) -> None:
    """NBXCERT_ORACLE_PRODUCTS=device is in force: refuse inputs that do not lie on a GPU of the cuda backend."""
    if not on_gpu(device, backend):
        raise UsageError(
            f"NBXCERT_ORACLE_PRODUCTS=device, but the inputs lie on {device} with the "
            f"{backend or _backend_name()} backend: cuBLAS products need an NVIDIA GPU"
        )


def _backend_name() -> str:
    from nbxcert.kernels.backends import select

    return select().name


def describe(device, backend: str | None = None) -> str:
    """One line: which product the oracles use for inputs on `device` (`backend`: the backend's name, when the caller
    knows it without fixing the process's), and why. NBXCERT_ORACLE_PRODUCTS=device with no GPU or no libcublas
    raises."""
    where, why = in_force(device, backend)
    if where == "host":
        return f"numpy on the host ({why}; NBXCERT_ORACLE_PRODUCTS=device: cuBLAS on the GPU)"
    from nbxcert.kernels.backends import cublas

    return f"cuBLAS DGEMM on {device} ({cublas.load().path}; {why}; NBXCERT_ORACLE_PRODUCTS=host: numpy)"


settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
