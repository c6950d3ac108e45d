"""Served launch plans (`nbxcert.kernels.launch.served`): a served call like one served before replays the record of
the launches and allocations that call made, with its own tensors, instead of checking, keying, looking up and
building them again. They must be exactly the launches the full path makes, never outlive serving's state, never hold
a call's tensors, and never exist for a call tied to its data (a host read, a copy, a synchronisation) or one whose
launches hold what the record cannot place."""

from __future__ import annotations

import gc
import math
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
from servingtools import defaults_served as _defaults_served  # noqa: E402

from nbxcert.errors import ShapeMismatch  # noqa: E402
from nbxcert.kernels import attention as at  # noqa: E402
from nbxcert.kernels import elementwise as ew  # noqa: E402
from nbxcert.kernels import (  # noqa: E402
    launch,
    recording,  # noqa: E402
    rows,
)
from nbxcert.kernels import matmul as mm  # noqa: E402
from nbxcert.kernels.inputs import randn, rng  # noqa: E402
from nbxcert.kernels.launch import CallPlan, KernelLaunch  # noqa: E402
from nbxcert.kernels.tensor import empty, from_numpy  # noqa: E402


@pytest.fixture
def served(monkeypatch, tmp_path, backend):
    """Serving with no certificate and the untuned default served for every key (a served path with no sweep)."""
    monkeypatch.setattr(launch, "DIRECT", False)  # plans replay through kernel[grid], where captures see them
    with _defaults_served(monkeypatch, tmp_path):
        yield backend.device


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
    fq, fk, fv = (randn(gen, (1, h, 16, 64), "float16", device) for h in (2, 1, 1))
    x3 = randn(gen, (2, 3, 64), "float16", device)
    return {
        "rmsnorm": (lambda: rows.rmsnorm(x, w, 1e-6, out=empty((3, 64), "float16", device)), rows.rmsnorm),
        "rmsnorm_3d": (lambda: rows.rmsnorm(x3, w, 1e-6), rows.rmsnorm),  # x viewed as [6, 64] rows for the kernel
        "add_rmsnorm": (lambda: rows.add_rmsnorm(x, r, w, 1e-6), rows.add_rmsnorm),
        "layernorm": (lambda: rows.layernorm(x, w, r[0]), rows.layernorm),
        "silu_and_mul": (lambda: ew.silu_and_mul(xs), ew.silu_and_mul),
        "matmul": (lambda: mm.matmul(a, b), mm.matmul),
        "softmax": (lambda: rows.softmax(x, 0.5), rows.softmax),
        "softmax_masked": (lambda: rows.softmax(x, mask=r), rows.softmax),
        "embedding": (lambda: ew.embedding(table, ids), ew.embedding),
        # in place: each call rotates fresh copies of the same q and k
        "rope": (lambda: ew.rope(q0.clone(), k0.clone(), pos, cache), ew.rope),
        "decode_attention": (lambda: at.decode_attention(dq, dk, dv, dl, max_len=40), at.decode_attention),
        "flash_attention": (lambda: at.flash_attention(fq, fk, fv, causal=True), at.flash_attention),
    }


def _same_launches(full: list[KernelLaunch], planned: list[KernelLaunch]) -> None:
    assert len(full) == len(planned) >= 1
    for f, p in zip(full, planned, strict=False):
        assert p.kernel is f.kernel and p.grid == f.grid and p.kwargs == f.kwargs
        assert len(p.args) == len(f.args)
        for i, (fa, pa) in enumerate(zip(f.args, p.args, strict=False)):
            if hasattr(fa, "data_ptr"):  # the output may be a fresh tensor; every other tensor is the call's own
                assert (pa.shape, pa.strides, pa.dtype) == (fa.shape, fa.strides, fa.dtype), i
            else:
                assert pa == fa and type(pa) is type(fa), i


def _plans(entry) -> list:
    return [p for p in entry.plans.values() if type(p) is CallPlan]


CASES = [
    "rmsnorm",
    "rmsnorm_3d",
    "add_rmsnorm",
    "layernorm",
    "silu_and_mul",
    "matmul",
    "softmax",
    "softmax_masked",
    "embedding",
    "rope",
    "decode_attention",
    "flash_attention",
]


