"""Where a key's sweep spends its time: the runner's work for one key, in this process, phase by phase and under
cProfile. A diagnosis of certification throughput, not a certificate: nothing is written but the report.

    python3 benchmarks/profile_sweep.py --key "matmul[...]@v1" [--key ...] --out DIR [--profile hopper] [--jobs N]
    python3 benchmarks/profile_sweep.py --summarize DIR/summary.json   # one JSON line a key (gpu_throughput.sh's)

For each key: its kept candidates are compiled in a pool first (Triton's cache), then, in this process, as the runner
does them: the inputs and the oracle of each checked problem (`runner.prepared_for`), every candidate's kernels loaded
from the cache at both ends of the bucket (`loads`: not launched; the second half of them on --load-threads N threads,
each half's milliseconds a candidate in the row's `loads`), every candidate's first launch (checked), every candidate
checked again, every candidate screen-timed, the first four full-timed, and the first one run again for reproducibility.
DIR/summary.json has each phase's wall seconds per key; DIR/profile_<n>.txt the cProfile of the checks, screens, timings
and runs again (by own time and by cumulative time) with --cprofile; with --compare N, the first N candidates' screens
timed both through the timer's replay of the launch and through the family's launch; with --batched-screens REPS, every
candidate screened again as one queue (REPS repetitions each, one wait at the end): its wall seconds, its medians' worst
difference from the screens' and the finalists each would choose. Needs the cuda backend.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

from common import cuda_device, write_json


def _phase(seconds: dict, name: str, t0: float) -> float:
    now = time.perf_counter()
    seconds[name] = round(seconds.get(name, 0.0) + now - t0, 4)
    return now


def _both_ways(spec, config, problems, dtypes, profile, seed, device) -> dict:
    """One candidate's screen timed as the sweep times it (`runner.time_launch`, the launch replayed) and through the
    family's launch (`replay=False`, Triton's dispatch), alternating, twice each: each way's medians in us and its
    wall seconds. The same GPU work either way: the medians should agree within the runs' own spread."""
    from nbxcert import runner

    prepared, _ = runner.prepared_for(spec, problems["timing"], dtypes, profile, seed, device)
    out: dict = {"config": config.label(), "replayed_us": [], "dispatched_us": []}
    out.update(replayed_s=0.0, dispatched_s=0.0)
    for _ in range(2):
        for way in ("replayed", "dispatched"):
            inputs = prepared.restore()
            t0 = time.perf_counter()
            timing = runner.time_launch(spec, config, inputs, profile, runner.SCREEN_MS, replay=way == "replayed")
            out[f"{way}_s"] += time.perf_counter() - t0
            out[f"{way}_us"].append(round(timing["median_us"], 3))
    return out


def _batched_screens(spec, configs, problems, dtypes, profile, seed, device, reps: int) -> tuple[list[float], float]:
    """Every candidate's screen as one queue: `reps` repetitions each (an L2 flush before each, as the sweep's), each
    candidate's batch behind the stream gate, and one wait for the device at the end, where the sweep waits three
    times a candidate and sizes its repetitions from an estimate batch. Each candidate's median in us, and the wall
    seconds. A measurement of another way to screen (its medians against the sweep's screens), not what certify does."""
    import statistics

    from nbxcert import runner
    from nbxcert.kernels import launch
    from nbxcert.kernels.backends import cuda, triton_cuda

    prepared, _ = runner.prepared_for(spec, problems["timing"], dtypes, profile, seed, device)
    index = triton_cuda._thread_ready()
    stream = triton_cuda.current_stream(index)
    flush = triton_cuda._flush_buffer(index, 2 * max(s.l2_bytes for s in profile.skus))
    gate = triton_cuda._gate(index)
    events = triton_cuda._events(index, 2 * reps * len(configs))
    t0 = time.perf_counter()
    timed = []
    for n, config in enumerate(configs):
        inputs = prepared.restore()
        again = launch.replay_of(lambda c=config, i=inputs: spec.launch(c, i), list(inputs.tensors.values()))
        if again is None:
            again = lambda c=config, i=inputs: spec.launch(c, i)  # noqa: E731 - the family's launch itself
        mine = events[2 * reps * n : 2 * reps * (n + 1)]
        pairs = list(zip(mine[0::2], mine[1::2], strict=True))
        with gate.holding(stream, triton_cuda.GATE_LIMIT_S):
            for start, end in pairs:
                flush.zero_()
                start.record(stream)
                again()
                end.record(stream)
        timed.append(pairs)
    cuda.stream_synchronize(stream)
    wall = time.perf_counter() - t0
    medians = [statistics.median(cuda.Event.elapsed_ms(s, e) * 1e3 for s, e in pairs) for pairs in timed]
    return medians, wall


