"""Tests of the matrix-product family (kernels/matmul.py): matmul, addmm, bmm, baddbmm, gemv, addmv.

Under the interpreter (CI): every candidate the prune keeps for cpu/interpreter runs once on a small awkward problem
and matches the float64 oracle; one candidate of each kernel kind (and the default) runs every example problem in
every dtype; the no-bit claim (GROUP_M) is checked bit for bit; the user-facing functions, the keys derived from
strides, the prune's refusals and the oracle check's power to fail are tested. Cross-compilation for sm_90 and sm_80
on the CPU (a subprocess in the cross-compiling backend, which compiles without launching) checks that candidates
compile for Hopper and that the shared-memory estimate bounds the compiler's own figure (`compiled.metadata.shared`).

GPU tests (`gpu`): every candidate kept for the GPU's profile at the real shapes, one launch each, judged against
an oracle computed once per shape.
"""

from __future__ import annotations

import time

import crosstools
import numpy as np
import pytest
from sampletools import SUBSETS, chosen, field

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import matmul as mm
from nbxcert.kernels.check import all_ok, first_report, run_checked
from nbxcert.kernels.common import wrap_run
from nbxcert.kernels.compare import compare, poison
from nbxcert.kernels.dtypes import finfo, get_dtype, rounding_bound
from nbxcert.kernels.spec import Config
from nbxcert.kernels.tensor import from_numpy
from nbxcert.oracles import matmul as oracle
from nbxcert.profiles import get_profile

SPECS = {s.name: s for s in mm.SPECS}


def _interpreter_only(backend):
    if backend.name != "interpreter":
        pytest.skip("interpreter-sized test; the GPU runs the gpu-marked tests at real shapes")


def _representatives(spec, kept):
    """The default, then the first kept candidate of each kernel kind."""
    reps = [spec.default] if spec.default in kept else []
    for c in kept:
        if c["KIND"] not in {r["KIND"] for r in reps}:
            reps.append(c)
    return reps


# --- every kept candidate, once (a sample of every kind, tile and dtype in the regular run) ---------------------------
@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", list(SPECS))
def test_every_kept_candidate_matches_oracle(name, subset, profile, backend):
    _interpreter_only(backend)
    spec = SPECS[name]
    problem = spec.example_problems[0]
    kept = spec.pruned_for(problem, profile).kept
    assert len(kept) == len(spec.candidates)  # the interpreter states no limit, and it emulates TMA
    tiles = [field(f) for f in ("KIND", "BLOCK_M", "BLOCK_N", "K_BYTES", "BLOCK_K", "SPLIT_K")]
    picked = chosen(kept, subset, f"matmul every kept {name}", kinds=tiles, turns=[len(spec.dtypes)])
    failures = []
    for i in picked:
        dtypes = spec.dtypes[i % len(spec.dtypes)]  # every candidate once, the dtypes in turn
        verdicts = run_checked(spec, kept[i], problem, dtypes, profile, seed=i, device="cpu")
        if not all_ok(verdicts):
            failures.append(first_report(verdicts))
    assert not failures, f"{len(failures)} of {len(picked)} candidates mismatch:\n" + "\n\n".join(failures[:3])


# --- one candidate per kind, every example problem and dtype ---------------------------------------------------------
# (the regular run gives each (representative, problem) pair one dtype in turn: each representative meets every dtype
# over the three or four problems, and each problem every dtype where three kinds are kept; -m slow: every pair in
# every dtype)
@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", list(SPECS))
def test_representatives_on_every_example_and_dtype(name, subset, profile, backend):
    _interpreter_only(backend)
    spec = SPECS[name]
    failures, runs = [], 0
    for p_index, problem in enumerate(spec.example_problems):
        kept = spec.pruned_for(problem, profile).kept
        for c, config in enumerate(_representatives(spec, kept)):
            for d, dtypes in enumerate(spec.dtypes):
                if subset == "sample" and d != (c + p_index) % len(spec.dtypes):
                    continue
                verdicts = run_checked(spec, config, problem, dtypes, profile, seed=100 + p_index, device="cpu")
                runs += 1
                if not all_ok(verdicts):
                    failures.append(first_report(verdicts))
    assert runs >= len(spec.example_problems) * (len(spec.dtypes) if subset == "every" else 1)
    assert not failures, f"{len(failures)} of {runs} runs mismatch:\n" + "\n\n".join(failures[:3])


def test_bfloat16_runs_under_the_interpreter_by_upcasting(backend):
    """The interpreter's tl.dot reads bfloat16 storage as raw integers; the kernels upcast there (UPCAST), so
    bfloat16 is certified on the interpreter rather than skipped. This pins that the path is really taken."""
    _interpreter_only(backend)
    assert mm._interpreting()
    assert ("bfloat16", "bfloat16") in mm.MATMUL.dtypes


# --- the no-bit claim -------------------------------------------------------------------------------------------------
def _with(config: Config, **changes) -> Config:
    """`config` with its kwargs changed (a None value removes the field)."""
    kwargs = {k: v for k, v in {**dict(config.kwargs), **changes}.items() if v is not None}
    return Config.make(num_warps=config.num_warps, num_stages=config.num_stages, **kwargs)


