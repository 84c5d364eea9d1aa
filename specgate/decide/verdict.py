"""A gate's verdict: :class:`GateResult`, one outcome (specgate.decide.outcome), the rule that
decided and the facts it rests on (``details``), the same for every gate, in the session, the report
and on the controller. The deciding layer composes no words: ``message`` is the full statement
specgate.report.verdicts renders from the facts when the result is recorded (``worded``)."""

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
    # Whether it gates the run: "gate", "report" (never fails it) or None (the outcome policy
    # alone), and why (specgate.decide.settings.resolve_gating; set when the session records it)
    gating: str | None = None
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
        """The kind of a result that decided nothing (the session's ``undecided`` entries): the
        gate's own (``details["undecided_kind"]``), "too few drafts" for window-wide acceptance
        counters, else its outcome's."""
        return self.details.get("undecided_kind") or (
            "too few drafts" if self.gate == "acceptance" and self.outcome is Outcome.UNDECIDED
            and not self.details.get("per_request") else OUTCOME_KINDS[self.outcome])

    @property
    def verdict(self) -> str:
        return "FAIL" if self.outcome is Outcome.FAIL else self.outcome.value

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "mode": self.mode, "prompt_class": self.prompt_class,
                "concurrency": self.concurrency, "outcome": self.outcome.value,
                "passed": self.passed,
                "verdict": self.verdict, "message": self.message, "declared": self.declared,
                "details": self.details,
                **({"gating": self.gating,
                    "gating_reason": self.gating_reason} if self.gating else {})}
