"""The duet: two live servers measured in one window, requests alternated between them.

Two servers compared one after the other differ by whatever changed in between (on a shared GPU
machine the same build can measure 389 and 576 tok/s five minutes apart). In a duet both are live and the
client alternates: prompt by prompt at concurrency 1 (never both generating at once), whole
rounds of N requests at concurrency N. The order is balanced, ABBA by pair (A first, then B
first, ...), and seeded, so neither side always runs first, after an idle gap, or second, right
after the other side's request; what the machine does at that moment hits both sides of a pair.

A pair is one request key (prompt id and repeat) on both sides; the gates decide on the per-pair
log ratios (specgate.decide.paired). Each pair keeps the time it started, so a report can show drift.

On rigs where two servers do not fit at once, the two take turns instead (an alternation, see
specgate.serve.sleep): one is awake, the other sleeps (vLLM sleep mode), and a swap costs ~1.6 s, so
the turns are blocks of several keys (``block``) rather than single requests: the same ABBA
order by block, with a swap only between two turns, never inside a request's timing.

This module is the plan (which request goes where, in which order); measure.Measurer runs it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from specgate.config.defaults import EXPECTED_SWAP_S  # noqa: F401 (re-exported)

T = TypeVar("T")

SIDES = ("subject", "partner")
# The share of an alternation window that swaps may take when the block is computed (not set); a
# turn holds at most one pass over the class's prompts, so a class of few prompts can take more.
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
    """The balanced, seeded order of a duet window.

    ``subject[i]`` and ``partner[i]`` are the same request key on the two servers. Groups of at
    most ``block`` keys (default: ``concurrency``; else a multiple of it), as equal as whole rounds
    of ``concurrency`` allow, form one pair of turns; group g
    runs subject first when (g + s) is even, partner first otherwise, where s (0 or 1) comes from
    ``seed``: ABBA ABBA ... or BAAB ... A turn of a block larger than ``concurrency`` runs its keys
    ``concurrency`` at a time.

    ``first`` ("subject" or "partner") fixes which side group 0 starts with instead of the seed: an
    alternation starts with the side that is awake, which saves a swap (6 pairs a window at 1.5 s a
    swap: one swap a window instead of two, 10 % of the window instead of 18 %).
    A window of one group then ends on the other side, so the next starts there: the first side
    still alternates from window to window.
    """
    if len(subject) != len(partner):
        raise ValueError(f"a duet needs the same requests on both sides: {len(subject)} vs {len(partner)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    block = concurrency if block is None else block
    if block < 1 or block % concurrency:
        raise ValueError(f"a block must be a positive multiple of the concurrency ({concurrency}), got {block}")
    if first not in (None, *SIDES):
        raise ValueError(f"first must be one of {SIDES} or None, got {first!r}")
    start = random.Random(seed).randrange(2) if first is None else SIDES.index(first)
    # ceil(keys / block) groups, as equal as whole rounds of the concurrency allow (7 keys in blocks
    # of 3: 2 + 2 + 3, never 3 + 3 + 1, whose last turn would pay a whole swap for one request)
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
    """How many times the awake side changes over ``turns`` (an alternation's swaps), starting
    with ``awake`` awake (None: the first turn's side is already awake)."""
    count, current = 0, awake
    for step in steps:
        if current is not None and step.side != current:
            count += 1
        current = step.side
    return count


def alternation_swaps(*, keys: int, block: int, concurrency: int, repeats: int) -> int:
    """The swaps of an alternation window of ``repeats`` passes over ``keys`` requests per side in
    turns of ``block``: each pass starts on the side that is awake (see :func:`plan`)."""
    steps = plan(range(keys), range(keys), concurrency=concurrency, seed=0, block=block, first="subject")
    return repeats * swaps_in(steps, awake="subject")


def alternation_block(*, request_s: float, swap_s: float, concurrency: int, keys: int,
                      max_swap_share: float = MAX_SWAP_SHARE) -> int:
    """The block (a multiple of ``concurrency``) of an alternation window over ``keys`` requests per
    side: at least what keeps swaps within ``max_swap_share``, in turns of equal size.

    ABBA by block swaps once per group of two turns; a turn of ``block`` keys at concurrency N
    takes about ``block / N`` request times, so a group takes 2 (block / N) request_s + swap_s and
    the share is swap_s / that: block >= N swap_s (1 - share) / (2 share request_s). The keys are
    cut into as many equal turns as that allows (one at most all of them), never leaving a short
    last turn that pays a whole swap for a request or two (6 keys with a need of 5: one turn of 6,
    not 5 and 1)."""
    if request_s <= 0:
        raise ValueError(f"a request time must be positive, got {request_s}")
    need = concurrency * swap_s * (1 - max_swap_share) / (2 * max_swap_share * request_s)
    rounds = max(1, math.ceil(keys / concurrency))  # one pass over the keys, in rounds of N
    steps = rounds if need <= 0 else min(rounds, max(1, math.floor(rounds * concurrency / need)))
    return concurrency * math.ceil(rounds / steps)
