"""The two samples a speed comparison decides on: a window's decode rates matched request by request
with a reference's (stored figures, a duet partner, the no-speculation window)."""

from __future__ import annotations

from dataclasses import dataclass

from specgate.decide.stats import match_by_key
from specgate.measure.protocol import ClassMeasurement


@dataclass
class Samples:
    """The two samples a throughput or backfire comparison decides on, and how they were matched."""
    measured: list[float]
    reference: list[float]
    paired: bool
    note: str = ""  # requests left out, said in the gate's message ("" when none)
    keys: list[str] | None = None  # each pair's request key ("prompt-id#repeat"), None when unpaired

    @property
    def prompts(self) -> list[str] | None:
        """Each pair's prompt (its key without the repeat): the strata of a comparison of two modes."""
        return [key.rsplit("#", 1)[0] for key in self.keys] if self.keys is not None else None


def match_samples(m: ClassMeasurement, ref_keys: list[str] | None, ref_values: list[float],
                  ref_untimed: dict[str, str] | None = None, ref_label: str = "stored") -> Samples:
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
    return Samples(matched.measured, matched.reference, matched.paired, "; ".join(parts), matched.keys)
