"""`nbxcert merge`: the certifications of shard directories merged into one directory, OUT.

Merge rules (`merge`), for each key and memory class apart (a key's entries of an H100 and of an H200 are kept side by
side, `certificates.OTHER_CLASSES`): OUT's own certifications take part like a first shard. Copies of one key's
certification that are identical are one. Certifications of one key made on the same card with the same versions
(`SOURCE_FIELDS` of the provenance equal) are duplicates of one run: the one with the faster winner (smaller
`median_us`) is kept and the report says so. Certifications from different cards or versions are a conflict: refused
(and nothing is written) unless `prefer` says how to choose, `newest` (`newness`: the later provenance date, then the
higher nbxcert, Triton and driver versions; still tied, the faster winner) or `fastest` (the smaller winner `median_us`,
only when every candidate's timing kind agrees; a conflict across timing kinds stays refused). Any tie left goes to the
one listed first (OUT, then the shards in command-line order), so a merge never changes OUT for no reason.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbxcert import certificates
from nbxcert.certificates import config_label
from nbxcert.dirscan import NO_CERTS_HINT, DirScan, load_specs, scan_dir
from nbxcert.errors import UsageError
from nbxcert.files import atomic_write
from nbxcert.text import printable

# The provenance fields that say which card and which software made a certification: equal in all of them means one
# run configuration (`certify.same_card` skips a rerun on the same ones).
SOURCE_FIELDS = certificates.CARD_FIELDS + ("nbxcert", "code")
PREFER = ("newest", "fastest")


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
    memory_class: str = ""  # a key's entries of each memory class are merged apart (`certificates.OTHER_CLASSES`)


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
            f"merged {n} entries (one per key and memory class) into {out}"
            if not self.refused
            else f"nothing merged into {out} (would merge {n} entries, one per key and memory class)"
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
    """One decision a (key, memory class): a key's entries of different classes (an H100's and an H200's) are no
    conflict, each class is merged on its own."""
    offered: dict[tuple[str, str, str, str], list[Candidate]] = {}
    existing = out_scan.found if out_scan is not None else {}
    held: dict[tuple[str, str, str, str], dict] = {}
    for ident, f in existing.items():
        for cls, entry in certificates.class_entries(f.entry).items():
            held[(*ident, cls)] = entry
            offered.setdefault((*ident, cls), []).append(Candidate(f"{printable(out_scan.root)} (existing)", entry))
    for s in shards:
        for ident, f in s.found.items():
            for cls, entry in certificates.class_entries(f.entry).items():
                offered.setdefault((*ident, cls), []).append(Candidate(printable(s.root), entry))
    plan = []
    for ident in sorted(offered, key=lambda i: (i[0], i[2], i[1], i[3])):
        chosen, kind, note = decide(offered[ident], prefer)
        if chosen is None:
            outcome = "refused"
        elif ident not in held:
            outcome = "new"
        elif held[ident] == chosen.entry:
            outcome = "unchanged"
        else:
            outcome = "replaced"
        plan.append(KeyMerge(ident[0], ident[1], ident[2], kind, outcome, chosen, offered[ident], note, ident[3]))
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
        for k in changes:  # each class's chosen entry beside the key's other classes
            entries[k.key] = certificates.with_class(entries.get(k.key), k.chosen.entry)
        doc = {"schema_version": certificates.SCHEMA_VERSION, "kernel": kernel, "dtype": dtype, "profile": pk}
        doc["entries"] = dict(sorted(entries.items()))
        path = certificates.profile_dir(out, pk) / name
        certificates.validate_doc(path, doc)
        atomic_write(path, certificates.dumps(doc))
        written.append(path)
    return written
