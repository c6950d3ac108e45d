"""`KernelLaunch`: one kernel launch as the families' launch functions build it, and running a list of them; served
launch plans (`served`); and the split-K workspace the matmul and quantized families share.

A launch function returns its launches instead of making them, so the sweep, the tests and the cross-compiling census
run exactly what a launch would: the kernel, its grid, its positional arguments and its keyword arguments
(constexprs, num_warps, num_stages).

Launch plans. Every user-facing entry point of a family is `@served`. The first served call with a given signature
(each tensor argument's shape, strides, dtype, address modulo 16 and device; every other argument's value and type;
the stream it is queued on) runs in full (checks, key, certified config, launches built) while `recording` notes the
kernels it launches and the device memory it allocates. A later call with the same signature replays that record
with its own tensors: the same allocations (from the stream-ordered pool), the same launches with the new addresses,
the same kind of result; no check, key, lookup or building again. On a GPU each launch goes straight to the compiled
kernel's launcher (`_Direct`): pointers passed as integers, TMA descriptors encoded once per address and kept, none of
Triton's dispatch. A call that read device data to the host, copied or synchronised is tied to its data and gets no
plan (decode attention without `max_len`, a run-time sweep); nor does one whose tensors alias each other, or one that
launched with an argument the record cannot place (a tensor view it cannot trace to the call or its allocations).

On a GPU, once an entry point has a plan whose launches nbxcert's launcher can queue (`_Packed`), its calls go to
the launcher's `Served` (launcher.c): the signature, the plan, the output memory, the launches and the result are
made in C, with no Python frame; any call it cannot replay (a recording, `config=`, another library's tensors,
aliasing, no plan yet, a profiler's launch hooks, a graph capture) it hands to the Python path here, which decides as
before.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from nbxcert.kernels import recording as _recording
from nbxcert.kernels.backends import binaries as _binaries
from nbxcert.kernels.dtypes import DType
from nbxcert.kernels.tensor import Storage, Tensor, empty


class KernelLaunch:
    """One kernel launch: the kernel, its grid, its positional arguments and its keyword arguments.

    A plain class with slots (one is built for every launch a family function makes, and a frozen dataclass's
    constructor costs several times more). Treat it as immutable."""

    __slots__ = ("kernel", "grid", "args", "kwargs", "served_by")

    def __init__(self, kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.kernel = kernel
        self.grid = grid
        self.args = args
        self.kwargs = kwargs
        self.served_by = None  # the bundle's compiled kernel (`binaries.Loaded`) that ran it, if one did

    def __call__(self) -> None:
        if _observers:
            _observe(self.kernel, self.grid, self.args, self.kwargs)
        rec = _recording.active()
        if rec is None:
            self._launch()
            return
        rec.launches.append(self)
        rec.paused += 1  # the launch itself (a compile, the interpreter running it) is not the call's work
        try:
            self._launch()
        finally:
            rec.paused -= 1

    def _launch(self) -> None:
        if _binaries.source() is not None and _binaries.launch_from_bundle(self):
            return
        self.kernel[self.grid](*self.args, **self.kwargs)

    def __repr__(self) -> str:
        name = getattr(self.kernel, "__name__", None) or type(self.kernel).__name__
        return f"KernelLaunch({name}, grid={self.grid}, {len(self.args)} args, kwargs={self.kwargs})"


_observers: list[Callable[[Any, tuple, tuple, dict], None]] = []  # `observing`'s; empty: one truth test a launch


def _observe(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
    for observer in tuple(_observers):
        observer(kernel, grid, args, kwargs)


@contextlib.contextmanager
def observing(observer: Callable[[Any, tuple, tuple, dict], None]) -> Iterator[None]:
    """Call `observer(kernel, grid, args, kwargs)` before every launch nbxcert makes through Triton's dispatch while the
    block runs: a call's launches in full, and plans replayed through `kernel[grid](...)` (`DIRECT` false). Launches
    queued by a compiled launcher (`_Direct`, nbxcert's launcher in C) are not seen: set `DIRECT` false to see a plan's.
    For tests and benchmarks that compare or replay what a call launched."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def launch_kernel(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> KernelLaunch:
    """`kernel[grid](*args, **kwargs)` as a `KernelLaunch` (so a served call's record sees it); returns the launch."""
    made = KernelLaunch(kernel, grid, args, kwargs)
    made()
    return made


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a launch's host arithmetic (grids, chunk counts). `triton.cdiv` gives the same, but it is a
    constexpr function whose wrapper costs more than a served launch's whole overhead budget (the cost is compared in
    tests/kernels/test_launch.py)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """`triton.next_power_of_2` on the host (0 for 0), without the constexpr wrapper's cost."""
    n = int(n)
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


_CONSTEXPRS: dict[Any, dict[str, Any]] = {}


def constexprs(key: Any, make) -> dict[str, Any]:
    """The keyword arguments (constexprs, num_warps, num_stages) of a launch whose `key` (a hashable tuple holding the
    config and whatever else they depend on) was seen before; else `make()`'s, kept. Launch functions build them
    once per key instead of once per launch; the dict is shared, so nobody may change it."""
    kwargs = _CONSTEXPRS.get(key)
    if kwargs is None:
        kwargs = _CONSTEXPRS[key] = make()
    return kwargs


# ======================================================================================================================
# Served launch plans
# ======================================================================================================================
_SCALARS = (int, float, bool, str, type(None), DType)
MAX_PLANS = 4096  # signatures one entry point keeps; a process serving more distinct shapes starts its memo afresh
TIED_TRIES = 2  # a signature whose calls were tied to their data this often is served in full from then on
_memos: list[dict] = []
# Plans replay a compiled kernel through its launcher (`_Direct`). False: through `kernel[grid](...)`, Triton's whole
# dispatch, which is where `observing` (and `capture_launches`, benchmarks/common.py) sees launches, for tests that
# compare a plan's launches with the full path's.
DIRECT = True
# A plan whose launches all allow it is queued by nbxcert's launcher in one call (`_Packed`). False: step by step
# through Triton's launcher, as before it (benchmarks/bench_dispatch.py --replay steps compares the two).
REPLAY_IN_C = True
# a packed plan of several launches is queued as one CUDA graph of its kernels (`run_graph` in launcher.c): one
# cuGraphLaunch instead of one cuLaunchKernelEx per kernel; False launches each step (benchmarks compare the two)
PLAN_GRAPHS = True


