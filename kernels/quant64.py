"""The float64 dequantization (`nbxcert.oracles.quant.dequantize`) evaluated on the GPU where the weights lie.

The same definition, element by element: int4 (GPTQ packing, group G), W[k, n] = (q[k, n] - z[k // G, n]) ·
s[k // G, n] with q the unsigned nibble at bits 4 (k mod 8) of qweight[k // 8, n] and z the one at bits 4 (n mod 8)
of qzeros[k // G, n // 8]; int8, W[k, n] = q[k, n] · s[n]. Every step is exact in float64 (integers below 16 times a
16-bit scale), so the device's W is the host's to the bit; the products X @ W and |X| @ |W| are then cuBLAS's DGEMM
(`products.products_on_device`). Nothing here shares code with the kernels it judges: they dequantize a
[BLOCK_K, BLOCK_N] tile at a time in float32 and round it to the activations' dtype; this writes one float64 element
a lane.

Why: on the host, the float64 weight of a 4096 x 28672 projection is 940 MB a copy, and `dequantize` makes several
(the unpacked nibbles, the gathered zero points and scales, the product), the weight and its absolute value then sent
to cuBLAS: 1.3 s for int4 on a 2-core host before any transfer (`benchmarks/bench_oracles.py --module quant`), at
each of a workload's largest quantized keys, where the device takes milliseconds.

Used by the quantized family's oracle adapter where `products.device_library` gives a cuBLAS (inputs on a GPU of the
cuda backend with libcublas; `NBXCERT_ORACLE_PRODUCTS=host` keeps the host's).
"""

from __future__ import annotations

from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.products import widened
from nbxcert.kernels.tensor import Tensor, empty

BLOCK = 1024  # weight elements a program


@jit
def _dequantize64_kernel(
    q, z, s64, w, K, N, q_r, q_c, z_r, z_c, GROUP: tl.constexpr, INT4: tl.constexpr, BLOCK: tl.constexpr
):
    """w[k, n], float64 contiguous [K, N], the logical weight (module docstring) from qweight `q` (rows `q_r`, columns
    `q_c` elements apart), qzeros `z` (int4 only; likewise `z_r`, `z_c`) and the scales widened to float64, `s64`
    (contiguous [K / GROUP, N] for int4, [1, N] for int8)."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < K * N
    k = at // N
    n = at % N
    if INT4:
        word = tl.load(q + (k // 8) * q_r + n * q_c, mask=inside, other=0).to(tl.int64)
        nibble = (word >> ((k % 8) * 4)) & 0xF
        g = k // GROUP
        zero_word = tl.load(z + g * z_r + (n // 8) * z_c, mask=inside, other=0).to(tl.int64)
        zero = (zero_word >> ((n % 8) * 4)) & 0xF
        scale = tl.load(s64 + g * N + n, mask=inside, other=0.0)
        value = (nibble - zero).to(tl.float64) * scale
    else:
        value = tl.load(q + k * q_r + n * q_c, mask=inside, other=0).to(tl.float64) * tl.load(
            s64 + n, mask=inside, other=0.0
        )
    tl.store(w + at, value, mask=inside)


def dequantized(fmt: str, qweight: Tensor, scales: Tensor, qzeros: Tensor | None, group: int) -> Tensor:
    """The float64 [K, N] weight of a quantized one (formats as `oracles.quant`), made on the device it lies on."""
    from nbxcert.kernels.launch import cdiv

    int4 = fmt == "int4"
    if fmt not in ("int4", "int8"):
        raise ValueError(f"unknown format {fmt!r}; known: int4, int8")
    if int4 and qzeros is None:
        raise ValueError("int4 dequantization needs qzeros (the zero points, int32 [K / group, N / 8])")
    rows, n = qweight.shape
    k = rows * 8 if int4 else rows
    s64, _ = widened(scales if scales.dim() == 2 else scales.unsqueeze(0), 1, absolute=False)
    z = qzeros if int4 else qweight  # never read for int8
    w = empty((k, n), "float64", qweight.device)
    grid = (cdiv(k * n, BLOCK),)
    q_r, q_c = qweight.strides
    z_r, z_c = z.strides
    _dequantize64_kernel[grid](qweight, z, s64, w, k, n, q_r, q_c, z_r, z_c, GROUP=group, INT4=int4, BLOCK=BLOCK)
    return w


settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
