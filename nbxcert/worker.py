"""The worker processes a sweep runs candidates in, so that a crash or a hang costs one candidate, not the sweep.

`Worker` is a child process (spawned, never forked: a CUDA context does not survive a fork) that imports the kernel
registry once and then answers requests over a pipe. A request that kills the process (an illegal address poisons its
CUDA context for good; a segfault) is answered `crash` and the worker is replaced; one that outlives its time limit is
answered `timeout`, the process is killed and replaced. The sweep goes on either way.

`compile_all` warms Triton's on-disk cache for many candidates at once in a pool of processes (Triton's compile is
CPU-bound), so the runner then finds every kernel compiled.

Not an input of a certificate's code digest (`fingerprint.ENGINE_MODULES`): what a request does is `runner`'s, which
is; this module starts, feeds and replaces the processes and labels a failed request's refusal (any exception is one),
and decides no verdict.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

# Every worker process is spawned, never forked (a CUDA context does not survive a fork): `Worker`'s and the census's.
SPAWN = multiprocessing.get_context("spawn")


class WorkerGone(Exception):
    """Internal: the worker process died (`crash`) or was killed for running too long (`timeout`)."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _classify(exc: BaseException) -> str:
    """The refusal reason of an exception raised while compiling or running a candidate."""
    name = type(exc).__name__
    module = type(exc).__module__
    from nbxcert.errors import CudaError, DeviceOutOfMemory

    if name == "OutOfResources" or "OutOfResources" in name:
        return "resources"
    if isinstance(exc, DeviceOutOfMemory):  # nbxcert's pool gave back what it kept and the device still had no room
        return "resources"
    if isinstance(exc, CudaError):
        # out of device memory: the problem with this candidate does not fit the device now (a refusal by resources;
        # the context stays usable), anything else from the driver is a crash
        from nbxcert.kernels.backends.cuda import CUDA_ERROR_OUT_OF_MEMORY

        return "resources" if getattr(exc, "status", None) == CUDA_ERROR_OUT_OF_MEMORY else "crash"
    if name in ("CompilationError", "CompileTimeAssertionFailure", "PTXASError") or module.startswith(
        "triton.compiler"
    ):
        return "compile"
    if isinstance(exc, RuntimeError) and "PassManager::run failed" in str(exc):
        return "compile"
    if name == "InterpreterError" and exc.__cause__ is not None:
        # the interpreter's equivalent of a compile error: a static assertion or a front-end type/shape error,
        # raised by Triton's language layer rather than by the kernel's run
        import traceback as tb

        frames = tb.extract_tb(exc.__cause__.__traceback__)
        last = frames[-1] if frames else None
        if last is not None and ("static_assert" in last.name or "/triton/language/" in last.filename):
            return "compile"
    return "crash"


def one_line(exc: BaseException) -> str:
    """The one line a refusal's reason gives of an exception: its type and its useful line."""
    # A Triton compile error's text is the kernel's source up to the failing line, then the message (seen with 3.6 on
    # an H200: a static assertion's refusal read "CompileTimeAssertionFailure: at 3:4:", its message lost): say the
    # message, and where.
    message = getattr(exc, "error_message", None)
    if isinstance(message, str) and message.strip():
        node = getattr(exc, "node", None)
        where = f" (at {node.lineno}:{node.col_offset})" if hasattr(node, "lineno") else ""
        return f"{type(exc).__name__}: {message.strip().splitlines()[0]}{where}"[:500]
    text = [x for x in str(exc).strip().splitlines() if x.strip()]
    first = text[0] if text else ""
    if first.startswith("at ") and len(text) > 1:
        first = text[-1].strip()
    for line in text:  # Triton puts the useful line of a compile error last
        if "error" in line.lower():
            first = line.strip()
    return f"{type(exc).__name__}: {first}"[:500]


_one_line = one_line  # the name tests/engine/test_sweep.py imports


# The last characters of a request's captured output that a failed reply carries (`NBXCERT_DEBUG=1` shows them).
CAPTURED_TAIL = 4000


def _flush_stdout() -> None:
    for stream in {id(s): s for s in (sys.stdout, sys.__stdout__) if s is not None}.values():
        stream.flush()


@contextlib.contextmanager
def captured_output():
    """Send what this process writes to its stdout (file descriptor 1: `print`, C code) into a temporary file for the
    duration; yields a list that holds the text once the block ends. Triton prints a whole kernel's PTX when ptxas
    crashes (seen on the H200: a flash-attention candidate, thousands of lines in a certify log); the refusal's
    reason already says what failed, so a worker keeps such output off the user's terminal."""
    text: list[str] = []
    _flush_stdout()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield text
        finally:
            _flush_stdout()
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            text.append(sink.read().decode("utf-8", "replace"))


