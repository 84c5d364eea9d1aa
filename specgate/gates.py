"""The four gates, each a decision on one measurement with a one-line reason.

- throughput: decode tok/s against the stored baseline (noise-aware, see ``stats.compare_ratio``);
- acceptance: mean acceptance length, acceptance rate and per-position rates against the stored
  baseline, one-sided (only lower fails);
- backfire: a speculative mode against the no-speculation mode measured in the same session on
  the same prompts; a rig may declare a known backfire, which is then reported, not failed;
- lossless: greedy outputs of a speculative mode against the no-speculation mode.

Each check returns a :class:`GateResult`; the plugin turns a failed one into a test failure and
keeps every result for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specgate.baselines import AcceptanceEntry, BaselineEntry, Fingerprint
from specgate.config import Rig
from specgate.measure import ClassMeasurement
from specgate.stats import compare_acceptance, compare_outputs, compare_ratio, match_by_key, summarize


@dataclass
class GateResult:
    gate: str  # throughput | acceptance | backfire | lossless
    mode: str
    prompt_class: str
    concurrency: int
    passed: bool
    message: str
    declared: str | None = None  # reason of a declared (accepted) backfire
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.declared and not self.passed:
            return "declared backfire"
        return "pass" if self.passed else "FAIL"

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "mode": self.mode, "prompt_class": self.prompt_class,
                "concurrency": self.concurrency, "passed": self.passed, "verdict": self.verdict,
                "message": self.message, "declared": self.declared, "details": self.details}


@dataclass
class Samples:
    """The two samples a throughput or backfire comparison decides on, and how they were matched."""
    measured: list[float]
    reference: list[float]
    paired: bool
    note: str = ""  # requests left out, said in the gate's message ("" when none)


def match_samples(m: ClassMeasurement, ref_keys: list[str] | None, ref_values: list[float],
                  ref_untimed: dict[str, str] | None = None, ref_label: str = "baseline") -> Samples:
    """Measured and reference decode rates, paired request by request where the keys allow
    (``stats.match_by_key``). A request without a decode rate (one token, or every token in
    one chunk) drops out of its side; ``note`` names every request left out and why."""
    if ref_keys is not None and len(ref_keys) == len(ref_values):
        reference = dict(zip(ref_keys, ref_values))
    else:  # no keys stored: keep every sample, unpaired
        reference = {f"#{i}": v for i, v in enumerate(ref_values)}
    matched = match_by_key(m.timed_samples, reference)
    untimed = {**{f"{k} ({ref_label})": why for k, why in (ref_untimed or {}).items()}, **m.untimed}
    parts = [f"without a decode rate: {', '.join(f'{k} ({why})' for k, why in untimed.items())}"] if untimed else []
    if matched.one_sided:
        parts.append(f"paired on {len(matched.measured)} requests, left out (timed on one side only): "
                     f"{', '.join(matched.one_sided)}")
    return Samples(matched.measured, matched.reference, matched.paired, "; ".join(parts))


def _with_note(message: str, note: str) -> str:
    return f"{message} [{note}]" if note else message


def check_throughput(rig: Rig, m: ClassMeasurement, baseline: BaselineEntry) -> GateResult:
    gates = rig.gates.for_class(m.prompt_class)
    samples = match_samples(m, baseline.sample_keys, baseline.decode_tokens_per_s)
    comparison = compare_ratio(
        samples.measured, samples.reference, threshold=1 - gates.throughput_tolerance, gate="throughput",
        subject=f"{m.mode} on {m.prompt_class} (concurrency {m.concurrency})", reference_label="baseline",
        paired=samples.paired, confidence=gates.confidence, start_noise=gates.start_noise)
    return GateResult("throughput", m.mode, m.prompt_class, m.concurrency, comparison.passed,
                      _with_note(comparison.message, samples.note), details=comparison.to_dict())


def check_acceptance(rig: Rig, m: ClassMeasurement, baseline: BaselineEntry) -> GateResult:
    gates = rig.gates.for_class(m.prompt_class)
    subject = f"{m.mode} on {m.prompt_class}"
    if m.acceptance is None:
        return GateResult("acceptance", m.mode, m.prompt_class, m.concurrency, False,
                          f"{subject}: the server exported no spec-decode counters; is speculation on?")
    if baseline.acceptance is None:
        return GateResult("acceptance", m.mode, m.prompt_class, m.concurrency, False,
                          f"{subject}: the stored baseline has no acceptance figures; update it")
    stored = baseline.acceptance
    checks = [
        compare_acceptance(m.acceptance.mean_acceptance_length, stored.mean_acceptance_length,
                           tolerance=gates.acceptance_tolerance, subject=subject, metric="mean acceptance length"),
        compare_acceptance(m.acceptance.acceptance_rate, stored.acceptance_rate,
                           tolerance=gates.acceptance_tolerance, subject=subject, metric="acceptance rate"),
    ]
    for pos, (now, then) in enumerate(zip(m.acceptance.per_position_rates, stored.per_position_rates)):
        if then > 0:
            checks.append(compare_acceptance(now, then, tolerance=gates.acceptance_tolerance,
                                             subject=subject, metric=f"position {pos + 1} rate"))
    failed = [c for c in checks if not c.passed]
    message = "; ".join(c.message for c in failed) if failed else checks[0].message
    return GateResult("acceptance", m.mode, m.prompt_class, m.concurrency, not failed, message,
                      details={"checks": [c.to_dict() for c in checks]})


def check_backfire(rig: Rig, m: ClassMeasurement, reference: ClassMeasurement) -> GateResult:
    ref = reference.timed_samples
    samples = match_samples(m, list(ref), list(ref.values()), reference.untimed, ref_label="no speculation")
    return backfire_decision(rig, m.mode, m.prompt_class, m.concurrency, samples.measured, samples.reference,
                             paired=samples.paired, note=samples.note)


def backfire_decision(rig: Rig, mode: str, prompt_class: str, concurrency: int, measured: list[float],
                      reference: list[float], *, paired: bool = False, note: str = "") -> GateResult:
    """The backfire gate on bare samples (also used to replay stored figures, like the seed case)."""
    gates = rig.gates.for_class(prompt_class)
    comparison = compare_ratio(
        measured, reference, threshold=gates.min_speedup, gate="backfire",
        subject=f"{mode} on {prompt_class}", reference_label="no speculation",
        fail_phrase=f"{mode} is {{change}} than no speculation on {prompt_class}",
        paired=paired, confidence=gates.confidence, start_noise=gates.start_noise)
    declared = rig.declared_backfire_for(mode, prompt_class)
    message = _with_note(comparison.message, note)
    if declared is not None and not comparison.passed:
        message = f"{message} [declared backfire: {declared.reason}]"
    return GateResult("backfire", mode, prompt_class, concurrency, comparison.passed, message,
                      declared=declared.reason if declared else None, details=comparison.to_dict())


def check_lossless(rig: Rig, m: ClassMeasurement, reference: ClassMeasurement) -> GateResult:
    gates = rig.gates.for_class(m.prompt_class)
    ref_outputs = reference.outputs
    pairs = [(key, text, ref_outputs[key]) for key, text in m.outputs.items() if key in ref_outputs]
    result = compare_outputs(pairs, min_identical_share=gates.min_identical_share,
                             subject=f"{m.mode} on {m.prompt_class}")
    return GateResult("lossless", m.mode, m.prompt_class, m.concurrency, result.passed, result.message,
                      details={"identical_share": result.identical_share,
                               "first_divergence": result.first_divergence})


def baseline_entry(m: ClassMeasurement, fingerprint: Fingerprint) -> BaselineEntry:
    summary = summarize(m.decode_tokens_per_s)
    acceptance = None
    if m.acceptance is not None:
        acceptance = AcceptanceEntry(
            mean_acceptance_length=m.acceptance.mean_acceptance_length,
            acceptance_rate=m.acceptance.acceptance_rate,
            per_position_rates=list(m.acceptance.per_position_rates))
    keys = [k for k, r in zip(m.sample_keys, m.records) if r.decode_tokens_per_s is not None]
    return BaselineEntry(decode_tokens_per_s=list(summary.samples), sample_keys=keys, median=summary.median,
                         mad=summary.mad, n=summary.n, acceptance=acceptance, fingerprint=fingerprint)


def entries_from_report(report: dict[str, Any], *, modes: list[str] | None = None
                        ) -> dict[tuple[str, str, str, int], BaselineEntry]:
    """Baseline entries from a saved ``report.json``: every measured window (of ``modes``, if
    given), with the fingerprint its server had. Lets an interrupted ``--update-baselines`` run
    keep the windows that finished, or promote a chosen run's figures to baselines."""
    entries = {}
    fingerprints = report.get("fingerprints", {})
    for data in report.get("measurements", []):
        if modes and data["mode"] not in modes:
            continue
        m = ClassMeasurement.from_dict(data)
        if not m.decode_tokens_per_s:
            continue  # no request produced a decode rate: nothing to store
        fingerprint = Fingerprint.model_validate(fingerprints.get(m.mode) or {})
        entries[(m.rig, m.mode, m.prompt_class, m.concurrency)] = baseline_entry(m, fingerprint)
    return entries
