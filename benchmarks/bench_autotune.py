"""nbxcert's sweep against Triton's own autotuner on the same keys and the same candidates, each side a fresh process of
its own: what certificates cost to make beside what autotuning the same space costs, counting process start (target:
nbxcert at least 5x faster, its checks included and Triton's none).

Keys: `--keys` float16 keys of each family in `--families` (matmul, rmsnorm, silu_and_mul), taken from a shipped
workload, spread over the family's key list (decode sizes first, prefill rungs later in a workload's order). For each
key, the candidates the device file's prune keeps at both ends of the key's bucket (those nbxcert's sweep compiles),
all one Triton kernel with one signature: matmul is certified as `matmul_tiled` (its tiled candidates,
`autotune_specs.py`), rmsnorm and silu_and_mul as shipped.

- nbxcert: one process, `python3 -m nbxcert certify --profile P --keys KEYS --out EMPTY --spec autotune_specs --force
  --json`, with an empty Triton cache: parallel compile on every CPU core, every candidate checked against the float64
  oracle at the bucket's smallest and largest member, screened, the fastest timed in full, the winner's
  reproducibility checked. Its process wall time, and each key's seconds from its report.
- triton.autotune: one process (torch imported there: the autotuner times through it) with its own empty Triton
  cache; per key, `triton.autotune(configs=<the same candidates as triton.Configs>, key=<the size arguments>)` over the
  same Triton kernel, launched once at the key's largest member with the arguments nbxcert's launch passes: compile
  and benchmark of every config, no correctness check. Its process wall time (torch's import included), and each key's
  seconds.

The headline ratio is the peer's process wall over nbxcert's; per family and per key, the peer's seconds over
nbxcert's.

    python3 benchmarks/bench_autotune.py --workload qwen2.5-7b --families matmul,rmsnorm,silu_and_mul --keys 7 \\
        --out autotune.json

NBXCERT_COMPILE_POOL in its environment picks certify's compile workers (`nbxcert.crosspool`: cross, the default); the
report's `compile_pool` says which pool ran.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPEC_MODULE = "autotune_specs"  # imported by certify and its workers by name (HERE on their PYTHONPATH)
TARGET = 5.0
SIDE_LIMIT_S = 1800  # either side's process is stopped after this long (a hung run reports, not waits for ever)
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


# --- what both sides share: each family's kernel, its configs and its arguments -------------------------------------
def _strides3(t) -> tuple[int, int, int]:
    """A 2-d operand's strides as the matmul launch gives them ([batch, rows, cols], size-1 dimensions stride 0)."""
    return (0, *(0 if size == 1 else stride for size, stride in zip(t.shape, t.stride(), strict=True)))


def _mm_tuning(config, problem: dict, dtype: str) -> dict[str, Any]:
    from nbxcert.kernels.common import wrap_run

    m, n, k = problem["M"], problem["N"], problem["K"]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["K_BYTES"] // ITEMSIZE[dtype]
    # wrap_run asks whether the operand's stride along the dimension is 1 (A's along M: column-major A; B's along N:
    # row-major B); along a size-1 dimension the launch passes stride 0
    a_along_m = 1 if problem["trans_a"] and m > 1 else 0
    b_along_n = 1 if not problem["trans_b"] and n > 1 else 0
    return {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": config["GROUP_M"],
        "EVEN_K": k % bk == 0,
        "RUN_M": wrap_run(m, bm, a_along_m),
        "RUN_N": wrap_run(n, bn, b_along_n),
    }


def _mm_fixed(problem: dict, dtype: str) -> dict[str, Any]:
    from nbxcert.kernels.common import upcast

    return {
        "HAS_BIAS": False,
        "ACTIVATION": "none",
        "DOT_PRECISION": "ieee",
        "UPCAST": dtype == "bfloat16" and upcast(),
    }


