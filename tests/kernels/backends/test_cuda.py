"""Tests of the libcuda layer (`nbxcert.kernels.backends.cuda`) and the torch-free Triton driver (`triton_cuda`).

Three kinds:
- plain tests, anywhere: the no-driver path, error formatting and the poisoning table, the enum values against the
  `cuda.h` Triton ships, argument checks made before any driver call, and that importing the driver imports no torch;
- `fake libcuda` tests, on machines where no real driver is loaded in the process (CI): a small C stand-in for
  libcuda.so.1 (host memory as "device" memory, a per-thread context stack, host-clock events) is compiled with the
  system C compiler, so the whole module runs - argtypes, contexts, copies, finalizers, the benchmark loop;
- `gpu` tests, on a real NVIDIA GPU: device facts, copies, memsets, events, and the proof that a Triton kernel compiles,
  launches and gives right answers with torch made unimportable (in a subprocess, so the proof owns its interpreter).
"""

from __future__ import annotations

import collections
import contextvars
import ctypes
import gc
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nbxcert.errors import BackendUnavailable, CudaError, DeviceNotFound, DeviceOutOfMemory, UsageError
from nbxcert.kernels.backends import cuda, memory


# --- helpers ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def gpu():
    ok, why = cuda.available()
    if not ok:
        pytest.skip(f"no usable NVIDIA GPU: {why}")


@pytest.fixture
def no_libcuda(monkeypatch, tmp_path):
    """The module as on a machine without the driver: the loader name points at a file that does not exist."""
    monkeypatch.setattr(cuda, "LIBCUDA_NAME", str(tmp_path / "libcuda.so.1"))
    monkeypatch.setattr(cuda, "_libcuda", None)


# The proof prelude: torch cannot be imported (as if not installed) before anything else is, then the driver goes in.
NO_TORCH_PRELUDE = """
import importlib.abc
import sys


class RefuseTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden by the no-torch proof)", name=fullname)
        return None


sys.meta_path.insert(0, RefuseTorch())
"""

# A minimal stand-in for the tensor layer: Triton reads `data_ptr()` and `str(dtype)` ("float16" -> "*fp16").
STAND_IN_TENSOR = """
import numpy as np
import triton
import triton.language as tl

from nbxcert.kernels.backends import cuda, triton_cuda


class DType:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name

    __repr__ = __str__


FLOAT16, FLOAT32 = DType("float16"), DType("float32")
NUMPY = {FLOAT16: np.float16, FLOAT32: np.float32}


class DeviceArray:
    def __init__(self, host, dtype):
        host = np.ascontiguousarray(host, dtype=NUMPY[dtype])
        self.shape, self.dtype = host.shape, dtype
        self.allocation = cuda.mem_alloc(host.nbytes, cuda.current_device())
        cuda.memcpy_htod(self.allocation.ptr, host, host.nbytes)

    @classmethod
    def poisoned(cls, shape, dtype):
        return cls(np.full(shape, np.nan), dtype)

    def data_ptr(self):
        return self.allocation.ptr

    def numpy(self):
        out = np.empty(self.shape, NUMPY[self.dtype])
        cuda.memcpy_dtoh(out, self.data_ptr(), out.nbytes)
        return out


driver = triton_cuda.install(0)
assert triton.runtime.driver.active is driver
"""

MATMUL_KERNEL = """
@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,  # fp16 matrices: A (M, K), B (K, N), C (M, N)
    M, N, K,  # problem size
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,  # element strides
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,  # one program's tile
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a_mask = (offs_m[:, None] < M) & ((k + offs_k)[None, :] < K)
        b_mask = ((k + offs_k)[:, None] < K) & (offs_n[None, :] < N)
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k + offs_k)[None, :] * stride_ak, mask=a_mask, other=0.0)
        b = tl.load(b_ptr + (k + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn, mask=b_mask, other=0.0)
        acc += tl.dot(a, b)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(tl.float16), mask=c_mask)


M = N = K = 256
rng = np.random.default_rng(20261129)
a = rng.standard_normal((M, K)).astype(np.float16)
b = rng.standard_normal((K, N)).astype(np.float16)
A, B = DeviceArray(a, FLOAT16), DeviceArray(b, FLOAT16)
GRID = (triton.cdiv(M, 64), triton.cdiv(N, 64))


def run_matmul(C):
    matmul_kernel[GRID](A, B, C, M, N, K, K, 1, N, 1, N, 1, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
"""


