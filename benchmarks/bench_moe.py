"""Benchmark fused_moe on an NVIDIA GPU: the best of our kept candidates against the best of vLLM's candidate space,
both run on our kernel at the same shapes (so the comparison is of the configuration spaces, not of two kernels).

For each shape (a model's gate/up or down projection at a token count), every fused_moe candidate the prune keeps for
the GPU's profile is timed, then every config of vLLM's space (`--vllm-space tuned`: the distinct configs of vLLM's
tuned H200 tables for Mixtral-8x7B, `E=8,N=14336,device_name=NVIDIA_H200.json`, and Qwen3-30B-A3B,
`E=128,N=768,device_name=NVIDIA_H200.json`; `full`: the 1920 configs of vLLM's CUDA tuning space,
benchmarks/kernels/benchmark_moe.py: BLOCK_SIZE_M 16..256, N 32..256, K 64..256, GROUP_SIZE_M 1/16/32/64, 4 or 8
warps, 2 to 5 stages), and the one vLLM's table itself picks for that token count (the nearest key, as vLLM does).
Each config is timed with nbxcert's CUDA-event timer (`triton_cuda.do_bench_events`: L2 flushed before each
repetition, median); vLLM configs our prune refuses on this device (over its shared memory) are listed as refused.
The fastest of each side is checked against the float64 oracle on the same inputs. A config that fails to compile
or launch is recorded with its reason, never scored as infinitely slow.

    python benchmarks/bench_moe.py --out moe.json [--dtype bfloat16] [--shapes mixtral:up:512,qwen3:down:64]
        [--vllm-space tuned|full]

Shapes are MODEL:STAGE:TOKENS, MODEL one of mixtral (8 experts, top-2, hidden 4096, expert intermediate 14336) and
qwen3 (128 experts, top-8, hidden 2048, expert intermediate 768), STAGE up (gate/up projection: N = 2 x intermediate,
K = hidden, no router weights, one A row per token) or down (N = hidden, K = intermediate, router weights, one A row
per pair). The alignment (moe_align) is not timed: each config's layout is made once, as certification does. The
ratio printed is vLLM-space best time / our best time (>= 1: our space is at least as fast).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import common

MODELS = {
    "mixtral": {"experts": 8, "top_k": 2, "hidden": 4096, "inter": 14336},
    "qwen3": {"experts": 128, "top_k": 8, "hidden": 2048, "inter": 768},
}
DEFAULT_SHAPES = tuple(f"{m}:{s}:{t}" for m in MODELS for s in ("up", "down") for t in (1, 64, 512, 4096))

# vLLM's tuned H200 tables (token count -> BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps,
# num_stages), read from vllm/model_executor/layers/fused_moe/configs/ in vllm-project/vllm: the data the comparison
# is made against, not code.
VLLM_H200 = {
    "mixtral": {  # E=8,N=14336,device_name=NVIDIA_H200.json
        1: (16, 128, 128, 16, 4, 5),
        2: (32, 64, 128, 1, 4, 5),
        4: (16, 64, 64, 1, 4, 5),
        8: (16, 128, 128, 1, 4, 5),
        16: (16, 64, 256, 16, 4, 3),
        24: (16, 128, 256, 16, 4, 2),
        32: (16, 128, 128, 16, 8, 3),
        48: (32, 128, 128, 16, 4, 3),
        64: (32, 128, 128, 64, 4, 3),
        96: (32, 128, 128, 64, 4, 3),
        128: (64, 128, 128, 1, 8, 4),
        256: (128, 256, 64, 1, 8, 4),
        512: (128, 256, 64, 16, 8, 4),
        1024: (128, 256, 64, 16, 8, 4),
        1536: (128, 256, 64, 16, 8, 4),
        2048: (128, 256, 64, 32, 8, 4),
        3072: (128, 256, 64, 16, 8, 4),
        4096: (128, 256, 64, 16, 8, 4),
    },
    "qwen3": {  # E=128,N=768,device_name=NVIDIA_H200.json
        1: (16, 64, 64, 1, 4, 5),
        2: (16, 64, 64, 1, 4, 4),
        4: (16, 64, 128, 16, 4, 2),
        8: (16, 64, 128, 1, 4, 3),
        16: (16, 64, 256, 1, 4, 2),
        24: (16, 64, 128, 1, 4, 4),
        32: (16, 64, 128, 16, 4, 2),
        48: (16, 128, 128, 16, 4, 3),
        64: (16, 256, 128, 1, 8, 2),
        96: (16, 128, 128, 1, 4, 2),
        128: (16, 128, 128, 1, 4, 2),
        256: (32, 256, 128, 16, 4, 2),
        512: (64, 128, 64, 1, 4, 3),
        1024: (128, 256, 64, 16, 8, 4),
        1536: (128, 256, 64, 1, 8, 4),
        2048: (128, 256, 64, 1, 8, 4),
        3072: (128, 256, 64, 1, 8, 4),
        4096: (128, 256, 64, 16, 8, 4),
    },
}


def parse_shape(text: str) -> dict:
    parts = text.strip().lower().split(":")
    if len(parts) != 3 or parts[0] not in MODELS or parts[1] not in ("up", "down") or not parts[2].isdigit():
        raise SystemExit(f"shape {text!r} is not MODEL:STAGE:TOKENS (MODEL in {', '.join(MODELS)}, STAGE up or down)")
    model, stage, tokens = parts[0], parts[1], int(parts[2])
    d = MODELS[model]
    problem = {"M": tokens, "experts": d["experts"], "top_k": d["top_k"]}
    if stage == "up":
        problem.update(N=2 * d["inter"], K=d["hidden"], mul_weight=0, pair_rows=0)
    else:
        problem.update(N=d["hidden"], K=d["inter"], mul_weight=1, pair_rows=int(d["top_k"] > 1))
    return {"model": model, "stage": stage, "problem": problem}


def vllm_space(which: str) -> list[tuple]:
    """vLLM's candidate space as (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages) tuples."""
    if which == "tuned":
        return sorted({c for table in VLLM_H200.values() for c in table.values()})
    return list(
        itertools.product(
            (16, 32, 64, 128, 256), (32, 64, 128, 256), (64, 128, 256), (1, 16, 32, 64), (4, 8), (2, 3, 4, 5)
        )
    )


