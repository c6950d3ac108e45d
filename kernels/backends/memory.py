"""nbxcert's device memory: a stream-ordered pool of its own on each device, with the last blocks freed on a stream
kept for that stream's next allocation of the same size.

A tensor's memory (`pool_alloc`, which `Tensor` storage uses) comes from CUDA's stream-ordered allocator:
`cuMemAllocFromPoolAsync` on the stream the allocation is made on, and `cuMemFreeAsync` on that same stream when the
tensor is freed or dropped. Neither waits for the device, and the pool keeps what is freed (its release threshold:
every byte, unless NBXCERT_MEMORY_RELEASE_THRESHOLD says fewer), so after the first call of a shape no allocation
reaches the driver's physical allocator: a freed block is reused in its stream's order. The pool is nbxcert's own,
not the device's default pool, so another library's allocations (torch's caching allocator, CuPy's pools) and their
release settings are untouched.

Above the pool, the last `KEPT_PER_SIZE` blocks freed on a stream are kept for the next allocation of the same size
on that stream (stream order makes that reuse safe as it makes the pool's: the block's last use is queued on the
stream before its next one), because a served call allocates its outputs on every call and the pool's two driver
calls cost several microseconds of host time each: benchmarks/bench_alloc.py measures both paths (benchmarks/README.md).
At most `KEPT_SIZES` sizes are kept, the least recently used given back to the pool.

A served call replayed in C (nbxcert's launcher, `Served` and `Block` in launcher.c) takes and keeps its outputs'
blocks the same way in C, with no Python call: the launcher keeps up to `KEPT_PER_SIZE` blocks per (device, stream,
size) for 32 sizes, asks `pool_block` when it has none, hands a free to `pool_free` when it keeps no more, and gives
its blocks back through `release_kept`; once bound (`bind_launcher`) it counts every block's figures, this module's
included (`figures`).

Out of memory: the kept blocks are given back, the pool's memory released (after the device has finished the frees
queued so far) and the allocation tried once more; a second failure is `DeviceOutOfMemory`, naming the bytes asked
for, held and free. `memory_stats` gives allocated, reserved and peak bytes under torch.cuda.memory_stats' names.
"""

from __future__ import annotations

import collections
import ctypes
import os
import sys
import threading
from typing import Any

from nbxcert.errors import BackendUnavailable
from nbxcert.kernels.backends import cuda, launcher

CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115
CU_MEM_ALLOCATION_TYPE_PINNED = 1  # CUmemAllocationType: device memory that is not migratable
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4  # cuuint64_t: bytes the pool keeps reserved across synchronisations
CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5
CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6
CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7
CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8
KEEP_EVERYTHING = (1 << 64) - 1  # the release threshold that keeps every freed byte in the pool


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemPoolProps(ctypes.Structure):
    """CUmemPoolProps (cuda.h, CUDA 12.x/13.x: 88 bytes; fields after `location` are zero for a plain device pool)."""

    _fields_ = [
        ("allocType", ctypes.c_int),
        ("handleTypes", ctypes.c_int),
        ("location", _MemLocation),
        ("win32SecurityAttributes", ctypes.c_void_p),
        ("maxSize", ctypes.c_size_t),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 54),
    ]


def release_threshold() -> int:
    """The bytes each pool keeps reserved when the device synchronises: NBXCERT_MEMORY_RELEASE_THRESHOLD (a whole
    number of bytes), else every byte (memory goes back only on out-of-memory or `empty_cache`)."""
    from nbxcert.errors import UsageError

    text = os.environ.get("NBXCERT_MEMORY_RELEASE_THRESHOLD", "").strip()
    if not text:
        return KEEP_EVERYTHING
    if not text.isdigit():
        raise UsageError(f"NBXCERT_MEMORY_RELEASE_THRESHOLD={text} is not a whole number of bytes")
    return min(int(text), KEEP_EVERYTHING)


