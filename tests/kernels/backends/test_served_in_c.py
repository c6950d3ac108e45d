"""A served call replayed in C (`Served` and `Block` in launcher.c), with no GPU: the launcher and nbxcert's memory
are bound to stand-ins for the driver (cuLaunchKernelEx, cuMemAllocFromPoolAsync, cuMemFreeAsync) compiled here
against Triton's `cuda.h`, which count what they are asked and keep the parameters of the last launch. A plan is put
in an entry point's memo as the Python path would make it on a GPU (a packed launch, an output made per call), so
what is checked is the C path against the Python path on the same plan: the signature found, the launch's addresses,
the result, the memory reused and counted, and every call the C path must hand back to Python.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import sys

import numpy as np
import pytest
from standins import compile_stand_in

from nbxcert.kernels import launch as L
from nbxcert.kernels import recording
from nbxcert.kernels import tensor as T
from nbxcert.kernels.backends import binaries, cuda, launcher, memory
from nbxcert.kernels.dtypes import get_dtype

STAND_IN_C = r"""
#include <stdint.h>
#include <string.h>
#include "cuda.h"
static uint64_t next_ptr = 0x100000, seen[8];
static int launches, allocs, frees, fail_at = -1;
CUresult stand_launch(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  for (int i = 0; i < 3; i++) memcpy(&seen[i], params[i], 8);
  return launches++ == fail_at ? 700 : 0;
}
int stand_alloc(uint64_t *out, size_t size, void *pool, void *stream) {
  *out = next_ptr; next_ptr += (size + 255) & ~(uint64_t)255; allocs++; return 0;
}
int stand_free(uint64_t ptr, void *stream) { frees++; return 0; }
int stand_count(int what) { return what == 0 ? launches : what == 1 ? allocs : frees; }
uint64_t stand_param(int i) { return seen[i]; }
void stand_fail_at(int n) { fail_at = n; }
static int graphs_made, graph_launches, node_sets;
CUresult stand_graph_create(CUgraph *g, unsigned int flags) {
  *g = (CUgraph)(uintptr_t)0x9000;
  graphs_made++;
  return 0;
}
CUresult stand_graph_add(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                         const CUDA_KERNEL_NODE_PARAMS *p) {
  static uintptr_t next = 1;
  *node = (CUgraphNode)next++;
  return 0;
}
CUresult stand_graph_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  *e = (CUgraphExec)(uintptr_t)0xe000;
  return 0;
}
CUresult stand_graph_launch(CUgraphExec e, CUstream s) { graph_launches++; return 0; }
CUresult stand_graph_set(CUgraphExec e, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *p) { node_sets++; return 0; }
CUresult stand_graph_capturing(CUstream s, CUstreamCaptureStatus *c) { *c = CU_STREAM_CAPTURE_STATUS_NONE; return 0; }
CUresult stand_graph_exec_destroy(CUgraphExec e) { return 0; }
CUresult stand_graph_destroy(CUgraph g) { return 0; }
int stand_graph_count(int what) { return what == 0 ? graphs_made : what == 1 ? graph_launches : node_sets; }
"""
GRAPH_FUNCTIONS = ("create", "add", "instantiate", "launch", "set", "capturing", "exec_destroy", "destroy")

F16 = get_dtype("float16")
DEV = T.Device("cuda", 0)
ROWS, COLS = 16, 4096


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served_in_c")
    lib = compile_stand_in(STAND_IN_C, folder)
    lib.stand_param.restype = ctypes.c_uint64
    # a build of its own: the module's static state (its kept blocks, what setup gave it) is this file's alone
    module = launcher.load(launcher.build(folder / "_nbxcert_launcher.so"))
    module.bind(ctypes.cast(lib.stand_launch, ctypes.c_void_p).value, None)
    module.bind_graphs(*(ctypes.cast(getattr(lib, f"stand_graph_{n}"), ctypes.c_void_p).value for n in GRAPH_FUNCTIONS))
    return lib, module


class _Driver:
    def __init__(self, lib):
        self.cuMemAllocFromPoolAsync, self.cuMemFreeAsync = lib.stand_alloc, lib.stand_free


@pytest.fixture
def gpu(built, monkeypatch):
    """A stand-in device 0: nbxcert's memory and launcher over the stand-ins, this thread's context current."""
    lib, module = built
    monkeypatch.setattr(binaries, "launcher_module", lambda: module)
    monkeypatch.setattr(launcher, "_module", module)
    monkeypatch.setattr(memory, "_driver", _Driver(lib))
    monkeypatch.setattr(memory, "_driver_pid", cuda.process_id())
    monkeypatch.setattr(memory, "_pools", {0: 1})
    monkeypatch.setattr(memory, "_stats", {0: memory._PoolStats()})
    monkeypatch.setattr(memory, "_kept", collections.OrderedDict())
    monkeypatch.setattr(memory, "_last_kept", [None])
    monkeypatch.setattr(memory, "_counted", None)  # bound afresh by the test's first replay: the figures restart
    monkeypatch.setattr(T, "_CUDA_MODULE", cuda)
    monkeypatch.setattr(T, "_MEMORY_MODULE", memory)
    monkeypatch.setattr(L, "_current_stream", cuda.current_stream)
    monkeypatch.setattr(L, "_c_ready", [False])
    monkeypatch.setattr(cuda._tls, "device", 0, raising=False)
    monkeypatch.setattr(cuda, "_torch_query", [None])
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    yield lib, module
    gc.collect()  # the test's tensors are freed into the stand-in pool, not the real driver
    module.drain(-1)  # nothing kept in C outlives the test's stand-in pool


def tensor(shape) -> T.Tensor:
    n = int(np.prod(shape))
    strides = tuple(int(s) for s in np.cumprod((1, *reversed(shape[1:])))[::-1])
    return T.Tensor.trusted(T.Storage.fresh(2 * n, DEV), tuple(shape), strides, F16, 0)


def make_entry(calls: list):
    """A served entry point `norm(x, w, eps, out=None, config=None)` whose full path notes its call (a plan is put in
    its memo by `plan_for`)."""

    def norm(x, w, eps=1e-6, out=None, config=None):
        calls.append((x, w, eps))
        return "full path"

    return L.served(norm)


def plan_for(entry, x, w, eps=1e-6, launches=1, **kwargs) -> L.CallPlan:
    """The plan a GPU's first call would record: `launches` packed launches (x, w and a made output by address), an
    output of x's shape made per call; a plan of several launches keeps a graph holder, as `_Packed.of` makes it."""
    sig, _ = L.call_signature((x, w, eps), kwargs)
    step = (0x1234, ROWS, 1, 1, 128, 1, 0, 0, 0, b"PPPfi", [0, 0, 0, eps, COLS], ((0, 0, 0), (1, 1, 0), (2, 2, 0)))
    packed = L._Packed.__new__(L._Packed)
    packed.steps, packed.launch_plan, packed.device = (step,) * launches, binaries.launcher_module().launch_plan, 0
    packed.names, packed.hooks = ("norm_kernel",) * launches, None
    packed.graph = [None] if launches > 1 else None
    result = ("view", 2, 0, x.shape, x._strides, F16)
    plan = L.CallPlan(2, ((2 * ROWS * COLS, DEV),), (), result, (), packed)
    entry.plans[sig] = plan
    entry.route[0] = L._served_in_c(entry.route[0], entry.plans, 4)
    return plan


