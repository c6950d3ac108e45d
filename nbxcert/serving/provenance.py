"""Provenance: where a certification was made, compared with the machine that serves it.

Checked where a certified entry is found: a certification made with another Triton major version, another NVIDIA
driver major, or on a device of another profile than the index's (its provenance's compute capability, or the
interpreter) is served with one notice per difference and process, saying what differs; under
`NBXCERT_STRICT_PROVENANCE=1` it is refused (`ProvenanceMismatch`, naming the key and the difference). `nbxcert doctor`
counts the certificates that apply to this machine and the ones it rejects (`provenance_differences`), and
`nbxcert certify` records the driver's version (`nvidia_driver_version`) in what it writes.

Imports `nbxcert.errors` and serving's notices at module level; Triton, the backend in force and the profiles only
inside the functions that read them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbxcert.errors import NbxcertError, ProvenanceMismatch
from nbxcert.serving.notices import say_once


@dataclass(frozen=True)
class Machine:
    """What serving compares a certification's provenance with: the profile in force, the running Triton's major
    version and the NVIDIA driver's major ("none" under the interpreter)."""

    profile: str
    triton_major: str
    driver_major: str


def major_version(version: Any) -> str:
    """The leading number of a version text ("3.6.0" -> "3", "580.159.04" -> "580"); "none" stays "none"."""
    text = str(version).strip()
    m = re.match(r"\d+", text)
    return m.group(0) if m else (text or "unknown")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def nvidia_driver_version() -> str:
    """The kernel module's version (e.g. 580.159.04), as the driver itself publishes it."""
    text = _read(Path("/sys/module/nvidia/version"))
    if text:
        return text
    line = _read(Path("/proc/driver/nvidia/version"))
    words = line.split("Kernel Module")[-1].split() if "Kernel Module" in line else []
    return words[0] if words else "unknown (neither /sys/module/nvidia/version nor /proc/driver/nvidia/version)"


def this_machine(profile_key: str) -> Machine:
    """The machine this process serves on, for the profile in force."""
    import triton

    from nbxcert.kernels.backends import select

    driver = "none"
    if select().name == "cuda":
        driver = major_version(nvidia_driver_version())
    return Machine(profile_key, major_version(triton.__version__), driver)


def provenance_profile(provenance: Mapping[str, Any]) -> str:
    """The profile of the device a certification was made on, from its provenance."""
    if provenance.get("backend") == "interpreter":
        return "cpu/interpreter"
    cc = str(provenance.get("compute_capability", ""))
    m = re.fullmatch(r"(\d{1,3})\.(\d{1,3})", cc)
    if m:
        from nbxcert.profiles import match_nvidia

        try:
            return match_nvidia((int(m.group(1)), int(m.group(2))))[0].key
        except NbxcertError:
            pass
    return f"an unknown profile (compute capability {cc or 'none'})"


def provenance_differences(provenance: Mapping[str, Any], here: Machine) -> list[str]:
    """What differs between where a certification was made and this machine, in words (empty: nothing that
    matters). Compared: the device's profile, Triton's major version, the NVIDIA driver's major."""
    differences = []
    made_on = provenance_profile(provenance)
    if made_on != here.profile:
        differences.append(f"made on a {made_on} device, this machine runs {here.profile}")
    triton = major_version(provenance.get("triton", ""))
    if triton != here.triton_major:
        differences.append(f"made with Triton {triton}.x, this machine has Triton {here.triton_major}.x")
    driver = major_version(provenance.get("driver", ""))
    if driver != here.driver_major:
        differences.append(f"made with driver {driver}, this machine's driver is {here.driver_major}")
    return differences


def check_provenance(
    spec, entry: Mapping[str, Any], key_text: str, profile, machine: Machine | None, strict: bool
) -> None:
    """Refuse (`strict`: `ProvenanceMismatch`) or say once per difference (default) a certification of `key_text`
    for `profile` made elsewhere than `machine`; nothing when it was made here, or when there is no machine to
    compare with."""
    if machine is None:
        return
    differences = provenance_differences(entry.get("provenance") or {}, machine)
    if not differences:
        return
    what = "; ".join(differences)
    if strict:
        raise ProvenanceMismatch(
            f"kernel {spec.name}: the certification of {key_text} for {profile.key} was {what}; "
            "NBXCERT_STRICT_PROVENANCE=1 refuses it",
            hint=f"re-certify it here: nbxcert certify --profile {profile.name} --key '{key_text}' --force "
            "(or unset NBXCERT_STRICT_PROVENANCE to serve it with a notice)",
        )
    say_once(
        f"[nbxcert] notice: serving {profile.key} certifications {what} (NBXCERT_STRICT_PROVENANCE=1 refuses "
        "them; `nbxcert doctor` lists them)"
    )
