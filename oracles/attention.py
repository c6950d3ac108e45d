"""Float64 references for the attention kernels: softmax(Q Kᵀ · scale + mask) V, one (batch, head) at a time.

Pure numpy, written from the definition and sharing nothing with the kernels it judges: scores in float64, masked
positions set to -inf, the row maximum subtracted before `exp`, normalised by the row sum, multiplied by V. Grouped-
query attention repeats each KV head for the `heads // kv_heads` query heads that share it (query head `h` reads KV
head `h // (heads // kv_heads)`).

Masks:
- causal, bottom-right aligned (a prefill continuing a KV cache): query row `i` of `q_len` may see key `j` of
  `kv_len` iff `j <= i + (kv_len - q_len)`; with `q_len == kv_len` this is the usual lower triangle;
- per-sequence KV lengths (decode): key `j` of sequence `b` is visible iff `j < lengths[b]`.

A row that sees no key at all (causal with `q_len > kv_len` for rows `i < q_len - kv_len`, `kv_len == 0`, or a decode
sequence of length 0) is DEFINED as zeros, with a zero error scale (the kernel must write exactly 0).

Error scale of an output element (b, h, i, d): `Σ_j p_ij · |v_jd|` from the reference probabilities, in float64 —
the size of the weighted sum the kernel rounds its way through, so an output that cancels to near zero is not judged
against its own near-zero value.
"""

from __future__ import annotations

import numpy as np

# The query heads that share a KV head are computed in one product when their score matrix (heads x q_len x visible
# keys) has at most this many elements (decode: 8 query rows against 8192 keys in one GEMM, not 8 GEMVs); larger
# ones (prefill) one head at a time, so the float64 scores stay a few hundred MB at most.
STACK_ELEMENTS = 1 << 22
# Query rows per block of a causal head computed one head at a time (each block against the keys it can see).
CAUSAL_ROWS = 512


def _floats(x) -> np.ndarray:
    """`x` as a numpy array of floating values, as it is when it is one (every float widens to float64 exactly)."""
    x = np.asarray(x)
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float64)


