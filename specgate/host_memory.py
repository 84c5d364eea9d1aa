"""Host memory for sleep mode: what level 1 needs for the servers that sleep at once, the level
each server gets, and what a level-2 wake costs; one rule for ``plan``, the session's preflight
and the sleep controller (specgate.sleep).

Level 1 keeps a sleeping server's weights in pinned host memory. In an alternation every server of
the session stays loaded, one awake at a time, and during a swap the server going to sleep copies
its weights out while the others' are still held: at the peak the host holds the weights of every
server that sleeps at level 1. The rule: available host memory >= HOST_MARGIN x (the sum of their
weights) + HOST_RESERVE_GIB. Level 2 keeps nothing on the host; its wake reads the weights from the
model's files again (weights / the rig's ``[estimate] weights_read_gib_per_s``). A server with a
drafter or ``--load-format dummy`` weights cannot wake from level 2, so it needs level 1 or is
refused before anything starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specgate.durations import format_elapsed

GiB = 1024 ** 3
HOST_MARGIN = 1.10
HOST_RESERVE_GIB = 8.0
# A first level-1 sleep copies the weights to pinned host memory at about this rate (28.9 GiB in
# 14-24 s measured); later swaps take about a second.
PIN_GIB_PER_S = 1.2


def level1_need_gib(weights_gib: Sequence[float]) -> float:
    """Host memory level 1 needs for servers of these weights all asleep at once (the rule above)."""
    return HOST_MARGIN * sum(weights_gib) + HOST_RESERVE_GIB if weights_gib else 0.0


HOST_MEMORY_ENV = "SPECGATE_HOST_MEMORY_GIB"  # plan for a host of this many GiB available instead


def host_available_gib() -> float:
    """The host's available memory in GiB (``$SPECGATE_HOST_MEMORY_GIB`` stands in for it)."""
    import os

    import psutil

    stand_in = os.environ.get(HOST_MEMORY_ENV)
    if stand_in:
        try:
            value = float(stand_in)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise ValueError(f"${HOST_MEMORY_ENV} must be a number of GiB, got {stand_in!r}")
        return value
    return psutil.virtual_memory().available / GiB


@dataclass(frozen=True)
class Sleeper:
    """A server of an alternation, as the level choice sees it."""

    label: str
    weights_gib: float | None  # None: not known
    needs_level1: str = ""  # why it cannot wake from level 2 ("" when it can)


@dataclass(frozen=True)
class LevelChoice:
    levels: dict[str, int]  # label -> sleep level
    need_all_gib: float | None  # level 1 for every server; None when a size is unknown
    need_chosen_gib: float  # level 1 for the servers that got it
    available_gib: float
    refused: tuple[str, ...] = ()  # labels that need level 1 and cannot have it
    forced: int | None = None

    @property
    def short_gib(self) -> float:
        return max(0.0, (self.need_all_gib or 0.0) - self.available_gib)

    def host_line(self) -> str:
        """The host memory in one line: needed against available, and what the host lacks."""
        if self.forced is not None:
            return f"host memory: {self.available_gib:,.0f} GiB available; sleep_level = {self.forced}, set by the rig"
        if self.need_all_gib is None:
            return (f"host memory: {self.available_gib:,.0f} GiB available; the weights' size is not known "
                    "(set sleep_host_memory_gib in the rig), so level 1 is assumed to fit")
        line = (f"host memory: level 1 for all {len(self.levels)} sleeping server(s) needs "
                f"{self.need_all_gib:,.0f} GiB ({HOST_MARGIN:g} x weights + {HOST_RESERVE_GIB:g} GiB); "
                f"{self.available_gib:,.0f} GiB available")
        if self.short_gib > 0:
            fit = sum(1 for level in self.levels.values() if level == 1)
            line += f": {self.short_gib:,.0f} GiB short; {fit} of {len(self.levels)} fit at level 1"
            line += (" (fewer modes with -k, or an A/B of one mode at a time, keeps every server at level 1)" if fit
                     else f" (one alone needs {level1_need_gib([self._weights_each()]):,.0f} GiB)"
                     if self.levels else "")
        return line

    def _weights_each(self) -> float:
        """One server's weights, from the rule's figure for all of them (one weights size per rig)."""
        return ((self.need_all_gib or HOST_RESERVE_GIB) - HOST_RESERVE_GIB) / HOST_MARGIN / max(1, len(self.levels))

    def refusal(self, sleepers: Sequence[Sleeper]) -> str | None:
        """The refusal of the servers that need level 1 and cannot have it, or None."""
        if not self.refused:
            return None
        whom = [s for s in sleepers if s.label in self.refused]
        need = level1_need_gib([s.weights_gib or 0.0 for s in sleepers if s.needs_level1])
        return (f"{', '.join(s.label for s in whom)} cannot sleep at level 2 ({whom[0].needs_level1}) and level 1 "
                f"for the servers that need it takes {need:,.0f} GiB of host memory; this host has "
                f"{self.available_gib:,.0f} GiB available. Run it on a host with {need:,.0f} GiB available, "
                "select fewer modes (-k), or leave it out of this rig")


