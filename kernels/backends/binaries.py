"""Compiled kernels served without Triton's compiler: what a bundle holds of one, how a launch finds it, how it runs.

A served launch normally goes through Triton's dispatch, which compiles the kernel the first time a process meets its
specialization (or loads it from Triton's on-disk cache, after computing Triton's cache key over its own sources) and
compiles a C launcher for its signature. A bundle (`nbxcert bundle`) holds the certified winners already compiled for
a GPU target. This module is the kernel layer's side of it:

- `KernelBinary`: one compiled kernel (its cubin, its symbol, its launch figures and its parameter types) and what
  names it: the JIT function (`identity_of`: module.qualname and Triton's own hash of its source and dependencies) and
  the specialization a launch's arguments give (`specialization_of`: Triton's binder, as `JITFunction.run` calls it;
  the same string on any machine with the same Triton, whatever its device).
- `describe(compiled)`: the JSON-able record of a Triton `CompiledKernel` (made where the bundle is built, usually by
  cross-compiling), which a `KernelBinary` carries beside its image.
- A seam: `set_source(lookup)` (registered from above, by `nbxcert.serving`, never imported from here): each launch of
  a JIT function on the cuda backend asks `lookup(identity, source_key, specialization)` for a binary; a binary found
  is loaded into the device's context once (`Loaded`) and launched through nbxcert's launcher (`launcher`), so no
  compiler runs for it. No lookup registered, or no binary for the launch: Triton's dispatch as always.

Launching follows Triton's own launcher exactly (Triton 3.6 and 3.9 pass the same parameters): the kernel's arguments
in order, constexprs and arguments specialized to constants left out, a host tensor descriptor expanded as Triton
expands it (the encoded CUtensorMap, then its shape and strides; or, for a kernel lowered to plain loads, its base,
shape, strides, padding flag, shape and strides), then the global and the profile scratch pointers. The block is
32 x num_warps threads, the grid's x is multiplied by num_ctas (with a cluster of num_ctas), and shared memory over
48 KiB is opted into as Triton's loader does.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbxcert.errors import BackendUnavailable

# Triton's scalar types -> nbxcert's launcher's type codes (`launcher.c`)
TYPE_CODES = {
    "i1": "b",
    "i8": "b",
    "i16": "h",
    "i32": "i",
    "i64": "l",
    "u1": "B",
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "u64": "L",
    "fp16": "e",
    "bf16": "g",
    "fp32": "f",
    "f32": "f",
    "fp64": "d",
}
SCRATCH_CODES = "PP"  # the global and profile scratch pointers every Triton kernel takes last
SHARED_WITHOUT_OPT_IN = 49152  # bytes of dynamic shared memory a kernel gets without opting in (48 KiB)
RECORD_FIELDS = (
    "name",
    "num_warps",
    "num_ctas",
    "shared",
    "global_scratch_size",
    "global_scratch_align",
    "profile_scratch_size",
    "launch_cooperative_grid",
    "launch_pdl",
    "signature",
    "tensordesc_meta",
)
_TENSORDESC = re.compile(r"tensordesc<([^[>]*)\[([^]]*)\]")
_POINTER = re.compile(r"\*k?[a-z][a-z0-9]*")  # Triton's pointer types: *fp16, *kbf16 (a const pointer), *i32, ...


class BinaryUnusable(BackendUnavailable):
    """A compiled kernel of a bundle cannot be launched here (a parameter type nbxcert's launcher does not take, a
    driver that refuses its image)."""


def param_codes(signature: Sequence[tuple[str, Any]], tensordesc_meta: Sequence[Any] | None) -> str:
    """The launcher's type codes for a kernel's arguments in order (`signature`: (name, Triton type) pairs, constexprs
    included as 'constexpr'), descriptors expanded as Triton expands them, the two scratch pointers last."""
    codes: list[str] = []
    descriptor = 0
    for name, ty in signature:
        if not isinstance(ty, str):
            raise BinaryUnusable(
                f"argument {name} has a tuple type ({ty}): nbxcert's launcher takes no tuple arguments"
            )
        if ty == "constexpr":
            codes.append("-")
        elif _POINTER.fullmatch(ty):
            codes.append("P")
        elif ty.startswith("tensordesc"):
            found = _TENSORDESC.match(ty)
            if found is None:
                raise BinaryUnusable(f"argument {name} has a descriptor type nbxcert cannot read: {ty}")
            ndim = found.group(2).count(",") + 1
            meta = tensordesc_meta[descriptor] if tensordesc_meta else None
            descriptor += 1
            codes.append("P" + "l" * (2 * ndim) + "b" if meta is None else "T")
            codes.append("i" * ndim + "l" * ndim)
        elif ty in TYPE_CODES:
            codes.append(TYPE_CODES[ty])
        else:
            raise BinaryUnusable(f"argument {name} has type {ty}, which nbxcert's launcher does not take")
    return "".join(codes) + SCRATCH_CODES


def _plain(value: Any) -> Any:
    """A JSON-able copy of a metadata value (tuples as lists, dicts with string keys)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def describe(compiled: Any) -> dict[str, Any]:
    """The record of a Triton `CompiledKernel` a bundle keeps beside its cubin (`RECORD_FIELDS`); `BinaryUnusable`
    where nbxcert's launcher could not launch it."""
    meta = compiled.metadata
    signature = [[name, _plain(ty)] for name, ty in compiled.src.signature.items()]
    record = {field: _plain(getattr(meta, field, None)) for field in RECORD_FIELDS if field != "signature"}
    record["signature"] = signature
    record["tensordesc_meta"] = record["tensordesc_meta"] or None
    for field in RECORD_FIELDS:
        if record.get(field) is None and field not in ("tensordesc_meta",):
            raise BinaryUnusable(f"compiled kernel {getattr(meta, 'name', '?')} has no {field} in its metadata")
    param_codes(signature, record["tensordesc_meta"])  # refused here, where it is built, not where it is served
    return record


