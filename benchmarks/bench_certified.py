"""The measurements of shipped certificates (how good their winners are, what serving them saves at a cold start, what
a served launch costs the host, how fast they are made), each a ratio measured side by side in one run.

    python3 benchmarks/bench_certified.py quality --workload tinyllama-1.1b --dir certificates --out quality.json
    python3 benchmarks/bench_certified.py coldstart --workload tinyllama-1.1b --dir certificates --out cold.json
    python3 benchmarks/bench_certified.py serving --out serving.json
    python3 benchmarks/bench_certified.py throughput LOG [LOG ...] --workload tinyllama-1.1b --out throughput.json
    python3 benchmarks/bench_certified.py winners --dir certificates --profile hopper
    python3 benchmarks/bench_certified.py report quality.shard0.json quality.shard1.json

quality     For every key of the workload certified in --dir for this device's profile, at the key's timing problem
            (its bucket's largest member): the certified winner's time against (a) the kernel's untuned default
            config, (b) the best of a fresh exhaustive re-sweep of every candidate the certificate found correct (one
            key in --resweep-every; 0: none), and (c) for matmul and attention keys the peer (cuBLAS through
            torch.matmul, SDPA) in its own process. All our timings use the sweep's own full budget
            (`nbxcert.runner.time_launch`: CUDA events, L2 flushed). Ratios are other / winner (above 1: the winner
            is faster); reported as median, the worst 5% and the worst keys by name. --stop-after S measures no key
            after S seconds and still times the peer over those measured; --start N goes on from there.
coldstart   A fresh process runs the workload's launch sequence once (every launch at its real shape, through the
            serving path `nbxcert.serving.config_for`), from process start to the last result: with the certificates
            of --dir, the same with the workload's winners compiled in a pool inside that process (--warm
            background: `nbxcert.warm.start`, the launches going on meanwhile; block: `nbxcert.warm.warm` before the
            first launch), the certified run again with the Triton cache the first filled (a restart), then
            with an empty certificate directory (a run-time sweep of every key), each but the restart with an empty
            Triton cache of its own. With --autotune, also triton.autotune's procedure on the same
            candidates (each key's kept candidates compiled in turn and timed by Triton's benchmarker with the
            autotuner's defaults, no output checked; the fastest launched). Each launch's float tensors are zeros at
            their real shapes (`kernels.inputs.shape_only(zeroed=True)`), the same in every run. The sweep and
            the autotuned run are given --sweep-limit seconds; a run cut there reports how many launches it reached
            and when, and the speed-up over that common prefix of the sequence (each run records when each of its
            launches was queued) beside the lower bound on the whole.
serving     The per-launch host cost of the served path (the user-facing `rmsnorm` on a decode-sized row, its key
            certified) against `kernel[grid](...)` of the same config with its arguments built once ("raw", the
            baseline: what a caller of Triton pays) and against `spec.launch` (the launch built per call), averaged
            over --calls launches, the paths interleaved over --repeats rounds; --profile adds cProfile's top
            functions of served and raw.
winners     Read from the certificates alone (no device): per kernel, the certified winner's time against the untuned
            default's, both as the sweep measured them in the same run (its full budget).
report      The quality measurement over a workload's shards (`quality --out` files): the distributions over every key,
            the peer's by kernel, the default's per kernel, the winner's time now against its certified time.
throughput  From `nbxcert certify` logs (one line per key): keys certified per minute and the share of time in
            compile, oracle (inputs + float64 reference + judges), checks and timing.

nbxcert never imports torch; the peer runs in a subprocess that does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.monotonic()  # quality --stop-after counts from here
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402


# --- shared ---------------------------------------------------------------------------------------------------------
def _device():
    """(backend choice, profile) of this process."""
    from nbxcert.certify import resolve_profile
    from nbxcert.kernels.backends import select

    choice = select()
    profile, _how = resolve_profile("interpreter" if choice.name == "interpreter" else _profile_name())
    return choice, profile


def _profile_name() -> str:
    from nbxcert.kernels.backends import cuda
    from nbxcert.profiles import match_nvidia

    profile, _how = match_nvidia(cuda.device_info(0).compute_capability)
    return profile.name


def _time_us(spec, config, inputs, profile, interpreted: bool) -> float:
    """Median µs of a launch: the sweep's full-budget event timing on a GPU; one launch's CPU time under the
    interpreter (that mode only exercises this script; its figures are not GPU figures)."""
    if interpreted:
        t0 = time.perf_counter()
        spec.launch(config, inputs)
        return (time.perf_counter() - t0) * 1e6
    from nbxcert.runner import time_launch

    return time_launch(spec, config, inputs, profile)["median_us"]


def percentile(xs: list[float], q: float) -> float:
    """The `q` quantile (0..1) of sorted `xs`: the nearest rank, no interpolation."""
    return xs[round(q * (len(xs) - 1))]


def distribution(rows: list[dict], field: str, worst: int = 5) -> dict:
    """Median, the 5th percentile (the worst 5%: ratios below it) and the worst keys of `field` over `rows`."""
    values = sorted((r[field], r["key"]) for r in rows if r.get(field) is not None)
    if not values:
        return {"n": 0}
    xs = [v for v, _ in values]
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p5": percentile(xs, 0.05),
        "min": xs[0],
        "worst": [{"key": k, "ratio": v} for v, k in values[:worst]],
    }


def _workload_keys(workload: str, profile):
    from nbxcert.workload import load_workload, workload_keys

    return workload_keys(load_workload(workload), profile)


def _entries(directory: Path, profile_key: str) -> dict[str, dict]:
    from nbxcert import certificates

    found: dict[str, dict] = {}
    for path in certificates.iter_files(directory, profile_key):
        found.update(certificates.load_file(path).entries)
    return found


# --- quality ----------------------------------------------------------------------------------------------------------
PEER_SCRIPT = r"""
import json, sys
import torch, triton
cases = json.loads(sys.argv[1])
out, errors = {}, {}
for c in cases:
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[c["dtype"]]
    if c["kind"] == "matmul":
        a = torch.randn(c["M"], c["K"], device="cuda", dtype=dt)
        w = torch.randn(c["N"], c["K"], device="cuda", dtype=dt)
        fn = lambda: torch.matmul(a, w.t())
    else:
        b, h, hk, d, lq, lk = c["batch"], c["heads"], c["kv_heads"], c["head_dim"], c["q_len"], c["kv_len"]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        q = torch.randn(b, h, lq, d, device="cuda", dtype=dt)
        k = torch.randn(b, hk, lk, d, device="cuda", dtype=dt)
        v = torch.randn(b, hk, lk, d, device="cuda", dtype=dt)
        if c["causal"] and lq != lk:
            # nbxcert's causal mask is bottom-right aligned (a prefill continuing a cache); SDPA's is_causal is
            # top-left, which masks more keys when q_len < kv_len: the lower-right bias, on heads repeated before
            # timing (the bias takes no grouped-query mode; prefill is bound by its products, not by reading K, V)
            from torch.nn.attention.bias import causal_lower_right
            bias = causal_lower_right(lq, lk)
            k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
            fn = lambda: sdpa(q, k, v, attn_mask=bias)
        else:  # the cache at its own kv_heads, read through SDPA's grouped-query mode
            fn = lambda: sdpa(q, k, v, is_causal=bool(c["causal"]), enable_gqa=hk != h)
    try:
        out[c["key"]] = triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median") * 1e3
    except Exception as e:  # recorded by key and reported; that key has no peer figure
        errors[c["key"]] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
