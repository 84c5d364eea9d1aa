"""The whole session's progress: windows done out of the plan's, and the time left (the plan at
the pace measured so far), as one rate-limited status line after a window and beside a long wait's
progress lines."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping

from specgate.durations import format_elapsed
from specgate.plan.estimate import SessionPlan, WindowKey

MIN_INTERVAL_S = 10.0
HEARTBEAT_S = 30.0


class SessionProgress:
    """Counts the plan's windows and server starts done; says how far the session has got and
    how long is left. ``state`` returns the windows done (key -> measured wall seconds, or None
    where the window failed) and the labels of the servers up or started so far."""

    def __init__(self, plan: SessionPlan,
                 state: Callable[[], tuple[Mapping[WindowKey, float | None], Collection[str]]],
                 *, started_at: float, clock: Callable[[], float] = time.monotonic,
                 min_interval_s: float = MIN_INTERVAL_S, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.plan = plan
        self.state = state
        self.started_at = started_at
        self.clock = clock
        self.min_interval_s = min_interval_s
        self.heartbeat_s = heartbeat_s
        self._last_status: float | None = None
        self._last_done = -1
        self._keys = {w.key for w in plan.windows}
        # (windows done + servers up, when that count last changed): see _in_progress_s
        self._progress_mark: tuple[int, float] | None = None

    # -- what is known --------------------------------------------------------------------------
    def done(self) -> dict[WindowKey, float | None]:
        windows, _ = self.state()
        return {k: v for k, v in windows.items() if k in self._keys}

    def pace(self) -> float:
        """Measured wall time over the plan's estimate, over the windows done with a time (1.0
        before any): a machine twice as slow as the stored figures' doubles the time left."""
        measured = estimated = 0.0
        for key, wall_s in self.done().items():
            window = self.plan.window(key)
            if wall_s is not None and window is not None and window.seconds:
                measured += wall_s
                estimated += window.seconds
        return measured / estimated if estimated > 0 else 1.0

    def remaining_s(self, *, exclude: Collection[WindowKey] = (),
                    starting: Collection[str] = ()) -> float | None:
        """The plan's time for the windows not done yet (and the servers not started), at the pace
        measured so far; None when a window's rate is unknown. ``exclude``: windows, ``starting``:
        server labels, left out (the window about to run and the servers it starts)."""
        done = self.done()
        _, servers = self.state()
        pace = self.pace()
        left = 0.0
        for w in self.plan.windows:
            if w.key in done or w.key in exclude:
                continue
            if w.seconds is None:
                return None
            left += w.seconds * pace
        left += sum(s.startup_s for s in self.plan.started
                    if s.label not in servers and s.label not in starting)
        return left

    def _in_progress_s(self) -> float:
        """Seconds of work done since the windows done or servers up last changed, up to the next
        window's (or server's) estimate: what a long window has already spent of the time left."""
        done = self.done()
        _, servers = self.state()
        count, now = len(done) + len(servers), self.clock()
        if self._progress_mark is None or self._progress_mark[0] != count:
            self._progress_mark = (count, now)
            return 0.0
        pending = [s.startup_s for s in self.plan.started if s.label not in servers]
        pending += [(w.seconds or 0.0) * self.pace() for w in self.plan.windows
                    if w.key not in done]
        return min(now - self._progress_mark[1], pending[0] if pending else 0.0)

    def status_line(self) -> str:
        now = self.clock()
        done = self.done()
        _, servers = self.state()
        starts = self.plan.started
        started = sum(1 for s in starts if s.label in servers)
        left = self.remaining_s()
        line = (f"session: {len(done)}/{len(self.plan.windows)} windows done, "
                f"{started}/{len(starts)} servers started, {format_elapsed(now - self.started_at)} "
                "elapsed")
        if left is None:
            return line + ", time left unknown (no rate for some window)"
        pace = self.pace()
        left = max(0.0, left - self._in_progress_s())
        return line + f", ~{format_elapsed(left)} left" + (
            f" (measured pace {pace:.2f}x the plan)" if any(v is not None for v in done.values())
            else " (the plan's)")

    # -- when to say it -------------------------------------------------------------------------
    def _due(self, interval: float) -> bool:
        return self._last_status is None or self.clock() - self._last_status >= interval

    def _say(self) -> str:
        self._last_status = self.clock()
        return self.status_line()

    def after_test(self) -> str | None:
        """After a test: a status line when a window finished and none was said lately."""
        count = len(self.done())
        if count == self._last_done or not self._due(self.min_interval_s):
            return None
        self._last_done = count
        return self._say()

    def beside(self) -> str | None:
        """Beside another progress line: a status line when none was said within ``heartbeat_s``."""
        if not self._due(self.heartbeat_s):
            return None
        return self._say()

    def wrap(self, emit: Callable[[str], None]) -> Callable[[str], None]:
        """The session's progress channel with the status line added, rate-limited."""
        def emit_with_status(line: str) -> None:
            emit(line)
            status = self.beside()
            if status is not None:
                emit(status)
        return emit_with_status
