"""Compiling the next keys while this one is checked and timed.

A key's sweep compiles every kept candidate in the pool (CPU), then checks and times them in the one GPU runner; the
pool is idle while the GPU works and the GPU idle while the pool compiles. `certify` therefore hands `sweep_key` an
`AheadPool` in place of its `CompilePool`: once a key's compile has returned, the compile requests of the next
AHEAD_KEYS keys are queued, each set driven over the pool's workers in turn on a thread of their own, and each key's
sweep finds its replies waiting (or waits only for what is left). A key whose compile takes long (a flash attention
key's first compile, 38 s of an H200 run's cold cache) then starts while the keys before it are checked.

`compile_ahead` does the same for any configs of one problem (the run-time sweep, with NBXCERT_SWEEP_JOBS; the GPU
tests and benchmarks), in a pool kept between calls and stopped when idle.

Nothing here changes what is judged: a key's sweep asks for exactly the compiles it would ask for without this, and a
queued set is used only when it equals what the sweep asks for (else the sweep's own set goes first). This module is
not an input of a certificate's code digest (`fingerprint.ENGINE_MODULES`): scheduling compiles earlier decides no
verdict.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from nbxcert.keys import LaunchKey, key_problems
from nbxcert.worker import CompilePool, Worker, WorkerGone, drive_all

COMPILE_TIMEOUT_S = 600.0  # one compile request's limit in a pool of `compile_ahead` or `nbxcert warm`


def compile_requests(spec, key: LaunchKey, profile, seed: int) -> list[dict[str, Any]]:
    """The compile requests `sweep.sweep_key` makes for `key`: the candidates kept at the bucket's largest member
    (the timing problem) and at its smallest, in the spec's order."""
    problems = key_problems(spec, key, profile)
    at_smallest = set(spec.prune(spec.candidates, problems["smallest"], profile).kept)
    kept = [c for c in spec.prune(spec.candidates, problems["timing"], profile).kept if c in at_smallest]
    base = {"spec": spec.name, "problems": problems, "dtypes": list(key.dtypes), "seed": seed, "profile": profile.key}
    return [{**base, "op": "compile", "config": c.as_dict()} for c in kept]


class _Stoppable:
    """A pool worker that refuses every request once `stop` is set, so a cancelled compile drains at once (each
    request left is answered as a crash nobody reads) instead of starting the killed worker again."""

    def __init__(self, worker: Worker, stop: threading.Event):
        self.worker, self.stop = worker, stop

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.stop.is_set():
            raise WorkerGone("crash", "the compile ahead was cancelled")
        return self.worker.request(message, timeout_s)


# How many keys' compiles `certify` keeps queued ahead of the key being swept (`certify --ahead`). A scheduling
# policy from a measurement: in a cold-cache H100 run of llama-3-8b (2026-12-05) with 4, the keys waited 75 s of 543
# for flash attention compiles (68 candidates, 12-14 s for the pool's 16 workers) queued only 4 keys (about 5 s of the
# GPU's work) before their turn; the pool was idle for most other keys (their compiles were Triton cache hits). 16
# keys ahead starts such a set about 20 s early. Sets still run in key order, so no later key's set delays an earlier
# one that is not running yet.
AHEAD_KEYS = 16


