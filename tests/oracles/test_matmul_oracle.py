"""Checks of the matrix-product oracle (oracles/matmul.py) on its own: the activations against mpmath, the Lipschitz
constants that widen the error scale against the derivative on a fine grid, the accumulation growth factor against a
simulated float32 accumulation, and the products against exact rational arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from nbxcert.oracles import matmul as oracle


def _mp_activation(x: float, name: str) -> float:
    with mpmath.workdps(40):
        z = mpmath.mpf(x)
        if name == "none":
            v = z
        elif name == "relu":
            v = max(z, mpmath.mpf(0))
        elif name == "gelu_tanh":
            v = z / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (z + mpmath.mpf("0.044715") * z**3)))
        else:
            v = z / (1 + mpmath.exp(-z))
        return float(v)


@pytest.mark.parametrize("name", oracle.ACTIVATIONS)
def test_activations_match_mpmath(name):
    xs = np.concatenate([np.linspace(-30, 30, 241), [-1e-8, 0.0, 1e-8, 700.0, -700.0]])
    got = oracle.activation(xs, name)
    want = np.array([_mp_activation(x, name) for x in xs])
    assert np.all(np.isfinite(got))
    # Judged as the comparison judges it: against the size of the argument (the error scale of an activated output
    # is at least |z|), not against the value, which the tanh form computes with cancellation far out on the left.
    assert np.all(np.abs(got - want) <= 1e-15 * np.maximum(np.abs(xs), 1.0)), np.abs(got - want).max()


@pytest.mark.parametrize("name", oracle.ACTIVATIONS)
def test_lipschitz_constants_bound_the_derivative(name):
    """The stated constant is an upper bound of |f'| (a central difference on a grid of step 1e-4 over [-40, 40]),
    and not loose by more than 2%."""
    x = np.linspace(-40, 40, 800_001)
    h = 1e-6
    slope = np.abs(oracle.activation(x + h, name) - oracle.activation(x - h, name)) / (2 * h)
    assert slope.max() <= oracle.LIPSCHITZ[name] * (1 + 1e-6)
    assert slope.max() >= oracle.LIPSCHITZ[name] / 1.02


def test_growth_factor_covers_float32_accumulation():
    """Sequential float32 FMA accumulation (the worst order a kernel can use) stays inside the widened scale for a
    float32 output at every K tried, while a float16 output keeps the plain scale."""
    eps32, eps16 = 2.0**-23, 2.0**-10
    assert oracle.growth(4096, eps32, eps16) == 1.0
    rng = np.random.default_rng(7)
    for k in (1, 2, 5, 29, 64, 300):
        a = rng.standard_normal((64, k)).astype(np.float32).astype(np.float64)
        b = rng.standard_normal((k, 256)).astype(np.float32).astype(np.float64)
        acc = np.zeros((64, 256), np.float32)
        for i in range(k):  # one rounding per step: a float32 FMA (the product of two float32s is exact in float64)
            acc = (acc.astype(np.float64) + a[:, i : i + 1] * b[i : i + 1, :]).astype(np.float32)
        value, scale = oracle.matmul(a, b, acc_eps=eps32, out_eps=eps32)
        half_ulp = 0.5 * np.exp2(np.floor(np.log2(np.maximum(np.abs(value), 2.0**-126))) - 23)
        assert np.all(np.abs(acc - value) <= eps32 * scale + half_ulp), k


def test_product_and_scale_are_exact_on_small_integers():
    """With small integer inputs float64 is exact: compare with rational arithmetic, bias and alpha/beta included."""
    rng = np.random.default_rng(1)
    a = rng.integers(-8, 9, size=(2, 5, 7)).astype(np.float64)
    b = rng.integers(-8, 9, size=(7, 3)).astype(np.float64)  # broadcast over the batch
    bias = rng.integers(-8, 9, size=3).astype(np.float64)
    value, scale = oracle.addmm(a, b, bias, alpha=0.5, beta=-2.0, acc_eps=2.0**-23, out_eps=2.0**-10)
    for i in range(2):
        for m in range(5):
            for n in range(3):
                exact = Fraction(1, 2) * sum(Fraction(a[i, m, j]) * Fraction(b[j, n]) for j in range(7))
                exact += Fraction(-2) * Fraction(bias[n])
                size = Fraction(1, 2) * sum(abs(Fraction(a[i, m, j]) * Fraction(b[j, n])) for j in range(7))
                size += abs(Fraction(-2) * Fraction(bias[n]))
                assert value[i, m, n] == float(exact)
                assert scale[i, m, n] == float(size)


def test_activation_scale_uses_the_lipschitz_constant():
    a = np.array([[1.0, -2.0]])
    b = np.array([[3.0], [1.0]])
    _, plain = oracle.addmm(a, b, acc_eps=2.0**-23, out_eps=2.0**-10)
    _, gelu = oracle.addmm(a, b, activation_name="gelu_tanh", acc_eps=2.0**-23, out_eps=2.0**-10)
    assert plain[0, 0] == 5.0 and math.isclose(gelu[0, 0], 5.0 * oracle.LIPSCHITZ["gelu_tanh"])


def test_unknown_activation_and_shape_refused():
    with pytest.raises(ValueError, match="unknown activation"):
        oracle.activation(np.zeros(2), "tanh")
    with pytest.raises(ValueError, match="inner dimensions"):
        oracle.matmul(np.zeros((2, 3)), np.zeros((4, 2)), acc_eps=1e-7, out_eps=1e-3)
