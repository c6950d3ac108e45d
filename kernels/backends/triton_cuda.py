"""A Triton driver for NVIDIA GPUs that imports no torch, built on nbxcert's libcuda layer (`cuda`).

Triton's stock `CudaDriver` takes its device, stream and capability queries from torch (`GPUDriver.__init__` imports
it; in Triton 3.6 unconditionally), says it is inactive without torch, and benchmarks and flushes L2 with torch tensors
and events. `NbxcertCudaDriver` keeps everything of it that is torch-free (the compiled `CudaUtils` with `load_binary`
and the device properties, the `CudaLauncher`, the target and type mapping) and answers the rest through `cuda`:

    device / capability / current stream    cuda.current_device / cuda.compute_capability / this module's stream
    benchmarker, L2 flush buffer            `do_bench_events` on cuda.Event; a cuda allocation zeroed by a memset
    global scratch (TMA descriptors, ...)   `ScratchAllocator`, installed with `triton.set_allocator`
    torch device / device interface         refused with `TorchDeviceUnavailable`: nbxcert has no torch device
    launcher_cls                            `Launcher`: Triton's `CudaLauncher`, which queues nothing on a thread inside
                                            `compiling_only()` (a certification's compile workers fill Triton's cache)

Beside torch, it is Triton's driver for the whole process, so it answers torch's code as Triton's stock driver would
whenever the process has imported torch (read from `sys.modules`, never imported here): the device interface is
`torch.cuda`, the torch device `torch.device("cuda", i)`, the benchmarker `triton.testing.do_bench` with its torch L2
flush buffer, the current device torch's where this thread has made none current through nbxcert, and the current
stream torch's where none is set through nbxcert (`cuda.current_stream`). A Triton allocator the caller set
(`triton.set_allocator`) is kept. So `triton.testing.do_bench`, kernels under `triton.autotune` and functions built
by `torch.compile` keep working after nbxcert has launched.

`install()` makes it Triton's active driver; it works with Triton 3.6 and 3.9 (their `runtime.driver.set_active`,
`CudaUtils`, `CudaLauncher` and allocator hook are the same for this purpose; 3.9's launcher also asks the driver for
`allocate_default_profile_scratch`, answered here without torch).

Two things are per thread, as in CUDA and Triton themselves: the current context (handled by `cuda`) and Triton's
allocator, which is a `ContextVar`. The driver sets both on the first launch a thread makes, so worker threads need no
setup of their own; `install()` does it at once for the thread that calls it.

Triton itself may still import torch when it is installed (Triton 3.6's argument specializer tries to); nbxcert does
not, and its tests prove a launch with torch made unimportable.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import triton
from triton.backends.nvidia.driver import CudaDriver, CudaLauncher, CudaUtils

from nbxcert.errors import BackendUnavailable
from nbxcert.kernels.backends import cuda

# Triton's own flush size: larger than any L2 so far (H100/H200: 50 MB, B200: 126 MB); `flush_bytes_for` takes twice
# the device's L2 when that is larger still.
DEFAULT_FLUSH_BYTES = 256 * 1024 * 1024
# An upper bound on timed repetitions, so a kernel of a few microseconds cannot ask for hundreds of thousands of events.
MAX_REPETITIONS = 10_000


class TorchDeviceUnavailable(BackendUnavailable, NotImplementedError):
    """Something asked nbxcert's Triton driver for a torch device or torch's device interface.

    Raised by `get_active_torch_device` / `get_device_interface`, which only torch-based callers use (e.g.
    `triton.testing.do_bench`); it is a NotImplementedError too, so code that probes for the feature keeps working.
    """

    default_hint = "use nbxcert's timer (`triton_cuda.do_bench_events`) instead of triton.testing.do_bench"


# --- the stream Triton launches on ------------------------------------------------------------------------------------
_tls = threading.local()  # .ready: driver set up on this thread; .gates: the timer's stream gates

# Per thread and device, kept by `cuda` (tensors are allocated and freed in the order of the same stream): launching
# on a caller's own stream keeps every fast path (the pool's reuse, launch plans).
current_stream = cuda.current_stream
set_stream = cuda.set_stream
using_stream = cuda.using_stream


# --- global scratch ---------------------------------------------------------------------------------------------------
def _align_up(value: int, alignment: int) -> int:
    return value if alignment <= 1 else (value + alignment - 1) // alignment * alignment


class ScratchBuffer:
    """A piece of a scratch allocation handed to one launch; Triton reads only `data_ptr()`."""

    def __init__(self, ptr: int, nbytes: int, allocation: cuda.DeviceAllocation):
        self.ptr = ptr
        self.nbytes = nbytes
        self._allocation = allocation  # keeps the memory alive for as long as Triton holds this

    def data_ptr(self) -> int:
        return self.ptr


class ScratchAllocator:
    """Triton's allocator (`fn(size, alignment, stream) -> object with data_ptr()`), backed by cuda.mem_alloc.

    Kernels that need global scratch (device-side TMA descriptors on Hopper, some reductions) ask for it on every
    launch. One buffer is kept per (device, stream) and reused: launches on one stream run in order, so a later
    launch cannot overwrite scratch an earlier one is still using, and no launch waits on a cuMemFree (which may
    synchronize the device). A buffer too small is replaced by one at least twice its size, and the old one is kept
    (not freed): a launch queued on the stream, possibly from another thread, may still be using it. The doubling
    bounds what is kept to the size of the current buffer. `zero=True` clears the memory for each launch (on the
    stream), as profile scratch must be.
    """

    def __init__(self, zero: bool = False):
        self.zero = zero
        self._lock = threading.Lock()
        self._buffers: dict[tuple[int, int], cuda.DeviceAllocation] = {}
        self._outgrown: list[cuda.DeviceAllocation] = []

    def __call__(self, size: int, alignment: int, stream: int | None) -> ScratchBuffer:
        device = cuda.current_device()
        handle = int(stream or 0)
        alignment = max(int(alignment), 1)
        # cuMemAlloc already aligns to ALLOCATION_ALIGNMENT; only a stricter alignment needs slack.
        need = max(int(size), 1) + (alignment - 1 if alignment > cuda.ALLOCATION_ALIGNMENT else 0)
        with self._lock:
            allocation = self._buffers.get((device, handle))
            if allocation is None or allocation.nbytes < need:
                if allocation is not None:
                    self._outgrown.append(allocation)
                grown = need if allocation is None else max(need, 2 * allocation.nbytes)
                allocation = cuda.mem_alloc(grown, device)
                self._buffers[(device, handle)] = allocation
        ptr = _align_up(allocation.ptr, alignment)
        if self.zero and size:
            cuda.memset_d8_async(ptr, 0, int(size), handle)
        return ScratchBuffer(ptr, int(size), allocation)


# --- benchmarking -----------------------------------------------------------------------------------------------------
def flush_bytes_for(device: int) -> int:
    """How many bytes to overwrite to evict a kernel's inputs from `device`'s L2: 256 MiB, or twice L2 if larger."""
    l2 = cuda.device_info(device).attributes["l2_cache_size"]
    return max(DEFAULT_FLUSH_BYTES, 2 * l2)


class FlushBuffer:
    """A device buffer whose `zero_()` overwrites it on the current stream, flushing L2 between timed runs.

    This is what `get_empty_cache_for_benchmark` returns in place of Triton's torch tensor.
    """

    def __init__(self, nbytes: int, device: int | None = None):
        self.device = cuda.current_device() if device is None else device
        self.nbytes = _align_up(max(int(nbytes), 4), 4)
        self.allocation = cuda.mem_alloc(self.nbytes, self.device)

    def zero_(self) -> FlushBuffer:
        # Queued, not waited for: the host must stay ahead of the GPU so a launch's host cost is not timed.
        cuda.memset_d32_async(self.allocation.ptr, 0, self.nbytes // 4, current_stream(self.device))
        return self

    def data_ptr(self) -> int:
        return self.allocation.ptr


# Repetitions queued behind one hold of the stream gate: each is a flush, two events and the launches of one call
# (a few commands), so a batch stays far below the depth of the driver's launch queue, which would otherwise block the
# host while the stream waits for it.
GATE_BATCH = 32
# The longest the host may take to queue one batch before the gate is opened anyway (from another thread): the host
# then ran so slowly that the batch is timed as if ungated, and the timing says so.
GATE_LIMIT_S = 2.0


@dataclass(frozen=True)
class EventTimes:
    """Each timed repetition's milliseconds, and how they were taken.

    `gated`: every repetition was queued behind a held stream gate (`cuda.StreamGate`) and run back to back once the
    host had queued its batch, so no event pair spans the host's launch. False when `fn` waits for the device itself
    (a host read, a synchronous copy): no queue can run ahead of such a call, so each repetition includes `fn`'s own
    wait and the launch that follows it.
    """

    times_ms: list[float]
    gated: bool


class _HostWaited(Exception):
    """`fn` waited for the device (or queued too slowly) inside a held batch: time it ungated instead."""


def _events(device: int, n: int) -> list[cuda.Event]:
    """`n` timing events of `device`, from this thread's kept ones (made once, recorded again by every timing that
    follows: a timing of 1000 repetitions no longer creates and destroys 2000 driver events)."""
    kept = _tls.__dict__.setdefault("events", {}).setdefault(device, [])
    while len(kept) < n:
        kept.append(cuda.Event(device))
    return kept[:n]


def _flush_buffer(device: int, nbytes: int) -> FlushBuffer:
    """This thread's L2 flush buffer of `nbytes` on `device`, allocated once (the last size asked is kept)."""
    buffers = _tls.__dict__.setdefault("flush", {})
    buffer = buffers.get(device)
    if buffer is None or buffer.nbytes != _align_up(max(int(nbytes), 4), 4):
        buffers[device] = buffer = FlushBuffer(nbytes, device)
    return buffer


