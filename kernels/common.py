"""What the kernel families share: device helpers their kernels call, the host helpers their launches use, and the
prune facts more than one family counts with. A family imports these from here, never from another family, so a
family module holds its own kernels and nothing another one needs.

    narrow, both, tile_coords     @triton.jit helpers: a rounding store conversion, a mask select, grouped tile order
    k_step_tiles, dot_over_k,     @triton.jit helpers: one K step's tiles of a tiled product, its sum over all of K,
    gemv_offsets                  a SIMT GEMV's offsets
    upcast, compute_type          a launch's UPCAST (interpreter) and CDT (compute type) constexprs
    as_rows                       a tensor as a [n_rows, n_cols] view over its last dimension
    MAX_TILE, SCALAR_REGS,        Triton's limit on a tile, the scalar registers a reduction kernel holds besides its
    reduction_shared_bytes        tiles, and the shared memory of a kernel whose only shared memory is a reduction's
    family_spec                   one registered KernelSpec from its grouped parts (every family builds its specs so)
"""

from __future__ import annotations

from nbxcert.errors import LaunchError, ViewError
from nbxcert.kernels.backends import select
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.spec import Config, KernelSpec, register
from nbxcert.kernels.tensor import Tensor

MAX_TILE = tl.TRITON_MAX_TENSOR_NUMEL  # Triton refuses a tensor of more elements (triton/language/core.py)
# Besides its tiles a reduction kernel holds ~12 registers of scalars (row and mask addresses, strides, the loop
# counter, the row's statistics): ptxas gives the row loop kernels 13-14 registers in all with 4-element-per-thread
# tiles (tests/kernels/test_rows.py::test_kept_candidates_compile_for_hopper_without_spills).
SCALAR_REGS = 12


