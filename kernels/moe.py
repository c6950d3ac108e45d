"""The mixture-of-experts family: `moe_align` (group token-expert pairs by expert, padded to blocks), `fused_moe`
(the grouped GEMM over those blocks, router weights applied) and `moe_sum` (each token's top-k outputs added).

Words: M tokens, each routed to `top_k` of E experts (`topk_ids` [M, top_k] int32, `topk_weights` [M, top_k]
float32); pair p = t·top_k + j is one (token, expert) assignment, P = M·top_k pairs. A MoE layer runs
moe_align -> fused_moe (gate/up, no weights) -> silu_and_mul -> fused_moe (down, weights applied) -> moe_sum.

`moe_align` (integers, certified exactly; oracle `nbxcert.oracles.moe.align`): the pairs sorted by expert (experts in
increasing order; within an expert, pairs in increasing p: a stable order, so the answer is unique and every config
gives the same bits), each expert's group padded with the sentinel P to a multiple of `block` (the BLOCK_M of the
fused_moe config that will read it), experts without pairs taking no block. Outputs: `sorted_ids` [P + min(E, P)·
(block - 1)] (the most padding can need; the tail past the padded count is P), `expert_ids` [cdiv(that, block)] (-1
past the padded count) and `num_padded` [1]. A pair whose expert is outside [0, E) is dropped. Three launches, no
atomics: `_align_count_kernel` (per program, how many of its pairs go to each expert; it also fills `sorted_ids` with
the sentinel), `_align_offsets_kernel` (one program: each program's first slot within each expert, each expert's
first slot, the padded count and the expert of every block) and `_align_scatter_kernel` (each pair's slot is its
expert's first slot + its program's offset + its rank among the program's earlier pairs of that expert, from a
cumulative sum of a one-hot [TILE, E] tile). Candidates (`align_configs()`): TILE pairs per step x STEPS steps per
program x num_warps. Prune: the one-hot tiles against the register budget (`registers_refusal`: one register per
element plus 40, as measured for the scatter kernel), the cumulative sum's shared memory (the whole int32 tile,
TILE·E·4 bytes) and warps without an element of their own (`lanes_refusal`).

`fused_moe` (oracle `nbxcert.oracles.moe.fused_moe`): out[p] = w_p·(a_row(p) @ W[e_p]ᵀ), one output row per pair, with
a_row(p) the token's row of `a` [M, K] or, `pair_rows` = 1, row p of `a` [P, K] (the down projection reads the activated
gate/up output, one row per pair); `mul_weight` = 1 multiplies by the pair's router weight (float32, in the float32
accumulator, then one rounding to the output dtype). W is [E, N, K] (each expert's nn.Linear weight, out x in). float16
and bfloat16; float32 accumulation. One program per (BLOCK_M rows of the aligned layout, BLOCK_N columns), grouped
launch order (GROUP_M block rows share their W columns in L2); a block row past the padded count returns at once. With
top_k = 1 the two A layouts coincide and pair_rows is 0. A K that is not a multiple of BLOCK_K takes a masked loop that
Triton 3.6 does not pipeline (the census shows one buffer allocated, and the widest tiles spilling, at the tiny example
K of 40 and 72); the models' K (multiples of 256) take the unmasked one. Candidates, learned from vLLM's per-GPU tuned
files for fused_moe (`vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H200.json`,
`E=128,N=768,device_name=NVIDIA_H200.json`) and its tuning space (benchmarks/kernels/benchmark_moe.py: BLOCK_SIZE_M
16..256, N 32..256, K 64..256, GROUP_SIZE_M 1, 16, 32, 64, 4 or 8 warps, 2 to 5 stages): `decode_configs()` (16- and
32-row blocks: what those tables pick up to a few hundred tokens, when each expert sees few rows), `prefill_configs()`
(64..256-row blocks, 128..256-wide tiles, 3 or 4 stages, what they pick from 512 tokens up), `unpipelined_configs()`
(num_stages 1, for devices whose files state max_num_stages = 1) and the untuned default (vLLM's `get_default_config`
when no tuned file matches: 64x64x32, GROUP_SIZE_M 8, with Triton's default 4 warps and 3 stages). Prune (device facts
only): stages, threads, and shared memory `(BLOCK_M + BLOCK_N)·BLOCK_K·2·num_stages` (16-bit operands; the epilogue's
float32 layout-conversion scratch BLOCK_M·BLOCK_N·4 reuses the pipeline's buffers, so the larger of the two;
num_stages - 1 buffers on compute capability 8.x, see `smem_estimate`), checked by `nbxcert census`.

`moe_sum` (oracle `nbxcert.oracles.moe.moe_sum`): out[t] = Σ_j x[t, j] for x [M, top_k, N], summed in float32 in the
order j = 0, 1, ... and rounded once. Candidates BLOCK_N x num_warps; prune: lanes.

Keys: M on the device file's `tokens` ladder (vLLM's tuned files are keyed by the same token counts); experts, top_k,
block (moe_align), N, K, mul_weight, pair_rows (fused_moe) exact. Under Triton's interpreter (`UPCAST`) fused_moe
converts tiles to float32 before tl.dot (the interpreter's tl.dot multiplies bfloat16 storage as raw integers).

No-bit fields: fused_moe's GROUP_M (it only orders the programs); every moe_align field (the stable order is unique);
moe_sum's BLOCK_N and num_warps (each element is summed alone, in the same order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbxcert.errors import LaunchError, ShapeMismatch
from nbxcert.kernels import inputs as _inputs
from nbxcert.kernels.common import dot_over_k, family_spec, tile_coords, wrap_run
from nbxcert.kernels.dtypes import finfo
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.launch import cdiv, launch_kernel, served
from nbxcert.kernels.prune import lanes_refusal, next_pow2, prune_with, registers_refusal, shared_memory_refusal
from nbxcert.kernels.spec import Config, Inputs, KeyField, PruneResult, Reference, choose_config
from nbxcert.kernels.tensor import Tensor, empty, from_bits, from_numpy
from nbxcert.oracles import moe as _oracle

DTYPES = (("float16", "float16"), ("bfloat16", "bfloat16"))
ACC_EPS = 2.0**-23  # float32 accumulation in fused_moe and moe_sum
MAX_EXPERTS = 128  # the range (8 to 128 experts); the offsets kernel holds one value per expert
# The offsets kernel (one program, not tuned: it runs once per alignment over a [programs, experts] table) walks its
# table in [ROWS, E_BLOCK] tiles of this many elements, with this many warps.
_OFFSETS_TILE = 2048
_OFFSETS_WARPS = 4
# Registers the scatter kernel (the hungrier of the two tiled ones) needs: one per [TILE, E_BLOCK] element a thread
# holds, plus the rest. Measured with `nbxcert census --profile hopper` (Triton 3.6, sm_90): 128 elements per thread
# took 167 or 168 registers and 64 elements 72 to 151, with no spill; at 256 per thread ptxas reached its cap of 255.
_ALIGN_REGS_PER_ELEMENT = 1
_ALIGN_SCALAR_REGS = 40


# ======================================================================================================================
# Triton kernels
# ======================================================================================================================
@jit
def _align_count_kernel(
    ids_ptr,
    counts_ptr,
    sorted_ptr,
    n_pairs,
    sorted_len,
    fill_per_program,
    TILE: tl.constexpr,
    STEPS: tl.constexpr,
    E_BLOCK: tl.constexpr,
):
    """Per-program expert histogram, and the sentinel fill of `sorted_ids`. Grid: (programs,).

    ids_ptr: the P expert ids (int32, pair order). counts_ptr: int32 [programs, E_BLOCK]; row p gets, per expert, how
    many of program p's pairs (pairs [p·TILE·STEPS, (p+1)·TILE·STEPS)) it has (ids outside [0, E_BLOCK) count
    nowhere; the offsets kernel reads only columns < E). sorted_ptr: int32 [sorted_len]; program p writes the sentinel
    n_pairs into elements [p·fill_per_program, (p+1)·fill_per_program). n_pairs: P. TILE: pairs per step. STEPS: steps
    per program. E_BLOCK: next power of two >= E.
    """
    pid = tl.program_id(0)
    experts = tl.arange(0, E_BLOCK)
    counts = tl.zeros((E_BLOCK,), dtype=tl.int32)
    for s in range(STEPS):
        offs = pid * (TILE * STEPS) + s * TILE + tl.arange(0, TILE)
        ids = tl.load(ids_ptr + offs, mask=offs < n_pairs, other=-1)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + pid * E_BLOCK + experts, counts)
    first = pid * fill_per_program
    last = tl.minimum(first + fill_per_program, sorted_len)
    for start in range(first, last, TILE):
        idx = start + tl.arange(0, TILE)
        tl.store(sorted_ptr + idx, tl.full((TILE,), 0, tl.int32) + n_pairs, mask=idx < last)


@jit
def _align_offsets_kernel(
    counts_ptr,
    starts_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    n_programs,
    n_experts,
    n_blocks,
    block,
    ROWS: tl.constexpr,
    E_BLOCK: tl.constexpr,
):
    """Slots from counts. Grid: (1,).

    counts_ptr: int32 [n_programs, E_BLOCK] from `_align_count_kernel`, overwritten in place by the exclusive prefix
    over programs (row p: the first rank of program p's pairs within each expert). starts_ptr: int32 [E_BLOCK], gets
    each expert's first slot (experts' groups padded to multiples of `block`, laid end to end in expert order).
    expert_ids_ptr: int32 [n_blocks], the expert of each block, -1 past the padded count. num_padded_ptr: int32 [1],
    the padded count. n_experts: E. block: the alignment block. ROWS: table rows per step. E_BLOCK: as above.
    """
    experts = tl.arange(0, E_BLOCK)
    e_ok = experts < n_experts
    carry = tl.zeros((E_BLOCK,), dtype=tl.int32)
    for r0 in range(0, n_programs, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        ptrs = counts_ptr + rows[:, None] * E_BLOCK + experts[None, :]
        mask = (rows[:, None] < n_programs) & e_ok[None, :]
        c = tl.load(ptrs, mask=mask, other=0)
        tl.store(ptrs, tl.cumsum(c, axis=0) - c + carry[None, :], mask=mask)
        carry += tl.sum(c, axis=0)
    padded = (carry + block - 1) // block * block
    ends = tl.cumsum(padded, axis=0)
    tl.store(starts_ptr + experts, ends - padded)
    total = tl.sum(padded, axis=0)
    tl.store(num_padded_ptr, total)
    # block b starts at b·block; its expert is the first whose group ends after that, i.e. the number of experts
    # whose group ends at or before it (ends never decrease; experts without pairs end where the previous one does)
    for b0 in range(0, n_blocks, ROWS):
        b = b0 + tl.arange(0, ROWS)
        pos = b * block
        owner = tl.sum(((ends[None, :] <= pos[:, None]) & e_ok[None, :]).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + b, tl.where(pos < total, owner, -1), mask=b < n_blocks)


@jit
def _align_scatter_kernel(
    ids_ptr,
    counts_ptr,
    starts_ptr,
    sorted_ptr,
    n_pairs,
    n_experts,
    TILE: tl.constexpr,
    STEPS: tl.constexpr,
    E_BLOCK: tl.constexpr,
):
    """Each pair's slot. Grid: (programs,), the programs of `_align_count_kernel`.

    ids_ptr: the P expert ids. counts_ptr: the prefix table of `_align_offsets_kernel`. starts_ptr: each expert's
    first slot. sorted_ptr: int32 sorted_ids; slot s of pair p gets p. A pair's slot is starts[e] + counts[program, e]
    + the number of the program's earlier pairs with expert e (the one-hot tile's cumulative sum), so pairs keep their
    order within an expert. Pairs whose expert is outside [0, n_experts) are not placed. n_pairs: P. TILE, STEPS,
    E_BLOCK: as in `_align_count_kernel` (the same values: the programs must cover the same pairs).
    """
    pid = tl.program_id(0)
    experts = tl.arange(0, E_BLOCK)
    e_ok = experts < n_experts
    nxt = tl.load(starts_ptr + experts, mask=e_ok, other=0) + tl.load(
        counts_ptr + pid * E_BLOCK + experts, mask=e_ok, other=0
    )
    for s in range(STEPS):
        offs = pid * (TILE * STEPS) + s * TILE + tl.arange(0, TILE)
        ids = tl.load(ids_ptr + offs, mask=offs < n_pairs, other=-1)
        valid = (offs < n_pairs) & (ids >= 0) & (ids < n_experts)
        onehot = ((ids[:, None] == experts[None, :]) & valid[:, None]).to(tl.int32)
        rank = tl.cumsum(onehot, axis=0)  # 1-based rank among this program's pairs of the same expert so far
        slot = tl.sum(onehot * (nxt[None, :] + rank - 1), axis=1)
        tl.store(sorted_ptr + slot, offs, mask=valid)
        nxt += tl.sum(onehot, axis=0)


@jit
def _fused_moe_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    weights_ptr,
    sorted_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    N,
    K,
    n_pairs,
    blocks_m,
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    A_DIV: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    UPCAST: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    RUN_N: tl.constexpr,
):
    """The routed GEMM over aligned blocks. Grid: (blocks_m · cdiv(N, BLOCK_N),).

    a_ptr: A [rows, K] at (stride_am, stride_ak); pair p reads row p // A_DIV (A_DIV = top_k: one row per token;
    1: one row per pair). w_ptr: W [E, N, K] at (stride_we, stride_wn, stride_wk). c_ptr: C [P, N] at (stride_cm,
    stride_cn); row p written for every placed pair. weights_ptr: float32 router weights, one per pair (read only when
    MUL_WEIGHT). sorted_ptr, expert_ids_ptr, num_padded_ptr: the `moe_align` layout for block BLOCK_M (sorted pair
    ids, sentinel n_pairs; the expert of each block; the padded count). N, K: sizes. n_pairs: P. blocks_m: block rows
    in the grid (the layout's capacity / BLOCK_M). UPCAST: tiles to float32 before tl.dot (the interpreter). EVEN_K:
    K is a multiple of BLOCK_K. BLOCK_M, BLOCK_N, BLOCK_K: the tile. GROUP_M: block rows per launch-order group
    (changes no output bit). RUN_N: the contiguous runs of the wrapped column offsets (`wrap_run`).
    """
    pid_m, pid_n = tile_coords(tl.program_id(0), blocks_m, tl.cdiv(N, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < n_pairs
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    # padding rows read row 0 (always present) so the loads need no mask; their results are never stored
    rows = tl.where(valid, pairs // A_DIV, 0).to(tl.int64)
    # columns past N wrap around so the W loads need no mask (the store masks them); the hints restore what the
    # modulo hides from Triton's contiguity analysis (without them every W element's 64-bit address is kept live and
    # the 16-row tiles spill: seen with the census on sm_90), claiming no run longer than holds (`wrap_run`)
    offs_n = tl.max_contiguous(tl.multiple_of((pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N, RUN_N), RUN_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + expert * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = dot_over_k(a_ptrs, w_ptrs, offs_k, K, stride_ak, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, None)
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0)[:, None]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))


@jit
def _moe_sum_kernel(
    x_ptr,
    out_ptr,
    N,
    stride_xm,
    stride_xk,
    stride_xn,
    stride_om,
    stride_on,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out[t, n] = Σ_j x[t, j, n] in float32, j = 0..TOP_K-1 in order. Grid: (M, cdiv(N, BLOCK_N)).

    x_ptr: x [M, TOP_K, N] at (stride_xm, stride_xk, stride_xn). out_ptr: out [M, N] at (stride_om, stride_on).
    N: columns. TOP_K: the routed experts per token. BLOCK_N: columns per program (changes no output bit).
    """
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(x_ptr + t * stride_xm + j * stride_xk + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_om + cols * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


# ======================================================================================================================
# Candidate configs (named factories)
# ======================================================================================================================
def _align(tile: int, steps: int, warps: int) -> Config:
    return Config.make(num_warps=warps, num_stages=1, TILE=tile, STEPS=steps)


DEFAULT_ALIGN = _align(64, 1, 4)


def align_configs() -> list[Config]:
    """moe_align: pairs per step (TILE) x steps per program (STEPS: fewer programs, a smaller offsets table) x warps.
    num_stages is 1: no loop here feeds a tl.dot, which is all Triton's pipeliner pipelines."""
    out = []
    for tile in (16, 32, 64, 128, 256):
        for steps in (1, 4, 16):
            for warps in (1, 2, 4, 8):
                out.append(_align(tile, steps, warps))
    return out


def _moe(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 1) -> Config:
    return Config.make(num_warps=warps, num_stages=stages, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m)


DEFAULT_MOE = _moe(64, 64, 32, 4, 3, 8)  # vLLM get_default_config (no tuned file), Triton's default warps and stages


def decode_configs() -> list[Config]:
    """16- and 32-row blocks (each expert sees few rows): the tiles vLLM's H200 tables pick for Mixtral (E=8) and
    Qwen3-30B-A3B (E=128) up to a few hundred tokens, narrow-to-wide N, long K steps and 2 to 5 stages, plus vLLM's
    small-batch default (16x32x64, used when M <= E without a tuned file)."""
    shapes = (
        (16, 32, 64, 4, 3),
        (16, 64, 64, 4, 4),
        (16, 64, 64, 4, 5),
        (16, 64, 128, 4, 2),
        (16, 64, 128, 4, 3),
        (16, 64, 128, 4, 4),
        (16, 64, 256, 4, 2),
        (16, 64, 256, 4, 3),
        (16, 128, 128, 4, 2),
        (16, 128, 128, 4, 3),
        (16, 128, 128, 4, 5),
        (16, 128, 128, 8, 3),
        (16, 128, 256, 4, 2),
        (16, 256, 128, 8, 2),
        (32, 64, 128, 4, 5),
        (32, 128, 128, 4, 3),
        (32, 256, 128, 4, 2),
    )
    return [_moe(*s, group_m=1) for s in shapes]


def prefill_configs() -> list[Config]:
    """64- to 256-row blocks for many tokens per expert: the 128x256x64 tile with 8 warps that vLLM's H200 tables
    pick from 1024 tokens up (4 stages; 3 for devices with less shared memory), and the 64-row tiles they pick in
    between; GROUP_M 16, the group those tables use most for large batches. The 128x256x64 tile with 4 stages also
    with GROUP_M 1: with 128 experts, the best of vLLM's H200 space at 4096 tokens (0.4716 against 0.5074 ms for
    GROUP_M 16 at Qwen3-30B-A3B's up projection, benchmarks/RESULTS.md)."""
    shapes = (
        (64, 64, 64, 4, 3),
        (64, 128, 64, 4, 3),
        (64, 128, 128, 8, 4),
        (128, 128, 64, 4, 4),
        (128, 128, 64, 8, 3),
        (128, 256, 64, 8, 3),
        (128, 256, 64, 8, 4),
        (256, 128, 64, 8, 3),
    )
    return [_moe(*s, group_m=16) for s in shapes] + [_moe(128, 256, 64, 8, 4, group_m=1)]


def unpipelined_configs() -> list[Config]:
    """num_stages = 1 for devices whose pipeliner does not run (compute capability 7.x: the device files state
    max_num_stages = 1); vLLM's space starts at 2 stages, so these are its tiles without the pipeline."""
    shapes = ((16, 64, 64, 4), (16, 128, 64, 4), (32, 64, 64, 4), (64, 64, 64, 4), (64, 128, 64, 4), (128, 128, 64, 8))
    return [_moe(bm, bn, bk, warps, 1, group_m=1 if bm <= 32 else 16) for bm, bn, bk, warps in shapes]


def moe_configs() -> list[Config]:
    """Every fused_moe candidate."""
    return [DEFAULT_MOE] + decode_configs() + prefill_configs() + unpipelined_configs()


def align_blocks() -> tuple[int, ...]:
    """The block sizes fused_moe's candidates align to (a moe_align key is formed for each, since the certified
    fused_moe config decides which one a launch uses)."""
    return tuple(sorted({c["BLOCK_M"] for c in moe_configs()}))


def _sum(bn: int, warps: int) -> Config:
    return Config.make(num_warps=warps, num_stages=1, BLOCK_N=bn)


DEFAULT_SUM = _sum(1024, 4)


def sum_configs() -> list[Config]:
    """moe_sum: columns per program x warps (a memory-bound add of top_k rows)."""
    return [_sum(bn, w) for bn in (256, 512, 1024, 2048) for w in (1, 2, 4, 8)]


# ======================================================================================================================
# Prune (device facts; the problem's expert count sizes moe_align's tiles)
# ======================================================================================================================
def smem_estimate(config: Config, profile=None) -> int:
    """fused_moe's shared memory, an upper bound of Triton's figure: the pipelined A and W tiles of 16-bit elements,
    (BLOCK_M + BLOCK_N)·BLOCK_K·2 bytes per buffer, or the epilogue's float32 conversion scratch BLOCK_M·BLOCK_N·4,
    which reuses them (the larger of the two). Buffers: num_stages, except on CUDA devices of compute capability 8.x,
    where Triton's pipeliner allocates num_stages - 1 (cross-compiled for sm_80 with Triton 3.6: 147456 B at
    num_stages 4 for 128x256x64; for sm_90 it allocates num_stages, as `kernels/matmul.py` records for its tiles).
    Without a profile, num_stages (the bound for every device)."""
    p = config.params
    buffers = config.num_stages
    cc = getattr(profile, "compute_capability", None)
    if profile is not None and profile.backend == "cuda" and cc is not None and (8, 0) <= tuple(cc) < (9, 0):
        buffers = max(config.num_stages - 1, 1)
    pipeline = (p["BLOCK_M"] + p["BLOCK_N"]) * p["BLOCK_K"] * 2 * buffers
    return max(pipeline, p["BLOCK_M"] * p["BLOCK_N"] * 4)


def _prune_moe(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    return prune_with(candidates, profile, lambda c: shared_memory_refusal(smem_estimate(c, profile), profile))


def _prune_align(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    e_block = next_pow2(problem["experts"])

    def check(c: Config) -> str | None:
        tile = c["TILE"] * e_block
        reason = lanes_refusal(tile, c, profile, "one-hot tile [TILE, E]")
        # the cumulative sum along the tile's pair axis may stage the whole int32 tile in shared memory: seen on
        # sm_70 (census of Volta, Triton 3.6: 131072 B for TILE 256 x 128 experts, over its 98304 B)
        reason = reason or shared_memory_refusal(tile * 4, profile)
        if reason or profile.vendor == "amd":
            return reason
        return registers_refusal(
            tile, _ALIGN_REGS_PER_ELEMENT, c, profile, "one-hot tile [TILE, E]", scalar_regs=_ALIGN_SCALAR_REGS
        )

    return prune_with(candidates, profile, check)


def _prune_sum(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
    return prune_with(candidates, profile, lambda c: lanes_refusal(c["BLOCK_N"], c, profile, "column block"))


# ======================================================================================================================
# Shapes, routing and the host-side layout
# ======================================================================================================================
def layout_length(pairs: int, experts: int, block: int) -> int:
    """The capacity of an aligned layout: each expert with pairs pads at most block - 1 slots, and at most
    min(E, P) experts have pairs."""
    return pairs + min(experts, pairs) * (block - 1)


def _route(gen: np.random.Generator, m: int, experts: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """A router's output: top_k distinct experts per token (a random ranking, as softmax + top-k of random logits
    gives) and positive float32 weights summing to 1 per token."""
    ids = np.argsort(gen.random((m, experts)), axis=1)[:, :top_k].astype(np.int32)
    weights = gen.uniform(0.1, 1.0, size=(m, top_k))
    return ids, (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def _host_layout(ids: np.ndarray, experts: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layout a moe_align launch makes, built on the host for fused_moe's made inputs (so a fused_moe timing is
    the GEMM alone): a stable argsort by expert, each group padded to `block`."""
    flat = ids.reshape(-1)
    pairs = flat.size
    length = layout_length(pairs, experts, block)
    sorted_ids = np.full(length, pairs, dtype=np.int32)
    expert_ids = np.full(cdiv(length, block), -1, dtype=np.int32)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=experts)
    slot, done = 0, 0
    for e in np.flatnonzero(counts):
        n = int(counts[e])
        sorted_ids[slot : slot + n] = order[done : done + n]
        expert_ids[slot // block : (slot + n + block - 1) // block] = e
        slot += cdiv(n, block) * block
        done += n
    return sorted_ids, expert_ids, np.array([slot], dtype=np.int32)


def _check_routing(topk_ids: Tensor, what: str) -> tuple[int, int]:
    if topk_ids.dtype.name != "int32" or topk_ids.ndim != 2 or not topk_ids.is_contiguous():
        raise ShapeMismatch(
            f"{what}: topk_ids must be a contiguous int32 [M, top_k], got {topk_ids.dtype.name}{list(topk_ids.shape)}"
        )
    return topk_ids.shape[0], topk_ids.shape[1]


def _check_experts(experts: int, what: str) -> None:
    if not 1 <= experts <= MAX_EXPERTS:
        raise LaunchError(f"{what}: {experts} experts; 1 to {MAX_EXPERTS} are supported")


def _interpreting() -> bool:
    from nbxcert.kernels.backends import select

    return select().name == "interpreter"


# ======================================================================================================================
# moe_align: problem, inputs, launch
# ======================================================================================================================
def _align_programs(pairs: int, config: Config) -> int:
    return max(cdiv(pairs, config["TILE"] * config["STEPS"]), 1)


def _align_workspace_len(pairs: int, experts: int) -> int:
    """int32 elements of the workspace for any candidate: the [programs, E_BLOCK] table at the fewest pairs per
    program, then E_BLOCK expert starts."""
    fewest = min(c["TILE"] * c["STEPS"] for c in ALIGN_CANDIDATES)
    return (max(cdiv(pairs, fewest), 1) + 1) * next_pow2(experts)


def _launch_align(config: Config, ids: Tensor, experts: int, block: int, sorted_ids, expert_ids, num_padded, ws):
    pairs = ids.numel
    e_block = next_pow2(experts)
    programs = _align_programs(pairs, config)
    if ws.numel < (programs + 1) * e_block:
        raise LaunchError(f"moe_align: workspace of {ws.numel} int32 < {(programs + 1) * e_block} needed")
    starts = ws[programs * e_block : (programs + 1) * e_block]
    length = sorted_ids.numel
    tile, steps, warps = config["TILE"], config["STEPS"], config.num_warps
    fill = cdiv(cdiv(length, programs), tile) * tile
    launch_kernel(
        _align_count_kernel,
        (programs,),
        ids,
        ws,
        sorted_ids,
        pairs,
        length,
        fill,
        TILE=tile,
        STEPS=steps,
        E_BLOCK=e_block,
        num_warps=warps,
        num_stages=1,
    )
    rows = max(_OFFSETS_TILE // e_block, 1)
    launch_kernel(
        _align_offsets_kernel,
        (1,),
        ws,
        starts,
        expert_ids,
        num_padded,
        programs,
        experts,
        expert_ids.numel,
        block,
        ROWS=rows,
        E_BLOCK=e_block,
        num_warps=_OFFSETS_WARPS,
        num_stages=1,
    )
    launch_kernel(
        _align_scatter_kernel,
        (programs,),
        ids,
        ws,
        starts,
        sorted_ids,
        pairs,
        experts,
        TILE=tile,
        STEPS=steps,
        E_BLOCK=e_block,
        num_warps=warps,
        num_stages=1,
    )


def _align_outputs(pairs: int, experts: int, block: int, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    length = layout_length(pairs, experts, block)
    return (
        empty((length,), "int32", device),
        empty((cdiv(length, block),), "int32", device),
        empty((1,), "int32", device),
        empty((_align_workspace_len(pairs, experts),), "int32", device),
    )


def _make_align_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    gen = _inputs.rng(seed)
    m, top_k, experts, block = problem["M"], problem["top_k"], problem["experts"], problem["block"]
    if top_k > experts:
        raise LaunchError(f"moe_align: top_k={top_k} > experts={experts}")
    ids, _ = _route(gen, m, experts, top_k)
    sorted_ids, expert_ids, num_padded, ws = _align_outputs(m * top_k, experts, block, device)
    tensors = {
        "topk_ids": from_numpy(ids, "int32", device),
        "sorted_ids": sorted_ids,
        "expert_ids": expert_ids,
        "num_padded": num_padded,
        "workspace": ws,
    }
    scalars = {"experts": experts, "block": block}
    return Inputs(tensors, scalars, ("sorted_ids", "expert_ids", "num_padded"), dict(problem))


def _launch_align_inputs(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    _launch_align(
        config,
        t["topk_ids"],
        s["experts"],
        s["block"],
        t["sorted_ids"],
        t["expert_ids"],
        t["num_padded"],
        t["workspace"],
    )


def _oracle_align(inputs: Inputs) -> dict[str, Reference]:
    ids = inputs.tensors["topk_ids"].numpy()
    sorted_ids, expert_ids, padded = _oracle.align(ids, inputs.scalars["experts"], inputs.scalars["block"])
    exact = {"sorted_ids": sorted_ids, "expert_ids": expert_ids, "num_padded": np.array([padded])}
    return {k: Reference(v.astype(np.float64), np.zeros(v.shape)) for k, v in exact.items()}


def _problem_align(topk_ids: Tensor, experts: int, block: int, **_) -> dict[str, Any]:
    m, top_k = _check_routing(topk_ids, "moe_align")
    _check_experts(experts, "moe_align")
    if block <= 0 or block & (block - 1):
        raise LaunchError(f"moe_align: block={block} must be a power of two (a fused_moe BLOCK_M)")
    return {"M": m, "top_k": top_k, "experts": int(experts), "block": int(block)}


# ======================================================================================================================
# fused_moe: problem, inputs, launch
# ======================================================================================================================
def _launch_moe(
    config: Config,
    a: Tensor,
    w: Tensor,
    out: Tensor,
    weights: Tensor,
    layout,
    top_k: int,
    pair_rows: int,
    mul_weight: int,
) -> None:
    """Launch `config` with the aligned layout (sorted_ids, expert_ids, num_padded) made for its BLOCK_M."""
    sorted_ids, expert_ids, num_padded = layout
    pairs, n = out.shape
    k = a.shape[1]
    if pairs == 0 or n == 0:
        return
    bm, bn, bk, group_m = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["GROUP_M"]
    blocks_m = expert_ids.numel
    if blocks_m != cdiv(sorted_ids.numel, bm):
        raise LaunchError(
            f"fused_moe: a layout of {blocks_m} blocks for {sorted_ids.numel} slots is not one for BLOCK_M {bm}"
        )
    upcast = a.dtype.name == "bfloat16" and _interpreting()
    # a block row is read only below the padded count, a multiple of BLOCK_M within the layout: never past its end
    launch_kernel(
        _fused_moe_kernel,
        (blocks_m * cdiv(n, bn),),
        a,
        w,
        out,
        weights,
        sorted_ids,
        expert_ids,
        num_padded,
        n,
        k,
        pairs,
        blocks_m,
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        A_DIV=1 if pair_rows else top_k,
        MUL_WEIGHT=bool(mul_weight),
        UPCAST=upcast,
        EVEN_K=(k % bk == 0),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=group_m,
        RUN_N=wrap_run(n, bn, w.stride(1)),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def _layout_tensors(ids: np.ndarray, experts: int, block: int, device) -> tuple[Tensor, ...]:
    return tuple(from_numpy(v, "int32", device) for v in _host_layout(ids, experts, block))


def _make_moe_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    """A [M or P, K] and W [E, N, K] random normal, a router's routing, out [P, N]; the aligned layout for every
    BLOCK_M among the candidates (`layout_<BLOCK_M>`, built on the host)."""
    gen = _inputs.rng(seed)
    m, n, k, experts, top_k = problem["M"], problem["N"], problem["K"], problem["experts"], problem["top_k"]
    if top_k > experts:
        raise LaunchError(f"fused_moe: top_k={top_k} > experts={experts}")
    pairs = m * top_k
    dtype = dtypes[0]
    ids, weights = _route(gen, m, experts, top_k)
    tensors = {
        "a": _inputs.randn(gen, (pairs if problem["pair_rows"] else m, k), dtype, device),
        "w": _inputs.randn(gen, (experts, n, k), dtype, device),
        "topk_ids": from_numpy(ids, "int32", device),
        "topk_weights": from_numpy(weights, "float32", device),
        "out": empty((pairs, n), dtype, device),
    }
    for block in align_blocks():
        for name, t in zip(("sorted", "experts", "padded"), _layout_tensors(ids, experts, block, device), strict=False):
            tensors[f"layout{block}_{name}"] = t
    scalars = {"top_k": top_k, "pair_rows": problem["pair_rows"], "mul_weight": problem["mul_weight"]}
    return Inputs(tensors, scalars, ("out",), dict(problem))


def _launch_moe_inputs(config: Config, inputs: Inputs) -> None:
    t, s = inputs.tensors, inputs.scalars
    bm = config["BLOCK_M"]
    layout = tuple(t[f"layout{bm}_{name}"] for name in ("sorted", "experts", "padded"))
    _launch_moe(
        config, t["a"], t["w"], t["out"], t["topk_weights"], layout, s["top_k"], s["pair_rows"], s["mul_weight"]
    )


def _oracle_moe(inputs: Inputs) -> dict[str, Reference]:
    from nbxcert.kernels.products import device_library, products_on_device  # the oracle's float64 products

    t, s = inputs.tensors, inputs.scalars
    a, w = t["a"], t["w"]
    terms = {
        "pair_rows": bool(s["pair_rows"]),
        "mul_weight": bool(s["mul_weight"]),
        "acc_eps": ACC_EPS,
        "out_eps": finfo(t["out"].dtype)["eps"],
    }
    routing = (t["topk_weights"].float64(), t["topk_ids"].numpy())
    lib = device_library(t["out"].device)
    if lib is None:  # numpy's products of the operands widened on the host
        value, scale = _oracle.fused_moe(a.float64(), w.float64(), *routing, **terms)
        return {"out": Reference(value, scale)}
    # each routed expert's weight is widened where it lies and multiplied by cuBLAS there: only its pairs' rows of `a`
    # cross to the device, as they are stored (a weight of 8 x 28672 x 4096 is 7.5 GB in float64)
    a_bits = a.numpy()

    def expert_products(e: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return products_on_device(from_bits(a_bits[rows], a.dtype, a.device), w[e].T, lib)

    value, scale = _oracle.fused_moe_of(expert_products, tuple(w.shape), *routing, **terms)
    return {"out": Reference(value, scale)}


def _problem_moe(a, w, topk_weights, topk_ids, *, mul_weight=True, out=None, config=None) -> dict[str, Any]:
    m, top_k = _check_routing(topk_ids, "fused_moe")
    if w.ndim != 3 or a.ndim != 2 or a.shape[1] != w.shape[2]:
        raise ShapeMismatch(f"fused_moe takes a [M or M*top_k, K] and w [E, N, K], got {a.shape} and {w.shape}")
    if a.shape[0] not in (m, m * top_k):
        raise ShapeMismatch(f"fused_moe: a has {a.shape[0]} rows; M={m} (one per token) or M*top_k={m * top_k}")
    if tuple(topk_weights.shape) != (m, top_k) or topk_weights.dtype.name != "float32":
        raise ShapeMismatch(f"fused_moe: topk_weights must be float32 [{m}, {top_k}]")
    if not topk_weights.is_contiguous():
        raise ShapeMismatch("fused_moe: topk_weights must be contiguous")
    _check_experts(w.shape[0], "fused_moe")
    return {
        "M": m,
        "N": w.shape[1],
        "K": w.shape[2],
        "experts": w.shape[0],
        "top_k": top_k,
        "mul_weight": int(bool(mul_weight)),
        "pair_rows": int(a.shape[0] == m * top_k and top_k > 1),
    }


# ======================================================================================================================
# moe_sum: problem, inputs, launch
# ======================================================================================================================
def _launch_sum(config: Config, x: Tensor, out: Tensor) -> None:
    m, top_k, n = x.shape
    if m == 0 or n == 0:
        return
    bn = config["BLOCK_N"]
    launch_kernel(
        _moe_sum_kernel,
        (m, cdiv(n, bn)),
        x,
        out,
        n,
        *x.strides,
        *out.strides,
        TOP_K=top_k,
        BLOCK_N=bn,
        num_warps=config.num_warps,
        num_stages=1,
    )


def _make_sum_inputs(problem: Mapping[str, Any], dtypes: tuple[str, ...], seed: int, device: str) -> Inputs:
    gen = _inputs.rng(seed)
    m, n, top_k = problem["M"], problem["N"], problem["top_k"]
    tensors = {"x": _inputs.randn(gen, (m, top_k, n), dtypes[0], device), "out": empty((m, n), dtypes[0], device)}
    return Inputs(tensors, {}, ("out",), dict(problem))


def _launch_sum_inputs(config: Config, inputs: Inputs) -> None:
    _launch_sum(config, inputs.tensors["x"], inputs.tensors["out"])


def _oracle_sum(inputs: Inputs) -> dict[str, Reference]:
    out_eps = finfo(inputs.tensors["out"].dtype)["eps"]
    value, scale = _oracle.moe_sum(inputs.tensors["x"].float64(), acc_eps=ACC_EPS, out_eps=out_eps)
    return {"out": Reference(value, scale)}


def _problem_sum(x: Tensor, out: Tensor | None = None, config: Config | None = None) -> dict[str, Any]:
    if x.ndim != 3:
        raise ShapeMismatch(f"moe_sum takes x [M, top_k, N], got {list(x.shape)}")
    return {"M": x.shape[0], "N": x.shape[2], "top_k": x.shape[1]}


# ======================================================================================================================
# Specs
# ======================================================================================================================
ALIGN_CANDIDATES = tuple(align_configs())
MOE_CANDIDATES = tuple(moe_configs())


def _same(combo: tuple[str, ...]) -> tuple[str, ...]:
    return (combo[0],)


def _ints(combo: tuple[str, ...]) -> tuple[str, ...]:
    return ("int32",)


MOE_ALIGN = family_spec(
    "moe",
    "moe_align",
    "token-expert pairs sorted by expert (stable), each expert padded to the block; integers, exact",
    (_align_count_kernel, _align_offsets_kernel, _align_scatter_kernel),
    problem_args=("M", "top_k", "experts", "block"),
    key_fields=(KeyField("M", "tokens"), KeyField("top_k"), KeyField("experts"), KeyField("block")),
    dtype_args=("topk_ids",),
    dtypes=(("int32",),),
    output_dtypes=_ints,
    tuning=(ALIGN_CANDIDATES, DEFAULT_ALIGN, _prune_align),
    parts=(_make_align_inputs, _launch_align_inputs, _oracle_align, _problem_align),
    no_bit_fields=("TILE", "STEPS", "num_warps"),
    examples=(
        {"M": 16, "top_k": 2, "experts": 8, "block": 16},
        {"M": 3, "top_k": 8, "experts": 128, "block": 64},
        {"M": 37, "top_k": 1, "experts": 8, "block": 32},
        {"M": 5, "top_k": 8, "experts": 8, "block": 16},
    ),
    oracle_name="oracles.moe.align",
)

FUSED_MOE = family_spec(
    "moe",
    "fused_moe",
    "out[p] = w_p * (a[token(p)] @ W[expert(p)]^T) over moe_align blocks, float32 accumulation",
    (_fused_moe_kernel,),
    problem_args=("M", "N", "K", "experts", "top_k", "mul_weight", "pair_rows"),
    key_fields=(
        KeyField("M", "tokens"),
        KeyField("N"),
        KeyField("K"),
        KeyField("experts"),
        KeyField("top_k"),
        KeyField("mul_weight"),
        KeyField("pair_rows"),
    ),
    dtype_args=("a", "w"),
    dtypes=DTYPES,
    output_dtypes=_same,
    tuning=(MOE_CANDIDATES, DEFAULT_MOE, _prune_moe),
    parts=(_make_moe_inputs, _launch_moe_inputs, _oracle_moe, _problem_moe),
    no_bit_fields=("GROUP_M",),
    examples=(
        {"M": 16, "N": 128, "K": 64, "experts": 8, "top_k": 2, "mul_weight": 0, "pair_rows": 0},
        {"M": 16, "N": 64, "K": 64, "experts": 8, "top_k": 2, "mul_weight": 1, "pair_rows": 1},
        {"M": 5, "N": 40, "K": 72, "experts": 8, "top_k": 8, "mul_weight": 1, "pair_rows": 0},
        {"M": 9, "N": 24, "K": 40, "experts": 8, "top_k": 1, "mul_weight": 1, "pair_rows": 0},
    ),
    oracle_name="oracles.moe.fused_moe",
)

MOE_SUM = family_spec(
    "moe",
    "moe_sum",
    "out[t] = sum over j of x[t, j] (a token's top-k expert outputs), float32, fixed order",
    (_moe_sum_kernel,),
    problem_args=("M", "N", "top_k"),
    key_fields=(KeyField("M", "tokens"), KeyField("N"), KeyField("top_k")),
    dtype_args=("x",),
    dtypes=(("float16",), ("bfloat16",)),
    output_dtypes=_same,
    tuning=(tuple(sum_configs()), DEFAULT_SUM, _prune_sum),
    parts=(_make_sum_inputs, _launch_sum_inputs, _oracle_sum, _problem_sum),
    no_bit_fields=("BLOCK_N", "num_warps"),
    examples=({"M": 7, "N": 300, "top_k": 2}, {"M": 2, "N": 64, "top_k": 8}),
    oracle_name="oracles.moe.moe_sum",
)

SPECS = (MOE_ALIGN, FUSED_MOE, MOE_SUM)


# ======================================================================================================================
# User-facing functions
# ======================================================================================================================
@served
def moe_align(topk_ids: Tensor, experts: int, block: int, config: Config | None = None):
    """(sorted_ids, expert_ids, num_padded) of `topk_ids` [M, top_k] int32 for `experts` experts, each expert's pairs
    padded to a multiple of `block` (see the module docstring)."""
    problem = _problem_align(topk_ids, experts, block)
    sorted_ids, expert_ids, num_padded, ws = _align_outputs(topk_ids.numel, experts, block, topk_ids.device)

    def run(c: Config) -> None:
        _launch_align(c, topk_ids, experts, block, sorted_ids, expert_ids, num_padded, ws)

    cfg = choose_config(MOE_ALIGN, problem, ("int32",), config, run=run, outputs=(sorted_ids, expert_ids, num_padded))
    run(cfg)
    return sorted_ids, expert_ids, num_padded


@served
def fused_moe(
    a: Tensor,
    w: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    *,
    mul_weight: bool = True,
    out: Tensor | None = None,
    config: Config | None = None,
) -> Tensor:
    """Each (token, expert) pair's expert output [M·top_k, N]: a [M, K] (one row per token) or [M·top_k, K] (one
    row per pair) times W[e]ᵀ for w [E, N, K], times the pair's router weight when `mul_weight`. Runs moe_align for
    the certified config's BLOCK_M, then the grouped GEMM. Rows of pairs whose expert is outside [0, E) are not
    written."""
    if a.dtype is not w.dtype or a.dtype.name not in ("float16", "bfloat16"):
        raise ShapeMismatch(f"fused_moe: a and w must share float16 or bfloat16, got {a.dtype.name}, {w.dtype.name}")
    problem = _problem_moe(a, w, topk_weights, topk_ids, mul_weight=mul_weight)
    pairs = problem["M"] * problem["top_k"]
    if out is None:
        out = empty((pairs, problem["N"]), a.dtype, a.device)
    elif tuple(out.shape) != (pairs, problem["N"]) or out.dtype is not a.dtype:
        raise ShapeMismatch(f"fused_moe: out must be {a.dtype.name}[{pairs}, {problem['N']}]")

    def run(c: Config) -> None:
        layout = moe_align(topk_ids, problem["experts"], c["BLOCK_M"])
        _launch_moe(c, a, w, out, topk_weights, layout, problem["top_k"], problem["pair_rows"], int(mul_weight))

    cfg = choose_config(FUSED_MOE, problem, (a.dtype.name, w.dtype.name), config, run=run, outputs=(out,))
    run(cfg)
    return out


@served
def moe_sum(x: Tensor, out: Tensor | None = None, config: Config | None = None) -> Tensor:
    """x [M, top_k, N] summed over top_k -> [M, N] (float32 sum in order, one rounding)."""
    problem = _problem_sum(x)
    if out is None:
        out = empty((problem["M"], problem["N"]), x.dtype, x.device)
    cfg = choose_config(MOE_SUM, problem, (x.dtype.name,), config, run=lambda c: _launch_sum(c, x, out), outputs=(out,))
    _launch_sum(cfg, x, out)
    return out


__all__ = [
    "FUSED_MOE",
    "MOE_ALIGN",
    "MOE_SUM",
    "SPECS",
    "align_blocks",
    "align_configs",
    "decode_configs",
    "fused_moe",
    "layout_length",
    "moe_align",
    "moe_configs",
    "moe_sum",
    "prefill_configs",
    "smem_estimate",
    "sum_configs",
    "unpipelined_configs",
]

settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
