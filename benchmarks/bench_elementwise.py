"""Element-wise kernels on the GPU: the best candidate's effective bandwidth next to torch's and next to the device's
copy bandwidth, measured in the same run.

    python benchmarks/bench_elementwise.py --out elementwise.json

Cases (float16 unless named; sizes of a 16384-token prefill, every one at least 64 MB): silu_and_mul [16384, 2 x
5632] -> [16384, 5632]; gelu (tanh) [16384, 4096]; add (dense + dense) and mul (dense x a broadcast row) [16384,
4096]; cast float16 -> float32 [16384, 4096]; rope (neox, 32 query and 8 key heads of 128, in place, positions per
token, q and k slices of one fused qkv tensor as vLLM has them) over 16384 tokens; embedding (16384 int64 ids into the
table `make_inputs` makes, `elementwise.EMBEDDING_VOCAB` rows of 4096). For each, every candidate the device
profile's prune keeps is timed (nbxcert's event timer, `do_bench_events`: an L2 flush before each repetition, the
median of the repetitions) and the best is checked against its float64 oracle on the same inputs. Effective bandwidth
= bytes read + bytes written, each tensor once (`moved_bytes`: for embedding only the gathered rows of the table, for
rope q and k read and written plus each token's cos/sin row).

torch runs in its own process (`PEER_SCRIPT`; nbxcert never imports torch) with `triton.testing.do_bench` (L2 flush,
median): `F.silu(x[:, :d]) * x[:, d:]`, `F.gelu(approximate="tanh")`, `a + b`, `a * b_row`, `x.to(torch.float32)`,
`F.embedding`, and rope written with torch ops (torch has no rope of its own: index the cos/sin cache by position,
two rotated halves concatenated, q and k written back; q and k contiguous), each as a model would run it; the
peer's table and cos/sin cache have our sizes. The copy bandwidth is
cuMemcpyDtoD of a 1 GiB buffer (`common.copy_bandwidth`). No target is set for this family; the figures are reported.
"""

from __future__ import annotations

import sys

import common

TOKENS = 16384
CASES = (
    ("silu_and_mul", {"n_rows": TOKENS, "d": 5632}, ("float16",)),
    ("gelu", {"n_rows": TOKENS, "n_cols": 4096, "approximate": "tanh"}, ("float16",)),
    (
        "add_mul",
        {"n_rows": TOKENS, "n_cols": 4096, "op": "add", "a_layout": "dense", "b_layout": "dense"},
        ("float16", "float16"),
    ),
    (
        "add_mul",
        {"n_rows": TOKENS, "n_cols": 4096, "op": "mul", "a_layout": "dense", "b_layout": "broadcast"},
        ("float16", "float16"),
    ),
    ("cast", {"n_rows": TOKENS, "n_cols": 4096}, ("float16", "float32")),
    (
        "rope",
        {"n_tokens": TOKENS, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128, "rot_dim": 128, "style": "neox"},
        ("float16",),
    ),
    ("embedding", {"n_tokens": TOKENS, "dim": 4096}, ("float16", "int64")),
)

PEER_SCRIPT = (
    common.PEER_HEAD
    + r"""
import torch.nn.functional as F
h = torch.float16
for i, (name, p, dtypes) in enumerate(cases):
    if name == "silu_and_mul":
        x = torch.randn(p["n_rows"], 2 * p["d"], device="cuda", dtype=h)
        d = p["d"]
        fn = lambda: F.silu(x[:, :d]) * x[:, d:]
    elif name == "gelu":
        x = torch.randn(p["n_rows"], p["n_cols"], device="cuda", dtype=h)
        fn = lambda: F.gelu(x, approximate="tanh")
    elif name == "add_mul":
        a = torch.randn(p["n_rows"], p["n_cols"], device="cuda", dtype=h)
        b = torch.randn(p["n_rows"] if p["b_layout"] == "dense" else 1, p["n_cols"], device="cuda", dtype=h)
        fn = (lambda: a + b) if p["op"] == "add" else (lambda: a * b)
    elif name == "cast":
        x = torch.randn(p["n_rows"], p["n_cols"], device="cuda", dtype=h)
        fn = lambda: x.to(torch.float32)
    elif name == "rope":
        t, hd, half = p["n_tokens"], p["head_dim"], p["rot_dim"] // 2
        q = torch.randn(t, p["n_heads"], hd, device="cuda", dtype=h)
        k = torch.randn(t, p["n_kv_heads"], hd, device="cuda", dtype=h)
        pos = torch.randint(0, p["max_position"], (t,), device="cuda")
        cache = torch.randn(p["max_position"], p["rot_dim"], device="cuda", dtype=torch.float32)
        def fn():
            cs = cache[pos]
            cos, sin = cs[:, None, :half], cs[:, None, half:]
            for x in (q, k):
                x1, x2 = x[..., :half].float(), x[..., half:].float()
                x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    else:
        table = torch.randn(p["vocab"], p["dim"], device="cuda", dtype=h)
        ids = torch.randint(0, p["vocab"], (p["n_tokens"],), device="cuda")
        fn = lambda: F.embedding(ids, table)
    out[str(i)] = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
"""
    + common.PEER_TAIL
)


