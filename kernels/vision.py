"""Vision and diffusion kernels: conv2d (implicit GEMM), group_norm (optional SiLU) and upsample_nearest2d, ending in
validated `KernelSpec`s.

Tensors are logically NCHW (batch, channels, height, width), as torch's are; the memory layout is a matter of
strides, as torch's `channels_last` is: `nchw` (contiguous) or `nhwc` (channels innermost: strides (H·W·C, 1, W·C,
C)). Outputs are made in the input's layout. The layout is an exact key field of every spec (it decides which loads
are contiguous, so the best config differs), and the kernels read every tensor through its strides.

Specs (stable certificate names):

- `conv2d`     y = x ⋆ w (+ bias): cross-correlation of x [N, C, H, W] with w [K, C/groups, R, S], stride, padding and
               dilation (the same along both axes), groups; float16 / bfloat16 (w, bias and y as x), products
               accumulated in float32 on tensor cores, rounded once into y.
- `group_norm` GroupNorm over `groups` groups of C/groups channels x H x W pixels, affine per channel (weight and bias
               as x), optionally followed by SiLU; float16 / bfloat16 computed in float32, float32 in float64 (as the
               row norms, `kernels/rows.py`, whose certification tolerance is one float32 epsilon).
- `upsample_nearest2d`
               out[n, c, oh, ow] = x[n, c, oh // sh, ow // sw] for integer factors sh, sw. The kernel copies bit
               patterns (it reads the storage as int16 / int32), so its output is certified bit-exact: the spec's
               output is the output's bits (`out_bits`, int16 for 16-bit types, int32 for float32), which the
               comparison requires to be equal (integer outputs have tolerance 0).

conv2d as an implicit GEMM: the product of the [N·OH·OW, C/groups·R·S] matrix of input windows (never formed) with
the [C/groups·R·S, K/groups] weight matrix, per group. A program owns BLOCK_M output pixels x BLOCK_N output channels
of one group (grid: pixel tiles x channel tiles in grouped launch order, `common.tile_coords`, x groups) and walks
the reduction in one flat loop over (r, s, channel chunk of BLOCK_K): for each step it gathers the [BLOCK_M, BLOCK_K]
input tile the window position (r, s) sees (masked outside the image and past the group's channels) and the
[BLOCK_K, BLOCK_N] weight tile, and accumulates their `tl.dot` in float32. The flat loop (rather than nested loops
over r, s and chunks) lets Triton's pipeliner prefetch across window positions. Candidates: torch inductor's conv
templates' tiles (`conv_configs`), plus unpipelined tiles for compute capability 7.x, in a grouped launch order
(`GROUP_M`). Prune (device facts only): num_stages over `max_num_stages`, threads over `max_threads_per_block`, the
shared-memory estimate (`conv_smem_estimate`) over `max_shared_memory_per_block_optin`.

group_norm variants (config field `VARIANT`):
- `loop`: one program per (sample, group) walks the group in BLOCK tiles three times: the sum, the sum of squared
  deviations from the mean (two-pass), then normalise, scale, shift (and SiLU) and store.
- `split`: a group is split into BLOCK-element chunks, one program each (many more programs: a Stable Diffusion
  group at 64 x 64 pixels is 40960 elements, and a batch of 2 has only 64 groups). Step 1 writes each chunk's mean
  and sum of squared deviations from it (two-pass within the chunk) to a workspace; step 2 combines a group's chunks
  in a fixed order (Chan, Golub and LeVeque's pairwise update, written for all chunks at once: M2 = Σ M2_j +
  Σ n_j (mean_j - mean)²; every program of a group computes the same values in the same order, so they agree to
  the bit) and writes its chunk.
Element e of a group is channel e // (H·W), pixel e mod (H·W) for nchw and pixel e // (C/groups), channel
e mod (C/groups) for nhwc, so consecutive lanes read consecutive addresses in both layouts where the layout allows.
Prune: lanes (a tile holds at least num_warps x warp_size elements), registers of the live tiles (counted for the
float32 compute path, as `kernels/rows.py`), the reductions' shared scratch, and for `split` the chunk statistics'
tile (a power of two >= the group's chunks) against Triton's tile limit and the registers.

upsample_nearest2d: the output is viewed as rows of its innermost dimension (ow for nchw, c for nhwc) and a program
copies a [BLOCK_R rows, BLOCK_I columns] tile; each row's source row is found once per row, a column's source by a
division by the constant factor. Prune: lanes.

Which config fields change output bits: conv2d: `GROUP_M` changes none (it only permutes which program computes
which tile); the tile, BLOCK_K and warps can (they decide the float32 summation order). group_norm: every field can
(the reduction's tiling and warps decide the order of the float32 sums). upsample_nearest2d: none can (every output
is a copied bit pattern). The tests check the claims.

Keys: batch on the device file's `batch` ladder (the grid grows with it; the tiles do not change); channel counts,
spatial sizes, kernel size, stride, padding, dilation, groups, the scale factors, `bias`, `silu` and `layout` exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.common import (
    MAX_TILE,
    SCALAR_REGS,
    compute_type,
    family_spec,
    narrow,
    reduction_shared_bytes,
    tile_coords,
    upcast,
)
from nbxcert.kernels.dtypes import finfo, get_dtype
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import KernelLaunch, cdiv, next_power_of_2, served
from nbxcert.kernels.launch import run_all as _run
from nbxcert.kernels.prune import lanes_refusal, prune_with, registers_refusal, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_numpy
from nbxcert.oracles import vision as _oracle

LAYOUTS = ("nchw", "nhwc")
CONV_DTYPES = ("float16", "bfloat16")
NORM_DTYPES = ("float16", "bfloat16", "float32")
BITS_TYPE = {"float16": "int16", "bfloat16": "int16", "float32": "int32"}  # upsample copies these bit patterns
ACC_EPS = 2.0**-23  # conv2d accumulates in float32
GROUP_NORM_EPS = float(np.float32(1e-5))  # torch.nn.GroupNorm's default (and diffusers' UNet norm_eps), as float32


# ======================================================================================================================
# Triton kernels
# ======================================================================================================================
@jit
def _conv2d_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    C_G,
    H,
    W,
    K_G,
    OH,
    OW,
    M,
    stride_xn,
    stride_xc,
    stride_xh,
    stride_xw,
    stride_wk,
    stride_wc,
    stride_wr,
    stride_ws,
    stride_yn,
    stride_yk,
    stride_yh,
    stride_yw,
    R: tl.constexpr,
    S: tl.constexpr,
    STRIDE: tl.constexpr,
    PAD: tl.constexpr,
    DIL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """y[:, g·K_G:(g+1)·K_G] = x[:, g·C_G:(g+1)·C_G] ⋆ w[g·K_G:(g+1)·K_G] (+ bias) for one group g = program_id(1).
    Grid: (cdiv(M, BLOCK_M) · cdiv(K_G, BLOCK_N), groups).

    x_ptr: x [N, C, H, W] at strides stride_x* (any layout). w_ptr: w [K, C_G, R, S] at strides stride_w*. bias_ptr:
    [K] (contiguous), read only when HAS_BIAS. y_ptr: y [N, K, OH, OW] at strides stride_y*, written (masked past M
    pixels and K_G channels). C_G, K_G: input and output channels per group. H, W: input size; OH, OW: output size.
    M: N·OH·OW, the output pixels. R, S: kernel height and width. STRIDE, PAD, DIL: stride, zero padding and
    dilation, the same along both axes. UPCAST: the interpreter (its tl.dot reads bfloat16 storage as integers, and
    its float32 -> bfloat16 cast truncates: `common.narrow`). BLOCK_M, BLOCK_N: output pixels x output channels per
    program; BLOCK_K: input channels per reduction step; GROUP_M: pixel tiles per launch-order group (no output bit).
    """
    pid = tl.program_id(0)
    g = tl.program_id(1)
    pid_m, pid_n = tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(K_G, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    n = offs_m // (OH * OW)
    pix = offs_m % (OH * OW)
    oh = pix // OW
    ow = pix % OW
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < K_G
    ih0 = oh * STRIDE - PAD
    iw0 = ow * STRIDE - PAD
    x_rows = x_ptr + n.to(tl.int64) * stride_xn + (g * C_G).to(tl.int64) * stride_xc
    w_cols = w_ptr + (g * K_G + offs_n).to(tl.int64) * stride_wk
    offs_k = tl.arange(0, BLOCK_K)
    chunks = tl.cdiv(C_G, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, R * S * chunks):
        rs = step // chunks
        c = (step % chunks) * BLOCK_K + offs_k
        c_ok = c < C_G
        r = rs // S
        s = rs % S
        ih = ih0 + r * DIL
        iw = iw0 + s * DIL
        seen = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a_ptrs = x_rows[:, None] + (ih * stride_xh + iw * stride_xw)[:, None] + c[None, :] * stride_xc
        a = tl.load(a_ptrs, mask=seen[:, None] & c_ok[None, :], other=0.0)
        b_ptrs = w_cols[None, :] + c[:, None] * stride_wc + r * stride_wr + s * stride_ws
        b = tl.load(b_ptrs, mask=c_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + g * K_G + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = (
        y_ptr
        + (n.to(tl.int64) * stride_yn + oh * stride_yh + ow * stride_yw)[:, None]
        + (g * K_G + offs_n).to(tl.int64)[None, :] * stride_yk
    )
    tl.store(y_ptrs, narrow(acc, y_ptr.dtype.element_ty, UPCAST), mask=m_ok[:, None] & n_ok[None, :])


@jit
def _group_offsets(e, HW, C_G, stride_c, stride_p, CHANNELS_LAST: tl.constexpr):
    """(element offsets, channel within the group) of group elements e: nchw walks channel-major (e // HW is the
    channel), nhwc pixel-major (e mod C_G is the channel), so consecutive elements are adjacent in memory."""
    if CHANNELS_LAST:
        c = e % C_G
        p = e // C_G
    else:
        c = e // HW
        p = e % HW
    return c.to(tl.int64) * stride_c + p.to(tl.int64) * stride_p, c


@jit
def _gn_write(
    x, y_ptr, y_off, w_ptr, b_ptr, ch, ok, mean, rstd, SILU: tl.constexpr, CDT: tl.constexpr, UPCAST: tl.constexpr
):
    """Normalise the loaded group elements x (CDT, valid where ok), scale and shift them by their channels' (ch)
    weight and bias, apply SiLU when SILU, and store them at y_ptr + y_off (y_ptr at the sample and group, y_off as
    `_group_offsets` gives them)."""
    wt = tl.load(w_ptr + ch, mask=ok, other=0.0).to(CDT)
    bs = tl.load(b_ptr + ch, mask=ok, other=0.0).to(CDT)
    y = (x - mean) * rstd * wt + bs
    if SILU:
        ez = tl.exp(-tl.abs(y))
        y = y * tl.where(y >= 0, 1.0 / (1.0 + ez), ez / (1.0 + ez))
    tl.store(y_ptr + y_off, narrow(y, y_ptr.dtype.element_ty, UPCAST), mask=ok)


@jit
def _group_norm_loop_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    b_ptr,
    GROUPS,
    C_G,
    HW,
    eps,
    stride_xn,
    stride_xc,
    stride_xp,
    stride_yn,
    stride_yc,
    stride_yp,
    SILU: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
    BLOCK: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """GroupNorm of one (sample, group) = program_id(0) // GROUPS, program_id(0) mod GROUPS, in three passes over
    BLOCK tiles: the sum, the sum of squared deviations from the mean, then normalise and store. Grid: (N·GROUPS,).

    x_ptr, y_ptr: [N, C, H, W] input and output at their strides, the pixels H·W mergeable into one axis of stride
    stride_*p (stride_h = W·stride_w). w_ptr, b_ptr: [C] weight and bias. C_G: channels per group. HW: pixels. eps:
    float32. SILU: apply SiLU after the affine. CHANNELS_LAST: the nhwc element order (`_group_offsets`). BLOCK: the
    tile. CDT: compute type (float32 for half precision, float64 for float32). UPCAST: the interpreter. Live tiles at
    the peak: the accumulator, the loaded tile, the element index and its channel/pixel split (+ weight and bias in
    the last pass)."""
    pid = tl.program_id(0)
    n = pid // GROUPS
    g = pid % GROUPS
    x_base = x_ptr + n.to(tl.int64) * stride_xn + (g * C_G).to(tl.int64) * stride_xc
    y_base = y_ptr + n.to(tl.int64) * stride_yn + (g * C_G).to(tl.int64) * stride_yc
    size = C_G * HW
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], CDT)
    for start in range(0, size, BLOCK):
        e = start + lanes
        off, _ = _group_offsets(e, HW, C_G, stride_xc, stride_xp, CHANNELS_LAST)
        acc += tl.load(x_base + off, mask=e < size, other=0.0).to(CDT)
    mean = tl.sum(acc, axis=0) / size
    acc2 = tl.zeros([BLOCK], CDT)
    for start in range(0, size, BLOCK):
        e = start + lanes
        ok = e < size
        off, _ = _group_offsets(e, HW, C_G, stride_xc, stride_xp, CHANNELS_LAST)
        d = tl.where(ok, tl.load(x_base + off, mask=ok, other=0.0).to(CDT) - mean, 0.0)
        acc2 += d * d
    rstd = tl.math.rsqrt(tl.sum(acc2, axis=0) / size + eps)
    for start in range(0, size, BLOCK):
        e = start + lanes
        ok = e < size
        x_off, c = _group_offsets(e, HW, C_G, stride_xc, stride_xp, CHANNELS_LAST)
        y_off, _ = _group_offsets(e, HW, C_G, stride_yc, stride_yp, CHANNELS_LAST)
        x = tl.load(x_base + x_off, mask=ok, other=0.0).to(CDT)
        _gn_write(x, y_base, y_off, w_ptr, b_ptr, g * C_G + c, ok, mean, rstd, SILU, CDT, UPCAST)


@jit
def _group_norm_stats_kernel(
    x_ptr,
    ws_ptr,
    GROUPS,
    C_G,
    HW,
    n_chunks,
    stride_xn,
    stride_xc,
    stride_xp,
    CHANNELS_LAST: tl.constexpr,
    BLOCK: tl.constexpr,
    CDT: tl.constexpr,
):
    """Split GroupNorm, step 1: program (group row, chunk) writes its chunk's mean and sum of squared deviations from
    that mean (two-pass within the chunk) to ws[(row · n_chunks + chunk) · 2 + {0, 1}] (CDT). A chunk is one BLOCK
    tile of the group's elements; arguments as `_group_norm_loop_kernel`. Grid: (N·GROUPS, n_chunks)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n = row // GROUPS
    g = row % GROUPS
    x_base = x_ptr + n.to(tl.int64) * stride_xn + (g * C_G).to(tl.int64) * stride_xc
    size = C_G * HW
    e = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = e < size
    count = tl.minimum(size - chunk * BLOCK, BLOCK)
    off, _ = _group_offsets(e, HW, C_G, stride_xc, stride_xp, CHANNELS_LAST)
    x = tl.load(x_base + off, mask=ok, other=0.0).to(CDT)
    mean = tl.sum(x, axis=0) / count
    d = tl.where(ok, x - mean, 0.0)
    m2 = tl.sum(d * d, axis=0)
    base = ws_ptr + (row.to(tl.int64) * n_chunks + chunk) * 2
    tl.store(base, mean)
    tl.store(base + 1, m2)


