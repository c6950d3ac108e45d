"""Device profiles: the sourced facts of each GPU class nbxcert certifies for, and how a device finds its class.

A profile is one YAML file, `devices/<vendor>/<profile>.yml` (schema in `devices/README.md`), shipped as package
data and read through `importlib.resources.files("nbxcert.devices")`, so a wheel and an editable install behave alike.
Every leaf fact is `{value: ..., source: "..."}`: no guessed value. A file that breaks the schema is refused on load
with `DeviceFileInvalid` naming the file, the field and the reason; a fact asked of a file that does not state it
raises `DeviceFactMissing` naming the file and the field.

One exception to "every fact has a value": a limit that the backend does not have (Triton's interpreter has no warps
and no shared memory) is written `value: null`, and the loader accepts it only when its source says "not a limit on
this backend". `Profile.fact` then returns None and `Profile.has_limit` is False, so prune code sees "no limit"
rather than a made-up number.

Matching a device to a profile (`match_nvidia`, `match_amd`) says how strong the match is: "exact" (a file states
this compute capability / gfx name), "declared" (a file lists it in `compute_capability_matches`, which is a claim
that all of its facts hold there) or "family" (no file covers it; the nearest lower minor of the same major, whose
facts are NOT claimed for the device: callers must say so, and certification must not pass it off as exact).
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

import yaml

from nbxcert.errors import DeviceFactMissing, DeviceFileInvalid, ProfileNotFound

SCHEMA_VERSION = 1
VENDOR_BACKEND = {"nvidia": "cuda", "amd": "hip", "cpu": "interpreter"}

# The only words that let a limit be null (see the module docstring); matched case-insensitively in the source.
NOT_A_LIMIT = "not a limit on this backend"

# Facts every file states; NVIDIA files also state the register limits (AMD's VGPR budget is per SIMD and trades
# against waves per EU, so no per-block number is claimed there; asking for one is DeviceFactMissing, as it should be).
FACT_NAMES = (
    "warp_size",
    "max_shared_memory_per_block_optin",
    "max_registers_per_block",
    "max_registers_per_thread",
    "max_threads_per_block",
)
REQUIRED_FACTS = {
    "nvidia": FACT_NAMES,
    "amd": ("warp_size", "max_shared_memory_per_block_optin", "max_threads_per_block"),
    "cpu": FACT_NAMES,
}

FLOAT_DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
)
EXACT_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "bool")
REQUIRED_TOLERANCES = ("float16", "bfloat16", "float32", "float64", *EXACT_DTYPES)
LADDER_NAMES = ("tokens", "batch", "kv_len", "rows", "numel")

# A device's reported memory sits below the datasheet's: the driver reserves some, and GDDR parts with ECC on give up
# 1/16 of it (a Tesla T4 reports 15110 MiB of its 16 GiB, -7.8%, in a published deviceQuery). 10% admits that and
# still separates the memory classes of every shipped profile (the closest two, 20 and 24 GiB, are 17% apart).
MEMORY_MATCH_TOLERANCE = 0.10

_TOP_FIELDS = ("schema_version", "vendor", "profile", "description", "backend")
_TOP_FIELDS += ("facts", "pipelining", "skus", "tolerances", "buckets")
_IDENTITY_FIELDS = ("target", "compute_capability", "gfx_arch", "compute_capability_matches")
# Per vendor, the identity fields it must state and those it may; any other identity field is refused, not ignored.
_VENDOR_IDENTITY = {
    "nvidia": (("target", "compute_capability"), ("compute_capability_matches",)),
    "amd": (("target", "gfx_arch"), ()),
    "cpu": ((), ()),
}
_GFX = re.compile(r"^gfx[0-9a-f]+$")
_CC = re.compile(r"^(\d+)\.(\d+)$")
_PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


# --- the dataclasses --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sku:
    """One product a profile covers; `memory_class` ("80GB") is what tells SKUs of one profile apart."""

    name: str
    memory_bytes: int
    l2_bytes: int
    sm_count: int  # SMs on NVIDIA, compute units on AMD, as the vendor's table counts them
    memory_class: str
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Profile:
    """A validated device file. Facts are read through `fact`, `tolerance` and `ladder`, each naming file and field
    when the file does not state what was asked."""

    vendor: str
    name: str
    path: str  # the resource path text used in messages, e.g. "devices/nvidia/hopper.yml"
    backend: str
    description: str
    target_arch: int | str | None
    compute_capability: tuple[int, int] | None
    gfx_arch: tuple[str, ...]
    declared_matches: tuple[str, ...]
    skus: tuple[Sku, ...]
    # Every leaf by its field path ("facts.warp_size", "tolerances.float16") -> value, and -> source text.
    _values: Mapping[str, Any] = field(compare=False, repr=False)
    _sources: Mapping[str, str] = field(compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.name}"

    def _fact_field(self, name: str) -> str:
        return "pipelining.max_num_stages" if name == "max_num_stages" else f"facts.{name}"

    def fact(self, name: str) -> Any:
        """A fact's value (`facts.<name>`, or `max_num_stages` from `pipelining`); None means "not a limit here"."""
        key = self._fact_field(name)
        if key not in self._values:
            raise DeviceFactMissing(f"{self.path}: no fact '{name}' (field '{key}' is not stated)")
        return self._values[key]

    def has_limit(self, name: str) -> bool:
        """False when the fact is stated as no limit on this backend (`value: null`); DeviceFactMissing if absent."""
        return self.fact(name) is not None

    def source(self, name: str) -> str:
        """The source of a fact (`warp_size`, `max_num_stages`) or of any field by its path (`tolerances.float16`)."""
        for key in (name, self._fact_field(name)):
            if key in self._sources:
                return self._sources[key]
        raise DeviceFactMissing(f"{self.path}: no field '{name}' to give a source for")

    def tolerance(self, dtype_name: str) -> float:
        """The tolerance an output of this dtype is certified at, relative to the error scale (0 = exact)."""
        key = f"tolerances.{dtype_name}"
        if key not in self._values:
            raise DeviceFactMissing(f"{self.path}: no tolerance for dtype '{dtype_name}' (field '{key}' is not stated)")
        return float(self._values[key])

    def ladder(self, name: str) -> tuple[int, ...]:
        """The bucket ladder `name` (tokens, batch, kv_len, rows, numel) launch keys bucket sizes onto."""
        key = f"buckets.{name}"
        if key not in self._values:
            raise DeviceFactMissing(f"{self.path}: no bucket ladder '{name}' (field '{key}' is not stated)")
        return self._values[key]

    def sku_for_memory(self, memory_bytes: int, sm_count: int | None = None) -> Sku | None:
        """The SKU whose memory is closest to `memory_bytes`, within MEMORY_MATCH_TOLERANCE of its datasheet value.

        `sm_count`, when given, must equal the SKU's: two SKUs can share a memory class (H100 SXM5 and PCIe, both
        80 GB, 132 and 114 SMs). None when nothing is close enough, or when the closest is a tie between SKUs that
        `sm_count` did not tell apart: an ambiguous SKU is not picked by list order.
        """
        closest = self.closest_skus(memory_bytes, sm_count)
        return closest[0] if len(closest) == 1 else None

    def closest_skus(self, memory_bytes: int, sm_count: int | None = None) -> list[Sku]:
        """The SKUs (of `sm_count`, when given) whose memory is closest to `memory_bytes`, within
        MEMORY_MATCH_TOLERANCE of their datasheet value: one, several that tie, or none."""
        near = [
            s
            for s in self.skus
            if abs(memory_bytes - s.memory_bytes) <= MEMORY_MATCH_TOLERANCE * s.memory_bytes
            and (sm_count is None or s.sm_count == sm_count)
        ]
        best = min((abs(memory_bytes - s.memory_bytes) for s in near), default=None)
        return [s for s in near if abs(memory_bytes - s.memory_bytes) == best]


