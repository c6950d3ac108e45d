"""The run-time sweep: a key with no certificate, outside certified-only mode, swept on the launch's own arguments.

Serving's lookup comes here on a miss only. Every pruned-in candidate runs on the launch's arguments; those that fail,
or whose output disagrees with the consensus (the median of the first `CONSENSUS_OF` that ran) beyond the dtype
tolerance, are rejected; the fastest of the rest wins, timed and chosen as the certifying sweep times and chooses: on a
GPU every candidate screened briefly, the finalists timed in full (`nbxcert.sweep.finalists`, `choose_winner`), from
timings summarised as the runner summarises them (`nbxcert.runner.summary`).

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


def sweep_jobs() -> int:
    """NBXCERT_SWEEP_JOBS: how many worker processes compile a run-time sweep's candidates before they run (default
    1: none, each candidate compiles in this process at its first run). Workers are spawned processes: a script run
    as `python script.py` that sets it must guard its top level with `if __name__ == "__main__":`, as for any spawned
    process."""
    import os

    from nbxcert.errors import UsageError
    from nbxcert.options import MAX_JOBS

    text = os.environ.get("NBXCERT_SWEEP_JOBS", "").strip()
    if not text:
        return 1
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_JOBS:
        raise UsageError(
            f"NBXCERT_SWEEP_JOBS={text} is not a count of worker processes",
            hint=f"set it to a whole number from 1 to {MAX_JOBS} (1: compile in this process), or unset it",
        )
    return n


def sweep_at_run_time(
    spec,
    problem: Mapping[str, Any],
    profile,
    runtime: RuntimeLaunch | dict | Callable[[], RuntimeLaunch] | None,
    dtypes: Sequence[str] = (),
):
    """Sweep a key on the launch's own arguments: every pruned-in candidate runs; those that fail, or whose output
    disagrees with the candidates' consensus (the element-wise median of the first `CONSENSUS_OF` that ran) beyond
    the dtype tolerance times the output's largest magnitude, are rejected; the fastest of the rest wins (the untuned
    default or the simplest within the noise). `runtime` is a `RuntimeLaunch`, the keyword arguments of one, or a
    function of no arguments that makes one (called here only: `nbxcert verify` makes a key's inputs at its bucket's
    largest member only for a sweep).
    `dtypes`: the key's; with them and NBXCERT_SWEEP_JOBS above 1, the candidates are compiled first in that many
    worker processes (`nbxcert.ahead.compile_ahead`), so that their first runs here load them."""
    from nbxcert.sweep import choose_winner

    if isinstance(runtime, dict):
        runtime = RuntimeLaunch(**runtime)
    elif runtime is not None and not isinstance(runtime, RuntimeLaunch):
        runtime = runtime()
    if runtime is None:
        raise LaunchError(f"kernel {spec.name}: the launch gave no way to sweep it at run time (a bug in nbxcert)")
    kept = spec.pruned_for(problem, profile).kept
    jobs = sweep_jobs()
    if dtypes and jobs > 1:
        from nbxcert.ahead import compile_ahead

        compile_ahead(spec, problem, tuple(dtypes), kept, profile.key, jobs=jobs)
    saved = [t.clone() for t in runtime.restore]

    def formed(first: list[tuple[Any, list]]) -> tuple[_Consensus, list]:
        """The consensus of the candidates that ran first, and those of them that agree with it."""
        made = _Consensus([o for _, o in first], runtime.outputs, profile)
        return made, [c for c, o in first if made.agrees(spec, c, o)]

    rejected: list[str] = []
    first: list[tuple[Any, list]] = []  # the candidates that ran before the consensus is formed, with their outputs
    consensus: _Consensus | None = None
    agreed = []
    for cfg in kept:
        for dst, src in zip(runtime.restore, saved, strict=False):
            dst.copy_(src)
        try:
            runtime.run(cfg)
            outs = [t.float64() for t in runtime.outputs] if consensus is None else None
        except NbxcertError:
            raise
        except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or run is rejected, as in a sweep
            from nbxcert.worker import one_line  # its type and its useful line, as a certification's refusal says

            rejected.append(f"{cfg.label()}: {one_line(e)}")
            continue
        if consensus is not None:  # judged from the output tensors (widened on the thread pool), nothing kept
            if consensus.agrees(spec, cfg, runtime.outputs):
                agreed.append(cfg)
            continue
        first.append((cfg, outs))
        if len(first) == CONSENSUS_OF:
            consensus, agreed = formed(first)
            first = []
    if consensus is None and first:  # fewer candidates ran than a consensus is formed of: all of them form it
        consensus, agreed = formed(first)
    if rejected:
        say_once(
            f"[nbxcert] {spec.name}: the run-time sweep rejected {len(rejected)} candidates ({'; '.join(rejected[:3])})"
        )
    if consensus is None:
        first_refusal = f" (the first: {rejected[0]})" if rejected else ""
        raise LaunchError(
            f"kernel {spec.name}: no candidate ran at run time for problem {dict(problem)}{first_refusal}",
            hint="run the launch with NBXCERT_DEBUG=1 for each candidate's traceback, or certify the key to see each "
            "refusal",
        )
    winner, _ = choose_winner(_timed(spec, runtime, agreed), spec.default)
    for dst, src in zip(runtime.restore, saved, strict=False):
        dst.copy_(src)
    if winner is None:
        raise LaunchError(f"kernel {spec.name}: no candidate agreed with the consensus for problem {dict(problem)}")
    return winner.config


CONSENSUS_OF = 5  # the consensus is the element-wise median of the first this many candidates that run: a majority
# of them must agree for it to hold. Each later candidate is judged as it runs and its outputs let go, so a sweep holds
# at most this many outputs (float64) at once: keeping every candidate's, as before, held 82 float64 copies of a
# 4096 x 28672 matmul's output (77 GB) before judging any


class _Consensus:
    """The consensus outputs (`CONSENSUS_OF` candidates' element-wise median) and the judgment of a candidate's
    outputs against them."""

    def __init__(self, outputs: Sequence[Sequence[Any]], tensors: Sequence[Any], profile) -> None:
        import numpy as np

        from nbxcert.kernels.compare import Judge

        self.judges = []
        for i in range(len(tensors)):
            median = np.median(np.stack([o[i] for o in outputs]), axis=0)
            # no oracle here, so no per-element error scale: agreement is judged norm-wise, against the largest
            # magnitude of the output (candidates that sum in another order legitimately differ where values cancel)
            finite = np.abs(median[np.isfinite(median)])
            dtype = tensors[i].dtype
            # one judge an output, its allowed error worked out once for every candidate it judges
            largest = finite.max() if finite.size else 0.0
            self.judges.append(Judge(median, largest, dtype, profile.tolerance(dtype.name)))

    def agrees(self, spec, cfg, outs: Sequence[Any]) -> bool:
        """Whether `outs` (float64 arrays, or the output tensors themselves) agree with the consensus."""
        import numpy as np

        for judge, out in zip(self.judges, outs, strict=True):
            verdict = judge.verdict(out) if isinstance(out, np.ndarray) else judge.verdict_of(out)
            if not verdict.ok:
                say_once(f"[nbxcert] {spec.name}: run-time sweep rejected {cfg.label()} (disagrees with the consensus)")
                return False
        return True


RUNTIME_REPETITIONS = 100  # a run-time sweep's repetitions of one candidate, at most
# (warm-up ms, timed ms, repetitions at most) of the finalists' full timing; every agreed candidate is first screened
# at the certifying sweep's own brief budget (`runner.SCREEN_MS`)
RUNTIME_FULL = (5.0, 20.0, RUNTIME_REPETITIONS)


def _timed(spec, runtime: RuntimeLaunch, agreed: list) -> list:
    """The agreed candidates' outcomes to choose the winner from. On a GPU, as the certifying sweep times: each
    candidate screened briefly, then the finalists (the screen's fastest, those near it, the untuned default) timed
    at the full budget, and only they are chosen from (the full budget for every candidate was 25 ms or more each of
    a matmul key's 82). Under the interpreter, one launch's CPU time each."""
    from nbxcert.kernels.backends import select
    from nbxcert.runner import SCREEN_MS
    from nbxcert.sweep import Outcome, finalists

    if select().name != "cuda":
        return [Outcome(c, "correct", timing=_time(runtime, c, None), phase="final") for c in agreed]
    screened = [Outcome(c, "correct", timing=_time(runtime, c, SCREEN_MS), phase="screen") for c in agreed]
    final = finalists(screened, spec.default)
    return [Outcome(o.config, "correct", timing=_time(runtime, o.config, RUNTIME_FULL), phase="final") for o in final]


def _time(runtime: RuntimeLaunch, cfg, budget: tuple[float, float, int] | None) -> dict:
    """One candidate's timing, summarised as a sweep's are: CUDA events on a GPU within `budget` (warm-up ms, timed
    ms, repetitions at most; each repetition is a host launch), one launch's CPU time under the interpreter (None)."""
    from nbxcert.runner import summary

    if budget is not None:
        from nbxcert.kernels.backends import triton_cuda

        warmup_ms, rep_ms, most = budget
        timed = triton_cuda.time_events(lambda: runtime.run(cfg), warmup_ms, rep_ms, max_repetitions=most)
        return summary(timed.times_ms, "cuda_events_gated" if timed.gated else "cuda_events_waiting")
    t0 = time.perf_counter()
    runtime.run(cfg)
    return summary([(time.perf_counter() - t0) * 1e3], "interpreter_cpu")
