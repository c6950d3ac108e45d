"""Property-based fuzzing of everything nbxcert reads: each case ends in success or in nbxcert's own error type.

Readers: certificate files (`certificates.read_json` / `validate_doc` / `load_file`, and `dirscan.scan_dir`, the
engine of `nbxcert validate`), compiled indexes (`index.CertifiedIndex.open` / `get` / `keys` / `verify`), keys
files (`keyfile.read_keys`), key text (`keys.parse_key`), workload YAML (`workload.parse_workload`, then the launches
and keys it makes) and device files (`profiles.load_profile_file`). Inputs are random bytes, valid files with bytes
flipped, truncated or spliced with hostile fragments (NaN, 1e999, 5000-digit numbers, 100,000-deep nesting, lone
surrogates, non-UTF-8 bytes, YAML tags and aliases), and valid documents with fields replaced by hostile values.

Every case must end in success or in an `NbxcertError` whose message names the file (the key text, for a key) and
says what is wrong: never another exception, never a traceback.

Each reader has two tests: `test_<reader>` runs a few hundred derandomized cases in CI; `test_<reader>_fuzz` (marked
`fuzz`, outside the regular run) runs NBXCERT_FUZZ_EXAMPLES cases (default 10,000). The long run:

    NBXCERT_FUZZ_REPORT=fuzz.jsonl python -m pytest tests/cli/test_fuzz.py -m fuzz -q

writes each reader's case count and time to NBXCERT_FUZZ_REPORT (tests/FUZZ.md has the figures).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import hashlib
import json
import math
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nbxcert import certificates, dirscan, index, keyfile, keys, profiles, workload
from nbxcert.errors import NbxcertError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
import certs  # noqa: E402
import faulty_kernels  # noqa: E402, F401  (registers fault_probe: certificates are checked against a real spec)

CI_EXAMPLES = int(os.environ.get("NBXCERT_FUZZ_CI_EXAMPLES", "200"))
FUZZ_EXAMPLES = int(os.environ.get("NBXCERT_FUZZ_EXAMPLES", "10000"))
WORK = Path(tempfile.mkdtemp(prefix="nbxcert-fuzz-"))
atexit.register(shutil.rmtree, WORK, True)  # also when the module is collected but none of its tests runs
_COUNTS: dict[str, list] = {}  # reader -> [cases, first call time, last call time]


def fuzz_pair(reader: str, strategy, found=(), ci_examples: int | None = None):
    """Two tests of one property: a CI one (CI_EXAMPLES derandomized cases, or `ci_examples`, plus `found`: the cases
    that were bugs, each failing before its fix) and a `fuzz` one (FUZZ_EXAMPLES random cases)."""

    def make(check):
        def run(case):
            c = _COUNTS.setdefault(reader, [0, time.perf_counter(), 0.0])
            c[0] += 1
            check(case)
            c[2] = time.perf_counter()

        quiet = list(HealthCheck)
        ci = settings(
            max_examples=CI_EXAMPLES if ci_examples is None else ci_examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=quiet,
        )
        long = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=quiet)

        def fuzz(case):
            run(case)

        test_ci = given(strategy)(run)
        for case in found:
            test_ci = example(case)(test_ci)
        return ci(test_ci), pytest.mark.fuzz(long(given(strategy)(fuzz)))

    return make


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("NBXCERT_FUZZ_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            for reader, (cases, first, last) in sorted(_COUNTS.items()):
                f.write(json.dumps({"reader": reader, "cases": cases, "seconds": round(last - first, 1)}) + "\n")
    shutil.rmtree(WORK, ignore_errors=True)


def refused(e: BaseException, where: str) -> None:
    """`e` is nbxcert's own error, and its message names `where` (the file, or the key text) and a reason."""
    assert isinstance(e, NbxcertError), f"{type(e).__name__}: {e}"
    message = str(e)
    assert where in message, f"the message does not name {where!r}: {message[:500]}"
    assert len(message) > len(where) + 5, f"no reason given: {message!r}"


