"""A spec for `bench_autotune.py`: the matmul spec restricted to its tiled candidates (the ones that are one Triton
kernel with one signature, which `triton.autotune` can sweep too). Imported by nbxcert's sweep workers by name."""

from __future__ import annotations

import dataclasses

from nbxcert.kernels import matmul
from nbxcert.kernels.spec import register

MATMUL_TILED = register(
    dataclasses.replace(
        matmul.MATMUL,
        name="matmul_tiled",
        description="matmul, tiled candidates only (the space triton.autotune sweeps in bench_autotune)",
        candidates=tuple(c for c in matmul.MATMUL.candidates if c["KIND"] == "tiled"),
        default=matmul.DEFAULT_MM,
    )
)
