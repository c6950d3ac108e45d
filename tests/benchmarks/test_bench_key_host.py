"""bench_key_host.py on a small key: both ends' inputs and oracle timed, the results written."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_small_key_is_timed_at_both_ends(tmp_path, capsys):
    sys.path.insert(0, str(BENCH))
    try:
        bench = importlib.import_module("bench_key_host")
        key = "pw_add[numel=4096,out=dense,x=dense,y=dense,z=none;float16,float16,float16]@v1"
        out = tmp_path / "host.json"
        assert bench.main(["--key", key, "--repeats", "1", "--out", str(out)]) == 0
    finally:
        sys.modules.pop("bench_key_host", None)
        sys.path.remove(str(BENCH))
    rows = json.loads(out.read_text())["keys"]
    assert [r["key"] for r in rows] == [key] and rows[0]["inputs_s"] > 0 and rows[0]["oracle_s"] > 0
    assert key in capsys.readouterr().out
