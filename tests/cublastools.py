"""A stand-in for cuBLAS on host memory, for tests of the oracles' device products under the interpreter (whose
"device" memory is the host's): a column-major DGEMM written in numpy, as cuBLAS's reference semantics state it."""

from __future__ import annotations

import ctypes

import numpy as np

from nbxcert.kernels.backends import cublas


def _doubles(address: int, count: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_double * count).from_address(address))


class FakeCublas:
    """A column-major DGEMM over host memory, as cuBLAS's reference semantics state it (op N only)."""

    path = "fake-libcublas"

    def __init__(self):
        self.calls = []
        self.handles = {}

    def create(self, handle_ref):
        handle_ref._obj.value = 0x1234
        return 0

    def set_stream(self, handle, stream):
        return 0

    def dgemm(self, handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        assert (ta, tb) == (cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N)
        self.calls.append((m, n, k, lda, ldb, ldc))
        a_cm = _doubles(a, lda * k).reshape(k, lda).T[:m, :]  # column j of A starts at j * lda
        b_cm = _doubles(b, ldb * n).reshape(n, ldb).T[:k, :]
        c_cm = _doubles(c, ldc * n).reshape(n, ldc).T
        c_cm[:m, :n] = alpha._obj.value * (a_cm @ b_cm)
        return 0
