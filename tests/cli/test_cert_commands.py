"""`nbxcert validate`, `show`, `diff` and `merge` over certificate directories.

CLI tests run the real command in a subprocess and assert the exit code, the lines that must appear and those that
must not (never a traceback). Certificates are built synthetically (`tests/fixtures/certs.py`) for the test kernel
`fault_probe` (`tests/fixtures/faulty_kernels.py`, registered with `--spec faulty_kernels`), so each entry is checked
against a real KernelSpec. The merge rules themselves are also tested in-process (`merge.decide`), where a table of
cases costs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import check, check_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPEC = ("--spec", "faulty_kernels")


@pytest.fixture(scope="module")
def certs():
    sys.path.insert(0, str(FIXTURES))
    import certs as module

    return module


def nbx(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "NBXCERT_CERTIFIED_DIR"}
    e.update(NBXCERT_BACKEND="interpreter", COLUMNS="250", PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    e.update(env or {})
    cmd = [sys.executable, "-m", "nbxcert", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [x for x in r.stderr.splitlines() if x.startswith("nbxcert:")]


def write_json(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- validate ---------------------------------------------------------------------------------------------------------
def test_validate_a_clean_directory_prints_one_line_and_exits_0(certs, tmp_path):
    certs.write_probe(
        tmp_path, {certs.probe_key(300): certs.probe_entry(300), certs.probe_key(512): certs.probe_entry(512)}
    )
    r = nbx("validate", tmp_path, *SPEC)
    check(r, 0)
    assert r.stdout.strip().splitlines() == ["1 file, 2 entries, 0 problems"]
    doc = check_json(nbx("validate", tmp_path, *SPEC, "--json"), 0)
    assert (doc["files"], doc["entries"], doc["problems"]) == (1, 2, [])


def _hostile_tree(certs, root: Path, outside: Path) -> list[tuple[str, str | None, str | None, str]]:
    """A certificate directory holding every kind of bad input, and the problems (file part, key, field, reason part)
    validate must list for it."""
    probe = root / "cpu" / "interpreter"
    good, k = certs.probe_entry, certs.probe_key
    expected = []

    def bad(n, reason, field=None, mutate=None):
        e = good(n)
        mutate(e)
        entries[k(n)] = e
        expected.append(("interpreter/fault_probe.float32.json", k(n), field, reason))

    # one file, many bad entries: each is listed, the good one is not
    entries = {k(300): good(300)}
    bad(1, "65536", "winner.config.kwargs.BLOCK", lambda e: e["winner"]["config"]["kwargs"].update(BLOCK=2**30))
    bad(2, "not a power of two", "runner_up.config.num_warps", lambda e: e["runner_up"]["config"].update(num_warps=-4))
    bad(3, "expected an integer, got str", "seed", lambda e: e.update(seed="7"))
    bad(4, "unknown field", "extra", lambda e: e.update(extra={"x": 1}))
    bad(
        5,
        "takes no config field 'EVIL'",
        "winner.config.kwargs.EVIL",
        lambda e: e["winner"]["config"]["kwargs"].update(EVIL=1),
    )
    bad(
        6,
        "not one of kernel fault_probe's candidates",
        "default.config",
        lambda e: e["default"]["config"]["kwargs"].update(FAULT=9),
    )
    bad(
        7,
        "must be an integer or a word",
        "certified_problems.smallest.n",
        lambda e: e["certified_problems"]["smallest"].update(n=json.loads("[" * 500 + "]" * 500)),
    )
    entries["fault_probe[n=3x;float32]@v1"] = good(3)
    expected.append(("fault_probe.float32.json", "fault_probe[n=3x;float32]@v1", None, "key does not parse"))
    entries["fault_probe[n=\u00b2;float32]@v1"] = good(3)  # "²".isdigit() is True, int("²") raises ValueError
    expected.append(("fault_probe.float32.json", "fault_probe[n=\u00b2;float32]@v1", None, ""))
    entries["../fault_probe[n=3;float32]@v1"] = good(3)
    expected.append(("fault_probe.float32.json", "../fault_probe[n=3;float32]@v1", None, "key does not parse"))
    entries["fault_probe[m=3;float32]@v1"] = good(3)
    expected.append(("fault_probe.float32.json", "fault_probe[m=3;float32]@v1", None, "lacks key field n"))
    certs.write_probe(root, entries)

    # files refused before or while reading
    with open(probe / "huge.float32.json", "wb") as f:
        f.truncate(2**30)  # sparse: 1 GiB that costs nothing, refused by its size before a byte is read
    expected.append(("huge.float32.json", None, None, "byte limit"))
    write_json(probe / "deep.float32.json", "[" * 100_000 + "]" * 100_000)
    expected.append(("deep.float32.json", None, None, "is not valid JSON"))
    nan_doc = certs.certificates.dumps({"entries": {k(5): good(5)}}).replace("3300.0", "NaN", 1)
    write_json(probe / "nan.float32.json", nan_doc)
    expected.append(("nan.float32.json", None, None, "NaN is not valid JSON"))
    os.mkfifo(probe / "fifo.float32.json")  # reading it would block for ever
    expected.append(("fifo.float32.json", None, None, "is not a regular file"))
    write_json(outside / "secret.json", "{}")
    (probe / "link.float32.json").symlink_to(outside / "secret.json")
    expected.append(("link.float32.json", None, None, "points outside"))
    (root / "cpu" / "escape").symlink_to(outside)
    expected.append(("cpu/escape", None, None, "points outside"))

    # names: path separators, dunders, `..`
    def doc(kernel, profile="cpu/interpreter", dtype="float32"):
        d = {"schema_version": 1, "kernel": kernel, "dtype": dtype, "profile": profile, "entries": {}}
        return certs.certificates.dumps(d)

    write_json(probe / "evil.float32.json", doc("../../etc/passwd"))
    expected.append(("evil.float32.json", None, "kernel", "is not the file name's 'evil'"))
    expected.append(("evil.float32.json", None, "kernel", "unknown kernel 'evil'"))
    write_json(probe / "__init__.float32.json", doc("__class__"))
    expected.append(("__init__.float32.json", None, None, "file name must be"))
    write_json(probe / "fault_probe..float32.json", doc("fault_probe"))
    expected.append(("fault_probe..float32.json", None, None, "file name must be"))

    # profiles and layout
    certs.write_file(root, {k(9): good(9)}, "fault_probe", "float32", profile="nvidia/nosuch")
    expected.append(("nosuch/fault_probe.float32.json", None, None, "directory nvidia/nosuch is not a known profile"))
    expected.append(("nosuch/fault_probe.float32.json", None, "profile", "'nvidia/nosuch' is not a known profile"))
    path = certs.write_file(root, {k(9): good(9)}, "fault_probe", "float32", profile="nvidia/hopper")
    write_json(path, path.read_text().replace('"profile": "nvidia/hopper"', '"profile": "cpu/interpreter"'))
    expected.append(("hopper/fault_probe.float32.json", None, "profile", "disagrees with its directory"))
    write_json(root / "fault_probe.float32.json", doc("fault_probe"))
    expected.append((f"{root.name}/fault_probe.float32.json", None, None, "is not at <vendor>/<profile>/"))
    certs.write_file(root, {"nokernel[n=1;float32]@v1": good(1)}, "nokernel", "float32", profile="cpu/interpreter")
    expected.append(("nokernel.float32.json", None, "kernel", "unknown kernel 'nokernel'"))
    return expected


def test_validate_lists_every_problem_of_hostile_input_and_never_crashes(certs, tmp_path):
    root, outside = tmp_path / "certs", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    expected = _hostile_tree(certs, root, outside)

    r = nbx("validate", root, *SPEC, "--json")
    check(r, 1)
    doc = json.loads(r.stdout)
    problems = doc["problems"]
    assert all(set(p) == {"file", "key", "field", "reason"} for p in problems)
    for file_part, key, field, reason in expected:
        hits = [
            p
            for p in problems
            if file_part in p["file"]
            and p["key"] == key
            and (field is None or p["field"] == field)
            and reason in p["reason"]
        ]
        assert hits, f"no problem {(file_part, key, field, reason)} in:\n" + "\n".join(map(str, problems))
    good_key = "fault_probe[n=300;float32]@v1"
    assert not any(p["key"] == good_key for p in problems), "a valid entry was reported"
    assert len(problems) == len(expected)
    assert doc["entries"] == 12 + 1 + 1 + 1  # the many-entry file, nosuch, hopper, nokernel

    r = nbx("validate", root, *SPEC)
    text = check(r, 1, must=["huge.float32.json: is 1073741824 bytes", f"{len(expected)} problems"])
    assert text.count("\n") >= len(expected)
    assert r.stdout.strip().splitlines()[-1].endswith(f", {len(expected)} problems")


def test_validate_refuses_a_directory_that_is_not_there_in_one_line(tmp_path):
    r = nbx("validate", tmp_path / "missing")
    check(r, 1, must=["nbxcert: usage:", "missing is not a directory"])
    assert len(r.stderr.strip().splitlines()) == 1


def test_validate_refuses_a_spec_module_that_does_not_import(tmp_path):
    check(nbx("validate", tmp_path, "--spec", "no_such_module_here"), 1, must=["nbxcert: usage: --spec no_such_module"])


# --- show -------------------------------------------------------------------------------------------------------------
def test_show_prints_the_whole_certification(certs, tmp_path):
    certs.write_probe(tmp_path, {certs.probe_key(300): certs.probe_entry(300)})
    r = nbx("show", certs.probe_key(300), "--dir", tmp_path)
    check(
        r,
        0,
        must=[
            "fault_probe[n=300;float32]@v1 on cpu/interpreter",
            "BLOCK=64,FAULT=0,warps=4,stages=1",
            "median 3300 us, min 3201 us, spread 2.0%, 100 reps (interpreter_cpu)",
            "runner-up 300.0% slower",
            "(the default won)",
            "1.00x",
            "max scaled 0.33 (<= 1 passes)",
            "tolerance 1.19e-07",
            "2 correct; refused: mismatch 1",
            "refused (mismatch)",
            "BLOCK=64,FAULT=2,warps=4,stages=1: Mismatched elements: 300 / 300",
            "reproducible",
            "provenance triton",
            "none (Triton interpreter on the CPU)",
        ],
    )


def test_show_says_what_an_old_or_waiting_timing_kind_means(certs, tmp_path):
    certs.write_probe(tmp_path, {certs.probe_key(300): certs.probe_entry(300)})
    path = tmp_path / "cpu" / "interpreter" / "fault_probe.float32.json"
    path.write_text(path.read_text().replace("interpreter_cpu", "cuda_events"))
    r = nbx("show", certs.probe_key(300), "--dir", tmp_path, env={"COLUMNS": "250"})
    check(r, 0, must=["(cuda_events; ungated, nbxcert < 0.3.0: a kernel shorter than its host launch was timed by the"])
    path.write_text(path.read_text().replace("cuda_events", "cuda_events_waiting"))
    r = nbx("show", certs.probe_key(300), "--dir", tmp_path, env={"COLUMNS": "250"})
    check(r, 0, must=["(cuda_events_waiting; ungated: the launch waits for the device itself)"])


def test_show_searches_the_serving_path_first_directory_wins(certs, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    certs.write_probe(a, {certs.probe_key(300): certs.probe_entry(300, median_us=1000.0)})
    certs.write_probe(b, {certs.probe_key(300): certs.probe_entry(300, median_us=9000.0)})
    r = nbx(
        "show", certs.probe_key(300), "--profile", "interpreter", "--json", env={"NBXCERT_CERTIFIED_DIR": f"{a}:{b}"}
    )
    (shown,) = check_json(r, 0)
    assert shown["dir"] == str(a) and shown["shadowed"] == [str(b)]
    assert shown["entry"]["winner"]["timing"]["median_us"] == 1000.0
    assert shown["summary"]["winner"] == "BLOCK=64,FAULT=0,warps=4,stages=1"
    assert shown["summary"]["speedup_over_default"] == 1.0


@pytest.mark.parametrize(
    "args, label, must",
    [
        (("fault_probe[n=301;float32]@v1", "--profile", "interpreter"), "key not certified", "for cpu/interpreter in"),
        (("fault_probe[n=301;float32]@v1",), "key not certified", "for any profile in"),
        (("fault_probe[n=300;float32]@v1", "--profile", "nosuch"), "unknown profile", "'nosuch'"),
        (("fault_probe[n=300,float32]",), "bad launch key", "is not a launch key"),
    ],
)
def test_show_errors_are_one_line(certs, tmp_path, args, label, must):
    certs.write_probe(tmp_path, {certs.probe_key(300): certs.probe_entry(300)})
    r = nbx("show", *args, "--dir", tmp_path)
    check(r, 1, must=[f"nbxcert: {label}:", must])
    assert len(error_lines(r)) == 1
    if label == "key not certified":
        assert str(tmp_path) in r.stderr and "fault_probe[n=301;float32]@v1" in r.stderr


def test_show_refuses_an_invalid_certificate_in_one_line(certs, tmp_path):
    path = certs.write_probe(tmp_path, {certs.probe_key(300): certs.probe_entry(300)})
    path.write_text(path.read_text().replace('"seed":20261129', '"seed":"x"'))
    r = nbx("show", certs.probe_key(300), "--dir", tmp_path)
    check(r, 1, must=["nbxcert: invalid certificate:", "field 'seed'"])


# --- diff -------------------------------------------------------------------------------------------------------------
def test_diff_lists_added_removed_and_changed_winners(certs, tmp_path):
    k, e = certs.probe_key, certs.probe_entry
    old, new = tmp_path / "old", tmp_path / "new"
    certs.write_probe(old, {k(1): e(1), k(2): e(2, median_us=3000.0), k(3): e(3, median_us=3000.0)})
    certs.write_probe(new, {k(2): e(2, median_us=2900.0), k(3): e(3, fault=1, median_us=4500.0), k(4): e(4)})
    r = nbx("diff", old, new)
    check(
        r,
        0,
        must=[
            "cpu/interpreter: 1 added, 1 removed, 1 winners changed, 1 unchanged",
            "winner changed",
            "BLOCK=64,FAULT=1,warps=4,stages=1",
            "1.500",
        ],
    )
    doc = check_json(nbx("diff", old, new, "--json"), 0)["profiles"]["cpu/interpreter"]
    assert [a["key"] for a in doc["added"]] == [k(4)] and [a["key"] for a in doc["removed"]] == [k(1)]
    (changed,) = doc["changed"]
    assert changed["key"] == k(3) and changed["ratio"] == pytest.approx(1.5)
    assert changed["old"]["winner"].endswith("FAULT=0,warps=4,stages=1") and changed["new"]["median_us"] == 4500.0


def test_diff_compares_each_memory_class_entry_of_a_key_with_its_own(certs, tmp_path):
    """A key keeps one entry a memory class: a run on another class's card changes its entry there (`other_classes`),
    beside the first one. diff names that change and the class; it read the first class's entry alone before, and
    called such a key unchanged."""
    k, e = certs.probe_key, certs.probe_entry
    old, new = tmp_path / "old", tmp_path / "new"
    first = e(1)

    def both(other):
        return dict(first, other_classes={"80GB": dict(other, memory_class="80GB")})

    certs.write_probe(old, {k(1): both(e(1, median_us=3000.0))})
    certs.write_probe(new, {k(1): both(e(1, fault=1, median_us=1500.0)), k(2): both(e(2))})
    check(nbx("diff", old, new), 0, must=["cpu/interpreter: 2 added, 0 removed, 1 winners changed, 1 unchanged"])
    doc = check_json(nbx("diff", old, new, "--json"), 0)["profiles"]["cpu/interpreter"]
    (changed,) = doc["changed"]
    assert (changed["key"], changed["memory_class"], changed["ratio"]) == (k(1), "80GB", pytest.approx(0.5))
    assert sorted((a["key"], a["memory_class"]) for a in doc["added"]) == [(k(2), "80GB"), (k(2), "cpu")]


def test_diff_of_two_directories_without_certificates_is_refused(certs, tmp_path):
    """Two paths that hold no certificate file (a wrong path twice) compare nothing: refused naming both; one empty
    side is a diff (everything added)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    r = nbx("diff", tmp_path / "a", tmp_path / "b")
    check(r, 1, must=[f"neither {tmp_path / 'a'} nor {tmp_path / 'b'} holds certificate files: nothing to compare"])
    certs.write_probe(tmp_path / "b", {certs.probe_key(1): certs.probe_entry(1)})
    check(nbx("diff", tmp_path / "a", tmp_path / "b"), 0, must=["1 added, 0 removed"])


