"""`KernelLaunch`: one kernel launch as the families' launch functions build it, and running a list of them.

A launch function returns its launches instead of making them, so the sweep, the tests and the cross-compiling census
run exactly what a launch would: the kernel, its grid, its positional arguments and its keyword arguments
(constexprs, num_warps, num_stages)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


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
