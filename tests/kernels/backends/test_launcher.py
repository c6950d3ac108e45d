"""Tests of nbxcert's kernel launcher (`launcher.c`, built by `launcher.py`) and the parameter codes of compiled
kernels (`binaries.param_codes`), with no GPU: the launcher is bound to a stand-in for cuLaunchKernelEx, compiled here
against the `cuda.h` Triton ships, which keeps the launch configuration and the bytes of every parameter it was given.
"""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import numpy as np
import pytest
from standins import compile_stand_in

from nbxcert.kernels.backends import binaries, launcher

STAND_IN_C = r"""
#include <stdint.h>
#include <string.h>
#include "cuda.h"
static CUlaunchConfig last;
static CUlaunchAttribute attrs[8];
static void *function;
static unsigned char seen[64][128];
static int sizes[64], n_expected, launches;
void stand_expect(int n, const int *s) { n_expected = n; memcpy(sizes, s, n * sizeof(int)); }
CUresult stand_launch(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  last = *c; function = f; launches++;
  memcpy(attrs, c->attrs, c->numAttrs * sizeof(CUlaunchAttribute));
  for (int i = 0; i < n_expected; i++) memcpy(seen[i], params[i], sizes[i]);
  return launches == 1000 ? 700 : 0;
}
int stand_launches(void) { return launches; }
unsigned stand_config(int i) {
  unsigned v[7] = {last.gridDimX, last.gridDimY, last.gridDimZ, last.blockDimX, last.sharedMemBytes, last.numAttrs, 0};
  return v[i];
}
int stand_attr_id(int i) { return attrs[i].id; }
unsigned stand_cluster_x(int i) { return attrs[i].value.clusterDim.x; }
void *stand_function(void) { return function; }
void *stand_stream(void) { return last.hStream; }
const unsigned char *stand_param(int i) { return seen[i]; }
"""


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    lib = compile_stand_in(STAND_IN_C, tmp_path_factory.mktemp("launcher"))
    lib.stand_param.restype = ctypes.POINTER(ctypes.c_ubyte * 128)
    lib.stand_function.restype = ctypes.c_void_p
    lib.stand_stream.restype = ctypes.c_void_p
    return lib


@pytest.fixture(scope="module")
def module(stand_in, tmp_path_factory):
    built = launcher.build(tmp_path_factory.mktemp("built") / "_nbxcert_launcher.so")
    made = launcher.load(built)
    made.bind(ctypes.cast(stand_in.stand_launch, ctypes.c_void_p).value, None)
    return made


def expect(stand_in, sizes):
    stand_in.stand_expect(len(sizes), (ctypes.c_int * len(sizes))(*sizes))


def param(stand_in, i, size) -> bytes:
    return bytes(stand_in.stand_param(i).contents)[:size]


def test_every_type_code_is_packed_as_the_kernel_reads_it(stand_in, module):
    codes = b"PIiLlHhBbfdeg"
    values = [0xDEADBEEF00, 2**32 - 1, -(2**31), 2**64 - 1, -5, 65535, -300, 255, -7, 1.5, -2.25, 0.333, 3.140625]
    sizes = [8, 4, 4, 8, 8, 2, 2, 1, 1, 4, 8, 2, 2]
    expect(stand_in, sizes)
    assert module.launch(0x1234, 3, 2, 1, 128, 1, 1024, 0x99, 0, codes, values) == 0
    got = [param(stand_in, i, s) for i, s in enumerate(sizes)]
    assert got[0] == struct.pack("<Q", 0xDEADBEEF00)
    assert got[1] == struct.pack("<I", 2**32 - 1)
    assert got[2] == struct.pack("<i", -(2**31))
    assert got[3] == struct.pack("<Q", 2**64 - 1)
    assert got[4] == struct.pack("<q", -5)
    assert got[5] == struct.pack("<H", 65535)
    assert got[6] == struct.pack("<h", -300)
    assert got[7] == struct.pack("<B", 255)
    assert got[8] == struct.pack("<b", -7)
    assert got[9] == struct.pack("<f", 1.5)
    assert got[10] == struct.pack("<d", -2.25)
    assert got[11] == np.float16(0.333).tobytes()
    # bfloat16 truncated from float32, as Triton's launcher packs it
    assert got[12] == struct.pack("<I", struct.unpack("<I", struct.pack("<f", 3.140625))[0])[2:]
    assert [stand_in.stand_config(i) for i in range(6)] == [3, 2, 1, 128, 1024, 0]
    assert stand_in.stand_function() == 0x1234
    assert stand_in.stand_stream() == 0x99


