"""Benchmark serving from the compiled index against parsing the JSON certificates, on the CPU.

A synthetic certificate directory of --entries entries (spread over --files kernel/dtype files, each entry with
--refused refused candidates, as a real sweep writes them) is compiled into an index; then, each in a fresh process
(timed from inside the process, around the calls only, imports excluded and reported apart):

  index open        CertifiedIndex.open + the first get (the sidecar says the file was checked before)
  index open, full  the same with the sidecar removed: the whole-file SHA-256 trailer is checked too
  load_index        fingerprint of the JSON bytes + open + first get (the serving entry point)
  fingerprint       hashing the JSON files' bytes alone
  json.load         json.load of every certificate file + the lookup (the baseline)
  load_file         certificates.load_file of every file (parsed and validated) + the lookup

and warm, in one process: `get` of a key already parsed, of a missing key (cached), and of a key not yet parsed.

    python benchmarks/bench_serve.py --out serve.json [--entries 10000] [--files 20] [--refused 4] [--procs 15]

Targets: index open + first lookup < 10 ms and >= 20x faster than json.load of the directory; warm get < 2 us.
The page cache is warm in every run (the files were just written): this measures CPU work, not disk reads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fixtures"))  # the valid-entry builder the index's tests use

import certs  # noqa: E402

from nbxcert import index  # noqa: E402
from nbxcert.index import CertifiedIndex, load_index  # noqa: E402

KERNELS = ("rmsnorm", "layernorm", "softmax", "cross_entropy", "rope")
DTYPES = ("float16", "bfloat16", "float32", "float8e4")
MEMORY_CLASS = "80GB"
TARGET_COLD_MS, TARGET_RATIO, TARGET_WARM_US = 10.0, 20.0, 2.0

# Runs in a fresh interpreter; prints one JSON object. Imports are timed apart from the measured calls.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from nbxcert import certificates
from nbxcert.index import CertifiedIndex, fingerprint, load_index
import_s = time.perf_counter() - t0
a = json.loads(sys.argv[1])
mode, key, dirs = a["mode"], a["key"], [Path(d) for d in a["dirs"]]
t0 = time.perf_counter()
if mode in ("index_open", "index_open_full"):
    found = CertifiedIndex.open(Path(a["index"])).get(key)
elif mode == "load_index":
    found = load_index(dirs, a["profile"], a["memory_class"], cache_dir=Path(a["cache"])).get(key)
elif mode == "fingerprint":
    found = fingerprint(dirs, a["profile"])
elif mode == "json_load":
    found = None
    for d in dirs:
        for p in sorted((d / a["profile"]).rglob("*.json")):
            with open(p, encoding="utf-8") as f:
                doc = json.load(f)
            if found is None:
                found = doc["entries"].get(key)
elif mode == "load_file":
    found = None
    for d in dirs:
        for p in certificates.iter_files(d, a["profile"]):
            e = certificates.load_file(p).entries.get(key)
            found = e if found is None else found
elapsed = time.perf_counter() - t0
assert found, mode
print(json.dumps({"s": elapsed, "import_s": import_s}))
"""


def make_directory(root: Path, entries: int, files: int, refused: int) -> list[str]:
    """Write `entries` certifications over `files` files under `root`; every key written."""
    pairs = [(k, d) for d in DTYPES for k in KERNELS][:files]
    if len(pairs) < files:
        raise SystemExit(f"--files at most {len(KERNELS) * len(DTYPES)}")
    keys = []
    for f, (kernel, dtype) in enumerate(pairs):
        n = entries // files + (f < entries % files)
        chunk = {
            certs.key(kernel, n_cols=64 * (i + 1), n_rows=512, dtype=dtype): certs.entry(
                block=64, seed=i, refused=refused
            )
            for i in range(n)
        }
        certs.write_file(root, chunk, kernel=kernel, dtype=dtype)
        keys += chunk
    return keys


def fresh(mode: str, args: dict, procs: int, before=None) -> dict:
    """Run `mode` in `procs` fresh interpreters; median and min of the in-process times (ms)."""
    times, imports = [], []
    for _ in range(procs):
        if before:
            before()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps({**args, "mode": mode})],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        r = json.loads(out.stdout)
        times.append(r["s"] * 1e3)
        imports.append(r["import_s"] * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "import_ms": statistics.median(imports)}


def per_call_us(stmt: str, env: dict, number: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=5)) / number * 1e6


