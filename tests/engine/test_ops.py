"""`nbxcert.ops`: torch's names and signatures over the pointwise kernel: out=, in-place forms, Python scalars,
broadcasting, promotion of mixed dtypes, one-line errors, and an import that loads no kernel and never torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from devicetools import DEVICE, from_numpy

from nbxcert import ops  # noqa: E402
from nbxcert.errors import ArgumentNotSupported, CastRefused, DTypeError, LaunchError, ShapeMismatch  # noqa: E402


def _t(values, dtype):
    return from_numpy(np.asarray(values, dtype))


def test_import_is_cheap_and_torch_free():
    code = (
        "import sys; from nbxcert import ops; print('nbxcert.kernels.pointwise' in sys.modules, 'torch' in sys.modules)"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert got == ["False", "False"]


def test_add_alpha_out_and_inplace():
    a = _t([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = _t([10.0, 20.0], np.float32)
    np.testing.assert_array_equal(ops.add(a, b, alpha=2).numpy(), [[21, 42], [23, 44]])
    out = ops.zeros(2, 2, device=DEVICE)
    assert ops.add(a, 1, out=out) is out
    np.testing.assert_array_equal(out.numpy(), [[2, 3], [4, 5]])
    ops.mul_(a, b)
    np.testing.assert_array_equal(a.numpy(), [[10, 40], [30, 80]])


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: ops.add(_t([1, 2], np.int32), 2.5), "float32"),
        (lambda: ops.add(_t([1, 2], np.int32), 2), "int32"),
        (lambda: ops.add(_t([1, 2], np.int8), _t([1, 2], np.int64)), "int64"),
        (lambda: ops.add(_t([1, 2], np.float16), _t([1, 2], np.float64)), "float64"),
        (lambda: ops.div(_t([1, 2], np.int32), _t([2, 2], np.int32)), "float32"),
        (lambda: ops.div(_t([1, 2], np.int32), 2, rounding_mode="floor"), "int32"),
        (lambda: ops.exp(_t([1, 2], np.int64)), "float32"),
        (lambda: ops.gt(_t([1, 2], np.float16), 1), "bool"),
        (lambda: ops.where(_t([True, False], np.bool_), _t([1, 2], np.int32), 0.5), "float32"),
        (lambda: ops.mul(_t([True, False], np.bool_), _t([True, True], np.bool_)), "bool"),
    ],
)
def test_promotion(make, expected):
    assert make().dtype.name == expected


def test_values_of_mixed_ops():
    x = _t([-2.0, -0.5, 0.0, 1.5], np.float32)
    np.testing.assert_array_equal(ops.relu(x).numpy(), [0, 0, 0, 1.5])
    np.testing.assert_array_equal(ops.clamp(x, min=-1, max=1).numpy(), [-1, -0.5, 0, 1])
    np.testing.assert_array_equal(ops.where(ops.lt(x, 0), 0.0, x).numpy(), [0, 0, 0, 1.5])
    np.testing.assert_array_equal(ops.masked_fill(x, ops.lt(x, 0), 9.0).numpy(), [9, 9, 0, 1.5])
    np.testing.assert_array_equal(ops.div(_t([7, -7], np.int32), 2, rounding_mode="trunc").numpy(), [3, -3])
    np.testing.assert_array_equal(ops.remainder(_t([7, -7], np.int32), 3).numpy(), [1, 2])
    np.testing.assert_array_equal(ops.arange(1, 7, 2, device=DEVICE).numpy(), [1, 3, 5])
    np.testing.assert_allclose(ops.linspace(0, 1, 5, device=DEVICE).numpy(), [0, 0.25, 0.5, 0.75, 1])
    np.testing.assert_array_equal(ops.full((2,), 7, device=DEVICE).numpy(), [7, 7])
    np.testing.assert_array_equal(ops.to(_t([1.9, -1.9], np.float32), "int32").numpy(), [1, -1])
    same = _t([1.5, -2.5], np.float32)
    assert ops.to(same, "float32") is same  # torch's .to returns the tensor itself when nothing changes
    copied = ops.to(same, "float32", copy=True)
    assert copied is not same and copied.data_ptr() != same.data_ptr() and copied.numpy().tolist() == [1.5, -2.5]
    np.testing.assert_allclose(ops.glu(_t([[0.0, 1.0, 0.0, 0.0]], np.float32)).numpy(), [[0.0, 0.5]])
    assert ops.logsigmoid is ops.log_sigmoid


def test_copy_into_a_strided_view_and_fill():
    dst = ops.zeros(3, 4, device=DEVICE)
    ops.copy_(dst.T, from_numpy(np.arange(12, dtype=np.float64).reshape(4, 3)))
    np.testing.assert_array_equal(dst.numpy(), np.arange(12).reshape(4, 3).T)
    ops.fill_(dst[:, ::2], -1.0)
    assert (dst.numpy()[:, ::2] == -1).all() and (dst.numpy()[:, 1::2] >= 0).all()


@pytest.mark.parametrize(
    ("view", "strides"),
    [
        (lambda x: x.T, (1, 6)),  # dense in another order: copied as it lies, its strides kept
        (lambda x: x.view(2, 3, 4).permute(2, 0, 1), (1, 12, 4)),
        (lambda x: x[:, ::2], (3, 1)),  # not dense: dense strides in the view's order of dimensions
        (lambda x: x[:, ::2].T, (1, 3)),
        (lambda x: x[:, :1].expand(4, 5), (5, 1)),  # a broadcast dimension
        (lambda x: x, (6, 1)),
    ],
)
def test_clone_keeps_the_layout_as_torch_does(view, strides):
    """torch.clone's default memory_format (preserve_format): the copy of a dense view keeps its strides (a
    transposed tensor's clone is a copy in storage order, not a transpose), any other view gets dense strides in its
    order of dimensions; contiguous_format gives a contiguous copy; values equal in every case."""
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = view(from_numpy(host))
    c = ops.clone(v)
    assert c.strides == strides and c.shape == v.shape
    np.testing.assert_array_equal(c.numpy(), v.numpy())
    for fmt in ("contiguous_format", "torch.contiguous_format"):
        d = ops.clone(v, memory_format=fmt)
        assert d.is_contiguous()
        np.testing.assert_array_equal(d.numpy(), v.numpy())
    with pytest.raises(ArgumentNotSupported, match="clone: memory_format=channels_last"):
        ops.clone(v, memory_format="channels_last")


X = np.arange(24, dtype=np.float32).reshape(4, 6) - 11.5


def _x():
    return from_numpy(X)


def _dense(t):
    return ops.clone(t, memory_format="contiguous_format")


@pytest.mark.parametrize(
    ("make", "host", "strides"),
    [  # torch's result strides for these calls (TensorIterator: the first operand that orders two dimensions decides)
        (lambda: ops.add(_x().T, _x().T), lambda: X.T + X.T, (1, 6)),  # a shared layout: the result has it too
        (lambda: ops.add(_x().T, _dense(_x().T)), lambda: X.T + X.T, (1, 6)),
        (lambda: ops.add(_dense(_x().T), _x().T), lambda: X.T + X.T, (4, 1)),
        (lambda: ops.mul(_x().T, 2.0), lambda: X.T * 2, (1, 6)),
        (lambda: ops.add(_x().T, from_numpy(np.ones(4, np.float32))), lambda: X.T + 1, (1, 6)),  # a broadcast row
        (lambda: ops.neg(_x().T), lambda: -X.T, (1, 6)),
        (lambda: ops.add(_x()[:, ::2], _x()[:, ::2]), lambda: 2 * X[:, ::2], (3, 1)),  # not dense: dense strides
        (
            lambda: ops.sub(_x().view(2, 3, 4).permute(2, 0, 1), ops.neg(_x().view(2, 3, 4).permute(2, 0, 1))),
            lambda: 2 * X.reshape(2, 3, 4).transpose(2, 0, 1),
            (1, 12, 4),
        ),
    ],
)
def test_an_elementwise_result_is_laid_out_as_torch_lays_it_out(make, host, strides):
    """A new result's strides follow its operands' layout as torch's do; its values are the op's on numpy arrays."""
    got = make()
    assert got.strides == strides
    np.testing.assert_array_equal(got.numpy(), host())


def test_operands_that_share_a_layout_are_served_the_dense_key(tmp_path, monkeypatch):
    """An op over two transposed operands (and a clone of one) runs over storage in order: the key is the dense
    one, as for contiguous operands, not the transposed layout's gather."""
    import json

    from nbxcert import serving

    record = tmp_path / "keys.jsonl"
    monkeypatch.setenv("NBXCERT_KEY_RECORD", str(record))
    serving.reset()  # the serving state reads the variable once
    a, b = _x(), _x()
    got = ops.add(a.T, b.T)
    np.testing.assert_array_equal(got.numpy(), a.numpy().T + b.numpy().T)
    into = ops.zeros(6, 4, device=DEVICE).T.T  # a contiguous output: the operands read transposed
    assert into.is_contiguous()
    ops.add(a.T, b.T, out=into)
    np.testing.assert_array_equal(into.numpy(), a.numpy().T + b.numpy().T)
    monkeypatch.delenv("NBXCERT_KEY_RECORD")
    serving.reset()
    keys = [json.loads(line)["key"] for line in record.read_text().splitlines()]
    assert [k.split("[")[1].split(";")[0] for k in keys if k.startswith("pw_add")] == [
        "numel=32,out=dense,x=dense,y=dense,z=none",
        "numel=32,out=dense,x=transposed,y=transposed,z=none",
    ], keys


