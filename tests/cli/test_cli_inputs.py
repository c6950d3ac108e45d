"""The command line as a new user meets it: every bad input refused before any work starts in one line on stderr that
names the value and the next step (exit 1), Typer's own usage errors with exit 2, gates that never pass on nothing,
output never read as Rich markup nor cut, progress on stderr when it is not a terminal, a record per key in
`verify --json` and `coverage --json`.

CLI tests run the real command, in this process through Typer's `CliRunner` (cheap) or in a subprocess where the
output must really be a pipe, and assert the exit code, the lines that must appear and the ones that must not. Each
test names the bug it guards against (the issue "The CLI, tried as a new user would").
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from clitools import check, check_json
from typer.testing import CliRunner

from nbxcert import cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHIPPED = ROOT / "certificates"
MISSING_FIELD = "rmsnorm[n_cols=64;float16,float16]@v1"
RMSNORM = "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1"  # a key of the demo workload, certified in the shipped dir
SOFTMAX = "softmax[mask=none,n_cols=256,n_rows=1;float16]@v1"  # another


@pytest.fixture(autouse=True, scope="module")
def _interpreter(backend):
    """The backend is fixed before a census command runs in this process (it would fix the cross-compiling one)."""
    if backend.name != "interpreter":
        pytest.skip("the CPU command line (the interpreter profile)")
    sys.path.insert(0, str(FIXTURES))


def nbx(*args, env: dict | None = None, cwd: Path | None = None) -> SimpleNamespace:
    """The command run in this process, with its environment's NBXCERT_* variables cleared first."""
    full = {k: None for k in os.environ if k.startswith("NBXCERT_")}
    full.update({"NBXCERT_BACKEND": "interpreter", "NBXCERT_UNCERTIFIED": "default", **(env or {})})
    here = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        r = CliRunner().invoke(cli.app, [str(a) for a in args], env=full)
    finally:
        os.chdir(here)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return SimpleNamespace(stdout=r.stdout, stderr=r.stderr, returncode=r.exit_code)


def nbx_piped(*args, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command in a subprocess, its stdout and stderr pipes (as in CI), COLUMNS unset."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_") and k != "COLUMNS"}
    full.update(NBXCERT_BACKEND="interpreter", PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]), **(env or {}))
    cmd = [sys.executable, "-m", "nbxcert", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=cwd, timeout=300)


def refused(r, *must: str, must_not=()) -> str:
    """Exit 1 with exactly one `nbxcert:` line on stderr, holding every text of `must`; that line."""
    check(r, 1, must=must, must_not=must_not)
    lines = [x for x in r.stderr.splitlines() if x.startswith("nbxcert:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


# --- keys are checked against their kernel and the profile's ladders --------------------------------------------------
@pytest.mark.parametrize("command", ["keys", "certify", "verify", "warm", "coverage"])
def test_a_key_missing_a_field_is_refused_by_every_command(command, tmp_path):
    # bug: certify/verify/census ended in `KeyError: 'n_rows'` (keys.py) while `keys --key` accepted the same text
    extra = ["--out", tmp_path / "out"] if command == "certify" else []
    r = nbx(command, "--profile", "interpreter", "--key", MISSING_FIELD, *extra)
    refused(r, f"nbxcert: bad launch key: key '{MISSING_FIELD}' lacks key field n_rows", "the fields n_cols, n_rows")
    assert not (tmp_path / "out").exists()


def test_census_refuses_a_key_missing_a_field_in_one_line():
    # bug: `nbxcert census --key` with the key above ended in the same KeyError traceback
    r = nbx_piped("census", "--profile", "hopper", "--key", MISSING_FIELD)
    refused(r, "lacks key field n_rows")


def test_a_key_off_the_ladder_is_refused_naming_its_rung(tmp_path):
    # bug: certify certified `n_rows=7` (a size no launch keys: it rounds up to 8) into an entry validate refused
    r = nbx("certify", "--profile", "interpreter", "--key", RMSNORM.replace("n_rows=8", "n_rows=7"), "--out", tmp_path)
    line = refused(r, "n_rows=7 is not a rung of cpu/interpreter's 'rows' ladder", f"has the key '{RMSNORM}'")
    assert "use n_rows=8" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "key, says",
    [
        ("rmsnorm[n_cols=64,n_rows=8;float16]@v1", "dtypes float16 are not among rmsnorm's"),
        ("rmsnorm[n_cols=none,n_rows=8;float16,float16]@v1", "n_cols=none is a word, but rmsnorm's n_cols is a size"),
        ("softmax[mask=1,n_cols=64,n_rows=8;float16]@v1", "mask=1 is a number, but softmax's mask is a word"),
        ("rmsnorm[n_cols=64,n_rows=8,x=1;float16,float16]@v1", "has field x that rmsnorm does not key on"),
        ("rmsnorm[n_cols=9223372036854775808,n_rows=8;float16,float16]@v1", "above 2**63 - 1"),
        # bug: decode attention's prune divided by zero: a ZeroDivisionError traceback from certify
        ("decode_attention[batch=2,head_dim=64,heads=1,kv_heads=0,kv_len=32;float16]@v1", "ZeroDivisionError"),
        ("nosuch[n=1;float16]@v1", "no kernel named 'nosuch'"),
    ],
)
def test_keys_no_launch_forms_are_refused_before_any_work(key, says, tmp_path):
    r = nbx("certify", "--profile", "interpreter", "--key", key, "--out", tmp_path / "out")
    refused(r, says)
    assert not (tmp_path / "out").exists()


def test_a_key_above_the_top_rung_is_its_own_bucket_and_accepted():
    r = nbx("keys", "--profile", "interpreter", "--key", "rmsnorm[n_cols=64,n_rows=65537;float16,float16]@v1")
    check(r, 0, must=["rmsnorm[n_cols=64,n_rows=65537;float16,float16]@v1"])


# --- gates never pass on nothing --------------------------------------------------------------------------------------
def test_an_empty_keys_file_fails_the_coverage_gate(tmp_path):
    # bug: `coverage --keys empty.jsonl` printed `0/0 keys certified (100.0%)` and exited 0, so a smoke test that
    # recorded nothing passed the README's GitHub Actions step
    empty = tmp_path / "keys.jsonl"
    empty.write_text("")
    r = nbx("coverage", "--profile", "interpreter", "--keys", empty, "--dir", SHIPPED, "--min", "1.0")
    refused(r, f"keys file {empty} holds no keys", f"NBXCERT_KEY_RECORD={empty}", must_not=["100.0%"])
    r = nbx("coverage", "--profile", "interpreter", "--keys", tmp_path)
    refused(r, f"keys file {tmp_path} is not a regular file")  # was: "does not exist"


def test_a_kernel_filter_that_matches_nothing_is_an_error(tmp_path):
    # bug: `certify --kernels rmsnrom` matched nothing and exited 0 with `certified 0`
    r = nbx("certify", "--profile", "interpreter", "--workload", "demo", "--kernels", "rmsnrom", "--out", tmp_path)
    refused(r, "nbxcert: unknown kernel: no kernel named 'rmsnrom'", "did you mean rmsnorm?", must_not=["certified 0"])
    r = nbx(
        "coverage",
        "--profile",
        "interpreter",
        "--workload",
        "demo",
        "--kernels",
        "fault_probe",
        "--spec",
        "faulty_kernels",
    )
    refused(r, "none of the 23 keys asked for is a key of --kernels fault_probe")
    refused(nbx("keys", "--profile", "interpreter", "--workload", "demo", "--kernels", "rope,"), "has an empty name")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["coverage", "verify", "warm"])
