"""Order a keys file for a certify run cut by a time limit: the keys a memory class lacks first, then those certified
by code that has changed since, then the rest (which certify skips), each group in the file's order. Rewrites the keys
file in place and says how many of each it put first.

    nbxcert coverage --profile hopper --keys keys.jsonl --memory-class 80GB --min 0 --json > coverage.json
    python3 benchmarks/order_keys.py keys.jsonl coverage.json

`gpu_certify.sh` does this before it certifies (unless ORDER=given).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def ordered(lines: list[str], report: dict) -> list[str]:
    """The keys file's lines (JSON objects with "key"), missing keys first, then `older_code`'s, then the rest; stable
    within each group (`report`: `nbxcert coverage --json`'s)."""
    rank = {key: 0 for key in report["missing"]}
    rank.update({key: 1 for key in report["older_code"]})
    return sorted(lines, key=lambda line: rank.get(json.loads(line)["key"], 2))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: order_keys.py KEYS_FILE COVERAGE_JSON", file=sys.stderr)
        return 2
    keys_path, report_path = map(Path, argv)
    lines = [line + "\n" for line in keys_path.read_text().splitlines() if line.strip()]
    report = json.loads(report_path.read_text())
    keys_path.write_text("".join(ordered(lines, report)))
    print(
        f"{len(report['missing'])} keys missing for the {report['memory_class']} class, "
        f"{len(report['older_code'])} made by older code: in that order, first"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
