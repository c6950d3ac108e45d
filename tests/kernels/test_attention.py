"""Tests of the attention family (kernels/attention.py): flash_attention, decode_attention, paged_decode_attention.

Under the interpreter (CI): every candidate the prune keeps for cpu/interpreter runs once on a small awkward problem
(grouped-query heads, lengths no tile divides, a prefill continuing a cache, an empty decode sequence, shuffled pages)
and matches the float64 oracle; representative candidates run the full matrix (head dims 64/80/96/128/256, causal and
not, GQA ratios 1/4/8, lengths 1/17/100, float16 and bfloat16); the no-bit claim (num_stages) and decode's
reproducibility are checked bit for bit; fully masked rows are exactly zero; the user-facing functions (strided
layouts, scale, out) and their refusals (a block id out of range, a length past the cache) are tested, as is the
prune's refusal of tiles the device cannot hold. Cross-compilation for sm_90 and sm_80 on the CPU (a subprocess in
the cross-compiling backend, nothing launched) checks candidates compile for Hopper (wgmma) and that the shared-memory
estimate bounds the compiler's own figure.

GPU tests (`gpu`): every candidate kept for the GPU's profile at real shapes (B1 H32 S2048 D128 causal; decode B32
H32 KV-heads 8 D128 kv_len 4096, contiguous and paged), judged against an oracle computed once per shape.
"""

from __future__ import annotations

import crosstools
import numpy as np
import pytest
import triton.language as tl
from sampletools import SUBSETS, chosen, field

from nbxcert.errors import LaunchError, PruneEmpty, ShapeMismatch
from nbxcert.kernels import attention as A
from nbxcert.kernels.check import all_ok, first_report, run_checked
from nbxcert.kernels.compare import compare, poison
from nbxcert.kernels.dtypes import rounding_bound, to_bfloat16_bits
from nbxcert.kernels.jit import jit
from nbxcert.kernels.spec import Config
from nbxcert.kernels.tensor import empty, from_numpy
from nbxcert.oracles import attention as oracle
from nbxcert.profiles import get_profile

SPECS = {s.name: s for s in (A.FLASH_ATTENTION, A.DECODE_ATTENTION, A.PAGED_DECODE_ATTENTION)}

# One small problem per spec on which every kept candidate runs: GQA 4, head dim 80 (a padded tile), lengths no tile
# divides; the prefill continues a cache (q_len < kv_len, causal); the decode batch holds an empty sequence.
AWKWARD = {
    "flash_attention": A.prefill_problem(1, 4, 1, 17, 23, 80, causal=1, aligned=1),
    "decode_attention": {"batch": 3, "heads": 4, "kv_heads": 1, "kv_len": 37, "head_dim": 80},
    "paged_decode_attention": {"batch": 3, "heads": 4, "kv_heads": 1, "kv_len": 37, "head_dim": 96, "block_size": 16},
}
HEAD_DIMS = (64, 80, 96, 128, 256)
# the flash and decode matrices: every head dim under -m slow; the regular run takes a power of two, one that is not
# (its tile padded), and the largest
MATRIX_DIMS = [d if d in (64, 80, 256) else pytest.param(d, marks=pytest.mark.slow) for d in HEAD_DIMS]


def _interpreter_only(backend):
    if backend.name != "interpreter":
        pytest.skip("interpreter-sized test; the GPU runs the gpu-marked tests at real shapes")


def _stage_key(config: Config):
    """What a config is once num_stages (claimed to change no bit) is set aside."""
    return (config.kwargs, config.num_warps)


def _representatives(spec, kept):
    """The default, then one candidate per tile shape (flash: BLOCK_M x BLOCK_N x TMA; decode: NUM_SPLITS x
    BLOCK_N)."""
    fields = ("BLOCK_M", "BLOCK_N", "TMA") if spec is A.FLASH_ATTENTION else ("NUM_SPLITS", "BLOCK_N")
    reps = [spec.default] if spec.default in kept else []
    for c in kept:
        if tuple(c[f] for f in fields) not in {tuple(r[f] for f in fields) for r in reps}:
            reps.append(c)
    return reps


def _failures_message(failures, runs):
    return f"{len(failures)} of {runs} runs mismatch:\n" + "\n\n".join(failures[:3])


# --- every kept candidate, once; the no-bit claim on the way ----------------------------------------------------------
# (the regular run: every member of a sample of the num_stages groups that takes every tile field's every value,
# every warp count and both dtypes)
TILE_FIELDS = {
    "flash_attention": ("BLOCK_M", "BLOCK_N", "TMA"),
    "decode_attention": ("NUM_SPLITS", "BLOCK_N"),
    "paged_decode_attention": ("NUM_SPLITS", "BLOCK_N"),
}


