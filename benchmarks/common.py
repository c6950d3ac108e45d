"""What the row-style benchmarks share: their command line, the GPU they need, and the torch peer in its own process.

Imported by the scripts next to it (`python3 benchmarks/bench_X.py` puts this folder first on `sys.path`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any


def parse_args(doc: str, argv=None) -> argparse.Namespace:
    """--out, --warmup, --rep, --no-torch: the options every row-style benchmark takes."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--warmup", type=float, default=25.0, help="warm-up ms per timing (default 25)")
    parser.add_argument("--rep", type=float, default=100.0, help="timed ms per timing (default 100)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch peer")
    return parser.parse_args(argv)


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


def torch_peer(script: str, cases, warmup: float, rep: float) -> dict[str, Any]:
    """torch's times from `script` (Python source reading argv: cases JSON, warm-up ms, rep ms; printing one JSON line)
    run in its own process (nbxcert never imports torch); {"error": ...} when that process fails (no torch, ...)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cases), str(warmup), str(rep)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_results(path: str | None, device_name: str, profile, how: str, peer: dict, cases: list) -> None:
    """The JSON a row-style benchmark writes with --out: device, profile and how it matched, torch's version (or its
    error), and every case."""
    if not path:
        return
    doc = {
        "device": device_name,
        "profile": profile.key,
        "profile_match": how,
        "torch": {k: v for k, v in peer.items() if k != "ms"},
        "cases": cases,
    }
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
    """A row-style benchmark's opening: its options, the GPU it needs (None, after one line, without one) and the torch
    peer's times (skipped with --no-torch). Returns (args, cuda module, profile, how it matched, device name, peer)."""
    args = parse_args(doc)
    found = gpu_profile(script)
    if found is None:
        return None
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


def capture_launches(fn) -> list:
    """Call fn once and return every kernel launch it made, as `KernelLaunch`es that replay them with
    `kernel[grid](*args, **kwargs)`: the same kernels, grids and arguments (tensors included), so the replay is a
    direct launch of the same config with the host work before it left out. Records at Triton's `run`, which every
    `kernel[grid]` launcher calls (a served call's cached launchers too); compiled and interpreted kernels alike."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from nbxcert.kernels.launch import KernelLaunch

    seen: list = []
    originals = {cls: cls.__dict__["run"] for cls in (JITFunction, InterpretedFunction)}

    def recording(original):
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup:
                seen.append(KernelLaunch(self, grid, args, kwargs))
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    for cls, original in originals.items():
        cls.run = recording(original)
    try:
        fn()
    finally:
        for cls, original in originals.items():
            cls.run = original
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
