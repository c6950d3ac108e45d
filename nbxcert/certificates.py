"""Certificates: the JSON files people review, one per kernel and output dtype, and their validated loading.

    certificates/<vendor>/<profile>/<kernel>.<dtype>.json

Each file holds `schema_version`, the profile, the kernel, the dtype and `entries`: one certification per launch key
(winner, runner-up, margin, measured error and tolerance, refusal counts, reproducibility, memory class, seed, oracle,
provenance). Files are written deterministically (sorted keys, a two-space indent, each entry on a line of its own,
a trailing newline) so a pull request's diff is a line per key certified, and atomically (a temp file renamed over
the old one) under an exclusive lock on the directory, so two certify runs into one directory lose nothing and a
killed run leaves every file whole. Nothing read is executed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbxcert import files
from nbxcert.errors import CertificateInvalid, KeyParseError
from nbxcert.files import atomic_write
from nbxcert.keys import parse_key

SCHEMA_VERSION = 1
MAX_FILE_BYTES = 64 * 2**20  # a certificate file larger than this is refused before it is read
_FILE_NAME = re.compile(r"(?P<kernel>[a-z][a-z0-9_]*)\.(?P<dtype>[a-z][a-z0-9_]*)\.json\Z")
OUTCOMES = ("pruned", "compile", "resources", "crash", "timeout", "mismatch", "correct")
PROVENANCE_FIELDS = {
    "gpu": str,
    "gpu_memory_bytes": int,
    "compute_capability": str,
    "driver": str,
    "cuda": str,
    "triton": str,
    "nbxcert": str,
    "python": str,
    "date": str,
    "host_os": str,
    "backend": str,
}
# The provenance fields that name the card and the software besides nbxcert itself: a certification made with the same
# ones and the same code (`code`, else nbxcert's version) is one run configuration (`certify.same_card` skips a rerun
# on them, `merge` merges by them).
CARD_FIELDS = ("gpu", "gpu_memory_bytes", "compute_capability", "driver", "triton", "backend")
# code: the digest of the source a certification depends on (`nbxcert.fingerprint`; entries before 0.4.0 have none);
# gpu_sm_count: the card's multiprocessors (tells SKUs of one memory size apart; older entries have none)
PROVENANCE_OPTIONAL = {"code": str, "gpu_sm_count": int}
# cuda_events: event pairs around each call as the host queued it (nbxcert < 0.3.0; a kernel shorter than its launch
# on the host was timed by the launch); cuda_events_gated: repetitions queued behind a held stream and run back to
# back (`triton_cuda.time_events`); cuda_events_waiting: a launch that waits for the device itself, timed ungated.
TIMING_KINDS = ("cuda_events", "cuda_events_gated", "cuda_events_waiting", "interpreter_cpu")


@dataclass(frozen=True)
class CertFile:
    """One loaded and validated certificate file."""

    path: Path
    kernel: str
    dtype: str
    profile: str
    entries: dict[str, dict[str, Any]]


def file_name(kernel: str, dtype: str) -> str:
    return f"{kernel}.{dtype}.json"


def profile_dir(root: Path, profile_key: str) -> Path:
    return Path(root) / profile_key


def dumps(doc: dict) -> str:
    """The one serialisation of a certificate document (deterministic; NaN refused): its fields sorted, with a
    two-space indent, and each entry of `entries` on a line of its own (`entry_text`), so that a certification is one
    line of a pull request's diff (`nbxcert diff OLD NEW` names the keys whose winner changed) and the files stay
    small: the shipped hopper files were 28.3 MB written indented throughout, 14.8 MB so."""
    entries = doc.get("entries")
    if isinstance(entries, dict):
        return dumps_from(doc, {k: entry_text(k, v) for k, v in entries.items()})
    return _indented(doc)


def _indented(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"


# --- validation -------------------------------------------------------------------------------------------------------
def invalid(path, key, field, reason) -> CertificateInvalid:
    """The `CertificateInvalid` of a certificate file (and key, and field) for `reason`, its parts attached (the index
    raises these too, for a file it cannot read)."""
    where = f"{path}" + (f": key {key}" if key else "") + (f": field '{field}'" if field else "")
    e = CertificateInvalid(f"{where}: {reason}")
    e.file, e.key, e.field, e.reason = str(path), key, field, reason  # the parts, for `nbxcert validate --json`
    return e


def _check_type(path, key, field, value, kind, allow_none=False):
    # JSON's own types first: an index build checks some 700,000 values, nearly all of them valid
    if type(value) is kind and kind is not float or kind is float and type(value) is float and value - value == 0.0:
        return
    if value is None and allow_none:
        return
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise invalid(path, key, field, f"expected an integer, got {type(value).__name__}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise invalid(path, key, field, f"expected a number, got {type(value).__name__}")
    if kind is float and not _finite(value):
        raise invalid(path, key, field, "expected a finite number")
    if kind in (str, bool, dict, list) and not isinstance(value, kind):
        raise invalid(path, key, field, f"expected {kind.__name__}, got {type(value).__name__}")


def _finite(value) -> bool:
    """A finite float, or an int a float can hold: math.isfinite(10**400) raises OverflowError, which reached the
    loader's caller as a traceback (bug found by tests/cli/test_fuzz.py::test_certificates)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _check_keys(path, key, field, obj: dict, required: dict, optional: dict | None = None):
    optional = optional or {}
    _check_type(path, key, field, obj, dict)
    for name in obj:
        if name not in required and name not in optional:
            raise invalid(path, key, f"{field}.{name}" if field else name, "unknown field")
    # a field's name is spelled out only for the check that reports it (formatting it for every valid value cost a
    # fifth of an index build)
    for name, kind in required.items():
        if name not in obj:
            raise invalid(path, key, f"{field}.{name}" if field else name, "missing")
        value = obj[name]
        if kind is not None and (type(value) is not kind or kind is float):
            _check_type(path, key, f"{field}.{name}" if field else name, value, kind)
    for name, kind in optional.items():
        if kind is not None and name in obj:
            value = obj[name]
            if value is not None and (type(value) is not kind or kind is float):
                _check_type(path, key, f"{field}.{name}" if field else name, value, kind, allow_none=True)