print(json.dumps({"torch": torch.__version__, "us": out, "errors": errors}))
"""


def _peer_case(key, problem: dict) -> dict | None:
    """The peer's shape for a matmul or attention key (None for the other kernels)."""
    dtype = key.dtypes[0]
    if key.kernel == "matmul" and problem.get("trans_b") == 1 and problem.get("trans_a") == 0:
        return {"key": key.text(), "kind": "matmul", "dtype": dtype, **{d: problem[d] for d in ("M", "N", "K")}}
    if key.kernel == "flash_attention":
        fields = ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal")
        return {"key": key.text(), "kind": "attention", "dtype": dtype, **{f: problem[f] for f in fields}}
    if key.kernel == "decode_attention":
        fields = ("batch", "heads", "kv_heads", "kv_len", "head_dim")
        return {
            "key": key.text(),
            "kind": "attention",
            "dtype": dtype,
            "q_len": 1,
            "causal": 0,
            **{f: problem[f] for f in fields},
        }
    return None


def _shard(text: str) -> tuple[int, int]:
    """ "i/n" -> (i, n), read as `certify --shard` reads it (`nbxcert.certify.parse_shard`); a bad one ends the
    script with that message."""
    from nbxcert.certify import parse_shard
    from nbxcert.errors import UsageError

    try:
        return parse_shard(text) or (0, 1)
    except UsageError as e:
        raise SystemExit(e.message) from None


def _correct_configs(spec, entry: dict, problems: dict, profile) -> list:
    """The candidates the certificate found correct: kept by the prune at both ends of the bucket, not refused."""
    from nbxcert.kernels.spec import Config

    kept = spec.prune(spec.candidates, problems["timing"], profile).kept
    kept_small = set(spec.prune(spec.candidates, problems["smallest"], profile).kept)
    refused = {Config.from_dict(r["config"]) for r in entry.get("refused", [])}
    return [c for c in kept if c in kept_small and c not in refused]


