"""Compiling the next key while this one is checked and timed (`nbxcert.ahead`): the requests made ahead are the
sweep's own, a sweep takes them only when they are, and `certify` submits each next key's compile as soon as the key
before it has compiled."""

from __future__ import annotations

import sys
import time

import pytest

from nbxcert import ahead, certify
from nbxcert.errors import UsageError
from nbxcert.keys import parse_key
from nbxcert.profiles import get_profile
from nbxcert.sweep import sweep_key
from nbxcert.worker import CompilePool, Worker

INTERPRETED = {"NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1"}

# one key of each family whose prune differs at the two ends of a bucket or by the device file's limits (hopper)
HOPPER_KEYS = [
    "matmul[K=4096,M=512,N=6144,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1",
    "matmul[K=3584,M=1,N=152064,aligned=1,trans_a=0,trans_b=1;bfloat16,bfloat16]@v1",
    "flash_attention[aligned=1,batch=1,causal=1,head_dim=128,heads=28,kv_heads=4,kv_len=16,q_len=2;float16]@v1",
    "decode_attention[batch=64,head_dim=128,heads=28,kv_heads=4,kv_len=4096;bfloat16]@v1",
    "rmsnorm[n_cols=3584,n_rows=2;float16,float16]@v1",
    "softmax[mask=none,n_cols=152064,n_rows=1;float16]@v1",
    "fused_moe[K=4096,M=4096,N=28672,experts=8,mul_weight=0,pair_rows=0,top_k=2;bfloat16,bfloat16]@v1",
    "conv2d[C=640,H=32,K=640,R=3,S=3,W=32,batch=4,bias=1,dilation=1,groups=1,layout=nchw,padding=1,stride=1;float16]@v1",
]


class _Recorded(Exception):
    pass


class _Recorder:
    """A compile pool that keeps what the sweep asks for, then ends the sweep."""

    def __init__(self):
        self.requests = None

    def compile_all(self, requests, timeout_s):
        self.requests = requests
        raise _Recorded


class _IdleRunner:
    """A runner that prepares nothing (the sweep ends at its compile)."""

    def request(self, message, timeout_s):
        return {"status": "prepared", "seconds": {}}

    def kill(self):
        pass


@pytest.mark.parametrize("text", HOPPER_KEYS, ids=lambda t: t.split("[")[0])
def test_the_requests_made_ahead_are_the_ones_the_sweep_asks_for(text):
    from nbxcert.kernels.spec import get_spec

    profile = get_profile("nvidia/hopper")
    key = parse_key(text)
    spec = get_spec(key.kernel)
    recorder = _Recorder()
    with pytest.raises(_Recorded):
        sweep_key(spec, key, profile, _IdleRunner(), recorder, seed=11, timeout_s=10)
    made = ahead.compile_requests(spec, key, profile, seed=11)
    assert made == recorder.requests and made


@pytest.fixture(scope="module")
def pool():
    p = CompilePool(INTERPRETED, [], 2)
    yield p
    p.close()


def _requests(n: int, tag: str) -> list[dict]:
    key = parse_key("rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1")
    from nbxcert.kernels.spec import get_spec

    reqs = ahead.compile_requests(get_spec(key.kernel), key, get_profile("cpu/interpreter"), seed=1)[:n]
    return [{**r, "tag": tag} for r in reqs]


def test_a_sweep_takes_the_set_submitted_for_it_and_calls_its_hook_once(pool):
    p = ahead.AheadPool(pool, 30)
    calls = []
    mine = _requests(3, "a")
    p.submit(mine)
    p.after_compile = lambda: calls.append("hook")
    replies = p.compile_all(mine, 30)
    assert [r["status"] for r in replies] == ["compiled"] * 3
    assert (p.submitted, p.used, calls) == (1, 1, ["hook"])
    # the hook is for one key only: the next compile calls none unless it is set again
    p.compile_all(mine, 30)
    assert calls == ["hook"] and p.used == 1


def test_a_set_submitted_for_another_key_is_waited_for_and_not_used(pool):
    p = ahead.AheadPool(pool, 30)
    p.submit(_requests(2, "other"))
    replies = p.compile_all(_requests(3, "mine"), 30)
    assert len(replies) == 3 and all(r["status"] == "compiled" for r in replies)
    assert (p.submitted, p.used) == (1, 0)
    p.submit(_requests(2, "left"))
    p.close()  # a set nobody took is waited for before the pool closes
    assert all(not w.process or not w.process.is_alive() for w in pool.workers)