def test_diff_refuses_an_invalid_directory(certs, tmp_path):
    certs.write_probe(tmp_path / "a", {certs.probe_key(1): certs.probe_entry(1)})
    write_json(tmp_path / "b" / "cpu" / "interpreter" / "fault_probe.float32.json", "{")
    r = nbx("diff", tmp_path / "a", tmp_path / "b")
    check(r, 1, must=["nbxcert: invalid certificate:", "has 1 problem(s)", "nbxcert validate"])
    assert len(error_lines(r)) == 1


# --- merge ------------------------------------------------------------------------------------------------------------
def test_merge_shards_keeps_the_faster_of_duplicates_and_is_idempotent(certs, tmp_path):
    k, e = certs.probe_key, certs.probe_entry
    s1, s2, out = tmp_path / "s1", tmp_path / "s2", tmp_path / "out"
    certs.write_probe(s1, {k(1): e(1), k(2): e(2, median_us=5000.0)})
    certs.write_probe(s2, {k(2): e(2, median_us=4000.0), k(3): e(3), k(1): e(1)})  # k(1): an identical copy
    r = nbx("merge", out, s1, s2, *SPEC)
    check(
        r,
        0,
        must=["merged 3 entries", "(3 new, 0 replaced, 0 unchanged); 1 duplicates", "0 refused", "duplicate: kept"],
    )
    merged = json.loads((out / "cpu" / "interpreter" / "fault_probe.float32.json").read_text())["entries"]
    assert sorted(merged) == sorted([k(1), k(2), k(3)])
    assert merged[k(2)]["winner"]["timing"]["median_us"] == 4000.0
    check(nbx("validate", out, *SPEC), 0, must=["1 file, 3 entries, 0 problems"])

    path = out / "cpu" / "interpreter" / "fault_probe.float32.json"
    before = path.stat().st_mtime_ns
    doc = check_json(nbx("merge", out, s1, s2, *SPEC, "--json"), 0)
    assert doc["totals"]["unchanged"] == 3 and doc["written"] == [] and path.stat().st_mtime_ns == before


