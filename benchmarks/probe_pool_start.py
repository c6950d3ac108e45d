"""Where a certify run's first compiles go: a cold pool of compile workers started at once, as `certify` starts its
own, against the same compiles on warm workers and on one worker started alone. A diagnosis of the first key's cost
(`bench_autotune.py`'s first matmul key: 12.9 s of compile wall for 49 candidates on 16 workers, where Triton compiles
one in about 0.5 s in a warm process), not a certificate: nothing is written but the report.

    python3 benchmarks/probe_pool_start.py --key "matmul[...]@v1" [--jobs N] [--out probe.json]

It prints one line (each phase's median round trip and its compile); --out writes the whole report as JSON.

Phases, each timed from this process (a request's round trip) and inside the worker (the compile's own `seconds`):
- `contexts`: N fresh processes at once, each choosing the backend and allocating one device buffer (the CUDA context
  every compile worker makes), its own seconds for that;
- `cold`: N fresh workers at once (`nbxcert.worker.Worker`, as a `CompilePool`'s), one compile request each, a
  different candidate each: its round trip, its compile, and the rest (the worker's start: spawn, imports, backend);
- `warm`: the same N workers, the next N candidates;
- `alone`: one fresh worker started with nothing else starting, one more candidate.
`--pool cross` probes cross-compiling workers (`nbxcert.crosspool`, NBXCERT_COMPILE_POOL=cross: no CUDA context of
their own; `contexts` is measured all the same, the cost they avoid).
An empty Triton cache of this run's own (a temporary directory) unless TRITON_CACHE_DIR is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import common

COMPILE_TIMEOUT_S = 600.0


def _context_child(env: dict[str, str], conn) -> None:
    """A fresh process: the backend chosen and one device buffer allocated (a CUDA context), its seconds sent back."""
    os.environ.update(env)
    t0 = time.perf_counter()
    from nbxcert.kernels.backends import select

    choice = select()
    if choice.name == "cuda":
        from nbxcert.kernels.backends import cuda

        cuda.mem_alloc(256, cuda.current_device())
    conn.send(time.perf_counter() - t0)
    conn.close()


def contexts(env: dict[str, str], n: int) -> list[float]:
    """Each of `n` processes' seconds to choose the backend and make its first device buffer, all started at once."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for _ in range(n):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_context_child, args=(env, child), daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    seconds = [float(conn.recv()) for conn in pipes]
    for p in procs:
        p.join(timeout=30)
    return seconds


