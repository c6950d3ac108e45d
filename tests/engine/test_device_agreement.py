"""On a real GPU: the driver's own attributes agree with the device file the GPU matches. Any disagreement fails,
naming both values (a device file's facts drive the prune, so a wrong one would keep or drop the wrong configs)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_driver_attributes_agree_with_the_device_file():
    from nbxcert.kernels.backends import cuda
    from nbxcert.profiles import match_nvidia

    info = cuda.device_info(0)
    profile, how = match_nvidia(info.compute_capability)
    assert how == "exact", f"{info.name} matched {profile.key} only by {how}: its facts are not claimed for it"
    a = info.attributes
    pairs = {
        "warp_size": a["warp_size"],
        "max_shared_memory_per_block_optin": a["max_shared_memory_per_block_optin"],
        "max_registers_per_block": a["max_registers_per_block"],
        "max_threads_per_block": a["max_threads_per_block"],
    }
    wrong = [f"{n}: file {profile.fact(n)} vs driver {v}" for n, v in pairs.items() if profile.fact(n) != v]
    sku = profile.sku_for_memory(info.total_memory, a["multiprocessor_count"])
    assert sku is not None, f"{info.name} with {info.total_memory} bytes matches no SKU of {profile.path}"
    if sku.sm_count != a["multiprocessor_count"]:
        wrong.append(f"SKU {sku.name} sm_count: file {sku.sm_count} vs driver {a['multiprocessor_count']}")
    if sku.l2_bytes != a["l2_cache_size"]:
        wrong.append(f"SKU {sku.name} l2_bytes: file {sku.l2_bytes} vs driver {a['l2_cache_size']}")
    assert not wrong, f"{profile.path} disagrees with {info.name}: " + "; ".join(wrong)
