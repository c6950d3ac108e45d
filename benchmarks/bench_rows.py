"""Row kernels on the GPU: the best candidate's effective bandwidth next to torch's and next to the device's copy
bandwidth, measured in the same run.

    python benchmarks/bench_rows.py --out rows.json

Cases (float16): rmsnorm, layernorm and softmax at 32768 x 5632; softmax at 4096 x 4096 and 1 x 256000. For each,
every candidate the device profile's prune keeps is timed (nbxcert's event timer, `do_bench_events`: an L2 flush
before each repetition, the median of the repetitions), the best is spot-checked against its float64 oracle on 256
sampled rows, and its effective bandwidth is (bytes read + bytes written, each tensor once) / time.

torch runs in its own process (`PEER_SCRIPT`, `subprocess.run([sys.executable, "-c", ...])`; nbxcert never imports
torch) with the same scheme (`triton.testing.do_bench`: L2 flush, median). The copy bandwidth is cuMemcpyDtoD of a
1 GiB buffer through `nbxcert.kernels.backends.cuda`, counted as bytes read + written, the median of 20 copies.

Targets (reported as met or not, never enforced by the exit code): rmsnorm and layernorm >= 1.0x torch, softmax >=
1.5x torch, and every row kernel >= 70% of the copy bandwidth on shapes of >= 64 MB.
"""

from __future__ import annotations

import sys

import common
import numpy as np

CASES = (
    ("rmsnorm", 32768, 5632),
    ("layernorm", 32768, 5632),
    ("softmax", 32768, 5632),
    ("softmax", 4096, 4096),
    ("softmax", 1, 256000),
)
SPEEDUP_TARGET = {"rmsnorm": 1.0, "layernorm": 1.0, "softmax": 1.5}
COPY_FRACTION_TARGET = 0.70
COPY_TARGET_MIN_BYTES = 64 * 10**6
ELEMENT = 2  # float16

PEER_SCRIPT = (
    common.PEER_HEAD
    + r"""
for name, rows, cols in cases:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    w = torch.randn(cols, device="cuda", dtype=torch.float16)
    b = torch.randn(cols, device="cuda", dtype=torch.float16)
    if name == "rmsnorm":
        fn = lambda: torch.nn.functional.rms_norm(x, (cols,), w, 1e-6)
    elif name == "layernorm":
        fn = lambda: torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5)
    else:
        fn = lambda: torch.softmax(x, dim=-1)
    ms = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    out[f"{name}:{rows}x{cols}"] = ms
"""
    + common.PEER_TAIL
)


def moved_bytes(name: str, rows: int, cols: int) -> int:
    """Bytes read + written once each: the input and the output, plus the weight (and bias) of a norm."""
    per_tensor = rows * cols * ELEMENT
    extra = {"rmsnorm": 1, "layernorm": 2}.get(name, 0) * cols * ELEMENT
    return 2 * per_tensor + extra


def spot_check(spec, config, inputs, profile, n_rows: int) -> str | None:
    """Launch `config` once on poisoned outputs and compare 256 sampled rows against the float64 oracle; None when
    they match, else the mismatch report."""
    from nbxcert.kernels.compare import compare, poison
    from nbxcert.oracles import rows as oracle

    out = inputs.tensors["y"]
    poison(out, out.dtype)
    spec.launch(config, inputs)
    picked = np.unique(np.random.default_rng(0).integers(0, n_rows, 256))
    x = inputs.tensors["x"].float64()[picked]
    if spec.name == "softmax":
        ref, err = oracle.softmax(x, float(np.float32(inputs.scalars["scale"])), "none")
    elif spec.name == "rmsnorm":
        ref, err = oracle.rmsnorm(x, inputs.tensors["weight"].float64(), float(np.float32(inputs.scalars["eps"])))
    else:
        t = inputs.tensors
        ref, err = oracle.layernorm(
            x, t["weight"].float64(), t["bias"].float64(), float(np.float32(inputs.scalars["eps"]))
        )
    verdict = compare(out.float64()[picked], ref, err, out.dtype, profile.tolerance("float16"), config.label())
    return None if verdict.ok else verdict.report


