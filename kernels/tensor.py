"""nbxcert's torch-free tensor: what every kernel launch receives.

A `Tensor` is a typed, strided view (shape, strides in elements, storage offset) of an untyped `Storage` that lives
on `cpu` (a numpy byte buffer) or on `cuda:N` (a libcuda allocation). Triton accepts it directly: it exposes
`data_ptr()` and a `dtype` whose `str()` Triton's specializer maps. Under Triton's interpreter the tensor also answers
the few storage calls the interpreter makes (`untyped_storage`, `new_empty`, `set_`, `storage_offset`, `size`,
`stride`, `copy_`), so a CPU tensor is handed to the interpreter with no copy.

Other libraries read a tensor without a copy through DLPack (`__dlpack__`, `__dlpack_device__`: what the
`from_dlpack` of torch, CuPy, JAX and numpy call) and, on a GPU, the CUDA array interface (numba, CuPy);
`from_dlpack` views their tensors as nbxcert tensors the same way, keeping the producer's memory alive for as long as
a view of it lives.
"""

from __future__ import annotations

import ctypes
import gc
import math
import operator
import os
import sys
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbxcert.errors import DeviceNotFound, DTypeError, ShapeMismatch, UsageError, ViewError
from nbxcert.kernels import dtypes as _dt
from nbxcert.kernels import recording as _recording
from nbxcert.kernels.dtypes import DType, get_dtype

_HOST_ALIGN = 128  # bytes; Triton specializes pointers on 16-byte divisibility, vector loads like wider


@dataclass(frozen=True)
class Device:
    """`cpu` or `cuda:N`."""

    type: str
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"{self.type}:{self.index}"


def as_device(device: str | Device) -> Device:
    """Parse `cpu`, `cuda`, `cuda:N`; anything else, or a CUDA device this machine lacks, is `DeviceNotFound`."""
    if isinstance(device, Device):
        return device
    text = str(device).strip()
    if text == "cpu":
        return Device("cpu", 0)
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text[5:] if text.startswith("cuda:") else "0"
        if not index_text.isdigit():
            raise DeviceNotFound(f"device '{device}' is not a device name (expected cpu, cuda or cuda:N)")
        return Device("cuda", int(index_text))
    raise DeviceNotFound(f"device '{device}' is not a device name (expected cpu, cuda or cuda:N)")


_CUDA_MODULE = None
_MEMORY_MODULE = None


def _cuda():
    global _CUDA_MODULE, _MEMORY_MODULE
    if _CUDA_MODULE is None:  # imported when first needed (a cpu-only process never loads it); kept, as it is per call
        from nbxcert.kernels.backends import cuda, memory

        _CUDA_MODULE, _MEMORY_MODULE = cuda, memory
    return _CUDA_MODULE


def _check_cuda_device(device: Device) -> None:
    ok, reason = _cuda().device_present(device.index)
    if not ok:
        raise DeviceNotFound(f"device '{device}' does not exist: {reason}")


