"""Benchmark the attention family on an NVIDIA GPU: prefill against torch's scaled_dot_product_attention (in its own
process), decode against the GPU's measured copy bandwidth.

Prefill: for each shape every candidate the prune keeps for the GPU's profile is timed (CUDA events, L2 flushed
before each repetition, median: `triton_cuda.do_bench_events`); the fastest is checked against the float64 oracle on
a slice (batch 0, its first heads) and compared with `torch.nn.functional.scaled_dot_product_attention` timed the same
way in a subprocess (nbxcert never imports torch). FLOPs = 4·B·H·S²·D, halved when causal.

Decode (contiguous and paged, block size 16): every kept candidate is timed; the fastest one's bandwidth (the K and V
bytes it must read, over its time) is compared with the copy bandwidth measured on the same GPU (the faster of the
driver's device-to-device memcpy and a Triton copy kernel, bytes read + written over the time).

A candidate that fails to compile or launch is recorded with its reason, never scored as infinitely slow.

    python benchmarks/bench_attention.py --out results.json [--dtype float16] [--only prefill|decode]

Targets: >= 0.75x SDPA at B4 H32 S4096 D128 (causal and not), >= 0.90x at B8 H32 S1024 D64 and B32 H32 S512 D64
(causal); decode >= 70% of the copy bandwidth (B32, H32, 8 KV heads, D128, every sequence 4096 long).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import common
import triton.language as tl

# name -> (batch, heads, seq, head_dim, causal, target ratio vs SDPA)
PREFILL_SHAPES = {
    "B4 H32 S4096 D128": (4, 32, 4096, 128, False, 0.75),
    "B4 H32 S4096 D128 causal": (4, 32, 4096, 128, True, 0.75),
    "B8 H32 S1024 D64 causal": (8, 32, 1024, 64, True, 0.90),
    "B32 H32 S512 D64 causal": (32, 32, 512, 64, True, 0.90),
}
# name -> (batch, heads, kv_heads, kv_len, head_dim, block_size or None)
DECODE_SHAPES = {
    "decode B32 H32 KV8 D128 L4096": (32, 32, 8, 4096, 128, None),
    "paged decode B32 H32 KV8 D128 L4096 bs16": (32, 32, 8, 4096, 128, 16),
}
DECODE_TARGET = 0.70

# The SDPA peer: torch in its own process, timed as nbxcert's side is (`common.PEER_TIMER`). Prints one JSON object.
PEER_SCRIPT = (
    common.PEER_TIMER
    + r"""
import torch.nn.functional as F
args = json.loads(sys.argv[1])
dtype = getattr(torch, args["dtype"])
out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "results": {}}
g = torch.Generator(device="cuda").manual_seed(0)
for name, (b, h, s, d, causal) in args["shapes"].items():
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    median, reps = peer_times(fn, args["warmup_ms"], args["rep_ms"])
    names = ("flash", "mem_efficient", "cudnn", "math")
    backends = {n: getattr(torch.backends.cuda, n + "_sdp_enabled")() for n in names}
    out["results"][name] = {"median_ms": median, "reps": reps, "sdp_enabled": backends}
    del q, k, v