def main() -> int:
    args, cuda, profile, how, device_name, peer = common.start(__doc__, "bench_rows", PEER_SCRIPT, CASES)
    from nbxcert.kernels import rows

    copy_bw = common.copy_bandwidth(cuda)
    specs = {"rmsnorm": rows.RMSNORM, "layernorm": rows.LAYERNORM, "softmax": rows.SOFTMAX}

    results = []
    for name, n_rows, n_cols in CASES:
        spec = specs[name]
        problem = {"n_rows": n_rows, "n_cols": n_cols} | ({"mask": "none"} if name == "softmax" else {})
        dtypes = ("float16",) if name == "softmax" else ("float16", "float16")
        inputs = spec.make_inputs(problem, dtypes, 0, "cuda:0")

        def make_call(c, inputs=inputs, spec=spec):
            return common.call_all(_launches(rows, spec, c, inputs))

        timings = common.time_kept(spec, problem, profile, make_call, args.warmup, args.rep)
        best_ms, best = timings[0]
        moved = moved_bytes(name, n_rows, n_cols)
        torch_ms = peer.get("ms", {}).get(f"{name}:{n_rows}x{n_cols}")
        fields = common.bandwidth_fields(best_ms, best, moved, copy_bw, torch_ms)
        speedup, eff = fields["speedup_vs_torch"], fields["effective_GBps"] * 1e9
        big = moved / 2 >= COPY_TARGET_MIN_BYTES
        results.append(
            {
                "kernel": name,
                "shape": [n_rows, n_cols],
                "dtype": "float16",
                **fields,
                "speedup_target": SPEEDUP_TARGET[name],
                "meets_speedup_target": None if speedup is None else speedup >= SPEEDUP_TARGET[name],
                "copy_target_applies": big,
                "meets_copy_target": (eff / copy_bw >= COPY_FRACTION_TARGET) if big else None,
                "spot_check": spot_check(spec, best, inputs, profile, n_rows) or "ok",
                "candidates": common.candidate_times(timings),
            }
        )
        common.print_case(f"{name} {n_rows}x{n_cols}", timings, flush=True)

    common.print_opening(device_name, profile, how, peer, copy_bw)
    header = f"{'kernel':10s} {'shape':>13s} {'best us':>9s} {'GB/s':>7s} {'of copy':>8s} {'torch us':>9s} "
    header += f"{'x torch':>8s}  best config"
    print("\n".join(common.table_lines(header, results, row, check="spot_check")))
    targets = {
        "speedup_vs_torch": SPEEDUP_TARGET,
        "fraction_of_copy": COPY_FRACTION_TARGET,
        "fraction_of_copy_applies_from_bytes": COPY_TARGET_MIN_BYTES,
    }
    common.write_results(args.out, device_name, profile, how, peer, results, copy_bw, targets)
    return 0


def row(r: dict) -> str:
    """One case's line of the table ('!' after a copy fraction below its target)."""
    shape = f"{r['shape'][0]}x{r['shape'][1]}"
    t_us, sp = common.torch_cells(r["torch_ms"], r["speedup_vs_torch"])
    flag = "" if r["meets_speedup_target"] in (True, None) else " (below target)"
    copy = f"{100 * r['fraction_of_copy']:7.1f}%" + ("" if r["meets_copy_target"] in (True, None) else "!")
    return (
        f"{r['kernel']:10s} {shape:>13s} {r['best_ms'] * 1e3:9.1f} {r['effective_GBps']:7.0f} {copy:>8s} "
        f"{t_us} {sp}  {r['best_label']}{flag}"
    )


def _launches(rows, spec, config, inputs):
    """The kernel launches of one config, built once, so the timing holds the launches and nothing else."""
    t, s = inputs.tensors, inputs.scalars
    if spec.name == "softmax":
        return rows.softmax_launches(config, t["x"], t["y"], s["scale"], s["mask"], s["q_len"], None, t["workspace"])
    return rows.norm_launches(config, t["x"], None, t["weight"], t.get("bias"), t["y"], None, s["eps"], s["rms"])


if __name__ == "__main__":
    sys.exit(main())
