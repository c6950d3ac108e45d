"""Tests of the mixture-of-experts family (kernels/moe.py): moe_align, fused_moe, moe_sum.

Under the interpreter (CI): every candidate the prune keeps for cpu/interpreter runs on every example problem (8 and
128 experts, top-k 1, 2 and 8, tiny hidden sizes) and matches its float64 oracle, moe_align's integers exactly; the
no-bit claims (fused_moe's GROUP_M, every moe_align field, moe_sum's BLOCK_N and warps) are checked bit for bit; the
user-facing functions, keys read back from tensors, the prunes' refusals and the check's power to fail are tested.

GPU tests (`gpu`): every candidate kept for the GPU's profile at Mixtral-8x7B's shapes (8 experts, top-2, hidden
4096, expert intermediate 14336) and moe_align at Mixtral's and Qwen3-30B-A3B's routing, one launch each, judged
against an oracle computed once per shape.
"""

from __future__ import annotations

import numpy as np
import pytest
from sampletools import SUBSETS, chosen, field

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import moe
from nbxcert.kernels.check import all_ok, first_report, run_checked
from nbxcert.kernels.compare import compare, poison
from nbxcert.kernels.dtypes import finfo, rounding_bound
from nbxcert.kernels.spec import Config
from nbxcert.kernels.tensor import from_numpy
from nbxcert.oracles import moe as oracle
from nbxcert.profiles import get_profile
from nbxcert.warm import compile_ahead

SPECS = {s.name: s for s in moe.SPECS}


def _interpreter_only(backend):
    if backend.name != "interpreter":
        pytest.skip("interpreter-sized test; the GPU runs the gpu-marked tests at real shapes")


def _with(config: Config, **changes) -> Config:
    kwargs = dict(config.kwargs)
    kwargs.update({k: v for k, v in changes.items() if k not in ("num_warps", "num_stages")})
    return Config.make(
        num_warps=changes.get("num_warps", config.num_warps),
        num_stages=changes.get("num_stages", config.num_stages),
        **kwargs,
    )


# --- every kept candidate on every example problem (a sample of every tile and dtype in the regular run) --------------
# the fields whose every value the regular run's sample takes, per family
SAMPLED_FIELDS = {
    "moe_align": ("TILE", "STEPS"),
    "fused_moe": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"),
    "moe_sum": ("BLOCK_N",),
}


@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", list(SPECS))
def test_every_kept_candidate_matches_oracle(name, subset, profile, backend):
    _interpreter_only(backend)
    spec = SPECS[name]
    kinds = [field(f) for f in SAMPLED_FIELDS[name]]
    failures, runs = [], 0
    for p_index, problem in enumerate(spec.example_problems):
        kept = spec.pruned_for(problem, profile).kept
        assert len(kept) == len(spec.candidates)  # the interpreter states no limit
        seed = f"moe every kept {name} {p_index}"
        for i in chosen(kept, subset, seed, kinds=kinds, turns=[len(spec.dtypes)]):
            config = kept[i]
            dtypes = spec.dtypes[(i + p_index) % len(spec.dtypes)]  # every candidate, the dtypes in turn
            verdicts = run_checked(spec, config, problem, dtypes, profile, seed=i + 7 * p_index, device="cpu")
            runs += 1
            if not all_ok(verdicts):
                failures.append(first_report(verdicts))
    assert not failures, f"{len(failures)} of {runs} runs mismatch:\n" + "\n\n".join(failures[:3])


@pytest.mark.parametrize("name", list(SPECS))
def test_default_on_every_example_and_dtype(name, profile, backend):
    _interpreter_only(backend)
    spec = SPECS[name]
    failures = []
    for problem in spec.example_problems:
        for dtypes in spec.dtypes:
            verdicts = run_checked(spec, spec.default, problem, dtypes, profile, seed=3, device="cpu")
            if not all_ok(verdicts):
                failures.append(first_report(verdicts))
    assert not failures, "\n\n".join(failures[:3])


