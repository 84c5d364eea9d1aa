"""A window's decode rates matched request by request with a reference's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgate.decide.stats import match_by_key
from specgate.measure.protocol import ClassMeasurement


@dataclass
class Samples:
    """The two samples a throughput or backfire comparison decides on, and how they were matched."""
    measured: list[float]
    reference: list[float]
    paired: bool
    keys: list[str] | None = None  # each pair's request key, None when unpaired
    left_out: dict[str, Any] | None = None  # the requests left out, {key: why} (None when none)

    @property
    def prompts(self) -> list[str] | None:
        """Each pair's prompt (its key without the repeat): the strata of two modes."""
        return [key.rsplit("#", 1)[0] for key in self.keys] if self.keys is not None else None


def match_samples(m: ClassMeasurement, ref_keys: list[str] | None, ref_values: list[float],
                  ref_untimed: dict[str, str] | None = None, ref_label: str = "stored") -> Samples:
    """Measured and reference decode rates, paired by key where the keys allow; a request without a
    decode rate drops out, named in ``left_out``."""
    if ref_keys is not None and len(ref_keys) == len(ref_values):
        reference = dict(zip(ref_keys, ref_values))
    else:  # no keys stored: keep every sample, unpaired
        reference = {f"#{i}": v for i, v in enumerate(ref_values)}
    matched = match_by_key(m.timed_samples, reference)
    left_out = {"untimed": m.untimed, "reference_untimed": ref_untimed or {},
                "reference_label": ref_label,
                "one_sided": matched.one_sided, "paired": len(matched.measured)}
    return Samples(matched.measured, matched.reference, matched.paired, matched.keys,
                   left_out if m.untimed or ref_untimed or matched.one_sided else None)
