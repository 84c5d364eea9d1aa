"""The run's settings, resolved once before any server starts (specgate.plugin.resolve).

``config.Gates`` is the TOML schema; :class:`WindowSettings` is what one window's gates decide with,
:class:`RunSettings` the whole run's. Nothing resolves a threshold again."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from specgate.config.arrangement import ArrangementChoice
from specgate.decide import red_runs
from specgate.decide.history import MIN_STARTS, StartHistory
from specgate.decide.outcome import GATES, Family, Gating
from specgate.store.baselines import lookup

if TYPE_CHECKING:
    from specgate.config.rig import DeclaredBackfire, Gates, Rig
    from specgate.decide.red_runs import GateTest, RedRuns
    from specgate.store.baselines import BaselineEntry, BaselineFile

# what a window is compared with: "ab", "duet" or "sequential"; why a gate gates or is reported
# only: a named case, or its figures (specgate.report.verdicts.reason_text words it)
Reason = str | dict[str, Any]

Comparing = Literal["ab", "duet", "sequential"]
WindowKey = tuple[str, str, int]  # mode, prompt class, concurrency


@dataclass(frozen=True)
class WindowSettings:
    """Everything a gate of one window (rig, mode, prompt class, concurrency) decides with."""

    rig: str
    mode: str
    prompt_class: str
    concurrency: int
    reference_mode: str
    speculative: bool  # the window's mode speculates
    thresholds: Gates  # the class's [gates], its confidence the family's
    arrangement: ArrangementChoice  # how the servers of a comparison share the machine, and why
    comparing: Comparing
    declared_backfire: DeclaredBackfire | None = None
    outcome_policy: Mapping[str, str] = field(default_factory=dict)  # outcome -> "skip" | "fail"
    # gate -> (gating: "gate" | "report" | None, and why); filled by RunSettings
    gating: Mapping[str, tuple[Gating | None, Reason]] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        """Each gate's two-sided confidence (the family's where set)."""
        return self.thresholds.confidence

    @property
    def level_tolerance(self) -> float:
        """The stored-level gate's tolerance: level_tolerance, else throughput_tolerance."""
        return self.thresholds.level_gate_tolerance

    @property
    def ab_tolerance(self) -> float:
        """The A/B throughput gate's tolerance: ab_tolerance, else throughput_tolerance."""
        return self.thresholds.ab_gate_tolerance

    def tolerance_for(self, duet_ratio: bool) -> float:
        """The throughput gate's tolerance against stored figures: a duet ratio's, or a level's."""
        return self.thresholds.throughput_tolerance if duet_ratio else self.level_tolerance

    def stored(self, store: BaselineFile | None, *machine: str | None) -> BaselineEntry | None:
        """This window's stored history (``machine``'s, where given), None without a store."""
        return (lookup(store, self.rig, self.mode, self.prompt_class, self.concurrency, *machine)
                if store is not None else None)

    def stored_history(self, entry: BaselineEntry) -> tuple[bool, StartHistory, float]:
        """What a new start is held against in ``entry``: whether its ratios to no speculation (a
        duet's speculative mode), those starts, and the tolerance."""
        ratio = (entry.ratio_to_reference is not None and self.comparing == "duet"
                 and self.mode != self.reference_mode)
        return ratio, StartHistory.of(entry, ratios=ratio), self.tolerance_for(ratio)

    def to_dict(self) -> dict[str, Any]:
        """report.json's entry for this window."""
        t = self.thresholds
        return {"mode": self.mode, "prompt_class": self.prompt_class,
                "concurrency": self.concurrency, "confidence": self.confidence,
                "arrangement": self.arrangement.name, "comparing": self.comparing,
                "throughput_tolerance": t.throughput_tolerance,
                "level_tolerance": self.level_tolerance, "ab_tolerance": self.ab_tolerance,
                "acceptance_tolerance": t.acceptance_tolerance,
                "ttft_tolerance": t.ttft_tolerance, "min_speedup": t.min_speedup,
                "start_noise": t.start_noise, "start_pair_spread": t.start_pair_spread,
                "equivalence_margin": t.equivalence_margin,
                "declared_backfire": self.declared_backfire and self.declared_backfire.reason,
                "gating": {gate: value for gate, (value, _) in self.gating.items()
                           if value is not None}}

    def gating_of(self, gate: str) -> Gating | None:
        """``gate``'s gating: "gate", "report", or None (the outcome policy alone)."""
        return self.gating.get(gate, (None, ""))[0]

    def with_family(self, confidence: float) -> WindowSettings:
        """These settings at the family's ``confidence``, never below their own."""
        if confidence <= self.thresholds.confidence:
            return self
        thresholds = self.thresholds.model_copy(update={"confidence": confidence})
        return replace(self, thresholds=thresholds)


def window_settings(rig: Rig, mode: str, prompt_class: str, concurrency: int = 1, *,
                    outcome_policy: Mapping[str, str] | None = None) -> WindowSettings:
    """One window's settings at the rig's own confidence, with no gating."""
    return WindowSettings(
        rig=rig.name, mode=mode, prompt_class=prompt_class, concurrency=concurrency,
        reference_mode=rig.reference_mode, speculative=rig.mode(mode).is_speculative,
        thresholds=rig.gates.for_class(prompt_class), arrangement=rig.arrangement,
        comparing=rig.comparing,
        declared_backfire=rig.declared_backfire_for(mode, prompt_class),  # type: ignore[arg-type]
        outcome_policy=dict(outcome_policy if outcome_policy is not None
                            else rig.gates.outcome_policy))


