"""Served launch plans (`nbxcert.kernels.launch.LaunchPlan`): a served call like one served before replays the
launches that call made, with its own tensors, instead of checking, keying, looking up and building them again.
They must be exactly the launches the full path makes, never outlive serving's state, never hold a call's tensors,
and never exist for launches holding anything but the call's tensors and plain scalars."""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402

from nbxcert.errors import ShapeMismatch  # noqa: E402
from nbxcert.kernels import attention as at  # noqa: E402
from nbxcert.kernels import elementwise as ew  # noqa: E402
from nbxcert.kernels import launch, rows  # noqa: E402
from nbxcert.kernels import matmul as mm  # noqa: E402
from nbxcert.kernels.inputs import randn, rng  # noqa: E402
from nbxcert.kernels.launch import KernelLaunch, LaunchPlan  # noqa: E402
from nbxcert.kernels.tensor import empty, from_numpy  # noqa: E402


@pytest.fixture
def served(monkeypatch, tmp_path, backend):
    """Serving with no certificate and the untuned default served for every key (a served path with no sweep)."""
    monkeypatch.setattr(launch, "DIRECT", False)  # plans replay through kernel[grid], where captures see them
    with _defaults_served(monkeypatch, tmp_path):
        yield backend.device


@contextlib.contextmanager
def _defaults_served(monkeypatch, tmp_path):
    """Serving with no certificate directory and the untuned default served for every key; no directory override
    left for the tests after it."""
    from nbxcert import serve

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "0")
    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "default")
    serve.configure(dirs=[tmp_path / "none"])
    try:
        yield
    finally:
        serve.configure()


