"""The host arithmetic of launches (`nbxcert.kernels.launch`): the plain-Python `cdiv` and `next_power_of_2` that
replace Triton's constexpr functions outside kernels give exactly Triton's values."""

from __future__ import annotations

import contextlib
import timeit

import pytest
import triton

from nbxcert.kernels.backends import select
from nbxcert.kernels.launch import cdiv, next_power_of_2


@pytest.mark.parametrize("b", [1, 2, 3, 7, 16, 64, 128, 1000, 4096])
def test_cdiv_is_tritons(b):
    for a in [*range(0, 300), 4095, 4096, 4097, 128255, 128256, 2**31 - 1, 2**31, 2**40 + 3]:
        assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_next_power_of_2_is_tritons():
    for n in [*range(0, 5000), 2**20 - 1, 2**20, 2**20 + 1, 2**31 - 1, 2**31]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def test_the_host_versions_cost_less_than_tritons():
    """Why they exist: measured in the same process, at least twice as fast as Triton's (about 10x on the project
    machine), so a served launch does not pay a constexpr wrapper per grid dimension."""
    ours = min(timeit.repeat(lambda: cdiv(4097, 128), number=20000, repeat=3))
    theirs = min(timeit.repeat(lambda: triton.cdiv(4097, 128), number=20000, repeat=3))
    assert ours * 2 < theirs, (ours, theirs)


class _HostRead(Exception):
    pass


def test_no_kernels_sweep_launch_reads_the_device_back(monkeypatch):
    """`spec.launch` is what the sweep times: a host read in it (a check of ids or positions) would wait for the device
    inside every timed repetition, so the timer could not queue repetitions ahead of the GPU (`cuda_events_waiting`).
    Every shipped kernel's default launch at its first example problem, with every host read refused."""
    from nbxcert.kernels import tensor
    from nbxcert.kernels.spec import load_all

    read = []
    shipped = [
        s for s in load_all().values() if s.launch.__module__.startswith("nbxcert.kernels.") and s.example_problems
    ]
    assert len(shipped) >= 20  # the families' kernels (tests may have registered their own besides)
    for spec in shipped:
        inputs = spec.make_inputs(spec.example_problems[0], spec.dtypes[0], 0, select().device)

        def refuse(self, *args, name=spec.name, **kwargs):
            read.append(name)
            raise _HostRead()

        with monkeypatch.context() as m:
            m.setattr(tensor.Tensor, "numpy", refuse)
            with contextlib.suppress(_HostRead):
                spec.launch(spec.default, inputs)
    assert read == []


def test_observing_sees_a_calls_launches_in_full_and_replayed_and_stops_after(monkeypatch):
    """`launch.observing` is nbxcert's own seam for seeing launches (no function of Triton's is replaced): it sees a
    served call's launch in full and again when the call's plan replays it through Triton's dispatch, with the same
    kernel and grid, and nothing once the block ends."""
    import numpy as np

    from nbxcert.kernels import launch, rows
    from nbxcert.kernels.tensor import from_numpy

    gen = np.random.default_rng(5)
    device = select().device
    x = from_numpy(gen.standard_normal((3, 64)).astype(np.float32), "float32", device)
    w = from_numpy(gen.standard_normal(64).astype(np.float32), "float32", device)
    monkeypatch.setattr(launch, "DIRECT", False)  # on a GPU: plans replay through Triton's dispatch, where seen
    rows.rmsnorm.plans.clear()
    seen = []
    with launch.observing(lambda kernel, grid, args, kwargs: seen.append((kernel, grid))):
        rows.rmsnorm(x, w)  # in full: the plan is made
        assert rows.rmsnorm.plans, "the first call left no plan"
        rows.rmsnorm(x, w)  # replayed from the plan
    assert len(seen) == 2 and seen[0] == seen[1]
    rows.rmsnorm(x, w)
    assert len(seen) == 2


# One spec of each family whose launch the sweep times, at its first example problem (every shipped spec's launch is
# replayed by the test after it); upsample_nearest2d's inputs hold two tensors that start at one address, so its
# replay keeps every argument as recorded.
REPLAYED = (
    "matmul",
    "rmsnorm",
    "rope",
    "softmax",
    "embedding",
    "silu_and_mul",
    "flash_attention",
    "decode_attention",
    "upsample_nearest2d",
)