def test_a_certificate_directory_that_is_not_there_is_refused(command, tmp_path):
    # bug: `coverage --dir /nonexistent` listed every key as missing instead of refusing the directory
    missing = tmp_path / "nonexistent"
    r = nbx(command, "--profile", "interpreter", "--workload", "demo", "--dir", missing)
    refused(r, f"--dir {missing}: no such directory", must_not=["missing:"])
    r = nbx(command, "--profile", "interpreter", "--workload", "demo", env={"NBXCERT_CERTIFIED_DIR": str(missing)})
    refused(r, f"NBXCERT_CERTIFIED_DIR names {missing}: no such directory")


def test_show_refuses_a_directory_that_is_not_there(tmp_path):
    refused(nbx("show", RMSNORM, "--dir", tmp_path / "nope"), "no such directory")


def test_an_empty_shard_is_refused():
    args = ("verify", "--profile", "interpreter", "--key", RMSNORM, "--dir", SHIPPED, "--certified-only")
    shares = {i: nbx(*args, "--shard", f"{i}/2").returncode for i in (0, 1)}
    assert sorted(shares.values()) == [0, 1], shares  # the key is in one share; the other holds none of it
    empty = next(i for i, code in shares.items() if code == 1)
    refused(nbx(*args, "--shard", f"{empty}/2"), f"--shard {empty}/2 holds none of the 1 keys asked for")


def test_shards_of_a_workload_cover_each_key_once_and_are_even():
    """sd-unet-block's 32 keys over 8 shards: every key in one shard, each shard 4 keys (each key's shard by its digest
    alone gave 0 to 11), and a key's shard the same in every process that forms the same keys."""
    from nbxcert.certify import shard_keys
    from nbxcert.profiles import get_profile
    from nbxcert.workload import load_workload, workload_keys

    keys = workload_keys(load_workload("sd-unet-block"), get_profile("hopper"))
    shares = [[k.text() for k in shard_keys(keys, (i, 8))] for i in range(8)]
    assert sorted(t for share in shares for t in share) == sorted(k.text() for k in keys)
    assert [len(share) for share in shares] == [len(keys) // 8] * 8
    assert shares[3] == [k.text() for k in shard_keys(list(reversed(keys)), (3, 8))][::-1]


def test_index_check_of_a_directory_with_no_certificates_fails(tmp_path):
    refused(nbx("index", "check", tmp_path, "--cache", tmp_path), "holds no certificates: no index to check")


# --- certify writes only where --out says -----------------------------------------------------------------------------
def test_certify_without_out_refuses_and_writes_nothing(tmp_path):
    # bug: --out defaulted to `certificates`, so `certify` run from a checkout rewrote the shipped certificates
    r = nbx("certify", "--profile", "interpreter", "--key", RMSNORM, cwd=tmp_path)
    refused(r, "--out is not given", "give --out DIR")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, says", [("file", "exists and is not a directory"), ("under-file", "is a file")])
def test_certify_refuses_an_out_it_cannot_write(make, says, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    out = f if make == "file" else f / "sub"
    refused(nbx("certify", "--profile", "interpreter", "--key", RMSNORM, "--out", out), says)


# --- numbers, paths and variables -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--jobs", "0", "--jobs 0: give a count of worker processes from 1 to 1024"),  # was: silently the CPU count
        ("--jobs", "-1", "--jobs -1"),  # was: certify with no runner
        ("--jobs", "99999999999999999999", "--jobs 99999999999999999999"),
        ("--timeout", "nan", "--timeout nan"),
        ("--timeout", "-1", "--timeout -1.0"),  # was: every candidate refused as a timeout
        ("--timeout", "1e309", "--timeout inf"),
        ("--shard", "\u0663/4", "is not i/n"),  # was: read as 3/4 (int() takes Arabic-Indic digits)
        ("--shard", "0/0", "need 0 <= i < n"),
    ],
)
def test_numeric_options_are_checked_before_work(option, value, says, tmp_path):
    r = nbx("certify", "--profile", "interpreter", "--workload", "demo", "--out", tmp_path, option, value)
    refused(r, says)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["nan", "2", "-0.5"])
def test_coverage_min_is_a_fraction(value):
    refused(nbx("coverage", "--profile", "interpreter", "--workload", "demo", "--min", value), "is not a fraction")


def test_output_paths_are_checked_before_work(tmp_path):
    r = nbx("coverage", "--profile", "interpreter", "--workload", "demo", "--junit-xml", tmp_path / "no" / "x.xml")
    refused(r, "--junit-xml", "does not exist", must_not=["keys certified"])
    refused(nbx("stale", SHIPPED, "--out", tmp_path), f"--out {tmp_path} is a directory")
    (tmp_path / "f").write_text("x")
    refused(nbx("index", "build", SHIPPED, "--cache", tmp_path / "f"), "--cache", "exists and is not a directory")