class _PoolStats:
    """What nbxcert's allocations hold on one device (bytes as asked for), counted under a lock: a free comes from a
    finalizer that may run on any thread."""

    __slots__ = ("allocated", "peak", "count", "allocations", "frees", "retries", "ooms")

    def __init__(self) -> None:
        self.allocated = self.peak = self.count = self.allocations = self.frees = self.retries = self.ooms = 0


_pool_lock = threading.Lock()
_pools: dict[int, int] = {}  # device -> CUmemoryPool
_stats: dict[int, _PoolStats] = {}
# nbxcert's launcher's `count(device, size, taken)` once `bind_launcher` ran: from then on the launcher holds the
# figures of blocks taken and freed (allocated, peak, count, allocations, frees), counted in C, where a served call's
# replay counts its own blocks with no Python call; until then they are `_stats`' under `_pool_lock`
_counted: Any = None
_driver: Any = None  # the loaded driver (`cuda.driver()`), bound when the first pool is made
_driver_pid = -1  # the process that bound it


def kept_per_size() -> int:
    """The blocks of one size kept for one stream's next allocations: NBXCERT_MEMORY_KEPT_PER_SIZE (a whole number;
    0: every free goes to the pool), else 2. A process that allocates each size once, as a sweep's compile workers do
    (a key's shape-only inputs, then the next key's), keeps none, so what it frees is reused rather than held."""
    from nbxcert.errors import UsageError

    text = os.environ.get("NBXCERT_MEMORY_KEPT_PER_SIZE", "").strip()
    if not text:
        return 2
    if not text.isdigit():
        raise UsageError(f"NBXCERT_MEMORY_KEPT_PER_SIZE={text} is not a whole number of blocks")
    return int(text)


KEPT_PER_SIZE = kept_per_size()  # blocks of one size kept for one stream's next allocations
KEPT_SIZES = 64  # (device, stream, size) keys kept at most; the least recently used is given back to the pool
# (device, stream, size) -> [(ptr, the Stream object or None), ...], in the order of last use
_kept: collections.OrderedDict[tuple[int, int, int], list] = collections.OrderedDict()
_last_kept: list = [None]  # the list of the key used last (already at the end of _kept: a free of it moves nothing)
# the graph capture in progress (`graphs.Capture`), or None: its thread's allocations on the capture stream come from
# the graph's pool, and every free on its device meanwhile is held until the graph is gone
capturing: Any = None


def _bind_driver() -> None:
    global _driver, _driver_pid
    _driver, _driver_pid = cuda.driver(), cuda.process_id()


def _pool(device: int) -> int:
    """The device's pool, made on first use with the release threshold set; `BackendUnavailable` where the device has
    no stream-ordered allocator (a fact of the device, said by name)."""
    pool = _pools.get(device)
    if pool is not None:
        return pool
    return cuda.made_once(_pools, _pool_lock, device, _new_pool)


def _new_pool(device: int) -> int:
    if not cuda.device_attribute(device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED):
        raise BackendUnavailable(
            f"CUDA device {device} does not support stream-ordered memory pools "
            "(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0)",
            hint="nbxcert needs a driver and device with cuMemAllocAsync (CUDA 11.2+, not every vGPU mode)",
        )
    props = _MemPoolProps()
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = device
    made = ctypes.c_void_p()
    with cuda.in_context(device):
        cuda.call("cuMemPoolCreate", ctypes.byref(made), ctypes.byref(props), what=f"device {device}")
        threshold = ctypes.c_uint64(release_threshold())
        cuda.call(
            "cuMemPoolSetAttribute",
            made,
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            ctypes.byref(threshold),
            what=f"release threshold, device {device}",
        )
    _bind_driver()
    _stats.setdefault(device, _PoolStats())
    return made.value or 0


def _pool_attribute(device: int, attribute: int) -> int:
    pool = _pools.get(device)
    if pool is None:
        return 0
    value = ctypes.c_uint64()
    with cuda.in_context(device):
        cuda.call("cuMemPoolGetAttribute", pool, attribute, ctypes.byref(value), what=f"device {device}")
    return value.value


