"""`KernelSpec`: the one description of a kernel that the certifier, the runtime, the tests and the benchmarks share.

A kernel family's module (e.g. `kernels/matmul.py`) holds its `@triton.jit` kernels, named config factories, a prune
that uses device-file facts only, its key, its launch, its input maker and the oracle that judges it, and ends in
`register(KernelSpec(...))`. A spec validates itself on creation: an empty candidate list, a default config that is not
a candidate, a key field that the problem signature lacks, an output dtype with no tolerance in the device files, or a
duplicate name is refused by name (`KernelSpecInvalid`).

Words used throughout:
- a *problem* is the dict of a launch's size and layout parameters (`{"M": 512, "N": 2048, "K": 4096, "trans_b": 0}`);
  the key fields are a subset of it, bucketed by ladders from the device file or kept exact;
- *dtypes* is the tuple of the key's tensor dtypes, in the order `KernelSpec.dtype_args` names them;
- *inputs* (`Inputs`) are the tensors and scalars of one launch; `outputs` names the tensors the kernel writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbxcert.errors import KernelNotFound, KernelSpecInvalid, PruneEmpty
from nbxcert.kernels import server
from nbxcert.kernels.dtypes import DType, get_dtype
from nbxcert.kernels.tensor import Tensor


@dataclass(frozen=True)
class Config:
    """One launch configuration: the kernel's constexpr choices (`kwargs`), `num_warps` and `num_stages`.

    `kwargs` is kept as a sorted tuple of pairs so a config is hashable and prints the same way everywhere."""

    kwargs: tuple[tuple[str, Any], ...]
    num_warps: int = 4
    num_stages: int = 2

    @staticmethod
    def make(num_warps: int = 4, num_stages: int = 2, **kwargs) -> Config:
        return Config(tuple(sorted(kwargs.items())), int(num_warps), int(num_stages))

    def __getitem__(self, name: str) -> Any:
        for k, v in self.kwargs:
            if k == name:
                return v
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form certificates store."""
        return {"kwargs": dict(self.kwargs), "num_warps": self.num_warps, "num_stages": self.num_stages}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Config:
        return Config(tuple(sorted(dict(d["kwargs"]).items())), int(d["num_warps"]), int(d["num_stages"]))

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.kwargs]
        return ",".join(parts + [f"warps={self.num_warps}", f"stages={self.num_stages}"])

    def without(self, names: Sequence[str]) -> Config:
        """This config with the named kwargs dropped (used to group configs that differ only in no-bit fields)."""
        return Config(tuple((k, v) for k, v in self.kwargs if k not in names), self.num_warps, self.num_stages)


@dataclass(frozen=True)
class KeyField:
    """A problem parameter that enters the launch key: bucketed on the device file's ladder `ladder`, or exact."""

    name: str
    ladder: str | None = None


@dataclass
class Inputs:
    """The tensors and scalars of one launch. `outputs` names the tensors the kernel writes (poisoned before a run)."""

    tensors: dict[str, Tensor]
    scalars: dict[str, Any]
    outputs: tuple[str, ...]
    problem: dict[str, Any] = field(default_factory=dict)
    inplace: tuple[str, ...] = ()  # outputs that are also inputs (never poisoned; the oracle reads them first)

    def host(self) -> dict[str, np.ndarray]:
        """Every tensor as float64 values (integers as float64 too), for oracles."""
        return {name: t.float64() for name, t in self.tensors.items()}


@dataclass(frozen=True)
class Reference:
    """An oracle's answer for one output: the float64 reference and the magnitude its error is judged against."""

    value: np.ndarray
    scale: np.ndarray


Prune = Callable[[Sequence[Config], Mapping[str, Any], Any], "PruneResult"]


@dataclass(frozen=True)
class PruneResult:
    kept: tuple[Config, ...]
    pruned: tuple[tuple[Config, str], ...]  # each with the device fact that refused it


