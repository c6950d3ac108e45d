"""Kernels served from compiled binaries (`binaries`), on a real NVIDIA GPU, torch made unimportable.

The binaries are cross-compiled for the GPU's target in one process (`tests/crosstools.py`, as `nbxcert bundle`
compiles them); a fresh process with an empty Triton cache registers them as its source and runs each launch, both as
the spec launches it and through the served entry points (whose second and third calls replay their plan through
`launch._Bundled`); a third process runs the same launches through Triton's own compile. Every output must be bit for
bit the same, the bundle process must have loaded binaries and Triton must have compiled nothing in it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nbxcert.kernels.backends import cuda

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]
from crosstools import cross_compile  # noqa: E402
from test_cuda import NO_TORCH_PRELUDE  # noqa: E402

MATMUL = {"M": 256, "N": 256, "K": 512, "aligned": 1, "trans_a": 0, "trans_b": 1}
# (spec, the config's kwargs as the spec's candidates name them (None: the default), problem, dtypes)
ITEMS = [
    ("rmsnorm", None, {"n_rows": 16, "n_cols": 4096}, ("float16", "float16")),
    ("matmul", {"KIND": "tma_persistent"}, MATMUL, ("float16", "float16")),
    ("matmul", {"KIND": "split_k"}, MATMUL, ("bfloat16", "bfloat16")),
    ("matmul", {"KIND": "tiled"}, MATMUL, ("float16", "float16")),
    ("flash_attention", None, None, None),
    ("decode_attention", None, None, None),
]


def choose(spec, kwargs):
    """The first candidate whose kwargs hold `kwargs` (the default for None)."""
    if kwargs is None:
        return spec.default
    return next(c for c in spec.candidates if all(dict(c.kwargs).get(k) == v for k, v in kwargs.items()))


def resolved(spec, problem, dtypes):
    return (problem or spec.example_problems[-1]), tuple(dtypes or spec.dtypes[0])


def compile_items(items):
    """(In the cross-compiling subprocess.) Each item's launches: what names each and its compiled binary."""
    from nbxcert.kernels import recording
    from nbxcert.kernels.backends import cross
    from nbxcert.kernels.spec import get_spec

    for name, kwargs, problem, dtypes in items:
        spec = get_spec(name)
        problem, dtypes = resolved(spec, problem, dtypes)
        inputs = spec.make_inputs(problem, dtypes, 0, "cpu")
        with recording.recording() as rec, cross.recording() as launched:
            spec.launch(choose(spec, kwargs), inputs)
        yield from named(rec.launches, launched)
    # the served entry points' own launches (their default configs) at the shapes the GPU process calls them with
    import numpy as np

    from nbxcert.kernels import matmul, rows
    from nbxcert.kernels.tensor import from_numpy

    x = from_numpy(np.ones((16, 4096), np.float16))
    w = from_numpy(np.ones((4096,), np.float16))
    a = from_numpy(np.ones((64, 512), np.float16))
    b = from_numpy(np.ones((512, 256), np.float16))
    with recording.recording() as rec, cross.recording() as launched:
        rows.rmsnorm(x, w, config=get_spec("rmsnorm").default)
        matmul.matmul(a, b, config=get_spec("matmul").default)
    yield from named(rec.launches, launched)


def named(launches, compiled):
    """(In the cross-compiling subprocess.) Each recorded launch paired with the kernel the cross driver compiled for
    it: what names it (as a bundle does) and its binary."""
    from nbxcert.kernels.backends import binaries

    for kl, made in zip(launches, compiled, strict=True):
        identity, source_key = binaries.identity_of(kl.kernel)
        yield {
            "identity": identity,
            "source_key": source_key,
            "specialization": binaries.specialization_of(kl.kernel, kl.args, kl.kwargs),
            "record": binaries.describe(made.compiled),
            "image": base64.b64encode(made.compiled.asm["cubin"]).decode(),
        }