def test_skipped_values_take_no_parameter_and_none_is_a_null_pointer(stand_in, module):
    expect(stand_in, [8, 4, 8])
    assert module.launch(1, 1, 1, 1, 32, 1, 0, 0, 0, b"P-i-P", [None, object(), 7, "constexpr", 42]) == 0
    assert param(stand_in, 0, 8) == bytes(8)
    assert param(stand_in, 1, 4) == struct.pack("<i", 7)
    assert param(stand_in, 2, 8) == struct.pack("<Q", 42)


def test_a_tensor_map_is_copied_from_its_address(stand_in, module):
    raw = bytes(range(128))
    buffer = ctypes.create_string_buffer(raw, 128)
    expect(stand_in, [128, 4])
    assert module.launch(1, 1, 1, 1, 32, 1, 0, 0, 0, b"Ti", [ctypes.addressof(buffer), 9]) == 0
    assert param(stand_in, 0, 128) == raw
    assert param(stand_in, 1, 4) == struct.pack("<i", 9)


@pytest.mark.parametrize(
    ("codes", "values", "kind", "words"),
    [
        (b"i", [2**31], OverflowError, "parameter 0 (type code 'i') is out of"),
        (b"P", [-1], OverflowError, "parameter 0 (type code 'P')"),
        (b"P", [2**64], OverflowError, "parameter 0"),
        (b"-B", [None, 256], OverflowError, "parameter 1 (type code 'B')"),
        (b"i", ["3"], TypeError, "must be an int, not str"),
        (b"f", [object()], TypeError, "must be a number"),
        (b"T", [b"x" * 128], TypeError, "a tensor map"),
        (b"T", [0], ValueError, "at address 0"),
        (b"Q", [1], ValueError, "unknown type code 'Q'"),
        (b"ii", [1], ValueError, "2 type codes for 1 values"),
    ],
)
def test_a_bad_value_is_refused_before_anything_is_launched(stand_in, module, codes, values, kind, words):
    before = stand_in.stand_launches()
    with pytest.raises(kind, match=words.replace("(", r"\(").replace(")", r"\)")):
        module.launch(1, 1, 1, 1, 32, 1, 0, 0, 0, codes, values)
    assert stand_in.stand_launches() == before


def test_an_empty_grid_queues_nothing_and_flags_and_clusters_become_attributes(stand_in, module):
    before = stand_in.stand_launches()
    assert module.launch(1, 0, 1, 1, 32, 1, 0, 0, 0, b"", []) == 0
    assert stand_in.stand_launches() == before
    expect(stand_in, [])
    assert module.launch(1, 4, 1, 1, 256, 2, 0, 0, 3, b"", []) == 0
    assert stand_in.stand_config(0) == 8  # the grid's x times num_ctas, as Triton launches a cluster
    ids = [stand_in.stand_attr_id(i) for i in range(stand_in.stand_config(5))]
    assert ids[:2] == [6, 2]  # programmatic stream serialization, then cooperative
    assert 4 in ids and stand_in.stand_cluster_x(ids.index(4)) == 2  # the cluster's dimension


def test_the_drivers_status_comes_back(stand_in, module):
    while stand_in.stand_launches() < 999:
        module.launch(1, 1, 1, 1, 32, 1, 0, 0, 0, b"", [])
    assert module.launch(1, 1, 1, 1, 32, 1, 0, 0, 0, b"", []) == 700  # the stand-in's 1000th launch fails


def test_the_build_is_keyed_by_its_inputs_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path))
    path = launcher.built_path()
    assert path.is_relative_to(tmp_path / "launcher")
    assert launcher.build() == path and path.is_file()
    stamp = path.stat().st_mtime_ns
    assert launcher.build() == path and path.stat().st_mtime_ns == stamp  # not built again
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".build-")]  # no temporary left