@dataclass(frozen=True)
class KernelSpec:
    """The whole description of one kernel. See the module docstring for the words used."""

    name: str
    family: str
    description: str
    kernels: tuple[Any, ...]  # the @triton.jit functions this spec launches
    problem_args: tuple[str, ...]  # every problem parameter the launch takes
    key_fields: tuple[KeyField, ...]
    dtype_args: tuple[str, ...]  # which tensors' dtypes enter the key, in order
    dtypes: tuple[tuple[str, ...], ...]  # the supported dtype tuples
    output_dtypes: Callable[[tuple[str, ...]], tuple[str, ...]]  # key dtypes -> the outputs' dtypes
    candidates: tuple[Config, ...]
    default: Config  # what the kernel runs untuned; always a candidate
    prune: Callable[[Sequence[Config], Mapping[str, Any], Any], PruneResult]
    make_inputs: Callable[[Mapping[str, Any], tuple[str, ...], int, str], Inputs]
    launch: Callable[[Config, Inputs], None]
    oracle: Callable[[Inputs], dict[str, Reference]]
    oracle_name: str
    problem_of: Callable[..., dict[str, Any]]  # the problem of a real launch's arguments (the runtime's key)
    no_bit_fields: tuple[str, ...] = ()  # config fields claimed to change no output bit (tests check the claim)
    deterministic: bool = True
    example_problems: tuple[dict[str, Any], ...] = ()  # small problems every test runs under the interpreter
    interpreter_dtypes: tuple[tuple[str, ...], ...] | None = None  # None: all `dtypes`
    # the untuned config for a problem where it is not `default` (a kernel shape only some problems take), or None
    default_for: Callable[[Mapping[str, Any]], Config] | None = None

    def __post_init__(self):
        problems = []
        if not self.name or not self.name.replace("_", "").isalnum() or self.name != self.name.lower():
            problems.append(f"name '{self.name}' must be lower-case letters, digits and underscores")
        if not self.kernels:
            problems.append("no @triton.jit kernel given")
        if not self.candidates:
            problems.append("empty candidate list")
        if len(set(self.candidates)) != len(self.candidates):
            problems.append("duplicate candidates")
        if self.default not in self.candidates:
            problems.append(f"default config {self.default.label()} is not among the candidates")
        for f in self.key_fields:
            if f.name not in self.problem_args:
                problems.append(f"key field '{f.name}' is not a problem argument {list(self.problem_args)}")
        if not self.dtypes:
            problems.append("no supported dtypes")
        for combo in self.dtypes:
            if len(combo) != len(self.dtype_args):
                problems.append(f"dtype tuple {combo} does not match dtype_args {self.dtype_args}")
                continue
            for name in combo:
                try:
                    get_dtype(name)
                except Exception as e:  # noqa: BLE001 - re-raised below as one refusal naming the spec
                    problems.append(str(e))
        for f in self.no_bit_fields:
            if not any(f in dict(c.kwargs) or f in ("num_warps", "num_stages") for c in self.candidates):
                problems.append(f"no-bit field '{f}' is not a config field of any candidate")
        if not problems:
            problems += _missing_tolerances(self)
        if problems:
            raise KernelSpecInvalid(f"kernel spec '{self.name}' is invalid: " + "; ".join(problems))

    def all_output_dtypes(self) -> tuple[str, ...]:
        seen: list[str] = []
        for combo in self.dtypes:
            for d in self.output_dtypes(combo):
                if d not in seen:
                    seen.append(d)
        return tuple(seen)

    def untuned(self, problem: Mapping[str, Any]) -> Config:
        """What the kernel runs untuned on `problem`: `default_for(problem)` where the spec has one, else `default`;
        always one of the candidates."""
        if self.default_for is None:
            return self.default
        made = self.default_for(problem)
        if made not in self.candidates:
            raise ValueError(f"kernel {self.name}: its untuned config {made.label()} is not among its candidates")
        return made

    def pruned_for(self, problem: Mapping[str, Any], profile) -> PruneResult:
        """The prune's verdict for one problem on one profile; a prune that keeps nothing is `PruneEmpty`."""
        result = self.prune(self.candidates, problem, profile)
        if not result.kept:
            reasons = sorted({r for _, r in result.pruned})
            raise PruneEmpty(
                f"kernel '{self.name}': the prune for {profile.key} kept no candidate for problem {dict(problem)} "
                f"(reasons: {'; '.join(reasons[:3])})"
            )
        return result

    def dtype_objects(self, combo: Sequence[str]) -> tuple[DType, ...]:
        return tuple(get_dtype(d) for d in combo)


