"""The float64 attention reference (`nbxcert.oracles.attention`) evaluated on the GPU where the inputs lie.

The same definition, step for step: scores Q Kᵀ in float64 times `scale` (a float64, as the host's), masked
positions -inf, the row maximum subtracted before `exp`, normalised by the row sum, multiplied by V; the error scale
P·|V|; a row that sees no key is zeros. Only where each step runs differs: the operands are widened to float64 on
the device (`products.widened`), the products are cuBLAS's DGEMM, and the masked softmax is `_softmax64_kernel`, one
program a score row, in float64. What differs from the host's answer is the summation order of the products and the
last bit of `exp` (libdevice's against numpy's): within a relative 1e-12 in the tests, against tolerances of 1e-3
and more.

Why: on the host, widening a decode cache to float64 and the causal prefill's exponentials were most of an
attention key's certify time (an H100 run of llama-3-8b, 2026-12-05: 70 s of the run's 543 s in its 110 attention
keys' oracles, up to 6.8 s a key; `benchmarks/README.md`, throughput).

Used by the attention family's oracle adapters where `products.in_force` says "device" (inputs on a GPU of the cuda
backend with libcublas; `NBXCERT_ORACLE_PRODUCTS=host` keeps the host's). Paged decode keeps the host's (its pool
is read through a block table).
"""

from __future__ import annotations

import numpy as np

from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.products import prefix, widened
from nbxcert.kernels.tensor import Tensor, empty, from_numpy

# Score elements one step holds on the device (float64: 512 MiB): a step takes as many KV heads of one sequence as
# fit, at least one (a 4096-token causal prefill with 4 query heads a KV head: 64 Mi scores, one KV head a step).
STEP_ELEMENTS = 1 << 26
SOFTMAX_BLOCK = 1024


@jit
def _softmax64_kernel(s, scale_ptr, n, q_len, offset, CAUSAL: tl.constexpr, BLOCK: tl.constexpr):
    """Row r of the float64 scores s [rows, n] (contiguous; query index r % q_len) in place: p = exp(x - max) / sum
    over the visible keys, x = s * scale, 0 elsewhere and in a row that sees none. Visible: j < n, and with CAUSAL
    j <= i + offset (offset = kv_len - q_len: bottom-right aligned)."""
    row = tl.program_id(0).to(tl.int64)
    base = s + row * n
    scale = tl.load(scale_ptr)
    limit = n
    if CAUSAL:
        limit = tl.minimum(n, (row % q_len) + offset + 1)
    top = tl.full([BLOCK], float("-inf"), tl.float64)
    for c in range(0, n, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < limit, other=float("-inf")) * scale
        top = tl.maximum(top, x)
    m = tl.max(top, axis=0)
    m = tl.where(m > float("-inf"), m, 0.0)  # a row that sees no key: every term below is 0, and so is its sum
    acc = tl.zeros([BLOCK], tl.float64)
    for c in range(0, n, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < limit, other=0.0) * scale
        acc += tl.where(cols < limit, tl.exp(x - m), 0.0)
    total = tl.sum(acc, axis=0)
    total = tl.where(total > 0.0, total, 1.0)
    for c in range(0, n, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < limit, other=0.0) * scale
        tl.store(base + cols, tl.where(cols < limit, tl.exp(x - m), 0.0) / total, mask=cols < n)


def attention_on_device(
    q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, lengths: np.ndarray | None, lib
) -> tuple[np.ndarray, np.ndarray]:
    """`oracles.attention.attention`'s (out, error scale) for tensors as they lie on the device: q [batch, heads,
    q_len, dim], k and v [batch, kv_heads, kv_len, dim] (any strides), `lengths` [batch] (keys at or past a sequence's
    length are not read: a cache holds NaN there) or None; `lib` the cuBLAS to multiply with (`backends.cublas`)."""
    from nbxcert.kernels.backends import cublas, cuda

    batch, heads, q_len, dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not a multiple of kv_heads={kv_heads}")
    if causal and lengths is not None:
        raise ValueError("causal masks with per-sequence KV lengths are not defined here")
    group = heads // kv_heads
    rows = group * q_len
    out = np.zeros((batch, heads, q_len, dim))
    err = np.zeros_like(out)
    if batch == 0 or q_len == 0 or kv_len == 0:
        return out, err  # every row sees no key: zeros
    scale_t = from_numpy(np.array([scale], dtype=np.float64), "float64", q.device)
    index = q.device.index or 0
    # One step's buffers, made once for the longest sequence and used by every step (a sequence's own length uses
    # their prefixes): a size a sequence, freed each time, would leave the memory pool a block of every length kept
    step = max(1, min(kv_heads, STEP_ELEMENTS // (rows * kv_len)))
    size = {"q": step * rows * dim, "k": step * dim * kv_len, "s": step * rows * kv_len, "v": step * kv_len * dim}
    size.update(v_abs=size["v"], e=size["q"])  # |V|, and the error scale P·|V| (the output P·V reuses q's)
    buf = {name: empty((count,), "float64", q.device) for name, count in size.items()}
    for b in range(batch):
        n = kv_len if lengths is None else int(lengths[b])
        if n == 0:
            continue  # every row sees no key: zeros
        for h0 in range(0, kv_heads, step):
            h1 = min(kv_heads, h0 + step)
            hs = h1 - h0
            qg = q[b, h0 * group : h1 * group]  # [hs * group, q_len, dim]: a KV head's query heads, then its rows
            q64, _ = widened(_grouped(qg, hs, rows, dim), hs, (buf["q"],), absolute=False)
            kt64, _ = widened(k[b, h0:h1, :n].transpose(1, 2), hs, (buf["k"],), absolute=False)  # [hs, dim, n]
            scores = prefix(buf["s"], (hs, rows, n))
            cublas.gemm(lib, index, q64.data_ptr(), kt64.data_ptr(), scores.data_ptr(), hs, rows, n, dim)
            _softmax64_kernel[(hs * rows,)](
                scores, scale_t, n, q_len, n - q_len, CAUSAL=bool(causal), BLOCK=SOFTMAX_BLOCK
            )
            v64, v_abs = widened(v[b, h0:h1, :n], hs, (buf["v"], buf["v_abs"]))  # [hs, n, dim]
            o, e = prefix(buf["q"], (hs, rows, dim)), prefix(buf["e"], (hs, rows, dim))  # q64 is read by now
            cublas.gemm(lib, index, scores.data_ptr(), v64.data_ptr(), o.data_ptr(), hs, rows, dim, n)
            cublas.gemm(lib, index, scores.data_ptr(), v_abs.data_ptr(), e.data_ptr(), hs, rows, dim, n)
            if q.device.type == "cuda":
                cuda.synchronize()
            out[b, h0 * group : h1 * group] = o.numpy().reshape(hs * group, q_len, dim)
            err[b, h0 * group : h1 * group] = e.numpy().reshape(hs * group, q_len, dim)
    return out, err


def _grouped(qg: Tensor, hs: int, rows: int, dim: int) -> Tensor:
    """q's heads of `hs` KV heads [hs * group, q_len, dim] as [hs, group * q_len, dim] (a copy on the device where
    the strides do not merge)."""
    from nbxcert.errors import ViewError

    try:
        return qg.view(hs, rows, dim)
    except ViewError:
        return qg.contiguous().view(hs, rows, dim)


settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
