"""The matrix-product family: matmul, addmm, bmm, baddbmm (tensor-core tiles) and gemv, addmv (decode, SIMT).

Every kernel here computes, per output element, `act(beta·bias + alpha·Σ_k a[m, k]·b[k, n])`, accumulating the K
products in float32 and rounding once into the output dtype (that of `a`; `b`, `bias` and `out` must share it).

Specs (stable certificate names):

- `matmul`   C = A @ B, A (M, K) and B (K, N) row- or column-major.
- `addmm`    C = act(beta·bias + alpha·(A @ B)); bias broadcastable to (M, N) (the nn.Linear bias is (N,)).
- `bmm`      C[i] = A[i] @ B[i]; either operand may broadcast over the batch with batch stride 0 (`expand`).
- `baddbmm`  C[i] = act(beta·bias[i] + alpha·(A[i] @ B[i])).
- `gemv`     C = X @ W for decode, X (M, K) with M <= 4 (or a vector (K,)), W (K, N): a SIMT kernel (no tl.dot).
- `addmv`    C = act(beta·bias + alpha·(X @ W)), same kernel.

float32: the products are IEEE float32 products (`tl.dot(..., input_precision="ieee")`; the gemv kernel multiplies
with ordinary float32 FMAs), never TF32. There is no `matmul_tf32` spec: TF32 rounds each input to 10 mantissa bits,
an error of ~2^-11 relative, and the device files state one float32 tolerance (2^-23) for every float32 output, so a
TF32 kernel could not be certified honestly against it without a tolerance of its own.

Kernels and their candidates (config field `KIND`):

- `tiled`: one (BLOCK_M x BLOCK_N) output tile per program, K walked in BLOCK_K steps, grouped launch order
  (`GROUP_M` rows of tiles share their B columns in L2). Factories: `classic_configs()` (64..256 tiles, among them
  the untuned default 128x128, BLOCK_K 32 for 16-bit types, 4 warps, 3 stages), `small_m_configs()` (16/32-row
  tiles for decode-sized M) and `unpipelined_configs()` (num_stages 1, for compute capability 7.x).
- `split_k`: for small M. Program (tile, s) sums its K slice s into a float32 workspace [SPLIT_K, batch, M, N]; a
  second kernel adds the SPLIT_K partials in the fixed order s = 0, 1, ..., SPLIT_K-1, then applies bias and
  activation: deterministic, with no atomics. Factory: `split_k_configs()`.
- `tma_persistent`: Hopper's tensor memory accelerator. One program per SM loops over output tiles (grouped order),
  loading A and B tiles through host-built tensor descriptors (`triton.tools.tensor_descriptor.TensorDescriptor`,
  filled on the host at each launch, so no global scratch allocation is needed). Needs compute capability >= 9.0
  and TMA-legal operands (the `aligned` key field). The tile is stored by pointers or, C_TMA=1, by TMA through
  C's descriptor where `out` allows it (by pointers where it does not: the same values, so C_TMA changes no bit).
  Factory: `tma_persistent_configs()` (with `tma_store_configs()`).
- `gemv` (the gemv/addmv specs): each program owns BLOCK_N output columns for all M <= 4 rows and walks K in
  BLOCK_K chunks in increasing order (software-pipelined through shared memory when num_stages > 1), keeping a
  [M, BLOCK_K, BLOCK_N] float32 partial sum that is reduced once at the end: the result depends on (BLOCK_K, BLOCK_N,
  num_warps) but never on timing. Factory: `gemv_configs()`.

`BLOCK_K` is given in bytes (`K_BYTES`) for the tensor-core kernels: BLOCK_K = K_BYTES // itemsize, so a config's
shared-memory footprint is the same for float16, bfloat16 and float32 and the prune (which sees the problem and the
device, not the dtype) can bound it exactly. K_BYTES = 64 is BLOCK_K = 32 for 16-bit types, 16 for float32; 128 is
64 / 32 (a 128-byte row, the width of the widest shared-memory swizzle).

Prune (device facts only, plus two problem facts for TMA): num_stages over `max_num_stages`; warps x warp_size over
`max_threads_per_block`; the shared memory estimate over `max_shared_memory_per_block_optin`; TMA kernels on devices
without TMA (compute capability < 9.0; the interpreter emulates descriptors and keeps them); TMA kernels on problems
whose operands are not TMA-legal (`aligned` = 0) or empty (K = 0). The shared memory estimate is

    (BLOCK_M + BLOCK_N) · K_BYTES · num_stages  (+ the epilogue's layout-conversion scratch, see `smem_estimate`)

an estimate of what Triton allocates, checked against the compiler's own figure (`compiled.metadata.shared`) by the
census `tests/kernels/test_matmul.py::test_smem_estimate_bounds_compiler` (slow), which cross-compiles every candidate
kept for hopper (sm_90) and ampere (sm_80) on the CPU, float16 and float32, plus transposed, batched and fused
launches; it is kept an upper bound of that figure. Seen with Triton 3.6 and 3.9: exact for 16-bit tiled kernels on
sm_90, one stage too many on sm_80 and for float32 (which pipeline num_stages - 1 buffers), and for the persistent
TMA kernel the epilogue term is at most half of what the bound allows. Registers are estimated only for gemv's
partial sum (it is live across the whole K loop); the tensor-core kernels' register use is left to the compiler.

Keys: M is bucketed on the device file's `tokens` ladder (gemv: M exact, it is at most 4); N, K exact; batch (bmm,
baddbmm) bucketed on the `batch` ladder (the grid grows linearly with it, tiles do not change); `trans_a`,
`trans_b` exact (1: the operand is column-major, derived from its strides); `bcast_a`, `bcast_b` exact (bmm: the
operand's batch stride is 0); `aligned` exact (1: A and B can be read by TMA: unit inner stride, 16-byte aligned base
pointer, outer strides multiples of 16 bytes); `activation` exact (addmm, baddbmm, addmv).

No-bit fields: `GROUP_M` only changes which program computes which tile, never how a tile is computed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.common import dot_over_k, family_spec, gemv_offsets, k_step_tiles, tile_coords, wrap_run
from nbxcert.kernels.dtypes import finfo, get_dtype
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import SPLIT_WORKSPACE as _workspace
from nbxcert.kernels.launch import KernelLaunch, cdiv, launch_kernel, served
from nbxcert.kernels.prune import gemv_prune, next_pow2, prune_with, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KernelSpec, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty
from nbxcert.oracles import matmul as _oracle

ACTIVATIONS = ("none", "relu", "gelu_tanh", "silu")
DTYPES_2 = (("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float32"))
DTYPES_3 = tuple(combo + combo[:1] for combo in DTYPES_2)
ACC_EPS = 2.0**-23  # the accumulator is float32 in every kernel here (the oracle widens float32 outputs' scale by it)
GEMV_MAX_M = 4
INT32_MAX = 2**31 - 1

# The split-K reduction kernel is not tuned: every element is reduced in the same order whatever its block, so its
# block size changes no bit. 1024 elements x 4 warps is a plain elementwise launch.
_REDUCE_BLOCK = 1024
_REDUCE_WARPS = 4
# Programs the persistent kernel runs under the interpreter, which has no SMs: 3 makes most programs loop over
# several tiles (the point of a persistent kernel) on the small test problems.
_INTERPRETER_PROGRAMS = 3


# ======================================================================================================================
# Triton kernels
# ======================================================================================================================
@jit
def _activate(z, ACTIVATION: tl.constexpr):
    """The fused activation on float32 values: none, relu, gelu_tanh (tanh approximation) or silu. Written with
    exp(-|x|) so that no exp overflows."""
    if ACTIVATION == "relu":
        z = tl.maximum(z, 0.0)
    elif ACTIVATION == "gelu_tanh":
        u = 0.7978845608028654 * (z + 0.044715 * z * z * z)  # sqrt(2/pi) * (z + 0.044715 z^3)
        e = tl.exp(-2.0 * tl.abs(u))
        t = (1.0 - e) / (1.0 + e)  # tanh(|u|)
        t = tl.where(u >= 0, t, -t)
        z = 0.5 * z * (1.0 + t)
    elif ACTIVATION == "silu":
        e = tl.exp(-tl.abs(z))
        sig = tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        z = z * sig
    return z


@jit
def _epilogue(
    acc,
    bias_ptr,
    offs_m,
    offs_n,
    M,
    N,
    stride_biasm,
    stride_biasn,
    alpha,
    beta,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """acc (float32 [BM, BN]) -> act(beta·bias + alpha·acc) in float32 (bias_ptr already at this batch), which the
    caller rounds once to C's dtype and stores."""
    z = acc * alpha
    if HAS_BIAS:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        bias = tl.load(bias_ptr + offs_m[:, None] * stride_biasm + offs_n[None, :] * stride_biasn, mask=mask, other=0.0)
        z = z + beta * bias.to(tl.float32)
    return _activate(z, ACTIVATION)


