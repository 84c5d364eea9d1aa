"""A gate's words: its terminal line (at most :data:`LINE_WIDTH` characters), what pytest says of
its test, and its full statement (the entry's ``message``: summary.md, report.html). Input is a
gate entry of any report version; its figures come from :func:`comparisons.comparison`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from specgate.config.defaults import MIN_PAIRS
from specgate.decide.follow_up import FollowUp, follow_up_reason
from specgate.decide.history import StartHistory
from specgate.decide.host_pace import HOST_PACE
from specgate.decide.outcome import NOT_STORED, STORING, Family, Outcome, Policy, pytest_action
from specgate.decide.paired import spread_quantile
from specgate.decide.settings import WindowSettings
from specgate.decide.stats import trials_to_resolve
from specgate.decide.verdict import GateResult
from specgate.measure.per_request import Agreement
from specgate.measure.protocol import ClassMeasurement
from specgate.plan.histories import sittings_words, steps_words
from specgate.report.comparisons import comparison, undecided_kind
from specgate.report.red_runs import how_text, red_run_lines

LINE_WIDTH = 160

# What a gate that had nothing to compare with says in the terminal, by its undecided kind.
KIND_WORDS = {NOT_STORED: "nothing stored", STORING: "measured to store its figures",
              "fingerprint": "stored figures of other prompts or another protocol: not compared",
              "other machine": "stored figures of another machine: not compared",
              HOST_PACE: "host at another pace than the stored figures': not compared",
              "not run": "not run: the session's time budget ran out"}


def clip(text: str, width: int = LINE_WIDTH) -> str:
    """``text`` in ``width`` characters: cut at the last "; " or ", " past half, "…" marks it."""
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
    c = comparison(dict(entry))
    if c.ratio is None:
        return None
    interval = c.ci_low is not None and c.ci_high is not None
    text = f"{c.ratio:.3f}x of {c.against}" + (f" ({c.ci_low:.3f}-{c.ci_high:.3f})" if interval
                                                else " (no interval)")
    if c.threshold is not None:
        inside = interval and c.ci_low <= c.threshold <= c.ci_high
        failed = c.outcome in (Outcome.FAIL, Outcome.DECLARED_BACKFIRE)
        side = "spans" if inside or c.outcome is Outcome.UNDECIDED else (
            ">" if c.fails_above else "<") if failed else ("<=" if c.fails_above else ">=")
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
    """Why a gate with nothing to compare decided nothing: its message, or where that is longer
    than ``room`` the words of its kind (and the command that fixes it); None for others."""
    details = entry.get("details") or {}
    kind = undecided_kind(entry) if "kind" in entry else details.get("undecided_kind")
    message = " ".join(str(entry.get("message") or "").split())
    if kind == HOST_PACE and (pace := details.get("host_pace")):
        return (f"host at {pace['factor']:.2f}x the stored figures' CPU canary time "
                f"({pace['canary_us']:.1f} vs {pace['stored_canary_us']:.1f} us): not compared")
    if (rule := details.get("rule")) in ("unpaired", "ttft unpaired"):
        return ("too few request keys on both sides to pair "
                f"({details['n_measured']} vs {details['n_reference']})")
    if rule == "untimed":
        t = details["timings"][0]
        return (f"client timed {_side(t['mode'], t['side'])} at {t['client']:.1f} tok/s, vLLM "
                f"{t['server']:.1f}: not measurements (±{t['tolerance'] * 100:g} % allowed)")
    if kind not in KIND_WORDS:
        return None
    if len(message) <= room:
        return message
    return KIND_WORDS[kind] + (f"; {command}" if (command := details.get("command")) else "")


def terminal_line(entry: Mapping[str, Any], *, prefix: str = "", suffix: str = "") -> str:
    """The gate's terminal line (and pytest's message), at most LINE_WIDTH characters with
    ``prefix`` and ``suffix``; a gate with nothing to compare says why."""
    head = f"{prefix}{window_of(entry)} {entry.get('gate')}"
    body = _kind_words(entry, LINE_WIDTH - len(suffix) - len(head) - 2)
    if body is None:
        body = (_lossless(entry) if entry.get("gate") == "lossless"
                else _figures(entry)) or str(entry.get("message"))
    return clip(f"{head}: {body}", LINE_WIDTH - len(suffix)) + suffix


def grouped_lines(tagged: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The terminal lines of (tag, entry) pairs, three or more gates that decided nothing for one
    reason on one line ('OTHER MACHINE throughput x12: ...: ngram coding c1, ...')."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for tag, entry in tagged:
        words = _kind_words(entry, 0)
        key = (tag, str(entry.get("gate")), words) if words else (tag, "", str(id(entry)))
        groups.setdefault(key, []).append(entry)
    lines = []
    for (tag, gate, words), entries in groups.items():
        if not gate or len(entries) < 3:
            lines += [terminal_line(e, prefix=f"{tag} ") for e in entries]
        else:
            lines.append(clip(f"{tag} {gate} x{len(entries)}: {words}: "
                              f"{', '.join(map(window_of, entries))}"))
    return lines


def pytest_text(entry: Mapping[str, Any], outcome: Outcome,
                policy: Mapping[str, Policy] | None = None, *, declared: bool = False,
                gating: str | None = None, where: str = "") -> str:
    """What pytest says of a gate's test: its terminal line, and why it passes, fails or is skipped
    where the outcome alone does not say; ``where`` it was decided, when not in the test."""
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
    """The session's false-alarm bound over the gates that can fail it (decide.outcome.Family)."""
    if not fam.gating:
        return "FALSE ALARMS: no gate of this run can fail it"
    controlled = (f"; [gates] family_false_alarm = {fam.controlled:g})"
                  if fam.controlled is not None else ", not controlled)")
    text = (f"FALSE ALARMS: {fam.gating} gate(s) can fail this run, each falsely at most "
            f"{fam.per_gate * 100:.3g} % (one-sided, confidence {fam.confidence * 100:.4g} %); in "
            f"the session at most {fam.bound * 100:.3g} % (Bonferroni" + controlled)
    if fam.undecided_red:
        text += (". A gate that gates the run and stays undecided after its follow-up rounds "
                 "turns it red as well, at the rig's rate (docs/statistics.md)")
    return text


