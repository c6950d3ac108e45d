"""Where the kernel layer gets a served config from: a `Server` registered from above, never an engine import.

A launch given no config asks `config_for(spec, problem, dtypes, runtime)` (through `spec.choose_config`), whatever
function is registered now. `import nbxcert` registers one that loads `nbxcert.serving` on first use and then puts
serving's own `config_for` in its place; a test or an application can register another (`set_server`). With none
registered, a launch is refused (`ServerNotRegistered`).

The registered function is held in this module's global `config_for`, so the warm path of a launch is one attribute
read and one call (an import statement in every launch cost 0.4 us of the served path's host time). This module
imports nothing of nbxcert but `nbxcert.errors`, so registering a server loads no numpy, Triton or CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from nbxcert.errors import ServerNotRegistered


class Server(Protocol):
    """The config a launch of `spec` runs with, for its `problem` and key `dtypes`. `runtime` (run=, outputs=,
    restore=; None when the launch gave none) is what lets a server sweep the launch's own arguments."""

    def __call__(
        self, spec: Any, problem: Mapping[str, Any], dtypes: Sequence[str], runtime: Mapping[str, Any] | None
    ) -> Any: ...


def _no_server(spec, problem: Mapping[str, Any], dtypes: Sequence[str], runtime=None):
    raise ServerNotRegistered(
        f"kernel {spec.name}: no config was given for problem {dict(problem)} and no server is registered to serve one"
    )


config_for: Server = _no_server


def set_server(server: Server | None) -> Server | None:
    """Register `server` as what every launch given no config asks; None leaves none registered (launches are then
    refused by name). Returns the server registered before (None when there was none), for putting it back."""
    global config_for
    previous = config_for
    config_for = _no_server if server is None else server
    return None if previous is _no_server else previous


def registered() -> Server | None:
    """The server registered now (None when there is none)."""
    return None if config_for is _no_server else config_for
