"""`nbxcert diff`: the keys added, removed and whose winner changed between two certificate directories, per
profile and memory class (a key keeps one entry a class: an H100's run changes the 80GB entries beside the H200's);
both directories are read through `dirscan` and refused if they have problems."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbxcert.dirscan import NO_CERTS_HINT, Found, each_class, scan_dir
from nbxcert.errors import UsageError
from nbxcert.text import printable


@dataclass
class ProfileDiff:
    """Each item one memory class's entry of a key (`Found.entry`, its `memory_class` naming the class)."""

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


def by_class(found: Mapping[tuple, Found]) -> dict[tuple, Found]:
    """Every memory class's entry of each certification, by (profile, file name, key, class)."""
    return {(*ident, c.entry["memory_class"]): c for ident, f in found.items() for c in each_class(f)}


def diff(old_dir: Path, new_dir: Path) -> DiffReport:
    """The entries added, removed and whose winner changed from `old_dir` to `new_dir`, per profile, each memory
    class's entry of a key on its own."""
    scans = scan_dir(old_dir).require_ok(), scan_dir(new_dir).require_ok()
    if not any(scan.files for scan in scans):  # two wrong paths compared "equal" (exit 0)
        raise UsageError(
            f"neither {printable(old_dir)} nor {printable(new_dir)} holds certificate files: nothing to compare",
            hint=NO_CERTS_HINT,
        )
    a, b = (by_class(scan.found) for scan in scans)
    profiles: dict[str, ProfileDiff] = {}
    for ident in sorted(set(a) | set(b), key=lambda i: (i[0], i[2], i[3], i[1])):
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