class Block:
    """What a tensor's storage reads of its device memory, whatever holds it (`PoolBlock`, a graph's `GraphBlock`):
    `ptr` (0 once freed) as an int."""

    __slots__ = ()

    @property
    def freed(self) -> bool:
        return not self.ptr

    def data_ptr(self) -> int:
        return self.ptr

    def __int__(self) -> int:
        return self.ptr

    __index__ = __int__


class PoolBlock(Block):
    """Device memory from nbxcert's pool (`pool_alloc`): given back with `cuMemFreeAsync` on the stream it was made
    on, by `free()` (idempotent) or when the object is dropped. After `free()`, `ptr` reads 0.

    A slotted object with `__del__` rather than a `weakref.finalize` (which costs several times more, and a served
    call makes one per output). `keep` holds the `Stream` object of that stream, so the stream outlives its memory."""

    __slots__ = ("ptr", "nbytes", "device", "stream", "keep", "pid")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: int, keep: Any = None):
        self.ptr, self.nbytes, self.device, self.stream, self.keep = ptr, nbytes, device, stream, keep
        self.pid = cuda.process_id()

    def free(self) -> None:
        ptr = self.ptr
        if ptr:
            self.ptr, keep, self.keep = 0, self.keep, None
            pool_free(ptr, self.device, self.nbytes, self.pid, self.stream, keep)

    def __del__(self) -> None:
        ptr = self.ptr
        if ptr and pool_free is not None:  # None: the module is being torn down at exit (the driver frees all)
            self.ptr, keep, self.keep = 0, self.keep, None
            pool_free(ptr, self.device, self.nbytes, self.pid, self.stream, keep)

    def __repr__(self) -> str:
        state = "freed" if not self.ptr else f"ptr=0x{self.ptr:x}"
        return f"PoolBlock({state}, nbytes={self.nbytes}, device={self.device}, stream=0x{self.stream:x})"


def pool_free(ptr: int, device: int, nbytes: int, pid: int, stream: int, keep: Any = None) -> None:
    """Keep a freed block for its stream's next allocation of the same size, or give it back to the pool on that
    stream (queued: nothing waits)."""
    if not cuda.owned_here(pid):  # a forked child's copy, or a poisoned context: left to process exit
        return
    if capturing is not None and capturing.hold_block(ptr, device, nbytes, pid, stream, keep):
        return
    stats = _stats.get(device) or _stats.setdefault(device, _PoolStats())
    evicted = None
    key = (device, stream, nbytes)
    with _pool_lock:
        _count(stats, device, nbytes, False)
        if KEPT_PER_SIZE:
            kept = _kept.get(key)
            if kept is None:
                kept = _kept[key] = []
                if len(_kept) > KEPT_SIZES:
                    evicted = _kept.popitem(last=False)
            elif kept is not _last_kept[0]:  # the size freed last is already the most recent: no reordering
                _kept.move_to_end(key)
            _last_kept[0] = kept
            if len(kept) < KEPT_PER_SIZE:
                kept.append((ptr, keep))
                ptr = 0
    if evicted is not None:
        (ev_device, ev_stream, ev_size), blocks = evicted
        for ev_ptr, _ in blocks:
            _give_back(ev_ptr, ev_device, ev_stream, ev_size)
    if ptr:
        _give_back(ptr, device, stream, nbytes)


def _give_back(ptr: int, device: int, stream: int, nbytes: int) -> None:
    """`cuMemFreeAsync` of one block on its stream."""
    if cuda.thread_device() == device:
        status = _driver.cuMemFreeAsync(ptr, stream)
    else:
        with cuda.in_context(device):
            status = _driver.cuMemFreeAsync(ptr, stream)
    if status:
        cuda.raise_failed("cuMemFreeAsync", status, f"{nbytes} bytes on device {device}")


def pool_alloc(nbytes: int, device: int) -> PoolBlock:
    """`nbytes` (> 0) of device memory on `device` from nbxcert's pool, ordered on this thread's current stream for
    the device (`current_stream`) and freed on it (see above). Out of memory: the pool's kept memory is released and
    the allocation tried once more, then `DeviceOutOfMemory`. The driver is called directly (no `_call`): this is
    every served call's output."""
    return pool_block(max(cuda.check_size(nbytes, "pool_alloc"), 1), device)