def timed_requests(workers: list, requests: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Worker i answers request i, all at once (a thread each): each one's round trip, the compile's own seconds in the
    worker, and the rest of the round trip."""
    rows: list[dict[str, float] | None] = [None] * len(workers)
    failed: list[str] = []  # a thread's failure, said by the caller (an exception in a thread would only be printed)

    def ask(i: int) -> None:
        t0 = time.perf_counter()
        try:
            reply = workers[i].request(requests[i], COMPILE_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - reported below, in one line
            failed.append(f"candidate {requests[i]['config']}: {type(e).__name__}: {e}")
            return
        trip = time.perf_counter() - t0
        if reply.get("status") != "compiled":
            failed.append(f"candidate {requests[i]['config']} did not compile: {reply.get('reason', reply)}")
            return
        compile_s = float(reply.get("seconds", 0.0))
        rows[i] = {"round_trip_s": trip, "compile_s": compile_s, "rest_s": trip - compile_s}

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(
            f"probe_pool_start: {failed[0]}" + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else "")
        )
    return [r for r in rows if r is not None]


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Median and largest of each column, and the phase's wall (its slowest round trip)."""
    out: dict[str, Any] = {"n": len(rows)}
    for col in rows[0]:
        values = [r[col] for r in rows]
        out[col] = {"median": round(statistics.median(values), 4), "max": round(max(values), 4)}
    return out


def probe(key_text: str, jobs: int, seed: int = 0, pool: str = "device") -> dict[str, Any]:
    from nbxcert import crosspool
    from nbxcert.ahead import close_together, compile_requests, ready_for_workers
    from nbxcert.certify import COMPILE_WORKER_ENV
    from nbxcert.kernels.backends import select
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import parse_key
    from nbxcert.profiles import get_profile, match_nvidia
    from nbxcert.worker import Worker

    choice = select()
    env = {"NBXCERT_BACKEND": choice.name}
    if choice.name == "cuda":
        from nbxcert.kernels.backends import cuda

        profile = match_nvidia(cuda.device_info(0).compute_capability)[0]
    else:
        env["TRITON_INTERPRET"] = "1"
        profile = get_profile("cpu/interpreter")
    key = parse_key(key_text)
    requests = compile_requests(get_spec(key.kernel), key, profile, seed)
    if len(requests) < 2 * jobs + 1:
        raise SystemExit(
            f"probe_pool_start: {key_text} keeps {len(requests)} candidates; --jobs {jobs} needs {2 * jobs + 1} "
            "(a different one for every request)"
        )
    ready_for_workers()  # as certify does before its workers start
    t0 = time.perf_counter()
    context_s = contexts(env, jobs)
    contexts_wall = time.perf_counter() - t0
    if pool == "cross":  # as `crosspool.CrossCompilePool` makes them, for this GPU's target
        cross_env = crosspool.worker_env({**env, **COMPILE_WORKER_ENV}, crosspool.device_target())

        def make() -> Worker:
            return crosspool.CrossWorker(cross_env, [])
    else:

        def make() -> Worker:
            return Worker({**env, **COMPILE_WORKER_ENV})  # as certify's pool makes them

    workers = [make() for _ in range(jobs)]
    try:
        cold = timed_requests(workers, requests[:jobs])
        warm = timed_requests(workers, requests[jobs : 2 * jobs])
    finally:
        close_together(workers)
    alone = make()
    try:
        single = timed_requests([alone], requests[2 * jobs : 2 * jobs + 1])
    finally:
        close_together([alone])
    return {
        "key": key_text,
        "backend": choice.name,
        "pool": pool,
        "profile": profile.key,
        "jobs": jobs,
        "contexts": {"seconds": summary([{"s": s} for s in context_s])["s"], "wall_s": round(contexts_wall, 4)},
        "cold": summary(cold),
        "warm": summary(warm),
        "alone": single[0],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", required=True, help="a launch key's text: its kept candidates are compiled")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="workers started at once (default: every core)"
    )
    parser.add_argument("--out", help="write the report as JSON here")
    parser.add_argument(
        "--pool",
        choices=("device", "cross"),
        default=None,
        help="workers compiling on the GPU (device) or cross-compiling for it (cross); default NBXCERT_COMPILE_POOL's",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")
    from nbxcert.crosspool import pool_kind

    if "TRITON_CACHE_DIR" in os.environ:
        report = probe(args.key, args.jobs, pool=args.pool or pool_kind())
    else:  # a Triton cache of the probe's own, gone when it ends
        with tempfile.TemporaryDirectory(prefix="nbx-probe-cache-") as cache:
            os.environ["TRITON_CACHE_DIR"] = cache
            try:
                report = probe(args.key, args.jobs, pool=args.pool or pool_kind())
            finally:
                del os.environ["TRITON_CACHE_DIR"]
    if args.out:
        common.write_json(args.out, report)
    print(summary_line(report))
    return 0


def summary_line(report: dict[str, Any]) -> str:
    """The report in one line: each phase's median round trip and what of it the compile was."""
    cold, warm, alone = report["cold"], report["warm"], report["alone"]
    return (
        f"pool start ({report['jobs']} {report.get('pool', 'device')} workers, {report['backend']}): contexts made at "
        "once "
        f"{report['contexts']['seconds']['median']:.2f} s each (wall {report['contexts']['wall_s']:.2f} s); "
        f"cold workers {cold['round_trip_s']['median']:.2f} s a request (max {cold['round_trip_s']['max']:.2f}, "
        f"compile {cold['compile_s']['median']:.2f}); warm {warm['round_trip_s']['median']:.2f} s (compile "
        f"{warm['compile_s']['median']:.2f}); alone {alone['round_trip_s']:.2f} s (compile {alone['compile_s']:.2f})"
    )


if __name__ == "__main__":
    sys.exit(main())
