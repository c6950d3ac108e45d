"""The run-time sweep (`nbxcert.serving.runtime_sweep`): a candidate whose output disagrees with the consensus is
rejected and never wins; on a GPU only the screen's finalists are timed in full; a sweep holds a bounded number of
candidates' outputs, not every one; NBXCERT_SWEEP_JOBS is checked and, above 1, has the candidates compiled ahead in
that many workers; compile_ahead's pool stops when idle."""

from __future__ import annotations

import gc
import time
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from nbxcert.errors import UsageError
from nbxcert.kernels.dtypes import get_dtype
from nbxcert.kernels.spec import Config
from nbxcert.profiles import get_profile
from nbxcert.serving.runtime_sweep import CONSENSUS_OF, RuntimeLaunch, sweep_at_run_time, sweep_jobs

PROFILE = get_profile("interpreter")
N = 4096


class _Array(np.ndarray):
    """An ndarray that a weak reference can follow (a plain ndarray takes none)."""


class _Output:
    """An output tensor as the sweep sees it: its dtype and its float64 values, written by the last run; `live`
    counts the copies handed out that are still alive."""

    def __init__(self) -> None:
        self.dtype = get_dtype("float32")
        self.values = np.zeros(N)
        self.live = 0
        self.made = 0

    def _gone(self) -> None:
        self.live -= 1

    def _copy(self, dtype) -> np.ndarray:
        copy = self.values.astype(dtype).view(_Array)
        self.live += 1
        self.made += 1
        weakref.finalize(copy, self._gone)
        return copy

    def float64(self) -> np.ndarray:
        return self._copy(np.float64)

    def numpy(self) -> np.ndarray:
        """The storage values, as `Judge.verdict_of` reads them (a copy, counted as `float64`'s are)."""
        return self._copy(np.float32)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape


def _sweep(configs, wrong=(), peak: list | None = None, dtypes=()):
    """Sweep fake candidates of one float32 output: each writes the same ramp, those in `wrong` a ramp 1% off;
    `peak` gets the candidate outputs held at each run, then how many were read in all."""
    out = _Output()
    truth = np.linspace(-1.0, 1.0, N)

    def run(cfg):
        gc.collect()
        if peak is not None:
            peak.append(out.live)
        out.values = truth * (1.01 if cfg in wrong else 1.0)

    spec = SimpleNamespace(
        name="fake_sweep",
        default=configs[0],
        pruned_for=lambda problem, profile: SimpleNamespace(kept=list(configs)),
    )
    chosen = sweep_at_run_time(spec, {"n": N}, PROFILE, RuntimeLaunch(run=run, outputs=[out]), dtypes)
    if peak is not None:
        peak.append(out.made)
    return chosen


def _configs(n):
    return [Config.make(num_warps=4, BLOCK=64 << i) for i in range(n)]


def test_a_candidate_that_disagrees_with_the_consensus_never_wins(capfd):
    configs = _configs(8)
    # the default and one in the consensus's group, one after it: each off by 1% (tolerance 1e-5 here)
    wrong = {configs[0], configs[2], configs[6]}
    chosen = _sweep(configs, wrong)
    assert chosen in configs and chosen not in wrong
    err = capfd.readouterr().err
    assert "rejected" in err and "disagrees with the consensus" in err


def _failing_sweep(configs, fails):
    """A sweep whose candidates in `fails` raise what `fails` maps them to; the others write one ramp."""
    out = _Output()

    def run(cfg):
        if cfg in fails:
            raise fails[cfg]
        out.values = np.linspace(-1.0, 1.0, N)

    spec = SimpleNamespace(
        name="fake_sweep", default=configs[0], pruned_for=lambda p, prof: SimpleNamespace(kept=configs)
    )
    return sweep_at_run_time(spec, {"n": N}, PROFILE, RuntimeLaunch(run=run, outputs=[out]), ())


def test_a_rejected_candidate_is_named_with_its_reason_not_its_type_alone(capfd):
    configs = _configs(3)
    assert _failing_sweep(configs, {configs[0]: KeyError("BLOCK_K")}) in configs[1:]
    err = capfd.readouterr().err
    assert f"{configs[0].label()}: KeyError: 'BLOCK_K'" in err, err


def test_a_sweep_where_no_candidate_ran_says_the_first_refusal():
    from nbxcert.errors import LaunchError

    configs = _configs(2)
    with pytest.raises(LaunchError, match=r"no candidate ran at run time .*\(the first: .*ValueError: out of range\)"):
        _failing_sweep(configs, {c: ValueError("out of range") for c in configs})


def test_a_sweep_holds_a_bounded_number_of_outputs_not_every_candidates():
    """Bug: every candidate's float64 outputs were kept until all had run (for a 4096 x 28672 float16 matmul's 82
    candidates, 77 GB of the host's memory) and the median re-stacked for each candidate judged."""
    peak: list[int] = []
    configs = _configs(3 * CONSENSUS_OF)
    assert _sweep(configs, peak=peak) in configs
    *held, read = peak
    assert max(held) <= CONSENSUS_OF
    assert read == len(configs)  # every candidate's output was judged: the bound is not had by judging fewer


