"""`nbxcert export`: certified configs read back by the tools they are written for, each in its own shape.

vllm-fused-moe: fused_moe certificates (synthetic, valid against the real spec) -> files whose names parse as vLLM's
`get_config_file_name` makes them and whose contents load through vLLM's own reading steps (`get_moe_configs`:
pop "triton_version", int keys; `try_get_optimal_moe_config`: the nearest M), restated here since vLLM is not
installed. triton-autotune: a certificate of the user kernel `user_scale` (tests/fixtures/user_kernel.py) -> a cache
that the installed Triton's own `Autotuner` (cache_results=True, TRITON_CACHE_DIR at the export) reads in a process
compiling for sm_90 (`crosstools`, no GPU): it must pick the certified winner, report a cache hit, and never benchmark.
Errors: one line on stderr, exit 1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import check, check_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROFILE = "nvidia/hopper"


def nbx(*args, env: dict | None = None, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("NBXCERT_CERTIFIED_DIR", *drop)}
    e.update(COLUMNS="250", PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    e.update(env or {})
    cmd = [sys.executable, "-m", "nbxcert", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=180)


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [x for x in r.stderr.splitlines() if x.startswith("nbxcert:")]


# --- certificate fixtures (shaped as `certify.entry_of` writes them; `validate` accepts them) -----------------------
def timing(median_us: float) -> dict:
    return {
        "median_us": median_us,
        "min_us": median_us * 0.97,
        "spread": 0.03,
        "reps": 500,
        "kind": "cuda_events_gated",
    }


def entry(
    winner: dict, timed: list[tuple[dict, float]], problem: dict, default: dict, gpu: str = "NVIDIA H200"
) -> dict:
    """A valid entry: `timed` (config, median us) are the configs timed in full, `winner` and `default` among them."""
    ranked = sorted(timed, key=lambda ct: ct[1])
    w = next(t for c, t in timed if c == winner)
    runner = next((c, t) for c, t in ranked if c != winner)
    counts = {o: 0 for o in ("pruned", "compile", "resources", "crash", "timeout", "mismatch")}
    return {
        "winner": {"config": winner, "timing": timing(w)},
        "runner_up": {"config": runner[0], "timing": timing(runner[1])},
        "margin": runner[1] / w - 1 if runner[1] > w else 0.0,
        "default": {"config": default, "timing": timing(next(t for c, t in timed if c == default))},
        "error": {"max_abs": 1e-3, "max_rel": 1e-3, "max_scaled": 0.2, "tolerance": 1.0},
        "counts": {**counts, "correct": len(timed)},
        "reproducible": True,
        "memory_class": "141GB" if "H200" in gpu else "80GB",
        "seed": 20261129,
        "oracle": "test",
        "provenance": {
            "gpu": gpu,
            "gpu_memory_bytes": 150109880320,
            "compute_capability": "9.0",
            "driver": "580.159.04",
            "cuda": "13.0",
            "triton": "3.9.0",
            "nbxcert": "0.4.0",
            "python": "3.11.7",
            "date": "2026-12-01",
            "host_os": "Linux 6.8.0",
            "backend": "cuda",
        },
        "certified_problems": {"smallest": problem, "largest": problem, "timing": problem},
        "refused": [],
        "finalists": [{"config": c, "timing": timing(t)} for c, t in ranked],
    }


def write_cert(root: Path, kernel: str, dtype: str, entries: dict) -> None:
    path = root / PROFILE / f"{kernel}.{dtype}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema_version": 1, "kernel": kernel, "dtype": dtype, "profile": PROFILE, "entries": entries}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def moe(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int) -> dict:
    """A fused_moe candidate (kernels/moe.py) as a certificate stores it."""
    return {
        "kwargs": {"BLOCK_K": bk, "BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": group_m},
        "num_warps": warps,
        "num_stages": stages,
    }


A = moe(16, 64, 128, 4, 3, 1)  # decode_configs()
B = moe(16, 128, 128, 4, 3, 1)
C = moe(32, 128, 128, 4, 3, 1)
D = moe(64, 64, 32, 4, 3, 8)  # DEFAULT_MOE


def moe_key(m: int, n: int, k: int, experts: int, top_k: int, mul_weight: int, pair_rows: int, dtype: str) -> str:
    fields = f"K={k},M={m},N={n},experts={experts},mul_weight={mul_weight},pair_rows={pair_rows},top_k={top_k}"
    return f"fused_moe[{fields};{dtype},{dtype}]@v1"


def moe_entry(key_fields: tuple, winner: dict, timed: list, gpu: str = "NVIDIA H200") -> dict:
    m, n, k, experts, top_k, mul_weight, pair_rows = key_fields
    problem = {"K": k, "M": m, "N": n, "experts": experts, "mul_weight": mul_weight, "pair_rows": pair_rows}
    return entry(winner, timed, {**problem, "top_k": top_k}, D, gpu)


# Mixtral-8x7B's experts (hidden 4096, intermediate 14336, 8 experts, top-2), as the workload forms their keys
UP = lambda m: (m, 2 * 14336, 4096, 8, 2, 0, 0)  # noqa: E731 - gate/up: N = 2 * intermediate
DOWN = lambda m: (m, 4096, 14336, 8, 2, 1, 1)  # noqa: E731 - down: K = intermediate
ODD = (1, 2 * 14336, 4096, 8, 2, 1, 0)  # token rows with router weights at top_k 2: no vLLM launch


@pytest.fixture(scope="module")
def moe_certs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("moe_certs")
    fp16 = {
        # M=1: both projections certified A
        moe_key(*UP(1), "float16"): moe_entry(UP(1), A, [(A, 20.0), (B, 22.0), (D, 40.0)]),
        moe_key(*DOWN(1), "float16"): moe_entry(DOWN(1), A, [(A, 15.0), (D, 30.0)]),
        # M=16: gate/up certified B, down A; timed by both: A (42 + 30), B (40 + 35), D: A has the least total
        moe_key(*UP(16), "float16"): moe_entry(UP(16), B, [(B, 40.0), (A, 42.0), (C, 45.0), (D, 60.0)]),
        moe_key(*DOWN(16), "float16"): moe_entry(DOWN(16), A, [(A, 30.0), (B, 35.0), (D, 50.0)]),
        moe_key(*ODD, "float16"): moe_entry(ODD, A, [(A, 20.0), (D, 40.0)]),
    }
    write_cert(root, "fused_moe", "float16", fp16)
    # Qwen3-30B-A3B's experts (hidden 2048, intermediate 768, 128 experts, top-8), gate/up only, made on an H100
    qwen_up = (4, 2 * 768, 2048, 128, 8, 0, 0)
    bf16 = {moe_key(*qwen_up, "bfloat16"): moe_entry(qwen_up, C, [(C, 9.0), (D, 12.0)], "NVIDIA H100 80GB HBM3")}
    write_cert(root, "fused_moe", "bfloat16", bf16)
    return root


# vLLM's own code, restated (vllm/model_executor/layers/fused_moe/fused_moe.py, `get_config_file_name`,
# `get_moe_configs`, `try_get_optimal_moe_config`), the device name already made
def vllm_get_config_file_name(E: int, N: int, device_name: str, dtype: str | None, block_shape=None) -> str:  # noqa: N803
    if "H200" in device_name.split("_"):
        device_name = "NVIDIA_H200"
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = ("" if not block_shape or not all(block_shape) else f",block_shape={block_shape}").replace(
        " ", ""
    )
    return f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}.json"


def vllm_load(path: Path) -> dict[int, dict]:
    tuned_config = json.loads(path.read_text())
    tuned_config.pop("triton_version", None)
    return {int(key): val for key, val in tuned_config.items()}


def vllm_pick(configs: dict[int, dict], m: int) -> dict:
    return configs[min(configs.keys(), key=lambda x: abs(x - m))]


VLLM_KEYS = ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"]
FILE_NAME = re.compile(r"E=(\d+),N=(\d+),device_name=([^,]+?)(?:,dtype=(\w+))?(?:,block_shape=\[\d+,\d+\])?\.json\Z")


def as_vllm(c: dict) -> dict:
    k = c["kwargs"]
    return {
        "BLOCK_SIZE_M": k["BLOCK_M"],
        "BLOCK_SIZE_N": k["BLOCK_N"],
        "BLOCK_SIZE_K": k["BLOCK_K"],
        "GROUP_SIZE_M": k["GROUP_M"],
        "num_warps": c["num_warps"],
        "num_stages": c["num_stages"],
    }


def test_vllm_fused_moe_files_read_back_as_vllm_reads_them(moe_certs, tmp_path):
    out = tmp_path / "tuned"
    r = nbx("export", "--format", "vllm-fused-moe", "--profile", "hopper", "--dir", moe_certs, "--out", out)
    text = check(r, 0, must=["E=8,N=14336,device_name=NVIDIA_H200.json", "skipped: " + moe_key(*ODD, "float16")])
    assert "2 files written" in text and "from 6 certified keys; 1 skipped" in text, text
    names = sorted(p.name for p in out.iterdir())
    assert names == ["E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json", "E=8,N=14336,device_name=NVIDIA_H200.json"]
    for name in names:
        e, n, device, dtype = FILE_NAME.match(name).groups()
        assert dtype is None  # fp16 / bf16: vLLM's dtype selector is None
        assert vllm_get_config_file_name(int(e), int(n), device, None) == name
        raw = json.loads((out / name).read_text())
        assert all(k == str(int(k)) for k in raw), raw  # M as a decimal string, nothing else (no triton_version)
        for config in raw.values():
            assert list(config) == VLLM_KEYS
            assert all(type(v) is int for v in config.values()), config
    mixtral = vllm_load(out / "E=8,N=14336,device_name=NVIDIA_H200.json")
    assert sorted(mixtral) == [1, 16]
    assert mixtral[1] == as_vllm(A)
    assert mixtral[16] == as_vllm(A)  # not gate/up's B: one config serves both projections, A has the least total
    assert vllm_pick(mixtral, 12) == as_vllm(A) and vllm_pick(mixtral, 2) == as_vllm(A)
    qwen = vllm_load(out / "E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json")
    assert qwen == {4: as_vllm(C)}


def test_vllm_export_writes_each_memory_class_entry_for_its_own_card(tmp_path):
    """A key certified on an H200 and on an H100 (the second class's entry under `other_classes`): each card gets its
    file. Only the first class's entry was read, so which card certified first decided which file was written."""
    root = tmp_path / "certs"
    qwen_up = (4, 2 * 768, 2048, 128, 8, 0, 0)
    h200 = moe_entry(qwen_up, C, [(C, 9.0), (D, 12.0)], "NVIDIA H200")
    h100 = moe_entry(qwen_up, D, [(D, 8.0), (C, 12.0)], "NVIDIA H100 80GB HBM3")
    write_cert(
        root, "fused_moe", "bfloat16", {moe_key(*qwen_up, "bfloat16"): {**h200, "other_classes": {"80GB": h100}}}
    )
    out = tmp_path / "tuned"
    check(nbx("export", "--format", "vllm-fused-moe", "--profile", "hopper", "--dir", root, "--out", out), 0)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json", "E=128,N=768,device_name=NVIDIA_H200.json"]
    assert vllm_load(out / names[0]) == {4: as_vllm(D)} and vllm_load(out / names[1]) == {4: as_vllm(C)}


def test_vllm_export_takes_each_memory_class_from_the_first_directory_holding_it(tmp_path):
    """A key certified on an H100 in one --dir and on an H200 in the next (two shards, unmerged): serving gives an H200
    the second directory's entry, so the export writes the H200's file too. The whole key was taken from the first
    directory, and the H200's certification was dropped with nothing said."""
    qwen_up = (4, 2 * 768, 2048, 128, 8, 0, 0)
    key = moe_key(*qwen_up, "bfloat16")
    h100, h200 = tmp_path / "h100", tmp_path / "h200"
    write_cert(
        h100, "fused_moe", "bfloat16", {key: moe_entry(qwen_up, D, [(D, 8.0), (C, 12.0)], "NVIDIA H100 80GB HBM3")}
    )
    write_cert(h200, "fused_moe", "bfloat16", {key: moe_entry(qwen_up, C, [(C, 9.0), (D, 12.0)], "NVIDIA H200")})
    out = tmp_path / "tuned"
    args = ("export", "--format", "vllm-fused-moe", "--profile", "hopper", "--dir", h100, "--dir", h200, "--out", out)
    check(nbx(*args), 0)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json", "E=128,N=768,device_name=NVIDIA_H200.json"]
    assert vllm_load(out / names[0]) == {4: as_vllm(D)} and vllm_load(out / names[1]) == {4: as_vllm(C)}


# --- triton-autotune -------------------------------------------------------------------------------------------------
USER_KEY = "user_scale[n=1000;float32,float32]@v1"


def user(block: int, warps: int) -> dict:
    """A candidate of user_scale (`triton.Config({"BLOCK": b}, num_warps=w)`: Triton's default 3 stages)."""
    return {"kwargs": {"BLOCK": block}, "num_warps": warps, "num_stages": 3}


@pytest.fixture(scope="module")
def user_certs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user_certs")
    # the winner rule kept (128, 4) although (32, 4) timed 0.1 us faster (within the medians' noise): Triton must
    # still pick (128, 4), so the faster finalist must not be in the file
    timed = [(user(128, 4), 10.0), (user(32, 4), 9.9), (user(128, 1), 11.0), (user(32, 1), 14.0)]
    write_cert(root, "user_scale", "float32", {USER_KEY: entry(user(128, 4), timed, {"n": 1000}, user(32, 1))})
    return root


# The environment the application runs in: the reading process below is the cross-compiling one, which sets
# TRITON_DEFAULT_FP_FUSION (a variable Triton's cache key includes); the export must be made in the same one.
RUN_ENV = {"TRITON_DEFAULT_FP_FUSION": "1"}
NOT_INTERPRETED = ("TRITON_INTERPRET", "NBXCERT_BACKEND")


def _read_with_triton(payload):
    """(In the crosstools subprocess, compiling for sm_90.) Triton's own Autotuner over user_scale (or the payload's
    `kernel` of its `module`, launched with tensors of its `dtypes`), with the configs a user gives `triton.autotune`,
    cache_results=True and TRITON_CACHE_DIR at the export: what it runs, whether it reports a cache hit, and what it
    read. Benchmarking fails the job; the launch itself is recorded, not compiled."""
    import importlib

    os.environ["TRITON_CACHE_DIR"] = payload["out"]
    sys.path.insert(0, payload["fixtures"])
    import triton
    from triton.runtime.autotuner import Autotuner

    module = importlib.import_module(payload.get("module", "user_kernel"))
    fn = getattr(module, payload.get("kernel", "user_scale")).fn
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in (32, 128) for w in (1, 4)]

    def no_bench(*_a, **_k):
        raise AssertionError("Triton benchmarked: no exported cache file was found for this launch")

    tuner = Autotuner(fn, fn.arg_names, configs, ["n"], None, None, do_bench=no_bench, cache_results=True)
    hits, launched = [], []
    listens = "listener" in type(triton.knobs.autotuning).__dict__  # Triton 3.9 says cache hits; 3.6 has no listener
    triton.knobs.autotuning.listener = lambda **kw: hits.append(kw["cache_hit"])
    fn.run = lambda *a, **kw: launched.append({k: kw[k] for k in ("BLOCK", "num_warps", "num_stages")})

    class TorchLike:  # what Triton's tuning key reads of a torch tensor argument: str(arg.dtype)
        def __init__(self, dtype: str):
            self.dtype = dtype

    x_dtype, out_dtype = payload.get("dtypes", ("torch.float32", "torch.float32"))
    try:
        tuner[(1,)](TorchLike(x_dtype), TorchLike(out_dtype), 1000)
        timings = [[c.__dict__, t] for c, t in tuner.configs_timings.items()]
        yield {"ok": True, "launched": launched, "hits": hits, "listens": listens, "timings": timings}
    except AssertionError as e:
        yield {"ok": False, "error": str(e)}