def moved_bytes(name: str, inputs) -> int:
    """Bytes read + written once each by one launch on `inputs`."""
    t = inputs.tensors
    if name == "embedding":  # the ids, the gathered table rows, the output
        return t["ids"].nbytes + 2 * t["out"].nbytes
    if name == "rope":  # q and k read and written in place, the positions, one cos/sin row per token
        per_token_cache = t["cache"].shape[1] * t["cache"].dtype.itemsize
        return 2 * (t["q"].nbytes + t["k"].nbytes) + t["positions"].nbytes + t["q"].shape[0] * per_token_cache
    if name == "add_mul" and inputs.problem["b_layout"] == "broadcast":  # b is one row, read once
        return t["a"].nbytes + t["out"].nbytes + inputs.problem["n_cols"] * t["b"].dtype.itemsize
    return sum(x.nbytes for x in t.values())


def launches(name: str, config, inputs) -> list:
    """The kernel launches of one config on `inputs`, built once, so a timed repetition holds the launches and
    nothing else (the specs' own launch functions also check ids and positions on the host before every launch)."""
    from nbxcert.kernels import elementwise as ew

    t, s = inputs.tensors, inputs.scalars
    if name == "silu_and_mul":
        return ew.silu_and_mul_launches(config, t["x"], t["y"])
    if name == "gelu":
        return ew.gelu_launches(config, t["x"], t["y"], s["approximate"])
    if name == "add_mul":
        return ew.add_mul_launches(config, t["a"], t["b"], t["out"], s["op"])
    if name == "cast":
        return ew.cast_launches(config, t["x"], t["y"])
    if name == "rope":
        return ew.rope_launches(config, t["q"], t["k"], t["positions"], t["cache"], s["rot_dim"], s["style"])
    return ew.embedding_launches(config, t["table"], t["ids"], t["out"])


def case_label(kernel: str, problem: dict, dtypes) -> str:
    """The table's short case column: the op and layout of add_mul, the target of a cast, else the variant."""
    if kernel == "add_mul":
        return f"{problem.get('op', '')} {problem.get('b_layout', '')}"
    if kernel == "cast":
        return "->" + dtypes[-1]
    return str(problem.get("approximate", problem.get("style", "")))


def table(results: list[dict]) -> list[str]:
    """The printed table, one line per case (and one more under a case whose check failed)."""
    header = f"{'kernel':13s} {'case':>22s} {'best us':>9s} {'GB/s':>7s} {'of copy':>8s} {'torch us':>9s} "
    header += f"{'x torch':>8s}"

    def row(r: dict) -> str:
        case = case_label(r["kernel"], r["problem"], r["dtypes"])
        t_us, sp = common.torch_cells(r["torch_ms"], r["speedup_vs_torch"])
        return (
            f"{r['kernel']:13s} {case:>22s} {r['best_ms'] * 1e3:9.1f} {r['effective_GBps']:7.0f} "
            f"{100 * r['fraction_of_copy']:7.1f}% {t_us} {sp}  {r['best_label']}"
        )

    return common.table_lines(header + "  best config", results, row, rule=len(header))


def main() -> int:
    from nbxcert.kernels import elementwise as ew

    # the peer's table and cos/sin cache are as large as ours (a table in L2 would flatter either side)
    peer_cases = [
        [name, dict(problem, vocab=ew.EMBEDDING_VOCAB, max_position=ew.ROPE_MAX_POSITION), list(dtypes)]
        for name, problem, dtypes in CASES
    ]
    args, cuda, profile, how, device_name, peer = common.start(__doc__, "bench_elementwise", PEER_SCRIPT, peer_cases)
    from nbxcert.kernels.spec import get_spec

    copy_bw = common.copy_bandwidth(cuda)
    results = []
    for i, (name, problem, dtypes) in enumerate(CASES):
        spec = get_spec(name)
        inputs = spec.make_inputs(problem, dtypes, 0, "cuda:0")

        def make_call(c, name=name, inputs=inputs):
            return common.call_all(launches(name, c, inputs))

        timings = common.time_kept(spec, problem, profile, make_call, args.warmup, args.rep, dtypes=dtypes)
        best_ms, best = timings[0]
        torch_ms = peer.get("ms", {}).get(str(i))
        fields = common.bandwidth_fields(best_ms, best, moved_bytes(name, inputs), copy_bw, torch_ms)
        results.append(
            {
                "kernel": name,
                "problem": problem,
                "dtypes": list(dtypes),
                **fields,
                "check": common.check(spec, best, problem, dtypes, profile, inputs),
                "candidates": common.candidate_times(timings),
            }
        )
        common.print_case(f"{name} {problem}", timings, flush=True)

    # the results are written before the table is printed: a fault in printing loses no measurement
    common.write_results(args.out, device_name, profile, how, peer, results, copy_bw)
    common.print_opening(device_name, profile, how, peer, copy_bw)
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
