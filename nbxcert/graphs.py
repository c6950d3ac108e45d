"""Replay a sequence of served calls as a CUDA graph: captured once, checked, replayed with one driver call.

    from nbxcert import graphs

    g = graphs.capture(step, ids, positions, lengths, caches)  # an eager run, the capture, the first replay checked
    ids.copy_(next_ids)                                         # the caller updates the static inputs in place
    logits = g.replay()                                         # one cuGraphLaunch on the caller's current stream

    steps = graphs.GraphCache(step, batched=(0, 1, 2))          # a graph per batch bucket, captured on first use
    logits = steps(ids, positions, lengths, caches)

`capture(fn, *args, **kwargs)` takes what `torch.cuda.graph` does in a `with` block as a callable, because the graph
is checked against an eager run of the same callable: the arguments' device memory is copied aside, `fn` runs eagerly
on a stream of its own, the arguments are put back, `fn` runs again under a capture of that stream
(`nbxcert.kernels.backends.graphs`), and the graph's first replay must give every output byte for byte what the
eager run gave (else `GraphRefused`, naming the first output and element that differ). The tensors given at capture
are the graph's static inputs, what `fn` returned its static outputs: a replay reads the inputs where they are and
writes the same outputs, so the caller updates inputs in place and reads outputs after a replay. Memory allocated
during the capture comes from a pool private to the graph and stays valid while the graph or an output lives.

What a graph cannot hold is refused at capture, naming the served op and its caller: a read of device data to the
host (decode attention without `max_len` reads the lengths), a synchronisation, an allocation outside the graph's
pool, a launch on another stream. The in-kernel index checks (embedding's ids, rope's positions, decode attention's
lengths and block ids) write the device's fault word on every replay as in eager mode, and the next synchronisation
(`CUDAGraph.synchronize`, a copy to the host, `cuda.synchronize`) raises `LaunchError` for a bad index.

`GraphCache` keys graphs by the batch bucket, as serving engines' capture sizes do: a call of batch b replays the
graph of the smallest size >= b (captured on first use over static inputs of that size, zero-filled), after copying
the batched arguments into the first b rows of its static inputs; outputs come back as their first b rows. The sizes
are the profile's `buckets.batch` ladder unless given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import BackendUnavailable, GraphRefused, ShapeMismatch, UsageError
from nbxcert.kernels.tensor import Tensor, zeros


def _tensors(value: Any, path: str = "") -> list[tuple[str, Tensor]]:
    """(where, tensor) for every Tensor in a value of tuples, lists and dicts, in order."""
    if isinstance(value, Tensor):
        return [(path or "the output", value)]
    if isinstance(value, (tuple, list)):
        return [t for i, v in enumerate(value) for t in _tensors(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _tensors(v, f"{path}[{k!r}]")]
    return []


def _device_of(fn_label: str, tensors: Sequence[Tensor]) -> int:
    from nbxcert.kernels.backends import select

    choice = select()
    devices = {t.device for t in tensors}
    if choice.name != "cuda" or not devices or any(d.type != "cuda" for d in devices):
        where = ", ".join(sorted(str(d) for d in devices)) or "no tensor"
        raise BackendUnavailable(
            f"graph capture of {fn_label}: CUDA graphs need the cuda backend and device tensors (backend "
            f"{choice.name}, arguments on {where})",
            hint="call the function directly: the interpreter runs each launch on the CPU as it is made",
        )
    if len(devices) > 1:
        raise GraphRefused(f"graph capture of {fn_label}: arguments on {len(devices)} devices; a graph runs on one")
    return next(iter(devices)).index


def _label(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _spans(tensors: Sequence[Tensor]) -> list[tuple[int, int]]:
    """The device byte ranges the tensors cover, merged within each storage (never across two: two allocations may
    lie end to end, and a copy may not run from one into the next)."""
    by_storage: dict[int, list[tuple[int, int]]] = {}
    for t in tensors:
        lo, hi = t.span()
        if hi > lo:
            base = t._storage.data_ptr()
            by_storage.setdefault(id(t._storage), []).append((base + lo, base + hi))
    merged: list[tuple[int, int]] = []
    for ranges in by_storage.values():
        ranges.sort()
        run = list(ranges[0])
        for lo, hi in ranges[1:]:
            if lo <= run[1]:
                run[1] = max(run[1], hi)
            else:
                merged.append((run[0], run[1]))
                run = [lo, hi]
        merged.append((run[0], run[1]))
    return merged


def _bits(array: np.ndarray) -> np.ndarray:
    """An array's elements as unsigned integers of their width (NaN payloads and signed zeros compared as bits)."""
    array = np.ascontiguousarray(array)
    if array.dtype.itemsize in (1, 2, 4, 8):
        return array.view(f"u{array.dtype.itemsize}")
    return array.view(np.uint8)


