"""The pointwise family through the engine: a `pw_` key certified on the interpreter (a real sweep into a fresh
directory) is then served from that certificate in certified-only mode, and the census cross-compiles every kept
candidate of a representative set of `pw_` specs for Hopper with no prune defect and no compile failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest


@pytest.fixture
def serving(monkeypatch, tmp_path):
    from nbxcert import serving

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NBXCERT_UNCERTIFIED", raising=False)
    serving.reset()
    yield serving
    serving.reset()


def test_a_certified_pointwise_key_is_served_in_certified_only_mode(backend, serving, monkeypatch, tmp_path):
    if backend.name != "interpreter":
        pytest.skip("certifies under the interpreter profile")
    from nbxcert import ops
    from nbxcert.certify import certify
    from nbxcert.kernels import pointwise as pw
    from nbxcert.kernels.tensor import empty, from_numpy
    from nbxcert.keys import make_key
    from nbxcert.profiles import get_profile

    gen = np.random.default_rng(30)
    a, b = (gen.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    x, y = from_numpy(a), from_numpy(b)
    spec = pw.SPECS["add"]
    problem = pw.problem_of("add", [x, y], empty((64, 64), "float32"))
    dtypes = ("float32",) * 3
    key = make_key(spec, problem, dtypes, get_profile("interpreter"))

    report = certify("interpreter", [key], tmp_path / "certs", jobs=1)
    assert report.ok and [k.status for k in report.keys] == ["certified"], report.keys
    winner = report.keys[0].winner
    assert report.keys[0].counts["correct"] > 1  # a sweep over candidates, not the default alone

    record = tmp_path / "keys.jsonl"
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(tmp_path / "certs"))
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "1")  # anything but the certificate is refused
    monkeypatch.setenv("NBXCERT_KEY_RECORD", str(record))
    got = ops.add(x, y)
    np.testing.assert_array_equal(got.numpy(), a + b)
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(e["key"], e["event"]) for e in events] == [(key.text(), "served")]
    assert serving.config_for(spec, problem, dtypes).label() == winner


# one spec of each shape of op: binary with a scalar parameter, integer division, ternary, comparison into bool,
# shifts, a wide transcendental, an activation, a conversion into every dtype, a generator with no operand
CENSUS_KERNELS = ("pw_add", "pw_div_floor", "pw_lerp", "pw_eq", "pw_bitwise_left_shift", "pw_exp", "pw_gelu")
CENSUS_KERNELS += ("pw_cast", "pw_arange")


@pytest.mark.slow
def test_census_of_pointwise_specs_for_hopper(tmp_path):
    """`nbxcert census --profile hopper --kernels pw_add,...` on one key per spec (its mixed-layout example problem at
    its first and last dtypes): every kept candidate compiles for sm_90 and fits the device file. A census of every
    dtype of every `pw_` spec is some 23,000 compiles (hours on two cores); this one is about 250. Run in a
    subprocess: census workers are not in interpreter mode."""
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import make_key
    from nbxcert.profiles import get_profile

    hopper = get_profile("hopper")
    keys = tmp_path / "keys.jsonl"
    lines = []
    for name in CENSUS_KERNELS:
        spec = get_spec(name)
        for dtypes in dict.fromkeys((spec.dtypes[0], spec.dtypes[-1])):
            lines.append(json.dumps({"key": make_key(spec, spec.example_problems[1], dtypes, hopper).text()}))
    keys.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "NBXCERT_BACKEND": "interpreter", "COLUMNS": "250"}
    cmd = [sys.executable, "-m", "nbxcert", "census", "--profile", "hopper", "--kernels", ",".join(CENSUS_KERNELS)]
    r = subprocess.run([*cmd, "--keys", str(keys), "--jobs", "2", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    rows = {k["kernel"]: k for k in doc["kernels"]}
    assert sorted(rows) == sorted(CENSUS_KERNELS)
    for row in rows.values():
        assert row["kept"] > 0 and row["compiled"] == row["kept"], row
        assert row["defects"] == 0 and row["failures"] == 0, (doc["defects"], doc["failures"])
    totals = doc["totals"]
    assert totals["compiled"] == totals["kept"] and totals["defects"] == totals["failures"] == 0, totals
