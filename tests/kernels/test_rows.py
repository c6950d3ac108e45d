"""Row kernels (softmax, layernorm, rmsnorm, add_layernorm, add_rmsnorm, row_reduce) against their float64 oracles.

Under the interpreter (CI): every candidate the prune keeps runs once on an awkward shape (rows not a multiple of any
rows-per-program, columns not a multiple of any tile and more than the largest loop tile); the representative configs
(the default and the first of each variant) run every example problem in every dtype; extreme values (large
magnitudes, rows of equal values, -inf in masks, fully masked rows); the no-bit claims; the prunes against the
device files; and (slow) every candidate the hopper prune keeps at the issue's shapes compiles for sm_90 without a
register spill and within the shared memory the prune counts. GPU tests run every hopper-kept candidate at the real
shapes and check the no-bit claims there.
"""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict
from pathlib import Path

import crosstools
import numpy as np
import pytest
from sampletools import SUBSETS, chosen, field

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import rows
from nbxcert.kernels.check import all_ok, first_report, no_bit_group, run_checked
from nbxcert.kernels.compare import compare, poison
from nbxcert.kernels.dtypes import finfo, get_dtype
from nbxcert.kernels.tensor import from_numpy
from nbxcert.profiles import get_profile
from nbxcert.warm import check_configs

SPECS = {s.name: s for s in (rows.SOFTMAX, rows.LAYERNORM, rows.RMSNORM, rows.ADD_LAYERNORM, rows.ADD_RMSNORM)}
SPECS["row_reduce"] = rows.ROW_REDUCE
REDUCE_FLAGS = (("sum", 0), ("mean", 0), ("amax", 0), ("var", 0), ("var", 1))
AWKWARD = (5, 4500)  # 5 rows: not a multiple of ROWS=4; 4500 columns: > the 4096 loop tile, a multiple of no tile


def flags(spec, i: int) -> dict:
    """The i-th flag combination of a spec (rotating masks / ops so every one is met)."""
    if spec is rows.SOFTMAX:
        return {"mask": list(rows.MASKS)[i % len(rows.MASKS)]}
    if spec is rows.ROW_REDUCE:
        op, corr = REDUCE_FLAGS[i % len(REDUCE_FLAGS)]
        return {"op": op, "correction": corr}
    return {}


def problem(spec, n_rows: int, n_cols: int, i: int = 0) -> dict:
    return {"n_rows": n_rows, "n_cols": n_cols, **flags(spec, i)}


def check(spec, config, prob, dtypes, profile, device, seed=0, inputs=None):
    verdicts = run_checked(spec, config, prob, dtypes, profile, seed, device, inputs=inputs)
    assert all_ok(verdicts), first_report(verdicts)


def make_inputs(spec, prob, dtypes, seed, device, values="normal", **kw):
    return spec.make_inputs(prob, dtypes, seed, device, values=values, **kw)


def representatives(spec) -> list:
    """The default and the first candidate of each variant (for the shape x dtype sweeps)."""
    picked = [spec.default]
    seen = {spec.default.get("VARIANT")}
    for c in spec.candidates:
        v = c.get("VARIANT") or c["BLOCK_N"]
        if v not in seen:
            seen.add(v)
            picked.append(c)
    return picked


# --- every kept candidate, once (a sample of every variant, tile and dtype in the regular run) ------------------------
@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_kept_candidate_matches_on_an_awkward_shape(name, subset, profile, backend):
    spec = SPECS[name]
    kept = spec.pruned_for(problem(spec, *AWKWARD), profile).kept
    assert kept
    kinds = [field(f) for f in sorted({k for c in kept for k, _ in c.kwargs})]
    turns = [len(spec.dtypes), len(rows.MASKS), len(REDUCE_FLAGS)]  # dtypes, softmax's masks, row_reduce's ops
    for i in chosen(kept, subset, f"rows every kept {name}", kinds=kinds, turns=turns):
        dtypes = spec.dtypes[i % len(spec.dtypes)]
        check(spec, kept[i], problem(spec, *AWKWARD, i), dtypes, profile, backend.device, seed=i)


# --- representative configs x shapes x dtypes ------------------------------------------------------------------------
SHAPES = ((7, 1000), (1, 1000), (1, 1), (13, 333), (3, 5000))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_representative_configs_on_every_shape_and_dtype(name, profile, backend):
    spec = SPECS[name]
    for config in representatives(spec):
        for s, shape in enumerate(SHAPES):
            for d, dtypes in enumerate(spec.dtypes):
                prob = problem(spec, *shape, s + d)
                if config in spec.pruned_for(prob, profile).kept:
                    check(spec, config, prob, dtypes, profile, backend.device, seed=s)