def test_each_queued_set_is_taken_by_its_own_key_in_any_order(pool):
    """Sets queued for the next keys run in turn; each key's sweep takes its own set, whatever the order the keys
    are swept in, and a pool that is closed refuses a compile in one line."""
    p = ahead.AheadPool(pool, 30)
    sets = [_requests(n, tag) for n, tag in ((1, "a"), (2, "b"), (3, "c"))]  # told apart by their lengths
    for one in sets:
        p.submit(one)
    assert len(p.compile_all(sets[2], 30)) == 3
    assert len(p.compile_all(sets[0], 30)) == 1
    assert len(p.compile_all(sets[1], 30)) == 2
    assert (p.submitted, p.used) == (3, 3)
    p.close()
    with pytest.raises(RuntimeError, match="the compile pool was closed"):
        p.compile_all(sets[0], 30)


def test_a_cancelled_compile_drains_at_once_and_starts_no_worker_again():
    pool = CompilePool(INTERPRETED, [], 2)
    p = ahead.AheadPool(pool, 30)
    try:
        p.submit(_requests(1, "x") * 5000)
        p.submit(_requests(1, "y") * 10)  # queued behind it, never started
        deadline = time.monotonic() + 60  # both workers started (a worker starting during the cancel would live on)
        while not all(w.process is not None and w.process.is_alive() for w in pool.workers):
            assert time.monotonic() < deadline, "the compile workers did not start"
            time.sleep(0.01)
        t0 = time.perf_counter()
        p.kill()
        assert time.perf_counter() - t0 < 5
        assert all(w.process is None or not w.process.is_alive() for w in pool.workers)
    finally:
        pool.close()


@pytest.mark.parametrize("asked", [0, 1, 2, None])
def test_certify_compiles_each_next_key_while_the_one_before_is_judged(tmp_path, monkeypatch, asked):
    """In a certify run with a compile pool (on the interpreter a compile is a no-op, so a pool is forced here), the
    compiles of the next `ahead_keys` keys (`--ahead`; None: AHEAD_KEYS) are queued before key k is recorded, each
    once, and every key after the first takes its set; with 0 none is queued ahead and each key compiles its own."""
    depth = ahead.AHEAD_KEYS if asked is None else asked
    events: list[tuple[str, str]] = []
    made: list[ahead.AheadPool] = []

    class Watched(ahead.AheadPool):
        def __init__(self, *a):
            super().__init__(*a)
            made.append(self)

        def submit(self, requests):
            events.append(("submit", requests[0]["spec"] + str(sorted(requests[0]["problems"]["timing"].items()))))
            super().submit(requests)

    monkeypatch.setattr(certify, "AheadPool", Watched)
    monkeypatch.setattr(certify, "compile_pool", lambda backend, env, modules, jobs: CompilePool(env, modules, 2))
    texts = [
        "rmsnorm[n_cols=64,n_rows=2;float16,float16]@v1",
        "silu_and_mul[d=128,n_rows=2;float16]@v1",
        "embedding[dim=64,n_tokens=2;float16,int32]@v1",
    ]
    keys = [parse_key(t) for t in texts]
    report = certify.certify(
        "interpreter",
        keys,
        tmp_path / "out",
        jobs=1,
        on_key=lambda kr: events.append(("done", kr.key)),
        ahead_keys=asked,
    )
    assert [k.status for k in report.keys] == ["certified"] * 3
    (p,) = made
    if depth == 0:
        assert (p.submitted, p.used) == (0, 0) and [e[0] for e in events] == ["done"] * 3
        return
    assert (p.submitted, p.used) == (2, 2)
    if depth == 1:  # key 2's compile was queued inside key 1's sweep, before key 1 was recorded; key 3's inside key 2's
        assert [e[0] for e in events] == ["submit", "done", "submit", "done", "done"]
        assert events[0][1].startswith("silu_and_mul") and events[2][1].startswith("embedding")
    else:  # both queued inside key 1's sweep (2 keys ahead or more)
        assert [e[0] for e in events] == ["submit", "submit", "done", "done", "done"]
        assert events[0][1].startswith("silu_and_mul") and events[1][1].startswith("embedding")


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_ahead_that_is_no_count_of_keys_is_refused_in_one_line(tmp_path, bad):
    with pytest.raises(UsageError, match="is not a count of keys") as info:
        certify.certify(
            "interpreter", [parse_key("rmsnorm[n_cols=64,n_rows=2;float16,float16]@v1")], tmp_path, ahead_keys=bad
        )
    assert "\n" not in str(info.value) and not (tmp_path / "cpu").exists()