def gating_lines(report: Mapping[str, Any]) -> list[str]:
    """The summary's lines: which gates gated the run, which were reported only, the bound."""
    entries = [*report.get("gates", []), *report.get("undecided", [])]
    counted: dict[str, Counter] = {"gate": Counter(), "report": Counter()}
    for e in entries:
        if e.get("gating") in counted:
            counted[e["gating"]][(e["gate"], e.get("gating_reason", ""))] += 1
    lines = []
    if entries and not any(counted.values()):  # no gating set: the outcome policy alone
        fails = sorted(k for k, v in (report.get("outcome_policy") or {}).items() if v == "fail")
        lines.append("GATED THE RUN: every failed gate ([gates] gating unset), and of the "
                     f"outcomes that decide nothing: {', '.join(fails) or 'none'} ([gates] "
                     "undecided)")
    for key, head in (("gate", "GATED THE RUN"), ("report", "REPORTED ONLY (never fail the run)")):
        if counted[key]:
            lines.append(f"{head}: {sum(counted[key].values())} gate(s): "
                         + "; ".join(f"{gate} x{n} ({why})" for (gate, why),
                                     n in sorted(counted[key].items())))
    if fam := report.get("family"):
        lines.append(family_text(Family(fam["gating_decisions"], fam["confidence"],
                                        fam.get("family_false_alarm"),
                                        fam.get("undecided_red", False))))
    return lines + red_run_lines(report.get("red_runs"))


def _span(r: list[float] | tuple[float, float], digits: int) -> str:
    lo, hi = (f"{v:.{digits}f}" for v in r)
    return lo if lo == hi else f"{lo}-{hi}"


def breakeven_line(row: Mapping[str, Any]) -> str:
    """A break-even row (specgate.decide.breakeven.BreakEven.to_dict) in words: "ngram's step costs
    2.5-3.4 plain steps; it needs AL above that; it reached 1.86-2.55"."""
    return (f"{row['mode']}'s step costs {_span(row['step_cost'], 1)} plain steps; it needs AL "
            f"above that; it reached {_span(row['acceptance_length'], 2)}")


