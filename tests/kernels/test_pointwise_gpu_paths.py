"""The pointwise family's GPU paths, checked without a GPU: the device math library chosen by the backend in force
(`DEVICE_MATH`, the compute types of `compute_dtype`, and, cross-compiled for sm_90, the libdevice functions the
kernels call), and the tiled kernel for a transposed operand (bit-exact against numpy under the interpreter, every
dtype class, odd sizes, several layouts; its prune)."""

from __future__ import annotations

import numpy as np
import pytest
from devicetools import empty, from_numpy

from nbxcert.errors import LaunchError
from nbxcert.kernels import pointwise as pw
from nbxcert.kernels.backends import select
from nbxcert.profiles import get_profile

TILES = (pw.tile_config(32, 32, 4), pw.tile_config(64, 32, 8), pw.tile_config(32, 64, 4))


def _run(op, x, out, config):
    row = pw.OPS[op]
    common = pw.common_of(row, [x.dtype.name, out.dtype.name])
    via, compute, kparams, p_float = pw.plan_for(row, [x], common, out, {})
    return pw.pointwise_call(op, x, None, None, out, via, compute, kparams, p_float, config)


def test_the_launch_sets_device_math_from_the_backend():
    plan = pw.Plan("exp", ("float32",) * 3, "float64", (None, None, None), (0, 0, 0), True)
    x = from_numpy(np.linspace(-2, 2, 24).astype(np.float32))
    launch = pw.map_launches(pw.DEFAULT, plan, [x], empty((24,), "float32"))[0]
    on_gpu = select().name != "interpreter"
    assert launch.kwargs["DEVICE_MATH"] == int(on_gpu) and pw.device_math() is on_gpu
    # libdevice's flush-to-zero is turned off on NVIDIA targets only; the interpreter takes no compile option
    assert ("enable_reflect_ftz" in launch.kwargs) is (select().name == "cuda")
    tiled = pw.map_launches(TILES[0], plan, [x.view(4, 6).T], empty((6, 4), "float32"))[0]
    assert tiled.kernel is pw._tile_kernel and tiled.kwargs["DEVICE_MATH"] == int(on_gpu)


def test_compute_types_follow_torch_on_the_gpu_and_stay_under_the_interpreter():
    exp, log, cast, add = (pw.OPS[n] for n in ("exp", "log", "cast", "add"))
    gpu = {d: pw.compute_dtype(d, log, device=True) for d in ("float16", "bfloat16", "float32", "float64")}
    assert gpu == {"float16": "float32", "bfloat16": "float32", "float32": "float32", "float64": "float64"}
    # rows that keep float32 in float64 on the GPU say why; half precision stays float32 except for cast
    assert exp.gpu_f64 and pw.compute_dtype("float32", exp, device=True) == "float64"
    assert pw.compute_dtype("bfloat16", exp, device=True) == "float32"
    assert pw.compute_dtype("float16", cast, device=True) == "float64"
    assert pw.compute_dtype("float32", add, device=True) == "float32"
    assert pw.compute_dtype("int8", add, device=True) == "int8"
    # the interpreter's compute types, unchanged: half precision in float64 where interp_wide, float32 in float64
    assert pw.compute_dtype("float16", exp, device=False) == "float64"
    assert pw.compute_dtype("float16", add, device=False) == "float32"
    assert pw.compute_dtype("float32", log, device=False) == "float64"
    assert all(isinstance(op.gpu_f64, str) for op in pw.OPS.values())


# (shape of the contiguous buffer, the permutation read): 2-d, batched, 4-d with two batch dimensions, odd sizes
VIEWS = [((17, 23), (1, 0)), ((3, 5, 7), (0, 2, 1)), ((4, 3, 5, 6), (3, 1, 0, 2)), ((2, 65, 33), (2, 1, 0))]
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")


def _values(shape, dtype, seed):
    gen = np.random.default_rng(seed)
    n = int(np.prod(shape))
    return pw.operand_values(gen, n, dtype).reshape(shape)


def _host(t):
    return t.float64() if t.dtype.name in pw.FLOATS else t.numpy()