def test_merge_keeps_a_keys_entries_of_two_memory_classes_side_by_side(certs, tmp_path):
    """Shards certified on cards of two memory classes (an H200 and an H100 of one profile) merge with no conflict:
    the key keeps both entries, and merging again changes nothing."""
    k, e = certs.probe_key, certs.probe_entry
    s1, s2, out = tmp_path / "s1", tmp_path / "s2", tmp_path / "out"
    big = dict(e(1, median_us=3000.0, gpu="NVIDIA H200"), memory_class="141GB")
    small = dict(e(1, median_us=2000.0, gpu="NVIDIA H100 80GB HBM3"), memory_class="80GB")
    certs.write_probe(s1, {k(1): big, k(2): e(2)})
    certs.write_probe(s2, {k(1): small})
    check(
        nbx("merge", out, s1, s2, *SPEC), 0, must=["merged 3 entries", "(3 new, 0 replaced, 0 unchanged)", "0 refused"]
    )
    merged = json.loads((out / "cpu" / "interpreter" / "fault_probe.float32.json").read_text())["entries"]
    assert merged[k(1)]["memory_class"] == "141GB" and merged[k(1)]["other_classes"] == {"80GB": small}
    check(nbx("validate", out, *SPEC), 0, must=["1 file, 2 entries, 0 problems"])
    doc = check_json(nbx("merge", out, s1, s2, *SPEC, "--json"), 0)
    assert doc["totals"]["unchanged"] == 3 and doc["written"] == []
    assert sorted(r["memory_class"] for r in doc["keys"] if r["key"] == k(1)) == ["141GB", "80GB"]