@pytest.mark.parametrize("name", CASES)
def test_a_plan_makes_the_launches_and_the_bits_of_the_full_path(served, name):
    call, entry = _cases(served)[name]
    entry.plans.clear()
    full = common.capture_launches(call)  # no plan yet: checks, key, config, launch built; the plan kept
    assert _plans(entry), "the first served call left no plan"
    planned = common.capture_launches(call)  # the same call again: replayed from the plan
    _same_launches(full, planned)
    first, again = call(), call()
    first, again = first if isinstance(first, tuple) else (first,), again if isinstance(again, tuple) else (again,)
    for f, a in zip(first, again, strict=False):
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
    assert y2 is not y1 and y2.data_ptr() != x2.data_ptr()


def test_plans_are_forgotten_with_serving_state(served):
    from nbxcert import serving

    call, entry = _cases(served)["rmsnorm"]
    call()
    assert entry.plans
    serving.reset()
    assert not entry.plans


def test_a_plan_holds_no_tensor_of_the_call_that_made_it(served):
    gen = rng(5)
    x, w = randn(gen, (2, 3, 64), "float16", served), randn(gen, (64,), "float16", served)
    y = rows.rmsnorm(x, w)
    refs = [weakref.ref(t) for t in (x, y, w)]
    del x, y, w
    gc.collect()
    assert all(r() is None for r in refs)
    assert _plans(rows.rmsnorm)


def test_a_new_signature_is_checked_in_full(served):
    gen = rng(9)
    w = randn(gen, (64,), "float16", served)
    rows.rmsnorm(randn(gen, (2, 64), "float16", served), w)
    with pytest.raises(ShapeMismatch, match="weight/bias must have shape"):
        rows.rmsnorm(randn(gen, (2, 32), "float16", served), w)


def test_a_view_made_for_the_launch_is_traced_to_the_calls_tensor(served):
    """rmsnorm views a 3-d x as rows: the record places that view inside x (at offset 0), so the call gets a plan and
    a replay on another x launches on that x's rows."""
    gen = rng(11)
    w = randn(gen, (64,), "float16", served)
    rows.rmsnorm.plans.clear()
    rows.rmsnorm(randn(gen, (2, 3, 64), "float16", served), w)
    assert len(_plans(rows.rmsnorm)) == 1
    x = randn(gen, (2, 3, 64), "float16", served)
    got = rows.rmsnorm(x, w)
    want = rows.rmsnorm(x, w, config=rows.RMSNORM.default)
    assert got.shape == (2, 3, 64) and np.array_equal(got.numpy().view(np.uint16), want.numpy().view(np.uint16))


class _Kernel:
    def __init__(self):
        self.made = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.made.append((grid, args, kwargs))


def _record(launches, storages=()):
    rec = recording.Recording()
    rec.launches, rec.storages = list(launches), list(storages)
    return rec


def test_launches_holding_what_the_record_cannot_place_get_no_plan():
    x, y = (randn(rng(i), (4, 8), "float16", "cpu") for i in (1, 2))
    k = _Kernel()
    assert CallPlan.of(_record([KernelLaunch(k, (1,), (x, y, 3, 1.5, None), {"BLOCK": 8})]), (x, y), y) is not None
    assert CallPlan.of(_record([KernelLaunch(k, (1,), (x, [1, 2]), {})]), (x, y), y) is None  # a list
    assert CallPlan.of(_record([KernelLaunch(k, (1,), (x,), {"DESC": object()})]), (x, y), y) is None
    assert CallPlan.of(_record([KernelLaunch(k, (1,), (x, y), {})]), (x, y), object()) is None  # an odd result
    q = randn(rng(3), (4, 16), "float16", "cpu")
    first, second = q[:, :8], q[:, 8:]  # two of the call's tensors over one buffer, their spans interleaved
    inside = q[1:2, 4:12]  # starts in both spans, at neither one's start
    assert CallPlan.of(_record([KernelLaunch(k, (1,), (inside,), {})]), (first, second), None) is None
    # a tensor that existed before the call and is none of its own (a persistent buffer) is replayed as it is
    persistent = randn(rng(4), (4,), "float32", "cpu")
    plan = CallPlan.of(_record([KernelLaunch(k, (1,), (x, persistent), {})]), (x,), None)
    x2 = randn(rng(5), (4, 8), "float16", "cpu")
    plan.replay([x2])
    (grid, args, kwargs) = k.made[-1]
    assert args[0] is x2 and args[1] is persistent