def _copy_is_exact(dtype, views, tiles):
    for k, (shape, perm) in enumerate(views):
        values = _values(shape, dtype, k)
        x = from_numpy(pw._storage_values(values, dtype), dtype).permute(*perm)
        expected = values.transpose(perm)
        assert pw.layout_of(x, expected.shape) == "transposed"
        for config in tiles:
            out = empty(expected.shape, dtype)
            _run("copy", x, out, config)
            np.testing.assert_array_equal(_host(out), expected, err_msg=f"{shape} {perm} {config.label()}")


@pytest.mark.parametrize("dtype", ("bfloat16", "float64", "uint8", "bool"))
def test_tiled_copy_of_a_transposed_view_is_exact(dtype):
    """One dtype of each class (bfloat16 on its bits), a 2-d and a batched view, one tile (every one under slow)."""
    _copy_is_exact(dtype, VIEWS[:2], TILES[:1])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_tiled_copy_of_a_transposed_view_is_exact_every_view_and_tile(dtype):
    _copy_is_exact(dtype, VIEWS, TILES)


@pytest.mark.parametrize(("src", "dst"), [("float32", "bfloat16"), ("float16", "float64"), ("int64", "float16")])
def test_tiled_cast_gives_the_flat_kernels_bits(src, dst):
    shape, perm = VIEWS[1]
    values = _values(shape, src, 5)
    x = from_numpy(pw._storage_values(values, src), src).permute(*perm)
    results = []
    for config in (pw.DEFAULT, *TILES):
        out = empty(values.transpose(perm).shape, dst)
        _run("cast", x, out, config)
        results.append(out.numpy().tobytes())
    assert len(set(results)) == 1


def test_tiled_cast_refuses_an_out_of_range_value_as_the_flat_kernel_does():
    host = np.array([[1.0, 2.0, 3.0], [4.0, 3e9, 6.0]])
    x = from_numpy(host).T
    with pytest.raises(LaunchError, match="32-bit integer"):
        _run("cast", x, empty((3, 2), "int32"), TILES[0])
        empty((1,), "int32").numpy()


def test_tiled_unary_op_gives_the_flat_kernels_bits():
    x = from_numpy(np.random.default_rng(3).standard_normal((33, 70)).astype(np.float32)).T
    results = []
    for config in (pw.DEFAULT, *TILES):
        out = empty((70, 33), "float32")
        _run("silu", x, out, config)
        results.append(out.numpy().tobytes())
    assert len(set(results)) == 1


def test_a_tiled_config_is_refused_where_it_does_not_apply():
    x = from_numpy(np.ones((4, 6)))
    with pytest.raises(LaunchError, match="contiguous output"):
        _run("neg", x.T, empty((6, 8), "float64")[:, ::2], TILES[0])  # strided: no order of it is one run


def test_the_prune_keeps_tiles_only_for_a_transposed_operand():
    profile = get_profile("hopper")
    transposed = {"numel": 4096, "x": "transposed", "y": "none", "z": "none", "out": "dense"}
    result = pw.prune_flat(pw.flat_candidates(), transposed, profile)
    assert set(TILES) <= set(result.kept)
    # a tile dropped here is dropped for its registers (64 x 64 over 4 warps: 32 elements x 8 > 255 per thread)
    assert all("registers" in why for c, why in result.pruned if pw.is_tiled(c))
    assert {c for c, _ in result.pruned if pw.is_tiled(c)} == {pw.tile_config(64, 64, 4)}
    for layouts in (("strided", "none", "none", "dense"), ("transposed", "dense", "none", "dense")):
        problem = {"numel": 4096, **dict(zip(("x", "y", "z", "out"), layouts, strict=True))}
        assert not any(pw.is_tiled(c) for c in pw.prune_flat(pw.flat_candidates(), problem, profile).kept)
    strided_out = dict(transposed, out="strided")
    assert not any(pw.is_tiled(c) for c in pw.prune_flat(pw.flat_candidates(), strided_out, profile).kept)


