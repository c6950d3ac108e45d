"""Quantized-weight products on the GPU: the best kept candidate against torch's own weight-only quantized kernel where
torch has one for the case, and against torch's matmul on the dequantized weight (the reference speed a quantized
kernel has to beat to be worth serving), all measured in the same run.

    python benchmarks/bench_quant.py --out quant.json

Cases (Llama-3-8B's 4096 x 4096 and 4096 x 14336 projections, both ways): dequant_gemv at M = 1 and 4,
dequant_matmul at M = 16 and 512, int4 (GPTQ, group 128) and int8 (per channel) with float16 activations, and int4
with bfloat16 activations at the 14336 x 4096 projection (every M), the one dtype torch's int4 kernel takes. For each,
every candidate the device profile's prune keeps is timed (nbxcert's event timer, `do_bench_events`: an L2 flush
before each repetition, the median), the best is checked against the float64 oracle (`nbxcert.oracles.quant`) on the
whole output, and its effective bandwidth is (quantized weight + scales + zeros + X + out bytes) / time.

torch runs in its own process (`PEER_SCRIPT`; nbxcert never imports torch), timed with `triton.testing.do_bench` (L2
flush, median), two peers per case:
- the quantized peer, where torch has one: int4 with bfloat16 activations, torch's tinygemm kernel
  (`torch.ops.aten._weight_int4pack_mm` on `_convert_weight_to_int4pack`'s layout; bfloat16 activations only, so the
  float16 int4 rows have none); int8, `torch.ops.aten._weight_int8pack_mm`. Its operands are the case's GPTQ / int8
  weight converted by `tinygemm_operands` / `int8pack_operands` (pure numpy, tested on the CPU), and its output is
  compared once with the float64 product of the oracle's dequantized weight (`quant_peer_check`), so a wrong layout
  shows as a large error rather than as a fast time. A peer torch lacks, or that raises, is recorded with its error.
- the dense peer: `x @ w` with w the [K, N] weight in the activations' dtype (the dequantized one's size and layout).
Speeds are the script's usual ratio: the peer's time / nbxcert's (above 1: nbxcert is faster).
"""

from __future__ import annotations

import inspect
import sys

import common
import numpy as np

CASES = (
    ("dequant_gemv", "int4", "float16", 1, 4096, 4096),
    ("dequant_gemv", "int4", "float16", 1, 14336, 4096),
    ("dequant_gemv", "int4", "bfloat16", 1, 14336, 4096),
    ("dequant_gemv", "int4", "float16", 1, 4096, 14336),
    ("dequant_gemv", "int4", "float16", 4, 14336, 4096),
    ("dequant_gemv", "int4", "bfloat16", 4, 14336, 4096),
    ("dequant_gemv", "int8", "float16", 1, 14336, 4096),
    ("dequant_matmul", "int4", "float16", 16, 4096, 4096),
    ("dequant_matmul", "int4", "float16", 16, 14336, 4096),
    ("dequant_matmul", "int4", "bfloat16", 16, 14336, 4096),
    ("dequant_matmul", "int4", "float16", 512, 14336, 4096),
    ("dequant_matmul", "int4", "bfloat16", 512, 14336, 4096),
    ("dequant_matmul", "int4", "float16", 512, 4096, 14336),
    ("dequant_matmul", "int8", "float16", 512, 14336, 4096),
)  # (kernel, format, activation dtype, M, N, K)

GROUP = 128  # the int4 group of nbxcert's kernels (kernels/quant.py)
# tinygemm's k-tiles per packed word group: 8 (16-byte loads), what gpt-fast and torchao use; needs K % 128 == 0
INNER_K_TILES = 8
TINYGEMM = "torch tinygemm int4 (_weight_int4pack_mm)"
INT8PACK = "torch int8 weight-only (_weight_int8pack_mm)"
SHORT = {TINYGEMM: "tinygemm", INT8PACK: "int8pack"}
# max |peer out - oracle| / max |oracle| above which the quantized peer's operands are taken as wrong: bfloat16 output
# and weight rounding stay near 2^-8 of the output's size; a wrong layout or zero point is of order 1
CHECK_LIMIT = 2e-2


def dense_peer(dtype: str) -> str:
    """The dense peer of a case with `dtype` activations."""
    return f"torch {dtype} matmul on the dequantized weight"


def quant_peer(fmt: str, dtype: str) -> tuple:
    """(the quantized peer torch has for a case, None where it has none; why none, else None)."""
    if fmt == "int8":
        return INT8PACK, None
    if dtype == "bfloat16":
        return TINYGEMM, None
    return None, "tinygemm takes bfloat16 activations only (the bfloat16 int4 rows)"


def case_key(fmt: str, dtype: str, m: int, n: int, k: int) -> str:
    """A case's key in the peer's answer."""
    return f"{fmt} {dtype} {m}x{n}x{k}"


