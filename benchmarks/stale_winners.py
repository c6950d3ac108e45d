"""Keys whose certified winner is significantly slower than their own runner-up, read from the certificates alone.

The sweep's winner rule (`nbxcert.sweep.choose_winner`) prefers the untuned default, then the simplest candidate,
among those whose median cannot be told apart from the fastest's. nbxcert 0.1.0 judged "cannot be told apart" by the
fastest's raw spread, which a noisy fastest candidate made as wide as 100% and more. Under today's rule (medians
within `Z` standard errors of their difference) a certificate names another winner exactly when its winner's median
lies outside today's band around the fastest finalist, which is its runner-up whenever the runner-up is faster (a
winner that is the fastest, or inside today's band, is chosen again: today's band is narrower and holds the fastest).
So these keys, and only these, need their sweep again; the list is a keys file for `nbxcert certify --keys`.
Certificates made by nbxcert 0.2.0 on keep every fully timed candidate (`finalists`): for them the rule itself is
applied to all of them, whatever it becomes.

    python3 benchmarks/stale_winners.py certificates/nvidia/hopper --out stale.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def stale(entry: dict, kernel: str | None = None) -> float | None:
    """The certified winner's median over the one today's rule chooses, where they differ; else None. Today's rule
    (`choose_winner`) is what judges: over a certificate's `finalists` (nbxcert 0.2.0 on; the kernel names the untuned
    default) or, for an older one, over its winner and runner-up with the winner in the default's place (the module
    doc says why that is the same question)."""
    from nbxcert.kernels.spec import Config
    from nbxcert.sweep import Outcome, choose_winner

    def outcome(side: dict) -> Outcome:
        return Outcome(Config.from_dict(side["config"]), "correct", timing=side["timing"])

    winner = outcome(entry["winner"])
    if entry.get("finalists") and kernel is not None:
        from nbxcert.kernels.spec import get_spec

        candidates, default = [outcome(f) for f in entry["finalists"]], get_spec(kernel).default
    elif entry.get("runner_up"):
        candidates, default = [winner, outcome(entry["runner_up"])], winner.config
    else:
        return None
    chosen, _ = choose_winner(candidates, default)
    return None if chosen.config == winner.config else winner.median / chosen.median


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a profile's certificate directory, e.g. certificates/nvidia/hopper")
    parser.add_argument("--out", help="write the keys as JSON lines (nbxcert certify --keys) to this file")
    args = parser.parse_args(argv)
    found, total = [], 0
    for path in sorted(Path(args.directory).glob("*.json")):
        doc = json.loads(path.read_text())
        for key, entry in doc["entries"].items():
            total += 1
            ratio = stale(entry, doc.get("kernel"))
            if ratio is not None:
                found.append((key, ratio))
    for key, ratio in sorted(found, key=lambda kr: -kr[1])[:10]:
        print(f"{ratio:5.2f}x  {key}")
    ratios = sorted(r for _, r in found)
    median = ratios[len(ratios) // 2] if ratios else 0.0
    print(f"{len(found)} of {total} certified winners are not the one today's rule chooses (significantly slower)"
          + (f" (median {median:.3f}x, worst {ratios[-1]:.2f}x)" if ratios else ""))  # fmt: skip
    if args.out:
        Path(args.out).write_text("".join(json.dumps({"key": key}) + "\n" for key, _ in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