def test_activation_inplace_and_keywords():
    x = _t([-1.0, 2.0], np.float32)
    y = ops.leaky_relu(x, negative_slope=0.5)
    np.testing.assert_array_equal(y.numpy(), [-0.5, 2.0])
    assert ops.relu_(x) is x and x.numpy()[0] == 0


def test_integer_pow_of_negative_tensor_exponents_is_torchs():
    """A negative exponent inside an integer tensor is not refused (only a negative Python-int exponent is): torch's
    1 for base 1, +-1 for base -1 by parity, else 0."""
    base = _t([1, -1, -1, 2, 0, -3], np.int32)
    got = ops.pow(base, _t([-5, -3, -4, -1, -2, 2], np.int32))
    np.testing.assert_array_equal(got.numpy(), [1, -1, 1, 0, 0, 9])


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: ops.bitwise_and(_t([1.0], np.float32), _t([1.0], np.float32)), DTypeError, "not supported"),
        (lambda: ops.add(_t([1, 2, 3], np.float32), _t([1, 2], np.float32)), ShapeMismatch, "do not broadcast"),
        (
            lambda: ops.add(_t([1.0], np.float32), 1, out=ops.zeros(1, dtype="int32", device=DEVICE)),
            CastRefused,
            "can't be cast",
        ),
        (
            lambda: ops.add(_t([1.0, 2.0], np.float32), 1, out=ops.zeros(3, device=DEVICE)),
            ShapeMismatch,
            "out has shape",
        ),
        (lambda: ops.div(_t([1], np.int32), 0, rounding_mode="floor").numpy(), LaunchError, "divisor 0"),
        (lambda: ops.to(_t([np.nan], np.float32), "int16").numpy(), LaunchError, "16-bit integer"),
        (lambda: ops.div(_t([1], np.int32), 1, rounding_mode="round"), DTypeError, "rounding_mode"),
        (lambda: ops.pow(_t([2, 3], np.int16), -1), DTypeError, "negative integer powers"),
    ],
)
def test_errors_are_one_line(call, error, text):
    with pytest.raises(error, match=text) as info:
        call()
    assert "\n" not in str(info.value)


