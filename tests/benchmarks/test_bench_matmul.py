"""The pure parts of `benchmarks/bench_matmul.py`: how its alternating rounds make the ratio against the peer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_matmul as bm  # noqa: E402


def _round(ours: dict, peer: dict) -> dict:
    return {
        "ours": {s: {"median_ms": ms} for s, ms in ours.items()},
        "peer": {"results": {s: {"median_ms": ms} for s, ms in peer.items()}},
    }


def test_the_ratio_is_the_peers_median_over_ours_across_rounds():
    rounds = [
        _round({"a": 0.20, "b": 0.030}, {"a": 0.18, "b": 0.027}),
        _round({"a": 0.18, "b": 0.025}, {"a": 0.19, "b": 0.024}),
        _round({"a": 0.19, "b": 0.028}, {"a": 0.17, "b": 0.030}),
    ]
    combined = bm.combine_rounds(rounds, ["a", "b", "c"], {"a": ["a"], "b": ["b"], "c": ["c"]})
    assert set(combined) == {"a", "b"}  # "c" ran on neither side: no ratio, never a made-up one
    assert combined["a"]["ours_ms"] == pytest.approx(0.19) and combined["a"]["peer_ms"] == pytest.approx(0.18)
    assert combined["a"]["ratio"] == pytest.approx(0.18 / 0.19) and combined["a"]["rounds"] == 3
    assert combined["b"]["ratio"] == pytest.approx(0.027 / 0.028)


def test_a_round_with_one_side_failed_counts_for_neither():
    rounds = [
        _round({"a": 0.20}, {"a": 0.10}),
        {"ours": {"error": "RuntimeError: boom"}, "peer": {"results": {"a": {"median_ms": 0.5}}}},
        {"ours": {"a": {"median_ms": 0.4}}, "peer": {"error": "ImportError: no torch"}},
    ]
    combined = bm.combine_rounds(rounds, ["a"], {"a": ["a"]})
    assert combined["a"] == {
        "ours_ms": 0.20,
        "peer_ms": 0.10,
        "ratio": 0.5,
        "rounds": 1,
        "best": "a",
        "finalists": {"a": 0.20},
    }


def test_the_fastest_finalist_over_the_rounds_is_ours_not_the_sweeps_fastest():
    """Two finalists of shape "a" re-timed in each round: ours is the one with the lower median over the rounds; a
    round where one finalist is missing counts for neither side."""
    rounds = [
        _round({"a x": 0.21, "a y": 0.20}, {"a": 0.18}),
        _round({"a x": 0.21, "a y": 0.22}, {"a": 0.19}),
        _round({"a x": 0.20, "a y": 0.23}, {"a": 0.18}),
        _round({"a x": 0.10}, {"a": 0.50}),  # "a y" did not run: not counted
    ]
    combined = bm.combine_rounds(rounds, ["a"], {"a": ["a x", "a y"]})
    assert combined["a"]["best"] == "a x" and combined["a"]["rounds"] == 3
    assert combined["a"]["finalists"] == {"a x": pytest.approx(0.21), "a y": pytest.approx(0.22)}
    assert combined["a"]["ratio"] == pytest.approx(0.18 / 0.21)


def test_rounds_and_finalists_must_be_positive():
    with pytest.raises(SystemExit, match="--rounds 0"):
        bm.main(["--out", "/dev/null", "--rounds", "0"])
    with pytest.raises(SystemExit, match="--finalists 0"):
        bm.main(["--out", "/dev/null", "--finalists", "0"])


def test_gpu_state_reads_the_clock_limiting_reasons_by_either_name(tmp_path, monkeypatch):
    """A driver that knows only the older field name still reports the card's state (an nvidia-smi stand-in)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in *clocks_event_reasons*) echo "Field is not a valid field" >&2; exit 2;; esac\n'
        'echo "1980 MHz, 1980 MHz, 45, 120.5 W, 700.0 W, 0x0000000000000000"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    state = bm.gpu_state()
    assert state == [
        f"{bm.GPU_STATE_FIELDS},clocks_throttle_reasons.active: 1980 MHz, 1980 MHz, 45, 120.5 W, "
        "700.0 W, 0x0000000000000000"
    ]
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert bm.gpu_state().startswith("nvidia-smi: ")


def test_kinds_leave_only_their_candidates():
    from nbxcert.kernels import matmul as mm

    every = mm.MATMUL.candidates
    assert [c for c in every if bm.wanted(c, set())] == list(every)
    kept = [c for c in every if bm.wanted(c, {"tma_persistent"})]
    assert kept and all(c["KIND"] == "tma_persistent" for c in kept)
    assert len(kept) < len(every)


FAKE_TORCH = ROOT / "tests" / "fixtures" / "fake_torch"


@pytest.mark.parametrize("script", ["bench_matmul", "bench_attention"])
def test_the_peer_times_as_many_calls_as_rep_ms_allows_from_its_first_shape(script):
    """The peer's flush buffer is written once before any estimate: were its first write (slow, a first launch)
    inside the first shape's estimate, that shape would get a handful of timed calls, a burst ten times shorter than
    nbxcert's side times (the bug: cuBLAS at 4096^3 was timed over 21-73 calls against nbxcert's ~415 on an H200)."""
    import json
    import subprocess

    if script == "bench_matmul":
        module, shapes = bm, ["4096x4096x4096", "512x5632x2048"]
    else:
        import bench_attention as module

        shapes = {"first": [1, 2, 64, 64, True], "second": [1, 2, 128, 64, False]}
    payload = {"shapes": shapes, "dtype": "float16", "warmup_ms": 25, "rep_ms": 100}
    proc = subprocess.run(
        [sys.executable, "-c", module.PEER_SCRIPT, json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(FAKE_TORCH)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)["results"]
    per_call = 0.05 + 0.2  # a flush and a product (FLUSH_MS + PRODUCT_MS)
    for shape in shapes:
        assert 0.99 * 100 / per_call <= results[shape]["reps"] <= 100 / per_call + 1, (shape, results[shape])
        assert results[shape]["median_ms"] == pytest.approx(0.2)