def test_fewer_candidates_than_a_consensus_still_judge_each_other():
    configs = _configs(3)
    assert _sweep(configs, wrong={configs[0]}) in configs[1:]


def test_on_a_gpu_every_candidate_is_screened_and_only_the_finalists_are_timed_in_full(monkeypatch):
    """As the certifying sweep times: every agreed candidate screened at the brief budget, the finalists the sweep's
    rule takes (the two fastest, those within 15% of the fastest, at most four, and the untuned default) timed at the
    full budget, and the winner chosen from the full timings alone."""
    from nbxcert.kernels import backends
    from nbxcert.runner import SCREEN_MS, summary
    from nbxcert.serving import runtime_sweep as rs

    configs = _configs(8)  # configs[0]: the untuned default
    screen = dict(zip(configs, (50.0, 11.0, 30.0, 10.0, 40.0, 10.5, 11.4, 12.0), strict=True))
    full = {configs[0]: 50.0, configs[1]: 12.0, configs[3]: 13.0, configs[5]: 9.0, configs[6]: 14.0}
    calls = []

    def timed(runtime, cfg, budget):
        calls.append((cfg, budget))
        median = screen[cfg] if budget == SCREEN_MS else full[cfg]
        return summary([median] * 20, "cuda_events_gated")

    monkeypatch.setattr(backends, "select", lambda: SimpleNamespace(name="cuda"))
    monkeypatch.setattr(rs, "_time", timed)
    assert _sweep(configs) == configs[5]
    assert [c for c, b in calls if b == SCREEN_MS] == configs  # the certifying sweep's screen
    assert {c for c, b in calls if b == rs.RUNTIME_FULL} == {configs[i] for i in (3, 5, 1, 6, 0)}
    assert len(calls) == len(configs) + 5


@pytest.mark.parametrize("text", ["0", "-2", "many", "1.5", "99999"])
def test_a_bad_sweep_jobs_is_one_clear_error(monkeypatch, text):
    monkeypatch.setenv("NBXCERT_SWEEP_JOBS", text)
    with pytest.raises(UsageError, match=f"NBXCERT_SWEEP_JOBS={text} is not a count of worker processes"):
        sweep_jobs()


def test_sweep_jobs_above_one_compiles_the_candidates_ahead_in_that_many_workers(monkeypatch):
    import nbxcert.ahead

    asked = []
    monkeypatch.setattr(nbxcert.ahead, "compile_ahead", lambda *a, **k: asked.append((a, k)) or 0)
    configs = _configs(4)
    monkeypatch.delenv("NBXCERT_SWEEP_JOBS", raising=False)
    _sweep(configs, dtypes=("float32",))
    assert asked == []  # the default: one process, nothing spawned
    monkeypatch.setenv("NBXCERT_SWEEP_JOBS", "3")
    _sweep(configs, dtypes=("float32",))
    ((args, kwargs),) = asked
    assert args[3] == configs and args[2] == ("float32",) and kwargs == {"jobs": 3}


class _FakePool:
    made: list[_FakePool] = []

    def __init__(self, env, modules, jobs):
        self.jobs, self.closed, self.requests = jobs, False, []
        _FakePool.made.append(self)

    def compile_all(self, requests, timeout_s):
        self.requests += requests
        return [{"status": "compiled"} for _ in requests]

    def close(self):
        self.closed = True


def test_compile_ahead_keeps_its_pool_between_calls_and_stops_it_when_idle(monkeypatch):
    import nbxcert.ahead as ahead
    import nbxcert.kernels.backends as backends
    from nbxcert.kernels import rows

    monkeypatch.setattr(backends, "select", lambda: SimpleNamespace(name="cuda"))
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "device")  # the pool class patched here; the cross one reads a GPU
    monkeypatch.setattr(ahead, "CompilePool", _FakePool)
    monkeypatch.setattr(ahead, "AHEAD_IDLE_S", 0.3)
    _FakePool.made.clear()
    problem = {"n_rows": 1, "n_cols": 2048}
    kept = rows.RMSNORM.pruned_for(problem, get_profile("hopper")).kept[:3]
    assert ahead.compile_ahead(rows.RMSNORM, problem, ("float16", "float16"), kept, "nvidia/hopper", jobs=2) == 3
    assert ahead.compile_ahead(rows.RMSNORM, problem, ("float16", "float16"), kept, "nvidia/hopper", jobs=2) == 3
    (pool,) = _FakePool.made  # one pool for both calls, of the first call's size
    assert pool.jobs == 2 and len(pool.requests) == 6 and not pool.closed
    deadline = time.monotonic() + 10
    while not pool.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.closed and ahead._ahead["pool"] is None
    # a spec no worker can find by name (a user's, not registered as nbxcert's) is compiled by the caller
    user = SimpleNamespace(name="user_kernel_not_registered", kernels=[])
    assert ahead.compile_ahead(user, problem, ("float16",), kept, "nvidia/hopper", jobs=2) == 0
    assert len(_FakePool.made) == 1
