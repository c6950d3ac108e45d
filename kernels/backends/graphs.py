"""CUDA graphs over nbxcert's driver: work queued on a stream captured into a graph, instantiated once, launched with
one driver call (`nbxcert.graphs` is the user's API over this module).

A capture runs on a stream of its own in the driver's thread-local capture mode (`cuStreamBeginCapture`), so other
threads and other libraries' streams are untouched. While it runs (`Capture`):
- the capturing thread's allocations on the capture stream come from a pool private to the graph (`GraphPool`:
  driver allocations made outside the capture, kept while the graph or a tensor over them lives), and a block freed
  during the capture is reused by the capture's next allocation of the same size (stream order makes that safe);
- every free of other memory on the capture's device (any thread) is held until the graph is gone: the graph may
  read it on every replay;
- what a graph cannot hold is refused by name before it reaches the driver (`refuse`), naming the served op on the
  stack and its caller: a call that waits for the device (a copy to or from the host, a synchronisation, a
  synchronous memset or free), a driver allocation outside the pool, and a launch, copy or memset on another stream.

A launch's kernel is named through Triton's launch-enter hook, set for the capture only (replayed launch plans then
take the full path, which calls it; nothing on the served path pays for it outside a capture).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from typing import Any

from nbxcert.errors import GraphRefused
from nbxcert.kernels.backends import cuda, memory

CU_STREAM_CAPTURE_MODE_GLOBAL = 0
CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1  # only this thread's unsafe calls are refused by the driver meanwhile
CU_STREAM_CAPTURE_MODE_RELAXED = 2
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901

_active_lock = threading.Lock()


# --- the graph's private pool -----------------------------------------------------------------------------------------
class GraphBlock(memory.Block):
    """Device memory from a graph's pool: what a tensor allocated during a capture holds. `free()` (or dropping it)
    gives the block back to the pool for the capture's next allocation of its size while the capture runs; after it,
    the memory stays the graph's (its replays write there) until the pool goes."""

    __slots__ = ("ptr", "nbytes", "device", "stream", "pool")

    def __init__(self, ptr: int, nbytes: int, device: int, stream: int, pool: GraphPool):
        self.ptr, self.nbytes, self.device, self.stream, self.pool = ptr, nbytes, device, stream, pool

    def free(self) -> None:
        ptr, pool = self.ptr, self.pool
        if ptr and pool is not None:
            self.ptr = 0
            pool.give(ptr, self.nbytes)

    __del__ = free

    def __repr__(self) -> str:
        return f"GraphBlock(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, device={self.device})"


def _close_pool(allocations: list, held: list, device: int, pid: int) -> None:
    """When a pool goes (its graph and every tensor over it dropped): wait for the device (a replay may still run),
    give back what the capture held, then free the pool's own memory. Inside another capture on this thread, that
    capture takes both over (a wait cannot be made there)."""
    if not cuda.owned_here(pid) or not (allocations or held):
        return
    capture = cuda.thread_capture()
    if capture is not None:
        capture.pool.held.extend(held)
        capture.pool.held.extend((cuda.release_memory, ("cuMemFree", ptr, device, pid)) for ptr in allocations)
        return
    if not cuda.holding_a_gate():
        with cuda.in_context(device):
            cuda.call("cuCtxSynchronize", what=f"before giving a graph's memory back, device {device}")
    for free, args in held:
        free(*args)
    for ptr in allocations:
        cuda.release_memory("cuMemFree", ptr, device, pid)


