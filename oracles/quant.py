"""Float64 references for the quantized-weight products: dequantise in float64, then multiply.

Pure numpy, written from the formats' definitions and sharing nothing with the kernels it judges (the unpacking here
is integer arithmetic on numpy arrays, the product is `oracles.matmul.matmul`, itself numpy's float64 matmul).

Formats (W is the logical [K, N] weight of out = X @ W, X [M, K]):
- int4, GPTQ packing, group size G: qweight int32 [K/8, N], weight row k in bits 4 (k mod 8) .. 4 (k mod 8) + 3 of
  qweight[k // 8] (unsigned nibbles 0..15); qzeros int32 [K/G, N/8], zero point of group g, column n in bits
  4 (n mod 8) .. of qzeros[g, n // 8]; scales [K/G, N]. W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]. The zero
  points are stored as they are (no "+1" offset of GPTQ's first checkpoint format).
- int8, per output channel: qweight int8 [K, N], scales [N]; W[k, n] = q[k, n] * s[n].

Error scale: that of the product of the dequantised weights, |X| @ |W| (`oracles.matmul`), so an element that cancels
to near zero is judged against the size of its terms.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nbxcert.oracles.matmul import addmm_of, matmul

FORMATS = ("int4", "int8")


def unpack_int4_rows(packed: np.ndarray) -> np.ndarray:
    """int32 [R, C] holding 8 nibbles each along the rows -> [8 R, C] values 0..15 (row 8 r + i from bits 4 i)."""
    words = np.asarray(packed).astype(np.int64) & 0xFFFFFFFF
    rows, cols = words.shape
    out = np.empty((rows * 8, cols), dtype=np.int64)
    for i in range(8):
        out[i::8] = (words >> (4 * i)) & 0xF
    return out


def unpack_int4_cols(packed: np.ndarray) -> np.ndarray:
    """int32 [R, C] holding 8 nibbles each along the columns -> [R, 8 C] values 0..15 (column 8 c + i from bits 4 i)."""
    words = np.asarray(packed).astype(np.int64) & 0xFFFFFFFF
    rows, cols = words.shape
    out = np.empty((rows, cols * 8), dtype=np.int64)
    for i in range(8):
        out[:, i::8] = (words >> (4 * i)) & 0xF
    return out


def dequantize(fmt: str, qweight, scales, qzeros=None, group: int = 128) -> np.ndarray:
    """The float64 [K, N] weight of a quantized one (module docstring)."""
    s = np.asarray(scales, dtype=np.float64)
    if fmt == "int8":
        return np.asarray(qweight, dtype=np.float64) * s[None, :]
    if fmt == "int4":
        q = unpack_int4_rows(qweight).astype(np.float64)
        z = unpack_int4_cols(qzeros).astype(np.float64)
        g = np.arange(q.shape[0]) // group
        return (q - z[g]) * s[g]
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def dequant_matmul(
    x,
    fmt: str,
    qweight,
    scales,
    qzeros=None,
    group: int = 128,
    *,
    acc_eps: float,
    out_eps: float,
    product: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul,
) -> tuple[np.ndarray, np.ndarray]:
    """X @ dequantize(W) and its error scale |X| @ |W| (widened for a float32 accumulation as `oracles.matmul`;
    `product` as there)."""
    w = dequantize(fmt, qweight, scales, qzeros, group)
    return matmul(np.asarray(x, dtype=np.float64), w, acc_eps=acc_eps, out_eps=out_eps, product=product)


def dequant_matmul_of(xw: np.ndarray, abs_xw: np.ndarray, k: int, *, acc_eps: float, out_eps: float):
    """`dequant_matmul` from its two float64 products made elsewhere (a GPU's): xw = X @ W and abs_xw = |X| @ |W| over
    K terms, W the weight as `dequantize` states it."""
    return addmm_of(xw, abs_xw, k, acc_eps=acc_eps, out_eps=out_eps)