def forget_plans() -> None:
    """Drop every entry point's plans: the configs they were made with may no longer be the ones served."""
    for memo in _memos:
        memo.clear()


_current_stream = None  # cuda.current_stream, bound on the first GPU call (a CPU-only process never loads cuda)


def _cuda_stream(index: int) -> int:
    global _current_stream
    if _current_stream is None:
        from nbxcert.kernels.backends import cuda

        _current_stream = cuda.current_stream
    return _current_stream(index)


def tensor_key(t: Tensor) -> tuple:
    """What a plan's signature holds of a tensor: shape, strides, dtype, address modulo 16 (Triton specialises
    pointers on 16-byte alignment) and device. Made once per view, of plain ints and strings (and the dtype, hashed
    by identity), so hashing and comparing a signature stays in C."""
    key = t._key
    if key is None:
        device = t._storage.device
        key = t._key = (t.shape, t._strides, t.dtype, t.data_ptr() % 16, device.type, device.index)
    return key


def call_signature(args: tuple, kwargs: dict) -> tuple[tuple, list[Tensor]] | None:
    """(signature, the call's tensors in signature order), or None for a call with an argument a signature cannot
    hold (a list, a numpy array, ...): such a call is served in full. Keyword arguments count in the order given (the
    same call with its keywords in another order is recorded once more), and a scalar is its type and its value, side
    by side (1, 1.0 and True are three signatures): no sort and no tuple per argument on every call."""
    parts: list = []
    tensors: list[Tensor] = []
    stream_of = None
    for value in (*args, *kwargs.values()) if kwargs else args:
        kind = type(value)
        if kind is Tensor:
            key = value._key or tensor_key(value)
            parts.append(key)
            tensors.append(value)
            if stream_of is None and key[4] == "cuda":
                stream_of = key[5]
        elif kind in _SCALARS or kind is tuple and all(type(v) in _SCALARS for v in value):
            parts.append(kind)
            parts.append(value)
        else:
            return None
    if kwargs:
        parts.append(tuple(kwargs))
    if stream_of is not None:
        parts.append(_cuda_stream(stream_of))
    return tuple(parts), tensors


# the code object of every served entry point -> its op's name: a graph capture's refusal names the op it was in by
# reading the frames on the stack (nothing on the served path pays for it)
ENTRY_CODES: dict = {}


def served(fn: Callable) -> Callable:
    """Serve a user-facing entry point through launch plans (see the module docstring). A call given `config=` (an
    explicit config, not the served one) always runs in full.

    Each call goes to `route[0](args, kwargs)`: `in_python` below until a plan with a fast form is made (on a GPU,
    where nbxcert's launcher is built), then nbxcert's launcher (`Served` in launcher.c), which replays such plans in
    C and hands every other call back to `in_python`."""
    memo: dict = {}
    _memos.append(memo)
    params = list(inspect.signature(fn).parameters)
    config_at = params.index("config") if "config" in params else None

    def in_python(args: tuple, kwargs: dict):
        if kwargs.get("config") is not None or (
            config_at is not None and len(args) > config_at and args[config_at] is not None
        ):
            return _in_full(fn, fn, args, kwargs)
        if _recording.state.rec is not None:  # called by another served call: part of its record
            return fn(*args, **kwargs)
        found = call_signature(args, kwargs)
        if found is None:  # something a signature cannot hold: another library's tensors, a list, ...
            return _in_full(fn, entry, args, kwargs)
        sig, tensors = found
        if len(tensors) > 1 and len(set(map(id, tensors))) != len(tensors):
            # one tensor in two places (out=x): which place an argument came from is unknown, so no plan is made
            # from this call, and a plan made from another is not replayed on it
            return fn(*args, **kwargs)
        plan = memo.get(sig)
        if plan is not None and type(plan) is CallPlan:
            result = plan.replay(tensors)
            if result is not _NOT_NOW:
                return result
            return fn(*args, **kwargs)
        if plan is not None and plan >= TIED_TRIES:  # tied to its data before: in full, unrecorded
            return fn(*args, **kwargs)
        with _recording.recording() as rec:
            result = fn(*args, **kwargs)
        made = CallPlan.of(rec, tensors, result) if rec.host_work is None else None
        if len(memo) >= MAX_PLANS:
            memo.clear()
        memo[sig] = made if made is not None else (plan or 0) + 1
        if made is not None and made.fast is not None and route[0] is in_python and REPLAY_IN_C:
            route[0] = _served_in_c(in_python, memo, config_at)
        return result

    route = [in_python]

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        return route[0](args, kwargs)

    # a profile of a served call names the op, not this wrapper: the wrapper's code object takes the op's name
    names = {"co_name": fn.__name__}
    if hasattr(entry.__code__, "co_qualname"):  # Python 3.11+
        names["co_qualname"] = fn.__qualname__
    entry.__code__ = entry.__code__.replace(**names)
    in_python.__code__ = in_python.__code__.replace(co_name=fn.__name__)
    ENTRY_CODES[entry.__code__] = fn.__name__
    ENTRY_CODES[in_python.__code__] = fn.__name__
    entry.plans = memo  # type: ignore[attr-defined]
    entry.route = route  # type: ignore[attr-defined]
    return entry


_c_ready = [False]


def _served_in_c(in_python: Callable, memo: dict, config_at: int | None):
    """nbxcert's launcher's `Served` for one entry point (its module is loaded: a plan with a fast form was made)."""
    module = _binaries.launcher_module()
    if not _c_ready[0]:
        from nbxcert.kernels.backends import cuda, memory

        module.setup(Tensor, DType, _recording.state, *cuda.launcher_state(), tensor_key, Storage.fresh)
        memory.bind_launcher(module, Storage)
        _c_ready[0] = True
    return module.Served(in_python, memo, -1 if config_at is None else config_at)


