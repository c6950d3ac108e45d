"""Vision kernels on the GPU: the best kept candidate of conv2d, group_norm and upsample_nearest2d against torch's
conv2d, group_norm (+ silu) and interpolate(mode="nearest"), measured in the same run.

    python benchmarks/bench_vision.py --out vision.json

Cases (float16, Stable Diffusion 1.5 at 512 x 512, batch 2 for classifier-free guidance): the UNet's 3x3 convs at
64 x 64 (320 channels) and 32 x 32 (640), the 1x1 shortcut 320 -> 640, the stride-2 downsampler, a 3x3 conv in nhwc
(channels_last); GroupNorm + SiLU at 64 x 64 x 320 and 32 x 32 x 640 and the VAE decoder's 512 x 512 x 128; the
nearest 2x upsamplers at 16 x 16 x 1280 and 32 x 32 x 640. For each, every candidate the device profile's prune keeps
is timed (nbxcert's event timer, `do_bench_events`: an L2 flush before each repetition, the median), the best is
checked against its float64 oracle (`nbxcert.oracles.vision`) on the whole output, and its rate is reported as
TFLOP/s (conv2d: 2 · N·OH·OW · K · C/groups·R·S) or effective bandwidth (bytes read + written, each tensor once).

torch runs in its own process (`PEER_SCRIPT`; nbxcert never imports torch): the same shapes and memory formats,
timed with `triton.testing.do_bench` (L2 flush, median).
"""

from __future__ import annotations

import sys

import common

CONV = "conv2d"
NORM = "group_norm"
UP = "upsample_nearest2d"
# (kernel, problem); problems as kernels/vision.py spells them
CASES = (
    (CONV, dict(batch=2, C=320, H=64, W=64, K=320, R=3, S=3, stride=1, padding=1, layout="nchw")),
    (CONV, dict(batch=2, C=640, H=32, W=32, K=640, R=3, S=3, stride=1, padding=1, layout="nchw")),
    (CONV, dict(batch=2, C=320, H=32, W=32, K=640, R=1, S=1, stride=1, padding=0, layout="nchw")),
    (CONV, dict(batch=2, C=640, H=32, W=32, K=640, R=3, S=3, stride=2, padding=1, layout="nchw")),
    (CONV, dict(batch=2, C=320, H=64, W=64, K=320, R=3, S=3, stride=1, padding=1, layout="nhwc")),
    (NORM, dict(batch=2, C=320, H=64, W=64, groups=32, silu=1, layout="nchw")),
    (NORM, dict(batch=2, C=640, H=32, W=32, groups=32, silu=1, layout="nchw")),
    (NORM, dict(batch=1, C=128, H=512, W=512, groups=32, silu=1, layout="nchw")),
    (UP, dict(batch=2, C=1280, H=16, W=16, scale_h=2, scale_w=2, layout="nchw")),
    (UP, dict(batch=2, C=640, H=32, W=32, scale_h=2, scale_w=2, layout="nchw")),
)

PEER_SCRIPT = (
    common.PEER_HEAD
    + r"""
import torch.nn.functional as F
for i, (name, p) in enumerate(cases):
    fmt = torch.channels_last if p["layout"] == "nhwc" else torch.contiguous_format
    x = torch.randn(p["batch"], p["C"], p["H"], p["W"], device="cuda", dtype=torch.float16).to(memory_format=fmt)
    if name == "conv2d":
        w = torch.randn(p["K"], p["C"], p["R"], p["S"], device="cuda", dtype=torch.float16).to(memory_format=fmt)
        b = torch.randn(p["K"], device="cuda", dtype=torch.float16)
        fn = lambda: F.conv2d(x, w, b, stride=p["stride"], padding=p["padding"])
    elif name == "group_norm":
        w = torch.randn(p["C"], device="cuda", dtype=torch.float16)
        b = torch.randn(p["C"], device="cuda", dtype=torch.float16)
        norm = lambda: F.group_norm(x, p["groups"], w, b, 1e-5)
        fn = (lambda: F.silu(norm())) if p["silu"] else norm
    else:
        fn = lambda: F.interpolate(x, scale_factor=(p["scale_h"], p["scale_w"]), mode="nearest")
    out[str(i)] = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
"""
    + common.PEER_TAIL
)


