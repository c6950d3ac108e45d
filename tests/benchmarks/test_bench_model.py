"""`benchmarks/bench_model.py` on the CPU: the decoder layer of served calls at the `demo` workload's dimensions on
the interpreter, checked against its float64 reference (and a wrong layer refused by that check), the timing harness
with a simulated clock, the ratios and targets, and the torch peer's layer run by a numpy stand-in torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
NUMPY_TORCH = ROOT / "tests" / "fixtures" / "numpy_torch"
DTYPE = "float16"  # the dtype the demo workload is certified in (certificates/cpu/interpreter)


@pytest.fixture(scope="module")
def bm():
    sys.path.insert(0, str(BENCH))
    import bench_model

    yield bench_model
    sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def demo(bm, backend):
    """The demo layer's model, points, host weights, rope cache and device weights (seeded, as the script makes
    them)."""
    from nbxcert.workload import load_workload

    workload = load_workload("demo")
    model = bm.model_of(workload)
    points = bm.workload_points(workload)
    host = bm.make_weights(model, DTYPE, 0)
    cos_sin = bm.rope_cache(model.head_dim, bm.max_position(points), model.rope_base)
    weights = bm.device_weights(model, host, cos_sin, DTYPE, backend.device)
    return {"model": model, "points": points, "host": host, "cos_sin": cos_sin, "weights": weights}


def _run_layer(bm, demo, point, host_inputs, device, run=None, weights=None):
    inputs = bm.device_inputs(demo["model"], point, host_inputs, DTYPE, device)
    out, residual = bm.nbx_layer(weights or demo["weights"], inputs, point.phase, run or bm.call)
    return {"out": out.float64(), "residual": residual.float64()}


def _point_inputs(bm, demo, point):
    i = demo["points"].index(point)
    host_inputs = bm.make_inputs(demo["model"], point, DTYPE, 1 + i)
    ref = bm.reference(demo["model"], demo["host"], demo["cos_sin"], point, host_inputs, DTYPE)
    return host_inputs, ref


def test_the_points_and_dimensions_come_from_the_workload_files(bm):
    from nbxcert.workload import load_workload

    demo = load_workload("demo")
    assert [p.label for p in bm.workload_points(demo)] == ["prefill:8", "decode:2@32"]
    llama = load_workload("llama-3-8b")
    assert bm.workload_points(llama) is None  # ladder phases: the defaults apply
    m = bm.model_of(llama)
    assert (m.hidden, m.intermediate, m.heads, m.kv_heads, m.head_dim, m.vocab) == (4096, 14336, 32, 8, 128, 128256)
    assert (m.rope, m.rope_base, m.eps) == ("neox", 500000.0, float(np.float32(1e-5)))
    labels = [p.label for p in bm.parse_points(bm.DEFAULT_POINTS, 4096)]
    assert labels == ["prefill:512", "prefill:4096", "decode:1@4096", "decode:16@4096", "decode:64@4096"]
    assert bm.parse_points("decode:4@128", 4096)[0] == bm.Point("decode", 4, 128)
    for bad in ("prefill", "decode:x", "train:8", "decode:2@1"):
        with pytest.raises(SystemExit, match="bench_model: point"):
            bm.parse_points(bad, 4096)


def test_the_demo_layer_matches_float64_served_certified_only(tmp_path):
    """The script itself on the interpreter at the demo's dimensions, certified-only (the shipped cpu/interpreter
    certificates cover every launch of the layer): both outputs of both points within tolerance."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(NBXCERT_BACKEND="interpreter", NBXCERT_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, str(BENCH / "bench_model.py"), "--workload", "demo", "--out", str(tmp_path / "out")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "bench_model.json").read_text())
    assert doc["serving"] == "certified-only" and doc["profile"] == "cpu/interpreter" and doc["checks_ok"] is True
    assert [e["point"] for e in doc["points"]] == ["prefill:8", "decode:2@32"]
    for entry in doc["points"]:
        for name in ("out", "residual"):
            c = entry["check"]["nbxcert"][name]
            assert c["ok"] and c["mismatched"] == 0 and c["tolerance"] == 2.0**-10, (entry["point"], name, c)
            assert 0 < c["rel_norm_error"] < c["rel_norm_bound"] and c["max_scaled"] < 1.0
    assert "checks against float64: ok" in r.stdout and "FAILED" not in r.stdout
    assert "## Summary" in (tmp_path / "out" / "bench_model.md").read_text()