@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", list(SPECS))
def test_every_kept_candidate_matches_oracle(name, subset, profile, backend):
    """Each kept candidate once (the dtypes in turn, by group); candidates that differ only in num_stages run the
    same inputs, and their output bits must agree (the spec's no_bit_fields claim)."""
    _interpreter_only(backend)
    spec = SPECS[name]
    assert spec.no_bit_fields == ("num_stages",)
    problem = AWKWARD[name]
    kept = spec.pruned_for(problem, profile).kept
    assert len(kept) == len(spec.candidates)  # the interpreter states no limit
    groups = sorted({_stage_key(c) for c in kept}, key=str)
    # a group stands for itself by its first member (num_stages aside, they are one config)
    firsts = [next(c for c in kept if _stage_key(c) == g) for g in groups]
    kinds = [field(f) for f in TILE_FIELDS[name]]
    picked = chosen(firsts, subset, f"attention every kept {name}", kinds=kinds, turns=[len(spec.dtypes)])
    judged = [c for c in kept if groups.index(_stage_key(c)) in picked]
    assert len(judged) > len(picked), "no group of two or more: the num_stages claim would go unchecked"
    failures, bits = [], {}
    for config in judged:
        g = groups.index(_stage_key(config))
        dtypes = spec.dtypes[g % len(spec.dtypes)]
        inputs = spec.make_inputs(problem, dtypes, g, "cpu")
        verdicts = run_checked(spec, config, problem, dtypes, profile, seed=g, device="cpu", inputs=inputs)
        if not all_ok(verdicts):
            failures.append(first_report(verdicts))
        got = inputs.tensors["out"].numpy().copy()
        first = bits.setdefault(_stage_key(config), (config, got))
        assert np.array_equal(first[1].view(np.uint16), got.view(np.uint16)), (
            f"{name}: {config.label()} and {first[0].label()} differ only in num_stages but not in output bits"
        )
    assert not failures, _failures_message(failures, len(judged))


# --- the full matrix on representatives -------------------------------------------------------------------------------
# (GQA ratio, q_len, kv_len): equal lengths 1, 17, 100; a prefill continuing a cache; more queries than keys (causal:
# the first q_len - kv_len rows see nothing and are zero).
FLASH_LENGTHS = ((1, 1, 1), (4, 17, 17), (8, 100, 100), (4, 17, 40), (1, 40, 17))