def _one_head(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, scale: float, abs_v=None):
    """q [M, D], k and v [N, D], visible [M, N] bool -> (out [M, D], error scale [M, D]). `abs_v`: |v| if the caller
    has it already."""
    scores = (q @ k.T) * scale
    scores = np.where(visible, scores, -np.inf)
    seen = visible.any(axis=1)
    row_max = np.where(seen, scores.max(axis=1, initial=-np.inf), 0.0)
    e = np.where(visible, np.exp(scores - row_max[:, None]), 0.0)
    total = e.sum(axis=1)
    p = e / np.where(seen, total, 1.0)[:, None]
    return p @ v, p @ (np.abs(v) if abs_v is None else abs_v)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    causal: bool,
    kv_lengths: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Reference attention and its error scale.

    q: [batch, heads, q_len, head_dim]; k, v: [batch, kv_heads, kv_len, head_dim] (any float values; computed in
    float64). `scale` multiplies Q Kᵀ. `causal`: bottom-right aligned mask (module docstring). `kv_lengths` [batch]:
    keys at or past a sequence's length are masked (None: every key is visible). Returns (out, error scale), both
    float64 [batch, heads, q_len, head_dim]."""
    q = np.asarray(q, dtype=np.float64)
    # k and v are widened to float64 one (batch, KV head) at a time, up to the sequence's length: a decode batch's
    # float16 caches are gigabytes in float64, and positions past a length are never read
    k, v = _floats(k), _floats(v)
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not a multiple of kv_heads={kv_heads}")
    group = heads // kv_heads
    rows = np.arange(q_len)[:, None]
    cols = np.arange(kv_len)[None, :]
    base = np.ones((q_len, kv_len), dtype=bool)
    if causal:
        base = base & (cols <= rows + (kv_len - q_len))
    if causal and kv_lengths is not None:
        raise ValueError("causal masks with per-sequence KV lengths are not defined here")
    out = np.zeros((batch, heads, q_len, head_dim))
    err = np.zeros_like(out)
    for b in range(batch):
        # positions at or past a sequence's length are not part of it (their contents may be anything, NaN too)
        n = kv_len if kv_lengths is None else int(kv_lengths[b])
        for kh in range(kv_heads):  # query heads kh * group .. (kh + 1) * group - 1 share KV head kh
            kb, vb = k[b, kh, :n].astype(np.float64), v[b, kh, :n].astype(np.float64)
            abs_v = np.abs(vb)
            first = kh * group
            if group * q_len * n <= STACK_ELEMENTS:
                stacked = q[b, first : first + group].reshape(group * q_len, head_dim)
                o, e = _one_head(stacked, kb, vb, np.tile(base[:, :n], (group, 1)), scale, abs_v)
                out[b, first : first + group] = o.reshape(group, q_len, head_dim)
                err[b, first : first + group] = e.reshape(group, q_len, head_dim)
                continue
            # causal: a block of query rows sees the keys up to its last row's diagonal only, so each block is
            # computed against those (about half the products of a long prefill, and no masked scores kept)
            step = CAUSAL_ROWS if causal else q_len
            for h in range(first, first + group):
                for r0 in range(0, q_len, max(step, 1)):
                    r1 = min(q_len, r0 + step)
                    c1 = min(n, r1 + kv_len - q_len) if causal else n
                    c1 = max(c1, 0)
                    out[b, h, r0:r1], err[b, h, r0:r1] = _one_head(
                        q[b, h, r0:r1], kb[:c1], vb[:c1], base[r0:r1, :c1], scale, abs_v[:c1]
                    )
    return out, err


def decode_attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, lengths: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """One query token per sequence against a contiguous KV cache.

    q: [batch, heads, head_dim]; k_cache, v_cache: [batch, kv_heads, capacity, head_dim]; lengths: [batch], the
    number of valid cache positions of each sequence. Returns (out, error scale), float64 [batch, heads, head_dim]."""
    out, err = attention(np.asarray(q)[:, :, None, :], k_cache, v_cache, scale, False, kv_lengths=lengths)
    return out[:, :, 0, :], err[:, :, 0, :]


def paged_decode_attention(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    block_table: np.ndarray,
    lengths: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """One query token per sequence against a paged KV cache.

    q: [batch, heads, head_dim]; k_pool, v_pool: [num_blocks, block_size, kv_heads, head_dim]; block_table:
    [batch, max_blocks] physical block ids, position `t` of sequence `b` living at
    `pool[block_table[b, t // block_size], t % block_size]`; lengths: [batch]. Entries of the table past a sequence's
    last block are never read. Returns (out, error scale), float64 [batch, heads, head_dim]."""
    k_pool, v_pool = _floats(k_pool), _floats(v_pool)  # gathered as they are, widened by `attention`
    table = np.asarray(block_table).astype(np.int64)
    lengths = np.asarray(lengths).astype(np.int64)
    batch = table.shape[0]
    block_size, kv_heads, head_dim = k_pool.shape[1:]
    longest = int(lengths.max()) if batch else 0
    # gather each sequence's cache into a contiguous [batch, kv_heads, longest, head_dim] array
    k = np.zeros((batch, kv_heads, longest, head_dim), dtype=k_pool.dtype)
    v = np.zeros((batch, kv_heads, longest, head_dim), dtype=v_pool.dtype)
    for b in range(batch):
        t = np.arange(int(lengths[b]))
        block = table[b, t // block_size]
        k[b, :, : t.size] = k_pool[block, t % block_size].transpose(1, 0, 2)
        v[b, :, : t.size] = v_pool[block, t % block_size].transpose(1, 0, 2)
    return decode_attention(q, k, v, lengths, scale)
