"""`benchmarks/bench_dispatch.py`: the host time of served calls, its cases, its verdicts, and its run at --tiny
dims under the interpreter (no GPU, no torch peer)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_dispatch.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_dispatch  # noqa: E402


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """The script in its own process, on the interpreter, with a cache directory of its own."""
    env = dict(os.environ, NBXCERT_BACKEND="interpreter", NBXCERT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NBXCERT_CERTIFIED_ONLY", None)
    env.pop("NBXCERT_CERTIFIED_DIR", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


def test_every_op_has_its_cases_at_the_workload_dimensions():
    """Full size: llama-3-8b's and mixtral-8x7b's dimensions from the workload files; decode and prefill for every op
    but those with one phase only (gemv and dequant_gemv serve M <= 4, flash is prefill, the decode kernels decode)."""
    d = bench_dispatch.model_dims(False, 4)
    assert (d.hidden, d.intermediate, d.heads, d.kv_heads, d.head_dim, d.vocab) == (4096, 14336, 32, 8, 128, 128256)
    assert (d.experts, d.top_k, d.moe_intermediate) == (8, 2, 14336)
    cases = bench_dispatch.cases_for(d, bench_dispatch.OPS)
    phases = {}
    for c in cases:
        phases.setdefault(c.op, []).append(c.phase)
    one_phase = {
        "gemv": ["decode"],
        "dequant_gemv": ["decode"],
        "flash_attention": ["prefill"],
        "decode_attention": ["decode"],
        "paged_decode_attention": ["decode"],
    }
    assert phases == {op: one_phase.get(op, ["decode", "prefill"]) for op in bench_dispatch.OPS}
    by_id = {c.id: c.dims for c in cases}
    assert by_id["matmul_tma_persistent:prefill"] == {"M": 512, "N": 6144, "K": 4096}
    assert by_id["gemv:decode"]["M"] == 4 and by_id["dequant_matmul:decode"]["M"] == 16
    assert by_id["decode_attention:decode"]["kv_len"] == 4096 and by_id["fused_moe:prefill"]["N"] == 2 * 14336


def test_met_needs_both_the_bound_and_torch():
    records = [
        {"id": "a", "host_us": 5.0},
        {"id": "b", "host_us": 5.0},
        {"id": "c", "host_us": 12.0},
        {"id": "d", "host_us": 5.0},
        {"id": "e", "host_us": 12.0},
    ]
    bench_dispatch.merge(records, {"a": {"host_us": 6.0}, "b": {"host_us": 4.0}, "c": {"host_us": 20.0}})
    assert [r["met"] for r in records] == [True, False, False, None, False]
    assert bench_dispatch.summary(records, True).startswith("1/5 cases met")


# A stand-in for the torch peer's script (no torch here): the same line protocol, fixed answers, and a case it dies on.
FAKE_PEER = r"""
import json, sys
print(json.dumps({"torch": "fake", "device": "none"}), flush=True)
for line in sys.stdin:
    case = json.loads(line)
    if case["op"] == "die":
        sys.exit("the fake peer stops at " + case["id"])
    print(json.dumps({"host_us": 1.5, "host_us_runs": [1.5], "gpu_us": None, "torch_op": case["op"]}), flush=True)
"""


def test_the_peer_answers_case_by_case_and_a_dead_one_is_named(monkeypatch):
    monkeypatch.setattr(bench_dispatch, "peer_script", lambda: FAKE_PEER)
    peer = bench_dispatch.Peer(bench_dispatch.parse_args(["--peer-timeout", "60"]))
    try:
        assert peer.info == {"torch": "fake", "device": "none"}
        for op in ("rmsnorm", "topk"):
            answer = peer.measure(bench_dispatch.Case(op, "decode", "1x8", {"rows": 1, "cols": 8}))
            assert answer["torch_op"] == op and answer["host_us"] == 1.5
        with pytest.raises(bench_dispatch.PeerFailed, match="the fake peer stops at die:decode"):
            peer.measure(bench_dispatch.Case("die", "decode", "", {}))
    finally:
        peer.close()
    assert peer.proc.returncode == 1


def test_tiny_cases_replay_their_plans_and_report_host_times(tmp_path):
    """Three ops on the interpreter: every case replays a launch plan after the warm-up, its host times are positive,
    the matmul kind is served the candidate of its kind chosen for it, and the table ends the output, a line a case."""
    out = tmp_path / "out"
    done = _run(
        [
            "--tiny",
            "--no-peer",
            "--ops",
            "rmsnorm,matmul_split_k,decode_attention",
            "--calls",
            "3",
            "--repeats",
            "2",
            "--out",
            str(out),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads((out / "dispatch.json").read_text())
    assert doc["backend"] == "interpreter" and doc["tiny"] and doc["calls"] == 3 and doc["repeats"] == 2
    ids = [
        "rmsnorm:decode",
        "rmsnorm:prefill",
        "matmul_split_k:decode",
        "matmul_split_k:prefill",
        "decode_attention:decode",
    ]
    assert [c["id"] for c in doc["cases"]] == ids
    for case in doc["cases"]:
        assert "error" not in case, case
        assert case["plan_replayed"] is True
        assert case["host_us"] > 0 and len(case["host_us_runs"]) == 2 and all(t > 0 for t in case["host_us_runs"])
        assert case["gpu_us"] is None and case["torch_host_us"] is None and case["met_torch"] is None
        assert case["served"] and case["served_as"]
    for case in doc["cases"][2:4]:
        assert case["served_as"].startswith("split_k: ")
        assert [s["kernel"] for s in case["served"]] == ["matmul"] and "KIND=split_k" in case["served"][0]["config"]
    for case in doc["cases"][:2] + doc["cases"][4:]:
        assert case["served_as"] in ("certified", "untuned default"), case["served_as"]
    lines = done.stdout.strip().splitlines()
    assert re.match(r"\d/5 cases met \(host <= 10 us and <= torch eager's\)", lines[-1]), lines[-1]
    rows = lines[-1 - len(ids) : -1]
    assert [r.split(" | ")[:2] for r in rows] == [["| " + i.split(":")[0], i.split(":")[1]] for i in ids]
    assert (out / "dispatch.md").read_text().splitlines()[2:-2] == rows


def test_an_unknown_op_is_refused_in_one_line(tmp_path):
    done = _run(["--tiny", "--no-peer", "--ops", "rmsnorm,nosuch"], tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_dispatch: unknown op 'nosuch'; the ops are: rmsnorm,")
