"""The specs `bench_autotune.py` hands to nbxcert's sweep (`certify --spec autotune_specs`), imported by its workers by
name: for each family measured, a spec whose candidates are all one Triton kernel with one signature, the space
`triton.autotune` can sweep too.

- matmul: the shipped spec's candidates span several kernels, chosen by their `KIND` field (tiled, split_k: two
  kernels, tma_persistent); this registers `matmul_tiled`, a copy restricted to the `KIND == "tiled"` candidates, all
  `_mm_tiled_kernel`.
- rmsnorm, silu_and_mul: the shipped specs are one kernel each (`_norm_kernel`, whose `tile` and `loop` variants are
  its `ONE_TILE` constexpr; `_silu_and_mul_kernel`), so they are measured as shipped and need no copy here.
"""

from __future__ import annotations

import dataclasses

from nbxcert.kernels import matmul
from nbxcert.kernels.spec import register

_TILED = tuple(c for c in matmul.MATMUL.candidates if c["KIND"] == "tiled")

MATMUL_TILED = register(
    dataclasses.replace(
        matmul.MATMUL,
        name="matmul_tiled",
        description="matmul, tiled candidates only (the space triton.autotune sweeps in bench_autotune)",
        kernels=(matmul._mm_tiled_kernel,),
        candidates=_TILED,
        default=matmul.DEFAULT_MM,
        # only the no-bit claims about fields the tiled candidates have (C_TMA is the persistent kernel's)
        no_bit_fields=tuple(
            f
            for f in matmul.MATMUL.no_bit_fields
            if f in ("num_warps", "num_stages") or any(f in dict(c.kwargs) for c in _TILED)
        ),
    )
)