def test_triton_autotune_cache_is_read_by_triton_without_benchmarking(user_certs, tmp_path):
    from crosstools import cross_compile

    out = tmp_path / "cache"
    args = ("export", "--format", "triton-autotune", "--profile", "hopper", "--dir", user_certs, "--out", out)
    r = nbx(*args, "--spec", "user_kernel", "--json", env=RUN_ENV, drop=NOT_INTERPRETED)
    report = check_json(r, 0)
    manifest = json.loads((out / "autotune_manifest.json").read_text())
    assert [w["file"] for w in report["written"]] == list(manifest["files"])
    [(rel, item)] = manifest["files"].items()
    assert (item["key"], item["tuning_key"]) == (USER_KEY, [1000, "torch.float32", "torch.float32"])
    import triton

    assert manifest["triton"] == triton.__version__ and manifest["env"] == {"TRITON_DEFAULT_FP_FUSION": "true"}
    assert re.fullmatch(r"[A-Z2-7]+/user_scale\.autotune\.json", rel), rel
    doc = json.loads((out / rel).read_text())
    assert list(doc) == ["key", "configs_timings"] and doc["key"] == [1000, "torch.float32", "torch.float32"]
    params = ["kwargs", "num_warps", "num_ctas", "num_stages", "maxnreg", "pre_hook", "ir_override"]  # Config(...)
    assert all(list(c) == params and isinstance(t, list) for c, t in doc["configs_timings"])
    order = [(c["kwargs"]["BLOCK"], c["num_warps"], t[0]) for c, t in doc["configs_timings"]]
    assert order == [(128, 4, 0.01), (128, 1, 0.011), (32, 1, 0.014)]  # winner first; (32, 4) left out
    assert item["faster_finalists_left_out"] == 1

    [read] = cross_compile(90, _read_with_triton, {"out": str(out), "fixtures": str(FIXTURES)}, timeout=300)
    assert read["ok"], read["error"]
    assert read["hits"] == ([True] if read["listens"] else [])  # and no benchmark ran either way (no_bench raises)
    assert read["launched"] == [{"BLOCK": 128, "num_warps": 4, "num_stages": 3}]
    assert [[c["kwargs"], t] for c, t in read["timings"]] == [[c["kwargs"], t] for c, t in doc["configs_timings"]]


