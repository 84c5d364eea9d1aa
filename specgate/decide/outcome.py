"""What a gate's verdict is, and the one place it becomes a pytest outcome.

Every gate ends in one :class:`Outcome`; those that decide nothing about the build follow the
outcome policy (``[gates] undecided``), and :func:`pytest_action` alone maps an outcome, a policy
and the gate's gating to pytest's outcome, on one process and on the xdist controller."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from specgate.lazy import rig as config

Policy = Literal["skip", "fail"]
Action = Literal["passed", "failed", "skipped", "xfailed"]


class Outcome(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    DECLARED_BACKFIRE = "declared backfire"  # failed, but the rig declares it: reported, not failed
    UNDECIDED = "undecided"  # the evidence cannot tell a pass from a failure
    NOT_STORED = "not stored"  # nothing stored (or nothing comparable) to compare this window with
    OTHER_MACHINE = "other machine"  # the stored figures are another machine's (or host pace's)
    NOT_RUN = "not run"  # the gate could not run (e.g. the session's time budget ran out)

    @property
    def decided(self) -> bool:
        """True when the gate decided on the build (pass, fail, declared backfire)."""
        return self in (Outcome.PASS, Outcome.FAIL, Outcome.DECLARED_BACKFIRE)

    @property
    def tag(self) -> str:
        """How the summary names it: 'UNDECIDED', 'NOT STORED', ..."""
        return "FAILED" if self is Outcome.FAIL else self.value.upper()

    @property
    def policy_key(self) -> str:
        """Its key in the policy table (``undecided``, ``not_stored``, ...)."""
        return self.name.lower()


NOT_DECIDED = tuple(o for o in Outcome if not o.decided)

# kinds of gate that decided nothing for want of a comparison (not to read like a mode)
NOT_STORED = "no stored figures"  # nothing in baselines.json to compare this window with
STORING = "storing figures"  # --specgate-update-baselines: stored, nothing compared

# session.undecided kinds and their outcome; a kind not listed counts as UNDECIDED
KIND_OUTCOMES: dict[str, Outcome] = {
    "undecided": Outcome.UNDECIDED,  # an interval across the threshold
    "inconclusive": Outcome.UNDECIDED,  # the same, in report.json before the wording was one
    "too few drafts": Outcome.UNDECIDED,  # acceptance counts too few to tell
    NOT_STORED: Outcome.NOT_STORED,
    STORING: Outcome.NOT_STORED,  # --specgate-update-baselines, nothing compared
    # the stored figures measured other prompts or another protocol: not comparable
    "fingerprint": Outcome.UNDECIDED,
    "other machine": Outcome.OTHER_MACHINE,
    "other host pace": Outcome.OTHER_MACHINE,  # specgate.decide.host_pace.HOST_PACE
    "not run": Outcome.NOT_RUN,
    "no baseline": Outcome.NOT_STORED,  # report.json before issue 16
    "baseline update": Outcome.NOT_STORED,
}
# The kind an undecided entry gets when only its outcome is known.
OUTCOME_KINDS = {Outcome.UNDECIDED: "undecided", Outcome.NOT_STORED: NOT_STORED,
                 Outcome.OTHER_MACHINE: "other machine", Outcome.NOT_RUN: "not run"}


def outcome_of_kind(kind: str) -> Outcome:
    return KIND_OUTCOMES.get(kind, Outcome.UNDECIDED)


def parse_assignments(text: str, keys: list[str] | tuple[str, ...], values: tuple[str, ...], *,
                      what: str, normalize: bool = False) -> dict[str, str]:
    """One VALUE for every key, or ``KEY=VALUE,KEY=VALUE``; ValueError names the part."""
    text = text.strip()
    if text in values:
        return dict.fromkeys(keys, text)
    out: dict[str, str] = {}
    choices = "|".join(values)
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if normalize:
            key = key.replace("-", "_").replace(" ", "_")
        if key not in keys or value not in values:
            raise ValueError(f"{part!r}: expected {', '.join(repr(v) for v in values)} or "
                             f"{what}={choices} with {what} one of {', '.join(keys)}")
        out[key] = value
    if not out:
        raise ValueError(f"empty {what.lower()} setting: expected "
                         f"{', '.join(repr(v) for v in values)} or {what}={choices},...")
    return out


def parse_policy(text: str) -> dict[str, Policy]:
    """``fail`` or ``skip`` for every outcome, or per outcome (``not_stored=skip``)."""
    return parse_assignments(text, [o.policy_key for o in NOT_DECIDED],
                             ("skip", "fail"),  # type: ignore[return-value]
                             what="OUTCOME", normalize=True)


def pytest_action(outcome: Outcome, policy: Mapping[str, Policy] | None = None, *,
                  declared: bool = False, gating: str | None = None) -> Action:
    """The pytest outcome of a gate: PASS passes, FAIL fails, a declared backfire is an expected
    failure (never fails the run), and a gate that decided nothing is skipped, or failed where
    ``policy`` says so. ``gating``: "report" never fails the run, "gate" fails an UNDECIDED one."""
    if outcome is Outcome.PASS:
        return "passed"
    if outcome is Outcome.DECLARED_BACKFIRE:
        return "xfailed"
    if gating == "report":
        return "skipped"
    if outcome is Outcome.FAIL:
        return "failed"
    if declared:
        return "skipped"
    if gating == "gate" and outcome is Outcome.UNDECIDED:
        return "failed"
    if policy is None:
        policy = config.OutcomePolicy().model_dump()
    return "failed" if policy.get(outcome.policy_key, "skip") == "fail" else "skipped"


# -- gating: which gates fail the run, and the family's false-alarm bound ----------------------
Gating = Literal["gate", "report"]
Setting = Literal["gate", "report", "auto"]
GATES = ("throughput", "acceptance", "backfire", "ttft", "lossless")


def parse_gating(text: str) -> dict[str, Setting]:
    """``auto``, ``gate`` or ``report`` for every gate, or per gate (``ttft=report``)."""
    return parse_assignments(text, GATES, ("auto", "gate", "report"),
                             what="GATE")  # type: ignore[return-value]


@dataclass(frozen=True)
class Family:
    """The gates that may fail the run, counted before anything starts, and the per-gate one-sided
    false-alarm level that gives the session's bound."""

    gating: int  # gate tests that may fail the run
    confidence: float  # each gate's two-sided confidence
    controlled: float | None  # [gates] family_false_alarm (or AUTO_...), None: not controlled
    undecided_red: bool = False  # an undecided gate gates the run

    @property
    def per_gate(self) -> float:
        return (1 - self.confidence) / 2

    @property
    def bound(self) -> float:
        return min(1.0, self.gating * self.per_gate)

    def to_dict(self) -> dict[str, Any]:
        return {"gating_decisions": self.gating, "confidence": self.confidence,
                "per_gate_one_sided": self.per_gate, "bound": self.bound,
                "family_false_alarm": self.controlled, "undecided_red": self.undecided_red}


# under gating = "auto" the session's false FAIL is held at this unless the rig sets one
AUTO_FAMILY_FALSE_ALARM = 0.05


def family(confidence: float, controlled: float | None, gating: int) -> Family:
    """The family over ``gating`` gates at ``confidence``; with ``controlled`` (F), each gate's
    confidence 1 - 2 F / gating, never below the rig's."""
    if controlled is None or gating == 0:
        return Family(gating, confidence, controlled)
    return Family(gating, max(confidence, 1 - 2 * controlled / gating), controlled)

