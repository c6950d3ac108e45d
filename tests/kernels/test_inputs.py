"""Inputs made only to be compiled for (`kernels.inputs.shape_only`, what the sweep's compile workers and
`compile_ahead` build): the same tensors, shapes, strides, offsets and scalars as the real inputs, without drawing a
random float; and the chunked bfloat16 rounding equal to the one-shot one."""

from __future__ import annotations

import numpy as np
import pytest

from nbxcert.kernels import draws
from nbxcert.kernels import dtypes as D
from nbxcert.kernels import inputs as I
from nbxcert.kernels.spec import load_all


def _layout(inputs) -> dict:
    return {
        "tensors": {
            name: (t.shape, t.stride(), t.storage_offset(), t.dtype.name) for name, t in sorted(inputs.tensors.items())
        },
        "scalars": dict(inputs.scalars),
        "outputs": tuple(inputs.outputs),
    }


CASES = [(name, i) for name, spec in sorted(load_all().items()) for i in range(len(spec.example_problems))]


@pytest.mark.parametrize("name,i", CASES)
def test_shape_only_inputs_lay_out_like_the_real_ones(name, i):
    """What Triton specialises a compile on (dtypes, shapes, strides, offsets, scalar arguments) is the same, so the
    binaries a compile worker makes are the ones the checked launches look up."""
    spec = load_all()[name]
    problem = spec.example_problems[i]
    dtypes = spec.dtypes[0]
    real = spec.make_inputs(problem, dtypes, 3, "cpu")
    with I.shape_only():
        shaped = spec.make_inputs(problem, dtypes, 3, "cpu")
    assert _layout(shaped) == _layout(real)


class _NoDraws:
    def __getattr__(self, name):
        raise AssertionError(f"a random draw ({name}) under shape_only")


def test_shape_only_draws_no_float_and_ends_with_its_block():
    with I.shape_only():
        t = I.randn(_NoDraws(), (3, 5), "bfloat16", "cpu")
        u = I.uniform(_NoDraws(), (4,), "float16", "cpu")
    assert (t.shape, t.dtype.name, u.shape, u.dtype.name) == ((3, 5), "bfloat16", (4,), "float16")
    with pytest.raises(AssertionError, match="standard_normal"):
        I.randn(_NoDraws(), (3,), "float16", "cpu")  # outside the block, values are drawn again


def test_chunked_bfloat16_rounding_equals_the_one_shot_rounding(monkeypatch):
    gen = np.random.default_rng(5)
    x = np.concatenate([gen.standard_normal(5000) * np.exp2(gen.integers(-140, 130, 5000)), [np.nan, -np.inf, 0.0]])
    whole = D.to_bfloat16_bits(x)
    monkeypatch.setattr(D, "_CHUNK", 997)  # chunks that split the array unevenly (`encode` chunks, on threads)
    chunked = D.encode(x.reshape(-1, 1), D.bfloat16)
    assert chunked.shape == (x.size, 1)
    assert np.array_equal(chunked.reshape(-1), whole)


def test_a_large_tensor_is_drawn_in_parts_the_same_whatever_the_threads(monkeypatch):
    """At LARGE elements and above `randn` draws float32 parts from child generators on threads: the values depend on
    the seed and the part size only, not on the number of threads; they are normal (mean 0, deviation 1)."""
    monkeypatch.setattr(I, "LARGE", 5000)
    monkeypatch.setattr(I, "PART", 700)  # 8 parts, the last one short
    one = I.randn(I.rng(4), (5, 1080), "float16", "cpu", scale=2.0).float64()
    monkeypatch.setattr(I.os, "cpu_count", lambda: 1)
    single = I.randn(I.rng(4), (5, 1080), "float16", "cpu", scale=2.0).float64()
    assert np.array_equal(one, single)
    assert not np.array_equal(one, I.randn(I.rng(5), (5, 1080), "float16", "cpu", scale=2.0).float64())
    assert abs(one.mean()) < 0.1 and abs(one.std() - 2.0) < 0.1
    small = I.randn(I.rng(4), (4, 1000), "float16", "cpu")  # below LARGE: float64 draws, as before
    assert np.array_equal(
        small.float64(), D.encode(np.random.default_rng(4).standard_normal((4, 1000)), D.float16).astype(np.float64)
    )


def test_large_float64_normals_are_drawn_in_parts_from_child_generators(monkeypatch):
    """`normals` past LARGE: float64 values of child generators, one a PART in order (the seed and PART decide them,
    the threads do not); below LARGE the generator's own draw, as before."""
    monkeypatch.setattr(I, "LARGE", 5000)
    monkeypatch.setattr(I, "PART", 700)
    got = I.normals(I.rng(9), 5400)
    children = np.random.default_rng(9).spawn(8)
    want = np.concatenate([c.standard_normal(min(700, 5400 - 700 * i)) for i, c in enumerate(children)])
    assert got.dtype == np.float64 and np.array_equal(got, want)
    monkeypatch.setattr(I.os, "cpu_count", lambda: 1)
    assert np.array_equal(I.normals(I.rng(9), 5400), want)
    assert np.array_equal(I.normals(I.rng(9), 4999), np.random.default_rng(9).standard_normal(4999))


