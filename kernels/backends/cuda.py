"""The NVIDIA driver API (libcuda) through ctypes: devices, contexts, memory, streams and events, with no torch.

This is the floor the CUDA side of nbxcert stands on: the Tensor layer allocates and copies through it, and the
torch-free Triton driver (`triton_cuda`) asks it for devices, capabilities and streams. It loads `libcuda.so.1` on
first use (not at import, so importing it on a machine without a GPU costs nothing and never fails) and calls
`cuInit(0)` once per process.

Every driver call goes through `_call`, which turns a status other than CUDA_SUCCESS into a `CudaError` naming the
call and the CUresult, e.g. `cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)`. Where the driver has a
versioned entry point (`cuMemAlloc_v2`, `cuMemFree_v2`, ...), the versioned one is bound, as `cuda.h` does for C code:
the unversioned symbols are kept by the driver only for binaries built against old headers, and some of them (32-bit
`cuMemAlloc`) have a different ABI.

Contexts: each device's primary context (the one the CUDA runtime, Triton's launcher and cuBLAS also use) is retained
once and never released; a context is current per thread, so `use_device` makes it current on the calling thread and
the other functions make the last used device's context current on a thread that has none yet.

Copies and memsets here are *fully* synchronous: they wait for all work already queued on the device (every stream,
including non-blocking ones, which the legacy default stream does not wait for) and return only when done. nbxcert
checks results more often than it copies them, so it pays two synchronizations to rule out a read of a result that a
kernel on another stream is still writing.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import operator
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbxcert.errors import BackendUnavailable, CudaError, DeviceNotFound
from nbxcert.kernels import recording as _recording

# The loader name; tests point it at a missing file to exercise the no-driver path.
LIBCUDA_NAME = "libcuda.so.1"

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_STREAM_NON_BLOCKING = 0x1  # CUstream_flags: no implicit synchronization with the legacy default stream
CU_EVENT_DEFAULT = 0x0
CU_EVENT_DISABLE_TIMING = 0x2
CU_MEMHOSTALLOC_PORTABLE = 0x1  # pinned host memory usable from every context
CU_MEMHOSTALLOC_DEVICEMAP = 0x2  # ... and mapped into the device's address space
CU_STREAM_WAIT_VALUE_GEQ = 0x0  # cuStreamWaitValue32: wait until (int32_t)(*addr - value) >= 0

# cuMemAlloc hands out memory aligned to at least this (the driver's documented guarantee is "suitably aligned for
# any kind of variable"; every driver since CUDA 2 aligns to 256 bytes or more).
ALLOCATION_ALIGNMENT = 256

# CUresult names for when libcuda cannot be asked (not loaded, or cuGetErrorName itself failing). Values from cuda.h
# (CUDA 13.1, as bundled with Triton 3.9); `tests/kernels/backends/test_cuda.py` checks them against the header.
ERROR_NAMES: dict[int, str] = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    36: "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    218: "CUDA_ERROR_INVALID_PTX",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    226: "CUDA_ERROR_CONTAINED",
    400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND",
    600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
    721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    911: "CUDA_ERROR_EXTERNAL_DEVICE",
    912: "CUDA_ERROR_INVALID_CLUSTER_SIZE",
    999: "CUDA_ERROR_UNKNOWN",
}

# The CUresults after which the context is unusable: cuda.h documents each as "leaves the process in an inconsistent
# state ... the process must be terminated and relaunched" (ASSERT: "the context cannot be used anymore"). Uncorrectable
# ECC/NVLink errors are counted too: a result computed across one cannot be trusted, which for a certifier is the same.
POISONING_STATUSES = frozenset({214, 220, 226, 700, 702, 710, 714, 715, 716, 717, 718, 719, 721, 911})

# CUdevice_attribute values from cuda.h (unchanged from CUDA 12.0 to 13.1), under the names DeviceInfo reports.
DEVICE_ATTRIBUTES: dict[str, int] = {
    "max_threads_per_block": 1,  # CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    "max_shared_memory_per_block": 8,  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK (no opt-in)
    "total_constant_memory": 9,  # CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY
    "warp_size": 10,  # CU_DEVICE_ATTRIBUTE_WARP_SIZE
    "max_registers_per_block": 12,  # CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK
    "clock_rate_khz": 13,  # CU_DEVICE_ATTRIBUTE_CLOCK_RATE
    "multiprocessor_count": 16,  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    "integrated": 18,  # CU_DEVICE_ATTRIBUTE_INTEGRATED
    "ecc_enabled": 32,  # CU_DEVICE_ATTRIBUTE_ECC_ENABLED
    "memory_clock_rate_khz": 36,  # CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE
    "global_memory_bus_width": 37,  # CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH (bits)
    "l2_cache_size": 38,  # CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE (bytes)
    "max_threads_per_multiprocessor": 39,  # CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
    "unified_addressing": 41,  # CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
    "compute_capability_major": 75,  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    "compute_capability_minor": 76,  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    "max_shared_memory_per_multiprocessor": 81,  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    "max_registers_per_multiprocessor": 82,  # CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR
    "max_shared_memory_per_block_optin": 97,  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    "max_blocks_per_multiprocessor": 106,  # CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR
    "reserved_shared_memory_per_block": 111,  # CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
    "cluster_launch": 120,  # CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH
}

_CUresult = ctypes.c_int
_CUdevice = ctypes.c_int
_CUdeviceptr = ctypes.c_uint64  # the _v2 ABI: 64-bit device pointers
_CUcontext = ctypes.c_void_p
_CUstream = ctypes.c_void_p
_CUevent = ctypes.c_void_p
_P = ctypes.POINTER

# (attribute name, symbols to try in order, argtypes). The first symbol is the one cuda.h maps the API name to; a later
# one is a fallback for drivers older than that version (cuEventElapsedTime_v2 arrived with CUDA 12.8).
_FUNCTIONS: tuple[tuple[str, tuple[str, ...], list[Any]], ...] = (
    ("cuInit", ("cuInit",), [ctypes.c_uint]),
    ("cuDriverGetVersion", ("cuDriverGetVersion",), [_P(ctypes.c_int)]),
    ("cuGetErrorName", ("cuGetErrorName",), [_CUresult, _P(ctypes.c_char_p)]),
    ("cuDeviceGetCount", ("cuDeviceGetCount",), [_P(ctypes.c_int)]),
    ("cuDeviceGet", ("cuDeviceGet",), [_P(_CUdevice), ctypes.c_int]),
    ("cuDeviceGetName", ("cuDeviceGetName",), [ctypes.c_char_p, ctypes.c_int, _CUdevice]),
    ("cuDeviceGetAttribute", ("cuDeviceGetAttribute",), [_P(ctypes.c_int), ctypes.c_int, _CUdevice]),
    ("cuDeviceTotalMem", ("cuDeviceTotalMem_v2",), [_P(ctypes.c_size_t), _CUdevice]),
    ("cuDeviceGetPCIBusId", ("cuDeviceGetPCIBusId",), [ctypes.c_char_p, ctypes.c_int, _CUdevice]),
    ("cuDevicePrimaryCtxRetain", ("cuDevicePrimaryCtxRetain",), [_P(_CUcontext), _CUdevice]),
    ("cuCtxSetCurrent", ("cuCtxSetCurrent",), [_CUcontext]),
    ("cuCtxPushCurrent", ("cuCtxPushCurrent_v2",), [_CUcontext]),
    ("cuCtxPopCurrent", ("cuCtxPopCurrent_v2",), [_P(_CUcontext)]),
    ("cuCtxSynchronize", ("cuCtxSynchronize",), []),
    ("cuMemAlloc", ("cuMemAlloc_v2",), [_P(_CUdeviceptr), ctypes.c_size_t]),
    ("cuMemFree", ("cuMemFree_v2",), [_CUdeviceptr]),
    ("cuMemGetInfo", ("cuMemGetInfo_v2",), [_P(ctypes.c_size_t), _P(ctypes.c_size_t)]),
    ("cuMemPoolCreate", ("cuMemPoolCreate",), [_P(ctypes.c_void_p), ctypes.c_void_p]),
    ("cuMemPoolSetAttribute", ("cuMemPoolSetAttribute",), [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
    ("cuMemPoolGetAttribute", ("cuMemPoolGetAttribute",), [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
    ("cuMemPoolTrimTo", ("cuMemPoolTrimTo",), [ctypes.c_void_p, ctypes.c_size_t]),
    (
        "cuMemAllocFromPoolAsync",
        ("cuMemAllocFromPoolAsync",),
        [_P(_CUdeviceptr), ctypes.c_size_t, ctypes.c_void_p, _CUstream],
    ),
    ("cuMemFreeAsync", ("cuMemFreeAsync",), [_CUdeviceptr, _CUstream]),
    ("cuMemcpyHtoD", ("cuMemcpyHtoD_v2",), [_CUdeviceptr, ctypes.c_void_p, ctypes.c_size_t]),
    ("cuMemcpyDtoH", ("cuMemcpyDtoH_v2",), [ctypes.c_void_p, _CUdeviceptr, ctypes.c_size_t]),
    ("cuMemcpyDtoD", ("cuMemcpyDtoD_v2",), [_CUdeviceptr, _CUdeviceptr, ctypes.c_size_t]),
    ("cuMemsetD8", ("cuMemsetD8_v2",), [_CUdeviceptr, ctypes.c_ubyte, ctypes.c_size_t]),
    ("cuMemsetD32", ("cuMemsetD32_v2",), [_CUdeviceptr, ctypes.c_uint, ctypes.c_size_t]),
    ("cuMemsetD8Async", ("cuMemsetD8Async",), [_CUdeviceptr, ctypes.c_ubyte, ctypes.c_size_t, _CUstream]),
    ("cuMemsetD32Async", ("cuMemsetD32Async",), [_CUdeviceptr, ctypes.c_uint, ctypes.c_size_t, _CUstream]),
    ("cuStreamCreate", ("cuStreamCreate",), [_P(_CUstream), ctypes.c_uint]),
    ("cuStreamDestroy", ("cuStreamDestroy_v2",), [_CUstream]),
    ("cuStreamSynchronize", ("cuStreamSynchronize",), [_CUstream]),
    # the V2 stream memory operations are enabled by default on every platform (the V1 ones need a kernel module
    # parameter), so only the _v2 symbol is bound
    ("cuStreamWaitValue32", ("cuStreamWaitValue32_v2",), [_CUstream, _CUdeviceptr, ctypes.c_uint32, ctypes.c_uint]),
    ("cuMemHostAlloc", ("cuMemHostAlloc",), [_P(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]),
    (
        "cuMemHostGetDevicePointer",
        ("cuMemHostGetDevicePointer_v2",),
        [_P(_CUdeviceptr), ctypes.c_void_p, ctypes.c_uint],
    ),
    ("cuMemFreeHost", ("cuMemFreeHost",), [ctypes.c_void_p]),
    ("cuEventCreate", ("cuEventCreate",), [_P(_CUevent), ctypes.c_uint]),
    ("cuEventDestroy", ("cuEventDestroy_v2",), [_CUevent]),
    ("cuEventRecord", ("cuEventRecord",), [_CUevent, _CUstream]),
    ("cuEventSynchronize", ("cuEventSynchronize",), [_CUevent]),
    ("cuEventElapsedTime", ("cuEventElapsedTime_v2", "cuEventElapsedTime"), [_P(ctypes.c_float), _CUevent, _CUevent]),
    ("cuStreamWaitEvent", ("cuStreamWaitEvent",), [_CUstream, _CUevent, ctypes.c_uint]),
    ("cuMemcpyDtoDAsync", ("cuMemcpyDtoDAsync_v2",), [_CUdeviceptr, _CUdeviceptr, ctypes.c_size_t, _CUstream]),
    # CUDA graphs (`nbxcert.kernels.backends.graphs`): stream capture, instantiation, launch
    ("cuStreamBeginCapture", ("cuStreamBeginCapture_v2",), [_CUstream, ctypes.c_int]),
    ("cuStreamEndCapture", ("cuStreamEndCapture",), [_CUstream, _P(ctypes.c_void_p)]),
    ("cuStreamIsCapturing", ("cuStreamIsCapturing",), [_CUstream, _P(ctypes.c_int)]),
    ("cuThreadExchangeStreamCaptureMode", ("cuThreadExchangeStreamCaptureMode",), [_P(ctypes.c_int)]),
    (
        "cuGraphInstantiate",
        ("cuGraphInstantiateWithFlags",),
        [_P(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong],
    ),
    ("cuGraphLaunch", ("cuGraphLaunch",), [ctypes.c_void_p, _CUstream]),
    ("cuGraphGetNodes", ("cuGraphGetNodes",), [ctypes.c_void_p, _P(ctypes.c_void_p), _P(ctypes.c_size_t)]),
    ("cuGraphExecDestroy", ("cuGraphExecDestroy",), [ctypes.c_void_p]),
    ("cuGraphDestroy", ("cuGraphDestroy",), [ctypes.c_void_p]),
)


# Loading compiled kernels and launching them (`binaries`, `launcher`): bound on first use, not with the rest, so that a
# driver stand-in without them (the tests' fake libcuda) serves everything else.
_MODULE_FUNCTIONS: tuple[tuple[str, str, list[Any]], ...] = (
    ("cuModuleLoadData", "cuModuleLoadData", [_P(ctypes.c_void_p), ctypes.c_char_p]),
    ("cuModuleUnload", "cuModuleUnload", [ctypes.c_void_p]),
    ("cuModuleGetFunction", "cuModuleGetFunction", [_P(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]),
    ("cuFuncGetAttribute", "cuFuncGetAttribute", [_P(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]),
    ("cuFuncSetAttribute", "cuFuncSetAttribute", [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
    ("cuFuncSetCacheConfig", "cuFuncSetCacheConfig", [ctypes.c_void_p, ctypes.c_int]),
    ("cuCtxGetCurrent", "cuCtxGetCurrent", [_P(_CUcontext)]),
)


class _Libcuda:
    """libcuda.so.1 with every function nbxcert uses bound (argtypes, restype), and the process that loaded it."""

    def __init__(self, lib: ctypes.CDLL, name: str):
        self.pid = os.getpid()
        self.raw = lib
        self.symbols: dict[str, str] = {}  # API name -> the symbol bound, for error messages
        for api, candidates, argtypes in _FUNCTIONS:
            for symbol in candidates:
                try:
                    fn = getattr(lib, symbol)
                except AttributeError:
                    continue
                fn.argtypes = argtypes
                fn.restype = _CUresult
                setattr(self, api, fn)
                self.symbols[api] = symbol
                break
            else:
                raise BackendUnavailable(
                    f"{name} has no {' or '.join(candidates)}: the NVIDIA driver is too old for nbxcert",
                    hint="install an NVIDIA driver of CUDA 12.0 or newer",
                )


# This process's id, kept by an at-fork hook rather than asked of the kernel on every driver call (a system call,
# which a served launch's host budget cannot afford several times over).
_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)

_load_lock = threading.Lock()
_libcuda: _Libcuda | None = None
_poisoned: int | None = None  # the first context-poisoning CUresult a driver call returned in this process


def _lib() -> _Libcuda:
    """The loaded and initialised driver; loads it and calls cuInit(0) on first use."""
    lib = _libcuda
    if lib is None:
        with _load_lock:
            lib = _libcuda if _libcuda is not None else _load()
    if lib.pid != _pid:
        # The driver state of a forked child is undefined once the parent has called cuInit.
        raise BackendUnavailable(
            f"CUDA was initialised in process {lib.pid}; this forked process ({os.getpid()}) cannot use it",
            hint="start worker processes with the 'spawn' method (multiprocessing.get_context('spawn'))",
        )
    return lib


def _load() -> _Libcuda:
    global _libcuda
    try:
        raw = ctypes.CDLL(LIBCUDA_NAME)
    except OSError as e:
        raise BackendUnavailable(f"{LIBCUDA_NAME} could not be loaded: {e}") from e
    lib = _Libcuda(raw, LIBCUDA_NAME)
    status = lib.cuInit(0)
    if status != CUDA_SUCCESS:
        # Not cached: a later call may find the device back (e.g. after the driver finished loading).
        raise BackendUnavailable(f"cuInit failed: {_error_name(status, lib)} ({status})")
    _libcuda = lib
    return lib


def _error_name(status: int, lib: _Libcuda | None = None) -> str:
    """The CUresult's name: from the driver when it is loaded, else from the built-in table."""
    lib = lib if lib is not None else _libcuda
    if lib is not None:
        name = ctypes.c_char_p()
        if lib.cuGetErrorName(status, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return name.value.decode("ascii", "replace")
    return ERROR_NAMES.get(status, "CUDA_ERROR_UNRECOGNISED")


def check(status: int, call_name: str) -> None:
    """Raise `CudaError("<call_name> failed: <NAME> (<code>)")` for a status other than CUDA_SUCCESS.

    The error carries the CUresult as `.status` (see `launch_error_poisons_context`). Pure: it records nothing, so it
    can be used on statuses from elsewhere (a Triton launcher, a test).
    """
    if status == CUDA_SUCCESS:
        return
    error = CudaError(f"{call_name} failed: {_error_name(status)} ({status})")
    error.status = status  # type: ignore[attr-defined]
    raise error


def _call(api: str, *args: Any, what: str = "") -> None:
    """Call a bound driver function and check its status; remember a status that poisons the context."""
    global _poisoned
    lib = _lib()
    if api in WAITING_CALLS:
        if getattr(_tls, "gates", 0):
            raise GateHeld(
                f"{lib.symbols[api]} waits for the device, and this thread holds a stream gate it would wait on"
            )
        _recording.host_work(f"{lib.symbols[api]} (a wait for the device)")
        capture = getattr(_tls, "capture", None)
        if capture is not None:  # a graph cannot hold a wait: refused, naming the launch (`graphs.Capture`)
            capture.refuse(f"{lib.symbols[api]} waits for the device" + (f" ({what})" if what else ""))
    status = getattr(lib, api)(*args)
    if status != CUDA_SUCCESS:
        if status in POISONING_STATUSES and _poisoned is None:
            _poisoned = status
        call_name = lib.symbols[api] + (f" ({what})" if what else "")
        check(status, call_name)
    if api in SYNCHRONISING_CALLS:
        for hook in _sync_hooks:
            hook()


# The calls after which the work queued before them (on a stream, an event's, or every stream) has finished: the hooks
# of `add_sync_hook` run after each (e.g. `nbxcert.kernels.faults` reads the faults kernels recorded).
SYNCHRONISING_CALLS = frozenset({"cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"})
_sync_hooks: list = []


def add_sync_hook(hook) -> None:
    """Call `hook()` after every synchronising driver call of this process (once per hook); an exception it raises
    propagates from that call, whose own work is done."""
    if hook not in _sync_hooks:
        _sync_hooks.append(hook)


_STATUS_IN_MESSAGE = re.compile(r"\((\d+)\)\s*$")


# The driver calls that wait for queued device work (explicitly, or as the synchronous copies and memsets do). Made by
# the thread that holds a `StreamGate` shut, any of them would wait for work that waits for that thread: `_call`
# raises `GateHeld` instead, and memory collected meanwhile is freed when the gate opens.
WAITING_CALLS = frozenset(
    {
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemFree",
        "cuMemFreeHost",
        "cuMemcpyHtoD",
        "cuMemcpyDtoH",
        "cuMemcpyDtoD",
        "cuMemsetD8",
        "cuMemsetD32",
    }
)


class GateHeld(RuntimeError):
    """A call that waits for the device, made while this thread holds a stream gate shut (see `StreamGate`)."""


def launch_error_poisons_context(err: CudaError) -> bool:
    """True when the error is one after which this process's CUDA context is unusable (illegal address, launch
    failure, misaligned address, hardware stack error, illegal instruction, assert, timeout, ...).

    After one, every later CUDA call fails with the same error; the only recovery is a new process. Uses the error's
    `.status`, or the `(<code>)` that ends a message in `check`'s format.
    """
    status = getattr(err, "status", None)
    if status is None:
        match = _STATUS_IN_MESSAGE.search(str(err))
        if match is None:
            return False
        status = int(match.group(1))
    return status in POISONING_STATUSES


def context_poisoned() -> int | None:
    """The CUresult that poisoned this process's CUDA context, or None while it is healthy."""
    return _poisoned


# --- driver and devices -----------------------------------------------------------------------------------------------
def device_present(index: int) -> tuple[bool, str]:
    """(present, reason): whether libcuda is usable and has a device `index`. Every device tensor made asks, so a
    device found once is answered from `_device`'s memo, with no driver call. Never raises."""
    if type(index) is int and index in _devices:  # not a bool: True == 1 would find device 1
        return True, ""
    ok, reason = available()
    if not ok:
        return False, reason
    try:
        count = device_count()
        if type(index) is int and not 0 <= index < count:
            return False, f"this machine has {count} CUDA device(s)"
        _device(index)  # refuses a non-int index
    except (BackendUnavailable, CudaError, DeviceNotFound) as e:
        return False, str(e)
    return True, ""


def available() -> tuple[bool, str]:
    """(usable, reason): whether libcuda loads, initialises and reports at least one device. Never raises."""
    try:
        count = device_count()
        major, minor = driver_version()
    except (BackendUnavailable, CudaError) as e:
        return False, str(e)
    if count == 0:
        return False, f"{LIBCUDA_NAME} reports no CUDA device"
    return True, f"{count} CUDA device(s), driver API {major}.{minor}"


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, e.g. (13, 0) for 13000."""
    version = ctypes.c_int()
    _call("cuDriverGetVersion", ctypes.byref(version))
    return version.value // 1000, (version.value % 1000) // 10


def device_count() -> int:
    count = ctypes.c_int()
    _call("cuDeviceGetCount", ctypes.byref(count))
    return count.value


_devices: dict[int, int] = {}  # ordinal -> CUdevice
_capabilities: dict[int, tuple[int, int]] = {}
_infos: dict[int, DeviceInfo] = {}


def _check_index(index: object) -> None:
    # Before any cache lookup: True == 1 would otherwise find device 1's entry.
    if not isinstance(index, int) or isinstance(index, bool):
        raise DeviceNotFound(f"CUDA device index must be an int, got {index!r}")


def _device(index: int) -> int:
    """The CUdevice of an ordinal; DeviceNotFound when there is no such device."""
    _check_index(index)
    handle = _devices.get(index)
    if handle is not None:
        return handle
    count = device_count()
    if not 0 <= index < count:
        raise DeviceNotFound(f"CUDA device {index} does not exist: this machine has {count} CUDA device(s)")
    device = _CUdevice()
    _call("cuDeviceGet", ctypes.byref(device), index, what=f"device {index}")
    _devices[index] = device.value
    return device.value


def _attribute(device: int, attribute: int, index: int) -> int:
    value = ctypes.c_int()
    _call("cuDeviceGetAttribute", ctypes.byref(value), attribute, device, what=f"attribute {attribute}, device {index}")
    return value.value


@dataclass(frozen=True)
class DeviceInfo:
    """What the driver says about one device. `attributes` holds every entry of `DEVICE_ATTRIBUTES` by name."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int  # bytes
    pci_bus_id: str  # "domain:bus:device.function", e.g. "0000:19:00.0"
    attributes: dict[str, int] = field(hash=False)


def device_info(index: int) -> DeviceInfo:
    """The device's name, capability, memory, PCI address and attributes (`DEVICE_ATTRIBUTES`)."""
    _check_index(index)
    info = _infos.get(index)
    if info is None:
        device = _device(index)
        name = ctypes.create_string_buffer(256)
        _call("cuDeviceGetName", name, len(name), device, what=f"device {index}")
        total = ctypes.c_size_t()
        _call("cuDeviceTotalMem", ctypes.byref(total), device, what=f"device {index}")
        bus_id = ctypes.create_string_buffer(64)
        _call("cuDeviceGetPCIBusId", bus_id, len(bus_id), device, what=f"device {index}")
        attributes = {key: _attribute(device, value, index) for key, value in DEVICE_ATTRIBUTES.items()}
        info = DeviceInfo(
            index=index,
            name=name.value.decode("utf-8", "replace"),
            compute_capability=(attributes["compute_capability_major"], attributes["compute_capability_minor"]),
            total_memory=total.value,
            pci_bus_id=bus_id.value.decode("ascii", "replace"),
            attributes=attributes,
        )
        _infos[index] = info
    # A copy, so that a caller editing `attributes` cannot change what the next caller is told.
    return dataclasses.replace(info, attributes=dict(info.attributes))


def compute_capability(index: int) -> tuple[int, int]:
    """(major, minor) of a device; cached, since Triton asks for it on every compile-cache lookup."""
    _check_index(index)
    capability = _capabilities.get(index)
    if capability is None:
        device = _device(index)
        capability = (
            _attribute(device, DEVICE_ATTRIBUTES["compute_capability_major"], index),
            _attribute(device, DEVICE_ATTRIBUTES["compute_capability_minor"], index),
        )
        _capabilities[index] = capability
    return capability


# --- contexts ---------------------------------------------------------------------------------------------------------
_context_lock = threading.Lock()
_contexts: dict[int, int] = {}  # ordinal -> retained primary CUcontext
_last_device = 0  # the device made current last, by any thread


class _ThreadState(threading.local):
    """This thread's CUDA state. `device`: the device whose context this thread made current through nbxcert;
    `streams`: device -> the stream set on this thread (`set_stream`). Class defaults, so that a served call's replay
    in C (launcher.c) reads them without an AttributeError on a thread that set none."""

    device: int | None = None
    streams: dict | None = None


_tls = _ThreadState()


def made_once(table: dict, lock: threading.Lock, key: Any, make: Callable[[Any], Any]) -> Any:
    """table[key], made by `make(key)` and kept there unless another thread made it first: the slow path of a value
    made once per process, after the caller's look without the lock has found none."""
    with lock:
        value = table.get(key)
        if value is None:
            value = table[key] = make(key)
    return value


def _retain_primary(index: int) -> int:
    handle = _CUcontext()
    _call("cuDevicePrimaryCtxRetain", ctypes.byref(handle), _device(index), what=f"device {index}")
    return handle.value or 0


def _primary_context(index: int) -> int:
    """The device's primary context, retained on first use (once per process) and kept for the process's life.

    Never released: allocations, streams and Triton's loaded modules live in it, and their finalizers may run late.
    """
    _check_index(index)
    ctx = _contexts.get(index)
    if ctx is not None:
        return ctx
    return made_once(_contexts, _context_lock, index, _retain_primary)


def use_device(index: int) -> int:
    """Make device `index`'s primary context current on this thread; return the CUcontext handle.

    Thread-safe and cheap to repeat (the context is retained once; setting it current is a thread-local write in the
    driver). Later calls in this module without a device argument work on this device.
    """
    global _last_device
    ctx = _primary_context(index)
    _call("cuCtxSetCurrent", ctx, what=f"device {index}")
    _tls.device = index
    _last_device = index
    return ctx


def make_current(index: int) -> None:
    """`use_device(index)` unless nbxcert made it current on this thread already (as `_ensure_context` assumes: a
    tensor allocation's per-call cost on a served path, measured by benchmarks/bench_alloc.py)."""
    global _last_device
    if getattr(_tls, "device", None) == index:
        _last_device = index
        return
    use_device(index)


def current_device() -> int:
    """The device this thread made current last; on a thread that made none current, the process's last (default 0)."""
    device = getattr(_tls, "device", None)
    return _last_device if device is None else device


def _ensure_context() -> int:
    """Make current_device()'s context current on this thread if nbxcert has not done so yet; return the device."""
    device = current_device()
    if getattr(_tls, "device", None) != device:
        use_device(device)
    return device


@contextlib.contextmanager
def _in_context(index: int, always_push: bool = False) -> Iterator[None]:
    """Run a block in device `index`'s context without changing which context is current on this thread. When
    nbxcert made `index` current on this thread the block runs as it is, unless `always_push`: then the context is
    pushed whatever nbxcert's record says (another library may have set its own since; see `_driver_alloc`)."""
    if not always_push and getattr(_tls, "device", None) == index:
        yield
        return
    _call("cuCtxPushCurrent", _primary_context(index), what=f"device {index}")
    try:
        yield
    finally:
        popped = _CUcontext()
        _call("cuCtxPopCurrent", ctypes.byref(popped))


def synchronize() -> None:
    """Wait for all work queued in the current device's context (every stream) to finish (cuCtxSynchronize)."""
    device = _ensure_context()
    _call("cuCtxSynchronize", what=f"device {device}")


# --- memory -----------------------------------------------------------------------------------------------------------
def _owned_here(pid: int) -> bool:
    """Whether a finalizer may release a driver object: not in a forked child (the parent owns it), and not after the
    context was poisoned (every call would fail with the poisoning error; the process must end and the driver
    reclaims everything then)."""
    return pid == _pid and _poisoned is None


def _after_gates(free, *args) -> bool:
    """Whether `free(*args)` was put off until this thread's stream gates open (True while one is held: a free waits
    for the device, which waits for this thread), or until this thread's graph capture ends (a graph cannot hold a
    wait, and the memory may be what the capture reads: the capture keeps it until its graph is gone)."""
    capture = getattr(_tls, "capture", None)
    if capture is not None:
        capture.hold_free(free, args)
        return True
    if not getattr(_tls, "gates", 0):
        return False
    _tls.deferred_frees.append((free, args))
    return True


def release_memory(api: str, ptr: int, device: int, pid: int) -> None:
    """`api` (cuMemFree or cuMemFreeHost) on `ptr`: both wait for the device, so put off while this thread holds a
    stream gate; nothing in a forked child or a poisoned process (`_owned_here`)."""
    if _after_gates(release_memory, api, ptr, device, pid):
        return
    if _owned_here(pid):
        with _in_context(device):
            _call(api, ptr, what=f"device {device}")


def _free_device_memory(ptr: int, device: int, pid: int) -> None:
    release_memory("cuMemFree", ptr, device, pid)


class DeviceAllocation:
    """Device memory: from cuMemAlloc (freed with cuMemFree), or from nbxcert's pool (`pool_alloc`, given back with
    `release(*release_args)`). Freed by `free()` (idempotent) or when the object is collected.

    After `free()`, `ptr` reads 0, so a use after free is a null-pointer fault rather than a silent overwrite.
    """

    __slots__ = ("ptr", "nbytes", "device", "_finalizer", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, device: int, release=None, release_args: tuple = ()):
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self._finalizer: weakref.finalize | None = None
        if ptr:
            if release is None:
                self._finalizer = weakref.finalize(self, _free_device_memory, ptr, device, _pid)
            else:
                self._finalizer = weakref.finalize(self, release, *release_args)
            # At interpreter exit the driver releases the whole context; freeing one by one would only add work.
            self._finalizer.atexit = False

    def free(self) -> None:
        if self._finalizer is not None and self._finalizer.alive:
            self.ptr = 0
            self._finalizer()

    @property
    def freed(self) -> bool:
        return self._finalizer is not None and not self._finalizer.alive

    def data_ptr(self) -> int:
        """So that an allocation can be passed to a Triton kernel as a pointer argument."""
        return self.ptr

    def __int__(self) -> int:
        return self.ptr

    __index__ = __int__  # so the copy functions take an allocation where they take an address

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"ptr=0x{self.ptr:x}"
        return f"DeviceAllocation({state}, nbytes={self.nbytes}, device={self.device})"


def mem_alloc(nbytes: int, device: int) -> DeviceAllocation:
    """`nbytes` of device memory on `device` (aligned to at least ALLOCATION_ALIGNMENT bytes).

    `nbytes == 0` makes no driver call and returns an allocation whose `ptr` is 0 (Triton passes a null pointer
    through untouched; cuMemAlloc itself refuses a size of 0).
    """
    nbytes = _size(nbytes, "mem_alloc")
    if nbytes == 0:
        _device(device)  # still refuse a device that does not exist
        return DeviceAllocation(0, 0, device)
    return DeviceAllocation(_driver_alloc(nbytes, device), nbytes, device)


def _driver_alloc(nbytes: int, device: int) -> int:
    """A pointer to `nbytes` (> 0) from cuMemAlloc; its owner frees it. Made in `device`'s context pushed for the call,
    whatever this thread's current context is: nbxcert's own record of it (`make_current`) cannot see another library
    setting its own since, and memory on the wrong device would be a silent fault."""
    capture = getattr(_tls, "capture", None)
    if capture is not None:  # memory a graph uses comes from its own pool (`graphs.GraphPool`)
        capture.refuse(f"cuMemAlloc of {nbytes} bytes, outside the graph's pool")
    ptr = _CUdeviceptr()
    with _in_context(device, always_push=True):
        _call("cuMemAlloc", ctypes.byref(ptr), nbytes, what=f"{nbytes} bytes on device {device}")
    return ptr.value


# --- what the memory pool (`memory`) uses of these bindings -----------------------------------------------------------
CUdeviceptr = _CUdeviceptr
call = _call  # a bound driver function called, its status checked (`_call`)
in_context = _in_context


def driver() -> _Libcuda:
    """The loaded, initialised driver with its bound functions (loaded on first use; refused in a forked child)."""
    return _lib()


def bind_module_functions() -> _Libcuda:
    """The driver with the module-loading calls (`_MODULE_FUNCTIONS`) bound as well; `BackendUnavailable` naming the
    first one this driver lacks."""
    lib = _lib()
    for api, symbol, argtypes in _MODULE_FUNCTIONS:
        if api in lib.symbols:
            continue
        fn = getattr(lib.raw, symbol, None)
        if fn is None:
            raise BackendUnavailable(
                f"{LIBCUDA_NAME} has no {symbol}: nbxcert cannot load compiled kernels with this driver",
                hint="install an NVIDIA driver of CUDA 12.0 or newer",
            )
        fn.argtypes = argtypes
        fn.restype = _CUresult
        setattr(lib, api, fn)
        lib.symbols[api] = symbol
    return lib


def symbol_address(symbol: str) -> int:
    """The address of a driver function (for nbxcert's launcher, which calls it from C); `BackendUnavailable` where
    the driver has no such symbol."""
    lib = _lib()
    fn = getattr(lib.raw, symbol, None)
    if fn is None:
        raise BackendUnavailable(
            f"{LIBCUDA_NAME} has no {symbol}", hint="install an NVIDIA driver of CUDA 12.0 or newer"
        )
    return ctypes.cast(fn, ctypes.c_void_p).value


def owned_here(pid: int) -> bool:
    """Whether memory or a driver object made by process `pid` may be released from here (see `_owned_here`)."""
    return pid == _pid and _poisoned is None


def process_id() -> int:
    """This process's id, as kept by the at-fork hook (no system call)."""
    return _pid


def holding_a_gate() -> bool:
    """Whether this thread holds a stream gate shut (a wait for the device would wait for this thread)."""
    return bool(getattr(_tls, "gates", 0))


def thread_device() -> int | None:
    """The device whose context nbxcert made current on this thread, or None."""
    return getattr(_tls, "device", None)


def device_attribute(index: int, attribute: int) -> int:
    """One CUdevice_attribute of device `index`."""
    return _attribute(_device(index), attribute, index)


def current_stream_object(device: int) -> tuple[int, Stream | None]:
    """(handle, the `Stream` object when one is set) of the stream this thread launches and allocates on."""
    streams = getattr(_tls, "streams", None)
    chosen = streams.get(device) if streams else None
    if chosen is None:
        return (_torch_stream(device) if _torch_query[0] is not None or "torch" in sys.modules else 0), None
    return (chosen.handle, chosen) if type(chosen) is Stream else (int(chosen), None)


def raise_failed(api: str, status: int, what: str) -> None:
    """What `_call` does with a failed status, for hot paths that call a bound function directly: remember a status
    that poisons the context, then raise `CudaError` naming the call."""
    global _poisoned
    if status in POISONING_STATUSES and _poisoned is None:
        _poisoned = status
    check(status, f"{_lib().symbols[api]} ({what})")


def error_name(status: int) -> str:
    return _error_name(status)


def check_size(nbytes: Any, what: str) -> int:
    """A byte count as an int >= 0 (numpy integers taken, floats refused), else ValueError naming `what`."""
    return _size(nbytes, what)


# --- the stream launches and allocations go to ------------------------------------------------------------------------
# Per thread and device, as in CUDA and Triton: Triton's launcher asks for it (`triton_cuda` answers from here) and so
# does `pool_alloc`, so a tensor is allocated, used and freed in the order of the stream its work is queued on. Where
# none is set on the thread and the process's torch has initialised CUDA, it is torch's current stream (read, never
# imported): work beside torch's goes in torch's order, as Triton's own driver does it.
_torch_query: list = [None]  # torch's raw current-stream query, once torch has initialised CUDA in this process


def _torch_stream(device: int) -> int:
    query = _torch_query[0]
    if query is None:
        torch = sys.modules.get("torch")
        torch_cuda = getattr(torch, "cuda", None)
        if torch_cuda is None or not torch_cuda.is_initialized():
            return 0
        query = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        if query is None:

            def query(index, torch_cuda=torch_cuda):
                return torch_cuda.current_stream(index).cuda_stream

        _torch_query[0] = query
    return int(query(device))


def current_stream(device: int | None = None) -> int:
    """The CUstream handle this thread launches and allocates on for `device`: the one set (`set_stream`,
    `using_stream`), else torch's current stream where torch has initialised CUDA, else 0 (legacy default)."""
    if device is None:
        device = current_device()
    streams = getattr(_tls, "streams", None)
    if streams:
        stream = streams.get(device)
        if stream is not None:
            return stream.handle if type(stream) is Stream else int(stream)
    if _torch_query[0] is not None or "torch" in sys.modules:
        return _torch_stream(device)
    return 0


def launcher_state() -> tuple:
    """What nbxcert's launcher reads to replay a served call in C (`Served` in launcher.c): this thread's state
    (`device`, `streams`), `current_stream` and `make_current` (called where the state says a stream is set or another
    device is current), and the cell holding torch's stream query. launcher.c also reads this module's `_pid` and
    `_poisoned`, as `owned_here` does."""
    return (_tls, current_stream, make_current, _torch_query)


def set_stream(stream: Stream | int, device: int | None = None) -> None:
    """Launch and allocate on `stream` (a `Stream`, kept alive while set, or a raw handle) for `device` on this
    thread. A raw handle (another library's stream) must outlive the tensors allocated on it."""
    streams = _tls.__dict__.setdefault("streams", {})
    streams[current_device() if device is None else device] = stream


@contextlib.contextmanager
def using_stream(stream: Stream | int, device: int | None = None) -> Iterator[int]:
    """Launch and allocate on `stream` inside the block (this thread), then go back to the stream used before."""
    device = current_device() if device is None else device
    streams = _tls.__dict__.setdefault("streams", {})
    previous = streams.get(device)
    streams[device] = stream
    try:
        yield current_stream(device)
    finally:
        if previous is None:
            streams.pop(device, None)
        else:
            streams[device] = previous


def mem_get_info(device: int) -> tuple[int, int]:
    """(free, total) bytes of device memory as the driver sees them now."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    with _in_context(device):
        _call("cuMemGetInfo", ctypes.byref(free), ctypes.byref(total), what=f"device {device}")
    return free.value, total.value


def _host_address(buffer: Any, nbytes: int, writable: bool) -> tuple[int, Any]:
    """(address, keep-alive) of a C-contiguous host buffer of at least nbytes: a numpy array or any buffer object."""
    if isinstance(buffer, np.ndarray):
        array = buffer
    else:
        view = memoryview(buffer)  # TypeError for an object without the buffer protocol
        if not view.c_contiguous:
            raise ValueError("host buffer must be C-contiguous")
        array = np.frombuffer(view, dtype=np.uint8)
    if not array.flags.c_contiguous:
        raise ValueError("host array must be C-contiguous (use numpy.ascontiguousarray)")
    if writable and not array.flags.writeable:
        raise ValueError("host array to copy into is read-only")
    if array.nbytes < nbytes:
        raise ValueError(f"host buffer holds {array.nbytes} bytes, fewer than the {nbytes} to copy")
    return array.ctypes.data, array


def _size(nbytes: Any, what: str) -> int:
    # operator.index: numpy integers pass (ctypes would refuse them), floats are refused rather than truncated.
    nbytes = operator.index(nbytes)
    if nbytes < 0:
        raise ValueError(f"{what} of a negative size ({nbytes})")
    return nbytes


def _pointer(ptr: Any) -> int:
    """A device address from an int, a numpy integer or a DeviceAllocation."""
    return operator.index(ptr)


def memcpy_htod(dst_ptr: int, src: Any, nbytes: int) -> None:
    """Copy `nbytes` from host `src` (numpy array or buffer, C-contiguous) to device memory at `dst_ptr`.

    Synchronous: prior work on every stream has finished before the copy, and the copy has landed when it returns."""
    dst_ptr, nbytes = _pointer(dst_ptr), _size(nbytes, "memcpy_htod")
    address, _keep = _host_address(src, nbytes, writable=False)
    if nbytes:
        # pageable copies return once the data is staged, not landed; a kernel on a non-blocking stream could overtake
        _fenced("a host-to-device copy", "cuMemcpyHtoD", (dst_ptr, address, nbytes), f"{nbytes} bytes to 0x{dst_ptr:x}")


def _fenced(what: str, api: str, args: tuple, detail: str, after: bool = True) -> None:
    """A synchronous copy or memset: the work queued on every stream finished before it, and (`after`) the device
    waited for again once it is made."""
    device = _ensure_context()
    _call("cuCtxSynchronize", what=f"before {what}, device {device}")
    _call(api, *args, what=detail)
    if after:
        _call("cuCtxSynchronize", what=f"after {what}, device {device}")


def memcpy_dtoh(dst: Any, src_ptr: int, nbytes: int) -> None:
    """Copy `nbytes` from device memory at `src_ptr` into host `dst` (writable, C-contiguous). Synchronous."""
    src_ptr, nbytes = _pointer(src_ptr), _size(nbytes, "memcpy_dtoh")
    address, _keep = _host_address(dst, nbytes, writable=True)
    if nbytes:  # a device-to-host copy into pageable memory has landed when it returns
        detail = f"{nbytes} bytes from 0x{src_ptr:x}"
        _fenced("a device-to-host copy", "cuMemcpyDtoH", (address, src_ptr, nbytes), detail, after=False)


def memcpy_dtod(dst_ptr: int, src_ptr: int, nbytes: int) -> None:
    """Copy `nbytes` between device buffers. Synchronous."""
    dst_ptr, src_ptr, nbytes = _pointer(dst_ptr), _pointer(src_ptr), _size(nbytes, "memcpy_dtod")
    if nbytes:
        detail = f"{nbytes} bytes 0x{src_ptr:x} -> 0x{dst_ptr:x}"
        _fenced("a device-to-device copy", "cuMemcpyDtoD", (dst_ptr, src_ptr, nbytes), detail)


def _memset_value(value: Any, bits: int) -> int:
    value = operator.index(value)
    if not 0 <= value < (1 << bits):
        raise ValueError(f"memset value {value} does not fit in {bits} unsigned bits")
    return value


def memset_d8(ptr: int, value: int, nbytes: int) -> None:
    """Set `nbytes` bytes at `ptr` to `value` (0..255). Synchronous."""
    ptr, value, nbytes = _pointer(ptr), _memset_value(value, 8), _size(nbytes, "memset_d8")
    if nbytes:
        _fenced("a memset", "cuMemsetD8", (ptr, value, nbytes), f"{nbytes} bytes at 0x{ptr:x}")


def memset_d32(ptr: int, value: int, count: int) -> None:
    """Set `count` 32-bit words at `ptr` (4-byte aligned) to `value` (0..2**32-1). Synchronous."""
    ptr, value, count = _pointer(ptr), _memset_value(value, 32), _size(count, "memset_d32")
    if count:
        _fenced("a memset", "cuMemsetD32", (ptr, value, count), f"{count} words at 0x{ptr:x}")


def _memset_async(bits: int, ptr: int, value: int, count: int, stream: Stream | int, name: str) -> None:
    """Queue a memset of `count` `bits`-bit units on `stream`; `name`: the public function, as its errors say."""
    ptr, value, count = _pointer(ptr), _memset_value(value, bits), _size(count, name)
    if count:
        _check_capture_stream(stream, "a memset")
        _ensure_context()
        what = f"{count} {'bytes' if bits == 8 else 'words'} at 0x{ptr:x}"
        _call(f"cuMemsetD{bits}Async", ptr, value, count, _stream_handle(stream), what=what)


def memset_d8_async(ptr: int, value: int, nbytes: int, stream: Stream | int = 0) -> None:
    """Queue a byte memset on `stream` (ordered with the kernels on it; the host does not wait)."""
    _memset_async(8, ptr, value, nbytes, stream, "memset_d8_async")


def memset_d32_async(ptr: int, value: int, count: int, stream: Stream | int = 0) -> None:
    """Queue a 32-bit memset on `stream` (ordered with the kernels on it; the host does not wait). Used to flush L2."""
    _memset_async(32, ptr, value, count, stream, "memset_d32_async")


def memcpy_dtod_async(dst_ptr: int, src_ptr: int, nbytes: int, stream: Stream | int = 0) -> None:
    """Queue a copy of `nbytes` between device buffers on `stream` (ordered with the kernels on it; no wait)."""
    dst_ptr, src_ptr, nbytes = _pointer(dst_ptr), _pointer(src_ptr), _size(nbytes, "memcpy_dtod_async")
    if nbytes:
        _check_capture_stream(stream, "a device-to-device copy")
        _ensure_context()
        _call(
            "cuMemcpyDtoDAsync",
            dst_ptr,
            src_ptr,
            nbytes,
            _stream_handle(stream),
            what=f"{nbytes} bytes 0x{src_ptr:x} -> 0x{dst_ptr:x}",
        )


# --- graph capture (`nbxcert.kernels.backends.graphs`) ----------------------------------------------------------------
def thread_capture():
    """The graph capture this thread is making (a `graphs.Capture`), or None."""
    return getattr(_tls, "capture", None)


def set_thread_capture(capture) -> None:
    """Make `capture` (or None) this thread's graph capture: its waits, driver allocations and work on other streams
    are refused from then on, by name (`_call`, `_driver_alloc`, the async copies and memsets)."""
    _tls.capture = capture


def _check_capture_stream(stream: Stream | int | None, what: str) -> None:
    capture = getattr(_tls, "capture", None)
    if capture is not None:
        capture.check_stream(_stream_handle(stream), what)


# --- streams and events -----------------------------------------------------------------------------------------------
def _stream_handle(stream: Stream | int | None) -> int:
    if stream is None:
        return 0
    return stream.handle if isinstance(stream, Stream) else int(stream)


def default_stream() -> int:
    """The legacy default stream's handle (0): ordered with every blocking stream of the context."""
    return 0


def stream_synchronize(stream: Stream | int) -> None:
    """Wait until all work queued on `stream` (a Stream or a raw CUstream handle; 0 = legacy default) has finished."""
    _ensure_context()
    _call("cuStreamSynchronize", _stream_handle(stream))


def stream_wait_event(stream: Stream | int, event: Event) -> None:
    """Make the work queued on `stream` from now on wait for the work recorded before `event` (no host wait)."""
    with _in_context(event.device):
        _call("cuStreamWaitEvent", _stream_handle(stream), event.handle, 0, what=f"device {event.device}")


def _destroy_handle(api: str, handle: int, device: int, pid: int) -> None:
    if _owned_here(pid):
        with _in_context(device):
            _call(api, handle, what=f"device {device}")


class _DeviceHandle:
    """A driver object of one device (a stream, an event): made by `create` with `flags` in the device's context, and
    destroyed by `destroy` in it when collected (by the process that made it only)."""

    def __init__(self, device: int | None, handle_type, create: str, flags: int, destroy: str):
        self.device = current_device() if device is None else device
        handle = handle_type()
        with _in_context(self.device):
            _call(create, ctypes.byref(handle), flags, what=f"device {self.device}")
        self.handle: int = handle.value or 0
        self._finalizer = weakref.finalize(self, _destroy_handle, destroy, self.handle, self.device, _pid)
        self._finalizer.atexit = False


class Stream(_DeviceHandle):
    """A non-blocking CUDA stream (CU_STREAM_NON_BLOCKING: no implicit ordering with the legacy default stream).

    Destroyed by `destroy()` or when collected; work already queued on it still completes.
    """

    def __init__(self, device: int | None = None):
        super().__init__(device, _CUstream, "cuStreamCreate", CU_STREAM_NON_BLOCKING, "cuStreamDestroy")

    def synchronize(self) -> None:
        stream_synchronize(self.handle)

    def destroy(self) -> None:
        self._finalizer()

    def __int__(self) -> int:
        return self.handle

    def __repr__(self) -> str:
        return f"Stream(handle=0x{self.handle:x}, device={self.device})"


class Event(_DeviceHandle):
    """A CUDA event with timing enabled, for measuring kernels on the device's own clock."""

    def __init__(self, device: int | None = None):
        super().__init__(device, _CUevent, "cuEventCreate", CU_EVENT_DEFAULT, "cuEventDestroy")

    def record(self, stream: Stream | int = 0) -> None:
        """Record the event on `stream` (0 = the legacy default stream of the event's device)."""
        # In the event's own context: stream 0 means the default stream of whichever context is current.
        with _in_context(self.device):
            _call("cuEventRecord", self.handle, _stream_handle(stream))

    def synchronize(self) -> None:
        """Wait until the work recorded before this event has finished."""
        with _in_context(self.device):
            _call("cuEventSynchronize", self.handle)

    @staticmethod
    def elapsed_ms(start: Event, end: Event) -> float:
        """Milliseconds between two recorded, completed events (resolution about 0.5 us)."""
        ms = ctypes.c_float()
        with _in_context(start.device):
            _call("cuEventElapsedTime", ctypes.byref(ms), start.handle, end.handle)
        return float(ms.value)

    def __repr__(self) -> str:
        return f"Event(handle=0x{self.handle:x}, device={self.device})"


# --- stream gates -----------------------------------------------------------------------------------------------------
class MappedHostWords:
    """`count` int64 words of pinned host memory mapped into `device`'s address space: kernels write them through
    `device_ptr`, the host reads them through `host` (a numpy view) with no copy and no wait. Zeroed when made; freed
    with this object."""

    def __init__(self, count: int, device: int | None = None):
        self.device = current_device() if device is None else device
        self.count = count
        host = ctypes.c_void_p()
        mapped = _CUdeviceptr()
        with _in_context(self.device):
            _call(
                "cuMemHostAlloc",
                ctypes.byref(host),
                8 * count,
                CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP,
                what=f"{count} mapped words for device {self.device}",
            )
            self._finalizer = weakref.finalize(self, release_memory, "cuMemFreeHost", host.value, self.device, _pid)
            self._finalizer.atexit = False
            _call("cuMemHostGetDevicePointer", ctypes.byref(mapped), host.value, 0, what=f"device {self.device}")
        self.host = np.ctypeslib.as_array((ctypes.c_int64 * count).from_address(host.value or 0))
        self.host[:] = 0
        self.ptr = self.device_ptr = mapped.value  # `ptr`: as a DeviceAllocation reads, for a storage over it


class _Watchdog:
    """One daemon thread that calls `open(forced=True)` when an armed hold outlives its time limit; `arm` and
    `disarm` cost the holding thread a lock and a notify, never a thread's start."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: tuple[int, float, Callable[..., None]] | None = None
        self._count = 0
        threading.Thread(target=self._run, name="nbxcert-gate-watchdog", daemon=True).start()

    def arm(self, limit_s: float, open_gate: Callable[..., None]) -> int:
        with self._cond:
            self._count += 1
            self._armed = (self._count, time.monotonic() + limit_s, open_gate)
            self._cond.notify()
            return self._count

    def disarm(self, token: int) -> None:
        with self._cond:
            if self._armed is not None and self._armed[0] == token:
                self._armed = None

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._armed is None:
                    self._cond.wait()
                    continue
                token, deadline, open_gate = self._armed
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._armed = None
                open_gate(forced=True)


class StreamGate:
    """Holds a stream at a point until the host opens it, so a batch of work queued behind it runs back to back.

    A word of pinned host memory mapped into the device: `hold(stream)` queues `cuStreamWaitValue32` (GEQ) for the
    next value of a counter, `open()` writes that value. Timing with events needs it: a start event the GPU reaches
    before the host has queued the timed kernel times the host's launch, not the kernel. While a gate is held, a call
    of the holding thread that waits for the device raises `GateHeld` (it would wait for itself), and memory collected
    meanwhile is freed when the gate opens.
    """

    def __init__(self, device: int | None = None):
        self.device = current_device() if device is None else device
        self._words = MappedHostWords(1, self.device)  # freed with the gate
        # the wait reads 32 bits at the word's address: its low half (little-endian), zeroed with it
        self._word = ctypes.c_uint32.from_address(self._words.host.ctypes.data)
        self._mapped = self._words.device_ptr
        self._target = 0
        self._lock = threading.Lock()
        self.forced = False  # the last hold was opened by its time limit, not by `open()`
        self._watchdog: _Watchdog | None = None

    @property
    def shut(self) -> bool:
        return self._word.value != self._target

    def hold(self, stream: Stream | int) -> None:
        """Queue a wait on `stream`: the work queued after it runs once `open()` is called."""
        if self.shut:
            raise RuntimeError("this gate is already held; open it before holding it again")
        target = (self._target + 1) & 0xFFFFFFFF
        with _in_context(self.device):
            _call(
                "cuStreamWaitValue32",
                _stream_handle(stream),
                self._mapped,
                target,
                CU_STREAM_WAIT_VALUE_GEQ,
                what=f"device {self.device}",
            )
        self._target = target
        self.forced = False
        _tls.gates = getattr(_tls, "gates", 0) + 1
        if not hasattr(_tls, "deferred_frees"):
            _tls.deferred_frees = []

    def open(self, forced: bool = False) -> None:
        """Let the held stream run (idempotent). `forced`: called by a time limit, from any thread."""
        with self._lock:
            if not self.shut:
                return
            self._word.value = self._target
            self.forced = forced

    @contextlib.contextmanager
    def holding(self, stream: Stream | int, limit_s: float) -> Iterator[StreamGate]:
        """Hold `stream` for the block; open the gate when it ends, or after `limit_s` seconds from another thread
        (`forced` then says so: the block took longer than its limit to queue its work). The other thread is the
        gate's one watchdog, started with its first hold: a thread started for every hold cost the holding thread
        its start-up wait each time, milliseconds on a host whose cores are busy compiling."""
        self.hold(stream)
        watchdog = self._watchdog
        if watchdog is None:
            watchdog = self._watchdog = _Watchdog()
        token = watchdog.arm(limit_s, self.open)
        try:
            yield self
        finally:
            watchdog.disarm(token)
            self.open()
            _tls.gates -= 1
            if not _tls.gates:
                deferred, _tls.deferred_frees = _tls.deferred_frees, []
                for free, args in deferred:
                    free(*args)
