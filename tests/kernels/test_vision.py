"""Vision kernels (conv2d, group_norm, upsample_nearest2d) against their float64 oracles.

Under the interpreter (CI): every candidate the interpreter prune keeps runs once at tiny shapes (N = 1, C = 8,
H = W = 6, K = 8; groups 1 and 2; stride 2; dilation 2; 1x1 and 3x3; both layouts; with and without bias), rotating
problem and dtype; the defaults run every example problem in every dtype; the conv oracle is checked against a
per-pixel loop and the upsample oracle against hand-made values; the no-bit claims (conv's GROUP_M; every upsample
field, whose output is also checked bit for bit on NaN payloads, -0 and subnormals); bad shapes are refused with one
line naming the problem; the prunes against the device files; the keys. GPU tests run every hopper-kept candidate at
Stable Diffusion 1.5 shapes.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from nbxcert.errors import LaunchError, NbxcertError, ShapeMismatch
from nbxcert.kernels import vision as V
from nbxcert.kernels.check import all_ok, first_report, run_checked
from nbxcert.kernels.compare import compare, poison
from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.tensor import from_bits, from_numpy
from nbxcert.keys import make_key
from nbxcert.oracles import vision as oracle
from nbxcert.profiles import get_profile
from nbxcert.warm import compile_ahead

SPECS = {s.name: s for s in V.SPECS}
conv = V.conv_problem_dict

TINY = {
    "conv2d": (
        conv(1, 8, 6, 6, 8, 3, 3, padding=1, bias=1, layout="nchw"),
        conv(1, 8, 6, 6, 8, 3, 3, stride=2, padding=1, groups=2, bias=0, layout="nhwc"),
        conv(1, 8, 6, 6, 8, 3, 3, padding=2, dilation=2, groups=1, bias=1, layout="nhwc"),
        conv(1, 8, 6, 6, 8, 1, 1, groups=2, bias=1, layout="nchw"),
        conv(2, 8, 5, 7, 8, 3, 3, stride=2, padding=0, dilation=2, groups=2, bias=0, layout="nchw"),
    ),
    "group_norm": (
        {"batch": 1, "C": 8, "H": 6, "W": 6, "groups": 2, "silu": 1, "layout": "nchw"},
        {"batch": 2, "C": 8, "H": 6, "W": 6, "groups": 4, "silu": 0, "layout": "nhwc"},
        {"batch": 1, "C": 8, "H": 50, "W": 50, "groups": 2, "silu": 1, "layout": "nhwc"},  # 10000: several chunks
    ),
    "upsample_nearest2d": (
        {"batch": 1, "C": 8, "H": 6, "W": 6, "scale_h": 2, "scale_w": 2, "layout": "nchw"},
        {"batch": 2, "C": 3, "H": 5, "W": 4, "scale_h": 3, "scale_w": 1, "layout": "nhwc"},
    ),
}


def check(spec, config, prob, dtypes, profile, device, seed=0):
    verdicts = run_checked(spec, config, prob, dtypes, profile, seed, device)
    assert all_ok(verdicts), first_report(verdicts)


# --- every kept candidate, and the defaults everywhere ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_kept_candidate_matches_at_tiny_shapes(name, profile, backend):
    spec, problems = SPECS[name], TINY[name]
    for i, config in enumerate(spec.candidates):
        prob = problems[i % len(problems)]
        if config in spec.pruned_for(prob, profile).kept:
            check(spec, config, prob, spec.dtypes[i % len(spec.dtypes)], profile, backend.device, seed=i)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_default_on_every_tiny_and_example_problem_in_every_dtype(name, profile, backend):
    spec = SPECS[name]
    for p, prob in enumerate(TINY[name] + spec.example_problems):
        for dtypes in spec.dtypes:
            check(spec, spec.default, prob, dtypes, profile, backend.device, seed=p)


def test_group_norm_split_variant_on_every_tiny_problem(profile, backend):
    """The split variant's chunk statistics combine to the group's (one chunk, several, a last one partly full)."""
    split = [c for c in V.GROUP_NORM.candidates if c["VARIANT"] == "split"][:2]
    for p, prob in enumerate(TINY["group_norm"]):
        for c in split:
            check(V.GROUP_NORM, c, prob, ("float32",), profile, backend.device, seed=p)


# --- the oracles, against independent computations -------------------------------------------------------------------
def test_conv_oracle_against_a_per_pixel_loop():
    gen = np.random.default_rng(0)
    x, w, b = gen.standard_normal((2, 4, 5, 6)), gen.standard_normal((6, 2, 3, 2)), gen.standard_normal(6)
    stride, pad, dil, groups = 2, 1, 2, 2
    value, scale = oracle.conv2d(x, w, b, stride=stride, padding=pad, dilation=dil, groups=groups, acc_eps=0, out_eps=1)
    oh, ow = oracle.out_size(5, 3, stride, pad, dil), oracle.out_size(6, 2, stride, pad, dil)
    assert value.shape == scale.shape == (2, 6, oh, ow)
    for n in range(2):
        for k in range(6):
            g = k // 3
            for i in range(oh):
                for j in range(ow):
                    total, mag = b[k], abs(b[k])
                    for c in range(2):
                        for r in range(3):
                            for s in range(2):
                                h, ww = i * stride - pad + r * dil, j * stride - pad + s * dil
                                if 0 <= h < 5 and 0 <= ww < 6:
                                    total += x[n, g * 2 + c, h, ww] * w[k, c, r, s]
                                    mag += abs(x[n, g * 2 + c, h, ww] * w[k, c, r, s])
                    assert value[n, k, i, j] == pytest.approx(total, abs=1e-12)
                    assert scale[n, k, i, j] == pytest.approx(mag, abs=1e-12)


def test_conv_oracle_takes_its_products_from_the_product_handed_in():
    # a key's float64 reference runs its sums over channels through the product of `kernels.products` (cuBLAS on a
    # GPU): one product a window position for the value and one for the scale, whose result is what it returns
    gen = np.random.default_rng(1)
    x, w, b = gen.standard_normal((2, 4, 5, 5)), gen.standard_normal((6, 2, 3, 3)), gen.standard_normal(6)
    shapes = []

    def product(a, m):
        shapes.append((a.shape, m.shape))
        return np.matmul(a, m)

    kw = dict(stride=1, padding=1, dilation=1, groups=2, acc_eps=0, out_eps=1)
    value, scale = oracle.conv2d(x, w, b, product=product, **kw)
    assert shapes == [((2 * 5 * 5, 2), (2, 3))] * (2 * 9 * 2)
    np.testing.assert_array_equal((value, scale), oracle.conv2d(x, w, b, **kw))
    zero, _ = oracle.conv2d(x, w, b, product=lambda a, m: np.zeros((a.shape[0], m.shape[1])), **kw)
    np.testing.assert_array_equal(zero, np.broadcast_to(b[None, :, None, None], zero.shape))


def test_group_norm_oracle_on_a_hand_made_group():
    """Two groups of one channel: values ±1 normalise to ±1/sqrt(1 + eps), then weight and bias apply."""
    x = np.array([[[[1.0, -1.0]], [[3.0, 5.0]]]])  # [1, 2, 1, 2]
    y, _ = oracle.group_norm(x, 2, np.array([2.0, 1.0]), np.array([0.5, 0.0]), 0.0)
    assert np.allclose(y[0, 0, 0], [2.5, -1.5]) and np.allclose(y[0, 1, 0], [-1.0, 1.0])
    z, _ = oracle.group_norm(x, 2, np.array([2.0, 1.0]), np.array([0.5, 0.0]), 0.0, silu=True)
    assert np.allclose(z, y / (1.0 + np.exp(-y)))


def test_upsample_oracle_on_hand_made_values():
    x = np.arange(6.0).reshape(1, 1, 2, 3)
    y, scale = oracle.upsample_nearest2d(x, 2, 1)
    assert y[0, 0].tolist() == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]] and not scale.any()


# --- the no-bit claims and bit-exactness -----------------------------------------------------------------------------
def _bits(t) -> bytes:
    return np.ascontiguousarray(t.numpy()).tobytes()


def _outputs_by_no_bit_group(spec, prob, dtypes, configs, device):
    groups = defaultdict(list)
    inputs = spec.make_inputs(prob, dtypes, 3, device)
    for c in configs:
        key = c.without(spec.no_bit_fields)
        key = (key.kwargs, key.num_stages) if "num_warps" in spec.no_bit_fields else key
        out = inputs.tensors[inputs.outputs[0]]
        poison(out, out.dtype)
        spec.launch(c, inputs)
        groups[key].append((c, _bits(out)))
    return groups


@pytest.mark.parametrize("name", ["conv2d", "upsample_nearest2d"])
def test_no_bit_fields_change_no_bit(name, profile, backend):
    spec = SPECS[name]
    prob = TINY[name][1]
    kept = spec.pruned_for(prob, profile).kept
    compared = 0
    for members in _outputs_by_no_bit_group(spec, prob, spec.dtypes[0], kept, backend.device).values():
        for c, bits in members[1:]:
            assert bits == members[0][1], f"{spec.name}: {c.label()} and {members[0][0].label()} differ in bits"
            compared += 1
    assert compared > 0
    if name == "upsample_nearest2d":
        assert compared == len(kept) - 1, "every upsample field is a no-bit field: one group"
    assert V.GROUP_NORM.no_bit_fields == ()


@pytest.mark.parametrize("dtype, bits", [("float16", np.int16), ("bfloat16", np.int16), ("float32", np.int32)])
def test_upsample_copies_bit_patterns(dtype, bits, backend):
    """NaN payloads, -0, infinities and subnormals come out as the very bit patterns that went in."""
    width = np.dtype(bits).itemsize * 8
    specials = {
        16: [0x7E01, 0xFE55, 0x8000, 0x7C00, 0x0001, 0x83FF],  # NaN payloads, -0, inf, subnormals
        32: [0x7FC00123, 0xFF800001, 0x80000000, 0x7F800000, 0x00000001, 0x807FFFFF],
    }
    gen = np.random.default_rng(1)
    pattern = gen.integers(-(2 ** (width - 1)), 2 ** (width - 1), size=(1, 2, 3, 4)).astype(bits)
    unsigned = np.uint16 if width == 16 else np.uint32
    storage = get_dtype(dtype).storage  # from_bits takes the bits as the storage type
    pattern.reshape(-1)[: len(specials[width])] = np.array(specials[width], dtype=unsigned).view(bits)
    for layout in V.LAYOUTS:
        x = from_bits(pattern.view(storage), dtype, backend.device)
        if layout == "nhwc":
            x = from_bits(np.ascontiguousarray(pattern.transpose(0, 2, 3, 1)).view(storage), dtype, backend.device)
            x = x.permute(0, 3, 1, 2)
        for config in (V.UPSAMPLE_DEFAULT, V.UPSAMPLE_NEAREST2D.candidates[0]):
            y = V.upsample_nearest2d(x, (2, 3), config=config)
            got = V.bits_view(y).numpy()
            assert np.array_equal(got, np.repeat(np.repeat(pattern, 2, axis=2), 3, axis=3)), (layout, config)
            assert V.layout_of(y, "y") == layout


# --- user-facing functions --------------------------------------------------------------------------------------------
def test_user_facing_functions_match_the_oracles(profile, backend):
    dev = backend.device
    tol = profile.tolerance("float16")
    inputs = V.conv2d_inputs(TINY["conv2d"][1], ("float16",), 5, dev)
    t = inputs.tensors
    y = V.conv2d(t["x"], t["weight"], None, stride=2, padding=1, groups=2)
    ref = V._conv2d_oracle(inputs)["y"]
    v = compare(y.float64(), ref.value, ref.scale, y.dtype, tol, "conv2d")
    assert v.ok, v.report
    assert V.layout_of(y, "y") == "nhwc"
    assert V.conv2d_problem(t["x"], t["weight"], None, 2, 1, 1, 2) == TINY["conv2d"][1]
    g = V.group_norm_inputs(TINY["group_norm"][0], ("bfloat16",), 6, dev).tensors
    y = V.group_norm(g["x"], 2, g["weight"], g["bias"], silu=True)
    ref, scale = oracle.group_norm(g["x"].float64(), 2, g["weight"].float64(), g["bias"].float64(), 1e-5, True)
    v = compare(y.float64(), ref, scale, y.dtype, profile.tolerance("bfloat16"), "group_norm")
    assert v.ok, v.report


# --- refusals: one line naming what does not fit ----------------------------------------------------------------------
def _refused(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, NbxcertError) and "\n" not in str(info.value)


def _nhcw(x):
    """x's values with strides of neither layout (stored N, H, C, W)."""
    stored = np.ascontiguousarray(x.float64().transpose(0, 2, 1, 3))
    return from_numpy(stored, x.dtype, x.device).permute(0, 2, 1, 3)


