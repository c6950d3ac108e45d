"""`KernelLaunch`: one kernel launch as the families' launch functions build it, and running a list of them; and the
split-K workspace the matmul and quantized families share.

A launch function returns its launches instead of making them, so the sweep, the tests and the cross-compiling census
run exactly what a launch would: the kernel, its grid, its positional arguments and its keyword arguments
(constexprs, num_warps, num_stages)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

from nbxcert.kernels.tensor import Tensor, empty


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: the kernel, its grid, its positional arguments and its keyword arguments."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


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