def quality(args) -> dict:
    from nbxcert.kernels.spec import Config, get_spec
    from nbxcert.keys import parse_key

    choice, profile = _device()
    interpreted = choice.name == "interpreter"
    entries = _entries(Path(args.dir), profile.key)
    keys = [k for k in _workload_keys(args.workload, profile) if k.text() in entries]
    if args.kernels:  # e.g. the attention keys alone, measured again against a corrected peer
        wanted = set(args.kernels.split(","))
        unknown = wanted - {k.kernel for k in keys}
        if unknown:
            raise SystemExit(f"--kernels {','.join(sorted(unknown))}: no certified key of {args.workload} is of it")
        keys = [k for k in keys if k.kernel in wanted]
    if args.limit:
        keys = keys[: args.limit]
    index, count = _shard(args.shard)
    keys = keys[index::count][args.start :]  # --start: a shard's keys after those an earlier, stopped run measured
    # one key in N of this shard (chosen before sharding, every re-swept key fell in shard 0 when N and the shard
    # count share a factor, and that shard took twice as long)
    chosen = {k.text() for i, k in enumerate(keys) if args.resweep_every and i % args.resweep_every == 0}
    # the candidates a re-swept key times: those its certificate found correct
    resweep = {}
    for key in (k for k in keys if k.text() in chosen):
        entry = entries[key.text()]
        resweep[key.text()] = _correct_configs(get_spec(key.kernel), entry, entry["certified_problems"], profile)
    if not interpreted:  # every config of every key compiled at once in a pool, not one by one at its first launch
        from nbxcert.warm import compile_all, compile_request

        t0 = time.perf_counter()
        requests = []
        for key in keys:
            entry, spec = entries[key.text()], get_spec(key.kernel)
            configs = [Config.from_dict(entry["winner"]["config"])]
            if entry.get("default") is not None:
                configs.append(spec.default)
            timing = entry["certified_problems"]["timing"]
            same = {"smallest": timing, "largest": timing}
            requests += [
                compile_request(spec, c, key.dtypes, same, entry["seed"], profile.key)
                for c in dict.fromkeys(configs + resweep.get(key.text(), []))
            ]
        done = sum(r.get("status") == "compiled" for r in compile_all(requests, args.jobs))
        print(
            f"[quality] compiled {done} of {len(requests)} configs ahead in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
    rows, peer_cases = [], []
    interrupted = stopped = False
    try:  # a time limit's SIGINT ends the loop, not the report: the keys measured so far are kept
        for i, key in enumerate(keys):
            if args.stop_after is not None and time.monotonic() - STARTED > args.stop_after:
                # stopped before an outer time limit would stop it: the peer is still timed over the keys measured
                stopped = True
                print(
                    f"[quality] stopped after {args.stop_after:g} s: {len(rows)} of {len(keys)} keys measured; "
                    f"the rest: --start {args.start + len(rows)}",
                    file=sys.stderr,
                )
                break
            entry = entries[key.text()]
            spec = get_spec(key.kernel)
            problems = entry["certified_problems"]
            inputs = spec.make_inputs(problems["timing"], tuple(key.dtypes), int(entry["seed"]), choice.device)
            winner = Config.from_dict(entry["winner"]["config"])
            row = {"key": key.text(), "kernel": key.kernel, "winner": winner.label()}
            row["winner_us"] = _time_us(spec, winner, inputs, profile, interpreted)
            row["certified_us"] = entry["winner"]["timing"]["median_us"]
            if entry.get("default") is not None:
                row["default_us"] = _time_us(spec, spec.default, inputs, profile, interpreted)
                row["x_default"] = row["default_us"] / row["winner_us"]
            if key.text() in resweep:
                times = {c.label(): _time_us(spec, c, inputs, profile, interpreted) for c in resweep[key.text()]}
                best = min(times, key=times.get)
                row.update(resweep_best=best, resweep_best_us=times[best], resweep_candidates=len(times))
                row["x_resweep"] = times[best] / row["winner_us"]
            rows.append(row)
            case = _peer_case(parse_key(key.text()), problems["timing"])
            if case is not None:
                peer_cases.append(case)
            print(
                f"[quality] {i + 1}/{len(keys)} {key.text()}: winner {row['winner_us']:.1f} us"
                + (f", x default {row['x_default']:.2f}" if "x_default" in row else ""),
                file=sys.stderr,
            )
    except KeyboardInterrupt:
        interrupted = True
        print(f"[quality] interrupted: {len(rows)} of {len(keys)} keys measured", file=sys.stderr)

    peer = {}
    if peer_cases and not args.no_peer and not interpreted and not interrupted:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", PEER_SCRIPT, json.dumps(peer_cases)],
                capture_output=True,
                text=True,
                timeout=3600,
            )
        except KeyboardInterrupt:  # the time limit came during the peer's run: our figures are still reported
            proc = subprocess.CompletedProcess([], 130, "", "the peer's run was interrupted by the time limit")
        if proc.returncode != 0:
            peer = {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
        else:
            peer = json.loads(proc.stdout.strip().splitlines()[-1])
            for row in rows:
                if row["key"] in peer["errors"]:
                    row["peer_error"] = peer["errors"][row["key"]]
                if row["key"] in peer["us"]:
                    row["peer_us"] = peer["us"][row["key"]]
                    row["x_peer"] = row["peer_us"] / row["winner_us"]
    return {
        "workload": args.workload,
        "profile": profile.key,
        "shard": args.shard,
        "keys_in_workload": len(_workload_keys(args.workload, profile)),
        "keys_measured": len(rows),
        "interrupted": interrupted,
        "start": args.start,
        "stopped": stopped,
        "x_default": distribution(rows, "x_default"),
        "x_resweep": distribution(rows, "x_resweep"),
        "x_peer": distribution(rows, "x_peer"),
        "peer": {k: v for k, v in peer.items() if k not in ("us", "errors")} | {"errors": len(peer.get("errors", {}))},
        "rows": rows,
    }


# --- cold start -------------------------------------------------------------------------------------------------------
COLD_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
a = json.loads(sys.argv[1])
if a.get("cprofile_out"):  # a diagnosis of where the run's time goes (cProfile's overhead slows it)
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
if a.get("no_torch"):  # an application of nbxcert alone: Triton 3.6's specializer would import torch where it can
    class _RefuseTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is hidden in this run (--no-torch)")
            return None
    sys.meta_path.insert(0, _RefuseTorch())
from nbxcert import serving
from nbxcert.kernels.backends import select
from nbxcert.kernels.spec import get_spec
from nbxcert.profiles import get_profile
from nbxcert.workload import launches, load_workload
marks = {"imports": time.perf_counter() - t_start}  # where the time before the first launch goes, from the start
choice = select()
marks["backend"] = time.perf_counter() - t_start
profile = get_profile(a["profile"])
warm_s = 0.0
if a["warm"] == "block":  # compile every certified winner of the workload at once, in a pool, before the first launch
    from nbxcert.warm import warm
    from nbxcert.workload import workload_keys
    t0 = time.perf_counter()
    warm(profile.key, workload_keys(load_workload(a["workload"]), profile), [a["dir"]])
    warm_s = time.perf_counter() - t0
serving.configure(dirs=[a["dir"]], certified_only=a["certified_only"])
serving.state()  # the certificate index read (built from the JSON into this run's empty NBXCERT_CACHE_DIR)
marks["certificates"] = time.perf_counter() - t_start
warming = None
if a["warm"] == "background":  # the same pool in the background (nbxcert.warm.start), the launches going on meanwhile
    from nbxcert.warm import start
    from nbxcert.workload import workload_keys
    t0 = time.perf_counter()
    warming = start(profile.key, workload_keys(load_workload(a["workload"]), profile))
    warm_s = time.perf_counter() - t0  # the index read and the thread started; the pool's own time is reported below
if a["autotune"]:
    # triton.autotune's procedure on the same candidates: at a key's first launch every candidate the profile keeps
    # is compiled in turn (on its first run) and timed by Triton's benchmarker with the autotuner's defaults
    # (do_bench, warm-up 25 ms, 100 ms, the median), no output checked; the fastest runs, and the key's later
    # launches reuse it. A candidate that fails is skipped and counted, as the autotuner skips OutOfResources.
    import statistics
    if choice.name == "cuda":
        import triton
        bench = triton.runtime.driver.active.get_benchmarker()
    else:  # the interpreter has no events: the wall clock over a few runs (a test of the procedure, not a figure)
        def bench(fn, quantiles=None, warmup=None, rep=None):
            times = []
            for _ in range(3):
                t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1e3)
            return [statistics.median(times)]
    tuned, skipped = {}, []