def test_bad_shapes_are_refused_by_name(backend):
    dev = backend.device
    t = V.conv2d_inputs(TINY["conv2d"][0], ("float16",), 0, dev).tensors
    x, w, b = t["x"], t["weight"], t["bias"]
    _refused(ShapeMismatch, "C/groups = 4", V.conv2d, x, w, b, groups=2)
    _refused(ShapeMismatch, "groups=3 must divide", V.conv2d, x, w, b, groups=3)
    _refused(ShapeMismatch, "empty output", V.conv2d, x, w, b, padding=0, dilation=4)
    _refused(LaunchError, "stride must be an integer >= 1", V.conv2d, x, w, b, stride=0)
    _refused(ShapeMismatch, "bias must be", V.conv2d, x, w, from_numpy(np.ones(3), "float16", dev))
    _refused(ShapeMismatch, "x's dtype", V.conv2d, x, from_numpy(w.float64(), "bfloat16", dev), b)
    x32 = from_numpy(x.float64(), "float32", dev)
    _refused(ShapeMismatch, "dtype float32; one of float16, bfloat16", V.conv2d, x32, w, b)
    _refused(LaunchError, "neither nchw .* nor nhwc", V.conv2d, _nhcw(x), w, b)
    _refused(ShapeMismatch, "must be 4-d", V.conv2d, x[0], w, b)
    _refused(
        ShapeMismatch,
        "out must be",
        V.conv2d,
        x,
        w,
        b,
        padding=1,
        out=from_numpy(np.ones((1, 8, 5, 5)), "float16", dev),
    )
    ones = from_numpy(np.ones(8), "float16", dev)
    _refused(ShapeMismatch, "num_groups=3 does not divide", V.group_norm, x, 3, ones, ones)
    _refused(ShapeMismatch, "weight must be", V.group_norm, x, 2, from_numpy(np.ones(4), "float16", dev), ones)
    _refused(ShapeMismatch, "bias must be", V.group_norm, x, 2, ones, from_numpy(np.ones(8), "float32", dev))
    _refused(LaunchError, "scale_factor must be an integer", V.upsample_nearest2d, x, 1.5)
    _refused(LaunchError, "scale_factor must be an integer >= 1", V.upsample_nearest2d, x, (2, 0))
    _refused(LaunchError, "an integer or two", V.upsample_nearest2d, x, (2, 2, 2))