@pytest.mark.parametrize(
    "name, value, command",
    [
        ("NBXCERT_CACHE_DIR", "FILE", "coverage"),
        ("NBXCERT_CACHE_DIR", "FILE/sub", "verify"),
        ("NBXCERT_KEY_RECORD", "DIR", "verify"),
        ("NBXCERT_KEY_RECORD", "DIR/none/keys.jsonl", "warm"),
    ],
)
def test_environment_variables_that_name_paths_are_checked(name, value, command, tmp_path):
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "DIR").mkdir()
    path = str(tmp_path / value)
    r = nbx(command, "--profile", "interpreter", "--key", RMSNORM, "--dir", SHIPPED, env={name: path})
    refused(r, f"{name} {path}")


def test_spec_names_that_are_not_modules_are_one_line(tmp_path, monkeypatch):
    # bug: `--spec ''` raised ValueError and `--spec .x` TypeError from importlib: tracebacks
    refused(nbx("kernels", "--spec", ""), "--spec '' is not a module name")
    refused(nbx("kernels", "--spec", ".x"), "--spec '.x' is not a module name")
    (tmp_path / "broken_spec_mod.py").write_text("raise RuntimeError('half-written module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    refused(nbx("kernels", "--spec", "broken_spec_mod"), "importing it raised RuntimeError: half-written module")


@pytest.mark.parametrize(
    "args",
    [
        ["keys"],  # --profile missing
        ["certify", "--profile", "interpreter", "--jobs", "abc"],
        ["coverage", "--profile", "interpreter", "--min", "x"],
        ["keys", "--profile", "interpreter", "--nosuch"],
    ],
)
def test_typer_usage_errors_keep_exit_code_2(args):
    r = nbx(*args)
    check(r, 2)


def test_no_traceback_without_nbxcert_debug_and_one_with_it():
    r = nbx_piped("certify", "--profile", "interpreter", "--key", MISSING_FIELD, "--out", "x")
    refused(r, "lacks key field n_rows")
    r = nbx_piped(
        "certify", "--profile", "interpreter", "--key", MISSING_FIELD, "--out", "x", env={"NBXCERT_DEBUG": "1"}
    )
    assert r.returncode == 1 and "Traceback" in r.stderr and "KeyParseError" in r.stderr


# --- every command that names kernels takes --spec --------------------------------------------------------------------
PROBE = "fault_probe[n=300;float32]@v1"


@pytest.fixture()
def probe_dir(tmp_path):
    import certs

    certs.write_probe(tmp_path / "probe", {PROBE: certs.probe_entry(300)})
    return tmp_path / "probe"


def test_a_kernel_of_ones_own_is_named_by_every_command_with_spec(probe_dir):
    # bug: verify, coverage, warm and keys had no --spec, so a kernel certified with --spec could not be verified
    spec = ("--spec", "faulty_kernels")
    check(nbx("keys", "--profile", "interpreter", "--key", PROBE, *spec), 0, must=[PROBE])
    check(nbx("kernels", *spec, "--json"), 0, must=['"name": "fault_probe"'])
    r = nbx("coverage", "--profile", "interpreter", "--key", PROBE, "--dir", probe_dir, *spec)
    check(r, 0, must=["1/1 keys certified"])
    r = nbx("warm", "--profile", "interpreter", "--key", PROBE, "--dir", probe_dir, *spec)
    check(r, 0, must=["1 keys", "0 missing, 0 failed"])
    r = nbx("verify", "--profile", "interpreter", "--key", PROBE, "--dir", probe_dir, "--certified-only", *spec)
    check(r, 0, must=["1 keys, 1 served, 0 swept at run time, 0 missing, 0 mismatched"])
    check(nbx("show", PROBE, "--dir", probe_dir, *spec), 0, must=["BLOCK=64,FAULT=0,warps=4,stages=1"])


def test_without_spec_a_kernel_of_ones_own_is_unknown_with_the_hint(probe_dir):
    r = nbx_piped("verify", "--profile", "interpreter", "--key", PROBE, "--dir", probe_dir)
    refused(r, "no kernel named 'fault_probe'", "--spec MODULE")


# --- output: verbatim, never cut, progress when piped -----------------------------------------------------------------
def test_keys_are_printed_verbatim_and_whole_when_piped():
    # bug: Rich read `[n_cols=...;...]` as markup, so tables printed `rmsnorm@v1` for every rmsnorm key, and piped
    # tables cut keys at 80 columns (`decode_attent…`)
    r = nbx_piped("keys", "--profile", "interpreter", "--workload", "demo")
    check(r, 0, must_not=["rmsnorm@v1", "embedding@v1", "…"])
    keys = [
        json.loads(x)["key"]
        for x in nbx("keys", "--profile", "interpreter", "--workload", "demo", "--json").stdout.splitlines()
    ]
    assert len(keys) == 23
    lines = r.stdout.splitlines()
    for k in keys:
        assert any(k in line for line in lines), k  # each key whole, on one line


def test_a_narrow_terminal_wraps_a_cell_and_never_cuts_it(monkeypatch):
    from rich.console import Console
    from rich.table import Table

    key = "decode_attention[batch=2,head_dim=64,heads=1,kv_heads=1,kv_len=32;float16]@v1"
    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=buf, force_terminal=True, width=40, color_system=None))
    t = Table("key")
    t.add_row(cli._cell(key))
    cli._show(t)
    text = buf.getvalue()
    assert "…" not in text
    assert key in "".join(c for c in text if c not in "│┃┏┓┗┛┡┩└┘━─╇┳┻┃ \n")


def test_certify_piped_prints_whole_keys_and_no_interpreter_warnings(tmp_path):
    # bug: the interpreter's `RuntimeWarning: divide by zero encountered in divide` leaked into certify's output, and
    # its summary table printed `softmax@v1`, the winner cut (`ROWS=1,VARIAN…`)
    r = nbx_piped("certify", "--profile", "interpreter", "--key", SOFTMAX, "--out", tmp_path / "certs", "--jobs", "1")
    check(
        r,
        0,
        must=[SOFTMAX, f"files under {tmp_path / 'certs' / 'cpu' / 'interpreter'}"],
        must_not=["RuntimeWarning", "softmax@v1", "…"],
    )
    assert any(SOFTMAX in line and "certified" in line and "stages=" in line for line in r.stdout.splitlines())
    check(nbx("validate", tmp_path / "certs"), 0, must=["1 file, 1 entry, 0 problems"])


