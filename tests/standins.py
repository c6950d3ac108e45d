"""Stand-ins for the CUDA driver, compiled here against the `cuda.h` Triton ships, for the tests of nbxcert's launcher
with no GPU (tests/kernels/backends/test_launcher.py, test_served_in_c.py)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from nbxcert.kernels.backends import launcher


def compile_stand_in(source: str, folder: Path) -> ctypes.CDLL:
    """`source` (C) built into a shared library in `folder` and loaded; the test skips where no C compiler is."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    (folder / "stand.c").write_text(source)
    so = folder / "stand.so"
    command = [compiler, "-O1", "-shared", "-fPIC", f"-I{launcher.cuda_include()}", str(folder / "stand.c"), "-o"]
    subprocess.run([*command, str(so)], check=True)
    return ctypes.CDLL(str(so))