def full_problem(name: str, p: dict) -> dict:
    """The spec's whole problem: conv2d's defaults (dilation 1, groups 1, a bias) filled in."""
    if name == CONV:
        return dict(dict(dilation=1, groups=1, bias=1), **p)
    return dict(p)


def flops(name: str, p: dict) -> float | None:
    if name != CONV:
        return None
    oh = (p["H"] + 2 * p["padding"] - (p["R"] - 1) - 1) // p["stride"] + 1
    ow = (p["W"] + 2 * p["padding"] - (p["S"] - 1) - 1) // p["stride"] + 1
    return 2.0 * p["batch"] * oh * ow * p["K"] * p["C"] * p["R"] * p["S"]


def moved_bytes(inputs) -> int:
    """Bytes read + written once each: every tensor of the launch but the split workspace and the bits views."""
    skip = ("workspace", "x_bits", "out_bits")
    return sum(t.nbytes for name, t in inputs.tensors.items() if name not in skip)


def main() -> int:
    args, cuda, profile, how, device_name, peer = common.start(__doc__, "bench_vision", PEER_SCRIPT, CASES)
    from nbxcert.kernels import vision

    specs = {s.name: s for s in vision.SPECS}

    results = []
    for i, (name, p) in enumerate(CASES):
        spec = specs[name]
        problem = full_problem(name, p)
        inputs = spec.make_inputs(problem, ("float16",), 0, "cuda:0")
        timings = common.time_kept(
            spec,
            problem,
            profile,
            lambda c, inputs=inputs, spec=spec: lambda: spec.launch(c, inputs),
            args.warmup,
            args.rep,
        )
        best_ms, best = timings[0]
        verdict = common.check(spec, best, problem, ("float16",), profile, inputs)
        moved, work = moved_bytes(inputs), flops(name, p)
        torch_ms = peer.get("ms", {}).get(str(i))
        results.append(
            {
                "kernel": name,
                "problem": problem,
                "dtype": "float16",
                **common.bandwidth_fields(best_ms, best, moved, None, torch_ms),
                "TFLOPs": work / (best_ms * 1e-3) / 1e12 if work else None,
                "check": verdict,
                "candidates": common.candidate_times(timings),
            }
        )
        common.print_case(f"{name} {problem}", timings)

    common.print_opening(device_name, profile, how, peer)
    header = (
        f"{'kernel':19s} {'shape':>30s} {'best us':>9s} {'TFLOP/s':>8s} {'GB/s':>7s} {'torch us':>9s} {'x torch':>8s}"
    )
    print("\n".join(common.table_lines(header + "  best", results, row)))
    common.write_results(args.out, device_name, profile, how, peer, results)
    return 0


def row(r: dict) -> str:
    """One case's line of the table."""
    p = r["problem"]
    shape = f"{p['batch']}x{p['C']}x{p['H']}x{p['W']}" + (f"->{p['K']} {p['R']}x{p['S']}" if "K" in p else "")
    shape += f" {p['layout']}"
    tf = f"{r['TFLOPs']:8.1f}" if r["TFLOPs"] else f"{'-':>8s}"
    t_us, sp = common.torch_cells(r["torch_ms"], r["speedup_vs_torch"])
    return (
        f"{r['kernel']:19s} {shape:>30s} {r['best_ms'] * 1e3:9.1f} {tf} {r['effective_GBps']:7.0f} {t_us} {sp}  "
        f"{r['best_label']}"
    )


if __name__ == "__main__":
    sys.exit(main())
