"""Each kernel module reads its JIT functions' Triton cache keys as its import ends (`jit.settle_keys`).

Triton 3.6's key of a JIT function that calls another merged the callee's global values only where the callee's key
had been read before: `pointwise._map_kernel`'s key differed between a process that read it first and one that read
every spec's kernels first, so a bundled binary went unfound and `bundle --check` called it stale. Read at import,
every process gets the same keys. Run in a subprocess cross-compiling for sm_90, where kernels are JIT functions."""

from __future__ import annotations

from crosstools import cross_compile


def keys_read(payload):
    """(In the subprocess.) The kernel modules imported; the JIT functions whose key was not computed by then; then
    `payload["first"]`'s key read before any other, and every JIT function's key of the kernel modules."""
    import importlib
    import sys

    import triton

    from nbxcert.kernels.spec import load_all

    load_all()
    for name in payload["modules"]:
        importlib.import_module(name)
    functions = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("nbxcert.kernels."):
            for attr, value in vars(module).items():
                if isinstance(value, triton.runtime.JITFunction) and value.__module__ == name:
                    functions[f"{name}.{attr}"] = value
    unread = sorted(n for n, f in functions.items() if f.hash is None)
    if payload["first"]:
        functions[payload["first"]].cache_key  # noqa: B018 - read first, on purpose
    yield {"unread": unread, "keys": {n: f.cache_key for n, f in sorted(functions.items())}}


def test_every_kernel_key_is_read_at_import_and_the_same_whatever_is_read_first():
    payload = {"modules": ["nbxcert.kernels.pointwise"], "first": None}
    (plain,) = cross_compile(90, keys_read, payload, timeout=300)
    (mapped_first,) = cross_compile(90, keys_read, {**payload, "first": "nbxcert.kernels.pointwise._map_kernel"}, 300)
    assert plain["unread"] == [], "JIT functions whose key no import read"
    assert len(plain["keys"]) > 200 and "nbxcert.kernels.pointwise._map_kernel" in plain["keys"]
    assert mapped_first["keys"] == plain["keys"]
