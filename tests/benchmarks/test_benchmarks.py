"""The benchmark scripts' own code that runs after the GPU work (tables, labels): a fault there loses a GPU run's
measurements, so it is exercised here on the CPU with results shaped as the GPU run makes them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from nbxcert.kernels.spec import Config

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench_elementwise(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    module = importlib.import_module("bench_elementwise")
    yield module
    sys.modules.pop("bench_elementwise", None)


def _result(bench, name, problem, dtypes, torch_ms, check="ok"):
    import common

    best = Config.make(num_warps=4, num_stages=1, BLOCK=1024)
    fields = common.bandwidth_fields(0.1, best, 64 << 20, 4.0e12, torch_ms)
    return {"kernel": name, "problem": problem, "dtypes": list(dtypes), **fields, "check": check}


def test_the_elementwise_table_has_a_line_for_every_case(bench_elementwise):
    # the bug: the case label read a second dtype that only cast has, and an H200 run's table lost its torch column
    results = [
        _result(bench_elementwise, n, p, d, 0.2 if i % 2 else None)
        for i, (n, p, d) in enumerate(bench_elementwise.CASES)
    ]
    lines = bench_elementwise.table(results)
    assert len(lines) == 2 + len(bench_elementwise.CASES)
    labels = [bench_elementwise.case_label(n, p, d) for n, p, d in bench_elementwise.CASES]
    assert labels == ["", "tanh", "add dense", "mul broadcast", "->float32", "neox", ""]
    for line, (name, _, _), label, r in zip(lines[2:], bench_elementwise.CASES, labels, results, strict=False):
        assert line.startswith(name) and label in line and "BLOCK=1024" in line
        assert ("2.00x" in line) == (r["torch_ms"] is not None)


def test_a_failed_check_is_printed_under_its_case(bench_elementwise):
    name, problem, dtypes = bench_elementwise.CASES[4]
    lines = bench_elementwise.table([_result(bench_elementwise, name, problem, dtypes, 0.2, check="mismatch\nmore")])
    assert lines[-1] == "  CHECK FAILED: mismatch"
    assert bench_elementwise.case_label(name, problem, dtypes) == "->float32"


def test_the_host_cost_benchmark_runs_without_a_gpu(tmp_path):
    """bench_host.py dispatches through Triton (cross-compiled for sm_90) and serves the shipped hopper certificates
    on a machine with no GPU; a short run reports each case's served, raw and direct cost."""
    import json
    import subprocess

    out = tmp_path / "host.json"
    cmd = [sys.executable, str(BENCH / "bench_host.py"), "--calls", "50", "--repeats", "1", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    cases = json.loads(out.read_text())["cases"]
    kernels = ["rmsnorm", "add_rmsnorm", "softmax", "embedding", "rope", "decode_attention", "silu_and_mul", "matmul"]
    assert [c["kernel"] for c in cases] == kernels
    assert all(c["served_us"] > 0 and c["direct_us"] > 0 and c["raw_us"] > 0 for c in cases)
    assert all(c["overhead_us"] == c["served_us"] - c["raw_us"] for c in cases)


def test_the_oracle_benchmark_times_this_oracle_beside_another_file(tmp_path):
    """bench_oracles.py times oracles/attention.py beside a given copy of it; a copy of itself agrees to the bit."""
    import subprocess

    oracle = Path(__file__).resolve().parents[2] / "oracles" / "attention.py"
    cmd = [sys.executable, str(BENCH / "bench_oracles.py"), "--repeats", "1", "--oracle-file", str(oracle)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [
        ["this", "decode"],
        ["this", "prefill"],
        ["other", "decode"],
        ["other", "prefill"],
    ]
    assert lines[4].endswith("0.00e+00") and lines[5].endswith("0.00e+00")
