"""`jit` and `tl`: Triton's decorator and language module, imported only once the process's backend is chosen.

Triton decides when a function is decorated whether it will be compiled or interpreted (`TRITON_INTERPRET`), and it
decorates its own language helpers (tl.zeros, tl.sum, tl.cdiv, ...) when `triton.language` is first imported. So this
module chooses the backend before it imports Triton, and every kernel module takes `tl` and `jit` from here instead
of importing Triton itself: importing any kernel module first (`from nbxcert.kernels import rows`) then works on
every backend, the interpreter included, with nothing of Triton's re-made. `jit` selects again before decorating
(a no-op once chosen) and reports nothing: the CLI reports the choice.
"""

from __future__ import annotations

from nbxcert.kernels.backends import select

select()  # before Triton's first import in this module (see the module doc)

import triton  # noqa: E402 - after select(), on purpose
import triton.language as tl  # noqa: E402 - after select(), on purpose

__all__ = ["jit", "tl"]


def jit(fn=None, **kwargs):
    """Exactly `triton.jit` (same arguments), with the backend selected first."""
    select()
    if fn is None:
        return lambda f: triton.jit(f, **kwargs)
    return triton.jit(fn, **kwargs)
