"""Quantized-weight products: out = X @ dequantize(W) for decode (`dequant_gemv`, M <= 4, SIMT) and batches
(`dequant_matmul`, tensor-core tiles), ending in validated `KernelSpec`s.

Formats (problem field `format`, an exact key field; W is the logical [K, N] weight, X [M, K] the activations):
- `int4`: GPTQ packing with group size GROUP = 128. qweight int32 [K/8, N]: weight row k is the unsigned nibble at
  bits 4 (k mod 8) of qweight[k // 8, n]; qzeros int32 [K/128, N/8]: the zero point of group g, column n, is the
  nibble at bits 4 (n mod 8) of qzeros[g, n // 8]; scales [K/128, N] in the activations' dtype.
  W[k, n] = (q[k, n] - z[k // 128, n]) * s[k // 128, n]. Zero points are stored as they are (GPTQ's first format
  stored z - 1: add 1 when converting such a checkpoint). AWQ checkpoints (qweight int32 [K, N/8] and qzeros int32
  [K/128, N/8], both packed along N with nibble i holding column 8 j + AWQ_ORDER[i]) are served after a one-time
  repack into this layout when the weights are loaded: `awq_to_gptq`.
- `int8`: per-output-channel symmetric. qweight int8 [K, N], scales [N] in the activations' dtype. W[k, n] = q[k, n]
  * s[n]; the scale is applied once to the accumulated column (exact in float32 up to that one product).
K must be a multiple of 128 (the int4 group; int8 is held to it as well: every K of a served model is), N a multiple
of 8 for int4 (the qzeros packing). Activations and out are float16 or bfloat16 (out as X).

Numerics: products accumulate in float32. dequant_gemv multiplies float32 x by the float32 dequantised weight (FMAs,
no rounding of W). dequant_matmul feeds tl.dot with the dequantised tile rounded to the activations' dtype (int8: the
integers themselves, exact; int4: (q - z) * s rounded once, half an ulp of the dtype). The oracle
(`nbxcert.oracles.quant`) dequantises in float64 and multiplies; the error scale is |X| @ |W|, which bounds both the
accumulation and that one rounding of each weight at the output dtype's tolerance.

Candidates and prunes (device facts only): gemv: output columns per program (BLOCK_N) x K chunk (BLOCK_K, dividing
128 so a chunk lies in one group) x warps, the float32 partial sum [BLOCK_M, BLOCK_K, BLOCK_N] live across the K loop
counted against the registers of a thread (as `matmul`'s gemv), its final reduction's staging against shared memory.
matmul: tiles BLOCK_M x BLOCK_N x BLOCK_K (BLOCK_K dividing 128), warps, stages, pruned by `smem_estimate` against
shared memory and num_stages against the pipeliner's maximum. No config field claims to change no bit: the K chunk and
the warps decide the order of the float32 sums.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels import quant64
from nbxcert.kernels.common import family_spec, gemv_offsets, narrow, upcast
from nbxcert.kernels.dtypes import finfo, get_dtype
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import SPLIT_WORKSPACE as _split_workspace
from nbxcert.kernels.launch import KernelLaunch, cdiv, run_all, served
from nbxcert.kernels.prune import gemv_prune, next_pow2, prune_with, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_numpy
from nbxcert.oracles import quant as _oracle

FORMATS = ("int4", "int8")
ACT_DTYPES = ("float16", "bfloat16")
GROUP = 128
GEMV_MAX_M = 4
ACC_EPS = 2.0**-23  # float32 accumulation
_REDUCE_BLOCK = 1024  # elements per program of the split-K reduction


# --- kernels ----------------------------------------------------------------------------------------------------------
@jit
def _dequant_tile(
    qw_ptr,
    qz_ptr,
    s_ptr,
    k0,
    offs_n,
    n_ok,
    stride_qw,
    stride_qz,
    stride_s,
    INT4: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Weight rows k0 .. k0 + BLOCK_K - 1, columns offs_n (valid where n_ok) as float32 [BLOCK_K, BLOCK_N]: int4:
    (q - z) * s of the group k0 // GROUP (BLOCK_K divides GROUP, k0 a multiple of BLOCK_K: one group per tile), the
    packed words loaded once and split into their 8 nibbles; int8: q itself (the scale is applied per column later).
    qw_ptr, qz_ptr, s_ptr: qweight, qzeros, scales (formats in the module docstring), rows the given strides apart."""
    if INT4:
        rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(qw_ptr + rows[:, None] * stride_qw + offs_n[None, :], mask=n_ok[None, :], other=0)
        shifts = tl.arange(0, 8) * 4
        q = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
        g = k0 // GROUP
        zp = tl.load(qz_ptr + g * stride_qz + offs_n // 8, mask=n_ok, other=0)
        z = (zp >> ((offs_n % 8) * 4)) & 0xF
        s = tl.load(s_ptr + g * stride_s + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        w = (q - z[None, :]).to(tl.float32) * s[None, :]
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(qw_ptr + k[:, None] * stride_qw + offs_n[None, :], mask=n_ok[None, :], other=0).to(tl.float32)
    return w


@jit
def _dequant_gemv_kernel(
    x_ptr,
    qw_ptr,
    qz_ptr,
    s_ptr,
    out_ptr,
    ws_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_qw,
    stride_qz,
    stride_s,
    stride_om,
    INT4: tl.constexpr,
    GROUP: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """out[:M, n0:n0 + BLOCK_N] = X @ W for M <= BLOCK_M rows, SIMT (no tl.dot). Grid: (cdiv(N, BLOCK_N), SPLIT_K).

    x_ptr: X [M, K], rows `stride_xm` apart, K contiguous. qw_ptr, qz_ptr, s_ptr: the quantized weight (`INT4`: the
    int4 format, else int8; module docstring), rows the given strides apart, columns contiguous. out_ptr: [M, N],
    rows `stride_om` apart. K: a multiple of BLOCK_K. GROUP: int4 group size. UPCAST: interpreter (`common.narrow`).
    BLOCK_M: next power of two >= M. BLOCK_N: columns per program. BLOCK_K: the K chunk (divides GROUP).
    SPLIT_K: 1, one program per column block over all of K, writing out; else program (j, s) sums the K slice
    [s k_per_split, (s + 1) k_per_split) (k_per_split a multiple of BLOCK_K; a slice past K is empty and sums to 0)
    into the float32 workspace ws_ptr [SPLIT_K, M, N] (contiguous), and `_gemv_split_reduce_kernel` adds the slices.
    Products are float32 FMAs into a [BLOCK_M, BLOCK_K, BLOCK_N] partial sum, chunk after chunk in increasing k, reduced
    once at the end: the order is fixed by the config alone."""
    offs_m, offs_n, offs_k, m_ok, n_ok = gemv_offsets(M, N, BLOCK_M, BLOCK_N, BLOCK_K)
    k_start = tl.program_id(1) * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    part = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
        w = _dequant_tile(
            qw_ptr, qz_ptr, s_ptr, k0, offs_n, n_ok, stride_qw, stride_qz, stride_s, INT4, GROUP, BLOCK_K, BLOCK_N
        )
        part += x.to(tl.float32)[:, :, None] * w[None, :, :]
    acc = tl.sum(part, axis=1)
    if SPLIT_K == 1:
        if not INT4:
            acc = acc * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = narrow(acc, out_ptr.dtype.element_ty, UPCAST)
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out, mask=m_ok[:, None] & n_ok[None, :])
    else:
        ws = ws_ptr + tl.program_id(1) * M * N
        tl.store(ws + offs_m[:, None] * N + offs_n[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


@jit
def _gemv_split_reduce_kernel(
    ws_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    stride_om,
    INT4: tl.constexpr,
    UPCAST: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[m, n] = the SPLIT_K float32 partials of `_dequant_gemv_kernel` added in the fixed order s = 0, 1, ...,
    SPLIT_K - 1 (int8: times the column's scale), rounded once to out's dtype. Grid: (cdiv(M N, BLOCK),).
    ws_ptr: float32 [SPLIT_K, M, N], contiguous. s_ptr: the int8 scales [N] (not read for int4). out_ptr: [M, N], rows
    `stride_om` apart."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + idx, mask=mask, other=0.0)
    m = idx // N
    n = idx % N
    if not INT4:
        acc = acc * tl.load(s_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + n, narrow(acc, out_ptr.dtype.element_ty, UPCAST), mask=mask)


@jit
def _dequant_mm_kernel(
    x_ptr,
    qw_ptr,
    qz_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_qw,
    stride_qz,
    stride_s,
    stride_om,
    INT4: tl.constexpr,
    GROUP: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out = X @ W on tensor cores, one (BLOCK_M x BLOCK_N) tile per program. Grid: (cdiv(M, BLOCK_M),
    cdiv(N, BLOCK_N)). Arguments as `_dequant_gemv_kernel`; BLOCK_M, BLOCK_N, BLOCK_K: the tile (BLOCK_K divides
    GROUP). Each K step dequantises a [BLOCK_K, BLOCK_N] tile, rounds it to X's dtype (int8: exact) and accumulates
    tl.dot in float32; UPCAST (the interpreter) feeds tl.dot float32 copies of the same values."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    # rows past M wrap around (mod M) so the X loads need no mask; the store masks them
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :])
        w = _dequant_tile(
            qw_ptr, qz_ptr, s_ptr, k0, offs_n, n_ok, stride_qw, stride_qz, stride_s, INT4, GROUP, BLOCK_K, BLOCK_N
        )
        b = narrow(w, x_ptr.dtype.element_ty, UPCAST)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    if not INT4:
        acc = acc * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out = narrow(acc, out_ptr.dtype.element_ty, UPCAST)
    tl.store(out_ptr + rows[:, None] * stride_om + offs_n[None, :], out, mask=(rows[:, None] < M) & n_ok[None, :])


# --- configs: named factories -----------------------------------------------------------------------------------------
def gemv_config(block_n: int, block_k: int, num_warps: int, split_k: int = 1) -> Config:
    """dequant_gemv: BLOCK_N output columns per program, K in BLOCK_K chunks, K cut into SPLIT_K slices (1: none)."""
    return Config.make(num_warps=num_warps, num_stages=1, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k)


def mm_config(bm: int, bn: int, bk: int, num_warps: int, num_stages: int) -> Config:
    """dequant_matmul: a BLOCK_M x BLOCK_N tile per program, K in BLOCK_K steps."""
    return Config.make(num_warps=num_warps, num_stages=num_stages, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)


def gemv_candidates() -> tuple[Config, ...]:
    """(BLOCK_N, BLOCK_K) {(32, 128), (64, 64), (64, 128), (128, 32), (128, 64), (256, 32)} x warps {4, 8}: 4K to 8K
    weights per chunk, as `matmul.gemv_configs`, with BLOCK_K dividing the int4 group; and split-K over the three
    narrow tiles (SPLIT_K 2, 4, 8, 16 at 4 warps): a decode GEMV has only N / BLOCK_N column blocks (128 for N = 4096 at
    BLOCK_N = 32, one per SM of an H200), each walking all of K, so slices of K are what fills the GPU (the
    H200 run of 2026-11-29 measured the unsplit kernel at 219-657 GB/s)."""
    pairs = ((32, 128), (64, 64), (64, 128), (128, 32), (128, 64), (256, 32))
    unsplit = tuple(gemv_config(bn, bk, w) for bn, bk in pairs for w in (4, 8))
    split = tuple(gemv_config(bn, bk, 4, sk) for bn, bk in pairs[:3] for sk in (2, 4, 8, 16))
    return unsplit + split


def mm_candidates() -> tuple[Config, ...]:
    """Tiles after Triton's matmul tutorial and vLLM's GPTQ/AWQ Triton kernels: small-M tiles (16, 32 rows) for
    decode-sized batches, 64..128 tiles for prefill, BLOCK_K 32..128 (dividing the int4 group), 3 or 4 stages; and
    two unpipelined tiles (num_stages 1) for compute capability 7.x."""
    tiles = (
        (16, 64, 128, 4, 3),
        (16, 128, 64, 4, 4),
        (32, 64, 128, 4, 3),
        (32, 128, 64, 4, 4),
        (64, 64, 64, 4, 3),
        (64, 128, 64, 4, 3),
        (128, 64, 64, 4, 3),
        (128, 128, 32, 4, 4),
        (128, 128, 64, 8, 3),
        (128, 256, 64, 8, 3),
        (64, 64, 64, 4, 1),
        (128, 128, 32, 8, 1),
    )
    return tuple(mm_config(*t) for t in tiles)


GEMV_DEFAULT = gemv_config(64, 64, 4)
MM_DEFAULT = mm_config(64, 64, 64, 4, 3)


# --- prune: device facts only -----------------------------------------------------------------------------------------
def gemv_smem_estimate(config: Config) -> int:
    """The final reduction over the K chunk exchanges partial sums between warps through shared memory: at most one
    float32 per output element (GEMV_MAX_M x BLOCK_N) per warp. An upper bound of Triton's figure for every candidate
    the census compiled for sm_70, sm_80 and sm_90 (4096 bytes at most)."""
    return GEMV_MAX_M * config["BLOCK_N"] * 4 * config.num_warps


def mm_smem_estimate(config: Config) -> int:
    """Per stage the X tile (BLOCK_M x BLOCK_K, 2 bytes) and the loaded weight words (int8: BLOCK_K x BLOCK_N bytes;
    int4: BLOCK_K / 8 x BLOCK_N x 4, half that; the larger counted), plus the dequantised tile's conversion to the
    dot's operand layout (BLOCK_K x BLOCK_N x 2); the epilogue's conversion (BLOCK_M x BLOCK_N x 4) reuses those
    buffers, so the larger of the two is taken (as `matmul.smem_estimate`). An upper bound of Triton's figure for
    every candidate the census compiled for sm_70, sm_80 and sm_90 (100352 bytes at most, for 128 x 256 x 64 at 3
    stages, against 131072 here)."""
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    pipeline = (bm * bk * 2 + bk * bn) * max(1, config.num_stages) + bk * bn * 2
    return max(pipeline, bm * bn * 4)


# the SIMT GEMV's prune (`prune.gemv_prune`), with this kernel's reduction staging
prune_gemv = gemv_prune(gemv_smem_estimate)


def prune_mm(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    """Refuse matmul tiles over the device's shared memory (`mm_smem_estimate`) or its pipelining depth."""
    return prune_with(candidates, profile, lambda c: shared_memory_refusal(mm_smem_estimate(c), profile))


# --- problems, checks and launches -----------------------------------------------------------------------------------
def _check(x: Tensor, qweight: Tensor, scales: Tensor, qzeros: Tensor | None, fmt: str, out: Tensor | None, name: str):
    """(M, N, K) of a launch; `ShapeMismatch` / `LaunchError` naming what does not fit the format."""
    if fmt not in FORMATS:
        raise LaunchError(f"{name}: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if x.dtype.name not in ACT_DTYPES or x.ndim != 2 or x.stride(1) != 1:
        raise ShapeMismatch(f"{name}: x must be a 2-d float16/bfloat16 matrix with contiguous rows, got {x}")
    m, k = x.shape
    if k % GROUP:
        raise LaunchError(f"{name}: K={k} must be a multiple of {GROUP}")
    if fmt == "int4":
        n = qweight.shape[1] if qweight.ndim == 2 else -1
        want = {"qweight": ((k // 8, n), "int32"), "qzeros": ((k // GROUP, n // 8), "int32")}
        want["scales"] = ((k // GROUP, n), x.dtype.name)
        if n % 8:
            raise LaunchError(f"{name}: int4 needs N a multiple of 8, got N={n}")
    else:
        n = qweight.shape[1] if qweight.ndim == 2 else -1
        want = {"qweight": ((k, n), "int8"), "scales": ((n,), x.dtype.name)}
    got = {"qweight": qweight, "scales": scales, "qzeros": qzeros}
    for what, (shape, dtype) in want.items():
        t = got[what]
        if t is None or tuple(t.shape) != shape or t.dtype.name != dtype or t.stride(-1) != 1:
            raise ShapeMismatch(f"{name}: {fmt} {what} must be {dtype}{list(shape)} with contiguous rows, got {t}")
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype is not x.dtype or out.stride(-1) != 1):
        raise ShapeMismatch(f"{name}: out must be {x.dtype.name}[{m}, {n}] with contiguous rows, got {out}")
    return m, n, k


def quant_launches(config: Config, gemv: bool, fmt: str, x, qweight, scales, qzeros, out) -> list[KernelLaunch]:
    """The launch of one dequant_gemv (`gemv`) or dequant_matmul of checked operands."""
    m, k = x.shape
    n = out.shape[1]
    if m == 0 or n == 0:
        return []
    if gemv and m > GEMV_MAX_M:
        raise LaunchError(f"dequant_gemv serves M <= {GEMV_MAX_M} (decode); M = {m}: use dequant_matmul")
    int4 = fmt == "int4"
    qz = qzeros if int4 else scales  # never read for int8
    args = (x, qweight, qz, scales, out, m, n, k, x.stride(0), qweight.stride(0), qz.stride(0))
    args += (scales.stride(0) if int4 else 0, out.stride(0))
    kwargs = dict(INT4=int4, GROUP=GROUP, UPCAST=upcast(), BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"])
    kwargs.update(num_warps=config.num_warps, num_stages=config.num_stages)
    if gemv:
        split_k = config.params.get("SPLIT_K", 1)
        block_k = config["BLOCK_K"]
        k_per = cdiv(cdiv(k, block_k), split_k) * block_k
        ws = out
        if split_k > 1:
            with _split_workspace.lock:
                ws = _split_workspace.get(split_k * m * n, x.device)
        gemv_args = args[:5] + (ws, m, n, k, k_per) + args[8:]
        grid = (cdiv(n, config["BLOCK_N"]), split_k)
        kwargs = dict(kwargs, BLOCK_M=next_pow2(m), SPLIT_K=split_k)
        launches = [KernelLaunch(_dequant_gemv_kernel, grid, gemv_args, kwargs)]
        if split_k > 1:
            reduce_kw = dict(INT4=int4, UPCAST=upcast(), SPLIT_K=split_k, BLOCK=_REDUCE_BLOCK, num_warps=4)
            reduce_args = (ws, scales, out, m, n, out.stride(0))
            launches.append(
                KernelLaunch(_gemv_split_reduce_kernel, (cdiv(m * n, _REDUCE_BLOCK),), reduce_args, reduce_kw)
            )
        return launches
    grid = (cdiv(m, config["BLOCK_M"]), cdiv(n, config["BLOCK_N"]))
    return [KernelLaunch(_dequant_mm_kernel, grid, args, dict(kwargs, BLOCK_M=config["BLOCK_M"]))]


def run_launches(launches: Sequence[KernelLaunch]) -> None:
    """Make the launches of one product, in order; a split-K GEMV's two (the partials into the per-stream
    workspace, then their reduction) are enqueued back to back under the workspace's lock, so no other thread's
    partials land in the workspace between them."""
    if len(launches) > 1:
        with _split_workspace.lock:
            run_all(launches)
    else:
        run_all(launches)


def quant_problem(x: Tensor, qweight: Tensor, scales: Tensor, qzeros: Tensor | None = None, fmt: str = "int4", **_):
    """The key problem of a launch: M, N, K and the format."""
    m, n, k = _check(x, qweight, scales, qzeros, fmt, None, "dequant")
    return {"M": m, "N": n, "K": k, "format": fmt}


def _user(spec, gemv, x, qweight, scales, qzeros, fmt, out, config) -> Tensor:
    m, n, k = _check(x, qweight, scales, qzeros, fmt, out, spec.name)
    if gemv and m > GEMV_MAX_M:
        raise LaunchError(f"dequant_gemv serves M <= {GEMV_MAX_M} (decode); M = {m}: use dequant_matmul")
    out = empty((m, n), x.dtype, x.device) if out is None else out
    problem = {"M": m, "N": n, "K": k, "format": fmt}

    def run(c: Config) -> None:
        run_launches(quant_launches(c, gemv, fmt, x, qweight, scales, qzeros, out))

    run(choose_config(spec, problem, (x.dtype.name,), config, run=run, outputs=(out,)))
    return out


@served
def dequant_gemv(x, qweight, scales, qzeros=None, fmt: str = "int4", out=None, config=None) -> Tensor:
    """X @ dequantize(W) for decode: X [M, K] (M <= 4) float16/bfloat16; W in `fmt` (module docstring) -> [M, N]."""
    return _user(DEQUANT_GEMV, True, x, qweight, scales, qzeros, fmt, out, config)


@served
def dequant_matmul(x, qweight, scales, qzeros=None, fmt: str = "int4", out=None, config=None) -> Tensor:
    """X @ dequantize(W): X [M, K] float16/bfloat16; W in `fmt` (module docstring) -> [M, N] of X's dtype."""
    return _user(DEQUANT_MATMUL, False, x, qweight, scales, qzeros, fmt, out, config)


# --- inputs and oracle ------------------------------------------------------------------------------------------------
def pack_int4_rows(q: np.ndarray) -> np.ndarray:
    """[8 R, C] values 0..15 -> int32 [R, C], row 8 r + i in bits 4 i (GPTQ's qweight packing)."""
    q = np.asarray(q)  # each eighth widened alone (the whole widened at once took 12x as long at 4096 x 28672)
    out = np.zeros((q.shape[0] // 8, q.shape[1]), dtype=np.uint32)
    for i in range(8):
        out |= q[i::8].astype(np.uint32) << np.uint32(4 * i)
    return out.view(np.int32)


def pack_int4_cols(q: np.ndarray) -> np.ndarray:
    """[R, 8 C] values 0..15 -> int32 [R, C], column 8 c + i in bits 4 i (GPTQ's qzeros packing)."""
    q = np.asarray(q)
    out = np.zeros((q.shape[0], q.shape[1] // 8), dtype=np.uint32)
    for i in range(8):
        out |= q[:, i::8].astype(np.uint32) << np.uint32(4 * i)
    return out.view(np.int32)


# AutoAWQ's packing order: nibble i of an int32 holds column 8 j + AWQ_ORDER[i] of its 8 columns
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _unpack_awq(packed: np.ndarray) -> np.ndarray:
    """int32 [R, C] packed the AWQ way -> values 0..15 [R, 8 C]."""
    bits = np.ascontiguousarray(packed).view(np.uint32)
    out = np.empty((bits.shape[0], bits.shape[1] * 8), dtype=np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        out[:, col::8] = (bits >> np.uint32(4 * i)) & np.uint32(15)
    return out


def awq_to_gptq(qweight: Tensor, qzeros: Tensor) -> tuple[Tensor, Tensor]:
    """An AWQ int4 checkpoint's qweight [K, N/8] and qzeros [K/128, N/8] (int32) repacked into this module's int4
    layout (qweight [K/8, N], qzeros [K/128, N/8]), on the same device; the scales [K/128, N] are the same in both.
    Done once when the weights are loaded (through the host)."""
    for name, t in (("qweight", qweight), ("qzeros", qzeros)):
        if t.dtype.name != "int32" or t.ndim != 2:
            raise ShapeMismatch(f"awq_to_gptq: {name} must be a 2-d int32 tensor, got {t.dtype.name}{list(t.shape)}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    if k % GROUP or qzeros.shape != (k // GROUP, n // 8):
        raise ShapeMismatch(
            f"awq_to_gptq: qweight [{k}, {n // 8}] needs K a multiple of {GROUP} and qzeros [{k // GROUP}, {n // 8}], "
            f"got qzeros {list(qzeros.shape)}"
        )
    q = _unpack_awq(qweight.numpy())
    z = _unpack_awq(qzeros.numpy())
    device = qweight.device
    return from_numpy(pack_int4_rows(q), "int32", device), from_numpy(pack_int4_cols(z), "int32", device)


def quant_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    """X ~ N(0, 1) [M, K]; int4: nibbles and zero points uniform in 0..15, scales |N(0, 1)| x 0.01 + 0.002 per group;
    int8: values uniform in -127..127, scales |N(0, 1)| x 0.001 + 0.0005 per column (so that |W| stays near 0.1 and
    a K = 14336 product stays far inside float16's range)."""
    m, n, k, fmt = int(problem["M"]), int(problem["N"]), int(problem["K"]), str(problem["format"])
    dtype = dtypes[0]
    gen = _inputs.rng(seed)
    x = _inputs.randn(gen, (m, k), dtype, device)
    tensors = {"x": x}
    if fmt == "int4":
        q = gen.integers(0, 16, (k, n), dtype=np.uint8)  # drawn as bytes: 4x less to draw and pack than int64
        z = gen.integers(0, 16, (k // GROUP, n), dtype=np.uint8)
        tensors["qweight"] = from_numpy(pack_int4_rows(q), "int32", device)
        tensors["qzeros"] = from_numpy(pack_int4_cols(z), "int32", device)
        tensors["scales"] = from_numpy(np.abs(gen.standard_normal((k // GROUP, n))) * 0.01 + 0.002, dtype, device)
    elif fmt == "int8":
        tensors["qweight"] = from_numpy(gen.integers(-127, 128, (k, n), dtype=np.int8), "int8", device)
        tensors["scales"] = from_numpy(np.abs(gen.standard_normal(n)) * 0.001 + 0.0005, dtype, device)
    else:
        raise LaunchError(f"quant: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    tensors["out"] = empty((m, n), dtype, device)
    return Inputs(tensors, {"format": fmt}, ("out",), dict(problem))


def _launcher(gemv: bool):
    def launch(config: Config, inputs: Inputs) -> None:
        t, fmt = inputs.tensors, inputs.scalars["format"]
        run_launches(quant_launches(config, gemv, fmt, t["x"], t["qweight"], t["scales"], t.get("qzeros"), t["out"]))

    launch.__doc__ = f"The spec's launch: one {'dequant_gemv' if gemv else 'dequant_matmul'} on made inputs."
    return launch


def _quant_oracle(inputs: Inputs) -> dict[str, Reference]:
    from nbxcert.kernels.products import device_library, products_on_device  # the oracle's float64 products

    t, fmt = inputs.tensors, inputs.scalars["format"]
    terms = {"acc_eps": ACC_EPS, "out_eps": finfo(get_dtype(t["out"].dtype.name))["eps"]}
    lib = device_library(t["out"].device)
    if lib is not None:  # the weight dequantized where it lies (`quant64`), multiplied there by cuBLAS
        w = quant64.dequantized(fmt, t["qweight"], t["scales"], t.get("qzeros"), GROUP)
        value, scale = _oracle.dequant_matmul_of(*products_on_device(t["x"], w, lib), w.shape[0], **terms)
        return {"out": Reference(value, scale)}
    qz = t["qzeros"].numpy() if "qzeros" in t else None
    value, scale = _oracle.dequant_matmul(
        t["x"].float64(), fmt, t["qweight"].numpy(), t["scales"].float64(), qz, GROUP, **terms
    )
    return {"out": Reference(value, scale)}


def _same(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return (dtypes[0],)


# --- specs ------------------------------------------------------------------------------------------------------------
GEMV_EXAMPLES = (
    {"M": 1, "N": 64, "K": 256, "format": "int4"},
    {"M": 3, "N": 40, "K": 256, "format": "int8"},
    {"M": 4, "N": 72, "K": 128, "format": "int4"},
)
MM_EXAMPLES = (
    {"M": 16, "N": 64, "K": 256, "format": "int4"},
    {"M": 5, "N": 72, "K": 256, "format": "int8"},
    {"M": 33, "N": 40, "K": 128, "format": "int4"},
)


def _quant_spec(name, description, kernels, gemv: bool, m_key: KeyField, candidates, default, prune, examples):
    """The dequantizing product specs (decode gemv or tensor-core tiles): one input maker, one oracle, one key."""
    return family_spec(
        "quant",
        name,
        description,
        kernels,
        problem_args=("M", "N", "K", "format"),
        key_fields=(m_key, KeyField("N"), KeyField("K"), KeyField("format")),
        dtype_args=("x",),
        dtypes=tuple((d,) for d in ACT_DTYPES),
        output_dtypes=_same,
        tuning=(candidates, default, prune),
        parts=(quant_inputs, _launcher(gemv), _quant_oracle, quant_problem),
        examples=examples,
        oracle_name="nbxcert.oracles.quant.dequant_matmul",
    )


DEQUANT_GEMV = _quant_spec(
    "dequant_gemv",
    "X @ dequantize(W) for decode (M <= 4), int4 (GPTQ, group 128) or int8 (per channel), SIMT",
    (_dequant_gemv_kernel, _gemv_split_reduce_kernel),
    True,
    KeyField("M"),
    gemv_candidates(),
    GEMV_DEFAULT,
    prune_gemv,
    GEMV_EXAMPLES,
)
DEQUANT_MATMUL = _quant_spec(
    "dequant_matmul",
    "X @ dequantize(W), int4 (GPTQ, group 128) or int8 (per channel), tensor-core tiles",
    (_dequant_mm_kernel,),
    False,
    KeyField("M", "tokens"),
    mm_candidates(),
    MM_DEFAULT,
    prune_mm,
    MM_EXAMPLES,
)

SPECS = (DEQUANT_GEMV, DEQUANT_MATMUL)

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
