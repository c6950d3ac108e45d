"""nbxcert: certify Triton kernel launch configurations per GPU class against float64 oracles, then serve them.

Importing `nbxcert` loads almost nothing (no Triton, no CUDA): the engine's modules are imported where they are used.
`nbxcert.autotune` is the drop-in for `triton.autotune` (`nbxcert.dropin`).
"""

from nbxcert._version import __version__

__all__ = ["__version__", "autotune"]


def autotune(configs, key, name, prune_configs_by=None, reset_to_zero=None, restore_value=None, **spec_kwargs):
    """Like `triton.autotune`, but launches serve certified configs (see `nbxcert.dropin`)."""
    from nbxcert.dropin import autotune as _autotune

    return _autotune(configs, key, name, prune_configs_by, reset_to_zero, restore_value, **spec_kwargs)