def check_config(path, key, field, cfg: Any, spec=None) -> None:
    """A config as certificates store it: kwargs of ints/words, warps and stages in sane ranges. With the kernel's
    spec, every kwarg must be one the kernel takes, with a value one of its candidates uses."""
    _check_keys(path, key, field, cfg, {"kwargs": dict, "num_warps": int, "num_stages": int})
    if cfg["num_warps"] not in (1, 2, 4, 8, 16, 32):
        raise invalid(path, key, f"{field}.num_warps", f"{cfg['num_warps']} is not a power of two in 1..32")
    if not 1 <= cfg["num_stages"] <= 16:
        raise invalid(path, key, f"{field}.num_stages", f"{cfg['num_stages']} is out of range 1..16")
    for name, value in cfg["kwargs"].items():
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise invalid(path, key, f"{field}.kwargs.{name}", "must be an integer or a word")
        if isinstance(value, int) and not 0 <= value <= 2**16:
            raise invalid(path, key, f"{field}.kwargs.{name}", f"{value} is out of range 0..65536")
    if spec is not None:
        from nbxcert.kernels.spec import Config

        allowed: dict[str, set] = {}
        for c in spec.candidates:
            for n, v in c.kwargs:
                allowed.setdefault(n, set()).add(v)
        for name in cfg["kwargs"]:
            if name not in allowed:
                raise invalid(path, key, f"{field}.kwargs.{name}", f"kernel {spec.name} takes no config field '{name}'")
        if Config.from_dict(cfg) not in set(spec.candidates):
            raise invalid(path, key, field, f"config is not one of kernel {spec.name}'s candidates")


def config_label(cfg: Mapping[str, Any]) -> str:
    """A stored config as one line: its kwargs in name order, then warps and stages (`BLOCK=64,warps=4,stages=1`)."""
    parts = [f"{k}={v}" for k, v in sorted(cfg["kwargs"].items())]
    return ",".join(parts + [f"warps={cfg['num_warps']}", f"stages={cfg['num_stages']}"])


_TIMING = {"median_us": float, "min_us": float, "spread": float, "reps": int, "kind": str}
_ENTRY_REQUIRED = {
    "winner": dict,
    "runner_up": None,
    "margin": None,
    "default": None,
    "error": dict,
    "counts": dict,
    "reproducible": bool,
    "memory_class": str,
    "seed": int,
    "oracle": str,
    "provenance": dict,
    "certified_problems": dict,
    "refused": list,
}


