"""Triton's interpreter on the CPU as an nbxcert backend.

Kernels run under `TRITON_INTERPRET=1` on `cpu` tensors, which the interpreter reads through their raw pointers
(nbxcert's `Tensor` answers the storage calls it makes, so no copy is made). Used by CI and by machines with no GPU;
certificates made here are conformance certificates of the `cpu/interpreter` profile, never served to a GPU.
"""

from __future__ import annotations

import os

from nbxcert.errors import BackendUnavailable


def numpy_problem() -> str | None:
    """Why the installed Triton's interpreter cannot run with the installed numpy, or None.

    Triton 3.6's interpreter breaks with numpy >= 2.3 (seen 2026-11-29; Triton 3.8 does not)."""
    import numpy
    import triton

    triton_version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    numpy_version = tuple(int(p) for p in numpy.__version__.split(".")[:2])
    if triton_version < (3, 8) and numpy_version >= (2, 3):
        return (
            f"Triton {triton.__version__}'s interpreter does not run with numpy {numpy.__version__}; "
            "install numpy<2.3 or Triton>=3.8"
        )
    return None


def activate() -> None:
    """Make `@triton.jit` functions interpreted in this process. Must run before kernel modules are imported, and before
    `triton.language` is: Triton decorates its own helpers (tl.zeros, tl.sum, tl.cdiv, ...) when that module is first
    imported, interpreted or compiled as `TRITON_INTERPRET` then says, and a compiled-mode helper called inside an
    interpreted kernel fails ("Cannot call @triton.jit'd outside of the scope of a kernel"). A process that imported
    Triton before choosing this backend is refused with one line (`language_decorated_compiled`); nothing of Triton's
    is re-made."""
    os.environ["TRITON_INTERPRET"] = "1"
    problem = numpy_problem() or language_decorated_compiled()
    if problem:
        hint = (
            "pip install 'numpy<2.3' (or a newer triton), then run again"
            if "numpy" in problem
            else "set NBXCERT_BACKEND=interpreter and TRITON_INTERPRET=1 in the environment before the process starts"
        )
        raise BackendUnavailable(problem, hint=hint)


def language_decorated_compiled() -> str | None:
    """Why Triton's language helpers cannot run under the interpreter in this process, or None: `triton.language` was
    imported while `TRITON_INTERPRET` was unset, so its helpers are compiled-mode `JITFunction`s."""
    from nbxcert.kernels.backends import triton_language_mode

    if triton_language_mode() != "compiled":
        return None
    return (
        "Triton was imported before nbxcert chose its interpreter backend, so Triton's own helpers are compiled, not "
        "interpreted"
    )
