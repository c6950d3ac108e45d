"""The memory class of a card: what tells cards of one profile apart in a certificate entry and in the index serving
reads (`memory_class` of an entry, the index's name). Certify, serving and `doctor` all take it from here, so a
certificate made on a card is found on that card.

Not an input of a certificate's code digest (`fingerprint.ENGINE_MODULES`): it names the card an entry was made on
and decides no verdict.
"""

from __future__ import annotations


def memory_class(profile, memory_bytes: int, sm_count: int | None = None) -> str:
    """The class of a card of `memory_bytes` (and `sm_count`, when known) under `profile`: the class of its nearest
    SKUs (`Profile.closest_skus`), one SKU or several that tie but share their class (H100 SXM5 and PCIe are both
    "80GB", told apart only by their SMs); else the card's own size in whole GB ("cpu" for none)."""
    if memory_bytes == 0:
        return "cpu"
    classes = {s.memory_class for s in profile.closest_skus(memory_bytes, sm_count)}
    if len(classes) == 1:
        return classes.pop()
    return f"{round(memory_bytes / 1e9)}GB"


def classes_of(profile) -> list[str]:
    """The memory classes of a profile's cards (its SKUs'), sorted; "cpu" for a profile of none (the interpreter)."""
    return sorted({s.memory_class for s in profile.skus}) or ["cpu"]


def check_class(profile, memory_class: str | None) -> None:
    """`--memory-class`: None, or a class one of the profile's cards has (`UsageError` naming the classes otherwise)."""
    from nbxcert.errors import UsageError

    classes = classes_of(profile)
    if memory_class is not None and memory_class not in classes:
        raise UsageError(
            f"--memory-class {memory_class} is not a class of {profile.key}'s cards",
            hint=f"give one of: {', '.join(classes)}",
        )