class _IntegersOnly:
    """A generator that draws integers and refuses floats: under shape_only an input maker may draw only these."""

    def __init__(self, gen):
        self._gen = gen

    def integers(self, *args, **kwargs):
        return self._gen.integers(*args, **kwargs)

    def permutation(self, *args, **kwargs):
        return self._gen.permutation(*args, **kwargs)

    def spawn(self, n):
        return [_IntegersOnly(g) for g in self._gen.spawn(n)]

    def __getattr__(self, name):
        raise AssertionError(f"a random float draw ({name}) under shape_only")


@pytest.mark.parametrize("name,i", CASES)
def test_shape_only_inputs_draw_no_float(name, i, monkeypatch):
    """A compile worker's inputs cost no random floats: every family's input maker, under shape_only, draws from
    the generator only integers (a decode cache of batch 48 at 8192 positions took 117 s of a key's sweep on the
    H200 when the attention inputs drew float64 caches for every compile request)."""
    spec = load_all()[name]
    made = spec.make_inputs(spec.example_problems[i], spec.dtypes[0], 3, "cpu")
    read = set(made.tensors) - set(made.outputs)  # a generator (arange, fill, ...) reads no tensor: draws nothing
    real = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", lambda seed: _IntegersOnly(real(seed)))
    with I.shape_only():
        spec.make_inputs(spec.example_problems[i], spec.dtypes[0], 3, "cpu")
    if read and any(made.tensors[n].dtype.is_float for n in read):
        with pytest.raises(AssertionError, match="a random float draw"):  # outside the block, floats are drawn
            spec.make_inputs(spec.example_problems[i], spec.dtypes[0], 3, "cpu")


