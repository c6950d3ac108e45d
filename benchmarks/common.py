"""What the benchmarks share: their command line, the GPU they need, the torch peer in its own process (and the parts
of its script several peers have), the timing of each candidate, their tables and the results they write.

Imported by the scripts next to it (`python3 benchmarks/bench_X.py` puts this folder first on `sys.path`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any


def parse_args(doc: str, argv=None) -> argparse.Namespace:
    """--out, --warmup, --rep, --no-torch: the options every row-style benchmark takes."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--warmup", type=float, default=25.0, help="warm-up ms per timing (default 25)")
    parser.add_argument("--rep", type=float, default=100.0, help="timed ms per timing (default 100)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch peer")
    return parser.parse_args(argv)


def cuda_device(script: str):
    """(backend choice, GPU 0's `device_info`, its device profile, how it matched), after the backend's line; without
    the cuda backend, exit with a line naming `script` (a kernel family's benchmark measures a GPU)."""
    from nbxcert.kernels.backends import cuda, select

    choice = select()
    print(choice.line())
    if choice.name != "cuda":
        raise SystemExit(f"{script} needs the cuda backend (an NVIDIA GPU)")
    from nbxcert.profiles import match_nvidia

    info = cuda.device_info(0)
    profile, match = match_nvidia(info.compute_capability)
    return choice, info, profile, match


def device_line(info, profile, match: str) -> str:
    """The device, its compute capability and its profile, as a family benchmark prints them first."""
    cc = info.compute_capability
    return f"device: {info.name} (cc {cc[0]}.{cc[1]}), profile {profile.key} ({match})"


def progress_log(quiet: bool):
    """Where a benchmark's progress lines go: printed and flushed at once, or nowhere with --quiet."""
    return (lambda s: None) if quiet else (lambda s: print(s, flush=True))


def write_json(path: str, doc: dict) -> None:
    """`doc` as JSON at `path` (its directory made first), one space of indent."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def gpu_profile(script: str):
    """(cuda module, device profile, how it matched) of GPU 0, or None after one line saying why `script` cannot run
    (no GPU: the benchmark measures a GPU and nothing else)."""
    from nbxcert.kernels.backends import cuda, select
    from nbxcert.profiles import match_nvidia

    choice = select()
    if choice.name != "cuda":
        print(f"{script} needs a GPU: {choice.line()}", file=sys.stderr)
        return None
    profile, how = match_nvidia(cuda.device_info(0).compute_capability)
    return cuda, profile, how


# The head of the matmul and attention peer scripts (Python source run with `python3 -c` in their own process, torch
# imported there): `peer_times(fn, warmup_ms, rep_ms)` times `fn` as nbxcert's `do_bench_events` does (a 256 MiB L2
# flush queued before each start event, five calls to estimate, warm-up then ~rep_ms of repetitions) and returns
# (median ms, repetitions). The flush buffer is written once before any estimate: its first write, slow as any first
# launch, had made the first shape's estimate ~20x too long (cuBLAS at 4096^3 timed over 21-73 calls where nbxcert's
# side ran ~415).
# A torch peer's clock (CUDA events, and a spin of a given length so the GPU runs what follows back to back): the
# spin's rate is the slope between two lengths, so the launch's own latency cancels. Put before a peer script.
TORCH_CLOCK = r"""
import torch


class Clock:
    timed = True

    def __init__(self):
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        short, long = (self._timed(cycles) for cycles in (1 << 20, 1 << 22))
        self.cycles_per_us = ((1 << 22) - (1 << 20)) / max((long - short) * 1e3, 1e-3)

    def _timed(self, cycles):
        start, end = self.event(), self.event()
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def event(self):
        return torch.cuda.Event(enable_timing=True)

    def record(self, event):
        event.record()

    def elapsed(self, start, end):
        return start.elapsed_time(end)

    def sync(self):
        torch.cuda.synchronize()

    def delay(self, us):
        torch.cuda._sleep(max(1, int(us * self.cycles_per_us)))
"""


# A torch peer's attention: `sdpa(q, k, v, causal)` on [batch, heads, seq, dim] tensors, grouped-query (fewer K and V
# heads than q's) included: torch >= 2.5 takes `enable_gqa` (`GQA` says whether this one does), an older torch gets the
# K and V heads repeated to q's. Put after `import torch` and `import torch.nn.functional as F`.
TORCH_SDPA = r"""