def _output_bits(spec, config, problem, dtypes, seed, device):
    inputs = spec.make_inputs(problem, dtypes, seed, device)
    poison(inputs.tensors["out"], inputs.tensors["out"].dtype)
    spec.launch(config, inputs)
    return inputs.tensors["out"].numpy().copy()


@pytest.mark.parametrize("kind", ["tiled", "split_k", "tma_persistent"])
def test_group_m_changes_no_bit(kind, profile, backend):
    _interpreter_only(backend)
    assert "GROUP_M" in mm.MATMUL.no_bit_fields
    # many tiles in both directions, so the grouped order really permutes them
    problem = {"M": 150, "N": 200, "K": 40, "trans_a": 0, "trans_b": 1, "aligned": 1}
    kept = mm.MATMUL.pruned_for(problem, profile).kept
    base = min((c for c in kept if c["KIND"] == kind), key=lambda c: c["BLOCK_M"] * c["BLOCK_N"])
    reference = _output_bits(mm.MATMUL, base, problem, ("float16", "float16"), 5, "cpu")
    assert not np.isnan(reference.view(np.float16)).any()
    for group_m in (1, 2, 3, 16):
        got = _output_bits(mm.MATMUL, _with(base, GROUP_M=group_m), problem, ("float16", "float16"), 5, "cpu")
        assert np.array_equal(got, reference), f"GROUP_M={group_m} changed output bits of {base.label()}"


def _out_descriptors(monkeypatch) -> list:
    """Record every TMA descriptor the launches make of `out` (the C_TMA store's)."""
    made, real = [], mm._descriptor

    def recording(t, what, *args, **kwargs):
        if what == "out":
            made.append(t)
        return real(t, what, *args, **kwargs)

    monkeypatch.setattr(mm, "_descriptor", recording)
    return made


def test_the_tma_store_changes_no_bit(profile, backend, monkeypatch):
    """C_TMA (the tile stored by TMA through C's descriptor) writes the bits its pointer-store twin writes: a product
    whose edges cut tiles, addmm's bias and activation, a batched product; and the TMA store is really taken."""
    _interpreter_only(backend)
    assert mm.MATMUL.no_bit_fields == ("GROUP_M", "C_TMA")
    made = _out_descriptors(monkeypatch)
    cases = [
        (mm.MATMUL, {"M": 150, "N": 200, "K": 40, "trans_a": 0, "trans_b": 1, "aligned": 1}),
        (mm.ADDMM, {"M": 70, "N": 136, "K": 24, "trans_a": 1, "trans_b": 0, "aligned": 1, "activation": "gelu_tanh"}),
        (
            mm.BMM,
            {
                "batch": 3,
                "M": 40,
                "N": 72,
                "K": 16,
                "trans_a": 0,
                "trans_b": 0,
                "aligned": 1,
                "bcast_a": 0,
                "bcast_b": 1,
            },
        ),
    ]
    stores = mm.tma_store_configs()
    assert {mm.epilogue_parts(c) for c in stores} == {1, 2, 4}
    for spec, problem in cases:
        dtypes = spec.dtypes[0]
        for config in stores:
            assert config in spec.pruned_for(problem, profile).kept
            before = len(made)
            got = _output_bits(spec, config, problem, dtypes, 6, "cpu")
            assert len(made) == before + 1, f"{config.label()} did not store through C's descriptor"
            twin = _output_bits(spec, _with(config, C_TMA=None), problem, dtypes, 6, "cpu")
            assert len(made) == before + 1
            assert not np.isnan(got.view(np.float16)).any(), f"{spec.name} {config.label()} left elements unwritten"
            assert np.array_equal(got, twin), f"C_TMA changed output bits of {spec.name} {config.label()}"


def test_the_tma_store_leaves_an_out_it_cannot_write_to_pointers(profile, backend, monkeypatch):
    """An `out` whose rows are not 16 bytes apart (a view into a wider buffer) cannot be written by TMA: a C_TMA
    config stores it by pointers, correctly, and the columns beside the view stay as they were."""
    _interpreter_only(backend)
    made = _out_descriptors(monkeypatch)
    rng = np.random.default_rng(8)
    a = from_numpy(rng.standard_normal((37, 48)), "float16")
    b = from_numpy(rng.standard_normal((48, 64)), "float16")
    ref = oracle.matmul(a.float64(), b.float64(), acc_eps=mm.ACC_EPS, out_eps=_eps("float16"))
    config = mm.tma_store_configs()[3]
    wide = from_numpy(np.full((37, 67), 7.0), "float16")  # rows 134 bytes apart
    view = wide[:, :64]
    assert not mm._c_tma_ready(view, (0, 67, 1), 1, 37)
    mm.matmul(a, b, out=view, config=config)
    assert made == []
    _judge(view, *ref, profile)
    assert np.array_equal(wide.float64()[:, 64:], np.full((37, 3), 7.0))
    contiguous = mm.matmul(a, b, config=config)  # the same config on an out TMA can write takes the TMA store
    assert len(made) == 1 and np.array_equal(contiguous.numpy(), view.numpy())