def _mm_args(t: dict, problem: dict) -> tuple:
    a, b, out = t["a"], t["b"], t["out"]  # out stands in for the bias too (HAS_BIAS false: never read)
    sizes = (problem["M"], problem["N"], problem["K"])
    return (a, b, out, out, *sizes, *_strides3(a), *_strides3(b), *_strides3(out), 0, 0, 0, 1.0, 1.0)


def _mm_grid(problem: dict, meta: dict) -> tuple[int, ...]:
    return (_cdiv(problem["M"], meta["BLOCK_M"]) * _cdiv(problem["N"], meta["BLOCK_N"]), 1)


def _mm_peer(problem: dict, dtypes: list[str], torch):
    """A [M, K] and B [K, N] in the key's layouts (trans_b: B is nn.Linear's weight [N, K], transposed)."""
    m, n, k, dt = problem["M"], problem["N"], problem["K"], getattr(torch, dtypes[0])
    a = (
        torch.randn(k, m, device="cuda", dtype=dt).T
        if problem["trans_a"]
        else torch.randn(m, k, device="cuda", dtype=dt)
    )
    b = (
        torch.randn(n, k, device="cuda", dtype=dt).T
        if problem["trans_b"]
        else torch.randn(k, n, device="cuda", dtype=dt)
    )
    return {"a": a, "b": b, "out": torch.empty(m, n, device="cuda", dtype=dt)}, lambda: a.float() @ b.float()


def _norm_tuning(config, problem: dict, dtype: str) -> dict[str, Any]:
    from nbxcert.kernels.rows import row_tile

    one_tile = config["VARIANT"] == "tile"
    block = row_tile(problem["n_cols"]) if one_tile else config["BLOCK_N"]
    return {"ONE_TILE": one_tile, "ROWS": config["ROWS"], "BLOCK_N": block}


def _norm_fixed(problem: dict, dtype: str) -> dict[str, Any]:
    from nbxcert.kernels.common import compute_type, upcast

    return {"RMS": True, "RESIDUAL": False, "CDT": compute_type(dtype), "UPCAST": upcast()}


def _norm_args(t: dict, problem: dict) -> tuple:
    from nbxcert.kernels.rows import RMSNORM_EPS

    x, w, y = t["x"], t["weight"], t["y"]  # x and w stand in for the residual and the bias, y for the sum: never used
    sizes = (problem["n_rows"], problem["n_cols"])
    return (x, x, w, w, y, y, *sizes, x.stride(0), x.stride(0), y.stride(0), y.stride(0), float(RMSNORM_EPS))


def _norm_grid(problem: dict, meta: dict) -> tuple[int, ...]:
    return (_cdiv(problem["n_rows"], meta["ROWS"]),)


def _norm_peer(problem: dict, dtypes: list[str], torch):
    from nbxcert.kernels.rows import RMSNORM_EPS

    rows, cols = problem["n_rows"], problem["n_cols"]
    x = torch.randn(rows, cols, device="cuda", dtype=getattr(torch, dtypes[0]))
    w = (1.0 + 0.5 * torch.randn(cols, device="cuda")).to(getattr(torch, dtypes[1]))

    def reference():
        xf = x.float()
        return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + RMSNORM_EPS) * w.float()

    return {"x": x, "weight": w, "y": torch.empty_like(x)}, reference


def _silu_tuning(config, problem: dict, dtype: str) -> dict[str, Any]:
    return {"ROWS": config["ROWS"], "BLOCK": config["BLOCK"]}


def _silu_fixed(problem: dict, dtype: str) -> dict[str, Any]:
    from nbxcert.kernels.common import compute_type, upcast

    return {"CDT": compute_type(dtype), "UPCAST": upcast()}


def _silu_args(t: dict, problem: dict) -> tuple:
    x, y = t["x"], t["y"]
    return (x, y, problem["n_rows"], problem["d"], x.stride(0), y.stride(0))