# --- validation -------------------------------------------------------------------------------------------------------
class _Checker:
    """Walks one parsed device file, refusing the first thing that breaks the schema, and collects values/sources."""

    def __init__(self, file: str):
        self.file = file
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def fail(self, field_path: str, reason: str) -> DeviceFileInvalid:
        return DeviceFileInvalid(f"{self.file}: field '{field_path or '(document)'}': {reason}")

    def mapping(self, node: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(node, dict):
            raise self.fail(path, f"expected a mapping, got {_kind(node)}")
        for key in node:
            if key not in required and key not in optional:
                raise self.fail(_join(path, str(key)), "unknown field")
        for key in required:
            if key not in node:
                raise self.fail(_join(path, key), "missing")
        return node

    def sourced(self, node: Any, path: str, check, nullable: bool = False) -> Any:
        """A `{value, source}` leaf: `check(value)` returns None or the reason the value is refused."""
        if not isinstance(node, dict):
            raise self.fail(path, f"expected {{value: ..., source: ...}}, got {_kind(node)}")
        for key in node:
            if key not in ("value", "source"):
                raise self.fail(f"{path}.{key}", "unknown field")
        if "source" not in node:
            raise self.fail(path, "value without a source (every value needs `source:`)")
        source = node["source"]
        if not isinstance(source, str) or not source.strip():
            raise self.fail(f"{path}.source", "the source must be non-empty text")
        if "value" not in node:
            raise self.fail(f"{path}.value", "missing")
        value = node["value"]
        if value is None:
            if not (nullable and NOT_A_LIMIT in source.lower()):
                why = f"only a limit whose source says {NOT_A_LIMIT!r} may be null" if nullable else "may not be null"
                raise self.fail(f"{path}.value", why)
        else:
            reason = check(value)
            if reason:
                raise self.fail(f"{path}.value", reason)
        self.values[path] = value
        self.sources[path] = source.strip()
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML `yes` is a bool, and bool is an int


def _positive_int(value: Any) -> str | None:
    if not _is_int(value):
        return f"expected an integer, got {_kind(value)}"
    return None if value > 0 else f"must be positive, got {value}"


def _non_negative_int(value: Any) -> str | None:
    if not _is_int(value):
        return f"expected an integer, got {_kind(value)}"
    return None if value >= 0 else f"must not be negative, got {value}"


def _list_of(value: Any, what: str, check: Callable[[Any], str | None], twice: str = "") -> str | None:
    """A non-empty list of `what`, each item passing `check` (the first item's reason where one does not) and, where
    `twice` names an item, none listed twice."""
    if not isinstance(value, list) or not value:
        return f"expected a non-empty list of {what}, got {_kind(value)}"
    for item in value:
        reason = check(item)
        if reason:
            return reason
    if twice and len(set(value)) != len(value):
        return f"lists a {twice} twice"
    return None


def _rung(value: Any) -> str | None:
    reason = _positive_int(value)
    return f"rung {value!r}: {reason}" if reason else None


def _ladder(value: Any) -> str | None:
    reason = _list_of(value, "integers", _rung)
    if reason:
        return reason
    for low, high in zip(value, value[1:], strict=False):
        if high <= low:
            return f"not increasing: {high} follows {low}"
    return None


def _cc_text(value: Any) -> str | None:
    if not isinstance(value, str) or not _CC.match(value):
        return f'expected text like "9.0" (quote it: YAML reads 9.0 as a number), got {value!r}'
    return None


def _gfx_text(value: Any) -> str | None:
    if not isinstance(value, str) or not _GFX.match(value):
        return f'expected gfx names like "gfx942", got {value!r}'
    return None


def _cc_list(value: Any) -> str | None:
    return _list_of(value, "compute capabilities", _cc_text, twice="compute capability")


def _gfx_list(value: Any) -> str | None:
    return _list_of(value, "gfx names", _gfx_text, twice="gfx name")


def _float_tolerance(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, got {_kind(value)}"
    return None if 0 < value < 1 else f"must lie in (0, 1), got {value}"


def _exact_tolerance(value: Any) -> str | None:
    if not _is_int(value) or value != 0:
        return f"integer and bool outputs are certified exactly: must be 0, got {value!r}"
    return None


def _parse_cc(text: str) -> tuple[int, int]:
    major, minor = _CC.match(text).groups()
    return int(major), int(minor)


class _StrictSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a repeated key: a second `source:` or fact must not silently win."""


def _construct_mapping(loader: _StrictSafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            continue  # construct_mapping below refuses an unhashable key with its own message
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"repeated key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictSafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_profile_file(path_or_text_source: Any, name_for_messages: str) -> Profile:
    """Load and validate one device file.

    `path_or_text_source` is either something with `read_text()` (a `Path`, an importlib resource) or the YAML text
    itself (a `str`). `name_for_messages` is the resource path, "devices/<vendor>/<profile>.yml": every message names
    it, and the file's `vendor` and `profile` must equal its folder and stem.
    """
    file = name_for_messages
    try:
        text = path_or_text_source if isinstance(path_or_text_source, str) else path_or_text_source.read_text("utf-8")
    except UnicodeDecodeError as exc:  # was a traceback (bug found by tests/cli/test_fuzz.py::test_device_file)
        raise DeviceFileInvalid(f"{file}: field '(document)': not UTF-8 text (byte {exc.start})") from None
    try:
        doc = yaml.load(text, Loader=_StrictSafeLoader)  # SafeLoader: plain data only, never Python objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DeviceFileInvalid(f"{file}: field '(document)': not valid YAML ({where}{problem})") from None
    except RecursionError:  # PyYAML's composer recurses per nesting level (same bug hunt)
        raise DeviceFileInvalid(f"{file}: field '(document)': not valid YAML (nested too deeply)") from None
    except ValueError as exc:  # an integer of more than 4300 digits: int() refuses it inside PyYAML (same bug hunt)
        raise DeviceFileInvalid(f"{file}: field '(document)': not valid YAML ({str(exc)[:200]})") from None
    c = _Checker(file)
    stem_path = PurePosixPath(file)

    c.mapping(doc, "", _TOP_FIELDS, _IDENTITY_FIELDS)

    if not _is_int(doc["schema_version"]) or doc["schema_version"] != SCHEMA_VERSION:
        raise c.fail(
            "schema_version", f"this nbxcert reads schema_version {SCHEMA_VERSION}, got {doc['schema_version']!r}"
        )
    vendor = doc["vendor"]
    if not isinstance(vendor, str) or vendor not in VENDOR_BACKEND:
        raise c.fail("vendor", f"expected one of {', '.join(VENDOR_BACKEND)}, got {vendor!r}")
    if vendor != stem_path.parent.name:
        raise c.fail("vendor", f"{vendor!r} does not match the folder {stem_path.parent.name!r}")
    name = doc["profile"]
    if not isinstance(name, str) or not _PROFILE_NAME.match(name):
        raise c.fail("profile", f"expected a lower-case name like 'hopper', got {name!r}")
    if name != stem_path.stem:
        raise c.fail("profile", f"{name!r} does not match the file name {stem_path.stem!r}")
    description = doc["description"]
    if not isinstance(description, str) or not description.strip():
        raise c.fail("description", "expected non-empty text")
    if doc["backend"] != VENDOR_BACKEND[vendor]:
        raise c.fail("backend", f"vendor {vendor} uses backend {VENDOR_BACKEND[vendor]!r}, got {doc['backend']!r}")

    cc, gfx, declared, target_arch = _check_identity(c, doc, vendor)

    facts = c.mapping(doc["facts"], "facts", REQUIRED_FACTS[vendor], FACT_NAMES)
    for fact in facts:
        check = _non_negative_int if fact == "max_shared_memory_per_block_optin" else _positive_int
        c.sourced(facts[fact], f"facts.{fact}", check, nullable=True)
    c.mapping(doc["pipelining"], "pipelining", ("max_num_stages",))
    c.sourced(doc["pipelining"]["max_num_stages"], "pipelining.max_num_stages", _positive_int, nullable=True)

    skus = _check_skus(c, doc["skus"])

    tolerances = c.mapping(doc["tolerances"], "tolerances", REQUIRED_TOLERANCES, FLOAT_DTYPES + EXACT_DTYPES)
    for dtype in tolerances:
        check = _exact_tolerance if dtype in EXACT_DTYPES else _float_tolerance
        c.sourced(tolerances[dtype], f"tolerances.{dtype}", check)

    ladders = c.mapping(doc["buckets"], "buckets", LADDER_NAMES)
    for ladder in ladders:
        c.sourced(ladders[ladder], f"buckets.{ladder}", _ladder)
        c.values[f"buckets.{ladder}"] = tuple(c.values[f"buckets.{ladder}"])

    return Profile(
        vendor=vendor,
        name=name,
        path=file,
        backend=doc["backend"],
        description=description.strip(),
        target_arch=target_arch,
        compute_capability=cc,
        gfx_arch=gfx or (),
        declared_matches=declared,
        skus=skus,
        _values=types.MappingProxyType(c.values),
        _sources=types.MappingProxyType(c.sources),
    )


def _check_identity(c: _Checker, doc: dict, vendor: str) -> tuple:
    """The fields that say which device a file is: (compute capability, gfx names, declared matches, target arch)."""
    required, optional = _VENDOR_IDENTITY[vendor]
    for key in _IDENTITY_FIELDS:
        if key in doc and key not in required + optional:
            raise c.fail(key, f"not a field of a {vendor} device file")
        if key in required and key not in doc:
            raise c.fail(key, f"missing (a {vendor} device file states it)")

    cc = gfx = target_arch = None
    declared: tuple[str, ...] = ()
    if vendor == "nvidia":
        cc = _parse_cc(c.sourced(doc["compute_capability"], "compute_capability", _cc_text))
        if "compute_capability_matches" in doc:
            declared = tuple(c.sourced(doc["compute_capability_matches"], "compute_capability_matches", _cc_list))
            if f"{cc[0]}.{cc[1]}" in declared:
                raise c.fail("compute_capability_matches.value", "lists the file's own compute capability")
    if vendor == "amd":
        gfx = tuple(c.sourced(doc["gfx_arch"], "gfx_arch", _gfx_list))
    if "target" in doc:
        c.mapping(doc["target"], "target", ("arch",))
        if vendor == "nvidia":
            target_arch = c.sourced(doc["target"]["arch"], "target.arch", _positive_int)
            if target_arch != cc[0] * 10 + cc[1]:
                raise c.fail(
                    "target.arch.value", f"{target_arch} is not compute capability {cc[0]}.{cc[1]} as 10*major+minor"
                )
        else:
            target_arch = c.sourced(
                doc["target"]["arch"], "target.arch", lambda v: None if v in gfx else f"{v!r} is not one of gfx_arch"
            )
    return cc, gfx, declared, target_arch


def _check_skus(c: _Checker, node: Any) -> tuple[Sku, ...]:
    if not isinstance(node, list):
        raise c.fail("skus", f"expected a list (empty when no SKU is sourced), got {_kind(node)}")
    skus: list[Sku] = []
    for i, entry in enumerate(node):
        path = f"skus[{i}]"
        c.mapping(entry, path, ("name", "memory_bytes", "l2_bytes", "sm_count", "memory_class"))
        if not isinstance(entry["name"], str) or not entry["name"].strip():
            raise c.fail(f"{path}.name", "expected non-empty text")
        sized = {key: c.sourced(entry[key], f"{path}.{key}", _positive_int) for key in ("memory_bytes", "l2_bytes")}
        sm_count = c.sourced(entry["sm_count"], f"{path}.sm_count", _positive_int)
        # memory_bytes is the datasheet's "N GB" read as N GiB (HBM and GDDR capacities are binary), so the class
        # label and the byte count must agree exactly.
        gib, rest = divmod(sized["memory_bytes"], 2**30)
        if rest or entry["memory_class"] != f"{gib}GB":
            raise c.fail(
                f"{path}.memory_class", f'expected "{gib}GB" for memory_bytes {sized["memory_bytes"]} (whole GiB)'
            )
        sku = Sku(
            name=entry["name"].strip(),
            memory_bytes=sized["memory_bytes"],
            l2_bytes=sized["l2_bytes"],
            sm_count=sm_count,
            memory_class=entry["memory_class"],
            sources=types.MappingProxyType(
                {k: c.sources[f"{path}.{k}"] for k in ("memory_bytes", "l2_bytes", "sm_count")}
            ),
        )
        for other in skus:
            if other.name == sku.name:
                raise c.fail(f"{path}.name", f"SKU {sku.name!r} is listed twice")
            if (other.memory_bytes, other.sm_count) == (sku.memory_bytes, sku.sm_count):
                raise c.fail(path, f"same memory and SM count as {other.name!r}: merge them into one entry")
        skus.append(sku)
    return tuple(skus)


# --- the shipped files ------------------------------------------------------------------------------------------------
@functools.cache
def all_profiles() -> tuple[Profile, ...]:
    """Every shipped device file, validated, sorted by key. Also refuses two files that claim the same device."""
    root = resources.files("nbxcert.devices")
    profiles: list[Profile] = []
    for vendor_dir in sorted(root.iterdir(), key=lambda t: t.name):
        if not vendor_dir.is_dir() or vendor_dir.name.startswith(("_", ".")):
            continue
        for entry in sorted(vendor_dir.iterdir(), key=lambda t: t.name):
            if entry.name.endswith(".yml"):
                profiles.append(load_profile_file(entry, f"devices/{vendor_dir.name}/{entry.name}"))
    _check_no_overlap(profiles)
    return tuple(sorted(profiles, key=lambda p: p.key))


def _check_no_overlap(profiles: list[Profile]) -> None:
    names: dict[str, Profile] = {}
    claimed_cc: dict[str, Profile] = {}  # "9.0" -> the file that states or declares it
    claimed_gfx: dict[str, Profile] = {}
    for p in profiles:
        if p.name in names:
            raise DeviceFileInvalid(f"{p.path}: field 'profile': name {p.name!r} is also {names[p.name].path}")
        names[p.name] = p
        if p.compute_capability is not None:
            own = [(f"{p.compute_capability[0]}.{p.compute_capability[1]}", "compute_capability")]
            for cc, field_name in own + [(d, "compute_capability_matches") for d in p.declared_matches]:
                if cc in claimed_cc:
                    raise DeviceFileInvalid(
                        f"{p.path}: field '{field_name}': {cc} is also claimed by {claimed_cc[cc].path}"
                    )
                claimed_cc[cc] = p
        for gfx in p.gfx_arch:
            if gfx in claimed_gfx:
                raise DeviceFileInvalid(f"{p.path}: field 'gfx_arch': {gfx} is also claimed by {claimed_gfx[gfx].path}")
            claimed_gfx[gfx] = p


def get_profile(name: str) -> Profile:
    """A profile by name: "hopper", "nvidia/hopper", "interpreter" or "cpu/interpreter"."""
    for p in all_profiles():
        if name in (p.name, p.key):
            return p
    known = ", ".join(p.key for p in all_profiles())
    raise ProfileNotFound(f"no device profile {name!r}; known profiles: {known}")


def match_nvidia(cc: tuple[int, int]) -> tuple[Profile, str]:
    """The profile for an NVIDIA compute capability, and how it matched: "exact", "declared" or "family".

    Exact first (a file's `compute_capability`), then declared (a file's `compute_capability_matches`), then family:
    the profile of the same major with the highest minor at or below the device's. A family match borrows facts the
    device was never checked against; it is there so tools can say "nearest: ampere-ga10x", not to certify with.
    """
    major, minor = cc
    nvidia = [p for p in all_profiles() if p.vendor == "nvidia"]
    for p in nvidia:
        if p.compute_capability == (major, minor):
            return p, "exact"
    for p in nvidia:
        if f"{major}.{minor}" in p.declared_matches:
            return p, "declared"
    family = [p for p in nvidia if p.compute_capability[0] == major and p.compute_capability[1] <= minor]
    if family:
        return max(family, key=lambda p: p.compute_capability[1]), "family"
    by_cc = sorted(nvidia, key=lambda p: p.compute_capability)
    known = ", ".join(f"{p.compute_capability[0]}.{p.compute_capability[1]} ({p.name})" for p in by_cc)
    raise ProfileNotFound(f"no device profile for NVIDIA compute capability {major}.{minor}; known: {known}")


def match_amd(gfx: str) -> tuple[Profile, str]:
    """The profile for an AMD gfx name; the feature suffix HIP reports ("gfx942:sramecc+:xnack-") is ignored.

    Only exact matches: AMD gives no binary compatibility between gfx names, so there is no family to fall back on.
    """
    base = gfx.split(":", 1)[0].strip().lower()
    amd = [p for p in all_profiles() if p.vendor == "amd"]
    for p in amd:
        if base in p.gfx_arch:
            return p, "exact"
    known = ", ".join(f"{g} ({p.name})" for p in amd for g in p.gfx_arch)
    raise ProfileNotFound(f"no device profile for AMD {base!r}; known: {known}")