from nbxcert.kernels.inputs import shape_only
made = 0.0
n = 0
carried, swept_here, hits = False, set(), []  # launches served from an earlier part's run-time cache (--from-launch)
elapsed = []  # seconds from the process's start to the end of each launch (queued), for the common-prefix ratio
for at, launch in enumerate(launches(load_workload(a["workload"]), profile)):
    if at < a.get("from_launch", 0):  # an earlier part of the sequence ran them (--from-launch, --cache-dir)
        continue
    if a["max_launches"] and n >= a["max_launches"]:
        break
    if a.get("stop_after") and time.perf_counter() - t_start > a["stop_after"]:  # a part ends between two launches
        break
    spec = get_spec(launch.kernel)
    t0 = time.perf_counter()
    with shape_only(zeroed=True):  # the launch's tensors at their real shapes, zeros set on the device: every run's
        # inputs cost the same (random draws were half the certified run), and a run-time sweep's consensus holds
        inputs = spec.make_inputs(launch.problem, launch.dtypes, 0, choice.device)
    made += time.perf_counter() - t0
    if n == 0:
        marks["first_inputs"] = time.perf_counter() - t_start
    if a["autotune"]:
        key = (launch.kernel, tuple(sorted(launch.problem.items())), tuple(launch.dtypes))
        cfg = tuned.get(key)
        if cfg is None:
            times = {}
            for c in spec.pruned_for(launch.problem, profile).kept:
                try:
                    times[c] = bench(lambda c=c: spec.launch(c, inputs), quantiles=(0.5, 0.2, 0.8), warmup=25,
                                     rep=100)[0]
                except Exception as e:
                    skipped.append(f"{launch.kernel} {c.label()}: {type(e).__name__}")
            cfg = tuned[key] = min(times, key=times.get)
    else:
        if a.get("from_launch"):  # a later part: is this key's winner in the run-time cache an earlier part left?
            from nbxcert.keys import make_key
            text = make_key(spec, launch.problem, launch.dtypes, profile).text()
            carried = text in serving.state().runtime_cache and text not in swept_here
            swept_here.add(text)
        cfg = serving.config_for(spec, launch.problem, launch.dtypes, serving.RuntimeLaunch(
            run=lambda c, inputs=inputs, spec=spec: spec.launch(c, inputs),
            outputs=[inputs.tensors[o] for o in inputs.outputs],
            restore=[inputs.tensors[o] for o in inputs.inplace]))
    if n == 0:
        marks["first_config"] = time.perf_counter() - t_start  # then the launch: the first kernel's compile, at least
    spec.launch(cfg, inputs)
    n += 1
    elapsed.append(round(time.perf_counter() - t_start, 4))
    if carried:  # its seconds, inputs included: the whole run's process had this winner loaded, here it may compile
        hits.append([at, round(elapsed[-1] - (t0 - t_start), 4)])
    print(f"@ {n} {elapsed[-1]}", file=sys.stderr, flush=True)  # read back when the run is cut at its limit
if choice.name == "cuda":
    from nbxcert.kernels.backends import cuda
    cuda.synchronize()
result = {"launches": n, "next_launch": a.get("from_launch", 0) + n, "inputs_s": made, "warm_s": warm_s,
          "in_process_s": time.perf_counter() - t_start,
          "torch_imported": "torch" in sys.modules,
          "startup_s": {k: round(v, 4) for k, v in marks.items()}, "elapsed": elapsed, "carried_hits": hits}
if warming is not None:  # whether the pool had finished by the last launch (the run does not wait for it: the
    # sequence's end is the figure; workers still compiling are stopped at the process's exit)
    result["background_done"] = warming.done()
    if result["background_done"]:
        report = warming.wait()
        result.update(background_winners=report.winners, background_compiled=report.compiled,
                      background_failed=len(report.failed), background_s=round(report.seconds, 3))
if a["autotune"]:
    result.update(keys_tuned=len(tuned), candidates_skipped=len(skipped), skipped_first=skipped[:5])
from nbxcert.kernels.backends import binaries
from nbxcert.kernels.spec import load_all
compiled = 0  # kernels Triton compiled (or loaded from its cache) in this process, over every spec's JIT functions
for s in load_all().values():
    for k in s.kernels:
        compiled += sum(len(c[0]) for c in getattr(k, "device_caches", {}).values())
result.update(triton_compiled=compiled, bundle_loaded=binaries.loaded_count())
if a.get("cprofile_out"):
    import io, pstats
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    with open(a["cprofile_out"], "w") as f:
        f.write(text.getvalue())
print(json.dumps(result))
"""


def _cold_run(*args, **kwargs) -> dict:
    """`_cold_run_in` with the run's own caches in a directory of their own, removed when it ends."""
    with tempfile.TemporaryDirectory(prefix="nbx-cold-") as scratch:
        return _cold_run_in(scratch, *args, **kwargs)


def _cold_run_in(
    scratch: str,
    workload: str,
    profile,
    directory: str,
    certified_only: bool,
    limit_s: float,
    warm: str = "",
    gpu: str = "",
    autotune: bool = False,
    max_launches: int = 0,
    triton_cache: str = "",
    bundle: str = "",
    no_torch: bool = False,
    from_launch: int = 0,
    cache_dir: str = "",
    stop_after: float = 0.0,
    sweep_jobs: int = 0,
    cprofile_out: str = "",
    index_built: bool = False,
) -> dict:
    """One fresh process running the workload's launches; `triton_cache`: this Triton cache directory (default: an
    empty one of its own); `bundle`: serve the winners it holds compiled (`NBXCERT_BUNDLE_PATH`), with nbxcert's
    launcher already built (as `nbxcert bundle` leaves it) and nothing else of nbxcert's cache; `index_built`: the
    certificate index too, built before the process starts by `nbxcert index build` (as the README has a machine do
    once for cold starts), not timed."""
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": triton_cache or tempfile.mkdtemp(prefix="triton-", dir=scratch),
        "NBXCERT_CACHE_DIR": tempfile.mkdtemp(prefix="nbxcert-", dir=scratch),
        "NBXCERT_UNCERTIFIED": "sweep",
    }
    if cache_dir:  # one part of a sequence measured in parts: the caches the whole run's one process would have kept
        env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
        env["NBXCERT_CACHE_DIR"] = os.path.join(cache_dir, "nbxcert")
    env.pop("NBXCERT_BUNDLE_PATH", None)
    env.pop("NBXCERT_SWEEP_JOBS", None)
    if sweep_jobs:  # a run-time sweep's candidates compiled in this many workers first
        env["NBXCERT_SWEEP_JOBS"] = str(sweep_jobs)
    if bundle:
        from nbxcert.kernels.backends import launcher

        built = launcher.build()  # built once per machine, not part of a start: copied into the run's cache
        copy = Path(env["NBXCERT_CACHE_DIR"]) / built.relative_to(launcher.cache_root())
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, copy)
        env["NBXCERT_BUNDLE_PATH"] = bundle
    if index_built:
        built = subprocess.run(
            [sys.executable, "-m", "nbxcert", "index", "build", directory, "--cache", env["NBXCERT_CACHE_DIR"]],
            capture_output=True,
            text=True,
            env=env,
        )
        if built.returncode != 0:
            raise SystemExit(f"bench_certified: nbxcert index build {directory} failed: {built.stderr.strip()[-500:]}")
    if gpu:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    arg = {"workload": workload, "profile": profile.key, "dir": directory, "certified_only": certified_only}
    arg["bundle"] = bool(bundle)
    arg["no_torch"] = no_torch
    arg["from_launch"] = from_launch
    arg["stop_after"] = stop_after
    arg.update(warm=warm, autotune=autotune, max_launches=max_launches, cprofile_out=cprofile_out)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", COLD_CHILD, json.dumps(arg)],
            capture_output=True,
            text=True,
            env=env,
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired as cut:
        # how far it got: its last "@ launches seconds" line (the output so far comes back as bytes)
        err = cut.stderr.decode(errors="replace") if isinstance(cut.stderr, bytes) else (cut.stderr or "")
        marks = [line.split() for line in err.splitlines() if line.startswith("@ ")]
        done = {"launches": int(marks[-1][1]), "elapsed_s": float(marks[-1][2])} if marks else {"launches": 0}
        return {"wall_s": time.perf_counter() - t0, "cut_at_limit": True, "reached": done}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"wall_s": wall, "error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    shown = {"gpu": gpu} if gpu else {}
    if index_built:
        shown["index_built"] = True
    return {"wall_s": wall, **json.loads(proc.stdout.strip().splitlines()[-1]), **shown}