def _cases(device):
    gen = rng(7)
    x, w = randn(gen, (3, 64), "float16", device), randn(gen, (64,), "float16", device)
    r = randn(gen, (3, 64), "float16", device)
    xs = randn(gen, (3, 2 * 48), "float16", device)
    a, b = randn(gen, (5, 32), "float16", device), randn(gen, (48, 32), "float16", device).T
    table, ids = randn(gen, (50, 64), "float16", device), from_numpy(np.array([3, 0, 49]), "int32", device)
    q0, k0 = randn(gen, (3, 4, 64), "float16", device), randn(gen, (3, 2, 64), "float16", device)
    pos, cache = from_numpy(np.array([5, 0, 15]), "int64", device), from_numpy(ew.rope_cache(64, 16), "float32", device)
    decode = {"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 40, "head_dim": 64}
    dec = at.decode_inputs(decode, ("float16",), 1, device)
    dq, dk, dv, dl = (dec.tensors[n] for n in ("q", "k_cache", "v_cache", "lengths"))
    return {
        "rmsnorm": (lambda: rows.rmsnorm(x, w, 1e-6, out=empty((3, 64), "float16", device)), rows._NORM_PLANS),
        "add_rmsnorm": (lambda: rows.add_rmsnorm(x, r, w, 1e-6), rows._NORM_PLANS),
        "silu_and_mul": (lambda: ew.silu_and_mul(xs), ew._SILU_PLANS),
        "matmul": (lambda: mm.matmul(a, b), mm._MATMUL_PLANS),
        "softmax": (lambda: rows.softmax(x, 0.5), rows._SOFTMAX_PLANS),
        "softmax_masked": (lambda: rows.softmax(x, mask=r), rows._SOFTMAX_PLANS),
        "embedding": (lambda: ew.embedding(table, ids), ew._EMBEDDING_PLANS),
        # in place: each call rotates fresh copies of the same q and k
        "rope": (lambda: ew.rope(q0.clone(), k0.clone(), pos, cache), ew._ROPE_PLANS),
        "decode_attention": (lambda: at.decode_attention(dq, dk, dv, dl, max_len=40), at._DECODE_PLANS),
    }


def _same_launches(full: list[KernelLaunch], planned: list[KernelLaunch]) -> None:
    assert len(full) == len(planned) >= 1
    for f, p in zip(full, planned):
        assert p.kernel is f.kernel and p.grid == f.grid and p.kwargs == f.kwargs
        assert len(p.args) == len(f.args)
        for i, (fa, pa) in enumerate(zip(f.args, p.args)):
            if hasattr(fa, "data_ptr"):  # the output may be a fresh tensor; every other tensor is the call's own
                assert (pa.shape, pa.strides, pa.dtype) == (fa.shape, fa.strides, fa.dtype), i
            else:
                assert pa == fa and type(pa) is type(fa), i


@pytest.mark.parametrize(
    "name",
    ["rmsnorm", "add_rmsnorm", "silu_and_mul", "matmul", "softmax", "softmax_masked", "embedding", "rope",
     "decode_attention"],
)  # fmt: skip
def test_a_plan_makes_the_launches_and_the_bits_of_the_full_path(served, name):
    call, plans = _cases(served)[name]
    plans.clear()
    full = common.capture_launches(call)  # no plan yet: checks, key, config, launch built; the plan kept
    assert [v for v in plans.values() if v], "the first served call left no plan"
    planned = common.capture_launches(call)  # the same call again: replayed from the plan
    _same_launches(full, planned)
    first, again = call(), call()
    first, again = first if isinstance(first, tuple) else (first,), again if isinstance(again, tuple) else (again,)
    for f, a in zip(first, again):
        assert np.array_equal(f.numpy().view(np.uint16), a.numpy().view(np.uint16))


def test_the_inputs_of_a_replayed_call_are_its_own(served):
    gen = rng(3)
    w = randn(gen, (64,), "float16", served)
    x1, x2 = randn(gen, (2, 64), "float16", served), randn(gen, (2, 64), "float16", served)
    y1 = rows.rmsnorm(x1, w)  # makes the plan
    y2 = rows.rmsnorm(x2, w)  # replays it on x2
    want = rows.rmsnorm(x2, w, config=rows.RMSNORM.default)  # an explicit config: never a plan
    assert np.array_equal(y2.numpy().view(np.uint16), want.numpy().view(np.uint16))
    assert not np.array_equal(y1.numpy().view(np.uint16), y2.numpy().view(np.uint16))


def test_plans_are_forgotten_with_serving_state(served):
    from nbxcert import serve

    call, plans = _cases(served)["rmsnorm"]
    call()
    assert plans
    serve.reset()
    assert not plans


def test_a_plan_holds_no_tensor_of_the_call_that_made_it(served):
    gen = rng(5)
    x, w = randn(gen, (2, 64), "float16", served), randn(gen, (64,), "float16", served)
    y = rows.rmsnorm(x, w)
    refs = [weakref.ref(t) for t in (x, y)]
    del x, y
    gc.collect()
    assert all(r() is None for r in refs)
    assert any(rows._NORM_PLANS.values())


def test_a_new_signature_is_checked_in_full(served):
    gen = rng(9)
    w = randn(gen, (64,), "float16", served)
    rows.rmsnorm(randn(gen, (2, 64), "float16", served), w)
    with pytest.raises(ShapeMismatch, match="weight/bias must have shape"):
        rows.rmsnorm(randn(gen, (2, 32), "float16", served), w)


def test_a_call_needing_a_view_gets_no_plan_and_stays_right(served):
    gen = rng(11)
    x, w = randn(gen, (2, 3, 64), "float16", served), randn(gen, (64,), "float16", served)
    rows._NORM_PLANS.clear()
    y = rows.rmsnorm(x, w)  # x is viewed as [6, 64] rows: a tensor of this call alone
    assert list(rows._NORM_PLANS.values()) == [False]
    again = rows.rmsnorm(x, w)
    assert np.array_equal(y.numpy().view(np.uint16), again.numpy().view(np.uint16))


def test_launches_holding_other_objects_get_no_plan():
    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    x, y, workspace = object(), object(), empty((4,), "float32", "cpu")
    k = Kernel()
    assert LaunchPlan.of([KernelLaunch(k, (1,), (x, y, 3, 1.5, None), {"BLOCK": 8})], (x, y)) is not None
    assert LaunchPlan.of([KernelLaunch(k, (1,), (x, workspace, 3), {})], (x, y)) is None  # a workspace
    assert LaunchPlan.of([KernelLaunch(k, (1,), (x, [1, 2]), {})], (x, y)) is None  # anything else
    assert LaunchPlan.of([KernelLaunch(k, (1,), (x,), {"DESC": object()})], (x, y)) is None
    assert LaunchPlan.of([], (x, y)) is None  # nothing launched: nothing to replay


def test_a_plan_puts_each_call_tensor_in_its_slots():
    made = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: made.append((grid, args, kwargs))

    x, y, x2, y2 = (object() for _ in range(4))
    plan = LaunchPlan.of([KernelLaunch(Kernel(), (2, 1), (x, x, y, 7, 0.5), {"B": 4})], (x, y))
    plan((x2, y2))
    assert made == [((2, 1), (x2, x2, y2, 7, 0.5), {"B": 4})]


def test_the_memo_of_plans_is_bounded(served, monkeypatch):
    from nbxcert.kernels import launch

    monkeypatch.setattr(launch, "MAX_PLANS", 3)
    gen = rng(13)
    w = randn(gen, (64,), "float16", served)
    rows._NORM_PLANS.clear()
    for n_rows in range(1, 8):  # seven signatures: a prefill length each
        rows.rmsnorm(randn(gen, (n_rows, 64), "float16", served), w)
        assert 1 <= len(rows._NORM_PLANS) <= 3


def test_a_matmul_on_misaligned_operands_is_keyed_apart(served):
    """The matmul key's `aligned` field reads the operands' base addresses: a call on a view one element into its
    buffer (the same shapes and strides) is another key, so it must not replay the aligned call's plan."""
    from nbxcert.kernels.tensor import Tensor

    gen = rng(17)
    a, b = randn(gen, (4, 32), "float16", served), randn(gen, (32, 48), "float16", served)
    mm._MATMUL_PLANS.clear()
    mm.matmul(a, b)
    buf = randn(gen, (4 * 32 + 1,), "float16", served)
    shifted = Tensor(buf.untyped_storage(), (4, 32), (32, 1), "float16", 1)  # base address 2 bytes off
    assert mm._problem_matmul(shifted, b)["aligned"] == 0 and mm._problem_matmul(a, b)["aligned"] == 1
    got = mm.matmul(shifted, b)
    assert len(mm._MATMUL_PLANS) == 2
    want = mm.matmul(shifted, b, config=mm.MATMUL.default)
    assert np.array_equal(got.numpy().view(np.uint16), want.numpy().view(np.uint16))


def test_a_call_whose_tensors_alias_makes_no_plan_for_the_calls_that_do_not(served):
    """out=x (in place) or x @ x: one tensor fills two places, so a plan made from that call could not tell which
    place an argument came from; a later call of the same signature with separate tensors must read its own x."""
    gen = rng(19)
    w = randn(gen, (64,), "float16", served)
    x = randn(gen, (2, 64), "float16", served)
    rows._NORM_PLANS.clear()
    rows.rmsnorm(x, w, out=x)  # in place: no plan kept
    assert not rows._NORM_PLANS
    x2, y2 = randn(gen, (2, 64), "float16", served), empty((2, 64), "float16", served)
    rows.rmsnorm(x2, w, out=y2)
    x3, y3 = randn(gen, (2, 64), "float16", served), empty((2, 64), "float16", served)
    rows.rmsnorm(x3, w, out=y3)  # replayed from x2's plan
    want = rows.rmsnorm(x3, w, config=rows.RMSNORM.default)
    assert np.array_equal(y3.numpy().view(np.uint16), want.numpy().view(np.uint16))

    a = randn(gen, (32, 32), "float16", served)
    mm._MATMUL_PLANS.clear()
    mm.matmul(a, a)
    assert not mm._MATMUL_PLANS
    a2, b2 = randn(gen, (32, 32), "float16", served), randn(gen, (32, 32), "float16", served)
    mm.matmul(a2, b2)
    got = mm.matmul(a2, b2)
    want = mm.matmul(a2, b2, config=mm.MATMUL.default)
    assert np.array_equal(got.numpy().view(np.uint16), want.numpy().view(np.uint16))


def test_a_split_softmax_replays_with_a_workspace_made_alike_or_the_callers(served, monkeypatch):
    """The split variant's workspace: made per call when the caller gives none (a replay makes one alike, as the
    call that made the plan did), else the caller's (a replay uses the next call's)."""
    from nbxcert import serve

    split = next(c for c in rows.SOFTMAX.candidates if c["VARIANT"] == "split")
    monkeypatch.setattr(serve, "config_for", lambda *args, **kwargs: split)  # as if certified
    gen = rng(23)
    x = randn(gen, (2, 3000), "float16", served)
    rows._SOFTMAX_PLANS.clear()
    rows._SOFTMAX_WORKSPACES.clear()
    y = rows.softmax(x)
    assert sum(bool(p) for p in rows._SOFTMAX_PLANS.values()) == 1
    assert list(rows._SOFTMAX_WORKSPACES.values()) == [(2, 3000, "float16", split["BLOCK_N"])]
    made, real = [], rows.split_workspace
    monkeypatch.setattr(rows, "split_workspace", lambda *a: made.append(a) or real(*a))
    again = rows.softmax(x)  # replayed, with a workspace of its own
    assert made == [(2, 3000, "float16", x.device, split["BLOCK_N"])]
    assert np.array_equal(y.numpy().view(np.uint16), again.numpy().view(np.uint16))
    ws = real(2, 3000, "float16", served, split["BLOCK_N"])
    rows.softmax(x, workspace=ws)
    assert sum(bool(p) for p in rows._SOFTMAX_PLANS.values()) == 2 and len(rows._SOFTMAX_WORKSPACES) == 1
    third = rows.softmax(x, workspace=ws)  # replayed with the caller's workspace: none made
    assert len(made) == 1
    assert np.array_equal(y.numpy().view(np.uint16), third.numpy().view(np.uint16))


DIRECT_SCRIPT = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/benchmarks")
from nbxcert import census
census.cross_compile_here(census.Target("cuda", 90, 32, "nvidia/hopper", 132))
from triton import knobs
import common
from nbxcert import serve
from nbxcert.kernels import attention as at, elementwise as ew, launch, matmul as mm, rows
from nbxcert.kernels.inputs import randn, rng
from nbxcert.kernels.tensor import empty, from_numpy
import numpy as np

launched = []  # what each compiled kernel's launcher was handed
census._launch_nothing = lambda *args: launched.append(args)
serve.configure(certified_only=False)
gen = rng(3)
DECODE = {"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 40, "head_dim": 64}

def tensors():
    return {"x": randn(gen, (2, 256), "float16", "cpu"), "w": randn(gen, (256,), "float16", "cpu"),
            "r": randn(gen, (2, 256), "float16", "cpu"), "y": empty((2, 256), "float16", "cpu"),
            "s": empty((2, 256), "float16", "cpu"), "xs": randn(gen, (2, 2 * 96), "float16", "cpu"),
            "ys": empty((2, 96), "float16", "cpu"), "a": randn(gen, (2, 64), "float16", "cpu"),
            "b": randn(gen, (96, 64), "float16", "cpu").T, "c": empty((2, 96), "float16", "cpu"),
            "l": randn(gen, (2, 1000), "float16", "cpu"), "p": empty((2, 1000), "float16", "cpu"),
            "tbl": randn(gen, (50, 64), "float16", "cpu"), "ids": from_numpy(np.array([3, 0, 49]), "int32", "cpu"),
            "e": empty((3, 64), "float16", "cpu"), "q": randn(gen, (3, 4, 64), "float16", "cpu"),
            "k": randn(gen, (3, 2, 64), "float16", "cpu"), "pos": from_numpy(np.array([5, 0, 15]), "int64", "cpu"),
            "cache": from_numpy(ew.rope_cache(64, 16), "float32", "cpu"),
            **{"d_" + n: v for n, v in at.decode_inputs(DECODE, ("float16",), 1, "cpu").tensors.items()}}

calls = {
    "rmsnorm": lambda t: rows.rmsnorm(t["x"], t["w"], 1e-6, out=t["y"]),
    "add_rmsnorm": lambda t: rows.add_rmsnorm(t["x"], t["r"], t["w"], 1e-6, out=t["y"], out_sum=t["s"]),
    "softmax": lambda t: rows.softmax(t["l"], out=t["p"]),
    "silu_and_mul": lambda t: ew.silu_and_mul(t["xs"], out=t["ys"]),
    "matmul": lambda t: mm.matmul(t["a"], t["b"], out=t["c"]),
    "embedding": lambda t: ew.embedding(t["tbl"], t["ids"], out=t["e"]),
    "rope": lambda t: ew.rope(t["q"], t["k"], t["pos"], t["cache"]),
    "decode_attention": lambda t: at.decode_attention(t["d_q"], t["d_k_cache"], t["d_v_cache"], t["d_lengths"],
                                                      t["d_out"], workspace=t["d_workspace"], max_len=40),
}

def view(t):  # a tensor as a launch reads it (a call's views of its tensors are made afresh by each path)
    return (t.data_ptr(), t.shape, t.strides, t.dtype)

def same(x, y):
    if hasattr(x, "data_ptr") or hasattr(y, "data_ptr"):
        return x is y or (hasattr(x, "data_ptr") and hasattr(y, "data_ptr") and view(x) == view(y))
    return x == y and type(x) is type(y)

for name, call in calls.items():
    call(tensors())  # the full path: compiled, and its plan made
    second = tensors()
    launched.clear()
    call(second)  # replayed from the plan: each compiled kernel's runner, no JITFunction.run
    direct = list(launched)
    launch.forget_plans()
    full = common.capture_launches(lambda: call(second))  # the same call through Triton's whole dispatch
    assert direct and len(direct) == len(full), (name, len(direct), len(full))
    for got, made in zip(direct, full):
        binder = made.kernel.device_caches[0][4]  # Triton's own binding of the launch's arguments
        bound = list(binder(*made.args, **made.kwargs)[0].values())
        grid = tuple(made.grid) + (1,) * (3 - len(made.grid))
        assert got[:3] == grid and got[3:5] == (0, 0), (name, got[:5])  # stream and function of the stand-in
        compiled = made.kernel.run(*made.args, grid=made.grid, warmup=True, **made.kwargs)
        assert got[5] == compiled.packed_metadata, name
        assert type(got[6]) is type(compiled.launch_metadata(grid, 0, *bound)), name  # as JITFunction.run makes it
        assert got[7:9] == (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook), name
        bad = [(i, g, b) for i, (g, b) in enumerate(zip(got[9:], bound)) if not same(g, b)]
        assert len(got) == 9 + len(bound) and not bad, (name, len(got), len(bound), bad)
    print("DIRECT_OK", name, len(direct))
"""


def test_a_plan_replays_the_compiled_kernel_with_the_arguments_tritons_dispatch_binds(tmp_path):
    """On a GPU a plan launches through each compiled kernel's own runner, skipping `JITFunction.run`'s binding and
    specialisation. Cross-compiling for sm_90 with a launcher that records what it is handed: a replayed call hands
    it exactly the grid, stream, function, metadata and arguments (by identity: the second call's tensors) that
    Triton's own binder makes of the full path's launch (views, such as embedding's flattened ids, as the same memory,
    shape, strides and dtype)."""
    import os
    import subprocess

    env = dict(os.environ)
    env.pop("NBXCERT_BACKEND", None)
    env.update(NBXCERT_CACHE_DIR=str(tmp_path / "cache"), NBXCERT_UNCERTIFIED="default", TRITON_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", DIRECT_SCRIPT, str(ROOT)], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("DIRECT_OK") == 8, proc.stdout


def test_a_plans_signature_holds_each_pointers_alignment():
    """Triton specialises pointers on 16-byte alignment and a plan replays the kernel compiled for its first call:
    a view 2 bytes in must not share a plan with the aligned tensor it comes from."""
    x = randn(rng(1), (4, 64), "float16", "cpu")
    assert launch.signature(x)[3] is True
    assert launch.signature(x[:, 1:])[3] is False and launch.signature(x[:, 8:])[3] is True


@pytest.mark.parametrize("name", ["rmsnorm", "add_rmsnorm", "silu_and_mul", "matmul", "softmax"])
def test_an_input_of_the_same_shape_and_strides_but_misaligned_gets_its_own_plan(served, name):
    """Same shape, strides and dtype, 2 bytes further in: another signature (each family's plan key holds every
    tensor's alignment), so the kernel compiled for the aligned call is never replayed on it."""
    gen = rng(17)

    def two(shape):  # an aligned tensor and one of the same shape and strides starting 2 bytes in
        flat = randn(gen, (2 * math.prod(shape) + 8,), "float16", served)
        return flat[: math.prod(shape)].view(shape), flat[1 : 1 + math.prod(shape)].view(shape)

    w, b = randn(gen, (64,), "float16", served), randn(gen, (48, 32), "float16", served).T
    r = randn(gen, (3, 64), "float16", served)
    calls = {
        "rmsnorm": (lambda x: rows.rmsnorm(x, w, 1e-6), (3, 64), rows._NORM_PLANS),
        "add_rmsnorm": (lambda x: rows.add_rmsnorm(x, r, w, 1e-6), (3, 64), rows._NORM_PLANS),
        "silu_and_mul": (ew.silu_and_mul, (3, 96), ew._SILU_PLANS),
        "matmul": (lambda x: mm.matmul(x, b), (5, 32), mm._MATMUL_PLANS),
        "softmax": (rows.softmax, (3, 64), rows._SOFTMAX_PLANS),
    }
    call, shape, plans = calls[name]
    aligned, shifted = two(shape)
    assert (aligned.shape, aligned.strides) == (shifted.shape, shifted.strides)
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 2
    plans.clear()
    call(aligned)
    call(shifted)
    assert len(plans) == 2, list(plans)


@pytest.mark.gpu
def test_gpu_a_replayed_plan_computes_the_full_paths_bits(monkeypatch, tmp_path, backend):
    """On the GPU, plans replay each compiled kernel's runner directly: a second call with new tensors (and one of the
    same shape and strides 2 bytes in, which must not replay the aligned kernel) gives the bits of the same config
    launched in full."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend (plans replay compiled kernels only there)")
    with _defaults_served(monkeypatch, tmp_path):
        gen, dev = rng(13), backend.device

        def bits(t):
            return t.numpy().view(np.uint16)

        w = randn(gen, (2048,), "float16", dev)
        b = randn(gen, (2560, 2048), "float16", dev).T
        cases = {
            "rmsnorm": (lambda x: rows.rmsnorm(x, w, 1e-6),
                        lambda x: rows.rmsnorm(x, w, 1e-6, config=rows.RMSNORM.default), 2048),
            "silu_and_mul": (ew.silu_and_mul, lambda x: ew.silu_and_mul(x, config=ew.SILU_AND_MUL.default), 2 * 2048),
            "softmax": (rows.softmax, lambda x: rows.softmax(x, config=rows.SOFTMAX.default), 2048),
            "matmul": (lambda x: mm.matmul(x, b), lambda x: mm.matmul(x, b, config=mm.MATMUL.default), 2048),
        }  # fmt: skip
        for name, (served_call, full_call, cols) in cases.items():
            served_call(randn(gen, (4, cols), "float16", dev))  # makes the plan
            again = randn(gen, (4, cols), "float16", dev)
            assert np.array_equal(bits(served_call(again)), bits(full_call(again))), name
            flat = randn(gen, (4 * cols + 8,), "float16", dev)
            shifted = flat[1 : 1 + 4 * cols].view(4, cols)  # again's shape and strides, 2 bytes in: its own kernel
            assert np.array_equal(bits(served_call(shifted)), bits(full_call(shifted))), name


@pytest.mark.gpu
def test_gpu_an_allocating_call_takes_the_block_its_last_output_freed(monkeypatch, tmp_path, backend):
    """A served call that allocates its output takes the block the previous output gave back (no cuMemAlloc, no
    cuMemFree's device wait), and computes into it in stream order: a matmul long enough to be running when its
    output is dropped, then an rmsnorm into the reused block, read back bit for bit against the same rmsnorm computed
    before the matmul."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend (the block cache is device memory's)")
    from nbxcert.kernels.backends import cuda

    if not cuda.block_cache_state()["in_use"]:
        pytest.skip(f"the block cache was ended in this process: {cuda.block_cache_state()['ended_because']}")
    with _defaults_served(monkeypatch, tmp_path):
        gen, dev = rng(21), backend.device
        x, w = randn(gen, (512, 2048), "float16", dev), randn(gen, (2048,), "float16", dev)
        a, b = randn(gen, (512, 16384), "float16", dev), randn(gen, (16384, 2048), "float16", dev)
        want = rows.rmsnorm(x, w, 1e-6).numpy().view(np.uint16)
        product = mm.matmul(a, b)  # [512, 2048] float16: the rmsnorm output's size
        ptr = product.data_ptr()
        del product  # its block goes back to the cache while the matmul may still be running
        got = rows.rmsnorm(x, w, 1e-6)
        assert got.data_ptr() == ptr
        assert np.array_equal(got.numpy().view(np.uint16), want)


def test_embedding_with_strided_ids_gathers_them_and_keeps_no_plan(served):
    """ids that are not contiguous are copied for the kernel: that copy is not the call's tensor, so the call keeps no
    plan (a replay would read the next call's ids as if contiguous), and every such call is right."""
    gen = rng(23)
    table = randn(gen, (40, 16), "float16", served)
    ew._EMBEDDING_PLANS.clear()
    for start in (0, 1):
        every = from_numpy(np.arange(start, start + 30, 3).reshape(2, 5), "int32", served)
        strided = every[:, ::2]
        assert not strided.is_contiguous()
        got = ew.embedding(table, strided)
        assert np.array_equal(got.numpy(), table.numpy()[strided.numpy()])
    assert not any(ew._EMBEDDING_PLANS.values())


def test_decode_keeps_a_plan_only_given_max_len_and_replays_its_own_workspace(served, monkeypatch):
    """Without max_len the lengths are read to the host for the key: no plan. With it, a split config's workspace
    (made per call when the caller gives none) is made alike by each replay."""
    from nbxcert import serve

    split = next(c for c in at.DECODE_ATTENTION.candidates if c["NUM_SPLITS"] > 1)
    monkeypatch.setattr(serve, "config_for", lambda *args, **kwargs: split)  # as if certified
    problem = {"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 40, "head_dim": 64}
    t = at.decode_inputs(problem, ("float16",), 2, served).tensors
    args = (t["q"], t["k_cache"], t["v_cache"], t["lengths"])
    at._DECODE_PLANS.clear()
    at._DECODE_WORKSPACES.clear()
    want = at.decode_attention(*args)
    assert not at._DECODE_PLANS
    first = at.decode_attention(*args, max_len=40)
    assert sum(bool(p) for p in at._DECODE_PLANS.values()) == 1
    elements = at._workspace_elements(2, 4, split["NUM_SPLITS"], 64)
    assert list(at._DECODE_WORKSPACES.values()) == [elements]
    made, real = [], at.empty
    monkeypatch.setattr(at, "empty", lambda shape, *a: made.append(shape) or real(shape, *a))
    again = at.decode_attention(*args, max_len=40)  # replayed: its own output and workspace
    assert made == [t["q"].shape, (elements,)]
    for got in (first, again):
        assert np.array_equal(got.numpy().view(np.uint16), want.numpy().view(np.uint16))


def test_a_signature_refused_once_builds_no_plan_again(monkeypatch):
    """A call whose launches cannot be replayed is kept as False: later calls of that signature take the full path
    without building (and refusing) a plan each time."""
    memo, built = {}, []
    real = LaunchPlan.of
    monkeypatch.setattr(LaunchPlan, "of", staticmethod(lambda *a: built.append(1) or real(*a)))
    x = randn(rng(4), (2, 64), "float16", "cpu")
    foreign = randn(rng(5), (2, 64), "float16", "cpu")  # not one of the call's tensors: the launch cannot be replayed
    launches = [KernelLaunch(object(), (1,), (x, foreign), {})]
    launch.keep_plan(memo, ("sig",), launches, (x,))
    assert memo == {("sig",): False} and built == [1]
    launch.keep_plan(memo, ("sig",), launches, (x,))
    assert built == [1]