def _in_full(fn: Callable, again: Callable, args: tuple, kwargs: dict):
    """A call the served path does not replay: `fn` on its arguments; or, where they hold another library's tensors
    (torch, CuPy, JAX; numpy under the interpreter), `again` (the served entry point, so plans are made and replayed
    for the views) on nbxcert views of them, the result handed back as the caller's tensors (`interop`)."""
    from nbxcert.kernels import interop

    views, view_kwargs, caller = interop.to_nbx(args, kwargs)
    if caller is None:
        return fn(*args, **kwargs)
    return interop.serve(again, views, view_kwargs, caller)


_NOT_NOW = object()  # a plan's answer when it cannot replay at this moment (a launch hook is set): the full path runs


class _Unplaceable(Exception):
    """A recorded launch holds something a plan cannot place: the call gets no plan."""


class _Sources:
    """Where the addresses of a recorded call come from: the call's tensors (0..n-1) and the storages it made
    (n..n+m-1). `place(t)` gives (source, byte offset) of a tensor the launches or the result hold, None for one
    that existed before the call and belongs to neither (a persistent buffer: replayed as it is)."""

    def __init__(self, tensors: Sequence[Tensor], storages: Sequence[Storage]):
        self.tensors, self.storages = list(tensors), list(storages)
        self.by_id = {id(t): i for i, t in enumerate(self.tensors)}
        self.made = {id(s): len(self.tensors) + j for j, s in enumerate(self.storages)}

    def place(self, t: Tensor) -> tuple[int, int] | None:
        i = self.by_id.get(id(t))
        if i is not None:
            return i, 0
        storage = t._storage
        j = self.made.get(id(storage))
        if j is not None:
            return j, t.data_ptr() - storage.data_ptr()
        ptr = t.data_ptr()
        same = [i for i, c in enumerate(self.tensors) if c._storage is storage]
        if not same:
            return None
        exact = [i for i in same if self.tensors[i].data_ptr() == ptr]
        if len(exact) == 1:
            return exact[0], 0
        if exact:
            raise _Unplaceable("two of the call's tensors start where a launch argument does")
        lo, hi = t.span()
        inside = []
        for i in same:
            c_lo, c_hi = self.tensors[i].span()
            if c_lo <= lo and hi <= c_hi:
                inside.append(i)
        if len(inside) != 1:
            raise _Unplaceable("a view the record cannot trace to one of the call's tensors")
        return inside[0], ptr - self.tensors[inside[0]].data_ptr()


class _View:
    """The shape, strides and dtype of a tensor a recorded launch took (not the tensor: a plan holds none)."""

    __slots__ = ("shape", "_strides", "dtype")

    @staticmethod
    def of(t: Tensor) -> _View:
        v = _View.__new__(_View)
        v.shape, v._strides, v.dtype = t.shape, t._strides, t.dtype
        return v


