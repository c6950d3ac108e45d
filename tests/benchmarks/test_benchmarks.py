"""The benchmark scripts' own code that runs after the GPU work (tables, labels): a fault there loses a GPU run's
measurements, so it is exercised here on the CPU with results shaped as the GPU run makes them."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

import pytest

from nbxcert.kernels.spec import Config

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def bench_module(monkeypatch, name: str, *also: str):
    """A benchmark script imported as a module (benchmarks/ on the path), and forgotten afterwards with `also`."""
    monkeypatch.syspath_prepend(str(BENCH))
    try:
        yield importlib.import_module(name)
    finally:
        for gone in (name, *also):
            sys.modules.pop(gone, None)


@pytest.fixture
def bench_elementwise(monkeypatch):
    with bench_module(monkeypatch, "bench_elementwise") as module:
        yield module


def _result(bench, name, problem, dtypes, torch_ms, check="ok"):
    import common

    best = Config.make(num_warps=4, num_stages=1, BLOCK=1024)
    fields = common.bandwidth_fields(0.1, best, 64 << 20, 4.0e12, torch_ms)
    return {"kernel": name, "problem": problem, "dtypes": list(dtypes), **fields, "check": check}


def test_the_elementwise_table_has_a_line_for_every_case(bench_elementwise):
    # the bug: the case label read a second dtype that only cast has, and an H200 run's table lost its torch column
    results = [
        _result(bench_elementwise, n, p, d, 0.2 if i % 2 else None)
        for i, (n, p, d) in enumerate(bench_elementwise.CASES)
    ]
    lines = bench_elementwise.table(results)
    assert len(lines) == 2 + len(bench_elementwise.CASES)
    labels = [bench_elementwise.case_label(n, p, d) for n, p, d in bench_elementwise.CASES]
    assert labels == ["", "tanh", "add dense", "mul broadcast", "->float32", "neox", ""]
    for line, (name, _, _), label, r in zip(lines[2:], bench_elementwise.CASES, labels, results, strict=False):
        assert line.startswith(name) and label in line and "BLOCK=1024" in line
        assert ("2.00x" in line) == (r["torch_ms"] is not None)


def test_a_failed_check_is_printed_under_its_case(bench_elementwise):
    name, problem, dtypes = bench_elementwise.CASES[4]
    lines = bench_elementwise.table([_result(bench_elementwise, name, problem, dtypes, 0.2, check="mismatch\nmore")])
    assert lines[-1] == "  CHECK FAILED: mismatch"
    assert bench_elementwise.case_label(name, problem, dtypes) == "->float32"


def test_the_host_cost_benchmark_runs_without_a_gpu(tmp_path):
    """bench_host.py dispatches through Triton (cross-compiled for sm_90) and serves the shipped hopper certificates
    on a machine with no GPU; a short run reports each case's served, raw and direct cost."""
    import json
    import subprocess

    out = tmp_path / "host.json"
    cmd = [sys.executable, str(BENCH / "bench_host.py"), "--calls", "50", "--repeats", "1", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    cases = json.loads(out.read_text())["cases"]
    kernels = ["rmsnorm", "add_rmsnorm", "softmax", "embedding", "rope", "decode_attention", "silu_and_mul", "matmul"]
    assert [c["kernel"] for c in cases] == kernels
    assert all(c["served_us"] > 0 and c["direct_us"] > 0 and c["raw_us"] > 0 for c in cases)
    assert all(c["overhead_us"] == c["served_us"] - c["raw_us"] for c in cases)


def _bench_oracles(*args: str):
    """bench_oracles.py run with `args` at one repeat: its finished process."""
    import subprocess

    cmd = [sys.executable, str(BENCH / "bench_oracles.py"), "--repeats", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _against_itself(module: str, *args: str) -> list[str]:
    """bench_oracles.py's lines for oracles/<module>.py timed beside a copy of itself (`--oracle-file`)."""
    oracle = Path(__file__).resolve().parents[2] / "oracles" / f"{module}.py"
    r = _bench_oracles("--module", module, *args, "--oracle-file", str(oracle))
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.splitlines()


def test_the_oracle_benchmark_times_this_oracle_beside_another_file():
    """bench_oracles.py times oracles/attention.py beside a given copy of it; a copy of itself agrees to the bit."""
    lines = _against_itself("attention")
    assert [line.split()[:2] for line in lines[:4]] == [
        ["this", "decode"],
        ["this", "prefill"],
        ["other", "decode"],
        ["other", "prefill"],
    ]
    assert lines[4].endswith("0.00e+00") and lines[5].endswith("0.00e+00")


def test_the_oracle_benchmark_times_the_conv2d_oracle_too():
    """`--module vision`: conv2d's reference beside a copy of oracles/vision.py, which agrees to the bit."""
    lines = _against_itself("vision")
    assert [line.split()[:2] for line in lines[:2]] == [["this", "conv2d"], ["other", "conv2d"]]
    assert lines[2] == "conv2d: largest difference of out and error scale between the two: 0.00e+00"


def test_the_oracle_benchmark_times_the_quantized_references_too():
    """`--module quant` at a small shape: the int4 and int8 products beside a copy of oracles/quant.py, which agrees to
    the bit; a shape the int4 groups cannot tile is refused in one line."""
    lines = _against_itself("quant", "--quant-shape", "3,256,64")
    assert [line.split()[:2] for line in lines[:4]] == [
        ["this", "int4"],
        ["this", "int8"],
        ["other", "int4"],
        ["other", "int8"],
    ]
    assert lines[4:] == [
        f"{case}: largest difference of out and error scale between the two: 0.00e+00" for case in ("int4", "int8")
    ]
    r = _bench_oracles("--module", "quant", "--quant-shape", "3,100,64")
    assert r.returncode == 1 and "K must be a multiple of 128" in r.stderr, r.stderr[-2000:]


@pytest.fixture
def bench_autotune(monkeypatch):
    from nbxcert.kernels.spec import unregister

    with bench_module(monkeypatch, "bench_autotune", "autotune_specs") as module:
        yield module
    unregister("matmul_tiled")  # the restricted spec stays out of the registry other tests iterate over


AUTOTUNE_FAMILIES = ["matmul", "rmsnorm", "silu_and_mul"]
# small problems at which each family's launch is compared with nbxcert's own (a layout of each kind for matmul)
AUTOTUNE_PROBLEMS = {
    "matmul": [
        {"M": 1, "N": 48, "K": 64, "trans_a": 0, "trans_b": 1, "aligned": 1},
        {"M": 5, "N": 40, "K": 40, "trans_a": 0, "trans_b": 1, "aligned": 1},
        {"M": 6, "N": 24, "K": 40, "trans_a": 1, "trans_b": 0, "aligned": 1},
    ],
    "rmsnorm": [{"n_rows": 1, "n_cols": 300}, {"n_rows": 5, "n_cols": 1000}],
    "silu_and_mul": [{"n_rows": 1, "d": 300}, {"n_rows": 5, "d": 70}],
}


def _constexpr_names(kernel) -> tuple[set, list]:
    """(the constexpr parameters, the others in order) of a Triton kernel's Python function."""
    import inspect

    params = inspect.signature(kernel.fn).parameters.values()
    constexprs = {p.name for p in params if "constexpr" in str(p.annotation)}
    return constexprs, [p.name for p in params if p.name not in constexprs]


def test_the_autotune_plan_is_three_families_of_one_kernel_each(bench_autotune, tmp_path):
    """bench_autotune.py's plan: >= 20 float16 keys of three families of a shipped workload, every family's candidates
    one Triton kernel with one signature (the same triton.Config fields for every candidate of every key, and with
    the constexprs passed alike, exactly the kernel's constexprs); the keys file the certify process reads parses and
    names the specs certified (matmul's restricted copy), and a fresh process with the benchmark's environment
    imports the spec module and takes the file."""
    import json
    import subprocess

    from nbxcert.keyfile import gather_keys, read_keys
    from nbxcert.profiles import get_profile

    hopper = get_profile("hopper")
    plan = bench_autotune.build_plan("qwen2.5-7b", hopper, AUTOTUNE_FAMILIES, 7, "float16")
    assert len(plan) >= 20 and len({item["key"] for item in plan}) == len(plan)
    for family in AUTOTUNE_FAMILIES:
        fam = bench_autotune.FAMILIES[family]
        items = [item for item in plan if item["family"] == family]
        assert len(items) == 7 and {item["kernel"] for item in items} == {fam.kernel}
        assert all(item["key"].startswith(fam.spec + "[") and item["dtypes"][0] == "float16" for item in items)
        fields = {frozenset(c["kwargs"]) for item in items for c in item["configs"]}
        fixed = {frozenset(item["fixed"]) for item in items}
        assert len(fields) == 1 and len(fixed) == 1, (family, fields, fixed)
        assert all(item["configs"] for item in items)
        (names,), (alike,) = fields, fixed
        constexprs, others = _constexpr_names(bench_autotune.kernel_of(fam.kernel))
        assert not names & alike and names | alike == constexprs, (family, names, alike, constexprs)
        assert set(fam.sizes) <= set(others)
        json.dumps(items)  # the peer reads the plan as JSON
    assert {item["key"].split("[")[0] for item in plan} == {"matmul_tiled", "rmsnorm", "silu_and_mul"}

    keys_path = bench_autotune.write_keys_file(plan, tmp_path / "keys.jsonl")
    assert [k.text() for k in read_keys(keys_path)] == [item["key"] for item in plan]
    assert [k.text() for k in gather_keys(hopper, keys_file=keys_path)] == [item["key"] for item in plan]
    env = bench_autotune.side_env(tmp_path / "triton-cache")
    keys_cmd = [sys.executable, "-m", "nbxcert", "keys", "--profile", "hopper", "--keys", str(keys_path)]
    r = subprocess.run(keys_cmd + ["--spec", "autotune_specs", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(line)["key"] for line in r.stdout.splitlines()] == [item["key"] for item in plan]
    # certify takes the command line (no GPU here: it stops at the profile, after parsing every option)
    cmd = bench_autotune.ours_command("hopper", keys_path, tmp_path / "certs")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "wrong profile" in r.stderr and "No such option" not in r.stderr, r.stderr[-2000:]


class _Launched(Exception):
    pass


@pytest.mark.parametrize("family", AUTOTUNE_FAMILIES)
def test_the_autotune_peer_launches_as_nbxcert_does(bench_autotune, family):
    """For every candidate of the spec certified, at small problems, the kernel, grid, positional arguments and
    constexprs the peer passes (the family's `args`, `grid`, `tuning` and `fixed`, on the tensors nbxcert makes)
    are those nbxcert's own launch passes (seen before the launch, which is then stopped)."""
    from nbxcert.kernels.launch import observing
    from nbxcert.kernels.spec import get_spec
    from nbxcert.kernels.tensor import Tensor

    bench_autotune.build_plan("qwen2.5-7b", _hopper(), [family], 1, "float16")  # registers the restricted spec
    fam = bench_autotune.FAMILIES[family]
    spec, kernel = get_spec(fam.spec), bench_autotune.kernel_of(fam.kernel)
    seen = []

    def stop(kernel, grid, args, kwargs):
        seen.append((kernel, grid, args, kwargs))
        raise _Launched

    import triton.language as tl

    for problem in AUTOTUNE_PROBLEMS[family]:
        dtypes = ("float16",) * len(spec.dtype_args)
        inputs = spec.make_inputs(problem, dtypes, 0, "cpu")
        fixed = fam.fixed(problem, "float16")
        assert {n: bench_autotune.constexpr_value(bench_autotune._json_value(v), tl) for n, v in fixed.items()} == fixed
        for config in spec.candidates:
            seen.clear()
            with observing(stop), pytest.raises(_Launched):
                spec.launch(config, inputs)
            (launched, grid, args, kwargs) = seen[0]
            tuning = fam.tuning(config, problem, "float16")
            meta = {**tuning, **fixed}
            assert launched is kernel, (config.label(), launched)
            assert kwargs == {**meta, "num_warps": config.num_warps, "num_stages": config.num_stages}, config.label()
            assert tuple(grid) == fam.grid(problem, meta), (config.label(), grid)
            ours = fam.args(inputs.tensors, problem)
            assert len(ours) == len(args), config.label()
            for i, (a, b) in enumerate(zip(ours, args, strict=True)):
                if isinstance(b, Tensor):
                    assert a is b, (config.label(), i)
                else:
                    assert type(a) is type(b) and a == b, (config.label(), i, a, b)


def _hopper():
    from nbxcert.profiles import get_profile

    return get_profile("hopper")


def test_the_autotune_comparison_and_table(bench_autotune):
    """Both sides' results, shaped as the GPU run makes them, give rows, family and overall totals and the process
    ratio the target is judged on."""
    plan = [
        {"family": "matmul", "key": "k1", "configs": [{}] * 4},
        {"family": "matmul", "key": "k2", "configs": [{}] * 4},
        {"family": "rmsnorm", "key": "k3", "configs": [{}] * 2},
    ]
    report = {
        "keys": [
            {"key": k, "status": "certified", "winner": "w", "seconds": {"total": s}, "counts": {}}
            for k, s in (("k1", 2.0), ("k2", 1.0), ("k3", 0.5))
        ]
    }
    peer = {"wall_s": 60.0, "keys": [{"key": k, "seconds": s} for k, s in (("k1", 8.0), ("k2", 4.0), ("k3", 1.0))]}
    result = bench_autotune.compare(plan, {"wall_s": 10.0, "report": report}, peer)
    assert [(r["key"], r["family"], r["candidates"], r["ratio"]) for r in result["rows"]] == [
        ("k1", "matmul", 4, 4.0),
        ("k2", "matmul", 4, 4.0),
        ("k3", "rmsnorm", 2, 2.0),
    ]
    assert result["families"]["matmul"] == {"keys": 2, "ours_s": 3.0, "autotune_s": 12.0, "ratio": 4.0}
    assert result["total"]["ratio"] == 13.0 / 3.5 and result["process_ratio"] == 6.0 and result["met"]
    lines = bench_autotune.table(result)
    assert len(lines) == 3 + 2 + 2 and lines[-1].endswith("x6.00 (target >= 5x: met)")
    # certify's own phases (its --json `seconds`) are kept and shown beside the walls
    report["seconds"] = {"plan": 0.25, "keys": 8.0, "close": 0.5}
    result = bench_autotune.compare(plan, {"wall_s": 10.0, "report": report}, peer)
    assert result["ours_run_seconds"] == report["seconds"]
    assert "nbxcert's run: plan 0.2 s, keys 8.0 s, close 0.5 s (the rest of its wall: start)" in bench_autotune.table(
        result
    )
    summary = '[nbxcert] a line\n{\n  "keys": [\n    {"key": "k1"}\n  ]\n}\n'
    assert bench_autotune.last_json(summary) == {"keys": [{"key": "k1"}]}
    assert bench_autotune.last_json("Traceback ...\n{ not json\n") is None
    with pytest.raises(SystemExit, match="missing"):
        bench_autotune.compare(plan, {"wall_s": 10.0, "report": {"keys": report["keys"][:2]}}, peer)


def test_the_autotune_pools_are_named_compile_pools(bench_autotune):
    """--pools: nbxcert's side once per named compile pool, in order; none named keeps the environment's; a pool that
    is not one, or one named twice, is refused in one line."""
    assert bench_autotune.parse_pools("") == [""]
    assert bench_autotune.parse_pools("device, cross") == ["device", "cross"]
    with pytest.raises(SystemExit, match="'gpu' is not a compile pool; give one of device, cross"):
        bench_autotune.parse_pools("device,gpu")
    with pytest.raises(SystemExit, match="names a pool twice"):
        bench_autotune.parse_pools("cross,cross")


@pytest.fixture
def bench_quant(monkeypatch):
    with bench_module(monkeypatch, "bench_quant") as module:
        yield module


def _gptq_int4(k: int, n: int, dtype: str, seed: int = 0):
    """A GPTQ int4 weight as nbxcert's cases make it: (qweight, scales as values of `dtype`, qzeros, q, z)."""
    import numpy as np

    from nbxcert.kernels.quant import pack_int4_cols, pack_int4_rows

    gen = np.random.default_rng(seed)
    q = gen.integers(0, 16, (k, n))
    z = gen.integers(0, 16, (k // 128, n))
    s = np.abs(gen.standard_normal((k // 128, n))) * 0.01 + 0.002
    s = s.astype(np.float16).astype(np.float64) if dtype == "float16" else _bf16(s)
    return pack_int4_rows(q), s, pack_int4_cols(z), q, z


def _bf16(a):
    """float64 values of `a` rounded to bfloat16, independently of the benchmark's helper: the nearest of the two
    bfloat16 neighbours (float32 bits truncated, and that plus one unit), ties to the even one."""
    import numpy as np

    a = np.asarray(a, dtype=np.float32)
    bits = a.view(np.uint32) & np.uint32(0xFFFF0000)
    low = bits.view(np.float32).astype(np.float64)
    high = (bits + np.uint32(0x10000)).view(np.float32).astype(np.float64)
    exact = a.astype(np.float64)
    pick_high = (np.abs(high - exact) < np.abs(exact - low)) | (
        (np.abs(high - exact) == np.abs(exact - low)) & ((bits >> np.uint32(16)) & np.uint32(1)).astype(bool)
    )
    return np.where(pick_high, high, low)


def _tinygemm_weight(nibbles, scales_and_zeros, group: int = 128):
    """The [K, N] weight torch's tinygemm computes with, by its source (aten/src/ATen/native/cuda/int4mm.cu): byte j
    of row n holds k = 2 j in its high nibble and k = 2 j + 1 in its low one; w = (u - 8) * scale + zero, scale and
    zero of group k // group at [g, n, 0] and [g, n, 1] (in float64 here: the bfloat16 fma's own rounding left out)."""
    import numpy as np

    n, half = nibbles.shape
    u = np.empty((n, 2 * half), dtype=np.float64)
    u[:, 0::2] = nibbles >> 4
    u[:, 1::2] = nibbles & 0xF
    g = np.arange(2 * half) // group
    scale, zero = scales_and_zeros[g, :, 0], scales_and_zeros[g, :, 1]
    return (u.T - 8) * scale + zero


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_quant_tinygemm_operands_compute_the_gptq_weight(bench_quant, dtype):
    """nbxcert's GPTQ int4 weight converted for torch's tinygemm dequantizes, by tinygemm's formula, to the oracle's
    weight within the one bfloat16 rounding of each operand: |w_tinygemm - w| <= 2^-8 |(8 - z) s| with bfloat16 scales
    (the scale is exact, the zero (8 - z) s rounded once), plus 2^-8 |q - 8| s with float16 scales (rounded to
    bfloat16 too); 2^-15 more for the rounding's float32 step."""
    import numpy as np

    from nbxcert.oracles.quant import dequantize

    k, n = 512, 48
    qweight, s, qzeros, q, z = _gptq_int4(k, n, dtype)
    nibbles, sz = bench_quant.tinygemm_operands(qweight, s, qzeros, 128)
    assert nibbles.dtype == np.uint8 and nibbles.shape == (n, k // 2) and nibbles.flags.c_contiguous
    assert sz.dtype == np.float32 and sz.shape == (k // 128, n, 2) and sz.flags.c_contiguous
    assert not (sz.view(np.uint32) & np.uint32(0xFFFF)).any()  # bfloat16 values: torch takes them exactly
    got = _tinygemm_weight(nibbles, sz.astype(np.float64))
    want = dequantize("int4", qweight, s, qzeros, 128)
    g = np.arange(k) // 128
    bound = np.abs((8 - z[g]) * s[g])
    if dtype == "float16":
        bound = bound + np.abs(q - 8) * s[g]
    err = np.abs(got - want)
    assert (err <= bound * 2.0**-8 * (1 + 2.0**-15)).all(), float((err / np.maximum(bound, 1e-300)).max())
    assert err.max() > 0  # the rounding is there, so the bound is what is tested
    if dtype == "bfloat16":
        assert np.array_equal(sz[..., 0], s.astype(np.float32))  # the scales pass unchanged


def test_the_quant_tinygemm_nibble_order_is_the_packing_ops(bench_quant):
    """The even k goes to the high nibble, as `_convert_weight_to_int4pack`'s comment ("v[0]H") and PyTorch's own
    tests (`w[:, ::2] << 4 | w[:, 1::2]`) have it; the zero point (8 - z) s and the scale land at [g, n, 1] and
    [g, n, 0]."""
    import numpy as np

    from nbxcert.kernels.quant import pack_int4_cols, pack_int4_rows

    k, n = 128, 8
    q = np.zeros((k, n), dtype=np.int64)
    q[0, 3], q[1, 3], q[126, 5], q[127, 5] = 1, 2, 14, 15
    z = np.full((1, n), 8)
    z[0, 2] = 3
    s = np.full((1, n), 0.5)
    nibbles, sz = bench_quant.tinygemm_operands(pack_int4_rows(q), s, pack_int4_cols(z), 128)
    assert nibbles[3, 0] == 0x12 and nibbles[5, 63] == 0xEF and nibbles[0, 0] == 0
    assert sz[0, 2].tolist() == [0.5, 2.5] and sz[0, 0].tolist() == [0.5, 0.0]


def test_the_quant_benchmark_refuses_bad_shapes_in_one_line(bench_quant):
    import numpy as np

    qweight = np.zeros((64, 16), dtype=np.int32)  # K = 512, N = 16
    with pytest.raises(ValueError, match=r"^tinygemm_operands: qweight \[64, 16\] needs scales \[4, 16\]"):
        bench_quant.tinygemm_operands(qweight, np.ones((3, 16)), np.zeros((4, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="^int8pack_operands: qweight must be int8"):
        bench_quant.int8pack_operands(np.zeros((4, 4), dtype=np.int32), np.ones(4))


def test_the_quant_bfloat16_rounding_is_to_nearest_even(bench_quant):
    import numpy as np

    ulp = 2.0**-7  # bfloat16's spacing in [1, 2)
    a = np.array([1 + ulp / 2, 1 + 1.5 * ulp, 1 + 0.6 * ulp, -(1 + 0.4 * ulp), 3.0e-3, 65504.0, 0.0])
    got = bench_quant.bfloat16_values(a)
    assert got.tolist() == [1.0, 1 + 2 * ulp, 1 + ulp, -1.0, float(_bf16(3.0e-3)), 65536.0, 0.0]
    x = np.random.default_rng(1).standard_normal(10000) * 10.0 ** np.random.default_rng(2).integers(-6, 6, 10000)
    assert np.array_equal(bench_quant.bfloat16_values(x).astype(np.float64), _bf16(x))


def test_the_quant_int8pack_operands_compute_the_int8_weight(bench_quant):
    """torch's `_weight_int8pack_mm` computes out[b, n] = sum_k x[b, k] w[n, k] * scale[n] (int8mm.cu): with the
    converted operands that is X @ the oracle's int8 weight."""
    import numpy as np

    from nbxcert.oracles.quant import dequantize

    gen = np.random.default_rng(0)
    q = gen.integers(-127, 128, (64, 24)).astype(np.int8)
    s = (np.abs(gen.standard_normal(24)) * 0.001 + 0.0005).astype(np.float16)
    w_nk, scale = bench_quant.int8pack_operands(q, s)
    assert w_nk.dtype == np.int8 and w_nk.shape == (24, 64) and w_nk.flags.c_contiguous
    assert np.array_equal(w_nk.T.astype(np.float64) * scale.astype(np.float64), dequantize("int8", q, s))


def test_the_quant_peer_script_compiles_and_names_torchs_kernels(bench_quant):
    """The peer's source compiles, names the two int4 ops and the int8 one by their aten names, carries the
    conversion the tests above check, and keeps the dense `x @ w`; every case has a key of its own and the peer the
    right kind."""
    code = compile(bench_quant.PEER_SCRIPT, "bench_quant peer", "exec")
    assert code is not None
    script = bench_quant.PEER_SCRIPT
    for name in ("torch.ops.aten._convert_weight_to_int4pack(", "torch.ops.aten._weight_int4pack_mm(x, w, GROUP, sz)"):
        assert name in script
    assert "torch.ops.aten._weight_int8pack_mm(x, w, s)" in script and "x @ w" in script
    assert "def tinygemm_operands(" in script and "def int8pack_operands(" in script and "INNER_K_TILES = 8" in script
    keys = [bench_quant.case_key(f, d, m, n, k) for _, f, d, m, n, k in bench_quant.CASES]
    assert len(set(keys)) == len(keys)
    kinds = {(f, d): bench_quant.quant_peer(f, d)[0] for _, f, d, *_ in bench_quant.CASES}
    assert kinds == {
        ("int4", "float16"): None,
        ("int4", "bfloat16"): bench_quant.TINYGEMM,
        ("int8", "float16"): bench_quant.INT8PACK,
    }
    # every bfloat16 int4 case has its float16 twin, so both peers are seen at the same shape
    twins = {(k_, m, n, k) for k_, f, d, m, n, k in bench_quant.CASES if f == "int4" and d == "float16"}
    assert {(k_, m, n, k) for k_, f, d, m, n, k in bench_quant.CASES if d == "bfloat16"} <= twins


def _quant_result(bench_quant, fmt, dtype, got, check="ok"):
    best = Config.make(num_warps=4, num_stages=1, BLOCK_K=128, BLOCK_N=64, SPLIT_K=8)
    return {
        "kernel": "dequant_gemv",
        "format": fmt,
        "shape": {"M": 1, "N": 14336, "K": 4096},
        "dtype": dtype,
        "best_label": best.label(),
        "best_ms": 0.02,
        "effective_GBps": 1500.0,
        **bench_quant.peer_fields(fmt, dtype, 0.02, got),
        "check": check,
    }


def test_the_quant_rows_say_which_peer_and_keep_both_times(bench_quant):
    """Results shaped as a GPU run makes them: a bfloat16 int4 case timed against tinygemm and the dense matmul, a
    float16 one against the dense matmul only (and why), an int8 case whose peer raised, one whose peer's output is
    off the oracle, one without torch and one whose peer's output went unchecked; the table says which peer each row
    has and prints the failures."""
    r_bf16 = _quant_result(bench_quant, "int4", "bfloat16", {"dense_ms": 0.04, "quant_ms": 0.01, "quant_check": 3e-3})
    assert r_bf16["peer"] == bench_quant.TINYGEMM == r_bf16["quant_peer"]
    assert r_bf16["speedup_vs_quant_peer"] == 0.5 and r_bf16["speedup_vs_dense_peer"] == 2.0
    assert r_bf16["dense_peer"] == "torch bfloat16 matmul on the dequantized weight"
    r_fp16 = _quant_result(bench_quant, "int4", "float16", {"dense_ms": 0.04})
    assert r_fp16["peer"] == "torch float16 matmul on the dequantized weight" == r_fp16["dense_peer"]
    assert r_fp16["quant_peer"] is None and "bfloat16" in r_fp16["quant_peer_none"]
    r_int8 = _quant_result(bench_quant, "int8", "float16", {"dense_ms": 0.04, "quant_error": "RuntimeError: no kernel"})
    assert r_int8["peer"] == r_int8["dense_peer"] and r_int8["quant_peer"] == bench_quant.INT8PACK
    assert r_int8["quant_peer_ms"] is None and r_int8["quant_peer_error"] == "RuntimeError: no kernel"
    r_off = _quant_result(bench_quant, "int4", "bfloat16", {"dense_ms": 0.04, "quant_ms": 0.01, "quant_check": 0.7})
    r_none = _quant_result(bench_quant, "int4", "bfloat16", None, check="mismatch\nmore")
    assert r_none["peer"] == r_none["dense_peer"] and r_none["dense_peer_ms"] is None

    r_unchecked = _quant_result(
        bench_quant, "int4", "bfloat16", {"quant_ms": 0.01, "quant_check_error": "ModuleNotFoundError: no nbxcert"}
    )
    assert r_unchecked["peer"] == bench_quant.TINYGEMM and r_unchecked["quant_peer_error"] is None

    lines = bench_quant.table([r_bf16, r_fp16, r_int8, r_off, r_none, r_unchecked])
    assert lines[0] == bench_quant.HEADER and set(lines[1]) == {"-"}
    body = lines[2:]
    assert body[0].split()[:4] == ["dequant_gemv", "int4", "bfloat16", "1x14336x4096"]
    assert " tinygemm " in body[0] and "0.50x" in body[0] and "2.00x" in body[0] and "SPLIT_K=8" in body[0]
    assert " - " in body[1] and "2.00x" in body[1] and "0.50x" not in body[1]
    assert " int8pack " in body[2] and body[3] == "  int8pack failed: RuntimeError: no kernel"
    assert body[5].startswith("  tinygemm output off the oracle by 7.00e-01")
    assert body[6].split()[6:11] == ["tinygemm", "-", "-", "-", "-"] and body[7] == "  CHECK FAILED: mismatch"
    assert body[9] == "  tinygemm output not checked: ModuleNotFoundError: no nbxcert"
    assert any(bench_quant.TINYGEMM in line for line in lines) and any(bench_quant.INT8PACK in line for line in lines)
    assert all(len(line) <= 200 for line in lines)


def test_the_pool_start_probe_times_cold_warm_and_lone_workers(tmp_path):
    """probe_pool_start.py under the interpreter (its compiles are empty there): every phase reported, cold workers'
    round trips longer than warm ones' (their start is in them), and a key with too few candidates refused; its Triton
    cache removed when it ends."""
    import json
    import os
    import subprocess

    # the usual pool's workers (the cross pool reads the GPU's target: none here)
    env = {**os.environ, "NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1", "NBXCERT_COMPILE_POOL": "device"}
    env.pop("TRITON_CACHE_DIR", None)  # the probe's own Triton cache, gone when it ends
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env["TMPDIR"] = str(scratch)
    cmd = [sys.executable, str(BENCH / "probe_pool_start.py"), "--jobs", "2", "--out", str(tmp_path / "p.json")]
    r = subprocess.run(
        [*cmd, "--key", "rmsnorm[n_cols=300,n_rows=8;float16,float16]@v1"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(scratch.iterdir()) == []
    report = json.loads((tmp_path / "p.json").read_text())
    assert (report["backend"], report["profile"], report["jobs"]) == ("interpreter", "cpu/interpreter", 2)
    assert report["contexts"]["wall_s"] > 0 and report["cold"]["n"] == report["warm"]["n"] == 2
    assert report["cold"]["round_trip_s"]["median"] > 10 * report["warm"]["round_trip_s"]["median"]
    assert report["alone"]["round_trip_s"] > report["alone"]["compile_s"] >= 0
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("pool start (2 device workers, interpreter): contexts made at once ") and "; alone " in line
    r = subprocess.run(
        [*cmd, "--jobs", "50", "--key", "rmsnorm[n_cols=300,n_rows=8;float16,float16]@v1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 1 and "--jobs 50 needs 101 (a different one for every request)" in r.stderr


def test_the_pool_start_probe_says_a_failed_request_in_one_line():
    """A refusal or an exception inside a request's thread ends the probe with one line naming the candidate (an
    exception raised in a thread would only have been printed, and the probe gone on)."""
    import importlib

    sys.path.insert(0, str(BENCH))
    try:
        probe = importlib.import_module("probe_pool_start")
    finally:
        sys.path.remove(str(BENCH))

    class Refusing:
        def request(self, request, timeout_s):
            return {"status": "compile", "reason": "ptxas: too many resources"}

    class Raising:
        def request(self, request, timeout_s):
            raise OSError("the pipe broke")

    with pytest.raises(SystemExit, match=r"candidate \{'a': 1\} did not compile: ptxas: too many resources"):
        probe.timed_requests([Refusing()], [{"config": {"a": 1}}])
    with pytest.raises(SystemExit, match=r"candidate \{'b': 2\}: OSError: the pipe broke \(and 1 more\)"):
        probe.timed_requests([Raising(), Raising()], [{"config": {"b": 2}}, {"config": {"b": 2}}])
