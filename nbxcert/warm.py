"""`nbxcert warm`: compile the certified winners of some keys ahead, in parallel, into Triton's on-disk cache;
`compile_ahead` (from `nbxcert.ahead`), the same for any configs of one problem; and `check_configs`, which
checks such configs against the oracle once they are compiled ahead (the kernel families' GPU tests at real shapes).

A serving process that meets a key for the first time compiles its certified config then, one kernel after the other
(a second or more each on a GPU). `warm` compiles every certified winner of a workload (or keys file, or key texts)
at both ends of its key's bucket (the specialisations a launch of that key meets) in a pool of worker processes, as the
sweep compiles its candidates, so the first launches only load them; `start` does it in the background of a serving
process, which launches meanwhile. A key with no certificate is listed as missing; a winner that fails to compile is
listed with the compiler's reason. Under the interpreter nothing is compiled.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbxcert.ahead import COMPILE_TIMEOUT_S as TIMEOUT_S
from nbxcert.ahead import compile_ahead, compile_request
from nbxcert.keys import LaunchKey


@dataclass
class WarmReport:
    profile: str
    backend: str
    keys: int = 0
    winners: int = 0  # the certified winners found for the keys
    compiled: int = 0  # of them, compiled here (none under the interpreter, which compiles nothing)
    seconds: float = 0.0
    missing: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # key, reason

    def line(self) -> str:
        what = (
            f"compiled {self.compiled}"
            if self.backend == "cuda"
            else f"nothing to compile under the interpreter for {self.winners}"
        )
        return (
            f"[nbxcert] warm {self.profile}: {self.keys} keys, {what} certified winners in "
            f"{self.seconds:.1f} s, {len(self.missing)} missing, {len(self.failed)} failed"
        )


def phases(requests: Sequence[dict]) -> tuple[list[int], list[int]]:
    """(the first request of each kernel, config and dtypes, every other one), as indices into `requests`. Requests
    that share those compile one kernel and differ only in what their problems specialise (divisibility, sizes of
    one): handed to a pool at once, its workers compiled that kernel side by side, each for nothing but the first. A
    workload's 526 certified winners are 129 such kernels (`distinct_winners` of `benchmarks/bench_certified.py
    winners --workload tinyllama-1.1b`)."""
    first, rest, seen = [], [], set()
    for i, request in enumerate(requests):
        kernel = (request["spec"], json.dumps(request["config"], sort_keys=True), tuple(request["dtypes"]))
        (rest if kernel in seen else first).append(i)
        seen.add(kernel)
    return first, rest


def compile_all(requests: Sequence[dict], jobs: int | None = None, modules: Sequence[str] = ()) -> list[dict]:
    """Compile `requests` (`compile_request`) in a pool of `jobs` worker processes (default: the CPU count), filling
    Triton's on-disk cache; the replies in the requests' order (status "compiled", or the refusal and its reason).
    In two phases (`phases`): one request of each kernel first, then the others, which find it in the cache and
    compile only the specialisations they add."""
    from nbxcert.ahead import cuda_pool
    from nbxcert.worker import CompilePool

    requests = list(requests)
    replies: list[dict] = [{}] * len(requests)
    pool = cuda_pool({"NBXCERT_BACKEND": "cuda"}, modules, jobs or os.cpu_count() or 1, CompilePool)
    try:
        for phase in phases(requests):
            if phase:
                for i, reply in zip(phase, pool.compile_all([requests[i] for i in phase], TIMEOUT_S), strict=False):
                    replies[i] = reply
        return replies
    finally:
        pool.close()


def _requests(profile_name: str, keys: Sequence[LaunchKey], dirs: Sequence[Path] | None):
    """(the report so far, each certified key's compile request, their key texts): the serving index read in the
    caller's thread, once every key and directory is checked."""
    from nbxcert import serving
    from nbxcert.certify import resolve_profile
    from nbxcert.kernels.backends import select
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import check_key
    from nbxcert.options import existing_dirs

    profile, _how = resolve_profile(profile_name)
    for k in keys:
        check_key(get_spec(k.kernel), k, profile)
    if dirs is not None:
        dirs = existing_dirs(dirs)
    report = WarmReport(profile.key, select().name, keys=len(keys))
    if dirs is None:
        index = serving.state().index
    else:
        with serving.configured(dirs=dirs):  # the process's own serving settings come back afterwards
            index = serving.state().index
    requests, names = [], []
    for key in keys:
        text = key.text()
        entry = index.get(text)
        if entry is None:
            report.missing.append(text)
            continue
        spec = get_spec(key.kernel)
        config = serving.certified_config(spec, entry, text)
        requests.append(
            compile_request(spec, config, key.dtypes, entry["certified_problems"], entry["seed"], profile.key)
        )
        names.append(text)
    return report, requests, names


def _compile(
    report: WarmReport, requests: list[dict], names: list[str], jobs: int | None, modules: Sequence[str] = ()
) -> WarmReport:
    import time

    t0 = time.perf_counter()
    report.winners = len(requests)
    if report.backend == "cuda" and requests:
        for text, reply in zip(names, compile_all(requests, jobs, modules), strict=False):
            if reply.get("status") == "compiled":
                report.compiled += 1
            else:
                report.failed.append((text, f"{reply.get('status')}: {reply.get('reason', '')}"))
    report.seconds = time.perf_counter() - t0
    return report


def warm(
    profile_name: str,
    keys: Sequence[LaunchKey],
    dirs: Sequence[Path] | None = None,
    jobs: int | None = None,
    modules: Sequence[str] = (),
    check_env: bool = True,
) -> WarmReport:
    """Compile the certified winners of `keys` (in their order) in a pool and wait for them (`nbxcert warm`).
    `modules`: the user's own specs (`--spec`), imported by the compile workers too. `check_env`: check the NBXCERT_*
    variables that name paths first (`options.check_environment`; verify has, for the directories it configured)."""
    from nbxcert.options import check_environment
    from nbxcert.options import jobs as check_jobs

    jobs = check_jobs(jobs)
    if check_env:
        check_environment(search_path=dirs is None)
    return _compile(*_requests(profile_name, keys, dirs), jobs, modules)


class Warming:
    """A `warm` going on in a thread of this process (`start`): the caller launches meanwhile."""

    def __init__(self, report: WarmReport, requests: list[dict], names: list[str], jobs: int | None) -> None:
        import threading

        self._report: WarmReport | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._report = _compile(report, requests, names, jobs)
            except BaseException as e:  # kept for wait(), which raises it in the caller's thread, and said now: the
                # launches go on compiling their own kernels, so nothing else would show it
                self._error = e
                print(
                    f"[nbxcert] warm in the background stopped: {type(e).__name__}: {e}; launches compile their "
                    "kernels themselves",
                    file=sys.stderr,
                )

        self._thread = threading.Thread(target=run, name="nbxcert-warm", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> WarmReport:
        """The report once every winner has compiled (or failed to); raises what the compiling raised, or
        `TimeoutError` after `timeout` seconds."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"nbxcert warm: still compiling after {timeout:g} s")
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return self._report


def start(
    profile_name: str, keys: Sequence[LaunchKey], dirs: Sequence[Path] | None = None, jobs: int | None = None
) -> Warming:
    """`warm` in the background: the certified winners of `keys` compiled in a pool of `jobs` worker processes
    (default: the CPU count less one, the caller's own thread keeping a core) while the caller goes on. Give the keys
    in the order the process will first launch them (`workload.workload_keys` does): the pool takes one kernel of each
    first, in that order, so it stays ahead of the launches. A launch that meets a kernel the pool has not compiled yet
    compiles it itself, as it would have without the pool; one the pool has compiled only loads it from Triton's cache.
    The index is read before this returns (a key with no certificate is in the report's `missing`)."""
    report, requests, names = _requests(profile_name, keys, dirs)
    return Warming(report, requests, names, jobs if jobs else max(1, (os.cpu_count() or 2) - 1))


def check_configs(
    spec,
    problem: Mapping[str, Any],
    dtypes: tuple[str, ...],
    profile,
    seed: int,
    device: str,
    configs=None,
) -> list[str]:
    """Check every config (by default those the profile's prune keeps for `problem`) against the oracle, made once,
    each from the same input bytes; configs equal but for no-bit fields must agree to the bit. On a GPU the configs
    are compiled ahead first (`compile_ahead`), so the launches below load them. Returns the failures' reports
    (empty: every config is correct and every no-bit claim holds)."""
    from nbxcert.kernels.check import describe, no_bit_group, prepare, run_prepared

    prepared = prepare(spec, problem, tuple(dtypes), profile, seed, device)
    if configs is None:
        configs = spec.pruned_for(problem, profile).kept
    if device.startswith("cuda"):
        compile_ahead(spec, problem, tuple(dtypes), configs, profile.key, seed)  # the launches below then load them
    failures: list[str] = []
    first: dict[tuple, tuple[Any, dict[str, bytes]]] = {}
    for config in configs:
        verdicts = run_prepared(prepared, config)
        failures += [v.report for v in verdicts.values() if not v.ok]
        outs = prepared.inputs.tensors
        bits = {name: outs[name].contiguous().numpy().tobytes() for name in prepared.inputs.outputs}
        group = no_bit_group(spec, config)
        if group in first and first[group][1] != bits:
            failures.append(
                f"{describe(spec, config, problem, dtypes)}: differs in bits from {first[group][0].label()}"
                " (a no-bit claim)"
            )
        first.setdefault(group, (config, bits))
    return failures
