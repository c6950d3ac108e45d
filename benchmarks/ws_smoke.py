"""Each warp-specialized matmul candidate (WS=1) launched once on the GPU and checked against the float64 oracle,
before anything times or tests them in-process: a kernel whose producer and consumer warp groups never meet would
hang the process that launched it, so this runs first under a time limit (`gpu_check.sh`'s matmul sets), and what
follows leaves the WS candidates out when it did not pass.

    timeout 120 python3 benchmarks/ws_smoke.py [--shape 512x512x512]

Prints a line per candidate (float16: ok, or the mismatch report's first line, or the error) and exits 0 only when
every one matched.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="512x512x512", help="MxNxK")
    args = ap.parse_args(argv)
    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels.backends import cuda, select
    from nbxcert.kernels.check import all_ok, first_report, run_checked
    from nbxcert.profiles import match_nvidia

    choice = select()
    if choice.name != "cuda":
        raise SystemExit("ws_smoke needs the cuda backend (an NVIDIA GPU)")
    profile, _ = match_nvidia(cuda.device_info(0).compute_capability)
    m, n, k = (int(x) for x in args.shape.split("x"))
    problem = {"M": m, "N": n, "K": k, "trans_a": 0, "trans_b": 1, "aligned": 1}
    kept = set(mm.MATMUL.pruned_for(problem, profile).kept)
    failed = 0
    for config in mm.warp_specialized_configs():
        if config not in kept:
            print(f"pruned for {profile.key}: {config.label()}", flush=True)
            continue
        for dtype in ("float16",):  # a hang does not wait for a dtype; the GPU tests and the sweep judge the others
            try:
                verdicts = run_checked(mm.MATMUL, config, problem, (dtype, dtype), profile, 1, choice.device)
                line = "ok" if all_ok(verdicts) else first_report(verdicts).splitlines()[0]
                failed += not all_ok(verdicts)
            except Exception as e:  # reported by candidate: the point is to see each one's fate
                line, failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", failed + 1
            print(f"{dtype:9s} {config.label()}: {line}", flush=True)
    print(f"ws_smoke: {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
