"""Which backend launches kernels in this process, and why.

`cuda`: a usable NVIDIA GPU through nbxcert's torch-free libcuda driver. `interpreter`: Triton's interpreter on the
CPU, for CI and machines with no GPU. The choice is `NBXCERT_BACKEND` when set, else `cuda` when a GPU answers, else
`interpreter`; it is made once per process, before any kernel module is imported (Triton decides at decoration time
whether a `@triton.jit` function is compiled or interpreted), and is always reported with its reason.

A backend that no environment variable names is fixed by its own module through `fix()` instead: `cross`, which
compiles for a named GPU target on a machine without that GPU and launches nothing (the census, `bench_host.py`).
Launch code asks `device_info()`, not `cuda`, about the device, so such a backend can describe the device it stands for.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from nbxcert.errors import BackendUnavailable

BACKENDS = ("cuda", "interpreter")


@dataclass(frozen=True)
class BackendChoice:
    """The backend in force (`name`), why (`reason`), and the device kernels launch on (`device`). `stand_in`: the
    `cuda.DeviceInfo` that `device_info()` answers for a backend with no such device (the cross-compiling one)."""

    name: str
    reason: str
    device: str
    stand_in: Any = field(default=None, compare=False, repr=False)

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


def fix(choice: BackendChoice, keep_chosen: bool = False) -> BackendChoice:
    """Fix this process's backend to `choice` instead of deciding it (the way `cross` is selected); return the backend
    in force. Call it before any kernel module is imported, as `select()` would be. A backend already in force stays:
    with `keep_chosen` it is returned, otherwise a different one is refused (`BackendUnavailable`), since the kernel
    modules were decorated for it."""
    global _choice
    with _lock:
        if _choice is None:
            _choice = choice
        elif _choice != choice and not keep_chosen:
            raise BackendUnavailable(
                f"this process's backend is {_choice.name} ({_choice.reason}) already; it cannot become {choice.name} "
                f"({choice.reason})",
                hint="choose the backend before any kernel module is imported",
            )
        return _choice


def triton_language_mode() -> str | None:
    """How Triton decorated its own language helpers (tl.zeros, tl.sum, tl.cdiv, ...) in this process: "interpreted" or
    "compiled", as `TRITON_INTERPRET` said when `triton.language` was first imported; None when it is not imported yet.
    A backend whose kernels need the other kind refuses the process (Triton offers no way to decorate them again)."""
    import sys

    if "triton.language" not in sys.modules:
        return None
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return "interpreted" if isinstance(tl.standard.zeros_like, InterpretedFunction) else "compiled"


def on_gpu(device, backend: str | None = None) -> bool:
    """Whether `device` is a GPU of the cuda backend (`backend`: the backend's name, when the caller knows it without
    fixing the process's; else the one selected), not the interpreter's host."""
    from nbxcert.kernels.tensor import as_device

    return as_device(device).type == "cuda" and (backend or select().name) == "cuda"


def device_info(index: int = 0):
    """What the device kernels launch on says of itself (`cuda.DeviceInfo`): the driver's answer, or the stand-in of a
    backend with no such device (persistent kernels size their grid by its `multiprocessor_count`)."""
    stand_in = select().stand_in
    if stand_in is not None:
        return dataclasses.replace(stand_in, attributes=dict(stand_in.attributes))  # a copy, as `cuda.device_info`'s
    from nbxcert.kernels.backends import cuda

    return cuda.device_info(index)


def peek() -> BackendChoice:
    """The backend that `select()` would choose, without activating it (for `doctor`)."""
    return _choice if _choice is not None else _decide()
