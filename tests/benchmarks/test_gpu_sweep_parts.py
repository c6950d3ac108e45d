"""`benchmarks/gpu_sweep_parts.sh`: a workload's run-time sweep measured in parts, each invocation going on where the
last stopped. Run here under the interpreter on the demo workload, with a stand-in for nvidia-smi (the script asks it
how many GPUs there are): a fault in its resuming would waste a GPU run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path, state):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: a stand-in'\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env.get('PATH', '')}",
        NBXCERT_INSTALLED="1",  # the tests' own install; no sitecustomize written
        NBXCERT_BACKEND="interpreter",
        TRITON_INTERPRET="1",
        WORKLOAD="demo",
        STATE=str(state),
        # each part stops starting launches about 6 s after the invocation's start (less the script's own start, which
        # counts the workload's launches first: a loaded CI host took 2 s there and left a 2 s budget no part), and no
        # second part starts
        BUDGET_S="126",
        MARGIN_S="120",
        SWEEP_JOBS="1",
    )
    return env


def _invoke(env, out):
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_sweep_parts.sh"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return (out / "summary.txt").read_text()


def test_each_invocation_resumes_where_the_last_part_ended(tmp_path):
    state = tmp_path / "state"
    env = _env(tmp_path, state)
    summaries = [_invoke(env, tmp_path / f"out{i}") for i in range(2)]
    parts = [json.loads(line) for line in (state / "parts.jsonl").read_text().splitlines()]
    assert [p["part"] for p in parts] == [0, 1]
    assert parts[0]["from_launch"] == 0 and parts[0]["launches"] >= 1
    assert parts[1]["from_launch"] == parts[0]["launches"]  # the second went on where the first ended
    assert int((state / "next").read_text()) == parts[0]["launches"] + parts[1]["launches"]
    done = parts[0]["launches"] + parts[1]["launches"]
    assert f"run-time sweep of {done} of 23 launches in 2 parts" in summaries[1]
    assert "not done" in summaries[1] and not any(p["cut"] for p in parts)


def test_another_machine_resumes_from_the_state_the_last_packed(tmp_path):
    first = _env(tmp_path, tmp_path / "state")
    _invoke(first, tmp_path / "out0")
    packed = tmp_path / "out0" / "state.tar.gz"
    parts0 = [json.loads(line) for line in (tmp_path / "state" / "parts.jsonl").read_text().splitlines()]
    # the winners swept so far travel (nbxcert's run-time cache); Triton's cache does not
    import tarfile

    with tarfile.open(packed) as tar:
        names = tar.getnames()
    assert "next" in names and "parts.jsonl" in names
    assert any(n.startswith("cache/nbxcert/runtime/") and n.endswith(".json") for n in names), names
    assert not any(n.startswith("cache/triton") for n in names)
    # a fresh state directory (another machine) given RESUME goes on at the launch the first ended before
    second = _env(tmp_path, tmp_path / "elsewhere")
    summary = _invoke({**second, "RESUME": str(packed)}, tmp_path / "out1")
    parts = [json.loads(line) for line in (tmp_path / "elsewhere" / "parts.jsonl").read_text().splitlines()]
    assert parts[0] == parts0[0] and parts[1]["from_launch"] == parts0[0]["launches"]
    # the demo's 23 launches are 23 keys: none is met again, so none counts as carried (test_bench_certified.py has
    # one that does)
    assert (parts[1]["carried_hits"], parts[1]["carried_hits_s"]) == (0, 0)
    assert "0 launches of keys swept in an earlier part took 0.0 s" in summary, summary
    assert "a lower bound of the whole" in summary


def test_a_state_that_cannot_be_unpacked_is_refused_by_name(tmp_path):
    env = _env(tmp_path, tmp_path / "state")
    bad = tmp_path / "state.tar.gz"
    bad.write_text("not an archive")
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_sweep_parts.sh"), str(tmp_path / "out")],
        cwd=ROOT,
        env={**env, "RESUME": str(bad)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 2 and f"cannot unpack RESUME={bad}" in r.stderr, r.stderr
    assert not (tmp_path / "state" / "parts.jsonl").exists()  # no part was run