def _loads(spec, configs, problems, dtypes, profile, seed, device, threads: int) -> dict:
    """Every candidate's kernels taken from Triton's cache and loaded into this process's context at both ends of the
    bucket, not launched: the first half of the candidates one after another, the second half on `threads` threads
    (the driver's module load lets other threads run; 1: the second half in turn as well). The milliseconds a
    candidate each way, and of the first half's the driver's part, to tell whether loading kernels on threads would
    shorten a key's checks."""
    from concurrent.futures import ThreadPoolExecutor

    from nbxcert import runner

    inputs = [
        runner.prepared_for(spec, problems[r], dtypes, profile, seed, device)[0].inputs for r in runner._roles(problems)
    ]

    def load(config) -> None:
        for one in inputs:
            with runner.compile_only():
                spec.launch(config, one)

    from triton.compiler.compiler import CompiledKernel

    # the driver's part of a load (Triton's `_init_handles`: the module loaded, its function and attributes), timed
    # over the first half
    driver = [0.0]
    init = CompiledKernel._init_handles

    def timed_init(self):
        t = time.perf_counter()
        try:
            return init(self)
        finally:
            driver[0] += time.perf_counter() - t

    half = len(configs) // 2
    t0 = time.perf_counter()
    CompiledKernel._init_handles = timed_init
    try:
        for c in configs[:half]:
            load(c)
    finally:
        CompiledKernel._init_handles = init
    t1 = time.perf_counter()
    with ThreadPoolExecutor(max(1, threads)) as pool:
        list(pool.map(load, configs[half:]))
    t2 = time.perf_counter()
    return {
        "threads": threads,
        "in_turn_ms_a_candidate": round((t1 - t0) * 1e3 / max(half, 1), 3),
        "of_which_driver_ms_a_candidate": round(driver[0] * 1e3 / max(half, 1), 3),
        "on_threads_ms_a_candidate": round((t2 - t1) * 1e3 / max(len(configs) - half, 1), 3),
    }


def _finalist_labels(configs, medians) -> list[str]:
    """The configs the sweep's rule (`sweep.finalists`) takes to the full timing from these screen medians."""
    from types import SimpleNamespace

    from nbxcert.sweep import finalists

    ranked = [SimpleNamespace(config=c, median=m) for c, m in zip(configs, medians, strict=True)]
    return [o.config.label() for o in finalists(ranked, None)]


def profile_key(
    text: str,
    profile,
    jobs: int,
    seed: int,
    report_path: str,
    with_cprofile: bool = False,
    compare: int = 0,
    batched_reps: int = 0,
    load_threads: int = 1,
) -> dict:
    from nbxcert import runner
    from nbxcert.ahead import compile_requests
    from nbxcert.certify import COMPILE_WORKER_ENV
    from nbxcert.kernels.spec import Config, get_spec
    from nbxcert.keys import check_key, parse_key
    from nbxcert.worker import CompilePool

    key = parse_key(text)
    spec = get_spec(key.kernel)
    key = check_key(spec, key, profile)
    requests = compile_requests(spec, key, profile, seed)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    pool = CompilePool({"NBXCERT_BACKEND": "cuda", **COMPILE_WORKER_ENV}, [], jobs)
    try:
        compiled = pool.compile_all(requests, 600.0)
    finally:
        pool.close()
    t = _phase(seconds, "compile_pool", t)
    configs = [
        Config.from_dict(r["config"]) for r, c in zip(requests, compiled, strict=True) if c["status"] == "compiled"
    ]
    base = {k: v for k, v in requests[0].items() if k not in ("op", "config")} if requests else {}
    device = runner._device()
    dtypes = tuple(key.dtypes)
    problems = base["problems"]
    oracle = 0.0
    for role in runner._roles(problems):
        prepared, _made = runner.prepared_for(spec, problems[role], dtypes, profile, seed, device)
        oracle += prepared.oracle_seconds
    t = _phase(seconds, "inputs_and_oracle", t)
    seconds["of_which_oracle"] = round(oracle, 4)
    loads = _loads(spec, configs, problems, dtypes, profile, seed, device, load_threads)
    t = _phase(seconds, "loads", t)
    for c in configs:  # each kernel's first launch, checked
        runner.handle({**base, "op": "check", "config": c.as_dict()})
    t = _phase(seconds, "first_launches", t)
    prof = cProfile.Profile() if with_cprofile else None
    if prof is not None:
        prof.enable()
    t = time.perf_counter()
    verdicts = [runner.handle({**base, "op": "check", "config": c.as_dict()}) for c in configs]
    t = _phase(seconds, "checks", t)
    screens = [runner._timed(spec, c, problems, dtypes, profile, seed, device, "screen") for c in configs]
    t = _phase(seconds, "screens", t)
    order = sorted(range(len(configs)), key=lambda i: screens[i]["median_us"])
    for i in order[:4]:
        runner._timed(spec, configs[i], problems, dtypes, profile, seed, device, "final")
    t = _phase(seconds, "full_timings_4", t)
    if order:
        runner.handle({**base, "op": "repro", "config": configs[order[0]].as_dict(), "runs": 3})
    _phase(seconds, "runs_again", t)
    if prof is not None:
        prof.disable()
    compared = [_both_ways(spec, c, problems, dtypes, profile, seed, device) for c in configs[:compare]]
    batched: dict = {}
    medians = None
    if batched_reps and configs:
        try:
            medians, wall = _batched_screens(spec, configs, problems, dtypes, profile, seed, device, batched_reps)
        except Exception as e:  # noqa: BLE001 - reported in the key's row; the key's other phases stand
            medians, batched = None, {"error": f"{type(e).__name__}: {e}"[:500]}
    if batched_reps and configs and medians is not None:
        ours = [s["median_us"] for s in screens]
        batched = {
            "reps": batched_reps,
            "wall_s": round(wall, 4),
            "screens_wall_s": seconds["screens"],
            "finalists_screened": _finalist_labels(configs, ours),
            "finalists_batched": _finalist_labels(configs, medians),
            "worst_relative_difference": round(max(abs(b - a) / a for a, b in zip(ours, medians, strict=True)), 4),
        }
    gpu_screen_ms = sum(s["median_us"] * s["reps"] for s in screens) / 1e3
    with open(report_path, "w") as f:
        f.write(f"{key.text()}\n{json.dumps(seconds)}\n")
        for by in ("tottime", "cumulative") if prof is not None else ():
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(by).print_stats(45)
            f.write(f"\n=== by {by}\n{out.getvalue()}")
    return {
        "dispatched_against_replayed": compared,
        "key": key.text(),
        "candidates": len(configs),
        "correct": sum(v["status"] == "correct" for v in verdicts),
        "seconds": seconds,
        "screens_kernel_ms": round(gpu_screen_ms, 2),
        "screen_reps": [s["reps"] for s in screens],
        "batched_screens": batched,
        "loads": loads,
    }