class Storage:
    """An untyped, contiguous block of bytes on one device."""

    # slots: a served call makes one per output, and a replay in C (launcher.c) sets them without a dict
    __slots__ = ("device", "nbytes", "_host", "_host_ptr", "_alloc", "__weakref__")

    def __init__(self, nbytes: int, device: str | Device):
        self.device = as_device(device)
        self.nbytes = int(nbytes)
        if self.device.type == "cpu":
            raw = np.empty(self.nbytes + _HOST_ALIGN, dtype=np.uint8)
            start = (-raw.ctypes.data) % _HOST_ALIGN
            self._host = raw[start : start + self.nbytes]
            self._host_ptr = self._host.ctypes.data  # fixed for the array's life; read per launch
            self._alloc = None
        else:
            _check_cuda_device(self.device)
            cuda = _cuda()
            cuda.make_current(self.device.index)
            self._host = None
            self._alloc = _MEMORY_MODULE.pool_alloc(max(self.nbytes, 1), self.device.index)
        _recording.storage_made(self)

    @classmethod
    def fresh(cls, nbytes: int, device: Device) -> Storage:
        """A storage as `Storage(nbytes, device)` makes it, for a device already checked (a launch plan's replay makes
        the storages its record made: no device check, no record)."""
        if device.type == "cpu":
            return cls(nbytes, device)
        self = cls.__new__(cls)
        self.device, self.nbytes, self._host = device, nbytes, None
        cuda = _CUDA_MODULE or _cuda()
        index = device.index
        cuda.make_current(index)
        self._alloc = _MEMORY_MODULE.pool_block(nbytes or 1, index)
        return self

    @classmethod
    def over(cls, owner: Any, nbytes: int, device: str | Device) -> Storage:
        """A storage over `nbytes` of device memory that `owner` (anything with a `ptr`) holds; kept alive by it."""
        self = cls.__new__(cls)
        self.device, self.nbytes, self._host, self._alloc = as_device(device), int(nbytes), None, owner
        return self

    @classmethod
    def over_host(cls, host: np.ndarray) -> Storage:
        """A cpu storage over `host`, a uint8 array over memory another library owns (kept alive through the array)."""
        self = cls.__new__(cls)
        self.device, self.nbytes, self._alloc = Device("cpu", 0), int(host.size), None
        self._host, self._host_ptr = host, host.ctypes.data
        return self

    def data_ptr(self) -> int:
        return self._host_ptr if self._alloc is None else self._alloc.ptr

    def host_bytes(self) -> np.ndarray:
        """The bytes of this storage as a uint8 array: the buffer itself on cpu, a fresh copy from a GPU."""
        if self._alloc is None:
            return self._host
        out = np.empty(self.nbytes, dtype=np.uint8)
        if self.nbytes:
            _cuda().memcpy_dtoh(out, self.data_ptr(), self.nbytes)
        return out

    def write_bytes(self, data: np.ndarray, byte_offset: int = 0) -> None:
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if byte_offset < 0 or byte_offset + data.size > self.nbytes:
            raise ViewError(f"write of {data.size} bytes at {byte_offset} exceeds a storage of {self.nbytes} bytes")
        if self._alloc is None:
            self._host[byte_offset : byte_offset + data.size] = data
        elif data.size:
            _cuda().memcpy_htod(self.data_ptr() + byte_offset, data, data.size)

    # the interpreter's storage protocol
    def cpu(self) -> Storage:
        if self._alloc is None:
            return self
        copy = Storage(self.nbytes, "cpu")
        copy._host[:] = self.host_bytes()
        return copy

    def copy_(self, other: Storage) -> Storage:
        if other is self:
            return self
        if other.nbytes != self.nbytes:
            raise ShapeMismatch(f"storage copy between {other.nbytes} and {self.nbytes} bytes")
        if self._alloc is not None and other._alloc is not None:
            _cuda().memcpy_dtod(self.data_ptr(), other.data_ptr(), self.nbytes)
        else:
            self.write_bytes(other.host_bytes())
        return self


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _check_shape(shape: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(map(int, shape))
    if shape and min(shape) < 0:
        raise ViewError(f"shape {shape} has a negative size")
    return shape


class Tensor:
    """A strided view of a `Storage`. Strides and offsets count elements, as in torch and Triton."""

    def __init__(self, storage: Storage, shape, strides, dtype: DType | str, offset: int = 0):
        # made for every view, so on a served launch's path: written for the host's time (bench_dispatch.py measures it)
        self._storage = storage
        self._ptr = None  # the address, found at the first `data_ptr` (a storage's address is fixed for its life)
        self._key = None  # what a launch plan's signature holds of this view (`launch.tensor_key`), made once
        self.shape = shape = _check_shape(shape)
        self._strides = strides = tuple(map(int, strides))
        self.dtype = dtype = dtype if type(dtype) is DType else get_dtype(dtype)
        self._offset = offset = int(offset)
        if len(strides) != len(shape):
            raise ViewError(f"shape {shape} and strides {strides} differ in rank")
        if 0 in shape:
            return  # no element: nothing is read, whatever the offset
        lo, hi = self.span()
        if lo < 0 or hi > storage.nbytes:
            raise ViewError(
                f"view shape={self.shape} strides={self._strides} offset={self._offset} reaches bytes "
                f"[{lo}, {hi}) of a storage of {storage.nbytes} bytes"
            )

    @classmethod
    def trusted(cls, storage: Storage, shape: tuple, strides: tuple, dtype: DType, offset: int) -> Tensor:
        """A view whose shape, strides, dtype and offset are known to fit `storage` (a launch plan rebuilding the
        result its record made): the constructor's checks are skipped."""
        self = cls.__new__(cls)
        self._storage, self._ptr, self._key, self._offset = storage, None, None, offset
        self.shape, self._strides, self.dtype = shape, strides, dtype
        return self

    # --- properties ---------------------------------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        return self._storage.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        return self._strides

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    def storage_offset(self) -> int:
        return self._offset

    def data_ptr(self) -> int:
        # read for every pointer argument of every launch (Triton's launcher, a plan's signature): several times a
        # served call, so found once; the tensor holds its storage, whose memory is freed only after it is collected
        ptr = self._ptr
        if ptr is None:
            ptr = self._ptr = self._storage.data_ptr() + self._offset * self.dtype.itemsize
        return ptr

    def untyped_storage(self) -> Storage:
        return self._storage

    def is_contiguous(self) -> bool:
        step = 1  # on a served call's path (a new result's layout, the key's): one pass, innermost first
        for n, s in zip(reversed(self.shape), reversed(self._strides), strict=True):
            if n != 1 and s != step:
                return False
            step *= max(n, 1)
        return True

    def span(self) -> tuple[int, int]:
        """[first byte, one past the last byte) this view touches in its storage."""
        item = self.dtype.itemsize
        lo = hi = self._offset
        if 0 in self.shape:
            return (lo * item, lo * item)
        for n, st in zip(self.shape, self._strides, strict=False):  # one pass: every view's constructor calls this
            if st > 0:
                hi += st * (n - 1)
            elif st < 0:
                lo += st * (n - 1)
        return lo * item, (hi + 1) * item

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, strides={self._strides}, dtype={self.dtype.name}, device={self.device})"

    # --- host access --------------------------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The values in their numpy storage type (raw bits for bfloat16/float8): a view on cpu, a copy from a GPU."""
        lo, hi = self.span()
        if self.device.type == "cpu":
            _recording.host_work("a host read of a tensor's values")
            buf = self._storage._host
            base = 0
        else:
            buf = np.empty(hi - lo, dtype=np.uint8)
            if hi > lo:
                _cuda().memcpy_dtoh(buf, self._storage.data_ptr() + lo, hi - lo)
            base = lo
        storage_dtype = np.dtype(self.dtype.storage)
        return np.ndarray(
            self.shape,
            dtype=storage_dtype,
            buffer=buf,
            offset=self._offset * self.itemsize - base,
            strides=tuple(s * self.itemsize for s in self._strides),
        )

    def float64(self) -> np.ndarray:
        """The values as float64 (exact for every float dtype), a fresh array."""
        return _dt.decode(self.numpy(), self.dtype)

    # --- views --------------------------------------------------------------------------------------------------------
    def _view(self, shape, strides, offset=None) -> Tensor:
        return Tensor(self._storage, shape, strides, self.dtype, self._offset if offset is None else offset)

    def view(self, *shape) -> Tensor:
        """The same elements in another shape, without a copy; `ViewError` where the strides cannot express it."""
        shape = self._infer_shape(shape)
        strides = _view_strides(self.shape, self._strides, shape)
        if strides is None:
            raise ViewError(
                f"view of shape={self.shape} strides={self._strides} as {shape} needs a copy; "
                "use reshape() (which copies) or contiguous() first"
            )
        return self._view(shape, strides)

    def reshape(self, *shape) -> Tensor:
        """Like `view`, but copies when the strides cannot express the new shape (as torch does)."""
        shape = self._infer_shape(shape)
        strides = _view_strides(self.shape, self._strides, shape)
        if strides is None:
            return self.contiguous().view(shape)
        return self._view(shape, strides)

    def _infer_shape(self, shape) -> tuple[int, ...]:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = [int(n) for n in shape]
        if shape.count(-1) > 1:
            raise ViewError(f"shape {tuple(shape)} has more than one -1")
        if -1 in shape:
            rest = math.prod(n for n in shape if n != -1)
            if rest == 0 or self.numel % rest:
                raise ViewError(f"cannot infer -1 in {tuple(shape)} for {self.numel} elements")
            shape[shape.index(-1)] = self.numel // rest
        shape = _check_shape(shape)
        if math.prod(shape) != self.numel:
            raise ViewError(f"shape {shape} holds {math.prod(shape)} elements, the tensor has {self.numel}")
        return shape

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        d0, d1 = self._dim(dim0), self._dim(dim1)
        shape, strides = list(self.shape), list(self._strides)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return self._view(shape, strides)

    @property
    def T(self) -> Tensor:
        if self.ndim != 2:
            raise ViewError(f".T needs a 2-d tensor, this one has shape {self.shape}")
        return self.transpose(0, 1)

    def permute(self, *dims) -> Tensor:
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        dims = tuple(self._dim(d) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ViewError(f"permute({dims}) is not a permutation of the {self.ndim} dimensions")
        return self._view([self.shape[d] for d in dims], [self._strides[d] for d in dims])

    def expand(self, *shape) -> Tensor:
        """Broadcast size-1 dimensions (stride 0) to `shape`, without a copy."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if len(shape) < self.ndim:
            raise ViewError(f"expand to {tuple(shape)} has fewer dimensions than {self.shape}")
        lead = len(shape) - self.ndim
        new_shape, new_strides = list(shape[:lead]), [0] * lead
        for n_old, s_old, n_new in zip(self.shape, self._strides, shape[lead:], strict=False):
            if n_new == -1 or n_new == n_old:
                new_shape.append(n_old)
                new_strides.append(s_old)
            elif n_old == 1:
                new_shape.append(n_new)
                new_strides.append(0)
            else:
                raise ViewError(f"cannot expand size {n_old} to {n_new} (shape {self.shape} -> {tuple(shape)})")
        return self._view(new_shape, new_strides)

    def unsqueeze(self, dim: int) -> Tensor:
        dim = dim if dim >= 0 else dim + self.ndim + 1
        if not 0 <= dim <= self.ndim:
            raise ViewError(f"unsqueeze({dim}) out of range for a {self.ndim}-d tensor")
        shape, strides = list(self.shape), list(self._strides)
        shape.insert(dim, 1)
        strides.insert(dim, strides[dim] * shape[dim + 1] if dim < self.ndim else 1)
        return self._view(shape, strides)

    def __getitem__(self, index) -> Tensor:
        """Basic indexing: ints, slices with a positive step, `None` and `...`. Never a copy."""
        if not isinstance(index, tuple):
            index = (index,)
        if index.count(Ellipsis) > 1:
            raise ViewError("an index can hold one ellipsis")
        if Ellipsis in index:
            at = index.index(Ellipsis)
            n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
            index = index[:at] + (slice(None),) * (self.ndim - n_real) + index[at + 1 :]
        shape, strides, offset, dim = [], [], self._offset, 0
        for item in index:
            if item is None:
                shape.append(1)
                strides.append(0)
                continue
            if dim >= self.ndim:
                raise ViewError(f"too many indices for a tensor of shape {self.shape}")
            n, s = self.shape[dim], self._strides[dim]
            if isinstance(item, (int, np.integer)):
                i = int(item) + (n if item < 0 else 0)
                if not 0 <= i < n:
                    raise ViewError(f"index {item} out of range for dimension {dim} of size {n}")
                offset += i * s
            elif isinstance(item, slice):
                start, stop, step = item.indices(n)
                if step <= 0:
                    raise ViewError(f"slice step {step} is not positive (negative strides are not views here)")
                length = max(0, (stop - start + step - 1) // step)
                offset += start * s if length else 0
                shape.append(length)
                strides.append(s * step)
            else:
                raise ViewError(f"index of type {type(item).__name__} is not supported (ints, slices, None, ...)")
            dim += 1
        shape += self.shape[dim:]
        strides += self._strides[dim:]
        return self._view(shape, strides, offset)

    def _dim(self, d: int) -> int:
        if not -self.ndim <= d < self.ndim:
            raise ViewError(f"dimension {d} out of range for a {self.ndim}-d tensor")
        return d % self.ndim

    # --- copies -------------------------------------------------------------------------------------------------------
    def contiguous(self) -> Tensor:
        if self.is_contiguous() and self._offset == 0:
            return self
        out = empty(self.shape, self.dtype, self.device)
        out.copy_(self)
        return out

    def clone(self) -> Tensor:
        out = empty(self.shape, self.dtype, self.device)
        out.copy_(self)
        return out

    def to(self, device: str | Device) -> Tensor:
        device = as_device(device)
        if device == self.device:
            return self
        out = empty(self.shape, self.dtype, device)
        out.copy_(self)
        return out

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def copy_(self, src: Tensor) -> Tensor:
        """Copy `src`'s elements into this view (same shape, same dtype; any devices, any strides)."""
        if not isinstance(src, Tensor):
            raise ShapeMismatch(f"copy_ takes a Tensor, got {type(src).__name__}")
        if src.shape != self.shape:
            raise ShapeMismatch(f"copy_ between shapes {src.shape} and {self.shape}")
        if src.dtype is not self.dtype:
            raise ShapeMismatch(f"copy_ between dtypes {src.dtype.name} and {self.dtype.name}; cast first")
        if self.numel == 0:
            return self
        both_dense = self.is_contiguous() and src.is_contiguous()
        if both_dense and self.device.type == "cuda" and src.device.type == "cuda":
            _cuda().memcpy_dtod(self.data_ptr(), src.data_ptr(), self.nbytes)
        elif both_dense and self.device.type == "cuda":
            self._storage.write_bytes(np.ascontiguousarray(src.numpy()), self._offset * self.itemsize)
        else:
            self.write_host(np.ascontiguousarray(src.numpy()))
        return self

    def write_host(self, values: np.ndarray) -> None:
        """Write values (storage dtype, this view's shape) into this view through the host."""
        if self.device.type == "cpu":
            self.numpy()[...] = values
            return
        lo, hi = self.span()
        window = Tensor(self._storage, self.shape, self._strides, self.dtype, self._offset)
        host = window.numpy()  # a host copy of exactly the span [lo, hi)
        host[...] = values
        self._storage.write_bytes(host.base if host.base is not None else host, lo)

    def fill_(self, value: float) -> Tensor:
        self.write_host(np.broadcast_to(_dt.encode(np.array(value), self.dtype), self.shape))
        return self

    # --- the interpreter's tensor protocol ----------------------------------------------------------------------------
    def new_empty(self, size, device="cpu") -> Tensor:
        size = (size,) if isinstance(size, int) else tuple(size)
        return empty(size, self.dtype, device)

    def set_(self, storage: Storage, offset: int, size, stride) -> Tensor:
        self._storage, self._offset, self._ptr, self._key = storage, int(offset), None, None
        self.shape, self._strides = tuple(size), tuple(stride)
        return self

    # --- DLPack and the CUDA array interface --------------------------------------------------------------------------
    def __dlpack_device__(self) -> tuple[int, int]:
        """(DLPack device type, index): (1, 0) on the cpu, (2, N) on cuda:N."""
        device = self._storage.device
        return (_KDL_CPU, 0) if device.type == "cpu" else (_KDL_CUDA, device.index)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """This view as a DLPack capsule, without a copy: what `from_dlpack` of torch, CuPy, JAX and numpy calls.

        A consumer whose `max_version` is (1, 0) or newer gets a "dltensor_versioned" capsule, an older one a
        "dltensor" capsule; strides count elements and the view's offset is in the data pointer (byte_offset 0). On a
        GPU, `stream` is the consumer's: 1 the legacy default stream, 2 the per-thread default, another int a
        CUstream, None taken as 1 (as the array API standard says), -1 no ordering. The work queued so far on nbxcert's
        stream is made to come before the consumer's (an event it waits on; the host does not wait). `copy=True`
        exports a copy, `dl_device=(1, 0)` a host copy of a GPU tensor; `copy=False` refuses any copy (BufferError).
        The tensor stays alive until its consumer is done with it. bool is DLPack's kDLBool; float8 needs a consumer
        of DLPack 1.1 or newer, which has its codes (DTypeError otherwise)."""
        return _export_dlpack(self, stream, max_version, dl_device, copy)

    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface (version 3) of a GPU tensor, for numba and CuPy: shape, typestr, data (pointer,
        writable), strides in bytes (None when C-contiguous) and the stream to synchronise on (nbxcert's current one;
        the legacy default stream reads 1, as the interface asks). A cpu tensor has none (AttributeError, so `hasattr`
        is False); bfloat16 and float8 have no typestr there (DTypeError: export them with DLPack)."""
        return _cuda_array_interface(self)


def _view_strides(old_shape, old_strides, new_shape) -> tuple[int, ...] | None:
    """Strides that let `new_shape` view the same elements, or None when a copy is needed.

    Walks the old dimensions from the innermost, grouping runs that are contiguous among themselves ("chunks"); the
    new dimensions must split each chunk exactly, and inherit its base stride."""
    if math.prod(old_shape) == 0:
        return _contiguous_strides(new_shape)
    old_shape, old_strides = (tuple(old_shape), tuple(old_strides)) if old_shape else ((1,), (1,))
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_stride = old_strides[-1]
    old_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        old_numel *= old_shape[d]
        chunk_ends = d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != old_numel * chunk_stride)
        if not chunk_ends:
            continue
        while view_d >= 0 and (view_numel < old_numel or new_shape[view_d] == 1):
            new_strides[view_d] = view_numel * chunk_stride
            view_numel *= new_shape[view_d]
            view_d -= 1
        if view_numel != old_numel:
            return None
        if d > 0:
            chunk_stride = old_strides[d - 1]
            old_numel = view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


# --- constructors -----------------------------------------------------------------------------------------------------
def empty(shape, dtype: DType | str, device: str | Device = "cpu") -> Tensor:
    shape = _check_shape((shape,) if isinstance(shape, int) else shape)
    dtype = get_dtype(dtype)
    storage = Storage(math.prod(shape) * dtype.itemsize, device)
    return Tensor(storage, shape, _contiguous_strides(shape), dtype)


def full(shape, value: float, dtype: DType | str, device: str | Device = "cpu") -> Tensor:
    return empty(shape, dtype, device).fill_(value)


def zeros(shape, dtype: DType | str, device: str | Device = "cpu") -> Tensor:
    """A new tensor of zeros. On a GPU the fill is queued on the current stream (ordered with the launches after it;
    the host does not wait)."""
    t = empty(shape, dtype, device)
    zero_fill(t._storage, t._storage.nbytes)
    _recording.zeroed(t._storage)
    return t


def zero_fill(storage: Storage, nbytes: int) -> None:
    """Zero the first `nbytes` of `storage`: a memset queued on the current stream on a GPU, in place on the CPU."""
    if not nbytes:
        return
    if storage._alloc is None:
        storage._host[:nbytes] = 0
        return
    cuda = _cuda()
    cuda.memset_d8_async(storage.data_ptr(), 0, nbytes, cuda.current_stream(storage.device.index))


def from_numpy(array, dtype: DType | str | None = None, device: str | Device = "cpu") -> Tensor:
    """A new tensor holding `array`'s values. With `dtype`, values are rounded once (nearest-even) into it; without,
    the numpy dtype must be one nbxcert has (bfloat16/float8 need `dtype`, since numpy has no such type)."""
    array = np.asarray(array)
    dtype = _dt.from_numpy_dtype(array.dtype) if dtype is None else get_dtype(dtype)
    stored = np.ascontiguousarray(_dt.encode(array, dtype))
    t = empty(array.shape, dtype, device)
    if t.numel:
        t._storage.write_bytes(stored)
    return t


def from_bits(bits: np.ndarray, dtype: DType | str, device: str | Device = "cpu") -> Tensor:
    """A new tensor whose storage holds `bits` as they are (for bfloat16/float8 raw patterns)."""
    dtype = get_dtype(dtype)
    bits = np.ascontiguousarray(bits, dtype=dtype.storage)
    t = empty(bits.shape, dtype, device)
    if t.numel:
        t._storage.write_bytes(bits)
    return t


# --- DLPack and the CUDA array interface ------------------------------------------------------------------------------
# The structs of dlpack.h (version 1.1). A struct's deleter is held as a raw function address.
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST = 1, 2, 3
_DL_READ_ONLY, _DL_IS_COPIED = 1, 2  # DLManagedTensorVersioned.flags bits
_DLPACK_VERSION = (1, 1)  # the newest DLPack nbxcert reads and writes (1.1 added the float8 codes)
_DL_CODES = {  # nbxcert dtype -> DLPack (type code, bits)
    _dt.int8: (0, 8),
    _dt.int16: (0, 16),
    _dt.int32: (0, 32),
    _dt.int64: (0, 64),
    _dt.uint8: (1, 8),
    _dt.float16: (2, 16),
    _dt.float32: (2, 32),
    _dt.float64: (2, 64),
    _dt.bfloat16: (4, 16),
    _dt.bool_: (6, 8),  # kDLBool (DLPack 0.8)
    _dt.float8_e4m3fn: (10, 8),  # kDLFloat8_e4m3fn (DLPack 1.1)
    _dt.float8_e5m2: (12, 8),  # kDLFloat8_e5m2 (DLPack 1.1)
}
_FROM_DL = {code_bits: dtype for dtype, code_bits in _DL_CODES.items()}
_DL_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex", 6: "bool"}
_DL_CODE_NAMES.update({7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz", 10: "float8_e4m3fn"})
_DL_CODE_NAMES.update({11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz", 14: "float8_e8m0fnu"})
_DL_CODE_NAMES.update({15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn"})


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),  # DLPackVersion
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


class _NotExportable(DTypeError, BufferError):
    """A dtype an interchange format cannot carry: a DTypeError, and the BufferError DLPack's protocol names."""


# The Python C API, through prototypes of nbxcert's own (ctypes.pythonapi's shared function objects stay untouched)
_py = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", _py)
)
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", _py))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", _py))
_capsule_rename = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(("PyCapsule_SetName", _py))
_raw_malloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)(("PyMem_RawMalloc", _py))
_raw_free = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("PyMem_RawFree", _py))
_Deleter = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)  # a producer's deleter, called with the GIL held