# --- extreme values --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("values", ["large", "equal"])
def test_large_magnitudes_and_rows_of_equal_values(name, values, profile, backend):
    spec = SPECS[name]
    for config in representatives(spec):
        for i, dtypes in enumerate(spec.dtypes[:3]):
            n_flag = len(rows.MASKS) if spec is rows.SOFTMAX else (len(REDUCE_FLAGS) if spec is rows.ROW_REDUCE else 1)
            for f in range(n_flag):
                prob = problem(spec, 6, 1500, f)
                inputs = make_inputs(spec, prob, dtypes, 10 + i, backend.device, values)
                if spec is rows.ROW_REDUCE and values == "large":
                    top = finfo(get_dtype(dtypes[0]))["max"]
                    if np.any(np.abs(spec.oracle(inputs)["out"].value) > top):
                        continue  # the sum / variance of values near the dtype's top is not a number of the dtype
                check(spec, config, prob, dtypes, profile, backend.device, inputs=inputs)


def test_equal_values_give_exact_results(backend):
    """A row of equal values: softmax is exactly 1/n where n is a power of two, the variance exactly 0."""
    x = from_numpy(np.full((3, 1024), 2.5), "float16", backend.device)
    for config in representatives(rows.SOFTMAX):
        y = rows.softmax(x, config=config).float64()
        assert np.all(y == 1.0 / 1024), config.label()
    for config in representatives(rows.ROW_REDUCE):
        v = rows.row_reduce(x, "var", correction=1, config=config).float64()
        assert np.all(v == 0.0), config.label()


def _softmax_variants():
    return [c for c in representatives(rows.SOFTMAX)]


def test_softmax_fully_masked_rows_are_zero(profile, backend):
    """Defined behaviour: a row whose every entry is masked (-inf) is all zeros. Causal with q_len > n_cols leaves the
    first q_len - n_cols rows of each group seeing nothing; an additive mask row of -inf does the same."""
    for config in _softmax_variants():
        for dtype in ("float16", "bfloat16", "float32"):
            prob = {"n_rows": 16, "n_cols": 5, "mask": "causal"}
            inputs = rows.softmax_inputs(prob, (dtype,), 1, backend.device, q_len=8)
            check(rows.SOFTMAX, config, prob, (dtype,), profile, backend.device, inputs=inputs)
            y = inputs.tensors["y"].float64()
            assert np.all(y[[0, 1, 2, 8, 9, 10]] == 0.0), config.label()
            assert np.allclose(y[[3, 4, 5, 6, 7]].sum(axis=1), 1.0, rtol=1e-2)

            prob = {"n_rows": 6, "n_cols": 1100, "mask": "additive"}
            inputs = rows.softmax_inputs(prob, (dtype,), 2, backend.device, q_len=3)
            mask = inputs.tensors["mask"].float64()
            mask[1] = -np.inf
            inputs.tensors["mask"] = from_numpy(mask, dtype, backend.device)
            check(rows.SOFTMAX, config, prob, (dtype,), profile, backend.device, inputs=inputs)
            y = inputs.tensors["y"].float64()
            assert np.all(y[[1, 4]] == 0.0) and not np.any(np.isnan(y)), config.label()
            assert np.all(y[mask[np.arange(6) % 3] == -np.inf] == 0.0)


def test_softmax_single_visible_entry_is_exactly_one(backend):
    x = from_numpy(np.random.default_rng(0).standard_normal((4, 4)), "float16", backend.device)
    for config in _softmax_variants():
        y = rows.softmax(x, mask="causal", config=config).float64()
        assert y[0, 0] == 1.0 and np.all(y[0, 1:] == 0.0) and np.all(np.triu(y, 1) == 0.0), config.label()


# --- the no-bit claims -----------------------------------------------------------------------------------------------
def _bits(t) -> bytes:
    return np.ascontiguousarray(t.numpy()).tobytes()


def assert_no_bit_claims(spec, prob, dtypes, configs, device, seed=3):
    """Configs differing only in the spec's no_bit_fields give identical output bits on the same inputs."""
    groups = defaultdict(list)
    for c in configs:
        groups[no_bit_group(spec, c)].append(c)
    inputs = spec.make_inputs(prob, dtypes, seed, device)
    compared = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        outputs = []
        for c in members:
            for name in inputs.outputs:
                poison(inputs.tensors[name], inputs.tensors[name].dtype)
            spec.launch(c, inputs)
            outputs.append({name: _bits(inputs.tensors[name]) for name in inputs.outputs})
        for c, out in zip(members[1:], outputs[1:], strict=False):
            assert out == outputs[0], f"{spec.name}: {c.label()} and {members[0].label()} differ in bits"
        compared += len(members) - 1
    return compared


