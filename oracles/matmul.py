"""Float64 references for the matrix-product kernels: act(beta·bias + alpha·(A @ B)), with its error scale.

Pure numpy, written from the definition and sharing nothing with the kernels it judges: the product is numpy's
float64 `matmul` of the stored input values (batch dimensions broadcast as numpy broadcasts them), the bias is added
and the activation applied in float64.

Error scale of an output element. Before the activation, the magnitude a kernel rounds its way through is

    scale_z = |alpha| · (|A| @ |B|) + |beta · bias|        (float64)

so an element that cancels to near zero is judged against the size of its terms, not against its own value.

The kernels accumulate the K products in float32 whatever the output type. For an output type at least as wide as
float32 that accumulation error is the one that counts, and it grows with K: the probabilistic bound of Higham and
Mary ("A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019) puts it at
λ·sqrt(K)·u·(|A| @ |B|). The scale is therefore widened by

    growth = max(1, (sqrt(K) + 4) · acc_eps / out_eps)

in units of the output type's epsilon: sqrt(K) for the accumulation (λ = 2 in units of u = eps/2), and 4 more epsilons
for the float32 roundings after it (alpha, the bias add, the activation's own evaluation). For float16 and bfloat16
outputs the factor is 1 up to K = (2^13 - 4)^2 resp. (2^16 - 4)^2: their own rounding dominates. `acc_eps` is the
accumulator's epsilon (2^-23 for float32) and `out_eps` the output type's; both are the caller's statement of the
kernel's arithmetic, not facts this module guesses.

An activation `f` with Lipschitz constant L moves an error in z by at most L times it, so the output's scale is
`L · growth · scale_z`. The constants (max |f'| over the real line) are upper bounds checked in
`tests/oracles/test_matmul.py` against a fine grid of the derivative.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

ACTIVATIONS = ("none", "relu", "gelu_tanh", "silu")

# max over x of |f'(x)|, rounded up: relu 1; gelu_tanh 1.12899 near x = 1.42 (tanh form); silu 1.09984 near x = 2.4
LIPSCHITZ = {"none": 1.0, "relu": 1.0, "gelu_tanh": 1.13, "silu": 1.1}


def activation(z: np.ndarray, name: str) -> np.ndarray:
    """The activation `name` of float64 values, from its definition."""
    z = np.asarray(z, dtype=np.float64)
    if name == "none":
        return z
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "gelu_tanh":
        # GELU, tanh approximation (Hendrycks & Gimpel 2016; torch.nn.functional.gelu(approximate="tanh"))
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
    if name == "silu":
        # x·sigmoid(x), with sigmoid from exp(-|x|) so that no exp overflows
        e = np.exp(-np.abs(z))
        sigmoid = np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        return z * sigmoid
    raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")


def growth(k: int, acc_eps: float, out_eps: float) -> float:
    """The widening of the error scale for a K-term float32 accumulation, in units of the output's epsilon."""
    return max(1.0, (math.sqrt(max(int(k), 1)) + 4.0) * acc_eps / out_eps)


def addmm(
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    product: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul,
    **terms,
) -> tuple[np.ndarray, np.ndarray]:
    """act(beta·bias + alpha·(a @ b)) and its error scale, both float64.

    a: [..., M, K]; b: [..., K, N] (leading dimensions broadcast); bias: broadcastable to the result, or None.
    `terms`: `addmm_of`'s (alpha, beta, activation_name; acc_eps and out_eps, the accumulator's and the output type's
    epsilons, see the module docstring). `product`: the float64 matrix product of two float64 arrays (numpy's; or an
    equal one computed elsewhere, as a GPU's DGEMM)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"inner dimensions differ: a {a.shape}, b {b.shape}")
    return addmm_of(product(a, b), product(np.abs(a), np.abs(b)), a.shape[-1], bias, **terms)


def addmm_of(
    ab: np.ndarray,
    abs_ab: np.ndarray,
    k: int,
    bias: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    activation_name: str = "none",
    acc_eps: float,
    out_eps: float,
) -> tuple[np.ndarray, np.ndarray]:
    """`addmm` from its two float64 products, made elsewhere: ab = a @ b and abs_ab = |a| @ |b| over K terms.

    With alpha 1 the products are used as they are (1 x is x exactly), and a scale already of the result's shape is
    not copied again: each pass over a prefill's [4096, 28672] output is 940 MB of float64 on one core."""
    z = np.asarray(ab, dtype=np.float64)
    scale_z = np.asarray(abs_ab, dtype=np.float64)
    if alpha != 1.0:
        z = alpha * z
        scale_z = abs(alpha) * scale_z
    if bias is not None:
        bias = np.asarray(bias, dtype=np.float64)
        z = z + beta * bias
        scale_z = scale_z + np.abs(beta * bias)
    value = activation(z, activation_name)
    scale = LIPSCHITZ[activation_name] * growth(k, acc_eps, out_eps) * scale_z
    return value, scale if scale.shape == value.shape else np.broadcast_to(scale, value.shape).copy()


def matmul(
    a: np.ndarray,
    b: np.ndarray,
    *,
    acc_eps: float,
    out_eps: float,
    product: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul,
) -> tuple[np.ndarray, np.ndarray]:
    """a @ b and its error scale (a: [..., M, K], b: [..., K, N], leading dimensions broadcast)."""
    return addmm(a, b, None, acc_eps=acc_eps, out_eps=out_eps, product=product)