def _gate(device: int) -> cuda.StreamGate:
    gates = _tls.__dict__.setdefault("gates", {})
    if device not in gates:
        gates[device] = cuda.StreamGate(device)
    return gates[device]


def time_events(
    fn: Callable[[], object],
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    flush_bytes: int | None = None,
    *,
    max_repetitions: int | None = None,
    gated: bool = True,
) -> EventTimes:
    """Time `fn` (which launches work on the current stream) with CUDA events.

    Triton's `do_bench` scheme without torch: one call to compile and warm up, five to estimate the time per call,
    then about `warmup_ms` of untimed calls and `rep_ms` of timed ones (at least one, at most `max_repetitions`),
    each preceded by an L2 flush of `flush_bytes` (None: `flush_bytes_for(device)`; 0: no flush) queued before the
    start event so it is not timed; `max_repetitions` None: `MAX_REPETITIONS`. Unlike `do_bench`, the estimate and
    the timed repetitions are queued in batches behind a held stream gate and released together, so the GPU never
    reaches a start event before the host has queued the call it times: a kernel shorter than its own launch on the
    host is timed, not its launch. A `fn` that waits for the device cannot be queued ahead; it is timed without the
    gate (`EventTimes.gated` False).
    Exceptions from `fn` propagate.
    """
    device = _thread_ready()
    stream = current_stream(device)
    flush = None
    if flush_bytes is None or flush_bytes > 0:
        flush = _flush_buffer(device, flush_bytes_for(device) if flush_bytes is None else flush_bytes)
    if max_repetitions is None:
        max_repetitions = MAX_REPETITIONS

    fn()
    cuda.stream_synchronize(stream)
    if gated:
        try:
            return EventTimes(_timed(fn, stream, flush, warmup_ms, rep_ms, max_repetitions, _gate(device)), True)
        except _HostWaited:
            cuda.stream_synchronize(stream)
    return EventTimes(_timed(fn, stream, flush, warmup_ms, rep_ms, max_repetitions, None), False)