def _conflict(certs, tmp_path, **b_provenance):
    k, e = certs.probe_key, certs.probe_entry
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    certs.write_probe(s1, {k(1): e(1, median_us=3000.0, triton="3.6.0", date="2026-11-29"), k(2): e(2)})
    certs.write_probe(s2, {k(1): e(1, median_us=2000.0, **b_provenance)})
    return s1, s2, tmp_path / "out"


def test_merge_refuses_certifications_from_different_versions_and_writes_nothing(certs, tmp_path):
    s1, s2, out = _conflict(certs, tmp_path, triton="3.5.0", date="2026-10-01")
    r = nbx("merge", out, s1, s2, *SPEC)
    must = ["nbxcert: usage: merge refused, nothing written: 1 key(s)", "--prefer newest", "triton 3.5.0"]
    check(r, 1, must=must + ["nothing merged into", "(would merge 1 entries"], must_not=["merged 1 entries"])
    assert len(error_lines(r)) == 1
    assert not list(out.rglob("*.json"))


@pytest.mark.parametrize("prefer, median", [("newest", 3000.0), ("fastest", 2000.0)])
def test_merge_prefer_resolves_a_conflict(certs, tmp_path, prefer, median):
    s1, s2, out = _conflict(certs, tmp_path, triton="3.5.0", date="2026-10-01")
    r = nbx("merge", out, s1, s2, *SPEC, "--prefer", prefer)
    check(r, 0, must=[f"conflicts: 1 resolved by --prefer {prefer}, 0 refused", f"{prefer}: "])
    merged = json.loads((out / "cpu" / "interpreter" / "fault_probe.float32.json").read_text())["entries"]
    assert merged[certs.probe_key(1)]["winner"]["timing"]["median_us"] == median


