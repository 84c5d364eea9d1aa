"""specgate.plan.progress: the session's status line, rate-limited, on an injected clock."""

import pytest

from specgate.plan.estimate import ServerPlan, SessionPlan, WindowPlan
from specgate.plan.progress import SessionProgress

pytestmark = pytest.mark.fast


def _plan(*seconds: float) -> SessionPlan:
    windows = tuple(WindowPlan(key=("ngram", f"c{i}", 1), arrangement="duet", partner="no_spec", requests=12,
                               tokens=768,
                               rates=(10.0, 10.0), rate_source="stored", seconds=s, servers=("ngram", "no_spec"))
                    for i, s in enumerate(seconds))
    return SessionPlan(rig="r", comparing="duet", arrangement="duet", servers=(ServerPlan("no_spec", "no_spec", 40.0),
                                                         ServerPlan("ngram", "ngram", 60.0)),
                       windows=windows, warmup_requests=2, warmup_s=10.0)


class World:
    """What the session has done, and the time, as the test sets them."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.windows: dict = {}
        self.servers: set = set()

    def clock(self) -> float:
        return self.now

    def state(self):
        return self.windows, self.servers


def _progress(world: World, *seconds: float) -> SessionProgress:
    return SessionProgress(_plan(*seconds), world.state, started_at=world.now, clock=world.clock)


def test_a_line_after_a_window_finishes_at_most_every_ten_seconds():
    world = World()
    progress = _progress(world, 100.0, 100.0, 100.0)
    assert progress.after_test() is not None  # the first test: says where the session stands
    world.now += 3
    assert progress.after_test() is None  # nothing finished since
    world.windows[("ngram", "c0", 1)] = 100.0
    assert progress.after_test() is None  # finished, but only 3 s after the last line
    world.now += 7
    line = progress.after_test()
    assert line is not None and "1/3 windows done" in line
    world.windows[("ngram", "c1", 1)] = 100.0
    world.now += 9.9
    assert progress.after_test() is None
    world.now += 0.1
    assert "2/3 windows done" in progress.after_test()


def test_beside_other_progress_lines_a_status_at_most_every_thirty_seconds():
    world = World()
    progress = _progress(world, 100.0)
    said = []
    emit = progress.wrap(said.append)
    emit("mode ngram: waiting for /health")
    assert len(said) == 2 and said[1].startswith("session: 0/1 windows done")
    for _ in range(29):
        world.now += 1
        emit("window line")
    assert len(said) == 2 + 29  # no status within 30 s of the last
    world.now += 1
    emit("window line")
    assert said[-1].startswith("session:")


def test_time_left_follows_the_measured_pace():
    world = World()
    progress = _progress(world, 100.0, 100.0, 100.0)
    assert progress.remaining_s() == pytest.approx(300 + 40 + 60)  # the plan's, servers included
    world.servers |= {"no_spec", "ngram"}
    world.windows[("ngram", "c0", 1)] = 200.0  # twice as slow as the plan
    assert progress.pace() == pytest.approx(2.0)
    assert progress.remaining_s() == pytest.approx(2 * 200)
    world.windows[("ngram", "c1", 1)] = None  # a failed window: done, says nothing of the pace
    assert progress.pace() == pytest.approx(2.0) and progress.remaining_s() == pytest.approx(200)
    world.now += 125
    line = progress.status_line()
    assert "2/3 windows done, 2/2 servers started, 2m05s elapsed, ~3m20s left (measured pace 2.00x the plan)" in line


def test_an_unknown_rate_says_the_time_left_is_unknown():
    world = World()
    unknown = WindowPlan(key=("a", "b", 1), arrangement="solo", partner=None, requests=1, tokens=1, rates=(None,),
                         rate_source="no rate", seconds=None)
    plan = SessionPlan(rig="r", comparing="sequential", arrangement="sequential", servers=(), windows=(unknown,),
                       warmup_requests=0, warmup_s=None)
    progress = SessionProgress(plan, world.state, started_at=world.now, clock=world.clock)
    assert progress.remaining_s() is None and "time left unknown" in progress.status_line()


def test_the_time_left_goes_down_while_a_window_runs_but_not_below_its_estimate():
    world = World()
    world.servers |= {"no_spec", "ngram"}
    progress = _progress(world, 100.0, 100.0)
    assert "~3m20s left" in progress.status_line()  # 2 windows of 100 s
    world.now += 60
    assert "~2m20s left" in progress.status_line()  # 60 s into the first
    world.now += 100
    assert "~1m40s left" in progress.status_line()  # overran its estimate: the next one still to come
    world.windows[("ngram", "c0", 1)] = 160.0  # done, 1.6x the plan
    assert "~2m40s left" in progress.status_line()
