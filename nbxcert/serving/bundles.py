"""Bundles: a profile's certified winners shipped compiled, so that a serving process loads them instead of compiling.

`nbxcert bundle` (`nbxcert.bundling`) compiles every certified winner of a profile for its GPU target (on any machine,
through the cross-compiling backend) and packs the binaries into one file. This module is the file format, its
reading, and where serving finds bundles. Nothing in a bundle is executed or imported but the GPU binaries its
manifest names, each handed out only after its SHA-256 is checked; there is no pickle, only lengths, canonical JSON
and bytes.

Layout (lengths are u64 little-endian)::

    0        8  magic b"NBXBNDL\\x01"
    8        8  manifest length M (at most MAX_MANIFEST_BYTES)
    16       M  the manifest, canonical JSON (sorted keys, compact separators, UTF-8: `canonical`)
    ...         each binary of the manifest's `binaries` in that order: its stored length, then its image compressed
                (zlib, level 9: a cubin compresses about fourfold)
    end-32  32  SHA-256 of every byte before it

The manifest::

    schema_version   1
    nbxcert_version  the nbxcert that built it
    triton_version   the Triton that compiled it: serving uses a bundle of its own Triton version only
    target           {backend, arch, warp_size}: what it was compiled for ("cuda", 90, 32)
    ptxas_version    the last line of `ptxas --version`, for the ptxas Triton ran for that target
    profile          the profile whose certificates it holds ("nvidia/hopper")
    keys             one per certified key, sorted by key text: {key, kernel, dtype (its certificate file's), config
                     (the certified winner), entry_digest (SHA-256 of the certificate entry's canonical JSON, by which
                     `nbxcert bundle --check` tells a changed certificate), launches: the kernel launches the key's
                     launches make, sorted, each {identity, source_key, specialization, binary (the SHA-256 of the
                     image it runs), record (the SHA-256 of its launch record)}}
    binaries         each distinct image once, sorted by SHA-256 (of the image itself): {sha256, size (the image's
                     bytes, at most MAX_BINARY_BYTES), stored (its compressed bytes in the file)}
    records          each distinct launch record once, sorted by SHA-256 (of its canonical JSON): {sha256, record}
                     (`binaries.describe`'s figures: what nbxcert's launcher needs). Apart from the images, because
                     one image can serve launches of different records: embedding's copy compiles to the same cubin for
                     a float16 and a bfloat16 table, whose parameter types differ

A launch is named as `nbxcert.kernels.backends.binaries` names it: the JIT function's module.qualname, Triton's hash of
its source, and Triton's specialization string of the launch's arguments. The same inputs give the same bytes: no
timestamp, no path, everything sorted.

`Bundle.open` checks the magic, every length against the file's size, the trailer, and the manifest: canonical form,
every field's type, no field unknown or missing, SHA-256s as 64 lower-case hex digits, keys and launches sorted and
unique, every binary and record a launch names present and each of them named, one binary and record per launch,
every record one that nbxcert's launcher takes. Anything else is refused with `BundleCorrupt`, naming the file and
what is wrong. A binary's bytes are read at its first lookup, from the file opened then, and their SHA-256 checked
against the manifest before they are handed out (then kept); a binary is inflated to at most its declared size, so a
hostile stream cannot grow past it.

Serving (`register`, called when serving reads its state on a GPU profile) reads the bundles of NBXCERT_BUNDLE_PATH
(os.pathsep-separated files, or directories whose `*.nbxbundle` files are read) and of each certificate directory of
its search path (`<dir>/<vendor>/<profile>/*.nbxbundle`), in that order; the first bundle holding a launch serves it.
A bundle built with another Triton or for another target is not used, with one notice; a corrupt one likewise. Under
NBXCERT_STRICT_PROVENANCE=1 either is refused (`ProvenanceMismatch`, `BundleCorrupt`). The lookup over the bundles
kept is registered with the kernel layer (`binaries.set_source`). With no bundle on the path nothing is registered and
nothing opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
import threading
import weakref
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nbxcert import files
from nbxcert.errors import BundleCorrupt, CertificateInvalid, KeyParseError, ProvenanceMismatch
from nbxcert.kernels.backends import binaries
from nbxcert.kernels.backends.binaries import KernelBinary
from nbxcert.serving.notices import say_once
from nbxcert.text import printable

MAGIC = b"NBXBNDL\x01"
SCHEMA_VERSION = 1
SUFFIX = ".nbxbundle"
MAX_MANIFEST_BYTES = 64 * 2**20
MAX_BINARY_BYTES = 64 * 2**20
ENV_PATH = "NBXCERT_BUNDLE_PATH"

_U64 = struct.Struct("<Q")
_HEAD = len(MAGIC) + _U64.size
_DIGEST = 32
_CHUNK = 2**20
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,1023}\Z")  # a kernel's symbol in its cubin (`cuModuleGetFunction`)

# the manifest's schema: field -> type, or a name of a check below ("sha256", "symbol", "count")
_TOP = {
    "schema_version": int,
    "nbxcert_version": str,
    "triton_version": str,
    "target": dict,
    "ptxas_version": str,
    "profile": str,
    "keys": list,
    "binaries": list,
    "records": list,
}
_TARGET = {"backend": str, "arch": (int, str), "warp_size": "count"}
_KEY = {"key": str, "kernel": str, "dtype": str, "config": dict, "entry_digest": "sha256", "launches": list}
_LAUNCH = {"identity": str, "source_key": str, "specialization": str, "binary": "sha256", "record": "sha256"}
_BINARY = {"sha256": "sha256", "size": "count", "stored": "count"}
_RECORD_ENTRY = {"sha256": "sha256", "record": dict}
_RECORD = {
    "name": "symbol",
    "num_warps": "count",
    "num_ctas": "count",
    "shared": "count",
    "global_scratch_size": "count",
    "global_scratch_align": "count",
    "profile_scratch_size": "count",
    "launch_cooperative_grid": bool,
    "launch_pdl": bool,
    "signature": list,
    "tensordesc_meta": (list, type(None)),
}
_KIND_NAMES = {
    "sha256": "a SHA-256 (64 lower-case hex digits)",
    "symbol": "a kernel symbol",
    "count": "an integer >= 0",
}


def canonical(doc: Any) -> bytes:
    """The one serialisation of a manifest (and of a certificate entry, for its digest): sorted keys, compact
    separators, UTF-8, NaN refused."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def record_digest(record: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a launch record's canonical JSON: its name in a bundle's manifest."""
    return hashlib.sha256(canonical(record)).hexdigest()