@jit
def _group_norm_apply_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    b_ptr,
    ws_ptr,
    GROUPS,
    C_G,
    HW,
    n_chunks,
    eps,
    stride_xn,
    stride_xc,
    stride_xp,
    stride_yn,
    stride_yc,
    stride_yp,
    SILU: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
    CDT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Split GroupNorm, step 2: program (group row, chunk) combines all the group's chunk statistics (the same values
    in the same order in every program of the group), then normalises and stores its own chunk. CHUNKS: a power of
    two >= n_chunks (the statistics' tile). Other arguments as `_group_norm_loop_kernel`. Grid: (N·GROUPS,
    n_chunks)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n = row // GROUPS
    g = row % GROUPS
    size = C_G * HW
    j = tl.arange(0, CHUNKS)
    j_ok = j < n_chunks
    stats = ws_ptr + (row.to(tl.int64) * n_chunks + j) * 2
    mean_j = tl.load(stats, mask=j_ok, other=0.0)
    m2_j = tl.load(stats + 1, mask=j_ok, other=0.0)
    count_j = tl.where(j_ok, tl.minimum(size - j * BLOCK, BLOCK), 0).to(CDT)
    mean = tl.sum(count_j * mean_j, axis=0) / size
    dev = mean_j - mean
    m2 = tl.sum(m2_j, axis=0) + tl.sum(count_j * dev * dev, axis=0)
    rstd = tl.math.rsqrt(m2 / size + eps)
    x_base = x_ptr + n.to(tl.int64) * stride_xn + (g * C_G).to(tl.int64) * stride_xc
    y_base = y_ptr + n.to(tl.int64) * stride_yn + (g * C_G).to(tl.int64) * stride_yc
    e = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = e < size
    x_off, c = _group_offsets(e, HW, C_G, stride_xc, stride_xp, CHANNELS_LAST)
    y_off, _ = _group_offsets(e, HW, C_G, stride_yc, stride_yp, CHANNELS_LAST)
    x = tl.load(x_base + x_off, mask=ok, other=0.0).to(CDT)
    _gn_write(x, y_base, y_off, w_ptr, b_ptr, g * C_G + c, ok, mean, rstd, SILU, CDT, UPCAST)


