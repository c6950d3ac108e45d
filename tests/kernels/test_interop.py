"""Tensors across libraries: nbxcert tensors speak DLPack and the CUDA array interface, and served calls take other
libraries' tensors and give the same kind back.

numpy is the other library here (it has `from_dlpack` and `__dlpack__`); GPU tensors are stood in for by storages
labelled cuda:0 over host memory, which nothing here dereferences, and the stream ordering by a fake event.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import textwrap
import types
import weakref

import numpy as np
import pytest

from nbxcert.errors import DTypeError, UsageError, ViewError
from nbxcert.kernels import interop
from nbxcert.kernels import tensor as T
from nbxcert.kernels.backends import cuda

RNG_SEED = 20261201

# The DLPack 1.x layout (dlpack.h), read here by byte offsets of its own: a DLManagedTensorVersioned starts with its
# version (major, minor: uint32 each), its flags are at 24 and its DLTensor at 32; a legacy DLManagedTensor starts
# with its DLTensor. In a DLTensor, the dtype's code and bits are the bytes at 20 and 21, byte_offset is at 40.
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _capsule_fields(capsule, versioned: bool) -> dict:
    address = _get_pointer(capsule, b"dltensor_versioned" if versioned else b"dltensor")
    tensor = address + (32 if versioned else 0)
    fields = {
        "data": ctypes.c_void_p.from_address(tensor).value,
        "device": (ctypes.c_int32.from_address(tensor + 8).value, ctypes.c_int32.from_address(tensor + 12).value),
        "code": ctypes.c_uint8.from_address(tensor + 20).value,
        "bits": ctypes.c_uint8.from_address(tensor + 21).value,
        "byte_offset": ctypes.c_uint64.from_address(tensor + 40).value,
    }
    if versioned:
        major, minor = ctypes.c_uint32.from_address(address).value, ctypes.c_uint32.from_address(address + 4).value
        fields.update(version=(major, minor), flags=ctypes.c_uint64.from_address(address + 24).value)
    return fields


def _values(shape, numpy_dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(RNG_SEED + seed)
    if np.dtype(numpy_dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return (rng.standard_normal(shape) * 50).astype(numpy_dtype)


def _released(ref: weakref.ref) -> bool:
    gc.collect()  # a consumer's deleter call is seen at the next collection
    return ref() is None


# --- nbxcert -> numpy -------------------------------------------------------------------------------------------------
def test_numpy_reads_and_writes_an_nbxcert_tensor_in_place():
    t = T.from_numpy(_values((3, 5), np.float32))
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr() and a.flags.writeable
    assert np.array_equal(a, t.numpy())
    a[1, 2] = 7.0
    assert t.numpy()[1, 2] == 7.0, "numpy's array is the tensor's memory"
    t[0].fill_(-3.0)
    assert (a[0] == -3.0).all()


@pytest.mark.parametrize(
    "make_view",
    [
        lambda t: t[1:, ::2],
        lambda t: t.T,
        lambda t: t[2],
        lambda t: t[:, 1:4].unsqueeze(0),
        lambda t: t[1:2, 3:4].expand(4, 5),
    ],
    ids=["offset-and-step", "transposed", "row", "unsqueezed", "broadcast"],
)
def test_strided_and_offset_views_export_as_they_are(make_view):
    v = make_view(T.from_numpy(_values((4, 6), np.float64)))
    fields = _capsule_fields(v.__dlpack__(max_version=(1, 0)), versioned=True)
    assert (fields["data"], fields["byte_offset"]) == (v.data_ptr(), 0), "the offset is in the pointer, not byte_offset"
    a = np.from_dlpack(v)
    assert a.shape == v.shape
    assert a.strides == tuple(s * 8 for s in v.strides), "strides go in elements and come back as numpy's bytes"
    assert a.ctypes.data == v.data_ptr(), "the view's offset is in the data pointer"
    assert np.array_equal(a, v.numpy())


@pytest.mark.parametrize("name", ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"])
def test_every_numpy_dtype_round_trips(name):
    dtype = T.get_dtype(name)
    t = T.from_numpy(_values((2, 7), dtype.storage, seed=3))
    a = np.from_dlpack(t)
    assert a.dtype == np.dtype(dtype.storage) and np.array_equal(a, t.numpy())
    back = T.from_dlpack(a)
    assert back.dtype is dtype and back.data_ptr() == t.data_ptr() and back.strides == t.strides


def test_bool_is_dlpacks_bool_code():
    fields = _capsule_fields(T.from_numpy(np.array([True, False])).__dlpack__(max_version=(1, 0)), versioned=True)
    assert (fields["code"], fields["bits"]) == (6, 8)


def test_bfloat16_goes_as_dlpacks_bfloat_and_numpy_refusing_it_frees_it():
    bits = np.array([0x3F80, 0xC020, 0x4040, 0x7FC0], dtype=np.uint16)
    t = T.from_bits(bits, "bfloat16")
    capsule = t.__dlpack__(max_version=(1, 0))
    fields = _capsule_fields(capsule, versioned=True)
    assert (fields["code"], fields["bits"]) == (4, 16) and fields["data"] == t.data_ptr()
    back = T.from_dlpack(capsule)
    assert back.dtype.name == "bfloat16" and back.data_ptr() == t.data_ptr()
    assert np.array_equal(back.numpy(), bits)

    refused = T.from_bits(bits, "bfloat16")
    ref = weakref.ref(refused._storage)
    with pytest.raises((BufferError, RuntimeError), match="[Uu]nsupported dtype"):
        np.from_dlpack(refused)  # numpy has no bfloat16; it drops the capsule unconsumed, with its error in flight
    del refused
    assert _released(ref), "a capsule dropped unconsumed releases what it held"


def test_float8_needs_a_consumer_of_dlpack_1_1():
    t = T.from_bits(np.arange(4, dtype=np.uint8), "float8_e4m3fn")
    for max_version in (None, (1, 0)):
        with pytest.raises(DTypeError, match="float8_e4m3fn tensor needs DLPack 1.1"):
            t.__dlpack__(max_version=max_version)
    with pytest.raises(BufferError):  # what DLPack's protocol names, for consumers that catch it
        t.__dlpack__()
    capsule = t.__dlpack__(max_version=(1, 1))
    fields = _capsule_fields(capsule, versioned=True)
    assert (fields["code"], fields["bits"], fields["version"]) == (10, 8, (1, 1))
    assert T.from_dlpack(capsule).dtype.name == "float8_e4m3fn"


def test_versioned_and_legacy_capsules():
    t = T.from_numpy(_values((3, 4), np.float32))
    versioned, legacy = t.__dlpack__(max_version=(1, 0)), t.__dlpack__()
    assert '"dltensor_versioned"' in repr(versioned) and '"dltensor"' in repr(legacy)
    fields = _capsule_fields(versioned, versioned=True)
    assert fields["version"] == (1, 0) and fields["flags"] == 0 and fields["device"] == (1, 0)
    assert _capsule_fields(legacy, versioned=False)["data"] == t.data_ptr()

    class Legacy:  # hands numpy the legacy capsule whatever it asks for
        def __dlpack__(self, **kwargs):
            return legacy

        def __dlpack_device__(self):
            return (1, 0)

    a = np.from_dlpack(Legacy())
    assert a.ctypes.data == t.data_ptr() and np.array_equal(a, t.numpy())
    assert not a.flags.writeable, "numpy reads a legacy capsule as read-only (it cannot say otherwise)"
    assert '"used_dltensor"' in repr(legacy)
    assert T.from_dlpack(versioned).data_ptr() == t.data_ptr()
    assert '"used_dltensor_versioned"' in repr(versioned)


def test_copy_and_device_requests():
    t = T.from_numpy(_values((5,), np.float32))
    copied = t.__dlpack__(max_version=(1, 0), copy=True)
    fields = _capsule_fields(copied, versioned=True)
    assert fields["flags"] == 2 and fields["data"] != t.data_ptr(), "a copy is flagged IS_COPIED"
    assert np.array_equal(T.from_dlpack(copied).numpy(), t.numpy())
    same = t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert _capsule_fields(same, versioned=True)["data"] == t.data_ptr()
    with pytest.raises(BufferError, match=r"cannot be exported to DLPack device \(2, 0\)"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(UsageError, match="stream=5 for a DLPack export to the cpu"):
        t.__dlpack__(stream=5)


def test_zero_size_and_zero_dimensional_tensors():
    scalar = T.from_numpy(np.array(2.5, dtype=np.float32))
    assert np.from_dlpack(scalar).shape == () and float(np.from_dlpack(scalar)) == 2.5
    assert T.from_dlpack(np.array(7, dtype=np.int64)).numpy() == 7
    assert np.from_dlpack(T.empty((0, 3), "float16")).shape == (0, 3)
    empty = T.from_dlpack(np.zeros((4, 0), dtype=np.int32))
    assert empty.shape == (4, 0) and empty.dtype.name == "int32" and empty.untyped_storage().nbytes == 0


def test_export_lives_until_its_consumer_is_done():
    t = T.from_numpy(_values((8,), np.float32))
    ref = weakref.ref(t._storage)
    a = np.from_dlpack(t)
    del t
    assert not _released(ref) and a.sum() == a.sum(), "numpy's array keeps the tensor's memory alive"
    del a
    assert _released(ref), "numpy called the deleter: the memory is released"


def test_capsule_dropped_unconsumed_is_released():
    t = T.from_numpy(_values((8,), np.float32))
    ref = weakref.ref(t._storage)
    capsule = t.__dlpack__()
    del t
    assert not _released(ref), "an unconsumed capsule keeps the tensor alive"
    del capsule
    assert _released(ref)


def test_consumer_freed_during_unwinding_does_not_crash():
    # A deleter written as a Python callback (a ctypes thunk) crashes the interpreter when a consumer runs it with an
    # exception in flight, as here: numpy's array is a temporary popped while ValueError unwinds. Run apart, so that a
    # crash fails this test and not the whole test run.
    code = textwrap.dedent(
        """
        import gc, weakref
        import numpy as np
        from nbxcert.kernels import tensor as T

        def boom():
            raise ValueError("in flight")

        def use(*arrays):
            pass

        t = T.from_numpy(np.arange(6, dtype=np.float32))
        ref = weakref.ref(t._storage)
        try:
            use(np.from_dlpack(t), boom())
        except ValueError as e:
            assert str(e) == "in flight", e
        del t
        gc.collect()
        print("released" if ref() is None else "kept")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "released" and "Exception ignored" not in done.stderr