def _run_proof(tmp_path: Path, body: str, timeout: int = 600) -> str:
    """Run prelude + body as a script (not `-c`: @triton.jit needs the kernel's source file) in a fresh interpreter."""
    script = tmp_path / "proof.py"
    script.write_text(NO_TORCH_PRELUDE + STAND_IN_TENSOR + textwrap.dedent(body))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.pop("TRITON_INTERPRET", None)  # the proof is about the GPU driver, never the interpreter
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, (
        f"proof script failed ({proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


# --- no driver --------------------------------------------------------------------------------------------------------
def test_available_is_false_without_libcuda_and_does_not_raise(no_libcuda):
    ok, reason = cuda.available()
    assert ok is False
    assert reason.startswith(f"{cuda.LIBCUDA_NAME} could not be loaded: ")


def test_calls_raise_backend_unavailable_without_libcuda(no_libcuda):
    with pytest.raises(BackendUnavailable, match="could not be loaded"):
        cuda.device_count()
    with pytest.raises(BackendUnavailable, match="could not be loaded"):
        cuda.mem_alloc(16, 0)


# --- error formatting and poisoning -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "status, name",
    [
        (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        (2, "CUDA_ERROR_OUT_OF_MEMORY"),
        (100, "CUDA_ERROR_NO_DEVICE"),
        (1, "CUDA_ERROR_INVALID_VALUE"),
        (3, "CUDA_ERROR_NOT_INITIALIZED"),
        (719, "CUDA_ERROR_LAUNCH_FAILED"),
        (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
        (101, "CUDA_ERROR_INVALID_DEVICE"),
    ],
)
def test_check_formats_call_name_and_status(no_libcuda, status, name):
    with pytest.raises(CudaError) as info:
        cuda.check(status, "cuCtxSynchronize")
    assert str(info.value) == f"cuCtxSynchronize failed: {name} ({status})"
    assert info.value.status == status
    assert info.value.hint  # CudaError's default next step


def test_check_passes_success_and_names_an_unknown_status(no_libcuda):
    assert cuda.check(0, "cuInit") is None
    with pytest.raises(CudaError, match=r"^cuMemAlloc_v2 failed: CUDA_ERROR_UNRECOGNISED \(12345\)$"):
        cuda.check(12345, "cuMemAlloc_v2")


def test_check_does_not_mark_the_context_poisoned(no_libcuda):
    # Only real driver calls may mark the process poisoned; formatting a status (here, a test's) must not.
    with pytest.raises(CudaError):
        cuda.check(700, "cuCtxSynchronize")
    assert cuda.context_poisoned() is None


@pytest.mark.parametrize("status", [700, 702, 710, 714, 715, 716, 717, 718, 719])
def test_sticky_launch_errors_poison_the_context(no_libcuda, status):
    with pytest.raises(CudaError) as info:
        cuda.check(status, "cuCtxSynchronize")
    assert cuda.launch_error_poisons_context(info.value)


@pytest.mark.parametrize("status", [1, 2, 100, 101, 201, 209, 400, 600, 701])
def test_recoverable_errors_do_not_poison_the_context(no_libcuda, status):
    with pytest.raises(CudaError) as info:
        cuda.check(status, "cuLaunchKernelEx")
    assert not cuda.launch_error_poisons_context(info.value)


def test_poisoning_read_from_a_message_without_status():
    assert cuda.launch_error_poisons_context(CudaError("cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED (719)"))
    assert not cuda.launch_error_poisons_context(CudaError("cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"))
    assert not cuda.launch_error_poisons_context(CudaError("something else went wrong"))


# --- the tables against cuda.h ----------------------------------------------------------------------------------------
def _cuda_h_enum(prefix: str) -> dict[str, int]:
    import triton

    header = Path(triton.__file__).parent / "backends" / "nvidia" / "include" / "cuda.h"
    if not header.is_file():
        pytest.skip(f"this Triton ships no cuda.h at {header}")
    pattern = re.compile(rf"^\s*({prefix}\w+)\s*=\s*(\d+)\s*,", re.MULTILINE)
    return {name: int(value) for name, value in pattern.findall(header.read_text(errors="replace"))}


# Our attribute names -> the enumerator's name in cuda.h (stated here independently of cuda.py's comments).
ATTRIBUTE_ENUMERATORS = {
    "max_threads_per_block": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
    "max_shared_memory_per_block": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK",
    "total_constant_memory": "CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY",
    "warp_size": "CU_DEVICE_ATTRIBUTE_WARP_SIZE",
    "max_registers_per_block": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK",
    "clock_rate_khz": "CU_DEVICE_ATTRIBUTE_CLOCK_RATE",
    "multiprocessor_count": "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
    "integrated": "CU_DEVICE_ATTRIBUTE_INTEGRATED",
    "ecc_enabled": "CU_DEVICE_ATTRIBUTE_ECC_ENABLED",
    "memory_clock_rate_khz": "CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE",
    "global_memory_bus_width": "CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH",
    "l2_cache_size": "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE",
    "max_threads_per_multiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR",
    "unified_addressing": "CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING",
    "compute_capability_major": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
    "compute_capability_minor": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
    "max_shared_memory_per_multiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "max_registers_per_multiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR",
    "max_shared_memory_per_block_optin": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "max_blocks_per_multiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR",
    "reserved_shared_memory_per_block": "CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK",
    "cluster_launch": "CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH",
}

REQUIRED_ATTRIBUTES = {
    "max_shared_memory_per_block_optin",
    "max_shared_memory_per_block",
    "max_registers_per_block",
    "max_registers_per_multiprocessor",
    "max_threads_per_block",
    "warp_size",
    "multiprocessor_count",
    "l2_cache_size",
    "clock_rate_khz",
    "memory_clock_rate_khz",
    "global_memory_bus_width",
}


def test_device_attribute_values_match_cuda_h():
    enum = _cuda_h_enum("CU_DEVICE_ATTRIBUTE_")
    assert set(cuda.DEVICE_ATTRIBUTES) >= REQUIRED_ATTRIBUTES
    assert set(cuda.DEVICE_ATTRIBUTES) == set(ATTRIBUTE_ENUMERATORS)
    for key, value in cuda.DEVICE_ATTRIBUTES.items():
        assert enum[ATTRIBUTE_ENUMERATORS[key]] == value, key


def test_error_names_match_cuda_h():
    enum = _cuda_h_enum("CUDA_")
    for code, name in cuda.ERROR_NAMES.items():
        if name in enum:  # a name newer than this Triton's header cannot be checked against it
            assert enum[name] == code, name
    for code in (1, 2, 3, 100, 101, 700, 702, 714, 715, 716, 719):
        assert enum[cuda.ERROR_NAMES[code]] == code


def test_poisoning_statuses_are_documented_as_sticky_in_cuda_h():
    import triton

    header = Path(triton.__file__).parent / "backends" / "nvidia" / "include" / "cuda.h"
    if not header.is_file():
        pytest.skip(f"this Triton ships no cuda.h at {header}")
    text = header.read_text(errors="replace")
    enum = _cuda_h_enum("CUDA_ERROR_")
    by_code = {code: name for name, code in enum.items()}
    sticky = set()
    # each value's own doc comment: the body may not run past a `*/` (a lazy `.*?` let a comment that is not followed
    # by a value run on through the next ones, which scanned the 1 MB header quadratically: 15 s)
    for match in re.finditer(r"/\*\*((?:(?!\*/).)*)\*/\s*(CUDA_ERROR_\w+)\s*=", text, re.DOTALL):
        doc, name = match.groups()
        doc = " ".join(doc.replace("*", " ").split()).lower()  # the header wraps sentences across comment lines
        if "inconsistent state" in doc or "context cannot be used anymore" in doc:
            sticky.add(enum[name])
    known = {code for code in cuda.POISONING_STATUSES if code in by_code}
    # Every error cuda.h calls sticky is in our set; ours adds only the uncorrectable ECC/NVLink errors.
    assert sticky <= known
    assert known - sticky <= {214, 220}


# --- argument checks before any driver call ---------------------------------------------------------------------------
def test_copy_and_memset_arguments_are_checked_before_the_driver(no_libcuda):
    with pytest.raises(ValueError, match="C-contiguous"):
        cuda.memcpy_htod(0x1000, np.zeros((4, 4))[:, ::2], 16)
    with pytest.raises(ValueError, match="read-only"):
        cuda.memcpy_dtoh(b"immutable", 0x1000, 4)
    with pytest.raises(ValueError, match="fewer than"):
        cuda.memcpy_htod(0x1000, np.zeros(3, np.uint8), 4)
    with pytest.raises(TypeError):
        cuda.memcpy_htod(0x1000, object(), 4)
    with pytest.raises(ValueError, match="8 unsigned bits"):
        cuda.memset_d8(0x1000, 256, 1)
    with pytest.raises(ValueError, match="32 unsigned bits"):
        cuda.memset_d32(0x1000, -1, 1)
    with pytest.raises(ValueError, match="negative"):
        cuda.mem_alloc(-1, 0)
    with pytest.raises(TypeError):
        cuda.mem_alloc(16.0, 0)  # a float size is refused, not truncated


# --- the Triton driver without a GPU ----------------------------------------------------------------------------------
def test_importing_the_triton_driver_imports_no_torch(tmp_path):
    script = tmp_path / "import_only.py"
    script.write_text(
        NO_TORCH_PRELUDE
        + "from nbxcert.kernels.backends import triton_cuda\n"
        + "assert 'torch' not in sys.modules\n"
        + "print('IMPORT_OK', triton_cuda.NbxcertCudaDriver.__mro__[1].__name__)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "IMPORT_OK CudaDriver" in proc.stdout


def test_torch_queries_are_refused_with_a_typed_error():
    from nbxcert.kernels.backends import triton_cuda

    driver = triton_cuda.NbxcertCudaDriver.__new__(triton_cuda.NbxcertCudaDriver)  # no CudaUtils compile needed
    for query in (driver.get_active_torch_device, driver.get_device_interface):
        with pytest.raises(BackendUnavailable, match="nbxcert's driver has no torch device"):
            query()
        with pytest.raises(NotImplementedError):
            query()
    assert driver.get_benchmarker() is triton_cuda.triton_benchmarker


def test_time_quantiles_match_triton_testing():
    from triton import testing

    from nbxcert.kernels.backends import triton_cuda

    times = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2]
    qs = (0.5, 0.2, 0.8, 0.0, 1.0)
    assert triton_cuda.time_quantiles(times, qs) == pytest.approx(testing._quantile(times, qs))
    with pytest.raises(ValueError):
        triton_cuda.time_quantiles(times, (1.5,))


# --- a fake libcuda -------------------------------------------------------------------------------------------------
FAKE_LIBCUDA_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef struct { double ms; int recorded; } Event;

static int initialised = 0, n_devices = 2;
static CUresult sticky = 0;
static long live = 0, stream_count = 0, event_count = 0;
static __thread void *stack[64];
static __thread int depth = 0;

#define CTX(d) ((void *)(uintptr_t)(0x1000 + (d)))
#define PTR(d) ((void *)(uintptr_t)(d))
#define NEED_INIT if (!initialised) return 3
#define NEED_CTX NEED_INIT; if (depth == 0 || stack[depth - 1] == 0) return 201
#define NEED_DEV(d) NEED_INIT; if ((d) < 0 || (d) >= n_devices) return 101
#define HEALTHY if (sticky) return sticky

static int held, n_pending;
void fake_reset(void) {
  initialised = 0; sticky = 0; live = 0; stream_count = 0; event_count = 0; held = 0; n_pending = 0;
}
void fake_set_sticky(int s) { sticky = s; }
long fake_live_allocations(void) { return live; }
long fake_live_streams(void) { return stream_count; }
long fake_live_events(void) { return event_count; }
uintptr_t fake_current_context(void) { return depth ? (uintptr_t)stack[depth - 1] : 0; }
int fake_context_depth(void) { return depth; }

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

CUresult cuInit(unsigned flags) { if (flags) return 1; initialised = 1; return n_devices > 0 ? 0 : 100; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) {
  /* Deliberately partial, so the module's own table is exercised for the rest. */
  switch (e) {
    case 0: *s = "CUDA_SUCCESS"; return 0;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0;
    default: *s = NULL; return 1;
  }
}
CUresult cuDeviceGetCount(int *c) { NEED_INIT; *c = n_devices; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { NEED_DEV(ordinal); *d = ordinal; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d) { NEED_DEV(d); snprintf(name, len, "Fake GPU %d", d); return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) {
  NEED_DEV(d);
  switch (attribute) {
    case 10: *v = 32; break;
    case 75: *v = 9; break;
    case 76: *v = 0; break;
    case 38: *v = 50 * 1024 * 1024; break;
    default: if (attribute > 200) return 1; *v = 1000 + attribute;
  }
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { NEED_DEV(d); *bytes = (size_t)80 << 30; return 0; }
CUresult cuDeviceGetPCIBusId(char *s, int len, int d) {
  NEED_DEV(d);
  snprintf(s, len, "0000:%02x:00.0", 0x19 + d);
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { NEED_DEV(d); *c = CTX(d); return 0; }
CUresult cuCtxSetCurrent(void *c) { NEED_INIT; if (depth == 0) depth = 1; stack[depth - 1] = c; return 0; }
CUresult cuCtxPushCurrent_v2(void *c) { NEED_INIT; if (!c) return 201; stack[depth++] = c; return 0; }
CUresult cuCtxPopCurrent_v2(void **c) { NEED_INIT; if (depth == 0) return 201; *c = stack[--depth]; return 0; }
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) {
  NEED_CTX; HEALTHY;
  if (n == 0) return 1;
  if (n > ((size_t)1 << 40)) return 2;
  void *m = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m) return 2;
  *p = (uint64_t)(uintptr_t)m;
  live++;
  return 0;
}
CUresult cuMemFree_v2(uint64_t p);
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
  NEED_CTX;
  *t = (size_t)80 << 30;
  *f = *t - (size_t)live * 4096;
  return 0;
}
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n) { NEED_CTX; HEALTHY; memcpy(PTR(d), s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n) { NEED_CTX; HEALTHY; memcpy(d, PTR(s), n); return 0; }
CUresult cuMemcpyDtoD_v2(uint64_t d, uint64_t s, size_t n) { NEED_CTX; HEALTHY; memmove(PTR(d), PTR(s), n); return 0; }
CUresult cuMemsetD8_v2(uint64_t d, unsigned char v, size_t n) { NEED_CTX; HEALTHY; memset(PTR(d), v, n); return 0; }
CUresult cuMemsetD32_v2(uint64_t d, unsigned v, size_t n) {
  NEED_CTX; HEALTHY;
  if (d % 4) return 1;
  for (size_t i = 0; i < n; i++) ((unsigned *)PTR(d))[i] = v;
  return 0;
}
CUresult cuMemsetD8Async(uint64_t d, unsigned char v, size_t n, void *s) { (void)s; return cuMemsetD8_v2(d, v, n); }
CUresult cuMemsetD32Async(uint64_t d, unsigned v, size_t n, void *s) { (void)s; return cuMemsetD32_v2(d, v, n); }
CUresult cuStreamCreate(void **s, unsigned flags) {
  NEED_CTX;
  if (flags != 1) return 1; /* nbxcert asks for CU_STREAM_NON_BLOCKING */
  *s = malloc(8);
  stream_count++;
  return 0;
}
CUresult cuStreamDestroy_v2(void *s) { NEED_INIT; free(s); stream_count--; return 0; }
CUresult cuStreamSynchronize(void *s);
CUresult cuEventCreate(void **e, unsigned flags) {
  NEED_CTX;
  if (flags != 0) return 1; /* timing must stay enabled */
  *e = calloc(1, sizeof(Event));
  event_count++;
  return 0;
}
CUresult cuEventDestroy_v2(void *e) { NEED_INIT; free(e); event_count--; return 0; }
/* One held stream at most (the tests use one): work queued after cuStreamWaitValue32_v2 waits until the word
   reaches the value, then runs at once. Events recorded meanwhile take the time the wait ended, as a GPU that runs
   the held batch back to back would; the waiting calls below block until then, as the driver's do. */
static volatile uint32_t *wait_word = 0;
static uint32_t wait_value = 0;
static int held, n_pending;
static Event *pending[1 << 16];
static void settle(void) {
  if (held && (int32_t)(*wait_word - wait_value) >= 0) {
    double t = now_ms();
    for (int i = 0; i < n_pending; i++) { pending[i]->ms = t; pending[i]->recorded = 1; }
    n_pending = 0;
    held = 0;
  }
}
static void wait_unheld(void) {
  struct timespec pause = {0, 100000};
  for (settle(); held; settle()) nanosleep(&pause, NULL);
}
int fake_held(void) { settle(); return held; }
CUresult cuStreamWaitValue32_v2(void *s, uint64_t addr, uint32_t value, unsigned flags) {
  (void)s;
  NEED_CTX;
  if (flags != 0) return 1; /* nbxcert asks for CU_STREAM_WAIT_VALUE_GEQ */
  settle();
  if (held) return 1;
  wait_word = (volatile uint32_t *)(uintptr_t)addr;
  wait_value = value;
  held = 1;
  settle();
  return 0;
}
static long live_host = 0;
long fake_live_host_allocations(void) { return live_host; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
  NEED_CTX;
  if (!(flags & 2)) return 1; /* must be mapped into the device */
  *p = calloc(1, n < 8 ? 8 : n);
  if (*p) live_host++;
  return *p ? 0 : 2;
}
CUresult cuMemHostGetDevicePointer_v2(uint64_t *d, void *p, unsigned flags) {
  NEED_CTX;
  if (flags) return 1;
  *d = (uint64_t)(uintptr_t)p;
  return 0;
}
CUresult cuMemFreeHost(void *p) { NEED_INIT; wait_unheld(); free(p); live_host--; return 0; }
CUresult cuEventRecord(void *e, void *s) {
  (void)s;
  NEED_CTX;
  settle();
  if (held) {
    ((Event *)e)->recorded = 0;
    pending[n_pending++] = (Event *)e;
    return 0;
  }
  ((Event *)e)->ms = now_ms();
  ((Event *)e)->recorded = 1;
  return 0;
}
CUresult cuEventSynchronize(void *e) { (void)e; NEED_INIT; wait_unheld(); return sticky; }
CUresult cuCtxSynchronize(void) { NEED_CTX; wait_unheld(); return sticky; }
CUresult cuStreamSynchronize(void *s) { (void)s; NEED_CTX; wait_unheld(); return sticky; }
CUresult cuMemFree_v2(uint64_t p) { NEED_CTX; HEALTHY; wait_unheld(); free(PTR(p)); live--; return 0; }
/* A stream-ordered pool, as far as nbxcert can tell: a freed block of the same (512-byte rounded) size is reused
   without a new reservation; trimming gives the unused blocks back; `fake_set_pool_limit` bounds the reservation so
   that out of memory can be provoked. Stream order itself is not modelled (the fake runs everything at once). */
typedef struct { uint64_t ptr; size_t size; int used; } Block;
static Block blocks[4096];
static int n_blocks_made = 0;
static size_t reserved = 0, reserved_high = 0, used = 0, used_high = 0, pool_limit = (size_t)1 << 40;
static long pool_reservations = 0, pools_made = 0, pool_allocs = 0, pool_frees = 0;
static uintptr_t last_alloc_stream = 0, last_free_stream = 0;
long fake_pool_allocs(void) { return pool_allocs; }
long fake_pool_frees(void) { return pool_frees; }
uintptr_t fake_last_alloc_stream(void) { return last_alloc_stream; }
uintptr_t fake_last_free_stream(void) { return last_free_stream; }
static uint64_t threshold = 0;
void fake_set_pool_limit(size_t n) { pool_limit = n; }
long fake_pool_reservations(void) { return pool_reservations; }
size_t fake_pool_reserved(void) { return reserved; }
long fake_pools_made(void) { return pools_made; }
void fake_pool_reset(void) {
  for (int i = 0; i < n_blocks_made; i++) free(PTR(blocks[i].ptr));
  n_blocks_made = 0; reserved = reserved_high = used = used_high = 0; pool_limit = (size_t)1 << 40;
  pool_reservations = 0; pools_made = 0; threshold = 0; pool_allocs = 0; pool_frees = 0;
  last_alloc_stream = 0; last_free_stream = 0;
}
CUresult cuMemPoolCreate(void **pool, const void *props) {
  NEED_CTX;
  if (((const int *)props)[0] != 1 || ((const int *)props)[2] != 1) return 1; /* pinned, on a device */
  *pool = malloc(8); pools_made++;
  return 0;
}
CUresult cuMemPoolSetAttribute(void *pool, int attr, void *value) {
  NEED_INIT; if (!pool) return 1;
  uint64_t v = *(uint64_t *)value;
  if (attr == 4) { threshold = v; return 0; }
  if ((attr == 6 || attr == 8) && v == 0) { if (attr == 6) reserved_high = reserved; else used_high = used; return 0; }
  return 1;
}
CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value) {
  NEED_INIT; if (!pool) return 1;
  uint64_t *v = (uint64_t *)value;
  switch (attr) {
    case 4: *v = threshold; return 0;
    case 5: *v = reserved; return 0;
    case 6: *v = reserved_high; return 0;
    case 7: *v = used; return 0;
    case 8: *v = used_high; return 0;
  }
  return 1;
}
CUresult cuMemAllocFromPoolAsync(uint64_t *p, size_t n, void *pool, void *stream) {
  NEED_CTX; HEALTHY;
  if (!pool || n == 0) return 1;
  pool_allocs++; last_alloc_stream = (uintptr_t)stream;
  size_t size = (n + 511) / 512 * 512;
  for (int i = 0; i < n_blocks_made; i++)
    if (!blocks[i].used && blocks[i].size == size) {
      blocks[i].used = 1; used += size; if (used > used_high) used_high = used;
      *p = blocks[i].ptr; return 0;
    }
  if (reserved + size > pool_limit || n_blocks_made == 4096) return 2;
  void *m = aligned_alloc(512, size);
  if (!m) return 2;
  blocks[n_blocks_made++] = (Block){(uint64_t)(uintptr_t)m, size, 1};
  reserved += size; if (reserved > reserved_high) reserved_high = reserved;
  used += size; if (used > used_high) used_high = used;
  pool_reservations++;
  *p = (uint64_t)(uintptr_t)m;
  return 0;
}
CUresult cuMemFreeAsync(uint64_t p, void *stream) {
  NEED_CTX; HEALTHY;
  pool_frees++; last_free_stream = (uintptr_t)stream;
  for (int i = 0; i < n_blocks_made; i++)
    if (blocks[i].ptr == p && blocks[i].used) { blocks[i].used = 0; used -= blocks[i].size; return 0; }
  return 1;
}
CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
  NEED_INIT; if (!pool || keep) return 1;
  int j = 0;
  for (int i = 0; i < n_blocks_made; i++) {
    if (blocks[i].used) { blocks[j++] = blocks[i]; continue; }
    reserved -= blocks[i].size; free(PTR(blocks[i].ptr));
  }
  n_blocks_made = j;
  return 0;
}
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
  NEED_INIT;
  settle();
  if (!((Event *)a)->recorded || !((Event *)b)->recorded) return 400;
  *ms = (float)(((Event *)b)->ms - ((Event *)a)->ms);
  return 0;
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) { (void)s; (void)e; (void)flags; NEED_CTX; return 0; }
CUresult cuMemcpyDtoDAsync_v2(uint64_t d, uint64_t s, size_t n, void *st) {
  (void)st; NEED_CTX; HEALTHY; memmove(PTR(d), PTR(s), n); return 0;
}
/* graphs: bound by cuda.py, exercised on a real GPU only (tests/engine/test_graphs.py) */
CUresult cuStreamBeginCapture_v2(void *s, int mode) { (void)s; (void)mode; return 801; }
CUresult cuStreamEndCapture(void *s, void **g) { (void)s; (void)g; return 801; }
CUresult cuStreamIsCapturing(void *s, int *status) { (void)s; *status = 0; return 0; }
CUresult cuThreadExchangeStreamCaptureMode(int *mode) { (void)mode; return 0; }
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) { (void)e; (void)g; (void)f; return 801; }
CUresult cuGraphLaunch(void *e, void *s) { (void)e; (void)s; return 801; }
CUresult cuGraphGetNodes(void *g, void **n, size_t *count) { (void)g; (void)n; *count = 0; return 801; }
CUresult cuGraphExecDestroy(void *e) { (void)e; return 0; }
CUresult cuGraphDestroy(void *g) { (void)g; return 0; }
"""

FAKE_STATE = {
    "_libcuda": None,
    "_poisoned": None,
    "_devices": dict,
    "_capabilities": dict,
    "_infos": dict,
    "_contexts": dict,
    "_last_device": 0,
    "_tls": threading.local,
    "_sync_hooks": list,
}


MEMORY_STATE = {"_pools": dict, "_stats": dict, "_kept": collections.OrderedDict, "_driver": None, "_driver_pid": -1}


@pytest.fixture(scope="module")
def fake_libcuda_path(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake libcuda")
    build = tmp_path_factory.mktemp("fake_libcuda")
    source = build / "fake_libcuda.c"
    source.write_text(FAKE_LIBCUDA_C)
    library = build / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True)
    return library


@pytest.fixture
def fake(monkeypatch, fake_libcuda_path):
    """cuda.py running on the fake libcuda, with fresh module state; restored afterwards."""
    if cuda._libcuda is not None:
        pytest.skip("a real libcuda is loaded in this process; the fake cannot stand in for it")
    monkeypatch.setattr(cuda, "LIBCUDA_NAME", str(fake_libcuda_path))
    for name, fresh in FAKE_STATE.items():
        monkeypatch.setattr(cuda, name, fresh() if callable(fresh) else fresh)
    from nbxcert.kernels.backends import memory

    for name, fresh in MEMORY_STATE.items():
        monkeypatch.setattr(memory, name, fresh() if callable(fresh) else fresh)
    lib = ctypes.CDLL(str(fake_libcuda_path))
    lib.fake_live_allocations.restype = ctypes.c_long
    lib.fake_live_streams.restype = ctypes.c_long
    lib.fake_live_events.restype = ctypes.c_long
    lib.fake_current_context.restype = ctypes.c_size_t
    lib.fake_current_context.restype = ctypes.c_size_t
    lib.fake_pool_reserved.restype = ctypes.c_size_t
    lib.fake_pool_reservations.restype = ctypes.c_long
    lib.fake_pools_made.restype = ctypes.c_long
    lib.fake_pool_allocs.restype = ctypes.c_long
    lib.fake_pool_frees.restype = ctypes.c_long
    lib.fake_last_alloc_stream.restype = ctypes.c_size_t
    lib.fake_last_free_stream.restype = ctypes.c_size_t
    lib.fake_set_pool_limit.argtypes = [ctypes.c_size_t]
    lib.fake_reset()
    lib.fake_pool_reset()
    yield lib
    # Collect what the test left behind while the fake is still the driver (the timer's stream gates included).
    from nbxcert.kernels.backends import triton_cuda

    triton_cuda._tls.__dict__.clear()  # the stream gates, the timing events, the flush buffer
    gc.collect()
    lib.fake_reset()
    lib.fake_pool_reset()


def test_fake_available_reports_devices_and_driver(fake):
    assert cuda.available() == (True, "2 CUDA device(s), driver API 13.0")
    assert cuda.driver_version() == (13, 0)
    assert cuda.device_count() == 2


def test_fake_device_info(fake):
    info = cuda.device_info(1)
    assert info.index == 1 and info.name == "Fake GPU 1"
    assert info.compute_capability == (9, 0) == cuda.compute_capability(1)
    assert info.total_memory == 80 << 30
    assert info.pci_bus_id == "0000:1a:00.0"
    assert set(info.attributes) == set(cuda.DEVICE_ATTRIBUTES)
    assert info.attributes["warp_size"] == 32
    assert info.attributes["max_shared_memory_per_block_optin"] == 1097  # the fake answers 1000 + the enum value
    info.attributes["warp_size"] = 64  # a caller's edit does not reach the cache
    assert cuda.device_info(1).attributes["warp_size"] == 32
    assert hash(info) == hash(cuda.device_info(1))
    for bad in (2, -1, True, "0"):
        with pytest.raises(DeviceNotFound):
            cuda.device_info(bad)


def test_fake_use_device_retains_once_and_is_thread_safe(fake):
    first = cuda.use_device(0)
    assert cuda.use_device(0) == first == fake.fake_current_context()
    assert cuda.current_device() == 0
    handles = []
    threads = [threading.Thread(target=lambda: handles.append(cuda.use_device(1))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(handles)) == 1 and handles[0] != first
    assert cuda.current_device() == 0  # this thread's choice is its own


def test_fake_round_trip_of_random_bytes(fake):
    cuda.use_device(0)
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, size=4099, dtype=np.uint8)
    a, b = cuda.mem_alloc(data.nbytes, 0), cuda.mem_alloc(data.nbytes, 0)
    assert a.ptr % cuda.ALLOCATION_ALIGNMENT == 0 and int(a) == a.ptr == a.data_ptr()
    cuda.memcpy_htod(a.ptr, data, data.nbytes)
    cuda.memcpy_dtod(b.ptr, a.ptr, data.nbytes)
    out = np.full(data.nbytes, 7, np.uint8)
    cuda.memcpy_dtoh(out, b.ptr, data.nbytes)
    np.testing.assert_array_equal(out, data)
    # numpy integers and an allocation itself are accepted where an address or a size is expected.
    cuda.memcpy_dtod(b, a, np.int64(16))
    # Any C-contiguous buffer works on the host side.
    cuda.memcpy_htod(a.ptr, memoryview(data.tobytes()), 16)
    target = bytearray(16)
    cuda.memcpy_dtoh(target, a.ptr, 16)
    assert bytes(target) == data.tobytes()[:16]


def test_fake_memset(fake):
    cuda.use_device(0)
    buf = cuda.mem_alloc(64, 0)
    cuda.memset_d8(buf.ptr, 0xA5, 64)
    out = np.zeros(64, np.uint8)
    cuda.memcpy_dtoh(out, buf.ptr, 64)
    assert (out == 0xA5).all()
    cuda.memset_d32(buf.ptr, 0xDEADBEEF, 16)
    words = np.zeros(16, np.uint32)
    cuda.memcpy_dtoh(words, buf.ptr, 64)
    assert (words == 0xDEADBEEF).all()


def test_fake_copies_on_a_thread_that_chose_no_device(fake):
    cuda.use_device(0)
    buf = cuda.mem_alloc(8, 0)
    errors, out = [], np.zeros(8, np.uint8)

    def worker():
        try:
            cuda.memcpy_htod(buf.ptr, np.arange(8, dtype=np.uint8), 8)
            cuda.memcpy_dtoh(out, buf.ptr, 8)
        except CudaError as e:  # reported to the test thread below, not swallowed
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors == []
    np.testing.assert_array_equal(out, np.arange(8))


def test_fake_alloc_on_another_device_leaves_the_current_context(fake):
    ctx0 = cuda.use_device(0)
    other = cuda.mem_alloc(32, 1)
    assert other.device == 1
    assert fake.fake_current_context() == ctx0 and fake.fake_context_depth() == 1
    free, total = cuda.mem_get_info(1)
    assert 0 < free <= total
    assert fake.fake_current_context() == ctx0


def test_fake_free_is_idempotent_and_collection_frees(fake):
    cuda.use_device(0)
    a = cuda.mem_alloc(100, 0)
    b = cuda.mem_alloc(100, 0)
    assert fake.fake_live_allocations() == 2
    a.free()
    a.free()
    assert a.freed and a.ptr == 0 and fake.fake_live_allocations() == 1
    del b
    gc.collect()
    assert fake.fake_live_allocations() == 0
    empty = cuda.mem_alloc(0, 0)
    assert empty.ptr == 0 and empty.nbytes == 0
    empty.free()
    assert fake.fake_live_allocations() == 0


@pytest.mark.parametrize("kept", [2, 0], ids=["kept-for-the-stream", "pool-alone"])
def test_fake_a_32mib_tensor_made_a_thousand_times_reserves_device_memory_once(fake, monkeypatch, kept):
    """Bug: an output above the old block cache's 16 MiB cost a cuMemAlloc and a cuMemFree (which waits for the
    device) on every served call. From nbxcert's pool, a 32 MiB tensor made and dropped a thousand times reserves
    memory from the device once; every later allocation reuses the freed block, and the only driver calls are the
    pool's queued allocation and free (no cuMemAlloc, no cuMemFree, no synchronisation, nothing else); with a block
    kept for the stream's next allocation of its size (the default), not even those."""
    from nbxcert.kernels.tensor import empty

    monkeypatch.setattr(memory, "KEPT_PER_SIZE", kept)
    cuda.use_device(0)
    empty((4096, 4096), "float16", "cuda:0")  # the first: the pool is made and reserves the block
    assert fake.fake_pools_made() == 1 and fake.fake_pool_reservations() == 1
    calls, real = [], cuda._call
    monkeypatch.setattr(cuda, "_call", lambda api, *a, **k: (calls.append(api), real(api, *a, **k))[1])
    allocs, frees = fake.fake_pool_allocs(), fake.fake_pool_frees()
    for _ in range(1000):
        t = empty((4096, 4096), "float16", "cuda:0")  # 32 MiB
        del t
    assert fake.fake_pool_reservations() == 1
    made = 0 if kept else 1000
    assert calls == [] and fake.fake_pool_allocs() - allocs == made and fake.fake_pool_frees() - frees == made
    stats = memory.memory_stats(0)
    assert stats["allocation.all.allocated"] == 1001 and stats["allocation.all.freed"] == 1001
    assert stats["allocated_bytes.all.current"] == 0 and stats["allocated_bytes.all.peak"] == 32 << 20
    assert stats["reserved_bytes.all.current"] == 32 << 20 and stats["reserved_bytes.all.peak"] == 32 << 20