def test_examples_cover_the_issue_range():
    """top-k 1, 2 and 8; 8 and 128 experts; both fused_moe stages (gate/up without weights, down with them)."""
    align = moe.MOE_ALIGN.example_problems
    fused = moe.FUSED_MOE.example_problems
    assert {p["top_k"] for p in fused} == {1, 2, 8}
    assert {p["experts"] for p in align} == {8, 128}
    assert {(p["mul_weight"], p["pair_rows"]) for p in fused} >= {(0, 0), (1, 1)}
    assert moe.FUSED_MOE.dtypes == (("float16", "float16"), ("bfloat16", "bfloat16"))


# --- the no-bit claims ------------------------------------------------------------------------------------------------
def _bits(spec, config, problem, dtypes, seed, device):
    inputs = spec.make_inputs(problem, dtypes, seed, device)
    for name in inputs.outputs:
        poison(inputs.tensors[name], inputs.tensors[name].dtype)
    spec.launch(config, inputs)
    return {name: inputs.tensors[name].numpy().copy() for name in inputs.outputs}


def _same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# many block rows (64 tokens, top-2 over 8 experts at BLOCK_M 16) and several column tiles, so GROUP_M reorders them
GROUPED = {"M": 64, "N": 96, "K": 48, "experts": 8, "top_k": 2, "mul_weight": 1, "pair_rows": 0}


def test_group_m_changes_no_bit(backend):
    _interpreter_only(backend)
    assert moe.FUSED_MOE.no_bit_fields == ("GROUP_M",)
    base = next(c for c in moe.FUSED_MOE.candidates if c["BLOCK_M"] == 16 and c["BLOCK_N"] == 32)
    reference = _bits(moe.FUSED_MOE, base, GROUPED, ("float16", "float16"), 5, "cpu")
    assert not np.isnan(reference["out"].view(np.float16)).any()
    for group_m in (2, 3, 16, 64):
        got = _bits(moe.FUSED_MOE, _with(base, GROUP_M=group_m), GROUPED, ("float16", "float16"), 5, "cpu")
        assert _same_bits(got, reference), f"GROUP_M={group_m} changed output bits of {base.label()}"


def test_align_fields_change_no_bit(backend):
    """Every moe_align config gives the same bits (the stable order is unique), also for pairs spread over many
    programs (small TILE x STEPS) or held by one."""
    _interpreter_only(backend)
    problem = {"M": 100, "top_k": 2, "experts": 8, "block": 16}
    configs = [moe.DEFAULT_ALIGN, moe._align(16, 1, 1), moe._align(32, 4, 2), moe._align(256, 16, 8)]
    reference = _bits(moe.MOE_ALIGN, configs[0], problem, ("int32",), 2, "cpu")
    for config in configs[1:]:
        assert _same_bits(_bits(moe.MOE_ALIGN, config, problem, ("int32",), 2, "cpu"), reference), config.label()


def test_sum_fields_change_no_bit(backend):
    _interpreter_only(backend)
    problem = {"M": 3, "N": 700, "top_k": 8}
    reference = _bits(moe.MOE_SUM, moe.DEFAULT_SUM, problem, ("bfloat16",), 4, "cpu")
    for config in moe.MOE_SUM.candidates:
        assert _same_bits(_bits(moe.MOE_SUM, config, problem, ("bfloat16",), 4, "cpu"), reference), config.label()


# --- the check can fail -----------------------------------------------------------------------------------------------
def test_oracle_check_catches_a_wrong_expert(profile, backend):
    """A layout that hands one block to the wrong expert (a classic off-by-one in the alignment) is refused."""
    _interpreter_only(backend)
    problem = moe.FUSED_MOE.example_problems[0]
    inputs = moe.FUSED_MOE.make_inputs(problem, ("float16", "float16"), 1, "cpu")
    ref = moe.FUSED_MOE.oracle(inputs)["out"]
    config = next(c for c in moe.FUSED_MOE.candidates if c["BLOCK_M"] == 16)
    experts = inputs.tensors["layout16_experts"]
    good = experts.numpy().copy()
    wrong = good.copy()
    wrong[0] = (good[0] + 1) % problem["experts"]
    experts.write_host(wrong)
    out = inputs.tensors["out"]
    poison(out, out.dtype)
    moe.FUSED_MOE.launch(config, inputs)
    verdict = compare(out.float64(), ref.value, ref.scale, out.dtype, profile.tolerance("float16"), "wrong expert")
    assert not verdict.ok and "Mismatched elements" in verdict.report
    experts.write_host(good)
    poison(out, out.dtype)
    moe.FUSED_MOE.launch(config, inputs)
    assert compare(out.float64(), ref.value, ref.scale, out.dtype, profile.tolerance("float16")).ok


