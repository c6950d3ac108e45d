"""A compile pool whose workers cross-compile (the default on a GPU; `NBXCERT_COMPILE_POOL=device` for the usual
pool's workers): each compiles a key's candidates for this process's GPU, as its runner will launch them, without a
CUDA context of its own.

A worker of the usual pool (`worker.CompilePool`) is a GPU process: it makes its CUDA context and the key's inputs on
the device, then launches each candidate compile-only, which fills Triton's on-disk cache for the runner. Sixteen such
workers started at once made their contexts at once, about 3 s each on an H200's host
(`benchmarks/probe_pool_start.py`), before their first compile; the runner, started with them, made its own among
them. Triton's compile needs no context: a worker here takes the cross-compiling backend (`backends.cross`, the
census's and the bundle builder's) for the GPU's own target (its compute capability and SM count, read here), makes
the inputs on the host with their large float tensors never filled (`inputs.shape_only`, as the usual pool does on the
device), and launches each candidate there, which compiles it through the whole of Triton's dispatch into the same
on-disk cache under the same key: the target, the options and the specialization (dtypes, constexprs, 16-byte
divisibility) are the launch's on the GPU.

What it changes is where a candidate compiles, never what the sweep judges: the runner launches each candidate on
the GPU and finds its compiled kernel in Triton's cache, or compiles it itself where it does not (the certificates say
nothing of where a kernel was compiled). A compile error is the candidate's refusal as before. A kernel over the
GPU's resources, which a worker of the usual pool finds as it loads the kernel, is found by the runner as it loads it
(a cross worker loads nothing): the same refusal, `resources`, one step later.

The default since measured against the usual pool on a GPU: `bench_autotune.py --pools device,cross` over 21 keys of
three families on an H100 (2026-12-06), every key certified by either pool, certify's process wall 22.0 s with this
pool against 24.7 s (`benchmarks/results/autotune_2026-12-06_21keys-h100-pools.json`); the runner found every kernel
the pool compiled (`tests/engine/test_crosspool.py`, on the GPU). `NBXCERT_COMPILE_POOL=device` makes the usual pool.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from typing import Any

from nbxcert.worker import (
    CAPTURED_TAIL,
    CompilePool,
    Worker,
    _classify,
    captured_output,
    one_line,
    serve_cross_compiling,
)

POOL_KINDS = ("device", "cross")
ENV_TARGET = "NBXCERT_POOL_TARGET"
# The TRITON_* variables of the process that made the pool (the runner's, which it passes on), as JSON: a worker holds
# its own to them before each compile. Triton's cache key holds the variables that change a compile
# (`get_cache_invalidating_env_vars`), and the cross backend sets one (TRITON_DEFAULT_FP_FUSION, to its default value:
# Triton 3.9 warns where it is unset), which alone would name every kernel a worker compiled apart from the runner's.
ENV_TRITON = "NBXCERT_POOL_TRITON_ENV"
# Triton keeps every kernel it compiled in the process: a worker hands over to a fresh one after this many requests
# (a candidate each), which then reads what it needs from the disk cache
RECYCLE_AFTER = 400


def pool_kind() -> str:
    """NBXCERT_COMPILE_POOL: `cross` (the default: workers cross-compile for the GPU, with no CUDA context) or
    `device` (workers compile on the GPU, a CUDA context each)."""
    from nbxcert.options import env_choice

    return env_choice("NBXCERT_COMPILE_POOL", POOL_KINDS, "cross", "a compile pool")


def describe(backend: str) -> str:
    """The compile pool a run on `backend` makes, in words (doctor's row, certify's log); a bad NBXCERT_COMPILE_POOL
    raises its `UsageError`."""
    kind = pool_kind()
    if backend != "cuda":
        return f"none on the {backend} backend (it compiles nothing ahead)"
    if kind == "cross":
        return "cross: workers cross-compile for the GPU, no CUDA context each (NBXCERT_COMPILE_POOL=device: on it)"
    return "device: each compile worker makes a CUDA context (NBXCERT_COMPILE_POOL=device)"


def device_target():
    """The cross-compiling target of this process's GPU (device 0): its compute capability and SM count, the profile
    it matches."""
    from nbxcert.kernels.backends import cuda
    from nbxcert.kernels.backends.cross import Target
    from nbxcert.profiles import match_nvidia

    info = cuda.device_info(0)
    major, minor = info.compute_capability
    profile, _how = match_nvidia(info.compute_capability)
    sms = int(info.attributes.get("multiprocessor_count") or 1)
    return Target("cuda", 10 * major + minor, 32, profile.key, sms)


def _serve(conn, env: dict[str, str], modules: list[str]) -> None:
    """The worker's loop: cross-compile for the target its environment names, load the kernels, answer `compile`
    requests until the pipe closes (or, after RECYCLE_AFTER, hand over to a fresh worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the sweep and closes its workers on Ctrl-C
    serve_cross_compiling(conn, env, modules, ENV_TARGET, answer, RECYCLE_AFTER)


def answer(request: dict[str, Any], _target=None) -> dict[str, Any]:
    """(In a process cross-compiling for the GPU.) A sweep's `compile` request: the candidate launched at each of its
    problems that the runner checks (both ends of the bucket, or the one), compiled and run nowhere. The reply is the
    usual pool's: `compiled` and its seconds, or the failure's status and one line (and its traceback)."""
    from nbxcert.kernels import inputs
    from nbxcert.kernels.backends import cross
    from nbxcert.kernels.spec import Config, get_spec
    from nbxcert.runner import _roles

    t0 = time.perf_counter()
    _as_the_runner()
    output: list[str] = []
    try:
        with captured_output() as output:
            spec = get_spec(request["spec"])
            config = Config.from_dict(request["config"])
            dtypes = tuple(request["dtypes"])
            problems = request["problems"]
            for role in _roles(problems):
                with inputs.shape_only():
                    made = spec.make_inputs(problems[role], dtypes, int(request["seed"]), "cpu")
                with cross.recording():
                    spec.launch(config, made)
                del made
    except Exception as exc:  # noqa: BLE001 - every failure of a candidate is classified and reported
        printed = "".join(output)[-CAPTURED_TAIL:]
        detail = traceback.format_exc() + (
            f"\nits output (last {CAPTURED_TAIL} characters):\n{printed}" if printed else ""
        )
        return {"status": _classify(exc), "reason": one_line(exc), "traceback": detail}
    return {"status": "compiled", "seconds": time.perf_counter() - t0}


def _as_the_runner() -> None:
    """This process's TRITON_* variables made the ones of the process that made the pool (ENV_TRITON)."""
    wanted = json.loads(os.environ.get(ENV_TRITON, "{}"))
    for name in [n for n in os.environ if n.startswith("TRITON_") and n not in wanted]:
        del os.environ[name]
    os.environ.update(wanted)


class CrossWorker(Worker):
    """A compile worker that cross-compiles for the GPU (`_serve`); its start, crash and timeout handling are
    `Worker`'s."""

    serve = staticmethod(_serve)


class CrossCompilePool(CompilePool):
    """`CompilePool` of cross-compiling workers for `target` (`device_target()`): the same `compile_all`, `close` and
    `kill`."""

    def __init__(self, env: dict[str, str], modules: list[str], jobs: int, target):
        env = worker_env(env, target)
        self.target = target
        self.workers = [CrossWorker(env, list(modules)) for _ in range(max(1, jobs))]


def worker_env(env: dict[str, str], target) -> dict[str, str]:
    """A cross worker's environment from the one a GPU worker would be given: the target in place of the backend, and
    the TRITON_* variables of this process (ENV_TRITON)."""
    env = {k: v for k, v in env.items() if k != "NBXCERT_BACKEND"}  # the target names the backend
    env[ENV_TARGET] = json.dumps(target.as_dict())
    env[ENV_TRITON] = json.dumps({k: v for k, v in {**os.environ, **env}.items() if k.startswith("TRITON_")})
    return env
