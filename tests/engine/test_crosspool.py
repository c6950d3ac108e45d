"""The cross-compiling compile pool (`nbxcert.crosspool`, NBXCERT_COMPILE_POOL=cross): its workers compile a sweep's
candidates for the GPU's target with no GPU (here, on this machine), and reply as the usual pool does; on a GPU the
runner finds each candidate they compiled in Triton's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from nbxcert import ahead, crosspool
from nbxcert.errors import UsageError
from nbxcert.kernels.spec import get_spec
from nbxcert.keys import key_problems, parse_key
from nbxcert.profiles import get_profile
from tests import crosstools

ROOT = Path(__file__).resolve().parents[2]
RMSNORM_KEY = "rmsnorm[n_cols=2048,n_rows=1;float16,float16]@v1"
MATMUL_KEY = "matmul[K=4096,M=1,N=28672,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1"


def _requests(key_text: str, configs) -> list[dict]:
    """A sweep's compile requests for `configs` of a key (`sweep.sweep_key`'s base request)."""
    key = parse_key(key_text)
    spec = get_spec(key.kernel)
    hopper = get_profile("hopper")
    problems = key_problems(spec, key, hopper)
    base = {"spec": spec.name, "problems": problems, "dtypes": list(key.dtypes), "seed": 0, "profile": hopper.key}
    return [{**base, "op": "compile", "config": c.as_dict()} for c in configs]


def test_the_pool_kind_is_cross_unless_device_is_asked_and_anything_else_is_refused(monkeypatch):
    monkeypatch.delenv("NBXCERT_COMPILE_POOL", raising=False)
    assert crosspool.pool_kind() == "cross"
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "device")
    assert crosspool.pool_kind() == "device"
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "gpu")
    with pytest.raises(UsageError, match="NBXCERT_COMPILE_POOL=gpu is not a compile pool"):
        crosspool.pool_kind()


def test_cuda_pool_makes_the_cross_pool_for_the_gpus_target_when_asked(monkeypatch):
    """`ahead.cuda_pool` (certify's, warm's and the run-time sweep's) makes cross-compiling workers for the target
    read from the GPU, after the C modules are built; the setting is checked before anything starts."""
    made: list = []
    target = crosstools.target(90)
    monkeypatch.setattr(ahead, "ready_for_workers", lambda: made.append("ready"))
    monkeypatch.setattr(crosspool, "device_target", lambda: target)
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "cross")
    pool = ahead.cuda_pool({"NBXCERT_BACKEND": "cuda", "X": "1"}, ["m"], 3)
    try:
        assert isinstance(pool, crosspool.CrossCompilePool) and pool.target is target and len(pool.workers) == 3
        env = pool.workers[0].env
        assert "NBXCERT_BACKEND" not in env and env["X"] == "1" and pool.workers[0].modules == ["m"]
        assert json.loads(env[crosspool.ENV_TARGET])["arch"] == 90 and made == ["ready"]
    finally:
        pool.close()
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "nope")
    with pytest.raises(UsageError):
        ahead.cuda_pool({}, [], 1)
    assert made == ["ready"]  # refused before anything was built or started


def test_cross_workers_compile_a_sweeps_candidates_for_sm90_with_no_gpu(tmp_path, monkeypatch, faulty):
    """Candidates of a matmul key (one of each kind the hopper prune keeps: tiled, split-K, TMA persistent...) and of
    a test kernel compile for sm_90 in two cross workers into Triton's on-disk cache, each reply `compiled`; the test
    kernel's deliberate compile failure is refused as `compile`, with its line, and the worker goes on."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)  # as in a runner: the cross backend sets it
    key = parse_key(MATMUL_KEY)
    spec = get_spec(key.kernel)
    kept = spec.pruned_for(key_problems(spec, key, get_profile("hopper"))["largest"], get_profile("hopper")).kept
    kinds: dict = {}
    for c in kept:
        kinds.setdefault(c["KIND"], c)
    assert {"tiled", "tma_persistent"} <= set(kinds)
    requests = _requests(MATMUL_KEY, list(kinds.values()))
    problems = {"smallest": {"n": 1000}, "largest": {"n": 1000}}
    for fault in (3, 0):  # a static assertion that fails the compile, then a kernel that compiles
        config = next(c for c in faulty.SPEC.candidates if c["FAULT"] == fault)
        base = {"spec": faulty.SPEC.name, "problems": problems, "dtypes": ["float32"], "seed": 0}
        base["profile"] = "nvidia/hopper"
        requests.append({**base, "op": "compile", "config": config.as_dict()})
    pool = crosspool.CrossCompilePool({}, ["faulty_kernels"], 2, crosstools.target(90))
    try:
        replies = pool.compile_all(requests, 600)
    finally:
        pool.close()
    statuses = [r["status"] for r in replies]
    assert statuses == ["compiled"] * len(kinds) + ["compile", "compiled"], [r.get("reason") for r in replies]
    assert "FAULT=3 is a deliberate compile failure" in replies[-2]["reason"]
    assert all(r["seconds"] > 0 for r in replies if r["status"] == "compiled")
    cubins = list((tmp_path / "triton").rglob("*.cubin"))
    assert len(cubins) >= len(kinds) + 1
    metadata = [json.loads(p.read_text()) for p in (tmp_path / "triton").rglob("*.json") if _is_md(p)]
    assert {m["target"]["arch"] for m in metadata} == {90}
    # Triton's cache key holds the variables that change a compile, and the metadata records them: the workers'
    # were the pool maker's (here: none), so a runner's launch names the same cache entries
    assert not [k for m in metadata for k in m if k.startswith("TRITON_")], "a worker compiled under its own TRITON_*"


# A kernel file written for torch, as Triton's tutorials are: it asks the active driver for torch's device at import.
_TORCH_FORM = """
import triton
DEVICE = triton.runtime.driver.active.get_active_torch_device()
"""


def test_a_module_that_does_not_import_in_a_cross_worker_is_named_in_every_reply(tmp_path, monkeypatch):
    """A --spec module that fails at import in a cross-compiling worker (here: it asks for torch's device, and torch
    is not imported) is not a dead worker restarted three times: each request is answered `crash` with the module's
    name and its one line, and the pool goes on."""
    (tmp_path / "torch_form_kernels.py").write_text(_TORCH_FORM)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    pool = crosspool.CrossCompilePool({}, ["torch_form_kernels"], 1, crosstools.target(90))
    try:
        replies = pool.compile_all(_requests(RMSNORM_KEY, get_spec("rmsnorm").candidates[:2]), 300)
    finally:
        pool.close()
    assert [r["status"] for r in replies] == ["crash", "crash"]
    for reply in replies:
        assert reply["reason"].startswith("module torch_form_kernels does not import in a cross-compiling worker: ")
        assert "torch is not imported" in reply["reason"]


def test_the_cross_driver_gives_torchs_device_only_where_the_caller_imported_torch(monkeypatch):
    """nbxcert never imports torch: the cross driver answers `get_active_torch_device` with torch's own device type
    where the caller's module has imported torch, and refuses it, saying so, where not."""
    from nbxcert.kernels.backends import cross

    driver = cross.CrossDriver(crosstools.target(90))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with pytest.raises(NotImplementedError, match="torch is not imported"):
        driver.get_active_torch_device()
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(device=lambda kind, index: (kind, index)))
    assert driver.get_active_torch_device() == ("cuda", 0)


