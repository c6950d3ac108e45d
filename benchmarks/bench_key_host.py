"""The host's part of certifying a key: its seeded inputs and its float64 oracle, at both ends of the key's bucket,
as a certify runner makes them (`spec.make_inputs`, then `spec.oracle`), on the CPU (no GPU needed; the tensors lie
on the host). Each key the best of `--repeats` runs, both ends summed. Run it once with `OMP_NUM_THREADS=1` (the
oracles' and inputs' parts on one core: `nbxcert.oracles.parts`) and once without, to see what the cores give.

    python3 benchmarks/bench_key_host.py --key 'pw_pow[numel=33554432,...]@v1' [--key ...] [--profile hopper]
        [--repeats 3] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def time_key(text: str, profile_name: str, repeats: int) -> dict:
    """{"key", "inputs_s", "oracle_s"}: the best of `repeats` runs of both ends' inputs and oracle."""
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import key_problems, parse_key
    from nbxcert.profiles import get_profile

    key = parse_key(text)
    spec = get_spec(key.kernel)
    problems = key_problems(spec, key, get_profile(profile_name))
    roles = ("largest",) if problems["smallest"] == problems["largest"] else ("smallest", "largest")
    best_inputs = best_oracle = float("inf")
    for _ in range(repeats):
        inputs_s = oracle_s = 0.0
        for role in roles:
            t0 = time.perf_counter()
            inputs = spec.make_inputs(problems[role], tuple(key.dtypes), 0, "cpu")
            t1 = time.perf_counter()
            spec.oracle(inputs)
            inputs_s += t1 - t0
            oracle_s += time.perf_counter() - t1
            del inputs
        best_inputs, best_oracle = min(best_inputs, inputs_s), min(best_oracle, oracle_s)
    return {"key": key.text(), "inputs_s": best_inputs, "oracle_s": best_oracle}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", action="append", required=True, help="a launch key (repeat for more)")
    parser.add_argument("--profile", default="hopper", help="the profile whose ladders bucket the keys")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each key; the best is kept (default 3)")
    parser.add_argument("--out", help="write the results as JSON to this path")
    args = parser.parse_args(argv)
    os.environ.setdefault("NBXCERT_BACKEND", "interpreter")  # the tensors lie on the host
    from nbxcert.oracles.parts import threads

    rows = []
    for text in args.key:
        row = time_key(text, args.profile, args.repeats)
        rows.append(row)
        print(f"{row['inputs_s']:7.2f} s inputs {row['oracle_s']:7.2f} s oracle  {row['key']}", flush=True)
    if args.out:
        meta = {"threads": threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "repeats": args.repeats}
        Path(args.out).write_text(json.dumps({**meta, "keys": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
