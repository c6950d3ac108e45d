"""A plan of several launches queued as one CUDA graph (`run_graph` in launcher.c), with no GPU: the launcher is bound
to stand-ins for the driver's launch and graph functions, compiled here against the `cuda.h` Triton ships, which
count what they are asked and keep, per graph node, its kernel, grid, dependency and first parameter as last set.
"""

from __future__ import annotations

import ctypes
import gc

import pytest
from standins import compile_stand_in

from nbxcert.kernels.backends import binaries, launcher

STAND_IN_C = r"""
#include <stdint.h>
#include <string.h>
#include "cuda.h"
static int counts[10], capturing, fail_launch_at = -1;
static uint64_t node_first[16];
static void *node_fn[16];
static unsigned node_grid[16];
static int node_chained[16];
enum { LAUNCHES, CREATES, NODES, INSTANTIATES, GRAPH_LAUNCHES, SETS, EXEC_DESTROYS, DESTROYS, QUERIES };
CUresult stand_launch(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  counts[LAUNCHES]++;
  return 0;
}
CUresult stand_create(CUgraph *g, unsigned int flags) { *g = (CUgraph)(uintptr_t)0x9000; counts[CREATES]++; return 0; }
CUresult stand_add(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, const CUDA_KERNEL_NODE_PARAMS *p) {
  int i = counts[NODES]++;
  *node = (CUgraphNode)(uintptr_t)(i + 1);
  node_chained[i] = i == 0 ? n == 0 : (n == 1 && deps[0] == (CUgraphNode)(uintptr_t)i);
  node_fn[i] = p->func;
  node_grid[i] = p->gridDimX;
  memcpy(&node_first[i], p->kernelParams[0], 8);
  return 0;
}
CUresult stand_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  *e = (CUgraphExec)(uintptr_t)0xe000;
  counts[INSTANTIATES]++;
  return 0;
}
CUresult stand_graph_launch(CUgraphExec e, CUstream s) {
  return counts[GRAPH_LAUNCHES]++ == fail_launch_at ? 700 : 0;
}
CUresult stand_set(CUgraphExec e, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *p) {
  int i = (int)(uintptr_t)node - 1;
  counts[SETS]++;
  node_fn[i] = p->func;
  memcpy(&node_first[i], p->kernelParams[0], 8);
  return 0;
}
CUresult stand_capturing(CUstream s, CUstreamCaptureStatus *status) {
  counts[QUERIES]++;
  *status = capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return 0;
}
CUresult stand_exec_destroy(CUgraphExec e) { counts[EXEC_DESTROYS]++; return 0; }
CUresult stand_destroy(CUgraph g) { counts[DESTROYS]++; return 0; }
int stand_count(int what) { return counts[what]; }
uint64_t stand_node_first(int i) { return node_first[i]; }
void *stand_node_fn(int i) { return node_fn[i]; }
unsigned stand_node_grid(int i) { return node_grid[i]; }
int stand_node_chained(int i) { return node_chained[i]; }
void stand_set_capturing(int on) { capturing = on; }
void stand_fail_graph_launch(int at) { fail_launch_at = at; }
void stand_reset(void) { memset(counts, 0, sizeof counts); capturing = 0; fail_launch_at = -1; }
"""

NAMES = ("launches", "creates", "nodes", "instantiates", "graph_launches", "sets", "exec_destroys", "destroys")
GRAPH_FUNCTIONS = (
    "stand_create",
    "stand_add",
    "stand_instantiate",
    "stand_graph_launch",
    "stand_set",
    "stand_capturing",
    "stand_exec_destroy",
    "stand_destroy",
)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    lib = compile_stand_in(STAND_IN_C, tmp_path_factory.mktemp("plan_graphs"))
    lib.stand_node_first.restype = ctypes.c_uint64
    lib.stand_node_fn.restype = ctypes.c_void_p
    return lib


