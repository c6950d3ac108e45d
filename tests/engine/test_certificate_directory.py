"""`certificates.Directory`, the writer certify keeps for its out directory: `dumps` of the whole document, byte for
byte, from one serialised entry a write (what `add_entry` writes re-serialising the whole file); files read again
when another process wrote them, nothing lost beside other writers (`add_entry`'s among them), and a failed write
leaving nothing believed that is not on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reliabilitytools import entries, run_writers

from nbxcert import certificates
from nbxcert.errors import CertificateInvalid

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "cpu/interpreter"


def test_entry_texts_rebuild_every_shipped_file_byte_for_byte():
    shipped = [p for p in certificates.iter_files(ROOT / "certificates")]
    assert len(shipped) >= 20
    for path in shipped:
        doc = json.loads(path.read_text())
        texts = {k: certificates.entry_text(k, v) for k, v in doc["entries"].items()}
        assert certificates.dumps_from(doc, texts) == certificates.dumps(doc) == path.read_text(), path
    empty = {"schema_version": 1, "kernel": "k", "dtype": "float16", "profile": PROFILE, "entries": {}}
    assert certificates.dumps_from(empty, {}) == certificates.dumps(empty)


def test_the_directory_writes_the_documents_one_serialisation(tmp_path, certs):
    written = certificates.Directory(tmp_path)
    expected = {"schema_version": 1, "kernel": "fault_probe", "dtype": "float32", "profile": PROFILE, "entries": {}}
    for n in (5, 3, 9, 3):  # the last replaces an entry
        entry = certs.probe_entry(n, median_us=1000.0 + n)
        written.add_entry(PROFILE, "fault_probe", "float32", certs.probe_key(n), entry)
        expected["entries"][certs.probe_key(n)] = entry
    assert (tmp_path / PROFILE / "fault_probe.float32.json").read_text() == certificates.dumps(expected)
    replaced = written.existing_entry(PROFILE, "fault_probe", "float32", certs.probe_key(3))
    assert replaced["winner"]["timing"]["median_us"] == 1003
    assert written.existing_entry(PROFILE, "fault_probe", "float32", certs.probe_key(4)) is None
    assert written.existing_entry(PROFILE, "other", "float32", certs.probe_key(4)) is None


def test_another_writers_entries_are_read_again_and_kept(tmp_path, certs):
    written = certificates.Directory(tmp_path)
    written.add_entry(PROFILE, "fault_probe", "float32", certs.probe_key(1), certs.probe_entry(1))
    # another process (a shard of the same run) adds a key between two of this writer's
    certificates.add_entry(tmp_path, PROFILE, "fault_probe", "float32", certs.probe_key(2), certs.probe_entry(2))
    assert written.existing_entry(PROFILE, "fault_probe", "float32", certs.probe_key(2)) is not None
    written.add_entry(PROFILE, "fault_probe", "float32", certs.probe_key(3), certs.probe_entry(3))
    assert sorted(entries(tmp_path)) == sorted(certs.probe_key(n) for n in (1, 2, 3))


def test_an_invalid_entry_is_refused_and_nothing_is_kept(tmp_path, certs):
    written = certificates.Directory(tmp_path)
    written.add_entry(PROFILE, "fault_probe", "float32", certs.probe_key(1), certs.probe_entry(1))
    with pytest.raises(CertificateInvalid, match="key"):
        written.add_entry(PROFILE, "fault_probe", "float32", "fault_probe[n=2;float16]@v1", certs.probe_entry(2))
    assert sorted(entries(tmp_path)) == [certs.probe_key(1)]
    assert written.existing_entry(PROFILE, "fault_probe", "float32", "fault_probe[n=2;float16]@v1") is None


def test_a_failed_write_leaves_the_file_and_the_writer_as_they_were(tmp_path, certs, monkeypatch):
    written = certificates.Directory(tmp_path)
    written.add_entry(PROFILE, "fault_probe", "float32", certs.probe_key(1), certs.probe_entry(1))

    def full(path, data, make_parents=False):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(certificates, "atomic_write", full)
    with pytest.raises(OSError):
        written.add_entry(PROFILE, "fault_probe", "float32", certs.probe_key(2), certs.probe_entry(2))
    monkeypatch.undo()
    assert written.existing_entry(PROFILE, "fault_probe", "float32", certs.probe_key(2)) is None
    assert sorted(entries(tmp_path)) == [certs.probe_key(1)]


_WRITER = """
import sys
import certs
from nbxcert import certificates