def test_oracle_check_catches_an_unstable_order(profile, backend):
    """moe_align is certified exactly: the right pairs in another order within an expert fail."""
    _interpreter_only(backend)
    problem = {"M": 16, "top_k": 2, "experts": 8, "block": 16}
    inputs = moe.MOE_ALIGN.make_inputs(problem, ("int32",), 0, "cpu")
    moe.MOE_ALIGN.launch(moe.DEFAULT_ALIGN, inputs)
    ref = moe.MOE_ALIGN.oracle(inputs)["sorted_ids"]
    got = inputs.tensors["sorted_ids"].float64()
    assert np.array_equal(got, ref.value)
    swapped = got.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # both pairs belong to the first expert with pairs (it has 2 or more here)
    assert swapped[0] != swapped[1] and swapped[1] < problem["M"] * problem["top_k"]
    verdict = compare(swapped, ref.value, ref.scale, inputs.tensors["sorted_ids"].dtype, 0.0, "swapped pairs")
    assert not verdict.ok and verdict.n_mismatched == 2


# --- the user-facing functions ----------------------------------------------------------------------------------------
def _route(rng, m, experts, top_k):
    ids = np.argsort(rng.random((m, experts)), axis=1)[:, :top_k].astype(np.int32)
    w = rng.uniform(0.1, 1.0, (m, top_k)).astype(np.float32)
    return ids, w


def test_moe_align_function_drops_foreign_experts(backend):
    """A pair whose expert is outside [0, E) (another rank's expert under expert parallelism) is placed nowhere."""
    _interpreter_only(backend)
    ids = np.array([[3, -1], [7, 3], [8, 0], [3, 1]], dtype=np.int32)
    sorted_ids, expert_ids, num_padded = moe.moe_align(from_numpy(ids, "int32"), 8, 4)
    want_sorted, want_experts, want_padded = oracle.align(ids, 8, 4)
    assert int(num_padded.numpy()[0]) == want_padded == 16  # experts 0, 1, 3 (three pairs), 7: four blocks
    assert np.array_equal(sorted_ids.numpy(), want_sorted)
    assert np.array_equal(expert_ids.numpy(), want_experts)
    assert list(sorted_ids.numpy()[8:11]) == [0, 3, 6]  # expert 3's pairs in increasing pair order


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_user_functions_match_oracle(dtype, profile, backend):
    _interpreter_only(backend)
    rng = np.random.default_rng(8)
    m, hidden, inter, experts, top_k = 11, 64, 48, 8, 2
    ids, weights = _route(rng, m, experts, top_k)
    t_ids, t_w = from_numpy(ids, "int32"), from_numpy(weights, "float32")
    x = from_numpy(rng.standard_normal((m, hidden)), dtype)
    w1 = from_numpy(rng.standard_normal((experts, inter, hidden)), dtype)
    w2 = from_numpy(rng.standard_normal((experts, hidden, inter)), dtype)
    eps = finfo(x.dtype)["eps"]
    tol = profile.tolerance(dtype)

    up = moe.fused_moe(x, w1, t_w, t_ids, mul_weight=False)
    value, scale = oracle.fused_moe(
        x.float64(), w1.float64(), weights, ids, pair_rows=False, mul_weight=False, acc_eps=moe.ACC_EPS, out_eps=eps
    )
    assert compare(up.float64(), value, scale, up.dtype, tol, "gate/up").ok
    assert moe.FUSED_MOE.problem_of(x, w1, t_w, t_ids, mul_weight=False)["pair_rows"] == 0

    down = moe.fused_moe(up, w2, t_w, t_ids)  # one row per pair: the down projection's layout
    assert moe.FUSED_MOE.problem_of(up, w2, t_w, t_ids)["pair_rows"] == 1
    value, scale = oracle.fused_moe(
        up.float64(), w2.float64(), weights, ids, pair_rows=True, mul_weight=True, acc_eps=moe.ACC_EPS, out_eps=eps
    )
    assert compare(down.float64(), value, scale, down.dtype, tol, "down").ok

    total = moe.moe_sum(down.view(m, top_k, hidden))
    value, scale = oracle.moe_sum(down.float64().reshape(m, top_k, hidden), acc_eps=moe.ACC_EPS, out_eps=eps)
    assert compare(total.float64(), value, scale, total.dtype, tol, "moe_sum").ok