def entry_digest(entry: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a certificate entry's canonical JSON: a bundle records it for each key it holds."""
    return hashlib.sha256(canonical(entry)).hexdigest()


def target_text(target: Mapping[str, Any]) -> str:
    """A target as people write it: "cuda sm_90", "hip gfx942"."""
    arch = target.get("arch")
    return (
        f"{target.get('backend')} sm_{arch}" if target.get("backend") == "cuda" else f"{target.get('backend')} {arch}"
    )


# --- writing ----------------------------------------------------------------------------------------------------------
def serialize(manifest: Mapping[str, Any], images: Mapping[str, bytes]) -> bytes:
    """A bundle's bytes: `manifest` (checked as a reader checks it) and the image of each of its binaries, from
    `images` (SHA-256 hex -> bytes)."""
    where = "the bundle being written"
    stored: list[bytes] = []
    binaries_named = []
    for b in manifest["binaries"]:
        image = images[b["sha256"]]
        if len(image) != b["size"] or hashlib.sha256(image).hexdigest() != b["sha256"]:
            raise BundleCorrupt(f"{where}: the image given for binary {b['sha256'][:16]} is not the one named")
        stored.append(zlib.compress(image, 9))
        binaries_named.append({**b, "stored": len(stored[-1])})
    text = canonical({**manifest, "binaries": binaries_named})
    if len(text) > MAX_MANIFEST_BYTES:
        raise BundleCorrupt(
            f"{where}: its manifest would be {len(text)} bytes, over the {MAX_MANIFEST_BYTES}-byte limit"
        )
    check_manifest(json.loads(text), where)
    parts = [MAGIC, _U64.pack(len(text)), text]
    for data in stored:
        parts += [_U64.pack(len(data)), data]
    body = b"".join(parts)
    return body + hashlib.sha256(body).digest()


# --- the manifest's schema --------------------------------------------------------------------------------------------
def _refused(path: Any, what: str) -> BundleCorrupt:
    return BundleCorrupt(f"bundle {printable(path)}: {what}")


def _check_fields(where: Any, field: str, obj: Any, schema: Mapping[str, Any]) -> None:
    """`obj` is a JSON object with exactly `schema`'s fields, each of its kind."""
    if not isinstance(obj, dict):
        raise _refused(where, f"manifest field '{field or '(top)'}' is {type(obj).__name__}, not an object")
    for name in obj:
        if name not in schema:
            raise _refused(where, f"manifest field '{_join(field, name)}' is not a field of a bundle manifest")
    for name, kind in schema.items():
        if name not in obj:
            raise _refused(where, f"manifest field '{_join(field, name)}' is missing")
        value = obj[name]
        if not _is(value, kind):
            shown = _KIND_NAMES.get(kind) if isinstance(kind, str) else _kind_name(kind)
            raise _refused(where, f"manifest field '{_join(field, name)}' must be {shown}, not {_brief(value)}")


def _join(field: str, name: str) -> str:
    return f"{field}.{name}" if field else name


def _is(value: Any, kind: Any) -> bool:
    if kind == "sha256":
        return isinstance(value, str) and _SHA256.match(value) is not None
    if kind == "symbol":
        return isinstance(value, str) and _SYMBOL.match(value) is not None
    if kind == "count":
        return type(value) is int and 0 <= value < 2**63
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if int in kinds and isinstance(value, bool) and bool not in kinds:
        return False
    return isinstance(value, kinds)


def _kind_name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "true or false"}
    return " or ".join(names.get(k, "null") for k in kinds)