def served_norm():
    """(entry point, its full path's calls, x, w, the plan put in its memo for (x, w, 1e-6))."""
    calls: list = []
    norm = make_entry(calls)
    x, w = tensor((ROWS, COLS)), tensor((COLS,))
    return norm, calls, x, w, plan_for(norm, x, w)


def test_a_plan_replayed_in_c_gives_what_the_python_path_gives(gpu):
    lib, module = gpu
    norm, calls, x, w, plan = served_norm()
    assert isinstance(norm.route[0], module.Served)
    in_python = plan.replay((x, w))
    launches = lib.stand_count(0)
    in_c = norm(x, w, 1e-6)
    assert calls == [] and lib.stand_count(0) == launches + 1
    assert type(in_c._storage._alloc) is module.Block
    for name in ("shape", "_strides", "dtype", "_offset"):
        assert getattr(in_c, name) == getattr(in_python, name)
    assert in_c._key == L.tensor_key(in_python)[:3] + (in_c.data_ptr() % 16, "cuda", 0)
    assert in_c._ptr == in_c._storage.data_ptr() == in_c._storage._alloc.ptr
    assert [lib.stand_param(i) for i in range(3)] == [x.data_ptr(), w.data_ptr(), in_c.data_ptr()]
    # the result is an input of the next call as it is: its signature is found without asking Python
    again = norm(in_c, w, 1e-6)
    assert calls == [] and again.shape == x.shape and lib.stand_param(0) == in_c.data_ptr()