@jit
def _upsample_nearest2d_kernel(
    x_ptr,
    y_ptr,
    ROWS,
    INNER,
    D1,
    D2,
    stride_x0,
    stride_x1,
    stride_x2,
    stride_xi,
    stride_y0,
    stride_y1,
    stride_y2,
    stride_yi,
    SCALE_1: tl.constexpr,
    SCALE_2: tl.constexpr,
    SCALE_I: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    """Copy the bit patterns of nearest-neighbour upsampling. Grid: (cdiv(ROWS, BLOCK_R), cdiv(INNER, BLOCK_I)).

    The output is viewed as [D0, D1, D2, INNER] (nchw: N, C, OH, OW; nhwc: N, OH, OW, C) with ROWS = D0·D1·D2 rows;
    output index (i0, i1, i2, ii) reads input index (i0, i1 // SCALE_1, i2 // SCALE_2, ii // SCALE_I) (each factor 1
    on the axes that are not upsampled). x_ptr, y_ptr: input and output storage read as integers of the element's
    width, at strides stride_x* / stride_y* of those four axes. BLOCK_R rows x BLOCK_I columns per program."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    i2 = rows % D2
    i1 = (rows // D2) % D1
    i0 = rows // (D2 * D1)
    src_row = i0 * stride_x0 + (i1 // SCALE_1) * stride_x1 + (i2 // SCALE_2) * stride_x2
    dst_row = i0 * stride_y0 + i1 * stride_y1 + i2 * stride_y2
    ok = (rows < ROWS)[:, None] & (cols < INNER)[None, :]
    v = tl.load(x_ptr + src_row[:, None] + ((cols // SCALE_I) * stride_xi)[None, :], mask=ok)
    tl.store(y_ptr + dst_row[:, None] + (cols * stride_yi)[None, :], v, mask=ok)


# ======================================================================================================================
# Configs: named factories
# ======================================================================================================================
def conv_config(bm: int, bn: int, bk: int, num_stages: int, num_warps: int, group_m: int = 8) -> Config:
    """conv2d: BLOCK_M output pixels x BLOCK_N output channels per program, BLOCK_K input channels per step."""
    return Config.make(num_warps=num_warps, num_stages=num_stages, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m)


# torch inductor's conv templates (torch/_inductor/kernel/conv.py `conv_configs`, later
# torch/_inductor/template_heuristics/triton.py `BaseConfigHeuristic.conv_configs`):
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
INDUCTOR_CONV_TILES = (
    (64, 256, 16, 2, 4),
    (256, 64, 16, 2, 4),
    (1024, 16, 16, 1, 8),
    (128, 128, 32, 2, 8),
    (64, 64, 32, 2, 4),
    (64, 256, 32, 2, 8),
    (256, 64, 32, 2, 8),
    (128, 128, 64, 3, 8),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
)
# num_stages 1 for compute capability 7.x (no cp.async: the device files state max_num_stages = 1 there)
UNPIPELINED_CONV_TILES = ((64, 64, 32, 1, 4), (128, 128, 32, 1, 8), (128, 64, 64, 1, 4))


def conv_candidates() -> tuple[Config, ...]:
    """Inductor's conv tiles and three unpipelined tiles, grouped launch order GROUP_M 8; and the untuned default
    with GROUP_M 1 (row-major launch order: better where the channel tiles are few)."""
    tiles = [conv_config(*t) for t in INDUCTOR_CONV_TILES + UNPIPELINED_CONV_TILES]
    return tuple(tiles + [conv_config(64, 64, 32, 2, 4, group_m=1)])


CONV_DEFAULT = conv_config(64, 64, 32, 2, 4)


def gn_config(variant: str, block: int, num_warps: int) -> Config:
    """group_norm: the `loop` or `split` variant with BLOCK-element tiles."""
    return Config.make(num_warps=num_warps, num_stages=1, VARIANT=variant, BLOCK=block)


def gn_candidates() -> tuple[Config, ...]:
    """loop: BLOCK {1024, 4096} x warps {4, 8, 16}; split: BLOCK {1024, 2048, 4096} x warps {4, 8}."""
    loop = [gn_config("loop", b, w) for b in (1024, 4096) for w in (4, 8, 16)]
    split = [gn_config("split", b, w) for b in (1024, 2048, 4096) for w in (4, 8)]
    return tuple(loop + split)


GN_DEFAULT = gn_config("loop", 1024, 4)
SMALLEST_SPLIT_BLOCK = 1024  # make_inputs sizes the split workspace for the most chunks any candidate makes


def upsample_config(block_r: int, block_i: int, num_warps: int) -> Config:
    """upsample_nearest2d: BLOCK_R output rows x BLOCK_I innermost elements per program."""
    return Config.make(num_warps=num_warps, num_stages=1, BLOCK_R=block_r, BLOCK_I=block_i)


def upsample_candidates() -> tuple[Config, ...]:
    """(BLOCK_R, BLOCK_I) {(1, 1024), (4, 256), (8, 128), (16, 64), (32, 64)} x warps {4, 8}: 1024 or 2048
    elements a program, shaped for rows of 64 .. 1024 (nchw: the output width; nhwc: the channels)."""
    shapes = ((1, 1024), (4, 256), (8, 128), (16, 64), (32, 64))
    return tuple(upsample_config(r, i, w) for r, i in shapes for w in (4, 8))


UPSAMPLE_DEFAULT = upsample_config(8, 128, 4)


# ======================================================================================================================
# Prune: device facts only
# ======================================================================================================================
def conv_smem_estimate(config: Config) -> int:
    """Shared memory of a conv2d config, an upper bound of Triton's figure: the pipelined input and weight tiles,
    (BLOCK_M + BLOCK_N) x BLOCK_K x 2 bytes x max(1, num_stages) (16-bit operands), or the epilogue's layout
    conversion of the float32 accumulator, BLOCK_M x BLOCK_N x 4 bytes, which reuses them (the larger of the two is
    taken, as `matmul.smem_estimate`). The census compiles every candidate and checks it."""
    p = config.params
    pipeline = (p["BLOCK_M"] + p["BLOCK_N"]) * p["BLOCK_K"] * 2 * max(1, config.num_stages)
    return max(pipeline, p["BLOCK_M"] * p["BLOCK_N"] * 4)


def prune_conv2d(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse conv tiles over the device's shared memory (`conv_smem_estimate`), pipelining depth or threads."""
    return prune_with(candidates, profile, lambda c: shared_memory_refusal(conv_smem_estimate(c), profile))


# 32-bit registers per tile element live at the peak on the float32 path, counted from the kernels: the loop
# variant's last pass holds the element index, its channel, the loaded value, the weight and the bias, beside the
# second pass's accumulator (the index split and the offsets are recomputed, not held, in the first passes); the
# split variant's tile the same without an accumulator. The statistics' tile: mean, M2 and count per chunk.
GN_TILE_REGS = 6
GN_STATS_REGS = 3


def group_size(problem: Mapping[str, Any]) -> int:
    """Elements of one (sample, group): C / groups x H x W."""
    return int(problem["C"]) // max(1, int(problem["groups"])) * int(problem["H"]) * int(problem["W"])


def prune_group_norm(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse group_norm configs with warps that hold no element of their own, tiles over a thread's registers, or
    (split) a chunk-statistics tile over Triton's tile limit or the registers."""
    size = group_size(problem)

    def check(c: Config) -> str | None:
        block = c["BLOCK"]
        reason = (
            shared_memory_refusal(reduction_shared_bytes(c), profile)
            or lanes_refusal(block, c, profile, "group tile")
            or registers_refusal(block, GN_TILE_REGS, c, profile, f"a group tile of {block} elements", SCALAR_REGS)
        )
        if reason or c["VARIANT"] != "split":
            return reason
        chunks = next_power_of_2(cdiv(max(1, size), block))
        if chunks > MAX_TILE:
            return f"split: {chunks} chunk statistics > TRITON_MAX_TENSOR_NUMEL={MAX_TILE}"
        return registers_refusal(
            chunks + block, GN_TILE_REGS, c, profile, f"split: {chunks} chunk statistics and a tile", SCALAR_REGS
        )

    return prune_with(candidates, profile, check)


def prune_upsample(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse upsample tiles smaller than the block's lanes (surplus warps would only copy copies)."""
    return prune_with(
        candidates, profile, lambda c: lanes_refusal(c["BLOCK_R"] * c["BLOCK_I"], c, profile, "copy tile")
    )


# ======================================================================================================================
# Layouts, checks and problems
# ======================================================================================================================
def _channels_last_strides(shape: Sequence[int]) -> tuple[int, int, int, int]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def layout_of(t: Tensor, name: str) -> str:
    """`nchw` for a contiguous [N, C, H, W] tensor, `nhwc` for a channels-last one (strides of size-1 dimensions do
    not count); `LaunchError` naming the tensor for any other strides."""
    if t.ndim != 4:
        raise ShapeMismatch(f"{name} must be 4-d [N, C, H, W], got shape {t.shape}")
    for layout, want in (("nchw", _contiguous(t.shape)), ("nhwc", _channels_last_strides(t.shape))):
        if all(size == 1 or have == expect for size, have, expect in zip(t.shape, t.strides, want, strict=False)):
            return layout
    raise LaunchError(
        f"{name}: strides {t.strides} of shape {t.shape} are neither nchw (contiguous) nor nhwc (channels last); "
        "make it contiguous first"
    )


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= size
    return tuple(reversed(out))


def empty_nchw(shape: Sequence[int], dtype: str, device, layout: str) -> Tensor:
    """An uninitialised logical [N, C, H, W] tensor stored in `layout`."""
    n, c, h, w = shape
    if layout == "nhwc":
        return empty((n, h, w, c), dtype, device).permute(0, 3, 1, 2)
    return empty((n, c, h, w), dtype, device)


def from_nchw(values: np.ndarray, dtype: str, device, layout: str) -> Tensor:
    """Logical [N, C, H, W] values as a tensor stored in `layout`."""
    if layout == "nhwc":
        return from_numpy(np.ascontiguousarray(values.transpose(0, 2, 3, 1)), dtype, device).permute(0, 3, 1, 2)
    return from_numpy(np.ascontiguousarray(values), dtype, device)


def _positive(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise LaunchError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def conv_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv2d_problem(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1, **_
) -> dict[str, Any]:
    """The key problem of a conv2d launch (checked: `ShapeMismatch` / `LaunchError` naming what does not fit)."""
    layout = layout_of(x, "conv2d: x")
    stride, dilation = _positive("conv2d: stride", stride), _positive("conv2d: dilation", dilation)
    padding, groups = _positive("conv2d: padding", padding, 0), _positive("conv2d: groups", groups)
    if x.dtype.name not in CONV_DTYPES:
        raise ShapeMismatch(f"conv2d: x has dtype {x.dtype.name}; one of {', '.join(CONV_DTYPES)} is required")
    n, c, h, w = x.shape
    if weight.ndim != 4:
        raise ShapeMismatch(f"conv2d: weight must be 4-d [K, C/groups, R, S], got shape {weight.shape}")
    k, cg, r, s = weight.shape
    if c % groups or k % groups:
        raise ShapeMismatch(f"conv2d: groups={groups} must divide the input channels {c} and output channels {k}")
    if cg != c // groups:
        raise ShapeMismatch(f"conv2d: weight {weight.shape} needs C/groups = {c // groups} input channels, has {cg}")
    if weight.dtype is not x.dtype or (bias is not None and bias.dtype is not x.dtype):
        raise ShapeMismatch(f"conv2d: weight and bias must have x's dtype {x.dtype.name}")
    if bias is not None and (bias.shape != (k,) or bias.stride(0) != 1):
        raise ShapeMismatch(f"conv2d: bias must be a contiguous ({k},) vector, got shape {bias.shape}")
    oh, ow = conv_out_size(h, r, stride, padding, dilation), conv_out_size(w, s, stride, padding, dilation)
    if oh < 1 or ow < 1 or min(n, c, k) < 1:
        raise ShapeMismatch(
            f"conv2d: input {h}x{w} with kernel {r}x{s}, stride {stride}, padding {padding}, dilation {dilation} "
            f"gives an empty output ({oh}x{ow})"
        )
    return {
        "batch": n,
        "C": c,
        "H": h,
        "W": w,
        "K": k,
        "R": r,
        "S": s,
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "groups": groups,
        "bias": int(bias is not None),
        "layout": layout,
    }


def group_norm_problem(
    x: Tensor, num_groups: int, weight: Tensor, bias: Tensor, eps: float = GROUP_NORM_EPS, silu: bool = False, **_
) -> dict[str, Any]:
    """The key problem of a group_norm launch (checked)."""
    layout = layout_of(x, "group_norm: x")
    groups = _positive("group_norm: num_groups", num_groups)
    if x.dtype.name not in NORM_DTYPES:
        raise ShapeMismatch(f"group_norm: x has dtype {x.dtype.name}; one of {', '.join(NORM_DTYPES)} is required")
    n, c, h, w = x.shape
    if c % groups:
        raise ShapeMismatch(f"group_norm: num_groups={groups} does not divide the {c} channels")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None or t.shape != (c,) or t.dtype is not x.dtype or t.stride(0) != 1:
            raise ShapeMismatch(f"group_norm: {name} must be a contiguous {x.dtype.name} ({c},) vector, got {t}")
    if min(n, c, h, w) < 1:
        raise ShapeMismatch(f"group_norm: x of shape {x.shape} is empty")
    return {"batch": n, "C": c, "H": h, "W": w, "groups": groups, "silu": int(bool(silu)), "layout": layout}


def _scale_factors(scale_factor) -> tuple[int, int]:
    pair = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor, scale_factor)
    if len(pair) != 2:
        raise LaunchError(f"upsample_nearest2d: scale_factor must be an integer or two, got {scale_factor!r}")
    return (
        _positive("upsample_nearest2d: scale_factor", pair[0]),
        _positive("upsample_nearest2d: scale_factor", pair[1]),
    )


def upsample_problem(x: Tensor, scale_factor=2, **_) -> dict[str, Any]:
    """The key problem of an upsample_nearest2d launch (checked)."""
    layout = layout_of(x, "upsample_nearest2d: x")
    sh, sw = _scale_factors(scale_factor)
    if x.dtype.name not in BITS_TYPE:
        raise ShapeMismatch(f"upsample_nearest2d: x has dtype {x.dtype.name}; one of {', '.join(BITS_TYPE)}")
    n, c, h, w = x.shape
    if min(n, c, h, w) < 1:
        raise ShapeMismatch(f"upsample_nearest2d: x of shape {x.shape} is empty")
    return {"batch": n, "C": c, "H": h, "W": w, "scale_h": sh, "scale_w": sw, "layout": layout}


def _check_out(out: Tensor | None, shape, like: Tensor, layout: str, name: str) -> Tensor:
    if out is None:
        return empty_nchw(shape, like.dtype.name, like.device, layout)
    if tuple(out.shape) != tuple(shape) or out.dtype is not like.dtype or layout_of(out, f"{name}: out") != layout:
        raise ShapeMismatch(f"{name}: out must be {like.dtype.name}{list(shape)} in the {layout} layout, got {out}")
    return out


# ======================================================================================================================
# Launches
# ======================================================================================================================
def _warps(config: Config) -> dict[str, int]:
    return {"num_warps": config.num_warps, "num_stages": config.num_stages}


def conv2d_launches(
    config: Config,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    y: Tensor,
    stride: int,
    padding: int,
    dilation: int,
    groups: int,
) -> list[KernelLaunch]:
    """The launch of one conv2d of checked operands (x [N, C, H, W], weight [K, C/groups, R, S], y [N, K, OH, OW])."""
    n, c, h, w = x.shape
    k, cg, r, s = weight.shape
    _, _, oh, ow = y.shape
    kg = k // groups
    m = n * oh * ow
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    grid = (cdiv(m, bm) * cdiv(kg, bn), groups)
    args = (x, weight, bias if bias is not None else y, y, cg, h, w, kg, oh, ow, m)
    args += tuple(x.strides) + tuple(weight.strides) + tuple(y.strides)
    kwargs = dict(R=r, S=s, STRIDE=stride, PAD=padding, DIL=dilation, HAS_BIAS=bias is not None, UPCAST=upcast())
    kwargs.update(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=config["BLOCK_K"], GROUP_M=config["GROUP_M"], **_warps(config))
    return [KernelLaunch(_conv2d_kernel, grid, args, kwargs)]


def _workspace_dtype(dtype_name: str) -> str:
    return "float64" if compute_type(dtype_name) == tl.float64 else "float32"


def split_workspace(problem: Mapping[str, Any], dtype_name: str, device, block: int = SMALLEST_SPLIT_BLOCK) -> Tensor:
    """A workspace for the split group_norm of `problem` with chunks of >= block elements."""
    rows = int(problem["batch"]) * int(problem["groups"])
    return empty((max(1, rows * cdiv(group_size(problem), block) * 2),), _workspace_dtype(dtype_name), device)


def group_norm_launches(
    config: Config,
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    y: Tensor,
    groups: int,
    eps: float,
    silu: bool,
    workspace: Tensor | None,
) -> list[KernelLaunch]:
    """The launches of one group_norm of checked operands (x, y [N, C, H, W] in one layout)."""
    n, c, h, w = x.shape
    cg, hw = c // groups, h * w
    channels_last = layout_of(x, "group_norm: x") == "nhwc"
    cdt = compute_type(x.dtype.name)
    strides = (x.stride(0), x.stride(1), x.stride(3), y.stride(0), y.stride(1), y.stride(3))
    block = config["BLOCK"]
    common = dict(CHANNELS_LAST=channels_last, BLOCK=block, CDT=cdt, **_warps(config))
    if config["VARIANT"] == "loop":
        args = (x, y, weight, bias, groups, cg, hw, float(eps)) + strides
        kwargs = dict(SILU=bool(silu), UPCAST=upcast(), **common)
        return [KernelLaunch(_group_norm_loop_kernel, (n * groups,), args, kwargs)]
    n_chunks = cdiv(cg * hw, block)
    need = n * groups * n_chunks * 2
    want = _workspace_dtype(x.dtype.name)
    if workspace is None or workspace.numel < need or workspace.dtype.name != want:
        raise LaunchError(f"group_norm split: needs a {want} workspace of >= {need} elements, got {workspace}")
    grid = (n * groups, n_chunks)
    stats_args = (x, workspace, groups, cg, hw, n_chunks) + strides[:3]
    apply_args = (x, y, weight, bias, workspace, groups, cg, hw, n_chunks, float(eps)) + strides
    apply_kwargs = dict(SILU=bool(silu), CHUNKS=next_power_of_2(n_chunks), UPCAST=upcast(), **common)
    return [
        KernelLaunch(_group_norm_stats_kernel, grid, stats_args, common),
        KernelLaunch(_group_norm_apply_kernel, grid, apply_args, apply_kwargs),
    ]


def bits_view(t: Tensor) -> Tensor:
    """The same storage, shape and strides read as the integer type of the element's width (`BITS_TYPE`)."""
    return Tensor(t.untyped_storage(), t.shape, t.strides, BITS_TYPE[t.dtype.name], t.storage_offset())


def upsample_launches(config: Config, x: Tensor, y: Tensor, scale_h: int, scale_w: int) -> list[KernelLaunch]:
    """The launch of one upsample_nearest2d of checked operands (x [N, C, H, W], y [N, C, H·sh, W·sw], one layout)."""
    n, c, oh, ow = y.shape
    xb, yb = bits_view(x), bits_view(y)
    if layout_of(x, "upsample_nearest2d: x") == "nhwc":  # axes (N, OH, OW | C)
        dims, x_axes, y_axes, scales = (n, oh, ow), (0, 2, 3, 1), (0, 2, 3, 1), (scale_h, scale_w, 1)
    else:  # axes (N, C, OH | OW)
        dims, x_axes, y_axes, scales = (n, c, oh), (0, 1, 2, 3), (0, 1, 2, 3), (1, scale_h, scale_w)
    inner = y.shape[y_axes[3]]
    rows = dims[0] * dims[1] * dims[2]
    br, bi = config["BLOCK_R"], config["BLOCK_I"]
    args = (xb, yb, rows, inner, dims[1], dims[2])
    args += tuple(x.stride(a) for a in x_axes) + tuple(y.stride(a) for a in y_axes)
    kwargs = dict(SCALE_1=scales[0], SCALE_2=scales[1], SCALE_I=scales[2], BLOCK_R=br, BLOCK_I=bi, **_warps(config))
    return [KernelLaunch(_upsample_nearest2d_kernel, (cdiv(rows, br), cdiv(inner, bi)), args, kwargs)]


# ======================================================================================================================
# User-facing functions
# ======================================================================================================================
@served
def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
    out: Tensor | None = None,
    config: Config | None = None,
) -> Tensor:
    """torch.nn.functional.conv2d for float16 / bfloat16: x [N, C, H, W] (nchw or nhwc), weight [K, C/groups, R, S]
    (any strides), bias [K] or None -> [N, K, OH, OW] in x's layout."""
    problem = conv2d_problem(x, weight, bias, stride, padding, dilation, groups)
    p = problem
    oh = conv_out_size(p["H"], p["R"], p["stride"], p["padding"], p["dilation"])
    ow = conv_out_size(p["W"], p["S"], p["stride"], p["padding"], p["dilation"])
    y = _check_out(out, (p["batch"], p["K"], oh, ow), x, p["layout"], "conv2d")

    def run(c: Config) -> None:
        _run(conv2d_launches(c, x, weight, bias, y, p["stride"], p["padding"], p["dilation"], p["groups"]))

    run(choose_config(CONV2D, problem, (x.dtype.name,), config, run=run, outputs=(y,)))
    return y


@served
def group_norm(
    x: Tensor,
    num_groups: int,
    weight: Tensor,
    bias: Tensor,
    eps: float = GROUP_NORM_EPS,
    silu: bool = False,
    out: Tensor | None = None,
    config: Config | None = None,
) -> Tensor:
    """torch.nn.functional.group_norm (then SiLU when `silu`) of x [N, C, H, W] (nchw or nhwc) with weight and bias
    [C] of x's dtype -> y like x. eps is used as float32."""
    problem = group_norm_problem(x, num_groups, weight, bias, eps, silu)
    y = _check_out(out, x.shape, x, problem["layout"], "group_norm")

    def run(c: Config) -> None:
        ws = split_workspace(problem, x.dtype.name, x.device, c["BLOCK"]) if c["VARIANT"] == "split" else None
        _run(group_norm_launches(c, x, weight, bias, y, problem["groups"], eps, silu, ws))

    run(choose_config(GROUP_NORM, problem, (x.dtype.name,), config, run=run, outputs=(y,)))
    return y


@served
def upsample_nearest2d(x: Tensor, scale_factor=2, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """torch.nn.functional.interpolate(x, scale_factor=..., mode="nearest") for integer factors (one, or (sh, sw)):
    x [N, C, H, W] (nchw or nhwc) -> [N, C, H·sh, W·sw] in x's layout, a bit-exact copy of x's values."""
    problem = upsample_problem(x, scale_factor)
    sh, sw = problem["scale_h"], problem["scale_w"]
    y = _check_out(
        out,
        (problem["batch"], problem["C"], problem["H"] * sh, problem["W"] * sw),
        x,
        problem["layout"],
        "upsample_nearest2d",
    )

    def run(c: Config) -> None:
        _run(upsample_launches(c, x, y, sh, sw))

    run(choose_config(UPSAMPLE_NEAREST2D, problem, (x.dtype.name,), config, run=run, outputs=(y,)))
    return y


# ======================================================================================================================
# Inputs and oracle adapters
# ======================================================================================================================
def conv2d_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    """x ~ N(0, 1); w ~ N(0, 1) / sqrt(C/groups · R · S) (outputs of order 1 at any fan-in, far inside float16's
    range); bias ~ N(0, 0.5²) when the problem has one; all stored in the problem's layout."""
    p = {k: problem[k] for k in CONV_PROBLEM}
    dtype, layout = dtypes[0], str(p["layout"])
    n, c, h, w, k, r, s, g = (int(p[f]) for f in ("batch", "C", "H", "W", "K", "R", "S", "groups"))
    gen = _inputs.rng(seed)
    cg = c // g
    tensors = {
        "x": from_nchw(gen.standard_normal((n, c, h, w)), dtype, device, layout),
        "weight": from_nchw(gen.standard_normal((k, cg, r, s)) / np.sqrt(cg * r * s), dtype, device, layout),
    }
    if int(p["bias"]):
        tensors["bias"] = from_numpy(0.5 * gen.standard_normal(k), dtype, device)
    oh = conv_out_size(h, r, int(p["stride"]), int(p["padding"]), int(p["dilation"]))
    ow = conv_out_size(w, s, int(p["stride"]), int(p["padding"]), int(p["dilation"]))
    tensors["y"] = empty_nchw((n, k, oh, ow), dtype, device, layout)
    scalars = {f: int(p[f]) for f in ("stride", "padding", "dilation", "groups")}
    return Inputs(tensors, scalars, ("y",), dict(problem))


def _conv2d_launch(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    _run(
        conv2d_launches(
            config, t["x"], t["weight"], t.get("bias"), t["y"], s["stride"], s["padding"], s["dilation"], s["groups"]
        )
    )


def _conv2d_oracle(inputs: Inputs) -> dict[str, Reference]:
    from nbxcert.kernels.products import product_for  # the oracle's float64 product: host or GPU

    t, s = inputs.tensors, inputs.scalars
    value, scale = _oracle.conv2d(
        t["x"].float64(),
        t["weight"].float64(),
        t["bias"].float64() if "bias" in t else None,
        stride=s["stride"],
        padding=s["padding"],
        dilation=s["dilation"],
        groups=s["groups"],
        acc_eps=ACC_EPS,
        out_eps=finfo(get_dtype(t["y"].dtype.name))["eps"],
        product=product_for(t["y"].device),
    )
    return {"y": Reference(value, scale)}


def group_norm_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    """x ~ 2·N(0, 1) + a per-channel offset N(0, 1) (groups whose mean is not 0); weight ~ 1 + N(0, 0.5²), bias ~
    N(0, 0.5²); x and y in the problem's layout; a split workspace for the smallest split tile."""
    n, c, h, w, g = (int(problem[f]) for f in ("batch", "C", "H", "W", "groups"))
    dtype, layout = dtypes[0], str(problem["layout"])
    gen = _inputs.rng(seed)
    values = 2.0 * gen.standard_normal((n, c, h, w)) + gen.standard_normal((1, c, 1, 1))
    tensors = {
        "x": from_nchw(values, dtype, device, layout),
        "weight": from_numpy(1.0 + 0.5 * gen.standard_normal(c), dtype, device),
        "bias": from_numpy(0.5 * gen.standard_normal(c), dtype, device),
        "y": empty_nchw((n, c, h, w), dtype, device, layout),
        "workspace": split_workspace(problem, dtype, device),
    }
    scalars = {"groups": g, "eps": GROUP_NORM_EPS, "silu": bool(int(problem["silu"]))}
    return Inputs(tensors, scalars, ("y",), dict(problem))


def _group_norm_launch(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    _run(
        group_norm_launches(
            config, t["x"], t["weight"], t["bias"], t["y"], s["groups"], s["eps"], s["silu"], t["workspace"]
        )
    )


def _group_norm_oracle(inputs: Inputs) -> dict[str, Reference]:
    t, s = inputs.tensors, inputs.scalars
    value, scale = _oracle.group_norm(
        t["x"].float64(),
        s["groups"],
        t["weight"].float64(),
        t["bias"].float64(),
        float(np.float32(s["eps"])),
        s["silu"],
    )
    return {"y": Reference(value, scale)}


def upsample_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    """x ~ N(0, 1) in the problem's layout, its bits (`x_bits`), the output y and its bits (`out_bits`, the output the
    comparison judges: equal integers, so the copy is certified bit for bit)."""
    n, c, h, w = (int(problem[f]) for f in ("batch", "C", "H", "W"))
    sh, sw = int(problem["scale_h"]), int(problem["scale_w"])
    dtype, layout = dtypes[0], str(problem["layout"])
    gen = _inputs.rng(seed)
    x = from_nchw(gen.standard_normal((n, c, h, w)), dtype, device, layout)
    y = empty_nchw((n, c, h * sh, w * sw), dtype, device, layout)
    tensors = {"x": x, "x_bits": bits_view(x), "y": y, "out_bits": bits_view(y)}
    return Inputs(tensors, {"scale_h": sh, "scale_w": sw}, ("out_bits",), dict(problem))


def _upsample_launch(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    _run(upsample_launches(config, t["x"], t["y"], s["scale_h"], s["scale_w"]))


def _upsample_oracle(inputs: Inputs) -> dict[str, Reference]:
    s = inputs.scalars
    value, scale = _oracle.upsample_nearest2d(inputs.tensors["x_bits"].float64(), s["scale_h"], s["scale_w"])
    return {"out_bits": Reference(value, scale)}


def _same(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0],)


def _bits(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (BITS_TYPE[dtypes[0]],)


# ======================================================================================================================
# Specs
# ======================================================================================================================
CONV_PROBLEM = ("batch", "C", "H", "W", "K", "R", "S", "stride", "padding", "dilation", "groups", "bias", "layout")
GN_PROBLEM = ("batch", "C", "H", "W", "groups", "silu", "layout")
UPSAMPLE_PROBLEM = ("batch", "C", "H", "W", "scale_h", "scale_w", "layout")


def _key(problem_args: Sequence[str]) -> tuple[KeyField, ...]:
    return tuple(KeyField(f, "batch" if f == "batch" else None) for f in problem_args)


def conv_problem_dict(batch, C, H, W, K, R, S, stride=1, padding=0, dilation=1, groups=1, bias=1, layout="nchw"):
    """A conv2d problem from its fields (the workloads and tests write them this way)."""
    values = (batch, C, H, W, K, R, S, stride, padding, dilation, groups, int(bias), layout)
    return dict(zip(CONV_PROBLEM, values, strict=False))


CONV_EXAMPLES = (
    conv_problem_dict(1, 8, 6, 6, 8, 3, 3, padding=1, bias=1, layout="nchw"),
    conv_problem_dict(2, 8, 7, 5, 16, 1, 1, bias=0, layout="nhwc"),
    conv_problem_dict(1, 8, 6, 6, 8, 3, 3, stride=2, padding=2, dilation=2, groups=2, bias=1, layout="nhwc"),
)
GN_EXAMPLES = (
    {"batch": 2, "C": 8, "H": 6, "W": 6, "groups": 2, "silu": 1, "layout": "nchw"},
    {"batch": 1, "C": 12, "H": 5, "W": 7, "groups": 3, "silu": 0, "layout": "nhwc"},
)
UPSAMPLE_EXAMPLES = (
    {"batch": 1, "C": 8, "H": 6, "W": 6, "scale_h": 2, "scale_w": 2, "layout": "nchw"},
    {"batch": 2, "C": 5, "H": 3, "W": 4, "scale_h": 3, "scale_w": 2, "layout": "nhwc"},
)

CONV2D = family_spec(
    "vision",
    "conv2d",
    "2-d cross-correlation (implicit GEMM), nchw/nhwc, stride, padding, dilation, groups, bias",
    (_conv2d_kernel,),
    problem_args=CONV_PROBLEM,
    key_fields=_key(CONV_PROBLEM),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in CONV_DTYPES),
    output_dtypes=_same,
    tuning=(conv_candidates(), CONV_DEFAULT, prune_conv2d),
    parts=(conv2d_inputs, _conv2d_launch, _conv2d_oracle, conv2d_problem),
    no_bit_fields=("GROUP_M",),
    examples=CONV_EXAMPLES,
)
GROUP_NORM = family_spec(
    "vision",
    "group_norm",
    "GroupNorm (two-pass variance, affine per channel), optional SiLU, nchw/nhwc; loop and split",
    (_group_norm_loop_kernel, _group_norm_stats_kernel, _group_norm_apply_kernel),
    problem_args=GN_PROBLEM,
    key_fields=_key(GN_PROBLEM),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in NORM_DTYPES),
    output_dtypes=_same,
    tuning=(gn_candidates(), GN_DEFAULT, prune_group_norm),
    parts=(group_norm_inputs, _group_norm_launch, _group_norm_oracle, group_norm_problem),
    examples=GN_EXAMPLES,
)
UPSAMPLE_NEAREST2D = family_spec(
    "vision",
    "upsample_nearest2d",
    "nearest-neighbour upsampling by integer factors, nchw/nhwc, a bit-exact copy",
    (_upsample_nearest2d_kernel,),
    problem_args=UPSAMPLE_PROBLEM,
    key_fields=_key(UPSAMPLE_PROBLEM),
    dtype_args=("x",),
    dtypes=tuple((d,) for d in BITS_TYPE),
    output_dtypes=_bits,
    tuning=(upsample_candidates(), UPSAMPLE_DEFAULT, prune_upsample),
    parts=(upsample_inputs, _upsample_launch, _upsample_oracle, upsample_problem),
    no_bit_fields=("BLOCK_R", "BLOCK_I", "num_warps"),
    examples=UPSAMPLE_EXAMPLES,
)

SPECS = (CONV2D, GROUP_NORM, UPSAMPLE_NEAREST2D)

__all__ = [
    "CONV2D",
    "GROUP_NORM",
    "LAYOUTS",
    "SPECS",
    "UPSAMPLE_NEAREST2D",
    "conv2d",
    "conv_candidates",
    "gn_candidates",
    "group_norm",
    "upsample_candidates",
    "upsample_nearest2d",
]

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