@dataclass(frozen=True)
class KernelBinary:
    """One compiled kernel of a bundle: its image (cubin) and launch record, and the launch it answers."""

    identity: str  # module.qualname of the JIT function
    source_key: str  # Triton's hash of the function's source and dependencies (`JITFunction.cache_key`)
    specialization: str  # what Triton's binder made of the launch's arguments (`specialization_of`)
    image: bytes
    record: Mapping[str, Any]  # `describe`'s fields

    @functools.cached_property
    def sha256(self) -> str:
        """The image's SHA-256 (hex), computed once: `load` keys its loaded kernels by it."""
        return hashlib.sha256(self.image).hexdigest()

    @property
    def codes(self) -> bytes:
        return param_codes([tuple(p) for p in self.record["signature"]], self.record["tensordesc_meta"]).encode()


# ---------------------------------------------------------------------------------------------------------------------
# What names a launch
# ---------------------------------------------------------------------------------------------------------------------
_IDENTITY = "_nbxcert_identity"  # where a JIT function keeps its identity once computed (it lives as long as it)


def identity_of(kernel: Any) -> tuple[str, str]:
    """(module.qualname, Triton's source key) of a JIT function; computed once per function."""
    found = getattr(kernel, _IDENTITY, None)
    if found is None:
        fn = kernel.fn
        found = (f"{fn.__module__}.{fn.__qualname__}", kernel.cache_key)
        setattr(kernel, _IDENTITY, found)
    return found


