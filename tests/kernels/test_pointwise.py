"""The pointwise family (`nbxcert.kernels.pointwise`): the one map kernel's indexing (strides, broadcasting, merged
dimensions, strided outputs, the dense path), its keys and layout classes, every config giving the same bits, the
refusals, and each op against its oracle on seeded data with special values mixed in (a tiny shape per op and
dtype here; every example problem under `slow`)."""

from __future__ import annotations

import numpy as np
import pytest
from devicetools import DEVICE, empty, from_numpy

from nbxcert.errors import LaunchError  # noqa: E402
from nbxcert.kernels import pointwise as pw  # noqa: E402
from nbxcert.kernels.check import run_checked  # noqa: E402


def _run(op, operands, out, params=None, config=None):
    row = pw.OPS[op]
    common = pw.common_of(row, [t.dtype.name if hasattr(t, "dtype") else out.dtype.name for t in operands] + [""])
    via, compute, kparams, p_float = pw.plan_for(row, operands, common, out, params or {})
    padded = list(operands) + [None] * (3 - len(operands))
    return pw.pointwise_call(op, *padded, out, via, compute, kparams, p_float, config or pw.DEFAULT)


def _rand(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("layout", ["dense", "transposed", "sliced", "broadcast_row", "broadcast_col", "expanded"])
def test_add_reads_every_layout(layout):
    a = _rand((6, 5, 4))
    b_host = _rand((6, 5, 4), 1)
    if layout == "dense":
        b = from_numpy(b_host)
    elif layout == "transposed":
        b_host = _rand((4, 5, 6), 1)
        b = from_numpy(b_host).permute(2, 1, 0)
        b_host = b_host.transpose(2, 1, 0)
    elif layout == "sliced":
        big = _rand((6, 5, 8), 1)
        b, b_host = from_numpy(big)[..., ::2], big[..., ::2]
    elif layout == "broadcast_row":
        b_host = _rand((4,), 1)
        b = from_numpy(b_host)
    elif layout == "broadcast_col":
        b_host = _rand((6, 1, 1), 1)
        b = from_numpy(b_host)
    else:
        b_host = _rand((1, 5, 1), 1)
        b = from_numpy(b_host).expand(6, 5, 4)
    out = empty((6, 5, 4), "float64")
    _run("add", [from_numpy(a), b], out, {"alpha": 1})
    np.testing.assert_array_equal(out.numpy(), a + b_host)


def test_strided_output_and_six_dims():
    """A 6-d permuted operand into a strided output: no dimension merges, every index slot is used."""
    host = _rand((2, 3, 2, 3, 2, 3))
    x = from_numpy(host).permute(5, 4, 3, 2, 1, 0)
    buf = empty((3, 2, 3, 2, 3, 4), "float64")
    out = buf[..., ::2]
    _run("neg", [x], out)
    np.testing.assert_array_equal(out.numpy(), -host.transpose(5, 4, 3, 2, 1, 0))


def test_seven_unmergeable_dims_are_refused():
    x = from_numpy(_rand((2,) * 7)).permute(6, 5, 4, 3, 2, 1, 0)
    with pytest.raises(LaunchError, match="at most 6"):
        _run("neg", [x], empty((2,) * 7, "float64"))


def test_merge_dims_and_dense_flag():
    sizes, strides = pw.merge_dims((4, 5, 6), (30, 6, 1), (30, 6, 1))
    assert sizes == [120] and strides == [[1], [1]]
    sizes, _ = pw.merge_dims((4, 5, 6), (30, 6, 1), (0, 6, 1))
    assert sizes == [4, 30]
    plan = pw.Plan("neg", ("float32",) * 3, "float64", (None, None, None), (0, 0, 0), True)
    x = from_numpy(_rand((4, 6), dtype=np.float32))
    dense = pw.map_launches(pw.DEFAULT, plan, [x], empty((4, 6), "float32"))[0]
    strided = pw.map_launches(pw.DEFAULT, plan, [x.T], empty((6, 4), "float32"))[0]
    assert dense.kwargs["DENSE"] and not strided.kwargs["DENSE"] and strided.kwargs["NDIM"] == 2


def test_keys_hold_layout_classes():
    shape = (4, 6)
    x = from_numpy(_rand(shape))
    assert pw.layout_of(x, shape) == "dense"
    assert pw.layout_of(x.T, (6, 4)) == "transposed"
    assert pw.layout_of(from_numpy(_rand((4, 12)))[:, ::2], shape) == "strided"
    assert pw.layout_of(from_numpy(_rand((6,))), shape) == "broadcast"
    assert pw.layout_of(2.0, shape) == "scalar" and pw.layout_of(None, shape) == "none"
    problem = pw.problem_of("add", [x, 1.5], empty((6, 4), "float64").T)
    assert problem == {"numel": 24, "x": "dense", "y": "scalar", "z": "none", "out": "strided"}
    assert pw.SPECS["add"].key_fields[0].ladder == "numel"


def test_a_transposed_key_of_a_bucket_starting_at_a_prime_count_is_made_and_checked():
    """The bucket (256, 512] of the numel ladder starts at 257, a prime: no 2-d shape, no transposed view. Its key's
    smallest member is made at the next count, 258 (a census found every candidate of such keys refused there)."""
    from nbxcert.keys import key_problems, make_key
    from nbxcert.profiles import get_profile

    spec = pw.SPECS["abs"]
    problem = {"numel": 300, "x": "transposed", "y": "none", "z": "none", "out": "dense"}
    key = make_key(spec, problem, ("bfloat16", "bfloat16"), get_profile("hopper"))
    smallest = key_problems(spec, key, get_profile("hopper"))["smallest"]
    assert smallest["numel"] == 257
    inputs = spec.make_inputs(smallest, key.dtypes, 0, DEVICE)
    x, out = inputs.tensors["x"], inputs.tensors["out"]
    assert inputs.problem["numel"] == out.numel == 258 and pw.layout_of(x, tuple(out.shape)) == "transposed"
    spec.launch(pw.DEFAULT, inputs)
    ref = spec.oracle(inputs)["out"].value
    assert np.array_equal(out.float64(), ref, equal_nan=True)


def test_every_config_gives_the_same_bits():
    x = from_numpy(_rand((7, 300), dtype=np.float32))
    results = []
    for config in pw.flat_candidates()[::4]:
        out = empty((7, 300), "float32")
        _run("silu", [x], out, config=config)
        results.append(out.numpy().tobytes())
    assert len(set(results)) == 1


def test_integer_division_by_zero_is_refused():
    x = from_numpy(np.array([5, 7, 9], np.int32))
    y = from_numpy(np.array([1, 0, 2], np.int32))
    out = empty((3,), "int32")
    with pytest.raises(LaunchError, match="divisor 0 at index 1"):  # on a GPU: at the read, the first sync after
        _run("remainder", [x, y], out)
        out.numpy()


@pytest.mark.parametrize("value", [np.nan, np.inf, 3e9])
def test_float_to_int_cast_out_of_range_is_refused(value):
    x = from_numpy(np.array([1.0, value], np.float64))
    out = empty((2,), "int32")
    with pytest.raises(LaunchError, match="32-bit integer"):  # on a GPU: at the read, the first sync after
        _run("cast", [x], out)
        out.numpy()


def test_integer_semantics():
    info = np.iinfo(np.int8)
    x = from_numpy(np.array([info.min, -7, 7, 100, 3], np.int8))
    y = from_numpy(np.array([-1, 2, -2, 100, 9], np.int8))
    cases = {
        "div_floor": [info.min, -4, -4, 1, 0],
        "div_trunc": [info.min, -3, -3, 1, 0],
        "remainder": [0, 1, -1, 0, 3],
        "fmod": [0, -1, 1, 0, 3],
        "add": [127, -5, 5, -56, 12],
        "abs": [info.min, 7, 7, 100, 3],
        "bitwise_left_shift": [0, -28, 0, 0, 0],
        "bitwise_right_shift": [-1, -2, 0, 0, 0],
    }
    for op, expected in cases.items():
        out = empty((5,), "int8")
        _run(op, [x, y] if pw.OPS[op].arity == 2 else [x], out, {"alpha": 1} if op == "add" else {})
        np.testing.assert_array_equal(out.numpy(), np.array(expected, np.int8), err_msg=op)


def test_float_fmod_is_exact_over_every_binade():
    a = np.array([1e300, -1e300, 5.0, 3.0, -0.0, np.inf, 1.0, 7.5, 1e-310])
    b = np.array([3.0, 7e-310, 5e-324, np.inf, 2.0, 1.0, 0.0, -2.0, 3e-311])
    out = empty(a.shape, "float64")
    _run("fmod", [from_numpy(a), from_numpy(b)], out)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out.numpy(), np.fmod(a, b))