def test_a_long_command_says_what_it_does_when_stderr_is_not_a_terminal(monkeypatch):
    # bug: piped (as in CI), `census` printed nothing for minutes
    import time

    from nbxcert.errors import UsageError

    def slow_census(profile, kernels, keys, jobs, strict, modules, timeout_s, progress=None):
        progress(1, 4)
        time.sleep(0.5)
        raise UsageError("stopped here by the test")

    monkeypatch.setattr(cli, "PROGRESS_S", 0.1)
    monkeypatch.setattr("nbxcert.census.run_census", slow_census)
    r = nbx("census", "--profile", "hopper", "--kernels", "rmsnorm")
    refused(r, "stopped here by the test")
    beats = [x for x in r.stderr.splitlines() if x.startswith("[nbxcert] census nvidia/hopper: 1/4 compiled (")]
    assert len(beats) >= 2, r.stderr


# --- verify --json and coverage --json: one record per key ------------------------------------------------------------
def test_verify_json_gives_a_verdict_per_key(tmp_path):
    # bug: `verify --json` had only totals, no verdict per key
    missing = "rmsnorm[n_cols=64,n_rows=4;float16,float16]@v1"  # on the ladder, not certified
    r = nbx(
        "verify",
        "--profile",
        "interpreter",
        "--key",
        RMSNORM,
        "--key",
        missing,
        "--dir",
        SHIPPED,
        "--certified-only",
        "--json",
        env={"NBXCERT_CACHE_DIR": str(tmp_path)},
    )
    check(r, 1)
    doc = json.loads(r.stdout)
    by_key = {rec["key"]: rec for rec in doc["results"]}
    assert list(by_key) == [RMSNORM, missing]
    ok = by_key[RMSNORM]
    assert ok["verdict"] == "passed" and ok["served"] == "certificate" and "warps=" in ok["config"]
    assert set(ok["error"]) == {"max_scaled", "max_abs", "max_rel"} and 0 <= ok["error"]["max_scaled"] <= 1
    assert by_key[missing]["verdict"] == "missing" and by_key[missing]["reason"]


def test_coverage_json_gives_a_record_per_key(tmp_path):
    missing = "rmsnorm[n_cols=64,n_rows=4;float16,float16]@v1"
    r = nbx(
        "coverage",
        "--profile",
        "interpreter",
        "--workload",
        "demo",
        "--key",
        missing,
        "--dir",
        SHIPPED,
        "--json",
        "--min",
        "0.5",
    )
    doc = check_json(r, 0)
    assert len(doc["results"]) == doc["keys"] == 24 and doc["dirs"] == [str(SHIPPED)]
    certified = [x for x in doc["results"] if x["verdict"] == "certified"]
    assert len(certified) == 23 and all(x["config"] and x["error"]["max_scaled"] <= 1 for x in certified)
    (gap,) = [x for x in doc["results"] if x["verdict"] == "missing"]
    assert gap["key"] == missing and "not certified for cpu/interpreter in" in gap["reason"]
    assert set(doc["older_code"]) <= {x["key"] for x in certified}  # made by code changed since: certified ones only


def test_merge_into_a_path_under_a_file_is_one_line(probe_dir, tmp_path):
    # bug (found by tests/cli/test_fuzz.py::test_cli_merge_fuzz): `merge file.txt/sub DIR` raised NotADirectoryError
    # from the lock's mkdir, a traceback
    (tmp_path / "file.txt").write_text("x")
    r = nbx("merge", tmp_path / "file.txt" / "sub", probe_dir, "--spec", "faulty_kernels")
    refused(r, f"OUT {tmp_path / 'file.txt' / 'sub'}: {tmp_path / 'file.txt'} is a file, not a directory")