def test_the_namespace_lists_the_ops_not_its_imports():
    names = dir(ops)
    assert {"add", "add_", "empty", "empty_like", "matmul", "rms_norm", "add_rms_norm", "flash_attention"} <= set(names)
    assert not {"math", "importlib", "annotations", "Any"} & set(names)
    assert names == sorted(ops.__all__) and not [n for n in names if n.startswith("_")]


def test_empty_has_the_shape_and_dtype_asked():
    e = ops.empty(2, 3, dtype="int8", device=DEVICE)
    assert e.shape == (2, 3) and e.dtype.name == "int8"
    like = ops.empty_like(_t([[1.0, 2.0]], np.float16))
    assert like.shape == (1, 2) and like.dtype.name == "float16"
    assert ops.empty((1, 2), out=like) is like
    with pytest.raises(ShapeMismatch, match="out has shape"):
        ops.empty(3, out=like)


def test_other_families_are_reachable():
    from nbxcert.kernels import elementwise

    # torch's names are wrappers with torch's signatures (tests/kernels/test_ops_families.py); nbxcert's own ops are
    # its functions themselves
    assert callable(ops.matmul) and callable(ops.rms_norm) and ops.rope is elementwise.rope
    with pytest.raises(AttributeError):
        ops.no_such_op  # noqa: B018