def test_fake_the_pool_keeps_every_freed_byte_unless_told_otherwise(fake, monkeypatch):
    monkeypatch.delenv("NBXCERT_MEMORY_RELEASE_THRESHOLD", raising=False)
    cuda.use_device(0)
    memory.pool_alloc(100, 0)
    assert memory._pool_attribute(0, memory.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == memory.KEEP_EVERYTHING
    monkeypatch.setattr(memory, "_pools", {})
    monkeypatch.setenv("NBXCERT_MEMORY_RELEASE_THRESHOLD", str(1 << 30))
    memory.pool_alloc(100, 0)
    assert memory._pool_attribute(0, memory.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 1 << 30
    monkeypatch.setattr(memory, "_pools", {})
    monkeypatch.setenv("NBXCERT_MEMORY_RELEASE_THRESHOLD", "1GB")
    with pytest.raises(UsageError, match=r"^NBXCERT_MEMORY_RELEASE_THRESHOLD=1GB is not a whole number of bytes$"):
        memory.pool_alloc(100, 0)


def test_fake_a_tensor_allocation_on_a_present_current_device_makes_only_the_pools_calls(fake, monkeypatch):
    """An allocating served call makes a tensor per call: after the first, the device is known present and current,
    so the driver sees the pool's allocation and free alone (it was four more calls a tensor once: the device count
    twice, the driver version, the context set current)."""
    from nbxcert.kernels.tensor import empty

    assert cuda.device_present(5) == (False, "this machine has 2 CUDA device(s)")
    with pytest.raises(DeviceNotFound, match=r"cuda:5' does not exist: this machine has 2 CUDA device\(s\)"):
        empty((4,), "float16", "cuda:5")
    empty((1, 2048), "float16", "cuda:0")  # the first on each: checks the device, makes it current, makes its pool
    empty((1, 2048), "float16", "cuda:1")
    calls, real = [], cuda._call
    monkeypatch.setattr(cuda, "_call", lambda api, *a, **k: (calls.append(api), real(api, *a, **k))[1])
    allocs = fake.fake_pool_allocs()
    for _ in range(3):
        t = empty((1, 2048), "float16", "cuda:1")
        del t
    assert calls == [] and fake.fake_pool_allocs() - allocs == 0 and cuda.current_device() == 1  # kept blocks
    empty((1, 2048), "float16", "cuda:0")  # another device: made current (its context set), its own pool
    assert calls == ["cuCtxSetCurrent"] and cuda.current_device() == 0


def test_fake_memory_is_allocated_in_its_devices_context_whatever_another_library_made_current(fake, monkeypatch):
    """nbxcert skips setting a context it made current before (`make_current`); another library may have set its own
    on the thread since, so cuMemAlloc is made with the device's context pushed for the call."""
    ctx0 = cuda.use_device(0)
    ctx1 = cuda._primary_context(1)
    fake.cuCtxSetCurrent(ctypes.c_void_p(ctx1))  # another library's doing, behind nbxcert's back
    seen, real = [], cuda._call

    def record(api, *args, **kwargs):
        if api == "cuMemAlloc":
            seen.append(fake.fake_current_context())
        return real(api, *args, **kwargs)

    monkeypatch.setattr(cuda, "_call", record)
    a = cuda.mem_alloc(3000, 0)
    assert seen == [ctx0] and a.device == 0
    assert fake.fake_current_context() == ctx1  # the other library's context left as it was


def test_fake_a_tensor_is_allocated_and_freed_on_the_stream_current_when_it_was_made(fake, monkeypatch):
    """Bug: launching on a stream other than the legacy one ended block reuse for the process. Now allocations follow
    the thread's current stream: made on it, freed on it (so reuse is in that stream's order), and the stream object
    outlives the tensors made on it."""
    from nbxcert.kernels.tensor import empty

    triton_cuda = _fresh_triton_cuda(monkeypatch)
    monkeypatch.setattr(memory, "KEPT_PER_SIZE", 0)  # the pool's own path (the kept blocks: the test below)
    cuda.use_device(0)
    stream = cuda.Stream()
    handle = stream.handle
    with triton_cuda.using_stream(stream):
        assert triton_cuda.current_stream(0) == handle == cuda.current_stream(0)
        t = empty((1024,), "float32", "cuda:0")
    assert triton_cuda.current_stream(0) == 0 and fake.fake_last_alloc_stream() == handle
    del stream
    gc.collect()
    assert fake.fake_live_streams() == 1  # held by the tensor made on it
    del t
    gc.collect()
    assert fake.fake_live_streams() == 0 and fake.fake_last_free_stream() == handle
    u = empty((1024,), "float32", "cuda:0")  # on the legacy stream
    assert fake.fake_last_alloc_stream() == 0
    del u
    assert fake.fake_last_free_stream() == 0
    assert fake.fake_pool_reservations() == 1  # the freed block reused


def test_fake_a_block_kept_for_a_stream_goes_to_that_streams_next_allocation_only(fake, monkeypatch):
    """A freed block is kept for the next allocation of its size on the stream it was freed on (reuse in that
    stream's order, as the pool's own), never handed to another stream's; the stream lives while a block of it is
    kept, and `release_kept` gives the blocks back to the pool on their streams."""
    cuda.use_device(0)
    stream = cuda.Stream()
    handle = stream.handle
    with cuda.using_stream(stream):
        a = memory.pool_alloc(4096, 0)
    ptr = a.ptr
    a.free()
    allocs = fake.fake_pool_allocs()
    b = memory.pool_alloc(4096, 0)  # the legacy stream: not the kept block
    assert b.ptr != ptr and fake.fake_pool_allocs() == allocs + 1
    with cuda.using_stream(stream):
        c = memory.pool_alloc(4096, 0)  # the same stream and size: the kept block, no driver call
        d = memory.pool_alloc(4096, 0)  # none kept now: from the pool
    assert c.ptr == ptr and c.stream == handle and fake.fake_pool_allocs() == allocs + 2 and d.ptr != ptr
    c.free()
    del stream
    gc.collect()
    assert fake.fake_live_streams() == 1  # held by the kept block (and d)
    d.free()
    frees = fake.fake_pool_frees()
    assert memory.release_kept() == 2 and fake.fake_pool_frees() == frees + 2
    assert fake.fake_last_free_stream() == handle
    gc.collect()
    assert fake.fake_live_streams() == 0
    stats = memory.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == 4096 and stats["allocation.all.current"] == 1  # b


def test_fake_kept_blocks_are_bounded_by_size_count(fake, monkeypatch):
    monkeypatch.setattr(memory, "KEPT_SIZES", 3)
    cuda.use_device(0)
    for size in (1000, 2000, 3000, 4000):  # four sizes: the least recently used one goes back to the pool
        memory.pool_alloc(size, 0).free()
    assert [k[2] for k in memory._kept] == [2000, 3000, 4000]
    assert fake.fake_pool_frees() == 1


def test_fake_out_of_memory_releases_the_pools_kept_memory_and_retries(fake):
    cuda.use_device(0)
    fake.fake_set_pool_limit(8192)
    memory.pool_alloc(4096, 0).free()  # kept by the pool: 4096 reserved, none in use
    assert fake.fake_pool_reserved() == 4096
    a = memory.pool_alloc(6000, 0)  # 6144 more would pass the limit: the kept block is released, then it fits
    assert a.ptr != 0 and fake.fake_pool_reserved() == 6144
    stats = memory.memory_stats(0)
    assert stats["num_alloc_retries"] == 1 and stats["num_ooms"] == 0
    with pytest.raises(DeviceOutOfMemory) as info:
        memory.pool_alloc(4096, 0)  # 6144 held: nothing kept to release
    assert str(info.value) == (
        "out of memory on cuda:0: asked for 4096 bytes; nbxcert's tensors hold 6000 bytes and its pool reserves 6144;"
        f" the device has {cuda.mem_get_info(0)[0]} of {80 << 30} bytes free (cuMemAllocFromPoolAsync: "
        "CUDA_ERROR_OUT_OF_MEMORY (2))"
    )
    assert isinstance(info.value, CudaError) and cuda.context_poisoned() is None
    stats = memory.memory_stats(0)
    assert stats["num_alloc_retries"] == 2 and stats["num_ooms"] == 1 and stats["allocated_bytes.all.current"] == 6000


def test_fake_memory_stats_peaks_reset_and_empty_cache(fake):
    cuda.use_device(0)
    a, b = memory.pool_alloc(1000, 0), memory.pool_alloc(3000, 0)
    assert memory.memory_allocated(0) == 4000 and memory.max_memory_allocated(0) == 4000
    b.free()
    assert memory.memory_allocated(0) == 1000 and memory.max_memory_allocated(0) == 4000
    assert memory.memory_reserved(0) == 1024 + 3072
    memory.reset_peak_memory_stats(0)
    assert memory.max_memory_allocated(0) == 1000 and memory.memory_stats(0)["reserved_bytes.all.peak"] == 4096
    memory.empty_cache()
    assert memory.memory_reserved(0) == 1024 and a.ptr != 0
    assert memory.memory_stats(1)["allocated_bytes.all.current"] == 0  # a device with no pool yet: zeros


def test_fake_sync_hooks_run_after_every_synchronising_call(fake):
    cuda.use_device(0)
    seen = []
    cuda.add_sync_hook(lambda: seen.append(1))
    buf = cuda.mem_alloc(16, 0)
    seen.clear()
    cuda.synchronize()
    assert seen == [1]
    cuda.memcpy_dtoh(np.zeros(16, np.uint8), buf.ptr, 16)  # its synchronisation before the copy
    assert seen == [1, 1]
    n = len(seen)
    cuda.mem_alloc(16, 0)  # not a synchronising call
    assert len(seen) == n

    def fault():
        raise RuntimeError("recorded by a kernel")

    cuda.add_sync_hook(fault)
    with pytest.raises(RuntimeError, match="recorded by a kernel"):
        cuda.synchronize()


def test_fake_mapped_host_words_are_zeroed_and_shared_with_the_device(fake):
    cuda.use_device(0)
    words = cuda.MappedHostWords(4, 0)
    assert list(words.host) == [0, 0, 0, 0] and words.device_ptr != 0 and words.ptr == words.device_ptr
    words.host[2] = -5
    read = np.zeros(4, np.int64)
    cuda.memcpy_dtoh(read, words.device_ptr, 32)  # the device's view of the same words (the fake maps 1:1)
    assert list(read) == [0, 0, -5, 0]
    hosts = fake.fake_live_host_allocations
    hosts.restype = ctypes.c_long
    before = hosts()
    del words
    gc.collect()
    assert hosts() == before - 1


def test_fake_a_fault_a_kernel_recorded_is_raised_at_the_next_synchronisation(fake, monkeypatch):
    from nbxcert.errors import LaunchError
    from nbxcert.kernels import faults

    monkeypatch.setattr(faults, "_words", {})
    cuda.use_device(0)
    word = faults.word("cuda:0")
    assert word.shape == (4,) and word.dtype.name == "int64" and word.device.type == "cuda"
    owner = faults._words[word.device][0]
    cuda.synchronize()  # nothing recorded: nothing raised
    owner.host[:] = [faults.EMBEDDING_ID, 5, 32000, 32000]  # as the kernel writes it through its device pointer
    with pytest.raises(LaunchError) as info:
        cuda.synchronize()
    assert str(info.value).startswith(
        "embedding: id 32000 at index 5 is outside the table of 32000 rows (found by the kernel on cuda:0, reported "
        "at the first synchronisation after the launch; that row of its output is zeros)"
    )
    assert list(owner.host) == [0, 0, 0, 0]
    cuda.synchronize()  # reported once
    del word, owner
    faults._words.clear()  # freed while the fake is still the driver
    gc.collect()


def test_fake_out_of_memory_names_the_size_and_does_not_poison(fake):
    cuda.use_device(0)
    with pytest.raises(CudaError) as info:
        cuda.mem_alloc(1 << 41, 0)
    assert str(info.value) == "cuMemAlloc_v2 (2199023255552 bytes on device 0) failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
    assert not cuda.launch_error_poisons_context(info.value)
    assert cuda.context_poisoned() is None


def test_fake_error_name_falls_back_to_the_table(fake):
    cuda.use_device(0)
    with pytest.raises(CudaError, match=r"CUDA_ERROR_INVALID_DEVICE \(101\)$"):
        cuda.check(101, "cuDeviceGet")  # the fake's cuGetErrorName does not know 101


def test_fake_sticky_error_poisons_and_finalizers_stand_down(fake):
    cuda.use_device(0)
    leaked = cuda.mem_alloc(16, 0)
    fake.fake_set_sticky(700)
    with pytest.raises(CudaError) as info:
        cuda.synchronize()
    assert str(info.value) == "cuCtxSynchronize (device 0) failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)"
    assert cuda.launch_error_poisons_context(info.value)
    assert cuda.context_poisoned() == 700
    # A collected allocation in a poisoned process is left to process exit, without a failing cuMemFree.
    del leaked
    gc.collect()
    assert fake.fake_live_allocations() == 1


def test_fake_streams_and_events(fake):
    cuda.use_device(0)
    assert cuda.default_stream() == 0
    stream = cuda.Stream()
    assert stream.handle != 0 and stream.device == 0 and fake.fake_live_streams() == 1
    start, end = cuda.Event(), cuda.Event()
    start.record(stream)
    time.sleep(0.005)
    end.record(stream)
    end.synchronize()
    stream.synchronize()
    assert cuda.Event.elapsed_ms(start, end) >= 4.0
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_HANDLE"):
        cuda.Event.elapsed_ms(start, cuda.Event())  # never recorded
    stream.destroy()
    del start, end
    gc.collect()
    assert fake.fake_live_streams() == 0 and fake.fake_live_events() == 0


def _fresh_triton_cuda(monkeypatch):
    from nbxcert.kernels.backends import triton_cuda

    monkeypatch.setattr(triton_cuda, "_tls", threading.local())
    monkeypatch.setattr(triton_cuda, "_driver", None)
    return triton_cuda


def test_fake_stream_selection_and_driver_queries(fake, monkeypatch):
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    cuda.use_device(0)
    driver = triton_cuda.NbxcertCudaDriver.__new__(triton_cuda.NbxcertCudaDriver)
    assert driver.get_current_device() == 0
    assert driver.get_device_capability(0) == (9, 0)
    target = driver.get_current_target()
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 90, 32)
    assert driver.get_current_stream(0) == 0
    stream = cuda.Stream()
    with triton_cuda.using_stream(stream) as handle:
        assert handle == stream.handle == driver.get_current_stream(0)
    assert driver.get_current_stream(0) == 0
    driver.set_current_device(1)
    assert driver.get_current_device() == 1 == cuda.current_device()


def test_fake_scratch_allocator_aligns_reuses_and_grows(fake, monkeypatch):
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    cuda.use_device(0)
    allocator = triton_cuda.ScratchAllocator()
    first = allocator(1000, 128, 0)
    again = allocator(500, 128, 0)
    assert first.data_ptr() % 128 == 0 and again.data_ptr() == first.data_ptr()
    assert fake.fake_live_allocations() == 1
    strict = allocator(1000, 4096, 0)  # stricter than cuMemAlloc's alignment: slack is allocated
    assert strict.data_ptr() % 4096 == 0
    assert strict.data_ptr() + 1000 <= strict._allocation.ptr + strict._allocation.nbytes
    # The outgrown buffer is kept, not freed: a launch queued earlier (maybe by another thread) may still use it.
    assert not first._allocation.freed and fake.fake_live_allocations() == 2
    assert allocator(3000, 128, 0)._allocation is strict._allocation  # large enough now: reused
    other_stream = allocator(10, 16, 12345)  # another stream never shares a buffer
    assert other_stream._allocation is not strict._allocation
    zeroing = triton_cuda.ScratchAllocator(zero=True)
    buf = zeroing(64, 16, 0)
    cuda.memset_d8(buf.data_ptr(), 0xFF, 64)
    buf = zeroing(64, 16, 0)
    out = np.ones(64, np.uint8)
    cuda.memcpy_dtoh(out, buf.data_ptr(), 64)
    assert not out.any()


def test_fake_do_bench_events_times_each_repetition(fake, monkeypatch):
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    cuda.use_device(0)
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.0005)

    times = triton_cuda.time_events(fn, warmup_ms=1.0, rep_ms=5.0, flush_bytes=4096, gated=False).times_ms
    assert 1 <= len(times) <= 10
    assert all(t > 0.3 for t in times)  # ungated, the fake's events time the host
    assert len(calls) >= 1 + 5 + 1 + len(times)
    monkeypatch.setattr(triton_cuda, "MAX_REPETITIONS", 20)  # gated, the fake device's 0 ms would ask for the cap
    summary = triton_cuda.triton_benchmarker(fn, quantiles=(0.5, 0.2, 0.8), warmup=1, rep=3)
    assert len(summary) == 3 and summary[1] <= summary[0] <= summary[2]
    assert triton_cuda.triton_benchmarker(fn, warmup=1, rep=2, return_mode="min") >= 0  # gated: the fake's 0
    with pytest.raises(ValueError, match="return_mode"):
        triton_cuda.triton_benchmarker(fn, return_mode="p99")
    flush = triton_cuda.FlushBuffer(10)
    assert flush.nbytes == 12 and flush.zero_() is flush


