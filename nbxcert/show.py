"""`nbxcert show`: one key's certification per profile across certificate directories (the serving search path by
default), the one serving would use and the directories whose certification of it is shadowed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nbxcert import certificates, files
from nbxcert.certificates import config_label
from nbxcert.dirscan import Found, load_specs, read_doc
from nbxcert.errors import CertificateInvalid, KeyNotCertified, UsageError
from nbxcert.keys import check_key, parse_key
from nbxcert.text import printable


@dataclass(frozen=True)
class Shown:
    """A key's certification for one profile: the one serving would use (first directory wins), and the directories
    whose certification of it is shadowed."""

    found: Found
    shadowed: tuple[Path, ...]


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
    key_text: str,
    profile: str | None = None,
    dirs: Sequence[Path] = (),
    modules: Sequence[str] = (),
    memory_class: str | None = None,
) -> list[Shown]:
    """The certification of one key, per profile (only `profile`, when given) across `dirs` (default: the serving
    search path, `NBXCERT_CERTIFIED_DIR` then the shipped certificates); `KeyNotCertified` when there is none. A key
    of a registered kernel (`modules`: the user's own) is checked against its spec (and `profile`'s ladders) first;
    one of a kernel not registered is only looked up. `memory_class`: that class's entry, from the first directory
    that has one (as a card of the class is served), else each key's first class's."""
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
    if memory_class is not None:
        from nbxcert.memory_class import check_class, classes_of

        if profile:
            check_class(prof, memory_class)
        else:  # every profile was refused the class but the first's cards lacked: only those whose cards have it
            having = [pk for pk in profile_keys if memory_class in classes_of(get_profile(pk))]
            if not having:
                known = sorted({c for pk in profile_keys for c in classes_of(get_profile(pk))})
                raise UsageError(
                    f"--memory-class {memory_class} is not a class of any profile's cards",
                    hint=f"give one of: {', '.join(known)} (`nbxcert profiles` lists each profile's)",
                )
            profile_keys = having
    shown = []
    for pk in profile_keys:
        hits = []
        for d in dirs:
            found = _find_in(d, pk, key.kernel, key.text())
            if found is not None and memory_class is not None:
                entry = certificates.of_class(found.entry, memory_class)
                found = None if entry is None else replace(found, entry=entry)
            if found is not None:
                hits.append(found)
        if hits:
            shown.append(Shown(hits[0], tuple(h.root for h in hits[1:])))
    if not shown:
        where = ", ".join(printable(d) for d in dirs) or "no directory (NBXCERT_CERTIFIED_DIR is empty)"
        target = (profile_keys[0] if profile else "any profile") + (f" ({memory_class} class)" if memory_class else "")
        if key.kernel not in specs:  # "certify it" was the next step given, for a kernel that cannot be certified
            import difflib

            close = difflib.get_close_matches(key.kernel, list(specs), n=1)
            raise KeyNotCertified(
                f"key {key.text()} is not certified for {target} in {where}",
                hint=f"no kernel named '{key.kernel}' is registered: check the name (`nbxcert kernels`"
                + (f"; did you mean {close[0]}?" if close else "")
                + "), or give --spec MODULE for a kernel of your own",
            )
        elsewhere = _held_elsewhere(dirs, key.kernel, key.text(), profile_keys, memory_class)
        card = f" on a card of the {memory_class} class" if memory_class else ""
        raise KeyNotCertified(
            f"key {key.text()} is not certified for {target} in {where}"
            + (f" (it is certified for {elsewhere})" if elsewhere else ""),
            hint=f"certify it{card}: `nbxcert certify --profile {profile_keys[0] if profile else 'PROFILE'} "
            f"--key '{key.text()}'`" + ("" if dirs else "; or name a directory with --dir"),
        )
    return shown


def _held_elsewhere(dirs: Sequence[Path], kernel: str, key_text: str, asked: Sequence[str], memory_class) -> str:
    """Where a key not found as asked is certified: "PROFILE (CLASS, ...)" of every profile holding it in `dirs`
    other than what was asked (another profile, or another memory class of an asked one); "" for none."""
    from nbxcert.profiles import all_profiles

    held = []
    for p in all_profiles():
        classes: set[str] = set()
        for d in dirs:
            found = _find_in(d, p.key, kernel, key_text)
            if found is not None:
                classes.update(certificates.class_entries(found.entry))
        if p.key in asked and memory_class is not None:
            classes.discard(memory_class)
        elif p.key in asked:
            classes = set()
        if classes:
            held.append(f"{p.key} ({', '.join(sorted(classes))} class)")
    return "; ".join(held)


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
        cert = certificates.validate_doc(path, read_doc(path))
        if cert.profile != profile_key:
            reason = f"'{printable(cert.profile)}' disagrees with its directory '{profile_key}'"
            raise CertificateInvalid(f"{printable(path)}: field 'profile': {reason}")
        if key_text in cert.entries:
            return Found(Path(root), path, profile_key, cert.kernel, cert.dtype, key_text, cert.entries[key_text])
    return None
