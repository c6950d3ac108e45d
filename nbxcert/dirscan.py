"""The untrusted read of a certificate directory, shared by `validate`, `show`, `diff` and `merge`.

A certificate directory is laid out `<root>/<vendor>/<profile>/<kernel>.<dtype>.json` (see `certificates`). Its
contents are untrusted: a file may be huge, deeply nested, hold NaN, name kernels with path separators, carry configs
of 2**30 or strings where numbers belong, or be a link that leaves the directory. `scan_dir` reads such a directory
without following links out of it, without reading anything but regular files, and without ever raising on what it
reads: each problem becomes a `Problem` (file, key, field, reason) and the scan goes on with the next entry and the
next file. `diff`, `show` and `merge` read through the same scan and refuse a directory that has problems.
"""

from __future__ import annotations

import importlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nbxcert import certificates
from nbxcert.errors import CertificateInvalid, DeviceFactMissing, KeyParseError, UsageError
from nbxcert.keys import check_key, parse_key
from nbxcert.text import printable

NO_CERTS_HINT = "name the directory certify wrote (its --out), which holds <vendor>/<profile>/<kernel>.<dtype>.json"

_IGNORED_DIRS = ("__pycache__",)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a certificate directory: the file, the key and field when known, and why."""

    file: str
    key: str | None
    field: str | None
    reason: str

    def line(self) -> str:
        where = (
            self.file + (f": key {self.key}" if self.key else "") + (f": field '{self.field}'" if self.field else "")
        )
        return printable(f"{where}: {self.reason}")

    def as_dict(self) -> dict[str, str | None]:
        return {"file": self.file, "key": self.key, "field": self.field, "reason": self.reason}


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _problem_of(e: CertificateInvalid, path: Path) -> Problem:
    # `certificates.invalid` attaches the parts of its message; any other CertificateInvalid is one reason for the file.
    if hasattr(e, "reason"):
        return Problem(str(path), e.key, e.field or None, e.reason)
    return Problem(str(path), None, None, e.message)


@dataclass(frozen=True)
class Found:
    """One valid certification as found on disk."""

    root: Path
    path: Path
    profile: str
    kernel: str
    dtype: str
    key: str
    entry: dict[str, Any]


@dataclass
class DirScan:
    """What `scan_dir` found: counts, every problem, and every valid certification by (profile, file name, key)."""

    root: Path
    files: int = 0
    entries: int = 0
    problems: list[Problem] = field(default_factory=list)
    found: dict[tuple[str, str, str], Found] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        return f"{_n(self.files, 'file')}, {_n(self.entries, 'entry', 'entries')}, {_n(len(self.problems), 'problem')}"

    def require_ok(self) -> DirScan:
        """This scan, or `CertificateInvalid` naming its first problem and how many there are."""
        if self.problems:
            raise CertificateInvalid(
                f"{printable(self.root)} has {len(self.problems)} problem(s); the first: {self.problems[0].line()}",
                hint=f"run `nbxcert validate {printable(self.root)}` to list every problem",
            )
        return self


def _walk(root: Path, real_root: Path, problems: list[Problem]):
    """Every `*.json` under `root` as (path, parts relative to root), sorted; no recursion, no link followed out of
    `root`, nothing but regular files yielded. Links to directories are not followed (their target, if inside `root`,
    is scanned as itself)."""
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError as e:
            problems.append(Problem(str(directory), None, None, f"cannot be listed: {e.strerror}"))
            continue
        subdirs = []
        for item in items:
            path = Path(item.path)
            if item.is_symlink():
                try:
                    target = path.resolve(strict=True)
                except (OSError, RuntimeError):
                    if item.name.endswith(".json"):
                        problems.append(Problem(str(path), None, None, "is a link that cannot be resolved"))
                    continue
                if target != real_root and real_root not in target.parents:
                    problems.append(Problem(str(path), None, None, "is a link that points outside the directory"))
                    continue
                if target.is_dir() or not item.name.endswith(".json"):
                    continue
            elif item.is_dir(follow_symlinks=False):
                if not item.name.startswith(".") and item.name not in _IGNORED_DIRS:
                    subdirs.append(path)
                continue
            elif not item.name.endswith(".json"):
                continue
            try:
                regular = stat.S_ISREG(os.stat(path).st_mode)
            except OSError as e:
                problems.append(Problem(str(path), None, None, f"cannot be read: {e.strerror}"))
                continue
            if not regular:
                problems.append(Problem(str(path), None, None, "is not a regular file"))
                continue
            yield path, path.relative_to(root).parts
        stack.extend(reversed(subdirs))


def read_doc(path: Path) -> Any:
    """A certificate file's JSON (`certificates.read_json`); a file that cannot be opened is `CertificateInvalid`."""
    try:
        return certificates.read_json(path)
    except OSError as e:  # e.g. permission denied: read_json only turns a failed stat into CertificateInvalid
        raise CertificateInvalid(f"{path}: cannot be read: {e.strerror}") from None


def each_class(found: Found) -> list[Found]:
    """A certification's entry of each memory class, as a `Found` of its own (its `entry["memory_class"]` names it):
    a key keeps one entry a class (an H100's beside an H200's)."""
    return [replace(found, entry=entry) for entry in certificates.class_entries(found.entry).values()]


