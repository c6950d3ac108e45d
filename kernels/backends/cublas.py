"""Float64 matrix products on an NVIDIA GPU through cuBLAS's DGEMM, loaded with ctypes (no torch, no CuPy).

The oracles' largest work is a float64 matrix product: a matmul key's A @ B and |A| @ |B| at a 7B model's prefill
sizes (4096 x 3584 x 37888, 2.2 TFLOP for the pair) take numpy many seconds on a machine's cores, and a sweep asks for
them at each bucket's smallest and largest member. cuBLAS's DGEMM is an independent float64 implementation (IEEE
double arithmetic in NVIDIA's library, no part of nbxcert or Triton) that a Hopper GPU runs at tens of TFLOP/s. Used
when NBXCERT_ORACLE_PRODUCTS=device (`nbxcert.kernels.products`, which says when and why):

- `gemm(lib, device, a, b, c, nb, m, n, k)`: C = A @ B for float64 row-major batches already on the device, each one
  DGEMM queued on this thread's stream (`products.device_products` widens a kernel's operands there first);
- `matmul64(a, b, device)`: the same for float64 numpy arrays, as `np.matmul` (leading dimensions broadcast): the
  operands go to the device, the product comes back.

Only the summation order differs from numpy's (a relative difference near 1e-16, far below any tolerance a kernel is
judged at).

Which library (`load`): the path in NBXCERT_CUBLAS, else the first of `libcublas.so.13`, `libcublas.so.12`,
`libcublas.so` that the dynamic linker loads, then those of the CUDA wheels beside this Python
(`site-packages/nvidia/*/lib`, `nvidia/cu*/lib`), then `$CUDA_HOME/lib64` and `/usr/local/cuda/lib64`. A library
whose `cublasCreate_v2` makes no handle (a link-time stub) is refused by name.
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
import threading
from typing import Any

import numpy as np

from nbxcert.errors import BackendUnavailable

CUBLAS_STATUS_SUCCESS = 0
CUBLAS_OP_N = 0
NAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")

_lock = threading.Lock()
_loaded: list[Any] = []  # [Cublas] once loaded in this process


class Cublas:
    """A loaded libcublas with the functions `gemm` calls bound (argtypes, restype), and where it came from."""

    def __init__(self, lib: Any, path: str):
        self.path = path
        self.handles: dict[tuple[int, int], ctypes.c_void_p] = {}  # (process, device) -> this library's handle
        p, i, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_double
        pd = ctypes.POINTER(d)
        self.create = _bind(lib, "cublasCreate_v2", [ctypes.POINTER(p)])
        self.set_stream = _bind(lib, "cublasSetStream_v2", [p, p])
        self.get_version = _bind(lib, "cublasGetVersion_v2", [p, ctypes.POINTER(i)])
        # cublasDgemm_v2(handle, transa, transb, m, n, k, alpha*, A, lda, B, ldb, beta*, C, ldc): column-major
        self.dgemm = _bind(lib, "cublasDgemm_v2", [p, i, i, i, i, i, pd, p, i, p, i, pd, p, i])

    def version(self, handle: ctypes.c_void_p) -> int:
        v = ctypes.c_int()
        _check(self.get_version(handle, ctypes.byref(v)), "cublasGetVersion_v2", self.path)
        return v.value


def _bind(lib: Any, name: str, argtypes: list) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def _check(status: int, name: str, path: str) -> None:
    if status != CUBLAS_STATUS_SUCCESS:
        raise BackendUnavailable(
            f"{name} failed with cuBLAS status {status} ({path})",
            hint="run with NBXCERT_ORACLE_PRODUCTS=host to compute the oracles' products with numpy on the host",
        )


def candidates() -> list[str]:
    """Where `load` looks for libcublas, in order (NBXCERT_CUBLAS alone when it is set)."""
    given = os.environ.get("NBXCERT_CUBLAS", "").strip()
    if given:
        return [given]
    found = list(NAMES)
    roots = [*site.getsitepackages(), site.getusersitepackages(), *[p for p in sys.path if p.endswith("-packages")]]
    for root in dict.fromkeys(roots):
        for pattern in ("nvidia/*/lib/libcublas.so*", "nvidia/cu*/lib/libcublas.so*"):
            found += sorted(glob.glob(os.path.join(root, pattern)), reverse=True)
    for home in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libcublas.so*")), reverse=True)
    return [f for f in dict.fromkeys(found) if "Lt" not in os.path.basename(f)]


def load() -> Cublas:
    """This process's cuBLAS, loaded on first use; `BackendUnavailable` naming every place tried when none loads."""
    if _loaded:
        return _loaded[0]
    with _lock:
        if _loaded:
            return _loaded[0]
        tried = []
        for path in candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                tried.append(path)
                continue
            try:
                _loaded.append(Cublas(lib, path))
            except AttributeError as e:
                raise BackendUnavailable(
                    f"{path} lacks a cuBLAS function nbxcert calls ({e})",
                    hint="point NBXCERT_CUBLAS at libcublas of CUDA 12 or newer",
                ) from e
            return _loaded[0]
    given = os.environ.get("NBXCERT_CUBLAS", "").strip()
    raise BackendUnavailable(
        f"no libcublas could be loaded (tried {', '.join(tried)})" + (" from NBXCERT_CUBLAS" if given else ""),
        hint="install CUDA's cuBLAS (pip install nvidia-cublas) or point NBXCERT_CUBLAS at libcublas.so; "
        "NBXCERT_ORACLE_PRODUCTS=host computes the oracles' products with numpy instead",
    )