@pytest.mark.parametrize("index", [0, 1], ids=["prefill", "decode"])
def test_the_layer_passes_and_a_wrong_layer_fails_the_check(bm, demo, backend, profile, index):
    """The same comparison that passes the layer refuses it with rope skipped, and with one weight 2% off on
    nbxcert's side only (each a real defect a model port makes)."""
    from nbxcert.kernels.tensor import from_numpy

    point = demo["points"][index]
    host_inputs, ref = _point_inputs(bm, demo, point)
    tol = profile.tolerance(DTYPE)
    good = bm.check_outputs(_run_layer(bm, demo, point, host_inputs, backend.device), ref, DTYPE, tol, "layer")
    assert good["ok"], good

    def without_rope(name, fn, *args, **kwargs):
        return args[:2] if name == "rope" else fn(*args, **kwargs)

    skipped = _run_layer(bm, demo, point, host_inputs, backend.device, run=without_rope)
    verdict = bm.check_outputs(skipped, ref, DTYPE, tol, "rope skipped")
    assert not verdict["ok"] and not verdict["out"]["elementwise_ok"], verdict["out"]
    assert verdict["out"]["rel_norm_error"] > verdict["out"]["rel_norm_bound"]
    assert "Mismatched elements" in verdict["out"]["report"]

    weights = dict(demo["weights"])
    weights["down"] = from_numpy(weights["down"].float64() * 1.02, DTYPE, backend.device)
    perturbed = _run_layer(bm, demo, point, host_inputs, backend.device, weights=weights)
    verdict = bm.check_outputs(perturbed, ref, DTYPE, tol, "down weight 2% off")
    assert not verdict["ok"] and not verdict["out"]["elementwise_ok"], verdict["out"]
    assert verdict["out"]["rel_norm_error"] > verdict["out"]["rel_norm_bound"]
    assert verdict["residual"]["ok"]  # the down projection comes after the residual: the check says where it went wrong


def test_the_reference_decode_step_continues_its_prefill(bm, demo):
    """The float64 reference's two data flows agree: the last token of a prefill is the decode step of that token
    over a cache holding the earlier tokens' rotated keys and values."""
    from nbxcert.oracles import elementwise
    from nbxcert.oracles.model import decoder_layer

    m, cos_sin = demo["model"], demo["cos_sin"]
    weights = {name: bm._decoded(bits, DTYPE) for name, bits in demo["host"].items()}
    n = 6
    ids = np.random.default_rng(5).integers(0, m.vocab, n)
    kw = dict(heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim, eps=m.eps, out_eps=2.0**-10, style=m.rope)
    prefill = decoder_layer(weights, ids, np.arange(n), cos_sin, **kw)
    last = decoder_layer(weights, ids, np.arange(n), cos_sin, last=1, **kw)
    np.testing.assert_allclose(last["out"][0], prefill["out"][0][-1:], rtol=1e-12, atol=1e-12)

    x = weights["embed"][ids[:-1]]
    ms = (x * x).mean(axis=1, keepdims=True)
    qkv = x / np.sqrt(ms + m.eps) * weights["input_norm"] @ weights["qkv"].T
    nh, nkv, d = m.heads, m.kv_heads, m.head_dim
    k = qkv[:, nh * d : (nh + nkv) * d].reshape(n - 1, nkv, d)
    k, _ = elementwise.rope(k, np.arange(n - 1), cos_sin, d, m.rope)
    v = qkv[:, (nh + nkv) * d :].reshape(n - 1, nkv, d)
    past = lambda b: (k.transpose(1, 0, 2), v.transpose(1, 0, 2))  # noqa: E731
    step = decoder_layer(weights, ids[-1:], np.array([n - 1]), cos_sin, past=past, **kw)
    for name in ("out", "residual"):
        np.testing.assert_allclose(step[name][0], prefill[name][0][-1:], rtol=1e-10, atol=1e-12)


class SimulatedClock:
    """Events on a simulated GPU timeline: each op queues its `gpu_us` of work, a delay queues its own; an event
    records the timeline's end when recorded (the GPU runs behind the host)."""

    def __init__(self):
        self.queued_us = 0.0
        self.delays: list[float] = []
        self.syncs = 0

    def event(self):
        return {"at": None}

    def record(self, event):
        event["at"] = self.queued_us

    def elapsed(self, start, end):
        return (end["at"] - start["at"]) / 1e3

    def sync(self):
        self.syncs += 1

    def delay(self, us):
        self.delays.append(us)
        self.queued_us += us


def test_the_timing_harness_times_each_op_between_its_events(bm):
    clock = SimulatedClock()
    costs = {name: 10.0 * (i + 1) for i, name in enumerate(bm.OPS)}

    def op(us):
        clock.queued_us += us

    def layer(run):
        for name in bm.OPS:
            run(name, op, costs[name])

    times = bm.time_layer(layer, clock, bm.OPS, warmup=2, iters=7, batch=3)
    assert list(times["ops"]) == list(bm.OPS)
    for name in bm.OPS:
        assert times["ops"][name]["gpu_us"] == pytest.approx(costs[name])
        assert times["ops"][name]["host_us"] > 0
    assert times["layer"]["gpu_sum_us"] == pytest.approx(sum(costs.values()))
    assert times["layer"]["wall_us"] > 0 and len(times["layer"]["wall_us_batches"]) == 3  # batches of 3, 3, 1
    assert len(clock.delays) == 7 and min(clock.delays) >= 100.0  # one delay before each timed iteration
    assert clock.syncs == 1 + 1 + 3 + 3  # warm-up, the first instrumented layer, each batch of each loop

    def other(run):
        for name in reversed(bm.OPS):
            run(name, op, 1.0)

    with pytest.raises(RuntimeError, match="the layer called"):
        bm.time_layer(other, SimulatedClock(), bm.OPS, warmup=1, iters=2, batch=2)