def test_a_missing_compiler_is_one_clear_refusal(tmp_path, monkeypatch):
    from nbxcert.errors import BackendUnavailable

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises((BackendUnavailable, FileNotFoundError)):
        launcher.build()


@pytest.mark.parametrize(
    ("signature", "meta", "codes"),
    [
        ([("x", "*fp16"), ("n", "i32"), ("eps", "fp32"), ("B", "constexpr")], None, "Pif-PP"),
        ([("a", "*bf16"), ("s", "i64"), ("f", "u1"), ("h", "fp16"), ("g", "bf16")], None, "PlBegPP"),
        ([("d", "tensordesc<fp16[128, 64]>"), ("n", "i32")], [{"swizzle": 3}], "TiilliPP"),
        ([("d", "tensordesc<fp16[1, 64, 32]>")], None, "PllllllbiiilllPP"),
    ],
)
def test_parameter_codes_follow_tritons_launcher(signature, meta, codes):
    assert binaries.param_codes(signature, meta) == codes


def test_a_parameter_type_the_launcher_does_not_take_is_refused_by_name():
    with pytest.raises(binaries.BinaryUnusable, match="argument q has type fp8e4nv"):
        binaries.param_codes([("q", "fp8e4nv")], None)
    with pytest.raises(binaries.BinaryUnusable, match="tuple"):
        binaries.param_codes([("t", ("i32", "i32"))], None)
    with pytest.raises(binaries.BinaryUnusable, match="argument p has type"):
        binaries.param_codes([("p", "*fp16; junk")], None)


def test_the_launcher_source_ships_with_the_package():
    assert Path(launcher.SOURCE).is_file()
    text = Path(__file__).parents[3].joinpath("pyproject.toml").read_text()
    assert '"nbxcert.kernels.backends" = ["*.c"]' in text


def test_a_plan_of_steps_is_queued_in_order_with_its_addresses_patched_in(stand_in, module):
    addresses = [0x1000, 0x2000, 0x30000]
    # (function, gx, gy, gz, threads, num_ctas, shared, stream, flags, codes, template, patches)
    first = (0x11, 2, 1, 1, 64, 1, 0, 0x7, 0, b"PiP-", [0, 5, 0, "constexpr"], ((0, 1, 16), (2, 2, 0)))
    second = (0x22, 9, 1, 1, 128, 1, 256, 0x7, 0, b"Pf", [0, 0.5], ((0, 0, 8),))
    before = stand_in.stand_launches()
    expect(stand_in, [8, 4])
    assert module.launch_plan((first, second), addresses, 0) == (0, 2)
    assert stand_in.stand_launches() == before + 2
    assert stand_in.stand_function() == 0x22  # the last queued
    assert param(stand_in, 0, 8) == struct.pack("<Q", 0x1008)
    assert param(stand_in, 1, 4) == struct.pack("<f", 0.5)
    expect(stand_in, [8, 4, 8])
    assert module.launch_plan((first,), addresses, 0) == (0, 1)
    assert [param(stand_in, i, s) for i, s in enumerate([8, 4, 8])] == [
        struct.pack("<Q", 0x2010),
        struct.pack("<i", 5),
        struct.pack("<Q", 0x30000),
    ]
    assert module.launch_plan((first, second), addresses, 1) == (0, 2)  # from the second step on
    assert stand_in.stand_launches() == before + 4


@pytest.mark.parametrize(
    "patches",
    [((0, 3, 0),), ((5, 0, 0),), ((0, 0, 0), (0, 1, 0)), ((0, -1, 0),)],
)
def test_a_plan_step_with_a_bad_patch_is_refused_before_it_is_queued(stand_in, module, patches):
    before = stand_in.stand_launches()
    step = (0x11, 1, 1, 1, 32, 1, 0, 0, 0, b"PP", [0, 0], patches)
    with pytest.raises(ValueError, match="bad patch"):
        module.launch_plan((step,), [1, 2, 3], 0)
    assert stand_in.stand_launches() == before
