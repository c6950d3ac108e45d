"""Which of a family's kept candidates a test judges: every one under `-m slow`, a fixed sample in the regular run.

A family keeps tens of candidates, and judging each against its oracle under Triton's interpreter costs seconds. The
regular run judges a sample that still reaches every branch the candidates take: every value of every field the
caller names as a kind (a variant, a tile size, a split count) and every turn of every rotation the test makes by
position (`i % n`: the dtypes, the flags it spreads over the candidates) is taken at least once. The candidates are
drawn by a random generator seeded with a string naming the test and its case, so the sample is the same on every run
and every machine, and differs between the tests and cases that share a family. `-m slow` judges all of them.

Usage: parametrize over `SUBSETS` and iterate over `chosen(...)`; the result holds positions in `kept`, so a test's
seeds and dtype turns stay what they are in the full run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence

import pytest

# "sample" in the regular run, "every" under -m slow (the full set, as the test judged it before the sample)
SUBSETS = ["sample", pytest.param("every", marks=pytest.mark.slow)]


def field(name: str) -> Callable[[object], Hashable]:
    """A kind: the value of one config field (None where a config has no such field; `num_warps` and `num_stages`
    read from the config itself)."""
    if name in ("num_warps", "num_stages"):
        return lambda config: getattr(config, name)
    return lambda config: config.get(name)


def chosen(
    kept: Sequence,
    subset: str,
    seed: str,
    kinds: Sequence[Callable[[object], Hashable]] = (),
    turns: Sequence[int] = (),
) -> list[int]:
    """Positions in `kept` to judge, ascending: all of them for `subset == "every"`; for "sample", a candidate of
    every value of every `kinds` function and of every residue `i % n` of every `turns` modulus, drawn with
    `random.Random(seed)` (a value already covered by an earlier draw is not drawn again)."""
    assert subset in ("sample", "every"), subset
    if subset == "every":
        return list(range(len(kept)))
    assert kept, "nothing kept to sample from"
    rng = random.Random(seed)
    labels: list[Callable[[int], Hashable]] = [lambda i, k=k: k(kept[i]) for k in kinds]
    labels += [lambda i, n=n: i % n for n in turns]
    picked: set[int] = set()
    for label in labels or [lambda i: None]:
        members: dict[Hashable, list[int]] = {}
        for i in range(len(kept)):
            members.setdefault(label(i), []).append(i)
        covered = {label(i) for i in picked}
        for value, positions in members.items():
            if value not in covered:
                picked.add(rng.choice(positions))
    return sorted(picked)