def _times(bm, gpu: dict, host: float, wall: float) -> dict:
    ops = {name: {"gpu_us": gpu.get(name, 10.0), "host_us": host} for name in bm.OPS}
    return {"ops": ops, "layer": {"wall_us": wall, "gpu_sum_us": sum(o["gpu_us"] for o in ops.values())}}


def test_the_ratios_are_torch_over_nbxcert_and_the_targets_say_which_missed(bm):
    ours = _times(bm, {"attention": 20.0}, host=5.0, wall=200.0)
    theirs = _times(bm, {"attention": 18.0, "rope": 30.0}, host=4.0, wall=220.0)
    r = bm.compare_times(ours, theirs)
    assert r["ops"]["rope"]["gpu"] == pytest.approx(3.0) and r["ops"]["rope"]["met"] is True
    assert r["ops"]["attention"]["gpu"] == pytest.approx(0.9) and r["ops"]["attention"]["met"] is False
    assert r["ops"]["qkv"]["host"] == pytest.approx(0.8)
    assert r["layer"]["wall"] == pytest.approx(1.1) and r["layer"]["met"] is True
    assert r["targets_met"] is False  # one op under OP_TARGET
    assert bm.compare_times(ours, _times(bm, {"attention": 19.0}, 5.0, 220.0))["targets_met"] is True
    slow_layer = bm.compare_times(ours, _times(bm, {"attention": 20.0}, 5.0, 190.0))
    assert slow_layer["layer"]["met"] is False and slow_layer["targets_met"] is False
    missing = bm.compare_times(ours, None)  # the peer failed: no ratio and no verdict, never a made-up one
    assert missing["layer"]["wall"] is None and missing["targets_met"] is None
    assert all(o["met"] is None for o in missing["ops"].values())

    check = {"ok": True, "out": {"rel_norm_error": 1e-3}, "residual": {"rel_norm_error": 1e-3}}
    entry = {
        "dtype": DTYPE,
        "point": "decode:16@4096",
        "nbxcert": ours,
        "torch": theirs,
        "ratios": r,
        "check": {"nbxcert": check, "torch": check},
    }
    table = bm.op_table([entry])
    assert len(table) == 2 + len(bm.OPS) + 1
    assert any("| attention |" in line and "MISSED" in line for line in table)
    summary = bm.summary_table([entry])
    assert "attention 0.90" in summary[-1] and f"{len(bm.OPS) - 1:>3}/{len(bm.OPS)}" in summary[-1]


def test_the_torch_peer_runs_the_same_layer(bm, demo, backend, tmp_path):
    """The peer script (its torch layer and `time_layer`'s source) through a numpy stand-in torch: it reads the
    exchanged inputs, writes outputs that meet the float64 reference and agree with nbxcert's, and times every op."""
    from nbxcert.profiles import get_profile

    points = demo["points"]
    inputs = {p.label: _point_inputs(bm, demo, p)[0] for p in points}
    bm.write_exchange(str(tmp_path), demo["host"], demo["cos_sin"], points, inputs)
    args = type("Args", (), {"warmup": 1, "iters": 2, "batch": 1})()
    env_path = os.pathsep.join([str(NUMPY_TORCH), os.environ.get("PYTHONPATH", "")])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path
    try:
        peer = bm.run_peer(str(tmp_path), demo["model"], DTYPE, points, args)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert "error" not in peer, peer
    assert peer["torch"] == "numpy-stand-in" and peer["sdp_enabled"]["cudnn"] is None
    tol = get_profile("cpu/interpreter").tolerance(DTYPE)
    for point in points:
        times = peer["points"][point.label]
        assert list(times["ops"]) == list(bm.OPS) and times["iters"] == 2
        theirs = bm.peer_outputs(str(tmp_path), point, DTYPE)
        _, ref = _point_inputs(bm, demo, point)
        check = bm.check_outputs(theirs, ref, DTYPE, tol, f"torch {point.label}")
        assert check["ok"], check
        ours = _run_layer(bm, demo, point, inputs[point.label], backend.device)
        assert bm.difference(ours["out"], theirs["out"])["rel_norm"] < 4 * tol
        assert bm.compare_times(times, times)["targets_met"] is True
