"""nbxcert's kernel launcher (`launcher.c`): built once per machine and Python, then loaded from nbxcert's cache.

Triton compiles a C launcher for every kernel signature it meets (a C compiler run each, the first time a process
with an empty Triton cache launches that signature). nbxcert's launcher is one module for every signature: a kernel's
parameters are described by type codes (`launcher.c` lists them), so a kernel loaded from a bundle launches without
any compiler run after this module's one build. The build uses the C compiler Triton itself needs (`CC`, else `cc`,
`gcc` or `clang`), Python's headers and the `cuda.h` that Triton ships; its output is keyed by the source, the
Python and the header, and written atomically, so concurrent first builds are harmless.

`module()` gives the loaded extension, bound to the driver's cuLaunchKernelEx through `bind(address)`; a missing
compiler or header is `BackendUnavailable` naming what is missing.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Any

from nbxcert.errors import BackendUnavailable

SOURCE = Path(__file__).with_name("launcher.c")
MODULE_NAME = "_nbxcert_launcher"
_lock = threading.Lock()
_module: Any = None


def cache_root() -> Path:
    """Where built launchers live: `NBXCERT_CACHE_DIR`, else `$XDG_CACHE_HOME/nbxcert`, else `~/.cache/nbxcert`."""
    asked = os.environ.get("NBXCERT_CACHE_DIR")
    if asked:
        return Path(asked)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nbxcert"


def cuda_include() -> Path:
    """The folder holding the `cuda.h` Triton ships with its NVIDIA backend."""
    spec = importlib.util.find_spec("triton.backends.nvidia")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        include = Path(folder) / "include"
        if (include / "cuda.h").is_file():
            return include
    raise BackendUnavailable(
        "nbxcert's launcher needs the cuda.h that Triton's NVIDIA backend ships, and this Triton has none",
        hint="install a Triton with its NVIDIA backend (pip install triton)",
    )


def compiler() -> str:
    """The C compiler: `CC`, else the first of cc, gcc, clang on PATH."""
    asked = os.environ.get("CC")
    if asked:
        return asked
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise BackendUnavailable(
        "nbxcert's launcher needs a C compiler (as Triton's launchers do), and none is on PATH (cc, gcc, clang)",
        hint="install one (e.g. apt-get install gcc) or name it in CC",
    )


def built_path() -> Path:
    """Where this machine's build of the launcher is (or will be): keyed by the source, Python and cuda.h."""
    include = cuda_include()
    python_include = sysconfig.get_paths()["include"]
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), (include / "cuda.h").read_bytes(), python_include.encode()):
        digest.update(hashlib.sha256(part).digest())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_root() / "launcher" / digest.hexdigest()[:32] / f"{MODULE_NAME}{suffix}"


def build(path: Path | None = None) -> Path:
    """Compile the launcher to `path` (default `built_path()`) unless it is there; returns the path."""
    path = path or built_path()
    if path.is_file():
        return path
    include = cuda_include()
    python_include = sysconfig.get_paths()["include"]
    if not (Path(python_include) / "Python.h").is_file():
        raise BackendUnavailable(
            f"nbxcert's launcher needs Python's headers, and {python_include}/Python.h is missing",
            hint="install them (e.g. apt-get install python3-dev)",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    command = [compiler(), str(SOURCE), "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", tmp]
    command += [f"-I{python_include}", f"-I{include}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise BackendUnavailable(
                f"building nbxcert's launcher failed ({' '.join(command[:2])} ...): {last}",
                hint="check the C compiler and Python's headers; set NBXCERT_DEBUG=1 for the whole error",
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load(path: Path) -> Any:
    """The extension module at `path`, loaded."""
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, str(path), loader=loader)
    made = importlib.util.module_from_spec(spec)
    loader.exec_module(made)
    return made


def loaded() -> Any:
    """The launcher if this process has loaded it, else None (nothing is built or loaded here)."""
    return _module


def module(launch_ex_address: int, tensor_map_type: Any = None) -> Any:
    """The launcher, built if need be, loaded once per process and bound to the driver function at
    `launch_ex_address` (cuLaunchKernelEx) and Triton's tensor map type (None where there is none)."""
    global _module
    with _lock:
        if _module is None:
            _module = load(build())
        _module.bind(launch_ex_address, tensor_map_type)
        return _module