def _replayed_bits(spec, profile, backend):
    """(the outputs' bits after the launch, after its replay) from the same starting bytes, or None where the launch
    cannot be replayed."""
    from nbxcert.kernels.check import prepare
    from nbxcert.kernels.launch import replay_of

    problem, dtypes = spec.example_problems[0], spec.dtypes[0]
    prepared = prepare(spec, problem, dtypes, profile, 3, backend.device)

    def bits():
        return [prepared.inputs.tensors[n].contiguous().numpy().tobytes() for n in prepared.inputs.outputs]

    inputs = prepared.restore()
    again = replay_of(lambda: spec.launch(spec.default, inputs), list(inputs.tensors.values()))
    launched = bits()
    if again is None:
        return None
    prepared.restore()  # the same starting bytes (in-place kernels), the outputs poisoned again
    again()
    return launched, bits()


@pytest.mark.parametrize("name", REPLAYED)
def test_a_timed_launch_replays_the_same_kernels_on_the_same_arguments(name, profile, backend):
    """`launch.replay_of` is how the sweep's timer repeats a candidate's launch: the same launches as a served plan
    replays them, with none of the family's host code. From the same starting bytes the replay writes every output
    bit for bit as the launch did (a replay that skipped a kernel, or ran one on other arguments, would not)."""
    from nbxcert.kernels.spec import get_spec

    made = _replayed_bits(get_spec(name), profile, backend)
    assert made is not None, f"{name}'s launch is not replayable"
    launched, replayed = made
    assert replayed == launched


def test_every_shipped_launch_replays_to_the_same_bits(profile, backend):
    from nbxcert.kernels.spec import load_all

    shipped = [
        s for s in load_all().values() if s.launch.__module__.startswith("nbxcert.kernels.") and s.example_problems
    ]
    differ, unreplayable = [], []
    for spec in shipped:
        made = _replayed_bits(spec, profile, backend)
        if made is None:
            unreplayable.append(spec.name)
        elif made[0] != made[1]:
            differ.append(spec.name)
    assert differ == []
    assert unreplayable == []


def test_a_launch_that_reads_the_device_back_is_not_replayed(backend):
    """A launch tied to its data (it read a tensor to the host) gives no replay: what it launches may depend on what
    it read, so the timer times the launch itself."""
    import numpy as np

    from nbxcert.kernels import rows
    from nbxcert.kernels.launch import replay_of
    from nbxcert.kernels.tensor import from_numpy

    x = from_numpy(np.ones((2, 64), np.float32), "float32", backend.device)
    w = from_numpy(np.ones(64, np.float32), "float32", backend.device)
    calls = []

    def fn():
        calls.append(float(x.numpy()[0, 0]))  # a host read
        rows.rmsnorm(x, w, 1e-6)

    assert replay_of(fn, [x, w]) is None
    assert calls == [1.0]  # run once, recorded, not replayed


@pytest.mark.gpu
def test_a_compile_only_launch_gets_a_small_split_workspace_and_keeps_none():
    """A compile worker's launch queues nothing, so the split workspace it is handed is a few elements, and the
    shared grow-only buffer does not grow: a 16-way split of a 4096 x 37888 product once kept 9.9 GB in each of
    sixteen compile workers."""
    from nbxcert.kernels import launch
    from nbxcert.kernels.backends import triton_cuda
    from nbxcert.kernels.tensor import as_device

    device = as_device("cuda:0")
    before = dict(launch.SPLIT_WORKSPACE._buffers)
    with triton_cuda.compiling_only():
        buf = launch.SPLIT_WORKSPACE.get(16 * 4096 * 37888, device)
    assert buf.numel == launch.COMPILE_ONLY_ELEMENTS
    assert launch.SPLIT_WORKSPACE._buffers == before
    assert launch.SPLIT_WORKSPACE.get(1024, device).numel >= 1024  # outside it: the real buffer