def test_c_tma_ready():
    out = from_numpy(np.zeros((4, 16)), "float16")
    assert mm._c_tma_ready(out, (0, 16, 1), 1, 4)
    assert not mm._c_tma_ready(out, (0, 16, 2), 1, 4)  # not unit column stride
    assert not mm._c_tma_ready(out, (0, 12, 1), 1, 4)  # rows 24 bytes apart
    assert mm._c_tma_ready(out, (0, 12, 1), 1, 1)  # one row: its stride never counts
    assert not mm._c_tma_ready(out, (36, 16, 1), 2, 4)  # batches 72 bytes apart
    assert mm._c_tma_ready(out, (36, 16, 1), 1, 4)
    assert mm._c_tma_ready(out, (64, 16, 1), 2, 4)
    assert not mm._c_tma_ready(out, (0, 16, 1), 2, 4)  # every batch on the same rows: pointer stores
    assert not mm._c_tma_ready(from_numpy(np.zeros(20), "float16")[1:17].reshape(1, 16), (0, 16, 1), 1, 1)


def test_split_k_is_deterministic(profile, backend):
    _interpreter_only(backend)
    problem = {"M": 20, "N": 70, "K": 300, "trans_a": 0, "trans_b": 0, "aligned": 1}
    config = next(c for c in mm.MATMUL.candidates if c["KIND"] == "split_k" and c["SPLIT_K"] == 16)
    first = _output_bits(mm.MATMUL, config, problem, ("float32", "float32"), 9, "cpu")
    second = _output_bits(mm.MATMUL, config, problem, ("float32", "float32"), 9, "cpu")
    assert np.array_equal(first, second)


# --- the check can fail -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_oracle_check_catches_a_missing_k_step(dtype, profile, backend):
    """A kernel that drops the last K step (a classic tail bug) must be refused at the profile's tolerance."""
    _interpreter_only(backend)
    problem = {"M": 33, "N": 47, "K": 29, "trans_a": 0, "trans_b": 0, "aligned": 1}
    inputs = mm.MATMUL.make_inputs(problem, (dtype, dtype), 3, "cpu")
    ref = mm.MATMUL.oracle(inputs)["out"]
    a, b, out = inputs.tensors["a"], inputs.tensors["b"], inputs.tensors["out"]
    mm.matmul(a[:, :-1], b[:-1, :], out=out)  # the product without its last K term
    tol = profile.tolerance(dtype)
    verdict = compare(out.float64(), ref.value, ref.scale, out.dtype, tol, "dropped K step")
    assert not verdict.ok and verdict.n_mismatched > out.numel // 4, verdict
    assert "Mismatched elements" in verdict.report
    mm.matmul(a, b, out=out)  # and the full product passes
    assert compare(out.float64(), ref.value, ref.scale, out.dtype, tol).ok


# --- keys from strides; inputs in the problem's layout ----------------------------------------------------------------
def _problem_from_inputs(spec, inputs):
    t, s = inputs.tensors, inputs.scalars
    if spec.name in ("matmul", "bmm", "gemv"):
        args = (t["a"], t["b"]) if "a" in t else (t["x"], t["w"])
        return spec.problem_of(*args)
    args = (t["bias"], t["a"], t["b"]) if "a" in t else (t["bias"], t["x"], t["w"])
    return spec.problem_of(*args, activation=s["activation"])


@pytest.mark.parametrize("name", list(SPECS))
def test_problem_of_reads_back_every_example(name, backend):
    spec = SPECS[name]
    for problem in spec.example_problems:
        inputs = spec.make_inputs(problem, spec.dtypes[0], 0, "cpu")
        assert _problem_from_inputs(spec, inputs) == problem
        assert set(problem) == set(spec.problem_args)


def test_layout_flags_come_from_strides():
    a = from_numpy(np.ones((8, 16)), "float16")
    b = from_numpy(np.ones((16, 24)), "float16")
    assert mm.MATMUL.problem_of(a, b) == {"M": 8, "N": 24, "K": 16, "trans_a": 0, "trans_b": 0, "aligned": 1}
    at = from_numpy(np.ones((16, 8)), "float16").T  # (8, 16), column-major
    bt = from_numpy(np.ones((24, 16)), "float16").T  # (16, 24), nn.Linear's weight.T
    p = mm.MATMUL.problem_of(at, bt)
    assert (p["trans_a"], p["trans_b"], p["aligned"]) == (1, 1, 1)
    odd = from_numpy(np.ones((8, 15)), "float16")  # a row of 30 bytes: not a TMA stride
    assert mm.MATMUL.problem_of(odd, from_numpy(np.ones((15, 24)), "float16"))["aligned"] == 0
    shifted = from_numpy(np.ones(8 * 16 + 1), "float16")[1:].view(8, 16)  # base 2 bytes past alignment
    assert mm.MATMUL.problem_of(shifted, b)["aligned"] == 0