# --- paths the OS cannot be asked about, and errors of the OS ---------------------------------------------------------
def _unprivileged() -> list[str]:
    """The prefix that runs a command without the power to read and search what its permissions forbid: none for a
    user other than root; for root, setpriv dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (skipped without it)."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("running as root without setpriv: permissions cannot be made to bite")
    if probe.returncode != 0:
        pytest.skip("running as root and setpriv cannot drop CAP_DAC_OVERRIDE here")
    return prefix


@pytest.fixture()
def locked(tmp_path):
    """A directory nobody may search (mode 000) in `tmp_path`; a copy of the shipped certificates beside it."""
    import shutil

    shutil.copytree(SHIPPED / "cpu" / "interpreter", tmp_path / "certs" / "cpu" / "interpreter")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked").chmod(0)
    yield tmp_path
    (tmp_path / "locked").chmod(0o755)


@pytest.mark.parametrize(
    "args, env, says",
    [
        (["keys", "--profile", "interpreter", "--keys", "locked/k.jsonl"], {}, "keys file locked/k.jsonl"),
        (["census", "--profile", "hopper", "--workload", "locked/w.yml"], {}, "workload file locked/w.yml"),
        (["validate", "locked/x"], {}, "certificate directory locked/x"),
        (["diff", "certs", "locked/x"], {}, "certificate directory locked/x"),
        (["merge", "out", "locked/x"], {}, "certificate directory locked/x"),
        (["stale", "locked/x"], {}, "certificate directory locked/x"),
        (["index", "check", "locked/x"], {}, "certificate directory locked/x"),
        (["coverage", "--profile", "interpreter", "--workload", "demo", "--dir", "locked/x"], {}, "--dir locked/x"),
        (["certify", "--profile", "interpreter", "--key", RMSNORM, "--out", "locked/x"], {}, "--out locked/x"),
    ],
)
def test_a_path_under_a_directory_that_cannot_be_searched_is_one_line(args, env, says, locked):
    # bug: Path.exists()/is_file()/is_dir() raise PermissionError for a path under a directory that cannot be searched
    # (Python 3.11): tracebacks from keys, census, validate, diff, merge, stale and index, and `--dir locked/x` was
    # said not to exist, `--out locked/x` not to name a directory
    r = subprocess.run(
        [*_unprivileged(), sys.executable, "-m", "nbxcert", *args],
        capture_output=True,
        text=True,
        cwd=locked,
        timeout=300,
        env={**os.environ, "NBXCERT_BACKEND": "interpreter", "NBXCERT_CACHE_DIR": str(locked / "cache"), **env},
    )
    refused(r, f"{says} cannot be reached (Permission denied)", "check the permissions of the directories")


def test_a_cache_directory_that_cannot_be_read_is_served_from_memory(locked):
    # bug: NBXCERT_CACHE_DIR naming a directory that cannot be searched raised PermissionError from the run-time
    # cache's is_file(): a traceback from `verify` (and a crash of an application's first launch); and `doctor` raised
    # on NBXCERT_CERTIFIED_DIR under it
    base = [*_unprivileged(), sys.executable, "-m", "nbxcert"]
    env = {**os.environ, "NBXCERT_BACKEND": "interpreter", "NBXCERT_UNCERTIFIED": "default"}
    verify = [*base, "verify", "--profile", "interpreter", "--key", RMSNORM, "--dir", "certs", "--certified-only"]
    r = subprocess.run(
        verify,
        capture_output=True,
        text=True,
        cwd=locked,
        timeout=300,
        env={**env, "NBXCERT_CACHE_DIR": str(locked / "locked")},
    )
    check(r, 0, must=["1 keys, 1 served", "serving from memory"])
    r = subprocess.run(
        [*base, "doctor"],
        capture_output=True,
        text=True,
        cwd=locked,
        timeout=300,
        env={**env, "NBXCERT_CERTIFIED_DIR": "locked/x", "NBXCERT_CACHE_DIR": str(locked / "cache")},
    )
    check(r, 0, must=["certificate directory locked/x cannot be reached (Permission denied)"])
    # the default cache under XDG_CACHE_HOME: `index check` raised PermissionError opening an index under it
    env = {k: v for k, v in env.items() if k != "NBXCERT_CACHE_DIR"}
    r = subprocess.run(
        [*base, "index", "check"],
        capture_output=True,
        text=True,
        cwd=locked,
        timeout=300,
        env={**env, "XDG_CACHE_HOME": str(locked / "locked")},
    )
    refused(r, "the index cache (XDG_CACHE_HOME, else ~/.cache)", "cannot be reached (Permission denied)")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail: ENOSPC)")
def test_an_error_of_the_os_while_working_is_one_line():
    # bug: an OSError no check can foresee (here a write to a full disk) ended in a traceback
    r = nbx("coverage", "--profile", "interpreter", "--workload", "demo", "--dir", SHIPPED, "--junit-xml", "/dev/full")
    refused(r, "nbxcert: system error: No space left on device: /dev/full", "NBXCERT_DEBUG=1")


# --- every refusal names the next step --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, says",
    [
        # a directory was said not to exist, with no next step
        (["keys", "--profile", "interpreter", "--workload", "{tmp}"], "workload file {tmp} is not a regular file"),
        (["keys", "--profile", "interpreter", "--workload", "{tmp}/w.yml"], "a workload is a mapping, got str"),
        # a file was said not to exist
        (["index", "build", "{tmp}/w.yml"], "certificate directory {tmp}/w.yml is not a directory"),
        (["index", "check", "{tmp}"], "holds no certificates: no index to check"),
        # ten digits were said not to be i/n
        (["verify", "--profile", "interpreter", "--key", RMSNORM, "--shard", "1/10000000000"], "at most 999999999"),
        (["verify", "--profile", "interpreter", "--key", RMSNORM, "--shard", "2/2"], "need 0 <= i < n"),
        (["certify", "--profile", "interpreter", "--key", RMSNORM, "--out", "{tmp}", "--timeout", "nan"], "--timeout"),
        (["merge", "{tmp}/out", str(SHIPPED), "--prefer", "NEWEST"], "--prefer 'NEWEST' is not a rule"),
        (["export", "--format", "csv", "--profile", "hopper", "--out", "{tmp}/e"], "--format 'csv'"),
        (["keys", "--profile", "interpreter"], "no keys asked for"),
    ],
)
def test_every_refusal_names_the_next_step(args, says, tmp_path):
    # bug: these lines said what failed but not what to do next (`nbxcert: invalid workload: w.yml: a workload is a
    # mapping, got str`); some named the wrong fault (a directory "does not exist", `--shard 1/10000000000` "is not
    # i/n")
    (tmp_path / "w.yml").write_text("just text\n")
    line = refused(nbx(*[a.format(tmp=tmp_path) for a in args]), says.format(tmp=tmp_path))
    assert " -> " in line and len(line.split(" -> ")[1]) > 10, line


def test_an_unknown_uncertified_mode_names_the_next_step():
    r = nbx("verify", "--profile", "interpreter", "--key", RMSNORM, env={"NBXCERT_UNCERTIFIED": "bogus"})
    refused(r, "NBXCERT_UNCERTIFIED=bogus is not a mode -> set it to one of sweep, default")


# --- gates never pass on nothing --------------------------------------------------------------------------------------
def test_validate_stale_and_merge_refuse_a_directory_with_no_certificates(tmp_path):
    # bug: `validate EMPTY` printed "0 files, 0 entries, 0 problems" and exited 0 (the CI gate passed on a wrong
    # path), `stale EMPTY` "0 of 0 certified winners ..." exit 0, `merge OUT EMPTY` merged 0 entries, exit 0
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no certificate here\n")
    refused(nbx("validate", tmp_path / "empty"), "holds no certificate files: nothing to validate", "--out")
    refused(nbx("stale", tmp_path / "empty"), "holds no certified entries: nothing to judge")
    refused(nbx("stale", SHIPPED, "--profile", "volta"), "holds no certified entries for nvidia/volta")
    refused(nbx("merge", tmp_path / "out", tmp_path / "empty"), "hold no certificate files", "nothing to merge")
    assert not (tmp_path / "out").exists()


# --- progress of the commands that read certificate directories -------------------------------------------------------
@pytest.mark.parametrize(
    "args, engine, says",
    [
        (["validate", str(SHIPPED)], "nbxcert.validate.validate", "[nbxcert] validate "),
        (["merge", "OUT", str(SHIPPED)], "nbxcert.merge.merge", "[nbxcert] merge into "),
        (["stale", str(SHIPPED)], "nbxcert.stale.find_stale", "[nbxcert] stale "),
        (["diff", str(SHIPPED), str(SHIPPED)], "nbxcert.diff.diff", "[nbxcert] diff "),
        (["coverage", "--profile", "interpreter", "--workload", "demo"], "nbxcert.verify.coverage", "coverage cpu/"),
        (["index", "build", str(SHIPPED), "--cache", "OUT"], "nbxcert.cli._index_targets", "[nbxcert] index build "),
        (["doctor"], "nbxcert.doctor.run_doctor", "[nbxcert] doctor: "),
    ],
)
def test_the_commands_reading_certificate_directories_say_what_they_do_when_piped(
    args, engine, says, monkeypatch, tmp_path
):
    # bug: piped, `merge` of three copies of the shipped certificates printed nothing for 15 s on a 2-core machine
    # (only certify, verify, warm and census said what they were doing)
    import time

    from nbxcert.errors import UsageError

    def slow(*a, **k):
        time.sleep(0.5)
        raise UsageError("stopped here by the test", hint="none needed")

    monkeypatch.setattr(cli, "PROGRESS_S", 0.1)
    monkeypatch.setattr(engine, slow)
    r = nbx(*[str(tmp_path / "out") if a == "OUT" else a for a in args])
    refused(r, "stopped here by the test")
    beats = [x for x in r.stderr.splitlines() if x.startswith("[nbxcert] ") and says in x and x.endswith(" s)")]
    assert len(beats) >= 2, r.stderr


# --- a key of no registered kernel, a certificate of one's own kernel -------------------------------------------------
def test_show_of_a_key_of_no_registered_kernel_says_so(probe_dir):
    # bug: `show 'rmsnrom[...]'` said the key was not certified and to certify it (which cannot be done)
    r = nbx("show", RMSNORM.replace("rmsnorm", "rmsnrom"))
    line = refused(r, "key not certified", "no kernel named 'rmsnrom' is registered", "did you mean rmsnorm?")
    assert "--spec MODULE" in line and "certify it" not in line


def test_validate_of_a_certificate_of_ones_own_kernel_gives_the_spec_hint(probe_dir):
    # bug: without --spec, validate said "unknown kernel 'fault_probe' (registered: ...)" and no next step
    r = nbx_piped("validate", probe_dir)  # a process of its own: this one has fault_probe registered
    check(r, 1, must=["unknown kernel 'fault_probe'", "a kernel of your own: give --spec MODULE"])


def test_coverage_of_one_memory_class_counts_that_class_entries_only(tmp_path):
    """`--memory-class` counts what a card of that class is served: a key whose only entry is another class's is
    missing for it (coverage of any class counted it); a class none of the profile's cards has is refused."""
    import shutil

    certs = tmp_path / "certs"
    shutil.copytree(SHIPPED, certs)
    path = certs / "cpu" / "interpreter" / "rmsnorm.float16.json"
    doc = json.loads(path.read_text())
    moved = sorted(doc["entries"])[0]
    doc["entries"][moved]["memory_class"] = "80GB"  # as if made on another class's card
    path.write_text(json.dumps(doc))
    args = ("coverage", "--profile", "interpreter", "--workload", "demo", "--dir", certs, "--json", "--min", "0")
    every = check_json(nbx(*args), 0)
    mine = check_json(nbx(*args, "--memory-class", "cpu"), 0)
    assert every["certified"] == 23 and every["memory_class"] is None
    assert mine["certified"] == 22 and mine["memory_class"] == "cpu" and mine["missing"] == [moved]
    gap = next(x for x in mine["results"] if x["key"] == moved)
    assert "not certified for cpu/interpreter (cpu class) in" in gap["reason"]
    r = nbx("coverage", "--profile", "hopper", "--workload", "demo", "--memory-class", "90GB")
    check(r, 1, must=["--memory-class 90GB is not a class of nvidia/hopper's cards", "141GB, 80GB"])


