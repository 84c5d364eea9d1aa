"""What a decision says, as the report words it (specgate.report.verdicts): the deciding layer composes no
sentence, so a test reads a result's words here where it read its message."""

from __future__ import annotations

from specgate.decide.stats import Comparison, OutputComparison
from specgate.decide.verdict import GateResult
from specgate.report.verdicts import check_text, statement


def said(found: GateResult | Comparison | OutputComparison, subject: str = "ngram on coding") -> str:
    """A gate's full statement, or one check's words (``subject`` names its window)."""
    if isinstance(found, GateResult):
        return statement(found.to_dict())
    if isinstance(found, OutputComparison):
        mode, _, prompt_class = subject.partition(" on ")
        details = {"rule": "outputs", **found.to_dict()}
        return statement({"mode": mode, "prompt_class": prompt_class, "details": details})
    return check_text(subject, found.to_dict())
