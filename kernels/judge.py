"""Judging a kernel's output where it lies: the comparison of `compare.Judge`, run as a Triton kernel on the device.

A sweep judges every candidate of a key against the same reference. On a GPU the host path copies each output back
and widens it (a 4096 x 28672 output is 235 MB to copy and 117M elements to judge per check); here the reference and
the allowed error (`Judge.ref`, `Judge.allowed`, float64) go to the device once per problem, and each check is one
launch that answers per block: elements out of tolerance, and the largest absolute, relative and scaled errors. Only
when every element passes is that the verdict; otherwise the host's `Judge.verdict_of` gives it, with its numpy-style
report (the same verdict either way: the comparisons are the same float64 operations on the same values).

Used for float16, bfloat16 and float32 outputs that are contiguous, against a reference with no non-finite value (a
float output's allowed error is then never 0); anything else is judged on the host. bfloat16 outputs are read as
their 16-bit patterns and widened by a shift (exact, and the same under Triton's interpreter, which runs bfloat16 on
raw integer storage). This is not an oracle: the reference is the float64 oracle's, computed on the host.
"""

from __future__ import annotations

import numpy as np

from nbxcert.kernels.compare import Judge, Verdict
from nbxcert.kernels.jit import jit, tl
from nbxcert.kernels.launch import cdiv
from nbxcert.kernels.tensor import Tensor, empty, from_numpy

BLOCK = 2048
KINDS = ("float16", "bfloat16", "float32")


@jit
def _judge_kernel(out_ptr, ref_ptr, allowed_ptr, stats_ptr, n, BF16_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Per program (BLOCK elements of the flat output): stats[pid] = (mismatched, max abs, max rel, max scaled).

    out_ptr: the output, contiguous (its 16-bit patterns when BF16_BITS). ref_ptr, allowed_ptr: float64 reference
    and allowed error, same order. stats_ptr: float64 [programs, 4]. n: the element count. An element fails when it
    is not finite or |out - ref| > allowed; the maxima are over finite elements (0 when none), the relative one over
    those whose reference is not 0."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    if BF16_BITS:
        bits = tl.load(out_ptr + offs, mask=inside, other=0).to(tl.int32) & 0xFFFF
        o = (bits << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        o = tl.load(out_ptr + offs, mask=inside, other=0.0).to(tl.float64)
    r = tl.load(ref_ptr + offs, mask=inside, other=0.0)
    allowed = tl.load(allowed_ptr + offs, mask=inside, other=1.0)
    finite = (o == o) & (tl.abs(o) < float("inf"))
    err = tl.abs(o - r)
    ok = inside & finite
    bad = inside & ((finite == 0) | (err > allowed))
    rel = tl.where(ok & (r != 0.0), err / tl.where(r != 0.0, tl.abs(r), 1.0), 0.0)
    tl.store(stats_ptr + pid * 4, tl.sum(bad.to(tl.int32), axis=0).to(tl.float64))
    tl.store(stats_ptr + pid * 4 + 1, tl.max(tl.where(ok, err, 0.0), axis=0))
    tl.store(stats_ptr + pid * 4 + 2, tl.max(rel, axis=0))
    tl.store(stats_ptr + pid * 4 + 3, tl.max(tl.where(ok, err / allowed, 0.0), axis=0))


def usable(judge: Judge, tensor: Tensor) -> bool:
    """Whether `DeviceJudge` judges this output (else the host does)."""
    return (
        judge.dtype.name in KINDS
        and tensor.dtype is judge.dtype
        and judge.all_finite
        and not judge.any_zero_allowed
        and tensor.is_contiguous()
        and tuple(tensor.shape) == tuple(judge.ref.shape)
        and judge.ref.size > 0
    )


class DeviceJudge:
    """A `Judge` whose reference and allowed error live on `device` (uploaded once)."""

    def __init__(self, judge: Judge, device):
        self.judge = judge
        self.device = device
        self.ref = from_numpy(np.ascontiguousarray(judge.ref.reshape(-1)), "float64", device)
        self.allowed = from_numpy(np.ascontiguousarray(judge.allowed.reshape(-1)), "float64", device)

    def verdict_of(self, tensor: Tensor, context: str = "") -> Verdict:
        original = tensor
        n = tensor.numel
        programs = cdiv(n, BLOCK)
        stats = empty((programs, 4), "float64", self.device)
        bf16 = tensor.dtype.name == "bfloat16"
        if bf16:  # the same bytes read as int16 (same element size, same strides)
            tensor = Tensor(tensor.untyped_storage(), tensor.shape, tensor.strides, "int16", tensor.storage_offset())
        _judge_kernel[(programs,)](tensor, self.ref, self.allowed, stats, n, BF16_BITS=bf16, BLOCK=BLOCK)
        s = stats.numpy()
        if int(s[:, 0].sum()):
            return self.judge.verdict_of(original, context)  # the host says which elements, with its report
        j = self.judge
        return Verdict(True, 0, n, float(s[:, 1].max()), float(s[:, 2].max()), float(s[:, 3].max()), "", j.tol)