def test_an_output_made_per_call_reuses_its_block_with_no_driver_allocation(gpu):
    lib, module = gpu
    norm, _, x, w, _ = served_norm()
    norm(x, w, 1e-6)
    allocs, frees = lib.stand_count(1), lib.stand_count(2)
    before = memory.figures(0)
    addresses = set()
    for _ in range(1000):
        out = norm(x, w, 1e-6)
        addresses.add(out.data_ptr())
        del out
    assert lib.stand_count(1) == allocs and lib.stand_count(2) == frees  # no driver allocation, no driver free
    assert len(addresses) == 1
    now = memory.figures(0)
    assert (now["allocated"], now["count"]) == (before["allocated"], before["count"])
    assert now["allocations"] == before["allocations"] + 1000 and now["frees"] == before["frees"] + 1000
    held = [norm(x, w, 1e-6) for _ in range(3)]  # three live outputs: two kept blocks, then the pool
    assert len({h.data_ptr() for h in held}) == 3
    now = memory.figures(0)
    assert now["allocated"] == before["allocated"] + 3 * 2 * ROWS * COLS and now["peak"] >= now["allocated"]
    del held
    assert memory.figures(0)["allocated"] == before["allocated"]
    frees = lib.stand_count(2)
    assert memory.release_kept() >= 2 and lib.stand_count(2) >= frees + 2  # the blocks kept in C go back too


def test_a_plan_of_two_launches_replays_as_one_graph_launch_with_its_blocks_reused(gpu):
    """The C path of a two-launch plan: one graph made at the first call, then one graph launch per call and no
    cuLaunchKernelEx; the output's block comes back each call, so no node is updated and nothing is allocated."""
    lib, _ = gpu
    calls: list = []
    norm = make_entry(calls)
    x, w = tensor((ROWS, COLS)), tensor((COLS,))
    plan_for(norm, x, w, launches=2)
    made, graph_launches, sets = (lib.stand_graph_count(i) for i in range(3))
    launches = lib.stand_count(0)
    norm(x, w, 1e-6)
    allocs = lib.stand_count(1)
    for _ in range(1000):
        out = norm(x, w, 1e-6)
        del out
    assert calls == [] and lib.stand_count(0) == launches  # no launch of its own: the graph's
    assert lib.stand_graph_count(0) == made + 1 and lib.stand_graph_count(1) == graph_launches + 1001
    assert lib.stand_graph_count(2) == sets  # the same block each call: the same addresses, nothing to update
    assert lib.stand_count(1) == allocs
    other = tensor((ROWS, COLS))  # another input: its node parameters are updated, the graph is the same
    norm(other, w, 1e-6)
    assert lib.stand_graph_count(0) == made + 1 and lib.stand_graph_count(2) == sets + 2


def test_with_no_blocks_kept_a_freed_output_goes_back_to_the_pool(gpu, monkeypatch):
    lib, _ = gpu
    monkeypatch.setattr(memory, "KEPT_PER_SIZE", 0)
    norm, _, x, w, _ = served_norm()
    norm(x, w, 1e-6)
    allocs, frees = lib.stand_count(1), lib.stand_count(2)
    for _ in range(5):
        norm(x, w, 1e-6)
    assert lib.stand_count(1) == allocs + 5 and lib.stand_count(2) == frees + 5