def test_merge_prefer_fastest_refuses_timings_of_different_kinds(certs, tmp_path):
    s1, s2, out = _conflict(certs, tmp_path, backend="cuda", gpu="NVIDIA H100 80GB HBM3")
    path = s2 / "cpu" / "interpreter" / "fault_probe.float32.json"
    path.write_text(path.read_text().replace("interpreter_cpu", "cuda_events"))
    check(nbx("merge", out, s1, s2, *SPEC, "--prefer", "fastest"), 1, must=["timing kinds differ"])
    check(nbx("merge", out, s1, s2, *SPEC, "--prefer", "newest"), 0, must=["1 resolved by --prefer newest"])


def test_merge_refuses_an_invalid_shard_and_bad_arguments(certs, tmp_path):
    k, e = certs.probe_key, certs.probe_entry
    bad = e(1)
    bad["winner"]["config"]["num_warps"] = -1
    certs.write_probe(tmp_path / "s1", {k(1): bad})
    r = nbx("merge", tmp_path / "out", tmp_path / "s1", *SPEC)
    check(r, 1, must=["nbxcert: invalid certificate:", "s1 has 1 problem(s)", "num_warps"])
    r = nbx("merge", tmp_path / "out", tmp_path / "s1", "--prefer", "oldest")
    check(r, 1, must=["nbxcert: usage: --prefer 'oldest' is not a rule -> choose one of: newest, fastest"])
    check(nbx("merge", tmp_path / "out"), 1, must=["nbxcert: usage: no shard directory to merge"])
    (tmp_path / "file").write_text("")
    check(nbx("merge", tmp_path / "file", tmp_path / "s1"), 1, must=["file exists and is not a directory"])