def test_bmm_broadcast_flags():
    a = from_numpy(np.ones((1, 8, 16)), "float32").expand(4, 8, 16)
    b = from_numpy(np.ones((4, 16, 8)), "float32")
    p = mm.BMM.problem_of(a, b)
    assert (p["batch"], p["bcast_a"], p["bcast_b"]) == (4, 1, 0)


# --- the user-facing functions ----------------------------------------------------------------------------------------
def _judge(out, value, scale, profile):
    verdict = compare(out.float64(), value, scale, out.dtype, profile.tolerance(out.dtype.name), "user-facing call")
    assert verdict.ok, verdict.report


def _eps(dtype):
    return finfo(get_dtype(dtype))["eps"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_user_functions_match_oracle(dtype, profile, backend):
    _interpreter_only(backend)
    rng = np.random.default_rng(11)
    kw = dict(acc_eps=mm.ACC_EPS, out_eps=_eps(dtype))
    a = from_numpy(rng.standard_normal((19, 33)), dtype)
    b = from_numpy(rng.standard_normal((40, 33)), dtype).T  # (33, 40) column-major
    _judge(mm.matmul(a, b), *oracle.matmul(a.float64(), b.float64(), **kw), profile)

    bias_row = from_numpy(rng.standard_normal(40), dtype)
    bias_full = from_numpy(rng.standard_normal((19, 40)), dtype)
    for bias in (bias_row, bias_full):
        for act in mm.ACTIVATIONS:
            out = mm.addmm(bias, a, b, beta=0.5, alpha=-1.25, activation=act)
            ref = oracle.addmm(
                a.float64(), b.float64(), bias.float64(), alpha=-1.25, beta=0.5, activation_name=act, **kw
            )
            _judge(out, *ref, profile)

    a3 = from_numpy(rng.standard_normal((1, 9, 20)), dtype).expand(3, 9, 20)  # broadcast over the batch
    b3 = from_numpy(rng.standard_normal((3, 20, 14)), dtype)
    _judge(mm.bmm(a3, b3), *oracle.matmul(a3.float64(), b3.float64(), **kw), profile)
    bias3 = from_numpy(rng.standard_normal(14), dtype)
    out = mm.baddbmm(bias3, a3, b3, alpha=2.0, activation="silu")
    _judge(
        out,
        *oracle.addmm(a3.float64(), b3.float64(), bias3.float64(), alpha=2.0, activation_name="silu", **kw),
        profile,
    )

    x = from_numpy(rng.standard_normal(50), dtype)  # a vector: the result is (N,)
    w = from_numpy(rng.standard_normal((30, 50)), dtype).T  # nn.Linear's weight.T
    out = mm.gemv(x, w)
    assert out.shape == (30,)
    value, scale = oracle.matmul(x.float64()[None, :], w.float64(), **kw)
    _judge(out, value[0], scale[0], profile)
    x2 = from_numpy(rng.standard_normal((3, 50)), dtype)
    bias_v = from_numpy(rng.standard_normal(30), dtype)
    out = mm.addmv(bias_v, x2, w, beta=-1.0, activation="gelu_tanh")
    ref = oracle.addmm(x2.float64(), w.float64(), bias_v.float64(), beta=-1.0, activation_name="gelu_tanh", **kw)
    _judge(out, *ref, profile)


def test_every_config_kind_through_the_user_function(profile, backend):
    _interpreter_only(backend)
    rng = np.random.default_rng(2)
    a = from_numpy(rng.standard_normal((21, 64)), "float16")
    b = from_numpy(rng.standard_normal((64, 72)), "float16")
    ref = oracle.matmul(a.float64(), b.float64(), acc_eps=mm.ACC_EPS, out_eps=_eps("float16"))
    problem = mm.MATMUL.problem_of(a, b)
    for config in _representatives(mm.MATMUL, mm.MATMUL.pruned_for(problem, profile).kept):
        _judge(mm.matmul(a, b, config=config), *ref, profile)


def test_empty_and_degenerate_sizes(profile, backend):
    _interpreter_only(backend)
    rng = np.random.default_rng(4)
    a0 = from_numpy(rng.standard_normal((0, 8)), "float32")
    b = from_numpy(rng.standard_normal((8, 5)), "float32")
    assert mm.matmul(a0, b).shape == (0, 5)
    # K = 0: the product is all zeros, plus the bias for addmm
    ak = from_numpy(np.zeros((4, 0)), "float32")
    bk = from_numpy(np.zeros((0, 6)), "float32")
    bias = from_numpy(rng.standard_normal(6), "float32")
    for config in (mm.DEFAULT_MM, next(c for c in mm.MATMUL.candidates if c["KIND"] == "split_k")):
        assert np.array_equal(mm.matmul(ak, bk, config=config).float64(), np.zeros((4, 6)))
        got = mm.addmm(bias, ak, bk, config=config).float64()
        assert np.array_equal(got, np.broadcast_to(bias.float64(), (4, 6)))


def test_refusals_by_name():
    a = from_numpy(np.ones((4, 8)), "float16")
    with pytest.raises(ShapeMismatch, match="share one dtype"):
        mm.matmul(a, from_numpy(np.ones((8, 4)), "float32"))
    with pytest.raises(ShapeMismatch, match="inner dimensions differ"):
        mm.matmul(a, from_numpy(np.ones((7, 4)), "float16"))
    with pytest.raises(LaunchError, match="M <= 4"):
        mm.gemv(from_numpy(np.ones((5, 8)), "float16"), from_numpy(np.ones((8, 4)), "float16"))
    with pytest.raises(LaunchError, match="unknown activation"):
        mm.addmm(from_numpy(np.ones(4), "float16"), a, from_numpy(np.ones((8, 4)), "float16"), activation="tanh")
    tma = next(c for c in mm.MATMUL.candidates if c["KIND"] == "tma_persistent")
    shifted = from_numpy(np.ones(4 * 8 + 1), "float16")[1:].view(4, 8)
    with pytest.raises(LaunchError, match="TMA"):
        mm.matmul(shifted, from_numpy(np.ones((8, 16)), "float16"), config=tma)


# --- prune ------------------------------------------------------------------------------------------------------------
BIG = {"M": 4096, "N": 4096, "K": 4096, "trans_a": 0, "trans_b": 0, "aligned": 1}


def test_prune_tma_by_device_and_problem():
    hopper, ampere, interp = (get_profile(p) for p in ("nvidia/hopper", "nvidia/ampere", "cpu/interpreter"))
    tma = [c for c in mm.MATMUL.candidates if c["KIND"] == "tma_persistent"]
    assert any(c in mm.MATMUL.pruned_for(BIG, hopper).kept for c in tma)
    assert all(c in mm.MATMUL.pruned_for(BIG, interp).kept for c in tma)  # the interpreter emulates descriptors
    refused = dict(mm.MATMUL.pruned_for(BIG, ampere).pruned)
    assert all("compute capability >= 9.0" in refused[c] for c in tma)
    refused = dict(mm.MATMUL.pruned_for(dict(BIG, aligned=0), hopper).pruned)
    assert all("aligned=1" in refused[c] for c in tma)


def test_prune_shared_memory_and_limits():
    for key in ("nvidia/hopper", "nvidia/ampere", "nvidia/ada", "nvidia/turing", "cpu/interpreter"):
        profile = get_profile(key)
        cap = profile.fact("max_shared_memory_per_block_optin")
        result = mm.MATMUL.pruned_for(BIG, profile)
        stages = profile.fact("max_num_stages")
        assert (mm.DEFAULT_MM in result.kept) == (stages is None or stages >= mm.DEFAULT_MM.num_stages), key
        assert any(c["KIND"] == "tiled" for c in result.kept), key
        for c in result.kept:
            assert cap is None or mm.smem_estimate(c) <= cap
            assert profile.fact("max_num_stages") is None or c.num_stages <= profile.fact("max_num_stages")
        for c, reason in result.pruned:
            assert reason, c
    ampere = get_profile("nvidia/ampere")
    big_tile = mm._tile("tiled", 128, 256, 128, 8, 4)
    assert big_tile in mm.MATMUL.candidates
    reason = dict(mm.MATMUL.pruned_for(BIG, ampere).pruned)[big_tile]
    assert "shared memory" in reason and "166912" in reason


def test_smem_estimate_formula():
    """(BLOCK_M + BLOCK_N) · K_BYTES · stages is (BLOCK_M·BLOCK_K + BLOCK_K·BLOCK_N) · itemsize · stages for every
    itemsize: the estimate does not depend on the dtype, which the prune does not see."""
    c = mm._tile("tiled", 128, 256, 128, 8, 3)
    for itemsize in (2, 4):
        block_k = 128 // itemsize
        assert (128 * block_k + block_k * 256) * itemsize * 3 == (128 + 256) * 128 * 3
    assert mm.smem_estimate(c) == max((128 + 256) * 128 * 3, 128 * 256 * 4)


def test_gemv_register_prune():
    hopper = get_profile("nvidia/hopper")
    problem = {"M": 4, "N": 4096, "K": 4096, "trans_b": 1}
    result = mm.GEMV.pruned_for(problem, hopper)
    refused = dict(result.pruned)
    wide = mm._gemv(16, 512, 4, 1)  # 4 x 512 x 16 partial sums over 128 threads: 256 > 255 registers
    assert "registers per thread" in refused[wide] and "gemv partial sum" in refused[wide]
    assert wide in mm.GEMV.pruned_for(dict(problem, M=1), hopper).kept
    assert mm.DEFAULT_GEMV in result.kept


def test_candidate_counts_and_default():
    assert (
        Config.make(num_warps=4, num_stages=3, KIND="tiled", BLOCK_M=128, BLOCK_N=128, K_BYTES=64, GROUP_M=8)
        == mm.DEFAULT_MM
    )
    kinds = [c["KIND"] for c in mm.MATMUL.candidates]
    tiled = mm.classic_configs() + mm.small_m_configs() + mm.unpipelined_configs()
    assert kinds.count("tiled") == len(tiled)
    assert kinds.count("split_k") == len(mm.split_k_configs())
    assert kinds.count("tma_persistent") == len(mm.tma_persistent_configs())
    assert all(s.candidates == mm.MATMUL.candidates for s in (mm.ADDMM, mm.BMM, mm.BADDBMM))


# --- cross-compilation on the CPU: compiles for Hopper; shared memory estimate bounds the compiler -------------------
# In a subprocess in the cross-compiling backend (`crosstools`): the real launch code of the spec runs unchanged and
# each launch compiles for the target without launching, so the specialization compiled is exactly the one a GPU
# launch would compile (a persistent kernel's grid takes the target's 132 SMs).
def _cross_compile(arch: int, items: list[dict], timeout: int) -> list[dict]:
    results = crosstools.cross_compile(arch, crosstools.launch_specs, items, timeout)
    for r in results:
        if r["ok"]:  # the launch's first kernel is the one the estimate is for
            main = r["kernels"][0]
            estimate = mm.smem_estimate(Config.from_dict(r["config"]))
            r.update(shared=main["shared"], estimate=estimate, wgmma=main["wgmma"], tma=main["tma"])
    return results


def _item(spec, config, problem, dtype):
    return {"spec": spec.name, "config": config.as_dict(), "problem": problem, "dtypes": [dtype] * len(spec.dtypes[0])}


def _check_cross(results, expected):
    assert len(results) == expected, f"{expected - len(results)} compile jobs printed nothing"
    failed = [r for r in results if not r["ok"]]
    assert not failed, "\n".join(f"{r['spec']} {r['config']} {r['dtypes']}: {r['error']}" for r in failed[:5])
    over = [r for r in results if r["shared"] > r["estimate"]]
    assert not over, "estimate below the compiler's figure:\n" + "\n".join(
        f"{r['spec']} {Config.from_dict(r['config']).label()} {r['dtypes'][0]}: shared {r['shared']} > "
        f"estimate {r['estimate']}"
        for r in over
    )


SMALL = {"M": 256, "N": 256, "K": 256, "trans_a": 0, "trans_b": 0, "aligned": 1}


def test_representatives_compile_for_hopper():
    """One candidate of each kind (and the default) cross-compiles for sm_90; 16-bit tiles use wgmma, TMA kernels
    the bulk tensor copy; the estimate bounds the compiler's shared memory."""
    hopper = get_profile("nvidia/hopper")
    reps = _representatives(mm.MATMUL, mm.MATMUL.pruned_for(BIG, hopper).kept)
    items = [_item(mm.MATMUL, c, SMALL, "float16") for c in reps]
    gemv_problem = {"M": 1, "N": 256, "K": 256, "trans_b": 1}
    items.append(_item(mm.GEMV, mm.DEFAULT_GEMV, gemv_problem, "float16"))
    results = _cross_compile(90, items, timeout=600)
    _check_cross(results, len(items))
    by_kind = {Config.from_dict(r["config"])["KIND"]: r for r in results}
    assert by_kind["tiled"]["wgmma"] and by_kind["tma_persistent"]["wgmma"] and by_kind["tma_persistent"]["tma"]


def vector_loads(items: list[dict]):
    """(In the cross-compiling subprocess.) Per item, the number of vector global reads in the PTX of each kernel its
    launch compiles: `ld.global.v2`/`.v4` and the 16-byte asynchronous copies to shared memory (`cp.async.cg`)."""
    import re

    from nbxcert.kernels.backends import cross
    from nbxcert.kernels.spec import Config, get_spec

    for item in items:
        spec = get_spec(item["spec"])
        inputs = spec.make_inputs(item["problem"], tuple(item["dtypes"]), 0, "cpu")
        with cross.recording() as launched:
            spec.launch(Config.from_dict(item["config"]), inputs)
        yield [
            len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]\.|cp\.async\.cg\.shared\.global", launch.compiled.asm["ptx"]))
            for launch in launched
        ]