def test_a_plan_puts_each_call_tensor_and_each_made_storage_in_its_slots():
    from nbxcert.kernels.tensor import Storage, Tensor

    k = _Kernel()
    x, y = randn(rng(6), (4, 8), "float16", "cpu"), randn(rng(7), (4, 8), "float16", "cpu")
    made = Storage(64, "cpu")
    ws = Tensor(made, (8,), (1,), "float32", 8)  # a view 32 bytes into a storage the call made
    plan = CallPlan.of(_record([KernelLaunch(k, (2, 1), (x, x[1:], y, ws, 7, 0.5), {"B": 4})], [made]), (x, y), y)
    x2, y2 = randn(rng(8), (4, 8), "float16", "cpu"), randn(rng(9), (4, 8), "float16", "cpu")
    result = plan.replay([x2, y2])
    grid, args, kwargs = k.made[-1]
    assert grid == (2, 1) and kwargs == {"B": 4} and args[4:] == (7, 0.5)
    assert args[0] is x2 and args[2] is y2 and result is y2
    assert args[1].data_ptr() == x2.data_ptr() + 16 and args[1].shape == (3, 8)
    assert args[3].untyped_storage() is not made and args[3].data_ptr() == args[3].untyped_storage().data_ptr() + 32


def test_the_memo_of_plans_is_bounded(served, monkeypatch):
    monkeypatch.setattr(launch, "MAX_PLANS", 3)
    gen = rng(13)
    w = randn(gen, (64,), "float16", served)
    rows.rmsnorm.plans.clear()
    for n_rows in range(1, 8):  # seven signatures: a prefill length each
        rows.rmsnorm(randn(gen, (n_rows, 64), "float16", served), w)
        assert 1 <= len(rows.rmsnorm.plans) <= 3


def test_a_matmul_on_misaligned_operands_is_keyed_apart(served):
    """The matmul key's `aligned` field reads the operands' base addresses: a call on a view one element into its
    buffer (the same shapes and strides) is another key, so it must not replay the aligned call's plan."""
    from nbxcert.kernels.tensor import Tensor

    gen = rng(17)
    a, b = randn(gen, (4, 32), "float16", served), randn(gen, (32, 48), "float16", served)
    mm.matmul.plans.clear()
    mm.matmul(a, b)
    buf = randn(gen, (4 * 32 + 1,), "float16", served)
    shifted = Tensor(buf.untyped_storage(), (4, 32), (32, 1), "float16", 1)  # base address 2 bytes off
    assert mm._problem_matmul(shifted, b)["aligned"] == 0 and mm._problem_matmul(a, b)["aligned"] == 1
    got = mm.matmul(shifted, b)
    assert len(mm.matmul.plans) == 2
    want = mm.matmul(shifted, b, config=mm.MATMUL.default)
    assert np.array_equal(got.numpy().view(np.uint16), want.numpy().view(np.uint16))