@pytest.mark.parametrize("name", sorted(SPECS))
def test_no_bit_fields_change_no_bit(name, profile, backend):
    spec = SPECS[name]
    prob = problem(spec, *AWKWARD, 1)
    kept = spec.pruned_for(prob, profile).kept
    assert spec.no_bit_fields == ("ROWS",)
    assert assert_no_bit_claims(spec, prob, spec.dtypes[0], kept, backend.device) > 0


# --- user-facing functions -------------------------------------------------------------------------------------------
def _close(got, ref, err, dtype, tol):
    v = compare(got, ref, err, dtype, tol, "user-facing")
    assert v.ok, v.report


def test_user_facing_functions_on_3d_tensors(profile, backend):
    from nbxcert.oracles import rows as oracle

    gen = np.random.default_rng(5)
    dev = backend.device
    x = from_numpy(gen.standard_normal((2, 3, 40)), "float16", dev)
    res = from_numpy(gen.standard_normal((2, 3, 40)), "float16", dev)
    w = from_numpy(1 + 0.3 * gen.standard_normal(40), "float32", dev)
    b = from_numpy(0.3 * gen.standard_normal(40), "float32", dev)
    tol = profile.tolerance("float16")
    xs, rs, ws, bs = x.float64(), res.float64(), w.float64(), b.float64()
    eps = float(np.float32(1e-5))

    y = rows.layernorm(x, w, b, eps=1e-5)
    assert y.shape == x.shape
    _close(y.float64(), *oracle.layernorm(xs, ws, bs, eps), y.dtype, tol)
    s, y = rows.add_rmsnorm(x, res, w, eps=1e-5)
    _close(s.float64(), *oracle.residual_sum(xs, rs), s.dtype, tol)
    _close(y.float64(), *oracle.rmsnorm(xs + rs, ws, eps), y.dtype, tol)

    y = rows.softmax(x, scale=0.5, mask="causal")
    ref, err = oracle.softmax(xs.reshape(6, 40), 0.5, "causal", None, 3)
    _close(y.float64().reshape(6, 40), ref, err, y.dtype, tol)
    add = from_numpy(np.where(gen.random((3, 40)) < 0.2, -np.inf, gen.standard_normal((3, 40))), "float16", dev)
    y = rows.softmax(x, mask=add)
    ref, err = oracle.softmax(xs.reshape(6, 40), 1.0, "additive", add.float64(), 3)
    _close(y.float64().reshape(6, 40), ref, err, y.dtype, tol)

    v = rows.row_reduce(x, "var", correction=1)
    assert v.shape == (2, 3)
    _close(v.float64().reshape(6), *oracle.row_reduce(xs.reshape(6, 40), "var", 1), v.dtype, tol)
    assert rows.softmax_problem(x, mask="causal") == {"n_rows": 6, "n_cols": 40, "mask": "causal"}
    assert rows.row_reduce_problem(x, "sum", 1) == {"n_rows": 6, "n_cols": 40, "op": "sum", "correction": 0}


def test_strided_rows_run_without_a_copy_and_bad_views_are_refused(profile, backend):
    from nbxcert.oracles import rows as oracle

    base = from_numpy(np.random.default_rng(1).standard_normal((5, 64)), "float16", backend.device)
    x = base[:, 8:40]  # rows 64 apart, 32 columns
    y = rows.rmsnorm(x, from_numpy(np.ones(32), "float16", backend.device), eps=1e-6)
    _close(y.float64(), *oracle.rmsnorm(x.float64(), np.ones(32), float(np.float32(1e-6))), y.dtype, 2**-10)
    with pytest.raises(LaunchError, match="contiguous columns|not a view of rows"):
        rows.softmax(base.T)
    # 2-d rows are used as they are (no view made per launch); 3-d ones are viewed as rows
    assert rows.as_rows(x, "x") is x
    v = rows.as_rows(base.view(5, 2, 32), "x")
    assert v.shape == (10, 32) and v.strides == (32, 1)
    with pytest.raises(ShapeMismatch, match="weight"):
        rows.rmsnorm(base, from_numpy(np.ones(3), "float16", backend.device))
    with pytest.raises(LaunchError, match="op must be"):
        rows.row_reduce(base, "median")


