"""Host memory for sleep mode, one rule for ``plan``, the preflight and the sleep controller:
sleep level 1 keeps sleeping servers' weights in host memory; sleep level 2 keeps nothing (a wake
reads them again), and a server with a drafter or dummy weights cannot wake from it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specgate.durations import format_elapsed

GiB = 1024 ** 3
HOST_MARGIN = 1.10
HOST_RESERVE_GIB = 8.0
# A first sleep at sleep level 1 copies the weights to pinned host memory at about this rate.
PIN_GIB_PER_S = 1.2


def sleep_level_1_need_gib(weights_gib: Sequence[float]) -> float:
    """Host memory sleep level 1 needs for servers of these weights all asleep at once."""
    return HOST_MARGIN * sum(weights_gib) + HOST_RESERVE_GIB if weights_gib else 0.0


HOST_MEMORY_ENV = "SPECGATE_HOST_MEMORY_GIB"  # plan for a host of this many GiB available instead


def host_available_gib() -> float:
    """The host's available memory in GiB, or ``$SPECGATE_HOST_MEMORY_GIB``."""
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
    """A server of an alternation, as the sleep level choice sees it."""

    label: str
    weights_gib: float | None  # None: not known
    needs_sleep_level_1: str = ""  # why it cannot wake from sleep level 2 ("" when it can)


@dataclass(frozen=True)
class LevelChoice:
    levels: dict[str, int]  # label -> sleep level
    need_all_gib: float | None  # sleep level 1 for the most loaded at once; None: a size unknown
    available_gib: float
    refused: tuple[str, ...] = ()  # labels that need sleep level 1 and cannot have it
    forced: int | None = None
    loaded: tuple[str, ...] = ()  # the servers loaded at once at the peak (all: empty)
    need_refused_gib: float = 0.0  # sleep level 1 for those that need it, at once

    @property
    def short_gib(self) -> float:
        return max(0.0, (self.need_all_gib or 0.0) - self.available_gib)

    @property
    def at_once(self) -> int:
        """How many servers are loaded at once, at the most."""
        return len(self.loaded) or len(self.levels)

    def host_line(self, loaded_why: str = "") -> str:
        """The host memory in one line: needed against available, and what the host lacks."""
        if self.forced is not None:
            return (f"host memory: {self.available_gib:,.0f} GiB available; "
                    f"sleep_level = {self.forced}, set by the rig")
        if self.need_all_gib is None:
            return (f"host memory: {self.available_gib:,.0f} GiB available; the weights' size "
                    "is not known (set sleep_host_memory_gib in the rig), so sleep level 1 is "
                    "assumed to fit")
        why = f" ({loaded_why})" if loaded_why else ""
        line = (f"host memory: sleep level 1 for the {self.at_once} server(s) loaded at once{why} "
                f"needs {self.need_all_gib:,.0f} GiB ({HOST_MARGIN:g} x weights + "
                f"{HOST_RESERVE_GIB:g} GiB); {self.available_gib:,.0f} GiB available")
        if self.short_gib > 0:
            fit = sum(1 for level in self.levels.values() if level == 1)
            line += (f": {self.short_gib:,.0f} GiB short; {fit} of {len(self.levels)} sleep at "
                     "sleep level 1")
            if not fit and self.levels:  # one server's weights, from the figure for all of them
                weights = ((self.need_all_gib or HOST_RESERVE_GIB) - HOST_RESERVE_GIB) / HOST_MARGIN
                alone = sleep_level_1_need_gib([weights / max(1, self.at_once)])
                line += f" (one alone needs {alone:,.0f} GiB)"
        return line

    def refusal(self, sleepers: Sequence[Sleeper], *, instead: str = "") -> str | None:
        """The refusal of the servers that need sleep level 1 and cannot have it, or None."""
        if not self.refused:
            return None
        whom = [s for s in sleepers if s.label in self.refused]
        need = self.need_refused_gib or sleep_level_1_need_gib(
            [s.weights_gib or 0.0 for s in sleepers if s.needs_sleep_level_1])
        fewer = "select fewer modes (-k), " if not self.loaded else ""
        return (f"{', '.join(s.label for s in whom)} cannot sleep at sleep level 2 "
                f"({whom[0].needs_sleep_level_1}) and sleep level 1 for the servers that need it, "
                f"loaded at once, takes {need:,.0f} GiB of host memory; this host has "
                f"{self.available_gib:,.0f} GiB available. Run it on a host with {need:,.0f} GiB "
                f"available, {fewer}{instead + ', ' if instead else ''}or leave it out of this rig")


def choose_levels(sleepers: Sequence[Sleeper], available_gib: float, *, forced: int | None = None,
                  prefer: Sequence[str] = (),
                  at_once: Sequence[Sequence[str]] | None = None) -> LevelChoice:
    """Sleep level 1 for all when the host holds the weights of those loaded at once (``at_once``);
    else first for those that need it, then ``prefer``, then the rest while it fits; else 2."""
    groups = [[s.label for s in sleepers]] if at_once is None else [list(g) for g in at_once if g]
    weights = {s.label: s.weights_gib for s in sleepers}
    known = all(w is not None for w in weights.values())

    def need(labels: Iterable[str]) -> float:
        return sleep_level_1_need_gib([weights[label] or 0.0 for label in labels])

    peak = max(groups, key=need, default=[])
    need_all = need(peak) if known else None
    if forced is not None:
        levels = {s.label: forced for s in sleepers}
    elif need_all is None or need_all <= available_gib:
        levels = {s.label: 1 for s in sleepers}
    else:
        levels = {}
        for s in sorted(sleepers, key=lambda s: (not s.needs_sleep_level_1, s.label not in prefer)):
            beside = [[label for label in g if levels.get(label) == 1]
                      for g in groups if s.label in g]
            levels[s.label] = 1 if all(need([*g, s.label]) <= available_gib for g in beside) else 2
        levels = {s.label: levels[s.label] for s in sleepers}
    # a forced sleep level 2 on such servers is refused when the rig loads (check_sleep_level)
    refused = () if forced is not None else tuple(s.label for s in sleepers
                                                  if s.needs_sleep_level_1 and levels[s.label] == 2)
    needs_one = {s.label for s in sleepers if s.needs_sleep_level_1}
    refused_gib = max((need(label for label in g if label in needs_one) for g in groups),
                      default=0.0)
    return LevelChoice(levels, need_all, available_gib, refused, forced,
                       loaded=tuple(peak) if set(peak) != set(weights) else (),
                       need_refused_gib=refused_gib)


def sleep_level_2_wake_s(weights_gib: float | None, read_gib_per_s: float | None) -> float | None:
    """A wake at sleep level 2 (the weights read again), or None when either is unknown."""
    if weights_gib is None or not read_gib_per_s:
        return None
    return weights_gib / read_gib_per_s


def first_sleep_s(weights_gib: float | None) -> float | None:
    return None if weights_gib is None else weights_gib / PIN_GIB_PER_S


def level_line(sleeper: Sleeper, level: int, wake_s: float | None) -> str:
    if level == 1:
        first = first_sleep_s(sleeper.weights_gib)
        return f"{sleeper.label} sleep level 1" + (
            f" (first sleep ~{format_elapsed(first)})" if first else "")
    wake = (f"wake ~{format_elapsed(wake_s)}" if wake_s is not None else
            "wake time unknown, counted as swap_s: set [estimate] weights_read_gib_per_s")
    return f"{sleeper.label} sleep level 2 ({wake})"
