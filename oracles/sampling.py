"""Float64 references for the sampling kernels: argmax, top-k, log-softmax and cross-entropy over the last dimension.

Pure numpy in float64, written from the definitions and sharing nothing with the kernels they judge. Every function
returns `(reference, error scale)` pairs (float64 arrays; indices as float64 integers, which `kernels/compare.py`
compares exactly for integer outputs).

Order (argmax, topk), the definition the kernels are held to: elements rank by value, largest first; NaN ranks above
every number (as numpy.argmax and torch.topk treat it); equal values (+0.0 and -0.0 included), and NaNs among
themselves, rank by index, the lowest first. argmax is therefore the lowest index of the maximum (the first NaN of a
row that has one); topk(k) is the first k elements of the row sorted by (value descending, index ascending).

Error scales, and why:
- argmax, topk indices: 0 (exact). topk values: 0, they are copies of input elements (`compare` adds half an ulp of
  the output dtype, which no other representable value is within).
- log_softmax y_i = z_i - M - L with M the row maximum and L = log Σ_j exp(z_j - M):
  `1 + |z_i| + 2|M| + L + Σ_j p_j |z_j|` (p = softmax). The difference z_j - M is off by at most u (|z_j| + |M|),
  which perturbs term j of the sum relatively, so L absolutely by Σ_j p_j u (|z_j| + |M|) <= u (Σ_j p_j |z_j| + |M|);
  exp, the sum and the logarithm add relative errors of the sum, i.e. absolute errors of L of a few u (the `1`); the
  final subtractions add u (|z_i| + |M| + L).
- cross_entropy loss_r = M + L - z_t (t the row's target): the same terms at i = t (loss = -log_softmax at t). A
  target equal to `ignore_index` gives loss exactly 0 (scale 0); a target outside [0, n_cols) gives NaN (the kernels'
  definition: never a read outside the row).
"""

from __future__ import annotations

import numpy as np

from nbxcert.oracles.elementwise import exp


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _log(x) -> np.ndarray:
    """log in extended precision, rounded once to float64 (within 1 ulp, as `oracles.elementwise.exp` is)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(_f64(x).astype(np.longdouble)).astype(np.float64)


def argmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The index of each row's largest element of x [n_rows, n_cols] (lowest index on ties; the first NaN if any)."""
    x = _f64(x)
    nan = np.isnan(x)
    numbers = np.where(nan, -np.inf, x)
    top = numbers.max(axis=1, keepdims=True)
    first_top = np.array([np.flatnonzero(row)[0] for row in numbers == top], dtype=np.int64)
    has_nan = nan.any(axis=1)
    first_nan = np.array(
        [np.flatnonzero(row)[0] if any_nan else -1 for row, any_nan in zip(nan, has_nan, strict=False)]
    )
    idx = np.where(has_nan, first_nan, first_top).astype(np.float64)
    return idx, np.zeros(idx.shape)


def topk_order(x: np.ndarray) -> np.ndarray:
    """[n_rows, n_cols] column indices of each row of x in rank order: NaN first, then value descending, then index
    ascending (`np.lexsort`, whose last key is the primary one)."""
    x = _f64(x)
    nan = np.isnan(x)
    value = np.where(nan, 0.0, x)
    index = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    return np.lexsort((index, -value, ~nan), axis=-1)


def topk(x: np.ndarray, k: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"values": (ref, scale), "indices": (ref, scale)}: each row's first k elements in rank order."""
    x = _f64(x)
    if not 1 <= k <= x.shape[1]:
        raise ValueError(f"topk: k={k} must be in [1, {x.shape[1]}]")
    order = topk_order(x)[:, :k]
    values = np.take_along_axis(x, order, axis=1)
    return {
        "values": (values, np.zeros(values.shape)),
        "indices": (order.astype(np.float64), np.zeros(order.shape)),
    }


def _lse_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row maximum M, L = log Σ exp(x - M), Σ_j p_j |x_j|) of each row, each [n_rows, 1]."""
    m = x.max(axis=1, keepdims=True)
    e = exp(x - m)
    total = e.sum(axis=1, keepdims=True)
    spread = (e / total * np.abs(x)).sum(axis=1, keepdims=True)
    return m, _log(total), spread


def log_softmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x - M - log Σ exp(x - M) over the last dimension of x [n_rows, n_cols] (finite x), and its error scale."""
    x = _f64(x)
    m, lse, spread = _lse_parts(x)
    y = x - m - lse
    return y, 1.0 + np.abs(x) + 2.0 * np.abs(m) + lse + spread


def cross_entropy(x: np.ndarray, target: np.ndarray, ignore_index: int = -100) -> tuple[np.ndarray, np.ndarray]:
    """Per-row loss logsumexp(x_r) - x_r[target_r] of logits x [n_rows, n_cols] (finite) and integer targets [n_rows]:
    0 where target == ignore_index, NaN where the target is outside [0, n_cols)."""
    x = _f64(x)
    t = np.asarray(target).astype(np.int64).reshape(-1)
    n_rows, n_cols = x.shape
    m, lse, spread = _lse_parts(x)
    inside = (t >= 0) & (t < n_cols)
    x_t = x[np.arange(n_rows), np.where(inside, t, 0)]
    loss = m[:, 0] + lse[:, 0] - x_t
    scale = 1.0 + np.abs(x_t) + 2.0 * np.abs(m[:, 0]) + lse[:, 0] + spread[:, 0]
    ignored = t == ignore_index
    loss = np.where(ignored, 0.0, np.where(inside, loss, np.nan))
    return loss, np.where(ignored | ~inside, 0.0, scale)