# --- prunes against the device files ----------------------------------------------------------------------------------
HOPPER = "nvidia/hopper"
ISSUE_SHAPES = (
    ("softmax", (32768, 5632)),
    ("softmax", (4096, 4096)),
    ("softmax", (1, 256000)),
    ("rmsnorm", (32768, 5632)),
    ("layernorm", (32768, 5632)),
    ("add_rmsnorm", (32768, 5632)),
    ("add_layernorm", (32768, 5632)),
    ("layernorm", (4096, 65536)),
    ("add_rmsnorm", (4096, 65536)),
    ("row_reduce", (4096, 65536)),
)


@pytest.mark.parametrize("name", ["LAYERNORM", "RMSNORM", "ADD_LAYERNORM", "ADD_RMSNORM"])
def test_the_norm_oracles_rows_in_parts_give_the_same_values(name, monkeypatch, backend):
    """A large input's normalised rows are evaluated in parts of rows on threads: every output's reference and scale
    the same as one evaluation (37 rows cut over 3 threads)."""
    from nbxcert.oracles import parts as ew

    spec = getattr(rows, name)
    inputs = spec.make_inputs({"n_rows": 37, "n_cols": 96}, spec.dtypes[0], 3, backend.device)
    monkeypatch.setattr(ew, "threads", lambda: 3)
    monkeypatch.setattr(ew, "PARALLEL_AT", 1 << 62)
    whole = spec.oracle(inputs)
    monkeypatch.setattr(ew, "PARALLEL_AT", 1000)
    assert ew.row_parts(37, 96) == [(0, 12), (12, 24), (24, 37)]
    parts = spec.oracle(inputs)
    assert set(parts) == set(whole) == set(inputs.outputs)
    for out in whole:
        np.testing.assert_array_equal(parts[out].value, whole[out].value)
        np.testing.assert_array_equal(parts[out].scale, whole[out].scale)


def test_interpreter_prune_keeps_every_candidate():
    interp = get_profile("cpu/interpreter")
    for spec in SPECS.values():
        assert spec.pruned_for(problem(spec, 4, 256000), interp).kept == spec.candidates


@pytest.mark.parametrize("name,shape", ISSUE_SHAPES)
def test_hopper_prune_keeps_the_default_and_names_a_fact_for_each_refusal(name, shape):
    spec, hopper = SPECS[name], get_profile(HOPPER)
    result = spec.pruned_for(problem(spec, *shape), hopper)
    assert spec.default in result.kept
    facts = ("max_registers_per_thread", "max_registers_per_block", "warp_size", "TRITON_MAX_TENSOR_NUMEL")
    for config, reason in result.pruned:
        assert any(f in reason for f in facts), (config.label(), reason)


def test_hopper_prune_refuses_the_one_tile_variant_exactly_where_the_row_does_not_fit():
    hopper = get_profile(HOPPER)
    kept = rows.SOFTMAX.pruned_for({"n_rows": 1, "n_cols": 256000, "mask": "none"}, hopper).kept
    assert {c["VARIANT"] for c in kept} == {"loop", "split"}
    kept = rows.SOFTMAX.pruned_for({"n_rows": 4096, "n_cols": 4096, "mask": "none"}, hopper).kept
    assert {c["VARIANT"] for c in kept} == {"tile", "loop", "split"}
    assert min(c.num_warps for c in kept if c["VARIANT"] == "tile") == 2  # 4096 x 2 regs + 12 > 255 at 1 warp
    kept = rows.LAYERNORM.pruned_for({"n_rows": 4096, "n_cols": 65536}, hopper).kept
    assert {c["VARIANT"] for c in kept} == {"loop"}
    kept = rows.RMSNORM.pruned_for({"n_rows": 4096, "n_cols": 16384}, hopper).kept
    assert {c["VARIANT"] for c in kept} == {"tile", "loop"}
    # no tile is smaller than its block's lanes: a 128-column row is refused 8 warps
    kept = rows.RMSNORM.pruned_for({"n_rows": 4096, "n_cols": 128}, hopper).kept
    assert max(c.num_warps for c in kept if c["VARIANT"] == "tile") == 4


def test_the_tile_limit_is_tritons_own():
    """Past TRITON_MAX_TENSOR_NUMEL the tile variant is refused even on a backend without register limits."""
    interp = get_profile("cpu/interpreter")
    result = rows.SOFTMAX.pruned_for({"n_rows": 1, "n_cols": rows.MAX_TILE + 1, "mask": "none"}, interp)
    assert all(c["VARIANT"] != "tile" for c in result.kept)
    assert any("TRITON_MAX_TENSOR_NUMEL" in r for _, r in result.pruned)