@pytest.mark.parametrize("kind", ["tiled", "split_k"])
def test_wrapped_columns_claim_no_vector_across_the_wrap(kind):
    """B row-major with 16-byte padded rows: at N = 48 the column offsets run contiguously in 16s and B is read in
    vectors; at N = 47 the offsets wrap mid-vector (64 -> 0 at column 47), so no vector may span the wrap: the kernel
    claims runs of 1 and reads B element by element (a claim of BLOCK_N gave misaligned vectors: a device fault on
    sm_90)."""
    extra = {"SPLIT_K": 2} if kind == "split_k" else {}
    config = Config.make(num_warps=4, num_stages=2, KIND=kind, BLOCK_M=32, BLOCK_N=64, K_BYTES=64, GROUP_M=8, **extra)
    items = [
        _item(mm.MATMUL, config, {"M": 33, "N": n, "K": 32, "trans_a": 0, "trans_b": 0, "aligned": 1}, "float16")
        for n in (48, 47)
    ]
    even, odd = crosstools.cross_compile(90, vector_loads, items, timeout=600)
    assert even[0] > odd[0], f"vector loads at N=48: {even[0]}, at N=47: {odd[0]}"
    assert wrap_run(47, 64, 1) == 1 and wrap_run(48, 64, 1) == 16 and wrap_run(4096, 64, 1) == 64
    assert wrap_run(47, 64, 48) == 64  # not the contiguous dimension: nothing vectorized along it, the tile claimed