class _Set:
    """One key's compile requests, queued; `replies` (or `error`) once `done` is set."""

    def __init__(self, requests: list[dict[str, Any]]):
        self.requests = requests
        self.replies: list[dict] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class AheadPool:
    """What `sweep.sweep_key` is given as its compile pool in a certify run: `submit` queues a key's compile requests
    (driven over the pool's workers one set after another, on a thread of their own); `compile_all` answers from a
    set queued with exactly these requests (moved to the front if it has not started) or queues its own first, then
    calls `after_compile()` (set by the caller for the key being swept: it queues the next keys' compiles).
    `submitted` counts the sets queued ahead and `used` the ones a sweep took."""

    def __init__(self, pool: CompilePool, timeout_s: float):
        self.pool = pool
        self.timeout_s = timeout_s
        self.after_compile: Callable[[], None] | None = None
        self.submitted = 0
        self.used = 0
        self._cond = threading.Condition()
        self._queue: deque[_Set] = deque()  # not started
        self._running: _Set | None = None
        self._finished: list[_Set] = []  # done, not taken by a sweep yet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, requests: list[dict[str, Any]]) -> None:
        self._enqueue(_Set(requests), front=False)
        self.submitted += 1

    def compile_all(self, requests: list[dict[str, Any]], timeout_s: float) -> list[dict]:
        with self._cond:
            found = next((q for q in self._finished if q.requests == requests), None)
            if found is None and self._running is not None and self._running.requests == requests:
                found = self._running
            if found is None:
                found = next((q for q in self._queue if q.requests == requests), None)
                if found is not None:  # this key's set goes before the keys after it
                    self._queue.remove(found)
                    self._queue.appendleft(found)
            if found is not None:
                self.used += 1
        if found is None:  # nothing queued for this key, or another key's sets (a key a concurrent run certified)
            found = _Set(requests)
            self._enqueue(found, front=True)
        found.done.wait()  # interrupted here, `kill` still cancels the sets
        with self._cond:
            if found in self._finished:
                self._finished.remove(found)
        if found.error is not None:
            raise found.error
        hook, self.after_compile = self.after_compile, None
        if hook is not None:
            hook()
        assert found.replies is not None
        return found.replies

    def _enqueue(self, queued: _Set, front: bool) -> None:
        with self._cond:
            if self._stop.is_set():
                queued.error = RuntimeError("the compile pool was closed")
                queued.done.set()
                return
            (self._queue.appendleft if front else self._queue.append)(queued)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nbxcert-compile-ahead", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        workers = [_Stoppable(w, self._stop) for w in self.pool.workers]
        no_reply = {"status": "crash", "reason": "no reply from the compile worker"}
        while True:
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return
                current = self._running = self._queue.popleft()
            try:
                replies = drive_all(workers, current.requests, self.timeout_s)
                current.replies = [r if r is not None else no_reply for r in replies]
            except BaseException as exc:  # handed to the sweep that waits for it, never printed by the thread
                current.error = exc
            with self._cond:
                self._running = None
                self._finished.append(current)
            current.done.set()

    def _stopped(self, why: str) -> None:
        """Stop taking sets; every set not started is answered with an error nobody reads (no sweep waits)."""
        with self._cond:
            self._stop.set()
            left, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        for queued in left:
            queued.error = RuntimeError(why)
            queued.done.set()

    def kill(self) -> None:
        """Stop now (the run was interrupted): no request is sent any more, and the workers are killed under the ones
        in flight."""
        self._stopped("the compile ahead was cancelled")
        self.pool.kill()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def close(self, also: Sequence[Worker] = ()) -> None:
        """The run is over: sets not started are dropped, the one in flight is waited for, the pool's workers closed
        together with `also` (the run's runners)."""
        self._stopped("the compile pool was closed")
        if self._thread is not None:
            self._thread.join()
        close_together([*also, *self.pool.workers])


def close_together(workers: Sequence[Worker]) -> None:
    """Close every live worker's pipe first, then wait for each: a worker exits when its pipe closes (its CUDA context
    torn down meanwhile), so seventeen of them stop at once instead of one after another. For workers no request is
    in flight on (a run's end); an interrupted run kills its workers and closes them one by one instead."""
    for w in workers:
        if w.process is not None and w.process.is_alive() and w.conn is not None:
            w.conn.close()
    for w in workers:
        w.close()


def compile_request(spec, config, dtypes, problems: dict, seed, profile_key: str) -> dict:
    """A compile worker's request (`runner.handle`, op "compile") for `config` at every specialisation of `problems`
    (roles "smallest" and "largest")."""
    return {
        "op": "compile",
        "spec": spec.name,
        "config": config.as_dict(),
        "dtypes": list(dtypes),
        "problems": problems,
        "seed": int(seed),
        "profile": profile_key,
    }


AHEAD_IDLE_S = 60.0  # compile_ahead's workers are stopped after this long with nothing to compile (a policy, not a
# fact of a device: each worker holds a CUDA context and its device memory, which a serving process wants back once
# its run-time sweeps are over; the next compile starts them again, a few seconds)

_ahead: dict[str, Any] = {"pool": None, "timer": None, "atexit": False}
_ahead_lock = threading.Lock()


def _close_ahead_pool() -> None:
    """Stop compile_ahead's workers (at their idle time, or at the process's exit)."""
    with _ahead_lock:
        pool, _ahead["pool"] = _ahead["pool"], None
        if _ahead["timer"] is not None:
            _ahead["timer"].cancel()
            _ahead["timer"] = None
    if pool is not None:
        pool.close()


