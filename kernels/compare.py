"""The one function that decides whether a kernel's output is correct, and its numpy-style report.

An element passes when `|out - ref| <= tol(dtype) * scale + rounding(dtype, ref)`: `tol` is the output dtype's
tolerance from the device file of the profile in force, `scale` the magnitude the oracle says the element's error is
judged against (for a product, `|A|·|B|` in float64, so an element that cancels to near zero is not judged against a
near-zero reference), and `rounding` half an ulp of the output dtype at the reference (the error storing the exact
answer in that dtype adds). NaN or Inf where the reference is finite fails; a non-finite reference must be matched
exactly (same infinity, or NaN). Integer outputs must be equal.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from nbxcert.kernels.dtypes import DType, decode, rounding_bound


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


# Outputs of more than CHUNK elements are judged in chunks on a thread pool (numpy releases the GIL in its loops): a
# sweep judges every candidate of a key against the same reference, and a 4096 x 11264 output is 46M elements.
CHUNK = 1 << 20
_pool = None
_pool_lock = threading.Lock()


def _threads():
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1)), thread_name_prefix="judge")
        return _pool


def _mismatched(out, ref, err, allowed, finite_out, finite_ref) -> np.ndarray:
    """The elements that fail (the module docstring's rule): a non-finite output where the reference is finite, an
    error over the allowed one, or a non-finite reference not matched exactly (the same infinity, or a NaN)."""
    bad = (finite_ref & ~finite_out) | (finite_ref & finite_out & (err > allowed))
    same_nonfinite = (np.isnan(ref) & np.isnan(out)) | (np.isinf(ref) & (out == ref))
    return bad | (~finite_ref & ~same_nonfinite)


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + CHUNK, n)) for lo in range(0, n, CHUNK)] or [(0, 0)]


class Judge:
    """The part of a comparison that depends only on the reference: built once per (reference, dtype, tolerance) and
    reused for every candidate a sweep checks against it. `Judge(...).verdict(out)` is `compare(out, ...)`."""

    def __init__(self, ref: np.ndarray, scale: np.ndarray, dtype: DType, tol: float):
        self.ref = np.asarray(ref, dtype=np.float64)
        self.dtype, self.tol = dtype, tol
        scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), self.ref.shape)
        if dtype.is_float:
            flat_ref, flat_scale = self.ref.reshape(-1), scale.reshape(-1)
            allowed = np.empty(flat_ref.size)

            def fill(bounds):
                lo, hi = bounds
                with np.errstate(invalid="ignore", over="ignore"):
                    allowed[lo:hi] = tol * np.abs(flat_scale[lo:hi]) + rounding_bound(flat_ref[lo:hi], dtype)

            list(_threads().map(fill, _chunks(flat_ref.size)))
            self.allowed = allowed.reshape(self.ref.shape)
        else:
            self.allowed = np.zeros(self.ref.shape)
        self.finite_ref = np.isfinite(self.ref)
        self.all_finite = bool(self.finite_ref.all())
        self.any_zero_allowed = bool(np.any(self.allowed == 0))

    def _chunk(self, out: np.ndarray, lo: int, hi: int) -> tuple[int, float, float, float, bool]:
        """(mismatched, max abs, max rel, max scaled, a non-finite output where the reference is finite) of the flat
        elements [lo, hi)."""
        o = out[lo:hi]
        r, al = self.ref.reshape(-1)[lo:hi], self.allowed.reshape(-1)[lo:hi]
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            err = np.abs(o - r)
            fo = np.isfinite(o)
            if self.all_finite and fo.all():
                n_bad = int(np.count_nonzero(err > al))
                max_abs = float(err.max()) if err.size else 0.0
                rel = err / np.abs(r)  # ref 0: inf or nan, excluded below
                rel = rel[(r != 0)]
                max_rel = float(rel.max()) if rel.size else 0.0
                if self.any_zero_allowed:
                    scaled = np.where(al > 0, err / np.where(al > 0, al, 1.0), np.where(err > 0, np.inf, 0.0))
                else:
                    scaled = err / al
                max_scaled = float(scaled.max()) if scaled.size else 0.0
                return n_bad, max_abs, max_rel, max_scaled, False
            fr = self.finite_ref.reshape(-1)[lo:hi]
            bad = _mismatched(o, r, err, al, fo, fr)
            fin = fr & fo
            max_abs = _finite_max(np.where(fin, err, np.nan))
            rel = np.where(fin & (r != 0), err / np.abs(np.where(r == 0, 1, r)), np.nan)
            scaled = np.where(fin, err / np.where(al > 0, al, np.inf), np.nan)
            scaled = np.where(fin & (al == 0) & (err > 0), np.inf, scaled)
            max_scaled = float(np.nanmax(scaled)) if np.any(fin) else 0.0
            return int(bad.sum()), max_abs, _finite_max(rel), max_scaled, bool(np.any(bad & ~fin))

    def verdict_of(self, tensor, context: str = "") -> Verdict:
        """Judge a kernel's output tensor: its storage values copied to the host once, widened to float64 in chunks
        on the thread pool (a sweep judges every candidate; a single-threaded widening of a large output costs more
        than the judging)."""
        raw = np.ascontiguousarray(tensor.numpy()).reshape(-1)
        wide = np.empty(raw.size)

        def widen(bounds):
            lo, hi = bounds
            wide[lo:hi] = decode(raw[lo:hi], tensor.dtype)

        list(_threads().map(widen, _chunks(raw.size)))
        return self.verdict(wide.reshape(tensor.shape), context)

    def verdict(self, out: np.ndarray, context: str = "") -> Verdict:
        """Judge `out` (float64 values of the kernel's output) against the reference."""
        out = np.asarray(out, dtype=np.float64)
        ref, tol = self.ref, self.tol
        if out.shape != ref.shape:
            report = f"{context}\nshape mismatch: kernel output {out.shape}, reference {ref.shape}"
            return Verdict(False, ref.size, ref.size, float("inf"), float("inf"), float("inf"), report.strip(), tol)
        flat = out.reshape(-1)
        bounds = _chunks(flat.size)
        if len(bounds) > 1:
            parts = list(_threads().map(lambda b: self._chunk(flat, *b), bounds))
        else:
            parts = [self._chunk(flat, *bounds[0])]
        n_bad = sum(p[0] for p in parts)
        max_abs = max(p[1] for p in parts)
        max_rel = max(p[2] for p in parts)
        max_scaled = max(p[3] for p in parts)
        if any(p[4] for p in parts):
            max_scaled = float("inf")
        if n_bad == 0:
            return Verdict(True, 0, ref.size, max_abs, max_rel, max_scaled, "", tol)
        return Verdict(
            False,
            n_bad,
            ref.size,
            max_abs,
            max_rel,
            max_scaled,
            self._report(out, context, n_bad, max_abs, max_rel, max_scaled),
            tol,
        )

    def _report(self, out, context, n_bad, max_abs, max_rel, max_scaled) -> str:
        ref, allowed = self.ref, self.allowed
        with np.errstate(invalid="ignore", over="ignore"):
            bad = _mismatched(out, ref, np.abs(out - ref), allowed, np.isfinite(out), self.finite_ref)
        lines = [
            context.strip(),
            f"Not equal to tolerance tol={self.tol:g} x scale + rounding({self.dtype.name})",
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
        return "\n".join(x for x in lines if x)


def compare(
    out: np.ndarray,
    ref: np.ndarray,
    scale: np.ndarray,
    dtype: DType,
    tol: float,
    context: str = "",
) -> Verdict:
    """Judge `out` (float64 values of the kernel's output, dtype `dtype`) against the oracle's `ref` and `scale`."""
    return Judge(ref, scale, dtype, tol).verdict(out, context)


def poison(t, dtype: DType) -> None:
    """Fill an output with values the kernel can never legitimately leave: NaN for floats, the dtype's extreme for
    integers (an unwritten element then fails the comparison)."""
    if dtype.is_float:
        t.fill_(float("nan"))
    elif dtype.name == "bool":
        # bool storage is one byte; 0x5A is neither 0 nor 1, which no comparison result writes
        t.write_host(np.full(t.shape, 0x5A, dtype=np.uint8).view(np.bool_))
    else:
        info = np.iinfo(dtype.storage)
        t.fill_(info.min if info.min < 0 else info.max)