def test_every_block_size_through_the_user_function(profile, backend):
    """fused_moe aligns for its config's BLOCK_M: one candidate per block size, each through moe_align."""
    _interpreter_only(backend)
    rng = np.random.default_rng(3)
    ids, weights = _route(rng, 20, 8, 2)
    x = from_numpy(rng.standard_normal((20, 32)), "float16")
    w = from_numpy(rng.standard_normal((8, 40, 32)), "float16")
    value, scale = oracle.fused_moe(
        x.float64(),
        w.float64(),
        weights,
        ids,
        pair_rows=False,
        mul_weight=True,
        acc_eps=moe.ACC_EPS,
        out_eps=finfo(x.dtype)["eps"],
    )
    blocks = {}
    for c in moe.FUSED_MOE.candidates:
        blocks.setdefault(c["BLOCK_M"], c)
    assert sorted(blocks) == list(moe.align_blocks()) == [16, 32, 64, 128, 256]
    for config in blocks.values():
        out = moe.fused_moe(x, w, from_numpy(weights, "float32"), from_numpy(ids, "int32"), config=config)
        verdict = compare(out.float64(), value, scale, out.dtype, profile.tolerance("float16"), config.label())
        assert verdict.ok, verdict.report


def test_host_layout_agrees_with_the_oracle():
    """fused_moe's made inputs carry layouts built on the host; they are the oracle's alignment."""
    rng = np.random.default_rng(0)
    for m, experts, top_k, block in ((16, 8, 2, 16), (3, 128, 8, 64), (50, 8, 1, 256)):
        ids, _ = _route(rng, m, experts, top_k)
        got = moe._host_layout(ids, experts, block)
        want = oracle.align(ids, experts, block)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and int(got[2][0]) == want[2]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_oracle_multiplies_each_expert_on_the_device_where_products_are_the_devices(
    dtype, host_cuda, backend, monkeypatch
):
    """Where `products.device_library` gives a cuBLAS, fused_moe's oracle widens each routed expert's weight where it
    lies and multiplies there (two products an expert), only the pairs' rows crossing; the host's references
    otherwise, the same to rounding, NaN rows (pairs of no expert) included."""
    _interpreter_only(backend)
    from cublastools import FakeCublas

    from nbxcert.kernels import products

    spec = SPECS["fused_moe"]
    for seed, problem in enumerate(spec.example_problems):
        inputs = spec.make_inputs(problem, (dtype, dtype), seed, backend.device)
        monkeypatch.setattr(products, "device_library", lambda device: None)
        host = spec.oracle(inputs)["out"]
        lib = FakeCublas()
        monkeypatch.setattr(products, "device_library", lambda device, lib=lib: lib)
        device = spec.oracle(inputs)["out"]
        ids = inputs.tensors["topk_ids"].numpy()
        routed = np.unique(ids[(ids >= 0) & (ids < problem["experts"])])
        assert len(lib.calls) == 2 * routed.size, problem
        assert np.array_equal(np.isnan(device.value), np.isnan(host.value))
        np.testing.assert_allclose(device.value, host.value, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(device.scale, host.scale, rtol=1e-12, atol=1e-12)


def test_the_oracle_from_expert_products_is_the_oracle():
    """`fused_moe_of` handed numpy's products of each expert is `fused_moe`, bit for bit."""
    rng = np.random.default_rng(4)
    ids, weights = _route(rng, 9, 8, 2)
    ids[0, 1] = 8  # a pair of no expert: NaN in both
    a, w = rng.standard_normal((18, 24)), rng.standard_normal((8, 20, 24))
    terms = {"pair_rows": True, "mul_weight": True, "acc_eps": moe.ACC_EPS, "out_eps": 2.0**-10}
    asked = []

    def expert_products(e, rows):
        asked.append(e)
        return a[rows] @ w[e].T, np.abs(a[rows]) @ np.abs(w[e]).T

    got = oracle.fused_moe_of(expert_products, w.shape, weights, ids, **terms)
    want = oracle.fused_moe(a, w, weights, ids, **terms)
    assert sorted(asked) == sorted(set(ids.reshape(-1).tolist()) - {8})
    for g, x in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, x)


