"""A gate's words: the line a person reads in one breath, and what pytest says of the test.

Input is a gate's entry (``GateResult.to_dict()``, or an entry of a saved report, of any version):
the figures come from :func:`specgate.report.comparisons.comparison`, so a live run and a report
written by an older specgate read the same. The terminal line says what (window and gate), by how much
(the ratio), against what, the interval and the line it fails past, and what the ratio rests on, in at
most :data:`LINE_WIDTH` characters; the full statement is the entry's ``message`` (summary.md,
report.html).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from specgate.decide.host_pace import HOST_PACE
from specgate.decide.outcome import NOT_STORED, STORING, Family, Outcome, Policy, pytest_action
from specgate.report.comparisons import comparison, no_windows, undecided_kind
from specgate.report.red_runs import red_run_lines

LINE_WIDTH = 160

# What a gate that had nothing to compare with says in the terminal, by its undecided kind.
KIND_WORDS = {NOT_STORED: "nothing stored", STORING: "measured to store its figures",
              "fingerprint": "stored figures of other prompts or another protocol: not compared",
              "other machine": "stored figures of another machine: not compared",
              HOST_PACE: "host at another pace than the stored figures': not compared",
              "not run": "not run: the session's time budget ran out"}


def clip(text: str, width: int = LINE_WIDTH) -> str:
    """``text`` in at most ``width`` characters: cut at the last "; " or ", " that leaves half of it,
    with "…" where something was cut."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = max(text.rfind("; ", 0, width - 1), text.rfind(", ", 0, width - 1))
    return (text[:cut] if cut > width // 2 else text[:width - 1].rstrip()) + "…"


def window_of(entry: Mapping[str, Any]) -> str:
    """'ngram coding c1': the window, as the terminal names it."""
    return f"{entry.get('mode')} {entry.get('prompt_class')} c{entry.get('concurrency')}"


def _figures(entry: Mapping[str, Any]) -> str | None:
    """'0.929x of stored figures (0.921-0.937) < 0.97 line [6 pairs]', or None without a ratio."""
    c = comparison(dict(entry), no_windows())
    if c.ratio is None:
        return None
    text = f"{c.ratio:.3f}x of {c.against}"
    if c.ci_low is not None and c.ci_high is not None:
        text += f" ({c.ci_low:.3f}-{c.ci_high:.3f})"
    else:
        text += " (no interval)"
    if c.threshold is not None:
        inside = c.ci_low is not None and c.ci_high is not None and c.ci_low <= c.threshold <= c.ci_high
        side = "spans" if inside or c.outcome is Outcome.UNDECIDED else (
            ">" if c.fails_above else "<") if c.outcome in (Outcome.FAIL, Outcome.DECLARED_BACKFIRE) else (
            "<=" if c.fails_above else ">=")
        text += f" {side} {c.threshold_text[2:]} line"
    return text + (f" [{c.n}]" if c.n != "-" else "")


def _lossless(entry: Mapping[str, Any]) -> str | None:
    details = entry.get("details") or {}
    share, firsts = details.get("identical_share"), details.get("first_divergence")
    if share is None or not isinstance(firsts, dict):
        return None
    diverged = [f"{key} at char {at}" for key, at in firsts.items() if at is not None]
    return (f"{len(firsts) - len(diverged)}/{len(firsts)} outputs identical ({share * 100:.0f} %)"
            + (f"; first divergence: {', '.join(diverged[:2])}" if diverged else ""))


def _kind_words(entry: Mapping[str, Any], room: int) -> str | None:
    """Why a gate with nothing to compare decided nothing, in at most ``room`` characters where its
    message is longer (the words of its kind, and the command that gives it something); None for others."""
    details = entry.get("details") or {}
    kind = undecided_kind(entry) if "kind" in entry else details.get("undecided_kind")
    message = " ".join(str(entry.get("message") or "").split())
    if kind == HOST_PACE and (pace := details.get("host_pace")):
        return (f"host at {pace['factor']:.2f}x the stored figures' CPU canary time ({pace['canary_us']:.1f} vs "
                f"{pace['stored_canary_us']:.1f} us): not compared")
    if kind not in KIND_WORDS:
        return None
    command = details.get("command")
    return message if len(message) <= room else KIND_WORDS[kind] + (f"; {command}" if command else "")


def terminal_line(entry: Mapping[str, Any], *, prefix: str = "", suffix: str = "") -> str:
    """The gate's line for the terminal (and pytest's message of the test), at most LINE_WIDTH
    characters with ``prefix`` and ``suffix``: 'ngram coding c1 throughput: 0.929x of stored figures
    (0.921-0.937) < 0.97 line [6 pairs]'. A gate with nothing to compare says why in words of its kind."""
    head = f"{prefix}{window_of(entry)} {entry.get('gate')}"
    body = _kind_words(entry, LINE_WIDTH - len(suffix) - len(head) - 2)
    if body is None:
        body = (_lossless(entry) if entry.get("gate") == "lossless" else _figures(entry)) or str(entry.get("message"))
    return clip(f"{head}: {body}", LINE_WIDTH - len(suffix)) + suffix


def grouped_lines(tagged: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The terminal lines of (tag, entry) pairs, three or more gates that decided nothing for the same
    reason on one line ('OTHER MACHINE throughput x12: stored figures of another machine: not compared:
    ngram coding c1, ...')."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for tag, entry in tagged:
        words = _kind_words(entry, 0)
        groups.setdefault((tag, str(entry.get("gate")), words) if words else (tag, "", str(id(entry))), []).append(
            entry)
    lines = []
    for (tag, gate, words), entries in groups.items():
        if not gate or len(entries) < 3:
            lines += [terminal_line(e, prefix=f"{tag} ") for e in entries]
        else:
            lines.append(clip(f"{tag} {gate} x{len(entries)}: {words}: {', '.join(map(window_of, entries))}"))
    return lines


def pytest_text(entry: Mapping[str, Any], outcome: Outcome, policy: Mapping[str, Policy] | None = None, *,
                declared: bool = False, gating: str | None = None, where: str = "") -> str:
    """What pytest says of a gate's test: its terminal line, and why it passes, fails or is skipped
    where the outcome alone does not say (specgate.decide.outcome.pytest_action); ``where`` it was
    decided, when not in the test ("xdist controller")."""
    if gating == "report" and not declared and outcome is not Outcome.PASS:
        note = f" [{outcome.tag}, reported only: cannot decide here]"
    elif outcome is Outcome.DECLARED_BACKFIRE or (declared and not outcome.decided):
        note = " [declared backfire: never fails the run]"
    elif outcome.decided:
        note = ""
    elif gating == "gate" and outcome is Outcome.UNDECIDED:
        note = " [undecided; gates the run: fails it]"
    elif pytest_action(outcome, policy) == "failed":
        note = f" [fails the run: {outcome.policy_key} = fail]"
    else:
        note = f" [{outcome.value}]"
    if where:
        note = f"{note[:-1]}; {where}]" if note else f" [{where}]"
    return terminal_line(entry, suffix=note)


def family_text(fam: Family) -> str:
    """The session's false-alarm bound over the gates that can fail it (specgate.decide.outcome.Family)."""
    if not fam.gating:
        return "FALSE ALARMS: no gate of this run can fail it"
    text = (f"FALSE ALARMS: {fam.gating} gate(s) can fail this run, each falsely at most {fam.per_gate * 100:.3g} % "
            f"(one-sided, confidence {fam.confidence * 100:.4g} %); in the session at most {fam.bound * 100:.3g} % "
            "(Bonferroni" + (f"; [gates] family_false_alarm = {fam.controlled:g})"
                                                     if fam.controlled is not None else ", not controlled)"))
    if fam.undecided_red:
        text += (". A gate that gates the run and stays undecided after its follow-up rounds turns it red as well, "
                 "at the rig's rate (docs/statistics.md)")
    return text


def gating_lines(report: Mapping[str, Any]) -> list[str]:
    """The summary's lines: which gates gated the run (by gate and reason), which were reported
    only, and the family's false-alarm bound."""
    entries = [*report.get("gates", []), *report.get("undecided", [])]
    counted: dict[str, Counter] = {"gate": Counter(), "report": Counter()}
    for e in entries:
        if e.get("gating") in counted:
            counted[e["gating"]][(e["gate"], e.get("gating_reason", ""))] += 1
    lines = []
    if entries and not any(counted.values()):  # no gating set: the outcome policy alone
        fails = sorted(k for k, v in (report.get("outcome_policy") or {}).items() if v == "fail")
        lines.append(f"GATED THE RUN: every failed gate ([gates] gating unset), and of the outcomes that decide "
                     f"nothing: {', '.join(fails) or 'none'} ([gates] undecided)")
    for key, head in (("gate", "GATED THE RUN"), ("report", "REPORTED ONLY (never fail the run)")):
        if counted[key]:
            lines.append(f"{head}: {sum(counted[key].values())} gate(s): "
                         + "; ".join(f"{gate} x{n} ({why})" for (gate, why), n in sorted(counted[key].items())))
    if fam := report.get("family"):
        lines.append(family_text(Family(fam["gating_decisions"], fam["confidence"], fam.get("family_false_alarm"),
                                        fam.get("undecided_red", False))))
    return lines + red_run_lines(report.get("red_runs"))  # every gate's chance of a red A/A (issue 62)


def _span(r: list[float] | tuple[float, float], digits: int) -> str:
    lo, hi = (f"{v:.{digits}f}" for v in r)
    return lo if lo == hi else f"{lo}-{hi}"


def breakeven_line(row: Mapping[str, Any]) -> str:
    """A break-even row (specgate.decide.breakeven.BreakEven.to_dict) in words: "ngram's step costs
    2.5-3.4 plain steps; it needs AL above that; it reached 1.86-2.55"."""
    return (f"{row['mode']}'s step costs {_span(row['step_cost'], 1)} plain steps; it needs AL above that; "
            f"it reached {_span(row['acceptance_length'], 2)}")
