"""`benchmarks/bench_alloc.py --fake`: the host cost of a device tensor, over the tests' fake libcuda (no GPU)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler to build the fake libcuda")
def test_bench_alloc_over_the_fake_driver_reuses_one_block(tmp_path):
    """Its own process (the fake replaces the driver for the process); every made tensor after the warm-up takes the
    block the previous one freed, so the pool reserves exactly that one block and no tensor is left; nothing is left in
    the temporary directory."""
    out = tmp_path / "alloc.json"
    run = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_alloc.py"),
        "--fake",
        "--calls",
        "200",
        "--repeats",
        "2",
        "--compare-driver",
        "--out",
        str(out),
    ]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run(run, env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(scratch.iterdir()) == [], "the fake libcuda's build goes when the process ends"
    result = json.loads(out.read_text())
    assert result["driver"].startswith("fake libcuda") and len(result["runs_us"]) == 2 and result["alloc_us"] > 0
    assert len(result["driver_runs_us"]) == 2 and result["driver_alloc_free_us"] > 0
    stats = result["memory_stats"]
    assert stats["reserved_bytes.all.current"] == 4096 and stats["allocated_bytes.all.current"] == 0
    assert result["memory_kept_us"] > 0 and result["memory_pool_us"] > 0


def test_bench_alloc_without_a_gpu_says_so_in_one_line(tmp_path):
    """Without --fake on a machine with no CUDA device: one line naming the device and the way to measure anyway."""
    from nbxcert.kernels.backends import cuda

    if cuda.device_present(0)[0]:
        pytest.skip("this machine has a CUDA device 0")
    run = [sys.executable, str(ROOT / "benchmarks" / "bench_alloc.py"), "--calls", "1", "--repeats", "1"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("bench_alloc: no CUDA device 0 (") and "--fake" in done.stderr
