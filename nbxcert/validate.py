"""`nbxcert validate`: every problem of every file of a certificate directory, each kernel checked against its
spec (the scan itself is `dirscan`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nbxcert.dirscan import DirScan, load_specs, scan_dir


def validate(root: Path, modules: Sequence[str] = ()) -> DirScan:
    """`nbxcert validate`: every problem of every file under `root`, each kernel checked against its spec."""
    return scan_dir(root, load_specs(modules))