def specialization_of(kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The specialization Triton's binder makes of a launch's arguments (types, 16-byte divisibility, constants and
    options such as num_warps and num_stages), as the string Triton keys its in-memory cache with. The active Triton
    driver's device is asked only for its binder; the string does not depend on the device."""
    from triton import knobs
    from triton.runtime.driver import driver
    from triton.runtime.jit import compute_cache_key

    options = dict(kwargs)
    options["debug"] = options.get("debug", kernel.debug) or knobs.runtime.debug
    mode = getattr(knobs.compilation, "instrumentation_mode", None)
    if mode is not None:  # Triton 3.9's run() passes it to the binder too
        options["instrumentation_mode"] = mode
    binder = kernel.device_caches[driver.active.get_current_device()][-1]
    _, specialization, bound_options = binder(*args, **options)
    return compute_cache_key({}, specialization, bound_options)


# ---------------------------------------------------------------------------------------------------------------------
# The seam: where binaries come from
# ---------------------------------------------------------------------------------------------------------------------
Lookup = Callable[[str, str, str], "KernelBinary | None"]
_source: Lookup | None = None


def set_source(lookup: Lookup | None) -> Lookup | None:
    """Register where launches look for compiled kernels (None: nowhere); returns the previous lookup."""
    global _source
    previous, _source = _source, lookup
    return previous


def source() -> Lookup | None:
    return _source


def find(kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> KernelBinary | None:
    """The registered source's binary for this launch of `kernel` (a JIT function), or None."""
    lookup = _source
    if lookup is None or not hasattr(kernel, "device_caches"):
        return None
    identity, source_key = identity_of(kernel)
    return lookup(identity, source_key, specialization_of(kernel, args, kwargs))


# ---------------------------------------------------------------------------------------------------------------------
# Loading and launching
# ---------------------------------------------------------------------------------------------------------------------
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_CACHE_PREFER_SHARED = 1
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CUDA_ERROR_INVALID_CONTEXT = 201

_load_lock = threading.Lock()
_loaded: dict[tuple[str, int], Loaded] = {}
_launcher: Any = None


_tensor_map_type: Any = None  # the type of Triton's tensor map objects, once one has been seen
# the driver's graph functions a plan of several launches is queued through as one CUDA graph (`run_graph` in
# launcher.c), in the order `bind_graphs` takes them
GRAPH_SYMBOLS = (
    "cuGraphCreate",
    "cuGraphAddKernelNode_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecKernelNodeSetParams_v2",
    "cuStreamIsCapturing",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
)


def launcher_module() -> Any:
    """nbxcert's launcher, built on first use and bound to this process's driver (and to Triton's tensor map type,
    once known: `note_tensor_map`)."""
    global _launcher
    if _launcher is None:
        from nbxcert.kernels.backends import cuda
        from nbxcert.kernels.backends import launcher as build

        made = build.module(cuda.symbol_address("cuLaunchKernelEx"), _tensor_map_type)
        made.bind_graphs(*(cuda.symbol_address(name) for name in GRAPH_SYMBOLS))
        _launcher = made
    return _launcher


def note_tensor_map(made: Any) -> None:
    """Remember the type of a tensor map object Triton's `make_tensordesc_arg` made, so nbxcert's launcher takes such
    objects as they are (Triton defines the type only once its C utilities are built, which may be after the launcher
    was bound)."""
    global _tensor_map_type
    kind = type(made)
    if kind is _tensor_map_type or kind.__name__ != "PyCUtensorMap":
        return
    _tensor_map_type = kind
    if _launcher is not None:
        from nbxcert.kernels.backends import cuda

        _launcher.bind(cuda.symbol_address("cuLaunchKernelEx"), kind)


class Loaded:
    """A `KernelBinary` loaded into one device's primary context: its function handle and launch figures."""

    __slots__ = ("binary", "device", "function", "threads", "num_ctas", "shared", "flags", "codes", "scratch", "run")

    def __init__(self, binary: KernelBinary, device: int, function: int):
        record = binary.record
        self.binary, self.device, self.function = binary, device, function
        self.threads = 32 * int(record["num_warps"])
        self.num_ctas, self.shared = int(record["num_ctas"]), int(record["shared"])
        self.flags = (1 if record["launch_cooperative_grid"] else 0) | (2 if record["launch_pdl"] else 0)
        self.codes = binary.codes
        size = int(record["global_scratch_size"])
        self.scratch = (size, int(record["global_scratch_align"])) if size else None
        if int(record["profile_scratch_size"]):
            raise BinaryUnusable(
                f"kernel {record['name']} asks for profile scratch memory, which nbxcert does not give"
            )
        self.run = launcher_module().launch

    def launch(self, grid: tuple[int, int, int], stream: int, values: list) -> None:
        """Queue the kernel with the launcher arguments `values` (as `arguments` makes them, scratch pointers last)."""
        from nbxcert.kernels.backends import cuda

        figures = (self.function, *grid, self.threads, self.num_ctas, self.shared, stream, self.flags, self.codes)
        status = self.run(*figures, values)
        if status == CUDA_ERROR_INVALID_CONTEXT:  # a thread that has made no context current yet
            cuda.make_current(self.device)
            status = self.run(*figures, values)
        if status:
            cuda.check(status, f"cuLaunchKernelEx ({self.binary.record['name']}, from a bundle)")


def load(binary: KernelBinary, device: int) -> Loaded:
    """`binary` loaded into `device`'s primary context (once per process), shared memory opted into as Triton's
    loader does."""
    key = (binary.sha256, device)
    found = _loaded.get(key)
    if found is not None:
        return found
    import ctypes

    from nbxcert.kernels.backends import cuda

    with _load_lock:
        found = _loaded.get(key)
        if found is not None:
            return found
        cuda.bind_module_functions()
        cuda.make_current(device)
        name = binary.record["name"]
        module = ctypes.c_void_p()
        cuda.call("cuModuleLoadData", ctypes.byref(module), binary.image, what=f"kernel {name} from a bundle")
        function = ctypes.c_void_p()
        cuda.call("cuModuleGetFunction", ctypes.byref(function), module, name.encode(), what=name)
        shared = int(binary.record["shared"])
        if shared > SHARED_WITHOUT_OPT_IN:
            optin = cuda.device_attribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            if optin > SHARED_WITHOUT_OPT_IN:
                static = ctypes.c_int()
                cuda.call("cuFuncSetCacheConfig", function, CU_FUNC_CACHE_PREFER_SHARED, what=name)
                cuda.call("cuFuncGetAttribute", ctypes.byref(static), CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function)
                cuda.call(
                    "cuFuncSetAttribute",
                    function,
                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    optin - static.value,
                    what=name,
                )
        found = _loaded[key] = Loaded(binary, device, function.value)
        return found


def arguments(kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any], record: Mapping[str, Any]) -> list:
    """The launcher arguments of a launch, in the kernel's parameter order, descriptors expanded, without the scratch
    pointers: what `Loaded.launch` takes before them."""
    names = [p.name for p in kernel.params]
    bound = kernel.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    metas = list(record["tensordesc_meta"] or ())
    descriptor = 0
    values: list = []
    for name, ty in record["signature"]:
        value = bound.arguments[name]
        if ty.startswith("tensordesc"):
            meta = metas[descriptor] if metas else None
            descriptor += 1
            values.extend(expand_descriptor(value, meta))
        elif ty.startswith("*"):
            values.append(value if value is None or type(value) is int else value.data_ptr())
        else:
            values.append(value)
    return values


def expand_descriptor(value: Any, meta: Any) -> list:
    """A host tensor descriptor's launcher arguments, as Triton's `make_tensordesc_arg` makes them (its encoded
    CUtensorMap, shape and strides; for a kernel lowered to plain loads, base, shape, strides, padding flag, shape,
    strides)."""
    if meta is None:
        shape, strides = list(value.shape), list(value.strides)
        return [value.base.data_ptr(), *shape, *strides, value.padding == "nan", *shape, *strides]
    from triton.backends.nvidia import driver as nvidia_driver

    expanded = list(nvidia_driver.make_tensordesc_arg(value, meta))
    note_tensor_map(expanded[0])
    return expanded


def _device_of(launch: Any) -> int:
    """The CUDA device index of the first tensor a launch takes (0 when it takes none)."""
    for value in launch.args:
        t = getattr(value, "base", value)  # a tensor descriptor's tensor
        device = getattr(t, "device", None)
        if getattr(device, "type", None) == "cuda":
            return device.index
    return 0


def scratch_for(loaded: Loaded, grid: tuple[int, int, int], stream: int) -> Any:
    """The global scratch memory a launch of `loaded` over `grid` needs (None if none), from Triton's allocator as
    Triton's own launcher would take it (the caller's, or nbxcert's driver's)."""
    if loaded.scratch is None:
        return None
    # Triton 3.6 has a public setter for its allocator (`triton.set_allocator`) but no getter: its private ContextVar
    # is the only way to ask for the allocator the full path would use
    from triton.runtime import _allocation

    size, align = loaded.scratch
    return _allocation._allocator.get()(grid[0] * grid[1] * grid[2] * size, align, stream)


def launch_from_bundle(launch: Any) -> bool:
    """Run a `KernelLaunch` from the registered source's binary when there is one for it (on the cuda backend): True
    if it ran so (`launch.served_by` is then the loaded kernel), False where Triton's dispatch must run it."""
    from nbxcert.kernels import backends

    kernel = launch.kernel
    if not hasattr(kernel, "device_caches") or backends.select().name != "cuda":
        return False
    binary = find(kernel, launch.args, launch.kwargs)
    if binary is None:
        return False
    from nbxcert.kernels.backends import cuda

    device = _device_of(launch)
    loaded = load(binary, device)
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    stream = cuda.current_stream(device)
    scratch = scratch_for(loaded, grid, stream)
    values = arguments(kernel, launch.args, launch.kwargs, binary.record)
    values += [None if scratch is None else scratch.data_ptr(), None]
    loaded.launch(grid, stream, values)
    launch.served_by = loaded
    return True


def loaded_count() -> int:
    """How many bundle binaries this process has loaded (over its devices)."""
    return len(_loaded)
