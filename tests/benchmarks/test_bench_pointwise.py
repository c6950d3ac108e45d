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


def test_without_a_gpu_it_says_so_and_exits_2(bench, capsys, backend):
    if backend.name == "cuda":
        pytest.skip("a GPU is here")
    assert bench.main(["--ops", "abs", "--no-torch"]) == 2
    assert "bench_pointwise needs a GPU" in capsys.readouterr().err