def quiet_interpreter() -> None:
    """Silence the RuntimeWarnings numpy raises inside Triton's interpreter (`divide by zero encountered in divide`
    from triton/runtime/interpreter.py): it evaluates whole blocks as numpy arrays, lanes a mask leaves unwritten
    included, and warns of what they compute. They leaked into certify's output, two lines each, and say nothing the
    oracle's judgement of every written element does not."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


def _serve(conn, env: dict[str, str], modules: list[str]) -> None:
    """The worker's loop: set the environment, load kernels, answer requests until the pipe closes."""
    # Ctrl-C (or `timeout -s INT`) reaches the whole process group: the parent stops the sweep and closes its workers,
    # so a worker must not die on its own with a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet_interpreter()
    os.environ.update(env)
    from nbxcert.kernels.backends import select
    from nbxcert.kernels.spec import load_all

    select()
    load_all()
    import importlib

    for m in modules:
        importlib.import_module(m)
    from nbxcert import runner

    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        output: list[str] = []
        try:
            with captured_output() as output:
                reply = runner.handle(request)
        except BaseException as exc:  # noqa: BLE001 - every failure of a candidate is classified and reported
            printed = "".join(output)[-CAPTURED_TAIL:]
            detail = traceback.format_exc()
            if printed:
                detail += f"\nits output (last {CAPTURED_TAIL} characters):\n{printed}"
            reply = {"status": _classify(exc), "reason": one_line(exc), "traceback": detail}
            from nbxcert.errors import CudaError
            from nbxcert.kernels.backends import cuda

            if isinstance(exc, CudaError) and cuda.launch_error_poisons_context(exc):
                reply["worker_exits"] = True
                conn.send(reply)
                os._exit(3)  # the context is poisoned for good: the parent starts a fresh worker
        conn.send(reply)


def serve_cross_compiling(
    conn, env: dict[str, str], modules: list[str], target_variable: str, answer, recycle_after: int
) -> None:
    """A cross-compiling worker's loop (the census's, the bundle builder's): activate the cross backend for the target
    that the environment variable `target_variable` names (JSON), import `modules` and load the kernels, then send
    `answer(request, target)` for each request until the pipe closes; a request that raises is answered `crash` with
    its one line. After `recycle_after` requests the reply says `worker_exits` and the process exits: Triton keeps
    every kernel it compiled in memory, and the fresh worker the parent starts for the next request reads its disk
    cache."""
    os.environ.update(env)
    import importlib
    import json

    from nbxcert.kernels.backends import cross
    from nbxcert.kernels.spec import load_all

    target = cross.Target(**json.loads(os.environ[target_variable]))
    cross.activate(target)
    refused = None  # a module that does not import under the cross driver: every request answered with its line
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as exc:  # noqa: BLE001 - reported on every request, by the module's name
            refused = f"module {m} does not import in a cross-compiling worker: {one_line(exc)}"
            break
    if refused is None:
        load_all()
    for answered in range(1, 1 << 62):
        try:
            request = conn.recv()
        except EOFError:
            return
        try:
            reply = {"status": "crash", "reason": refused} if refused else answer(request, target)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, the worker goes on
            reply = {"status": "crash", "reason": one_line(exc)}
        if answered >= recycle_after:
            reply["worker_exits"] = True
        conn.send(reply)
        if reply.get("worker_exits"):
            conn.close()
            os._exit(0)


def _debug_trace(message: dict[str, Any], reply: dict[str, Any]) -> None:
    """With NBXCERT_DEBUG=1, a failed request's traceback (and its captured output) on stderr; the reply's reason is
    its one line either way."""
    if os.environ.get("NBXCERT_DEBUG") == "1" and reply.get("traceback"):
        what = f"{message.get('op')} {message.get('spec')} {message.get('config')}"
        print(f"[nbxcert] worker: {what} failed:\n{reply['traceback']}", file=sys.stderr, flush=True)