def _static_name(text: bytes) -> int:
    """The address of a NUL-terminated copy of `text` that is never freed: a capsule keeps the address of its name,
    and may outlive this module."""
    address = _raw_malloc(len(text) + 1)
    if not address:
        raise MemoryError("no memory for a DLPack capsule name")
    ctypes.memmove(address, text + b"\0", len(text) + 1)
    return address


_NAMES = {name: _static_name(name) for name in (b"dltensor", b"dltensor_versioned")}
_NAMES.update({b"used_" + name: _static_name(b"used_" + name) for name in (b"dltensor", b"dltensor_versioned")})


# What an export keeps alive, and how it learns that its consumer is done. The deleter a consumer calls must be C
# code: a Python callback (a ctypes thunk) that a consumer runs while an exception is in flight, as a temporary array
# freed during unwinding does, turns that exception into a SystemError and crashes the interpreter. So the deleter is
# libc's `time(time_t *)`, which writes the clock into the struct's first 8 bytes (its data pointer or version, which
# the consumer no longer reads), from any thread, with or without the GIL: a mark that `_sweep_exports` reads. The
# capsule has no destructor, for the same reason; the registry holds it, and one that nothing else holds any more was
# either consumed (the mark will come) or dropped unconsumed (released at once).
class _Export:
    __slots__ = ("tensor", "capsule", "name", "first_word")

    def __init__(self, tensor: Tensor, capsule: Any, name: bytes, first_word: int):
        self.tensor, self.capsule, self.name, self.first_word = tensor, capsule, name, first_word