def _library_calls(items):
    """(In the cross-compiling subprocess.) Each (op, dtypes): the libdevice functions its compiled TTIR calls and
    whether libdevice was linked without flush-to-zero."""
    import re

    from nbxcert.kernels.backends import cross

    for name, dtypes, layout in items:
        spec = pw.SPECS[name]
        problem = spec.example_problems[2 if layout == "transposed" else 0]
        inputs = spec.make_inputs(problem, tuple(dtypes), 0, "cpu")
        with cross.recording() as launched:
            spec.launch(pw.DEFAULT if layout != "transposed" else TILES[0], inputs)
        compiled = launched[0].compiled
        yield {
            "op": name,
            "dtypes": dtypes,
            "kernel": launched[0].name,
            "calls": sorted(set(re.findall(r"__nv_\w+", compiled.asm["ttir"]))),
            "ftz": bool(compiled.metadata.enable_reflect_ftz),
        }


@pytest.mark.slow
def test_gpu_kernels_call_the_accurate_device_library():
    """Cross-compiled for sm_90: float32 bodies call CUDA's accurate float32 functions, the rows kept in float64 the
    float64 ones; 16-bit results the half-precision helpers (ex2.approx through Triton's float32 exp, rcp.approx
    written in: no accurate function; more in test_pointwise_half.py); libdevice without flush-to-zero; the tiled
    kernel too."""
    import crosstools

    items = [
        ("log", ("float32", "float32"), "dense"),
        ("exp", ("float16", "float16"), "dense"),
        ("exp", ("float32", "float32"), "dense"),
        ("tanh", ("bfloat16", "bfloat16"), "dense"),
        ("log1p", ("float32", "float32"), "transposed"),
    ]
    results = {(r["op"], tuple(r["dtypes"])): r for r in crosstools.cross_compile(90, _library_calls, items, 600)}
    assert results[("log", ("float32", "float32"))]["calls"] == ["__nv_logf"]
    assert results[("exp", ("float16", "float16"))]["calls"] == []
    assert results[("exp", ("float32", "float32"))]["calls"] == ["__nv_exp"]
    assert results[("tanh", ("bfloat16", "bfloat16"))]["calls"] == []
    tiled = results[("log1p", ("float32", "float32"))]
    assert tiled["calls"] == ["__nv_log1pf"] and "tile" in tiled["kernel"]
    assert not any(r["ftz"] for r in results.values())


def test_an_uncertified_transposed_read_runs_a_tile_untuned(monkeypatch, tmp_path):
    """The untuned config of a problem whose one operand is read transposed into a contiguous output is a tile (a
    kept candidate there), elsewhere the flat default; served with no certificate (NBXCERT_UNCERTIFIED=default), a
    transposed copy runs the tiled kernel."""
    from nbxcert import serving

    transposed = {"numel": 391, "x": "transposed", "y": "none", "z": "none", "out": "dense"}
    spec = pw.SPECS["copy"]
    assert spec.untuned(transposed) == pw.DEFAULT_TILE
    assert spec.untuned(dict(transposed, x="strided")) == spec.untuned(spec.example_problems[0]) == pw.DEFAULT
    assert pw.DEFAULT_TILE in spec.pruned_for(transposed, get_profile("nvidia/hopper")).kept
    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("NBXCERT_CERTIFIED_ONLY", raising=False)
    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "default")
    serving.reset()
    try:
        values = _values((17, 23), "float32", 3)
        x = from_numpy(values.T.copy(), "float32").T
        problem = pw.problem_of("copy", [x], empty((17, 23), "float32"))
        assert problem["x"] == "transposed"
        assert serving.config_for(spec, problem, ("float32", "float32")) == pw.DEFAULT_TILE
    finally:
        serving.reset()


def test_an_untuned_config_outside_the_candidates_is_refused_by_name():
    import dataclasses

    spec = dataclasses.replace(pw.SPECS["copy"], default_for=lambda problem: pw.flat_config(128, 1))
    with pytest.raises(ValueError, match="kernel pw_copy: its untuned config .* is not among its candidates"):
        spec.untuned(spec.example_problems[0])
