"""`nbxcert.autotune` (this module, `nbxcert.dropin`): a drop-in for `triton.autotune` serving certificates.

    @nbxcert.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), ...], key=["n"], name="my_scale")
    @triton.jit
    def my_scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr): ...

    my_scale[grid](x, out, n)

It accepts what `triton.autotune` accepts (`configs`, `key`, `prune_configs_by`, `reset_to_zero`, `restore_value`)
and launches through nbxcert's serving path: the key (`name`, the `key` arguments' values, the dtypes of the tensor
arguments) is looked up in the certificates; with no certificate it is swept at run time on the launch's own
arguments, or refused in certified-only mode (`KeyNotCertified`). Give `make_inputs=`, `oracle=` and `grid=` too and
the kernel becomes certifiable: `nbxcert certify --spec mypkg.module --key ...` (the `KernelSpec` is `.spec`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nbxcert import serving
from nbxcert.errors import KernelSpecInvalid, UsageError
from nbxcert.kernels.spec import Config, Inputs, KernelSpec, KeyField, PruneResult, register


def _from_triton(c) -> Config:
    """A `triton.Config` (or an nbxcert `Config`) as an nbxcert `Config`. Hooks and register caps are not carried
    into certificates, so a config that uses them is refused by name rather than served without them."""
    if isinstance(c, Config):
        return c
    if getattr(c, "pre_hook", None) is not None or getattr(c, "maxnreg", None) is not None:
        raise KernelSpecInvalid(f"config {c} uses pre_hook/maxnreg, which certificates cannot carry")
    if getattr(c, "num_ctas", 1) != 1:
        raise KernelSpecInvalid(f"config {c} uses num_ctas={c.num_ctas}; nbxcert certifies num_ctas=1 only")
    return Config.make(num_warps=c.num_warps, num_stages=c.num_stages, **dict(c.kwargs))


def _not_certifiable(name: str):
    def refuse(*_a, **_k):
        raise UsageError(
            f"kernel {name} was declared with nbxcert.autotune without make_inputs=/oracle=/grid=, so it can be "
            "served but not certified",
            hint="pass make_inputs=, oracle= and grid= to nbxcert.autotune to certify it",
        )

    return refuse


class Autotuned:
    """The decorated kernel: `kernel[grid](*args, **kwargs)` launches with the served config."""

    def __init__(self, fn, configs, key, name, prune_configs_by, reset_to_zero, restore_value, spec_kwargs):
        self.fn = fn
        self.arg_names = list(inspect.signature(fn.fn if hasattr(fn, "fn") else fn).parameters)
        missing = [k for k in key if k not in self.arg_names]
        if missing:
            raise KernelSpecInvalid(
                f"nbxcert.autotune({name}): key arguments {missing} are not arguments of the kernel"
            )
        self.key = list(key)
        self.reset_to_zero = list(reset_to_zero or ())
        self.restore_value = list(restore_value or ())
        self.prune_configs_by = prune_configs_by or {}
        candidates = tuple(dict.fromkeys(_from_triton(c) for c in configs))
        grid = spec_kwargs.pop("grid", None)
        make_inputs = spec_kwargs.pop("make_inputs", None)
        oracle = spec_kwargs.pop("oracle", None)
        certifiable = make_inputs is not None and oracle is not None and grid is not None
        self.grid = grid
        self.spec = register(
            KernelSpec(
                name=name,
                family="user",
                description=spec_kwargs.pop("description", f"user kernel {name} (nbxcert.autotune)"),
                kernels=(fn,),
                problem_args=tuple(self.key),
                key_fields=tuple(KeyField(k, spec_kwargs.get("buckets", {}).get(k)) for k in self.key),
                dtype_args=tuple(spec_kwargs.pop("dtype_args", ("*",))),
                dtypes=tuple(tuple(d) for d in spec_kwargs.pop("dtypes", (("float32",),))),
                output_dtypes=lambda d: (d[0],),
                candidates=candidates,
                default=candidates[0],
                prune=self._prune,
                make_inputs=make_inputs if certifiable else _not_certifiable(name),
                launch=self._launch_inputs if certifiable else _not_certifiable(name),
                oracle=oracle if certifiable else _not_certifiable(name),
                oracle_name=spec_kwargs.pop("oracle_name", getattr(oracle, "__qualname__", "none")),
                problem_of=self.problem_of,
            )
        )

    # --- the spec's pieces ------------------------------------------------------------------------------------------
    def _prune(self, candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
        from nbxcert.kernels.prune import prune_with

        result = prune_with(candidates, profile)
        early = self.prune_configs_by.get("early_config_prune")
        if early is None:
            return result
        import triton

        as_triton = {triton.Config(c.params, num_warps=c.num_warps, num_stages=c.num_stages): c for c in result.kept}
        chosen = early(list(as_triton), dict(problem))
        keep = {as_triton[c] for c in chosen if c in as_triton}
        kept = tuple(c for c in result.kept if c in keep)
        dropped = tuple((c, "early_config_prune") for c in result.kept if c not in keep)
        return PruneResult(kept, result.pruned + dropped)

    def _launch_inputs(self, config: Config, inputs: Inputs) -> None:
        args = {**inputs.tensors, **inputs.scalars}
        self._launch(config, self.grid, args)

    def problem_of(self, *args, **kwargs) -> dict[str, Any]:
        bound = self._bind(args, kwargs)
        return {k: bound[k] for k in self.key}

    # --- launching ----------------------------------------------------------------------------------------------
    def _bind(self, args, kwargs) -> dict[str, Any]:
        bound = dict(zip(self.arg_names, args, strict=False))
        bound.update(kwargs)
        return bound

    def _launch(self, config: Config, grid, bound: Mapping[str, Any]) -> None:
        g = grid({**bound, **config.params}) if callable(grid) else grid
        args = {k: v for k, v in bound.items() if k in self.arg_names and k not in config.params}
        self.fn[g](**args, **config.params, num_warps=config.num_warps, num_stages=config.num_stages)

    def __getitem__(self, grid) -> Callable[..., None]:
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def run(self, *args, grid, **kwargs) -> None:
        bound = self._bind(args, kwargs)
        problem = {k: bound[k] for k in self.key}
        tensors = [bound[n] for n in self.arg_names if n in bound and hasattr(bound[n], "data_ptr")]
        dtypes = tuple(str(t.dtype) for t in tensors)

        def run_candidate(cfg: Config) -> None:
            for name in self.reset_to_zero:
                bound[name].fill_(0)
            self._launch(cfg, grid, bound)

        runtime = serving.RuntimeLaunch(
            run=run_candidate,
            outputs=[bound[n] for n in self.restore_value + self.reset_to_zero],
            restore=[bound[n] for n in self.restore_value],
        )
        config = serving.config_for(self.spec, problem, dtypes, runtime)
        for name in self.reset_to_zero:
            bound[name].fill_(0)
        self._launch(config, grid, bound)


def autotune(
    configs: Sequence[Any],
    key: Sequence[str],
    name: str,
    prune_configs_by: Mapping[str, Callable] | None = None,
    reset_to_zero: Sequence[str] | None = None,
    restore_value: Sequence[str] | None = None,
    **spec_kwargs,
):
    """The decorator (see the module docstring). `name` is the stable name certificates use. Optional `make_inputs`,
    `oracle`, `grid`, `dtypes`, `dtype_args`, `buckets` ({key arg: ladder name}) make it certifiable."""
    if not configs:
        raise KernelSpecInvalid(f"nbxcert.autotune({name}): empty configs list")
    unknown = set(spec_kwargs) - {
        "make_inputs",
        "oracle",
        "grid",
        "dtypes",
        "dtype_args",
        "buckets",
        "description",
        "oracle_name",
    }
    if unknown:
        raise KernelSpecInvalid(f"nbxcert.autotune({name}): unknown arguments {sorted(unknown)}")

    def decorate(fn) -> Autotuned:
        return Autotuned(fn, configs, key, name, prune_configs_by, reset_to_zero, restore_value, dict(spec_kwargs))

    return decorate
