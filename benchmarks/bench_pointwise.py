"""Pointwise ops on the GPU as an application calls them: `nbxcert.ops.<op>(...)`, the output allocated by the call,
next to the same torch op in eager mode and to the device's copy bandwidth, measured in the same run.

    python benchmarks/bench_pointwise.py --out pointwise.json [--ops exp,add,...] [--rows 8192] [--half bfloat16]
        [--rounds 3]

Every case reads and writes tensors of at least 64 MB ([8192, 4096] by default: float16 64 MiB, float32 and int32 128
MiB): each op of `nbxcert.ops`'s pointwise library on float16 (`--half bfloat16`: on bfloat16; float32 for the casts'
source and the float division modes, int32 for the bitwise and shift ops, bool for the logical ops and conditions),
dense operands of the output's shape (twice the rows where a tensor would be half a float16 one's size: a bool operand
or result, glu's half-width result, so every tensor is at least 64 MiB; `case_rows`); and four cases of views a model
makes (`add_row_bias`: a [4096] bias added to every row; `mul_col_scale`: a [rows, 1] scale; `add_sliced_rows`,
`silu_sliced_rows`: the first 4096 columns of rows 4224 long, as the q part of a fused projection's output). The served
call is timed whole (`time_events` ungated: the host's work for each call is inside the timed span, as torch's is in
`triton.testing.do_bench`), an L2 flush before each repetition, the median taken; the first call (which makes the key's
plan, and sweeps it at run time where no certificate covers it) is not timed. Each side times every case once a round,
`--rounds` rounds one after another (default 3), and gives a case the median of its rounds: one run of the same op at
the same config measured 30.2 and 73.1 us (isinf), 33.3 and 58.5 (glu) on 2026-12-05, a slow spell that one timing of
each case cannot tell from the op. Effective bandwidth = bytes of every operand read + the output written, once each.
torch runs in its own process (`PEER_SCRIPT`; nbxcert never imports torch) with `triton.testing.do_bench` on the same
expression written with torch's names, on inputs of the same shapes and dtypes. The copy bandwidth is cuMemcpyDtoD of a
1 GiB buffer (`common.copy_bandwidth`).

Targets per op: effective bandwidth at least 85% of the copy bandwidth, and at least 1.0x torch's speed.
"""

from __future__ import annotations

import argparse
import sys

import common

from nbxcert.oracles import pointwise as pointwise_ops