@jit
def _mm_tiled_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    stride_biasb,
    stride_biasm,
    stride_biasn,
    alpha,
    beta,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    RUN_M: tl.constexpr,
    RUN_N: tl.constexpr,
):
    """One output tile per program. Grid: (tiles_m * tiles_n, batch).

    a_ptr, b_ptr: A [batch, M, K] and B [batch, K, N] at the strides given (any layout; batch stride 0 broadcasts).
    c_ptr: C [batch, M, N], written (masked at the M and N edges). bias_ptr: bias [batch, M, N] at its strides (0 for
    broadcast dimensions); read only when HAS_BIAS. M, N, K: sizes. stride_*: element strides of each tensor, batch
    first. alpha, beta: float32 scalars of act(beta·bias + alpha·A@B). HAS_BIAS: add the bias. ACTIVATION: "none",
    "relu", "gelu_tanh" or "silu". DOT_PRECISION: tl.dot's input_precision ("ieee": exact float32 products).
    UPCAST: convert tiles to float32 before tl.dot (the interpreter only: its tl.dot reads bfloat16 storage as raw
    integers). EVEN_K: K is a multiple of BLOCK_K (no K mask). BLOCK_M, BLOCK_N, BLOCK_K: the tile. GROUP_M: tile rows
    per launch-order group (changes no output bit). RUN_M, RUN_N: the contiguous runs of the wrapped row and column
    offsets (`wrap_run`).
    """
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    pid_m, pid_n = tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    # Rows and columns past the edge wrap around (mod M, N) so the loads need no mask; the store masks them. The hints
    # claim contiguous runs only as long as they hold across the wrap (`wrap_run`).
    offs_am = tl.max_contiguous(tl.multiple_of((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M, RUN_M), RUN_M)
    offs_bn = tl.max_contiguous(tl.multiple_of((pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N, RUN_N), RUN_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + batch * stride_ab + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + batch * stride_bb + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = dot_over_k(
        a_ptrs, b_ptrs, offs_k, K, stride_ak, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, DOT_PRECISION
    )
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_b = c_ptr + batch * stride_cb
    bias_b = bias_ptr + batch * stride_biasb
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    z = _epilogue(acc, bias_b, offs_m, offs_n, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, ACTIVATION)
    tl.store(c_b + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, z.to(c_ptr.dtype.element_ty), mask=mask)


@jit
def _mm_split_k_kernel(
    a_ptr,
    b_ptr,
    ws_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_ws_split,
    stride_ws_batch,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    RUN_M: tl.constexpr,
    RUN_N: tl.constexpr,
):
    """Partial products over one K slice. Grid: (tiles_m * tiles_n, SPLIT_K, batch).

    a_ptr, b_ptr, M, N, K, stride_a*, stride_b*: as in `_mm_tiled_kernel`. ws_ptr: float32 workspace
    [SPLIT_K, batch, M, N], contiguous (stride_ws_split = batch·M·N, stride_ws_batch = M·N); program (tile, s, i)
    writes the sum over k in [s·k_per_split, min(K, (s+1)·k_per_split)) of tile `tile` of batch i. k_per_split: a
    multiple of BLOCK_K. DOT_PRECISION, UPCAST, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, RUN_M, RUN_N: as in
    `_mm_tiled_kernel` (with EVEN_K every slice is whole BLOCK_K steps, since k_per_split is a multiple of BLOCK_K).
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    pid_m, pid_n = tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_am = tl.max_contiguous(tl.multiple_of((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M, RUN_M), RUN_M)
    offs_bn = tl.max_contiguous(tl.multiple_of((pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N, RUN_N), RUN_N)
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + batch * stride_ab + offs_am[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + batch * stride_bb + (k_start + offs_k)[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        a, b = k_step_tiles(a_ptrs, b_ptrs, offs_k, k_end - k, EVEN_K, UPCAST)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws = ws_ptr + split.to(tl.int64) * stride_ws_split + batch * stride_ws_batch
    tl.store(ws + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)


@jit
def _split_k_reduce_kernel(
    ws_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    stride_ws_split,
    stride_ws_batch,
    stride_cb,
    stride_cm,
    stride_cn,
    stride_biasb,
    stride_biasm,
    stride_biasn,
    alpha,
    beta,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Sum the SPLIT_K partials of each element in the fixed order s = 0..SPLIT_K-1, then the epilogue.
    Grid: (cdiv(M·N, BLOCK), batch).

    ws_ptr: the float32 workspace of `_mm_split_k_kernel`. c_ptr, bias_ptr, stride_c*, stride_bias*, alpha, beta,
    HAS_BIAS, ACTIVATION: as in `_mm_tiled_kernel`. SPLIT_K: the number of partials. BLOCK: elements per program.
    """
    batch = tl.program_id(1).to(tl.int64)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < M * N
    ws = ws_ptr + batch * stride_ws_batch + idx
    # partial s lies s·batch·M·N elements in: past 2^31 at SPLIT_K = 16 of a 4096 x 37888 product, so 64-bit offsets
    split_stride = stride_ws_split.to(tl.int64)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws + s * split_stride, mask=mask, other=0.0)
    m = idx // N
    n = idx % N
    z = acc * alpha
    if HAS_BIAS:
        bias = tl.load(bias_ptr + batch * stride_biasb + m * stride_biasm + n * stride_biasn, mask=mask, other=0.0)
        z = z + beta * bias.to(tl.float32)
    z = _activate(z, ACTIVATION)
    tl.store(c_ptr + batch * stride_cb + m * stride_cm + n * stride_cn, z.to(c_ptr.dtype.element_ty), mask=mask)


@jit
def _mm_tma_persistent_kernel(
    a_desc,
    b_desc,
    c_desc,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    batch_count,
    a_batch_step,
    b_batch_step,
    num_programs,
    stride_cb,
    stride_cm,
    stride_cn,
    stride_biasb,
    stride_biasm,
    stride_biasn,
    alpha,
    beta,
    TRANS_A: tl.constexpr,
    TRANS_B: tl.constexpr,
    BATCHED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPILOGUE_PARTS: tl.constexpr,
    C_TMA: tl.constexpr,
):
    """Persistent tiles through TMA. Grid: (num_programs,); program p computes tiles p, p + num_programs, ...

    a_desc: tensor descriptor of A as stored: [M, K] (block [BLOCK_M, BLOCK_K]) or, TRANS_A, [K, M] (block
    [BLOCK_K, BLOCK_M]); with BATCHED a leading batch dimension (block 1). b_desc likewise: [K, N] or, TRANS_B,
    [N, K]. Out-of-range rows/columns read as zero (TMA fills them). c_ptr, bias_ptr, stride_c*, stride_bias*, alpha,
    beta, HAS_BIAS, ACTIVATION, DOT_PRECISION, UPCAST: as in `_mm_tiled_kernel`. M, N, K: sizes. batch_count: batch
    size. a_batch_step, b_batch_step: 1, or 0 for an operand broadcast over the batch (its descriptor has batch 1).
    num_programs: the grid size (the SM count). TRANS_A, TRANS_B: operand layouts. BATCHED: descriptors have a batch
    dimension. BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M: as in `_mm_tiled_kernel`. EPILOGUE_PARTS: 1, 2 or 4, the number
    of column slices the tile is stored in (see below). C_TMA: the slices are stored by TMA through c_desc (C's
    descriptor, block [BLOCK_M, BLOCK_N / EPILOGUE_PARTS], batched like A's), else by pointers (c_desc None).
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = tiles_m * tiles_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), batch_count * tiles_per_batch, num_programs, flatten=True):
        batch = tile // tiles_per_batch
        pid_m, pid_n = tile_coords(tile % tiles_per_batch, tiles_m, tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            if BATCHED:
                if TRANS_A:
                    a = a_desc.load([batch * a_batch_step, off_k, off_m]).reshape(BLOCK_K, BLOCK_M).T
                else:
                    a = a_desc.load([batch * a_batch_step, off_m, off_k]).reshape(BLOCK_M, BLOCK_K)
                if TRANS_B:
                    b = b_desc.load([batch * b_batch_step, off_n, off_k]).reshape(BLOCK_N, BLOCK_K).T
                else:
                    b = b_desc.load([batch * b_batch_step, off_k, off_n]).reshape(BLOCK_K, BLOCK_N)
            else:
                if TRANS_A:
                    a = a_desc.load([off_k, off_m]).T
                else:
                    a = a_desc.load([off_m, off_k])
                if TRANS_B:
                    b = b_desc.load([off_n, off_k]).T
                else:
                    b = b_desc.load([off_k, off_n])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        # The epilogue stores the tile in EPILOGUE_PARTS column slices: the pipeline's buffers stay live across it
        # (the loop is flattened so the next tile's loads overlap this store), so its layout-conversion scratch adds
        # to them, and a slice bounds that scratch at BLOCK_M * BLOCK_N / EPILOGUE_PARTS float32 values (see
        # `smem_estimate`): quarters let the 128x256 tile keep 4 stages within Hopper's 227 KiB.
        offs_m = off_m + tl.arange(0, BLOCK_M)
        c_b = c_ptr + batch.to(tl.int64) * stride_cb
        bias_b = bias_ptr + batch.to(tl.int64) * stride_biasb
        if EPILOGUE_PARTS == 1:
            parts = (acc,)
        elif EPILOGUE_PARTS == 2:
            acc_lo, acc_hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            parts = (acc_lo, acc_hi)
        else:
            # column a * BLOCK_N / 2 + b * BLOCK_N / 4 + c is element (a, b, c) of [2, 2, BLOCK_N / 4]; split b, then a
            b0, b1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, 2, BLOCK_N // 4)), (0, 3, 1, 2)))
            q00, q10 = tl.split(b0)
            q01, q11 = tl.split(b1)
            parts = (q00, q01, q10, q11)
        # Part i (float32 [BLOCK_M, WIDTH]) holds columns col0 .. col0 + WIDTH - 1. Stored by the TMA store of c_desc
        # (rows and columns past C's edge are clipped by the copy) or by masked pointer stores: the same values,
        # act(beta·bias + alpha·acc) rounded once to C's dtype.
        WIDTH: tl.constexpr = BLOCK_N // EPILOGUE_PARTS
        for i in tl.static_range(EPILOGUE_PARTS):
            col0 = off_n + i * WIDTH
            offs_n = col0 + tl.arange(0, WIDTH)
            part = parts[i]
            if C_TMA:
                z = _epilogue(
                    part, bias_b, offs_m, offs_n, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, ACTIVATION
                ).to(c_desc.dtype)
                if BATCHED:
                    c_desc.store([batch, off_m, col0], z.reshape(1, BLOCK_M, WIDTH))
                else:
                    c_desc.store([off_m, col0], z)
            else:
                mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
                z = _epilogue(
                    part, bias_b, offs_m, offs_n, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, ACTIVATION
                )
                c_ptrs = c_b + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
                tl.store(c_ptrs, z.to(c_ptr.dtype.element_ty), mask=mask)


@jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wk,
    stride_wn,
    stride_cm,
    stride_cn,
    stride_biasm,
    stride_biasn,
    alpha,
    beta,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Decode GEMV without tl.dot: C[:M, n0:n0+BLOCK_N] for all M <= BLOCK_M rows. Grid: (cdiv(N, BLOCK_N),).

    x_ptr: X [M, K] at (stride_xm, stride_xk). w_ptr: W [K, N] at (stride_wk, stride_wn) (nn.Linear's weight is
    W = weight.T: stride_wk = 1). c_ptr: C [M, N] at (stride_cm, stride_cn). bias_ptr: bias [M, N] at its strides
    (0 for broadcast dimensions); read only when HAS_BIAS. M, N, K: sizes (M <= BLOCK_M). alpha, beta, HAS_BIAS,
    ACTIVATION: as in `_mm_tiled_kernel`. EVEN_K: K is a multiple of BLOCK_K. BLOCK_M: next power of two >= M (a
    problem fact, not a tuning choice). BLOCK_N: output columns per program. BLOCK_K: the K chunk. STAGES: the
    launch's num_stages, passed to tl.range so the chunk loads are software-pipelined (cp.async) when > 1.

    Products are float32 FMAs into a [BLOCK_M, BLOCK_K, BLOCK_N] partial sum, chunk after chunk in increasing k;
    one reduction over the chunk axis at the end. The order is fixed by the config alone.
    """
    offs_m, offs_n, offs_k, m_ok, n_ok = gemv_offsets(M, N, BLOCK_M, BLOCK_N, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    part = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
    # num_stages given to tl.range explicitly: Triton's pipeliner leaves loads that feed no tl.dot alone otherwise
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = offs_k < K - k0
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        part += x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :]
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    acc = tl.sum(part, axis=1)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    z = _epilogue(acc, bias_ptr, offs_m, offs_n, M, N, stride_biasm, stride_biasn, alpha, beta, HAS_BIAS, ACTIVATION)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, z.to(c_ptr.dtype.element_ty), mask=mask)


# ======================================================================================================================
# Candidate configs (named factories)
# ======================================================================================================================
def _tile(kind: str, bm: int, bn: int, k_bytes: int, warps: int, stages: int, group_m: int = 8, **extra) -> Config:
    return Config.make(
        num_warps=warps, num_stages=stages, KIND=kind, BLOCK_M=bm, BLOCK_N=bn, K_BYTES=k_bytes, GROUP_M=group_m, **extra
    )


DEFAULT_MM = _tile("tiled", 128, 128, 64, 4, 3)  # what a user writes untuned: 128x128 tiles, BLOCK_K 32 (16-bit)


def classic_configs() -> list[Config]:
    """Tiled configs in the style of Triton's matmul tutorial and vLLM's tuning space: tiles 64..256 x 64..256,
    K_BYTES 64 and 128, 4 or 8 warps, 3 or 4 stages. 8 warps only where a 4-warp program would hold more than 128
    accumulator values per thread (the two biggest tiles need 8; 128x128 gets both), 4 warps only below that."""
    out = []
    for bm, bn in ((64, 64), (64, 128), (128, 64), (128, 128), (64, 256), (128, 256), (256, 128)):
        acc_per_thread_4 = bm * bn // (4 * 32)
        warps = (4,) if acc_per_thread_4 < 128 else (4, 8) if acc_per_thread_4 == 128 else (8,)
        for k_bytes in (64, 128):
            for w in warps:
                for stages in (3, 4):
                    out.append(_tile("tiled", bm, bn, k_bytes, w, stages))
    return out


def unpipelined_configs() -> list[Config]:
    """Tiled configs with num_stages = 1, for GPUs whose pipeliner does not run (compute capability 7.x: no cp.async,
    so the device files state max_num_stages = 1): middle-sized tiles within 64 KiB of shared memory."""
    shapes = ((64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 4), (128, 128, 8))
    return [_tile("tiled", bm, bn, 64, warps, 1) for bm, bn, warps in shapes]


def small_m_configs() -> list[Config]:
    """Tiled configs for small M (decode batches): 16 or 32 rows, narrow N tiles so the grid still covers the SMs,
    long K steps (K_BYTES 256, 512) and deep pipelines, since these products are bound by reading B."""
    shapes = (
        (16, 32, 256, 4),
        (16, 32, 512, 4),
        (16, 64, 256, 4),
        (16, 64, 256, 5),
        (16, 64, 512, 3),
        (16, 128, 128, 4),
        (32, 64, 256, 4),
        (32, 128, 128, 4),
    )
    return [_tile("tiled", bm, bn, k_bytes, 4, stages) for bm, bn, k_bytes, stages in shapes]


def split_k_configs() -> list[Config]:
    """Split-K configs for small M (decode and small batches): thin tiles, long K slices, 2 to 16 splits."""
    out = []
    for bm, bn, k_bytes in ((16, 32, 256), (16, 64, 256), (16, 128, 128), (32, 64, 256), (32, 128, 128)):
        for split_k in (2, 4, 8) if bn == 32 else (4, 8, 16):
            out.append(_tile("split_k", bm, bn, k_bytes, 4, 4, SPLIT_K=split_k))
    for bm, bn, k_bytes, warps, split_k in ((64, 128, 128, 4, 2), (64, 128, 128, 4, 4), (128, 128, 128, 8, 2)):
        out.append(_tile("split_k", bm, bn, k_bytes, warps, 3, SPLIT_K=split_k))
    return out


def epilogue_parts(config: Config) -> int:
    """The column slices a tma_persistent config stores its tile in: its EPILOGUE_PARTS (1: the whole tile, 4), else
    2."""
    return config.params.get("EPILOGUE_PARTS", 2)


def tma_persistent_configs() -> list[Config]:
    """Persistent TMA configs for Hopper, after Triton's persistent-matmul tutorial: 128-byte K rows (the 128B
    swizzle), warp-group-sized programs (4 or 8 warps), 3 to 5 stages; the 128x256 tile also with 4 stages and its
    epilogue in quarters (EPILOGUE_PARTS=4), which the halved epilogue's scratch keeps out of 227 KiB."""
    shapes = (
        (128, 256, 128, 8, 3),
        (128, 256, 128, 8, 4),
        (256, 128, 128, 8, 3),
        (128, 128, 128, 8, 4),
        (128, 128, 128, 4, 4),
        (128, 128, 128, 8, 5),
        (128, 64, 128, 4, 4),
        (64, 128, 128, 4, 4),
        (128, 128, 256, 8, 3),
    )
    return (
        [_tile("tma_persistent", *s) for s in shapes]
        + [_tile("tma_persistent", 128, 256, 128, 8, 4, EPILOGUE_PARTS=4)]
        + tma_store_configs()
    )


def tma_store_configs() -> list[Config]:
    """The leading persistent TMA tiles with their epilogue stored by TMA (C_TMA=1: each column slice written to
    shared memory once and copied out asynchronously, as Triton's persistent-matmul tutorial stores it) instead of by
    pointers: 128x256 (halves, and quarters with 4 stages), 256x128, 128x128 with 4 warps (halves, and the whole
    tile) and with 8 warps and 5 stages. Cross-compiled for sm_90, each one's shared memory is what its pointer-store
    twin takes, or less."""
    return [
        _tile("tma_persistent", 128, 256, 128, 8, 3, C_TMA=1),
        _tile("tma_persistent", 128, 256, 128, 8, 4, EPILOGUE_PARTS=4, C_TMA=1),
        _tile("tma_persistent", 256, 128, 128, 8, 3, C_TMA=1),
        _tile("tma_persistent", 128, 128, 128, 4, 4, C_TMA=1),
        _tile("tma_persistent", 128, 128, 128, 4, 4, EPILOGUE_PARTS=1, C_TMA=1),
        _tile("tma_persistent", 128, 128, 128, 8, 5, C_TMA=1),
    ]


def mm_configs() -> list[Config]:
    """Every candidate of the tensor-core specs (matmul, addmm, bmm, baddbmm)."""
    return classic_configs() + small_m_configs() + unpipelined_configs() + split_k_configs() + tma_persistent_configs()


def _gemv(bn: int, bk: int, warps: int, stages: int) -> Config:
    return Config.make(num_warps=warps, num_stages=stages, KIND="gemv", BLOCK_N=bn, BLOCK_K=bk)


DEFAULT_GEMV = _gemv(32, 128, 4, 1)


def gemv_configs() -> list[Config]:
    """SIMT GEMV configs: output columns per program (BLOCK_N) x K chunk (BLOCK_K) at 2K to 8K products per chunk
    (wide-and-short tiles suit a row-major W, narrow-and-deep ones nn.Linear's column-major W), 4 or 8 warps, 1 or 3
    stages."""
    out = []
    for bn, bk in ((8, 512), (16, 256), (16, 512), (32, 128), (32, 256), (64, 64), (64, 128), (128, 32), (128, 64)):
        for warps in (4, 8):
            for stages in (1, 3):
                out.append(_gemv(bn, bk, warps, stages))
    return out


# ======================================================================================================================
# Prune: device facts (and, for TMA, the problem's `aligned` and K)
# ======================================================================================================================
# The widest epilogue conversion scratch Triton may take, per output element: float32 (the accumulator) before the
# cast. Counted in full only where it cannot reuse the pipeline's buffers (the persistent kernel keeps them live).
_EPILOGUE_BYTES = 4


def smem_estimate(config: Config) -> int:
    """Bytes of shared memory the config's main kernel needs, an upper bound of Triton's figure (see module doc).

    tiled / split_k: (BLOCK_M + BLOCK_N) · K_BYTES · num_stages (the pipelined A and B tiles; the epilogue's layout
    conversion reuses them, and is at most BLOCK_M·BLOCK_N·4 bytes, so the max of the two is taken).
    tma_persistent: the pipelined tiles plus the epilogue's conversion scratch, which cannot reuse them (the flattened
    loop keeps the pipeline buffers live across the epilogue): the kernel stores the tile in EPILOGUE_PARTS column
    slices (1, 2 or 4), so that scratch is at most BLOCK_M·BLOCK_N/EPILOGUE_PARTS float32 values (a slice stored by
    TMA, C_TMA, is staged in that same space); plus one 8-byte mbarrier per stage.
    gemv: with num_stages > 1 the X and W chunks are pipelined through shared memory, (BLOCK_M + BLOCK_N) · BLOCK_K
    elements per stage; the final reduction over the K chunk may stage the whole float32 partial sum there,
    BLOCK_M·BLOCK_K·BLOCK_N·4 bytes, once the pipeline's buffers are dead (so the max of the two is taken). BLOCK_M
    is counted as 4 (the largest) and elements as 4 bytes (the widest dtype): the config alone must bound it.
    """
    p = config.params
    if p["KIND"] == "gemv":
        reduction = GEMV_MAX_M * p["BLOCK_K"] * p["BLOCK_N"] * 4
        pipeline = (GEMV_MAX_M + p["BLOCK_N"]) * p["BLOCK_K"] * 4 * config.num_stages if config.num_stages > 1 else 0
        return max(reduction, pipeline)
    pipeline = (p["BLOCK_M"] + p["BLOCK_N"]) * p["K_BYTES"] * config.num_stages
    epilogue = p["BLOCK_M"] * p["BLOCK_N"] * _EPILOGUE_BYTES
    if p["KIND"] == "tma_persistent":
        return pipeline + epilogue // epilogue_parts(config) + 8 * config.num_stages
    return max(pipeline, epilogue)


def _has_tma(profile) -> bool:
    """TMA is a Hopper feature (compute capability >= 9.0, from the device file); Triton's interpreter emulates
    tensor descriptors, so the interpreter profile keeps TMA candidates (and CI runs them)."""
    if profile.backend == "interpreter":
        return True
    cc = getattr(profile, "compute_capability", None)
    return profile.backend == "cuda" and cc is not None and tuple(cc) >= (9, 0)


def _prune_mm(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    has_tma = _has_tma(profile)

    def check(c: Config) -> str | None:
        if c["KIND"] == "tma_persistent":
            if not has_tma:
                cc = getattr(profile, "compute_capability", None)
                return f"TMA needs compute capability >= 9.0; {profile.key} states {cc}"
            if not problem.get("aligned", 0):
                return "TMA needs aligned=1 operands (unit inner stride, 16-byte aligned base and outer strides)"
            if problem["K"] == 0:
                return "TMA descriptors cannot describe K = 0"
        return shared_memory_refusal(smem_estimate(c), profile)

    return prune_with(candidates, profile, check)


_prune_gemv = gemv_prune(smem_estimate)


# ======================================================================================================================
# Problems, layouts, inputs
# ======================================================================================================================
def _col_major(t: Tensor) -> int:
    """1 when the last two dimensions are column-major (unit stride on the row axis), else 0."""
    strides = t.stride()
    return int(strides[-1] != 1 and strides[-2] == 1)


def _tma_ready(t: Tensor, col_major: int) -> bool:
    """Whether TMA can read `t` ([..., rows, cols], `col_major` as `_col_major` says) as it lies: a unit inner
    stride, a 16-byte aligned base pointer and outer strides that are multiples of 16 bytes (size-1 dimensions'
    strides do not count). On every served launch, so written for the host's time (tuples read once)."""
    if t.data_ptr() % 16:
        return False
    shape, strides, item = t.shape, t.stride(), t.itemsize
    inner = len(shape) - 2 if col_major else len(shape) - 1
    if shape[inner] > 1 and strides[inner] != 1:
        return False
    for d, (size, stride) in enumerate(zip(shape, strides, strict=False)):
        if d != inner and size != 1 and stride != 0 and (stride * item) % 16:
            return False
    return True


def _layout_fields(a: Tensor, b: Tensor) -> dict[str, int]:
    """The key fields both products take from their operands' layouts: trans_a, trans_b and aligned (TMA-legal)."""
    trans_a, trans_b = _col_major(a), _col_major(b)
    return {"trans_a": trans_a, "trans_b": trans_b, "aligned": int(_tma_ready(a, trans_a) and _tma_ready(b, trans_b))}


def _problem_2d(a: Tensor, b: Tensor, out: Tensor | None) -> dict[str, Any]:
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeMismatch(f"matmul takes 2-d A and B, got {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise ShapeMismatch(f"matmul inner dimensions differ: A {a.shape}, B {b.shape}")
    return {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1], **_layout_fields(a, b)}


def _problem_3d(a: Tensor, b: Tensor) -> dict[str, Any]:
    if a.ndim != 3 or b.ndim != 3:
        raise ShapeMismatch(f"bmm takes 3-d A and B, got {a.shape} and {b.shape}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ShapeMismatch(f"bmm shapes do not match: A {a.shape}, B {b.shape} (expand a broadcast operand first)")
    batch = a.shape[0]
    return {
        "batch": batch,
        "M": a.shape[1],
        "N": b.shape[2],
        "K": a.shape[2],
        "bcast_a": int(batch > 1 and a.stride(0) == 0),
        "bcast_b": int(batch > 1 and b.stride(0) == 0),
        **_layout_fields(a, b),
    }


def _problem_gemv(x: Tensor, w: Tensor) -> dict[str, Any]:
    x2 = x.unsqueeze(0) if x.ndim == 1 else x
    if x2.ndim != 2 or w.ndim != 2 or x2.shape[1] != w.shape[0]:
        raise ShapeMismatch(f"gemv takes X (M, K) or (K,) and W (K, N), got {x.shape} and {w.shape}")
    if x2.shape[0] > GEMV_MAX_M:
        raise LaunchError(f"gemv serves M <= {GEMV_MAX_M} (decode); M = {x2.shape[0]}: use matmul")
    return {"M": x2.shape[0], "N": w.shape[1], "K": w.shape[0], "trans_b": _col_major(w)}


def _activation_of(activation: str) -> str:
    if activation not in ACTIVATIONS:
        raise LaunchError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    return activation


def _matrix(gen, rows: int, cols: int, dtype: str, device: str, col_major: int, aligned: int, batch: int = 0):
    """A random matrix view [batch?, rows, cols] laid out row- or column-major. aligned=1: leading dimension and batch
    stride padded to 16 bytes (a strided view of a larger buffer, unless already a multiple); aligned=0: the view
    starts one element into its buffer, so its base pointer is not 16-byte aligned."""
    d = get_dtype(dtype)
    lead, inner = (cols, rows) if col_major else (rows, cols)
    per16 = 16 // d.itemsize
    ld = -(-max(inner, 1) // per16) * per16 if aligned else max(inner, 1)
    nb = max(batch, 1)
    offset = 0 if aligned else 1
    storage = _inputs.randn(gen, (nb * lead * ld + offset,), dtype, device)
    stored = Tensor(storage.untyped_storage(), (nb, lead, inner), (lead * ld, ld, 1), d, offset)
    view = stored.transpose(1, 2) if col_major else stored
    return view if batch else view[0]


def _make_mm_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    """A, B (and bias, for addmm/baddbmm) in the problem's layouts; out (M, N) contiguous."""
    gen = _inputs.rng(seed)
    dtype = dtypes[0]
    m, n, k = problem["M"], problem["N"], problem["K"]
    batch = problem.get("batch", 0)
    aligned = problem.get("aligned", 1)
    a = _matrix(gen, m, k, dtype, device, problem["trans_a"], aligned, batch)
    b = _matrix(gen, k, n, dtype, device, problem["trans_b"], aligned, batch)
    if batch and problem.get("bcast_a"):
        a = a[:1].expand(batch, m, k)
    if batch and problem.get("bcast_b"):
        b = b[:1].expand(batch, k, n)
    tensors = {"a": a, "b": b, "out": empty((batch, m, n) if batch else (m, n), dtype, device)}
    scalars: dict[str, Any] = {"alpha": 1.0, "beta": 1.0, "activation": problem.get("activation", "none")}
    if "activation" in problem:
        # the nn.Linear bias (a row broadcast over M, and over the batch for baddbmm)
        tensors["bias"] = _inputs.randn(gen, (n,), dtypes[2], device)
    return Inputs(tensors=tensors, scalars=scalars, outputs=("out",), problem=dict(problem))


def _make_gemv_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    gen = _inputs.rng(seed)
    dtype = dtypes[0]
    m, n, k = problem["M"], problem["N"], problem["K"]
    if m > GEMV_MAX_M:
        raise LaunchError(f"gemv serves M <= {GEMV_MAX_M}; problem has M = {m}")
    x = _inputs.randn(gen, (m, k), dtype, device)
    w = _matrix(gen, k, n, dtype, device, problem["trans_b"], 1)
    tensors = {"x": x, "w": w, "out": empty((m, n), dtype, device)}
    scalars: dict[str, Any] = {"alpha": 1.0, "beta": 1.0, "activation": problem.get("activation", "none")}
    if "activation" in problem:
        tensors["bias"] = _inputs.randn(gen, (n,), dtypes[2], device)
    return Inputs(tensors=tensors, scalars=scalars, outputs=("out",), problem=dict(problem))


def _oracle_mm(inputs: Inputs) -> dict[str, Reference]:
    from nbxcert.kernels.products import device_products  # the oracle's float64 products: host or GPU

    t = inputs.tensors
    a, b = (t["a"], t["b"]) if "a" in t else (t["x"], t["w"])
    bias = t["bias"].float64() if "bias" in t else None
    terms = {
        "alpha": inputs.scalars.get("alpha", 1.0),
        "beta": inputs.scalars.get("beta", 1.0),
        "activation_name": inputs.scalars.get("activation", "none"),
        "acc_eps": ACC_EPS,
        "out_eps": finfo(t["out"].dtype)["eps"],
    }
    made = device_products(a, b)
    if made is None:  # widened on the host, only the operands (not the output to be written)
        value, scale = _oracle.addmm(a.float64(), b.float64(), bias, **terms)
    else:
        value, scale = _oracle.addmm_of(*made, a.shape[-1], bias, **terms)
    return {"out": Reference(value, scale)}


# ======================================================================================================================
# Launch
# ======================================================================================================================
_BACKEND: list[str] = []  # the process's backend name, read once (the choice is fixed per process)


def _interpreting() -> bool:
    if not _BACKEND:
        from nbxcert.kernels.backends import select

        _BACKEND.append(select().name)
    return _BACKEND[0] == "interpreter"


# The launch path stays lean on purpose: a product of a few microseconds on the GPU is timed with its host-side launch
# cost when that cost exceeds what is queued ahead of it, so operands are passed as (tensor, strides) pairs rather
# than as new 3-d Tensor views, and each config's launch parameters are derived once.
def _strides3(t: Tensor, what: str, batch: int, rows: int, cols: int) -> tuple[int, int, int]:
    """`t`'s element strides as a [batch, rows, cols] operand, broadcasting as numpy does: missing leading dimensions
    and size-1 dimensions get stride 0. Refuses a tensor that does not broadcast to that shape."""
    shape, strides, nd = t.shape, t.strides, t.ndim
    target = (batch, rows, cols)
    if nd > 3:
        raise ShapeMismatch(f"{what} has {nd} dimensions; at most 3 broadcast to {target}")
    out = [0, 0, 0]
    for i in range(1, nd + 1):
        size = shape[-i]
        if size != target[-i] and size != 1:
            raise ShapeMismatch(f"{what} of shape {shape} does not broadcast to {target}")
        out[-i] = 0 if size == 1 else strides[-i]
    return out[0], out[1], out[2]


def _check_offsets(what: str, strides: tuple[int, int, int], rows: int, cols: int) -> None:
    """Within one batch the kernels index with 32-bit offsets; refuse a matrix whose offsets do not fit."""
    span = abs(strides[1]) * max(rows - 1, 0) + abs(strides[2]) * max(cols - 1, 0)
    if span > INT32_MAX:
        raise LaunchError(f"{what}: a matrix spanning {span} elements exceeds the kernels' 32-bit offsets")


_SM_COUNT: dict[int, int] = {}


def _programs(device_index: int) -> int:
    if _interpreting():
        return _INTERPRETER_PROGRAMS
    count = _SM_COUNT.get(device_index)
    if count is None:
        from nbxcert.kernels.backends import device_info

        count = _SM_COUNT[device_index] = device_info(device_index).attributes["multiprocessor_count"]
    return count


@functools.cache
def _plan(config: Config, itemsize: int) -> tuple:
    """A config's launch parameters, derived once: (KIND, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K,
    EPILOGUE_PARTS, C_TMA)."""
    p = config.params
    if p["KIND"] not in ("tiled", "split_k", "tma_persistent"):
        raise LaunchError(f"config {config.label()} has KIND={p['KIND']!r}, not a matmul kernel")
    block_k = p["K_BYTES"] // itemsize
    return (
        p["KIND"],
        p["BLOCK_M"],
        p["BLOCK_N"],
        block_k,
        p["GROUP_M"],
        p.get("SPLIT_K", 1),
        epilogue_parts(config),
        bool(p.get("C_TMA", 0)),
    )


def _launch_mm(
    config: Config, batch: int, a: Tensor, b: Tensor, out: Tensor, bias: Tensor | None, alpha, beta, activation: str
) -> list[KernelLaunch] | None:
    """Launch `config` on A [batch, M, K] @ B [batch, K, N] -> out [batch, M, N], act(beta·bias + alpha·A@B) with a
    bias broadcastable to out (batch stride 0 broadcasts an operand). Returns the launch made where a later call may
    replay it (`LaunchPlan`: the tiled kind), else None (split-K's shared workspace, taken under its lock; TMA
    descriptors, made from this call's addresses)."""
    ops = _operands(a, b, out, bias, batch)
    m, n, k, a_st, b_st, c_st, bias_st = ops
    if m == 0 or n == 0 or batch == 0:
        return None
    _check_operands(("A", "B"), ops, bias is not None)
    if batch > 65535:
        raise LaunchError(f"batch {batch} exceeds the grid's 65535 programs along the batch axis")
    kind, bm, bn, block_k, group_m, split_k, parts, c_tma = _plan(config, a.itemsize)
    upcast = a.dtype.name == "bfloat16" and _interpreting()
    has_bias = bias is not None
    if not has_bias:
        bias = out  # never read when HAS_BIAS is False (its strides are 0)
    tiles = cdiv(m, bm) * cdiv(n, bn)
    warps, stages = config.num_warps, config.num_stages
    if kind != "tma_persistent":
        # what the tiled and the split-K kernels take alike
        tile = dict(
            DOT_PRECISION="ieee",
            UPCAST=upcast,
            EVEN_K=(k % block_k == 0),
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=block_k,
            GROUP_M=group_m,
            RUN_M=wrap_run(m, bm, a_st[1]),
            RUN_N=wrap_run(n, bn, b_st[2]),
            num_warps=warps,
            num_stages=stages,
        )
    if kind == "tiled":
        launch = KernelLaunch(
            _mm_tiled_kernel,
            (tiles, batch),
            (a, b, out, bias, m, n, k, *a_st, *b_st, *c_st, *bias_st, alpha, beta),
            dict(HAS_BIAS=has_bias, ACTIVATION=activation, **tile),
        )
        launch()
        return [launch]
    elif kind == "split_k":
        k_per_split = cdiv(cdiv(max(k, 1), split_k), block_k) * block_k
        with _workspace.lock:
            ws = _workspace.get(split_k * batch * m * n, a.device)
            launch_kernel(
                _mm_split_k_kernel,
                (tiles, split_k, batch),
                a,
                b,
                ws,
                m,
                n,
                k,
                k_per_split,
                *a_st,
                *b_st,
                batch * m * n,
                m * n,
                **tile,
            )
            launch_kernel(
                _split_k_reduce_kernel,
                (cdiv(m * n, _REDUCE_BLOCK), batch),
                ws,
                out,
                bias,
                m,
                n,
                batch * m * n,
                m * n,
                *c_st,
                *bias_st,
                alpha,
                beta,
                HAS_BIAS=has_bias,
                ACTIVATION=activation,
                SPLIT_K=split_k,
                BLOCK=_REDUCE_BLOCK,
                num_warps=_REDUCE_WARPS,
            )
    else:  # tma_persistent
        a_desc, trans_a, a_step = _descriptor(a, "A", a_st, batch, m, k, (bm, block_k))
        b_desc, trans_b, b_step = _descriptor(b, "B", b_st, batch, k, n, (block_k, bn))
        programs = min(tiles * batch, _programs(a.device.index))
        # C_TMA stores through C's descriptor where `out` allows it (row-major, 16-byte aligned base and strides),
        # else by pointers: the same values either way (tested), so a caller's strided `out` still takes the config
        c_tma = c_tma and _c_tma_ready(out, c_st, batch, m)
        c_desc = _descriptor(out, "out", c_st, batch, m, n, (bm, bn // parts))[0] if c_tma else None
        launch_kernel(
            _mm_tma_persistent_kernel,
            (programs,),
            a_desc,
            b_desc,
            c_desc,
            out,
            bias,
            m,
            n,
            k,
            batch,
            a_step,
            b_step,
            programs,
            *c_st,
            *bias_st,
            alpha,
            beta,
            TRANS_A=trans_a,
            TRANS_B=trans_b,
            BATCHED=batch > 1,
            HAS_BIAS=has_bias,
            ACTIVATION=activation,
            DOT_PRECISION="ieee",
            UPCAST=upcast,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=block_k,
            GROUP_M=group_m,
            EPILOGUE_PARTS=parts,
            C_TMA=c_tma,
            num_warps=warps,
            num_stages=stages,
        )
    return None


def _c_tma_ready(out: Tensor, c_st: tuple[int, int, int], batch: int, m: int) -> bool:
    """Whether the TMA store can write `out` ([batch, M, N] at element strides `c_st`): unit column stride, a 16-byte
    aligned base, and row and batch strides that are multiples of 16 bytes where they count (M > 1, batch > 1; a
    batch stride of 0, every batch on the same rows, is left to the pointer stores)."""
    sb, sr, sc = c_st
    item = out.itemsize
    return (
        sc == 1
        and out.data_ptr() % 16 == 0
        and (m == 1 or (sr * item) % 16 == 0)
        and (batch == 1 or (sb != 0 and (sb * item) % 16 == 0))
    )


def _descriptor(t: Tensor, what: str, st: tuple[int, int, int], batch: int, rows: int, cols: int, block):
    """A host TMA descriptor of operand `t` ([batch, rows, cols] at strides `st`) as it lies in memory (its transpose
    when column-major): (descriptor, column-major?, batch step: 0 when broadcast over the batch). Refuses an operand
    TMA cannot read (the prune refuses TMA configs for problems with aligned=0, so a certified launch never gets here
    with one)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    sb, sr, sc = st
    col_major = sc != 1 and sr == 1 and cols > 1
    if col_major:
        rows, cols, sr, sc, block = cols, rows, sc, sr, (block[1], block[0])
    if rows > 1 and cols > 1 and sc != 1 or cols == 0 or rows == 0:
        raise LaunchError(f"{what}: TMA needs a unit inner stride (strides {st}); use a tiled or split_k config")
    item = t.itemsize
    ld = sr if rows > 1 else -(-cols * item // 16) * 16 // item  # a size-1 dimension's stride is free: make it legal
    if t.data_ptr() % 16 or (ld * item) % 16 or (batch > 1 and sb and (sb * item) % 16):
        raise LaunchError(
            f"{what}: TMA needs a 16-byte aligned base and 16-byte multiple strides (strides {st}, base "
            f"0x{t.data_ptr():x}); the prune refuses TMA configs for problems with aligned=0"
        )
    if batch == 1:
        return TensorDescriptor(t, [rows, cols], [ld, 1], list(block)), col_major, 0
    step = 1 if sb else 0
    return (
        TensorDescriptor(t, [batch if step else 1, rows, cols], [sb if step else rows * ld, ld, 1], [1, *block]),
        (col_major),
        step,
    )


def _launch_gemv(
    config: Config, x: Tensor, w: Tensor, out: Tensor, bias: Tensor | None, alpha, beta, activation: str
) -> None:
    """Launch `config` on X [M, K] @ W [K, N] -> out [M, N] (operands as in `_launch_mm`, batch 1)."""
    ops = _operands(x, w, out, bias, 1)
    m, n, k, x_st, w_st, c_st, bias_st = ops
    if m == 0 or n == 0:
        return
    if m > GEMV_MAX_M:
        raise LaunchError(f"gemv serves M <= {GEMV_MAX_M} (decode); M = {m}: use matmul")
    _check_operands(("X", "W"), ops, bias is not None)
    has_bias = bias is not None
    if not has_bias:
        bias = out
    if config.get("KIND") != "gemv":
        raise LaunchError(f"config {config.label()} has KIND={config.get('KIND')!r}, not a gemv kernel")
    bn, bk = config["BLOCK_N"], config["BLOCK_K"]
    launch_kernel(
        _gemv_kernel,
        (cdiv(n, bn),),
        x,
        w,
        out,
        bias,
        m,
        n,
        k,
        x_st[1],
        x_st[2],
        w_st[1],
        w_st[2],
        c_st[1],
        c_st[2],
        bias_st[1],
        bias_st[2],
        alpha,
        beta,
        HAS_BIAS=has_bias,
        ACTIVATION=activation,
        EVEN_K=(k % bk == 0),
        BLOCK_M=next_pow2(m),
        BLOCK_N=bn,
        BLOCK_K=bk,
        STAGES=config.num_stages,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def _operands(a: Tensor, b: Tensor, out: Tensor, bias: Tensor | None, batch: int):
    """(m, n, k, a's strides, b's, out's, bias's) of a product's tensors, each as a [batch, rows, cols] operand
    (`_strides3`; a missing bias has strides (0, 0, 0))."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    bias_st = _strides3(bias, "bias", batch, m, n) if bias is not None else (0, 0, 0)
    return (
        m,
        n,
        k,
        _strides3(a, "A", batch, m, k),
        _strides3(b, "B", batch, k, n),
        _strides3(out, "out", batch, m, n),
        bias_st,
    )


def _check_operands(names: tuple[str, str], ops: tuple, has_bias: bool) -> None:
    """`_check_offsets` for each matrix of `ops` (as `_operands` gives them); `names`: how errors name A and B."""
    m, n, k, a_st, b_st, c_st, bias_st = ops
    _check_offsets(names[0], a_st, m, k)
    _check_offsets(names[1], b_st, k, n)
    _check_offsets("out", c_st, m, n)
    if has_bias:
        _check_offsets("bias", bias_st, m, n)


def _launch_inputs(config: Config, inputs: Inputs) -> None:
    """The spec's launch: one config on made inputs (any of the six specs)."""
    t, s = inputs.tensors, inputs.scalars
    bias, out = t.get("bias"), t["out"]
    if "x" in t:
        _launch_gemv(config, t["x"], t["w"], out, bias, s["alpha"], s["beta"], s["activation"])
        return
    a = t["a"]
    _launch_mm(config, a.shape[0] if a.ndim == 3 else 1, a, t["b"], out, bias, s["alpha"], s["beta"], s["activation"])


# ======================================================================================================================
# Specs
# ======================================================================================================================
_MM_KEY = (
    KeyField("M", "tokens"),
    KeyField("N"),
    KeyField("K"),
    KeyField("trans_a"),
    KeyField("trans_b"),
    KeyField("aligned"),
)
_BMM_KEY = (KeyField("batch", "batch"),) + _MM_KEY + (KeyField("bcast_a"), KeyField("bcast_b"))
_GEMV_KEY = (KeyField("M"), KeyField("N"), KeyField("K"), KeyField("trans_b"))

_MM_EXAMPLES = (
    {"M": 33, "N": 47, "K": 29, "trans_a": 0, "trans_b": 0, "aligned": 1},
    {"M": 1, "N": 40, "K": 72, "trans_a": 0, "trans_b": 1, "aligned": 1},
    {"M": 70, "N": 24, "K": 64, "trans_a": 1, "trans_b": 1, "aligned": 1},
    {"M": 17, "N": 33, "K": 100, "trans_a": 1, "trans_b": 0, "aligned": 0},
)
_BMM_EXAMPLES = (
    {"batch": 3, "M": 33, "N": 47, "K": 29, "trans_a": 0, "trans_b": 0, "bcast_a": 0, "bcast_b": 0, "aligned": 1},
    {"batch": 4, "M": 5, "N": 24, "K": 40, "trans_a": 1, "trans_b": 0, "bcast_a": 0, "bcast_b": 1, "aligned": 1},
    {"batch": 2, "M": 20, "N": 9, "K": 16, "trans_a": 0, "trans_b": 1, "bcast_a": 1, "bcast_b": 0, "aligned": 0},
)
_GEMV_EXAMPLES = (
    {"M": 1, "N": 47, "K": 29, "trans_b": 0},
    {"M": 3, "N": 40, "K": 200, "trans_b": 1},
    {"M": 4, "N": 130, "K": 64, "trans_b": 0},
)


def _with_activation(examples, activations=ACTIVATIONS):
    return tuple(dict(e, activation=activations[i % len(activations)]) for i, e in enumerate(examples))


def _same(combo: tuple[str, ...]) -> tuple[str, ...]:
    return (combo[0],)


def _check_dtypes(*tensors: Tensor | None) -> None:
    names = {t.dtype.name for t in tensors if t is not None}
    if len(names) > 1:
        raise ShapeMismatch(f"matmul family operands must share one dtype, got {sorted(names)}")


# --- user-facing problem_of functions (the runtime's key) and launches ------------------------------------------------
def _problem_matmul(a: Tensor, b: Tensor, out: Tensor | None = None, config: Config | None = None) -> dict[str, Any]:
    return _problem_2d(a, b, out)


def _problem_addmm(bias, a, b, *, beta=1.0, alpha=1.0, activation="none", out=None, config=None) -> dict[str, Any]:
    return dict(_problem_2d(a, b, out), activation=_activation_of(activation))


def _problem_bmm(a: Tensor, b: Tensor, out: Tensor | None = None, config: Config | None = None) -> dict[str, Any]:
    return _problem_3d(a, b)


def _problem_baddbmm(bias, a, b, *, beta=1.0, alpha=1.0, activation="none", out=None, config=None) -> dict[str, Any]:
    return dict(_problem_3d(a, b), activation=_activation_of(activation))


def _problem_gemv_user(x: Tensor, w: Tensor, out: Tensor | None = None, config: Config | None = None) -> dict:
    return _problem_gemv(x, w)


def _problem_addmv(bias, x, w, *, beta=1.0, alpha=1.0, activation="none", out=None, config=None) -> dict[str, Any]:
    return dict(_problem_gemv(x, w), activation=_activation_of(activation))


_MM_PROBLEM = ("M", "N", "K", "trans_a", "trans_b", "aligned")
_BMM_PROBLEM = ("batch",) + _MM_PROBLEM + ("bcast_a", "bcast_b")
_GEMV_PROBLEM = ("M", "N", "K", "trans_b")

_MM_CANDIDATES = tuple(mm_configs())
_GEMV_CANDIDATES = tuple(gemv_configs())


# each product's problem args, key fields and examples (the fused specs add the activation to them)
_PRODUCTS = {
    "mm": (_MM_PROBLEM, _MM_KEY, _MM_EXAMPLES),
    "bmm": (_BMM_PROBLEM, _BMM_KEY, _BMM_EXAMPLES),
    "gemv": (_GEMV_PROBLEM, _GEMV_KEY, _GEMV_EXAMPLES),
}


def _spec(name: str, product: str, problem_of, description: str, activations=()) -> KernelSpec:
    """One spec of the family, of `product` ("mm", "bmm": the tensor-core kernels; "gemv": the SIMT one). With
    `activations` (addmm, baddbmm, addmv) it takes a bias of the operands' dtype and the activation as an exact key
    field, its examples cycling through these activations."""
    problem_args, key, examples = _PRODUCTS[product]
    if activations:
        problem_args += ("activation",)
        key += (KeyField("activation"),)
        examples = _with_activation(examples, activations)
    if product == "gemv":
        kernels, operands = (_gemv_kernel,), ("x", "w", "bias")
        tuning, make_inputs, no_bit_fields = (_GEMV_CANDIDATES, DEFAULT_GEMV, _prune_gemv), _make_gemv_inputs, ()
    else:
        kernels = (_mm_tiled_kernel, _mm_split_k_kernel, _split_k_reduce_kernel, _mm_tma_persistent_kernel)
        operands, tuning, make_inputs = ("a", "b", "bias"), (_MM_CANDIDATES, DEFAULT_MM, _prune_mm), _make_mm_inputs
        no_bit_fields = ("GROUP_M", "C_TMA")
    dtypes = DTYPES_3 if activations else DTYPES_2
    return family_spec(
        "matmul",
        name,
        description,
        kernels,
        problem_args=problem_args,
        key_fields=key,
        dtype_args=operands[: len(dtypes[0])],
        dtypes=dtypes,
        output_dtypes=_same,
        tuning=tuning,
        parts=(make_inputs, _launch_inputs, _oracle_mm, problem_of),
        no_bit_fields=no_bit_fields,
        examples=examples,
        oracle_name="oracles.matmul.addmm",
    )


MATMUL = _spec(
    "matmul",
    "mm",
    _problem_matmul,
    "C = A @ B (A, B row- or column-major), float32 accumulation, IEEE float32 products",
)
ADDMM = _spec(
    "addmm", "mm", _problem_addmm, "C = act(beta*bias + alpha*(A @ B)), act in none/relu/gelu_tanh/silu", ACTIVATIONS
)
BMM = _spec("bmm", "bmm", _problem_bmm, "C[i] = A[i] @ B[i], batch strides (0 broadcasts an operand)")
BADDBMM = _spec(
    "baddbmm", "bmm", _problem_baddbmm, "C[i] = act(beta*bias[i] + alpha*(A[i] @ B[i]))", ("gelu_tanh", "silu", "relu")
)
GEMV = _spec("gemv", "gemv", _problem_gemv_user, "C = X @ W for decode (M <= 4), SIMT (no tl.dot), fixed K-chunk order")
ADDMV = _spec(
    "addmv",
    "gemv",
    _problem_addmv,
    "C = act(beta*bias + alpha*(X @ W)) for decode (M <= 4)",
    ("silu", "gelu_tanh", "relu"),
)

SPECS = (MATMUL, ADDMM, BMM, BADDBMM, GEMV, ADDMV)


# ======================================================================================================================
# User-facing functions
# ======================================================================================================================
def _out(out: Tensor | None, shape: tuple[int, ...], like: Tensor) -> Tensor:
    if out is None:
        return empty(shape, like.dtype, like.device)
    if tuple(out.shape) != tuple(shape):
        raise ShapeMismatch(f"out has shape {out.shape}, the product has {shape}")
    if out.dtype is not like.dtype:
        raise ShapeMismatch(f"out has dtype {out.dtype.name}, the operands {like.dtype.name}")
    return out


def _run_gemv(cfg, x, w, out, bias, alpha, beta, activation) -> Tensor:
    """x (M, K) or (K,), out (M, N) or (N,) alike: a vector is one row."""
    x2 = x.unsqueeze(0) if x.ndim == 1 else x
    out2 = out.unsqueeze(0) if out.ndim == 1 else out
    _launch_gemv(cfg, x2, w, out2, bias, float(alpha), float(beta), activation)
    return out


def _product(spec, problem, x, w, bias, out, config, alpha=1.0, beta=1.0, activation="none") -> Tensor:
    """Every user wrapper's tail, once: `out` made (or checked), a config chosen (tuning times the real launch), run.

    x @ w (+ bias): the key's dtypes are x's, w's (and bias's), in the spec's `dtype_args` order; `out` takes x's
    dtype. A gemv spec keeps a vector x's output a vector; a problem with a batch is a batched product."""
    operands = (x, w) if bias is None else (x, w, bias)
    rows_cols = (problem["M"], problem["N"])
    if _gemv_kernel in spec.kernels:
        shape = rows_cols[1:] if x.ndim == 1 else rows_cols

        def run(c, out):
            return _run_gemv(c, x, w, out, bias, alpha, beta, activation)
    else:
        batch = problem.get("batch")
        shape = rows_cols if batch is None else (batch, *rows_cols)

        def run(c, out):
            return _launch_mm(c, 1 if batch is None else batch, x, w, out, bias, float(alpha), float(beta), activation)

    out = _out(out, shape, x)
    cfg = choose_config(
        spec, problem, tuple(t.dtype.name for t in operands), config, run=lambda c: run(c, out), outputs=(out,)
    )
    run(cfg, out)
    return out


@served
def matmul(a: Tensor, b: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """C = A @ B for 2-d A (M, K) and B (K, N) of one dtype (float16, bfloat16, float32); returns C (M, N)."""
    _check_dtypes(a, b, out)
    problem = _problem_matmul(a, b, out)
    return _product(MATMUL, problem, a, b, None, out, config)


@served
def addmm(
    bias: Tensor,
    a: Tensor,
    b: Tensor,
    *,
    beta: float = 1.0,
    alpha: float = 1.0,
    activation: str = "none",
    out: Tensor | None = None,
    config: Config | None = None,
) -> Tensor:
    """act(beta·bias + alpha·(A @ B)) (torch.addmm's argument order, plus a fused activation); bias broadcastable to
    (M, N)."""
    _check_dtypes(bias, a, b, out)
    problem = _problem_addmm(bias, a, b, activation=activation)
    return _product(ADDMM, problem, a, b, bias, out, config, alpha, beta, activation)


@served
def bmm(a: Tensor, b: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """C[i] = A[i] @ B[i] for A (batch, M, K), B (batch, K, N); a batch stride of 0 broadcasts an operand."""
    _check_dtypes(a, b, out)
    problem = _problem_bmm(a, b)
    return _product(BMM, problem, a, b, None, out, config)


@served
def baddbmm(
    bias: Tensor,
    a: Tensor,
    b: Tensor,
    *,
    beta: float = 1.0,
    alpha: float = 1.0,
    activation: str = "none",
    out: Tensor | None = None,
    config: Config | None = None,
) -> Tensor:
    """C[i] = act(beta·bias[i] + alpha·(A[i] @ B[i])); bias broadcastable to (batch, M, N)."""
    _check_dtypes(bias, a, b, out)
    problem = _problem_baddbmm(bias, a, b, activation=activation)
    return _product(BADDBMM, problem, a, b, bias, out, config, alpha, beta, activation)


@served
def gemv(x: Tensor, w: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """C = X @ W for decode: X (M, K) with M <= 4, or a vector (K,) (then C is (N,)); W (K, N) (pass nn.Linear's
    weight as `weight.T`)."""
    _check_dtypes(x, w, out)
    problem = _problem_gemv(x, w)
    return _product(GEMV, problem, x, w, None, out, config)


@served
def addmv(
    bias: Tensor,
    x: Tensor,
    w: Tensor,
    *,
    beta: float = 1.0,
    alpha: float = 1.0,
    activation: str = "none",
    out: Tensor | None = None,
    config: Config | None = None,
) -> Tensor:
    """act(beta·bias + alpha·(X @ W)) for decode (M <= 4); bias broadcastable to the output."""
    _check_dtypes(bias, x, w, out)
    problem = _problem_addmv(bias, x, w, activation=activation)
    return _product(ADDMV, problem, x, w, bias, out, config, alpha, beta, activation)


__all__ = [
    "ACTIVATIONS",
    "ADDMM",
    "ADDMV",
    "BADDBMM",
    "BMM",
    "GEMV",
    "MATMUL",
    "SPECS",
    "addmm",
    "addmv",
    "baddbmm",
    "bmm",
    "classic_configs",
    "gemv",
    "gemv_configs",
    "matmul",
    "mm_configs",
    "small_m_configs",
    "smem_estimate",
    "split_k_configs",
    "tma_persistent_configs",
    "unpipelined_configs",
]

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
