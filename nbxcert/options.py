"""Checks of what a command was given, made before any work starts: directories to read, files and directories to
write, counts and durations, and the environment variables that name paths.

Each check returns the value to use, or raises `UsageError` naming the option (or variable), the value and what to
give instead, so the CLI turns it into one line on stderr and exit code 1. The checks of keys, key fields and kernel
names live with the keys (`nbxcert.keys.check_key`, `nbxcert.keyfile.gather_keys`).
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from nbxcert.errors import UsageError
from nbxcert.files import unreachable
from nbxcert.text import printable as shown  # a path in a message: control characters escaped, one line

MAX_JOBS = 1024  # far above any core count (`--jobs 99999999999999999999` set out to make that many workers)
MAX_TIMEOUT_S = 86_400.0  # a day, for one candidate (`--timeout nan` reached the pipe's wait, which raises ValueError)


def reachable(path: Path, what: str) -> Path:
    """`path` when the OS can say whether it exists. A path under a directory that cannot be searched made
    `Path.exists()` raise PermissionError: a traceback from `keys --keys`, `validate`, `diff`, `merge`, `stale`,
    `index` and `census` (`--workload locked/w.yml`), and `--dir locked/x` was said not to exist."""
    why = unreachable(path)
    if why is not None:
        raise UsageError(
            f"{what} {shown(path)} cannot be reached ({why})",
            hint="check the permissions of the directories on its way, or give another path",
        )
    return Path(path)


def existing_dirs(dirs: Sequence[Path] | None, option: str = "--dir") -> list[Path] | None:
    """`dirs` when each is a directory that can be read. Before this, `coverage --dir /nonexistent` counted every key
    as missing, as if the directory held no certificate, instead of saying it is not there."""
    if dirs is None:
        return None
    for d in dirs:
        d = reachable(Path(d), option)
        if not d.exists():
            raise UsageError(f"{option} {shown(d)}: no such directory", hint="give a certificate directory that exists")
        if not d.is_dir():
            raise UsageError(f"{option} {shown(d)} is not a directory", hint="give a certificate directory")
        if not os.access(d, os.R_OK | os.X_OK):
            raise UsageError(
                f"{option} {shown(d)} cannot be read (permission denied)", hint="give a directory you can read"
            )
    return [Path(d) for d in dirs]


def existing_file(path: Path, option: str, hint: str = "give a file that exists") -> Path:
    """`path` when it is a regular file (a directory, a pipe or a path that cannot be reached refused by name)."""
    path = reachable(Path(path), option)
    if not path.exists():
        raise UsageError(f"{option} {shown(path)}: no such file", hint=hint)
    if path.is_dir():
        raise UsageError(f"{option} {shown(path)}: is a directory", hint=hint)
    if not path.is_file():
        raise UsageError(f"{option} {shown(path)}: is not a regular file", hint=hint)
    return path


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def writable_dir(path: Path, option: str, write: bool = True) -> Path:
    """`path` when it is a directory, or one that can be made (its nearest existing parent is a directory), that can
    be written (unless `write` is False). Nothing is created here."""
    path = reachable(Path(path), option)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {shown(path)} exists and is not a directory", hint="give a directory")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise UsageError(f"{option} {shown(path)}: {shown(base)} is a file, not a directory", hint="give a directory")
    if write and not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(
            f"{option} {shown(path)}: {shown(base)} cannot be written (permission denied)",
            hint="give a directory you can write",
        )
    return path


def writable_file(path: Path, option: str, pipe_read: bool = False) -> Path:
    """`path` when a file can be written there: not a directory, in a directory that exists and can be written.
    `pipe_read`: a named pipe is accepted only while something reads it (`_reader_waiting`; asking closes the
    reader's stream once, as every write of a key record does)."""
    path = reachable(Path(path), option)
    if str(path) in ("", "."):  # Typer reads `--out ''` as Path(''), which is '.'
        raise UsageError(f"{option} {shown(path)} cannot name a file", hint="give the path of a file to write")
    if path.is_dir():
        raise UsageError(f"{option} {shown(path)} is a directory", hint="give the path of a file to write")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{option} {shown(path)}: directory {shown(parent)} does not exist", hint="create it first")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(
            f"{option} {shown(path)} cannot be written (permission denied)",
            hint="give a file in a directory you can write",
        )
    if pipe_read:
        _reader_waiting(path, option)
    return path


