"""Quantized-weight products on the GPU: the best kept candidate against torch's float16 matmul on the dequantised
weights (the reference speed an int4 kernel has to beat to be worth serving), measured in the same run.

    python benchmarks/bench_quant.py --out quant.json

Cases (float16 activations; Llama-3-8B's 4096 x 4096 and 4096 x 14336 projections, both ways): dequant_gemv at M = 1
and 4, dequant_matmul at M = 16 and 512, int4 (GPTQ, group 128) and int8 (per channel). For each, every candidate the
device profile's prune keeps is timed (nbxcert's event timer, `do_bench_events`: an L2 flush before each repetition,
the median), the best is checked against the float64 oracle (`nbxcert.oracles.quant`) on the whole output, and its
effective bandwidth is (quantized weight + scales + zeros + X + out bytes) / time.

torch runs in its own process (`PEER_SCRIPT`; nbxcert never imports torch): `x @ w` with w the float16 [K, N]
weight (the dequantised one's size and layout), timed with `triton.testing.do_bench` (L2 flush, median).
"""

from __future__ import annotations

import sys

import common

CASES = (
    ("dequant_gemv", "int4", 1, 4096, 4096),
    ("dequant_gemv", "int4", 1, 14336, 4096),
    ("dequant_gemv", "int4", 1, 4096, 14336),
    ("dequant_gemv", "int4", 4, 14336, 4096),
    ("dequant_gemv", "int8", 1, 14336, 4096),
    ("dequant_matmul", "int4", 16, 4096, 4096),
    ("dequant_matmul", "int4", 16, 14336, 4096),
    ("dequant_matmul", "int4", 512, 14336, 4096),
    ("dequant_matmul", "int4", 512, 4096, 14336),
    ("dequant_matmul", "int8", 512, 14336, 4096),
)  # (kernel, format, M, N, K)

PEER_SCRIPT = (
    common.PEER_HEAD
    + r"""
for name, fmt, m, n, k in cases:
    key = f"{m}x{n}x{k}"
    if key in out:
        continue
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(k, n, device="cuda", dtype=torch.float16) * 0.05
    out[key] = triton.testing.do_bench(lambda: x @ w, warmup=warmup, rep=rep, return_mode="median")
"""
    + common.PEER_TAIL
)


def moved_bytes(inputs) -> int:
    """Bytes read + written once each: every tensor of the launch (weights, scales, zeros, X and out)."""
    return sum(t.nbytes for t in inputs.tensors.values())


def main() -> int:
    args, cuda, profile, how, device_name, peer = common.start(__doc__, "bench_quant", PEER_SCRIPT, CASES)
    from nbxcert.kernels import quant

    specs = {s.name: s for s in quant.SPECS}

    results = []
    for name, fmt, m, n, k in CASES:
        spec = specs[name]
        problem = {"M": m, "N": n, "K": k, "format": fmt}
        inputs = spec.make_inputs(problem, ("float16",), 0, "cuda:0")
        t = inputs.tensors

        def call(config, t=t, name=name, fmt=fmt):
            launches = quant.quant_launches(
                config, name == "dequant_gemv", fmt, t["x"], t["qweight"], t["scales"], t.get("qzeros"), t["out"]
            )
            return common.call_all(launches)

        timings = common.time_kept(spec, problem, profile, call, args.warmup, args.rep)
        best_ms, best = timings[0]
        verdict = common.check(spec, best, problem, ("float16",), profile, inputs)
        moved = moved_bytes(inputs)
        torch_ms = peer.get("ms", {}).get(f"{m}x{n}x{k}")
        results.append(
            {
                "kernel": name,
                "format": fmt,
                "shape": {"M": m, "N": n, "K": k},
                "dtype": "float16",
                "bytes_moved": moved,
                "best_config": best.as_dict(),
                "best_label": best.label(),
                "best_ms": best_ms,
                "effective_GBps": moved / (best_ms * 1e-3) / 1e9,
                "TFLOPs": 2 * m * n * k / (best_ms * 1e-3) / 1e12,
                "torch_fp16_matmul_ms": torch_ms,
                "speedup_vs_fp16_matmul": torch_ms / best_ms if torch_ms else None,
                "check": verdict,
                "candidates": common.candidate_times(timings),
            }
        )
        common.print_case(f"{name} {fmt} {m}x{n}x{k}", timings)

    common.print_opening(device_name, profile, how, peer)
    header = f"{'kernel':15s} {'fmt':4s} {'M x N x K':>17s} {'best us':>9s} {'GB/s':>7s} {'fp16 us':>9s} {'x fp16':>7s}"
    print("\n".join(common.table_lines(header + "  best", results, row)))
    common.write_results(args.out, device_name, profile, how, peer, results)
    return 0


def row(r: dict) -> str:
    """One case's line of the table."""
    s = r["shape"]
    shape = f"{s['M']}x{s['N']}x{s['K']}"
    t_us, sp = common.torch_cells(r["torch_fp16_matmul_ms"], r["speedup_vs_fp16_matmul"], speed_width=7)
    return (
        f"{r['kernel']:15s} {r['format']:4s} {shape:>17s} {r['best_ms'] * 1e3:9.1f} {r['effective_GBps']:7.0f} "
        f"{t_us} {sp}  {r['best_label']}"
    )


if __name__ == "__main__":
    sys.exit(main())
