"""Property-based fuzzing of everything nbxcert reads: each case ends in success or in nbxcert's own error type.

Readers: certificate files (`certificates.read_json` / `validate_doc` / `load_file`, and `certtools.scan_dir`, the
engine of `nbxcert validate`), compiled indexes (`index.CertifiedIndex.open` / `get` / `keys` / `verify`), keys
files (`keyfile.read_keys`), key text (`keys.parse_key`), workload YAML (`workload.parse_workload`, then the launches
and keys it makes) and device files (`profiles.load_profile_file`). Inputs are random bytes, valid files with bytes
flipped, truncated or spliced with hostile fragments (NaN, 1e999, 5000-digit numbers, 100,000-deep nesting, lone
surrogates, non-UTF-8 bytes, YAML tags and aliases), and valid documents with fields replaced by hostile values.

Every case must end in success or in an `NbxcertError` whose message names the file (the key text, for a key) and
says what is wrong: never another exception, never a traceback.

Each reader has two tests: `test_<reader>` runs a few hundred derandomized cases in CI; `test_<reader>_fuzz` (marked
`fuzz`, outside the regular run) runs NBXCERT_FUZZ_EXAMPLES cases (default 10,000). The long run:

    NBXCERT_FUZZ_REPORT=fuzz.jsonl python -m pytest tests/test_fuzz.py -m fuzz -q

writes each reader's case count and time to NBXCERT_FUZZ_REPORT (tests/FUZZ.md has the figures).
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import os
import shutil
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

from nbxcert import certificates, certtools, index, keyfile, keys, profiles, workload
from nbxcert.errors import NbxcertError

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import certs  # noqa: E402
import faulty_kernels  # noqa: E402, F401  (registers fault_probe: certificates are checked against a real spec)

CI_EXAMPLES = int(os.environ.get("NBXCERT_FUZZ_CI_EXAMPLES", "200"))
FUZZ_EXAMPLES = int(os.environ.get("NBXCERT_FUZZ_EXAMPLES", "10000"))
WORK = Path(tempfile.mkdtemp(prefix="nbxcert-fuzz-"))
atexit.register(shutil.rmtree, WORK, True)  # also when the module is collected but none of its tests runs
_COUNTS: dict[str, list] = {}  # reader -> [cases, first call time, last call time]


def fuzz_pair(reader: str, strategy, found=()):
    """Two tests of one property: a CI one (CI_EXAMPLES derandomized cases, plus `found`: the cases that were bugs,
    each failing before its fix) and a `fuzz` one (FUZZ_EXAMPLES random cases)."""

    def make(check):
        def run(case):
            c = _COUNTS.setdefault(reader, [0, time.perf_counter(), 0.0])
            c[0] += 1
            check(case)
            c[2] = time.perf_counter()

        quiet = list(HealthCheck)
        ci = settings(
            max_examples=CI_EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=quiet
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
SPECS = certtools.load_specs(["faulty_kernels"])


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
    scan = certtools.scan_dir(CERT_DIR, SPECS if which == "probe" else None)  # never raises on what it reads
    assert scan.files == 1
    if scan.ok:
        assert loaded, "`nbxcert validate` found no problem in a file the loader refuses"
        # a clean directory also builds and serves: the index round-trips every entry
        out = WORK / "cert.nbxidx"
        built = index.CertifiedIndex.build([CERT_DIR], profile, "cpu" if which == "probe" else "80GB", out)
        for k in built.keys():
            assert built.get(k) == cert.entries[k]
        built.close()


def _probe_with(old: str, new: str) -> tuple[str, bytes]:
    text = certificates.dumps(PROBE)
    assert old in text
    return ("probe", text.replace(old, new, 1).encode())


CERTIFICATE_BUGS = (
    _probe_with('"median_us": 3300.0', '"median_us": 1' + "0" * 400),  # OverflowError from math.isfinite
    _probe_with("fault_probe[n=300;", "fault_probe[n=" + "1" * 5000 + ";"),  # ValueError from int() (> 4300 digits)
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
