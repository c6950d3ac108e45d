"""`jit`: `triton.jit` after the process's backend is chosen.

Triton decides when a function is decorated whether it will be compiled or interpreted (`TRITON_INTERPRET`), so every
kernel module decorates through this, which selects the backend first (and reports nothing: the CLI reports it).
"""

from __future__ import annotations

import triton

from nbxcert.kernels.backends import select


def jit(fn=None, **kwargs):
    """Exactly `triton.jit` (same arguments), with the backend selected first."""
    select()
    if fn is None:
        return lambda f: triton.jit(f, **kwargs)
    return triton.jit(fn, **kwargs)
