"""The break-even diagnosis: why a speculative mode is faster or slower, from a run's decode tok/s
(the mode's and no speculation's) and the mode's mean acceptance length AL.

The step-cost ratio c = AL x (no-spec tok/s) / (spec tok/s) is one speculative step (draft + verify)
in plain decode steps: speculation pays iff AL > c, and at the same k a mode reaching AL' would run
at AL' / c times no speculation. Inputs may be ranges (lo, hi); outputs are then ranges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgate.store.figures import gate_ratio, median_rate

Range = tuple[float, float]


def _range(value: float | Range) -> Range:
    lo, hi = (value, value) if isinstance(value, (int, float)) else value
    if not 0 < lo <= hi:
        raise ValueError(f"break-even inputs must be positive ranges (lo <= hi), got {value!r}")
    return float(lo), float(hi)


@dataclass(frozen=True)
class BreakEven:
    mode: str
    acceptance_length: Range  # AL reached
    spec_tokens_per_s: Range
    plain_tokens_per_s: Range
    num_speculative_tokens: int | None = None  # k, when known: AL can be at most k + 1

    @property
    def spec_steps_per_s(self) -> Range:
        """Decode steps per second of the speculative mode: tok/s / AL."""
        return (self.spec_tokens_per_s[0] / self.acceptance_length[1],
                self.spec_tokens_per_s[1] / self.acceptance_length[0])

    @property
    def step_cost(self) -> Range:
        """c: one speculative step in plain decode steps, AL x plain tok/s / spec tok/s."""
        al, plain, spec = self.acceptance_length, self.plain_tokens_per_s, self.spec_tokens_per_s
        return al[0] * plain[0] / spec[1], al[1] * plain[1] / spec[0]

    @property
    def verdict(self) -> str:
        """"pays" (AL > c throughout), "backfires" (AL < c throughout) or "break-even"."""
        ratio = (self.spec_tokens_per_s[0] / self.plain_tokens_per_s[1],
                 self.spec_tokens_per_s[1] / self.plain_tokens_per_s[0])  # AL / c = spec / plain
        return "pays" if ratio[0] > 1 else "backfires" if ratio[1] < 1 else "break-even"

    def predicted_speedup(self, acceptance_length: float | Range) -> Range:
        """At the same k (same step cost): AL' / c, as a range."""
        al = _range(acceptance_length)
        cost = self.step_cost
        return al[0] / cost[1], al[1] / cost[0]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode, "acceptance_length": list(self.acceptance_length),
            "spec_tokens_per_s": list(self.spec_tokens_per_s),
            "plain_tokens_per_s": list(self.plain_tokens_per_s),
            "spec_steps_per_s": list(self.spec_steps_per_s), "step_cost": list(self.step_cost),
            "verdict": self.verdict}
        if self.num_speculative_tokens:
            out["num_speculative_tokens"] = self.num_speculative_tokens
            full = self.num_speculative_tokens + 1
            out["speedup_at_full_acceptance"] = list(self.predicted_speedup(full))
        return out


def break_even(mode: str, *, acceptance_length: float | Range, spec_tokens_per_s: float | Range,
               plain_tokens_per_s: float | Range,
               num_speculative_tokens: int | None = None) -> BreakEven:
    return BreakEven(mode, _range(acceptance_length), _range(spec_tokens_per_s),
                     _range(plain_tokens_per_s), num_speculative_tokens)


def from_report(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per speculative window of a report with acceptance figures and a no-speculation
    window of its class: the key plus :meth:`BreakEven.to_dict`. The speculative level is the
    no-speculation median times the backfire gate's paired ratio (the one number shown), else its
    own median."""
    reference = report["rig"]["reference_mode"]
    windows = {(m["mode"], m["prompt_class"], m["concurrency"]): m for m in report["measurements"]}
    rows = []
    for (mode, prompt_class, concurrency), m in windows.items():
        acceptance = m.get("acceptance")
        ref = m.get("partner") or windows.get((reference, prompt_class, concurrency))
        if mode == reference or not acceptance or ref is None or ref.get("mode") != reference:
            continue
        plain = median_rate(ref)
        ratio = gate_ratio(report, mode, prompt_class, concurrency)
        spec = plain * ratio if (plain and ratio) else median_rate(m)
        if not spec or not plain:
            continue
        result = break_even(mode, acceptance_length=acceptance["mean_acceptance_length"],
                            spec_tokens_per_s=spec, plain_tokens_per_s=plain,
                            num_speculative_tokens=len(acceptance.get("accepted_per_position")
                                                       or []) or None)
        rows.append({"prompt_class": prompt_class, "concurrency": concurrency, **result.to_dict()})
    return rows
