"""What a sweep worker does with one request: compile a candidate, check it against the oracle, time it, or run it
again for reproducibility. Runs inside `worker.Worker` processes; exceptions propagate to the worker, which classifies
them (compile, resources, crash).

Requests are plain dicts (picklable, no code): `{"op": ..., "spec": name, "config": {...}, "problems": {...},
"dtypes": [...], "seed": int, "profile": "vendor/name", ...}`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from nbxcert.kernels.check import run_checked
from nbxcert.kernels.spec import Config, get_spec
from nbxcert.profiles import get_profile


@contextlib.contextmanager
def compile_only():
    """Make every `kernel[grid](...)` compile (filling Triton's cache) without launching."""
    from triton.runtime.jit import JITFunction

    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        return original(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original


def _device() -> str:
    from nbxcert.kernels.backends import select

    return select().device


def _timing_kind() -> str:
    from nbxcert.kernels.backends import select

    return "interpreter_cpu" if select().name == "interpreter" else "cuda_events"


def _summary(times_ms: list[float], kind: str) -> dict[str, Any]:
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


def time_launch(spec, config: Config, inputs, profile) -> dict[str, Any]:
    """Median/min/spread of the launch with CUDA events, the L2 flushed before every repetition with a buffer twice
    the largest L2 of the profile's SKUs (a device-file fact)."""
    from nbxcert.kernels.backends import triton_cuda

    l2 = max(s.l2_bytes for s in profile.skus)
    times = triton_cuda.do_bench_events(lambda: spec.launch(config, inputs), 10.0, 60.0, flush_bytes=2 * l2)
    return _summary(times, "cuda_events")


def _bits(inputs) -> dict[str, bytes]:
    return {name: inputs.tensors[name].contiguous().numpy().tobytes() for name in inputs.outputs}


def handle(req: dict[str, Any]) -> dict[str, Any]:
    spec = get_spec(req["spec"])
    config = Config.from_dict(req["config"])
    profile = get_profile(req["profile"])
    dtypes = tuple(req["dtypes"])
    seed = int(req["seed"])
    device = _device()
    op = req["op"]
    if op == "compile":
        if _timing_kind() == "interpreter_cpu":
            return {"status": "compiled", "seconds": 0.0}
        t0 = time.perf_counter()
        inputs = spec.make_inputs(req["problems"]["timing"], dtypes, seed, device)
        with compile_only():
            spec.launch(config, inputs)
        return {"status": "compiled", "seconds": time.perf_counter() - t0}
    if op == "check":
        worst = {"max_abs": 0.0, "max_rel": 0.0, "max_scaled": 0.0, "tolerance": 0.0}
        interpreted = _timing_kind() == "interpreter_cpu"
        launch_seconds: list[float] = []
        roles = ("smallest", "largest")
        if req["problems"]["smallest"] == req["problems"]["largest"]:
            roles = ("largest",)  # a bucket of one member (an exact key, or a rung right above its neighbour)
        for role in roles:
            problem = req["problems"][role]
            # under the interpreter the largest member's checked launch is also its timing (CPU time, one run): a
            # conformance certificate's timing means little, and re-running the interpreter costs the most
            timings = launch_seconds if interpreted and role == "largest" else None
            verdicts = run_checked(spec, config, problem, dtypes, profile, seed, device, timings=timings)
            for name, v in verdicts.items():
                if not v.ok:
                    return {"status": "mismatch", "reason": v.report, "problem": role}
                worst["max_abs"] = max(worst["max_abs"], v.max_abs)
                worst["max_rel"] = max(worst["max_rel"], v.max_rel)
                if v.max_scaled >= worst["max_scaled"]:
                    worst["max_scaled"] = v.max_scaled
                    worst["tolerance"] = v.tolerance
        reply: dict[str, Any] = {"status": "correct", "error": worst}
        if req.get("time") and interpreted:
            reply["timing"] = _summary([s * 1e3 for s in launch_seconds], "interpreter_cpu")
        elif req.get("time"):
            inputs = spec.make_inputs(req["problems"]["timing"], dtypes, seed, device)
            reply["timing"] = time_launch(spec, config, inputs, profile)
        return reply
    if op == "repro":
        runs = []
        for _ in range(int(req.get("runs", 3))):
            # fresh inputs from the same seed each time: in-place kernels (rope) change their inputs
            inputs = spec.make_inputs(req["problems"]["timing"], dtypes, seed, device)
            spec.launch(config, inputs)
            runs.append(_bits(inputs))
        return {"status": "done", "reproducible": all(r == runs[0] for r in runs[1:])}
    raise ValueError(f"unknown request op '{op}'")