def _timed(fn, stream, flush, warmup_ms, rep_ms, max_repetitions, gate) -> list[float]:
    device = gate.device if gate is not None else cuda.current_device()

    def repetition(start=None, end=None) -> None:
        if flush is not None:
            flush.zero_()
        if start is not None:
            start.record(stream)
        fn()
        if end is not None:
            end.record(stream)

    def held(queue: Callable[[], None]) -> None:  # queued behind the gate when there is one, then released
        if gate is None:
            queue()
            return
        try:
            with gate.holding(stream, GATE_LIMIT_S):
                queue()
        except cuda.GateHeld as e:
            raise _HostWaited() from e
        if gate.forced:
            raise _HostWaited()

    def estimate_batch() -> None:  # five calls between one pair of events, each call's flush inside it (as Triton)
        start.record(stream)
        for _ in range(5):
            repetition()
        end.record(stream)

    start, end = _events(device, 2)
    held(estimate_batch)
    end.synchronize()
    # A floor of the event resolution (0.5 us), so an empty fn cannot divide by zero.
    estimate_ms = max(cuda.Event.elapsed_ms(start, end) / 5, 0.0005)

    cap = max(1, max_repetitions)
    n_warmup = min(max(1, int(warmup_ms / estimate_ms)), cap)
    n_repeat = min(max(1, int(rep_ms / estimate_ms)), cap)
    for _ in range(n_warmup):
        fn()
    kept = _events(device, 2 + 2 * n_repeat)[2:]
    pairs = list(zip(kept[0::2], kept[1::2], strict=True))
    step = GATE_BATCH if gate is not None else n_repeat

    def queue(batch) -> None:
        for s, e in batch:
            repetition(s, e)

    for i in range(0, n_repeat, step):
        held(lambda batch=pairs[i : i + step]: queue(batch))
    cuda.stream_synchronize(stream)
    return [cuda.Event.elapsed_ms(s, e) for s, e in pairs]


