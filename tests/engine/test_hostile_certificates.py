"""Hostile certificates refused by the loader (and by `validate`) without allocating more than the file needs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from clitools import check
from reliabilitytools import (
    nbx,
    probe_text,
)


def _set(*path_and_value):
    *path, value = path_and_value

    def mutate(e):
        node = e
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value

    return mutate


# name -> (how the probe entry is spoiled, the field named, a part of the reason)
HOSTILE_ENTRIES = {
    "block_2_30": (_set("winner", "config", "kwargs", "BLOCK", 2**30), "winner.config.kwargs.BLOCK", "0..65536"),
    "negative_warps": (_set("winner", "config", "num_warps", -4), "winner.config.num_warps", "not a power of two"),
    "string_for_int": (_set("winner", "config", "num_stages", "1"), "winner.config.num_stages", "got str"),
    "float_for_int": (_set("winner", "config", "kwargs", "BLOCK", 64.0), "winner.config.kwargs.BLOCK", "an integer"),
    "extra_field": (_set("extra", {"__class__": "os.system"}), "extra", "unknown field"),
    "extra_config_field": (_set("winner", "config", "kwargs", "EVIL", 1), "winner.config.kwargs.EVIL", "takes no"),
    "not_a_candidate": (_set("winner", "config", "kwargs", "FAULT", 9), "winner.config", "not one of kernel"),
    "huge_int_timing": (_set("winner", "timing", "median_us", 10**400), "winner.timing.median_us", "finite number"),
    # numbers no measurement gives (merge kept a median of -1 us as the fastest; validate passed them)
    "negative_median": (_set("winner", "timing", "median_us", -1.0), "winner.timing.median_us", "is not above 0"),
    "min_over_median": (_set("winner", "timing", "min_us", 1e9), "winner.timing.min_us", "is not from 0 to the median"),
    "no_repetitions": (_set("winner", "timing", "reps", 0), "winner.timing.reps", "is not 1 or more"),
    "negative_spread": (_set("winner", "timing", "spread", -3.0), "winner.timing.spread", "is negative"),
    "error_past_tolerance": (_set("error", "max_scaled", 1e30), "error.max_scaled", "is not within [0, 1]"),
    "negative_tolerance": (_set("error", "tolerance", -1.0), "error.tolerance", "is negative"),
    "class_with_a_space": (_set("memory_class", "80 GB"), "memory_class", "is not a class name"),
}


def _hostile_file(certs, name: str, directory: Path) -> tuple[Path, str | None, str]:
    """Write hostile case `name` under `directory`: (its path, the field named or None, a part of the reason)."""
    path = directory / "fault_probe.float32.json"
    if name in HOSTILE_ENTRIES:
        mutate, field, reason = HOSTILE_ENTRIES[name]
        path.write_text(probe_text(certs, mutate))
        return path, field, reason
    if name == "one_gigabyte":
        with open(path, "wb") as f:
            f.truncate(2**30)  # sparse: costs no disk
        return path, None, "over the 67108864-byte limit"
    if name == "deep_nesting":
        path.write_text("[" * 100_000 + "]" * 100_000)
        return path, None, "is not valid JSON"
    if name == "nan_timing":
        path.write_text(probe_text(certs).replace("3300.0", "NaN", 1))
        return path, None, "NaN is not valid JSON"
    if name == "infinite_timing":
        path.write_text(probe_text(certs).replace("3300.0", "1e999", 1))
        return path, "default.timing.median_us", "finite number"  # the first 3300.0 (keys sorted)
    if name == "key_of_5000_digits":  # bug: int() refused it with ValueError, a traceback through the loader
        path.write_text(probe_text(certs, key=f"fault_probe[n={'1' * 5000};float32]@v1"))
        return path, None, "more than 40"
    if name == "kernel_with_path_separators":
        path.write_text(probe_text(certs).replace('"kernel": "fault_probe"', '"kernel": "../../etc/passwd"'))
        return path, "kernel", "is not the file name's 'fault_probe'"
    if name == "dunder_names":
        path = directory / "__init__.float32.json"
        path.write_text(probe_text(certs).replace('"kernel": "fault_probe"', '"kernel": "__class__"'))
        return path, None, "file name must be"
    if name == "fifo":  # bug: reading it blocked for ever (the loader read it like a file)
        os.mkfifo(path)
        return path, None, "is not a regular file"
    raise AssertionError(name)


SPEC_CASES = {"extra_config_field", "not_a_candidate"}  # only the kernel's spec can refuse these
HOSTILE = sorted(HOSTILE_ENTRIES) + [
    "one_gigabyte",
    "deep_nesting",
    "nan_timing",
    "infinite_timing",
    "key_of_5000_digits",
    "kernel_with_path_separators",
    "dunder_names",
    "fifo",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_certificate_is_refused_by_the_loader_and_validate_without_allocating_more_than_the_file(
    name, certs, faulty, tmp_path, monkeypatch
):
    import tracemalloc

    from nbxcert import certificates, serving, validate
    from nbxcert.errors import CertificateInvalid
    from nbxcert.kernels.spec import get_spec

    root = tmp_path / "certs"
    directory = root / "cpu" / "interpreter"
    directory.mkdir(parents=True)
    path, field, reason = _hostile_file(certs, name, directory)
    size = path.stat().st_size if path.is_file() else 0

    warm = certs.write_probe(tmp_path / "warm", {certs.probe_key(300): certs.probe_entry(300)})
    certificates.load_file(warm, spec_lookup=get_spec)  # imports and caches first: only the refusal is measured
    tracemalloc.start()
    try:
        with pytest.raises(CertificateInvalid) as e:
            certificates.load_file(path, spec_lookup=get_spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert message.startswith(f"{path}: ") and reason in message, message
    if field:
        assert f"field '{field}'" in message, message
    budget = 256 * 1024 + (0 if name == "one_gigabyte" else 16 * size)  # the 1 GiB file is refused by its size
    assert peak < budget, f"the loader allocated {peak} bytes for a {size}-byte file"

    cache = tmp_path / "cache"
    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(cache))
    serving.configure(dirs=[root], certified_only=True)
    try:
        # serving refuses it: the whole directory when it breaks the schema (no index is written), the entry when
        # only the kernel's spec can tell (a config the kernel does not take), at the launch that looks it up
        with pytest.raises(CertificateInvalid, match="is not a candidate" if name in SPEC_CASES else f"^{path}: "):
            serving.config_for(faulty.SPEC, {"n": 300}, ("float32",))
    finally:
        serving.configure()
    if name not in SPEC_CASES:
        assert not (cache.exists() and list(cache.glob("*.nbxidx")))

    scan = validate.validate(root, ["faulty_kernels"])  # `nbxcert validate`'s engine lists it, never raises
    assert any(p.file == str(path) and reason in p.reason for p in scan.problems), scan.problems


def test_validate_command_lists_the_hostile_cases_that_were_tracebacks(certs, tmp_path):
    fifo_dir = tmp_path / "nvidia" / "hopper"
    fifo_dir.mkdir(parents=True)
    _hostile_file(certs, "fifo", fifo_dir)
    spoiled = certs.probe_entry(300)
    HOSTILE_ENTRIES["huge_int_timing"][0](spoiled)
    long_key = f"fault_probe[n={'1' * 5000};float32]@v1"
    certs.write_probe(tmp_path, {certs.probe_key(300): spoiled, long_key: certs.probe_entry(300)})
    r = nbx("validate", tmp_path, "--spec", "faulty_kernels")
    check(
        r,
        1,
        must=["is not a regular file", "expected a finite number", "more than 40", "1 file, 2 entries, 3 problems"],
    )


def test_a_directory_named_like_a_certificate_is_not_read_as_one(certs, tmp_path):
    from nbxcert import certificates, index
    from nbxcert.errors import CertificateInvalid

    certs.write_probe(tmp_path, {certs.probe_key(300): certs.probe_entry(300)})
    odd = tmp_path / "cpu" / "interpreter" / "odd.float32.json"
    odd.mkdir()
    with pytest.raises(CertificateInvalid, match="is not a regular file"):  # bug: IsADirectoryError, a traceback
        certificates.load_file(odd)
    # bug: the index build read it as a certificate and refused the whole directory, which `validate` accepts
    idx = index.load_index([tmp_path], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache")
    assert list(idx.keys()) == [certs.probe_key(300)]
    check(nbx("validate", tmp_path, "--spec", "faulty_kernels"), 0, must=["1 file, 1 entry, 0 problems"])


def test_serving_reads_the_files_validate_reads_and_refuses_links_to_nothing(certs, tmp_path):
    """A copy of a certificate in a folder below the profile's (`.old/`) was served over the real file, though
    `validate` and `show` never read it; a link to nothing (an editor's `.#name.json` lock) or a loop of links ended
    the index build with a traceback: refused in one line naming it."""
    from nbxcert import index
    from nbxcert.errors import CertificateInvalid

    certs.write_probe(tmp_path, {certs.probe_key(300): certs.probe_entry(300)})
    old = tmp_path / "cpu" / "interpreter" / ".old"
    certs.write_probe(old.parent.parent.parent / "stale", {certs.probe_key(300): certs.probe_entry(300, fault=1)})
    old.mkdir()
    (old / "fault_probe.float32.json").write_bytes(
        (tmp_path / "stale" / "cpu" / "interpreter" / "fault_probe.float32.json").read_bytes()
    )
    idx = index.load_index([tmp_path], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache")
    assert idx.get(certs.probe_key(300))["winner"]["config"]["kwargs"]["FAULT"] == 0
    lock = tmp_path / "cpu" / "interpreter" / ".#fault_probe.float32.json"
    lock.symlink_to(tmp_path / "nowhere")
    with pytest.raises(CertificateInvalid, match="is a link that cannot be resolved"):
        index.load_index([tmp_path], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache2")


def test_a_key_written_with_spaces_and_a_file_of_another_dtype_are_refused_naming_them(certs, tmp_path):
    """A key with a space after it passed `validate`, was never served, and `merge` kept it beside the real one; a
    file whose dtype is not its name's was refused naming the field 'kernel' and no value."""
    d = tmp_path / "cpu" / "interpreter"
    d.mkdir(parents=True)
    (d / "fault_probe.float32.json").write_text(probe_text(certs, key=certs.probe_key(300) + " "))
    check(nbx("validate", tmp_path, "--spec", "faulty_kernels"), 1, must=["key is not written canonically: write '"])
    (d / "fault_probe.float32.json").write_text(probe_text(certs).replace('"dtype": "float32"', '"dtype": "float16"'))
    r = nbx("validate", tmp_path, "--spec", "faulty_kernels")
    check(r, 1, must=["field 'dtype': 'float16' is not the file name's 'float32' (rename the file or fix the field)"])


def test_a_damaged_digest_memo_is_a_miss_not_a_crash(certs, tmp_path, monkeypatch):
    """The index's memo of file digests (`digests.json` in the cache) with a damaged entry made serving and every
    index command fail with a ValueError traceback; such an entry only means the file is hashed again."""
    import json
    import time

    from nbxcert import index

    certs.write_probe(tmp_path, {certs.probe_key(300): certs.probe_entry(300)})
    cache = tmp_path / "cache"
    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(cache))  # the memo's home
    index.load_index([tmp_path], "cpu/interpreter", "cpu", cache_dir=cache)
    memo = cache / "digests.json"
    time.sleep(index.SETTLE_NS / 1e9 + 0.1)
    index.load_index([tmp_path], "cpu/interpreter", "cpu", cache_dir=cache)  # the memo's entries settled and saved
    table = json.loads(memo.read_text())
    for value in table.values():
        value[1] = "zz" + value[1][2:]
    memo.write_text(json.dumps(table))
    idx = index.load_index([tmp_path], "cpu/interpreter", "cpu", cache_dir=cache)
    assert list(idx.keys()) == [certs.probe_key(300)]


@pytest.mark.parametrize(
    "spoil, field, says",
    [
        (
            lambda e: e["winner"]["timing"].update(median_us=e["winner"]["timing"]["median_us"] * 10),
            "winner.timing",
            "is not the timing of its own row of finalists",
        ),
        (
            lambda e: e.update(finalists=[f for f in e["finalists"] if f["config"] != e["winner"]["config"]]),
            "finalists",
            "do not hold the winner",
        ),
    ],
)
def test_a_winner_that_disagrees_with_its_finalists_is_refused(tmp_path, spoil, field, says):
    """A winner edited apart from the row it was chosen by passed `validate`, while `stale` and `show` each read one
    of the two."""
    import json

    from reliabilitytools import ROOT

    shipped = ROOT / "certificates" / "cpu" / "interpreter" / "rmsnorm.float16.json"
    doc = json.loads(shipped.read_text())
    key = sorted(doc["entries"])[0]
    spoil(doc["entries"][key])
    folder = tmp_path / "cpu" / "interpreter"
    folder.mkdir(parents=True)
    (folder / shipped.name).write_text(json.dumps(doc))
    check(nbx("validate", tmp_path), 1, must=[key, field, says])
