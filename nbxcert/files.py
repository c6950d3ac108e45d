"""Writing a file so that a reader sees either the old bytes or the new, never a part: the one atomic write of
nbxcert (certificates, the compiled index, the run-time sweep cache); and asking the OS about a path someone else
named without an exception (`unreachable`, `is_dir`, `is_file`).

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
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise _naming(e, path) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: Path | str, text: str) -> None:
    """`Path.write_text` whose OSError names the file (a write that fails, on a full disk, raised one with no path),
    opened without waiting: a named pipe that nothing reads (`coverage --junit-xml fifo`) made it wait for ever, and
    is now an OSError (ENXIO); one with a reader (`--junit-xml /dev/stdout | tool`) is written as before."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o666)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise _naming(e, path) from None


def _naming(e: OSError, path: Path | str) -> OSError:
    """`e`, with `path` as its file when it names none (an error of a write or a flush names no file)."""
    if e.filename is not None or e.errno is None:
        return e
    return type(e)(e.errno, e.strerror, str(path))


def unreachable(path: Path | str) -> str | None:
    """Why the OS cannot say whether `path` exists (a directory on its way that cannot be searched, a name too long,
    a loop of links, a NUL byte), or None: it exists, or plainly does not. `Path.exists()`, `is_file()` and
    `is_dir()` raise PermissionError for a path under a directory that cannot be searched (Python 3.11)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:
        return "a NUL byte in the name"
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def is_dir(path: Path | str) -> bool:
    """`Path.is_dir()` that answers False where the OS cannot be asked (see `unreachable`)."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def is_file(path: Path | str) -> bool:
    """`Path.is_file()` that answers False where the OS cannot be asked (see `unreachable`)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False
