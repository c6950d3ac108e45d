"""How many winners a re-certification changed: the keys of certificates/nvidia/hopper/ certified by nbxcert VERSION
at commit NEW, and how many of them name another winner config than at commit OLD.

    python3 benchmarks/changed_winners.py OLD NEW VERSION   # e.g. 11ff767 d82bfcd 0.3.0
"""

from __future__ import annotations

import json
import subprocess
import sys

DIR = "certificates/nvidia/hopper/"


def _entries(commit: str, path: str) -> dict:
    text = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout
    return json.loads(text)["entries"]


def main(argv: list[str]) -> int:
    old, new, version = argv
    listed = subprocess.run(["git", "ls-tree", "--name-only", new, DIR], capture_output=True, text=True, check=True)
    changed = total = 0
    for path in (p for p in listed.stdout.split() if p.endswith(".json")):
        before, after = _entries(old, path), _entries(new, path)
        for key, entry in after.items():
            if entry["provenance"]["nbxcert"] == version:
                total += 1
                changed += key not in before or entry["winner"]["config"] != before[key]["winner"]["config"]
    print(f"{changed} of {total} keys certified by nbxcert {version} at {new} name another winner than at {old}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