def test_a_call_whose_tensors_alias_neither_makes_nor_replays_a_plan(served):
    """out=x (in place) or x @ x: one tensor fills two places, so a plan made from that call could not tell which
    place an argument came from; a later call of the same signature with separate tensors must read its own x, and
    an aliased call never replays the plan of separate ones."""
    gen = rng(19)
    w = randn(gen, (64,), "float16", served)
    x = randn(gen, (2, 64), "float16", served)
    rows.rmsnorm.plans.clear()
    rows.rmsnorm(x, w, out=x)  # in place: no plan kept
    assert not rows.rmsnorm.plans
    x2, y2 = randn(gen, (2, 64), "float16", served), empty((2, 64), "float16", served)
    rows.rmsnorm(x2, w, out=y2)
    x3, y3 = randn(gen, (2, 64), "float16", served), empty((2, 64), "float16", served)
    rows.rmsnorm(x3, w, out=y3)  # replayed from x2's plan
    want = rows.rmsnorm(x3, w, config=rows.RMSNORM.default)
    assert np.array_equal(y3.numpy().view(np.uint16), want.numpy().view(np.uint16))
    captured = common.capture_launches(lambda: rows.rmsnorm(x3, w, out=x3))  # aliased again: in full
    assert len(captured) == 1

    a = randn(gen, (32, 32), "float16", served)
    mm.matmul.plans.clear()
    mm.matmul(a, a)
    assert not mm.matmul.plans
    a2, b2 = randn(gen, (32, 32), "float16", served), randn(gen, (32, 32), "float16", served)
    mm.matmul(a2, b2)
    got = mm.matmul(a2, b2)
    want = mm.matmul(a2, b2, config=mm.MATMUL.default)
    assert np.array_equal(got.numpy().view(np.uint16), want.numpy().view(np.uint16))


def test_a_split_softmax_replays_with_a_workspace_made_alike_or_the_callers(served, monkeypatch):
    """The split variant's workspace: on the CPU made per call when the caller gives none (a replay makes a storage
    alike from the pool, as the call that made the plan did), on a GPU the persistent `SplitWorkspace` (no call's
    memory); else the caller's (a replay uses the next call's)."""
    from nbxcert.kernels import server

    split = next(c for c in rows.SOFTMAX.candidates if c["VARIANT"] == "split")
    monkeypatch.setattr(server, "config_for", lambda *args, **kwargs: split)  # served as if certified
    gen = rng(23)
    x = randn(gen, (2, 3000), "float16", served)
    rows.softmax.plans.clear()
    y = rows.softmax(x)
    (plan,) = _plans(rows.softmax)
    per_call = str(served).startswith("cpu")  # a GPU's workspace is the persistent SplitWorkspace, made by no call
    assert len(plan.made) == (2 if per_call else 1)  # the output (and the workspace)
    again = rows.softmax(x)  # replayed, with an output and a workspace of its own
    assert np.array_equal(y.numpy().view(np.uint16), again.numpy().view(np.uint16))
    ws = rows.split_workspace(2, 3000, "float16", served, split["BLOCK_N"])
    rows.softmax(x, workspace=ws)
    plans = _plans(rows.softmax)
    assert len(plans) == 2 and sorted(len(p.made) for p in plans) == ([1, 2] if per_call else [1, 1])
    third = rows.softmax(x, workspace=ws)  # replayed with the caller's workspace: only the output made
    assert np.array_equal(y.numpy().view(np.uint16), third.numpy().view(np.uint16))


def test_a_plans_signature_holds_each_pointers_alignment():
    """Triton specialises pointers on 16-byte alignment and a plan replays the kernel compiled for its first call:
    a view 2 bytes in must not share a plan with the aligned tensor it comes from."""
    x = randn(rng(1), (4, 64), "float16", "cpu")
    sig = launch.call_signature((x,), {})[0]
    assert sig[0][3] == 0
    assert launch.call_signature((x[:, 1:],), {})[0][0][3] == 2 and launch.call_signature((x[:, 8:],), {})[0][0][3] == 0
    assert launch.call_signature((x, [1]), {}) is None  # a list: no signature, served in full
    assert launch.call_signature((x, 1), {})[0] != launch.call_signature((x, 1.0), {})[0]  # 1 and 1.0 launch apart