def pool_block(size: int, device: int) -> PoolBlock:
    """`pool_alloc` for a size already checked (an int > 0): a launch plan's replay making its outputs."""
    pool = _pools.get(device) or _pool(device)
    stream, keep = cuda.current_stream_object(device)
    if capturing is not None:
        block = capturing.block(size, device, stream)
        if block is not None:
            return block
    kept = _kept.get((device, stream, size))
    if kept:
        with _pool_lock:
            if kept:
                ptr, keep = kept.pop()
                _count(_stats[device], device, size, True)
                return PoolBlock(ptr, size, device, stream, keep)
    if _driver_pid != cuda.process_id():
        cuda.driver()  # refuses a forked child by name
    out = cuda.CUdeviceptr()
    status = _driver.cuMemAllocFromPoolAsync(ctypes.byref(out), size, pool, stream)
    if status:
        if status != cuda.CUDA_ERROR_OUT_OF_MEMORY:
            cuda.raise_failed("cuMemAllocFromPoolAsync", status, f"{size} bytes on device {device}")
        _out_of_memory_retry(out, size, pool, stream, device)
    with _pool_lock:
        _count(_stats[device], device, size, True)
    return PoolBlock(out.value, size, device, stream, keep)


def _count(stats: _PoolStats, device: int, size: int, taken: bool) -> None:
    """One block of `size` taken (`taken`) or freed on `device`, counted; call it holding `_pool_lock`."""
    if _counted is not None:
        _counted(device, size, taken)
    elif taken:
        stats.allocated += size
        stats.count += 1
        stats.allocations += 1
        if stats.allocated > stats.peak:
            stats.peak = stats.allocated
    else:
        stats.allocated -= size
        stats.count -= 1
        stats.frees += 1


def figures(device: int) -> dict[str, int]:
    """The counted figures of `device`'s blocks: allocated bytes now and at peak, live blocks, blocks taken and freed,
    out-of-memory retries and failures (`memory_stats` adds what the pool reserves)."""
    stats = _stats.get(device) or _PoolStats()
    with _pool_lock:
        held = (stats.allocated, stats.peak, stats.count, stats.allocations, stats.frees)
        if _counted is not None:
            held = launcher.loaded().figures(device)
        allocated, peak, count, allocations, frees = held
        return {
            "allocated": allocated,
            "peak": peak,
            "count": count,
            "allocations": allocations,
            "frees": frees,
            "retries": stats.retries,
            "ooms": stats.ooms,
        }