def prefix_ratio(fast: dict, slow: dict) -> dict | None:
    """`slow`'s time to the last launch it reached over `fast`'s to the same launch, both from their process's start:
    the speed-up over the part of the sequence both ran (all of it when neither was cut)."""
    if "elapsed" not in fast:
        return None
    if slow.get("cut_at_limit"):
        reached = slow.get("reached", {})
        n, slow_s = reached.get("launches", 0), reached.get("elapsed_s")
    else:
        n, slow_s = slow.get("launches", 0), (slow.get("elapsed") or [None])[-1]
    if not n or slow_s is None or n > len(fast["elapsed"]):
        return None
    return {
        "launches": n,
        "of": len(fast["elapsed"]),
        "slow_s": slow_s,
        "fast_s": fast["elapsed"][n - 1],
        "ratio": slow_s / fast["elapsed"][n - 1],
    }


def coldstart(args) -> dict:
    """`_coldstart` with its shared directories (the empty certificate directory, the Triton cache of the certified run
    and its restart) in one of their own, removed when it ends."""
    with tempfile.TemporaryDirectory(prefix="nbx-coldstart-") as scratch:
        return _coldstart(args, scratch)


def _coldstart(args, scratch: str) -> dict:
    """The runs (five with --autotune) in three phases, one after another on this process's GPU, or with --gpus
    (e.g. "0,1") each phase's runs at once, the GPUs dealt out in turn: the certified and warmed runs, then the
    restart, then the sweep and the autotuned run (so no certified run shares the host with a sweep's compile
    workers)."""
    _choice, profile = _device()
    empty = tempfile.mkdtemp(prefix="empty-", dir=scratch)
    common = dict(max_launches=args.max_launches, no_torch=args.no_torch, from_launch=args.from_launch)
    if args.cache_dir:
        common["cache_dir"] = args.cache_dir
    certified_cache = tempfile.mkdtemp(prefix="triton-", dir=scratch)
    served = dict(directory=args.dir, certified_only=True, limit_s=args.certified_limit, **common)
    first = {"certified": dict(served, triton_cache=certified_cache), "warmed": dict(served, warm=args.warm)}
    if args.bundle:  # the winners served from a bundle, compiled ahead by `nbxcert bundle`: nothing compiled here
        first["bundled"] = dict(served, bundle=args.bundle)
        # the same with the certificate index built beforehand (`nbxcert index build`, once a machine), not timed
        first["bundled_index"] = dict(served, bundle=args.bundle, index_built=True)
    phases = [
        first,
        # a restart: the certified run again, with the Triton cache the first one filled (what a second start costs)
        {"certified_restart": dict(served, triton_cache=certified_cache)},
        {
            "swept": dict(
                directory=empty,
                certified_only=False,
                limit_s=args.sweep_limit,
                stop_after=args.stop_after,
                sweep_jobs=args.sweep_jobs,
                **common,
            )
        },
    ]
    if args.autotune:
        phases[2]["autotuned"] = dict(
            directory=empty, certified_only=False, limit_s=args.sweep_limit, autotune=True, **common
        )
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus else []
    chosen = {r for r in args.runs.split(",") if r} if args.runs else None
    if chosen is not None:
        phases = [{n: r for n, r in runs.items() if n in chosen} for runs in phases]
    if args.cprofile_out:  # each run's cProfile report beside the others': PREFIX.<run>.txt
        for runs in phases:
            for name, run in runs.items():
                run["cprofile_out"] = f"{args.cprofile_out}.{name}.txt"
    results = {}
    for runs in phases:
        if gpus:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(runs)) as pool:
                futures = {
                    name: pool.submit(_cold_run, args.workload, profile, gpu=gpus[i % len(gpus)], **run)
                    for i, (name, run) in enumerate(runs.items())
                }
                results.update({name: f.result() for name, f in futures.items()})
        else:
            results.update({name: _cold_run(args.workload, profile, **run) for name, run in runs.items()})
    missing = {"error": "not run (--runs)"}
    certified, warmed, swept = (results.get(n, missing) for n in ("certified", "warmed", "swept"))

    def ratio(run: dict, other: dict = swept) -> float | None:
        return other["wall_s"] / run["wall_s"] if "error" not in run and "error" not in other else None

    out = {
        "workload": args.workload,
        "profile": profile.key,
        "concurrent_on_gpus": gpus,
        "certified": certified,
        "warm": args.warm,
        "certified_warmed": warmed,
        "certified_restart": results.get("certified_restart", missing),
        "runtime_sweep": swept,
        "speedup": ratio(certified),
        "speedup_warmed": ratio(warmed),
        "speedup_is_lower_bound": bool(swept.get("cut_at_limit")),
        "speedup_over_common_prefix": prefix_ratio(certified, swept),
        "speedup_warmed_over_common_prefix": prefix_ratio(warmed, swept),
    }
    for name in ("bundled", "bundled_index"):  # served from the bundle; the same with the index built beforehand
        if name in results:
            run = results[name]
            out[name] = run
            out[f"speedup_{name}"] = ratio(run)
            out[f"speedup_{name}_over_common_prefix"] = prefix_ratio(run, swept)
    if "autotuned" in results:
        autotuned = results["autotuned"]
        out.update(
            triton_autotune=autotuned,
            speedup_vs_autotune=ratio(certified, autotuned),
            speedup_vs_autotune_is_lower_bound=bool(autotuned.get("cut_at_limit")),
            speedup_vs_autotune_over_common_prefix=prefix_ratio(certified, autotuned),
            speedup_warmed_vs_autotune_over_common_prefix=prefix_ratio(warmed, autotuned),
        )
    return out


