"""Serving: the run-time lookup every kernel launch of nbxcert goes through, one job per module.

- `lookup`: the state (profile in force, search path, index, run-time cache), `config_for`, `configure`, `reset` and
  key recording (`NBXCERT_KEY_RECORD`);
- `provenance`: where a certification was made, compared with this machine (`Machine`, `provenance_differences`,
  the check that serves it with a notice or refuses it under `NBXCERT_STRICT_PROVENANCE=1`);
- `runtime_sweep`: a key with no certificate swept on the launch's own arguments, and its timing (on a miss only);
- `bundles`: the bundle file format and its checked reading, and the bundles of compiled winners on the search path,
  registered with the kernel layer so launches load them instead of compiling (imported on a GPU profile only);
- `notices`: what serving says once per process.

The kernel layer reaches `config_for` through the server `import nbxcert` registers (`nbxcert.kernels.server`), never
by importing this package. Importing it loads no sweep, no CLI and no oracle: the run-time sweep module imports the
sweep's winner choice and the runner's timing when it runs, not when imported.
"""

from nbxcert.serving.lookup import (
    UNCERTIFIED_MODES,
    ServingState,
    certified_config,
    config_for,
    configure,
    configured,
    profile_in_force,
    reset,
    search_path,
    state,
    uncertified_mode,
)
from nbxcert.serving.provenance import (
    Machine,
    check_provenance,
    major_version,
    nvidia_driver_version,
    provenance_differences,
    provenance_profile,
    this_machine,
)
from nbxcert.serving.runtime_sweep import RuntimeLaunch, sweep_at_run_time

__all__ = [
    "UNCERTIFIED_MODES",
    "Machine",
    "RuntimeLaunch",
    "ServingState",
    "certified_config",
    "check_provenance",
    "config_for",
    "configure",
    "configured",
    "major_version",
    "nvidia_driver_version",
    "profile_in_force",
    "provenance_differences",
    "provenance_profile",
    "reset",
    "search_path",
    "state",
    "sweep_at_run_time",
    "this_machine",
    "uncertified_mode",
]
