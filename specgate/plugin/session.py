"""One specgate run: the rig, the stored baselines, every measurement and gate result, the
queued baseline updates and the run directory. The plugin builds exactly one per pytest session
and the fixtures are thin wrappers over it (the pytest-benchmark pattern)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgate.decide.breakeven import from_report
from specgate.decide.outcome import OUTCOME_KINDS, Family, Outcome, outcome_of_kind
from specgate.errors import ConfigError, SpecgateError
from specgate.lazy import baselines, server, verdicts
from specgate.lazy import protocol as measure
from specgate.measure.telemetry import window_sampler
from specgate.plugin.resolve import SessionOptions, resolve_run

# The plugin builds a session in every pytest run of the environment, perf tests or not: the
# modules that bring pydantic, numpy and the HTTP clients load when the session first needs them
# (specgate.lazy).
if TYPE_CHECKING:
    from specgate.config.rig import Mode, PromptClass
    from specgate.decide.settings import RunSettings
    from specgate.decide.verdict import GateResult
    from specgate.measure.protocol import ClassMeasurement, Measurer
    from specgate.store.baselines import BaselineEntry, Fingerprint

MeasureKey = tuple[str, str, int]  # mode, prompt class, concurrency


@dataclass
class SpecgateSession:
    options: SessionOptions
    progress: Callable[[str], None] = lambda line: None
    measurements: dict[MeasureKey, ClassMeasurement] = field(default_factory=dict)
    failures: dict[MeasureKey, BaseException] = field(default_factory=dict)
    # servers that could not start: {"server": label, "error": message} (the job broke: exit_codes)
    server_failures: list[dict[str, str]] = field(default_factory=list)
    results: list[GateResult] = field(default_factory=list)
    # gates that decided nothing: {"gate", "mode", "prompt_class", "concurrency", "kind", "outcome",
    # "message"}; kind: specgate.decide.outcome's NOT_STORED | STORING, "fingerprint", "other machine",
    # "undecided", "too few drafts", specgate.decide.gates.HOST_PACE, "not run"; outcome: its
    # specgate.decide.outcome.Outcome's value (specgate.decide.outcome.KIND_OUTCOMES)
    undecided: list[dict[str, Any]] = field(default_factory=list)
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    live_servers: int = 0  # servers of this session up right now (a duet has two)
    pending_updates: dict[tuple[str, str, str, int], BaselineEntry] = field(default_factory=dict)
    # (mode, class, concurrency) whose cross-mode gates a worker left to the xdist controller
    deferred: list[MeasureKey] = field(default_factory=list)
    # worker: node id of each test that deferred its gate -> [gate, mode, class, concurrency]
    deferred_tests: dict[str, list[Any]] = field(default_factory=dict)
    # xdist controller: the finished workers' reports (see absorb_worker)
    worker_reports: list[dict[str, Any]] = field(default_factory=list)
    # xdist controller: a deferred cross-mode gate failed (the run exits as failed)
    deferred_failed: bool = False
    # a rig, mode or prompts file refused while the perf tests were parametrized (a usage error)
    config_error: SpecgateError | None = None
    # A/B: the side whose server started first, per mode ("reference" | "candidate"), by first_side
    start_order: dict[str, str] = field(default_factory=dict)
    started_first: dict[str, Any] = field(default_factory=dict)  # mode -> its A/B candidate server, started first
    _start_seed: int | None = None
    # (gate, mode, prompt class, concurrency) of every selected gate test (plan_family), None before
    selected_tests: list[tuple[str, str, str, int]] | None = None
    # why this xdist worker may start no server (its perf tests fail at setup with it); None where it may
    worker_refusal: str | None = None
    _pythons_import_vllm: bool = False  # the A/B sides' pythons were seen to import vLLM (once a session)
    _settings: RunSettings | None = None
    _measurer: Measurer | None = None

    @property
    def settings(self) -> RunSettings:
        """The run's settings (specgate.plugin.resolve.resolve_run), resolved at the run's first need of
        them and fixed at the family's confidence once the selection is known (:meth:`plan_family`)."""
        if self._settings is None:
            self._settings, refusal = resolve_run(self.options)
            self.worker_refusal = self.worker_refusal or refusal
        return self._settings

    def validate_inputs(self, *, imports: bool = True) -> None:
        """Read and validate every file the session needs (the rig, the mode library, the prompts,
        baselines.json) and the A/B sides' pythons before any server starts: a bad one is one
        ConfigError naming the file and the key, not a traceback in every test after the servers
        spent minutes (or, on a large rig, an hour) starting. Reading never writes: a file that
        fails stays as it was. ``imports``: also check that each side's python imports vLLM (seconds
        each; a run that starts no server, such as --collect-only, leaves it out)."""
        _ = self.settings
        self._check_baselines_path()
        self._check_side_pythons(imports=imports)

    def _check_baselines_path(self) -> None:
        """A --specgate-baselines file that does not exist would leave every stored-figure gate with
        nothing to compare (a typo reads as "not stored"); a run that stores creates it, in a folder
        that must exist for the write at the session's end."""
        path = self.options.baselines_path
        if path.exists() or not self.options.baselines_given:
            return
        if self.options.update == "off":
            raise ConfigError(path, None, "no such baselines file (--specgate-baselines): name an existing one, or "
                              "store this run's figures there with --specgate-update-baselines or "
                              "--specgate-regen-baselines")
        if not path.parent.is_dir():
            raise ConfigError(path, None, f"the folder {path.parent} does not exist, so this run's figures "
                              f"(--specgate-{self.options.update}-baselines) could not be stored there")

    def _check_side_pythons(self, *, imports: bool) -> None:
        """Each A/B side's python exists, is executable and (``imports``) imports vLLM, so that a
        mistyped environment fails here, not after the other side's server spent minutes loading."""
        rig = self.settings.rig
        if rig.ab is None or self.options.attach_url:
            return
        sides = {name: side for name in ("reference", "candidate") if (side := getattr(rig.ab, name)).python}
        for name, side in sides.items():
            if rig.argv_prefix[0] != sys.executable:  # specgate.serve.server.spec_for_mode swaps ${python} only
                raise ConfigError(rig.path, "server_command", f"the A/B {name} side's python "
                                  f"({self._side_python_key(name)}) replaces ${{python}} there, but it starts with "
                                  f'{rig.argv_prefix[0]!r}: begin it with "${{python}}"')
            _check_executable(side.python, self._side_python_refusal(name, side.python))
        if not imports or self._pythons_import_vllm:
            return
        for name, side in sides.items():
            self.progress(f"checking that the A/B {name} side's python imports vllm: {side.python}")
            _check_imports_vllm(side.python, {**os.environ, **rig.env, **side.env},
                                self._side_python_refusal(name, side.python))
        self._pythons_import_vllm = True

    def _side_python_key(self, name: str) -> str:
        return f"--specgate-ab-{name}-python" if self.options.ab is not None else f"ab.{name}.python"

    def _side_python_refusal(self, name: str, python: str) -> Callable[[str], ConfigError]:
        """The error for the A/B side ``name``'s python, naming where it was given: the command line's
        option (with the python's path), or the rig file and its key."""
        if self.options.ab is not None:
            return lambda message: ConfigError(python, None, f"the A/B {name} side's python "
                                               f"({self._side_python_key(name)}) {message}")
        return lambda message: ConfigError(self.settings.rig.path, self._side_python_key(name), f"{python!r} {message}")

    @property
    def measurer(self) -> Measurer:
        if self._measurer is None:
            run, budget = self.settings, self.options.time_budget_s
            self._measurer = measure.Measurer(
                run.rig, progress=self.progress, telemetry=window_sampler(run.rig.tier, run.gpus),
                follow_up=lambda m: verdicts.follow_up_said(run.window(m.mode, m.prompt_class, m.concurrency),
                                                               m, self.gates_selected_for(m)),
                deadline=None if budget is None else self.options.started_at + budget)
        return self._measurer

    def server_spec(self, mode: Mode, side: str | None = None):
        """The specgate.serve.server.ServerSpec of ``mode``'s server (on an A/B ``side``) in this session."""
        rig = self.settings.rig
        return server.spec_for_mode(rig, mode, log_dir=self.options.run_dir, gpus=self.settings.worker_gpus,
                                    side=getattr(rig.ab, side) if (side and rig.ab) else None, side_name=side)

    def modes_to_run(self) -> list[Mode]:
        """The modes this session measures, whatever the rig's order: the reference first (every
        other mode's backfire and lossless gates need its windows), except on a duet rig, where
        its server starts first and its windows are the reference side of the other modes' duets,
        so its own tests come last and reuse them (see :meth:`reference_from_duets`)."""
        rig = self.settings.rig
        if self.options.attach_url:
            return [rig.mode(self.options.attach_mode or rig.reference_mode)]
        last = rig.comparing == "duet"
        return sorted(rig.modes, key=lambda m: (m.name == rig.reference_mode) == last)

    def reference_from_duets(self, prompt_class: str, concurrency: int) -> ClassMeasurement | None:
        """Duet rigs: the reference mode's window of a class, taken as the reference side of the
        first duet that measured it (the reference server's requests in that window); None when no
        duet measured the class (the reference then gets a window of its own)."""
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
        """Fix every window's confidence for the family of the selected gate ``tests`` before any server
        starts (specgate.decide.settings.RunSettings.for_selection): every later interval, follow-up
        rounds' decisions included, uses it."""
        self.selected_tests = list(tests)
        self._settings = self.settings.for_selection(tests)

    def gates_selected_for(self, m: Any) -> set[str] | None:
        """The gates this session's selection runs on window ``m`` (None before the selection is known:
        every gate). A follow-up round is taken only for a gate that will be decided."""
        if self.selected_tests is None:
            return None
        return {g for g, mode, prompt_class, c in self.selected_tests
                if (mode, prompt_class, c) == (m.mode, m.prompt_class, m.concurrency)}

    @property
    def start_seed(self) -> int:
        """The seed of the A/B start order: --specgate-start-seed, else drawn once for the session."""
        if self._start_seed is None:
            import secrets

            self._start_seed = self.options.start_seed if self.options.start_seed is not None else secrets.randbelow(
                10**6)
        return self._start_seed

    def first_side(self, mode: str) -> str:
        """Which side of an A/B starts ``mode``'s server first: "reference" or "candidate", picked by
        the session's seed. Two fresh servers of one build read about 1 % apart by start order (the
        one started second: 1.0 % faster in an alternation, 1.0 % slower in a duet, on one GPU
        machine), an offset no interval of one window holds; a fixed order would put it on one side every
        run. Recorded in ``start_order`` (report.json, the summary)."""
        import random

        side = self.options.first_side or random.Random(f"{self.start_seed}:{mode}").choice(("reference", "candidate"))
        self.start_order[mode] = side
        return side

    def measure(self, server: Any, mode: Mode, prompt_class: PromptClass, concurrency: int, *,
                partner: Any = None, partner_mode: Mode | None = None, ab: bool = False,
                **kwargs: Any) -> ClassMeasurement:
        """Measure once per (mode, class, concurrency) per session; later tests reuse the result,
        and a failure is remembered so the same window is not retried for every gate. With a
        ``partner`` server the window is a duet (requests alternated with ``partner_mode`` there; with
        ``ab``, the same mode on the A/B's reference side)."""
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
                    self.measurements[key] = self.measurer.measure(server, mode, prompt_class, concurrency, **kwargs)
            except SpecgateError as exc:
                self.failures[key] = exc
                self._share(key, {"error": str(exc)})
                raise
            if ab and mode.name in self.start_order:  # an A/B window
                self.measurements[key].extra["start_order"] = {"first": self.start_order[mode.name],
                                                               "seed": self.start_seed}
            self._share(key, self.measurements[key].to_dict())
            self._write_partial_report()
        return self.measurements[key]

    # -- measurements shared between xdist workers through the run directory -----------------
    def _shared_path(self, key: MeasureKey) -> Path:
        mode, prompt_class, concurrency = key
        return self.options.run_dir / "measurements" / f"{mode}__{prompt_class}__c{concurrency}.json"

    def _share(self, key: MeasureKey, data: dict[str, Any]) -> None:
        if self.options.worker_id is None:
            return  # one process: memory is enough
        path = self._shared_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        baselines.atomic_write_json(path, data)

    def reference_measurement(self, prompt_class: str, concurrency: int, *,
                              wait_s: float | None = None) -> ClassMeasurement | None:
        """The no-speculation window of this class. Under xdist another worker may measure it:
        wait for its file (bounded, with progress), or for its failure."""
        key = (self.settings.rig.reference_mode, prompt_class, concurrency)
        if key in self.measurements or self.options.worker_id is None:
            return self.measurements.get(key)
        import time

        path = self._shared_path(key)
        budget = wait_s if wait_s is not None else self.settings.rig.startup_timeout_s + 3600
        started = last = time.monotonic()
        while not path.exists():
            now = time.monotonic()
            if now - started >= budget:
                if wait_s is None:
                    self.failures.setdefault(key, SpecgateError(
                        f"the no-speculation window {key} did not appear in {path.parent} within {budget:.0f}s"))
                return None
            if now - last >= 30:
                self.progress(f"waiting for another worker to measure {key[0]} on "
                              f"{prompt_class} ({now - started:.0f}s)")
                last = now
            time.sleep(min(1.0, max(0.01, budget - (now - started))))
        data = json.loads(path.read_text())
        if "error" in data:
            self.failures.setdefault(key, SpecgateError(data["error"]))
            return None
        self.measurements[key] = measure.ClassMeasurement.from_dict(data)
        return self.measurements[key]

    def record(self, result: GateResult) -> None:
        """Keep a gate's result: a decided one in ``results``, one that decided nothing in
        ``undecided`` (with its kind), so no report counts it as passed; its words are the report layer's."""
        result = verdicts.worded(result)
        if result.gating is None:
            window = self.settings.window(result.mode, result.prompt_class, result.concurrency)
            result.gating, result.gating_reason = window.gating[result.gate]
        if result.outcome.decided:
            self.results.append(result)
            return
        kind = result.details.get("undecided_kind") or (
            "too few drafts" if result.gate == "acceptance" and result.outcome is Outcome.UNDECIDED
            and not result.details.get("per_request")
            else OUTCOME_KINDS[result.outcome])
        self.record_undecided(result.gate, result, kind, result.message, result.details, declared=result.declared)
        if result.gating:
            self.undecided[-1].update(gating=result.gating, gating_reason=result.gating_reason)

    def record_undecided(self, gate: str, m: ClassMeasurement | GateResult, kind: str, message: str,
                         details: dict[str, Any] | None = None, *, declared: str | None = None) -> None:
        """A gate that could not decide (no stored figures, figures being stored, a refused fingerprint,
        an interval across its threshold): the report says so instead of counting it as passed.
        ``details``: what an undecided paired comparison measured (its ratio and interval), so that
        tables and plots show the number its message shows."""
        setting, why = self.settings.window(m.mode, m.prompt_class, m.concurrency).gating[gate]
        self.undecided.append({"gate": gate, "mode": m.mode, "prompt_class": m.prompt_class,
                               "concurrency": m.concurrency, "kind": kind, "outcome": outcome_of_kind(kind).value,
                               "message": message, **({"details": details} if details else {}),
                               **({"declared": declared} if declared else {}),
                               **({"gating": setting, "gating_reason": why} if setting else {})})

    def record_server_failure(self, label: str, error: BaseException) -> None:
        """A server that could not start (or be woken for its first turn): the job broke."""
        self.server_failures.append({"server": label, "error": str(error) or type(error).__name__})
        self._write_partial_report()

    def queue_update(self, m: ClassMeasurement, entry: BaselineEntry) -> None:
        self.pending_updates[(self.settings.rig.name, m.mode, m.prompt_class, m.concurrency)] = entry

    def flush_updates(self) -> Path | None:
        """Write every queued baseline at once, at the end of the session (nothing half-done if
        the run is interrupted before)."""
        if not self.pending_updates:
            return None
        _, said = baselines.merge_updates(self.options.baselines_path, self.pending_updates,
                                          new_history=self.options.update == "update")
        for (_, mode, prompt_class, concurrency), what in sorted(said.items()):
            self.progress(f"stored {mode} / {prompt_class} / c{concurrency} as {what}")
        self.pending_updates.clear()
        return self.options.baselines_path

    # -- xdist: what a worker sends, and the controller's merge ----------------------------------

    def worker_output(self) -> dict[str, Any]:
        return {"report": self.report_data(complete=True, merge=False),
                "updates": [[list(k), v.model_dump(mode="json")] for k, v in self.pending_updates.items()]}

    def absorb_worker(self, output: dict[str, Any]) -> None:
        self.worker_reports.append(output["report"])
        for key, entry in output.get("updates", []):
            self.pending_updates[tuple(key)] = baselines.BaselineEntry.model_validate(entry)  # type: ignore[index]
        family = output["report"].get("family")
        if family is not None and self.settings.family is None:  # the controller collects nothing: the workers'
            self._settings = self.settings.with_family(Family(family["gating_decisions"], family["confidence"],
                                                              family["family_false_alarm"],
                                                              family.get("undecided_red", False)))

    # -- the run's JSON report -------------------------------------------------------------
    def report_data(self, *, complete: bool, merge: bool = True) -> dict[str, Any]:
        own = self._own_report_data(complete=complete)
        if not merge or not self.worker_reports:
            return own
        seen = set()
        measurements = []
        for report in [own, *self.worker_reports]:
            for m in report["measurements"]:
                key = (m["mode"], m["prompt_class"], m["concurrency"])
                if key not in seen:  # a worker may hold a copy of another's reference window
                    seen.add(key)
                    measurements.append(m)
            own["fingerprints"].update(report["fingerprints"])
            own["servers"].update(report["servers"])
        own["measurements"] = measurements
        own["gates"] = [g for r in [own, *self.worker_reports] for g in r["gates"]]
        own["undecided"] = [u for r in [own, *self.worker_reports] for u in r.get("undecided", [])]
        failures = {(f["mode"], f["prompt_class"], f["concurrency"]): f
                    for r in [own, *self.worker_reports] for f in r["failures"]}
        own["failures"] = [f for k, f in failures.items() if k not in seen]
        own["server_failures"] = [f for r in [own, *self.worker_reports] for f in r.get("server_failures", [])]
        merged = {(w["mode"], w["prompt_class"], w["concurrency"]): w
                  for r in [*self.worker_reports, own] for w in r.get("settings", [])}
        own["settings"] = list(merged.values())
        if "family" not in own:  # the controller collects nothing: a worker counted the family
            own.update({k: r[k] for r in self.worker_reports for k in ("family", "gating") if k in r})
        orders = [r["start_order"] for r in [own, *self.worker_reports] if r.get("start_order")]
        if orders:  # each worker draws its own seed unless --specgate-start-seed gives one
            own["start_order"] = {"seed": orders[0]["seed"] if len({o["seed"] for o in orders}) == 1
                                  else sorted({o["seed"] for o in orders}),
                                  "first": {k: v for o in orders for k, v in o["first"].items()}}
        return own

    def _own_report_data(self, *, complete: bool) -> dict[str, Any]:
        run = self.settings
        rig = run.rig
        return {
            "specgate_report": 1,
            "complete": complete,
            "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "rig": {"name": rig.name, "tier": rig.tier, "model": rig.model,
                    "reference_mode": rig.reference_mode, "protocol": rig.protocol.model_dump(mode="json"),
                    "modes": {m.name: m.speculative_config for m in rig.modes}},
            "attached": self.options.attach_url is not None,
            "fingerprints": {k: v.model_dump(mode="json") for k, v in self.fingerprints.items()},
            "servers": self.servers,
            "measurements": [m.to_dict() for m in self.measurements.values()],
            "worker": self.options.worker_id,
            "deferred": [list(k) for k in dict.fromkeys(self.deferred)],
            "deferred_tests": self.deferred_tests,
            "failures": [{"mode": k[0], "prompt_class": k[1], "concurrency": k[2], "error": str(e)}
                         for k, e in self.failures.items()],
            "server_failures": list(self.server_failures),
            "gates": [r.to_dict() for r in self.results],
            "undecided": list(self.undecided),
            "outcome_policy": dict(run.outcome_policy),
            **({"start_order": {"seed": self.start_seed, "first": dict(self.start_order)}} if self.start_order else {}),
            **({"family": run.family.to_dict()} if run.family is not None else {}),
            **({"red_runs": run.red_runs.to_dict()} if run.red_runs is not None else {}),
            **({"gating": dict(run.gating)} if run.gating else {}),
            # the settings of the selected windows: every window a gate of this run decides on
            "settings": [run.window(*key).to_dict()
                         for key in dict.fromkeys((m, c, n) for _, m, c, n in self.selected_tests or [])],
        }

    @property
    def report_path(self) -> Path:
        return self.options.run_dir / "report.json"

    def _write_partial_report(self) -> None:
        if self.options.worker_id is None:  # under xdist the controller writes the report
            self.write_report(complete=False)

    def write_report(self, *, complete: bool) -> Path:
        self.options.run_dir.mkdir(parents=True, exist_ok=True)
        data = self.report_data(complete=complete)
        data["breakeven"] = from_report(data)  # derived, for readers of report.json; renderers recompute it
        baselines.atomic_write_json(self.report_path, data)
        return self.report_path