@pytest.mark.parametrize("name", ["rmsnorm", "add_rmsnorm", "silu_and_mul", "matmul", "softmax"])
def test_an_input_of_the_same_shape_and_strides_but_misaligned_gets_its_own_plan(served, name):
    """Same shape, strides and dtype, 2 bytes further in: another signature (it holds every tensor's address modulo
    16), so the kernel compiled for the aligned call is never replayed on it."""
    gen = rng(17)

    def two(shape):  # an aligned tensor and one of the same shape and strides starting 2 bytes in
        flat = randn(gen, (2 * math.prod(shape) + 8,), "float16", served)
        return flat[: math.prod(shape)].view(shape), flat[1 : 1 + math.prod(shape)].view(shape)

    w, b = randn(gen, (64,), "float16", served), randn(gen, (48, 32), "float16", served).T
    r = randn(gen, (3, 64), "float16", served)
    calls = {
        "rmsnorm": (lambda x: rows.rmsnorm(x, w, 1e-6), (3, 64), rows.rmsnorm),
        "add_rmsnorm": (lambda x: rows.add_rmsnorm(x, r, w, 1e-6), (3, 64), rows.add_rmsnorm),
        "silu_and_mul": (ew.silu_and_mul, (3, 96), ew.silu_and_mul),
        "matmul": (lambda x: mm.matmul(x, b), (5, 32), mm.matmul),
        "softmax": (rows.softmax, (3, 64), rows.softmax),
    }
    call, shape, entry = calls[name]
    aligned, shifted = two(shape)
    assert (aligned.shape, aligned.strides) == (shifted.shape, shifted.strides)
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 2
    entry.plans.clear()
    call(aligned)
    call(shifted)
    assert len(entry.plans) == 2, list(entry.plans)


def test_every_launch_in_the_families_goes_through_a_kernel_launch():
    """A plan replays what the record saw, and the record sees `KernelLaunch` calls only: a family launching with
    `kernel[grid](...)` directly would be left out of its plans."""
    import re

    direct = re.compile(r"^\s*_\w+_kernel\[")
    for path in sorted((ROOT / "kernels").glob("*.py")):
        if path.name in ("judge.py", "products.py", "draws.py", "attention64.py", "quant64.py"):  # the oracle's
            # comparison, widening, attention reference and dequantization, the inputs' draws on the device: no served
            # call's
            continue
        hits = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if direct.match(line)]
        assert not hits, f"{path.name} launches kernel[grid] directly at lines {hits}"


def test_every_user_facing_entry_point_is_served():
    """Each spec's user-facing function replays plans (it carries `plans`)."""
    from nbxcert.kernels import moe, quant, sampling, vision

    entries = [
        rows.rmsnorm,
        rows.add_rmsnorm,
        rows.layernorm,
        rows.add_layernorm,
        rows.softmax,
        rows.row_reduce,
        ew.silu_and_mul,
        ew.gelu,
        ew.add,
        ew.mul,
        ew.cast,
        ew.rope,
        ew.embedding,
        mm.matmul,
        mm.addmm,
        mm.bmm,
        mm.baddbmm,
        mm.gemv,
        mm.addmv,
        at.flash_attention,
        at.decode_attention,
        at.paged_decode_attention,
        moe.moe_align,
        moe.fused_moe,
        moe.moe_sum,
        quant.dequant_gemv,
        quant.dequant_matmul,
        sampling.argmax,
        sampling.topk,
        sampling.log_softmax,
        sampling.cross_entropy,
        vision.conv2d,
        vision.group_norm,
        vision.upsample_nearest2d,
    ]
    assert all(isinstance(getattr(e, "plans", None), dict) for e in entries)


