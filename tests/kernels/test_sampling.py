"""Sampling kernels (argmax, topk, log_softmax, cross_entropy) against their float64 oracles.

Under the interpreter (CI): every candidate the interpreter prune keeps runs once on an awkward shape (rows not a
multiple of ROWS, columns past one split chunk and a multiple of no tile), rotating dtypes (and k for topk); the
default and a split config run every example problem in every dtype; tie-breaking by the lowest index (rows full of
equal values, hand-made rows with ties and NaNs, generated rows with deliberate ties); +-inf and NaN; cross_entropy's
ignore_index and out-of-range targets; the no-bit claims (for argmax and topk: every field); the prunes against the
device files; the user-facing functions. GPU tests run every hopper-kept candidate at vocabulary sizes.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from sampletools import SUBSETS, chosen, field

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import sampling
from nbxcert.kernels.check import all_ok, first_report, no_bit_group, run_checked
from nbxcert.kernels.compare import compare, poison
from nbxcert.kernels.tensor import from_numpy
from nbxcert.profiles import get_profile
from nbxcert.warm import check_configs

SPECS = {s.name: s for s in sampling.SPECS}
AWKWARD = (5, 4500)  # 5 rows: not a multiple of ROWS=4; 4500 columns: two 4096-column chunks, a multiple of no tile
AWKWARD_K = (64, 5, 1, 33)


def problem(spec, n_rows: int, n_cols: int, i: int = 0) -> dict:
    extra = {"k": min(AWKWARD_K[i % len(AWKWARD_K)], n_cols)} if spec is sampling.TOPK else {}
    return {"n_rows": n_rows, "n_cols": n_cols, **extra}


def check(spec, config, prob, dtypes, profile, device, seed=0, inputs=None):
    verdicts = run_checked(spec, config, prob, dtypes, profile, seed, device, inputs=inputs)
    assert all_ok(verdicts), first_report(verdicts)


def representatives(spec) -> list:
    """The default and the first candidate of each other variant."""
    picked = [spec.default]
    for c in spec.candidates:
        if c["VARIANT"] not in {p["VARIANT"] for p in picked}:
            picked.append(c)
    return picked


# --- every kept candidate, once (a sample of every variant, tile, dtype and k in the regular run) ---------------------
@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_kept_candidate_matches_on_an_awkward_shape(name, subset, profile, backend):
    spec = SPECS[name]
    kept = spec.pruned_for(problem(spec, *AWKWARD), profile).kept
    assert kept
    kinds = [field(f) for f in ("VARIANT", "ROWS", "BLOCK_N", "CHUNK")]
    turns = [len(spec.dtypes)] + ([len(AWKWARD_K)] if spec is sampling.TOPK else [])
    for i in chosen(kept, subset, f"sampling every kept {name}", kinds=kinds, turns=turns):
        dtypes = spec.dtypes[i % len(spec.dtypes)]
        check(spec, kept[i], problem(spec, *AWKWARD, i), dtypes, profile, backend.device, seed=i)


# topk's full matrix (36 runs, the costliest under the interpreter) runs under -m slow; the regular run gives each
# (representative, problem) pair one dtype in turn, so every representative and every problem still meets every dtype
@pytest.mark.parametrize(
    "name, subset",
    [(n, "every") for n in sorted(SPECS) if n != "topk"]
    + [("topk", "sample"), pytest.param("topk", "every", marks=pytest.mark.slow)],
)
def test_representatives_on_every_example_problem_and_dtype(name, subset, profile, backend):
    spec = SPECS[name]
    for c, config in enumerate(representatives(spec)):
        for p, prob in enumerate(spec.example_problems + ({"n_rows": 1, "n_cols": 1, "k": 1},)):
            prob = {k: v for k, v in prob.items() if k in spec.problem_args}
            turn = (c + p) % len(spec.dtypes)
            for d, dtypes in enumerate(spec.dtypes):
                if subset == "every" or d == turn:
                    check(spec, config, prob, dtypes, profile, backend.device, seed=p)


# --- order: ties by the lowest index, NaN first -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", sampling.FLOAT_DTYPES)
def test_rows_full_of_equal_values_pick_the_lowest_indices(dtype, profile, backend):
    """Every element tied: argmax is 0 and topk's indices are 0..k-1, for every variant, checked against the oracle
    too (for a row past the first split chunk)."""
    dev = backend.device
    for config in representatives(sampling.ARGMAX):
        prob = {"n_rows": 3, "n_cols": 4500}
        inputs = sampling.argmax_inputs(prob, (dtype, "int64"), 1, dev, values="equal")
        check(sampling.ARGMAX, config, prob, (dtype, "int64"), profile, dev, inputs=inputs)
        assert np.all(inputs.tensors["out"].numpy() == 0), config.label()
    for config in representatives(sampling.TOPK):
        prob = {"n_rows": 2, "n_cols": 4500, "k": 20}
        inputs = sampling.topk_inputs(prob, (dtype,), 2, dev, values="equal")
        check(sampling.TOPK, config, prob, (dtype,), profile, dev, inputs=inputs)
        assert np.all(inputs.tensors["indices"].numpy() == np.arange(20)), config.label()
        x = inputs.tensors["x"].float64()
        assert np.all(inputs.tensors["values"].float64() == x[:, :1]), config.label()


def test_hand_made_ties_and_nans(backend):
    """Ties resolve to the lowest index and come out in index order; NaN ranks first, +inf next; -0.0 ties 0.0."""
    dev = backend.device
    rows = np.array(
        [
            [1.0, 3.0, 3.0, 2.0, 3.0, -1.0],
            [1.0, np.nan, 3.0, np.nan, np.inf, 3.0],
            [-0.0, 0.0, -2.0, -0.0, -np.inf, -1.0],
            [-np.inf] * 6,
            [-0.0, -0.0, -0.0, 0.0, -1.0, -2.0],  # +0.0 past the first k zeros: not chosen (radix: one order key)
        ]
    )
    want_argmax = [1, 1, 0, 0, 0]
    want_top3 = [[1, 2, 4], [1, 3, 4], [0, 1, 3], [0, 1, 2], [0, 1, 2]]
    for dtype in sampling.FLOAT_DTYPES:
        x = from_numpy(rows, dtype, dev)
        for config in representatives(sampling.ARGMAX):
            assert sampling.argmax(x, config=config).numpy().tolist() == want_argmax, config.label()
        for config in representatives(sampling.TOPK):
            values, indices = sampling.topk(x, 3, config=config)
            assert indices.numpy().tolist() == want_top3, config.label()
            got = values.float64()
            expect = np.take_along_axis(rows, np.array(want_top3), axis=1)
            assert np.array_equal(got, expect, equal_nan=True), config.label()


@pytest.mark.parametrize("name", ["argmax", "topk"])
def test_infinities_and_nans(name, profile, backend):
    spec = SPECS[name]
    for config in representatives(spec):
        for d, dtypes in enumerate(spec.dtypes):
            prob = problem(spec, 4, 2100, d + 1)  # topk: k = 5, 1, 33
            inputs = spec.make_inputs(prob, dtypes, 20 + d, backend.device, values="special")
            assert np.isnan(inputs.tensors["x"].float64()).any()
            check(spec, config, prob, dtypes, profile, backend.device, inputs=inputs)


# (chunk, tile, chunks): the regular run's geometry is the 17-chunk one scaled down (a quarter of the chunk and tile:
# 5 chunks x 64 = 320 > 256 candidates in the combine), the same structure in a third of the interpreted tile steps
RADIX_GEOMETRIES = [
    pytest.param((1024, 256, 5), id="5-chunks"),
    pytest.param((4096, 1024, 17), id="17-chunks", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("geometry", RADIX_GEOMETRIES)
@pytest.mark.parametrize("values", ["ties", "special", "equal"])
def test_radix_topk_over_several_tiles_in_both_steps(values, geometry, profile, backend):
    """The radix variant with a tile smaller than its chunk (4 tiles per chunk) and more candidates than one tile
    holds in the combine (17 chunks x 64 = 1088 > 1024, or 5 x 64 = 320 > 256), which no shipped candidate reaches
    at these sizes; the last chunk partly full; on equal values the lowest indices win across the tiles and chunks."""
    chunk, tile, chunks = geometry
    assert chunk == 4 * tile and chunks * 64 > tile
    config = sampling.radix_config(chunk, tile, 4)
    prob = {"n_rows": 1, "n_cols": chunks * chunk - 100, "k": 64}
    inputs = sampling.topk_inputs(prob, ("float32",), 4, backend.device, values=values)
    # chunks smaller than any candidate's: the workspace the inputs hold is sized for those, this one for `chunk`
    inputs.tensors["workspace"] = sampling.split_workspace(1, prob["n_cols"], 64, backend.device, chunk=chunk)
    check(sampling.TOPK, config, prob, ("float32",), profile, backend.device, inputs=inputs)
    if values == "equal":
        assert np.array_equal(inputs.tensors["indices"].numpy()[0], np.arange(64))


def _larger_one_ranks_first(rows, dtype, backend):
    x = from_numpy(np.array(rows), dtype, backend.device)
    assert np.array_equal(x.float64(), np.array(rows)), "the rows are exact in the dtype"
    for config in representatives(sampling.TOPK):
        _, indices = sampling.topk(x, 1, config=config)  # k = 1: the pair is not both chosen, then ranked
        assert indices.numpy().tolist() == [[1]] * len(rows), (dtype, config.label())


ULP_AT_ONE = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23}
LEAST_SUBNORMAL = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149}


@pytest.mark.parametrize("dtype", sampling.FLOAT_DTYPES)
def test_values_one_unit_in_the_last_place_apart_are_not_tied(dtype, backend):
    """The larger of two neighbouring values of the dtype ranks first though it has the higher index, for positive
    and negative values (radix's order keys drop only bits the dtype never has)."""
    ulp = ULP_AT_ONE[dtype]
    _larger_one_ranks_first([[1.0, 1.0 + ulp, -3.0, -4.0], [-(1.0 + ulp), -1.0, -3.0, -4.0]], dtype, backend)


@pytest.mark.parametrize("dtype", sampling.FLOAT_DTYPES)
def test_the_least_subnormal_ranks_above_zero(dtype, backend):
    if backend.name == "interpreter" and dtype == "bfloat16":
        pytest.skip("Triton 3.6's interpreter flushes bfloat16 subnormals to zero when widening (2^-133 -> 0.0)")
    tiny = LEAST_SUBNORMAL[dtype]
    _larger_one_ranks_first([[0.0, tiny, -3.0, -4.0], [-tiny, -0.0, -3.0, -4.0]], dtype, backend)


def test_generated_rows_hold_deliberate_ties(backend):
    """The made inputs tie each row's maximum (so argmax's answer is a tie-break) and repeat top values."""
    inputs = sampling.topk_inputs({"n_rows": 4, "n_cols": 1000, "k": 16}, ("float32",), 0, backend.device)
    x = inputs.tensors["x"].float64()
    assert np.all((x == x.max(axis=1, keepdims=True)).sum(axis=1) >= 2)
    assert not np.any(x == 0.0)


# --- log_softmax and cross_entropy ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["log_softmax", "cross_entropy"])
def test_rows_of_equal_values(name, profile, backend):
    spec = SPECS[name]
    for config in representatives(spec):
        for dtypes in spec.dtypes:
            prob = {"n_rows": 5, "n_cols": 1500}
            inputs = spec.make_inputs(prob, dtypes, 4, backend.device, values="equal")
            check(spec, config, prob, dtypes, profile, backend.device, inputs=inputs)


@pytest.mark.parametrize("name", ["log_softmax", "cross_entropy"])
def test_split_rows_whose_maximum_lies_in_any_chunk(name, profile, backend):
    """9000 columns in 4096-column chunks: three partials (a fourth, masked lane in the combine). Each row's maximum,
    a spike of +30 over the rest, sits in the first, the middle or the last chunk, so combining must rescale every
    other chunk's sum by exp(M_c - M)."""
    spec = SPECS[name]
    prob = {"n_rows": 3, "n_cols": 9000}
    for dtypes in spec.dtypes:
        inputs = spec.make_inputs(prob, dtypes, 8, backend.device)
        x = inputs.tensors["x"].float64()
        for row, col in enumerate((17, 5000, 8999)):
            x[row, col] = 30.0
        inputs.tensors["x"] = from_numpy(x, dtypes[0], backend.device)
        for config in (sampling.split_config(4096, 1024, 4), sampling.split_config(4096, 2048, 8)):
            assert config in spec.candidates
            check(spec, config, prob, dtypes, profile, backend.device, inputs=inputs)


def test_cross_entropy_ignore_index_and_out_of_range_targets(profile, backend):
    """ignore_index gives exactly 0; a target outside [0, n_cols) gives NaN (the row is not read there)."""
    dev = backend.device
    for config in (sampling.LSE_DEFAULT, sampling.lse_candidates()[-1]):
        for dtype in sampling.FLOAT_DTYPES:
            prob = {"n_rows": 6, "n_cols": 700}
            inputs = sampling.cross_entropy_inputs(prob, (dtype,), 3, dev)
            inputs.tensors["target"] = from_numpy(np.array([0, 699, -100, 700, -1, 5], dtype=np.int64), "int64", dev)
            check(sampling.CROSS_ENTROPY, config, prob, (dtype,), profile, dev, inputs=inputs)
            loss = inputs.tensors["loss"].float64()
            assert loss[2] == 0.0 and np.isnan(loss[3]) and np.isnan(loss[4]), config.label()
            assert np.all(np.isfinite(loss[[0, 1, 5]]) & (loss[[0, 1, 5]] > 0))


# --- the no-bit claims ------------------------------------------------------------------------------------------------
def _bits(t) -> bytes:
    return np.ascontiguousarray(t.numpy()).tobytes()


@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_no_bit_fields_change_no_bit(name, subset, profile, backend):
    """argmax and topk claim every field (the order is total); log_softmax and cross_entropy claim ROWS. Configs
    equal but for the claimed fields give identical bits on the same inputs."""
    spec = SPECS[name]
    fields = {k for c in spec.candidates for k, _ in c.kwargs} | {"num_warps"}
    if spec in (sampling.ARGMAX, sampling.TOPK):
        assert set(spec.no_bit_fields) == fields
    else:
        assert spec.no_bit_fields == ("ROWS",)
    prob = problem(spec, *AWKWARD, 1)  # topk: k = 5 (k = 64 is every kept candidate's first case above)
    kept = spec.pruned_for(prob, profile).kept
    inputs = spec.make_inputs(prob, spec.dtypes[0], 3, backend.device)
    groups = defaultdict(list)
    for c in kept:
        groups[no_bit_group(spec, c)].append(c)
    compared = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        # the regular run compares the first member with a sample of the rest that takes every value of every field
        kinds = [field(f) for f in sorted(fields)]
        members = [members[0]] + [members[1:][i] for i in chosen(members[1:], subset, f"no bit {name}", kinds=kinds)]
        outputs = []
        for c in members:
            for n in inputs.outputs:
                poison(inputs.tensors[n], inputs.tensors[n].dtype)
            spec.launch(c, inputs)
            outputs.append({n: _bits(inputs.tensors[n]) for n in inputs.outputs})
        for c, out in zip(members[1:], outputs[1:], strict=False):
            assert out == outputs[0], f"{spec.name}: {c.label()} and {members[0].label()} differ in bits"
        compared += len(members) - 1
    assert compared > 0


# --- user-facing functions --------------------------------------------------------------------------------------------
def test_user_facing_functions_on_3d_tensors(profile, backend):
    from nbxcert.oracles import sampling as oracle

    dev = backend.device
    gen = np.random.default_rng(5)
    x = from_numpy(gen.standard_normal((2, 3, 300)), "float16", dev)
    xs = x.float64().reshape(6, 300)
    tol = profile.tolerance("float16")

    idx = sampling.argmax(x)
    assert idx.shape == (2, 3) and idx.dtype.name == "int64"
    assert np.array_equal(idx.numpy().reshape(6), oracle.argmax(xs)[0])
    values, indices = sampling.topk(x, 10)
    assert values.shape == (2, 3, 10) and indices.shape == (2, 3, 10)
    ref = oracle.topk(xs, 10)
    assert np.array_equal(indices.numpy().reshape(6, 10), ref["indices"][0])
    assert np.array_equal(values.float64().reshape(6, 10), ref["values"][0])
    y = sampling.log_softmax(x)
    v = compare(y.float64().reshape(6, 300), *oracle.log_softmax(xs), y.dtype, tol, "log_softmax")
    assert v.ok, v.report
    target = from_numpy(gen.integers(0, 300, (2, 3)).astype(np.int64), "int64", dev)
    loss = sampling.cross_entropy(x, target)
    assert loss.shape == (2, 3)
    ref_loss = oracle.cross_entropy(xs, target.numpy().reshape(6))
    v = compare(loss.float64().reshape(6), *ref_loss, loss.dtype, tol, "cross_entropy")
    assert v.ok, v.report
    assert sampling.topk_problem(x, 10) == {"n_rows": 6, "n_cols": 300, "k": 10}


def test_bad_arguments_are_refused_by_name(backend):
    dev = backend.device
    x = from_numpy(np.random.default_rng(0).standard_normal((2, 40)), "float16", dev)
    with pytest.raises(LaunchError, match="k=65"):
        sampling.topk(x, 65)
    with pytest.raises(LaunchError, match="k=41"):
        sampling.topk(x, 41)
    with pytest.raises(ShapeMismatch, match="int64"):
        sampling.cross_entropy(x, from_numpy(np.zeros(2, dtype=np.int32) + 1, "int32", dev))
    with pytest.raises(ShapeMismatch, match="dtype int32"):
        sampling.argmax(from_numpy(np.ones((2, 3), dtype=np.int32), "int32", dev))
    with pytest.raises(LaunchError, match="0 columns"):
        sampling.argmax(from_numpy(np.ones((2, 0)), "float16", dev))
    # the split log_softmax / cross_entropy need their float64 workspace, big enough: refused by name without it
    split, y = sampling.split_config(4096, 1024, 4), from_numpy(np.zeros((2, 40)), "float16", dev)
    with pytest.raises(LaunchError, match="log_softmax split: needs a contiguous float64 workspace of >= 4"):
        sampling.log_softmax_launches(split, x, y)
    small = from_numpy(np.zeros(1), "float64", dev)
    target = from_numpy(np.zeros(2, dtype=np.int64), "int64", dev)
    with pytest.raises(LaunchError, match="cross_entropy split: needs a contiguous float64 workspace"):
        sampling.cross_entropy_launches(split, x, target, y[:, 0], sampling.IGNORE_INDEX, small)
    int_ws = sampling.split_workspace(2, 40, 1, dev)
    with pytest.raises(LaunchError, match="float64 workspace"):
        sampling.log_softmax_launches(split, x, y, int_ws)


# --- prunes against the device files ----------------------------------------------------------------------------------
HOPPER = "nvidia/hopper"
VOCAB_SHAPES = ((1, 128256), (64, 128256), (1, 256000), (256, 256000))


def test_interpreter_prune_keeps_every_candidate():
    interp = get_profile("cpu/interpreter")
    for spec in SPECS.values():
        assert spec.pruned_for(problem(spec, 4, 256000), interp).kept == spec.candidates


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("shape", VOCAB_SHAPES)
def test_hopper_prune_keeps_the_default_and_names_a_fact_for_each_refusal(name, shape):
    spec, hopper = SPECS[name], get_profile(HOPPER)
    result = spec.pruned_for(problem(spec, *shape), hopper)
    assert spec.default in result.kept
    facts = ("max_registers_per_thread", "max_registers_per_block", "warp_size", "max_shared_memory_per_block_optin")
    for config, reason in result.pruned:
        assert any(f in reason for f in facts), (config.label(), reason)


def test_hopper_prune_refuses_what_a_block_cannot_hold():
    hopper = get_profile(HOPPER)
    # one warp holds topk's 64x64 rank comparison (128 registers of it per thread: the census compiled it, no spill)
    kept = sampling.TOPK.pruned_for({"n_rows": 1, "n_cols": 128256, "k": 64}, hopper).kept
    assert any(c.num_warps == 1 for c in kept)
    # every argmax tile fits a hopper block (the census compiled each: no spill, 128 bytes of shared memory or less)
    assert sampling.ARGMAX.pruned_for({"n_rows": 1, "n_cols": 128256}, hopper).kept == sampling.ARGMAX.candidates


# --- GPU: every hopper-kept candidate at vocabulary sizes -------------------------------------------------------------
GPU_CASES = (
    ("argmax", {"n_rows": 1, "n_cols": 128256}),
    ("argmax", {"n_rows": 64, "n_cols": 256000}),
    ("topk", {"n_rows": 1, "n_cols": 256000, "k": 64}),
    ("topk", {"n_rows": 32, "n_cols": 128256, "k": 50}),
    ("topk", {"n_rows": 8, "n_cols": 128256, "k": 1}),
    ("log_softmax", {"n_rows": 1, "n_cols": 256000}),
    ("log_softmax", {"n_rows": 64, "n_cols": 128256}),
    ("cross_entropy", {"n_rows": 256, "n_cols": 128256}),
    ("cross_entropy", {"n_rows": 4, "n_cols": 256000}),
)


@pytest.mark.gpu
@pytest.mark.parametrize("name,prob", GPU_CASES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_every_kept_candidate_at_vocabulary_sizes(name, prob, dtype, profile, backend):
    """Each candidate the device's prune keeps matches the oracle (computed once per case), and candidates equal but
    for no-bit fields agree to the bit."""
    spec = SPECS[name]
    failures = check_configs(spec, prob, (dtype,), profile, 7, backend.device)
    assert not failures, "\n\n".join(failures[:3])