@pytest.mark.parametrize("name", list(SPECS))
def test_problem_of_reads_back_every_example(name, backend):
    spec = SPECS[name]
    for problem in spec.example_problems:
        inputs = spec.make_inputs(problem, spec.dtypes[0], 0, "cpu")
        t, s = inputs.tensors, inputs.scalars
        if name == "moe_align":
            got = spec.problem_of(t["topk_ids"], s["experts"], s["block"])
        elif name == "fused_moe":
            got = spec.problem_of(t["a"], t["w"], t["topk_weights"], t["topk_ids"], mul_weight=s["mul_weight"])
        else:
            got = spec.problem_of(t["x"])
        assert got == problem
        assert set(problem) == set(spec.problem_args)


def test_refusals_by_name():
    ids = from_numpy(np.zeros((4, 2)), "int32")
    weights = from_numpy(np.ones((4, 2)), "float32")
    a = from_numpy(np.ones((4, 16)), "float16")
    with pytest.raises(ShapeMismatch, match="share float16 or bfloat16"):
        moe.fused_moe(a, from_numpy(np.ones((8, 8, 16)), "bfloat16"), weights, ids)
    with pytest.raises(ShapeMismatch, match="one per token"):
        moe.fused_moe(from_numpy(np.ones((5, 16)), "float16"), from_numpy(np.ones((8, 8, 16)), "float16"), weights, ids)
    with pytest.raises(LaunchError, match="1 to 128 are supported"):
        moe.fused_moe(a, from_numpy(np.ones((129, 8, 16)), "float16"), weights, ids)
    with pytest.raises(ShapeMismatch, match="topk_weights must be float32"):
        moe.fused_moe(a, from_numpy(np.ones((8, 8, 16)), "float16"), from_numpy(np.ones((4, 2)), "float16"), ids)
    with pytest.raises(LaunchError, match="power of two"):
        moe.moe_align(ids, 8, 24)
    with pytest.raises(ShapeMismatch, match="contiguous int32"):
        moe.moe_align(from_numpy(np.zeros((4, 2)), "int64"), 8, 16)


# --- prune ------------------------------------------------------------------------------------------------------------
MIXTRAL_UP = {"M": 4096, "N": 28672, "K": 4096, "experts": 8, "top_k": 2, "mul_weight": 0, "pair_rows": 0}


def test_prune_by_device_facts():
    hopper, ampere, ada, volta = (get_profile(f"nvidia/{p}") for p in ("hopper", "ampere", "ada", "volta"))
    big = moe._moe(128, 256, 64, 8, 4, 16)  # vLLM's H200 pick for Mixtral prefill: 4 buffers of 48 KiB on sm_90
    assert moe.smem_estimate(big, hopper) == 196608 and big in moe.FUSED_MOE.pruned_for(MIXTRAL_UP, hopper).kept
    # compute capability 8.x pipelines num_stages - 1 buffers (over-pruned on sm_80 before: found by the census)
    assert moe.smem_estimate(big, ampere) == 147456 and big in moe.FUSED_MOE.pruned_for(MIXTRAL_UP, ampere).kept
    refused = dict(moe.FUSED_MOE.pruned_for(MIXTRAL_UP, ada).pruned)
    assert "max_shared_memory_per_block_optin=101376" in refused[big]
    kept_volta = moe.FUSED_MOE.pruned_for(MIXTRAL_UP, volta).kept
    assert kept_volta and all(c.num_stages == 1 for c in kept_volta)
    assert set(kept_volta) == {c for c in moe.unpipelined_configs() if moe.smem_estimate(c, volta) <= 98304}


