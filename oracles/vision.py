"""Float64 references for the vision and diffusion kernels: conv2d, group_norm (optional SiLU), upsample_nearest2d.

Pure numpy in float64, written from the definitions and sharing nothing with the kernels they judge. Every array here
is in the logical NCHW order (batch, channels, height, width) whatever the memory layout the kernel read it in: the
layout is a matter of strides, which the adapters in `kernels/vision.py` resolve when they copy values to the host.

- conv2d: an explicit sum over the kernel window. For each window position (r, s) the input pixels it sees,
  x[n, c, oh·stride - padding + r·dilation, ow·stride - padding + s·dilation] (zero outside the image), are
  multiplied by w[k, c, r, s] and summed over the group's input channels (one float64 matrix product per window
  position, numpy's or the one handed in); the R·S terms are added up in float64, then the bias. This is the textbook
  cross-correlation (torch.nn.functional.conv2d's definition), not the implicit GEMM the kernel performs. Error scale:
  the same sum of |x|·|w| (+ |bias|), so an output that cancels to near zero is judged against the size of its terms,
  widened for a float32 accumulation of R·S·C/groups terms as `oracles.matmul.growth` states it (1 for float16 and
  bfloat16 outputs at every size a UNet has).
- group_norm: per sample and group of C/groups channels, the mean and the two-pass population variance over the
  group's channels and pixels, y = (x - mean) / sqrt(var + eps) · weight[c] + bias[c], then optionally
  SiLU(y) = y · sigmoid(y). Error scale as `oracles.rows.layernorm`'s: (|x| + mean|x|) · rstd · |weight| + |bias|,
  times SiLU's Lipschitz constant (1.1, `oracles.matmul.LIPSCHITZ`) when it is applied.
- upsample_nearest2d with integer factors: out[n, c, oh, ow] = x[n, c, oh // sh, ow // sw], every value a copy.
  The reference is computed on the values handed in (the kernels' adapter hands the inputs' bit patterns read as
  integers, so the comparison is bit for bit); the error scale is 0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nbxcert.oracles.matmul import LIPSCHITZ, growth

SILU_LIPSCHITZ = LIPSCHITZ["silu"]


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """The output extent of a convolution along one axis (torch.nn.Conv2d's formula)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv2d(
    x,
    w,
    bias=None,
    *,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
    acc_eps: float,
    out_eps: float,
    product: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul,
) -> tuple[np.ndarray, np.ndarray]:
    """The cross-correlation of x [N, C, H, W] with w [K, C/groups, R, S] (+ bias [K]) and its error scale, both
    [N, K, OH, OW] float64 (module docstring). `acc_eps`, `out_eps`: the accumulator's and the output's epsilons;
    `product`: the float64 matrix product each window position's sum over channels is (numpy's by default)."""
    x, w = _f64(x), _f64(w)
    n, c, h, wd = x.shape
    k, cg, r_size, s_size = w.shape
    if c % groups or k % groups or cg != c // groups:
        raise ValueError(f"conv2d: x has {c} channels, w {w.shape}, groups {groups}: shapes do not agree")
    oh = out_size(h, r_size, stride, padding, dilation)
    ow = out_size(wd, s_size, stride, padding, dilation)
    # channels last, so that each window position's sum over a group's channels is one matrix product
    xp = np.zeros((n, h + 2 * padding, wd + 2 * padding, c))
    xp[:, padding : padding + h, padding : padding + wd] = x.transpose(0, 2, 3, 1)
    kg = k // groups
    value = np.zeros((n, oh, ow, k))
    scale = np.zeros((n, oh, ow, k))
    for g in range(groups):
        xg = xp[..., g * cg : (g + 1) * cg]
        wg = w[g * kg : (g + 1) * kg]
        for r in range(r_size):
            for s in range(s_size):
                top, left = r * dilation, s * dilation
                # the input pixels window position (r, s) sees, one row per output pixel: [N·OH·OW, Cg]
                rows = slice(top, top + stride * (oh - 1) + 1, stride)
                cols = slice(left, left + stride * (ow - 1) + 1, stride)
                seen = np.ascontiguousarray(xg[:, rows, cols]).reshape(n * oh * ow, cg)
                tap = np.ascontiguousarray(wg[:, :, r, s].T)  # [Cg, Kg]
                out = (n, oh, ow, kg)
                value[..., g * kg : (g + 1) * kg] += product(seen, tap).reshape(out)
                scale[..., g * kg : (g + 1) * kg] += product(np.abs(seen), np.abs(tap)).reshape(out)
    value, scale = value.transpose(0, 3, 1, 2), scale.transpose(0, 3, 1, 2)
    if bias is not None:
        b = _f64(bias)[None, :, None, None]
        value = value + b
        scale = scale + np.abs(b)
    return value, scale * growth(cg * r_size * s_size, acc_eps, out_eps)


def group_norm(x, groups: int, weight, bias, eps: float, silu: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """GroupNorm of x [N, C, H, W] over `groups` groups of channels (two-pass population variance), affine per
    channel, then SiLU when `silu`; and its error scale (module docstring)."""
    x, w, b = _f64(x), _f64(weight), _f64(bias)
    n, c, h, wd = x.shape
    if c % groups:
        raise ValueError(f"group_norm: {groups} groups do not divide {c} channels")
    xg = x.reshape(n, groups, (c // groups) * h * wd)
    size = xg.shape[-1]
    mean = xg.sum(axis=-1, keepdims=True) / size
    var = ((xg - mean) ** 2).sum(axis=-1, keepdims=True) / size
    rstd = 1.0 / np.sqrt(var + eps)
    mean_abs = np.abs(xg).sum(axis=-1, keepdims=True) / size
    normed = ((xg - mean) * rstd).reshape(x.shape)
    y = normed * w[None, :, None, None] + b[None, :, None, None]
    spread = ((np.abs(xg) + mean_abs) * rstd).reshape(x.shape)
    scale = spread * np.abs(w)[None, :, None, None] + np.abs(b)[None, :, None, None]
    if silu:
        e = np.exp(-np.abs(y))
        sigmoid = np.where(y >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        return y * sigmoid, SILU_LIPSCHITZ * scale
    return y, scale


def upsample_nearest2d(x, scale_h: int, scale_w: int) -> tuple[np.ndarray, np.ndarray]:
    """Nearest-neighbour upsampling of x [N, C, H, W] by integer factors: every pixel repeated scale_h times down and
    scale_w times across; error scale 0 (every output is a copy)."""
    x = _f64(x)
    out = np.repeat(np.repeat(x, int(scale_h), axis=2), int(scale_w), axis=3)
    return out, np.zeros(out.shape)