# --- the merge rules, in-process --------------------------------------------------------------------------------------
def test_decide_rules(certs):
    from nbxcert.merge import Candidate, decide

    e = certs.probe_entry
    a = Candidate("a", e(1, median_us=3000.0))
    assert decide([a, Candidate("b", e(1, median_us=3000.0))], None)[:2] == (a, "single")  # identical copies
    fast = Candidate("b", e(1, median_us=2500.0, date="2026-11-30", host_os="other"))  # same card and versions
    assert decide([a, fast], None)[:2] == (fast, "duplicate")
    # newest: same date, then the nbxcert version compared numerically (0.10.0 is newer than 0.9.0)
    old = Candidate("old", e(1, median_us=1000.0, nbxcert="0.9.0"))
    new = Candidate("new", e(1, median_us=9000.0, nbxcert="0.10.0"))
    assert decide([old, new], "newest")[0] is new
    assert decide([old, new], "fastest")[0] is old
    assert decide([old, new], None)[0] is None
    # a full tie under --prefer newest: the faster, then the one listed first (OUT before the shards)
    x = Candidate("x", e(1, median_us=5000.0, triton="3.6.0", driver="1"))
    y = Candidate("y", e(1, median_us=5000.0, triton="3.6.0", driver="01"))
    assert decide([x, y], "newest")[0] is x and decide([y, x], "newest")[0] is y
    # a version with thousands of digits compares without int() limits
    huge = Candidate("huge", e(1, triton="9" * 5000))
    assert decide([a, huge], "newest")[0] is huge