# --- prunes and keys --------------------------------------------------------------------------------------------------
SD = {
    "conv2d": (
        conv(2, 320, 64, 64, 320, 3, 3, padding=1),
        conv(2, 320, 32, 32, 640, 1, 1),
        conv(2, 640, 32, 32, 640, 3, 3, stride=2, padding=1),
        conv(2, 1280, 8, 8, 1280, 3, 3, padding=1, layout="nhwc"),
    ),
    "group_norm": (
        {"batch": 2, "C": 320, "H": 64, "W": 64, "groups": 32, "silu": 1, "layout": "nchw"},
        {"batch": 2, "C": 1280, "H": 8, "W": 8, "groups": 32, "silu": 0, "layout": "nhwc"},
        {"batch": 1, "C": 128, "H": 512, "W": 512, "groups": 32, "silu": 1, "layout": "nchw"},  # the VAE decoder's
    ),
    "upsample_nearest2d": (
        {"batch": 2, "C": 1280, "H": 16, "W": 16, "scale_h": 2, "scale_w": 2, "layout": "nchw"},
        {"batch": 2, "C": 640, "H": 32, "W": 32, "scale_h": 2, "scale_w": 2, "layout": "nhwc"},
    ),
}
FACTS = ("max_shared_memory", "max_num_stages", "max_threads_per_block", "warp_size", "max_registers", "TRITON_MAX")