def test_fake_gated_timing_leaves_the_hosts_launch_out(fake, monkeypatch):
    """The defect seen on an H200: with each repetition queued as flush, start, fn, end, a GPU that
    is faster than the host reaches the start event before fn is queued, and the pair times the host. On the fake,
    events are host-clock stamps, so a fn that costs the host 0.5 ms and the device nothing is that ungated, and
    nothing once its repetitions wait behind the gate and run together."""
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    cuda.use_device(0)

    def fn():
        time.sleep(0.0005)

    ungated = triton_cuda.time_events(fn, warmup_ms=1.0, rep_ms=5.0, flush_bytes=4096, gated=False)
    assert not ungated.gated and min(ungated.times_ms) > 0.3
    gated = triton_cuda.time_events(fn, warmup_ms=1.0, rep_ms=5.0, flush_bytes=4096, max_repetitions=100)
    assert gated.gated
    assert max(gated.times_ms) < 0.1 and len(gated.times_ms) == 100  # estimate ~0: the cap decides
    assert fake.fake_held() == 0


def test_fake_gated_timing_of_a_launch_that_waits_for_the_device(fake, monkeypatch):
    """A fn that waits for the device (a host read) would wait for itself behind a held gate: the waiting call raises
    `GateHeld` at once, the gate opens, and fn is timed ungated, said by `gated` False; never a hang."""
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    cuda.use_device(0)
    buf = cuda.mem_alloc(64, 0)
    host = np.empty(64, np.uint8)

    def reads_back():
        cuda.memcpy_dtoh(host, buf.ptr, 64)

    t0 = time.perf_counter()
    timed = triton_cuda.time_events(reads_back, warmup_ms=1.0, rep_ms=2.0, flush_bytes=4096)
    assert not timed.gated and timed.times_ms
    assert time.perf_counter() - t0 < triton_cuda.GATE_LIMIT_S  # refused at once, not freed by the time limit
    assert fake.fake_held() == 0
    gate = cuda.StreamGate(0)
    stream = triton_cuda.current_stream(0)
    with gate.holding(stream, 5.0):
        with pytest.raises(cuda.GateHeld, match="cuCtxSynchronize waits for the device"):
            cuda.synchronize()
        with pytest.raises(RuntimeError, match="already held"):
            gate.hold(stream)
    assert not gate.shut and not gate.forced
    cuda.synchronize()  # after the gate: waits as always