def split_offsets(items: list[dict]):
    """(In the cross-compiling subprocess.) Per item, the lines of the split-K reduce kernel's TTIR that use
    stride_ws_split."""
    from nbxcert.kernels.backends import cross
    from nbxcert.kernels.spec import Config, get_spec

    for item in items:
        spec = get_spec(item["spec"])
        inputs = spec.make_inputs(item["problem"], tuple(item["dtypes"]), 0, "cpu")
        with cross.recording() as launched:
            spec.launch(Config.from_dict(item["config"]), inputs)
        ttir = [
            launch.compiled.asm["ttir"]
            for launch in launched
            if "@_split_k_reduce_kernel" in launch.compiled.asm["ttir"]
        ]
        yield [
            line.strip()
            for text in ttir
            for line in text.splitlines()
            if "%stride_ws_split" in line and "loc(" in line and "tt.func" not in line
        ]


def test_split_k_reduce_offsets_partials_in_64_bits():
    """The reduce kernel reads partial s at s·batch·M·N elements into the workspace: past 2^31 at SPLIT_K = 16 of a
    4096 x 37888 product (on the H100 every such candidate was wrong at 46% of its elements when the offset was formed
    in 32 bits). The stride is widened to 64 bits before any multiple of it is taken."""
    config = Config.make(
        num_warps=4, num_stages=2, KIND="split_k", BLOCK_M=32, BLOCK_N=64, K_BYTES=64, GROUP_M=8, SPLIT_K=4
    )
    item = _item(mm.MATMUL, config, {"M": 33, "N": 48, "K": 64, "trans_a": 0, "trans_b": 0, "aligned": 1}, "float16")
    (lines,) = crosstools.cross_compile(90, split_offsets, [item], timeout=600)
    assert lines, "no split-K reduce kernel was compiled"
    assert all("arith.extsi %stride_ws_split : i32 to i64" in line for line in lines), lines