def _brief(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_record(where: Any, field: str, record: Any) -> None:
    _check_fields(where, field, record, _RECORD)
    if not 1 <= record["num_warps"] <= 64 or not 1 <= record["num_ctas"] <= 16:
        raise _refused(where, f"manifest field '{field}': {record['num_warps']} warps, {record['num_ctas']} CTAs")
    for i, param in enumerate(record["signature"]):
        if not (isinstance(param, list) and len(param) == 2 and all(isinstance(p, str) for p in param)):
            raise _refused(where, f"manifest field '{field}.signature[{i}]' must be [name, type]")
    try:  # a parameter type nbxcert's launcher does not take is refused here, not at a launch
        binaries.param_codes([tuple(p) for p in record["signature"]], record["tensordesc_meta"])
    except (binaries.BinaryUnusable, TypeError, IndexError, KeyError) as e:
        raise _refused(where, f"manifest field '{field}': a launch record nbxcert cannot launch ({e})") from None


def _sorted_once(where: Any, field: str, entries: list, schema: Mapping[str, Any]) -> None:
    """`entries` are objects of `schema`, sorted by their `sha256`, each once."""
    previous = ""
    for i, x in enumerate(entries):
        _check_fields(where, f"{field}[{i}]", x, schema)
        if x["sha256"] <= previous:
            raise _refused(where, f"manifest field '{field}[{i}].sha256': {field} are not sorted by SHA-256, each once")
        previous = x["sha256"]


def check_manifest(doc: Any, where: Any) -> dict[tuple[str, str, str], tuple[str, str]]:
    """Check a parsed manifest (the module doc's rules; `BundleCorrupt` naming `where` and the field); returns each
    launch's binary and record: {(identity, source_key, specialization): (image SHA-256, record SHA-256)}."""
    from nbxcert.certificates import check_config
    from nbxcert.keys import parse_key

    _check_fields(where, "", doc, _TOP)
    if doc["schema_version"] != SCHEMA_VERSION:
        raise _refused(
            where, f"schema_version {doc['schema_version']} is not {SCHEMA_VERSION} (a bundle of another nbxcert)"
        )
    _check_fields(where, "target", doc["target"], _TARGET)
    _sorted_once(where, "binaries", doc["binaries"], _BINARY)
    for i, b in enumerate(doc["binaries"]):
        for name in ("size", "stored"):
            if b[name] > MAX_BINARY_BYTES:
                field = f"binaries[{i}].{name}"
                raise _refused(where, f"manifest field '{field}': {b[name]} bytes, over the {MAX_BINARY_BYTES} limit")
    _sorted_once(where, "records", doc["records"], _RECORD_ENTRY)
    for i, r in enumerate(doc["records"]):
        _check_record(where, f"records[{i}].record", r["record"])
        if record_digest(r["record"]) != r["sha256"]:
            raise _refused(where, f"manifest field 'records[{i}].sha256' is not the SHA-256 of its record")
    images = {b["sha256"] for b in doc["binaries"]}
    records = {r["sha256"] for r in doc["records"]}
    table: dict[tuple[str, str, str], tuple[str, str]] = {}
    previous_key = None
    for i, k in enumerate(doc["keys"]):
        field = f"keys[{i}]"
        _check_fields(where, field, k, _KEY)
        try:
            key = parse_key(k["key"])
        except KeyParseError as e:
            raise _refused(where, f"manifest field '{field}.key': {e.message}") from None
        if key.text() != k["key"] or key.kernel != k["kernel"]:
            raise _refused(where, f"manifest field '{field}.key': not the canonical key of kernel {k['kernel']}")
        if previous_key is not None and k["key"] <= previous_key:
            raise _refused(where, f"manifest field '{field}.key': keys are not sorted, each once")
        previous_key = k["key"]
        try:
            check_config(where, k["key"], f"{field}.config", k["config"])
        except CertificateInvalid as e:
            raise _refused(where, f"manifest field '{field}.config': {e.reason}") from None
        before = None
        for j, launch in enumerate(k["launches"]):
            at = f"{field}.launches[{j}]"
            _check_fields(where, at, launch, _LAUNCH)
            name = (launch["identity"], launch["source_key"], launch["specialization"])
            if before is not None and name <= before:
                raise _refused(where, f"manifest field '{at}': a key's launches are not sorted, each once")
            before = name
            if launch["binary"] not in images:
                raise _refused(where, f"manifest field '{at}.binary': no binary {launch['binary'][:16]} in the bundle")
            if launch["record"] not in records:
                raise _refused(where, f"manifest field '{at}.record': no record {launch['record'][:16]} in the bundle")
            runs = (launch["binary"], launch["record"])
            if table.setdefault(name, runs) != runs:
                raise _refused(where, f"manifest field '{at}': the launch is given two binaries or records")
    named = {"binary": {b for b, _ in table.values()}, "record": {r for _, r in table.values()}}
    for what, present in (("binary", images), ("record", records)):
        unused = sorted(present - named[what])
        if unused:
            raise _refused(where, f"{what} {unused[0][:16]} is named by no launch of the manifest")
    return table


def _pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for k, v in items:
        if k in found:
            raise ValueError(f"duplicate field '{k}'")
        found[k] = v
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON here")


def parse_manifest(raw: bytes, where: Any) -> dict[str, Any]:
    """A manifest's bytes parsed: UTF-8 JSON in canonical form, no duplicate field, no NaN, bounded depth."""
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _refused(where, f"manifest is not valid JSON: {str(e)[:200]}") from None
    try:
        again = canonical(doc)
    except (ValueError, TypeError, RecursionError):
        again = b""
    if again != raw:
        raise _refused(where, "manifest is not in canonical form (sorted keys, compact separators, UTF-8)")
    return doc


# --- reading ----------------------------------------------------------------------------------------------------------
def _pread(where: Any, fd: int, size: int, offset: int) -> bytes:
    try:
        data = os.pread(fd, size, offset)
    except OSError as e:
        raise _refused(where, f"cannot be read: {e.strerror}") from None
    if len(data) != size:
        raise _refused(where, f"ended at byte {offset + len(data)} while it was read (it shrank)")
    return data


class Bundle:
    """One bundle file, opened and checked (`open`); its binaries read at their first `lookup`."""

    def __init__(
        self,
        path: Path,
        fd: int,
        size: int,
        manifest: dict[str, Any],
        table: dict[tuple[str, str, str], tuple[str, str]],
        sections: dict[str, tuple[int, int]],
    ):
        self.path = path
        self.size = size
        self.manifest = manifest
        self._fd = fd
        self._table = table
        self._sections = sections
        self._sizes = {b["sha256"]: b["size"] for b in manifest["binaries"]}
        self._records = {r["sha256"]: r["record"] for r in manifest["records"]}
        self._images: dict[str, bytes] = {}
        self._found: dict[tuple[str, str, str], KernelBinary] = {}
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, os.close, fd)

    @property
    def triton_version(self) -> str:
        return self.manifest["triton_version"]

    @property
    def target(self) -> dict[str, Any]:
        return self.manifest["target"]

    @property
    def profile(self) -> str:
        return self.manifest["profile"]

    @property
    def keys(self) -> list[dict[str, Any]]:
        return self.manifest["keys"]

    @property
    def launches(self) -> int:
        """How many distinct launches it serves."""
        return len(self._table)

    @property
    def binaries(self) -> int:
        return len(self._sections)

    @classmethod
    def open(cls, path: Path | str) -> Bundle:
        """Open and check a bundle file (see the module doc); `BundleCorrupt` naming it and what is wrong. Only a
        regular file is read, and never more than it holds."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (OSError, ValueError) as e:
            raise _refused(path, f"cannot be read: {getattr(e, 'strerror', None) or e}") from None
        try:
            return cls._read(path, fd)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _read(cls, path: Path, fd: int) -> Bundle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(path, "is not a regular file")
        size = st.st_size
        if size < _HEAD + _DIGEST:
            raise _refused(path, f"is {size} bytes, shorter than any bundle ({_HEAD + _DIGEST})")
        head = _pread(path, fd, _HEAD, 0)
        if head[: len(MAGIC)] != MAGIC:
            raise _refused(
                path, "does not start with the bundle magic NBXBNDL (format 1): not a bundle of this nbxcert"
            )
        (length,) = _U64.unpack_from(head, len(MAGIC))
        end = size - _DIGEST
        if length > MAX_MANIFEST_BYTES:
            raise _refused(path, f"declares a manifest of {length} bytes, over the {MAX_MANIFEST_BYTES}-byte limit")
        if _HEAD + length > end:
            raise _refused(path, f"declares a manifest of {length} bytes, past the end of its {size} bytes")
        digest, at = hashlib.sha256(), 0
        while at < end:
            chunk = _pread(path, fd, min(_CHUNK, end - at), at)
            digest.update(chunk)
            at += len(chunk)
        if digest.digest() != _pread(path, fd, _DIGEST, end):
            raise _refused(path, "fails its SHA-256 trailer: the file is damaged, or was changed after it was written")
        manifest = parse_manifest(_pread(path, fd, length, _HEAD), path)
        table = check_manifest(manifest, path)
        sections: dict[str, tuple[int, int]] = {}
        at = _HEAD + length
        count = len(manifest["binaries"])
        for i, b in enumerate(manifest["binaries"]):
            name = f"binary {i} ({b['sha256'][:16]})"
            if at + _U64.size > end:
                raise _refused(path, f"ends before {name}, of the {count} its manifest names")
            (n,) = _U64.unpack(_pread(path, fd, _U64.size, at))
            if n > MAX_BINARY_BYTES:
                raise _refused(path, f"{name} declares {n} bytes, over the {MAX_BINARY_BYTES}-byte limit")
            if n != b["stored"]:
                raise _refused(path, f"{name} is {n} bytes; its manifest entry says {b['stored']}")
            if at + _U64.size + n > end:
                raise _refused(path, f"{name} runs past the end of the file")
            sections[b["sha256"]] = (at + _U64.size, n)
            at += _U64.size + n
        if at != end:
            raise _refused(path, f"holds {end - at} bytes after its last binary")
        return cls(path, fd, size, manifest, table, sections)

    def image(self, sha256: str) -> bytes:
        """The bytes of one binary, read once and checked against its SHA-256 (`BundleCorrupt` when they differ: the
        file changed after it was opened)."""
        with self._lock:
            found = self._images.get(sha256)
            if found is not None:
                return found
            if not self._closer.alive:
                raise _refused(self.path, "was closed")
            offset, stored = self._sections[sha256]
            size = self._sizes[sha256]
            inflate = zlib.decompressobj()
            try:
                data = inflate.decompress(_pread(self.path, self._fd, stored, offset), size + 1)
            except zlib.error as e:
                raise _refused(self.path, f"binary {sha256[:16]} is not a zlib stream ({e})") from e
            if len(data) != size or not inflate.eof:
                raise _refused(self.path, f"binary {sha256[:16]} does not inflate to its {size} bytes")
            if hashlib.sha256(data).hexdigest() != sha256:
                raise _refused(self.path, f"binary {sha256[:16]} does not match its SHA-256 (the file was changed)")
            self._images[sha256] = data
            return data

    def lookup(self, identity: str, source_key: str, specialization: str) -> KernelBinary | None:
        """The compiled kernel of one launch (as `binaries.set_source` asks), or None when the bundle has none."""
        name = (identity, source_key, specialization)
        found = self._found.get(name)
        if found is not None:
            return found
        runs = self._table.get(name)
        if runs is None:
            return None
        image, record = runs
        found = KernelBinary(identity, source_key, specialization, self.image(image), self._records[record])
        self._found[name] = found
        return found

    def verify(self) -> None:
        """Read and check every binary now (`nbxcert bundle --check`), not at its first lookup."""
        for sha in self._sections:
            self.image(sha)

    def close(self) -> None:
        self._closer()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- serving ----------------------------------------------------------------------------------------------------------
def bundle_files(profile_key: str, dirs: Sequence[Path], other_classes: Sequence[str] = ()) -> list[Path]:
    """The bundle files serving reads for `profile_key`, in order: NBXCERT_BUNDLE_PATH's (a file as named, a
    directory's `*.nbxbundle` files sorted), then `<dir>/<profile_key>/*.nbxbundle` of each certificate directory.
    A directory's `<name>.<class>.nbxbundle` of a class in `other_classes` (another card's winners,
    `nbxcert bundle --memory-class`) is left unopened: its binaries serve no key of this card's class."""

    def listed(directory: Path) -> list[Path]:
        return sorted(p for p in directory.glob(f"*{SUFFIX}") if named_class(p.name, other_classes) is None)

    found: list[Path] = []
    for part in os.environ.get(ENV_PATH, "").split(os.pathsep):
        if not part.strip():
            continue
        p = Path(part)
        why = files.unreachable(p)
        if why:  # a directory on its way that cannot be searched: the OS cannot say whether it is there
            say_once(
                f"[nbxcert] notice: {ENV_PATH} names {printable(p)}, which cannot be reached ({why}); it is skipped"
            )
        elif p.is_dir():
            found += listed(p)
        elif p.exists():
            found.append(p)
        else:
            say_once(f"[nbxcert] notice: {ENV_PATH} names {printable(p)}, which is not there; it is skipped")
    for d in dirs:
        base = Path(d) / profile_key
        if files.is_dir(base):  # one that cannot be reached is skipped as the certificate index skips it
            found += listed(base)
    unique: dict[str, Path] = {}
    for p in found:
        unique.setdefault(os.path.realpath(p), p)
    return list(unique.values())