def test_fake_gated_timing_frees_memory_dropped_inside_a_batch(fake, monkeypatch):
    """cuMemFree and cuMemFreeHost wait for the device: memory collected while a gate is held is freed when it opens
    (not leaked), and the timing stays gated."""
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    cuda.use_device(0)
    # a first timing makes the thread's flush buffer, kept for the timings after it (one allocation, not one each)
    triton_cuda.time_events(lambda: None, warmup_ms=0.5, rep_ms=1.0, flush_bytes=4096, max_repetitions=5)
    before = fake.fake_live_allocations()

    def allocates():
        cuda.mem_alloc(256, 0)  # dropped at once

    timed = triton_cuda.time_events(allocates, warmup_ms=0.5, rep_ms=1.0, flush_bytes=4096, max_repetitions=50)
    assert timed.gated
    gc.collect()
    assert fake.fake_live_allocations() == before
    fake.fake_live_host_allocations.restype = ctypes.c_long
    hosts = fake.fake_live_host_allocations()
    gate = cuda.StreamGate(0)
    with gate.holding(triton_cuda.current_stream(0), 5.0):
        cuda.StreamGate(0)  # its pinned word, collected inside the gate: freed when the gate opens, not leaked
        gc.collect()
        assert fake.fake_live_host_allocations() == hosts + 2
    assert fake.fake_live_host_allocations() == hosts + 1