_EXPORTS: dict[int, _Export] = {}  # address of an exported struct (its own raw allocation) -> what it keeps alive
_MARK: list[int] = []  # the address of libc's time(), found on the first export


def _mark_function() -> int:
    if not _MARK:
        libc = ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(None)
        _MARK.append(ctypes.cast(libc.time, ctypes.c_void_p).value)
        gc.callbacks.append(_sweep_after_gc)  # memory given back by a consumer is released at the next collection
    return _MARK[0]


def _sweep_exports() -> None:
    """Release what each finished export kept: those whose consumer called the deleter, and those whose capsule was
    dropped unconsumed."""
    for address, export in list(_EXPORTS.items()):
        if ctypes.c_uint64.from_address(address).value == export.first_word:  # no mark: the deleter was not called
            if export.capsule is None or sys.getrefcount(export.capsule) > 2:  # 2: the registry's and the argument
                continue
            if not _capsule_is_valid(export.capsule, export.name):  # consumed (renamed): wait for the deleter
                export.capsule = None
                continue
        if _EXPORTS.pop(address, None) is not None:
            _raw_free(address)


def _sweep_after_gc(phase: str, info: dict) -> None:
    if phase == "stop" and _EXPORTS:
        _sweep_exports()


def _dlpack_stream(stream: Any) -> int | None:
    """A DLPack/CUDA-array-interface stream number as a CUstream handle (1 -> 0, the legacy default stream; 2 stays
    CU_STREAM_PER_THREAD), None for -1 (no ordering). 0 is refused: the protocols disallow it as ambiguous."""
    try:
        number = operator.index(stream)
    except TypeError:
        number = None
    if number is None or number == 0 or number < -1:
        raise UsageError(
            f"stream {stream!r} is not a DLPack stream number",
            hint="give 1 (legacy default), 2 (per-thread default), a CUstream handle, or -1 (no ordering)",
        )
    return None if number == -1 else (0 if number == 1 else number)