# (op, inputs as (dtype, values), nbxcert call on ops and the inputs, torch expression on x, y, z)
# values: "normal" N(0, 1); "positive" |N(0, 1)| + 0.5; "unit" U(0, 1); "int" integers in [-1000, 1000];
# "shift" integers in [0, 31]; "bool" fair coin
H = "float16"  # the half-precision type of the cases (--half bfloat16 for the other)
UNARY = list(pointwise_ops.GROUPS["unary"])  # every unary op of the library, as its oracle module lists them
POSITIVE = {"log", "log2", "log1p", "sqrt", "rsqrt"}
ACTIVATIONS = ["relu", "silu", "mish", "elu", "celu", "selu", "leaky_relu", "hardsigmoid", "hardswish", "softplus"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "atan2", "hypot", "remainder", "fmod"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
BITWISE = ["bitwise_and", "bitwise_or", "bitwise_xor"]
LOGICAL = ["logical_and", "logical_or", "logical_xor"]


def _cases(H: str = H) -> list[tuple]:  # noqa: N803 - the cases' one letter for their half type
    cases = []
    for op in UNARY:
        cases.append((op, ((H, "positive" if op in POSITIVE else "normal"),), f"ops.{op}(x)", f"torch.{op}(x)"))
    for op in ACTIVATIONS:
        cases.append((op, ((H, "normal"),), f"ops.{op}(x)", f"F.{op}(x)"))
    cases += [
        ("gelu", ((H, "normal"),), "ops.gelu(x)", "F.gelu(x)"),
        ("gelu_tanh", ((H, "normal"),), "ops.gelu(x, approximate='tanh')", "F.gelu(x, approximate='tanh')"),
        ("log_sigmoid", ((H, "normal"),), "ops.log_sigmoid(x)", "F.logsigmoid(x)"),
        ("threshold", ((H, "normal"),), "ops.threshold(x, 0.1, 20.0)", "F.threshold(x, 0.1, 20.0)"),
        ("glu", ((H, "normal"),), "ops.glu(x)", "F.glu(x)"),
        ("isnan", ((H, "normal"),), "ops.isnan(x)", "torch.isnan(x)"),
        ("isinf", ((H, "normal"),), "ops.isinf(x)", "torch.isinf(x)"),
        ("isfinite", ((H, "normal"),), "ops.isfinite(x)", "torch.isfinite(x)"),
        ("nan_to_num", ((H, "normal"),), "ops.nan_to_num(x)", "torch.nan_to_num(x)"),
        ("clamp", ((H, "normal"),), "ops.clamp(x, -0.5, 0.5)", "torch.clamp(x, -0.5, 0.5)"),
        ("logical_not", (("bool", "bool"),), "ops.logical_not(x)", "torch.logical_not(x)"),
        ("bitwise_not", (("int32", "int"),), "ops.bitwise_not(x)", "torch.bitwise_not(x)"),
    ]
    for op in BINARY:
        cases.append((op, ((H, "normal"), (H, "positive")), f"ops.{op}(x, y)", f"torch.{op}(x, y)"))
    cases += [
        ("div", ((H, "normal"), (H, "positive")), "ops.div(x, y)", "torch.div(x, y)"),
        (
            "div_trunc",
            (("float32", "normal"), ("float32", "positive")),
            "ops.div(x, y, rounding_mode='trunc')",
            "torch.div(x, y, rounding_mode='trunc')",
        ),
        (
            "div_floor",
            (("float32", "normal"), ("float32", "positive")),
            "ops.div(x, y, rounding_mode='floor')",
            "torch.div(x, y, rounding_mode='floor')",
        ),
        ("pow", ((H, "positive"), (H, "normal")), "ops.pow(x, y)", "torch.pow(x, y)"),
        ("add_scalar", ((H, "normal"),), "ops.add(x, 2.5)", "torch.add(x, 2.5)"),
        ("lerp", ((H, "normal"), (H, "normal"), (H, "unit")), "ops.lerp(x, y, z)", "torch.lerp(x, y, z)"),
        (
            "addcmul",
            ((H, "normal"), (H, "normal"), (H, "normal")),
            "ops.addcmul(x, y, z, value=0.5)",
            "torch.addcmul(x, y, z, value=0.5)",
        ),
        (
            "addcdiv",
            ((H, "normal"), (H, "normal"), (H, "positive")),
            "ops.addcdiv(x, y, z, value=0.5)",
            "torch.addcdiv(x, y, z, value=0.5)",
        ),
        ("where", (("bool", "bool"), (H, "normal"), (H, "normal")), "ops.where(x, y, z)", "torch.where(x, y, z)"),
        (
            "masked_fill",
            ((H, "normal"), ("bool", "bool")),
            "ops.masked_fill(x, y, 0.0)",
            "torch.masked_fill(x, y, 0.0)",
        ),
    ]
    for op in COMPARE:
        cases.append((op, ((H, "normal"), (H, "normal")), f"ops.{op}(x, y)", f"torch.{op}(x, y)"))
    for op in BITWISE:
        cases.append((op, (("int32", "int"), ("int32", "int")), f"ops.{op}(x, y)", f"torch.{op}(x, y)"))
    for op in ("bitwise_left_shift", "bitwise_right_shift"):
        cases.append((op, (("int32", "int"), ("int32", "shift")), f"ops.{op}(x, y)", f"torch.{op}(x, y)"))
    for op in LOGICAL:
        cases.append((op, (("bool", "bool"), ("bool", "bool")), f"ops.{op}(x, y)", f"torch.{op}(x, y)"))
    short = {"float16": "f16", "bfloat16": "bf16"}[H]
    # views as a model makes them: a bias row and a per-row scale broadcast, a slice of a wider buffer (the q part
    # of a fused projection's rows) as an operand of a binary and of a unary op
    cases += [
        ("add_row_bias", ((H, "normal"), (H, "row")), "ops.add(x, y)", "torch.add(x, y)"),
        ("mul_col_scale", ((H, "normal"), (H, "col")), "ops.mul(x, y)", "torch.mul(x, y)"),
        ("add_sliced_rows", ((H, "normal"), (H, "sliced")), "ops.add(x, y)", "torch.add(x, y)"),
        ("silu_sliced_rows", ((H, "sliced"),), "ops.silu(x)", "F.silu(x)"),
    ]
    cases += [
        # torch.clone keeps a dense view's strides (a copy in storage order); contiguous() of it is the transpose
        ("copy_transposed", ((H, "normal"),), "ops.clone(x.T)", "x.T.clone()"),
        (
            "contiguous_transposed",
            ((H, "normal"),),
            "ops.clone(x.T, memory_format='contiguous_format')",
            "x.T.contiguous()",
        ),
        (f"cast_f32_to_{short}", (("float32", "normal"),), f"ops.to(x, '{H}')", f"x.to(torch.{H})"),
        (f"cast_{short}_to_f32", ((H, "normal"),), "ops.to(x, 'float32')", "x.to(torch.float32)"),
        (
            "full",
            (),
            f"ops.full(SHAPE, 1.5, dtype='{H}', device=DEVICE)",
            f"torch.full(SHAPE, 1.5, dtype=torch.{H}, device='cuda')",
        ),
        (
            "zeros",
            (),
            f"ops.zeros(SHAPE, dtype='{H}', device=DEVICE)",
            f"torch.zeros(SHAPE, dtype=torch.{H}, device='cuda')",
        ),
        (
            "arange",
            (),
            "ops.arange(NUMEL, dtype='float32', device=DEVICE)",
            "torch.arange(NUMEL, dtype=torch.float32, device='cuda')",
        ),
        (
            "linspace",
            (),
            "ops.linspace(0.0, 1.0, NUMEL, dtype='float32', device=DEVICE)",
            "torch.linspace(0.0, 1.0, NUMEL, dtype=torch.float32, device='cuda')",
        ),
    ]
    return cases


CASES = _cases()
PEER_SCRIPT = (
    common.PEER_HEAD
    + r"""
import torch.nn.functional as F
import statistics
rows, rounds = int(sys.argv[4]), int(sys.argv[5])
SHAPE, NUMEL = (rows, 4096), rows * 4096
SLICE_PAD = int(sys.argv[6])
DT = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "int32": torch.int32,
    "bool": torch.bool,
}

def make(dtype, values):
    if values == "row":
        return torch.randn(SHAPE[1], device="cuda").to(DT[dtype])
    if values == "col":
        return torch.randn(SHAPE[0], 1, device="cuda").to(DT[dtype])
    if values == "sliced":
        return torch.randn(SHAPE[0], SHAPE[1] + SLICE_PAD, device="cuda").to(DT[dtype])[:, : SHAPE[1]]
    if values == "bool":
        return torch.rand(SHAPE, device="cuda") < 0.5
    if values == "int":
        return torch.randint(-1000, 1001, SHAPE, device="cuda", dtype=DT[dtype])
    if values == "shift":
        return torch.randint(0, 32, SHAPE, device="cuda", dtype=DT[dtype])
    if values == "unit":
        return torch.rand(SHAPE, device="cuda").to(DT[dtype])
    t = torch.randn(SHAPE, device="cuda")
    return (t.abs() + 0.5 if values == "positive" else t).to(DT[dtype])

fns = []
for i, (name, spec, expr, case_rows) in enumerate(cases):
    SHAPE, NUMEL = (case_rows, 4096), case_rows * 4096  # read by make() and the expression
    x, y, z = [make(d, v) for d, v in spec] + [None] * (3 - len(spec))
    fns.append(eval("lambda: " + expr, {**globals(), "x": x, "y": y, "z": z}))
# every case once a round, the rounds one after another (as nbxcert's side runs them); each case's median of its rounds
more["rounds_ms"] = {str(i): [] for i in range(len(cases))}
for r in range(rounds):
    for i, fn in enumerate(fns):
        more["rounds_ms"][str(i)].append(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
out.update({i: statistics.median(v) for i, v in more["rounds_ms"].items()})
"""
    + common.PEER_TAIL
)


def make_input(gen, dtype: str, values: str, shape, device: str):
    """One operand as the peer makes its own (the same distribution, not the same values): of `shape`, or a view of
    it (`row`: a [cols] bias, `col`: a [rows, 1] scale, `sliced`: the first cols of rows SLICE_PAD longer)."""
    import numpy as np

    from nbxcert.kernels.tensor import from_numpy

    if values in ("row", "col", "sliced"):
        rows, cols = shape
        made = {"row": (cols,), "col": (rows, 1), "sliced": (rows, cols + SLICE_PAD)}[values]
        t = from_numpy(gen.standard_normal(made).astype(np.float32), dtype, device)
        return t[:, :cols] if values == "sliced" else t
    if values == "bool":
        return from_numpy(gen.random(shape) < 0.5, "bool", device)
    if values in ("int", "shift"):
        low, high = (-1000, 1001) if values == "int" else (0, 32)
        return from_numpy(gen.integers(low, high, shape).astype(np.int32), dtype, device)
    if values == "unit":
        return from_numpy(gen.random(shape).astype(np.float32), dtype, device)
    t = gen.standard_normal(shape).astype(np.float32)
    return from_numpy(np.abs(t) + 0.5 if values == "positive" else t, dtype, device)


SLICE_PAD = 128  # elements a `sliced` operand's rows run past the columns read (its rows do not merge)
# the cases with a tensor of half the bytes of a float16 one at the same rows: a bool operand or result, glu's
# half-width result
HALF_SIZED = {"glu", "isnan", "isinf", "isfinite", "logical_not", *COMPARE, *LOGICAL}


def case_rows(name: str, spec, rows: int) -> int:
    """The rows of a case: twice `rows` where a tensor of it would otherwise be half a float16 one's size (a bool
    operand or result, glu's result), so every tensor is at least 64 MiB at the default 8192."""
    return 2 * rows if name in HALF_SIZED or any(dtype == "bool" for dtype, _ in spec) else rows


def moved_bytes(inputs, result) -> int:
    return sum(t.nbytes for t in inputs) + result.nbytes


def _spread(rounds: list[float]) -> float:
    """The rounds' relative spread: (slowest - fastest) / fastest (0 for fewer than two)."""
    return (max(rounds) - min(rounds)) / min(rounds) if len(rounds) > 1 and min(rounds) > 0 else 0.0


def tie(ours: list[float], theirs: list[float], speedup: float | None) -> tuple[float | None, bool]:
    """(the run's noise for a case, whether its miss against torch is within it). The noise is the larger relative
    spread of either side's rounds (None without two rounds of each); a speedup under 1.0 that the noise covers is a
    tie this run cannot tell from parity. The target still counts it missed."""
    if min(len(ours), len(theirs)) < 2:
        return None, False
    noise = max(_spread(ours), _spread(theirs))
    return noise, bool(speedup is not None and speedup < 1.0 and speedup * (1.0 + noise) >= 1.0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--ops", help="comma-separated case names (default: all)")
    parser.add_argument("--rows", type=int, default=8192, help="rows of 4096 elements per tensor (default 8192)")
    parser.add_argument("--warmup", type=float, default=25.0, help="warm-up ms per timing (default 25)")
    parser.add_argument("--rep", type=float, default=100.0, help="timed ms per timing (default 100)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of every case, each side; a case's figure is its rounds' median"
    )
    parser.add_argument("--no-torch", action="store_true", help="skip the torch peer")
    parser.add_argument(
        "--half", default="float16", choices=("float16", "bfloat16"), help="the cases' half type (default float16)"
    )
    args = parser.parse_args(argv)
    cases = _cases(args.half)
    chosen = [c for c in cases if not args.ops or c[0] in args.ops.split(",")]
    if not chosen:
        raise SystemExit(f"no case named in --ops; cases: {', '.join(c[0] for c in cases)}")
    found = common.gpu_profile("bench_pointwise")
    if found is None:
        return 2
    cuda, profile, how = found
    import statistics

    from nbxcert import ops
    from nbxcert.kernels.backends.triton_cuda import time_events
    from nbxcert.kernels.inputs import rng

    peer = {"ms": {}}
    if not args.no_torch:
        peer_cases = [[name, list(spec), expr, case_rows(name, spec, args.rows)] for name, spec, _, expr in chosen]
        extra = [str(args.rows), str(args.rounds), str(SLICE_PAD)]
        peer = common.torch_peer(PEER_SCRIPT, peer_cases, args.warmup, args.rep, extra=extra)
    gen = rng(0)
    prepared = []
    for name, spec, call, _ in chosen:
        rows = case_rows(name, spec, args.rows)
        shape, numel = (rows, 4096), rows * 4096
        tensors = [make_input(gen, dtype, values, shape, "cuda:0") for dtype, values in spec]
        x, y, z = (tensors + [None, None, None])[:3]
        fn = eval(
            "lambda: " + call, {"ops": ops, "x": x, "y": y, "z": z, "SHAPE": shape, "NUMEL": numel, "DEVICE": "cuda:0"}
        )
        result = fn()  # the first call: plan made (and the key swept at run time where no certificate covers it)
        prepared.append((tensors, fn, result))
    # every case once a round, the rounds one after another: a slow spell of the machine reaches one round of many
    # cases, not every repetition of one; a case's figure is the median of its rounds' medians
    rounds_ms, copy_rounds = [[] for _ in prepared], []
    for _ in range(args.rounds):
        copy_rounds.append(common.copy_bandwidth(cuda))  # the copy's figure moves between runs too (3835-4089 GB/s)
        for i, (_, fn, _) in enumerate(prepared):
            rounds_ms[i].append(statistics.median(time_events(fn, args.warmup, args.rep, gated=False).times_ms))
    copy_bw = statistics.median(copy_rounds)
    results, met, tied = [], 0, 0
    for i, (name, spec, call, _) in enumerate(chosen):
        tensors, fn, result = prepared[i]
        ms = statistics.median(rounds_ms[i])
        moved = moved_bytes(tensors, result)
        eff = moved / (ms * 1e-3)
        torch_ms = peer.get("ms", {}).get(str(i))
        speedup = torch_ms / ms if torch_ms else None
        ok = eff >= 0.85 * copy_bw and (speedup is None or speedup >= 1.0)
        met += ok
        noise, within_noise = tie(rounds_ms[i], peer.get("rounds_ms", {}).get(str(i)) or [], speedup)
        tied += within_noise
        results.append(
            {
                "op": name,
                "call": call,
                "inputs": [list(s) for s in spec],
                "result_dtype": result.dtype.name,
                "bytes_moved": moved,
                "ms": ms,
                "rounds_ms": rounds_ms[i],
                "torch_rounds_ms": peer.get("rounds_ms", {}).get(str(i)),
                "effective_GBps": eff / 1e9,
                "fraction_of_copy": eff / copy_bw,
                "torch_ms": torch_ms,
                "speedup_vs_torch": speedup,
                "met": ok,
                "noise": noise,
                "below_torch_within_noise": within_noise,
            }
        )
        t_cell = f"{torch_ms * 1e3:9.1f}" if torch_ms else f"{'-':>9s}"
        s_cell = f"{speedup:6.2f}x" if speedup else f"{'-':>7s}"
        print(
            f"{name:20s} {ms * 1e3:9.1f} us {eff / 1e9:7.0f} GB/s {100 * eff / copy_bw:6.1f}% of copy  torch "
            f"{t_cell} us {s_cell}  {'met' if ok else 'missed'}{' (within the rounds spread)' if within_noise else ''}",
            flush=True,
        )
    print(
        f"\ncopy bandwidth {copy_bw / 1e9:.0f} GB/s; targets met at {met} of {len(results)} ops; below 1.0x torch "
        f"by no more than the rounds' spread: {tied}"
    )
    common.write_results(
        args.out,
        cuda.device_info(0).name,
        profile,
        how,
        peer,
        results,
        copy_bw,
        targets={
            "fraction_of_copy": 0.85,
            "speedup_vs_torch": 1.0,
            "met": met,
            "of": len(results),
            "below_torch_within_noise": tied,
        },
        extra={"rounds": args.rounds, "copy_rounds_GBps": [c / 1e9 for c in copy_rounds]},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
