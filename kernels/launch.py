"""`KernelLaunch`: one kernel launch as the families' launch functions build it, and running a list of them; and the
split-K workspace the matmul and quantized families share.

A launch function returns its launches instead of making them, so the sweep, the tests and the cross-compiling census
run exactly what a launch would: the kernel, its grid, its positional arguments and its keyword arguments
(constexprs, num_warps, num_stages)."""

from __future__ import annotations

import threading
from typing import Any, Sequence

from nbxcert.kernels.tensor import Tensor, empty


class KernelLaunch:
    """One kernel launch: the kernel, its grid, its positional arguments and its keyword arguments.

    A plain class with slots (one is built for every launch a family function makes, and a frozen dataclass's
    constructor costs several times more). Treat it as immutable."""

    __slots__ = ("kernel", "grid", "args", "kwargs")

    def __init__(self, kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.kernel = kernel
        self.grid = grid
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)

    def __repr__(self) -> str:
        name = getattr(self.kernel, "__name__", None) or type(self.kernel).__name__
        return f"KernelLaunch({name}, grid={self.grid}, {len(self.args)} args, kwargs={self.kwargs})"


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


_PLAIN = (int, float, bool, str, type(None))
ALIASED = object()  # LaunchPlan.of's answer for a call whose tensors alias each other (see there)


class LaunchPlan:
    """The launches one served call made, with that call's tensors as slots: a later call with the same signature
    (the same kernel, scalars and tensors by `signature`: the caller's key) makes the same launches with its own
    tensors in the slots, and skips the checks, the key, the config lookup and the building that made them.

    `of` refuses (returns None) launches holding anything but the call's tensors and plain scalars: a workspace, a
    view made for the launch or a TMA descriptor belongs to the call that made it, and its plan would replay it."""

    __slots__ = ("steps",)

    def __init__(self, steps: tuple) -> None:
        self.steps = steps  # ((launcher, args template, ((position, tensor index), ...), kwargs), ...)

    @staticmethod
    def of(launches: Sequence[KernelLaunch], tensors: Sequence[Any]) -> LaunchPlan | None | object:
        """The plan of these launches, None where they cannot be replayed, or ALIASED where one tensor filled two of
        the call's places (out=x, or x @ x): which place an argument came from is then unknown, so this call makes no
        plan, and a later call of the same signature without the aliasing makes it."""
        index = {id(t): i for i, t in enumerate(tensors) if t is not None}
        if len(index) != sum(t is not None for t in tensors):
            return ALIASED
        steps = []
        for launch in launches:
            slots = []
            for position, arg in enumerate(launch.args):
                if id(arg) in index:
                    slots.append((position, index[id(arg)]))
                elif not isinstance(arg, _PLAIN):
                    return None
            if any(not isinstance(v, _PLAIN) and not _is_constexpr_value(v) for v in launch.kwargs.values()):
                return None
            launcher, arguments, kwargs = launch.kernel[launch.grid], launch.args, launch.kwargs
            direct = _compiled_runner(launch) if DIRECT else None
            if direct is not None:  # the compiled kernel's runner, on the kernel's whole argument list
                (launcher, arguments), kwargs = direct, {}
            held = {position for position, _ in slots}  # the plan keeps no tensor of the call that made it
            template = tuple(None if position in held else arg for position, arg in enumerate(arguments))
            steps.append((launcher, template, tuple(slots), kwargs))
        return LaunchPlan(tuple(steps)) if steps else None

    def __call__(self, tensors: Sequence[Any]) -> None:
        for launcher, template, slots, kwargs in self.steps:
            args = list(template)
            for position, i in slots:
                args[position] = tensors[i]
            launcher(*args, **kwargs)


# Plans replay a compiled kernel through its own runner (`_compiled_runner`). False: through `kernel[grid](...)`,
# Triton's whole dispatch, which is where `capture_launches` (benchmarks/common.py) sees launches, for tests that
# compare a plan's launches with the full path's.
DIRECT = True


