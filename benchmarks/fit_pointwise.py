"""The fitted polynomial of the pointwise kernels' half-precision forms, made again: `kernels/pointwise.py`'s
`ERFC_Q`, Q with 2^Q(x) ~ erfc(x) on [1/4, 4] (erf and gelu past |x| = 1/4 for float16 and bfloat16 results).

    python3 benchmarks/fit_pointwise.py [--degree 6] [--points 20001]

Q is fitted to log2 erfc (mpmath, 50 digits) by least squares in the Chebyshev basis of [1/4, 4], each point weighted
by erfc (so the error measured is 2^Q's absolute one, which is erf's), reweighted 30 times towards the points of
largest error (towards the minimax fit), then written in the power basis the kernel's Horner rule uses. Prints the
coefficients, 2^Q's largest absolute error against erfc evaluated in float64 and in float32 (as the kernel runs it),
and whether the kernel's table is the fit made again.
"""

from __future__ import annotations

import argparse
import sys

import mpmath
import numpy as np

LO, HI = 0.25, 4.0


def fit(degree: int, points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(power-basis coefficients, the grid, erfc on it)."""
    mpmath.mp.dps = 50
    xs = np.linspace(LO, HI, points)
    log2_erfc = np.array([float(mpmath.log(mpmath.erfc(mpmath.mpf(float(x))), 2)) for x in xs])
    erfc = np.exp2(log2_erfc)
    t = (2 * xs - (LO + HI)) / (HI - LO)
    basis = np.polynomial.chebyshev.chebvander(t, degree)
    weight = erfc.copy()
    for _ in range(30):
        c, *_ = np.linalg.lstsq(basis * weight[:, None], log2_erfc * weight, rcond=None)
        err = np.abs(np.exp2(basis @ c) - erfc)
        weight = weight * (1 + 0.5 * err / err.max())
    power = np.polynomial.chebyshev.Chebyshev(c, domain=[LO, HI]).convert(kind=np.polynomial.Polynomial).coef
    return power, xs, erfc


def largest_error(coef, xs, erfc, dtype) -> float:
    """2^Q's largest absolute error against erfc, Q by Horner's rule in `dtype`."""
    x = xs.astype(dtype)
    q = np.zeros_like(x)
    for c in reversed(list(coef)):
        q = q * x + dtype(c)
    return float(np.abs(np.exp2(q.astype(np.float64)) - erfc).max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--degree", type=int, default=6, help="Q's degree (default 6, the kernel's)")
    parser.add_argument("--points", type=int, default=20001, help="grid points on [1/4, 4] (default 20001)")
    args = parser.parse_args(argv)
    coef, xs, erfc = fit(args.degree, args.points)
    print("ERFC_Q = (" + ", ".join(repr(float(c)) for c in coef) + ")")
    for dtype in (np.float64, np.float32):
        print(f"2^Q against erfc, Q in {np.dtype(dtype).name}: 2^{np.log2(largest_error(coef, xs, erfc, dtype)):.2f}")
    import os

    os.environ.setdefault("NBXCERT_BACKEND", "interpreter")
    from nbxcert.kernels import pointwise

    shipped = np.array(pointwise.ERFC_Q.value)
    same = shipped.shape == coef.shape and np.allclose(shipped, coef, rtol=1e-9, atol=0)
    print(f"the kernel's ERFC_Q is {'this fit' if same else 'not this fit'}")
    for dtype in (np.float64, np.float32):
        err = largest_error(shipped, xs, erfc, dtype)
        print(f"the kernel's, Q in {np.dtype(dtype).name}: 2^{np.log2(err):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
