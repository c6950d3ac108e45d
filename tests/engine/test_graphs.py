"""CUDA graphs of served calls (`nbxcert.graphs`): refused cleanly on the interpreter; on a GPU, capture and replay,
the byte-equality check of the first replay, each refusal at capture naming the op, the fault words after a replay,
and the graph cache by batch bucket."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from servingtools import defaults_served as _served

from nbxcert import graphs
from nbxcert.errors import BackendUnavailable, GraphRefused, LaunchError
from nbxcert.kernels import attention as at
from nbxcert.kernels import elementwise as ew
from nbxcert.kernels import launch, rows
from nbxcert.kernels.backends import cuda
from nbxcert.kernels.backends import graphs as backend_graphs
from nbxcert.kernels.inputs import randn, rng
from nbxcert.kernels.tensor import empty, from_numpy


# --- on any machine ---------------------------------------------------------------------------------------------------
def test_capture_on_the_interpreter_is_refused_by_name(backend):
    if backend.name != "interpreter":
        pytest.skip("the interpreter's refusal")
    x = randn(rng(1), (2, 64), "float16", "cpu")
    w = randn(rng(2), (64,), "float16", "cpu")
    with pytest.raises(BackendUnavailable, match=r"graph capture of .*CUDA graphs need the cuda backend"):
        graphs.capture(lambda a: rows.rmsnorm(a, w), x)
    with pytest.raises(BackendUnavailable, match="backend interpreter"):
        graphs.GraphCache(lambda a: rows.rmsnorm(a, w), sizes=(1, 4))(x)


def test_the_cache_picks_the_smallest_bucket_at_or_above_the_batch_and_refuses_above_the_top():
    cache = graphs.GraphCache(lambda a: a, sizes=(1, 4, 16))
    assert [cache.size_for(b) for b in (1, 2, 4, 5, 16)] == [1, 4, 4, 16, 16]
    with pytest.raises(GraphRefused, match="batch 17 is above the largest capture size 16"):
        cache.size_for(17)
    for bad in ((), (4, 1), (0, 2), (2, 2)):
        with pytest.raises(Exception, match="ascending positive ints"):
            graphs.GraphCache(lambda a: a, sizes=bad)


def test_the_default_buckets_are_the_profiles_batch_ladder(backend):
    from nbxcert.serving.lookup import profile_in_force

    assert graphs.GraphCache(lambda a: a).sizes == tuple(profile_in_force()[0].ladder("batch"))


def test_the_first_difference_names_the_output_and_the_element_by_bits():
    eager = np.zeros((2, 3), np.float16)
    graph = eager.copy()
    assert graphs._first_difference("f", "the output", graph, eager) is None
    graph[1, 2] = np.float16(-0.0)  # a signed zero differs in bits
    problem = graphs._first_difference("f", "[0]", graph, eager)
    assert problem.startswith("[0][1, 2] is") and "bits 0x8000" in problem and "1 of 6 elements" in problem
    assert "float16[2, 4]" in graphs._first_difference("f", "x", np.zeros((2, 4), np.float16), eager)


def test_outputs_are_cut_to_the_batch_and_argument_spans_merge():
    x = randn(rng(3), (4, 8), "float32", "cpu")
    cut = graphs._rows((x, [x[0]], {"k": 7}), 4, 3)
    assert cut[0].shape == (3, 8) and cut[1][0].shape == (8,) and cut[2] == {"k": 7}
    assert graphs._rows(x, 4, 4) is x
    spans = graphs._spans([x[:2], x[1:3], x[3:]])  # overlapping views of one storage: one range
    base = x._storage.data_ptr()
    assert spans == [(base, base + 4 * 8 * 4)]
    # two storages end to end are never one range (a copy may not run from one allocation into the next)
    y = randn(rng(4), (2, 8), "float32", "cpu")
    ends = {(base, base + 128), (y._storage.data_ptr(), y._storage.data_ptr() + 64)}
    assert set(graphs._spans([x, y])) == ends and len(graphs._spans([x, y])) == 2


def test_a_refusal_names_the_served_op_on_the_stack_and_its_caller(monkeypatch):
    """No GPU needed: the refusal reads the served entry points' frames (nothing on the served path pays for it)."""
    state = backend_graphs.Capture(0, 0x10, "step")

    def rmsnorm_like():
        state.refuse("cuMemcpyDtoH waits for the device")

    monkeypatch.setitem(launch.ENTRY_CODES, rmsnorm_like.__code__, "rmsnorm")
    line = sys._getframe().f_lineno + 2
    with pytest.raises(GraphRefused) as raised:
        rmsnorm_like()
    message = str(raised.value)
    assert message.startswith("graph capture of step refused in rmsnorm (called at ")
    assert f"test_graphs.py:{line})" in message and message.endswith(": cuMemcpyDtoH waits for the device")
    assert state.refusal == message
    with pytest.raises(GraphRefused, match="refused outside any served call: a memset on stream 0x20, not the capture"):
        state.check_stream(0x20, "a memset")
    state.check_stream(0x10, "a memset")  # the capture stream: nothing to refuse


