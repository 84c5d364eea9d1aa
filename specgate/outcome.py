"""What a gate's verdict is, and the one place it becomes a pytest outcome.

Every gate ends in one :class:`Outcome`. Four of them decide nothing about the build (UNDECIDED,
NOT_STORED, OTHER_MACHINE, NOT_RUN); what each of those does to the run is a policy
(:class:`specgate.config.OutcomePolicy`: ``skip`` or ``fail``, for a gate that must decide, e.g.
before a merge; by default a window with nothing stored fails and the others skip), set by the
rig's ``[gates] undecided`` key or ``--specgate-undecided``. :func:`pytest_action` is the only
mapping from an outcome and a policy to what pytest reports, on the single-process path and on the
xdist controller alike.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Literal

Policy = Literal["skip", "fail"]
Action = Literal["passed", "failed", "skipped", "xfailed"]


class Outcome(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    DECLARED_BACKFIRE = "declared backfire"  # failed, but the rig declares it: reported, not failed
    UNDECIDED = "undecided"  # the evidence cannot tell a pass from a failure (an interval across the line)
    NOT_STORED = "not stored"  # nothing stored (or nothing comparable) to compare this window with
    OTHER_MACHINE = "other machine"  # the stored figures are another machine's (or another host pace's)
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
        """Its key in the policy table (``undecided``, ``not_stored``, ``other_machine``, ``not_run``)."""
        return self.name.lower()


NOT_DECIDED = tuple(o for o in Outcome if not o.decided)

# The kinds of gate that decided nothing for want of a comparison (report.json's "undecided"
# entries), named for the stored figures (the no-speculation mode is no_spec; it used to be called
# baseline, so these kinds must not read like a mode).
NOT_STORED = "no stored figures"  # nothing in baselines.json to compare this window with
STORING = "storing figures"  # --specgate-update-baselines: this run's figures are stored, nothing compared

# The kinds of session.undecided entries (report.json's "undecided" list) and their outcome. A kind
# not listed here (an old report's, or one another module adds without an entry) counts as UNDECIDED.
KIND_OUTCOMES: dict[str, Outcome] = {
    "undecided": Outcome.UNDECIDED,  # an interval across the threshold
    "inconclusive": Outcome.UNDECIDED,  # the same, in report.json before the wording was one
    "too few drafts": Outcome.UNDECIDED,  # acceptance counts too few to tell
    NOT_STORED: Outcome.NOT_STORED,
    STORING: Outcome.NOT_STORED,  # --specgate-update-baselines, nothing compared
    # the stored figures measured other prompts or another protocol: not comparable, so undecided
    # (skipped by default, as before issue 36; a missing entry fails by default instead)
    "fingerprint": Outcome.UNDECIDED,
    "other machine": Outcome.OTHER_MACHINE,
    "other host pace": Outcome.OTHER_MACHINE,  # specgate.gates.HOST_PACE
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
    """One VALUE for every key, or ``KEY=VALUE,KEY=VALUE`` for some (the command line's and the rig's
    per-outcome and per-gate settings). Raises ValueError naming the part that is wrong."""
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
            raise ValueError(f"{part!r}: expected {', '.join(repr(v) for v in values)} or {what}={choices} with "
                             f"{what} one of {', '.join(keys)}")
        out[key] = value
    if not out:
        raise ValueError(f"empty {what.lower()} setting: expected {', '.join(repr(v) for v in values)} or "
                         f"{what}={choices},...")
    return out


def parse_policy(text: str) -> dict[str, Policy]:
    """``fail`` or ``skip`` (every outcome that decides nothing), or per outcome:
    ``not_stored=skip,undecided=fail``. Raises ValueError naming what is wrong."""
    return parse_assignments(text, [o.policy_key for o in NOT_DECIDED], ("skip", "fail"),  # type: ignore[return-value]
                             what="OUTCOME", normalize=True)


def outcome_text(gate: str, outcome: Outcome, message: str, policy: Mapping[str, Policy] | None = None, *,
                 declared: bool = False, gating: str | None = None) -> str:
    """The test report's line for a gate's outcome (the same on every path)."""
    if gating == "report" and not declared and outcome is not Outcome.PASS:
        return (f"{gate} gate {outcome.tag}, reported only ([gates] gating: this gate cannot decide on this rig, "
                f"it never fails the run): {message}")
    if outcome is Outcome.FAIL:
        return f"{gate} gate: {message}"
    if outcome is Outcome.DECLARED_BACKFIRE:
        return f"declared backfire, reported and not failed: {message}"
    if outcome.decided:
        return message
    head = f"{gate} gate undecided" + ("" if outcome is Outcome.UNDECIDED else f" ({outcome.value})")
    if declared:
        head += " [a declared backfire: reported, never fails the run]"
    elif gating == "gate" and outcome is Outcome.UNDECIDED:
        head += " [fails the run: this gate gates it and is still undecided ([gates] gating, --specgate-gating)]"
    elif pytest_action(outcome, policy) == "failed":
        head += (f" [fails the run: the policy for '{outcome.policy_key}' is 'fail' (--specgate-undecided, "
                 "[gates] undecided)]")
    return f"{head}: {message}"


def pytest_action(outcome: Outcome, policy: Mapping[str, Policy] | None = None, *, declared: bool = False,
                  gating: str | None = None) -> Action:
    """The pytest outcome of a gate: PASS passes, FAIL fails, a declared backfire is an expected
    failure, and a gate that decided nothing is skipped, or failed where ``policy`` (outcome key ->
    "skip" | "fail") says so. A ``declared`` backfire gate never fails the run: undecided, it is
    skipped whatever the policy (its window takes no follow-up rounds, Rig.follow_up_rounds).
    ``gating`` (specgate.gating): "report" never fails the run (a FAIL is skipped, and listed as
    failed in the summary), "gate" fails an UNDECIDED one whatever the policy."""
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
        from specgate.config import OutcomePolicy

        policy = OutcomePolicy().model_dump()
    return "failed" if policy.get(outcome.policy_key, "skip") == "fail" else "skipped"