def _out_of_memory_retry(ptr, size: int, pool: int, stream: int, device: int) -> None:
    """Release the pool's kept memory (once the frees queued so far have run) and try once more; else raise
    `DeviceOutOfMemory` with what is held and free."""
    from nbxcert.errors import DeviceOutOfMemory

    stats = _stats[device]
    with _pool_lock:
        stats.retries += 1
    empty_cache(device)
    status = _driver.cuMemAllocFromPoolAsync(ctypes.byref(ptr), size, pool, stream)
    if status == cuda.CUDA_SUCCESS:
        return
    with _pool_lock:
        stats.ooms += 1
    free, total = cuda.mem_get_info(device)
    reserved = _pool_attribute(device, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    held = figures(device)["allocated"]
    raise DeviceOutOfMemory(
        f"out of memory on cuda:{device}: asked for {size} bytes; nbxcert's tensors hold {held} bytes "
        f"and its pool reserves {reserved}; the device has {free} of {total} bytes free "
        f"(cuMemAllocFromPoolAsync: {cuda.error_name(status)} ({status}))"
    )


def empty_cache(device: int | None = None) -> None:
    """Give the memory nbxcert's pools keep but no tensor holds back to the device (of `device`, or every device),
    after the device has finished the frees queued so far (so they count). As `torch.cuda.empty_cache`. Inside a held
    stream gate the wait is skipped (it would wait for this thread): what is already free is released. The blocks
    kept for streams' next allocations are given back first."""
    release_kept(device)
    for dev, pool in list(_pools.items()):
        if device is not None and dev != device:
            continue
        with cuda.in_context(dev):
            if not cuda.holding_a_gate():
                cuda.call("cuCtxSynchronize", what=f"before releasing pool memory, device {dev}")
            cuda.call("cuMemPoolTrimTo", pool, 0, what=f"device {dev}")


def memory_stats(device: int | None = None) -> dict[str, int]:
    """The allocator's figures for `device` (default: the current one), under torch.cuda.memory_stats' names:
    allocated bytes (what live tensors asked for) now and at peak, reserved bytes (what the pool holds from the
    device, in use or kept) now and at peak, live and total allocation counts, frees, out-of-memory retries and
    failures."""
    device = cuda.current_device() if device is None else device
    counted = figures(device)
    figures_ = {
        "allocated_bytes.all.current": counted["allocated"],
        "allocated_bytes.all.peak": counted["peak"],
        "allocation.all.current": counted["count"],
        "allocation.all.allocated": counted["allocations"],
        "allocation.all.freed": counted["frees"],
        "num_alloc_retries": counted["retries"],
        "num_ooms": counted["ooms"],
    }
    figures_["reserved_bytes.all.current"] = _pool_attribute(device, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    figures_["reserved_bytes.all.peak"] = _pool_attribute(device, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    return dict(sorted(figures_.items()))


def memory_allocated(device: int | None = None) -> int:
    """Bytes nbxcert's live tensors on `device` asked for."""
    return memory_stats(device)["allocated_bytes.all.current"]


def memory_reserved(device: int | None = None) -> int:
    """Bytes nbxcert's pool on `device` holds from the device (in use or kept for reuse)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_allocated(device: int | None = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def reset_peak_memory_stats(device: int | None = None) -> None:
    """Start the peaks afresh from what is held now."""
    device = cuda.current_device() if device is None else device
    stats = _stats.get(device)
    if stats is not None:
        with _pool_lock:
            stats.peak = stats.allocated
            if _counted is not None:
                launcher.loaded().reset_peak(device)
    pool = _pools.get(device)
    if pool is not None:
        zero = ctypes.c_uint64(0)
        with cuda.in_context(device):
            for attribute in (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, CU_MEMPOOL_ATTR_USED_MEM_HIGH):
                cuda.call("cuMemPoolSetAttribute", pool, attribute, ctypes.byref(zero), what=f"device {device}")


def bind_launcher(module: Any, storage_type: type) -> None:
    """Give nbxcert's launcher (`module`, launcher.c) what a served call's replay in C needs to make its memory as this
    module does: this module (it reads `capturing` and `KEPT_PER_SIZE`), the CUDA bindings, the storage type to make,
    the slow paths (`pool_block`, `pool_free`, `_give_back`) and the block type; and the figures counted so far, which
    the launcher counts from then on (`_counted`)."""
    global _counted
    module.setup_memory(sys.modules[__name__], cuda, storage_type, pool_block, pool_free, _give_back, PoolBlock)
    with _pool_lock:  # the figures counted so far move to the launcher, which counts them from now on
        if _counted is None:
            for device, stats in _stats.items():
                module.set_figures(device, stats.allocated, stats.peak, stats.count, stats.allocations, stats.frees)
            _counted = module.count


def release_kept(device: int | None = None) -> int:
    """Give the blocks kept for streams' next allocations (of `device`, or all) back to the pool; returns how many."""
    with _pool_lock:
        keys = [k for k in _kept if device is None or k[0] == device]
        taken = [(k, _kept.pop(k)) for k in keys]
        _last_kept[0] = None
    in_c = launcher.loaded()  # the blocks a served call's replay keeps in nbxcert's launcher (launcher.c)
    if in_c is not None:
        for ptr, dev, stream, size, keep in in_c.drain(-1 if device is None else device):
            taken.append(((dev, stream, size), [(ptr, keep)]))
    n = 0
    for (dev, stream, size), blocks in taken:
        for ptr, _ in blocks:
            _give_back(ptr, dev, stream, size)
            n += 1
    return n
