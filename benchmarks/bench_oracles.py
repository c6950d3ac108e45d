"""CPU time of a float64 oracle on the host (its cost is part of every certify and verify of its keys): attention at
a decode and a prefill shape, (`--module vision`) conv2d at sd-unet-block's largest 3x3 key, or (`--module quant`) the
quantized products at a gate-up projection. `--oracle-file` times another version of the module on the same inputs and
reports the largest difference from this one's answer.

    python3 benchmarks/bench_oracles.py
    git show bf4036a:oracles/attention.py > /tmp/attention_before.py
    python3 benchmarks/bench_oracles.py --oracle-file /tmp/attention_before.py
    git show 12dc62a:oracles/vision.py > /tmp/vision_before.py
    python3 benchmarks/bench_oracles.py --module vision --oracle-file /tmp/vision_before.py --repeats 1

Cases (float16 inputs, seed 0): decode, batch 16, 32 query heads on 4 KV heads of 64, KV lengths drawn in [1, 8192];
prefill, causal, 8 query heads on 2 KV heads of 64, 2048 tokens; conv2d, batch 8, 640 channels in and out, 32 x 32,
3 x 3, padding 1, with a bias (numpy's matrix product: the host's, as where no GPU computes it); `--module quant`,
the dequantizing product at llama-3-8b's gate-up projection (16 tokens, K 4096, N 28672), int4 (group 128) and int8,
as where no GPU dequantizes the weight (`kernels.quant64` does where one does; `--quant-shape M,K,N` another
shape). Each the best of --repeats runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import numpy as np


def _conv2d_case(rng):
    x = rng.standard_normal((8, 640, 32, 32)).astype(np.float16)
    w = (rng.standard_normal((640, 640, 3, 3)) * 0.02).astype(np.float16)
    return x, w, rng.standard_normal(640).astype(np.float16)


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


def _quant_cases(rng, shape=(16, 4096, 28672)):
    """(M, K, N): by default llama-3-8b's gate-up projection, 16 tokens; int4 with group 128 and int8 per channel."""
    m, k, n = shape
    if k % 128 or n % 8:
        raise SystemExit(f"bench_oracles.py: --quant-shape {m},{k},{n}: K must be a multiple of 128 and N of 8")
    x = rng.standard_normal((m, k)).astype(np.float16)
    words = lambda shape: rng.integers(-(2**31), 2**31, shape, dtype=np.int64).astype(np.int32)  # noqa: E731
    int4 = (
        x,
        "int4",
        words((k // 8, n)),
        rng.standard_normal((k // 128, n)).astype(np.float16),
        words((k // 128, n // 8)),
    )
    int8 = (
        x,
        "int8",
        rng.integers(-128, 128, (k, n), dtype=np.int64).astype(np.int8),
        rng.random(n).astype(np.float16),
    )
    return int4, int8


def _run(module: str, oracle, rng, quant_shape=(16, 4096, 28672)) -> dict:
    """{case: a call of `oracle` (a version of oracles/<module>.py) on the module's cases}."""
    if module == "quant":
        int4, int8 = _quant_cases(rng, quant_shape)
        kw = {"acc_eps": 2.0**-23, "out_eps": 2.0**-11}
        return {"int4": lambda: oracle.dequant_matmul(*int4, **kw), "int8": lambda: oracle.dequant_matmul(*int8, **kw)}
    if module == "vision":
        x, w, b = _conv2d_case(rng)
        kw = {"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "acc_eps": 2.0**-24, "out_eps": 2.0**-11}
        return {"conv2d": lambda: oracle.conv2d(x, w, b, **kw)}
    decode, prefill = _cases(rng)
    return {
        "decode": lambda: oracle.decode_attention(*decode, 0.125),
        "prefill": lambda: oracle.attention(*prefill, 0.125, True),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--module", choices=("attention", "vision", "quant"), default="attention", help="the oracles timed"
    )
    parser.add_argument("--oracle-file", help="another oracles/<module>.py to time beside this one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quant-shape", default="16,4096,28672", help="M,K,N of `--module quant`'s product (default: the gate-up's)"
    )
    args = parser.parse_args(argv)
    try:
        quant_shape = tuple(int(v) for v in args.quant_shape.split(","))
    except ValueError:
        quant_shape = ()
    if len(quant_shape) != 3 or min(quant_shape) < 1:
        parser.error(f"--quant-shape {args.quant_shape!r}: three positive integers M,K,N")
    oracles = {"this": importlib.import_module(f"nbxcert.oracles.{args.module}")}
    if args.oracle_file:
        spec = importlib.util.spec_from_file_location(f"{args.module}_other", args.oracle_file)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        oracles["other"] = other
    answers = {}
    for label, oracle in oracles.items():
        for case, fn in _run(args.module, oracle, np.random.default_rng(0), quant_shape).items():
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                answers[label, case] = fn()
                best = min(best, time.perf_counter() - t0)
            print(f"{label:5s} {case:8s} {best:7.3f} s")
    if "other" in oracles:
        for case in sorted({c for _, c in answers}):
            diff = max(
                float(np.abs(a - b).max()) for a, b in zip(answers["this", case], answers["other", case], strict=False)
            )
            print(f"{case}: largest difference of out and error scale between the two: {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