# --- torch's semantics a review found missing (each failed before) ----------------------------------------------------
def test_a_positional_inplace_is_torchs_inplace():
    """F.elu(x, 1.0, True), F.silu(x, True), ...: the last positional argument is `inplace` (it was dropped)."""
    x = _t([-2.0, -0.5, 0.0, 0.5, 2.0], np.float32)
    want = ops.silu(x).numpy()
    assert ops.silu(x, True) is x
    np.testing.assert_array_equal(x.numpy(), want)
    y = _t([-2.0, 2.0], np.float32)
    assert ops.leaky_relu(y, 0.5, True) is y
    np.testing.assert_array_equal(y.numpy(), [-1.0, 2.0])
    with pytest.raises(DTypeError, match=r"elu\(\) takes 3 positional arguments at most, 4 given"):
        ops.elu(y, 1.0, True, 7)


def test_alpha_is_checked_as_torch_checks_it():
    """An integer add with alpha=1.5 ran with alpha 1; torch refuses a floating alpha for an integral result and a
    bool alpha for a non-bool one."""
    a = _t([1, 2, 3], np.int64)
    with pytest.raises(DTypeError, match="argument alpha must not be a floating point number"):
        ops.add(a, a, alpha=1.5)
    with pytest.raises(DTypeError, match="argument alpha must not be a floating point number"):
        ops.sub(a, 1, alpha=0.5)
    with pytest.raises(DTypeError, match="boolean alpha only supported for Boolean results"):
        ops.add(a, a, alpha=True)
    with pytest.raises(DTypeError, match="add: alpha must be a number, got str"):
        ops.add(a, a, alpha="2")
    np.testing.assert_array_equal(ops.add(a, 1.0, alpha=1.5).numpy(), [2.5, 3.5, 4.5])  # a float result: fine


def test_clamp_takes_tensor_bounds_and_fills_take_a_0_dim_tensor():
    x = _t([0.0, 1.0, 5.0], np.float32)
    np.testing.assert_array_equal(ops.clamp(x, min=_t([2.0, 0.0, 2.0], np.float32)).numpy(), [2, 1, 5])
    np.testing.assert_array_equal(ops.clamp(x, 1.0, _t([3.0], np.float32)).numpy(), [1, 1, 3])
    mask = _t([True, False, True], np.bool_)
    np.testing.assert_array_equal(ops.masked_fill(x, mask, _t(7.0, np.float32)).numpy(), [7, 1, 7])
    np.testing.assert_array_equal(ops.fill_(_t([0, 0], np.int32), _t(3, np.int64)).numpy(), [3, 3])
    with pytest.raises(DTypeError, match="value must be a number or a 0-dim tensor"):
        ops.fill_(x, _t([1.0, 2.0], np.float32))
    with pytest.raises(DTypeError, match="fill_: value must be a number, got str"):
        ops.fill_(x, "7")


def test_writes_into_overlapping_memory_are_refused():
    """An expanded view written to (the last write won), and an out= that partly overlaps an input (a race on a
    GPU), are refused as torch refuses them; the input itself as out (in place) is fine."""
    from nbxcert.errors import ViewError

    with pytest.raises(ViewError, match="more than one element of the written-to tensor"):
        ops.add_(_t([1.0], np.float32).expand(3), _t([1.0, 2.0, 3.0], np.float32))
    a = _t([1.0, 2.0, 3.0, 4.0], np.float32)
    with pytest.raises(ViewError, match="partly overlap"):
        ops.add(a[0:3], 1.0, out=a[1:4])
    ops.add(a[1:4], 1.0, out=a[1:4])
    np.testing.assert_array_equal(a.numpy(), [1, 3, 4, 5])


def test_factories_check_out_and_take_dtype_none():
    with pytest.raises(ShapeMismatch, match=r"ones: out has shape \(5,\), the size asked is \(2,\)"):
        ops.ones(2, out=ops.empty(5, device=DEVICE))
    with pytest.raises(DTypeError, match="zeros: dtype int64 does not match out's, float32"):
        ops.zeros(2, dtype="int64", out=ops.empty(2, device=DEVICE))
    for make in (ops.zeros, ops.ones, ops.empty):
        assert make(2, dtype=None, device=DEVICE).dtype.name == "float32"
    assert ops.linspace(0, 1, 3, dtype=None, device=DEVICE).dtype.name == "float32"
    assert ops.full((2,), 3, out=ops.empty(2, dtype="int32", device=DEVICE)).dtype.name == "int32"


def test_fill_values_that_overflow_the_dtype_are_refused():
    with pytest.raises(DTypeError, match="value 300 cannot be converted to int8 without overflow"):
        ops.full((2,), 300, dtype="int8", device=DEVICE)
    with pytest.raises(DTypeError, match="cannot be converted to float16 without overflow"):
        ops.full((2,), 1e6, dtype="float16", device=DEVICE)
    with pytest.raises(DTypeError, match="without overflow"):
        ops.masked_fill(_t([1, 2], np.int8), _t([True, False], np.bool_), 300)
    np.testing.assert_array_equal(ops.full((2,), -1, dtype="uint8", device=DEVICE).numpy(), [255, 255])  # as torch
    assert np.isinf(ops.full((1,), float("inf"), dtype="float16", device=DEVICE).float64()).all()


