"""The memory class of a card: what tells cards of one profile apart in a certificate entry and in the index serving
reads (`memory_class` of an entry, the index's name). Certify, serving and `doctor` all take it from here, so a
certificate made on a card is found on that card.

Not an input of a certificate's code digest (`fingerprint.ENGINE_MODULES`): it names the card an entry was made on
and decides no verdict.
"""

from __future__ import annotations

from nbxcert.profiles import MEMORY_MATCH_TOLERANCE


def memory_class(profile, memory_bytes: int, sm_count: int | None = None) -> str:
    """The class of a card of `memory_bytes` (and `sm_count`, when known) under `profile`: its SKU's
    (`Profile.sku_for_memory`); the one class of the nearest SKUs when they tie but share it and the SM count is not
    known (H100 SXM5 and PCIe are both "80GB" and told apart only by their SMs); else the card's own size in whole GB
    ("cpu" for none)."""
    if memory_bytes == 0:
        return "cpu"
    sku = profile.sku_for_memory(memory_bytes, sm_count)
    if sku is not None:
        return sku.memory_class
    if sm_count is None:
        off = {s: abs(memory_bytes - s.memory_bytes) for s in profile.skus}
        near = [s for s in profile.skus if off[s] <= MEMORY_MATCH_TOLERANCE * s.memory_bytes]
        if near:
            best = min(off[s] for s in near)
            classes = {s.memory_class for s in near if off[s] == best}
            if len(classes) == 1:
                return classes.pop()
    return f"{round(memory_bytes / 1e9)}GB"