@pytest.mark.gpu
def test_gpu_a_replayed_plan_computes_the_full_paths_bits(monkeypatch, tmp_path, backend):
    """On the GPU, plans drive each compiled kernel's launcher directly: a second call with new tensors (and one of the
    same shape and strides 2 bytes in, which must not replay the aligned kernel) gives the bits of the same config
    launched in full; TMA kinds (matmul's persistent kernel, flash attention's) included."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend (plans replay compiled kernels only there)")
    from nbxcert.kernels import server

    with _defaults_served(monkeypatch, tmp_path):
        gen, dev = rng(13), backend.device

        def bits(t):
            return t.numpy().view(np.uint16)

        w = randn(gen, (2048,), "float16", dev)
        b = randn(gen, (2560, 2048), "float16", dev).T
        tma = next(c for c in mm.MATMUL.candidates if c["KIND"] == "tma_persistent")
        cases = {
            "rmsnorm": (
                lambda x: rows.rmsnorm(x, w, 1e-6),
                lambda x: rows.rmsnorm(x, w, 1e-6, config=rows.RMSNORM.default),
                2048,
                None,
            ),
            "silu_and_mul": (ew.silu_and_mul, lambda x: ew.silu_and_mul(x, config=ew.SILU_AND_MUL.default), 4096, None),
            "softmax": (rows.softmax, lambda x: rows.softmax(x, config=rows.SOFTMAX.default), 2048, None),
            "matmul": (lambda x: mm.matmul(x, b), lambda x: mm.matmul(x, b, config=mm.MATMUL.default), 2048, None),
            "matmul_tma": (lambda x: mm.matmul(x, b), lambda x: mm.matmul(x, b, config=tma), 2048, tma),
        }
        real = server.config_for
        for name, (served_call, full_call, cols, forced) in cases.items():
            mm.matmul.plans.clear()
            monkeypatch.setattr(server, "config_for", (lambda *a, c=forced: c) if forced else real)
            served_call(randn(gen, (256, cols), "float16", dev))  # makes the plan
            again = randn(gen, (256, cols), "float16", dev)
            assert np.array_equal(bits(served_call(again)), bits(full_call(again))), name
            if forced is not None:  # TMA reads 16-byte aligned operands only: no shifted case for it
                continue
            flat = randn(gen, (256 * cols + 8,), "float16", dev)
            shifted = flat[1 : 1 + 256 * cols].view(256, cols)  # again's shape and strides, 2 bytes in: its own kernel
            assert np.array_equal(bits(served_call(shifted)), bits(full_call(shifted))), name
        monkeypatch.setattr(server, "config_for", real)
        q, k, v = (randn(gen, (1, h, 512, 128), "float16", dev) for h in (8, 2, 2))
        flash = next(c for c in at.FLASH_ATTENTION.candidates if c.get("TMA", 0))
        monkeypatch.setattr(server, "config_for", lambda *a: flash)
        at.flash_attention(q, k, v, causal=True)
        q2 = randn(gen, (1, 8, 512, 128), "float16", dev)
        got = at.flash_attention(q2, k, v, causal=True)
        assert _plans(at.flash_attention)
        assert np.array_equal(bits(got), bits(at.flash_attention(q2, k, v, causal=True, config=flash)))


@pytest.mark.gpu
def test_gpu_a_replayed_tma_matmul_encodes_no_descriptor(monkeypatch, tmp_path, backend):
    """Bug: a TMA kernel's launch built and encoded its tensor descriptors on every call (about 110 us of host time).
    A replayed TMA matmul on the addresses seen before encodes none: each descriptor is encoded once per address and
    kept."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    from triton.backends.nvidia import driver as nvidia_driver

    from nbxcert.kernels import server

    with _defaults_served(monkeypatch, tmp_path):
        gen, dev = rng(31), backend.device
        tma = next(c for c in mm.MATMUL.candidates if c["KIND"] == "tma_persistent")
        monkeypatch.setattr(server, "config_for", lambda *a: tma)
        a, b = randn(gen, (512, 1024), "float16", dev), randn(gen, (2048, 1024), "float16", dev).T
        out = empty((512, 2048), "float16", dev)
        mm.matmul(a, b, out=out)  # the full path: its plan made
        mm.matmul(a, b, out=out)  # replayed: descriptors encoded for these addresses, kept
        encoded, real = [], nvidia_driver.make_tensordesc_arg
        monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", lambda *x: encoded.append(1) or real(*x))
        for _ in range(10):
            mm.matmul(a, b, out=out)
        assert encoded == []
        want = mm.matmul(a, b, config=tma)
        assert np.array_equal(out.numpy().view(np.uint16), want.numpy().view(np.uint16))