# --- hostile material shared by the strategies ------------------------------------------------------------------------
# Raw fragments spliced into text as-is (json.dumps could not write most of them).
RAW = (
    "[" * 100_000 + "]" * 100_000,
    "[" * 3000 + "]" * 3000,
    "{" * 500,
    "1" * 5000,
    "-" + "9" * 4400,
    "1e999",
    "-1e999",
    "1e-400",
    "NaN",
    "Infinity",
    "-Infinity",
    "0x10",
    "01",
    '"\\ud800"',
    '"\\u0000"',
    '"..\\/..\\/etc\\/passwd"',
    '{"a": 1, "a": 2}',
    "true",
    "null",
    "[]",
    "{}",
    '"__class__"',
    "\xff",
    "\u202e",
)
SENTINEL = "\x00RAW{}\x00"
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**30, -1, -4, 0, 3, 2**16 + 1, 2**63, 2**64 + 1, 10**400, -(10**400)]),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["../../etc/passwd", "__class__", "a/b", "..", "", "1", "NaN", "cuda_events", "correct"]),
)
json_values = st.recursive(
    st.one_of(scalars, st.integers(0, len(RAW) - 1).map(SENTINEL.format)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


def unraw(text: str) -> str:
    """Replace each sentinel (a JSON string holding it) by its raw fragment."""
    for i, fragment in enumerate(RAW):
        text = text.replace(json.dumps(SENTINEL.format(i)), fragment).replace(SENTINEL.format(i), fragment)
    return text


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw, base, values=json_values, max_ops: int = 3):
    """`base` with 1..max_ops random edits: a node replaced, deleted, renamed, or a field added."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, max_ops))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(("replace", "delete", "add", "rename")))
        if not path:
            if op == "replace":
                doc = copy.deepcopy(draw(values))  # sampled_from hands out one shared object: never edit it
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        if op == "replace":
            parent[last] = copy.deepcopy(draw(values))
        elif op == "delete":
            del parent[last]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = copy.deepcopy(draw(values))
        elif op == "add":
            parent.insert(last, copy.deepcopy(draw(values)))
        elif op == "rename" and isinstance(parent, dict):
            new = draw(st.one_of(st.text(max_size=40), st.sampled_from([f"{k}x" for k in parent])))
            parent[new] = parent.pop(last)
    return doc


@st.composite
def spliced(draw, text: str):
    """`text` with bytes flipped, cut, or hostile fragments spliced in, as bytes."""
    data = bytearray(text.encode("utf-8"))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("flip", "truncate", "splice", "delete")))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[at:]
        elif op == "splice":
            fragment = draw(st.one_of(st.sampled_from(RAW), st.text(max_size=10)))
            data[at:at] = fragment.encode("utf-8", "surrogatepass")
        else:
            del data[at : at + draw(st.integers(1, 40))]
    return bytes(data)


# --- certificate files ------------------------------------------------------------------------------------------------
PROBE = {
    "schema_version": 1,
    "kernel": "fault_probe",
    "dtype": "float32",
    "profile": "cpu/interpreter",
    "entries": {certs.probe_key(300): certs.probe_entry(300), certs.probe_key(512): certs.probe_entry(512)},
}
HOPPER = {
    "schema_version": 1,
    "kernel": "rmsnorm",
    "dtype": "float16",
    "profile": "nvidia/hopper",
    "entries": {certs.key(n_cols=512): certs.entry(block=512, refused=2)},
}
HOPPER_NAME = ("nvidia/hopper", "rmsnorm", "float16")
CERT_DIR = WORK / "certs"
SPECS = dirscan.load_specs(["faulty_kernels"])


def _spec_lookup(name):
    return SPECS[name]


certificate_cases = st.one_of(
    st.tuples(st.sampled_from(("probe", "hopper")), st.binary(max_size=3000)),
    st.tuples(st.just("probe"), spliced(certificates.dumps(PROBE))),
    st.tuples(st.just("hopper"), spliced(certificates.dumps(HOPPER))),
    st.tuples(st.just("probe"), mutated(PROBE).map(lambda d: unraw(json.dumps(d)).encode("utf-8", "surrogatepass"))),
    st.tuples(st.just("hopper"), mutated(HOPPER).map(lambda d: unraw(json.dumps(d)).encode("utf-8", "surrogatepass"))),
)


def check_certificate(case) -> None:
    which, data = case
    shutil.rmtree(CERT_DIR, ignore_errors=True)
    profile, kernel, dtype = ("cpu/interpreter", "fault_probe", "float32") if which == "probe" else HOPPER_NAME
    path = CERT_DIR / profile / certificates.file_name(kernel, dtype)
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    lookup = _spec_lookup if which == "probe" else None
    try:
        cert = certificates.load_file(path, lookup)
    except Exception as e:  # noqa: BLE001 - the property: only nbxcert's own error, naming the file
        refused(e, str(path))
        loaded = False
    else:
        assert cert.kernel == kernel and isinstance(cert.entries, dict)
        loaded = True
    scan = dirscan.scan_dir(CERT_DIR, SPECS if which == "probe" else None)  # never raises on what it reads
    assert scan.files == 1
    if scan.ok:
        assert loaded, "`nbxcert validate` found no problem in a file the loader refuses"
        # a clean directory also builds and serves: the index round-trips every entry
        out = WORK / "cert.nbxidx"
        cls = "cpu" if which == "probe" else "80GB"
        built = index.CertifiedIndex.build([CERT_DIR], profile, cls, out)
        for k in built.keys():  # noqa: SIM118 - the index's own keys() is what is tested
            assert built.get(k) == certificates.of_class(cert.entries[k], cls)  # the class's entry of the key
        built.close()


def _probe_with(old: str, new: str) -> tuple[str, bytes]:
    text = certificates.dumps(PROBE)
    assert old in text
    return ("probe", text.replace(old, new, 1).encode())


CERTIFICATE_BUGS = (
    _probe_with('"median_us":3300.0', '"median_us":1' + "0" * 400),  # OverflowError from math.isfinite
    _probe_with("fault_probe[n=300;", "fault_probe[n=" + "1" * 5000 + ";"),  # ValueError from int() (> 4300 digits)
    _probe_with('"memory_class":"cpu"', '"memory_class":"cpu","other_classes":null'),  # TypeError in a reader
)
test_certificates, test_certificates_fuzz = fuzz_pair("certificates", certificate_cases, CERTIFICATE_BUGS)(
    check_certificate
)


# --- compiled indexes -------------------------------------------------------------------------------------------------
def _base_index() -> bytes:
    root = WORK / "index-src"
    entries = {certs.key(n_cols=c): certs.entry(block=c) for c in (256, 512, 1024)}
    certs.write_file(root, entries)
    return index._compile([root], certs.PROFILE, "80GB")[0]


BASE_INDEX = _base_index()
_HEADER_AT = {"count": 16, "keys_off": 24, "table_off": 32, "certs_off": 40, "trailer_off": 48}


def _reseal(data: bytearray, spine: bool) -> bytes:
    """Recompute the spine digest (when `spine`) and the trailer: the forgery a writer of the cache could make."""
    if spine and len(data) >= 128:
        certs_off = struct.unpack_from("<Q", data, 40)[0]
        if certs_off <= len(data):
            h = hashlib.sha256(bytes(data[:96]))
            h.update(bytes(data[128:certs_off]))
            data[96:128] = h.digest()
    return bytes(data[:-32]) + hashlib.sha256(bytes(data[:-32])).digest() if len(data) >= 32 else bytes(data)


@st.composite
def index_bytes(draw):
    kind = draw(st.sampled_from(("random", "flip", "cut", "forged", "forged-spine", "header")))
    if kind == "random":
        return draw(st.one_of(st.binary(max_size=600), st.binary(max_size=200).map(lambda b: index.MAGIC + b)))
    data = bytearray(BASE_INDEX)
    if kind == "cut":
        at = draw(st.integers(0, len(data) + 64))
        return bytes(data[:at]) if at <= len(data) else bytes(data) + draw(st.binary(min_size=1, max_size=64))
    if kind == "header":
        for _ in range(draw(st.integers(1, 2))):
            field = draw(st.sampled_from(sorted(_HEADER_AT)))
            value = draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, len(data) + 64)))
            struct.pack_into("<Q", data, _HEADER_AT[field], value)
        return _reseal(data, spine=True)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 33))
        data[at] ^= draw(st.integers(1, 255))
    return bytes(data) if kind == "flip" else _reseal(data, spine=kind == "forged-spine")


def check_index(data: bytes) -> None:
    path = WORK / "fuzz.nbxidx"
    path.with_name(path.name + index.SIDECAR_SUFFIX).unlink(missing_ok=True)
    path.write_bytes(data)
    try:
        idx = index.CertifiedIndex.open(path)
        try:
            listed = list(idx.keys())
            for k in listed:
                idx.get(k)
            for k in (certs.key(n_cols=512), certs.key(n_cols=8192), "", "zzz"):
                idx.get(k)
            idx.verify()
            # a verified index serves every key it lists (a forged spine can reorder keys: verify must catch it)
            assert all(k in idx and isinstance(idx.get(k), dict) for k in listed)
        finally:
            idx.close()
    except Exception as e:  # noqa: BLE001 - the property: only nbxcert's own error, naming the file
        refused(e, str(path))


def _forged_key_byte() -> bytes:
    """A whole index whose first key holds a byte that is not UTF-8, spine and trailer recomputed."""
    data = bytearray(BASE_INDEX)
    data[data.index(b"rmsnorm[")] = 0xFF
    return _reseal(data, spine=True)


def _forged_key_offset() -> bytes:
    """A whole index whose first offsets-table row points past the end of the file, spine and trailer recomputed."""
    data = bytearray(BASE_INDEX)
    table_off = struct.unpack_from("<Q", data, _HEADER_AT["table_off"])[0]
    struct.pack_into("<Q", data, table_off, 2**40)
    return _reseal(data, spine=True)


def _forged_key_order() -> bytes:
    """A whole index whose first key now sorts last (lookups miss it), spine and trailer recomputed."""
    data = bytearray(BASE_INDEX)
    data[data.index(b"rmsnorm[")] = ord("z")
    return _reseal(data, spine=True)


# UnicodeDecodeError, struct.error, and a verified index that did not serve a key it lists
INDEX_BUGS = (_forged_key_byte(), _forged_key_offset(), _forged_key_order())
test_index, test_index_fuzz = fuzz_pair("index", index_bytes(), INDEX_BUGS)(check_index)


# --- keys files and key text ------------------------------------------------------------------------------------------
VALID_KEYS = (
    certs.key(),
    certs.probe_key(300),
    "rope[head_dim=64,n_heads=2,n_kv_heads=1,n_tokens=16,rot_dim=64,style=neox;float16]@v1",
    "softmax[mask=none,n_cols=512,n_rows=1;float16]@v1",
    "a[;]@v1",
)
key_parts = st.one_of(
    st.sampled_from(["a", "n", "N", "n_rows", "_", "9", "", "=", ",", ";", "[", "]", "@v1", "@v", "²", "٣", "ｎ"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789=,;[]@vV \t\n.-/", max_size=8),
    st.sampled_from(["1" * 5000, "0" * 3, "007", "9" * 30, "v" + "1" * 5000, "@v" + "9" * 5000]),
)
key_texts = st.one_of(
    st.text(max_size=80),
    st.lists(key_parts, max_size=12).map("".join),
    st.builds(
        lambda name, fields, dtypes, version: f"{name}[{fields};{dtypes}]@v{version}",
        st.one_of(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), key_parts),
        st.lists(st.tuples(key_parts, key_parts).map("=".join), max_size=4).map(",".join),
        st.lists(st.sampled_from(["float16", "int32", "", "F16", "x y"]), max_size=3).map(",".join),
        st.one_of(st.integers(0, 3).map(str), key_parts),
    ),
    st.sampled_from(VALID_KEYS).flatmap(lambda k: spliced(k).map(lambda b: b.decode("utf-8", "replace"))),
)


def check_key_text(text: str) -> None:
    try:
        key = keys.parse_key(text)
    except Exception as e:  # noqa: BLE001 - the property: only KeyParseError, saying what is wrong
        refused(e, "")
        assert isinstance(e, keys.KeyParseError), type(e)
    else:
        assert key.text() == text.strip() and keys.parse_key(key.text()) == key


KEY_TEXT_BUGS = ("a[n=" + "1" * 5000 + ";float32]@v1", "a[n=1;float32]@v" + "1" * 5000)  # ValueError from int()
test_key_text, test_key_text_fuzz = fuzz_pair("key_text", key_texts, KEY_TEXT_BUGS)(check_key_text)

keys_file_lines = st.one_of(
    st.sampled_from(VALID_KEYS).map(lambda k: json.dumps({"key": k, "event": "served"}).encode()),
    key_texts.map(lambda k: json.dumps({"key": k}).encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: unraw(json.dumps(v)).encode("utf-8", "surrogatepass")),
    st.binary(max_size=120),
    st.sampled_from([b"", b"   ", b"\xff\xfe", b"[" * 2000 + b"]" * 2000, b'{"key": "' + b"a" * 5000 + b'"}']),
)
keys_files = st.one_of(
    st.lists(keys_file_lines, max_size=8).map(b"\n".join),
    st.binary(max_size=2000),
    spliced("".join(json.dumps({"key": k}) + "\n" for k in VALID_KEYS)),
)


def check_keys_file(data: bytes) -> None:
    path = WORK / "keys.jsonl"
    path.write_bytes(data)
    try:
        found = keyfile.read_keys(path)
    except Exception as e:  # noqa: BLE001 - the property: only nbxcert's own error, naming the file
        refused(e, str(path))
    else:
        assert len(set(found)) == len(found)


KEYS_FILE_BUGS = (b"\x80", b"[" * 2000 + b"]" * 2000)  # UnicodeDecodeError, RecursionError
test_keys_file, test_keys_file_fuzz = fuzz_pair("keys_file", keys_files, KEYS_FILE_BUGS)(check_keys_file)

# --- workload YAML ----------------------------------------------------------------------------------------------------
DEMO_TEXT = resources.files("nbxcert").joinpath("workloads", "demo.yml").read_text()
DEMO = yaml.safe_load(DEMO_TEXT)
YAML_RAW = (
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "&a [1, 2]",
    "*a",
    "[" * 5000 + "]" * 5000,
    "1" * 5000,
    "{ladder: tokens, max: x}",
    "{ladder: nosuch, max: 64}",
    "{ladder: tokens, max: 64, min: [1]}",
    ".nan",
    ".inf",
    "0x10",
    "yes",
    "~",
    "'\\xff'",
    "\t",
)
yaml_values = st.one_of(
    st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
        max_leaves=8,
    ),
    st.sampled_from([[16], [0], [-1], [2**70], {"ladder": "tokens", "max": 64}, {"ladder": "kv_len", "max": 2**40}]),
    st.sampled_from(["rmsnorm", "layernorm", "silu", "neox", "gptj", "float16", "int8"]),
)
workload_texts = st.one_of(
    st.text(max_size=300),
    spliced(DEMO_TEXT),
    mutated(DEMO, yaml_values).map(lambda d: yaml.safe_dump(d, sort_keys=False)),
    st.builds(
        lambda text, at, fragment: text[:at] + fragment + text[at:],
        st.just(DEMO_TEXT),
        st.integers(0, len(DEMO_TEXT)),
        st.sampled_from(YAML_RAW),
    ),
    st.sampled_from(
        [
            "x: &a [1,1,1,1,1,1,1,1]\ny: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nz: &c [*b,*b,*b,*b,*b,*b,*b,*b]\n",
            DEMO_TEXT.replace("prefill_tokens: [16]", "prefill_tokens: {ladder: tokens, max: 64}"),
        ]
    ),
)
WORKLOAD_KERNELS = {"rmsnorm", "add_rmsnorm", "silu_and_mul", "softmax", "embedding", "rope", "matmul"}


def check_workload(data) -> None:
    path = WORK / "workload.yml"
    profile = profiles.get_profile("cpu/interpreter")
    try:
        if isinstance(data, bytes):
            path.write_bytes(data)
            w = workload.load_workload(str(path))
        else:
            w = workload.parse_workload(data, str(path))
        workload.launches(w, profile)
        workload.workload_keys(w, profile, WORKLOAD_KERNELS)
    except Exception as e:  # noqa: BLE001 - the property: only nbxcert's own error, naming the workload file
        refused(e, str(path))


WORKLOAD_BUGS = (
    b"\xa3" + DEMO_TEXT.encode(),  # UnicodeDecodeError
    "[" * 5000 + "]" * 5000,  # RecursionError
    "x: " + "1" * 5000,  # ValueError from int() inside PyYAML
    DEMO_TEXT.replace("kv_lens: [64]", "kv_lens: {ladder: kv_len, max: x}"),  # TypeError from sizes()
    DEMO_TEXT.replace("kv_lens: [64]", "kv_lens: {ladder: nosuch, max: 64}"),  # refused naming the device file
)
test_workload, test_workload_fuzz = fuzz_pair("workload", workload_texts, WORKLOAD_BUGS)(check_workload)

# --- device files -----------------------------------------------------------------------------------------------------
DEVICE_FILES = {
    f"devices/{name}": resources.files("nbxcert.devices").joinpath(name).read_text()
    for name in ("cpu/interpreter.yml", "nvidia/hopper.yml")
}
DEVICE_DOCS = {name: yaml.safe_load(text) for name, text in DEVICE_FILES.items()}
device_cases = st.sampled_from(sorted(DEVICE_FILES)).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.one_of(
            st.text(max_size=300),
            spliced(DEVICE_FILES[name]),
            mutated(DEVICE_DOCS[name], yaml_values).map(lambda d: yaml.safe_dump(d, sort_keys=False)),
            st.builds(
                lambda at, fragment, text=DEVICE_FILES[name]: text[:at] + fragment + text[at:],
                st.integers(0, len(DEVICE_FILES[name])),
                st.sampled_from(YAML_RAW),
            ),
        ),
    )
)


def check_device_file(case) -> None:
    name, data = case
    try:
        if isinstance(data, bytes):
            path = WORK / "device.yml"
            path.write_bytes(data)
            p = profiles.load_profile_file(path, name)
        else:
            p = profiles.load_profile_file(data, name)
    except Exception as e:  # noqa: BLE001 - the property: only DeviceFileInvalid, naming the file
        refused(e, name)
    else:
        assert p.key == name[len("devices/") : -len(".yml")]
        for fact in profiles.REQUIRED_FACTS[p.vendor]:
            p.fact(fact)
        for ladder in profiles.LADDER_NAMES:
            assert p.ladder(ladder) == tuple(sorted(set(p.ladder(ladder))))


DEVICE_BUGS = tuple(
    ("devices/cpu/interpreter.yml", case)
    for case in (
        b"\xa3" + DEVICE_FILES["devices/cpu/interpreter.yml"].encode(),  # UnicodeDecodeError
        "[" * 5000 + "]" * 5000,  # RecursionError
        "a: " + "1" * 5000,  # ValueError from int() inside PyYAML
    )
)
test_device_file, test_device_file_fuzz = fuzz_pair("device_file", device_cases, DEVICE_BUGS)(check_device_file)


# --- the command line -------------------------------------------------------------------------------------------------
# Every command run in this process (Typer's CliRunner) over argument lists drawn from valid, boundary and garbage
# values, with the NBXCERT_* variables that name paths drawn too. The property: exit code 0, 1 or 2; no uncaught
# exception (a traceback in a real run); at most one `nbxcert:` error line, with its next step (` -> `); and no file
# written anywhere but where the case named (an argument or a variable) or the case's own HOME (an audit hook sees
# every open-for-write, mkdir, rename and removal). A case runs in a fresh directory of fixtures. What would take
# seconds is replaced at the point where the work starts, and each replacement asserts that what reached it was
# checked (the property "every input is checked before any work starts"): certify's sweep of one key
# (`certify.sweep_key`), the census's compiles (`census.run_census`) and verify's checked launch
# (`kernels.check.run_checked`). Arguments never hold a NUL byte (no argv or environment can).
from typer.testing import CliRunner  # noqa: E402

from nbxcert import cli as nbxcert_cli  # noqa: E402
from nbxcert import options as nbx_options  # noqa: E402

CLI_CI_EXAMPLES = int(os.environ.get("NBXCERT_FUZZ_CLI_CI_EXAMPLES", "12"))  # per command, each a process of its own
CLI_WORK = WORK / "cli"
TEMPLATE = CLI_WORK / "template"
SHIPPED = Path(str(resources.files("nbxcert.shipped_certificates")))
DEMO_KEYS = [k.text() for k in keyfile.gather_keys(profiles.get_profile("cpu/interpreter"), workload="demo")]


def _template() -> None:
    """The fixtures every case starts from (copied into the case's own directory)."""
    t = TEMPLATE
    shutil.copytree(SHIPPED / "cpu" / "interpreter", t / "certs" / "cpu" / "interpreter")
    certs.write_probe(t / "probe", {certs.probe_key(300): certs.probe_entry(300)})
    (t / "emptydir").mkdir()
    (t / "keys.jsonl").write_text("".join(json.dumps({"key": k}) + "\n" for k in DEMO_KEYS[:3]))
    (t / "empty.jsonl").write_text("")
    (t / "bad.jsonl").write_text("not json\n")
    (t / "offladder.jsonl").write_text(json.dumps({"key": "rmsnorm[n_cols=64,n_rows=7;float16,float16]@v1"}) + "\n")
    (t / "probe.jsonl").write_text(json.dumps({"key": certs.probe_key(300)}) + "\n")
    (t / "work.yml").write_text(DEMO_TEXT)
    (t / "file.txt").write_text("a regular file\n")
    (t / "home").mkdir()


_template()

_NO_PROFILE = ["", "nosuch", "../x", "hopper\n", "\udcff", "cpu/", "INTERPRETER"]
PROFILES = (["interpreter", "cpu/interpreter", "hopper"], ["nvidia/hopper", "volta", "cdna3"], _NO_PROFILE)
DEVICE_PROFILES = (["interpreter", "cpu/interpreter"], ["hopper", "nvidia/hopper", "volta"], _NO_PROFILE)  # this CPU
GPU_PROFILES = (["hopper", "volta", "ampere"], ["interpreter", "nvidia/hopper", "cdna3"], _NO_PROFILE)  # census
KEYS = (
    DEMO_KEYS[:4] + [certs.probe_key(300), "rmsnorm[n_cols=64,n_rows=4;float16,float16]@v1"],
    [
        "rmsnorm[n_cols=64,n_rows=7;float16,float16]@v1",  # off the ladder
        "rmsnorm[n_cols=64,n_rows=0;float16,float16]@v1",
        "rmsnorm[n_cols=64,n_rows=65537;float16,float16]@v1",  # above the top rung: a bucket of its own
        "rmsnorm[n_cols=0,n_rows=1;float16,float16]@v1",
        "rmsnorm[n_cols=9223372036854775807,n_rows=1;float16,float16]@v1",
        "rmsnorm[n_cols=9223372036854775808,n_rows=1;float16,float16]@v1",
        "rmsnorm[n_cols=64;float16,float16]@v1",  # a field missing
        "rmsnorm[n_cols=64,n_rows=8,x=1;float16,float16]@v1",
        "rmsnorm[n_cols=64,n_rows=8;float16]@v1",
        "rmsnorm[n_cols=none,n_rows=8;float16,float16]@v1",
        "softmax[mask=1,n_cols=64,n_rows=8;float16]@v1",
        "softmax[mask=bogus,n_cols=64,n_rows=8;float16]@v1",
        "decode_attention[batch=2,head_dim=64,heads=1,kv_heads=0,kv_len=32;float16]@v1",
        "nosuch[n=1;float16]@v1",
        "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v2",
    ],
    ["", "rmsnorm", "rmsnorm[", "[;]@v1", "a[;]@v1", "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1\n", "\udcff"],
)
_ANY_PATH = [
    "certs",
    "probe",
    "keys.jsonl",
    "work.yml",
    "emptydir",
    "file.txt",
    "empty.jsonl",
    "bad.jsonl",
    "offladder.jsonl",
    "probe.jsonl",
    "fifo",
    "/",
    "/dev/null",
    ".",
]
_NO_PATH = ["", "nosuch", "nosuch/x.yml", "/nonexistent", "file.txt/sub", "x\udcff", "a\nb", "-", "--"]
CERT_DIRS = (["certs", "probe"], ["emptydir", "/", "."] + _ANY_PATH, _NO_PATH)
KEY_FILES = (["keys.jsonl", "probe.jsonl"], ["empty.jsonl", "bad.jsonl", "offladder.jsonl"] + _ANY_PATH, _NO_PATH)
OUT_DIRS = (["out", "out/deep/er", "certs"], ["emptydir", "."], ["", "file.txt", "file.txt/sub", "fifo", "x\udcff"])
OUT_FILES = (
    ["new.xml", "stale.jsonl"],
    ["file.txt", "/dev/null"],
    ["", "certs", "file.txt/sub", "nosuch/x", ".", "fifo"],
)
WORKLOADS = (
    ["demo", "work.yml"],
    ["tinyllama-1.1b", "keys.jsonl", "emptydir", "/dev/null"],
    ["", "nosuch", "nosuch.yml", "../workloads/demo", "fifo"],
)
KERNEL_LISTS = (
    ["rmsnorm", "rmsnorm,softmax", "embedding"],
    ["fault_probe", "rmsnorm,rmsnorm", "rope"],
    ["", ",", "rmsnrom", "rope,", "RMSNORM", "rms norm"],
)
JOBS = (["1", "2"], ["1024", "1025", "0"], ["-1", "99999999999999999999", "abc", "1.5", ""])
TIMEOUTS = (["0.5", "30"], ["86400", "1e-9", "0"], ["-1", "nan", "inf", "1e309", "86401", "x"])
FRACTIONS = (["1.0", "0.5", "0"], ["1.0000001", "-0.0", "1e-320"], ["nan", "inf", "-1", "x", ""])
SHARDS = (["0/1", "0/2", "1/2"], ["2/2", "0/999999999", " 0/1", "0/0"], ["-1/2", "a/b", "1", "\u0663/4", "", "1/2/3"])
SPECS_ = (
    ["faulty_kernels"],
    ["faulty_kernels:extra", "nbxcert.keys", "os"],
    ["", "..x", ".x", "no_such_module", "faulty_kernels.nosuch", "a b"],
)
PREFER = (["newest", "fastest"], [], ["", "slowest", "NEWEST"])
ENV_POOLS = {
    "NBXCERT_CERTIFIED_DIR": (
        ["certs", "probe"],
        ["certs:probe", ":", "emptydir"],
        ["nosuch", "file.txt", "/nonexistent"],
    ),
    "NBXCERT_CACHE_DIR": (["cache"], ["emptydir", "cache/deep"], ["file.txt", "file.txt/sub", "fifo"]),
    "NBXCERT_KEY_RECORD": (["rec.jsonl"], ["file.txt"], ["certs", "nosuch/rec.jsonl", "fifo"]),
    # never `sweep`: a run-time sweep runs every candidate in this process, and fault_probe's FAULT=4 is a segfault
    "NBXCERT_UNCERTIFIED": (["default"], [], ["bogus", "Sweep!"]),
    "NBXCERT_CERTIFIED_ONLY": (["1"], ["0"], ["yes"]),
    "NBXCERT_STRICT_PROVENANCE": (["1"], [], ["true"]),
}
POSITIONAL_TAGS = {"DIR": CERT_DIRS, "OUTDIR": OUT_DIRS, "KEY": KEYS}
REQUIRED_WHEN_CLEAN = {"certify": ("--out",), "export": ("--format", "--out")}  # what a valid argument list holds
FORMATS = (["vllm-fused-moe", "triton-autotune"], ["VLLM-FUSED-MOE", "vllm_fused_moe"], ["", "csv", "vllm", "json"])
EXPORT_KERNELS = (["fused_moe", "fused_moe,rmsnorm"], ["rmsnorm", "fault_probe"], ["", ",", "fused_mo", "FUSED_MOE"])

# Each command: its positional arguments (pool tags) and its options (None: a flag).
COMMANDS = {
    "keys": (
        (),
        {
            "--profile": PROFILES,
            "--workload": WORKLOADS,
            "--keys": KEY_FILES,
            "--key": KEYS,
            "--kernels": KERNEL_LISTS,
            "--spec": SPECS_,
            "--json": None,
        },
    ),
    "certify": (
        (),
        {
            "--profile": DEVICE_PROFILES,
            "--workload": WORKLOADS,
            "--keys": KEY_FILES,
            "--key": KEYS,
            "--kernels": KERNEL_LISTS,
            "--out": OUT_DIRS,
            "--shard": SHARDS,
            "--force": None,
            "--jobs": JOBS,
            "--spec": SPECS_,
            "--timeout": TIMEOUTS,
            "--json": None,
        },
    ),
    "verify": (
        (),
        {
            "--profile": DEVICE_PROFILES,
            "--workload": WORKLOADS,
            "--keys": KEY_FILES,
            "--key": KEYS,
            "--kernels": KERNEL_LISTS,
            "--dir": CERT_DIRS,
            "--certified-only": None,
            "--shard": SHARDS,
            "--jobs": JOBS,
            "--spec": SPECS_,
            "--json": None,
        },
    ),
    "warm": (
        (),
        {
            "--profile": DEVICE_PROFILES,
            "--workload": WORKLOADS,
            "--keys": KEY_FILES,
            "--key": KEYS,
            "--kernels": KERNEL_LISTS,
            "--dir": CERT_DIRS,
            "--jobs": JOBS,
            "--spec": SPECS_,
            "--json": None,
        },
    ),
    "coverage": (
        (),
        {
            "--profile": PROFILES,
            "--workload": WORKLOADS,
            "--keys": KEY_FILES,
            "--key": KEYS,
            "--kernels": KERNEL_LISTS,
            "--dir": CERT_DIRS,
            "--min": FRACTIONS,
            "--spec": SPECS_,
            "--json": None,
            "--junit-xml": OUT_FILES,
        },
    ),
    "census": (
        (),
        {
            "--profile": GPU_PROFILES,
            "--kernels": KERNEL_LISTS,
            "--keys": KEY_FILES,
            "--workload": WORKLOADS,
            "--key": KEYS,
            "--jobs": JOBS,
            "--strict": None,
            "--spec": SPECS_,
            "--timeout": TIMEOUTS,
            "--json": None,
        },
    ),
    "validate": (("DIR",), {"--spec": SPECS_, "--json": None}),
    "show": (("KEY",), {"--profile": PROFILES, "--dir": CERT_DIRS, "--spec": SPECS_, "--json": None}),
    "diff": (("DIR", "DIR"), {"--json": None}),
    "merge": (("OUTDIR", "DIR"), {"--prefer": PREFER, "--spec": SPECS_, "--json": None}),
    "stale": (("DIR",), {"--profile": PROFILES, "--out": OUT_FILES, "--json": None}),
    "index build": (("DIR",), {"--cache": OUT_DIRS}),
    "index check": (("DIR",), {"--cache": (["cache", "out"], ["emptydir"], _NO_PATH + ["file.txt", "fifo"])}),
    "export": (
        (),
        {
            "--format": FORMATS,
            "--profile": PROFILES,
            "--out": OUT_DIRS,
            "--dir": CERT_DIRS,
            "--kernels": EXPORT_KERNELS,
            "--spec": SPECS_,
            "--json": None,
        },
    ),
    "kernels": ((), {"--spec": SPECS_, "--json": None}),
    "doctor": ((), {"--json": None}),
    "profiles": ((), {"--json": None}),
}


# what a real argv or environment can hold: no NUL, and surrogates only as the escapes of undecodable bytes
_ARG_TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=8)


@st.composite
def pool(draw, p):
    """A value from a (valid, boundary, garbage) pool, mostly valid (so that whole valid argument lists come up),
    or any short text."""
    valid, boundary, garbage = p
    kind = draw(st.integers(0, 19))
    if kind < 12 or not (boundary or garbage):
        return draw(st.sampled_from(valid))
    if kind < 16 and boundary:
        return draw(st.sampled_from(boundary))
    if kind < 19 and garbage:
        return draw(st.sampled_from(garbage))
    return draw(_ARG_TEXT)


@st.composite
def cli_case(draw, command: str):
    """(command, argument list, environment): half the cases every value valid (so the work is reached), half drawn
    from all the pools, with now and then a stray token."""
    positional, opts = COMMANDS[command]
    clean = draw(st.booleans())

    def value(p):
        return draw(st.sampled_from(p[0])) if clean else draw(pool(p))

    args = command.split()
    if "--profile" in opts and (clean or draw(st.integers(0, 9)) > 0):  # the one required option, mostly given
        args += ["--profile", value(opts["--profile"])]
    for tag in positional:
        if clean or draw(st.integers(0, 9)) > 0:
            args.append(value(POSITIONAL_TAGS[tag]))
    names = sorted(n for n in opts if n != "--profile" or not clean)
    chosen = draw(st.lists(st.sampled_from(names), max_size=5))
    sources = [n for n in ("--workload", "--keys", "--key") if n in opts]
    if clean and sources and not set(chosen) & set(sources):
        chosen.append(draw(st.sampled_from(sources)))
    if clean:
        chosen += [name for name in REQUIRED_WHEN_CLEAN.get(command, ()) if name not in chosen]
    for name in chosen:
        args.append(name)
        if opts[name] is not None:
            args.append(value(opts[name]))
    if not clean and draw(st.integers(0, 19)) == 0:  # a stray token: an unknown option, a value out of place
        at = draw(st.integers(1, len(args)))
        args.insert(at, draw(st.sampled_from(["--nosuch", "-x", "extra", "--", "--json=1", "--profile"])))
    env = {}
    for name, p in ENV_POOLS.items():
        if draw(st.integers(0, 3)) == 0:
            env[name] = value(p)
    return command, args, env


class ReachedWork(Exception):
    """Raised by a stand-in for work that takes seconds (the census's compiles) once it has checked its inputs."""


REACHED: dict[str, int] = {}  # how many cases reached each stand-in (the long run reports it)
_WRITES: list[tuple[str, str]] = []
_AUDITING = [False]
_WRITE_EVENTS = {
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.symlink": (1,),
    "os.link": (1,),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
    "shutil.move": (1,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args) -> None:
    if not _AUDITING[0]:
        return
    paths = []
    if event == "open":
        path, mode, flags = args
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITE_FLAGS):
            paths.append(path)
    elif event in _WRITE_EVENTS:
        paths += [args[i] for i in _WRITE_EVENTS[event] if i < len(args)]
    for p in paths:
        if isinstance(p, (str, bytes, os.PathLike)):
            _WRITES.append((event, os.path.abspath(os.fsdecode(p))))


sys.addaudithook(_audit)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _sweep_stand_in(spec, key, profile, runner, compiler, seed, timeout_s, progress=None):
    """certify's sweep of one key: only keys checked against their spec and ladders reach it, with a sane limit."""
    from nbxcert.sweep import SweepResult

    REACHED["certify"] = REACHED.get("certify", 0) + 1
    keys.check_prune(spec, keys.check_key(spec, key, profile), profile)
    assert math.isfinite(timeout_s) and 0 < timeout_s <= nbx_options.MAX_TIMEOUT_S, timeout_s
    return SweepResult(key, keys.key_problems(spec, key, profile), [], None, None, None, None, {"total": 0.0})


def _census_stand_in(profile, kernels=None, keys_=None, jobs=None, strict=False, modules=(), timeout_s=None, *a):
    from nbxcert.kernels.spec import get_spec

    assert kernels is None or (kernels and all(get_spec(k) for k in kernels))
    assert keys_ is None or len(keys_) > 0
    for k in keys_ or ():
        spec = get_spec(k.kernel)
        keys.check_prune(spec, keys.check_key(spec, k, profile), profile)
    assert jobs is None or 1 <= jobs <= nbx_options.MAX_JOBS
    assert timeout_s is None or (math.isfinite(timeout_s) and timeout_s > 0)
    REACHED["census"] = REACHED.get("census", 0) + 1
    raise ReachedWork("census")


def _checked_stand_in(*args, **kwargs):
    """verify's checked launch of one key's config: every output agrees (the launch itself is the kernel tests')."""
    REACHED["verify"] = REACHED.get("verify", 0) + 1
    return {}


_TIMES: dict[str, list[float]] = {}
# A case takes well under a second; one that runs this long waits for ever or does work it was never asked for. Before
# this limit such a case was no failure, only a shard that never finished: `NBXCERT_KEY_RECORD=fifo` (a named pipe
# that nothing reads) made verify wait for ever, and verify made tinyllama-1.1b's inputs for 455 s.
CASE_S = float(os.environ.get("NBXCERT_FUZZ_CASE_S", "120"))


class CaseTimedOut(BaseException):
    """A case ran past CASE_S (a BaseException: the command's own handlers and CliRunner let it through)."""


@contextlib.contextmanager
def _time_limit(seconds: float, args, env):
    def expired(signum, frame):
        raise CaseTimedOut(f"{args} env={env}: still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_cli(case) -> None:
    from unittest import mock

    command, args, env = case
    where = CLI_WORK / "case"
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(TEMPLATE, where)
    os.mkfifo(where / "fifo")
    home = where / "home"
    full_env = {k: None for k in os.environ if k.startswith("NBXCERT_")}
    full_env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), TRITON_CACHE_DIR=str(home / ".triton"))
    full_env.update(NBXCERT_BACKEND="interpreter", NBXCERT_CACHE_DIR="cache", NBXCERT_UNCERTIFIED="default")
    full_env.update(env)
    # where this case may write: what it named (relative names are in its directory), its HOME, and /dev/null
    # an empty path is the current directory (Typer reads `--cache ''` as Path(''), which is '.')
    named = [a or "." for a in args] + [v for v in env.values() if v]
    # a value is a path as a whole (NBXCERT_CACHE_DIR='a:b' is one directory) or, as NBXCERT_CERTIFIED_DIR is read,
    # colon-separated paths
    allowed = [os.path.abspath(os.path.join(where, p)) for n in named for p in {n, *n.split(":")} if p] + [str(home)]
    allowed += ["/dev/null", os.path.abspath(os.path.join(where, "cache"))]
    cwd = os.getcwd()
    os.chdir(where)
    _WRITES.clear()
    t0 = time.perf_counter()
    try:
        with (
            mock.patch("nbxcert.certify.sweep_key", _sweep_stand_in),
            mock.patch("nbxcert.census.run_census", _census_stand_in),
            mock.patch("nbxcert.kernels.check.run_checked", _checked_stand_in),
            mock.patch.object(nbxcert_cli, "PROGRESS_S", 0.05),
        ):
            _AUDITING[0] = True
            try:
                with _time_limit(CASE_S, args, env):
                    r = CliRunner().invoke(nbxcert_cli.app, args, env=full_env)
            finally:
                _AUDITING[0] = False
    finally:
        os.chdir(cwd)
        _TIMES.setdefault(command, []).append(time.perf_counter() - t0)
    text = (r.stdout or "") + (r.stderr or "")
    if isinstance(r.exception, ReachedWork):
        return
    assert r.exception is None or isinstance(r.exception, SystemExit), (
        f"{args} env={env}: {type(r.exception).__name__}: {r.exception}\n"
        + "".join(__import__("traceback").format_exception(r.exception))[-3000:]
    )
    assert r.exit_code in (0, 1, 2), (args, env, r.exit_code, text[-2000:])
    assert "Traceback" not in text, (args, env, text[-2000:])
    errors_ = [line for line in (r.stderr or "").splitlines() if line.startswith("nbxcert: ")]
    assert len(errors_) <= 1, (args, env, errors_)
    if r.exit_code == 1 and errors_:
        assert len(errors_[0]) > 20 and "\n" not in errors_[0]
        # and the next step: "what failed, which value, what to do next" (lines with no next step were found by this)
        assert " -> " in errors_[0], (args, env, errors_[0])
    # a directory made on the way to a named path (`--out a/b/c` makes a and a/b) is where the case asked for
    outside = [
        (e, p)
        for e, p in _WRITES
        if not any(_inside(p, a) or (e == "os.mkdir" and _inside(a, p) and _inside(p, str(where))) for a in allowed)
    ]
    assert not outside, (args, env, outside[:5])
    assert all(_inside(p, str(WORK)) or p == "/dev/null" for _, p in _WRITES), (args, env, _WRITES[:5])


