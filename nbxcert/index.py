"""The compiled binary index that serving reads: one per (profile, memory class), built from the JSON certificates.

The JSON certificates stay the source of truth. An index is named by the fingerprint of every byte its build read
(`fingerprint()`), so a changed certificate directory names a different index and the first lookup after the change
validates the JSON (`certificates.load_file`) and writes a new one into the cache directory; every later process only
hashes the JSON's bytes, opens the index with mmap, binary-searches its sorted keys and parses one certification's
JSON when that key is asked. Nothing in an index is executed or imported: no pickle, only lengths, offsets, UTF-8 keys
and canonical JSON. Hashing the JSON costs about 0.75 ms per MiB read (24 ms for the benchmark's 10,000 entries,
32.5 MiB), against 270 ms to json.load the same files.

Layout (integers little-endian; offsets are from the start of the file)::

    0     8   magic b"NBXIDX\\0\\1"
    8     4   format version (FORMAT_VERSION)
    12    4   certificate schema version (certificates.SCHEMA_VERSION)
    16    8   entry count N
    24    8   keys_off       start of the sorted keys
    32    8   table_off      start of the offsets table
    40    8   certs_off      start of the certifications
    48    8   trailer_off    file length - 32
    56    32  the source fingerprint (raw SHA-256, `fingerprint()`)
    88    8   zero
    96    32  spine digest: SHA-256 of bytes [0, 96) + [128, certs_off) (header, meta, keys, table)
    128       meta: u16 length + profile key, u16 length + memory class (UTF-8)
    keys_off  N keys, sorted by their UTF-8 bytes: u32 length + key text
    table_off N rows of u64 key offset + u64 certification offset (row i is key i)
    certs_off N certifications: u32 length + SHA-256 of the JSON + the entry's canonical JSON
              (json.dumps(entry, sort_keys=True, separators=(",", ":")))
    trailer_off  SHA-256 of every byte before it

Verification, and why it is layered. SHA-256 runs at about 0.5 ms per MB here (with the CPU's SHA extensions),
and a 10,000-entry index is 12-25 MB: `benchmarks/bench_serve.py` (10,000 entries, 18 MiB) measured open + first get
at 10.6 ms with the whole-file trailer checked, over the 10 ms cold-open budget on its own, and 0.7 ms without it.
So `open()` always checks the magic, versions, lengths, offsets and the spine digest (header, keys and offsets
table: under 1 MB for 10,000 keys), and checks the whole-file trailer too unless a sidecar (`<index>.verified`)
records that this very file (device, inode, size, mtime_ns, ctime_ns and trailer bytes) passed that check before.
Every certification carries its own SHA-256, checked before its JSON is parsed, so no entry is ever served from
corrupt bytes, even when the sidecar is stale or lies (bit rot under an unchanged file). Any write through the
filesystem moves ctime, so a flipped byte, a truncation or a forged trailer meets the full check at the next open
(and `load_index` rebuilds). A sidecar is only written for a file whose timestamps are older than `SETTLE_NS`:
timestamps are coarse, and a file written again within the same tick would otherwise keep its stamp. The sidecar
is a cache of a check, never trusted for more than skipping it: a missing, torn or unwritable one means the full
check runs. This is integrity, not authenticity: whoever can write the cache can write a valid index.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import stat
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nbxcert import certificates
from nbxcert.errors import CertificateInvalid, IndexCorrupt, UsageError
from nbxcert.files import atomic_write

MAGIC = b"NBXIDX\x00\x01"
FORMAT_VERSION = 1
SUFFIX = ".nbxidx"
SIDECAR_SUFFIX = ".verified"
SETTLE_NS = 2_000_000_000  # a file younger than this is checked in full on every open (timestamps are coarse)
KEEP_PER_PROFILE = 4  # older indexes of one (profile, memory class) are removed from the cache after a build
MAX_CACHED_MISSES = 4096  # misses are cached too (serving asks the same keys), but never without bound

_HEADER = struct.Struct("<8sIIQQQQQ32s8x")  # the 96 bytes the spine digest covers, before the digest itself
_SPINE_AT = _HEADER.size
_META_AT = _SPINE_AT + 32
_ROW = struct.Struct("<QQ")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_DIGEST = 32
_REC = _U32.size + _DIGEST  # a certification's length and digest, before its JSON
_SAFE_NAME = certificates.SAFE_NAME
_UNSET = object()


# --- where indexes live -----------------------------------------------------------------------------------------------
def _default_cache_dir() -> Path:
    env = os.environ.get("NBXCERT_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"  # the XDG spec ignores relative paths
    return base / "nbxcert"


def cache_dir() -> Path:
    """Where compiled indexes are written: NBXCERT_CACHE_DIR, else $XDG_CACHE_HOME/nbxcert, else ~/.cache/nbxcert."""
    return _default_cache_dir()


def _prefix(profile_key: str, memory_class: str) -> str:
    name = profile_key.replace("/", "_")
    for what, value in (("profile", name), ("memory class", memory_class)):
        if not _SAFE_NAME.match(value):
            raise UsageError(
                f"{what} '{value}' cannot name an index file (letters, digits, '.', '_', '-' only)",
                hint="name a profile that `nbxcert profiles` lists",
            )
    return f"{name}.{memory_class}"


def index_path(cache: Path, profile_key: str, memory_class: str, fingerprint_hex: str) -> Path:
    """`<cache>/<profile with / as _>.<memory_class>.<fingerprint[:32]>.nbxidx`."""
    return Path(cache) / f"{_prefix(profile_key, memory_class)}.{fingerprint_hex[:32]}{SUFFIX}"


# --- fingerprint and compilation --------------------------------------------------------------------------------------
def _read_bytes(path: Path) -> bytes:
    # opened without blocking and checked before reading: a FIFO named `*.json` in a certificate directory blocked
    # the fingerprint (and so every process that serves) for ever (found by tests/engine/, the hostile
    # `fifo` case)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise certificates.invalid(path, None, None, f"cannot be read: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise certificates.invalid(path, None, None, "is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > certificates.MAX_FILE_BYTES:
            raise certificates.invalid(
                path, None, None, f"is {st.st_size} bytes, over the {certificates.MAX_FILE_BYTES}-byte limit"
            )
        return f.read(st.st_size + 1)


def fingerprint(dirs: list[Path], profile_key: str, memo: _DigestMemo | None = None) -> str:
    """SHA-256 (hex) of everything an index build for `profile_key` reads: each certificate file's path (relative to
    its directory) and the SHA-256 of its bytes, in search-path order, with the schema and index format versions.
    Hashes bytes only; nothing is parsed. A file's digest is taken from `memo` when its stat (device, inode, size,
    mtime_ns, ctime_ns) is the one it was hashed at: any write moves ctime, so a changed file is always re-read."""
    memo = memo if memo is not None else _DigestMemo.default()
    h = hashlib.sha256(
        f"nbxcert index {FORMAT_VERSION} schema {certificates.SCHEMA_VERSION} profile {profile_key}\n".encode()
    )
    for i, d in enumerate(dirs):
        d = Path(d)
        h.update(f"dir {i}\n".encode())  # the order decides which certification wins; the location does not
        for path in certificates.iter_files(d, profile_key):
            rel = path.relative_to(d).as_posix().encode()
            h.update(_U64.pack(len(rel)) + rel + memo.digest(path))
    memo.save()
    return h.hexdigest()


def _hex64(text) -> bool:
    return isinstance(text, str) and re.fullmatch(r"[0-9a-f]{64}", text) is not None


class _DigestMemo:
    """SHA-256 digests of certificate files by their stat, kept in `<cache>/digests.json` so that a process start
    hashes only the files that changed (hashing all of 10,000 entries' JSON costs ~24 ms; a stat costs microseconds).
    A missing, torn or unwritable memo only means files are hashed again."""

    def __init__(self, path: Path | None):
        self.path = path
        self.table: dict[str, list] = {}
        self.dirty = False
        if path is not None:
            try:
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict):
                    self.table = loaded
            except (OSError, ValueError):
                pass  # no memo yet, or a torn one: every file is hashed

    @staticmethod
    def default() -> _DigestMemo:
        return _DigestMemo(_default_cache_dir() / "digests.json")

    def digest(self, path: Path) -> bytes:
        st = os.stat(path)
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        key = str(Path(path).resolve())
        hit = self.table.get(key)
        settled = time.time_ns() - st.st_ctime_ns > SETTLE_NS
        # a damaged memo (not 64 hex digits) is a miss: the file is hashed again
        if isinstance(hit, list) and len(hit) == 2 and hit[0] == stamp and settled and _hex64(hit[1]):
            return bytes.fromhex(hit[1])
        digest = hashlib.sha256(_read_bytes(path)).digest()
        self.table[key] = [stamp, digest.hex()]
        self.dirty = True
        return digest

    def save(self) -> None:
        if not self.dirty or self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps(self.table, sort_keys=True))
            self.dirty = False
        except OSError:
            pass  # an unwritable cache costs a re-hash next time, nothing else


# Certificate fields that serving never reads, left out of the index (they stay in the JSON for review)
AUDIT_ONLY = ("finalists",)


def _collect(dirs: list[Path], profile_key: str, memory_class: str) -> dict[str, bytes]:
    """Every certification of the memory class as canonical JSON bytes; the first directory (then the first file in
    path order) wins a key. Every file is validated whole, other memory classes included, or nothing is returned."""
    chosen: dict[str, bytes] = {}
    for key_text, (_path, _cert, entry) in certificates.first_entries(dirs, profile_key, memory_class).items():
        served = {k: v for k, v in entry.items() if k not in AUDIT_ONLY}
        chosen[key_text] = json.dumps(served, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return chosen


def _serialize(entries: dict[str, bytes], profile_key: str, memory_class: str, fingerprint_hex: str) -> bytes:
    items = sorted((k.encode(), v) for k, v in entries.items())
    meta = b"".join(_U16.pack(len(s)) + s for s in (profile_key.encode(), memory_class.encode()))
    keys_off = _META_AT + len(meta)
    keys, certs, rows = bytearray(), bytearray(), bytearray()
    table_off = keys_off + sum(_U32.size + len(k) for k, _ in items)
    certs_off = table_off + _ROW.size * len(items)
    for k, v in items:
        rows += _ROW.pack(keys_off + len(keys), certs_off + len(certs))
        keys += _U32.pack(len(k)) + k
        certs += _U32.pack(len(v)) + hashlib.sha256(v).digest() + v
    trailer_off = certs_off + len(certs)
    header = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        certificates.SCHEMA_VERSION,
        len(items),
        keys_off,
        table_off,
        certs_off,
        trailer_off,
        bytes.fromhex(fingerprint_hex),
    )
    spine = hashlib.sha256(header + meta + keys + rows).digest()
    body = b"".join((header, spine, meta, keys, rows, certs))
    return body + hashlib.sha256(body).digest()


def _compile(
    dirs: list[Path], profile_key: str, memory_class: str, attempts: int = 3, taken: str | None = None
) -> tuple[bytes, str]:
    """The index's bytes and the fingerprint of what they were built from. The fingerprint is taken before and after
    the JSON is read, so an index never carries the name of bytes it was not built from (a certify run writing
    meanwhile makes it try again); `taken`: the fingerprint the caller has just taken, the first attempt's before."""
    for _ in range(attempts):
        before = taken if taken is not None else fingerprint(dirs, profile_key)
        taken = None
        entries = _collect(dirs, profile_key, memory_class)
        if fingerprint(dirs, profile_key) == before:
            return _serialize(entries, profile_key, memory_class, before), before
    where = ", ".join(str(d) for d in dirs)
    raise CertificateInvalid(f"{where}: certificate files kept changing while the index was built", hint="try again")


# --- the index --------------------------------------------------------------------------------------------------------
class CertifiedIndex:
    """A compiled index, opened read-only (mmap) and verified. `get` returns a shared dict: do not modify it."""

    path: Path
    fingerprint: str
    profile_key: str
    memory_class: str

    def __init__(self, path: Path, buf, size: int):
        """Check the header, lengths and offsets of `buf` (an mmap or bytes); `IndexCorrupt` naming `path`."""
        self.path = Path(path)
        self._buf = buf
        self._size = size
        self._cache: dict[str, Any] = {}
        self._misses = 0
        try:
            self._read_header()
        except (struct.error, ValueError, IndexError, OverflowError) as e:
            raise self._corrupt(f"malformed header ({e})") from None

    def _corrupt(self, reason: str) -> IndexCorrupt:
        return IndexCorrupt(f"{self.path}: {reason}")

    def _read_header(self) -> None:
        buf, size = self._buf, self._size
        if size < _META_AT + 2 * _U16.size + _DIGEST:
            raise self._corrupt(f"{size} bytes, shorter than an index's header and trailer (truncated)")
        magic, fmt, schema, count, keys_off, table_off, certs_off, trailer_off, fp = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise self._corrupt(f"wrong magic {magic!r} (not an nbxcert index)")
        if fmt != FORMAT_VERSION:
            raise self._corrupt(f"index format {fmt}, this nbxcert reads format {FORMAT_VERSION}")
        if schema != certificates.SCHEMA_VERSION:
            raise self._corrupt(f"built for certificate schema {schema}, not {certificates.SCHEMA_VERSION}")
        if trailer_off + _DIGEST != size:
            raise self._corrupt(f"length {size} bytes, the header says {trailer_off + _DIGEST} (truncated or extended)")
        if not (_META_AT <= keys_off <= table_off <= certs_off <= trailer_off):
            raise self._corrupt("section offsets out of order")
        if certs_off - table_off != _ROW.size * count or table_off - keys_off < _U32.size * count:
            raise self._corrupt(f"offsets table does not hold {count} entries")
        self._count, self._keys_off, self._table_off = count, keys_off, table_off
        self._certs_off, self._trailer_off = certs_off, trailer_off
        self.fingerprint = fp.hex()

    def _check_trailer(self) -> None:
        stored = bytes(self._buf[self._trailer_off : self._size])
        with memoryview(self._buf) as view:  # released at once: a live view would keep the mmap from closing
            actual = hashlib.sha256(view[: self._trailer_off]).digest()
        if actual != stored:
            # in full: a damaged trailer's first 16 digits are often the content's own, and read "X..., says X..."
            raise self._corrupt(
                f"trailer mismatch (SHA-256 of the content is {actual.hex()}, the trailer says {stored.hex()})"
            )

    def _check_spine(self) -> None:
        h = hashlib.sha256(self._buf[:_SPINE_AT])
        with memoryview(self._buf) as view:
            h.update(view[_META_AT : self._certs_off])
        if h.digest() != self._buf[_SPINE_AT:_META_AT]:
            raise self._corrupt("spine digest mismatch (header, keys or offsets table damaged)")
        try:
            at = _META_AT
            names = []
            for _ in range(2):
                (n,) = _U16.unpack_from(self._buf, at)
                names.append(bytes(self._buf[at + 2 : at + 2 + n]).decode())
                at += 2 + n
        except (struct.error, UnicodeDecodeError) as e:
            raise self._corrupt(f"malformed meta ({e})") from None
        if at != self._keys_off:
            raise self._corrupt("meta does not end where the keys start")
        self.profile_key, self.memory_class = names

    # --- the sidecar that spares the whole-file hash on later opens of an unchanged file ---
    def _stamp(self, st: os.stat_result) -> str:
        trailer = bytes(self._buf[self._trailer_off : self._size]).hex()
        fields = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        dev, ino, size, mtime, ctime = fields
        return f"nbxidx verified dev={dev} ino={ino} size={size} mtime_ns={mtime} ctime_ns={ctime} trailer={trailer}\n"

    def _sidecar(self) -> Path:
        return self.path.with_name(self.path.name + SIDECAR_SUFFIX)

    def _verified_before(self, st: os.stat_result) -> bool:
        try:
            return self._sidecar().read_text(encoding="ascii") == self._stamp(st)
        except (OSError, UnicodeDecodeError):
            return False

    def _record_verified(self, st: os.stat_result) -> None:
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < SETTLE_NS:
            return
        side = self._sidecar()
        tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):  # a read-only cache only means the full check runs on every open
            tmp.write_text(self._stamp(st), encoding="ascii")
            os.replace(tmp, side)
        with contextlib.suppress(OSError):
            tmp.unlink()

    # --- opening and building ---
    @staticmethod
    def open(path: Path) -> CertifiedIndex:
        """Map and verify an index (module docstring: what is checked when); `IndexCorrupt` naming the file."""
        path = Path(path)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size == 0:
                raise IndexCorrupt(f"{path}: empty file (truncated)")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            index = CertifiedIndex(path, buf, st.st_size)
            if not index._verified_before(st):
                index._check_trailer()
                index._record_verified(st)
            index._check_spine()
            return index
        except BaseException:
            buf.close()
            raise

    @staticmethod
    def _from_bytes(path: Path, data: bytes) -> CertifiedIndex:
        index = CertifiedIndex(path, data, len(data))
        index._check_trailer()
        index._check_spine()
        return index

    @staticmethod
    def build(dirs: list[Path], profile_key: str, memory_class: str, out_path: Path) -> CertifiedIndex:
        """Validate the JSON certificates of `profile_key` in `dirs` (first directory wins a key), keep the entries of
        `memory_class`, write the index to `out_path` atomically and open it. `CertificateInvalid` writes nothing."""
        data, _ = _compile([Path(d) for d in dirs], profile_key, memory_class)
        atomic_write(Path(out_path), data, make_parents=True)
        return CertifiedIndex.open(out_path)

    def verify(self) -> None:
        """Check everything now: the whole-file trailer, the spine, the keys' order and every certification's
        digest."""
        self._check_trailer()
        self._check_spine()
        previous = None
        for i in range(self._count):
            key = bytes(self._key_at(i))
            # lookups binary-search the keys: out of order (a forged spine), a listed key would not be found, so a
            # verified index could not serve every key it lists (found by tests/cli/test_fuzz.py::test_index)
            if previous is not None and key <= previous:
                raise self._corrupt(f"keys out of order at key {i}")
            previous = key
            self._certification(i)

    # --- lookups ---
    def _key_at(self, i: int) -> bytes:
        ko = _U64.unpack_from(self._buf, self._table_off + _ROW.size * i)[0]
        # Bounds are checked even though the spine digest vouches for the offsets: a forged spine (anyone who can
        # write the cache can recompute it) must end in IndexCorrupt, never in struct.error or a read of the wrong
        # section (bug found by tests/cli/test_fuzz.py::test_index: an offset past the end raised struct.error).
        if not self._keys_off <= ko <= self._table_off - _U32.size:
            raise self._corrupt(f"key {i} lies outside the keys")
        (n,) = _U32.unpack_from(self._buf, ko)
        if ko + _U32.size + n > self._table_off:
            raise self._corrupt(f"key {i} runs past the end of the keys")
        return self._buf[ko + 4 : ko + 4 + n]

    def _find(self, key: bytes) -> int:
        lo, hi = 0, self._count
        while lo < hi:
            mid = (lo + hi) >> 1
            k = self._key_at(mid)
            if k < key:
                lo = mid + 1
            elif k > key:
                hi = mid
            else:
                return mid
        return -1

    def _certification(self, i: int) -> dict:
        co = _ROW.unpack_from(self._buf, self._table_off + _ROW.size * i)[1]
        if not self._certs_off <= co <= self._trailer_off - _REC:
            raise self._corrupt(f"certification {i} lies outside the certifications")
        (n,) = _U32.unpack_from(self._buf, co)
        end = co + _REC + n
        if end > self._trailer_off:
            raise self._corrupt(f"certification {i} runs past the end of the certifications")
        body = self._buf[co + _REC : end]
        if hashlib.sha256(body).digest() != self._buf[co + 4 : co + _REC]:
            raise self._corrupt(f"certification of key {self._key_at(i).decode(errors='replace')} fails its SHA-256")
        try:
            entry = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise self._corrupt(f"certification {i} is not JSON ({e})") from None
        if not isinstance(entry, dict):
            raise self._corrupt(f"certification {i} is not an object")
        return entry

    def _lookup(self, key_text: str) -> dict | None:
        i = self._find(key_text.encode())
        if i >= 0:
            entry = self._cache[key_text] = self._certification(i)
            return entry
        if self._misses < MAX_CACHED_MISSES:
            self._misses += 1
            self._cache[key_text] = None
        return None

    def get(self, key_text: str) -> dict | None:
        """The certification of a key (parsed on first ask, then cached), or None when the index has none."""
        try:
            return self._cache[key_text]
        except KeyError:
            return self._lookup(key_text)

    def __contains__(self, key_text: object) -> bool:
        if not isinstance(key_text, str):
            return False
        cached = self._cache.get(key_text, _UNSET)
        if cached is not _UNSET:
            return cached is not None
        return self._find(key_text.encode()) >= 0

    def __len__(self) -> int:
        return self._count

    def keys(self) -> Iterator[str]:
        """Every key, in sorted order (of their UTF-8 bytes)."""
        for i in range(self._count):
            try:
                yield self._key_at(i).decode()
            except UnicodeDecodeError:  # a forged spine again (tests/cli/test_fuzz.py::test_index found it)
                raise self._corrupt(f"key {i} is not UTF-8") from None

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()

    def __enter__(self) -> CertifiedIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CertifiedIndex({str(self.path)!r}, {self._count} entries, {self.profile_key} {self.memory_class})"