def test_triton_autotune_key_holds_every_tensor_dtype_when_dtype_args_names_fewer(tmp_path):
    """dtype_args=("x_ptr",) of a kernel launched with x (float32) and out (float16): the certified key holds one dtype,
    Triton's tuning key both tensors'. The export wrote [n, x's dtype], a file Triton never read (it benchmarked)."""
    from crosstools import cross_compile

    root = tmp_path / "certs"
    key = "user_scale_one_dtype[n=1000;float32]@v1"
    timed = [(user(128, 4), 10.0), (user(32, 1), 14.0)]
    write_cert(root, "user_scale_one_dtype", "float32", {key: entry(user(128, 4), timed, {"n": 1000}, user(32, 1))})
    out = tmp_path / "cache"
    args = ("export", "--format", "triton-autotune", "--profile", "hopper", "--dir", root, "--out", out)
    r = nbx(*args, "--spec", "user_kernel_one_dtype", "--json", env=RUN_ENV, drop=NOT_INTERPRETED)
    report = check_json(r, 0)
    assert report["skipped"] == [], report["skipped"]
    [(rel, item)] = json.loads((out / "autotune_manifest.json").read_text())["files"].items()
    assert item["tuning_key"] == [1000, "torch.float32", "torch.float16"]
    assert json.loads((out / rel).read_text())["key"] == [1000, "torch.float32", "torch.float16"]

    payload = {"out": str(out), "fixtures": str(FIXTURES), "module": "user_kernel_one_dtype"}
    payload.update(kernel="user_scale_one_dtype", dtypes=["torch.float32", "torch.float16"])
    [read] = cross_compile(90, _read_with_triton, payload, timeout=300)
    assert read["ok"], read["error"]
    assert read["launched"] == [{"BLOCK": 128, "num_warps": 4, "num_stages": 3}]


