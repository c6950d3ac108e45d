"""Judging a kernel's output where it lies: the comparison of `compare.Judge`, run as a Triton kernel on the device.

A sweep judges every candidate of a key against the same reference. On a GPU the host path copies each output back
and widens it (a 4096 x 28672 output is 235 MB to copy and 117M elements to judge per check); here the reference and
the allowed error (`Judge.ref`, `Judge.allowed`, float64) go to the device once per problem, and each check is one
launch that answers per block: elements out of tolerance, and the largest absolute, relative and scaled errors. Only
when every element passes is that the verdict; otherwise the host's `Judge.verdict_of` gives it, with its numpy-style
report (the same verdict either way: the comparisons are the same float64 operations on the same values).

Used for outputs of the float dtypes but float8, the integer dtypes and bool, of the reference's shape, contiguous or
in rows of contiguous elements (`rows_of`), in any order of its dimensions (a channels-last output is read in its
storage order against the reference permuted alike, `storage_order`); anything else (an overlapping or gapped layout
that is no such rows, float8) is judged on the host. The host's rules hold here too: against a reference with a
non-finite element (`ALL_FINITE` off), that element passes only when matched exactly (a NaN, or the same infinity)
and the largest errors are over the elements both finite, the relative one over its finite values; an allowed error
of 0 (an exact result, every integer and bool output) passes an error of 0 only, and scales no error. bfloat16
outputs are read as their 16-bit patterns and widened by a shift (exact, and the same under Triton's interpreter,
which runs bfloat16 on raw integer storage), bool outputs as their bytes; integers widen to float64 as the host widens
them. This is not an oracle: the reference is the float64 oracle's, computed on the host.
"""

from __future__ import annotations

import numpy as np

from nbxcert.kernels.common import merge_dims
from nbxcert.kernels.compare import Judge, Verdict
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import cdiv
from nbxcert.kernels.tensor import Tensor, empty, from_numpy

BLOCK = 2048
KINDS = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")


