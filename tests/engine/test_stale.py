"""`nbxcert stale`: the certified winners the winner rule would not choose from their entry's own timings.

The rule itself is tested in-process (`stale.rule_choice`), where a table of cases costs nothing; the command runs in a
subprocess and is judged by its exit code, the lines that must appear and those that must not (never a traceback).
Certificates are built synthetically (`tests/fixtures/certs.py`), no device and no sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import check, check_json

from nbxcert.stale import rule_choice

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))

import certs  # noqa: E402


def nbx(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NBXCERT_CERTIFIED_DIR"}
    env.update(NBXCERT_BACKEND="interpreter", COLUMNS="250")
    cmd = [sys.executable, "-m", "nbxcert", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def _side(block, median, spread, reps):
    timing = {"median_us": median, "min_us": median, "spread": spread, "reps": reps, "kind": "cuda_events"}
    return {"config": certs.config(block), "timing": timing}


def _entry(winner, runner_up, finalists=None, default=None):
    """A valid entry (`certs.entry`) whose winner (BLOCK 128) and runner-up (BLOCK 32) have these (median, spread,
    reps); `finalists` and `default` as (block, median, spread, reps)."""
    e = certs.entry()
    e["winner"], e["runner_up"] = _side(128, *winner), _side(32, *runner_up)
    e["default"] = _side(*default) if default else None
    if finalists is not None:
        e["finalists"] = [_side(*f) for f in finalists]
    return e


# The H200 certificate of matmul[K=2048,M=64,N=11264,...;bfloat16,bfloat16] made by nbxcert 0.1.0: the fastest at
# 26.0 us with a 103% spread over 360 runs let the default at 46.6 us (3%) into its raw-spread band.
NOISY_BAND = ((46.56, 0.029, 374), (26.0, 1.031, 360))


def test_a_default_chosen_inside_a_noisy_band_is_stale():
    config, median = rule_choice(_entry(*NOISY_BAND))
    assert config == certs.config(32) and median == 26.0


def test_a_fastest_winner_or_one_inside_the_band_is_chosen_again():
    assert rule_choice(_entry((10.0, 0.05, 500), (10.5, 0.05, 500))) is None  # the winner is the fastest
    assert rule_choice(_entry((10.3, 0.2, 10), (10.0, 0.2, 10))) is None  # 0.3 us apart, standard errors of 0.5 us
    lone = _entry((1, 0, 1), (1, 0, 1))
    lone["runner_up"], lone["margin"] = None, None
    assert rule_choice(lone) is None  # one correct candidate: nothing to choose from


def test_with_finalists_the_rule_runs_over_all_of_them_the_default_preferred_inside_the_band():
    slow_default, fast = (128, 20.0, 1.0, 50), (32, 10.0, 2.5, 500)  # the old band: 350% wide
    entry = _entry(slow_default[1:], fast[1:], finalists=[fast, slow_default], default=slow_default)
    config, median = rule_choice(entry)
    assert config == certs.config(32) and median == 10.0
    near = (128, 10.2, 0.2, 50)  # within the band of the fastest: the default stays
    assert rule_choice(_entry(near[1:], fast[1:], finalists=[fast, near], default=near)) is None
    # a third finalist faster still is what the rule chooses, whatever the runner-up says
    fastest = (64, 5.0, 0.01, 500)
    config, median = rule_choice(_entry(near[1:], fast[1:], finalists=[fastest, fast, near], default=near))
    assert config == certs.config(64) and median == 5.0


def test_stale_lists_the_stale_keys_writes_them_as_a_keys_file_and_exits_1(tmp_path):
    stale_key, fresh_key = certs.key(n_rows=64), certs.key(n_rows=512)
    certs.write_file(
        tmp_path, {stale_key: _entry(*NOISY_BAND), fresh_key: _entry((10.0, 0.05, 500), (10.5, 0.05, 500))}
    )
    keys = tmp_path / "stale.jsonl"
    r = nbx("stale", tmp_path, "--out", keys)
    text = check(r, 1, must=["1 of 2 certified winners", "at worst", "1.791", stale_key], must_not=[fresh_key])
    assert "BLOCK=32,warps=4,stages=1" in text
    assert [json.loads(line) for line in keys.read_text().splitlines()] == [{"key": stale_key}]

    doc = check_json(nbx("stale", tmp_path, "--profile", "hopper", "--json"), 1)
    assert (doc["profile"], doc["entries"], doc["judged"]) == ("nvidia/hopper", 2, 2)
    (s,) = doc["stale"]
    assert s["key"] == stale_key and s["ratio"] == pytest.approx(46.56 / 26.0) and s["chosen_us"] == 26.0


def test_each_memory_class_entry_of_a_key_is_judged(tmp_path):
    """A key holding entries of two memory classes (`other_classes`) has each judged: the first stands, the other's
    winner is stale; the keys file names the key once."""
    key = certs.key()
    first = dict(_entry((10.0, 0.05, 500), (10.5, 0.05, 500)), memory_class="141GB")
    other = dict(_entry(*NOISY_BAND), memory_class="80GB")
    certs.write_file(tmp_path, {key: dict(first, other_classes={"80GB": other})})
    keys = tmp_path / "stale.jsonl"
    check(nbx("stale", tmp_path, "--out", keys), 1, must=["1 of 2 certified winners", key])
    assert [json.loads(line) for line in keys.read_text().splitlines()] == [{"key": key}]


def test_stale_of_a_directory_whose_winners_stand_exits_0(tmp_path):
    certs.write_file(tmp_path, {certs.key(): _entry((10.0, 0.05, 500), (10.5, 0.05, 500))})
    keys = tmp_path / "stale.jsonl"
    r = nbx("stale", tmp_path, "--out", keys)
    check(r, 0, must=[f"0 of 1 certified winners in {tmp_path} are not the one the winner rule chooses"])
    assert keys.read_text() == ""
    # nothing to judge is not a pass (it printed "0 of 0 certified winners ..." and exited 0)
    check(nbx("stale", tmp_path, "--profile", "ampere"), 1, must=["holds no certified entries for nvidia/ampere"])


def test_a_keys_file_of_two_profiles_is_refused_in_one_line(tmp_path):
    for profile in ("nvidia/hopper", "nvidia/ampere"):
        certs.write_file(tmp_path, {certs.key(): _entry(*NOISY_BAND)}, profile=profile)
    r = nbx("stale", tmp_path, "--out", tmp_path / "k.jsonl")
    check(r, 1, must=["nbxcert: usage: the stale keys are of 2 profiles", "give --profile"])
    assert not (tmp_path / "k.jsonl").exists()
    check(nbx("stale", tmp_path, "--profile", "ampere", "--out", tmp_path / "k.jsonl"), 1, must=["1 of 1"])
    assert (tmp_path / "k.jsonl").read_text() == json.dumps({"key": certs.key()}) + "\n"


def test_stale_refuses_an_invalid_directory_in_one_line(tmp_path):
    bad = tmp_path / "nvidia" / "hopper" / "rmsnorm.float16.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{")
    r = nbx("stale", tmp_path)
    check(r, 1, must=["nbxcert: invalid certificate:", "has 1 problem(s)", "nbxcert validate"])
    assert len([x for x in r.stderr.splitlines() if x.startswith("nbxcert:")]) == 1


def test_the_winner_is_judged_by_its_own_timing_and_each_row_names_its_memory_class(tmp_path):
    """A winner whose recorded median was edited to ten times its finalist row's is stale (the rule read the finalist
    row alone and chose it again, while show, diff, merge and export read the winner's own); a key stale in two memory
    classes is listed once per class, the table and `--json` naming each class (two rows that could not be told
    apart)."""
    slow, fast = (128, 10.0, 0.05, 500), (32, 10.5, 0.05, 500)
    edited = _entry(slow[1:], fast[1:], finalists=[slow, fast], default=fast)
    edited["winner"]["timing"].update(median_us=100.0, min_us=100.0)
    config, median = rule_choice(edited)
    assert config == certs.config(32) and median == 10.5

    key = certs.key()
    first = dict(_entry(*NOISY_BAND), memory_class="141GB")
    other = dict(_entry(*NOISY_BAND), memory_class="80GB")
    certs.write_file(tmp_path, {key: dict(first, other_classes={"80GB": other})})
    doc = check_json(nbx("stale", tmp_path, "--json"), 1)
    assert sorted((s["key"], s["memory_class"]) for s in doc["stale"]) == [(key, "141GB"), (key, "80GB")]
    rows = [line for line in check(nbx("stale", tmp_path), 1).splitlines() if key in line]
    assert len(rows) == 2 and "141GB" in rows[0] and "80GB" in rows[1]