RUN = """
import hashlib, json, os, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_binaries_gpu import ITEMS, choose, resolved
from nbxcert import serving
from nbxcert.kernels.backends import binaries, select
from nbxcert.kernels.spec import get_spec, load_all

assert select().name == "cuda"
records = json.load(open({records!r})) if {records!r} else []
table = {{(r["identity"], r["source_key"], r["specialization"]): r for r in records}}

def lookup(identity, source_key, specialization):
    import base64
    r = table.get((identity, source_key, specialization))
    if r is None:
        return None
    return binaries.KernelBinary(identity, source_key, specialization, base64.b64decode(r["image"]), r["record"])

if records:
    binaries.set_source(lookup)
serving.configure(dirs=[{empty!r}], certified_only=False)
digests = []
for name, kwargs, problem, dtypes in ITEMS:
    spec = get_spec(name)
    problem, dtypes = resolved(spec, problem, dtypes)
    inputs = spec.make_inputs(problem, dtypes, 0, "cuda:0")
    spec.launch(choose(spec, kwargs), inputs)
    for o in inputs.outputs:
        digests.append(hashlib.sha256(inputs.tensors[o].cpu().numpy().tobytes()).hexdigest())
from nbxcert.kernels import matmul, rows
from nbxcert.kernels.tensor import from_numpy
g = np.random.default_rng(0)
x = from_numpy(g.standard_normal((16, 4096)).astype(np.float16), device="cuda:0")
w = from_numpy(g.standard_normal(4096).astype(np.float16), device="cuda:0")
a = from_numpy(g.standard_normal((64, 512)).astype(np.float16), device="cuda:0")
b = from_numpy(g.standard_normal((512, 256)).astype(np.float16), device="cuda:0")
for _ in range(3):  # the first call records the plan, the others replay it
    digests.append(hashlib.sha256(rows.rmsnorm(x, w).cpu().numpy().tobytes()).hexdigest())
    digests.append(hashlib.sha256(matmul.matmul(a, b).cpu().numpy().tobytes()).hexdigest())
compiled = sum(len(c[0]) for s in load_all().values() for k in s.kernels
               for c in getattr(k, "device_caches", {{}}).values())
plans = [type(step).__name__ for fn in (rows.rmsnorm, matmul.matmul) for plan in fn.plans.values()
         if hasattr(plan, "steps") for step in plan.steps]
print("RESULT", json.dumps({{"digests": digests, "compiled": compiled, "loaded": binaries.loaded_count(),
                             "plans": plans, "torch": "torch" in sys.modules}}))
"""


def run_gpu(tmp_path: Path, records: str) -> dict:
    empty = tmp_path / "no-certificates"
    empty.mkdir(exist_ok=True)
    script = tmp_path / ("bundled.py" if records else "compiled.py")
    script.write_text(
        NO_TORCH_PRELUDE + textwrap.dedent(RUN.format(tests=str(HERE), records=records, empty=str(empty)))
    )
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / f"triton-{script.stem}"), NBXCERT_UNCERTIFIED="default")
    env["NBXCERT_CACHE_DIR"] = str(tmp_path / f"nbx-{script.stem}")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.gpu
def test_gpu_kernels_served_from_binaries_match_tritons_compile_bit_for_bit_and_compile_nothing(tmp_path):
    ok, why = cuda.available()
    if not ok:
        pytest.skip(f"no usable NVIDIA GPU: {why}")
    major, minor = cuda.compute_capability(0)
    made = cross_compile(10 * major + minor, compile_items, ITEMS, timeout=1800)
    records = tmp_path / "records.json"
    records.write_text(json.dumps(made))
    bundled = run_gpu(tmp_path, str(records))
    compiled = run_gpu(tmp_path, "")
    assert not bundled["torch"] and not compiled["torch"]
    assert bundled["digests"] == compiled["digests"]
    assert bundled["compiled"] == 0, "Triton compiled kernels although every launch had a binary"
    assert bundled["loaded"] > 0 and compiled["loaded"] == 0 and compiled["compiled"] > 0
    assert "_Bundled" in bundled["plans"] and "_Bundled" not in compiled["plans"]