def test_arange_and_linspace_as_torch():
    np.testing.assert_array_equal(ops.arange(end=4, device=DEVICE).numpy(), [0, 1, 2, 3])
    with pytest.raises(DTypeError, match="inconsistent with step sign"):
        ops.arange(0, 10, -1, device=DEVICE)
    got = ops.linspace(0, 10, 5, dtype="int64", device=DEVICE)
    assert got.dtype.name == "int64"
    np.testing.assert_array_equal(got.numpy(), [0, 2, 5, 7, 10])


def test_to_and_copy_take_torchs_positional_arguments():
    x = _t([1.5, -2.5], np.float32)
    y = ops.to(x, "float32", False, True)  # (dtype, non_blocking, copy)
    assert y is not x
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    dst = _t([0.0, 0.0], np.float32)
    ops.copy_(dst, x, False)
    np.testing.assert_array_equal(dst.numpy(), x.numpy())


def test_foreign_views_that_overlap_are_refused_by_address():
    """Two numpy views of one array come in as two storages over one memory: the overlap is found by address (by
    storage it was not, and an out= a[1:] of a[:-1] was accepted: a race on a GPU)."""
    from nbxcert.errors import ViewError

    a = np.arange(8, dtype=np.float32)
    with pytest.raises(ViewError, match="partly overlap"):
        ops.mul(a[:-1], 2.0, out=a[1:])
    b = np.arange(4, dtype=np.float32)
    ops.add(b, 1.0, out=b)  # the same memory, the same view: in place
    np.testing.assert_array_equal(b, [1, 2, 3, 4])


def test_numpy_scalars_are_numbers_and_a_cast_to_a_dtype_it_lacks_is_one_line():
    x = _t([0.0, 1.0, 2.0], np.float32)
    np.testing.assert_array_equal(ops.mul(x, np.float32(2.0)).numpy(), [0, 2, 4])
    np.testing.assert_array_equal(ops.masked_fill(x, _t([True, False, True], np.bool_), np.int64(7)).numpy(), [7, 1, 7])
    with pytest.raises(DTypeError, match="cast: dtype float8_e4m3fn is not supported"):
        ops.to(x, "float8_e4m3fn")


def test_memory_its_library_does_not_let_be_written_is_refused(tmp_path):
    """A read-only numpy array (and a memory-mapped file opened read-only, where the write crashed the process) is
    read, never written: in-place ops, `out=`, `copy_` and `fill_` into it are refused (they wrote it behind its
    flag); a writable array is written as before."""
    from nbxcert.errors import ViewError

    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    for write in (
        lambda: ops.add_(ro, 1.0),
        lambda: ops.add(np.ones(4, np.float32), 1.0, out=ro),
        lambda: ops.copy_(ro, np.ones(4, np.float32)),
        lambda: ops.fill_(ro, 1.0),
    ):
        with pytest.raises(ViewError, match="memory its library does not let be written"):
            write()
    np.testing.assert_array_equal(ro, [0, 1, 2, 3])
    np.testing.assert_array_equal(ops.add(ro, 1.0), [1, 2, 3, 4])  # read, as before
    np.save(tmp_path / "w.npy", np.zeros(4, np.float32))
    mapped = np.load(tmp_path / "w.npy", mmap_mode="r")
    with pytest.raises(ViewError, match="memory its library does not let be written"):
        ops.add_(mapped, 1.0)
    w = np.arange(4, dtype=np.float32)
    ops.add_(w, 1.0)
    np.testing.assert_array_equal(w, [1, 2, 3, 4])


def test_a_jax_array_and_a_read_only_numpy_array_are_memory_not_to_be_written():
    """Which caller objects `nbxcert.ops` keeps from being written: every JAX array (immutable; JAX is not installed
    here, so the rule itself is asserted), a numpy array with its writeable flag off, never a writable one or
    another library's tensor."""
    from nbxcert.ops import _foreign_read_only

    ro = np.zeros(2)
    ro.flags.writeable = False
    assert _foreign_read_only("jax", object()) and _foreign_read_only("numpy", ro)
    assert not _foreign_read_only("numpy", np.zeros(2)) and not _foreign_read_only("torch", ro)