def serving_path_us(cache: Path) -> float:
    """The warm cost a launch pays for serving: `choose_config` for a matmul launch whose key was looked up before
    (what every kernel's user-facing function calls). Measured on the CPU: it is Python work, the same on any GPU."""
    os.environ.setdefault("NBXCERT_BACKEND", "interpreter")
    os.environ["NBXCERT_UNCERTIFIED"] = "default"  # the first call fills the lookup; no sweep is wanted here
    os.environ["NBXCERT_CACHE_DIR"] = str(cache)
    from nbxcert import serving
    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels.spec import choose_config

    serving.reset()
    problem = {"M": 16, "N": 4096, "K": 4096, "trans_a": 0, "trans_b": 1, "aligned": 1}
    env = {"choose": choose_config, "spec": mm.MATMUL, "p": problem, "dt": ("float16", "float16")}
    env["run"], env["outs"] = (lambda c: None), ()
    choose_config(mm.MATMUL, problem, env["dt"], None, run=env["run"], outputs=())  # the first lookup
    return per_call_us("choose(spec, p, dt, None, run=run, outputs=outs)", env, 200_000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON results")
    ap.add_argument("--entries", type=int, default=10_000, help="certifications in the synthetic directory")
    ap.add_argument("--files", type=int, default=20, help="certificate files they are spread over (at most 20)")
    ap.add_argument("--refused", type=int, default=4, help="refused candidates recorded per entry")
    ap.add_argument("--procs", type=int, default=15, help="fresh processes per cold measurement")
    opts = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="nbxcert-bench-serve-") as tmp:
        tmp = Path(tmp)
        root, cache = tmp / "certs", tmp / "cache"
        keys = make_directory(root, opts.entries, opts.files, opts.refused)
        json_bytes = sum(p.stat().st_size for p in root.rglob("*.json"))

        t0 = time.perf_counter()
        idx = load_index([root], certs.PROFILE, MEMORY_CLASS, cache_dir=cache)
        build_ms = (time.perf_counter() - t0) * 1e3
        path, sidecar = idx.path, idx.path.with_name(idx.path.name + index.SIDECAR_SUFFIX)
        time.sleep(index.SETTLE_NS / 1e9 + 0.2)  # old enough for an open to record the sidecar
        CertifiedIndex.open(path).close()
        assert sidecar.exists(), "the sidecar was not written"

        key = random.Random(0).choice(keys)
        args = {"key": key, "dirs": [str(root)], "profile": certs.PROFILE, "memory_class": MEMORY_CLASS}
        args.update(index=str(path), cache=str(cache))
        cold = {
            "index_open": fresh("index_open", args, opts.procs),
            "index_open_full": fresh("index_open_full", args, opts.procs, before=lambda: sidecar.unlink()),
        }
        time.sleep(index.SETTLE_NS / 1e9 + 0.2)
        CertifiedIndex.open(path).close()  # the sidecar back, for load_index
        for mode in ("load_index", "fingerprint", "json_load", "load_file"):
            cold[mode] = fresh(mode, args, opts.procs)

        warm_idx = CertifiedIndex.open(path)
        warm_idx.get(key)
        env = {"get": warm_idx.get, "k": key, "miss": "nope[n=1;float16]@v1", "idx": warm_idx}
        warm = {
            "get_parsed_us": per_call_us("get(k)", env, 200_000),
            "get_missing_cached_us": (warm_idx.get(env["miss"]), per_call_us("get(miss)", env, 200_000))[1],
            "contains_parsed_us": per_call_us("k in idx", env, 200_000),
        }
        order = random.Random(1).sample(keys, len(keys))
        for name, stmt in (("contains_unparsed_us", "k in idx"), ("get_unparsed_us", "idx.get(k)")):
            best = float("inf")
            for _ in range(3):
                fresh_idx = CertifiedIndex.open(path)
                t0 = time.perf_counter()
                if stmt == "k in idx":
                    for k in order:
                        k in fresh_idx  # noqa: B015 (the lookup is what is timed)
                else:
                    for k in order:
                        fresh_idx.get(k)
                best = min(best, (time.perf_counter() - t0) / len(order) * 1e6)
            warm[name] = best

        warm["serve_choose_config_us"] = serving_path_us(cache)

        ratio = cold["json_load"]["median_ms"] / cold["index_open"]["median_ms"]
        result = {
            "entries": len(keys),
            "files": opts.files,
            "refused_per_entry": opts.refused,
            "json_bytes": json_bytes,
            "index_bytes": path.stat().st_size,
            "build_ms": build_ms,
            "cold": cold,
            "warm": warm,
            "speedup_vs_json_load": ratio,
            "targets": {
                "cold_open_ms": [TARGET_COLD_MS, cold["index_open"]["median_ms"] < TARGET_COLD_MS],
                "speedup": [TARGET_RATIO, ratio >= TARGET_RATIO],
                "warm_get_us": [TARGET_WARM_US, warm["get_parsed_us"] < TARGET_WARM_US],
                "serving_path_us": [TARGET_WARM_US, warm["serve_choose_config_us"] < TARGET_WARM_US],
            },
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        }

    print(
        f"{len(keys)} entries in {opts.files} files ({json_bytes / 2**20:.1f} MiB JSON, "
        f"index {result['index_bytes'] / 2**20:.1f} MiB, built in {build_ms:.0f} ms); fresh processes: {opts.procs}"
    )
    print(f"{'cold, fresh process':34} {'median ms':>10} {'min ms':>8} {'imports ms':>11}")
    for mode, r in cold.items():
        print(f"  {mode:32} {r['median_ms']:10.2f} {r['min_ms']:8.2f} {r['import_ms']:11.1f}")
    print(f"{'warm, per call':34} {'us':>10}")
    for name, us in warm.items():
        print(f"  {name:32} {us:10.3f}")
    for name, (target, ok) in result["targets"].items():
        print(f"target {name}: {target} -> {'met' if ok else 'NOT met'}")
    print(f"index open + first get is {ratio:.0f}x faster than json.load of the directory")
    Path(opts.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(ok for _, ok in result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
