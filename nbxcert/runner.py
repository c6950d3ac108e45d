"""What a sweep worker does with one request: compile a candidate, check it against the oracle, time it, or run it
again for reproducibility. Runs inside `worker.Worker` processes; exceptions propagate to the worker, which classifies
them (compile, resources, crash).

Requests are plain dicts (picklable, no code): `{"op": ..., "spec": name, "config": {...}, "problems": {...},
"dtypes": [...], "seed": int, "profile": "vendor/name", ...}`.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections import OrderedDict
from typing import Any

from nbxcert.kernels.check import Prepared, first_report, prepare, run_prepared
from nbxcert.kernels.spec import Config, get_spec
from nbxcert.profiles import get_profile


def compile_only():
    """Make every `kernel[grid](...)` on this thread compile (filling Triton's cache, loading the kernel) without
    launching: the CUDA driver's own launcher queues nothing meanwhile (`triton_cuda.compiling_only`)."""
    from nbxcert.kernels.backends import triton_cuda

    return triton_cuda.compiling_only()


def _device() -> str:
    from nbxcert.kernels.backends import select

    return select().device


def _timing_kind() -> str:
    from nbxcert.kernels.backends import select

    return "interpreter_cpu" if select().name == "interpreter" else "cuda_events_gated"


def summary(times_ms: list[float], kind: str) -> dict[str, Any]:
    """A timing as sweeps record it (and the run-time sweep too): median and minimum in us, the 20-80% spread
    relative to the median, the repetitions and how it was measured (`kind`)."""
    ordered = sorted(times_ms)
    median = statistics.median(ordered)
    lo = ordered[int(0.2 * (len(ordered) - 1))]
    hi = ordered[int(round(0.8 * (len(ordered) - 1)))]
    return {
        "median_us": median * 1e3,
        "min_us": ordered[0] * 1e3,
        "spread": (hi - lo) / median if median > 0 else 0.0,
        "reps": len(ordered),
        "kind": kind,
    }


# Timing budgets (ms of warm-up, ms of timed repetitions). Every correct candidate is screened briefly; the fastest
# few and the untuned default are then timed at the full budget, and the winner is chosen among those only, so the
# certified winner, runner-up and default are measured alike. Triton's `do_bench` spends 25 + 100 ms on every config.
# Each budget: ms of warm-up, ms of timed repetitions, and at most this many of each. Behind the stream gate a kernel
# of 3 us would otherwise be called 10000 times in a full budget, each call costing the host its launch (30-40 us on
# the H200's host) and the GPU its L2 flush. A median over 1000 repetitions has a standard error well under 1% of a
# steady kernel's time. The screen only picks the finalists (those within FINAL_BAND, 15%, of its fastest, and at
# least two): over 2 ms of repetitions (40 of a 50 us kernel; at most 50) its median's standard error is about a
# seventh of the runs' 20-80% spread (`sweep.median_se`), a few tenths of a percent for a steady kernel, far inside
# that band. Screening every candidate of an H200 sweep (82 for a 7B model's matmul) was a third of a key's time
# at 1 + 4 ms and 100 repetitions each.
SCREEN_MS = (0.5, 2.0, 50)
FULL_MS = (5.0, 30.0, 1000)
# How many prepared problems a runner keeps (a key has two: its bucket's smallest and largest members).
PREPARED_KEPT = 4
_prepared: OrderedDict = OrderedDict()


def _cache_key(spec, problem, dtypes, seed, device) -> str:
    return json.dumps([spec.name, problem, list(dtypes), seed, device], sort_keys=True)


def _remember(cache: OrderedDict, key: str, make):
    if key in cache:
        cache.move_to_end(key)
        return cache[key], False
    value = make()
    cache[key] = value
    while len(cache) > PREPARED_KEPT:
        cache.popitem(last=False)
    return value, True


def prepared_for(spec, problem, dtypes, profile, seed, device) -> tuple[Prepared, dict[str, float]]:
    """The prepared problem (inputs, snapshot, judges), made once per runner; and the seconds spent making it now:
    `inputs` (the seeded inputs and their pristine copy) and `oracle` (the oracle's answer and the judges), both 0
    when it was made before."""
    t0 = time.perf_counter()
    value, made = _remember(
        _prepared,
        _cache_key(spec, problem, dtypes, seed, device),
        lambda: prepare(spec, problem, dtypes, profile, seed, device),
    )
    if not made:
        return value, {"inputs": 0.0, "oracle": 0.0}
    total = time.perf_counter() - t0
    return value, {"inputs": total - value.oracle_seconds, "oracle": value.oracle_seconds}


def _add(total: dict[str, float], part: dict[str, float]) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0.0) + v