def test_triton_version_other_than_the_one_reproduced_is_refused_by_name():
    from nbxcert.errors import UsageError
    from nbxcert.export import check_triton

    with pytest.raises(UsageError, match=r"Triton is 3\.8\.1; .* Triton 3\.6, 3\.9 only"):
        check_triton("3.8.1")


@pytest.mark.parametrize(
    ("gpu", "device_name"),
    [
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
    ],
)
def test_vllm_device_names(gpu, device_name):
    from nbxcert.export import vllm_device_name

    assert vllm_device_name(gpu) == device_name


# --- one-line errors ------------------------------------------------------------------------------------------------
def test_refusals_are_one_line_each(moe_certs, user_certs, tmp_path):
    out = tmp_path / "out"
    cases = [
        (("--format", "vllm", "--profile", "hopper", "--dir", moe_certs), {}, "usage: --format 'vllm' is not"),
        (("--format", "vllm-fused-moe", "--profile", "hopper", "--dir", user_certs), {}, "key not certified: no"),
        (("--format", "vllm-fused-moe", "--profile", "hopper", "--dir", tmp_path / "nosuch"), {}, "no such directory"),
        (("--format", "vllm-fused-moe", "--profile", "interpreter", "--dir", moe_certs), {}, "on a GPU"),
        (
            ("--format", "triton-autotune", "--profile", "hopper", "--dir", user_certs, "--spec", "user_kernel"),
            {"TRITON_INTERPRET": "1"},
            "TRITON_INTERPRET=1",
        ),
    ]
    for args, env, line in cases:
        r = nbx("export", *args, "--out", out, env=env)
        check(r, 1)
        [err] = error_lines(r)
        assert line in err, (args, err)
    assert not out.exists()  # a refusal writes nothing
