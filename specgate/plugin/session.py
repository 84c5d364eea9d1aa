"""One specgate run's state: its windows, gate results, servers, queued baseline updates and, under
xdist, the workers' reports; one per pytest session, the fixtures thin wrappers over it."""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgate.decide.outcome import Family, outcome_of_kind
from specgate.errors import SpecgateError
from specgate.lazy import protocol as measure
from specgate.lazy import server, verdicts
from specgate.measure.telemetry import window_sampler
from specgate.plugin.inputs import check_baselines_path, check_side_pythons
from specgate.plugin.resolve import SessionOptions, resolve_run
from specgate.plugin.workers import share, shared_path, wait_for_window
from specgate.report import run_report
from specgate.store.pending import PendingUpdates

# built in every pytest run, perf tests or not: heavy modules load at first need (specgate.lazy)
if TYPE_CHECKING:
    from specgate.config.rig import Mode, PromptClass
    from specgate.decide.settings import RunSettings, WindowKey
    from specgate.decide.verdict import GateResult
    from specgate.measure.protocol import ClassMeasurement, Measurer
    from specgate.store.baselines import BaselineEntry, Fingerprint


@dataclass
class SpecgateSession:
    options: SessionOptions
    progress: Callable[[str], None] = lambda line: None
    measurements: dict[WindowKey, ClassMeasurement] = field(default_factory=dict)
    failures: dict[WindowKey, BaseException] = field(default_factory=dict)
    # servers that could not start: {"server": label, "error": message}
    server_failures: list[dict[str, str]] = field(default_factory=list)
    results: list[GateResult] = field(default_factory=list)
    # gates that decided nothing: {"gate", "mode", "prompt_class", "concurrency", "kind", ...}
    undecided: list[dict[str, Any]] = field(default_factory=list)
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    live_servers: int = 0  # servers of this session up right now (a duet has two)
    pending_updates: PendingUpdates = field(default_factory=PendingUpdates)
    deferred: list[WindowKey] = field(default_factory=list)  # gates left to the controller
    deferred_tests: dict[str, list[Any]] = field(default_factory=dict)  # node id -> gate, window
    worker_reports: list[dict[str, Any]] = field(default_factory=list)  # controller: from workers
    deferred_failed: bool = False  # controller: a deferred cross-mode gate failed
    config_error: SpecgateError | None = None  # a file refused at parametrization (a usage error)
    start_order: dict[str, str] = field(default_factory=dict)  # A/B: mode -> side started first
    started_first: dict[str, Any] = field(default_factory=dict)  # mode -> A/B candidate
    selected_tests: list[tuple[str, str, str, int]] | None = None  # (gate, mode, class, c)
    worker_refusal: str | None = None  # why this xdist worker may start no server
    _start_seed: int | None = None
    _pythons_import_vllm: bool = False  # the A/B sides' pythons import vLLM (checked once)
    _settings: RunSettings | None = None
    _measurer: Measurer | None = None

    @property
    def settings(self) -> RunSettings:
        """The run's settings (specgate.plugin.resolve.resolve_run), resolved at first need."""
        if self._settings is None:
            self._settings, refusal = resolve_run(self.options)
            self.worker_refusal = self.worker_refusal or refusal
        return self._settings

    def validate_inputs(self, *, imports: bool = True) -> None:
        """Check every input file and the A/B sides' pythons before any server starts (one
        ConfigError naming file and key); ``imports``: also try `import vllm` on each side."""
        rig = self.settings.rig
        check_baselines_path(self.options)
        imports = imports and not self._pythons_import_vllm
        self._pythons_import_vllm |= check_side_pythons(self.options, rig, self.progress,
                                                        imports=imports)

    @property
    def measurer(self) -> Measurer:
        if self._measurer is None:
            run, budget = self.settings, self.options.time_budget_s
            self._measurer = measure.Measurer(
                run.rig, progress=self.progress, telemetry=window_sampler(run.rig.tier, run.gpus),
                follow_up=lambda m: verdicts.follow_up_said(run.window(
                    m.mode, m.prompt_class, m.concurrency), m, self.gates_selected_for(m)),
                deadline=None if budget is None else self.options.started_at + budget)
        return self._measurer

    def server_spec(self, mode: Mode, side: str | None = None):
        """The ServerSpec of ``mode``'s server (on an A/B ``side``)."""
        rig = self.settings.rig
        return server.spec_for_mode(rig, mode, log_dir=self.options.run_dir,
                                    gpus=self.settings.worker_gpus,
                                    side=getattr(rig.ab, side) if (side and rig.ab) else None,
                                    side_name=side)

    def modes_to_run(self) -> list[Mode]:
        """The modes to measure: the reference first (last on a duet rig: its duets measure it)."""
        rig = self.settings.rig
        if self.options.attach_url:
            return [rig.mode(self.options.attach_mode or rig.reference_mode)]
        last = rig.comparing == "duet"
        return sorted(rig.modes, key=lambda m: (m.name == rig.reference_mode) == last)

    def reference_from_duets(self, prompt_class: str, concurrency: int) -> ClassMeasurement | None:
        """Duet rigs: the reference window of a class, from the first duet that measured it."""
        reference = self.settings.rig.reference_mode
        key = (reference, prompt_class, concurrency)
        if key in self.measurements:
            return self.measurements[key]
        for (_mode, cls, concurrency_of), m in self.measurements.items():
            if (cls, concurrency_of) == (prompt_class, concurrency) and m.partner is not None \
                    and m.partner.mode == reference and not m.ab:
                self.measurements[key] = m.partner
                return m.partner
        return None

    def plan_family(self, tests: list[tuple[str, str, str, int]]) -> None:
        """Fix the windows' confidence for the selected gate ``tests`` before any server starts (a
        left-out gate's test, kept to measure a window other gates read, is not of the family)."""
        self.selected_tests = list(tests)
        left_out = self.settings.rig.gates.left_out
        self._settings = self.settings.for_selection([t for t in tests if t[0] not in left_out])

    def gates_selected_for(self, m: Any) -> set[str] | None:
        """The selected gates of window ``m`` (None before the selection is known: every gate)."""
        if self.selected_tests is None:
            return None
        left_out = self.settings.rig.gates.left_out
        return {g for g, mode, prompt_class, c in self.selected_tests
                if (mode, prompt_class, c) == (m.mode, m.prompt_class, m.concurrency)
                and g not in left_out}

    @property
    def start_seed(self) -> int:
        """The A/B start order's seed: --specgate-start-seed, else drawn once."""
        if self._start_seed is None:
            given = self.options.start_seed
            self._start_seed = given if given is not None else secrets.randbelow(10**6)
        return self._start_seed

    def first_side(self, mode: str) -> str:
        """Which A/B side starts ``mode``'s server first, by the seed: start order moves a server
        about 1 %, which a fixed order would put on one side every run."""
        side = self.options.first_side or random.Random(f"{self.start_seed}:{mode}").choice(
            ("reference", "candidate"))
        self.start_order[mode] = side
        return side

    def measure(self, server: Any, mode: Mode, prompt_class: PromptClass, concurrency: int, *,
                partner: Any = None, partner_mode: Mode | None = None, ab: bool = False,
                **kwargs: Any) -> ClassMeasurement:
        """Measure a window once per session (a failure too). With a ``partner`` server, a duet."""
        key = (mode.name, prompt_class.name, concurrency)
        if key in self.failures:
            raise self.failures[key]
        if key not in self.measurements:
            try:
                if partner is not None:
                    self.measurements[key] = self.measurer.measure_duet(
                        measure.Duet(server, partner, mode, partner_mode or mode, ab), prompt_class,
                        concurrency, **kwargs)
                else:
                    self.measurements[key] = self.measurer.measure(server, mode, prompt_class,
                                                                   concurrency, **kwargs)
            except SpecgateError as exc:
                self.failures[key] = exc
                self._share(key, {"error": str(exc)})
                raise
            if ab and mode.name in self.start_order:  # an A/B window
                order = {"first": self.start_order[mode.name], "seed": self.start_seed}
                self.measurements[key].extra["start_order"] = order
            self._share(key, self.measurements[key].to_dict())
            self._write_partial_report()
        return self.measurements[key]

    def _share(self, key: WindowKey, data: dict[str, Any]) -> None:
        if self.options.worker_id is not None:  # one process: memory is enough
            share(self.options.run_dir, key, data)

    def reference_measurement(self, prompt_class: str, concurrency: int, *,
                              wait_s: float | None = None) -> ClassMeasurement | None:
        """The no-speculation window of a class; under xdist, wait (bounded) for another's."""
        rig = self.settings.rig
        key = (rig.reference_mode, prompt_class, concurrency)
        if key in self.measurements or self.options.worker_id is None:
            return self.measurements.get(key)
        budget = wait_s if wait_s is not None else rig.startup_timeout_s + 3600
        data = wait_for_window(self.options.run_dir, key, budget, self.progress)
        if data is None and wait_s is None:
            where = shared_path(self.options.run_dir, key).parent
            data = {"error": f"the no-speculation window {key} did not appear in {where} within "
                             f"{budget:.0f}s"}
        if data is not None and "error" in data:
            self.failures.setdefault(key, SpecgateError(data["error"]))
        if data is None or "error" in data:
            return None
        self.measurements[key] = measure.ClassMeasurement.from_dict(data)
        return self.measurements[key]

    def record(self, result: GateResult) -> None:
        """Keep a gate's result: decided in ``results``, else in ``undecided`` (never as passed)."""
        result = verdicts.worded(result)
        if result.gating is None:
            window = self.settings.window(result.mode, result.prompt_class, result.concurrency)
            result.gating, why = window.gating[result.gate]
            result.gating_reason = verdicts.reason_text(why)
        if result.outcome.decided:
            self.results.append(result)
            return
        self.record_undecided(result.gate, result, result.undecided_kind, result.message,
                              result.details, declared=result.declared)
        if result.gating:
            self.undecided[-1].update(gating=result.gating, gating_reason=result.gating_reason)

    def record_undecided(self, gate: str, m: ClassMeasurement | GateResult, kind: str, message: str,
                         details: dict[str, Any] | None = None, *,
                         declared: str | None = None) -> None:
        """A gate that could not decide; ``details``: what it measured (ratio, interval)."""
        setting, why = self.settings.window(m.mode, m.prompt_class, m.concurrency).gating[gate]
        self.undecided.append({"gate": gate, "mode": m.mode, "prompt_class": m.prompt_class,
                               "concurrency": m.concurrency, "kind": kind,
                               "outcome": outcome_of_kind(kind).value,
                               "message": message, **({"details": details} if details else {}),
                               **({"declared": declared} if declared else {}),
                               **({"gating": setting,
                                   "gating_reason": verdicts.reason_text(why)} if setting else {})})

    def record_server_failure(self, label: str, error: BaseException) -> None:
        """A server that could not start (or be woken): the job broke."""
        self.server_failures.append({"server": label, "error": str(error) or type(error).__name__})
        self._write_partial_report()

    def queue_update(self, m: ClassMeasurement, entry: BaselineEntry) -> None:
        self.pending_updates.queue(self.settings.rig.name, m, entry)

    def flush_updates(self) -> Path | None:
        """Write every queued baseline at once, at the session's end."""
        return self.pending_updates.flush(self.options.baselines_path,
                                          new_history=self.options.update == "update",
                                          progress=self.progress)

    # -- xdist: what a worker sends the controller, and the controller's merge -----------------
    def worker_output(self) -> dict[str, Any]:
        return {"report": self.report_data(complete=True, merge=False),
                "updates": self.pending_updates.to_json()}

    def absorb_worker(self, output: dict[str, Any]) -> None:
        self.worker_reports.append(output["report"])
        self.pending_updates.absorb(output.get("updates", []))
        family = output["report"].get("family")
        if family is not None and self.settings.family is None:  # the controller collects nothing
            self._settings = self.settings.with_family(Family(
                family["gating_decisions"], family["confidence"], family["family_false_alarm"],
                family.get("undecided_red", False)))

    # -- the run's report (specgate.report.run_report) -------------------------------------------
    def report_data(self, *, complete: bool, merge: bool = True) -> dict[str, Any]:
        own = run_report.own_report(self, complete=complete)
        return run_report.merged(own, self.worker_reports) if merge else own

    @property
    def report_path(self) -> Path:
        return self.options.run_dir / run_report.REPORT_NAME

    def _write_partial_report(self) -> None:
        if self.options.worker_id is None:  # under xdist the controller writes the report
            self.write_report(complete=False)

    def write_report(self, *, complete: bool) -> Path:
        return run_report.write_report(self.report_data(complete=complete), self.options.run_dir)