class Worker:
    """One child process answering requests; replaced when it dies or hangs."""

    def __init__(self, env: dict[str, str] | None = None, modules: list[str] | None = None):
        self.env = dict(env or {})
        self.modules = list(modules or [])
        self.process = None
        self.conn = None
        self.restarts = 0

    serve = staticmethod(_serve)  # what the child process runs: serve(conn, env, modules)

    def _start(self) -> None:
        parent, child = SPAWN.Pipe()
        self.process = SPAWN.Process(target=self.serve, args=(child, self.env, self.modules), daemon=True)
        # SIGINT blocked while the child is spawned: the child inherits the mask (it ignores Ctrl-C from birth, before
        # `_serve` says so), and a Ctrl-C meant for the parent waits until the handshake is over instead of cutting it
        # (the child then died on a half-read pipe, with a traceback)
        # (the mask is per thread: compile workers are started from the pool's threads, each blocking only itself)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        child.close()
        self.conn = parent

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request; return the reply, or raise `WorkerGone` (crash/timeout) after replacing the worker."""
        if self.process is None or not self.process.is_alive():
            self._start()
        self.conn.send(message)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                raise WorkerGone("timeout", f"no answer within {timeout_s:.0f} s (the worker was killed and replaced)")
            if self.conn.poll(min(left, 0.5)):
                try:
                    reply = self.conn.recv()
                except (EOFError, OSError):  # the process died mid-reply (ConnectionResetError is an OSError)
                    break
                if reply.get("worker_exits"):  # its CUDA context is poisoned: wait for it to go, start afresh next time
                    self._reap()
                _debug_trace(message, reply)
                return reply
            if not self.process.is_alive():
                if self.conn.poll(0):  # a reply sent just before the process exited on purpose
                    try:
                        reply = self.conn.recv()
                        self._reap()
                        return reply
                    except (EOFError, OSError):
                        pass
                break
        code = self.process.exitcode
        self._reap()
        raise WorkerGone("crash", f"the worker process died (exit code {code}); a new one was started")

    def _kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        self._reap()

    def _reap(self) -> None:
        if self.process is not None:
            self.process.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn = None, None
        self.restarts += 1

    def kill(self) -> None:
        """Stop the process at once, whatever it is doing (the sweep was interrupted); `close` tidies up after. Only
        the process is touched: a thread may still be inside `request` on this worker."""
        process = self.process
        if process is not None and process.is_alive():
            process.kill()

    def close(self) -> None:
        process, conn = self.process, self.conn
        if process is not None and process.is_alive() and conn is not None:
            conn.close()
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        self.process = None


def drive_all(
    workers: list[Worker], requests: list[dict[str, Any]], timeout_s: float, on_reply=None
) -> list[dict | None]:
    """Send every request to the first free worker (one thread per worker, one request at a time each); the replies
    in request order. A request that crashes or hangs its worker gets that refusal as its reply (the worker is
    replaced). `on_reply(count)` is called after each reply. When the caller is interrupted (Ctrl-C) the threads stop
    taking requests, and one whose worker is killed under it by the caller's cleanup leaves without a word."""
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    for i, r in enumerate(requests):
        todo.put((i, r))
    replies: list[dict | None] = [None] * len(requests)
    stop = threading.Event()
    done = [0]
    lock = threading.Lock()

    def drive(w: Worker):
        while not stop.is_set():
            try:
                i, r = todo.get_nowait()
            except queue.Empty:
                return
            try:
                try:
                    replies[i] = w.request(r, timeout_s)
                except WorkerGone as gone:
                    replies[i] = {"status": gone.status, "reason": gone.detail}
                with lock:
                    done[0] += 1
                    count = done[0]
                if on_reply is not None:  # a progress line, which the interrupted caller may be tearing down
                    on_reply(count)
            except Exception:
                if stop.is_set():  # the sweep was interrupted and this worker killed: the interrupt is the news
                    return
                raise

    threads = [threading.Thread(target=drive, args=(w,), daemon=True) for w in workers[: max(1, len(requests))]]
    try:  # an interrupt may land while the threads start, as well as while they run
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:
        # interrupted: no new requests, the workers stopped now (a candidate may run for minutes), and the threads
        # let go before the caller tidies the workers up
        stop.set()
        for w in workers:
            w.kill()
        for t in threads:
            if t.is_alive():  # one not started yet cannot be joined
                t.join(timeout=10)
        raise
    return replies


class CompilePool:
    """`jobs` worker processes that compile candidates at once, kept across keys (a worker's start costs seconds).

    Each compile also fills Triton's on-disk cache, which the runner's process then reads instead of compiling."""

    def __init__(self, env: dict[str, str], modules: list[str], jobs: int):
        self.workers = [Worker(env, modules) for _ in range(max(1, jobs))]

    def compile_all(self, requests: list[dict[str, Any]], timeout_s: float) -> list[dict]:
        """One reply per request (`op: compile`), in order. A compile that crashes or hangs its worker is that
        candidate's refusal, never the sweep's end."""
        replies = drive_all(self.workers, requests, timeout_s)
        return [
            r if r is not None else {"status": "crash", "reason": "no reply from the compile worker"} for r in replies
        ]

    def close(self) -> None:
        for w in self.workers:
            w.close()

    def kill(self) -> None:
        for w in self.workers:
            w.kill()