def _order_streams(first: int, then: int, index: int) -> None:
    """Make the work queued on stream `then` from now on wait for the work queued so far on `first` (device `index`;
    an event, no host wait)."""
    if first == then:
        return
    cuda = _cuda()
    event = cuda.Event(index)
    event.record(first)
    cuda.stream_wait_event(then, event)


def _export_dlpack(tensor: Tensor, stream: Any, max_version: Any, dl_device: Any, copy: bool | None) -> Any:
    if _EXPORTS:
        _sweep_exports()
    versioned, minor = False, 0
    if max_version is not None:
        major, asked_minor = (int(v) for v in max_version)
        versioned = major >= 1
        minor = 1 if (major, asked_minor) >= _DLPACK_VERSION else 0
    if tensor.dtype.name.startswith("float8") and minor < 1:
        raise _NotExportable(
            f"a {tensor.dtype.name} tensor needs DLPack 1.1 (its float8 codes); the consumer reads DLPack "
            f"{'.'.join(map(str, max_version)) if max_version is not None else '0.x'}",
            hint="upgrade the consumer (torch, CuPy, JAX), or convert the tensor to another dtype first",
        )
    target = tensor.__dlpack_device__() if dl_device is None else tuple(int(v) for v in dl_device)
    if target[0] == _KDL_CPU and stream not in (None, -1):
        raise UsageError(f"stream={stream!r} for a DLPack export to the cpu", hint="give stream=None on the cpu")
    copied = False
    if target != tensor.__dlpack_device__():
        if target != (_KDL_CPU, 0) or copy is False:
            why = "without a copy (copy=False)" if target == (_KDL_CPU, 0) else "to that device"
            raise BufferError(f"a {tensor.device} tensor cannot be exported to DLPack device {target} {why}")
        tensor, copied = tensor.to("cpu"), True  # a host copy: complete when it returns
    elif copy:
        tensor, copied = tensor.clone(), True
    if tensor.device.type == "cuda":
        consumer = _dlpack_stream(1 if stream is None else stream)
        if consumer is not None:
            index = tensor.device.index
            _order_streams(_cuda().current_stream(index), consumer, index)

    code, bits = _DL_CODES[tensor.dtype]
    ndim = tensor.ndim
    struct = _DLManagedTensorVersioned if versioned else _DLManagedTensor
    head = ctypes.sizeof(struct)  # a multiple of 8: the int64 shape and strides follow in the same allocation
    address = _raw_malloc(head + 16 * ndim)
    if not address:
        raise MemoryError(f"no memory for a DLPack struct of a {ndim}-d tensor")
    ctypes.memset(address, 0, head)
    managed = struct.from_address(address)
    dims = (ctypes.c_int64 * (2 * ndim)).from_address(address + head)
    dims[:] = tensor.shape + tensor._strides
    dl = managed.dl_tensor
    dl.data = tensor.data_ptr()
    dl.device.device_type, dl.device.device_id = tensor.__dlpack_device__()
    dl.ndim = ndim
    dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = code, bits, 1
    if ndim:
        dl.shape = ctypes.cast(address + head, ctypes.POINTER(ctypes.c_int64))
        dl.strides = ctypes.cast(address + head + 8 * ndim, ctypes.POINTER(ctypes.c_int64))
    managed.deleter = _mark_function()
    if versioned:
        managed.major, managed.minor = 1, minor
        managed.flags = _DL_IS_COPIED if copied else 0
    name = b"dltensor_versioned" if versioned else b"dltensor"
    try:
        capsule = _capsule_new(address, _NAMES[name], None)
    except BaseException:
        _raw_free(address)
        raise
    _EXPORTS[address] = _Export(tensor, capsule, name, ctypes.c_uint64.from_address(address).value)
    return capsule