# --- device helpers ---------------------------------------------------------------------------------------------------
@jit
def narrow(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """`x` converted to the storage type DTYPE, rounding to nearest even.

    x: a float32 (or float64) tensor. DTYPE: the output pointer's element type. UPCAST: True under Triton's
    interpreter, whose float32 -> bfloat16 cast truncates: there the rounding is done on the bits first (finite
    values and infinities keep their class; a NaN stays a NaN), and the truncating cast is then exact."""
    if UPCAST and tl.bfloat16 == DTYPE:
        x = x.to(tl.float32)
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(DTYPE)


@jit
def both(mask, cond):
    """`mask & cond` for a tensor mask and a scalar condition. Written as a select: Triton 3.9's interpreter gives
    `tensor_bool & scalar_bool` an int32 result, which its load/store then refuse ("mask has unsupported dtype")."""
    return tl.where(cond, mask, False)


@jit
def tile_coords(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Grouped launch order: tile index -> (pid_m, pid_n). Groups of GROUP_M tile rows are walked column by column,
    so consecutive programs share B tiles in L2. A bijection for any GROUP_M >= 1 (it only permutes tiles)."""
    per_group = GROUP_M * tiles_n
    group = tile // per_group
    first_m = group * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    in_group = tile % per_group
    return first_m + in_group % rows, in_group // rows


@jit
def k_step_tiles(a_ptrs, b_ptrs, offs_k, k_left, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """The (A, B) tiles of one K step of a tiled product: [BM, BK] at a_ptrs and [BK, BN] at b_ptrs.

    offs_k: the step's K offsets (tl.arange(0, BLOCK_K)); k_left: how many of them are inside K (read only without
    EVEN_K: the rest load as zeros). UPCAST: both tiles converted to float32, for tl.dot under the interpreter (its
    tl.dot reads bfloat16 storage as raw integers)."""
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return a, b


@jit
def dot_over_k(
    a_ptrs,
    b_ptrs,
    offs_k,
    K,
    stride_ak,
    stride_bk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The float32 [BLOCK_M, BLOCK_N] sum over all of K of a tiled product: a_ptrs and b_ptrs at the first K step's
    tiles ([BM, BK] and [BK, BN], `k_step_tiles`), moved on by BLOCK_K·stride_ak and BLOCK_K·stride_bk a step, one
    tl.dot a step in increasing K. DOT_PRECISION: tl.dot's input_precision (None: Triton's default)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(0, tl.cdiv(K, BLOCK_K)):
        a, b = k_step_tiles(a_ptrs, b_ptrs, offs_k, K - ki * BLOCK_K, EVEN_K, UPCAST)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@jit
def gemv_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A SIMT GEMV program's offsets: (rows 0 .. BLOCK_M - 1, its BLOCK_N columns, the K chunk's BLOCK_K offsets, which
    rows are < M, which columns are < N). Program i of the grid's first axis owns columns i·BLOCK_N onwards."""
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    return offs_m, offs_n, offs_k, m_ok, n_ok


# --- host helpers -----------------------------------------------------------------------------------------------------
def upcast() -> bool:
    """True under Triton's interpreter (see `narrow`)."""
    return select().name == "interpreter"


def compute_type(dtype_name: str):
    """The compute type of an input dtype: float64 for float32/float64, float32 for half precision."""
    return tl.float64 if dtype_name in ("float32", "float64") else tl.float32


def as_rows(t: Tensor, name: str, role: str = "") -> Tensor:
    """`t` as a [n_rows, n_cols] view over its last dimension (contiguous columns), without a copy; `LaunchError`
    when its strides cannot express that (make it `.contiguous()` first). Errors name it "name: role" (made only
    then: a served launch formats no message)."""
    if t.ndim == 2 and (t.shape[1] <= 1 or t.strides[1] == 1):
        return t  # already rows (the served path's common case: no view made per launch)
    if role:
        name = f"{name}: {role}"
    if t.ndim == 0:
        raise LaunchError(f"{name}: a 0-d tensor has no rows")
    n_cols = t.shape[-1]
    try:
        v = t.view(1, n_cols) if t.ndim == 1 else t.view(-1, n_cols)
    except ViewError as e:
        raise LaunchError(f"{name}: shape {t.shape} strides {t.strides} is not a view of rows ({e})") from None
    if v.shape[1] > 1 and v.stride(1) != 1:
        raise LaunchError(f"{name}: the last dimension has stride {v.stride(1)}; rows need contiguous columns")
    return v


# --- spec building ----------------------------------------------------------------------------------------------------
def family_spec(
    family: str,
    name: str,
    description: str,
    kernels: tuple,
    *,
    problem_args,
    key_fields,
    dtype_args,
    dtypes,
    output_dtypes,
    tuning,
    parts,
    no_bit_fields=(),
    examples=(),
    oracle_name=None,
    **more,
) -> KernelSpec:
    """Register one `KernelSpec` of `family` from its parts, grouped as a reader looks them up.

    tuning: (candidates, default, prune). parts: (make_inputs, launch, oracle, problem_of). The oracle is named
    `nbxcert.oracles.<family>.<name>` unless `oracle_name` says otherwise; `more` passes the rarer fields on."""
    candidates, default, prune = tuning
    make_inputs, launch, oracle, problem_of = parts
    return register(
        KernelSpec(
            name=name,
            family=family,
            description=description,
            kernels=kernels,
            problem_args=problem_args,
            key_fields=key_fields,
            dtype_args=dtype_args,
            dtypes=dtypes,
            output_dtypes=output_dtypes,
            candidates=candidates,
            default=default,
            prune=prune,
            make_inputs=make_inputs,
            launch=launch,
            oracle=oracle,
            oracle_name=oracle_name or f"nbxcert.oracles.{family}.{name}",
            problem_of=problem_of,
            no_bit_fields=no_bit_fields,
            example_problems=examples,
            **more,
        )
    )


# --- prune facts ------------------------------------------------------------------------------------------------------
def reduction_shared_bytes(config: Config) -> int:
    """Shared memory of a kernel whose only shared memory is its cross-warp reductions' scratch (the row kernels,
    group_norm): one float64 partial per warp (the largest Triton allocated for sm_90 was 8 bytes x num_warps; no such
    kernel stages a tile through shared memory)."""
    return 8 * config.num_warps


# --- broadcasting (host) ----------------------------------------------------------------------------------------------
def broadcast_strides(t: Tensor, shape: tuple[int, ...]) -> list[int]:
    """t's strides read into the broadcast `shape` (0 on a broadcast dimension)."""
    lead = len(shape) - t.ndim
    strides = [0] * lead
    for n_t, s_t, n in zip(t.shape, t.strides, shape[lead:], strict=True):
        strides.append(0 if (n_t == 1 and n != 1) else s_t)
    return strides


def merge_dims(
    shape: tuple[int, ...] | list[int], *strides: tuple[int, ...] | list[int]
) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dimensions that are contiguous with each other in every tensor (stride[i] == stride[i+1] *
    shape[i+1] for all) and drop size-1 dimensions: the same elements, fewer index computations."""
    dims = [(n, [s[i] for s in strides]) for i, n in enumerate(shape) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for n, st in dims:
        if merged:
            pn, pst = merged[-1]
            if all(ps == s * n for ps, s in zip(pst, st, strict=True)):
                merged[-1] = (pn * n, st)
                continue
        merged.append((n, st))
    return [n for n, _ in merged], [[st[k] for _, st in merged] for k in range(len(strides))]


# --- wrapped tile offsets (host) --------------------------------------------------------------------------------------
def wrap_run(size: int, block: int, stride: int) -> int:
    """The contiguity a kernel may claim for `(start + arange(block)) % size` with `start` a multiple of `block`, as
    offsets along a dimension of element stride `stride`. Along the contiguous dimension (stride 1) a load is
    vectorized across a claimed run, so the claim must hold across the wrap at `size`: runs of the largest power of two
    dividing `size` (at most `block`), each starting at a multiple of it (claiming `block` when `size % block != 0`
    put a vector across the wrap: a misaligned-address fault on sm_90 with B row-major and N = 47). Along any other
    dimension nothing is vectorized and `block` is claimed, as before, so the compiled code (and the number of
    specializations a workload compiles) is that of the unwrapped tile."""
    if stride != 1:
        return block
    return min(block, size & -size) if size > 0 else 1


settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
