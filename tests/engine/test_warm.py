"""`nbxcert warm`: the certified winners of a workload compiled ahead into Triton's cache (on a GPU), missing keys
listed, through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOPPER_KEY = "rmsnorm[n_cols=2048,n_rows=1;float16,float16]@v1"  # shipped in certificates/nvidia/hopper


def nbx(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nbxcert", *map(str, args)], capture_output=True, text=True, env=e, timeout=600
    )


def test_warm_lists_every_certified_winner_and_the_missing_keys(backend, tmp_path):
    if backend.name != "interpreter":
        pytest.skip("the interpreter's answer (nothing to compile); the GPU test compiles")
    env = {"NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1", "NBXCERT_CACHE_DIR": str(tmp_path / "c")}
    r = nbx("warm", "--profile", "interpreter", "--workload", "demo", "--dir", ROOT / "certificates", env=env)
    assert r.returncode == 0, r.stderr
    assert (
        "[nbxcert] warm cpu/interpreter: 23 keys, nothing to compile under the interpreter for 23 certified winners"
        in r.stdout
        and "0 missing, 0 failed" in r.stdout
    )
    # not in the demo workload: never certified (n_rows=4, a rung: n_rows=3 is a key no launch forms, refused now)
    extra = "rmsnorm[n_cols=64,n_rows=4;float16,float16]@v1"
    r = nbx(
        "warm",
        "--profile",
        "interpreter",
        "--workload",
        "demo",
        "--key",
        extra,
        "--dir",
        ROOT / "certificates",
        "--json",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["keys"] == 24 and doc["missing"] == [extra] and doc["failed"] == []
    # the JSON says what the line says: 23 winners found, none compiled (it said "compiled": 23)
    assert doc["winners"] == 23 and doc["compiled"] == 0


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
def test_on_the_gpu_start_compiles_the_winner_while_the_caller_launches(backend, tmp_path):
    """`warm.start` on the card: the caller's launch of the key goes on while the pool compiles; the report says the
    winner compiled, and its binary is in the cache."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    code = (
        "import numpy as np\nfrom nbxcert import warm\nfrom nbxcert.keys import parse_key\n"
        "from nbxcert.kernels import rows\nfrom nbxcert.kernels.backends import select\n"
        "from nbxcert.kernels.tensor import from_numpy\n"
        f"handle = warm.start('hopper', [parse_key({HOPPER_KEY!r})], [{str(ROOT / 'certificates')!r}], jobs=2)\n"
        "d = select().device\nx = from_numpy(np.ones((1, 2048)), 'float16', d)\n"
        "w = from_numpy(np.ones(2048), 'float16', d)\nout = rows.rmsnorm(x, w).numpy()\nr = handle.wait(300)\n"
        "print(r.compiled, len(r.failed), len(r.missing), float(out[0, 0]))\n"
    )
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "NBXCERT_CACHE_DIR": str(tmp_path / "c"),
        "NBXCERT_BACKEND": "cuda",
        "NBXCERT_CERTIFIED_ONLY": "1",
    }
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    compiled, failed, missing, first = r.stdout.split()
    assert (compiled, failed, missing) == ("1", "0", "0") and abs(float(first) - 1.0) < 1e-2
    assert any((tmp_path / "triton").rglob("*.cubin"))


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

    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "device")  # the pool class patched here; the cross one reads a GPU
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
        return {
            "op": "compile",
            "name": name,
            "spec": spec,
            "config": {"kwargs": {"BLOCK": block}, "num_warps": 4, "num_stages": 1},
            "dtypes": [dtype],
            "problems": {},
            "seed": 0,
            "profile": "nvidia/hopper",
        }

    requests = [
        request("a1", "rmsnorm", 1024),
        request("a2", "rmsnorm", 1024),
        request("b1", "rmsnorm", 2048),
        request("c1", "rmsnorm", 1024, "bfloat16"),
        request("a3", "rmsnorm", 1024),
        request("d1", "rope", 1024),
        request("b2", "rmsnorm", 2048),
    ]
    replies = warm.compile_all(requests, jobs=2)
    assert batches == [["a1", "b1", "c1", "d1"], ["a2", "a3", "b2"]]
    assert [r["name"] for r in replies] == [r["name"] for r in requests]
    assert warm.phases([]) == ([], [])


def _blocking_pool(monkeypatch, gate, jobs_seen, fail=None):
    """A compile pool that answers once `gate` is set (or raises `fail`), recording the jobs it was given."""
    from nbxcert import worker

    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "device")  # the pool class patched here; the cross one reads a GPU

    class Pool:
        def __init__(self, env, modules, jobs):
            jobs_seen.append(jobs)

        def compile_all(self, requests, timeout_s):
            assert gate.wait(30), "the test never opened the gate"
            if fail is not None:
                raise fail
            return [{"status": "compiled"} for _ in requests]

        def close(self):
            pass

    monkeypatch.setattr(worker, "CompilePool", Pool)


def test_start_compiles_in_the_background_while_the_caller_goes_on(monkeypatch):
    """`warm.start` returns before the pool has answered; `wait` gives the report once it has, and says when it is
    still compiling. The pool gets every core but the caller's."""
    import threading

    from nbxcert import warm

    gate, jobs = threading.Event(), []
    _blocking_pool(monkeypatch, gate, jobs)
    requests = [{"spec": "rmsnorm", "config": {"BLOCK": b}, "dtypes": ["float16"]} for b in (1, 2, 3)]
    report = warm.WarmReport("nvidia/hopper", "cuda", keys=4, missing=["k4"])
    monkeypatch.setattr(warm, "_requests", lambda profile, keys, dirs: (report, requests, ["k1", "k2", "k3"]))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    handle = warm.start("hopper", [])
    assert not handle.done()
    with pytest.raises(TimeoutError, match="still compiling after 0.05 s"):
        handle.wait(0.05)
    gate.set()
    done = handle.wait(30)
    assert handle.done() and done.compiled == 3 and done.missing == ["k4"] and done.failed == []
    assert jobs == [15]


def test_a_background_warm_that_fails_says_so_at_once_and_at_wait(monkeypatch, capsys):
    import threading

    from nbxcert import warm

    gate, jobs = threading.Event(), []
    gate.set()
    _blocking_pool(monkeypatch, gate, jobs, fail=OSError("no worker could start"))
    report = warm.WarmReport("nvidia/hopper", "cuda", keys=1)
    monkeypatch.setattr(
        warm,
        "_requests",
        lambda profile, keys, dirs: (report, [{"spec": "rmsnorm", "config": {}, "dtypes": []}], ["k1"]),
    )
    handle = warm.start("hopper", [], jobs=2)
    with pytest.raises(OSError, match="no worker could start"):
        handle.wait(30)
    assert jobs == [2]
    assert (
        "[nbxcert] warm in the background stopped: OSError: no worker could start; launches compile their "
        "kernels themselves" in capsys.readouterr().err
    )


def test_start_under_the_interpreter_reads_the_index_and_compiles_nothing(backend):
    if backend.name != "interpreter":
        pytest.skip("the interpreter's answer (nothing to compile)")
    from nbxcert import serving, warm
    from nbxcert.profiles import get_profile
    from nbxcert.workload import load_workload, workload_keys

    keys = workload_keys(load_workload("demo"), get_profile("interpreter"))
    try:
        report = warm.start("interpreter", keys, [ROOT / "certificates"]).wait(60)
    finally:
        serving.configure()  # the serving state as the environment says, for the tests that follow
    assert report.backend == "interpreter" and report.keys == len(keys) == report.winners and report.missing == []
    assert report.compiled == 0  # nothing compiled under the interpreter, as its name says
