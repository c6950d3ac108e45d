"""Element-wise kernels (silu_and_mul, gelu_and_mul, gelu, add_mul, cast, rope, embedding) against float64 oracles.

Under the interpreter (CI): every candidate the prune keeps runs on an awkward shape; the default runs every example
problem in every dtype; extreme values (large magnitudes, equal values); cast is checked bit for bit against the
tensor layer's host conversion (`nbxcert.kernels.dtypes.encode`) for every pair of float dtypes over random bit
patterns, ties, subnormals, overflow, infinities and NaN; rope's in-place update leaves the dimensions past rot_dim
bit-identical; embedding refuses an out-of-range id by name before launching; add/mul broadcast over strided views of
up to 4 dimensions; the no-bit claims (every config field). GPU tests rerun the kept candidates at real shapes.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import dtypes as D
from nbxcert.kernels import elementwise as ew
from nbxcert.kernels.check import all_ok, first_report, run_checked
from nbxcert.kernels.compare import compare, poison
from nbxcert.kernels.spec import Config
from nbxcert.kernels.tensor import from_numpy
from nbxcert.oracles import elementwise as oracle
from nbxcert.warm import check_configs

SPECS = {s.name: s for s in (ew.SILU_AND_MUL, ew.GELU_AND_MUL, ew.GELU, ew.ADD_MUL, ew.CAST, ew.ROPE, ew.EMBEDDING)}


def awkward(spec, i: int) -> dict:
    """A small problem whose sizes are multiples of no tile, rotating the flags with i."""
    if spec is ew.SILU_AND_MUL:
        return {"n_rows": 5, "d": 2100}
    if spec is ew.GELU_AND_MUL:
        return {"n_rows": 5, "d": 2100, "approximate": ("tanh", "none")[i % 2]}
    if spec is ew.GELU:
        return {"n_rows": 3, "n_cols": 1500, "approximate": ("none", "tanh")[i % 2]}
    if spec is ew.ADD_MUL:
        layouts = [(a, b) for a in ew.LAYOUTS for b in ew.LAYOUTS]
        a, b = layouts[i % len(layouts)]
        return {"n_rows": 9, "n_cols": 501, "op": ("add", "mul")[i % 2], "a_layout": a, "b_layout": b}
    if spec is ew.CAST:
        return {"n_rows": 3, "n_cols": 1500}
    if spec is ew.ROPE:
        rot = (96, 64, 32)[i % 3]
        return {
            "n_tokens": 5,
            "n_heads": 6,
            "n_kv_heads": 2,
            "head_dim": 96,
            "rot_dim": rot,
            "style": ("neox", "gptj")[i % 2],
        }
    return {"n_tokens": 6, "dim": 2100}


def check(spec, config, prob, dtypes, profile, device, seed=0, inputs=None):
    verdicts = run_checked(spec, config, prob, dtypes, profile, seed, device, inputs=inputs)
    assert all_ok(verdicts), first_report(verdicts)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_kept_candidate_matches_on_an_awkward_shape(name, profile, backend):
    spec = SPECS[name]
    kept = spec.pruned_for(awkward(spec, 0), profile).kept
    assert kept
    for i, config in enumerate(kept):
        dtypes = spec.dtypes[i % len(spec.dtypes)]
        check(spec, config, awkward(spec, i), dtypes, profile, backend.device, seed=i)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_default_on_every_example_problem_and_dtype(name, profile, backend):
    spec = SPECS[name]
    for p, prob in enumerate(spec.example_problems):
        for dtypes in spec.dtypes:
            check(spec, spec.default, prob, dtypes, profile, backend.device, seed=p)


@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul", "gelu", "add_mul", "rope", "embedding"])
@pytest.mark.parametrize("values", ["large", "equal"])
def test_large_magnitudes_and_equal_values(name, values, profile, backend):
    spec = SPECS[name]
    for i, dtypes in enumerate(spec.dtypes):
        prob = awkward(spec, i)
        if spec is ew.ADD_MUL and prob["op"] == "mul" and values == "large" and dtypes[0] == "float16":
            prob = dict(prob, op="add")  # 1e4 x 1e4 is no float16; its sum is
        inputs = spec.make_inputs(prob, dtypes, 20 + i, backend.device, values=values)
        check(spec, spec.default, prob, dtypes, profile, backend.device, inputs=inputs)


# --- cast, bit for bit ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("src", ew.CAST_DTYPES)
@pytest.mark.parametrize("dst", ew.CAST_DTYPES)
def test_cast_is_bit_exact_against_the_tensor_layer(src, dst, backend):
    """Every pair, over random float64 bit patterns, exact ties of every target, subnormals of every format, values
    past every range, infinities and NaN (NaN only needs to stay NaN: payloads are not specified)."""
    inputs = ew.cast_inputs({"n_rows": 1, "n_cols": 12000}, (src, dst), 3, backend.device, values="extreme")
    x, y = inputs.tensors["x"], inputs.tensors["y"]
    poison(y, y.dtype)
    ew._cast_launch(ew.FLAT_DEFAULT, inputs)
    want = D.encode(x.float64(), D.get_dtype(dst))
    got = y.numpy()
    unsigned = f"u{got.itemsize}"
    same = want.view(unsigned) == got.view(unsigned)
    both_nan = np.isnan(D.decode(want, D.get_dtype(dst))) & np.isnan(y.float64())
    bad = ~(same | both_nan)
    xs = x.float64()
    assert not bad.any(), f"{src}->{dst}: {bad.sum()} differ, e.g. x={xs[bad][:3]} got={y.float64()[bad][:3]}"
    # the sample really covers the hard cases of this pair
    assert np.isnan(xs).any() and np.isinf(xs).any()
    finite = xs[np.isfinite(xs) & (xs != 0)]
    assert (np.abs(finite) < D.finfo(D.get_dtype(src))["tiny"]).sum() > 100  # subnormal sources
    if D.get_dtype(dst).itemsize < D.get_dtype(src).itemsize:
        tiny_dst = D.finfo(D.get_dtype(dst))["tiny"]
        assert ((np.abs(finite) < tiny_dst) & (np.abs(y.float64()[np.isfinite(xs) & (xs != 0)]) > 0)).sum() > 100


def test_cast_user_facing_and_contiguity(backend):
    x = from_numpy(np.array([[1.0, 2.0**-24, 65520.0], [np.nan, -np.inf, 1 / 3]]), "float64", backend.device)
    y = ew.cast(x, "float16")
    assert y.dtype.name == "float16" and y.shape == (2, 3)
    assert y.float64()[0, 1] == 2.0**-24 and np.isinf(y.float64()[0, 2]) and np.isnan(y.float64()[1, 0])
    with pytest.raises(LaunchError, match="contiguous"):
        ew.cast(x.T, "float32")


# --- rope -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_in_place_leaves_the_unrotated_dims_bit_identical(style, profile, backend):
    prob = {"n_tokens": 7, "n_heads": 3, "n_kv_heads": 1, "head_dim": 80, "rot_dim": 48, "style": style}
    for dtypes in ew.ROPE.dtypes:
        inputs = ew.rope_inputs(prob, dtypes, 4, backend.device)
        before = {n: inputs.tensors[n].numpy().copy() for n in ("q", "k")}
        check(ew.ROPE, ew.ROPE_DEFAULT, prob, dtypes, profile, backend.device, inputs=inputs)
        for n in ("q", "k"):
            after = inputs.tensors[n].numpy()
            assert np.array_equal(after[..., 48:].view(np.uint8), before[n][..., 48:].view(np.uint8))
            assert not np.array_equal(after[..., :48], before[n][..., :48])


@pytest.mark.parametrize("n_heads,n_kv_heads,block_h", [(5, 1, 4), (2, 7, 2), (3, 3, 1)])
def test_rope_rotates_q_and_k_in_one_launch(n_heads, n_kv_heads, block_h, backend):
    """One launch for q and k (a served call pays the driver per launch): q's head blocks first, then k's, each
    rotated as the float64 oracle says, whichever has more heads or blocks."""
    gen = np.random.default_rng(11)
    dev = backend.device
    q = from_numpy(gen.standard_normal((3, n_heads, 32)).astype(np.float32), "float32", dev)
    k = from_numpy(gen.standard_normal((3, n_kv_heads, 32)).astype(np.float32), "float32", dev)
    pos = from_numpy(np.array([0, 5, 9]), "int64", dev)
    cache = from_numpy(ew.rope_cache(32, 16), "float32", dev)
    want_q = oracle.rope(q.float64(), pos.numpy(), cache.float64(), 32, "neox")[0]
    want_k = oracle.rope(k.float64(), pos.numpy(), cache.float64(), 32, "neox")[0]
    config = Config.make(num_warps=1, TOKENS=2, BLOCK_H=block_h)
    launches = ew.rope_launches(config, q, k, pos, cache, 32, "neox")
    assert len(launches) == 1
    assert launches[0].grid == (2, -(-n_heads // block_h) - (-n_kv_heads // block_h))
    ew.rope(q, k, pos, cache, config=config)
    np.testing.assert_allclose(q.float64(), want_q, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(k.float64(), want_k, rtol=1e-6, atol=1e-6)


def test_rope_user_facing_refuses_bad_positions_and_shapes(backend):
    dev = backend.device
    gen = np.random.default_rng(0)
    q = from_numpy(gen.standard_normal((4, 2, 64)), "float16", dev)
    k = from_numpy(gen.standard_normal((4, 1, 64)), "float16", dev)
    cache = from_numpy(ew.rope_cache(64, 16), "float32", dev)
    pos = from_numpy(np.array([0, 3, 15, 2]), "int64", dev)
    want_q = oracle.rope(q.float64(), pos.numpy(), cache.float64(), 64, "neox")
    rq, rk = ew.rope(q, k, pos, cache)
    assert rq is q and rk is k
    v = compare(q.float64(), *want_q, q.dtype, 2**-10)
    assert v.ok, v.report
    # a bad position is refused by the kernel: never read through, its token left as it was, the others rotated
    before_q, before_k = q.numpy().copy(), k.numpy().copy()
    bad_pos = np.array([0, 16, 1, 2])
    with pytest.raises(LaunchError, match="position 16 at index 1 is outside the cos/sin cache of 16 rows"):
        ew.rope(q, k, from_numpy(bad_pos, "int64", dev), cache)
        q.numpy()  # on a GPU the fault is reported at the first synchronisation after the launch
    good = [0, 2, 3]
    want_q = oracle.rope(before_q[good].astype(np.float64), bad_pos[good], cache.float64(), 64, "neox")
    v = compare(q.float64()[good], *want_q, q.dtype, 2**-10)
    assert v.ok, v.report
    assert np.array_equal(q.numpy()[1].view(np.uint16), before_q[1].view(np.uint16))
    assert np.array_equal(k.numpy()[1].view(np.uint16), before_k[1].view(np.uint16))
    ew.rope(q, k, pos, cache)  # the fault was cleared when it was reported
    q.numpy()
    with pytest.raises(LaunchError, match="rot_dim"):
        ew.rope(q, k, pos, cache, rot_dim=63)


# --- embedding --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 50, 10**6])
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_embedding_refuses_an_out_of_range_id_and_never_reads_through_it(bad, id_dtype, backend):
    table = from_numpy(np.arange(50 * 8, dtype=np.float64).reshape(50, 8), "float16", backend.device)
    ids = from_numpy(np.array([3, 7, bad, 0]), id_dtype, backend.device)
    out = from_numpy(np.full((4, 8), 7.0), "float16", backend.device)
    with pytest.raises(LaunchError, match=rf"embedding: id {bad} at index 2 is outside the table of 50 rows"):
        ew.embedding(table, ids, out=out)
        out.numpy()  # on a GPU the fault is reported at the first synchronisation after the launch
    got = out.float64()
    assert np.array_equal(got[[0, 1, 3]], table.float64()[[3, 7, 0]])
    assert np.all(got[2] == 0.0), "the bad id's row is zeros, not a read past the table"
    assert np.array_equal(ew.embedding(table, ids[:2]).float64(), table.float64()[[3, 7]])  # the fault was cleared


def test_embedding_user_facing_any_id_shape(backend):
    table = from_numpy(np.random.default_rng(1).standard_normal((30, 5)), "bfloat16", backend.device)
    ids = from_numpy(np.array([[0, 29, 4], [4, 4, 1]]), "int32", backend.device)
    out = ew.embedding(table, ids)
    assert out.shape == (2, 3, 5)
    assert np.array_equal(out.numpy(), table.numpy()[ids.numpy()])


# --- add / mul: broadcasting over strided views -----------------------------------------------------------------------
def test_add_mul_broadcast_over_strided_views(profile, backend):
    dev, gen = backend.device, np.random.default_rng(2)
    base = from_numpy(gen.standard_normal((4, 6, 10, 12)), "float32", dev)
    cases = [
        (base, from_numpy(gen.standard_normal(12), "float32", dev)),  # row vector
        (base.permute(0, 2, 1, 3), from_numpy(gen.standard_normal((10, 1, 12)), "float32", dev)),  # transposed
        (base[:, ::2, 3:, :5], from_numpy(gen.standard_normal((4, 1, 1, 1)), "float32", dev)),  # sliced
        (base[1].transpose(1, 2), base[2, 0][:, 3]),  # [6, 12, 10] + a strided [10] vector
        (from_numpy(np.array(3.0), "float32", dev), base[0]),  # 0-d
    ]
    for a, b in cases:
        shape = ew.broadcast_shape(a.shape, b.shape)
        for op, fn, ref in (("add", ew.add, oracle.add), ("mul", ew.mul, oracle.mul)):
            out = fn(a, b)
            assert out.shape == shape and out.is_contiguous()
            want, err = ref(a.float64(), b.float64())
            v = compare(
                out.float64(),
                np.broadcast_to(want, shape),
                np.broadcast_to(err, shape),
                out.dtype,
                profile.tolerance("float32"),
                f"{op} {a.shape}x{b.shape}",
            )
            assert v.ok, v.report
    with pytest.raises(ShapeMismatch, match="do not broadcast"):
        ew.add(base, from_numpy(np.ones(5), "float32", dev))
    with pytest.raises(ShapeMismatch, match="cast one first"):
        ew.add(base, from_numpy(np.ones(12), "float16", dev))
    assert ew.add_mul_problem(base.permute(0, 2, 1, 3), base[0, 0, 0], "mul") == {
        "n_rows": 240,
        "n_cols": 12,
        "op": "mul",
        "a_layout": "strided",
        "b_layout": "broadcast",
    }


def test_merge_dims_collapses_contiguous_runs():
    sizes, (sa, sb) = ew.merge_dims((4, 6, 10, 12), [720, 120, 12, 1], [0, 0, 0, 1])
    assert sizes == [240, 12] and sa == [12, 1] and sb == [0, 1]


# --- the no-bit claims ------------------------------------------------------------------------------------------------
def _bits(t) -> bytes:
    return np.ascontiguousarray(t.numpy()).tobytes()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_no_bit_fields_change_no_bit(name, profile, backend):
    """These kernels claim every config field changes no bit: all kept candidates give the same bits."""
    spec = SPECS[name]
    prob = awkward(spec, 1)
    kept = spec.pruned_for(prob, profile).kept
    fields = {k for c in spec.candidates for k, _ in c.kwargs} | {"num_warps"}
    assert set(spec.no_bit_fields) == fields - {"num_stages"}
    dtypes = spec.dtypes[-1]
    inputs = spec.make_inputs(prob, dtypes, 5, backend.device)
    originals = {n: inputs.tensors[n].clone() for n in inputs.inplace}
    outputs = defaultdict(list)
    for c in kept:
        for n in inputs.inplace:
            inputs.tensors[n].copy_(originals[n])
        for n in inputs.outputs:
            if n not in inputs.inplace:
                poison(inputs.tensors[n], inputs.tensors[n].dtype)
        spec.launch(c, inputs)
        for n in inputs.outputs:
            outputs[n].append((c, _bits(inputs.tensors[n])))
    for n, seen in outputs.items():
        for c, bits in seen[1:]:
            assert bits == seen[0][1], f"{spec.name}: {c.label()} and {seen[0][0].label()} differ in '{n}'"


def test_prunes_name_a_fact_on_hopper():
    from nbxcert.profiles import get_profile

    hopper = get_profile("nvidia/hopper")
    result = ew.ROPE.pruned_for({**awkward(ew.ROPE, 2), "rot_dim": 32}, hopper)  # 16 frequencies
    assert ew.ROPE_DEFAULT in result.kept
    assert all("warp_size" in r for _, r in result.pruned)
    assert all(c.num_warps == 1 or (c.num_warps - 1) * 32 < c["BLOCK_H"] * 16 for c in result.kept)
    for spec in (ew.GELU, ew.ADD_MUL, ew.CAST, ew.EMBEDDING, ew.SILU_AND_MUL):
        assert spec.default in spec.pruned_for(awkward(spec, 0), hopper).kept


# --- GPU --------------------------------------------------------------------------------------------------------------
GPU_PROBLEMS = (
    ("silu_and_mul", {"n_rows": 2048, "d": 5632}),
    ("gelu", {"n_rows": 2048, "n_cols": 4096, "approximate": "none"}),
    ("gelu", {"n_rows": 2048, "n_cols": 4096, "approximate": "tanh"}),
    ("add_mul", {"n_rows": 2048, "n_cols": 4096, "op": "add", "a_layout": "strided", "b_layout": "broadcast"}),
    ("add_mul", {"n_rows": 2048, "n_cols": 4096, "op": "mul", "a_layout": "dense", "b_layout": "dense"}),
    ("cast", {"n_rows": 2048, "n_cols": 4096}),
    ("rope", {"n_tokens": 2048, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128, "rot_dim": 128, "style": "neox"}),
    ("rope", {"n_tokens": 2048, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128, "rot_dim": 64, "style": "gptj"}),
    ("embedding", {"n_tokens": 2048, "dim": 4096}),
)


@pytest.mark.gpu
@pytest.mark.parametrize("name,prob", GPU_PROBLEMS)
def test_gpu_every_kept_candidate_at_real_shapes(name, prob, profile, backend):
    """Every kept candidate, every dtype, the oracle computed once per dtype (in-place kernels get fresh inputs from
    the same seed for each candidate), and every candidate's bits equal (all fields are claimed no-bit)."""
    spec = SPECS[name]
    failures = []
    for dtypes in spec.dtypes:
        failures += [f"{dtypes}: {f}" for f in check_configs(spec, prob, dtypes, profile, 9, backend.device)]
    assert not failures, "\n\n".join(failures[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("src", ew.CAST_DTYPES)
def test_gpu_cast_is_bit_exact(src, backend):
    for dst in ew.CAST_DTYPES:
        inputs = ew.cast_inputs({"n_rows": 64, "n_cols": 4096}, (src, dst), 3, backend.device, values="extreme")
        x, y = inputs.tensors["x"], inputs.tensors["y"]
        for config in ew.CAST.candidates:
            poison(y, y.dtype)
            ew._cast_launch(config, inputs)
            want = D.encode(x.float64(), D.get_dtype(dst))
            got = y.numpy()
            u = f"u{got.itemsize}"
            ok = (want.view(u) == got.view(u)) | (np.isnan(D.decode(want, D.get_dtype(dst))) & np.isnan(y.float64()))
            assert ok.all(), f"{src}->{dst} {config.label()}: {(~ok).sum()} differ"


@pytest.mark.gpu
def test_gpu_an_out_of_range_index_is_reported_at_the_next_synchronisation(backend):
    """On a GPU the launch does not wait for the device to check its ids: the kernel records the bad one, and the
    first synchronisation after it (here the read-back) raises; the launch's other rows are right."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend (the interpreter reports at the launch)")
    table = from_numpy(np.arange(50 * 8, dtype=np.float64).reshape(50, 8), "float16", backend.device)
    ids = from_numpy(np.array([3, 7, 50, 0]), "int32", backend.device)
    out = ew.embedding(table, ids, config=ew.EMBEDDING.default)  # queued: nothing is known on the host yet
    with pytest.raises(LaunchError, match="id 50 at index 2 is outside the table of 50 rows .*first synchronisation"):
        out.numpy()
    got = out.float64()  # reported once
    assert np.array_equal(got[[0, 1, 3]], table.float64()[[3, 7, 0]]) and np.all(got[2] == 0.0)
    q = from_numpy(np.random.default_rng(2).standard_normal((4, 2, 64)), "float16", backend.device)
    k = from_numpy(np.random.default_rng(3).standard_normal((4, 1, 64)), "float16", backend.device)
    cache = from_numpy(ew.rope_cache(64, 16), "float32", backend.device)
    ew.rope(q, k, from_numpy(np.array([0, 1, 2, -3]), "int64", backend.device), cache, config=ew.ROPE.default)
    with pytest.raises(LaunchError, match="rope: position -3 at index 3 is outside the cos/sin cache of 16 rows"):
        k.numpy()


def test_gelu_and_mul_user_facing_is_gelu_times_the_second_half(backend):
    """GeGLU through the user-facing call: the tanh form by default (Gemma's), the erf form asked for; a 3-d input
    viewed as rows; an odd last dimension refused."""
    gen = np.random.default_rng(2)
    x = from_numpy(gen.standard_normal((2, 3, 64)).astype(np.float32), "float32", backend.device)
    for approximate in ("tanh", "none"):
        want, scale = oracle.gelu_and_mul(x.float64(), approximate)
        got = ew.gelu_and_mul(x, approximate, config=ew.GELU_AND_MUL.default) if approximate == "none" else None
        got = got if got is not None else ew.gelu_and_mul(x, config=ew.GELU_AND_MUL.default)
        assert got.shape == (2, 3, 32)
        assert np.all(np.abs(got.float64() - want) <= 2.0**-20 * scale + 1e-30)
    with pytest.raises(ShapeMismatch, match="not even"):
        ew.gelu_and_mul(from_numpy(np.ones((2, 5), np.float32), "float32", backend.device))
