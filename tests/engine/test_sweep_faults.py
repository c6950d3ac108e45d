"""Faults during a sweep: the purpose-built `fault_sweep` kernel (`tests/fixtures/faulty_kernels.py`) fails in every
way a candidate can (wrong results, no compile, an illegal address, a hang, results that vary between runs, more
shared memory than the device has); one sweep refuses each with its own reason and certifies the correct candidate.
Under the interpreter here; on a GPU the illegal address and the hang run for real (`gpu`).

The figures (faults injected and survived, kills and resumes, keys lost) are printed and, with
NBXCERT_RELIABILITY_REPORT=PATH, appended to PATH as JSON lines (tests/FUZZ.md quotes them).
"""

from __future__ import annotations

import sys
import time

import pytest
from reliabilitytools import (
    FIXTURES,
    INTERPRETER_ENV,
    figures,
)

# FAULT -> (status, a part of its reason). One sweep, one key: each fault refused with its own reason.
INTERPRETER_FAULTS = {
    2: ("mismatch", "Mismatched elements: 257 / 257"),  # wrong everywhere, every run (257: the bucket's smallest)
    3: ("compile", "deliberate compile failure"),
    4: ("crash", "the worker process died"),  # reads 2**44 elements away: a segfault under the interpreter
    5: ("timeout", "no answer within"),
    6: ("mismatch", "Mismatched elements: 64 / 512"),  # nondeterministic: right at 257 (its first run), then wrong
    7: ("pruned", "max_shared_memory_per_block_optin=232448"),
}


def _sweep(faulty, profile, runners, compiler, timeout_s):
    from nbxcert.keys import LaunchKey
    from nbxcert.sweep import sweep_key

    # n=512 is a rung of the `rows` ladder: the bucket (256, 512] is checked at 257 and at 512, two launches in one
    # worker, so the nondeterministic candidate (right on its first launch only) is caught at the second
    key = LaunchKey("fault_sweep", (("n", 512),), ("float32",))
    return sweep_key(faulty.SWEEP_SPEC, key, profile, runners, compiler, seed=11, timeout_s=timeout_s)


def _tally(result, expected: dict) -> dict:
    by_fault = {o.config["FAULT"]: o for o in result.outcomes}
    for fault, (status, reason) in expected.items():
        o = by_fault[fault]
        assert (o.status, reason in o.reason) == (status, True), (fault, o.status, o.reason)
    survived = sum(by_fault[f].status == s for f, (s, _) in expected.items())
    return {
        "faults_injected": len(expected),
        "faults_survived": survived,
        "keys_lost": 0 if result.winner is not None else 1,
        "winner": result.winner.config.label() if result.winner else None,
    }


def test_nondeterministic_candidate_gives_different_results_on_two_runs_of_one_input(faulty):
    from nbxcert.kernels.check import run_checked
    from nbxcert.profiles import get_profile

    faulty._COUNTERS.clear()  # a fresh counter: the first launch of the process
    profile, cfg = get_profile("cpu/interpreter"), faulty.SWEEP_CANDIDATES[6]
    first, second = (run_checked(faulty.SWEEP_SPEC, cfg, {"n": 300}, ("float32",), profile, 5, "cpu") for _ in "12")
    assert first["out"].ok and not second["out"].ok
    assert "Mismatched elements: 64 / 300" in second["out"].report


def _first_run_sweep(faulty, monkeypatch=None, prefer_fault=None):
    from nbxcert import sweep as sweep_mod
    from nbxcert.keys import LaunchKey
    from nbxcert.profiles import get_profile
    from nbxcert.worker import Worker

    if prefer_fault is not None:  # the chooser picks the faulty candidate first, whatever the interpreter's timings
        real = sweep_mod.choose_winner

        def choose(final, default):
            first = [o for o in final if o.config["FAULT"] == prefer_fault]
            return (first[0], None) if first else real(final, default)

        monkeypatch.setattr(sweep_mod, "choose_winner", choose)
    key = LaunchKey(faulty.FIRST_RUN_SPEC.name, (("n", 100),), ("float32",))  # 100: an exact key, checked once
    runner = Worker(INTERPRETER_ENV, ["faulty_kernels"])
    try:
        return sweep_mod.sweep_key(
            faulty.FIRST_RUN_SPEC, key, get_profile("cpu/interpreter"), [runner], None, seed=11, timeout_s=60
        )
    finally:
        runner.close()


def test_a_winner_right_only_on_its_first_launch_is_refused_when_run_again(faulty, monkeypatch):
    """At an exact key the nondeterministic candidate passes its one checked launch; chosen as winner, its re-runs are
    judged against the oracle: refused as a mismatch naming the re-run, and the winner chosen again
    (the correct one)."""
    result = _first_run_sweep(faulty, monkeypatch, prefer_fault=6)
    by_fault = {o.config["FAULT"]: o for o in result.outcomes}
    assert by_fault[6].status == "mismatch", (by_fault[6].status, by_fault[6].reason)
    assert "wrong when run again (run 1 on the same inputs)" in by_fault[6].reason
    assert "Mismatched elements: 64 / 100" in by_fault[6].reason
    assert result.winner is not None and result.winner.config["FAULT"] == 1
    assert result.reproducible is True


