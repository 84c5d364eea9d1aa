"""The cost of a session: the plan printed once the selection is known, the order that decides the
most important gates first, the time budget (a window that does not fit is NOT RUN; follow-up
rounds get only what later windows' first looks leave) and the progress lines."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from specgate.decide.outcome import Outcome, pytest_action
from specgate.durations import format_elapsed
from specgate.errors import SpecgateError
from specgate.lazy import registry, verdicts
from specgate.measure.telemetry import canary_reader
from specgate.plan.estimate import (
    Conditions,
    SessionPlan,
    WindowKey,
    estimate_rates,
    plan_session,
    window_key,
    windows_of,
)
from specgate.plan.progress import SessionProgress
from specgate.plugin.configure import get_session

if TYPE_CHECKING:
    from specgate.plugin.session import SpecgateSession

NOT_RUN = Outcome.NOT_RUN.value  # the undecided kind of a gate the session's budget left out
GATE_ORDER = ("backfire", "throughput", "lossless", "acceptance", "ttft")

COST_KEY = pytest.StashKey["SessionCost"]()


@dataclass
class SessionCost:
    plan: SessionPlan
    progress: SessionProgress
    rates: dict[WindowKey, float] = field(default_factory=dict)
    not_run: list[str] = field(default_factory=list)  # node ids

    def window(self, run_session: SpecgateSession, key: WindowKey):
        """The plan's window, or the window a planned duet reference now takes alone."""
        window = self.plan.window(key)
        if window is None:
            alone = plan_session(run_session.settings.rig, [key], self.rates)
            window = alone.window(key)
        return window


def gate_of(item: pytest.Item) -> str:
    return getattr(item, "originalname", item.name.split("[")[0]).removeprefix("test_")


def gate_key(item: pytest.Item) -> tuple[str, str, str, int] | None:
    """A perf test's (gate, mode, class, concurrency), or None."""
    key = window_key(item)
    return None if key is None else (gate_of(item), *key)


def order_items(items: list[pytest.Item], class_order: list[str]) -> None:
    """Reorder in place each run of consecutive perf tests of one mode: by window, then by gate
    (GATE_ORDER); runs of different modes keep their places (one server start per mode)."""
    rank = {name: i for i, name in enumerate(class_order)}

    def sort_key(item: pytest.Item):
        _, prompt_class, concurrency = window_key(item)  # type: ignore[misc]
        gate = gate_of(item)
        return (rank.get(prompt_class, len(rank)), concurrency,
                GATE_ORDER.index(gate) if gate in GATE_ORDER else len(GATE_ORDER))

    ordered: list[pytest.Item] = []
    for mode, group in itertools.groupby(items, key=lambda item: (window_key(item) or [None])[0]):
        run = list(group)
        ordered += run if mode is None else sorted(run, key=sort_key)  # sorted() is stable
    items[:] = ordered


def rates_of(run_session: SpecgateSession) -> tuple[dict[WindowKey, float], str | None]:
    """The plan's decode rates (at this host's CPU canary) and the note on figures set aside."""
    try:
        run = run_session.settings
    except SpecgateError:
        return {}, None  # refused with file and key (refuse_bad_inputs)
    canary = canary_reader(tries=50)()["cpu_canary_us"]
    return estimate_rates(run.store, run.rig, canary_us=canary)


def reusable(run_session: SpecgateSession, keep: bool) -> tuple[str, ...]:
    """The labels of the kept servers this session would reuse now (none unless ``keep``)."""
    if not keep:
        return ()
    return registry.reusable_labels(run_session.settings.rig, run_session.modes_to_run(),
                                    run_session.server_spec)


def build_plan(run_session: SpecgateSession, items: list[pytest.Item], *,
               reused: tuple[str, ...], rates: tuple[dict[WindowKey, float], str | None],
               host_gib: float | None = None) -> SessionPlan:
    """The session's plan of ``items``, from ``rates`` (rates_of)."""
    windows, other = windows_of(items)
    rates, note = rates
    return plan_session(run_session.settings.rig, windows, rates, Conditions(
        attached=run_session.options.attach_url is not None, reused=reused,
        keep_servers=run_session.options.keep_servers, host_gib=host_gib, other_tests=other,
        rate_note=note))


def refuse_short_host(config: pytest.Config, run_session: SpecgateSession,
                      items: list[pytest.Item]) -> None:
    """Before any server starts: refuse an alternation that needs sleep level 2, on this host's
    memory, for a server that cannot wake from it (one usage error)."""
    if run_session.options.attach_url is not None or hasattr(config, "workerinput"):
        return
    rig = run_session.settings.rig
    if rig.arrangement.name != "alternation":
        return
    windows, _ = windows_of(items)
    plan = plan_session(rig, windows, {}, Conditions(keep_servers=run_session.options.keep_servers))
    if plan.refusal:
        raise pytest.UsageError(f"specgate: {rig.path}: {plan.refusal} (checked before any server "
                                "starts)")


def session_state(run_session: SpecgateSession):
    def state() -> tuple[dict[WindowKey, float | None], set[str]]:
        done: dict[WindowKey, float | None] = {
            k: m.wall_s for k, m in run_session.measurements.items()}
        # a window that failed or was declared NOT RUN leaves the count and the time left
        not_run = [(u["mode"], u["prompt_class"], u["concurrency"])
                   for u in run_session.undecided if u.get("kind") == NOT_RUN]
        for key in [*run_session.failures, *not_run]:
            done.setdefault(key, None)
        return done, set(run_session.servers)
    return state