def _flash_problem(d, causal, ratio, q_len, kv_len, aligned):
    heads = {1: 2, 4: 4, 8: 8}[ratio]
    return A.prefill_problem(2 if ratio == 1 else 1, heads, heads // ratio, q_len, kv_len, d, causal, aligned)


@pytest.mark.parametrize("d", MATRIX_DIMS)
def test_flash_matrix(d, profile, backend):
    """Every head dim x causal or not x the length/GQA cases, float16 and bfloat16 in turn, on three candidates in
    turn (pointer loads with 64 x 64 and 128 x 32 tiles, TMA with 128 x 64); one case in four is not TMA-legal (a
    base one element off 16 bytes), and a TMA candidate's turn then goes to the default."""
    _interpreter_only(backend)
    spec = A.FLASH_ATTENTION
    configs = [spec.default, A.flash_config(128, 32, 4, 2), A.flash_config(128, 64, 8, 3, tma=1)]
    failures, runs = [], 0
    for causal in (0, 1):
        for i, case in enumerate(FLASH_LENGTHS):
            aligned = int((i + causal) % 4 != 3)
            problem = _flash_problem(d, causal, *case, aligned)
            dtypes = spec.dtypes[(i + causal) % 2]
            config = configs[(i + causal + d // 16) % 3]
            if config not in spec.pruned_for(problem, profile).kept:
                assert not aligned and config["TMA"]
                config = spec.default
            runs += 1
            verdicts = run_checked(spec, config, problem, dtypes, profile, seed=i, device="cpu")
            if not all_ok(verdicts):
                failures.append(first_report(verdicts))
    assert not failures, _failures_message(failures, runs)


DECODE_LENGTHS = (1, 17, 100, 0)  # uneven, one empty


@pytest.mark.parametrize("d", MATRIX_DIMS)
def test_decode_matrix(d, profile, backend):
    """Every head dim x GQA ratios 1/4/8, lengths 1, 17, 100 and 0 in one batch; in turn one split, several, and
    more splits than the short sequences have tiles."""
    _interpreter_only(backend)
    spec = A.DECODE_ATTENTION
    configs = [spec.default, A.decode_config(1, 64, 4, 2), A.decode_config(16, 32, 4, 2)]
    failures, runs = [], 0
    for i, (heads, kv_heads) in enumerate(((2, 2), (4, 1), (8, 1))):
        problem = {"batch": 4, "heads": heads, "kv_heads": kv_heads, "kv_len": 100, "head_dim": d}
        dtypes = spec.dtypes[(i + d // 16) % 2]
        inputs = A.decode_inputs(problem, dtypes, i, "cpu", lengths=DECODE_LENGTHS)
        config = configs[(i + d // 16) % 3]
        runs += 1
        verdicts = run_checked(spec, config, problem, dtypes, profile, seed=i, device="cpu", inputs=inputs)
        if not all_ok(verdicts):
            failures.append(first_report(verdicts))
        assert not np.any(inputs.tensors["out"].float64()[3]), "the empty sequence's output is not zero"
    assert not failures, _failures_message(failures, runs)


@pytest.mark.parametrize("block_size", (16, 32))
def test_paged_matrix(block_size, profile, backend):
    """Block sizes 16 and 32, every head dim, GQA 1/4/8 and two candidates in turn, shuffled pages, lengths 1, 17,
    100 and 0."""
    _interpreter_only(backend)
    spec = A.PAGED_DECODE_ATTENTION
    configs = [spec.default, A.decode_config(16, 32, 4, 2)]
    failures, runs = [], 0
    for i, d in enumerate(HEAD_DIMS):
        heads, kv_heads = ((2, 2), (4, 1), (8, 1))[i % 3]
        problem = {"batch": 4, "heads": heads, "kv_heads": kv_heads, "kv_len": 100, "head_dim": d}
        problem["block_size"] = block_size
        dtypes = spec.dtypes[i % 2]
        inputs = A.paged_inputs(problem, dtypes, i, "cpu", lengths=DECODE_LENGTHS)
        table = inputs.tensors["block_table"].numpy()
        used = table[table >= 0]
        assert len(set(used.tolist())) == used.size and not np.array_equal(np.sort(used), used)  # shuffled, distinct
        config = configs[(i + block_size // 16) % 2]
        runs += 1
        verdicts = run_checked(spec, config, problem, dtypes, profile, seed=i, device="cpu", inputs=inputs)
        if not all_ok(verdicts):
            failures.append(first_report(verdicts))
    assert not failures, _failures_message(failures, runs)


# --- defined cases: fully masked rows, empty sequences ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fully_masked_rows_are_exact_zeros(dtype, backend):
    """Causal with q_len > kv_len: rows i < q_len - kv_len see no key and are defined as zeros (bottom-right
    alignment); kv_len == 0 makes every row zero; the other rows match the oracle."""
    _interpreter_only(backend)
    gen = np.random.default_rng(5)
    q = from_numpy(gen.standard_normal((1, 4, 30, 64)), dtype)
    k = from_numpy(gen.standard_normal((1, 2, 12, 64)), dtype)
    v = from_numpy(gen.standard_normal((1, 2, 12, 64)), dtype)
    out = A.flash_attention(q, k, v, causal=True)
    got = out.float64()
    assert np.all(got[:, :, :18] == 0.0)
    assert np.all(np.any(got[:, :, 18:] != 0.0, axis=-1))
    ref, err = oracle.attention(q.float64(), k.float64(), v.float64(), 1 / 8, True)
    assert compare(got, ref, err, out.dtype, get_profile("cpu/interpreter").tolerance(dtype)).ok
    empty_kv = empty((1, 2, 0, 64), dtype)
    out = A.flash_attention(q, empty_kv, empty_kv)
    assert np.all(out.float64() == 0.0)


def test_decode_of_empty_sequences_is_zero(backend):
    _interpreter_only(backend)
    problem = {"batch": 2, "heads": 4, "kv_heads": 1, "kv_len": 20, "head_dim": 64}
    for config in (A.decode_config(1, 32, 4, 2), A.decode_config(4, 32, 4, 2)):
        inputs = A.decode_inputs(problem, ("float16",), 0, "cpu", lengths=(0, 0))
        A.DECODE_ATTENTION.launch(config, inputs)
        assert np.all(inputs.tensors["out"].float64() == 0.0), config.label()


# --- reproducibility, the interpreter's bfloat16 rounding -------------------------------------------------------------
def test_decode_is_reproducible(profile, backend):
    """The split results are merged in a fixed order: the same launch twice gives the same bits."""
    _interpreter_only(backend)
    for spec in (A.DECODE_ATTENTION, A.PAGED_DECODE_ATTENTION):
        problem = AWKWARD[spec.name]
        inputs = spec.make_inputs(problem, ("bfloat16",), 3, "cpu")
        config = A.decode_config(8, 32, 4, 2)
        spec.launch(config, inputs)
        first = inputs.tensors["out"].numpy().copy()
        poison(inputs.tensors["out"], inputs.tensors["out"].dtype)
        spec.launch(config, inputs)
        assert np.array_equal(first, inputs.tensors["out"].numpy())


@jit
def _narrow_probe(x_ptr, out_ptr, N: tl.constexpr, UPCAST: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, A._narrow(tl.load(x_ptr + offs), tl.bfloat16, UPCAST))


def test_bfloat16_narrowing_rounds_to_nearest_even(backend):
    """Bug: the interpreter's float32 -> bfloat16 cast truncates, so P and the output lost up to a whole ulp and
    flash_attention's example problem 3 failed in bfloat16 (max scaled error 1.12). `_narrow` rounds to nearest even."""
    _interpreter_only(backend)
    gen = np.random.default_rng(0)
    x = (gen.standard_normal(1024) * np.exp2(gen.integers(-30, 30, 1024))).astype(np.float32)
    x[:4] = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 3 * 2**-8)]  # ties to even (down, up), above a tie
    src, out = from_numpy(x, "float32"), empty((1024,), "bfloat16")
    _narrow_probe[(1,)](src, out, N=1024, UPCAST=True)
    assert np.array_equal(out.numpy(), to_bfloat16_bits(x))
    problem = A.FLASH_ATTENTION.example_problems[2]
    verdicts = run_checked(
        A.FLASH_ATTENTION, A.FLASH_DEFAULT, problem, ("bfloat16",), get_profile("cpu/interpreter"), 0, "cpu"
    )
    assert all_ok(verdicts), first_report(verdicts)


def test_oracle_check_catches_a_wrong_output(profile, backend):
    """The comparison can fail: an output nudged by three tolerances at one element is reported."""
    _interpreter_only(backend)
    spec = A.FLASH_ATTENTION
    problem = AWKWARD[spec.name]
    inputs = spec.make_inputs(problem, ("float16",), 0, "cpu")
    ref = spec.oracle(inputs)["out"]
    spec.launch(spec.default, inputs)
    got = inputs.tensors["out"].float64()
    tol = profile.tolerance("float16")
    assert compare(got, ref.value, ref.scale, inputs.tensors["out"].dtype, tol).ok
    bad = got.copy()
    idx = (0, 1, 16, 5)
    bad[idx] += 3 * (tol * ref.scale[idx] + rounding_bound(ref.value[idx], inputs.tensors["out"].dtype))
    verdict = compare(bad, ref.value, ref.scale, inputs.tensors["out"].dtype, tol, "nudged")
    assert not verdict.ok and "Mismatched elements: 1 / " in verdict.report and "(0, 1, 16, 5)" in verdict.report


# --- user-facing functions --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_flash_attention_on_strided_views(dtype, backend):
    """q, k, v as [batch, seq, heads, dim] storage viewed as [batch, heads, seq, dim] (any strides), a given scale,
    a given output; and problem_of reads the problem back."""
    _interpreter_only(backend)
    gen = np.random.default_rng(7)
    q = from_numpy(gen.standard_normal((2, 19, 4, 96)), dtype).permute(0, 2, 1, 3)
    k = from_numpy(gen.standard_normal((2, 33, 2, 96)), dtype).permute(0, 2, 1, 3)
    v = from_numpy(gen.standard_normal((2, 33, 2, 96)), dtype).permute(0, 2, 1, 3)
    ref, err = oracle.attention(q.float64(), k.float64(), v.float64(), 0.3, True)
    tol = get_profile("cpu/interpreter").tolerance(dtype)
    for config in (None, A.flash_config(64, 32, 4, 2, tma=1)):  # pointer loads (the default), TMA descriptors
        out = empty((2, 4, 19, 96), dtype)
        assert A.flash_attention(q, k, v, out, causal=True, scale=0.3, config=config) is out
        verdict = compare(out.float64(), ref, err, out.dtype, tol)
        assert verdict.ok, verdict.report
    assert A.FLASH_ATTENTION.problem_of(q, k, v, causal=True) == A.prefill_problem(2, 4, 2, 19, 33, 96, 1, aligned=1)
    shifted = from_numpy(np.ones(2 * 4 * 19 * 96 + 1), dtype)[1:].view(2, 4, 19, 96)
    assert A.FLASH_ATTENTION.problem_of(shifted, k, v)["aligned"] == 0
    with pytest.raises(LaunchError, match="q .* cannot be read by TMA"):
        A.flash_attention(shifted, k, v, config=A.flash_config(64, 32, 4, 2, tma=1))


def test_decode_functions_match_oracle(backend):
    """decode_attention and paged_decode_attention as a caller uses them (workspace allocated per call), and the
    problems they key on."""
    _interpreter_only(backend)
    tol = get_profile("cpu/interpreter").tolerance("float16")
    problem = {"batch": 3, "heads": 8, "kv_heads": 2, "kv_len": 45, "head_dim": 128}
    t = A.decode_inputs(problem, ("float16",), 1, "cpu").tensors
    out = A.decode_attention(t["q"], t["k_cache"], t["v_cache"], t["lengths"])
    ref, err = oracle.decode_attention(
        t["q"].float64(), t["k_cache"].float64(), t["v_cache"].float64(), t["lengths"].numpy(), 1 / np.sqrt(128)
    )
    assert compare(out.float64(), ref, err, out.dtype, tol).ok
    assert A.DECODE_ATTENTION.problem_of(t["q"], t["k_cache"], t["v_cache"], t["lengths"]) == problem
    workspace = A.decode_workspace(3, 8, 128)
    for config in (A.decode_config(16, 32, 4, 2), A.decode_config(2, 64, 4, 2)):  # one workspace fits every config
        again = A.decode_attention(t["q"], t["k_cache"], t["v_cache"], t["lengths"], config=config, workspace=workspace)
        assert compare(again.float64(), ref, err, again.dtype, tol).ok
    with pytest.raises(ShapeMismatch, match=f"at least {A.decode_workspace_elements(3, 8, 128)} elements"):
        A.decode_attention(t["q"], t["k_cache"], t["v_cache"], t["lengths"], workspace=workspace[:100])
    paged = dict(problem, block_size=32)
    t = A.paged_inputs(paged, ("float16",), 2, "cpu").tensors
    out = A.paged_decode_attention(t["q"], t["k_pool"], t["v_pool"], t["block_table"], t["lengths"], scale=0.2)
    ref, err = oracle.paged_decode_attention(
        t["q"].float64(),
        t["k_pool"].float64(),
        t["v_pool"].float64(),
        t["block_table"].numpy(),
        t["lengths"].numpy(),
        0.2,
    )
    assert compare(out.float64(), ref, err, out.dtype, tol).ok
    args = (t["q"], t["k_pool"], t["v_pool"], t["block_table"], t["lengths"])
    assert A.PAGED_DECODE_ATTENTION.problem_of(*args) == paged


def test_refusals_by_name(backend):
    _interpreter_only(backend)
    problem = {"batch": 2, "heads": 4, "kv_heads": 1, "kv_len": 40, "head_dim": 64, "block_size": 16}
    t = A.paged_inputs(problem, ("float16",), 0, "cpu", lengths=(40, 17)).tensors
    num_blocks = t["k_pool"].shape[0]
    table = t["block_table"].numpy()
    args = lambda tab, lengths=t["lengths"]: (t["q"], t["k_pool"], t["v_pool"], tab, lengths)  # noqa: E731
    for bad_id in (num_blocks, num_blocks + 100, -1):
        bad = table.copy()
        bad[1, 1] = bad_id  # sequence 1 (length 17) uses its first two blocks
        with pytest.raises(
            LaunchError,
            match=rf"block id {bad_id} \(block_table\[1, 1\]\) is out of range for a pool "
            rf"of {num_blocks} blocks",
        ):
            A.paged_decode_attention(*args(from_numpy(bad, "int32")))
    unused = table.copy()
    unused[1, 2] = 10**6  # past sequence 1's last block: never read, not refused
    A.paged_decode_attention(*args(from_numpy(unused, "int32")))
    narrow = from_numpy(table[:, :2].copy(), "int32")
    with pytest.raises(LaunchError, match="sequence 0 of length 40 needs 3 blocks of 16, the block table has 2"):
        A.paged_decode_attention(*args(narrow))
    with pytest.raises(ShapeMismatch, match="block_table must be int32"):
        A.paged_decode_attention(*args(from_numpy(table.astype(np.int64), "int64")))

    dec = A.decode_inputs({"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 20, "head_dim": 64}, ("float16",), 0, "cpu")
    d = dec.tensors
    capacity = d["k_cache"].shape[2]
    with pytest.raises(LaunchError, match=rf"sequence 1 has length {capacity + 1}, outside \[0, {capacity}\]"):
        A.decode_attention(d["q"], d["k_cache"], d["v_cache"], from_numpy(np.array([3, capacity + 1], np.int32)))
    with pytest.raises(LaunchError, match="sequence 0 has length -2"):
        A.decode_attention(d["q"], d["k_cache"], d["v_cache"], from_numpy(np.array([-2, 3], np.int32)))
    with pytest.raises(LaunchError, match="softmax scale must be finite and positive"):
        A.decode_attention(d["q"], d["k_cache"], d["v_cache"], d["lengths"], scale=-1.0)
    q = from_numpy(np.ones((1, 3, 5, 64)), "float16")
    kv = from_numpy(np.ones((1, 2, 5, 64)), "float16")
    with pytest.raises(ShapeMismatch, match="3 query heads are not a multiple of 2 KV heads"):
        A.flash_attention(q, kv, kv)
    with pytest.raises(ShapeMismatch, match="float16 or bfloat16 is required"):
        A.flash_attention(*(from_numpy(np.ones((1, 2, 5, 64)), "float32") for _ in range(3)))
    half, brain = from_numpy(np.ones((1, 2, 5, 64)), "float16"), from_numpy(np.ones((1, 2, 5, 64)), "bfloat16")
    with pytest.raises(ShapeMismatch, match="k is bfloat16 but q is float16"):
        A.flash_attention(half, brain, brain)


def test_decode_with_max_len_reads_nothing_back_and_the_kernel_checks(backend, monkeypatch):
    """With `max_len` the launch key takes it and nothing is read to the host; the results are the host-checked
    path's; a length past max_len or a bad block id is refused by the kernel (`LaunchError`, here at the launch: the
    interpreter), its sequence or positions left out, the others right."""
    _interpreter_only(backend)
    from nbxcert.kernels import tensor

    problem = {"batch": 3, "heads": 8, "kv_heads": 2, "kv_len": 45, "head_dim": 64}
    t = A.decode_inputs(problem, ("float16",), 4, "cpu").tensors
    q, k, v, lengths = t["q"], t["k_cache"], t["v_cache"], t["lengths"]
    config = A.decode_config(2, 16, 4, 2)
    want = A.decode_attention(q, k, v, lengths, config=config).numpy()
    assert A.DECODE_ATTENTION.problem_of(q, k, v, lengths, max_len=48) == dict(problem, kv_len=48)
    read = []
    with monkeypatch.context() as m:
        m.setattr(tensor.Tensor, "numpy", lambda self: read.append(self.shape))  # a host read would be recorded
        got = A.decode_attention(q, k, v, lengths, config=config, max_len=45)
    assert read == []
    assert np.array_equal(got.numpy().view(np.uint16), want.view(np.uint16))
    host = lengths.numpy()
    short = int(host.max()) - 1
    long = int(np.argmax(host))
    with pytest.raises(
        LaunchError,
        match=rf"decode attention: length {host[long]} at index {long} is outside "
        rf"\[0, {short}\]",
    ):
        A.decode_attention(q, k, v, lengths, out=got, config=config, max_len=short)
    others = [b for b in range(3) if b != long]
    assert np.array_equal(got.numpy()[others].view(np.uint16), want[others].view(np.uint16))
    assert not got.numpy()[long].any(), "the refused sequence attends to nothing"
    with pytest.raises(LaunchError, match=rf"max_len {k.shape[2] + 1} exceeds what the cache holds"):
        A.decode_attention(q, k, v, lengths, max_len=k.shape[2] + 1)
    for bad in (-1, True, 45.0):
        with pytest.raises(LaunchError, match=rf"max_len must be a non-negative int, got {bad!r}"):
            A.decode_attention(q, k, v, lengths, max_len=bad)

    paged = {"batch": 2, "heads": 4, "kv_heads": 1, "kv_len": 40, "head_dim": 64, "block_size": 16}
    p = A.paged_inputs(paged, ("float16",), 0, "cpu", lengths=(40, 17)).tensors
    table = p["block_table"].numpy()
    pconfig = A.decode_config(1, 16, 4, 2)
    args = lambda tab: (p["q"], p["k_pool"], p["v_pool"], from_numpy(tab, "int32"), p["lengths"])  # noqa: E731
    want = A.paged_decode_attention(*args(table), config=pconfig).numpy()
    pout = empty(p["q"].shape, "float16", "cpu")
    bad = table.copy()
    bad[1, 1] = 10**6  # sequence 1 (length 17) reads its second block for position 16
    pool, entry = p["k_pool"].shape[0], table.shape[1] + 1  # the entry [1, 1], in elements from the table's start
    with pytest.raises(
        LaunchError,
        match=rf"paged decode attention: block id 1000000 at index {entry} is outside "
        rf"the pool of {pool} blocks",
    ):
        A.paged_decode_attention(*args(bad), out=pout, config=pconfig, max_len=40)
    assert np.array_equal(pout.numpy()[0].view(np.uint16), want[0].view(np.uint16))
    again = A.paged_decode_attention(*args(table), config=pconfig, max_len=40)  # reported once, then right
    assert np.array_equal(again.numpy().view(np.uint16), want.view(np.uint16))


# --- prune, key, spec -------------------------------------------------------------------------------------------------
def test_prune_refuses_by_the_device_fact():
    """Head dim 256 on Hopper: tiles over 232448 B of shared memory and accumulators over 255 registers per thread
    are refused, each with the fact; small tiles stay. On a 99 KB part only the smallest tiles survive; head dim 512
    leaves nothing there, refused by name (PruneEmpty)."""
    hopper = get_profile("nvidia/hopper")
    problem = A.prefill_problem(1, 8, 8, 1024, 1024, 256, causal=1, aligned=1)
    result = A.FLASH_ATTENTION.pruned_for(problem, hopper)
    reasons = dict(result.pruned)
    big = A.flash_config(128, 128, 8, 3)
    assert reasons[big] == "needs 458752 B of shared memory > max_shared_memory_per_block_optin=232448"
    acc = A.flash_config(128, 32, 4, 1)
    assert "needs 256 registers per thread with num_warps=4 > max_registers_per_thread=255" in reasons[acc]
    assert A.flash_config(64, 64, 4, 2) in result.kept
    for config in result.kept:
        assert A.flash_shared_bytes(config, 256) <= hopper.fact("max_shared_memory_per_block_optin")
    d128 = dict(problem, head_dim=128)
    assert A.flash_config(128, 128, 8, 3) in A.FLASH_ATTENTION.pruned_for(d128, hopper).kept  # 229376 B fits
    small = get_profile("nvidia/ada")
    cap = small.fact("max_shared_memory_per_block_optin")
    assert cap < 110_000
    ada = A.FLASH_ATTENTION.pruned_for(problem, small)
    assert ada.kept and all(A.flash_shared_bytes(c, 256) <= cap and not c["TMA"] for c in ada.kept)
    assert (
        dict(ada.pruned)[A.flash_config(64, 32, 4, 2, tma=1)]
        == "TMA needs compute capability >= 9.0; nvidia/ada states (8, 9)"
    )
    unaligned = A.FLASH_ATTENTION.pruned_for(dict(d128, aligned=0), hopper)
    assert not any(c["TMA"] for c in unaligned.kept)
    assert any(c["TMA"] for c in A.FLASH_ATTENTION.pruned_for(d128, hopper).kept)
    with pytest.raises(PruneEmpty, match="max_shared_memory_per_block_optin"):
        A.FLASH_ATTENTION.pruned_for(dict(problem, head_dim=512), small)
    decode = {"batch": 8, "heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 256}
    dres = A.DECODE_ATTENTION.pruned_for(decode, small)
    assert dres.kept and all(A.decode_shared_bytes(c, 256, 4) <= cap for c in dres.kept)
    assert any("max_shared_memory_per_block_optin" in r for _, r in dres.pruned)


def test_prune_on_every_shipped_profile():
    """Each device file prunes without a missing fact, keeps the default-like pointer tiles for head dim 128, and keeps
    TMA tiles only where the file states compute capability >= 9.0 (or on the interpreter)."""
    from nbxcert.profiles import all_profiles

    problem = A.prefill_problem(2, 32, 8, 2048, 2048, 128, causal=1, aligned=1)
    decode = {"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128}
    for prof in all_profiles():
        kept = A.FLASH_ATTENTION.pruned_for(problem, prof).kept
        assert A.flash_config(64, 32, 4, 1) in kept, prof.key
        has_tma = prof.backend == "interpreter" or (prof.backend == "cuda" and prof.compute_capability >= (9, 0))
        assert any(c["TMA"] for c in kept) == has_tma, prof.key
        assert A.DECODE_ATTENTION.pruned_for(decode, prof).kept, prof.key


def test_shared_memory_estimates():
    assert A.flash_shared_bytes(A.flash_config(128, 64, 8, 3), 128) == 2 * (128 * 128 + 3 * 2 * 64 * 128)
    assert A.flash_shared_bytes(A.flash_config(64, 32, 4, 1), 80) == 2 * (64 * 128 + 2 * 32 * 128)
    assert A.flash_shared_bytes(A.flash_config(64, 32, 4, 2, tma=1), 64) == 2 * (64 * 64 + 2 * 2 * 32 * 64) + 1024
    assert A.decode_shared_bytes(A.decode_config(4, 64, 4, 3), 96, 8) == 2 * (16 * 128 + 16 * 64 + 2 * 2 * 64 * 128)
    assert A.block_d(80) == A.block_d(96) == 128 and A.block_d(64) == 64 and A.block_h(4) == 16


def test_specs_candidates_and_keys():
    assert len(A.FLASH_ATTENTION.candidates) == 50 + 24 and A.FLASH_ATTENTION.default == A.flash_config(64, 64, 4, 2)
    assert sum(c["TMA"] for c in A.FLASH_ATTENTION.candidates) == len(A.flash_tma_configs()) == 24
    assert len(A.DECODE_ATTENTION.candidates) == 60 and A.DECODE_ATTENTION.default == A.decode_config(4, 64, 4, 2)
    assert A.PAGED_DECODE_ATTENTION.candidates == A.DECODE_ATTENTION.candidates
    ladders = {f.name: f.ladder for f in A.FLASH_ATTENTION.key_fields}
    assert ladders == {
        "batch": "batch",
        "heads": None,
        "kv_heads": None,
        "q_len": "tokens",
        "kv_len": "kv_len",
        "head_dim": None,
        "causal": None,
        "aligned": None,
    }
    paged = {f.name: f.ladder for f in A.PAGED_DECODE_ATTENTION.key_fields}
    assert paged["block_size"] is None and paged["kv_len"] == "kv_len" and paged["batch"] == "batch"
    interp = get_profile("cpu/interpreter")
    for spec in SPECS.values():
        for ladder in {f.ladder for f in spec.key_fields if f.ladder}:
            assert interp.ladder(ladder)


# --- cross-compilation on the CPU -------------------------------------------------------------------------------------
# In a subprocess in the cross-compiling backend (`crosstools`): each spec's own launch compiles for the target, through
# Triton's binder with exactly the arguments a launch passes, and nothing is launched.
def _estimate(arch: int, r: dict) -> int:
    config, problem, old = Config.from_dict(r["config"]), r["problem"], arch < 80
    if r["spec"] == A.FLASH_ATTENTION.name:
        return A.flash_shared_bytes(config, problem["head_dim"], old)
    group, paged = problem["heads"] // problem["kv_heads"], "block_size" in problem
    return A.decode_shared_bytes(config, problem["head_dim"], group, old, paged)


def _cross_compile(arch: int, items: list[dict], timeout: int) -> list[dict]:
    results = crosstools.cross_compile(arch, crosstools.launch_specs, items, timeout)
    assert len(results) == len(items), f"{len(items) - len(results)} compile jobs printed nothing"
    failed = [r for r in results if not r["ok"]]
    assert not failed, "\n".join(f"{r['spec']} {r['config']}: {r['error']}" for r in failed[:5])
    for r in results:  # the launch's first kernel is the one its estimate is for
        main = r["kernels"][0]
        r.update(
            shared=main["shared"],
            estimate=_estimate(arch, r),
            wgmma=main["wgmma"],
            tma=main["tma"],
            kernels=len(r["kernels"]),
        )
    over = [r for r in results if r["shared"] > r["estimate"]]
    assert not over, "estimate below the compiler's figure:\n" + "\n".join(
        f"{r['spec']} {Config.from_dict(r['config']).label()} {r['problem']}: shared {r['shared']} > "
        f"estimate {r['estimate']}"
        for r in over
    )
    return results


def _item(spec, config, problem, dtype="float16"):
    return {"spec": spec.name, "config": config.as_dict(), "problem": problem, "dtypes": [dtype]}


@pytest.mark.parametrize("arch", (90, 80, 75))
def test_candidates_cross_compile_within_the_estimate(arch):
    """The largest kept tiles (and one of each shape) compile for sm_90 / sm_80 within the shared-memory estimate;
    the prefill's products use wgmma on Hopper. The decode kernels compile for both cache layouts. sm_75 (Turing,
    whose device file allows stage 1 only) is checked against the doubled pre-Ampere bound."""
    f = A.flash_config
    flash = [
        (f(128, 128, 8, 3), 128, 1, "float16"),
        (f(128, 64, 8, 5), 80, 0, "bfloat16"),
        (f(64, 64, 4, 2), 256, 1, "float16"),
        (f(64, 32, 4, 4), 96, 0, "float16"),
    ]
    if arch == 75:  # sm_75 compiles are slow (128 x 128 tiles: ~30 s): two tiles of the census, stage 1
        flash = [(f(128, 64, 8, 1), 64, 1, "float16"), (f(64, 32, 8, 1), 128, 0, "bfloat16")]
    if arch == 90:
        flash += [(f(128, 128, 8, 3, tma=1), 128, 1, "float16"), (f(64, 32, 4, 4, tma=1), 80, 0, "bfloat16")]
    items = [
        _item(A.FLASH_ATTENTION, c, A.prefill_problem(1, 4, 2, 70, 130, d, causal, 1), dt) for c, d, causal, dt in flash
    ]
    dec = {"batch": 2, "heads": 8, "kv_heads": 2, "kv_len": 300, "head_dim": 128}
    stages = 1 if arch == 75 else 3
    items.append(_item(A.DECODE_ATTENTION, A.decode_config(4, 32, 4, stages), dec))
    items.append(_item(A.PAGED_DECODE_ATTENTION, A.decode_config(1, 64, 8, 2), dict(dec, block_size=16), "bfloat16"))
    results = _cross_compile(arch, items, timeout=600)
    for r in results[: len(flash)]:
        assert r["wgmma"] == (arch == 90), r
        assert r["tma"] == bool(r["config"]["kwargs"]["TMA"]), r
    assert results[-2]["kernels"] == 2 and results[-1]["kernels"] == 1  # split + merge; one split writes directly


# --- GPU: every kept candidate at the real shapes ---------------------------------------------------------------------
class _Judge:
    """The oracle of one (problem, dtype) computed once, and a per-candidate check that poisons the output, launches,
    and reports like `compare` on a mismatch."""

    def __init__(self, spec, problem, dtype, profile, device):
        self.spec, self.problem, self.dtypes = spec, problem, (dtype,)
        self.inputs = spec.make_inputs(problem, self.dtypes, 0, device)
        ref = spec.oracle(self.inputs)["out"]
        self.ref, self.scale = ref.value, ref.scale
        self.out = self.inputs.tensors["out"]
        self.tol = profile.tolerance(dtype)

    def check(self, config) -> tuple[str | None, np.ndarray]:
        poison(self.out, self.out.dtype)
        self.spec.launch(config, self.inputs)
        bits = self.out.numpy().copy()
        context = f"kernel {self.spec.name}, config {config.label()}, problem {self.problem}, dtypes {self.dtypes}"
        verdict = compare(self.out.float64(), self.ref, self.scale, self.out.dtype, self.tol, context)
        return (None if verdict.ok else verdict.report), bits


GPU_CASES = {
    # name: (spec name, problem, dtype, every kept candidate (else the representatives))
    "flash B1 H32 S2048 D128 causal": (
        "flash_attention",
        A.prefill_problem(1, 32, 32, 2048, 2048, 128, causal=1, aligned=1),
        "float16",
        True,
    ),
    "flash B1 H32 KV8 S2048 D128 causal bf16": (
        "flash_attention",
        A.prefill_problem(1, 32, 8, 2048, 2048, 128, causal=1, aligned=1),
        "bfloat16",
        False,
    ),
    "flash B2 H16 KV2 q1000 kv1500 D96 causal": (
        "flash_attention",
        A.prefill_problem(2, 16, 2, 1000, 1500, 96, causal=1, aligned=1),
        "float16",
        True,
    ),
    "flash B1 H8 S1024 D256": (
        "flash_attention",
        A.prefill_problem(1, 8, 8, 1024, 1024, 256, causal=0, aligned=1),
        "float16",
        True,
    ),
    "flash B4 H32 S512 D64 bf16": (
        "flash_attention",
        A.prefill_problem(4, 32, 32, 512, 512, 64, causal=0, aligned=1),
        "bfloat16",
        False,
    ),
    "decode B32 H32 KV8 D128 4096": (
        "decode_attention",
        {"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128},
        "float16",
        True,
    ),
    "decode B32 H32 KV8 D128 4096 bf16": (
        "decode_attention",
        {"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128},
        "bfloat16",
        False,
    ),
    "paged B32 H32 KV8 D128 4096 bs16": (
        "paged_decode_attention",
        {"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128, "block_size": 16},
        "float16",
        True,
    ),
    "paged B32 H32 KV8 D128 4096 bs32 bf16": (
        "paged_decode_attention",
        {"batch": 32, "heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128, "block_size": 32},
        "bfloat16",
        False,
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_every_kept_candidate_at_real_shapes(case, profile, backend):
    """Every candidate kept for the GPU's profile (or one per tile shape, for the second dtype) matches the oracle;
    candidates that differ only in num_stages give the same bits; decode runs twice give the same bits."""
    name, problem, dtype, every = GPU_CASES[case]
    spec = SPECS[name]
    kept = spec.pruned_for(problem, profile).kept
    judge = _Judge(spec, problem, dtype, profile, backend.device)
    failures, bits = [], {}
    configs = kept if every else _representatives(spec, kept)
    for config in configs:
        report, got = judge.check(config)
        if report:
            failures.append(report)
        first = bits.setdefault(_stage_key(config), (config, got.view(np.uint16)))
        assert np.array_equal(first[1], got.view(np.uint16)), (
            f"{config.label()} and {first[0].label()} differ only in num_stages but not in output bits"
        )
    assert not failures, _failures_message(failures, len(configs))
    if spec is not A.FLASH_ATTENTION:
        again = judge.check(configs[-1])[1]
        assert np.array_equal(again.view(np.uint16), bits[_stage_key(configs[-1])][1]), "decode is not reproducible"


@pytest.mark.gpu
def test_gpu_decode_with_max_len_copies_nothing_to_the_host(backend, monkeypatch):
    """On a GPU, decode attention given `max_len` queues its launches without a device-to-host copy (no wait for the
    device), computes what the host-checked path computes, and a length past max_len is reported at the next
    synchronisation."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    from nbxcert.kernels.backends import cuda

    problem = {"batch": 3, "heads": 32, "kv_heads": 8, "kv_len": 1000, "head_dim": 128}
    t = A.decode_inputs(problem, ("float16",), 4, backend.device).tensors
    q, k, v, lengths = t["q"], t["k_cache"], t["v_cache"], t["lengths"]
    config = A.decode_config(4, 64, 4, 2)
    want = A.decode_attention(q, k, v, lengths, config=config).numpy()
    copies, real = [], cuda.memcpy_dtoh
    with monkeypatch.context() as m:
        m.setattr(cuda, "memcpy_dtoh", lambda *a: copies.append(a[2]) or real(*a))
        got = A.decode_attention(q, k, v, lengths, config=config, max_len=1000)
    assert copies == []
    assert np.array_equal(got.numpy().view(np.uint16), want.view(np.uint16))
    A.decode_attention(q, k, v, lengths, out=got, config=config, max_len=999)  # the longest is 1000
    with pytest.raises(LaunchError, match=r"decode attention: length 1000 at index \d is outside \[0, 999\]"):
        got.numpy()
    A._DECODE_PLANS.clear()
    first = A.decode_attention(q, k, v, lengths, max_len=1000)  # served: its launch plan kept
    assert any(A._DECODE_PLANS.values())
    again = A.decode_attention(q, k, v, lengths, max_len=1000)  # replayed through the compiled kernels' runners
    assert np.array_equal(first.numpy().view(np.uint16), again.numpy().view(np.uint16))