def test_interpreter_prune_keeps_every_candidate():
    interp = get_profile("cpu/interpreter")
    for name, spec in SPECS.items():
        for prob in SD[name]:
            assert spec.pruned_for(prob, interp).kept == spec.candidates


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("profile_key", ["nvidia/hopper", "nvidia/ampere", "nvidia/volta"])
def test_device_prunes_keep_the_default_or_name_a_fact(name, profile_key):
    spec, prof = SPECS[name], get_profile(profile_key)
    for prob in SD[name]:
        result = spec.pruned_for(prob, prof)
        for config, reason in result.pruned:
            assert any(f in reason for f in FACTS), (config.label(), reason)
        if not (profile_key == "nvidia/volta" and name == "conv2d"):
            assert spec.default in result.kept
    if profile_key == "nvidia/volta" and name == "conv2d":  # no pipeliner before sm_80: the unpipelined tiles stay
        assert {c.num_stages for c in result.kept} == {1}


def test_keys_bucket_the_batch_and_keep_the_rest_exact():
    hopper = get_profile("nvidia/hopper")
    key = make_key(V.CONV2D, conv(3, 320, 64, 64, 640, 3, 3, stride=2, padding=1, layout="nhwc"), ("float16",), hopper)
    assert key.text() == (
        "conv2d[C=320,H=64,K=640,R=3,S=3,W=64,batch=4,bias=1,dilation=1,groups=1,layout=nhwc,padding=1,stride=2;"
        "float16]@v1"
    )
    key = make_key(V.GROUP_NORM, SD["group_norm"][0], ("bfloat16",), hopper)
    assert key.text() == "group_norm[C=320,H=64,W=64,batch=2,groups=32,layout=nchw,silu=1;bfloat16]@v1"
    up = dict(SD["upsample_nearest2d"][0], batch=5)
    assert make_key(V.UPSAMPLE_NEAREST2D, up, ("float16",), hopper).text() == (
        "upsample_nearest2d[C=1280,H=16,W=16,batch=8,layout=nchw,scale_h=2,scale_w=2;float16]@v1"
    )
    assert V.UPSAMPLE_NEAREST2D.output_dtypes(("bfloat16",)) == ("int16",)  # certified on its bits


