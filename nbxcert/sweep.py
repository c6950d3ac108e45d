"""The sweep of one launch key: every candidate the device file allows, compiled, checked against the oracle, timed.

1. The spec's candidates are pruned by device-file facts; each pruned one keeps its reason.
2. The rest are compiled ahead of timing, in parallel worker processes (Triton's compile is CPU-bound), for every
   specialisation the checks launch, so the sweep takes the slowest compile plus the runs, not the sum of compiles.
3. Each compiled candidate runs in the runner worker on seeded inputs at the bucket's smallest and largest member,
   outputs poisoned first, and is compared with the oracle. The inputs, the oracle's answer and what each output is
   judged by are made once per problem and reused for every candidate (each starts from the same bytes). Refusals
   keep their reason: compile, resources, crash (the worker is replaced), timeout (the worker is killed and replaced),
   mismatch (with the numpy-style report).
4. Each correct candidate is screened at the bucket's largest member with a brief budget (CUDA events, L2 flushed);
   the fastest few and the untuned default are timed again at the full budget (`runner.SCREEN_MS`, `FULL_MS`). Under
   the interpreter the checked launch's CPU time is the timing.
5. Winner = fastest of the fully timed; a candidate whose median cannot be told apart from the fastest's (within `Z`
   standard errors of the difference of the medians) is preferred when it is the kernel's untuned default, then when
   it is simpler, so certificates do not flip between runs. The winner runs three
   more times on the same inputs, each run judged against the oracle and the runs' bits compared: a winner wrong on
   a re-run (a candidate right only on its first launch passes an exact key's one checked launch), crashed, hung, or
   not bit-identical though its spec claims determinism is refused like any candidate and the winner chosen again.
   A spec that does not claim determinism gets `reproducible: false` on its certificate instead.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from nbxcert.kernels.spec import Config, KernelSpec
from nbxcert.keys import LaunchKey, key_problems
from nbxcert.worker import CompilePool, Worker, WorkerGone, drive_all

REFUSALS = ("pruned", "compile", "resources", "crash", "timeout", "mismatch")


@dataclass
class Outcome:
    """What became of one candidate."""

    config: Config
    status: str  # one of REFUSALS or "correct"
    reason: str = ""
    error: dict[str, float] | None = None
    timing: dict[str, Any] | None = None
    phase: str = ""  # "screen" (the brief budget) or "final" (the full one) for a timed candidate

    @property
    def median(self) -> float:
        return self.timing["median_us"] if self.timing else float("inf")


@dataclass
class SweepResult:
    key: LaunchKey
    problems: dict[str, dict[str, Any]]
    outcomes: list[Outcome]
    winner: Outcome | None
    runner_up: Outcome | None
    default: Outcome | None
    reproducible: bool | None
    seconds: dict[str, float] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        c = {s: 0 for s in REFUSALS + ("correct",)}
        for o in self.outcomes:
            c[o.status] += 1
        return c

    @property
    def margin(self) -> float | None:
        if self.winner is None or self.runner_up is None:
            return None
        return self.runner_up.median / self.winner.median - 1.0


def simplicity(config: Config) -> tuple:
    """Smaller is simpler: fewer stages, fewer warps, then smaller tile sizes."""
    ints = [v for _, v in config.kwargs if isinstance(v, int)]
    return (config.num_stages, config.num_warps, sum(ints), config.label())


# Two medians are told apart when they differ by more than Z standard errors of their difference (about 95% for
# normal errors). A median's standard error is taken as (p80 - p20) / (1.2 * sqrt(reps)): 60% of the repetitions lie
# between p20 and p80, so the density near the median is about 0.6 / (p80 - p20), and the sample median's standard
# error is 1 / (2 * density * sqrt(reps)).
Z = 2.0


def median_se(o: Outcome) -> float:
    """The standard error of a timed candidate's median, from its spread and repetitions (see Z)."""
    t = o.timing or {}
    reps = int(t.get("reps") or 0)
    spread = float(t.get("spread") or 0.0)
    return spread * o.median / (1.2 * math.sqrt(reps)) if reps > 0 else spread * o.median


def choose_winner(correct: list[Outcome], default: Config) -> tuple[Outcome | None, Outcome | None]:
    """Fastest correct; among the candidates whose median cannot be told apart from the fastest's (within Z standard
    errors of the difference), prefer the untuned default, then the simplest. Returns (winner, runner-up).

    The band is the medians' uncertainty, not the spread of single runs: a fast candidate with noisy runs (a spread
    of 100% over 360 repetitions) must not let a default 78% slower and steady win, as the raw spread did."""
    if not correct:
        return None, None
    ranked = sorted(correct, key=lambda o: (o.median, simplicity(o.config)))
    best = ranked[0]
    band = [o for o in ranked if o.median - best.median <= Z * math.hypot(median_se(o), median_se(best))]
    winner = next((o for o in band if o.config == default), None) or min(band, key=lambda o: simplicity(o.config))
    rest = [o for o in ranked if o is not winner]
    return winner, (rest[0] if rest else None)