def can_decide(settings: WindowSettings, store: Any, gate: str,
               machine: str | None = None) -> tuple[bool, Reason]:
    """Whether ``gate`` of this window can decide on this rig, and why: from the rig and this
    ``machine``'s stored history (its prediction half-width against the tolerance)."""
    ab = settings.comparing == "ab"
    if gate in ("backfire", "lossless"):
        return True, "a live no-speculation reference in the same session"
    if gate == "ttft":
        return True, "the A/B's live reference side" if ab else "a live no-speculation reference"
    if ab:
        return True, ("the A/B's reference side, counted per request on the same requests"
                      if gate == "acceptance" else "the A/B's live reference side")
    if gate == "acceptance":
        return False, "stored figures (window-wide counters: drafts as trials, no pairing)"
    entry = settings.stored(store, machine)
    if entry is None:
        return False, ("no stored history of this machine" if machine
                       else "this machine cannot be identified")
    duet_ratio, history, tolerance = settings.stored_history(entry)
    facts = {"starts": history.starts, "what": "ratios" if duet_ratio else "levels"}
    if not history.usable:
        return False, {"why": "too few stored", "needed": MIN_STARTS, **facts}
    half = math.expm1(history.half_width(settings.confidence))
    return half < tolerance, {"why": "prediction interval", "half": half, "tolerance": tolerance,
                              **facts}


def resolve_gating(setting: Mapping[str, str] | None, settings: WindowSettings, store: Any,
                   gate: str, machine: str | None = None) -> tuple[Gating | None, Reason]:
    """One gate test's gating ("gate", "report", or None: the outcome policy) and why."""
    if not setting or gate not in setting:
        return None, "no gating set: the outcome policy ([gates] undecided)"
    value = setting[gate]
    if value != "auto":
        return value, {"why": "set", "value": value, "gate": gate}  # type: ignore[return-value]
    decides, why = can_decide(settings, store, gate, machine)
    return ("gate" if decides else "report"), why


@dataclass(frozen=True)
class RunSettings:
    """Everything one run decides with, resolved once before any server starts."""

    rig: Rig  # the rig file as the command line amends it (an A/B's sides, the arrangement)
    store: BaselineFile  # the stored figures the run compares with
    machine: str | None  # this host's history name (fingerprint.machine_id)
    worker_gpus: str | None  # an xdist worker's GPUs for its servers; None elsewhere
    gpus: str | None  # the GPUs this process's servers use: the worker's, else CUDA_VISIBLE_DEVICES
    outcome_policy: Mapping[str, str]  # outcome -> "skip" | "fail": the option's over the rig's
    gating: Mapping[str, str]  # gate -> "auto" | "gate" | "report": the rig's, the option's over it
    windows: Mapping[WindowKey, WindowSettings]  # every window of the rig
    family: Family | None = None  # the gates that can fail the run, once the selection is known
    red_runs: RedRuns | None = None  # the chance of a red A/A (specgate.decide.red_runs), likewise

    @classmethod
    def resolve(cls, rig: Rig, store: BaselineFile, *, machine: str | None,
                worker_gpus: str | None = None,
                gpus: str | None = None, outcome_policy: Mapping[str, str] | None = None,
                gating: Mapping[str, str] | None = None) -> RunSettings:
        """Every window's settings at the rig's confidence; the options over the rig's."""
        policy = MappingProxyType({**rig.gates.outcome_policy, **(outcome_policy or {})})
        run = cls(rig=rig, store=store, machine=machine, worker_gpus=worker_gpus, gpus=gpus,
                  outcome_policy=policy, windows={},
                  gating=MappingProxyType({**rig.gates.gating_setting, **(gating or {})}))
        keys = [(m.name, c.name, n) for m in rig.modes for c in rig.prompt_classes
                for n in rig.protocol.concurrency]
        return replace(run, windows=MappingProxyType({key: run._resolve_window(*key)
                                                      for key in keys}))

    def _resolve_window(self, mode: str, prompt_class: str, concurrency: int) -> WindowSettings:
        own = window_settings(self.rig, mode, prompt_class, concurrency,
                              outcome_policy=self.outcome_policy)
        # the gating is decided at the rig's own confidence; the family's applies to the intervals
        gating = {gate: resolve_gating(self.gating, own, self.store, gate, self.machine)
                  for gate in GATES}
        held = own.with_family(self.family.confidence) if self.family is not None else own
        return replace(held, gating=gating)

    def window(self, mode: str, prompt_class: str, concurrency: int) -> WindowSettings:
        """One window's settings (outside the rig's classes too)."""
        found = self.windows.get((mode, prompt_class, concurrency))
        return found if found is not None else self._resolve_window(mode, prompt_class, concurrency)

    def with_family(self, chosen: Family) -> RunSettings:
        """Every window at the family's confidence (never below a class's own)."""
        return replace(self, family=chosen, windows=MappingProxyType(
            {key: w.with_family(chosen.confidence) for key, w in self.windows.items()}))

    def for_selection(self, tests: Iterable[GateTest]) -> RunSettings:
        """These settings at the confidence of the family of the selected gate ``tests`` (those with
        an interval that can fail the run); ``auto`` gates chosen to keep a red A/A at most 5 %
        (specgate.decide.red_runs)."""
        choice = red_runs.for_run(self, list(tests))
        chosen = choice.red_runs.family
        windows = {}
        for key, window in self.windows.items():
            auto = {gate: choice.gating[test] for gate in GATES
                    if (test := (gate, *key)) in choice.gating}
            windows[key] = replace(window, gating={**window.gating, **auto}) if auto else window
        run = replace(self, windows=MappingProxyType(windows), red_runs=choice.red_runs)
        red = any(v in ("auto", "gate") for v in self.gating.values())
        return run.with_family(Family(chosen.gating, chosen.confidence, chosen.controlled,
                                      undecided_red=red))