def start(config: pytest.Config, run_session: SpecgateSession, items: list[pytest.Item]) -> None:
    """After collection: print the plan once and start the progress lines."""
    if not any(window_key(item) is not None for item in items):
        return
    try:
        options = run_session.options
        reused = reusable(run_session, options.keep_servers and options.attach_url is None)
        rates = rates_of(run_session)
        plan = build_plan(run_session, items, reused=reused, rates=rates)
    except SpecgateError:
        return  # a configuration error: collection reports it
    progress = SessionProgress(plan, session_state(run_session),
                               started_at=run_session.options.started_at)
    config.stash[COST_KEY] = SessionCost(plan, progress, rates[0])
    if config.option.collectonly or config.getoption("setupplan", False) \
            or hasattr(config, "workerinput"):
        return
    text = plan.render()
    budget = run_session.options.time_budget_s
    if budget is not None:
        text += (f"\n  session budget: {format_elapsed(budget)} (--specgate-session-budget); a "
                 "window that does not fit is NOT RUN")
        expected = plan.expected_s
        if expected is not None and expected > budget:
            text += (f"; the estimate ({format_elapsed(expected)}) is over it, so the session ends "
                     "within the budget and the last windows in the order may not run")
    for line in text.splitlines():
        run_session.progress(line)
    run_session.progress = progress.wrap(run_session.progress)


def get_cost(config: pytest.Config) -> SessionCost | None:
    return config.stash.get(COST_KEY, None)


def after_test(config: pytest.Config, run_session: SpecgateSession) -> None:
    cost = get_cost(config)
    if cost is None or hasattr(config, "workerinput"):
        return
    line = cost.progress.after_test()
    if line is not None:
        run_session.progress(line)


def _measured(run_session: SpecgateSession, key: WindowKey) -> bool:
    if key in run_session.measurements or key in run_session.failures:
        return True
    mode, prompt_class, concurrency = key
    rig = run_session.settings.rig
    # a duet rig's reference window comes from a duet already measured (no cost)
    return rig.comparing == "duet" and mode == rig.reference_mode and \
        run_session.reference_from_duets(prompt_class, concurrency) is not None


def check_budget(item: pytest.Item, run_session: SpecgateSession, *, clock=time.monotonic) -> None:
    """Before a perf test: NOT RUN (skipped, recorded) when its window does not fit the budget."""
    budget = run_session.options.time_budget_s
    cost = get_cost(item.config)
    key = window_key(item)
    if budget is None or cost is None or key is None or _measured(run_session, key):
        return
    left = run_session.options.started_at + budget - clock()
    window = cost.window(run_session, key)
    pace = cost.progress.pace()
    needed = (window.seconds or 0.0) * pace if window is not None else 0.0
    _, servers = cost.progress.state()
    starts = [s for s in cost.plan.servers if window is not None and s.label in window.servers
              and not s.reused and s.label not in servers]
    needed += sum(s.startup_s for s in starts)
    if needed <= left and left > 0:
        _bound_follow_ups(run_session, cost, key, [s.label for s in starts], left - needed, clock)
        return
    mode, prompt_class, concurrency = key
    with_starts = f" (with the start of {', '.join(s.label for s in starts)})" if starts else ""
    why = (f"the session's time budget ({format_elapsed(budget)}) has "
           f"{format_elapsed(max(0.0, left))} left; its window needs ~{format_elapsed(needed)}"
           + with_starts)
    entry = {"gate": gate_of(item), "mode": mode, "prompt_class": prompt_class,
             "concurrency": concurrency, "kind": NOT_RUN, "message": why}
    run_session.record_undecided(entry["gate"], SimpleNamespace(**entry), NOT_RUN, why)
    cost.not_run.append(item.nodeid)
    # skipped, or failed where the policy says so (--specgate-undecided, [gates] undecided)
    policy = run_session.settings.outcome_policy
    text = verdicts.pytest_text(entry, Outcome.NOT_RUN, policy)
    if pytest_action(Outcome.NOT_RUN, policy) == "failed":
        pytest.fail(text, pytrace=False)
    pytest.skip(text)


def _bound_follow_ups(run_session: SpecgateSession, cost: SessionCost, key: WindowKey,
                      starting: list[str], spare_s: float, clock) -> None:
    """Follow-up rounds may use only ``spare_s``, what the later windows' first looks leave."""
    if run_session.options.worker_id is not None:
        return  # a worker does not know which windows the others run
    later = cost.progress.remaining_s(exclude=(key,), starting=starting) or 0.0
    window = cost.plan.window(key)
    own = (window.seconds or 0.0) * cost.progress.pace() if window is not None else 0.0
    run_session.measurer.deadline = clock() + own + max(0.0, spare_s - later)


class PlanCapture:
    """A plugin for ``specgate plan``: the selection's plan, kept, not printed."""

    def __init__(self, *, keep_servers: bool = False, host_gib: float | None = None) -> None:
        self.plan: SessionPlan | None = None
        self.keep_servers = keep_servers
        self.host_gib = host_gib

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not any(window_key(item) is not None for item in session.items):
            return
        self.run_session = run_session = get_session(session.config)
        self.windows, _ = windows_of(session.items)
        self.rates = rates_of(run_session)
        self.plan = build_plan(run_session, session.items, rates=self.rates,
                               reused=reusable(run_session, self.keep_servers),
                               host_gib=self.host_gib)
