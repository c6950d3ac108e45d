"""The benchmark scripts' own code that runs after the GPU work (tables, labels): a fault there loses a GPU run's
measurements, so it is exercised here on the CPU with results shaped as the GPU run makes them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from nbxcert.kernels.spec import Config

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench_elementwise(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    module = importlib.import_module("bench_elementwise")
    yield module
    sys.modules.pop("bench_elementwise", None)


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


def test_the_oracle_benchmark_times_this_oracle_beside_another_file(tmp_path):
    """bench_oracles.py times oracles/attention.py beside a given copy of it; a copy of itself agrees to the bit."""
    import subprocess

    oracle = Path(__file__).resolve().parents[2] / "oracles" / "attention.py"
    cmd = [sys.executable, str(BENCH / "bench_oracles.py"), "--repeats", "1", "--oracle-file", str(oracle)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [
        ["this", "decode"],
        ["this", "prefill"],
        ["other", "decode"],
        ["other", "prefill"],
    ]
    assert lines[4].endswith("0.00e+00") and lines[5].endswith("0.00e+00")


@pytest.fixture
def bench_autotune(monkeypatch):
    from nbxcert.kernels.spec import unregister

    monkeypatch.syspath_prepend(str(BENCH))
    module = importlib.import_module("bench_autotune")
    yield module
    for name in ("bench_autotune", "autotune_specs"):
        sys.modules.pop(name, None)
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
    summary = '[nbxcert] a line\n{\n  "keys": [\n    {"key": "k1"}\n  ]\n}\n'
    assert bench_autotune.last_json(summary) == {"keys": [{"key": "k1"}]}
    assert bench_autotune.last_json("Traceback ...\n{ not json\n") is None
    with pytest.raises(SystemExit, match="missing"):
        bench_autotune.compare(plan, {"wall_s": 10.0, "report": {"keys": report["keys"][:2]}}, peer)
