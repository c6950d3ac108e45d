"""Host work of the float64 oracles (and of the input makers) in parts on the process's cores: an element-wise or
row-wise evaluation of a large array cut into contiguous parts, each evaluated on a thread (numpy's loops release the
GIL), element by element the same values as one evaluation. Used by the element-wise oracles' extended-precision
loops, the pointwise oracles and inputs, the normalisations' rows and attention's (sequence, KV head) pairs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Extended-precision loops run on one core (no SIMD for long double): an array of at least PARALLEL_AT elements is
# cut into parts evaluated on threads (numpy's loops release the GIL), element by element the same values. A SwiGLU
# of 4096 tokens x 14336 took seconds of one core per sweep of its key otherwise.
PARALLEL_AT = 1 << 20
# Where a large evaluation goes a tile at a time (`oracles.elementwise._evaluate`, the pointwise kernels' oracle of two
# or more operands), a tile is TILE elements: its temporaries are small and taken again from the heap, where whole
# arrays over glibc's mmap threshold were fresh memory faulted in at every call.
TILE = 1 << 16


def tiles(lo: int, hi: int) -> Iterator[slice]:
    """[lo, hi) as slices of at most TILE elements, in order."""
    for i in range(lo, hi, TILE):
        yield slice(i, min(i + TILE, hi))


def threads() -> int:
    """The cores this process may use: its affinity, within OMP_NUM_THREADS when that is set (the certify scripts
    give each shard its share of the machine that way)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(n, int(limit))) if limit.isdigit() and int(limit) > 0 else n


_part = threading.local()  # set in a thread evaluating one part: what it calls is not cut into parts again


def part_bounds(size: int) -> list[tuple[int, int]] | None:
    """[lo, hi) parts of `size` elements, one a thread, where an element-wise evaluation is worth spreading over the
    process's cores (at least PARALLEL_AT elements, more than one core, not already inside a part); else None."""
    count = threads()
    if size < PARALLEL_AT or count == 1 or getattr(_part, "inside", False):
        return None
    bounds = np.linspace(0, size, count + 1).astype(np.int64)
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(count)]


def row_parts(n_rows: int, n_cols: int) -> list[tuple[int, int]] | None:
    """`part_bounds` for a row-wise evaluation of [n_rows, n_cols]: [lo, hi) ranges of whole rows, one a thread (at
    most one a row), or None."""
    parts = part_bounds(n_rows * n_cols)
    if parts is None or n_rows < 2:
        return None
    bounds = np.linspace(0, n_rows, min(len(parts), n_rows) + 1).astype(np.int64)
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(len(bounds) - 1)]


def in_parts(fn, parts: list[tuple[int, int]]) -> list:
    """fn(lo, hi) for every part, on threads (numpy's loops release the GIL), in the parts' order; an exception of
    any part is raised."""

    def run(bounds: tuple[int, int]):
        _part.inside = True
        try:
            return fn(*bounds)
        finally:
            _part.inside = False

    with ThreadPoolExecutor(max_workers=min(len(parts), threads())) as pool:
        return list(pool.map(run, parts))


def elementwise_in_parts(fn, *xs: np.ndarray) -> np.ndarray:
    """fn (float64 arrays of one shape -> float64 array, element by element) over xs, in parts on threads when they
    are large (a long double oracle on one core: pow's took 25.5 s of a 36 s key at 2^25 elements on the H200's
    16-core host)."""
    parts = part_bounds(xs[0].size)
    if parts is None:
        return fn(*xs)
    flat = [np.ascontiguousarray(x).reshape(-1) for x in xs]
    out = np.empty(flat[0].size, dtype=np.float64)

    def part(lo: int, hi: int) -> None:
        out[lo:hi] = fn(*(f[lo:hi] for f in flat))

    in_parts(part, parts)
    return out.reshape(xs[0].shape)
