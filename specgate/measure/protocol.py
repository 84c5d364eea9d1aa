"""The measurement protocol: one prompt class, at one concurrency, on one server or on two at
once. A window: warm-up (once per server), a ``/metrics`` snapshot, every prompt ``repeats`` times,
a second snapshot; throughput from the records, acceptance from the counter deltas. A duet window
alternates requests between two live servers (:mod:`specgate.measure.duet`); an alternation window
is one whose servers take turns on the same GPUs (:mod:`specgate.serve.sleep`)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from specgate.config.rig import Mode, PromptClass, Rig
from specgate.durations import format_elapsed
from specgate.errors import RequestError, ServerDiedError
from specgate.measure.client import GenerationRequest, RequestRecord, StreamingClient, run_requests
from specgate.measure.duet import alternation_block, plan
from specgate.measure.metrics import (
    AcceptanceStats,
    MetricsDelta,
    metrics_delta,
    parse_metrics,
    server_decode_steps,
    server_decode_tokens_per_s,
)

PROGRESS_EVERY_S = 10.0


class Server(Protocol):
    base_url: str
    label: str
    api_key: str | None

    def check_alive(self) -> None: ...

    def log_tail(self, lines: int = ...) -> str: ...


@dataclass(frozen=True)
class Duet:
    """The two live servers of a duet window and their modes: the subject, and its partner (the
    no-speculation reference, or, with ``ab``, the same mode on the A/B's reference side)."""

    subject: Server
    partner: Server
    mode: Mode
    partner_mode: Mode
    ab: bool = False


@dataclass
class ClassMeasurement:
    """Everything measured for (mode, prompt class, concurrency) in one window."""

    rig: str
    mode: str
    prompt_class: str
    concurrency: int
    records: list[RequestRecord]
    acceptance: AcceptanceStats | None
    server_decode_tokens_per_s: float | None
    server_metric_source: str | None
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    # "solo", "duet" (alternated with ``partner``) or "alternation" (extra["alternation"]).
    arrangement: str = "solo"
    # "subject" (the mode under test) or "partner"; ``ab_side``: "candidate" or "reference".
    role: str = "subject"
    ab_side: str | None = None
    partner: ClassMeasurement | None = None
    # Duet: per group (the ABBA order's two steps): {"group", "first", "started_s"}.
    groups: list[dict[str, Any]] = field(default_factory=list)
    # A window that may get follow-up rounds: the share of its pairs the first look sees (None: one
    # look), why it got them, or why not (the session's time budget).
    first_look_share: float | None = None
    follow_up: str | None = None
    follow_up_skipped: str | None = None
    # vLLM's decode steps for the window's requests (server_decode_steps); None: not exported
    server_decode_steps: float | None = None

    @property
    def ab(self) -> bool:
        """An A/B window: the candidate side's, its partner the same mode on the reference side."""
        return self.partner is not None and self.partner.ab_side == "reference"

    @property
    def sample_keys(self) -> list[str]:
        """One key per request (prompt id and repeat), so two runs pair request by request."""
        return [r.request_id.split("/", 2)[-1] for r in self.records]

    @property
    def decode_tokens_per_s(self) -> list[float]:
        return [r.decode_tokens_per_s for r in self.records if r.decode_tokens_per_s is not None]

    @property
    def timed_samples(self) -> dict[str, float]:
        """Decode tok/s by request key, for the requests that have one (see :attr:`untimed`)."""
        return {key: r.decode_tokens_per_s for key, r in zip(self.sample_keys, self.records)
                if r.decode_tokens_per_s is not None}

    @property
    def untimed(self) -> dict[str, str]:
        """Requests without a decode rate, by key, with why (they drop out of the speed gates)."""
        return {key: r.no_decode_rate_reason for key, r in zip(self.sample_keys, self.records)
                if r.decode_tokens_per_s is None}

    @property
    def client_decode_tokens_per_s(self) -> float | None:
        """The client's counterpart of ``server_decode_tokens_per_s`` (see client_decode_rate)."""
        return client_decode_rate(r.tpot_s for r in self.records)

    @property
    def aggregate_tokens_per_s(self) -> float:
        """All generated tokens over the window's wall time (what matters at concurrency > 1)."""
        if self.wall_s <= 0:
            return 0.0
        return sum(r.completion_tokens for r in self.records) / self.wall_s

    @property
    def outputs(self) -> dict[str, str]:
        return {key: r.text for key, r in zip(self.sample_keys, self.records)}

    def to_dict(self) -> dict[str, Any]:
        steps = self.server_decode_steps
        return {
            "rig": self.rig, "mode": self.mode, "prompt_class": self.prompt_class,
            "concurrency": self.concurrency, "wall_s": self.wall_s,
            "aggregate_tokens_per_s": self.aggregate_tokens_per_s,
            "server_decode_tokens_per_s": self.server_decode_tokens_per_s,
            "server_metric_source": self.server_metric_source,
            "acceptance": self.acceptance.to_dict() if self.acceptance else None,
            "records": [r.to_dict() for r in self.records],
            "arrangement": self.arrangement, "role": self.role, "ab_side": self.ab_side,
            "partner": self.partner.to_dict() if self.partner is not None else None,
            "groups": list(self.groups),
            "first_look_share": self.first_look_share, "follow_up": self.follow_up,
            **({"follow_up_skipped": self.follow_up_skipped} if self.follow_up_skipped else {}),
            **({"server_decode_steps": steps} if steps is not None else {}),
            **self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClassMeasurement:
        # Older reports: "design" for "arrangement", "pairs" for "groups", and "side".
        side = data.get("side")
        return cls(
            rig=data["rig"], mode=data["mode"], prompt_class=data["prompt_class"],
            concurrency=data["concurrency"], wall_s=data["wall_s"],
            records=[RequestRecord.from_dict(r) for r in data["records"]],
            acceptance=(AcceptanceStats.from_dict(data["acceptance"])
                        if data.get("acceptance") else None),
            server_decode_tokens_per_s=data.get("server_decode_tokens_per_s"),
            server_metric_source=data.get("server_metric_source"),
            server_decode_steps=data.get("server_decode_steps"),
            arrangement=data.get("arrangement", data.get("design", "solo")),
            role=data.get("role", "partner" if side in ("partner", "reference") else "subject"),
            ab_side=data["ab_side"] if "ab_side" in data else (
                "reference" if side == "reference" else
                "candidate" if (data.get("partner") or {}).get("side") == "reference" else None),
            partner=cls.from_dict(data["partner"]) if data.get("partner") else None,
            groups=list(data.get("groups", data.get("pairs", []))),
            first_look_share=data.get("first_look_share"), follow_up=data.get("follow_up"),
            follow_up_skipped=data.get("follow_up_skipped"),
            extra={key: data[key] for key in ("telemetry", "alternation", "start_order")
                   if data.get(key)})


def drafts_expected(mode: Mode) -> bool:
    """Whether every window of ``mode`` makes drafts: not where its speculation schedule
    (specgate.advise.schedule) has k = 0 at some batch sizes."""
    ranges = (mode.speculative_config or {}).get("num_speculative_tokens_per_batch_size") or []
    return not any(isinstance(r, (list, tuple)) and len(r) == 3 and r[2] == 0 for r in ranges)


def client_decode_rate(tpots: Iterable[float | None]) -> float | None:
    """1 / mean time per output token over a window's requests, as the server's figure is (a mean
    of per-request tok/s would overweight fast requests)."""
    known = [t for t in tpots if t]
    return 1 / statistics.fmean(known) if known else None


def build_requests(rig: Rig, mode: Mode, prompt_class: PromptClass, *, repeat: int = 0,
                   tag: str = "") -> list[GenerationRequest]:
    """One round: every prompt of the class once (``repeat`` numbers the round in request ids)."""
    protocol = rig.protocol
    requests = []
    for prompt in prompt_class.prompts:
        text_fields: dict[str, Any] = (
            {"messages": [{"role": "user", "content": prompt.text}]} if protocol.api == "chat"
            else {"prompt": prompt.text})
        requests.append(GenerationRequest(
            request_id=f"{mode.name}/{prompt_class.name}/{tag}{prompt.id}#{repeat}",
            mode=mode.name, prompt_class=prompt_class.name, prompt_id=prompt.id,
            model=rig.served_model_name, max_tokens=protocol.max_tokens,
            temperature=protocol.temperature, seed=protocol.seed, ignore_eos=protocol.ignore_eos,
            **text_fields))
    return requests


class WindowProgress:
    """A window's per-request progress callback: a line every PROGRESS_EVERY_S and at the end."""

    def __init__(self, progress: Callable[[str], None], label: str, total: int, *,
                 name_mode: bool = False) -> None:
        self.progress, self.label, self.total, self.name_mode = progress, label, total, name_mode
        self.done = 0
        self.started = self.last_line = time.monotonic()

    def restart(self) -> float:
        self.started = self.last_line = time.monotonic()
        return self.started

    def __call__(self, record: RequestRecord) -> None:
        now = time.monotonic()
        self.done += 1
        if now - self.last_line < PROGRESS_EVERY_S and self.done < self.total:
            return
        self.last_line = now
        tps = record.decode_tokens_per_s
        who = f"{record.mode} " if self.name_mode else ""
        self.progress(f"{self.label}: {self.done}/{self.total} requests, "
                      f"{now - self.started:.0f}s elapsed"
                      + (f", last {who}{tps:.1f} tok/s" if tps else ""))


# Runs ``round_fn`` ``rounds`` times: a plain loop, or pytest-benchmark's pedantic runner.
RoundRunner = Callable[[Callable[[], None], int], None]


def loop_rounds(round_fn: Callable[[], None], rounds: int) -> None:
    for _ in range(rounds):
        round_fn()


class Measurer:
    """Runs measurement windows (see the module's doc); remembers which servers are warm."""

    def __init__(self, rig: Rig, *, progress: Callable[[str], None] | None = None,
                 telemetry: Callable[[list[Any]], Any] | None = None,
                 follow_up: Callable[[ClassMeasurement], str | None] | None = None,
                 deadline: float | None = None) -> None:
        self.rig = rig
        self.progress = progress or (lambda line: None)
        # Asked after a duet's planned rounds whether a gate is left undecided: why, or None.
        self.follow_up = follow_up
        # time.monotonic() by which follow-up rounds must end (--specgate-session-budget).
        self.deadline = deadline
        # Makes a telemetry sampler per window from its servers (None: no telemetry).
        self.telemetry = telemetry
        # Servers already warmed up, keyed on the object itself (an id() can be reused).
        self._warm: weakref.WeakSet[Any] = weakref.WeakSet()
        # Median seconds per request seen on each server (warm-ups, windows).
        self._request_s: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def measure(self, server: Server, mode: Mode, prompt_class: PromptClass, concurrency: int,
                *, run_rounds: RoundRunner = loop_rounds) -> ClassMeasurement:
        server.check_alive()
        label = f"mode {mode.name}, class {prompt_class.name}, concurrency {concurrency}"
        try:
            return self._measure(server, mode, prompt_class, concurrency, label, run_rounds)
        except RequestError as exc:
            raise _request_failure(exc, label, [server], tail=20) from None

    def _client(self, server: Server) -> StreamingClient:
        protocol = self.rig.protocol
        # A stand-in server (the fast tier's) carries its own httpx transport; a real one has none.
        return StreamingClient(server.base_url, api_key=server.api_key,
                               read_timeout=protocol.read_timeout_s,
                               request_deadline=protocol.request_timeout_s,
                               transport=getattr(server, "transport", None))

    async def _metrics(self, server: Server):
        async with self._client(server) as client:
            return parse_metrics(await client.get_text("/metrics"),
                                 source=f"{server.base_url}/metrics")

    async def _run(self, server: Server, requests: list[GenerationRequest], concurrency: int,
                   on_done: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
        async with self._client(server) as client:
            return await run_requests(client, requests, concurrency=concurrency, on_done=on_done)

    def _needs_warm_up(self, server: Server) -> bool:
        return server not in self._warm and bool(self.rig.protocol.warmup_requests)

    def _warm_up(self, server: Server, mode: Mode, prompt_class: PromptClass, label: str) -> None:
        protocol = self.rig.protocol
        if not self._needs_warm_up(server):
            return
        warmup = build_requests(self.rig, mode, prompt_class,
                                tag="warmup-")[: protocol.warmup_requests]
        self.progress(f"{label}: {len(warmup)} warm-up request(s) on {server.label}")
        got = asyncio.run(self._run(server, warmup, 1))
        self._note_request_time(server, got)
        self._warm.add(server)

    def _note_request_time(self, server: Server, records: list[RequestRecord]) -> None:
        """Remember how long a request takes on ``server`` (to size an alternation's block)."""
        times = [r.finished_at - r.started_at for r in records if r.finished_at and r.started_at]
        if times:
            self._request_s[server] = statistics.median(times)

    def _alternation_block(self, servers: Iterable[Server], sleeper: Any, concurrency: int,
                           keys: int) -> int:
        """An alternation window's block: the protocol's, else alternation_block's for it."""
        protocol = self.rig.protocol
        if protocol.alternation_block is not None:  # a multiple of every concurrency
            return protocol.alternation_block
        known = [self._request_s[s] for s in servers if s in self._request_s]
        # Unknown (no warm-up): a request at 100 tok/s, a guess the next windows replace.
        request_s = max(known) if known else protocol.max_tokens / 100
        return alternation_block(request_s=request_s, swap_s=sleeper.typical_swap_s(),
                                 concurrency=concurrency, keys=keys)

    def _measure(self, server: Server, mode: Mode, prompt_class: PromptClass, concurrency: int,
                 label: str, run_rounds: RoundRunner) -> ClassMeasurement:
        protocol = self.rig.protocol
        self._warm_up(server, mode, prompt_class, label)
        records: list[RequestRecord] = []
        on_done = WindowProgress(self.progress, label, protocol.repeats * len(prompt_class.prompts))

        def one_round() -> None:
            repeat = len(records) // len(prompt_class.prompts)
            requests = build_requests(self.rig, mode, prompt_class, repeat=repeat)
            records.extend(asyncio.run(self._run(server, requests, concurrency, on_done)))

        before = asyncio.run(self._metrics(server))
        started = on_done.restart()
        with self._telemetry([server]) as sampler:
            run_rounds(one_round, protocol.repeats)
        wall_s = time.monotonic() - started
        after = asyncio.run(self._metrics(server))
        delta = metrics_delta(before, after, label=label)
        return _with_telemetry(sampler, _measurement(self.rig, mode, prompt_class, concurrency,
                                                     records, delta, wall_s))

    def _telemetry(self, servers: list[Any]):
        return self.telemetry(servers) if self.telemetry is not None else contextlib.nullcontext()

    def measure_duet(self, duet: Duet, prompt_class: PromptClass, concurrency: int, *,
                     run_rounds: RoundRunner = loop_rounds,
                     sleeper: Any = None) -> ClassMeasurement:
        """One window on the two live servers of ``duet``, requests alternated: the subject's window
        with the partner's in ``partner``. ``sleeper``: a SleepController for an alternation."""
        subject, partner = duet.subject, duet.partner
        partner_role = "reference side" if duet.ab else "partner"
        label = (f"mode {duet.mode.name} vs {duet.partner_mode.name} ({partner_role}), class "
                 f"{prompt_class.name}, concurrency {concurrency}")
        if sleeper is not None:
            sleeper.check()
        for server in (subject, partner):
            server.check_alive()
        try:
            return self._measure_duet(duet, prompt_class, concurrency, label, run_rounds, sleeper)
        except RequestError as exc:
            raise _request_failure(exc, label, [subject, partner], tail=10) from None

    @staticmethod
    def _before_window(sleeper: Any, subject: Server, partner: Server) -> dict[str, Any] | None:
        """The swap before an alternation's window: no measured turn is a server's first sleep."""
        awake = sleeper.awake
        if awake is subject or awake is partner:
            if sleeper.has_slept(awake):
                return None
            return asyncio.run(sleeper.activate(partner if awake is subject else subject))
        return asyncio.run(sleeper.activate(partner))

    def _warm_up_duet(self, duet: Duet, prompt_class: PromptClass, label: str,
                      sleeper: Any) -> list[dict[str, Any]]:
        """Warm both servers up (the awake one first); returns an alternation's swaps meanwhile."""
        sides = [(duet.subject, duet.mode), (duet.partner, duet.partner_mode)]
        if sleeper is not None and sleeper.awake is duet.partner:
            sides.reverse()
        before_window: list[dict[str, Any]] = []
        for server, server_mode in sides:
            if sleeper is not None and self._needs_warm_up(server):
                swap = asyncio.run(sleeper.activate(server))
                if swap is not None:
                    before_window.append({**swap, "for": f"{server.label}'s warm-up"})
            self._warm_up(server, server_mode, prompt_class, label)
        if sleeper is not None:
            swap = self._before_window(sleeper, duet.subject, duet.partner)
            if swap is not None:
                before_window.append({**swap, "for": "the window's first turn"})
        return before_window

    def _measure_duet(self, duet: Duet, prompt_class: PromptClass, concurrency: int, label: str,
                      run_rounds: RoundRunner, sleeper: Any) -> ClassMeasurement:
        protocol = self.rig.protocol
        before_window = self._warm_up_duet(duet, prompt_class, label, sleeper)
        window = _DuetWindow(self, duet, prompt_class, concurrency, label, sleeper, before_window)
        extra = (self.rig.follow_up_rounds(duet.mode.name, prompt_class.name, backfire=not duet.ab)
                 if self.follow_up is not None else 0)
        window.share = protocol.repeats / (protocol.repeats + extra) if extra else None
        window.before = window.snapshot()
        started = window.on_done.restart()
        reason = skipped = None
        with self._telemetry([duet.subject, duet.partner]) as sampler:
            run_rounds(window.one_round, protocol.repeats)
            if extra and self.follow_up is not None:
                wall_s = time.monotonic() - started
                reason = self.follow_up(window.assemble(window.snapshot(), wall_s, None))
                if reason is not None:
                    skipped = self._over_budget(extra * wall_s / protocol.repeats, extra)
                    if skipped is not None:
                        self.progress(f"{label}: follow-up skipped: {skipped} "
                                      f"(it was for: {reason})")
                        reason = None
                    else:
                        window.on_done.total += 2 * extra * len(prompt_class.prompts)
                        self.progress(f"{label}: {extra} follow-up round(s): {reason}")
                        # pytest-benchmark's rounds are the planned ones
                        loop_rounds(window.one_round, extra)
        result = window.assemble(window.snapshot(), time.monotonic() - started, sampler)
        for side in ("subject", "partner"):
            self._note_request_time(window.servers[side], window.records[side])
        result.follow_up = result.partner.follow_up = reason
        result.follow_up_skipped = result.partner.follow_up_skipped = skipped
        return result

    def _over_budget(self, expected_s: float, rounds: int) -> str | None:
        """Why ``rounds`` follow-up rounds taking ``expected_s`` miss the deadline, or None."""
        if self.deadline is None or expected_s <= (left := self.deadline - time.monotonic()):
            return None
        return (f"its {rounds} round(s) would take ~{format_elapsed(expected_s)} at this window's "
                "pace and the session's time budget (--specgate-session-budget) has "
                f"{format_elapsed(max(0.0, left))} left")


class _DuetWindow:
    """One duet window being taken: its servers, records, groups and swaps; ``one_round`` passes
    over the prompts on both sides, ``assemble`` makes both sides' measurements."""

    def __init__(self, measurer: Measurer, duet: Duet, prompt_class: PromptClass,
                 concurrency: int, label: str, sleeper: Any,
                 before_window: list[dict[str, Any]]) -> None:
        self.measurer, self.duet, self.prompt_class = measurer, duet, prompt_class
        self.concurrency, self.label, self.sleeper = concurrency, label, sleeper
        self.before_window = before_window
        self.servers = {"subject": duet.subject, "partner": duet.partner}
        self.records: dict[str, list[RequestRecord]] = {"subject": [], "partner": []}
        self.groups: list[dict[str, Any]] = []
        self.swaps: list[dict[str, Any]] = []
        self.before: dict[str, Any] = {}  # the /metrics snapshot before the window, per side
        self.share: float | None = None  # the first look's share of the rounds
        protocol = measurer.rig.protocol
        keys = len(prompt_class.prompts)
        self.on_done = WindowProgress(measurer.progress, label, 2 * protocol.repeats * keys,
                                      name_mode=True)
        self.block = (measurer._alternation_block(self.servers.values(), sleeper, concurrency, keys)
                      if sleeper is not None else None)
        if self.block is not None:
            measurer.progress(f"{label}: alternation in turns of up to {self.block} request(s) "
                              f"per side (a swap ~{sleeper.typical_swap_s():.1f}s)")

    def snapshot(self) -> dict[str, Any]:
        return {side: asyncio.run(self.measurer._metrics(server))
                for side, server in self.servers.items()}

    def one_round(self) -> None:
        asyncio.run(self._round(len(self.records["subject"]) // len(self.prompt_class.prompts)))

    def _at_s(self) -> float:
        return round(time.monotonic() - self.on_done.started, 3)

    async def _swap_to(self, side: str) -> None:
        """An alternation's swap before a turn, outside every request's timing. No warm-up after
        a wake: it moved a window's ratio by at most 0.2 % (docs/alternation.md)."""
        swap = await self.sleeper.activate(self.servers[side])
        if swap is not None:
            self.swaps.append({**swap, "side": side, "at_s": self._at_s()})

    async def _round(self, repeat: int) -> None:
        measurer, duet, sleeper = self.measurer, self.duet, self.sleeper
        protocol = measurer.rig.protocol
        awake = None if sleeper is None else next(
            (side for side, server in self.servers.items() if server is sleeper.awake), None)
        steps = plan(build_requests(measurer.rig, duet.mode, self.prompt_class, repeat=repeat),
                     build_requests(measurer.rig, duet.partner_mode, self.prompt_class,
                                    repeat=repeat),
                     concurrency=self.concurrency, seed=(protocol.seed or 0) + repeat,
                     block=self.block, first=awake)
        async with measurer._client(duet.subject) as a, measurer._client(duet.partner) as b:
            clients = {"subject": a, "partner": b}
            last_side = None
            for step in steps:
                if protocol.settle_s and sleeper is None and last_side not in (None, step.side):
                    # let the server that just answered go idle first (Protocol.settle_s)
                    await asyncio.sleep(protocol.settle_s)
                if sleeper is not None:
                    await self._swap_to(step.side)
                last_side = step.side
                if step.side == steps[2 * step.group].side:  # the first step of its group
                    self.groups.append({"group": len(self.groups), "first": step.side,
                                        "started_s": self._at_s()})
                got = await run_requests(clients[step.side], step.items,
                                         concurrency=self.concurrency, on_done=self.on_done)
                self.records[step.side].extend(got)

    def assemble(self, after: dict[str, Any], wall_s: float, sampler: Any) -> ClassMeasurement:
        duet, sleeper = self.duet, self.sleeper
        windows = {}
        for side, side_mode in (("subject", duet.mode), ("partner", duet.partner_mode)):
            delta = metrics_delta(self.before[side], after[side],
                                  label=f"{self.label}, {side} {self.servers[side].label}")
            windows[side] = _measurement(
                self.measurer.rig, side_mode, self.prompt_class, self.concurrency,
                list(self.records[side]), delta, wall_s,
                arrangement="duet" if sleeper is None else "alternation",
                role=side, first_look_share=self.share,
                ab_side=({"subject": "candidate", "partner": "reference"}[side]
                         if duet.ab else None))
        result = _with_telemetry(sampler, windows["subject"])
        result.partner = _with_telemetry(sampler, windows["partner"])
        result.groups = list(self.groups)
        if sleeper is not None:
            swap_s = sum(s["sleep_s"] + s["wake_s"] for s in self.swaps)
            result.extra["alternation"] = result.partner.extra["alternation"] = {
                "block": self.block, "swaps": list(self.swaps), "swap_s": round(swap_s, 3),
                "swap_share": round(swap_s / wall_s, 4) if wall_s > 0 else None,
                "before_window": self.before_window,
                "levels": {t.server.label: t.level for t in sleeper.sleepers
                           if any(t.server is s for s in self.servers.values())}}
        return result


def _measurement(rig: Rig, mode: Mode, prompt_class: PromptClass, concurrency: int,
                 records: list[RequestRecord], delta: MetricsDelta, wall_s: float,
                 **labels: Any) -> ClassMeasurement:
    """A window's measurement of ``mode`` from its records and its /metrics delta."""
    rate = server_decode_tokens_per_s(delta)
    return ClassMeasurement(
        rig=rig.name, mode=mode.name, prompt_class=prompt_class.name, concurrency=concurrency,
        records=records,
        acceptance=AcceptanceStats.from_delta(delta, drafts_expected=drafts_expected(mode)),
        server_decode_tokens_per_s=rate.value if rate else None,
        server_metric_source=rate.source if rate else None, wall_s=wall_s,
        server_decode_steps=server_decode_steps(delta), **labels)


def _request_failure(exc: RequestError, label: str, servers: list[Server], *,
                     tail: int) -> Exception:
    """A request failing because its server died is a server failure: say so; else the request's
    error with the last lines of the servers' logs."""
    for server in servers:
        try:
            server.check_alive()
        except ServerDiedError as died:
            return ServerDiedError(f"{died}\n(while measuring {label}: {exc})")
    if len(servers) == 1:
        return RequestError(f"{exc}\nLast lines of the server log:\n{servers[0].log_tail(tail)}")
    logs = "\n".join(f"{server.label}:\n{server.log_tail(tail)}" for server in servers)
    return RequestError(f"{exc}\nLast lines of the server logs:\n{logs}")


def _with_telemetry(sampler: Any, m: ClassMeasurement) -> ClassMeasurement:
    """Attach what the sampler saw during the window and during each of its requests."""
    if sampler is None or not m.records:
        return m
    start, end = min(r.started_at for r in m.records), max(r.finished_at for r in m.records)
    m.extra["telemetry"] = {
        "window": sampler.summary(start, end),
        "requests": {key: sampler.summary(r.started_at, r.finished_at)
                     for key, r in zip(m.sample_keys, m.records)}}
    return m