def test_fake_gate_holds_start_one_watchdog_not_a_thread_each(fake, monkeypatch):
    """Each hold arms the gate's one watchdog thread (started with its first hold) instead of starting a timer thread:
    the holding thread waited for each timer's start-up, milliseconds a hold on a host busy compiling, three holds
    per screened candidate."""
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    cuda.use_device(0)
    gate = cuda.StreamGate(0)
    started = []
    start = threading.Thread.start

    def counted(self):
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(50):
        with gate.holding(triton_cuda.current_stream(0), 5.0):
            pass
    assert started == ["nbxcert-gate-watchdog"]
    assert not gate.shut and not gate.forced


def test_fake_gate_opened_by_its_time_limit(fake, monkeypatch):
    """A host too slow to queue a batch within GATE_LIMIT_S: the gate is opened from another thread, and the timing
    is taken again ungated, said by `gated` False."""
    triton_cuda = _fresh_triton_cuda(monkeypatch)
    monkeypatch.setattr(triton_cuda, "GATE_LIMIT_S", 0.005)
    cuda.use_device(0)

    def slow():
        time.sleep(0.004)

    timed = triton_cuda.time_events(slow, warmup_ms=1.0, rep_ms=10.0, flush_bytes=4096)
    assert not timed.gated and min(timed.times_ms) > 2.0
    assert fake.fake_held() == 0
    assert triton_cuda.flush_bytes_for(0) == triton_cuda.DEFAULT_FLUSH_BYTES  # 2 x the fake's 50 MB L2 is less


