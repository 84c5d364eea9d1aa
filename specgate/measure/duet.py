"""The duet: two live servers measured in one window, requests alternated between them in a
balanced, seeded ABBA order (prompt by prompt, or whole rounds at concurrency N), so what the
machine does at a moment hits both sides of a pair. An alternation takes turns of several keys
(``block``) instead, a swap only between turns. This module is the plan; measure.Measurer runs it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

SIDES = ("subject", "partner")
# The share of an alternation window that swaps may take when the block is computed.
MAX_SWAP_SHARE = 0.10


@dataclass(frozen=True)
class Step(Generic[T]):
    """One step of a duet window: ``items`` (one request, or one round at concurrency N) sent to
    ``side``; ``group`` numbers the pair (or the pair of rounds) it belongs to."""

    side: str  # "subject" | "partner"
    group: int
    items: tuple[T, ...]


def plan(subject: Sequence[T], partner: Sequence[T], *, concurrency: int, seed: int,
         block: int | None = None, first: str | None = None) -> list[Step[T]]:
    """The balanced, seeded order of a duet window (``subject[i]``, ``partner[i]``: one key on
    both servers): groups of at most ``block`` keys run ABBA or BAAB by ``seed``, or starting with
    ``first`` (an alternation's awake side, saving a swap)."""
    if len(subject) != len(partner):
        raise ValueError(f"a duet needs the same requests on both sides: {len(subject)} vs "
                         f"{len(partner)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    block = concurrency if block is None else block
    if block < 1 or block % concurrency:
        raise ValueError(f"a block must be a positive multiple of the concurrency "
                         f"({concurrency}), got {block}")
    if first not in (None, *SIDES):
        raise ValueError(f"first must be one of {SIDES} or None, got {first!r}")
    start = random.Random(seed).randrange(2) if first is None else SIDES.index(first)
    # ceil(keys / block) groups, as equal as whole rounds allow (7 keys in blocks of 3: 2 + 2 + 3)
    rounds = math.ceil(len(subject) / concurrency)
    groups = math.ceil(rounds / (block // concurrency))
    bounds = [min(len(subject), concurrency * (g * rounds // groups)) for g in range(groups + 1)]
    steps: list[Step[T]] = []
    for group, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        a = Step("subject", group, tuple(subject[lo:hi]))
        b = Step("partner", group, tuple(partner[lo:hi]))
        steps.extend((a, b) if (group + start) % 2 == 0 else (b, a))
    return steps


def swaps_in(steps: Sequence[Step[T]], *, awake: str | None = None) -> int:
    """An alternation's swaps over ``steps`` from ``awake`` (None: the first step's side)."""
    count, current = 0, awake
    for step in steps:
        if current is not None and step.side != current:
            count += 1
        current = step.side
    return count


def alternation_swaps(*, keys: int, block: int, concurrency: int, repeats: int) -> int:
    """The swaps of an alternation window of ``repeats`` passes over ``keys`` requests per side in
    turns of ``block``: each pass starts on the side that is awake (see :func:`plan`)."""
    steps = plan(range(keys), range(keys), concurrency=concurrency, seed=0, block=block,
                 first="subject")
    return repeats * swaps_in(steps, awake="subject")


def alternation_block(*, request_s: float, swap_s: float, concurrency: int, keys: int,
                      max_swap_share: float = MAX_SWAP_SHARE) -> int:
    """The block (a multiple of ``concurrency``) that keeps an alternation window's swaps within
    ``max_swap_share``, in equal turns: block >= N swap_s (1 - share) / (2 share request_s)."""
    if request_s <= 0:
        raise ValueError(f"a request time must be positive, got {request_s}")
    need = concurrency * swap_s * (1 - max_swap_share) / (2 * max_swap_share * request_s)
    rounds = max(1, math.ceil(keys / concurrency))  # one pass over the keys, in rounds of N
    steps = rounds if need <= 0 else min(rounds, max(1, math.floor(rounds * concurrency / need)))
    return concurrency * math.ceil(rounds / steps)