CLI_BUGS: dict[str, tuple] = {
    # each failed before its fix (the list, and what this test found)
    "keys": (
        ("keys", ["keys", "--profile", "interpreter", "--key", "rmsnorm[n_cols=64;float16,float16]@v1"], {}),
        ("keys", ["keys", "--profile", "interpreter", "--workload", "emptydir"], {}),  # no next step
    ),
    "certify": (
        (
            "certify",
            ["certify", "--profile", "interpreter", "--key", "rmsnorm[n_cols=64;float16,float16]@v1", "--out", "out"],
            {},
        ),  # KeyError: 'n_rows' from keys.key_problems
        (
            "certify",
            [
                "certify",
                "--profile",
                "interpreter",
                "--key",
                "decode_attention[batch=2,head_dim=64,heads=1,kv_heads=0,kv_len=32;float16]@v1",
                "--out",
                "out",
            ],
            {},
        ),  # ZeroDivisionError from decode attention's prune
        ("certify", ["certify", "--profile", "interpreter", "--workload", "demo", "--out", "out", "--jobs", "-1"], {}),
        (
            "certify",
            ["certify", "--profile", "interpreter", "--workload", "demo", "--out", "out", "--timeout", "1e309"],
            {},
        ),
        ("certify", ["certify", "--profile", "interpreter", "--workload", "demo"], {}),  # wrote ./certificates
        (
            "certify",
            ["certify", "--profile", "interpreter", "--workload", "demo", "--out", "o", "--timeout", "nan"],
            {},
        ),
    ),
    "verify": (
        ("verify", ["verify", "--profile", "interpreter", "--key", "rmsnorm[n_cols=64;float16,float16]@v1"], {}),
        ("verify", ["verify", "--profile", "interpreter", "--workload", "demo", "--shard", "2/2"], {}),  # no next step
        # a named pipe that nothing reads as the key record: verify waited for ever recording the first key
        ("verify", ["verify", "--profile", "interpreter", "--workload", "demo"], {"NBXCERT_KEY_RECORD": "fifo"}),
        # every key of tinyllama-1.1b without a certificate had its largest inputs made, under
        # NBXCERT_UNCERTIFIED=default where nothing is swept: 455 s for this case
        (
            "verify",
            ["verify", "--profile", "interpreter", "--workload", "tinyllama-1.1b"],
            {"NBXCERT_CERTIFIED_DIR": ""},
        ),
    ),
    # a named pipe that nothing reads: the JUnit report waited for ever to be written
    "coverage": (
        ("coverage", ["coverage", "--profile", "interpreter", "--workload", "demo", "--junit-xml", "fifo"], {}),
    ),
    "census": (("census", ["census", "--profile", "hopper", "--key", "rmsnorm[n_cols=64;float16,float16]@v1"], {}),),
    "kernels": (("kernels", ["kernels", "--spec", ""], {}), ("kernels", ["kernels", "--spec", "..x"], {})),
    "merge": (
        ("merge", ["merge", "file.txt/sub", "certs"], {}),  # NotADirectoryError from the lock's mkdir
        ("merge", ["merge", "out", "certs", "--prefer", "NEWEST"], {}),  # an error line with no next step
    ),
    # error lines with no next step (`-> ...`): a workload directory "does not exist", a file given as a certificate
    # directory "does not exist", `--shard 2/2`, `--timeout nan`
    "index check": (("index check", ["index", "check", "file.txt"], {}),),
    "export": (("export", ["export", "--format", "csv", "--profile", "hopper", "--out", "out"], {}),),
    # the harness's: a cache directory with a colon in its name was split as a search path is (index build wrote
    # where the case said, and the check said elsewhere)
    "index build": (
        ("index build", ["index", "build"], {"NBXCERT_CERTIFIED_DIR": "certs", "NBXCERT_CACHE_DIR": "c-:m"}),
    ),
}

for _command in COMMANDS:
    _name = _command.replace(" ", "_")
    globals()[f"test_cli_{_name}"], globals()[f"test_cli_{_name}_fuzz"] = fuzz_pair(
        f"cli_{_name}", cli_case(_command), CLI_BUGS.get(_command, ()), ci_examples=CLI_CI_EXAMPLES
    )(check_cli)
