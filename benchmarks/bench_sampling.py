"""Sampling kernels on the GPU: the best candidate of every kept one against torch, measured in the same run.

    python benchmarks/bench_sampling.py --out sampling.json

Cases (float16, vocabulary rows of Llama 3's 128256 and Gemma's 256000 logits): argmax, topk (k 50 and 64),
log_softmax and cross_entropy at decode batches (1, 64 rows) and a training-sized cross_entropy (4096 rows). For each,
every candidate the device profile's prune keeps is timed (nbxcert's event timer, `do_bench_events`: an L2 flush
before each repetition, the median of the repetitions), the best is spot-checked against its float64 oracle on up to
64 sampled rows, and its effective bandwidth is (bytes read + bytes written, each tensor once) / time.

torch runs in its own process (`PEER_SCRIPT`, `subprocess.run([sys.executable, "-c", ...])`; nbxcert never imports
torch) with the same scheme (`triton.testing.do_bench`: L2 flush, median): torch.argmax, torch.topk,
torch.log_softmax and torch.nn.functional.cross_entropy(reduction="none"), each over the last dimension.
"""

from __future__ import annotations

import sys

import common
import numpy as np

CASES = (
    ("argmax", 1, 128256, 0),
    ("argmax", 64, 128256, 0),
    ("argmax", 1, 256000, 0),
    ("topk", 1, 128256, 50),
    ("topk", 64, 128256, 50),
    ("topk", 1, 256000, 64),
    ("log_softmax", 1, 256000, 0),
    ("log_softmax", 64, 128256, 0),
    ("cross_entropy", 64, 128256, 0),
    ("cross_entropy", 4096, 128256, 0),
)
ELEMENT = 2  # float16
SPOT_ROWS = 64

PEER_SCRIPT = (
    common.PEER_HEAD
    + r"""
for name, rows, cols, k in cases:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16) * 3
    t = torch.randint(0, cols, (rows,), device="cuda")
    if name == "argmax":
        fn = lambda: torch.argmax(x, dim=-1)
    elif name == "topk":
        fn = lambda: torch.topk(x, k, dim=-1)
    elif name == "log_softmax":
        fn = lambda: torch.log_softmax(x, dim=-1)
    else:
        fn = lambda: torch.nn.functional.cross_entropy(x, t, reduction="none")
    out[f"{name}:{rows}x{cols}:{k}"] = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
"""
    + common.PEER_TAIL
)


def moved_bytes(name: str, rows: int, cols: int, k: int) -> int:
    """Bytes read + written once each: the logits, plus each kernel's outputs (int64 indices, values, targets)."""
    read = rows * cols * ELEMENT
    written = {
        "argmax": rows * 8,
        "topk": rows * k * (8 + ELEMENT),
        "log_softmax": rows * cols * ELEMENT,
        "cross_entropy": rows * (8 + ELEMENT),
    }[name]
    return read + written


def spot_check(spec, config, inputs, profile) -> str | None:
    """Launch `config` once on poisoned outputs and compare up to SPOT_ROWS sampled rows of every output against the
    float64 oracle of those rows; None when they match, else the first mismatch report."""
    from nbxcert.kernels.compare import compare, poison
    from nbxcert.oracles import sampling as oracle

    t = inputs.tensors
    for name in inputs.outputs:
        poison(t[name], t[name].dtype)
    spec.launch(config, inputs)
    x = t["x"].float64()
    picked = np.unique(np.random.default_rng(0).integers(0, x.shape[0], SPOT_ROWS))
    x = x[picked]
    if spec.name == "argmax":
        refs = {"out": oracle.argmax(x)}
    elif spec.name == "topk":
        refs = oracle.topk(x, inputs.scalars["k"])
    elif spec.name == "log_softmax":
        refs = {"y": oracle.log_softmax(x)}
    else:
        target = t["target"].numpy()[picked]
        refs = {"loss": oracle.cross_entropy(x, target, inputs.scalars["ignore_index"])}
    for name, (ref, err) in refs.items():
        out = t[name]
        verdict = compare(out.float64()[picked], ref, err, out.dtype, profile.tolerance(out.dtype.name), config.label())
        if not verdict.ok:
            return verdict.report
    return None


def main() -> int:
    args, cuda, profile, how, device_name, peer = common.start(__doc__, "bench_sampling", PEER_SCRIPT, CASES)
    from nbxcert.kernels import sampling

    specs = {s.name: s for s in sampling.SPECS}

    results = []
    for name, n_rows, n_cols, k in CASES:
        spec = specs[name]
        problem = {"n_rows": n_rows, "n_cols": n_cols} | ({"k": k} if name == "topk" else {})
        inputs = spec.make_inputs(problem, spec.dtypes[0], 0, "cuda:0")  # float16 (argmax: + its int64 index)

        def make_call(c, inputs=inputs, spec=spec):
            return common.call_all(_launches(sampling, spec, c, inputs))

        timings = common.time_kept(spec, problem, profile, make_call, args.warmup, args.rep)
        best_ms, best = timings[0]
        moved = moved_bytes(name, n_rows, n_cols, k)
        torch_ms = peer.get("ms", {}).get(f"{name}:{n_rows}x{n_cols}:{k}")
        results.append(
            {
                "kernel": name,
                "shape": [n_rows, n_cols],
                "k": k or None,
                "dtype": "float16",
                **common.bandwidth_fields(best_ms, best, moved, None, torch_ms),
                "spot_check": spot_check(spec, best, inputs, profile) or "ok",
                "candidates": common.candidate_times(timings),
            }
        )
        common.print_case(f"{name} {n_rows}x{n_cols} k={k}", timings)

    common.print_opening(device_name, profile, how, peer)
    header = (
        f"{'kernel':14s} {'shape':>13s} {'k':>3s} {'best us':>9s} {'GB/s':>7s} {'torch us':>9s} {'x torch':>8s}  best"
    )
    print("\n".join(common.table_lines(header, results, row, check="spot_check")))
    common.write_results(args.out, device_name, profile, how, peer, results)
    return 0


def row(r: dict) -> str:
    """One case's line of the table."""
    shape = f"{r['shape'][0]}x{r['shape'][1]}"
    t_us, sp = common.torch_cells(r["torch_ms"], r["speedup_vs_torch"])
    return (
        f"{r['kernel']:14s} {shape:>13s} {r['k'] or '-':>3} {r['best_ms'] * 1e3:9.1f} {r['effective_GBps']:7.0f} "
        f"{t_us} {sp}  {r['best_label']}"
    )


def _launches(sampling, spec, config, inputs):
    """The kernel launches of one config, built once, so the timing holds the launches and nothing else. The inputs'
    workspace is sized for every candidate's split (`sampling.SMALLEST_CHUNK`)."""
    t, s = inputs.tensors, inputs.scalars
    ws = t["workspace"]
    if spec.name == "argmax":
        return sampling.argmax_launches(config, t["x"], t["out"], ws)
    if spec.name == "topk":
        return sampling.topk_launches(config, t["x"], s["k"], t["values"], t["indices"], ws)
    if spec.name == "log_softmax":
        return sampling.log_softmax_launches(config, t["x"], t["y"], ws)
    return sampling.cross_entropy_launches(config, t["x"], t["target"], t["loss"], s["ignore_index"], ws)


if __name__ == "__main__":
    sys.exit(main())