def test_merge_counts_the_existing_out_as_the_first_shard(certs, tmp_path):
    from nbxcert.merge import merge

    k, e = certs.probe_key, certs.probe_entry
    out, s1 = tmp_path / "out", tmp_path / "s1"
    certs.write_probe(out, {k(1): e(1, triton="3.5.0"), k(7): e(7)})
    certs.write_probe(s1, {k(1): e(1, triton="3.6.0")})
    report = merge(out, [s1], None, ["faulty_kernels"])
    assert [m.outcome for m in report.keys] == ["refused", "unchanged"] and report.written == []
    report = merge(out, [s1], "newest", ["faulty_kernels"])
    assert report.totals()["replaced"] == 1 and len(report.written) == 1
    merged = json.loads(report.written[0].read_text())["entries"]
    assert merged[k(1)]["provenance"]["triton"] == "3.6.0" and k(7) in merged  # other keys of OUT are kept


def test_show_memory_class_shows_the_entry_a_card_of_that_class_is_served():
    """A shipped hopper key certified on an H200 (first) and on an H100 with another winner: `--memory-class 80GB`
    shows the H100's entry (show read the first class's alone, naming another winner than an H100 runs)."""
    shipped = Path(__file__).resolve().parents[2] / "certificates"
    entries = json.loads((shipped / "nvidia" / "hopper" / "rmsnorm.float16.json").read_text())["entries"]
    key = next(
        k
        for k, e in entries.items()
        if e.get("other_classes", {}).get("80GB", {}).get("winner") not in (None, e["winner"])
    )
    first = check_json(nbx("show", key, "--profile", "hopper", "--dir", shipped, "--json"), 0)[0]
    h100 = check_json(nbx("show", key, "--profile", "hopper", "--dir", shipped, "--memory-class", "80GB", "--json"), 0)[
        0
    ]
    assert (first["entry"]["memory_class"], h100["entry"]["memory_class"]) == ("141GB", "80GB")
    assert h100["entry"] == entries[key]["other_classes"]["80GB"]
    r = nbx("show", key, "--profile", "hopper", "--dir", shipped, "--memory-class", "7GB")
    check(r, 1, must=["--memory-class 7GB is not a class of nvidia/hopper's cards"])


def test_show_memory_class_without_profile_searches_the_profiles_whose_cards_have_it():
    """`--memory-class 80GB` with no --profile: the profiles with 80GB cards are searched (every profile was held to
    the class, so an AMD profile without it refused the command); a class no card has is refused naming the known
    ones; a key missing as asked says where it is certified, and its next step is a command that runs."""
    shipped = Path(__file__).resolve().parents[2] / "certificates"
    entries = json.loads((shipped / "nvidia" / "hopper" / "rmsnorm.float16.json").read_text())["entries"]
    key = next(k for k, e in entries.items() if "80GB" in e.get("other_classes", {}))
    (shown,) = check_json(nbx("show", key, "--dir", shipped, "--memory-class", "80GB", "--json"), 0)
    assert (shown["profile"], shown["entry"]) == ("nvidia/hopper", entries[key]["other_classes"]["80GB"])
    r = nbx("show", key, "--dir", shipped, "--memory-class", "7GB")
    check(r, 1, must=["--memory-class 7GB is not a class of any profile's cards", "80GB", "141GB"])
    assert len(error_lines(r)) == 1
    r = nbx("show", key, "--dir", shipped, "--memory-class", "40GB")  # an A100's class: no hopper card has it
    check(r, 1, must=["is not certified for any profile (40GB class)", "certified for nvidia/hopper (141GB, 80GB"])
    r = nbx("show", key, "--dir", shipped, "--profile", "ampere", "--memory-class", "80GB")
    check(r, 1, must=["certify it on a card of the 80GB class: `nbxcert certify --profile nvidia/ampere --key"])
    assert "(80GB class) --key" not in r.stderr and len(error_lines(r)) == 1


def test_profiles_lists_each_profiles_memory_classes_and_cards():
    """`--memory-class` takes a class of the profile's cards: `nbxcert profiles` names them (and the cards), in the
    table as in `--json`; neither listed them, and the table left the cards out."""
    rows = {r["profile"]: r for r in check_json(nbx("profiles", "--json"), 0)}
    assert rows["nvidia/hopper"]["memory_classes"] == ["141GB", "80GB"]
    assert rows["cpu/interpreter"]["memory_classes"] == ["cpu"]
    table = check(nbx("profiles", env={"COLUMNS": "400"}), 0)
    hopper = next(line for line in table.splitlines() if "nvidia/hopper" in line)
    assert "141GB, 80GB" in hopper and all(s in hopper for s in rows["nvidia/hopper"]["skus"])