def _missing_tolerances(spec: KernelSpec) -> list[str]:
    """Every output dtype needs a tolerance in the conformance profile (cpu/interpreter), which states them all."""
    from nbxcert.errors import DeviceFactMissing
    from nbxcert.profiles import get_profile

    profile = get_profile("cpu/interpreter")
    missing = []
    for d in spec.all_output_dtypes():
        try:
            profile.tolerance(d)
        except DeviceFactMissing:
            missing.append(f"output dtype {d} has no tolerance in {profile.path}")
    return missing


_REGISTRY: dict[str, KernelSpec] = {}
_lock = threading.Lock()


def register(spec: KernelSpec) -> KernelSpec:
    """Add a spec to the registry; a second spec with the same name is refused (`KernelSpecInvalid`)."""
    with _lock:
        if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
            raise KernelSpecInvalid(f"kernel spec name '{spec.name}' is already registered by another spec")
        _REGISTRY[spec.name] = spec
    return spec


def replace_registered(old: KernelSpec, new: KernelSpec) -> KernelSpec:
    """Put `new` in the registry in place of `old` (the same name: a spec made certifiable after its declaration,
    `Autotuned.certify_with`); `KernelSpecInvalid` when `old` is not the registered spec of that name."""
    with _lock:
        if new.name != old.name or _REGISTRY.get(old.name) is not old:
            raise KernelSpecInvalid(f"kernel spec '{old.name}' is not the registered spec of that name")
        _REGISTRY[new.name] = new
    return new


FAMILY_MODULES = ("matmul", "rows", "elementwise", "attention", "moe", "quant", "sampling", "vision", "pointwise")


def load_all() -> dict[str, KernelSpec]:
    """Import every kernel family module (which registers its specs) and return the registry."""
    import importlib

    from nbxcert.kernels.backends import select

    select()  # kernel modules decorate at import: the backend must be fixed first
    for module in FAMILY_MODULES:
        try:
            importlib.import_module(f"nbxcert.kernels.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"nbxcert.kernels.{module}":
                raise
    return dict(sorted(_REGISTRY.items()))


def get_spec(name: str) -> KernelSpec:
    specs = load_all()
    if name not in specs:
        raise KernelNotFound(f"no kernel named '{name}'; registered: {', '.join(specs) or 'none'}")
    return specs[name]


def unregister(name: str) -> None:
    """Remove a spec (tests use this for specs they create)."""
    with _lock:
        _REGISTRY.pop(name, None)


def choose_config(spec: KernelSpec, problem: Mapping[str, Any], dtypes, config: Config | None = None, **runtime):
    """The one place a user-facing launch picks its config: the caller's `config` when given, else the one the
    registered server gives for `problem` and `dtypes` (`nbxcert.kernels.server`; `import nbxcert` registers serving,
    which serves the certified config). `runtime` (run=, outputs=, restore=) lets serving sweep the launch's own
    arguments when no certificate covers it and certified-only mode is off. With no server registered, a launch with
    no config is refused (`ServerNotRegistered`)."""
    if config is not None:
        return config
    return server.config_for(spec, problem, dtypes, runtime or None)