def named_class(name: str, classes: Sequence[str]) -> str | None:
    """The memory class a bundle's file name names, `<name>.<class>.nbxbundle`, where it is one of `classes` (as
    `nbxcert bundle --memory-class` has it named: serving opens it on a card of that class only); else None."""
    stem = name.removesuffix(SUFFIX)
    cls = stem.rpartition(".")[2] if "." in stem else None
    return cls if cls in classes else None


def rebuild_command(
    profile_name: str, path: Path | str, dirs: Sequence[Path | str] = (), memory_class: str | None = None
) -> str:
    """The `nbxcert bundle` command that builds `path` again: its class's winners where it names one (the file name's
    class unless `memory_class` is given), the keys and launches left to the user (`...`: those it was built for)."""
    from nbxcert.memory_class import classes_of
    from nbxcert.profiles import get_profile

    cls = memory_class or named_class(Path(path).name, classes_of(get_profile(profile_name)))
    where = " ".join(f"--dir {printable(d)}" for d in dirs) or "--dir DIR"
    return (
        f"nbxcert bundle --profile {profile_name} {where}"
        + (f" --memory-class {cls}" if cls else "")
        + f" ... --out {printable(path)}"
    )


def mismatch(bundle: Bundle, profile, triton_version: str) -> str:
    """What makes `bundle` unusable for `profile` under this Triton ("" when nothing does)."""
    import contextlib

    from nbxcert.errors import DeviceFactMissing

    own = {"backend": profile.backend, "arch": profile.target_arch, "warp_size": 32}
    with contextlib.suppress(DeviceFactMissing):
        own["warp_size"] = int(profile.fact("warp_size"))
    differences = []
    if bundle.triton_version != triton_version:
        differences.append(f"built with Triton {bundle.triton_version}, and this process runs Triton {triton_version}")
    if {k: bundle.target.get(k) for k in own} != own:
        differences.append(
            f"compiled for {target_text(bundle.target)} (warp {bundle.target.get('warp_size')}), and {profile.key} "
            f"runs {target_text(own)}"
        )
    return "; ".join(differences)