def test_the_shape_only_generator_draws_integers_like_the_real_one():
    with I.shape_only():
        gen = I.rng(7)
        normal, uniform, one = gen.standard_normal((2, 3)), gen.uniform(0.1, 1.0, size=4), gen.random()
        ids = gen.integers(0, 100, 6)
    assert np.array_equal(ids, np.random.default_rng(7).integers(0, 100, 6))
    assert normal.shape == (2, 3) and not normal.any() and np.array_equal(uniform, np.full(4, 0.1)) and one == 0.0
    assert isinstance(I.rng(7), np.random.Generator)  # outside the block, the real generator


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float8_e4m3fn", "float8_e5m2"])
def test_chunked_encode_and_decode_equal_the_one_shot_conversions(name, monkeypatch):
    """Large conversions run in chunks on threads: the bits and values are those of one call over the whole array."""
    dtype = D.get_dtype(name)
    gen = np.random.default_rng(9)
    x = np.concatenate([gen.standard_normal(6000) * np.exp2(gen.integers(-30, 30, 6000)), [np.nan, -np.inf, -0.0]])
    whole = D.encode(x, dtype)
    back = D.decode(whole, dtype)
    monkeypatch.setattr(D, "_CHUNK", 997)
    chunked = D.encode(x.reshape(-1, 3), dtype)
    assert chunked.shape == (x.size // 3, 3) and chunked.reshape(-1).tobytes() == whole.tobytes()  # bits, NaN too
    assert np.array_equal(D.decode(chunked, dtype).reshape(-1), back, equal_nan=True)


def test_shape_only_zeroed_gives_zeros_and_real_integers(monkeypatch):
    """A cold start's launch inputs: float tensors zeros (run, never judged), integer draws real. Unfilled memory is
    made to read 7 here, so zeros can only come from `zeroed`."""
    from nbxcert.kernels.tensor import full

    monkeypatch.setattr(I, "empty", lambda shape, dtype, device: full(shape, 7.0, dtype, device))
    with I.shape_only():
        assert (I.randn(I.rng(5), (3, 7), "float16", "cpu").numpy() == 7).all()  # unfilled: whatever was there
    with I.shape_only(zeroed=True):
        gen = I.rng(5)
        a, b = I.randn(gen, (3, 7), "float16", "cpu"), I.uniform(gen, (4,), "bfloat16", "cpu")
        ids = I.randint(gen, (6,), 0, 1000, "int32", "cpu")
    assert not a.numpy().any() and not b.numpy().any()
    assert ids.numpy().any() and ids.numpy().max() < 1000


def _drawn(dtype, seed=11, shape=(3, 5, 7, 64), scale=1.5, nan_where=None):
    from nbxcert.kernels.backends import select

    gen = np.random.default_rng(seed)
    return draws.device_normal(gen, shape, dtype, select().device, scale, nan_where)


def test_a_device_draw_depends_on_the_seed_alone_and_looks_normal():
    """A draw made where a tensor lies (`draws.device_normal`; here under the interpreter, which runs the same
    kernel as a GPU): the same generator state gives the same values, another gives others; they are normal, scaled, and
    the generator gave one draw for the seed."""
    a, b, c = _drawn("float32").numpy(), _drawn("float32").numpy(), _drawn("float32", seed=12).numpy()
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.dtype == np.float32 and a.shape == (3, 5, 7, 64) and np.isfinite(a).all()
    assert abs(a.mean()) < 0.1 and abs(a.std() / 1.5 - 1.0) < 0.05
    gen = np.random.default_rng(11)
    gen.integers(1 << 32, 1 << 62)
    after = np.random.default_rng(11)
    from nbxcert.kernels.backends import select

    draws.device_normal(after, (4,), "float32", select().device)
    assert gen.integers(1 << 30) == after.integers(1 << 30)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_device_draw_rounds_its_float32_values_once_to_nearest_even(dtype):
    """float16 and bfloat16 draws are the float32 draw of the same seed, rounded once to nearest even (bfloat16 by its
    bits, as the interpreter stores it): compared bit for bit with numpy's rounding of the float32 values."""
    wide = _drawn("float32").numpy()
    got = _drawn(dtype).numpy()  # float16 values, or bfloat16's 16-bit patterns
    want = wide.astype(np.float16) if dtype == "float16" else D.float32_to_bfloat16_bits(wide)
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_a_device_draw_puts_nan_exactly_where_the_mask_holds():
    """A cache's positions past each sequence's length (a mask that broadcasts over heads and the head dimension):
    NaN there and nowhere else, as the host's draw puts them."""
    lengths = np.array([2, 7, 4])
    past = np.arange(7)[None, None, :, None] >= lengths[:, None, None, None]
    got = _drawn("float32", nan_where=past).numpy()
    assert np.array_equal(np.isnan(got), np.broadcast_to(past, got.shape))
    with pytest.raises(ValueError):
        _drawn("float32", nan_where=np.zeros((2, 1, 1, 1), bool))  # does not broadcast to 3 sequences


@pytest.mark.gpu
def test_on_a_gpu_randn_draws_a_large_tensor_where_it_lies():
    """The input makers' `randn` on a GPU: a tensor of at least `draws.ON_GPU_FROM` elements is the device draw of
    the same generator state; a smaller one is the host's."""
    big, small = (4, 64, 256), (3, 7)
    a = I.randn(np.random.default_rng(3), big, "bfloat16", "cuda:0", 2.0).numpy()
    b = draws.device_normal(np.random.default_rng(3), big, "bfloat16", "cuda:0", 2.0).numpy()
    assert np.array_equal(a, b)
    host = I.randn(np.random.default_rng(3), small, "float16", "cuda:0").numpy()
    assert np.array_equal(host, I.randn(np.random.default_rng(3), small, "float16", "cpu").numpy())


# The operands of "normal" values each family makes (its weights, biases, masks and tables of cos/sin are the host's:
# a row's length at most, or a formula's values)
NORMAL_OPERANDS = {
    "add_layernorm": ("x", "residual"),
    "add_mul": ("a", "b"),
    "add_rmsnorm": ("x", "residual"),
    "embedding": ("table",),
    "gelu": ("x",),
    "gelu_and_mul": ("x",),
    "layernorm": ("x",),
    "rmsnorm": ("x",),
    "rope": ("q", "k"),
    "row_reduce": ("x",),
    "silu_and_mul": ("x",),
    "softmax": ("x",),
}


@pytest.mark.parametrize("name", sorted(NORMAL_OPERANDS))
def test_normal_values_of_the_row_and_elementwise_families_are_drawn_by_randn(name, monkeypatch):
    """Their "normal" operands (the values certify makes) come from `randn`, which draws a large one where it lies
    on a GPU (a SwiGLU input of 4096 x 28672 drawn, rounded and copied on the host took 4.4 s of a certify key on an
    H100): each such operand's storage is one of the draws."""
    spec = load_all()[name]
    drawn: list[int] = []
    real = I.randn

    def spy(gen, shape, dtype, device, scale=1.0, nan_where=None):
        t = real(gen, shape, dtype, device, scale, nan_where)
        drawn.append(id(t.untyped_storage()))
        return t

    monkeypatch.setattr(I, "randn", spy)
    made = spec.make_inputs(spec.example_problems[0], spec.dtypes[0], 3, "cpu")
    for operand in NORMAL_OPERANDS[name]:
        assert id(made.tensors[operand].untyped_storage()) in drawn, f"{name}: {operand} was not drawn by randn"
    monkeypatch.setattr(I, "randn", real)
    again = spec.make_inputs(spec.example_problems[0], spec.dtypes[0], 3, "cpu")
    assert all(np.array_equal(again.tensors[o].numpy(), made.tensors[o].numpy()) for o in NORMAL_OPERANDS[name])