def test_coverage_of_any_class_says_each_classs_count(tmp_path):
    """Without `--memory-class`, a profile whose cards are of two classes: the line counts a key certified on either
    (as the gate's first entries) and says how many each class holds, since a card is served its own class's only (a
    workload certified on an H100 read 100% where an H200 was served half of it)."""
    from nbxcert import certificates

    shipped = json.loads((SHIPPED / "nvidia" / "hopper" / "rmsnorm.float16.json").read_text())
    both = sorted(k for k, e in shipped["entries"].items() if "other_classes" in e)[:3]
    doc = dict(shipped, entries={})
    doc["entries"][both[0]] = shipped["entries"][both[0]]  # both classes
    doc["entries"][both[1]] = certificates.of_class(shipped["entries"][both[1]], "141GB")  # an H200's only
    doc["entries"][both[2]] = certificates.of_class(shipped["entries"][both[2]], "80GB")  # an H100's only
    certs = tmp_path / "certs" / "nvidia" / "hopper"
    certs.mkdir(parents=True)
    (certs / "rmsnorm.float16.json").write_text(json.dumps(doc))
    keys = [a for k in both for a in ("--key", k)]
    args = ("coverage", "--profile", "hopper", *keys, "--dir", tmp_path / "certs")
    report = check_json(nbx(*args, "--json"), 0)
    assert report["certified"] == 3 and report["by_memory_class"] == {"141GB": 2, "80GB": 2}
    check(nbx(*args), 0, must=["3/3 keys certified", "by memory class (a card is served its own): 141GB 2/3, 80GB 2/3"])
    one = check_json(nbx(*args, "--json", "--memory-class", "80GB", "--min", "0"), 0)
    assert one["certified"] == 2 and one["by_memory_class"] == {}


def test_coverage_min_minus_zero_is_zero():
    # bug: `--min -0` printed "minimum -0.0%"
    r = nbx("coverage", "--profile", "interpreter", "--workload", "demo", "--dir", SHIPPED, "--min", "-0")
    check(r, 0, must=["minimum 0.0%"], must_not=["-0.0%"])


def test_doctor_prints_its_problems_and_next_steps_verbatim(monkeypatch):
    # bug: doctor's problem and next-step rows were read as Rich markup: a certificate directory
    # `locked/[bold]x[/bold]` that cannot be reached printed as `locked/x`
    from nbxcert import doctor

    real = doctor.run_doctor

    def with_markup():
        report = real()
        report.problems.append("certificate directory locked/[bold]x[/bold] cannot be reached (Permission denied)")
        report.advice.append("look at [red]this[/red]")
        return report

    monkeypatch.setattr(doctor, "run_doctor", with_markup)
    check(nbx("doctor"), 0, must=["locked/[bold]x[/bold] cannot be reached", "look at [red]this[/red]"])


