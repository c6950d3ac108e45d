"""`benchmarks/stale_winners.py`: the certificates whose winner today's winner rule would not choose, read from their
own winner and runner-up figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import stale_winners as sw  # noqa: E402


def _entry(winner, runner_up):
    def side(kwargs, median, spread, reps):
        timing = {"median_us": median, "min_us": median, "spread": spread, "reps": reps, "kind": "cuda_events"}
        return {"config": {"kwargs": kwargs, "num_warps": 4, "num_stages": 3}, "timing": timing}

    return {"winner": side({"B": 128}, *winner), "runner_up": side({"B": 32}, *runner_up)}


def test_a_default_chosen_inside_a_noisy_band_is_stale():
    # the H200 certificate of matmul[K=2048,M=64,N=11264,...;bfloat16,bfloat16] made by nbxcert 0.1.0
    assert abs(sw.stale(_entry((46.56, 0.029, 374), (26.0, 1.031, 360))) - 46.56 / 26.0) < 1e-9


def test_a_fastest_winner_or_one_inside_todays_band_is_not():
    assert sw.stale(_entry((10.0, 0.05, 500), (10.5, 0.05, 500))) is None  # the winner is the fastest
    assert sw.stale(_entry((10.3, 0.2, 10), (10.0, 0.2, 10))) is None  # 0.3 us apart, standard errors of 0.5 us
    assert sw.stale({"winner": _entry((1, 0, 1), (1, 0, 1))["winner"], "runner_up": None}) is None


def test_the_keys_file_lists_the_stale_keys_only(tmp_path):
    doc = {"entries": {"a[x=1;float16]@v1": _entry((46.56, 0.029, 374), (26.0, 1.031, 360)),
                       "b[x=1;float16]@v1": _entry((10.0, 0.05, 500), (10.5, 0.05, 500))}}  # fmt: skip
    (tmp_path / "k.float16.json").write_text(json.dumps(doc))
    out = tmp_path / "stale.jsonl"
    assert sw.main([str(tmp_path), "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [{"key": "a[x=1;float16]@v1"}]
