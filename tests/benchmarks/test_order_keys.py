"""order_keys.py (what gpu_certify.sh runs before it certifies): the keys a class lacks first, then those made by
older code, then the rest, each group in the file's order, from `nbxcert coverage --json`'s own report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from clitools import check_json
from reliabilitytools import nbx

ROOT = Path(__file__).resolve().parents[2]


def test_missing_keys_first_then_older_code_then_the_rest(tmp_path):
    keys = tmp_path / "keys.jsonl"
    r = nbx("keys", "--profile", "interpreter", "--workload", "demo", "--json")
    assert r.returncode == 0, r.stderr
    keys.write_text(r.stdout)
    texts = [json.loads(line)["key"] for line in r.stdout.splitlines()]
    certs = tmp_path / "certs"
    shutil.copytree(ROOT / "certificates" / "cpu", certs / "cpu")
    path = certs / "cpu" / "interpreter" / "softmax.float16.json"
    doc = json.loads(path.read_text())
    softmax = sorted(doc["entries"])
    missing, older = softmax[-1], softmax[0]
    del doc["entries"][missing]
    doc["entries"][older]["provenance"]["code"] = "0" * 16  # made by other code
    path.write_text(json.dumps(doc))
    report = tmp_path / "coverage.json"
    args = ("coverage", "--profile", "interpreter", "--keys", keys, "--dir", certs, "--memory-class", "cpu")
    doc = check_json(nbx(*args, "--min", "0", "--json"), 0)
    assert (doc["missing"], doc["older_code"]) == ([missing], [older])
    report.write_text(json.dumps(doc))
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "order_keys.py"), str(keys), str(report)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1 keys missing for the cpu class, 1 made by older code: in that order, first"
    rest = [t for t in texts if t not in (missing, older)]
    assert [json.loads(line)["key"] for line in keys.read_text().splitlines()] == [missing, older, *rest]
