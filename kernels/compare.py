"""The one function that decides whether a kernel's output is correct, and its numpy-style report.

An element passes when `|out - ref| <= tol(dtype) * scale + rounding(dtype, ref)`: `tol` is the output dtype's
tolerance from the device file of the profile in force, `scale` the magnitude the oracle says the element's error is
judged against (for a product, `|A|·|B|` in float64, so an element that cancels to near zero is not judged against a
near-zero reference), and `rounding` half an ulp of the output dtype at the reference (the error storing the exact
answer in that dtype adds). NaN or Inf where the reference is finite fails; a non-finite reference must be matched
exactly (same infinity, or NaN). Integer outputs must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nbxcert.kernels.dtypes import DType, rounding_bound


@dataclass(frozen=True)
class Verdict:
    """The outcome of one comparison: `ok`, the errors measured and, when not ok, a report that reads like numpy's."""

    ok: bool
    n_mismatched: int
    n_total: int
    max_abs: float
    max_rel: float
    max_scaled: float  # max of |out - ref| / (tol * scale + rounding): <= 1 passes
    report: str
    tolerance: float = 0.0  # the tol this output was held to

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "max_rel": self.max_rel, "max_scaled": self.max_scaled}


def _finite_max(a: np.ndarray) -> float:
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


def compare(
    out: np.ndarray,
    ref: np.ndarray,
    scale: np.ndarray,
    dtype: DType,
    tol: float,
    context: str = "",
) -> Verdict:
    """Judge `out` (float64 values of the kernel's output, dtype `dtype`) against the oracle's `ref` and `scale`."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), ref.shape)
    if out.shape != ref.shape:
        report = f"{context}\nshape mismatch: kernel output {out.shape}, reference {ref.shape}"
        return Verdict(False, ref.size, ref.size, float("inf"), float("inf"), float("inf"), report.strip(), tol)
    finite_ref = np.isfinite(ref)
    with np.errstate(invalid="ignore", over="ignore"):
        abs_err = np.abs(out - ref)
        if dtype.is_float:
            allowed = tol * np.abs(scale) + rounding_bound(ref, dtype)
        else:
            allowed = np.zeros(ref.shape)
        bad = np.zeros(ref.shape, dtype=bool)
        bad |= finite_ref & ~np.isfinite(out)
        bad |= finite_ref & np.isfinite(out) & (abs_err > allowed)
        # a non-finite reference is matched exactly: the same infinity, or a NaN
        same_nonfinite = (np.isnan(ref) & np.isnan(out)) | (np.isinf(ref) & (out == ref))
        bad |= ~finite_ref & ~same_nonfinite
        fin = finite_ref & np.isfinite(out)
        max_abs = _finite_max(np.where(fin, abs_err, np.nan))
        rel = np.where(fin & (ref != 0), abs_err / np.abs(np.where(ref == 0, 1, ref)), np.nan)
        max_rel = _finite_max(rel)
        scaled = np.where(fin, abs_err / np.where(allowed > 0, allowed, np.inf), np.nan)
        scaled = np.where(fin & (allowed == 0) & (abs_err > 0), np.inf, scaled)
    max_scaled = float(np.nanmax(scaled)) if np.any(fin) else 0.0
    if np.any(bad & ~fin):
        max_scaled = float("inf")
    n_bad = int(bad.sum())
    if n_bad == 0:
        return Verdict(True, 0, ref.size, max_abs, max_rel, max_scaled, "", tol)
    lines = [
        context.strip(),
        f"Not equal to tolerance tol={tol:g} x scale + rounding({dtype.name})",
        f"Mismatched elements: {n_bad} / {ref.size} ({100.0 * n_bad / max(ref.size, 1):.3g}%)",
        "First mismatches (index, got, expected, allowed):",
    ]
    for idx in np.argwhere(bad)[:5]:
        i = tuple(int(v) for v in idx)
        lines.append(f"  {i}: {out[i]!r}, {ref[i]!r}, {allowed[i]:.3g}")
    lines += [
        f"Max absolute difference among finite values: {max_abs:.6g}",
        f"Max relative difference among finite values: {max_rel:.6g}",
        f"Max scaled error (<= 1 passes): {max_scaled:.6g}",
    ]
    return Verdict(False, n_bad, ref.size, max_abs, max_rel, max_scaled, "\n".join(x for x in lines if x), tol)


def poison(t, dtype: DType) -> None:
    """Fill an output with values the kernel can never legitimately leave: NaN for floats, the dtype's extreme for
    integers (an unwritten element then fails the comparison)."""
    if dtype.is_float:
        t.fill_(float("nan"))
    elif dtype.name == "bool":
        # bool storage is one byte; 0x5A is neither 0 nor 1, which no comparison result writes
        t._write_host(np.full(t.shape, 0x5A, dtype=np.uint8).view(np.bool_))
    else:
        info = np.iinfo(dtype.storage)
        t.fill_(info.min if info.min < 0 else info.max)
