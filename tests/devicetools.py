"""Tensors made where the kernels run: `from_numpy` and `empty` on the backend's device (the interpreter's cpu in CI,
the GPU on a GPU machine), so a test written once runs on both."""

from __future__ import annotations

from nbxcert.kernels.backends import select
from nbxcert.kernels.tensor import empty as _empty
from nbxcert.kernels.tensor import from_numpy as _from_numpy

DEVICE = select().device


def from_numpy(array, dtype=None, device=None):
    return _from_numpy(array, dtype, device or DEVICE)


def empty(shape, dtype, device=None):
    return _empty(shape, dtype, device or DEVICE)