root, who = sys.argv[1], int(sys.argv[2])
written = certificates.Directory(root) if who % 2 else None
for i in range(40):
    n = 1000 * (who + 1) + i
    key, entry = certs.probe_key(n), certs.probe_entry(n)
    if written is None:
        certificates.add_entry(root, "cpu/interpreter", "fault_probe", "float32", key, entry)
    else:
        written.add_entry("cpu/interpreter", "fault_probe", "float32", key, entry)
"""


def test_four_processes_two_through_a_directory_lose_no_entry(tmp_path):
    run_writers(_WRITER, tmp_path)
    found = entries(tmp_path)
    assert len(found) == 160 and len(set(found.values())) == 1


def _of(entry, cls):
    return dict(entry, memory_class=cls)


@pytest.mark.parametrize("writer", ["directory", "add_entry"])
def test_a_key_keeps_one_entry_a_memory_class(tmp_path, certs, writer):
    """Entries of one key made on cards of two memory classes are kept side by side (the first class's holds the
    others, `other_classes`), each replaced only by its own class; both writers write the same bytes."""
    key = certs.probe_key(1)
    written = certificates.Directory(tmp_path)

    def add(entry):
        if writer == "directory":
            written.add_entry(PROFILE, "fault_probe", "float32", key, entry)
        else:
            certificates.add_entry(tmp_path, PROFILE, "fault_probe", "float32", key, entry)

    h200, h100 = (
        _of(certs.probe_entry(1, median_us=1000.0), "141GB"),
        _of(certs.probe_entry(1, median_us=900.0), "80GB"),
    )
    add(h200)
    add(h100)
    held = certificates.load_file(tmp_path / PROFILE / "fault_probe.float32.json").entries[key]
    assert certificates.class_entries(held) == {"141GB": h200, "80GB": h100}
    assert certificates.of_class(held, "80GB") == h100 and certificates.of_class(held, "cpu") is None
    newer = _of(certs.probe_entry(1, median_us=800.0), "80GB")
    add(newer)
    held = certificates.load_file(tmp_path / PROFILE / "fault_probe.float32.json").entries[key]
    assert certificates.class_entries(held) == {"141GB": h200, "80GB": newer}
    for cls, want in (("141GB", h200), ("80GB", newer), (None, held)):
        assert certificates.existing_entry(tmp_path, PROFILE, "fault_probe", "float32", key, cls) == want
        assert certificates.Directory(tmp_path).existing_entry(PROFILE, "fault_probe", "float32", key, cls) == want


@pytest.mark.parametrize(
    "others,field",
    [
        ({}, "is empty"),
        (None, "expected dict"),
        ({"80GB": "x"}, "expected dict"),
        ({"141GB": {}}, "is the class of the entry that holds it"),
        ({"90GB": {}}, "is not its key"),
        ({"80GB": {"other_classes": {}}}, "holds no others"),
    ],
)
def test_entries_of_other_classes_are_validated(certs, others, field, tmp_path):
    key = certs.probe_key(1)
    first = _of(certs.probe_entry(1), "141GB")
    if others is None:
        resolved = None
    else:
        resolved = {c: (_of(certs.probe_entry(1), "80GB") | e if isinstance(e, dict) else e) for c, e in others.items()}
        if "141GB" in others:
            resolved["141GB"] = _of(certs.probe_entry(1), "141GB")
    entry = dict(first, other_classes=resolved)
    with pytest.raises(CertificateInvalid, match=field):
        certificates.validate_entry(tmp_path / "x.json", key, entry, "fault_probe", "float32")
    ok = dict(first, other_classes={"80GB": _of(certs.probe_entry(1), "80GB")})
    certificates.validate_entry(tmp_path / "x.json", key, ok, "fault_probe", "float32")