def load_specs(modules: Sequence[str] = ()) -> dict[str, Any]:
    """Every registered kernel spec, after importing `modules` (a user's own specs; `module[:anything]` accepted)."""
    from nbxcert.errors import NbxcertError

    if modules:  # the backend first, as a kernel module's own decoration needs it (a user's module imports Triton)
        from nbxcert.kernels.backends import select

        select()
    for m in modules:
        name = m.split(":")[0]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", name):
            # import_module('') raised ValueError and import_module('.x') TypeError: tracebacks
            raise UsageError(f"--spec {name!r} is not a module name", hint="give a dotted module name: mypkg.kernels")
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UsageError(f"--spec {name}: cannot import it ({e})", hint="put the module on PYTHONPATH") from None
        except NbxcertError:  # a spec that refuses itself says why
            raise
        except Exception as e:  # noqa: BLE001 - the user's module failed while importing: one line, not our traceback
            if os.environ.get("NBXCERT_DEBUG") == "1":
                raise
            raise UsageError(
                f"--spec {name}: importing it raised {type(e).__name__}: {e}",
                hint="fix the module (NBXCERT_DEBUG=1 shows the traceback)",
            ) from None
    from nbxcert.kernels.spec import load_all

    return load_all()


def _key_against_spec(path: Path, key_text: str, dtype: str, spec, profile) -> Problem | None:
    """A key the kernel would never form (`keys.check_key`: other key fields, dtypes it does not take, a size that is
    not on the profile's ladder), or one in the wrong output file. The same check `certify` makes of its keys before
    it starts, so it never writes an entry this refuses."""
    try:
        key = parse_key(key_text)
    except (KeyParseError, ValueError):  # the entry's own check reports the key that does not parse
        return None
    try:
        check_key(spec, key, profile)
    except (KeyParseError, DeviceFactMissing) as e:
        return Problem(str(path), key_text, None, e.message)
    out = spec.output_dtypes(key.dtypes)[0]
    if out != dtype:
        return Problem(str(path), key_text, None, f"its output dtype is {out}: it belongs in {spec.name}.{out}.json")
    return None


def scan_dir(root: Path, specs: Mapping[str, Any] | None = None) -> DirScan:
    """Read every certificate file under `root` and list every problem; never raises on what the files hold.

    With `specs` (kernel name -> KernelSpec), each file's kernel must be registered and each config one its kernel
    takes; without, only the schema is checked."""
    from nbxcert.options import reachable
    from nbxcert.profiles import all_profiles

    root = reachable(Path(root), "certificate directory")
    if not root.is_dir():
        raise UsageError(
            f"{printable(root)} is not a directory", hint="give a certificate directory (<vendor>/<profile>/)"
        )
    profiles = {p.key: p for p in all_profiles()}
    scan = DirScan(root)
    for path, parts in _walk(root, root.resolve(), scan.problems):
        scan.files += 1
        _scan_file(scan, path, parts, profiles, specs)
    return scan


def _scan_file(scan: DirScan, path: Path, parts: tuple[str, ...], profiles: dict, specs) -> None:
    problems = scan.problems
    dir_profile = None
    if len(parts) != 3:
        problems.append(Problem(str(path), None, None, "is not at <vendor>/<profile>/<kernel>.<dtype>.json"))
    elif f"{parts[0]}/{parts[1]}" not in profiles:
        known = ", ".join(profiles)
        problems.append(
            Problem(str(path), None, None, f"directory {parts[0]}/{parts[1]} is not a known profile ({known})")
        )
    else:
        dir_profile = f"{parts[0]}/{parts[1]}"
    try:
        doc = read_doc(path)
    except CertificateInvalid as e:
        problems.append(_problem_of(e, path))
        return
    entries = doc.get("entries") if isinstance(doc, dict) else None
    head_ok = True
    try:
        certificates.validate_doc(path, {**doc, "entries": {}} if isinstance(entries, dict) else doc)
    except CertificateInvalid as e:
        problems.append(_problem_of(e, path))
        head_ok = False
    doc_profile = doc.get("profile") if isinstance(doc, dict) else None
    if isinstance(doc_profile, str):
        if doc_profile not in profiles:
            problems.append(Problem(str(path), None, "profile", f"'{doc_profile}' is not a known profile"))
            head_ok = False
        elif dir_profile is not None and doc_profile != dir_profile:
            reason = f"'{doc_profile}' disagrees with its directory '{dir_profile}'"
            problems.append(Problem(str(path), None, "profile", reason))
            head_ok = False
    m = re.fullmatch(r"([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\.json", path.name)
    if not isinstance(entries, dict) or not m:
        return  # the file name or the entries' container is already reported; nothing to check entries against
    kernel, dtype = m.groups()
    spec = None
    if specs is not None:
        spec = specs.get(kernel)
        if spec is None:
            registered = ", ".join(specs) or "none"
            # the next step was missing: a certificate made with `certify --spec M` is validated with `--spec M`
            reason = f"unknown kernel '{kernel}' (registered: {registered}); a kernel of your own: give --spec MODULE"
            problems.append(Problem(str(path), None, "kernel", reason))
            head_ok = False
    profile = profiles.get(dir_profile) if dir_profile else None
    for key_text, entry in entries.items():
        scan.entries += 1
        p = None
        if spec is not None:
            p = _key_against_spec(path, key_text, dtype, spec, profile)
            if p is not None:
                problems.append(p)
        try:
            certificates.validate_entry(path, key_text, entry, kernel, dtype, spec)
        except CertificateInvalid as e:
            problems.append(_problem_of(e, path))
            continue
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
            # a checker that met input it did not expect (a key whose "digits" int() refuses): a problem, not a crash
            problems.append(Problem(str(path), key_text, None, f"refused: {type(e).__name__}: {str(e)[:200]}"))
            continue
        if head_ok and dir_profile is not None and p is None:
            scan.found[(dir_profile, path.name, key_text)] = Found(
                scan.root, path, dir_profile, kernel, dtype, key_text, entry
            )
