"""The duet: two live servers measured in one window, requests alternated between them.

Two servers compared one after the other differ by whatever changed in between (on the GPU lab
the same build measured 389 and 576 tok/s five minutes apart). In a duet both are live and the
client alternates: prompt by prompt at concurrency 1 (never both generating at once), whole
rounds of N requests at concurrency N. The order is balanced, ABBA by pair (A first, then B
first, ...), and seeded, so neither side always runs first, after an idle gap, or second, right
after the other side's request; what the machine does at that moment hits both sides of a pair.

A pair is one request key (prompt id and repeat) on both sides; the gates decide on the per-pair
log ratios (specgate.paired). Each pair keeps the time it started, so a report can show drift.

This module is the plan (which request goes where, in which order); measure.Measurer runs it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

SIDES = ("subject", "partner")


@dataclass(frozen=True)
class Turn(Generic[T]):
    """One step of a duet window: ``items`` (one request, or one round at concurrency N) sent to
    ``side``; ``group`` numbers the pair (or the pair of rounds) it belongs to."""

    side: str  # "subject" | "partner"
    group: int
    items: tuple[T, ...]


def plan(subject: Sequence[T], partner: Sequence[T], *, concurrency: int, seed: int) -> list[Turn[T]]:
    """The balanced, seeded order of a duet window.

    ``subject[i]`` and ``partner[i]`` are the same request key on the two servers. Groups of
    ``concurrency`` keys form one pair of turns; group g runs subject first when (g + s) is even,
    partner first otherwise, where s (0 or 1) comes from ``seed``: ABBA ABBA ... or BAAB ...
    """
    if len(subject) != len(partner):
        raise ValueError(f"a duet needs the same requests on both sides: {len(subject)} vs {len(partner)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    start = random.Random(seed).randrange(2)
    turns: list[Turn[T]] = []
    for group, first in enumerate(range(0, len(subject), concurrency)):
        a = Turn("subject", group, tuple(subject[first:first + concurrency]))
        b = Turn("partner", group, tuple(partner[first:first + concurrency]))
        turns.extend((a, b) if (group + start) % 2 == 0 else (b, a))
    return turns