def test_cuda_array_interface_is_absent_on_the_cpu():
    t = T.from_numpy(_values((2, 2), np.float32))
    assert not hasattr(t, "__cuda_array_interface__")
    assert t.__dlpack_device__() == (1, 0)


# --- numpy -> nbxcert -------------------------------------------------------------------------------------------------
def test_numpy_array_is_viewed_without_a_copy_and_kept_alive():
    base = _values((5, 6), np.float64)
    window = base[1:, 2:5]
    t = T.from_dlpack(window)
    assert t.data_ptr() == window.ctypes.data and t.shape == (4, 3) and t.strides == (6, 1)
    assert np.array_equal(t.numpy(), window)
    t.fill_(1.5)
    assert (base[1:, 2:5] == 1.5).all() and base[0, 0] != 1.5, "the tensor writes into the array's memory"
    ref = weakref.ref(base)
    del base, window
    assert not _released(ref), "the view keeps the producer's array alive"
    assert (t.numpy() == 1.5).all()
    del t
    assert _released(ref), "dropping the view ran numpy's deleter"


def test_capsule_consumed_twice_is_refused():
    capsule = np.arange(4.0).__dlpack__(max_version=(1, 0))
    T.from_dlpack(capsule)
    with pytest.raises(UsageError, match="can be read once"):
        T.from_dlpack(capsule)
    capsule = T.from_numpy(np.arange(3.0)).__dlpack__()
    T.from_dlpack(capsule)
    with pytest.raises(UsageError, match="not an unconsumed DLPack capsule"):
        T.from_dlpack(capsule)


