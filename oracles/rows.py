"""Float64 references for the row kernels: softmax, layer/RMS normalisation (with a residual add) and row reductions.

Pure numpy in float64, textbook formulas, sharing nothing with the kernels they judge: the softmax subtracts the row
maximum before `exp`; the variance is two-pass (the mean first, then the mean of squared deviations), never Welford
or sum-of-squares. Every function returns `(reference, error scale)`; the error scale is what `|kernel - reference|`
is judged against (times the output dtype's tolerance, plus half an ulp of the output dtype: `kernels/compare.py`).

Error scales, and why:
- Reductions (sum, mean): the row's sum of magnitudes `Σ|x|` (`/ n` for the mean): a sum computed in any order with
  unit roundoff u is off by at most ~(depth) u Σ|x|, whatever cancellation leaves of the result. amax: `|max|` (no
  rounding happens at all).
- Variance (two-pass, `correction` c): `(Σ (x - m)² + n u32 mean|x|²) / (n - c)`. The first term is the sum of the
  magnitudes of the squared deviations. The second bounds the only error that term misses: a centre m' = m + δ that
  is itself rounded gives Σ (x - m')² = Σ (x - m)² + n δ² (the cross term vanishes since Σ (x - m) = 0), and a
  float32 centre has |δ| <= γ mean|x| with γ a small multiple of u32 = 2^-24 (float32's unit roundoff, the least
  precision a kernel may compute in); n γ² mean|x|² is far below tol * n u32 mean|x|² for every output dtype. A row of
  equal values has variance exactly 0, and a kernel whose centre misses by a rounding is not failed for it.
- Softmax of z = x * scale (+ additive mask), masked entries -inf: `y_i (1 + |z_i| + |M| + Σ_j y_j |z_j|)` with M the
  row maximum. The first-order sensitivity of y_i to relative perturbations of each z_j (rounding z = x * scale, or
  of z - M) is ∂y_i/∂z_j = y_i (δ_ij - y_j); `1` covers the relative error of exp, the sum and the division. A
  masked entry has y = 0 and scale 0 (the kernel must write exactly 0). A row with every entry masked (-inf) is
  DEFINED as all zeros (scale 0), as the attention kernels define a row that sees no key.
- LayerNorm y = (x - m) r w + b, r = 1/sqrt(var + eps): `(|x_i| + mean|x|) r |w_i| + |b_i|`. The error of the centred
  value x_i - m is at most u (|x_i| + |m|) <= u (|x_i| + mean|x|) plus the error of m itself (~γ mean|x|); the error of
  r is relative (a sum of positive squares; the centre's error enters it only at second order, as above) and so
  bounded by u |x_i - m| r |w_i| <= u (|x_i| + mean|x|) r |w_i|; the final multiply-add adds u (|y_i - b_i| + |b_i|).
  Judged against |y_i| instead, a value that happens to sit near the mean would be judged against its own
  near-zero size, which no finite-precision kernel can meet.
- RMSNorm y = x r w, r = 1/sqrt(mean(x²) + eps): `|x_i| r |w_i|` (= |y_i|): every step is a product or a sum of
  positive terms, so all errors are relative.
- The residual sum s = x + res of the fused variants: `|x| + |res|`.
"""

from __future__ import annotations

import numpy as np

from nbxcert.oracles.elementwise import exp

U32 = 2.0**-24  # float32's unit roundoff (the variance scale's second term, see the module docstring)


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def causal_visible(n_rows: int, n_cols: int, q_len: int) -> np.ndarray:
    """[n_rows, n_cols] bool: row r is query position i = r mod q_len of a group of q_len rows, aligned bottom-right
    against n_cols keys (a prefill continuing a cache): it sees key j iff j <= i + (n_cols - q_len)."""
    i = np.arange(n_rows)[:, None] % q_len
    j = np.arange(n_cols)[None, :]
    return j <= i + (n_cols - q_len)