def bfloat16_values(a):
    """`a` rounded to the nearest bfloat16 (ties to even), as float32 values every bfloat16 holds exactly."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def tinygemm_operands(qweight, scales, qzeros, group: int = 128):
    """nbxcert's GPTQ int4 weight (qweight int32 [K/8, N], scales [K/G, N], qzeros int32 [K/G, N/8]: formats in
    `nbxcert.oracles.quant`; W[k, n] = (q - z) s) as torch's tinygemm takes it: (uint8 [N, K/2], the input of
    `_convert_weight_to_int4pack`; float32 [K/G, N, 2] of bfloat16 values, `_weight_int4pack_mm`'s qScaleAndZeros).

    Read in PyTorch's aten/src/ATen/native/cuda/int4mm.cu: the packing op takes [n][k / 2] uint8 (torch >= 2.5; int32
    [n][k] before), the even k in the high nibble ("v[0]H" is k 0), as PyTorch's tests (`_group_quantize_tensor` in
    torch/testing/_internal/common_quantization.py) and torchao pack it: `w[:, ::2] << 4 | w[:, 1::2]`. The kernel
    reads a nibble u in 0..15 as u - 8 (0x4300 | u is bfloat16 128 + u, then - 136) and dequantizes with
    __hfma2(u - 8, scale, zero) in bfloat16, scale at [g][n][0] and zero at [g][n][1] (the code adds the zero; a
    comment there saying "- zero" is not what runs). So the nibbles stay GPTQ's q, and (q - 8) s + (8 - z) s =
    (q - z) s: scale = s, zero = (8 - z) s, each rounded once to bfloat16 (|error| <= 2^-8 of its size)."""
    qw = np.ascontiguousarray(qweight, dtype=np.int32).view(np.uint32)
    qz = np.ascontiguousarray(qzeros, dtype=np.int32).view(np.uint32)
    s = np.asarray(scales, dtype=np.float64)
    if qw.ndim != 2 or s.ndim != 2 or qz.ndim != 2:
        raise ValueError("tinygemm_operands: qweight, scales and qzeros must be 2-d")
    k, n = qw.shape[0] * 8, qw.shape[1]
    if k % group or s.shape != (k // group, n) or qz.shape != (k // group, n // 8) or n % 8:
        raise ValueError(
            f"tinygemm_operands: qweight [{k // 8}, {n}] needs scales [{k // group}, {n}] and qzeros "
            f"[{k // group}, {n // 8}] (K a multiple of {group}, N of 8), got {list(s.shape)} and {list(qz.shape)}"
        )
    q = np.empty((k, n), dtype=np.uint8)
    for i in range(8):
        q[i::8] = (qw >> np.uint32(4 * i)) & np.uint32(0xF)
    z = np.empty((k // group, n), dtype=np.float64)
    for i in range(8):
        z[:, i::8] = (qz >> np.uint32(4 * i)) & np.uint32(0xF)
    qt = q.T
    nibbles = np.ascontiguousarray((qt[:, 0::2] << np.uint8(4)) | qt[:, 1::2])
    scales_and_zeros = np.stack([bfloat16_values(s), bfloat16_values((8.0 - z) * s)], axis=-1)
    return nibbles, scales_and_zeros


def int8pack_operands(qweight, scales):
    """nbxcert's per-channel int8 weight (qweight int8 [K, N], scales [N]; W[k, n] = q[k, n] s[n]) as torch's
    `_weight_int8pack_mm(x, w, scales)` takes it: (int8 [N, K], float32 [N]). Read in PyTorch's
    aten/src/ATen/native/cuda/int8mm.cu: out[b, n] = sum_k x[b, k] w[n, k] * scale[n], N = w.size(0)."""
    q = np.asarray(qweight)
    if q.dtype != np.int8 or q.ndim != 2 or np.shape(scales) != (q.shape[1],):
        raise ValueError(f"int8pack_operands: qweight must be int8 [K, N] and scales [N], got {q.dtype}{list(q.shape)}")
    return np.ascontiguousarray(q.T), np.asarray(scales, dtype=np.float32)


# The peer's own code (after the shared head: torch, triton.testing, `cases`, `warmup`, `rep`, `out`), with the pure
# functions above copied in so both sides convert alike. Each case: the dense time; then the quantized peer's time on
# a random weight of the case's format and shape, converted as above, and its output against the float64 oracle.
PEER_BODY = r"""

def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def error_line(e):
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def dequantize(*args):
    from nbxcert.oracles.quant import dequantize as oracle  # numpy only; imported where the check runs

    return oracle(*args)