def test_align_prune_counts_the_one_hot_tile():
    hopper = get_profile("nvidia/hopper")
    wide = {"M": 4096, "top_k": 8, "experts": 128, "block": 64}
    narrow = dict(wide, experts=8, top_k=2)
    big_tile = moe._align(256, 1, 4)  # 256 x 128 int32 one-hot values over 128 threads
    assert "registers per thread" in dict(moe.MOE_ALIGN.pruned_for(wide, hopper).pruned)[big_tile]
    assert big_tile in moe.MOE_ALIGN.pruned_for(narrow, hopper).kept
    idle = moe._align(16, 1, 8)  # 16 x 8 = 128 elements for 256 threads: whole warps idle
    assert "no element of its own" in dict(moe.MOE_ALIGN.pruned_for(narrow, hopper).pruned)[idle]
    # the scan's shared memory: 256 x 128 int32 = 131072 B fits Hopper, not Volta (a prune defect the Volta census
    # found: this config was kept there and compiled to 131072 B)
    scan = moe._align(256, 1, 8)
    assert scan in moe.MOE_ALIGN.pruned_for(wide, hopper).kept
    refused = dict(moe.MOE_ALIGN.pruned_for(wide, get_profile("nvidia/volta")).pruned)
    assert "needs 131072 B of shared memory > max_shared_memory_per_block_optin=98304" in refused[scan]


def test_candidates_include_the_default_and_vllm_tiles():
    assert moe.DEFAULT_MOE in moe.FUSED_MOE.candidates
    tiles = {(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.num_warps, c.num_stages) for c in moe.FUSED_MOE.candidates}
    # picks of vLLM's E=8,N=14336,device_name=NVIDIA_H200.json at 1, 16, 48, 128 and 1024 tokens
    assert {
        (16, 128, 128, 4, 5),
        (16, 64, 256, 4, 3),
        (32, 128, 128, 4, 3),
        (64, 128, 128, 8, 4),
        (128, 256, 64, 8, 4),
    } <= tiles


# --- GPU: every kept candidate at Mixtral's shapes --------------------------------------------------------------------
class _Judge:
    """The oracle of one (problem, dtype), computed once, and a fast check per candidate that falls back to
    `compare` (the numpy-style report) only on a mismatch."""

    def __init__(self, spec, problem, dtypes, profile, device):
        self.spec, self.problem, self.dtypes = spec, problem, dtypes
        self.inputs = spec.make_inputs(problem, dtypes, 0, device)
        self.refs = spec.oracle(self.inputs)
        self.tol = {n: profile.tolerance(self.inputs.tensors[n].dtype.name) for n in self.refs}

    def check(self, config) -> str | None:
        for name in self.inputs.outputs:
            poison(self.inputs.tensors[name], self.inputs.tensors[name].dtype)
        self.spec.launch(config, self.inputs)
        for name, ref in self.refs.items():
            t = self.inputs.tensors[name]
            got = t.float64()
            allowed = self.tol[name] * np.abs(ref.scale) + (
                rounding_bound(ref.value, t.dtype) if t.dtype.is_float else 0.0
            )
            with np.errstate(invalid="ignore"):
                good = np.isfinite(got) & (np.abs(got - ref.value) <= allowed)
            if not good.all():
                context = f"kernel {self.spec.name}, config {config.label()}, problem {self.problem}, {self.dtypes}"
                return compare(got, ref.value, ref.scale, t.dtype, self.tol[name], context).report
        return None