@pytest.mark.slow
@pytest.mark.parametrize("arch,profile_key", [(90, "nvidia/hopper"), (80, "nvidia/ampere")])
def test_smem_estimate_bounds_compiler(arch, profile_key):
    """The census: every candidate kept for the profile, float16 and float32 (bfloat16 lays out as float16), plus
    transposed and batched launches, cross-compiles, and its shared memory is at most the prune's estimate."""
    profile = get_profile(profile_key)
    items = []
    for dtype in ("float16", "float32"):
        for c in mm.MATMUL.pruned_for(BIG, profile).kept:
            items.append(_item(mm.MATMUL, c, SMALL, dtype))
        for c in mm.GEMV.pruned_for({"M": 4, "N": 4096, "K": 4096, "trans_b": 1}, profile).kept:
            items.append(_item(mm.GEMV, c, {"M": 4, "N": 256, "K": 256, "trans_b": 1}, dtype))
    layouts = [dict(SMALL, trans_a=1), dict(SMALL, trans_b=1), dict(SMALL, trans_a=1, trans_b=1)]
    bmm_problem = dict(SMALL, batch=4, bcast_a=0, bcast_b=1)
    for c in _representatives(mm.MATMUL, mm.MATMUL.pruned_for(BIG, profile).kept):
        items += [_item(mm.MATMUL, c, p, "float16") for p in layouts]
        items.append(_item(mm.BMM, c, bmm_problem, "bfloat16"))
        items.append(_item(mm.ADDMM, c, dict(SMALL, activation="gelu_tanh"), "float16"))
    started = time.time()
    results = _cross_compile(arch, items, timeout=3000)
    _check_cross(results, len(items))
    print(f"\n{len(results)} compiles for sm_{arch} in {time.time() - started:.0f}s")
    for r in results:
        label = Config.from_dict(r["config"]).label()
        print(f"  {r['spec']:7s} {r['dtypes'][0]:9s} shared {r['shared']:7d} <= {r['estimate']:7d}  {label}")


# --- GPU: every kept candidate at the real shapes ---------------------------------------------------------------------
GPU_SHAPES = {
    "4096x4096x4096": ("matmul", {"M": 4096, "N": 4096, "K": 4096}),
    "512x5632x2048": ("matmul", {"M": 512, "N": 5632, "K": 2048}),
    "16x4096x4096": ("matmul", {"M": 16, "N": 4096, "K": 4096}),
    "1x4096x4096": ("matmul", {"M": 1, "N": 4096, "K": 4096}),
    "bmm 32x512x128x512": ("bmm", {"batch": 32, "M": 512, "N": 128, "K": 512, "bcast_a": 0, "bcast_b": 0}),
}


