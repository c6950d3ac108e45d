"""Tools over certificate directories: `validate` (every problem of every file), `show` (one key's certification),
`diff` (what changed between two directories) and `merge` (shard directories into one).

A certificate directory is laid out `<root>/<vendor>/<profile>/<kernel>.<dtype>.json` (see `certificates`). Its
contents are untrusted: a file may be huge, deeply nested, hold NaN, name kernels with path separators, carry configs
of 2**30 or strings where numbers belong, or be a link that leaves the directory. `scan_dir` reads such a directory
without following links out of it, without reading anything but regular files, and without ever raising on what it
reads: each problem becomes a `Problem` (file, key, field, reason) and the scan goes on with the next entry and the
next file. `diff`, `show` and `merge` read through the same scan and refuse a directory that has problems.

Merge rules (`merge`): OUT's own certifications take part like a first shard. Copies of one key's certification that
are identical are one. Certifications of one key made on the same card with the same versions (`SOURCE_FIELDS` of the
provenance equal) are duplicates of one run: the one with the faster winner (smaller `median_us`) is kept and the
report says so. Certifications from different cards or versions are a conflict: refused (and nothing is written)
unless `prefer` says how to choose, `newest` (`newness`: the later provenance date, then the higher nbxcert, Triton
and driver versions; still tied, the faster winner) or `fastest` (the smaller winner `median_us`, only when every
candidate's timing kind agrees; a conflict across timing kinds stays refused). Any tie left goes to the one listed
first (OUT, then the shards in command-line order), so a merge never changes OUT for no reason.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbxcert import certificates, files
from nbxcert.errors import CertificateInvalid, DeviceFactMissing, KeyNotCertified, KeyParseError, UsageError
from nbxcert.files import atomic_write
from nbxcert.keys import check_key, parse_key
from nbxcert.text import printable

NO_CERTS_HINT = "name the directory certify wrote (its --out), which holds <vendor>/<profile>/<kernel>.<dtype>.json"

# The provenance fields that say which card and which software made a certification: equal in all of them means one
# run configuration (`certify.same_card` skips a rerun on the same ones).
SOURCE_FIELDS = certificates.CARD_FIELDS + ("nbxcert", "code")
PREFER = ("newest", "fastest")
_IGNORED_DIRS = ("__pycache__",)


# --- scanning ---------------------------------------------------------------------------------------------------------
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
    # `certificates._fail` attaches the parts of its message; any other CertificateInvalid is one reason for the file.
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


def _read(path: Path) -> Any:
    try:
        return certificates.read_json(path)
    except OSError as e:  # e.g. permission denied: read_json only turns a failed stat into CertificateInvalid
        raise CertificateInvalid(f"{path}: cannot be read: {e.strerror}") from None


def load_specs(modules: Sequence[str] = ()) -> dict[str, Any]:
    """Every registered kernel spec, after importing `modules` (a user's own specs; `module[:anything]` accepted)."""
    from nbxcert.errors import NbxcertError

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
        doc = _read(path)
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


def validate(root: Path, modules: Sequence[str] = ()) -> DirScan:
    """`nbxcert validate`: every problem of every file under `root`, each kernel checked against its spec. A
    directory with no certificate file and no problem is refused: it passed the CI gate ("0 files, 0 entries, 0
    problems", exit 0), as a path to the wrong directory would."""
    scan = scan_dir(root, load_specs(modules))
    if scan.files == 0 and not scan.problems:
        raise UsageError(f"{printable(root)} holds no certificate files: nothing to validate", hint=NO_CERTS_HINT)
    return scan


# --- show -------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shown:
    """A key's certification for one profile: the one serving would use (first directory wins), and the directories
    whose certification of it is shadowed."""

    found: Found
    shadowed: tuple[Path, ...]


def config_label(cfg: Mapping[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in sorted(cfg["kwargs"].items())]
    return ",".join(parts + [f"warps={cfg['num_warps']}", f"stages={cfg['num_stages']}"])


def summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers a reader wants from an entry, derived: labels, speed-up over the default, runner-up margin."""
    w, r, d = entry["winner"], entry["runner_up"], entry["default"]
    speedup = None
    if d is not None and d["timing"]["kind"] == w["timing"]["kind"] and w["timing"]["median_us"] > 0:
        speedup = d["timing"]["median_us"] / w["timing"]["median_us"]
    return {
        "winner": config_label(w["config"]),
        "runner_up": config_label(r["config"]) if r else None,
        "default": config_label(d["config"]) if d else None,
        "default_is_winner": d is not None and d["config"] == w["config"],
        "speedup_over_default": speedup,
        "margin": entry["margin"],
        "refused": {k: v for k, v in entry["counts"].items() if k != "correct" and v},
        "correct": entry["counts"]["correct"],
    }


def _profile_dirs(dirs: Sequence[Path], profile: str | None) -> tuple[list[Path], list[str]]:
    from nbxcert.profiles import all_profiles, get_profile

    dirs = [Path(d) for d in dirs] if dirs else _search_path()
    keys = [get_profile(profile).key] if profile else [p.key for p in all_profiles()]
    return dirs, keys


def _search_path() -> list[Path]:
    """Serving's search path: NBXCERT_CERTIFIED_DIR's directories, then the shipped certificates."""
    from nbxcert.serving import search_path

    return search_path()


def show(
    key_text: str, profile: str | None = None, dirs: Sequence[Path] = (), modules: Sequence[str] = ()
) -> list[Shown]:
    """The certification of one key, per profile (only `profile`, when given) across `dirs` (default: the serving
    search path, `NBXCERT_CERTIFIED_DIR` then the shipped certificates); `KeyNotCertified` when there is none. A key
    of a registered kernel (`modules`: the user's own) is checked against its spec (and `profile`'s ladders) first;
    one of a kernel not registered is only looked up."""
    from nbxcert.options import check_environment, existing_dirs
    from nbxcert.profiles import get_profile

    key = parse_key(key_text)
    specs = load_specs(modules)
    prof = get_profile(profile) if profile else None
    if key.kernel in specs:
        check_key(specs[key.kernel], key, prof)
    if dirs:
        existing_dirs(dirs)
    check_environment(search_path=not dirs)
    dirs, profile_keys = _profile_dirs(dirs, profile)
    shown = []
    for pk in profile_keys:
        hits = []
        for d in dirs:
            found = _find_in(d, pk, key.kernel, key.text())
            if found is not None:
                hits.append(found)
        if hits:
            shown.append(Shown(hits[0], tuple(h.root for h in hits[1:])))
    if not shown:
        where = ", ".join(printable(d) for d in dirs) or "no directory (NBXCERT_CERTIFIED_DIR is empty)"
        target = profile_keys[0] if profile else "any profile"
        if key.kernel not in specs:  # "certify it" was the next step given, for a kernel that cannot be certified
            import difflib

            close = difflib.get_close_matches(key.kernel, list(specs), n=1)
            raise KeyNotCertified(
                f"key {key.text()} is not certified for {target} in {where}",
                hint=f"no kernel named '{key.kernel}' is registered: check the name (`nbxcert kernels`"
                + (f"; did you mean {close[0]}?" if close else "")
                + "), or give --spec MODULE for a kernel of your own",
            )
        raise KeyNotCertified(
            f"key {key.text()} is not certified for {target} in {where}",
            hint=f"certify it: `nbxcert certify --profile {target if profile else 'PROFILE'} --key '{key.text()}'`"
            + ("" if dirs else "; or name a directory with --dir"),
        )
    return shown


def _find_in(root: Path, profile_key: str, kernel: str, key_text: str) -> Found | None:
    """The key's certification in `root/<profile>/<kernel>.*.json` (the files of its kernel), validated."""
    pdir = Path(root) / profile_key
    if not files.is_dir(pdir):  # one that cannot be searched holds nothing this key can be served from
        return None
    real_root = Path(root).resolve()
    for path in sorted(pdir.glob(f"{kernel}.*.json")):
        try:
            resolved = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise CertificateInvalid(f"{printable(path)}: is a link that cannot be resolved") from None
        if real_root not in resolved.parents:
            raise CertificateInvalid(f"{printable(path)}: is a link that points outside {printable(root)}")
        if not resolved.is_file():
            raise CertificateInvalid(f"{printable(path)}: is not a regular file")
        cert = certificates.validate_doc(path, _read(path))
        if cert.profile != profile_key:
            reason = f"'{printable(cert.profile)}' disagrees with its directory '{profile_key}'"
            raise CertificateInvalid(f"{printable(path)}: field 'profile': {reason}")
        if key_text in cert.entries:
            return Found(Path(root), path, profile_key, cert.kernel, cert.dtype, key_text, cert.entries[key_text])
    return None


# --- diff -------------------------------------------------------------------------------------------------------------
@dataclass
class ProfileDiff:
    added: list[Found] = field(default_factory=list)
    removed: list[Found] = field(default_factory=list)
    changed: list[tuple[Found, Found]] = field(default_factory=list)  # (old, new): the winner's config changed
    unchanged: int = 0


@dataclass
class DiffReport:
    old: Path
    new: Path
    profiles: dict[str, ProfileDiff]


def ratio(old: Mapping[str, Any], new: Mapping[str, Any]) -> float | None:
    """new / old winner median, when both were timed the same way (None otherwise)."""
    a, b = old["winner"]["timing"], new["winner"]["timing"]
    if a["kind"] != b["kind"] or a["median_us"] <= 0:
        return None
    return b["median_us"] / a["median_us"]


def diff(old_dir: Path, new_dir: Path) -> DiffReport:
    """Keys added, removed and whose winner changed from `old_dir` to `new_dir`, per profile."""
    a = scan_dir(old_dir).require_ok().found
    b = scan_dir(new_dir).require_ok().found
    profiles: dict[str, ProfileDiff] = {}
    for ident in sorted(set(a) | set(b), key=lambda i: (i[0], i[2], i[1])):
        pd = profiles.setdefault(ident[0], ProfileDiff())
        if ident not in a:
            pd.added.append(b[ident])
        elif ident not in b:
            pd.removed.append(a[ident])
        elif a[ident].entry["winner"]["config"] != b[ident].entry["winner"]["config"]:
            pd.changed.append((a[ident], b[ident]))
        else:
            pd.unchanged += 1
    return DiffReport(Path(old_dir), Path(new_dir), profiles)


# --- merge ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One certification of a key offered to a merge, and where it came from."""

    source: str
    entry: dict[str, Any]

    @property
    def median(self) -> float:
        return self.entry["winner"]["timing"]["median_us"]

    @property
    def kind(self) -> str:
        return self.entry["winner"]["timing"]["kind"]

    def describe(self) -> str:
        p = self.entry["provenance"]
        return (
            f"{self.source}: {p['gpu']} (cc {p['compute_capability']}), driver {p['driver']}, triton {p['triton']}, "
            f"nbxcert {p['nbxcert']}, {p['date']}, winner {config_label(self.entry['winner']['config'])} "
            f"{self.median:.4g} us"
        )


@dataclass
class KeyMerge:
    """The decision for one key: `kind` single|duplicate|conflict; `outcome` new|replaced|unchanged|refused."""

    profile: str
    file: str
    key: str
    kind: str
    outcome: str
    chosen: Candidate | None
    candidates: list[Candidate]
    note: str = ""


@dataclass
class MergeReport:
    out: Path
    prefer: str | None
    keys: list[KeyMerge]
    written: list[Path] = field(default_factory=list)

    def count(self, **match) -> int:
        return sum(all(getattr(k, n) == v for n, v in match.items()) for k in self.keys)

    @property
    def refused(self) -> list[KeyMerge]:
        return [k for k in self.keys if k.outcome == "refused"]

    def totals(self) -> dict[str, int]:
        return {
            "new": self.count(outcome="new"),
            "replaced": self.count(outcome="replaced"),
            "unchanged": self.count(outcome="unchanged"),
            "duplicates": self.count(kind="duplicate"),
            "conflicts_resolved": sum(k.kind == "conflict" and k.outcome != "refused" for k in self.keys),
            "conflicts_refused": len(self.refused),
        }

    def line(self) -> str:
        t = self.totals()
        n, out = t["new"] + t["replaced"], printable(self.out)
        head = (
            f"merged {n} keys into {out}" if not self.refused else f"nothing merged into {out} (would merge {n} keys)"
        )
        return (
            f"{head} ({t['new']} new, {t['replaced']} replaced, {t['unchanged']} unchanged); {t['duplicates']} "
            f"duplicates (same card and versions: the faster kept); conflicts: {t['conflicts_resolved']} resolved"
            + (f" by --prefer {self.prefer}" if self.prefer else "")
            + f", {t['conflicts_refused']} refused"
        )

    def raise_if_refused(self) -> None:
        if self.refused:
            first = self.refused[0]
            raise UsageError(
                printable(
                    f"merge refused, nothing written: {len(self.refused)} key(s) certified on different cards or "
                    f"versions ({first.profile} {first.key}: {first.note})"
                ),
                hint="pass --prefer newest (fastest compares only timings of one kind), or re-certify on one card"
                if self.prefer == "fastest"
                else "pass --prefer newest or --prefer fastest to choose, or re-certify on one card",
            )


def _digits(text: str) -> tuple[tuple[int, str], ...]:
    """A version's numbers, compared numerically without int() (no size limit to trip on): "3.10" > "3.9"."""
    return tuple((len(d), d) for d in (x.lstrip("0") or "0" for x in re.findall(r"\d+", text)))


def newness(entry: Mapping[str, Any]) -> tuple:
    """How new a certification is: provenance date, then nbxcert, Triton and driver versions."""
    p = entry["provenance"]
    return (p["date"], _digits(p["nbxcert"]), _digits(p["triton"]), _digits(p["driver"]))


def _source(entry: Mapping[str, Any]) -> tuple:
    return tuple(entry["provenance"].get(f) for f in SOURCE_FIELDS)  # `code` is absent before nbxcert 0.4.0


def decide(candidates: Sequence[Candidate], prefer: str | None) -> tuple[Candidate | None, str, str]:
    """(chosen or None if refused, kind, note) for one key's candidates, in listing order (see the module docstring)."""
    distinct: list[Candidate] = []
    seen: set[str] = set()
    for c in candidates:
        text = json.dumps(c.entry, sort_keys=True)
        if text not in seen:
            seen.add(text)
            distinct.append(c)
    if len(distinct) == 1:
        return distinct[0], "single", ""
    groups: dict[tuple, list[Candidate]] = {}
    for c in distinct:
        groups.setdefault(_source(c.entry), []).append(c)
    # within one card and versions: the faster winner (min keeps the first listed on a tie)
    best = [min(g, key=lambda c: c.median) if len({c.kind for c in g}) == 1 else g[0] for g in groups.values()]
    if len(groups) == 1:
        dropped = ", ".join(f"{c.source} {c.median:.4g} us" for c in distinct if c is not best[0])
        return (
            best[0],
            "duplicate",
            f"same card and versions: kept {best[0].source} {best[0].median:.4g} us over {dropped}",
        )
    sides = "; ".join(c.describe() for c in best)
    kinds = {c.kind for c in best}
    if prefer is None:
        return None, "conflict", sides
    if prefer == "fastest":
        if len(kinds) > 1:
            return (
                None,
                "conflict",
                f"timing kinds differ ({', '.join(sorted(kinds))}), fastest cannot compare: {sides}",
            )
        chosen = min(best, key=lambda c: c.median)
        return chosen, "conflict", f"fastest: {chosen.source} ({sides})"
    order = {id(c): i for i, c in enumerate(best)}
    same_kind = len(kinds) == 1
    chosen = max(best, key=lambda c: (newness(c.entry), -c.median if same_kind else 0.0, -order[id(c)]))
    return chosen, "conflict", f"newest: {chosen.source} ({sides})"


def _plan(out_scan: DirScan | None, shards: Sequence[DirScan], prefer: str | None) -> list[KeyMerge]:
    offered: dict[tuple[str, str, str], list[Candidate]] = {}
    existing = out_scan.found if out_scan is not None else {}
    for ident, f in existing.items():
        offered.setdefault(ident, []).append(Candidate(f"{printable(out_scan.root)} (existing)", f.entry))
    for s in shards:
        for ident, f in s.found.items():
            offered.setdefault(ident, []).append(Candidate(printable(s.root), f.entry))
    plan = []
    for ident in sorted(offered, key=lambda i: (i[0], i[2], i[1])):
        chosen, kind, note = decide(offered[ident], prefer)
        if chosen is None:
            outcome = "refused"
        elif ident not in existing:
            outcome = "new"
        elif existing[ident].entry == chosen.entry:
            outcome = "unchanged"
        else:
            outcome = "replaced"
        plan.append(KeyMerge(ident[0], ident[1], ident[2], kind, outcome, chosen, offered[ident], note))
    return plan


def merge(out: Path, dirs: Sequence[Path], prefer: str | None = None, modules: Sequence[str] = ()) -> MergeReport:
    """Merge the certifications of shard directories `dirs` into `out` (see the module docstring for the rules).

    Every shard, and `out`, must validate (as `nbxcert validate` does); a refused conflict writes nothing. Files are
    written atomically under each profile directory's lock, and the plan is made again under the locks, so a certify
    run writing into `out` meanwhile is neither lost nor overwritten."""
    if prefer is not None and prefer not in PREFER:
        raise UsageError(f"--prefer {prefer!r} is not a rule", hint=f"choose one of: {', '.join(PREFER)}")
    if not dirs:
        raise UsageError("no shard directory to merge", hint="nbxcert merge OUT DIR [DIR ...]")
    from nbxcert.options import writable_dir

    # OUT under a file (`merge file.txt/sub ...`) raised NotADirectoryError from the lock's mkdir, a traceback (bug
    # found by tests/cli/test_fuzz.py::test_cli_merge_fuzz): OUT is checked like certify's --out, before any shard is
    # read
    out = writable_dir(Path(out), "OUT")
    specs = load_specs(modules)
    shards = [scan_dir(d, specs).require_ok() for d in dirs]
    if not any(s.files for s in shards):  # merged 0 keys and exited 0: a wrong path passed as a merge
        names = ", ".join(printable(d) for d in dirs)
        raise UsageError(
            f"the shard directories hold no certificate files ({names}): nothing to merge", hint=NO_CERTS_HINT
        )

    def out_scan() -> DirScan | None:
        return scan_dir(out, specs).require_ok() if out.is_dir() else None

    report = MergeReport(out, prefer, _plan(out_scan(), shards, prefer))
    if report.refused:
        return report
    profiles = sorted({k.profile for k in report.keys})
    with contextlib.ExitStack() as stack:
        for pk in profiles:  # sorted: two merges take the locks in one order
            stack.enter_context(certificates.locked(certificates.profile_dir(out, pk)))
        current = out_scan()
        report.keys = _plan(current, shards, prefer)
        if report.refused:
            return report
        report.written = _write(out, current, report.keys)
    return report


def _write(out: Path, current: DirScan | None, plan: Sequence[KeyMerge]) -> list[Path]:
    by_file: dict[tuple[str, str], list[KeyMerge]] = {}
    for k in plan:
        if k.outcome in ("new", "replaced"):
            by_file.setdefault((k.profile, k.file), []).append(k)
    existing = current.found if current is not None else {}
    written = []
    for (pk, name), changes in sorted(by_file.items()):
        kernel, dtype = name[: -len(".json")].split(".")
        entries = {ident[2]: f.entry for ident, f in existing.items() if ident[:2] == (pk, name)}
        entries.update({k.key: k.chosen.entry for k in changes})
        doc = {"schema_version": certificates.SCHEMA_VERSION, "kernel": kernel, "dtype": dtype, "profile": pk}
        doc["entries"] = dict(sorted(entries.items()))
        path = certificates.profile_dir(out, pk) / name
        certificates.validate_doc(path, doc)
        atomic_write(path, certificates.dumps(doc))
        written.append(path)
    return written