def _view(storage: Storage, base_ptr: int, byte_offset: int, like: _View) -> Tensor:
    """A tensor shaped as `like` at `byte_offset` past `base_ptr` (an address inside `storage`)."""
    at = base_ptr + byte_offset - storage.data_ptr()
    return Tensor.trusted(storage, like.shape, like._strides, like.dtype, at // like.dtype.itemsize)


class CallPlan:
    """A recorded served call, to replay with another call's tensors: the storages to make, the steps (zero-fills and
    launches), and how the result is put together."""

    __slots__ = ("n_call", "made", "steps", "result", "locks", "packed", "fast")

    def __init__(self, n_call, made, steps, result, locks, packed=None):
        self.n_call = n_call
        self.made = made  # ((nbytes, device), ...) of the storages to make
        self.steps = steps
        self.result = result
        self.locks = locks
        self.packed = packed  # `_Packed`: every step queued by nbxcert's launcher in one call; None: step by step
        # the plan as nbxcert's launcher replays it in C (`Served` in launcher.c), or None where it cannot
        self.fast = _fast_form(self) if packed is not None else None

    @staticmethod
    def of(rec: _recording.Recording, tensors: Sequence[Tensor], result: Any) -> CallPlan | None:
        sources = _Sources(tensors, rec.storages)
        try:
            steps: list = []
            extras = list(rec.extras)
            for position in range(len(rec.launches) + 1):
                while extras and extras[0][0] == position:
                    extra = extras.pop(0)[1]
                    if extra[0] == "zero":
                        steps.append(_Zero(extra[1] + len(tensors), rec.storages[extra[1]]))
                    else:
                        steps.append(_Call(extra[1], extra[2]))
                if position < len(rec.launches):
                    steps.append(_step(rec.launches[position], sources))
            shape = _result_spec(result, sources)
        except _Unplaceable:
            return None
        made = tuple((s.nbytes, s.device) for s in rec.storages)
        locks = []
        for launch in rec.launches:  # a persistent buffer shared under a lock (the split-K workspace): held alike
            for value in launch.args:
                lock = getattr(value, "_replay_lock", None) if type(value) is Tensor else None
                if lock is not None and lock not in locks:
                    locks.append(lock)
        device = next((t._storage.device.index for t in tensors if t._storage.device.type == "cuda"), None)
        if device is not None:  # the signature holds this device's stream: a launch on it always goes there
            stream = _cuda_stream(device)
            for step in steps:
                if type(step) in (_Direct, _Bundled) and step.device == device:
                    step.fix_stream(stream)
        packed = _Packed.of(steps, device) if REPLAY_IN_C and device is not None else None
        return CallPlan(len(tensors), made, tuple(steps), shape, tuple(locks), packed)

    def replay(self, tensors: Sequence[Tensor]):
        if self.locks:
            for lock in self.locks:
                lock.acquire()
            try:
                return self._replay(tensors)
            finally:
                for lock in self.locks:
                    lock.release()
        return self._replay(tensors)

    def _replay(self, tensors: Sequence[Tensor]):
        made = self.made
        if made:
            fresh = Storage.fresh
            storages = [fresh(nbytes, device) for nbytes, device in made]
            addresses = [t._ptr or t.data_ptr() for t in tensors]
            addresses += [s._alloc.ptr if s._alloc is not None else s.data_ptr() for s in storages]
        else:
            storages = ()
            addresses = [t._ptr or t.data_ptr() for t in tensors]
        if self.packed is not None:
            if self.packed.run(addresses) is _NOT_NOW:
                return _NOT_NOW
        else:
            for step in self.steps:
                if step.run(addresses, tensors, storages) is _NOT_NOW:
                    return _NOT_NOW
        result = self.result
        if result[0] == "call":
            return tensors[result[1]]
        if result[0] == "view" and result[1] >= self.n_call:  # a tensor over a storage this replay made
            _, source, offset, shape, strides, dtype = result
            made = Tensor.trusted(storages[source - self.n_call], shape, strides, dtype, offset // dtype.itemsize)
            made._ptr = addresses[source] + offset  # known here: the next call's signature need not ask
            return made
        return _build_result(result, tensors, storages, addresses, self.n_call)


class _Packed:
    """A plan whose every step is a launch with its stream fixed and no scratch memory (TMA descriptors by address):
    queued by nbxcert's launcher in one call (`launch_plan`: the addresses patched in and each kernel queued in C),
    instead of a Python call into Triton's launcher per step."""

    __slots__ = ("steps", "launch_plan", "names", "device", "hooks", "graph")

    @staticmethod
    def of(steps: Sequence, device: int) -> _Packed | None:
        packed = []
        for step in steps:
            made = step.packed_step() if type(step) in (_Direct, _Bundled) else None
            if made is None:
                return None
            packed.append(made)
        try:
            launch_plan = _binaries.launcher_module().launch_plan
        except Exception:  # noqa: BLE001 - no C compiler or headers here: the plan replays step by step, as before
            return None
        made = _Packed.__new__(_Packed)
        made.steps, made.launch_plan, made.device = tuple(packed), launch_plan, device
        # where the plan has several launches: the one-item list that keeps its CUDA graph, made at its first replay
        made.graph = [None] if PLAN_GRAPHS and len(packed) > 1 else None
        made.names = tuple(
            getattr(s.raw if type(s) is _Direct else None, "__name__", "") or _step_name(s) for s in steps
        )
        direct = next((s for s in steps if type(s) is _Direct), None)
        made.hooks = (direct.knobs, direct.chain) if direct is not None else None
        return made

    def run(self, addresses: list):
        if self.hooks is not None:  # a profiler's hooks want Triton's metadata: the full path gives it (as `_Direct`)
            knobs, chain = self.hooks
            e, x = knobs.launch_enter_hook, knobs.launch_exit_hook
            if (e is not None and (type(e) is not chain or e.calls)) or (
                x is not None and (type(x) is not chain or x.calls)
            ):
                return _NOT_NOW
        status, at = self.launch_plan(self.steps, addresses, 0, self.graph)
        if status:
            self.recover(status, at, addresses)
        return None

    def recover(self, status: int, at: int, addresses: list) -> None:
        """Step `at` failed with `status`: on a thread with no context current yet, make the device's current and
        queue the rest; else raise `CudaError` naming the kernel."""
        from nbxcert.kernels.backends import cuda

        if status == _binaries.CUDA_ERROR_INVALID_CONTEXT:
            cuda.make_current(self.device)
            status, at = self.launch_plan(self.steps, addresses, at, self.graph)
        if status:
            how = "cuLaunchKernelEx" if self.graph is None else "cuGraphLaunch of the plan's graph"
            cuda.check(status, f"{how} ({self.names[at]})")


def _step_name(step) -> str:
    """The kernel a replayed launch queues, for an error."""
    if type(step) is _Bundled:
        return step.loaded.binary.record["name"]
    return step.name


class _Zero:
    """A zero-fill of a storage the call made, queued on the stream."""

    __slots__ = ("source", "nbytes", "device")

    def __init__(self, source: int, storage: Storage):
        self.source, self.nbytes, self.device = source, storage.nbytes, storage.device

    def run(self, addresses, tensors, storages):
        from nbxcert.kernels.tensor import zero_fill

        zero_fill(storages[self.source - len(tensors)], self.nbytes)


class _Call:
    """A host function the recorded call ran after its launches so far (the interpreter's fault check)."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def run(self, addresses, tensors, storages):
        self.fn(*self.args)


def _result_spec(result: Any, sources: _Sources):
    kind = type(result)
    if kind is Tensor:
        placed = sources.place(result)
        if placed is None:
            raise _Unplaceable("the result is a tensor the call neither took nor made")
        source, offset = placed
        if source < len(sources.tensors) and offset == 0 and result is sources.tensors[source]:
            return ("call", source)
        return ("view", source, offset, result.shape, result._strides, result.dtype)
    if kind is tuple:
        return ("tuple", tuple(_result_spec(r, sources) for r in result))
    if kind in _SCALARS:
        return ("value", result)
    raise _Unplaceable(f"a result of type {kind.__name__}")


def _build_result(spec, tensors, storages, addresses, n_call):
    kind = spec[0]
    if kind == "call":
        return tensors[spec[1]]
    if kind == "view":
        _, source, offset, shape, strides, dtype = spec
        if source < n_call:
            base = tensors[source]
            storage, at = base._storage, base.data_ptr() + offset - base._storage.data_ptr()
        else:
            storage = storages[source - n_call]
            at = offset
        made = Tensor.trusted(storage, shape, strides, dtype, at // dtype.itemsize)
        made._ptr = addresses[source] + offset
        return made
    if kind == "tuple":
        return tuple(_build_result(s, tensors, storages, addresses, n_call) for s in spec[1])
    return spec[1]


def _fast_form(plan: CallPlan) -> tuple | None:
    """`plan` as `Served` in launcher.c replays it: (number of call tensors, ((nbytes, device, index), ...) to make,
    the packed steps, the device index, the result's form, the launch hooks to honour, the failure handler, the
    locks held while its launches are queued (the split workspace's), the holder of its CUDA graph); None where
    the result is not made of the call's tensors and the plan's own memory only, or memory is made off the GPU."""
    packed = plan.packed
    if any(device.type != "cuda" for _, device in plan.made):
        return None
    result = _fast_result(plan.result, plan.n_call, plan.made)
    if result is None:
        return None
    made = tuple((nbytes, device, device.index) for nbytes, device in plan.made)
    locks = tuple((lock.acquire, lock.release) for lock in plan.locks)
    return (
        plan.n_call,
        made,
        packed.steps,
        packed.device,
        result,
        packed.hooks or None,
        packed.recover,
        locks,
        packed.graph,
    )


def _fast_result(spec, n_call: int, made: tuple):
    kind = spec[0]
    if kind == "call":
        return (0, spec[1])
    if kind == "view":
        _, source, offset, shape, strides, dtype = spec
        if source < n_call or offset % dtype.itemsize:
            return None
        device = made[source - n_call][1]
        return (1, source, offset, shape, strides, dtype, offset // dtype.itemsize, device.type, device.index)
    if kind == "tuple":
        items = tuple(_fast_result(s, n_call, made) for s in spec[1])
        return None if any(i is None for i in items) else (2, items)
    return (3, spec[1])


def _is_descriptor(value: Any) -> bool:
    return type(value).__name__ == "TensorDescriptor" and hasattr(value, "block_shape")


def _step(launch: KernelLaunch, sources: _Sources):
    """The replayable form of one recorded launch: `_Direct` where the compiled kernel's launcher can be driven
    directly, else `_Dispatched` (Triton's `kernel[grid](...)` on rebuilt arguments)."""
    placed_args = []
    for value in launch.args:
        placed_args.append(_place_argument(value, sources))
    for value in launch.kwargs.values():
        if type(value) is Tensor or _is_descriptor(value):
            raise _Unplaceable("a tensor given to a launch by keyword")
        # a JIT function given as a constexpr (the pointwise kernel's op body) is part of what is compiled
        if not (type(value) in _SCALARS or type(value).__module__.startswith(("triton.language", "triton.runtime"))):
            raise _Unplaceable(f"a launch keyword of type {type(value).__name__}")
    if launch.served_by is not None:  # a bundle's compiled kernel ran it: replayed the same way, never compiled
        return _Bundled.of(launch, placed_args)
    if DIRECT:
        direct = _Direct.of(launch, placed_args)
        if direct is not None:
            return direct
    return _Dispatched(launch, placed_args)


def _place_argument(value: Any, sources: _Sources):
    """("const", value) | ("tensor", source, offset, view) | ("desc", source, offset, view, descriptor), where a view
    is (shape, strides, dtype) and a descriptor (type, shape, strides, block shape, padding): the plan keeps none of
    the recorded call's tensors."""
    kind = type(value)
    if kind is Tensor:
        placed = sources.place(value)
        return ("const", value) if placed is None else ("tensor", *placed, _View.of(value))
    if _is_descriptor(value):
        base = value.base
        if type(base) is not Tensor:
            raise _Unplaceable("a tensor descriptor over something other than a tensor")
        placed = sources.place(base)
        if placed is None:
            return ("const", value)
        form = (type(value), list(value.shape), list(value.strides), list(value.block_shape), value.padding)
        return ("desc", *placed, _View.of(base), form)
    if kind in _SCALARS or kind.__module__.startswith("triton.language"):
        return ("const", value)
    raise _Unplaceable(f"a launch argument of type {kind.__name__}")


def _rebuild(placed, addresses, tensors, storages):
    """A recorded argument with this replay's tensors in it (for `_Dispatched`)."""
    kind = placed[0]
    if kind == "const":
        return placed[1]
    source, offset, like = placed[1], placed[2], placed[3]
    n_call = len(tensors)
    if (
        source < n_call
        and offset == 0
        and like.shape == tensors[source].shape
        and like.dtype is tensors[source].dtype
        and like._strides == tensors[source]._strides
    ):
        tensor = tensors[source]
    else:
        storage = tensors[source]._storage if source < n_call else storages[source - n_call]
        tensor = _view(storage, addresses[source], offset, like)
    if kind == "tensor":
        return tensor
    form, shape, strides, block, padding = placed[4]
    return form(tensor, list(shape), list(strides), list(block), padding)


class _Dispatched:
    """A launch replayed through Triton's dispatch (`kernel[grid](...)`) on rebuilt arguments: the interpreter's
    kernels, and wherever `_Direct` does not apply."""

    __slots__ = ("kernel", "grid", "placed", "kwargs")

    def __init__(self, launch: KernelLaunch, placed):
        self.kernel, self.grid, self.placed, self.kwargs = launch.kernel, launch.grid, placed, launch.kwargs

    def run(self, addresses, tensors, storages):
        args = [_rebuild(p, addresses, tensors, storages) for p in self.placed]
        if _observers:
            _observe(self.kernel, self.grid, tuple(args), self.kwargs)
        self.kernel[self.grid](*args, **self.kwargs)


DESCRIPTORS_KEPT = 64  # encoded TMA descriptors one launch keeps by address (weights, the pool's reused outputs)


def _launcher_arguments(signature, names, bound, placed, metas: dict, width_of) -> tuple[list, tuple, tuple]:
    """A recorded launch's launcher arguments, built once: (template, pointers, descriptors). `signature` names the
    compiled kernel's parameters in order, `names` the JIT function's (which `placed`, the record's placed arguments,
    follow); `metas` maps each TMA descriptor parameter's index to Triton's metadata for it, and `width_of(value,
    where, meta)` says how many launcher arguments it expands to. A pointer is filled per call at its position
    (pointers: (position, source, offset)), a descriptor's arguments per address (descriptors: (position, width,
    source, offset, dtype, form, meta, the encodings kept by address)); everything else is as recorded.
    `_Unplaceable` where a descriptor is not placed where the kernel takes one, or placed where it takes none."""
    placed_by_name = dict(zip(names, placed, strict=False))
    template, pointers, descriptors = [], [], []
    for index, name in enumerate(signature):
        value = bound.arguments[name]
        where = placed_by_name.get(name) if index < len(placed) else None
        if index in metas:
            if where is None or where[0] != "desc":
                raise _Unplaceable("a descriptor argument the record cannot place")
            meta, width = metas[index], width_of(value, where, metas[index])
            descriptors.append((len(template), width, where[1], where[2], where[3].dtype, where[4], meta, {}))
            template.extend([None] * width)
        elif where is not None and where[0] == "tensor":
            pointers.append((len(template), where[1], where[2]))
            template.append(0)
        elif where is not None and where[0] == "desc":
            raise _Unplaceable("a descriptor where the kernel takes none")
        else:
            template.append(value.data_ptr() if type(value) is Tensor else value)
    return template, tuple(pointers), tuple(descriptors)


def _cuda_launcher() -> type:
    from triton.backends.nvidia.driver import CudaLauncher

    return CudaLauncher


class _Direct:
    """A launch replayed straight into the compiled kernel's launcher (Triton 3.6's `CudaLauncher`): the launcher's
    whole argument list is built once, pointers are filled in as integers (the launcher then asks the driver nothing
    about them), and a TMA descriptor argument is expanded to the encoded map, its shape and strides, encoded once
    per address (`DESCRIPTORS_KEPT` kept). None from `of` where the launcher is not of the form this drives (another
    Triton, profile scratch, pre-run hooks, the interpreter): such a launch goes through `_Dispatched`."""

    __slots__ = (
        "raw",
        "grid",
        "function",
        "coop",
        "pdl",
        "packed",
        "scratch",
        "template",
        "pointers",
        "descriptors",
        "device",
        "knobs",
        "keep",
        "stream",
        "chain",
        "run",
        "fixed",
        "figures",
        "name",
    )

    @staticmethod
    def of(launch: KernelLaunch, placed) -> _Direct | None:
        try:
            from triton import knobs
            from triton.backends.nvidia import driver as nvidia_driver
            from triton.runtime.jit import JITFunction
        except ImportError:
            return None
        kernel = launch.kernel
        if type(kernel) is not JITFunction or getattr(kernel, "pre_run_hooks", None) or not hasattr(kernel, "params"):
            return None
        if getattr(nvidia_driver, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO":
            return None
        compiled = kernel.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs)  # from Triton's cache
        launcher = getattr(compiled, "run", None)
        if compiled is None or not hasattr(compiled, "packed_metadata") or not isinstance(launcher, _cuda_launcher()):
            return None
        if getattr(launcher, "profile_scratch_size", 0) or getattr(launcher, "num_ctas", 1) != 1:
            return None
        raw, desc_indices, desc_meta = launcher.launch, (), ()
        closure = getattr(raw, "__closure__", None)
        if closure:
            cells = dict(zip(raw.__code__.co_freevars, (c.cell_contents for c in closure), strict=False))
            if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= set(cells):
                return None
            raw, desc_indices = cells["launcher"], sorted(cells["tensordesc_indices"])
            desc_meta = cells["tensordesc_meta"] or [None] * len(desc_indices)
        compiled._init_handles()
        names = [p.name for p in kernel.params]
        by_keyword = {k: v for k, v in launch.kwargs.items() if k in names}
        bound = kernel.signature.bind(*launch.args, **by_keyword)
        bound.apply_defaults()
        metas = {index: desc_meta[k] for k, index in enumerate(desc_indices)}

        def width_of(value, where, meta):
            return len(_expand(where[4], value.base.data_ptr(), where[3].dtype, meta, nvidia_driver))

        try:
            template, pointers, descriptors = _launcher_arguments(names, names, bound, placed, metas, width_of)
        except _Unplaceable:
            return None  # a descriptor where the launcher takes none, or none where it takes one: not this form
        made = _Direct.__new__(_Direct)
        made.keep = tuple(p[1] for p in placed if p[0] == "const" and type(p[1]) is Tensor)  # persistent buffers
        grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
        made.raw, made.grid, made.function = raw, grid, compiled.function
        made.coop, made.pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
        made.packed = compiled.packed_metadata
        size = launcher.global_scratch_size
        made.scratch = (grid[0] * grid[1] * grid[2] * size, launcher.global_scratch_align) if size else None
        made.template, made.pointers, made.descriptors = template, pointers, descriptors
        made.device = cuda_device_of(launch)
        made.knobs = knobs.runtime
        made.chain = getattr(knobs, "HookChain", None)  # Triton 3.6's hook type: one holding no call does nothing
        from nbxcert.kernels.backends import cuda

        made.stream = cuda.current_stream
        made.run = made.general
        made.fixed = None
        meta = compiled.metadata
        made.name = getattr(meta, "name", "a kernel")
        try:  # what nbxcert's launcher needs to queue it in a plan of launches (`launch_plan`), where it can
            codes = _binaries.param_codes(list(compiled.src.signature.items()), getattr(meta, "tensordesc_meta", None))
            flags = (1 if made.coop else 0) | (2 if made.pdl else 0)
            made.figures = (made.function, *grid, 32 * meta.num_warps, 1, meta.shared, flags, codes.encode())
        except (_binaries.BinaryUnusable, AttributeError):
            made.figures = None
        return made

    def fix_stream(self, stream: int) -> None:
        """This launch always goes to `stream` (the plan's signature holds the stream of its device): where it takes
        no scratch, `run` becomes a closure over the recorded values that puts the call's addresses in place and
        calls the launcher with the stream fixed (no stream asked per call); a TMA descriptor's arguments are looked
        up by address in the same kept encodings `general` fills. No code is generated: nothing is executed but
        nbxcert's own functions."""
        if self.scratch is not None:
            return
        self.fixed = int(stream)
        raw, function, packed, knobs, chain = self.raw, self.function, self.packed, self.knobs, self.chain
        template, pointers = self.template, self.pointers
        descriptors = tuple(
            (position, width, source, offset, kept, functools.partial(_fill, kept, dtype, form, meta))
            for position, width, source, offset, dtype, form, meta, kept in self.descriptors
        )
        gx, gy, gz = self.grid
        coop, pdl, stream = self.coop, self.pdl, int(stream)

        def run(a, tensors, storages):
            e, x = knobs.launch_enter_hook, knobs.launch_exit_hook
            if (e is not None and (type(e) is not chain or e.calls)) or (
                x is not None and (type(x) is not chain or x.calls)
            ):
                return _NOT_NOW
            args = template.copy()
            for position, source, offset in pointers:
                args[position] = a[source] + offset
            for position, width, source, offset, kept, fill in descriptors:
                ptr = a[source] + offset
                args[position : position + width] = kept.get(ptr) or fill(ptr)
            raw(gx, gy, gz, stream, function, coop, pdl, None, None, packed, None, None, None, *args)

        self.run = run

    def packed_step(self) -> tuple | None:
        """This launch as a step of `launch_plan` (nbxcert's launcher queues a plan's launches in one call), or None
        where it cannot be one (no fixed stream, scratch memory). A TMA descriptor's arguments are found by address
        in the same kept encodings `general` fills (encoded there the first time an address is seen)."""
        if self.fixed is None or self.figures is None:
            return None
        function, gx, gy, gz, threads, num_ctas, shared, flags, codes = self.figures
        template = [*self.template, None, None]  # the global and profile scratch pointers: none
        step = (function, gx, gy, gz, threads, num_ctas, shared, self.fixed, flags, codes, template, self.pointers)
        return (*step, _packed_descriptors(self.descriptors)) if self.descriptors else step

    def general(self, addresses, tensors, storages):
        knobs = self.knobs
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        if (enter is not None and (type(enter) is not self.chain or enter.calls)) or (
            leave is not None and (type(leave) is not self.chain or leave.calls)
        ):
            return _NOT_NOW  # a profiler's hooks want Triton's metadata: the full path gives it
        args = self.template.copy()
        for position, source, offset in self.pointers:
            args[position] = addresses[source] + offset
        if self.descriptors:
            from triton.backends.nvidia import driver as nvidia_driver

            for position, width, source, offset, dtype, form, meta, kept in self.descriptors:
                ptr = addresses[source] + offset
                expanded = kept.get(ptr) or _fill(kept, dtype, form, meta, ptr, nvidia_driver)
                args[position : position + width] = expanded
        stream = self.stream(self.device)
        scratch = None
        if self.scratch is not None:
            # Triton 3.6 has a public setter for its allocator (`triton.set_allocator`) but no getter: its private
            # ContextVar is the only way to ask for the allocator the full path would use
            from triton.runtime import _allocation

            scratch = _allocation._allocator.get()(self.scratch[0], self.scratch[1], stream)
        gx, gy, gz = self.grid
        self.raw(
            gx, gy, gz, stream, self.function, self.coop, self.pdl, scratch, None, self.packed, None, None, None, *args
        )


class _Bundled:
    """A launch a bundle's compiled kernel ran (`binaries.Loaded`), replayed through nbxcert's launcher: its launcher
    arguments built once, the call's addresses put in place, a TMA descriptor's arguments encoded once per address
    (as `_Direct` does). Triton's dispatch never runs for it, so nothing is compiled."""

    __slots__ = ("loaded", "grid", "template", "pointers", "descriptors", "device", "stream")

    @staticmethod
    def of(launch: KernelLaunch, placed) -> _Bundled:
        loaded = launch.served_by
        record = loaded.binary.record
        kernel = launch.kernel
        names = [p.name for p in kernel.params]
        bound = kernel.signature.bind(*launch.args, **{k: v for k, v in launch.kwargs.items() if k in names})
        bound.apply_defaults()
        signature = [name for name, _ in record["signature"]]
        at = [index for index, (_, ty) in enumerate(record["signature"]) if ty.startswith("tensordesc")]
        given = list(record["tensordesc_meta"] or ())
        metas = {index: given[k] if given else None for k, index in enumerate(at)}

        def width_of(value, where, meta):
            return len(_binaries.expand_descriptor(value, meta))

        template, pointers, descriptors = _launcher_arguments(signature, names, bound, placed, metas, width_of)
        template += [None, None]  # the global and profile scratch pointers
        made = _Bundled.__new__(_Bundled)
        made.loaded, made.device = loaded, loaded.device
        made.grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
        made.template, made.pointers, made.descriptors = template, pointers, descriptors
        made.stream = None
        return made

    def fix_stream(self, stream: int) -> None:
        """This launch always goes to `stream` (the plan's signature holds its device's stream)."""
        self.stream = int(stream)

    def packed_step(self) -> tuple | None:
        """This launch as a step of `launch_plan` (see `_Direct.packed_step`), or None."""
        loaded = self.loaded
        if self.stream is None or loaded.scratch is not None:
            return None
        figures = (loaded.function, *self.grid, loaded.threads, loaded.num_ctas, loaded.shared, self.stream)
        step = (*figures, loaded.flags, loaded.codes, list(self.template), self.pointers)
        return (*step, _packed_descriptors(self.descriptors)) if self.descriptors else step

    def run(self, addresses, tensors, storages):
        args = self.template.copy()
        for position, source, offset in self.pointers:
            args[position] = addresses[source] + offset
        for position, width, source, offset, dtype, form, meta, kept in self.descriptors:
            ptr = addresses[source] + offset
            args[position : position + width] = kept.get(ptr) or _fill(kept, dtype, form, meta, ptr)
        stream = self.stream if self.stream is not None else _cuda_stream(self.device)
        scratch = _binaries.scratch_for(self.loaded, self.grid, stream)
        if scratch is not None:
            args[-2] = scratch.data_ptr()
        self.loaded.launch(self.grid, stream, args)


def _packed_descriptors(descriptors: tuple) -> tuple:
    """A launch's TMA descriptors as `launch_plan` takes them: (position, width, source, offset, the encodings kept
    by address, the function that encodes and keeps one)."""
    return tuple(
        (position, width, source, offset, kept, functools.partial(_fill, kept, dtype, form, meta))
        for position, width, source, offset, dtype, form, meta, kept in descriptors
    )


def cuda_device_of(launch: KernelLaunch) -> int:
    """The CUDA device index of the first tensor a launch takes (0 when it takes none)."""
    for value in launch.args:
        t = value if type(value) is Tensor else getattr(value, "base", None)
        if type(t) is Tensor and t._storage.device.type == "cuda":
            return t._storage.device.index
    return 0


class _Address:
    """What a TMA descriptor's base must answer for Triton to encode it at another address: `data_ptr()` and the
    element type's size."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


def _fill(kept: dict, dtype, form, meta, ptr: int, nvidia_driver=None) -> list:
    """The launcher arguments of the descriptor at `ptr`, encoded and kept (at most `DESCRIPTORS_KEPT` addresses)."""
    if nvidia_driver is None:
        from triton.backends.nvidia import driver as nvidia_driver
    if len(kept) >= DESCRIPTORS_KEPT:
        kept.clear()
    expanded = kept[ptr] = _expand(form, ptr, dtype, meta, nvidia_driver)
    return expanded


def _expand(form, ptr: int, dtype, meta, nvidia_driver) -> list:
    """The launcher arguments of a descriptor of `form` (type, shape, strides, block shape, padding) at address `ptr`,
    as Triton's own `make_tensordesc_arg` makes them (the encoded CUtensorMap, then shape and strides; or the lowered
    form for a kernel that reads it by pointers)."""
    kind, shape, strides, block, padding = form
    if meta is None:
        return [ptr, *shape, *strides, padding == "nan", *shape, *strides]
    moved = object.__new__(kind)  # the descriptor as Triton reads it, without re-checking what the record checked
    moved.__dict__.update(base=_Address(ptr, dtype), shape=shape, strides=strides, block_shape=block, padding=padding)
    expanded = list(nvidia_driver.make_tensordesc_arg(moved, meta))
    _binaries.note_tensor_map(expanded[0])
    return expanded


def replay_of(fn: Callable[[], Any], tensors: Sequence[Tensor]) -> Callable[[], None] | None:
    """Run `fn()` once while its launches are recorded; return a callable that queues the same launches again on the
    same `tensors` the way a served call's plan does (`CallPlan`: on a GPU straight into each compiled kernel's
    launcher, none of the family's host code or Triton's dispatch run again), or None where the call cannot be
    replayed: it read device data to the host, copied or synchronised, passed something a plan cannot place, or a
    recording was already on. The GPU runs the same kernels on the same arguments either way, so a timing of the
    replay is a timing of `fn`'s kernels at a fraction of its host cost. Memory `fn` allocated is allocated again by
    each replay, as `fn` does; a replay that cannot run at that moment (a profiler's launch hooks) runs `fn`."""
    if _recording.state.rec is not None:
        fn()
        return None
    with _recording.recording() as rec:
        fn()
    if rec.host_work is not None:
        return None
    held = tuple(tensors)
    plan = CallPlan.of(rec, held, None)
    if plan is None:  # an argument not traced to one tensor (two start at its address): each kept as it is, since
        held = ()  # the replay is on the same tensors
        plan = CallPlan.of(rec, held, None)
    if plan is None:
        return None

    def again() -> None:
        if plan.replay(held) is _NOT_NOW:
            fn()

    return again


def run_all(launches: Sequence[KernelLaunch]) -> None:
    """Make the launches, in order."""
    for launch in launches:
        launch()


COMPILE_ONLY_ELEMENTS = 64  # the workspace a launch is handed inside `triton_cuda.compiling_only()`


class SplitWorkspace:
    """The float32 workspace of split kernels (matmul and dequant_gemv split-K, the split softmax, split decode
    attention): one grow-only buffer per (device, stream), reused by every launch, so no call allocates one.

    Launches on one stream run in order, so reuse is safe as long as the two kernels of one product are queued
    back to back: `lock` is held while they are, so another thread's product on that stream cannot slip between
    them. Another stream gets its own buffer. A replayed plan passes the buffer it was recorded with (kept alive by
    the plan), on the same stream (the stream is part of a plan's signature)."""

    def __init__(self):
        self.lock = threading.Lock()
        self._buffers: dict[tuple[str, int], Tensor] = {}

    def get(self, elements: int, device) -> Tensor:
        """A float32 buffer of at least `elements` for this thread's current stream on `device`; call it holding
        `lock`, and queue the kernels that use it before letting go. On the CPU, a buffer of its own each time."""
        if device.type == "cpu":
            return empty((max(elements, 1),), "float32", device)
        from nbxcert.kernels.backends import cuda, triton_cuda

        if triton_cuda.compiling_now():
            # a compile worker's launch queues nothing: the kernel compiles for a buffer's address, never its size.
            # Kept at full size, a 16-way split of a 4096 x 37888 product (9.9 GB) stayed in each of 16 workers
            # and left the runner's checks out of device memory.
            return empty((COMPILE_ONLY_ELEMENTS,), "float32", device)

        key = (str(device), cuda.current_stream(device.index))
        buf = self._buffers.get(key)
        if buf is None or buf.numel < elements:
            with _recording.paused():  # nbxcert's own buffer, not the call's memory
                if buf is not None:
                    cuda.synchronize()  # the old buffer may still be read by a queued reduction
                buf = empty((max(elements, 2 * (buf.numel if buf is not None else 0)),), "float32", device)
            buf._replay_lock = self.lock  # a plan replaying launches on it takes the lock as the full path does
            self._buffers[key] = buf
        return buf


SPLIT_WORKSPACE = SplitWorkspace()  # split-K (matmul, dequant_gemv), the split softmax and split decode share it