def choose_levels(sleepers: Sequence[Sleeper], available_gib: float, *, forced: int | None = None,
                  prefer: Sequence[str] = ()) -> LevelChoice:
    """Level 1 for every server when the host holds all their weights; else level 1 first for the
    servers that cannot wake from level 2, then for those in ``prefer`` (a kept reference: kept
    only at level 1), then the others in order while they fit; level 2 for the rest. A forced
    level (the rig's ``sleep_level``) is taken as it is."""
    sizes = [s.weights_gib for s in sleepers]
    need_all = None if any(w is None for w in sizes) else level1_need_gib(sizes)  # type: ignore[arg-type]
    if forced is not None:
        levels = {s.label: forced for s in sleepers}
    elif need_all is None or need_all <= available_gib:
        levels = {s.label: 1 for s in sleepers}
    else:
        levels, chosen = {}, []
        for s in sorted(sleepers, key=lambda s: (not s.needs_level1, s.label not in prefer)):
            if level1_need_gib([*chosen, s.weights_gib or 0.0]) <= available_gib:
                levels[s.label] = 1
                chosen.append(s.weights_gib or 0.0)
            else:
                levels[s.label] = 2
        levels = {s.label: levels[s.label] for s in sleepers}
    # a forced level 2 on such servers is refused when the rig loads (specgate.config.check_sleep_level)
    refused = () if forced is not None else tuple(s.label for s in sleepers if s.needs_level1 and levels[s.label] == 2)
    chosen_gib = level1_need_gib([s.weights_gib or 0.0 for s in sleepers if levels[s.label] == 1])
    return LevelChoice(levels, need_all, chosen_gib, available_gib, refused, forced)


def level2_wake_s(weights_gib: float | None, read_gib_per_s: float | None) -> float | None:
    """A level-2 wake: the weights read again from the model's files, or None when either is unknown."""
    if weights_gib is None or not read_gib_per_s:
        return None
    return weights_gib / read_gib_per_s


def first_sleep_s(weights_gib: float | None) -> float | None:
    return None if weights_gib is None else weights_gib / PIN_GIB_PER_S


def level_line(sleeper: Sleeper, level: int, wake_s: float | None) -> str:
    if level == 1:
        first = first_sleep_s(sleeper.weights_gib)
        return f"{sleeper.label} level 1" + (f" (first sleep ~{format_elapsed(first)})" if first else "")
    wake = f"wake ~{format_elapsed(wake_s)}" if wake_s is not None else \
        "wake time unknown, counted as swap_s: set [estimate] weights_read_gib_per_s"
    return f"{sleeper.label} level 2 ({wake})"
