"""nbxcert: certify Triton kernel launch configurations per GPU class against float64 oracles, then serve them.

Importing `nbxcert` loads almost nothing (no numpy, no Triton, no CUDA): the engine's modules are imported where they
are used. It registers serving with the kernel layer (`nbxcert.kernels.server`): the kernel library asks whatever is
registered for a launch's config and never imports the engine, and what is registered here imports `nbxcert.serving`
on the first launch only. `nbxcert.autotune` is the drop-in for `triton.autotune` (`nbxcert.dropin`).
"""

from nbxcert._version import __version__
from nbxcert.kernels.server import set_server as _set_server

__all__ = ["__version__", "autotune"]


def autotune(
    configs,
    key,
    prune_configs_by=None,
    reset_to_zero=None,
    restore_value=None,
    pre_hook=None,
    post_hook=None,
    warmup=None,
    rep=None,
    use_cuda_graph=False,
    do_bench=None,
    cache_results=False,
    *,
    name=None,
    **spec_kwargs,
):
    """Like `triton.autotune` (its arguments, in its order), but launches serve certified configs; `name` and the
    certification keywords are nbxcert's own (see `nbxcert.dropin`)."""
    from nbxcert.dropin import autotune as _autotune

    return _autotune(
        configs,
        key,
        prune_configs_by,
        reset_to_zero,
        restore_value,
        pre_hook,
        post_hook,
        warmup,
        rep,
        use_cuda_graph,
        do_bench,
        cache_results,
        name=name,
        **spec_kwargs,
    )


def _serve_on_first_launch(spec, problem, dtypes, runtime):
    """The kernel layer's server until the first launch that needs one: serving's `config_for`, registered in this
    function's place (so later launches call it directly) and asked for this launch's config."""
    from nbxcert.serving import config_for

    _set_server(config_for)
    return config_for(spec, problem, dtypes, runtime)


_set_server(_serve_on_first_launch)