def time_launch(
    spec, config: Config, inputs, profile, budget: tuple[float, float, int] = FULL_MS, replay: bool = True
) -> dict[str, Any]:
    """Median/min/spread of the launch with CUDA events, the L2 flushed before every repetition with a buffer twice
    the largest L2 of the profile's SKUs (a device-file fact), the repetitions queued behind a held stream so the
    host's launch is not timed (kind `cuda_events_gated`; `cuda_events_waiting` for a launch that waits for the
    device itself, which no queue can run ahead of).

    Each repetition queues the launch's kernels through `launch.replay_of` where the launch allows it: the same
    kernels on the same arguments, without the family's host code and Triton's dispatch, whose 100-300 us a
    repetition kept the GPU waiting between batches of gated repetitions (a screen of 82 matmul candidates took 2 s
    on an H200 for 0.2 s of kernels). What the events time is the same GPU work either way; `replay` False times the
    family's launch itself (`benchmarks/profile_sweep.py --compare` sets both side by side)."""
    from nbxcert.kernels import launch
    from nbxcert.kernels.backends import triton_cuda

    l2 = max(s.l2_bytes for s in profile.skus)
    warmup_ms, rep_ms, most = budget

    def fn() -> None:
        spec.launch(config, inputs)

    again = launch.replay_of(fn, list(inputs.tensors.values())) if replay else None
    timed = triton_cuda.time_events(again or fn, warmup_ms, rep_ms, flush_bytes=2 * l2, max_repetitions=most)
    return summary(timed.times_ms, "cuda_events_gated" if timed.gated else "cuda_events_waiting")


def _bits(inputs) -> dict[str, bytes]:
    return {name: inputs.tensors[name].contiguous().numpy().tobytes() for name in inputs.outputs}


