"""What each gate of a run compared, for the verdict table, the forest plot and report.html: one
:class:`GateComparison` per gate entry, from its ``details`` and the report's windows. An older
entry without ``details`` is read from its message ("0.972x the reference side (...; 95.8 % CI
0.932-1.006; threshold 0.97; 12 pairs; ...)"); what neither holds stays "-".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from specgate.decide.outcome import NOT_STORED, STORING, Outcome, outcome_of_kind
from specgate.store.figures import ab_side, median_rate

GATE_ORDER = ("throughput", "backfire", "acceptance", "ttft", "lossless")
# report.json files written before these names (issue 16) render with them (--specgate-report-only)
OLD_KINDS = {"no baseline": NOT_STORED, "baseline update": STORING, "inconclusive": "undecided"}
_KIND_TAGS = {NOT_STORED: "NOT STORED", STORING: "STORING",
              "fingerprint": "UNDECIDED (other protocol)", "too few drafts": "UNDECIDED",
              "other host pace": "OTHER MACHINE (host pace)"}

# the paired gates' messages; TTFT's says "fails above 1.10", the first ones' "(ratio 0.971, ...)"
_RATIO_X = re.compile(r"(\d+(?:\.\d+)?)x (the reference side|no speculation|stored level|"
                      r"its stored ratio to \S+ \(\d+(?:\.\d+)?\)|stored|[a-z][\w ]*?) \(")
_RATIO_WORD = re.compile(r"\bratio (\d+(?:\.\d+)?)")
_CI = re.compile(r"CI (\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)")
_THRESHOLD = re.compile(r"threshold (\d+(?:\.\d+)?)")
_FAILS_ABOVE = re.compile(r"fails above (\d+(?:\.\d+)?)")
_PAIRS = re.compile(r"(\d+) pairs")
_N_SLASH = re.compile(r"n=(\d+)/\d+")
_STORED_RATIO = re.compile(r"stored ratio to (\S+) \((\d+(?:\.\d+)?)\)")
_STORED_RATIOS = re.compile(r"the stored ratios' mean to (\S+)")
_STORED_LEVEL = re.compile(r"\((\d+(?:\.\d+)?) tok/s\)")
_STARTS = re.compile(r"(\d+) stored (starts|ratios|sessions)")
_MEDIAN_TOKS = re.compile(r"median (\d+(?:\.\d+)?) tok/s")
_ACCEPTANCE_METRIC = re.compile(
    r"^\S+ on \S+: (acceptance rate|position (\d+) rate|accepted tokens per step)")


def _acceptance_metric(figures: dict[str, Any], message: str) -> str:
    if "metric" in figures:
        return {"rate": "rate", "tokens per step": "tok/step"}.get(
            figures["metric"], figures["metric"].replace("pos", "pos. "))
    m = _ACCEPTANCE_METRIC.search(str(figures.get("message") or message))
    if m is None:
        return ""
    if m.group(2):
        return f"pos. {m.group(2)}"
    return {"acceptance rate": "rate"}.get(m.group(1), "tok/step")


@dataclass(frozen=True)
class GateComparison:
    """One gate on one window: what it compared against, both sides' figures (text with its unit,
    "-" where the report does not hold it), the ratio this run / reference with its interval, the
    line it fails past, what the ratio rests on, and the outcome."""

    mode: str
    prompt_class: str
    concurrency: int
    gate: str
    against: str
    reference: str
    measured: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    threshold: float | None
    fails_above: bool  # TTFT: higher is worse, the gate fails above its line
    n: str
    outcome: Outcome
    tag: str  # how the summary names the outcome: PASS, FAIL, DECLARED, UNDECIDED, NOT STORED, ...
    verdict: str  # the gate's own word where it has one: "not slower", "equal within 2 %", "slower"
    gating: str | None
    # an acceptance gate's figure: "rate", "pos. 2" (a position's rate), "tok/step"
    metric: str = ""

    @property
    def gate_text(self) -> str:
        return f"{self.gate} ({self.metric})" if self.metric else self.gate

    @property
    def where(self) -> str:
        return f"{self.mode}-{self.prompt_class}-c{self.concurrency}"

    @property
    def label(self) -> str:
        return (f"{self.mode} / {self.prompt_class} / c{self.concurrency} / {self.gate_text} "
                f"vs {self.against}")

    @property
    def ratio_text(self) -> str:
        if self.ratio is None:
            return "-"
        if self.ci_low is None or self.ci_high is None:
            return f"{self.ratio:.3f}"
        return f"{self.ratio:.3f} ({self.ci_low:.3f}-{self.ci_high:.3f})"

    @property
    def threshold_text(self) -> str:
        if self.threshold is None:
            return "-"
        value = (f"{self.threshold:.2f}" if round(self.threshold, 2) == round(self.threshold, 6)
                 else f"{self.threshold:.3f}")
        return ("> " if self.fails_above else "< ") + value

    @property
    def outcome_text(self) -> str:
        text = self.tag
        if self.verdict and self.verdict.upper() != self.tag and (
                self.verdict.lower() not in ("pass", "fail")):
            text += f" ({self.verdict})"
        if self.gating == "report":
            text += " [reported only]"
        return text


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def undecided_kind(entry: dict[str, Any]) -> str:
    """An undecided entry's kind, an old report.json's name mapped to today's."""
    return OLD_KINDS.get(entry["kind"], entry["kind"])


