"""Prune helpers shared by the kernel families: each refusal names the device-file fact that refuses the config.

Only facts of the device file are used (never a guess). A fact stated as `null` is "not a limit on this backend"
(Triton's interpreter has no shared memory or register limit), so it refuses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from nbxcert.kernels.launch import next_power_of_2
from nbxcert.kernels.spec import Config, PruneResult


def limit(profile, name: str) -> int | None:
    """The fact's value; None when the device file states it is not a limit. A missing fact raises
    `DeviceFactMissing` (from the profile), naming the file and the field."""
    return profile.fact(name)


def common_refusal(config: Config, profile) -> str | None:
    """Refusals every kernel shares: stages over the pipeliner's maximum, threads over the block maximum."""
    max_stages = limit(profile, "max_num_stages")
    if max_stages is not None and config.num_stages > max_stages:
        return f"num_stages={config.num_stages} > max_num_stages={max_stages}"
    warp = limit(profile, "warp_size")
    max_threads = limit(profile, "max_threads_per_block")
    if warp is not None and max_threads is not None and config.num_warps * warp > max_threads:
        return f"num_warps={config.num_warps} x warp_size={warp} > max_threads_per_block={max_threads}"
    return None


def shared_memory_refusal(needed_bytes: int, profile) -> str | None:
    cap = limit(profile, "max_shared_memory_per_block_optin")
    if cap is not None and needed_bytes > cap:
        return f"needs {needed_bytes} B of shared memory > max_shared_memory_per_block_optin={cap}"
    return None


def prune_with(candidates: Iterable[Config], profile, *checks: Callable[[Config], str | None]) -> PruneResult:
    """Keep the candidates that pass `common_refusal` and every check; record each refusal's reason."""
    kept, pruned = [], []
    for c in candidates:
        reason = common_refusal(c, profile)
        for check in checks:
            if reason:
                break
            reason = check(c)
        if reason:
            pruned.append((c, reason))
        else:
            kept.append(c)
    return PruneResult(tuple(kept), tuple(pruned))


def lanes_refusal(tile_elements: int, config: Config, profile, what: str = "tile") -> str | None:
    """Refuse a block with a warp that has no element of its own: with a tile of at most (num_warps - 1) x warp_size
    elements, Triton's layout replicates the tile across the surplus lanes, and whole warps load, compute and reduce
    copies (no error, only warps that do no work). One warp is always allowed: fewer is not possible."""
    warp = limit(profile, "warp_size")
    if warp is None or config.num_warps == 1:
        return None
    if tile_elements <= (config.num_warps - 1) * warp:
        return (
            f"{what} of {tile_elements} elements leaves a warp with no element of its own "
            f"(<= (num_warps={config.num_warps} - 1) x warp_size={warp})"
        )
    return None


def registers_refusal(
    tile_elements: int, regs_per_element: int, config: Config, profile, what: str, scalar_regs: int = 0
) -> str | None:
    """Refuse a config whose live tile-shaped values need more 32-bit registers per thread than a thread of a block
    of this size can have: min(max_registers_per_thread, max_registers_per_block / threads). `regs_per_element` is
    the kernel's count of 32-bit registers per tile element it keeps live at its peak (a float64 value takes 2);
    `scalar_regs` what the kernel holds besides its tiles (addresses, indices, loop counters). AMD files state no
    per-thread register limit (the VGPR budget trades against occupancy), so nothing is checked there."""
    if profile.vendor == "amd":
        return None
    warp = limit(profile, "warp_size")
    per_thread = limit(profile, "max_registers_per_thread")
    per_block = limit(profile, "max_registers_per_block")
    if warp is None or per_thread is None:
        return None
    threads = config.num_warps * warp
    budget = per_thread if per_block is None else min(per_thread, per_block // threads)
    need = -(-tile_elements // threads) * regs_per_element + scalar_regs
    if need > budget:
        return (
            f"{what}: {need} registers per thread with num_warps={config.num_warps} > {budget} "
            f"(min of max_registers_per_thread={per_thread}, max_registers_per_block={per_block} / {threads} threads)"
        )
    return None


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): a tile that holds n rows (`triton.next_power_of_2`, which
    gives 0 for 0)."""
    return next_power_of_2(max(1, int(n)))


def gemv_prune(smem: Callable[[Config], int]):
    """The prune of a SIMT GEMV (`matmul.gemv` and `quant.dequant_gemv`): refuse configs whose float32 partial sum
    [BLOCK_M, BLOCK_K, BLOCK_N] exceeds a thread's registers or whose `smem(config)` exceeds shared memory."""

    def prune(candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
        block_m = next_pow2(problem["M"])

        def check(c: Config) -> str | None:
            # The partial sum is live across the whole K loop: past the register budget it must spill. (AMD files
            # state no per-thread register limit: their VGPR budget trades against occupancy, so there is nothing to
            # check against there.)
            if profile.vendor != "amd":
                reason = registers_refusal(block_m * c["BLOCK_K"] * c["BLOCK_N"], 1, c, profile, "gemv partial sum")
                if reason:
                    return reason
            return shared_memory_refusal(smem(c), profile)

        return prune_with(candidates, profile, check)

    return prune