def gqa_supported():
    q = torch.zeros(1, 2, 1, 8, device="cuda", dtype=torch.float16)
    try:
        F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
        return True
    except TypeError:  # torch < 2.5
        return False


GQA = gqa_supported()


def sdpa(q, k, v, causal):
    if GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)
"""


PEER_TIMER = r"""
import json, statistics, sys
import torch
flush = torch.empty(max(256 * 1024 * 1024, 2 * torch.cuda.get_device_properties(0).L2_cache_size) // 4,
                    dtype=torch.int32, device="cuda")
flush.zero_(); torch.cuda.synchronize()  # its first write here, not inside the first shape's estimate

def peer_times(fn, warmup_ms, rep_ms):
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5):
        flush.zero_(); fn()
    e.record(); e.synchronize()
    est = max(s.elapsed_time(e) / 5, 0.0005)
    n_warm, n_rep = max(1, int(warmup_ms / est)), min(max(1, int(rep_ms / est)), 10000)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for _ in range(n_warm):
        fn()
    for i in range(n_rep):
        flush.zero_(); starts[i].record(); fn(); ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(z) for a, z in zip(starts, ends)), n_rep
"""


# The head and the tail of a row-style benchmark's torch peer (`torch_peer` runs it): the cases, the warm-up and the
# repetition ms from argv and a fixed seed; then `out` (case -> median ms, filled by the lines between) printed as one
# JSON line with torch's version and the device.
PEER_HEAD = r"""
import json, sys
import torch
import triton.testing

cases = json.loads(sys.argv[1])
warmup, rep = float(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
out = {}
more = {}  # further fields of the peer's line (a script's own)
"""
PEER_TAIL = r"""
print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "ms": out, **more}))
"""


def torch_peer(script: str, cases, warmup: float, rep: float, extra: Sequence[str] = ()) -> dict[str, Any]:
    """torch's times from `script` (Python source reading argv: cases JSON, warm-up ms, rep ms, then `extra`; printing
    one JSON line) run in its own process (nbxcert never imports torch); {"error": ...} when that process fails (no
    torch, ...)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cases), str(warmup), str(rep), *extra],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return last_json(proc)


