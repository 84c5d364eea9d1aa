"""Which gates gate the run, and the session's false-alarm bound over them.

A gate *gates* the run when its outcome sets the exit code. The rig's ``[gates] gating`` (or
``--specgate-gating``) says, per gate, ``gate``, ``report`` or ``auto``:

- ``gate``: a FAIL fails the run, and so does an UNDECIDED (after its follow-up rounds): a gate a
  team relies on before a merge must not let the run go green having decided nothing;
- ``report``: the gate is reported (summary, report.json) and never fails the run, whatever it
  says: a gate that cannot decide on this rig (a comparison with stored figures that have no
  history yet) would otherwise turn every plain run red under ``undecided = "fail"``;
- ``auto``: ``gate`` where the gate can decide on this rig, else ``report``. Live comparisons can:
  an A/B's throughput, acceptance (per request) and TTFT, backfire and TTFT against the live
  no-speculation mode, lossless. A comparison with stored figures can when this machine's history
  lets it: at least 3 stored starts, and a prediction interval narrower than the gate's tolerance
  (an A/A then passes and a slowdown of twice the tolerance fails). A history of an unknown machine
  or of another machine never gates.

Unset (the default), every gate's FAIL fails the run and a gate that decided nothing follows the
outcome policy (``[gates] undecided``), as before. The other outcomes that decide nothing (not
stored, other machine, not run) follow the outcome policy under ``gate`` too.

The family: each gate with an interval that can fail the run (not lossless, which compares
outputs; not a declared backfire, which never fails it) fails falsely at most (1 - confidence) / 2
of the time (one-sided; repeated intervals over a window's two looks keep it so). Over m of them,
at most m times that (Bonferroni). ``[gates] family_false_alarm = F`` holds the session's bound at F: each
gate's confidence becomes 1 - 2 F / m, m counted from the selected tests before any server starts.
Either way the summary states the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from specgate.baselines import lookup
from specgate.history import MIN_STARTS, StartHistory
from specgate.outcome import parse_assignments

Gating = Literal["gate", "report"]
Setting = Literal["gate", "report", "auto"]
GATES = ("throughput", "acceptance", "backfire", "ttft", "lossless")


def parse_gating(text: str) -> dict[str, Setting]:
    """``auto``, ``gate`` or ``report`` (every gate), or per gate: ``throughput=gate,acceptance=report``.
    Raises ValueError naming what is wrong."""
    return parse_assignments(text, GATES, ("auto", "gate", "report"), what="GATE")  # type: ignore[return-value]


def can_decide(rig: Any, store: Any, gate: str, mode: str, prompt_class: str, concurrency: int,
               machine: str | None = None) -> tuple[bool, str]:
    """Whether ``gate`` of this window can decide on this rig, and why, known before anything starts:
    from the rig (an A/B, a live reference) and the stored history of this ``machine``: its prediction
    interval's half-width against the gate's tolerance, not a count of starts."""
    ab = rig.design == "ab"
    if gate in ("backfire", "lossless"):
        return True, "a live no-speculation reference in the same session"
    if gate == "ttft":
        return True, "the A/B's live reference side" if ab else "a live no-speculation reference"
    if ab:
        return True, ("the A/B's reference side, counted per request on the same requests" if gate == "acceptance"
                      else "the A/B's live reference side")
    if gate == "acceptance":
        return False, "stored figures (window-wide counters: drafts as trials, no pairing)"
    entry = lookup(store, rig.name, mode, prompt_class, concurrency, machine=machine) if store is not None else None
    if entry is None:
        return False, ("no stored history of this machine" if machine else "this machine cannot be identified")
    gates = rig.gates.for_class(prompt_class)
    duet_ratio = entry.ratio_to_reference is not None and rig.design == "duet" and mode != rig.reference_mode
    history = StartHistory(tuple(entry.ratio_history if duet_ratio else entry.level_history))
    tolerance = gates.throughput_tolerance if duet_ratio else gates.level_gate_tolerance
    what = "stored ratios" if duet_ratio else "stored starts (levels)"
    if not history.usable:
        return False, f"{history.starts} of the {MIN_STARTS} {what} a prediction interval needs"
    half = math.expm1(history.half_width(gates.confidence))
    if half >= tolerance:
        return False, (f"{history.starts} {what}: their prediction interval (±{half * 100:.2f} %) is not narrower "
                       f"than the {tolerance * 100:g} % tolerance")
    return True, (f"{history.starts} {what}: their prediction interval (±{half * 100:.2f} %) is narrower than the "
                  f"{tolerance * 100:g} % tolerance")


def resolve(setting: dict[str, Setting] | None, rig: Any, store: Any, gate: str, mode: str, prompt_class: str,
            concurrency: int, machine: str | None = None) -> tuple[Gating | None, str]:
    """The gating of one gate test: "gate", "report", or None where no gating is set (the outcome
    policy alone decides), with the reason."""
    if not setting or gate not in setting:
        return None, "no gating set: the outcome policy ([gates] undecided)"
    value = setting[gate]
    if value != "auto":
        return value, f"gating = {value!r} for {gate}"
    decides, why = can_decide(rig, store, gate, mode, prompt_class, concurrency, machine)
    return ("gate" if decides else "report"), why


@dataclass(frozen=True)
class Family:
    """The gates that may fail the run, counted before anything starts, and the per-gate one-sided
    false-alarm level that gives the session's bound."""

    gating: int  # gate tests that may fail the run
    confidence: float  # each gate's two-sided confidence
    controlled: float | None  # [gates] family_false_alarm (or AUTO_FAMILY_FALSE_ALARM), None: not controlled
    undecided_red: bool = False  # an undecided gate gates the run (gating "gate", or "auto" where it can decide)

    @property
    def per_gate(self) -> float:
        return (1 - self.confidence) / 2

    @property
    def bound(self) -> float:
        return min(1.0, self.gating * self.per_gate)

    def to_dict(self) -> dict[str, Any]:
        return {"gating_decisions": self.gating, "confidence": self.confidence, "per_gate_one_sided": self.per_gate,
                "bound": self.bound, "family_false_alarm": self.controlled, "undecided_red": self.undecided_red}

    def text(self) -> str:
        if not self.gating:
            return "FALSE ALARMS: no gate of this run can fail it"
        head = (f"FALSE ALARMS: {self.gating} gate(s) can fail this run, each falsely at most "
                f"{self.per_gate * 100:.3g} % of the time (one-sided, confidence {self.confidence * 100:.4g} %)")
        if self.controlled is not None:
            text = (f"{head}: a false FAIL anywhere in the session at most {self.bound * 100:.3g} % "
                    f"(Bonferroni; [gates] family_false_alarm = {self.controlled:g})")
        else:
            text = (f"{head}: a false FAIL anywhere in the session at most {self.bound * 100:.3g} % (Bonferroni, "
                    "not controlled: set [gates] family_false_alarm to hold it)")
        if self.undecided_red:
            text += (". A gate that gates the run and stays undecided after its follow-up rounds turns it red as "
                     "well; that rate is the rig's, not the intervals' (docs/statistics.md: the cpu tier's A/A "
                     "windows, 8 of 53 undecided at the first look)")
        return text


