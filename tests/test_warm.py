"""`nbxcert warm`: the certified winners of a workload compiled ahead into Triton's cache (on a GPU), missing keys
listed, through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOPPER_KEY = "rmsnorm[n_cols=2048,n_rows=1;float16,float16]@v1"  # shipped in certificates/nvidia/hopper


def nbx(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "nbxcert", *map(str, args)], capture_output=True, text=True, env=e,
                          timeout=600)  # fmt: skip


def test_warm_lists_every_certified_winner_and_the_missing_keys(backend, tmp_path):
    if backend.name != "interpreter":
        pytest.skip("the interpreter's answer (nothing to compile); the GPU test compiles")
    env = {"NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1", "NBXCERT_CACHE_DIR": str(tmp_path / "c")}
    r = nbx("warm", "--profile", "interpreter", "--workload", "demo", "--dir", ROOT / "certificates", env=env)
    assert r.returncode == 0, r.stderr
    assert "[nbxcert] warm cpu/interpreter: 23 keys, nothing to compile under the interpreter for 23 certified " \
        "winners" in r.stdout and "0 missing, 0 failed" in r.stdout  # fmt: skip
    extra = "rmsnorm[n_cols=64,n_rows=3;float16,float16]@v1"  # not in the demo workload: never certified
    r = nbx("warm", "--profile", "interpreter", "--workload", "demo", "--key", extra, "--dir", ROOT / "certificates",
            "--json", env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["keys"] == 24 and doc["missing"] == [extra] and doc["failed"] == []


@pytest.mark.gpu
def test_on_the_gpu_warm_compiles_the_certified_winner(backend, tmp_path):
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    env = {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "NBXCERT_CACHE_DIR": str(tmp_path / "c")}
    r = nbx("warm", "--profile", "hopper", "--key", HOPPER_KEY, "--dir", ROOT / "certificates", "--jobs", "2", env=env)
    assert r.returncode == 0, r.stderr
    assert "1 keys, compiled 1 certified winners" in r.stdout and "0 missing, 0 failed" in r.stdout
    assert any((tmp_path / "triton").rglob("*.cubin")), "the winner's binary is in the cache"


@pytest.mark.gpu
def test_on_the_gpu_compile_ahead_fills_the_cache_for_the_launches_that_follow(backend, tmp_path):
    """The GPU tests' and benchmarks' helper: every config compiled in the pool, its binary in Triton's cache."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    code = (
        "from nbxcert.kernels import rows\nfrom nbxcert.profiles import get_profile\nfrom nbxcert.warm import "
        "compile_ahead\np = {'n_rows': 64, 'n_cols': 2048}\nhopper = get_profile('hopper')\n"
        "kept = rows.RMSNORM.pruned_for(p, hopper).kept[:3]\n"
        "print(compile_ahead(rows.RMSNORM, p, ('float16', 'float16'), kept, hopper.key, jobs=2), len(kept))\n"
    )
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "NBXCERT_BACKEND": "cuda"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    compiled, kept = map(int, r.stdout.split())
    assert compiled == kept == 3
    assert len(list((tmp_path / "triton").rglob("*.cubin"))) >= 3


@pytest.mark.gpu
def test_on_the_gpu_a_compile_request_gives_its_inputs_memory_back(backend):
    """A compile worker keeps no inputs between requests: 32 workers that each kept the last problems' Mixtral
    fused_moe inputs held the H200's memory until the GPU test that started them could not allocate."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    code = (
        "import gc\nfrom nbxcert import runner\nfrom nbxcert.kernels import matmul\n"
        "from nbxcert.kernels.backends import cuda\nfrom nbxcert.profiles import get_profile\n"
        "from nbxcert.warm import compile_request\n"
        "p = {'M': 16, 'N': 16384, 'K': 16384, 'trans_a': 0, 'trans_b': 0, 'aligned': 1}\n"
        "hopper = get_profile('hopper')\nconfig = matmul.MATMUL.pruned_for(p, hopper).kept[0]\n"
        "req = compile_request(matmul.MATMUL, config, ('float16', 'float16'), {'smallest': p, 'largest': p}, 0, "
        "hopper.key)\n"
        "cuda.use_device(0)\nbefore = cuda.mem_get_info(0)[0]\n"
        "reply = runner.handle(req)\ngc.collect()\n"
        "print(reply['status'], before - cuda.mem_get_info(0)[0])\n"
    )
    env = {**os.environ, "NBXCERT_BACKEND": "cuda"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    status, kept_bytes = r.stdout.split()
    assert status == "compiled"
    # the inputs are 512 MiB (B is 16384 x 16384 float16); what stays may be the driver's own, far less
    assert int(kept_bytes) < 64 << 20, f"{int(kept_bytes) >> 20} MiB still held after the compile request"


def test_compile_all_compiles_each_kernel_once_before_its_other_specialisations(monkeypatch):
    """Requests of one kernel, config and dtypes go to the pool after one of each has compiled (else its workers
    compile that kernel side by side); the replies still come back in the requests' order."""
    from nbxcert import warm, worker

    batches = []

    class Pool:
        def __init__(self, env, modules, jobs):
            self.closed = False

        def compile_all(self, requests, timeout_s):
            batches.append([r["name"] for r in requests])
            return [{"status": "compiled", "name": r["name"]} for r in requests]

        def close(self):
            pass

    monkeypatch.setattr(worker, "CompilePool", Pool)

    def request(name, spec, block, dtype="float16"):
        return {"op": "compile", "name": name, "spec": spec, "config": {"kwargs": {"BLOCK": block}, "num_warps": 4,
                "num_stages": 1}, "dtypes": [dtype], "problems": {}, "seed": 0, "profile": "nvidia/hopper"}  # fmt: skip

    requests = [request("a1", "rmsnorm", 1024), request("a2", "rmsnorm", 1024), request("b1", "rmsnorm", 2048),
                request("c1", "rmsnorm", 1024, "bfloat16"), request("a3", "rmsnorm", 1024), request("d1", "rope", 1024),
                request("b2", "rmsnorm", 2048)]  # fmt: skip
    replies = warm.compile_all(requests, jobs=2)
    assert batches == [["a1", "b1", "c1", "d1"], ["a2", "a3", "b2"]]
    assert [r["name"] for r in replies] == [r["name"] for r in requests]
    assert warm.phases([]) == ([], [])
