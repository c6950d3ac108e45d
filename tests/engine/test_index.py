"""The compiled index: built from JSON certificates, looked up by key, named by the JSON's fingerprint, refused by
name when corrupt (any flipped byte, truncation, wrong magic, forged trailer) and rebuilt with one notice; an invalid
certificate is refused by name and writes nothing. No GPU: the certificates are written by `fixtures/certs.py`."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from nbxcert import certificates, index
from nbxcert.errors import CertificateInvalid, IndexCorrupt, UsageError
from nbxcert.index import CertifiedIndex, fingerprint, load_index

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import certs  # noqa: E402

PROFILE = certs.PROFILE


@pytest.fixture()
def root(tmp_path) -> Path:
    """One certificate directory: three 80GB float16 keys, one 141GB key, one float32 file."""
    r = tmp_path / "certs"
    entries = {certs.key(n_cols=c): certs.entry(block=c) for c in (256, 512, 1024)}
    entries[certs.key(n_cols=4096)] = certs.entry(memory_class="141GB", block=4096)
    certs.write_file(r, entries)
    certs.write_file(r, {certs.key(n_cols=256, dtype="float32"): certs.entry(block=32)}, dtype="float32")
    return r


def built(root: Path, tmp_path: Path, memory_class: str = "80GB") -> CertifiedIndex:
    return CertifiedIndex.build([root], PROFILE, memory_class, tmp_path / "out" / "x.nbxidx")


def cached(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.nbxidx")) if cache.exists() else []


# --- building and looking up ------------------------------------------------------------------------------------------
def test_build_then_every_key_is_found_with_its_entry_and_a_missing_key_is_none(root, tmp_path):
    idx = built(root, tmp_path)
    want = {certs.key(n_cols=c): certs.entry(block=c) for c in (256, 512, 1024)}
    want[certs.key(n_cols=256, dtype="float32")] = certs.entry(block=32)
    assert len(idx) == 4
    assert list(idx.keys()) == sorted(want, key=str.encode)
    for k, entry in want.items():
        assert k in idx
        assert idx.get(k) == entry
        assert idx.get(k) is idx.get(k)  # parsed once, then cached
    for missing in (certs.key(n_cols=8192), "", "rmsnorm", "zzz"):
        assert idx.get(missing) is None
        assert missing not in idx
    assert 3 not in idx
    assert idx.fingerprint == fingerprint([root], PROFILE)
    assert (idx.profile_key, idx.memory_class, idx.path) == (PROFILE, "80GB", tmp_path / "out" / "x.nbxidx")
    idx.verify()


def test_certifications_are_stored_as_canonical_json(root, tmp_path):
    idx = built(root, tmp_path)
    raw = idx.path.read_bytes()
    canonical = json.dumps(certs.entry(block=512), sort_keys=True, separators=(",", ":")).encode()
    assert raw[:8] == index.MAGIC
    assert canonical in raw
    assert hashlib.sha256(raw[:-32]).digest() == raw[-32:]


def test_first_directory_in_the_search_path_wins_a_key(tmp_path):
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    certs.write_file(user, {certs.key(n_cols=512): certs.entry(block=64)})
    certs.write_file(shipped, {certs.key(n_cols=512): certs.entry(block=512), certs.key(n_cols=1024): certs.entry()})
    idx = CertifiedIndex.build([user, shipped], PROFILE, "80GB", tmp_path / "a.nbxidx")
    assert idx.get(certs.key(n_cols=512))["winner"]["config"]["kwargs"]["BLOCK"] == 64
    assert certs.key(n_cols=1024) in idx  # keys only the later directory has are still served
    idx = CertifiedIndex.build([shipped, user], PROFILE, "80GB", tmp_path / "b.nbxidx")
    assert idx.get(certs.key(n_cols=512))["winner"]["config"]["kwargs"]["BLOCK"] == 512
    assert fingerprint([user, shipped], PROFILE) != fingerprint([shipped, user], PROFILE)


def test_an_index_holds_only_its_memory_class(root, tmp_path):
    big = built(root, tmp_path, "141GB")
    assert list(big.keys()) == [certs.key(n_cols=4096)]
    assert certs.key(n_cols=512) not in big
    assert certs.key(n_cols=4096) not in built(root, tmp_path, "80GB")
    empty = built(root, tmp_path, "40GB")
    assert len(empty) == 0 and empty.get(certs.key(n_cols=512)) is None and list(empty.keys()) == []


def test_a_directory_without_the_profile_builds_an_empty_index(tmp_path):
    idx = CertifiedIndex.build([tmp_path / "nothing-here"], PROFILE, "80GB", tmp_path / "e.nbxidx")
    assert len(idx) == 0


# --- fingerprint, cache, rebuild on change ----------------------------------------------------------------------------
def test_fingerprint_hashes_bytes_without_parsing_them(root, tmp_path):
    before = fingerprint([root], PROFILE)
    assert fingerprint([root], PROFILE) == before
    path = root / PROFILE / "rmsnorm.float16.json"
    path.write_bytes(path.read_bytes() + b" ")  # a byte that changes nothing a parser sees still changes the name
    assert fingerprint([root], PROFILE) != before
    path.write_text("{ not json")
    fingerprint([root], PROFILE)  # no parse, no refusal: that is the build's job
    with pytest.raises(CertificateInvalid, match="not valid JSON"):
        built(root, tmp_path)


def test_fingerprint_covers_relative_paths_and_search_path_positions(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    certs.write_file(a, {certs.key(): certs.entry()})
    assert fingerprint([a], PROFILE) != fingerprint([b, a], PROFILE)  # the position decides who wins a key
    c = tmp_path / "c"
    certs.write_file(c, {certs.key(): certs.entry()})
    assert fingerprint([a], PROFILE) == fingerprint([c], PROFILE)  # where the directory is does not matter
    (c / PROFILE / "rmsnorm.float16.json").rename(c / PROFILE / "rmsnorm.float32.json")
    assert fingerprint([a], PROFILE) != fingerprint([c], PROFILE)


def test_load_index_names_the_index_by_the_fingerprint_and_reuses_it_without_parsing(root, tmp_path, monkeypatch):
    cache, notices = tmp_path / "cache", []
    idx = load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices)
    fp = fingerprint([root], PROFILE)
    assert idx.path == cache / f"nvidia_hopper.80GB.{fp[:32]}.nbxidx"
    assert cached(cache) == [idx.path]

    def no_parse(*a, **k):
        raise AssertionError("a cached index must be served without parsing the JSON")

    monkeypatch.setattr(certificates, "load_file", no_parse)
    again = load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices)
    assert again.path == idx.path and again.get(certs.key(n_cols=512)) == certs.entry(block=512)
    assert notices == []


def test_a_changed_certificate_directory_gets_a_new_index_on_the_next_lookup(root, tmp_path):
    cache, notices = tmp_path / "cache", []
    old = load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices)
    certs.write_file(root, {certs.key(n_cols=512): certs.entry(block=2048)})  # replaces the float16 file
    new = load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices)
    assert new.fingerprint != old.fingerprint and new.path != old.path
    assert new.get(certs.key(n_cols=512))["winner"]["config"]["kwargs"]["BLOCK"] == 2048
    assert certs.key(n_cols=1024) not in new
    assert notices == []  # a change is not a corruption: nothing to tell


def test_old_indexes_of_a_profile_are_pruned_from_the_cache(root, tmp_path):
    cache = tmp_path / "cache"
    for block in (16, 32, 64, 128, 256, 512, 1024):
        certs.write_file(root, {certs.key(): certs.entry(block=block)})
        idx = load_index([root], PROFILE, "80GB", cache_dir=cache)
    assert idx.path in cached(cache) and len(cached(cache)) <= index.KEEP_PER_PROFILE


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "mine"))
    assert index.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("NBXCERT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert index.cache_dir() == tmp_path / "xdg" / "nbxcert"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert index.cache_dir() == tmp_path / "home" / ".cache" / "nbxcert"


def test_a_name_that_cannot_be_a_file_name_is_refused(root, tmp_path):
    with pytest.raises(UsageError, match="memory class '../x'"):
        load_index([root], PROFILE, "../x", cache_dir=tmp_path / "cache")


def test_an_unwritable_cache_serves_from_memory_and_says_so(root, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    notices: list[str] = []
    idx = load_index([root], PROFILE, "80GB", cache_dir=blocker / "cache", notices=notices)
    assert idx.get(certs.key(n_cols=512)) == certs.entry(block=512)
    assert len(notices) == 1 and "serving from memory" in notices[0]


# --- corruption -------------------------------------------------------------------------------------------------------
def refused(path: Path, data: bytes) -> IndexCorrupt:
    """Write `data` as the index at `path` and open it (and read every entry): the IndexCorrupt raised."""
    path.write_bytes(data)
    with pytest.raises(IndexCorrupt) as e:
        idx = CertifiedIndex.open(path)
        for k in list(idx.keys()):
            idx.get(k)
    assert str(e.value).startswith(f"{path}: ")
    return e.value


def test_a_flipped_bit_anywhere_is_refused_when_opened(root, tmp_path):
    good = built(root, tmp_path).path.read_bytes()
    target = tmp_path / "flip.nbxidx"
    for at in range(len(good)):
        bad = bytearray(good)
        bad[at] ^= 0x01
        target.write_bytes(bytes(bad))
        with pytest.raises(IndexCorrupt) as e:
            CertifiedIndex.open(target)  # no sidecar: the whole file is checked before anything is served
        assert str(e.value).startswith(f"{target}: "), at


def test_every_truncation_is_refused(root, tmp_path):
    good = built(root, tmp_path).path.read_bytes()
    for n in range(len(good)):
        refused(tmp_path / "short.nbxidx", good[:n])
    assert "truncated" in str(refused(tmp_path / "short.nbxidx", good[:-1]))
    assert "extended" in str(refused(tmp_path / "long.nbxidx", good + b"\0"))


def test_wrong_magic_and_other_files_are_refused(root, tmp_path):
    good = built(root, tmp_path).path.read_bytes()
    assert "wrong magic" in str(refused(tmp_path / "m.nbxidx", b"NOTANIDX" + good[8:]))
    assert "wrong magic" in str(refused(tmp_path / "j.nbxidx", (root / PROFILE / "rmsnorm.float16.json").read_bytes()))
    assert "index format 2" in str(refused(tmp_path / "v.nbxidx", good[:8] + (2).to_bytes(4, "little") + good[12:]))


def test_a_forged_trailer_is_refused(root, tmp_path):
    good = built(root, tmp_path).path.read_bytes()
    assert "trailer mismatch" in str(refused(tmp_path / "t.nbxidx", good[:-32] + hashlib.sha256(b"forged").digest()))


def test_a_trailer_mismatch_names_both_digests_whole(root, tmp_path):
    # bug: the message gave the first 16 hex digits of each ("the content is eb0cc5cbdaaeb69e..., the trailer says
    # eb0cc5cbdaaeb69e..."): a trailer damaged past them read as equal to the content's digest
    good = built(root, tmp_path).path.read_bytes()
    bad = good[:-1] + bytes([good[-1] ^ 0x01])
    message = str(refused(tmp_path / "t.nbxidx", bad))
    assert f"the content is {hashlib.sha256(good[:-32]).hexdigest()}, the trailer says {bad[-32:].hex()}" in message


def test_changed_content_under_a_recomputed_trailer_is_still_refused_before_it_is_served(root, tmp_path):
    idx = built(root, tmp_path)
    good = idx.path.read_bytes()
    body = json.dumps(certs.entry(block=512), sort_keys=True, separators=(",", ":")).encode()
    at = good.index(body) + body.index(b'"BLOCK":512') + len(b'"BLOCK":')
    bad = bytearray(good[:-32])
    bad[at : at + 3] = b"999"  # the certification says another config; its own SHA-256 does not agree
    path = tmp_path / "forged.nbxidx"
    path.write_bytes(bytes(bad) + hashlib.sha256(bad).digest())
    forged = CertifiedIndex.open(path)
    assert forged.get(certs.key(n_cols=256)) == certs.entry(block=256)
    with pytest.raises(IndexCorrupt, match="fails its SHA-256"):
        forged.get(certs.key(n_cols=512))
    key_at = good.index(certs.key(n_cols=512).encode())
    bad = bytearray(good[:-32])
    bad[key_at + 14] ^= 0x01  # a key served as another: the spine digest covers keys and offsets
    path.write_bytes(bytes(bad) + hashlib.sha256(bad).digest())
    with pytest.raises(IndexCorrupt, match="spine digest"):
        CertifiedIndex.open(path)


def test_the_sidecar_spares_the_full_check_only_for_the_same_unchanged_file(root, tmp_path, monkeypatch):
    monkeypatch.setattr(index, "SETTLE_NS", 0)
    path = built(root, tmp_path).path
    side = path.with_name(path.name + ".verified")
    assert side.exists()
    calls = []
    check = CertifiedIndex._check_trailer
    monkeypatch.setattr(CertifiedIndex, "_check_trailer", lambda self: calls.append(1) or check(self))
    CertifiedIndex.open(path)
    assert calls == []
    good = path.read_bytes()
    path.write_bytes(good[:-32] + hashlib.sha256(b"forged").digest())  # a write moves ctime: checked again
    with pytest.raises(IndexCorrupt, match="trailer mismatch"):
        CertifiedIndex.open(path)
    assert calls == [1]


def test_a_lying_sidecar_still_serves_no_corrupt_entry(root, tmp_path, monkeypatch):
    # bit rot under an unchanged stat looks like this: the sidecar matches, the bytes do not
    monkeypatch.setattr(index, "SETTLE_NS", 0)
    path = built(root, tmp_path).path
    data = bytearray(path.read_bytes())
    body = json.dumps(certs.entry(block=512), sort_keys=True, separators=(",", ":")).encode()
    data[data.index(body) + 20] ^= 0x01
    path.write_bytes(bytes(data))
    probe = CertifiedIndex(path, bytes(data), len(data))
    side = path.with_name(path.name + ".verified")
    side.write_text(probe._stamp(os.stat(path)), encoding="ascii")
    idx = CertifiedIndex.open(path)
    assert idx.get(certs.key(n_cols=256)) == certs.entry(block=256)
    with pytest.raises(IndexCorrupt, match="fails its SHA-256"):
        idx.get(certs.key(n_cols=512))
    with pytest.raises(IndexCorrupt):
        idx.verify()


def test_load_index_rebuilds_a_corrupt_index_and_says_so_once(root, tmp_path):
    cache, notices = tmp_path / "cache", []
    path = load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices).path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    idx = load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices)
    assert idx.path == path and idx.get(certs.key(n_cols=512)) == certs.entry(block=512)
    idx.verify()
    assert len(notices) == 1
    assert notices[0].startswith(f"{path}: ") and "rebuilt it from the JSON certificates" in notices[0]
    load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices)
    assert len(notices) == 1


def test_load_index_rebuilds_an_index_whose_header_names_other_sources(root, tmp_path):
    cache, notices = tmp_path / "cache", []
    other = tmp_path / "other"
    certs.write_file(other, {certs.key(n_cols=64): certs.entry(block=64)})
    right = load_index([root], PROFILE, "80GB", cache_dir=cache).path
    wrong = load_index([other], PROFILE, "80GB", cache_dir=cache).path
    os.replace(wrong, right)  # a whole, valid index under another fingerprint's name
    idx = load_index([root], PROFILE, "80GB", cache_dir=cache, notices=notices)
    assert certs.key(n_cols=512) in idx and certs.key(n_cols=64) not in idx
    assert len(notices) == 1 and "not its name" in notices[0]


# --- invalid certificates ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("seed", None, "expected an integer"),
        ("memory_class", 80, "expected str"),
        ("counts", {"correct": 0}, "missing"),
        ("winner", {"config": certs.config(num_warps=3), "timing": certs.timing()}, "not a power of two"),
    ],
)
def test_an_invalid_certificate_is_refused_by_name_and_no_index_is_written(root, tmp_path, field, value, reason):
    bad = certs.entry(memory_class="141GB")  # another memory class's entry still refuses the whole directory
    bad[field] = value
    bad_key = certs.key(n_cols=8192)
    path = certs.write_file(root, {certs.key(n_cols=512): certs.entry(), bad_key: bad})
    cache = tmp_path / "cache"
    with pytest.raises(CertificateInvalid) as e:
        load_index([root], PROFILE, "80GB", cache_dir=cache)
    assert str(e.value).startswith(f"{path}: key {bad_key}: field '{field}") and reason in str(e.value)
    assert cached(cache) == []
    out = tmp_path / "out.nbxidx"
    with pytest.raises(CertificateInvalid):
        CertifiedIndex.build([root], PROFILE, "80GB", out)
    assert not out.exists()


def test_a_certificate_for_another_profile_is_refused_by_name(tmp_path):
    r = tmp_path / "certs"
    path = certs.write_file(r, {certs.key(): certs.entry()})
    doc = json.loads(path.read_text())
    doc["profile"] = "nvidia/ampere"
    path.write_text(certificates.dumps(doc))
    with pytest.raises(CertificateInvalid, match="field 'profile': 'nvidia/ampere' is not its directory's profile"):
        load_index([r], PROFILE, "80GB", cache_dir=tmp_path / "cache")
    assert cached(tmp_path / "cache") == []


# --- nothing in an index is executed ----------------------------------------------------------------------------------
def test_the_index_module_never_pickles_or_executes():
    tree = ast.parse(Path(index.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported & {"pickle", "_pickle", "marshal", "shelve", "dill", "importlib", "runpy"} == set()
    called = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert called & {"eval", "exec", "compile", "__import__", "pickle", "marshal"} == set()