def _is_md(path: Path) -> bool:
    """A compiled kernel's metadata file in Triton's cache (not a group index)."""
    return not path.name.startswith("__grp__") and "target" in path.read_text()[:4000]


# Each candidate compiled by the cross pool, then checked by the runner in this process on the GPU: Triton's compile
# listener tells, for each of the candidate's kernels, whether the on-disk cache held it.
_ON_GPU = """
import json, sys
from triton import knobs
from nbxcert import ahead, runner
sys.path.insert(0, {root!r})
from tests.engine.test_crosspool import _requests
from nbxcert.kernels.spec import get_spec
from nbxcert.keys import key_problems, parse_key
from nbxcert.profiles import get_profile
key = parse_key({key!r})
spec = get_spec(key.kernel)
hopper = get_profile("hopper")
kept = spec.pruned_for(key_problems(spec, key, hopper)["largest"], hopper).kept
kinds = {{}}
for c in kept:
    kinds.setdefault(c.params.get("KIND", "one"), c)
requests = _requests({key!r}, list(kinds.values()))
pool = ahead.cuda_pool({{"NBXCERT_BACKEND": "cuda"}}, [], 2)
compiled = [r["status"] for r in pool.compile_all(requests, 600)]
pool.close()
names = {{getattr(k, "fn", k).__name__ for k in spec.kernels}}
seen = []
knobs.compilation.listener = lambda **kw: seen.append((kw["metadata"]["name"], kw["cache_hit"]))
checked = [runner.handle({{**r, "op": "check"}})["status"] for r in requests]
print(json.dumps({{"compiled": compiled, "checked": checked, "seen": [s for s in seen if s[0] in names]}}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("key", [RMSNORM_KEY, MATMUL_KEY])
def test_on_the_gpu_the_runner_finds_every_kernel_the_cross_pool_compiled(backend, tmp_path, key):
    """With NBXCERT_COMPILE_POOL=cross, each candidate the pool compiled is a hit of Triton's on-disk cache when the
    runner launches it on the GPU (the same target, options and specialization), and is judged correct."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "NBXCERT_BACKEND": "cuda",
        "NBXCERT_COMPILE_POOL": "cross",
    }
    code = _ON_GPU.format(root=str(ROOT), key=key)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(found["compiled"]) == {"compiled"} and set(found["checked"]) == {"correct"}, found
    assert found["seen"] and all(hit for _name, hit in found["seen"]), found["seen"]


def test_doctor_and_certify_say_which_pool_compiles_and_refuse_a_bad_setting(tmp_path, monkeypatch):
    """`crosspool.describe`: the pool a run makes in words (doctor's `compile pool` row, certify's log line); a bad
    NBXCERT_COMPILE_POOL is doctor's `unusable: ...` and certify's one-line usage error before any key."""
    monkeypatch.delenv("NBXCERT_COMPILE_POOL", raising=False)
    assert crosspool.describe("cuda").startswith("cross: workers cross-compile for the GPU, no CUDA context")
    assert crosspool.describe("interpreter") == "none on the interpreter backend (it compiles nothing ahead)"
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "device")
    assert crosspool.describe("cuda").startswith("device: each compile worker makes a CUDA context")
    env = {**os.environ, "NBXCERT_BACKEND": "interpreter", "NBXCERT_COMPILE_POOL": "bad"}
    run = [sys.executable, "-m", "nbxcert"]
    r = subprocess.run([*run, "doctor", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert json.loads(r.stdout)["compile_pool"] == "unusable: NBXCERT_COMPILE_POOL=bad is not a compile pool"
    certify = [*run, "certify", "--profile", "interpreter", "--workload", "demo", "--out", str(tmp_path / "c")]
    r = subprocess.run(certify, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        "nbxcert: usage: NBXCERT_COMPILE_POOL=bad is not a compile pool -> set it to one of device, cross, or unset "
        "it (cross)"
    )
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.json"))
