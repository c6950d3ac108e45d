"""Whether cache hints make a streaming pointwise kernel faster than torch's on this GPU.

A float16 |x| over 64 MB and 256 MB (more than the L2), written as a plain Triton kernel with each combination of a
load eviction policy ("", evict_first) and a store cache modifier ("", .cs: streaming), at 8 and 16 elements a thread,
next to torch.abs and torch's copy, every side timed by `triton.testing.do_bench` (its L2 flush before each
repetition), the variants interleaved over rounds and each given the median of its rounds. The question it answers:
does any hint move a DRAM-bound kernel past torch's by more than the rounds' spread (the pointwise bench's ops at the
memory's speed sit at 0.97-1.03x torch)?

    python3 benchmarks/probe_streaming.py --out probe.json [--rounds 5]

Needs an NVIDIA GPU, Triton and torch (a benchmark's peer; nbxcert is not used here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def absolute(x_ptr, y_ptr, n, BLOCK: tl.constexpr, LOAD_HINT: tl.constexpr, STORE_HINT: tl.constexpr):  # noqa: N803
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, eviction_policy=LOAD_HINT)
        tl.store(y_ptr + offs, tl.abs(x), mask=mask, cache_modifier=STORE_HINT)

    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__}
    for mb in (64, 256):
        n = mb * (1 << 20) // 2
        x = torch.randn(n, device="cuda", dtype=torch.float16)
        variants = {
            "torch.abs": lambda x=x: torch.abs(x),
            "torch copy (clone)": lambda x=x: x.clone(),
        }
        for per_thread in (8, 16):
            for warps in (4, 8):
                block = per_thread * 32 * warps
                for load_hint in ("", "evict_first"):
                    for store_hint in ("", ".cs"):

                        def run(x=x, n=n, block=block, warps=warps, load_hint=load_hint, store_hint=store_hint):
                            y = torch.empty_like(x)
                            absolute[(triton.cdiv(n, block),)](
                                x, y, n, BLOCK=block, LOAD_HINT=load_hint, STORE_HINT=store_hint, num_warps=warps
                            )
                            return y

                        hints = f"load {load_hint or '-'} store {store_hint or '-'}"
                        name = f"triton {per_thread}/thread {warps} warps {hints}"
                        variants[name] = run
        for fn in variants.values():
            fn()
        torch.cuda.synchronize()
        rounds = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                rounds[name].append(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
        base = statistics.median(rounds["torch.abs"])
        rows = []
        for name, times in rounds.items():
            ms = statistics.median(times)
            rows.append(
                {
                    "variant": name,
                    "us": ms * 1e3,
                    "rounds_us": [t * 1e3 for t in times],
                    "GBps": 2 * n * 2 / (ms * 1e-3) / 1e9,
                    "x_torch_abs": base / ms,
                }
            )
            print(f"{mb:4d} MB  {name:55s} {ms * 1e3:8.2f} us  {rows[-1]['GBps']:6.0f} GB/s  x{base / ms:.3f}")
        results[f"{mb}MB"] = rows
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
