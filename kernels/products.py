"""Which float64 matrix product the oracles' largest products use: numpy's on the host, or cuBLAS's DGEMM on the GPU.

The float64 references in `nbxcert.oracles` take their matrix product as an argument (`product=`, numpy's `matmul` by
default). A kernel family's oracle adapter asks `product_for(device)` for the one to hand them:

    NBXCERT_ORACLE_PRODUCTS=host     (default) numpy on the host
    NBXCERT_ORACLE_PRODUCTS=device   cuBLAS on the GPU the inputs lie on (`backends.cublas`); an error naming where
                                     libcublas was looked for if none loads, or if the inputs are not on a GPU

Both are float64 products of the same float64 operands (only the summation order differs: a relative difference near
1e-16), so a verdict does not depend on the choice; its time does, both ways. The device's product moves the float64
operands to the GPU and the result back: on an H200, qwen2.5-7b's decode LM-head keys (M 32 to 64 tokens, N 152064,
K 3584: a 4.4 GB float64 weight for 0.14 TFLOP) took 18 to 21 s a key with it against 13 to 15 s with numpy
(benchmarks/README.md, throughput), so the host's is the default; the prefill keys, where the product's arithmetic
outweighs its transfer, are not measured yet. `describe(device)` says which is in force, for `nbxcert doctor` and
`certify`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from nbxcert.errors import UsageError

CHOICES = ("host", "device")


def choice() -> str:
    """NBXCERT_ORACLE_PRODUCTS, checked (default `host`)."""
    text = os.environ.get("NBXCERT_ORACLE_PRODUCTS", "").strip().lower() or "host"
    if text not in CHOICES:
        raise UsageError(f"NBXCERT_ORACLE_PRODUCTS={text} is not one of {', '.join(CHOICES)}")
    return text


def _on_gpu(device, backend: str | None = None) -> bool:
    from nbxcert.kernels.tensor import as_device

    return (backend or _backend_name()) == "cuda" and as_device(device).type == "cuda"


def product_for(device) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The float64 matrix product for an oracle whose inputs lie on `device` (see the module's table)."""
    if choice() == "host":
        return np.matmul
    if not _on_gpu(device):
        raise UsageError(
            f"NBXCERT_ORACLE_PRODUCTS=device, but the inputs lie on {device} with the "
            f"{_backend_name()} backend: cuBLAS products need an NVIDIA GPU"
        )
    from nbxcert.kernels.backends import cublas

    lib = cublas.load()
    name = str(device)
    return lambda a, b: cublas.matmul64(a, b, name, lib)


def _backend_name() -> str:
    from nbxcert.kernels.backends import select

    return select().name


def describe(device, backend: str | None = None) -> str:
    """One line: which product the oracles use for inputs on `device` (`backend`: the backend's name, when the caller
    knows it without fixing the process's). NBXCERT_ORACLE_PRODUCTS=device with no GPU or no libcublas raises."""
    if choice() == "host":
        return "numpy on the host (NBXCERT_ORACLE_PRODUCTS=device: cuBLAS on the GPU)"
    if not _on_gpu(device, backend):
        raise UsageError(
            f"NBXCERT_ORACLE_PRODUCTS=device, but the {backend or _backend_name()} backend has no GPU: "
            "cuBLAS products need an NVIDIA GPU"
        )
    from nbxcert.kernels.backends import cublas

    return f"cuBLAS DGEMM on {device} ({cublas.load().path})"
