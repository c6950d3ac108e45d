"""Run one candidate config of a kernel on seeded inputs and judge every output against the oracle.

This is the correctness step shared by the tests, the sweep and `verify`: inputs are made from the seed, the oracle
answers from those inputs *before* the launch (some kernels work in place), outputs that are not in place are
poisoned, the kernel runs, and each output is compared (`compare.compare`) at the profile's tolerance. It imports
nothing of the engine: the kernel families' check of every kept config at real shapes, which compiles them ahead in
a pool first, is the engine's (`nbxcert.warm.check_configs`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nbxcert.kernels.compare import Judge, Verdict, poison
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
    judges = _judge_and_poison(spec, inputs, profile)
    return _launch_and_judge(
        spec,
        config,
        inputs,
        problem,
        dtypes,
        timings,
        judges,
        lambda name, ctx: judges[name].verdict_of(inputs.tensors[name], ctx),
    )


def _judge_and_poison(spec: KernelSpec, inputs: Inputs, profile) -> dict[str, Judge]:
    """Ask the oracle (before poisoning: it reads the inputs, in-place outputs included), build a `Judge` per output
    at the profile's tolerance, then poison every output that is not in place (an unwritten element then fails)."""
    judges = {}
    for name, ref in spec.oracle(inputs).items():
        dt = inputs.tensors[name].dtype
        judges[name] = Judge(ref.value, ref.scale, dt, profile.tolerance(dt.name))
    inplace = set(getattr(inputs, "inplace", ()) or ())
    for name in inputs.outputs:
        if name not in inplace:
            t = inputs.tensors[name]
            poison(t, t.dtype)
    return judges


def _launch_and_judge(spec, config, inputs, problem, dtypes, timings, names, verdict) -> dict[str, Verdict]:
    """Launch `config` once (its wall time appended to `timings` when given) and judge each output in `names` with
    `verdict(name, context)`."""
    t0 = time.perf_counter()
    spec.launch(config, inputs)
    if timings is not None:
        timings.append(time.perf_counter() - t0)
    context = describe(spec, config, problem, dtypes)
    return {name: verdict(name, f"{context}, output '{name}'") for name in names}


@dataclass
class Prepared:
    """One problem of a key made ready for checking many candidates: the seeded inputs (on the device), a pristine
    copy of every storage they live in, on the same device, taken after the outputs were poisoned (so each candidate
    starts from the same bytes, even after an in-place kernel or a candidate that wrote where it must not, at the cost
    of a device-to-device copy), and a `Judge` per output built from the oracle's answer once."""

    spec: KernelSpec
    problem: dict[str, Any]
    dtypes: tuple[str, ...]
    inputs: Inputs
    pristine: list[tuple[Any, Any]]  # (storage, a copy of it)
    judges: dict[str, Judge]
    oracle_seconds: float
    on_device: bool = False  # judge outputs on the device where `judge.usable` (a GPU: no copy of each output back)
    device_judges: dict[str, Any] = field(default_factory=dict)

    def verdict(self, name: str, context: str) -> Verdict:
        """The verdict on output `name` as it is now."""
        tensor = self.inputs.tensors[name]
        if self.on_device:
            from nbxcert.kernels import judge as device_judge

            dj = self.device_judges.get(name)
            if dj is None and device_judge.usable(self.judges[name], tensor):
                dj = self.device_judges[name] = device_judge.DeviceJudge(self.judges[name], tensor.device)
            if dj is not None:
                return dj.verdict_of(tensor, context)
        return self.judges[name].verdict_of(tensor, context)

    def restore(self) -> Inputs:
        """Every storage back to its pristine bytes: the inputs as made, the outputs not in place poisoned."""
        for storage, clean in self.pristine:
            storage.copy_(clean)
        return self.inputs


def prepare(
    spec: KernelSpec,
    problem: Mapping[str, Any],
    dtypes: tuple[str, ...],
    profile,
    seed: int,
    device: str,
    on_device: bool | None = None,
) -> Prepared:
    """Make the inputs of `problem` from `seed`, ask the oracle once, and keep what every candidate is judged by.
    `on_device` (default: on a GPU) judges outputs where they lie (`nbxcert.kernels.judge`)."""
    inputs = spec.make_inputs(problem, tuple(dtypes), seed, device)
    t0 = time.perf_counter()
    judges = _judge_and_poison(spec, inputs, profile)
    oracle_seconds = time.perf_counter() - t0
    storages = {id(t.untyped_storage()): t.untyped_storage() for t in inputs.tensors.values()}
    pristine = []
    for st in storages.values():
        clean = type(st)(st.nbytes, st.device)
        pristine.append((st, clean.copy_(st)))
    from nbxcert.kernels.backends import select

    on_device = select().name == "cuda" if on_device is None else on_device
    return Prepared(spec, dict(problem), tuple(dtypes), inputs, pristine, judges, oracle_seconds, on_device)


def run_prepared(prepared: Prepared, config: Config, timings: list[float] | None = None) -> dict[str, Verdict]:
    """`run_checked` on prepared inputs: restore them, launch `config`, judge every output. With `timings`, the
    launch's wall time in seconds is appended."""
    inputs = prepared.restore()
    return _launch_and_judge(
        prepared.spec, config, inputs, prepared.problem, prepared.dtypes, timings, prepared.judges, prepared.verdict
    )


def all_ok(verdicts: Mapping[str, Verdict]) -> bool:
    return all(v.ok for v in verdicts.values())


def first_report(verdicts: Mapping[str, Verdict]) -> str:
    return next((v.report for v in verdicts.values() if not v.ok), "")


def no_bit_group(spec: KernelSpec, config: Config) -> tuple:
    """What is left of `config` once the spec's no-bit fields are dropped (num_warps and num_stages included when the
    spec names them): configs in one group must agree to the bit."""
    nb = set(spec.no_bit_fields)
    return (
        tuple((k, v) for k, v in config.kwargs if k not in nb),
        None if "num_warps" in nb else config.num_warps,
        None if "num_stages" in nb else config.num_stages,
    )