def outcome_of(entry: dict[str, Any]) -> Outcome:
    """The entry's outcome: its own where the report names it, else from its kind (an undecided
    entry) or its passed/declared fields (a decided one, before outcomes were written)."""
    if entry.get("outcome"):
        try:
            return Outcome(entry["outcome"])
        except ValueError:
            pass
    if "kind" in entry:
        return outcome_of_kind(undecided_kind(entry))
    if entry.get("passed"):
        return Outcome.PASS
    return Outcome.DECLARED_BACKFIRE if entry.get("declared") else Outcome.FAIL


def _tag(entry: dict[str, Any], outcome: Outcome) -> str:
    if "kind" in entry and undecided_kind(entry) in _KIND_TAGS:
        return _KIND_TAGS[undecided_kind(entry)]
    return "DECLARED" if outcome is Outcome.DECLARED_BACKFIRE else outcome.value.upper()


def ab_reference(window: dict[str, Any] | None) -> dict[str, Any] | None:
    """An A/B window's reference side (its partner), or None outside an A/B."""
    partner = (window or {}).get("partner")
    return partner if ab_side(partner) == "reference" else None


class _Windows:
    """The report's windows by (mode, class, concurrency), a duet's partner included."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.reference_mode = (report.get("rig") or {}).get("reference_mode")
        self.by_key: dict[tuple[str, str, int], dict[str, Any]] = {}
        for m in report.get("measurements", []):
            self.by_key.setdefault((m.get("mode"), m.get("prompt_class"), m.get("concurrency")), m)
        for m in report.get("measurements", []):
            partner = m.get("partner")
            if isinstance(partner, dict) and ab_side(partner) != "reference":
                self.by_key.setdefault((partner.get("mode"), partner.get("prompt_class"),
                                        partner.get("concurrency")), partner)

    def window(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        return self.by_key.get((entry["mode"], entry["prompt_class"], entry["concurrency"]))


def _against(label: str | None, entry: dict[str, Any], details: dict[str, Any],
             windows: _Windows) -> str:
    if not label:
        gate = entry.get("gate", "?")
        if ab_reference(windows.window(entry)) is not None or (
                gate == "acceptance" and "reference side" in (entry.get("message") or "")):
            return "reference side"
        return "no speculation" if gate in ("backfire", "ttft", "lossless") else "stored figures"
    label = label.strip()
    if label in ("the reference side", "reference side"):
        return "reference side"
    if label in ("stored", "baseline"):
        return "stored figures"
    if label in ("stored ratio", "stored ratios") and details.get("reference_mode"):
        return f"{label} to {details['reference_mode']}"
    if (m := _STORED_RATIO.search(label)) is not None:
        return f"stored ratio to {m.group(1)}"
    if label.startswith("the stored starts' mean"):
        return "stored starts"
    if (m := _STORED_RATIOS.match(label)) is not None:
        return f"stored ratios to {m.group(1)}"
    return label


def _tok_s(m: dict[str, Any] | None) -> str:
    rate = median_rate(m) if m else None
    return f"{rate:.1f} tok/s" if rate else "-"


def _from_message(message: str) -> dict[str, Any]:
    """What an entry without details said in its message (see the module's docstring)."""
    found: dict[str, Any] = {}
    if (m := _RATIO_X.search(message)) is not None:
        found["ratio"], found["reference_label"] = float(m.group(1)), m.group(2)
    elif (m := _RATIO_WORD.search(message)) is not None:
        found["ratio"] = float(m.group(1))
    if (m := _CI.search(message)) is not None:
        found["ci_low"], found["ci_high"] = float(m.group(1)), float(m.group(2))
    if (m := _FAILS_ABOVE.search(message)) is not None:
        found["limit"] = float(m.group(1))
    elif (m := _THRESHOLD.search(message)) is not None:
        found["threshold"] = float(m.group(1))
    if (m := _PAIRS.search(message)) is not None or (m := _N_SLASH.search(message)) is not None:
        found["n"] = int(m.group(1))
    return found


def _acceptance_check(details: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The acceptance figures the row shows: the gate's own when it made one decision, else (one
    check per rate) the check that failed it, else one left undecided, else the first."""
    checks = [c for c in details.get("checks") or [] if isinstance(c, dict)]
    if details.get("ratio") is not None or not checks:
        return details
    if outcome in (Outcome.FAIL, Outcome.DECLARED_BACKFIRE):
        failed = [c for c in checks if not c.get("passed") and c.get("decided", True)]
        if failed:
            return failed[0]
    undecided = [c for c in checks if c.get("decided") is False]
    return undecided[0] if outcome is Outcome.UNDECIDED and undecided else checks[0]


def _ratio_scale(figures: dict[str, Any]) -> tuple[float | None, float | None]:
    """The interval on the ratio's scale: an acceptance check of before issue 36 gave the interval
    of the measured rate (0.567-0.649 around 0.608 vs 0.667 stored), not of the ratio."""
    lo, hi = _num(figures.get("ci_low")), _num(figures.get("ci_high"))
    ratio, measured = _num(figures.get("ratio")), _num(figures.get("measured"))
    reference = _num(figures.get("reference"))
    if lo is None or hi is None or ratio is None:
        return lo, hi
    if not lo <= ratio <= hi and measured is not None and reference and lo <= measured <= hi:
        return lo / reference, hi / reference
    return lo, hi


def _n_text(entry: dict[str, Any], figures: dict[str, Any], details: dict[str, Any]) -> str:
    """The count the ratio rests on, with the stored history's starts or ratios and its sittings."""
    n = figures.get("n") if figures.get("n") is not None else figures.get("n_measured")
    unit = "prompts" if figures.get("per_request") else "drafts"
    if entry.get("gate") != "acceptance":
        unit = details.get("unit")
        unit = unit if unit in ("start pairs", "stored starts") else "pairs"
    n_text = f"{int(n)} {unit}" if _num(n) is not None else "-"
    # details["compared"] (facts; "design" in older reports, words then), else the message
    compared = details.get("compared") or details.get("design") or entry.get("message") or ""
    if isinstance(compared, dict):
        stored = (compared.get("history") or {}).get("levels")
        if stored and details.get("unit") != "stored starts":
            what = "ratios" if compared["how"] == "ratio history" else "starts"
            n_text += f", {len(stored)} stored {what}"
        compared = ""
    if (starts := _STARTS.search(str(compared))) is not None:
        n_text = f"{n_text}, {starts.group(1)} stored {starts.group(2)}"
    if "history_sittings" in details:  # None: not recorded
        k = details["history_sittings"]
        n_text += (", sittings unknown" if k is None else ", one sitting" if k == 1
                   else f", {k} sittings")
    return n_text


def _sides(entry: dict[str, Any], figures: dict[str, Any], details: dict[str, Any],
           windows: _Windows, ratio: float | None) -> tuple[str, str]:
    """(reference, measured) as the table shows them, "-" where the report does not hold one; a
    throughput gate's ratio to the mode "against" names: x1.234."""
    gate, m = entry.get("gate", "?"), windows.window(entry)
    if gate == "backfire":
        no_speculation = (windows.reference_mode, entry["prompt_class"], entry["concurrency"])
        return _tok_s(windows.by_key.get(no_speculation)), _tok_s(m)
    reference, measured = "-", "-"
    if gate == "throughput":
        measured, message = _tok_s(m), entry.get("message") or ""
        compared = details.get("compared") or details.get("design") or message
        if (ab := ab_reference(m)) is not None:
            reference = _tok_s(ab)
        elif (shift := _num(details.get("shift"))) is not None or (
                stored := _STORED_RATIO.search(str(figures.get("reference_label") or message))):
            shift = details["shift"] if shift is not None else float(stored.group(2))
            reference = f"x{shift:.3f}"
            if ratio is not None:
                measured = f"x{ratio * shift:.3f}"
        elif details.get("reference_label") == "stored starts" and (
                _num(details.get("center")) is not None):
            reference = f"{details['center']:.1f} tok/s"
        elif _num(figures.get("reference")) is not None:  # the first paired gates: stored median
            reference = f"{float(figures['reference']):.1f} tok/s"
        elif isinstance(compared, str) and (level := _STORED_LEVEL.search(compared)):
            reference = f"{float(level.group(1)):.1f} tok/s"
        elif (median := _MEDIAN_TOKS.search(message)) and measured == "-":
            measured = f"{float(median.group(1)):.1f} tok/s"
    elif gate == "ttft":
        if _num(figures.get("median_ttft_ms")) is not None:
            measured = f"{figures['median_ttft_ms']:.0f} ms"
        if _num(figures.get("reference_median_ttft_ms")) is not None:
            reference = f"{figures['reference_median_ttft_ms']:.0f} ms"
    elif gate == "acceptance":
        if _num(figures.get("measured")) is not None:
            measured = f"{figures['measured']:.3f}"
        elif m and (m.get("acceptance") or {}).get("acceptance_rate") is not None:
            measured = f"{m['acceptance']['acceptance_rate']:.3f}"
        if _num(figures.get("reference")) is not None:
            reference = f"{figures['reference']:.3f}"
    elif gate == "lossless" and _num(details.get("identical_share")) is not None:
        measured = f"{details['identical_share'] * 100:.0f} % identical"
    return reference, measured


def comparison(entry: dict[str, Any], windows: _Windows | None = None) -> GateComparison:
    """One gate entry's comparison; without ``windows``, from the entry's figures alone."""
    windows = _Windows({}) if windows is None else windows
    gate = entry.get("gate", "?")
    details = entry.get("details") or {}
    outcome = outcome_of(entry)
    message = entry.get("message") or ""
    parsed = _from_message(message) if details.get("ratio") is None else {}
    figures = {**parsed, **details} if gate != "acceptance" else _acceptance_check(details, outcome)
    if gate == "acceptance" and figures.get("ratio") is None:
        figures = {**_from_message(message), **figures}
    ratio = _num(figures.get("ratio"))
    ci_low, ci_high = _ratio_scale(figures)
    fails_above = gate == "ttft"
    reference, measured = _sides(entry, figures, details, windows, ratio)
    metric = _acceptance_metric(figures, message) if gate == "acceptance" else ""
    against = _against(figures.get("reference_label") or parsed.get("reference_label"), entry,
                       details, windows)
    verdict = str(figures.get("verdict") or details.get("verdict") or "")
    return GateComparison(
        mode=entry["mode"], prompt_class=entry["prompt_class"], concurrency=entry["concurrency"],
        gate=gate, against=against, reference=reference, measured=measured, ratio=ratio,
        ci_low=ci_low, ci_high=ci_high, fails_above=fails_above,
        threshold=_num(figures.get("limit") if fails_above else figures.get("threshold")),
        n=_n_text(entry, figures, details), outcome=outcome, tag=_tag(entry, outcome),
        verdict=verdict, gating=entry.get("gating"), metric=metric)


def gate_comparisons(report: dict[str, Any]) -> list[GateComparison]:
    """Every gate entry of the report (decided and undecided), ordered by concurrency, mode (the
    no-speculation mode first, then the rig's order), prompt class (as measured) and gate."""
    windows = _Windows(report)
    rig = report.get("rig") or {}
    modes = [rig.get("reference_mode"), *(rig.get("modes") or {})]
    classes = list(dict.fromkeys(m.get("prompt_class") for m in report.get("measurements", [])))
    entries = [e for e in [*report.get("gates", []), *report.get("undecided", [])]
               if all(k in e for k in ("mode", "prompt_class", "concurrency"))]

    def order(e: dict[str, Any]) -> tuple:
        return (e["concurrency"], modes.index(e["mode"]) if e["mode"] in modes
                else len(modes), e["mode"],
                classes.index(e["prompt_class"]) if e["prompt_class"] in classes else len(classes),
                e["prompt_class"],
                GATE_ORDER.index(e.get("gate")) if e.get("gate") in GATE_ORDER else len(GATE_ORDER),
                e.get("gate", ""))

    return [comparison(e, windows) for e in sorted(entries, key=order)]