def _handle(lib: Cublas, device: int) -> ctypes.c_void_p:
    """This process's cuBLAS handle for `device` (made in its context, which nbxcert keeps current on this thread)."""
    key = (os.getpid(), device)
    handle = lib.handles.get(key)
    if handle is None:
        handle = ctypes.c_void_p()
        _check(lib.create(ctypes.byref(handle)), "cublasCreate_v2", lib.path)
        if not handle.value:
            raise BackendUnavailable(
                f"cublasCreate_v2 of {lib.path} made no handle (a stub library?)",
                hint="point NBXCERT_CUBLAS at the real libcublas, or run with NBXCERT_ORACLE_PRODUCTS=host",
            )
        lib.handles[key] = handle
    return handle


def dgemm_row_major(lib: Cublas, handle, a_ptr: int, b_ptr: int, c_ptr: int, m: int, n: int, k: int) -> None:
    """C = A @ B for row-major A [m, k], B [k, n], C [m, n] (float64, contiguous), as one column-major DGEMM: a
    row-major matrix is its transpose in column-major order, and C^T = B^T @ A^T."""
    one, zero = ctypes.c_double(1.0), ctypes.c_double(0.0)
    status = lib.dgemm(
        handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, ctypes.byref(one), b_ptr, n, a_ptr, k, ctypes.byref(zero), c_ptr, n
    )
    _check(status, "cublasDgemm_v2", lib.path)


def gemm(lib: Cublas, device: int, a_ptr: int, b_ptr: int, c_ptr: int, nb: int, m: int, n: int, k: int) -> None:
    """C[i] = A[i] @ B[i] for i < nb, float64 row-major contiguous batches on `device`, queued on this thread's
    stream (the caller synchronises before reading C)."""
    from nbxcert.kernels.backends import cuda

    handle = _handle(lib, device)
    _check(lib.set_stream(handle, ctypes.c_void_p(cuda.current_stream(device))), "cublasSetStream_v2", lib.path)
    for i in range(nb):
        dgemm_row_major(lib, handle, a_ptr + i * m * k * 8, b_ptr + i * k * n * 8, c_ptr + i * m * n * 8, m, n, k)


def matmul64(a: np.ndarray, b: np.ndarray, device: str, lib: Cublas | None = None) -> np.ndarray:
    """a @ b (float64, leading dimensions broadcast as `np.matmul`'s) computed by DGEMM on `device` ('cuda:i')."""
    from nbxcert.kernels.backends import cuda
    from nbxcert.kernels.tensor import as_device, empty, from_numpy

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        return np.matmul(a, b)  # numpy's own error for shapes a product does not take; vectors stay numpy's
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = np.empty((*lead, m, n))
    if out.size == 0 or k == 0:
        out[...] = 0.0
        return out
    lib = load() if lib is None else lib
    dev = as_device(device)
    a_all = np.ascontiguousarray(np.broadcast_to(a, (*lead, m, k)).reshape(-1, m, k))
    b_all = np.ascontiguousarray(np.broadcast_to(b, (*lead, k, n)).reshape(-1, k, n))
    # one upload of each operand (every batch), one result buffer; a batch is an offset into them
    a_dev, b_dev = from_numpy(a_all, "float64", dev), from_numpy(b_all, "float64", dev)
    c_dev = empty((a_all.shape[0], m, n), "float64", dev)
    gemm(lib, dev.index, a_dev.data_ptr(), b_dev.data_ptr(), c_dev.data_ptr(), a_all.shape[0], m, n, k)
    cuda.synchronize()
    out[...] = c_dev.numpy().reshape(out.shape)
    return out