print(json.dumps(out))
"""
)


def prefill_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    return 4.0 * b * h * s * s * d / (2.0 if causal else 1.0)


def run_peer(shapes: dict, dtype: str, warmup_ms: float, rep_ms: float) -> dict:
    payload = {
        "shapes": {k: v[:5] for k, v in shapes.items()},
        "dtype": dtype,
        "warmup_ms": warmup_ms,
        "rep_ms": rep_ms,
    }
    proc = subprocess.run(
        [sys.executable, "-c", PEER_SCRIPT, json.dumps(payload)], capture_output=True, text=True, timeout=900
    )
    return common.last_json(proc)


def _randn(gen, shape, dtype, device):
    """Normal values through float32 (the host generator is the slow part at these sizes)."""
    from nbxcert.kernels.tensor import from_numpy

    return from_numpy(gen.standard_normal(shape, dtype="float32"), dtype, device)


def time_candidates(spec, problem, configs, launch_of, warmup_ms, rep_ms, log, dtype: str, profile):
    """Time each config (`launch_of(config)` runs one launch); return (rows, refused). The configs are compiled
    ahead in a pool first (`nbxcert.warm.compile_ahead`, inputs of the spec's own making for `problem`)."""
    from nbxcert.warm import compile_ahead

    compile_ahead(spec, problem, (dtype,), configs, profile.key)
    rows, refused = [], []
    for config, times, t0 in common.time_each(configs, launch_of, warmup_ms, rep_ms, refused, log):
        rows.append({"config": config.label(), "kwargs": config.as_dict(), "median_ms": statistics.median(times)})
        log(f"    {rows[-1]['median_ms']:.4f} ms  {config.label()}  ({time.time() - t0:.1f}s)")
    return rows, refused


def bench_prefill(name, shape, dt, profile, device, args, log) -> dict:
    import numpy as np

    from nbxcert.kernels import attention as A
    from nbxcert.kernels.compare import compare
    from nbxcert.kernels.spec import Config
    from nbxcert.kernels.tensor import empty
    from nbxcert.oracles import attention as oracle

    b, h, s, d, causal, target = shape
    gen = np.random.default_rng(0)
    q, k, v = (_randn(gen, (b, h, s, d), dt, device) for _ in range(3))
    out = empty((b, h, s, d), dt, device)
    problem = A.FLASH_ATTENTION.problem_of(q, k, v, out, causal=causal)
    scale = 1.0 / math.sqrt(d)
    pruned = A.FLASH_ATTENTION.pruned_for(problem, profile)
    configs = pruned.kept if not args.default_only else [A.FLASH_ATTENTION.default]
    configs = [c for c in configs if args.configs in c.label()]

    def launch_of(config):
        for launch in A.flash_launches(config, q, k, v, out, scale, causal):
            launch()

    rows, refused = time_candidates(
        A.FLASH_ATTENTION, problem, configs, launch_of, args.warmup_ms, args.rep_ms, log, dt, profile
    )
    refused += [{"config": c.label(), "reason": f"pruned: {r}"} for c, r in pruned.pruned]
    entry = {"problem": problem, "flop": prefill_flops(b, h, s, d, causal), "target": target}
    entry.update(candidates=rows, refused=refused)
    if rows:
        best = min(rows, key=lambda r: r["median_ms"])
        launch_of(Config.from_dict(best["kwargs"]))
        heads = min(h, 4)  # judge batch 0's first heads: the full float64 oracle is minutes of numpy at these sizes
        ref, err = oracle.attention(
            q.float64()[:1, :heads], k.float64()[:1, :heads], v.float64()[:1, :heads], scale, causal
        )
        got = out.float64()[:1, :heads]
        verdict = compare(got, ref, err, out.dtype, profile.tolerance(dt), f"flash_attention {best['config']} {name}")
        best = dict(best, tflops=entry["flop"] / best["median_ms"] / 1e9, oracle_ok=verdict.ok)
        if not verdict.ok:
            best["oracle_report"] = verdict.report
        entry["best"] = best
    return entry


def _copy_kernel():
    """A plain Triton copy, decorated when first needed (after `main` has chosen the backend)."""
    from nbxcert.kernels.jit import jit

    return jit(_copy_body)


def _copy_body(src, dst, n, BLOCK: tl.constexpr):
    """dst[i] = src[i] for i < n. src, dst: int32 pointers; n: elements; BLOCK: elements per program."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def measure_copy_bandwidth(device, warmup_ms, rep_ms) -> dict:
    """Bytes read + written per second of a 2 GiB device-to-device copy: the driver's memcpy (timed with events
    around the synchronous call) and a Triton copy kernel (do_bench_events), GB/s each."""
    import triton

    from nbxcert.kernels.backends import cuda, triton_cuda
    from nbxcert.kernels.tensor import empty

    _copy = _copy_kernel()
    n = 1 << 29  # int32 elements: 2 GiB
    src, dst = empty((n,), "int32", device), empty((n,), "int32", device)
    src.fill_(7)
    nbytes = 2 * n * 4
    times = triton_cuda.do_bench_events(
        lambda: _copy[(triton.cdiv(n, 4096),)](src, dst, n, BLOCK=4096, num_warps=8), warmup_ms, rep_ms
    )
    triton_gbs = nbytes / statistics.median(times) / 1e6
    memcpy_ms = []
    for _ in range(10):
        start, end = cuda.Event(), cuda.Event()
        start.record()
        cuda.memcpy_dtod(dst.data_ptr(), src.data_ptr(), n * 4)
        end.record()
        end.synchronize()
        memcpy_ms.append(cuda.Event.elapsed_ms(start, end))
    memcpy_gbs = nbytes / statistics.median(memcpy_ms) / 1e6
    return {"triton_copy_GBps": triton_gbs, "memcpy_GBps": memcpy_gbs, "copy_GBps": max(triton_gbs, memcpy_gbs)}


def bench_decode(name, shape, dt, profile, device, args, log) -> dict:
    import numpy as np

    from nbxcert.kernels import attention as A
    from nbxcert.kernels.compare import compare
    from nbxcert.kernels.spec import Config
    from nbxcert.kernels.tensor import empty, from_numpy
    from nbxcert.oracles import attention as oracle

    b, h, hkv, length, d, block_size = shape
    gen = np.random.default_rng(1)
    q = _randn(gen, (b, h, d), dt, device)
    lengths = from_numpy(np.full(b, length, dtype=np.int32), "int32", device)
    out = empty((b, h, d), dt, device)
    workspace = A.decode_workspace(b, h, d, device)
    scale = 1.0 / math.sqrt(d)
    problem = {"batch": b, "heads": h, "kv_heads": hkv, "kv_len": length, "head_dim": d}
    if block_size is None:
        spec = A.DECODE_ATTENTION
        k, v = (_randn(gen, (b, hkv, length, d), dt, device) for _ in range(2))
        table = None
    else:
        spec = A.PAGED_DECODE_ATTENTION
        problem["block_size"] = block_size
        per_seq = length // block_size
        k, v = (_randn(gen, (b * per_seq, block_size, hkv, d), dt, device) for _ in range(2))
        table = from_numpy(gen.permutation(b * per_seq).reshape(b, per_seq).astype(np.int32), "int32", device)
    kv_bytes = 2 * b * hkv * length * d * k.itemsize
    pruned = spec.pruned_for(problem, profile)
    configs = pruned.kept if not args.default_only else [spec.default]
    configs = [c for c in configs if args.configs in c.label()]

    def launch_of(config):
        for launch in A.decode_launches(config, q, k, v, lengths, out, scale, workspace, block_table=table):
            launch()

    rows, refused = time_candidates(spec, problem, configs, launch_of, args.warmup_ms, args.rep_ms, log, dt, profile)
    refused += [{"config": c.label(), "reason": f"pruned: {r}"} for c, r in pruned.pruned]
    entry = {"problem": problem, "kv_bytes": kv_bytes, "candidates": rows, "refused": refused}
    if rows:
        best = min(rows, key=lambda r: r["median_ms"])
        launch_of(Config.from_dict(best["kwargs"]))
        seqs = 2  # judge the first sequences against the float64 oracle
        if table is None:
            ref, err = oracle.decode_attention(
                q.float64()[:seqs], k.float64()[:seqs], v.float64()[:seqs], lengths.numpy()[:seqs], scale
            )
        else:
            ref, err = oracle.paged_decode_attention(
                q.float64()[:seqs], k.float64(), v.float64(), table.numpy()[:seqs], lengths.numpy()[:seqs], scale
            )
        verdict = compare(
            out.float64()[:seqs], ref, err, out.dtype, profile.tolerance(dt), f"{spec.name} {best['config']} {name}"
        )
        best = dict(best, GBps=kv_bytes / best["median_ms"] / 1e6, oracle_ok=verdict.ok)
        if not verdict.ok:
            best["oracle_report"] = verdict.report
        entry["best"] = best
    return entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON results")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--only", default="", choices=("", "prefill", "decode"), help="run one half only")
    ap.add_argument("--shapes", default="", help="only the shapes whose names contain one of these (comma-separated)")
    ap.add_argument("--default-only", action="store_true", help="time the spec's default config only (no sweep)")
    ap.add_argument("--configs", default="", help="only the kept configs whose label contains this text (e.g. TMA=1)")
    ap.add_argument("--warmup-ms", type=float, default=25.0)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--no-peer", action="store_true", help="skip the SDPA peer")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    choice, info, profile, match = common.cuda_device("bench_attention")
    print(common.device_line(info, profile, match))
    log = common.progress_log(args.quiet)
    wanted = [w.strip() for w in args.shapes.split(",") if w.strip()]

    def chosen(names):
        return [n for n in names if not wanted or any(w in n for w in wanted)]

    dt = args.dtype
    results = {"device": info.name, "profile": profile.key, "dtype": dt, "prefill": {}, "decode": {}}
    prefill = chosen(PREFILL_SHAPES) if args.only in ("", "prefill") else []
    decode = chosen(DECODE_SHAPES) if args.only in ("", "decode") else []
    peer = {}
    if prefill and not args.no_peer:  # first, while nothing of ours holds the GPU's memory
        print("== SDPA peer (torch, own process)", flush=True)
        peer = run_peer({n: PREFILL_SHAPES[n] for n in prefill}, dt, args.warmup_ms, args.rep_ms)
        results["peer"] = peer
        if "error" in peer:
            print(f"SDPA peer failed: {peer['error']}")
    for name in prefill:
        print(f"== {name} ({dt})", flush=True)
        results["prefill"][name] = bench_prefill(name, PREFILL_SHAPES[name], dt, profile, choice.device, args, log)
        common.write_json(args.out, results)  # what is measured so far survives a run cut short
    if decode:
        print("== copy bandwidth", flush=True)
        results["copy"] = measure_copy_bandwidth(choice.device, args.warmup_ms, args.rep_ms)
        print(f"    {results['copy']}", flush=True)
    for name in decode:
        print(f"== {name} ({dt})", flush=True)
        results["decode"][name] = bench_decode(name, DECODE_SHAPES[name], dt, profile, choice.device, args, log)
        common.write_json(args.out, results)

    all_met = True
    print()
    header = f"{'shape':>42} {'best ms':>9} {'TFLOP/s':>8} {'SDPA ms':>9} {'ratio':>6} {'target':>6}  best config"
    common.print_header(header)
    for name in prefill:
        entry = results["prefill"][name]
        best = entry.get("best")
        peer_ms = peer.get("results", {}).get(name, {}).get("median_ms")
        if best is None:
            print(f"{name:>42} (no candidate ran)")
            all_met = False
            continue
        ratio = peer_ms / best["median_ms"] if peer_ms else None
        entry.update(sdpa_ms=peer_ms, ratio=ratio, target_met=None if ratio is None else ratio >= entry["target"])
        all_met = all_met and entry["target_met"] is not False and best["oracle_ok"]
        flag = "" if best["oracle_ok"] else "  ORACLE MISMATCH"
        print(
            f"{name:>42} {best['median_ms']:>9.4f} {best['tflops']:>8.1f} {peer_ms or float('nan'):>9.4f} "
            f"{ratio or float('nan'):>6.3f} {entry['target']:>6}  {best['config']}{flag}"
        )
    if decode:
        copy = results["copy"]["copy_GBps"]
        print(f"\ncopy bandwidth (read + written): {copy:.0f} GB/s")
        header = f"{'shape':>42} {'best ms':>9} {'GB/s':>8} {'of copy':>8} {'target':>6}  best config"
        common.print_header(header)
        for name in decode:
            entry = results["decode"][name]
            best = entry.get("best")
            if best is None:
                print(f"{name:>42} (no candidate ran)")
                all_met = False
                continue
            frac = best["GBps"] / copy
            entry.update(fraction_of_copy=frac, target=DECODE_TARGET, target_met=frac >= DECODE_TARGET)
            all_met = all_met and entry["target_met"] and best["oracle_ok"]
            flag = "" if best["oracle_ok"] else "  ORACLE MISMATCH"
            print(
                f"{name:>42} {best['median_ms']:>9.4f} {best['GBps']:>8.0f} {frac:>8.3f} {DECODE_TARGET:>6}  "
                f"{best['config']}{flag}"
            )
    return common.finish(args.out, results, all_met)


if __name__ == "__main__":
    sys.exit(main())
