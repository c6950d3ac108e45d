"""The pointwise family (`nbxcert.kernels.pointwise`): the one map kernel's indexing (strides, broadcasting, merged
dimensions, strided outputs, the dense path), its keys and layout classes, every config giving the same bits, the
refusals, and each op against its oracle on seeded data with special values mixed in (a tiny shape per op and
dtype here; every example problem under `slow`)."""

from __future__ import annotations

import numpy as np
import pytest
from devicetools import DEVICE, empty, from_numpy

from nbxcert.errors import LaunchError  # noqa: E402
from nbxcert.kernels import indexing  # noqa: E402
from nbxcert.kernels import pointwise as pw  # noqa: E402
from nbxcert.kernels.check import run_checked  # noqa: E402
from nbxcert.kernels.tensor import from_bits as _from_bits  # noqa: E402


def _run(op, operands, out, params=None, config=None):
    row = pw.OPS[op]
    common = pw.common_of(row, [t.dtype.name if hasattr(t, "dtype") else out.dtype.name for t in operands] + [""])
    via, compute, kparams, p_float = pw.plan_for(row, operands, common, out, params or {})
    padded = list(operands) + [None] * (3 - len(operands))
    return pw.pointwise_call(op, *padded, out, via, compute, kparams, p_float, config or pw.DEFAULT)


