"""The GPU runner's warm-up (`runner.warm_up`, `worker.Runner`): as its process starts it makes the device draws of
each dtype (with and without a NaN mask) and judges one output of each on the device, so the first key's inputs and
checks find those kernels made; off CUDA it does nothing; a failure is left to the launch that meets it again.

On this machine the kernels run under Triton's interpreter with the backend's name read as "cuda" (what is launched
and in which order is the GPU's); the GPU's own run is `bench_autotune.py`'s first key."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nbxcert import runner
from nbxcert.kernels import draws
from nbxcert.kernels import judge as device_judge


@pytest.fixture
def as_cuda(backend, monkeypatch):
    """The interpreter's backend, named cuda for `warm_up`'s check."""
    if backend.name != "interpreter":
        pytest.skip("the GPU's own warm-up is measured by bench_autotune.py's first key")
    from nbxcert.kernels import backends

    choice = backends.select()
    monkeypatch.setattr(backends, "select", lambda: SimpleNamespace(name="cuda", device=choice.device))


def _spy(monkeypatch) -> list[tuple]:
    made: list[tuple] = []
    draw, judged = draws.device_normal, device_judge.DeviceJudge.verdict_of

    def device_normal(gen, shape, dtype, device, scale=1.0, nan_where=None):
        made.append(("draw", dtype, nan_where is not None))
        return draw(gen, shape, dtype, device, scale, nan_where)

    def verdict_of(self, tensor, context=""):
        verdict = judged(self, tensor, context)
        made.append(("judge", tensor.dtype.name, verdict.ok))
        return verdict

    monkeypatch.setattr(draws, "device_normal", device_normal)
    monkeypatch.setattr(device_judge.DeviceJudge, "verdict_of", verdict_of)
    return made


def test_the_warm_up_draws_each_dtype_with_and_without_a_mask_and_judges_it(as_cuda, monkeypatch):
    made = _spy(monkeypatch)
    runner.warm_up()
    expected = []
    for dtype in draws.ON_DEVICE:
        expected += [("draw", dtype, True), ("draw", dtype, False), ("judge", dtype, True)]
    assert made == expected


def test_off_cuda_the_warm_up_makes_nothing(backend, monkeypatch):
    if backend.name != "interpreter":
        pytest.skip("on a GPU the backend is cuda")
    made = _spy(monkeypatch)
    runner.warm_up()
    assert made == []


def test_a_failing_warm_up_is_left_to_the_launch_and_shown_with_debug(as_cuda, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("no device draws here")

    monkeypatch.setattr(draws, "device_normal", broken)
    monkeypatch.delenv("NBXCERT_DEBUG", raising=False)
    runner.warm_up()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("NBXCERT_DEBUG", "1")
    runner.warm_up()
    err = capsys.readouterr().err
    assert "runner warm-up failed" in err and "RuntimeError: no device draws here" in err


def test_a_worker_started_ahead_is_running_before_its_first_request(backend):
    from nbxcert.worker import Worker

    worker = Worker({"NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1"}, [])
    try:
        worker.start()
        process = worker.process
        assert process is not None and process.is_alive()
        worker.start()  # a running worker is left as it is
        assert worker.process is process
    finally:
        worker.close()
