"""Run one candidate config of a kernel on seeded inputs and judge every output against the oracle.

This is the correctness step shared by the tests, the sweep and `verify`: inputs are made from the seed, the oracle
answers from those inputs *before* the launch (some kernels work in place), outputs that are not in place are
poisoned, the kernel runs, and each output is compared (`compare.compare`) at the profile's tolerance.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from nbxcert.kernels.compare import Verdict, compare, poison
from nbxcert.kernels.spec import Config, Inputs, KernelSpec


def describe(spec: KernelSpec, config: Config, problem: Mapping[str, Any], dtypes) -> str:
    return f"kernel {spec.name}, config {config.label()}, problem {dict(problem)}, dtypes {tuple(dtypes)}"


def run_checked(
    spec: KernelSpec,
    config: Config,
    problem: Mapping[str, Any],
    dtypes: tuple[str, ...],
    profile,
    seed: int,
    device: str,
    inputs: Inputs | None = None,
    timings: list[float] | None = None,
) -> dict[str, Verdict]:
    """Launch `config` on the problem and return a verdict per output (tolerances from `profile`). With `timings`,
    the launch's wall time in seconds is appended to it (the interpreter's timing is its CPU time)."""
    if inputs is None:
        inputs = spec.make_inputs(problem, tuple(dtypes), seed, device)
    refs = spec.oracle(inputs)
    inplace = set(getattr(inputs, "inplace", ()) or ())
    for name in inputs.outputs:
        if name not in inplace:
            t = inputs.tensors[name]
            poison(t, t.dtype)
    t0 = time.perf_counter()
    spec.launch(config, inputs)
    if timings is not None:
        timings.append(time.perf_counter() - t0)
    context = describe(spec, config, problem, dtypes)
    verdicts = {}
    for name, ref in refs.items():
        t = inputs.tensors[name]
        tol = profile.tolerance(t.dtype.name)
        verdicts[name] = compare(t.float64(), ref.value, ref.scale, t.dtype, tol, f"{context}, output '{name}'")
    return verdicts


def all_ok(verdicts: Mapping[str, Verdict]) -> bool:
    return all(v.ok for v in verdicts.values())


def first_report(verdicts: Mapping[str, Verdict]) -> str:
    return next((v.report for v in verdicts.values() if not v.ok), "")
