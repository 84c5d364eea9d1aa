"""A gate's verdict: :class:`GateResult`, one outcome, the deciding rule and its facts
(``details``). The deciding layer composes no words: specgate.report.verdicts renders ``message``
from the facts when the result is recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specgate.decide.outcome import OUTCOME_KINDS, Outcome


@dataclass
class GateResult:
    gate: str  # throughput | acceptance | backfire | lossless
    mode: str
    prompt_class: str
    concurrency: int
    outcome: Outcome
    message: str  # the full statement, rendered by the report layer ("" until then)
    declared: str | None = None  # reason of a declared (accepted) backfire
    details: dict[str, Any] = field(default_factory=dict)
    gating: str | None = None  # "gate", "report" or None, and why (resolve_gating)
    gating_reason: str | None = None

    @property
    def rule(self) -> str | None:
        """The rule that decided (``details["rule"]``: "paired", "acceptance", "ttft", ...)."""
        return self.details.get("rule")

    @property
    def passed(self) -> bool:
        """Derived: the outcome is PASS (an undecided gate has not passed)."""
        return self.outcome is Outcome.PASS

    @property
    def undecided_kind(self) -> str:
        """The kind of a result that decided nothing: the gate's own
        (``details["undecided_kind"]``), "too few drafts" for window-wide counters, else its
        outcome's."""
        return self.details.get("undecided_kind") or (
            "too few drafts" if self.gate == "acceptance" and self.outcome is Outcome.UNDECIDED
            and not self.details.get("per_request") else OUTCOME_KINDS[self.outcome])

    @property
    def verdict(self) -> str:
        return "FAIL" if self.outcome is Outcome.FAIL else self.outcome.value

    def to_dict(self) -> dict[str, Any]:
        gating = {"gating": self.gating, "gating_reason": self.gating_reason} if self.gating else {}
        return {"gate": self.gate, "mode": self.mode, "prompt_class": self.prompt_class,
                "concurrency": self.concurrency, "outcome": self.outcome.value,
                "passed": self.passed, "verdict": self.verdict, "message": self.message,
                "declared": self.declared, "details": self.details, **gating}