# Under gating = "auto" the session's false FAIL is held at this unless the rig sets family_false_alarm:
# a pre-merge job that gates on every gate that can decide must not go red on chance 30 x 2.5 % of runs.
AUTO_FAMILY_FALSE_ALARM = 0.05


def family(confidence: float, controlled: float | None, gating: int, *, undecided_red: bool = False) -> Family:
    """The family over ``gating`` gates at the rig's ``confidence``; with ``controlled`` (F), each
    gate's confidence 1 - 2 F / gating, never below the rig's."""
    if controlled is None or gating == 0:
        return Family(gating, confidence, controlled, undecided_red)
    return Family(gating, max(confidence, 1 - 2 * controlled / gating), controlled, undecided_red)


def gating_lines(report: dict[str, Any]) -> list[str]:
    """The summary's lines: which gates gated the run (by gate and reason), which were reported
    only, and the family's false-alarm bound."""
    from collections import Counter

    entries = [*report.get("gates", []), *report.get("undecided", [])]
    gated: Counter = Counter()
    reported: Counter = Counter()
    for e in entries:
        if e.get("gating") == "gate":
            gated[(e["gate"], e.get("gating_reason", ""))] += 1
        elif e.get("gating") == "report":
            reported[(e["gate"], e.get("gating_reason", ""))] += 1
    lines = []
    if entries and not gated and not reported:  # no gating set: the outcome policy alone
        fails = sorted(k for k, v in (report.get("outcome_policy") or {}).items() if v == "fail")
        lines.append(f"GATED THE RUN: every failed gate ([gates] gating unset), and of the outcomes that decide "
                     f"nothing: {', '.join(fails) if fails else 'none'} ([gates] undecided); --specgate-gating=auto "
                     "gates the run on the gates that can decide on this rig")
    if gated or reported:
        if gated:
            lines.append(f"GATED THE RUN: {sum(gated.values())} gate(s): "
                         + "; ".join(f"{gate} x{n} ({why})" for (gate, why), n in sorted(gated.items())))
        if reported:
            lines.append(f"REPORTED ONLY (never fail the run): {sum(reported.values())} gate(s): "
                         + "; ".join(f"{gate} x{n} ({why})" for (gate, why), n in sorted(reported.items())))
    fam = report.get("family")
    if fam:
        lines.append(Family(fam["gating_decisions"], fam["confidence"], fam.get("family_false_alarm"),
                            fam.get("undecided_red", False)).text())
    return lines
