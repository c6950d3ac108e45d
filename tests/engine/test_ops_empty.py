"""`nbxcert.ops` on empty tensors (a dimension of 0): torch's result (empty, or zeros and beta·input for a product over
an inner dimension of 0) with no kernel launched, so no key is looked up: served from a directory with no certificate
in certified-only mode, where any lookup is refused. Invalid calls are refused as they are on non-empty tensors."""

from __future__ import annotations

import numpy as np
import pytest
from devicetools import from_numpy

from nbxcert import ops, serving
from nbxcert.errors import KeyNotCertified, ShapeMismatch, ViewError


def _z(*shape, dtype="float32", value=0.0):
    return from_numpy(np.full(shape, value, np.float64), dtype)


@pytest.fixture
def no_certificates(tmp_path):
    """Certified-only serving from an empty directory: every key lookup is refused."""
    with serving.configured(dirs=[tmp_path], certified_only=True):
        yield


def test_the_empty_directory_refuses_a_launch(no_certificates):
    # what makes the tests below able to fail: a launch with work to do looks its key up, and is refused
    with pytest.raises(KeyNotCertified):
        ops.add(_z(2, 3), 1.0)


EMPTY = {
    "add": (lambda: ops.add(_z(0, 8), _z(8)), (0, 8), "float32"),
    "add_": (lambda: ops.add_(_z(0, 8), 1), (0, 8), "float32"),
    "exp out=": (lambda: ops.exp(_z(3, 0), out=_z(3, 0)), (3, 0), "float32"),
    "where": (lambda: ops.where(_z(0, dtype="bool"), _z(0), _z(0)), (0,), "float32"),
    "glu": (lambda: ops.glu(_z(0, 8)), (0, 4), "float32"),
    "to": (lambda: ops.to(_z(0, 3), "float16"), (0, 3), "float16"),
    "copy_": (lambda: ops.copy_(_z(0, 3, dtype="float16"), _z(0, 3)), (0, 3), "float16"),
    "clone": (lambda: ops.clone(_z(2, 0)), (2, 0), "float32"),
    "zeros": (lambda: ops.zeros(0, 3), (0, 3), "float32"),
    "full": (lambda: ops.full((4, 0), 2.0), (4, 0), "float32"),
    "arange": (lambda: ops.arange(0), (0,), "int64"),
    "linspace": (lambda: ops.linspace(0, 1, 0), (0,), "float32"),
    "softmax rows": (lambda: ops.softmax(_z(0, 8), -1), (0, 8), "float32"),
    "softmax columns": (lambda: ops.softmax(_z(3, 0, dtype="float16"), -1), (3, 0), "float16"),
    "log_softmax": (lambda: ops.log_softmax(_z(0, 8), 0), (0, 8), "float32"),
    "layer_norm": (lambda: ops.layer_norm(_z(0, 8), (8,)), (0, 8), "float32"),
    "rms_norm": (lambda: ops.rms_norm(_z(0, 2, 8, dtype="bfloat16"), (2, 8)), (0, 2, 8), "bfloat16"),
    "mm rows": (lambda: ops.mm(_z(0, 8), _z(8, 4)), (0, 4), "float32"),
    "mm columns": (lambda: ops.mm(_z(3, 8), _z(8, 0)), (3, 0), "float32"),
    "matmul batched": (lambda: ops.matmul(_z(2, 0, 8), _z(8, 4)), (2, 0, 4), "float32"),
    "bmm": (lambda: ops.bmm(_z(0, 3, 8), _z(0, 8, 4)), (0, 3, 4), "float32"),
    "mv": (lambda: ops.mv(_z(0, 3), _z(3)), (0,), "float32"),
    "addmm": (lambda: ops.addmm(_z(4), _z(0, 8), _z(8, 4)), (0, 4), "float32"),
    "embedding": (lambda: ops.embedding(_z(2, 0, dtype="int64"), _z(10, 8, dtype="float16")), (2, 0, 8), "float16"),
    "argmax": (lambda: ops.argmax(_z(0, 8), 1), (0,), "int64"),
    "argmax keepdim": (lambda: ops.argmax(_z(0, 8), 1, keepdim=True), (0, 1), "int64"),
    "topk k=0": (lambda: ops.topk(_z(3, 8), 0).values, (3, 0), "float32"),
    "topk indices": (lambda: ops.topk(_z(0, 8), 2).indices, (0, 2), "int64"),
    "cross_entropy none": (
        lambda: ops.cross_entropy(_z(0, 5), _z(0, dtype="int64"), reduction="none"),
        (0,),
        "float32",
    ),
    "sdpa": (
        lambda: ops.scaled_dot_product_attention(
            _z(0, 2, 4, 16, dtype="float16"), *[_z(0, 2, 4, 16, dtype="float16")] * 2
        ),
        (0, 2, 4, 16),
        "float16",
    ),
    "conv2d": (
        lambda: ops.conv2d(_z(0, 4, 8, 8, dtype="float16"), _z(6, 4, 3, 3, dtype="float16"), padding=1, stride=2),
        (0, 6, 4, 4),
        "float16",
    ),
    "group_norm": (lambda: ops.group_norm(_z(0, 4, 3, 3), 2), (0, 4, 3, 3), "float32"),
    "interpolate": (
        lambda: ops.interpolate(_z(0, 2, 3, 4, dtype="float16"), scale_factor=2),
        (0, 2, 6, 8),
        "float16",
    ),
}