# `import vllm` takes seconds (torch, transformers); a cold disk or a busy host can make it a minute.
VLLM_IMPORT_TIMEOUT_S = 180.0


def _check_executable(python: str, refused: Callable[[str], ConfigError]) -> None:
    """``python`` names an executable file: a path, or a name found on PATH (as the server's start would)."""
    found = python if os.sep in python else shutil.which(python)
    if found is None:
        raise refused("is not on PATH: give the path of the environment's python, e.g. /venvs/vllm-next/bin/python")
    path = Path(found)
    if not path.exists():
        raise refused("does not exist: give the path of the environment's python, e.g. /venvs/vllm-next/bin/python")
    if path.is_dir():
        raise refused("is a folder: give the python inside it, e.g. its bin/python")
    if not os.access(path, os.X_OK):
        raise refused("is not executable")


def _check_imports_vllm(python: str, env: dict[str, str], refused: Callable[[str], ConfigError]) -> None:
    """``python -c "import vllm"`` succeeds within VLLM_IMPORT_TIMEOUT_S, in the server's environment."""
    try:
        done = subprocess.run([python, "-c", "import vllm"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=VLLM_IMPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise refused(f"did not finish `import vllm` within {VLLM_IMPORT_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise refused(f"could not run: {exc}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise refused(f"cannot import vllm (exit code {done.returncode}: {lines[-1] if lines else 'no output'}): "
                      "install the side's vLLM build in that environment")