def _roles(problems: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    # a bucket of one member (an exact key, or a rung right above its neighbour) is checked once
    return ("largest",) if problems["smallest"] == problems["largest"] else ("smallest", "largest")


def _shape_only_inputs(spec, problem, dtypes, seed, device):
    """Inputs to compile for: their large float tensors allocated, never filled (`kernels.inputs.shape_only`)."""
    from nbxcert.kernels import inputs as _inputs

    with _inputs.shape_only():
        return spec.make_inputs(problem, dtypes, seed, device)


# A compile worker that cannot allocate its shape-only inputs waits and tries again, this many times, sleeping
# OOM_WAIT_S more each time: its siblings in the pool hold theirs only while they compile (a pool of 32 on one GPU,
# each with a Mixtral fused_moe weight of 1.9 GB, is 61 GB at once). Past that the error stands (`resources`).
OOM_RETRIES = 5
OOM_WAIT_S = 0.5


def _compile_inputs(spec, problem, dtypes, seed, device):
    from nbxcert.errors import CudaError
    from nbxcert.kernels.backends.cuda import CUDA_ERROR_OUT_OF_MEMORY

    for attempt in range(OOM_RETRIES):
        try:
            return _shape_only_inputs(spec, problem, dtypes, seed, device)
        except CudaError as e:
            if getattr(e, "status", None) != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            gc.collect()
            time.sleep(OOM_WAIT_S * (attempt + 1))
    return _shape_only_inputs(spec, problem, dtypes, seed, device)  # the last try: its error stands


def handle(req: dict[str, Any]) -> dict[str, Any]:
    spec = get_spec(req["spec"])
    config = Config.from_dict(req["config"])
    profile = get_profile(req["profile"])
    dtypes = tuple(req["dtypes"])
    seed = int(req["seed"])
    device = _device()
    interpreted = _timing_kind() == "interpreter_cpu"
    op = req["op"]
    problems = req["problems"]
    if op == "compile":
        if interpreted:
            return {"status": "compiled", "seconds": 0.0}
        t0 = time.perf_counter()
        # every distinct specialisation the checks will launch (a bucket's smallest member may differ from its
        # largest in what Triton specialises on, e.g. divisibility by 16), so none compiles later in the runner
        # The inputs are made for this request and released with it, not kept: on the H200 32 compile workers that
        # each kept the last problems' Mixtral fused_moe inputs (1.9 GB of weight apiece) held the device's memory
        # until the GPU test that had started them could not allocate its own 1.9 GB.
        for role in _roles(problems):
            inputs = _compile_inputs(spec, problems[role], dtypes, seed, device)
            with compile_only():
                spec.launch(config, inputs)
            del inputs
        return {"status": "compiled", "seconds": time.perf_counter() - t0}
    if op == "prepare":
        made = {"inputs": 0.0, "oracle": 0.0}
        for role in _roles(problems):
            _add(made, prepared_for(spec, problems[role], dtypes, profile, seed, device)[1])
        return {"status": "prepared", "seconds": made}
    if op == "check":
        worst = {"max_abs": 0.0, "max_rel": 0.0, "max_scaled": 0.0, "tolerance": 0.0}
        launch_seconds: list[float] = []
        seconds = {"inputs": 0.0, "oracle": 0.0, "check": 0.0, "time": 0.0}
        for role in _roles(problems):
            prepared, made_s = prepared_for(spec, problems[role], dtypes, profile, seed, device)
            _add(seconds, made_s)
            t0 = time.perf_counter()
            # under the interpreter the largest member's checked launch is also its timing (CPU time, one run): a
            # conformance certificate's timing means little, and re-running the interpreter costs the most
            timings = launch_seconds if interpreted and role == "largest" else None
            verdicts = run_prepared(prepared, config, timings=timings)
            seconds["check"] += time.perf_counter() - t0
            for _name, v in verdicts.items():
                if not v.ok:
                    return {"status": "mismatch", "reason": v.report, "problem": role, "seconds": seconds}
                worst["max_abs"] = max(worst["max_abs"], v.max_abs)
                worst["max_rel"] = max(worst["max_rel"], v.max_rel)
                if v.max_scaled >= worst["max_scaled"]:
                    worst["max_scaled"] = v.max_scaled
                    worst["tolerance"] = v.tolerance
        reply: dict[str, Any] = {"status": "correct", "error": worst, "seconds": seconds}
        if req.get("time") and interpreted:
            reply["timing"] = summary([s * 1e3 for s in launch_seconds], "interpreter_cpu")
            reply["phase"] = "final"  # the checked launch's CPU time is all the interpreter's timing there is
        elif req.get("time"):
            t0 = time.perf_counter()
            reply["timing"] = _timed(spec, config, problems, dtypes, profile, seed, device, req["time"])
            reply["phase"] = req["time"]
            seconds["time"] += time.perf_counter() - t0
        return reply
    if op == "time":
        t0 = time.perf_counter()
        timing = _timed(spec, config, problems, dtypes, profile, seed, device, "final")
        return {"status": "timed", "timing": timing, "phase": "final", "seconds": {"time": time.perf_counter() - t0}}
    if op == "repro":
        # the winner again, on the same starting bytes each time (in-place kernels such as rope change their inputs):
        # every run judged against the oracle (a candidate right only on its first launch is wrong), and the runs'
        # output bits compared
        prepared, _ = prepared_for(spec, problems["timing"], dtypes, profile, seed, device)
        runs = []
        for i in range(int(req.get("runs", 3))):
            report = first_report(run_prepared(prepared, config))
            if report:
                return {
                    "status": "mismatch",
                    "reason": f"wrong when run again (run {i + 1} on the same inputs): {report}",
                }
            runs.append(_bits(prepared.inputs))
        return {"status": "done", "reproducible": all(r == runs[0] for r in runs[1:])}
    raise ValueError(f"unknown request op '{op}'")


def _timed(spec, config, problems, dtypes, profile, seed, device, phase: str) -> dict[str, Any]:
    """`phase` "screen": the brief budget every correct candidate gets; "final": the full one."""
    prepared, _ = prepared_for(spec, problems["timing"], dtypes, profile, seed, device)
    inputs = prepared.restore()
    return time_launch(spec, config, inputs, profile, SCREEN_MS if phase == "screen" else FULL_MS)