def _silu_grid(problem: dict, meta: dict) -> tuple[int, ...]:
    return (_cdiv(problem["n_rows"], meta["ROWS"]), _cdiv(problem["d"], meta["BLOCK"]))


def _silu_peer(problem: dict, dtypes: list[str], torch):
    rows, d = problem["n_rows"], problem["d"]
    x = torch.randn(rows, 2 * d, device="cuda", dtype=getattr(torch, dtypes[0]))

    def reference():
        return torch.nn.functional.silu(x[:, :d].float()) * x[:, d:].float()

    return {"x": x, "y": torch.empty(rows, d, device="cuda", dtype=x.dtype)}, reference


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Family:
    """How one family is measured on both sides.

    The plan (both sides, no GPU): `spec`, the spec nbxcert certifies, whose keys come from the workload's keys of
    `workload_kernel`; `kernel`, "module:function" of the one Triton kernel every candidate launches;
    `tuning(config, problem, dtype)`, a candidate's triton.Config kwargs at a problem, derived as nbxcert's launch
    derives them; `fixed(problem, dtype)`, the constexprs every candidate's launch passes alike. The launch (both
    sides): `args(tensors, problem)`, the positional arguments from tensors named as the spec's inputs name them
    (nbxcert's or torch's); `grid(problem, meta)`; `sizes`, the arguments triton.autotune keys on; `output`, the
    tensor it writes. The peer: `peer(problem, dtypes, torch)`, its torch tensors and a float32 reference of the
    output."""

    workload_kernel: str
    spec: str
    kernel: str
    tuning: Callable[[Any, dict, str], dict]
    fixed: Callable[[dict, str], dict]
    args: Callable[[dict, dict], tuple]
    grid: Callable[[dict, dict], tuple]
    sizes: tuple[str, ...]
    output: str
    peer: Callable[[dict, list, Any], tuple]


FAMILIES = {
    "matmul": Family(
        "matmul",
        "matmul_tiled",
        "nbxcert.kernels.matmul:_mm_tiled_kernel",
        _mm_tuning,
        _mm_fixed,
        _mm_args,
        _mm_grid,
        ("M", "N", "K"),
        "out",
        _mm_peer,
    ),
    "rmsnorm": Family(
        "rmsnorm",
        "rmsnorm",
        "nbxcert.kernels.rows:_norm_kernel",
        _norm_tuning,
        _norm_fixed,
        _norm_args,
        _norm_grid,
        ("n_rows", "n_cols"),
        "y",
        _norm_peer,
    ),
    "silu_and_mul": Family(
        "silu_and_mul",
        "silu_and_mul",
        "nbxcert.kernels.elementwise:_silu_and_mul_kernel",
        _silu_tuning,
        _silu_fixed,
        _silu_args,
        _silu_grid,
        ("n_rows", "d"),
        "y",
        _silu_peer,
    ),
}
DEFAULT_FAMILIES = "matmul,rmsnorm,silu_and_mul"


def kernel_of(name: str):
    """The Triton kernel a family's "module:function" names."""
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


def _json_value(v: Any) -> Any:
    """A constexpr as JSON: a Triton dtype (a compute type) as {"tl_dtype": its name}."""
    from nbxcert.kernels.jit import tl

    return {"tl_dtype": v.name} if isinstance(v, tl.dtype) else v


def constexpr_value(v: Any, tl) -> Any:
    """`_json_value`'s inverse, in the process that launches (`tl`: its triton.language)."""
    return tl.dtype(v["tl_dtype"]) if isinstance(v, dict) else v