@jit
def _judge_kernel(
    out_ptr,
    ref_ptr,
    allowed_ptr,
    stats_ptr,
    n,
    run,
    row_stride,
    BF16_BITS: tl.constexpr,
    ALL_FINITE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per program (BLOCK elements of the flat output): stats[pid] = (mismatched, max abs, max rel, max scaled).

    out_ptr: the output, contiguous (its 16-bit patterns when BF16_BITS; a bool output's bytes). ref_ptr, allowed_ptr:
    float64 reference and allowed error, same order. stats_ptr: float64 [programs, 4]. n: the element count. ROWS:
    the output lies in rows of `run` contiguous elements, `row_stride` elements apart (a view such as rope's q and k
    in a fused qkv buffer); else it is contiguous.
    ALL_FINITE: the reference has no non-finite element. An element whose reference is finite fails when it is not
    finite or |out - ref| > allowed; one whose reference is not finite fails unless it is the same infinity or both
    are NaN. The maxima are over the elements both finite (0 when none), the relative one over those whose
    reference is not 0; with a non-finite reference, an error or relative error that overflowed is left out of
    them, as the host's finite maxima leave it out; an allowed error of 0 scales nothing."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    at = offs
    if ROWS:
        at = (offs // run) * row_stride + offs % run
    if BF16_BITS:
        bits = tl.load(out_ptr + at, mask=inside, other=0).to(tl.int32) & 0xFFFF
        o = (bits << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        o = tl.load(out_ptr + at, mask=inside, other=0).to(tl.float64)
    r = tl.load(ref_ptr + offs, mask=inside, other=0.0)
    allowed = tl.load(allowed_ptr + offs, mask=inside, other=1.0)
    finite = (o == o) & (tl.abs(o) < float("inf"))
    err = tl.abs(o - r)
    if ALL_FINITE:
        ok = inside & finite
        bad = inside & ((finite == 0) | (err > allowed))
        counted = ok
    else:
        finite_ref = (r == r) & (tl.abs(r) < float("inf"))
        ok = inside & finite & finite_ref
        same = ((r != r) & (o != o)) | ((finite_ref == 0) & (r == r) & (o == r))
        bad = inside & tl.where(finite_ref, (finite == 0) | (err > allowed), same == 0)
        counted = ok & (err < float("inf"))
    rel = tl.where(ok & (r != 0.0), err / tl.where(r != 0.0, tl.abs(r), 1.0), 0.0)
    if not ALL_FINITE:
        rel = tl.where(rel < float("inf"), rel, 0.0)
    scaled = tl.where(ok & (allowed > 0.0), err / tl.where(allowed > 0.0, allowed, 1.0), 0.0)
    tl.store(stats_ptr + pid * 4, tl.sum(bad.to(tl.int32), axis=0).to(tl.float64))
    tl.store(stats_ptr + pid * 4 + 1, tl.max(tl.where(counted, err, 0.0), axis=0))
    tl.store(stats_ptr + pid * 4 + 2, tl.max(rel, axis=0))
    tl.store(stats_ptr + pid * 4 + 3, tl.max(scaled, axis=0))


def rows_of(tensor: Tensor) -> tuple[int, int] | None:
    """(run, row stride) in elements where `tensor`'s elements, in order, lie in rows of `run` contiguous elements
    `row_stride` apart (a contiguous tensor: one run of all, row stride the same); None for any other layout. Its
    dimensions merged (`merge_dims`) are at most two then: the rows, and the contiguous run along them."""
    sizes, (strides,) = merge_dims(tensor.shape, tensor.strides)
    if not sizes:
        return 1, 1
    if len(sizes) == 1:
        return (sizes[0], sizes[0]) if strides[0] == 1 else ((1, strides[0]) if strides[0] >= 1 else None)
    if len(sizes) == 2 and strides[1] == 1 and strides[0] >= sizes[1]:
        return sizes[1], strides[0]
    return None


def storage_order(tensor: Tensor) -> tuple[int, ...]:
    """`tensor`'s dimensions from the largest stride to the smallest: read in this order, a permuted dense layout (a
    channels-last output: N, H, W, C) is contiguous, and the reference is permuted alike."""
    return tuple(sorted(range(len(tensor.shape)), key=lambda d: (-tensor.strides[d], d)))


def _in_order(tensor: Tensor, order: tuple[int, ...], dtype=None) -> Tensor:
    """`tensor` with its dimensions in `order` (the same elements and bytes), read as `dtype` when given."""
    shape = tuple(tensor.shape[d] for d in order)
    strides = tuple(tensor.strides[d] for d in order)
    return Tensor(tensor.untyped_storage(), shape, strides, dtype or tensor.dtype, tensor.storage_offset())


def usable(judge: Judge, tensor: Tensor) -> bool:
    """Whether `DeviceJudge` judges this output (else the host does)."""
    return (
        judge.dtype.name in KINDS
        and tensor.dtype is judge.dtype
        and tuple(tensor.shape) == tuple(judge.ref.shape)
        and judge.ref.size > 0
        and rows_of(_in_order(tensor, storage_order(tensor))) is not None
    )


class DeviceJudge:
    """A `Judge` whose reference and allowed error live on `device`, uploaded once for each order an output's
    dimensions are read in (`storage_order`; one, for every check of a sweep)."""

    def __init__(self, judge: Judge, device):
        self.judge = judge
        self.device = device
        self._uploaded: dict[tuple[int, ...], tuple[Tensor, Tensor]] = {}

    def _reference(self, order: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        if order not in self._uploaded:
            ref, allowed = self.judge.ref, self.judge.allowed
            if order != tuple(range(ref.ndim)):
                ref, allowed = np.transpose(ref, order), np.transpose(allowed, order)
            self._uploaded[order] = tuple(
                from_numpy(np.ascontiguousarray(a).reshape(-1), "float64", self.device) for a in (ref, allowed)
            )
        return self._uploaded[order]

    def verdict_of(self, tensor: Tensor, context: str = "") -> Verdict:
        original = tensor
        n = tensor.numel
        programs = cdiv(n, BLOCK)
        stats = empty((programs, 4), "float64", self.device)
        bf16 = tensor.dtype.name == "bfloat16"
        order = storage_order(tensor)
        # the same bytes in storage order; bfloat16 and bool read as integers of their size
        tensor = _in_order(tensor, order, {"bfloat16": "int16", "bool": "uint8"}.get(tensor.dtype.name))
        ref, allowed = self._reference(order)
        run, row_stride = rows_of(tensor) or (n, n)
        _judge_kernel[(programs,)](
            tensor,
            ref,
            allowed,
            stats,
            n,
            run,
            row_stride,
            BF16_BITS=bf16,
            ALL_FINITE=self.judge.all_finite,
            ROWS=run != n,
            BLOCK=BLOCK,
        )
        s = stats.numpy()
        if int(s[:, 0].sum()):
            return self.judge.verdict_of(original, context)  # the host says which elements, with its report
        j = self.judge
        return Verdict(True, 0, n, float(s[:, 1].max()), float(s[:, 2].max()), float(s[:, 3].max()), "", j.tol)


settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