@pytest.mark.parametrize("name", sorted(EMPTY))
def test_an_empty_result_launches_nothing(name, no_certificates):
    call, shape, dtype = EMPTY[name]
    got = call()
    assert tuple(got.shape) == shape and got.dtype.name == dtype


@pytest.mark.parametrize(
    "call, error, says",
    [
        (lambda: ops.add(_z(0, 8), _z(3, 8)), ShapeMismatch, "do not broadcast"),
        (lambda: ops.softmax(_z(3, 0), 2), ViewError, "dim 2 is out of range"),
        (lambda: ops.layer_norm(_z(0, 8), (8,), _z(7)), ShapeMismatch, "weight has shape (7,)"),
        (lambda: ops.rms_norm(_z(0, 8), (4,)), ShapeMismatch, "not the trailing shape"),
        (lambda: ops.mm(_z(3, 0), _z(5, 4)), ShapeMismatch, "inner dimensions differ"),
        (lambda: ops.exp(_z(0, 3), out=_z(3, 0)), ShapeMismatch, "out has shape (3, 0)"),
        (lambda: ops.argmax(_z(3, 0), 1), ShapeMismatch, "no element to choose along dimension 1"),
        (lambda: ops.argmax(_z(0, 3)), ShapeMismatch, "no element to choose along its flattened elements"),
        (lambda: ops.topk(_z(0, 8), 9), ShapeMismatch, "k=9 is out of range"),
        (lambda: ops.softmax(_z(0, 3, dtype="int32"), 1), ShapeMismatch, "int32"),
    ],
)
def test_an_invalid_call_on_empty_tensors_is_refused_as_on_any(call, error, says, no_certificates):
    with pytest.raises(error) as e:
        call()
    assert says in str(e.value)


def test_a_loss_over_no_sample_is_torchs():
    # "sum" of no loss is 0, "mean" 0/0: a one-element result (a fill, launched)
    target = _z(0, dtype="int64")
    assert ops.cross_entropy(_z(0, 5), target, reduction="sum").numpy() == 0.0
    assert np.isnan(ops.cross_entropy(_z(0, 5), target).numpy())


def test_a_product_over_an_inner_dimension_of_0_is_zeros_or_beta_input():
    # torch: the sum over no terms is 0; addmm's result is then beta·input (broadcast), addmv's likewise
    assert np.array_equal(ops.mm(_z(3, 0), _z(0, 4)).numpy(), np.zeros((3, 4), np.float32))
    assert np.array_equal(ops.matmul(_z(3, 0), _z(0)).numpy(), np.zeros(3, np.float32))
    got = ops.addmm(_z(4, value=2.0), _z(3, 0), _z(0, 4), beta=0.5).numpy()
    assert np.array_equal(got, np.ones((3, 4), np.float32))
    got = ops.baddbmm(_z(2, 3, 4, value=3.0), _z(2, 3, 0), _z(2, 0, 4)).numpy()
    assert np.array_equal(got, np.full((2, 3, 4), 3.0, np.float32))
    assert np.array_equal(ops.addmv(_z(3, value=1.0), _z(3, 0), _z(0), beta=2).numpy(), np.full(3, 2.0, np.float32))
    out = _z(3, 4, value=7.0)
    assert ops.mm(_z(3, 0), _z(0, 4), out=out) is out and np.array_equal(out.numpy(), np.zeros((3, 4), np.float32))
