"""Compiling the next key while this one is checked and timed.

A key's sweep compiles every kept candidate in the pool (CPU), then checks and times them in the one GPU runner; the
pool is idle while the GPU works and the GPU idle while the pool compiles. `certify` therefore hands `sweep_key` an
`AheadPool` in place of its `CompilePool`: once a key's compile has returned, the next key's compile requests are
submitted on a thread of their own, and that key's sweep finds its replies waiting (or waits only for what is left).

Nothing here changes what is judged: a key's sweep asks for exactly the compiles it would ask for without this, and a
submitted set is used only when it equals what the sweep asks for (else the sweep compiles as before). This module is
not an input of a certificate's code digest (`fingerprint.ENGINE_MODULES`): scheduling compiles earlier decides no
verdict.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from nbxcert.keys import LaunchKey, key_problems
from nbxcert.worker import CompilePool, Worker, WorkerGone, drive_all


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


class Pending:
    """Compile requests driven over the pool's workers on a thread of its own. The pool takes no other request until
    `result()` or `cancel()` has returned."""

    def __init__(self, pool: CompilePool, requests: list[dict[str, Any]], timeout_s: float):
        self.requests = requests
        self._pool = pool
        self._stop = threading.Event()
        self._replies: list[dict] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(timeout_s,), name="nbxcert-compile-ahead", daemon=True)
        self._thread.start()

    def _run(self, timeout_s: float) -> None:
        workers = [_Stoppable(w, self._stop) for w in self._pool.workers]
        try:
            replies = drive_all(workers, self.requests, timeout_s)
            no_reply = {"status": "crash", "reason": "no reply from the compile worker"}
            self._replies = [r if r is not None else no_reply for r in replies]
        except BaseException as exc:  # handed to whoever waits for the result, never printed by the thread
            self._error = exc

    def result(self) -> list[dict]:
        """One reply per request, in order, as `CompilePool.compile_all` gives them."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._replies is not None
        return self._replies

    def cancel(self) -> None:
        """Stop now (the run was interrupted): no request is sent any more, and the workers are killed under the ones
        in flight."""
        self._stop.set()
        self._pool.kill()
        self._thread.join(timeout=10)


class AheadPool:
    """What `sweep.sweep_key` is given as its compile pool in a certify run: `compile_all` answers from the compile
    submitted ahead when it asked for exactly these requests, then calls `after_compile()` (set by the caller for the
    key being swept: it submits the next key's compile). `submitted` counts the sets submitted ahead and `used` the
    ones a sweep took."""

    def __init__(self, pool: CompilePool, timeout_s: float):
        self.pool = pool
        self.timeout_s = timeout_s
        self.after_compile: Callable[[], None] | None = None
        self._pending: Pending | None = None
        self.submitted = 0
        self.used = 0

    def submit(self, requests: list[dict[str, Any]]) -> None:
        self._settle()
        self._pending = Pending(self.pool, requests, self.timeout_s)
        self.submitted += 1

    def compile_all(self, requests: list[dict[str, Any]], timeout_s: float) -> list[dict]:
        pending = self._pending
        replies = pending.result() if pending is not None else None  # interrupted here, `kill` still cancels it
        self._pending = None
        if pending is not None and pending.requests == requests:
            self.used += 1
        else:  # nothing submitted for this key, or another key's set (a key a concurrent run certified meanwhile)
            replies = self.pool.compile_all(requests, timeout_s)
        hook, self.after_compile = self.after_compile, None
        if hook is not None:
            hook()
        return replies

    def _settle(self) -> None:
        """Wait for a set submitted ahead that no sweep took (the pool takes one set at a time)."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def kill(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
        self.pool.kill()

    def close(self) -> None:
        self._settle()
        self.pool.close()
