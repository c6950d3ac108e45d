"""The spin kernel that bench_dispatch's and bench_model's clocks queue before a timed GPU run, so the GPU runs what
follows back to back. A module of its own, not in common.py: importing Triton's language before a script has chosen
its backend breaks the scripts that choose one first (bench_host cross-compiles)."""

from __future__ import annotations

import triton.language as tl


def spin_body(out, steps):
    """Keeps one program busy for `steps` dependent float32 steps: the delay a clock queues before a timed GPU run.
    Undecorated: a benchmark decorates it with nbxcert's `jit` once its backend is chosen.
    out: float32 pointer, one element, written so the loop is kept; steps: int32."""
    acc = tl.program_id(0).to(tl.float32)
    for _ in range(steps):
        acc = acc * 0.999 + 1.0
    tl.store(out, acc)
