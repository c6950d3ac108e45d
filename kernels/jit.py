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

__all__ = ["jit", "settle_keys", "tl"]


def jit(fn=None, **kwargs):
    """Exactly `triton.jit` (same arguments), with the backend selected first."""
    select()
    if fn is None:
        return lambda f: triton.jit(f, **kwargs)
    return triton.jit(fn, **kwargs)


def settle_keys(namespace: dict) -> None:
    """Read the Triton cache key of each JIT function a kernel module defines, in definition order, as its import
    ends (each kernel module's last line: `settle_keys(globals())`).

    Triton 3.6's `JITFunction.cache_key` merges a called JIT function's global values into the caller's key only where
    the callee's key was read before the caller's, so a key depends on the order a process first reads them (seen:
    `pointwise._map_kernel`'s differed between a process that read every spec's kernels first and one that read it
    first). Read here, at import, every process gets the same keys, whatever it launches or bundles first: a bundled
    binary is found by them. Interpreted functions have no key and are left alone."""
    jit_function = getattr(triton.runtime, "JITFunction", None)
    if jit_function is None:
        return
    module = namespace.get("__name__")
    for value in list(namespace.values()):
        if isinstance(value, jit_function) and getattr(value, "__module__", None) == module:
            value.cache_key  # noqa: B018 - read for its effect: the key is computed and kept
