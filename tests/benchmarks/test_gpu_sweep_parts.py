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


def test_each_invocation_resumes_where_the_last_part_ended(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: a stand-in'\n")
    smi.chmod(0o755)
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env.get('PATH', '')}",
        NBXCERT_INSTALLED="1",  # the tests' own install; no sitecustomize written
        NBXCERT_BACKEND="interpreter",
        TRITON_INTERPRET="1",
        WORKLOAD="demo",
        STATE=str(state),
        # each part stops starting launches 2 s after its start, and no second part starts
        BUDGET_S="122",
        MARGIN_S="120",
        SWEEP_JOBS="1",
    )
    summaries = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        r = subprocess.run(
            ["bash", str(ROOT / "benchmarks" / "gpu_sweep_parts.sh"), str(out)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        summaries.append((out / "summary.txt").read_text())
    parts = [json.loads(line) for line in (state / "parts.jsonl").read_text().splitlines()]
    assert [p["part"] for p in parts] == [0, 1]
    assert parts[0]["from_launch"] == 0 and parts[0]["launches"] >= 1
    assert parts[1]["from_launch"] == parts[0]["launches"]  # the second went on where the first ended
    assert int((state / "next").read_text()) == parts[0]["launches"] + parts[1]["launches"]
    done = parts[0]["launches"] + parts[1]["launches"]
    assert f"run-time sweep of {done} of 23 launches in 2 parts" in summaries[1]
    assert "not done" in summaries[1] and not any(p["cut"] for p in parts)
