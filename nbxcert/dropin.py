"""`nbxcert.autotune` (this module, `nbxcert.dropin`): a drop-in for `triton.autotune` serving certificates.

    @nbxcert.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4), ...], key=["n"])
    @triton.jit
    def my_scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr): ...

    my_scale[grid](x, out, n)

It takes `triton.autotune`'s whole signature, in Triton's order, and launches through nbxcert's serving path: the key
(the kernel's name, the `key` arguments' values, the dtypes of the tensor arguments) is looked up in the
certificates; with no certificate it is swept at run time on the launch's own arguments, or refused in certified-only
mode (`KeyNotCertified`). Give `make_inputs=`, `oracle=` and `grid=` too and the kernel becomes certifiable:
`nbxcert certify --spec mypkg.module --key ...` (the `KernelSpec` is `.spec`). What each of Triton's arguments means
here is `autotune`'s docstring; the decorated kernel keeps Triton's `configs`, `cache` and `best_config`.

A certificate records a candidate's parameters, never code: a `triton.Config`'s `maxnreg` becomes the config field
`maxnreg` (passed to the launch as `kernel[grid](..., maxnreg=N)`), and its `pre_hook` the config field `pre_hook`
holding the hook's name, so the hook's presence (and name) is part of the candidate's label and identity while the
hook itself is run, before each launch of that config, from the code that declared it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nbxcert import serving
from nbxcert.errors import KernelSpecInvalid, LaunchError, UsageError
from nbxcert.kernels.spec import Config, Inputs, KernelSpec, KeyField, PruneResult, register
from nbxcert.serving.notices import say_once

# Config fields nbxcert adds to a candidate for a triton.Config's attributes (they are launch options or code, not
# constexprs of the kernel, so they are taken out again at launch)
_MAXNREG, _PRE_HOOK = "maxnreg", "pre_hook"

SPEC_KEYWORDS = ("make_inputs", "oracle", "grid", "dtypes", "dtype_args", "buckets", "description", "oracle_name")
CERTIFY_KEYWORDS = ("make_inputs", "oracle", "grid")  # given together, or none of them
PRUNE_KEYWORDS = ("early_config_prune", "perf_model", "top_k")  # what Triton's Autotuner reads of prune_configs_by
# Triton's launch options a config sets: a launch that gives one too would be overridden by the config (Triton refuses
# it: "got multiple values")
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def default_name(fn) -> str:
    """The stable name of a kernel declared without `name=`: `module.qualname` of the decorated function, lower-cased,
    each character other than a-z, 0-9 and _ made _ (a key's kernel name allows no dots), with `k_` in front when it
    does not then start with a letter: `mypkg.kernels.add_kernel` is `mypkg_kernels_add_kernel`."""
    name = re.sub(r"[^a-z0-9_]", "_", f"{fn.__module__}.{fn.__qualname__}".lower())
    return name if name[:1].isalpha() else f"k_{name}"


def _hook_name(hook) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__qualname__


def _as_triton(c):
    """The user's config as a `triton.Config` (an nbxcert `Config` converted; a triton.Config is kept as given)."""
    if not isinstance(c, Config):
        return c
    import triton

    params = c.params
    if _PRE_HOOK in params:
        raise KernelSpecInvalid(
            f"config {c.label()}: an nbxcert Config cannot carry a pre_hook (a hook is code)",
            hint="give a triton.Config(..., pre_hook=fn) instead",
        )
    maxnreg = params.pop(_MAXNREG, None)
    return triton.Config(params, num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=maxnreg)


def candidate_of(c) -> Config:
    """A `triton.Config` as the nbxcert `Config` certificates record: its constexprs, warps and stages, plus `maxnreg`
    and the name of its `pre_hook` when it has them. What no certificate can carry is refused by name rather than
    served without it."""
    params = dict(c.kwargs)
    taken = [k for k in (_MAXNREG, _PRE_HOOK) if k in params]
    if taken:
        raise KernelSpecInvalid(f"config {c}: {taken} name Triton's config attributes, not constexprs of the kernel")
    if getattr(c, "num_ctas", 1) != 1:
        raise KernelSpecInvalid(f"config {c} uses num_ctas={c.num_ctas}; nbxcert certifies num_ctas=1 only")
    if getattr(c, "ir_override", None) is not None:
        raise KernelSpecInvalid(f"config {c} uses ir_override, which a certificate of the kernel's source cannot hold")
    if getattr(c, "maxnreg", None) is not None:
        params[_MAXNREG] = int(c.maxnreg)
    if getattr(c, "pre_hook", None) is not None:
        params[_PRE_HOOK] = _hook_name(c.pre_hook)
    return Config.make(num_warps=c.num_warps, num_stages=c.num_stages, **params)


def _dtype_name(t) -> str:
    """A tensor's dtype as keys write it, whatever library made the tensor: `float32` for nbxcert's, numpy's, CuPy's
    and JAX's `float32` and for torch's `torch.float32`."""
    return str(t.dtype).rsplit(".", 1)[-1]


def _takes_reset_only(hook) -> bool:
    try:
        params = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "reset_only" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _heuristic_names(fn) -> set[str]:
    """The meta-parameters `@triton.heuristics` under the autotuner computes (it passes them to the launch itself)."""
    names: set[str] = set()
    while fn is not None and not inspect.isfunction(fn):
        names.update(getattr(fn, "values", None) or ())
        fn = getattr(fn, "fn", None)
    return names


def _not_certifiable(name: str):
    def refuse(*_a, **_k):
        raise UsageError(
            f"kernel {name} was declared with nbxcert.autotune without make_inputs=/oracle=/grid=, so it can be "
            "served but not certified",
            hint="pass make_inputs=, oracle= and grid= to nbxcert.autotune to certify it",
        )

    return refuse


class Autotuned:
    """The decorated kernel: `kernel[grid](*args, **kwargs)` launches with the served config. Triton's attributes:
    `fn`, `base_fn`, `arg_names`, `keys`, `configs`, `cache`, `best_config`, `reset_to_zero`, `restore_value`,
    `pre_hook`, `post_hook`, `early_config_prune`, `perf_model`, `configs_top_k`, `num_warmups`, `num_reps`,
    `use_cuda_graph`, `do_bench`, `cache_results`; nbxcert's: `spec`, `grid`."""

    def __init__(self, fn, configs, key, name, triton_kwargs: Mapping[str, Any], spec_kwargs: dict[str, Any]):
        self.fn = fn
        self.base_fn = fn
        while not inspect.isfunction(self.base_fn):
            self.base_fn = self.base_fn.fn
        self.arg_names = list(inspect.signature(self.base_fn).parameters)
        named = name is not None
        name = name if named else default_name(self.base_fn)
        if isinstance(key, str):
            raise KernelSpecInvalid(
                f"nbxcert.autotune({name}): key={key!r} is a string; Triton's key is a list of argument names",
                hint=f"write key=[{key!r}]",
            )
        self.key = self.keys = list(key)
        self.reset_to_zero = list(triton_kwargs["reset_to_zero"] or ())
        self.restore_value = list(triton_kwargs["restore_value"] or ())
        dtype_args = tuple(spec_kwargs.get("dtype_args", ("*",)))
        for what, names in (
            ("key", self.key),
            ("reset_to_zero", self.reset_to_zero),
            ("restore_value", self.restore_value),
            ("dtype_args", () if dtype_args == ("*",) else dtype_args),
        ):
            missing = [k for k in names if k not in self.arg_names]
            if missing:
                raise KernelSpecInvalid(
                    f"nbxcert.autotune({name}): {what} arguments {missing} are not arguments of the kernel "
                    f"({', '.join(self.arg_names)})"
                )
        prune_by = triton_kwargs["prune_configs_by"] or {}
        unknown = [k for k in prune_by if k not in PRUNE_KEYWORDS] if isinstance(prune_by, Mapping) else None
        if unknown is None or unknown:
            raise KernelSpecInvalid(
                f"nbxcert.autotune({name}): prune_configs_by "
                + (f"keys {unknown} are not Triton's" if unknown else f"is a {type(prune_by).__name__}, not a dict"),
                hint=f"prune_configs_by is a dict of {', '.join(PRUNE_KEYWORDS)} (Triton's keys)",
            )
        given = [k for k in CERTIFY_KEYWORDS if spec_kwargs.get(k) is not None]
        if given and len(given) < len(CERTIFY_KEYWORDS):
            lacking = [k for k in CERTIFY_KEYWORDS if k not in given]
            raise KernelSpecInvalid(
                f"nbxcert.autotune({name}): {', '.join(given)} given without {', '.join(lacking)}; a kernel is "
                "certifiable with all three",
                hint=f"pass {'=, '.join(lacking)}= too (or none of make_inputs=, oracle=, grid= to serve it only)",
            )
        signature = inspect.signature(self.base_fn).parameters.values()
        self._defaults = {p.name: p.default for p in signature if p.default is not inspect.Parameter.empty}
        self._computed = _heuristic_names(fn)  # set by @triton.heuristics under this decorator
        self._checked: set[tuple] = set()  # the launch forms (positional count, keywords) already checked
        self.pre_hook, self.post_hook = triton_kwargs["pre_hook"], triton_kwargs["post_hook"]
        self._pre_hook_resets = self.pre_hook is not None and _takes_reset_only(self.pre_hook)
        self.prune_configs_by = dict(prune_by)
        self.early_config_prune = self.prune_configs_by.get("early_config_prune")
        self.perf_model = self.prune_configs_by.get("perf_model")
        self.configs_top_k = self.prune_configs_by.get("top_k", 1.0)
        self.num_warmups, self.num_reps = triton_kwargs["warmup"], triton_kwargs["rep"]
        self.use_cuda_graph, self.do_bench = triton_kwargs["use_cuda_graph"], triton_kwargs["do_bench"]
        self.cache_results = triton_kwargs["cache_results"]
        # what a run-time sweep says once it does not use (never a silent change of how candidates are judged)
        self._unused = [k for k in ("warmup", "rep", "use_cuda_graph", "do_bench") if triton_kwargs[k]]
        self._unused += [f"prune_configs_by['{k}']" for k in ("perf_model", "top_k") if k in self.prune_configs_by]

        if configs:
            self.configs = [_as_triton(c) for c in configs]
        else:  # Triton's own default for an empty list
            import triton

            self.configs = [triton.Config({}, num_warps=4, num_stages=3)]
        self.cache: dict[tuple, Any] = {}
        self.best_config = None
        # each candidate -> the user's triton.Config, and what a launch of it passes (constexprs, launch options)
        self._triton_of: dict[Config, Any] = {}
        self._plan: dict[Config, tuple[dict[str, Any], dict[str, Any]]] = {}
        for tc in self.configs:
            cand = candidate_of(tc)
            strays = [k for k in tc.kwargs if k not in self.arg_names]
            if strays:
                raise KernelSpecInvalid(
                    f"nbxcert.autotune({name}): config {cand.label()} sets {', '.join(strays)}, not arguments of "
                    f"the kernel ({', '.join(self.arg_names)})",
                    hint="a config's dict names the kernel's tl.constexpr arguments",
                )
            seen = self._triton_of.get(cand)
            if seen is not None and seen.pre_hook is not tc.pre_hook:
                raise KernelSpecInvalid(
                    f"nbxcert.autotune({name}): configs {cand.label()} differ only by pre_hooks of the same name",
                    hint="give the hooks names of their own (def ...): a certificate tells candidates apart by them",
                )
            if seen is None:
                self._triton_of[cand] = tc
                constexprs = {k: v for k, v in cand.kwargs if k not in (_MAXNREG, _PRE_HOOK)}
                options = {"num_warps": cand.num_warps, "num_stages": cand.num_stages}
                if _MAXNREG in dict(cand.kwargs):
                    options[_MAXNREG] = cand[_MAXNREG]
                self._plan[cand] = (constexprs, options)
        candidates = tuple(self._triton_of)

        grid = spec_kwargs.pop("grid", None)
        make_inputs = spec_kwargs.pop("make_inputs", None)
        oracle = spec_kwargs.pop("oracle", None)
        certifiable = make_inputs is not None and oracle is not None and grid is not None
        self.grid = grid
        self._certifiable = certifiable
        try:
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
        except KernelSpecInvalid as e:
            if named:
                raise
            raise KernelSpecInvalid(
                f"{e.message} (the name nbxcert.autotune gave {self.base_fn.__module__}.{self.base_fn.__qualname__})",
                hint="give the kernel a name of its own: nbxcert.autotune(..., name='my_kernel')",
            ) from None

    def certify_with(self, make_inputs, oracle, grid, dtypes=None, dtype_args=None, oracle_name=None) -> KernelSpec:
        """Make a kernel declared as `triton.autotune` users declare it (no `make_inputs=`/`oracle=`/`grid=`)
        certifiable, from a module of its own, so the kernel's file stays as Triton's tutorials write it:

            from mymodel.kernels import add_kernel      # @nbxcert.autotune(configs=..., key=["n_elements"])
            add_kernel.certify_with(make_inputs=..., oracle=..., grid=lambda meta: ...)

        and `nbxcert certify --spec mymodel.certify_add --key ...`. The spec keeps its name, key and candidates (its
        keys and certificates are the same); `dtypes`/`dtype_args` replace the declared ones when given."""
        import dataclasses

        from nbxcert.kernels.spec import replace_registered

        given = {"make_inputs": make_inputs, "oracle": oracle, "grid": grid}
        lacking = [k for k, v in given.items() if v is None]
        if lacking:
            raise KernelSpecInvalid(
                f"kernel {self.spec.name}: certify_with needs make_inputs, oracle and grid; {', '.join(lacking)} "
                "not given",
                hint=f"pass {'=, '.join(lacking)}= to certify_with",
            )
        missing = [k for k in dtype_args or () if k != "*" and k not in self.arg_names]
        if missing:
            raise KernelSpecInvalid(
                f"kernel {self.spec.name}: certify_with's dtype_args {missing} are not arguments of the kernel "
                f"({', '.join(self.arg_names)})"
            )
        self.grid = grid
        self._certifiable = True
        changes = {"make_inputs": make_inputs, "launch": self._launch_inputs, "oracle": oracle}
        changes["oracle_name"] = oracle_name or getattr(oracle, "__qualname__", "none")
        if dtypes is not None:
            changes["dtypes"] = tuple(tuple(d) for d in dtypes)
        if dtype_args is not None:
            changes["dtype_args"] = tuple(dtype_args)
        self.spec = replace_registered(self.spec, dataclasses.replace(self.spec, **changes))
        return self.spec

    # --- the spec's pieces ------------------------------------------------------------------------------------------
    def _prune(self, candidates: Sequence[Config], problem: Mapping[str, Any], profile) -> PruneResult:
        from nbxcert.kernels.prune import prune_with

        result = prune_with(candidates, profile)
        if self.early_config_prune is None:
            return result
        if not result.kept:
            return result
        # the user's own triton.Config objects, as Triton passes them; what comes back is matched by its fields
        try:
            chosen = self.early_config_prune([self._triton_of[c] for c in result.kept], dict(problem))
        except KeyError as e:
            arg = e.args[0] if e.args else None
            if arg not in self.arg_names or arg in problem:
                raise
            raise KernelSpecInvalid(
                f"kernel {self.spec.name}: early_config_prune read named_args[{arg!r}], but it is given the key "
                f"arguments only ({', '.join(problem)}): a certificate is made per key, so its prune can depend on "
                "nothing else",
                hint=f"prune by the key arguments, or add {arg!r} to key= if it is an integer or a word",
            ) from None
        keep = {c if isinstance(c, Config) else candidate_of(c) for c in chosen or ()}
        if not keep:
            raise KernelSpecInvalid(
                f"kernel {self.spec.name}: early_config_prune returned no config for {dict(problem)}",
                hint="return at least one of the configs it is given (as Triton requires)",
            )
        foreign = [c.label() for c in keep if c not in self._triton_of]
        if foreign:
            raise KernelSpecInvalid(
                f"kernel {self.spec.name}: early_config_prune returned {', '.join(sorted(foreign))} for "
                f"{dict(problem)}, none of the kernel's configs (certificates hold only those)",
                hint="return configs from the list it is given, or add them to configs=",
            )
        kept = tuple(c for c in result.kept if c in keep)
        dropped = tuple((c, "early_config_prune") for c in result.kept if c not in keep)
        return PruneResult(kept, result.pruned + dropped)

    def _launch_inputs(self, config: Config, inputs: Inputs) -> None:
        # a certification's check or timing run is a tuning run: the hooks and reset_to_zero apply (each check has
        # fresh inputs from make_inputs, so restore_value has nothing to restore)
        self._tuning_run(config, self.grid, {**inputs.tensors, **inputs.scalars}, {})

    def problem_of(self, *args, **kwargs) -> dict[str, Any]:
        bound = self._bind(args, kwargs)
        return {k: bound[k] if k in bound else self._defaults[k] for k in self.key}

    # --- launching ----------------------------------------------------------------------------------------------
    def _bind(self, args, kwargs) -> dict[str, Any]:
        bound = dict(zip(self.arg_names, args, strict=False))
        bound.update(kwargs)
        return bound

    def _launch(self, config: Config, grid, bound: Mapping[str, Any]) -> None:
        constexprs, options = self._plan[config]
        g = grid({**bound, **constexprs}) if callable(grid) else grid
        args = {k: v for k, v in bound.items() if k in self.arg_names and k not in constexprs}
        self.fn[g](**args, **constexprs, **options)

    def _reset(self, bound: Mapping[str, Any]) -> None:
        for name in self.reset_to_zero:
            t = bound.get(name)  # an argument left to its default is not there
            if t is None:
                continue
            if hasattr(t, "zero_"):  # torch's name; nbxcert's tensors have fill_ only
                t.zero_()
            elif hasattr(t, "fill_"):
                t.fill_(0)
            else:
                raise LaunchError(
                    f"kernel {self.spec.name}: reset_to_zero names argument {name!r}, which is not a tensor "
                    f"({type(t).__name__})",
                    hint="name only tensor arguments in reset_to_zero",
                )

    def _tuning_run(self, config: Config, grid, bound: dict[str, Any], saved: Mapping[str, Any]) -> None:
        """One candidate run while tuning, with Triton's hooks in Triton's order: the config's pre_hook, the reset
        (and restore), the kernel's pre_hook, the launch, the post_hook (given the exception of a failed run, which
        is raised again)."""
        tc = self._triton_of[config]
        # built only for a hook: on a GPU a sweep's timed repetitions go through here
        hooked = tc.pre_hook is not None or self.pre_hook is not None or self.post_hook is not None
        nargs = {**bound, **tc.all_kwargs()} if hooked else {}
        if tc.pre_hook is not None:
            tc.pre_hook(nargs)
        self._reset(bound)
        for name, value in saved.items():
            bound[name].copy_(value)
        if self.pre_hook is not None:
            self.pre_hook(nargs)
        try:
            self._launch(config, grid, bound)
        except Exception as e:
            if self.post_hook is not None:
                self.post_hook(nargs, exception=e)
            raise
        if self.post_hook is not None:
            self.post_hook(nargs, exception=None)

    def __getitem__(self, grid) -> Callable[..., None]:
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def _check_launch(self, args, kwargs) -> None:
        """Refuse, in one line, what Triton's autotuner refuses or nbxcert could only ignore: too many arguments, a
        keyword that is no argument of the kernel, a launch option or meta-parameter the configs set, a key argument
        not given, and a config that leaves a meta-parameter unset. Checked once per form of launch."""
        form = (len(args), tuple(kwargs))
        if form in self._checked:
            return
        name, names = self.spec.name, self.arg_names
        if len(args) > len(names):
            raise LaunchError(
                f"kernel {name}: the launch gives {len(args)} positional arguments; the kernel takes {len(names)} "
                f"({', '.join(names)})"
            )
        given = set(names[: len(args)])
        for k in kwargs:
            if k in given:
                raise LaunchError(f"kernel {name}: argument {k!r} is given twice, by position and by keyword")
            if k in LAUNCH_OPTIONS:
                raise LaunchError(
                    f"kernel {name}: the launch gives {k}={kwargs[k]!r}, which each config sets",
                    hint=f"remove {k}= from the launch; set it in the triton.Configs",
                )
            if k not in names:
                raise LaunchError(
                    f"kernel {name}: the launch gives {k}=, which is not an argument of the kernel "
                    f"({', '.join(names)})",
                    hint="pass the kernel's own arguments only (launch options come from each config)",
                )
        given.update(kwargs)
        for cand, (constexprs, _) in self._plan.items():
            both = sorted(given & set(constexprs))
            if both:
                raise LaunchError(
                    f"kernel {name}: the launch gives {', '.join(both)}, which config {cand.label()} sets too "
                    "(Triton refuses such conflicting meta-parameters)",
                    hint=f"remove {', '.join(both)} from the launch, or from the configs",
                )
        lacking = [k for k in self.key if k not in given and k not in self._defaults]
        if lacking:
            raise LaunchError(
                f"kernel {name}: the launch gives no key argument {', '.join(lacking)} (key={self.key})",
                hint="pass every key argument at the launch",
            )
        open_ = [p for p in names if p not in given and p not in self._defaults and p not in self._computed]
        nowhere = [p for p in open_ if not any(p in constexprs for constexprs, _ in self._plan.values())]
        if nowhere:
            raise LaunchError(
                f"kernel {name}: the launch gives no {', '.join(nowhere)}, and no config sets it",
                hint="pass it at the launch (a tl.constexpr may be set in every triton.Config instead)",
            )
        for cand, (constexprs, _) in self._plan.items():
            unset = [p for p in open_ if p not in constexprs]
            if unset:
                raise KernelSpecInvalid(
                    f"kernel {name}: config {cand.label()} sets no {', '.join(unset)}, which other configs set, "
                    "and the launch gives none",
                    hint=f"set {', '.join(unset)} in every triton.Config",
                )
        self._checked.add(form)

    def _key_dtypes(self, bound: Mapping[str, Any]) -> tuple[str, ...]:
        """The launch key's dtypes: those of `dtype_args` in their order (what `nbxcert certify --key` takes), or,
        declared with none, of every tensor argument in argument order."""
        names = self.spec.dtype_args
        if names == ("*",):
            tensors = [n for n in self.arg_names if n in bound and hasattr(bound[n], "data_ptr")]
            dtypes = tuple(_dtype_name(bound[n]) for n in tensors)
            lengths = {len(d) for d in self.spec.dtypes}
            if self._certifiable and len(dtypes) not in lengths:
                raise KernelSpecInvalid(
                    f"kernel {self.spec.name}: the launch has {len(dtypes)} tensor arguments ({', '.join(tensors)}) "
                    f"but the kernel's dtypes= list {'/'.join(str(n) for n in sorted(lengths))} per key, so no "
                    "certificate could serve it",
                    hint="give nbxcert.autotune dtype_args= (the tensors whose dtypes form the key) and dtypes= to "
                    "match",
                )
            return dtypes
        out = []
        for n in names:
            t = bound.get(n)
            if not hasattr(t, "dtype"):
                raise LaunchError(
                    f"kernel {self.spec.name}: dtype argument {n!r} is "
                    + ("not given" if t is None else f"not a tensor ({type(t).__name__})"),
                    hint=f"pass a tensor as {n}, or leave {n!r} out of dtype_args",
                )
            out.append(_dtype_name(t))
        return tuple(out)

    def warmup(self, *args, **kwargs) -> None:
        """Triton's `Autotuner.warmup` (compile every pruned config without launching): refused in one line."""
        raise LaunchError(
            f"kernel {self.spec.name}: warmup (compile without launching) is not taken by nbxcert.autotune",
            hint="launch the kernel, or compile its certified winners ahead with `nbxcert warm`",
        )

    def run(self, *args, grid, warmup=False, **kwargs) -> None:
        if warmup:
            self.warmup()
        self._check_launch(args, kwargs)
        bound = self._bind(args, kwargs)
        problem = {k: bound[k] if k in bound else self._defaults[k] for k in self.key}
        dtypes = self._key_dtypes(bound)
        swept: list[bool] = []  # set by the first candidate run: serving sweeps this key at run time
        saved: dict[str, Any] = {}

        def run_candidate(cfg: Config) -> None:
            if not swept:
                swept.append(True)
                if self._unused:
                    say_once(
                        f"[nbxcert] {self.spec.name}: {', '.join(self._unused)} given to nbxcert.autotune are not "
                        "used: every candidate the prune keeps is timed by nbxcert's own timer"
                    )
                # before any candidate has written them
                for n in self.restore_value:
                    t = bound.get(n)
                    if t is not None and not hasattr(t, "clone"):
                        raise LaunchError(
                            f"kernel {self.spec.name}: restore_value names argument {n!r}, which is not a "
                            f"tensor ({type(t).__name__})",
                            hint="name only tensor arguments in restore_value",
                        )
                    if t is not None:
                        saved[n] = t.clone()
            self._tuning_run(cfg, grid, bound, saved)

        runtime = serving.RuntimeLaunch(
            run=run_candidate,
            outputs=[bound[n] for n in self.restore_value + self.reset_to_zero if bound.get(n) is not None],
        )
        config = serving.config_for(self.spec, problem, dtypes, runtime)
        tc = self._triton_of.get(config)
        if tc is None:  # only the run-time cache is not checked against the candidates when read
            raise LaunchError(
                f"kernel {self.spec.name}: the config served for {problem}, {config.label()}, is not one of its "
                "configs (a run-time sweep cache written for an older candidate list)",
                hint="remove the run-time cache (runtime/ under NBXCERT_CACHE_DIR) or certify the key",
            )
        if swept:  # as Triton after benchmarking: reset (and restore) once more before the launch itself
            self._reset(bound)
            for name, value in saved.items():
                bound[name].copy_(value)
            if self._pre_hook_resets:
                self.pre_hook({**bound, **tc.all_kwargs()}, reset_only=True)
        if tc.pre_hook is not None:
            tc.pre_hook({**bound, **tc.all_kwargs()})
        self._launch(config, grid, bound)
        self.best_config = tc
        typed = tuple(str(v.dtype) for k, v in bound.items() if k in self.arg_names and hasattr(v, "dtype"))
        self.cache[tuple(bound[k] for k in self.key if k in bound) + typed] = tc  # Triton skips a key not given


def autotune(
    configs: Sequence[Any],
    key: Sequence[str],
    prune_configs_by: Mapping[str, Any] | None = None,
    reset_to_zero: Sequence[str] | None = None,
    restore_value: Sequence[str] | None = None,
    pre_hook: Callable | None = None,
    post_hook: Callable | None = None,
    warmup: int | None = None,
    rep: int | None = None,
    use_cuda_graph: bool = False,
    do_bench: Callable | None = None,
    cache_results: bool = False,
    *,
    name: str | None = None,
    **spec_kwargs,
):
    """The decorator: `triton.autotune`'s arguments, in its order, then nbxcert's, by keyword only. "Tuning" below is
    a run-time sweep, or a certification's checks and timings (Triton benchmarks where nbxcert tunes).

    - `configs`: the candidates (`triton.Config`, or nbxcert `Config`); an empty list is Triton's default config.
      `maxnreg` is passed to every launch of the config; a config's `pre_hook(nargs)` runs before every launch of it
      (tuning and served), as Triton runs it. `num_ctas` other than 1 and `ir_override` are refused by name.
    - `key`: Triton's meaning (a list of argument names); also the launch key's fields (integers or lower-case
      words); a key argument left to its default keys by the default. The key's dtypes are those of `dtype_args`, in
      their order (without `dtype_args`, every tensor argument's, in argument order).
    - `prune_configs_by`: `early_config_prune(configs, named_args)` gets the user's triton.Configs the device-file
      prune keeps, and `named_args` holds the key arguments only (a certificate is made per key, so a prune can
      depend on nothing else: reading another is refused by name); it must return at least one of the configs it is
      given. `perf_model` and `top_k` are not used: every kept candidate is timed; any other key is refused.
    - `reset_to_zero`: zeroed before every candidate run while tuning and once more before the launch that follows a
      run-time sweep; a launch served from a certificate or the run-time cache zeroes nothing (Triton's cached launch
      zeroes nothing either).
    - `restore_value`: put back to their values at the launch's start before every candidate run of a run-time sweep
      and before the launch that follows it (a certification's checks each get fresh inputs from `make_inputs`).
    - `pre_hook(nargs)`: before every candidate run while tuning, after the reset and restore (Triton's replaces its
      reset/restore hook; nbxcert keeps both: the run-time sweep compares the candidates' outputs). After a run-time
      sweep it is called once more as `pre_hook(nargs, reset_only=True)`, as Triton does, if it takes `reset_only`.
      `nargs`: the arguments by name and the config's `all_kwargs()`. Not run around a served launch (nor is Triton's
      around a cached one).
    - `post_hook(nargs, exception)`: after every candidate run while tuning; `exception` is what a failed run raised
      (raised again after the hook: the candidate is refused, with its reason).
    - `warmup`, `rep`, `use_cuda_graph`, `do_bench`: not used. Candidates are timed by nbxcert's own timer (CUDA
      events with the sweep's repetition rules; one launch's CPU time under the interpreter), so every certificate's
      timings mean the same thing. Recorded on the kernel (`num_warmups`, `num_reps`, `use_cuda_graph`, `do_bench`);
      a run-time sweep says once that they are not used.
    - `cache_results`: recorded. nbxcert's caches are always on: the certificates, and the run-time sweep cache
      (under `NBXCERT_CACHE_DIR`).
    - `name`: the stable name keys and certificates use; by default `default_name(fn)` (`module.qualname`, dots made
      underscores). Optional `make_inputs`, `oracle`, `grid`, `dtypes`, `dtype_args`, `buckets` ({key arg: ladder
      name}) make the kernel certifiable.

    A launch takes the kernel's arguments; a meta-parameter a config sets, a launch option (`LAUNCH_OPTIONS`), a
    keyword the kernel does not take, too many arguments, a config leaving a meta-parameter unset and `warmup=True`
    are refused in one line (`_check_launch`), where nbxcert could otherwise only drop them.

    The kernel's `cache` maps Triton's tuning key (the key arguments' values, then the dtypes of the arguments that
    have one) to the triton.Config launched. It is there to be read: serving's lookup decides the config, so an entry
    put there by hand is not served (Triton's would be)."""
    unknown = set(spec_kwargs) - set(SPEC_KEYWORDS)
    if unknown:
        raise KernelSpecInvalid(f"nbxcert.autotune({name or ''}): unknown arguments {sorted(unknown)}")
    triton_kwargs = {
        "prune_configs_by": prune_configs_by,
        "reset_to_zero": reset_to_zero,
        "restore_value": restore_value,
        "pre_hook": pre_hook,
        "post_hook": post_hook,
        "warmup": warmup,
        "rep": rep,
        "use_cuda_graph": use_cuda_graph,
        "do_bench": do_bench,
        "cache_results": cache_results,
    }

    def decorate(fn) -> Autotuned:
        return Autotuned(fn, configs, key, name, triton_kwargs, dict(spec_kwargs))

    return decorate
