"""bench_pointwise.py's cases run on the CPU (the interpreter) at one row: every nbxcert call of its table is a real
call of `nbxcert.ops` with the inputs the GPU run makes, so a GPU run cannot fail on a name or a signature."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("bench_pointwise")
    finally:
        sys.modules.pop("bench_pointwise", None)
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_every_case_calls_nbxcert_ops_and_counts_its_bytes(bench, backend, half):
    from nbxcert import ops
    from nbxcert.kernels.inputs import rng

    gen = rng(0)
    shape = (1, 256)
    cases = bench._cases(half)
    names = [c[0] for c in cases]
    assert len(names) == len(set(names)) and (half == "bfloat16") == ("cast_bf16_to_f32" in names)
    for name, spec, call, torch_expr in cases:
        tensors = [bench.make_input(gen, d, v, shape, backend.device) for d, v in spec]
        x, y, z = (tensors + [None, None, None])[:3]
        scope = {"ops": ops, "x": x, "y": y, "z": z, "SHAPE": shape, "NUMEL": 256, "DEVICE": backend.device}
        result = eval("lambda: " + call, scope)()
        assert result.numel in (256, 128), name  # glu halves its last dimension
        assert bench.moved_bytes(tensors, result) == sum(t.nbytes for t in tensors) + result.nbytes
        assert "torch." in torch_expr or "F." in torch_expr or "x." in torch_expr


def test_the_view_cases_make_the_layouts_they_name(bench, backend):
    """The row bias and column scale broadcast; the sliced rows do not merge (a 2-d index for the kernel to work
    out)."""
    from nbxcert.kernels import pointwise as pw
    from nbxcert.kernels.inputs import rng

    shape = (4, 256)
    want = {"row": "broadcast", "col": "broadcast", "sliced": "strided", "normal": "dense"}
    views = [c for c in bench._cases("float16") if {"row", "col", "sliced"} & {v for _, v in c[1]}]
    assert [c[0] for c in views] == ["add_row_bias", "mul_col_scale", "add_sliced_rows", "silu_sliced_rows"]
    for name, spec, _call, _ in views:
        for _dtype, values in spec:
            t = bench.make_input(rng(0), "float16", values, shape, backend.device)
            assert pw.layout_of(t, shape) == want[values], (name, values)
            if values == "sliced":
                assert len(pw.merge_dims(shape, t.strides)[0]) == 2


def test_every_full_sized_tensor_of_a_case_is_at_least_64_mib(bench, backend):
    """At the default 8192 rows, each case's operands of the output's shape and its result hold at least 64 MiB (the
    bool and glu cases at twice the rows); the peer's script compiles and takes each case's rows."""
    from nbxcert import ops
    from nbxcert.kernels.dtypes import get_dtype
    from nbxcert.kernels.inputs import rng

    mib64, cols = 64 << 20, 256
    for name, spec, call, _ in bench._cases("float16"):
        rows = bench.case_rows(name, spec, 8192)
        tensors = [bench.make_input(rng(0), d, v, (2, cols), backend.device) for d, v in spec]
        x, y, z = (tensors + [None, None, None])[:3]
        scope = {"ops": ops, "x": x, "y": y, "z": z, "SHAPE": (2, cols), "NUMEL": 2 * cols, "DEVICE": backend.device}
        result = eval("lambda: " + call, scope)()
        share = result.numel / (2 * cols)  # of the case's [rows, 4096] elements (glu: a half)
        assert rows * 4096 * share * result.itemsize >= mib64, name
        for dtype, values in spec:
            if values not in ("row", "col"):  # a broadcast bias or scale is small by what it is
                assert rows * 4096 * get_dtype(dtype).itemsize >= mib64, (name, dtype)
    assert compile(bench.PEER_SCRIPT, "bench_pointwise peer", "exec") is not None
    assert "for i, (name, spec, expr, case_rows) in enumerate(cases):" in bench.PEER_SCRIPT


def test_without_a_gpu_it_says_so_and_exits_2(bench, capsys, backend):
    if backend.name == "cuda":
        pytest.skip("a GPU is here")
    assert bench.main(["--ops", "abs", "--no-torch"]) == 2
    assert "bench_pointwise needs a GPU" in capsys.readouterr().err


def test_a_miss_within_the_rounds_spread_is_told_from_a_deficit(bench):
    """A miss against torch no larger than the larger spread of either side's rounds is a tie the run cannot tell from
    parity (tan on the H100: its own rounds 57.6 and 50.3 us, torch's 50.4 and 50.3); one past it is a deficit."""
    assert bench.tie([0.0499, 0.0504], [0.0502, 0.0505], 0.0502 / 0.0504) == (bench._spread([0.0499, 0.0504]), True)
    noise, tied = bench.tie([0.0576, 0.0503], [0.0504, 0.0503], 0.0504 / 0.0540)
    assert tied and abs(noise - (0.0576 - 0.0503) / 0.0503) < 1e-12
    assert bench.tie([0.0700, 0.0701], [0.0650, 0.0651], 0.0650 / 0.0700) == (bench._spread([0.0650, 0.0651]), False)
    assert bench.tie([0.05], [0.05, 0.06], 0.9) == (None, False)  # one round: no noise to tell
    assert bench.tie([0.05, 0.05], [0.05, 0.05], 1.01)[1] is False  # met: no tie to tell