def vllm_pick(model: str, tokens: int) -> tuple:
    """The config vLLM's table serves for `tokens`: the key nearest to it."""
    table = VLLM_H200[model]
    return table[min(table, key=lambda k: abs(k - tokens))]


def flops(problem: dict) -> float:
    return 2.0 * problem["M"] * problem["top_k"] * problem["N"] * problem["K"]


def time_configs(spec, configs, inputs, prune, profile, warmup_ms, rep_ms, log):
    """(rows, refused): the median time of each config on `inputs`; refusals with their reasons."""
    verdicts = prune(configs, inputs.problem, profile)
    rows, refused = [], [{"config": c.label(), "reason": f"pruned: {r}"} for c, r in verdicts.pruned]
    for config, times, t0 in common.time_each(
        verdicts.kept, lambda c: spec.launch(c, inputs), warmup_ms, rep_ms, refused, log
    ):
        rows.append(common.timed_row(config, times))
        log(f"    {rows[-1]['median_ms']:.4f} ms  {config.label()}  ({time.time() - t0:.1f}s)")
    return rows, refused


def check_best(spec, config_dict, inputs, refs, profile) -> tuple[bool, str]:
    from nbxcert.kernels.compare import compare, poison
    from nbxcert.kernels.spec import Config

    out = inputs.tensors["out"]
    poison(out, out.dtype)
    spec.launch(Config.from_dict(config_dict), inputs)
    ref = refs["out"]
    verdict = compare(out.float64(), ref.value, ref.scale, out.dtype, profile.tolerance(out.dtype.name), "best")
    return verdict.ok, verdict.report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON results")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated MODEL:STAGE:TOKENS")
    ap.add_argument("--vllm-space", default="tuned", choices=("tuned", "full"), help="which vLLM space to run")
    ap.add_argument("--warmup-ms", type=float, default=25.0)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--no-check", action="store_true", help="skip the float64 oracle check of the two bests")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]

    choice, info, profile, match = common.cuda_device("bench_moe")
    from nbxcert.kernels import moe

    print(f"device: {info.name}, profile {profile.key} ({match})")
    log = common.progress_log(args.quiet)
    dt = args.dtype
    from nbxcert.warm import compile_ahead

    spec = moe.FUSED_MOE
    theirs = [moe._moe(bm, bn, bk, w, s, g) for bm, bn, bk, g, w, s in vllm_space(args.vllm_space)]
    results = {"device": info.name, "profile": profile.key, "dtype": dt, "vllm_space": args.vllm_space, "shapes": {}}
    for shape in shapes:
        text = f"{shape['model']}:{shape['stage']}:{shape['problem']['M']}"
        problem = shape["problem"]
        print(f"== {text} {problem} ({dt})", flush=True)
        inputs = spec.make_inputs(problem, (dt, dt), 0, choice.device)
        # every config of both spaces compiled in a pool before any is timed
        compile_ahead(
            spec,
            problem,
            (dt, dt),
            list(spec.prune(list(spec.candidates) + theirs, problem, profile).kept),
            profile.key,
        )
        pick = vllm_pick(shape["model"], problem["M"])
        pick_cfg = moe._moe(pick[0], pick[1], pick[2], pick[4], pick[5], pick[3])
        log("  ours:")
        our_rows, our_refused = time_configs(
            spec, spec.candidates, inputs, spec.prune, profile, args.warmup_ms, args.rep_ms, log
        )
        log(f"  vLLM space ({len(theirs)} configs):")
        their_rows, their_refused = time_configs(
            spec, theirs, inputs, spec.prune, profile, args.warmup_ms, args.rep_ms, log
        )
        entry = {
            "problem": problem,
            "flop": flops(problem),
            "ours": our_rows,
            "ours_refused": our_refused,
            "vllm": their_rows,
            "vllm_refused": their_refused,
            "vllm_pick": pick_cfg.label(),
        }
        picked = [r for r in their_rows if r["config"] == pick_cfg.label()]
        entry["vllm_pick_ms"] = picked[0]["median_ms"] if picked else None
        refs = None if args.no_check else spec.oracle(inputs)
        for side, rows in (("ours", our_rows), ("vllm", their_rows)):
            if not rows:
                continue
            best = dict(min(rows, key=lambda r: r["median_ms"]))
            best["tflops"] = flops(problem) / best["median_ms"] / 1e9
            if refs is not None:
                best["oracle_ok"], report = check_best(spec, best["kwargs"], inputs, refs, profile)
                if not best["oracle_ok"]:
                    best["oracle_report"] = report
            entry[f"{side}_best"] = best
        if "ours_best" in entry and "vllm_best" in entry:
            entry["ratio"] = entry["vllm_best"]["median_ms"] / entry["ours_best"]["median_ms"]
        results["shapes"][text] = entry
        del inputs, refs
        _write(args.out, results)  # after every shape: a failure at a later shape keeps the ones measured

    print()
    header = f"{'shape':>20} {'ours ms':>9} {'TFLOP/s':>8} {'vLLM ms':>9} {'pick ms':>9} {'ratio':>6}  our best"
    common.print_header(header)
    for text, e in results["shapes"].items():
        ob, vb = e.get("ours_best"), e.get("vllm_best")
        flag = "" if all(b is None or b.get("oracle_ok", True) for b in (ob, vb)) else "  ORACLE MISMATCH"
        print(
            f"{text:>20} {ob['median_ms'] if ob else float('nan'):>9.4f} {ob['tflops'] if ob else float('nan'):>8.1f} "
            f"{vb['median_ms'] if vb else float('nan'):>9.4f} {e['vllm_pick_ms'] or float('nan'):>9.4f} "
            f"{e.get('ratio', float('nan')):>6.3f}  {ob['config'] if ob else '(no candidate ran)'}{flag}"
        )
    _write(args.out, results)
    print(f"\nresults written to {args.out}")
    return 0


def _write(path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