def test_compile_workers_keep_no_freed_block(monkeypatch):
    """A certify run's compile workers give every freed block back to their pool (each key's shape-only inputs are
    sizes they will not ask again), so they do not hold the device memory the runner's checks need."""
    from nbxcert import certify
    from nbxcert.errors import UsageError
    from nbxcert.kernels.backends import memory

    made = {}
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "device")  # the pool whose workers hold device memory
    monkeypatch.setattr(certify, "CompilePool", lambda env, modules, jobs: made.update(env=env) or "pool")
    assert certify.compile_pool("cuda", {"NBXCERT_BACKEND": "cuda"}, [], 2) == "pool"
    assert made["env"] == {"NBXCERT_BACKEND": "cuda", "NBXCERT_MEMORY_KEPT_PER_SIZE": "0"}
    assert certify.compile_pool("interpreter", {}, [], 2) is None
    for text, want in (("0", 0), ("", 2), (" 3 ", 3)):
        monkeypatch.setenv("NBXCERT_MEMORY_KEPT_PER_SIZE", text)
        assert memory.kept_per_size() == want
    monkeypatch.setenv("NBXCERT_MEMORY_KEPT_PER_SIZE", "some")
    with pytest.raises(UsageError, match="NBXCERT_MEMORY_KEPT_PER_SIZE=some is not a whole number of blocks"):
        memory.kept_per_size()


def test_workers_closed_together_stop_at_once_not_one_after_another(tmp_path, monkeypatch):
    """A run's end closes its runners and compile workers together (`close_together`): four workers that each take a
    second to exit stop in about one second, not four (each tears its CUDA context down on a GPU)."""
    (tmp_path / "slow_exit.py").write_text("import atexit\nimport time\n\natexit.register(time.sleep, 1.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned workers start with the parent's sys.path
    workers = [Worker(INTERPRETED, ["slow_exit"]) for _ in range(4)]
    request = _requests(1, "x")[0]

    def started() -> None:
        for w in workers:
            assert w.request(request, 60)["status"] == "compiled"

    started()
    t0 = time.perf_counter()
    for w in workers:  # one after another, as a run closed them before: each waits for the one before it
        w.close()
    one_by_one = time.perf_counter() - t0
    started()
    t0 = time.perf_counter()
    ahead.close_together(workers)
    together = time.perf_counter() - t0
    assert all(not w.process or not w.process.is_alive() for w in workers)
    assert one_by_one >= 4.0 and 1.0 <= together < one_by_one - 1.5, (together, one_by_one)


def test_on_a_gpu_the_workers_c_modules_are_built_once_before_any_worker_starts(monkeypatch):
    """`ready_for_workers`: on CUDA, nbxcert's launcher built and the driver's Triton utilities waited for, in the
    calling process (each worker loads them instead of running the same C build at once); nothing off CUDA."""
    import types

    from nbxcert.kernels import backends

    calls: list[str] = []

    class Driver:
        @property
        def utils(self):
            calls.append("utils")
            return object()

    launcher = types.SimpleNamespace(build=lambda: calls.append("launcher"))
    triton_cuda = types.SimpleNamespace(installed=lambda: Driver())
    for name, module in (("launcher", launcher), ("triton_cuda", triton_cuda)):
        monkeypatch.setitem(sys.modules, f"nbxcert.kernels.backends.{name}", module)
        monkeypatch.setattr(backends, name, module, raising=False)
    ahead.ready_for_workers()  # this process's backend: the interpreter
    assert calls == []
    monkeypatch.setattr(backends, "select", lambda: types.SimpleNamespace(name="cuda"))
    ahead.ready_for_workers()
    assert calls == ["launcher", "utils"]


def test_certify_builds_the_workers_c_modules_before_it_starts_a_worker(tmp_path, monkeypatch):
    """The pool certify makes on a GPU (`ahead.cuda_pool`: forced here on the interpreter, whose compiles are no-ops)
    builds the C modules before the run's first worker, runner or compile worker, starts."""
    order: list[str] = []
    monkeypatch.setenv("NBXCERT_COMPILE_POOL", "device")  # the cross pool reads the GPU's target: none here
    monkeypatch.setattr(ahead, "ready_for_workers", lambda: order.append("ready"))
    monkeypatch.setattr(certify, "compile_pool", lambda backend, env, modules, jobs: ahead.cuda_pool(env, modules, 2))
    start = Worker._start
    monkeypatch.setattr(Worker, "_start", lambda self: (order.append("worker"), start(self))[1])
    key = parse_key("rmsnorm[n_cols=64,n_rows=2;float16,float16]@v1")
    report = certify.certify("interpreter", [key], tmp_path / "out", jobs=1)
    assert [k.status for k in report.keys] == ["certified"]
    assert order[0] == "ready" and order.count("ready") == 1 and "worker" in order
