"""Which backend launches kernels in this process, and why.

`cuda`: a usable NVIDIA GPU through nbxcert's torch-free libcuda driver. `interpreter`: Triton's interpreter on the
CPU, for CI and machines with no GPU. The choice is `NBXCERT_BACKEND` when set, else `cuda` when a GPU answers, else
`interpreter`; it is made once per process, before any kernel module is imported (Triton decides at decoration time
whether a `@triton.jit` function is compiled or interpreted), and is always reported with its reason.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from nbxcert.errors import BackendUnavailable

BACKENDS = ("cuda", "interpreter")


@dataclass(frozen=True)
class BackendChoice:
    """The backend in force (`name`), why (`reason`), and the device kernels launch on (`device`)."""

    name: str
    reason: str
    device: str

    def line(self) -> str:
        return f"[nbxcert] backend: {self.name} ({self.reason})"


_lock = threading.Lock()
_choice: BackendChoice | None = None


def _decide() -> BackendChoice:
    from nbxcert.kernels.backends import cuda

    asked = os.environ.get("NBXCERT_BACKEND", "").strip()
    if asked:
        if asked not in BACKENDS:
            raise BackendUnavailable(f"NBXCERT_BACKEND={asked} is not a backend; choose one of: {', '.join(BACKENDS)}")
        if asked == "interpreter":
            return BackendChoice("interpreter", "NBXCERT_BACKEND=interpreter", "cpu")
        ok, why = cuda.available()
        if not ok:
            raise BackendUnavailable(f"NBXCERT_BACKEND=cuda, but no usable NVIDIA GPU: {why}")
        return BackendChoice("cuda", "NBXCERT_BACKEND=cuda", "cuda:0")
    ok, why = cuda.available()
    if ok:
        return BackendChoice("cuda", "an NVIDIA GPU answers through libcuda", "cuda:0")
    return BackendChoice("interpreter", f"no usable NVIDIA GPU: {why}", "cpu")


def select() -> BackendChoice:
    """The backend of this process, decided on first call and then fixed. Sets up Triton for it."""
    global _choice
    choice = _choice
    if choice is not None:  # decided: no lock (every launch asks, through `upcast()`)
        return choice
    with _lock:
        if _choice is None:
            choice = _decide()
            if choice.name == "interpreter":
                from nbxcert.kernels.backends import interpreter

                interpreter.activate()
            else:
                from nbxcert.kernels.backends import triton_cuda

                triton_cuda.install()
            _choice = choice
        return _choice


def peek() -> BackendChoice:
    """The backend that `select()` would choose, without activating it (for `doctor`)."""
    return _choice if _choice is not None else _decide()
