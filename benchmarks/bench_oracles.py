"""CPU time of the float64 attention oracle at a decode and a prefill shape (its cost is part of every certify and
verify of an attention key). `--oracle-file` times another version of `oracles/attention.py` on the same inputs and
reports the largest difference from this one's answer.

    python3 benchmarks/bench_oracles.py
    git show bf4036a:oracles/attention.py > /tmp/attention_before.py
    python3 benchmarks/bench_oracles.py --oracle-file /tmp/attention_before.py

Cases (float16 inputs, seed 0): decode, batch 16, 32 query heads on 4 KV heads of 64, KV lengths drawn in [1, 8192];
prefill, causal, 8 query heads on 2 KV heads of 64, 2048 tokens. Each the best of --repeats runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import numpy as np


def _cases(rng):
    b, h, kv, d, n = 16, 32, 4, 64, 8192
    decode = (
        rng.standard_normal((b, h, d)).astype(np.float16),
        rng.standard_normal((b, kv, n, d)).astype(np.float16),
        rng.standard_normal((b, kv, n, d)).astype(np.float16),
        rng.integers(1, n + 1, b),
    )
    s = 2048
    prefill = tuple(
        rng.standard_normal(shape).astype(np.float16) for shape in ((1, 8, s, 64), (1, 2, s, 64), (1, 2, s, 64))
    )
    return decode, prefill


def _run(oracle, decode, prefill):
    return {
        "decode": lambda: oracle.decode_attention(*decode, 0.125),
        "prefill": lambda: oracle.attention(*prefill, 0.125, True),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--oracle-file", help="another oracles/attention.py to time beside this one")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from nbxcert.oracles import attention

    oracles = {"this": attention}
    if args.oracle_file:
        spec = importlib.util.spec_from_file_location("attention_other", args.oracle_file)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        oracles["other"] = other
    decode, prefill = _cases(np.random.default_rng(0))
    answers = {}
    for label, oracle in oracles.items():
        for case, fn in _run(oracle, decode, prefill).items():
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                answers[label, case] = fn()
                best = min(best, time.perf_counter() - t0)
            print(f"{label:5s} {case:8s} {best:7.3f} s")
    if "other" in oracles:
        for case in ("decode", "prefill"):
            diff = max(
                float(np.abs(a - b).max()) for a, b in zip(answers["this", case], answers["other", case], strict=False)
            )
            print(f"{case}: largest difference of out and error scale between the two: {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
