"""Host-side cost of a launch, on a machine with no GPU: the served path (a user-facing function: checks, the key,
the certified config looked up, the launch built) against the same launches made directly (`kernel[grid](...)` with
the arguments the served call built, captured once: what a caller of Triton pays) and against `spec.launch`, with
Triton's dispatch but no kernel run (the cross-compiling backend, `nbxcert.kernels.backends.cross`: Triton compiles
for sm_90, and each `kernel[grid](...)` goes through its dispatch, binding, specialisation and cache lookup, to the
cross driver's launcher, which runs nothing). What it leaves out, the C launcher and the driver call, is the same
for both paths, so the difference is the serving overhead (target: at most 2 us over the direct launch). The
certificates are the shipped `nvidia/hopper` ones, served as on an H200 of the 141GB class.

    python3 benchmarks/bench_host.py [--calls 3000] [--repeats 3] [--out host.json]

Cases (a tinyllama-1.1b decode step at batch 1, KV 1024, float16): rmsnorm and add_rmsnorm [1, 2048]; softmax
[1, 32000]; embedding of 1 id in [32000, 2048]; rope of 32 + 4 heads of 64; decode attention (max_len given, as a
serving loop knows it); silu_and_mul [1, 2 x 5632]; matmul 1 x 2048 @ 2048 x 2560 (weights transposed, as a linear
layer holds them). Times are per call, the median of --repeats runs of --calls calls each after 200 warm-up calls,
on the CPU it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402


def _cross_compiling() -> None:
    """Kernels compile for sm_90 and are dispatched, never run (the census workers' backend, in this process)."""
    os.environ.setdefault("NBXCERT_BACKEND", "interpreter")  # no GPU here: nothing must try libcuda
    from nbxcert.kernels.backends import cross

    cross.activate(cross.Target("cuda", 90, 32, "nvidia/hopper", 132))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    _cross_compiling()
    import numpy as np

    from nbxcert import serving
    from nbxcert.kernels import attention as at
    from nbxcert.kernels import elementwise as ew
    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels import rows
    from nbxcert.kernels.inputs import randn, rng
    from nbxcert.kernels.tensor import empty, from_numpy

    # the cross backend's stand-in device has no memory class: the H200's certificates are named
    serving.configure(dirs=[ROOT / "certificates"], certified_only=True, device=("hopper", "141GB"))
    gen = rng(0)
    f16 = ("float16", "float16")
    x = randn(gen, (1, 2048), "float16", "cpu")
    w = randn(gen, (2048,), "float16", "cpu")
    y = empty((1, 2048), "float16", "cpu")
    xs = randn(gen, (1, 2 * 5632), "float16", "cpu")
    ys = empty((1, 5632), "float16", "cpu")
    a = randn(gen, (1, 2048), "float16", "cpu")
    b = randn(gen, (2560, 2048), "float16", "cpu").T
    c = empty((1, 2560), "float16", "cpu")
    # the rest of a decode step's launches (batch 1, KV 1024): their served paths (decode attention with the max_len a
    # serving loop knows, so it reads nothing to the host and replays a launch plan)
    r = randn(gen, (1, 2048), "float16", "cpu")
    s_out = empty((1, 2048), "float16", "cpu")
    logits, probs = randn(gen, (1, 32000), "float16", "cpu"), empty((1, 32000), "float16", "cpu")
    table, ids, emb = randn(gen, (32000, 2048), "float16", "cpu"), from_numpy(np.array([7]), "int32", "cpu"), y
    q, kq = randn(gen, (1, 32, 64), "float16", "cpu"), randn(gen, (1, 4, 64), "float16", "cpu")
    positions = from_numpy(np.array([1000]), "int32", "cpu")
    cos_sin = from_numpy(ew.rope_cache(64), "float32", "cpu")
    kc, vc = randn(gen, (1, 4, 1024, 64), "float16", "cpu"), randn(gen, (1, 4, 1024, 64), "float16", "cpu")
    lengths, att = from_numpy(np.array([1024]), "int32", "cpu"), empty((1, 32, 64), "float16", "cpu")
    ws = at.decode_workspace(1, 32, 64, "cpu")
    decode = {"batch": 1, "heads": 32, "kv_heads": 4, "head_dim": 64, "kv_len": 1024}
    cases = [
        ("rmsnorm", lambda: rows.rmsnorm(x, w, 1e-6, out=y), rows.RMSNORM, {"n_rows": 1, "n_cols": 2048}, f16),
        (
            "add_rmsnorm",
            lambda: rows.add_rmsnorm(x, r, w, 1e-6, out=y, out_sum=s_out),
            rows.ADD_RMSNORM,
            {"n_rows": 1, "n_cols": 2048},
            f16,
        ),
        (
            "softmax",
            lambda: rows.softmax(logits, out=probs),
            rows.SOFTMAX,
            {"n_rows": 1, "n_cols": 32000, "mask": "none"},
            ("float16",),
        ),
        (
            "embedding",
            lambda: ew.embedding(table, ids, out=emb),
            ew.EMBEDDING,
            {"n_tokens": 1, "dim": 2048},
            ("float16", "int32"),
        ),
        (
            "rope",
            lambda: ew.rope(q, kq, positions, cos_sin),
            ew.ROPE,
            ew.rope_problem(q, kq, positions, cos_sin, None, "neox"),
            ("float16",),
        ),
        (
            "decode_attention",
            lambda: at.decode_attention(q, kc, vc, lengths, att, workspace=ws, max_len=1024),
            at.DECODE_ATTENTION,
            decode,
            ("float16",),
        ),
        (
            "silu_and_mul",
            lambda: ew.silu_and_mul(xs, out=ys),
            ew.SILU_AND_MUL,
            ew.silu_and_mul_problem(xs),
            ("float16",),
        ),
        ("matmul", lambda: mm.matmul(a, b, out=c), mm.MATMUL, mm._problem_matmul(a, b), f16),
    ]

    results = []
    for name, served_call, spec, problem, dtypes in cases:
        config = serving.config_for(spec, problem, dtypes)
        inputs = spec.make_inputs(problem, dtypes, 0, "cpu")
        paths = {
            "served": served_call,
            "direct": lambda spec=spec, config=config, inputs=inputs: spec.launch(config, inputs),
            "raw": common.replay(common.capture_launches(served_call)),
        }
        runs = common.interleaved_us(paths, args.calls, args.repeats)
        served, direct, raw = (statistics.median(runs[p]) for p in ("served", "direct", "raw"))
        results.append(
            {
                "kernel": name,
                "problem": problem,
                "config": config.label(),
                "served_us": served,
                "direct_us": direct,
                "raw_us": raw,
                "overhead_us": served - raw,
                "overhead_vs_direct_us": served - direct,
            }
        )
        print(
            f"{name:13s} served {served:6.1f} us  raw {raw:6.1f} us  overhead {served - raw:5.1f} us  "
            f"(spec.launch {direct:6.1f} us; {config.label()})"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"calls": args.calls, "cases": results, "target_us": 2.0}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