@pytest.mark.gpu
def test_gpu_a_served_call_on_a_callers_stream_keeps_its_plan_and_its_memory_reuse(monkeypatch, tmp_path, backend):
    """Bug: launching on a stream other than the legacy one ended block reuse for the process. On a caller's own
    stream a served call still replays its plan, its output comes from the pool (reserved memory does not grow over
    a hundred calls), and it computes in that stream's order: a long matmul's output freed, then an rmsnorm into the
    reused memory, read back bit for bit against the rmsnorm computed before."""
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    from nbxcert.kernels.backends import cuda, memory

    with _defaults_served(monkeypatch, tmp_path):
        gen, dev = rng(21), backend.device
        x, w = randn(gen, (512, 2048), "float16", dev), randn(gen, (2048,), "float16", dev)
        a, b = randn(gen, (512, 16384), "float16", dev), randn(gen, (16384, 2048), "float16", dev)
        want = rows.rmsnorm(x, w, 1e-6).numpy().view(np.uint16)
        stream = cuda.Stream()
        with cuda.using_stream(stream):
            rows.rmsnorm(x, w, 1e-6)
            reserved = memory.memory_reserved()
            for _ in range(100):
                rows.rmsnorm(x, w, 1e-6)
            assert memory.memory_reserved() == reserved
            assert any(
                sig[-1] == stream.handle for sig in rows.rmsnorm.plans if type(rows.rmsnorm.plans[sig]) is CallPlan
            )
            product = mm.matmul(a, b)  # [512, 2048] float16: the rmsnorm output's size
            del product  # freed on the stream while the matmul may still be running
            got = rows.rmsnorm(x, w, 1e-6)
            stream.synchronize()
        assert np.array_equal(got.numpy().view(np.uint16), want)


def test_embedding_with_strided_ids_gathers_them_and_keeps_no_plan(served):
    """ids that are not contiguous are copied for the kernel (a copy: the call is tied to its data), so the call
    keeps no plan, and every such call is right."""
    gen = rng(23)
    table = randn(gen, (40, 16), "float16", served)
    ew.embedding.plans.clear()
    for start in (0, 1):
        every = from_numpy(np.arange(start, start + 30, 3).reshape(2, 5), "int32", served)
        strided = every[:, ::2]
        assert not strided.is_contiguous()
        got = ew.embedding(table, strided)
        assert np.array_equal(got.numpy(), table.numpy()[strided.numpy()])
    assert not _plans(ew.embedding)


