"""Float64 reference of one llama-style decoder layer, composed from the kernel oracles (the model-level benchmark's
judge, `benchmarks/bench_model.py`).

Pure numpy, sharing nothing with the kernels: every step is the oracle of the op it stands for, on float64 values of
the previous step (no intermediate rounding to the half-precision dtype the kernels store), in the data flow an
application writes for a decoder layer:

    x = embed[ids]                            the residual stream
    h = rmsnorm(x, input_norm)
    q, k, v = split(h @ qkvᵀ); rope(q), rope(k) at `positions`
    a = attention(q, k, v)                    prefill: causal over the T tokens; decode: each sequence's one query
                                              against its cached keys and values followed by its own new k, v
    o = a @ oᵀ
    s = o + x;  h2 = rmsnorm(s, post_norm)    (the fused add_rmsnorm; s is the layer's residual output)
    out = silu(g) * u  with  [g | u] = h2 @ gate_upᵀ;  then out @ downᵀ

Weights are stored as nn.Linear stores them, [out_features, in_features]. Error scales: the layer's output is judged
by the rule its last op is certified at, `|out - ref| <= tol · scale + half an ulp`, with the down projection's scale
`|y| @ |down|ᵀ` (`oracles.matmul`) and the residual's `|x| + |a| @ |o|ᵀ` (the sum of its terms, the o-projection's
term at the size of the product it came from). Every upstream error is in the output being judged, so this is a
statement about the whole layer, not only its last op: a correct chain meets it because an upstream error of a few
units of the dtype's rounding, entering a K-term product with random signs, grows like sqrt(K) while the scale grows
like K; a skipped op gives an error of the size of the output itself. The same margin makes the rule loose for a small
error at large K (a weight a few percent off at K = 14336 passes it), which is why the benchmark checks the relative
norm error too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from nbxcert.oracles import attention as _attention
from nbxcert.oracles import elementwise as _elementwise
from nbxcert.oracles import matmul as _matmul
from nbxcert.oracles import rows as _rows

ACC_EPS = 2.0**-23  # the products accumulate in float32 (oracles.matmul's growth term)
WEIGHTS = ("embed", "input_norm", "qkv", "o", "post_norm", "gate_up", "down")


def _linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ wᵀ in float64 for a weight stored [out, in]."""
    return np.asarray(x, dtype=np.float64) @ np.asarray(w, dtype=np.float64).T


def decoder_layer(
    weights: Mapping[str, np.ndarray],
    ids: np.ndarray,
    positions: np.ndarray,
    cos_sin_cache: np.ndarray,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float,
    out_eps: float,
    style: str = "neox",
    past: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None,
    last: int | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The layer's output and residual stream, each as (reference, error scale), float64 [rows, hidden].

    weights: `WEIGHTS` as float64 arrays ([out, in] for the products, [hidden] for the norms); `embed` may be any
    object whose `[ids]` gives float64 rows (a vocabulary-sized table need not be widened whole).
    ids, positions: [T] (prefill: one sequence of T tokens, causal) or [B] (decode: one new token per sequence).
    cos_sin_cache: [max_position, head_dim], cos then sin (the rope kernel's layout); every head dim rotates.
    past: decode only, `past(b) -> (k, v)` of sequence b, each [kv_heads, P, head_dim]: the cached tokens before the
    new one (already rotated), which is appended as position P. None: prefill.
    last: prefill only, judge the last `last` tokens only (the ones with the longest context; everything before
    attention is still computed for all T); None: all.
    eps: the norms' epsilon as the kernels use it (float32(eps)); out_eps: the output dtype's epsilon (the products'
    float32 accumulation widens the scale past K = (2^13 - 4)^2 for float16, see `oracles.matmul`)."""
    n_tokens = len(ids)
    nh, nkv, d = heads, kv_heads, head_dim
    x = np.asarray(weights["embed"][np.asarray(ids, dtype=np.int64)], dtype=np.float64)
    h, _ = _rows.rmsnorm(x, weights["input_norm"], eps)
    qkv = _linear(h, weights["qkv"])
    q = qkv[:, : nh * d].reshape(n_tokens, nh, d)
    k = qkv[:, nh * d : (nh + nkv) * d].reshape(n_tokens, nkv, d)
    v = qkv[:, (nh + nkv) * d :].reshape(n_tokens, nkv, d)
    q, _ = _elementwise.rope(q, positions, cos_sin_cache, d, style)
    k, _ = _elementwise.rope(k, positions, cos_sin_cache, d, style)
    scale = 1.0 / math.sqrt(d)
    if past is None:
        rows = n_tokens if last is None else min(int(last), n_tokens)
        keep = slice(n_tokens - rows, n_tokens)
        # the last `rows` queries against all T keys, causal aligned bottom-right: exactly those rows of the full
        # causal attention
        qb = q[keep].transpose(1, 0, 2)[None]
        a, _ = _attention.attention(qb, k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None], scale, True)
        a = a[0].transpose(1, 0, 2).reshape(rows, nh * d)
        x = x[keep]
    else:
        a = np.empty((n_tokens, nh * d))
        for b in range(n_tokens):
            k_past, v_past = past(b)
            kb = np.concatenate([np.asarray(k_past, dtype=np.float64), k[b][:, None, :]], axis=1)[None]
            vb = np.concatenate([np.asarray(v_past, dtype=np.float64), v[b][:, None, :]], axis=1)[None]
            ab, _ = _attention.attention(q[b][None, :, None, :], kb, vb, scale, False)
            a[b] = ab.reshape(nh * d)
    o, o_scale = _matmul.matmul(a, np.asarray(weights["o"], dtype=np.float64).T, acc_eps=ACC_EPS, out_eps=out_eps)
    s, _ = _rows.residual_sum(o, x)
    h2, _ = _rows.rmsnorm(s, weights["post_norm"], eps)
    y, _ = _elementwise.silu_and_mul(_linear(h2, weights["gate_up"]))
    down = np.asarray(weights["down"], dtype=np.float64).T
    out, out_scale = _matmul.matmul(y, down, acc_eps=ACC_EPS, out_eps=out_eps)
    return {"out": (out, out_scale), "residual": (s, np.abs(x) + o_scale)}