def test_during_a_capture_a_free_is_held_and_another_threads_allocation_is_not_the_graphs(monkeypatch):
    state = backend_graphs.Capture(0, 0x10, "step")
    freed = []
    cuda.set_thread_capture(state)
    try:
        assert cuda._after_gates(lambda *a: freed.append(a), 1, 2) is True  # a cuMemFree waits: held, not made
    finally:
        cuda.set_thread_capture(None)
    assert freed == [] and len(state.pool.held) == 1
    assert state.hold_block(0x1000, 0, 64, 1, 0x10, None) and len(state.pool.held) == 2
    assert not state.hold_block(0x1000, 1, 64, 1, 0x10, None)  # another device's memory: not this graph's
    monkeypatch.setattr(state, "thread", -1)  # as seen from another thread
    assert state.block(64, 0, 0x10) is None
    state.pool.held.clear()  # nothing real to give back


# --- on a GPU ---------------------------------------------------------------------------------------------------------
def _bits(t) -> np.ndarray:
    return t.numpy().view(np.uint16)


def _gpu(backend):
    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")


@pytest.mark.gpu
def test_gpu_a_graph_replays_its_sequence_on_inputs_updated_in_place(monkeypatch, tmp_path, backend):
    _gpu(backend)
    with _served(monkeypatch, tmp_path):
        gen, dev = rng(41), backend.device
        x, w = randn(gen, (16, 4096), "float16", dev), randn(gen, (4096,), "float16", dev)
        up = randn(gen, (16, 2 * 4096), "float16", dev)

        def step(x, up):
            h = rows.rmsnorm(x, w, 1e-5)
            return ew.add(h, ew.silu_and_mul(up))

        g = graphs.capture(step, x, up)
        assert g.nodes >= 3 and g.pool_bytes > 0 and len(g.launches) >= 3
        for seed in (1, 2):
            new_x, new_up = (
                randn(rng(seed), (16, 4096), "float16", dev),
                randn(rng(seed + 9), (16, 8192), "float16", dev),
            )
            x.copy_(new_x)
            up.copy_(new_up)
            out = g.replay()
            g.synchronize()
            assert np.array_equal(_bits(out), _bits(step(new_x, new_up)))
        assert "torch" not in sys.modules


@pytest.mark.gpu
def test_gpu_a_first_replay_that_differs_from_the_eager_run_refuses_the_graph(monkeypatch, tmp_path, backend):
    _gpu(backend)
    with _served(monkeypatch, tmp_path):
        gen, dev = rng(42), backend.device
        x, w = randn(gen, (8, 1024), "float16", dev), randn(gen, (1024,), "float16", dev)
        runs = []

        def drifting(x):  # the eager run and the captured one differ: eps changes between them
            runs.append(1)
            return (rows.rmsnorm(x, w, 1e-5 if len(runs) == 1 else 0.5),)

        with pytest.raises(
            GraphRefused,
            match=r"graph of .*drifting refused: \[0\]\[\d+, \d+\] is .* in the graph's "
            r"first replay and .* in the eager run",
        ):
            graphs.capture(drifting, x)