def do_bench_events(fn: Callable[[], object], *args, **kwargs) -> list[float]:
    """`time_events`' repetition times alone (gated wherever `fn` allows it), with its arguments."""
    return time_events(fn, *args, **kwargs).times_ms


def time_quantiles(times: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Linear-interpolated quantiles, as `triton.testing` computes them (no numpy needed)."""
    if not times:
        raise ValueError("no times to take quantiles of")
    ordered = sorted(times)
    out = []
    for q in qs:
        if not 0 <= q <= 1:
            raise ValueError(f"quantile {q} is outside [0, 1]")
        point = q * (len(ordered) - 1)
        lower, upper = math.floor(point), math.ceil(point)
        out.append(ordered[lower] + (point - lower) * (ordered[upper] - ordered[lower]))
    return out


_RETURN_MODES = {
    "min": min,
    "max": max,
    "mean": statistics.mean,
    "median": statistics.median,
}


def triton_benchmarker(
    kernel_call: Callable[[], object],
    *,
    quantiles: Sequence[float] | None = None,
    warmup: float = 25,
    rep: float = 100,
    return_mode: str = "mean",
) -> float | list[float]:
    """`do_bench_events` behind Triton's benchmarker interface (what `get_benchmarker` returns; Triton's autotuner
    calls it with `quantiles=(0.5, 0.2, 0.8)`). Summarises like `triton.testing.do_bench`."""
    if return_mode != "all" and return_mode not in _RETURN_MODES:
        raise ValueError(f"return_mode {return_mode!r} is not one of all, {', '.join(_RETURN_MODES)}")
    times = do_bench_events(kernel_call, warmup_ms=warmup, rep_ms=rep)
    if quantiles is not None:
        values = time_quantiles(times, quantiles)
        return values[0] if len(values) == 1 else values
    if return_mode == "all":
        return times
    return _RETURN_MODES[return_mode](times)


# --- the driver -------------------------------------------------------------------------------------------------------
_scratch_allocator = ScratchAllocator()


def _torch():
    """torch, when this process has imported it (nbxcert never does), else None."""
    return sys.modules.get("torch")


def _set_allocator() -> None:
    """nbxcert's scratch allocator as Triton's for this thread, unless the caller has set one of their own. Triton
    keeps its allocator in a ContextVar: a value set on another thread is not seen here."""
    # no public getter exists for Triton's allocator (only `triton.set_allocator`): its ContextVar is read directly
    from triton.runtime import _allocation

    current = getattr(_allocation, "_allocator", None)
    held = current.get() if current is not None else None
    if held is None or type(held).__name__ == "NullAllocator" or held is _scratch_allocator:
        triton.set_allocator(_scratch_allocator)


def _thread_ready() -> int:
    """Set this thread up on its first launch (context current, Triton's allocator set); return the current device:
    nbxcert's, or torch's where this thread has made none current through nbxcert and torch has initialised CUDA."""
    if not getattr(_tls, "ready", False):
        torch = _torch()
        if cuda.thread_device() is None and torch is not None and torch.cuda.is_initialized():
            cuda.use_device(torch.cuda.current_device())
        else:
            cuda.use_device(cuda.current_device())
        _set_allocator()
        _tls.ready = True
    return cuda.current_device()


class _CompilingOnly(threading.local):
    on = False  # a class default: read with no call


_compiling_only = _CompilingOnly()


@contextlib.contextmanager
def compiling_only() -> Iterator[None]:
    """While the block runs on this thread, `kernel[grid](...)` compiles (and loads) its kernel and queues nothing,
    whoever's launch code makes the call (a kernel family's, or a user's certified spec's). Compile workers use it to
    fill Triton's cache ahead of the checks; the driver's own launcher class honours it, so nothing of Triton's is
    replaced."""
    before = _compiling_only.on
    _compiling_only.on = True
    try:
        yield
    finally:
        _compiling_only.on = before


def compiling_now() -> bool:
    """Whether this thread is inside `compiling_only()`: its launches queue nothing."""
    return bool(_compiling_only.on)


class Launcher(CudaLauncher):
    """Triton's `CudaLauncher`, the launcher Triton makes for each kernel this driver loads; it launches nothing inside
    `compiling_only()`."""

    def __call__(self, *args, **kwargs):
        if _compiling_only.on:
            return None
        return super().__call__(*args, **kwargs)


class NbxcertCudaDriver(CudaDriver):
    """Triton's CUDA driver with every torch dependency answered by nbxcert's `cuda` module (see the module doc)."""

    def __init__(self) -> None:
        # Deliberately not CudaDriver.__init__: through GPUDriver.__init__ it imports torch (Triton 3.6 always, 3.9
        # when torch is loaded) and binds torch's device/stream/capability queries over the methods below.
        self.launcher_cls = Launcher
        self.profile_scratch_allocator = ScratchAllocator(zero=True)
        # Triton's CudaUtils is a C module Triton compiles on its first use in a Triton cache (a C compiler run, about
        # a second): built in the background from here, so a process serving kernels from a bundle (which needs it
        # only to encode TMA descriptors) does not wait for it before its first launch
        self._utils = None
        self._utils_failed: BaseException | None = None
        self._utils_built = threading.Event()
        # Not a daemon: a process that ended while the build ran (a short command on a GPU machine: `nbxcert keys`)
        # removed the build's temporary directory under the compiler, which then failed with linker errors on stderr,
        # and the next process built again. The interpreter's exit waits for a non-daemon thread before anything is
        # torn down (an exit hook ran after the temporary directory's own cleanup), so the build ends once per Triton
        # cache and later processes load the built module.
        threading.Thread(target=self._build_utils, name="nbxcert-triton-utils", daemon=False).start()

    def _build_utils(self) -> None:
        try:
            self._utils = CudaUtils()
        except BaseException as e:  # noqa: BLE001 - kept and raised where the utilities are asked for
            self._utils_failed = e
        finally:
            self._utils_built.set()

    @property
    def utils(self) -> CudaUtils:
        """Triton's compiled CUDA utilities (`load_binary`, device properties, TMA descriptor encoding): waits for
        their build; its failure is raised here, where they are needed."""
        if self._utils is None:
            self._utils_built.wait()
            if self._utils_failed is not None:
                raise self._utils_failed
        return self._utils

    @utils.setter
    def utils(self, value: CudaUtils) -> None:
        self._utils = value
        self._utils_built.set()

    @staticmethod
    def is_active() -> bool:
        return cuda.available()[0]

    def get_current_device(self) -> int:
        return _thread_ready()

    def set_current_device(self, device: int) -> None:
        cuda.use_device(device)

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        return cuda.compute_capability(cuda.current_device() if device is None else device)

    def get_current_stream(self, device: int | None = None) -> int:
        return current_stream(device)

    def get_active_torch_device(self):
        torch = _torch()
        if torch is None:
            raise TorchDeviceUnavailable("nbxcert's driver has no torch device (get_active_torch_device)")
        return torch.device("cuda", self.get_current_device())

    def get_device_interface(self):
        torch = _torch()
        if torch is None:
            raise TorchDeviceUnavailable("nbxcert's driver has no torch device (get_device_interface)")
        return torch.cuda

    def get_benchmarker(self):
        if _torch() is not None:  # what Triton's stock driver gives torch code
            from triton.testing import do_bench

            return do_bench
        return triton_benchmarker

    def get_empty_cache_for_benchmark(self):
        torch = _torch()
        device = cuda.current_device()
        if torch is not None:  # Triton's own flush buffer beside torch: a torch tensor its benchmarker zeroes
            return torch.empty(DEFAULT_FLUSH_BYTES // 4, dtype=torch.int, device=f"cuda:{device}")
        return FlushBuffer(flush_bytes_for(device), device)

    def clear_cache(self, cache: FlushBuffer) -> None:
        cache.zero_()

    def allocate_default_profile_scratch(self, size: int, alignment: int, stream: int | None) -> ScratchBuffer:
        # Triton 3.9 asks the driver for zeroed profile scratch (torch.zeros in the stock driver).
        return self.profile_scratch_allocator(size, alignment, stream)


_install_lock = threading.Lock()
_driver: NbxcertCudaDriver | None = None


def install(device: int | None = None) -> NbxcertCudaDriver:
    """Make `device` (default: cuda.current_device()) current and nbxcert's driver Triton's active one; return it.

    Idempotent and thread-safe: the driver is made once; a repeat call re-asserts it (in case something reset
    Triton's active driver) and sets the allocator for the calling thread.
    """
    global _driver
    cuda.use_device(cuda.current_device() if device is None else device)
    with _install_lock:
        if _driver is None:
            _driver = NbxcertCudaDriver()
        triton.runtime.driver.set_active(_driver)
        driver = _driver
    _set_allocator()
    _tls.ready = True
    return driver


def installed() -> NbxcertCudaDriver | None:
    """The driver `install()` made, or None."""
    return _driver
