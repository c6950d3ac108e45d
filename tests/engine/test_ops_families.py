"""`nbxcert.ops`' other families under torch's signatures: each wrapper gives the same bits as the nbxcert function
it wraps (the interpreter, tiny seeded shapes), each torch argument the kernel cannot honour is refused in one line
naming it, and each signature's parameter names and defaults are torch's documented ones (written out below)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from devicetools import DEVICE, from_numpy

from nbxcert import ops
from nbxcert.errors import ArgumentNotSupported, ShapeMismatch
from nbxcert.kernels import attention, elementwise, matmul, rows, sampling, vision

_rng = np.random.default_rng(20240530)


def _r(*shape, dtype="float32"):
    return from_numpy(_rng.standard_normal(shape) + 0.25, dtype)


def _same(got, want):
    """The same shape, dtype and bits (NaN where NaN)."""
    assert tuple(got.shape) == tuple(want.shape) and got.dtype is want.dtype
    g, w = got.numpy(), want.numpy()
    assert g.tobytes() == np.ascontiguousarray(w).tobytes(), (g, w)


# --- torch's documented signatures (torch 2.x docs), written out ------------------------------------------------------
_E = inspect.Parameter.empty
TORCH_SIGNATURES = {
    "matmul": [("input", _E), ("other", _E), ("*out", None)],
    "mm": [("input", _E), ("mat2", _E), ("*out", None)],
    "bmm": [("input", _E), ("mat2", _E), ("*out", None)],
    "addmm": [("input", _E), ("mat1", _E), ("mat2", _E), ("*beta", 1), ("*alpha", 1), ("*out", None)],
    "baddbmm": [("input", _E), ("batch1", _E), ("batch2", _E), ("*beta", 1), ("*alpha", 1), ("*out", None)],
    "mv": [("input", _E), ("vec", _E), ("*out", None)],
    "addmv": [("input", _E), ("mat", _E), ("vec", _E), ("*beta", 1), ("*alpha", 1), ("*out", None)],
    "softmax": [("input", _E), ("dim", None), ("_stacklevel", 3), ("dtype", None)],
    "log_softmax": [("input", _E), ("dim", None), ("_stacklevel", 3), ("dtype", None)],
    "layer_norm": [("input", _E), ("normalized_shape", _E), ("weight", None), ("bias", None), ("eps", 1e-5)],
    "rms_norm": [("input", _E), ("normalized_shape", _E), ("weight", None), ("eps", None)],
    "embedding": [
        ("input", _E),
        ("weight", _E),
        ("padding_idx", None),
        ("max_norm", None),
        ("norm_type", 2.0),
        ("scale_grad_by_freq", False),
        ("sparse", False),
    ],
    "argmax": [("input", _E), ("dim", None), ("keepdim", False)],
    "topk": [("input", _E), ("k", _E), ("dim", -1), ("largest", True), ("sorted", True), ("*out", None)],
    "cross_entropy": [
        ("input", _E),
        ("target", _E),
        ("weight", None),
        ("size_average", None),
        ("ignore_index", -100),
        ("reduce", None),
        ("reduction", "mean"),
        ("label_smoothing", 0.0),
    ],
    "scaled_dot_product_attention": [
        ("query", _E),
        ("key", _E),
        ("value", _E),
        ("attn_mask", None),
        ("dropout_p", 0.0),
        ("is_causal", False),
        ("scale", None),
        ("enable_gqa", False),
    ],
    "conv2d": [
        ("input", _E),
        ("weight", _E),
        ("bias", None),
        ("stride", 1),
        ("padding", 0),
        ("dilation", 1),
        ("groups", 1),
    ],
    "group_norm": [("input", _E), ("num_groups", _E), ("weight", None), ("bias", None), ("eps", 1e-5)],
    "interpolate": [
        ("input", _E),
        ("size", None),
        ("scale_factor", None),
        ("mode", "nearest"),
        ("align_corners", None),
        ("recompute_scale_factor", None),
        ("antialias", False),
    ],
    "upsample_nearest": [("input", _E), ("size", None), ("scale_factor", None)],
}


@pytest.mark.parametrize("name", sorted(TORCH_SIGNATURES))
def test_signature_is_torchs(name):
    got = []
    for p in inspect.signature(getattr(ops, name)).parameters.values():
        assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), (name, p)
        got.append(("*" if p.kind is p.KEYWORD_ONLY else "") + p.name)
        assert p.default == TORCH_SIGNATURES[name][len(got) - 1][1], (name, p)
    assert got == [n for n, _ in TORCH_SIGNATURES[name]]


def test_nbxcert_only_ops_keep_their_own_signatures():
    assert ops.rope is elementwise.rope and ops.silu_and_mul is elementwise.silu_and_mul
    assert ops.add_rms_norm is rows.add_rmsnorm and ops.flash_attention is attention.flash_attention
    assert ops.upsample_nearest2d is vision.upsample_nearest2d
    assert ops.gelu_and_mul is elementwise.gelu_and_mul
    for name in ("decode_attention", "paged_decode_attention", "fused_moe", "dequant_matmul", "dequant_gemv"):
        assert callable(getattr(ops, name))


# --- each wrapper against the function it wraps -----------------------------------------------------------------------
def test_matrix_products():
    a, b, bias = _r(3, 5), _r(5, 4), _r(4)
    _same(ops.mm(a, b), matmul.matmul(a, b))
    _same(ops.matmul(a, b), matmul.matmul(a, b))
    _same(ops.addmm(bias, a, b, beta=0.5, alpha=2), matmul.addmm(bias, a, b, beta=0.5, alpha=2.0))
    a3, b3 = _r(2, 3, 5), _r(2, 5, 4)
    _same(ops.bmm(a3, b3), matmul.bmm(a3, b3))
    _same(ops.baddbmm(bias, a3, b3, alpha=3), matmul.baddbmm(bias, a3, b3, alpha=3.0))
    m, v = _r(4, 5), _r(5)
    _same(ops.mv(m, v), matmul.gemv(v, m.T))
    _same(ops.addmv(bias, m, v, beta=2), matmul.addmv(bias, v, m.T, beta=2.0))
    out = ops.full((3, 4), float("nan"), device=DEVICE)
    assert ops.mm(a, b, out=out) is out
    _same(out, matmul.matmul(a, b))


def test_beta_zero_ignores_input_as_torch_does():
    a, b = _r(3, 5), _r(5, 4)
    nan_bias = ops.full((4,), float("nan"), device=DEVICE)
    _same(ops.addmm(nan_bias, a, b, beta=0), matmul.matmul(a, b))


def test_matmul_ranks_and_batch_broadcast():
    v, m = _r(5), _r(5, 4)
    _same(ops.matmul(v, m), matmul.matmul(v.unsqueeze(0), m).view(4))
    w = _r(5)
    _same(ops.matmul(m.T, w), matmul.matmul(m.T, w.unsqueeze(1)).view(4))  # (4, 5) @ (5,) -> (4,)
    _same(ops.matmul(v, w), matmul.matmul(v.unsqueeze(0), w.unsqueeze(1)).view(()))
    x = _r(2, 3, 5)
    _same(ops.matmul(x, m), matmul.matmul(x.view(6, 5), m).view(2, 3, 4))
    b = _r(5, 4)
    b_batched = b.unsqueeze(0).unsqueeze(0).expand(2, 1, 5, 4)
    want = matmul.bmm(x, b.unsqueeze(0).expand(2, 5, 4)).view(2, 1, 3, 4)
    _same(ops.matmul(x.unsqueeze(1), b_batched), want)


def test_softmax_log_softmax_over_a_dim_made_last_by_a_view():
    x = _r(3, 6)
    _same(ops.softmax(x, dim=-1), rows.softmax(x))
    _same(ops.softmax(x, 1), rows.softmax(x))
    _same(ops.log_softmax(x, -1), sampling.log_softmax(x))
    xt = _r(6, 3).T  # dim 0 of xt has stride 1: a view of rows
    _same(ops.softmax(xt, dim=0), rows.softmax(xt.T).T)
    _same(ops.log_softmax(xt, dim=0), sampling.log_softmax(xt.T).T)
    _same(ops.softmax(x, None), rows.softmax(x))  # torch's dim=None rule: dim 1 of a 2-d input


def test_norms():
    x, w, b = _r(2, 3, 8), _r(8), _r(8)
    _same(ops.layer_norm(x, (8,), w, b), rows.layernorm(x, w, b, 1e-5))
    _same(ops.layer_norm(x, 8, w, b, eps=1e-3), rows.layernorm(x, w, b, 1e-3))
    ones, zeros = ops.full((8,), 1.0, device=DEVICE), ops.full((8,), 0.0, device=DEVICE)
    _same(ops.layer_norm(x, (8,)), rows.layernorm(x, ones, zeros, 1e-5))
    _same(ops.rms_norm(x, (8,), w), rows.rmsnorm(x, w, 2.0**-23))  # eps None: torch.finfo(float32).eps
    xh = _r(2, 8, dtype="float16")
    wh = _r(8, dtype="float16")
    _same(ops.rms_norm(xh, [8], wh), rows.rmsnorm(xh, wh, 2.0**-10))  # torch.finfo(float16).eps
    _same(ops.rms_norm(x, (8,), w, eps=1e-6), rows.rmsnorm(x, w, 1e-6))
    # two normalized dimensions: merged by a view, weight too
    w2 = _r(3, 8)
    _same(ops.rms_norm(x, (3, 8), w2, 1e-5), rows.rmsnorm(x.view(2, 24), w2.view(24), 1e-5).view(2, 3, 8))


def test_embedding_argmax_topk():
    table = _r(10, 4)
    ids = from_numpy(np.array([[3, 0, 9], [1, 1, 4]], np.int64))
    _same(ops.embedding(ids, table, padding_idx=0), elementwise.embedding(table, ids))
    x = _r(3, 7)
    _same(ops.argmax(x, -1), sampling.argmax(x))
    _same(ops.argmax(x, 1, keepdim=True), sampling.argmax(x).view(3, 1))
    _same(ops.argmax(x), sampling.argmax(x.view(21)))
    xt = _r(3, 7).T  # (7, 3), dim 0 of stride 1: a view of rows
    _same(ops.argmax(xt, dim=0), sampling.argmax(xt.T))
    _same(ops.argmax(xt, dim=0, keepdim=True), sampling.argmax(xt.T).view(1, 3))
    values, indices = ops.topk(x, 2)
    v, i = sampling.topk(x, 2)
    _same(values, v)
    _same(indices, i)
    got = ops.topk(xt, 2, dim=0, sorted=False)
    v, i = sampling.topk(xt.T, 2)
    _same(got.values, v.T)
    _same(got.indices, i.T)
    out = (ops.full((3, 2), float("nan"), device=DEVICE), ops.full((3, 2), -1, dtype="int64", device=DEVICE))
    assert ops.topk(x, 2, out=out)[0] is out[0]
    _same(out[1], sampling.topk(x, 2)[1])


def test_cross_entropy_reductions():
    logits = _r(5, 6)
    target = from_numpy(np.array([1, 0, -100, 5, 2], np.int64))
    per_row = sampling.cross_entropy(logits, target, -100)
    _same(ops.cross_entropy(logits, target, reduction="none"), per_row)
    losses = per_row.numpy().astype(np.float64)
    total = ops.cross_entropy(logits, target, reduction="sum")
    assert total.shape == () and np.isclose(float(total.numpy()), losses.sum(), rtol=1e-6)
    mean = ops.cross_entropy(logits, target)  # "mean": over the 4 targets not ignored
    assert mean.shape == () and np.isclose(float(mean.numpy()), losses.sum() / 4, rtol=1e-6)
    one = ops.cross_entropy(logits[0], from_numpy(np.array(1, np.int64)), reduction="none")
    _same(one, per_row[0])


def test_scaled_dot_product_attention():
    q, k, v = (_r(1, 2, 4, 16, dtype="float16") for _ in range(3))
    _same(ops.scaled_dot_product_attention(q, k, v), attention.flash_attention(q, k, v))
    _same(
        ops.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
        attention.flash_attention(q, k, v, causal=True, scale=0.3),
    )
    kg, vg = _r(1, 1, 4, 16, dtype="float16"), _r(1, 1, 4, 16, dtype="float16")
    _same(ops.scaled_dot_product_attention(q, kg, vg, enable_gqa=True), attention.flash_attention(q, kg, vg))
    q3, k3, v3 = q[0], k[0], v[0]  # 3-d: (N, L, E)
    want = attention.flash_attention(q3.unsqueeze(1), k3.unsqueeze(1), v3.unsqueeze(1)).view(2, 4, 16)
    _same(ops.scaled_dot_product_attention(q3, k3, v3), want)


def test_vision():
    x, w, bias = _r(1, 4, 5, 5, dtype="float16"), _r(6, 2, 3, 3, dtype="float16"), _r(6, dtype="float16")
    _same(ops.conv2d(x, w, bias, (1, 1), 1, 1, 2), vision.conv2d(x, w, bias, 1, 1, 1, 2))
    _same(ops.conv2d(x, w, padding="same", groups=2), vision.conv2d(x, w, None, 1, 1, 1, 2))
    _same(ops.conv2d(x[0], w, bias, groups=2), vision.conv2d(x, w, bias, 1, 0, 1, 2)[0])
    g, gw, gb = _r(2, 4, 3, 3, dtype="float16"), _r(4, dtype="float16"), _r(4, dtype="float16")
    _same(ops.group_norm(g, 2, gw, gb), vision.group_norm(g, 2, gw, gb, 1e-5))
    ones, zeros = (
        ops.full((4,), 1.0, dtype="float16", device=DEVICE),
        ops.full((4,), 0.0, dtype="float16", device=DEVICE),
    )
    _same(ops.group_norm(g, 2, eps=1e-3), vision.group_norm(g, 2, ones, zeros, 1e-3))
    _same(ops.interpolate(g, scale_factor=2), vision.upsample_nearest2d(g, 2))
    _same(ops.interpolate(g, size=(6, 9)), vision.upsample_nearest2d(g, (2, 3)))
    _same(ops.upsample_nearest(g, scale_factor=(2.0, 1.0)), vision.upsample_nearest2d(g, (2, 1)))


# --- refusals: one line, naming the argument --------------------------------------------------------------------------
_x = _r(3, 4)
_q = _r(1, 1, 2, 16, dtype="float16")
_g = _r(1, 2, 2, 2, dtype="float16")
_tgt = from_numpy(np.array([0, 1, 2], np.int64))
REFUSALS = [
    (lambda: ops.softmax(_r(4, 3).contiguous(), dim=0), ArgumentNotSupported, "dim=0"),
    (lambda: ops.log_softmax(_r(2, 3, 4), dim=1), ArgumentNotSupported, "dim=1"),
    (lambda: ops.argmax(_r(4, 3), dim=0), ArgumentNotSupported, "dim=0"),
    (lambda: ops.argmax(_r(4, 6)[:, ::2]), ArgumentNotSupported, "not a view"),
    (lambda: ops.topk(_x, 2, largest=False), ArgumentNotSupported, "largest=False"),
    (lambda: ops.embedding(_tgt, _x, max_norm=1.0), ArgumentNotSupported, "max_norm"),
    (lambda: ops.embedding(_tgt, _x, padding_idx=3), ShapeMismatch, "padding_idx"),
    (lambda: ops.cross_entropy(_x, _tgt, weight=_r(4)), ArgumentNotSupported, "weight"),
    (lambda: ops.cross_entropy(_x, _tgt, label_smoothing=0.1), ArgumentNotSupported, "label_smoothing"),
    (lambda: ops.cross_entropy(_x, _tgt, reduction="max"), ArgumentNotSupported, "reduction"),
    (lambda: ops.cross_entropy(_x, _tgt, size_average=True), ArgumentNotSupported, "size_average"),
    (lambda: ops.cross_entropy(_x, _x, reduction="none"), ArgumentNotSupported, "float target"),
    (lambda: ops.cross_entropy(_r(3, 4, 2), _tgt), ArgumentNotSupported, "dim=1"),
    (lambda: ops.scaled_dot_product_attention(_q, _q, _q, attn_mask=_q), ArgumentNotSupported, "attn_mask"),
    (lambda: ops.scaled_dot_product_attention(_q, _q, _q, dropout_p=0.1), ArgumentNotSupported, "dropout_p"),
    (
        lambda: ops.scaled_dot_product_attention(_q, _r(1, 1, 3, 16), _r(1, 1, 3, 16), is_causal=True),
        ArgumentNotSupported,
        "is_causal",
    ),
    (lambda: ops.scaled_dot_product_attention(_r(1, 2, 2, 16, dtype="float16"), _q, _q), ShapeMismatch, "enable_gqa"),
    (lambda: ops.conv2d(_g, _r(2, 2, 1, 1, dtype="float16"), stride=(1, 2)), ArgumentNotSupported, "stride"),
    (lambda: ops.conv2d(_g, _r(2, 2, 2, 2, dtype="float16"), padding="same"), ArgumentNotSupported, "padding='same'"),
    (lambda: ops.conv2d(_g, _r(2, 2, 1, 1, dtype="float16"), padding="full"), ArgumentNotSupported, "padding"),
    (lambda: ops.interpolate(_g, scale_factor=2, mode="bilinear"), ArgumentNotSupported, "mode"),
    (lambda: ops.interpolate(_g, scale_factor=1.5), ArgumentNotSupported, "scale_factor"),
    (lambda: ops.interpolate(_g, size=(3, 3)), ArgumentNotSupported, "size=3"),
    (lambda: ops.interpolate(_g, scale_factor=2, align_corners=False), ArgumentNotSupported, "align_corners"),
    (lambda: ops.interpolate(_g, scale_factor=2, antialias=True), ArgumentNotSupported, "antialias"),
    (lambda: ops.interpolate(_g), ArgumentNotSupported, "size and scale_factor"),
    (lambda: ops.addmm(_r(4), _x, _r(4, 4), beta=0, alpha=2), ArgumentNotSupported, "alpha=2"),
    (lambda: ops.layer_norm(_x, (3,)), ShapeMismatch, "normalized_shape"),
    (lambda: ops.rms_norm(_r(2, 6, 4)[:, ::2], (3, 4)), ArgumentNotSupported, "not a view"),
    (lambda: ops.matmul(_r(2, 4, 3).transpose(0, 1), _r(3, 2)), ArgumentNotSupported, "input"),
    (lambda: ops.matmul(_x, _r(4, 2), out=ops.full((3, 3), 0.0, device=DEVICE)), ShapeMismatch, "out has shape"),
    (lambda: ops.mv(_x, _x), ShapeMismatch, "1-d vector"),
]


@pytest.mark.parametrize(("call", "error", "text"), REFUSALS)
def test_refusals_are_one_line_naming_the_argument(call, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace("*", r"\*")) as info:
        call()
    assert "\n" not in str(info.value)