def test_index_build_that_cannot_write_its_index_fails(monkeypatch, tmp_path):
    # bug: when the index could not be written (a full disk, a cache directory root can list but not write), `index
    # build` printed "N keys -> PATH" for a PATH that was not there and exited 0
    import errno

    from nbxcert import index

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index, "atomic_write", full_disk)
    r = nbx("index", "build", SHIPPED, "--cache", tmp_path)
    refused(r, "was not written: cannot write the index cache", "No space left on device", must_not=["keys ->"])


@pytest.mark.parametrize("width", [0, 1, 5, 12])
def test_a_terminal_too_narrow_for_a_table_gets_one_row_a_line(monkeypatch, width):
    # bug: on a terminal of 5 columns (`COLUMNS=5`, or 0) Rich drew every cell empty: the keys were lost
    from rich.console import Console
    from rich.table import Table

    key = "decode_attention[batch=2,head_dim=64,heads=1,kv_heads=1,kv_len=32;float16]@v1"
    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=buf, force_terminal=True, width=width, color_system=None))
    t = Table("kernel", "key")
    t.add_row(cli._cell("decode_attention"), cli._cell(key))
    cli._show(t)
    assert any(key in line for line in buf.getvalue().splitlines()), buf.getvalue()


@pytest.mark.parametrize("name, value", [("COLUMNS", "99999999999"), ("TERMINAL_WIDTH", "abc"), ("COLUMNS", "0")])
def test_a_width_no_text_can_be_drawn_in_is_ignored(name, value):
    # bug: `COLUMNS=99999999999 nbxcert --help` ended in MemoryError and `TERMINAL_WIDTH=abc nbxcert --help` in
    # ValueError (tracebacks); `COLUMNS=0` printed an empty help
    r = nbx_piped("--help", env={name: value})
    check(r, 0, must=["Usage: ", "certify", "Certify Triton kernel launch configurations"])


@pytest.mark.parametrize(
    "bad, says",
    [
        ("rmsnorm[n_rows=8,n_cols=64;float16,float16]@v1", "write the fields sorted by name: n_cols=64,n_rows=8"),
        ("rmsnorm[n_cols=-64,n_rows=8;float16,float16]@v1", "n_cols='-64' must be a lower-case word"),
        ("rmsnorm[n_cols=64,n_rows=8;Float16,float16]@v1", "dtype 'Float16'"),
    ],
)
def test_a_bad_key_among_several_is_named(bad, says):
    # bug: "key fields ['n_rows', 'n_cols'] must be unique and sorted" named no key: given several --key, which one?
    refused(nbx("keys", "--profile", "interpreter", "--key", RMSNORM, "--key", bad), f"key '{bad}': ", says)