def test_what_nbxcert_cannot_view_is_refused_by_name():
    with pytest.raises(ViewError, match="negative stride"):
        T.from_dlpack(np.arange(5.0)[::-1])
    with pytest.raises(DTypeError, match="uint of 16 bits has no nbxcert dtype"):
        T.from_dlpack(np.arange(5, dtype=np.uint16))
    with pytest.raises(DTypeError, match="complex of 64 bits"):
        T.from_dlpack(np.zeros(3, dtype=np.complex64))
    with pytest.raises(UsageError, match="a list is not a tensor nbxcert can view"):
        T.from_dlpack([1.0, 2.0])


def test_from_dlpack_with_device_copies_only_when_elsewhere():
    a = _values((4,), np.float32)
    assert T.from_dlpack(a, device="cpu").data_ptr() == a.ctypes.data
    t = T.from_numpy(a)
    view = T.from_dlpack(t)
    assert view is not t and view.data_ptr() == t.data_ptr()


# --- GPU tensors, stood in for ----------------------------------------------------------------------------------------
class _HostMemory:
    """Host bytes behind a storage labelled cuda:0 (nothing here reads GPU memory)."""

    def __init__(self, nbytes: int):
        self.buffer = np.zeros(nbytes, dtype=np.uint8)
        self.ptr = self.buffer.ctypes.data