def _specs_with_oracle():
    mod = pw.oracle_module()
    return [name for name, op in pw.OPS.items() if hasattr(mod, op.oracle or name)]


def _first_dtypes(name):
    spec = pw.SPECS[name]
    return [spec.dtypes[0], spec.dtypes[-1]] if len(spec.dtypes) > 1 else list(spec.dtypes)


@pytest.mark.parametrize(("name", "dtypes"), [(n, d) for n in _specs_with_oracle() for d in _first_dtypes(n)], ids=str)
def test_op_against_its_oracle(name, dtypes, profile):
    spec = pw.SPECS[name]
    for problem in spec.example_problems:
        verdicts = run_checked(spec, spec.default, problem, dtypes, profile, 7, DEVICE)
        for v in verdicts.values():
            assert v.ok, v.report


@pytest.mark.slow
@pytest.mark.parametrize("name", _specs_with_oracle())
def test_op_against_its_oracle_every_dtype(name, profile):
    spec = pw.SPECS[name]
    for dtypes in spec.dtypes:
        for problem in spec.example_problems:
            for v in run_checked(spec, spec.default, problem, dtypes, profile, 11, DEVICE).values():
                assert v.ok, v.report


def test_every_op_has_a_spec_and_runs(profile):
    """Every row launches on its example problem and first dtype (no oracle needed: the output is written, no NaN
    poison left where the op cannot make one)."""
    for name, spec in pw.SPECS.items():
        assert spec.name == f"pw_{name}" and spec.family == "pointwise"
        inputs = spec.make_inputs(spec.example_problems[0], spec.dtypes[0], 3, DEVICE)
        spec.launch(spec.default, inputs)


@pytest.mark.slow
def test_every_op_cross_compiles_for_hopper():
    """Each op's default config on its mixed-layout example, at its first and last dtype tuple, compiles for sm_90
    (the census's cross-compiling backend, no GPU): 0 failures."""
    import crosstools

    items = []
    for spec in pw.SPECS.values():
        for dtypes in {spec.dtypes[0], spec.dtypes[-1]}:
            problem = spec.example_problems[1]
            items.append(
                {"spec": spec.name, "config": pw.DEFAULT.as_dict(), "problem": problem, "dtypes": list(dtypes)}
            )
    results = crosstools.cross_compile(90, crosstools.launch_specs, items, 900)
    assert len(results) == len(items)
    failed = [(r["spec"], r["dtypes"], r.get("error", "")[-300:]) for r in results if not r["ok"]]
    assert not failed, failed