def test_calls_the_c_path_cannot_replay_go_to_the_python_path(gpu, monkeypatch):
    lib, _ = gpu
    norm, calls, x, w, _ = served_norm()
    launches = lib.stand_count(0)
    assert norm(x, w, 1e-6, config="c") == "full path"  # an explicit config
    assert norm(x, w, 1e-6, None, "c") == "full path"  # the same, by position
    assert norm(x, x, 1e-6) == "full path"  # aliased tensors: no plan either way
    assert norm(x, w, 1e-5) == "full path"  # another signature: recorded by Python (no launch here: none is made)
    assert norm(x, [1], 1e-6) == "full path"  # an argument a signature cannot hold
    with recording.recording():
        assert norm(x, w, 1e-6) == "full path"  # inside another served call's record
    assert len(calls) == 6 and lib.stand_count(0) == launches


def test_a_profilers_launch_hook_sends_the_call_to_the_full_path(gpu):
    assert gpu
    norm, calls, x, w, plan = served_norm()

    class Knobs:
        launch_enter_hook = staticmethod(lambda *a: None)
        launch_exit_hook = None

    plan.packed.hooks = (Knobs, type(None))  # a hook that is not Triton's empty chain: it wants Triton's metadata
    plan.fast = L._fast_form(plan)
    assert norm(x, w, 1e-6) == "full path" and len(calls) == 1


def test_another_stream_is_another_signature(gpu):
    lib, _ = gpu
    norm, calls, x, w, _ = served_norm()
    with cuda.using_stream(0x5000, 0):
        assert norm(x, w, 1e-6) == "full path"  # the signature holds the stream: not the plan made on stream 0
    launches = lib.stand_count(0)
    norm(x, w, 1e-6)
    assert len(calls) == 1 and lib.stand_count(0) == launches + 1


def test_a_failed_launch_is_one_error_naming_the_kernel(gpu):
    lib, _ = gpu
    norm, _, x, w, _ = served_norm()
    lib.stand_fail_at(lib.stand_count(0))
    try:
        with pytest.raises(Exception, match="norm_kernel"):
            norm(x, w, 1e-6)
    finally:
        lib.stand_fail_at(-1)


def test_the_split_workspaces_lock_is_held_while_the_launches_are_queued(gpu):
    lib, _ = gpu
    norm, _, x, w, plan = served_norm()
    seen = []

    class Lock:
        def acquire(self):
            seen.append(("acquire", lib.stand_count(0)))

        def release(self):
            seen.append(("release", lib.stand_count(0)))

    plan.locks = (Lock(),)
    plan.fast = L._fast_form(plan)
    launches = lib.stand_count(0)
    norm(x, w, 1e-6)
    assert seen == [("acquire", launches), ("release", launches + 1)]


def test_a_tma_descriptor_is_encoded_once_per_address_and_passed_as_kept(gpu):
    lib, module = gpu
    maps = {}  # address -> a 128-byte CUtensorMap stand-in whose first 8 bytes name it
    encoded = []

    def fill(kept, address):
        encoded.append(address)
        buffer = maps[address] = (ctypes.c_uint64 * 16)(address ^ 0xABC)
        kept[address] = [ctypes.addressof(buffer), COLS, 2 * COLS]
        return kept[address]

    kept: dict = {}
    descriptors = ((1, 3, 1, 0, kept, lambda address: fill(kept, address)),)
    step = (0x1234, 1, 1, 1, 128, 1, 0, 0, 0, b"PTil", [0, None, None, None], ((0, 0, 0),), descriptors)
    for round_ in range(3):
        status, at = module.launch_plan((step,), [0x7000, 0x9000 + 0x100 * (round_ % 2)], 0)
        assert (status, at) == (0, 1)
        assert lib.stand_param(0) == 0x7000 and lib.stand_param(1) == (0x9000 + 0x100 * (round_ % 2)) ^ 0xABC
    assert encoded == [0x9000, 0x9100]  # each address once; the third launch found its encoding kept


def test_past_the_sizes_kept_in_c_the_least_recently_used_goes_back_to_the_pool(gpu):
    lib, module = gpu
    norm, _, x, w, plan = served_norm()
    frees = lib.stand_count(2)
    for i in range(33):  # one size more than launcher.c keeps (KEPT_SIZES_IN_C)
        plan.made = ((2 * ROWS * COLS + 256 * i, DEV),)
        plan.fast = L._fast_form(plan)
        norm(x, w, 1e-6)  # made and dropped: kept in C for its size
    assert lib.stand_count(2) == frees + 1  # the first size's block given back on its stream, nothing else
    assert len(module.drain(-1)) == 32
