"""A gate's verdict: :class:`GateResult`, one outcome (specgate.decide.outcome) with a one-line reason and the
figures behind it (``details``), the same for every gate, in the session, the report and on the controller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specgate.decide.outcome import Outcome


@dataclass
class GateResult:
    gate: str  # throughput | acceptance | backfire | lossless
    mode: str
    prompt_class: str
    concurrency: int
    outcome: Outcome
    message: str
    declared: str | None = None  # reason of a declared (accepted) backfire
    details: dict[str, Any] = field(default_factory=dict)
    # Whether it gates the run: "gate", "report" (never fails it) or None (the outcome policy
    # alone), and why (specgate.gating; set when the session records it)
    gating: str | None = None
    gating_reason: str | None = None

    @property
    def passed(self) -> bool:
        """Derived: the outcome is PASS (an undecided gate has not passed)."""
        return self.outcome is Outcome.PASS

    @property
    def verdict(self) -> str:
        return "FAIL" if self.outcome is Outcome.FAIL else self.outcome.value

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "mode": self.mode, "prompt_class": self.prompt_class,
                "concurrency": self.concurrency, "outcome": self.outcome.value, "passed": self.passed,
                "verdict": self.verdict, "message": self.message, "declared": self.declared,
                "details": self.details,
                **({"gating": self.gating, "gating_reason": self.gating_reason} if self.gating else {})}
