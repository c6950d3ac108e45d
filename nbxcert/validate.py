"""`nbxcert validate`: every problem of every file of a certificate directory, each kernel checked against its
spec (the scan itself is `dirscan`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nbxcert.dirscan import NO_CERTS_HINT, DirScan, load_specs, scan_dir
from nbxcert.errors import UsageError
from nbxcert.text import printable


def validate(root: Path, modules: Sequence[str] = ()) -> DirScan:
    """`nbxcert validate`: every problem of every file under `root`, each kernel checked against its spec. A
    directory with no certificate file and no problem is refused: it passed the CI gate ("0 files, 0 entries, 0
    problems", exit 0), as a path to the wrong directory would."""
    scan = scan_dir(root, load_specs(modules))
    if scan.files == 0 and not scan.problems:
        raise UsageError(f"{printable(root)} holds no certificate files: nothing to validate", hint=NO_CERTS_HINT)
    return scan