def _reader_waiting(path: Path, option: str) -> None:
    """A named pipe is a place to write only while something reads it: opening one with no reader for writing waits
    for ever (`NBXCERT_KEY_RECORD=fifo verify` hung). Asked without waiting."""
    try:
        is_fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return
    if not is_fifo:
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as e:
        if e.errno != errno.ENXIO:
            raise UsageError(
                f"{option} {shown(path)} cannot be opened ({e.strerror})", hint="give a regular file"
            ) from None
        raise UsageError(
            f"{option} {shown(path)} is a named pipe that nothing reads: writing to it would wait for ever",
            hint="give a regular file, or start the reader first",
        ) from None


def hf_config_alone(hf_config: Path | None, **others) -> Path | None:
    """`--hf-config`'s path when no other source of keys is given with it (`others`: each option's name, `_` for `-`,
    and its value). The config forms one workload; with --workload, --keys or --key as well, which keys were meant is
    not known, so the pair is refused rather than merged."""
    if hf_config is None:
        return None
    given = [f"--{name.replace('_', '-')}" for name, value in others.items() if value]
    if given:
        raise UsageError(
            f"--hf-config cannot be combined with {' or '.join(given)}: it forms the workload's keys itself",
            hint="give --hf-config alone, or leave it out",
        )
    return Path(hf_config)


def jobs(n: int | None, option: str = "--jobs") -> int | None:
    """A worker count: None (the default) or 1..MAX_JOBS. Before this, `--jobs 0` silently meant the CPU count and
    `--jobs -1` left certify with no runner at all."""
    if n is None:
        return None
    if not 1 <= n <= MAX_JOBS:
        raise UsageError(
            f"{option} {n}: give a count of worker processes from 1 to {MAX_JOBS}",
            hint=f"this machine has {os.cpu_count() or 1} CPUs; leave {option} out to use them all",
        )
    return n


def seconds(s: float | None, option: str = "--timeout") -> float | None:
    """A time limit: None (the default) or a finite number of seconds in (0, MAX_TIMEOUT_S]."""
    if s is None:
        return None
    if not (math.isfinite(s) and 0 < s <= MAX_TIMEOUT_S):
        raise UsageError(
            f"{option} {s} is not a time limit: give a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}",
            hint=f"e.g. {option} 600, or leave it out for the default",
        )
    return s


def fraction(x: float, option: str = "--min", example: str = "1.0 (every key) or 0.95") -> float:
    if not 0.0 <= x <= 1.0:  # NaN fails both comparisons
        raise UsageError(f"{option} {x} is not a fraction in [0, 1]", hint=f"e.g. {option} {example}")
    return x + 0.0  # -0.0 is 0.0 (`--min -0` printed "minimum -0.0%")


def check_environment(search_path: bool = True) -> None:
    """The NBXCERT_* variables that name paths, checked before a command reads or writes through them:
    NBXCERT_CERTIFIED_DIR (with `search_path`: the command reads serving's search path) must name directories,
    NBXCERT_CACHE_DIR a directory (or one that can be made), NBXCERT_KEY_RECORD a file that can be written. Serving
    itself skips a certificate directory that is not there (an application keeps running); a command asked to read
    it says so instead of counting every key as missing."""
    if search_path:
        for part in os.environ.get("NBXCERT_CERTIFIED_DIR", "").split(":"):
            if part.strip():
                existing_dirs([Path(part)], "NBXCERT_CERTIFIED_DIR names")
    cache = os.environ.get("NBXCERT_CACHE_DIR")
    if cache:
        writable_dir(Path(cache), "NBXCERT_CACHE_DIR", write=False)  # a read-only cache is served from memory
    record = os.environ.get("NBXCERT_KEY_RECORD")
    if record:
        writable_file(Path(record), "NBXCERT_KEY_RECORD", pipe_read=True)


def env_choice(name: str, choices: Sequence[str], default: str, what: str) -> str:
    """The value of the environment variable `name`, one of `choices` (`default` where it is unset or empty); any
    other value is a `UsageError` naming it (`what`: what a value names, as "a mode")."""
    value = os.environ.get(name, default).strip() or default
    if value not in choices:
        raise UsageError(
            f"{name}={value} is not {what}",
            hint=f"set it to one of {', '.join(choices)}, or unset it ({default})",
        )
    return value


def env_flag(name: str) -> bool:
    """The on/off environment variable `name`: `1` is on; `0`, empty or unset is off. Any other value is a
    `UsageError` naming it: `NBXCERT_CERTIFIED_ONLY=yes` (or `true`, `2`) was read as off, so an application meant to
    refuse every key with no certificate swept them at run time instead, and said nothing of it."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise UsageError(f"{name}={value} is neither 1 (on) nor 0 (off)", hint=f"set {name}=1 or {name}=0, or unset it")
    return value == "1"