def _compiled_runner(launch: KernelLaunch):
    """(runner, arguments) for replaying `launch` without Triton's dispatch: the runner of the kernel Triton compiled
    for it (`CompiledKernel[grid]`, which takes the stream, launch hooks and scratch as `JITFunction.run` does) and
    the kernel's whole argument list in its parameters' order, defaults filled, as `JITFunction.run` hands it to the
    launcher. `JITFunction.run` would also bind and specialise the arguments again (most of a launch's host cost);
    a plan needs neither, because its signature fixes everything Triton specialises on: dtypes, the scalars, and each
    pointer's 16-byte alignment (`signature`). None for a kernel that is not a plain JITFunction (the interpreter's),
    one with pre-run hooks, or one Triton did not compile here."""
    from triton.runtime.jit import JITFunction

    kernel = launch.kernel
    # not a plain JITFunction (the interpreter's), hooks to run first, or a Triton whose JITFunction lacks these
    if type(kernel) is not JITFunction or getattr(kernel, "pre_run_hooks", None) or not hasattr(kernel, "params"):
        return None
    compiled = kernel.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs)  # found in Triton's cache
    if compiled is None or not hasattr(compiled, "packed_metadata"):
        return None
    names = [p.name for p in kernel.params]
    bound = kernel.signature.bind(*launch.args, **{k: v for k, v in launch.kwargs.items() if k in names})
    bound.apply_defaults()
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    return compiled[grid], tuple(bound.arguments[name] for name in names)


def signature(t: Tensor | None):
    """What a launch plan's signature holds of one tensor of the call (None for an absent one): its shape, strides,
    dtype, whether its address is 16-byte aligned (Triton specialises pointers on it, and a plan replays the kernel
    compiled for the call that made it) and its device (a compiled kernel is loaded on one device); the families add
    the scalars, and anything else their key reads."""
    return None if t is None else (t.shape, t.strides, t.dtype, t.data_ptr() % 16 == 0, t.device)


MAX_PLANS = 4096  # signatures one family keeps; a process serving more distinct shapes starts its memo afresh
_plans: list[dict] = []


def served_plans() -> dict:
    """A family's memo of `LaunchPlan`s by call signature; emptied with serving's state (`forget_plans`). Fill it
    through `keep_plan`, which bounds it."""
    memo: dict = {}
    _plans.append(memo)
    return memo


def keep_plan(memo: dict, signature: tuple, launches: Sequence[KernelLaunch] | None, tensors: Sequence[Any]) -> None:
    """Remember for `signature` the plan of the `launches` a served call made with `tensors` (`LaunchPlan.of`;
    `launches` None: the call made none a plan may replay). A call that cannot be replayed is kept as False, so such
    calls take the full path without trying again; one whose tensors alias (ALIASED) keeps nothing. Past MAX_PLANS
    signatures the memo is cleared first (shapes that vary without end, such as every prefill length, must not grow
    it)."""
    if memo.get(signature) is False:  # refused before: the full path again, without building a plan to refuse
        return
    plan = LaunchPlan.of(launches, tensors) if launches else None
    if plan is ALIASED:  # this call's tensors alias each other: no plan from it, none refused either
        return
    keep_beside_plan(memo, signature, plan or False)


def keep_beside_plan(memo: dict, signature: tuple, value: Any) -> None:
    """Keep `value` for `signature` in a memo that goes beside a family's plans (what a replay needs besides the
    call's tensors, such as the size of a workspace the call made): None forgets it; bounded as `keep_plan` bounds."""
    if value is None:
        memo.pop(signature, None)
        return
    if len(memo) >= MAX_PLANS:
        memo.clear()
    memo[signature] = value


def forget_plans() -> None:
    """Drop every family's launch plans: the configs they were made with may no longer be the ones served."""
    for memo in _plans:
        memo.clear()


def _is_constexpr_value(value: Any) -> bool:
    """A Triton type given as a constexpr (`CDT=tl.float32`): the same object for every launch, safe to replay."""
    return type(value).__module__.startswith("triton.language")


def run_all(launches: Sequence[KernelLaunch]) -> None:
    """Make the launches, in order."""
    for launch in launches:
        launch()


class SplitWorkspace:
    """The split-K partial-sum buffer of matmul and dequant_gemv: one grow-only float32 buffer per (device, stream),
    reused by every launch.

    Launches on one stream run in order, so reuse is safe as long as the two kernels of one product are queued
    back to back: `lock` is held while they are, so another thread's product on that stream cannot slip between
    them. Another stream gets its own buffer."""

    def __init__(self):
        self.lock = threading.Lock()
        self._buffers: dict[tuple[str, int], Tensor] = {}

    def get(self, elements: int, device) -> Tensor:
        if device.type == "cpu":
            return empty((max(elements, 1),), "float32", device)
        from nbxcert.kernels.backends import cuda, triton_cuda

        key = (str(device), triton_cuda.current_stream(device.index))
        buf = self._buffers.get(key)
        if buf is None or buf.numel < elements:
            if buf is not None:
                cuda.synchronize()  # the old buffer may still be read by a queued reduction
            buf = empty((max(elements, 2 * (buf.numel if buf is not None else 0)),), "float32", device)
            self._buffers[key] = buf
        return buf


SPLIT_WORKSPACE = SplitWorkspace()  # matmul's split-K and dequant_gemv's split-K share it
