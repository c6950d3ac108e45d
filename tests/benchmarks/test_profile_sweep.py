"""profile_sweep.py's comparison of the sweep's screens with batched ones: the finalists each set of medians gives by
the sweep's own rule (`sweep.finalists`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_finalists_of_screen_medians_are_the_sweeps_rule():
    from nbxcert.kernels.spec import Config

    sys.path.insert(0, str(BENCH))
    try:
        profile_sweep = importlib.import_module("profile_sweep")
        configs = [Config.make(num_warps=w, num_stages=1, BLOCK=b) for b in (64, 128, 256) for w in (4, 8)]
        medians = [10.0, 11.0, 30.0, 10.5, 10.4, 50.0]
        got = profile_sweep._finalist_labels(configs, medians)
    finally:
        sys.modules.pop("profile_sweep", None)
        sys.path.remove(str(BENCH))
    # the fastest two always, then those within 15% of the fastest, at most four
    assert got == [configs[i].label() for i in (0, 4, 3, 1)]
    assert configs[2].label() not in got and configs[5].label() not in got


def test_load_threads_below_one_is_refused_before_any_gpu_is_asked_for():
    import subprocess

    cmd = [sys.executable, str(BENCH / "profile_sweep.py"), "--key", "k", "--out", "o", "--load-threads", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--load-threads 0: give 1 or more" in r.stderr


@pytest.mark.parametrize("reps", ["-1", "33"])
def test_batched_screens_outside_one_hold_of_the_gate_are_refused_before_any_gpu_is_asked_for(reps):
    import subprocess

    from nbxcert.kernels.backends.triton_cuda import GATE_BATCH

    cmd = [sys.executable, str(BENCH / "profile_sweep.py"), "--key", "k", "--out", "o", "--batched-screens", reps]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--batched-screens {reps}: give 1 to {GATE_BATCH} repetitions (0: none)" in r.stderr


def test_a_written_summary_is_one_line_a_key_with_whether_batched_screens_chose_the_same_finalists(tmp_path):
    """`--summarize`: what gpu_throughput.sh prints of the report (it was inline Python no test ran)."""
    import json
    import subprocess

    batched = {"wall_s": 0.25, "finalists_screened": ["a", "b"], "finalists_batched": ["b", "a"]}
    rows = [
        {"key": "k1", "candidates": 3, "seconds": {"checks": 0.5}, "loads": {"threads": 8}, "batched_screens": batched},
        {"key": "k2", "candidates": 2, "seconds": {}, "batched_screens": dict(batched, finalists_batched=["a", "c"])},
        {"key": "k3", "candidates": 1, "seconds": {}, "batched_screens": None},
    ]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"device": "d", "profile": "p", "keys": rows}))
    r = subprocess.run(
        [sys.executable, str(BENCH / "profile_sweep.py"), "--summarize", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["key"], x["same_finalists"], x["batched_wall_s"]) for x in lines] == [
        ("k1", True, 0.25),
        ("k2", False, 0.25),
        ("k3", None, None),
    ]
    assert lines[0]["loads"] == {"threads": 8} and lines[0]["seconds"] == {"checks": 0.5}
    r = subprocess.run([sys.executable, str(BENCH / "profile_sweep.py")], capture_output=True, text=True)
    assert r.returncode == 2 and "give --key (one or more) and --out, or --summarize SUMMARY_JSON" in r.stderr