def quant_case(fmt, x, n, k, seed):
    # (one launch of torch's quantized peer on x, the float64 [K, N] weight it should compute with)
    gen = np.random.default_rng(seed)
    if fmt == "int4":
        qweight = gen.integers(0, 2**32, (k // 8, n), dtype=np.uint32).view(np.int32)
        qzeros = gen.integers(0, 2**32, (k // GROUP, n // 8), dtype=np.uint32).view(np.int32)
        scales = bfloat16_values(np.abs(gen.standard_normal((k // GROUP, n))) * 0.01 + 0.002)
        nibbles, scales_and_zeros = tinygemm_operands(qweight, scales, qzeros, GROUP)
        w = torch.ops.aten._convert_weight_to_int4pack(torch.from_numpy(nibbles).cuda(), INNER_K_TILES)
        sz = torch.from_numpy(scales_and_zeros).to(device="cuda", dtype=torch.bfloat16)
        return (lambda: torch.ops.aten._weight_int4pack_mm(x, w, GROUP, sz)), (
            lambda: dequantize("int4", qweight, scales, qzeros, GROUP)
        )
    qweight = gen.integers(-127, 128, (k, n), dtype=np.int8)
    w_nk, scales = int8pack_operands(qweight, np.abs(gen.standard_normal(n)) * 0.001 + 0.0005)
    w = torch.from_numpy(w_nk).cuda()
    s = torch.from_numpy(scales).to(device="cuda", dtype=x.dtype)
    return (lambda: torch.ops.aten._weight_int8pack_mm(x, w, s)), (
        lambda: dequantize("int8", qweight, s.double().cpu().numpy())
    )


def oracle_error(got, x, weight):
    ref = x.double() @ torch.from_numpy(weight).cuda()
    return float((got.double() - ref).abs().max() / ref.abs().max())


dense = {}
for seed, (kernel, fmt, dtype, m, n, k) in enumerate(cases):
    act = getattr(torch, dtype)
    x = torch.randn(m, k, device="cuda", dtype=act)
    if (dtype, m, n, k) not in dense:
        w = torch.randn(k, n, device="cuda", dtype=act) * 0.05
        dense[(dtype, m, n, k)] = time_ms(lambda: x @ w)
        del w
    row = {"dense_ms": dense[(dtype, m, n, k)]}
    if quant_peer(fmt, dtype)[0] is not None:
        try:
            fn, weight = quant_case(fmt, x, n, k, seed)
            row["quant_ms"] = time_ms(fn)
        except Exception as e:
            row["quant_error"] = error_line(e)
        else:
            try:
                row["quant_check"] = oracle_error(fn(), x, weight())
            except Exception as e:
                row["quant_check_error"] = error_line(e)
        fn = weight = None
    out[case_key(fmt, dtype, m, n, k)] = row
"""


def peer_script() -> str:
    """The torch peer's Python source: the shared head, this module's constants and pure functions, the body, the
    shared tail."""
    values = {"GROUP": GROUP, "INNER_K_TILES": INNER_K_TILES, "TINYGEMM": TINYGEMM, "INT8PACK": INT8PACK}
    constants = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    functions = (quant_peer, case_key, bfloat16_values, tinygemm_operands, int8pack_operands)
    sources = "\n\n".join(inspect.getsource(f) for f in functions)
    return common.PEER_HEAD + "import numpy as np\n" + constants + "\n\n" + sources + PEER_BODY + common.PEER_TAIL


PEER_SCRIPT = peer_script()


def moved_bytes(inputs) -> int:
    """Bytes read + written once each: every tensor of the launch (weights, scales, zeros, X and out)."""
    return sum(t.nbytes for t in inputs.tensors.values())


def peer_fields(fmt: str, dtype: str, best_ms: float, got: dict | None) -> dict:
    """What a case records of its peers, from the peer's answer for it (`got`; None where the peer did not run): each
    peer's name, time and speed (peer ms / best ms), the quantized peer's error or why there is none, its output's
    error against the oracle (or why unchecked), and `peer`, the peer of the case's headline speed (the quantized one
    where it gave a time)."""
    got = got or {}
    name, none_why = quant_peer(fmt, dtype)
    quant_ms = got.get("quant_ms") if name else None
    dense_ms = got.get("dense_ms")
    return {
        "peer": name if quant_ms else dense_peer(dtype),
        "quant_peer": name,
        "quant_peer_ms": quant_ms,
        "speedup_vs_quant_peer": quant_ms / best_ms if quant_ms else None,
        "quant_peer_none": none_why,
        "quant_peer_error": got.get("quant_error"),
        "quant_peer_check": got.get("quant_check"),
        "quant_peer_check_error": got.get("quant_check_error"),
        "dense_peer": dense_peer(dtype),
        "dense_peer_ms": dense_ms,
        "speedup_vs_dense_peer": dense_ms / best_ms if dense_ms else None,
    }


def main() -> int:
    args, cuda, profile, how, device_name, peer = common.start(__doc__, "bench_quant", PEER_SCRIPT, CASES)
    from nbxcert.kernels import quant

    specs = {s.name: s for s in quant.SPECS}

    results = []
    for name, fmt, dtype, m, n, k in CASES:
        spec = specs[name]
        problem = {"M": m, "N": n, "K": k, "format": fmt}
        inputs = spec.make_inputs(problem, (dtype,), 0, "cuda:0")
        t = inputs.tensors

        def call(config, t=t, name=name, fmt=fmt):
            launches = quant.quant_launches(
                config, name == "dequant_gemv", fmt, t["x"], t["qweight"], t["scales"], t.get("qzeros"), t["out"]
            )
            return common.call_all(launches)

        timings = common.time_kept(spec, problem, profile, call, args.warmup, args.rep, dtypes=(dtype,))
        best_ms, best = timings[0]
        verdict = common.check(spec, best, problem, (dtype,), profile, inputs)
        moved = moved_bytes(inputs)
        results.append(
            {
                "kernel": name,
                "format": fmt,
                "shape": {"M": m, "N": n, "K": k},
                "dtype": dtype,
                "bytes_moved": moved,
                "best_config": best.as_dict(),
                "best_label": best.label(),
                "best_ms": best_ms,
                "effective_GBps": moved / (best_ms * 1e-3) / 1e9,
                "TFLOPs": 2 * m * n * k / (best_ms * 1e-3) / 1e12,
                **peer_fields(fmt, dtype, best_ms, peer.get("ms", {}).get(case_key(fmt, dtype, m, n, k))),
                "check": verdict,
                "candidates": common.candidate_times(timings),
            }
        )
        common.print_case(f"{name} {fmt} {dtype} {m}x{n}x{k}", timings)

    common.print_opening(device_name, profile, how, peer)
    print("\n".join(table(results)))
    common.write_results(args.out, device_name, profile, how, peer, results)
    return 0


HEADER = (
    f"{'kernel':15s} {'fmt':4s} {'dtype':8s} {'M x N x K':>17s} {'best us':>9s} {'GB/s':>7s} {'q-peer':9s} "
    f"{'q-peer us':>9s} {'x q-peer':>8s} {'dense us':>9s} {'x dense':>8s}  best"
)


def row(r: dict) -> str:
    """One case's line of the table."""
    s = r["shape"]
    shape = f"{s['M']}x{s['N']}x{s['K']}"
    q_us, q_sp = common.torch_cells(r["quant_peer_ms"], r["speedup_vs_quant_peer"])
    d_us, d_sp = common.torch_cells(r["dense_peer_ms"], r["speedup_vs_dense_peer"])
    short = SHORT.get(r["quant_peer"], "-")
    return (
        f"{r['kernel']:15s} {r['format']:4s} {r['dtype']:8s} {shape:>17s} {r['best_ms'] * 1e3:9.1f} "
        f"{r['effective_GBps']:7.0f} {short:9s} {q_us} {q_sp} {d_us} {d_sp}  {r['best_label']}"
    )


def notes(r: dict) -> list[str]:
    """The lines under a case's row: its failed check, its quantized peer's error, and that peer's output unchecked or
    far from the oracle's."""
    lines = []
    if r["check"] != "ok":
        lines.append(f"  CHECK FAILED: {r['check'].splitlines()[0]}")
    short = SHORT.get(r["quant_peer"])
    if short and r["quant_peer_error"]:
        lines.append(f"  {short} failed: {r['quant_peer_error']}")
    if short and r["quant_peer_check_error"]:
        lines.append(f"  {short} output not checked: {r['quant_peer_check_error']}")
    check = r["quant_peer_check"]
    if short and check is not None and check > CHECK_LIMIT:
        lines.append(
            f"  {short} output off the oracle by {check:.2e} of its largest element (limit {CHECK_LIMIT:g}): "
            "operands or layout wrong, its time is not of this product"
        )
    return lines


def table(results: list[dict]) -> list[str]:
    """The printed table: header, rule, each case's row and notes, then what the peer columns are."""
    lines = [HEADER, "-" * len(HEADER)]
    for r in results:
        lines.append(row(r))
        lines.extend(notes(r))
    return lines + [
        "",
        f"q-peer: torch's quantized kernel for the case, - where it has none; tinygemm = {TINYGEMM}, bfloat16",
        f"        activations only; int8pack = {INT8PACK}",
        "dense: torch matmul on the dequantized weight, in the case's activation dtype (x @ w, w [K, N])",
        "x peer: the peer's time / nbxcert's best (above 1: nbxcert is faster)",
    ]


if __name__ == "__main__":
    sys.exit(main())