class GraphPool:
    """The memory of one graph: one driver allocation per block the capture could not reuse, made with the thread's
    capture mode relaxed for the call (the driver would refuse it otherwise), and the frees the capture held."""

    def __init__(self, device: int):
        self.device = device
        self.allocations: list[int] = []
        self.free_blocks: dict[int, list[int]] = {}
        self.held: list = []  # (free, args) of memory freed during the capture: run when the pool goes
        self.sealed = False  # set when the capture ends: a block given back then is the graph's until the pool goes
        self.nbytes = 0
        self._finalizer = weakref.finalize(self, _close_pool, self.allocations, self.held, device, cuda.process_id())
        self._finalizer.atexit = False

    def take(self, size: int, stream: int) -> GraphBlock:
        free = self.free_blocks.get(size)
        if free:
            return GraphBlock(free.pop(), size, self.device, stream, self)
        lib = cuda.driver()
        mode = ctypes.c_int(CU_STREAM_CAPTURE_MODE_RELAXED)
        cuda.call("cuThreadExchangeStreamCaptureMode", ctypes.byref(mode), what="relaxed, for the graph's pool")
        ptr = cuda.CUdeviceptr()
        try:
            status = lib.cuMemAlloc(ctypes.byref(ptr), size)
        finally:
            cuda.call("cuThreadExchangeStreamCaptureMode", ctypes.byref(mode), what="back from relaxed")
        if status:
            cuda.raise_failed("cuMemAlloc", status, f"{size} bytes for a graph's pool on device {self.device}")
        self.allocations.append(ptr.value)
        self.nbytes += size
        return GraphBlock(ptr.value, size, self.device, stream, self)

    def give(self, ptr: int, size: int) -> None:
        if not self.sealed:
            self.free_blocks.setdefault(size, []).append(ptr)


# --- one capture ------------------------------------------------------------------------------------------------------
def _where(frame) -> str:
    """The served op innermost on the stack from `frame`, and where the outermost one was called from."""
    from nbxcert.kernels.launch import ENTRY_CODES

    inner, outer = None, None
    while frame is not None:
        name = ENTRY_CODES.get(frame.f_code)
        if name is not None:
            inner = inner or name
            outer = frame
        frame = frame.f_back
    if outer is None:
        return "outside any served call"
    caller = outer.f_back
    at = f" (called at {caller.f_code.co_filename}:{caller.f_lineno})" if caller is not None else ""
    return f"in {inner}{at}"


class Capture:
    """The state of the capture in progress on one thread (see the module docstring)."""

    def __init__(self, device: int, stream: int, label: str):
        self.device, self.stream, self.label = device, stream, label
        self.pool = GraphPool(device)
        self.thread = threading.get_ident()
        self.launches: list[str] = []
        self.refusal: str | None = None

    def refuse(self, what: str):
        message = f"graph capture of {self.label} refused {_where(sys._getframe(1))}: {what}"
        if self.refusal is None:
            self.refusal = message
        raise GraphRefused(message)

    def check_stream(self, handle: int, what: str) -> None:
        if handle != self.stream:
            self.refuse(f"{what} on stream 0x{handle:x}, not the capture stream (a graph holds one stream's work)")

    def block(self, size: int, device: int, stream: int) -> GraphBlock | None:
        if threading.get_ident() != self.thread:
            return None  # another thread's allocation: not the graph's
        if device != self.device or stream != self.stream:
            self.refuse(
                f"an allocation of {size} bytes on cuda:{device} stream 0x{stream:x}, outside the graph's "
                f"pool (the capture stream of cuda:{self.device})"
            )
        return self.pool.take(size, stream)

    def hold_block(self, ptr, device, nbytes, pid, stream, keep) -> bool:
        if device != self.device:
            return False
        self.pool.held.append((memory.pool_free, (ptr, device, nbytes, pid, stream, keep)))
        return True

    def hold_free(self, free, args) -> None:
        self.pool.held.append((free, args))

    def on_launch(self, metadata) -> None:
        """Triton's launch-enter hook during the capture: names each launch, refuses one on another stream."""
        if threading.get_ident() != self.thread:
            return
        data = getattr(metadata, "data", None) or {}
        name, stream = data.get("name", "a kernel"), data.get("stream")
        if stream is not None and int(stream) != self.stream:
            self.refuse(f"launches {name} on stream 0x{int(stream):x}, not the capture stream")
        self.launches.append(name)


def _hooks():
    import triton

    return triton.knobs.runtime


def _add_hook(fn) -> Any:
    """Put `fn` on Triton's launch-enter hook; returns what `_remove_hook` needs."""
    knobs = _hooks()
    hook = knobs.launch_enter_hook
    if hook is not None and hasattr(hook, "add") and hasattr(hook, "calls"):  # Triton's HookChain
        hook.add(fn)
        return ("chain", hook)
    if hook is None:
        knobs.launch_enter_hook = fn
        return ("set", None)

    def both(metadata):
        fn(metadata)
        hook(metadata)

    knobs.launch_enter_hook = both
    return ("set", hook)