def cuda_pool(env: dict[str, str], modules: Sequence[str], jobs: int, make=None) -> CompilePool:
    """A pool of `jobs` compile workers for this process's GPU (`make`, default `CompilePool`), the C modules they
    load built here first (`ready_for_workers`): how certify, `nbxcert warm` and the run-time sweep make theirs: workers
    that cross-compile for the GPU with no CUDA context (`nbxcert.crosspool`), or with NBXCERT_COMPILE_POOL=device
    workers compiling on the GPU."""
    from nbxcert import crosspool

    kind = crosspool.pool_kind()
    ready_for_workers()
    if kind == "cross":
        return crosspool.CrossCompilePool(env, list(modules), jobs, crosspool.device_target())
    return (make or CompilePool)(env, list(modules), jobs)


def ready_for_workers() -> None:
    """On a GPU, build here, once, the C modules every worker process loads before its first compile: Triton's CUDA
    utilities (compiled into the Triton cache by the driver nbxcert installs, in the background since this process
    chose its backend) and nbxcert's launcher (into nbxcert's cache). With an empty Triton cache, a certify run's
    runner and sixteen compile workers otherwise each ran the same C compiler build at once, on the cores their first
    compiles needed. Nothing off CUDA; a build's failure is raised here, in one line, as a worker would meet it."""
    from nbxcert.kernels.backends import select

    if select().name != "cuda":
        return
    from nbxcert.kernels.backends import launcher, triton_cuda

    launcher.build()
    driver = triton_cuda.installed()
    if driver is not None:
        driver.utils  # noqa: B018 - waits for the build the driver started (or raises its failure)


def _pool_finds(spec) -> bool:
    """Whether a compile worker finds `spec` by name: a spec of nbxcert's own library, registered as the one of its
    name. A user's spec lives in a module the workers have not imported: its candidates compile in the caller."""
    from nbxcert.errors import NbxcertError
    from nbxcert.kernels.spec import get_spec

    try:
        if get_spec(spec.name) is not spec:
            return False
    except NbxcertError:
        return False
    return all(str(getattr(getattr(k, "fn", k), "__module__", "")).startswith("nbxcert.") for k in spec.kernels)


def compile_ahead(spec, problem, dtypes, configs, profile_key: str, seed: int = 0, jobs: int | None = None) -> int:
    """Compile `configs` of a registered `spec` for one `problem` in a pool of worker processes, filling Triton's
    on-disk cache, so that the caller's own launches that follow load them instead of compiling one after the other:
    the run-time sweep (`nbxcert.serving.runtime_sweep`), and the GPU tests and benchmarks that run every kept
    candidate at real shapes. The pool is kept between calls and stopped after `AHEAD_IDLE_S` seconds unused (and at
    exit); `jobs`: its size when this call starts it (default: the CPU count). Calls from several threads take turns.

    Returns how many compiled. A config that fails to compile here is not reported: the caller's own launch of it
    meets the same failure and reports it where it belongs. Nothing happens off CUDA, for one config, or for a spec
    a worker cannot find by name (`_pool_finds`)."""
    import atexit

    from nbxcert.kernels.backends import select

    configs = list(configs)
    if select().name != "cuda" or len(configs) < 2 or not _pool_finds(spec):
        return 0
    same = {"smallest": dict(problem), "largest": dict(problem)}
    requests = [compile_request(spec, c, dtypes, same, seed, profile_key) for c in configs]
    with _ahead_lock:
        if not _ahead["atexit"]:
            atexit.register(_close_ahead_pool)
            _ahead["atexit"] = True
        if _ahead["timer"] is not None:
            _ahead["timer"].cancel()
        if _ahead["pool"] is None:
            _ahead["pool"] = cuda_pool({"NBXCERT_BACKEND": "cuda"}, [], jobs or os.cpu_count() or 1)
        replies = _ahead["pool"].compile_all(requests, COMPILE_TIMEOUT_S)
        timer = threading.Timer(AHEAD_IDLE_S, _close_ahead_pool)
        timer.daemon = True
        timer.start()
        _ahead["timer"] = timer
    return sum(1 for r in replies if r.get("status") == "compiled")