# --- the serving entry point ------------------------------------------------------------------------------------------
def _prune(cache: Path, keep: Path, prefix: str) -> None:
    """Remove all but the newest KEEP_PER_PROFILE indexes of one (profile, memory class); a process that has one
    mapped keeps reading it (POSIX unlink), and one that looks for it rebuilds it."""
    with contextlib.suppress(OSError):
        found = sorted(cache.glob(f"{prefix}.*{SUFFIX}"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in [p for p in found if p != keep][KEEP_PER_PROFILE - 1 :]:
            for p in (old, old.with_name(old.name + SIDECAR_SUFFIX)):
                with contextlib.suppress(OSError):
                    p.unlink()


def load_index(
    dirs: list[Path],
    profile_key: str,
    memory_class: str,
    cache_dir: Path | None = None,
    notices: list[str] | None = None,
) -> CertifiedIndex:
    """The index for (profile, memory class) over the search path `dirs` (first directory wins a key): the cached one
    named by the JSON's fingerprint, or one built now when it is missing or corrupt (a corrupt one adds one line to
    `notices`). An invalid certificate raises `CertificateInvalid` and writes nothing."""
    dirs = [Path(d) for d in dirs]
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    prefix = _prefix(profile_key, memory_class)
    expected = fingerprint(dirs, profile_key)
    path = index_path(cache, profile_key, memory_class, expected)
    problem = None
    try:
        index = CertifiedIndex.open(path)
    except OSError:
        pass  # missing (or unreadable): built below, nothing to tell
    except IndexCorrupt as e:
        problem = str(e)
    else:
        if (index.fingerprint, index.profile_key, index.memory_class) == (expected, profile_key, memory_class):
            return index
        problem = (
            f"{path}: built for {index.profile_key} {index.memory_class} from {index.fingerprint[:32]}, not its name"
        )
        index.close()
    data, built_from = _compile(dirs, profile_key, memory_class, taken=expected)
    path = index_path(cache, profile_key, memory_class, built_from)
    if problem is not None and notices is not None:
        notices.append(f"{problem}; rebuilt it from the JSON certificates")
    try:
        atomic_write(path, data, make_parents=True)
    except OSError as e:
        if notices is not None:
            notices.append(f"cannot write the index cache {cache} ({e.strerror}); serving from memory")
        return CertifiedIndex._from_bytes(path, data)
    _prune(cache, path, prefix)
    return CertifiedIndex.open(path)