def _first_difference(label: str, where: str, graph: np.ndarray, eager: np.ndarray) -> str | None:
    if graph.shape != eager.shape or graph.dtype != eager.dtype:
        return f"{where} is {graph.dtype}{list(graph.shape)} in the graph and {eager.dtype}{list(eager.shape)} eagerly"
    a, b = _bits(graph), _bits(eager)
    differ = np.argwhere(a != b)
    if not len(differ):
        return None
    index = tuple(int(i) for i in differ[0])
    return (
        f"{where}{list(index)} is {graph[index]!r} (bits 0x{int(a[index]):x}) in the graph's first replay and "
        f"{eager[index]!r} (bits 0x{int(b[index]):x}) in the eager run; {len(differ)} of {a.size} elements "
        "differ"
    )


class CUDAGraph:
    """A captured graph with its static inputs (`args`, `kwargs`) and outputs (`outputs`). `replay()` queues it on
    the caller's current stream; `nodes` is its node count, `launches` the kernels captured, `pool_bytes` the memory of
    its private pool."""

    def __init__(self, graph, device: int, args: tuple, kwargs: dict, outputs: Any, label: str):
        self._graph, self.device, self.args, self.kwargs, self.outputs = graph, device, args, kwargs, outputs
        self.label = label

    @property
    def nodes(self) -> int:
        return self._graph.nodes

    @property
    def launches(self) -> list[str]:
        return list(self._graph.launches)

    @property
    def pool_bytes(self) -> int:
        return self._graph.pool.nbytes

    def replay(self, stream: int | None = None) -> Any:
        """Queue one replay (on `stream`, default this thread's current stream of the graph's device); returns the
        static outputs, which hold this replay's results once it has run."""
        from nbxcert.kernels.backends import cuda

        self._graph.launch(cuda.current_stream(self.device) if stream is None else int(stream))
        return self.outputs

    def synchronize(self) -> None:
        """Wait for the device; a bad index a replayed kernel found raises `LaunchError` here."""
        from nbxcert.kernels.backends import cuda

        with cuda.in_context(self.device):
            cuda.synchronize()

    def __repr__(self) -> str:
        return f"CUDAGraph({self.label}, {self.nodes} nodes, cuda:{self.device}, pool {self.pool_bytes} bytes)"


def capture(fn: Callable, *args, check: bool = True, **kwargs) -> CUDAGraph:
    """A CUDA graph of `fn(*args, **kwargs)` (see the module docstring). `check=False` skips the eager run and the
    byte-equality check of the first replay (and the copy of the arguments it needs)."""
    from nbxcert.kernels.backends import cuda
    from nbxcert.kernels.backends import graphs as backend

    label = _label(fn)
    inputs = [t for _, t in _tensors((args, kwargs))]
    device = _device_of(label, inputs)
    caller = cuda.current_stream(device)
    with cuda.in_context(device):
        side = cuda.Stream(device)
        ready = cuda.Event(device)
        ready.record(caller)
        cuda.stream_wait_event(side, ready)
        expected = saved = None
        if check:
            saved = []
            with cuda.using_stream(side, device):
                for lo, hi in _spans(inputs):
                    copy = cuda.mem_alloc(hi - lo, device)
                    cuda.memcpy_dtod_async(copy.ptr, lo, hi - lo, side)
                    saved.append((lo, hi, copy))
                eager = fn(*args, **kwargs)
            expected = [(where, t.numpy().copy()) for where, t in _tensors(eager)]
            del eager
            for lo, hi, copy in saved:  # the arguments as they were before the eager run
                cuda.memcpy_dtod_async(lo, copy.ptr, hi - lo, side)
        outputs, graph = backend.capture(lambda: fn(*args, **kwargs), device, side.handle, label)
        made = CUDAGraph(graph, device, args, kwargs, outputs, label)
        if check:
            graph.launch(side.handle)
            got = _tensors(outputs)
            if [w for w, _ in got] != [w for w, _ in expected]:
                raise GraphRefused(
                    f"graph of {label} refused: the capture returned {len(got)} tensors "
                    f"({', '.join(w for w, _ in got)}), the eager run {len(expected)}"
                )
            for (where, tensor), (_, eager_values) in zip(got, expected, strict=True):
                problem = _first_difference(label, where, tensor.numpy(), eager_values)
                if problem is not None:
                    raise GraphRefused(
                        f"graph of {label} refused: {problem}",
                        hint="an op whose result depends on its launch order (atomics) cannot be "
                        "replayed byte-equal; run it outside the graph",
                    )
            del saved
        done = cuda.Event(device)
        done.record(side)
        cuda.stream_wait_event(caller, done)  # the caller's later work sees the outputs
    made._side = side  # the capture's stream lives with the graph
    return made