def _gpu_tensor(shape, strides, dtype, offset=0, nbytes=256) -> T.Tensor:
    return T.Tensor(T.Storage.over(_HostMemory(nbytes), nbytes, "cuda:0"), shape, strides, dtype, offset)


@pytest.fixture
def stream_orders(monkeypatch):
    """The (event record, stream wait) pairs nbxcert asks the driver for, with a fake event."""
    calls: list = []

    class FakeEvent:
        def __init__(self, device=None):
            self.device = device

        def record(self, stream=0):
            calls.append(("record", stream))

    monkeypatch.setattr(cuda, "Event", FakeEvent)
    monkeypatch.setattr(cuda, "stream_wait_event", lambda stream, event: calls.append(("wait", stream)))
    return calls


def test_cuda_array_interface_of_a_gpu_view():
    g = _gpu_tensor((3, 4), (4, 1), "float16", offset=2)
    cai = g.__cuda_array_interface__
    assert cai == {
        "shape": (3, 4),
        "typestr": "<f2",
        "data": (g.data_ptr(), False),
        "strides": None,
        "version": 3,
        "stream": 1,  # the legacy default stream: 0 is disallowed
    }
    assert g.data_ptr() == g.untyped_storage().data_ptr() + 4
    assert g[:, 1:].__cuda_array_interface__["strides"] == (8, 2)
    with cuda.using_stream(0xABC, device=0):
        assert g.__cuda_array_interface__["stream"] == 0xABC
    with pytest.raises(DTypeError, match="bfloat16 has no typestr"):
        _ = _gpu_tensor((4,), (1,), "bfloat16").__cuda_array_interface__


def test_gpu_capsule_names_the_device_and_comes_back_as_a_gpu_view(stream_orders):
    g = _gpu_tensor((2, 3), (3, 1), "float32", offset=1)
    capsule = g.__dlpack__(stream=1, max_version=(1, 0))
    assert g.__dlpack_device__() == (2, 0) and _capsule_fields(capsule, versioned=True)["device"] == (2, 0)
    back = T.from_dlpack(capsule)
    assert str(back.device) == "cuda:0" and back.data_ptr() == g.data_ptr() and back.shape == (2, 3)
    assert stream_orders == [], "one stream on both sides: nothing to order"


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (2, [("record", 0xABC), ("wait", 2)]),  # the per-thread default stream
        (None, [("record", 0xABC), ("wait", 0)]),  # taken as 1, the legacy default stream (handle 0)
        (1, [("record", 0xABC), ("wait", 0)]),
        (0xDEF, [("record", 0xABC), ("wait", 0xDEF)]),
        (0xABC, []),  # the consumer's stream is nbxcert's
        (-1, []),  # the consumer asks for no ordering
    ],
)
def test_gpu_export_orders_the_consumers_stream_after_nbxcerts(stream_orders, stream, expected):
    g = _gpu_tensor((8,), (1,), "float32")
    with cuda.using_stream(0xABC, device=0):
        g.__dlpack__(stream=stream)
    assert stream_orders == expected


def test_gpu_export_refuses_stream_zero(stream_orders):
    with pytest.raises(UsageError, match="stream 0 is not a DLPack stream number"):
        _gpu_tensor((8,), (1,), "float32").__dlpack__(stream=0)


class _CudaArray:
    """An exporter with only the CUDA array interface (as numba's arrays are)."""

    def __init__(self, interface: dict):
        self.__cuda_array_interface__ = interface


