"""Writing a file so that a reader sees either the old bytes or the new, never a part: the one atomic write of
nbxcert (certificates, the compiled index, the run-time sweep cache).

The bytes go to a temporary file beside the target, are flushed to the disk, and the temporary file replaces the
target (`os.replace`, atomic on POSIX within a file system). A writer killed before the replace leaves a temporary
file named `.<name>.*.tmp` (`certificates.remove_stale_temps` sweeps those), never a torn target.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path | str, data: str | bytes, make_parents: bool = False) -> None:
    """Replace `path` with `data` (text as UTF-8) atomically; the file is readable by all (0o644), as a source file
    is, since mkstemp makes it private. `make_parents`: create the directories on its way first."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
