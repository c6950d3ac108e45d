"""Certified winners that the sweep's winner rule, as it stands, would not choose from their own recorded timings.

A certificate entry keeps what its winner was chosen from: every fully timed candidate (`finalists`, fastest first,
the untuned default among them) or, in entries made before nbxcert 0.2.0, the winner and its runner-up. The winner
rule (`nbxcert.sweep.choose_winner`: the fastest, or inside the band of medians that cannot be told apart from the
fastest's, the untuned default, then the simplest) is applied to those figures again, with no device and no sweep (the
winner by its own recorded timing, which a sweep also records as its finalist row). An
entry whose winner the rule would not choose is stale: its winner is significantly slower than a candidate the same
sweep timed. Such an entry comes from a winner rule that has changed since (nbxcert 0.1.0's band was the fastest's
raw spread, which a noisy fastest candidate made 100% wide and more), or from an edited or merged file.

Without finalists the entry's winner takes the default's place in the rule: a winner the rule would replace is then
one outside the band around its runner-up, and a winner that is the fastest, or inside the band, is chosen again.

The stale keys, written as a keys file, are what `nbxcert certify --keys FILE --force` sweeps again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbxcert.certificates import class_entries, config_label
from nbxcert.dirscan import NO_CERTS_HINT, scan_dir
from nbxcert.errors import UsageError
from nbxcert.text import printable


@dataclass(frozen=True)
class StaleWinner:
    """One entry whose certified winner the winner rule would not choose."""

    profile: str
    key: str
    file: Path
    winner: dict[str, Any]  # the certified winner's config (certificate form)
    winner_us: float
    chosen: dict[str, Any]  # the config the rule chooses from the same figures
    chosen_us: float
    memory_class: str = ""  # the class of the entry judged: a key holds one entry a class, each judged apart

    @property
    def ratio(self) -> float:
        """The certified winner's median over the chosen one's (above 1: the winner is slower)."""
        return self.winner_us / self.chosen_us if self.chosen_us > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "key": self.key,
            "memory_class": self.memory_class,
            "file": str(self.file),
            "winner": config_label(self.winner),
            "winner_us": self.winner_us,
            "chosen": config_label(self.chosen),
            "chosen_us": self.chosen_us,
            "ratio": self.ratio,
        }


@dataclass
class StaleReport:
    """Every entry of a certificate directory (one profile, or all) judged again by the winner rule."""

    root: Path
    profile: str | None
    entries: int = 0
    judged: int = 0  # entries with figures to judge (a lone correct candidate has no runner-up: nothing to choose)
    stale: list[StaleWinner] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.stale

    def line(self) -> str:
        where = f"{printable(self.root)}" + (f" ({self.profile})" if self.profile else "")
        text = (
            f"{len(self.stale)} of {self.entries} certified winners in {where} are not the one the winner rule chooses"
        )
        if self.stale:
            ratios = sorted(s.ratio for s in self.stale)
            text += f" (slower by {ratios[len(ratios) // 2]:.3f}x at the median, {ratios[-1]:.2f}x at worst)"
        return text

    def keys_jsonl(self) -> str:
        """The stale keys as a keys file (`nbxcert certify --keys`), one profile's only."""
        profiles = sorted({s.profile for s in self.stale})
        if len(profiles) > 1:
            raise UsageError(
                f"the stale keys are of {len(profiles)} profiles ({', '.join(profiles)}); a keys file is one profile's",
                hint="give --profile",
            )
        keys = dict.fromkeys(s.key for s in self.stale)  # a key stale in two memory classes is certified once a card
        return "".join(json.dumps({"key": k}) + "\n" for k in keys)


def rule_choice(entry: Mapping[str, Any]) -> tuple[dict[str, Any], float] | None:
    """(config, median in us) of the candidate the winner rule chooses from the entry's own figures, where it is not
    the certified winner; None when the rule chooses the winner again, or there is nothing to choose from."""
    from nbxcert.kernels.spec import Config
    from nbxcert.sweep import Outcome, choose_winner

    def outcome(side: Mapping[str, Any]) -> Outcome:
        return Outcome(Config.from_dict(side["config"]), "correct", timing=dict(side["timing"]))

    winner = outcome(entry["winner"])
    if entry.get("finalists"):
        # the winner with its own timing (what show, diff, merge and export read): a sweep records it as its finalist
        # row, and a file edited since judges it by the figure it states
        own = entry["winner"]["config"]
        candidates = [winner if f["config"] == own else outcome(f) for f in entry["finalists"]]
        if all(f["config"] != own for f in entry["finalists"]):
            candidates.append(winner)
        # the untuned default the sweep preferred; a default refused on the device is among no candidates
        default = Config.from_dict(entry["default"]["config"]) if entry.get("default") else None
    elif entry.get("runner_up"):
        candidates, default = [winner, outcome(entry["runner_up"])], winner.config
    else:
        return None
    chosen, _ = choose_winner(candidates, default)
    if chosen is None or chosen.config == winner.config:
        return None
    return chosen.config.as_dict(), chosen.median


def find_stale(root: Path, profile: str | None = None) -> StaleReport:
    """Every entry under `root` (only `profile`'s, when given) judged again by the winner rule; the stale ones listed,
    the most slowed first. A directory with any invalid file is refused (`CertificateInvalid`)."""
    from nbxcert.profiles import get_profile

    profile_key = get_profile(profile).key if profile else None
    report = StaleReport(Path(root), profile_key)
    for found in scan_dir(root).require_ok().found.values():
        if profile_key and found.profile != profile_key:
            continue
        for entry in class_entries(found.entry).values():  # a key's entry of each memory class
            report.entries += 1
            if entry.get("finalists") or entry.get("runner_up"):
                report.judged += 1
            choice = rule_choice(entry)
            if choice is not None:
                config, median = choice
                w = entry["winner"]
                median_us = w["timing"]["median_us"]
                report.stale.append(
                    StaleWinner(
                        found.profile,
                        found.key,
                        found.path,
                        w["config"],
                        median_us,
                        config,
                        median,
                        entry["memory_class"],
                    )
                )
    if not report.entries:  # "0 of 0 certified winners ... are not the one the rule chooses", exit 0: a gate passed
        # on nothing
        which = f" for {profile_key}" if profile_key else ""
        hint = NO_CERTS_HINT + ("; or leave --profile out" if profile_key else "")
        raise UsageError(f"{printable(root)} holds no certified entries{which}: nothing to judge", hint=hint)
    report.stale.sort(key=lambda s: (-s.ratio, s.profile, s.key, s.memory_class))
    return report