def _remove_hook(fn, how) -> None:
    kind, previous = how
    if kind == "chain":
        previous.remove(fn)
    else:
        _hooks().launch_enter_hook = previous


class Graph:
    """An instantiated graph (`cuGraphExec`) and the pool its memory comes from; destroyed when collected."""

    def __init__(self, exec_handle: int, nodes: int, pool: GraphPool, device: int, launches: list[str]):
        self.handle, self.nodes, self.pool, self.device, self.launches = exec_handle, nodes, pool, device, launches
        self._lib = cuda.driver()
        self._finalizer = weakref.finalize(self, _destroy_exec, exec_handle, device, cuda.process_id())
        self._finalizer.atexit = False

    def launch(self, stream: int) -> None:
        """Queue one replay on `stream` (one driver call)."""
        status = self._lib.cuGraphLaunch(self.handle, stream)
        if status:
            cuda.raise_failed("cuGraphLaunch", status, f"a graph of {self.nodes} nodes on device {self.device}")


def _destroy_exec(handle: int, device: int, pid: int) -> None:
    if cuda.owned_here(pid):
        with cuda.in_context(device):
            cuda.call("cuGraphExecDestroy", handle, what=f"device {device}")


def capture(fn, device: int, stream: int, label: str) -> tuple[Any, Graph]:
    """Run `fn()` under a capture of `stream` (this thread's current stream for `device` meanwhile) and instantiate
    what it queued: (what `fn` returned, the `Graph`). What a graph cannot hold raises `GraphRefused` naming it, and
    the capture is ended and dropped; an error of `fn` ends it the same way and propagates."""
    if not _active_lock.acquire(blocking=False):
        raise GraphRefused(
            f"graph capture of {label} refused: another graph is being captured in this process",
            hint="capture one graph at a time",
        )
    state = Capture(device, stream, label)
    hook = None
    try:
        with cuda.in_context(device):
            cuda.call("cuStreamBeginCapture", stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, what=label)
        memory.capturing = state
        cuda.set_thread_capture(state)
        hook = _add_hook(state.on_launch)
        raw = ctypes.c_void_p()
        try:
            with cuda.using_stream(stream, device):
                result = fn()
        except BaseException:
            _end(state, raw)
            if raw.value:
                cuda.call("cuGraphDestroy", raw.value, what=label)
            raise
        status = _end(state, raw)
        if status or state.refusal is not None:
            if raw.value:
                cuda.call("cuGraphDestroy", raw.value, what=label)
            last = ", ".join(state.launches[-3:]) or "none"
            raise GraphRefused(
                state.refusal
                or (
                    f"graph capture of {label} refused: the driver invalidated the capture "
                    f"({cuda.error_name(status)} ({status})); the last launches captured: {last}"
                )
            )
        try:
            count = ctypes.c_size_t()
            cuda.call("cuGraphGetNodes", raw.value, None, ctypes.byref(count), what=label)
            made = ctypes.c_void_p()
            with cuda.in_context(device):
                cuda.call("cuGraphInstantiate", ctypes.byref(made), raw.value, 0, what=label)
        finally:
            cuda.call("cuGraphDestroy", raw.value, what=label)
        return result, Graph(made.value, count.value, state.pool, device, state.launches)
    finally:
        if hook is not None:
            _remove_hook(state.on_launch, hook)
        cuda.set_thread_capture(None)
        memory.capturing = None
        state.pool.sealed = True
        _active_lock.release()


def _end(state: Capture, raw: ctypes.c_void_p) -> int:
    """End the capture (whatever happened in it); the driver's status: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED when a
    call it refused broke the capture."""
    cuda.set_thread_capture(None)
    memory.capturing = None
    lib = cuda.driver()
    with cuda.in_context(state.device):
        return lib.cuStreamEndCapture(state.stream, ctypes.byref(raw))