class GraphCache:
    """One graph of `fn` per batch bucket (see the module docstring). `batched`: the positions of the arguments whose
    first dimension is the batch (contiguous device tensors); the other arguments must be the same objects (or equal
    values) in every call, as the graph reads the tensors it was captured with. `sizes`: the buckets, ascending;
    default the profile's `buckets.batch` ladder."""

    def __init__(
        self, fn: Callable, batched: Sequence[int] = (0,), sizes: Sequence[int] | None = None, check: bool = True
    ):
        if not batched:
            raise UsageError("GraphCache needs the position of at least one batched argument (batched=)")
        self.fn, self.batched, self.check = fn, tuple(batched), check
        if sizes is None:
            from nbxcert.serving.lookup import profile_in_force

            sizes = profile_in_force()[0].ladder("batch")
        sizes = tuple(int(s) for s in sizes)
        if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            raise UsageError(f"GraphCache sizes must be ascending positive ints, got {list(sizes)}")
        self.sizes = sizes
        self.graphs: dict[int, tuple[CUDAGraph, list]] = {}

    def size_for(self, batch: int) -> int:
        for size in self.sizes:
            if size >= batch:
                return size
        raise GraphRefused(
            f"graph of {_label(self.fn)}: batch {batch} is above the largest capture size {self.sizes[-1]}",
            hint="give GraphCache larger sizes=, or call the function directly",
        )

    def __call__(self, *args):
        from nbxcert.kernels.backends import cuda

        for i in self.batched:
            if i >= len(args) or not isinstance(args[i], Tensor):
                raise UsageError(
                    f"GraphCache of {_label(self.fn)}: argument {i} is not a tensor (batched={self.batched})"
                )
        batch = args[self.batched[0]].shape[0]
        for i in self.batched:
            t = args[i]
            if t.ndim == 0 or t.shape[0] != batch or not t.is_contiguous():
                raise ShapeMismatch(
                    f"GraphCache of {_label(self.fn)}: batched argument {i} {list(t.shape)} is not a "
                    f"contiguous tensor of batch {batch}"
                )
        size = self.size_for(batch)
        found = self.graphs.get(size)
        if found is None:
            static = list(args)
            for i in self.batched:
                t = args[i]
                static[i] = zeros((size, *t.shape[1:]), t.dtype, t.device)
                static[i][:batch].copy_(t)
            graph = capture(self.fn, *static, check=self.check)
            self.graphs[size] = (graph, static)
        else:
            graph, static = found
            stream = cuda.current_stream(graph.device)
            for i, (given, held) in enumerate(zip(args, static, strict=False)):
                if i in self.batched:
                    if given.shape[1:] != held.shape[1:] or given.dtype is not held.dtype:
                        raise ShapeMismatch(
                            f"GraphCache of {_label(self.fn)}: batched argument {i} is "
                            f"{given.dtype.name}{list(given.shape)}, captured as "
                            f"{held.dtype.name}{list(held.shape)}"
                        )
                    cuda.memcpy_dtod_async(held.data_ptr(), given.data_ptr(), given.nbytes, stream)
                elif given is not held and not (not isinstance(given, Tensor) and given == held):
                    raise GraphRefused(
                        f"graph of {_label(self.fn)}: argument {i} is not what the graph was captured "
                        "with; a graph reads the tensors it was captured with",
                        hint="update that tensor in place, or use another GraphCache",
                    )
            if len(args) != len(static):
                raise UsageError(f"GraphCache of {_label(self.fn)}: {len(args)} arguments, captured with {len(static)}")
            graph.replay(stream)
        return _rows(graph.outputs, size, batch)


def _rows(value: Any, size: int, batch: int) -> Any:
    if isinstance(value, Tensor):
        return value[:batch] if value.ndim and value.shape[0] == size and batch != size else value
    if isinstance(value, tuple):
        return tuple(_rows(v, size, batch) for v in value)
    if isinstance(value, list):
        return [_rows(v, size, batch) for v in value]
    if isinstance(value, dict):
        return {k: _rows(v, size, batch) for k, v in value.items()}
    return value