class BundleSource:
    """The lookup serving registers with the kernel layer (`binaries.set_source`): the bundles in use, the first
    holding a launch serving it. A bundle found corrupt at a lookup (changed on disk since it was opened) is dropped
    with a notice and the launch compiles as usual; under NBXCERT_STRICT_PROVENANCE=1 the error stands."""

    def __init__(self, bundles: Sequence[Bundle], strict: bool):
        self.bundles = list(bundles)
        self.strict = strict

    def __call__(self, identity: str, source_key: str, specialization: str) -> KernelBinary | None:
        for bundle in self.bundles:
            try:
                found = bundle.lookup(identity, source_key, specialization)
            except BundleCorrupt as e:
                if self.strict:
                    raise
                say_once(f"[nbxcert] notice: {e.message}; it is no longer used (its kernels compile as usual)")
                self.bundles = [b for b in self.bundles if b is not bundle]
                continue
            if found is not None:
                return found
        return None

    @property
    def keys(self) -> int:
        return len({k["key"] for b in self.bundles for k in b.keys})

    @property
    def launches(self) -> int:
        return sum(b.launches for b in self.bundles)


_registered: BundleSource | None = None


def register(profile, dirs: Sequence[Path], strict: bool, memory_class: str | None = None) -> BundleSource | None:
    """Open the bundles serving reads for `profile` (`bundle_files`; with this card's `memory_class`, not those named
    for the profile's other classes), drop the unusable ones (another Triton, another target, corrupt: one notice
    each, or the error under `strict`), and register a lookup over the rest with the kernel layer. Returns it, or None
    (and registers nothing) when no bundle is usable or the profile compiles nothing."""
    global _registered
    unregister()
    if profile.backend != "cuda" or profile.target_arch is None:
        return None  # nbxcert's launcher runs CUDA binaries only
    from nbxcert.memory_class import classes_of

    others = [c for c in classes_of(profile) if memory_class is not None and c != memory_class]
    files = bundle_files(profile.key, dirs, others)
    if not files:
        return None
    import triton

    kept: list[Bundle] = []
    for path in files:
        try:
            bundle = Bundle.open(path)
        except BundleCorrupt as e:
            if strict:
                raise
            say_once(
                f"[nbxcert] notice: {e.message}; it is not used (its kernels compile as usual; "
                "NBXCERT_STRICT_PROVENANCE=1 refuses it)"
            )
            continue
        why = mismatch(bundle, profile, triton.__version__)
        if not why:
            kept.append(bundle)
            continue
        bundle.close()
        rebuild = rebuild_command(profile.name, path, dirs)
        if strict:
            raise ProvenanceMismatch(
                f"bundle {printable(path)} was {why}; NBXCERT_STRICT_PROVENANCE=1 refuses it",
                hint=f"rebuild it here (`{rebuild}`), take it off the search path, or unset NBXCERT_STRICT_PROVENANCE",
            )
        say_once(
            f"[nbxcert] notice: bundle {printable(path)} was {why}; it is not used, its kernels compile as usual "
            f"(rebuild it: `{rebuild}`; NBXCERT_STRICT_PROVENANCE=1 refuses it)"
        )
    if not kept:
        return None
    source = _registered = BundleSource(kept, strict)
    binaries.set_source(source)
    where = ", ".join(printable(b.path) for b in kept)
    say_once(f"[nbxcert] compiled winners: {source.launches} launches of {source.keys} certified keys from {where}")
    return source


def unregister() -> None:
    """Take back the lookup `register` gave the kernel layer (a lookup registered by anyone else stays)."""
    global _registered
    if _registered is not None and binaries.source() is _registered:
        binaries.set_source(None)
    _registered = None