class _Judge:
    """The oracle of one (problem, dtype), computed once, and a fast per-candidate check that falls back to
    `compare` (the numpy-style report) only on a mismatch."""

    def __init__(self, spec, problem, dtypes, profile, device):
        self.spec, self.problem, self.dtypes = spec, problem, dtypes
        self.inputs = spec.make_inputs(problem, dtypes, 0, device)
        ref = spec.oracle(self.inputs)["out"]
        self.ref, self.scale = ref.value, ref.scale
        self.dtype = self.inputs.tensors["out"].dtype
        self.tol = profile.tolerance(self.dtype.name)
        self.allowed = self.tol * np.abs(self.scale) + rounding_bound(self.ref, self.dtype)

    def check(self, config) -> str | None:
        out = self.inputs.tensors["out"]
        poison(out, self.dtype)
        self.spec.launch(config, self.inputs)
        got = out.float64()
        with np.errstate(invalid="ignore"):
            good = np.isfinite(got) & (np.abs(got - self.ref) <= self.allowed)
        if good.all():
            return None
        context = f"kernel {self.spec.name}, config {config.label()}, problem {self.problem}, dtypes {self.dtypes}"
        return compare(got, self.ref, self.scale, self.dtype, self.tol, context).report


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
def test_gpu_every_kept_candidate_at_real_shapes(shape, profile, backend):
    """float16: every candidate kept for the GPU's profile; bfloat16 and float32: the default and one per kind.
    The gemv spec joins at M = 1."""
    spec_name, dims = GPU_SHAPES[shape]
    plans = [(SPECS[spec_name], dict(dims, trans_a=0, trans_b=0, aligned=1))]
    if dims["M"] <= mm.GEMV_MAX_M and spec_name == "matmul":
        plans.append((mm.GEMV, {"M": dims["M"], "N": dims["N"], "K": dims["K"], "trans_b": 0}))
    failures, runs = [], 0
    for spec, problem in plans:
        kept = spec.pruned_for(problem, profile).kept
        for dtype in ("float16", "bfloat16", "float32"):
            judge = _Judge(spec, problem, (dtype, dtype), profile, backend.device)
            for config in kept if dtype == "float16" else _representatives(spec, kept):
                runs += 1
                report = judge.check(config)
                if report:
                    failures.append(report)
    assert not failures, f"{len(failures)} of {runs} runs mismatch:\n" + "\n\n".join(failures[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [41, 47])
def test_gpu_wrapped_columns_of_row_major_b(n, profile, backend):
    """B row-major with 16-byte padded rows and N not a multiple of 8 (addmm's example problem): every kept candidate
    that wraps its column offsets (tiled, split-K) runs and matches the oracle (a claim of contiguity across the wrap
    faulted on sm_90 with a misaligned address, losing the device context)."""
    problem = {"M": 33, "N": n, "K": 29, "trans_a": 0, "trans_b": 0, "aligned": 1}
    judge = _Judge(mm.MATMUL, problem, ("float16", "float16"), profile, backend.device)
    kept = [c for c in mm.MATMUL.pruned_for(problem, profile).kept if c["KIND"] in ("tiled", "split_k")]
    assert kept
    failures = [r for r in (judge.check(c) for c in kept) if r]
    assert not failures, f"{len(failures)} of {len(kept)} mismatch:\n" + "\n\n".join(failures[:3])


@pytest.mark.gpu
def test_gpu_group_m_and_split_k_bits(profile, backend):
    """On the GPU: GROUP_M and C_TMA change no output bit; split-K gives the same bits run after run."""
    problem = {"M": 512, "N": 5632, "K": 2048, "trans_a": 0, "trans_b": 0, "aligned": 1}
    kept = mm.MATMUL.pruned_for(problem, profile).kept
    for base in _representatives(mm.MATMUL, kept):
        ref = _output_bits(mm.MATMUL, base, problem, ("float16", "float16"), 1, backend.device)
        for group_m in (1, 4):
            got = _output_bits(
                mm.MATMUL, _with(base, GROUP_M=group_m), problem, ("float16", "float16"), 1, backend.device
            )
            assert np.array_equal(got, ref), f"GROUP_M={group_m} changed bits of {base.label()}"
    for config in mm.tma_store_configs():  # C_TMA's store: the bits of its pointer-store twin
        got = _output_bits(mm.MATMUL, config, problem, ("float16", "float16"), 1, backend.device)
        twin = _output_bits(mm.MATMUL, _with(config, C_TMA=None), problem, ("float16", "float16"), 1, backend.device)
        assert np.array_equal(got, twin), f"C_TMA changed bits of {config.label()}"
    split = [c for c in kept if c["KIND"] == "split_k"]
    for config in split[:3]:
        first = _output_bits(mm.MATMUL, config, problem, ("float32", "float32"), 2, backend.device)
        again = _output_bits(mm.MATMUL, config, problem, ("float32", "float32"), 2, backend.device)
        assert np.array_equal(first, again), f"split-K {config.label()} is not deterministic"
