"""nbxcert's sweep against Triton's own autotuner on the same keys and the same candidates, in one run: what a
certificate costs to make beside what autotuning the same space costs (target: nbxcert at least 3x faster).

For each key (matmul keys of a shipped workload, the tiled candidates the device file's prune keeps), in this order:
- nbxcert: `certify` of the keys into an empty directory with an empty Triton cache (parallel compile, every candidate
  checked against the float64 oracle at the bucket's smallest and largest member, screened, the fastest timed in
  full, the winner's reproducibility checked). Its wall time per key and in all.
- triton.autotune: a fresh process (with torch: the autotuner times through torch) with its own empty Triton cache,
  one `triton.autotune(configs=<the same candidates>, key=["M", "N", "K"])` over the same Triton kernel per key, the
  key's largest member launched once: compile + benchmark of every config, no correctness check.

    python3 benchmarks/bench_autotune.py --workload tinyllama-1.1b --out autotune.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pick_keys(workload: str, profile, count: int, dtype: str) -> list:
    from nbxcert.workload import load_workload, workload_keys

    keys = [k for k in workload_keys(load_workload(workload), profile, {"matmul"}) if k.dtypes[0] == dtype]
    # spread over the key list (decode sizes first, prefill rungs later in a workload's order)
    step = max(1, len(keys) // count)
    return keys[::step][:count]


def ours(keys, profile) -> dict:
    from nbxcert.certify import certify
    from nbxcert.keys import LaunchKey

    tiled = [LaunchKey("matmul_tiled", k.fields, k.dtypes) for k in keys]
    out = Path(tempfile.mkdtemp(prefix="nbx-autotune-"))
    t0 = time.perf_counter()
    report = certify(profile.name, tiled, out, force=True, modules=["autotune_specs"])
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "keys": [
            {"key": k.key, "status": k.status, "winner": k.winner, "seconds": k.seconds, "counts": k.counts}
            for k in report.keys
        ],
    }


def peer_plan(keys, profile) -> list[dict]:
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import key_problems

    spec = get_spec("matmul_tiled")
    plan = []
    for k in keys:
        problems = key_problems(spec, k, profile)
        kept_large = spec.prune(spec.candidates, problems["timing"], profile).kept
        kept_small = set(spec.prune(spec.candidates, problems["smallest"], profile).kept)
        kept = [c for c in kept_large if c in kept_small]
        p = problems["timing"]
        plan.append(
            {
                "key": k.text(),
                "M": p["M"],
                "N": p["N"],
                "K": p["K"],
                "dtype": k.dtypes[0],
                "configs": [
                    {"params": dict(c.params), "num_warps": c.num_warps, "num_stages": c.num_stages} for c in kept
                ],
            }
        )
    return plan


def peer(plan_path: str) -> None:
    """Runs in its own process: torch + triton.autotune over our tiled kernel."""
    import torch
    import triton
    from triton.runtime import driver

    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels.common import wrap_run

    driver.reset_active()  # Triton's own CUDA driver (nbxcert installed its torch-free one on import)
    plan = json.loads(Path(plan_path).read_text())
    results = []
    for item in plan:
        m, n, k = item["M"], item["N"], item["K"]
        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[item["dtype"]]
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=dt)
        w = torch.randn(n, k, device="cuda", dtype=dt)  # nn.Linear's weight; B = W^T, column-major
        out = torch.empty(m, n, device="cuda", dtype=dt)
        configs = []
        for c in item["configs"]:
            p = c["params"]
            block_k = p["K_BYTES"] // a.element_size()
            kw = {"BLOCK_M": p["BLOCK_M"], "BLOCK_N": p["BLOCK_N"], "BLOCK_K": block_k, "GROUP_M": p["GROUP_M"]}
            kw["EVEN_K"] = k % block_k == 0
            kw["RUN_M"], kw["RUN_N"] = wrap_run(m, p["BLOCK_M"], k), wrap_run(n, p["BLOCK_N"], k)  # strides of a, w.T
            configs.append(triton.Config(kw, num_warps=c["num_warps"], num_stages=c["num_stages"]))
        tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(mm._mm_tiled_kernel)

        def grid(meta, m=m, n=n):  # this key's sizes, bound now (the grid is called within this iteration)
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), 1)

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tuned[grid](
            a,
            w,
            out,
            out,
            m,
            n,
            k,
            0,
            k,
            1,
            0,
            1,
            k,
            0,
            n,
            1,
            0,
            0,
            0,
            1.0,
            0.0,
            HAS_BIAS=False,
            ACTIVATION="none",
            DOT_PRECISION="ieee",
            UPCAST=False,
        )
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        ref = a.float() @ w.float().T
        err = (out.float() - ref).abs().max().item()
        results.append(
            {
                "key": item["key"],
                "seconds": seconds,
                "configs": len(configs),
                "best": str(tuned.best_config),
                "max_abs_err_vs_fp32": err,
            }
        )
    print(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="tinyllama-1.1b")
    ap.add_argument("--profile", default="hopper")
    ap.add_argument("--keys", type=int, default=6, help="how many matmul keys of the workload")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--out", default="")
    ap.add_argument("--peer", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        peer(args.peer)
        return
    sys.path.insert(0, str(HERE))  # the sweep's workers import `autotune_specs` by name (spawn passes sys.path)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-ours-")
    import autotune_specs  # noqa: F401  (registers matmul_tiled here too)

    from nbxcert.profiles import get_profile

    profile = get_profile(args.profile)
    keys = pick_keys(args.workload, profile, args.keys, args.dtype)
    plan = peer_plan(keys, profile)
    ours_result = ours(keys, profile)
    plan_path = Path(tempfile.mkdtemp()) / "plan.json"
    plan_path.write_text(json.dumps(plan))
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton-peer-")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--peer", str(plan_path)], capture_output=True, text=True, env=env)
    peer_wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench_autotune: the triton.autotune process failed:\n{r.stderr[-3000:]}")
    peer_result = json.loads(r.stdout.strip().splitlines()[-1])
    rows = []
    for item, mine, theirs in zip(plan, ours_result["keys"], peer_result, strict=False):
        ours_s = mine["seconds"].get("total", float("nan"))
        rows.append(
            {
                "key": item["key"],
                "candidates": len(item["configs"]),
                "ours_s": ours_s,
                "autotune_s": theirs["seconds"],
                "ratio": theirs["seconds"] / ours_s,
                "ours": mine,
                "autotune": theirs,
            }
        )
        print(
            f"{item['key']}: {len(item['configs'])} candidates, nbxcert {ours_s:.2f} s "
            f"(status {mine['status']}), triton.autotune {theirs['seconds']:.2f} s, "
            f"x{theirs['seconds'] / ours_s:.2f}"
        )
    total_ours = sum(x["ours_s"] for x in rows)
    total_peer = sum(x["autotune_s"] for x in rows)
    print(
        f"total over {len(rows)} keys: nbxcert {total_ours:.1f} s (wall with worker start {ours_result['wall_s']:.1f}"
        f" s), triton.autotune {total_peer:.1f} s (process wall {peer_wall:.1f} s): x{total_peer / total_ours:.2f}"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"rows": rows, "ours_wall_s": ours_result["wall_s"], "peer_wall_s": peer_wall}, indent=1)
        )


if __name__ == "__main__":
    main()