def _cuda_array_interface(tensor: Tensor) -> dict:
    device = tensor._storage.device
    if device.type != "cuda":
        raise AttributeError(
            f"a {device} tensor has no __cuda_array_interface__ (it describes GPU memory); use __dlpack__ or numpy()"
        )
    if tensor.dtype.is_raw_bits:
        raise _NotExportable(
            f"{tensor.dtype.name} has no typestr in the CUDA array interface",
            hint="export it with DLPack (torch.from_dlpack / cupy.from_dlpack read it), or convert it first",
        )
    handle = _cuda().current_stream(device.index)
    item = tensor.dtype.itemsize
    return {
        "shape": tensor.shape,
        "typestr": np.dtype(tensor.dtype.storage).str,
        "data": (tensor.data_ptr() if tensor.numel else 0, False),
        "strides": None if tensor.is_contiguous() else tuple(s * item for s in tensor._strides),
        "version": 3,
        "stream": 1 if handle == 0 else handle,  # 0 is disallowed: the legacy default stream is 1
    }


class _Imported:
    """Memory another library owns, as the owner of the storage that views it: `ptr` is its first byte. Kept alive
    by the storage; when the storage goes, the producer's deleter runs (DLPack), or `keep` (the CUDA array interface's
    exporter) is let go."""

    def __init__(self, ptr: int, nbytes: int, keep: Any = None):
        self.ptr, self.nbytes, self.keep = ptr, nbytes, keep


