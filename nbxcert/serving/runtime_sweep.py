"""The run-time sweep: a key with no certificate, outside certified-only mode, swept on the launch's own arguments.

Serving's lookup comes here on a miss only. Every pruned-in candidate runs on the launch's arguments; those that fail,
or whose output disagrees with the others' consensus beyond the dtype tolerance, are rejected; the fastest of the rest
wins, chosen as the certifying sweep chooses (`nbxcert.sweep.choose_winner`) from timings summarised as the runner
summarises them (`nbxcert.runner.summary`).

Imports `nbxcert.errors` and serving's notices at module level; numpy, the comparison, the sweep's winner choice and
the runner's timing only inside the functions that run a sweep, so that importing `nbxcert.serving` loads no sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbxcert.errors import LaunchError, NbxcertError
from nbxcert.serving.notices import say_once


@dataclass
class RuntimeLaunch:
    """What a run-time sweep needs from a launch: `run(config)` launches on the launch's own arguments, `outputs`
    are the tensors it writes, `restore` the in-place tensors to put back before each candidate."""

    run: Callable[[Any], None]
    outputs: Sequence[Any] = ()
    restore: Sequence[Any] = ()


def sweep_at_run_time(
    spec, problem: Mapping[str, Any], profile, runtime: RuntimeLaunch | dict | Callable[[], RuntimeLaunch] | None
):
    """Sweep a key on the launch's own arguments: every pruned-in candidate runs; those that fail, or whose output
    disagrees with the candidates' consensus (the element-wise median) beyond the dtype tolerance times the output's
    largest magnitude, are rejected; the fastest of the rest wins (the untuned default or the simplest within the
    noise). `runtime` is a `RuntimeLaunch`, the keyword arguments of one, or a function of no arguments that makes one
    (called here only: `nbxcert verify` makes a key's inputs at its bucket's largest member only for a sweep)."""
    import numpy as np

    from nbxcert.kernels.compare import compare
    from nbxcert.sweep import Outcome, choose_winner

    if isinstance(runtime, dict):
        runtime = RuntimeLaunch(**runtime)
    elif runtime is not None and not isinstance(runtime, RuntimeLaunch):
        runtime = runtime()
    if runtime is None:
        raise LaunchError(f"kernel {spec.name}: the launch gave no way to sweep it at run time (a bug in nbxcert)")
    kept = spec.pruned_for(problem, profile).kept
    saved = [t.clone() for t in runtime.restore]
    results, rejected = [], []
    for cfg in kept:
        for dst, src in zip(runtime.restore, saved, strict=False):
            dst.copy_(src)
        try:
            runtime.run(cfg)
            outs = [t.float64() for t in runtime.outputs]
        except NbxcertError:
            raise
        except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or run is rejected, as in a sweep
            rejected.append(f"{cfg.label()}: {type(e).__name__}")
            continue
        results.append((cfg, outs))
    if rejected:
        say_once(
            f"[nbxcert] {spec.name}: the run-time sweep rejected {len(rejected)} candidates ({'; '.join(rejected[:3])})"
        )
    if not results:
        raise LaunchError(f"kernel {spec.name}: no candidate ran at run time for problem {dict(problem)}")
    agreed = []
    for cfg, outs in results:
        ok = True
        for i, out in enumerate(outs):
            stack = np.stack([r[1][i] for r in results])
            consensus = np.median(stack, axis=0)
            # no oracle here, so no per-element error scale: agreement is judged norm-wise, against the largest
            # magnitude of the output (candidates that sum in another order legitimately differ where values cancel)
            finite = np.abs(consensus[np.isfinite(consensus)])
            scale = np.full(consensus.shape, finite.max() if finite.size else 0.0)
            tol = profile.tolerance(runtime.outputs[i].dtype.name)
            ok = ok and compare(out, consensus, scale, runtime.outputs[i].dtype, tol).ok
        if ok:
            agreed.append(cfg)
        else:
            say_once(f"[nbxcert] {spec.name}: run-time sweep rejected {cfg.label()} (disagrees with the consensus)")
    timed = [Outcome(c, "correct", timing=_time(runtime, c)) for c in agreed]
    winner, _ = choose_winner(timed, spec.default)
    for dst, src in zip(runtime.restore, saved, strict=False):
        dst.copy_(src)
    if winner is None:
        raise LaunchError(f"kernel {spec.name}: no candidate agreed with the consensus for problem {dict(problem)}")
    return winner.config


RUNTIME_REPETITIONS = 100  # a run-time sweep's repetitions of one candidate, at most


def _time(runtime: RuntimeLaunch, cfg) -> dict:
    """One candidate's timing, summarised as a sweep's are: CUDA events on a GPU, one launch's CPU time under the
    interpreter."""
    from nbxcert.kernels.backends import select
    from nbxcert.runner import summary

    if select().name == "cuda":
        from nbxcert.kernels.backends import triton_cuda

        # 5 + 20 ms, at most RUNTIME_REPETITIONS repetitions (each one is a host launch)
        timed = triton_cuda.time_events(lambda: runtime.run(cfg), 5.0, 20.0, max_repetitions=RUNTIME_REPETITIONS)
        return summary(timed.times_ms, "cuda_events_gated" if timed.gated else "cuda_events_waiting")
    t0 = time.perf_counter()
    runtime.run(cfg)
    return summary([(time.perf_counter() - t0) * 1e3], "interpreter_cpu")
