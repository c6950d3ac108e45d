"""Serving: certified configs are served with no sweep; certified-only mode refuses a missing key by name; the
drop-in decorator serves a user's kernel; keys are recorded; the run-time sweep answers otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")


@pytest.fixture(scope="module")
def user_kernel(backend):
    if backend.name != "interpreter":
        pytest.skip("certifies under the interpreter profile")
    sys.path.insert(0, FIXTURES)
    import user_kernel

    return user_kernel


@pytest.fixture(scope="module")
def certified_dir(user_kernel, tmp_path_factory):
    from nbxcert.certify import certify
    from nbxcert.keys import parse_key

    out = tmp_path_factory.mktemp("certs")
    report = certify("interpreter", [parse_key("user_scale[n=1000;float32,float32]@v1")], out, modules=["user_kernel"])
    assert report.ok, report.keys
    return out


@pytest.fixture
def serving(monkeypatch, tmp_path):
    from nbxcert import serving

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NBXCERT_CERTIFIED_ONLY", raising=False)
    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "sweep")
    serving.reset()
    yield serving
    serving.reset()


def _launch(user_kernel, n):
    import triton

    from nbxcert.kernels import tensor as T

    x = T.from_numpy(np.random.default_rng(n).standard_normal(n), "float32")
    out = T.full((n,), float("nan"), "float32")
    user_kernel.user_scale[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, out, n)
    return x, out


def test_drop_in_serves_the_certificate_and_records_the_key(user_kernel, certified_dir, serving, monkeypatch, tmp_path):
    record = tmp_path / "keys.jsonl"
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(certified_dir))
    monkeypatch.setenv("NBXCERT_KEY_RECORD", str(record))
    x, out = _launch(user_kernel, 1000)
    assert np.array_equal(out.float64(), (3.0 * x.numpy()).astype(np.float32))
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert lines == [lines[0]] and lines[0]["key"] == "user_scale[n=1000;float32,float32]@v1"
    assert lines[0]["event"] == "served"


def test_certified_only_refuses_a_missing_key_by_name(user_kernel, certified_dir, serving, monkeypatch):
    from nbxcert.errors import KeyNotCertified

    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(certified_dir))
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "1")
    with pytest.raises(KeyNotCertified, match=r"user_scale\[n=999;float32,float32\]@v1 is not certified"):
        _launch(user_kernel, 999)


def test_certified_only_refuses_a_key_that_cannot_be_formed(user_kernel, certified_dir, serving, monkeypatch):
    """A launch whose key text cannot be formed (here n is a float) is the same refusal in certified-only mode."""
    import triton

    from nbxcert.errors import KeyNotCertified
    from nbxcert.kernels import tensor as T

    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(certified_dir))
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "1")
    x, out = T.from_numpy(np.ones(8), "float32"), T.empty((8,), "float32")
    with pytest.raises(KeyNotCertified, match="no launch key can be formed"):
        user_kernel.user_scale[lambda meta: (triton.cdiv(int(meta["n"]), meta["BLOCK"]),)](x, out, 8.0)


def test_without_certificate_the_key_is_swept_at_run_time(user_kernel, serving, monkeypatch, capfd, tmp_path):
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(tmp_path / "empty"))
    x, out = _launch(user_kernel, 777)
    assert np.array_equal(out.float64(), (3.0 * x.numpy()).astype(np.float32))
    err = capfd.readouterr().err
    assert "has no certificate" in err and "sweeping it at run time" in err
    assert "nbxcert certify --profile interpreter --key 'user_scale[n=777;float32,float32]@v1' --out DIR" in err


def test_certified_only_refuses_a_winner_an_earlier_run_swept(user_kernel, serving, monkeypatch, tmp_path):
    """A key swept at run time by an earlier process is kept in the run-time cache; a process in certified-only mode
    refuses it as it refuses any key with no certificate (it served the cached sweep's winner, uncertified)."""
    from nbxcert.errors import KeyNotCertified

    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(tmp_path / "empty"))
    _launch(user_kernel, 333)  # swept, its winner cached under NBXCERT_CACHE_DIR
    serving.reset()
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "1")
    with pytest.raises(KeyNotCertified, match=r"user_scale\[n=333;float32,float32\]@v1 is not certified"):
        _launch(user_kernel, 333)