def test_cuda_array_interface_import_views_and_orders(stream_orders):
    memory = _HostMemory(64)
    exporter = _CudaArray(
        {"shape": (2, 3), "typestr": "<f4", "data": (memory.ptr + 8, False), "strides": (16, 4), "version": 3}
    )
    exporter.__cuda_array_interface__["stream"] = 0xDEF
    ref = weakref.ref(exporter)
    with cuda.using_stream(0xABC, device=0):
        t = T.from_dlpack(exporter)
    assert str(t.device) == "cuda:0" and t.dtype.name == "float32"
    assert t.data_ptr() == memory.ptr + 8 and t.strides == (4, 1) and t.untyped_storage().nbytes == 28
    assert stream_orders == [("record", 0xDEF), ("wait", 0xABC)], "nbxcert's stream waits for the exporter's"
    del exporter
    assert not _released(ref), "the view keeps the exporter alive"
    del t
    assert _released(ref)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"typestr": "<c8"}, DTypeError, "complex64"),
        ({"mask": object()}, ViewError, "mask"),
        ({"strides": (6, 3)}, ViewError, "not multiples of the float32 item size"),
        ({"strides": (-12, 4)}, ViewError, "negative stride"),
        ({"stream": 0}, UsageError, "stream 0"),
    ],
)
def test_cuda_array_interface_import_refusals(stream_orders, change, error, match):
    memory = _HostMemory(64)
    interface = {"shape": (2, 3), "typestr": "<f4", "data": (memory.ptr, False), "strides": None, "version": 3}
    with pytest.raises(error, match=match):
        T.from_dlpack(_CudaArray({**interface, **change}))