def _rand(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.fixture(params=["index32", "index64"])
def index_width(request, monkeypatch):
    """Each indexing test twice: 32-bit indices (every tensor here is small) and the 64-bit path, forced by a bound of
    one element."""
    if request.param == "index64":
        monkeypatch.setattr(indexing, "INDEX32_BELOW", 1)
    return request.param


def _index_path(op, operands, out) -> tuple[bool, bool, bool]:
    """(DENSE, INDEX32, NATIVE_DIV) of the launch `_run` makes."""
    row = pw.OPS[op]
    common_dt = pw.common_of(row, [t.dtype.name for t in operands] + [""])
    via, compute, kparams, p_float = pw.plan_for(row, operands, common_dt, out, {})
    plan = pw.Plan(op, via, compute, (None, None, None), kparams, p_float)
    kw = pw.map_launches(pw.DEFAULT, plan, list(operands), out)[0].kwargs
    return kw["DENSE"], kw["INDEX32"], kw["NATIVE_DIV"]


# (rows, middle, inner): an inner size of 4 divides by a divider, 32 (a multiple of 16) by Triton's own division
@pytest.mark.parametrize("shape", [(6, 5, 4), (3, 5, 32)])
@pytest.mark.parametrize("layout", ["dense", "transposed", "sliced", "broadcast_row", "broadcast_col", "expanded"])
def test_add_reads_every_layout(layout, shape, index_width):
    r, m, c = shape
    a = _rand(shape)
    b_host = _rand(shape, 1)
    if layout == "dense":
        b = from_numpy(b_host)
    elif layout == "transposed":
        b_host = _rand((c, m, r), 1)
        b = from_numpy(b_host).permute(2, 1, 0)
        b_host = b_host.transpose(2, 1, 0)
    elif layout == "sliced":
        big = _rand((r, m, 2 * c), 1)
        b, b_host = from_numpy(big)[..., ::2], big[..., ::2]
    elif layout == "broadcast_row":
        b_host = _rand((c,), 1)
        b = from_numpy(b_host)
    elif layout == "broadcast_col":
        b_host = _rand((r, 1, 1), 1)
        b = from_numpy(b_host)
    else:
        b_host = _rand((1, m, 1), 1)
        b = from_numpy(b_host).expand(r, m, c)
    out = empty(shape, "float64")
    x = from_numpy(a)
    dense, index32, native = _index_path("add", [x, b], out)
    assert dense == (layout == "dense")
    assert index32 == (not dense and index_width == "index32")
    assert native == (index32 and c % 16 == 0)
    _run("add", [x, b], out, {"alpha": 1})
    np.testing.assert_array_equal(out.numpy(), a + b_host)


@pytest.mark.parametrize("inner", [3, 16])
def test_strided_output_and_six_dims(inner, index_width):
    """A 6-d permuted operand into a strided output: no dimension merges, every index slot is used; the output's
    inner stride 2 (a divider's path, whatever the inner size)."""
    host = _rand((inner, 3, 2, 3, 2, 3))
    x = from_numpy(host).permute(5, 4, 3, 2, 1, 0)
    buf = empty((3, 2, 3, 2, 3, 2 * inner), "float64")
    out = buf[..., ::2]
    assert _index_path("neg", [x], out) == (False, index_width == "index32", False)
    _run("neg", [x], out)
    np.testing.assert_array_equal(out.numpy(), -host.transpose(5, 4, 3, 2, 1, 0))


def test_six_dims_into_a_contiguous_output(index_width):
    """Six unmerged dimensions into a contiguous output whose inner size is a multiple of 16: Triton's own division
    in every slot under 32-bit indices."""
    host = _rand((16, 3, 2, 3, 2, 3))
    x = from_numpy(host).permute(5, 4, 3, 2, 1, 0)
    out = empty((3, 2, 3, 2, 3, 16), "float64")
    assert _index_path("neg", [x], out) == (False, index_width == "index32", index_width == "index32")
    _run("neg", [x], out)
    np.testing.assert_array_equal(out.numpy(), -host.transpose(5, 4, 3, 2, 1, 0))


@pytest.mark.parametrize("inner", [3, 16])
def test_three_operands_each_in_its_own_six_dim_layout(inner, index_width):
    """addcmul of three operands, each a different permutation of its own buffer (no dimension merges), into a
    strided output: every stride slot of every operand is read."""
    shape = (3, 2, 3, 2, 3, inner)
    perms = [(5, 4, 3, 2, 1, 0), (1, 0, 3, 2, 5, 4), (2, 5, 0, 4, 1, 3)]
    hosts, views = [], []
    for k, perm in enumerate(perms):
        inverse = tuple(np.argsort(perm))
        buf = _rand(tuple(shape[i] for i in inverse), k)
        hosts.append(buf.transpose(perm))
        views.append(from_numpy(buf).permute(*perm))
    out = empty(shape[:-1] + (2 * inner,), "float64")[..., ::2]
    assert _index_path("addcmul", views, out) == (False, index_width == "index32", False)
    _run("addcmul", views, out, {"value": 0.5})
    np.testing.assert_array_equal(out.numpy(), hosts[0] + 0.5 * (hosts[1] * hosts[2]))


def from_bits(bits, dtype):
    """A tensor of `dtype` holding `bits` (unsigned integers of its width) as they are."""
    view = {"float16": np.float16, "float32": np.float32}.get(dtype)
    return _from_bits(bits.view(view) if view else bits, dtype, DEVICE)


def test_a_dense_count_past_a_multiple_of_16_is_two_launches():
    """37 dense elements: the whole 16s (32) in one launch, whose masks are uniform over each vector, and the last 5
    after them in another, each element written once and right (an in-place add: out is an operand); a count that is a
    multiple of 16, an op reading the element's index (arange) and one recording refused lanes (a float to integer
    cast) stay one launch."""
    host = _rand((37,))
    x, y = from_numpy(host), from_numpy(_rand((37,), 1))
    plan = pw.Plan("add", ("float64",) * 3, "float64", (None, None, None), (pw.param_arg(1, "float64"), 0, 0), True)
    launches = pw.map_launches(pw.DEFAULT, plan, [x, y], x)
    count_at = 1 + 3 + 1 + 3 + 3  # out, x y z, the fault word, the scalars' values, p0 p1 p2, then the count
    assert [launch.args[count_at] for launch in launches] == [32, 5]
    tail = launches[1].args
    assert tail[0].storage_offset() == 32 and tail[0].shape == (5,) and tail[2].storage_offset() == 32
    _run("add", [x, y], x, {"alpha": 1})  # in place
    np.testing.assert_array_equal(x.numpy(), host + _rand((37,), 1))
    even = from_numpy(_rand((48,)))
    assert len(pw.map_launches(pw.DEFAULT, plan, [even, even], empty((48,), "float64"))) == 1
    out = empty((37,), "float32")
    arange = pw.Plan("arange", ("float32",) * 3, "float64", (None, None, None), (0, 0, 0), True)
    assert len(pw.map_launches(pw.DEFAULT, arange, [], out)) == 1
    cast = pw.Plan("cast", ("float64",) * 3, "float64", (None, None, None), (0, 0, 0), True)
    assert len(pw.map_launches(pw.DEFAULT, cast, [x], empty((37,), "int32"))) == 1


# NaNs with payloads, signs and the signalling bit clear, then ordinary values (each dtype's bits)
NAN_BITS = {
    "float16": [0x7C01, 0xFC01, 0x7D55, 0xFE00, 0x7E01, 0x3C00, 0x8000, 0x0001],
    "bfloat16": [0x7F81, 0xFF81, 0x7FD5, 0xFFC0, 0x7FC1, 0x3F80, 0x8000, 0x0001],
    "float32": [0x7F800001, 0xFF800001, 0x7FD55555, 0xFFC00000, 0x7FC00001, 0x3F800000, 0x80000000, 0x00000001],
}


@pytest.mark.parametrize("dtype", sorted(NAN_BITS))
@pytest.mark.parametrize("layout", ["dense", "strided", "transposed", "tiled"])
def test_a_copy_within_one_dtype_keeps_every_bit(dtype, layout):
    """clone, contiguous and copy_ keep a NaN's payload and sign as torch's copy does (no conversion through the
    compute type, which makes every NaN the dtype's one quiet NaN), in every layout and the tiled kernel."""
    storage = np.uint16 if dtype != "float32" else np.uint32
    bits = np.array(NAN_BITS[dtype] * 6, dtype=storage).reshape(8, 6)
    if layout == "dense":
        x, want = from_bits(bits, dtype), bits
    elif layout == "strided":
        wide = np.repeat(bits, 2, axis=1)
        x, want = from_bits(wide, dtype)[:, ::2], wide[:, ::2]
    else:
        x, want = from_bits(bits, dtype).T, bits.T
    out = empty(tuple(x.shape), dtype)
    config = pw.DEFAULT_TILE if layout == "tiled" else pw.DEFAULT
    _run("copy", [x], out, config=config)
    assert np.ascontiguousarray(out.numpy()).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("dtype", sorted(NAN_BITS))
@pytest.mark.parametrize("layout", ["dense", "broadcast"])
def test_where_keeps_the_bits_it_selects(dtype, layout):
    """where(cond, y, z) with y and z in the output's dtype stores one of their bits, NaN payloads included, as
    torch's where does; with a Python scalar for z it computes (and stores the dtype's one quiet NaN)."""
    storage = np.uint16 if dtype != "float32" else np.uint32
    ybits = np.array(NAN_BITS[dtype] * 6, dtype=storage).reshape(8, 6)
    zbits = ybits[::-1].copy()
    cond_host = np.random.default_rng(3).random((8, 6)) < 0.5
    cond = from_numpy(cond_host if layout == "dense" else cond_host[0], "bool")
    y, z = from_bits(ybits, dtype), from_bits(zbits, dtype)
    out = empty((8, 6), dtype)
    plan = pw.Plan("where", ("bool", dtype, dtype), "float32", (None, None, None), (0, 0, 0), True)
    assert pw.raw_mode(plan, [cond, y, z], out) == pw.RAW_SELECT.value
    assert pw.raw_mode(plan, [cond, y, 1.5], out) == 0
    _run("where", [cond, y, z], out)
    want = np.where(np.broadcast_to(cond_host if layout == "dense" else cond_host[0], (8, 6)), ybits, zbits)
    assert np.ascontiguousarray(out.numpy()).tobytes() == np.ascontiguousarray(want).tobytes()


def test_a_copy_across_dtypes_converts():
    """A copy into another dtype is a conversion (not `raw_mode`'s): float16's NaNs become float32's quiet NaN and
    ordinary values keep their value."""
    x = from_bits(np.array(NAN_BITS["float16"], dtype=np.uint16), "float16")
    out = empty((8,), "float32")
    plan = pw.Plan("copy", ("float16",) * 3, "float32", (None, None, None), (0, 0, 0), False)
    assert pw.raw_mode(plan, [x], x) == pw.RAW_COPY.value and pw.raw_mode(plan, [x], out) == 0
    _run("copy", [x], out)
    got = out.numpy()
    assert np.isnan(got[:5]).all() and got[5:].tolist() == [1.0, -0.0, 2.0**-24]


# sizes where a divider is exact at its limits: 1, powers of two and their neighbours, 2^31
DIVISORS = [1, 2, 3, 5, 7, 15, 16, 17, 50, 63, 64, 65, 641, 4095, 4096, 4097, 6700417, (1 << 30) - 1, 1 << 30]
DIVISORS += [(1 << 30) + 1, (1 << 31) - 1, 1 << 31]


@pytest.mark.parametrize("d", DIVISORS)
def test_divider_divides_every_32_bit_index_exactly(d):
    """(umulhi(n, magic) + n) >> shift == n // d for n at 0, around every multiple of d it reaches (sampled) and at
    2^31 - 1, computed as the kernel does in 32-bit words."""
    q = indexing.divider(d)
    magic, shift = q & 0xFFFFFFFF, q >> 32
    assert magic < 1 << 32 and shift <= 31
    top = (1 << 31) - 1
    multiples = np.unique(np.linspace(0, top // d, 2000).astype(np.int64)) * d
    n = np.unique(np.concatenate([multiples - 1, multiples, multiples + 1, [0, 1, top - 1, top]]))
    n = n[(n >= 0) & (n <= top)].astype(np.uint64)
    hi = (n * np.uint64(magic)) >> np.uint64(32)  # below 2^63: no wrap in uint64
    quot = (hi + n) >> np.uint64(shift)
    np.testing.assert_array_equal(quot, n // np.uint64(d))


def test_divider_refuses_a_size_outside_its_range():
    for bad in (0, -3, (1 << 31) + 1):
        with pytest.raises(ValueError, match="divider"):
            indexing.divider(bad)


def test_index32_bound_counts_padded_lanes_and_every_tensor():
    """A launch indexes in int32 only while its padded index and each tensor's farthest offset stay below 2^31."""
    below = indexing.INDEX32_BELOW
    assert indexing.fits_index32([2, 1000], [[1000, 1], [0, 1]], 1024)
    assert not indexing.fits_index32([below // 1024, 1024], [[1024, 1]], 1024)  # n + BLOCK reaches 2^31
    # 1000 rows of 1000: the padded lanes of the last program reach row 1001 (BLOCK 1024)
    stride = below // 1001
    assert not indexing.fits_index32([1000, 1000], [[1000, 1], [stride, 1]], 1024)
    assert indexing.fits_index32([1000, 1000], [[1000, 1], [below // 1003, 1]], 1024)
    assert not indexing.fits_index32([4, 8], [[8, 1], [1, below // 7]], 256)  # an inner stride's reach


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


@pytest.mark.parametrize("tile", [1 << 16, 100])
def test_the_oracle_in_parts_gives_the_same_values(monkeypatch, tile):
    """A large output's oracle is evaluated in parts of its elements on threads (an op of two or more array operands
    tile by tile within each part): every op's reference and scale the same as one evaluation, on every example
    problem at 3072 elements (rows of 64: a broadcast operand is a row) at its first and last dtypes, the parts cut at
    1000 elements over 3 threads, in tiles of 100 elements too (a part's last one partial)."""
    from nbxcert.oracles import parts as ew

    monkeypatch.setattr(ew, "TILE", tile)

    def references(spec, inputs, cut: bool):
        monkeypatch.setattr(ew, "PARALLEL_AT", 1000 if cut else 1 << 62)
        return spec.oracle(inputs)["out"]

    monkeypatch.setattr(ew, "threads", lambda: 3)
    cut_somewhere = 0
    for name in _specs_with_oracle():
        spec = pw.SPECS[name]
        for dtypes in {spec.dtypes[0], spec.dtypes[-1]}:
            for problem in spec.example_problems:
                inputs = spec.make_inputs(dict(problem, numel=3072), dtypes, 5, DEVICE)
                whole, parts = references(spec, inputs, False), references(spec, inputs, True)
                cut_somewhere += ew.part_bounds(inputs.tensors["out"].numel) is not None
                np.testing.assert_array_equal(np.asarray(parts.value), np.asarray(whole.value), err_msg=name)
                np.testing.assert_array_equal(np.asarray(parts.scale), np.asarray(whole.scale), err_msg=name)
    assert cut_somewhere


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