def test_a_sweep_whose_only_correct_candidate_fails_its_rerun_certifies_nothing(faulty, monkeypatch):
    from nbxcert.sweep import finalists

    # the finalists are only ever the faulty candidate: once it is refused there is nothing left to certify
    monkeypatch.setattr(
        "nbxcert.sweep.finalists",
        lambda correct, default: [o for o in finalists(correct, default) if o.config["FAULT"] == 6],
    )
    result = _first_run_sweep(faulty)
    assert result.winner is None and result.reproducible is None
    assert {o.config["FAULT"]: o.status for o in result.outcomes}[6] == "mismatch"


def test_one_sweep_refuses_every_fault_with_its_own_reason_and_certifies_the_correct_candidate(faulty):
    from nbxcert.profiles import get_profile
    from nbxcert.worker import Worker

    # the prune's facts are the H200's (nvidia/hopper): the interpreter's profile states no shared memory at all, so
    # under it nothing could refuse FAULT=7; the candidates still run on the interpreter
    profile = get_profile("nvidia/hopper")
    runners = [Worker(INTERPRETER_ENV, ["faulty_kernels"]) for _ in range(2)]
    t0 = time.perf_counter()
    try:
        result = _sweep(faulty, profile, runners, None, timeout_s=10)
        after = runners[0].request(
            {
                "op": "check",
                "spec": "fault_sweep",
                "config": faulty.SWEEP_CANDIDATES[0].as_dict(),
                "problems": result.problems,
                "dtypes": ["float32"],
                "seed": 3,
                "profile": profile.key,
            },
            60,
        )
    finally:
        for r in runners:
            r.close()
    tally = _tally(result, INTERPRETER_FAULTS)
    assert after["status"] == "correct", "the workers still answer after the sweep"
    by_fault = {o.config["FAULT"]: o for o in result.outcomes}
    assert by_fault[0].status == by_fault[1].status == "correct"
    assert by_fault[8].status == "correct"  # the interpreter has no shared memory: only a GPU's compile refuses it
    assert result.winner is not None and result.winner.config["FAULT"] in (0, 1)
    assert result.reproducible is True
    assert result.counts() == {
        "pruned": 1,
        "compile": 1,
        "resources": 0,
        "crash": 1,
        "timeout": 1,
        "mismatch": 2,
        "correct": 3,
    }
    assert sum(r.restarts for r in runners) >= 2, "the crashed and the hung worker were replaced"
    assert tally == {**tally, "faults_injected": 6, "faults_survived": 6, "keys_lost": 0}
    figures("faults_interpreter", seconds=round(time.perf_counter() - t0, 1), **tally)


@pytest.mark.gpu
def test_on_the_gpu_the_illegal_address_and_the_hang_run_for_real(backend):
    """On the H200: FAULT=4 is a real illegal address (the worker's CUDA context is poisoned: it exits and is
    replaced), FAULT=5 a real endless kernel (killed at the time limit), FAULT=8 a real compile refusal for shared
    memory (Triton's OutOfResources)."""
    from nbxcert.kernels.backends import cuda
    from nbxcert.profiles import match_nvidia
    from nbxcert.worker import CompilePool, Worker

    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    sys.path.insert(0, str(FIXTURES))
    import faulty_kernels

    profile = match_nvidia(cuda.device_info(0).compute_capability)[0]
    env = {"NBXCERT_BACKEND": "cuda"}
    runner, compiler = Worker(env, ["faulty_kernels"]), CompilePool(env, ["faulty_kernels"], 4)
    t0 = time.perf_counter()
    try:
        result = _sweep(faulty_kernels, profile, runner, compiler, timeout_s=60)
    finally:
        runner.close()
        compiler.close()
    expected = {
        **{f: v for f, v in INTERPRETER_FAULTS.items() if f not in (4, 7)},
        4: ("crash", ""),  # an illegal address: CUDA_ERROR_ILLEGAL_ADDRESS, or the worker dying of it
        7: ("pruned", "max_shared_memory_per_block_optin"),
        8: ("resources", "shared memory"),
    }
    tally = _tally(result, expected)
    assert result.winner is not None and result.winner.config["FAULT"] in (0, 1)
    assert runner.restarts >= 2, "the poisoned and the hung worker were replaced"
    assert tally["faults_survived"] == 7 and tally["keys_lost"] == 0
    figures("faults_gpu", seconds=round(time.perf_counter() - t0, 1), **tally)