def last_json(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """The JSON object a child process printed on its last line; {"error": the last line of its stderr (or its exit
    status)} when it failed."""
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_results(
    path: str | None,
    device_name: str,
    profile,
    how: str,
    peer: dict,
    cases: list,
    copy_bw: float | None = None,
    targets: dict | None = None,
    extra: dict | None = None,
) -> None:
    """The JSON a row-style benchmark writes with --out: device, profile and how it matched, the copy bandwidth (when
    measured), torch's version (or its error), the targets (when set), a benchmark's own fields (`extra`), and every
    case."""
    if not path:
        return
    doc = {"device": device_name, "profile": profile.key, "profile_match": how}
    if copy_bw is not None:
        doc["copy_bandwidth_GBps"] = copy_bw / 1e9
    doc["torch"] = {k: v for k, v in peer.items() if k not in ("ms", "rounds_ms")}
    doc.update(extra or {})
    if targets is not None:
        doc["targets"] = targets
    doc["cases"] = cases
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def time_kept(spec, problem, profile, make_call, warmup: float, rep: float, dtypes=None) -> list:
    """Every config the profile's prune keeps for `problem`, timed with nbxcert's event timer (`make_call(config)`
    gives what one repetition runs): [(median ms, config)], fastest first. The configs are compiled ahead in a pool
    (for `dtypes`, by default the spec's first dtype tuple), so the loop below loads rather than compiles."""
    import statistics

    from nbxcert.kernels.backends.triton_cuda import do_bench_events
    from nbxcert.warm import compile_ahead

    kept = spec.pruned_for(problem, profile).kept
    compile_ahead(spec, problem, tuple(dtypes or spec.dtypes[0]), kept, profile.key)
    timings = []
    for config in kept:
        timings.append((statistics.median(do_bench_events(make_call(config), warmup, rep)), config))
    return sorted(timings, key=lambda t: t[0])


def check(spec, config, problem, dtypes, profile, inputs) -> str:
    """ "ok", or the first mismatch report of `config` launched on `inputs` against the float64 oracle."""
    from nbxcert.kernels.check import first_report, run_checked

    return first_report(run_checked(spec, config, problem, dtypes, profile, 0, "cuda:0", inputs=inputs)) or "ok"


def start(doc: str, script: str, peer_script: str, cases):
    """A row-style benchmark's opening: its options, the GPU it needs (without one: exit 2, after one line saying why)
    and the torch peer's times (skipped with --no-torch). Returns (args, cuda module, profile, how it matched, device
    name, peer)."""
    args = parse_args(doc)
    found = gpu_profile(script)
    if found is None:
        raise SystemExit(2)
    cuda, profile, how = found
    peer = {"ms": {}} if args.no_torch else torch_peer(peer_script, cases, args.warmup, args.rep)
    return args, cuda, profile, how, cuda.device_info(0).name, peer


def copy_bandwidth(cuda, copy_bytes: int = 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written) of a `copy_bytes` buffer, median of 20 copies."""
    import statistics

    src, dst = cuda.mem_alloc(copy_bytes, 0), cuda.mem_alloc(copy_bytes, 0)
    cuda.memset_d8(int(src.ptr), 1, copy_bytes)
    times = []
    for i in range(23):
        start, end = cuda.Event(0), cuda.Event(0)
        start.record(0)
        cuda.memcpy_dtod(int(dst.ptr), int(src.ptr), copy_bytes)
        end.record(0)
        end.synchronize()
        if i >= 3:
            times.append(cuda.Event.elapsed_ms(start, end))
    src.free()
    dst.free()
    return 2 * copy_bytes / (statistics.median(times) * 1e-3)


def bandwidth_fields(best_ms: float, best, moved: int, copy_bw: float | None, torch_ms: float | None) -> dict:
    """The fields a bandwidth-bound benchmark records for its best candidate: time, effective bandwidth (`moved`
    bytes read + written), its fraction of the copy bandwidth (when one was measured), and torch's time and speed
    beside it."""
    eff = moved / (best_ms * 1e-3)
    fields = {
        "bytes_moved": moved,
        "best_config": best.as_dict(),
        "best_label": best.label(),
        "best_ms": best_ms,
        "effective_GBps": eff / 1e9,
        "torch_ms": torch_ms,
        "torch_GBps": moved / (torch_ms * 1e-3) / 1e9 if torch_ms else None,
        "speedup_vs_torch": torch_ms / best_ms if torch_ms else None,
    }
    if copy_bw is not None:
        fields["fraction_of_copy"] = eff / copy_bw
    return fields


def call_all(launches):
    """What one timed repetition runs: the launches built once, in order, and nothing else."""
    return lambda: [launch() for launch in launches]


def candidate_times(timings) -> list[dict]:
    """The timed candidates as a case records them: each one's label and median ms, fastest first."""
    return [{"config": c.label(), "ms": ms} for ms, c in timings]


def print_case(what: str, timings, flush: bool = False) -> None:
    """The line a case prints once its candidates are timed: how many, and the fastest with its time."""
    best_ms, best = timings[0]
    print(f"{what}: {len(timings)} candidates, best {best.label()} {best_ms * 1e3:.1f} us", flush=flush)


def torch_cells(torch_ms: float | None, speedup: float | None, speed_width: int = 8) -> tuple[str, str]:
    """A table's torch columns: torch's time in us (9 wide) and the speed-up over it (`speed_width` wide, ending in
    'x'); '-' in both where torch did not run."""
    t_us = f"{torch_ms * 1e3:9.1f}" if torch_ms else f"{'-':>9s}"
    sp = f"{speedup:{speed_width - 1}.2f}x" if speedup else f"{'-':>{speed_width}s}"
    return t_us, sp


def print_header(header: str) -> None:
    """A table's header and a rule of its width under it."""
    print(header)
    print("-" * len(header))


def table_lines(header: str, results: list[dict], row, check: str = "check", rule: int | None = None) -> list[str]:
    """A benchmark's table: the header, a rule of `rule` dashes under it (default: the header's width), then `row(r)`
    for each result and, under one whose `check` is not "ok", the first line of its report."""
    failed = "SPOT CHECK FAILED" if check == "spot_check" else "CHECK FAILED"
    lines = [header, "-" * (len(header) if rule is None else rule)]
    for r in results:
        lines.append(row(r))
        if r[check] != "ok":
            lines.append(f"  {failed}: {r[check].splitlines()[0]}")
    return lines


def print_opening(device_name: str, profile, how: str, peer: dict, copy_bw: float | None = None) -> None:
    """The lines before a benchmark's table: the device and profile, the copy bandwidth when measured, and the
    torch peer's failure when it failed."""
    print()
    copy = f"; copy bandwidth {copy_bw / 1e9:.0f} GB/s (cuMemcpyDtoD)" if copy_bw is not None else ""
    print(f"device: {device_name} ({profile.key}, {how} match){copy}")
    if "error" in peer:
        print(f"torch peer failed: {peer['error']}")


def time_or_refuse(config, fn, warmup_ms: float, rep_ms: float, refused: list, log) -> list[float] | None:
    """`fn` (one launch of `config`) timed with nbxcert's event timer: each repetition's ms; or None, with a refusal
    (the error's type and first line) appended to `refused` and logged, when it fails to compile or launch. A
    poisoned CUDA context ends the benchmark (nothing after it could be timed)."""
    from nbxcert.kernels.backends import cuda, triton_cuda

    try:
        return triton_cuda.do_bench_events(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
    except Exception as e:  # noqa: BLE001 - recorded as a refusal with its reason, never scored
        refused.append({"config": config.label(), "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
        log(f"    refused {config.label()}: {refused[-1]['reason']}")
        if cuda.context_poisoned() is not None:
            raise
        return None


def time_each(configs, launch_of, warmup_ms: float, rep_ms: float, refused: list, log):
    """(config, each repetition's ms, when its timing began) for each of `configs` that ran, `launch_of(config)` its
    one launch timed with nbxcert's event timer; one that fails is appended to `refused` instead (`time_or_refuse`)."""
    for config in configs:
        t0 = time.time()
        times = time_or_refuse(config, lambda config=config: launch_of(config), warmup_ms, rep_ms, refused, log)
        if times is not None:
            yield config, times, t0


def timed_row(config, times: list[float]) -> dict:
    """What a benchmark records of a timed config: its label and kwargs, the median ms and the repetitions."""
    import statistics

    return {
        "config": config.label(),
        "kwargs": config.as_dict(),
        "median_ms": statistics.median(times),
        "reps": len(times),
    }


def finish(path: str, results: dict, all_met: bool) -> int:
    """A family benchmark's end: whether every target was met, recorded; the results written (`write_json`) and where
    said. Returns the exit status, 0 (a target missed is reported, not an error)."""
    results["all_targets_met"] = all_met
    write_json(path, results)
    print(f"\nresults written to {path}")
    return 0


def capture_launches(fn) -> list:
    """Call fn once and return every kernel launch it made through Triton's dispatch, as `KernelLaunch`es that replay
    them with `kernel[grid](*args, **kwargs)`: the same kernels, grids and arguments (tensors included), so the replay
    is a direct launch of the same config with the host work before it left out. Seen through nbxcert's own
    `launch.observing`: a call's launches in full, and plans replayed through Triton's dispatch (`launch.DIRECT`
    false); compiled and interpreted kernels alike."""
    from nbxcert.kernels import launch

    seen: list = []

    def note(kernel, grid, args, kwargs) -> None:
        seen.append(launch.KernelLaunch(kernel, grid, args, kwargs))

    with launch.observing(note):
        fn()
    if not seen:  # e.g. a served call replaying a plan through compiled runners: nothing passes Triton's `run`
        raise RuntimeError("captured no launch: the call made none through kernel[grid] (a launch plan replayed it?)")
    return seen


def replay(launches: list):
    """A function making the captured launches again, in order (one launch: a bare `kernel[grid](...)`)."""
    if len(launches) == 1:
        kernel, grid, args, kwargs = launches[0].kernel, launches[0].grid, launches[0].args, launches[0].kwargs
        return lambda: kernel[grid](*args, **kwargs)
    return lambda: [launch() for launch in launches]


def interleaved_us(paths: dict, calls, repeats: int, sync=None) -> dict[str, list[float]]:
    """Host microseconds per call of each path (name -> function), `repeats` rounds each timing every path once in
    turn (so a drift of the machine falls on every path alike), after min(200, calls) warm-up calls; `calls` is one
    count, or a count per name; `sync` (waiting for the device) closes each warm-up and each timed run."""
    sync = sync or (lambda: None)
    runs: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            n = calls[name] if isinstance(calls, dict) else calls
            for _ in range(min(200, n)):
                fn()
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            runs[name].append((time.perf_counter() - t0) / n * 1e6)
    return runs
