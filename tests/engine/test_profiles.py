"""Tests for nbxcert.profiles and the shipped device files: schema, refusals, matching, missing facts, SKUs.

No GPU needed: everything here reads YAML. A refusal test mutates a valid shipped file (hopper) one field at a time
and asserts the one-line message names the file, the field and the reason.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from nbxcert import profiles as P
from nbxcert.errors import DeviceFactMissing, DeviceFileInvalid, ProfileNotFound

SHIPPED = [
    "amd/cdna2",
    "amd/cdna3",
    "amd/cdna4",
    "amd/rdna3",
    "cpu/interpreter",
    "nvidia/ada",
    "nvidia/ampere",
    "nvidia/ampere-ga10x",
    "nvidia/blackwell",
    "nvidia/blackwell-rtx",
    "nvidia/hopper",
    "nvidia/turing",
    "nvidia/volta",
]

# The numbers the design brief names, per file: a regression table, so an edit to a fact is a deliberate one.
# (compute capability or gfx names, warp size, max shared memory per block in bytes)
EXPECTED = {
    "nvidia/volta": ((7, 0), 32, 98304),
    "nvidia/turing": ((7, 5), 32, 65536),
    "nvidia/ampere": ((8, 0), 32, 166912),
    "nvidia/ampere-ga10x": ((8, 6), 32, 101376),
    "nvidia/ada": ((8, 9), 32, 101376),
    "nvidia/hopper": ((9, 0), 32, 232448),
    "nvidia/blackwell": ((10, 0), 32, 232448),
    "nvidia/blackwell-rtx": ((12, 0), 32, 101376),
    "amd/cdna2": (("gfx90a",), 64, 65536),
    "amd/cdna3": (("gfx942",), 64, 65536),
    "amd/cdna4": (("gfx950",), 64, 163840),
    "amd/rdna3": (("gfx1100", "gfx1101", "gfx1102"), 32, 65536),
}

OCP_FP8 = {"nvidia/ada", "nvidia/hopper", "nvidia/blackwell", "nvidia/blackwell-rtx", "amd/cdna4"}
FNUZ_FP8 = {"amd/cdna3"}
EPSILON = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23, "float64": 2**-52}
FP8_EPSILON = {"e4m3": 2**-3, "e5m2": 2**-2}

# vLLM's fused_moe tuning batch sizes (benchmarks/kernels/benchmark_moe.py), which the tokens ladder starts with.
VLLM_MOE_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)

HOPPER = "devices/nvidia/hopper.yml"
DEVICES = P.resources.files("nbxcert.devices")  # taken now: fake_devices below replaces resources.files


def shipped_text(key: str) -> str:
    vendor, name = key.split("/")
    return (DEVICES / vendor / f"{name}.yml").read_text("utf-8")


@pytest.fixture
def hopper_doc() -> dict:
    return yaml.safe_load(shipped_text("nvidia/hopper"))


def load(doc: dict, name: str = HOPPER) -> P.Profile:
    return P.load_profile_file(yaml.safe_dump(doc, sort_keys=False), name)


# --- every shipped file -----------------------------------------------------------------------------------------------
def test_shipped_profiles_are_the_expected_set():
    assert [p.key for p in P.all_profiles()] == SHIPPED
    assert P.all_profiles() is P.all_profiles()  # cached: the files are read once


@pytest.mark.parametrize("key", SHIPPED)
def test_shipped_file_schema(key):
    p = P.get_profile(key)
    assert p.path == f"devices/{key}.yml"
    assert p.backend == P.VENDOR_BACKEND[p.vendor]
    for fact in P.REQUIRED_FACTS[p.vendor]:
        assert p.source(fact).strip()
        p.fact(fact)  # stated (possibly as "not a limit")
    assert p.source("max_num_stages").strip()
    for sku in p.skus:
        assert sku.memory_class == f"{sku.memory_bytes // 2**30}GB"
        assert all(text.strip() for text in sku.sources.values())


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_shipped_device_facts(key):
    p = P.get_profile(key)
    identity, warp, smem = EXPECTED[key]
    if p.vendor == "nvidia":
        assert p.compute_capability == identity
        assert p.target_arch == identity[0] * 10 + identity[1]
        assert p.fact("max_registers_per_block") == 65536
        assert p.fact("max_registers_per_thread") == 255
    else:
        assert p.gfx_arch == identity
        assert p.target_arch in p.gfx_arch
    assert p.fact("warp_size") == warp
    assert p.fact("max_shared_memory_per_block_optin") == smem
    assert p.fact("max_threads_per_block") == 1024


def test_no_cp_async_means_one_stage():
    # sm_7x has no cp.async and Triton runs no pipeliner below capability 8.0: num_stages > 1 would only be noise.
    assert P.get_profile("volta").fact("max_num_stages") == 1
    assert P.get_profile("turing").fact("max_num_stages") == 1
    assert P.get_profile("ampere").fact("max_num_stages") > 1


@pytest.mark.parametrize("key", SHIPPED)
def test_shipped_tolerances(key):
    p = P.get_profile(key)
    for dtype, eps in EPSILON.items():
        assert p.tolerance(dtype) == eps
    for dtype in P.EXACT_DTYPES:
        assert p.tolerance(dtype) == 0
    fp8 = {"float8_e4m3fn", "float8_e5m2"} if key in OCP_FP8 else set()
    fp8 |= {"float8_e4m3fnuz", "float8_e5m2fnuz"} if key in FNUZ_FP8 else set()
    for dtype in P.FLOAT_DTYPES[4:]:
        if dtype in fp8:
            assert p.tolerance(dtype) == FP8_EPSILON[dtype[7:11]]
        else:
            with pytest.raises(DeviceFactMissing):
                p.tolerance(dtype)


def test_ladders_are_identical_across_profiles_and_long_enough():
    reference = P.get_profile("hopper")
    for p in P.all_profiles():
        for name in P.LADDER_NAMES:
            assert p.ladder(name) == reference.ladder(name), (p.key, name)
    assert reference.ladder("tokens")[: len(VLLM_MOE_BATCH_SIZES)] == VLLM_MOE_BATCH_SIZES
    assert {1, 2, 4, 8, 16, 32, 64} <= set(reference.ladder("batch"))
    assert {8192, 131072} <= set(reference.ladder("kv_len"))
    assert reference.ladder("rows")[-1] >= 65536


def test_interpreter_limits_are_stated_as_none():
    p = P.get_profile("interpreter")
    assert p.target_arch is None and p.compute_capability is None and p.skus == ()
    for name in (*P.FACT_NAMES, "max_num_stages"):
        assert p.fact(name) is None
        assert not p.has_limit(name)
        assert P.NOT_A_LIMIT in p.source(name)
    assert P.get_profile("hopper").has_limit("max_shared_memory_per_block_optin")


# --- refusals ---------------------------------------------------------------------------------------------------------
def _set(doc, path, value):
    *parents, last = path
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value


def _del(doc, path):
    *parents, last = path
    node = doc
    for key in parents:
        node = node[key]
    del node[last]


REFUSALS = [
    # (what is changed, value or _del, field named, reason named)
    (("colour",), "green", "colour", "unknown field"),
    (("facts", "warp_sise"), {"value": 32, "source": "typo"}, "facts.warp_sise", "unknown field"),
    (("facts", "warp_size", "unit"), "threads", "facts.warp_size.unit", "unknown field"),
    (("gfx_arch",), {"value": ["gfx942"], "source": "x"}, "gfx_arch", "not a field of a nvidia device file"),
    (("facts", "warp_size", "value"), "32", "facts.warp_size.value", "expected an integer, got str"),
    (("facts", "warp_size", "value"), True, "facts.warp_size.value", "expected an integer, got bool"),
    (("buckets", "tokens", "value"), 4, "buckets.tokens.value", "expected a non-empty list of integers, got int"),
    (("facts", "max_threads_per_block", "source"), _del, "facts.max_threads_per_block", "value without a source"),
    (("facts", "max_threads_per_block", "source"), "  ", "facts.max_threads_per_block.source", "non-empty"),
    (("facts", "max_shared_memory_per_block_optin", "value"), -1, "max_shared_memory_per_block_optin", "negative"),
    (("skus", 0, "l2_bytes", "value"), -52428800, "skus[0].l2_bytes.value", "must be positive"),
    (("buckets", "rows", "value"), [1, 4, 4, 8], "buckets.rows.value", "not increasing: 4 follows 4"),
    (("buckets", "kv_len", "value"), [], "buckets.kv_len.value", "non-empty list"),
    (("facts", "warp_size"), _del, "facts.warp_size", "missing"),
    (("tolerances", "float16"), _del, "tolerances.float16", "missing"),
    (("tolerances", "int8", "value"), 1, "tolerances.int8.value", "certified exactly"),
    (("tolerances", "float16", "value"), 1.5, "tolerances.float16.value", "must lie in (0, 1)"),
    (("tolerances", "float4"), {"value": 0.5, "source": "x"}, "tolerances.float4", "unknown field"),
    (("compute_capability", "value"), 9.0, "compute_capability.value", "quote it"),
    (("target", "arch", "value"), 89, "target.arch.value", "is not compute capability 9.0"),
    (("schema_version",), 2, "schema_version", "reads schema_version 1"),
    (("backend",), "hip", "backend", "uses backend 'cuda'"),
    (("skus", 0, "memory_class"), "81GB", "skus[0].memory_class", 'expected "80GB"'),
    (("skus", 1, "name"), "NVIDIA H100 SXM5 80GB", "skus[1].name", "listed twice"),
    (("skus", 1, "sm_count", "value"), 132, "skus[1]", "same memory and SM count"),
    (("skus",), {"name": "H100"}, "skus", "expected a list"),
    # null is "not a limit on this backend", and only where a source says so, and only for limits.
    (("facts", "max_shared_memory_per_block_optin", "value"), None, "optin.value", "may be null"),
    (
        ("tolerances", "float32"),
        {"value": None, "source": "not a limit on this backend"},
        "float32.value",
        "not be null",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "field", "reason"), REFUSALS, ids=[".".join(map(str, r[0])) for r in REFUSALS]
)
def test_schema_refusals_name_file_field_and_reason(hopper_doc, path, value, field, reason):
    doc = copy.deepcopy(hopper_doc)
    if value is _del:
        _del(doc, path)
    else:
        _set(doc, path, value)
    with pytest.raises(DeviceFileInvalid) as exc:
        load(doc)
    message = str(exc.value)
    assert message.startswith(f"{HOPPER}: field '") and field in message and reason in message, message
    assert "\n" not in message


def test_profile_must_match_its_file_name_and_folder(hopper_doc):
    with pytest.raises(DeviceFileInvalid, match=r"^devices/nvidia/ada.yml: field 'profile': 'hopper' does not match"):
        load(hopper_doc, "devices/nvidia/ada.yml")
    with pytest.raises(DeviceFileInvalid, match=r"^devices/amd/hopper.yml: field 'vendor': 'nvidia' does not match"):
        load(hopper_doc, "devices/amd/hopper.yml")


def test_repeated_key_and_bad_yaml_are_refused():
    # PyYAML keeps the last of two equal keys; a second warp_size must not silently win.
    text = shipped_text("nvidia/hopper").replace("facts:\n", "facts:\n  warp_size: {value: 64, source: dup}\n", 1)
    with pytest.raises(DeviceFileInvalid, match=r"field '\(document\)'.*repeated key 'warp_size'"):
        P.load_profile_file(text, HOPPER)
    with pytest.raises(DeviceFileInvalid, match=r"^devices/nvidia/hopper.yml: field '\(document\)': not valid YAML"):
        P.load_profile_file("facts: [1, 2", HOPPER)
    with pytest.raises(DeviceFileInvalid, match=r"field '\(document\)': expected a mapping"):
        P.load_profile_file("- 1\n", HOPPER)


def test_null_limit_is_accepted_when_sourced_as_no_limit(hopper_doc):
    hopper_doc["facts"]["max_registers_per_thread"] = {"value": None, "source": "Not a limit on this backend: test"}
    p = load(hopper_doc)
    assert p.fact("max_registers_per_thread") is None and not p.has_limit("max_registers_per_thread")


def test_loads_from_a_path_as_from_text(tmp_path):
    path = tmp_path / "hopper.yml"
    path.write_text(shipped_text("nvidia/hopper"))
    assert P.load_profile_file(path, HOPPER) == P.get_profile("hopper")


# --- missing facts ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "ask", "field"),
    [
        ("amd/cdna3", lambda p: p.fact("max_registers_per_block"), "facts.max_registers_per_block"),
        ("nvidia/hopper", lambda p: p.fact("l1_bytes"), "facts.l1_bytes"),
        ("nvidia/hopper", lambda p: p.source("l1_bytes"), "l1_bytes"),
        ("nvidia/ampere", lambda p: p.tolerance("float8_e4m3fn"), "tolerances.float8_e4m3fn"),
        ("amd/cdna3", lambda p: p.tolerance("float8_e4m3fn"), "tolerances.float8_e4m3fn"),
        ("cpu/interpreter", lambda p: p.ladder("heads"), "buckets.heads"),
        ("amd/rdna3", lambda p: p.has_limit("max_registers_per_thread"), "facts.max_registers_per_thread"),
    ],
)
def test_missing_fact_names_file_and_field(key, ask, field):
    with pytest.raises(DeviceFactMissing) as exc:
        ask(P.get_profile(key))
    assert str(exc.value).startswith(f"devices/{key}.yml: ") and f"'{field}'" in str(exc.value)


# --- matching ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", SHIPPED)
def test_every_profile_is_found_by_name_key_and_device(key):
    p = P.get_profile(key)
    assert P.get_profile(p.name) is p
    if p.vendor == "nvidia":
        assert P.match_nvidia(p.compute_capability) == (p, "exact")
    for gfx in p.gfx_arch:
        assert P.match_amd(gfx) == (p, "exact")
        assert P.match_amd(f"{gfx}:sramecc+:xnack-") == (p, "exact")  # HIP's gcnArchName carries features


@pytest.mark.parametrize(
    ("cc", "name"),
    [
        ((7, 2), "volta"),
        ((8, 7), "ampere-ga10x"),
        ((8, 8), "ampere-ga10x"),
        ((10, 3), "blackwell"),
        ((12, 1), "blackwell-rtx"),
    ],
)
def test_family_match_is_nearest_lower_minor_and_says_so(cc, name):
    assert P.match_nvidia(cc) == (P.get_profile(name), "family")


def test_declared_match_comes_before_family(monkeypatch, hopper_doc):
    hopper_doc["compute_capability_matches"] = {"value": ["9.1"], "source": "a test claim"}
    declaring = load(hopper_doc)
    monkeypatch.setattr(P, "all_profiles", lambda: (declaring,))
    assert P.match_nvidia((9, 1)) == (declaring, "declared")
    assert P.match_nvidia((9, 0)) == (declaring, "exact")
    assert P.match_nvidia((9, 2)) == (declaring, "family")


def test_a_declared_match_may_not_repeat_the_own_capability(hopper_doc):
    hopper_doc["compute_capability_matches"] = {"value": ["9.0"], "source": "x"}
    with pytest.raises(DeviceFileInvalid, match="compute_capability_matches.value': lists the file's own"):
        load(hopper_doc)


def test_unknown_devices_and_names_are_refused_with_the_known_ones():
    with pytest.raises(ProfileNotFound, match=r"NVIDIA compute capability 6\.1; known: 7\.0 \(volta\)"):
        P.match_nvidia((6, 1))
    with pytest.raises(ProfileNotFound, match=r"11\.0"):
        P.match_nvidia((11, 0))
    with pytest.raises(ProfileNotFound, match=r"AMD 'gfx1030'; known: .*gfx942 \(cdna3\)"):
        P.match_amd("gfx1030")
    with pytest.raises(ProfileNotFound, match=r"no device profile 'pascal'; known profiles: amd/cdna2, .*nvidia/volta"):
        P.get_profile("pascal")


@pytest.fixture
def fake_devices(tmp_path, monkeypatch):
    """A devices folder of our own for all_profiles(), with the cache cleared before and after."""
    monkeypatch.setattr(P.resources, "files", lambda package: tmp_path)
    P.all_profiles.cache_clear()
    yield tmp_path
    P.all_profiles.cache_clear()


def test_two_files_may_not_claim_one_device(fake_devices, hopper_doc):
    (fake_devices / "nvidia").mkdir()
    (fake_devices / "nvidia" / "hopper.yml").write_text(yaml.safe_dump(hopper_doc))
    twin = copy.deepcopy(hopper_doc)
    twin["profile"] = "hopper-twin"
    (fake_devices / "nvidia" / "hopper-twin.yml").write_text(yaml.safe_dump(twin))
    with pytest.raises(DeviceFileInvalid, match=r"hopper\.yml: field 'compute_capability': 9\.0 is also claimed by"):
        P.all_profiles()


def test_a_broken_shipped_file_stops_loading(fake_devices):
    (fake_devices / "cpu").mkdir()
    (fake_devices / "cpu" / "interpreter.yml").write_text(shipped_text("cpu/interpreter").replace("skus: []", ""))
    with pytest.raises(DeviceFileInvalid, match=r"^devices/cpu/interpreter.yml: field 'skus': missing"):
        P.all_profiles()


# --- SKUs -------------------------------------------------------------------------------------------------------------
def test_sku_for_memory():
    hopper = P.get_profile("hopper")
    # What the H200 this file was measured on reports (cuDeviceTotalMem_v2), 0.99 of the datasheet's 141 GiB.
    assert hopper.sku_for_memory(150109880320).name == "NVIDIA H200 141GB"
    # H100 SXM5 and PCIe are both 80 GB: memory alone is ambiguous, the SM count tells them apart.
    assert hopper.sku_for_memory(80 * 2**30) is None
    assert hopper.sku_for_memory(81559 * 2**20, sm_count=132).name == "NVIDIA H100 SXM5 80GB"
    assert hopper.sku_for_memory(81559 * 2**20, sm_count=114).name == "NVIDIA H100 PCIe 80GB"
    assert hopper.sku_for_memory(81559 * 2**20, sm_count=78) is None
    assert hopper.sku_for_memory(40 * 2**30) is None
    assert P.get_profile("blackwell").sku_for_memory(180 * 2**30) is None  # no SKU sourced, no SKU guessed


def test_certify_and_serving_name_one_memory_class_for_a_card():
    from nbxcert.certify import memory_class
    from nbxcert.memory_class import memory_class as of_card

    hopper = P.get_profile("hopper")
    h100 = 85017493504  # what an H100 80GB HBM3 (132 SMs) reports: certify classed it "85GB", serving "80GB"
    served = of_card(hopper, h100, 132)
    assert served == "80GB"
    # a provenance without the SM count (older entries) still names the class both 80 GB SKUs share
    assert memory_class(hopper, {"gpu_memory_bytes": h100}) == served
    assert memory_class(hopper, {"gpu_memory_bytes": h100, "gpu_sm_count": 132}) == served
    assert memory_class(hopper, {"gpu_memory_bytes": 150109880320, "gpu_sm_count": 132}) == "141GB"
    # a card no SKU of the file describes is classed by its own size, on both sides alike
    assert of_card(hopper, 40 * 2**30) == memory_class(hopper, {"gpu_memory_bytes": 40 * 2**30}) == "43GB"
    assert of_card(hopper, h100, 78) == "85GB"  # an 80 GB card of no stated SM count is no stated SKU
    assert memory_class(P.get_profile("cpu/interpreter"), {"gpu_memory_bytes": 0}) == "cpu"


def test_sku_for_memory_accepts_gddr_with_ecc_on():
    # A 5% window missed every GDDR part with ECC on: a Tesla T4 reports 15843721216 bytes (15110 MiB) of 16 GiB.
    assert P.get_profile("turing").sku_for_memory(15843721216).name == "NVIDIA Tesla T4 16GB"
