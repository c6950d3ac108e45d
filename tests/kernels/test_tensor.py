"""The tensor layer: views without copies, copies across strides, and clear refusals."""

from __future__ import annotations

import numpy as np
import pytest

from nbxcert.errors import DeviceNotFound, DTypeError, ShapeMismatch, ViewError
from nbxcert.kernels import tensor as T


def test_from_numpy_round_trip_and_alignment():
    a = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    t = T.from_numpy(a)
    assert t.shape == (5, 7) and t.strides == (7, 1) and t.dtype.name == "float32"
    assert np.array_equal(t.numpy(), a)
    assert t.data_ptr() % 16 == 0


def test_views_share_storage_and_match_numpy():
    a = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    t = T.from_numpy(a)
    assert np.array_equal(t.transpose(0, 2).numpy(), a.transpose(2, 1, 0))
    assert np.array_equal(t.permute(1, 0, 2).numpy(), a.transpose(1, 0, 2))
    assert np.array_equal(t[1, :, 1:3].numpy(), a[1, :, 1:3])
    assert np.array_equal(t[..., ::2].numpy(), a[..., ::2])
    assert np.array_equal(t.view(6, 4).numpy(), a.reshape(6, 4))
    assert np.array_equal(t.reshape(-1).numpy(), a.reshape(-1))
    v = t[0]
    v.fill_(-1.0)
    assert (t.numpy()[0] == -1).all(), "a slice is a view: writing through it changes the base"


def test_view_that_needs_a_copy_is_refused_and_reshape_copies():
    t = T.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4)).T
    with pytest.raises(ViewError, match="needs a copy"):
        t.view(12)
    r = t.reshape(12)
    assert np.array_equal(r.numpy(), np.arange(12).reshape(3, 4).T.reshape(12))
    # a split of a transposed dimension is still a view
    assert t.view(2, 2, 3).strides == (2, 1, 4)


def test_expand_broadcasts_with_stride_zero():
    t = T.from_numpy(np.arange(3, dtype=np.float32)).unsqueeze(0).expand(4, 3)
    assert t.strides == (0, 1)
    assert np.array_equal(t.numpy(), np.broadcast_to(np.arange(3), (4, 3)))
    with pytest.raises(ViewError, match="cannot expand"):
        T.empty((2, 3), "float32").expand(4, 3)


def test_copy_between_strides_and_dtypes():
    src = T.from_numpy(np.arange(6, dtype=np.float16).reshape(2, 3))
    dst = T.empty((3, 2), "float16").T
    dst.copy_(src)
    assert np.array_equal(dst.numpy(), src.numpy())
    with pytest.raises(ShapeMismatch, match=r"shapes \(2, 3\) and \(3, 2\)"):
        T.empty((3, 2), "float16").copy_(src)
    with pytest.raises(ShapeMismatch, match="dtypes float16 and float32"):
        T.empty((2, 3), "float32").copy_(src)


def test_bad_requests_are_clear_errors():
    with pytest.raises(DTypeError):
        T.empty((2,), "float13")
    with pytest.raises(ViewError, match="out of range"):
        T.empty((2, 3), "float32")[5]
    with pytest.raises(ViewError, match="holds 8 elements, the tensor has 6"):
        T.empty((2, 3), "float32").view(4, 2)
    with pytest.raises(DeviceNotFound, match="not a device name"):
        T.empty((2,), "float32", "tpu:0")
    with pytest.raises(ViewError, match="reaches bytes"):
        T.Tensor(T.Storage(8, "cpu"), (4,), (1,), "float32")


def test_cuda_device_that_does_not_exist_is_refused():
    from nbxcert.kernels.backends import cuda

    count = cuda.device_count() if cuda.available()[0] else 0
    with pytest.raises(DeviceNotFound, match=f"cuda:{count + 7}"):
        T.empty((2,), "float32", f"cuda:{count + 7}")


def test_bfloat16_tensor_stores_raw_bits():
    t = T.from_numpy(np.array([1.0, -2.5, 3.0 + 2**-9]), "bfloat16")
    assert t.numpy().dtype == np.uint16
    assert list(t.float64()) == [1.0, -2.5, 3.0]


@pytest.mark.gpu
def test_cuda_tensor_round_trip_and_strided_copy():
    a = np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32)
    g = T.from_numpy(a, device="cuda:0")
    assert g.device.type == "cuda"
    assert np.array_equal(g.numpy(), a)
    gt = T.empty((48, 64), "float32", "cuda:0").T
    gt.copy_(g)
    assert np.array_equal(gt.numpy(), a)
    assert np.array_equal(g.to("cpu").T.contiguous().numpy(), a.T)


def test_data_ptr_is_the_views_address_and_follows_set():
    """A tensor's address is found once (read for every pointer argument of every launch) and is its view's: the
    storage's plus its offset; `set_` (the interpreter's protocol) points it at another storage."""
    t = T.empty((4, 8), "float32")
    base = t.untyped_storage().data_ptr()
    assert t.data_ptr() == base and t[1].data_ptr() == base + 8 * 4 and t[1].data_ptr() == base + 32
    other = T.Storage(64, "cpu")
    t.set_(other, 2, (4,), (1,))
    assert t.data_ptr() == other.data_ptr() + 2 * 4