def test_uncertified_default_mode_runs_the_untuned_default_and_says_so(
    user_kernel, serving, monkeypatch, capfd, tmp_path
):
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "default")
    monkeypatch.setenv("NBXCERT_KEY_RECORD", str(tmp_path / "k.jsonl"))
    x, out = _launch(user_kernel, 555)
    assert np.array_equal(out.float64(), (3.0 * x.numpy()).astype(np.float32))
    assert "running the kernel's untuned default (NBXCERT_UNCERTIFIED=default)" in capfd.readouterr().err
    assert json.loads((tmp_path / "k.jsonl").read_text())["event"] == "default"


def test_unknown_uncertified_mode_is_refused_by_name(user_kernel, serving, monkeypatch):
    from nbxcert.errors import UsageError

    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "guess")
    with pytest.raises(UsageError, match="NBXCERT_UNCERTIFIED=guess is not a mode"):
        _launch(user_kernel, 10)


def test_concurrent_key_recording_loses_no_line(tmp_path):
    path = tmp_path / "keys.jsonl"
    code = (
        "import sys; from nbxcert.keyfile import append_record\n"
        "for i in range(200): append_record(sys.argv[1], {'key': f'k{sys.argv[2]}_{i}'})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(p)]) for p in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    lines = path.read_text().splitlines()
    assert len(lines) == 800 and len({json.loads(x)["key"] for x in lines}) == 800


def test_serving_imports_no_sweep_cli_or_oracle():
    code = (
        "import sys, os; os.environ['NBXCERT_BACKEND']='interpreter'; import nbxcert.serving;"
        "bad=[m for m in ('nbxcert.sweep','nbxcert.cli','nbxcert.oracles','nbxcert.certify') if m in sys.modules];"
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "torch" not in os.environ.get("PYTHONPATH", "")


def test_the_first_launch_registers_servings_lookup_and_a_served_launch_loads_no_sweep(tmp_path):
    """The kernel layer asks the server `import nbxcert` registered: on the first launch it loads serving and puts
    serving's `config_for` in its own place (later launches call it with no import). A launch served its default
    (no certificate, NBXCERT_UNCERTIFIED=default) loads no sweep (the kernel family's module holds its oracle: that
    one is the kernel's, not serving's)."""
    code = (
        "import sys; import numpy as np; from nbxcert.kernels import rows, server; from nbxcert.kernels.tensor import"
        " from_numpy; assert 'nbxcert.serving' not in sys.modules;"
        "x = from_numpy(np.ones((2, 40), np.float16), 'float16'); w = from_numpy(np.ones(40, np.float16), 'float16');"
        "rows.rmsnorm(x, w); import nbxcert.serving as s; assert server.registered() is s.config_for;"
        "bad = [m for m in ('nbxcert.sweep', 'nbxcert.runner', 'nbxcert.cli', 'nbxcert.certify') if m in sys.modules];"
        "assert not bad, bad"
    )
    env = {**os.environ, "NBXCERT_BACKEND": "interpreter", "NBXCERT_UNCERTIFIED": "default"}
    env.update(NBXCERT_CERTIFIED_DIR=str(tmp_path / "none"), NBXCERT_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr


def test_an_interrupted_verify_reports_the_keys_it_reached(serving, backend, monkeypatch):
    """An interrupt (`timeout -s INT` on a long GPU run) ends verify with what it found so far, never a lost report:
    the line says how many keys were reached, and the report is not ok."""
    if backend.name != "interpreter":
        pytest.skip("the demo certificates are conformance certificates of cpu/interpreter")
    from nbxcert.kernels import check
    from nbxcert.profiles import get_profile
    from nbxcert.verify import verify
    from nbxcert.workload import load_workload, workload_keys

    keys = workload_keys(load_workload("demo"), get_profile("cpu/interpreter"))[:4]
    real, calls = check.run_checked, []

    def interrupted_at_the_third(*args, **kwargs):  # two checks a key: the third is the second key's first
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(check, "run_checked", interrupted_at_the_third)
    certs = Path(__file__).resolve().parents[2] / "certificates"
    report = verify("interpreter", keys, [certs], certified_only=True)
    assert (report.keys, report.served, report.interrupted_of, report.ok) == (2, 2, 4, False)
    assert report.line().endswith("0 missing, 0 mismatched; interrupted: 2 of 4 keys reached")


def test_verify_and_warm_leave_the_serving_settings_as_they_found_them(serving, backend, monkeypatch, tmp_path):
    """`verify --dir D --certified-only` and `warm --dir D` run inside a process that serves (the CLI in-process, a
    test, an application) configure serving for their own run only: afterwards the search path and certified-only
    mode are the environment's again (before, a later launch kept searching D only)."""
    if backend.name != "interpreter":
        pytest.skip("the demo certificates are conformance certificates of cpu/interpreter")
    from nbxcert.profiles import get_profile
    from nbxcert.verify import verify
    from nbxcert.warm import warm
    from nbxcert.workload import load_workload, workload_keys

    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(mine))
    serving.reset()
    before = serving.search_path()
    assert before[0] == mine and serving.state().certified_only is False
    keys = workload_keys(load_workload("demo"), get_profile("cpu/interpreter"))[:1]
    certs = Path(__file__).resolve().parents[2] / "certificates"
    assert verify("interpreter", keys, [certs], certified_only=True).ok
    assert serving.search_path() == before and serving.state().certified_only is False
    warm("interpreter", keys, [certs])
    assert serving.search_path() == before
    serving.configure(dirs=[certs])  # configure itself stays in force until the next configure
    warm("interpreter", keys, [mine])
    assert serving.search_path() == [certs]
    serving.configure()


@pytest.mark.parametrize("mode, made, served", [("default", 0, "default"), ("sweep", 1, "sweep")])
def test_verify_makes_a_sweeps_inputs_only_for_a_sweep(user_kernel, serving, monkeypatch, tmp_path, mode, made, served):
    """Bug: verify made the inputs of a run-time sweep (at the bucket's largest member) for every key with no
    certificate, also under NBXCERT_UNCERTIFIED=default, where nothing is swept: minutes under the interpreter for
    tinyllama-1.1b's largest problems, for nothing. And such a key was reported as swept (`served: sweep`, counted
    in `swept`) though it ran the kernel's untuned default."""
    from nbxcert.kernels import check
    from nbxcert.keys import parse_key
    from nbxcert.verify import verify

    monkeypatch.setenv("NBXCERT_UNCERTIFIED", mode)
    serving.reset()
    real, made_inputs = user_kernel.randn, []

    def counting_randn(*args, **kwargs):
        made_inputs.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(user_kernel, "randn", counting_randn)
    monkeypatch.setattr(check, "run_checked", lambda *args, **kwargs: {})  # the checks make inputs of their own
    empty = tmp_path / "none"
    empty.mkdir()
    key = parse_key("user_scale[n=1000;float32,float32]@v1")
    report = verify("interpreter", [key], [empty], certified_only=False, modules=["user_kernel"])
    assert report.ok and len(made_inputs) == made
    assert [r.served for r in report.results] == [served]
    assert (report.swept, report.defaulted) == ((0, 1) if mode == "default" else (1, 0))
    assert ("1 on the kernel's default" in report.line()) is (mode == "default")


def test_configure_device_names_the_certificates_served_instead_of_the_launch_devices():
    """A process that cross-compiles for a GPU it does not have (bench_host.py) names the device whose certificates
    it serves; `configure()` with no device gives the launch device's back."""
    from nbxcert import serving
    from nbxcert.serving import lookup

    try:
        serving.configure(device=("hopper", "141GB"))
        profile, memory_class = lookup.profile_in_force()
        assert (profile.key, memory_class) == ("nvidia/hopper", "141GB")
    finally:
        serving.configure()
        serving.reset()
    assert lookup.profile_in_force()[0].key != "nvidia/hopper" or lookup.profile_in_force()[1] != "141GB"


def test_a_card_that_finds_no_key_of_its_class_is_told_what_the_others_hold(tmp_path, capsys):
    """An H100 (80GB class) serving from certificates made on an H200 (141GB) served none of them, and its line said
    only '0 keys': now it says what the directories hold for the other classes, and what to do."""
    import json

    from nbxcert import certificates, serving

    made_on_h200 = tmp_path / "nvidia" / "hopper"
    made_on_h200.mkdir(parents=True)
    shipped = Path(__file__).resolve().parents[2] / "certificates" / "nvidia" / "hopper"
    cert = json.loads((shipped / "rmsnorm.float16.json").read_text())
    # the shipped H200 entries alone (the shipped file also holds H100 entries beside them)
    cert["entries"] = {k: certificates.own(e) for k, e in cert["entries"].items() if e["memory_class"] == "141GB"}
    assert cert["entries"]
    (made_on_h200 / "rmsnorm.float16.json").write_text(json.dumps(cert))
    try:
        for memory_class, says in (("80GB", True), ("141GB", False)):
            serving.reset()
            serving.configure(device=("hopper", memory_class), dirs=[tmp_path])
            st = serving.state()
            line = next(x for x in capsys.readouterr().err.splitlines() if "[nbxcert] certified:" in x)
            assert (len(st.index) == 0) is says
            assert ("of the 141GB class, not served on this card" in line) is says, line
            if says:
                assert "nbxcert certify --profile hopper" in line
    finally:
        serving.configure()
        serving.reset()


def test_certify_keeps_another_memory_classs_entry_beside_its_own(user_kernel, certified_dir, tmp_path):
    """A key certified on a card of another memory class than its entry's keeps both entries (an H100's beside an
    H200's), the key's line says so, and each class's index serves its own; a forced run on the same class replaces
    only that class's entry."""
    import json
    import shutil

    from nbxcert import certificates
    from nbxcert.certify import certify
    from nbxcert.index import load_index
    from nbxcert.keys import parse_key

    out = tmp_path / "certs"
    shutil.copytree(certified_dir, out)
    (path,) = out.glob("cpu/interpreter/*.json")
    doc = json.loads(path.read_text())
    for entry in doc["entries"].values():
        entry["memory_class"] = "80GB"  # as if made on another card's class
    path.write_text(json.dumps(doc))
    key = parse_key("user_scale[n=1000;float32,float32]@v1")
    report = certify("interpreter", [key], out, force=True, modules=["user_kernel"])
    assert report.ok and report.keys[0].status == "certified"
    assert report.keys[0].reason == "kept beside the 80GB class's entry"
    held = certificates.load_file(path).entries[key.text()]
    assert sorted(certificates.class_entries(held)) == ["80GB", "cpu"]
    assert held["memory_class"] == "80GB" and held["other_classes"]["cpu"]["memory_class"] == "cpu"
    for cls in ("80GB", "cpu"):
        index = load_index([out], "cpu/interpreter", cls, tmp_path / f"cache-{cls}", [])
        assert index.get(key.text())["memory_class"] == cls
    again = certify("interpreter", [key], out, force=True, modules=["user_kernel"])
    assert again.keys[0].reason == "kept beside the 80GB class's entry"
    after = certificates.load_file(path).entries[key.text()]
    assert {k: v for k, v in after.items() if k != "other_classes"} == {
        k: v for k, v in held.items() if k != "other_classes"
    }  # the 80GB entry untouched by the cpu class's run
    skipped = certify("interpreter", [key], out, modules=["user_kernel"])
    assert skipped.keys[0].status == "skipped"  # its own class's entry is found: a rerun skips it