# How many correct candidates (besides the untuned default) get the full timing after the screen, and how close to the
# screen's fastest one must be to be among them (a screen median within this fraction of the fastest's).
FINALISTS = 4
FINAL_BAND = 0.15


def finalists(correct: list[Outcome], default: Config) -> list[Outcome]:
    """The correct candidates timed again at the full budget: the fastest screened (at least two, so a runner-up is
    measured alike), those within FINAL_BAND of it (at most FINALISTS), and the untuned default."""
    ranked = sorted(correct, key=lambda o: (o.median, simplicity(o.config)))
    if not ranked:
        return []
    best = ranked[0].median
    chosen = [o for i, o in enumerate(ranked[:FINALISTS]) if i < 2 or o.median <= best * (1.0 + FINAL_BAND)]
    chosen += [o for o in ranked if o.config == default and o not in chosen]
    return chosen


class _Background:
    """One request to a worker on a thread of its own (the worker must have no other request meanwhile)."""

    def __init__(self, worker: Worker, request: dict, timeout_s: float):
        import threading

        self.reply: dict = {}
        self.thread = threading.Thread(target=self._run, args=(worker, request, timeout_s), daemon=True)
        self.thread.start()

    def _run(self, worker: Worker, request: dict, timeout_s: float) -> None:
        try:
            self.reply = worker.request(request, timeout_s)
        except WorkerGone as gone:  # the checks that follow meet the same fault, each refused with it
            self.reply = {"status": gone.status, "reason": gone.detail}
        except Exception as exc:  # the worker was killed under this thread: the sweep was interrupted
            self.reply = {"status": "crash", "reason": f"{type(exc).__name__}: {exc}"}

    def join(self, timeout: float | None = None) -> dict:
        self.thread.join(timeout)
        return self.reply


def _add_seconds(total: dict[str, float], reply: dict) -> None:
    for k, v in (reply.get("seconds") or {}).items():
        total[k] = total.get(k, 0.0) + float(v)


def _check_all(
    runners: list[Worker], base: dict, configs: list[Config], timeout_s: float, key, progress, op: dict | None = None
) -> list:
    """Check and screen-time each config (or, with `op`, send that request instead); with several runners (the
    interpreter, whose timings are CPU times and never compared with a GPU's) they run at once, one candidate per
    runner. A GPU sweep has one runner: timings must not overlap."""
    op = op or {"op": "check", "time": "screen"}
    what = "checked" if op["op"] == "check" else "timed"

    def on_reply(count: int) -> None:
        if progress:
            progress(f"{key.text()}: {what} {count}/{len(configs)} candidates")

    requests = [{**base, **op, "config": c.as_dict()} for c in configs]
    replies = drive_all(runners, requests, timeout_s, on_reply)
    return [r if r is not None else {"status": "crash", "reason": "no reply from the runner"} for r in replies]


REPRO_RUNS = 3  # how many more times the winner runs on the same inputs, each judged and compared to the bit


def _rerun_refusal(spec: KernelSpec, runner: Worker, base: dict, winner: Outcome, timeout_s: float):
    """None when the winner, run REPRO_RUNS more times on the same inputs, matches the oracle every time with the same
    bits; else (status, reason) of its refusal. A spec that does not claim determinism gets ("irreproducible", ...)
    for differing bits (recorded on the certificate, not refused)."""
    try:
        reply = runner.request(
            {**base, "op": "repro", "config": winner.config.as_dict(), "runs": REPRO_RUNS}, timeout_s
        )
    except WorkerGone as gone:
        return gone.status, f"when run again: {gone.detail}"
    if reply.get("status") != "done":
        return reply.get("status", "crash"), "when run again: " + reply.get("reason", "")
    if reply.get("reproducible"):
        return None
    reason = f"not reproducible: its outputs' bits differed between {REPRO_RUNS} runs on the same inputs"
    return (
        ("mismatch", reason + " (the spec says it is deterministic)")
        if spec.deterministic
        else ("irreproducible", reason)
    )


