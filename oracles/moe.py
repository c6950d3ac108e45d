"""Float64 references for the mixture-of-experts kernels: the expert alignment, the routed expert GEMM and the top-k
sum, each written from its definition and sharing nothing with the kernels it judges.

Words: a token `t` of a batch of M tokens is routed to `top_k` experts `topk_ids[t, j]` with router weights
`topk_weights[t, j]`; pair `p = t·top_k + j` is one (token, expert) assignment, so there are P = M·top_k pairs.

`align` (judges `moe_align`, integers, exact): the pairs grouped by expert, experts in increasing order and, within
one expert, pairs in increasing `p`; each expert's group is padded with the sentinel P up to a multiple of `block`; an
expert with no pair takes no block. Returns the sorted pair ids (length `P + min(E, P)·(block - 1)`, the most the
padding can need, the tail past the padded count filled with P), the expert of each block (-1 for blocks past the
padded count) and the padded count. A pair whose expert lies outside [0, E) is dropped (placed nowhere).

`fused_moe` (judges `fused_moe`): output row `p` is `w_p · (a_row · W[e_p]ᵀ)` with `w_p` the pair's router weight
(when `mul_weight`), `e_p` its expert and `a_row` the token's row of `a` (or, `pair_rows`, row `p` of `a`: the down
projection's input holds one row per pair). It is computed pair by pair from the routing, never through the aligned
block layout the kernel uses. Error scale: `|w_p| · (|a_row| @ |W[e_p]|ᵀ)`, widened for a float32 accumulation of K
terms by `growth` exactly as `oracles.matmul` states it (Higham and Mary's probabilistic bound).

`moe_sum`: out[t] = Σ_j x[t, j] over the top_k rows of each token, scale Σ_j |x[t, j]| (widened for float32 sums).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nbxcert.oracles.matmul import growth


def align(topk_ids: np.ndarray, experts: int, block: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(sorted pair ids, expert id per block, padded count) of `topk_ids` [M, top_k] for `experts` experts."""
    flat = np.asarray(topk_ids).reshape(-1).astype(np.int64)
    pairs = flat.size
    length = pairs + min(experts, pairs) * (block - 1)
    sorted_ids = np.full(length, pairs, dtype=np.int64)
    expert_ids = np.full(-(-length // block), -1, dtype=np.int64)
    pos = 0
    for e in range(experts):
        members = np.flatnonzero(flat == e)  # increasing pair index
        if members.size == 0:
            continue
        sorted_ids[pos : pos + len(members)] = members
        blocks = -(-len(members) // block)
        expert_ids[pos // block : pos // block + blocks] = e
        pos += blocks * block
    return sorted_ids, expert_ids, pos


def fused_moe(
    a: np.ndarray,
    w: np.ndarray,
    topk_weights: np.ndarray,
    topk_ids: np.ndarray,
    *,
    product: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul,
    **terms,
) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's expert output [P, N] and its error scale, float64 (`product`: the float64 matrix product, as
    `oracles.matmul.addmm` takes it; `terms`: `fused_moe_of`'s pair_rows, mul_weight, acc_eps and out_eps).

    a: [M, K] (or [P, K] with `pair_rows`); w: [E, N, K] (each expert's weight as nn.Linear stores it, out x in);
    topk_weights, topk_ids: [M, top_k]. A pair whose expert is outside [0, E) is not computed (NaN: never compared,
    since the kernel leaves its row unwritten)."""
    a = np.asarray(a, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)

    def expert_products(e: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        picked = a[rows]
        return product(picked, w[e].T), product(np.abs(picked), np.abs(w[e]).T)

    return fused_moe_of(expert_products, w.shape, topk_weights, topk_ids, **terms)


def fused_moe_of(
    expert_products: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]],
    w_shape: tuple[int, int, int],
    topk_weights: np.ndarray,
    topk_ids: np.ndarray,
    *,
    pair_rows: bool,
    mul_weight: bool,
    acc_eps: float,
    out_eps: float,
) -> tuple[np.ndarray, np.ndarray]:
    """`fused_moe` from each routed expert's two float64 products, made wherever its weight lies:
    `expert_products(e, rows)` gives `(a[rows] @ W[e]ᵀ, |a[rows]| @ |W[e]|ᵀ)`, [len(rows), N], for the rows of `a` of
    expert `e`'s pairs; `w_shape` is W's [E, N, K]. The routing, the router weights and the error scale are this
    function's own."""
    experts, n, k = w_shape
    ids = np.asarray(topk_ids).reshape(-1).astype(np.int64)
    weights = np.asarray(topk_weights, dtype=np.float64).reshape(-1)
    top_k = np.asarray(topk_ids).shape[-1]
    value = np.full((ids.size, n), np.nan)
    scale = np.full((ids.size, n), np.nan)
    # pairs that share an expert are multiplied together only to use one float64 matrix product per expert; each
    # row is still its own token's row times its own expert's weight
    for e in np.unique(ids):
        if not 0 <= e < experts:
            continue
        pairs = np.flatnonzero(ids == e)
        product, product_abs = expert_products(int(e), pairs if pair_rows else pairs // top_k)
        factor = weights[pairs][:, None] if mul_weight else 1.0
        value[pairs] = factor * product
        scale[pairs] = np.abs(factor) * product_abs
    return value, scale * growth(k, acc_eps, out_eps)


def moe_sum(x: np.ndarray, *, acc_eps: float, out_eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x [M, top_k, N] summed over top_k: ([M, N], scale)."""
    x = np.asarray(x, dtype=np.float64)
    return x.sum(axis=1), np.abs(x).sum(axis=1) * growth(x.shape[1], acc_eps, out_eps)