def test_a_named_pipe_that_nothing_reads_is_refused_not_waited_on(tmp_path):
    # bug: NBXCERT_KEY_RECORD naming a named pipe that nothing reads made verify wait for ever recording its first
    # key, and `coverage --junit-xml PIPE` waited for ever to write the report (found by the fuzz: a shard that never
    # finished)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(NBXCERT_BACKEND="interpreter", NBXCERT_CACHE_DIR=str(tmp_path / "cache"))
    base = [sys.executable, "-m", "nbxcert"]
    verify = [*base, "verify", "--profile", "interpreter", "--key", RMSNORM, "--dir", str(SHIPPED)]
    r = subprocess.run(
        verify, capture_output=True, text=True, timeout=120, env={**env, "NBXCERT_KEY_RECORD": str(pipe)}
    )
    refused(r, f"NBXCERT_KEY_RECORD {pipe} is a named pipe that nothing reads")
    coverage = [*base, "coverage", "--profile", "interpreter", "--key", RMSNORM, "--dir", str(SHIPPED)]
    r = subprocess.run([*coverage, "--junit-xml", str(pipe)], capture_output=True, text=True, timeout=120, env=env)
    refused(r, "nbxcert: system error: No such device or address", str(pipe))


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`nbxcert keys ... | head -1`: the reader closes the pipe; the command ends with 141 (as SIGPIPE would) and prints
    nothing (it printed a "system error ... check that path (permissions, free space)" line and exited 1)."""
    cmd = [sys.executable, "-m", "nbxcert", "keys", "--profile", "hopper", "--workload", "tinyllama-1.1b", "--json"]
    env = {**os.environ, "NBXCERT_BACKEND": "interpreter"}
    env.pop("NBXCERT_DEBUG", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # gone before the first line: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


def test_verify_reads_the_applications_certified_only_setting_and_refuses_a_dir_without_certificates(tmp_path):
    """NBXCERT_CERTIFIED_ONLY=1 is verify's setting too (a key with no certificate is missing, exit 1, as the
    application would refuse it; the flag's default had turned it into a sweep and exit 0), and a --dir that holds no
    certificate of the profile (the profile's own folder named) is refused: it served nothing, swept every key and
    passed."""
    uncertified = "rmsnorm[n_cols=64,n_rows=4;float16,float16]@v1"
    assert uncertified not in (SHIPPED / "cpu" / "interpreter" / "rmsnorm.float16.json").read_text()
    args = ("verify", "--profile", "interpreter", "--key", uncertified, "--dir", SHIPPED)
    r = nbx(*args, env={"NBXCERT_CERTIFIED_ONLY": "1"})
    assert r.returncode == 1 and "1 missing" in r.stdout, r.stdout + r.stderr
    deep = SHIPPED / "cpu" / "interpreter"
    r = nbx("verify", "--profile", "interpreter", "--key", RMSNORM, "--dir", deep)
    refused(r, f"--dir {deep} holds no cpu/interpreter certificate files: nothing to verify")


def test_a_spec_module_works_in_every_command_where_triton_is_not_told_to_interpret():
    """A user's `--spec` module imports Triton; `certify` chose nbxcert's backend before importing it, `keys`,
    `validate` and the other commands did not, and on a machine with no GPU they were refused ("Triton was imported
    before nbxcert chose its interpreter backend") unless TRITON_INTERPRET=1 was set by hand."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NBXCERT_BACKEND")}
    env["PYTHONPATH"] = os.pathsep.join([str(FIXTURES), *sys.path])
    key = "user_scale[n=4096;float32,float32]@v1"
    for args in (("keys", "--profile", "hopper"), ("kernels",)):
        cmd = [sys.executable, "-m", "nbxcert", *args, "--spec", "user_kernel"] + (
            ["--key", key] if args[0] == "keys" else []
        )
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-1000:]
        assert "user_scale" in r.stdout


# --- the on/off settings, warm's directory, the index commands --------------------------------------------------------
@pytest.mark.parametrize(
    "name, value",
    [
        ("NBXCERT_CERTIFIED_ONLY", "yes"),
        ("NBXCERT_CERTIFIED_ONLY", "2"),
        ("NBXCERT_STRICT_PROVENANCE", "true"),
        ("NBXCERT_DEBUG", "yes"),  # read as off: a user asking for the traceback got none, and no word why
    ],
)
def test_an_on_off_setting_other_than_1_or_0_is_refused_by_name(name, value):
    # bug: only `1` was on and every other value off, with no word: `NBXCERT_CERTIFIED_ONLY=yes nbxcert verify` swept
    # an uncertified key and passed (exit 0), as an application so configured served it swept
    uncertified = "rmsnorm[n_cols=64,n_rows=4;float16,float16]@v1"
    r = nbx("verify", "--profile", "interpreter", "--key", uncertified, "--dir", SHIPPED, env={name: value})
    refused(r, f"{name}={value} is neither 1 (on) nor 0 (off) -> set {name}=1 or {name}=0, or unset it")
    for off in ("", "0"):
        check(nbx("verify", "--profile", "interpreter", "--key", RMSNORM, "--dir", SHIPPED, env={name: off}), 0)


def test_serving_refuses_an_on_off_setting_other_than_1_or_0(monkeypatch, tmp_path):
    # bug: serving read `NBXCERT_STRICT_PROVENANCE=true` and `NBXCERT_CERTIFIED_ONLY=yes` as off
    from nbxcert import serving
    from nbxcert.errors import UsageError

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    for name, value in (("NBXCERT_CERTIFIED_ONLY", "yes"), ("NBXCERT_STRICT_PROVENANCE", "true")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            serving.reset()
            with pytest.raises(UsageError, match=f"{name}={value} is neither 1"):
                serving.state()
    serving.reset()


def test_warm_refuses_a_dir_without_certificates_of_the_profile():
    # bug: `warm --dir certificates/cpu/interpreter` (one level too deep) compiled nothing, listed every key missing
    # and exited 0, where verify refuses the same directory
    deep = SHIPPED / "cpu" / "interpreter"
    r = nbx("warm", "--profile", "interpreter", "--workload", "demo", "--dir", deep)
    refused(r, f"--dir {deep} holds no cpu/interpreter certificate files: nothing to compile", "name the directory")


def test_index_build_of_a_directory_with_no_certificates_fails(tmp_path):
    # bug: `index build EMPTY` said "no certificates, no index to build" and exited 0 (a deploy script's wrong path
    # passed, and every cold start built its index), where `index check EMPTY` fails
    refused(nbx("index", "build", tmp_path, "--cache", tmp_path / "c"), "holds no certificates: no index to build")
    assert not (tmp_path / "c").exists()


def test_index_check_refuses_an_index_of_other_certificates_under_its_name(tmp_path):
    # bug: `index check` verified the file's digests only: an index of another directory, profile or memory class
    # under this directory's name was "intact" (exit 0), while serving refused it and built its own
    import shutil

    mine = tmp_path / "mine" / "cpu" / "interpreter"
    mine.mkdir(parents=True)
    shutil.copy(SHIPPED / "cpu" / "interpreter" / "rmsnorm.float16.json", mine)
    cache = tmp_path / "cache"
    check(nbx("index", "build", tmp_path / "mine", "--cache", cache), 0)
    check(nbx("index", "build", SHIPPED, "--cache", tmp_path / "other"), 0)
    (name,) = cache.glob("cpu_interpreter.cpu.*.nbxidx")
    for other in sorted((tmp_path / "other").glob("*.nbxidx")):  # the shipped directory's, and other profiles'
        shutil.copy(other, name)
        r = nbx("index", "check", tmp_path / "mine", "--cache", cache)
        check(r, 1, must=[f"{name}: built for ", "(its name)", f"run `nbxcert index build {tmp_path / 'mine'}`"])
        assert "intact" not in r.stdout


def test_index_build_without_a_directory_builds_the_index_serving_reads(tmp_path):
    # bug: with no directory, `index build` built the shipped directory's index alone, and `index build D` D's alone;
    # a serving process with NBXCERT_CERTIFIED_DIR=D reads the index of D and the shipped directory together, so it
    # found neither and built its own at every cold start (in memory, on a read-only install), and `index check`
    # said "intact"
    import shutil

    from nbxcert import serving
    from nbxcert.index import load_index

    mine = tmp_path / "mine" / "cpu" / "interpreter"
    mine.mkdir(parents=True)
    shutil.copy(SHIPPED / "cpu" / "interpreter" / "rmsnorm.float16.json", mine)
    cache = tmp_path / "cache"
    env = {"NBXCERT_CERTIFIED_DIR": str(tmp_path / "mine"), "NBXCERT_CACHE_DIR": str(cache)}
    check(nbx("index", "build", env=env), 0, must=["cpu/interpreter cpu: "])
    built = sorted(cache.glob("*.nbxidx"))
    check(nbx("index", "check", env=env), 0, must=["intact"])
    os.environ.update(env)
    try:
        notices: list[str] = []
        index = load_index(serving.search_path(), "cpu/interpreter", "cpu", cache, notices)
    finally:
        for k in env:
            os.environ.pop(k)
    assert index.path in built and sorted(cache.glob("*.nbxidx")) == built and notices == []


def test_verify_json_names_its_shard_and_mode():
    # bug: the table's line says "(shard 0/2)"; the JSON of the same run did not say which share it judged
    r = nbx("verify", "--profile", "interpreter", "--workload", "demo", "--dir", SHIPPED, "--shard", "0/2", "--json")
    report = check_json(r, 0)
    assert report["shard"] == "0/2" and report["certified_only"] is False and report["keys"] == 12