def sweep_key(
    spec: KernelSpec,
    key: LaunchKey,
    profile,
    runner: Worker | list[Worker],
    compiler: CompilePool | None,
    seed: int,
    timeout_s: float,
    progress=None,
) -> SweepResult:
    """Sweep one key. `runner` is the worker that checks and times; `compiler` compiles ahead in parallel (None
    under the interpreter, which compiles nothing)."""
    t_start = time.perf_counter()
    problems = key_problems(spec, key, profile)
    dtypes = list(key.dtypes)
    pruned = spec.prune(spec.candidates, problems["timing"], profile)
    outcomes = [Outcome(c, "pruned", reason) for c, reason in pruned.pruned]
    # a config pruned at the largest member may still be kept at the smallest: the key is certified at both ends, so
    # a candidate must be allowed for both
    kept_small = set(spec.prune(spec.candidates, problems["smallest"], profile).kept)
    kept = []
    for c in pruned.kept:
        if c in kept_small:
            kept.append(c)
        else:
            outcomes.append(Outcome(c, "pruned", "pruned at the bucket's smallest member"))
    base = {"spec": spec.name, "problems": problems, "dtypes": dtypes, "seed": seed, "profile": profile.key}
    if progress:
        progress(f"{key.text()}: compiling {len(kept)} candidates ({len(outcomes)} pruned)")
    runners = runner if isinstance(runner, list) else [runner]
    inner: dict[str, float] = {}
    # the first runner makes the inputs, the oracle's answers and the judges while the pool compiles (the interpreter
    # compiles nothing: then before the checks); a fault here is met again, and refused, by the checks that follow
    prep = _Background(runners[0], {**base, "op": "prepare", "config": spec.default.as_dict()}, timeout_s)
    if compiler is not None:
        try:
            compiled = compiler.compile_all([{**base, "op": "compile", "config": c.as_dict()} for c in kept], timeout_s)
        except BaseException:
            for r in runners:
                r.kill()
            prep.join(10.0)
            raise
    else:
        compiled = [{"status": "compiled"} for _ in kept]
    prepared = prep.join()
    _add_seconds(inner, prepared)
    made = {k: float((prepared.get("seconds") or {}).get(k, 0.0)) for k in ("inputs", "oracle")}
    t_compiled = time.perf_counter()
    runnable = []
    for c, reply in zip(kept, compiled, strict=False):
        if reply["status"] == "compiled":
            runnable.append(c)
        else:
            outcomes.append(Outcome(c, reply["status"], reply.get("reason", "")))
    checked = _check_all(runners, base, runnable, timeout_s, key, progress)
    t_checked = time.perf_counter()
    for c, reply in zip(runnable, checked, strict=False):
        _add_seconds(inner, reply)
        if reply["status"] == "correct":
            outcomes.append(Outcome(c, "correct", "", reply["error"], reply["timing"], reply["phase"]))
        else:
            outcomes.append(Outcome(c, reply["status"], reply.get("reason", "")))
    runner = runners[0]
    winner, runner_up, reproducible = None, None, None
    while True:
        correct = [o for o in outcomes if o.status == "correct"]
        final = finalists(correct, spec.default)
        screened = [o for o in final if o.phase == "screen"]
        if screened:
            # the full timing, one candidate at a time on the one GPU runner
            timed = _check_all([runner], base, [o.config for o in screened], timeout_s, key, progress, {"op": "time"})
            for o, reply in zip(screened, timed, strict=False):
                _add_seconds(inner, reply)
                if reply["status"] == "timed":
                    o.timing, o.phase = reply["timing"], reply["phase"]
                else:  # it ran correctly once and then failed: it is refused, never a silent `inf`
                    o.status, o.reason, o.timing = reply["status"], "while timed: " + reply.get("reason", ""), None
            final = [o for o in final if o.status == "correct"]
        winner, runner_up = choose_winner(final, spec.default)
        if winner is None:
            break
        refusal = _rerun_refusal(spec, runner, base, winner, timeout_s)
        if refusal is None:
            reproducible = True
            break
        if refusal[0] == "irreproducible":  # a spec that says its bits may vary: recorded, not refused
            reproducible = False
            break
        # wrong, crashed or hung when run again, or not bit-reproducible though the spec says it is: refused like any
        # other candidate, and the winner is chosen again from the rest (timed in full first where it was not)
        winner.status, winner.reason, winner.timing = refusal[0], refusal[1], None
    t_run = time.perf_counter()
    default = next((o for o in outcomes if o.config == spec.default), None)
    # candidates keep the spec's order in the record, whatever order they finished in
    order = {c: i for i, c in enumerate(spec.candidates)}
    outcomes.sort(key=lambda o: order[o.config])
    t_end = time.perf_counter()
    # Where the key's wall time went, in parts that add up to it: the first runner's inputs and oracle's answers (and
    # judges), the compile's wait beyond them (the pool compiles meanwhile; with the prune and the requests' round
    # trips), the checks of every candidate (under the interpreter, other runners make their own inputs within their
    # first check), the timing of the finalists and the winner's runs again, and the record. The runner_* figures are
    # work inside the runners, summed over runners that run at once (so they may exceed the wall time): a diagnosis,
    # not parts of it.
    seconds = {
        "compile": max(0.0, t_compiled - t_start - made["inputs"] - made["oracle"]),
        "inputs": made["inputs"],
        "oracle": made["oracle"],
        "checks": t_checked - t_compiled,
        "timing": t_run - t_checked,
        "record": t_end - t_run,
        "total": t_end - t_start,
        **{f"runner_{k}": v for k, v in sorted(inner.items())},
    }
    return SweepResult(key, problems, outcomes, winner, runner_up, default, reproducible, seconds)