# --- the plan ---------------------------------------------------------------------------------------------------------
def parse_families(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if not names or unknown:
        raise SystemExit(
            f"bench_autotune: unknown family {', '.join(unknown) or repr(text)}; known: {', '.join(FAMILIES)}"
        )
    return list(dict.fromkeys(names))


def spread(items: list, count: int) -> list:
    """`count` items evenly spaced over `items`, its first and last included (all of them when it has no more)."""
    if count >= len(items):
        return list(items)
    if count == 1:
        return [items[0]]
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def pick_keys(workload: str, profile, family: str, count: int, dtype: str) -> list:
    """`count` keys of `family` in the workload whose first dtype is `dtype`, as keys of the spec nbxcert certifies."""
    from nbxcert.keys import LaunchKey
    from nbxcert.workload import load_workload, workload_keys

    fam = FAMILIES[family]
    found = workload_keys(load_workload(workload), profile, {fam.workload_kernel})
    keys = [k for k in found if k.dtypes[0] == dtype]
    return [LaunchKey(fam.spec, k.fields, k.dtypes) for k in spread(keys, count)]


def plan_item(family: str, key, profile) -> dict[str, Any]:
    """One key of the plan: its kernel, its timing problem (the bucket's largest member), the candidates nbxcert's
    sweep keeps for it (kept by the prune at both ends of the bucket, `sweep.sweep_key`) as triton.Config fields, and
    the constexprs passed alike to all."""
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import key_problems

    fam = FAMILIES[family]
    spec = get_spec(fam.spec)
    problems = key_problems(spec, key, profile)
    kept_small = set(spec.prune(spec.candidates, problems["smallest"], profile).kept)
    kept = [c for c in spec.prune(spec.candidates, problems["timing"], profile).kept if c in kept_small]
    problem, dtype = dict(problems["timing"]), key.dtypes[0]
    return {
        "family": family,
        "key": key.text(),
        "kernel": fam.kernel,
        "problem": problem,
        "dtypes": list(key.dtypes),
        "fixed": {n: _json_value(v) for n, v in fam.fixed(problem, dtype).items()},
        "configs": [
            {
                "label": c.label(),
                "kwargs": fam.tuning(c, problem, dtype),
                "num_warps": c.num_warps,
                "num_stages": c.num_stages,
            }
            for c in kept
        ],
    }


def build_plan(workload: str, profile, families: list[str], count: int, dtype: str) -> list[dict[str, Any]]:
    """Every key measured, family by family, in the order both sides run them."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    importlib.import_module(SPEC_MODULE)  # registers the restricted specs here too
    plan = []
    for family in families:
        keys = pick_keys(workload, profile, family, count, dtype)
        if not keys:
            raise SystemExit(f"bench_autotune: workload {workload} has no {dtype} key of {family}")
        plan += [plan_item(family, k, profile) for k in keys]
    return plan


def write_keys_file(plan: list[dict], path: Path) -> Path:
    """The plan's keys as a keys file (JSON lines, as `nbxcert keys --json` writes them)."""
    path.write_text("".join(json.dumps({"key": item["key"]}) + "\n" for item in plan))
    return path


# --- nbxcert's side ---------------------------------------------------------------------------------------------------
def ours_command(profile: str, keys_path: Path, out_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nbxcert",
        "certify",
        "--profile",
        profile,
        "--keys",
        str(keys_path),
        "--out",
        str(out_dir),
        "--spec",
        SPEC_MODULE,
        "--force",
        "--json",
    ]


def side_env(triton_cache: Path) -> dict[str, str]:
    """This environment with an empty Triton cache of its own and this folder first on PYTHONPATH (certify and its
    workers import the spec module by name)."""
    paths = [str(HERE)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    triton_cache.mkdir(parents=True, exist_ok=False)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TRITON_CACHE_DIR": str(triton_cache)}


def _run_side(what: str, cmd: list[str], env: dict, work: Path, stem: str) -> tuple[subprocess.CompletedProcess, float]:
    """The side's process run to its end, its wall time; its output kept in `work` (named in a failure's line)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SIDE_LIMIT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench_autotune: {what} ran past {SIDE_LIMIT_S} s and was stopped") from None
    wall = time.perf_counter() - t0
    (work / f"{stem}.stdout").write_text(r.stdout)
    (work / f"{stem}.stderr").write_text(r.stderr)
    return r, wall


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def last_json(text: str) -> dict | None:
    """The last JSON object of `text` that starts a line and runs to its end (certify's `--json` summary), or None."""
    starts = [0] if text.startswith("{") else []
    starts += [i + 1 for i in range(len(text)) if text.startswith("\n{", i)]
    for start in reversed(starts):
        try:
            found = json.loads(text[start:])
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def run_ours(profile: str, keys_path: Path, work: Path, pool: str = "") -> dict[str, Any]:
    """nbxcert certify over the keys, in a Triton cache and a certificate folder of its own; `pool` sets
    NBXCERT_COMPILE_POOL for it (empty: as this environment has it)."""
    stem = f"ours-{pool}" if pool else "ours"
    out_dir = work / f"certificates-{stem}"
    out_dir.mkdir()
    env = side_env(work / f"triton-{stem}")
    if pool:
        env["NBXCERT_COMPILE_POOL"] = pool
    r, wall = _run_side("nbxcert certify", ours_command(profile, keys_path, out_dir), env, work, stem)
    report = last_json(r.stdout)
    if r.returncode != 0 or report is None:
        failed = [k for k in (report or {}).get("keys", []) if k.get("status") == "failed"]
        why = (
            f"{len(failed)} key(s) failed, first {failed[0]['key']}: {failed[0].get('reason', '')[:200]}"
            if failed
            else _last_line(r.stderr)
        )
        raise SystemExit(f"bench_autotune: nbxcert certify exited {r.returncode}: {why} (its output: {work}/{stem}.*)")
    return {"wall_s": wall, "report": report}


# --- triton.autotune's side -------------------------------------------------------------------------------------------
def peer(plan_path: str) -> None:
    """Runs in its own process: torch + triton.autotune over the same kernels, one autotuned launch per key."""
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import driver

    plan = json.loads(Path(plan_path).read_text())
    kernels = {item["kernel"]: kernel_of(item["kernel"]) for item in plan}
    driver.reset_active()  # Triton's own CUDA driver (nbxcert installed its torch-free one on import)
    # the autotuner's own results cache stays off (Triton's default; said here where the option exists)
    options = {"cache_results": False} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    results = []
    for item in plan:
        fam, problem = FAMILIES[item["family"]], item["problem"]
        torch.manual_seed(0)
        tensors, reference = fam.peer(problem, item["dtypes"], torch)
        configs = [
            triton.Config(c["kwargs"], num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in item["configs"]
        ]
        tuned = triton.autotune(configs=configs, key=list(fam.sizes), **options)(kernels[item["kernel"]])
        fixed = {n: constexpr_value(v, tl) for n, v in item["fixed"].items()}
        args = fam.args(tensors, problem)

        def grid(meta, fam=fam, problem=problem):  # bound to this key now (Triton evaluates it within this iteration)
            return fam.grid(problem, meta)

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tuned[grid](*args, **fixed)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        err = (tensors[fam.output].float() - reference()).abs().max().item()
        results.append(
            {
                "key": item["key"],
                "seconds": seconds,
                "configs": len(configs),
                "best": str(tuned.best_config),
                "max_abs_err_vs_fp32": err,
            }
        )
    versions = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__}
    print(json.dumps({**versions, "keys": results}))


def run_peer(plan: list[dict], work: Path) -> dict[str, Any]:
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan))
    env = side_env(work / "triton-peer")
    r, wall = _run_side(
        "triton.autotune's process", [sys.executable, __file__, "--peer", str(plan_path)], env, work, "peer"
    )
    if r.returncode != 0:
        why = _last_line(r.stderr)
        raise SystemExit(
            f"bench_autotune: triton.autotune's process exited {r.returncode}: {why} (its output: {work}/peer.*)"
        )
    try:
        result = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit(
            f"bench_autotune: triton.autotune's process printed no result (its output: {work}/peer.*)"
        ) from None
    return {"wall_s": wall, **result}


# --- the comparison ---------------------------------------------------------------------------------------------------
def _ratio(peer_s: float, ours_s: float) -> float | None:
    return peer_s / ours_s if ours_s > 0 else None


def compare(plan: list[dict], ours: dict, theirs: dict) -> dict[str, Any]:
    """The rows (key, family, candidates, ours_s, autotune_s, ratio), totals per family and overall, both walls."""
    mine = {k["key"]: k for k in ours["report"]["keys"]}
    peer_keys = {k["key"]: k for k in theirs["keys"]}
    missing = [item["key"] for item in plan if item["key"] not in mine or item["key"] not in peer_keys]
    if missing:
        raise SystemExit(f"bench_autotune: {len(missing)} key(s) missing from a side's results, first {missing[0]}")
    rows = []
    for item in plan:
        m, p = mine[item["key"]], peer_keys[item["key"]]
        ours_s = float(m["seconds"].get("total", 0.0))
        rows.append(
            {
                "key": item["key"],
                "family": item["family"],
                "candidates": len(item["configs"]),
                "ours_s": ours_s,
                "autotune_s": p["seconds"],
                "ratio": _ratio(p["seconds"], ours_s),
                "ours": {n: m.get(n) for n in ("status", "winner", "seconds", "counts")},
                "autotune": p,
            }
        )
    families = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        mine_rows = [r for r in rows if r["family"] == family]
        ours_s, peer_s = sum(r["ours_s"] for r in mine_rows), sum(r["autotune_s"] for r in mine_rows)
        families[family] = {
            "keys": len(mine_rows),
            "ours_s": ours_s,
            "autotune_s": peer_s,
            "ratio": _ratio(peer_s, ours_s),
        }
    ours_s, peer_s = sum(r["ours_s"] for r in rows), sum(r["autotune_s"] for r in rows)
    process = _ratio(theirs["wall_s"], ours["wall_s"])
    return {
        "rows": rows,
        "families": families,
        "total": {"keys": len(rows), "ours_s": ours_s, "autotune_s": peer_s, "ratio": _ratio(peer_s, ours_s)},
        "ours_process_wall_s": ours["wall_s"],
        # certify's own run: planning, the keys (the key rows' seconds and what lies between them), closing workers
        "ours_run_seconds": ours["report"].get("seconds", {}),
        "autotune_process_wall_s": theirs["wall_s"],
        "process_ratio": process,
        "target": TARGET,
        "met": process is not None and process >= TARGET,
    }


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"x{ratio:.2f}"


def table(result: dict) -> list[str]:
    lines = []
    for r in result["rows"]:
        lines.append(
            f"{r['key']}: {r['candidates']} candidates, nbxcert {r['ours_s']:.2f} s ({r['ours']['status']}), "
            f"triton.autotune {r['autotune_s']:.2f} s, {_x(r['ratio'])}"
        )
    for family, t in result["families"].items():
        lines.append(
            f"{family}: {t['keys']} keys, nbxcert {t['ours_s']:.1f} s, triton.autotune {t['autotune_s']:.1f} s, "
            f"{_x(t['ratio'])}"
        )
    t = result["total"]
    lines.append(
        f"total over {t['keys']} keys: nbxcert {t['ours_s']:.1f} s, triton.autotune {t['autotune_s']:.1f} s, "
        f"{_x(t['ratio'])}"
    )
    run = result.get("ours_run_seconds") or {}
    if run:
        lines.append(
            "nbxcert's run: " + ", ".join(f"{k} {v:.1f} s" for k, v in run.items()) + " (the rest of its wall: start)"
        )
    verdict = "met" if result["met"] else "missed"
    lines.append(
        f"process walls: nbxcert {result['ours_process_wall_s']:.1f} s, triton.autotune "
        f"{result['autotune_process_wall_s']:.1f} s: {_x(result['process_ratio'])} (target >= {TARGET:g}x: {verdict})"
    )
    return lines


def parse_pools(text: str) -> list[str]:
    """--pools: the compile pools to run nbxcert's side with, in order; [""] (the environment's) when none named."""
    from nbxcert.crosspool import POOL_KINDS

    pools = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in pools if p not in POOL_KINDS]
    if bad:
        raise SystemExit(
            f"bench_autotune: --pools {bad[0]!r} is not a compile pool; give one of {', '.join(POOL_KINDS)}"
        )
    if len(set(pools)) != len(pools):
        raise SystemExit(f"bench_autotune: --pools {text!r} names a pool twice")
    return pools or [""]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="qwen2.5-7b", help="a shipped workload (default qwen2.5-7b)")
    ap.add_argument("--profile", default="hopper", help="the device profile certified for (default hopper)")
    ap.add_argument("--families", default=DEFAULT_FAMILIES, help=f"comma-separated (default {DEFAULT_FAMILIES})")
    ap.add_argument("--keys", type=int, default=7, help="keys of each family (default 7)")
    ap.add_argument("--dtype", default="float16", help="the keys' first dtype (default float16)")
    ap.add_argument("--out", default="", help="write the results as JSON to this path")
    ap.add_argument(
        "--pools",
        default="",
        help="comma-separated compile pools (device, cross): nbxcert's side run once each, in this order, each in an "
        "empty Triton cache, all against the one triton.autotune run (default: NBXCERT_COMPILE_POOL as set)",
    )
    ap.add_argument("--peer", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        peer(args.peer)
        return
    families = parse_families(args.families)
    if args.keys < 1:
        raise SystemExit(f"bench_autotune: --keys {args.keys}: give at least 1 key per family")
    if importlib.util.find_spec("torch") is None:
        raise SystemExit(
            "bench_autotune: triton.autotune's side needs torch (and an NVIDIA GPU); torch is not importable"
        )
    from nbxcert.profiles import get_profile

    profile = get_profile(args.profile)
    plan = build_plan(args.workload, profile, families, args.keys, args.dtype)
    work = Path(tempfile.mkdtemp(prefix="nbx-autotune-"))
    keys_path = write_keys_file(plan, work / "keys.jsonl")
    print(f"{len(plan)} keys of {', '.join(families)} ({args.workload}, {args.dtype}); work in {work}", flush=True)
    pools = parse_pools(args.pools)
    runs = {}
    for pool in pools:
        runs[pool] = run_ours(profile.name, keys_path, work, pool)
        print(
            f"nbxcert certify{f' ({pool} pool)' if pool else ''}: {runs[pool]['wall_s']:.1f} s process wall", flush=True
        )
    theirs = run_peer(plan, work)
    result = compare(plan, runs[pools[0]], theirs)
    for line in table(result):
        print(line)
    others = {pool: compare(plan, runs[pool], theirs) for pool in pools[1:]}
    for pool, other in others.items():
        print(f"-- nbxcert with the {pool} compile pool, against the same triton.autotune run:")
        for line in table(other):
            print(line)
    if args.out:
        import common

        from nbxcert.crosspool import pool_kind

        info = {n: theirs.get(n) for n in ("gpu", "torch", "triton")}
        # the compile pool nbxcert's certify made (NBXCERT_COMPILE_POOL, passed on): on the GPU, or cross-compiling
        pool = pools[0] or pool_kind()  # as certify reads it (a bad value is refused there)
        head = {
            "workload": args.workload,
            "profile": profile.name,
            "dtype": args.dtype,
            "families": families,
            "compile_pool": pool,
            **info,
        }
        extra = {"other_pools": others} if others else {}
        common.write_json(args.out, {**head, **result, **extra})


if __name__ == "__main__":
    main()