def test_decode_keeps_a_plan_only_given_max_len_and_replays_its_own_workspace(served, monkeypatch):
    """Without max_len the lengths are read to the host for the key: no plan. With it, a split config's workspace
    (on the CPU made per call when the caller gives none; on a GPU the persistent `SplitWorkspace`) is made alike by
    each replay."""
    from nbxcert.kernels import server

    split = next(c for c in at.DECODE_ATTENTION.candidates if c["NUM_SPLITS"] > 1)
    monkeypatch.setattr(server, "config_for", lambda *args, **kwargs: split)  # served as if certified
    problem = {"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 40, "head_dim": 64}
    t = at.decode_inputs(problem, ("float16",), 2, served).tensors
    args = (t["q"], t["k_cache"], t["v_cache"], t["lengths"])
    at.decode_attention.plans.clear()
    want = at.decode_attention(*args)
    assert not _plans(at.decode_attention)
    first = at.decode_attention(*args, max_len=40)
    (plan,) = _plans(at.decode_attention)
    elements = at._workspace_elements(2, 4, split["NUM_SPLITS"], 64)
    workspace = [elements * 4] if str(served).startswith("cpu") else []  # a GPU's: SplitWorkspace, no call's memory
    assert [nbytes for nbytes, _ in plan.made] == [2 * 4 * 64 * 2, *workspace]  # the output (and the workspace)
    again = at.decode_attention(*args, max_len=40)  # replayed: its own output and workspace
    for got in (first, again):
        assert np.array_equal(got.numpy().view(np.uint16), want.numpy().view(np.uint16))


def test_a_signature_tied_to_its_data_is_recorded_twice_then_served_in_full(served, monkeypatch):
    """A call that reads to the host is recorded (and refused a plan) at most TIED_TRIES times: later calls of that
    signature take the full path without recording."""
    problem = {"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 40, "head_dim": 64}
    t = at.decode_inputs(problem, ("float16",), 2, served).tensors
    args = (t["q"], t["k_cache"], t["v_cache"], t["lengths"])
    at.decode_attention.plans.clear()
    recorded, real = [], recording.recording
    monkeypatch.setattr(recording, "recording", lambda: recorded.append(1) or real())
    for _ in range(5):
        at.decode_attention(*args)
    assert len(recorded) == launch.TIED_TRIES and list(at.decode_attention.plans.values()) == [launch.TIED_TRIES]


def _direct_launch(raw, knobs, template, pointers):
    """A `_Direct` over a stand-in launcher (`raw`), as `_Direct.of` builds one for Triton 3.6's `CudaLauncher`."""
    made = launch._Direct.__new__(launch._Direct)
    made.raw, made.grid, made.function, made.coop, made.pdl = raw, (3, 2, 1), 0xF00, False, True
    made.packed, made.scratch, made.descriptors, made.device, made.keep = (4, 1, 64), None, (), 0, ()
    made.template, made.pointers, made.knobs, made.chain = template, pointers, knobs, None
    made.stream = lambda device: 0x5EED
    made.run = made.general
    return made


def test_a_launch_with_its_stream_fixed_passes_the_launcher_what_the_general_path_passes():
    class Knobs:
        launch_enter_hook = None
        launch_exit_hook = None

    seen = []
    marker = object()
    template = [0, 0, 7, 4096, 1e-05, float("nan"), True, None, marker, 0]
    step = _direct_launch(lambda *a: seen.append(a), Knobs, template, ((0, 0, 0), (1, 1, 256), (9, 2, 16)))
    addresses = [0x1000, 0x2000, 0x3000]
    step.run(addresses, [], [])
    step.fix_stream(0x5EED)
    assert step.run is not step.general
    step.run(addresses, [], [])
    general, fixed = seen
    assert fixed[:13] == general[:13] and fixed[13:21] == general[13:21] and math.isnan(fixed[18])
    assert fixed[21] is marker and fixed[22] == 0x3010 and fixed[14] == 0x2100 and fixed[3] == 0x5EED
    assert step.template == template  # the record is not changed by a replay
    Knobs.launch_enter_hook = print  # a profiler's hook: the full path runs so it sees Triton's metadata
    assert step.run(addresses, [], []) is launch._NOT_NOW and step.general(addresses, [], []) is launch._NOT_NOW
    assert len(seen) == 2


def test_a_launch_with_its_stream_fixed_expands_each_descriptor_once_per_address(monkeypatch):
    class Knobs:
        launch_enter_hook = None
        launch_exit_hook = None

    encoded = []

    def expand(form, ptr, dtype, meta, nvidia_driver):
        encoded.append(ptr)
        return [f"map@{ptr:#x}", 64, 128]

    monkeypatch.setattr(launch, "_expand", expand)
    seen = []
    step = _direct_launch(lambda *a: seen.append(a), Knobs, [None, None, None, 0, 5], ((3, 1, 0),))
    step.descriptors = ((0, 3, 0, 512, "float16", "form", "meta", {}),)
    addresses = [0x1000, 0x2000]
    step.run(addresses, [], [])
    step.fix_stream(0x5EED)
    step.run(addresses, [], [])
    step.run([0x4000, 0x2000], [], [])
    general, fixed, moved = (a[13:] for a in seen)
    assert general == fixed == ("map@0x1200", 64, 128, 0x2000, 5) and moved[0] == "map@0x4200"
    assert encoded == [0x1200, 0x4200]  # the second replay at 0x1000 found its encoding kept


def test_a_fixed_launch_passes_each_recorded_value_as_it_is():
    class Knobs:
        launch_enter_hook = None
        launch_exit_hook = None

    class Loud(int):  # an int subclass whose repr is code: passed on as the same object, never run
        def __repr__(self):
            return "__import__('os')._exit(3)"

    seen = []
    code = "__import__('os')._exit(3)"
    step = _direct_launch(lambda *a: seen.append(a), Knobs, [0, code, Loud(5), 2.5], ((0, 0, 0),))
    step.fix_stream(0x5EED)
    step.run([0x1000], [], [])
    assert seen[0][13:] == (0x1000, code, 5, 2.5) and type(seen[0][15]) is Loud