@pytest.mark.gpu
def test_gpu_what_a_graph_cannot_hold_is_refused_at_capture_naming_the_launch(monkeypatch, tmp_path, backend):
    _gpu(backend)
    with _served(monkeypatch, tmp_path):
        gen, dev = rng(43), backend.device
        x, w = randn(gen, (8, 1024), "float16", dev), randn(gen, (1024,), "float16", dev)
        decode = {"batch": 2, "heads": 4, "kv_heads": 2, "kv_len": 40, "head_dim": 64}
        d = at.decode_inputs(decode, ("float16",), 1, dev).tensors
        q, k, v, lengths = d["q"], d["k_cache"], d["v_cache"], d["lengths"]
        other = cuda.Stream()
        out = empty((8, 1024), "float16", dev)
        first = []

        def once(fn):  # the eager run passes; the capture meets the refusal
            def run(*a):
                if first:
                    fn(*a)
                first.append(1)
                return rows.rmsnorm(a[0], w)

            return run

        cases = {
            "decode attention without max_len": (
                once(lambda x: at.decode_attention(q, k, v, lengths)),
                r"refused in decode_attention \(called at .*"
                r"test_graphs.py:\d+\): cuCtxSynchronize waits for the device \(before a device-to-host copy",
            ),
            "a synchronisation": (once(lambda x: cuda.synchronize()), "cuCtxSynchronize waits for the device"),
            "an allocation outside the pool": (
                once(lambda x: cuda.mem_alloc(4096, dev.index)),
                "cuMemAlloc of 4096 bytes, outside the graph's pool",
            ),
            "a launch on another stream": (
                once(lambda x: _on(other, lambda: rows.rmsnorm(x, w, out=out))),
                r"refused in rmsnorm .*: launches \S+ on stream 0x[0-9a-f]+, not the capture stream",
            ),
            "an allocation on another stream": (
                once(lambda x: _on(other, lambda: rows.rmsnorm(x, w))),
                r"refused in rmsnorm .*an allocation of \d+ bytes on cuda:0 stream 0x[0-9a-f]+, outside the graph's "
                "pool",
            ),
            "a copy to the host": (
                once(lambda x: rows.rmsnorm(x, w).numpy()),
                r"refused outside any served call: cuCtxSynchronize waits for the device \(before a device-to-host",
            ),
        }
        for name, (fn, pattern) in cases.items():
            first.clear()
            with pytest.raises(GraphRefused, match=pattern):
                graphs.capture(fn, x)
            # the process goes on: the next capture and eager work are unaffected
            assert np.array_equal(_bits(rows.rmsnorm(x, w)), _bits(rows.rmsnorm(x, w))), name
        g = graphs.capture(lambda x: rows.rmsnorm(x, w), x)
        g.replay()
        g.synchronize()


def _on(stream, fn):
    with cuda.using_stream(stream):
        return fn()


@pytest.mark.gpu
def test_gpu_a_bad_index_in_a_replay_raises_at_the_next_synchronisation(monkeypatch, tmp_path, backend):
    _gpu(backend)
    with _served(monkeypatch, tmp_path):
        gen, dev = rng(44), backend.device
        table = randn(gen, (100, 256), "float16", dev)
        ids = from_numpy(np.array([3, 7, 99, 0], np.int32), "int32", dev)
        g = graphs.capture(lambda ids: ew.embedding(table, ids), ids)
        ids.copy_(from_numpy(np.array([3, 100, 5, 0], np.int32), "int32", dev))  # 100: outside the table
        g.replay()
        with pytest.raises(LaunchError, match="embedding: id 100 at index 1 is outside the table of 100 rows"):
            g.synchronize()
        ids.copy_(from_numpy(np.array([1, 2, 3, 4], np.int32), "int32", dev))
        out = g.replay()
        g.synchronize()  # a good replay after a bad one: nothing raised
        assert np.array_equal(_bits(out), _bits(ew.embedding(table, ids)))


@pytest.mark.gpu
def test_gpu_the_graph_cache_captures_per_bucket_and_cuts_outputs_to_the_batch(monkeypatch, tmp_path, backend):
    _gpu(backend)
    with _served(monkeypatch, tmp_path):
        gen, dev = rng(45), backend.device
        w = randn(gen, (1024,), "float16", dev)
        steps = graphs.GraphCache(lambda x, eps: rows.rmsnorm(x, w, eps), batched=(0,), sizes=(1, 4, 16))
        for batch in (3, 2, 4, 9):
            x = randn(rng(batch), (batch, 1024), "float16", dev)
            got = steps(x, 1e-5)
            assert got.shape == (batch, 1024)
            assert np.array_equal(_bits(got), _bits(rows.rmsnorm(x, w, 1e-5))), batch
        assert sorted(steps.graphs) == [4, 16]
        with pytest.raises(GraphRefused, match="argument 1 is not what the graph was captured with"):
            steps(x, 1e-6)