# --- cross-compilation for sm_90 (slow) ------------------------------------------------------------------------------
def _hopper_resources(shapes):
    """(In a subprocess in the cross-compiling backend, `crosstools`.) Every launch of every candidate the hopper prune
    keeps at `shapes`, compiled for sm_90 through Triton's own binder: one line per launch that spills or uses more
    shared memory than `reduction_shared_bytes` or the device has, or "ok"."""
    import re
    import tempfile

    import triton

    from nbxcert.kernels.backends import cross
    from nbxcert.kernels.launch import run_all
    from nbxcert.kernels.tensor import empty

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

    def resources(launch):
        with cross.recording() as launched:
            run_all([launch])
        (made,) = launched
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(made.compiled.asm["cubin"])
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        os.unlink(f.name)
        reg, stack, local = (int(v) for v in re.search(r"REG:(\d+) STACK:(\d+) .*LOCAL:(\d+)", out).groups())
        return made.metadata.shared, reg, stack + local

    def launches(name, config, r, c):
        x, y = empty((r, c), "float16"), empty((r, c), "float16")
        if name == "softmax":
            ws = rows.split_workspace(r, c, "float16", "cpu")
            return rows.softmax_launches(config, x, y, 0.125, "causal", 16, None, ws)
        w = empty((c,), "float16")
        res = empty((r, c), "float16") if name.startswith("add_") else None
        rms = name.endswith("rmsnorm")
        return rows.norm_launches(config, x, res, w, None if rms else w, y, res, 1e-5, rms)

    hopper = get_profile("nvidia/hopper")
    cap = hopper.fact("max_shared_memory_per_block_optin")
    problems = []
    for name, (r, c) in shapes:
        spec = SPECS[name]
        for config in spec.pruned_for({"n_rows": r, "n_cols": c, "mask": "causal"}, hopper).kept:
            for launch in launches(name, config, r, c):
                shared, reg, spill = resources(launch)
                bound = rows.reduction_shared_bytes(config)
                if spill or shared > bound or shared > cap:
                    problems.append(
                        f"{name} {r}x{c} {config.label()} {launch.kernel.__name__}: "
                        f"regs {reg}, spilled bytes {spill}, shared {shared} (bound {bound})"
                    )
    yield "\n".join(problems) or "ok"


@pytest.mark.slow
def test_kept_candidates_compile_for_hopper_without_spills():
    """Every candidate the hopper prune keeps at the issue's shapes (and wider norm rows) compiles for sm_90 with no
    register spill (ptxas's STACK and LOCAL are 0) and within `reduction_shared_bytes` of shared memory: the prune's
    register and shared-memory counts hold for the float16 path."""
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton has no cuobjdump to read register use from")
    shapes = [(n, s) for n, s in ISSUE_SHAPES if n != "row_reduce"]
    shapes += [("rmsnorm", (64, 16384)), ("add_layernorm", (64, 16384)), ("softmax", (64, 32768))]
    out = crosstools.cross_compile(90, _hopper_resources, shapes, timeout=900)
    assert out[-1] == "ok", out


# --- GPU: every hopper-kept candidate at the real shapes --------------------------------------------------------------
GPU_SHAPES = (
    ("rmsnorm", (32768, 5632), {}),
    ("layernorm", (32768, 5632), {}),
    ("add_rmsnorm", (32768, 5632), {}),
    ("add_layernorm", (32768, 5632), {}),
    ("softmax", (32768, 5632), {"mask": "none"}),
    ("softmax", (4096, 4096), {"mask": "none"}),
    ("softmax", (4096, 4096), {"mask": "causal"}),
    ("softmax", (1, 256000), {"mask": "none"}),
    ("layernorm", (64, 65536), {}),
    ("row_reduce", (4096, 5632), {"op": "var", "correction": 1}),
)


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape,extra", GPU_SHAPES)
def test_gpu_every_kept_candidate_at_real_shapes(name, shape, extra, profile, backend):
    """float16 at the real shapes: each candidate the device's prune keeps matches the oracle (computed once per
    shape), and candidates that differ only in no-bit fields agree to the bit."""
    spec = SPECS[name]
    prob = {"n_rows": shape[0], "n_cols": shape[1], **extra}
    failures = check_configs(spec, prob, spec.dtypes[0], profile, 7, backend.device)
    assert not failures, "\n\n".join(failures[:3])
