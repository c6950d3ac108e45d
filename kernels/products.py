"""Which float64 matrix product the oracles' largest products use: numpy's on the host, or cuBLAS's DGEMM on the GPU.

The float64 references in `nbxcert.oracles` take their matrix product as an argument (`product=`, numpy's `matmul` by
default). A kernel family's oracle adapter asks `product_for(device)` for the one to hand them:

    NBXCERT_ORACLE_PRODUCTS=auto     (default) the GPU the inputs lie on, through cuBLAS (`backends.cublas`), when the
                                     backend is cuda and libcublas loads; numpy on the host otherwise
    NBXCERT_ORACLE_PRODUCTS=host     numpy on the host, always
    NBXCERT_ORACLE_PRODUCTS=device   cuBLAS on the GPU; an error naming where libcublas was looked for if none loads

Both are float64 products of the same float64 operands (only the summation order differs: a relative difference near
1e-16), so a verdict does not depend on the choice; its time does (a 7B model's largest matmul key: seconds of numpy
against a fraction of a second). `describe(device)` says which is in force, for `nbxcert doctor` and `certify`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from nbxcert.errors import BackendUnavailable, UsageError

CHOICES = ("auto", "host", "device")


def choice() -> str:
    """NBXCERT_ORACLE_PRODUCTS, checked (default `auto`)."""
    text = os.environ.get("NBXCERT_ORACLE_PRODUCTS", "").strip().lower() or "auto"
    if text not in CHOICES:
        raise UsageError(f"NBXCERT_ORACLE_PRODUCTS={text} is not one of {', '.join(CHOICES)}")
    return text


def _on_gpu(device, backend: str | None = None) -> bool:
    from nbxcert.kernels.tensor import as_device

    return (backend or _backend_name()) == "cuda" and as_device(device).type == "cuda"


def product_for(device) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The float64 matrix product for an oracle whose inputs lie on `device` (see the module's table)."""
    wanted = choice()
    if wanted == "host" or not _on_gpu(device):
        if wanted == "device" and not _on_gpu(device):
            raise UsageError(
                f"NBXCERT_ORACLE_PRODUCTS=device, but the inputs lie on {device} with the "
                f"{_backend_name()} backend: cuBLAS products need an NVIDIA GPU"
            )
        return np.matmul
    from nbxcert.kernels.backends import cublas

    try:
        lib = cublas.load()
    except BackendUnavailable:
        if wanted == "device":
            raise
        return np.matmul
    name = str(device)
    return lambda a, b: cublas.matmul64(a, b, name, lib)


def _backend_name() -> str:
    from nbxcert.kernels.backends import select

    return select().name


def describe(device, backend: str | None = None) -> str:
    """One line: which product the oracles use for inputs on `device`, and why (`backend`: the backend's name, when
    the caller knows it without fixing the process's)."""
    wanted = choice()
    if wanted == "host":
        return "numpy on the host (NBXCERT_ORACLE_PRODUCTS=host)"
    if not _on_gpu(device, backend):
        return f"numpy on the host (the {backend or _backend_name()} backend has no GPU)"
    from nbxcert.kernels.backends import cublas

    try:
        lib = cublas.load()
    except BackendUnavailable as e:
        if wanted == "device":
            raise
        return f"numpy on the host ({e}; NBXCERT_CUBLAS names a libcublas)"
    return f"cuBLAS DGEMM on {device} ({lib.path})"