def softmax(
    x: np.ndarray,
    scale: float = 1.0,
    mask: str = "none",
    additive: np.ndarray | None = None,
    q_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over the last dimension of x [n_rows, n_cols] of z = x * scale (+ additive mask), with the mask kind
    `mask`: "none"; "causal" (bottom-right aligned for groups of `q_len` rows, `causal_visible`); "additive" (row r
    adds `additive[r mod q_len]`, which may hold -inf). Fully masked rows are zeros (module docstring)."""
    x = _f64(x)
    n_rows, n_cols = x.shape
    z = x * float(scale)
    if mask == "additive":
        add = _f64(additive)
        z = z + add[np.arange(n_rows) % add.shape[0]]
    elif mask == "causal":
        z = np.where(causal_visible(n_rows, n_cols, int(q_len)), z, -np.inf)
    elif mask != "none":
        raise ValueError(f"softmax: mask must be none, causal or additive, got {mask!r}")
    seen = np.isfinite(z).any(axis=1) if n_cols else np.zeros(n_rows, dtype=bool)
    row_max = np.where(seen, z.max(axis=1, initial=-np.inf), 0.0)
    with np.errstate(invalid="ignore"):
        e = np.where(np.isneginf(z), 0.0, exp(z - row_max[:, None]))
    total = e.sum(axis=1)
    y = np.where(seen[:, None], e / np.where(seen, total, 1.0)[:, None], 0.0)
    absz = np.where(np.isneginf(z), 0.0, np.abs(z))
    spread = 1.0 + absz + np.abs(row_max)[:, None] + (y * absz).sum(axis=1, keepdims=True)
    return y, y * spread


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (population variance, two-pass)."""
    x, w, b = _f64(x), _f64(weight), _f64(bias)
    n = x.shape[-1]
    mean = x.sum(axis=-1, keepdims=True) / n
    var = ((x - mean) ** 2).sum(axis=-1, keepdims=True) / n
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd * w + b
    mean_abs = np.abs(x).sum(axis=-1, keepdims=True) / n
    return y, (np.abs(x) + mean_abs) * rstd * np.abs(w) + np.abs(b)


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x / sqrt(mean(x²) + eps) * weight over the last dimension."""
    x, w = _f64(x), _f64(weight)
    n = x.shape[-1]
    rstd = 1.0 / np.sqrt((x * x).sum(axis=-1, keepdims=True) / n + eps)
    y = x * rstd * w
    return y, np.abs(x) * rstd * np.abs(w)


def residual_sum(x: np.ndarray, residual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s = x + residual, the first output of the fused add-and-normalise kernels."""
    x, r = _f64(x), _f64(residual)
    return x + r, np.abs(x) + np.abs(r)


def row_reduce(x: np.ndarray, op: str, correction: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One value per row of x [n_rows, n_cols]: `sum`, `mean`, `amax`, or `var` (two-pass, divided by
    n_cols - correction; NaN where that is not positive, as numpy's ddof does)."""
    x = _f64(x)
    n = x.shape[-1]
    if op == "sum":
        return x.sum(axis=-1), np.abs(x).sum(axis=-1)
    if op == "mean":
        return x.sum(axis=-1) / n, np.abs(x).sum(axis=-1) / n
    if op == "amax":
        m = x.max(axis=-1)
        return m, np.abs(m)
    if op == "var":
        mean = x.sum(axis=-1, keepdims=True) / n
        dev2 = ((x - mean) ** 2).sum(axis=-1)
        mean_abs = np.abs(x).sum(axis=-1) / n
        with np.errstate(divide="ignore", invalid="ignore"):
            denom = float(n - correction) if n - correction > 0 else 0.0
            var = dev2 / denom if denom > 0 else np.full(dev2.shape, np.nan)
            scale = (dev2 + n * U32 * mean_abs**2) / denom if denom > 0 else np.zeros(dev2.shape)
        return var, scale
    raise ValueError(f"row_reduce: op must be sum, mean, amax or var, got {op!r}")