MIXTRAL = {"experts": 8, "top_k": 2}
GPU_PLANS = {
    "mixtral up, 16 tokens": dict(MIXTRAL, M=16, N=28672, K=4096, mul_weight=0, pair_rows=0),
    "mixtral up, 512 tokens": dict(MIXTRAL, M=512, N=28672, K=4096, mul_weight=0, pair_rows=0),
    "mixtral down, 512 tokens": dict(MIXTRAL, M=512, N=4096, K=14336, mul_weight=1, pair_rows=1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("plan", list(GPU_PLANS))
def test_gpu_fused_moe_every_kept_candidate_at_mixtral_shapes(plan, profile, backend):
    """float16: every candidate kept for the GPU's profile; bfloat16: the default and one per BLOCK_M."""
    problem = GPU_PLANS[plan]
    kept = moe.FUSED_MOE.pruned_for(problem, profile).kept
    failures, runs = [], 0
    for dtype in ("float16", "bfloat16"):
        judge = _Judge(moe.FUSED_MOE, problem, (dtype, dtype), profile, backend.device)
        configs = kept if dtype == "float16" else list({c["BLOCK_M"]: c for c in kept}.values())
        compile_ahead(moe.FUSED_MOE, problem, (dtype, dtype), configs, profile.key)
        for config in configs:
            runs += 1
            report = judge.check(config)
            if report:
                failures.append(report)
    assert not failures, f"{len(failures)} of {runs} runs mismatch:\n" + "\n\n".join(failures[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("plan", ["mixtral up, 16 tokens", "mixtral down, 512 tokens"])
def test_gpu_oracle_on_the_device_is_the_hosts(plan, monkeypatch, backend):
    """cuBLAS on each routed expert's weight widened on the GPU against numpy on the host-widened weight."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    from nbxcert.kernels import products

    spec = SPECS["fused_moe"]
    inputs = spec.make_inputs(GPU_PLANS[plan], ("bfloat16", "bfloat16"), 0, backend.device)
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "host")
    host = spec.oracle(inputs)["out"]
    monkeypatch.setenv("NBXCERT_ORACLE_PRODUCTS", "device")
    assert products.describe(backend.device).startswith("cuBLAS DGEMM on ")
    device = spec.oracle(inputs)["out"]
    assert np.array_equal(np.isnan(device.value), np.isnan(host.value))
    # two float64 sums of up to 14336 terms in different orders: apart by at most K·2^-53 of the absolute sum, which
    # is far below the error scale (the absolute sum times the float32/16 accumulation's growth)
    routed = ~np.isnan(host.value)
    assert np.all(np.abs(device.value - host.value)[routed] <= 1e-8 * host.scale[routed])
    np.testing.assert_allclose(device.scale, host.scale, rtol=1e-10, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "problem",
    [
        {"M": 4096, "top_k": 2, "experts": 8, "block": 128},  # Mixtral prefill
        {"M": 512, "top_k": 8, "experts": 128, "block": 64},  # Qwen3-30B-A3B
        {"M": 1, "top_k": 8, "experts": 128, "block": 16},  # Qwen3-30B-A3B decode: 120 experts without a pair
    ],
)
def test_gpu_moe_align_every_kept_candidate(problem, profile, backend):
    kept = moe.MOE_ALIGN.pruned_for(problem, profile).kept
    compile_ahead(moe.MOE_ALIGN, problem, ("int32",), kept, profile.key)
    judge = _Judge(moe.MOE_ALIGN, problem, ("int32",), profile, backend.device)
    failures = [r for r in (judge.check(c) for c in kept) if r]
    assert not failures, f"{len(failures)} of {len(kept)} mismatch:\n" + "\n\n".join(failures[:3])


@pytest.mark.gpu
def test_gpu_group_m_changes_no_bit(profile, backend):
    problem = GPU_PLANS["mixtral up, 512 tokens"]
    kept = moe.FUSED_MOE.pruned_for(problem, profile).kept
    for base in list({c["BLOCK_M"]: c for c in kept}.values()):
        ref = _bits(moe.FUSED_MOE, base, problem, ("float16", "float16"), 1, backend.device)
        for group_m in (1, 64):
            got = _bits(moe.FUSED_MOE, _with(base, GROUP_M=group_m), problem, ("float16", "float16"), 1, backend.device)
            assert _same_bits(got, ref), f"GROUP_M={group_m} changed bits of {base.label()}"