# -- the full statement: a gate's facts (its details, specgate.decide) in words ----------------
def change_text(ratio: float, *, up: str = "faster", down: str = "slower") -> str:
    """'26 % slower' / '4.2 % faster': whole percent once the change is large."""
    pct = (ratio - 1.0) * 100.0
    if round(abs(pct), 1) == 0:
        return "no change"
    return f"{abs(pct):.{0 if abs(pct) >= 10 else 1}f} % {down if pct < 0 else up}"


def _count(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"


def _metric(c: Mapping[str, Any], lengths: list[float] | None) -> str:
    metric = c.get("metric", "rate")
    if metric == "tokens per step":
        return "accepted tokens per step"
    if metric.startswith("pos") and metric[3:].isdigit():
        return f"position {metric[3:]} rate"
    if metric != "rate":
        return metric
    return "acceptance rate" + (f" (mean acceptance length {lengths[0]:.2f} vs "
                                f"{lengths[1]:.2f})" if lengths else "")


def check_text(subject: str, c: Mapping[str, Any], lengths: list[float] | None = None) -> str:
    """One acceptance check (specgate.decide.stats.Comparison) in words."""
    label, tol = c.get("reference_label", "stored"), c.get("tolerance", 0.0)
    cov = c.get("confidence") or 0.95
    value, ref, ratio, threshold = c["measured"], c["reference"], c["ratio"], c["threshold"]
    head = f"{subject}: {_metric(c, lengths)} {value:.3g}"
    line = f"{ref * threshold:.3g} = {label} - {tol * 100:g} %"
    lo, hi, counts = c.get("ci_low"), c.get("ci_high"), c.get("counts")
    trials = c.get("trials", "drafts")
    below, undecided = c.get("decided", True) and not c["passed"], not c.get("decided", True)
    if c.get("why"):  # per request, nothing to compare
        why = {"pairs": f"{c['n_measured']} paired {trials}",
               "no steps": "no decode steps on one side"}.get(
            c["why"], f"the {label} accepted no draft token")
        return f"{subject}: accepted tokens per step cannot be compared: {why}; {c['method']}"
    chg = change_text(ratio, up="higher", down="lower") if ratio is not None else "?"
    if counts is None or lo is None:
        return (f"{head} vs {ref:.3g} {label} (ratio {ratio:.3f}, {chg}; fails below {line}; "
                f"{c['method']})")
    refs = c.get("reference_counts")
    if c.get("metric") == "tokens per step":
        head = (f"{subject}: accepted tokens per step {value:.3f} ({counts[0]:.0f} over "
                f"{counts[1]:.0f} steps) vs {ref:.3f} {label} ({refs[0]:.0f} over {refs[1]:.0f}), "
                f"same {c['n_measured']} {trials}: ratio {ratio:.3f} ({cov * 100:.4g} % CI "
                f"{lo:.3f}-{hi:.3f}, t {c['dof']} df; {chg})")
    elif refs:
        head += (f" ({_count(counts[0])} of {counts[1]:.0f} {trials}) vs {ref:.3g} {label} "
                 f"({_count(refs[0])} of {refs[1]:.0f}): ratio {ratio:.3f} ({cov * 100:.4g} % CI "
                 f"{lo:.3f}-{hi:.3f}, {chg})")
    else:  # one sample against an exact figure: the Wilson interval of the rate itself
        needed = trials_to_resolve(ref, tol, cov)
        head += (f" ({_count(counts[0])} of {counts[1]:.0f} {trials}, {cov * 100:g} % interval "
                 f"{lo:.3g}-{hi:.3g}) vs {ref:.3g} {label} (ratio {ratio:.3f}, {chg})")
        rule = f"fails when the interval lies below {line}; {c['method']}"
        if undecided:
            return (f"{head}: too few {trials} to gate, the interval spans the fail line {line}; "
                    f"about {float(f'{needed:.2g}'):.0f} {trials} would resolve a {tol * 100:g} % "
                    f"drop; {c['method']}")
        return f"{head}{': the whole interval is below the fail line' if below else ''}; {rule}"
    rule = (f"fails when the interval lies below {threshold:.3g} ({tol * 100:g} % lower); "
            f"{c['method']}")
    if undecided and c.get("metric") == "tokens per step":
        return f"{head}: undecided, the interval holds {threshold:.3g}; {rule}"
    if undecided:
        return f"{head}: too few {trials} to gate, the interval spans {threshold:.3g}; {rule}"
    return f"{head}{f': the whole interval is below {threshold:.3g}' if below else ''}; {rule}"


def _subject(entry: Mapping[str, Any], *, concurrency: bool = True) -> str:
    return (f"{entry['mode']} on {entry['prompt_class']}"
            + (f" (concurrency {entry['concurrency']})" if concurrency else ""))


def _side(mode: str, side: str | None) -> str:
    return f"{mode} ({side} side)" if side else mode


def _looks_text(looks: Mapping[str, Any] | None) -> str:
    if not looks:
        return ""
    if looks.get("second"):
        return "; second look, after follow-up rounds (repeated intervals over two looks)"
    skipped = looks.get("skipped")
    return "; first look of two (repeated intervals)" + (f"; its follow-up was skipped: {skipped}"
                                                         if skipped else "")


def _history_text(h: Mapping[str, Any], *, sessions: bool = False) -> str:
    """The stored history's spread and sittings (its starts and catch are the ratio's clause)."""
    history = StartHistory(tuple(h["levels"]), tuple(h["sittings"]) if h.get("sittings") else None)
    return (f"{'session' if sessions else 'start'}-to-{'session' if sessions else 'start'} spread "
            f"{history.log_sd * 100:.2f} % ({sittings_words(history)}; t, {history.dof} df = "
            f"{spread_quantile(h['confidence'], history.dof):.2f})")


def _stored_text(c: Mapping[str, Any]) -> str:
    """How a window was held against stored figures (decide.gates.check_throughput's compared)."""
    steps = c.get("steps")
    steps = f"; {steps_words(steps['levels'], steps['sittings'])}" if steps else ""
    how, stored, noise = c["how"], f"; {c.get('baseline')}{steps}", c.get("start_noise")
    if how == "sequential":
        if "histories" in c:
            (a, sa), (b, sb) = c["histories"]
            added = math.expm1(c['added']) * 100
            return ("windows one after the other; the two starts' offsets from this machine's "
                    f"stored histories ({a} and {b} starts, spread {sa * 100:.2f} % and "
                    f"{sb * 100:.2f} %, t({c['dof']})) added: ±{added:.2f} %")
        return "windows one after the other" + (
            f"; start noise {noise * 100:g} % added" if noise else "; start noise not known")
    if how == "stored samples":
        return (f"level vs stored samples ({c['starts']} stored start(s); a history is used from "
                f"{c['min_starts']} on, `python -m specgate build-history`); start noise " + (
                    f"{noise * 100:g} % from the rig" if noise else
                    "unknown (no start_noise): the interval holds this run's noise only") + steps)
    if how == "level history":
        return (f"level vs the mean of the stored starts; {_history_text(c['history'])}; this mode "
                f"and class only (not pooled){stored}")
    head = f"{c['arrangement']} ratio to {c['partner']} vs the stored ratio"
    if how == "ratio history":
        return (f"{head}; this window's ratio ({c['now']:.3f}x) against the mean of the stored "
                f"ratios; {_history_text(c['history'], sessions=True)}; this mode and class only "
                f"(not pooled){stored}")
    basis = {"unknown": "its interval added; session-to-session spread unknown (fewer than 3 "
                        "stored ratios, no start_noise): the interval holds the two windows' "
                        "noise only",
             "own": "its interval added (wider than the rig's start noise for four starts)"}.get(
        c["spread_basis"], "session-to-session spread from the rig's start noise "
                           f"({c.get('start_noise', 0) * 100:g} % per start, four starts, z = "
                           f"{c.get('quantile', 0):.2f}) until 3 ratios are stored")
    return f"{head}; {basis}{stored}"


def compared_text(d: Mapping[str, Any]) -> str:
    """How a gate's window was taken and held against what (compared, start_pair, looks)."""
    compared = d.get("compared") or ""
    text = _stored_text(compared) if isinstance(compared, Mapping) else str(compared)
    if (start := d.get("start_pair")) and "quantile" in start:
        first = (f"the {start['first']} side started first (seed "
                 f"{start['seed']})" if start.get("first")
                 else "start order not recorded")
        if not start["spread"]:
            text += (f"; {first}; start-pair offset not folded in (start_pair_spread = 0; two "
                     "fresh servers of one build have read 1 % apart by start order)")
        else:
            name = "z" if start.get("dof") is None else f"t, {start['dof']} df"
            widened = math.expm1(start['widened_log']) * 100
            text += (f"; {first}; start-pair spread {start['spread'] * 100:g} % folded in ({name} "
                     f"= {start['quantile']:.2f}: ±{widened:.1f} %)")
    return text + _looks_text(d.get("looks"))


def reference_text(d: Mapping[str, Any]) -> str:
    """What a ratio was taken against, with the stored figure: 'its stored ratio to x (1.114)'."""
    label = d.get("reference_label", "")
    if label == "stored ratio":
        return f"its stored ratio to {d['reference_mode']} ({d['shift']:.3f})"
    if label == "stored ratios":
        return f"the stored ratios' mean to {d['reference_mode']} ({d['center']:.3f})"
    if label == "stored starts":
        return (f"the stored starts' mean level ({d['center']:.1f} tok/s; "
                f"this start {d['level']:.1f})")
    return str(label)


def left_out_text(left: Mapping[str, Any] | None) -> str:
    """The requests a comparison left out (decide.matching.Samples.left_out) and why; "" if none."""
    if not left:
        return ""
    parts = []
    untimed = {**{f"{k} ({left['reference_label']})": why
                  for k, why in left["reference_untimed"].items()}, **left["untimed"]}
    if untimed:
        parts.append("without a decode rate: "
                     + ", ".join(f"{k} ({why})" for k, why in untimed.items()))
    if left.get("one_sided"):
        parts.append(f"paired on {left['paired']} requests, left out (timed on one side only): "
                     + ", ".join(left["one_sided"]))
    return "; ".join(parts)


def strongest_pair_text(p: Mapping[str, Any]) -> str:
    """A pair that stands out of a window's ratio (decide.paired.strongest_pair) in words."""
    if p.get("text"):  # a report written before the words left the deciding layer
        return str(p["text"])
    factor = p["outlier_factor"]
    apart = (f"{factor:.0f}x the window's median residual" if math.isfinite(factor)
             else "the window's other residuals are 0")
    return (f"one pair stands out ({apart}) and {'lowers' if p['shift_pct'] < 0 else 'raises'} the "
            f"ratio {abs(p['shift_pct']):.1f} %: {p['key']} at {p['measured']:.1f} vs "
            f"{p['reference']:.1f} tok/s (its prompt's other pairs: "
            f"{p['prompt_others_measured']:.1f} vs {p['prompt_others_reference']:.1f}); "
            f"{p['ratio_without']:.3f}x without it")


def _notes(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    """What a statement adds in brackets: left-out requests, a standout pair, a weak comparison."""
    notes = [text for text in (left_out_text(d.get("left_out")),
                               strongest_pair_text(d["strongest_pair"]) if d.get("strongest_pair")
                               else "") if text]
    text = f" [{'; '.join(notes)}]" if notes else ""
    if d.get("catches_nothing_useful"):
        text += (" [this stored-figure comparison catches only a true ratio <= "
                 f"{d['detectable']:.3f} (95 % of the time), not a slowdown of twice its "
                 f"{d['tolerance'] * 100:g} % tolerance: no speed gate on its own; gate speed on a "
                 "live comparison (A/B, or the backfire duet)]")
    if entry.get("declared") and entry.get("outcome") == Outcome.DECLARED_BACKFIRE.value:
        text += f" [declared backfire: {entry['declared']}]"
    return text


def verdict_text(d: Mapping[str, Any]) -> str:
    """The verdict in words: 'slower', 'faster', 'equal within ±2.1 %', 'undecided'..."""
    if d.get("verdict") == "equal" and d.get("equal_within") is not None:
        return f"equal within ±{d['equal_within'] * 100:.1f} %"
    return str(d.get("verdict"))


def method_text(d: Mapping[str, Any]) -> str:
    """The statistic a ratio was decided by, with prompts and degrees of freedom if they count."""
    method = str(d.get("method", ""))
    return f"{method} ({d['prompts']} prompts, {d['dof']} df)" if d.get("prompts") else method


def ratio_text(d: Mapping[str, Any], label: str) -> str:
    """A decided ratio in one clause: '0.740x no speculation (26 % slower; 96.9 % CI 0.70-0.78;
    threshold 1.00; 12 pairs; Hodges-Lehmann ...; catches a true ratio <= 0.93 ...)'."""
    head = f"{d['ratio']:.3f}x {label} ({change_text(d['ratio'])}"
    if d.get("ci_low") is None or d.get("ci_high") is None:
        return (f"{head}; threshold {d['threshold']:.2f}; {d['n']} pair(s), too few for an "
                f"interval (at least {MIN_PAIRS}): undecided, a point ratio decides nothing)")
    resolution = "resolution unknown"
    if d.get("detectable") is not None:
        dof = d.get("quantile_dof")
        quantile = d.get("quantile_name") or ("z" if dof is None else f"t, {dof} df")
        resolution = (f"catches a true ratio <= {d['detectable']:.3f} 95 % of the time at this "
                      f"spread, one-sided at {(1.0 - d['confidence']) / 2 * 100:.2g} % ({quantile} "
                      f"= {d['quantile']:.2f})")
    interval = "prediction interval" if d.get("unit") == "stored starts" else "CI"
    return (f"{head}; {d['confidence'] * 100:.1f} % {interval} "
            f"{d['ci_low']:.3f}-{d['ci_high']:.3f}; threshold {d['threshold']:.2f}; {d['n']} "
            f"{d.get('unit', 'pairs')}; {method_text(d)}; {resolution})")


def _paired(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    failed = not d.get("passed", True)
    mode, cls = entry["mode"], entry["prompt_class"]
    than = {"backfire": "no speculation", "history": "its history"}.get(d.get("head"))
    if failed and than:
        head = f"{mode} is {change_text(d['ratio'])} than {than} on {cls}"
    else:
        head = _subject(entry, concurrency=entry["gate"] != "backfire")
    return f"{head}: {verdict_text(d)}: {ratio_text(d, reference_text(d))} [{compared_text(d)}]"


def _ttft(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    label, limit = d["reference_label"], d["limit"]
    interval = (f"{d['confidence'] * 100:.1f} % CI "
                f"{d['ci_low']:.3f}-{d['ci_high']:.3f}" if d.get("ci_low") is not None
                else f"no interval under {d['n']} pairs")
    pct = (d["ratio"] - 1) * 100
    longer = "longer" if pct > 0 else "shorter"
    change = "no change" if round(pct, 1) == 0 else f"{abs(pct):.1f} % {longer}"
    if d.get("withheld"):
        return (f"{_subject(entry)}: TTFT undecided: it would pass, but a pass needs "
                f"{d['withheld']} pairs and this window has {d['n']} ({d['ratio']:.3f}x {label}; "
                f"{interval}; fails above {limit:.2f}) [{compared_text(d)}]")
    return (f"{_subject(entry)}: TTFT {d['verdict']}: {d['ratio']:.3f}x {label} ({change}; "
            f"{interval}; fails above {limit:.2f}; {d['n']} pairs; median "
            f"{d['median_ttft_ms']:.0f} vs {d['reference_median_ttft_ms']:.0f} ms; "
            f"{method_text(d)}) [{compared_text(d)}]")


def mismatch_text(f: Mapping[str, Any]) -> str:
    """How a window's streams' counts differ from vLLM's (decide.gates.stream_count_mismatch)."""
    if "merged" in f:
        return (f"{_side(f['mode'], f['side'])}: its streams show {f['seen']} decode steps where "
                f"vLLM took {f['vllm_steps']:.0f}: {f['merged']} step(s) merged into other chunks "
                f"(allowed: {f['allowed']}; the client read late)")
    counted = (f"{_side(f['mode'], f['side'])}: its streams show {f['counted']} accepted draft "
               f"tokens over {f['steps']} decode steps where vLLM counted {f['server']:.0f} over "
               f"{f['drafts']:.0f} drafts")
    if f["more"]:
        return (f"{counted} (allowed: at most {f['allowed']:.0f} more): the client read steps "
                "merged into one chunk")
    return (f"{counted} (allowed: at most {f['allowed']:.0f} fewer, one draft's "
            f"{f['per_draft']:.3g} tokens per request cut at max_tokens)")


def _acceptance(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    subject, checks = _subject(entry, concurrency=False), d["checks"]
    shown = ([c for c in checks if c.get("decided", True) and not c["passed"]]
             or [c for c in checks if not c.get("decided", True)] or checks[:1])
    family = d["family_confidence"]
    exact = ("" if d.get("stored_counts", True)
             else f"; the {d['reference_label']} figures have no counts, taken as exact")
    text = ("; ".join(check_text(subject, c, d.get("lengths")) for c in shown)
            + f" [one decision over {len(checks)} checks (overall and per position), each at "
            f"{d['check_confidence'] * 100:.4g} % (Bonferroni): a false FAIL at most "
            f"{(1 - family) / 2 * 100:.3g} % of the time" + exact + "]")
    unused = d.get("per_request_unused")
    if unused:
        why = ("; ".join(map(mismatch_text, unused["mismatch"])) if unused["mismatch"] else
               f"only {unused['prompts']} prompt(s) with decode steps on both sides")
        text += f" [per-request counts not used: {why}]"
    return text


def _acceptance_per_request(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    counters = d.get("counters")
    said = ("the reference side exported no spec-decode counters" if not counters else
            f"vLLM's counters: acceptance rate {counters[0]:.3f} vs {counters[1]:.3f}, mean "
            f"acceptance length {counters[2]:.2f} vs {counters[3]:.2f}")
    if d.get("per_request_source") == "vllm":
        said += "; per request: vLLM's own counts (draft steps); " + "; ".join(
            Agreement(tuple(map(tuple, rows))).text() for rows in d.get("agreement") or [])
    return f"{check_text(_subject(entry, concurrency=False), d)} [{said}; {compared_text(d)}]"


def _outputs(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    firsts = d["first_divergence"]
    diverged = [f"{pid} at char {at}" for pid, at in firsts.items() if at is not None]
    shown = ", ".join(diverged[:5]) + (f" and {len(diverged) - 5} more"
                                       if len(diverged) > 5 else "")
    return (f"{_subject(entry, concurrency=False)}: {len(firsts) - len(diverged)}/{len(firsts)} "
            f"outputs identical to reference ({d['identical_share'] * 100:.0f} %, minimum "
            f"{d['min_identical_share'] * 100:g} %)"
            + (f"; first divergence: {shown}" if diverged else ""))


def _untimed(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    return f"{_subject(entry)}: undecided: " + "; ".join(
        f"the client timed {_side(t['mode'], t['side'])} at {t['client']:.1f} tok/s where vLLM's "
        f"own time per output token gives {t['server']:.1f} ({t['client'] / t['server']:,.2f}x it; "
        f"the rig allows ±{t['tolerance'] * 100:g} %, client_server_tolerance): the client read "
        "the streams late (starved of CPU?), so this window's rates are not "
        "measurements" for t in d["timings"]) + (
        " [client timings checked against the server's]")


def _start_pairs(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    if d["basis"] == "own":
        spread = f"their own spread ({d['own_spread'] * 100:.2f} %)"
    elif d["basis"] == "rig":
        spread = f"the rig's start-pair spread {d['rig_spread'] * 100:g} %" + (
            f" over {d['spread_pairs']} start pairs" if d.get("spread_pairs") else "")
    else:
        spread = ("start-pair spread unknown (start_pair_spread = 0): the interval holds the "
                  "windows' noise only")
    each = "; ".join(f"{p['first']} first: {p['ratio']:.3f}x" + (
        f" ({p['ci_low']:.3f}-{p['ci_high']:.3f}, {p['n']} pairs)" if p.get("ci_low")
        and p.get("ci_high") else "")
        for p in d["per_pair"])
    return (f"{_subject(entry)}: {verdict_text(d)}: {ratio_text(d, d['reference_label'])} "
            f"[{d['start_pairs']} start pairs, the first side alternating; {spread}; each: {each}]")


RULES = {
    "paired": _paired, "ttft": _ttft, "acceptance": _acceptance,
    "acceptance per request": _acceptance_per_request,
    "outputs": _outputs, "untimed": _untimed, "start pairs": _start_pairs,
    "unpaired": lambda e, d: (f"{_subject(e)}: undecided: the two sides share too few request keys "
                              f"to pair ({d['n_measured']} vs {d['n_reference']} timed requests; "
                              f"other prompts or repeats?) [{compared_text(d)}]"),
    "ttft unpaired": lambda e, d: (f"{_subject(e)}: TTFT undecided: {d['shared']} request(s) with "
                                   f"a first token on both sides share a key ({d['n_measured']} vs "
                                   f"{d['n_reference']} with one) [{compared_text(d)}]"),
    "no counters": lambda e, d: (f"{_subject(e, concurrency=False)}: the server exported no "
                                 "spec-decode counters; is speculation on?"),
    "nothing to compare": lambda e, d: (
        f"{_subject(e, concurrency=False)}: the {d['reference_label']} figures have no acceptance; "
        + ("update them" if d["reference_label"] == "stored" else "is speculation on there?")),
}


def statement(entry: Mapping[str, Any]) -> str:
    """A gate's full statement: its rule's words for its facts, or an older report's message."""
    d = entry.get("details") or {}
    words = RULES.get(d.get("rule"))
    if words is None:
        return str(entry.get("message") or "")
    pace = d.get("host_pace") if d.get("undecided_kind") == HOST_PACE else None
    text = words(entry, {**d, "verdict": d.get("decided_as", d.get("verdict"))} if pace
                 else d) + _notes(entry, d)
    if pace:
        factor = pace["factor"]
        how = (f"{factor:.2f}x as long: a slower host" if factor > 1
               else f"{1 / factor:.2f}x as fast: a faster host")
        text = (f"{_subject(entry)}: undecided: this window's host took {pace['canary_us']:.1f} us "
                f"for specgate's CPU canary against {pace['stored_canary_us']:.1f} us behind the "
                f"stored figures ({how}; the rig allows ±{pace['tolerance'] * 100:g} %, "
                "host_pace_tolerance), so the comparison would measure the hosts as well as the "
                f"build. It gave: {text}")
    return text


def worded(result: GateResult) -> GateResult:
    """``result`` with its full statement as its message (the deciding layer leaves it empty)."""
    if not result.message:
        result.message = statement(result.to_dict())
    return result


def follow_up_text(found: FollowUp | None) -> str | None:
    """Why a window got its follow-up rounds (decide.follow_up), in words; None for None."""
    if found is None:
        return None
    gate, d = found.result.gate, found.result.details
    if found.why == "first look":
        return (f"the {gate} gate is undecided after the first look: "
                f"{statement(found.result.to_dict())}")
    interval = (f"{d['ratio']:.3f}x ({d['confidence'] * 100:.1f} % CI "
                f"{d['ci_low']:.3f}-{d['ci_high']:.3f}, threshold {d['threshold']:.2f})")
    if found.why == "margin":
        return (f"the {gate} gate's '{d['verdict']}' after {d['n']} pairs reaches into the "
                f"equivalence margin (±{found.margin * 100:g} %): {interval}")
    if found.why == "strongest pair":
        return f"{interval} after {d['n']} pairs: {strongest_pair_text(d['strongest_pair'])}"
    return f"the {gate} gate is {d['verdict']} after {d['n']} pairs: {interval}"


def follow_up_said(settings: WindowSettings, m: ClassMeasurement,
                   selected: Collection[str] | None = None) -> str | None:
    """Why window ``m``'s first look gets follow-up rounds (decide.follow_up); None if none."""
    return follow_up_text(follow_up_reason(settings, m, selected))


def reason_text(reason: str | Mapping[str, Any] | None) -> str:
    """Why a gate gates the run or is reported only (specgate.decide.settings.Reason), in words."""
    if not isinstance(reason, Mapping):
        return str(reason or "")
    why = reason["why"]
    if why == "set":
        return f"gating = {reason['value']!r} for {reason['gate']}"
    if why == "red run":
        head = (f"a red A/A {reason['chance'] * 100:.2g} % of the time at "
                f"{reason['confidence'] * 100:.4g} %")
        reported = "reported only: " if reason["reported"] else ""
        return f"{reported}{head} ({how_text(reason['how'])})"
    what = "stored ratios" if reason["what"] == "ratios" else "stored starts (levels)"
    if why == "too few stored":
        return f"{reason['starts']} of the {reason['needed']} {what} a prediction interval needs"
    narrower = "narrower" if reason["half"] < reason["tolerance"] else "not narrower"
    return (f"{reason['starts']} {what}: their prediction interval "
            f"(±{reason['half'] * 100:.2f} %) is {narrower} than the "
            f"{reason['tolerance'] * 100:g} % tolerance")