def _release_import(deleter: int, address: int) -> None:
    _Deleter(deleter)(address)


def _dtype_of_dl(code: int, bits: int, lanes: int) -> DType:
    dtype = _FROM_DL.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        what = f"{_DL_CODE_NAMES.get(code, f'type code {code}')} of {bits} bits" + (f" x{lanes}" if lanes != 1 else "")
        known = ", ".join(d.name for d in _DL_CODES)
        raise DTypeError(f"a DLPack tensor of {what} has no nbxcert dtype; nbxcert reads {known}")
    return dtype


def _view_of(ptr: int, shape: tuple, strides: tuple, dtype: DType, device: Device, owner: _Imported) -> Tensor:
    """A tensor over `owner`'s memory: its storage spans the smallest byte range that holds every element."""
    if len(strides) != len(shape):
        raise ViewError(f"a foreign tensor of shape {shape} has strides {strides}: they differ in rank")
    if any(s < 0 for n, s in zip(shape, strides, strict=True) if n > 1):
        raise ViewError(
            f"a foreign tensor with strides {strides} runs backwards (a negative stride); nbxcert views do not",
            hint="make it contiguous in its own library first (x.contiguous(), np.ascontiguousarray(x))",
        )
    reach = sum((n - 1) * max(s, 0) for n, s in zip(shape, strides, strict=True))
    nbytes = 0 if 0 in shape else (reach + 1) * dtype.itemsize
    owner.nbytes = nbytes
    if device.type == "cpu":
        owner.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
        storage = Storage.over_host(np.asarray(owner))  # the array's base is the owner
    else:
        storage = Storage.over(owner, nbytes, device)
    return Tensor(storage, shape, strides, dtype, 0)


