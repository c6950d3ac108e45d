"""nbxcert's torch-free tensor: what every kernel launch receives.

A `Tensor` is a typed, strided view (shape, strides in elements, storage offset) of an untyped `Storage` that lives
on `cpu` (a numpy byte buffer) or on `cuda:N` (a libcuda allocation). Triton accepts it directly: it exposes
`data_ptr()` and a `dtype` whose `str()` Triton's specializer maps. Under Triton's interpreter the tensor also answers
the few storage calls the interpreter makes (`untyped_storage`, `new_empty`, `set_`, `storage_offset`, `size`,
`stride`, `copy_`), so a CPU tensor is handed to the interpreter with no copy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbxcert.errors import DeviceNotFound, ShapeMismatch, ViewError
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
        lo, hi = self._span()
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
        expected = _contiguous_strides(self.shape)
        return all(n == 1 or s == e for n, s, e in zip(self.shape, self._strides, expected, strict=False))

    def _span(self) -> tuple[int, int]:
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
        lo, hi = self._span()
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
            self._write_host(np.ascontiguousarray(src.numpy()))
        return self

    def _write_host(self, values: np.ndarray) -> None:
        """Write values (storage dtype, this view's shape) into this view through the host."""
        if self.device.type == "cpu":
            self.numpy()[...] = values
            return
        lo, hi = self._span()
        window = Tensor(self._storage, self.shape, self._strides, self.dtype, self._offset)
        host = window.numpy()  # a host copy of exactly the span [lo, hi)
        host[...] = values
        self._storage.write_bytes(host.base if host.base is not None else host, lo)

    def fill_(self, value: float) -> Tensor:
        self._write_host(np.broadcast_to(_dt.encode(np.array(value), self.dtype), self.shape))
        return self

    # --- the interpreter's tensor protocol ----------------------------------------------------------------------------
    def new_empty(self, size, device="cpu") -> Tensor:
        size = (size,) if isinstance(size, int) else tuple(size)
        return empty(size, self.dtype, device)

    def set_(self, storage: Storage, offset: int, size, stride) -> Tensor:
        self._storage, self._offset, self._ptr, self._key = storage, int(offset), None, None
        self.shape, self._strides = tuple(size), tuple(stride)
        return self


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
