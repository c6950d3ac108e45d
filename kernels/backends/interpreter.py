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
    """Make `@triton.jit` functions interpreted in this process. Must run before kernel modules are imported."""
    os.environ["TRITON_INTERPRET"] = "1"
    problem = numpy_problem()
    if problem:
        raise BackendUnavailable(problem, hint="pip install 'numpy<2.3' (or a newer triton), then run again")
    _interpret_language_helpers()


def _interpret_language_helpers() -> None:
    """Re-make triton.language's own @jit helpers (tl.zeros, tl.sum, tl.cdiv, ...) as interpreted functions.

    Triton decides when a function is decorated whether it is interpreted, and triton.language decorates its helpers
    when it is first imported, which in nbxcert happens before the backend is chosen. Left alone they stay compiled-mode
    JITFunctions, whose call inside an interpreted kernel raises "Cannot call @triton.jit'd outside of the scope of a
    kernel". Each is wrapped once, and replaced wherever triton.language exposes it (the module namespaces and the
    tensor class's member functions)."""
    import sys

    if "triton.language" not in sys.modules:
        return  # imported later, triton.language decorates its helpers as interpreted functions itself
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    wrapped: dict[int, InterpretedFunction] = {}
    for owner in (tl, tl.standard, tl.math, tl.core, tl.tensor):
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                if id(value) not in wrapped:
                    wrapped[id(value)] = InterpretedFunction(value.fn)
                setattr(owner, name, wrapped[id(value)])