def _consume_capsule(capsule: Any) -> Tensor:
    """A tensor over a DLPack capsule's memory; the capsule is renamed "used_..." (consumed), and the producer's
    deleter runs when nbxcert's last view of the memory is dropped."""
    if _capsule_is_valid(capsule, b"dltensor_versioned"):
        address = _capsule_pointer(capsule, b"dltensor_versioned")
        managed = _DLManagedTensorVersioned.from_address(address)
        if managed.major != 1:
            raise UsageError(
                f"the DLPack capsule holds a DLPack {managed.major}.{managed.minor} tensor; nbxcert reads 1.x",
                hint="ask the producer for an older DLPack (x.__dlpack__(max_version=(1, 0)))",
            )
        used = b"used_dltensor_versioned"
    elif _capsule_is_valid(capsule, b"dltensor"):
        address = _capsule_pointer(capsule, b"dltensor")
        managed = _DLManagedTensor.from_address(address)
        used = b"used_dltensor"
    else:
        raise UsageError(
            f"{capsule!r} is not an unconsumed DLPack capsule: a capsule can be read once",
            hint="ask the producer for a new capsule (x.__dlpack__()) or pass the tensor itself",
        )
    dl = managed.dl_tensor
    ndim = int(dl.ndim)
    shape = tuple(dl.shape[i] for i in range(ndim))
    strides = tuple(dl.strides[i] for i in range(ndim)) if ndim and dl.strides else _contiguous_strides(shape)
    dtype = _dtype_of_dl(dl.dtype.code, dl.dtype.bits, dl.dtype.lanes)
    kind, index = dl.device.device_type, dl.device.device_id
    if kind in (_KDL_CPU, _KDL_CUDA_HOST):  # pinned host memory is host memory
        device = Device("cpu", 0)
    elif kind == _KDL_CUDA:
        device = Device("cuda", index)
    else:
        raise DeviceNotFound(
            f"a DLPack tensor on device type {kind} (index {index}): nbxcert reads cpu (1) and cuda (2) memory",
            hint="move the tensor to the cpu or an NVIDIA GPU in its own library first",
        )
    owner = _Imported((dl.data or 0) + dl.byte_offset, 0)
    tensor = _view_of(owner.ptr, shape, strides, dtype, device, owner)
    _capsule_rename(capsule, _NAMES[used])  # consumed: from here on, nbxcert calls the deleter
    if managed.deleter:
        weakref.finalize(owner, _release_import, managed.deleter, address).atexit = False  # at exit: left to the OS
    return tensor


def _capsule_of(obj: Any) -> Any:
    """`obj.__dlpack__(...)` as a consumer calls it: on a GPU with nbxcert's current stream, so that the producer's
    work comes first."""
    kind, index = (int(v) for v in obj.__dlpack_device__()) if hasattr(obj, "__dlpack_device__") else (_KDL_CPU, 0)
    stream = None
    if kind == _KDL_CUDA:
        handle = _cuda().current_stream(index)
        stream = 1 if handle == 0 else handle
    try:
        return obj.__dlpack__(stream=stream, max_version=_DLPACK_VERSION)
    except TypeError:  # a producer older than DLPack 1.0's Python API takes no max_version
        return obj.__dlpack__(stream=stream)


def _from_cuda_array_interface(obj: Any, device: str | Device | None) -> Tensor:
    cai = obj.__cuda_array_interface__
    shape = _check_shape(cai["shape"])
    try:
        numpy_dtype = np.dtype(cai["typestr"])
    except TypeError:
        raise DTypeError(f"typestr {cai['typestr']!r} of a CUDA array interface is not a dtype") from None
    dtype = _dt.from_numpy_dtype(numpy_dtype)
    if cai.get("mask") is not None:
        raise ViewError("a CUDA array interface with a mask: nbxcert views have none", hint="fill the masked values")
    item = dtype.itemsize
    if cai.get("strides") is None:
        strides = _contiguous_strides(shape)
    else:
        byte_strides = tuple(int(s) for s in cai["strides"])
        if any(s % item for s in byte_strides):
            raise ViewError(f"byte strides {byte_strides} are not multiples of the {dtype.name} item size {item}")
        strides = tuple(s // item for s in byte_strides)
    where = as_device(device) if device is not None else Device("cuda", _cuda().current_device())
    if where.type != "cuda":
        raise DeviceNotFound(f"the CUDA array interface describes GPU memory; device '{where}' is not a GPU")
    owner = _Imported(int(cai["data"][0] or 0), 0, keep=obj)
    tensor = _view_of(owner.ptr, shape, strides, dtype, where, owner)
    producer = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if producer is not None:
        handle = _dlpack_stream(producer)
        if handle is not None:
            _order_streams(handle, _cuda().current_stream(where.index), where.index)
    return tensor


def from_dlpack(obj: Any, device: str | Device | None = None) -> Tensor:
    """An nbxcert tensor viewing `obj`'s memory, without a copy: `obj` is anything with `__dlpack__` (torch, CuPy,
    JAX, numpy), a DLPack capsule (read once), or an object with only `__cuda_array_interface__` (numba; kept
    alive by the view). A GPU producer is asked to order its work before nbxcert's current stream. Read-only memory
    is viewed as it is: nbxcert does not write to its inputs. With `device`, the result is there: the same view when
    the memory is there already, else a copy (`to`); for the CUDA array interface, which names no device, it says
    which GPU the memory is on (default: nbxcert's current one)."""
    if isinstance(obj, Tensor):
        view = obj._view(obj.shape, obj._strides)
        return view if device is None else view.to(device)
    if _EXPORTS:
        _sweep_exports()
    if type(obj).__name__ == "PyCapsule":
        tensor = _consume_capsule(obj)
    elif hasattr(obj, "__dlpack__"):
        tensor = _consume_capsule(_capsule_of(obj))
    elif hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_array_interface(obj, device)
    else:
        raise UsageError(
            f"a {type(obj).__name__} is not a tensor nbxcert can view: it has no __dlpack__ and no "
            "__cuda_array_interface__",
            hint="pass a torch, CuPy or JAX tensor, a numpy array or a DLPack capsule",
        )
    return tensor if device is None else tensor.to(device)