# --- served calls: foreign tensors in, the same kind out --------------------------------------------------------------
class _ForeignTensor:
    """Another library's tensor: numpy memory behind DLPack, in a class whose module is named by `_foreign_class`."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def _foreign_class(module: str) -> type:
    return type("ForeignTensor", (_ForeignTensor,), {"__module__": module})


@pytest.fixture
def fakelib(monkeypatch):
    """A loaded library 'fakelib' whose `from_dlpack` records what it converts."""
    module = types.ModuleType("fakelib")
    module.converted = []

    def from_dlpack(x):
        module.converted.append(x)
        return ("fakelib tensor", np.from_dlpack(x))

    module.from_dlpack = from_dlpack
    monkeypatch.setitem(sys.modules, "fakelib", module)
    return module


@pytest.fixture
def cpu_backend(backend):
    if backend.device != "cpu":
        pytest.skip("numpy arrays are foreign tensors only where kernels run on the cpu")
    return backend


def test_is_foreign_and_library_of(backend, fakelib):
    array = _values((3,), np.float32)
    assert interop.is_foreign(array) is (backend.device == "cpu")
    foreign = _foreign_class("fakelib.core")(array)
    assert interop.is_foreign(foreign) and interop.library_of(foreign) == "fakelib"
    for value in (T.from_numpy(array), 1.0, 3, None, "x", np.float32(1.0), [array], _ForeignTensor):
        assert not interop.is_foreign(value), value
    assert interop.library_of(array) == "numpy"
    with pytest.raises(UsageError, match="no module 'absentlib' is loaded"):
        interop.library_of(_foreign_class("absentlib.ops")(array))


def test_to_nbx_views_numpy_arrays_and_to_caller_gives_numpy_back(cpu_backend):
    x, y, out = _values((4, 3), np.float32), _values((3,), np.float32, seed=1), np.full((4, 3), np.nan, np.float32)
    args, kwargs, kind = interop.to_nbx((x, (y, 2), [out]), {"out": out, "eps": 1e-6})
    assert kind == "numpy"
    tx, (ty, two), [tout] = args
    assert isinstance(tx, T.Tensor) and tx.data_ptr() == x.ctypes.data and two == 2
    assert ty.data_ptr() == y.ctypes.data and kwargs["eps"] == 1e-6
    assert kwargs["out"] is tout, "one array passed twice is one view"

    fresh = T.from_numpy(_values((2,), np.float32, seed=2))
    result = interop.to_caller({"out": tout, "parts": (fresh, [tx[1:]]), "n": 3}, kind)
    assert result["out"] is out, "an argument returned as it is comes back as the caller's own array"
    got, [sliced] = result["parts"]
    assert type(got) is np.ndarray and got.ctypes.data == fresh.data_ptr() and np.array_equal(got, fresh.numpy())
    assert type(sliced) is np.ndarray and sliced.ctypes.data == x[1:].ctypes.data and result["n"] == 3


@pytest.mark.parametrize(
    "array, says",
    [
        (np.arange(4, dtype=">f4"), "native byte order"),
        (np.array([1, 2], dtype=object), "integers, float and complex"),
    ],
)
def test_an_array_numpy_will_not_share_is_refused_in_one_line_naming_the_argument(cpu_backend, array, says):
    with pytest.raises(DTypeError, match=rf"argument 'y' is a numpy ndarray its library will not share.*{says}") as e:
        interop.to_nbx((T.from_numpy(_values((4,), np.float32)),), {"y": array})
    assert "newbyteorder" in e.value.hint


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_a_result_numpy_has_no_dtype_for_is_refused_in_one_line(cpu_backend, dtype):
    _, _, kind = interop.to_nbx((_values((3,), np.float32),), {})
    result = T.from_bits(np.zeros(3, np.uint16 if dtype == "bfloat16" else np.uint8), dtype)
    with pytest.raises(DTypeError, match=f"the result is {dtype}, which numpy has no dtype for") as e:
        interop.to_caller(result, kind)
    assert "float32" in e.value.hint and f"from_numpy(x, '{dtype}')" in e.value.hint


def test_to_nbx_without_foreign_tensors_changes_nothing(backend):
    t = T.from_numpy(_values((2,), np.float32))
    args, kwargs = (t, (1, 2.0), [None]), {"k": "v"}
    new_args, new_kwargs, kind = interop.to_nbx(args, kwargs)
    assert new_args is args and new_kwargs is kwargs and kind is None
    assert interop.to_caller(t, None) is t


def test_to_caller_uses_the_callers_own_from_dlpack(fakelib):
    Foreign = _foreign_class("fakelib")
    x = Foreign(_values((5,), np.float64))
    args, _, kind = interop.to_nbx((x,), {})
    assert kind == "fakelib" and args[0].data_ptr() == x.array.ctypes.data
    made = T.from_numpy(_values((3,), np.float64, seed=4))
    back = interop.to_caller((args[0], made), kind)
    assert back[0] is x and fakelib.converted == [made]
    assert back[1][0] == "fakelib tensor" and back[1][1].ctypes.data == made.data_ptr()


def test_mixing_libraries_in_one_call_is_refused(fakelib, monkeypatch):
    monkeypatch.setitem(sys.modules, "otherlib", types.ModuleType("otherlib"))
    a, b = _foreign_class("fakelib")(np.zeros(2)), _foreign_class("otherlib")(np.zeros(2))
    with pytest.raises(UsageError, match=r"mixes fakelib and otherlib tensors: argument 0 is a fakelib tensor, "):
        interop.to_nbx((a,), {"w": [b]})


def test_mixing_numpy_with_another_library_is_refused(cpu_backend, fakelib):
    with pytest.raises(UsageError, match=r"mixes numpy and fakelib tensors.*argument 1\[0\] a fakelib one"):
        interop.to_nbx((np.zeros(2), [_foreign_class("fakelib")(np.zeros(2))]), {})


def test_to_caller_refuses_a_library_without_from_dlpack(monkeypatch):
    monkeypatch.setitem(sys.modules, "bare", types.ModuleType("bare"))
    args, _, kind = interop.to_nbx((_foreign_class("bare")(np.zeros(2)),), {})
    assert interop.to_caller(args, kind)[0] is not args[0], "its own tensors still come back"
    with pytest.raises(UsageError, match="module 'bare' is not loaded or has no from_dlpack"):
        interop.to_caller(T.from_numpy(np.zeros(2)), kind)


def test_a_served_op_takes_numpy_arrays_under_the_interpreter_and_gives_numpy_back(backend):
    """Every kernel entry point takes another library's tensors (numpy under the interpreter) with no copy and returns
    its outputs as that library's: a fresh output, and an `out=` given back as the caller's own object."""
    if backend.name != "interpreter":
        pytest.skip("numpy arrays are host data on a GPU")
    from nbxcert.kernels import rows
    from nbxcert.kernels.inputs import randn, rng

    x, w = randn(rng(5), (4, 64), "float16", "cpu"), randn(rng(6), (64,), "float16", "cpu")
    want = rows.rmsnorm(x, w, 1e-6).numpy()
    xa, wa = np.array(x.numpy()), np.array(w.numpy())
    got = rows.rmsnorm(xa, wa, 1e-6)
    assert (
        type(got) is np.ndarray
        and got.dtype == np.float16
        and np.array_equal(got.view(np.uint16), want.view(np.uint16))
    )
    out = np.zeros((4, 64), np.float16)
    again = rows.rmsnorm(xa, wa, 1e-6, out=out)
    assert again is out and np.array_equal(out.view(np.uint16), want.view(np.uint16))  # written in place, no copy
    summed, normed = rows.add_rmsnorm(xa, xa, wa, 1e-6)  # a tuple of results: each one numpy
    assert type(summed) is np.ndarray and type(normed) is np.ndarray


def test_nbxcert_ops_take_numpy_arrays_under_the_interpreter_and_give_numpy_back(backend):
    """Bug: `nbxcert.ops` took nbxcert tensors only (`ops.add` of two foreign tensors was refused as "an operand of
    type ndarray is neither a Tensor nor a number", `ops.rms_norm` broke on the numpy result of its family). Every op
    takes them as the families do: fresh results in the caller's library, an in-place op's and an `out=`'s as the
    very object passed, a dtype as that library writes it."""
    if backend.name != "interpreter":
        pytest.skip("numpy arrays are host data on a GPU")
    from nbxcert import ops

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    got = ops.add(x, x, alpha=2)
    assert type(got) is np.ndarray and np.array_equal(got, 3 * x)
    mixed = ops.mul(T.from_numpy(x), x)  # one nbxcert tensor, one numpy array: the caller's library is numpy's
    assert type(mixed) is np.ndarray and np.array_equal(mixed, x * x)
    y = x.copy()
    assert ops.add_(y, 1) is y and np.array_equal(y, x + 1)  # written through the view, no copy
    out = np.zeros_like(x)
    assert ops.mul(x, 2, out=out) is out and np.array_equal(out, 2 * x)
    half = ops.to(x, np.float16)  # numpy's dtype, read by its name
    assert type(half) is np.ndarray and half.dtype == np.float16 and ops.to(x, np.dtype("float32")) is x
    copy = ops.clone(x.T)  # preserve_format: a transposed array's copy keeps its strides, as torch's does
    assert type(copy) is np.ndarray and copy.strides == x.T.strides and np.array_equal(copy, x.T)
    normed = ops.rms_norm(x, (8,), np.ones(8, np.float32))
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + np.finfo(np.float32).eps)
    assert type(normed) is np.ndarray and np.allclose(normed, ref, rtol=1e-5)
    assert ops.cast is ops.to and ops.logsigmoid is ops.log_sigmoid  # an alias stays the same op
    with pytest.raises(DTypeError, match="unknown dtype 'float7'"):
        ops.to(x, "float7")


def test_a_served_op_takes_jax_arrays_under_the_interpreter_and_gives_jax_arrays_back(backend):
    """JAX (where it is installed: it is not a test dependency) as the caller's library: its CPU arrays are viewed
    with no copy, and the results are JAX arrays made by `jax.dlpack.from_dlpack`, bit for bit nbxcert's own."""
    if backend.name != "interpreter":
        pytest.skip("JAX CPU arrays are host data on a GPU")
    jnp = pytest.importorskip("jax.numpy")
    from nbxcert.kernels import matmul, rows
    from nbxcert.kernels.inputs import randn, rng

    x, w = randn(rng(7), (4, 64), "float32", "cpu"), randn(rng(8), (64,), "float32", "cpu")
    want = rows.rmsnorm(x, w, 1e-6).numpy()
    xj, wj = jnp.asarray(x.numpy()), jnp.asarray(w.numpy())
    assert T.from_dlpack(xj).data_ptr() == xj.unsafe_buffer_pointer(), "viewed, not copied"
    got = rows.rmsnorm(xj, wj, 1e-6)
    assert type(got).__module__.startswith("jax") and got.dtype == jnp.float32 and got.shape == (4, 64)
    assert np.array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))
    prod = matmul.matmul(xj.astype(jnp.float16), jnp.ones((64, 8), dtype=jnp.float16))
    assert type(prod).__module__.startswith("jax") and prod.shape == (4, 8)
    assert "torch" not in sys.modules