def test_fake_install_sets_driver_and_allocator_once(fake, monkeypatch):
    import triton
    from triton.runtime import _allocation

    triton_cuda = _fresh_triton_cuda(monkeypatch)
    monkeypatch.setattr(triton_cuda, "CudaUtils", lambda: "utils stand-in")  # the real one compiles against libcuda
    monkeypatch.setattr(triton.runtime.driver, "_active", triton.runtime.driver._active)

    def install_twice():
        first = triton_cuda.install(0)
        assert triton_cuda.install() is first is triton.runtime.driver.active is triton_cuda.installed()
        assert first.utils == "utils stand-in"
        assert _allocation._allocator.get() is triton_cuda._scratch_allocator
        return first

    # In a copied context, so that Triton's allocator ContextVar is untouched for the rest of the test run.
    driver = contextvars.copy_context().run(install_twice)
    assert isinstance(driver, triton_cuda.NbxcertCudaDriver)

    # A thread that never called install() gets the allocator on its first launch (get_current_device).
    seen = []

    def worker():
        def launch_path():
            driver.get_current_device()
            seen.append(_allocation._allocator.get())

        contextvars.copy_context().run(launch_path)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [triton_cuda._scratch_allocator]


# --- on a real GPU ----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_device_info_is_sane(gpu):
    count = cuda.device_count()
    assert count >= 1
    assert cuda.driver_version() >= (12, 0)
    info = cuda.device_info(0)
    assert info.name and info.compute_capability >= (7, 0)
    assert info.compute_capability == cuda.compute_capability(0)
    assert info.total_memory > 1 << 30
    assert re.fullmatch(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]", info.pci_bus_id)
    a = info.attributes
    assert a["warp_size"] == 32
    assert a["multiprocessor_count"] > 0 and a["l2_cache_size"] > 0
    assert a["max_shared_memory_per_block_optin"] >= a["max_shared_memory_per_block"] >= 48 * 1024
    assert a["max_registers_per_multiprocessor"] >= a["max_registers_per_block"] >= 32 * 1024
    assert a["max_threads_per_block"] == 1024
    assert a["global_memory_bus_width"] > 0
    with pytest.raises(DeviceNotFound):
        cuda.device_info(count)


@pytest.mark.gpu
def test_gpu_error_names_from_the_driver_agree_with_the_table(gpu):
    cuda.use_device(0)
    for code, name in cuda.ERROR_NAMES.items():
        assert cuda._error_name(code) == name