# A key certified on cards of several memory classes of its profile (an H100 and an H200 of nvidia/hopper) keeps one
# entry a class: the first class's entry holds the others under this field, keyed by their class, each a whole entry
# of its own (with no such field). Serving takes its card's class (`of_class`); readers that want one entry a key
# (coverage, stale, export) read the first.
OTHER_CLASSES = "other_classes"


def own(entry: Mapping[str, Any]) -> dict:
    """A key's first memory class's entry: the entry without the other classes' it holds."""
    return {k: v for k, v in entry.items() if k != OTHER_CLASSES}


def class_entries(entry: Mapping[str, Any]) -> dict[str, dict]:
    """Every memory class's entry of one key: {class: entry}, the first class's first (`own`)."""
    first = own(entry)
    return {first["memory_class"]: first, **entry.get(OTHER_CLASSES, {})}


def of_class(entry: Mapping[str, Any] | None, memory_class: str) -> dict | None:
    """The key's entry of `memory_class` (None: no entry, or none of that class)."""
    return None if entry is None else class_entries(entry).get(memory_class)


def with_class(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict:
    """The key's entry once `new` is added: `new` replaces the entry of its own class and keeps the other classes'
    (a certify run on an H100 leaves the H200's entry of the same key in place, and the reverse)."""
    new = own(new)
    if old is None:
        return new
    entries = class_entries(old) | {new["memory_class"]: new}
    first = old["memory_class"]
    others = {c: entries[c] for c in sorted(entries) if c != first}
    return entries[first] | ({OTHER_CLASSES: others} if others else {})


def validate_entry(path, key_text: str, entry: Any, kernel: str, dtype: str, spec=None) -> None:
    _check_type(path, key_text, "", entry, dict)
    _validate_one(path, key_text, own(entry), kernel, dtype, spec)
    if OTHER_CLASSES not in entry:
        return
    others = entry[OTHER_CLASSES]
    _check_type(path, key_text, OTHER_CLASSES, others, dict)  # null included: a reader would fail on it
    if not others:
        raise invalid(path, key_text, OTHER_CLASSES, "is empty (leave it out where the key has one class)")
    for cls, other in others.items():
        field = f"{OTHER_CLASSES}.{cls}"
        _check_type(path, key_text, field, other, dict)
        if OTHER_CLASSES in other:
            raise invalid(path, key_text, f"{field}.{OTHER_CLASSES}", "an entry of another class holds no others")
        _validate_one(path, key_text, other, kernel, dtype, spec)
        if other["memory_class"] != cls:
            raise invalid(path, key_text, f"{field}.memory_class", f"'{other['memory_class']}' is not its key '{cls}'")
        if cls == entry["memory_class"]:
            raise invalid(path, key_text, field, "is the class of the entry that holds it")


# a name that can be part of a file name: a memory class names its index file (`index`), as a profile's name does
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def _check_timing(path, key_text: str, field: str, t: dict) -> None:
    """A timing as one can be: a median above 0, a minimum from 0 to the median, a spread of 0 or more, 1 repetition
    or more (a median of -1 us was kept by `merge` as the fastest)."""
    if not t["median_us"] > 0:
        raise invalid(path, key_text, f"{field}.median_us", f"{t['median_us']} is not above 0")
    if not 0 <= t["min_us"] <= t["median_us"]:
        raise invalid(path, key_text, f"{field}.min_us", f"{t['min_us']} is not from 0 to the median {t['median_us']}")
    if t["spread"] < 0:
        raise invalid(path, key_text, f"{field}.spread", f"{t['spread']} is negative")
    if t["reps"] < 1:
        raise invalid(path, key_text, f"{field}.reps", f"{t['reps']} is not 1 or more")


def _validate_one(path, key_text: str, entry: Any, kernel: str, dtype: str, spec=None) -> None:
    try:
        key = parse_key(key_text)
    except KeyParseError as e:
        raise invalid(path, key_text, None, f"key does not parse: {e.message}") from None
    if key.kernel != kernel:
        raise invalid(path, key_text, None, f"key's kernel '{key.kernel}' is not the file's kernel '{kernel}'")
    if key.text() != key_text:  # a key with spaces around it: never served, and merge kept it beside the real one
        raise invalid(path, key_text, None, f"key is not written canonically: write '{key.text()}'")
    _check_keys(path, key_text, "", entry, _ENTRY_REQUIRED, {"finalists": list})
    for role in ("winner", "default"):
        if role == "default" and entry[role] is None:
            continue  # the untuned default was refused on this device (its refusal is in the counts)
        _check_keys(path, key_text, role, entry[role], {"config": dict, "timing": dict})
        check_config(path, key_text, f"{role}.config", entry[role]["config"], spec)
        _check_keys(path, key_text, f"{role}.timing", entry[role]["timing"], _TIMING)
        _check_timing(path, key_text, f"{role}.timing", entry[role]["timing"])
        if entry[role]["timing"]["kind"] not in TIMING_KINDS:
            raise invalid(path, key_text, f"{role}.timing.kind", f"must be one of {TIMING_KINDS}")
    for i, f in enumerate(entry.get("finalists") or ()):  # optional: certificates before nbxcert 0.2.0 lack it
        _check_keys(path, key_text, f"finalists[{i}]", f, {"config": dict, "timing": dict})
        check_config(path, key_text, f"finalists[{i}].config", f["config"], spec)
        _check_keys(path, key_text, f"finalists[{i}].timing", f["timing"], _TIMING)
        _check_timing(path, key_text, f"finalists[{i}].timing", f["timing"])
    finals = entry.get("finalists") or ()
    if finals:  # the winner is chosen from them: its own row holds the timing it won by (readers take either)
        row = next((f for f in finals if f["config"] == entry["winner"]["config"]), None)
        if row is None:
            raise invalid(path, key_text, "finalists", "do not hold the winner, which is chosen from them")
        if row["timing"] != entry["winner"]["timing"]:
            raise invalid(path, key_text, "winner.timing", "is not the timing of its own row of finalists")
    if entry["runner_up"] is not None:
        _check_keys(path, key_text, "runner_up", entry["runner_up"], {"config": dict, "timing": dict})
        check_config(path, key_text, "runner_up.config", entry["runner_up"]["config"], spec)
        _check_keys(path, key_text, "runner_up.timing", entry["runner_up"]["timing"], _TIMING)
        _check_timing(path, key_text, "runner_up.timing", entry["runner_up"]["timing"])
        _check_type(path, key_text, "margin", entry["margin"], float)
    elif entry["margin"] is not None:
        raise invalid(path, key_text, "margin", "must be null when there is no runner-up")
    _check_keys(
        path,
        key_text,
        "error",
        entry["error"],
        {"max_abs": float, "max_rel": float, "max_scaled": float, "tolerance": float},
    )
    error = entry["error"]
    for name in ("max_abs", "max_rel", "tolerance"):
        if error[name] < 0:
            raise invalid(path, key_text, f"error.{name}", f"{error[name]} is negative")
    if not 0 <= error["max_scaled"] <= 1:  # the winner's error over its tolerance: a certified winner is within it
        raise invalid(path, key_text, "error.max_scaled", f"{error['max_scaled']} is not within [0, 1]")
    if not SAFE_NAME.match(entry["memory_class"]):  # it names the index file serving builds for the class
        raise invalid(
            path,
            key_text,
            "memory_class",
            f"{entry['memory_class']!r} is not a class name (letters, digits, '.', '_', '-')",
        )
    _check_keys(path, key_text, "counts", entry["counts"], {o: int for o in OUTCOMES})
    if any(v < 0 for v in entry["counts"].values()):
        raise invalid(path, key_text, "counts", "counts must not be negative")
    if entry["counts"]["correct"] < 1:
        raise invalid(path, key_text, "counts.correct", "a certified key has at least one correct candidate")
    _check_keys(path, key_text, "provenance", entry["provenance"], PROVENANCE_FIELDS, PROVENANCE_OPTIONAL)
    for i, r in enumerate(entry["refused"]):
        _check_keys(path, key_text, f"refused[{i}]", r, {"config": dict, "status": str, "reason": str})
        check_config(path, key_text, f"refused[{i}].config", r["config"], spec)
        if r["status"] not in OUTCOMES[:-1]:
            raise invalid(path, key_text, f"refused[{i}].status", f"must be one of {OUTCOMES[:-1]}")
    cp = entry["certified_problems"]
    _check_type(path, key_text, "certified_problems", cp, dict)
    for role, problem in cp.items():  # {role: {field: int or word}}: nothing deeper is accepted, so nothing nests
        _check_type(path, key_text, f"certified_problems.{role}", problem, dict)
        for name, value in problem.items():
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise invalid(path, key_text, f"certified_problems.{role}.{name}", "must be an integer or a word")
    if dtype not in key.dtypes:
        raise invalid(path, key_text, None, f"file dtype '{dtype}' is not among the key's dtypes {list(key.dtypes)}")


def validate_doc(path, doc: Any, spec_lookup=None) -> CertFile:
    """Validate a parsed certificate document; `spec_lookup(name)` (optional) returns the kernel's spec or raises."""
    path = Path(path)
    m = _FILE_NAME.match(path.name)
    if not m:
        raise invalid(path, None, None, "file name must be <kernel>.<dtype>.json (lower-case, no path parts)")
    _check_keys(
        path, None, "", doc, {"schema_version": int, "kernel": str, "dtype": str, "profile": str, "entries": dict}
    )
    if doc["schema_version"] != SCHEMA_VERSION:
        raise invalid(path, None, "schema_version", f"{doc['schema_version']} is not the supported {SCHEMA_VERSION}")
    for field in ("kernel", "dtype"):
        if doc[field] != m.group(field):
            raise invalid(
                path,
                None,
                field,
                f"{doc[field]!r} is not the file name's {m.group(field)!r} (rename the file or fix the field)",
            )
    spec = spec_lookup(doc["kernel"]) if spec_lookup else None
    for key_text, entry in doc["entries"].items():
        validate_entry(path, key_text, entry, doc["kernel"], doc["dtype"], spec)
    return CertFile(path, doc["kernel"], doc["dtype"], doc["profile"], doc["entries"])


def _no_constant(name):
    raise ValueError(f"{name} is not valid JSON here")


def read_json(path: Path) -> Any:
    """Read a certificate file's JSON: size-capped, NaN/Infinity refused, duplicate keys refused, depth-limited.

    Only a regular file is read, and no more of it than its size: a directory or a FIFO named `*.json` raised
    IsADirectoryError or blocked for ever on the read (bugs found by tests/cli/test_fuzz.py and the reliability tests in
    tests/engine/), so the file is opened without blocking and checked (fstat) before a byte is read."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise invalid(path, None, None, f"cannot be read: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise invalid(path, None, None, "is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_FILE_BYTES:
            raise invalid(path, None, None, f"is {st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit")
        try:
            data = f.read(st.st_size + 1)  # one byte more tells a file that grew since the fstat
        except OSError as e:
            raise invalid(path, None, None, f"cannot be read: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise invalid(path, None, None, f"grew over the {MAX_FILE_BYTES}-byte limit while it was read")

    def pairs(items):
        d = dict(items)
        if len(d) < len(items):  # a field named twice: the first repeated name is reported
            seen: set = set()
            for k, _v in items:
                if k in seen:
                    raise ValueError(f"duplicate field '{k}'")
                seen.add(k)
        return d

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise invalid(path, None, None, f"is not valid JSON: {str(e)[:200]}") from None


def load_file(path: Path, spec_lookup=None) -> CertFile:
    return validate_doc(path, read_json(path), spec_lookup)


def iter_files(root: Path, profile_key: str | None = None) -> Iterator[Path]:
    """Certificate files under `root` (with `profile_key`: those of `root/<profile>/*.json` alone, the files `validate`
    reads for it: a copy in a folder below, `.old/` or another, was served), sorted; symlinks leaving `root`, and ones
    that lead nowhere or in a loop, refused."""
    root = Path(root)
    base = root / profile_key if profile_key else root
    if not files.is_dir(base):  # a profile directory that cannot be searched holds nothing to serve (`validate` says)
        return
    real_root = root.resolve()
    for path in sorted(base.glob("*.json") if profile_key else base.rglob("*.json")):
        try:
            resolved = path.resolve(strict=True)
        except (OSError, RuntimeError):  # a link to nothing (an editor's `.#name.json` lock) or a loop of links
            raise invalid(path, None, None, "is a link that cannot be resolved (remove it)") from None
        if real_root not in resolved.parents:
            raise invalid(path, None, None, "is a link that points outside the certificate directory")
        if resolved.is_dir():
            # a directory named `*.json` holds no certificate (`validate` walks into it); reading it as one failed
            # the whole index build (found by tests/engine/test_hostile_certificates.py)
            continue
        yield path


def profile_certificates(dirs: Sequence[Path], profile_key: str) -> Iterator[tuple[Path, CertFile]]:
    """Each certificate file of `profile_key` in `dirs` with its contents, in search order (directory, then path),
    each file validated whole; a file whose profile is not its directory's raises `CertificateInvalid`."""
    for d in dirs:
        for path in iter_files(Path(d), profile_key):
            cert = load_file(path)
            if cert.profile != profile_key:
                reason = f"'{cert.profile}' is not its directory's profile '{profile_key}'"
                raise invalid(path, None, "profile", reason)  # file, key, field, reason, as validate_doc
            yield path, cert


def first_entries(
    dirs: Sequence[Path], profile_key: str, memory_class: str | None = None
) -> dict[str, tuple[Path, CertFile, dict]]:
    """Every key certified for `profile_key` in `dirs` as serving's index takes it: {key: (file, its certificate,
    entry)}, the first directory holding the key (then the first file in path order) winning; the entry is the key's
    of `memory_class` (keys with none of that class left out), or with None its first class's (`own`). Every file is
    validated whole (`profile_certificates`)."""
    return first_entries_of(profile_certificates(dirs, profile_key), memory_class)


def first_entries_of(
    files: Iterable[tuple[Path, CertFile]], memory_class: str | None = None
) -> dict[str, tuple[Path, CertFile, dict]]:
    """`first_entries` of certificate files already read (`profile_certificates`'s, in its order): a reader that
    wants several classes' reads the files once."""
    chosen: dict[str, tuple[Path, CertFile, dict]] = {}
    for path, cert in files:
        for key_text, held in cert.entries.items():
            if key_text not in chosen:
                entry = own(held) if memory_class is None else of_class(held, memory_class)
                if entry is not None:
                    chosen[key_text] = (path, cert, entry)
    return chosen


# --- writing ----------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def locked(directory: Path):
    """An exclusive lock on a certificate directory, held across a read-modify-write of its files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _inside(root: Path, path: Path) -> Path:
    """`path`, refused when it (or a directory on its way) is a link leading out of `root`: certify read a file
    through such a link and wrote through a linked profile directory, outside the directory it was asked to write
    (bug found by tests/engine/test_write_paths.py::test_certify_writes_only_under_out)."""
    real_root, target = Path(root).resolve(), Path(path).resolve()
    if target != real_root and real_root not in target.parents:
        raise invalid(path, None, None, f"is a link that points outside the certificate directory {root}")
    return path


def _remove_stale_temps(path: Path) -> None:
    """Remove the temp files a writer of `path` killed mid-write left (SIGKILL skips atomic_write's cleanup). Called
    under the directory lock, which every writer of a certificate file holds, so none of them is live (found by
    tests/engine/test_concurrency.py::test_a_writer_killed_mid_write_leaves_no_temp_file_behind)."""
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def add_entry(root: Path, profile_key: str, kernel: str, dtype: str, key_text: str, entry: dict) -> Path:
    """Add one key's certification to its file (replacing the entry of its memory class, keeping the other classes'),
    under the directory lock, atomically."""
    directory = _inside(root, profile_dir(root, profile_key))
    path = directory / file_name(kernel, dtype)
    with locked(directory):
        _inside(root, path)
        _remove_stale_temps(path)
        if path.exists():
            doc = read_json(path)
            validate_doc(path, doc)
        else:
            doc = {"schema_version": SCHEMA_VERSION, "kernel": kernel, "dtype": dtype, "profile": profile_key}
            doc["entries"] = {}
        doc["entries"][key_text] = with_class(doc["entries"].get(key_text), entry)
        validate_doc(path, doc)
        atomic_write(path, dumps(doc))
    return path


def entry_text(key_text: str, entry: Mapping[str, Any]) -> str:
    """One entry as `dumps` writes it inside its document: `    "key": {...}` on one line, its fields sorted and
    written without spaces (NaN refused)."""
    body = json.dumps(entry, sort_keys=True, allow_nan=False, separators=(",", ":"))
    return "    " + json.dumps(key_text) + ": " + body


def dumps_from(doc: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    """`dumps(doc)`, byte for byte, from the texts of its entries (`entry_text`, one per key of doc["entries"]): the
    document's other fields serialised, its entries joined in key order."""
    text = _indented({k: v for k, v in doc.items() if k != "entries"} | {"entries": {}})
    body = "{\n" + ",\n".join(texts[k] for k in sorted(texts)) + "\n  }" if texts else "{}"
    return text.replace('"entries": {}', '"entries": ' + body, 1)


class Directory:
    """A certificate directory as one writer (`certify`) reads and writes it, key after key: each file is read,
    validated and serialised once, and again only when its status changes (another process wrote it: the shards of a
    run share a directory; every write replaces the file, so its inode changes); adding an entry validates that
    entry and serialises it alone. What it writes is what `add_entry` writes: the same bytes, under the same lock,
    atomically. On llama-3-8b's first 120 keys and the shipped hopper files (a 234-entry matmul file of 1.4 MB), on a
    2-core host: 1.9 ms of lookups (the key and four ahead) and 3.3 ms of writing a key, against 81.6 and 53.5 ms
    reading whole files (`benchmarks/bench_certificate_io.py`), a time the GPU waited between keys."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._files: dict[Path, tuple[tuple[int, int, int], dict, dict[str, str]]] = {}

    def _cached(self, path: Path) -> tuple[dict, dict[str, str]] | None:
        """(doc, entry texts) of `path` as it is now; None where there is no such file."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._files.pop(path, None)
            return None
        status = (st.st_ino, st.st_size, st.st_mtime_ns)
        held = self._files.get(path)
        if held is not None and held[0] == status:
            return held[1], held[2]
        doc = read_json(path)
        validate_doc(path, doc)
        texts = {k: entry_text(k, v) for k, v in doc["entries"].items()}
        self._files[path] = (status, doc, texts)
        return doc, texts

    def path_of(self, profile_key: str, kernel: str, dtype: str) -> Path:
        return _inside(self.root, profile_dir(self.root, profile_key) / file_name(kernel, dtype))

    def existing_entry(
        self, profile_key: str, kernel: str, dtype: str, key_text: str, memory_class: str | None = None
    ) -> dict | None:
        """The key's entry in its file (with `memory_class`, that class's; None where there is none)."""
        held = self._cached(self.path_of(profile_key, kernel, dtype))
        entry = None if held is None else held[0]["entries"].get(key_text)
        return entry if memory_class is None else of_class(entry, memory_class)

    def add_entry(self, profile_key: str, kernel: str, dtype: str, key_text: str, entry: dict) -> Path:
        """Add one key's certification to its file (replacing the entry of its memory class, keeping the other
        classes'), under the directory lock, atomically."""
        directory = _inside(self.root, profile_dir(self.root, profile_key))
        path = directory / file_name(kernel, dtype)
        with locked(directory):
            _inside(self.root, path)
            _remove_stale_temps(path)
            held = self._cached(path)
            if held is None:
                doc = {"schema_version": SCHEMA_VERSION, "kernel": kernel, "dtype": dtype, "profile": profile_key}
                held = (doc | {"entries": {}}, {})
                validate_doc(path, held[0])
            doc, texts = held
            entry = with_class(doc["entries"].get(key_text), entry)
            validate_entry(path, key_text, entry, kernel, dtype)
            text = entry_text(key_text, entry)
            doc = doc | {"entries": doc["entries"] | {key_text: entry}}
            texts = texts | {key_text: text}
            try:
                atomic_write(path, dumps_from(doc, texts))
            finally:
                self._files.pop(path, None)
            st = os.stat(path)
            self._files[path] = ((st.st_ino, st.st_size, st.st_mtime_ns), doc, texts)
        return path


def existing_entry(
    root: Path, profile_key: str, kernel: str, dtype: str, key_text: str, memory_class: str | None = None
) -> dict | None:
    path = _inside(root, profile_dir(root, profile_key) / file_name(kernel, dtype))
    if not path.exists():
        return None
    entry = load_file(path).entries.get(key_text)
    return entry if memory_class is None else of_class(entry, memory_class)