def address(lib, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


@pytest.fixture(scope="module")
def module(stand_in, tmp_path_factory):
    # a build of its own: the graph functions bound here are this file's alone
    made = launcher.load(launcher.build(tmp_path_factory.mktemp("built") / "_nbxcert_launcher.so"))
    made.bind(address(stand_in, "stand_launch"), None)
    made.bind_graphs(*(address(stand_in, name) for name in GRAPH_FUNCTIONS))
    return made


@pytest.fixture
def lib(stand_in):
    stand_in.stand_reset()
    yield stand_in
    gc.collect()


def counts(lib) -> dict[str, int]:
    return {name: lib.stand_count(i) for i, name in enumerate(NAMES)}


def steps(stream=0x7, flags=(0, 0), ctas=(1, 1)):
    """Two steps: the first reads addresses 1 (+16) and 2, the second address 0 (+8)."""
    first = (0x11, 2, 1, 1, 64, ctas[0], 0, stream, flags[0], b"PiP-", [0, 5, 0, "constexpr"], ((0, 1, 16), (2, 2, 0)))
    second = (0x22, 9, 1, 1, 128, ctas[1], 256, stream, flags[1], b"Pf", [0, 0.5], ((0, 0, 8),))
    return (first, second)


def test_the_graph_functions_bound_are_the_drivers():
    assert len(binaries.GRAPH_SYMBOLS) == len(GRAPH_FUNCTIONS) == 8
    assert binaries.GRAPH_SYMBOLS[1].endswith("_v2") and binaries.GRAPH_SYMBOLS[4].endswith("_v2")


def test_a_plan_of_several_launches_is_one_graph_launch_updated_only_where_its_addresses_change(lib, module):
    holder, plan = [None], steps()
    addresses = [0x1000, 0x2000, 0x30000]
    assert module.launch_plan(plan, addresses, 0, holder) == (0, 2)
    made = counts(lib)
    assert made == dict(made, launches=0, creates=1, nodes=2, instantiates=1, graph_launches=1, sets=0)
    assert [lib.stand_node_fn(i) for i in (0, 1)] == [0x11, 0x22]  # the steps' kernels, in order, chained
    assert [lib.stand_node_grid(i) for i in (0, 1)] == [2, 9]
    assert lib.stand_node_chained(0) and lib.stand_node_chained(1)
    assert [lib.stand_node_first(i) for i in (0, 1)] == [0x2010, 0x1008]
    assert type(holder[0]).__name__ == "PyCapsule"

    assert module.launch_plan(plan, list(addresses), 0, holder) == (0, 2)  # the same addresses: nothing to update
    assert counts(lib) == dict(made, graph_launches=2)

    addresses[2] = 0x40000  # only the first step reads it
    assert module.launch_plan(plan, addresses, 0, holder) == (0, 2)
    assert counts(lib) == dict(made, graph_launches=3, sets=1)
    addresses[0] = 0x5000  # only the second step reads it
    assert module.launch_plan(plan, addresses, 0, holder) == (0, 2)
    assert counts(lib) == dict(made, graph_launches=4, sets=2)
    assert [lib.stand_node_first(i) for i in (0, 1)] == [0x2010, 0x5008]


@pytest.mark.parametrize(
    "plan",
    [
        steps()[:1],  # one launch: a graph saves nothing
        steps(flags=(0, 2)),  # a PDL launch
        steps(flags=(1, 0)),  # a cooperative launch
        steps(ctas=(2, 1)),  # a cluster
        (steps()[0], steps(stream=0x8)[1]),  # another stream
    ],
    ids=["one-launch", "pdl", "cooperative", "cluster", "two-streams"],
)
def test_a_plan_a_graph_node_cannot_hold_as_it_is_is_launched_step_by_step(lib, module, plan):
    holder = [None]
    assert module.launch_plan(plan, [0x1000, 0x2000, 0x30000], 0, holder) == (0, len(plan))
    assert counts(lib) == dict.fromkeys(NAMES, 0) | {"launches": len(plan)}
    assert holder == [None]


def test_a_stream_being_captured_gets_the_launches_themselves(lib, module):
    lib.stand_set_capturing(1)
    holder = [None]
    assert module.launch_plan(steps(), [0x1000, 0x2000, 0x30000], 0, holder) == (0, 2)
    assert counts(lib) == dict.fromkeys(NAMES, 0) | {"launches": 2}
    assert holder == [None]


def test_a_replay_from_a_later_step_or_without_a_holder_is_launched_step_by_step(lib, module):
    holder = [None]
    assert module.launch_plan(steps(), [0x1000, 0x2000, 0x30000], 1, holder) == (0, 2)
    assert module.launch_plan(steps(), [0x1000, 0x2000, 0x30000], 0, None) == (0, 2)
    assert module.launch_plan(steps(), [0x1000, 0x2000, 0x30000], 0) == (0, 2)
    assert counts(lib) == dict.fromkeys(NAMES, 0) | {"launches": 5}


def test_a_failed_graph_launch_comes_back_as_the_drivers_status(lib, module):
    lib.stand_fail_graph_launch(1)
    holder = [None]
    assert module.launch_plan(steps(), [0x1000, 0x2000, 0x30000], 0, holder) == (0, 2)
    assert module.launch_plan(steps(), [0x1000, 0x2000, 0x30000], 0, holder) == (700, 0)


def test_a_plans_graph_is_destroyed_with_its_holder(lib, module):
    holder = [None]
    module.launch_plan(steps(), [0x1000, 0x2000, 0x30000], 0, holder)
    assert counts(lib)["exec_destroys"] == 0
    holder[0] = None
    gc.collect()
    assert counts(lib)["exec_destroys"] == 1 and counts(lib)["destroys"] == 1


def test_a_bad_step_is_refused_before_a_graph_is_made(lib, module):
    bad = (steps()[0], (0x22, 9, 1, 1, 128, 1, 256, 0x7, 0, b"Pf", [0, 0.5], ((0, 5, 8),)))
    with pytest.raises(ValueError, match="bad patch"):
        module.launch_plan(bad, [0x1000, 0x2000, 0x30000], 0, [None])
    assert counts(lib) == dict.fromkeys(NAMES, 0)
