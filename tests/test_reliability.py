"""Reliability and security: faults survived, bad input refused, nothing lost, nothing executed.

- Faults during a sweep: the purpose-built `fault_sweep` kernel (`tests/fixtures/faulty_kernels.py`) fails in every
  way a candidate can (wrong results, no compile, an illegal address, a hang, results that vary between runs, more
  shared memory than the device has); one sweep refuses each with its own reason and certifies the correct candidate.
  Under the interpreter here; on the H200 the illegal address and the hang run for real (`gpu`).
- Kill/resume: `nbxcert certify` killed with SIGKILL at random points, then resumed: every file whole and valid,
  every key certified once (3 kills by default, 20 under `-m fuzz`).
- Concurrency: two certify runs and four key-recording processes write into one directory at once; nothing lost.
- Hostile certificates refused by the loader (and by `validate`) without allocating more than the file needs.
- Nothing read is ever executed: the source tree is scanned (`ast`) for pickle, eval/exec and data-named imports.
- Paths: links out of a certificate directory and `..` names are refused; files are written only where asked.
- Provenance on serving: a certification made with another Triton major, driver major or device profile is served
  with one notice, or refused (`ProvenanceMismatch`) under NBXCERT_STRICT_PROVENANCE=1; `nbxcert doctor` counts them.

The figures (faults injected and survived, kills and resumes, keys lost) are printed and, with
NBXCERT_RELIABILITY_REPORT=PATH, appended to PATH as JSON lines (tests/FUZZ.md quotes them).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clitools import check

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parent.parent
INTERPRETER_ENV = {"NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1"}
# a fast subset of the demo workload (`nbxcert keys --profile interpreter --workload demo --kernels ...`): 12 keys
DEMO_KERNELS = "rmsnorm,add_rmsnorm,embedding,silu_and_mul,softmax,rope"


def figures(name: str, **values) -> None:
    """Print a test's figures and append them to $NBXCERT_RELIABILITY_REPORT (JSON lines) when it is set."""
    line = json.dumps({"test": name, **values}, sort_keys=True)
    print(line)
    path = os.environ.get("NBXCERT_RELIABILITY_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@pytest.fixture(scope="module")
def faulty(backend):
    if backend.name != "interpreter":
        pytest.skip("the interpreter equivalents of the faults; the GPU run is test_on_the_gpu_...")
    sys.path.insert(0, str(FIXTURES))  # spawned workers inherit sys.path
    import faulty_kernels

    return faulty_kernels


@pytest.fixture(scope="module")
def certs():
    sys.path.insert(0, str(FIXTURES))
    import certs as module

    return module


def nbx(*args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real command line, under the interpreter, with tests/fixtures importable (`--spec faulty_kernels`)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    e.update(INTERPRETER_ENV, COLUMNS="250", PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    e.update(env or {})
    cmd = [sys.executable, "-m", "nbxcert", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)


# --- faults during a sweep --------------------------------------------------------------------------------------------
# FAULT -> (status, a part of its reason). One sweep, one key: each fault refused with its own reason.
INTERPRETER_FAULTS = {
    2: ("mismatch", "Mismatched elements: 257 / 257"),  # wrong everywhere, every run (257: the bucket's smallest)
    3: ("compile", "deliberate compile failure"),
    4: ("crash", "the worker process died"),  # reads 2**44 elements away: a segfault under the interpreter
    5: ("timeout", "no answer within"),
    6: ("mismatch", "Mismatched elements: 64 / 512"),  # nondeterministic: right at 257 (its first run), then wrong
    7: ("pruned", "max_shared_memory_per_block_optin=232448"),
}


def _sweep(faulty, profile, runners, compiler, timeout_s):
    from nbxcert.keys import LaunchKey
    from nbxcert.sweep import sweep_key

    # n=512 is a rung of the `rows` ladder: the bucket (256, 512] is checked at 257 and at 512, two launches in one
    # worker, so the nondeterministic candidate (right on its first launch only) is caught at the second
    key = LaunchKey("fault_sweep", (("n", 512),), ("float32",))
    return sweep_key(faulty.SWEEP_SPEC, key, profile, runners, compiler, seed=11, timeout_s=timeout_s)


def _tally(result, expected: dict) -> dict:
    by_fault = {o.config["FAULT"]: o for o in result.outcomes}
    for fault, (status, reason) in expected.items():
        o = by_fault[fault]
        assert (o.status, reason in o.reason) == (status, True), (fault, o.status, o.reason)
    survived = sum(by_fault[f].status == s for f, (s, _) in expected.items())
    return {
        "faults_injected": len(expected),
        "faults_survived": survived,
        "keys_lost": 0 if result.winner is not None else 1,
        "winner": result.winner.config.label() if result.winner else None,
    }


def test_nondeterministic_candidate_gives_different_results_on_two_runs_of_one_input(faulty):
    from nbxcert.kernels.check import run_checked
    from nbxcert.profiles import get_profile

    faulty._COUNTERS.clear()  # a fresh counter: the first launch of the process
    profile, cfg = get_profile("cpu/interpreter"), faulty.SWEEP_CANDIDATES[6]
    first, second = (run_checked(faulty.SWEEP_SPEC, cfg, {"n": 300}, ("float32",), profile, 5, "cpu") for _ in "12")
    assert first["out"].ok and not second["out"].ok
    assert "Mismatched elements: 64 / 300" in second["out"].report


def _first_run_sweep(faulty, monkeypatch=None, prefer_fault=None):
    from nbxcert import sweep as sweep_mod
    from nbxcert.keys import LaunchKey
    from nbxcert.profiles import get_profile
    from nbxcert.worker import Worker

    if prefer_fault is not None:  # the chooser picks the faulty candidate first, whatever the interpreter's timings
        real = sweep_mod.choose_winner

        def choose(final, default):
            first = [o for o in final if o.config["FAULT"] == prefer_fault]
            return (first[0], None) if first else real(final, default)

        monkeypatch.setattr(sweep_mod, "choose_winner", choose)
    key = LaunchKey(faulty.FIRST_RUN_SPEC.name, (("n", 100),), ("float32",))  # 100: an exact key, checked once
    runner = Worker(INTERPRETER_ENV, ["faulty_kernels"])
    try:
        return sweep_mod.sweep_key(faulty.FIRST_RUN_SPEC, key, get_profile("cpu/interpreter"), [runner], None,
                                   seed=11, timeout_s=60)  # fmt: skip
    finally:
        runner.close()


def test_a_winner_right_only_on_its_first_launch_is_refused_when_run_again(faulty, monkeypatch):
    """At an exact key the nondeterministic candidate passes its one checked launch; chosen as winner, its re-runs are
    judged against the oracle: refused as a mismatch naming the re-run, and the winner chosen again
    (the correct one)."""
    result = _first_run_sweep(faulty, monkeypatch, prefer_fault=6)
    by_fault = {o.config["FAULT"]: o for o in result.outcomes}
    assert by_fault[6].status == "mismatch", (by_fault[6].status, by_fault[6].reason)
    assert "wrong when run again (run 1 on the same inputs)" in by_fault[6].reason
    assert "Mismatched elements: 64 / 100" in by_fault[6].reason
    assert result.winner is not None and result.winner.config["FAULT"] == 1
    assert result.reproducible is True


def test_a_sweep_whose_only_correct_candidate_fails_its_rerun_certifies_nothing(faulty, monkeypatch):
    from nbxcert.sweep import finalists

    # the finalists are only ever the faulty candidate: once it is refused there is nothing left to certify
    monkeypatch.setattr("nbxcert.sweep.finalists", lambda correct, default: [o for o in finalists(correct, default)
                                                                              if o.config["FAULT"] == 6])  # fmt: skip
    result = _first_run_sweep(faulty)
    assert result.winner is None and result.reproducible is None
    assert {o.config["FAULT"]: o.status for o in result.outcomes}[6] == "mismatch"


def test_one_sweep_refuses_every_fault_with_its_own_reason_and_certifies_the_correct_candidate(faulty):
    from nbxcert.profiles import get_profile
    from nbxcert.worker import Worker

    # the prune's facts are the H200's (nvidia/hopper): the interpreter's profile states no shared memory at all, so
    # under it nothing could refuse FAULT=7; the candidates still run on the interpreter
    profile = get_profile("nvidia/hopper")
    runners = [Worker(INTERPRETER_ENV, ["faulty_kernels"]) for _ in range(2)]
    t0 = time.perf_counter()
    try:
        result = _sweep(faulty, profile, runners, None, timeout_s=10)
        after = runners[0].request(
            {
                "op": "check",
                "spec": "fault_sweep",
                "config": faulty.SWEEP_CANDIDATES[0].as_dict(),
                "problems": result.problems,
                "dtypes": ["float32"],
                "seed": 3,
                "profile": profile.key,
            },
            60,
        )
    finally:
        for r in runners:
            r.close()
    tally = _tally(result, INTERPRETER_FAULTS)
    assert after["status"] == "correct", "the workers still answer after the sweep"
    by_fault = {o.config["FAULT"]: o for o in result.outcomes}
    assert by_fault[0].status == by_fault[1].status == "correct"
    assert by_fault[8].status == "correct"  # the interpreter has no shared memory: only a GPU's compile refuses it
    assert result.winner is not None and result.winner.config["FAULT"] in (0, 1)
    assert result.reproducible is True
    assert result.counts() == {
        "pruned": 1,
        "compile": 1,
        "resources": 0,
        "crash": 1,
        "timeout": 1,
        "mismatch": 2,
        "correct": 3,
    }
    assert sum(r.restarts for r in runners) >= 2, "the crashed and the hung worker were replaced"
    assert tally == {**tally, "faults_injected": 6, "faults_survived": 6, "keys_lost": 0}
    figures("faults_interpreter", seconds=round(time.perf_counter() - t0, 1), **tally)


@pytest.mark.gpu
def test_on_the_gpu_the_illegal_address_and_the_hang_run_for_real(backend):
    """On the H200: FAULT=4 is a real illegal address (the worker's CUDA context is poisoned: it exits and is
    replaced), FAULT=5 a real endless kernel (killed at the time limit), FAULT=8 a real compile refusal for shared
    memory (Triton's OutOfResources)."""
    from nbxcert.kernels.backends import cuda
    from nbxcert.profiles import match_nvidia
    from nbxcert.worker import CompilePool, Worker

    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    sys.path.insert(0, str(FIXTURES))
    import faulty_kernels

    profile = match_nvidia(cuda.device_info(0).compute_capability)[0]
    env = {"NBXCERT_BACKEND": "cuda"}
    runner, compiler = Worker(env, ["faulty_kernels"]), CompilePool(env, ["faulty_kernels"], 4)
    t0 = time.perf_counter()
    try:
        result = _sweep(faulty_kernels, profile, runner, compiler, timeout_s=60)
    finally:
        runner.close()
        compiler.close()
    expected = {
        **{f: v for f, v in INTERPRETER_FAULTS.items() if f not in (4, 7)},
        4: ("crash", ""),  # an illegal address: CUDA_ERROR_ILLEGAL_ADDRESS, or the worker dying of it
        7: ("pruned", "max_shared_memory_per_block_optin"),
        8: ("resources", "shared memory"),
    }
    tally = _tally(result, expected)
    assert result.winner is not None and result.winner.config["FAULT"] in (0, 1)
    assert runner.restarts >= 2, "the poisoned and the hung worker were replaced"
    assert tally["faults_survived"] == 7 and tally["keys_lost"] == 0
    figures("faults_gpu", seconds=round(time.perf_counter() - t0, 1), **tally)


# --- kill/resume ------------------------------------------------------------------------------------------------------
def _demo_keys(kernels: str | None = DEMO_KERNELS) -> set[str]:
    from nbxcert.keyfile import gather_keys
    from nbxcert.profiles import get_profile

    keys = gather_keys(get_profile("cpu/interpreter"), workload="demo", kernels=kernels.split(",") if kernels else None)
    return {k.text() for k in keys}


def _certify(out: Path, log: Path, *args: str) -> subprocess.Popen:
    """`nbxcert certify ARGS` into `out`, in a session of its own (its workers share its process group)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(INTERPRETER_ENV)
    cmd = [sys.executable, "-m", "nbxcert", "certify", "--profile", "interpreter", "--out", str(out), "--json"]
    cmd += list(args)
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=f, start_new_session=True)


def _alive_in_group(pgid: int) -> list[int]:
    """Processes of the process group `pgid` that are still running (zombies waiting for init do not count)."""
    alive = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(d))
    return alive


def _reap(pgid: int, timeout_s: float = 30.0) -> int:
    """Wait for a killed run's workers to leave on their own (their pipe to the parent is closed); kill and count any
    still there after `timeout_s` (the group is one this test started)."""
    deadline = time.monotonic() + timeout_s
    while _alive_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive_in_group(pgid)
    if left:
        os.killpg(pgid, signal.SIGKILL)
    return len(left)


def _entries(out: Path) -> dict[str, Path]:
    """key -> the file that certifies it; every file must load and validate whole, and no key may be in two files."""
    from nbxcert import certificates

    found: dict[str, Path] = {}
    for path in certificates.iter_files(out):
        for key in certificates.load_file(path).entries:
            assert key not in found, f"{key} is certified in {found[key]} and in {path}"
            found[key] = path
    return found


def test_ctrl_c_stops_certify_in_one_line_and_a_rerun_resumes(tmp_path):
    """SIGINT (Ctrl-C, or `timeout -s INT` as a GPU job uses) reaches the whole process group. Bug seen on an H200:
    every sweep worker died with a KeyboardInterrupt traceback of its own. Now the workers ignore it, the parent stops
    them, says one line and exits 130; what was written stays, and the same command resumes."""
    out, log = tmp_path / "certs", tmp_path / "certify.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(INTERPRETER_ENV)
    cmd = [sys.executable, "-m", "nbxcert", "certify", "--profile", "interpreter", "--out", str(out)]
    cmd += ["--workload", "demo", "--kernels", "rmsnorm,embedding", "--jobs", "1"]
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, env={**env, "COLUMNS": "250"}, stdout=f, stderr=f, start_new_session=True)
    deadline = time.monotonic() + 240
    while "[nbxcert] 1/" not in log.read_text() and time.monotonic() < deadline:
        assert p.poll() is None, log.read_text()
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    assert p.wait(timeout=60) == 130, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "nbxcert: interrupted; every certificate entry written so far is kept" in text
    assert _reap(p.pid, 30) == 0, "every worker left with the parent"
    done = set(_entries(out))
    assert done, "the first key's entry was kept"
    r = nbx("certify", "--profile", "interpreter", "--out", out, "--workload", "demo", "--kernels", "rmsnorm,embedding")
    check(r, 0)
    assert set(_entries(out)) == _demo_keys("rmsnorm,embedding")
    assert r.stdout.count("skipped") >= len(done), r.stdout


def _kill_and_resume(tmp_path: Path, kills: int, seed: int, delay: tuple[float, float], kernels: str | None) -> dict:
    """Start `certify --workload demo [--kernels ...]`, SIGKILL it after a random delay (seeded), check every file
    is whole, and again until `kills` runs were killed (a run that finishes first is a completed run); then resume
    to the end and check that every key is certified once and nothing is half-written."""
    want = _demo_keys(kernels)
    args = ["--workload", "demo", "--jobs", "2"] + (["--kernels", kernels] if kernels else [])
    out, log = tmp_path / "certs", tmp_path / "certify.log"
    rnd = random.Random(seed)
    killed = runs = completed = orphans = mid_sweep = 0
    lo, hi = delay
    at_kills: list[int] = []  # keys certified when each kill landed: the kill points spread over the whole sweep
    t0 = time.perf_counter()
    while killed < kills:
        assert runs < 4 * kills + 10, "the runs keep finishing before the kill"
        before = len(_entries(out)) if out.exists() else 0
        p = _certify(out, log, *args)
        runs += 1
        wait = rnd.uniform(lo, hi)
        try:
            p.wait(timeout=wait)
            completed += 1
            assert p.returncode == 0, log.read_text()[-3000:]
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            killed += 1
            mid_sweep += before < len(want)
        orphans += _reap(p.pid)
        now = len(_entries(out)) if out.exists() else 0  # every file whole and valid after every kill
        at_kills.append(now)
        if now == len(want) and killed < kills:  # a run finished the sweep before its kill: sweep afresh, so the
            shutil.rmtree(out)  # kills left land mid-sweep (a fast machine may finish the demo within a few runs)
            continue
        # a run killed before it certified anything (a slow key in flight) makes the next one wait longer, so the
        # kills move along the sweep instead of landing in the same key every time
        lo, hi = (wait, hi * 1.5) if now == before else delay
    certified_before_resume = len(_entries(out)) if out.exists() else 0
    final = _certify(out, log, *args)
    assert final.wait(timeout=600) == 0, log.read_text()[-3000:]
    orphans += _reap(final.pid)
    report = json.loads(log.read_text()[log.read_text().rindex('{\n  "profile"') :].split("\n}\n")[0] + "\n}")

    found = _entries(out)
    assert set(found) == want, f"lost: {sorted(want - set(found))}, unexpected: {sorted(set(found) - want)}"
    assert report["totals"] == {
        "certified": len(want) - certified_before_resume,
        "skipped": certified_before_resume,
        "failed": 0,
    }
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], "a half-written temp file was left behind"
    assert orphans == 0, "a killed run's workers outlived it"
    files = len(set(found.values()))
    check(nbx("validate", out), 0, must=[f"{files} files, {len(want)} entries, 0 problems"])
    return {
        "kills": killed,
        "kills_mid_sweep": mid_sweep,
        "runs": runs + 1,
        "runs_completed_before_their_kill": completed,
        "resumes": runs,
        "keys": len(want),
        "keys_certified_before_the_last_resume": certified_before_resume,
        "keys_certified_at_each_kill": at_kills,
        "keys_lost": len(want - set(found)),
        "keys_certified_twice": 0,  # asserted by _entries: no key is in two files (and a file holds a key once)
        "orphan_workers": orphans,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def test_certify_killed_three_times_at_random_points_then_resumed_loses_nothing(tmp_path, faulty):
    # the demo's fast subset (12 keys, ~3.5 s uninterrupted here: ~1.5 s of start-up, then the keys)
    result = _kill_and_resume(tmp_path, kills=3, seed=20261129, delay=(1.0, 3.0), kernels=DEMO_KERNELS)
    assert result["keys_lost"] == 0
    figures("kill_resume_3", **result)


@pytest.mark.slow
@pytest.mark.fuzz
def test_certify_killed_twenty_times_at_random_points_then_resumed_loses_nothing(tmp_path, faulty):
    # the whole demo workload (23 keys, ~33 s uninterrupted here), so that most kills land mid-sweep
    seed = int(os.environ.get("NBXCERT_FUZZ_SEED", "7"))
    result = _kill_and_resume(tmp_path, kills=20, seed=seed, delay=(0.5, 4.0), kernels=None)
    assert result["keys_lost"] == 0
    figures("kill_resume_20", **result)


# --- concurrency ------------------------------------------------------------------------------------------------------
_RECORDER = """
import os, sys, time
from nbxcert import serving
from nbxcert.kernels.spec import get_spec

spec, who, stop, n = get_spec("rmsnorm"), int(sys.argv[1]), sys.argv[2], 0
while not os.path.exists(stop) or n < 50:  # a new key each time: every launch formed is one line
    serving.config_for(spec, {"n_rows": 16, "n_cols": 100_000 * (who + 1) + n}, ("float16", "float16"))
    n += 1
    time.sleep(0.005)
print(n)
"""


def test_two_certify_runs_and_four_key_recorders_in_one_directory_lose_nothing(tmp_path, faulty):
    want = sorted(_demo_keys())
    shared, log = tmp_path / "shared", tmp_path / "certify.log"
    for name, order in (("a.jsonl", want), ("b.jsonl", want[::-1])):  # they meet in the middle of the key list
        (tmp_path / name).write_text("".join(json.dumps({"key": k}) + "\n" for k in order))
    record, stop = shared / "keys.jsonl", tmp_path / "stop"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(INTERPRETER_ENV, NBXCERT_KEY_RECORD=str(record), NBXCERT_UNCERTIFIED="default")
    env.update(NBXCERT_CERTIFIED_DIR=str(shared), NBXCERT_CACHE_DIR=str(tmp_path / "cache"))  # serve what is written
    shared.mkdir()
    t0 = time.perf_counter()
    errs = [tmp_path / f"recorder{i}.err" for i in range(4)]  # each uncertified key is said once: thousands of lines
    recorders = [
        subprocess.Popen(
            [sys.executable, "-c", _RECORDER, str(i), str(stop)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=errs[i].open("w"),
            text=True,
        )
        for i in range(4)
    ]
    runs = [_certify(shared, log, "--keys", str(tmp_path / f), "--jobs", "1") for f in ("a.jsonl", "b.jsonl")]
    try:
        codes = [p.wait(timeout=600) for p in runs]
    finally:
        stop.write_text("")
    outs = [p.communicate(timeout=120)[0] for p in recorders]
    for p, out, err in zip(recorders, outs, errs):  # a recorder that died says why (seen once in CI, 2026-11-29)
        assert p.returncode == 0 and out.split(), f"recorder exit {p.returncode}: {err.read_text()[-3000:]}"
    counts = [int(out.split()[-1]) for out in outs]
    assert codes == [0, 0], log.read_text()[-3000:]

    found = _entries(shared)
    assert sorted(found) == want, f"lost: {sorted(set(want) - set(found))}"
    check(nbx("validate", shared), 0, must=[f"6 files, {len(want)} entries, 0 problems"])
    lines = record.read_text(encoding="utf-8").splitlines()
    assert len(lines) == sum(counts), "a recorded key line was lost (or torn)"
    from nbxcert.keyfile import read_keys

    assert len(read_keys(record)) == sum(counts)  # every line whole, every key distinct
    figures(
        "concurrency",
        certify_runs=2,
        recorders=4,
        entries=len(found),
        entries_lost=len(want) - len(found),
        key_lines_written=sum(counts),
        key_lines_lost=sum(counts) - len(lines),
        seconds=round(time.perf_counter() - t0, 1),
    )


_WRITER = """
import sys
import certs
from nbxcert import certificates

root, who = sys.argv[1], int(sys.argv[2])
for i in range(40):
    n = 1000 * (who + 1) + i
    certificates.add_entry(root, "cpu/interpreter", "fault_probe", "float32", certs.probe_key(n), certs.probe_entry(n))
"""


def test_four_processes_adding_entries_to_one_file_lose_none(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(i)], env=env) for i in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    found = _entries(tmp_path)
    assert len(found) == 160 and len(set(found.values())) == 1


_KILLED_WRITER = """
import os, signal, sys
import certs
from nbxcert import certificates

def killed(src, dst):  # SIGKILL between writing the temp file and renaming it over the certificate
    os.kill(os.getpid(), signal.SIGKILL)

certificates.os.replace = killed
key, entry = certs.probe_key(7), certs.probe_entry(7)
certificates.add_entry(sys.argv[1], "cpu/interpreter", "fault_probe", "float32", key, entry)
"""


def test_a_writer_killed_mid_write_leaves_no_temp_file_behind(tmp_path, certs):
    # bug: atomic_write's cleanup never runs under SIGKILL, so a run killed between writing its temp file and the
    # rename left `.fault_probe.float32.json.*.tmp` in the certificate directory for good
    from nbxcert import certificates

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    r = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], env=env, timeout=120)
    assert r.returncode == -signal.SIGKILL
    directory = tmp_path / "cpu" / "interpreter"
    assert len(list(directory.glob(".*.tmp"))) == 1 and not (directory / "fault_probe.float32.json").exists()
    certificates.add_entry(
        tmp_path, "cpu/interpreter", "fault_probe", "float32", certs.probe_key(8), certs.probe_entry(8)
    )
    assert list(directory.glob(".*.tmp")) == []
    assert list(_entries(tmp_path)) == [certs.probe_key(8)]


# --- hostile certificates ---------------------------------------------------------------------------------------------
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
}


def _probe_text(certs, mutate=None, key=None) -> str:
    entry = certs.probe_entry(300)
    if mutate:
        mutate(entry)
    doc = {"schema_version": 1, "kernel": "fault_probe", "dtype": "float32", "profile": "cpu/interpreter"}
    doc["entries"] = {key or certs.probe_key(300): entry}
    return json.dumps(doc, indent=2, sort_keys=True)


def _hostile_file(certs, name: str, directory: Path) -> tuple[Path, str | None, str]:
    """Write hostile case `name` under `directory`: (its path, the field named or None, a part of the reason)."""
    path = directory / "fault_probe.float32.json"
    if name in HOSTILE_ENTRIES:
        mutate, field, reason = HOSTILE_ENTRIES[name]
        path.write_text(_probe_text(certs, mutate))
        return path, field, reason
    if name == "one_gigabyte":
        with open(path, "wb") as f:
            f.truncate(2**30)  # sparse: costs no disk
        return path, None, "over the 67108864-byte limit"
    if name == "deep_nesting":
        path.write_text("[" * 100_000 + "]" * 100_000)
        return path, None, "is not valid JSON"
    if name == "nan_timing":
        path.write_text(_probe_text(certs).replace("3300.0", "NaN", 1))
        return path, None, "NaN is not valid JSON"
    if name == "infinite_timing":
        path.write_text(_probe_text(certs).replace("3300.0", "1e999", 1))
        return path, "default.timing.median_us", "finite number"  # the first 3300.0 (keys sorted)
    if name == "key_of_5000_digits":  # bug: int() refused it with ValueError, a traceback through the loader
        path.write_text(_probe_text(certs, key=f"fault_probe[n={'1' * 5000};float32]@v1"))
        return path, None, "more than 40"
    if name == "kernel_with_path_separators":
        path.write_text(_probe_text(certs).replace('"kernel": "fault_probe"', '"kernel": "../../etc/passwd"'))
        return path, "kernel", "do not match the file name"
    if name == "dunder_names":
        path = directory / "__init__.float32.json"
        path.write_text(_probe_text(certs).replace('"kernel": "fault_probe"', '"kernel": "__class__"'))
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

    from nbxcert import certificates, certtools, serving
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

    scan = certtools.validate(root, ["faulty_kernels"])  # `nbxcert validate`'s engine lists it, never raises
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


# --- nothing read is ever executed ------------------------------------------------------------------------------------
# Where a module named at run time may be imported: exactly where a user names their own spec module on the command
# line (`--spec`), and the worker processes that import the same modules for certify (and for the census), plus the
# registry's import of its own constant list of kernel families. Nothing read from a file names a module.
IMPORT_ALLOWED = {
    ("nbxcert/certtools.py", "load_specs"),  # `--spec MODULE` of certify/validate/merge
    ("nbxcert/worker.py", "_serve"),  # the modules certify passes to its workers (its own `--spec`)
    ("nbxcert/census.py", "_serve_census"),  # the modules `nbxcert census --spec` passes to its workers
    ("kernels/spec.py", "load_all"),  # f"nbxcert.kernels.{module}" over the constant FAMILY_MODULES
}
BANNED_MODULES = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle", "runpy"}
BANNED_BUILTINS = {"eval", "exec", "compile", "__import__"}
UNSAFE_YAML = {"unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all", "Loader", "FullLoader"}


def _findings(path: Path, rel: str | None = None) -> list[str]:
    import ast

    rel = rel or path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    function_of: dict[int, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                function_of.setdefault(id(node), fn.name)  # outermost function first: walk order is breadth-first
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where}: imports {a.name}" for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in BANNED_MODULES:
            found.append(f"{where}: imports from {node.module}")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in BANNED_BUILTINS:
                found.append(f"{where}: calls {f.id}()")
            if isinstance(f, ast.Attribute) and f.attr in ("import_module", "__import__"):
                constant = node.args and isinstance(node.args[0], ast.Constant)
                if not constant and (rel, function_of.get(id(node))) not in IMPORT_ALLOWED:
                    found.append(f"{where}: imports a module named at run time ({ast.unparse(node)})")
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "yaml":
                if f.attr in UNSAFE_YAML:
                    found.append(f"{where}: yaml.{f.attr}")
                if f.attr == "load":
                    loader = next((k.value for k in node.keywords if k.arg == "Loader"), None)
                    if loader is None or "Safe" not in ast.unparse(loader):
                        found.append(f"{where}: yaml.load without a safe loader")
            for k in node.keywords:
                if k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                    found.append(f"{where}: allow_pickle")
    return found


def test_nothing_read_is_ever_executed_no_pickle_eval_exec_or_data_named_import():
    files = [p for d in ("nbxcert", "kernels", "oracles") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20
    findings = [f for p in files for f in _findings(p)]
    assert findings == [], "\n".join(findings)
    # the allow-list names real places (a stale entry would allow a new one unnoticed)
    for rel, fn in IMPORT_ALLOWED:
        path = ROOT / rel
        if path.exists():  # census.py is optional
            assert f"def {fn}(" in path.read_text(), (rel, fn)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import pickle\nimport importlib, yaml\n"
        "def f(name, text):\n"
        "    eval(text)\n    exec(text)\n    importlib.import_module(name)\n    yaml.load(text, Loader=yaml.Loader)\n"
    )
    found = "\n".join(_findings(bad, "nbxcert/probe.py"))
    for what in ("imports pickle", "calls eval()", "calls exec()", "named at run time", "without a safe loader"):
        assert what in found, found


# --- paths ------------------------------------------------------------------------------------------------------------
def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_links_out_of_a_certificate_directory_and_dotdot_names_are_refused_by_the_loader(certs, tmp_path):
    from nbxcert import index
    from nbxcert.errors import CertificateInvalid

    outside = tmp_path / "outside"
    outside.mkdir()
    victim = certs.write_probe(outside, {certs.probe_key(1): certs.probe_entry(1)})
    for name, make in (
        ("file link", lambda d: (d / "cpu" / "interpreter" / "fault_probe.float32.json").symlink_to(victim)),
        ("directory link", lambda d: (d / "cpu" / "interpreter").symlink_to(victim.parent)),
    ):
        root = tmp_path / name.replace(" ", "_")
        (root / "cpu").mkdir(parents=True)
        if name == "file link":
            (root / "cpu" / "interpreter").mkdir()
        make(root)
        with pytest.raises(CertificateInvalid, match="points outside the certificate directory"):
            index.load_index([root], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache")
        check(nbx("validate", root), 1, must=["points outside"])
    root = tmp_path / "dotdot"
    (root / "cpu" / "interpreter").mkdir(parents=True)
    (root / "cpu" / "interpreter" / "fault_probe..float32.json").write_text(_probe_text(certs))
    with pytest.raises(CertificateInvalid, match="file name must be"):
        index.load_index([root], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache")


def test_certify_writes_only_under_out(tmp_path):
    # bug: certify read the certificate through a link pointing out of --out, and wrote through a linked profile
    # directory into another directory than the one it was asked to write
    key = "rmsnorm[n_cols=128,n_rows=2;float16,float16]@v1"
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    before = _tree(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "nbxcert", "certify", "--profile", "interpreter", "--key", key, "--out", "certs"],
        cwd=work,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")} | INTERPRETER_ENV,
        timeout=300,
    )
    check(r, 0)
    new = _tree(tmp_path) - before
    assert new and all(p.startswith("work/certs") for p in new), sorted(new)
    assert sorted(p for p in new if p.endswith(".json")) == ["work/certs/cpu/interpreter/rmsnorm.float16.json"]

    linked = tmp_path / "linked"
    (linked / "cpu").mkdir(parents=True)
    (linked / "cpu" / "interpreter").symlink_to(outside)
    r = nbx("certify", "--profile", "interpreter", "--key", key, "--out", linked)
    check(r, 1, must=["nbxcert: invalid certificate:", "points outside the certificate directory"])
    assert list(outside.iterdir()) == [], "certify wrote through a link out of --out"

    (outside / "rmsnorm.float16.json").write_text("not even JSON")
    (linked / "cpu" / "interpreter").unlink()
    (linked / "cpu" / "interpreter").mkdir()
    (linked / "cpu" / "interpreter" / "rmsnorm.float16.json").symlink_to(outside / "rmsnorm.float16.json")
    r = nbx("certify", "--profile", "interpreter", "--key", key, "--out", linked)
    check(r, 1, must=["points outside the certificate directory"])
    assert (outside / "rmsnorm.float16.json").read_text() == "not even JSON"


def test_merge_writes_only_under_out(certs, tmp_path):
    shard, outside, out = tmp_path / "shard", tmp_path / "outside", tmp_path / "out"
    certs.write_probe(shard, {certs.probe_key(1): certs.probe_entry(1)})
    outside.mkdir()
    (outside / "v.json").write_text("a file outside OUT")
    before = _tree(tmp_path)
    check(nbx("merge", out, shard, "--spec", "faulty_kernels"), 0, must=["merged 1 keys"])
    new = _tree(tmp_path) - before
    assert new and all(p.startswith("out") for p in new), sorted(new)

    for name, make in (
        (
            "file link",
            lambda o: (o / "cpu" / "interpreter" / "fault_probe.float32.json").symlink_to(outside / "v.json"),
        ),
        ("directory link", lambda o: (o / "cpu" / "interpreter").symlink_to(outside)),
    ):
        out = tmp_path / name.replace(" ", "_")
        (out / "cpu").mkdir(parents=True)
        if name == "file link":
            (out / "cpu" / "interpreter").mkdir()
        make(out)
        check(nbx("merge", out, shard, "--spec", "faulty_kernels"), 1, must=["points outside"])
        assert _tree(outside) == {"v.json"} and (outside / "v.json").read_text() == "a file outside OUT", name


# --- provenance on serving --------------------------------------------------------------------------------------------
def _triton_version() -> str:
    import triton

    return triton.__version__


ELSEWHERE = {  # provenance fields -> what the notice / the refusal says
    "triton": ({"triton": "2.3.1"}, "made with Triton 2.x, this machine has Triton"),
    "driver": ({"driver": "570.124.06"}, "made with driver 570, this machine's driver is none"),
    "profile": (
        {"backend": "cuda", "compute_capability": "9.0", "gpu": "NVIDIA H200", "gpu_memory_bytes": 150_754_820_096},
        "made on a nvidia/hopper device, this machine runs cpu/interpreter",
    ),
}


@pytest.fixture
def serving(monkeypatch, tmp_path):
    from nbxcert import serving

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NBXCERT_STRICT_PROVENANCE", raising=False)
    yield serving
    serving.configure()


def _probe_dir(certs, root: Path, **by_n) -> Path:
    """fault_probe certifications of n -> provenance overrides, under `root` (cpu/interpreter)."""
    certs.write_probe(root, {certs.probe_key(n): certs.probe_entry(n, **prov) for n, prov in by_n.items()})
    return root


def test_a_certification_made_here_is_served_without_a_word(faulty, certs, serving, tmp_path, capfd):
    root = _probe_dir(certs, tmp_path / "certs", **{"300": {"triton": _triton_version()}})
    serving.configure(dirs=[root], certified_only=True)
    assert serving.config_for(faulty.SPEC, {"n": 300}, ("float32",))["FAULT"] == 0
    assert "notice" not in capfd.readouterr().err


@pytest.mark.parametrize("what", sorted(ELSEWHERE))
def test_a_certification_made_elsewhere_is_served_with_one_notice_or_refused_when_strict(
    what, faulty, certs, serving, tmp_path, capfd, monkeypatch
):
    from nbxcert.errors import ProvenanceMismatch

    provenance, says = ELSEWHERE[what]
    root = _probe_dir(certs, tmp_path / "certs", **{str(n): provenance for n in (300, 301, 302)})
    serving.configure(dirs=[root], certified_only=True)
    for n in (300, 301, 302):
        assert serving.config_for(faulty.SPEC, {"n": n}, ("float32",))["FAULT"] == 0
    notices = [line for line in capfd.readouterr().err.splitlines() if "notice" in line]
    assert len(notices) == 1 and says in notices[0] and "NBXCERT_STRICT_PROVENANCE=1" in notices[0], notices

    monkeypatch.setenv("NBXCERT_STRICT_PROVENANCE", "1")
    serving.configure(dirs=[root], certified_only=True)
    with pytest.raises(ProvenanceMismatch) as e:
        serving.config_for(faulty.SPEC, {"n": 300}, ("float32",))
    assert certs.probe_key(300) in str(e.value) and says in str(e.value)
    assert "nbxcert certify --profile interpreter" in e.value.hint


def test_strict_provenance_on_the_command_line_is_one_line_naming_key_and_difference(certs, tmp_path):
    shipped = json.loads((ROOT / "certificates" / "cpu" / "interpreter" / "rmsnorm.float16.json").read_text())
    key, entry = next(iter(shipped["entries"].items()))
    entry["provenance"]["triton"] = "2.3.1"
    certs.write_file(tmp_path, {key: entry}, kernel="rmsnorm", dtype="float16", profile="cpu/interpreter")
    args = ("verify", "--profile", "interpreter", "--key", key, "--dir", tmp_path, "--certified-only")
    env = {"NBXCERT_CACHE_DIR": str(tmp_path / "cache")}
    r = nbx(*args, env=env)
    check(r, 0, must=["notice: serving cpu/interpreter certifications made with Triton 2.x", "1 served"])
    r = nbx(*args, env={**env, "NBXCERT_STRICT_PROVENANCE": "1"})
    check(r, 1, must=[f"nbxcert: provenance mismatch: kernel rmsnorm: the certification of {key}", "Triton 2.x"])
    assert len([line for line in r.stderr.splitlines() if line.startswith("nbxcert:")]) == 1


def _shipped_entries(profile: str) -> int:
    """How many entries the shipped certificates hold for `profile` (read here from the JSON files themselves)."""
    from importlib import resources

    root = resources.files("nbxcert.shipped_certificates").joinpath(*profile.split("/"))
    if not root.is_dir():
        return 0
    return sum(len(json.loads(f.read_text())["entries"]) for f in root.iterdir() if f.name.endswith(".json"))


def test_doctor_lists_the_certificates_that_apply_here_and_the_ones_it_rejects(certs, tmp_path):
    mine = tmp_path / "mine"
    _probe_dir(
        certs,
        mine,
        **{"300": {"triton": _triton_version()}, "301": ELSEWHERE["triton"][0], "302": ELSEWHERE["driver"][0]},
    )
    certs.write_file(mine, {certs.key(): certs.entry()})  # nvidia/hopper: another machine's profile
    env = {"NBXCERT_CERTIFIED_DIR": str(mine), "NBXCERT_CACHE_DIR": str(tmp_path / "cache")}
    r = nbx("doctor", "--json", env=env)
    check(r, 0)
    doc = json.loads(r.stdout)["certificates"]
    assert doc["machine"]["profile"] == "cpu/interpreter" and doc["machine"]["driver_major"] == "none"
    assert doc["dirs"][0] == str(mine)
    here = doc["profiles"]["cpu/interpreter"]
    assert here["rejected"] == 2 and here["apply"] >= 1  # the shipped certificates apply too
    triton_here = _triton_version().split(".")[0]
    assert here["reasons"] == {f"{ELSEWHERE['triton'][1]} {triton_here}.x": 1, ELSEWHERE["driver"][1]: 1}
    assert sorted(r["key"] for r in doc["rejected"]) == [certs.probe_key(301), certs.probe_key(302)]
    # the fixture's entry plus the shipped Hopper certificates: none applies on this machine
    n = 1 + _shipped_entries("nvidia/hopper")
    hopper = doc["profiles"]["nvidia/hopper"]
    assert hopper == {
        "apply": 0,
        "rejected": n,
        "reasons": {"for nvidia/hopper, not this machine's profile cpu/interpreter": n},
    }
    r = nbx("doctor", env={**env, "COLUMNS": "250"})
    check(
        r,
        0,
        must=[
            "certificates nvidia/hopper",
            f"0 apply, {n} rejected: for nvidia/hopper, not this machine's profile cpu/interpreter ({n})",
            "certificates cpu/interpreter",
            "made with driver 570, this machine's driver is none (1)",
            "2 of this machine's profile (served with a notice)",
        ],
    )


@pytest.mark.gpu
def test_on_the_gpu_the_driver_major_is_compared(backend):
    from nbxcert import serving
    from nbxcert.kernels.backends import cuda
    from nbxcert.profiles import match_nvidia
    from nbxcert.serving import nvidia_driver_version

    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    info = cuda.device_info(0)
    here = serving.this_machine(match_nvidia(info.compute_capability)[0].key)
    assert here.driver_major == nvidia_driver_version().split(".")[0] and here.driver_major.isdigit()
    made = {
        "backend": "cuda",
        "compute_capability": ".".join(map(str, info.compute_capability)),
        "triton": _triton_version(),
        "driver": nvidia_driver_version(),
    }
    assert serving.provenance_differences(made, here) == []
    older = {**made, "driver": f"{int(here.driver_major) - 1}.0.0"}
    assert serving.provenance_differences(older, here) == [
        f"made with driver {int(here.driver_major) - 1}, this machine's driver is {here.driver_major}"
    ]