@pytest.mark.gpu
def test_gpu_use_device_is_stable_across_threads(gpu):
    ctx = cuda.use_device(0)
    handles = []
    threads = [threading.Thread(target=lambda: handles.append(cuda.use_device(0))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert handles == [ctx] * 8 and cuda.current_device() == 0


@pytest.mark.gpu
def test_gpu_round_trip_of_random_bytes(gpu):
    cuda.use_device(0)
    data = np.random.default_rng(7).integers(0, 256, size=(1 << 20) + 13, dtype=np.uint8)
    a, b = cuda.mem_alloc(data.nbytes, 0), cuda.mem_alloc(data.nbytes, 0)
    assert a.ptr % cuda.ALLOCATION_ALIGNMENT == 0
    cuda.memset_d8(b.ptr, 0x5A, data.nbytes)  # poison the destination first
    cuda.memcpy_htod(a.ptr, data, data.nbytes)
    cuda.memcpy_dtod(b.ptr, a.ptr, data.nbytes)
    out = np.zeros_like(data)
    cuda.memcpy_dtoh(out, b.ptr, data.nbytes)
    np.testing.assert_array_equal(out, data)
    free_before, total = cuda.mem_get_info(0)
    assert 0 < free_before <= total <= cuda.device_info(0).total_memory
    a.free()
    a.free()
    assert a.ptr == 0


@pytest.mark.gpu
def test_gpu_memset(gpu):
    cuda.use_device(0)
    buf = cuda.mem_alloc(4096, 0)
    cuda.memset_d8(buf.ptr, 0xA5, 4096)
    out = np.zeros(4096, np.uint8)
    cuda.memcpy_dtoh(out, buf.ptr, 4096)
    assert (out == 0xA5).all()
    cuda.memset_d32(buf.ptr + 4, 0xDEADBEEF, 1000)
    words = np.zeros(1024, np.uint32)
    cuda.memcpy_dtoh(words, buf.ptr, 4096)
    assert words[0] == 0xA5A5A5A5 and (words[1:1001] == 0xDEADBEEF).all() and (words[1001:] == 0xA5A5A5A5).all()


@pytest.mark.gpu
def test_gpu_events_time_work_on_a_stream(gpu):
    cuda.use_device(0)
    stream = cuda.Stream()
    buf = cuda.mem_alloc(256 << 20, 0)
    start, end = cuda.Event(), cuda.Event()
    start.record(stream)
    for _ in range(4):
        cuda.memset_d32_async(buf.ptr, 0x12345678, (256 << 20) // 4, stream)
    end.record(stream)
    end.synchronize()
    elapsed = cuda.Event.elapsed_ms(start, end)
    assert 0 < elapsed < 10_000
    stream.synchronize()
    probe = np.zeros(4, np.uint32)
    cuda.memcpy_dtoh(probe, buf.ptr + (128 << 20), 16)
    assert (probe == 0x12345678).all()


@pytest.mark.gpu
def test_gpu_no_torch_fp16_matmul(gpu, tmp_path):
    out = _run_proof(
        tmp_path,
        MATMUL_KERNEL
        + """
C = DeviceArray.poisoned((M, N), FLOAT16)
run_matmul(C)
got = C.numpy().astype(np.float64)
a64, b64 = a.astype(np.float64), b.astype(np.float64)
ref = a64 @ b64
scale = np.abs(a64) @ np.abs(b64)
assert np.isfinite(got).all(), "unwritten (NaN) outputs"
rel = float(np.max(np.abs(got - ref) / scale))
assert rel < 1e-2, rel

# Again on a non-blocking stream: the launch goes there, and the synchronous copy still sees its result.
stream = cuda.Stream()
C2 = DeviceArray.poisoned((M, N), FLOAT16)
with triton_cuda.using_stream(stream):
    run_matmul(C2)
assert np.array_equal(C2.numpy(), C.numpy())

assert "torch" not in sys.modules, "torch was imported"
print("NO_TORCH_MATMUL_OK", triton.__version__, rel)
""",
    )
    assert "NO_TORCH_MATMUL_OK" in out


@pytest.mark.gpu
def test_gpu_gated_timing_leaves_the_hosts_launch_out(gpu, tmp_path):
    """A 256^3 matmul (a few microseconds) whose call also costs the host 500 us: ungated, each event pair spans the
    host's 500 us less the L2 flush queued before it (256 MB, under 0.2 ms); behind the stream gate, the repetitions
    run back to back and time the kernel."""
    out = _run_proof(
        tmp_path,
        MATMUL_KERNEL
        + """
import statistics, time
C = DeviceArray.poisoned((M, N), FLOAT16)

def slow_host():
    run_matmul(C)
    time.sleep(0.0005)

ungated = triton_cuda.time_events(slow_host, 1.0, 20.0, gated=False)
gated = triton_cuda.time_events(slow_host, 1.0, 20.0, max_repetitions=200)
kernel = triton_cuda.time_events(lambda: run_matmul(C), 1.0, 20.0, max_repetitions=200)
u, g, k = (statistics.median(t.times_ms) for t in (ungated, gated, kernel))
assert not ungated.gated and gated.gated and kernel.gated
assert u > 0.3, u
assert g < 0.1 and abs(g - k) < 0.02, (g, k)
# a call that reads the device back cannot be queued ahead: refused inside the gate at once, timed ungated, no hang
host = np.empty((M, N), np.float16)
t0 = time.perf_counter()
reading = triton_cuda.time_events(lambda: (run_matmul(C), cuda.memcpy_dtoh(host, C.data_ptr(), host.nbytes)), 1.0, 5.0)
assert not reading.gated and reading.times_ms and time.perf_counter() - t0 < triton_cuda.GATE_LIMIT_S, reading.gated
assert "torch" not in sys.modules, "torch was imported"
print("GATED_TIMING_OK", u, g, k)
""",
    )
    assert "GATED_TIMING_OK" in out


@pytest.mark.gpu
def test_gpu_device_side_tensor_descriptors_get_scratch_from_nbxcert(gpu, tmp_path):
    if cuda.compute_capability(0) < (9, 0):
        pytest.skip("device-side TMA descriptors need Hopper (sm_90) or newer")
    out = _run_proof(
        tmp_path,
        """
@triton.jit
def add_one_tma(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # x, y: fp32 (M, N) row-major; descriptors made on the device need Triton's global scratch (the allocator)
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    m, n = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    y_desc.store([m, n], x_desc.load([m, n]) + 1.0)


requests = []


def counting_allocator(size, alignment, stream):
    requests.append((size, alignment, stream))
    return triton_cuda._scratch_allocator(size, alignment, stream)


triton.set_allocator(counting_allocator)
M = N = 256
x = np.random.default_rng(3).standard_normal((M, N)).astype(np.float32)
X, Y = DeviceArray(x, FLOAT32), DeviceArray.poisoned((M, N), FLOAT32)
add_one_tma[(M // 64, N // 64)](X, Y, M, N, BLOCK_M=64, BLOCK_N=64)
np.testing.assert_array_equal(Y.numpy(), x + np.float32(1.0))
assert requests, "the kernel asked for no global scratch"
assert "torch" not in sys.modules, "torch was imported"
print("TMA_SCRATCH_OK", requests[0])
""",
    )
    assert "TMA_SCRATCH_OK" in out


@pytest.mark.gpu
def test_gpu_benchmark_and_autotune_without_torch(gpu, tmp_path):
    out = _run_proof(
        tmp_path,
        MATMUL_KERNEL
        + """
C = DeviceArray.poisoned((M, N), FLOAT16)
times = triton_cuda.do_bench_events(lambda: run_matmul(C), warmup_ms=5, rep_ms=20)
assert times and all(0 < t < 1000 for t in times), times
median, low, high = driver.get_benchmarker()(lambda: run_matmul(C), quantiles=(0.5, 0.2, 0.8), warmup=5, rep=20)
assert 0 < low <= median <= high

# Triton's own do_bench needs torch's device interface: refused with nbxcert's typed error, not an ImportError.
import triton.testing

try:
    triton.testing.do_bench(lambda: run_matmul(C))
except NotImplementedError as e:
    assert "no torch device" in str(e), e
else:
    raise AssertionError("triton.testing.do_bench ran without torch")


# Triton's autotuner benchmarks through driver.get_benchmarker().
@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 512})], key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


n = 1 << 16
x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
X, Y = DeviceArray(x, FLOAT32), DeviceArray.poisoned((n,), FLOAT32)
scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](X, Y, n)
assert scale_kernel.best_config is not None
np.testing.assert_array_equal(Y.numpy(), x * np.float32(2.0))
assert "torch" not in sys.modules, "torch was imported"
print("BENCH_OK", median, scale_kernel.best_config)
""",
    )
    assert "BENCH_OK" in out


def test_the_cuda_drivers_launcher_queues_nothing_while_compiling_only():
    """Compile workers fill Triton's cache by launching inside `compiling_only()`: the CUDA driver's own launcher
    class returns before Triton's launch there (no function of Triton's is replaced), and runs Triton's launch
    elsewhere (here on an uninitialised launcher with no GPU driver, where Triton's code then fails)."""
    from nbxcert.kernels.backends import triton_cuda

    launcher = triton_cuda.Launcher.__new__(triton_cuda.Launcher)
    args = (1, 1, 1, 0, 0, None, None, None, None)
    with triton_cuda.compiling_only():
        assert launcher(*args) is None
        with triton_cuda.compiling_only():
            pass
        assert launcher(*args) is None  # a nested block leaves the outer one on
    with pytest.raises((AttributeError, RuntimeError)):  # Triton's launch ran
        launcher(*args)
