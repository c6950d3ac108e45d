"""The fitted polynomials of the pointwise kernels' half-precision forms (`kernels/pointwise.py`), made again:

- `ERFC_Q`: Q with 2^Q(x) ~ erfc(x) on [1/4, 4] (erf and gelu past |x| = 1/4, float16 and bfloat16 results), degree 6,
  its error 2^Q's absolute one (erf's);
- `TAN_P`: P with r P(r^2) ~ tan(r) on |r| <= pi/4 + 2^-8 (float16 tan after the reduction by pi/2), degree 5 in r^2,
  its error relative.

    python3 benchmarks/fit_pointwise.py [--points 20001]

Each is fitted against mpmath (50 digits) by least squares in the Chebyshev basis of its interval, weighted by what
the error is measured against (erfc for ERFC_Q, tan r / r for TAN_P), reweighted 30 times towards the points of
largest error (towards the minimax fit), then written in the power basis the kernel's Horner rule uses. Prints the
coefficients, the largest error evaluated in float64 and in float32 (as the kernel runs it), and whether the kernel's
table is the fit made again.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import mpmath
import numpy as np

ERFC_LO, ERFC_HI, ERFC_DEGREE = 0.25, 4.0, 6
TAN_R, TAN_DEGREE = math.pi / 4 + 2.0**-8, 5


def _fit(xs: np.ndarray, target: np.ndarray, weight: np.ndarray, lo: float, hi: float, degree: int, error):
    """Power-basis coefficients of the reweighted least-squares fit of `target` on [lo, hi] (`error(values)`: each
    point's error, which the reweighting chases)."""
    t = (2 * xs - (lo + hi)) / (hi - lo)
    basis = np.polynomial.chebyshev.chebvander(t, degree)
    for _ in range(30):
        c, *_ = np.linalg.lstsq(basis * weight[:, None], target * weight, rcond=None)
        err = error(basis @ c)
        weight = weight * (1 + 0.5 * err / err.max())
    return np.polynomial.chebyshev.Chebyshev(c, domain=[lo, hi]).convert(kind=np.polynomial.Polynomial).coef


def _horner(coef, x: np.ndarray) -> np.ndarray:
    q = np.zeros_like(x)
    for c in reversed(list(coef)):
        q = q * x + x.dtype.type(c)
    return q.astype(np.float64)


def erfc_fit(points: int):
    """(coefficients, error(coef, dtype)): 2^Q's largest absolute error against erfc, Q by Horner in dtype."""
    mpmath.mp.dps = 50
    xs = np.linspace(ERFC_LO, ERFC_HI, points)
    log2_erfc = np.array([float(mpmath.log(mpmath.erfc(mpmath.mpf(float(x))), 2)) for x in xs])
    erfc = np.exp2(log2_erfc)
    coef = _fit(xs, log2_erfc, erfc.copy(), ERFC_LO, ERFC_HI, ERFC_DEGREE, lambda q: np.abs(np.exp2(q) - erfc))
    return coef, lambda c, dtype: float(np.abs(np.exp2(_horner(c, xs.astype(dtype))) - erfc).max())


def tan_fit(points: int):
    """(coefficients, error(coef, dtype)): r P(r^2)'s largest relative error against tan r, P by Horner in dtype."""
    mpmath.mp.dps = 50
    s_hi = TAN_R * TAN_R
    ss = np.linspace(0.0, s_hi, points)
    ratio = np.array([1.0] + [float(mpmath.tan(mpmath.sqrt(mpmath.mpf(float(s)))) / mpmath.sqrt(s)) for s in ss[1:]])
    coef = _fit(ss, ratio, np.ones_like(ss), 0.0, s_hi, TAN_DEGREE, lambda p: np.abs(p - ratio) / ratio)
    return coef, lambda c, dtype: float((np.abs(_horner(c, ss.astype(dtype)) - ratio) / ratio).max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=20001, help="grid points on each interval (default 20001)")
    args = parser.parse_args(argv)
    os.environ.setdefault("NBXCERT_BACKEND", "interpreter")
    from nbxcert.kernels import pointwise

    for name, make in (("ERFC_Q", erfc_fit), ("TAN_P", tan_fit)):
        coef, error = make(args.points)
        print(f"{name} = (" + ", ".join(repr(float(c)) for c in coef) + ")")
        shipped = np.array(getattr(pointwise, name).value)
        same = shipped.shape == coef.shape and np.allclose(shipped, coef, rtol=1e-9, atol=0)
        print(f"  the kernel's {name} is {'this fit' if same else 'NOT this fit'}")
        for dtype in (np.float64, np.float32):
            print(f"  the kernel's, evaluated in {np.dtype(dtype).name}: 2^{np.log2(error(shipped, dtype)):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