# --- GPU: every hopper-kept candidate at Stable Diffusion shapes ------------------------------------------------------
GPU_CASES = [(name, i) for name in sorted(SPECS) for i in range(len(SD[name]))]


@pytest.mark.gpu
@pytest.mark.parametrize("name,i", GPU_CASES)
def test_gpu_every_kept_candidate_at_sd_shapes(name, i, profile, backend):
    """The first dtype (float16) at Stable Diffusion 1.5 UNet and VAE shapes: each candidate the device's prune keeps
    matches the oracle (computed once per case), and candidates that differ only in no-bit fields agree to the bit."""
    spec = SPECS[name]
    prob = SD[name][i]
    inputs = spec.make_inputs(prob, spec.dtypes[0], 7, backend.device)
    out_name = inputs.outputs[0]
    ref = spec.oracle(inputs)[out_name]
    out = inputs.tensors[out_name]
    failures, bits = [], {}
    kept = spec.pruned_for(prob, profile).kept
    compile_ahead(spec, prob, spec.dtypes[0], kept, profile.key)
    for config in kept:
        poison(out, out.dtype)
        spec.launch(config, inputs)
        v = compare(out.float64(), ref.value, ref.scale, out.dtype, profile.tolerance(out.dtype.name), config.label())
        if not v.ok:
            failures.append(v.report)
        group = config.without(spec.no_bit_fields)
        group = (group.kwargs, group.num_stages) if "num_warps" in spec.no_bit_fields else group
        if bits.setdefault(group, _bits(out)) != _bits(out):
            failures.append(f"{config.label()}: differs in bits from a config differing only in no-bit fields")
    assert not failures, "\n\n".join(failures[:3])
