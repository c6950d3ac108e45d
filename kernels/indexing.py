"""32-bit indexing of a launch over merged dimensions (host side): whether its indices and offsets fit an int32, and
each size's divider for the kernel's division by it (`kernels.pointwise`'s views).

Its own module, not `kernels.common`: Triton keys a compiled kernel by its functions' source and starting lines, and
every family's kernels call `common`'s device functions, so a line added there would make every shipped bundle's
binaries another kernel's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

INDEX32_BELOW = 1 << 31  # an index or element offset below this is held in an int32


@functools.lru_cache(maxsize=256)
def divider(d: int) -> int:
    """The divider of a size d (1 <= d <= 2^31) for 32-bit indices n < 2^31: n // d == (umulhi(n, magic) + n) >> shift,
    packed as magic | shift << 32 (Granlund and Montgomery's division by invariant integers: shift = ceil(log2 d),
    magic = floor(2^32 (2^shift - d) / d) + 1, below 2^32; umulhi(n, magic) <= n, so the sum stays below 2^32)."""
    if not 1 <= d <= 1 << 31:
        raise ValueError(f"a divider needs 1 <= d <= 2^31, not {d}")
    shift = (d - 1).bit_length()
    magic = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return magic | shift << 32


def fits_index32(sizes: Sequence[int], strides: Sequence[Sequence[int]], block: int) -> bool:
    """Whether a flat launch of BLOCK elements a program over merged `sizes` (outermost first) can index in int32: its
    padded index (the last program's, past n) and every tensor's element offsets, the padded lanes' included, below
    2^31 (`INDEX32_BELOW`)."""
    n = math.prod(sizes)
    if n + block > INDEX32_BELOW:
        return False
    if (n + block) * max(max(map(abs, st)) for st in strides) < INDEX32_BELOW:
        return True  # no offset passes (n + BLOCK) x the largest stride: the served calls' common case, quickly
    inner = math.prod(sizes[1:])
    outer_reach = (n + block - 1) // inner  # the outermost index a padded lane reaches
    for st in strides:
        reach = outer_reach * abs(st[0]) + sum((size - 1) * abs(s) for size, s in zip(sizes[1:], st[1:], strict=True))
        if reach >= INDEX32_BELOW:
            return False
    return True