# --- serving ----------------------------------------------------------------------------------------------------------
def serving(args) -> dict:
    from nbxcert import serving
    from nbxcert.kernels import rows
    from nbxcert.kernels.inputs import randn, rng

    choice, profile = _device()
    serving.configure(dirs=[args.dir], certified_only=True)
    gen = rng(0)
    x = randn(gen, (args.rows, args.cols), "float16", choice.device)
    w = randn(gen, (args.cols,), "float16", choice.device)
    out = rows.rmsnorm(x, w, 1e-6)  # the first call looks the key up (certified-only: it must be certified)
    problem = {"n_rows": args.rows, "n_cols": args.cols}
    config = serving.config_for(rows.RMSNORM, problem, ("float16", "float16"))
    inputs = rows.RMSNORM.make_inputs(problem, ("float16", "float16"), 0, choice.device)

    def sync() -> None:
        if choice.name == "cuda":
            from nbxcert.kernels.backends import cuda

            cuda.synchronize()

    served = lambda: rows.rmsnorm(x, w, 1e-6, out=out)  # noqa: E731
    raw = common.replay(common.capture_launches(served))
    paths = {
        "served": served,  # checks, key, certified config, launch built, launch
        # the same without `out`: the output allocated per call and freed when dropped (the allocator's cost)
        "served_alloc": lambda: rows.rmsnorm(x, w, 1e-6),
        "direct": lambda: rows.RMSNORM.launch(config, inputs),  # the same config's launch built, then made
        "raw": raw,  # the served call's own kernel[grid](...), its arguments built once (captured)
        "lookup": lambda: serving.config_for(rows.RMSNORM, problem, ("float16", "float16")),
    }
    # an allocation and a free per call may cost far more than a launch: the allocating path gets a tenth of the calls
    calls = {name: max(1, args.calls // 10) if name == "served_alloc" else args.calls for name in paths}
    times = common.interleaved_us(paths, calls, args.repeats, sync)
    med = {name: statistics.median(v) for name, v in times.items()}
    result = {
        "backend": choice.name,
        "problem": problem,
        "config": config.label(),
        "calls": args.calls,
        "served_us": med["served"],
        "direct_us": med["direct"],
        "raw_us": med["raw"],
        "overhead_us": med["served"] - med["raw"],
        "overhead_vs_direct_us": med["served"] - med["direct"],
        "lookup_us": med["lookup"],
        "served_alloc_us": med["served_alloc"],
        "runs_us": times,
        "target_us": 2.0,
    }
    if args.profile:
        result["profiles"] = {name: _profile_top(paths[name], args.calls, sync) for name in ("served", "raw")}
    return result


def _profile_top(fn, calls: int, sync, top: int = 30) -> list[str]:
    """cProfile of `calls` calls of fn: the `top` functions by their own time, then by their cumulative time, as
    pstats prints them."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    sync()
    prof.disable()
    lines = []
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(top)
        lines += buf.getvalue().splitlines()
    return lines


# --- sweep throughput -------------------------------------------------------------------------------------------------
# a key's line: `in T s (compile a, inputs b, oracle c, checks d, timing e, record f)` (the wall parts add up to T;
# logs of 2026-12-04 had `compile, checks, timing, record; in the runners, inputs and oracle e`, the runner's inputs
# and oracle inside the compile part; logs before 2026-12 had `compile, oracle, checks, timing`)
KEY_LINE = re.compile(
    r"\[nbxcert\] \d+/\d+ (?P<status>certified|failed|skipped)\s*(?P<key>\S+?@v\d+)"
    r"(?:\s*in\s*(?P<total>[\d.]+)\s*s\s*\((?P<parts>[^)]*)\))?"
    r"(?:\s*at\s*(?P<at>[\d.]+)\s*s)?"
)
# the run's clock: a key line's `at T s` (since 2026-12-05), else the heartbeat's `(N s)` on stderr
PROGRESS_LINE = re.compile(r"^\[nbxcert\] certify \S+: .*\((?P<seconds>\d+) s\)$")
PART = re.compile(r"(?P<name>[a-z]+)\s*(?P<seconds>[\d.]+)")
WALL_PARTS = ("compile", "inputs", "oracle", "checks", "timing", "record")
# Triton's own report of a crashed ptxas (the kernel's whole PTX between two rules), which a compile worker printed
# into certify logs before nbxcert captured it
PTXAS_DUMP = re.compile(r"^={20,}$.*?^please share the reproducer above with Triton project\.$", re.M | re.S)


def unwrap_log(text: str) -> str:
    """One line per key: logs written before certify stopped wrapping (Rich broke long lines at 80 columns, dropping
    the space at a break) have a key's line continued on the next ones, up to a blank line, a table or the next
    `[nbxcert]` line."""
    lines: list[str] = []
    joining = False
    for line in PTXAS_DUMP.sub("", text).splitlines():
        if line.startswith("[nbxcert] "):
            lines.append(line)
            joining = True
        elif joining and line.strip() and not line.startswith(("│", "┃", "┏", "┡", "└", " ")):
            lines[-1] += line
        else:
            lines.append(line)
            joining = False
    return "\n".join(lines)


def parse_log(text: str) -> list[dict]:
    rows = []
    for m in KEY_LINE.finditer(unwrap_log(text)):
        row: dict = {"status": m["status"], "key": m["key"]}
        if m["at"] is not None:
            row["at"] = float(m["at"])
        if m["total"] is not None:
            row["total"] = float(m["total"])
            wall, _, inner = m["parts"].partition(";")
            for p in PART.finditer(wall):
                if p["name"] in WALL_PARTS:
                    row[p["name"]] = float(p["seconds"])
            found = PART.findall(inner)
            if found:  # 2026-12-04's logs: the runner's inputs and oracle, inside the compile part
                row["runner_oracle"] = float(found[-1][1])
            elif "inputs" in row:  # the inputs and oracle as wall parts of their own
                row["runner_oracle"] = row["inputs"] + row.get("oracle", 0.0)
        rows.append(row)
    return rows


def run_clock(text: str) -> tuple[float | None, str]:
    """(seconds the run took up to its last key, how it is known) of one certify log. Its key lines' `at` where
    they have it; else the last heartbeat line's clock plus the times of the keys finished after it (a lower bound:
    the time between those keys is not in it); None where the log has neither."""
    stamp, after, last_at = None, 0.0, None
    # line by line as written (a traceback after a progress line must not be joined to it)
    for line in PTXAS_DUMP.sub("", text).splitlines():
        progress = PROGRESS_LINE.match(line)
        if progress:
            stamp, after = float(progress["seconds"]), 0.0
            continue
        m = KEY_LINE.match(line)
        if m is None:
            continue
        if m["at"] is not None:
            last_at = float(m["at"])
        elif m["total"] is not None:
            after += float(m["total"])
    if last_at is not None:
        return last_at, "the key lines' run clock (at T s)"
    if stamp is not None:
        return stamp + after, "the last progress line's clock plus the keys' times after it (a lower bound)"
    return None, ""


def throughput(args) -> dict:
    from nbxcert.profiles import get_profile

    texts = [Path(p).read_text(errors="replace") for p in args.logs]
    per_log = [parse_log(t) for t in texts]
    rows = [r for log in per_log for r in log if r["status"] == "certified" and "total" in r]
    wanted = None
    if args.workload:
        wanted = {k.text() for k in _workload_keys(args.workload, get_profile(args.profile))}
        rows = [r for r in rows if r["key"] in wanted]
    busy = sum(r["total"] for r in rows)
    # shards run at once: the run's wall time is its longest shard's
    wall = max(
        (
            sum(
                r["total"]
                for r in log
                if r["status"] == "certified" and "total" in r and (wanted is None or r["key"] in wanted)
            )
            for log in per_log
        ),
        default=0.0,
    )
    # the run's own clock where the logs give it: what passes between keys (looking up and writing certificates,
    # skipped keys, start-up) is in it, in no key's time
    clocks = [run_clock(t) for t in texts]
    if all(c[0] is not None for c in clocks) and clocks:
        wall, basis = max(c[0] for c in clocks), clocks[0][1]
    else:
        basis = "the keys' times summed (these logs carry no run clock: the time between keys is left out)"
    parts = [f for f in WALL_PARTS if any(f in r for r in rows)]
    shares = {f: (sum(r.get(f, 0.0) for r in rows) / busy if busy else 0.0) for f in parts}
    inside = [r for r in rows if "runner_oracle" in r]
    return {
        "logs": [str(p) for p in args.logs],
        "workload": args.workload,
        "keys_certified": len(rows),
        "seconds_summed": busy,
        "keys_per_minute_per_shard": 60.0 * len(rows) / busy if busy else None,
        "wall_seconds": wall,
        "wall_basis": basis,
        "keys_per_minute": 60.0 * len(rows) / wall if wall else None,
        "shares": shares,
        # the runner's inputs and float64 oracle, as a share of the key time of the lines that report it: the part
        # of the `compile` wait spent on them when the pool had compiled ahead (a diagnosis, not a wall part)
        "runners_inputs_and_oracle_share": (
            sum(r["runner_oracle"] for r in inside) / sum(r["total"] for r in inside) if inside else None
        ),
        "by_kernel": by_kernel(rows, parts),
    }


def by_kernel(rows: list[dict], parts: list[str]) -> dict:
    """Each kernel's keys, their seconds summed and each part's (the family whose part dominates a run shows here:
    an H100 MoE run's fused_moe oracle was 935 s of 1510), the largest total first."""
    kernels: dict[str, dict] = {}
    for r in rows:
        kernel = kernels.setdefault(r["key"].split("[", 1)[0], {"keys": 0, "seconds": 0.0, **dict.fromkeys(parts, 0.0)})
        kernel["keys"] += 1
        kernel["seconds"] += r["total"]
        for part in parts:
            kernel[part] += r.get(part, 0.0)
    ordered = sorted(kernels.items(), key=lambda item: -item[1]["seconds"])
    return {name: {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for name, row in ordered}


def winners(args) -> dict:
    """Winner against default as recorded in the certificates: per kernel and over all, median / min / max; of one
    workload's keys with --workload (those certified)."""
    from nbxcert.profiles import get_profile

    profile = get_profile(args.profile)
    entries = _entries(Path(args.dir), profile.key)
    if args.workload:
        wanted = {k.text() for k in _workload_keys(args.workload, profile)}
        entries = {k: v for k, v in entries.items() if k in wanted}
    rows = []
    # the kernels a process serving these keys compiles (one per kernel, dtypes and winner config, before what each
    # key's problems specialise): what `nbxcert warm` compiles first (`nbxcert.warm.phases`)
    compiled = {
        (k.split("[", 1)[0], k.split(";", 1)[1], json.dumps(e["winner"]["config"], sort_keys=True))
        for k, e in entries.items()
    }
    for key, entry in sorted(entries.items()):
        default = entry.get("default")
        if default and default.get("timing"):
            ratio = default["timing"]["median_us"] / entry["winner"]["timing"]["median_us"]
            rows.append({"key": key, "kernel": key.split("[", 1)[0], "x_default": ratio})
    kernels = {}
    for kernel in sorted({r["kernel"] for r in rows}):
        xs = [r["x_default"] for r in rows if r["kernel"] == kernel]
        kernels[kernel] = {"keys": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    return {
        "dir": args.dir,
        "profile": args.profile,
        "workload": args.workload,
        "keys": len(entries),
        "distinct_winners": len(compiled),
        "kernels": kernels,
        "all": distribution(rows, "x_default"),
        "best": max(rows, key=lambda r: r["x_default"]) if rows else None,
    }


def report(args) -> dict:
    """The quality measurement over the shards of one workload (each `quality --out` file): the distributions over
    every key measured, the peer's by kernel (cuBLAS for matmul, SDPA for each attention kernel), the default's per
    kernel, and the winner timed now against the time its certificate records. A key measured twice (a shard run
    again) is refused, not counted twice."""
    rows, workloads, interrupted = [], set(), []
    for name in args.files:
        try:
            doc = json.loads(Path(name).read_text())
            workloads.add(doc["workload"])
            part = doc["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"report: {name} is not a `quality --out` file ({type(e).__name__}: {e})") from None
        if doc.get("interrupted") or doc.get("stopped"):
            interrupted.append(name)
        rows += part
    keys = [r["key"] for r in rows]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise SystemExit(
            f"report: {len(twice)} keys measured in more than one file (first: {twice[0]}); give each shard once"
        )
    for r in rows:
        r["x_now"] = r["certified_us"] / r["winner_us"] if r.get("certified_us") and r.get("winner_us") else None
    kernels = sorted({r["kernel"] for r in rows})

    def of(kernel: str) -> list[dict]:
        return [r for r in rows if r["kernel"] == kernel]

    # certified time over the time now (above 1: faster now): how well the sweep's timing repeats in another run
    now = sorted(r["x_now"] for r in rows if r["x_now"] is not None)
    certified_over_now = {"n": len(now)}
    if now:
        certified_over_now.update(p5=percentile(now, 0.05), median=statistics.median(now), p95=percentile(now, 0.95))
    return {
        "workloads": sorted(workloads),
        "files": list(args.files),
        "stopped_or_interrupted": interrupted,
        "keys_measured": len(rows),
        "x_default": distribution(rows, "x_default"),
        "x_resweep": distribution(rows, "x_resweep"),
        "x_peer": {k: distribution(of(k), "x_peer") for k in kernels if any("x_peer" in r for r in of(k))},
        "x_default_by_kernel": {k: distribution(of(k), "x_default", worst=1) for k in kernels},
        "certified_over_now": certified_over_now,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    q = sub.add_parser("quality", help="certified winners against default, re-sweep and peer")
    q.add_argument("--workload", required=True)
    q.add_argument("--dir", default="certificates")
    q.add_argument("--resweep-every", type=int, default=10, help="re-sweep one key in N (0: none)")
    q.add_argument("--limit", type=int, default=0, help="only the first N certified keys (0: all)")
    q.add_argument("--no-peer", action="store_true")
    q.add_argument("--kernels", default="", help="only the keys of these kernels, comma-separated (default: all)")
    q.add_argument("--shard", default="0/1", help="i/n: every n-th certified key from the i-th (one shard per GPU)")
    q.add_argument("--jobs", type=int, default=0, help="compile workers (0: the CPU count)")
    q.add_argument("--start", type=int, default=0, help="skip the shard's first N keys (measured by an earlier run)")
    q.add_argument(
        "--stop-after",
        type=float,
        default=None,
        help="measure no further key this many seconds after the start; the peer runs over those measured",
    )
    c = sub.add_parser("coldstart", help="a workload's launch sequence in a fresh process: certified vs swept")
    c.add_argument("--workload", required=True)
    c.add_argument("--dir", default="certificates")
    c.add_argument("--certified-limit", type=float, default=600.0)
    c.add_argument("--sweep-limit", type=float, default=600.0)
    c.add_argument("--autotune", action="store_true", help="also a run with triton.autotune's procedure")
    c.add_argument("--gpus", default="", help='run each phase\'s runs at once on these GPUs, e.g. "0,1"')
    c.add_argument("--max-launches", type=int, default=0, help="only the first N launches of the sequence (0: all)")
    c.add_argument("--bundle", default="", help="also a run serving the winners from this bundle (nbxcert bundle)")
    c.add_argument("--no-torch", action="store_true", help="torch unimportable in every run (an nbxcert application)")
    c.add_argument(
        "--from-launch",
        type=int,
        default=0,
        help="start at this launch of the sequence: one part of a sequence measured in parts (with --cache-dir)",
    )
    c.add_argument(
        "--cache-dir",
        default="",
        help="keep the Triton and nbxcert caches here across the parts of one sequence (each part: --from-launch, "
        "--max-launches), as the whole run's one process would keep them",
    )
    c.add_argument(
        "--stop-after",
        type=float,
        default=0.0,
        help="the sweep starts no launch after this many seconds from its process's start: a part of a sequence "
        "measured in parts ends between two launches and says the next (next_launch), for the next part's "
        "--from-launch",
    )
    c.add_argument(
        "--cprofile-out",
        default="",
        metavar="PREFIX",
        help="run each child under cProfile and write its top functions (own and cumulative time) to PREFIX.<run>.txt "
        "(a diagnosis: the profiler slows the run)",
    )
    c.add_argument(
        "--sweep-jobs",
        type=int,
        default=0,
        help="NBXCERT_SWEEP_JOBS for the sweep: its candidates compiled in this many workers first (0: unset, "
        "nbxcert's default, each compiled in the process at its first run)",
    )
    c.add_argument(
        "--runs",
        default="",
        help="only these runs, comma-separated (certified, warmed, bundled, bundled_index, certified_restart, swept, "
        "autotuned)",
    )
    c.add_argument(
        "--warm",
        choices=("block", "background"),
        default="background",
        help="the warmed run: its winners compiled in a pool before the first launch, or meanwhile",
    )
    s = sub.add_parser("serving", help="per-launch cost of the served path against a direct launch")
    s.add_argument("--dir", default="certificates")
    s.add_argument("--rows", type=int, default=1)
    s.add_argument("--cols", type=int, default=2048)
    s.add_argument("--calls", type=int, default=20000)
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--profile", action="store_true", help="also cProfile the served and raw paths (top functions)")
    t = sub.add_parser("throughput", help="keys per minute and the share of each phase, from certify logs")
    t.add_argument("logs", nargs="+")
    t.add_argument("--workload", default="")
    t.add_argument("--profile", default="hopper")
    w = sub.add_parser("winners", help="certified winner against the untuned default, read from the certificates")
    w.add_argument("--dir", default="certificates")
    w.add_argument("--profile", default="hopper")
    w.add_argument("--workload", default="", help="only this workload's keys (default: every certified key)")
    r = sub.add_parser("report", help="the quality measurement over a workload's shards (quality --out files)")
    r.add_argument("files", nargs="+")
    for p in (q, c, s, t, w, r):
        p.add_argument("--out", default="")
    args = ap.parse_args(argv)
    commands = {"quality": quality, "coldstart": coldstart, "serving": serving, "throughput": throughput}
    result = {**commands, "winners": winners, "report": report}[args.what](args)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    summary = {k: v for k, v in result.items() if k != "rows"}
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