def summary_lines(summary: dict) -> list[str]:
    """One JSON line a key of a written summary.json: its candidates, phases' seconds, loads and batched screens'
    wall, and whether the batched screens chose the sweep's finalists (None where none were run)."""
    lines = []
    for row in summary["keys"]:
        b = row.get("batched_screens") or {}
        same = sorted(b["finalists_screened"]) == sorted(b["finalists_batched"]) if b else None
        line = {"key": row["key"], "candidates": row["candidates"], "seconds": row["seconds"]}
        line.update(loads=row.get("loads"), batched_wall_s=b.get("wall_s"), same_finalists=same)
        lines.append(json.dumps(line))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", action="append", help="a launch key's text (repeatable)")
    parser.add_argument("--out", help="the directory the report is written to")
    parser.add_argument("--summarize", metavar="SUMMARY_JSON", help="print a written summary.json's lines and stop")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile workers (default: every core)")
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--cprofile", action="store_true", help="profile the checks and timings (slows them)")
    parser.add_argument(
        "--compare", type=int, default=0, help="time this many candidates' screens replayed and dispatched"
    )
    parser.add_argument(
        "--batched-screens",
        type=int,
        default=0,
        metavar="REPS",
        help="also screen every candidate as one queue of REPS repetitions each, one wait at the end (a comparison)",
    )
    parser.add_argument(
        "--load-threads",
        type=int,
        default=1,
        metavar="N",
        help="load the second half of the candidates' kernels on N threads (the first half in turn; a comparison)",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as f:
            print("\n".join(summary_lines(json.load(f))))
        return 0
    if not args.key or not args.out:
        parser.error("give --key (one or more) and --out, or --summarize SUMMARY_JSON")
    if args.load_threads < 1:
        parser.error(f"--load-threads {args.load_threads}: give 1 or more")
    from nbxcert.kernels.backends.triton_cuda import GATE_BATCH

    if not 0 <= args.batched_screens <= GATE_BATCH:  # one candidate's repetitions behind one hold of the gate
        parser.error(f"--batched-screens {args.batched_screens}: give 1 to {GATE_BATCH} repetitions (0: none)")
    _choice, info, profile, match = cuda_device("profile_sweep.py")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for n, text in enumerate(args.key):
        path = os.path.join(args.out, f"profile_{n}.txt")
        row = profile_key(
            text,
            profile,
            args.jobs,
            args.seed,
            path,
            args.cprofile,
            args.compare,
            args.batched_screens,
            args.load_threads,
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_json(os.path.join(args.out, "summary.json"), {"device": info.name, "profile": profile.key, "keys": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
