"""A window's gate settings, resolved once.

``config.Gates`` is the TOML schema: a rig's ``[gates]``, with per-class overrides under
``[gates.classes]``. :class:`WindowSettings` is what one window's gates decide with: the class's
thresholds with the session's family confidence applied, the arrangement of its servers, what it is
compared with, any declared backfire, and each gate's gating with the outcome policy. The session
builds one per window when it plans its family, before any server starts
(``SpecgateSession.settings_for``); the gates, the follow-up policy, ``plan``, ``history`` and the
report read it, and nothing resolves a threshold again.

The gating (``[gates] gating``, ``--specgate-gating``; specgate.decide.outcome's module doc) is resolved
here too: ``auto`` gates where the gate can decide on this rig (:func:`can_decide`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from specgate.config.arrangement import ArrangementChoice
from specgate.decide.history import MIN_STARTS, StartHistory
from specgate.decide.outcome import Gating
from specgate.store.baselines import lookup

if TYPE_CHECKING:
    from specgate.config.rig import DeclaredBackfire, Gates, Rig

# What a window is compared with: "ab" (each mode on both A/B sides, live at once), "duet" (a live
# no-speculation partner where the arrangement allows one), "sequential" (one server at a time:
# stored figures, or a window measured before or after).
Comparing = Literal["ab", "duet", "sequential"]


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
    outcome_policy: Mapping[str, str] = field(default_factory=dict)  # outcome key -> "skip" | "fail"
    # gate -> (gating: "gate" | "report" | None where none is set, and why); filled by the session
    gating: Mapping[str, tuple[Gating | None, str]] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        """Each gate's two-sided confidence (the family's where [gates] family_false_alarm holds it)."""
        return self.thresholds.confidence

    @property
    def level_tolerance(self) -> float:
        """The stored-level gate's tolerance: level_tolerance, else throughput_tolerance."""
        return self.thresholds.level_gate_tolerance

    @property
    def ab_tolerance(self) -> float:
        """The A/B throughput gate's tolerance: ab_tolerance, else throughput_tolerance."""
        return self.thresholds.ab_gate_tolerance

    @property
    def speed_tolerance(self) -> float:
        """The tolerance of this window's throughput gate as the rig compares it: an A/B's, else a
        stored level's (a duet ratio to the reference uses throughput_tolerance: :meth:`tolerance_for`)."""
        return self.ab_tolerance if self.comparing == "ab" else self.level_tolerance

    def tolerance_for(self, duet_ratio: bool) -> float:
        """The throughput gate's tolerance against stored figures: a duet ratio's, or a level's."""
        return self.thresholds.throughput_tolerance if duet_ratio else self.level_tolerance

    def to_dict(self) -> dict[str, Any]:
        """report.json's entry for this window: the figures its gates decided with."""
        t = self.thresholds
        return {"mode": self.mode, "prompt_class": self.prompt_class, "concurrency": self.concurrency,
                "confidence": self.confidence, "arrangement": self.arrangement.name, "comparing": self.comparing,
                "throughput_tolerance": t.throughput_tolerance, "level_tolerance": self.level_tolerance,
                "ab_tolerance": self.ab_tolerance, "acceptance_tolerance": t.acceptance_tolerance,
                "ttft_tolerance": t.ttft_tolerance, "min_speedup": t.min_speedup, "start_noise": t.start_noise,
                "start_pair_spread": t.start_pair_spread, "equivalence_margin": t.equivalence_margin,
                "declared_backfire": self.declared_backfire.reason if self.declared_backfire else None,
                "gating": {gate: value for gate, (value, _) in self.gating.items() if value is not None}}

    def gating_of(self, gate: str) -> Gating | None:
        return self.gating.get(gate, (None, ""))[0]

    def with_family(self, confidence: float) -> WindowSettings:
        """These settings at the family's ``confidence``, never below their own (a class may ask for more)."""
        if confidence <= self.thresholds.confidence:
            return self
        return replace(self, thresholds=self.thresholds.model_copy(update={"confidence": confidence}))


def window_settings(rig: Rig, mode: str, prompt_class: str, concurrency: int = 1, *,
                    outcome_policy: Mapping[str, str] | None = None) -> WindowSettings:
    """The settings of one window of ``rig`` at the rig's own confidence, with no gating: the session
    adds the family's confidence and the gating (``SpecgateSession.settings_for``)."""
    return WindowSettings(
        rig=rig.name, mode=mode, prompt_class=prompt_class, concurrency=concurrency,
        reference_mode=rig.reference_mode, speculative=rig.mode(mode).is_speculative,
        thresholds=rig.gates.for_class(prompt_class), arrangement=rig.arrangement,
        comparing=rig.comparing, declared_backfire=rig.declared_backfire_for(mode, prompt_class),  # type: ignore[arg-type]
        outcome_policy=dict(outcome_policy if outcome_policy is not None else rig.gates.outcome_policy))


def can_decide(settings: WindowSettings, store: Any, gate: str, machine: str | None = None) -> tuple[bool, str]:
    """Whether ``gate`` of this window can decide on this rig, and why, known before anything starts:
    from the rig (an A/B, a live reference) and the stored history of this ``machine``: its prediction
    interval's half-width against the gate's tolerance, not a count of starts."""
    ab = settings.comparing == "ab"
    if gate in ("backfire", "lossless"):
        return True, "a live no-speculation reference in the same session"
    if gate == "ttft":
        return True, "the A/B's live reference side" if ab else "a live no-speculation reference"
    if ab:
        return True, ("the A/B's reference side, counted per request on the same requests" if gate == "acceptance"
                      else "the A/B's live reference side")
    if gate == "acceptance":
        return False, "stored figures (window-wide counters: drafts as trials, no pairing)"
    entry = (lookup(store, settings.rig, settings.mode, settings.prompt_class, settings.concurrency, machine=machine)
             if store is not None else None)
    if entry is None:
        return False, ("no stored history of this machine" if machine else "this machine cannot be identified")
    duet_ratio = (entry.ratio_to_reference is not None and settings.comparing == "duet"
                  and settings.mode != settings.reference_mode)
    history = StartHistory.of(entry, ratios=duet_ratio)
    tolerance = settings.tolerance_for(duet_ratio)
    what = "stored ratios" if duet_ratio else "stored starts (levels)"
    if not history.usable:
        return False, f"{history.starts} of the {MIN_STARTS} {what} a prediction interval needs"
    half = math.expm1(history.half_width(settings.confidence))
    if half >= tolerance:
        return False, (f"{history.starts} {what}: their prediction interval (±{half * 100:.2f} %) is not narrower "
                       f"than the {tolerance * 100:g} % tolerance")
    return True, (f"{history.starts} {what}: their prediction interval (±{half * 100:.2f} %) is narrower than the "
                  f"{tolerance * 100:g} % tolerance")


def resolve_gating(setting: Mapping[str, str] | None, settings: WindowSettings, store: Any, gate: str,
                   machine: str | None = None) -> tuple[Gating | None, str]:
    """The gating of one gate test: "gate", "report", or None where no gating is set (the outcome
    policy alone decides), with the reason."""
    if not setting or gate not in setting:
        return None, "no gating set: the outcome policy ([gates] undecided)"
    value = setting[gate]
    if value != "auto":
        return value, f"gating = {value!r} for {gate}"  # type: ignore[return-value]
    decides, why = can_decide(settings, store, gate, machine)
    return ("gate" if decides else "report"), why
